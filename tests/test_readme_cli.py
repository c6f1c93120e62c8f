"""The README's CLI reference against the commands themselves: each command has its section,
each option a user can give (every one `--help` shows) is named there, and the options the
section's heading and option table name are the command's own. A renamed, added or dropped
option fails here until the README says so."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from lmprof.analyze.cli import analyze
from lmprof.capture.cli import capture

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
GROUPS = {"capture": capture, "analyze": analyze}
COMMANDS = [(g, name) for g, group in GROUPS.items() for name in sorted(group.commands)]


def _reference() -> tuple[str, dict[str, str]]:
    """The CLI reference's opening text (what every command shares) and its sections by
    command, ``"analyze kernels"`` -> the section's heading line and text."""
    body = README.split("## CLI reference", 1)[1]
    body = re.split(r"^## ", body, maxsplit=1, flags=re.M)[0]
    intro, *sections = re.split(r"^### ", body, flags=re.M)
    by_command = {}
    for section in sections:
        m = re.match(r"`((?:capture|analyze) [a-z]+)", section)
        if m:
            by_command[m.group(1)] = section
    return intro, by_command


INTRO, SECTIONS = _reference()


def _named(option: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def _options(command: click.Command) -> dict[str, click.Option]:
    """Each long option name a user can give (hidden ones, the runner's own, left out) -> its
    option."""
    return {name: p for p in command.params
            if isinstance(p, click.Option) and not p.hidden
            for name in p.opts + p.secondary_opts if name.startswith("--")}


def _mentioned(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))


@pytest.mark.parametrize("group,name", COMMANDS, ids=[f"{g} {n}" for g, n in COMMANDS])
def test_every_option_of_a_command_is_named_in_its_readme_section(group, name):
    section = SECTIONS.get(f"{group} {name}")
    assert section is not None, f"README has no '### `{group} {name}`' section"
    command = GROUPS[group].commands[name]
    shared = INTRO if group == "analyze" else ""  # --format and --out, said once for all
    if (group, name) == ("capture", "sweep"):
        # "The capture run options as comma-separated lists ...": run's section names them
        shared += SECTIONS["capture run"]
    options = _options(command)
    named = {p.name for opt, p in options.items() if _named(opt, section) or _named(opt, shared)}
    unnamed = sorted({p.name for p in options.values()} - named - {"help"})
    assert not unnamed, f"README's {group} {name} section names no option for {unnamed}"


@pytest.mark.parametrize("group,name", COMMANDS, ids=[f"{g} {n}" for g, n in COMMANDS])
def test_options_in_a_readme_heading_and_table_are_the_commands_own(group, name):
    section = SECTIONS[f"{group} {name}"]
    heading, _, rest = section.partition("\n")
    table_keys = "\n".join(line.split("|")[1] for line in rest.splitlines()
                           if line.startswith("| `--"))
    given = _mentioned(heading) | _mentioned(table_keys)
    unknown = sorted(given - set(_options(GROUPS[group].commands[name])))
    assert not unknown, f"README's {group} {name} heading or table names {unknown}, " \
                        f"which {group} {name} does not take"


def test_the_reference_has_no_section_for_a_command_that_does_not_exist():
    assert set(SECTIONS) == {f"{g} {n}" for g, n in COMMANDS}
