"""`dpone ledger status` and `dpone ledger cancel` end to end on the real Postgres ledger.

A campaign is written through the ledger port (committed, failed, a lease that expires), then the
real `dpone` executable reads it: text, JSON, one HTML page for both processes, cancel and undo.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
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


def test_a_cancellation_records_who_and_an_undo_with_nothing_to_lift_writes_nothing(
    campaign: tuple[Path, dict[str, str]], pg_dsn: str
) -> None:
    cwd, env = campaign
    found = re.search(r"schema: (dpone_status_\w+)", (cwd / "payments.yaml").read_text())
    assert found is not None
    audit = found.group(1)

    def snapshots() -> list[tuple[bool, str | None, str]]:
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute(
                f"SELECT cancelled, cancel_reason, created_by FROM {audit}.campaign"  # type: ignore[call-overload]
                " WHERE process = 'payments' ORDER BY seq"
            ).fetchall()
        return [(bool(r[0]), r[1], str(r[2])) for r in rows]

    before = snapshots()
    idle = ledger(env, cwd, "cancel", "--process", "payments", "--undo", "--by", "ops@example")
    assert idle.returncode == 0, idle.stderr
    assert "is not cancelled: nothing to resume" in idle.stdout and "resumed" not in idle.stdout
    assert snapshots() == before, "an undo with nothing to lift writes no snapshot"
    done = ledger(env, cwd, "cancel", "--process", "payments", "--reason", "bad", "--by", "ann@ops")
    assert done.returncode == 0, done.stderr
    assert "cancelled by ann@ops" in done.stdout
    assert snapshots()[-1] == (True, "bad", "ann@ops")
    lifted = ledger(env, cwd, "cancel", "--process", "payments", "--undo", "--by", "bob@ops")
    assert "resumed by bob@ops" in lifted.stdout
    assert snapshots()[-1][0] is False and snapshots()[-1][2] == "bob@ops"
    assert len(snapshots()) == len(before) + 2


@pytest.mark.parametrize("damage", ["chunk_count", "chunk_row"])
def test_cancel_refuses_a_ledger_status_and_run_refuse(
    campaign: tuple[Path, dict[str, str]], pg_dsn: str, damage: str
) -> None:
    """A campaign whose stored rows are damaged is read whole before a cancellation, as status
    and run read it: refused (exit 3), and nothing is written to it."""
    import psycopg

    cwd, env = campaign
    schema = re.search(r"schema: (dpone_status_\w+)", (cwd / "payments.yaml").read_text())
    assert schema is not None
    audit = schema.group(1)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        if damage == "chunk_count":
            conn.execute(f"UPDATE {audit}.campaign SET chunk_count = 99")  # type: ignore[call-overload]
        else:
            conn.execute(  # type: ignore[call-overload]
                f"DELETE FROM {audit}.campaign_chunk WHERE chunk_index = 3"
            )
        before = conn.execute(f"SELECT count(*) FROM {audit}.campaign").fetchone()  # type: ignore[call-overload]
    refused = ledger(env, cwd, "status", "--process", "payments")
    assert refused.returncode == 3, refused.stderr
    for args in (("--reason", "wrong source"), ("--undo",)):
        done = ledger(env, cwd, "cancel", "--process", "payments", *args)
        assert done.returncode == 3, done.stderr
        assert json.loads(done.stderr.strip().splitlines()[-1])["code"].startswith("DPONE_LEDGER_")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        after = conn.execute(f"SELECT count(*) FROM {audit}.campaign").fetchone()  # type: ignore[call-overload]
    assert after == before


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


def _last_error(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(done.stderr.strip().splitlines()[-1])
    return record


@pytest.mark.parametrize("where", ["missing-folder/x.html", "a-folder"])
def test_status_html_that_cannot_be_written_is_refused_before_anything_is_written(
    campaign: tuple[Path, dict[str, str]], where: str
) -> None:
    """Regression: a missing folder or a folder as FILE was DPONE_INTERNAL (FileNotFoundError)
    after the status had printed."""
    cwd, env = campaign
    (cwd / "a-folder").mkdir()
    done = ledger(env, cwd, "status", "--process", "payments", "--html", where)
    assert done.returncode == 3, done.stderr
    record = _last_error(done)
    assert record["code"] == "DPONE_OUTPUT_UNWRITABLE" and "--html" in record["message"]
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (cwd / "missing-folder").exists() and not list((cwd / "a-folder").iterdir())


@pytest.mark.parametrize(
    "by",
    ["ana\n  committed: chunks 1-10 outside Airflow", "ana\x1b[2J", "", "x" * 501],
    ids=["newline", "escape", "empty", "too-long"],
)
def test_restate_by_is_checked_as_the_reason_is(
    campaign: tuple[Path, dict[str, str]], by: str
) -> None:
    cwd, env = campaign
    done = ledger(
        env, cwd, "restate", "--process", "payments", "--chunks", "1", "--reason", "r", "--by", by
    )
    assert done.returncode == 2, done.stderr
    assert _last_error(done)["code"] == "DPONE_USAGE" and "--by" in done.stderr
    status = json.loads(
        ledger(env, cwd, "status", "--process", "payments", "--format", "json").stdout
    )
    assert status["restated"] == [] and status["counts"]["committed"] == 6


def test_status_text_escapes_stored_text(
    campaign: tuple[Path, dict[str, str]], pg_dsn: str
) -> None:
    """Defence in depth: text a ledger row holds (written by an older dpone, or by hand) cannot
    forge a status line or reach the terminal as an escape sequence."""
    cwd, env = campaign
    _, packs, _ = load_and_compile(str(cwd / "workloads.yaml"))
    plan = packs[0].processes[0]
    assert plan.run_key and plan.backfill_plan_hash
    shape = CampaignShape(
        plan.run_key, "payments_daily", plan.name, plan.backfill_plan_hash, plan.config_hash,
        plan.chunks,
    )  # fmt: skip
    schema = plan.config.state.schema
    store = open_store("audit_schema", pg_dsn, schema, None)
    try:
        assert store.restate(shape, [1], "why\n  committed: chunks 1-10 forged", "a\x1b[2Jb") == [1]
    finally:
        store.close()
    text = ledger(env, cwd, "status", "--process", "payments")
    assert text.returncode == 0, text.stderr
    assert "\x1b" not in text.stdout and "forged" in text.stdout
    assert not any(
        line.startswith("  committed: chunks 1-10 forged") for line in text.stdout.splitlines()
    )
    assert "a\\x1b[2Jb" in text.stdout and "why\\n  committed" in text.stdout


def test_restate_json_names_the_inner_mode_and_says_what_moving_again_does(
    campaign: tuple[Path, dict[str, str]],
) -> None:
    cwd, env = campaign
    done = ledger(
        env, cwd, "restate", "--process", "payments", "--chunks", "1", "--reason", "r",
        "--by", "ana", "--dry-run", "--format", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == "dpone.ledger-restate.v1" and doc["inner_mode"] == "merge"
    assert doc["moving_again"].startswith("upserts on the keys")
    assert doc["requested_by"] == "ana" and doc["restated"] == [1]
    assert doc["cancelled"] is False


def test_a_restatement_of_a_cancelled_campaign_says_nothing_moves_until_the_undo(
    campaign: tuple[Path, dict[str, str]],
) -> None:
    cwd, env = campaign
    assert ledger(env, cwd, "cancel", "--process", "payments").returncode == 0
    done = ledger(env, cwd, "restate", "--process", "payments", "--chunks", "1", "--reason", "r")
    assert done.returncode == 0, done.stderr
    assert "the campaign is cancelled: no chunk moves" in done.stdout
    assert "next: lift the cancellation, then run the campaign again" in done.stdout
    as_json = ledger(
        env, cwd, "restate", "--process", "payments", "--chunks", "2", "--reason", "r",
        "--format", "json",
    )  # fmt: skip
    assert json.loads(as_json.stdout)["cancelled"] is True


def _schema_exists(dsn: str, schema: str) -> bool:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return row is not None


def test_restate_cancel_and_status_of_a_ledger_that_does_not_exist_create_nothing(
    campaign: tuple[Path, dict[str, str]], pg_dsn: str
) -> None:
    """Regression: restate and cancel created the audit schema (seven tables), then refused."""
    cwd, env = campaign
    fresh = f"dpone_absent_{uuid.uuid4().hex[:10]}"
    manifest = cwd / "payments.yaml"
    text = manifest.read_text(encoding="utf-8")
    manifest.write_text(re.sub(r"schema: dpone_status_\w+", f"schema: {fresh}", text))
    try:
        for args in (
            ("restate", "--process", "payments", "--chunks", "1", "--reason", "r"),
            ("cancel", "--process", "payments"),
        ):
            done = ledger(env, cwd, *args)
            assert done.returncode == 2, done.stderr
            record = _last_error(done)
            assert record["code"] == "DPONE_USAGE" and "not in the ledger" in record["message"]
        shown = ledger(env, cwd, "status", "--process", "payments", "--format", "json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["exists"] is False
        assert not _schema_exists(pg_dsn, fresh), "a refused command created the ledger"
    finally:
        import psycopg

        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {fresh} CASCADE")


LOCAL_CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  payments_daily:
    manifest: payments.yaml
    airflow: {image: registry.example.com/dpone-runtime:0.1.0}
"""


