"""`analyze report -o DIR` while something else reads DIR or writes a report into it: a reader
sees one whole report, and two reports written at once leave one of them whole, its images
with it. The interleavings are forced (a section's stand-in, a hook where the report is put in
place); no timing decides them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lmprof import rundir
from lmprof.errors import UserError
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


def test_two_reports_written_into_one_folder_at_once_leave_one_whole(tmp_path, monkeypatch,
                                                                      meanwhile):
    """Another report put in place between this one's report.md and its removal of the images
    it did not draw: that report.md was left, its own image ('2.png') removed as this report's
    stale one, 'shared.png' whichever came last."""
    monkeypatch.setattr(report, "_sections", lambda: [("Stand-in", _section)])
    runs, out = _runs(tmp_path, 2), tmp_path / "rep"
    (out / "img").mkdir(parents=True)  # (so that both reports find their folders made)
    other = meanwhile(rundir, "retire_stale", lambda: report.build(runs, out))
    report.build(runs[:1], out)
    assert other() is None
    md = (out / "report.md").read_text()
    images = {p.name: p.read_text() for p in (out / "img").iterdir() if p.suffix == ".png"}
    n = md.split(" runs. ", 1)[0].rsplit("\n", 1)[-1]  # the report left: of 1 run or of 2
    assert images == {f"{n}.png": n, "shared.png": n}
    assert all(f"img/{name}" in md for name in images)
    assert sorted(p.name for p in out.iterdir()) == ["img", "report.md"]  # (no lock, no stage)


def _stopping(ctx: report.ReportContext) -> str:
    """``_section``, whose images are drawn; then, for a report of one run, a stop (as an input
    that cannot be read stops a section)."""
    text = _section(ctx)
    if len(ctx.runs) == 1:
        raise UserError("stand-in: an input that cannot be read")
    return text


def test_a_report_that_stops_in_a_folder_it_made_leaves_another_reports_files(tmp_path,
                                                                              monkeypatch,
                                                                              meanwhile):
    """A report into a folder it made, which stops after another report was written there in
    the meantime: it removed the folder, the other report with it."""
    monkeypatch.setattr(report, "_sections", lambda: [("Stand-in", _stopping)])
    runs, out = _runs(tmp_path, 2), tmp_path / "rep"
    other = meanwhile(report, "_overview", lambda: report.build(runs, out))
    with pytest.raises(UserError, match="stand-in"):
        report.build(runs[:1], out)
    assert other() is None
    assert sorted(p.name for p in out.iterdir()) == ["img", "report.md"]  # (no lock, no stage)
    assert {p.name: p.read_text() for p in (out / "img").glob("*.png")} == \
        {"2.png": "2", "shared.png": "2"}
    assert (out / "report.md").read_text().split("\n## Stand-in\n")[1].count("2 runs.") == 2000


def test_a_report_that_stops_alone_after_putting_its_images_in_place_leaves_nothing(
        tmp_path, monkeypatch):
    """A report into folders it made that stops in its turn, its images put in place and
    report.md not (a full disk): neither it nor the folders it made are left."""
    import errno

    monkeypatch.setattr(report, "_sections", lambda: [("Stand-in", _section)])
    real_write = rundir.write_text

    def write_text(path: Path, text: str) -> None:
        if path.name == "report.md":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_write(path, text)

    monkeypatch.setattr(rundir, "write_text", write_text)
    runs, out = _runs(tmp_path, 1), tmp_path / "new" / "rep"
    with pytest.raises(OSError, match="No space left"):
        report.build(runs, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]


def test_a_report_whose_folder_another_report_took_away_is_written_all_the_same(tmp_path,
                                                                                 monkeypatch,
                                                                                 meanwhile):
    """A report with no image, its folder made, then removed while its sections ran (as a
    report that stopped removes the folder it made, where nothing else is in it yet): its
    turn's lock could not be made and report.md not written ('No such file or directory')."""
    monkeypatch.setattr(report, "_sections", lambda: [("Stand-in", lambda ctx: "Text.")])
    runs, out = _runs(tmp_path, 1), tmp_path / "rep"
    other = meanwhile(report, "_overview", out.rmdir)
    report.build(runs, out)
    assert other() is None
    assert sorted(p.name for p in out.iterdir()) == ["report.md"]
    assert (out / "report.md").read_text().endswith("## Stand-in\n\nText.\n")


def test_a_report_waiting_for_its_turn_while_a_stopped_report_takes_the_folder_away_is_written(
        tmp_path, monkeypatch, waiting_on):
    """A report with no image waits for its turn on report.md while a report that stopped,
    in its turn, takes back what it put there; that one's turn ends and it removes the folder
    it made, then empty: the waiting report's turn could not be made again in it, and
    report.md was not written ('No such file or directory')."""
    import fcntl
    import os

    monkeypatch.setattr(report, "_sections", lambda: [("Stand-in", lambda ctx: "Text.")])
    runs, out = _runs(tmp_path, 1), tmp_path / "rep"
    out.mkdir()
    lock = rundir.lock_beside(out / "report.md")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)  # the stopped report's turn (rundir.taking_turns)
    fcntl.flock(fd, fcntl.LOCK_EX)
    finish = waiting_on(lock, lambda: report.build(runs, out))
    lock.unlink()  # its turn ends (the lock file removed, as taking_turns does) ...
    out.rmdir()  # ... and it removes the folder it made, empty now, before the waiter looks
    os.close(fd)
    raised = finish()
    assert raised is None
    assert sorted(p.name for p in out.iterdir()) == ["report.md"]
    assert (out / "report.md").read_text().endswith("## Stand-in\n\nText.\n")


def test_a_report_interrupted_after_listing_its_images_leaves_nothing_in_a_folder_it_made(
        tmp_path, monkeypatch):
    """A report into folders it made, stopped (Ctrl-C) in its turn once it had written the list
    of its images: its images and report.md were taken back, but the image folder kept that
    list, and so did the folders it made."""
    monkeypatch.setattr(report, "_sections", lambda: [("Stand-in", _section)])
    real_retire = rundir.retire_stale

    def retire_stale(folder, owner, written):
        real_retire(folder, owner, written)
        raise KeyboardInterrupt

    monkeypatch.setattr(rundir, "retire_stale", retire_stale)
    runs, out = _runs(tmp_path, 1), tmp_path / "new" / "rep"
    with pytest.raises(KeyboardInterrupt):
        report.build(runs, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
