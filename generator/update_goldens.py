"""Regenerate every golden/<case>/expected/ folder: the one command a deliberate change needs.

    python -m dpone_generator.update_goldens            (from the repository root)

Each case's expected/ becomes exactly what ``dpone generate golden/<case>/workloads.yaml --out
golden/<case>/expected`` writes; review the result as a diff before committing it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .cli import generate_command

GOLDEN = Path("golden")
COMMAND = "python -m dpone_generator.update_goldens"


def golden_cases(root: Path = GOLDEN) -> list[Path]:
    """Every golden case folder (one holding a workloads.yaml), sorted by name."""
    return sorted(path.parent for path in root.glob("*/workloads.yaml"))


def main(argv: list[str] | None = None) -> int:
    del argv  # no options: every case, always
    if not GOLDEN.is_dir():
        print(f"{COMMAND}: run it from the repository root (no ./golden here)", file=sys.stderr)
        return 2
    worst = 0
    for case in golden_cases():
        catalog = (case / "workloads.yaml").as_posix()
        code = generate_command(catalog, (case / "expected").as_posix(), check=False)
        worst = max(worst, code)
    return worst


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
