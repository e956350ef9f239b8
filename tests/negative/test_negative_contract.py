"""The contract's required negative tests, one named function each, through the public surface.

The list (feature design, "Security, privacy and abuse cases"): malformed item JSON, unknown
item fields, oversized env, plan mismatch, task-count overflow, empty pool, max_active overflow,
local/ClickHouse state, parallelism multiplication, duplicate range, range gap, stale owner
completion, corrupt SQL chunk record, one failed map item, attempts to override the
provider-owned env value. Runtime refusals are checked to happen before any I/O: the ledger's
audit schema must not exist afterwards and the sink must be untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import negkit
import psycopg
import pytest
from dpone import errors
from dpone.plan.mapping import MappingItem, MappingPlanError, verify_coverage
from negkit import CliResult, Project, run_cli


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project.create(tmp_path / "project")


@pytest.fixture(scope="module")
def neg_database(pg_dsn: str) -> Iterator[str]:
    with negkit.private_database(pg_dsn) as dsn:
        yield dsn


@pytest.fixture
def neg_db(neg_database: str) -> str:
    """This test process's own database, seeded: neg.src (12 days x 20 rows), empty neg.dst."""
    negkit.seed_source(neg_database)
    return neg_database


def conn_env(dsn: str) -> dict[str, str | None]:
    return {"DPONE_CONN_NEG": negkit.as_url(dsn)}


def assert_refused_before_io(dsn: str) -> None:
    """No ledger was created and no row reached the sink."""
    assert not negkit.schema_exists(dsn, "neg_audit"), "the ledger was touched"
    assert negkit.scalar(dsn, "SELECT count(*) FROM neg.dst") == 0, "the sink was touched"


def codes(records: list[dict[str, object]]) -> set[object]:
    return {r["code"] for r in records}


# --- runtime: the item --------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize(
    "raw",
    [
        "",
        "{",
        "not json",
        '{"schema": "dpone.airflow-mapping-item.v1",}',
        "[]",
        "null",
        '"a string"',
        '{"item_index": NaN}',
        "{'single': 'quotes'}",
        '{"a": 1}{"b": 2}',
        "[" * 5000 + "]" * 5000,
        '{"item_index": ' + "9" * 5000 + "}",
    ],
    ids=lambda raw: repr(raw[:24]),
)
def test_malformed_item_json_is_refused_before_any_io(
    project: Project, neg_db: str, raw: str
) -> None:
    result = run_cli(
        project.run_argv(), {**project.identity_env(), negkit.ENV_ITEM: raw, **conn_env(neg_db)}
    )
    assert result.code == 3
    assert result.error()["code"] == errors.MAPPING_ITEM_INVALID
    assert_refused_before_io(neg_db)


@pytest.mark.postgres
def test_unknown_item_fields_are_refused_and_their_values_never_echoed(
    project: Project, neg_db: str
) -> None:
    doc = json.loads(project.item(1))
    doc["predicate"] = "1=1; DROP TABLE neg.src -- secret-value-7f3a"
    result = run_cli(
        project.run_argv(),
        {**project.identity_env(), negkit.ENV_ITEM: json.dumps(doc), **conn_env(neg_db)},
    )
    record = result.error()
    assert result.code == 3 and record["code"] == errors.MAPPING_ITEM_INVALID
    assert "unknown field" in record["message"]
    assert "secret-value-7f3a" not in result.stderr and "DROP TABLE" not in result.stderr
    assert_refused_before_io(neg_db)


def test_oversized_env_is_refused_at_8_kib_plus_one(project: Project) -> None:
    """JSON whitespace pads a valid item to exactly 8192 bytes (accepted) and 8193 (refused)."""
    item = project.item(0)
    at_limit = item[:-1] + " " * (8192 - len(item.encode())) + "}"
    over = item[:-1] + " " * (8193 - len(item.encode())) + "}"
    assert len(at_limit.encode()) == 8192 and len(over.encode()) == 8193
    accepted = run_cli(
        project.run_argv(),
        {**project.identity_env(), negkit.ENV_ITEM: at_limit, "DPONE_CONN_NEG": None},
    )
    # Past parsing and verification; stops at the ledger's missing DSN (no I/O configured).
    assert accepted.error()["code"] == errors.CONNECTION_MISSING
    refused = run_cli(
        project.run_argv(),
        {**project.identity_env(), negkit.ENV_ITEM: over, "DPONE_CONN_NEG": None},
    )
    record = refused.error()
    assert refused.code == 3 and record["code"] == errors.MAPPING_ITEM_INVALID
    assert "8192 bytes" in record["message"]


