"""Options shared by the ``analyze`` table commands, defined once. Their modules import these
from here, not from ``analyze.cli``, which imports those modules to register their commands."""

from __future__ import annotations

import os

import click

from lmprof.errors import PathParam, UserError
from lmprof.render import FORMATS  # light: pandas is imported on use

format_option = click.option(
    "--format", "fmt", type=click.Choice(FORMATS), default="md", show_default=True,
    help="Table format on stdout: markdown for people, csv/json (raw unit columns) for tools; "
         "several tables in JSON are one object of them by name, in csv each after a '# name' "
         "line.")
out_option = click.option(
    "--out", type=PathParam(file_okay=False), default=None,
    help="Also write each table to OUT/<table>.<format>.")


def refuse_db_in_place_of(db: str | None, **folders: str | None) -> None:
    """``--db FILE`` that is the path of an output folder (``--out X --db X``): refused before
    any work, where it failed only after every table was written into the folder."""
    for flag, folder in folders.items():
        if db and folder and os.path.realpath(db) == os.path.realpath(folder):
            raise UserError(f"--db {db!r} is the --{flag} folder: give the database a file of "
                            "its own (in that folder, say)")
