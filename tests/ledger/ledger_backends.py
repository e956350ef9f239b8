"""The three ledger stores behind one test-facing surface, so one contract suite runs on all.

Each backend opens fresh store instances on the same underlying state (like separate pods) and
knows how to reach under the store for what a contract test must provoke: a corrupt record, a
held campaign lock, a newer schema version, a dropped connection.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dpone.ledger.localfile import LocalFileLedger
from dpone.ledger.port import CampaignShape, LedgerStore
from dpone.ledger.sql import bound_text, campaign_lock_key, lock_resource
from dpone.plan.chunks import ChunkSpec, plan_chunks, plan_hash

CONFIG_HASH = "sha256:" + "c" * 64


def make_shape(
    run_key: str = "bf-test", chunks: int = 6, config_hash: str = CONFIG_HASH, workload: str = "wl"
) -> CampaignShape:
    """A date-chunked campaign of ``chunks`` days."""
    end = (dt.date(2024, 1, 1) + dt.timedelta(days=chunks)).isoformat()
    planned = plan_chunks(ChunkSpec("day", "date", "2024-01-01", end, 1, "day"), run_key)
    return CampaignShape(run_key, workload, "proc", plan_hash(planned), config_hash, planned)


def bad_record(shape: CampaignShape, index: int, **override: Any) -> dict[str, Any]:
    """A RUNNING transition row for ``index`` with some field overridden (a corrupt record)."""
    chunk = shape.chunks[index - 1]
    row: dict[str, Any] = {
        "chunk_index": index,
        "state": "committed",
        "attempt": 1,
        "idempotency_key": chunk.idempotency_key,
        "chunk_start": bound_text(chunk.start),
        "chunk_end": bound_text(chunk.end),
    }
    row.update(override)
    return row


class Backend:
    name = "abstract"
    sql = True

    def __init__(self) -> None:
        self.opened: list[LedgerStore] = []

    def open(self, lease_seconds: float = 30.0, **options: Any) -> LedgerStore:
        """A new store instance on the shared state (closed by the fixture at teardown)."""
        store = self._open(lease_seconds, **options)
        self.opened.append(store)
        return store

    def _open(self, lease_seconds: float, **options: Any) -> LedgerStore:
        raise NotImplementedError

    def inject(self, run_key: str, row: dict[str, Any]) -> None:
        """Append a raw transition row (as a hand edit or a foreign writer would)."""
        raise NotImplementedError

    def edit_shape_row(self, run_key: str, index: int, chunk_start: str | None) -> None:
        """Hand-edit a stored chunk row of the campaign shape: its chunk_start text, or (None)
        delete the row. SQL stores only."""
        raise NotImplementedError

    @contextlib.contextmanager
    def hold_campaign_lock(self, run_key: str) -> Iterator[None]:
        raise NotImplementedError
        yield

    def set_newer_version(self) -> None:
        raise NotImplementedError

    def kill_connections(self, store: LedgerStore) -> None:
        raise NotImplementedError

    def create_sink(self) -> None:
        """A one-column sink table in another schema of the ledger's database."""
        raise NotImplementedError

    def sink_write(self, connection: Any, value: int) -> None:
        raise NotImplementedError

    def sink_rows(self) -> list[int]:
        raise NotImplementedError

    def close(self) -> None:
        for store in self.opened:
            store.close()


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, dsn: str, schema: str) -> None:
        super().__init__()
        self.dsn = dsn
        self.schema = schema

    def _open(self, lease_seconds: float, **options: Any) -> LedgerStore:
        from dpone.ledger.postgres import PostgresLedger

        return PostgresLedger(self.dsn, self.schema, lease_seconds, **options)

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def inject(self, run_key: str, row: dict[str, Any]) -> None:
        with self._connect() as conn:
            conn.execute(
                f'ALTER TABLE "{self.schema}".chunk_transition '
                "DROP CONSTRAINT IF EXISTS chunk_transition_state_check"
            )
            conn.execute(
                f'INSERT INTO "{self.schema}".chunk_transition (run_key, chunk_index, transition, '
                "state, attempt, idempotency_key, chunk_start, chunk_end) "
                "SELECT %s, %s, coalesce(max(transition), 0) + 1, %s, %s, %s, %s, %s "
                f'FROM "{self.schema}".chunk_transition WHERE run_key = %s AND chunk_index = %s',
                (
                    run_key,
                    row["chunk_index"],
                    row["state"],
                    row["attempt"],
                    row["idempotency_key"],
                    row["chunk_start"],
                    row["chunk_end"],
                    run_key,
                    row["chunk_index"],
                ),
            )

    def edit_shape_row(self, run_key: str, index: int, chunk_start: str | None) -> None:
        table = f'"{self.schema}".campaign_chunk'
        with self._connect() as conn:
            if chunk_start is None:
                conn.execute(
                    f"DELETE FROM {table} WHERE run_key = %s AND chunk_index = %s", (run_key, index)
                )
            else:
                conn.execute(
                    f"UPDATE {table} SET chunk_start = %s WHERE run_key = %s AND chunk_index = %s",
                    (chunk_start, run_key, index),
                )

    @contextlib.contextmanager
    def hold_campaign_lock(self, run_key: str) -> Iterator[None]:
        import psycopg

        with psycopg.connect(self.dsn) as conn:
            conn.execute(
                "SELECT pg_advisory_xact_lock(%s)", (campaign_lock_key(self.schema, run_key),)
            )
            try:
                yield
            finally:
                conn.rollback()

    def set_newer_version(self) -> None:
        with self._connect() as conn:
            conn.execute(f'INSERT INTO "{self.schema}".schema_version (version) VALUES (99)')

    def kill_connections(self, store: LedgerStore) -> None:
        with self._connect() as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'dpone-ledger' AND pid <> pg_backend_pid() "
                "AND pid = %s",
                (store._conn.info.backend_pid,),  # type: ignore[attr-defined]
            )

    def create_sink(self) -> None:
        with self._connect() as conn:
            conn.execute(f'CREATE SCHEMA "{self.schema}_sink"')
            conn.execute(f'CREATE TABLE "{self.schema}_sink".t (a integer)')

    def sink_write(self, connection: Any, value: int) -> None:
        with connection.cursor().copy(f'COPY "{self.schema}_sink".t (a) FROM STDIN') as copy:
            copy.write_row((value,))

    def sink_rows(self) -> list[int]:
        with self._connect() as conn:
            rows = conn.execute(f'SELECT a FROM "{self.schema}_sink".t ORDER BY a').fetchall()
            return [row[0] for row in rows]

    def close(self) -> None:
        super().close()
        with self._connect() as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}_sink" CASCADE')


