"""What every SQL connector shares, written once: the lazy driver connection (open on first use,
drop on loss, reopen on the next call), error translation with the driver's text redacted, the
source's describe/read/checksum loop, and the sink's chunk transaction (read-back gate, fence
claim, fault point, commit or rollback, retry hook).

A dialect module subclasses :class:`DriverConnection`, :class:`SqlSource` and :class:`SqlSink` and
fills in only what differs: quoting, the SQL text, the bulk-load path, value conversion and driver
quirks. See docs/contributing/connectors.md.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Sequence
from typing import Any, Generic, TypeVar

from dpone import errors
from dpone.connectors import base
from dpone.errors import DponeError
from dpone.lifecycle.faults import fault_point

C = TypeVar("C")
#: Rows a checksum reads per fetch.
CHECKSUM_BATCH = 10_000


def zoneless_utc(value: object) -> object:
    """A value from another database for a driver that binds datetimes without a zone (the column
    holds UTC): an aware datetime as naive UTC, a bytearray or memoryview as bytes."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def driver_failure(
    exc: BaseException,
    code: str,
    what: str,
    *,
    driver_error: type[BaseException],
    describe: Callable[[Any], str],
    lost: Callable[[Any], str | None],
) -> DponeError:
    """``exc`` as a DponeError with a secret-free message: a DponeError as it is; a driver error
    by ``describe`` (never the driver's raw text, which can carry row values or the DSN), or as
    CONNECTION_FAILED when ``lost`` names a connection loss; anything else by its class name."""
    if isinstance(exc, DponeError):
        return exc
    if isinstance(exc, driver_error):
        loss = lost(exc)
        if loss is not None:
            return DponeError(errors.CONNECTION_FAILED, f"{what}: {loss}")
        return DponeError(code, f"{what} failed: {describe(exc)}")
    return DponeError(code, f"{what} failed: {type(exc).__name__}")


def busy_fence(shown: str, fence: base.ChunkFence, seconds: str) -> DponeError:
    """CHUNK_BUSY: another transaction held the chunk's fence row past the lock wait."""
    return DponeError(
        errors.CHUNK_BUSY,
        f"{shown}: chunk {fence.chunk_index}: another transaction holds the chunk's fence row "
        f"past {seconds}s (DPONE_FENCE_LOCK_TIMEOUT); nothing was written",
    )


class DriverConnection(ABC, Generic[C]):
    """One DB-API connection, opened on first :meth:`get`, dropped by :meth:`discard` (and after
    a connection loss), reopened by the next :meth:`get`. Not thread-safe but for
    :meth:`interrupt`."""

    def __init__(self, label: str) -> None:
        self._label = label
        self.current: C | None = None

    def get(self) -> C:
        """The open connection (opened now when there is none)."""
        if self.current is None:
            self.current = self.open()
        return self.current

    def unreachable(self, reason: str) -> DponeError:
        """CONNECTION_FAILED for a failed connect, with ``reason`` (coarse, secret-free)."""
        return DponeError(
            errors.CONNECTION_FAILED,
            f"{self._label}: could not connect to the database ({reason})",
        )

    @abstractmethod
    def open(self) -> C:
        """A new connection with dpone's session settings; DponeError(CONNECTION_FAILED) with a
        coarse, secret-free reason when it cannot be opened."""

    @property
    @abstractmethod
    def driver_error(self) -> type[BaseException]:
        """The driver's base exception class."""

    @abstractmethod
    def describe(self, exc: Any) -> str:
        """A driver error as error class, codes and object names: never a row value or DSN."""

    def connection_lost(self, exc: Any) -> bool:
        """True when the driver error ``exc`` means the connection is gone."""
        return False

    def lost(self, exc: Any) -> str | None:
        """The message tail when ``exc`` means the connection is gone (None: it is not)."""
        if not self.connection_lost(exc):
            return None
        return f"lost the connection to the database ({self.describe(exc)})"

    def after_loss(self) -> None:
        """What a connection loss does to the held connection (default: drop it)."""
        self.discard()

    def translate(self, exc: BaseException, code: str, what: str) -> DponeError:
        """``exc`` as DponeError(``code``) (see :func:`driver_failure`); a lost connection is
        dropped so the next call reconnects."""
        err = driver_failure(
            exc,
            code,
            what,
            driver_error=self.driver_error,
            describe=self.describe,
            lost=self.lost,
        )
        if err is not exc and err.code == errors.CONNECTION_FAILED:
            self.after_loss()
        return err

    def discard(self) -> None:
        """Close and forget the connection (idempotent, never raises)."""
        conn, self.current = self.current, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()  # type: ignore[attr-defined]  # any DB-API connection

    def interrupt(self) -> None:
        """Cancel the statement in flight from another thread (thread-safe; no-op when idle)."""


