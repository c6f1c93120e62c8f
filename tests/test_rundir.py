"""lmprof.rundir's writers when another process writes the same place at the same moment.

Processes on machines that share a folder (a job array on a cluster's file system, Kubernetes
pods each with its own process ids) can have the same pid: the interleavings are forced here
in one process, whose two writers have one pid as those processes do."""

from __future__ import annotations

import json
import os
from pathlib import Path

from lmprof import rundir


def test_two_writers_of_one_json_file_with_one_pid_both_succeed(tmp_path, monkeypatch):
    """write_json's temp file was named by the pid alone: the other writer's temp file was this
    one's, emptied and renamed away, and this one's rename then failed ('cannot write',
    exit 2), a shard of a sweep ending before its first cell."""
    path = tmp_path / "sweep.json"
    real = os.replace
    other = []

    def replace(src, dst):
        if not other:  # the other process writes the same file in between
            other.append(1)
            rundir.write_json(path, {"who": "other"})
        return real(src, dst)

    monkeypatch.setattr(rundir.os, "replace", replace)
    rundir.write_json(path, {"who": "this"})
    assert json.loads(path.read_text()) == {"who": "this"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json"]


def test_two_checks_of_one_out_folder_with_one_pid_both_pass(tmp_path, monkeypatch):
    """check_writable_dir's probe was named by the pid alone: the other run removed this one's
    probe, whose removal then failed, and a folder both could write was 'not writable'."""
    out = tmp_path / "runs"
    real = Path.unlink
    other = []

    def unlink(self, missing_ok=False):
        if self.name.startswith(".lmprof-write-test.tmp-") and not other:
            other.append(1)
            rundir.check_writable_dir(out)  # the other run checks the folder in between
        return real(self, missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    assert rundir.check_writable_dir(out) == out
    assert other and list(out.iterdir()) == []


def test_two_runs_marking_latest_with_one_pid_leave_a_whole_link(tmp_path, monkeypatch):
    """mark_latest's link was made under a name of the pid alone: the other run removed it and
    made its own, which this run's rename then moved, and the other's rename found nothing (a
    warning, 'cannot point latest at the run')."""
    out = tmp_path / "runs"
    mine, theirs = out / "20261206T000000Z-a-0001", out / "20261206T000000Z-b-0002"
    for d in (mine, theirs):
        d.mkdir(parents=True)
    real = os.replace
    problems = []

    def replace(src, dst):
        if not problems:  # the other run marks its run in between
            problems.append("started")
            problems.append(rundir.mark_latest(out, theirs))
        return real(src, dst)

    monkeypatch.setattr(rundir.os, "replace", replace)
    assert rundir.mark_latest(out, mine) is None and problems == ["started", None]
    assert (out / "latest").resolve() == mine.resolve()
    assert sorted(p.name for p in out.iterdir()) == sorted([mine.name, theirs.name, "latest"])


def test_two_writers_listing_their_files_with_one_pid_both_keep_a_list(tmp_path, monkeypatch):
    """retire_stale's list was written beside it under a name of the pid alone, opened only if
    new: the other writer's open then failed and its list was silently not written."""
    folder = tmp_path / "tables"
    folder.mkdir()
    real = os.replace
    other = []

    def replace(src, dst):
        if not other:
            other.append(1)
            rundir.retire_stale(folder, "kernels", ["b.csv"])
            assert (folder / ".lmprof-kernels").read_text() == "b.csv\n"
        return real(src, dst)

    monkeypatch.setattr(rundir.os, "replace", replace)
    rundir.retire_stale(folder, "kernels", ["a.csv"])
    assert (folder / ".lmprof-kernels").read_text() == "a.csv\n"
    assert sorted(p.name for p in folder.iterdir()) == [".lmprof-kernels"]


def test_a_turn_taken_on_a_lock_file_its_holder_removed_is_taken_anew(tmp_path, monkeypatch):
    """taking_turns removes its lock file as its turn ends: one that waited on that file, then
    locked it, holds a lock on a file that is gone, which a third takes beside it. It makes the
    file again and locks that."""
    import fcntl

    lock = tmp_path / ".report.md.lock"
    real = fcntl.flock
    calls = []

    def flock(fd, op):
        calls.append(op)
        if len(calls) == 1:
            lock.unlink()  # (the holder's turn ended while this one waited)
        return real(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with rundir.taking_turns(lock):
        assert lock.exists() and len(calls) == 2
        # another process's turn waits: its lock, tried without waiting, is refused
        fd = os.open(lock, os.O_RDWR)
        try:
            try:
                real(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("the lock was not held")
            except BlockingIOError:
                pass
        finally:
            os.close(fd)
    assert not lock.exists()
