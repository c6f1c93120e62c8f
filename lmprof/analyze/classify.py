# TEMPORARY local stub (not committed): replaced by the classify branch.
KERNEL_CLASSES = ("gemm", "attention", "softmax", "norm", "elementwise", "reduction", "optimizer",
                  "memory", "communication", "triton", "other")
def classify(name: str) -> str:
    n = name.lower()
    if "gemm" in n or "cutlass" in n or "xmma" in n: return "gemm"
    if "softmax" in n: return "softmax"
    if "reduce" in n: return "reduction"
    if "elementwise" in n: return "elementwise"
    return "other"
