"""A generated DAG (subprocess flavour) under a real scheduler: `airflow scheduler` with
LocalExecutor on a Postgres metadata database of its own (3.x also with its dag-processor and
api-server; 2.x with the webserver for the REST API), on Airflow 3.3.2 and 2.10.5.

The e2e project's 365-day summary (40 mapped items, max_active 8, retries 2) runs with its pool
throttled to 3 slots through `airflow pools set`, without regenerating anything. One item meets a
row the target's CHECK refuses (DPONE_SINK_FAILED, not retryable); another finds one of its chunks
leased by a foreign holder (DPONE_BACKFILL_CHUNK_BUSY, retryable) until the test sees it waiting
for its retry. Measured:

- from the ledger's transition times, never more items moving at once than the pool's slots;
- the non-retryable failure ends after one try, the retryable one succeeds on its second;
- clearing that one map index (3.x: the REST API; 2.x, whose REST API clears whole tasks only: the
  webserver's /clear that the Grid uses) re-runs that item only;
- the map_index_template labels come back from the REST API.

Credentials as a deployment keeps them. The data database lives on a private Postgres cluster
that checks every password (scram-sha-256; the shared test server trusts local connections and
would accept any): its tables belong to the role `dpone_loader`, whose password holds
`/ @ : ? # %`. The scheduler's environment has no DPONE_CONN_*: the catalog names the Airflow
Connection `dpone_e2e` (`airflow.airflow_connections`, defined as AIRFLOW_CONN_DPONE_E2E with user,
host, port and database but no password) and the password file (`airflow.secret_files`, field
password, DPONE_CONN_E2E_PASSWORD_FILE in the generated env). The test first shows the server
refuses the Connection's URI alone, so every committed chunk proves the operator resolved the
Connection and the child put the file's password into it. No password (raw or percent-encoded) is
in the ledger's rows, the XCom results, the evidence files, the task logs or the DAG file.

The Airflow run in every record, for the retried item and the cleared map index: the result
(XCom, try 2 / the re-run's new try, its map index, the run id, dag and task ids), the evidence of
each try, each ledger transition's lease owner (`airflow try=T map=M run=R on ...`, every committed
chunk owned by its own item's map index and this run), and `dpone ledger status --format json`'s
`moved_by`.
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
from urllib.parse import quote

import psycopg
import pytest
import schedkit  # puts tests/e2e (e2ekit) and tests (pg) on sys.path
from dpone.ledger.factory import open_store
from dpone.ledger.port import ChunkResult, LeaseStatus
from dpone.packing.pack import load_and_compile
from dpone.packing.verify import Selection
from dpone.run.orchestrator import RunContext, RunSettings
from dpone.task.airflow_context import attribution
from pg import scram_cluster, scram_cluster_available
from psycopg import sql

e2ekit = schedkit.e2ekit

VERSIONS = ["3.3.2", "2.10.5"]
POOL = "dpone_e2e"
SLOTS = 3  # smaller than the catalog's max_active 8
NON_RETRYABLE_ITEM = 20  # chunks 186..194; the bad row is on chunk 190
BAD_DAY = 189
RETRYABLE_ITEM = 33
HOLDER = "dpone-test-holder:1"
RUN_ID = "dpone_scheduler_test"
CONN_ID = "dpone_e2e"
LOADER = "dpone_loader"
LOADER_PASSWORD = "Sched-" + uuid.uuid4().hex[:10] + "/@:?#%"
ADMIN_PASSWORD = "Sched-admin-" + uuid.uuid4().hex[:10]
REPORT: dict[str, Any] = {}

pytestmark = [pytest.mark.postgres, pytest.mark.airflow]


@pytest.fixture(scope="module")
def data_db() -> Iterator[str]:
    """The data database on a private SCRAM cluster, owned (and seeded) by LOADER; its DSN (the
    loader's, with the password, for the test's own checks)."""
    if not scram_cluster_available():
        pytest.fail("needs root, runuser and initdb for the private SCRAM cluster", pytrace=False)
    with scram_cluster(ADMIN_PASSWORD) as port:
        admin = psycopg.conninfo.make_conninfo(
            host="127.0.0.1", port=port, user="postgres", password=ADMIN_PASSWORD, dbname="postgres"
        )
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(LOADER), sql.Literal(LOADER_PASSWORD)
                )
            )
        with e2ekit.private_database(admin, prefix="dpone_sched_data") as owned:
            info = psycopg.conninfo.conninfo_to_dict(owned)
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                        sql.Identifier(str(info["dbname"])), sql.Identifier(LOADER)
                    )
                )
            dsn = psycopg.conninfo.make_conninfo(owned, user=LOADER, password=LOADER_PASSWORD)
            e2ekit.seed(dsn)
            yield dsn


def _url(dsn: str, password: bool = True) -> str:
    """The DSN as a URL, its password percent-encoded (or left out)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    secret = ":" + quote(str(info["password"]), safe="") if password else ""
    return f"postgresql://{info['user']}{secret}@{info['host']}:{info['port']}/{info['dbname']}"


