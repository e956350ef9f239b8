"""The small Postgres project the observability tests run `dpone run` on (12 daily chunks, one
day whose rows the sink's CHECK refuses until the test fixes them)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

DPONE = Path(sys.executable).with_name("dpone")
PASSWORD = "Otel-Secret-Pw-71"

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {{connection: wh, table: {{schema: {s}, name: raw_orders}}}}
    sink:
      connection: wh
      table: {{schema: {s}, name: orders}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2023-01-01, end: 2023-01-13}}
      inner_mode: replace
      parallel_workers: 2
      lease_seconds: 30
    state:
      backend: audit_schema
      connection: wh
      schema: {s}_audit
"""


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str) -> Iterator[dict[str, Any]]:
    schema = "t_otel_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.raw_orders (order_id bigint PRIMARY KEY, "
            "order_date date NOT NULL, amount integer NOT NULL)"
        )
        conn.execute(
            f"CREATE TABLE {schema}.orders (order_id bigint PRIMARY KEY, order_date date NOT NULL,"
            " amount integer NOT NULL CHECK (amount >= 0))"
        )
        conn.execute(f"CREATE INDEX ON {schema}.orders (order_date)")
        # day 2023-01-05 holds a negative amount: its chunk fails on the sink's CHECK
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2023-01-01' + (g % 12), "
            "CASE WHEN g % 12 = 4 AND g < 20 THEN -1 ELSE g % 1000 END "
            "FROM generate_series(1, 1200) g"
        )
    (tmp_path / "workloads.yaml").write_text(CATALOG)
    (tmp_path / "orders.yaml").write_text(MANIFEST.format(s=schema))
    dsn = pg_dsn.replace("postgres@", f"postgres:{PASSWORD}@", 1)  # trust auth ignores it
    yield {"schema": schema, "catalog": str(tmp_path / "workloads.yaml"), "dsn": dsn, "pg": pg_dsn}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def dpone_run(
    project: dict[str, Any], extra_env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "OTEL_"))}
    env.update({"DPONE_CONN_WH": project["dsn"], **extra_env})
    argv = [
        str(DPONE),
        "run",
        "--catalog",
        project["catalog"],
        "--workload",
        "orders",
        "--process",
        "orders",
        "--no-progress",
    ]
    return subprocess.run(argv, check=False, env=env, capture_output=True, text=True, timeout=120)