class SqlDialect:
    """Quoting and the chunk predicate: the SQL text a dialect's source and sink share. A dialect
    sets the class attributes (and overrides :meth:`bound` when its driver binds typed values)."""

    #: The source relation's alias, quoted.
    alias: str = "dpone_src"
    #: The parameter marker the driver formats.
    marker: str = "?"
    #: The word for a table's qualifier in this database's messages.
    schema_word: str = "schema"
    #: The identifier quotes; the closing one is doubled inside a name.
    opening: str = '"'
    closing: str = '"'
    #: The longest identifier the database keeps, in characters.
    max_chars: int = 128
    #: The parameters of a statement without a window.
    no_params: tuple[object, ...] | None = ()

    @classmethod
    def quote(cls, name: str, what: str) -> str:
        """``name`` as a quoted identifier; DponeError(IDENTIFIER_INVALID) when it cannot be."""
        base.check_identifier(name, what, max_chars=cls.max_chars)
        return cls.opening + name.replace(cls.closing, cls.closing * 2) + cls.closing

    @staticmethod
    def bound(window: base.ChunkWindow, value: base.Bound) -> object:
        """A window bound as the driver binds it (timestamps as SQL text by default)."""
        return base.sql_text_bound(window, value)

    @classmethod
    def params(cls, window: base.Scope) -> tuple[object, ...] | None:
        """The window's bounds as the statement parameters of :meth:`where`."""
        if window is None:
            return cls.no_params
        return (cls.bound(window, window.lower), cls.bound(window, window.upper))

    @classmethod
    def table_sql(cls, table: base.TableRef) -> str:
        name = cls.quote(table.name, "table")
        return (
            name if table.schema is None else f"{cls.quote(table.schema, cls.schema_word)}.{name}"
        )

    @classmethod
    def columns_sql(cls, columns: Sequence[str], prefix: str = "") -> str:
        return ", ".join(prefix + cls.quote(c, "column") for c in columns)

    @classmethod
    def where(cls, window: base.Scope) -> str:
        """`` WHERE <chunk predicate>`` on the source alias; nothing without a window."""
        if window is None:
            return ""
        col = f"{cls.alias}." + cls.quote(window.column, "chunk column")
        return f" WHERE {col} >= {cls.marker} AND {col} < {cls.marker}"


