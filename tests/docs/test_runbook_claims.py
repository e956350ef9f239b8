"""The runbook's procedures, run for real: the `dpone` executable, mapped items passed the way the
generated DAG passes them (DPONE_AIRFLOW_MAPPING_ITEM), a real Postgres source, sink and ledger.

- roll back from summary to internal: same campaign key, committed chunks are skipped;
- cancel stops new chunks (exit 5) and --undo resumes;
- a stale lease blocks a retry (exit 4) until it expires by the database clock, then is taken over.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dpone.ledger.factory import open_store
from dpone.ledger.port import CampaignShape, LeaseStatus
from dpone.packing.pack import ProcessPlan, WorkloadPack, load_and_compile
from dpone.packing.verify import expected_identity

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders_history:
    manifest: orders.yaml
    airflow:
      image: registry.example.com/dpone-runtime:0.1.0
      secrets: [{{connection: warehouse, secret: dpone-conn-warehouse, key: dsn}}]
      mapping: {{mode: {mode}, max_items: 4, max_active: 2, pool: dpone_backfill}}
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {{connection: warehouse, table: {{schema: {s}, name: raw_orders}}}}
    sink:
      connection: warehouse
      table: {{schema: {s}, name: orders}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2024-01-01, end: 2024-01-13}}
      inner_mode: merge
      lease_seconds: 600
    state: {{backend: audit_schema, connection: warehouse, schema: {s}_audit, require_distributed_lock: true}}
"""


