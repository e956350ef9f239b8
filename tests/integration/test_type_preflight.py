"""`dpone run` refuses a target column that can change the values it receives (numeric precision
or scale, character length, fixed-width padding, fractional seconds, integer width, time zone,
character set, another kind of value) before any chunk is leased, in every direction between the
real Postgres, the real MariaDB and SQLite: DPONE_PREFLIGHT_FAILED (exit 3) at the sink's table in
the manifest, the ledger without a single transition, the target untouched. Equal and wider types
run; ``sink.accept_narrowing`` lets a named column through."""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest
from dpone.cli import main
from dpone.connectors.mysql import parse_dsn

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  moves:
    manifest: moves.yaml
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: moves
    source: {{connection: src, table: {source}}}
    sink:
      connection: dst
      table: {target}
      strategy: {{mode: backfill}}{accept}
    backfill:
      chunk: {{column: id, type: integer, start: 1, end: 4}}
      inner_mode: replace
    state: {{backend: audit_schema, connection: ledger, schema: {audit}}}
"""
TABLE_LINE = 7  # the sink's `table:` line above, where a type refusal points


@dataclass
class Side:
    """One database of a test: its DSN, how the manifest names a table there, and SQL access."""

    kind: str
    dsn: str
    namespace: str | None

    def table(self, name: str) -> str:
        if self.namespace is None:
            return f"{{name: {name}}}"
        return f"{{schema: {self.namespace}, name: {name}}}"

    def qualified(self, name: str) -> str:
        if self.kind == "mysql":
            return f"`{self.namespace}`.`{name}`"
        return name if self.namespace is None else f"{self.namespace}.{name}"

    def run(self, *statements: str) -> list[Any]:
        out: list[Any] = []
        if self.kind == "postgres":
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                for statement in statements:
                    cur = conn.execute(statement)  # type: ignore[call-overload]
                    out = cur.fetchall() if cur.description else out
        elif self.kind == "mysql":
            conn = pymysql.connect(**parse_dsn(self.dsn).connect_args(), autocommit=True)
            try:
                with conn.cursor() as cur:
                    for statement in statements:
                        cur.execute(statement)
                        out = list(cur.fetchall()) if cur.description else out
            finally:
                conn.close()
        else:
            with sqlite3.connect(self.dsn.removeprefix("sqlite:///")) as conn:
                for statement in statements:
                    cur = conn.execute(statement)
                    out = cur.fetchall() if cur.description else out
        return out


@pytest.fixture
def sides(
    pg_dsn: str, mysql_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Side]]:
    tag = uuid.uuid4().hex[:10]
    schema, database = f"tp_{tag}", f"dpone_tp_{tag}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    server = pymysql.connect(**parse_dsn(mysql_dsn).connect_args(), autocommit=True)
    with server.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
    my_dsn = mysql_dsn.split("?", 1)[0].rstrip("/") + "/" + database
    for key in ("DPONE_AIRFLOW_MAPPING_ITEM", "DPONE_AIRFLOW_RUN_IDENTITY", "DPONE_EVIDENCE_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    monkeypatch.setenv("DPONE_CONN_LEDGER", pg_dsn)
    (tmp_path / "workloads.yaml").write_text(CATALOG)
    yield {
        "postgres": Side("postgres", pg_dsn, schema),
        "mysql": Side("mysql", my_dsn, database),
        "sqlite": Side("sqlite", f"sqlite:///{tmp_path / 'data.db'}", None),
        "audit": Side("postgres", pg_dsn, f"{schema}_audit"),
    }
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")
    with server.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
    server.close()


def _prepare(
    sides: dict[str, Side],
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    direction: str,
    types: tuple[str, str],
    value: str,
    accept: str = "",
    ids: tuple[str, str] = ("integer", "integer"),
) -> tuple[Side, Side]:
    source, target = (sides[k] for k in direction.split("->"))
    monkeypatch.setenv("DPONE_CONN_SRC", source.dsn)
    monkeypatch.setenv("DPONE_CONN_DST", target.dsn)
    source.run(
        f"CREATE TABLE {source.qualified('src')} (id {ids[0]} PRIMARY KEY, v {types[0]})",
        *(f"INSERT INTO {source.qualified('src')} VALUES ({i}, '{value}')" for i in (1, 2, 3)),
    )
    target.run(
        f"CREATE TABLE {target.qualified('dst')} (id {ids[1]} PRIMARY KEY, v {types[1]})",
        f"INSERT INTO {target.qualified('dst')} (id) VALUES (99)",  # outside every chunk
    )
    (root / "moves.yaml").write_text(
        MANIFEST.format(
            source=source.table("src"),
            target=target.table("dst"),
            accept=f"\n      accept_narrowing: [{accept}]" if accept else "",
            audit=sides["audit"].namespace,
        )
    )
    return source, target


def _run(root: Path) -> int:
    return main(["run", "--catalog", str(root / "workloads.yaml"), "--workload", "moves"])


def _transitions(sides: dict[str, Side]) -> int:
    audit = sides["audit"]
    found = audit.run(
        f"SELECT to_regclass('{audit.namespace}.chunk_transition') IS NOT NULL AS present"
    )
    if not found[0][0]:
        return 0
    return int(audit.run(f"SELECT count(*) FROM {audit.namespace}.chunk_transition")[0][0])


def _target_ids(target: Side) -> list[int]:
    return sorted(int(row[0]) for row in target.run(f"SELECT id FROM {target.qualified('dst')}"))


# (direction, source type, target type, a source value, what the refusal says)
NARROWINGS = [
    ("postgres->postgres", "numeric(40,12)", "numeric(38,10)", "1.123456789012", "after the point"),
    ("postgres->postgres", "numeric(12,2)", "numeric(10,2)", "1.25", "before the point"),
    ("postgres->postgres", "timestamp(6)", "timestamp(0)", "2024-01-01 23:59:59.7", "fractional"),
    ("postgres->postgres", "text", "varchar(5)", "abcdefgh", "up to 5 characters"),
    ("postgres->postgres", "varchar(5)", "char(5)", "ab", "padding"),
    ("postgres->postgres", "bigint", "integer", "7", "-2147483648..2147483647"),
    ("postgres->postgres", "timestamptz", "timestamp", "2024-01-01 10:00+02", "time zone"),
    ("postgres->postgres", "double precision", "numeric(12,2)", "1.5", "binary float"),
    ("postgres->postgres", "double precision", "integer", "1.5", "whole numbers"),
    ("postgres->mysql", "numeric(40,12)", "DECIMAL(38,10)", "1.123456789012", "after the point"),
    ("postgres->mysql", "timestamp(6)", "DATETIME", "2024-01-01 23:59:59.7", "fractional"),
    ("postgres->mysql", "text", "VARCHAR(5)", "abcdefgh", "up to 5 characters"),
    ("postgres->mysql", "text", "TEXT", "abc", "16383 characters"),
    ("postgres->mysql", "varchar(5)", "CHAR(5)", "ab", "padding"),
    ("postgres->mysql", "bigint", "INT", "7", "-2147483648..2147483647"),
    ("postgres->mysql", "timestamptz", "DATETIME(6)", "2024-01-01 10:00+02", "time zone"),
    ("postgres->mysql", "timestamp(6)", "TIMESTAMP(6) NULL", "2024-01-01", "2038"),
    ("postgres->mysql", "varchar(5)", "VARCHAR(5) CHARACTER SET utf8mb3", "ab", "utf8mb3"),
    ("mysql->postgres", "DECIMAL(40,12)", "numeric(38,10)", "1.123456789012", "after the point"),
    ("mysql->postgres", "DATETIME(6)", "timestamp(0)", "2024-01-01 23:59:59.7", "fractional"),
    ("mysql->postgres", "VARCHAR(50)", "varchar(5)", "abcdefgh", "up to 5 characters"),
    ("mysql->postgres", "BIGINT", "integer", "7", "-2147483648..2147483647"),
    ("mysql->postgres", "INT UNSIGNED", "integer", "7", "0..4294967295"),
    ("mysql->postgres", "TIME", "time", "12:00:00", "beyond one day"),
    ("mysql->postgres", "TINYINT(1)", "boolean", "1", "converted"),
    ("mysql->postgres", "TIMESTAMP(6) NULL", "timestamp(6)", "2024-01-01", "time zone"),
    ("mysql->mysql", "DECIMAL(40,12)", "DECIMAL(38,10)", "1.123456789012", "after the point"),
    ("mysql->mysql", "DATETIME(6)", "DATETIME", "2024-01-01 23:59:59.7", "fractional"),
    ("mysql->mysql", "VARCHAR(50)", "VARCHAR(5)", "abcdefgh", "up to 5 characters"),
    ("mysql->mysql", "INT UNSIGNED", "INT", "7", "0..4294967295"),
    ("mysql->mysql", "VARCHAR(5)", "VARCHAR(5) CHARACTER SET latin1", "ab", "latin1"),
    ("mysql->mysql", "DOUBLE", "DECIMAL(20,2)", "1.5", "binary float"),
    ("mysql->mysql", "DECIMAL(10,2)", "FLOAT(12,2)", "12345678.91", "6 significant digits"),
    ("mysql->mysql", "DECIMAL(18,2)", "DOUBLE(20,2)", "1234567890123456.78", "15 significant"),
    ("postgres->mysql", "numeric(10,2)", "FLOAT(12,2)", "12345678.91", "6 significant digits"),
    ("mysql->mysql", "VARCHAR(5)", "CHAR(5)", "ab", "padding"),
    ("postgres->sqlite", "numeric(20,2)", "DECIMAL(20,2)", "1.25", "15 significant digits"),
    ("postgres->sqlite", "text", "INTEGER", "012", "converted"),
    ("postgres->sqlite", "timestamptz", "TIMESTAMP", "2024-01-01 10:00+02", "time zone"),
    ("sqlite->postgres", "INTEGER", "integer", "7", "-2147483648..2147483647"),
    ("sqlite->postgres", "TEXT", "varchar(5)", "abc", "up to 5 characters"),
    ("sqlite->sqlite", "TEXT", "INTEGER", "012", "converted"),
    ("mysql->sqlite", "DECIMAL(40,12)", "NUMERIC", "1.5", "15 significant digits"),
    # a decimal's text keeps or drops its trailing zeros by the write path
    ("postgres->mysql", "numeric(10,2)", "VARCHAR(12)", "1.50", "trailing"),
    ("postgres->postgres", "numeric(10,2)", "text", "1.50", "trailing"),
    ("postgres->sqlite", "numeric(10,2)", "TEXT", "1.50", "trailing"),
    ("mysql->mysql", "DECIMAL(10,2)", "VARCHAR(12)", "1.50", "trailing"),
    # a MySQL TEXT's value has up to its byte limit in one-byte characters
    ("mysql->postgres", "TINYTEXT", "varchar(100)", "abc", "up to 255 characters"),
    ("mysql->postgres", "TEXT", "varchar(16383)", "abc", "up to 65535 characters"),
    ("mysql->mysql", "TEXT", "TINYTEXT", "abc", "255 bytes of utf8mb4"),
    # pairs Postgres refuses or changes in every chunk
    ("postgres->postgres", "boolean", "integer", "true", "no assignment cast"),
    ("postgres->postgres", "boolean", "numeric(5,0)", "true", "no assignment cast"),
    ("postgres->postgres", "boolean", "double precision", "true", "no assignment cast"),
    ("postgres->postgres", "json", "jsonb", '{"a":1}', "normal form"),
    ("postgres->postgres", "time", "timetz", "10:00", "gains an offset"),
    # a SQLite column without a declared type (or BLOB) stores what it is given
    ("postgres->sqlite", "numeric(10,2)", "", "1.50", "trailing"),
    ("postgres->sqlite", "numeric(10,2)", "BLOB", "1.50", "trailing"),
    ("postgres->sqlite", "timestamptz", "", "2024-01-01 10:00+02", "time zone"),
    ("postgres->sqlite", "char(5)", "", "ab", "padding"),
    ("mysql->sqlite", "DECIMAL(10,2)", "", "1.50", "trailing"),
]


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("direction", "source_type", "target_type", "value", "needle"),
    NARROWINGS,
    ids=[f"{d}:{s}->{t}" for d, s, t, _, _ in NARROWINGS],
)
def test_a_narrowing_is_refused_before_any_lease(
    sides: dict[str, Side],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    direction: str,
    source_type: str,
    target_type: str,
    value: str,
    needle: str,
) -> None:
    _, target = _prepare(sides, tmp_path, monkeypatch, direction, (source_type, target_type), value)
    assert _run(tmp_path) == 3
    err = capsys.readouterr().err
    last = json.loads(err.strip().splitlines()[-1])
    assert last["code"] == "DPONE_PREFLIGHT_FAILED", err
    assert last["file"] == str(tmp_path / "moves.yaml") and last["line"] == TABLE_LINE, last
    message = str(last["message"])
    assert "process 'moves'" in message and "column 'v'" in message, message
    assert needle in message and "sink.accept_narrowing" in message, message
    if len(value) > 3:  # the message names types, never row values
        assert value not in message
    assert _transitions(sides) == 0, "a chunk was leased"
    assert _target_ids(target) == [99], "the target was written"
    if target.kind == "mysql":
        fence = target.run(
            "SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = "
            f"'{target.namespace}' AND TABLE_NAME = 'dpone_chunk_fence'"
        )
        assert fence[0][0] == 0, "the sink was touched"


# (direction, source type, target type, a source value): equal or wider, so the run passes
WIDENINGS = [
    ("postgres->postgres", "numeric(12,2)", "numeric(20,4)", "1.25"),
    ("postgres->postgres", "timestamp(0)", "timestamp(6)", "2024-01-01 23:59:59"),
    ("postgres->postgres", "varchar(5)", "text", "abc"),
    ("postgres->postgres", "integer", "bigint", "7"),
    ("postgres->postgres", "char(5)", "char(5)", "ab"),
    ("postgres->postgres", "timestamptz", "timestamptz", "2024-01-01 10:00+02"),
    ("postgres->mysql", "numeric(38,10)", "DECIMAL(38,10)", "1.5"),
    ("postgres->mysql", "timestamp(6)", "DATETIME(6)", "2024-01-01 23:59:59.7"),
    ("postgres->mysql", "text", "LONGTEXT", "abc"),
    ("postgres->mysql", "boolean", "TINYINT(1)", "true"),
    ("mysql->postgres", "DATETIME", "timestamp(0)", "2024-01-01 23:59:59"),
    ("mysql->postgres", "INT UNSIGNED", "bigint", "7"),
    ("mysql->postgres", "TEXT", "text", "abc"),
    ("mysql->mysql", "DECIMAL(12,2)", "DECIMAL(12,2)", "1.25"),
    ("mysql->mysql", "DATETIME(3)", "DATETIME(6)", "2024-01-01 23:59:59.5"),
    ("postgres->sqlite", "bigint", "BIGINT", "7"),
    ("postgres->sqlite", "varchar(5)", "VARCHAR(5)", "abc"),
    ("sqlite->sqlite", "INTEGER", "INTEGER", "7"),
    ("postgres->mysql", "varchar(5)", "VARCHAR(5) CHARACTER SET utf16", "a\U0001f600"),
    ("mysql->mysql", "VARCHAR(5)", "VARCHAR(5) CHARACTER SET utf32", "a\U0001f600"),
    # a real into a double holds the value its text shows (0.1, not 0.10000000149011612)
    ("postgres->postgres", "real", "double precision", "0.1"),
    ("postgres->mysql", "real", "DOUBLE", "0.1"),
    ("mysql->postgres", "FLOAT", "double precision", "0.1"),
    ("mysql->mysql", "FLOAT", "DOUBLE", "0.1"),
]


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("direction", "source_type", "target_type", "value"),
    WIDENINGS,
    ids=[f"{d}:{s}->{t}" for d, s, t, _ in WIDENINGS],
)
def test_equal_and_wider_types_run(
    sides: dict[str, Side],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    direction: str,
    source_type: str,
    target_type: str,
    value: str,
) -> None:
    source, target = _prepare(
        sides, tmp_path, monkeypatch, direction, (source_type, target_type), value
    )
    assert _run(tmp_path) == 0, capsys.readouterr().err
    assert _target_ids(target) == [1, 2, 3, 99]
    if "real" in source_type or "FLOAT" in source_type:  # as each driver reads them, no dpone
        read = [r[0] for r in source.run(f"SELECT v FROM {source.qualified('src')} ORDER BY id")]
        held = target.run(f"SELECT v FROM {target.qualified('dst')} WHERE id < 99 ORDER BY id")
        assert [float(r[0]) for r in held] == [float(v) for v in read] == [0.1] * 3
    if "CHARACTER SET" in target_type:  # every character kept, as the drivers read them
        held = target.run(f"SELECT v FROM {target.qualified('dst')} WHERE id < 99 ORDER BY id")
        assert [r[0] for r in held] == [value] * 3


# (direction, source type, target type, a value the narrower column keeps)
ACCEPTED = [
    ("postgres->postgres", "text", "varchar(5)", "abc"),
    ("postgres->mysql", "timestamp(6)", "DATETIME", "2024-01-01 12:00:00"),
    ("mysql->postgres", "DECIMAL(40,12)", "numeric(38,10)", "1.5"),
    ("mysql->mysql", "BIGINT", "INT", "7"),
]


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("direction", "source_type", "target_type", "value"),
    ACCEPTED,
    ids=[f"{d}:{s}->{t}" for d, s, t, _ in ACCEPTED],
)
def test_accept_narrowing_lets_the_named_column_through(
    sides: dict[str, Side],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    direction: str,
    source_type: str,
    target_type: str,
    value: str,
) -> None:
    types = (source_type, target_type)
    _, target = _prepare(sides, tmp_path, monkeypatch, direction, types, value, accept="v")
    assert _run(tmp_path) == 0, capsys.readouterr().err
    assert _target_ids(target) == [1, 2, 3, 99]


@pytest.mark.postgres
def test_accept_narrowing_naming_a_column_that_is_not_moved_is_refused_at_its_line(
    sides: dict[str, Side],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    types = ("integer", "integer")
    _prepare(sides, tmp_path, monkeypatch, "postgres->postgres", types, "7", accept="nope")
    assert _run(tmp_path) == 3
    last = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert last["code"] == "DPONE_PREFLIGHT_FAILED"
    assert last["line"] == TABLE_LINE + 2, last  # the accept_narrowing entry
    assert "accept_narrowing names 'nope'" in str(last["message"])
    assert _transitions(sides) == 0


FULL_REFRESH = """\
schema: dpone.pipeline.v1
processes:
  - name: moves
    source: {{connection: src, table: {source}}}
    sink:
      connection: dst
      table: {target}
      strategy: {{mode: full_refresh}}{accept}