class SqlSource(base.Source, Generic[C]):
    """A table or trusted query read through a :class:`DriverConnection` in autocommit
    statements; the checksum is computed in Python over the rows read (:class:`RowChecksum`)."""

    dialect: type[SqlDialect]

    def __init__(self, spec: base.SourceSpec, dsn: str) -> None:
        super().__init__(spec, dsn)
        if spec.table is not None:
            self.dialect.table_sql(spec.table)
        for col in spec.columns or ():
            self.dialect.quote(col, "source column")
        self.db: DriverConnection[C] = self.connection(dsn, spec.display())
        self._columns: tuple[str, ...] | None = None
        #: each described column's driver type code (cursor.description), set with _columns
        self.type_codes: dict[str, Any] = {}

    @abstractmethod
    def connection(self, dsn: str, label: str) -> DriverConnection[C]:
        """The (not yet opened) connection this source reads on."""

    @abstractmethod
    def probe_sql(self, select: str) -> str:
        """A statement returning no row whose description names the ``select`` list's columns."""

    def relation(self) -> str:
        """The FROM item, aliased."""
        alias = self.dialect.alias
        if self.spec.table is not None:
            return f"{self.dialect.table_sql(self.spec.table)} AS {alias}"
        return f"({base.strip_query(self.spec.query or '')}) AS {alias}"

    def select_list(self) -> str:
        """The spec's columns, or every column of the relation."""
        if self.spec.columns:
            return self.dialect.columns_sql(self.spec.columns)
        return f"{self.dialect.alias}.*"

    def columns(self) -> tuple[str, ...]:
        if self._columns is None:
            try:
                cur = self.cursor(self.db.get())
                try:
                    self.execute(cur, self.probe_sql(self.select_list()), None)
                    names = tuple(str(d[0]) for d in cur.description or ())
                    self.type_codes = {str(d[0]): d[1] for d in cur.description or ()}
                finally:
                    cur.close()
            except Exception as exc:
                raise self._fail(exc, "describing the columns") from None
            for name in names:
                self.dialect.quote(name, f"{self.spec.display()} column")
            base.check_unique(names, f"{self.spec.display()} columns")
            self._columns = names
        return self._columns

    def select_sql(self, window: base.Scope, columns: Sequence[str]) -> str:
        """SELECT of the chunk (every row without a window), to run with ``params(window)``."""
        cols = self.dialect.columns_sql(columns)
        return f"SELECT {cols} FROM {self.relation()}{self.dialect.where(window)}"

    def cursor(self, conn: C) -> Any:
        """A cursor for reading (a dialect may stream: a server-side cursor)."""
        return conn.cursor()  # type: ignore[attr-defined]  # any DB-API connection

    def execute(self, cur: Any, query: str, params: Any) -> None:
        """Run ``query`` with ``params`` (None: no parameters) as the driver takes them."""
        if params is None:
            cur.execute(query)
        else:
            cur.execute(query, params)

    def batch(self, fetched: Sequence[Any]) -> list[base.Row]:
        """A fetched batch as rows."""
        return list(fetched)

    def rows(self, window: base.Scope, batch_rows: int) -> Generator[list[base.Row], None, None]:
        query = self.select_sql(window, self.columns())
        conn = self.db.get()
        try:
            cur = self.cursor(conn)
            try:
                self.execute(cur, query, self.dialect.params(window))
                while fetched := cur.fetchmany(batch_rows):
                    yield self.batch(fetched)
            finally:
                cur.close()
        except Exception as exc:
            raise self._fail(exc, f"reading {base.scope_display(window)}") from None

    def checksum(self, window: base.Scope) -> str:
        total = base.RowChecksum(self.columns())
        for batch in self.rows(window, CHECKSUM_BATCH):
            total.add_many(batch)
        return total.value()

    def _fail(self, exc: BaseException, doing: str) -> DponeError:
        self._columns = None
        return self.db.translate(exc, self.spec.failure_code, f"{self.spec.display()}: {doing}")

    def interrupt(self) -> None:
        self.db.interrupt()

    def close(self) -> None:
        self.db.discard()


