"""The kernel tables of a prepared ``Trace`` as DuckDB results, without pandas.

Every table is one SQL result (``lmprof/analyze/sql/<table>.sql``); what comes from run.json (the
runner's own phase timing, attention FLOPs and bytes) goes into the SQL as literals. ``analyze
kernels`` fetches the results as rows (``lmprof.render.Table``) and never imports pandas;
``lmprof.analyze.kernels`` turns the same results into DataFrames for the Python API.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterable

import duckdb

from lmprof import rundir
from lmprof.analyze import db, sqlfile
from lmprof.analyze.trace import CALL_SUFFIX, Trace
from lmprof.errors import reading
from lmprof.model.config import ModelConfig
from lmprof.model.flops import attention_flops
from lmprof.render import md_text

Result = duckdb.DuckDBPyConnection  # a connection holding an executed, unfetched SELECT

# Bytes per element by run.json dtype, for the minimal-traffic estimate of attention parts
# (bf16 and fp16 runs are autocast: attention_shapes says which tensors stay fp32).
_DTYPE_BYTES = {"fp32": 4, "float32": 4, "tf32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2,
                "float16": 2}


def phase_timing(trace: Trace) -> Result:
    """(a) Per phase: NVTX wall time, GPU kernel time and span, busy %, launch rate, runner.
    The launch rate counts CUDA calls: ``_graph_launch_names`` names the calls (runtime and
    driver API) that launch a CUDA graph, one call for all the GPU work it ran. The runner's
    mean is over the steps the other columns keep: with --skip-steps N, over run.json's measured
    steps from the (N+1)-th, as the export of an lmprof run holds its measured steps alone."""
    timings = (trace.record or {}).get("timings") or {}
    summary = timings.get("summary") or {}
    skip = trace.options.skip_steps
    rows = []
    for phase, stats in summary.items():
        mean_s = (stats or {}).get("mean_s") if isinstance(stats, dict) else None
        if skip:  # (the summary's mean counts the steps left out)
            kept = [s[f"{phase}_s"] for s in (timings.get("steps") or [])[skip:]
                    if isinstance(s, dict) and s.get(f"{phase}_s") is not None]
            mean_s = sum(kept) / len(kept) if kept else None
        if mean_s is not None:
            rows.append((str(phase), float(mean_s * 1e9)))
    con = trace.use()
    con.execute("CREATE OR REPLACE TEMP TABLE _runner_timing (phase VARCHAR, mean_ns DOUBLE)")
    sqlfile.insert_rows(con, "_runner_timing", [("phase", "VARCHAR"), ("mean_ns", "DOUBLE")], rows)
    con.execute("CREATE OR REPLACE TEMP TABLE _graph_launch_names AS SELECT id FROM _strings "
                "WHERE value LIKE 'cudaGraphLaunch%' OR value LIKE 'cuGraphLaunch%'")
    graphs = con.execute("SELECT count(*) > 0 FROM _graph_launch_names").fetchall()[0][0]
    return trace.execute("phase_timing", graphs=bool(graphs))


def process_timing(trace: Trace) -> Result:
    """Phase timing per process, with each process's lag in starting a phase (several ranks)."""
    return trace.execute("process_timing")


def has_several_processes(trace: Trace) -> bool:
    """Whether ranges of more than one process mark phases (data-parallel ranks)."""
    return bool(trace.use().execute(
        "SELECT count(DISTINCT pid) > 1 FROM nvtx_ranges WHERE phase IS NOT NULL"
    ).fetchall()[0][0])


def top_kernels(trace: Trace, top: int | None = 10, exclude_class: str | None = None) -> Result:
    """(b, c) Top kernels per phase (phase 'all' = the whole export), optionally without a class."""
    sqlfile.run(trace.use(), "kernel_groups")
    return trace.execute("kernel_summary", top=top, exclude_class=exclude_class)


def gemm_fraction(trace: Trace) -> Result:
    """(d) Share of kernel time in GEMMs: inference, forward, backward, optimizer, step, all."""
    return trace.execute("gemm_fraction")


def class_breakdown(trace: Trace) -> Result:
    """(f) Kernel time by class per phase."""
    sqlfile.run(trace.use(), "kernel_groups")
    return trace.execute("class_breakdown")


