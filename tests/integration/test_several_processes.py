"""A workload of several processes run at once (no --process, as a local run does): a process
that fails makes the result file and the last line on stderr the failure's, whatever the
processes after it do. Real `dpone` processes, real Postgres."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

pytestmark = pytest.mark.postgres

PROCESS = """\
  - name: {name}
    source: {{connection: wh, table: {{schema: {s}, name: raw_{name}}}}}
    sink:
      connection: wh
      table: {{schema: {s}, name: {name}}}
      keys: [id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: d, type: date, start: 2023-01-01, end: 2023-01-04}}
      inner_mode: replace
    state: {{backend: audit_schema, connection: wh, schema: {s}_audit}}
"""


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str) -> Iterator[tuple[Path, dict[str, str]]]:
    schema = "sp_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for name in ("first", "second"):
            conn.execute(f"CREATE TABLE {schema}.raw_{name} (id int PRIMARY KEY, d date, v int)")
            conn.execute(
                f"INSERT INTO {schema}.raw_{name} SELECT g, date '2023-01-01' + (g % 3), g "
                "FROM generate_series(1, 30) g"
            )
        # the first process's target refuses one row: its chunk fails; the second one passes
        conn.execute(
            f"CREATE TABLE {schema}.first (id int PRIMARY KEY, d date, v int CHECK (v <> 7))"
        )
        conn.execute(f"CREATE TABLE {schema}.second (id int PRIMARY KEY, d date, v int)")
    processes = "".join(PROCESS.format(name=name, s=schema) for name in ("first", "second"))
    (tmp_path / "w.yaml").write_text(f"schema: dpone.pipeline.v1\nprocesses:\n{processes}")
    (tmp_path / "workloads.yaml").write_text(
        "schema: dpone.workload-catalog.v1\nworkloads:\n  both: {manifest: w.yaml}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env.update(DPONE_CONN_WH=pg_dsn, DPONE_XCOM_PATH=str(tmp_path / "xcom.json"))
    yield tmp_path, env
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_failed_process_is_the_runs_result_and_last_line(
    project: tuple[Path, dict[str, str]], log_format: str
) -> None:
    # Regression: the second process's "passed" overwrote the result and ended stderr
    folder, env = project
    dpone = str(Path(sys.executable).with_name("dpone"))
    done = subprocess.run(
        [dpone, "run", "--catalog", "workloads.yaml", "--workload", "both", "--no-progress"],
        cwd=folder,
        env={**env, "DPONE_LOG_FORMAT": log_format},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    result = json.loads((folder / "xcom.json").read_text())
    assert (result["process"], result["status"]) == ("first", "failed")
    assert result["error"]["code"] == "DPONE_SINK_FAILED"
    last = json.loads(done.stderr.strip().splitlines()[-1])
    assert last["schema"] == "dpone.error.v1" and last["code"] == "DPONE_SINK_FAILED"
    assert "second" in done.stderr  # the second process ran and said so before
