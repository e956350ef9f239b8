"""SQLite source and sink (the embedded demo's default), standard-library sqlite3 only.

Rows move with ``executemany`` in batches inside one ``BEGIN IMMEDIATE`` transaction; when source
and sink are the same database file the chunk is copied with ``INSERT .. SELECT`` on one connection
(two connections to one file would wait on each other's locks). SQLite compares timestamps as
text, so timestamp columns hold UTC ``YYYY-MM-DD HH:MM:SS[.ffffff]`` (SQLite's own ``datetime()``
form) and timestamp bounds are bound in that form.

Lock waits: every connection waits at most DPONE_FENCE_LOCK_TIMEOUT for the file's lock. A file
still locked by another process is transient, never a refusal: the sink's chunk is CHUNK_BUSY,
a read or describe CONNECTION_FAILED (both retryable). SQLite's own busy wait ignores
``sqlite3_interrupt``, so the sink waits for its write lock in short steps that look at the stop
request between them, and a stopped sink rolls back instead of writing or committing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import math
import os
import pathlib
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Sequence
from operator import itemgetter
from typing import Any, Self, TypeGuard

from dpone import errors
from dpone.connectors import base, sql_base
from dpone.connectors.column_types import ColumnType
from dpone.connectors.dialect_types import sqlite_column_type
from dpone.credentials.connections import sqlite_path
from dpone.errors import DponeError
from dpone.lifecycle.interrupt import STOP
from dpone.lifecycle.session_limits import session_limits

MAX_IDENTIFIER_CHARS = 1024
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1  # what sqlite3 binds as an INTEGER
_SAFE_MESSAGE = re.compile(
    r"^(?:(?:UNIQUE|NOT NULL|CHECK|FOREIGN KEY|PRIMARY KEY) constraint failed(?:: [^']*)?"
    r"|no such (?:table|column): [^']*"
    r"|table \S+ has no column named \S+"
    r"|database (?:table )?is locked"
    r"|attempt to write a readonly database"
    r"|datatype mismatch"
    r"|\d+ values for \d+ columns"
    r"|ON CONFLICT clause does not match any PRIMARY KEY or UNIQUE constraint"
    r"|near \"[^\"']*\": syntax error)$"
)


#: SQLITE_BUSY, SQLITE_LOCKED: another connection holds the file's (or a table's) lock
_LOCK_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
#: The busy wait of one BEGIN IMMEDIATE try: the stop request is looked at between tries.
_BUSY_STEP_MS = 50


def _text_affinity(declared: str) -> bool:
    """SQLite's affinity rule 2: a declared type holding CHAR, CLOB or TEXT (and not INT, rule
    1) gives a column TEXT affinity."""
    return "INT" not in declared and any(word in declared for word in ("CHAR", "CLOB", "TEXT"))


class SqliteDialect(sql_base.SqlDialect):
    """SQLite names: "double-quoted" with embedded quotes doubled; ``?`` markers."""

    max_chars = MAX_IDENTIFIER_CHARS

    @staticmethod
    def bound(window: base.ChunkWindow, value: base.Bound) -> object:
        """SQLite binds 64-bit integers only: an integer bound beyond them (the end 2**63 that
        takes the largest id in) is bound as the float ±2**63, which SQLite compares with every
        integer exactly, so the chunk holds the same rows."""
        if isinstance(value, int) and not -(2**63) <= value < 2**63:
            return float(2**63) if value > 0 else -float(2**63)
        return base.sql_text_bound(window, value)


quote = SqliteDialect.quote
_columns_sql = SqliteDialect.columns_sql


def to_sqlite(value: object) -> object:
    """A Python value from another database in the form SQLite stores and dpone hashes."""
    if value is None or isinstance(value, int | float | str | bytes):
        return int(value) if isinstance(value, bool) else value
    if isinstance(value, decimal.Decimal):
        return base.canonical_decimal(value)
    if isinstance(value, dt.datetime):
        return base.canonical_datetime(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dt.date | dt.time | uuid.UUID):
        return base.canonical_text(value)
    return str(value)


#: SQLITE_CONSTRAINT_PRIMARYKEY and SQLITE_CONSTRAINT_UNIQUE: a key the table already holds
_KEY_CONFLICT_CODES = frozenset({1555, 2067})


def locked(exc: BaseException) -> TypeGuard[sqlite3.OperationalError]:
    """True when ``exc`` is SQLite's "the file (or a table) is locked by another connection"."""
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.OperationalError)
        and code is not None
        and code & 0xFF in _LOCK_CODES
    )


