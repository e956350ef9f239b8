"""The Airflow run in every record, on real Airflow 3.3.2 and 2.10.5, both flavours.

The generated operator reads the task context at execute time and passes it as
DPONE_AIRFLOW_CONTEXT; the run records it in its result (XCom) and evidence, and in the lease
owner of every ledger transition it writes, which `dpone ledger status` reads back. `dag.test()`
runs the e2e project's summary workload cut to 5 items of 2 chunks with `retries: 1`; item 2's
first chunk is leased by a foreign holder, so both of its tries fail busy (the results name try 1
and try 2). The holder is then released and map index 2 is cleared and run again (the harness's
``clearrun``, on 3.3.2 with the subprocess flavour): its chunks are committed by that try of that
map index, as Airflow numbers it. clearrun re-runs through the Airflow CLI in a new process, where
kubernetes has no local pods, and 2.10.5's `tasks run --local` does not start a task of the failed
DAG run. kubernetes runs each pod's command as a local process (``--local-pods``: no cluster).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import e2ekit
import psycopg
import pytest
from dpone import errors
from dpone.ledger.factory import open_store
from dpone.ledger.port import ChunkResult, LeaseStatus
from dpone.packing.pack import load_and_compile
from dpone.packing.verify import Selection
from dpone.run.orchestrator import RunContext, RunSettings
from psycopg import sql

VERSIONS = ["3.3.2", "2.10.5"]
BUSY = 2
HOLDER = "dpone-test-holder:context"

pytestmark = [pytest.mark.postgres, pytest.mark.airflow]


@pytest.fixture(scope="module")
def e2e_db(pg_dsn: str) -> Iterator[str]:
    with e2ekit.private_database(pg_dsn, prefix="dpone_context_e2e") as dsn:
        e2ekit.seed(dsn)
        yield dsn


def _project(root: Path, flavour: str) -> Path:
    catalog = e2ekit.copy_project(root / "project")
    text = catalog.read_text(encoding="utf-8")
    if flavour == "kubernetes":
        text = text.replace(
            "    flavour: subprocess\n",
            "    flavour: kubernetes\n    image: registry.example.invalid/dpone-runtime:test\n"
            "    secrets: [{connection: e2e, secret: dpone-e2e, key: dsn}]\n",
        )
    mapping = "mapping: {mode: summary, max_items: 40, max_active: 8, pool: dpone_e2e}"
    assert mapping in text
    text = text.replace(
        mapping,
        "mapping: {mode: summary, max_items: 5, max_active: 5, pool: dpone_e2e}\n"
        "      retries: 1\n      retry_delay: 0",
    )
    catalog.write_text(text, encoding="utf-8")
    manifest = catalog.with_name("orders_summary.yaml")
    text = manifest.read_text(encoding="utf-8")
    manifest.write_text(text.replace("end: 2024-01-01", "end: 2023-01-11"), encoding="utf-8")
    return catalog


def _hold(catalog: Path, dsn: str) -> tuple[Any, Any, Any, str]:
    """A foreign holder's lease on item BUSY's first chunk: the store, the chunk, the lease and
    the campaign's run key."""
    _, packs, problems = load_and_compile(str(catalog))
    assert not problems
    (pack,) = [p for p in packs if p.workload.name == "orders_summary"]
    plan = pack.processes[0]
    assert plan.mapping_plan is not None and plan.mapping_plan.items_total == 5
    ctx = RunContext(pack, plan, Selection(plan.chunks, None, None), RunSettings())
    store = open_store("audit_schema", dsn=e2ekit.as_url(dsn), schema=e2ekit.AUDIT, path=None)
    store.initialize(ctx.shape(), HOLDER, 30)
    chunk = plan.chunks[plan.mapping_plan.items[BUSY].first_chunk_index - 1]
    held = store.acquire_lease(ctx.shape(), chunk, HOLDER, 3600)
    assert held.status is LeaseStatus.ACQUIRED
    return store, chunk, held.lease, plan.run_key


def _owners(dsn: str, run_key: str) -> dict[int, list[tuple[str, str]]]:
    """chunk index -> [(state, lease owner)] of every transition, in order."""
    out: dict[int, list[tuple[str, str]]] = {}
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            sql.SQL(
                "SELECT chunk_index, state, lease_owner FROM {}.chunk_transition "
                "WHERE run_key = %s ORDER BY chunk_index, transition"
            ).format(sql.Identifier(e2ekit.AUDIT)),
            (run_key,),
        ).fetchall()
    for index, state, owner in rows:
        out.setdefault(int(index), []).append((str(state), str(owner)))
    return out


def _moved_by(run_id: str, try_number: int, map_index: int) -> str:
    return f"airflow try={try_number} map={map_index} run={run_id} on "


