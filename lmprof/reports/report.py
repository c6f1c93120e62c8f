"""The markdown report: one section per kind of data present in the given inputs.

Inputs are run directories (a sweep directory or a directory of runs stands for its runs) and,
for data captured without ``capture run``, nsys exports (SQLite or ``.nsys-rep``) and CUDA
memory snapshots given as files: an export or snapshot that its run directory names is that run;
any other is a report input of its own, in the kernel or memory section.

A section is a function ``(ReportContext) -> str | None``; ``None`` means "no data of my kind".
Sections are listed in ``_sections`` in report order. Output is deterministic for the same
inputs: runs are in the benchmark table's order of configurations (then by run id), files
without a run in the order given, and nothing time-dependent is written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

from lmprof import rundir, sweepdir
from lmprof.analyze import magic
from lmprof.errors import UserError, machine_error, raise_machine_error
from lmprof.render import md_code, md_text


@dataclass
class ReportContext:
    runs: list[dict[str, Any]]
    out_dir: Path  # the report's folder; images go to out_dir / img_name
    images: list[Path] = field(default_factory=list)
    # files given without a run that names them: (path, the run.json beside it or None)
    exports: list[tuple[Path, dict[str, Any] | None]] = field(default_factory=list)
    snapshots: list[tuple[Path, dict[str, Any] | None]] = field(default_factory=list)
    # for the kernel section: lmprof.analyze.trace.Options (None: the defaults), and the nsys
    # that exports a run's .nsys-rep (--nsys-path; None: $NSYS, else PATH)
    kernel_options: Any = None
    nsys_path: str | None = None
    # the images' folder in out_dir: "img" for report.md, "<name>_img" for another name, so that
    # two reports written into one folder do not overwrite each other's images (image_folder)
    img_name: str = "img"
    # the GPU kernels section's tables of every export (``sections.kernels.analysed``): computed
    # once, for that section and the sweep's GEMM grid
    kernel_tables: Any = None
    # run_dir -> its SQLite export, None (no export file there) or the UserError of its export
    _run_exports: dict[str, Any] = field(default_factory=dict, repr=False)
    # where the images are drawn until every section is done (``stage_dir``)
    _stage: Path | None = field(default=None, repr=False)

    def run_export(self, record: dict[str, Any]) -> Path | UserError | None:
        """The SQLite export of run ``record`` (``nsys.run_export``: its ``.sqlite``, else its
        ``.nsys-rep`` exported, once, with ``nsys_path``), for every section that reads it;
        None where run.json names no export; the UserError of an export that failed or is
        gone, for the section to list."""
        key = record["run_dir"]
        if key not in self._run_exports:
            from lmprof.analyze import nsys

            named = (rundir.artifact_path(record, k) for k in ("nsys_sqlite", "nsys_rep"))
            result = None
            if any(path is not None for path in named):
                try:
                    result = nsys.run_export(record, self.nsys_path)
                except UserError as exc:
                    result = exc
            self._run_exports[key] = result
        return self._run_exports[key]

    @property
    def stage_dir(self) -> Path:
        """A hidden folder beside the report that holds its images until every section is done
        (``build`` then moves them into the image folder): a report that stops leaves an earlier
        report's images in that folder as they were."""
        if self._stage is None:  # (its own: a report written beside it has another)
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self._stage = Path(tempfile.mkdtemp(prefix=f".{self.img_name}.tmp-",
                                                dir=self.out_dir))
        return self._stage

    def drop_stage(self) -> None:
        """Remove the folder of ``stage_dir`` with what is left in it."""
        if self._stage is not None:
            shutil.rmtree(self._stage, ignore_errors=True)
            self._stage = None

    def image(self, name: str, draw: Callable[[Path], Any]) -> str | None:
        """Save a figure as ``name`` for the image folder with ``draw(path)``, which returns
        something false where it has nothing to draw; the relative link to put in the markdown
        (percent-encoded: a space, from ``-o "my report.md"``, would end the link), or None where
        nothing was drawn. Only drawn images are the report's: an earlier report's image of that
        name is removed (``build``)."""
        path = self.stage_dir / name
        try:
            drawn = draw(path)
        except OSError as exc:  # (matplotlib's failed write names no file: this one)
            if exc.filename is not None or exc.errno is None:
                raise
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        if not drawn:
            return None
        self.images.append(path)
        return quote(f"{self.img_name}/{name}")


