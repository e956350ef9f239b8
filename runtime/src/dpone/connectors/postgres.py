"""Postgres source and sink on psycopg 3.

Three write paths, chosen per chunk: ``INSERT .. SELECT`` when source and sink share a DSN (rows
never leave the server); a streaming COPY pipe between two databases, binary when every column has
the same built-in type on both sides and text otherwise; and a text COPY of Python rows when the
source is another kind of database. The checksum is computed in SQL on the sink, inside the chunk's
transaction, with the exact formula of :class:`dpone.connectors.base.RowChecksum` (in Python, by
reading the rows back, only where the server's hash differs: a non-UTF-8 database, a big-endian
server).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import selectors
import uuid
import weakref
from collections.abc import Callable, Collection, Generator, Hashable, Iterator, Mapping, Sequence
from dataclasses import replace
from operator import itemgetter
from typing import Any, Self

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.copy import QueuedLibpqWriter

from dpone import errors
from dpone.connectors.base import (
    CHAINED_SCHEME,
    CHECKSUM_SCHEME,
    FENCE_TABLE,
    ChunkFence,
    ChunkWindow,
    ChunkWrite,
    Expected,
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
    checksum_rows,
    format_checksum,
    index_warnings,
    pg_hash64,
    scope_display,
    strip_query,
)
from dpone.connectors.column_types import ColumnType
from dpone.connectors.dialect_types import pg_column_type
from dpone.credentials.connections import current_dsn
from dpone.credentials.dsn_settings import (
    invalid_setting,
    missing_file,
    postgres_connect_problem,
    postgres_connect_reason,
    postgres_missing_file,
    postgres_parse_problem,
)
from dpone.credentials.postgres_errors import describe_postgres_error as describe_error
from dpone.errors import DponeError
from dpone.lifecycle.faults import fault_point
from dpone.lifecycle.read_ahead import ReadAhead, read_ahead_budget
from dpone.lifecycle.session_limits import (
    TEXT_FORM_SETTINGS,
    has_text_forms,
    mark_text_forms,
    session_limits,
)
from dpone.lifecycle.sessions import idle_sessions

Connection = psycopg.Connection[Any]
Cursor = psycopg.Cursor[Any]

MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: longer names are silently truncated by the server
FIRST_USER_OID = 16384  # below: built-in types, whose binary COPY format is the same everywhere

_INT_OIDS = frozenset({20, 21, 23, 26})
_FLOAT4, _FLOAT8 = 700, 701
_FLOAT_OIDS = frozenset({_FLOAT4, _FLOAT8})
_NUMERIC, _BOOL, _DATE, _TIME, _BYTEA, _UUID = 1700, 16, 1082, 1083, 17, 2950
_TIMESTAMP, _TIMESTAMPTZ = 1114, 1184
#: Types whose canonical text never contains a double quote (no replace() needed in the hash).
_QUOTE_FREE = _INT_OIDS | _FLOAT_OIDS | {_NUMERIC, _BOOL, _DATE, _TIME, _BYTEA, _UUID}
_QUOTE_FREE |= {_TIMESTAMP, _TIMESTAMPTZ}
#: Types read as Python values on the row path; every other type is read as Postgres's own text.
_NATIVE = _QUOTE_FREE | {25, 1043, 1042, 19}

_CONNECT_DEFAULTS = {"fallback_application_name": "dpone", "connect_timeout": "30"}
"""Plus the client keepalives of :mod:`dpone.lifecycle.session_limits`; the DSN's own values win."""
_CONNECTION_LOSS_STATES = frozenset({"57P01", "57P02", "57P03"})


# --- identifiers ----------------------------------------------------------------------------------
def ident(name: str, what: str) -> sql.Identifier:
    return sql.Identifier(
        check_identifier(name, what, max_chars=MAX_IDENTIFIER_BYTES, max_bytes=MAX_IDENTIFIER_BYTES)
    )


def table_sql(table: TableRef) -> sql.Identifier:
    name = check_identifier(
        table.name, "table", max_chars=MAX_IDENTIFIER_BYTES, max_bytes=MAX_IDENTIFIER_BYTES
    )
    if table.schema is None:
        return sql.Identifier(name)
    schema = check_identifier(
        table.schema, "schema", max_chars=MAX_IDENTIFIER_BYTES, max_bytes=MAX_IDENTIFIER_BYTES
    )
    return sql.Identifier(schema, name)


