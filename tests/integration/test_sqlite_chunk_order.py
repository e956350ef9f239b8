"""A timestamp chunk over a SQLite DATE column: SQLite compares the column's text with each
bound's ('2024-01-01' < '2024-01-01 00:00:00'), so every day's rows would fall into the chunk
before theirs on the source and on the target alike, and the read-back and `dpone verify` would
match while the window's first day was never moved. Refused before any lease; `type: date`
moves the same rows. The real `dpone` executable, SQLite files only."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"

CATALOG = "schema: dpone.workload-catalog.v1\nworkloads:\n  days:\n    manifest: days.yaml\n"
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: days
    source: {{connection: src, table: {{name: src}}}}
    sink: {{connection: dst, table: {{name: dst}}, strategy: {{mode: backfill}}}}
    backfill:
      chunk: {chunk}
      inner_mode: replace
    state: {{backend: local_file, path: {ledger}}}
"""
TIMESTAMP = "{column: d, type: timestamp, start: '2024-01-01T00:00:00Z', end: '2024-01-03T00:00:00Z', unit: day}"
DATE = "{column: d, type: date, start: 2024-01-01, end: 2024-01-03}"


def _project(folder: Path, chunk: str) -> dict[str, str]:
    for name in ("src", "dst"):
        with sqlite3.connect(folder / f"{name}.db") as conn:
            conn.execute(f"CREATE TABLE IF NOT EXISTS {name} (d DATE NOT NULL, v INTEGER)")
            conn.execute(f"CREATE INDEX IF NOT EXISTS {name}_d ON {name} (d)")
    with sqlite3.connect(folder / "src.db") as conn:
        conn.execute("DELETE FROM src")
        conn.executemany(
            "INSERT INTO src VALUES (?, ?)",
            [("2024-01-01", 1), ("2024-01-02", 2), ("2024-01-03", 3)],
        )
    (folder / "workloads.yaml").write_text(CATALOG)
    (folder / "days.yaml").write_text(MANIFEST.format(chunk=chunk, ledger=folder / "ledger"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env.update(
        DPONE_CONN_SRC=f"sqlite:///{folder / 'src.db'}",
        DPONE_CONN_DST=f"sqlite:///{folder / 'dst.db'}",
        DPONE_XCOM_PATH=str(folder / "xcom.json"),
    )
    return env


def _run(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DPONE), "run", "--catalog", "workloads.yaml", "--workload", "days", "--no-progress"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _target(folder: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(folder / "dst.db") as conn:
        return [(str(d), int(v)) for d, v in conn.execute("SELECT d, v FROM dst ORDER BY d")]


def test_a_timestamp_chunk_over_a_sqlite_date_column_is_refused(tmp_path: Path) -> None:
    done = _run(tmp_path, _project(tmp_path, TIMESTAMP))
    assert done.returncode == 3, done.stderr
    record = json.loads(done.stderr.strip().splitlines()[-1])
    assert record["code"] == "DPONE_PREFLIGHT_FAILED" and record["file"] is not None
    assert "type: date" in record["message"]
    assert _target(tmp_path) == [], "a row moved"
    assert (
        not (tmp_path / "ledger-time").exists()
        or "committed" not in (tmp_path / "ledger-time").read_text()
    )


def test_a_date_chunk_moves_the_window_exactly(tmp_path: Path) -> None:
    done = _run(tmp_path, _project(tmp_path, DATE))
    assert done.returncode == 0, done.stderr
    assert _target(tmp_path) == [("2024-01-01", 1), ("2024-01-02", 2)]
