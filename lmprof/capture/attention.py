"""``capture attention``: attention implementations timed side by side, into a run directory.

Three parts (``--part``, repeatable; default all):

a. The CS336 attention benchmark: batch 8, no head dimension, d ∈ {16, 32, 64, 128} ×
   seq ∈ {256, 1024, 4096, 8192, 16384}, fp32, not causal by default. Per implementation:
   ``--iters`` forward passes and ``--iters`` backward passes after ``--warmup`` warm-up
   iterations, each timed between two synchronizations; memory allocated before the backward;
   out-of-memory is a row (status OOM), as is a backend that refuses the inputs (UNSUPPORTED:
   an SDPA backend that does not take them, a flash kernel that does not apply or whose
   indexing they exceed, ``lmprof.kernels.KernelUnavailable``).
b. The CS336 leaderboard configuration: batch 1, 16 heads, seq 16384, d_head 64, bf16, causal;
   ``o = attn(q, k, v, True); o.sum().backward()`` timed with ``triton.testing.do_bench``
   (median), forward, backward and end to end, with TFLOP/s (causal forward 2·B·H·T²·d, backward
   2.5× that) and the card's bf16 matmul rate (an 8192³ product) measured in the same run.
c. A sweep of seq 128–65536 × d_head 16–128 in bf16 and fp32 (causal by default), with
   batch·seq = 16384 tokens and heads·d_head = 2048, against each SDPA backend; the report
   compares with the fastest SDPA backend per point.

Implementations: ``naive`` (softmax(QKᵀ)V in PyTorch), ``naive-compiled`` (the same under
``torch.compile``), ``sdpa-default`` (torch's own backend choice), ``sdpa-flash``,
``sdpa-efficient``, ``sdpa-cudnn``, ``sdpa-math`` (one SDPA backend each), ``flash`` (this
project's kernels with their defaults, forward and backward "auto": the Hopper Gluon kernels
where they apply and the sequence is long enough, else the Triton ones), ``flash-split`` and
``flash-atomic`` (the Triton forward with one Triton backward each: the portable kernels), and
``flash-gluon`` (the Gluon forward and backward; an UNSUPPORTED row where they do not apply).
Each flash row names the forward and the backward that ran (``forward``, ``backward``).

Writes ``<out>/<run-id>/run.json`` (``kind: attention``) and ``attention.json`` (the rows), both
rewritten after every finished row (the run says ERROR "incomplete" until it ends, so a killed
run keeps its rows), and prints the tables. Both hold the environment, with the flash kernels'
LMPROF_FLASH_* switches where flash rows are timed (``flash_autotune``, ...: they change the
kernels' timings). Runs on CPU under ``TRITON_INTERPRET=1`` at tiny sizes for smoke tests.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable

import click
import torch
import torch.nn.functional as F

from lmprof import rundir
from lmprof.capture import devices, environment, termination
from lmprof.errors import PathParam, UserError, echo_or_drop
from lmprof.kernels import KernelUnavailable

RESULTS_FILE = "attention.json"
RESULTS_VERSION = 1

IMPLS = ("naive", "naive-compiled", "sdpa-default", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn",
         "sdpa-math", "flash", "flash-split", "flash-atomic", "flash-gluon")
_FLASH_MODES = {"flash": ("auto", "auto"), "flash-split": ("triton", "split"),
                "flash-atomic": ("triton", "atomic"), "flash-gluon": ("gluon", "gluon")}  # fwd, bwd
PART_A = dict(batch=8, d=(16, 32, 64, 128), seq=(256, 1024, 4096, 8192, 16384), dtype=("fp32",),
              causal=False,
              impls=("naive", "naive-compiled", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn",
                     "sdpa-math", "flash"))
PART_B = dict(batch=1, heads=16, seq=16384, d=64, dtype="bf16", causal=True,
              impls=("flash", "flash-split", "flash-atomic", "sdpa-default", "sdpa-cudnn",
                     "sdpa-flash", "sdpa-efficient"))
PART_C = dict(tokens=16384, width=2048, d=(16, 32, 64, 128), dtype=("bf16", "fp32"), causal=True,
              seq=tuple(2**i for i in range(7, 17)),
              impls=("flash", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn"))
LEADERBOARD_BEST_MS = 5.364  # CS336 leaderboard's published best (one H100), fwd + bwd
MATMUL_N = 8192


# ---------------------------------------------------------------------------------------------
# Implementations: (q, k, v, is_causal) -> o, for (B, T, d) or (B, h, T, d) inputs.
# ---------------------------------------------------------------------------------------------

def _naive(q, k, v, is_causal):
    from lmprof.kernels.attention_ref import attention_naive

    return attention_naive(q, k, v, is_causal)


def _sdpa(backend: str | None) -> Callable:
    def attend(q, k, v, is_causal):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        squeeze = q.dim() == 3  # flash/efficient/cuDNN backends want (B, h, T, d): add h=1
        if squeeze:
            q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
        if backend is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        else:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        return o.squeeze(1) if squeeze else o

    return attend


def _flash(forward: str, backward: str) -> Callable:
    def attend(q, k, v, is_causal):
        from lmprof.kernels.flash import flash_attention

        return flash_attention(q, k, v, is_causal=is_causal, backward=backward, forward=forward)

    return attend


def make_impl(name: str) -> Callable:
    if name == "naive":
        return _naive
    if name == "naive-compiled":
        torch._dynamo.reset()  # a fresh compile per shape, never the recompile-limit fallback
        return torch.compile(_naive, dynamic=False)
    if name.startswith("sdpa-"):
        backend = {"default": None, "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                   "cudnn": "CUDNN_ATTENTION", "math": "MATH"}[name[5:]]
        return _sdpa(backend)
    if name in _FLASH_MODES:
        return _flash(*_FLASH_MODES[name])
    raise UserError(f"unknown implementation {name!r}; choose from {', '.join(IMPLS)}")


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

def attention_flops(batch: int, heads: int, seq_q: int, seq_k: int, d: int,
                    is_causal: bool) -> dict[str, float]:
    """Matmul FLOPs: forward 4·B·H·Tq·Tk·d (QKᵀ and PV), halved when causal; backward 2.5×."""
    fwd = 4.0 * batch * heads * seq_q * seq_k * d * (0.5 if is_causal else 1.0)
    return {"fwd": fwd, "bwd": 2.5 * fwd, "e2e": 3.5 * fwd}


def bench_ms(fn: Callable[[], Any], device: torch.device, grad_to_none=None) -> float:
    """Median milliseconds of fn: ``triton.testing.do_bench`` on CUDA, elsewhere a plain loop
    timing each call between two synchronizations (MPS runs its kernels asynchronously)."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none,
                                             return_mode="median"))
    fn()
    times = []
    for _ in range(3):
        devices.synchronize(device)
        t0 = time.perf_counter()
        fn()
        devices.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def matmul_tflops(device: torch.device) -> float | None:
    """The card's bf16 dense matmul rate: an 8192³ product, do_bench median."""
    if device.type != "cuda":
        return None
    a = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=torch.bfloat16)
    b = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=torch.bfloat16)
    ms = bench_ms(lambda: a @ b, device)
    del a, b
    return 2 * MATMUL_N**3 / (ms * 1e-3) / 1e12