def _columns_sql(columns: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(ident(c, "column") for c in columns)


def _where(window: ChunkWindow | None, keyword: str = "WHERE") -> sql.Composable:
    """`` WHERE <chunk predicate>`` on the ``dpone_src`` alias (``keyword`` ``AND``: one more
    condition of a WHERE); nothing without a window."""
    if window is None:
        return sql.SQL("")
    name = check_identifier(
        window.column,
        "chunk column",
        max_chars=MAX_IDENTIFIER_BYTES,
        max_bytes=MAX_IDENTIFIER_BYTES,
    )
    col = sql.Identifier("dpone_src", name)
    return sql.SQL(" " + keyword + " {} >= %s AND {} < %s").format(col, col)


def _params(window: ChunkWindow | None) -> tuple[object, object] | None:
    """Bounds as parameters: strings go as 'unknown', so the server types them from the column.

    None without a window: the statement is then sent without parameters (so a trusted query's
    ``%`` must not be doubled; see :meth:`PostgresSource.relation`).
    """
    return None if window is None else (window.lower, window.upper)


# --- errors ---------------------------------------------------------------------------------------
def _is_connection_loss(exc: BaseException, conn: Connection | None) -> bool:
    if conn is not None and (conn.closed or conn.broken):
        return True
    state = getattr(exc, "sqlstate", None)
    if state and (state.startswith("08") or state in _CONNECTION_LOSS_STATES):
        return True
    return isinstance(exc, psycopg.OperationalError) and not state


def widened_reals(source: Mapping[str, int], target: Mapping[str, int]) -> frozenset[str]:
    """The ``real`` columns written into ``double precision`` ones: moved through their text,
    as every streaming path moves them, so the double holds the value the real shows (0.1); an
    exact cast stores 0.10000000149011612, which no client reads as the source's value and the
    read-back gate refuses."""
    return frozenset(c for c, oid in target.items() if oid == _FLOAT8 and source.get(c) == _FLOAT4)


def translate_error(
    exc: BaseException, code: str, what: str, conn: Connection | None
) -> DponeError:
    if isinstance(exc, DponeError):
        return exc
    if isinstance(exc, psycopg.Error):
        if _is_connection_loss(exc, conn):
            return DponeError(
                errors.CONNECTION_FAILED,
                f"{what}: lost the connection to the database ({type(exc).__name__})",
            )
        if code == errors.SINK_FAILED and isinstance(exc, psycopg.errors.LockNotAvailable):
            return DponeError(
                errors.CHUNK_BUSY,
                f"{what}: another transaction held rows or the table the chunk writes past "
                f"{session_limits().fence_lock_s:g}s (DPONE_FENCE_LOCK_TIMEOUT); the chunk is "
                "busy, a later attempt moves it",
            )
        if code == errors.SINK_FAILED and isinstance(exc, psycopg.errors.DeadlockDetected):
            return DponeError(
                errors.CHUNK_BUSY,
                f"{what}: the server ended a deadlock with another transaction by rolling this "
                "chunk back; the chunk is busy, a later attempt moves it",
            )
        if isinstance(exc, psycopg.errors.SerializationFailure):
            # 40001: a concurrent update under a stricter isolation, or a standby cancelling a
            # read that conflicts with its recovery: transient, as the server's hint says
            return DponeError(
                errors.CHUNK_BUSY,
                f"{what}: the server cancelled the statement (SQLSTATE 40001: a serialization "
                "failure, or a conflict with recovery on a standby); the chunk is busy, a later "
                "attempt moves it",
            )
        error = DponeError(code, f"{what} failed: {describe_error(exc)}")
        error.key_conflict = code == errors.SINK_FAILED and isinstance(
            exc, psycopg.errors.UniqueViolation
        )
        return error
    return DponeError(code, f"{what} failed: {type(exc).__name__}")


class PgConnection:
    """A lazily (re)opened autocommit connection with dpone's session settings.

    Each (re)open reads the connection's DSN again (``current_dsn``): a password rotated while a
    run goes on is used by the next connect, not only by the next process."""

    def __init__(self, dsn: str, label: str) -> None:
        self._dsn = dsn
        self._label = label
        self.current: Connection | None = None
        self.read_only = False
        self._opened_with = ""  # the DSN the current connection was opened with

    def get(self) -> Connection:
        conn = self.current
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self.discard()
        dsn = current_dsn(self._dsn)
        self._opened_with = dsn
        handed = self._handed_over(dsn)
        if handed is not None:
            self.current = handed
            return handed
        try:
            given = conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            raise DponeError(
                errors.CONFIG_INVALID,
                f"{self._label}: the Postgres DSN is malformed ({postgres_parse_problem(exc)})",
            ) from None
        missing = postgres_missing_file(given)
        if missing is not None:
            raise missing_file(self._label, missing)
        limits = session_limits()
        defaults = {**_CONNECT_DEFAULTS, **limits.libpq_client()}
        extra = {k: v for k, v in defaults.items() if k not in given}
        try:
            conn = psycopg.connect(make_conninfo(dsn, **extra), autocommit=True)
            settings = TEXT_FORM_SETTINGS + limits.postgres_settings(conn.info.server_version)
            if self.read_only:
                settings = (*settings, ("default_transaction_read_only", "on"))
            conn.execute(
                sql.SQL("SELECT {}").format(
                    sql.SQL(", ").join(sql.SQL("set_config(%s, %s, false)") for _ in settings)
                ),
                [v for pair in settings for v in pair],
            )
        except psycopg.Error as exc:
            setting = postgres_connect_problem(dsn, str(exc))
            if setting is not None:
                raise invalid_setting(self._label, setting) from None
            reason = postgres_connect_reason(str(exc))
            raise DponeError(
                errors.CONNECTION_FAILED,
                f"{self._label}: could not connect to the database ({reason})",
            ) from None
        mark_text_forms(conn)
        self.current = conn
        return conn

    def _handed_over(self, dsn: str) -> Connection | None:
        """An idle connection a closed connector left on this DSN (dpone.lifecycle.sessions),
        switched to this one's read-only mode: on as a read-only open sets it, else back to
        the session's own default (the DSN's or the role's, which a read-write open keeps).
        That statement also proves the session alive; a dead one is closed and None returned
        (the caller connects)."""
        scope = idle_sessions()
        conn: Connection | None = scope.take(dsn) if scope is not None else None
        if conn is None:
            return None
        try:
            if self.read_only:
                conn.execute("SELECT set_config('default_transaction_read_only', 'on', false)")
            else:
                conn.execute("RESET default_transaction_read_only")
        except psycopg.Error:
            with contextlib.suppress(Exception):
                conn.close()
            return None
        return conn

    def release(self) -> None:
        """Close the connection, or hand it to the next connector opened on the same DSN in
        this run (dpone.lifecycle.sessions) when it is idle: autocommit, no transaction or
        statement in flight, not broken. Error paths discard() instead."""
        conn = self.current
        scope = idle_sessions()
        if (
            scope is None
            or conn is None
            or conn.closed
            or conn.broken
            or conn.info.transaction_status != pq.TransactionStatus.IDLE
        ):
            self.discard()
            return
        self.current = None
        scope.give(self._opened_with, conn, conn.close)

    def discard(self) -> None:
        conn, self.current = self.current, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def interrupt(self) -> None:
        """Ask the server to cancel this connection's statement in flight (thread-safe)."""
        conn = self.current
        if conn is not None and not conn.closed and not conn.broken:
            with contextlib.suppress(Exception):
                conn.cancel_safe(timeout=5.0)

    def forget_if_broken(self) -> None:
        conn = self.current
        if conn is not None and (conn.closed or conn.broken):
            self.discard()


# --- checksum in SQL ------------------------------------------------------------------------------
def _canonical_sql(col: sql.Composable, oid: int) -> sql.Composable:
    """The SQL twin of base.canonical_text for one column of type ``oid``."""
    if oid == _NUMERIC:
        return sql.SQL("trim_scale({})::text").format(col)
    if oid == _FLOAT8:
        return sql.SQL("trim_scale({}::numeric)::text").format(col)
    if oid == _FLOAT4:
        # via its shortest text, as drivers read a real: 0.1::real is 0.1, not 0.100000001490116
        return sql.SQL("trim_scale({}::text::float8::numeric)::text").format(col)
    if oid == _BOOL:
        return sql.SQL("{}::int::text").format(col)
    if oid == _TIMESTAMPTZ:
        return sql.SQL("({} AT TIME ZONE 'UTC')::text").format(col)
    return sql.SQL("{}::text").format(col)


def _row_text_sql(
    columns: Sequence[tuple[str, int]], not_null: Collection[str] = ()
) -> sql.Composable:
    """A row's canonical text as one chain of ``||`` (see base.RowChecksum): fields in column-name
    order, ``"``-quoted, NULL as ``N``, joined by ``,``.

    Adjacent literals are merged (a field's quotes with the next separator) and a column in
    ``not_null`` gets no coalesce: every ``||`` and coalesce is a call per row, and the
    expression, not the scan, is most of what the checksum costs (measured: 405 ns a row
    for the five-column benchmark table as first written, 315 in this form). A NULL in a column
    named in ``not_null`` makes the whole text NULL, never a wrong text.
    """
    parts: list[sql.Composable | str] = []  # a str is literal text, merged with its neighbours
    ordered = sorted(columns, key=lambda c: c[0])
    for position, (name, oid) in enumerate(ordered):
        comma = "," if position < len(ordered) - 1 else ""
        text = _canonical_sql(sql.Identifier(name), oid)
        if oid not in _QUOTE_FREE:
            # under "C": a column's nondeterministic collation refuses replace()'s search
            text = sql.SQL('replace(({}) COLLATE "C", \'"\', \'""\')').format(text)
        if name in not_null:
            parts += ['"', text, '"' + comma]
        else:
            field = sql.SQL("coalesce('\"' || {} || {}, {})").format(
                text, sql.Literal('"' + comma), sql.Literal("N" + comma)
            )
            parts.append(field)
    merged: list[sql.Composable] = []
    pending = ""
    for part in parts:
        if isinstance(part, str):
            pending += part
            continue
        if pending:
            merged.append(sql.Literal(pending))
            pending = ""
        merged.append(part)
    if pending:
        merged.append(sql.Literal(pending))
    return sql.SQL(" || ").join(merged)


def _chained_hash_sql(columns: Sequence[tuple[str, int]]) -> sql.Composable:
    """base.chained_row_hash in SQL: one ``hashtextextended`` a field, in column-name order,
    each seeded with the one before (ADR 0027). No row text is built and no field quoted:
    over the benchmark's million rows 0.23 s of server CPU above the scan, against 0.31 s for
    the joined text in its short form and 0.34 s in its full form."""
    chain: sql.Composable = sql.SQL("0")
    for name, oid in sorted(columns, key=lambda c: c[0]):
        text = _canonical_sql(sql.Identifier(name), oid)
        chain = sql.SQL("""hashtextextended(coalesce('"' || {}, 'N') COLLATE "C", {})""").format(
            text, chain
        )
    return chain


def checksum_scheme(chained: bool) -> str:
    return CHAINED_SCHEME if chained else CHECKSUM_SCHEME


def row_hash_sql(
    columns: Sequence[tuple[str, int]], not_null: Collection[str] = (), chained: bool = False
) -> sql.Composable:
    """``hashtextextended`` of a row's canonical text (signed bigint; summed mod 2^64 in Python),
    or with ``chained`` the chained form two Postgres sides compare in (_chained_hash_sql).

    ``COLLATE "C"`` keeps the hash on the bytes whatever the columns' collations. Columns the
    catalog says are NOT NULL take the short form; should one hold a NULL all the same (a NOT
    NULL constraint not yet validated), the row falls back to the full form, so the value never
    depends on the catalog being right.
    """
    if chained:
        return _chained_hash_sql(columns)
    full = _row_text_sql(columns)
    short = set(not_null) & {name for name, _ in columns}
    row = sql.SQL("coalesce({}, {})").format(_row_text_sql(columns, short), full) if short else full
    return sql.SQL('hashtextextended(({}) COLLATE "C", 0)').format(row)


def checksum_select(
    relation: sql.Composable,
    columns: Sequence[tuple[str, int]],
    not_null: Collection[str] = (),
    chained: bool = False,
) -> sql.Composed:
    return sql.SQL("SELECT count(*), sum({}) FROM {}").format(
        row_hash_sql(columns, not_null, chained), relation
    )


def checksum_value(row: tuple[Any, ...] | None, chained: bool = False) -> tuple[int, str]:
    count = int(row[0]) if row else 0
    total = int(row[1]) if row and row[1] is not None else 0
    return count, format_checksum(count, total, checksum_scheme(chained))


def not_null_columns(cur: Cursor, table: sql.Composable) -> frozenset[str]:
    """The columns of ``table`` the catalog says are NOT NULL: the checksum's short form for
    them (see row_hash_sql; its value stays right should the catalog be wrong)."""
    cur.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass"
        " AND attnum > 0 AND NOT attisdropped AND attnotnull",
        (table.as_string(cur.connection),),
    )
    return frozenset(str(row[0]) for row in cur.fetchall())


_PROBE = 'dpone probe: Zoë ✓ "quoted", 12 bytes+'
_PROBE_SEED = -0x1234_5678_9ABC_DEF0  # a negative bigint: both halves of the seed matter
_SQL_CHECKSUM: weakref.WeakKeyDictionary[Connection, bool] = weakref.WeakKeyDictionary()


