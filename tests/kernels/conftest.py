"""Kernel tests run the Triton kernels through the interpreter when there is no GPU.

TRITON_INTERPRET must be set before triton is first imported, so this happens at import time.
On a GPU, autotuning is off unless LMPROF_FLASH_AUTOTUNE is set (it compiles ~20 configurations
per d_head/dtype/causal); test_gpu_every_config runs each configuration once instead.
"""

import os

import torch

if torch.cuda.is_available():
    os.environ.setdefault("LMPROF_FLASH_AUTOTUNE", "0")
else:
    os.environ.setdefault("TRITON_INTERPRET", "1")
