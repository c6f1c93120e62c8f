"""The step runner on CPU with the tiny model: statuses, schema, warm-up, phase nesting, OOM."""

import functools
import json

import pytest
import torch

from lmprof import annotate, rundir
from lmprof.capture import runner
from lmprof.capture.runner import Hooks, RunSpec, execute, prepare


class Recorder:
    def __init__(self):
        self.events = []

    def enter(self, name):
        self.events.append(("enter", name))

    def exit(self, name):
        self.events.append(("exit", name))


def run(tmp_path, **kw):
    opts = dict(size="tiny", context_length=16, batch_size=2, warmup=2, steps=3, device="cpu")
    spec = RunSpec(**{**opts, **kw})
    prep = prepare(spec)
    run_dir = runner.new_run_dir(tmp_path, prep)
    record = execute(prep, run_dir, Hooks(), progress=False)
    rundir.write_run(run_dir, record)
    return run_dir, record


def test_train_run_record_and_schema(tmp_path):
    run_dir, record = run(tmp_path)
    loaded = rundir.load_run(run_dir)
    assert loaded["schema_version"] == rundir.SCHEMA_VERSION
    assert loaded["status"] == "OK" and loaded["error"] is None
    for key in ("run_id", "created_utc", "config", "model", "flops", "environment", "timings",
                "phase_windows", "artifacts"):
        assert key in loaded
    t = loaded["timings"]
    assert len(t["warmup_steps_s"]) == 2 and len(t["steps"]) == 3
    assert t["warmup_s"] == pytest.approx(sum(t["warmup_steps_s"]))
    assert set(t["summary"]) == {"forward", "backward", "optimizer", "step"}
    s = t["summary"]["step"]
    assert s["n"] == 3 and s["min_s"] <= s["median_s"] <= s["max_s"]
    assert t["total_s"] >= t["warmup_s"] + sum(m["step_s"] for m in t["steps"])
    # each step is at least the sum of its phases (measured inside it)
    for m in t["steps"]:
        assert m["step_s"] >= m["forward_s"] + m["backward_s"] + m["optimizer_s"]
    assert loaded["model"]["n_params"] > 0 and loaded["flops"]["backward_flops"] > 0
    assert loaded["environment"]["device"] == "cpu"


def test_phase_windows_nest_inside_their_step(tmp_path):
    _, record = run(tmp_path)
    windows = record["phase_windows"]
    assert {w["step"] for w in windows} == {0, 1, 2}  # measured steps only, no warm-up
    for i in range(3):
        mine = {w["phase"]: w for w in windows if w["step"] == i}
        assert set(mine) == {"step", "forward", "backward", "optimizer"}
        step = mine.pop("step")
        order = sorted(mine.values(), key=lambda w: w["start_ns"])
        assert [w["phase"] for w in order] == ["forward", "backward", "optimizer"]
        for w in order:
            assert step["start_ns"] <= w["start_ns"] <= w["end_ns"] <= step["end_ns"]


def test_ranges_are_nested_as_the_analysis_expects(tmp_path):
    rec = Recorder()
    annotate.add_listener(rec)
    try:
        run(tmp_path, warmup=0, steps=1)
    finally:
        annotate.remove_listener(rec)
    stack, parents = [], {}
    for kind, name in rec.events:
        if kind == "enter":
            parents.setdefault(name, set()).add(stack[-1] if stack else None)
            stack.append(name)
        else:
            assert stack.pop() == name  # properly nested
    assert parents["step"] == {None}
    assert parents["forward"] == parents["backward"] == parents["optimizer"] == {"step"}
    assert parents[annotate.ATTENTION] == {"forward"}
    for sub in (annotate.ATTN_SCORES, annotate.ATTN_SOFTMAX, annotate.ATTN_FINAL):
        assert parents[sub] == {annotate.ATTENTION}


def test_forward_mode_runs_inference_only(tmp_path):
    _, record = run(tmp_path, mode="forward")
    assert set(record["timings"]["summary"]) == {"inference", "step"}
    assert record["flops"]["backward_flops"] == 0


def test_forward_backward_mode_has_no_optimizer(tmp_path):
    _, record = run(tmp_path, mode="forward-backward")
    assert set(record["timings"]["summary"]) == {"forward", "backward", "step"}


