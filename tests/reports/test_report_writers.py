"""`analyze report -o DIR` while something else reads DIR or writes a report into it: a reader
sees one whole report, and two reports written at once leave one of them whole, its images
with it. The interleavings are forced (a section's stand-in, a hook where the report is put in
place); no timing decides them."""

from __future__ import annotations

import fcntl
import shutil
import threading
from pathlib import Path

from lmprof import rundir
from lmprof.reports import report

RUN = Path(__file__).resolve().parents[1] / "data" / "h200-oom" / "warmup0" / "run.json"


def _runs(tmp_path: Path, n: int) -> list[str]:
    out = []
    for i in range(n):
        run = tmp_path / "runs" / f"run{i}"
        run.mkdir(parents=True)
        shutil.copy(RUN, run / "run.json")
        out.append(str(run))
    return out


def _section(ctx: report.ReportContext) -> str:
    """A stand-in section: images named by how many runs the report has ("<n>.png") and one
    name every report draws ("shared.png"), each holding the number; text long enough that a
    reader reads it in parts."""
    n = len(ctx.runs)
    links = [ctx.image(name, lambda path: path.write_text(str(n)) or True)
             for name in (f"{n}.png", "shared.png")]
    return "\n".join(f"![]({link})" for link in links) + "\n" + f"{n} runs. " * 2000


def test_a_reader_of_report_md_sees_one_whole_report_while_it_is_written_again(tmp_path,
                                                                                 monkeypatch):
    """report.md was emptied and written again in place: a reader part way through read the
    start of one report and the rest of the next."""
    monkeypatch.setattr(report, "_sections", lambda: [("Stand-in", _section)])
    runs, out = _runs(tmp_path, 2), tmp_path / "rep"
    report.build(runs[:1], out)
    first = (out / "report.md").read_text()
    with open(out / "report.md") as reader:
        head = reader.read(200)
        report.build(runs, out)  # written again while the reader is at byte 200
        rest = reader.read()
    assert head + rest == first
    assert (out / "report.md").read_text() != first
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".img")) == []


def test_two_reports_written_into_one_folder_at_once_leave_one_whole(tmp_path, monkeypatch):
    """Another report put in place between this one's report.md and its removal of the images
    it did not draw: that report.md was left, its own image ('2.png') removed as this report's
    stale one, 'shared.png' whichever came last."""
    monkeypatch.setattr(report, "_sections", lambda: [("Stand-in", _section)])
    runs, out = _runs(tmp_path, 2), tmp_path / "rep"
    (out / "img").mkdir(parents=True)  # (so that both reports find their folders made)
    other_done, other_waits = threading.Event(), threading.Event()
    real_flock, real_retire = fcntl.flock, rundir.retire_stale
    errors = []

    def other_report() -> None:
        try:
            report.build(runs, out)
        except BaseException as exc:  # noqa: BLE001 — checked below
            errors.append(exc)
        finally:
            other_done.set()

    other = threading.Thread(target=other_report)

    def flock(fd, op):
        if threading.current_thread() is other and op & fcntl.LOCK_EX:
            other_waits.set()  # (the other report is at its turn to put its files in place)
        return real_flock(fd, op)

    def retire_stale(folder, owner, written):
        if not other.is_alive() and not other_done.is_set():
            other.start()  # the other report, started now, runs until done or made to wait
            while not (other_done.wait(0.05) or other_waits.is_set()):
                pass
        return real_retire(folder, owner, written)

    monkeypatch.setattr(fcntl, "flock", flock)
    monkeypatch.setattr(rundir, "retire_stale", retire_stale)
    report.build(runs[:1], out)
    other.join()
    assert errors == []
    md = (out / "report.md").read_text()
    images = {p.name: p.read_text() for p in (out / "img").iterdir() if p.suffix == ".png"}
    n = md.split(" runs. ", 1)[0].rsplit("\n", 1)[-1]  # the report left: of 1 run or of 2
    assert images == {f"{n}.png": n, "shared.png": n}
    assert all(f"img/{name}" in md for name in images)
    assert sorted(p.name for p in out.iterdir()) == ["img", "report.md"]  # (no lock, no stage)