# --- runtime: plan verification ------------------------------------------------------------------


@pytest.mark.postgres
def test_plan_mismatch_is_refused_before_any_io(project: Project, neg_db: str) -> None:
    """The DAG (items, run identity) came from one commit, the image's manifest from another."""
    item = project.item(1)
    project.process["backfill"]["chunk"]["end"] = "2023-01-14"  # one more day in the image
    project.write()
    result = run_cli(
        project.run_argv(), {**project.identity_env(), negkit.ENV_ITEM: item, **conn_env(neg_db)}
    )
    record = result.error()
    assert result.code == 3 and record["code"] == errors.MAPPING_PLAN_MISMATCH
    assert "backfill_plan_hash" in record["message"]
    assert_refused_before_io(neg_db)


@pytest.mark.postgres
def test_pack_identity_mismatch_is_refused_before_any_io(project: Project, neg_db: str) -> None:
    plan = project.plan()
    identity = {
        "schema": "dpone.airflow-run-identity.v1",
        "dag_id": "neg",
        "workload": "neg",
        "process": plan.name,
        "pack_fingerprint": "sha256:" + "0" * 64,
        "flavour": "subprocess",
        "image": None,
    }
    env = {
        **project.identity_env(),
        negkit.ENV_ITEM: project.item(0),
        negkit.ENV_IDENTITY: json.dumps(identity),
        **conn_env(neg_db),
    }
    result = run_cli(project.run_argv(), env)
    assert result.code == 3 and result.error()["code"] == errors.PACK_MISMATCH
    assert_refused_before_io(neg_db)


@pytest.mark.postgres
def test_mode_mismatch_internal_image_mapped_item_is_refused(project: Project, neg_db: str) -> None:
    """Rolling the image back to internal while the DAG still maps: no accidental whole run."""
    item = project.item(2)
    project.airflow["mapping"] = {"mode": "internal"}
    project.write()
    result = run_cli(
        project.run_argv(), {**project.identity_env(), negkit.ENV_ITEM: item, **conn_env(neg_db)}
    )
    assert result.code == 3 and result.error()["code"] == errors.MAPPING_PLAN_MISMATCH
    assert_refused_before_io(neg_db)


@pytest.mark.postgres
def test_duplicate_range_is_refused(project: Project, neg_db: str) -> None:
    """Item 2 carrying item 1's range (a duplicate range) is refused by the runtime; a plan whose
    items repeat a range fails the planner's coverage invariant."""
    doc = json.loads(project.item(2))
    twin = json.loads(project.item(1))
    doc["first_chunk_index"], doc["last_chunk_index"] = (
        twin["first_chunk_index"],
        twin["last_chunk_index"],
    )
    doc["chunks_count"] = twin["chunks_count"]
    result = run_cli(
        project.run_argv(),
        {**project.identity_env(), negkit.ENV_ITEM: json.dumps(doc), **conn_env(neg_db)},
    )
    assert result.code == 3 and result.error()["code"] == errors.MAPPING_PLAN_MISMATCH
    assert_refused_before_io(neg_db)
    items = (
        MappingItem(0, 1, 3),
        MappingItem(1, 4, 6),
        MappingItem(2, 4, 6),
        MappingItem(3, 7, 12),
    )
    with pytest.raises(MappingPlanError) as caught:
        verify_coverage(items, 12)
    assert caught.value.code == errors.MAPPING_ITEM_INVALID