def gpu_idle(trace: Trace) -> Result:
    """(f) Idle gaps between GPU operations inside each phase's GPU span."""
    return trace.execute("gpu_idle")


def communication(trace: Trace) -> Result:
    """Communication kernels per phase and device: time, overlap with compute, exposed time."""
    return trace.execute("communication", has_comm=has_communication(trace))


def has_communication(trace: Trace) -> bool:
    """Whether any kernel of the trace is of class communication (NCCL and the like)."""
    return bool(trace.use().execute(
        "SELECT count(*) > 0 FROM kernel_names WHERE kernel_class = 'communication'"
    ).fetchall()[0][0])


def _call_suffix(trace: Trace) -> str | None:
    """The pattern the per-range tables cut from range names (None: full names)."""
    return None if trace.options.full_range_names else CALL_SUFFIX


def range_summary(trace: Trace) -> Result:
    """Per NVTX range name: instances, wall time, attributed GPU ops and kernel time."""
    trace.chain()  # the chain that both branches of _op_ranges_wide read, computed once
    return trace.execute("range_summary", call_suffix=_call_suffix(trace))


def range_kernels(trace: Trace) -> Result:
    """Per NVTX range name and kernel, like nsys's nvtx_kern_sum."""
    trace.chain()
    return trace.execute("range_kernels", call_suffix=_call_suffix(trace))


