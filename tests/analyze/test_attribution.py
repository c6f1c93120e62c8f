"""Attribution of GPU work to NVTX ranges, checked against nsys's own reports on the fixture."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from lmprof.analyze import kernels, trace
from nsys_data import REPORT, process_trace, stats, thread_trace  # noqa: F401 (fixtures)


def test_thread_rule_reproduces_nvtx_kern_sum(thread_trace):
    theirs = stats("nvtx_kern_sum")
    mine = kernels.range_kernels(thread_trace)
    key = ["NVTX Range", "Style", "PID", "TID", "Kernel Name"]
    mine = mine.rename(columns={"range": "NVTX Range", "style": "Style", "pid": "PID",
                                "tid": "TID", "name": "Kernel Name"})
    merged = theirs.merge(mine, on=key, how="outer", indicator=True)
    assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"][key]
    assert len(merged) == len(theirs)
    assert (merged["Kern Inst"] == merged["instances"]).all()
    assert (merged["Total Time (ns)"] == merged["total_ns"]).all()
    assert (merged["NVTX Inst"] == merged["range_instances"]).all()
    assert (merged["Min (ns)"] == merged["min_ns"]).all()
    assert (merged["Max (ns)"] == merged["max_ns"]).all()
    np.testing.assert_allclose(merged["Avg (ns)"], merged["avg_ns"], atol=0.051)
    np.testing.assert_allclose(merged["Med (ns)"], merged["med_ns"], atol=0.051)
    np.testing.assert_allclose(merged["StdDev (ns)"], merged["std_ns"], atol=0.051)


def test_thread_rule_reproduces_nvtx_gpu_proj_sum_op_counts(thread_trace):
    theirs = stats("nvtx_gpu_proj_sum").set_index("Range")
    mine = kernels.range_summary(thread_trace).set_index("range")
    assert set(theirs.index) == set(mine.index)
    for rng, row in theirs.iterrows():
        assert mine.loc[rng, "gpu_ops"] == row["Total GPU Ops"], rng
        assert mine.loc[rng, "instances"] == row["Range Instances"], rng
        assert mine.loc[rng, "cpu_total_ns"] == row["Total Range Time (ns)"], rng
        assert mine.loc[rng, "avg_level"] == pytest.approx(row["Avg Range Lvl"], abs=0.051), rng


def test_range_nesting_matches_nsys_children(thread_trace):
    theirs = stats("nvtx_gpu_proj_sum").set_index("Range")["Avg Num Child"]
    children = thread_trace.df(
        "SELECT ':' || p.name AS range, count(c.range_id) / count(DISTINCT p.range_id) AS n "
        "FROM nvtx_ranges p LEFT JOIN nvtx_ranges c ON c.parent_id = p.range_id GROUP BY 1"
    ).set_index("range")["n"]
    for rng, n in theirs.items():
        assert children[rng] == pytest.approx(n, abs=0.051), rng


def test_wall_times_match_nvtx_sum(process_trace):
    theirs = stats("nvtx_sum").set_index("Range")
    mine = kernels.range_summary(process_trace).set_index("range")
    for rng, row in theirs.iterrows():
        assert mine.loc[rng, "cpu_total_ns"] == row["Total Time (ns)"], rng
        assert mine.loc[rng, "instances"] == row["Instances"], rng


def test_process_rule_credits_backward_with_autograd_kernels(process_trace, thread_trace):
    nsys_backward_ops = stats("nvtx_gpu_proj_sum").set_index("Range").loc[":backward",
                                                                          "Total GPU Ops"]
    by_thread = kernels.range_summary(thread_trace).set_index("range").loc[":backward"]
    by_process = kernels.range_summary(process_trace).set_index("range").loc[":backward"]
    assert by_thread["gpu_ops"] == nsys_backward_ops
    # the autograd thread's kernels (those nsys leaves under no range) now land in backward
    unattributed = stats("nvtx_kern_sum")
    autograd = unattributed[unattributed["NVTX Range"] == ""]["Kern Inst"].sum()
    assert by_process["kernels"] >= autograd > 1000
    # every kernel of the fixture was launched inside some phase
    phases = process_trace.df("SELECT count(*) FILTER (WHERE phase IS NULL) AS n, count(*) AS k "
                              "FROM kernels")
    assert phases["n"][0] == 0 and phases["k"][0] > 0


def test_each_kernel_has_innermost_range_and_phase(process_trace):
    df = process_trace.df(
        "SELECT k.range_name, k.phase, k.range_id, count(*) AS n FROM kernels k GROUP BY ALL")
    assert set(df["phase"]) == {"forward", "backward", "optimizer", "inference"}
    # a kernel under 'computing softmax' has that as its innermost range, in forward/inference
    soft = df[df["range_name"] == "computing softmax"]
    assert set(soft["phase"]) == {"forward", "inference"}
    # innermost: no attributed range of the op starts later than the chosen one
    later = process_trace.df(
        "SELECT count(*) AS n FROM gpu_ops g JOIN op_ranges o USING (op_id) "
        "JOIN nvtx_ranges r ON r.range_id = o.range_id JOIN nvtx_ranges i "
        "ON i.range_id = g.range_id WHERE r.start_ns > i.start_ns")
    assert later["n"][0] == 0


def test_phase_names_are_configurable_and_bound(tmp_path):
    weird = "it's \"x\"; DROP TABLE gpu_ops; --"
    opts = trace.Options(phase_ranges=(("ffn", "forward"), (weird, "backward")))
    tr = trace.prepare(duckdb.connect(), REPORT, opts)
    timing = kernels.phase_timing(tr).set_index("phase")
    theirs = stats("nvtx_sum").set_index("Range").loc[":ffn"]
    assert timing.loc["forward", "instances"] == theirs["Instances"]
    assert "backward" not in timing.index
    assert tr.count("gpu_ops") > 0


def test_suffixed_phase_names_are_recognised(process_trace):
    timing = kernels.phase_timing(process_trace).set_index("phase")
    ranges = stats("nvtx_sum")
    steps = ranges[ranges["Range"].str.match(r"^:step_\d+$")]["Instances"].sum()
    infer = ranges[ranges["Range"].str.match(r"^:inference_\d+$")]["Instances"].sum()
    assert timing.loc["step", "instances"] == steps
    assert timing.loc["inference", "instances"] == infer
    assert (timing["cpu_mean_ns"] > 0).all()


def test_unknown_attribution_is_a_user_error():
    from lmprof.errors import UserError

    with pytest.raises(UserError):
        trace.Options(attribution="stream")


def _brute_force_attribution(ranges, ops, thread_rule):
    """(op, range) pairs by plain containment, and per op (innermost, phase, step) range ids."""
    pairs, attrib = set(), {}
    for op_id, t, tid in ops:
        inside = [r for r in ranges if t is not None and r["start_ns"] <= t < r["end_ns"]
                  and (r["global_tid"] == tid if thread_rule
                       else r["global_tid"] >> 24 == tid >> 24)]
        pairs |= {(op_id, r["range_id"]) for r in inside}
        ids = [r["range_id"] for r in inside]
        phase = [r["range_id"] for r in inside if r["phase"] not in (None, "step")]
        step = [r["range_id"] for r in inside if r["phase"] == "step"]
        attrib[op_id] = (max(ids, default=None), max(phase, default=None),
                         max(step, default=None))
    return pairs, attrib


@pytest.mark.parametrize("shape", ["mixed", "push_pop", "one_thread_each"])
@pytest.mark.parametrize("max_bucket_rows", [64, 0], ids=["buckets", "asof"])
@pytest.mark.parametrize("seed", range(12))
def test_attribution_matches_containment_on_random_nesting(seed, max_bucket_rows, shape):
    """The ASOF/ancestor-chain attribution equals plain interval containment: several threads and
    processes, ranges pushed or popped at the same instant, zero-length and unterminated ranges,
    start/end ranges, launches on threads without ranges or not traced. Both ways of finding an
    op's state: time buckets, and the ASOF join that crowded keys fall back to (every key is
    crowded at max_bucket_rows=0, with buckets built and dropped or, for the per-thread way with
    fewer GPU ops than states, none built). Both ways of attributing where every op has one member at
    most (push/pop ranges only, on one thread per key: 'push_pop' under the thread rule,
    'one_thread_each' under both): a timeline per attribution key, and the general one, a
    timeline per thread and each op's members."""
    import random

    from lmprof.analyze import sqlfile, trace

    rng = random.Random(seed)
    tids = [(7 << 24) + 1, (7 << 24) + 2, (9 << 24) + 3]
    if shape == "one_thread_each":
        tids = [(7 << 24) + 1, (8 << 24) + 2, (9 << 24) + 3]
    names = ["step", "forward", "backward", "optimizer", "a", "b"]
    events = []
    for tid in tids:
        t, stack = rng.randint(0, 5), []
        for _ in range(rng.randint(0, 40)):
            if rng.random() < 0.5 or not stack:
                stack.append((t, rng.choice(names)))
            else:
                start, name = stack.pop()
                events.append((59, start, t, tid, name))
            t += rng.choice([0, 0, 1, 2, 5])
        while stack and rng.random() < 0.7:
            start, name = stack.pop()
            events.append((59, start, t, tid, name))
            t += rng.choice([0, 1])
        events += [(59, start, None, tid, name) for start, name in stack]
        for _ in range(rng.randint(0, 4) if shape == "mixed" else 0):
            a = rng.randint(0, 60)
            events.append((60, a, a + rng.randint(0, 20), tid, rng.choice(names)))
    # each op: (kind, launch time or None = launch not traced, launching thread)
    launches = [(rng.choice(["kernel", "memcpy", "memset", "graph"]),
                 rng.choice([None, *range(70), 199, 200, 250]),
                 rng.choice([*tids, (9 << 24) + 4])) for _ in range(200)]

    con = duckdb.connect()
    con.execute("CREATE TABLE session AS SELECT 59 AS nvtx_push_pop_type, "
                "60 AS nvtx_start_end_type, 75 AS nvtx_domain_create_type, 200 AS trace_end_ns")
    con.execute("CREATE TABLE _nvtx_events (event_type INTEGER, start_ns BIGINT, end_ns BIGINT, "
                "global_tid BIGINT, text VARCHAR, text_id BIGINT, domain_id BIGINT)")
    if events:
        con.executemany("INSERT INTO _nvtx_events VALUES (?, ?, ?, ?, ?, NULL, 0)", events)
    con.execute("CREATE TABLE _strings (id BIGINT, value VARCHAR)")
    con.execute("CREATE TABLE _phase_names (range_name VARCHAR, phase VARCHAR)")
    con.executemany("INSERT INTO _phase_names VALUES (?, ?)",
                    [(p, p) for p in ("step", "forward", "backward", "optimizer")])
    sqlfile.run(con, "ranges", key_shift=0, call_suffix=None)
    ranges = con.execute("SELECT * FROM nvtx_ranges").df().replace({np.nan: None})
    ranges = ranges.to_dict("records")
    assert all(r["level"] is None and r["parent_id"] is None
               for r in ranges if r["style"] == "StartEnd")
    # range ids number the ranges by start, then thread, the longer first (ties of all three
    # may take either id); a push/pop range's level counts the ranges of its thread open at its
    # push (at one instant, a range of positive length that ends there has closed; one of zero
    # length opens and closes in its turn), its parent is the innermost of them
    by_id = sorted(ranges, key=lambda r: r["range_id"])
    assert [r["range_id"] for r in by_id] == list(range(len(ranges)))
    assert [(r["start_ns"], r["global_tid"], -r["end_ns"]) for r in by_id] == \
        sorted((r["start_ns"], r["global_tid"], -r["end_ns"]) for r in ranges)
    for r in by_id:
        if r["style"] == "PushPop":
            open_ = [q["range_id"] for q in by_id[:r["range_id"]] if q["style"] == "PushPop"
                     and q["global_tid"] == r["global_tid"] and q["end_ns"] > r["start_ns"]]
            assert (r["level"], r["parent_id"]) == (len(open_), max(open_, default=None)), r
    # GPU ops and their launching calls, as nsys.load leaves them: op ids number kernels, then
    # memcpy, then memset, then graphs traced whole, each by export row (1..n here); a call
    # matches by (process, correlation id)
    con.execute("CREATE TABLE _kernels (start_ns BIGINT, end_ns BIGINT, device_stream BIGINT, "
                "correlation_id BIGINT, global_pid BIGINT, name_id BIGINT, export_row BIGINT)")
    for table in ("_memcpy", "_memset", "_graph_execs"):
        con.execute(f"CREATE TABLE {table} (start_ns BIGINT, end_ns BIGINT, device_id INTEGER, "
                    "stream_id INTEGER, correlation_id BIGINT, global_pid BIGINT, "
                    "export_row BIGINT)")
    con.execute("CREATE TABLE _runtime (start_ns BIGINT, global_tid BIGINT, "
                "correlation_id BIGINT, name_id BIGINT)")
    ops, by_kind = [], {"kernel": [], "memcpy": [], "memset": [], "graph": []}
    for corr, (kind, t, tid) in enumerate(launches):
        by_kind[kind].append((corr, (tid >> 24) << 24))
        if t is not None:
            con.execute("INSERT INTO _runtime VALUES (?, ?, ?, 0)", [t, tid, corr])
    for kind, table in (("kernel", "_kernels"), ("memcpy", "_memcpy"), ("memset", "_memset"),
                        ("graph", "_graph_execs")):
        for row, (corr, pid) in enumerate(by_kind[kind], 1):
            ops.append((len(ops), launches[corr][1], launches[corr][2]))
            values = "0, 1, 0, ?, ?, 1, ?" if kind == "kernel" else "0, 1, 0, 0, ?, ?, ?"
            con.execute(f"INSERT INTO {table} VALUES ({values})", [corr, pid, row])
    for thread_rule in (False, True):
        positive = [r for r in ranges if r["end_ns"] > r["start_ns"]]
        keys = {}
        for r in positive:
            keys.setdefault(r["global_tid"] >> (0 if thread_rule else 24), set()).add(
                r["global_tid"])
        one_member = all(r["style"] == "PushPop" for r in positive) and \
            all(len(t) == 1 for t in keys.values())
        if shape == "one_thread_each" or (shape == "push_pop" and thread_rule):
            assert one_member
        for force in ((None, False) if one_member else (None,)):
            # every key crowded: its buckets built, then dropped (even seeds), or none built
            # because the export has fewer GPU ops than states (odd seeds: the per-thread way)
            few_ops = 0 if max_bucket_rows == 0 and seed % 2 else None
            by_key = trace.timeline(con, thread_rule, max_bucket_rows, one_member=force,
                                    gpu_ops=few_ops)
            assert by_key == (one_member and force is None)
            crowded = con.execute("SELECT bool_and(crowded) FROM _attr_grid").fetchone()[0]
            assert crowded is None or crowded == (max_bucket_rows == 0)
            if few_ops == 0 and not by_key:
                assert con.execute("SELECT count(*) FROM _attr_buckets").fetchone()[0] == 0
            trace.attribute(con, thread_rule, by_key)
            pairs, attrib = _brute_force_attribution(ranges, ops, thread_rule)
            got_pairs = con.execute("SELECT op_id, range_id FROM op_ranges").fetchall()
            assert len(got_pairs) == len(set(got_pairs))
            assert set(got_pairs) == pairs
            # the same with the chain's rows kept in a table (Trace.chain); the next round's
            # attribution.sql puts the view back
            sqlfile.run(con, "range_chain_rows")
            assert sorted(con.execute("SELECT op_id, range_id FROM op_ranges").fetchall()) == \
                sorted(got_pairs)
            got = {op: (r, p, s) for op, r, p, s in con.execute(
                "SELECT op_id, range_id, phase_range_id, step_range_id FROM gpu_ops").fetchall()}
            assert got == attrib