@pytest.mark.postgres
def test_range_gap_is_refused(project: Project, neg_db: str) -> None:
    """An item one chunk short of its planned range (a gap) is refused; a plan with a gap fails
    the coverage invariant."""
    doc = json.loads(project.item(1))
    doc["last_chunk_index"] -= 1
    doc["chunks_count"] -= 1
    result = run_cli(
        project.run_argv(),
        {**project.identity_env(), negkit.ENV_ITEM: json.dumps(doc), **conn_env(neg_db)},
    )
    assert result.code == 3 and result.error()["code"] == errors.MAPPING_PLAN_MISMATCH
    assert_refused_before_io(neg_db)
    items = (
        MappingItem(0, 1, 3),
        MappingItem(1, 4, 5),
        MappingItem(2, 7, 9),
        MappingItem(3, 10, 12),
    )
    with pytest.raises(MappingPlanError) as caught:
        verify_coverage(items, 12)
    assert caught.value.code == errors.MAPPING_ITEM_INVALID
    with pytest.raises(MappingPlanError):
        verify_coverage(items[:3], 12)  # chunks 10..12 uncovered


# --- check: policy and process rules -----------------------------------------------------------


def test_task_count_overflow_is_refused(project: Project) -> None:
    """visible over 12 daily chunks with max_items 11; and max_items above the hard 200."""
    project.airflow["mapping"] = {"mode": "visible", "max_items": 11, "max_active": 2, "pool": "p"}
    records = negkit.check_codes(project)
    assert codes(records) == {errors.MAPPING_TASK_LIMIT_EXCEEDED}
    assert records[0]["file"] and records[0]["line"], records
    assert "12 chunks" in str(records[0]["message"])
    project.airflow["mapping"]["max_items"] = 12  # exactly at the limit: accepted
    assert negkit.check_codes(project) == []
    project.airflow["mapping"] = {"mode": "summary", "max_items": 201, "max_active": 2, "pool": "p"}
    assert codes(negkit.check_codes(project)) == {errors.MAPPING_POLICY_INVALID}


@pytest.mark.parametrize("pool", ["", " ", "bad pool", "pool/with/slash", None])
def test_empty_pool_is_refused(project: Project, pool: str | None) -> None:
    project.airflow["mapping"]["pool"] = pool
    records = negkit.check_codes(project)
    assert codes(records) == {errors.MAPPING_POOL_REQUIRED}, records


@pytest.mark.parametrize(
    "max_items,max_active", [(4, 5), (200, 65), (4, 0), (4, -1), (4, "2"), (4, 2.5), (4, True)]
)
def test_max_active_overflow_is_refused(
    project: Project, max_items: int, max_active: object
) -> None:
    project.airflow["mapping"].update(max_items=max_items, max_active=max_active)
    records = negkit.check_codes(project)
    assert codes(records) == {errors.MAPPING_POLICY_INVALID}, records
    assert any("max_active" in str(r["message"]) for r in records)


@pytest.mark.parametrize(
    "state",
    [
        {"backend": "local_file", "path": "ledger.json"},
        {"backend": "audit_schema", "connection": "neg", "require_distributed_lock": False},
    ],
    ids=["local_file", "no_distributed_lock"],
)
def test_local_state_is_refused_for_mapped_modes(
    project: Project, state: dict[str, object]
) -> None:
    project.process["state"] = state
    records = negkit.check_codes(project)
    assert codes(records) == {errors.MAPPING_STATE_UNSUPPORTED}, records
    project.airflow["mapping"] = {"mode": "internal"}  # internal mode may keep these backends
    assert negkit.check_codes(project) == []


@pytest.mark.parametrize("mode", ["summary", "internal"])
def test_clickhouse_state_is_refused_by_check_in_every_mode(project: Project, mode: str) -> None:
    """There is no ClickHouse ledger store: check says so at the field, not the pod at run time."""
    project.process["state"] = {"backend": "clickhouse", "connection": "neg"}
    if mode == "internal":
        project.airflow["mapping"] = {"mode": "internal"}
    records = negkit.check_codes(project)
    assert codes(records) == {errors.MANIFEST_INVALID}, records
    assert "clickhouse is not supported" in str(records[0]["message"])


def test_local_and_clickhouse_stores_lack_the_mapped_capabilities(tmp_path: Path) -> None:
    """The store API agrees with check: local_file is not mapped-ready, clickhouse is refused."""
    from dpone.errors import DponeError
    from dpone.ledger.factory import open_store

    local = open_store("local_file", dsn=None, schema=None, path=str(tmp_path / "l.json"))
    try:
        assert not local.capabilities.mapped_ready
    finally:
        local.close()
    with pytest.raises(DponeError) as caught:
        open_store("clickhouse", dsn="clickhouse://x", schema=None, path=None)
    assert caught.value.code == errors.LEDGER_UNAVAILABLE


