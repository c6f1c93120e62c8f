"""Traces of code other than lmprof's (tests/data/h200x2-user-traces, made by
bench/device/user_train.py on two H200s): its own range names, DistributedDataParallel over two
processes and GPUs (NCCL all-reduces overlapping the backward), PyTorch's emit_nvtx (a range
per aten op and autograd node, five levels deep), and a whole program profiled without a capture
range (its warm-up step included), and the whole step captured in one CUDA graph (traced as
whole graphs, nsys's default, and node by node). Checked against nsys's own reports of the same
exports (nsys-stats/, nsys 2025.3.1) and against interval arithmetic done here in Python."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from lmprof.analyze import kernels, trace
from nsys_data import run, sha256

DATA = Path(__file__).resolve().parents[1] / "data" / "h200x2-user-traces"
USER_PHASES = (("iter", "step"), ("fwd", "forward"), ("bwd", "backward"), ("opt", "optimizer"))
PHASE_ARGS = ["--phase-range", "step=iter", "--phase-range", "forward=fwd",
              "--phase-range", "backward=bwd", "--phase-range", "optimizer=opt"]


@pytest.fixture(scope="module")
def exports(runs_with_exports) -> Path:
    return runs_with_exports(DATA, ("ddp", "emit", "plain", "graph", "graphnode"))


def _stats(name: str, report: str) -> pd.DataFrame:
    folder = DATA / name / "nsys-stats"
    path = folder / f"{report}.csv"
    if not path.exists():
        path = folder / f"{report}.csv.xz"
    return pd.read_csv(path, keep_default_na=False, na_values=[])


def _trace(exports: Path, name: str, **options) -> trace.Trace:
    # the path as a string, as a user of the Python API might give it
    return trace.prepare(duckdb.connect(), str(exports / name / "report.sqlite"),
                         trace.Options(phase_ranges=USER_PHASES, **options))


@pytest.mark.parametrize("name", ["ddp", "emit", "plain", "graphnode"])
def test_thread_rule_reproduces_nsys_on_other_code(exports, name):
    """nvtx_kern_sum row for row (two processes; 6,193 rows of emit_nvtx ranges) and
    nvtx_gpu_proj_sum's GPU-op counts, with every range text kept apart as nsys keeps it."""
    tr = _trace(exports, name, attribution="thread", full_range_names=True)
    theirs = _stats(name, "nvtx_kern_sum")
    mine = kernels.range_kernels(tr)
    # rows in one order, run after run: ties of (range, time, kernel) broken by style, pid, tid
    order = mine.sort_values(["range", "total_ns", "name", "style", "pid", "tid"],
                             ascending=[True, False, True, True, True, True], kind="stable")
    assert list(order.index) == list(mine.index)
    mine = mine.rename(columns={
        "range": "NVTX Range", "style": "Style", "pid": "PID", "tid": "TID",
        "name": "Kernel Name"})
    key = ["NVTX Range", "Style", "PID", "TID", "Kernel Name"]
    merged = theirs.merge(mine, on=key, how="outer", indicator=True)
    assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"][key].head()
    assert len(merged) == len(theirs) > 50
    for a, b in (("Kern Inst", "instances"), ("Total Time (ns)", "total_ns"),
                 ("NVTX Inst", "range_instances"), ("Min (ns)", "min_ns"),
                 ("Max (ns)", "max_ns")):
        assert (merged[a] == merged[b]).all(), a
    proj = _stats(name, "nvtx_gpu_proj_sum").set_index("Range")
    summary = kernels.range_summary(tr)
    order = summary.sort_values(["cpu_total_ns", "range", "style"],
                                ascending=[False, True, True], kind="stable")
    assert list(order.index) == list(summary.index)
    summary = summary.set_index("range")
    assert set(proj.index) <= set(summary.index)
    for rng, row in proj.iterrows():
        assert summary.loc[rng, "instances"] == row["Range Instances"], rng
        if name == "graphnode":  # nsys projects a graph launch as one op; here each node counts
            nodes = tr.df("SELECT count(*) AS n FROM gpu_ops")["n"].iloc[0]
            assert summary.loc[rng, "gpu_ops"] == nodes > 2000 and row["Total GPU Ops"] == 4
        else:
            assert summary.loc[rng, "gpu_ops"] == row["Total GPU Ops"], rng


@pytest.mark.parametrize("name", ["ddp", "emit", "plain", "graphnode"])
def test_kernel_totals_equal_nsys_summary(exports, name):
    tr = _trace(exports, name)
    top = kernels.top_kernels(tr, top=None)
    mine = top[top["phase"] == "all"].set_index("name")
    theirs = _stats(name, "cuda_gpu_kern_sum").set_index("Name")
    assert set(mine.index) == set(theirs.index)
    assert (mine.loc[theirs.index, "total_ns"] == theirs["Total Time (ns)"]).all()
    assert (mine.loc[theirs.index, "instances"] == theirs["Instances"]).all()


