"""The read-back gate's source checksum in the ledger (schema version 3): every store keeps it with
the COMMITTED transition, and a version 2 Postgres ledger is migrated in place with its records."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from dpone.ledger.port import ChunkResult
from dpone.ledger.postgres import MIGRATIONS, PostgresLedger
from dpone.ledger.sql import SCHEMA_VERSION
from ledger_backends import Backend, make_shape

SOURCE = "rowsum-pghash64-v1:3:00000000000000aa"


def _commit(store, shape, index: int, source: str | None):  # type: ignore[no-untyped-def]
    chunk = shape.chunks[index - 1]
    lease = store.acquire_lease(shape, chunk, "w", 30).lease
    assert lease is not None
    result = ChunkResult(True, rows=3, checksum=SOURCE, source_checksum=source)
    store.complete(lease, chunk, result)


def test_every_store_keeps_the_source_checksum(backend: Backend) -> None:
    shape = make_shape(chunks=2)
    store = backend.open()
    store.initialize(shape, "main", 5)
    _commit(store, shape, 1, SOURCE)
    _commit(store, shape, 2, None)  # read_back count or off: no source checksum
    ledger = store.load(shape.run_key)
    assert ledger is not None
    records = ledger.records
    assert records[1].source_checksum == SOURCE and records[1].checksum == SOURCE
    assert records[2].source_checksum is None


@pytest.mark.postgres
def test_a_version_2_ledger_is_migrated_with_its_records(pg_dsn: str, pg_schema: str) -> None:
    assert SCHEMA_VERSION >= 3
    s = f'"{pg_schema}"'
    shape = make_shape(chunks=2)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {s}")
        for version in (1, 2):  # what a version 2 dpone created: no source_checksum column
            for statement in MIGRATIONS[version](s):
                conn.execute(statement)  # type: ignore[arg-type]
            conn.execute(f"INSERT INTO {s}.schema_version (version) VALUES (%s)", (version,))
        conn.execute(f"ALTER TABLE {s}.chunk_transition DROP COLUMN IF EXISTS source_checksum")
    store = PostgresLedger(pg_dsn, pg_schema)
    try:
        store.initialize(shape, "main", 5)
        _commit(store, shape, 1, SOURCE)
        ledger = store.load(shape.run_key)
        assert ledger is not None
        assert ledger.records[1].source_checksum == SOURCE
    finally:
        store.close()
    with psycopg.connect(pg_dsn) as conn:
        versions = conn.execute(f"SELECT version FROM {s}.schema_version ORDER BY 1").fetchall()
    assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]


def test_the_local_file_ledger_reads_records_without_it(tmp_path: Path) -> None:
    from dpone.ledger.localfile import LocalFileLedger

    shape = make_shape(chunks=1)
    with LocalFileLedger(str(tmp_path / "ledger.json")) as store:
        store.initialize(shape, "main", 5)
        _commit(store, shape, 1, None)
    text = (tmp_path / "ledger.json.journal").read_text()
    assert "source_checksum" not in text  # absent when not set: older readers see what they knew