def test_restate_and_cancel_of_a_local_file_ledger_that_does_not_exist_create_nothing(
    tmp_path: Path,
) -> None:
    """Regression: an empty ledger.journal and ledger.lock appeared, then the command refused."""
    process = PROCESS.format(name="payments", schema="unused").replace(
        "{backend: audit_schema, connection: warehouse, schema: unused, "
        "require_distributed_lock: true}",
        "{backend: local_file, path: state/ledger}",
    )
    (tmp_path / "workloads.yaml").write_text(LOCAL_CATALOG, encoding="utf-8")
    (tmp_path / "payments.yaml").write_text(
        "schema: dpone.pipeline.v1\nprocesses:\n" + process, encoding="utf-8"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env["DPONE_CONN_WAREHOUSE"] = "postgresql://nobody@127.0.0.1:9/none"
    for args in (
        ("restate", "--chunks", "1", "--reason", "r"),
        ("cancel",),
    ):
        done = ledger(env, tmp_path, *args)
        assert done.returncode == 2, done.stderr
        assert "not in the ledger" in _last_error(done)["message"]
    shown = ledger(env, tmp_path, "status", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    assert not (tmp_path / "state").exists(), "a refused command created the ledger"


SNAPSHOT_ONLY = ("--catalog", "cat/workloads.yaml", "--workload", "customers_snapshot")


@pytest.mark.parametrize(
    "action",
    [
        ("status",),
        ("status", "--format", "json"),
        ("cancel",),
        ("restate", "--chunks", "1", "--reason", "x"),
    ],
    ids=["status", "status-json", "cancel", "restate"],
)
def test_a_workload_without_a_chunked_process_is_a_usage_error(
    tmp_path: Path, pg_dsn: str, action: tuple[str, ...]
) -> None:
    """Regression: a workload whose every process is a full_refresh (no campaign in the ledger)
    printed nothing and exited 0 for status, and for cancel, which cancelled nothing."""
    import shutil

    shutil.copytree(ROOT / "golden" / "multi_workload", tmp_path / "cat")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    env["DPONE_CONN_WAREHOUSE"] = pg_dsn
    done = subprocess.run(
        [str(DPONE), "ledger", *action, *SNAPSHOT_ONLY],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    record = _last_error(done)
    assert record["code"] == "DPONE_USAGE" and "no chunked process" in record["message"]
    assert done.stdout == "" and "Traceback" not in done.stderr
