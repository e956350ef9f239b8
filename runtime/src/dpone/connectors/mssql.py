"""MSSQL source and sink over pyodbc (UNVERIFIED against a live server: see docs/connectors.md).

The adapter is held to the same contract as the others through a recording DB-API double whose
statements are parsed as T-SQL in the tests. Rows are written with ``fast_executemany``; merge
stages the chunk in a ``#temp`` table and runs one ``MERGE .. WITH (HOLDLOCK)``. The checksum is
computed in Python over rows read back inside the chunk's transaction (T-SQL cannot hash UTF-8 text
portably before SQL Server 2019).

pyodbc is imported only when a connection is opened, so the module (and its tests) load without
unixODBC installed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import struct
import uuid
from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

from dpone import errors
from dpone.connectors.base import (
    FENCE_TABLE,
    ChunkFence,
    ChunkWindow,
    ChunkWrite,
    Row,
    RowChecksum,
    Sink,
    SinkOptions,
    SinkSpec,
    Source,
    SourceSpec,
    TableRef,
    check_identifier,
    check_unique,
    index_warnings,
    scope_display,
    strip_query,
)
from dpone.connectors.column_types import ColumnType
from dpone.connectors.dialect_types import mssql_column_type
from dpone.errors import DponeError
from dpone.faults import fault_point
from dpone.session_limits import session_limits

MAX_IDENTIFIER_CHARS = 128  # sysname
DEFAULT_DRIVER = "ODBC Driver 18 for SQL Server"
SQL_SS_TIMESTAMPOFFSET = -155
SQL_GUID = -11
_TIMESTAMP_BOUND = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
_NATIVE_ERROR = re.compile(r"\((\d+)\)\s*\(SQL\w+\)")
_NAMED = (
    ("constraint", re.compile(r"constraint '([^']+)'")),
    ("object", re.compile(r"(?:object|table) (?:name )?'([^']+)'")),
    ("column", re.compile(r"column name '([^']+)'")),
)


class Driver(Protocol):
    """The slice of the pyodbc module dpone uses (the tests pass a recording double)."""

    Error: type[Exception]

    def connect(self, connection_string: str, *, autocommit: bool) -> Any: ...


def load_driver() -> Driver:
    try:
        import pyodbc
    except ImportError:
        raise DponeError(
            errors.DRIVER_MISSING,
            "MSSQL needs pyodbc and unixODBC's libodbc: install dpone-runtime[mssql] and an SQL "
            "Server ODBC driver",
        ) from None
    driver: Driver = pyodbc
    return driver


# --- identifiers, DSNs, values --------------------------------------------------------------------
def quote(name: str, what: str) -> str:
    """[bracketed] with ] doubled."""
    check_identifier(name, what, max_chars=MAX_IDENTIFIER_CHARS)
    return "[" + name.replace("]", "]]") + "]"


def table_sql(table: TableRef) -> str:
    name = quote(table.name, "table")
    return name if table.schema is None else f"{quote(table.schema, 'schema')}.{name}"


def _columns_sql(columns: Sequence[str], prefix: str = "") -> str:
    return ", ".join(prefix + quote(c, "column") for c in columns)


def _where(window: ChunkWindow | None) -> str:
    """`` WHERE <chunk predicate>`` on the ``[dpone_src]`` alias; nothing without a window."""
    if window is None:
        return ""
    col = "[dpone_src]." + quote(window.column, "chunk column")
    return f" WHERE {col} >= ? AND {col} < ?"


def _odbc_value(value: str) -> str:
    return "{" + value.replace("}", "}}") + "}" if re.search(r"[;{}=\s]", value) else value


def odbc_connection_string(dsn: str) -> str:
    """``odbc://<ODBC connection string>`` verbatim, or ``mssql://user:pw@host:port/db?k=v``."""
    scheme, _, rest = dsn.partition("://")
    if scheme.lower() == "odbc":
        return rest
    parts = urlsplit(dsn)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    driver = options.pop("driver", DEFAULT_DRIVER)
    server = parts.hostname or "localhost"
    if parts.port:
        server += f",{parts.port}"
    fields = [("DRIVER", "{" + driver.replace("}", "}}") + "}"), ("SERVER", server)]
    database = unquote(parts.path.lstrip("/"))
    if database:
        fields.append(("DATABASE", _odbc_value(database)))
    if parts.username:
        fields.append(("UID", _odbc_value(unquote(parts.username))))
    if parts.password is not None:
        fields.append(("PWD", "{" + unquote(parts.password).replace("}", "}}") + "}"))
    fields.extend((key, _odbc_value(value)) for key, value in options.items())
    return ";".join(f"{key}={value}" for key, value in fields)


