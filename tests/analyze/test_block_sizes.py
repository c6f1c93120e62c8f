"""lmprof.analyze.blocks on hand-made snapshots: the caching allocator's split rule."""

from __future__ import annotations

from lmprof.analyze import blocks
from lmprof.analyze.memory import _arrow
from lmprof.analyze.snapshot import flatten

MIB = 1 << 20
LARGE, SMALL = 0x7F0000000000, 0x7F0010000000


def _snapshot(trace, blocks_at_dump, settings=None, expandable=False):
    """Two segments (4 MiB large, 2 MiB small) whose dump state holds ``blocks_at_dump``
    ((address, size, state)), and ``trace`` ((action, addr, size)) on device 0."""
    segments = []
    for base, total in ((LARGE, 4 * MIB), (SMALL, 2 * MIB)):
        mine = sorted(b for b in blocks_at_dump if base <= b[0] < base + total)
        blocks, cursor = [], base
        for addr, size, state in mine:
            if addr > cursor:
                blocks.append({"address": cursor, "size": addr - cursor, "state": "inactive"})
            blocks.append({"address": addr, "size": size, "state": state, "requested_size": size,
                           "frames": []})
            cursor = addr + size
        if cursor < base + total:
            blocks.append({"address": cursor, "size": base + total - cursor, "state": "inactive"})
        segments.append({"device": 0, "address": base, "total_size": total, "stream": 0,
                         "segment_type": "large" if total > 2 * MIB else "small",
                         "allocated_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
                         "active_size": 0, "requested_size": 0, "is_expandable": expandable,
                         "blocks": blocks})
    entries = [{"action": a, "addr": x, "size": s, "stream": 0, "time_us": i, "frames": []}
               for i, (a, x, s) in enumerate(trace)]
    return {"segments": segments, "device_traces": [entries],
            "allocator_settings": settings or {"expandable_segments": False,
                                               "max_split_size": -1}}


def exact_block_bytes(flat):
    """The replay's sizes as a list, None where it does not know."""
    sizes = blocks.exact_block_bytes(flat, _arrow("memory_trace", flat.trace))
    return [None if v < 0 else v for v in sizes.tolist()]


def test_split_only_where_the_allocator_splits():
    trace = [
        # large pool: 1.5 MiB left over (> 1 MiB): split at the rounded request
        ("alloc", LARGE, 2 * MIB + MIB // 2 - 100),
        # 1.5 MiB free up to the segment's end, 0.3 MiB left over (<= 1 MiB): the whole block
        ("alloc", LARGE + 5 * MIB // 2, MIB + MIB // 5),
        # small pool: 1000 B rounds to 1024, plenty left: split
        ("alloc", SMALL, 1000),
        # 1280 B free before a block alive since before the trace: 700 -> 1024 leaves 256 B
        # (< 512): the whole 1280
        ("alloc", SMALL + 1024, 700),
        ("free_completed", SMALL + 1024, 700),
        ("free_completed", LARGE + 5 * MIB // 2, MIB + MIB // 5),
        ("free_requested", SMALL, 1000),
    ]
    dump = [(LARGE, 2 * MIB + MIB // 2, "active_allocated"), (SMALL, 1024, "active_pending_free"),
            (SMALL + 2304, 4096, "active_allocated")]
    sizes = exact_block_bytes(flatten(_snapshot(trace, dump), "test"))
    assert sizes == [2 * MIB + MIB // 2, 3 * MIB // 2, 1024, 1280, 1280, 3 * MIB // 2, None]


def test_no_sizes_where_the_rule_does_not_hold():
    """Expandable segments and a max_split_size: blocks split otherwise; an address outside
    every segment: nothing to replay. The analysis then rounds requests to 512 B, as before."""
    trace = [("alloc", SMALL, 1000), ("free_completed", SMALL, 1000)]
    assert exact_block_bytes(flatten(_snapshot(trace, [], expandable=True), "t")) == [None] * 2
    limited = {"expandable_segments": False, "max_split_size": 64 * MIB}
    assert exact_block_bytes(flatten(_snapshot(trace, [], settings=limited), "t")) == [None] * 2
    outside = [("alloc", 0x1000, 1000), ("free_completed", 0x1000, 1000)]
    assert exact_block_bytes(flatten(_snapshot(outside, []), "t")) == [None, None]
