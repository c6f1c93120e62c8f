"""Mixed precision: the accumulation experiment and the autocast dtype table (``capture precision``)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from lmprof import rundir
from lmprof.errors import UserError
from lmprof.render import escaped, md_code, md_text
from lmprof.reports.report import ReportContext, distinct_headings, run_tags

ACCUMULATION_NOTE = (
    "Adding {addend} {n} times; the exact sum is 10. *Result* is the exact value of the stored "
    "binary number. Its error splits into what the value dtype cannot represent "
    "({n} × the stored addend − 10) and what rounding loses while accumulating "
    "(result − {n} × the stored addend), both computed exactly with `fractions.Fraction`."
)
AUTOCAST_NOTE = (
    "Dtype of each tensor of the CS336 ToyModel (fc1 → ReLU → LayerNorm → fc2, cross-entropy "
    "loss) under `torch.autocast`. Parameters stay fp32 and autocast casts per op, so the answer "
    "is the device's autocast op lists (CUDA's float32 list has layer_norm): compare devices."
)


def accumulation_table(results: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame([{
        "Case": r["case"], "Accumulator": r["accumulator"], "Values": r["values"],
        "Result (exact)": r["result_exact"],
        "Error vs 10": f"{r['error']:+.3g}",
        "Representation": f"{r['representation_error']:+.3g}",
        "Accumulation rounding": f"{r['accumulation_error']:+.3g}",
    } for r in results["accumulation"]])


def autocast_table(results: dict[str, Any]) -> tuple[pd.DataFrame, list[str]]:
    """Tensor × autocast dtype; plus one line per autocast dtype that failed on the device."""
    autocast = results["autocast"]
    names: list[str] = []
    for res in autocast.values():
        names += [n for n in res["rows"] if n not in names]
    df = pd.DataFrame({"Tensor": names, **{
        f"autocast {dt}": [res["rows"].get(n) or "" for n in names] for dt, res in autocast.items()
    }})
    errors = [f"autocast {dt} failed on {results['device']}: {res['error']}"
              for dt, res in autocast.items() if res.get("error")]
    return df, errors


# the precision.json format versions this reads ("version": capture.precision.RESULTS_VERSION)
_VERSIONS = (1,)


def _number(value) -> bool:
    return value is not None and rundir.json_is(value, (int, float))


def _shape_problem(res) -> str | None:
    """What in a precision.json is not of the type ``capture precision`` writes, or None."""
    if not isinstance(res, dict):
        return "not an object"
    # (absent: written before the field, in the first format)
    if problem := rundir.version_problem(res, _VERSIONS, absent=1):
        return problem
    if not isinstance(res.get("device"), str) or \
            not isinstance(res.get("gpu_name"), (str, type(None))):
        return "'device' / 'gpu_name' are not strings"
    if not _number(res.get("n_adds")) or not isinstance(res.get("addend"), (str, int, float)):
        return "'n_adds' / 'addend' missing or not numbers"
    rows = res.get("accumulation")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        return "'accumulation' is not a list of rows"
    for i, r in enumerate(rows):
        for key in ("case", "accumulator", "values", "result_exact"):
            if not isinstance(r.get(key), str):
                return f"accumulation[{i}].{key} is {r.get(key)!r}"
        for key in ("error", "representation_error", "accumulation_error"):
            if not _number(r.get(key)):
                return f"accumulation[{i}].{key} is {r.get(key)!r}"
    autocast = res.get("autocast")
    if not isinstance(autocast, dict):
        return "'autocast' is not an object"
    for dt, entry in autocast.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("rows"), dict) or \
                not all(isinstance(v, (str, type(None))) for v in entry["rows"].values()) or \
                not isinstance(entry.get("error"), (str, type(None))):
            return f"autocast.{dt} is not {{rows: {{tensor: dtype}}, error}}"
    return None


def _where(record: dict[str, Any], res: dict[str, Any]) -> str:
    """What one run's headings end with, as markdown: its device and run id (two runs on one
    device: told apart)."""
    where = md_text(res["device"] + (f" ({res['gpu_name']})" if res.get("gpu_name") else ""))
    return f"{where}, run {md_code(str(record.get('run_id')))}"


def _run_tables(res: dict[str, Any], where: str) -> str:
    """Both tables of one ``capture precision`` run's results, as markdown, under headings that
    end with ``where`` (``_where``)."""
    acc = accumulation_table(res)
    dtypes, errors = autocast_table(res)
    parts = [f"### Accumulation on {where}", "",
             ACCUMULATION_NOTE.format(addend=res["addend"], n=res["n_adds"]), "",
             escaped(acc).to_markdown(index=False, disable_numparse=True), "",
             f"### Autocast dtypes on {where}", "", AUTOCAST_NOTE, "",
             escaped(dtypes).to_markdown(index=False, disable_numparse=True)]
    if errors:
        parts += ["", *[f"- {md_text(e)}" for e in errors]]
    return "\n".join(parts)


def tables(runs: list[dict[str, Any]]) -> str:
    """Both tables of each ``capture precision`` run, as markdown (or a line saying why its
    results cannot be read: an unreadable or hand-edited precision.json): what ``capture
    precision`` prints for its run, and the report's section."""
    read, unread = {}, {}  # position in runs -> its results / why they could not be read
    for i, record in enumerate(runs):
        try:
            read[i] = rundir.read_json_artifact(record, "precision", _shape_problem)
        except UserError as exc:
            unread[i] = (f"Run {md_code(str(record.get('run_id')))}: its results could not be "
                         f"read ({md_text(str(exc))}).")
    # (one run id for two runs, a run directory copied: told apart where their headings meet)
    wheres = dict(zip(read, distinct_headings([_where(runs[i], res) for i, res in read.items()],
                                              [run_tags(runs[i]) for i in read])))
    return "\n\n".join(_run_tables(read[i], wheres[i]) if i in read else unread[i]
                        for i in range(len(runs)))


def section(ctx: ReportContext) -> str | None:
    runs = [r for r in ctx.runs if r.get("kind") == "precision"]
    return tables(runs) if runs else None