def _inputs(shape_q, shape_k, dtype, device):
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(shape):
        return torch.randn(shape, generator=gen).to(device=device, dtype=dtype).requires_grad_()

    return rand(shape_q), rand(shape_k), rand(shape_k)


def _kernels_of(impl: str, q: torch.Tensor, k: torch.Tensor) -> dict[str, str]:
    """{"forward": …, "backward": …}: the flash kernels these inputs get, for a flash
    implementation (raises KernelUnavailable where an explicit one cannot run), else {}."""
    if impl not in _FLASH_MODES:
        return {}
    from lmprof.kernels.flash import resolve_backward, resolve_forward

    if q.dim() == 3:
        q, k = q.unsqueeze(1), k.unsqueeze(1)
    forward, backward = _FLASH_MODES[impl]
    return {"forward": resolve_forward(forward, q, k),
            "backward": resolve_backward(backward, q, k)}


def _status(exc: BaseException) -> tuple[str, str]:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    if devices.is_oom(exc):
        return "OOM", first
    if "No available kernel" in str(exc) or "No viable backend" in str(exc):
        return "UNSUPPORTED", "this SDPA backend does not take these inputs"
    # flash-gluon off Hopper/16-bit/d 64; inputs past the flash kernels' indexing (InputsTooLarge)
    if isinstance(exc, KernelUnavailable):
        return "UNSUPPORTED", first
    return "ERROR", f"{type(exc).__name__}: {first}"