@pytest.mark.parametrize("workers", [2, 8])
def test_parallelism_multiplication_is_refused(project: Project, workers: int) -> None:
    project.process["backfill"]["parallel_workers"] = workers
    records = negkit.check_codes(project)
    assert codes(records) == {errors.MAPPING_PARALLELISM_MULTIPLIER}, records
    assert str(workers) in str(records[0]["message"])


@pytest.mark.parametrize(
    "key",
    ["DPONE_AIRFLOW_MAPPING_ITEM", "DPONE_AIRFLOW_RUN_IDENTITY", "DPONE_AIRFLOW_MAPPING_LABEL"],
)
@pytest.mark.parametrize("where", ["workload", "defaults"])
def test_provider_owned_env_value_cannot_be_overridden(
    project: Project, key: str, where: str
) -> None:
    value = '{"schema":"dpone.airflow-mapping-item.v1"}'
    if where == "workload":
        project.airflow["env"] = {key: value, "OTHER": "ok"}
    else:
        project.catalog["defaults"] = {"airflow": {"env": {key: value}}}
    records = negkit.check_codes(project)
    assert codes(records) == {errors.PROVIDER_OWNED_ENV}, records
    assert key in str(records[0]["message"]) and records[0]["line"], records


def test_provider_owned_env_override_is_refused_by_generate(
    project: Project, tmp_path: Path
) -> None:
    """`dpone generate` writes no DAG file for a catalog that tries to set the item env."""
    project.airflow["env"] = {"DPONE_AIRFLOW_MAPPING_ITEM": "{}"}
    project.write()
    out = tmp_path / "dags"
    result = run_cli(["generate", str(project.catalog_path), "--out", str(out)])
    assert result.code != 0
    assert errors.PROVIDER_OWNED_ENV in result.stdout + result.stderr
    assert not list(out.glob("*.py")) if out.exists() else True


# --- ledger: owner compare-and-set and corruption --------------------------------------------------


def _store_and_shape(dsn: str, project: Project, schema: str) -> tuple[object, object]:
    from dpone.ledger.factory import open_store
    from dpone.ledger.port import CampaignShape

    plan = project.plan()
    assert plan.run_key is not None and plan.backfill_plan_hash is not None
    shape = CampaignShape(
        run_key=plan.run_key,
        workload="neg",
        process=plan.name,
        plan_hash=plan.backfill_plan_hash,
        config_hash=plan.config_hash,
        chunks=plan.chunks,
    )
    store = open_store("audit_schema", dsn=negkit.as_url(dsn), schema=schema, path=None)
    return store, shape


@pytest.mark.postgres
def test_stale_owner_completion_is_refused(project: Project, neg_db: str) -> None:
    """A's lease expires (database clock), B takes the chunk over; A can neither complete nor
    write in the ledger's transaction; B completes; A stays refused afterwards."""
    from dpone.errors import DponeError
    from dpone.ledger.port import ChunkResult, ChunkState, LeaseStatus

    negkit.reset_schemas(neg_db, "neg_cas")
    store, shape = _store_and_shape(neg_db, project, "neg_cas")
    try:
        store.initialize(shape, "init", 5.0)  # type: ignore[attr-defined]
        chunk = shape.chunks[0]  # type: ignore[attr-defined]
        a = store.acquire_lease(shape, chunk, "owner-a", 1.0)  # type: ignore[attr-defined]
        assert a.status is LeaseStatus.ACQUIRED and a.lease.attempt == 1
        busy = store.acquire_lease(shape, chunk, "owner-b", 1.0)  # type: ignore[attr-defined]
        assert busy.status is LeaseStatus.BUSY
        time.sleep(1.3)
        b = store.acquire_lease(shape, chunk, "owner-b", 30.0)  # type: ignore[attr-defined]
        assert b.status is LeaseStatus.ACQUIRED and b.lease.attempt == 2
        with pytest.raises(DponeError) as stale:
            store.complete(a.lease, chunk, ChunkResult(True, rows=1))  # type: ignore[attr-defined]
        assert stale.value.code == errors.CHUNK_LEASE_LOST
        writes: list[object] = []

        def write(connection: object) -> ChunkResult:
            writes.append(connection)
            return ChunkResult(True, rows=1)

        with pytest.raises(DponeError) as stale_tx:
            store.complete_in_transaction(a.lease, chunk, write)  # type: ignore[attr-defined]
        assert stale_tx.value.code == errors.CHUNK_LEASE_LOST and writes == []
        store.complete(b.lease, chunk, ChunkResult(True, rows=20))  # type: ignore[attr-defined]
        with pytest.raises(DponeError) as late:
            store.complete(a.lease, chunk, ChunkResult(False, error_code="X"))  # type: ignore[attr-defined]
        assert late.value.code == errors.CHUNK_LEASE_LOST
        ledger = store.load(shape.run_key)  # type: ignore[attr-defined]
        record = ledger.records[chunk.index]
        assert record.state is ChunkState.COMMITTED and record.attempt == 2
        assert record.lease_owner in (None, "owner-b") and record.rows == 20
    finally:
        store.close()  # type: ignore[attr-defined]
    with psycopg.connect(neg_db) as conn:
        rows = conn.execute(
            "SELECT state, attempt, lease_owner FROM neg_cas.chunk_transition "
            "WHERE chunk_index = 1 ORDER BY transition"
        ).fetchall()
    assert [r[0] for r in rows] == ["running", "running", "committed"], rows
    assert all(owner != "owner-a" for state, _, owner in rows if state == "committed")