def distinct_headings(headings: list[str], tags: list[tuple]) -> list[str]:
    """Markdown ``headings`` of a section's parts (a run's tables), those that would be equal
    (a run directory copied, a sweep run again: one run id for two runs) ending with what tells
    them apart (``rundir.distinguishing``; ``tags``, a run's ``rundir.run_tags``) as code, so
    that each heading, and its anchor, is its own. The others are left as they are."""
    return [h if t is None else f"{h} ({md_code(t)})"
            for h, t in zip(headings, rundir.distinguishing(headings, tags))]


def run_tags(record: dict[str, Any]) -> tuple:
    """``rundir.run_tags`` of a run of the report (by its run.json)."""
    return rundir.run_tags(record, Path(record["run_dir"]) / rundir.RUN_FILE)


def image_folder(target: Path) -> str:
    """The name of the folder beside the markdown file ``target`` that holds its images."""
    return "img" if target.name == "report.md" else f"{target.stem}_img"


Section = Callable[[ReportContext], "str | None"]


def _sections() -> list[tuple[str, Section]]:
    from lmprof.reports.sections import attention, benchmark, kernels, memory, precision, sweep

    return [
        ("End-to-end benchmark", benchmark.section),
        ("Sweep", sweep.section),
        ("GPU kernels (nsys)", kernels.section),
        ("Memory", memory.section),
        ("Attention implementations", attention.section),
        ("Mixed precision", precision.section),
    ]


def load_runs(paths: list[str]) -> list[dict[str, Any]]:
    """Read run directories (a sweep directory stands for its finished cells), in the benchmark
    table's order of configurations (``rundir.config_order``)."""
    if not paths:
        raise UserError("give at least one run directory")
    runs: dict[str, dict] = {}
    for p in sweepdir.expand(paths):
        record = rundir.load_run(p)
        runs[record["run_dir"]] = record
    return sorted(runs.values(), key=rundir.config_order)


_KINDS_HELP = ("a run directory, a sweep directory or directory of runs, an nsys export "
               "(.sqlite, .nsys-rep) or a CUDA memory snapshot (.pickle[.xz|.gz|.zst|.bz2])")


def _file_kind(path: Path) -> str:
    """"export" or "snapshot" for a file given to the report, by its first bytes or its name
    (``magic``); a one-line error otherwise."""
    head = magic.read_head(path)
    if path.suffix in magic.REP_SUFFIXES or magic.kind(head) == "sqlite":
        return "export"
    if magic.snapshot_like(head) or ".pickle" in path.name:
        return "snapshot"
    if magic.kind(head) == "duckdb":  # (a --db file)
        raise UserError(f"{str(path)!r} is a DuckDB database ('analyze sql' queries those), not "
                        f"{_KINDS_HELP}")
    raise UserError(f"{str(path)!r} is not {_KINDS_HELP}")


def _names(record: dict[str, Any], path: Path, kind: str) -> bool:
    """Whether run ``record`` names the file ``path`` as its export / snapshot."""
    keys = ("nsys_sqlite", "nsys_rep") if kind == "export" else ("memory_snapshot",)
    named = [rundir.artifact_path(record, k) for k in keys]
    return any(n is not None and n.resolve() == path.resolve() for n in named)


def collect_inputs(paths: list[str], nsys_path: str | None = None
                   ) -> tuple[list[dict[str, Any]], list, list]:
    """(runs, exports, snapshots) of the report's inputs. Directories and run.json files are runs
    (``load_runs``); a file is an nsys export or a memory snapshot (``_file_kind``): the run of
    the run.json beside it when that run names it, else an input of its own, kept with that
    run.json (its config) if there is one. Each run and file counts once. An export of its own
    is checked here (a ``.nsys-rep`` exported first, with ``nsys_path``), before the report
    writes anything; ``exports`` lists the SQLite files."""
    from lmprof.analyze.nsys import check_export, resolve_report

    if not paths:
        raise UserError(f"give at least one input: {_KINDS_HELP}")
    run_args, files = [], {"export": [], "snapshot": []}
    for arg in paths:
        p = Path(arg)
        if not p.exists():
            raise UserError(f"no such file or directory: {arg!r}")
        if rundir.names_run(p):
            run_args.append(arg)
            continue
        kind = _file_kind(p)
        record = rundir.find_run_for(p)
        if record is not None and _names(record, p, kind):
            run_args.append(record["run_dir"])
        else:
            if kind == "export":
                p = resolve_report(p, nsys_path)[0]
                check_export(p)
            if p.resolve() not in {f.resolve() for f, _ in files[kind]}:
                files[kind].append((p, record))
    runs = load_runs(run_args) if run_args else []
    return runs, files["export"], files["snapshot"]