def test_text_from_users_goes_in_as_data_not_sql():
    """insert_rows: hostile text, NULL and NaN arrive unchanged; bad identifiers are refused."""
    import math

    from lmprof.analyze import sqlfile

    con = duckdb.connect()
    con.execute("CREATE TABLE t (name VARCHAR, x DOUBLE, n BIGINT)")
    hostile = ["it's \"x\"; DROP TABLE t; --", "line\nbreak\\n", "λ ünï", "", "$thread_rule"]
    rows = [(h, 0.1 + i, i) for i, h in enumerate(hostile)] + [(None, float("nan"), None)]
    sqlfile.insert_rows(con, "t", [("name", "VARCHAR"), ("x", "DOUBLE"), ("n", "BIGINT")], rows)
    got = con.execute("SELECT * FROM t").fetchall()
    assert got[:-1] == rows[:-1]  # doubles exact, strings byte for byte
    assert got[-1][0] is None and math.isnan(got[-1][1]) and got[-1][2] is None
    with pytest.raises(ValueError):
        sqlfile.insert_rows(con, "t; DROP TABLE t", [("name", "VARCHAR")], [("a",)])
    assert con.execute("SELECT count(*) FROM t").fetchone()[0] == len(rows)


def test_an_lmprof_runs_options_keep_its_runner_names():
    """For the export of an lmprof run the runner's names join the given ones; a runner name
    given for another phase keeps the phase given; lmprof's own options are unchanged."""
    given = trace.Options(phase_ranges=(("fwd", "forward"), ("forward", "inference")),
                          softmax_ranges=("sm",))
    both = given.with_runner_names()
    names = dict(both.phase_ranges)
    assert names["fwd"] == "forward" and names["forward"] == "inference"
    assert names["backward"] == "backward" and names["step"] == "step"
    assert both.softmax_ranges == ("sm", "computing softmax")
    assert both.matmul_ranges == trace.Options().matmul_ranges
    assert trace.Options().with_runner_names() == trace.Options()