@pytest.mark.postgres
def test_corrupt_sql_chunk_record_is_detected(project: Project, neg_db: str) -> None:
    """A chunk record whose idempotency key no longer matches the campaign: load and `dpone run`
    both stop with DPONE_LEDGER_CORRUPT, and no data moves."""
    from dpone.errors import DponeError

    project.process["state"]["schema"] = "neg_corrupt"
    project.write()
    negkit.reset_schemas(neg_db, "neg_corrupt")
    store, shape = _store_and_shape(neg_db, project, "neg_corrupt")
    try:
        store.initialize(shape, "init", 5.0)  # type: ignore[attr-defined]
        with psycopg.connect(neg_db) as conn:
            conn.execute(
                "INSERT INTO neg_corrupt.chunk_transition (run_key, chunk_index, transition, "
                "state, attempt, idempotency_key, chunk_start, chunk_end) "
                "SELECT run_key, chunk_index, 1, 'committed', 1, 'forged-key', chunk_start, "
                "chunk_end FROM neg_corrupt.campaign_chunk WHERE chunk_index = 5"
            )
        with pytest.raises(DponeError) as caught:
            store.load(shape.run_key)  # type: ignore[attr-defined]
        assert caught.value.code == errors.LEDGER_CORRUPT
        assert "chunk 5" in caught.value.message and "forged-key" in caught.value.message
    finally:
        store.close()  # type: ignore[attr-defined]
    result = run_cli(
        project.run_argv(),
        {**project.identity_env(), negkit.ENV_ITEM: project.item(1), **conn_env(neg_db)},
    )
    assert result.error()["code"] == errors.LEDGER_CORRUPT
    assert result.code == 3
    assert negkit.scalar(neg_db, "SELECT count(*) FROM neg.dst") == 0


# --- one failed map item -------------------------------------------------------------------------


