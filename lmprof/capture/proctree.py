"""Ending a process together with every process it started, whatever their session.

A kill of a process group misses what left it: nsys starts its agent (``nsys --start-agent``)
and the profiled program in sessions of their own, so a timed-out sweep cell under nsys, or a
``capture run --nsys`` stopped by Ctrl-C or SIGTERM, left the agent running (seen on an H200).
:func:`kill_tree` finds the processes under a pid through /proc's parent ids, stops them
(SIGSTOP: none forks meanwhile), looks again for any forked before the stop, then kills all.
nsys's agent is not under nsys: on an H100 (nsys 2025.3.1) its parent is 1 from the start, a
session of its own, named after the nsys process (``--session-name profile-<pid of nsys>``), so
it is found by that name (:func:`nsys_agents`) and killed with them. Checked on an H100
(2026-12-07, nsys 2025.3.1): after a timed-out sweep cell under nsys and after SIGTERM of
``capture run --nsys``, no nsys process is left; what remains is a named semaphore per killed
profiled process (``/dev/shm/sem.NSys-process_waiter-<pid>-...``, a few bytes), nsys's own.
Without /proc (not Linux) it kills what it can: the process, and its group where asked.
"""

from __future__ import annotations

import contextlib
import os
import signal


def kill_tree(pid: int, group: bool = False) -> None:
    """SIGKILL ``pid``, every process under it, the nsys agents of those processes
    (:func:`nsys_agents`), and with ``group`` its process group (whose leader ``pid`` is).
    Processes that ended meanwhile are skipped."""
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
    agents = nsys_agents({pid, *found})  # (while the stopped processes keep their pids)
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for other in (pid, *found, *agents):
        _signal(other, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def nsys_agents(pids: set[int]) -> list[int]:
    """The processes ``nsys --start-agent --session-name profile-P`` whose P is one of
    ``pids`` (the agent an ``nsys profile`` of pid P started), from /proc's command lines;
    [] where there is no /proc."""
    names = {f"profile-{p}".encode() for p in pids}
    found = []
    for name in _pids():
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue  # (ended meanwhile)
        if b"--start-agent" not in args:
            continue
        if {args[i + 1] for i, a in enumerate(args[:-1]) if a == b"--session-name"} & names:
            found.append(int(name))
    return found


def _pids() -> list[str]:
    try:
        return [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (its children, theirs, ...), whatever their session or
    group, from /proc's parent ids; [] where there is no /proc."""
    children: dict[int, list[int]] = {}
    for name in _pids():
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