def test_emit_nvtx_ranges_grouped_by_op(exports):
    """By default the per-call suffixes of emit_nvtx (', seq = N, op_id = N') are cut: one row
    per op, whose counts and times are nsys's rows of that op summed."""
    tr = _trace(exports, "emit", attribution="thread")
    theirs = _stats("emit", "nvtx_kern_sum")
    theirs["op"] = theirs["NVTX Range"].str.split(", ").str[0]
    assert theirs["op"].nunique() < theirs["NVTX Range"].nunique() / 10  # 6,193 -> a few hundred
    key = ["op", "Style", "PID", "TID", "Kernel Name"]
    summed = theirs.groupby(key).agg(inst=("Kern Inst", "sum"), total=("Total Time (ns)", "sum"),
                                     nvtx=("NVTX Inst", "sum"), lo=("Min (ns)", "min"),
                                     hi=("Max (ns)", "max")).reset_index()
    mine = kernels.range_kernels(tr).rename(columns={
        "range": "op", "style": "Style", "pid": "PID", "tid": "TID", "name": "Kernel Name"})
    merged = summed.merge(mine, on=key, how="outer", indicator=True)
    assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"][key].head()
    for a, b in (("inst", "instances"), ("total", "total_ns"), ("nvtx", "range_instances"),
                 ("lo", "min_ns"), ("hi", "max_ns")):
        assert (merged[a] == merged[b]).all(), a
    ranges = kernels.range_summary(tr).set_index("range")
    assert ":aten::linear" in ranges.index and ":aten::linear, seq = 0" not in ranges.index
    wall = _stats("emit", "nvtx_sum")
    wall["op"] = wall["Range"].str.split(", ").str[0]
    by_op = wall.groupby("op").agg(n=("Instances", "sum"), t=("Total Time (ns)", "sum"))
    for op, row in by_op.iterrows():
        assert ranges.loc[op, "instances"] == row["n"], op
        assert ranges.loc[op, "cpu_total_ns"] == row["t"], op


def test_attention_parts_reached_through_another_threads_range(exports):
    """softmax_vs_matmul counts a kernel under a part range open on another thread of the process
    (here 'bwd', pushed on the main thread while the autograd thread launches the backward): those
    pairs come only from an op's other members (_op_members). Checked against op_ranges, the documented
    view of every (op, enclosing range) pair; and a trace without the parts' names gives no rows."""
    tr = _trace(exports, "emit", softmax_ranges=("bwd",), matmul_ranges=("fwd",))
    con = tr.use()
    expected = dict(con.execute(
        "SELECT n.name, count(DISTINCT o.op_id) FROM op_ranges o "
        "JOIN nvtx_ranges n USING (range_id) JOIN gpu_ops g USING (op_id) "
        "WHERE n.name IN ('bwd', 'fwd') AND g.kind = 'kernel' GROUP BY 1").fetchall())
    other_thread = con.execute(
        "SELECT count(DISTINCT o.op_id) FROM op_ranges o JOIN nvtx_ranges n USING (range_id) "
        "JOIN gpu_ops g USING (op_id) WHERE n.name = 'bwd' AND g.kind = 'kernel' "
        "AND g.launch_global_tid <> n.global_tid").fetchall()[0][0]
    assert other_thread > 100  # the case this test is about
    attn = kernels.softmax_vs_matmul(tr)
    assert attn["softmax_kernels"].sum() == expected["bwd"]
    assert attn["matmul_kernels"].sum() == expected["fwd"]
    none = _trace(exports, "emit", softmax_ranges=("no such range",), matmul_ranges=("nor this",))
    assert kernels.softmax_vs_matmul(none).empty


def test_attention_parts_named_by_op_in_emit_nvtx(exports):
    """--softmax-range / --matmul-range name emit_nvtx's per-call ranges by op, as the per-range
    tables group them ('aten::matmul' for 'aten::matmul, seq = 12, op_id = 40'; before, only a
    whole range text matched): as many part ranges as the raw export has texts of those ops in
    the process that launched their kernels, and none with --full-range-names."""
    path = exports / "emit" / "report.sqlite"
    raw = _raw_ranges(path)
    op = raw["name"].str.split(", ").str[0]
    expected = {}
    for part, name in (("softmax", "aten::_log_softmax"), ("matmul", "aten::matmul")):
        mine = raw[(op == name) & raw["name"].str.contains(", seq = ", regex=False)]
        assert len(mine) and mine["pid"].nunique() == 1
        expected[part] = len(mine)
    tr = _trace(exports, "emit", softmax_ranges=("aten::_log_softmax",),
                matmul_ranges=("aten::matmul",))
    attn = kernels.softmax_vs_matmul(tr)
    assert attn["softmax_ranges"].sum() == expected["softmax"] == 4
    assert attn["matmul_ranges"].sum() == expected["matmul"] == 28
    full = _trace(exports, "emit", softmax_ranges=("aten::_log_softmax",),
                  matmul_ranges=("aten::matmul",), full_range_names=True)
    assert kernels.softmax_vs_matmul(full).empty


def test_phase_ranges_named_by_op_in_emit_nvtx(exports):
    """--phase-range names emit_nvtx's per-call ranges by op, as --softmax-range does: under
    emit_nvtx a record_function scope is a range 'Optimizer.step#AdamW.step, op_id = 3290' (and
    a user's record_function('fwd') one 'fwd, op_id = N'), which --phase-range
    optimizer=Optimizer.step#AdamW.step did not mark: no optimizer phase at all. Its instances
    and wall time are those of the raw export's ranges of that op; none with --full-range-names,
    which keeps whole texts."""
    path = exports / "emit" / "report.sqlite"
    raw = _raw_ranges(path)
    mine = raw[raw["name"].str.startswith("Optimizer.step#AdamW.step, op_id = ")]
    assert len(mine) == 4
    names = (("iter", "step"), ("fwd", "forward"), ("bwd", "backward"),
             ("Optimizer.step#AdamW.step", "optimizer"))
    tr = trace.prepare(duckdb.connect(), path, trace.Options(phase_ranges=names))
    timing = kernels.phase_timing(tr).set_index("phase")
    assert timing.loc["optimizer", "instances"] == 4
    assert timing.loc["optimizer", "cpu_mean_ns"] == pytest.approx(
        (mine["end"] - mine["start"]).mean())
    assert timing.loc["optimizer", "kernels_per_instance"] > 0
    full = trace.prepare(duckdb.connect(), path,
                         trace.Options(phase_ranges=names, full_range_names=True))
    assert "optimizer" not in kernels.phase_timing(full)["phase"].tolist()


@pytest.mark.parametrize("suffix", [", seq = 12, op_id = 40", ", op_id = 7",
                                    ", seq = -1, op_id = 3, sizes = [[8, 512], []]",
                                    ", sizes = [[2, 3]], input_op_ids = [(5, 0)]"])
