"""Snapshot loading: only plain data is unpickled; bad files give one-line errors."""

from __future__ import annotations

import gc
import gzip
import lzma
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from lmprof.analyze.snapshot import flatten, read_flat, read_snapshot
from lmprof.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "data" / "h200-small-fp32" / "memory.pickle.xz"


class _SystemCall:
    """Unpickling this calls os.system — the attack the loader must refuse."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_reduce_is_refused_before_running(tmp_path):
    marker = tmp_path / "pwned"
    bad = tmp_path / "memory.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "x": _SystemCall(marker)}))
    with pytest.raises(UserError) as err:
        read_snapshot(bad)
    msg = str(err.value)
    assert "refused" in msg and ("posix.system" in msg or "os.system" in msg)
    assert "\n" not in msg
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_class_instance_is_refused_at_every_protocol(tmp_path, protocol):
    bad = tmp_path / "snap.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "p": Path("/etc")}, protocol=protocol))
    with pytest.raises(UserError, match="refused to unpickle pathlib"):
        read_snapshot(bad)


def test_cli_refuses_malicious_pickle_exit_2(tmp_path):
    marker = tmp_path / "pwned"
    bad = tmp_path / "memory.pickle.gz"
    bad.write_bytes(gzip.compress(pickle.dumps([_SystemCall(marker)])))
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "memory", str(bad)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "refused" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


def test_compressed_variants_load_the_same(tmp_path):
    import zstandard

    raw = lzma.decompress(FIXTURE.read_bytes())
    plain = read_snapshot(FIXTURE)
    for name, blob in (("a.pickle", raw), ("b.pickle.gz", gzip.compress(raw)),
                       ("c.pickle.zst", zstandard.ZstdCompressor().compress(raw)),
                       ("d.bin", lzma.compress(raw))):
        (tmp_path / name).write_bytes(blob)
        assert read_snapshot(tmp_path / name) == plain


@pytest.mark.parametrize("compress", ["none", "gzip", "xz", "bz2", "zstd"])
def test_every_kind_closes_its_file(tmp_path, compress):
    # a decompressor handed a file object does not close it: the file under it must be closed
    # too (it was left to the garbage collector, with a ResourceWarning, for the compressed kinds)
    import bz2
    import warnings

    import zstandard

    raw = pickle.dumps({"segments": [], "device_traces": []})
    blob = {"none": raw, "gzip": gzip.compress(raw), "xz": lzma.compress(raw),
            "bz2": bz2.compress(raw), "zstd": zstandard.ZstdCompressor().compress(raw)}[compress]
    path = tmp_path / "s.pickle"
    path.write_bytes(blob)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_snapshot(path)["segments"] == []
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


@pytest.mark.parametrize("content, message", [
    (b"", "truncated or empty"),
    (b"hello, not a pickle at all", "not a memory snapshot: its first bytes are not a pickle"),
    # (a csv's first byte is a protocol-0 opcode: this said "truncated")
    (b"a,b\n1,2\n", "not a memory snapshot: its first bytes are not a pickle"),
    (lzma.compress(b"SQLite format 3\x00" + b"\0" * 84), r"\(xz\) holds an SQLite database"),
    (b"\x80\x04\x95 damaged after the header", "not a readable pickle"),
    (b"\xfd7zXZ\x00garbage", "cannot be decompressed"),
    # a text memo lookup (GET) of an index past 64 bits: OverflowError, was a traceback
    (b"g99999999999999999999\n.", "its first bytes are not a pickle"),
    (b"\x80\x02g99999999999999999999\n.", "not a readable pickle: Python int too large"),
])
def test_bad_files(tmp_path, content, message):
    f = tmp_path / "x.pickle"
    f.write_bytes(content)
    with pytest.raises(UserError, match=message):
        read_snapshot(f)


@pytest.mark.parametrize("name, content, message", [
    ("report.sqlite", b"SQLite format 3\x00" + b"\0" * 84, "an SQLite database"),
    ("k.duckdb", b"\0" * 8 + b"DUCK" + b"\0" * 20, "a DuckDB database"),
    ("report.nsys-rep", b"\0" * 64, "an Nsight Systems report"),
])
def test_other_inputs_of_the_tool_are_named(tmp_path, name, content, message):
    f = tmp_path / name
    f.write_bytes(content)
    with pytest.raises(UserError, match=f"{message}.*not a memory snapshot"):
        read_snapshot(f)


def _small_snapshot() -> dict:
    snap = read_snapshot(FIXTURE)
    snap["device_traces"] = [trace[:300] for trace in snap["device_traces"]]
    snap["segments"] = snap["segments"][:20]
    return snap


def _first_with(items, key):
    return next(item for item in items if item.get(key))


@pytest.mark.parametrize("edit", [
    # (found by mutating the fixture: each of these was a traceback before)
    lambda s: s["segments"][0].update(blocks=None),
    lambda s: s["device_traces"][0][5].update(time_us="x"),
    lambda s: s["device_traces"][0][5].update(size=True),
    lambda s: s["device_traces"][0][5].update(stream=[]),
    lambda s: s["segments"][0]["blocks"][0].update(requested_size=2**70),
    lambda s: _first_with(s["device_traces"][0], "frames")["frames"][0].update(line=True),
    # (a negative size loaded: a trace entry of -10^12 bytes made the requested peak 999 GB)
    lambda s: s["device_traces"][0][5].update(size=-10**12),
    lambda s: s["segments"][0]["blocks"][0].update(size=-512),
    lambda s: s["segments"][0].update(total_size=-1),
    # (sizes whose sum passes 2^63 wrapped numpy's running sums: two traced segments of 2^62
    # bytes loaded as a reserved peak of 406 MiB)
    lambda s: [e.update(action="segment_alloc", size=2**62)
               for e in s["device_traces"][0][10:12]],
], ids=["blocks-none", "time-str", "size-bool", "stream-list", "size-2^70", "line-bool",
        "size-negative", "block-negative", "segment-negative", "segments-2^62"])
def test_wrong_values_inside_a_snapshot_are_one_line_errors(tmp_path, edit, request):
    from lmprof.analyze import memory
    from lmprof.analyze.db import connect

    snap = _small_snapshot()
    edit(snap)
    f = tmp_path / "memory.pickle"
    f.write_bytes(pickle.dumps(snap))
    said = ("holds an integer beyond 64 bits" if request.node.callspec.id == "size-2^70"
            else "unrecognised snapshot layout")
    with pytest.raises(UserError, match=said):
        memory.load_memory(connect(), f)
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "memory", str(f)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("edit", [
    lambda s: s["segments"][0].update(total_size="big"),
    lambda s: s["segments"][0].update(address="0x7f00"),
    lambda s: s["segments"][0]["blocks"][0].update(size=1.5),
    lambda s: s["segments"][0]["blocks"][0].update(requested_size=[512]),
], ids=["segment-size-str", "segment-address-str", "block-size-float", "requested-list"])
def test_an_integer_field_of_another_type_is_refused_not_defaulted(tmp_path, edit):
    """A segment's or block's integer field of another type (found by fuzzing the fixture)
    counted as the field's default, 0: a segment's total_size of "big" put the reserved peak
    below the allocated one (the compiled forward fixture's: 574 against 581 MiB), without a
    word. Absent (or null), the default stays:
    older layouts lack some of these fields (test_legacy_layouts_are_read)."""
    snap = _small_snapshot()
    edit(snap)
    f = tmp_path / "memory.pickle"
    f.write_bytes(pickle.dumps(snap))
    with pytest.raises(UserError, match=r"unrecognised snapshot layout \(TypeError: a \w+ where "
                                        "an integer belongs"):
        read_flat(f)



def _shared_bomb(levels: int = 60) -> list:
    """A list nesting 2^levels empty lists through shared references: kilobytes pickled."""
    bomb: list = []
    for _ in range(levels):
        bomb = [bomb, bomb]
    return bomb


@pytest.mark.parametrize("edit", [
    lambda s: _first_with(s["device_traces"][0], "frames")["frames"][0].update(name=_shared_bomb()),
    lambda s: s["segments"][0]["blocks"][0].update(state=_shared_bomb()),
    lambda s: s["segments"][0].update(segment_type=_shared_bomb()),
    lambda s: s.update(external_annotations=[{"time_us": 1, "stage": _shared_bomb()}]),
], ids=["frame-name", "block-state", "segment-type", "annotation-stage"])
def test_a_nested_value_where_text_belongs_is_refused_not_expanded(tmp_path, edit):
    # str() of it walked all 2^60 items: the command never ended
    snap = _small_snapshot()
    edit(snap)
    f = tmp_path / "memory.pickle"
    f.write_bytes(pickle.dumps(snap))
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "memory", str(f)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "unrecognised snapshot layout" in proc.stderr and "where text belongs" in proc.stderr


def _share_blocks(snap: dict) -> None:
    snap["segments"] = [snap["segments"][0]] * 3


def _share_trace(snap: dict) -> None:
    snap["device_traces"] = snap["device_traces"] * 3


@pytest.mark.parametrize("edit, where", [(_share_blocks, "segment 1's blocks"),
                                         (_share_trace, r"device_traces\[1\]")],
                         ids=["blocks", "trace"])
def test_a_list_of_rows_read_twice_is_refused(tmp_path, edit, where):
    # shared references multiply rows: 20000 segments naming one list of 20000 blocks were
    # 4e8 rows from 190 KB (the command never ended), a trace named by 1000 devices a
    # MemoryError traceback
    snap = _small_snapshot()
    edit(snap)
    f = tmp_path / "memory.pickle"
    f.write_bytes(pickle.dumps(snap))
    with pytest.raises(UserError, match=f"{where} is a list read before"):
        read_flat(f)
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "memory", str(f)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "list read before" in proc.stderr


def test_frames_nesting_lists_deep_are_a_layout_error(tmp_path):
    # two stacks alike but for a frame field nesting lists 100000 deep: comparing them was a
    # RecursionError traceback (a pickle nests that deep without recursion; pickle.dumps cannot)
    snap = _small_snapshot()
    f0 = {"name": "x", "filename": "a.py", "line": 1}
    for k, entry in ((1, snap["device_traces"][0][3]), (2, snap["device_traces"][0][4])):
        entry["frames"] = [f0, {"name": "y", "filename": "b.py", "line": 2,
                                "extra": f"@DEEP{k}@"}, f0, f0]
    blob = pickle.dumps(snap, protocol=2)
    for k in (1, 2):
        mark = b"X\x07\x00\x00\x00@DEEP%d@" % k  # BINUNICODE, replaced by the nested lists
        assert blob.count(mark) == 1
        blob = blob.replace(mark, b"]" * 100_000 + b"a" * 99_999)
    f = tmp_path / "memory.pickle"
    f.write_bytes(blob)
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "memory", str(f)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "unrecognised snapshot layout (RecursionError" in proc.stderr

@pytest.mark.parametrize("where", ["key", "frame", "xz"])
def test_tuples_nested_a_million_deep_are_an_error_not_a_crash(tmp_path, where):
    # Hashing a tuple recurses in C with no depth check: a dict key (or a frame field, which
    # flatten hashes to share identical frames) nesting tuples a million deep overflowed the
    # 8 MiB stack and killed the process with SIGSEGV. A pickle builds such a chain without
    # recursion, one TUPLE1 opcode a level.
    chain = b")" + b"\x85" * 1_000_000
    if where == "frame":
        snap = _small_snapshot()
        snap["device_traces"][0][3]["frames"] = [{"name": "@DEEP@", "filename": "a.py",
                                                  "line": 1}]
        blob = pickle.dumps(snap, protocol=2)
        mark = b"X\x06\x00\x00\x00@DEEP@"
        assert blob.count(mark) == 1
        blob = blob.replace(mark, chain)
    else:
        blob = b"\x80\x02}" + chain + b"K\x01s."  # {(((...),),): 1}
    f = tmp_path / "memory.pickle"
    f.write_bytes(lzma.compress(blob) if where == "xz" else blob)
    proc = subprocess.run([sys.executable, "-m", "lmprof.analyze", "memory", str(f)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-300:]
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert str(f) in proc.stderr


def test_the_small_snapshot_itself_loads(tmp_path):
    from lmprof.analyze import memory
    from lmprof.analyze.db import connect

    f = tmp_path / "memory.pickle"
    f.write_bytes(pickle.dumps(_small_snapshot()))
    assert memory.load_memory(connect(), f) == 0


def test_truncated_pickle(tmp_path):
    raw = lzma.decompress(FIXTURE.read_bytes())
    f = tmp_path / "cut.pickle"
    f.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(UserError, match="truncated"):
        read_snapshot(f)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        read_snapshot(tmp_path / "nope.pickle")
    with pytest.raises(UserError, match="is a directory"):
        read_snapshot(tmp_path)


def test_input_file_is_not_modified(tmp_path):
    from lmprof.analyze import memory
    from lmprof.analyze.db import connect

    f = tmp_path / "memory.pickle.xz"
    f.write_bytes(FIXTURE.read_bytes())
    before = (f.read_bytes(), f.stat().st_mtime_ns)
    memory.load_memory(connect(), f)
    assert (f.read_bytes(), f.stat().st_mtime_ns) == before


def test_not_a_snapshot_layouts():
    with pytest.raises(UserError, match="no 'segments' key"):
        flatten({"foo": 1}, "x")
    with pytest.raises(UserError, match="holds a int"):
        flatten(3, "x")
    with pytest.raises(UserError, match="has no 'action'"):
        flatten({"segments": [], "device_traces": [[{"addr": 1}]]}, "x")


def test_legacy_layouts_are_read():
    """torch 2.0-style blocks (frames in history, real_size, no address) and a bare list."""
    seg = {"device": 0, "address": 4096, "total_size": 2048, "stream": 0,
           "blocks": [{"size": 1024, "state": "active_allocated",
                       "history": [{"real_size": 1000, "frames": [
                           {"filename": "/home/me/model.py", "line": 3, "name": "f"}]}]},
                      {"size": 1024, "state": "inactive"}]}
    flat = flatten([seg], "x")
    assert flat.layout.startswith("segments-only list") and not flat.has_trace
    assert "legacy block history" in flat.layout
    assert flat.blocks["address"] == [4096, 5120]
    assert flat.blocks["requested_bytes"] == [1000, 1024]
    site = flat.stacks["site"][flat.blocks["stack_id"][0]]
    assert site == "/home/me/model.py:3 f"


def test_read_flat_restores_the_garbage_collector(tmp_path):
    """read_flat pauses the cyclic collector while unpickling; it leaves it as it found it."""
    assert gc.isenabled()
    assert read_flat(FIXTURE).has_trace and gc.isenabled()
    (tmp_path / "bad.pickle").write_bytes(b"not a pickle")
    with pytest.raises(UserError):
        read_flat(tmp_path / "bad.pickle")
    assert gc.isenabled()
    gc.disable()
    try:
        read_flat(FIXTURE)
        assert not gc.isenabled()
    finally:
        gc.enable()
