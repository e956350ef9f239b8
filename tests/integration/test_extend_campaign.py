"""Extending a backfill for real (ADR 0020): the `dpone` executable, mapped items passed the way
the generated DAG passes them, a real Postgres source, sink and ledger.

A pinned backfill_id over 8 days runs to the end; the window's end moves 4 days later; the items
of the regenerated plan run. The 8 committed chunks are untouched (their target rows are the same
row versions, their ledger transitions and checksums the same rows), the 4 new ones move, and
the amendment is recorded. A shrunk window is then refused with the reason.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dpone.packing.pack import ProcessPlan, load_and_compile
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
      mapping: {mode: summary, max_items: 4, max_active: 2, pool: dpone_backfill}
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
      backfill_id: orders-2024-q1
      chunk: {{column: order_date, type: date, start: 2024-01-01, end: {end}}}
      inner_mode: replace
      lease_seconds: 600
    state: {{backend: audit_schema, connection: warehouse, schema: {s}_audit, require_distributed_lock: true}}
"""


class Project:
    def __init__(self, root: Path, dsn: str, schema: str) -> None:
        self.root, self.dsn, self.schema = root, dsn, schema
        (root / "workloads.yaml").write_text(CATALOG, encoding="utf-8")

    def plan(self, end: str) -> tuple[ProcessPlan, str]:
        manifest = MANIFEST.format(s=self.schema, end=end)
        (self.root / "orders.yaml").write_text(manifest, encoding="utf-8")
        _, packs, problems = load_and_compile(str(self.root / "workloads.yaml"))
        assert not problems, problems
        plan = packs[0].processes[0]
        return plan, expected_identity(packs[0], plan.name).env_value()

    def dpone(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        full = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
        full.update(DPONE_CONN_WAREHOUSE=self.dsn, DPONE_XCOM_PATH=str(self.root / "xcom.json"))
        full.update(env or {})
        return subprocess.run(
            [str(DPONE), *args],
            cwd=self.root,
            env=full,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    def run_items(self, plan: ProcessPlan, identity: str) -> list[subprocess.CompletedProcess[str]]:
        """Every mapped item of ``plan``, as Airflow would start them."""
        assert plan.mapping_plan is not None
        return [
            self.dpone(
                "run",
                "--catalog",
                "workloads.yaml",
                "--workload",
                "orders_history",
                "--process",
                "orders",
                "--no-progress",
                env={
                    "DPONE_AIRFLOW_MAPPING_ITEM": plan.mapping_plan.item_env_value(item),
                    "DPONE_AIRFLOW_RUN_IDENTITY": identity,
                },
            )
            for item in plan.mapping_plan.items
        ]

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as conn:
            return list(conn.execute(sql).fetchall())


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str) -> Iterator[Project]:
    schema = "ext_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for table in ("raw_orders", "orders"):
            conn.execute(
                f"CREATE TABLE {schema}.{table} (order_id bigint PRIMARY KEY, "
                f"order_date date NOT NULL, amount integer NOT NULL)"
            )
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2024-01-01' + (g % 12), g % 100 "
            f"FROM generate_series(1, 1200) g"
        )
    yield Project(tmp_path, pg_dsn, schema)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def test_a_later_end_moves_only_the_new_chunks(project: Project) -> None:
    s = project.schema
    plan, identity = project.plan("2024-01-09")
    assert plan.chunks_total == 8 and plan.run_key == "orders-2024-q1"
    assert all(done.returncode == 0 for done in project.run_items(plan, identity))
    rows_before = project.query(f"SELECT order_id, xmin::text FROM {s}.orders ORDER BY order_id")
    assert len(rows_before) == 800
    transitions = f"SELECT * FROM {s}_audit.chunk_transition ORDER BY seq"
    ledger_before = project.query(transitions)

    grown, grown_identity = project.plan("2024-01-13")
    assert grown.run_key == plan.run_key and grown.chunks[:8] == plan.chunks
    assert grown.mapping_plan is not None and grown.mapping_plan.items[-1].last_chunk_index == 12
    # before the grown catalog runs, status with it counts what is committed and what will move
    ahead = _status(project)
    assert ahead.returncode == 0, ahead.stderr
    counts = json.loads(ahead.stdout)["counts"]
    assert (counts["committed"], counts["pending"]) == (8, 4)
    runs = project.run_items(grown, grown_identity)
    assert all(done.returncode == 0 for done in runs), [r.stderr for r in runs]
    assert sum("extended to 12 chunks" in done.stderr for done in runs) == 1, "once"

    rows_after = project.query(f"SELECT order_id, xmin::text FROM {s}.orders ORDER BY order_id")
    assert len(rows_after) == 1200
    old_rows = {order_id: xmin for order_id, xmin in rows_after if order_id % 12 < 8}
    assert old_rows == dict(rows_before), "the committed chunks' rows were never written again"
    assert project.query(transitions)[: len(ledger_before)] == ledger_before
    new_transitions = project.query(transitions)[len(ledger_before) :]
    assert {row[2] for row in new_transitions} == set(range(9, 13)), "only new chunks moved"
    source = project.query(f"SELECT * FROM {s}.raw_orders ORDER BY order_id")
    assert project.query(f"SELECT * FROM {s}.orders ORDER BY order_id") == source

    ((old_hash, new_hash, old_count, new_count, by),) = project.query(
        f"SELECT old_plan_hash, new_plan_hash, old_chunk_count, new_chunk_count, amended_by "
        f"FROM {s}_audit.campaign_amendment"
    )
    assert (old_hash, new_hash) == (plan.backfill_plan_hash, grown.backfill_plan_hash)
    assert (old_count, new_count) == (8, 12) and by
    status = _status(project)
    doc = json.loads(status.stdout)
    assert doc["counts"]["committed"] == 12
    assert [(a["old_chunk_count"], a["new_chunk_count"]) for a in doc["amendments"]] == [(8, 12)]
    verify = project.dpone("verify", "--catalog", "workloads.yaml", "--workload", "orders_history")
    assert verify.returncode == 0, verify.stdout + verify.stderr

    shrunk, shrunk_identity = project.plan("2024-01-11")
    refused = project.run_items(shrunk, shrunk_identity)[0]
    assert refused.returncode == 3, refused.stderr
    error = json.loads(refused.stderr.strip().splitlines()[-1])
    assert error["code"] == "DPONE_LEDGER_SHAPE_MISMATCH"
    assert "never shrinks" in error["message"] and "new backfill_id" in error["message"]
    assert len(project.query(f"SELECT * FROM {s}_audit.campaign_amendment")) == 1
    # status refuses the shrunk catalog as the run does: it used to show its 10 chunks, all
    # committed, over a campaign of 12
    refused_status = _status(project)
    assert refused_status.returncode == 3 and not refused_status.stdout
    assert "DPONE_LEDGER_SHAPE_MISMATCH" in refused_status.stderr
    assert "never shrinks" in refused_status.stderr


