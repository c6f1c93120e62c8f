"""Ending a process together with every process it started, whatever their session.

A kill of a process group misses what left it: nsys starts its agent (``nsys --start-agent``)
and the profiled program in sessions of their own, so a timed-out sweep cell under nsys, or a
``capture run --nsys`` stopped by Ctrl-C or SIGTERM, left the agent running (seen on an H200).
:func:`kill_tree` finds the processes under a pid through /proc's parent ids, stops them
(SIGSTOP: none forks meanwhile), looks again for any forked before the stop, then kills all.
Without /proc (not Linux) it kills what it can: the process, and its group where asked.
"""

from __future__ import annotations

import contextlib
import os
import signal


def kill_tree(pid: int, group: bool = False) -> None:
    """SIGKILL ``pid``, every process under it, and with ``group`` its process group (whose
    leader ``pid`` is). Processes that ended meanwhile are skipped."""
    def stop_root() -> None:  # (first: a stopped process forks no more children)
        if group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGSTOP)
        _signal(pid, signal.SIGSTOP)

    found: set[int] = set()
    for _ in range(3):
        stop_root()
        more = set(descendants(pid)) - found
        if found and not more:
            break
        found |= more
        for other in more:
            _signal(other, signal.SIGSTOP)
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for other in (pid, *found):
        _signal(other, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (its children, theirs, ...), whatever their session or
    group, from /proc's parent ids; [] where there is no /proc."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            ppid = int(stat.rsplit(b")", 1)[1].split()[1])  # (the name may hold ') ')
        except (OSError, IndexError, ValueError):
            continue  # (ended meanwhile)
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found
