"""The first install (`bash scripts/demo.sh` starts with `bash scripts/bootstrap.sh`) prints no
packaging warnings: bootstrap.sh runs for real, in a copy of the working tree with no .venv, and
its whole output is read.

The only lines allowed are bootstrap's own and pip's notes about this machine's configuration
(`WARNING: Location 'file:///...' is ignored`: index folders named in /etc/pip.conf that do not
exist here), which no project can change.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MACHINE_NOTE = re.compile(r"^WARNING: Location '[^']+' is ignored: it is neither a file nor a")


def _copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked + untracked, not ignored), without .venv."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file() and not src.is_symlink():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
        elif src.is_symlink():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(os.readlink(src))


@pytest.mark.slow
def test_the_first_install_prints_no_packaging_warnings(tmp_path: Path) -> None:
    tree = tmp_path / "dpone"
    _copy_tree(tree)
    assert not (tree / ".venv").exists()
    done = subprocess.run(
        ["bash", "scripts/bootstrap.sh"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    output = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 0, "\n".join(output[-60:])
    assert (tree / ".venv" / ".dpone-stamp").is_file()
    printed = [
        line
        for line in output
        if line.strip() and not MACHINE_NOTE.match(line) and not line.startswith("bootstrap: ")
    ]
    assert printed == [], "\n".join(printed[:80])
    templates = subprocess.run(
        [str(tree / ".venv" / "bin" / "python"), "-c", _TEMPLATES],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    # every task template of the source tree is installed as package data
    expected = sorted(p.name for p in (REPO / "templates" / "tasks").glob("*.jinja"))
    assert len(expected) >= 4, expected
    assert templates.stdout.split() == expected, templates.stdout


_TEMPLATES = """
from importlib import resources
names = sorted(p.name for p in resources.files("dpone_generator.templates.tasks").iterdir())
print(" ".join(n for n in names if n.endswith(".jinja"))[:200])
"""