def _status(project: Project) -> subprocess.CompletedProcess[str]:
    return project.dpone(
        "ledger", "status", "--catalog", "workloads.yaml", "--workload", "orders_history",
        "--format", "json",
    )  # fmt: skip


def test_pinning_a_derived_key_keeps_the_campaign(tmp_path: Path) -> None:
    """The runbook's step 1: pinning the run_key dpone derived changes no chunk, plan hash or
    config hash, so the stored campaign is the same; a new end without the pin is a new key."""
    project = Project(tmp_path, "postgresql://unused", "pin")
    derived, _ = project.plan("2024-01-09")
    manifest = (tmp_path / "orders.yaml").read_text(encoding="utf-8")
    (tmp_path / "orders.yaml").write_text(
        manifest.replace("      backfill_id: orders-2024-q1\n", ""), encoding="utf-8"
    )
    _, packs, problems = load_and_compile(str(tmp_path / "workloads.yaml"))
    assert not problems, problems
    unpinned = packs[0].processes[0]
    assert unpinned.run_key is not None and unpinned.run_key.startswith("bf-")
    (tmp_path / "orders.yaml").write_text(
        manifest.replace("orders-2024-q1", unpinned.run_key), encoding="utf-8"
    )
    _, packs, _ = load_and_compile(str(tmp_path / "workloads.yaml"))
    pinned = packs[0].processes[0]
    assert pinned.run_key == unpinned.run_key and pinned.chunks == unpinned.chunks
    assert pinned.backfill_plan_hash == unpinned.backfill_plan_hash
    assert pinned.config_hash == unpinned.config_hash
    assert derived.run_key == "orders-2024-q1"