def run_cs336_cell(impl: str, batch: int, seq: int, d: int, dtype: torch.dtype, is_causal: bool,
                   warmup: int, iters: int, device: torch.device) -> dict[str, Any]:
    """Part a: mean of ``iters`` synchronized forwards and backwards; memory before backward."""
    row: dict[str, Any] = {"impl": impl, "batch": batch, "seq": seq, "d": d,
                           "dtype": str(dtype).removeprefix("torch."), "causal": is_causal,
                           "status": "OK", "error": None}
    try:
        fn = make_impl(impl)
        q, k, v = _inputs((batch, seq, d), (batch, seq, d), dtype, device)
        row.update(_kernels_of(impl, q, k))
        grad = torch.randn(batch, seq, d, device=device, dtype=dtype)
        for _ in range(warmup):
            fn(q, k, v, is_causal).backward(grad)
        fwd = []
        for _ in range(iters):
            devices.synchronize(device)
            t0 = time.perf_counter()
            fn(q, k, v, is_causal)
            devices.synchronize(device)
            fwd.append(time.perf_counter() - t0)
        bwd = []
        for i in range(iters):
            o = fn(q, k, v, is_causal)
            devices.synchronize(device)
            if i == 0 and device.type == "cuda":
                row["mem_before_backward_bytes"] = torch.cuda.memory_allocated(device)
            t0 = time.perf_counter()
            o.backward(grad)
            devices.synchronize(device)
            bwd.append(time.perf_counter() - t0)
            del o
        row.update(fwd_ms=1e3 * statistics.fmean(fwd), fwd_std_ms=1e3 * statistics.pstdev(fwd),
                   bwd_ms=1e3 * statistics.fmean(bwd), bwd_std_ms=1e3 * statistics.pstdev(bwd))
    except Exception as exc:  # noqa: BLE001 — OOM and refusals are results
        row["status"], row["error"] = _status(exc)
    finally:
        devices.release_memory(device)
    return row


def run_bench_cell(impl: str, batch: int, heads: int, seq: int, d: int, dtype: torch.dtype,
                   is_causal: bool, device: torch.device) -> dict[str, Any]:
    """Parts b and c: do_bench medians of forward, backward and ``attn(...).sum().backward()``."""
    row: dict[str, Any] = {"impl": impl, "batch": batch, "heads": heads, "seq": seq, "d": d,
                           "dtype": str(dtype).removeprefix("torch."), "causal": is_causal,
                           "status": "OK", "error": None}
    try:
        fn = make_impl(impl)
        shape = (batch, heads, seq, d)
        q, k, v = _inputs(shape, shape, dtype, device)
        row.update(_kernels_of(impl, q, k))
        grads = [q, k, v]
        fwd_ms = bench_ms(lambda: fn(q, k, v, is_causal), device)
        loss = fn(q, k, v, is_causal).sum()
        bwd_ms = bench_ms(lambda: loss.backward(retain_graph=True), device, grads)
        del loss
        e2e_ms = bench_ms(lambda: fn(q, k, v, is_causal).sum().backward(), device, grads)
        flops = attention_flops(batch, heads, seq, seq, d, is_causal)
        row.update(fwd_ms=fwd_ms, bwd_ms=bwd_ms, e2e_ms=e2e_ms,
                   fwd_tflops=flops["fwd"] / fwd_ms / 1e9, bwd_tflops=flops["bwd"] / bwd_ms / 1e9,
                   e2e_tflops=flops["e2e"] / e2e_ms / 1e9)
    except Exception as exc:  # noqa: BLE001
        row["status"], row["error"] = _status(exc)
    finally:
        devices.release_memory(device)
    return row


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------

