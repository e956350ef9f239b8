"""Every `dpone` command the README and the docs name in code exists: a page that sends a reader
to a command the CLI does not have (it once named `dpone ledger history`) fails here.

Each command and `ledger` subcommand found in a code span or block is asked for its `--help`
through the real entry point, which exits 0 only for a command it knows."""

from __future__ import annotations

import re

import pytest
from docs_markdown import ROOT
from dpone.cli import main

#: prose inside code that reads like a command ("the dpone distribution: ...", a pool's label)
PROSE = {"dpone distribution", "dpone backfills"}


def _named_commands() -> dict[tuple[str, ...], str]:
    found: dict[tuple[str, ...], str] = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        blocks = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
        spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
        for code in blocks + spans:
            for match in re.finditer(r"(?<![\w./-])dpone (ledger )?([a-z][a-z_-]*)", code):
                if match.group(0) not in PROSE:
                    command = ("ledger", match.group(2)) if match.group(1) else (match.group(2),)
                    found.setdefault(command, str(page.relative_to(ROOT)))
    return found


NAMED = _named_commands()


def test_the_docs_name_the_commands_at_all() -> None:
    assert {("run",), ("verify",), ("ledger", "status"), ("ledger", "restate")} <= set(NAMED)


@pytest.mark.parametrize("command", sorted(NAMED), ids=" ".join)
def test_a_command_the_docs_name_exists(
    command: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main([*command, "--help"])
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    capsys.readouterr()
    assert code == 0, f"{NAMED[command]} names `dpone {' '.join(command)}`, which does not exist"
