"""What `analyze` writes (--out tables, --plots, --db) while another command reads or writes the
same place: a reader sees whole files, and two commands at once leave the results of one of
them whole. The interleavings are forced (a hook where a command puts its files in place, the
other command run there, in a thread where it must wait its turn); no timing decides them."""

from __future__ import annotations

from pathlib import Path

from lmprof import render, rundir


def test_a_reader_of_an_out_table_sees_one_whole_table_while_it_is_written_again(tmp_path):
    """--out's tables were emptied and written again in place: a reader part way through one
    read the start of one command's table and the rest of the next's."""
    out = tmp_path / "out"
    render.emit({"top_kernels": "| a |\n" * 2000}, "md", out, owner="kernels")
    with open(out / "top_kernels.md") as reader:
        head = reader.read(100)
        render.emit({"top_kernels": "| b |\n" * 2000}, "md", out, owner="kernels")
        read = head + reader.read()
    whole = read == "| a |\n" * 2000  # (not compared in the assert: its diff is slow)
    assert whole, read.count("b")


def test_two_commands_writing_tables_into_one_out_at_once_leave_one_whole(tmp_path, meanwhile):
    """Another command's tables written between this one's tables and its removal of the
    tables it did not write: the other's own table was removed as this one's stale one, and a
    table both write held the other's rows beside this one's other table."""
    out = tmp_path / "out"
    other = meanwhile(rundir, "retire_stale", lambda: render.emit(
        {"shared": "| other |\n", "theirs": "| other |\n"}, "md", out, owner="kernels"))
    render.emit({"shared": "| this |\n", "mine": "| this |\n"}, "md", out, owner="kernels")
    assert other() is None
    tables = {p.name: p.read_text() for p in out.iterdir() if not p.name.startswith(".")}
    assert tables in ({"shared.md": "| other |\n", "theirs.md": "| other |\n"},
                      {"shared.md": "| this |\n", "mine.md": "| this |\n"}), tables
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [".lmprof-kernels"]


def test_a_reader_of_a_streamed_sql_result_sees_one_whole_result(tmp_path):
    """`analyze sql --out` streamed csv and json rows into result.<fmt> itself as DuckDB fetched
    them: a reader of the last result read its start and the new query's rows after it (and,
    while the query ran, a file that stopped half way)."""
    from nsys_data import REPORT, run

    out = tmp_path / "out"
    query = "SELECT i * {} AS v FROM range(20000) t(i)"
    code, _, err = run("sql", str(REPORT), query.format(1), "--format", "csv", "--out", str(out))
    assert code == 0, err
    first = (out / "result.csv").read_text()
    with open(out / "result.csv") as reader:
        head = reader.read(100)
        code, _, err = run("sql", str(REPORT), query.format(3), "--format", "csv",
                           "--out", str(out))
        read = head + reader.read()
    assert code == 0, err
    whole = read == first  # (not compared in the assert: its diff is slow)
    assert whole, len(read)
    assert sorted(p.name for p in out.iterdir()) == [".lmprof-sql", "result.csv"]


DATA = Path(__file__).resolve().parents[1] / "data"
SNAPSHOTS = (DATA / "h200-small-fp32" / "memory.pickle.xz",
             DATA / "h200-lmprof-memory" / "memory.pickle.xz")


def _memory(*args) -> None:
    from lmprof.analyze.cli import analyze

    analyze.main(["memory", *map(str, args), "--format", "csv"], standalone_mode=False)


def test_a_reader_of_a_memory_plot_sees_one_whole_image_while_it_is_drawn_again(tmp_path):
    """--plots' PNGs were drawn into their names in place: a reader part way through one read
    the start of one command's image and the rest of the next's (and two commands drawing one
    name at once each wrote into the one file)."""
    plots = tmp_path / "plots"
    _memory(SNAPSHOTS[0], "--plots", plots)
    first = (plots / "memory_timeline.png").read_bytes()
    with open(plots / "memory_timeline.png", "rb") as reader:
        head = reader.read(100)
        _memory(SNAPSHOTS[1], "--plots", plots)
        read = head + reader.read()
    assert read == first
    assert sorted(p.name for p in plots.iterdir()) == \
        [".lmprof-memory-plots", "memory_categories.png", "memory_timeline.png"]