class SqlSink(base.Sink, Generic[C]):
    """Writes one chunk per transaction on a :class:`DriverConnection`.

    :meth:`_transfer` is written once: the read-back gate is entered, the transaction begun, the
    chunk's fence row claimed (when fenced), the rows written by the dialect's :meth:`_write`,
    the gate checked, the ``sink_written`` fault point passed, then commit; any failure rolls
    back and is translated (or retried, when :meth:`_retry` says so).
    """

    dialect: type[SqlDialect]

    def __init__(self, spec: base.SinkSpec, dsn: str, options: base.SinkOptions) -> None:
        super().__init__(spec, dsn, options)
        self._table = self.dialect.table_sql(spec.table)
        for key in spec.keys:
            self.dialect.quote(key, "merge key")
        self._fence_table = self.dialect.table_sql(
            base.TableRef(spec.table.schema, base.FENCE_TABLE)
        )
        self._fence_ready = False
        self.db: DriverConnection[C] = self.connection(dsn, spec.display())

    @abstractmethod
    def connection(self, dsn: str, label: str) -> DriverConnection[C]:
        """The (not yet opened) connection this sink writes on."""

    # the transaction ----------------------------------------------------------------------------
    @abstractmethod
    def _begin(self, conn: C) -> Any:
        """Start the chunk's transaction; returns what :meth:`_write` and the fence use."""

    @abstractmethod
    def _commit(self, conn: C, handle: Any) -> None:
        """Commit the chunk's transaction."""

    def _rollback(self, conn: C) -> None:
        """Roll the chunk's transaction back (never raises)."""
        with contextlib.suppress(Exception):
            conn.rollback()  # type: ignore[attr-defined]  # any DB-API connection

    def _ensure_fence_table(self, conn: C) -> None:
        """Create the fence table when missing (once per sink), outside the chunk's transaction."""

    @abstractmethod
    def _claim_fence(self, handle: Any, fence: base.ChunkFence) -> bool:
        """Claim the chunk's fence row inside the transaction (held to commit); raise
        ``fence.superseded`` when a newer attempt holds it, :func:`busy_fence` past the wait.
        True when the row was there already: an earlier attempt's writes committed."""

    @abstractmethod
    def _write(
        self, handle: Any, source: base.Source, window: base.Scope, columns: tuple[str, ...]
    ) -> base.ChunkWrite:
        """Write the chunk's rows in the inner mode and read back the sink's checksum."""

    # the inner modes ---------------------------------------------------------------------------
    @abstractmethod
    def _query(self, handle: Any, query: str, params: Any) -> Any:
        """Run ``query`` with ``params`` (None: none) in the chunk's transaction; the cursor."""

    @abstractmethod
    def _delete_sql(self, window: base.Scope) -> str:
        """DELETE of the target's rows in ``window`` (None: every row), on the source alias, to
        run with ``dialect.params(window)``."""

    @abstractmethod
    def _create_stage(self, handle: Any, columns: Sequence[str]) -> str:
        """Create an empty session-private stage shaped like the target's ``columns``; its name."""

    #: appended to the stage's SELECT (SQLite needs a WHERE before ON CONFLICT)
    _stage_filter = ""

    def _read_list(self, handle: Any, columns: Sequence[str], prefix: str = "") -> str:
        """The SELECT list that reads ``columns`` of the target (or its stage) back as values
        (a dialect whose driver would round a type overrides it)."""
        return self.dialect.columns_sql(columns, prefix)

    def _upsert(self, columns: Sequence[str]) -> str:
        """The clause making an INSERT of ``columns`` update the row a merge key already holds
        (a dialect whose merge is not an INSERT clause overrides :meth:`_from_stage_sql`)."""
        raise NotImplementedError

    def _updated(self, columns: Sequence[str]) -> list[str]:
        """The columns a merge updates: every non-key one (the first key when there is none)."""
        keys = self.spec.keys
        return [c for c in columns if c not in keys] or [keys[0]]

    def _from_stage_sql(self, stage: str, columns: Sequence[str]) -> str:
        """The statement moving the stage into the target (merge: upsert on the keys)."""
        cols = self.dialect.columns_sql(columns)
        insert = f"INSERT INTO {self._table} ({cols}) SELECT {cols} FROM {stage}"
        insert += self._stage_filter
        if self.spec.inner_mode == "merge":
            insert += " " + self._upsert(columns)
        return insert

    @abstractmethod
    def _drop_stage(self, handle: Any, stage: str, done: bool) -> None:
        """Drop the stage (``done`` False: the write failed and will be rolled back)."""

    def _moved_rows(self, cur: Any, filled: int) -> int:
        """The rows the stage moved into the target (``filled``: the rows put into the stage)."""
        return int(cur.rowcount)

    def _stages(self) -> bool:
        """True when the inner mode writes through a stage (merge, or a checksummed append)."""
        return self.spec.inner_mode == "merge" or self.options.checksum

    def _checksum(self, handle: Any, columns: Sequence[str], query: str, params: Any) -> str:
        return read_checksum(self._query(handle, query, params), columns)

    def _modes(
        self,
        handle: Any,
        window: base.Scope,
        columns: tuple[str, ...],
        fill: Callable[[str], int],
        method: str,
    ) -> base.ChunkWrite:
        """The inner mode around a ``fill(relation)`` that writes the chunk's rows into a
        relation and returns their count; with ``options.checksum`` the sink's side of the
        read-back: replace/full_refresh the target's rows in the range (full_refresh: every row),
        merge the target's rows whose keys the stage carries, append the rows the range holds
        now beyond those it held before the append."""
        mode = self.spec.inner_mode
        hashed = self._hashed(columns)
        if mode in ("replace", "full_refresh"):
            replaced = window if mode == "replace" else None  # None: every row of the target
            self._query(handle, self._delete_sql(replaced), self.dialect.params(replaced))
            rows = fill(self._table)
            if not self.options.checksum:
                return base.ChunkWrite(rows, None, method)
            where = self.dialect.where(replaced)
            listed = self._read_list(handle, hashed)
            read = f"SELECT {listed} FROM {self._table} AS {self.dialect.alias}{where}"
            target = self._checksum(handle, hashed, read, self.dialect.params(replaced))
            return base.ChunkWrite(rows, target, method)
        if not self._stages():
            return base.ChunkWrite(fill(self._table), None, method)
        before = None
        if self.options.checksum and mode == "append":  # the range as it was: see below
            in_range = (
                f"SELECT {self._read_list(handle, hashed)} FROM {self._table} AS {self.dialect.alias}"
                f"{self.dialect.where(window)}"
            )
            before = self._checksum(handle, hashed, in_range, self.dialect.params(window))
        stage = self._create_stage(handle, columns)
        done = False
        try:
            filled = fill(stage)
            moved = self._query(handle, self._from_stage_sql(stage, columns), None)
            rows = self._moved_rows(moved, filled)
            checksum = None
            if before is not None:
                # the rows the append added as the target holds them (after its defaults and
                # triggers; the stage would not show them): the range now less the range before
                after = self._checksum(handle, hashed, in_range, self.dialect.params(window))
                checksum = base.checksum_added(after, before)
            elif self.options.checksum:
                read = f"SELECT {self._read_list(handle, hashed)} FROM {stage}"
                if mode == "merge":  # the target's rows whose keys the stage carries
                    t, s = self.dialect.quote("t", "alias"), self.dialect.quote("s", "alias")
                    on = " AND ".join(
                        f"{s}.{self.dialect.quote(k, 'key')} = {t}.{self.dialect.quote(k, 'key')}"
                        for k in self.spec.keys
                    )
                    read = (
                        f"SELECT {self._read_list(handle, hashed, t + '.')} FROM {self._table} AS {t} "
                        f"WHERE EXISTS (SELECT 1 FROM {stage} AS {s} WHERE {on})"
                    )
                checksum = self._checksum(handle, hashed, read, None)
            done = True
        finally:
            self._drop_stage(handle, stage, done)
        return base.ChunkWrite(rows, checksum, method)

    # the transaction's outcome ------------------------------------------------------------------
    def _retry(self, exc: BaseException, attempt: int) -> bool:
        """True to run the whole transaction again after ``exc`` (e.g. a deadlock)."""
        return False

    def _failure(self, exc: BaseException, what: str, attempt: int) -> DponeError:
        """The DponeError a failed transaction raises."""
        return self.db.translate(exc, errors.SINK_FAILED, what)

    def _refuse_superseded(self, fence: base.ChunkFence, stored: int) -> None:
        if stored > fence.attempt:
            raise fence.superseded(self.spec.display(), stored)

    def _attempt(
        self,
        source: base.Source,
        window: base.Scope,
        columns: tuple[str, ...],
        fence: base.ChunkFence | None,
    ) -> base.ChunkWrite:
        conn = self.db.get()
        if fence is not None and not self._fence_ready:
            self._ensure_fence_table(conn)
            self._fence_ready = True
        with self._read_back(source, window) as gate:
            handle = self._begin(conn)
            try:
                if fence is not None:
                    claimed_before = self._claim_fence(handle, fence)
                    fence.refuse_repeated_append(
                        self.spec.display(), self.spec.inner_mode, claimed_before
                    )
                result = gate.check(self._write(handle, source, window, columns))
                if fence is not None:
                    fault_point("sink_written")
                self._commit(conn, handle)
            except BaseException:
                self._rollback(conn)
                raise
        return result

    def _transfer(
        self,
        source: base.Source,
        window: base.Scope,
        connection: object | None,
        fence: base.ChunkFence | None,
        isolated: bool = True,
    ) -> base.ChunkWrite:
        self._no_external_connection(connection)
        columns = self._moved_columns(source, window)
        what = f"{self.spec.display()}: writing {base.scope_display(window)} (rolled back)"
        attempt = 1
        while True:
            try:
                return self._attempt(source, window, columns, fence)
            except Exception as exc:
                if self._retry(exc, attempt):
                    attempt += 1
                    continue
                raise self._failure(exc, what, attempt) from None

    def _preflight_failed(self, exc: BaseException) -> DponeError:
        return self.db.translate(exc, errors.SINK_FAILED, f"{self.spec.display()}: preflight")

    def interrupt(self) -> None:
        self.db.interrupt()

    def close(self) -> None:
        self._close_read_back()
        self.db.discard()


def read_checksum(cur: Any, columns: Sequence[str]) -> str:
    """The :class:`RowChecksum` of the rows an executed cursor returns, read in batches."""
    check = base.RowChecksum(columns)
    while batch := cur.fetchmany(CHECKSUM_BATCH):
        check.add_many(batch)
    return check.value()