@pytest.mark.postgres
def test_one_failed_map_item_fails_alone(project: Project, neg_db: str, tmp_path: Path) -> None:
    """A row that breaks the sink's CHECK sits in item 1's second chunk: item 1 fails with a
    structured error and stops at that chunk; items 0, 2, 3 commit; a re-run after the repair
    moves only item 1's remaining chunks."""
    with psycopg.connect(neg_db, autocommit=True) as conn:
        conn.execute("UPDATE neg.src SET amount = -1 WHERE id = 95")  # 2023-01-05: chunk 5
    plan = project.plan()
    assert plan.mapping_plan is not None
    ranges = [(i.first_chunk_index, i.last_chunk_index) for i in plan.mapping_plan.items]
    assert ranges == [(1, 3), (4, 6), (7, 9), (10, 12)]
    exits = {}
    for index in range(4):
        xcom = tmp_path / f"xcom-{index}.json"
        env = {
            **project.identity_env(),
            negkit.ENV_ITEM: project.item(index),
            "DPONE_XCOM_PATH": str(xcom),
        }
        result = run_cli(project.run_argv(), {**env, **conn_env(neg_db)})
        exits[index] = result.code
        if index == 1:
            record = result.error()
            assert record["code"] in (errors.SINK_FAILED, errors.CHUNK_FAILED), record
            assert "-1" not in record["message"], "a row value leaked into the error"
    assert exits == {0: 0, 1: 1, 2: 0, 3: 0}
    failed = json.loads((tmp_path / "xcom-1.json").read_text())
    assert failed["status"] == "failed"
    assert failed["backfill"]["mapping"]["item_status"] == "failed"
    assert failed["backfill"]["chunks_committed"] == 1  # chunk 4; 5 failed; 6 not started
    states = dict(
        psycopg.connect(neg_db)
        .execute(
            "SELECT DISTINCT ON (chunk_index) chunk_index, state FROM neg_audit.chunk_transition "
            "ORDER BY chunk_index, transition DESC"
        )
        .fetchall()
    )
    assert states == {i: "committed" for i in (1, 2, 3, 4, 7, 8, 9, 10, 11, 12)} | {5: "failed"}
    with psycopg.connect(neg_db, autocommit=True) as conn:
        conn.execute("UPDATE neg.src SET amount = 95 WHERE id = 95")
    retry = run_cli(
        project.run_argv(),
        {
            **project.identity_env(),
            negkit.ENV_ITEM: project.item(1),
            "DPONE_XCOM_PATH": str(tmp_path / "retry.json"),
            **conn_env(neg_db),
        },
    )
    assert retry.code == 0, retry.stderr
    doc = json.loads((tmp_path / "retry.json").read_text())["backfill"]
    assert (doc["chunks_committed"], doc["chunks_skipped_resume"]) == (2, 1)
    assert doc["campaign_complete"] is True
    committed_twice = negkit.scalar(
        neg_db,
        "SELECT count(*) FROM (SELECT chunk_index FROM neg_audit.chunk_transition "
        "WHERE state = 'committed' GROUP BY chunk_index HAVING count(*) > 1) AS t",
    )
    assert committed_twice == 0
    assert negkit.scalar(neg_db, "SELECT count(*) FROM neg.dst") == 240


@pytest.mark.postgres
def test_a_mapped_item_without_its_run_identity_is_refused_before_any_io(
    project: Project, neg_db: str
) -> None:
    result = run_cli(project.run_argv(), {negkit.ENV_ITEM: project.item(1), **conn_env(neg_db)})
    record = result.error()
    assert result.code == 3 and record["code"] == errors.RUN_IDENTITY_INVALID
    assert "missing" in record["message"]
    assert_refused_before_io(neg_db)


@pytest.mark.postgres
@pytest.mark.parametrize(("field", "value"), [("dag_id", "another_dag"), ("flavour", "kubernetes")])
def test_a_run_identity_of_another_dag_or_flavour_is_refused_before_any_io(
    project: Project, neg_db: str, field: str, value: str
) -> None:
    identity = json.loads(str(project.identity_env()[negkit.ENV_IDENTITY]))
    identity[field] = value
    env = {negkit.ENV_IDENTITY: json.dumps(identity), negkit.ENV_ITEM: project.item(1)}
    result = run_cli(project.run_argv(), {**env, **conn_env(neg_db)})
    record = result.error()
    assert result.code == 3 and record["code"] == errors.MAPPING_PLAN_MISMATCH
    assert value in record["message"]
    assert_refused_before_io(neg_db)


@pytest.mark.postgres
def test_an_unwritable_result_destination_is_refused_before_any_io(
    project: Project, neg_db: str, tmp_path: Path
) -> None:
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("x")
    env = {**project.identity_env(), negkit.ENV_ITEM: project.item(1), **conn_env(neg_db)}
    result = run_cli(project.run_argv(), {**env, "DPONE_XCOM_PATH": str(blocked / "xcom.json")})
    record = result.error()
    assert result.code == 3 and record["code"] == errors.OUTPUT_UNWRITABLE
    assert_refused_before_io(neg_db)


