"""CUDA memory history recording around the measured steps (``capture run --memory``).

Phase attribution uses two signals, both written here:
- the phase windows in run.json (epoch ns, the clock of the snapshot's ``time_us``): exact for
  every thread, including PyTorch's autograd thread that allocates during backward;
- ``torch.cuda.memory._set_memory_metadata(phase)`` (torch ≥ 2.11), set through the annotation
  layer, so each trace entry's ``user_metadata`` names the phase current when it was allocated.
The analysis prefers the windows and falls back to ``user_metadata`` when a snapshot comes
without its run.json.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lmprof import annotate

SNAPSHOT_FILE = "memory.pickle"
_TAGGED = {annotate.STEP, *annotate.PHASES}


class MemoryRecorder:
    def __init__(self, run_dir: Path, max_entries: int, stacks: str, steps: int,
                 measured: int | None = None):
        """Record the first ``steps`` of the ``measured`` steps (default: all ``steps``). When
        that is all of them, the snapshot is dumped by ``artifacts`` (after the measured steps'
        other hooks: under nsys, after the capture range has ended), else right after step
        ``steps`` (inside the capture range, between two step ranges)."""
        self.path = run_dir / SNAPSHOT_FILE
        self.max_entries = max_entries
        self.stacks = stacks
        self.steps = steps
        self.measured = steps if measured is None else measured
        self._tags: list[str] = []
        self._set_meta = getattr(torch.cuda.memory, "_set_memory_metadata", None)
        self.recording = False
        self.dumped = False  # a snapshot of the recorded steps is written

    # annotation listener: tag allocations with the innermost phase
    def enter(self, name: str) -> None:
        if name in _TAGGED:
            self._tags.append(name)
            self._set_meta(name)

    def exit(self, name: str) -> None:
        if name in _TAGGED and self._tags:
            self._tags.pop()
            self._set_meta(self._tags[-1] if self._tags else "")

    def start(self) -> None:
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks=self.stacks, max_entries=self.max_entries
        )
        if self._set_meta is not None:
            annotate.add_listener(self)
        self.recording = True

    def after_step(self, index: int) -> None:
        if self.recording and index + 1 >= self.steps and self.steps < self.measured:
            self.stop()

    def stop(self, synchronize: bool = True) -> None:
        if not self.recording:
            return
        try:
            if synchronize:
                torch.cuda.synchronize()
            torch.cuda.memory._dump_snapshot(str(self.path))
            self.dumped = True
        finally:  # a dump that fails (a full disk) still ends the recording and its tagging
            self.recording = False
            torch.cuda.memory._record_memory_history(enabled=None)
            if self._set_meta is not None:
                annotate.remove_listener(self)
                self._set_meta("")

    def artifacts(self) -> dict[str, str]:
        self.stop()
        extra = {"memory_snapshot": SNAPSHOT_FILE}
        return extra

    def on_failure(self, exc: BaseException) -> dict[str, str]:
        """A step failed. Out of memory, or while recording: dump the snapshot now, while the
        failed step's tensors are still alive (its traceback holds them) — the allocator state
        at the failure, with the trace (and its 'oom' entry) if recording had started; an OOM
        in warm-up gives the state alone. A snapshot of steps recorded before (--memory-steps)
        is kept as it is."""
        from lmprof.capture import devices

        if self.recording:
            # no synchronize: after a CUDA error it would raise; the allocator's state is the
            # host's and needs none
            self.stop(synchronize=False)
        elif not self.dumped:  # a recording that ended (--memory-steps) keeps its trace
            if not devices.is_oom(exc):
                return {}
            torch.cuda.memory._dump_snapshot(str(self.path))
        return {"memory_snapshot": SNAPSHOT_FILE}