def test_call_suffix_is_cut_whole(suffix):
    con = duckdb.connect()
    cut = con.execute("SELECT regexp_replace(?, ?, '')",
                      ["aten::addmm" + suffix, trace.CALL_SUFFIX]).fetchall()[0][0]
    assert cut == "aten::addmm"
    kept = con.execute("SELECT regexp_replace(?, ?, '')",
                       ["forward, layer 3", trace.CALL_SUFFIX]).fetchall()[0][0]
    assert kept == "forward, layer 3"


def test_process_rule_stays_inside_each_process(exports):
    """Two ranks, each with its own ranges: a GPU op is attributed to ranges of the process that
    launched it only; each rank's backward gets its own kernels (nsys's thread rule: 8 ops)."""
    tr = _trace(exports, "ddp")
    crossed = tr.df(
        "SELECT count(*) AS n FROM op_ranges o JOIN gpu_ops g USING (op_id) "
        "JOIN nvtx_ranges r ON r.range_id = o.range_id "
        "WHERE r.pid <> CAST((g.launch_global_tid >> 24) & 16777215 AS INTEGER)")
    assert crossed["n"].iloc[0] == 0
    per_rank = tr.df("SELECT pid, count(*) AS n FROM kernels WHERE phase = 'backward' "
                     "GROUP BY pid ORDER BY pid")
    assert len(per_rank) == 2 and (per_rank["n"] > 1000).all()
    timing = kernels.phase_timing(tr).set_index("phase")
    assert timing.loc["step", "instances"] == 8  # 4 measured steps on each of two ranks


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def test_communication_overlap_by_interval_arithmetic(exports):
    """Every row of the communication table, recomputed here from the kernels view: per device,
    the compute kernels' intervals merged, each NCCL kernel's intersection with them summed."""
    tr = _trace(exports, "ddp")
    k = tr.df("SELECT device_id, pid, kernel_class, phase, step_range_id IS NOT NULL AS in_step, "
              "start_ns, end_ns FROM kernels")
    table = kernels.communication(tr)
    assert set(table["device_id"]) == {0, 1}
    expected = []
    for device, dk in k.groupby("device_id"):
        islands = _merged(list(zip(dk.loc[dk.kernel_class != "communication", "start_ns"],
                                   dk.loc[dk.kernel_class != "communication", "end_ns"])))
        dk = dk.assign(ov=[
            sum(max(0, min(e, ie) - max(s, is_)) for is_, ie in islands)
            if cls == "communication" else 0
            for s, e, cls in zip(dk.start_ns, dk.end_ns, dk.kernel_class)])
        groups = [(p, dk[dk.phase == p]) for p in dk.phase.dropna().unique()]
        groups += [("step", dk[dk.in_step]), ("all", dk)]
        for phase, g in groups:
            comm = g[g.kernel_class == "communication"]
            compute = g[g.kernel_class != "communication"]
            gemm = compute[compute.kernel_class == "gemm"]
            expected.append({
                "phase": phase, "device_id": device, "comm_kernels": len(comm),
                "comm_ns": int((comm.end_ns - comm.start_ns).sum()),
                "overlapped_ns": int(comm.ov.sum()),
                "compute_ns": int((compute.end_ns - compute.start_ns).sum()),
                "gemm_ns": int((gemm.end_ns - gemm.start_ns).sum())})
    expected = pd.DataFrame(expected).set_index(["phase", "device_id"]).sort_index()
    mine = table.set_index(["phase", "device_id"]).sort_index()
    assert list(mine.index) == list(expected.index)
    for col in ("comm_kernels", "comm_ns", "overlapped_ns", "compute_ns"):
        assert (mine[col] == expected[col]).all(), col
    assert (mine["exposed_ns"] == mine["comm_ns"] - mine["overlapped_ns"]).all()
    assert mine["gemm_of_compute_pct"].tolist() == pytest.approx(
        (100.0 * expected["gemm_ns"] / expected["compute_ns"]).tolist())
    # the all-reduces overlap the backward only in part, on each rank
    bwd = mine.loc["backward"]
    assert (bwd["comm_kernels"] == 16).all() and (bwd["overlapped_ns"] > 0).all()
    assert (bwd["exposed_ns"] > 0).all()
    nccl = _stats("ddp", "cuda_gpu_kern_sum")
    nccl = nccl[nccl["Name"].str.startswith("ncclDevKernel")]
    assert mine.loc["all", "comm_ns"].sum() == nccl["Total Time (ns)"].sum()


def test_cli_on_a_ddp_trace(exports):
    export = exports / "ddp" / "report.sqlite"
    before = sha256(export)
    code, out, err = run("kernels", str(export), *PHASE_ARGS)
    assert code == 0, err
    assert "## communication" in out and "ncclDevKernel_AllReduce" in out
    section = out.split("## communication")[1]
    assert "Exposed (ms)" in section and "GEMM of compute (%)" in section
    for table in ("top kernels", "gemm fraction", "class breakdown"):
        assert "waiting for the other ranks" in out.split(f"## {table}")[1].split("## ")[0]
    code, out, err = run("kernels", str(exports / "emit" / "report.sqlite"), *PHASE_ARGS)
    assert code == 0 and "waiting for the other ranks" not in out, err
    softmax = out.split("## softmax vs matmul")[1].split("## ")[0]  # no such ranges here
    assert "'computing softmax'" in softmax and "--softmax-range and --matmul-range" in softmax
    assert sha256(export) == before


def test_cli_says_why_communication_is_empty(exports):
    code, out, err = run("kernels", str(exports / "emit" / "report.sqlite"), *PHASE_ARGS,
                         "--table", "communication")
    assert code == 0, err
    assert "No communication kernels (NCCL) in this report" in out


