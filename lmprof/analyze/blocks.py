"""The caching allocator's block size of each traced allocation, replayed from a snapshot.

A trace entry gives the bytes a tensor asked for, not the block the allocator gave it: requests
round up to 512 bytes, and a cached free block is split for them only when enough is left over,
else the whole block goes to the request. PyTorch's ``CUDACachingAllocator`` (``should_split``)
splits a small-pool block (requests up to 1 MiB) when at least 512 bytes remain, a large-pool
block when more than 1 MiB remains (without ``max_split_size``). So the block an ``alloc`` took
is known from where it went: in a segment whose free neighbours always merge (not an expandable
segment), the free block that starts at the allocation's address runs to the next live block
or to the segment's end. Replaying the trace forward over the segments and the live blocks'
addresses gives every block's size, and with them ``torch.cuda.memory_allocated`` exactly: the
peak equals ``max_memory_allocated`` to the byte on the H200 captures in tests/data, where the
512-byte rounding alone read 0.06-1.28% low.

Where the replay cannot know (expandable segments, a non-default ``max_split_size`` or
``roundup_power2_divisions``, an address outside every known segment, a block freed before its
allocation was recorded), the entry keeps no size here and :mod:`lmprof.analyze.memory_replay`
rounds its request up to 512 bytes.
"""

from __future__ import annotations

import bisect
import gc

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lmprof.analyze.memory_replay import int_column
from lmprof.analyze.snapshot import ACTIVE_STATES, Flat

SMALL_SIZE = 1 << 20  # kSmallSize: requests up to this go to the small pool
MIN_BLOCK = 512  # kMinBlockSize: every request rounds up to a multiple of it


def _default_splitting(flat: Flat) -> bool:
    """Whether the allocator split blocks by the default rule (absent settings count as the
    defaults: snapshots before torch recorded them)."""
    s = flat.allocator_settings
    if s.get("expandable_segments") or any(flat.segments["is_expandable"]):
        return False
    if s.get("max_split_size") not in (None, -1) and not (
            isinstance(s.get("max_split_size"), int) and s["max_split_size"] >= 2**63 - 1):
        return False
    divisions = s.get("roundup_power2_divisions")
    if isinstance(divisions, dict) and any(divisions.values()):
        return False
    return not (isinstance(divisions, int) and divisions)


def exact_block_bytes(flat: Flat, trace: pa.Table) -> np.ndarray:
    """Per trace entry (``trace`` is ``flat.trace`` as Arrow, in its order): the block bytes an
    ``alloc`` took or a ``free_completed`` gave back where the replay knows them, else -1 (every
    other entry, and where it does not know: see the module's docstring)."""
    n = trace.num_rows
    out = np.full(n, -1, dtype=np.int64)
    if not n or not _default_splitting(flat):
        return out
    action = np.asarray(pc.fill_null(pc.index_in(trace["action"], value_set=_ACTIONS), -1)
                        .to_numpy(zero_copy_only=False), dtype=np.int64)
    if np.any(action >= _SEG_MAP):  # mapped (expandable) segments: no split rule
        return out
    # the entries the replay reads (a third of a trace are free_requested), per device
    rows = np.flatnonzero(action >= 0)
    device = int_column(trace["device"])[rows]
    addr = int_column(trace["addr"])[rows]
    size = int_column(trace["bytes"])[rows]
    acts = action[rows]
    # the replay makes a tuple per entry: the cyclic collector, run by those allocations, would
    # walk the whole snapshot's objects again and again (it doubled the replay's time)
    enabled = gc.isenabled()
    gc.disable()
    try:
        for d in np.unique(device).tolist():
            mine = np.flatnonzero(device == d) if device[0] != device[-1] else slice(None)
            sizes = _replay(flat, d, acts[mine].tolist(), addr[mine].tolist(),
                            size[mine].tolist())
            out[rows[mine]] = np.array([-1 if v is None else v for v in sizes], dtype=np.int64)
    finally:
        if enabled:
            gc.enable()
    return out


_ACTIONS = pa.array(["alloc", "free_completed", "segment_alloc", "segment_free", "segment_map",
                     "segment_unmap"])
_ALLOC, _FREE, _SEG_ALLOC, _SEG_FREE, _SEG_MAP = range(5)


def _replay(flat: Flat, device: int, acts: list[int], addr: list[int], size: list[int]
            ) -> list[int | None]:
    """The replay of one device's entries (alloc / free_completed / segment_alloc /
    segment_free, in trace order): the block bytes of each, None where not known."""
    # segments at the start of the trace: those at dump, less the ones allocated in the trace,
    # plus the ones freed in it (undone from the last entry back)
    segs = {a: s for d, a, s in zip(flat.segments["device"], flat.segments["address"],
                                    flat.segments["total_bytes"]) if d == device}
    for act, x, n in zip(reversed(acts), reversed(addr), reversed(size)):
        if act == _SEG_ALLOC:
            segs.pop(x, None)
        elif act == _SEG_FREE:
            segs[x] = n
    # live blocks at the start: alive at dump and not (last) allocated in the trace, and every
    # address whose first block entry frees it (allocated before recording began)
    b = flat.blocks
    alive = {a: s for d, a, s, st in zip(b["device"], b["address"], b["bytes"], b["state"])
             if d == device and st in ACTIVE_STATES}
    # an address's first and last block entries: the last one wins in a dict built forwards,
    # the first in one built backwards
    blocks = [(x, act) for act, x in zip(acts, addr) if act <= _FREE]
    last = dict(blocks)
    first = dict(reversed(blocks))
    del blocks
    live: dict[int, int | None] = {a: s for a, s in alive.items() if last.get(a) != _ALLOC}
    for a, act in first.items():
        if act == _FREE:
            live.setdefault(a, None)
    del first, last
    starts = sorted(live)
    seg_starts = sorted(segs)
    right, left, insort = bisect.bisect_right, bisect.bisect_left, bisect.insort
    pop, gone = live.pop, object()
    out: list[int | None] = []
    put = out.append
    seg_lo = seg_hi = -1  # the segment the last allocation went to (most go to the same one)
    for act, x, n in zip(acts, addr, size):
        if act == _ALLOC:
            # the free block at x: to the next live block or the segment's end, split off at
            # the rounded request where the allocator splits (None where the layout
            # contradicts the replay: x outside every segment, or too little room)
            if not seg_lo <= x < seg_hi:
                j = right(seg_starts, x) - 1
                seg_lo, seg_hi = (seg_starts[j], seg_starts[j] + segs[seg_starts[j]]) \
                    if j >= 0 else (-1, -1)
            block = None
            j = right(starts, x)
            if seg_lo <= x < seg_hi:
                end = starts[j] if j < len(starts) and starts[j] < seg_hi else seg_hi
                rounded = MIN_BLOCK if n < MIN_BLOCK else -(-n // MIN_BLOCK) * MIN_BLOCK
                rest = end - x - rounded
                if rest >= 0:
                    split = rest >= MIN_BLOCK if n <= SMALL_SIZE else rest > SMALL_SIZE
                    block = rounded if split else end - x
            put(block)
            if x not in live:
                starts.insert(j, x)
            live[x] = block
        elif act == _FREE:
            block = pop(x, gone)
            if block is gone:
                put(None)
            else:
                put(block)
                del starts[left(starts, x)]
        else:
            put(None)
            if act == _SEG_ALLOC:
                if x not in segs:
                    insort(seg_starts, x)
                segs[x] = n
            elif segs.pop(x, None) is not None:  # segment_free
                del seg_starts[left(seg_starts, x)]
            seg_lo = seg_hi = -1
    return out