def test_oom_is_a_result_not_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv(runner.FAULT_ENV, "oom")
    run_dir, record = run(tmp_path)
    assert record["status"] == "OOM"
    assert "out of memory" in record["error"].lower()
    assert record["config"]["size"] == "tiny"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "OOM"


def test_a_cpu_allocation_that_fails_is_oom(tmp_path):
    """The CPU allocator's failure is out of memory too (it was ERROR): 2^31 - 1 sequences of
    2^20 tokens ask for 16 PiB of token ids alone, beyond any address space (so no overcommit
    setting lets the allocation through)."""
    _, record = run(tmp_path, batch_size=2**31 - 1, context_length=2**20, warmup=0, steps=1)
    assert record["status"] == "OOM" and "can't allocate memory" in record["error"]


def test_a_step_beyond_64_bit_flops_still_writes_a_readable_run_json(tmp_path):
    """The OOM run above counts more FLOPs per step than 64 bits hold: run.json kept them as
    integers that its reader refuses ('flops.forward_flops' is an integer beyond 64 bits), so
    `analyze runs runs/` failed on the whole folder. Expected count by hand (tiny: d 64, d_ff
    256, 2 layers, vocab 10000): per token 2 layers × (8·d² + 6·d·d_ff + 4·T·d) + 2·d·V."""
    b, t = 2**31 - 1, 2**20
    run_dir, record = run(tmp_path, batch_size=b, context_length=t, warmup=0, steps=1)
    assert record["status"] == "OOM"
    loaded = rundir.load_run(run_dir)
    per_token = 2 * (8 * 64**2 + 6 * 64 * 256 + 4 * t * 64) + 2 * 64 * 10_000
    assert loaded["flops"]["forward_flops"] == pytest.approx(b * t * per_token, rel=1e-12)
    assert loaded["flops"]["backward_flops"] == pytest.approx(2 * b * t * per_token, rel=1e-12)


def test_two_runs_of_one_label_in_one_second_get_their_own_directories(tmp_path, monkeypatch):
    """Run ids are the second, the label and 4 random hex digits: runs started together (an
    array job of one label) may draw the same digits, and the second's mkdir was a
    FileExistsError traceback. Here the clock stands still and the draw repeats once."""
    import datetime as dt
    import types

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=tz)

    monkeypatch.setattr(rundir, "_dt", types.SimpleNamespace(datetime=Frozen,
                                                             timezone=dt.timezone))
    draws = iter(["beef", "beef", "cafe"])
    real = rundir.secrets.token_hex  # (for the temp names, of 4 bytes: rundir.temp_beside)
    monkeypatch.setattr(rundir.secrets, "token_hex", lambda n: next(draws) if n == 2 else real(n))
    first = rundir.create_run_dir(tmp_path, "same")
    second = rundir.create_run_dir(tmp_path, "same")
    assert first.name == "20260102T030405Z-same-beef"
    assert second.name == "20260102T030405Z-same-cafe" and second.is_dir()


def test_other_failures_are_status_error(tmp_path, monkeypatch):
    monkeypatch.setenv(runner.FAULT_ENV, "error")
    _, record = run(tmp_path)
    assert record["status"] == "ERROR" and "injected failure" in record["error"]


def test_bf16_autocast_on_cpu(tmp_path):
    _, record = run(tmp_path, dtype="bf16", warmup=0, steps=1)
    assert record["status"] == "OK"


def test_failure_hooks_see_the_exception_and_a_failed_phase_keeps_its_window(tmp_path,
                                                                                monkeypatch):
    """An OOM in the first measured step: on_failure hooks get the exception (and may add
    artifacts); a hook that itself fails is recorded, not raised; the step and forward windows
    end at the failure, marked failed."""
    monkeypatch.setenv(runner.FAULT_ENV, "oom")
    seen = []

    def snapshot(exc):
        seen.append(exc)
        return {"memory_snapshot": "memory.pickle"}

    def broken(exc):
        raise RuntimeError("cannot save\nsecond line")

    spec = RunSpec(size="tiny", context_length=16, batch_size=2, warmup=0, steps=2, device="cpu")
    prep = prepare(spec)
    record = execute(prep, runner.new_run_dir(tmp_path, prep),
                     Hooks(on_failure=[snapshot, broken]), progress=False)
    assert record["status"] == "OOM" and len(seen) == 1
    assert "injected" in str(seen[0])
    assert record["artifacts"] == {"memory_snapshot": "memory.pickle"}
    assert len(record["artifact_errors"]) == 1
    assert record["artifact_errors"][0].endswith("broken: RuntimeError: cannot save")
    windows = record["phase_windows"]
    assert [(w["phase"], w.get("failed")) for w in windows] == [("forward", True),
                                                               ("step", True)]
    assert all(w["start_ns"] <= w["end_ns"] for w in windows)
    (tmp_path / "r").mkdir()
    rundir.write_run(tmp_path / "r", record)
    assert rundir.load_run(tmp_path / "r")["status"] == "OOM"  # still a valid run.json