@pytest.mark.postgres
@pytest.mark.parametrize("variable", ["DPONE_XCOM_PATH", "DPONE_EVIDENCE_DIR"])
def test_an_output_path_of_the_wrong_kind_is_refused_before_any_io(
    project: Project, neg_db: str, tmp_path: Path, variable: str
) -> None:
    """A folder as the result file, or a file as the evidence folder, would only fail after
    every chunk committed."""
    if variable == "DPONE_XCOM_PATH":
        wrong = tmp_path / "xcom-folder"
        wrong.mkdir()
    else:
        wrong = tmp_path / "evidence-file"
        wrong.write_text("x")
    env = {**project.identity_env(), negkit.ENV_ITEM: project.item(1), **conn_env(neg_db)}
    result = run_cli(project.run_argv(), {**env, variable: str(wrong)})
    record = result.error()
    assert result.code == 3 and record["code"] == errors.OUTPUT_UNWRITABLE
    assert variable in record["message"]
    assert_refused_before_io(neg_db)


@pytest.mark.postgres
@pytest.mark.parametrize("into", ["a missing folder", "/proc"])
def test_a_result_link_into_an_unusable_folder_is_refused_before_any_io(
    project: Project, neg_db: str, tmp_path: Path, into: str
) -> None:
    """A symbolic link is written through: its own folder being writable proves nothing."""
    link = tmp_path / "xcom.json"
    if into == "/proc":
        link.symlink_to("/proc/dpone-result.json")
    else:
        link.symlink_to(tmp_path / "gone" / "xcom.json")
    env = {**project.identity_env(), negkit.ENV_ITEM: project.item(1), **conn_env(neg_db)}
    result = run_cli(project.run_argv(), {**env, "DPONE_XCOM_PATH": str(link)})
    record = result.error()
    assert result.code == 3 and record["code"] == errors.OUTPUT_UNWRITABLE, result.stderr
    assert "DPONE_XCOM_PATH" in record["message"]
    assert link.is_symlink() and not (tmp_path / "gone").exists()
    assert_refused_before_io(neg_db)


#: mount a 64 KiB tmpfs on the folder "$0" in a private mount namespace (a user namespace too,
#: so no root is needed where unprivileged ones are allowed), fill it, then run "$@" there
FULL_TMPFS = (
    'mount -t tmpfs -o size=64k tmpfs "$0" || exit 97; '
    'dd if=/dev/zero of="$0/filler" bs=4k 2>/dev/null; exec "$@"'
)


def run_on_a_full_filesystem(folder: Path, argv: list[str], env: dict[str, str]) -> CliResult:
    """``argv`` in a process that sees ``folder`` as a full tmpfs; skipped where this machine
    cannot mount one in a namespace (no unshare, no user namespaces)."""
    if shutil.which("unshare") is None:
        pytest.skip("a full filesystem needs unshare(1) to mount a tmpfs in a namespace")
    folder.mkdir(parents=True, exist_ok=True)
    ns = ["unshare", "--mount", "--map-root-user", "sh", "-c", FULL_TMPFS, str(folder)]
    probe = subprocess.run([*ns, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user+mount namespace here: {probe.stderr[-200:]}")
    done = subprocess.run(
        [*ns, *argv], env=env, capture_output=True, text=True, check=False, timeout=120
    )
    return CliResult(done.returncode, done.stdout, done.stderr)


@pytest.mark.postgres
@pytest.mark.parametrize("variable", ["DPONE_XCOM_PATH", "DPONE_EVIDENCE_DIR"])
def test_a_full_output_location_is_refused_before_any_io(
    project: Project, neg_db: str, tmp_path: Path, variable: str
) -> None:
    """A full filesystem still lets the check create an empty file: only a written, synced
    probe finds it full before the chunks commit (and their result is lost)."""
    full = tmp_path / "full"
    where = str(full / "xcom.json") if variable == "DPONE_XCOM_PATH" else str(full)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    fixed = {**project.identity_env(), negkit.ENV_ITEM: project.item(1), **conn_env(neg_db)}
    env.update({k: str(v) for k, v in fixed.items() if v is not None})
    env[variable] = where
    dpone = str(Path(sys.executable).with_name("dpone"))
    result = run_on_a_full_filesystem(full, [dpone, *project.run_argv()], env)
    record = result.error()
    assert result.code == 3 and record["code"] == errors.OUTPUT_UNWRITABLE, result.stderr
    assert variable in record["message"] and "nothing was moved" in record["message"]
    assert_refused_before_io(neg_db)