def has_deferrable_checks(cur: Cursor, table: sql.Composable) -> bool:
    """True when a check on ``table``'s rows can wait for COMMIT: a deferrable constraint on it
    or referencing it, or a deferrable constraint trigger on it."""
    name = table.as_string(cur.connection)
    cur.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE condeferrable"
        " AND (conrelid = %s::regclass OR confrelid = %s::regclass))"
        " OR EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = %s::regclass AND tgdeferrable)",
        (name, name, name),
    )
    found = cur.fetchone()
    return bool(found and found[0])


def sql_checksum_supported(cur: Cursor) -> bool:
    """True when the server's hashtextextended over UTF-8 text is pg_hash64 (asked once per
    connection): false on a database that is not UTF-8 or on a big-endian server."""
    conn = cur.connection
    known = _SQL_CHECKSUM.get(conn)
    if known is None:
        encoding = (conn.info.parameter_status("server_encoding") or "").upper()
        known = False
        if encoding in ("UTF8", "UTF-8"):
            # unseeded and seeded (the chained form seeds each field with the one before)
            cur.execute(
                'SELECT hashtextextended(%s COLLATE "C", 0),'
                ' hashtextextended(%s COLLATE "C", %s)',
                (_PROBE, _PROBE, _PROBE_SEED),
            )
            found = cur.fetchone()
            probe = _PROBE.encode("utf-8")
            known = found is not None and [int(v) % (1 << 64) for v in found] == [
                pg_hash64(probe),
                pg_hash64(probe, _PROBE_SEED % (1 << 64)),
            ]
        _SQL_CHECKSUM[conn] = known
    return known


StatementCache = dict[Hashable, str]


def cached_statement(
    cache: StatementCache, key: Hashable, conn: Connection, build: Callable[[], sql.Composable]
) -> str:
    """The text of ``build()``, composed once per key: a statement sent for every chunk is then
    sent as text, without composing it and checking its identifiers again (measured: a tenth of
    the client's CPU per chunk). The text depends on no connection state: every dpone session
    is UTF-8."""
    text = cache.get(key)
    if text is None:
        text = cache[key] = build().as_string(conn)
    return text


def relation_checksum(
    cur: Cursor,
    relation: sql.Composable | Callable[[], sql.Composable],
    columns: Sequence[tuple[str, int]],
    params: Sequence[object] | None = None,
    memo: tuple[StatementCache, Hashable] | None = None,
    not_null: Collection[str] = (),
    with_query: sql.Composable | None = None,
    chained: bool = False,
) -> str:
    """The checksum of every row of ``relation`` (a FROM item, or a function that builds it):
    in SQL when the server hashes like dpone, else by reading the rows (non-native types as
    their text) into RowChecksum. ``memo`` keeps the SQL statement's text for the next call;
    ``not_null`` names the columns that cannot hold NULL (a cheaper expression, same value);
    ``with_query`` is a ``WITH`` clause the statement starts with (a data-modifying one runs
    once, in the same statement); ``chained``: the form two Postgres sides compare in."""

    def built() -> sql.Composable:
        return relation() if callable(relation) else relation

    def led(statement: sql.Composed) -> sql.Composed:
        return statement if with_query is None else sql.SQL("{} {}").format(with_query, statement)

    if sql_checksum_supported(cur):
        if memo is None:
            cur.execute(led(checksum_select(built(), columns, not_null, chained)), params)
        else:
            cache, key = memo
            select = cached_statement(
                cache,
                (key, chained),
                cur.connection,
                lambda: checksum_select(built(), columns, not_null, chained),
            )
            cur.execute(select, params)
        return checksum_value(cur.fetchone(), chained)[1]
    relation = built()
    items = sql.SQL(", ").join(
        sql.SQL("{}::text").format(sql.Identifier(n)) if oid not in _NATIVE else sql.Identifier(n)
        for n, oid in columns
    )
    check = RowChecksum([name for name, _ in columns], chained)
    cur.execute(led(sql.SQL("SELECT {} FROM {}").format(items, relation)), params)
    while batch := cur.fetchmany(10_000):
        check.add_many(batch)
    return check.value()


# --- COPY streaming -------------------------------------------------------------------------------
def raw_copy_blocks(conn: Connection, block_bytes: int) -> Iterator[bytearray]:
    """COPY TO data in blocks of about ``block_bytes``, straight from libpq.

    psycopg's ``Copy.read()`` costs a generator round trip per row; reading every message libpq has
    buffered in one tight loop and handing multi-megabyte blocks to the writer keeps Python off the
    critical path. The final result is consumed here, so the connection is idle afterwards.
    """
    pgconn = conn.pgconn
    get_copy_data = pgconn.get_copy_data  # one call per row: no attribute lookup, no len()
    with selectors.DefaultSelector() as selector:
        selector.register(pgconn.socket, selectors.EVENT_READ)
        buf = bytearray()
        size = 0
        while True:
            nbytes, data = get_copy_data(1)
            if nbytes > 0:
                buf += data
                size += nbytes
                if size >= block_bytes:
                    yield buf
                    buf = bytearray()
                    size = 0
            elif nbytes == 0:
                selector.select()
                pgconn.consume_input()
            else:
                break
        if buf:
            yield buf
        failure: psycopg.Error | None = None
        while True:
            while pgconn.is_busy():
                selector.select()
                pgconn.consume_input()
            result = pgconn.get_result()
            if result is None:
                break
            if result.status != pq.ExecStatus.COMMAND_OK and failure is None:
                failure = psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
        if failure is not None:
            raise failure