def test_cli_full_range_names(exports):
    export = str(exports / "emit" / "report.sqlite")
    grouped = run("kernels", export, "--table", "ranges", "--format", "csv")
    full = run("kernels", export, "--table", "ranges", "--format", "csv", "--full-range-names")
    assert grouped[0] == full[0] == 0
    grouped_rows = pd.read_csv(io.StringIO(grouped[1]))
    full_rows = pd.read_csv(io.StringIO(full[1]))
    assert len(full_rows) == _stats("emit", "nvtx_sum")["Range"].nunique()
    assert len(grouped_rows) < len(full_rows) / 10
    assert not grouped_rows["range"].str.contains(", op_id = ").any()
    assert full_rows["range"].str.contains(", op_id = ").sum() > 10000


def test_phase_tables_say_which_ranges_to_name(exports):
    """Ranges of other code mark no phase by lmprof's names: the phase tables say so and list
    the report's outer ranges to pass to --phase-range; once named, the tables fill."""
    code, out, err = run("kernels", str(exports / "ddp" / "report.sqlite"),
                         "--table", "phase_timing", "--table", "gpu_idle")
    assert code == 0, err
    for section in out.split("## ")[1:]:
        assert "No NVTX range marks a phase" in section and "_no data_" in section
        assert "'iter' (8), 'fwd' (8), 'bwd' (8), 'opt' (8)" in section
        assert "--phase-range PHASE=NAME" in section
    code, out, _ = run("kernels", str(exports / "ddp" / "report.sqlite"), *PHASE_ARGS,
                       "--table", "phase_timing")
    assert code == 0 and "No NVTX range marks a phase" not in out and "| backward" in out


@pytest.mark.parametrize("edit", [
    # the user's ranges in a domain of their own (the nvtx package's @annotate(domain=...))
    "INSERT INTO NVTX_EVENTS (start, eventType, globalTid, text, domainId) SELECT start, 75, "
    "globalTid, 'train', 9 FROM NVTX_EVENTS WHERE eventType = 75 AND text = 'NCCL'; "
    "UPDATE NVTX_EVENTS SET domainId = 9 WHERE text IN ('iter', 'fwd', 'bwd', 'opt')",
    # start/end ranges (torch.cuda.nvtx.range_start / range_end), which have no nesting level
    "UPDATE NVTX_EVENTS SET eventType = 60 WHERE text IN ('iter', 'fwd', 'bwd', 'opt')"])
def test_phase_tables_name_outer_ranges_of_any_domain_and_style(exports, tmp_path, edit):
    """The note of a trace whose ranges mark no phase lists the user's ranges to name also where
    they are in a domain of their own or start/end ranges: it listed none ('... _N suffix). name
    the phases ...'), while --phase-range step=iter marks them (a range's domain does not matter
    to its phase)."""
    path = tmp_path / "ddp.sqlite"
    shutil.copyfile(exports / "ddp" / "report.sqlite", path)
    con = sqlite3.connect(path)
    with con:
        con.executescript(edit)
    con.close()
    code, out, err = run("kernels", str(path), "--table", "phase_timing")
    assert code == 0, err
    assert "No NVTX range marks a phase" in out and "'iter' (8)" in out, out
    assert "(8). Name the phases with --phase-range PHASE=NAME" in out
    # the names looked for, quoted (a trailing space in one could not be seen)
    assert "none is named 'step', 'forward'" in out
    code, out, err = run("kernels", str(path), *PHASE_ARGS, "--table", "phase_timing")
    assert code == 0 and "No NVTX range marks a phase" not in out and "| backward" in out


@pytest.mark.parametrize("given", ["Iter", "iter ", " ITER"])
def test_a_phase_name_that_differs_from_the_ranges_in_case_or_spaces_is_noted(exports, given):
    """A --phase-range name that marks no range while one differs from it only in case or
    spaces: the phase tables say so (the step phase was simply missing, the other phases,
    named right, filled the tables without a word); none when every name matches."""
    path = str(exports / "ddp" / "report.sqlite")
    args = ("--phase-range", f"step={given}", *PHASE_ARGS[2:], "--table", "phase_timing",
            "--table", "process_timing")
    code, out, err = run("kernels", path, *args)
    assert code == 0, err
    assert "| step" not in out and "| forward" in out
    for section in out.split("## ")[1:]:
        assert (f"No range is named {given!r} (a name of the step phase); differing from it "
                "only in case or spaces: 'iter' (8)." in section), out
    code, out, err = run("kernels", path, *PHASE_ARGS, "--table", "phase_timing")
    assert code == 0 and "No range is named" not in out, err


def test_several_reports_keep_the_note_of_the_one_with_rows(exports):
    """A report with NCCL kernels beside one without: the stacked communication table has the
    first one's rows, and its note describes them rather than saying there are none."""
    code, out, err = run("kernels", str(exports / "ddp" / "report.sqlite"),
                         str(exports / "emit" / "report.sqlite"), *PHASE_ARGS,
                         "--table", "communication")
    assert code == 0, err
    section = out.split("## communication")[1].split("## ")[0]
    assert "ncclDevKernel" not in section and "| ddp" in section
    assert "No communication kernels" not in section and "Exposed (ms)" in section
    code, out, err = run("kernels", str(exports / "emit" / "report.sqlite"),
                         str(exports / "ddp" / "report.sqlite"), *PHASE_ARGS,
                         "--table", "communication")
    assert code == 0 and "No communication kernels" not in out.split("## communication")[1]
    tables, notes = kernels.several_reports([_trace(exports, "emit"), _trace(exports, "ddp")],
                                            ("communication",))
    assert not tables["communication"].empty  # the Python API (DataFrames) alike
    assert "No communication kernels" not in notes["communication"]


