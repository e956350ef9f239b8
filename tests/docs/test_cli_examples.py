"""docs/cli.md's promise: every example runs from the repository root after `bash
scripts/demo.sh`, except the ones marked `# needs Postgres`. The demo runs for real in a copy of
the working tree (sharing the project .venv), then every unmarked `sh` block runs there, in the
page's order, and must exit 0."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from docs_markdown import ROOT
from test_docs_readme import _copy_tree

MARK = "# needs Postgres"


def sh_blocks(text: str) -> list[str]:
    blocks: list[str] = []
    body: list[str] | None = None
    for line in text.splitlines():
        if body is None and line.strip() == "```sh":
            body = []
        elif body is not None and line.startswith("```"):
            blocks.append("\n".join(body))
            body = None
        elif body is not None:
            body.append(line)
    return blocks


def test_the_postgres_examples_are_marked_and_need_it() -> None:
    blocks = sh_blocks((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))
    marked = [b for b in blocks if MARK in b]
    assert len(marked) == 2, marked
    for block in marked:  # each names the warehouse connection of the Postgres example
        assert "summary_365_into_40" in block or "--connection warehouse" in block, block
    for block in blocks:
        if MARK not in block:
            assert "--connection " not in block and "run --catalog golden/summary" not in block


def test_every_unmarked_example_runs_after_the_demo(tmp_path: Path) -> None:
    blocks = [
        b
        for b in sh_blocks((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))
        if MARK not in b
    ]
    assert len(blocks) >= 8, blocks
    tree = tmp_path / "dpone"
    _copy_tree(tree)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env["PATH"] = f"{tree / '.venv' / 'bin'}:{env.get('PATH', '')}"
    script = "set -euo pipefail\nbash scripts/demo.sh >/dev/null\n" + "\n".join(
        f"echo '@@ block {n}'\n{block}" for n, block in enumerate(blocks)
    )
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    assert f"@@ block {len(blocks) - 1}" in done.stdout