def attention_shapes(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """FLOPs and minimal bytes of one softmax range and of one attention matmul range (one
    layer's, whole batch, all heads: what each range instance computes) from run.json, or None."""
    if not record:
        return None
    model, config = record.get("model") or {}, record.get("config") or {}
    try:
        cfg = ModelConfig(**{k: int(model[k]) for k in (
            "vocab_size", "d_model", "d_ff", "num_layers", "num_heads") if k in model},
            context_length=int(config.get("context_length") or model["context_length"]))
        batch = int(config["batch_size"])
        d_head = int(model.get("d_head") or cfg.d_head)
        flops = attention_flops(cfg, batch, cfg.context_length)
    except Exception:  # noqa: BLE001 — a run.json of any age or state: no shapes, no FLOP columns
        return None
    if batch <= 0 or d_head <= 0:
        return None
    t = cfg.context_length
    bh = batch * cfg.num_heads
    elem = _DTYPE_BYTES.get(str(config.get("dtype")), 4)
    return {
        "softmax_flops": flops["softmax_flops"],
        # each matmul range (scores QKᵀ or the final PV) is one T×T×d_head product
        "matmul_flops": flops["scores_flops"],
        # minimal traffic: softmax reads the T×T scores and writes the T×T probabilities, in
        # fp32 (4 bytes) whatever the dtype: autocast (the bf16 and fp16 runs) computes softmax
        # in fp32, the range casting the scores up first
        "softmax_bytes": bh * t * t * (elem + 4),
        # a GEMM (its rates are over the GEMM kernels' time) moves T×T plus two T×d_head in the
        # run's dtype (the PV GEMM reads the probabilities cast down to it)
        "matmul_bytes": bh * (t * t + 2 * t * d_head) * elem,
    }


_NO_SHAPE = sqlfile.Fragment("CAST(NULL AS DOUBLE)")


def softmax_vs_matmul(trace: Trace) -> Result:
    """(e) GPU time under the softmax range vs the attention matmul ranges, time and FLOP ratios,
    achieved FLOP/s and bytes/s of each (FLOPs and bytes need run.json beside the report)."""
    con = trace.use()
    con.execute("CREATE OR REPLACE TEMP TABLE _attention_ranges (name VARCHAR, part VARCHAR)")
    rows = [(n, "softmax") for n in trace.options.softmax_ranges] + \
           [(n, "matmul") for n in trace.options.matmul_ranges]
    sqlfile.insert_rows(con, "_attention_ranges", [("name", "VARCHAR"), ("part", "VARCHAR")], rows)
    shapes = attention_shapes(trace.record)
    keys = ("softmax_flops", "matmul_flops", "softmax_bytes", "matmul_bytes")
    params = {k: (shapes[k] if shapes else _NO_SHAPE) for k in keys}
    return trace.execute("attention", call_suffix=_call_suffix(trace), **params)


# name -> (function, what the trace must hold for the table to have rows — NVTX "ranges",
# "communication" kernels, phase ranges of several "processes", or None —, note for markdown).
# Order is the order of output.
TABLES: dict[str, tuple[Callable[..., Result], str | None, str]] = {
    "phase_timing": (phase_timing, "ranges",
                     "Means per NVTX range instance. GPU span: first to last GPU op attributed to "
                     "the instance; busy: union of op intervals / span. Launches: CUDA calls "
                     "that launched kernels (one per graph launch, however many kernels it "
                     "ran). Runner: run.json timing."),
    "process_timing": (process_timing, "processes",
                       "Phase timing per process (data-parallel ranks); start lag: how much later "
                       "than the earliest process it starts the k-th instance of the phase."),
    "top_kernels": (top_kernels, None,
                    "Per phase; phase 'all' is every kernel of the report (= nsys "
                    "cuda_gpu_kern_sum)."),
    "top_non_gemm_kernels": (lambda t, top=10: top_kernels(t, top, exclude_class="gemm"), None,
                             "As above, GEMM kernels left out; Time (%) is the share of the "
                             "phase's non-GEMM kernel time."),
    "gemm_fraction": (gemm_fraction, None,
                      "Share of kernel time in GEMM kernels; '(none)' is kernels of no phase, "
                      "'step' everything inside step ranges, 'all' the whole report."),
    "softmax_vs_matmul": (softmax_vs_matmul, "ranges",
                          "Kernels launched under the softmax range vs the attention-score and "
                          "final matmul ranges (which also launch the scaling, the causal mask "
                          "and autocast's casts; Matmul GEMM is their GEMM kernels alone). "
                          "FLOPs and bytes (minimal traffic; softmax in fp32 under autocast) "
                          "from run.json; softmax rates over its ranges' time, matmul rates over "
                          "the GEMMs' time."),
    "class_breakdown": (class_breakdown, None, "Kernel time by class per phase."),
    "gpu_idle": (gpu_idle, "ranges",
                 "Idle time between GPU ops inside each phase instance's span."),
    "communication": (communication, "communication",
                      "Communication kernels (NCCL) per phase and device: overlapped = time a "
                      "compute kernel ran beside them on the device, exposed = the rest; GEMM "
                      "of compute = the GEMM fraction without them."),
    "ranges": (range_summary, "ranges",
               "Every NVTX range name with the GPU work attributed to it."),
    "range_kernels": (range_kernels, "ranges", "Kernels per NVTX range name (like nvtx_kern_sum)."),
}
# (a)-(f) of the kernel analysis; the nsys-style per-range tables are asked for by name.
DEFAULT_TABLES = tuple(t for t in TABLES if t not in ("ranges", "range_kernels"))
# Default tables about traces of several processes / GPUs: `analyze kernels` leaves them out of
# its output when they are empty (a one-GPU run, the usual case), unless asked for by name.
MULTI_RANK_TABLES = tuple(name for name, (_, needs, _) in TABLES.items()
                          if needs in ("processes", "communication"))
NO_RANGES_NOTE = "No NVTX ranges in this report: nothing to attribute by range."


def without_empty_multi_rank(tables: dict[str, Any]) -> dict[str, Any]:
    """``tables`` less the multi-rank ones without rows (a one-GPU trace): what `analyze kernels`
    prints by default and what the report shows. Tables are ``Table``s or DataFrames."""
    return {name: t for name, t in tables.items()
            if not (name in MULTI_RANK_TABLES and (t is None or t.empty))}

# Why a table is empty when the trace lacks what it needs (TABLES' second field).
_MISSING_NOTES = {
    "ranges": NO_RANGES_NOTE,
    "communication": "No communication kernels (NCCL) in this report: one GPU, or no collective "
                     "ran in the captured steps.",
    "processes": "Phase ranges of one process at most in this report: per-process timing is "
                 "for several (data-parallel ranks); one process's is the phase timing.",
}


# Tables that read phase_instances, which prepare may have deferred (Trace.ready builds it): the
# lane holding them builds it while the other lanes compute theirs.
_READS_PHASE_INSTANCES = ("phase_timing", "process_timing", "gpu_idle")
# Tables computed one after another on one connection (a lane); lanes run at once, each on its
# own cursor. The three kernel-group tables share _kernel_groups (built by the first that needs
# it; two connections creating it at once would conflict); the three that read phase_instances
# share its deferred build; every other table is a lane of its own.
_LANES = (("top_kernels", "top_non_gemm_kernels", "class_breakdown"), _READS_PHASE_INSTANCES)


def _lanes(names: tuple[str, ...], at_most: int | None = None) -> list[list[str]]:
    """The lanes of ``names``; with ``at_most``, no more lanes than that: the lane that builds
    phase_instances (the longest) stays alone, the others are dealt out to the rest in turn (on
    a 2-core machine four lanes at once only take turns: x100, whole process, 0.622 -> 0.610 s
    with two)."""
    lanes = [[n for n in lane if n in names] for lane in _LANES]
    lanes += [[n] for n in dict.fromkeys(names) if not any(n in lane for lane in _LANES)]
    lanes = [lane for lane in lanes if lane]
    if at_most is None or len(lanes) <= at_most:
        return lanes
    if at_most <= 1:
        return [[n for lane in lanes for n in lane]]
    first = [lane for lane in lanes if any(n in _READS_PHASE_INSTANCES for n in lane)][:1]
    others = [lane for lane in lanes if lane not in first]
    dealt: list[list[str]] = [[] for _ in range(at_most - len(first))]
    for i, lane in enumerate(others):
        dealt[i % len(dealt)].extend(lane)
    return first + [lane for lane in dealt if lane]


def results(trace: Trace, names: tuple[str, ...] = DEFAULT_TABLES, top: int | None = 10,
            fetch: Callable[[Result], Any] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """The named tables of one trace, each ``fetch``ed from its executed result (``None``: as
    ``lmprof.render.Table``), and their notes; a phase table of a report without NVTX ranges is
    ``None`` (no columns, no rows) and its note says why.

    Independent tables are computed at once on separate cursors (``_LANES``): a table's query
    reads a few hundred thousand rows, which DuckDB splits into few tasks, so on a machine with
    many cores one query at a time leaves most of them idle. Numbers of a damaged export that
    overflow DuckDB's arithmetic are a UserError naming the export."""
    with reading(trace.path):
        return _results(trace, names, top, fetch)


def _results(trace: Trace, names: tuple[str, ...], top: int | None,
             fetch: Callable[[Result], Any] | None) -> tuple[dict[str, Any], dict[str, str]]:
    if fetch is None:
        from lmprof.render import Table

        fetch = Table.fetch
    holds = {"ranges": trace.count("nvtx_ranges") > 0}
    if {"communication", "top_kernels", "class_breakdown", "gemm_fraction"} & set(names):
        holds["communication"] = has_communication(trace)
    if "process_timing" in names:
        holds["processes"] = has_several_processes(trace)
    out: dict[str, Any] = {}

    def compute(t: Trace, name: str) -> None:
        if name in _READS_PHASE_INSTANCES:
            t.ready()
        fn, needs, _ = TABLES[name]
        if needs is not None and not holds[needs]:
            out[name] = None
        else:
            out[name] = fetch(fn(t, top=top) if name.startswith("top_") else fn(t))

    def lane(names_in_lane: list[str]) -> None:
        with db.cursor(trace.con) as cur:  # Trace.use() sets the schema
            for name in names_in_lane:
                compute(dataclasses.replace(trace, con=cur), name)

    if holds["ranges"] and {"ranges", "range_kernels"} & set(names):
        # the chain both per-range tables read, kept before the lanes start: on every thread,
        # not on one lane's while the other waits for it (emit_nvtx x100: 0.73 s on one)
        trace.chain()
    # no more lanes than DuckDB has threads (its default: the machine's cores)
    threads = int(trace.con.execute("SELECT current_setting('threads')").fetchall()[0][0])
    lanes = _lanes(tuple(names), at_most=max(threads, 1))
    if len(lanes) == 1:
        for name in lanes[0]:
            compute(trace, name)
    else:
        # Each lane's own thread runs its statements' tasks too, so DuckDB's workers make up the
        # rest of the threads only: lanes + workers = threads (2 cores, 2 lanes: no worker).
        # Put back after.
        trace.con.execute(f"SET threads = {max(threads - len(lanes) + 1, 1)}")
        try:
            db.at_once([functools.partial(lane, names_in_lane) for names_in_lane in lanes],
                       "table")
        finally:
            trace.con.execute(f"SET threads = {threads}")
    return {name: out[name] for name in names}, _notes(trace, names, out, holds)


def _notes(trace: Trace, names: tuple[str, ...], out: dict[str, Any],
           holds: dict[str, bool]) -> dict[str, str]:
    """Each table's note: what it shows, or why it is empty (what the trace lacks, what to pass
    for a trace of other code), with what the trace's nature changes (NCCL waiting, graphs
    traced whole, skipped steps)."""
    notes = {name: _MISSING_NOTES[TABLES[name][1]] if out[name] is None else TABLES[name][2]
             for name in names}
    if out.get("softmax_vs_matmul") is not None and out["softmax_vs_matmul"].empty:
        opts = trace.options
        looked_for = ", ".join(md_text(repr(n))
                               for n in (*opts.softmax_ranges, *opts.matmul_ranges))
        notes["softmax_vs_matmul"] += " " + (_no_attention_ranges(trace) or (
            f"No kernel ran under a range named {looked_for}: name your attention's softmax "
            "and matmul ranges with --softmax-range and --matmul-range."))
    if holds.get("communication"):
        for name in ("top_kernels", "class_breakdown", "gemm_fraction"):
            if name in notes:
                notes[name] += (" Communication (NCCL) kernels count their whole duration, "
                                "waiting for the other ranks included: see the communication "
                                "table for what compute hid.")
    graphs = _graphs_note(trace)
    if graphs:
        for name in names:
            notes[name] = graphs + " " + notes[name]
    phase_tables = [n for n in ("phase_timing", "gpu_idle") if out.get(n) is not None]
    skip = trace.options.skip_steps
    if phase_tables and all(out[n].empty for n in phase_tables):
        hint = (f"--skip-steps {skip} left no phase: no process has more than {skip} steps."
                if skip else _no_phase_ranges(trace))
        for n in phase_tables:
            notes[n] += " " + hint
    elif skip:
        for n in (*phase_tables, "process_timing"):
            if out.get(n) is not None:
                notes[n] += (f" Each process's first {skip} step(s) left out (--skip-steps): "
                             "their GPU work is phase '(none)'.")
    near = _near_phase_names(trace) if phase_tables else ""
    for n in (*phase_tables, "process_timing"):
        if near and out.get(n) is not None:
            notes[n] += " " + near
    return notes


def _near_phase_names(trace: Trace) -> str:
    """For a phase that no range marks, named other than by its own name (--phase-range, a
    trace of other code): the ranges whose names differ from that name only in case or
    spaces, which the phase would otherwise lack without a word. Read only where such a phase
    exists (never for lmprof's own names)."""
    given = {phase for name, phase in trace.options.phase_ranges if name != phase}
    if not given:
        return ""
    con = trace.use()
    if given <= {p for (p,) in con.execute(
            "SELECT DISTINCT phase FROM nvtx_ranges WHERE phase IS NOT NULL").fetchall()}:
        return ""
    # the given names come from _phase_names, as data (never spliced into the statement)
    rows = con.execute(
        "SELECT p.range_name, p.phase, r.name, count(*) AS n FROM _phase_names p "
        "JOIN nvtx_ranges r ON lower(trim(r.name)) = lower(trim(p.range_name)) "
        "WHERE p.range_name <> p.phase AND r.name <> p.range_name "
        "AND p.phase NOT IN (SELECT phase FROM nvtx_ranges WHERE phase IS NOT NULL) "
        "GROUP BY ALL ORDER BY p.range_name, n DESC, r.name").fetchall()
    found: dict[tuple[str, str], list[str]] = {}
    for given, phase, name, n in rows:
        found.setdefault((given, phase), []).append(f"{md_text(repr(name))} ({n})")
    return " ".join(f"No range is named {md_text(repr(given))} (a name of the {phase} phase); "
                    f"differing from it only in case or spaces: {', '.join(names)}."
                    for (given, phase), names in found.items())


def _graphs_note(trace: Trace) -> str | None:
    """What a trace with CUDA graphs traced as whole graphs lacks, or None."""
    n, ns = trace.use().execute(
        "SELECT count(*), coalesce(sum(end_ns - start_ns), 0) FROM _graph_execs").fetchall()[0]
    if not n:
        return None
    return (f"**{n} CUDA graph launch(es) ran {ns / 1e6:.3f} ms of GPU work that this report "
            "traced as whole graphs (nsys --cuda-graph-trace=graph, its default): the kernels "
            "inside are not in it, so the kernel tables leave that time out (the phase spans, "
            "busy time and gaps count each graph as one GPU op). Profile with "
            "--cuda-graph-trace=node (capture run --nsys does).**")


def _no_phase_ranges(trace: Trace) -> str:
    """What to do when no range of a trace with ranges marks a phase (a trace of other code):
    the names looked for, and the most frequent outer ranges to name with --phase-range: push/pop
    ranges of level 0 or 1 and start/end ranges (no level), of the default domain, else (the
    user's ranges in a domain of their own) of any."""
    looked_for = ", ".join(md_text(repr(n))
                           for n in dict.fromkeys(n for n, _ in trace.options.phase_ranges))
    # the pattern as a literal: a bound parameter makes DuckDB import pandas
    rows = trace.use().execute(
        "WITH outer_ranges AS (SELECT name, domain, start_ns FROM nvtx_ranges "
        "WHERE coalesce(level, 0) <= 1 "
        f"AND NOT regexp_matches(name, {sqlfile.literal(CALL_SUFFIX)})) "
        "SELECT name, count(*) AS n FROM outer_ranges WHERE domain = '' "
        "OR NOT EXISTS (SELECT 1 FROM outer_ranges WHERE domain = '') "
        "GROUP BY name ORDER BY n DESC, min(start_ns) LIMIT 6").fetchall()
    found = ", ".join(f"{md_text(repr(name))} ({n})" for name, n in rows)
    return (f"No NVTX range marks a phase: none is named {looked_for} (each optionally with a "
            f"_N suffix). " + (f"Outer ranges of this report: {found}. " if found else "") +
            "Name the phases with --phase-range PHASE=NAME (e.g. --phase-range forward=fwd).")


def _no_attention_ranges(trace: Trace) -> str | None:
    """Why a run (by its run.json) opens no attention ranges, if its settings say why."""
    config = (trace.record or {}).get("config") or {}
    attention = config.get("attention")
    if isinstance(attention, str) and attention != "naive":
        return ("Nothing ran under those ranges: only naive attention opens them (scores, "
                f"softmax and final matmul as separate steps); this run's attention is "
                f"{md_text(repr(attention))}, which computes them in one call (with the Triton "
                "kernel or a fused SDPA backend, one kernel of class attention, in the tables "
                "above).")
    if config.get("compile") is True:
        return ("Nothing ran under those ranges: this run was compiled (torch.compile), and "
                "lmprof's model opens no ranges inside compiled code (a range there would "
                "break the graph), so the attention's parts cannot be told apart by range; the "
                "kernels torch.compile generated for softmax are class softmax in the class "
                "breakdown.")
    return None


# --- several reports: per-run tables with a run column, cross-run tables, without pandas ------
# Each mirrors the pandas code of lmprof.analyze.kernels.several_reports / cross_run, dtypes
# included (tests/analyze/test_render_rows.py renders both); None where pandas would be needed to
# print the same (column types that pandas would unify otherwise): the caller then uses that.

_INTS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER",
         "UBIGINT"}


def _stack(tables: list[Any]) -> Any:
    """``pd.concat`` of Tables with the same columns: integer columns that are floats in some
    table become floats (int64 + float64 -> float64), as pandas does. None: other mixes."""
    from lmprof.render import Table

    first = tables[0]
    if any(t.columns != first.columns for t in tables):
        return None
    types, to_float = [], []
    for i in range(len(first.columns)):
        kinds = {t.types[i] for t in tables}
        if len(kinds) == 1:
            types.append(first.types[i])
        elif kinds <= _INTS:
            types.append("BIGINT")
        elif all(k in _INTS or k in ("DOUBLE", "HUGEINT") or k.startswith("DECIMAL(")
                 for k in kinds):
            types.append("DOUBLE")
            to_float.append(i)
        else:
            return None
    rows = [row for t in tables for row in t.rows]
    if to_float:
        rows = [tuple(float(v) if (i in to_float and v is not None) else v
                      for i, v in enumerate(row)) for row in rows]
    return Table(list(first.columns), types, rows)


def _frame_of_records(records: list[dict[str, Any]]) -> Any:
    """``pd.DataFrame(records)`` (same keys in every record) as a Table: a column of ints with
    None becomes floats (float64), str with None stays text, all None stays None (object).
    None for anything else."""
    from lmprof.render import Table

    if not records:
        return Table([], [], [])
    columns = list(records[0])
    if any(list(r) != columns for r in records):
        return None
    types, cols = [], []
    for c in columns:
        values = [r[c] for r in records]
        present = [v for v in values if v is not None and not (isinstance(v, float) and v != v)]
        if not present:
            types.append("DOUBLE" if any(isinstance(v, float) for v in values) else "VARCHAR")
            cols.append([None] * len(values))
        elif all(isinstance(v, str) for v in present):
            types.append("VARCHAR")
            cols.append([v if isinstance(v, str) else None for v in values])
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in present) and \
                len(present) == len(values):
            types.append("BIGINT")
            cols.append(values)
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
            types.append("DOUBLE")
            cols.append([None if v is None else float(v) for v in values])
        else:
            return None
    return Table(columns, types, [tuple(row) for row in zip(*cols)])