# --- source ---------------------------------------------------------------------------------------
class PostgresSource(Source):
    """A table or trusted query in Postgres, read chunk by chunk in autocommit statements."""

    kind = "postgres"

    def __init__(self, spec: SourceSpec, dsn: str) -> None:
        super().__init__(spec, dsn)
        if spec.table is not None:
            table_sql(spec.table)
        for col in spec.columns or ():
            ident(col, "source column")
        self._conn = PgConnection(dsn, spec.display())
        self._described: tuple[tuple[str, int], ...] | None = None
        self._not_null: frozenset[str] | None = None
        #: True once the side this one is compared with is a Postgres side too (agree_checksum,
        #: the sink's _gate_side): the chained form (ADR 0027); else the joined canonical text
        self.chained_checksum = False
        self._statements: StatementCache = {}
        self._read_ahead_budget = read_ahead_budget()
        self._next: Expected = None
        self._ahead: ReadAhead | None = None
        self._interrupted = False  # interrupt() was called: a failed read-ahead is not redone

    def agree_checksum(self, other: Source | None) -> None:
        """The chained form when ``other`` is a Postgres side too (both compute it in SQL, or
        in Python on a server that does not hash like dpone); the joined text otherwise."""
        chained = isinstance(other, PostgresSource)
        self.chained_checksum = chained
        if chained:
            assert isinstance(other, PostgresSource)
            other.chained_checksum = True

    def expect(self, window: Expected) -> None:
        """The window this worker reads next: after the current chunk's COPY, it is read ahead
        (see dpone.lifecycle.read_ahead) unless the budget is 0 or a chunk outgrew it. A
        function is asked then, with the rows that COPY copied."""
        self._next = window if self._read_ahead_budget > 0 else None

    def _settle(self, key: Hashable | None = None) -> ReadAhead | None:
        """Before any other use of the connection: the read-ahead of ``key`` if there is one
        (the caller takes it), else the read-ahead in flight dropped (its connection too, when
        its statement did not end untouched)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None or (key is not None and ahead.key == key):
            return ahead
        self._drop(ahead)
        return None

    def _drop(self, ahead: ReadAhead) -> None:
        """End a read-ahead; its connection goes too unless its statement ended untouched."""
        if not ahead.drop():
            self._conn.discard()

    def _start_read_ahead(
        self, conn: Connection, key: Hashable, stmt: str, block_bytes: int, copied: int
    ) -> None:
        expected, self._next = self._next, None
        if expected is None or self._read_ahead_budget <= 0 or self._interrupted:
            return
        window = expected(copied) if callable(expected) else expected
        if window is None:
            return
        params = _params(window)

        def produce() -> Iterator[bytearray]:
            with conn.cursor() as cur, cur.copy(stmt, params):
                yield from raw_copy_blocks(conn, block_bytes)

        self._ahead = ReadAhead(
            (key, params), conn, produce, self._conn.interrupt, self._read_ahead_budget
        )

    def relation(self, parameters: bool = True) -> sql.Composed:
        """The FROM item, aliased dpone_src; a trusted query is nested as a subquery.

        Its '%' are doubled when the statement is sent with parameters (psycopg then reads '%'
        as a placeholder): always, except for a read of every row (no window, no parameters).
        """
        if self.spec.table is not None:
            base: sql.Composable = table_sql(self.spec.table)
        else:
            query = strip_query(self.spec.query or "")
            if parameters:
                query = query.replace("%", "%%")
            base = sql.SQL("({})").format(sql.SQL(query))
        return sql.SQL("{} AS dpone_src").format(base)

    def describe(self) -> tuple[tuple[str, int], ...]:
        """(name, type oid) of the moved columns, asked once from the server."""
        if self._described is None:
            self._settle()
            conn = self._conn.get()
            select = (
                _columns_sql(self.spec.columns) if self.spec.columns else sql.SQL("dpone_src.*")
            )
            try:
                with conn.cursor() as cur:
                    cur.execute(
                        sql.SQL("SELECT {} FROM {} LIMIT 0").format(select, self.relation()), ()
                    )
                    desc = cur.description or []
            except psycopg.Error as exc:
                raise self._fail(exc, "describing the columns") from None
            described = tuple((d.name, int(d.type_code)) for d in desc)
            names = [name for name, _ in described]
            for name in names:
                check_identifier(name, f"{self.spec.display()} column", max_chars=63, max_bytes=63)
            check_unique(names, f"{self.spec.display()} columns")
            self._described = described
        return self._described

    def columns(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.describe())

    def _not_null_columns(self, cur: Cursor) -> frozenset[str]:
        """A table source's NOT NULL columns, cached (none for a query): the checksum's short
        form for them, as the sink's read-back has it."""
        if self._not_null is None:
            table = self.spec.table
            self._not_null = (
                frozenset() if table is None else not_null_columns(cur, table_sql(table))
            )
        return self._not_null

    def read_only(self) -> Self:
        self._settle()
        self._conn.discard()
        self._conn.read_only = True
        return self

    def select_sql(
        self,
        window: ChunkWindow | None,
        columns: Sequence[str],
        as_text: frozenset[str] = frozenset(),
        widened: frozenset[str] = frozenset(),
    ) -> sql.Composed:
        """SELECT of the chunk (every row without a window), to run with ``_params(window)``;
        columns in ``as_text`` are cast to text (for non-Postgres sinks), ``real`` columns in
        ``widened`` to ``double precision`` through their text (``widened_reals``)."""
        items = [
            (
                sql.SQL("{}::text AS {}").format(ident(c, "column"), ident(c, "column"))
                if c in as_text
                else (
                    sql.SQL("{}::text::float8 AS {}").format(ident(c, "column"), ident(c, "column"))
                    if c in widened
                    else ident(c, "column")
                )
            )
            for c in columns
        ]
        return sql.SQL("SELECT {} FROM {}{}").format(
            sql.SQL(", ").join(items), self.relation(window is not None), _where(window)
        )

    def rows(self, window: ChunkWindow | None, batch_rows: int) -> Generator[list[Row], None, None]:
        described = self.describe()
        as_text = frozenset(name for name, oid in described if oid not in _NATIVE)
        query = self.select_sql(window, [name for name, _ in described], as_text)
        self._settle()
        conn = self._conn.get()
        try:
            with conn.transaction(), conn.cursor(name=f"dpone_{uuid.uuid4().hex[:16]}") as cur:
                cur.itersize = batch_rows
                cur.execute(query, _params(window))
                while batch := cur.fetchmany(batch_rows):
                    yield batch
        except psycopg.Error as exc:
            raise self._fail(exc, f"reading {scope_display(window)}") from None

    def checksum(self, window: ChunkWindow | None) -> str:
        described = self.describe()
        self._settle()
        conn = self._conn.get()
        inner = self.select_sql(window, [name for name, _ in described])
        relation = sql.SQL("({}) AS s").format(inner)
        try:
            with conn.cursor() as cur:
                not_null = self._not_null_columns(cur)
                return relation_checksum(
                    cur,
                    relation,
                    described,
                    _params(window),
                    None,
                    not_null,
                    chained=self.chained_checksum,
                )
        except psycopg.Error as exc:
            raise self._fail(exc, f"checksumming {scope_display(window)}") from None

    def copy_into(
        self,
        dst: Cursor,
        dst_copy: sql.Composed | str,
        window: ChunkWindow | None,
        columns: Sequence[str],
        binary: bool,
        block_bytes: int,
    ) -> int:
        """Stream the chunk (every row without a window) into ``dst``'s ``COPY .. FROM STDIN``;
        returns the rows written.

        Source-side failures become DponeError(SOURCE_FAILED); sink-side psycopg errors propagate
        untouched for the sink to classify.
        """
        key = ("copy_out", window.column if window else None, tuple(columns), binary)
        what = f"reading {scope_display(window)}"
        params = _params(window)
        ahead = self._settle((key, params))
        blocks = ahead.take() if ahead is not None else None
        if ahead is not None and blocks is None:  # failed or outgrew the budget: read again
            if ahead.overflowed:
                self._read_ahead_budget = 0
            self._drop(ahead)
            ahead = None
            if self._interrupted:  # the stop's cancel ended it: no second read
                raise DponeError(
                    self.spec.failure_code, f"{self.spec.display()}: {what} was cancelled"
                )
        # the read-ahead's own connection when its blocks are taken: get() could replace it
        conn = self._conn.get() if ahead is None else ahead.connection
        stmt = cached_statement(
            self._statements,
            key,
            conn,
            lambda: sql.SQL("COPY ({}) TO STDOUT (FORMAT {})").format(
                self.select_sql(window, columns), sql.SQL("BINARY" if binary else "TEXT")
            ),
        )
        try:
            with contextlib.ExitStack() as stack:
                if blocks is None:
                    cur = stack.enter_context(conn.cursor())
                    try:
                        stack.enter_context(cur.copy(stmt, params))
                    except psycopg.Error as exc:
                        raise self._fail(exc, what) from None
                    blocks = raw_copy_blocks(conn, block_bytes)
                # A thread writes while this one reads or waits for the read-ahead's blocks
                # (measured: writing here made 2.5x the round trips and no faster).
                with dst.copy(dst_copy, writer=QueuedLibpqWriter(dst)) as sink_copy:
                    while True:
                        try:
                            block = next(blocks, None)
                        except psycopg.Error as exc:
                            raise self._fail(exc, what) from None
                        if block is None:
                            break
                        # a view: psycopg cuts a block into 128 KiB pieces for libpq, and
                        # slices of a bytearray are copies (every byte moved once more, on
                        # the thread that feeds the write); slices of a view are not
                        sink_copy.write(memoryview(block))
        except BaseException:
            if ahead is not None:  # the sink failed mid-stream
                self._drop(ahead)
            raise
        if ahead is not None and not ahead.wait():
            self._conn.discard()
        else:
            self._start_read_ahead(conn, key, stmt, block_bytes, dst.rowcount)
        return dst.rowcount

    def window_checksums(self, windows: Sequence[ChunkWindow]) -> list[str]:
        """Source.checksum of each of the contiguous ``windows``, in one grouped statement."""
        described = self.describe()
        self._settle()
        conn = self._conn.get()
        names = [name for name, _ in described]
        try:
            with conn.cursor() as cur:
                not_null = self._not_null_columns(cur)

                chained = self.chained_checksum

                def each(window: ChunkWindow) -> str:
                    inner = sql.SQL("({}) AS s").format(self.select_sql(window, names))
                    return relation_checksum(
                        cur, inner, described, _params(window), None, not_null, chained=chained
                    )

                table = None if self.spec.table is None else table_sql(self.spec.table)
                return window_checksums(
                    cur, self.relation(True), described, windows, each, not_null, table, chained
                )
        except psycopg.Error as exc:
            raise self._fail(exc, f"checksumming {scope_display(span_of(windows))}") from None

    def _fail(self, exc: BaseException, doing: str) -> DponeError:
        err = translate_error(
            exc, self.spec.failure_code, f"{self.spec.display()}: {doing}", self._conn.current
        )
        self._described = None
        self._not_null = None
        self._conn.forget_if_broken()
        return err

    def interrupt(self) -> None:
        self._interrupted = True
        self._conn.interrupt()

    def close(self) -> None:
        self._next = None
        self._settle()
        self._conn.release()

    def column_types(self) -> dict[str, ColumnType | None]:
        """The moved columns' types as ``format_type`` spells them: the type and modifier the
        server describes for the SELECT (a domain by its base type and modifier)."""
        self._settle()
        conn = self._conn.get()
        select = _columns_sql(self.spec.columns) if self.spec.columns else sql.SQL("dpone_src.*")
        try:
            with conn.cursor() as cur:
                cur.execute(
                    sql.SQL("SELECT {} FROM {} LIMIT 0").format(select, self.relation()), ()
                )
                result = cur.pgresult
                names = [d.name for d in cur.description or []]
                oids = [result.ftype(i) if result else 0 for i in range(len(names))]
                mods = [result.fmod(i) if result else -1 for i in range(len(names))]
                cur.execute(
                    "SELECT format_type(CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid"
                    " END, CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE u.m END)"
                    " FROM unnest(%s::oid[], %s::int4[]) WITH ORDINALITY AS u(o, m, n)"
                    " JOIN pg_type t ON t.oid = u.o ORDER BY u.n",
                    (oids, mods),
                )
                declared = [str(row[0]) for row in cur.fetchall()]
        except psycopg.Error as exc:
            raise self._fail(exc, "describing the column types") from None
        return {name: pg_column_type(text) for name, text in zip(names, declared, strict=True)}


