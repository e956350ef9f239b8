"""`dpone run` end to end inside one interpreter against the real Postgres: mapped items, resume,
verification before I/O, exactly-once with the ledger in the sink's database, internal workers.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dpone.authoring.schema import load_schema, validate
from dpone.cli import main
from dpone.packing.pack import load_and_compile
from dpone.packing.verify import expected_identity

pytestmark = pytest.mark.postgres

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
    airflow:
      image: example/dpone:1
      mapping: {mode: summary, max_items: 6, max_active: 3, pool: dpone_test}
"""

MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {{connection: wh, table: {{schema: {s}, name: raw_orders}}}}
    sink:
      connection: wh
      table: {{schema: {s}, name: orders}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2023-01-01, end: 2023-01-31}}
      inner_mode: {inner}
      lease_seconds: 30
    state:
      backend: audit_schema
      connection: {ledger}
      schema: {s}_audit
      require_distributed_lock: true
"""


@pytest.fixture
def project(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, object]]:
    schema = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.raw_orders (order_id bigint PRIMARY KEY, order_date date NOT NULL,"
            f" amount integer NOT NULL)"
        )
        conn.execute(
            f"CREATE TABLE {schema}.orders (order_id bigint PRIMARY KEY, order_date date NOT NULL,"
            f" amount integer NOT NULL CHECK (amount >= 0))"
        )
        conn.execute(f"CREATE INDEX ON {schema}.orders (order_date)")
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2023-01-01' + (g % 30), g % 1000 "
            f"FROM generate_series(1, 3000) g"
        )
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    monkeypatch.setenv("DPONE_CONN_LEDGER", pg_dsn)
    monkeypatch.delenv("DPONE_AIRFLOW_MAPPING_ITEM", raising=False)
    monkeypatch.delenv("DPONE_AIRFLOW_RUN_IDENTITY", raising=False)
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    monkeypatch.setenv("DPONE_EVIDENCE_DIR", str(tmp_path / "evidence"))

    def write(inner: str = "replace", ledger: str = "wh") -> str:
        (tmp_path / "workloads.yaml").write_text(CATALOG)
        (tmp_path / "orders.yaml").write_text(MANIFEST.format(s=schema, inner=inner, ledger=ledger))
        return str(tmp_path / "workloads.yaml")

    yield {"schema": schema, "write": write, "dsn": pg_dsn, "tmp": tmp_path}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def _plan(catalog: str):  # type: ignore[no-untyped-def]
    _, packs, problems = load_and_compile(catalog)
    assert not problems
    return packs[0], packs[0].processes[0]


def _run_item(catalog: str, plan, index: int, monkeypatch: pytest.MonkeyPatch, capsys) -> tuple[int, dict, str]:  # type: ignore[no-untyped-def]
    pack, _ = _plan(catalog)
    monkeypatch.setenv(
        "DPONE_AIRFLOW_MAPPING_ITEM",
        plan.mapping_plan.item_env_value(plan.mapping_plan.items[index]),
    )
    monkeypatch.setenv("DPONE_AIRFLOW_RUN_IDENTITY", expected_identity(pack, plan.name).env_value())
    code = main(["run", "--catalog", catalog, "--workload", "orders", "--process", "orders"])
    err = capsys.readouterr().err
    result = json.loads(Path(str(Path(catalog).parent / "xcom.json")).read_text())
    return code, result, err


def _table_digest(dsn: str, table: str) -> tuple[int, str]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            f"SELECT count(*), md5(string_agg(t::text, ',' ORDER BY order_id)) FROM {table} t"
        ).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def _attempts(dsn: str, schema: str) -> dict[int, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f"SELECT chunk_index, count(DISTINCT attempt) FROM {schema}_audit.chunk_transition "
            f"WHERE state = 'running' GROUP BY chunk_index"
        ).fetchall()
    return {int(i): int(n) for i, n in rows}


def test_every_item_commits_once_and_target_equals_source(project, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    catalog = project["write"]()
    _, plan = _plan(catalog)
    assert plan.mapping_plan.items_total == 6
    verification = project["tmp"] / "evidence" / plan.run_key / "verification.json"
    for index in range(6):
        code, result, _ = _run_item(catalog, plan, index, monkeypatch, capsys)
        assert code == 0, result
        assert validate(result, load_schema("run-result.v1.schema.json")) == []
        assert result["backfill"]["mapping"]["item_status"] == "success"
        assert result["backfill"]["mapping"]["item_index"] == index
        assert "chunks" not in result["backfill"]
        if index < 5:  # chunks of later items are pending: not complete, nothing exported
            assert result["backfill"]["campaign_complete"] is False
            assert not verification.exists()
    s = project["schema"]
    assert _table_digest(project["dsn"], f"{s}.orders") == _table_digest(
        project["dsn"], f"{s}.raw_orders"
    )
    assert set(_attempts(project["dsn"], s).values()) == {1}
    assert result["backfill"]["campaign_complete"] is True
    doc = json.loads(verification.read_text())
    assert validate(doc, load_schema("backfill-verification.v1.schema.json")) == []
    assert doc["rows_total"] == 3000 and doc["chunks_total"] == 30
    # a cleared item re-run loads only its chunks' records, yet says the campaign is complete
    # and writes the verification from every chunk's record, as the last mover did
    verification.unlink()
    code, result, _ = _run_item(catalog, plan, 2, monkeypatch, capsys)
    assert code == 0 and result["backfill"]["mapping"]["item_status"] == "chunks_skipped_resume"
    assert result["backfill"]["campaign_complete"] is True
    assert json.loads(verification.read_text()) == doc


def test_a_committed_item_reruns_as_a_no_op_without_touching_the_source(project, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    catalog = project["write"]()
    _, plan = _plan(catalog)
    assert _run_item(catalog, plan, 2, monkeypatch, capsys)[0] == 0
    with psycopg.connect(project["dsn"], autocommit=True) as conn:
        conn.execute(f"DROP TABLE {project['schema']}.raw_orders")  # any source read would now fail
    code, result, _ = _run_item(catalog, plan, 2, monkeypatch, capsys)
    assert code == 0
    assert result["backfill"]["mapping"]["item_status"] == "chunks_skipped_resume"
    assert result["backfill"]["chunks_skipped_resume"] == plan.mapping_plan.items[2].chunks_count


def test_a_failed_item_is_retried_without_moving_committed_chunks(project, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    catalog = project["write"]()
    _, plan = _plan(catalog)
    s, dsn = project["schema"], project["dsn"]
    item = plan.mapping_plan.items[3]
    bad_day = plan.chunks[item.first_chunk_index].start  # the item's second chunk
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {s}.raw_orders SET amount = -1 WHERE order_id = (SELECT min(order_id) FROM {s}.raw_orders WHERE order_date = %s)",
            (bad_day,),
        )
    code, result, err = _run_item(catalog, plan, 3, monkeypatch, capsys)
    assert code == 1
    assert result["status"] == "failed" and result["error"]["code"] == "DPONE_SINK_FAILED"
    # a row the sink refuses is refused again by a new attempt: the DAG fails without retries
    assert result["error"]["retryable"] is False
    assert result["backfill"]["chunks_committed"] == 1  # the first chunk, before the bad one
    last = json.loads(err.strip().splitlines()[-1])
    assert last["schema"] == "dpone.error.v1" and last["code"] == "DPONE_SINK_FAILED"
    assert "Failing row" not in last["message"] and ", -1" not in last["message"]  # no row values
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"UPDATE {s}.raw_orders SET amount = 1 WHERE amount = -1")
    code, result, _ = _run_item(catalog, plan, 3, monkeypatch, capsys)
    assert code == 0
    assert result["backfill"]["chunks_skipped_resume"] == 1
    attempts = _attempts(dsn, s)
    assert attempts[item.first_chunk_index] == 1  # committed chunk never moved again
    assert attempts[item.first_chunk_index + 1] == 2  # the failed chunk, retried once


def test_a_pod_runs_its_workload_while_another_workloads_manifest_is_broken_or_missing(project, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    catalog = project["write"]()
    pack, plan = _plan(catalog)  # the plan and identity the generated DAG carries
    folder = Path(catalog).parent
    (folder / "workloads.yaml").write_text(
        CATALOG + "  broken:\n    manifest: broken.yaml\n  gone:\n    manifest: gone.yaml\n"
    )
    (folder / "broken.yaml").write_text("schema: [oops\n")
    _, _, problems = load_and_compile(catalog)  # check and generate --check still refuse
    assert sorted(p.code for p in problems) == ["DPONE_FILE_NOT_FOUND", "DPONE_YAML_INVALID"]
    monkeypatch.setenv(
        "DPONE_AIRFLOW_MAPPING_ITEM", plan.mapping_plan.item_env_value(plan.mapping_plan.items[0])
    )
    monkeypatch.setenv("DPONE_AIRFLOW_RUN_IDENTITY", expected_identity(pack, plan.name).env_value())
    code = main(["run", "--catalog", catalog, "--workload", "orders", "--process", "orders"])
    result = json.loads((folder / "xcom.json").read_text())
    assert code == 0, result
    assert result["pack_fingerprint"] == pack.fingerprint  # the pod's plan is the generated one
    monkeypatch.delenv("DPONE_AIRFLOW_MAPPING_ITEM")
    monkeypatch.delenv("DPONE_AIRFLOW_RUN_IDENTITY")
    assert main(["run", "--catalog", catalog, "--workload", "orders"]) == 0  # internal run
    s = project["schema"]
    assert _table_digest(project["dsn"], f"{s}.orders") == _table_digest(
        project["dsn"], f"{s}.raw_orders"
    )


def test_plan_mismatch_is_refused_before_any_database_io(project, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    catalog = project["write"]()
    pack, plan = _plan(catalog)
    monkeypatch.setenv("DPONE_CONN_WH", "postgresql://nobody@127.0.0.1:1/none")  # unreachable
    identity = expected_identity(pack, plan.name).env_value()
    monkeypatch.setenv("DPONE_AIRFLOW_RUN_IDENTITY", identity)
    doc = plan.mapping_plan.item_payload(plan.mapping_plan.items[1])
    doc["backfill_plan_hash"] = "sha256:" + "0" * 64
    monkeypatch.setenv("DPONE_AIRFLOW_MAPPING_ITEM", json.dumps(doc))
    code = main(["run", "--catalog", catalog, "--workload", "orders", "--process", "orders"])
    last = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert code == 3
    assert last["code"] == "DPONE_AIRFLOW_MAPPING_PLAN_MISMATCH"  # not DPONE_CONNECTION_FAILED


def test_pack_mismatch_names_both_fingerprints(project, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    catalog = project["write"]()
    pack, _ = _plan(catalog)
    identity = {
        "schema": "dpone.airflow-run-identity.v1",
        "dag_id": "orders",
        "workload": "orders",
        "process": "orders",
        "pack_fingerprint": "sha256:" + "1" * 64,
        "flavour": "kubernetes",
        "image": None,
    }
    monkeypatch.setenv("DPONE_AIRFLOW_RUN_IDENTITY", json.dumps(identity))
    code = main(["run", "--catalog", catalog, "--workload", "orders", "--process", "orders"])
    last = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert code == 3 and last["code"] == "DPONE_PACK_MISMATCH"
    assert pack.fingerprint in last["message"] and "sha256:" + "1" * 64 in last["message"]


def test_internal_run_with_workers_and_a_separate_ledger_database_matches_source(project, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    catalog = project["write"](inner="merge", ledger="ledger")
    text = (
        Path(catalog)
        .with_name("workloads.yaml")
        .read_text()
        .replace(
            "mapping: {mode: summary, max_items: 6, max_active: 3, pool: dpone_test}",
            "mapping: {mode: internal}",
        )
    )
    Path(catalog).write_text(text)
    manifest = Path(catalog).with_name("orders.yaml")
    manifest.write_text(
        manifest.read_text().replace(
            "lease_seconds: 30", "lease_seconds: 30\n      parallel_workers: 4"
        )
    )
    code = main(["run", "--catalog", catalog, "--workload", "orders", "--no-progress"])
    ran = capsys.readouterr()
    assert code == 0, ran.err[-4000:]
    s = project["schema"]
    assert _table_digest(project["dsn"], f"{s}.orders") == _table_digest(
        project["dsn"], f"{s}.raw_orders"
    )
    code = main(
        ["ledger", "status", "--catalog", catalog, "--workload", "orders", "--format", "json"]
    )
    status = json.loads(capsys.readouterr().out)
    assert code == 0 and status["counts"]["committed"] == 30


def test_a_chunk_longer_than_its_lease_keeps_it(project, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The lease is renewed while data moves outside the ledger's transaction: another attempt
    asking after the first expiry finds it busy, and the chunk is moved once."""
    import threading
    import time

    from dpone.ledger.factory import open_store
    from dpone.ledger.port import LeaseStatus

    catalog = project["write"](ledger="ledger")
    s = project["schema"]
    manifest = Path(catalog).with_name("orders.yaml")
    slow = (
        f'query: "SELECT r.order_id, r.order_date, r.amount FROM {s}.raw_orders r '
        f'CROSS JOIN pg_sleep(7)"'
    )
    text = manifest.read_text().replace(f"table: {{schema: {s}, name: raw_orders}}", slow)
    manifest.write_text(text.replace("lease_seconds: 30", "lease_seconds: 5"))
    pack, plan = _plan(catalog)
    item = plan.mapping_plan.items[0]
    monkeypatch.setenv("DPONE_AIRFLOW_MAPPING_ITEM", plan.mapping_plan.item_env_value(item))
    identity = expected_identity(pack, plan.name).env_value()
    monkeypatch.setenv("DPONE_AIRFLOW_RUN_IDENTITY", identity)
    codes: list[int] = []
    runner = threading.Thread(
        target=lambda: codes.append(
            main(["run", "--catalog", catalog, "--workload", "orders", "--process", "orders"])
        )
    )
    runner.start()
    time.sleep(6.5)  # past the first lease's expiry, while the first chunk is still moving
    store = open_store("audit_schema", project["dsn"], f"{s}_audit", None)
    try:
        from dpone.ledger.port import CampaignShape
        from dpone.run.orchestrator import RunContext  # noqa: F401  (import check only)

        shape = CampaignShape(
            plan.run_key, "orders", "orders", plan.backfill_plan_hash, plan.config_hash, plan.chunks
        )
        outcome = store.acquire_lease(shape, plan.chunks[0], "intruder", 5)
    finally:
        store.close()
    assert outcome.status is LeaseStatus.BUSY
    runner.join(timeout=120)
    capsys.readouterr()
    assert codes == [0]
    assert _attempts(project["dsn"], s)[1] == 1  # one attempt, renewed, never taken over


