"""Hostile or mistaken inputs to `ledger list` and `verify` are user errors with a clear message,
never DPONE_INTERNAL, and `ledger list` never changes the database it reads. The real `dpone`
executable against the real Postgres."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dpone import errors

DPONE = Path(sys.executable).with_name("dpone")

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg(pg_dsn: str) -> Iterator[dict[str, str]]:
    schema = "ue_" + uuid.uuid4().hex[:10]
    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    url = (
        f"postgresql://{info.get('user', 'postgres')}@{info.get('host', '127.0.0.1')}:"
        f"{info.get('port', '5432')}/{info['dbname']}"
    )
    yield {"dsn": pg_dsn, "url": url, "schema": schema}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def dpone(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DPONE_")}
    done = subprocess.run(
        [str(DPONE), *argv],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout, done.stderr


def last_error(stderr: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(stderr.strip().splitlines()[-1])
    assert record["code"] != errors.INTERNAL, record
    return record


def objects_in(dsn: str, schema: str) -> tuple[int, int, int]:
    """(schemas named so, relations in it, functions in it)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = %(s)s), "
            "(SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            " WHERE n.nspname = %(s)s), "
            "(SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            " WHERE n.nspname = %(s)s)",
            {"s": schema},
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def test_ledger_list_never_creates_anything(pg: dict[str, str]) -> None:
    env = {"DPONE_CONN_WH": pg["url"]}
    schema = pg["schema"]
    code, out, err = dpone("ledger", "list", "--connection", "wh", "--schema", schema, env=env)
    assert code == 0, err
    assert f"0 campaign(s) in ledger wh schema {schema}" in out
    assert objects_in(pg["dsn"], schema) == (0, 0, 0)
    with psycopg.connect(pg["dsn"], autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    code, out, err = dpone(
        "ledger", "list", "--connection", "wh", "--schema", schema, "--format", "json", env=env
    )
    assert code == 0 and json.loads(out)["campaigns"] == [], err
    assert objects_in(pg["dsn"], schema) == (1, 0, 0)


def test_an_empty_schema_option_is_a_usage_error(pg: dict[str, str]) -> None:
    code, _, err = dpone(
        "ledger", "list", "--connection", "wh", "--schema", "", env={"DPONE_CONN_WH": pg["url"]}
    )
    record = last_error(err)
    assert code == 2 and record["code"] == errors.USAGE and "--schema" in record["message"]


@pytest.mark.parametrize(
    "table",
    [
        "CREATE TABLE {s}.schema_version (version text); "
        "INSERT INTO {s}.schema_version VALUES ('2.4.1')",
        "CREATE TABLE {s}.schema_version (id int, name text)",
        "CREATE TABLE {s}.schema_version (version int); INSERT INTO {s}.schema_version VALUES (1)",
    ],
    ids=["text-version", "no-version-column", "integer-without-dpone-tables"],
)
@pytest.mark.parametrize("command", ["list", "run"])
def test_an_unrelated_schema_version_table_is_refused(
    pg: dict[str, str], tmp_path: Path, table: str, command: str
) -> None:
    schema = pg["schema"]
    with psycopg.connect(pg["dsn"], autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        for statement in table.format(s=schema).split("; "):
            conn.execute(statement)
        conn.execute(f"CREATE TABLE {schema}.src (id int PRIMARY KEY, d date NOT NULL)")
        conn.execute(f"CREATE TABLE {schema}.dst (id int PRIMARY KEY, d date NOT NULL)")
    before = objects_in(pg["dsn"], schema)
    env = {"DPONE_CONN_WH": pg["url"]}
    if command == "list":
        argv = ["ledger", "list", "--connection", "wh", "--schema", schema]
    else:
        (tmp_path / "workloads.yaml").write_text(
            "schema: dpone.workload-catalog.v1\nworkloads:\n  w:\n    manifest: w.yaml\n",
            encoding="utf-8",
        )
        (tmp_path / "w.yaml").write_text(
            "schema: dpone.pipeline.v1\nprocesses:\n  - name: p\n"
            f"    source: {{connection: wh, table: {{schema: {schema}, name: src}}}}\n"
            f"    sink: {{connection: wh, table: {{schema: {schema}, name: dst}}, keys: [id], "
            "strategy: {mode: backfill}}\n"
            "    backfill:\n"
            "      chunk: {column: d, type: date, start: 2023-01-01, end: 2023-01-03}\n"
            "      inner_mode: replace\n"
            f"    state: {{backend: audit_schema, connection: wh, schema: {schema}}}\n",
            encoding="utf-8",
        )
        argv = ["run", "--catalog", str(tmp_path / "workloads.yaml"), "--workload", "w"]
    code, _, err = dpone(*argv, env=env)
    record = last_error(err)
    assert record["code"] == errors.LEDGER_UNAVAILABLE and code == 3, err
    assert "schema_version table that is not a dpone audit schema's" in record["message"]
    assert objects_in(pg["dsn"], schema) == before  # nothing created next to it


def test_ledger_list_on_a_folder_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = dpone("ledger", "list", "--path", str(tmp_path))
    record = last_error(err)
    assert code == 2 and record["code"] == errors.USAGE and "is a folder" in record["message"]


@pytest.mark.parametrize(
    "chunks",
    ["9" * 5000, "1-" + "9" * 5000, "9" * 5000 + "-1", "1," + "0" * 4400 + "7"],
    ids=["5000-digits", "range-end", "range-start", "leading-zeros"],
)
def test_verify_with_a_huge_chunk_number_is_a_usage_error(
    pg: dict[str, str], tmp_path: Path, chunks: str
) -> None:
    (tmp_path / "workloads.yaml").write_text(
        "schema: dpone.workload-catalog.v1\nworkloads:\n  w:\n    manifest: w.yaml\n",
        encoding="utf-8",
    )
    (tmp_path / "w.yaml").write_text(
        "schema: dpone.pipeline.v1\nprocesses:\n  - name: p\n"
        "    source: {connection: wh, table: {name: src}}\n"
        "    sink: {connection: wh, table: {name: dst}, keys: [id], strategy: {mode: backfill}}\n"
        "    backfill:\n"
        "      chunk: {column: d, type: date, start: 2023-01-01, end: 2023-01-03}\n"
        "      inner_mode: replace\n"
        "    state: {backend: local_file, path: ledger.json}\n",
        encoding="utf-8",
    )
    code, _, err = dpone(
        "verify",
        "--catalog",
        str(tmp_path / "workloads.yaml"),
        "--workload",
        "w",
        "--chunks",
        chunks,
        env={"DPONE_CONN_WH": pg["url"]},
    )
    record = last_error(err)
    assert (
        code == 2 and record["code"] == errors.USAGE and "outside chunks 1-2" in record["message"]
    )
    assert len(err) < 2000  # the number is not echoed whole