class MssqlDoubleBackend(Backend):
    name = "mssql_double"

    def __init__(self, directory: Path, schema: str = "dpone_audit") -> None:
        from ledger_mssql_double import MssqlDouble

        super().__init__()
        self.double = MssqlDouble(directory)
        self.schema = schema

    def _open(self, lease_seconds: float, **options: Any) -> LedgerStore:
        from dpone.ledger.mssql import MssqlLedger

        return MssqlLedger(
            "mssql://dpone:secret@double.invalid:1433/ledger?TrustServerCertificate=yes",
            self.schema,
            lease_seconds,
            driver=self.double,
            **options,
        )

    def _raw(self) -> sqlite3.Connection:
        raw = sqlite3.connect(self.double.path, timeout=30)
        raw.execute("PRAGMA ignore_check_constraints = ON")
        return raw

    def inject(self, run_key: str, row: dict[str, Any]) -> None:
        table = f'"{self.schema}__chunk_transition"'
        with contextlib.closing(self._raw()) as raw, raw:
            raw.execute(
                f'INSERT INTO {table} (run_key, chunk_index, "transition", state, attempt, '
                "idempotency_key, chunk_start, chunk_end, recorded_at) "
                f"SELECT ?, ?, coalesce(max(\"transition\"), 0) + 1, ?, ?, ?, ?, ?, '2024-01-01 00:00:00.000000' "
                f"FROM {table} WHERE run_key = ? AND chunk_index = ?",
                (
                    run_key,
                    row["chunk_index"],
                    row["state"],
                    row["attempt"],
                    row["idempotency_key"],
                    row["chunk_start"],
                    row["chunk_end"],
                    run_key,
                    row["chunk_index"],
                ),
            )

    def edit_shape_row(self, run_key: str, index: int, chunk_start: str | None) -> None:
        table = f'"{self.schema}__campaign_chunk"'
        with contextlib.closing(self._raw()) as raw, raw:
            if chunk_start is None:
                raw.execute(
                    f"DELETE FROM {table} WHERE run_key = ? AND chunk_index = ?", (run_key, index)
                )
            else:
                raw.execute(
                    f"UPDATE {table} SET chunk_start = ? WHERE run_key = ? AND chunk_index = ?",
                    (chunk_start, run_key, index),
                )

    @contextlib.contextmanager
    def hold_campaign_lock(self, run_key: str) -> Iterator[None]:
        conn = self.double.connect("holder")
        cursor = conn.cursor()
        cursor.execute(
            "SET NOCOUNT ON; DECLARE @rc INT; EXEC @rc = sp_getapplock @Resource = ?, "
            "@LockMode = 'Exclusive', @LockOwner = 'Transaction', @LockTimeout = ?; SELECT @rc AS rc",
            lock_resource(self.schema, run_key),
            0,
        )
        assert cursor.fetchone() == (0,)
        try:
            yield
        finally:
            conn.rollback()
            conn.close()

    def set_newer_version(self) -> None:
        with contextlib.closing(self._raw()) as raw, raw:
            raw.execute(
                f'INSERT INTO "{self.schema}__schema_version" (version, applied_at) VALUES (99, 0)'
            )

    def kill_connections(self, store: LedgerStore) -> None:
        self.double.kill_connections()

    def create_sink(self) -> None:
        conn = self.double.connect("sink")
        conn.cursor().execute("CREATE SCHEMA [sink]")
        conn.cursor().execute("CREATE TABLE [sink].[t] (a INT NOT NULL)")
        conn.commit()
        conn.close()

    def sink_write(self, connection: Any, value: int) -> None:
        connection.cursor().execute("INSERT INTO [sink].[t] (a) VALUES (?)", value)

    def sink_rows(self) -> list[int]:
        conn = self.double.connect("sink")
        cursor = conn.cursor().execute("SELECT a FROM [sink].[t] ORDER BY a")
        rows = [int(row[0]) for row in cursor.fetchall()]
        conn.rollback()
        conn.close()
        return rows


class LocalFileBackend(Backend):
    name = "local_file"
    sql = False

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.path = directory / "state" / "ledger.json"

    def _open(self, lease_seconds: float, **options: Any) -> LedgerStore:
        options.pop("chunk_lock_timeout_s", None)
        return LocalFileLedger(self.path, lease_seconds, **options)

    def inject(self, run_key: str, row: dict[str, Any]) -> None:
        store = LocalFileLedger(self.path)
        with store._locked():
            campaign = store._campaigns[run_key]
            previous = campaign.latest.get(row["chunk_index"])
            entry = {
                "seq": store._last_seq + 1,
                "kind": "transition",
                "run_key": run_key,
                "transition": 1 if previous is None else previous.transition + 1,
                "lease_owner": None,
                "lease_expires_at": None,
                **row,
            }
            store._append(entry)
        store.close()

    @contextlib.contextmanager
    def hold_campaign_lock(self, run_key: str) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def set_newer_version(self) -> None:
        store = LocalFileLedger(self.path)
        store.compact()
        store.close()
        document = json.loads(self.path.read_text())
        document["format_version"] = 99
        self.path.write_text(json.dumps(document))
