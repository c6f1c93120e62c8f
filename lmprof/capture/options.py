"""The options of ``capture run``, defined once.

``capture run`` takes each as a single value; ``capture sweep`` takes lists of the same options
(``GRID_FIELDS``) and launches each cell with :func:`spec_to_argv`.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import click

from lmprof.capture.devices import DEVICES, DTYPES
from lmprof.capture.runner import MODES, RunSpec
from lmprof.model.config import ATTENTION_IMPLS, SIZES

# (RunSpec field, flag, click kwargs). Order is the order of --help.
RUN_OPTIONS: list[tuple[str, str, dict[str, Any]]] = [
    ("size", "--model", dict(type=str, default=None,
        help=f"Model size: {', '.join(SIZES)}. Default: small on CUDA, tiny on CPU/MPS.")),
    ("d_model", "--d-model", dict(type=int, default=None, help="Override d_model.")),
    ("d_ff", "--d-ff", dict(type=int, default=None, help="Override the SwiGLU hidden size.")),
    ("num_layers", "--num-layers", dict(type=int, default=None, help="Override the layer count.")),
    ("num_heads", "--num-heads", dict(type=int, default=None, help="Override the head count.")),
    ("vocab_size", "--vocab-size", dict(type=int, default=10_000, show_default=True,
        help="Vocabulary size.")),
    ("batch_size", "--batch-size", dict(type=int, default=4, show_default=True,
        help="Sequences per batch.")),
    ("context_length", "--context-length", dict(type=int, default=256, show_default=True,
        help="Tokens per sequence.")),
    ("warmup", "--warmup", dict(type=int, default=5, show_default=True,
        help="Warm-up steps (timed separately, never profiled).")),
    ("steps", "--steps", dict(type=int, default=10, show_default=True,
        help="Measured steps.")),
    ("mode", "--mode", dict(type=str, default="train", show_default=True,
        help=f"What a step does: {' | '.join(MODES)} (train adds the AdamW step; forward runs "
             "under torch.inference_mode).")),
    ("dtype", "--dtype", dict(type=str, default="fp32", show_default=True,
        help=f"{' | '.join(DTYPES)}; bf16/fp16 run under torch.autocast, fp32 without it "
             "(fp16 training scales its loss with torch.amp.GradScaler).")),
    ("compile", "--compile/--no-compile", dict(default=False, show_default=True,
        help="Wrap the model in torch.compile.")),
    ("attention", "--attention", dict(type=str, default="naive", show_default=True,
        help=f"Attention implementation: {' | '.join(ATTENTION_IMPLS)}.")),
    ("device", "--device", dict(type=str, default="auto", show_default=True,
        help=f"{' | '.join(DEVICES)}; auto picks CUDA, then MPS, then CPU.")),
    ("seed", "--seed", dict(type=int, default=0, show_default=True,
        help="Seed for weights and the random token batch.")),
    ("lr", "--lr", dict(type=float, default=1e-4, show_default=True, help="AdamW learning rate.")),
    ("nsys", "--nsys/--no-nsys", dict(default=False, show_default=True,
        help="Run the measured steps under Nsight Systems and export report.sqlite.")),
    ("memory", "--memory/--no-memory", dict(default=False, show_default=True,
        help="Record CUDA memory history during measured steps (memory.pickle).")),
    ("memory_max_entries", "--memory-max-entries", dict(type=int, default=1_000_000,
        show_default=True, help="Ring-buffer size of the memory history (trace entries kept).")),
    ("memory_stacks", "--memory-stacks", dict(type=str, default="python", show_default=True,
        help="Stacks recorded per allocation: python (fast) or all (adds C++ frames, slow).")),
    ("memory_steps", "--memory-steps", dict(type=int, default=None,
        help="Record memory for only the first N measured steps (default: all).")),
    ("label", "--label", dict(type=str, default=None,
        help="Label used in the run id (default: size-ctxN-mode-dtype[-compiled][-sdpa|-flash]).")),
]

# Options a sweep may vary (lists); the rest of RUN_OPTIONS is fixed per sweep.
GRID_FIELDS = ("size", "context_length", "batch_size", "warmup", "mode", "dtype", "compile",
               "attention", "nsys", "memory")


def add_run_options(fn):
    for name, flag, kwargs in reversed(RUN_OPTIONS):
        fn = click.option(flag, name, **kwargs)(fn)
    return fn


def given_once(ctx: click.Context, param: click.Parameter, value: tuple) -> Any:
    """Callback of a sweep option declared ``multiple=True`` so that a repeat is seen: its one
    value (None where not given), or a usage error for two that differ. Taken last-wins, a
    repeated ``--context-length 16 --context-length 32`` planned 32 alone without a word (as
    a grid file's key written twice did), where capture attention's repeatable ``--seq`` adds
    each."""
    if len(set(value)) > 1:
        flag, metavar = param.opts[0], param.metavar or ""
        lists = f" (a list is one comma-separated value: {flag} {metavar})" if "," in metavar \
            else ""
        other = next(v for v in value if v != value[0])  # (16, 32, 16: not "16 and 16")
        raise click.UsageError(f"{flag} is given twice, as {value[0]!r} and {other!r}: "
                               f"give it once{lists}", ctx)
    return value[-1] if value else None


def add_sweep_options(fn):
    """``capture run``'s options for ``capture sweep``: comma-separated lists for GRID_FIELDS."""
    for name, flag, kwargs in reversed(RUN_OPTIONS):
        if name == "label":  # a sweep names its cells itself
            continue
        on = flag.split("/")[0]
        default = kwargs.get("default")
        if isinstance(default, bool):
            default = "yes" if default else "no"
        if name in GRID_FIELDS:
            text, metavar = f"{kwargs['help']} A comma-separated list varies it.", "A,B,..."
            if "/" in flag:
                text, metavar = f"{kwargs['help']} yes, no, or yes,no to vary it.", "yes,no"
        else:
            text, metavar = f"{kwargs['help']} One value for every cell.", "VALUE"
        if default is not None:
            text += f"  [default: {default}]"
        extra = {}
        if "/" in flag:  # given bare, as for capture run (`--nsys --memory`), it means yes
            extra = dict(is_flag=False, flag_value="yes")
            text = text.replace(" yes, no, or yes,no", " yes (also given alone), no, or yes,no")
        fn = click.option(on, name, type=str, multiple=True, callback=given_once,
                          metavar=metavar, help=text, **extra)(fn)
    return fn


def spec_from_kwargs(kwargs: dict[str, Any]) -> RunSpec:
    names = {f.name for f in fields(RunSpec)}
    return RunSpec(**{k: v for k, v in kwargs.items() if k in names})


def spec_to_argv(spec: RunSpec) -> list[str]:
    """The ``capture run`` arguments that rebuild ``spec`` (defaults omitted)."""
    default = RunSpec()
    argv: list[str] = []
    for name, flag, _ in RUN_OPTIONS:
        value = getattr(spec, name)
        if value == getattr(default, name):
            continue
        if "/" in flag:
            on, off = flag.split("/")
            argv.append(on if value else off)
        else:
            argv += [flag, str(value)]
    return argv
