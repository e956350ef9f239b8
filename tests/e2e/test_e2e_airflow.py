"""End to end: a generated DAG (subprocess flavour) run by real Airflow 3.3.2 and 2.10.5 against
the real Postgres, for the contract's success scenario.

A 365-day daily backfill (2023) in summary mode with 40 mapped items under ``dag.test()`` in a
throwaway AIRFLOW_HOME; each mapped task runs the project venv's real ``dpone run``. A row that
breaks the target's CHECK sits in item 20 (chunk 190): that item fails, the 39 others commit.
The test repairs the row and re-runs only that mapped task (``airflow tasks test ... --map-index
20``), then re-runs a committed item as a no-op, and compares the target with the source and with
an ``internal`` run of the same campaign into another table.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import e2ekit
import pytest
from dpone import errors
from dpone.packing.pack import load_and_compile

VERSIONS = ["3.3.2", "2.10.5"]
FAILING_ITEM = 20  # chunks 186..194 of 365 (divmod(365, 40) = 9 r 5)
BAD_DAY = 189  # 2023-07-09: chunk 190, the item's fifth chunk
REPORT: dict[str, Any] = {}
INTERNAL: dict[str, Any] = {}


@pytest.fixture(scope="module")
def e2e_db(pg_dsn: str) -> Iterator[str]:
    with e2ekit.private_database(pg_dsn) as dsn:
        e2ekit.seed(dsn)
        yield dsn


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("e2e-project")
    catalog = e2ekit.copy_project(root / "project")
    dags = root / "dags"
    result = e2ekit.dpone("generate", str(catalog), "--out", str(dags))
    assert result.returncode == 0, result.stderr
    return {
        "catalog": catalog,
        "summary": dags / f"{e2ekit.SUMMARY_DAG}.py",
        "internal": dags / f"{e2ekit.INTERNAL_DAG}.py",
        "pools": dags / "dpone_pools.json",
    }


def summary_plan(catalog: Path) -> Any:
    _, packs, problems = load_and_compile(str(catalog))
    assert not problems
    (pack,) = [p for p in packs if p.workload.name == "orders_summary"]
    return pack.processes[0]


def mapped_tis(facts: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in facts["task_instances"] if t["task_id"] == e2ekit.TASK]


def internal_fingerprint(
    python: str, env: dict[str, str], generated: dict[str, Path], db: str, home: Path
) -> tuple[int, int]:
    """The internal DAG (one task, the whole campaign) into e2e.orders_internal, run once per
    session on a clean source."""
    if "fingerprint" not in INTERNAL:
        facts = e2ekit.harness(
            python,
            env,
            "dagtest",
            "--home",
            str(home),
            "--dag-file",
            str(generated["internal"]),
        )
        states = [(t["task_id"], t["map_index"], t["state"]) for t in facts["task_instances"]]
        assert states == [(e2ekit.TASK, -1, "success")], states
        result = facts["xcom"][f"{e2ekit.TASK}[-1]"]
        assert result["status"] == "passed" and result["mode"] == "internal"
        assert result["backfill"]["chunks_committed"] == 365
        INTERNAL["fingerprint"] = e2ekit.fingerprint(db, "orders_internal")
        INTERNAL["dag_test_seconds"] = facts["dag_test_seconds"]
        INTERNAL["airflow_version"] = facts["airflow_version"]
    return tuple(INTERNAL["fingerprint"])  # type: ignore[return-value]


def test_generate_refuses_visible_mapping_over_max_items(tmp_path: Path) -> None:
    """visible over 365 chunks with max_items 200: no DAG file, a located structured error."""
    catalog = e2ekit.copy_project(tmp_path / "project").with_name("visible_overflow.yaml")
    out = tmp_path / "dags"
    result = e2ekit.dpone("generate", str(catalog), "--out", str(out), "--format", "json")
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    records = json.loads(result.stdout)
    assert [r["code"] for r in records] == [errors.MAPPING_TASK_LIMIT_EXCEEDED], records
    assert records[0]["file"].endswith("visible_overflow.yaml") and records[0]["line"]
    assert "365 chunks exceed max_items 200" in records[0]["message"]
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.postgres
@pytest.mark.airflow
@pytest.mark.parametrize("version", VERSIONS)
def test_summary_backfill_with_failed_middle_item_and_targeted_retry(
    version: str, e2e_db: str, generated: dict[str, Path], tmp_path: Path
) -> None:
    python = e2ekit.airflow_python(version)
    plan = summary_plan(generated["catalog"])
    assert plan.chunks_total == 365 and plan.mapping_plan.items_total == 40
    item = plan.mapping_plan.items[FAILING_ITEM]
    assert (item.first_chunk_index, item.last_chunk_index) == (186, 194)
    bad_chunk = BAD_DAY + 1
    e2ekit.reset_summary(e2e_db)
    bad_row = e2ekit.break_row(e2e_db, BAD_DAY)
    home = tmp_path / "airflow-home"
    evidence = tmp_path / "evidence"
    env = {"DPONE_CONN_E2E": e2ekit.as_url(e2e_db), "DPONE_EVIDENCE_DIR": str(evidence)}
    report: dict[str, Any] = {"airflow_version": version}

    # 1. The whole DAG under dag.test(): exactly 40 mapped instances, item 20 fails alone.
    facts = e2ekit.harness(
        python,
        env,
        "dagtest",
        "--home",
        str(home),
        "--dag-file",
        str(generated["summary"]),
        "--task-id",
        e2ekit.TASK,
        "--pools",
        str(generated["pools"]),
    )
    assert facts["airflow_version"] == version
    assert facts["import_errors"] == {}
    assert facts["parsed_items"] == 40
    assert facts["parsed_pool"] == "dpone_e2e" and facts["parsed_max_active_tis_per_dag"] == 8
    tis = mapped_tis(facts)
    assert sorted(t["map_index"] for t in tis) == list(range(40)), tis
    states = {t["map_index"]: t["state"] for t in tis}
    assert {i: s for i, s in states.items() if s != "success"} == {FAILING_ITEM: "failed"}
    assert facts["dag_run_state"] == "failed"
    label = {t["map_index"]: t["rendered_map_index"] for t in tis}[FAILING_ITEM]
    assert label and "186-194" in label, label
    failed = facts["xcom"][f"{e2ekit.TASK}[{FAILING_ITEM}]"]
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == errors.SINK_FAILED, failed["error"]
    assert failed["backfill"]["mapping"]["item_status"] == "failed"
    assert (failed["backfill"]["chunks_committed"], failed["backfill"]["chunks_failed"]) == (4, 1)
    assert "73.19" not in json.dumps(failed), "a row value reached XCom"
    run_key = failed["backfill"]["run_key"]
    before = e2ekit.transitions(e2e_db, run_key)
    assert [s for _, s, _ in before[bad_chunk]] == ["running", "failed"]
    assert all(i not in before for i in range(bad_chunk + 1, item.last_chunk_index + 1))
    committed = {i for i, rows in before.items() if rows[-1][1] == "committed"}
    assert committed == set(range(1, 366)) - set(range(bad_chunk, item.last_chunk_index + 1))
    report.update(
        dag_test_seconds=facts["dag_test_seconds"],
        db_migrate_seconds=facts.get("db_migrate_seconds"),
        mapped_instances=len(tis),
        first_run_states=dict(Counter(states.values())),
    )

    # 2. Repair the data, re-run only that mapped task instance.
    e2ekit.repair_row(e2e_db, bad_row)
    retry = e2ekit.harness(
        python,
        env,
        "taskstest",
        "--home",
        str(home),
        "--dag-id",
        e2ekit.SUMMARY_DAG,
        "--task-id",
        e2ekit.TASK,
        "--run-id",
        facts["run_id"],
        "--map-index",
        str(FAILING_ITEM),
    )
    assert retry["returncode"] == 0, retry["output_tail"]
    if version.startswith("3."):
        assert [t["state"] for t in retry["task_instances"]] == ["success"], retry["output_tail"]
    else:  # 2.x `tasks test` runs the task but does not record its state
        assert "Marking task as SUCCESS" in retry["output_tail"], retry["output_tail"]
    after = e2ekit.transitions(e2e_db, run_key)
    moved = {i for i in after if after[i] != before.get(i)}
    assert moved == set(range(bad_chunk, item.last_chunk_index + 1)), sorted(moved)
    assert after[bad_chunk][-1] == (4, "committed", 2)  # attempt 2 after the failed attempt 1
    for index, rows in after.items():
        assert sum(1 for _, state, _ in rows if state == "committed") == 1, (index, rows)
        if index != bad_chunk:
            assert [a for _, _, a in rows] == [1, 1], (index, rows)
    retry_result = retry["xcom"].get(f"{e2ekit.TASK}[{FAILING_ITEM}]") or evidence_result(
        evidence, run_key, FAILING_ITEM, "chunks_committed", 5
    )
    assert retry_result["status"] == "passed"
    assert retry_result["backfill"]["chunks_committed"] == 5
    assert retry_result["backfill"]["chunks_skipped_resume"] == 4
    assert retry_result["backfill"]["campaign_complete"] is True
    report["retry_task_instance"] = retry["task_instances"]
    report["retry_seconds"] = retry["tasks_test_seconds"]

    # 3. Target equals source; parity with an internal run of the same campaign.
    source = e2ekit.fingerprint(e2e_db, "orders_src")
    target = e2ekit.fingerprint(e2e_db, "orders_summary")
    assert target == source, (target, source)
    internal = internal_fingerprint(python, env, generated, e2e_db, tmp_path / "internal-home")
    assert internal == target
    report["rows"] = target[0]
    report["checksum"] = str(target[1])
    report["duplicate_commits"] = sum(
        max(0, sum(1 for _, s, _ in rows if s == "committed") - 1) for rows in after.values()
    )

    # 4. Clearing a committed item and re-running it is a no-op that says so.
    noop = e2ekit.harness(
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
        facts["run_id"],
        "--map-index",
        "3",
    )
    assert noop["returncode"] == 0, noop["output_tail"]
    assert noop["states_before_clear"]["3"] == "success"
    assert noop["states_after_clear"]["3"] in ("None", "none"), noop["states_after_clear"]
    assert noop["states_after_rerun"]["3"] == "success", noop["output_tail"]
    cleared_others = {i: s for i, s in noop["states_after_rerun"].items() if int(i) != 3}
    assert cleared_others == {i: s for i, s in noop["states_before_clear"].items() if int(i) != 3}
    result = noop["xcom"].get(f"{e2ekit.TASK}[3]") or evidence_result(
        evidence, run_key, 3, "chunks_skipped_resume", 10
    )
    assert result["status"] == "passed"
    assert result["backfill"]["chunks_committed"] == 0
    assert result["backfill"]["chunks_skipped_resume"] == 10
    assert result["backfill"]["mapping"]["item_status"] == "chunks_skipped_resume"
    assert e2ekit.transitions(e2e_db, run_key) == after, "the no-op moved a chunk"
    report["noop_result_backfill"] = result["backfill"]
    report["noop_xcom_persisted"] = f"{e2ekit.TASK}[3]" in noop["xcom"]
    report["noop_rerun_command"] = noop["rerun_command"]

    # 5. `airflow tasks test` on a date with no run: Airflow passes try_number 0 (no try yet).
    fresh = e2ekit.harness(
        python,
        env,
        "taskstest",
        "--home",
        str(home),
        "--dag-id",
        e2ekit.SUMMARY_DAG,
        "--task-id",
        e2ekit.TASK,
        "--run-id",
        "2031-01-01",
        "--map-index",
        "3",
    )
    assert fresh["returncode"] == 0, fresh["output_tail"]
    assert errors.AIRFLOW_CONTEXT_INVALID not in fresh["output_tail"], fresh["output_tail"]
    assert e2ekit.transitions(e2e_db, run_key) == after, "the no-op moved a chunk"
    REPORT[version] = report
    write_report()


def evidence_result(
    evidence: Path, run_key: str, item_index: int, key: str, value: int
) -> dict[str, Any]:
    """The run result of the latest evidence file of an item whose backfill[key] == value (the
    evidence dpone writes beside XCom, for Airflow versions whose `tasks test` keeps no XCom)."""
    candidates = sorted(
        (evidence / run_key).glob(f"item-{item_index:03d}.*.json"), key=os.path.getmtime
    )
    for path in reversed(candidates):
        result: dict[str, Any] = json.loads(path.read_text())["result"]
        if result["backfill"][key] == value:
            return result
    raise AssertionError(f"no evidence of item {item_index} with {key} == {value}: {candidates}")


def write_report() -> None:
    target = os.environ.get("DPONE_E2E_REPORT")
    if target:
        Path(target).write_text(
            json.dumps({"summary": REPORT, "internal": INTERNAL}, indent=2, default=str) + "\n"
        )