def _project(root: Path, password_file: Path) -> tuple[Path, Path, Path]:
    """The e2e project with `retries: 2`, `retry_delay: 2` on the summary workload, its connection
    from the Airflow Connection CONN_ID plus the password file; its DAG and pools files."""
    catalog = e2ekit.copy_project(root / "project")
    text = catalog.read_text(encoding="utf-8")
    marker = "      dag_id: dpone_e2e_orders_summary\n"
    assert marker in text
    options = (
        "      retries: 2\n      retry_delay: 2\n"
        f"      airflow_connections: [{{connection: e2e, conn_id: {CONN_ID}}}]\n"
        "      secret_files: [{connection: e2e, field: password, "
        f"path: {json.dumps(str(password_file))}}}]\n"
    )
    catalog.write_text(text.replace(marker, marker + options), encoding="utf-8")
    out = root / "generated"
    result = e2ekit.dpone("generate", str(catalog), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return catalog, out / f"{e2ekit.SUMMARY_DAG}.py", out / "dpone_pools.json"


def _plan(catalog: Path) -> tuple[Any, Any]:
    _, packs, problems = load_and_compile(str(catalog))
    assert not problems
    (pack,) = [p for p in packs if p.workload.name == "orders_summary"]
    return pack, pack.processes[0]


def _hold_a_chunk(pack: Any, plan: Any, data_dsn: str) -> tuple[Any, Any, Any]:
    """Initialise the campaign and lease the retryable item's first chunk as a foreign holder."""
    ctx = RunContext(pack, plan, Selection(plan.chunks, None, None), RunSettings())
    store = open_store("audit_schema", dsn=_url(data_dsn), schema=e2ekit.AUDIT, path=None)
    store.initialize(ctx.shape(), HOLDER, 30)
    chunk = plan.chunks[plan.mapping_plan.items[RETRYABLE_ITEM].first_chunk_index - 1]
    outcome = store.acquire_lease(ctx.shape(), chunk, HOLDER, 3600)
    assert outcome.status is LeaseStatus.ACQUIRED and outcome.lease is not None
    return store, outcome.lease, chunk


def _labels(dag_file: Path) -> list[str]:
    return re.findall(r'"DPONE_AIRFLOW_MAPPING_LABEL": "([^"]*)"', dag_file.read_text())


@pytest.mark.parametrize("version", VERSIONS)
def test_summary_dag_under_a_real_scheduler(
    version: str, data_db: str, pg_dsn: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    python = e2ekit.airflow_python(version)
    password_file = tmp_path / "secrets" / "e2e_password"
    password_file.parent.mkdir()
    password_file.write_text(LOADER_PASSWORD + "\n", encoding="utf-8")
    catalog, dag_file, pools = _project(tmp_path, password_file)
    pack, plan = _plan(catalog)
    items = plan.mapping_plan.items
    assert plan.chunks_total == 365 and len(items) == 40
    e2ekit.reset_summary(data_db)
    bad_row = e2ekit.break_row(data_db, BAD_DAY)
    store, held, held_chunk = _hold_a_chunk(pack, plan, data_db)
    home = tmp_path / "airflow-home"
    (home / "dags").mkdir(parents=True)
    (home / "dags" / dag_file.name).write_bytes(dag_file.read_bytes())
    report: dict[str, Any] = {"airflow_version": version, "pool_slots": SLOTS, "max_active": 8}
    connection_uri = _url(data_db, password=False)  # user, host, port, database: no password
    with pytest.raises(psycopg.OperationalError):  # the server checks passwords
        psycopg.connect(connection_uri, connect_timeout=10).close()
    evidence = tmp_path / "evidence"
    try:
        with e2ekit.private_database(pg_dsn, prefix="dpone_sched_meta") as meta:
            env = {
                f"AIRFLOW_CONN_{CONN_ID.upper()}": connection_uri,
                "DPONE_EVIDENCE_DIR": str(evidence),
            }
            deployment = schedkit.Deployment(version, python, home, meta, env)
            t = time.monotonic()
            deployment.cli("db", "migrate", timeout=600)
            report["db_migrate_seconds"] = round(time.monotonic() - t, 1)
            deployment.cli("pools", "import", str(pools))
            # throttle: fewer slots than max_active, without touching the DAG file
            deployment.cli(
                "pools",
                "set",
                POOL,
                str(SLOTS),
                "dpone: throttled by the test",
                "--include-deferred",
            )
            with schedkit.running(deployment):
                tries = _scenario(
                    deployment, plan, data_db, dag_file, store, held, held_chunk, bad_row, report
                )
                _context_and_secrets(
                    deployment,
                    tries,
                    catalog,
                    plan,
                    data_db,
                    dag_file,
                    held_chunk,
                    evidence,
                    password_file,
                    report,
                )
    finally:
        store.close()
    report["test_seconds"] = round(time.monotonic() - started, 1)
    REPORT[version] = report
    target = os.environ.get("DPONE_SCHEDULER_REPORT")
    if target:
        Path(target).write_text(json.dumps(REPORT, indent=2, default=str) + "\n")


def _scenario(
    deployment: schedkit.Deployment,
    plan: Any,
    data_db: str,
    dag_file: Path,
    store: Any,
    held: Any,
    held_chunk: Any,
    bad_row: int,
    report: dict[str, Any],
) -> dict[str, dict[int, int]]:
    """The campaign, the retry, the pool and the cleared map index; returns each map index's try
    number after the first run and after the clear."""
    dag_id, task = e2ekit.SUMMARY_DAG, e2ekit.TASK
    items = plan.mapping_plan.items
    run_key = plan.run_key
    t = time.monotonic()
    deployment.wait_for(
        "the DAG to be parsed", lambda: deployment.rest("GET", f"/dags/{dag_id}"), 240
    )
    report["parse_seconds"] = round(time.monotonic() - t, 1)
    deployment.rest("PATCH", f"/dags/{dag_id}", {"is_paused": False})
    trigger: dict[str, Any] = {"dag_run_id": RUN_ID}
    if deployment.major >= 3:
        trigger["logical_date"] = None
    deployment.rest("POST", f"/dags/{dag_id}/dagRuns", trigger)
    t = time.monotonic()

    # The retryable item fails its first try on the held chunk; release the chunk once it waits.
    def waiting_for_retry() -> bool:
        ti = deployment.task_instances(dag_id, RUN_ID).get(RETRYABLE_ITEM)
        return bool(ti and ti["state"] == "up_for_retry")

    deployment.wait_for("the retryable item to wait for its retry", waiting_for_retry, 900)
    store.complete(
        held,
        held_chunk,
        ChunkResult(
            committed=False,
            error_code="DPONE_BACKFILL_CHUNK_BUSY",
            error_message="released by the test",
        ),
    )

    def finished() -> str | None:
        state = deployment.dag_run_state(dag_id, RUN_ID)
        return state if state in ("success", "failed") else None

    assert deployment.wait_for("the DAG run to finish", finished, 900) == "failed"
    report["run_seconds"] = round(time.monotonic() - t, 1)
    tis = deployment.task_instances(dag_id, RUN_ID)
    assert sorted(tis) == list(range(40)), tis
    states = {i: ti["state"] for i, ti in tis.items()}
    assert {i: s for i, s in states.items() if s != "success"} == {NON_RETRYABLE_ITEM: "failed"}

    # Failure semantics: not retryable -> one try; retryable -> a second try that succeeds.
    assert tis[NON_RETRYABLE_ITEM]["try_number"] == 1, tis[NON_RETRYABLE_ITEM]
    assert tis[RETRYABLE_ITEM]["try_number"] == 2, tis[RETRYABLE_ITEM]
    assert {i: ti["try_number"] for i, ti in tis.items() if i not in (NON_RETRYABLE_ITEM, RETRYABLE_ITEM)} == {i: 1 for i in range(40) if i not in (NON_RETRYABLE_ITEM, RETRYABLE_ITEM)}  # fmt: skip
    before = e2ekit.transitions(data_db, run_key)
    bad_chunk = BAD_DAY + 1
    assert [s for _, s, _ in before[bad_chunk]] == ["running", "failed"], before[bad_chunk]
    held_rows = before[held_chunk.index]
    assert held_rows[-1][1] == "committed" and held_rows[-1][2] == 2, held_rows  # attempt 2

    # The pool: never more items moving at once than its slots (ledger times, one clock).
    spans = schedkit.attempt_intervals(data_db, run_key, list(items))
    assert {item for item, _, _ in spans.values()} == set(range(40))
    peak = schedkit.max_overlap([(start, end) for _, start, end in spans.values()])
    assert 2 <= peak <= SLOTS, (peak, sorted(spans.values(), key=lambda s: s[1]))
    report["max_items_moving_at_once"] = peak
    report["mapped_instances"] = len(tis)
    report["first_run_states"] = {
        s: sum(1 for x in states.values() if x == s) for s in set(states.values())
    }

    # Labels through the REST API.
    mapped = deployment.rest(
        "GET", f"/dags/{dag_id}/dagRuns/{RUN_ID}/taskInstances/{task}/listMapped?limit=100"
    )
    rendered = {ti["map_index"]: ti["rendered_map_index"] for ti in mapped["task_instances"]}
    expected = _labels(dag_file)
    assert len(expected) == 40
    assert rendered == dict(enumerate(expected)), rendered
    report["label_example"] = rendered[NON_RETRYABLE_ITEM]

    # The first run's results (XCom): each records its own try, map index and run.
    first = deployment.xcom_results(dag_id, RUN_ID, task)
    assert sorted(first) == list(range(40)), sorted(first)
    for index, result in first.items():
        expected_try = tis[index]["try_number"]
        assert result["airflow"] == _context(index, expected_try, result["airflow"]), result
    assert first[RETRYABLE_ITEM]["status"] == "passed"
    assert first[RETRYABLE_ITEM]["airflow"]["try_number"] == 2
    assert first[NON_RETRYABLE_ITEM]["status"] == "failed"
    assert first[NON_RETRYABLE_ITEM]["error"]["code"] == "DPONE_SINK_FAILED"
    assert first[NON_RETRYABLE_ITEM]["airflow"]["try_number"] == 1

    # Repair the row, clear that one map index through the REST API: only that item runs again.
    e2ekit.repair_row(data_db, bad_row)
    report["clear_one_map_index_via"] = deployment.clear_map_index(
        dag_id, RUN_ID, task, NON_RETRYABLE_ITEM
    )
    t = time.monotonic()
    assert deployment.wait_for("the cleared item's re-run to finish", finished, 600) == "success"
    report["clear_rerun_seconds"] = round(time.monotonic() - t, 1)
    after_tis = deployment.task_instances(dag_id, RUN_ID)
    assert {i: ti["state"] for i, ti in after_tis.items()} == {i: "success" for i in range(40)}
    changed = {i for i in range(40) if after_tis[i]["try_number"] != tis[i]["try_number"]}
    assert changed == {NON_RETRYABLE_ITEM}, changed
    after = e2ekit.transitions(data_db, run_key)
    item = items[NON_RETRYABLE_ITEM]
    moved = {i for i in after if after[i] != before.get(i)}
    assert moved == set(range(bad_chunk, item.last_chunk_index + 1)), sorted(moved)
    for index, rows in after.items():
        assert sum(1 for _, s, _ in rows if s == "committed") == 1, (index, rows)
    assert e2ekit.fingerprint(data_db, "orders_summary") == e2ekit.fingerprint(
        data_db, "orders_src"
    )
    report["rows"] = e2ekit.fingerprint(data_db, "orders_summary")[0]
    tries_report = {"first_run": {i: ti["try_number"] for i, ti in tis.items()}}
    tries_report["after_clear"] = {i: ti["try_number"] for i, ti in after_tis.items()}
    return tries_report


def _context(map_index: int, try_number: int, seen: dict[str, Any]) -> dict[str, Any]:
    """The `airflow` section a result of this task instance must hold (dates as recorded)."""
    return {
        "outside_airflow": False,
        "dag_id": e2ekit.SUMMARY_DAG,
        "task_id": e2ekit.TASK,
        "run_id": RUN_ID,
        "try_number": try_number,
        "map_index": map_index,
        "logical_date": seen.get("logical_date"),
        "data_interval_start": seen.get("data_interval_start"),
        "data_interval_end": seen.get("data_interval_end"),
    }


def _by(map_index: int, try_number: int) -> dict[str, Any]:
    return {
        "outside_airflow": False,
        "run_id": RUN_ID,
        "try_number": try_number,
        "map_index": map_index,
    }


def _context_and_secrets(
    deployment: schedkit.Deployment,
    all_tries: dict[str, dict[int, int]],
    catalog: Path,
    plan: Any,
    data_db: str,
    dag_file: Path,
    held_chunk: Any,
    evidence: Path,
    password_file: Path,
    report: dict[str, Any],
) -> None:
    """The Airflow run in the results, the evidence, the ledger's transitions and `ledger status`
    for the retried item and the cleared map index; no password anywhere the test can read."""
    dag_id, task = e2ekit.SUMMARY_DAG, e2ekit.TASK
    items = plan.mapping_plan.items
    tries = all_tries["after_clear"]
    rerun_try = tries[NON_RETRYABLE_ITEM]
    assert rerun_try == all_tries["first_run"][NON_RETRYABLE_ITEM] + 1, tries
    report["retried_item"] = {"map_index": RETRYABLE_ITEM, "try": tries[RETRYABLE_ITEM]}
    report["cleared_item"] = {"map_index": NON_RETRYABLE_ITEM, "re_run_try": rerun_try}

    # Results (XCom) after the clear: every item's last try, the re-run with its new try.
    results = deployment.xcom_results(dag_id, RUN_ID, task)
    assert sorted(results) == list(range(40)), sorted(results)
    for index, result in results.items():
        assert result["status"] == "passed", (index, result)
        assert result["airflow"] == _context(index, tries[index], result["airflow"]), result
    assert results[NON_RETRYABLE_ITEM]["airflow"]["try_number"] == rerun_try
    assert results[RETRYABLE_ITEM]["airflow"]["try_number"] == 2

    # Evidence: one file per try, each naming its own try.
    def evidence_tries(index: int) -> list[tuple[int, str]]:
        docs = [
            json.loads(path.read_text(encoding="utf-8"))
            for path in (evidence / plan.run_key).glob(f"item-{index:03d}.*.json")
        ]
        return sorted((d["result"]["airflow"]["try_number"], d["result"]["status"]) for d in docs)

    assert evidence_tries(RETRYABLE_ITEM) == [(1, "failed"), (2, "passed")]
    assert evidence_tries(NON_RETRYABLE_ITEM) == [(1, "failed"), (rerun_try, "passed")]

    # Ledger transitions: every lease owner of this run names the run, its try and its own map
    # index; the held chunk was committed by try 2; the cleared item's re-run by its new try.
    owners = schedkit.lease_owners(data_db, plan.run_key)
    committed_by: dict[int, dict[str, Any] | None] = {}
    for item in items:
        for index in range(item.first_chunk_index, item.last_chunk_index + 1):
            for state, _, owner in owners[index]:
                if owner is None or owner.startswith("dpone-test-holder"):
                    continue
                who = attribution(owner)
                assert who is not None and who["run_id"] == RUN_ID, (index, owner)
                assert who["map_index"] == item.item_index, (index, owner)
                assert who["try_number"] <= tries[item.item_index], (index, owner)
                if state == "committed":
                    committed_by[index] = who
    assert len(committed_by) == plan.chunks_total
    assert committed_by[held_chunk.index] == _by(RETRYABLE_ITEM, 2)
    held_states = [(s, attribution(o) if o else None) for s, _, o in owners[held_chunk.index]]
    by_try_2 = _by(RETRYABLE_ITEM, 2)
    assert held_states[-2:] == [("running", by_try_2), ("committed", by_try_2)], held_states
    bad = items[NON_RETRYABLE_ITEM]
    bad_chunk = BAD_DAY + 1
    failed = [attribution(o) for s, _, o in owners[bad_chunk] if s == "failed"]
    assert failed == [_by(NON_RETRYABLE_ITEM, 1)], owners[bad_chunk]
    for index in range(bad_chunk, bad.last_chunk_index + 1):
        assert committed_by[index] == _by(NON_RETRYABLE_ITEM, rerun_try), index
    for index in range(bad.first_chunk_index, bad_chunk):
        assert committed_by[index] == _by(NON_RETRYABLE_ITEM, 1), index

    # `dpone ledger status`: moved_by names the same run, try and map index.
    status = subprocess.run(
        [
            str(e2ekit.DPONE),
            *("ledger", "status", "--catalog", str(catalog)),
            *("--workload", "orders_summary", "--format", "json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("DPONE_")},
            "DPONE_CONN_E2E": _url(data_db, password=False),
            "DPONE_CONN_E2E_PASSWORD_FILE": str(password_file),
        },
    )
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    groups = doc["moved_by"]
    assert all(g["state"] == "committed" for g in groups), groups
    by_chunk = {
        i: g["by"] for g in groups for i in range(g["first_chunk_index"], g["last_chunk_index"] + 1)
    }
    assert by_chunk == committed_by
    report["moved_by_groups"] = len(groups)

    # No password (raw or percent-encoded) in what the test can read.
    logs = deployment.task_logs()
    attempts = [name for name in logs if f"map_index={RETRYABLE_ITEM}/" in name]
    assert len(attempts) == 2, sorted(logs)
    assert len(logs) >= 40 + 2, len(logs)
    shown = {
        "ledger rows": schedkit.ledger_rows_text(data_db),
        "results": json.dumps(results) + json.dumps(report),
        "evidence": "\n".join(p.read_text() for p in evidence.rglob("*.json")),
        "task logs": "\n".join(logs.values()),
        "airflow logs": "\n".join(
            p.read_text(errors="replace") for p in deployment.home.glob("*.log")
        ),
        "dag file": dag_file.read_text(encoding="utf-8"),
        "ledger status": status.stdout + status.stderr,
    }
    for where, text in shown.items():
        for needle in (LOADER_PASSWORD, quote(LOADER_PASSWORD, safe="")):
            assert needle not in text, f"the password is in the {where}"
    report["task_logs_scanned"] = len(logs)