def mssql_bound(window: ChunkWindow, value: object) -> object:
    """Typed bounds for the ODBC binder; anything unparsable is sent as the string it is."""
    if isinstance(value, str):
        try:
            if window.type == "date":
                return dt.date.fromisoformat(value)
            if window.type == "timestamp" and _TIMESTAMP_BOUND.match(value):
                return dt.datetime.fromisoformat(value[:-1])
        except ValueError:
            return value
    return value


def _params(window: ChunkWindow | None) -> tuple[object, ...]:
    if window is None:
        return ()
    return (mssql_bound(window, window.lower), mssql_bound(window, window.upper))


def to_mssql(value: object) -> object:
    """A value from another database as the ODBC binder takes it (datetime2 is zone-less UTC)."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def _datetimeoffset(raw: bytes) -> dt.datetime:
    """SQL_SS_TIMESTAMPOFFSET_STRUCT -> aware datetime (pyodbc has no converter of its own)."""
    year, month, day, hour, minute, second, nanos, tz_hour, tz_minute = struct.unpack("<6hI2h", raw)
    zone = dt.timezone(dt.timedelta(hours=tz_hour, minutes=tz_minute))
    return dt.datetime(year, month, day, hour, minute, second, nanos // 1000, tzinfo=zone)


def _guid(raw: bytes) -> uuid.UUID:
    return uuid.UUID(bytes_le=raw)


# --- errors ---------------------------------------------------------------------------------------
def describe_error(exc: BaseException) -> str:
    """SQLSTATE, native error number and object/constraint names; never the driver's sentence."""
    args = exc.args
    state = args[0] if args and isinstance(args[0], str) else None
    message = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
    parts = [type(exc).__name__ + (f" (SQLSTATE {state})" if state else "")]
    native = _NATIVE_ERROR.findall(message)
    if native:
        parts.append(f"error {native[-1]}")
    for label, pattern in _NAMED:
        found = pattern.search(message)
        if found:
            parts.append(f"{label} '{found.group(1)}'")
    return ", ".join(parts)


def _is_connection_loss(exc: BaseException) -> bool:
    args = exc.args
    state = args[0] if args and isinstance(args[0], str) else ""
    return state.startswith("08")


class MssqlConnection:
    """A lazily opened pyodbc connection with XACT_ABORT and value converters set."""

    def __init__(self, dsn: str, label: str, driver: Driver | None, autocommit: bool) -> None:
        self._dsn = dsn
        self._label = label
        self._driver = driver
        self._autocommit = autocommit
        self.current: Any = None

    @property
    def driver_given(self) -> Driver | None:
        """The driver passed in (None: pyodbc, imported on first use)."""
        return self._driver

    @property
    def driver(self) -> Driver:
        if self._driver is None:
            self._driver = load_driver()
        return self._driver

    def get(self) -> Any:
        if self.current is None:
            driver = self.driver
            try:
                conn = driver.connect(
                    odbc_connection_string(self._dsn), autocommit=self._autocommit
                )
                conn.add_output_converter(SQL_SS_TIMESTAMPOFFSET, _datetimeoffset)
                conn.add_output_converter(SQL_GUID, _guid)
                conn.execute("SET XACT_ABORT ON")
            except driver.Error as exc:
                state = exc.args[0] if exc.args else "?"
                raise DponeError(
                    errors.CONNECTION_FAILED,
                    f"{self._label}: could not connect to the database (SQLSTATE {state})",
                ) from None
            self.current = conn
        return self.current

    def translate(self, exc: BaseException, code: str, what: str) -> DponeError:
        if isinstance(exc, DponeError):
            return exc
        if isinstance(exc, self.driver.Error):
            if _is_connection_loss(exc):
                self.discard()
                return DponeError(
                    errors.CONNECTION_FAILED,
                    f"{what}: lost the connection to the database ({describe_error(exc)})",
                )
            return DponeError(code, f"{what} failed: {describe_error(exc)}")
        return DponeError(code, f"{what} failed: {type(exc).__name__}")

    def discard(self) -> None:
        conn, self.current = self.current, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