# --- sink -----------------------------------------------------------------------------------------
def _parsed_timestamp(value: object) -> object:
    """Text holding an ISO timestamp as a datetime; anything else (unparsable text too) as is."""
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value)
        except ValueError:
            return value
    return value


def _aware_utc(value: object) -> object:
    value = _parsed_timestamp(value)
    if isinstance(value, dt.datetime) and value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value


def _naive_utc(value: object) -> object:
    value = _parsed_timestamp(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


_COERCERS: dict[int, Callable[[object], object]] = {
    _TIMESTAMPTZ: _aware_utc,
    _TIMESTAMP: _naive_utc,
}
#: Python values a text COPY writes as ``\x`` + hex: kept as bytes by a bytea column only.
_BINARY_VALUES = frozenset({bytes, bytearray, memoryview})
_BYTEA_VALUES = _BINARY_VALUES | {type(None)}


class PostgresSink(Sink):
    """Writes chunks into one Postgres table; see the module docstring for the three paths."""

    kind = "postgres"

    def __init__(self, spec: SinkSpec, dsn: str, options: SinkOptions) -> None:
        super().__init__(spec, dsn, options)
        self._table = table_sql(spec.table)
        for key in spec.keys:
            ident(key, "merge key")
        self._conn = PgConnection(dsn, spec.display())
        self._target: dict[tuple[str, ...], dict[str, int]] = {}
        self._not_null: frozenset[str] | None = None
        self._deferrable: bool | None = None
        self._fence_ready = False
        self._statements: StatementCache = {}
        #: the checksum's form for the current write's source: chained from a Postgres source
        #: (ADR 0027), the joined canonical text from any other; the gate's sibling agrees
        self._chained = False

    # public -------------------------------------------------------------------------------------
    def _transfer(
        self,
        source: Source,
        window: ChunkWindow | None,
        connection: object | None,
        fence: ChunkFence | None,
        isolated: bool = True,
    ) -> ChunkWrite:
        external = self._external(connection)
        columns = self._moved_columns(source, window)
        self._agree(source)
        conn = external or self._conn.get()
        # Our own connection: a transaction. The caller's: a savepoint, unless it rolls back
        # itself on failure (isolated=False, see Sink.write_chunk).
        block = conn.transaction() if external is None or isolated else contextlib.nullcontext()
        try:
            if fence is not None:
                self._ensure_fence_table(conn)
            with block:
                saved = None
                if external is not None and isolated:
                    saved = self._enter_settings(conn)
                elif external is not None:
                    # SET LOCAL ends with the caller's transaction; dpone's own ledger session
                    # set the text forms at connect (mark_text_forms)
                    _bound_lock_waits(conn, text_forms=not has_text_forms(conn))
                with self._read_back(source, window) as gate:
                    if fence is not None:
                        claimed_before = self._claim_fence(conn, fence)
                        fence.refuse_repeated_append(
                            self.spec.display(), self.spec.inner_mode, claimed_before
                        )
                    result = gate.check(self._write(conn, source, window, columns))
                if fence is not None:
                    fault_point("sink_written")
                if saved is not None:
                    self._restore_settings(conn, saved)
            return result
        except Exception as exc:
            self._target.clear()
            self._not_null = None
            self._deferrable = None
            err = translate_error(
                exc,
                errors.SINK_FAILED,
                f"{self.spec.display()}: writing {scope_display(window)} (rolled back)",
                conn,
            )
            if external is None:
                self._conn.forget_if_broken()
            raise err from None

    def preflight(self, window_column: str | None = None) -> list[str]:
        conn = self._conn.get()
        name = self._table.as_string(conn)
        shown = self.spec.table.display()
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT to_regclass(%s)::oid", (name,))
                found = cur.fetchone()
                if found is None or found[0] is None:
                    return [f"target table {shown} does not exist: every chunk will fail"]
                relid = int(found[0])
                cur.execute("SELECT row_security_active(%s)", (relid,))
                hiding = cur.fetchone()
                if hiding is not None and hiding[0]:
                    raise DponeError(
                        errors.PREFLIGHT_FAILED,
                        f"{self.spec.display()}: row-level security applies to the sink's role "
                        "on the target: rows its policies hide would survive a chunk's delete "
                        "and escape the read-back, so the target could differ from the source "
                        "while the run says passed; write as the table's owner or a role with "
                        "BYPASSRLS, or disable row security on the table; no chunk was started",
                    )
                cur.execute(
                    "SELECT attnum, attname FROM pg_attribute"
                    " WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped",
                    (relid,),
                )
                attnames = {int(num): str(att) for num, att in cur.fetchall()}
                cur.execute(
                    "SELECT indkey::text, indnkeyatts, indisunique AND indpred IS NULL"
                    " AND indexprs IS NULL FROM pg_index WHERE indrelid = %s AND indisvalid",
                    (relid,),
                )
                indexes = [
                    ([attnames.get(int(k), "") for k in str(keys).split()][: int(nkey)], bool(u))
                    for keys, nkey, u in cur.fetchall()
                ]
        except psycopg.Error as exc:
            raise translate_error(
                exc, errors.SINK_FAILED, f"{self.spec.display()}: preflight", conn
            ) from None
        return index_warnings(shown, self.spec, window_column, set(attnames.values()), indexes)

    def interrupt(self) -> None:
        self._conn.interrupt()

    def close(self) -> None:
        self._close_read_back()
        self._conn.release()

    def can_write_group(self, source: Source) -> bool:
        """True when write_group can move contiguous windows from ``source`` set-based: inner
        mode replace, a Postgres source (its grouped checksum) and the gate at level checksum
        (levels count and off compare what each chunk's own write read, which one copy of the
        group's span does not tell apart: those groups keep one write a chunk)."""
        return (
            self.spec.inner_mode == "replace"
            and isinstance(source, PostgresSource)
            and self.options.checksum
            and self._gate_level(source) == "checksum"
        )

    def write_group(
        self, source: Source, windows: Sequence[ChunkWindow], connection: object
    ) -> list[ChunkWrite]:
        """A set-based group (ADR 0022) inside the caller's transaction (``connection``, as
        write_chunk with ``isolated=False``): ONE delete and ONE copy of the span of the
        contiguous ``windows``, then each window's read-back in one grouped checksum statement
        on each side, each window gated as write_chunk gates it. Returns each window's write;
        raises (the caller rolls back) when any window's gate refuses, or the rows copied are
        not the rows the windows hold."""
        conn = self._external(connection)
        assert conn is not None and self.can_write_group(source)
        self._agree(source)
        span = span_of(windows)
        try:
            columns = self._moved_columns(source, span)
            _bound_lock_waits(conn, text_forms=not has_text_forms(conn))
            with self._read_back_group(source, windows) as gate:
                options, self.options = self.options, replace(
                    self.options, checksum=False, read_back="off"
                )
                try:
                    copied = self._write(conn, source, span, columns)
                finally:
                    self.options = options
                writes = self._window_read_back(conn, columns, windows, copied)
                return gate.check_all(writes)
        except Exception as exc:
            self._target.clear()
            self._not_null = None
            self._deferrable = None
            raise translate_error(
                exc,
                errors.SINK_FAILED,
                f"{self.spec.display()}: writing {scope_display(span)} (rolled back)",
                conn,
            ) from None

    def _agree(self, source: Source) -> None:
        """The checksum's form for a write from ``source``: chained from a Postgres source,
        which computes that form from now on too (ADR 0027), the joined canonical text from
        any other."""
        self._chained = isinstance(source, PostgresSource)
        if isinstance(source, PostgresSource):
            source.chained_checksum = True

    def _gate_side(self, source: Source) -> tuple[str, Source | None]:
        """The gate's sibling computes the form this write's read-back computes."""
        level, sibling = super()._gate_side(source)
        if isinstance(sibling, PostgresSource):
            sibling.chained_checksum = self._chained
        return level, sibling

    def _window_read_back(
        self,
        conn: Connection,
        columns: tuple[str, ...],
        windows: Sequence[ChunkWindow],
        copied: ChunkWrite,
    ) -> list[ChunkWrite]:
        """Each window's read-back checksum (the target's rows in its range, as _apply_mode
        computes it for one window) from one grouped statement."""
        hashed = self._hashed(columns)
        with conn.cursor() as cur:
            types = self._target_types(cur, columns)
            typed = [(c, types[c]) for c in hashed]
            not_null = self._not_null_columns(cur)
            relation = sql.SQL("{} AS dpone_src").format(self._table)

            def each(window: ChunkWindow) -> str:
                inner = sql.SQL("(SELECT {} FROM {} AS dpone_src{}) AS s").format(
                    _columns_sql(hashed), self._table, _where(window)
                )
                return relation_checksum(
                    cur, inner, typed, _params(window), None, not_null, chained=self._chained
                )

            sums = window_checksums(
                cur, relation, typed, windows, each, not_null, self._table, self._chained
            )
        held = sum(checksum_rows(value) for value in sums)
        if held != copied.rows:
            raise DponeError(
                errors.READ_BACK_MISMATCH,
                f"{self.spec.display()}: read-back of {scope_display(span_of(windows))} differs "
                f"from the source: the write copied {copied.rows} row(s), the target holds "
                f"{held}; the chunk group's transaction was rolled back",
            )
        return [ChunkWrite(checksum_rows(value), value, copied.method) for value in sums]

    # fence --------------------------------------------------------------------------------------
    def _fence_table(self) -> sql.Identifier:
        if self.spec.table.schema is None:
            return sql.Identifier(FENCE_TABLE)
        return sql.Identifier(self.spec.table.schema, FENCE_TABLE)

    def _ensure_fence_table(self, conn: Connection) -> None:
        """Create the fence table beside the target once per sink (a DBA may pre-create it)."""
        if self._fence_ready:
            return
        table = self._fence_table()
        name = table.as_string(conn)
        try:
            with conn.transaction():
                found = conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()
                if found is None or found[0] is None:
                    conn.execute(
                        sql.SQL(
                            "CREATE TABLE IF NOT EXISTS {} (campaign varchar(120) NOT NULL, "
                            "chunk_index bigint NOT NULL, attempt bigint NOT NULL, "
                            "claimed_at timestamptz NOT NULL DEFAULT clock_timestamp(), "
                            "PRIMARY KEY (campaign, chunk_index))"
                        ).format(table)
                    )
        except (
            psycopg.errors.UniqueViolation,
            psycopg.errors.DuplicateTable,
            psycopg.errors.DuplicateObject,  # its row type's name, taken by the other creator
        ):
            pass  # a concurrent creator won the race and committed: the table exists
        except psycopg.Error as exc:
            raise translate_error(
                exc,
                errors.SINK_FAILED,
                f"{self.spec.display()}: creating the fence table {name} (dpone needs CREATE on "
                "the target's schema, or the table created as docs/ledger.md shows)",
                conn,
            ) from None
        self._fence_ready = True

    def _claim_fence(self, conn: Connection, fence: ChunkFence) -> bool:
        """Raise the chunk's fence row to this attempt under its row lock (held to commit); True
        when the row was there already (the upsert updated it: its xmax is set), i.e. an earlier
        attempt's writes committed."""
        limits = session_limits()
        with conn.cursor() as cur:
            try:
                # One round trip: the row inserted is built from the subquery (OFFSET 0 keeps it
                # one) that sets lock_timeout, so the timeout holds before any row-lock wait.
                cur.execute(
                    sql.SQL(
                        "INSERT INTO {} AS f (campaign, chunk_index, attempt) "
                        "SELECT %s::varchar, %s::bigint, %s::bigint "
                        "FROM (SELECT set_config('lock_timeout', %s, true) OFFSET 0) AS t "
                        "ON CONFLICT (campaign, chunk_index) DO UPDATE SET "
                        "attempt = GREATEST(f.attempt, EXCLUDED.attempt), claimed_at = CASE "
                        "WHEN EXCLUDED.attempt > f.attempt THEN clock_timestamp() "
                        "ELSE f.claimed_at END RETURNING attempt, f.xmax::text <> '0'"
                    ).format(self._fence_table()),
                    (fence.campaign, fence.chunk_index, fence.attempt, limits.fence_lock_ms),
                )
            except psycopg.errors.LockNotAvailable:
                raise DponeError(
                    errors.CHUNK_BUSY,
                    f"{self.spec.display()}: chunk {fence.chunk_index}: another transaction "
                    f"holds the chunk's fence row past {limits.fence_lock_s:g}s "
                    "(DPONE_FENCE_LOCK_TIMEOUT); nothing was written",
                ) from None
            row = cur.fetchone()
        stored = int(row[0]) if row else fence.attempt
        if stored > fence.attempt:
            raise fence.superseded(self.spec.display(), stored)
        return bool(row and row[1])

    # paths --------------------------------------------------------------------------------------
    def _write(
        self,
        conn: Connection,
        source: Source,
        window: ChunkWindow | None,
        columns: tuple[str, ...],
    ) -> ChunkWrite:
        with conn.cursor() as cur:
            types = self._target_types(cur, columns)
            if isinstance(source, PostgresSource) and source.same_dsn(self._dsn):
                widened = widened_reals(dict(source.describe()), types)
                select = source.select_sql(window, columns, widened=widened)

                def fill_select(rel: sql.Composable, upsert: bool) -> int:
                    insert = sql.SQL("INSERT INTO {} ({}) {}").format(
                        rel, _columns_sql(columns), select
                    )
                    if upsert:
                        insert = sql.SQL("{} {}").format(insert, self._on_conflict(columns))
                    cur.execute(insert, _params(window))
                    return cur.rowcount

                return self._apply_mode(cur, window, columns, types, fill_select, "insert-select")
            if isinstance(source, PostgresSource):
                src_types = dict(source.describe())
                binary = all(
                    src_types[c] == types[c] and types[c] < FIRST_USER_OID for c in columns
                )
                block = self.options.copy_block_bytes

                def fill_copy(rel: sql.Composable, upsert: bool) -> int:
                    stmt: sql.Composed | str
                    if rel is self._table:  # a stage table has a new name every time
                        stmt = cached_statement(
                            self._statements,
                            ("copy_in", columns, binary),
                            cur.connection,
                            lambda: self._copy_in(rel, columns, binary),
                        )
                    else:
                        stmt = self._copy_in(rel, columns, binary)
                    return source.copy_into(cur, stmt, window, columns, binary, block)

                method = "copy-binary" if binary else "copy-text"
                return self._apply_mode(cur, window, columns, types, fill_copy, method)

            def fill_rows(rel: sql.Composable, upsert: bool) -> int:
                return self._copy_rows(cur, rel, source, window, columns, types)

            return self._apply_mode(cur, window, columns, types, fill_rows, "copy-rows")

    def _apply_mode(
        self,
        cur: Cursor,
        window: ChunkWindow | None,
        columns: tuple[str, ...],
        types: dict[str, int],
        fill: Callable[[sql.Composable, bool], int],
        method: str,
    ) -> ChunkWrite:
        """The inner mode around a ``fill(relation, upsert)`` that loads the rows somewhere.

        The checksum reads the rows back as the target holds them: from the replaced range
        (the whole table for full_refresh); for append the rows the INSERT added, as its
        RETURNING gives them (after the target's defaults and BEFORE triggers: the stage alone
        would not show what a trigger changed); for merge the target's rows whose keys the stage
        carries, after the upsert. COPY cannot upsert, so merge over COPY always goes through
        the stage.
        """
        mode = self.spec.inner_mode
        hashed = self._hashed(columns)
        typed = [(c, types[c]) for c in hashed]
        checksum: str | None = None
        if mode in ("replace", "full_refresh"):
            replaced = window if mode == "replace" else None  # None: every row of the target
            self._delete(cur, replaced)
            rows = fill(self._table, False)
            self._check_deferred(cur)
            if self.options.checksum:

                def inner() -> sql.Composable:
                    return sql.SQL("(SELECT {} FROM {} AS dpone_src{}) AS s").format(
                        _columns_sql(hashed), self._table, _where(replaced)
                    )

                not_null = self._not_null_columns(cur)
                key = ("checksum", replaced.column if replaced else None, tuple(typed), not_null)
                checksum = relation_checksum(
                    cur,
                    inner,
                    typed,
                    _params(replaced),
                    (self._statements, key),
                    not_null,
                    chained=self._chained,
                )
            return ChunkWrite(rows, checksum, method)
        direct_upsert = method == "insert-select"
        if not self.options.checksum and (mode == "append" or direct_upsert):
            rows = fill(self._table, mode == "merge")
            self._check_deferred(cur)
            return ChunkWrite(rows, None, method)
        stage = sql.Identifier(f"dpone_stage_{uuid.uuid4().hex[:16]}")
        cur.execute(
            sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA").format(
                stage, _columns_sql(columns), self._table
            )
        )
        fill(stage, False)
        insert = sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
            self._table, _columns_sql(columns), _columns_sql(columns), stage
        )
        if self.options.checksum and mode == "append":
            # The added rows as the target holds them once the statement's AFTER triggers ran,
            # read by their row versions in a statement of their own: RETURNING shows a row
            # before AFTER triggers, and a row such a trigger changed or deleted is not found
            # here (the gate then counts it missing). The table's oid pins a version to its
            # partition. Only those in the chunk's range count: a row the target moved into
            # another chunk (an accepted narrowing of the chunk column) is missing here too.
            cur.execute(sql.SQL("{} RETURNING ctid::text, tableoid::text").format(insert))
            versions = cur.fetchall()
            self._check_deferred(cur)
            added = sql.SQL(
                "(SELECT {} FROM {} AS dpone_src WHERE ctid = ANY(%s::tid[]) "
                "AND tableoid::text || ':' || ctid::text = ANY(%s::text[]){}) AS dpone_added"
            ).format(_columns_sql(hashed), self._table, _where(window, "AND"))
            params: list[object] = [[v[0] for v in versions], [f"{v[1]}:{v[0]}" for v in versions]]
            params += _params(window) or ()
            checksum = relation_checksum(cur, added, typed, params, chained=self._chained)
            rows = checksum_rows(checksum)
            cur.execute(sql.SQL("DROP TABLE {}").format(stage))
            return ChunkWrite(rows, checksum, method)
        if mode == "merge":
            insert = sql.SQL("{} {}").format(insert, self._on_conflict(columns))
        cur.execute(insert)
        rows = cur.rowcount
        self._check_deferred(cur)
        if self.options.checksum and mode == "merge":
            checksum = relation_checksum(
                cur, self._merged(stage, hashed), typed, chained=self._chained
            )
        cur.execute(sql.SQL("DROP TABLE {}").format(stage))
        return ChunkWrite(rows, checksum, method)

    # statements ---------------------------------------------------------------------------------
    def _merged(self, stage: sql.Composable, columns: Sequence[str]) -> sql.Composed:
        """The target's rows whose merge keys the stage carries (a semi-join: a key repeated in
        the stage still reads its target row once), as a FROM item."""
        on = sql.SQL(" AND ").join(
            sql.SQL("s.{} = t.{}").format(ident(k, "merge key"), ident(k, "merge key"))
            for k in self.spec.keys
        )
        return sql.SQL(
            "(SELECT {} FROM {} AS t WHERE EXISTS (SELECT 1 FROM {} AS s WHERE {})) AS m"
        ).format(
            sql.SQL(", ").join(sql.SQL("t.{}").format(ident(c, "column")) for c in columns),
            self._table,
            stage,
            on,
        )

    def _delete(self, cur: Cursor, window: ChunkWindow | None) -> None:
        """Delete the chunk's range, or (no window) every row of the target.

        Deleting every row first takes SHARE ROW EXCLUSIVE on the target: readers go on seeing the
        old rows until commit, but a concurrent full refresh waits for this one instead of
        deleting the old rows only and then inserting its copy next to this one's. DELETE, not
        TRUNCATE: TRUNCATE's ACCESS EXCLUSIVE lock would block every reader too.
        """
        if window is None:
            cur.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(self._table))
        delete = cached_statement(
            self._statements,
            ("delete", window.column if window else None),
            cur.connection,
            lambda: sql.SQL("DELETE FROM {} AS dpone_src{}").format(self._table, _where(window)),
        )
        cur.execute(delete, _params(window))

    def _on_conflict(self, columns: Sequence[str]) -> sql.Composed:
        keys = self.spec.keys
        updated = [c for c in columns if c not in keys] or [keys[0]]
        sets = sql.SQL(", ").join(
            sql.SQL("{} = EXCLUDED.{}").format(ident(c, "column"), ident(c, "column"))
            for c in updated
        )
        return sql.SQL("ON CONFLICT ({}) DO UPDATE SET {}").format(_columns_sql(keys), sets)

    def _copy_in(self, rel: sql.Composable, columns: Sequence[str], binary: bool) -> sql.Composed:
        fmt = sql.SQL("BINARY" if binary else "TEXT")
        return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT {})").format(
            rel, _columns_sql(columns), fmt
        )

    def _copy_rows(
        self,
        cur: Cursor,
        rel: sql.Composable,
        source: Source,
        window: ChunkWindow | None,
        columns: tuple[str, ...],
        types: dict[str, int],
    ) -> int:
        """Rows from another kind of database, as text COPY (the server parses every type)."""
        coercers = [
            (i, _COERCERS[types[c]]) for i, c in enumerate(columns) if types[c] in _COERCERS
        ]
        accepted = self.options.accept_narrowing
        guards = [(i, c, types[c] == _BYTEA) for i, c in enumerate(columns) if c not in accepted]
        count = 0
        with (
            contextlib.closing(source.rows(window, self.options.batch_rows)) as batches,
            cur.copy(self._copy_in(rel, columns, binary=False)) as copy,
        ):
            for batch in batches:
                self._check_kinds(batch, guards, window)
                for row in batch:
                    values: Sequence[object] = row
                    if coercers:
                        coerced = list(row)
                        for i, fn in coercers:
                            coerced[i] = fn(coerced[i])
                        values = coerced
                    try:
                        copy.write_row(values)
                    except psycopg.DataError as exc:
                        if exc.sqlstate is None:  # refused by psycopg, before the server
                            raise self._unwritable(values, columns, window) from None
                        raise
                count += len(batch)
        return count

    def _unwritable(
        self, values: Sequence[object], columns: Sequence[str], window: ChunkWindow | None
    ) -> DponeError:
        """The row psycopg could not write, named by its column and never by its value: a NUL
        character is the one text value Postgres cannot store."""
        what = f"{self.spec.display()}: writing {scope_display(window)} (rolled back)"
        for name, value in zip(columns, values, strict=True):
            if isinstance(value, str) and "\x00" in value:
                return DponeError(
                    errors.SINK_FAILED,
                    f"{what}: column {name!r}: a text value holds a NUL character (0x00), "
                    "which Postgres text cannot store; remove it at the source or in a query",
                )
        return DponeError(errors.SINK_FAILED, f"{what}: the driver refused a value of a row")

    def _check_kinds(
        self,
        batch: Sequence[Row],
        guards: Sequence[tuple[int, str, bool]],
        window: ChunkWindow | None,
    ) -> None:
        """DPONE_SINK_FAILED for bytes bound for any column but bytea, or anything but bytes
        for a bytea column (``guards``: position, name, is bytea). Text COPY writes bytes as
        their ``\\x`` hex text, which a text column keeps as text and the checksum (bytes are
        ``\\x`` + hex there too) cannot tell from the bytes; and the server reads text bound for
        bytea as a bytea literal (``'\\x41'`` is one byte). Each column's value types of the
        batch are collected at C speed, never a value named."""
        for i, name, into_bytea in guards:
            seen = set(map(type, map(itemgetter(i), batch)))
            wrong = seen - _BYTEA_VALUES if into_bytea else seen & _BINARY_VALUES
            if not wrong:
                continue
            if into_bytea:
                kinds = ", ".join(sorted(kind.__name__ for kind in wrong))
                why = (
                    f"the source sent {kinds} values for a bytea column: Postgres would read "
                    "them as bytea literals (the text '\\x41' is one byte), not keep them"
                )
            else:
                why = (
                    "the source sent binary values (bytes) for a column that is not bytea: "
                    "Postgres would store their \\x hex text, which the read-back checksum "
                    "cannot tell from the bytes"
                )
            raise DponeError(
                errors.SINK_FAILED,
                f"{self.spec.display()}: writing {scope_display(window)} (rolled back): column "
                f"{name!r}: {why}; change the target column's type, or list {name!r} in "
                "sink.accept_narrowing to store what Postgres makes of them",
            )

    def _target_types(self, cur: Cursor, columns: tuple[str, ...]) -> dict[str, int]:
        """Type oid of each moved column in the target (base type for domains), cached."""
        types = self._target.get(columns)
        if types is None:
            cur.execute(
                sql.SQL("SELECT {} FROM {} LIMIT 0").format(_columns_sql(columns), self._table)
            )
            types = {d.name: int(d.type_code) for d in cur.description or []}
            self._target[columns] = types
        return types

    def _not_null_columns(self, cur: Cursor) -> frozenset[str]:
        """The target's NOT NULL columns, cached: the checksum's short form for them."""
        if self._not_null is None:
            self._not_null = not_null_columns(cur, self._table)
        return self._not_null

    def _check_deferred(self, cur: Cursor) -> None:
        """Run the target's deferred checks now, once the chunk's rows are written: a deferred
        constraint then fails this write (named, rolled back, recorded) instead of the COMMIT
        the chunk may share with its ledger record, and the read-back gate reads the rows as a
        deferred constraint trigger leaves them. Only targets that have such checks pay the
        statement (the catalog is asked once)."""
        if self._deferrable is None:
            self._deferrable = has_deferrable_checks(cur, self._table)
        if self._deferrable:
            cur.execute("SET CONSTRAINTS ALL IMMEDIATE")

    # transactions -------------------------------------------------------------------------------
    def _external(self, connection: object | None) -> Connection | None:
        if connection is None:
            return None
        if not isinstance(connection, psycopg.Connection):
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"{self.spec.display()}: the external connection must be a psycopg Connection",
            )
        if connection.info.transaction_status != pq.TransactionStatus.INTRANS:
            raise DponeError(
                errors.CONNECTOR_INVALID,
                f"{self.spec.display()}: the external connection must be inside an open "
                "transaction (the caller commits data and completion together)",
            )
        return connection

    @staticmethod
    def _enter_settings(conn: Connection) -> tuple[object, ...]:
        """SET LOCAL dpone's settings inside the caller's transaction; returns the old values.

        One round trip: the subquery (OFFSET 0 keeps it one) reads the old values before the
        set_config calls of the row built from it run."""
        n = len(TEXT_FORM_SETTINGS)
        with conn.cursor() as cur:
            cur.execute(
                sql.SQL("SELECT old.*, {} FROM (SELECT {} OFFSET 0) AS old").format(
                    sql.SQL(", ").join(sql.SQL("set_config(%s, %s, true)") for _ in range(n)),
                    sql.SQL(", ").join(sql.SQL("current_setting(%s)") for _ in range(n)),
                ),
                [
                    *(v for pair in TEXT_FORM_SETTINGS for v in pair),
                    *(name for name, _ in TEXT_FORM_SETTINGS),
                ],
            )
            row = cur.fetchone() or ()
        return tuple(row[:n])

    @staticmethod
    def _restore_settings(conn: Connection, saved: Sequence[object]) -> None:
        with conn.cursor() as cur:
            _set_local(cur, saved)