"""


@pytest.mark.postgres
@pytest.mark.parametrize("direction", ["postgres->postgres", "postgres->mysql"])
def test_a_full_refresh_is_refused_before_it_deletes_anything(
    sides: dict[str, Side],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    direction: str,
) -> None:
    types = (
        "numeric(40,12)",
        "DECIMAL(38,10)" if direction.endswith("mysql") else "numeric(38,10)",
    )
    source, target = _prepare(sides, tmp_path, monkeypatch, direction, types, "1.5")
    manifest = FULL_REFRESH.format(
        source=source.table("src"), target=target.table("dst"), accept=""
    )
    (tmp_path / "moves.yaml").write_text(manifest)
    assert _run(tmp_path) == 3
    last = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert last["code"] == "DPONE_PREFLIGHT_FAILED" and last["line"] == TABLE_LINE, last
    assert "column 'v'" in str(last["message"])
    assert _target_ids(target) == [99], "the full refresh deleted or wrote rows"
    (tmp_path / "moves.yaml").write_text(
        FULL_REFRESH.format(
            source=source.table("src"),
            target=target.table("dst"),
            accept="\n      accept_narrowing: [v]",
        )
    )
    assert _run(tmp_path) == 0, capsys.readouterr().err
    assert _target_ids(target) == [1, 2, 3]


@pytest.mark.postgres
@pytest.mark.parametrize("blob", [False, True], ids=["load-data", "with-a-blob-column"])
@pytest.mark.parametrize(("value", "passes"), [("1.123456789012", False), ("1.5", True)])
def test_an_accepted_decimal_narrowing_into_mariadb_has_one_outcome_whatever_the_columns(
    sides: dict[str, Side],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    blob: bool,
    value: str,
    passes: bool,
) -> None:
    """The issue's case: numeric(40,12) -> DECIMAL(38,10) accepted; a value the server would
    round fails the run on LOAD DATA and on the batched inserts a BLOB column selects alike."""
    types = ("numeric(40,12)", "DECIMAL(38,10)")
    source, target = _prepare(sides, tmp_path, monkeypatch, "postgres->mysql", types, value, "v")
    if blob:
        source.run(
            f"ALTER TABLE {source.qualified('src')} ADD COLUMN b bytea DEFAULT '\\x00ff'::bytea"
        )
        target.run(f"ALTER TABLE {target.qualified('dst')} ADD COLUMN b LONGBLOB")
    code = _run(tmp_path)
    err = capsys.readouterr().err
    if passes:
        assert code == 0, err
        assert _target_ids(target) == [1, 2, 3, 99]
    else:
        assert code != 0 and "DPONE_SINK_FAILED" in err and "warning(s)" in err, err
        assert value not in err
        assert _target_ids(target) == [99]


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("direction", "types", "query", "refused"),
    [
        ("postgres->postgres", ("numeric(12,2)", "numeric(12,2)"), "v * 2 AS v", True),
        (
            "postgres->postgres",
            ("numeric(12,2)", "numeric(12,2)"),
            "(v * 2)::numeric(12,2) AS v",
            False,
        ),
        ("postgres->postgres", ("timestamp(6)", "timestamp(0)"), "v", True),
        ("mysql->postgres", ("DECIMAL(40,12)", "numeric(38,10)"), "v", True),
        ("mysql->postgres", ("DECIMAL(12,2)", "numeric(12,2)"), "v * 2 AS v", True),
        ("mysql->postgres", ("DECIMAL(12,2)", "numeric(30,4)"), "v * 2 AS v", False),
        # a text column's length comes in bytes: varchar(100) of utf8mb4 is not 400 characters
        ("mysql->postgres", ("VARCHAR(100)", "varchar(100)"), "v", False),
        ("mysql->postgres", ("VARCHAR(100)", "varchar(100)"), "CONCAT(v) AS v", False),
        ("mysql->postgres", ("VARCHAR(100)", "varchar(99)"), "v", True),
    ],
)
def test_a_query_source_is_described_too(
    sides: dict[str, Side],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    direction: str,
    types: tuple[str, str],
    query: str,
    refused: bool,
) -> None:
    """A query's columns by the server's description: a column taken from a table keeps its
    type, a computed one its own (Postgres: numeric without a modifier, unbounded)."""
    value = "2024-01-01 10:00:00" if "timestamp" in types[0] else "1.25"
    source, target = _prepare(sides, tmp_path, monkeypatch, direction, types, value)
    text = (tmp_path / "moves.yaml").read_text()
    select = f"SELECT id, {query} FROM {source.qualified('src')}"
    text = text.replace(f"table: {source.table('src')}}}", f'query: "{select}"}}')
    (tmp_path / "moves.yaml").write_text(text)
    code = _run(tmp_path)
    err = capsys.readouterr().err
    if refused:
        assert code == 3 and "DPONE_PREFLIGHT_FAILED" in err and "column 'v'" in err, err
        assert _target_ids(target) == [99]
    else:
        assert code == 0, err
        assert _target_ids(target) == [1, 2, 3, 99]


@pytest.mark.postgres
@pytest.mark.parametrize("direction", ["postgres->sqlite", "postgres->mysql"])
def test_an_integer_chunk_column_stored_as_text_is_refused(
    sides: dict[str, Side],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    direction: str,
) -> None:
    """Text orders '19' before '2': chunk [19, 20) of the target would hold row '2', and a
    replace of it would delete that committed row while every chunk's read-back still matched.
    Refused before any lease, even with sink.accept_narrowing naming the column."""
    source, target = (sides[k] for k in direction.split("->"))
    monkeypatch.setenv("DPONE_CONN_SRC", source.dsn)
    monkeypatch.setenv("DPONE_CONN_DST", target.dsn)
    source.run(
        f"CREATE TABLE {source.qualified('src')} (id integer PRIMARY KEY, v integer)",
        f"INSERT INTO {source.qualified('src')} VALUES (2, 2), (19, 19)",
    )
    target.run(f"CREATE TABLE {target.qualified('dst')} (id varchar(20), v integer)")
    (tmp_path / "moves.yaml").write_text(
        MANIFEST.format(
            source=source.table("src"),
            target=target.table("dst"),
            accept="\n      accept_narrowing: [id]",
            audit=sides["audit"].namespace,
        ).replace("start: 1, end: 4", "start: 1, end: 30")
    )
    assert _run(tmp_path) == 3
    last = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert last["code"] == "DPONE_PREFLIGHT_FAILED" and last["line"] == TABLE_LINE, last
    assert "integer chunk column 'id'" in last["message"], last
    assert _transitions(sides) == 0, "a chunk was leased"
    assert target.run(f"SELECT count(*) FROM {target.qualified('dst')}")[0][0] == 0


def _held(side: Side, table: str, read: str = "v") -> list[Any]:
    """The chunk's rows' ``read`` as the plain driver reads them, no dpone (99 is no chunk's)."""
    rows = side.run(f"SELECT {read} FROM {side.qualified(table)} WHERE id < 99 ORDER BY id")
    return [row[0] for row in rows]


def _read_by_query(root: Path, source: Side) -> None:
    """The manifest's source as a query of the same table (its columns carry no declared type
    on SQLite)."""
    text = (root / "moves.yaml").read_text()
    select = f"SELECT id, v FROM {source.qualified('src')}"
    text = text.replace(f"table: {source.table('src')}}}", f'query: "{select}"}}')
    (root / "moves.yaml").write_text(text)


def _refused_before_any_lease(
    code: int, err: str, sides: dict[str, Side], target: Side, said: str
) -> None:
    """The preflight refused column v at the sink's table: no transition, the target as it was."""
    assert code == 3, err
    last = json.loads(err.strip().splitlines()[-1])
    assert last["code"] == "DPONE_PREFLIGHT_FAILED" and last["line"] == TABLE_LINE, last
    assert "column 'v'" in last["message"] and said in last["message"], last
    assert _transitions(sides) == 0 and _target_ids(target) == [99]


def _with_read_back_count(root: Path) -> None:
    manifest = root / "moves.yaml"
    text = manifest.read_text().replace(
        "strategy: {mode: backfill}", "strategy: {mode: backfill}\n      read_back: count"
    )
    manifest.write_text(text)


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("direction", "types", "value", "refused"),
    [
        ("mysql->postgres", ("TINYTEXT", "varchar(100)"), "a" * 100 + " " * 50, True),
        ("mysql->postgres", ("TINYTEXT", "varchar(255)"), "a" * 100 + " " * 50, False),
        ("mysql->postgres", ("TINYTEXT", "varchar(255)"), "a" * 255, False),
        ("mysql->mysql", ("TINYTEXT", "TINYTEXT"), "a" * 255, False),  # compared in bytes
        ("mysql->mysql", ("TEXT", "TEXT"), "b" * 65_535, False),
    ],
    ids=["tinytext->varchar(100)", "->varchar(255)", "255 chars", "->tinytext", "text->text"],
)
def test_a_mariadb_text_of_one_byte_characters_is_not_cut(
    sides: dict[str, Side],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    direction: str,
    types: tuple[str, str],
    value: str,
    refused: bool,
) -> None:
    """Regression: a utf8mb4 TINYTEXT counted as 63 characters (255 bytes over 4), so varchar(100)
    was accepted, and under read_back: count 100 'a' and 50 spaces passed cut to 100 by Postgres.
    A MariaDB TEXT holds its byte limit in one-byte characters; one into the same TEXT runs."""
    source, target = _prepare(sides, tmp_path, monkeypatch, direction, types, value)
    _with_read_back_count(tmp_path)
    code = _run(tmp_path)
    err = capsys.readouterr().err
    if refused:
        assert code == 3 and "DPONE_PREFLIGHT_FAILED" in err, err
        assert "up to 255 characters" in err and "column 'v'" in err, err
        assert _target_ids(target) == [99]
        return
    assert code == 0, err
    assert _held(target, "dst") == _held(source, "src") == [value] * 3


