"""The MSSQL adapter's T-SQL: every statement it sent in the contract suite parses as T-SQL, and
the sp_getapplock return codes are handled as documented."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlglot
from dpone import errors
from dpone.errors import DponeError
from dpone.ledger.mssql import MIGRATIONS, MssqlLedger, MssqlStatements, odbc_connection_string
from dpone.ledger.port import ChunkResult, LeaseStatus
from ledger_backends import MssqlDoubleBackend, make_shape
from ledger_mssql_double import split_statements
from sqlglot import exp


def _exercise(backend: MssqlDoubleBackend) -> None:
    shape = make_shape(chunks=3)
    store = backend.open(lease_seconds=30)
    store.initialize(shape, "a", 5)
    lease = store.acquire_lease(shape, shape.chunks[0], "a", 30).lease
    assert lease is not None
    store.renew(lease, 30)
    store.complete(lease, shape.chunks[0], ChunkResult(committed=True))
    store.cancel(shape.run_key, "x")
    store.cancel(shape.run_key, "y", undo=True)
    store.list_campaigns("wl")
    store.load(shape.run_key)
    grown = make_shape(chunks=5)
    store.extend(grown, lambda end: grown.config_hash, "b", 5)
    store.amendments(shape.run_key)
    store.restate(grown, [1, 2], "fix", "ana")
    store.restatements(shape.run_key)


def test_every_statement_sent_parses_as_tsql(tmp_path: Path) -> None:
    backend = MssqlDoubleBackend(tmp_path)
    _exercise(backend)
    sent = list(dict.fromkeys(backend.double.statements))
    assert len(sent) >= 15
    for batch in sent:
        for statement in split_statements(batch):
            parsed = sqlglot.parse_one(statement, read="tsql")
            assert not isinstance(parsed, exp.Command), f"not understood as T-SQL: {statement}"
    backend.close()


def test_every_statement_the_adapter_defines_parses_as_tsql() -> None:
    sql = MssqlStatements("dpone_audit")
    texts = [v for k, v in vars(sql).items() if k != "schema"]
    for version in sorted(MIGRATIONS):
        texts += MIGRATIONS[version](sql.schema)
    for batch in texts:
        for statement in split_statements(batch):
            assert not isinstance(sqlglot.parse_one(statement, read="tsql"), exp.Command)


def test_applock_is_transaction_owned_and_released_by_commit(tmp_path: Path) -> None:
    backend = MssqlDoubleBackend(tmp_path)
    shape = make_shape(chunks=1)
    store = backend.open()
    store.initialize(shape, "a", 5)
    store.acquire_lease(shape, shape.chunks[0], "a", 30)
    assert backend.double.held_applocks() == []  # nothing outlives a transaction
    backend.close()


class _FixedApplock(MssqlDoubleBackend):
    """A double whose sp_getapplock answers with a fixed return code."""

    def __init__(self, directory: Path, code: int) -> None:
        super().__init__(directory)
        self.double.applock = lambda owner, resource, timeout_ms: code  # type: ignore[method-assign]


@pytest.mark.parametrize("code", [-1, -2, -3])
def test_applock_refusals_are_busy_and_roll_back(tmp_path: Path, code: int) -> None:
    backend = MssqlDoubleBackend(tmp_path)
    shape = make_shape(chunks=1)
    backend.open().initialize(shape, "a", 5)
    refusing = _FixedApplock(tmp_path, code)
    store = refusing.open()
    with pytest.raises(DponeError) as caught:
        store.initialize(shape, "b", 0.1)
    assert caught.value.code == errors.MAPPING_CAMPAIGN_BUSY
    assert store.acquire_lease(shape, shape.chunks[0], "b", 30).status is LeaseStatus.BUSY
    assert not store._conn.in_transaction  # type: ignore[attr-defined]  # rolled back by us


def test_applock_call_error_is_ledger_unavailable(tmp_path: Path) -> None:
    backend = MssqlDoubleBackend(tmp_path)
    shape = make_shape(chunks=1)
    backend.open().initialize(shape, "a", 5)
    store = _FixedApplock(tmp_path, -999).open()
    with pytest.raises(DponeError) as caught:
        store.initialize(shape, "b", 0.1)
    assert caught.value.code == errors.LEDGER_UNAVAILABLE


def test_odbc_connection_string_from_a_url() -> None:
    text = odbc_connection_string("mssql://user:p%3Bw%7D@db.example:1433/ledger?Encrypt=yes")
    assert text.startswith("DRIVER={ODBC Driver 18 for SQL Server};SERVER=db.example,1433;")
    assert "DATABASE=ledger" in text and "UID=user" in text and "PWD={p;w}}}" in text
    assert "APP=dpone-ledger" in text and "KeepAlive=30" in text and text.endswith("Encrypt=yes")
    raw = odbc_connection_string("odbc://?odbc_connect=DRIVER%3D%7BFreeTDS%7D%3BSERVER%3Dh")
    assert raw == "DRIVER={FreeTDS};SERVER=h;APP=dpone-ledger"
    with pytest.raises(DponeError) as caught:
        odbc_connection_string("mssql:///nohost")
    assert caught.value.code == errors.CONFIG_INVALID


def test_the_adapter_refuses_to_start_without_pyodbc(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pyodbc", None)
    with pytest.raises(DponeError) as caught:
        MssqlLedger("mssql://u:p@h:1433/d")
    assert caught.value.code == errors.LEDGER_UNAVAILABLE
    assert "[mssql] extra" in caught.value.message


def test_listing_never_creates_the_audit_schema(tmp_path: Path) -> None:
    """`ledger list` opens the store with create=False: no schema is no campaigns, no DDL sent;
    once a run created it, the same read-only open lists it (the double: UNVERIFIED on a server)."""
    import contextlib
    import sqlite3

    backend = MssqlDoubleBackend(tmp_path)

    def tables() -> list[str]:
        """The double's schemas and tables (its own __schemas bookkeeping table aside)."""
        with contextlib.closing(sqlite3.connect(backend.double.path)) as raw:
            names = [r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            schemas = [r[0] for r in raw.execute("SELECT name FROM __schemas")]
        return schemas + [name for name in names if name != "__schemas"]

    reader = backend._open(300.0, create=False)
    assert reader.list_campaigns() == []
    reader.close()
    assert tables() == []
    writer = backend._open(300.0)
    shape = make_shape()
    writer.initialize(shape, "owner", 5.0)
    writer.close()
    reader = backend._open(300.0, create=False)
    assert reader.list_campaigns() == [shape.run_key]
    reader.close()