def test_a_changed_configuration_over_the_same_chunks_is_refused_everywhere(
    project: Project,
) -> None:
    """Regression: restate and status compared only the plan hash, so a catalog whose inner mode
    changed (append there, replace here) restated chunks the campaign's own mode cannot re-move
    exactly, and the run with the real catalog then doubled their rows."""
    s = project.schema
    plan, identity = project.plan("2024-01-05")
    assert all(done.returncode == 0 for done in project.run_items(plan, identity))
    transitions = f"SELECT * FROM {s}_audit.chunk_transition ORDER BY seq"
    before = project.query(transitions)
    manifest = (project.root / "orders.yaml").read_text(encoding="utf-8")
    (project.root / "orders.yaml").write_text(
        manifest.replace("inner_mode: replace", "inner_mode: merge"), encoding="utf-8"
    )
    restate = project.dpone(
        "ledger", "restate", "--catalog", "workloads.yaml", "--workload", "orders_history",
        "--chunks", "2", "--reason", "config drift probe",
    )  # fmt: skip
    status = _status(project)
    _, packs, problems = load_and_compile(str(project.root / "workloads.yaml"))
    assert not problems, problems
    changed = packs[0].processes[0]
    assert changed.backfill_plan_hash == plan.backfill_plan_hash
    run = project.run_items(changed, expected_identity(packs[0], changed.name).env_value())[0]
    for done in (restate, status, run):
        assert done.returncode == 3, done.stderr
        assert "DPONE_LEDGER_SHAPE_MISMATCH" in done.stderr
        assert "inner mode changed since the campaign started" in done.stderr
        assert "Traceback" not in done.stderr
    assert not status.stdout
    assert project.query(transitions) == before, "nothing was written"


def test_restate_with_an_extended_catalog_before_it_runs(project: Project) -> None:
    """Regression: after the end moved and before any run, verify printed a restate command
    for the new chunks (their target is empty) and restate refused the extended catalog, so
    the runbook's verify, restate, run, verify stopped there. Restate now takes a catalog that
    extends the campaign: the stored chunks restate, the added ones are not committed yet."""
    s = project.schema
    plan, identity = project.plan("2024-01-09")
    assert all(done.returncode == 0 for done in project.run_items(plan, identity))
    grown, grown_identity = project.plan("2024-01-13")
    verify = project.dpone("verify", "--catalog", "workloads.yaml", "--workload", "orders_history")
    assert verify.returncode == 1
    command = shlex.split(verify.stdout.strip().splitlines()[-1])
    assert command[:3] == ["dpone", "ledger", "restate"] and "9-12" in command
    restate = project.dpone(*command[1:])
    assert restate.returncode == 0, restate.stderr
    assert "not committed (they move on the next run anyway): chunks 9-12" in restate.stdout
    assert project.query(f"SELECT count(*) FROM {s}_audit.chunk_restatement") == [(0,)]
    again = project.dpone(
        "ledger", "restate", "--catalog", "workloads.yaml", "--workload", "orders_history",
        "--chunks", "2,9", "--reason", "source corrected", "--format", "json",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert (doc["restated"], doc["not_committed"]) == ([2], [9])
    assert all(done.returncode == 0 for done in project.run_items(grown, grown_identity))
    source = project.query(f"SELECT * FROM {s}.raw_orders ORDER BY order_id")
    assert project.query(f"SELECT * FROM {s}.orders ORDER BY order_id") == source
    moved = project.query(
        f"SELECT chunk_index FROM {s}_audit.chunk_transition WHERE state = 'committed' "
        "GROUP BY chunk_index HAVING count(*) > 1"
    )
    assert moved == [(2,)], "only the restated stored chunk moved twice"