def _bound_lock_waits(conn: Connection, text_forms: bool) -> None:
    """In the caller's (the ledger's) transaction, before the chunk's rows move: lock waits
    end at DPONE_FENCE_LOCK_TIMEOUT (a row of the range locked by another session: the chunk
    is busy, translate_error), not at the ledger's chunk-lock wait; and the text forms, when
    the session does not hold them. One round trip."""
    settings = [("lock_timeout", session_limits().fence_lock_ms)]
    if text_forms:
        settings += list(TEXT_FORM_SETTINGS)
    with conn.cursor() as cur:
        cur.execute(
            sql.SQL("SELECT {}").format(
                sql.SQL(", ").join(sql.SQL("set_config(%s, %s, true)") for _ in settings)
            ),
            [v for pair in settings for v in pair],
        )


def _set_local(cur: Cursor, values: Sequence[object]) -> None:
    cur.execute(
        sql.SQL("SELECT {}").format(
            sql.SQL(", ").join(sql.SQL("set_config(%s, %s, true)") for _ in TEXT_FORM_SETTINGS)
        ),
        [
            v
            for (name, _), value in zip(TEXT_FORM_SETTINGS, values, strict=True)
            for v in (name, value)
        ],
    )


# --- set-based groups (ADR 0022) ------------------------------------------------------------------
def _slot_sql(
    column: sql.Composable, lowers: Sequence[object]
) -> tuple[sql.Composable, list[object]]:
    """The 0-based index of the window a row falls in, given the windows' lower bounds in order
    (the rows are already inside the span): a binary tree of CASE, log2(n) comparisons a row,
    each the per-chunk predicate's ``>=`` with the bound as an untyped parameter, so a row lands
    in exactly the chunk whose own predicate selects it. Returns the expression and its
    parameters in the order they appear in it."""

    def build(lo: int, hi: int) -> tuple[str, list[object]]:
        if lo == hi:
            return str(lo), []
        mid = (lo + hi + 1) // 2
        upper, up = build(mid, hi)
        lower, low = build(lo, mid - 1)
        return f"CASE WHEN {{0}} >= %s THEN {upper} ELSE {lower} END", [lowers[mid], *up, *low]

    # composed as text first, the column put in by one format: a group's tree has a node per
    # chunk, and composing each node on its own cost a set-based group more than its ledger work
    template, params = build(0, len(lowers) - 1)
    return sql.SQL(template).format(column), params