def describe_error(exc: sqlite3.Error) -> str:
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    text = str(exc)
    return f"{name}: {text}" if _SAFE_MESSAGE.match(text) else name


class SqliteConnection(sql_base.DriverConnection[sqlite3.Connection]):
    """A lazily opened connection to an existing database file, in autocommit mode."""

    def __init__(self, dsn: str, label: str) -> None:
        super().__init__(label)
        self.path = os.path.realpath(sqlite_path(dsn))
        self.read_only = False
        self.lock_timeout_s = session_limits().fence_lock_s
        #: set by interrupt() while a chunk's transaction is begun or in flight: it must not
        #: commit; an interrupt when idle is ignored (as a cancel reaching an idle session)
        self._stop = False
        self._in_chunk = False
        self._state = threading.Lock()

    def open(self) -> sqlite3.Connection:
        uri = pathlib.Path(self.path).as_uri() + ("?mode=ro" if self.read_only else "?mode=rw")
        try:
            return sqlite3.connect(
                uri,
                uri=True,
                isolation_level=None,
                timeout=self.lock_timeout_s,
                check_same_thread=False,
            )
        except sqlite3.Error:
            if not os.path.exists(self.path):
                # not transient: another attempt finds no file either (the name only: the DSN
                # stays out of messages)
                raise DponeError(
                    errors.CONFIG_INVALID,
                    f"{self._label}: the SQLite database file {os.path.basename(self.path)!r} "
                    "does not exist (a relative sqlite:/// path is taken from the working "
                    "folder); correct DPONE_CONN_<NAME>",
                ) from None
            raise DponeError(
                errors.CONNECTION_FAILED,
                f"{self._label}: could not open the SQLite database file",
            ) from None

    @property
    def driver_error(self) -> type[BaseException]:
        return sqlite3.Error

    describe = staticmethod(describe_error)

    def lost(self, exc: sqlite3.Error) -> str | None:
        if isinstance(exc, sqlite3.ProgrammingError) and "closed" in str(exc):
            return "the database connection is closed"
        return None

    def after_loss(self) -> None:
        """A closed connection stays closed: the caller closed it on purpose."""

    def translate(self, exc: BaseException, code: str, what: str) -> DponeError:
        """A lock held by another process past the wait is transient: CONNECTION_FAILED
        (retryable), not the caller's non-retryable ``code``."""
        if locked(exc):
            return DponeError(errors.CONNECTION_FAILED, self.locked_message(what, exc))
        return super().translate(exc, code, what)

    def locked_message(self, what: str, exc: sqlite3.Error) -> str:
        return (
            f"{what}: the SQLite file is locked by another process ({describe_error(exc)}, "
            f"waited {self.lock_timeout_s:g}s: DPONE_FENCE_LOCK_TIMEOUT)"
        )

    @property
    def stopping(self) -> bool:
        """True once interrupt() was called for the transaction in flight, or the run stops."""
        return self._stop or STOP.requested

    def settled(self) -> None:
        """The transaction ended: a later one may run again (unless the run stops)."""
        with self._state:
            self._stop = self._in_chunk = False

    def begin_immediate(self, conn: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE, waiting up to lock_timeout_s for the write lock in short tries,
        RUN_INTERRUPTED when a stop comes first (SQLite's busy wait would not notice it)."""
        with self._state:
            self._in_chunk = True
        deadline = time.monotonic() + self.lock_timeout_s
        conn.execute(f"PRAGMA busy_timeout = {_BUSY_STEP_MS}")
        try:
            while True:
                self.refuse_if_stopping("waiting for the SQLite write lock")
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    break
                except sqlite3.OperationalError as exc:
                    if not locked(exc) or time.monotonic() >= deadline:
                        raise
        except BaseException:
            self.settled()  # no transaction began: the caller does not roll back
            raise
        finally:
            conn.execute(f"PRAGMA busy_timeout = {round(self.lock_timeout_s * 1000)}")
        try:
            self.refuse_if_stopping("the SQLite write lock was granted after the stop")
        except DponeError:
            conn.execute("ROLLBACK")
            raise

    def refuse_if_stopping(self, doing: str) -> None:
        """RUN_INTERRUPTED when a stop was requested (the caller rolls back)."""
        if self.stopping:
            self.settled()
            raise DponeError(
                errors.RUN_INTERRUPTED,
                f"{self._label}: stopped while {doing}; nothing was written",
            )

    def interrupt(self) -> None:
        with self._state:
            self._stop = self._stop or self._in_chunk
        conn = self.current
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.interrupt()


class SqliteSource(sql_base.SqlSource[sqlite3.Connection]):
    """A table or trusted query in a SQLite file."""

    kind = "sqlite"
    dialect = SqliteDialect
    db: SqliteConnection

    def connection(self, dsn: str, label: str) -> SqliteConnection:
        return SqliteConnection(dsn, label)

    def probe_sql(self, select: str) -> str:
        return f"SELECT {select} FROM {self.relation()} LIMIT 0"

    def read_only(self) -> Self:
        self.db.discard()
        self.db.read_only = True
        return self

    def same_file(self, path: str) -> bool:
        return self.db.path == path

    def column_types(self) -> dict[str, ColumnType | None]:
        """A table's declared types (``PRAGMA table_info``) by SQLite's affinity rules; a
        query's result columns carry no declared type here: values of any kind (``any``)."""
        names = self.columns()
        if self.spec.table is None:
            return {name: sqlite_column_type("") for name in names}
        schema = "" if self.spec.table.schema is None else quote(self.spec.table.schema, "schema")
        pragma = f"PRAGMA {schema + '.' if schema else ''}table_info({quote(self.spec.table.name, 'table')})"
        try:
            declared = {
                str(row[1]).casefold(): str(row[2] or "") for row in self.db.get().execute(pragma)
            }
        except sqlite3.Error as exc:
            raise self._fail(exc, "describing the column types") from None
        return {name: sqlite_column_type(declared.get(name.casefold(), "")) for name in names}


class SqliteSink(sql_base.SqlSink[sqlite3.Connection]):
    """Writes chunks into one SQLite table; BEGIN IMMEDIATE holds the file's write lock, which is
    the per-chunk (and fence) lock here."""

    kind = "sqlite"
    dialect = SqliteDialect
    db: SqliteConnection

    def connection(self, dsn: str, label: str) -> SqliteConnection:
        return SqliteConnection(dsn, label)

    def _begin(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        self.db.begin_immediate(conn)
        return conn

    def _commit(self, conn: sqlite3.Connection, handle: object) -> None:
        """A stop requested while the chunk was written rolls it back instead (the caller)."""
        self.db.refuse_if_stopping("writing the chunk")
        conn.execute("COMMIT")
        self.db.settled()

    def _rollback(self, conn: sqlite3.Connection) -> None:
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        finally:
            self.db.settled()

    def _failure(self, exc: BaseException, what: str, attempt: int) -> DponeError:
        """The file's lock held by another process past the wait: CHUNK_BUSY (retryable)."""
        if locked(exc):
            return DponeError(errors.CHUNK_BUSY, self.db.locked_message(what, exc))
        error = super()._failure(exc, what, attempt)
        error.key_conflict = getattr(exc, "sqlite_errorcode", None) in _KEY_CONFLICT_CODES
        return error

    def _ensure_fence_table(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self._fence_table} (campaign TEXT NOT NULL, "
            "chunk_index INTEGER NOT NULL, attempt INTEGER NOT NULL, claimed_at TEXT, "
            "PRIMARY KEY (campaign, chunk_index))"
        )

    def preflight(self, window_column: str | None = None) -> list[str]:
        conn = self.db.get()
        schema = (
            "" if self.spec.table.schema is None else quote(self.spec.table.schema, "schema") + "."
        )
        name = quote(self.spec.table.name, "table")
        shown = self.spec.table.display()
        try:
            info = conn.execute(f"PRAGMA {schema}table_info({name})").fetchall()
            if not info:
                return [f"target table {shown} does not exist: every chunk will fail"]
            columns = {str(row[1]) for row in info}
            pk = [str(row[1]) for row in sorted(info, key=lambda r: int(r[5])) if int(row[5]) > 0]
            indexes: list[tuple[list[str], bool]] = [(pk, True)] if pk else []
            for row in conn.execute(f"PRAGMA {schema}index_list({name})").fetchall():
                index = quote(str(row[1]), "index")
                keys = conn.execute(f"PRAGMA {schema}index_info({index})").fetchall()
                names = [str(k[2] or "") for k in sorted(keys, key=lambda k: int(k[0]))]
                indexes.append((names, bool(row[2]) and not bool(row[4])))
        except sqlite3.Error as exc:
            raise self._preflight_failed(exc) from None
        return base.index_warnings(shown, self.spec, window_column, columns, indexes)

    def _claim_fence(self, conn: sqlite3.Connection, fence: base.ChunkFence) -> bool:
        """Raise the fence row inside the write transaction (BEGIN IMMEDIATE: no other writer);
        True when the row was there already."""
        table = self._fence_table
        key = (fence.campaign, fence.chunk_index)
        claimed_before = (
            conn.execute(
                f"SELECT 1 FROM {table} WHERE campaign = ? AND chunk_index = ?", key
            ).fetchone()
            is not None
        )
        conn.execute(
            f"INSERT INTO {table} (campaign, chunk_index, attempt, claimed_at) "
            "VALUES (?, ?, ?, datetime('now')) ON CONFLICT (campaign, chunk_index) DO UPDATE SET "
            "claimed_at = CASE WHEN excluded.attempt > attempt THEN excluded.claimed_at "
            "ELSE claimed_at END, attempt = max(attempt, excluded.attempt)",
            (*key, fence.attempt),
        )
        row = conn.execute(
            f"SELECT attempt FROM {table} WHERE campaign = ? AND chunk_index = ?", key
        ).fetchone()
        self._refuse_superseded(fence, int(row[0]) if row else fence.attempt)
        return claimed_before

    # paths --------------------------------------------------------------------------------------
    def _write(
        self,
        conn: sqlite3.Connection,
        source: base.Source,
        window: base.Scope,
        columns: tuple[str, ...],
    ) -> base.ChunkWrite:
        texts = self._float_to_text(conn, columns)
        if isinstance(source, SqliteSource) and source.same_file(self.db.path):
            select = source.select_sql(window, columns)
            for name in texts:  # the rows never leave SQLite: ask it whether a float is there
                probe = f"SELECT 1 FROM ({select}) WHERE typeof({quote(name, 'column')}) = 'real'"
                if conn.execute(probe + " LIMIT 1", SqliteDialect.params(window) or ()).fetchone():
                    raise self._floats_into_text(name, window)

            def fill_select(rel: str) -> int:
                insert = f"INSERT INTO {rel} ({_columns_sql(columns)}) {select}"
                if self.spec.inner_mode == "merge" and rel == self._table:
                    insert += " " + self._upsert(columns)
                return conn.execute(insert, SqliteDialect.params(window) or ()).rowcount

            return self._modes(conn, window, columns, fill_select, "insert-select")

        convert = None if isinstance(source, SqliteSource) else to_sqlite

        def fill_rows(rel: str) -> int:
            marks = ", ".join("?" for _ in columns)
            insert = f"INSERT INTO {rel} ({_columns_sql(columns)}) VALUES ({marks})"
            if self.spec.inner_mode == "merge" and rel == self._table:
                insert += " " + self._upsert(columns)
            count = 0
            with contextlib.closing(source.rows(window, self.options.batch_rows)) as batches:
                for batch in batches:
                    self.db.refuse_if_stopping("writing the chunk")
                    values = batch if convert is None else [tuple(map(convert, r)) for r in batch]
                    for name, i in texts.items():
                        if float in set(map(type, map(itemgetter(i), values))):
                            raise self._floats_into_text(name, window)
                    if convert is not None:  # a SQLite source holds no NaN: it stores NULL
                        self._refuse_nan(columns, values, window)
                    try:
                        conn.executemany(insert, values)
                    except OverflowError:
                        raise self._out_of_range(columns, values, window) from None
                    count += len(values)
            return count

        return self._modes(conn, window, columns, fill_rows, "executemany")

    def _float_to_text(self, conn: sqlite3.Connection, columns: tuple[str, ...]) -> dict[str, int]:
        """The moved columns (name: position) of TEXT affinity in the target, not accepted as
        narrowing: SQLite stores a float there as its text of 15 significant digits, which can
        drop digits (0.30000000000000004 is kept as '0.3') and hashes as the float's own 15
        digits do, so the read-back gate cannot see it. A typed float is refused before any
        lease (dpone.run.preflight); an untyped source column's values are looked at here."""
        schema = (
            "" if self.spec.table.schema is None else quote(self.spec.table.schema, "schema") + "."
        )
        name = quote(self.spec.table.name, "table")
        declared = {
            str(row[1]): str(row[2] or "").upper()
            for row in conn.execute(f"PRAGMA {schema}table_info({name})").fetchall()
        }
        accepted = set(self.options.accept_narrowing)
        return {
            column: i
            for i, column in enumerate(columns)
            if column not in accepted and _text_affinity(declared.get(column, ""))
        }

    def _refuse_nan(
        self, columns: tuple[str, ...], rows: Sequence[Sequence[object]], window: base.Scope
    ) -> None:
        """SQLite stores a float NaN as NULL, which only a row count would not see: a column
        that holds one fails the chunk (named, never the value), unless accepted as narrowing."""
        accepted = set(self.options.accept_narrowing)
        for i, name in enumerate(columns):
            values = list(map(itemgetter(i), rows))
            if name in accepted or float not in set(map(type, values)):
                continue
            if any(math.isnan(value) for value in values if type(value) is float):
                raise DponeError(
                    errors.SINK_FAILED,
                    f"{self.spec.display()}: writing {base.scope_display(window)} (rolled "
                    f"back): column {name!r}: the source sent a float NaN, which SQLite stores "
                    f"as NULL; store it as text, or list {name!r} in sink.accept_narrowing to "
                    "store NULL",
                )

    def _floats_into_text(self, name: str, window: base.Scope) -> DponeError:
        return DponeError(
            errors.SINK_FAILED,
            f"{self.spec.display()}: writing {base.scope_display(window)} (rolled back): column "
            f"{name!r}: the source sent binary floats for a column of TEXT affinity, where "
            "SQLite keeps their text of 15 significant digits (0.30000000000000004 becomes "
            "'0.3'), which the read-back checksum cannot tell from the float; declare the "
            f"column REAL, or list {name!r} in sink.accept_narrowing to store that text",
        )

    def _out_of_range(
        self, columns: tuple[str, ...], rows: Sequence[Sequence[object]], window: base.Scope
    ) -> DponeError:
        """An integer SQLite cannot bind (beyond its signed 64 bits: a MySQL BIGINT UNSIGNED
        above 2**63 - 1), named by its column, never by its value."""
        wide = sorted(
            {
                name
                for row in rows
                for name, value in zip(columns, row, strict=True)
                if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX
            }
        )
        where = f"column {wide[0]!r}" if wide else "a column"
        return DponeError(
            errors.SINK_FAILED,
            f"{self.spec.display()}: writing {base.scope_display(window)} (rolled back): "
            f"{where}: an integer beyond SQLite's signed 64-bit range, which SQLite cannot "
            "store as an integer; change the source query (CAST it to text) or the target",
        )

    # inner modes: merge without a checksum upserts straight into the target -------------------
    def _query(self, handle: sqlite3.Connection, query: str, params: Any) -> sqlite3.Cursor:
        return handle.execute(query, params or ())

    def _stages(self) -> bool:
        return self.options.checksum

    def _delete_sql(self, window: base.Scope) -> str:
        """BEGIN IMMEDIATE already keeps other writers out of the file until commit."""
        return f"DELETE FROM {self._table} AS dpone_src{SqliteDialect.where(window)}"

    def _create_stage(self, handle: sqlite3.Connection, columns: Sequence[str]) -> str:
        stage = quote(f"dpone_stage_{uuid.uuid4().hex[:16]}", "stage")
        handle.execute(
            f"CREATE TEMP TABLE {stage} AS SELECT {_columns_sql(columns)} FROM {self._table} "
            "WHERE 0"
        )
        return f"temp.{stage}"

    _stage_filter = " WHERE true"  # else ON CONFLICT would parse as a join constraint

    def _drop_stage(self, handle: sqlite3.Connection, stage: str, done: bool) -> None:
        handle.execute(f"DROP TABLE IF EXISTS {stage}")

    def _upsert(self, columns: Sequence[str]) -> str:
        sets = ", ".join(
            f"{quote(c, 'column')} = excluded.{quote(c, 'column')}" for c in self._updated(columns)
        )
        return f"ON CONFLICT ({_columns_sql(self.spec.keys)}) DO UPDATE SET {sets}"