def build(paths: list[str], out: str | Path, kernel_options: Any = None,
          nsys_path: str | None = None) -> Path:
    """Write ``out`` (a .md or .MD file, or a directory that gets report.md: any other name, or
    a directory that exists) and return its path; its images go into a folder beside it
    (``image_folder``).
    ``kernel_options`` (``lmprof.analyze.trace.Options``) name the phase and attention ranges of
    traces from other code; ``nsys_path`` exports a ``.nsys-rep`` given or a run's."""
    out = Path(out)
    # (a folder that exists is one, whatever its name: as a file it failed after the plots
    # were drawn, which stayed beside it)
    target = out if out.suffix.lower() == ".md" and not out.is_dir() else out / "report.md"
    if target.is_dir():  # (found when writing it, after the plots were drawn: they stayed)
        raise UserError(f"cannot write the report {str(target)!r}: a folder of that name is "
                        "in the way")
    runs, exports, snapshots = collect_inputs(paths, nsys_path)
    _refuse_overwrite(target, paths, runs, exports + snapshots)
    created = next((d for d in reversed([target.parent, *target.parent.parents])
                    if not d.exists()), None)  # the outermost folder this call creates
    _make_folder(target.parent)
    ctx = ReportContext(runs=runs, out_dir=target.parent, exports=exports, snapshots=snapshots,
                        kernel_options=kernel_options, nsys_path=nsys_path,
                        img_name=image_folder(target))
    img_dir, turn = target.parent / ctx.img_name, rundir.lock_beside(target)
    placed: list[tuple[Path, os.stat_result]] = []  # what this report put in place, as it was
    try:
        parts = ["# lmprof report", "", _overview(ctx), ""]
        try:
            for title, section in _sections():
                body = section(ctx)
                if body:
                    parts += [f"## {title}", "", body.rstrip(), ""]
        except OSError as exc:  # an image (or its folder) that cannot be written
            if exc.filename is None or not _inside(Path(exc.filename), target.parent):
                raise
            raise_machine_error(exc, exc.filename)
            raise UserError(f"cannot write {str(exc.filename)!r}: {exc.strerror or exc}") from None
        # (one report at a time puts its files in place: two written into one folder at once
        # leave the last one whole, its images with it)
        while True:
            _make_folder(target.parent)  # (again where another report that stopped removed it)
            with rundir.taking_turns(turn):
                # (a report that stopped can remove the folder it made, empty, after its turn
                # and before this one's lock file is made in it: then made again, and waited for)
                if target.parent.is_dir():
                    _put_in_place(ctx, parts, target, img_dir, placed)
                    break
    except BaseException:
        if created is not None:  # nothing of this report's left in the folders it made
            ctx.drop_stage()
            _take_back(turn, placed, img_dir, created)
        raise
    finally:
        ctx.drop_stage()
    return target


def _put_in_place(ctx: ReportContext, parts: list[str], target: Path, img_dir: Path,
                  placed: list[tuple[Path, os.stat_result]]) -> None:
    """In the report's turn: its images (all drawn) renamed into ``img_dir`` over the earlier
    report's, then report.md written from ``parts``, then the earlier report's images that this
    one has not drawn removed. Each file put in place is added to ``placed`` with its ``lstat``."""
    if ctx.images:  # (all drawn: they replace the earlier report's, then the report)
        dest = img_dir
        try:
            img_dir.mkdir(exist_ok=True)
            for path in ctx.images:
                dest = img_dir / path.name
                os.replace(path, dest)
                placed.append((dest, dest.lstat()))
        except OSError as exc:
            raise_machine_error(exc, dest)
            # (a file where the image folder goes: mkdir's "File exists" names neither)
            why = rundir.why_not_made(dest, exc) if dest == img_dir else exc.strerror or exc
            raise UserError(f"cannot write {str(dest)!r}: {why}") from None
    try:  # (by a rename: a reader of the earlier report.md reads it whole)
        rundir.write_text(target, "\n".join(parts))
        placed.append((target, target.lstat()))
    except OSError as exc:
        # the machine's trouble (a full disk, an I/O error) leaves no report beside the
        # images just put in place, and is exit 1, as render's --out tables
        if machine_error(exc) is not None:
            target.unlink(missing_ok=True)
        raise_machine_error(exc, target)
        raise UserError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None
    if img_dir.is_dir():  # images of an earlier report here that this one has not drawn
        rundir.retire_stale(img_dir, "report", [p.name for p in ctx.images])


