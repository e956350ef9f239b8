"""The data benchmarks still run end to end (a small table, one repetition).

docs/benchmarks.md quotes their commands: a benchmark that no longer runs (an option the
connectors refuse, a renamed function) would leave those figures without a way to reproduce
them. Each run checks the rows and checksum it moved before it prints a figure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--rows", "3000", "--repeat", "1", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ.copy(),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


@pytest.mark.postgres
def test_data_bench_runs_every_level(pg_dsn: str) -> None:
    out = _run("data_bench.py", "--dsn", pg_dsn)
    for level in ("no read-back", "read_back off", "read_back count", "read_back checksum"):
        assert f"connector COPY, 2 databases, {level}" in out
    assert "COPY path with the default gate vs psql text pipe" in out


def test_mysql_bench_runs_every_method(mysql_dsn: str) -> None:
    out = _run("mysql_bench.py", "--dsn", mysql_dsn)
    for method in ("no checksum", "with checksum", "default gate", "INSERT..SELECT"):
        assert method in out
