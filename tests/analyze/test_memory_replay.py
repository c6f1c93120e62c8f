"""memory_replay.events checked against a brute-force reference written from its semantics.

The reference below is plain Python, entry by entry, with no numpy and nothing shared with the
module: block sizes (the dump's size for an allocation still alive at dump, else the request
rounded up to 512 B; a free_requested's, the allocation's it frees), the levels after each entry
(dump level minus everything after the entry, memory released at free_requested where the trace
has them) and phase/step (the innermost window at the last window cut at or before the entry's
time).
It is compared row by row on seeded random traces, on an empty trace and on the H200 fixture.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from lmprof.analyze import memory, snapshot
from lmprof.analyze.memory_replay import events

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "h200-small-fp32" / "memory.pickle.xz"
TRACE_COLS = ("device", "seq", "time_us", "action", "addr", "bytes", "stream", "stack_id",
              "user_metadata", "device_free_bytes")
ALIVE = ("active_allocated", "active_pending_free")
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot")
I32, I64, STR = pa.int32(), pa.int64(), pa.string()
SCHEMA = {"device": I32, "seq": I64, "time_us": I64, "action": STR, "addr": I64, "bytes": I64,
          "block_bytes": I64, "stream": I64, "stack_id": I32, "user_metadata": STR,
          "phase": STR, "step": I32, "allocated_bytes": I64, "requested_bytes": I64,
          "reserved_bytes": I64, "device_free_bytes": I64}


# --- the reference ---------------------------------------------------------------------------

def _innermost(wins, t):
    """Of windows (start, end, phase, step) starting at or before t: the latest-starting one,
    the shortest among equal starts; None if none starts by t."""
    best = None
    for w in wins:
        if w[0] <= t and (best is None or w[0] > best[0] or (w[0] == best[0] and w[1] < best[1])):
            best = w
    return best


def _pair_at_cut(windows, t):
    """(phase, step) holding from cut t: the innermost leaf window if not ended, else the
    innermost step window if not ended, else (None, None)."""
    all_w = list(zip(windows["start_us"], windows["end_us"], windows["phase"], windows["step"]))
    leaf = _innermost([w for w in all_w if w[2] != "step"], t)
    if leaf is not None and t <= leaf[1]:
        return leaf[2], leaf[3]
    step = _innermost([w for w in all_w if w[2] == "step"], t)
    if step is not None and t <= step[1]:
        return "step", step[3]
    return None, None


def reference(trace: dict, blocks: dict, segments: dict, windows: dict) -> list[dict]:
    rows = [dict(zip(TRACE_COLS, r)) for r in zip(*(trace[c] for c in TRACE_COLS))]
    # memory is released where a tensor is freed (free_requested), or, in a trace without
    # free_requested entries where a free_completed frees an allocation of the trace (written by
    # hand), where its block returns (free_completed); a block held for a stream at dump
    # (active_pending_free) is then allocated only in the second case
    by_hand = False
    for i, r in enumerate(rows):
        if r["action"] == "free_completed":
            earlier = [o["action"] for o in rows[:i] if o["action"] in ("alloc", "free_completed")
                       and (o["device"], o["addr"]) == (r["device"], r["addr"])]
            by_hand = by_hand or earlier[-1:] == ["alloc"]
    by_request = any(r["action"] == "free_requested" for r in rows) or not by_hand
    release = "free_requested" if by_request else "free_completed"
    alive = {}                                   # (device, address) -> block bytes
    dump = {}                                    # device -> [allocated, requested, reserved]
    for d, a, b, r, s in zip(blocks["device"], blocks["address"], blocks["bytes"],
                             blocks["requested_bytes"], blocks["state"]):
        if s in ALIVE:
            alive[(d, a)] = b
            lv = dump.setdefault(d, [0, 0, 0])
            if s == "active_allocated" or not by_request:
                lv[0] += b
                lv[1] += r
    for d, total in zip(segments["device"], segments["total_bytes"]):
        dump.setdefault(d, [0, 0, 0])[2] += total
    last = {}                                    # (device, addr) -> index of its last alloc/free
    for i, r in enumerate(rows):
        if r["action"] in ("alloc", "free_completed"):
            last[(r["device"], r["addr"])] = i
    sizes = {}                                   # index -> block bytes of alloc / free_completed
    for i, r in enumerate(rows):
        key, act, n = (r["device"], r["addr"]), r["action"], r["bytes"]
        if act in ("alloc", "free_completed"):
            if last[key] == i and act == "alloc" and key in alive:
                sizes[i] = alive[key]
            else:
                sizes[i] = max(512, -(-n // 512) * 512)
    blockish = ("alloc", "free_requested", "free_completed")
    for i, r in enumerate(rows):  # a free_requested: the block of the allocation it frees
        if r["action"] != "free_requested":
            continue
        key = (r["device"], r["addr"])
        same = [j for j, o in enumerate(rows) if o["action"] in blockish
                and (o["device"], o["addr"]) == key]
        k = same.index(i)
        if k > 0 and rows[same[k - 1]]["action"] == "alloc":
            sizes[i] = sizes[same[k - 1]]
        elif k + 1 < len(same) and rows[same[k + 1]]["action"] == "free_completed":
            sizes[i] = sizes[same[k + 1]]
        else:
            sizes[i] = alive.get(key, max(512, -(-r["bytes"] // 512) * 512))
    deltas = []
    for i, r in enumerate(rows):
        act, n = r["action"], r["bytes"]
        bb = sizes.get(i)
        sign = {"alloc": 1, release: -1}.get(act, 0)
        res = {"segment_alloc": n, "segment_map": n, "segment_free": -n,
               "segment_unmap": -n}.get(act, 0)
        deltas.append((bb, sign * (bb or 0), sign * n, res))
    totals = {}                                  # device -> sum of all its deltas
    for r, (_, *d) in zip(rows, deltas):
        t = totals.setdefault(r["device"], [0, 0, 0])
        for k in range(3):
            t[k] += d[k]
    cuts = sorted(set(windows["start_us"]) | {e + 1 for e in windows["end_us"]})
    has_leaf = any(p != "step" for p in windows["phase"])
    out, running = [], {}
    for r, (bb, *d) in zip(rows, deltas):
        run = running.setdefault(r["device"], [0, 0, 0])
        base = dump.get(r["device"], [0, 0, 0])
        levels = []
        for k in range(3):
            run[k] += d[k]
            levels.append(base[k] - totals[r["device"]][k] + run[k])
        phase, step = None, None
        if r["time_us"] is not None:
            before = [c for c in cuts if c <= r["time_us"]]
            if before:
                phase, step = _pair_at_cut(windows, max(before))
        if phase is None:
            phase = r["user_metadata"] or ("other" if has_leaf else "unknown")
        row = {c: r[c] for c in TRACE_COLS}  # the trace's columns, device_free_bytes included
        row.update(block_bytes=bb, phase=phase, step=step, allocated_bytes=levels[0],
                   requested_bytes=levels[1], reserved_bytes=levels[2])
        out.append(row)
    return out


def check(trace: dict, blocks: dict, segments: dict, windows: dict) -> None:
    got = events(memory._arrow("memory_trace", trace), blocks, segments, windows)
    assert {f.name: f.type for f in got.schema} == SCHEMA
    want = reference(trace, blocks, segments, windows)
    rows = got.to_pylist()
    assert len(rows) == len(want)
    for i, (g, w) in enumerate(zip(rows, want)):
        assert g == w, f"row {i}"


# --- synthetic snapshots ---------------------------------------------------------------------

def _windows(rng: random.Random, kind: str) -> dict:
    """Steps 0..n-1 with gaps between them; inside each, leaf windows that may share a start
    (different ends), nest, or end before the step does. kind: 'none', 'steps' or 'full'."""
    w = {"step": [], "phase": [], "start_us": [], "end_us": [], "source": []}
    if kind == "none":
        return w

    def add(step, phase, s, e):
        for k, v in zip(w, (step, phase, s, e, "test")):
            w[k].append(v)

    t = rng.choice((-40, 0, 100))     # time 0 (a NULL time_us's fill) inside a window or not
    for k in range(rng.randint(2, 4)):
        s, e = t, t + rng.randint(60, 120)
        add(k, "step", s, e)
        if kind == "full":
            a = s + rng.randint(0, 5)
            fwd_end = a + rng.randint(10, 25)
            add(k, "forward", a, fwd_end)
            if rng.random() < 0.5:                       # same start, longer: shortest wins
                add(k, "inference", a, fwd_end + rng.randint(1, 10))
            b = fwd_end + rng.randint(1, 3)
            add(None if rng.random() < 0.2 else k, "backward", b, b + rng.randint(10, 20))
            if rng.random() < 0.5:                       # nested: ends inside backward
                add(k, "optimizer", b + 2, b + 5)
            add(k, "optimizer", b + 25, min(e - 5, b + 40))  # ends while the step goes on
        t = e + rng.randint(1, 30)                           # gap before the next step
    return w


SIZES = (0, 1, 511, 512, 513, 4096, 2**20 + 3, 2**33 + 7)


def _snapshot(seed: int) -> tuple[dict, dict, dict, dict]:
    rng = random.Random(seed)
    windows = _windows(rng, ("none", "steps", "full", "full")[seed % 4])
    bounds = [t + dt for t in windows["start_us"] + windows["end_us"] for dt in (-1, 0, 1)]
    pool = [0x1000 * k for k in range(1, 9)]     # shared by every device: addresses reused
    n_dev = rng.choice((2, 3))
    trace = {c: [] for c in TRACE_COLS}
    for dev in range(n_dev):
        for seq in range(rng.randint(1, 40)):
            act = rng.choice(ACTIONS + ("alloc", "free_completed") * 3)
            r = rng.random()
            time = None if r < 0.1 else (rng.choice(bounds) if r < 0.4 and bounds
                                         else rng.randint(-100, 800))
            meta = rng.choice((None, None, "tag-a", "tag-b"))
            size = rng.choice(SIZES + (rng.randint(0, 10**6),))
            for c, v in zip(TRACE_COLS, (dev, seq, time, act, rng.choice(pool), size,
                                         rng.choice((0, 7)), rng.randint(0, 5), meta,
                                         rng.choice((None, 2**34)))):
                trace[c].append(v)
    blocks = {c: [] for c in ("device", "segment_address", "address", "bytes",
                              "requested_bytes", "state", "stack_id")}
    segments = {c: [] for c in ("device", "address", "total_bytes", "allocated_bytes",
                                "active_bytes", "requested_bytes", "stream", "segment_type",
                                "is_expandable", "stack_id")}
    empty_dev = rng.randrange(n_dev + 1)         # this device has no blocks nor segments
    for dev in range(n_dev + 1):                 # device n_dev: blocks but no trace
        if dev == empty_dev:
            continue
        seen = rng.sample(pool, rng.randint(0, len(pool))) + [0x99000 + dev, 0x9a000]
        for a in seen:
            size = rng.choice((512, 1024, 1536, 2**21, 777))  # not always the rounding
            for c, v in zip(blocks, (dev, 0, a, size, rng.randint(0, size),
                                     rng.choice(ALIVE + ("inactive",)), 1)):
                blocks[c].append(v)
        for k in range(rng.randint(0, 3)):
            for c, v in zip(segments, (dev, 0x100000 * (k + 1), rng.choice((2**21, 2**25)),
                                       0, 0, 0, 0, "large", False, 1)):
                segments[c].append(v)
    return trace, blocks, segments, windows


@pytest.mark.parametrize("seed", range(20))
def test_random_snapshots_match_the_reference(seed):
    check(*_snapshot(seed))


@pytest.mark.parametrize("seed", [0, 2], ids=["no-windows", "windows"])
def test_empty_trace_gives_no_rows(seed):
    trace, blocks, segments, windows = _snapshot(seed)
    got = events(memory._arrow("memory_trace", {c: [] for c in TRACE_COLS}), blocks, segments,
                 windows)
    assert got.num_rows == 0
    assert {f.name: f.type for f in got.schema} == SCHEMA


@pytest.mark.parametrize("swap", [(0, 1), (1, 2)], ids=["seq", "device"])
def test_trace_out_of_order_is_refused(swap):
    trace = {c: [] for c in TRACE_COLS}
    for dev, seq in ((0, 0), (0, 1), (1, 0)):
        for c, v in zip(TRACE_COLS, (dev, seq, 10, "alloc", 0x1000, 512, 0, 0, None, None)):
            trace[c].append(v)
    i, j = swap                                  # (0, 1): seq 1 before 0; (1, 2): device 1 first
    for c in TRACE_COLS:
        trace[c][i], trace[c][j] = trace[c][j], trace[c][i]
    with pytest.raises(ValueError):
        events(memory._arrow("memory_trace", trace), {k: [] for k in (
            "device", "address", "bytes", "requested_bytes", "state")},
            {"device": [], "total_bytes": []}, {"step": [], "phase": [], "start_us": [],
                                                 "end_us": [], "source": []})


def test_fixture_matches_the_reference():
    flat = snapshot.read_flat(FIXTURE)
    windows = memory._phase_windows(flat, None)[0]
    assert any(p != "step" for p in windows["phase"])    # the fixture has leaf windows
    check(flat.trace, flat.blocks, flat.segments, windows)


MIB = 1 << 20
BASE = 0x7F0000000000


def _loaded(tmp_path: Path, second: str, allocated_size: int, trace: list | None):
    """A fresh database holding one snapshot: a 20 MiB segment at BASE with a 2 MiB allocated
    block, a 1 MiB block in state ``second`` and 17 MiB free, and ``trace`` ((action, MiB
    offset from BASE, bytes) per entry, one µs apart; None: no trace recorded)."""
    import pickle

    import duckdb

    blocks = [{"address": BASE, "size": 2 * MIB, "requested_size": 2 * MIB,
               "state": "active_allocated", "frames": []},
              {"address": BASE + 2 * MIB, "size": MIB, "requested_size": MIB,
               "state": second, "frames": []},
              {"address": BASE + 3 * MIB, "size": 17 * MIB, "state": "inactive"}]
    snap = {"segments": [{"device": 0, "address": BASE, "total_size": 20 * MIB, "stream": 0,
                          "segment_type": "large", "allocated_size": allocated_size,
                          "active_size": 3 * MIB, "requested_size": 3 * MIB,
                          "is_expandable": False, "blocks": blocks}]}
    if trace is not None:
        snap["device_traces"] = [[{"action": a, "addr": BASE + at * MIB, "size": n, "stream": 0,
                                   "time_us": i, "frames": []}
                                  for i, (a, at, n) in enumerate(trace)]]
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snap))
    con = duckdb.connect()
    memory.load_memory(con, path)
    return con


def test_a_block_held_for_a_stream_is_released_where_the_tensor_is_freed(tmp_path):
    """record_stream: torch lowers memory_allocated at free_requested, and the block goes back
    to the pool at free_completed, later. The rebuilt level follows torch; a block still held at
    dump (active_pending_free) is not allocated; memory_allocations' lifetimes end at the same
    entries, so the blocks they hold live at each entry add up to the level there, and the
    peak table agrees."""
    trace = [("alloc", 2, MIB), ("alloc", 3, 3 * MIB), ("free_requested", 3, 3 * MIB),
             ("alloc", 6, MIB), ("free_completed", 3, 3 * MIB), ("free_requested", 2, MIB),
             ("free_requested", 6, MIB), ("free_completed", 6, MIB)]
    con = _loaded(tmp_path, "active_pending_free", 3 * MIB, trace)
    levels = [r[0] for r in con.execute(
        "SELECT allocated_bytes FROM memory_events ORDER BY seq").fetchall()]
    assert levels == [x * MIB for x in (3, 6, 3, 4, 4, 3, 2, 2)]
    live = con.execute("""
        SELECT e.seq, e.allocated_bytes, coalesce(sum(a.block_bytes), 0)
        FROM memory_events e LEFT JOIN memory_allocations a
          ON coalesce(a.alloc_seq, -1) <= e.seq AND (a.free_seq IS NULL OR a.free_seq > e.seq)
        GROUP BY ALL ORDER BY e.seq""").fetchall()
    assert all(level == held for _, level, held in live), live
    peak = con.execute("SELECT peak_allocated_bytes, peak_seq, start_allocated_bytes, "
                       "dump_allocated_bytes FROM memory_peaks").fetchall()
    assert peak == [(6 * MIB, 1, 2 * MIB, 2 * MIB)]


@pytest.mark.parametrize("trace", [None, [], [("alloc", 0, 2 * MIB)]],
                         ids=["no-trace", "empty-trace", "allocations-alone"])
def test_a_block_held_for_a_stream_at_dump_is_not_allocated_without_releases(tmp_path, trace):
    """A snapshot whose trace releases nothing (none recorded, or a cut trace of allocations
    alone) still follows torch: a block freed but held for a stream (active_pending_free) is
    not in memory_allocated, as the segment's own allocated_size (2 MiB here) says."""
    con = _loaded(tmp_path, "active_pending_free", 2 * MIB, trace)
    peak = con.execute("SELECT peak_allocated_bytes, peak_requested_bytes, "
                       "dump_allocated_bytes FROM memory_peaks").fetchall()
    assert peak == [(2 * MIB, 2 * MIB, 2 * MIB)]
    held = con.execute("SELECT addr - ?, block_bytes FROM memory_allocations WHERE "
                       "free_seq IS NULL", [BASE]).fetchall()
    assert held == [(0, 2 * MIB)]


