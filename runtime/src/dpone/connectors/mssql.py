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
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

from dpone import errors
from dpone.connectors import base, sql_base
from dpone.connectors.column_types import ColumnType
from dpone.connectors.dialect_types import mssql_column_type
from dpone.credentials.connections import current_dsn
from dpone.credentials.odbc_driver import driver_missing, driver_not_loadable
from dpone.errors import DponeError
from dpone.lifecycle.session_limits import session_limits

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
            "MSSQL needs pyodbc and unixODBC's libodbc: install the dpone-runtime wheel with its "
            "[mssql] extra (by path) and an SQL "
            "Server ODBC driver",
        ) from None
    driver: Driver = pyodbc
    return driver


# --- identifiers, DSNs, values --------------------------------------------------------------------
class MssqlDialect(sql_base.SqlDialect):
    """T-SQL names: [bracketed] with ] doubled; ``?`` markers; typed bounds for the ODBC binder."""

    alias = "[dpone_src]"
    opening, closing = "[", "]"
    max_chars = MAX_IDENTIFIER_CHARS

    @staticmethod
    def bound(window: base.ChunkWindow, value: base.Bound) -> object:
        return mssql_bound(window, value)


quote = MssqlDialect.quote
_columns_sql = MssqlDialect.columns_sql


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


def mssql_bound(window: base.ChunkWindow, value: object) -> object:
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


#: A value from another database as the ODBC binder takes it (datetime2 is zone-less UTC).
to_mssql = sql_base.zoneless_utc


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


class MssqlConnection(sql_base.DriverConnection[Any]):
    """A lazily opened pyodbc connection with XACT_ABORT and value converters set; each open reads
    the connection's DSN again (``current_dsn``), so a rotated password is used without a
    restart."""

    def __init__(self, dsn: str, label: str, driver: Driver | None, autocommit: bool) -> None:
        super().__init__(label)
        self._dsn = dsn
        self._driver = driver
        self._autocommit = autocommit

    @property
    def driver_given(self) -> Driver | None:
        """The driver passed in (None: pyodbc, imported on first use)."""
        return self._driver

    @property
    def driver(self) -> Driver:
        if self._driver is None:
            self._driver = load_driver()
        return self._driver

    def open(self) -> Any:
        driver = self.driver
        try:
            conn = driver.connect(
                odbc_connection_string(current_dsn(self._dsn)), autocommit=self._autocommit
            )
            conn.add_output_converter(SQL_SS_TIMESTAMPOFFSET, _datetimeoffset)
            conn.add_output_converter(SQL_GUID, _guid)
            conn.execute("SET XACT_ABORT ON")
        except driver.Error as exc:
            if driver_not_loadable(exc):
                raise driver_missing(self._label) from None
            state = exc.args[0] if exc.args else "?"
            raise self.unreachable(f"SQLSTATE {state}") from None
        return conn

    @property
    def driver_error(self) -> type[BaseException]:
        return self.driver.Error

    describe = staticmethod(describe_error)
    connection_lost = staticmethod(_is_connection_loss)


# --- source ---------------------------------------------------------------------------------------
class MssqlSource(sql_base.SqlSource[Any]):
    """A table or trusted query in SQL Server, read in autocommit statements."""

    kind = "mssql"
    dialect = MssqlDialect
    db: MssqlConnection

    def __init__(self, spec: base.SourceSpec, dsn: str, driver: Driver | None = None) -> None:
        self._driver = driver
        super().__init__(spec, dsn)

    def connection(self, dsn: str, label: str) -> MssqlConnection:
        return MssqlConnection(dsn, label, self._driver, autocommit=True)

    def probe_sql(self, select: str) -> str:
        return f"SELECT TOP 0 {select} FROM {self.relation()}"

    def execute(self, cur: Any, query: str, params: Any) -> None:
        cur.execute(query, *(params or ()))

    def batch(self, fetched: Sequence[Any]) -> list[base.Row]:
        return [tuple(row) for row in fetched]

    def sibling(self, columns: tuple[str, ...] | None = None) -> MssqlSource:
        return MssqlSource(self._spec_of(columns), self._dsn, self.db.driver_given)

    def column_types(self) -> dict[str, ColumnType | None]:
        """The moved columns' types as the server describes the SELECT's first result set
        (``system_type_name``): tables and queries alike. UNVERIFIED (docs/connectors.md)."""
        conn = self.db.get()
        try:
            cur = conn.cursor()
            cur.execute(
                "SELECT name, system_type_name FROM sys.dm_exec_describe_first_result_set"
                "(?, NULL, 0) ORDER BY column_ordinal",
                self.probe_sql(self.select_list()),
            )
            described = [(str(name), str(kind)) for name, kind in cur.fetchall()]
            cur.close()
        except Exception as exc:
            raise self._fail(exc, "describing the column types") from None
        return {name: mssql_column_type(kind) for name, kind in described}


