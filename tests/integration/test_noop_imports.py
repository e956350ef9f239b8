"""A no-op mapped item imports what it needs and no more.

A mapped item whose chunks are all committed (a cleared task re-run) starts an interpreter,
loads the catalog and its workload's manifest, opens the ledger, reads it, finds nothing to do
and writes its result: every module it imports is start-up time of every pod. A real `dpone run`
process of such an item (the env its generated DAG passes, a real Postgres ledger) runs under
``python -X importtime``; the modules it imported are held to the list below, and the exporters,
connectors, generator, templates and the timing hook must be absent. Adding an eager import of
any of them anywhere on this path fails here: import it where it is used.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dpone.packing.pack import load_workload_pack
from dpone.run.runner import mapped_task_env

pytestmark = pytest.mark.postgres

CHUNKS = 6
CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
    airflow:
      image: registry.example.com/dpone-runtime:0.1.0
      mapping: {mode: summary, max_items: 2, max_active: 2, pool: dpone_test}
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {{connection: src, table: {{schema: {s}, name: raw_orders}}}}
    sink:
      connection: wh
      table: {{schema: {s}, name: orders}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2023-01-01, end: 2023-01-07}}
      inner_mode: replace
    state:
      backend: audit_schema
      connection: wh
      schema: {s}_audit
      require_distributed_lock: true
"""

#: never imported by a no-op item (or by a run without lineage, metrics or DPONE_TIMING)
ABSENT = (
    "dpone.observability.lineage",  # only when OpenLineage is configured
    "dpone.observability.metrics",  # only when OTEL_EXPORTER_OTLP_*ENDPOINT is set
    "dpone.observability.timing",  # only with DPONE_TIMING
    "dpone.connectors",  # no chunk moves: no source or sink is opened
    "dpone.run.preflight",
    "dpone.campaign.status",
    "dpone.campaign.reconcile",
    "dpone.campaign.restate",
    "dpone_generator",
    "jinja2",
    "ruamel",  # the catalog and manifest are in the subset yaml_subset reads
    "openlineage",
    "opentelemetry",
    "pymysql",
    "pyodbc",
    "difflib",  # only for "did you mean" in an error
    "uuid",  # (and platform, which it imports): an owner token needs only os.urandom
)
#: every dpone module a no-op item imports; a new one here is start-up time of every pod
NEEDED = frozenset(
    {
        "dpone",
        "dpone.authoring",
        "dpone.authoring.loader",
        "dpone.authoring.models",
        "dpone.authoring.schema",
        "dpone.authoring.yaml_subset",
        "dpone.authoring.yamldoc",
        "dpone.cli",
        "dpone.credentials",
        "dpone.credentials.connections",
        "dpone.credentials.credential_parts",
        "dpone.credentials.dsn_parts",
        "dpone.credentials.dsn_settings",
        "dpone.credentials.postgres_errors",  # what a ledger error may say (no driver import)
        "dpone.credentials.redaction",
        "dpone.errors",
        "dpone.ledger",
        "dpone.ledger.amend",
        "dpone.ledger.factory",
        "dpone.ledger.port",
        "dpone.ledger.postgres",
        "dpone.ledger.sql",
        "dpone.lifecycle",
        "dpone.lifecycle.collection",  # the collector held off while the run starts (gc only)
        "dpone.lifecycle.faults",
        "dpone.lifecycle.interrupt",
        "dpone.lifecycle.read_ahead",
        "dpone.lifecycle.session_limits",
        "dpone.lifecycle.sessions",  # the run's scope of handed-over connections (no driver)
        "dpone.observability",
        "dpone.observability.exporting",
        "dpone.observability.progress",
        "dpone.observability.reporting",
        "dpone.observability.result",
        "dpone.packing",
        "dpone.packing.pack",
        "dpone.packing.task_env",
        "dpone.packing.verify",
        "dpone.plan",
        "dpone.plan.canonical",
        "dpone.plan.chunks",
        "dpone.plan.mapping",
        "dpone.records",
        "dpone.run",
        "dpone.run.orchestrator",
        "dpone.run.refusal",
        "dpone.run.runner",
        "dpone.suggest",
        "dpone.task",
        "dpone.task.airflow_context",
        "dpone.task.identity",
        "dpone.task.item",
    }
)
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$")


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str) -> Iterator[tuple[Path, dict[str, str]]]:
    schema = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for table in ("raw_orders", "orders"):
            conn.execute(
                f"CREATE TABLE {schema}.{table} (order_id bigint PRIMARY KEY, order_date date,"
                f" amount integer)"
            )
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2023-01-01' + (g % {CHUNKS}), g"
            f" FROM generate_series(1, 300) g"
        )
    catalog = tmp_path / "workloads.yaml"
    catalog.write_text(CATALOG, encoding="utf-8")
    (tmp_path / "orders.yaml").write_text(MANIFEST.format(s=schema), encoding="utf-8")
    separator = "&" if "?" in pg_dsn else "?"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DPONE_", "OTEL_", "OPENLINEAGE_", "AIRFLOW_"))
    }
    env.update(
        DPONE_CONN_WH=pg_dsn,
        DPONE_CONN_SRC=f"{pg_dsn}{separator}application_name=dpone_noop_src",
        HOME=str(tmp_path),  # no ~/.openlineage/openlineage.yml of the machine turns lineage on
    )
    yield catalog, env
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def run_item(
    catalog: Path, env: dict[str, str], *python_flags: str
) -> subprocess.CompletedProcess[str]:
    """Mapped item 0, with the env its generated DAG passes it (as a pod runs it)."""
    _, item_env = mapped_task_env(load_workload_pack(str(catalog), "orders"), "orders", 0)
    command = ["run", "--catalog", str(catalog), "--workload", "orders", "--process", "orders"]
    return subprocess.run(
        [sys.executable, *python_flags, "-m", "dpone", *command, "--no-progress"],
        env={**env, **dict(item_env)},
        cwd=catalog.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def imported_modules(importtime: str) -> set[str]:
    return {m[1] for m in map(_IMPORTED.match, importtime.splitlines()) if m}


def test_a_no_op_item_imports_only_what_it_needs(project: tuple[Path, dict[str, str]]) -> None:
    catalog, env = project
    first = run_item(catalog, env)
    assert first.returncode == 0, first.stderr
    assert "3 committed, 0 already committed" in first.stderr, first.stderr

    again = run_item(catalog, env, "-X", "importtime")
    assert again.returncode == 0, again.stderr
    assert "0 committed, 3 already committed" in again.stderr, again.stderr
    modules = imported_modules(again.stderr)
    assert "dpone.ledger.sql" in modules and "psycopg" in modules  # it did read the ledger
    absent = sorted(m for m in modules for name in ABSENT if m == name or m.startswith(name + "."))
    assert not absent, f"a no-op item imported {absent}: import them where they are used"
    extra = sorted(m for m in modules if m.split(".")[0] == "dpone" and m not in NEEDED)
    assert not extra, f"a no-op item imports {extra} too: needed there, or imported too early?"
