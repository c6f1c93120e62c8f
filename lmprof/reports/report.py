"""The markdown report: one section per kind of data present in the given runs.

A section is a function ``(ReportContext) -> str | None``; ``None`` means "no data of my kind".
Sections are listed in ``SECTIONS`` in report order. Output is deterministic for the same inputs:
runs are in the benchmark table's order of configurations (then by run id), and nothing
time-dependent is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lmprof import rundir, sweepdir
from lmprof.errors import UserError


@dataclass
class ReportContext:
    runs: list[dict[str, Any]]
    out_dir: Path  # the report's folder; images go to out_dir / "img"
    images: list[Path] = field(default_factory=list)

    @property
    def img_dir(self) -> Path:
        d = self.out_dir / "img"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def image(self, name: str) -> tuple[Path, str]:
        """A path to save a figure to, and the relative link to put in the markdown."""
        path = self.img_dir / name
        self.images.append(path)
        return path, f"img/{name}"


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


def build(paths: list[str], out: str | Path) -> Path:
    """Write ``out`` (a .md file, or a directory that gets report.md) and return its path."""
    out = Path(out)
    target = out if out.suffix == ".md" else out / "report.md"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {str(target.parent)!r}: {exc.strerror or exc}") from None
    ctx = ReportContext(runs=load_runs(paths), out_dir=target.parent)
    parts = ["# lmprof report", "", _runs_overview(ctx.runs), ""]
    for title, section in _sections():
        body = section(ctx)
        if body:
            parts += [f"## {title}", "", body.rstrip(), ""]
    try:
        target.write_text("\n".join(parts))
    except OSError as exc:
        raise UserError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None
    return target


def _runs_overview(runs: list[dict[str, Any]]) -> str:
    envs = {}
    for r in runs:
        e = r.get("environment", {})
        key = (e.get("gpu_name") or e.get("device"), e.get("torch"), e.get("cuda"), e.get("triton"))
        envs.setdefault(key, 0)
        envs[key] += 1
    lines = [f"{len(runs)} run(s)."]
    for (dev, torch_v, cuda_v, triton_v), n in sorted(envs.items(), key=str):
        lines.append(f"- {n} on {dev}: torch {torch_v}, CUDA {cuda_v or '-'}, "
                     f"triton {triton_v or '-'}")
    return "\n".join(lines)