# (direction, source type, target type, a source value, how to read v, what the target holds)
KEPT = [
    # a boolean into a number: MariaDB (BOOLEAN is TINYINT(1)) and SQLite store 1/0
    ("postgres->mysql", "boolean", "INT", "true", "v", 1),
    ("postgres->mysql", "boolean", "DECIMAL(5,0)", "true", "v", 1),
    ("postgres->mysql", "boolean", "DOUBLE", "false", "v", 0),
    ("postgres->sqlite", "boolean", "INTEGER", "true", "v", 1),
    ("postgres->postgres", "jsonb", "json", '{"a":1}', "v::text", '{"a": 1}'),
    ("postgres->postgres", "json", "json", '{"a":1}', "v::text", '{"a":1}'),
    ("postgres->postgres", "timetz", "timetz", "10:00+02", "v::text", "10:00:00+02"),
    # a SQLite column without a declared type keeps each value's kind, as the typed ones would
    ("postgres->sqlite", "integer", "", "7", "typeof(v) || quote(v)", "integer7"),
    ("postgres->sqlite", "double precision", "", "0.1", "typeof(v) || quote(v)", "real0.1"),
    ("postgres->sqlite", "boolean", "BLOB", "true", "typeof(v) || quote(v)", "integer1"),
    ("postgres->sqlite", "bytea", "", "\\x00ff", "typeof(v) || quote(v)", "blobX'00FF'"),
    ("postgres->sqlite", "text", "", "ab ", "typeof(v) || quote(v)", "text'ab '"),
    ("postgres->sqlite", "numeric(10,0)", "", "7", "typeof(v) || quote(v)", "text'7'"),
    (
        "postgres->sqlite",
        "timestamp(6)",
        "",
        "2024-01-01 10:00:00.5",
        "typeof(v) || quote(v)",
        "text'2024-01-01 10:00:00.5'",
    ),
    ("mysql->sqlite", "CHAR(5)", "BLOB", "ab", "typeof(v) || quote(v)", "text'ab'"),
]


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("direction", "source_type", "target_type", "value", "read", "held"),
    KEPT,
    ids=[f"{d}:{s}->{t or 'untyped'}" for d, s, t, _, _, _ in KEPT],
)
def test_accepted_pairs_keep_the_values(
    sides: dict[str, Side],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    direction: str,
    source_type: str,
    target_type: str,
    value: str,
    read: str,
    held: object,
) -> None:
    """What the preflight accepts runs, and the target holds the value as the plain driver reads
    it: booleans into MariaDB and SQLite numbers (Postgres numbers are refused), jsonb into json
    and json into json (json into jsonb is refused), a SQLite column with no declared type."""
    types = (source_type, target_type)
    _, target = _prepare(sides, tmp_path, monkeypatch, direction, types, value)
    assert _run(tmp_path) == 0, capsys.readouterr().err
    assert _held(target, "dst", read) == [held] * 3


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("direction", "types", "query", "refused"),
    [
        ("sqlite->postgres", ("TEXT", "char(5)"), True, True),
        ("sqlite->postgres", ("", "char(5)"), False, True),
        ("sqlite->postgres", ("BLOB", "char(5)"), False, True),
        ("sqlite->mysql", ("", "CHAR(5)"), False, True),
        ("sqlite->postgres", ("TEXT", "varchar(5)"), True, False),
        ("sqlite->postgres", ("", "text"), False, False),
        ("sqlite->mysql", ("TEXT", "VARCHAR(5)"), True, False),
        ("sqlite->sqlite", ("", ""), True, False),
    ],
)
def test_a_source_of_unknown_type_into_a_fixed_width_column_is_refused(
    sides: dict[str, Side],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    direction: str,
    types: tuple[str, str],
    query: bool,
    refused: bool,
) -> None:
    """Regression: a SQLite query's result (or a column with no declared type) 'ab' into a
    Postgres char(5) was stored as 'ab   ' and passed, while a TEXT column was refused for the
    padding. A column of unknown type into a variable-length one still runs, value for value."""
    ids = ("integer", "integer" if direction.endswith("sqlite") else "bigint")
    source, target = _prepare(sides, tmp_path, monkeypatch, direction, types, "ab", ids=ids)
    if query:
        _read_by_query(tmp_path, source)
    code = _run(tmp_path)
    err = capsys.readouterr().err
    if refused:
        _refused_before_any_lease(code, err, sides, target, "unknown")
        return
    assert code == 0, err
    assert _held(target, "dst") == _held(source, "src") == ["ab"] * 3


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("direction", "types", "query", "refused"),
    [
        ("sqlite->postgres", ("REAL", "numeric(10,2)"), True, True),
        ("sqlite->postgres", ("", "numeric(10,2)"), False, True),
        ("sqlite->postgres", ("", "text"), False, True),
        ("sqlite->sqlite", ("", ""), True, False),
    ],
    ids=["query->numeric", "untyped->numeric", "untyped->text", "untyped->untyped"],
)
def test_a_source_of_unknown_type_needs_the_checksum_gate(
    sides: dict[str, Side],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    direction: str,
    types: tuple[str, str],
    query: bool,
    refused: bool,
) -> None:
    """Regression: a column of unknown type is not compared by the preflight because the gate
    sees its values; under read_back: count a SQLite query's 1.239 passed as 1.24 in a Postgres
    numeric(10,2). Into another column of unknown type it is stored as bound, and runs."""
    ids = ("integer", "" if direction.endswith("sqlite") else "bigint")
    source, target = _prepare(sides, tmp_path, monkeypatch, direction, types, "1.239", ids=ids)
    if query:
        _read_by_query(tmp_path, source)
    _with_read_back_count(tmp_path)
    code = _run(tmp_path)
    err = capsys.readouterr().err
    if refused:
        _refused_before_any_lease(code, err, sides, target, "'count'")
        return
    assert code == 0, err
    assert _held(target, "dst", "typeof(v) || quote(v)") == ["text'1.239'"] * 3


@pytest.mark.postgres
@pytest.mark.parametrize("declared", ["", "BLOB"], ids=["untyped", "blob"])
def test_an_integer_chunk_column_in_an_untyped_sqlite_column_runs(
    sides: dict[str, Side],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    declared: str,
) -> None:
    ids = ("integer", declared)
    _, target = _prepare(
        sides, tmp_path, monkeypatch, "postgres->sqlite", ("integer", "integer"), "7", ids=ids
    )
    assert _run(tmp_path) == 0, capsys.readouterr().err
    assert _target_ids(target) == [1, 2, 3, 99]