@pytest.mark.parametrize("cut", [True, False], ids=["cut-by-torch", "written-by-hand"])
def test_a_trace_without_free_requested_releases_where_torch_would(tmp_path, cut):
    """A trace torch cut (the ring buffer kept too few entries) can hold the free_completed of a
    block whose free_requested, and so its allocation, came before the first entry kept: torch
    counted that block out before the trace, and the level there is the 2 MiB still allocated.
    A trace written by hand that frees its own allocations with free_completed alone still
    releases there."""
    # cut: a 3 MiB block allocated and freed (free_requested) before the trace returns to the
    # pool, and its address takes a 1 MiB allocation; by hand: the 3 MiB is allocated first
    trace = [("free_completed", 2, 3 * MIB), ("alloc", 2, MIB)]
    if not cut:
        trace.insert(0, ("alloc", 2, 3 * MIB))
    con = _loaded(tmp_path, "active_allocated", 3 * MIB, trace)
    levels = [r[0] for r in con.execute(
        "SELECT allocated_bytes FROM memory_events ORDER BY seq").fetchall()]
    peak = con.execute("SELECT peak_allocated_bytes, start_allocated_bytes "
                       "FROM memory_peaks").fetchall()
    if cut:
        assert levels == [2 * MIB, 3 * MIB]
        assert peak == [(3 * MIB, 2 * MIB)]
    else:
        assert levels == [5 * MIB, 2 * MIB, 3 * MIB]
        assert peak == [(5 * MIB, 2 * MIB)]