def _make_folder(folder: Path) -> None:
    """``folder`` made, with its parents, where it is not there; a one-line error where it
    cannot be (exit 1 for a full disk, naming it)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise_machine_error(exc, folder)
        raise UserError(f"cannot create {str(folder)!r}: "
                        f"{rundir.why_not_made(folder, exc)}") from None


def _take_back(turn: Path, placed: list[tuple[Path, os.stat_result]], img_dir: Path,
               created: Path) -> None:
    """After a report into folders it made (``created``, the outermost of them) stopped: remove,
    in the report's turn, the files it put in place (``placed``, each with its ``lstat`` then)
    that are still those files, not another report's written over them since; then the image
    folder (where it holds nothing but a list of images, ``retire_stale``'s: the list goes too)
    and the folders it made, each only where empty. Another report written there in
    the meantime keeps its files, and the folders that hold them; a report that stopped alone
    leaves nothing. (The report's folder holds the turn's lock file until the turn ends: it is
    removed after, by ``rmdir``, which takes none but an empty folder.)"""
    with rundir.taking_turns(turn):
        for path, made in placed:
            with contextlib.suppress(OSError):  # (gone already: nothing of this report's)
                if os.path.samestat(path.lstat(), made):
                    path.unlink()
        listed = rundir.results_list(img_dir, "report")  # (retire_stale's list of images)
        with contextlib.suppress(OSError):
            if [p.name for p in img_dir.iterdir()] == [listed.name]:  # (a list of no image)
                listed.unlink()
            img_dir.rmdir()
    folders = [turn.parent, *turn.parent.parents]
    for folder in folders[:folders.index(created) + 1]:  # (the innermost first)
        try:
            folder.rmdir()
        except OSError:  # (another report's files in it, or in a folder inside it)
            return


def _refuse_overwrite(target: Path, paths: list[str], runs: list[dict[str, Any]],
                      files: list[tuple[Path, dict[str, Any] | None]]) -> None:
    """Refuse, before anything is drawn or written, a report file or image that is one of the
    inputs (``rundir.refuse_overwrite``): the files given, the runs' run.json and artifacts,
    the exports and snapshots with the run.json beside them. The images' names are known only
    as the sections draw them: every PNG already in the image folder is checked."""
    read = [Path(p) for p in paths] + [f for r in runs for f in rundir.run_files(r)]
    for path, record in files:
        read += [path, *rundir.run_files(record)]
    img_dir = target.parent / image_folder(target)
    images = sorted(img_dir.glob("*.png")) if img_dir.is_dir() else []
    rundir.refuse_overwrite([target, *images], read, "--out")


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def _overview(ctx: ReportContext) -> str:
    lines = [_runs_overview(ctx.runs)] if ctx.runs else []
    for what, files in (("nsys export", ctx.exports), ("memory snapshot", ctx.snapshots)):
        if files:
            lines.append(f"{len(files)} {what}(s) without a run directory: "
                         + ", ".join(md_code(str(p)) for p, _ in files) + ".")
    # (paragraphs: a line right after the runs' list would read as more of its last item)
    return "\n\n".join(lines)


def _runs_overview(runs: list[dict[str, Any]]) -> str:
    envs = {}
    for r in runs:
        e = r.get("environment", {})
        key = (e.get("gpu_name") or e.get("device"), e.get("torch"), e.get("cuda"), e.get("triton"),
               e.get("nsys"))
        envs.setdefault(key, 0)
        envs[key] += 1
    lines = [f"{len(runs)} run(s)."]
    for (dev, torch_v, cuda_v, triton_v, nsys_v), n in sorted(envs.items(), key=str):
        # (a value run.json leaves null is '-', not "None"; nsys only for runs it recorded)
        lines.append(md_text(f"- {n} on {dev or '-'}: torch {torch_v or '-'}, "
                             f"CUDA {cuda_v or '-'}, triton {triton_v or '-'}"
                             + (f", nsys {nsys_v}" if nsys_v else "")))
    return "\n".join(lines)