def _environment(device: torch.device, flash: bool) -> dict[str, Any]:
    """run.json's environment (also attention.json's); ``flash``: flash rows are timed."""
    env = environment.collect(device, flash)
    env["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return env


def _check_options(impls, ds, seqs, dtypes, iters, warmup, batch, heads) -> None:
    for name, values in (("--d", ds), ("--seq", seqs)):
        if any(x <= 0 for x in values):
            raise UserError(f"{name} values must be positive")
    for name, value in (("--iters", iters), ("--batch", batch), ("--heads", heads)):
        if value is not None and value <= 0:
            raise UserError(f"{name} must be positive, got {value}")
    if warmup < 0:
        raise UserError(f"--warmup must be zero or more, got {warmup}")
    # tensor sizes and loop counts: beyond 2^31 no run ends (a size beyond 64 bits made an ERROR
    # row, and an attention.json no report reads)
    for name, values in (("--d", ds), ("--seq", seqs), ("--iters", [iters]),
                         ("--warmup", [warmup]), ("--batch", [batch]), ("--heads", [heads])):
        big = [v for v in values if v is not None and v >= 2**31]
        if big:
            raise UserError(f"{name} {big[0]} is too large (below 2^31)")
    for impl in impls:
        if impl not in IMPLS:
            raise UserError(f"unknown --impl {impl!r}; choose from {', '.join(IMPLS)}")
    for dt in dtypes:
        if dt not in devices.DTYPES:
            raise UserError(f"unknown --dtype {dt!r}; choose from {', '.join(devices.DTYPES)}")
    uses_flash = any(i.startswith("flash") for i in impls) or not impls
    if uses_flash:
        try:
            from lmprof.kernels.flash import MAX_HEAD_DIM, MIN_HEAD_DIM
        except ImportError as exc:  # (triton is a dependency on Linux only)
            raise UserError(f"--impl flash is not available: {exc}") from None

        bad = [d for d in ds if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM]
        if bad:
            # (the flash implementation given, or none given: each part's list has flash)
            given = next((i for i in impls if i.startswith("flash")), None)
            how = (f"drop --impl {given} to time the others" if given else
                   "every part times flash by default: give --impl naive, ... to time others")
            raise UserError(f"--d {bad[0]}: the flash kernel supports d_head {MIN_HEAD_DIM}–"
                            f"{MAX_HEAD_DIM} ({how})")


def _batch_heads(part: str, seq: int, d: int, batch, heads) -> tuple[int, int]:
    """(batch, heads) of a cell of ``part``: the options where given, else the part's own
    (part a has no head dimension: 1)."""
    if part == "a":
        return batch or PART_A["batch"], 1
    if part == "b":
        return batch or PART_B["batch"], heads or PART_B["heads"]
    return batch or max(1, PART_C["tokens"] // seq), heads or max(1, PART_C["width"] // d)


def _check_sizes(parts, seqs, ds, dtypes, batch, heads) -> None:
    """Every cell's q, k, v within the bytes a tensor holds (below 2^63): each size below 2^31,
    their product may not be, and such a cell was an ERROR row ("Storage size calculation
    overflowed")."""
    defaults = {"a": (PART_A["seq"], PART_A["d"], PART_A["dtype"]),
                "b": ((PART_B["seq"],), (PART_B["d"],), (PART_B["dtype"],)),
                "c": (PART_C["seq"], PART_C["d"], PART_C["dtype"])}
    for part in parts:
        part_seqs, part_ds, part_dtypes = defaults[part]
        for dt in dtypes or part_dtypes:
            size = devices.DTYPES[dt].itemsize
            for seq in seqs or part_seqs:
                for d in ds or part_ds:
                    b, h = _batch_heads(part, seq, d, batch, heads)
                    shape = (b, seq, d) if part == "a" else (b, h, seq, d)
                    if b * h * seq * d * size >= 2**63:
                        raise UserError(f"part {part}: q of shape ({', '.join(map(str, shape))}) "
                                        f"in {dt} is too large (beyond the 2^63 bytes of a "
                                        "tensor)")


@click.command("attention")
@click.option("--part", "parts", type=click.Choice(["a", "b", "c"]), multiple=True,
              help="Which part to run (repeatable): a = CS336 attention benchmark, b = leaderboard "
                   "configuration, c = seq × d_head sweep against SDPA. Default: all.")
@click.option("--impl", "impls", multiple=True,
              help=f"Implementations to time (repeatable): {', '.join(IMPLS)}. "
                   "Default: each part's own list.")
@click.option("--seq", "seqs", type=int, multiple=True,
              help="Sequence lengths (repeatable), replacing the part's list (b: its one length).")
@click.option("--d", "ds", type=int, multiple=True,
              help="Head dimensions (repeatable), replacing the part's list (b: its one d_head).")
@click.option("--dtype", "dtypes", multiple=True,
              help="fp32 | bf16 | fp16 (repeatable). Default: a fp32, b bf16, c bf16 and fp32.")
@click.option("--batch", type=int, default=None,
              help="Batch size for every part (default: a 8, b 1, c 16384 tokens / seq).")
@click.option("--heads", type=int, default=None,
              help="Heads for parts b and c (default: b 16, c 2048 / d_head).")
@click.option("--causal/--no-causal", default=None,
              help="Causal mask (top-left, as SDPA). Default: a not causal (as CS336), b and c "
                   "causal.")
@click.option("--iters", type=int, default=100, show_default=True,
              help="Part a: timed forward and backward passes per cell.")
@click.option("--warmup", type=int, default=5, show_default=True,
              help="Part a: untimed forward+backward passes first.")
@click.option("--device", type=str, default="auto", show_default=True,
              help=f"{' | '.join(devices.DEVICES)}; on CPU the Triton kernel needs TRITON_INTERPRET=1.")
@click.option("--out", type=PathParam(file_okay=False), default="runs", show_default=True,
              help="Directory under which the run directory <run-id>/ is created.")
@click.option("--label", type=str, default=None, help="Label used in the run id.")
def attention_cmd(parts, impls, seqs, ds, dtypes, batch, heads, causal, iters, warmup, device,
                  out, label) -> None:
    """Time attention implementations (CS336 benchmark, leaderboard, sweep) into a run directory.

    Exit status: 0 when every row is OK, OOM or UNSUPPORTED; 1 when a row is ERROR (all rows
    are still saved and shown); 2 for bad options; 130 for Ctrl-C, 143 for SIGTERM and 129 for
    SIGHUP (the rows finished before are kept)."""
    # each value once, in the order given (as --part): a repeated one timed the same cells twice
    parts = tuple(dict.fromkeys(parts or ("a", "b", "c")))
    impls, seqs, ds, dtypes = (tuple(dict.fromkeys(v)) for v in (impls, seqs, ds, dtypes))
    _check_options(impls, ds, seqs, dtypes, iters, warmup, batch, heads)
    # (an option of a part not run was ignored: do_bench times parts b and c its own way)
    given = click.get_current_context().get_parameter_source
    for name in ("iters", "warmup"):
        if "a" not in parts and given(name) is click.core.ParameterSource.COMMANDLINE:
            raise UserError(f"--{name} applies to part a (add --part a)")
    if heads is not None and parts == ("a",):
        raise UserError("--heads applies to parts b and c (add --part b or c)")
    _check_sizes(parts, seqs, ds, dtypes, batch, heads)
    dev = devices.resolve_device(device)
    for dt in dtypes:
        devices.check_dtype(dt, dev)
    defaults = {"a": PART_A, "b": PART_B, "c": PART_C}
    wanted = set(impls) if impls else {i for p in parts for i in defaults[p]["impls"]}
    if wanted & set(_FLASH_MODES):
        from lmprof.kernels import check_flash_available

        check_flash_available(dev)  # before any work: CPU needs TRITON_INTERPRET=1
    # (before the run directory: git and the GPU's properties take a while, and a Ctrl-C or
    # SIGTERM in them left the directory behind empty)
    env = _environment(dev, bool(wanted & set(_FLASH_MODES)))
    out_root = Path(out)
    run_dir = rundir.create_run_dir(
        out_root, label if label is not None else "attention-" + "".join(parts))
    config = {"parts": list(parts), "impls": list(impls), "seq": list(seqs), "d": list(ds),
              "dtype": list(dtypes), "batch": batch, "heads": heads, "causal": causal,
              "iters": iters, "warmup": warmup, "device": device}
    record: dict[str, Any] = {
        "run_id": run_dir.name, "kind": "attention",
        "created_utc": rundir.utc_now(),
        "status": "OK", "error": None, "config": config, "environment": env,
        "artifacts": {"attention": RESULTS_FILE},
    }
    results: dict[str, Any] = {"version": RESULTS_VERSION, "environment": record["environment"],
                               "leaderboard_best_ms": LEADERBOARD_BEST_MS}
    t0 = time.perf_counter()

    def save() -> None:
        record["timings"] = {"total_s": time.perf_counter() - t0}
        rundir.write_json(run_dir / RESULTS_FILE, results)
        rundir.write_run(run_dir, record)

    def finished(row: dict) -> None:
        save()  # on disk before it is reported
        _progress(row)

    # Every finished row is on disk at once, with the run marked ERROR ("incomplete") until the
    # end: a run killed outright (SIGKILL, a node failure, a hang ended by a scheduler) keeps its
    # rows and says it did not finish. A SIGTERM (a job's time limit) or SIGHUP (a closed
    # terminal) becomes an exception whose message replaces that one.
    record["status"], record["error"] = "ERROR", INCOMPLETE
    save()
    terminated = None
    try:
        with termination.as_exception():  # (left before the save below)
            results["matmul_bf16_tflops"] = matmul_tflops(dev)
            save()
            # each part appends to its list in results as rows finish (a partial part is kept)
            if "a" in parts:
                _part_a(results.setdefault("part_a", []), impls, seqs, ds, dtypes, batch, causal,
                        iters, warmup, dev, finished)
            if "b" in parts:
                _part_b(results.setdefault("part_b", []), impls, seqs, ds, dtypes, batch, heads,
                        causal, dev, finished)
            if "c" in parts:
                _part_c(results.setdefault("part_c", []), impls, seqs, ds, dtypes, batch, heads,
                        causal, dev, finished)
            record["status"], record["error"] = "OK", None
    except BaseException as exc:  # recorded, then raised: the run directory says what happened
        # (a Ctrl-C's KeyboardInterrupt has no message: its name alone)
        record["status"] = "ERROR"
        record["error"] = (f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)[:300]
        if not isinstance(exc, termination.Terminated):
            if isinstance(exc, KeyboardInterrupt):  # (the CLI then says "aborted", exit 130)
                click.echo(f"interrupted: partial results in {run_dir}", err=True)
            raise
        record["error"] += "; the rows finished before it are kept"
        terminated = exc
    finally:
        save()
        rundir.mark_latest_or_warn(out_root, run_dir)
    if terminated is not None:  # (other errors were raised above)
        termination.exit_terminated(
            terminated, f"error: {record['error']} (partial results in {run_dir})")
    # (echo_or_drop: a reader that stopped reading, `| head`, leaves an ERROR row's line and
    # exit 1, where a broken pipe here ended the command with exit 0)
    echo_or_drop(f"run: {run_dir}")
    from lmprof.reports.sections.attention import render_tables

    echo_or_drop(render_tables(results))
    failed = [r for part in ("part_a", "part_b", "part_c") for r in results.get(part, ())
              if r.get("status") == "ERROR"]
    if failed:  # (OOM and UNSUPPORTED rows are results; an ERROR row is a failure to look at)
        first = failed[0]
        where = " ".join(f"{k}={first[k]}" for k in ("dtype", "seq", "d") if k in first)
        click.echo(f"error: {len(failed)} row{'s' * (len(failed) != 1)} failed (ERROR): "
                   f"{first['impl']} {where}: {first['error']}", err=True)
        raise SystemExit(1)


def _dtypes(dtypes, default) -> list[torch.dtype]:
    return [devices.DTYPES[d] for d in (dtypes or default)]


def _progress(row: dict) -> None:
    parts = [f"{k}={row[k]}" for k in ("impl", "dtype", "seq", "d") if k in row]
    timing = next((f"{row[k]:.3f} ms" for k in ("e2e_ms", "fwd_ms") if row.get(k) is not None),
                  row["status"])
    click.echo("  " + " ".join(parts) + f": {timing}", err=True)


INCOMPLETE = "incomplete: the run stopped before it finished; the rows finished before are kept"


def _part_a(rows: list[dict], impls, seqs, ds, dtypes, batch, causal, iters, warmup, dev,
            finished: Callable[[dict], None]) -> None:
    for dt in _dtypes(dtypes, PART_A["dtype"]):
        for d in ds or PART_A["d"]:
            for seq in seqs or PART_A["seq"]:
                for impl in impls or PART_A["impls"]:
                    row = run_cs336_cell(impl, batch or PART_A["batch"], seq, d, dt,
                                         PART_A["causal"] if causal is None else causal,
                                         warmup, iters, dev)
                    rows.append(row)
                    finished(row)


def _part_b(rows: list[dict], impls, seqs, ds, dtypes, batch, heads, causal, dev,
            finished: Callable[[dict], None]) -> None:
    for dt in _dtypes(dtypes, (PART_B["dtype"],)):
        for seq in seqs or (PART_B["seq"],):
            for d in ds or (PART_B["d"],):
                for impl in impls or PART_B["impls"]:
                    row = run_bench_cell(impl, *_batch_heads("b", seq, d, batch, heads), seq, d,
                                         dt, PART_B["causal"] if causal is None else causal, dev)
                    rows.append(row)
                    finished(row)


def _part_c(rows: list[dict], impls, seqs, ds, dtypes, batch, heads, causal, dev,
            finished: Callable[[dict], None]) -> None:
    for dt in _dtypes(dtypes, PART_C["dtype"]):
        for d in ds or PART_C["d"]:
            for seq in seqs or PART_C["seq"]:
                b, h = _batch_heads("c", seq, d, batch, heads)
                for impl in impls or PART_C["impls"]:
                    row = run_bench_cell(impl, b, h, seq, d, dt,
                                         PART_C["causal"] if causal is None else causal, dev)
                    rows.append(row)
                    finished(row)