@pytest.mark.parametrize("attribution", ["process", "thread"])
def test_a_repeated_launching_call_counts_its_op_once(tmp_path, attribution):
    """An export that repeats a launching call (same correlation id and process: a damaged or
    merged file) still gives each op one row, attributed through the earliest of the calls."""
    from nsys_data import edit, source_count, writable_copy

    calls = source_count("CUPTI_ACTIVITY_KIND_RUNTIME")
    copy = edit(writable_copy(tmp_path),
                "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME SELECT * FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                "WHERE correlationId IN "
                "(SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid % 7 = 0)",
                # the repeats a microsecond later (the calls themselves are kept)
                f"UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = start + 1000 WHERE rowid > {calls}")
    opts = trace.Options(attribution=attribution)
    ops_sql = "SELECT op_id, launch_start_ns, range_id, phase FROM gpu_ops ORDER BY op_id"
    clean = trace.prepare(duckdb.connect(), REPORT, opts)
    damaged = trace.prepare(duckdb.connect(), copy, opts)
    assert damaged.count("gpu_ops") == clean.count("gpu_ops") == (
        source_count("CUPTI_ACTIVITY_KIND_KERNEL") + source_count("CUPTI_ACTIVITY_KIND_MEMCPY")
        + source_count("CUPTI_ACTIVITY_KIND_MEMSET"))
    assert damaged.use().execute(ops_sql).fetchall() == clean.use().execute(ops_sql).fetchall()
    # the views that join the launching call again: one row per op as well
    assert damaged.count("kernels") == source_count("CUPTI_ACTIVITY_KIND_KERNEL")
    assert damaged.count("memops") == clean.count("memops")
    ours = kernels.top_kernels(damaged, top=None)
    ours = ours[ours["phase"] == "all"]
    theirs = stats("cuda_gpu_kern_sum")
    assert ours["instances"].sum() == theirs["Instances"].sum()
    assert ours["total_ns"].sum() == theirs["Total Time (ns)"].sum()