def without_empty_phases(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GEMM-fraction rows without the phase columns no run has (inference in training runs)."""
    empty = [k for k in (rows[0] if rows else {}) if k.endswith("_gemm_pct")
             and all(r[k] != r[k] for r in rows)]  # NaN in every row
    return [{k: v for k, v in r.items() if k not in empty} for r in rows]


def by_size_and_context(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cross-run rows by model size as in the CS336 table (tiny, small, ... 2.7B, a size with
    other dims after the size's own runs, other sizes after them: ``rundir.size_order``), then
    context length (unknown last), then run; stable."""
    return sorted(rows, key=lambda r: (rundir.size_order(r["size"]), r["context_length"] is None,
                                       r["context_length"] or 0, str(r["run"])))


def size_context(trace: Trace) -> dict[str, Any]:
    """A cross-run row's labels: run, model size (named with the dims it changes, as the
    report's grids name it: rundir.model_label, "small (2 layers)"), context length (from
    run.json)."""
    record = trace.record or {}
    c = record.get("config") or {}
    size = rundir.model_label(record) if c.get("size") else None
    return {"run": trace.label, "size": size, "context_length": c.get("context_length")}


def gemm_row(trace: Trace, pct: dict[str, Any]) -> dict[str, Any]:
    """A run's gemm_fraction_by_run row from its gemm_fraction (phase -> GEMM %; NaN: none)."""
    return {**size_context(trace), **{f"{p}_gemm_pct": float("nan") if pct.get(p) is None
                                      else pct[p] for p in GEMM_PHASES}}


def attention_rows(trace: Trace, rows: Iterable[Any]) -> list[dict[str, Any]]:
    """A run's softmax_vs_matmul_by_run rows: the forward and inference rows of its
    softmax_vs_matmul (each row by column name), the ``ATTN_COLUMNS`` kept (NaN: none)."""
    return [{**size_context(trace), "phase": r["phase"],
             **{k: float("nan") if r[k] is None else r[k] for k in ATTN_COLUMNS}}
            for r in rows if r["phase"] in ("forward", "inference")]


def _column(table: Any, name: str) -> list:
    i = table.columns.index(name)
    return [row[i] for row in table.rows]


# the phases of gemm_fraction_by_run, in its column order
GEMM_PHASES = ("inference", "forward", "backward", "optimizer", "step")
# softmax_vs_matmul's columns that the cross-run table keeps
ATTN_COLUMNS = ("softmax_ns", "matmul_ns", "matmul_gemm_ns", "time_ratio", "flop_ratio",
                 "softmax_tflops", "matmul_tflops")
# The cross-run tables' notes (analyze kernels with several reports, and the report's section)
CROSS_RUN_NOTES = {
    "gemm_fraction_by_run": "Each run's GEMM share of kernel time per phase (its "
                            "gemm_fraction table), by model size and context length.",
    "softmax_vs_matmul_by_run": "Each run's forward and inference rows of its softmax_vs_matmul "
                                "table, by model size and context length: the time ratio is "
                                "over the ranges' time, the softmax rate over its ranges' time, "
                                "the matmul rate over their GEMM kernels' time (Matmul GEMM).",
}


def cross_run(traces: list[Trace]) -> dict[str, Any] | None:
    """GEMM fraction and softmax/matmul ratios by model size × context length, one row per run
    (Tables; None where only pandas would print them as ``lmprof.analyze.kernels.cross_run``)."""
    from lmprof.render import Table

    gemm_rows, attn_rows = [], []
    for tr in traces:
        g = Table.fetch(gemm_fraction(tr))
        if not isinstance(g, Table):
            return None
        gemm_rows.append(gemm_row(tr, dict(zip(_column(g, "phase"), _column(g, "gemm_pct")))))
        if tr.count("nvtx_ranges"):
            a = Table.fetch(softmax_vs_matmul(tr))
            if not isinstance(a, Table):
                return None
            attn_rows += attention_rows(tr, (dict(zip(a.columns, row)) for row in a.rows))
    out = {}
    for name, rows in (("gemm_fraction_by_run", without_empty_phases(gemm_rows)),
                       ("softmax_vs_matmul_by_run", attn_rows)):
        table = _frame_of_records(by_size_and_context(rows))
        if table is None:
            return None
        out[name] = table
    return out


def _split_note(name: str, note: str) -> tuple[str, str]:
    """One report's note of table ``name`` as (what the table shows, or why it is empty; what
    ``_notes`` said there about the report: CUDA graphs traced whole, NCCL kernels' waiting,
    skipped steps, the ranges to name, ...)."""
    for base in (TABLES[name][2], _MISSING_NOTES.get(TABLES[name][1] or "")):
        if base and base in note:
            before, after = note.split(base, 1)
            return base, f"{before.strip()} {after.strip()}".strip()
    return note, ""


def stacked_notes(runs: list[tuple[str, dict[str, str], dict[str, Any]]]) -> dict[str, str]:
    """The notes of several reports' stacked tables, from each report's (label, notes,
    tables): what a table shows, from a report whose table has rows (one report's note about
    why its table is empty, no ranges or no communication kernels, gives way to it: the stacked
    table shows those rows), then what each report's note said about that report, after the
    runs it was said of (all of them: no label). One report's whole note, as before, lost the
    others' words: the missing kernels of graphs traced whole, NCCL's waiting."""
    notes: dict[str, str] = {}
    for name in runs[0][1] if runs else ():
        split = [(label, *_split_note(name, n[name]), t.get(name)) for label, n, t in runs]
        with_rows = [s for s in split if s[3] is not None and not s[3].empty]
        said: dict[str, list[str]] = {}
        for label, _, extra, _ in split:
            if extra:
                said.setdefault(extra, []).append(md_text(label))  # (notes are markdown)
        notes[name] = " ".join([(with_rows or split)[0][1], *(
            extra if len(labels) == len(runs) else f"{', '.join(labels)}: {extra}"
            for extra, labels in said.items())])
    return notes


def several_reports(traces: list[Trace], names: tuple[str, ...], top: int | None
                    ) -> tuple[dict[str, Any], dict[str, str]] | None:
    """Every named table of each trace with a ``run`` column first, stacked, then the cross-run
    tables, as Tables; None where a table needs pandas to print as
    ``lmprof.analyze.kernels.several_reports`` does."""
    from lmprof.render import Table

    per_run: dict[str, list[Any]] = {n: [] for n in names}
    each: list[tuple[str, dict[str, str], dict[str, Any]]] = []
    for tr in traces:
        t, n = results(tr, names, top)
        each.append((str(tr.label), n, t))
        for name, table in t.items():
            if table is None or table.empty:
                continue
            if not isinstance(table, Table):
                return None
            label = str(tr.label)
            per_run[name].append(Table(["run", *table.columns], ["VARCHAR", *table.types],
                                       [(label, *row) for row in table.rows]))
    tables: dict[str, Any] = {}
    for name, parts in per_run.items():
        tables[name] = _stack(parts) if parts else Table([], [], [])
        if tables[name] is None:
            return None
    cross = cross_run(traces)
    if cross is None:
        return None
    tables.update(asked_cross_run(cross, names))
    notes = stacked_notes(each)
    notes.update({name: CROSS_RUN_NOTES[name] for name in tables if name in CROSS_RUN_NOTES})
    return tables, notes


def asked_cross_run(cross: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The cross-run tables of the per-run tables asked for: ``gemm_fraction_by_run`` with
    ``gemm_fraction``, ``softmax_vs_matmul_by_run`` with ``softmax_vs_matmul`` (``--table
    top_kernels`` printed both)."""
    return {name: t for name, t in cross.items() if name.removesuffix("_by_run") in names}
