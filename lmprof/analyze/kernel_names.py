"""Kernel names for people: the demangled C++ name without what every kernel of its family
repeats (torch-free; display only: csv and json keep the full name).

A PyTorch elementwise kernel's demangled name is 150–400 characters, and what tells two of them
apart — the functor (``MulFunctor``, ``direct_copy_kernel_cuda``) and its dtype — sits in the
middle, so cutting the name at a width leaves several rows reading ``void
at::native::elementwise_kernel<(int)128, (int)4, void …``. ``condense`` drops the parts that
carry no information in a table of kernels: the return type, namespaces, integer casts, the
kernel's own parameter list, PyTorch's TensorIterator plumbing (``gpu_kernel_impl_nocast<...>``,
``(at::TensorIteratorBase &)``, ``std::array<char *, N>``, offset calculators, load/store
policies) and lambda bookkeeping (a lambda keeps its parameter types, which name the dtype).
``display_name`` then shortens what is left from the middle, keeping both ends. Names that are
already short (``nvjet_sm90_tst_...``, Triton kernels) come back as they are.
"""

from __future__ import annotations

import re

# a lambda as the demanglers write it ("[lambda(float) (instance 1)]", "{lambda(float)#1}"),
# whose parameter types are kept: they name the dtype
_LAMBDA = re.compile(r"(?:::)?(?:\[lambda\(([^()\[\]]*)\) \(instance \d+\)\]"
                     r"|\{lambda\(([^(){}]*)\)#\d+\})")
_CALL_OPERATOR = re.compile(r"::operator ?\(\)\(\) ?const")
_INT_CAST = re.compile(r"\((?:unsigned |signed )?(?:int|long|long long|short|char|bool)\)(?=-?\d)")
_NAMESPACE = re.compile(r"(?:\b[A-Za-z_]\w*|\(anonymous namespace\)|<unnamed>)::(?!\*)")
# template arguments that only say how an elementwise kernel addresses memory
_PLUMBING = ("array", "TrivialOffsetCalculator", "OffsetCalculator", "LoadWithCast",
             "StoreWithCast", "LoadWithoutCast", "StoreWithoutCast", "TensorListMetadata",
             "TensorListScalarListMetadata", "FusedOptimizerTensorListMetadata")
_WRAPPERS = ("gpu_kernel_impl_nocast", "gpu_kernel_impl")


def _closing(text: str, i: int, open_: str, close: str) -> int:
    """Index of the bracket that closes the one at ``text[i]`` (or -1)."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j
    return -1


def _drop_parameter_lists(text: str) -> str:
    """Drop every ``(...)`` that follows a name or a ``>``: function parameter lists, the
    kernel's own (``kernel<...>(int, T2, T3)``) and those inside its template arguments
    (``bfloat16_copy_kernel_cuda(at::TensorIteratorBase &)``)."""
    i = 0
    while (i := text.find("(", i)) >= 0:
        end = _closing(text, i, "(", ")")
        if end < 0:
            break
        if i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_>"):
            text = text[:i] + text[end + 1:]
        else:
            i += 1
    return text


def _drop_template_args(text: str, names: tuple[str, ...], keep_inside: bool) -> str:
    """Remove ``name<...>`` (with a following ', ') for each name, or with ``keep_inside``
    replace it by what its brackets hold."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")<")
    pos = 0
    while (m := pattern.search(text, pos)) is not None:
        end = _closing(text, m.end() - 1, "<", ">")
        if end < 0:
            break
        inside = text[m.end():end]
        if keep_inside:
            text = text[:m.start()] + inside + text[end + 1:]
        else:
            tail = text[end + 1:]
            head = text[:m.start()]
            if tail.startswith(", "):
                tail = tail[2:]
            elif head.endswith(", "):
                head = head[:-2]
            text = head + tail
        pos = m.start()
    return text


def _lambda_types(m: re.Match) -> str:
    types = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
    return "" if types in ("", "int") else f"[{types}]"  # (int): an index lambda, no dtype


def condense(name: str) -> str:
    """The demangled kernel name without the parts every kernel of its family repeats."""
    text = " ".join(name.split())
    if "<" not in text:
        return text  # no template: a plain identifier (cuBLAS, Triton) or a memory record
    if text.startswith("void "):
        text = text[5:]
    text = _LAMBDA.sub(_lambda_types, text)
    text = _CALL_OPERATOR.sub("", text)
    text = _INT_CAST.sub("", text)
    text = _NAMESPACE.sub("", text)
    text = _drop_parameter_lists(text)
    text = _drop_template_args(text, _PLUMBING, keep_inside=False)
    text = _drop_template_args(text, _WRAPPERS, keep_inside=True)
    text = text.replace("void ", "")
    text = re.sub(r"\s+>", ">", text)
    return text.strip() or " ".join(name.split())


def display_name(name: str, width: int = 70) -> str:
    """``condense(name)``, cut in the middle to ``width`` characters where longer (the start
    names the kernel template, the end its functor and dtype)."""
    text = condense(name)
    if len(text) <= width:
        return text
    if "<" not in text:  # one identifier (cuBLAS names): its tile sizes come first, keep them
        return text[:width - 1] + "…"
    head = (width - 1) * 3 // 5
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]