def span_of(windows: Sequence[ChunkWindow]) -> ChunkWindow:
    """The window covering contiguous ``windows`` (each one's upper bound the next's lower)."""
    first, last = windows[0], windows[-1]
    return ChunkWindow(first.column, first.type, first.lower, last.upper)


#: chunk column types whose group bounds bind as one typed array each (``text[]`` cast to the
#: element type: the same input function that types a window's own bounds from the column)
_BOUND_ARRAYS = {_DATE: "date", _TIMESTAMP: "timestamp", _TIMESTAMPTZ: "timestamptz"}
_BOUND_ARRAYS |= dict.fromkeys((20, 21, 23), "int8")
_INT8_RANGE = range(-(1 << 63), 1 << 63)
_INDEXED: weakref.WeakKeyDictionary[Connection, dict[tuple[str, str], str | None]] = (
    weakref.WeakKeyDictionary()
)


def indexed_bound_type(cur: Cursor, table: sql.Composable, column: str) -> str | None:
    """The element type a group's window bounds bind as when ``table`` has a valid, whole-table
    btree index led by the chunk ``column`` of a date, timestamp or integer type; else None
    (asked once per connection and table). Only then does each window cost an index range
    scan of its own rows: without such an index a window would scan the table."""
    known = _INDEXED.setdefault(cur.connection, {})
    name = table.as_string(cur.connection)
    if (name, column) not in known:
        cur.execute(
            "SELECT a.atttypid::int FROM pg_attribute a WHERE a.attrelid = to_regclass(%s)"
            " AND a.attname = %s AND NOT a.attisdropped AND EXISTS (SELECT 1 FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam"
            " WHERE i.indrelid = a.attrelid AND i.indkey[0] = a.attnum AND i.indisvalid"
            " AND i.indpred IS NULL AND am.amname = 'btree')",
            (name, column),
        )
        found = cur.fetchone()
        known[(name, column)] = _BOUND_ARRAYS.get(int(found[0])) if found else None
    return known[(name, column)]


