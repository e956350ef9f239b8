"""A Postgres target whose row-level security applies to the sink's role is refused before any
chunk: its policies could hide rows from a chunk's delete and from the read-back gate, so the
range could hold rows the source does not while the run said passed. Checked with plain SQL as
the superuser; a role that owns the table (row security not forced) runs."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from dpone.cli import main

pytestmark = pytest.mark.postgres

CATALOG = "schema: dpone.workload-catalog.v1\nworkloads:\n  moves:\n    manifest: moves.yaml\n"
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: moves
    source: {{connection: src, table: {{schema: {schema}, name: src}}}}
    sink:
      connection: dst
      table: {{schema: {schema}, name: dst}}{keys}
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: d, type: date, start: "2024-01-01", end: "2024-01-06"}}
      inner_mode: {mode}
    state: {{backend: audit_schema, connection: ledger, schema: {schema}_audit}}
"""


@pytest.fixture
def case(pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    tag = uuid.uuid4().hex[:10]
    schema, role = f"rls_{tag}", f"dpone_rls_{tag}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for statement in (
            f"CREATE SCHEMA {schema}",
            f"CREATE ROLE {role} LOGIN",
            f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}",
            f"CREATE TABLE {schema}.src (id int PRIMARY KEY, d date NOT NULL, v text)",
            f"INSERT INTO {schema}.src SELECT g, date '2024-01-01' + g % 5, 'v' || g "
            "FROM generate_series(1, 20) g",
            f"GRANT SELECT ON {schema}.src TO {role}",
            f"CREATE TABLE {schema}.dst (id int, d date NOT NULL, v text, "
            "hidden boolean NOT NULL DEFAULT false)",
            f"INSERT INTO {schema}.dst VALUES (1001, '2024-01-02', 'stale', true)",
            f"ALTER TABLE {schema}.dst ENABLE ROW LEVEL SECURITY",
            f"CREATE POLICY seen ON {schema}.dst FOR SELECT USING (NOT hidden)",
            f"CREATE POLICY gone ON {schema}.dst FOR DELETE USING (NOT hidden)",
            f"CREATE POLICY added ON {schema}.dst FOR INSERT WITH CHECK (true)",
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.dst TO {role}",
        ):
            conn.execute(statement)  # type: ignore[call-overload]
    url = urlsplit(pg_dsn)
    role_dsn = url._replace(netloc=f"{role}@{url.hostname}:{url.port or 5432}").geturl()
    for key in ("DPONE_AIRFLOW_MAPPING_ITEM", "DPONE_AIRFLOW_RUN_IDENTITY", "DPONE_EVIDENCE_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    monkeypatch.setenv("DPONE_CONN_LEDGER", pg_dsn)
    monkeypatch.setenv("DPONE_CONN_DST", role_dsn)
    (tmp_path / "workloads.yaml").write_text(CATALOG)
    yield {"schema": schema, "role": role, "role_dsn": role_dsn, "pg": pg_dsn}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")  # type: ignore[call-overload]
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")  # type: ignore[call-overload]
        conn.execute(f"DROP OWNED BY {role}")  # type: ignore[call-overload]
        conn.execute(f"DROP ROLE {role}")  # type: ignore[call-overload]


def _run(root: Path, case: dict[str, str], mode: str) -> int:
    keys = "\n      keys: [id]" if mode == "merge" else ""
    (root / "moves.yaml").write_text(MANIFEST.format(schema=case["schema"], mode=mode, keys=keys))
    return main(["run", "--catalog", str(root / "workloads.yaml"), "--workload", "moves"])


def _rows(case: dict[str, str]) -> list[tuple[object, ...]]:
    with psycopg.connect(case["pg"]) as conn:  # as the superuser: row security does not apply
        return conn.execute(  # type: ignore[call-overload]
            f"SELECT id, d, v FROM {case['schema']}.dst ORDER BY id"
        ).fetchall()


@pytest.mark.parametrize("same_dsn", [True, False], ids=["insert-select", "copy"])
@pytest.mark.parametrize("mode", ["replace", "merge", "append"])
def test_row_security_on_the_target_refuses_the_run_before_any_chunk(
    case: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    same_dsn: bool,
    mode: str,
) -> None:
    monkeypatch.setenv("DPONE_CONN_SRC", case["role_dsn"] if same_dsn else case["pg"])
    before = _rows(case)
    assert _run(tmp_path, case, mode) == 3
    err = capsys.readouterr().err
    assert "DPONE_PREFLIGHT_FAILED" in err and "row-level security" in err, err
    result = json.loads((tmp_path / "xcom.json").read_text())
    assert result["status"] == "failed" and result["backfill"]["chunks_committed"] == 0
    assert result["error"]["code"] == "DPONE_PREFLIGHT_FAILED"
    assert _rows(case) == before  # the hidden row and nothing else, untouched


def test_a_role_that_owns_the_table_is_not_subject_to_its_row_security(
    case: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(case["pg"], autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {case['schema']}.dst OWNER TO {case['role']}")  # type: ignore[call-overload]
        conn.execute(f"DELETE FROM {case['schema']}.dst")  # type: ignore[call-overload]
    monkeypatch.setenv("DPONE_CONN_SRC", case["role_dsn"])
    assert _run(tmp_path, case, "replace") == 0
    with psycopg.connect(case["pg"]) as conn:
        source = conn.execute(  # type: ignore[call-overload]
            f"SELECT id, d, v FROM {case['schema']}.src ORDER BY id"
        ).fetchall()
    assert _rows(case) == source