def test_process_timing_from_the_raw_export(exports):
    """Per rank: instances and mean wall time of each phase range, and how much later than the
    other rank it starts the k-th one — recomputed from the export's NVTX_EVENTS with sqlite3."""
    tr = _trace(exports, "ddp")
    mine = kernels.process_timing(tr).set_index(["phase", "pid"])
    raw = _raw_ranges(exports / "ddp" / "report.sqlite")
    for name, phase in USER_PHASES:
        r = raw[raw["name"] == name].sort_values("start")
        r = r.assign(k=r.groupby("pid").cumcount())
        r = r.assign(lag=r["start"] - r.groupby("k")["start"].transform("min"))
        for pid, g in r.groupby("pid"):
            row = mine.loc[(phase, pid)]
            assert row["instances"] == len(g) == 4
            assert row["cpu_mean_ns"] == pytest.approx((g["end"] - g["start"]).mean())
            assert row["start_lag_mean_ns"] == pytest.approx(g["lag"].mean())
            assert row["start_lag_max_ns"] == g["lag"].max()
            assert row["devices"] == str(pid - min(r["pid"]))  # rank 0 on GPU 0, rank 1 on 1
    assert (mine.loc["backward", "start_lag_mean_ns"] > 0).sum() == 1  # one rank leads
    code, out, err = run("kernels", str(exports / "emit" / "report.sqlite"), *PHASE_ARGS,
                         "--table", "process_timing")
    assert code == 0 and "Phase ranges of one process at most" in out, err


def test_devices_and_processes_in_one_cell_are_in_numeric_order(exports, tmp_path):
    """A copy of the DDP export whose second rank is process 10908 (every thread id of its
    process rewritten) and whose first rank's kernels ran on GPUs 2 and 10, the second's on 2:
    a process's GPUs (process timing) and a GPU's processes (communication) were joined in the
    order of their text, "10, 2" and "10908, 907". By value: "2, 10" and "907, 10908"."""
    path = tmp_path / "report.sqlite"
    shutil.copyfile(exports / "ddp" / "report.sqlite", path)
    con = sqlite3.connect(path)
    first = 907  # (the first rank's process; the second's is 908)
    with con:
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                    ).fetchall():
            for column in [c[1] for c in con.execute(f"PRAGMA table_info({table})")]:
                if column in ("globalTid", "globalPid"):
                    con.execute(f"UPDATE {table} SET {column} = {column} + ((10908 - 908) << 24) "
                                f"WHERE ({column} >> 24) & 16777215 = 908")
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = CASE WHEN "
                    f"(globalPid >> 24) & 16777215 = {first} AND correlationId % 2 = 0 "
                    "THEN 10 ELSE 2 END")
        for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            con.execute(f"UPDATE {table} SET deviceId = 2")
    con.close()
    code, out, err = run("kernels", str(path), *PHASE_ARGS, "--table", "process_timing",
                         "--table", "communication", "--format", "json")
    assert code == 0, err
    tables = json.loads(out)
    devices = {(r["phase"], r["pid"]): r["devices"] for r in tables["process_timing"]}
    assert devices[("step", first)] == "2, 10" and devices[("step", 10908)] == "2"
    pids = {(r["phase"], r["device_id"]): r["pids"] for r in tables["communication"]}
    assert pids[("all", 2)] == "907, 10908" and pids[("all", 10)] == "907"


def test_rank_tables_left_out_of_a_one_gpu_default_output(exports, tmp_path):
    """The default output of a one-process, one-GPU trace has no empty process-timing and
    communication sections (nor files); a DDP trace has both; asked for by name, an empty one
    is printed with its note."""
    emit_export, ddp_export = (str(exports / n / "report.sqlite") for n in ("emit", "ddp"))
    code, out, err = run("kernels", emit_export, *PHASE_ARGS, "--format", "csv",
                         "--out", str(tmp_path / "one"))
    assert code == 0, err
    written = {p.stem for p in (tmp_path / "one").iterdir()}
    assert "phase_timing" in written and not written & {"process_timing", "communication"}
    code, out, err = run("kernels", ddp_export, *PHASE_ARGS)
    assert code == 0 and "## process timing" in out and "## communication" in out, err
    code, out, err = run("kernels", emit_export, *PHASE_ARGS)
    assert code == 0 and "## process timing" not in out and "## communication" not in out
    code, out, err = run("kernels", emit_export, ddp_export, *PHASE_ARGS)
    assert code == 0 and "## process timing" in out and "## communication" in out


def _raw_ranges(path: Path) -> pd.DataFrame:
    import sqlite3

    con = sqlite3.connect(path)
    try:
        return pd.read_sql("SELECT coalesce(e.text, s.value) AS name, e.start, e.\"end\", "
                           "(e.globalTid >> 24) & 16777215 AS pid FROM NVTX_EVENTS e "
                           "LEFT JOIN StringIds s ON s.id = e.textId "
                           "WHERE e.\"end\" IS NOT NULL", con)
    finally:
        con.close()


