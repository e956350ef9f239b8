"""open_store: the backend a state declaration names, with driver guards instead of ImportError."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.ledger.factory import open_store
from dpone.ledger.localfile import LocalFileLedger


def test_local_file(tmp_path: Path) -> None:
    store = open_store("local_file", None, None, str(tmp_path / "l.json"), lease_seconds=5)
    assert isinstance(store, LocalFileLedger) and not store.capabilities.mapped_ready
    store.close()


@pytest.mark.postgres
def test_audit_schema_on_postgres(pg_dsn: str, pg_schema: str) -> None:
    store = open_store("audit_schema", pg_dsn, pg_schema, None)
    assert store.name == "postgres" and store.capabilities.mapped_ready
    store.close()


@pytest.mark.parametrize(
    ("backend", "dsn", "path", "code"),
    [
        ("clickhouse", "clickhouse://h", None, errors.LEDGER_UNAVAILABLE),
        ("audit_schema", None, None, errors.CONFIG_INVALID),
        ("audit_schema", "sqlite:///x.db", None, errors.LEDGER_UNAVAILABLE),
        ("local_file", None, None, errors.CONFIG_INVALID),
        ("etcd", None, None, errors.CONFIG_INVALID),
    ],
)
def test_refusals(backend: str, dsn: str | None, path: str | None, code: str) -> None:
    with pytest.raises(DponeError) as caught:
        open_store(backend, dsn, None, path)
    assert caught.value.code == code


@pytest.mark.parametrize(
    ("module", "dsn", "extra"),
    [
        ("psycopg", "postgresql://u@h/d", "[postgres] extra"),
        ("pyodbc", "mssql://u:p@h:1433/d", "[mssql] extra"),
    ],
)
def test_missing_driver_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, dsn: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.delitem(sys.modules, "dpone.ledger.postgres", raising=False)
    with pytest.raises(DponeError) as caught:
        open_store("audit_schema", dsn, None, None)
    assert caught.value.code == errors.LEDGER_UNAVAILABLE
    assert extra in caught.value.message