def test_two_commands_plotting_into_one_folder_at_once_leave_one_whole(tmp_path, meanwhile):
    """Another command's plots drawn between this one's timeline and its categories plot: the
    folder was left with the other's timeline beside this one's categories."""
    from lmprof.reports import memory_plots

    alone = {}
    for i, snapshot in enumerate(SNAPSHOTS):  # (each command's plots, drawn on its own)
        _memory(snapshot, "--plots", tmp_path / f"alone{i}")
        alone[i] = {p.name: p.read_bytes() for p in (tmp_path / f"alone{i}").glob("*.png")}
    plots = tmp_path / "plots"
    other = meanwhile(memory_plots, "categories_png",
                      lambda: _memory(SNAPSHOTS[1], "--plots", plots))
    _memory(SNAPSHOTS[0], "--plots", plots)
    assert other() is None
    left = {p.name: p.read_bytes() for p in plots.glob("*.png")}
    assert left in (alone[0], alone[1]), {name: [i for i in alone if alone[i][name] == data]
                                          for name, data in left.items()}


def test_plots_put_into_an_out_while_another_command_removes_its_old_ones_stay_listed(
        tmp_path, monkeypatch, meanwhile):
    """`--out o --plots p` removes from o the plots an earlier command drew there. Another
    command putting its plots into o between this one's read of o's list of plots and its
    removal of them: this one then wrote its empty list over the other's, and the other's
    plots stayed in o unlisted, for no later command to remove ('--out o --plots p' again left
    them beside its tables)."""
    import lzma
    import pickle
    from types import SimpleNamespace

    out, plots = tmp_path / "o", tmp_path / "p"
    out.mkdir()
    old = "memory_timeline_1_earlier_dev0.png"  # (an earlier command's plot of two snapshots)
    (out / old).write_bytes(b"\x89PNG")
    (out / ".lmprof-memory-plots").write_text(f"{old}\n")
    snap = pickle.loads(lzma.decompress(SNAPSHOTS[0].read_bytes()))
    snap["device_traces"] = [[]]  # (no trace, no plots of its own: this command only removes)
    untraced = tmp_path / "untraced.pickle"
    untraced.write_bytes(pickle.dumps(snap))
    real_unlink, removing = Path.unlink, SimpleNamespace(plot=lambda path: None)

    def unlink(path, *args, **kwargs):  # (the removal of a plot passes by removing.plot)
        if path.suffix == ".png":
            removing.plot(path)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", unlink)
    other = meanwhile(removing, "plot", lambda: _memory(SNAPSHOTS[0], "--plots", out))
    _memory(untraced, "--out", out, "--plots", plots)
    assert other() is None
    left = sorted(p.name for p in out.glob("*.png"))
    assert left == ["memory_categories.png", "memory_timeline.png"]
    assert (out / ".lmprof-memory-plots").read_text().split() == left
    _memory(untraced, "--out", out, "--plots", plots)
    assert list(out.glob("*.png")) == []


def test_a_second_command_keeping_a_new_database_while_one_writes_it_is_one_line(tmp_path):
    """Two commands with one new --db FILE at once: the second removed the first's working
    copy (FILE.partial, 'one left behind by a run that was killed') and made its own; then
    one failed 'cannot write --db', another DuckDB's lock error on the copy, or a traceback,
    and at times neither left FILE. The second is refused, one line, exit 2, as it is for a
    FILE that exists (DuckDB's lock); the first ends well."""
    import os
    import subprocess
    import sys

    import duckdb

    from lmprof.analyze import db
    from nsys_data import REPORT

    path = tmp_path / "k.duckdb"
    root = Path(__file__).resolve().parents[2]
    with db.staged(path) as work:
        con = db.connect(work)
        con.execute("CREATE TABLE mine AS SELECT 1 AS x")
        proc = subprocess.run(  # the other command, started now
            [sys.executable, "-m", "lmprof.analyze", "kernels", str(REPORT), "--table",
             "gemm_fraction", "--db", str(path)], cwd=root, capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(root)}, timeout=300)
        con.close()
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr == f"error: --db {str(path)!r} is being written by another command: " \
                          "give another file, or run this one once that one has ended\n"
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("SELECT table_name FROM duckdb_tables()").fetchall() == [("mine",)]
    con.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.duckdb"]


def test_tables_and_plots_into_one_out_are_put_there_in_one_turn(tmp_path, waiting_on):
    """`analyze memory --out o` wrote its tables in one turn and its plots in another: a
    command at once with it could put its own between them, and o held one command's tables
    beside the other's plots. Now, while another command holds o's turn for plots, this one
    writes nothing there: neither tables nor plots."""
    out = tmp_path / "o"
    out.mkdir()
    lock = rundir.results_lock(out, "memory-plots")
    with rundir.taking_turns(lock):
        finish = waiting_on(lock, lambda: _memory(SNAPSHOTS[0], "--out", out))
        written = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    raised = finish()
    assert raised is None
    assert written == []
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert "memory_timeline.png" in names and "memory_peak.csv" in names, names
