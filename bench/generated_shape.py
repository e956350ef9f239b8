"""What a reviewer reads in a generated DAG file, and what one pod-option change diffs.

Copies two golden cases to a temporary folder, generates their DAG files, changes one pod option
in the copied catalog, generates again and counts the changed lines of the generated file:

  200-item golden   golden/summary_1000_into_200 (1,000 chunks into 200 mapped tasks): bytes and
                    lines of events_by_id.py; diff of a new image tag (0.1.0 -> 0.1.1)
  pod options       golden/pod_options (pre-hook + 12 mapped tasks, every pod option): bytes and
                    lines of invoices_backfill.py; diff of the same new image tag, and diff of one
                    toleration added to the catalog

A diff line is a ``+`` or ``-`` line of ``diff -U0`` (file headers not counted).

usage: python bench/generated_shape.py [--json]      (from the repository root)
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

from dpone_generator.cli import generate_command

GOLDEN = Path("golden")
TOLERATION = "        - {key: dedicated, operator: Equal, value: batch, effect: NoSchedule}\n"
EXTRA_TOLERATION = "        - {key: spot, operator: Exists, effect: NoSchedule}\n"
IMAGE, NEW_IMAGE = "dpone-runtime:0.1.0", "dpone-runtime:0.1.1"
# (golden case, its DAG file, catalog text, what it becomes)
CHANGES = [
    ("summary_1000_into_200", "events_by_id.py", IMAGE, NEW_IMAGE),
    ("pod_options", "invoices_backfill.py", IMAGE, NEW_IMAGE),
    ("pod_options", "invoices_backfill.py", TOLERATION, TOLERATION + EXTRA_TOLERATION),
]


def _generate(case: Path) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = generate_command((case / "workloads.yaml").as_posix(), str(case / "out"), False)
    if code != 0:
        raise SystemExit(f"dpone generate {case} failed ({code}):\n{out.getvalue()}")


def _changed_lines(before: str, after: str) -> int:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), n=0, lineterm="")
    return sum(1 for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---")))


def measure(case: str, dag_file: str, old: str, new: str, tmp: Path) -> dict[str, object]:
    """The golden's size, and the changed lines of its DAG file when ``old`` becomes ``new``."""
    change = "one more toleration" if new.startswith(old) else f"{old} -> {new}"
    work = tmp / f"{case}-{len(list(tmp.iterdir()))}"
    shutil.copytree(GOLDEN / case, work, ignore=shutil.ignore_patterns("expected"))
    _generate(work)
    before = (work / "out" / dag_file).read_text(encoding="utf-8")
    catalog = work / "workloads.yaml"
    text = catalog.read_text(encoding="utf-8")
    if text.count(old) != 1:
        raise SystemExit(f"{case}: the change's anchor must occur once in workloads.yaml")
    catalog.write_text(text.replace(old, new), encoding="utf-8")
    _generate(work)
    after = (work / "out" / dag_file).read_text(encoding="utf-8")
    golden = GOLDEN / case / "expected" / dag_file
    text = golden.read_text(encoding="utf-8")
    return {
        "file": golden.as_posix(),
        "bytes": len(text.encode("utf-8")),
        "lines": text.count("\n"),
        "change": change,
        "diff_lines": _changed_lines(before, after),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not GOLDEN.is_dir():
        print("run it from the repository root (no ./golden here)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dpone-shape-") as tmp:
        rows = [measure(*change, Path(tmp)) for change in CHANGES]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'file':<54} {'bytes':>8} {'lines':>6} {'diff lines':>10}  change")
    for row in rows:
        print(
            f"{row['file']:<54} {row['bytes']:>8} {row['lines']:>6} {row['diff_lines']:>10}"
            f"  {row['change']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
