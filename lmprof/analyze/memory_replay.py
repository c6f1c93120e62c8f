"""memory_events: every trace entry of a snapshot with its phase and the memory levels after it.

Built here, column by column with numpy, from the snapshot's own columns before they reach DuckDB,
because the reconstruction is three running sums in trace order: as window functions over 1M
entries DuckDB 1.5.5 took 1.2-1.7 s and about 1 GB beside the trace (bench/results/memory.md,
2026-11-29), as ``numpy.cumsum`` it is milliseconds.

Columns of the table (``snapshot_id`` is prepended on load):
  device           INT     CUDA device index (position in device_traces)
  seq              BIGINT  position of the entry in its device's trace (0 = oldest kept)
  time_us          BIGINT  entry time, epoch microseconds (CLOCK_REALTIME); NULL in old layouts
  action           TEXT    alloc | free_requested | free_completed | segment_alloc |
                           segment_free | segment_map | segment_unmap | oom | snapshot
  addr             BIGINT  block (or segment) address
  bytes            BIGINT  size in the entry: requested bytes for blocks, segment size
  block_bytes      BIGINT  allocator block size of alloc/free_requested/free_completed (a
                           free_requested: that of the allocation it frees): the dump's for blocks
                           still alive at dump, else the replay's of :mod:`lmprof.analyze.blocks`
                           (the request rounded up to 512 B, or the whole cached block where the
                           allocator did not split it), else (where the replay cannot know) the
                           request rounded up to 512 B; NULL for other actions
  stream           BIGINT  CUDA stream
  stack_id         INT     memory_stacks id of the entry's call stack
  user_metadata    TEXT    torch >= 2.11 ``_set_memory_metadata`` tag (NULL when empty)
  phase            TEXT    innermost phase: from memory_phase_windows by wall clock, else
                           user_metadata, else 'other' (windows exist, entry outside them) or
                           'unknown'
  step             INT     step index of the phase window (NULL when unknown)
  allocated_bytes  BIGINT  allocated (block) bytes after the entry: torch.cuda.memory_allocated,
                           which falls where a tensor is freed (free_requested), before a stream
                           that still uses its block (record_stream) lets it go (free_completed);
                           in a trace written by hand that frees its allocations with
                           free_completed alone, at free_completed (release_action)
  requested_bytes  BIGINT  bytes the live tensors asked for, after the entry (memory_viz's view;
                           released as allocated_bytes)
  reserved_bytes   BIGINT  bytes held in segments after the entry: torch.cuda.memory_reserved
  device_free_bytes BIGINT the entry's ``device_free`` as the snapshot gives it (torch records it
                           on ``oom`` entries: the bytes the device had free)

Reconstruction: the level after entry i is the level at dump time minus everything that happened
after i. Memory allocated before recording began (parameters, optimizer state), or whose
``alloc`` entry the ring buffer dropped, is therefore counted: it is in the dump state, and its
release (if any) lowers the level when it happens. A block freed but held for a stream at dump
(active_pending_free) is not allocated (torch counted it out at its free_requested).

Phase: the innermost window of an entry (the latest-starting leaf window, if it has not ended
yet, else the step window around it) changes only where a window starts or just after one ends,
so phase and step are found once per such cut and each entry takes those of the last cut at or
before its time. Of leaf windows starting at the same microsecond the shortest counts.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lmprof.analyze.snapshot import ACTIVE_STATES

_SEGMENT_UP = ("segment_alloc", "segment_map")
_SEGMENT_DOWN = ("segment_free", "segment_unmap")


def int_column(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An integer column as int64 numpy (nulls as 0: the callers mask them where they matter)."""
    return np.asarray(pc.fill_null(col, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _is(action: pa.ChunkedArray, names: tuple[str, ...]) -> np.ndarray:
    return np.asarray(pc.is_in(action, value_set=pa.array(names, pa.string()))
                      .to_numpy(zero_copy_only=False), dtype=bool)


def _pieces(windows: dict[str, list]) -> tuple[np.ndarray, list, list]:
    """Cut times (sorted) with the phase and step that hold from each cut to the next."""
    # by start; of equal starts the shortest (innermost) wins, so it sorts last among them
    rows = list(zip(windows["start_us"], windows["end_us"], windows["phase"], windows["step"]))
    leaf = sorted((w for w in rows if w[2] != "step"), key=lambda w: (w[0], -w[1]))
    steps = sorted((w for w in rows if w[2] == "step"), key=lambda w: (w[0], -w[1]))
    cuts = sorted(set(windows["start_us"]) | {e + 1 for e in windows["end_us"]})
    leaf_starts = np.array([w[0] for w in leaf], dtype=np.int64)
    step_starts = np.array([w[0] for w in steps], dtype=np.int64)
    t = np.array(cuts, dtype=np.int64)
    li = np.searchsorted(leaf_starts, t, side="right") - 1
    si = np.searchsorted(step_starts, t, side="right") - 1
    phases: list = []
    step_of: list = []
    for c, a, b in zip(cuts, li.tolist(), si.tolist()):
        if a >= 0 and c <= leaf[a][1]:
            phases.append(leaf[a][2])
            step_of.append(leaf[a][3])
        elif b >= 0 and c <= steps[b][1]:
            phases.append("step")
            step_of.append(steps[b][3])
        else:
            phases.append(None)
            step_of.append(None)
    return t, phases, step_of


def _dump_state(blocks: dict[str, list], segments: dict[str, list], pending: bool
                ) -> tuple[dict[tuple[int, int], int], dict[int, tuple[int, int, int]]]:
    """Blocks alive at dump by (device, address) → bytes, and per device the dump's
    (allocated, requested, reserved) bytes; ``pending``: blocks freed but waiting on a stream
    (active_pending_free) count as allocated."""
    alive: dict[tuple[int, int], int] = {}
    level: dict[int, list[int]] = {}
    for dev, addr, size, req, state in zip(blocks["device"], blocks["address"], blocks["bytes"],
                                           blocks["requested_bytes"], blocks["state"]):
        if state in ACTIVE_STATES:
            alive[(dev, addr)] = size
            lv = level.setdefault(dev, [0, 0, 0])
            if pending or state == "active_allocated":
                lv[0] += size or 0
                lv[1] += req or 0
    for dev, total in zip(segments["device"], segments["total_bytes"]):
        level.setdefault(dev, [0, 0, 0])[2] += total or 0
    return alive, {d: (a, r, s) for d, (a, r, s) in level.items()}


def release_action(trace: pa.Table) -> str:
    """The entry at which allocated memory is released in this trace: ``free_requested``, where
    torch lowers memory_allocated (a block another stream still uses, record_stream, returns to
    the pool later, at ``free_completed``); ``free_completed`` in a trace without free_requested
    entries where a free_completed frees a block allocated in the trace (written by hand: in
    torch's own trace a free_requested comes between). A trace torch cut to its last entries
    that kept none, or one with no release at all, follows torch: its free_completed entries
    return blocks counted out before the trace, and a block held for a stream at dump
    (active_pending_free) is not allocated. memory_snapshots.release_action keeps it for the SQL."""
    action = trace["action"]
    if pc.any(pc.equal(action, "free_requested")).as_py():
        return "free_requested"
    is_alloc, is_free = _is(action, ("alloc",)), _is(action, ("free_completed",))
    order, same = _by_address(int_column(trace["device"]), int_column(trace["addr"]),
                              np.flatnonzero(is_alloc | is_free))
    freed_after_alloc = same & is_alloc[order[:-1]] & is_free[order[1:]]
    return "free_completed" if freed_after_alloc.any() else "free_requested"


def _by_address(device: np.ndarray, addr: np.ndarray, sel: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """The entries ``sel`` (of a trace in (device, seq) order) ordered by (device, address),
    each address' entries in trace order; and, per neighbouring pair in that order, whether the
    later one has the earlier one's (device, address)."""
    if device.size and device[0] != device[-1]:
        order = sel[np.lexsort((sel, addr[sel], device[sel]))]
    else:  # one device: a stable sort by address keeps each address' entries in trace order
        order = sel[np.argsort(addr[sel], kind="stable")]
    k_dev, k_addr = device[order], addr[order]
    return order, (k_dev[1:] == k_dev[:-1]) & (k_addr[1:] == k_addr[:-1])


def _request_sizes(block: np.ndarray, device: np.ndarray, addr: np.ndarray,
                   is_alloc: np.ndarray, is_req: np.ndarray, is_free: np.ndarray,
                   alive: dict[tuple[int, int], int]) -> None:
    """Each free_requested entry's block (in place): that of the allocation it frees, the alloc
    just before it at its address; for a block allocated before recording, the free_completed
    just after it; else the block alive (pending) at dump there; else its request rounded."""
    order, same = _by_address(device, addr, np.flatnonzero(is_alloc | is_req | is_free))
    pos = np.flatnonzero(is_req[order])
    prev = np.maximum(pos - 1, 0)
    nxt = np.minimum(pos + 1, order.size - 1)
    from_alloc = (pos > 0) & np.r_[False, same][pos] & is_alloc[order[prev]]
    from_free = ~from_alloc & np.r_[same, False][pos] & is_free[order[nxt]]
    rows = order[pos]
    block[rows] = np.where(from_alloc, block[order[prev]],
                           np.where(from_free, block[order[nxt]], block[rows]))
    for i in rows[~(from_alloc | from_free)].tolist():
        size = alive.get((int(device[i]), int(addr[i])))
        if size is not None:
            block[i] = size


def events(trace: pa.Table, blocks: dict[str, list], segments: dict[str, list],
           windows: dict[str, list], exact: np.ndarray | None = None,
           release: str | None = None) -> pa.Table:
    """The memory_events columns of one snapshot, from its trace (an Arrow table of the
    memory_trace schema in (device, seq) order), its dump's blocks and segments, its phase
    windows (columns of memory_phase_windows) and, per entry, the block bytes the replay of
    :mod:`lmprof.analyze.blocks` found (-1 where it does not know); ``release``: its
    ``release_action``, where the caller has it already."""
    n = trace.num_rows
    device = int_column(trace["device"])
    seq = int_column(trace["seq"])
    if n and (np.any(np.diff(device) < 0) or np.any((np.diff(seq) <= 0) & (np.diff(device) == 0))):
        raise ValueError("trace entries are not in (device, seq) order")
    action = trace["action"]
    nbytes = int_column(trace["bytes"])
    if np.any(nbytes < 0) or any(v < 0 for v in (*blocks["bytes"], *segments["total_bytes"])):
        raise ValueError("a negative size in bytes")  # torch never writes one
    sized = np.asarray(pc.is_valid(trace["bytes"]).to_numpy(zero_copy_only=False), dtype=bool)
    is_alloc = _is(action, ("alloc",)) & sized   # an entry without a size moves no level
    is_free = _is(action, ("free_completed",)) & sized
    is_req = _is(action, ("free_requested",)) & sized
    is_block = is_alloc | is_free
    by_request = (release or release_action(trace)) == "free_requested"

    # block sizes: the request rounded up to 512 B; the dump's size for an allocation whose block
    # is still alive at dump (its last alloc/free_completed entry is an alloc at a live address)
    block = np.maximum((nbytes + 511) // 512 * 512, 512)
    if exact is not None:
        block = np.where(exact >= 0, exact, block)
    alive, dump = _dump_state(blocks, segments, pending=not by_request)
    addr = int_column(trace["addr"])
    if alive:
        alive_addrs = pa.array([a for _, a in alive], pa.int64())
        at_alive = pc.is_in(trace["addr"], value_set=alive_addrs)  # hashed, not sorted
        idx = np.flatnonzero(is_block & np.asarray(pc.fill_null(at_alive, False)
                                                   .to_numpy(zero_copy_only=False), dtype=bool))
        last: dict[tuple[int, int], int] = {}
        for i, d, a in zip(idx.tolist(), device[idx].tolist(), addr[idx].tolist()):
            last[(d, a)] = i  # idx ascends in (device, seq): the last one seen is the latest
        for key, i in last.items():
            if is_alloc[i] and key in alive and alive[key] is not None:
                block[i] = alive[key]

    release = is_free
    if by_request:
        _request_sizes(block, device, addr, is_alloc, is_req, is_free, alive)
        release = is_req
    d_alloc = np.where(is_alloc, block, np.where(release, -block, 0))
    d_req = np.where(is_alloc, nbytes, np.where(release, -nbytes, 0))
    d_res = np.where(_is(action, _SEGMENT_UP), nbytes,
                     np.where(_is(action, _SEGMENT_DOWN), -nbytes, 0))
    # a real trace's changes and dump levels add up to far below 2^62 bytes; past it (a damaged
    # or hand-edited file) the int64 running sums below would wrap silently
    dump_max = max((v for lv in dump.values() for v in lv), default=0)
    if any(np.abs(d).sum(dtype=np.float64) + dump_max >= 2**62 for d in (d_alloc, d_req, d_res)):
        raise ValueError("sizes that add up past 2^62 bytes")
    # after entry i: dump level - (sum of the device's deltas) + (its deltas up to i)
    starts = np.flatnonzero(np.r_[True, np.diff(device) != 0]) if n else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], n] if n else starts
    levels = [d_alloc, d_req, d_res]
    for k, d in enumerate(levels if n else ()):
        run = np.cumsum(d)
        before = np.r_[0, run][starts]          # running sum before each device's first entry
        total = run[ends - 1] - before           # each device's sum
        at_dump = np.array([dump.get(int(device[s]), (0, 0, 0))[k] for s in starts],
                           dtype=np.int64)
        levels[k] = run + np.repeat(at_dump - total - before, ends - starts)

    # phase and step by wall clock, then user_metadata, then other/unknown
    time_us = trace["time_us"]
    has_windows = any(p != "step" for p in windows["phase"])
    step = pa.nulls(n, pa.int32())
    if windows["phase"]:
        cuts, phases, steps = _pieces(windows)
        valid = np.asarray(pc.is_valid(time_us).to_numpy(zero_copy_only=False), dtype=bool)
        at = np.searchsorted(cuts, int_column(time_us), side="right") - 1
        at[~valid] = -1
        names = pa.array(phases + [None], pa.string())
        step_vals = pa.array(list(steps) + [None], pa.int32())
        pick = pa.array(np.where(at >= 0, at, len(phases)))
        window_phase = names.take(pick)
        step = step_vals.take(pick)
    else:
        window_phase = pa.nulls(n, pa.string())
    fallback = "other" if has_windows else "unknown"
    phase = pc.coalesce(window_phase, trace["user_metadata"], pa.scalar(fallback, pa.string()))

    bb = pa.array(block, pa.int64(), mask=~(is_block | is_req))
    return pa.table({
        "device": trace["device"], "seq": trace["seq"], "time_us": time_us,
        "action": action, "addr": trace["addr"], "bytes": trace["bytes"], "block_bytes": bb,
        "stream": trace["stream"], "stack_id": trace["stack_id"],
        "user_metadata": trace["user_metadata"], "phase": phase, "step": step,
        "allocated_bytes": pa.array(levels[0], pa.int64()),
        "requested_bytes": pa.array(levels[1], pa.int64()),
        "reserved_bytes": pa.array(levels[2], pa.int64()),
        "device_free_bytes": trace["device_free_bytes"],
    })