def _per_window_sums(
    cur: Cursor,
    relation: sql.Composable,
    columns: Sequence[tuple[str, int]],
    windows: Sequence[ChunkWindow],
    element: str,
    not_null: Collection[str],
    chained: bool,
) -> list[tuple[Any, ...]] | None:
    """(slot, count, sum) of each window, each from its own range predicate over the chunk
    column's index inside one statement: no per-row slot and no hash aggregate (measured on
    170 hourly windows: the grouped form cost 40% over one plain checksum of the span, this
    one 8%). None when a bound does not fit the element type."""
    lowers = [w.lower for w in windows]
    uppers = [w.upper for w in windows]
    if element == "int8" and not all(b in _INT8_RANGE for b in (*lowers, uppers[-1])):
        return None
    col = sql.Identifier("dpone_src", windows[0].column)
    inner = sql.SQL(
        "(SELECT {} FROM {} WHERE {} >= dpone_windows.lo AND {} < dpone_windows.hi) AS s"
    ).format(_columns_sql([name for name, _ in columns]), relation, col, col)
    array = sql.SQL("%s::text[]::{}[]").format(sql.SQL(element))
    cur.execute(
        sql.SQL(
            "SELECT dpone_windows.i - 1, c.n, c.s FROM unnest({}, {}) WITH ORDINALITY AS"
            " dpone_windows(lo, hi, i) CROSS JOIN LATERAL (SELECT count(*) AS n, sum({}) AS s"
            " FROM {}) AS c"
        ).format(array, array, row_hash_sql(columns, not_null, chained), inner),
        [[str(b) for b in lowers], [str(b) for b in uppers]],
    )
    return cur.fetchall()


def _grouped_sums(
    cur: Cursor,
    relation: sql.Composable,
    columns: Sequence[tuple[str, int]],
    windows: Sequence[ChunkWindow],
    not_null: Collection[str],
    chained: bool,
) -> list[tuple[Any, ...]]:
    """(slot, count, sum) of each window holding rows, from one scan of the span whose rows
    are put in their window by a per-row slot expression (see _slot_sql)."""
    span = span_of(windows)
    slot, slot_params = _slot_sql(
        sql.Identifier("dpone_src", windows[0].column), [w.lower for w in windows]
    )
    inner = sql.SQL("(SELECT {}, {} AS dpone_window_slot FROM {}{}) AS s").format(
        _columns_sql([name for name, _ in columns]), slot, relation, _where(span)
    )
    cur.execute(
        sql.SQL("SELECT dpone_window_slot, count(*), sum({}) FROM {} GROUP BY 1").format(
            row_hash_sql(columns, not_null, chained), inner
        ),
        [*slot_params, span.lower, span.upper],
    )
    return cur.fetchall()


def window_checksums(
    cur: Cursor,
    relation: sql.Composable,
    columns: Sequence[tuple[str, int]],
    windows: Sequence[ChunkWindow],
    each: Callable[[ChunkWindow], str],
    not_null: Collection[str] = (),
    table: sql.Composable | None = None,
    chained: bool = False,
) -> list[str]:
    """The checksum of each of the contiguous ``windows`` over ``relation`` (a FROM item aliased
    dpone_src), in ONE statement: each value is what relation_checksum gives for that window
    alone (same row hash, same sum, same format). Where ``table`` (the relation's table, None
    for a query) has an index on the chunk column, each window sums its own range; else one
    scan of the span groups its rows by window. Without the server-side hash, ``each``
    computes them one window at a time."""
    if not sql_checksum_supported(cur):
        return [each(window) for window in windows]
    element = None if table is None else indexed_bound_type(cur, table, windows[0].column)
    rows = None
    if element is not None:
        rows = _per_window_sums(cur, relation, columns, windows, element, not_null, chained)
    if rows is None:
        rows = _grouped_sums(cur, relation, columns, windows, not_null, chained)
    found = {int(row[0]): checksum_value(row[1:], chained)[1] for row in rows}
    empty = format_checksum(0, 0, checksum_scheme(chained))
    return [found.get(i, empty) for i in range(len(windows))]
