"""Spec validation, identifier rules and the factory (no database needed)."""

from __future__ import annotations

import sys

import pytest
from dpone import errors
from dpone.connectors import (
    ChunkWindow,
    SinkOptions,
    SinkSpec,
    SourceSpec,
    TableRef,
    open_sink,
    open_source,
)
from dpone.connectors.mssql import MssqlSink
from dpone.connectors.sqlite import SqliteSink, SqliteSource
from dpone.errors import DponeError

OPTIONS = SinkOptions()


def _code(fn, *args, **kw) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(DponeError) as caught:
        fn(*args, **kw)
    return caught.value.code


def test_source_spec_needs_exactly_one_of_table_and_query() -> None:
    assert _code(SourceSpec, "s") == errors.CONNECTOR_INVALID
    assert _code(SourceSpec, "s", TableRef(None, "t"), "SELECT 1") == errors.CONNECTOR_INVALID
    assert _code(SourceSpec, "s", query=" ; ") == errors.CONNECTOR_INVALID
    assert (
        _code(SourceSpec, "s", TableRef(None, "t"), columns=("a", "a")) == errors.CONNECTOR_INVALID
    )


def test_sink_spec_rules() -> None:
    assert _code(SinkSpec, "d", TableRef(None, "t"), "merge") == errors.CONNECTOR_INVALID
    assert _code(SinkSpec, "d", TableRef(None, "t"), "upsert") == errors.CONNECTOR_INVALID
    assert SinkSpec("d", TableRef(None, "t"), "full_refresh").inner_mode == "full_refresh"
    assert (
        _code(SinkSpec, "d", TableRef(None, "t"), "merge", ("k", "k")) == errors.CONNECTOR_INVALID
    )


def test_window_rules() -> None:
    assert _code(ChunkWindow, "d", "week", "a", "b") == errors.CONNECTOR_INVALID
    assert _code(ChunkWindow, "d", "date", 1, 2) == errors.CONNECTOR_INVALID
    assert _code(ChunkWindow, "d", "integer", True, 2) == errors.CONNECTOR_INVALID
    assert _code(ChunkWindow, "d", "date", "2024-01-02", "2024-01-01") == errors.CONNECTOR_INVALID
    assert ChunkWindow("d", "integer", 1, 2).display() == "d [1, 2)"


def test_replace_needs_a_window_and_table_checksum_needs_all_bounds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from dpone.connectors import table_checksum

    dsn = f"sqlite:///{tmp_path}/x.db"
    sink = SqliteSink(SinkSpec("d", TableRef(None, "t"), "replace"), dsn, OPTIONS)
    source = SqliteSource(SourceSpec("s", TableRef(None, "t")), dsn)
    assert _code(sink.write_all, source) == errors.CONNECTOR_INVALID
    assert not (tmp_path / "x.db").exists()  # refused before any connection
    assert _code(table_checksum, dsn, TableRef(None, "t"), "d", 1) == errors.CONNECTOR_INVALID


@pytest.mark.parametrize(
    "name", ["", "a\x00b", "x" * 64, "é" * 32]  # Postgres keeps 63 bytes, not characters
)
def test_postgres_identifiers_that_would_be_mangled_are_refused(name: str) -> None:
    spec = SinkSpec("d", TableRef(None, name), "replace")
    assert _code(open_sink, spec, "postgresql://u@h/db") == errors.IDENTIFIER_INVALID


def test_identifier_limits_per_dialect() -> None:
    long = "x" * 200
    assert SqliteSink(SinkSpec("d", TableRef(None, long), "replace"), "sqlite:///x.db", OPTIONS)
    spec = SinkSpec("d", TableRef(None, long), "replace")
    assert _code(MssqlSink, spec, "mssql://h/db", OPTIONS) == errors.IDENTIFIER_INVALID
    assert (
        _code(
            SqliteSource, SourceSpec("s", TableRef(None, "t"), columns=("a\x00",)), "sqlite:///x.db"
        )
        == errors.IDENTIFIER_INVALID
    )


def test_factory_picks_the_dialect_by_dsn() -> None:
    spec = SourceSpec("s", TableRef("public", "t"))
    assert open_source(spec, "postgresql://u@h/db").kind == "postgres"
    assert open_source(spec, "postgres://u@h/db").kind == "postgres"
    assert open_source(spec, "sqlite:///x.db").kind == "sqlite"
    assert open_source(spec, "mssql://u:p@h/db").kind == "mssql"
    assert open_source(spec, "odbc://DSN=x").kind == "mssql"
    assert open_source(spec, "mysql://h/db").kind == "mysql"
    assert open_source(spec, "mariadb://h/db").kind == "mysql"
    assert _code(open_source, spec, "oracle://h/db") == errors.CONFIG_INVALID


def test_missing_pymysql_is_a_dpone_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pymysql", None)
    monkeypatch.delitem(sys.modules, "dpone.connectors.mysql", raising=False)
    monkeypatch.delattr("dpone.connectors.mysql", raising=False)
    with pytest.raises(DponeError) as caught:
        open_sink(SinkSpec("d", TableRef(None, "t"), "replace"), "mysql://u@h/db")
    assert caught.value.code == errors.DRIVER_MISSING
    assert "[mysql] extra" in caught.value.message


def test_missing_psycopg_is_a_dpone_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.delitem(sys.modules, "dpone.connectors.postgres", raising=False)
    monkeypatch.delattr("dpone.connectors.postgres", raising=False)
    with pytest.raises(DponeError) as caught:
        open_sink(SinkSpec("d", TableRef(None, "t"), "replace"), "postgresql://u@h/db")
    assert caught.value.code == errors.DRIVER_MISSING
    assert "[postgres] extra" in caught.value.message and "by path" in caught.value.message
    assert "install dpone-runtime" not in caught.value.message  # the bare name is not ours