def _fail_second_chunk_of(project, plan, index: int) -> str:  # type: ignore[no-untyped-def]
    """Make the item's second chunk fail on the sink's CHECK; returns the bad day."""
    item = plan.mapping_plan.items[index]
    bad_day = plan.chunks[item.first_chunk_index].start
    with psycopg.connect(project["dsn"], autocommit=True) as conn:
        conn.execute(
            f"UPDATE {project['schema']}.raw_orders SET amount = -7777 WHERE order_id = (SELECT min(order_id) FROM {project['schema']}.raw_orders WHERE order_date = %s)",
            (bad_day,),
        )
    return str(bad_day)


def test_a_mapped_item_logs_one_line_per_chunk_with_rate_and_eta(project, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    catalog = project["write"]()
    _, plan = _plan(catalog)
    item = plan.mapping_plan.items[1]
    code, _, err = _run_item(catalog, plan, 1, monkeypatch, capsys)
    assert code == 0, err
    lines = err.strip().splitlines()
    chunk_lines = [line for line in lines if line.startswith("dpone: orders/orders: chunk ")]
    indexes = range(item.first_chunk_index, item.first_chunk_index + item.chunks_count)
    assert len(chunk_lines) == item.chunks_count
    for n, (line, index) in enumerate(zip(chunk_lines, indexes, strict=True), start=1):
        chunk = plan.chunks[index - 1]
        assert chunk.index == index
        assert f"chunk {index} [{chunk.start}, {chunk.end}) committed, 100 rows, " in line, line
        assert f"| {n}/{item.chunks_count} chunks, {n * 100} rows, " in line, line
        assert " rows/s, " in line and " chunks/s, ETA " in line, line
    assert lines[-1].startswith("dpone: orders/orders: passed — ")  # the summary stays last
    assert chunk_lines[-1].endswith("ETA 0s")


def test_a_failed_chunk_line_names_its_code_but_no_row_value(project, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    catalog = project["write"]()
    _, plan = _plan(catalog)
    _fail_second_chunk_of(project, plan, 2)
    code, _, err = _run_item(catalog, plan, 2, monkeypatch, capsys)
    assert code == 1
    chunk_lines = [
        line for line in err.splitlines() if line.startswith("dpone: orders/orders: chunk ")
    ]
    assert len(chunk_lines) == 2  # the first committed; the second failed; the rest never began
    assert " committed, 100 rows, " in chunk_lines[0]
    assert (
        " failed DPONE_SINK_FAILED, " in chunk_lines[1]
        and " rows" not in chunk_lines[1].split("|")[0]
    )
    assert "-7777" not in err and project["dsn"] not in err


def test_json_log_format_gives_the_same_as_json_lines(project, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    catalog = project["write"]()
    _, plan = _plan(catalog)
    _fail_second_chunk_of(project, plan, 4)
    monkeypatch.setenv("DPONE_LOG_FORMAT", "json")
    code, _, err = _run_item(catalog, plan, 4, monkeypatch, capsys)
    assert code == 1
    records = [json.loads(line) for line in err.strip().splitlines()]  # every line is JSON
    events = [r for r in records if r.get("schema") == "dpone.progress.v1"]
    assert [e["event"] for e in events] == ["start", "chunk", "chunk", "end", "summary"]
    item = plan.mapping_plan.items[4]
    first = plan.chunks[item.first_chunk_index - 1]
    committed, failed = events[1], events[2]
    assert (committed["index"], committed["start"], committed["end"]) == (
        first.index,
        str(first.start),
        str(first.end),
    )
    assert committed["outcome"] == "committed" and committed["rows"] == 100
    assert failed["outcome"] == "failed" and failed["error_code"] == "DPONE_SINK_FAILED"
    assert isinstance(committed["duration_ms"], int) and committed["rows_per_s"] > 0
    assert committed["eta_s"] is not None and committed["chunks_per_s"] > 0
    assert events[-1]["status"] == "failed" and events[-1]["not_started"] == item.chunks_count - 2
    assert records[-1]["schema"] == "dpone.error.v1"  # the error record stays last
    assert "-7777" not in err  # rates and durations are never negative


def test_an_unknown_log_format_is_a_usage_error(project, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    catalog = project["write"]()
    monkeypatch.setenv("DPONE_LOG_FORMAT", "xml")
    code = main(["run", "--catalog", catalog, "--workload", "orders"])
    record = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert code == 2 and record["code"] == "DPONE_USAGE"
    assert "DPONE_LOG_FORMAT" in record["message"]


def test_an_internal_run_off_a_terminal_logs_every_chunk(project, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    catalog = project["write"]()
    Path(catalog).write_text(
        Path(catalog)
        .read_text()
        .replace(
            "mapping: {mode: summary, max_items: 6, max_active: 3, pool: dpone_test}",
            "mapping: {mode: internal}",
        )
    )
    code = main(["run", "--catalog", catalog, "--workload", "orders"])
    err = capsys.readouterr().err
    assert code == 0, err
    chunk_lines = [
        line for line in err.splitlines() if line.startswith("dpone: orders/orders: chunk ")
    ]
    assert sorted(int(line.split(": chunk ")[1].split()[0]) for line in chunk_lines) == list(
        range(1, 31)
    )
    assert all(" committed, 100 rows, " in line for line in chunk_lines)
