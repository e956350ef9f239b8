"""A ledger connect the server refuses is described as the connectors describe theirs: a coarse
reason, never libpq's text, which names the user (docs/security.md: a connection is described
"never by its user"). Through the real `dpone` executable against the real Postgres."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dpone import errors

DPONE = Path(sys.executable).with_name("dpone")

pytestmark = pytest.mark.postgres

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  led:
    manifest: led.yaml
    airflow: {flavour: subprocess}
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: copy
    source: {{connection: src, table: {{schema: {s}, name: src}}}}
    sink:
      connection: dst
      table: {{schema: {s}, name: dst}}
      keys: [id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: d, type: date, start: 2023-01-01, end: 2023-01-05}}
      inner_mode: replace
    state: {{backend: audit_schema, connection: led, schema: {s}_audit, require_distributed_lock: true}}
"""


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str) -> Iterator[dict[str, Any]]:
    schema = "ledconn_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.src (id int PRIMARY KEY, d date NOT NULL, v int)")
        conn.execute(f"INSERT INTO {schema}.src VALUES (1, date '2023-01-02', 1)")
        conn.execute(f"CREATE TABLE {schema}.dst (id int PRIMARY KEY, d date NOT NULL, v int)")
    (tmp_path / "workloads.yaml").write_text(CATALOG, encoding="utf-8")
    (tmp_path / "led.yaml").write_text(MANIFEST.format(s=schema), encoding="utf-8")
    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    where = f"{info.get('host', '127.0.0.1')}:{info.get('port', '5432')}/{info['dbname']}"
    yield {
        "root": tmp_path,
        "catalog": tmp_path / "workloads.yaml",
        "url": f"postgresql://{info.get('user', 'postgres')}@{where}",
        "where": where,
    }
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def dpone(project: dict[str, Any], *command: str, ledger: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env.update({"DPONE_CONN_SRC": project["url"], "DPONE_CONN_DST": project["url"]})
    env["DPONE_CONN_LED"] = ledger
    env["DPONE_XCOM_PATH"] = str(project["root"] / "out" / "xcom.json")
    env["DPONE_EVIDENCE_DIR"] = str(project["root"] / "out" / "evidence")
    argv = [str(DPONE), *command, "--catalog", str(project["catalog"]), "--workload", "led"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def last_error(stderr: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(stderr.strip().splitlines()[-1])
    return record


@pytest.mark.parametrize("command", [("run", "--no-progress"), ("ledger", "status")])
def test_a_ledger_role_that_does_not_exist_is_never_named(
    project: dict[str, Any], command: tuple[str, ...]
) -> None:
    role = "dpone_ghost_" + uuid.uuid4().hex[:10]
    done = dpone(project, *command, ledger=f"postgresql://{role}@{project['where']}")
    assert role not in done.stderr and role not in done.stdout, done.stderr
    record = last_error(done.stderr)
    assert record["code"] == errors.CONNECTION_FAILED and done.returncode == 4, done.stderr
    assert record["retryable"] is True
    assert "database or role does not exist" in record["message"], record["message"]
    out = project["root"] / "out"
    written = [path for path in out.rglob("*") if path.is_file()] if out.exists() else []
    if command[0] == "run":
        assert out / "xcom.json" in written  # the run's result was written, and is checked
    for path in written:
        assert role not in path.read_text(encoding="utf-8"), path