@pytest.mark.parametrize("name,skip", [("plain", 1), ("plain", 2), ("ddp", 1)])
def test_skip_steps(exports, name, skip):
    """--skip-steps N: each process's first N steps and the phases inside them mark no phase;
    the phase timing is that of the remaining steps (wall times from the raw export), a phase's
    kernels are those it had without skipping less the skipped steps' ones, and the whole-report
    totals do not move."""
    every = _trace(exports, name)
    skipped = _trace(exports, name, skip_steps=skip)
    raw = _raw_ranges(exports / name / "report.sqlite")
    timing = kernels.phase_timing(skipped).set_index("phase")
    for range_name, phase in USER_PHASES:
        r = raw[raw["name"] == range_name].sort_values("start")
        kept = r[r.groupby("pid").cumcount() >= skip]
        assert timing.loc[phase, "instances"] == len(kept)
        wall = (kept["end"] - kept["start"]).mean()
        assert timing.loc[phase, "cpu_mean_ns"] == pytest.approx(wall)
    first = every.df("SELECT range_id FROM (SELECT range_id, row_number() OVER (PARTITION BY pid "
                     "ORDER BY start_ns) AS k FROM nvtx_ranges WHERE phase = 'step') "
                     f"WHERE k <= {skip}")["range_id"].tolist()
    before = every.df("SELECT phase, step_range_id, count(*) AS n FROM kernels GROUP BY ALL")
    expected = before[~before["step_range_id"].isin(first)].groupby("phase")["n"].sum()
    after = skipped.df("SELECT phase, count(*) AS n FROM kernels WHERE phase IS NOT NULL "
                       "GROUP BY phase").set_index("phase")["n"]
    assert after.sort_index().to_dict() == expected.sort_index().to_dict()
    gemm_all = [kernels.gemm_fraction(t).set_index("phase").loc["all"] for t in (every, skipped)]
    assert gemm_all[0].equals(gemm_all[1])
    # the skipped steps' kernels are a '(none)' row, so that the phases and it add up to 'all'
    # (the row was missing: 598 of plain's 1,490 kernels in no row)
    gemm = kernels.gemm_fraction(skipped).set_index("phase")
    unphased = skipped.df("SELECT count(*) AS n, sum(dur_ns) AS t FROM kernels "
                          "WHERE phase IS NULL").iloc[0]
    assert unphased["n"] > 0 and gemm.loc["(none)", "kernels"] == unphased["n"]
    assert gemm.loc["(none)", "kernel_ns"] == unphased["t"]
    phases = gemm.drop(index=["step", "all"])
    assert phases["kernels"].sum() == gemm.loc["all", "kernels"]
    assert phases["kernel_ns"].sum() == gemm.loc["all", "kernel_ns"]
    before = kernels.gemm_fraction(every).set_index("phase")["kernels"].get("(none)", 0)
    assert before < gemm.loc["(none)", "kernels"]
    if name == "plain":  # the skipped first step held the warm-up: cuBLAS set-up, AdamW's state
        assert timing.loc["step", "cpu_mean_ns"] < 0.2 * kernels.phase_timing(every).set_index(
            "phase").loc["step", "cpu_mean_ns"]


def test_communication_of_skipped_steps_is_a_none_row(exports):
    """--skip-steps: the skipped steps' communication is a '(none)' row per device, as in the
    other per-phase tables, so that the phases and it add up to 'all' per device (kernels, time,
    overlap, compute); the row was missing, a quarter of the DDP trace's all-reduces in no row."""
    comm = kernels.communication(_trace(exports, "ddp", skip_steps=1))
    assert set(comm.loc[comm["phase"] == "(none)", "device_id"]) == {0, 1}
    for device, rows in comm.groupby("device_id"):
        rows = rows.set_index("phase")
        parts = rows.drop(index=["step", "all"])
        for col in ("comm_kernels", "comm_ns", "overlapped_ns", "compute_ns"):
            assert parts[col].sum() == rows.loc["all", col], (device, col)
        assert rows.loc["(none)", "comm_kernels"] == 5  # one step: 4 all-reduces, a broadcast
    every = kernels.communication(_trace(exports, "ddp"))
    assert "(none)" not in every["phase"].tolist()  # every kernel of it is in a phase


def test_skip_steps_cli(exports):
    plain = str(exports / "plain" / "report.sqlite")
    code, out, err = run("kernels", plain, *PHASE_ARGS, "--skip-steps", "1",
                         "--table", "phase_timing")
    assert code == 0 and "first 1 step(s) left out (--skip-steps)" in out, err
    code, out, err = run("kernels", plain, *PHASE_ARGS, "--skip-steps", "3",
                         "--table", "phase_timing")
    assert code == 0 and "--skip-steps 3 left no phase" in out and "_no data_" in out
    code, out, err = run("kernels", plain, "--skip-steps", "1")  # no range named step
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--phase-range step=NAME" in err
    code, _, err = run("kernels", plain, "--skip-steps", "-1")
    assert code == 2 and "Traceback" not in err
    code, out, err = run("sql", plain, *PHASE_ARGS, "--skip-steps", "1", "--format", "csv",
                         "SELECT count(*) AS n FROM phase_instances WHERE phase = 'step'")
    assert code == 0 and out.split() == ["n", "2"], err  # of 3 steps


def test_skip_steps_without_steps_names_the_step_ranges_looked_for(exports):
    """--skip-steps where no range marks the step phase names the step range names it looked
    for: with --phase-range step=ITER (the trace's are 'iter') it said that none is named
    'step', a name the user had replaced."""
    code, out, err = run("kernels", str(exports / "ddp" / "report.sqlite"),
                         "--phase-range", "step=ITER", "--skip-steps", "1")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (out, err)
    assert "'ITER'" in err and "'step'" not in err


def test_skip_steps_refuses_a_process_whose_steps_are_not_marked(exports, tmp_path):
    """--skip-steps in a trace of several processes, one of which marks phases but no step (its
    'iter' ranges gone, as where a rank's code opens the step range on another condition):
    that process's first steps cannot be told, so it is refused in one line naming it. Its
    warm-up forward counted as a measured one before (4 instances of forward against the other
    rank's 3, and the k-th instances of the ranks paired a step apart: start lags of 22 ms)."""
    path = tmp_path / "ddp.sqlite"
    shutil.copyfile(exports / "ddp" / "report.sqlite", path)
    con = sqlite3.connect(path)
    with con:
        gone = con.execute("DELETE FROM NVTX_EVENTS WHERE text = 'iter' "
                           "AND (globalTid >> 24) & 16777215 = 908").rowcount
    con.close()
    assert gone == 4
    code, out, err = run("kernels", str(path), *PHASE_ARGS, "--skip-steps", "1",
                         "--table", "process_timing")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (out, err)
    assert "908" in err and "'iter'" in err and "907" not in err
    code, out, err = run("kernels", str(path), *PHASE_ARGS, "--table", "process_timing")
    assert code == 0, err  # without --skip-steps nothing is asked of the step ranges