def test_failure_in_warmup_calls_the_hooks_without_windows(tmp_path, monkeypatch):
    monkeypatch.setenv(runner.FAULT_ENV, "error")
    seen = []
    spec = RunSpec(size="tiny", context_length=16, batch_size=2, warmup=1, steps=1, device="cpu")
    prep = prepare(spec)
    record = execute(prep, runner.new_run_dir(tmp_path, prep),
                     Hooks(on_failure=[lambda exc: seen.append(exc) or {}]), progress=False)
    assert record["status"] == "ERROR" and len(seen) == 1
    assert record["phase_windows"] == [] and record["artifacts"] == {}
    assert "artifact_errors" not in record
    # the warm-up steps done before the failure are kept (none here): analyze memory reads
    # from them whether the optimizer ever ran
    assert record["timings"]["warmup_steps_s"] == []


def test_failure_in_a_measured_step_keeps_the_steps_done_before_it(tmp_path, monkeypatch):
    """A run that fails in its third measured step kept no step times at all, though its
    phase_windows (and its nsys trace) hold the two steps that ended: they are kept, as the
    warm-up steps are; the summary stays a finished run's."""
    real = runner.StepRunner.step

    def step(self, i, warmup):
        if i == 2 and not warmup:
            raise RuntimeError("failed in step 2")
        return real(self, i, warmup=warmup)

    monkeypatch.setattr(runner.StepRunner, "step", step)
    run_dir, record = run(tmp_path, warmup=1, steps=4)
    loaded = rundir.load_run(run_dir)
    assert loaded["status"] == "ERROR" and "failed in step 2" in loaded["error"]
    steps = loaded["timings"]["steps"]
    assert [s["step"] for s in steps] == [0, 1] and all(s["step_s"] > 0 for s in steps)
    assert sorted({w["step"] for w in loaded["phase_windows"]}) == [0, 1]
    assert "summary" not in loaded["timings"]


