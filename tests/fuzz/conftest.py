"""Fuzz suite configuration: slow variants off unless DPONE_SLOW=1, and a case-count summary."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`@pytest.mark.slow` tests of this folder run only with DPONE_SLOW=1 (make fuzz-long)."""
    if os.environ.get("DPONE_SLOW") == "1":
        return
    keep, drop = [], []
    for item in items:
        mine = HERE in Path(str(item.path)).resolve().parents
        (drop if mine and item.get_closest_marker("slow") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    import fuzzkit

    if not fuzzkit.CASES:
        return
    total = sum(fuzzkit.CASES.values())
    terminalreporter.write_sep("-", f"dpone fuzz: {total} cases")
    for target, n in sorted(fuzzkit.CASES.items()):
        terminalreporter.write_line(f"  {target:<40} {n:>8}")
    report = os.environ.get("DPONE_FUZZ_REPORT")
    if report:
        fuzzkit.write_report(Path(report))
