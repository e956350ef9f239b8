"""docs/deploy-kubernetes.md's install table lists every command and every extra each wheel
gives, read from the code (`dpone --help`'s command list) and runtime/pyproject.toml."""

from __future__ import annotations

import re
import tomllib

from docs_markdown import ROOT
from dpone.cli import HELP


def _row(wheel: str) -> str:
    text = (ROOT / "docs" / "deploy-kubernetes.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith(f"| `{wheel}")]
    assert len(rows) == 1, rows
    return rows[0]


def test_the_wheel_table_lists_every_command_and_extra() -> None:
    commands = re.findall(r"^  ([a-z]+) {2,}.*?(\[dpone distribution\])?$", HELP, re.MULTILINE)
    runtime = [name for name, generator in commands if not generator]
    generator = [name for name, tagged in commands if tagged]
    assert runtime == ["run", "ledger", "verify"] and len(generator) == 3, commands
    row = _row("dpone_runtime-")
    for name in runtime:
        assert f"`dpone {name}`" in row, (name, row)
    project = tomllib.loads((ROOT / "runtime" / "pyproject.toml").read_text(encoding="utf-8"))
    extras = project["project"]["optional-dependencies"]
    assert len(extras) >= 6, extras
    for extra in extras:
        assert f"`{extra}`" in row, (extra, row)
    generator_row = _row("dpone-")
    for name in generator:
        assert f"`{name}`" in generator_row or f"`dpone {name}`" in generator_row, name