# --- sink -----------------------------------------------------------------------------------------
class MssqlSink(sql_base.SqlSink[Any]):
    """Writes chunks into one SQL Server table, one explicit transaction per chunk."""

    kind = "mssql"
    dialect = MssqlDialect
    db: MssqlConnection

    def __init__(
        self, spec: base.SinkSpec, dsn: str, options: base.SinkOptions, driver: Driver | None = None
    ) -> None:
        self._driver = driver
        super().__init__(spec, dsn, options)

    def connection(self, dsn: str, label: str) -> MssqlConnection:
        return MssqlConnection(dsn, label, self._driver, autocommit=False)

    def _begin(self, conn: Any) -> Any:
        cur = conn.cursor()
        cur.fast_executemany = True
        return cur

    def _commit(self, conn: Any, handle: Any) -> None:
        handle.close()
        conn.commit()

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
            raise self._preflight_failed(exc) from None
        return base.index_warnings(shown, self.spec, window_column, columns, list(grouped.values()))

    # fence --------------------------------------------------------------------------------------
    def _ensure_fence_table(self, conn: Any) -> None:
        """Create the fence table, in its own committed transaction."""
        table = self._fence_table
        cur = conn.cursor()
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
                return
        conn.commit()

    def _claim_fence(self, handle: Any, fence: base.ChunkFence) -> bool:
        """Lock the chunk's fence row (UPDLOCK, HOLDLOCK: held to commit), then raise it to this
        attempt; a stored newer attempt rolls the transaction back."""
        cur = handle
        limits = session_limits()
        table = self._fence_table
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
                raise sql_base.busy_fence(
                    self.spec.display(), fence, f"{limits.fence_lock_s:g}"
                ) from None
            raise
        if not found:
            cur.execute(
                f"INSERT INTO {table} (campaign, chunk_index, attempt) VALUES (?, ?, ?)",
                *key,
                fence.attempt,
            )
            return False
        stored = int(found[0][0])
        self._refuse_superseded(fence, stored)
        if stored < fence.attempt:
            cur.execute(
                f"UPDATE {table} SET attempt = ?, claimed_at = SYSUTCDATETIME() "
                "WHERE campaign = ? AND chunk_index = ?",
                fence.attempt,
                *key,
            )
        return True

    # paths --------------------------------------------------------------------------------------
    def _write(
        self, handle: Any, source: base.Source, window: base.Scope, columns: tuple[str, ...]
    ) -> base.ChunkWrite:
        cur = handle
        cols = _columns_sql(columns)
        if isinstance(source, MssqlSource) and source.same_dsn(self._dsn):
            select = source.select_sql(window, columns)

            def fill_select(rel: str) -> int:
                cur.execute(
                    f"INSERT INTO {rel} ({cols}) {select}", *(MssqlDialect.params(window) or ())
                )
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

    # inner modes ------------------------------------------------------------------------------
    def _query(self, handle: Any, query: str, params: Any) -> Any:
        handle.execute(query, *(params or ()))
        return handle

    def _delete_sql(self, window: base.Scope) -> str:
        """full_refresh (no window) deletes every row of the target WITH (TABLOCKX): held to the
        commit, it makes a concurrent full refresh wait instead of inserting its copy next to
        this one's. DELETE, not TRUNCATE, so that the whole replacement stays one transaction."""
        hint = " WITH (TABLOCKX)" if window is None else ""
        return f"DELETE [dpone_src] FROM {self._table} AS [dpone_src]{hint}{MssqlDialect.where(window)}"

    def _create_stage(self, handle: Any, columns: Sequence[str]) -> str:
        stage = quote(f"#dpone_stage_{uuid.uuid4().hex[:16]}", "stage")
        cols = _columns_sql(columns)
        empty = f"SELECT {cols} FROM {self._table} WHERE 1 = 0"
        # UNION ALL drops an IDENTITY property the plain SELECT .. INTO would copy to the stage.
        handle.execute(
            f"SELECT {cols} INTO {stage} FROM {self._table} WHERE 1 = 0 UNION ALL {empty}"
        )
        return stage

    def _from_stage_sql(self, stage: str, columns: Sequence[str]) -> str:
        if self.spec.inner_mode == "merge":
            return self._merge_sql(stage, columns)
        cols = _columns_sql(columns)
        return f"INSERT INTO {self._table} ({cols}) SELECT {cols} FROM {stage}"

    def _drop_stage(self, handle: Any, stage: str, done: bool) -> None:
        if done:  # else XACT_ABORT doomed the transaction: the rollback drops the stage
            handle.execute(f"DROP TABLE {stage}")

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
