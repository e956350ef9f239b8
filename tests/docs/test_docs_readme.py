"""The README's promise to a newcomer: two set-up commands near the top, the first one works, and
the five-minute tour shows real output.

`bash scripts/demo.sh` runs for real, end to end, in a copy of the working tree (sharing the
project .venv): check, preview, generate, an internal backfill on SQLite, the ledger status. The
tour's commands run in another copy, and their output must match the README's (durations aside).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from docs_markdown import ROOT

SETUP = ["bash scripts/demo.sh", "bash scripts/test.sh"]


def first_code_block(text: str) -> tuple[int, list[str]]:
    lines = text.splitlines()
    for start, line in enumerate(lines):
        if line.startswith("```"):
            body = []
            for inner in lines[start + 1 :]:
                if inner.startswith("```"):
                    return start + 1, body
                body.append(inner)
    raise AssertionError("README.md has no code block")


def test_readme_starts_with_the_two_setup_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    line, body = first_code_block(text)
    assert (
        line <= 25
    ), f"the set-up commands must be near the top (first code block is at line {line})"
    commands = [c.strip() for c in body if c.strip() and not c.strip().startswith("#")]
    assert commands == SETUP, f"README's first code block must be exactly {SETUP}, got {commands}"
    before = text.splitlines()[: line - 1]
    assert not any(row.startswith("## ") for row in before), "the commands come before any section"


def test_setup_scripts_exist_and_are_strict_bash() -> None:
    for command in SETUP:
        script = ROOT / command.split()[1]
        assert script.is_file(), f"{script} is missing"
        text = script.read_text(encoding="utf-8")
        assert text.startswith("#!/usr/bin/env bash"), f"{script.name}: no bash shebang"
        assert "set -euo pipefail" in text, f"{script.name}: must stop at the first failure"
        assert os.access(script, os.X_OK), f"{script.name} is not executable (chmod +x)"
        checked = subprocess.run(
            ["bash", "-n", str(script)], capture_output=True, text=True, check=False
        )
        assert checked.returncode == 0, checked.stderr


def _copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked + untracked, not ignored), without .venv."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree, not yet in the index
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        elif src.is_file():
            shutil.copy2(src, target)
    (dest / ".venv").symlink_to(ROOT / ".venv")


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    tree = tmp_path / "dpone"
    _copy_tree(tree)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_CONN_")}
    env.pop("NO_COLOR", None)
    done = subprocess.run(
        ["bash", "scripts/demo.sh"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"scripts/demo.sh exited {done.returncode}:\n{output[-6000:]}"
    for expected in (
        "$ dpone check golden/internal_default/workloads.yaml",
        ": OK —",
        "$ dpone preview",
        "mode             internal",
        "$ dpone generate",
        "orders_history.py",
        "passed —",
        "$ dpone ledger status",
    ):
        assert expected in output, f"{expected!r} not in the demo output:\n{output[-6000:]}"
    counts = re.search(r"raw_orders=(\d+) orders=(\d+)", output)
    assert counts and counts.group(1) == counts.group(2), output[-2000:]
    assert (tree / ".dpone-demo" / "dags" / "orders_history.py").is_file()
    assert "\033[" not in done.stdout, "no colour when the output is not a terminal"


MARKER = "@@@ dpone-readme-block @@@"


def tour_blocks(text: str) -> list[tuple[str, str | None]]:
    """(commands, expected output or None) for every sh block of the tour, in order. A sh block's
    output is the text/python block that follows it with only blank lines between."""
    start = text.index("## A five-minute tour")
    end = text.find("\n## ", start + 1)
    lines = text[start : end if end != -1 else len(text)].splitlines()
    blocks: list[tuple[str, str, int, int]] = []  # (kind, body, first line, last line)
    i = 0
    while i < len(lines):
        if lines[i].startswith("```") and len(lines[i]) > 3:
            kind, body, j = lines[i][3:].strip(), [], i + 1
            while not lines[j].startswith("```"):
                body.append(lines[j])
                j += 1
            blocks.append((kind, "\n".join(body), i, j))
            i = j + 1
        else:
            i += 1
    out: list[tuple[str, str | None]] = []
    for n, (kind, body, _, last) in enumerate(blocks):
        if kind != "sh":
            continue
        expected = None
        if n + 1 < len(blocks):
            next_kind, next_body, first, _ = blocks[n + 1]
            between = lines[last + 1 : first]
            if next_kind in ("text", "python") and not any(x.strip() for x in between):
                expected = next_body
        out.append((body, expected))
    return out


def _normalise(output: str) -> str:
    """Timings, rates and the running counts after a chunk line's "|" vary from run to run, and
    parallel workers finish chunks in any order: the chunk lines are compared as a sorted set."""
    output = re.sub(r"\b\d+(\.\d+)?s\b", "<T>s", output)
    output = re.sub(r"\b\d+ ms\b", "<T> ms", output)
    output = re.sub(r"[\d,.]+ (rows|chunks)/s", r"<R> \1/s", output)
    lines = [line.rstrip() for line in output.strip().splitlines()]
    lines = [re.sub(r"(: chunk \d+ .*) \| .*$", r"\1 | <progress>", line) for line in lines]
    chunk_lines = sorted(line for line in lines if line.endswith(" | <progress>"))
    others = iter(line for line in lines if not line.endswith(" | <progress>"))
    chunks = iter(chunk_lines)
    return "\n".join(
        next(chunks) if line.endswith(" | <progress>") else next(others) for line in lines
    )


def test_tour_output_is_real(tmp_path: Path) -> None:
    blocks = tour_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 8, "the tour lost its commands"
    tree = tmp_path / "dpone"
    _copy_tree(tree)
    script = "set -e\n" + f"\necho '{MARKER}'\n".join(body for body, _ in blocks) + "\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env.pop("NO_COLOR", None)
    env["PYTHONUNBUFFERED"] = "1"  # keep stdout and stderr lines in the order a terminal shows
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"the tour failed (exit {done.returncode}):\n{done.stdout[-4000:]}"
    outputs = done.stdout.split(MARKER + "\n")
    assert len(outputs) == len(blocks), done.stdout[-4000:]
    for (commands, expected), actual in zip(blocks, outputs, strict=True):
        if expected is None:
            continue
        assert _normalise(actual) == _normalise(expected), (
            f"README tour output differs for:\n{commands}\n--- README\n{expected}\n"
            f"--- real\n{actual}"
        )