# --- source ---------------------------------------------------------------------------------------
class MssqlSource(Source):
    """A table or trusted query in SQL Server, read in autocommit statements."""

    kind = "mssql"

    def __init__(self, spec: SourceSpec, dsn: str, driver: Driver | None = None) -> None:
        super().__init__(spec, dsn)
        if spec.table is not None:
            table_sql(spec.table)
        for col in spec.columns or ():
            quote(col, "source column")
        self.db = MssqlConnection(dsn, spec.display(), driver, autocommit=True)
        self._columns: tuple[str, ...] | None = None

    def relation(self) -> str:
        if self.spec.table is not None:
            return table_sql(self.spec.table) + " AS [dpone_src]"
        return f"({strip_query(self.spec.query or '')}) AS [dpone_src]"

    def columns(self) -> tuple[str, ...]:
        if self._columns is None:
            select = _columns_sql(self.spec.columns) if self.spec.columns else "[dpone_src].*"
            conn = self.db.get()
            try:
                cur = conn.cursor()
                cur.execute(f"SELECT TOP 0 {select} FROM {self.relation()}")
                names = tuple(str(d[0]) for d in cur.description or ())
                cur.close()
            except Exception as exc:
                raise self._fail(exc, "describing the columns") from None
            for name in names:
                quote(name, f"{self.spec.display()} column")
            check_unique(names, f"{self.spec.display()} columns")
            self._columns = names
        return self._columns

    def select_sql(self, window: ChunkWindow | None, columns: Sequence[str]) -> str:
        """SELECT of the chunk (every row without a window), to run with ``_params(window)``."""
        return f"SELECT {_columns_sql(columns)} FROM {self.relation()}{_where(window)}"

    def rows(self, window: ChunkWindow | None, batch_rows: int) -> Generator[list[Row], None, None]:
        query = self.select_sql(window, self.columns())
        conn = self.db.get()
        try:
            cur = conn.cursor()
            try:
                cur.execute(query, *_params(window))
                while batch := cur.fetchmany(batch_rows):
                    yield [tuple(row) for row in batch]
            finally:
                cur.close()
        except Exception as exc:
            raise self._fail(exc, f"reading {scope_display(window)}") from None

    def checksum(self, window: ChunkWindow | None) -> str:
        total = RowChecksum(self.columns())
        for batch in self.rows(window, 10_000):
            total.add_many(batch)
        return total.value()

    def _fail(self, exc: BaseException, doing: str) -> DponeError:
        self._columns = None
        return self.db.translate(exc, self.spec.failure_code, f"{self.spec.display()}: {doing}")

    def sibling(self, columns: tuple[str, ...] | None = None) -> MssqlSource:
        return MssqlSource(self._spec_of(columns), self._dsn, self.db.driver_given)

    def close(self) -> None:
        self.db.discard()

    def column_types(self) -> dict[str, ColumnType | None]:
        """The moved columns' types as the server describes the SELECT's first result set
        (``system_type_name``): tables and queries alike. UNVERIFIED (docs/connectors.md)."""
        select = _columns_sql(self.spec.columns) if self.spec.columns else "[dpone_src].*"
        conn = self.db.get()
        try:
            cur = conn.cursor()
            cur.execute(
                "SELECT name, system_type_name FROM sys.dm_exec_describe_first_result_set"
                "(?, NULL, 0) ORDER BY column_ordinal",
                f"SELECT TOP 0 {select} FROM {self.relation()}",
            )
            described = [(str(name), str(kind)) for name, kind in cur.fetchall()]
            cur.close()
        except Exception as exc:
            raise self._fail(exc, "describing the column types") from None
        return {name: mssql_column_type(kind) for name, kind in described}


