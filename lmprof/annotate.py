"""The one annotation layer: ``phase(name)`` opens an NVTX range and notifies listeners.

Every range lmprof emits (training phases, attention sub-steps, inference passes) goes through
``phase``. It is also the single hook through which other stages tag work: a listener registered
with :func:`add_listener` is told about every enter and exit (the memory recorder uses it to tag
allocations with the current phase); a listener that raises closes the range all the same, and
each listener told of an enter is told of its exit. With no profiler attached and no listener, a
range costs one ``nvtx.push_range``/``pop_range`` pair: a whole ``phase`` took 0.70 µs on an H200 host
(``bench/nvtx_overhead.py``, ``bench/results/nvtx_overhead.md``) and 0.66 µs on a 2-core CPU VM (2026-12-06).

This module imports neither torch nor CUDA, so the model and the analysis can share the names.
"""

from __future__ import annotations

import functools
from contextlib import ContextDecorator
from typing import Callable, Protocol

import nvtx as _nvtx

# The names live in lmprof.phases (importable without nvtx); re-exported here.
from lmprof.phases import (  # noqa: E402,F401
    ATTENTION, ATTN_FINAL, ATTN_SCORES, ATTN_SOFTMAX, BACKWARD, FORWARD, INFERENCE, OPTIMIZER,
    PHASES, STEP, WARMUP,
)


class Listener(Protocol):
    def enter(self, name: str) -> None: ...

    def exit(self, name: str) -> None: ...


_listeners: list[Listener] = []
_stack: list[str] = []


def add_listener(listener: Listener) -> None:
    """Register an object whose ``enter``/``exit`` run on every phase boundary."""
    _listeners.append(listener)


def remove_listener(listener: Listener) -> None:
    _listeners.remove(listener)


def current() -> tuple[str, ...]:
    """The open ranges, outermost first."""
    return tuple(_stack)


def _tell_exit(name: str, listeners: list[Listener]) -> BaseException | None:
    """Call each listener's ``exit``, innermost first, each even where one before it raised;
    return the first error."""
    error = None
    for listener in reversed(listeners):
        try:
            listener.exit(name)
        except BaseException as exc:
            if error is None:
                error = exc
    return error


class phase(ContextDecorator):
    """``with phase("forward"): ...`` or ``@phase("ffn")``: an NVTX push/pop range."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> "phase":
        _nvtx.push_range(self.name)
        _stack.append(self.name)
        told = 0
        try:
            for listener in _listeners:
                told += 1
                listener.enter(self.name)
        except BaseException:
            # no __exit__ follows: the range closes here, and those told of the enter (the one
            # that raised too) of its exit; the enter's error is the one raised
            _tell_exit(self.name, _listeners[:told])
            _stack.pop()
            _nvtx.pop_range()
            raise
        return self

    def __exit__(self, *exc) -> None:
        error = _tell_exit(self.name, _listeners) if _listeners else None
        _stack.pop()
        _nvtx.pop_range()
        if error is not None:  # (after the range is closed: none stays open)
            raise error

    # ContextDecorator's default wraps through _recreate_cm; keep the wrapper explicit and cheap.
    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        return wrapped
