"""`dpone ledger status` and `dpone ledger cancel` end to end on the real Postgres ledger.

A campaign is written through the ledger port (committed, failed, a lease that expires), then the
real `dpone` executable reads it: text, JSON, one HTML page for both processes, cancel and undo.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from dpone.ledger.factory import open_store
from dpone.ledger.port import CampaignShape, ChunkResult, LeaseStatus
from dpone.packing.pack import load_and_compile

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  payments_daily:
    manifest: payments.yaml
    airflow:
      image: registry.example.com/dpone-runtime:0.1.0
      mapping: {mode: visible, max_items: 10, max_active: 2, pool: dpone_backfill}
"""
PROCESS = """\
  - name: {name}
    source: {{connection: warehouse, table: {{schema: raw, name: {name}}}}}
    sink:
      connection: warehouse
      table: {{schema: analytics, name: {name}}}
      keys: [id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: paid_on, type: date, start: 2024-06-01, end: 2024-06-11}}
      inner_mode: merge
    state: {{backend: audit_schema, connection: warehouse, schema: {schema}, require_distributed_lock: true}}
"""


@pytest.fixture
def campaign(tmp_path: Path, pg_dsn: str) -> Iterator[tuple[Path, dict[str, str]]]:
    schema = f"dpone_status_{uuid.uuid4().hex[:10]}"
    manifest = "schema: dpone.pipeline.v1\nprocesses:\n" + "".join(
        PROCESS.format(name=name, schema=schema) for name in ("payments", "refunds")
    )
    (tmp_path / "workloads.yaml").write_text(CATALOG, encoding="utf-8")
    (tmp_path / "payments.yaml").write_text(manifest, encoding="utf-8")
    _, packs, problems = load_and_compile(str(tmp_path / "workloads.yaml"))
    assert not problems, problems
    pack = packs[0]
    plan = pack.processes[0]
    assert plan.run_key and plan.backfill_plan_hash
    shape = CampaignShape(
        plan.run_key,
        pack.workload.name,
        plan.name,
        plan.backfill_plan_hash,
        plan.config_hash,
        plan.chunks,
    )
    store = open_store("audit_schema", pg_dsn, schema, None)
    try:
        store.initialize(shape, "test-init", 10)
        for chunk in plan.chunks[:6]:
            outcome = store.acquire_lease(shape, chunk, "pod-a:1:aaa", 600)
            assert outcome.lease is not None
            store.complete(outcome.lease, chunk, ChunkResult(True, rows=10))
        outcome = store.acquire_lease(shape, plan.chunks[6], "pod-b:2:bbb", 600)
        assert outcome.lease is not None
        store.complete(
            outcome.lease,
            plan.chunks[6],
            ChunkResult(
                False, error_code="DPONE_SINK_FAILED", error_message="<b>duplicate</b> key"
            ),
        )
        # A crashed pod's lease: it expires by the database clock after 1 second.
        assert (
            store.acquire_lease(shape, plan.chunks[7], "pod-c:3:ccc", 1).status
            is LeaseStatus.ACQUIRED
        )
    finally:
        store.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env["DPONE_CONN_WAREHOUSE"] = pg_dsn
    yield tmp_path, env
    import psycopg

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def ledger(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(DPONE),
            "ledger",
            *args,
            "--catalog",
            "workloads.yaml",
            "--workload",
            "payments_daily",
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_status_text_json_and_html(campaign: tuple[Path, dict[str, str]]) -> None:
    cwd, env = campaign
    text = ledger(env, cwd, "status", "--process", "payments")
    assert text.returncode == 0, text.stderr
    assert "10 chunks: 6 committed, 1 running, 1 failed, 2 pending" in text.stdout
    assert "item 6 chunk 7 [2024-06-07 .. 2024-06-08)" in text.stdout
    assert "lease: chunk 8 attempt 1 owner pod-c:3:ccc" in text.stdout
    assert "failed: chunk 7 attempt 1 DPONE_SINK_FAILED" in text.stdout
    time.sleep(1.5)
    raw = ledger(env, cwd, "status", "--format", "json", "--html", "campaign.html")
    assert raw.returncode == 0, raw.stderr
    docs = json.loads(raw.stdout)
    assert [d["process"] for d in docs] == ["payments", "refunds"]
    payments, refunds = docs
    assert payments["running_leases"][0]["expired"] is True, "expiry is judged by the db clock"
    assert refunds["exists"] is False and refunds["counts"]["pending"] == 10
    page = (cwd / "campaign.html").read_text(encoding="utf-8")
    assert page.count("<section>") == 2, "the page shows every process"
    assert "&lt;b&gt;duplicate&lt;/b&gt;" in page and "yes: retryable" in page


def test_cancel_and_undo(campaign: tuple[Path, dict[str, str]]) -> None:
    cwd, env = campaign
    done = ledger(env, cwd, "cancel", "--process", "payments", "--reason", "wrong source")
    assert done.returncode == 0, done.stderr
    assert "cancelled" in done.stdout
    status = ledger(env, cwd, "status", "--process", "payments", "--format", "json")
    doc = json.loads(status.stdout)
    assert doc["cancelled"] is True and doc["cancel_reason"] == "wrong source"
    assert "[CANCELLED: wrong source]" in ledger(env, cwd, "status", "--process", "payments").stdout
    page = ledger(env, cwd, "status", "--process", "payments", "--html", "cancelled.html")
    assert page.returncode == 0, page.stderr
    html = (cwd / "cancelled.html").read_text(encoding="utf-8")
    assert "<b>cancelled</b> (wrong source)" in html
    undo = ledger(env, cwd, "cancel", "--process", "payments", "--undo")
    assert undo.returncode == 0 and "resumed" in undo.stdout
    status = ledger(env, cwd, "status", "--process", "payments", "--format", "json")
    doc = json.loads(status.stdout)
    assert doc["cancelled"] is False and doc["cancel_reason"] is None


def test_cancel_of_a_campaign_that_never_ran_is_a_usage_error(
    campaign: tuple[Path, dict[str, str]],
) -> None:
    cwd, env = campaign
    done = ledger(env, cwd, "cancel", "--process", "refunds")
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stderr.strip().splitlines()[-1])["code"] == "DPONE_USAGE"


def test_status_without_the_connection_is_refused(campaign: tuple[Path, dict[str, str]]) -> None:
    cwd, env = campaign
    env = {k: v for k, v in env.items() if k != "DPONE_CONN_WAREHOUSE"}
    done = ledger(env, cwd, "status")
    assert done.returncode == 3
    last = json.loads(done.stderr.strip().splitlines()[-1])
    assert last["code"] == "DPONE_CONNECTION_MISSING" and "DPONE_CONN_WAREHOUSE" in last["message"]