# --- sink -----------------------------------------------------------------------------------------
class MssqlSink(Sink):
    """Writes chunks into one SQL Server table, one explicit transaction per chunk."""

    kind = "mssql"

    def __init__(
        self, spec: SinkSpec, dsn: str, options: SinkOptions, driver: Driver | None = None
    ) -> None:
        super().__init__(spec, dsn, options)
        self._table = table_sql(spec.table)
        for key in spec.keys:
            quote(key, "merge key")
        self.db = MssqlConnection(dsn, spec.display(), driver, autocommit=False)
        self._fence_ready = False

    def _transfer(
        self,
        source: Source,
        window: ChunkWindow | None,
        connection: object | None,
        fence: ChunkFence | None,
        isolated: bool = True,
    ) -> ChunkWrite:
        self._no_external_connection(connection)
        columns = self._moved_columns(source, window)
        conn = self.db.get()
        try:
            try:
                cur = conn.cursor()
                cur.fast_executemany = True
                with self._read_back(source, window) as gate:
                    if fence is not None:
                        self._claim_fence(conn, cur, fence)
                    result = gate.check(self._write(cur, source, window, columns))
                if fence is not None:
                    fault_point("sink_written")
                cur.close()
                conn.commit()
            except BaseException:
                with contextlib.suppress(Exception):
                    conn.rollback()
                raise
            return result
        except Exception as exc:
            what = f"{self.spec.display()}: writing {scope_display(window)} (rolled back)"
            raise self.db.translate(exc, errors.SINK_FAILED, what) from None

    def preflight(self, window_column: str | None = None) -> list[str]:
        conn = self.db.get()
        shown = self.spec.table.display()
        try:
            cur = conn.cursor()
            cur.execute("SELECT name FROM sys.columns WHERE object_id = OBJECT_ID(?)", self._table)
            columns = {str(row[0]) for row in cur.fetchall()}
            if not columns:
                conn.rollback()
                return [f"target table {shown} does not exist: every chunk will fail"]
            cur.execute(
                "SELECT i.index_id, i.is_unique, c.name FROM sys.indexes AS i"
                " JOIN sys.index_columns AS ic"
                " ON ic.object_id = i.object_id AND ic.index_id = i.index_id"
                " JOIN sys.columns AS c"
                " ON c.object_id = ic.object_id AND c.column_id = ic.column_id"
                " WHERE i.object_id = OBJECT_ID(?) AND ic.is_included_column = 0"
                " AND i.has_filter = 0 ORDER BY i.index_id, ic.key_ordinal",
                self._table,
            )
            grouped: dict[int, tuple[list[str], bool]] = {}
            for index_id, unique, name in cur.fetchall():
                grouped.setdefault(int(index_id), ([], bool(unique)))[0].append(str(name))
            cur.close()
            conn.rollback()
        except Exception as exc:
            raise self.db.translate(
                exc, errors.SINK_FAILED, f"{self.spec.display()}: preflight"
            ) from None
        return index_warnings(shown, self.spec, window_column, columns, list(grouped.values()))

    def close(self) -> None:
        self._close_read_back()
        self.db.discard()

    # fence --------------------------------------------------------------------------------------
    def _fence_table(self) -> str:
        table = quote(FENCE_TABLE, "fence table")
        schema = self.spec.table.schema
        return table if schema is None else f"{quote(schema, 'schema')}.{table}"

    def _ensure_fence_table(self, conn: Any, cur: Any) -> None:
        """Create the fence table once per sink, in its own committed transaction."""
        if self._fence_ready:
            return
        table = self._fence_table()
        cur.execute("SELECT name FROM sys.columns WHERE object_id = OBJECT_ID(?)", table)
        if not cur.fetchall():
            try:
                cur.execute(
                    f"CREATE TABLE {table} (campaign NVARCHAR(120) NOT NULL, "
                    "chunk_index BIGINT NOT NULL, attempt BIGINT NOT NULL, "
                    "claimed_at DATETIME2 NOT NULL DEFAULT SYSUTCDATETIME(), "
                    "PRIMARY KEY (campaign, chunk_index))"
                )
            except self.db.driver.Error as exc:
                if "error 2714" not in describe_error(exc):  # 2714: a concurrent creator won
                    raise
                conn.rollback()  # XACT_ABORT dooms the transaction; the table exists now
                self._fence_ready = True
                return
        conn.commit()
        self._fence_ready = True

    def _claim_fence(self, conn: Any, cur: Any, fence: ChunkFence) -> None:
        """Lock the chunk's fence row (UPDLOCK, HOLDLOCK: held to commit), then raise it to this
        attempt; a stored newer attempt rolls the transaction back."""
        self._ensure_fence_table(conn, cur)
        limits = session_limits()
        table = self._fence_table()
        key = (fence.campaign, fence.chunk_index)
        cur.execute(f"SET LOCK_TIMEOUT {round(limits.fence_lock_s * 1000)}")
        try:
            cur.execute(
                f"SELECT attempt FROM {table} WITH (UPDLOCK, HOLDLOCK) "
                "WHERE campaign = ? AND chunk_index = ?",
                *key,
            )
            found = cur.fetchall()
        except self.db.driver.Error as exc:
            if "error 1222" in describe_error(exc):  # lock request time out period exceeded
                raise DponeError(
                    errors.CHUNK_BUSY,
                    f"{self.spec.display()}: chunk {fence.chunk_index}: another transaction "
                    f"holds the chunk's fence row past {limits.fence_lock_s:g}s "
                    "(DPONE_FENCE_LOCK_TIMEOUT); nothing was written",
                ) from None
            raise
        if not found:
            cur.execute(
                f"INSERT INTO {table} (campaign, chunk_index, attempt) VALUES (?, ?, ?)",
                *key,
                fence.attempt,
            )
            return
        stored = int(found[0][0])
        if stored > fence.attempt:
            raise fence.superseded(self.spec.display(), stored)
        if stored < fence.attempt:
            cur.execute(
                f"UPDATE {table} SET attempt = ?, claimed_at = SYSUTCDATETIME() "
                "WHERE campaign = ? AND chunk_index = ?",
                fence.attempt,
                *key,
            )

    # paths --------------------------------------------------------------------------------------
    def _write(
        self, cur: Any, source: Source, window: ChunkWindow | None, columns: tuple[str, ...]
    ) -> ChunkWrite:
        cols = _columns_sql(columns)
        if isinstance(source, MssqlSource) and source.same_dsn(self._dsn):
            select = source.select_sql(window, columns)

            def fill_select(rel: str) -> int:
                cur.execute(f"INSERT INTO {rel} ({cols}) {select}", *_params(window))
                return int(cur.rowcount)

            return self._modes(cur, window, columns, fill_select, "insert-select")

        def fill_rows(rel: str) -> int:
            insert = f"INSERT INTO {rel} ({cols}) VALUES ({', '.join('?' for _ in columns)})"
            count = 0
            with contextlib.closing(source.rows(window, self.options.batch_rows)) as batches:
                for batch in batches:
                    cur.executemany(insert, [tuple(to_mssql(v) for v in row) for row in batch])
                    count += len(batch)
            return count

        return self._modes(cur, window, columns, fill_rows, "executemany")

    def _modes(
        self,
        cur: Any,
        window: ChunkWindow | None,
        columns: tuple[str, ...],
        fill: Callable[[str], int],
        method: str,
    ) -> ChunkWrite:
        """The inner mode around a ``fill(relation)``.

        full_refresh deletes every row of the target WITH (TABLOCKX): held to the commit, it makes
        a concurrent full refresh wait instead of inserting its copy next to this one's. DELETE,
        not TRUNCATE, so that the whole replacement stays one transaction.
        """
        mode = self.spec.inner_mode
        cols = _columns_sql(columns)
        hashed = self._hashed(columns)
        checksum: str | None = None
        if mode in ("replace", "full_refresh"):
            replaced = window if mode == "replace" else None  # None: every row of the target
            where = _where(replaced)
            hint = " WITH (TABLOCKX)" if replaced is None else ""
            cur.execute(
                f"DELETE [dpone_src] FROM {self._table} AS [dpone_src]{hint}{where}",
                *_params(replaced),
            )
            rows = fill(self._table)
            if self.options.checksum:
                read = f"SELECT {_columns_sql(hashed)} FROM {self._table} AS [dpone_src]{where}"
                checksum = self._read_checksum(cur, hashed, read, _params(replaced))
            return ChunkWrite(rows, checksum, method)
        if mode == "append" and not self.options.checksum:
            return ChunkWrite(fill(self._table), None, method)
        stage = quote(f"#dpone_stage_{uuid.uuid4().hex[:16]}", "stage")
        empty = f"SELECT {cols} FROM {self._table} WHERE 1 = 0"
        # UNION ALL drops an IDENTITY property the plain SELECT .. INTO would copy to the stage.
        cur.execute(f"SELECT {cols} INTO {stage} FROM {self._table} WHERE 1 = 0 UNION ALL {empty}")
        fill(stage)
        if mode == "merge":
            cur.execute(self._merge_sql(stage, columns))
        else:
            cur.execute(f"INSERT INTO {self._table} ({cols}) SELECT {cols} FROM {stage}")
        rows = int(cur.rowcount)
        if self.options.checksum:
            read = f"SELECT {_columns_sql(hashed)} FROM {stage}"
            if mode == "merge":  # the target's rows whose keys the stage carries
                on = " AND ".join(
                    f"[s].{quote(k, 'key')} = [t].{quote(k, 'key')}" for k in self.spec.keys
                )
                read = (
                    f"SELECT {_columns_sql(hashed, '[t].')} FROM {self._table} AS [t] "
                    f"WHERE EXISTS (SELECT 1 FROM {stage} AS [s] WHERE {on})"
                )
            checksum = self._read_checksum(cur, hashed, read, ())
        cur.execute(f"DROP TABLE {stage}")
        return ChunkWrite(rows, checksum, method)

    def _merge_sql(self, stage: str, columns: Sequence[str]) -> str:
        keys = self.spec.keys
        on = " AND ".join(f"[t].{quote(k, 'key')} = [s].{quote(k, 'key')}" for k in keys)
        updated = [c for c in columns if c not in keys]
        matched = ""
        if updated:
            sets = ", ".join(
                f"[t].{quote(c, 'column')} = [s].{quote(c, 'column')}" for c in updated
            )
            matched = f" WHEN MATCHED THEN UPDATE SET {sets}"
        return (
            f"MERGE INTO {self._table} WITH (HOLDLOCK) AS [t] USING {stage} AS [s] ON {on}"
            f"{matched} WHEN NOT MATCHED BY TARGET THEN INSERT ({_columns_sql(columns)})"
            f" VALUES ({_columns_sql(columns, '[s].')});"
        )

    @staticmethod
    def _read_checksum(
        cur: Any, columns: Sequence[str], query: str, params: Sequence[object]
    ) -> str:
        check = RowChecksum(columns)
        cur.execute(query, *params)
        while batch := cur.fetchmany(10_000):
            check.add_many(batch)
        return check.value()


def table_checksum(
    dsn: str,
    table: TableRef,
    window: ChunkWindow | None,
    columns: Sequence[str] | None = None,
    driver: Driver | None = None,
) -> str:
    spec = SourceSpec(
        connection="checksum", table=table, columns=tuple(columns) if columns else None
    )
    with MssqlSource(spec, dsn, driver) as source:
        return source.checksum(window)