class Project:
    def __init__(self, root: Path, dsn: str, schema: str) -> None:
        self.root, self.dsn, self.schema = root, dsn, schema

    def write(self, mode: str) -> tuple[WorkloadPack, ProcessPlan]:
        (self.root / "workloads.yaml").write_text(CATALOG.format(mode=mode), encoding="utf-8")
        (self.root / "orders.yaml").write_text(MANIFEST.format(s=self.schema), encoding="utf-8")
        _, packs, problems = load_and_compile(str(self.root / "workloads.yaml"))
        assert not problems, problems
        self.identity = expected_identity(packs[0], packs[0].processes[0].name).env_value()
        return packs[0], packs[0].processes[0]

    def dpone(self, *args: str, item: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
        env.update(
            DPONE_CONN_WAREHOUSE=self.dsn,
            DPONE_XCOM_PATH=str(self.root / "xcom.json"),
            PYTHONUNBUFFERED="1",
        )
        if item is not None:
            env["DPONE_AIRFLOW_MAPPING_ITEM"] = item
            env["DPONE_AIRFLOW_RUN_IDENTITY"] = self.identity
        return subprocess.run(
            [str(DPONE), *args],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    def run(self, item: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.dpone(
            "run",
            "--catalog",
            "workloads.yaml",
            "--workload",
            "orders_history",
            "--process",
            "orders",
            item=item,
        )

    def result(self) -> dict[str, Any]:
        return dict(json.loads((self.root / "xcom.json").read_text(encoding="utf-8")))

    def rows(self, table: str) -> int:
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute(f"SELECT count(*) FROM {self.schema}.{table}").fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str) -> Iterator[Project]:
    schema = "rb_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for table in ("raw_orders", "orders"):
            conn.execute(
                f"CREATE TABLE {schema}.{table} (order_id bigint PRIMARY KEY, "
                f"order_date date NOT NULL, amount integer NOT NULL)"
            )
        conn.execute(f"CREATE INDEX ON {schema}.orders (order_date)")
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2024-01-01' + (g % 12), g % 100 "
            f"FROM generate_series(1, 1200) g"
        )
    yield Project(tmp_path, pg_dsn, schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def _item(plan: ProcessPlan, index: int) -> str:
    assert plan.mapping_plan is not None
    value: str = plan.mapping_plan.item_env_value(plan.mapping_plan.items[index])
    return value


def test_roll_back_to_internal_resumes_the_same_ledger(project: Project) -> None:
    _, mapped = project.write("summary")
    assert mapped.mapping_plan is not None and mapped.mapping_plan.items_total == 4
    for index in (0, 1):  # two of the four mapped tasks ran: 6 of 12 chunks
        done = project.run(_item(mapped, index))
        assert done.returncode == 0, done.stderr
    status = json.loads(
        project.dpone(
            "ledger",
            "status",
            "--catalog",
            "workloads.yaml",
            "--workload",
            "orders_history",
            "--format",
            "json",
        ).stdout
    )
    assert status["counts"]["committed"] == 6 and status["mode"] == "summary"

    project.write("internal")  # the runbook's step 1: configuration only
    preview = json.loads(project.dpone("preview", "workloads.yaml", "--format", "json").stdout)
    process = preview["workloads"][0]["processes"][0]
    assert process["mode"] == "internal"
    assert process["run_key"] == status["run_key"] == mapped.run_key, "same campaign (step 3)"

    done = project.run()
    assert done.returncode == 0, done.stderr
    assert "passed — 6 committed, 6 already committed, 0 failed" in done.stderr
    assert project.rows("orders") == project.rows("raw_orders") == 1200


def test_cancel_stops_new_chunks_and_undo_resumes(project: Project) -> None:
    _, plan = project.write("summary")
    assert project.run(_item(plan, 0)).returncode == 0
    ledger = ("--catalog", "workloads.yaml", "--workload", "orders_history")
    cancelled = project.dpone("ledger", "cancel", *ledger, "--reason", "wrong source table")
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    done = project.run(_item(plan, 1))
    assert done.returncode == 5, done.stderr
    error = json.loads(done.stderr.strip().splitlines()[-1])
    assert error["code"] == "DPONE_BACKFILL_CANCELLED"
    assert "(reason: wrong source table)" in error["message"], "the pod says why"
    assert project.result()["backfill"]["chunks_committed"] == 0
    assert project.dpone("ledger", "cancel", *ledger, "--undo").returncode == 0
    done = project.run(_item(plan, 1))
    assert done.returncode == 0, done.stderr
    assert project.result()["backfill"]["mapping"]["item_status"] == "success"


def test_a_stale_lease_is_taken_over_after_expiry_by_the_database_clock(project: Project) -> None:
    pack, plan = project.write("summary")
    assert plan.run_key and plan.backfill_plan_hash and plan.mapping_plan
    shape = CampaignShape(
        plan.run_key,
        pack.workload.name,
        plan.name,
        plan.backfill_plan_hash,
        plan.config_hash,
        plan.chunks,
    )
    store = open_store("audit_schema", project.dsn, f"{project.schema}_audit", None)
    try:
        store.initialize(shape, "crashed-pod", 10)
        first = plan.chunks[plan.mapping_plan.items[2].first_chunk_index - 1]
        taken = store.acquire_lease(shape, first, "crashed-pod:1:dead", 8)  # then it "dies"
        assert taken.status is LeaseStatus.ACQUIRED
    finally:
        store.close()
    busy = project.run(_item(plan, 2))
    assert busy.returncode == 4, busy.stderr
    assert json.loads(busy.stderr.strip().splitlines()[-1])["code"] == "DPONE_BACKFILL_CHUNK_BUSY"
    time.sleep(8.5)
    status = project.dpone(
        "ledger", "status", "--catalog", "workloads.yaml", "--workload", "orders_history"
    )
    assert "owner crashed-pod:1:dead" in status.stdout and "(expired: retryable)" in status.stdout
    done = project.run(_item(plan, 2))
    assert done.returncode == 0, done.stderr
    assert project.result()["backfill"]["chunks_committed"] == 3
    final = json.loads(
        project.dpone(
            "ledger",
            "status",
            "--catalog",
            "workloads.yaml",
            "--workload",
            "orders_history",
            "--format",
            "json",
        ).stdout
    )
    assert final["running_leases"] == [] and final["counts"]["committed"] == 3
