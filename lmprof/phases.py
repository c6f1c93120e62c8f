"""The range names lmprof emits, shared by the annotation layer and the analysis.

Imports nothing: the analysis reads these names without importing ``lmprof.annotate``, whose
``nvtx`` package imports numpy (``analyze`` starts loading an export before numpy and pandas are
in; see ``lmprof.analyze.kernels_cli``).
"""

# Phase names the runner emits; the analysis recognises these (optionally with a ``_N`` suffix).
STEP = "step"
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
INFERENCE = "inference"
WARMUP = "warmup"
PHASES = (FORWARD, BACKWARD, OPTIMIZER, INFERENCE)

# Sub-ranges of the naive attention, named as in the CS336 assignment.
ATTENTION = "scaled dot product attention"
ATTN_SCORES = "computing attention scores"
ATTN_SOFTMAX = "computing softmax"
ATTN_FINAL = "final matmul"
