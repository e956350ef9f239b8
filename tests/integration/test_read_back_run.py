"""`dpone run` with the read-back gate against the real Postgres: the run that used to print
``passed`` while the target lost rows (timestamp(6) source, timestamp(0) target, daily chunks)
now fails the chunks whose rows moved, commits nothing of them, and records both checksums of
the chunks it did commit. Both placements: the ledger in the sink's database (one transaction)
and a local-file ledger (the fenced path, committed by the sink).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from dpone import errors
from dpone.cli import main

pytestmark = pytest.mark.postgres

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  events:
    manifest: events.yaml
    airflow: {image: example/dpone:1}
"""

MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: events
    source: {{connection: wh, table: {{schema: {s}, name: src}}}}
    sink:
      connection: wh
      table: {{schema: {s}, name: dst}}
      strategy: {{mode: backfill}}{accept}{read_back}
    backfill:
      chunk: {{column: ts, type: timestamp, start: "2024-01-01T00:00:00Z", end: "2024-01-04T00:00:00Z", unit: day}}
      inner_mode: {mode}
      lease_seconds: 30
    state: {state}
"""


@pytest.fixture
def project(
    tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, object]]:
    schema = "g_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.src (id int PRIMARY KEY, ts timestamp(6) NOT NULL)")
        conn.execute(f"CREATE TABLE {schema}.dst (id int PRIMARY KEY, ts timestamp(0) NOT NULL)")
        conn.execute(
            f"INSERT INTO {schema}.src VALUES (1, '2024-01-01 10:00'), "
            "(2, '2024-01-01 23:59:59.7'), (3, '2024-01-02 23:59:59.9'), "
            "(4, '2024-01-02 05:00'), (5, '2024-01-03 01:00')"
        )
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    monkeypatch.delenv("DPONE_AIRFLOW_MAPPING_ITEM", raising=False)
    monkeypatch.delenv("DPONE_AIRFLOW_RUN_IDENTITY", raising=False)
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    monkeypatch.setenv("DPONE_EVIDENCE_DIR", str(tmp_path / "evidence"))

    def write(
        read_back: str | None, ledger: str, accept: bool = True, mode: str = "replace"
    ) -> str:
        state = (
            f"{{backend: audit_schema, connection: wh, schema: {schema}_audit}}"
            if ledger == "audit_schema"
            else f"{{backend: local_file, path: {tmp_path / 'ledger.json'}}}"
        )
        line = f"\n      read_back: {read_back}" if read_back else ""
        (tmp_path / "workloads.yaml").write_text(CATALOG)
        (tmp_path / "events.yaml").write_text(
            MANIFEST.format(
                s=schema,
                mode=mode,
                read_back=line,
                state=state,
                # the type preflight refuses timestamp(6) -> timestamp(0) unless accepted
                accept="\n      accept_narrowing: [ts]" if accept else "",
            )
        )
        return str(tmp_path / "workloads.yaml")

    yield {"schema": schema, "write": write, "dsn": pg_dsn, "tmp": tmp_path}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def _run(catalog: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    code = main(["run", "--catalog", catalog, "--workload", "events", "--process", "events"])
    captured = capsys.readouterr()
    result = json.loads((Path(catalog).parent / "xcom.json").read_text())
    return code, result, captured.out + captured.err


def _target_ids(dsn: str, schema: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [int(r[0]) for r in conn.execute(f"SELECT id FROM {schema}.dst ORDER BY id")]


def _evidence(tmp: Path) -> dict:  # type: ignore[type-arg]
    found = sorted((tmp / "evidence").rglob("*.json"))
    docs = [json.loads(p.read_text()) for p in found]
    return next(d for d in docs if d.get("schema") == "dpone.backfill-evidence.v1")


@pytest.mark.parametrize("ledger", ["audit_schema", "local_file"])
def test_the_rounding_run_fails_instead_of_passing(
    project: dict[str, object], capsys: pytest.CaptureFixture[str], ledger: str
) -> None:
    write = project["write"]
    assert callable(write)
    code, result, out = _run(write(None, ledger), capsys)
    assert code == 1, "a chunk failed after rows moved: not 3, which says nothing moved"
    assert result["status"] != "passed"
    assert " passed " not in out and "failed — 1 committed" in out
    evidence = _evidence(Path(str(project["tmp"])))
    by_index = {c["index"]: c for c in evidence["chunks"]}
    # days 1 and 2 each had a row rounded into the next day: both fail, nothing of them is kept
    assert by_index[1]["status"] == by_index[2]["status"] == "failed"
    assert by_index[1]["error_code"] == by_index[2]["error_code"] == errors.READ_BACK_MISMATCH
    assert by_index[3]["status"] == "committed"
    assert by_index[3]["source_checksum"] == by_index[3]["checksum"]
    assert _target_ids(str(project["dsn"]), str(project["schema"])) == [5]
    assert errors.READ_BACK_MISMATCH in json.dumps(result)


@pytest.mark.parametrize("ledger", ["audit_schema", "local_file"])
def test_an_append_whose_rows_the_target_moves_into_another_chunk_fails(
    project: dict[str, object], capsys: pytest.CaptureFixture[str], ledger: str
) -> None:
    """An append reads back the rows it added in the chunk's range: a row the target rounded
    into the next day is missing there, as with replace, though every added row is found."""
    write = project["write"]
    assert callable(write)
    code, result, out = _run(write(None, ledger, mode="append"), capsys)
    assert code == 1 and result["status"] != "passed"
    assert "failed — 1 committed" in out
    evidence = _evidence(Path(str(project["tmp"])))
    by_index = {c["index"]: c for c in evidence["chunks"]}
    assert by_index[1]["error_code"] == by_index[2]["error_code"] == errors.READ_BACK_MISMATCH
    assert by_index[3]["status"] == "committed"
    assert _target_ids(str(project["dsn"]), str(project["schema"])) == [5]


def test_the_narrowing_is_refused_before_any_chunk_unless_accepted(
    project: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    write = project["write"]
    assert callable(write)
    code, result, out = _run(write(None, "local_file", accept=False), capsys)
    assert code != 0 and result["status"] != "passed"
    assert errors.PREFLIGHT_FAILED in out
    assert _target_ids(str(project["dsn"]), str(project["schema"])) == []


@pytest.mark.parametrize("ledger", ["audit_schema", "local_file"])
def test_read_back_off_is_the_old_silent_loss(
    project: dict[str, object], capsys: pytest.CaptureFixture[str], ledger: str
) -> None:
    """What the gate prevents, shown with it off: the run passes with rows lost."""
    write = project["write"]
    assert callable(write)
    code, result, _ = _run(write("off", ledger), capsys)
    assert code == 0 and result["status"] == "passed"
    # row 2 became 2024-01-02 00:00:00 and chunk 2's replace deleted it; row 3 likewise in chunk 3
    assert _target_ids(str(project["dsn"]), str(project["schema"])) == [1, 4, 5]
    evidence = _evidence(Path(str(project["tmp"])))
    assert all("source_checksum" not in c for c in evidence["chunks"])


def test_read_back_count_fails_the_lost_rows_too(
    project: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    write = project["write"]
    assert callable(write)
    code, result, _ = _run(write("count", "audit_schema"), capsys)
    assert code != 0 and result["status"] != "passed"
    assert _target_ids(str(project["dsn"]), str(project["schema"])) == [5]
