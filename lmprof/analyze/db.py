"""The DuckDB connection every analysis shares.

nsys tables (loaded by ``lmprof.analyze.nsys``) and memory tables (``lmprof.analyze.memory``)
live in one database, so a user can query kernels and allocations together with ``analyze sql``.
In memory by default; ``--db FILE`` persists it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb

from lmprof import rundir
from lmprof.analyze import magic, sqlfile
from lmprof.errors import UserError, damaged_input, machine_error, raise_machine_error


def connect(path: str | Path | None = None,
            extension: Path | None = None) -> duckdb.DuckDBPyConnection:
    """In memory, or the DuckDB file ``path`` (``--db``), created if absent. An existing file
    that is not a DuckDB database is refused before DuckDB sees it (it would try to open an
    SQLite file, such as the export itself, through an extension).

    ``extension``: a DuckDB extension file to load first, without checking its signature, after
    which unsigned extensions are refused for the rest of the connection's life (DuckDB allows
    turning that off, never on again). For the sqlite scanner of an installed wheel
    (``lmprof.analyze.nsys.connect``): its signature check hashes the 35 MB file on every core
    (0.08-0.10 s of wall and 0.15-0.20 s of CPU on the 2-core VM, per database, against 2 ms
    unchecked), and proves nothing pip's hash check of the wheel did not: whoever could replace
    that file could replace DuckDB itself."""
    if path and (problem := magic.not_a_file(path)):
        raise UserError(f"--db {problem}")
    if path and Path(path).is_file() and Path(path).stat().st_size:
        found = magic.file_kind(path)
        if found != "duckdb":
            what = "an SQLite file (an nsys export?)" if found == "sqlite" else \
                "not a DuckDB database"
            raise UserError(f"--db {str(path)!r} exists and is {what}: give a new file name or a "
                            "DuckDB file written by --db")
    try:
        con = duckdb.connect(str(path) if path else ":memory:",
                             config={"allow_unsigned_extensions": True} if extension else {})
    except (duckdb.IOException, duckdb.InvalidInputException) as exc:
        if (machine := machine_error(exc)) is not None:  # (a full disk: exit 1)
            raise machine from None
        raise UserError(f"cannot open DuckDB database {str(path)!r}: {str(exc).splitlines()[0]}") from None
    if extension is not None:
        try:
            # the path as a literal: DuckDB imports pandas for any bound parameter
            con.execute(f"LOAD {sqlfile.literal(str(extension))}")
            con.execute("SET allow_unsigned_extensions = false")
        except duckdb.Error:
            con.close()
            raise  # (the caller names the extension: nsys.connect)
    return con


@contextlib.contextmanager
def staged(path: str | Path | None, inputs: Iterable[str | Path] = ()) -> Iterator[str | None]:
    """The file a command that keeps its database (``--db PATH``) opens, so that PATH changes
    only when the command ends well: a copy of PATH (or a new file) beside it, ``PATH.partial``,
    which replaces PATH once the block ends without error, and is removed otherwise. A run that
    fails halfway (a damaged snapshot or export) so leaves the tables of earlier runs as they
    were, and no new PATH. PATH itself stays open meanwhile (checked as ``connect`` checks it);
    a second command given PATH while one works on it is refused, one line (a turn, taken
    without waiting: ``rundir.taking_turns`` on the hidden ``.PATH.lock``). Without
    PATH: None (in memory). The caller closes its connection to the copy inside the block.
    PATH, the copy or a write-ahead log of either that is one of ``inputs`` (the files the
    command reads) is refused first (``rundir.refuse_overwrite``)."""
    if not path:
        yield None
        return
    target = Path(path)
    if target.is_symlink():  # the file it leads to is replaced, the link kept
        try:
            target = target.resolve()
        except (RuntimeError, OSError):  # (a loop: RuntimeError before Python 3.13)
            raise UserError(f"--db {str(path)!r} is a symbolic link that leads nowhere (a "
                            "loop): give a file") from None
    if not target.parent.is_dir():  # (else DuckDB's error would name the copy, PATH.partial)
        raise UserError(f"--db {str(path)!r}: no folder {str(target.parent)!r} to write it in")
    work = target.with_name(target.name + ".partial")
    lock = rundir.lock_beside(target)
    rundir.refuse_overwrite([path, work, Path(f"{work}.wal"), Path(f"{target}.wal"), lock],
                            inputs, "--db")
    # one command at a time works on the copy: a second would remove the first's (as one left
    # by a run that was killed) where PATH is new, and DuckDB's lock on PATH refuses it only
    # where PATH exists
    with rundir.taking_turns(lock, busy=f"--db {str(path)!r} is being written by another "
                             "command: give another file, or run this one once that one has "
                             "ended"):
        yield from _staged(target, work)


def _staged(target: Path, work: Path) -> Iterator[str]:
    """``staged``'s work on ``target`` through its copy ``work``, in its turn."""
    # (an empty file, as mktemp makes, is a new database: DuckDB refuses to open it)
    new = not target.exists() or (target.is_file() and not target.stat().st_size)
    holder = None if new else connect(target)

    def file_op(op: Callable[[], object]) -> None:
        try:
            op()
        except OSError as exc:
            raise_machine_error(exc, target)  # (a full disk: exit 1, naming PATH)
            raise UserError(f"cannot write --db {str(target)!r}: {exc.strerror or exc}") from None

    try:
        for leftover in (work, Path(f"{work}.wal")):  # of a run that was killed
            file_op(lambda f=leftover: f.unlink(missing_ok=True))
        if holder is not None:
            holder.execute("CHECKPOINT")  # a write-ahead log beside PATH goes into the copy too
            file_op(lambda: shutil.copyfile(target, work))
        else:  # (a folder that takes no file: DuckDB's error would name the copy, PATH.partial)
            file_op(lambda: work.open("xb").close())
            work.unlink()  # (DuckDB refuses an empty file: it makes the copy itself)
        try:
            yield str(work)
        except Exception as exc:  # noqa: BLE001 - DuckDB's words about the copy name PATH
            machine = machine_error(exc)
            if machine is not None and machine.filename and \
                    os.path.realpath(machine.filename).startswith(os.path.realpath(work)):
                # the copy (or its write-ahead log) could not be written: a full disk, exit 1
                raise OSError(machine.errno, machine.strerror, str(target)) from None
            message = damaged_input(exc)
            if message is None or str(work) not in message:
                raise
            raise UserError(message.replace(str(work), str(target))) from None
        if holder is not None:  # (its lock goes before the file it holds is replaced)
            holder.close()
            holder = None
        file_op(lambda: os.replace(work, target))
    finally:
        if holder is not None:
            holder.close()
        for leftover in (work, Path(f"{work}.wal")):
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)


@contextlib.contextmanager
def cursor(con: duckdb.DuckDBPyConnection, schema: str | None = None
           ) -> Iterator[duckdb.DuckDBPyConnection]:
    """A second connection to ``con``'s database (a DuckDB connection runs one statement at a
    time; statements on separate cursors run at once), using ``schema`` if given; closed after."""
    cur = con.cursor()
    try:
        if schema is not None:
            cur.execute(f"USE {schema}")
        yield cur
    finally:
        cur.close()


def at_once(tasks: list[Callable[[], None]], name: str) -> None:
    """Run ``tasks`` on threads at once (each on its own cursor, see ``cursor``); when all have
    ended, raise the first error in task order."""
    with ThreadPoolExecutor(len(tasks), thread_name_prefix=f"lmprof-{name}") as pool:
        futures = [pool.submit(task) for task in tasks]
    for future in futures:  # leaving the pool waited for every task
        if (error := future.exception()) is not None:
            raise error