def test_memory_recorder_on_failure_keeps_the_right_snapshot(tmp_path, monkeypatch):
    """The recorder's failure path without a GPU (torch.cuda's memory calls faked): recording
    -> dumped then stopped, without a synchronize; an OOM before recording -> the state dumped;
    after --memory-steps ended the recording -> that snapshot kept, not overwritten; any other
    failure before recording -> nothing."""
    import torch

    from lmprof.capture.memory import MemoryRecorder

    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda p: calls.append("dump"))
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda enabled=None, **k: calls.append(f"history {enabled}"))
    monkeypatch.setattr(torch.cuda.memory, "_set_memory_metadata", lambda s: None,
                        raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    oom, other = torch.OutOfMemoryError("CUDA out of memory."), RuntimeError("bad")

    rec = MemoryRecorder(tmp_path, 100, "python", steps=2)
    rec.start()
    assert rec.on_failure(other) == {"memory_snapshot": "memory.pickle"}
    assert calls == ["history all", "dump", "history None"] and not rec.recording

    calls.clear()
    rec = MemoryRecorder(tmp_path, 100, "python", steps=2)
    assert rec.on_failure(other) == {} and calls == []
    assert rec.on_failure(oom) == {"memory_snapshot": "memory.pickle"} and calls == ["dump"]

    calls.clear()
    rec = MemoryRecorder(tmp_path, 100, "python", steps=1, measured=2)
    rec.start()
    rec.after_step(0)  # --memory-steps 1: the recorded step's snapshot is written
    assert calls == ["history all", "sync", "dump", "history None"]
    calls.clear()
    assert rec.on_failure(oom) == {"memory_snapshot": "memory.pickle"} and calls == []


def test_memory_recorder_dumps_at_the_end_of_a_whole_recording_and_stops_after_a_failed_dump(
        tmp_path, monkeypatch):
    """Every measured step recorded: no dump after the last step (under nsys that is still
    inside the capture range), one by ``artifacts``. A dump that fails (a full disk) raises, and
    the recording and the phase tagging still end."""
    import torch

    from lmprof import annotate
    from lmprof.capture.memory import MemoryRecorder

    calls, tags = [], []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda enabled=None, **k: calls.append(f"history {enabled}"))
    monkeypatch.setattr(torch.cuda.memory, "_set_memory_metadata", tags.append, raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda p: calls.append("dump"))

    rec = MemoryRecorder(tmp_path, 100, "python", steps=2, measured=2)
    rec.start()
    rec.after_step(0)
    rec.after_step(1)
    assert calls == ["history all"] and rec.recording
    assert rec.artifacts() == {"memory_snapshot": "memory.pickle"}
    assert calls == ["history all", "dump", "history None"] and not rec.recording

    def full_disk(path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", full_disk)
    calls.clear(), tags.clear()
    rec = MemoryRecorder(tmp_path, 100, "python", steps=1, measured=2)
    rec.start()
    with pytest.raises(OSError), annotate.phase(annotate.STEP):
        rec.after_step(0)
    assert calls == ["history all", "history None"] and not rec.recording and not rec.dumped
    assert tags == [annotate.STEP, ""]  # the listener is gone: the pop tagged nothing


def test_fp16_training_scales_the_loss_and_records_skipped_updates(tmp_path, monkeypatch):
    # fp16 autocast training without torch.amp.GradScaler: its gradients underflow, and the
    # profile lacked the unscale / inf-check kernels of a real fp16 optimizer step
    calls = []

    class Counting(torch.amp.GradScaler):
        def scale(self, outputs):
            calls.append("scale")
            return super().scale(outputs)

        def update(self, new_scale=None):
            calls.append("update")
            return super().update(new_scale)

    monkeypatch.setattr(runner.torch.amp, "GradScaler", Counting)
    run_dir, record = run(tmp_path, dtype="fp16", mode="train", warmup=1, steps=2)
    assert record["status"] == "OK"
    assert rundir.load_run(run_dir)["timings"]["steps"] == record["timings"]["steps"]
    assert calls == ["scale", "update"] * 3  # warm-up and measured steps alike
    assert [type(s["optimizer_skipped"]) for s in record["timings"]["steps"]] == [bool, bool]
    assert "optimizer_skipped" not in record["timings"]["summary"]


def test_an_fp16_step_with_inf_gradients_is_recorded_as_skipped(tmp_path, monkeypatch):
    # a scale of inf makes every gradient inf or NaN: GradScaler skips each AdamW update
    monkeypatch.setattr(runner.torch.amp, "GradScaler",
                        functools.partial(torch.amp.GradScaler, init_scale=float("inf")))
    _, record = run(tmp_path, dtype="fp16", mode="train", warmup=0, steps=2)
    assert record["status"] == "OK"
    assert [s["optimizer_skipped"] for s in record["timings"]["steps"]] == [True, True]


def test_a_skipped_update_after_warm_up_updates_is_recorded_as_skipped(tmp_path, monkeypatch):
    class SkipsAfterTheFirst(torch.amp.GradScaler):  # as for inf/NaN gradients
        steps = 0

        def step(self, optimizer, *args, **kwargs):
            SkipsAfterTheFirst.steps += 1
            if SkipsAfterTheFirst.steps > 1:
                self.unscale_(optimizer)  # (the inf check update() needs, no AdamW update)
                return None
            return super().step(optimizer, *args, **kwargs)

    monkeypatch.setattr(runner.torch.amp, "GradScaler", SkipsAfterTheFirst)
    _, record = run(tmp_path, dtype="fp16", mode="train", warmup=1, steps=2)
    assert record["status"] == "OK"
    assert [s["optimizer_skipped"] for s in record["timings"]["steps"]] == [True, True]


@pytest.mark.parametrize("kw", [dict(dtype="bf16", mode="train"),
                                dict(dtype="fp16", mode="forward-backward")])
def test_no_gradient_scaling_without_fp16_training(tmp_path, kw):
    _, record = run(tmp_path, warmup=0, steps=1, **kw)
    assert record["status"] == "OK"
    assert "optimizer_skipped" not in record["timings"]["steps"][0]