def test_a_phase_range_on_another_thread_inside_one_of_its_phase_is_part_of_it(exports,
                                                                                tmp_path):
    """Under the process rule, a 'bwd' range that the autograd thread opens inside the main
    thread's 'bwd' (a backward hook's range around the all-reduces) is part of that instance, as
    one nested on the main thread is: the backward counted 8 instances per rank, the kernel mean
    halved (907: 8.628 ms against 17.255) and the busy time split. Under the thread rule the
    autograd thread's range is its ops' only phase range, an instance of its own."""
    path = tmp_path / "ddp.sqlite"
    shutil.copyfile(exports / "ddp" / "report.sqlite", path)
    con = sqlite3.connect(path)
    with con:  # per backward and autograd thread, a 'bwd' range around its NCCL ranges
        added = con.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, text, domainId) "
            "SELECT min(n.start) - 1000, max(n.end) + 1000, 59, n.globalTid, 'bwd', 0 "
            "FROM NVTX_EVENTS n JOIN NVTX_EVENTS b ON b.text = 'bwd' "
            "AND b.globalTid >> 24 = n.globalTid >> 24 AND n.start BETWEEN b.start AND b.end "
            "WHERE n.domainId = 1 AND n.globalTid <> b.globalTid "
            "GROUP BY b.start, n.globalTid").rowcount
    con.close()
    assert added == 8
    original = kernels.process_timing(_trace(exports, "ddp")).set_index(["phase", "pid"])
    edited = kernels.process_timing(
        trace.prepare(duckdb.connect(), path, trace.Options(phase_ranges=USER_PHASES))
    ).set_index(["phase", "pid"])
    cols = ["instances", "cpu_mean_ns", "gpu_kernel_mean_ns", "gpu_busy_pct"]
    pd.testing.assert_frame_equal(edited[cols], original[cols])
    threads = kernels.process_timing(
        trace.prepare(duckdb.connect(), path,
                      trace.Options(phase_ranges=USER_PHASES, attribution="thread"))
    ).set_index(["phase", "pid"])
    assert (threads.loc["backward", "instances"] == 8).all()


@pytest.mark.parametrize("seed", range(5))
def test_communication_overlap_random_intervals(seed):
    """communication.sql on random kernels of two devices and three streams each: compute
    kernels that overlap, nest, touch and repeat, communication before, inside and after them;
    every row equal to brute-force interval arithmetic."""
    import random

    from lmprof.analyze import sqlfile

    rnd = random.Random(seed)
    rows, op = [], 0
    for device in (0, 1):
        for _ in range(rnd.randint(20, 60)):
            start = rnd.randint(0, 1000)
            end = start + rnd.choice([0, 1, rnd.randint(1, 50), rnd.randint(50, 300)])
            is_comm = rnd.random() < 0.25
            phase = rnd.choice(["forward", "backward", "optimizer", None])
            cls = "communication" if is_comm else rnd.choice(["gemm", "elementwise"])
            rows.append((op, device, start, end, phase, rnd.random() < 0.7, cls, 100 + device))
            op += 1
    con = duckdb.connect()
    con.execute("CREATE TABLE kernel_names (name_id BIGINT, kernel_class VARCHAR)")
    con.execute("INSERT INTO kernel_names VALUES (0, 'communication'), (1, 'gemm'), "
                "(2, 'elementwise')")
    ids = {"communication": 0, "gemm": 1, "elementwise": 2}
    con.execute("CREATE TABLE gpu_ops (op_id BIGINT, device_id INTEGER, start_ns BIGINT, "
                "end_ns BIGINT, phase VARCHAR, step_range_id BIGINT, name_id BIGINT, "
                "kind VARCHAR, launch_global_tid BIGINT)")
    con.executemany("INSERT INTO gpu_ops VALUES (?, ?, ?, ?, ?, ?, ?, 'kernel', ?)",
                    [(o, d, s, e, ph, 1 if st else None, ids[c], pid << 24)
                     for o, d, s, e, ph, st, c, pid in rows])
    mine = sqlfile.execute(con, "communication", has_comm=True).df()
    mine = mine.set_index(["phase", "device_id"])
    for device in (0, 1):
        dev = [r for r in rows if r[1] == device]
        islands = _merged([(s, e) for _, _, s, e, _, _, c, _ in dev if c != "communication"])
        overlap = {o: sum(max(0, min(e, ie) - max(s, is_)) for is_, ie in islands)
                   for o, _, s, e, _, _, c, _ in dev if c == "communication"}
        groups = {p: [r for r in dev if r[4] == p] for p in {r[4] for r in dev} if p}
        groups["step"] = [r for r in dev if r[5]]
        groups["all"] = dev
        for phase, g in groups.items():
            comm = [r for r in g if r[6] == "communication"]
            if not g or (phase, device) not in mine.index:
                assert not g, (phase, device)
                continue
            row = mine.loc[(phase, device)]
            assert row["comm_kernels"] == len(comm)
            assert row["comm_ns"] == sum(r[3] - r[2] for r in comm)
            assert row["overlapped_ns"] == sum(overlap[r[0]] for r in comm), (seed, phase, device)
            assert row["compute_ns"] == sum(r[3] - r[2] for r in g if r[6] != "communication")


def test_cuda_graph_kernels_belong_to_the_range_that_launched_the_graph(exports):
    """Traced node by node, a graph's kernels join the cudaGraphLaunch call that launched them
    (many kernels, one correlation id): every kernel of the replayed step is in its 'iter'."""
    tr = _trace(exports, "graphnode")
    gemm = kernels.gemm_fraction(tr).set_index("phase")
    assert gemm.loc["step", "kernels"] == gemm.loc["all", "kernels"] > 2000
    apis = tr.df("SELECT DISTINCT launch_api FROM kernels")["launch_api"].tolist()
    assert apis == ["cudaGraphLaunch_v10000"]
    code, out, err = run("kernels", str(exports / "graphnode" / "report.sqlite"), *PHASE_ARGS,
                         "--table", "phase_timing")
    assert code == 0 and "CUDA graph launch" not in out, err