@pytest.mark.parametrize("flavour", ["subprocess", "kubernetes"])
@pytest.mark.parametrize("version", VERSIONS)
def test_the_airflow_run_is_in_every_record(
    version: str, flavour: str, e2e_db: str, tmp_path: Path
) -> None:
    python = e2ekit.airflow_python(version)
    catalog = _project(tmp_path, flavour)
    out = tmp_path / "dags"
    generated = e2ekit.dpone("generate", str(catalog), "--out", str(out))
    assert generated.returncode == 0, generated.stderr
    dag_file = out / f"{e2ekit.SUMMARY_DAG}.py"
    assert "DPONE_AIRFLOW_CONTEXT" not in generated.stdout
    e2ekit.reset_summary(e2e_db)
    store, chunk, lease, run_key = _hold(catalog, e2e_db)
    evidence = tmp_path / "evidence"
    env = {"DPONE_CONN_E2E": e2ekit.as_url(e2e_db), "DPONE_EVIDENCE_DIR": str(evidence)}
    home = tmp_path / "airflow-home"
    local = ["--local-pods"] if flavour == "kubernetes" else []
    try:
        facts = e2ekit.harness(
            python,
            env,
            "dagtest",
            "--home",
            str(home),
            "--dag-file",
            str(dag_file),
            "--task-id",
            e2ekit.TASK,
            *local,
        )
        # the holder gives up (a failed attempt): the cleared map index may take the chunk
        store.complete(lease, chunk, ChunkResult(False, error_code=errors.CONNECTION_FAILED))
    finally:
        store.close()
    run_id = facts["run_id"]
    tis = {t["map_index"]: t for t in facts["task_instances"] if t["task_id"] == e2ekit.TASK}
    assert sorted(tis) == [0, 1, 2, 3, 4], facts["_log_tail"]
    assert (tis[BUSY]["state"], tis[BUSY]["try_number"]) == ("failed", 2), facts["_log_tail"]
    for index in (0, 1, 3, 4):
        assert (tis[index]["state"], tis[index]["try_number"]) == ("success", 1), tis
        result = facts["xcom"][f"{e2ekit.TASK}[{index}]"]
        assert result["airflow"] == {
            **result["airflow"],
            "outside_airflow": False,
            "dag_id": e2ekit.SUMMARY_DAG,
            "task_id": e2ekit.TASK,
            "run_id": run_id,
            "try_number": 1,
            "map_index": index,
        }, result["airflow"]
    busy = facts["xcom"][f"{e2ekit.TASK}[{BUSY}]"]  # the last try's result
    assert busy["error"]["code"] == errors.CHUNK_BUSY
    assert (busy["airflow"]["try_number"], busy["airflow"]["map_index"]) == (2, BUSY), busy
    # the evidence of both busy tries: try 1 and try 2 of the same map index
    busy_tries = sorted(
        json.loads(p.read_text(encoding="utf-8"))["result"]["airflow"]["try_number"]
        for p in (evidence / run_key).glob(f"item-{BUSY:03d}.*.json")
    )
    assert busy_tries == [1, 2], busy_tries
    owners = _owners(e2e_db, run_key)
    for index in (0, 1, 3, 4):
        for chunk in (2 * index + 1, 2 * index + 2):
            states = [state for state, _ in owners[chunk]]
            assert states == ["running", "committed"], owners[chunk]
            for _, owner in owners[chunk]:
                assert owner.startswith(_moved_by(run_id, 1, index)), owner

    if flavour == "kubernetes" or version.startswith("2."):
        # the harness's clearrun re-runs through the Airflow CLI in a new process, where the
        # local pods are not installed; on 2.x its `tasks run --local` leaves a task of this
        # failed DAG run unstarted (the cleared run is queued, not running): the cleared map
        # index is proven on 3.3.2, subprocess flavour
        return
    cleared = e2ekit.harness(
        python,
        env,
        "clearrun",
        "--home",
        str(home),
        "--dag-id",
        e2ekit.SUMMARY_DAG,
        "--task-id",
        e2ekit.TASK,
        "--run-id",
        run_id,
        "--map-index",
        str(BUSY),
        timeout=900,
    )
    assert cleared["returncode"] == 0, cleared["output_tail"]
    (ti,) = [t for t in cleared["task_instances"] if t["task_id"] == e2ekit.TASK]
    rerun_try = ti["try_number"]
    assert rerun_try >= 2, ti
    owners = _owners(e2e_db, run_key)
    for chunk in (2 * BUSY + 1, 2 * BUSY + 2):
        moved = [(state, owner) for state, owner in owners[chunk] if owner != HOLDER]
        assert [state for state, _ in moved][-2:] == ["running", "committed"], (
            owners[chunk],
            cleared["states_after_rerun"],
            cleared["output_tail"][-2500:],
        )
        for _, owner in moved[-2:]:
            assert owner.startswith(_moved_by(run_id, rerun_try, BUSY)), (owner, rerun_try)
    rerun = cleared["xcom"].get(f"{e2ekit.TASK}[{BUSY}]")
    if rerun is not None and rerun.get("status") == "passed":
        assert rerun["airflow"]["try_number"] == rerun_try, rerun["airflow"]
    status = e2ekit.dpone(
        "ledger",
        "status",
        "--catalog",
        str(catalog),
        "--workload",
        "orders_summary",
        "--format",
        "json",
        env={"DPONE_CONN_E2E": e2ekit.as_url(e2e_db)},
    )
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    groups = {
        (g["first_chunk_index"], g["last_chunk_index"]): g["by"]
        for g in doc["moved_by"]
        if g["state"] == "committed"
    }
    assert groups[(2 * BUSY + 1, 2 * BUSY + 2)] == {
        "outside_airflow": False,
        "run_id": run_id,
        "try_number": rerun_try,
        "map_index": BUSY,
    }, doc["moved_by"]
    assert groups[(1, 2)]["try_number"] == 1 and groups[(1, 2)]["map_index"] == 0
    print(json.dumps({"airflow": version, "flavour": flavour, "rerun_try": rerun_try}))
