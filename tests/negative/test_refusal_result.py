"""A `dpone run` refused before data moves leaves a dpone.run-result.v1 (status failed, the error's
`retryable` from the registry) where its result goes, so the generated operators fail the task
without Airflow retries; a retryable refusal (a busy chunk, a lost connection) stays retryable.

Every case runs the real `dpone` executable as a process, with the env a generated task passes
(DPONE_XCOM_PATH as the subprocess operator sets it; the kubernetes flavour's sidecar file is the
same code path), against a private Postgres database that must stay untouched by the final ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import negkit
import pytest
from dpone import errors
from dpone.authoring.schema import load_schema, validate
from dpone.packing.pack import load_and_compile
from negkit import Project

DPONE = Path(sys.executable).with_name("dpone")

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def neg_database(pg_dsn: str) -> Iterator[str]:
    with negkit.private_database(pg_dsn, prefix="dpone_refusal") as dsn:
        yield dsn


@pytest.fixture
def neg_db(neg_database: str) -> str:
    negkit.seed_source(neg_database)
    return neg_database


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project.create(tmp_path / "project")


def run(argv: list[str], env: dict[str, str], xcom: Path) -> tuple[int, dict[str, Any] | None, str]:
    """The real CLI in its own process: exit code, the result file (None when absent), stderr."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    done = subprocess.run(
        [str(DPONE), *argv],
        env={**clean, **env, "DPONE_XCOM_PATH": str(xcom)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    result = json.loads(xcom.read_text(encoding="utf-8")) if xcom.exists() else None
    return done.returncode, result, done.stderr


def last_error(stderr: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(stderr.strip().splitlines()[-1])
    return record


def assert_final_refusal(
    code: int, result: dict[str, Any] | None, stderr: str, error_code: str
) -> dict[str, Any]:
    """A refusal Airflow must not retry: the result says so, stderr and the exit code agree."""
    assert result is not None, f"no result written:\n{stderr}"
    assert validate(result, load_schema("run-result.v1.schema.json")) == []
    assert result["status"] == "failed"
    assert result["error"]["code"] == error_code
    assert result["error"]["retryable"] is False
    assert last_error(stderr)["code"] == error_code
    assert code in (2, 3)
    counts = {k: v for k, v in result["backfill"].items() if k.startswith(("chunks_", "rows_"))}
    assert set(counts.values()) == {0}
    return result


def assert_untouched(dsn: str) -> None:
    assert not negkit.schema_exists(dsn, "neg_audit"), "the ledger was touched"
    assert negkit.scalar(dsn, "SELECT count(*) FROM neg.dst") == 0, "the sink was touched"


def env_of(project: Project, dsn: str, item: int = 1) -> dict[str, str]:
    identity = project.identity_env()[negkit.ENV_IDENTITY]
    assert identity is not None
    return {
        negkit.ENV_IDENTITY: identity,
        negkit.ENV_ITEM: project.item(item),
        "DPONE_CONN_NEG": negkit.as_url(dsn),
    }


def test_a_tampered_item_leaves_a_final_result(
    project: Project, neg_db: str, tmp_path: Path
) -> None:
    env = env_of(project, neg_db)
    item = json.loads(env[negkit.ENV_ITEM])
    item["last_chunk_index"] += 1  # a range the plan does not have
    env[negkit.ENV_ITEM] = json.dumps(item)
    xcom = tmp_path / "xcom" / "return.json"
    code, result, stderr = run(project.run_argv(), env, xcom)
    assert_final_refusal(code, result, stderr, errors.MAPPING_ITEM_INVALID)
    assert code == 3
    assert_untouched(neg_db)


def test_a_plan_mismatch_leaves_a_final_result(
    project: Project, neg_db: str, tmp_path: Path
) -> None:
    env = env_of(project, neg_db)
    project.process["backfill"]["chunk"]["end"] = "2023-01-14"  # the image's manifest moved on
    project.write()
    code, result, stderr = run(project.run_argv(), env, tmp_path / "return.json")
    assert_final_refusal(code, result, stderr, errors.PACK_MISMATCH)
    assert_untouched(neg_db)


def test_a_plan_mismatch_under_the_same_pack_leaves_a_final_result(
    project: Project, neg_db: str, tmp_path: Path
) -> None:
    env = env_of(project, neg_db)
    item = json.loads(env[negkit.ENV_ITEM])
    item["backfill_plan_hash"] = "sha256:" + "1" * 64
    env[negkit.ENV_ITEM] = json.dumps(item)
    code, result, stderr = run(project.run_argv(), env, tmp_path / "return.json")
    result = assert_final_refusal(code, result, stderr, errors.MAPPING_PLAN_MISMATCH)
    # known before the refusal: the compiled pack, the process and the item's mode
    _, packs, _ = load_and_compile(str(project.catalog_path))
    assert result["pack_fingerprint"] == packs[0].fingerprint
    assert (result["workload"], result["process"], result["mode"]) == ("neg", "copy", "summary")
    assert_untouched(neg_db)


def test_a_malformed_item_leaves_a_final_result_without_a_mode(
    project: Project, neg_db: str, tmp_path: Path
) -> None:
    env = {**env_of(project, neg_db), negkit.ENV_ITEM: "{not json"}
    code, result, stderr = run(project.run_argv(), env, tmp_path / "return.json")
    result = assert_final_refusal(code, result, stderr, errors.MAPPING_ITEM_INVALID)
    assert result["mode"] is None and result["pack_fingerprint"] is None
    assert "{not json" not in json.dumps(result)  # the env value is never echoed
    assert_untouched(neg_db)


def test_a_missing_catalog_leaves_a_final_result(
    project: Project, neg_db: str, tmp_path: Path
) -> None:
    argv = project.run_argv()
    argv[argv.index("--catalog") + 1] = str(tmp_path / "gone" / "workloads.yaml")
    code, result, stderr = run(argv, env_of(project, neg_db), tmp_path / "return.json")
    result = assert_final_refusal(code, result, stderr, errors.FILE_NOT_FOUND)
    assert result["pack_fingerprint"] is None and result["workload"] == "neg"
    assert_untouched(neg_db)


def test_an_unreadable_manifest_leaves_a_final_result(
    project: Project, neg_db: str, tmp_path: Path
) -> None:
    env = env_of(project, neg_db)
    (project.folder / "neg.yaml").write_text("processes: [\n", encoding="utf-8")
    code, result, stderr = run(project.run_argv(), env, tmp_path / "return.json")
    assert_final_refusal(code, result, stderr, errors.YAML_INVALID)
    assert_untouched(neg_db)


def test_a_missing_connection_leaves_a_final_result(
    project: Project, neg_db: str, tmp_path: Path
) -> None:
    env = env_of(project, neg_db)
    del env["DPONE_CONN_NEG"]
    code, result, stderr = run(project.run_argv(), env, tmp_path / "return.json")
    assert_final_refusal(code, result, stderr, errors.CONNECTION_MISSING)
    assert_untouched(neg_db)


def test_a_usage_error_leaves_a_final_result(project: Project, neg_db: str, tmp_path: Path) -> None:
    argv = [*project.run_argv(), "--lock-timeout", "nan"]
    code, result, stderr = run(argv, env_of(project, neg_db), tmp_path / "return.json")
    result = assert_final_refusal(code, result, stderr, errors.USAGE)
    assert code == 2 and "--lock-timeout" in result["error"]["message"]
    assert_untouched(neg_db)


def test_help_writes_no_result(tmp_path: Path) -> None:
    xcom = tmp_path / "return.json"
    code, result, _ = run(["run", "--help"], {}, xcom)
    assert code == 0 and result is None


def test_a_lost_connection_stays_retryable(project: Project, neg_db: str, tmp_path: Path) -> None:
    env = {**env_of(project, neg_db), "DPONE_CONN_NEG": "postgresql://postgres@127.0.0.1:1/x"}
    code, result, stderr = run(project.run_argv(), env, tmp_path / "return.json")
    assert result is not None and code == 4, stderr
    assert result["error"]["code"] == errors.CONNECTION_FAILED
    assert result["error"]["retryable"] is True
    assert validate(result, load_schema("run-result.v1.schema.json")) == []


def test_a_busy_chunk_stays_retryable(project: Project, neg_db: str, tmp_path: Path) -> None:
    from dpone.ledger.factory import open_store
    from dpone.ledger.port import CampaignShape, LeaseStatus

    plan = project.plan()
    assert plan.run_key is not None and plan.backfill_plan_hash is not None
    assert plan.mapping_plan is not None
    shape = CampaignShape(
        run_key=plan.run_key,
        workload="neg",
        process=plan.name,
        plan_hash=plan.backfill_plan_hash,
        config_hash=plan.config_hash,
        chunks=plan.chunks,
    )
    store = open_store("audit_schema", dsn=negkit.as_url(neg_db), schema="neg_audit", path=None)
    try:
        store.initialize(shape, "test-holder", 5.0)
        first = plan.mapping_plan.items[1].first_chunk_index
        held = store.acquire_lease(shape, plan.chunks[first - 1], "test-holder", 600.0)
        assert held.status is LeaseStatus.ACQUIRED
        code, result, stderr = run(project.run_argv(), env_of(project, neg_db), tmp_path / "r.json")
    finally:
        store.close()
    assert result is not None, stderr
    assert result["error"]["code"] == errors.CHUNK_BUSY and result["error"]["retryable"] is True
    assert code == 4 and result["backfill"]["chunks_busy"] == 1


def _context_env(project: Project, item: int) -> str:
    from dpone.task.airflow_context import CONTEXT_SCHEMA

    identity = json.loads(str(project.identity_env()[negkit.ENV_IDENTITY]))
    return json.dumps(
        {
            "schema": CONTEXT_SCHEMA,
            "dag_id": identity["dag_id"],
            "task_id": "run_copy",
            "run_id": "scheduled__2026-01-02T00:00:00+00:00",
            "try_number": 3,
            "map_index": item,
            "logical_date": "2026-01-02T00:00:00+00:00",
            "data_interval_start": None,
            "data_interval_end": None,
        }
    )


@pytest.mark.parametrize(
    "refusal", ["tampered item", "missing connection", "plan mismatch", "bad read-ahead"]
)
def test_a_refusal_records_the_airflow_run_it_failed(
    project: Project, neg_db: str, tmp_path: Path, refusal: str
) -> None:
    """Once DPONE_AIRFLOW_CONTEXT is read (the first thing a run reads), a refusal's result says
    which run, try and map index failed, as a run's own result does; outside Airflow it says so."""
    env = {**env_of(project, neg_db), "DPONE_AIRFLOW_CONTEXT": _context_env(project, 1)}
    code_expected = {
        "tampered item": errors.MAPPING_ITEM_INVALID,
        "missing connection": errors.CONNECTION_MISSING,
        "plan mismatch": errors.PACK_MISMATCH,
        "bad read-ahead": errors.CONFIG_INVALID,
    }[refusal]
    if refusal == "tampered item":
        item = json.loads(env[negkit.ENV_ITEM])
        item["last_chunk_index"] += 1
        env[negkit.ENV_ITEM] = json.dumps(item)
    elif refusal == "missing connection":
        del env["DPONE_CONN_NEG"]
    elif refusal == "plan mismatch":
        project.process["backfill"]["chunk"]["end"] = "2023-01-14"
        project.write()
    else:
        env["DPONE_READ_AHEAD_MB"] = "abc"
    code, result, stderr = run(project.run_argv(), env, tmp_path / "return.json")
    result = assert_final_refusal(code, result, stderr, code_expected)
    assert result["airflow"] == {
        "outside_airflow": False,
        **{k: v for k, v in json.loads(env["DPONE_AIRFLOW_CONTEXT"]).items() if k != "schema"},
    }
    local = {k: v for k, v in env.items() if k not in ("DPONE_AIRFLOW_CONTEXT",)}
    local.pop(negkit.ENV_ITEM)
    local.pop(negkit.ENV_IDENTITY)
    code, result, stderr = run(project.run_argv(), local, tmp_path / "local.json")
    if refusal != "tampered item":  # without an item there is nothing to tamper with
        assert result is not None and result["airflow"] == {"outside_airflow": True}, stderr