def test_graphs_traced_whole_are_said_to_be_missing(exports):
    """nsys's default traces a graph launch as one block: no kernel table at all. Every table
    says how much GPU time the graph launches took and how to profile their kernels."""
    import sqlite3

    export = exports / "graph" / "report.sqlite"
    con = sqlite3.connect(export)
    n, ns = con.execute("SELECT count(*), sum(\"end\" - start) FROM "
                        "CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchone()
    con.close()
    code, out, err = run("kernels", str(export), *PHASE_ARGS)
    assert code == 0, err
    sections = out.split("## ")[1:]
    assert len(sections) >= 6
    for section in sections:
        assert f"{n} CUDA graph launch(es) ran {ns / 1e6:.3f} ms of GPU work" in section
        assert "--cuda-graph-trace=node" in section
    # each graph launch is one GPU op of its step: the span is the graph's, busy all of it
    tr = _trace(exports, "graph")
    timing = kernels.phase_timing(tr).set_index("phase")
    assert timing.loc["step", "kernels_per_instance"] == 0 and n == 4
    assert timing.loc["step", "gpu_span_mean_ns"] * 4 == ns
    assert timing.loc["step", "gpu_busy_pct"] == 100.0
    ops = tr.df("SELECT CAST(kind AS VARCHAR) AS kind, count(*) AS n FROM gpu_ops GROUP BY 1")
    assert ops.values.tolist() == [["graph", 4]]
    assert kernels.range_summary(tr).set_index("range").loc[":iter", "gpu_ops"] == 4


@pytest.mark.parametrize("name", ["graph", "graphnode"])
def test_a_graph_launch_is_one_launch_however_many_kernels_it_ran(exports, name):
    """The launch rate counts CUDA calls: a cudaGraphLaunch is one, whether nsys traced the
    graph as one op or node by node (605 kernels a launch here), not one per kernel."""
    import sqlite3

    con = sqlite3.connect(exports / name / "report.sqlite")
    iters = con.execute("SELECT n.start, n.\"end\" FROM NVTX_EVENTS n "
                        "LEFT JOIN StringIds s ON s.id = n.textId "
                        "WHERE coalesce(n.text, s.value) = 'iter'").fetchall()
    calls = con.execute("SELECT r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                        "JOIN StringIds s ON s.id = r.nameId "
                        "WHERE s.value LIKE 'cudaGraphLaunch%'").fetchall()
    con.close()
    inside = sum(any(a <= t < b for a, b in iters) for (t,) in calls)
    assert inside == len(iters) == 4
    timing = kernels.phase_timing(_trace(exports, name)).set_index("phase")
    wall_s = sum(b - a for a, b in iters) / 1e9
    assert timing.loc["step", "launches_per_s"] == pytest.approx(inside / wall_s, rel=1e-12)
    assert timing.loc["step", "kernels_per_instance"] == (605 if name == "graphnode" else 0)


def test_names_quoted_in_notes_are_text_not_html(exports, tmp_path):
    """A range name the user gave (--softmax-range '<b>x') is quoted in a markdown note as
    written: it went in raw, so a renderer read '<b>' as HTML and dropped it."""
    code, out, err = run("kernels", str(exports / "plain" / "report.sqlite"),
                         "--softmax-range", "<b>x", "--phase-range", "forward=<i>f",
                         "--table", "softmax_vs_matmul", "--table", "phase_timing")
    assert code == 0, err
    notes = [p for p in out.split("\n\n") if not p.startswith(("#", "|"))]
    assert any("'\\<b>x'" in n for n in notes) and any("'\\<i>f'" in n for n in notes), notes
    assert "<b>" not in out.replace("\\<b>", "") and "<i>" not in out.replace("\\<i>", "")
    # the report's GPU kernels section quotes them alike
    code, _, err = run("report", str(exports / "plain" / "report.sqlite"), "--softmax-range",
                       "<b>x", "-o", str(tmp_path / "r"))
    assert code == 0, err
    text = (tmp_path / "r" / "report.md").read_text()
    assert "'\\<b>x'" in text and "<b>" not in text.replace("\\<b>", "")


def test_several_reports_keep_what_each_ones_note_says_about_it(exports):
    """Several reports stacked: a stacked table's note was one report's whole (the last with
    rows), so what another report's note said about that report was lost, in any order: a
    trace of CUDA graphs traced whole beside one of kernels had no word that its graphs' kernels
    are missing (its step showed 0 ms of kernels), and a DDP trace beside a one-GPU one none
    that its NCCL kernels count their waiting. Each such word stays, after the run it is about."""
    con = sqlite3.connect(exports / "graph" / "report.sqlite")
    n, ns = con.execute("SELECT count(*), sum(\"end\" - start) FROM "
                        "CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchone()
    con.close()
    graphs = f"{n} CUDA graph launch(es) ran {ns / 1e6:.3f} ms of GPU work"
    nccl = "Communication (NCCL) kernels count their whole duration"
    for first, second, said, tables in (
            ("graph", "graphnode", graphs, ("phase_timing", "top_kernels", "gpu_idle")),
            ("graphnode", "graph", graphs, ("phase_timing", "top_kernels", "gpu_idle")),
            ("ddp", "plain", nccl, ("top_kernels", "class_breakdown", "gemm_fraction")),
            ("plain", "ddp", nccl, ("top_kernels", "class_breakdown", "gemm_fraction"))):
        args = [str(exports / name / "report.sqlite") for name in (first, second)]
        code, out, err = run("kernels", *args, *PHASE_ARGS,
                             *[a for t in tables for a in ("--table", t)])
        assert code == 0, err
        about = "graph" if said == graphs else "ddp"
        for table in tables:
            section = out.split(f"## {table.replace('_', ' ')}\n")[1].split("\n|")[0]
            assert said in section and f"{about}: " in section, (first, second, table, section)
            other = "graphnode" if about == "graph" else "plain"
            assert f"{other}: " not in section, section  # (said of the run it is about only)