def test_a_peak_before_the_first_entry_kept_has_no_step(tmp_path):
    """A trace the ring buffer cut to the last step's optimizer frees peaks before its first
    entry kept (the pseudo-entry 'before recording', which has no step): the peak table says
    so, not the step of the highest entry that has one. Any peak's step is its entry's."""
    import lzma
    import pickle

    import duckdb

    snap = pickle.loads(lzma.decompress(
        (ROOT / "tests" / "data" / "h200-lmprof-memory" / "memory.pickle.xz").read_bytes()))
    con = duckdb.connect()
    for keep in (203, 14000):  # the last 203 entries; the last 14000 (a peak in backward)
        cut = dict(snap, device_traces=[snap["device_traces"][0][-keep:]])
        path = tmp_path / f"cut{keep}.pickle"
        path.write_bytes(pickle.dumps(cut))
        memory.load_memory(con, path)
    rows = con.execute("""
        SELECT p.peak_seq, p.peak_phase, p.peak_step, e.step
        FROM memory_peaks p LEFT JOIN memory_events e
          ON e.snapshot_id = p.snapshot_id AND e.device = p.device AND e.seq = p.peak_seq
        ORDER BY p.snapshot_id""").fetchall()
    assert rows[0] == (-1, "before recording", None, None)
    assert rows[1][0] >= 0 and rows[1][1] == "backward" and rows[1][2] == rows[1][3] is not None


def test_a_phase_peak_in_a_step_cut_short_has_no_step(tmp_path):
    """A trace without tags cut inside a step (phases inferred from stacks): the optimizer of
    that partial step has no step number, and there the optimizer phase peaks; the per-phase
    table's peak step is that entry's (none), not the step of the highest entry that has one.
    Every phase's peak step is its peak entry's."""
    import lzma
    import pickle

    import duckdb

    snap = pickle.loads(lzma.decompress(FIXTURE.read_bytes()))
    path = tmp_path / "cut.pickle"
    path.write_bytes(pickle.dumps(dict(snap, device_traces=[snap["device_traces"][0][800:]])))
    con = duckdb.connect()
    memory.load_memory(con, path)
    rows = con.execute("""
        SELECT b.phase, b.peak_step, (SELECT step FROM memory_events e WHERE e.phase = b.phase
                                      ORDER BY allocated_bytes DESC, seq LIMIT 1)
        FROM memory_by_phase b""").fetchall()
    assert ("optimizer", None, None) in rows
    assert all(peak_step == step for _, peak_step, step in rows), rows
