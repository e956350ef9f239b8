"""A SQLite project the exporter tests run real `dpone run` processes on, with no database
server: one or two backfill processes (7 daily chunks each) copying raw_orders."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

from .runproject import DPONE

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
"""
PROCESS = """\
  - name: {name}
    source: {{connection: demo, table: {{name: raw_orders}}}}
    sink: {{connection: demo, table: {{name: {name}}}, keys: [order_id], strategy: {{mode: backfill}}}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2024-01-01, end: 2024-01-08}}
      inner_mode: replace
    state: {{backend: local_file, path: {ledger}}}
"""
COLUMNS = "order_id INTEGER PRIMARY KEY, order_date TEXT NOT NULL, amount INTEGER NOT NULL"


def sqlite_project(folder: Path, processes: tuple[str, ...] = ("orders",)) -> dict[str, Any]:
    """A catalog whose workload ``orders`` has one process per name (each writes its own table
    and ledger), and the seeded database file."""
    database = folder / "demo.db"
    with sqlite3.connect(database) as conn:
        conn.execute(f"CREATE TABLE raw_orders ({COLUMNS})")
        conn.executemany(
            "INSERT INTO raw_orders VALUES (?, ?, ?)",
            [(i, f"2024-01-0{1 + i % 7}", i) for i in range(1, 141)],
        )
        for name in processes:
            conn.execute(f"CREATE TABLE {name} ({COLUMNS})")
            conn.execute(f"CREATE INDEX {name}_order_date ON {name} (order_date)")
    manifest = "schema: dpone.pipeline.v1\nprocesses:\n" + "".join(
        PROCESS.format(name=name, ledger=folder / f"ledger_{name}") for name in processes
    )
    (folder / "workloads.yaml").write_text(CATALOG)
    (folder / "orders.yaml").write_text(manifest)
    return {
        "folder": folder,
        "catalog": str(folder / "workloads.yaml"),
        "database": database,
        "dsn": f"sqlite:///{database}",
        "processes": processes,
    }


def sqlite_run(
    project: dict[str, Any], extra_env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """One `dpone run` of every process of the project, without any exporter setting of the
    test's own environment; DPONE_CONN_DEMO is the project's DSN unless ``extra_env`` sets it."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "OTEL_", "OPENLINEAGE"))
    }
    env.update({"DPONE_CONN_DEMO": project["dsn"], **extra_env})
    argv = [str(DPONE), "run", "--catalog", project["catalog"], "--workload", "orders"]
    return subprocess.run(
        [*argv, "--no-progress"],
        check=False,
        env=env,
        cwd=project["folder"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("dpone: warning:")]
