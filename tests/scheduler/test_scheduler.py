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
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schedkit  # puts tests/e2e on sys.path for e2ekit
from dpone.ledger.factory import open_store
from dpone.ledger.port import ChunkResult, LeaseStatus
from dpone.orchestrator import RunContext, RunSettings
from dpone.pack import load_and_compile
from dpone.verify import Selection

e2ekit = schedkit.e2ekit

VERSIONS = ["3.3.2", "2.10.5"]
POOL = "dpone_e2e"
SLOTS = 3  # smaller than the catalog's max_active 8
NON_RETRYABLE_ITEM = 20  # chunks 186..194; the bad row is on chunk 190
BAD_DAY = 189
RETRYABLE_ITEM = 33
HOLDER = "dpone-test-holder:1"
RUN_ID = "dpone_scheduler_test"
REPORT: dict[str, Any] = {}

pytestmark = [pytest.mark.postgres, pytest.mark.airflow]


@pytest.fixture(scope="module")
def data_db(pg_dsn: str) -> Iterator[str]:
    with e2ekit.private_database(pg_dsn, prefix="dpone_sched_data") as dsn:
        e2ekit.seed(dsn)
        yield dsn


def _project(root: Path) -> tuple[Path, Path, Path]:
    """The e2e project with `retries: 2`, `retry_delay: 2` on the summary workload; its DAG and
    pools files."""
    catalog = e2ekit.copy_project(root / "project")
    text = catalog.read_text(encoding="utf-8")
    marker = "      dag_id: dpone_e2e_orders_summary\n"
    assert marker in text
    options = "      retries: 2\n      retry_delay: 2\n"
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
    store = open_store("audit_schema", dsn=e2ekit.as_url(data_dsn), schema=e2ekit.AUDIT, path=None)
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
    catalog, dag_file, pools = _project(tmp_path)
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
    try:
        with e2ekit.private_database(pg_dsn, prefix="dpone_sched_meta") as meta:
            env = {"DPONE_CONN_E2E": e2ekit.as_url(data_db)}
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
                _scenario(
                    deployment, plan, data_db, dag_file, store, held, held_chunk, bad_row, report
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
) -> None:
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
