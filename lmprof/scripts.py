"""The console scripts ``capture`` and ``analyze`` (and ``python -m lmprof.capture``,
``python -m lmprof.analyze``).

Each imports its command's module here, where a Ctrl-C during the import ends as one later does
(``errors.run_cli``): "aborted", exit 130. The import takes a while (torch a second or two, DuckDB
a tenth), and a Ctrl-C in it was KeyboardInterrupt's traceback: a console script imports the
module it names before calling into it, outside anything the module could catch.
"""

from __future__ import annotations

import importlib
import sys


def capture() -> None:
    """``capture``: :func:`lmprof.capture.cli.main`."""
    _main("lmprof.capture.cli")


def analyze() -> None:
    """``analyze``: :func:`lmprof.analyze.cli.main`."""
    _main("lmprof.analyze.cli")


def _main(module: str) -> None:
    """Import ``module`` and run its ``main``."""
    try:
        cli = importlib.import_module(module)
    except KeyboardInterrupt:
        print("aborted", file=sys.stderr)  # (run_cli's line; click may not be imported yet)
        sys.exit(130)
    cli.main()
