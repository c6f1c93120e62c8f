"""The annotation layer: ``phase`` keeps its NVTX ranges, its stack and its listeners in step."""

import pytest

from lmprof import annotate


class Listener:
    """Records each enter and exit; with ``on`` ("enter" or "exit") raises there after it."""

    def __init__(self, on=None):
        self.events, self.on = [], on

    def enter(self, name):
        self._note("enter", name)

    def exit(self, name):
        self._note("exit", name)

    def _note(self, what, name):
        self.events.append((what, name))
        if what == self.on:
            raise RuntimeError(f"{what} failed")


@pytest.fixture
def nvtx_depth(monkeypatch):
    """The NVTX ranges open (pushes less pops), counted instead of sent to NVTX."""
    depth = [0]

    class Counting:
        @staticmethod
        def push_range(name):
            depth[0] += 1

        @staticmethod
        def pop_range():
            depth[0] -= 1

    monkeypatch.setattr(annotate, "_nvtx", Counting)
    return depth


@pytest.mark.parametrize("on", ["enter", "exit"])
def test_a_listener_that_raises_leaves_no_range_open(nvtx_depth, on):
    """A listener whose enter or exit raised left the phase's NVTX range pushed and its name in
    current() for good (every later range nested under it in a trace), and the listeners not
    yet called were never told the phase's exit (the memory recorder kept tagging it)."""
    first, failing = Listener(), Listener(on)
    annotate.add_listener(first)
    annotate.add_listener(failing)
    try:
        with pytest.raises(RuntimeError, match=f"{on} failed"), annotate.phase("outer"):
            pass
        assert annotate.current() == () and nvtx_depth[0] == 0
        # every listener told of the enter is told of the exit, the one that raised included
        assert first.events == failing.events == [("enter", "outer"), ("exit", "outer")]
        annotate.remove_listener(failing)
        with annotate.phase("next"):  # (a range after it is no child of the failed one)
            assert annotate.current() == ("next",)
    finally:
        for listener in (first, failing):
            if listener in annotate._listeners:
                annotate.remove_listener(listener)
    assert annotate.current() == () and nvtx_depth[0] == 0


def test_an_exception_in_a_phase_closes_it_and_tells_the_listeners(nvtx_depth):
    rec = Listener()
    annotate.add_listener(rec)
    try:
        with pytest.raises(ValueError), annotate.phase("a"), annotate.phase("b"):
            raise ValueError
    finally:
        annotate.remove_listener(rec)
    assert rec.events == [("enter", "a"), ("enter", "b"), ("exit", "b"), ("exit", "a")]
    assert annotate.current() == () and nvtx_depth[0] == 0
