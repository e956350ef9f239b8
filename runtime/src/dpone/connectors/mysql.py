"""MySQL / MariaDB source and sink on PyMySQL (pure Python, the ``mysql`` extra).

Reads stream through an unbuffered server-side cursor (``SSCursor``), so a chunk never sits whole
in memory. Writes load each batch with ``LOAD DATA LOCAL INFILE`` from a private temporary file
(faster than PyMySQL's multi-row ``executemany`` here, see docs/benchmarks.md); a batch holding
binary values, or every batch once a server refuses ``LOCAL`` (``local_infile=OFF``), goes through
``executemany`` instead. ``LOCAL`` turns data errors into warnings on the server, so every load
checks ``@@warning_count`` and fails the chunk on any warning: a truncated value or a skipped
duplicate never commits silently. When source and sink share a server and account (a source table
in any database of it) the chunk is copied with ``INSERT .. SELECT`` and never leaves the server.
Merge stages the chunk in a ``TEMPORARY`` table and runs ``INSERT .. SELECT .. ON DUPLICATE KEY
UPDATE``. A fenced write claims the chunk's ``dpone_chunk_fence`` row first (the contract of
:class:`dpone.connectors.base.ChunkFence`); a deadlock runs the chunk's transaction again.

MySQL cannot compute dpone's row hash in SQL, so the checksum is computed in Python over the rows
read back inside the chunk's transaction (:class:`dpone.connectors.base.RowChecksum`), which makes
it equal to every other connector's for the same rows. Sessions run in UTC with a fixed, strict
``sql_mode``; the sink takes its lock wait, idle and statement limits and TCP keepalive from
:mod:`dpone.lifecycle.session_limits`, so a lost pod's transaction and row locks go away in bounded time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import decimal
import math
import os
import random
import re
import socket
import tempfile
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import field
from typing import Any, Self
from urllib.parse import parse_qsl, unquote, urlsplit

import pymysql
import pymysql.converters
import pymysql.cursors
from pymysql.constants import FIELD_TYPE

from dpone import errors
from dpone.connectors import base, sql_base
from dpone.connectors.column_types import ColumnType
from dpone.connectors.dialect_types import MY_JSON, mysql_column_type
from dpone.credentials.connections import current_dsn
from dpone.credentials.dsn_settings import missing_file
from dpone.errors import DponeError
from dpone.lifecycle.session_limits import SessionLimits, session_limits
from dpone.records import record

MAX_IDENTIFIER_CHARS = 64  # longer names are refused by the server
DEFAULT_PORT = 3306
#: Every session: UTC for TIMESTAMP columns, strict data checks, backslash escapes (PyMySQL's
#: literal quoting relies on them) and no ANSI_QUOTES (identifiers are `backticked`).
SESSION_SQL = (
    "SET time_zone = '+00:00', "
    "sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION,ERROR_FOR_DIVISION_BY_ZERO'"
)
#: Sink sessions also bound row-lock waits (the fence's CHUNK_BUSY: DPONE_FENCE_LOCK_TIMEOUT) and
#: idle time (DPONE_DB_IDLE_TIMEOUT: the server rolls back a lost client's open transaction).
SINK_SESSION_SQL = "SET innodb_lock_wait_timeout = {lock}, wait_timeout = {idle}"
#: MariaDB only: a statement limit (DPONE_DB_STATEMENT_TIMEOUT, 0 = none).
MARIADB_STATEMENT_SQL = "SET max_statement_time = {seconds}"
_PING_AFTER_S = 60.0
_DSN_OPTIONS = frozenset(
    {"connect_timeout", "unix_socket", "ssl_ca", "ssl_cert", "ssl_key", "ssl_verify_cert"}
)
_INT_OPTIONS = frozenset({"connect_timeout"})
#: options naming a file the TLS set-up reads at connect (a missing one never heals)
_FILE_OPTIONS = frozenset({"ssl_ca", "ssl_cert", "ssl_key"})
#: Connection-level error numbers: client 20xx, and the server's shutdown/killed notices.
_CONNECTION_LOSS = frozenset({0, 1053, 1077, 1152, 1927, 2002, 2003, 2006, 2013, 2055, 4031})
_LOCK_WAIT_TIMEOUT, _DEADLOCK = 1205, 1213
#: ER_DUP_ENTRY: a key the table already holds (an error, or a row LOAD DATA LOCAL skips)
_DUPLICATE_KEY = 1062
#: ER_NET_PACKET_TOO_LARGE: a statement over the server's max_allowed_packet (the server then
#: closes the connection, or resets it while the client is still sending: error 2006/2013).
_PACKET_TOO_LARGE = 1153
DEADLOCK_RETRIES = 3
#: LOAD DATA LOCAL refused by the server (local_infile=OFF, MySQL 8's default) or the client.
_LOCAL_INFILE_REFUSED = frozenset({1148, 2068, 3948, 4166})  # 4166: MariaDB
#: Server errors whose text names only objects (tables, columns, keys), never row values.
_SAFE_MESSAGE = frozenset({1046, 1048, 1049, 1051, 1054, 1091, 1136, 1146, 1364, 1406, 1205, 1213})
_KEY_NAME = re.compile(r"for key '([^']{1,200})'$")
_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\x00": "\\0"})


# --- DSNs -----------------------------------------------------------------------------------------
@record
class MysqlDsn:
    """``mysql://user:password@host:port/database?option=value`` (``mariadb://`` too), parsed.

    ``password`` is exposed so a redaction registry can learn it; it never enters a message.
    """

    host: str
    port: int
    user: str | None
    password: str | None = field(repr=False)
    database: str | None
    options: tuple[tuple[str, str], ...] = ()

    def connect_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {"host": self.host, "port": self.port, "connect_timeout": 30}
        if self.user is not None:
            args["user"] = self.user
        if self.password is not None:
            args["password"] = self.password
        if self.database:
            args["database"] = self.database
        ssl: dict[str, Any] = {}
        for key, value in self.options:
            if key.startswith("ssl_"):
                ssl[key[4:]] = (
                    value.lower() not in ("0", "false") if key == "ssl_verify_cert" else value
                )
            else:
                args[key] = int(value) if key in _INT_OPTIONS else value
        if ssl:
            args["ssl"] = ssl
        return args


def parse_dsn(dsn: str) -> MysqlDsn:
    """The parts of a MySQL DSN; CONFIG_INVALID (naming the part, never its value) if malformed."""
    try:
        parts = urlsplit(dsn.strip())
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise DponeError(errors.CONFIG_INVALID, "the MySQL DSN is malformed (bad port)") from None
    if parts.scheme.lower() not in ("mysql", "mariadb"):
        raise DponeError(errors.CONFIG_INVALID, "a MySQL DSN starts with mysql:// or mariadb://")
    database = unquote(parts.path.lstrip("/"))
    if "/" in database:
        raise DponeError(errors.CONFIG_INVALID, "the MySQL DSN's path is one database name")
    options: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key not in _DSN_OPTIONS:
            known = ", ".join(sorted(_DSN_OPTIONS))
            raise DponeError(
                errors.CONFIG_INVALID, f"unknown MySQL DSN option {key!r} (known: {known})"
            )
        if key in _INT_OPTIONS and not value.isdigit():
            raise DponeError(errors.CONFIG_INVALID, f"MySQL DSN option {key!r} must be a number")
        options.append((key, value))
    return MysqlDsn(
        host=parts.hostname or "127.0.0.1",
        port=port,
        user=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
        database=database or None,
        options=tuple(options),
    )


def dsn_secrets(dsn: str) -> tuple[str, ...]:
    """The secret parts of a MySQL DSN (its password), for a redaction registry."""
    password = parse_dsn(dsn).password
    return (password,) if password else ()


# --- identifiers, values --------------------------------------------------------------------------
class MysqlDialect(sql_base.SqlDialect):
    """MySQL names: `backticked` with embedded backticks doubled; ``%s`` markers; timestamps
    bound as 'YYYY-MM-DD HH:MM:SS' (MySQL rejects the 'Z'); no parameters at all without a
    window (PyMySQL then leaves a trusted query's '%' alone)."""

    alias = "`dpone_src`"
    marker = "%s"
    schema_word = "database"
    opening = closing = "`"
    max_chars = MAX_IDENTIFIER_CHARS
    no_params = None

    @classmethod
    def quote(cls, name: str, what: str) -> str:
        """Names over 64 characters, or ending with a space, are refused."""
        quoted = super().quote(name, what)
        if name.endswith(" "):
            raise DponeError(
                errors.IDENTIFIER_INVALID, f"{what}: MySQL names cannot end with a space"
            )
        return quoted

    @classmethod
    def read_columns_sql(
        cls, columns: Sequence[str], floats: Collection[str], prefix: str = ""
    ) -> str:
        """The SELECT list that reads ``columns`` as values: a FLOAT widened to a DOUBLE, which
        holds its exact value (MariaDB's text protocol sends a FLOAT with 6 significant digits,
        so 16777216 would be read, moved and checked as 16777200)."""
        listed = []
        for column in columns:
            name = cls.quote(column, "column")
            listed.append(
                f"({prefix}{name} + 0E0) AS {name}" if column in floats else prefix + name
            )
        return ", ".join(listed)


quote = MysqlDialect.quote
_columns_sql = MysqlDialect.columns_sql


def float_columns(description: Any) -> frozenset[str]:
    """The single-precision FLOAT columns of a cursor's description."""
    return frozenset(str(d[0]) for d in description or () if d[1] == FIELD_TYPE.FLOAT)


def single_floats(row: Sequence[Any], positions: Sequence[int]) -> tuple[Any, ...]:
    """``row`` with the values at ``positions`` (FLOAT columns read as DOUBLE) made singles."""
    out = list(row)
    for i in positions:
        out[i] = base.single_precision(out[i])
    return tuple(out)


def _time_value(raw: bytes | str) -> object:
    """TIME as a time of day (as Postgres and SQLite hold it); a duration outside a day as text."""
    text = raw.decode("ascii") if isinstance(raw, bytes) else raw
    try:
        return dt.time.fromisoformat(text)
    except ValueError:
        return text


def _decoders() -> dict[Any, Any]:
    conv = dict(pymysql.converters.conversions)
    conv[FIELD_TYPE.TIME] = _time_value
    return conv


def to_mysql(value: object) -> object:
    """A value from another database as PyMySQL binds it (DATETIME is zone-less UTC)."""
    value = sql_base.zoneless_utc(value)
    return str(value) if isinstance(value, uuid.UUID) else value


class BinaryValue(Exception):
    """A batch holds bytes, which the text file of LOAD DATA cannot carry."""


class PacketTooLarge(Exception):
    """A statement the server would refuse as over its ``max_allowed_packet``; raised before it
    is sent, since the server answers one by dropping the connection (as error 1153, 2006 or
    2013, depending on how much it had read), which no retry can fix."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(size, limit)
        self.size = size
        self.limit = limit


def tsv_field(value: object) -> str:
    """One value in LOAD DATA's default text format (tab-separated, backslash escapes)."""
    if value is None:
        return "\\N"
    if isinstance(value, str):
        return value.translate(_TSV_ESCAPES)
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, decimal.Decimal):
        return base.canonical_decimal(value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        raise BinaryValue
    return str(value).translate(_TSV_ESCAPES)


# --- errors ---------------------------------------------------------------------------------------
def _errno(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def describe_error(exc: BaseException) -> str:
    """Error class and MySQL error number; the server's text only where it names no row value."""
    number = _errno(exc)
    text = type(exc).__name__ + (f" (MySQL error {number})" if number is not None else "")
    message = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], str) else ""
    if number in _SAFE_MESSAGE and message:
        return f"{text}: {message[:300]}"
    found = _KEY_NAME.search(message) if number == 1062 else None
    if found:
        return f"{text}: duplicate entry for key '{found.group(1)}'"
    return text


def _is_connection_loss(exc: BaseException) -> bool:
    if isinstance(exc, pymysql.err.InterfaceError):
        return True
    number = _errno(exc)
    return isinstance(exc, pymysql.err.OperationalError) and (
        number in _CONNECTION_LOSS or (number is not None and 2000 <= number < 3000)
    )


def _connect_reason(exc: BaseException) -> str:
    """A coarse, secret-free reason for a failed connect (the server's text names the user)."""
    number = _errno(exc)
    reasons = {
        1045: "authentication failed",
        1044: "access denied to the database",
        1049: "database does not exist",
        1040: "too many connections",
        2003: "connection refused or timed out",
        2005: "unknown host",
    }
    return reasons.get(number or -1, f"server unreachable (MySQL error {number})")


def _keepalive(conn: Any, limits: SessionLimits) -> None:
    """Client TCP keepalive and user timeout on PyMySQL's socket (Linux options when present), so
    a silent network loss ends a blocked read in bounded time."""
    sock = getattr(conn, "_sock", None)
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", limits.keepalive_idle_s),
            ("TCP_KEEPINTVL", limits.keepalive_interval_s),
            ("TCP_KEEPCNT", limits.keepalive_count),
            ("TCP_USER_TIMEOUT", int(limits.tcp_user_timeout_s * 1000)),
        ):
            option = getattr(socket, name, None)
            if option is not None and value:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


class MysqlConnection(sql_base.DriverConnection["pymysql.connections.Connection[Any]"]):
    """A lazily (re)opened PyMySQL connection with dpone's session settings; each open reads the
    connection's DSN again (``current_dsn``), so a rotated password is used without a restart."""

    def __init__(self, dsn: str, label: str, *, sink: bool) -> None:
        super().__init__(label)
        self._given_dsn = dsn
        self._sink = sink
        self.local_infile = sink  # LOAD DATA LOCAL, for sinks
        self.read_only = False  # sessions refuse writes (SET SESSION TRANSACTION READ ONLY)
        limits = session_limits()
        self.lock_timeout_s = max(1, math.ceil(limits.fence_lock_s))
        self.idle_timeout_s = max(1, math.ceil(limits.idle_in_transaction_s))
        self._limits = limits
        self.dsn = self._parsed(dsn)
        self._used = 0.0
        #: the open session's max_allowed_packet (None: not read yet on this connection)
        self.packet_limit: int | None = None

    def _parsed(self, dsn: str) -> MysqlDsn:
        try:
            parsed = parse_dsn(dsn)
        except DponeError as exc:
            raise DponeError(exc.code, f"{self._label}: {exc.message}") from None
        for key, value in parsed.options:
            if key in _FILE_OPTIONS and not os.path.isfile(value):
                raise missing_file(self._label, f"option {key!r}")
        return parsed

    def get(self) -> pymysql.connections.Connection[Any]:
        """The connection, pinged first when it sat idle (a dead one is reopened)."""
        conn = self.current
        ping_after = min(_PING_AFTER_S, self.idle_timeout_s / 2) if self._sink else _PING_AFTER_S
        if conn is not None and time.monotonic() - self._used > ping_after:
            try:
                conn.ping(reconnect=False)
            except pymysql.err.Error:
                self.discard()
        conn = super().get()
        self._used = time.monotonic()
        return conn

    def max_packet(self, conn: pymysql.connections.Connection[Any]) -> int:
        """The session's ``max_allowed_packet``, read once per connection (only a batched insert
        sends a statement as large as a row: LOAD DATA LOCAL sends its file in 16 KB packets)."""
        if self.packet_limit is None:
            with conn.cursor() as cur:
                cur.execute("SELECT @@max_allowed_packet")
                found = cur.fetchone()
            self.packet_limit = int(found[0]) if found else 16 * 1024 * 1024
        return self.packet_limit

    def drop_if_unusable(self) -> None:
        """Drop the connection when a failed chunk left it dead (the server closes it after some
        errors, e.g. 1153, and PyMySQL only notices on the next statement): the next chunk then
        opens a fresh one instead of failing on the dead session."""
        conn = self.current
        if conn is None:
            return
        if not conn.open:
            self.discard()
            return
        try:
            conn.ping(reconnect=False)
        except pymysql.err.Error:
            self.discard()
        else:
            self._used = time.monotonic()

    def open(self) -> pymysql.connections.Connection[Any]:
        self.dsn = self._parsed(current_dsn(self._given_dsn))
        self.packet_limit = None
        args = self.dsn.connect_args()
        try:
            conn = pymysql.connect(
                **args,
                charset="utf8mb4",
                autocommit=True,
                local_infile=self.local_infile,
                conv=_decoders(),
            )
            _keepalive(conn, self._limits)
            with conn.cursor() as cur:
                cur.execute(SESSION_SQL)
                if self.read_only:  # autocommit statements too: a write fails (error 1792)
                    cur.execute("SET SESSION TRANSACTION READ ONLY")
                if self._sink:
                    cur.execute(
                        SINK_SESSION_SQL.format(
                            lock=int(self.lock_timeout_s), idle=int(self.idle_timeout_s)
                        )
                    )
                if "mariadb" in conn.get_server_info().lower():
                    seconds = max(0.0, self._limits.statement_s)
                    cur.execute(MARIADB_STATEMENT_SQL.format(seconds=f"{seconds:g}"))
        except pymysql.err.Error as exc:
            raise self.unreachable(_connect_reason(exc)) from None
        return conn

    @property
    def driver_error(self) -> type[BaseException]:
        error: type[BaseException] = pymysql.err.Error
        return error

    describe = staticmethod(describe_error)
    connection_lost = staticmethod(_is_connection_loss)

    def interrupt(self) -> None:
        """KILL QUERY the statement in flight from a second connection (thread-safe); the writing
        thread then sees an error and rolls back."""
        conn = self.current
        if conn is None:
            return
        with contextlib.suppress(Exception):
            thread_id = conn.thread_id()
            killer = pymysql.connect(
                **{**self.dsn.connect_args(), "connect_timeout": 5}, autocommit=True
            )
            try:
                with killer.cursor() as cur:
                    cur.execute("KILL QUERY %s", (int(thread_id),))
            finally:
                killer.close()


# --- source ---------------------------------------------------------------------------------------
class MysqlSource(sql_base.SqlSource["pymysql.connections.Connection[Any]"]):
    """A table or trusted query in MySQL/MariaDB, streamed chunk by chunk (autocommit reads)."""

    kind = "mysql"
    dialect = MysqlDialect
    db: MysqlConnection

    def connection(self, dsn: str, label: str) -> MysqlConnection:
        return MysqlConnection(dsn, label, sink=False)

    def probe_sql(self, select: str) -> str:
        return f"SELECT {select} FROM {self.relation(False)} LIMIT 0"

    def cursor(self, conn: pymysql.connections.Connection[Any]) -> Any:
        return conn.cursor(pymysql.cursors.SSCursor)  # streamed: a chunk never sits in memory

    def relation(self, parameters: bool = True) -> str:
        """The FROM item aliased dpone_src; a trusted query's '%' are doubled when parameters are
        sent (PyMySQL formats the statement with '%' placeholders)."""
        if self.spec.table is not None:
            return MysqlDialect.table_sql(self.spec.table) + " AS `dpone_src`"
        query = base.strip_query(self.spec.query or "")
        if parameters:
            query = query.replace("%", "%%")
        return f"({query}) AS `dpone_src`"

    def select_sql(
        self, window: base.Scope, columns: Sequence[str], qualified: bool = False
    ) -> str:
        """SELECT of the chunk (every row without a window), to run with ``MysqlDialect.params(window)``;
        ``qualified`` names the table's database, for a statement on another connection."""
        relation = self.relation(window is not None)
        if qualified:
            assert self.spec.table is not None and self.db.dsn.database is not None
            table = base.TableRef(
                self.spec.table.schema or self.db.dsn.database, self.spec.table.name
            )
            relation = MysqlDialect.table_sql(table) + " AS `dpone_src`"
        listed = MysqlDialect.read_columns_sql(columns, self._floats())
        return f"SELECT {listed} FROM {relation}{MysqlDialect.where(window)}"

    def _floats(self) -> list[str]:
        self.columns()  # described: which columns are FLOAT
        return [name for name, code in self.type_codes.items() if code == FIELD_TYPE.FLOAT]

    def batch(self, fetched: Sequence[Any]) -> list[base.Row]:
        """FLOAT values (read as DOUBLE) as their shortest single-precision decimal."""
        floats = set(self._floats())
        positions = [i for i, name in enumerate(self.columns()) if name in floats]
        if not positions:
            return list(fetched)
        return [single_floats(row, positions) for row in fetched]

    def read_only(self) -> Self:
        self.db.discard()
        self.db.read_only = True
        return self

    def same_server(self, dsn: MysqlDsn) -> bool:
        """True when a sink on ``dsn`` can read this source's table itself (INSERT .. SELECT):
        the same server, account and options, and a table whose database is known."""
        mine = self.db.dsn
        if self.spec.table is None or (self.spec.table.schema or mine.database) is None:
            return False
        return (mine.host, mine.port, mine.user, mine.password, mine.options) == (
            dsn.host,
            dsn.port,
            dsn.user,
            dsn.password,
            dsn.options,
        )

    def column_types(self) -> dict[str, ColumnType | None]:
        """The moved columns' types from ``information_schema.COLUMNS``: a column the SELECT
        takes from a table (every column of a table source) by that table's definition, a
        computed one by the result's metadata (type, length, scale, flags)."""
        conn = self.db.get()
        out: dict[str, ColumnType | None] = {}
        try:
            with conn.cursor() as cur:
                cur.execute(self.probe_sql(self.select_list()))
                fields = list(cur._result.fields if cur._result else ())
                for item in fields:
                    found = None
                    if item.org_table and item.org_name and item.db:
                        cur.execute(
                            "SELECT DATA_TYPE, COLUMN_TYPE, CHARACTER_MAXIMUM_LENGTH, "
                            "NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION, "
                            "CHARACTER_SET_NAME FROM information_schema.COLUMNS WHERE "
                            "TABLE_SCHEMA = %s AND TABLE_NAME = %s AND COLUMN_NAME = %s",
                            (item.db, item.org_table, item.org_name),
                        )
                        found = cur.fetchone()
                    out[str(item.name)] = _catalog_type(found) if found else _result_type(item)
        except Exception as exc:
            raise self._fail(exc, "describing the column types") from None
        return out


def _catalog_type(row: Sequence[Any]) -> ColumnType:
    """One information_schema.COLUMNS row (text columns come back as bytes on some servers)."""
    text = [v.decode() if isinstance(v, bytes | bytearray) else v for v in row]
    length, precision, scale, fsp = (None if v is None else int(v) for v in text[2:6])
    charset = None if text[6] is None else str(text[6])
    return mysql_column_type(str(text[0]), str(text[1]), length, precision, scale, fsp, charset)


_RESULT_INTEGERS = {
    FIELD_TYPE.TINY: 8,
    FIELD_TYPE.SHORT: 16,
    FIELD_TYPE.INT24: 24,
    FIELD_TYPE.LONG: 32,
    FIELD_TYPE.LONGLONG: 64,
}
_RESULT_BLOBS = {
    FIELD_TYPE.TINY_BLOB,
    FIELD_TYPE.MEDIUM_BLOB,
    FIELD_TYPE.LONG_BLOB,
    FIELD_TYPE.BLOB,
}
_RESULT_STRINGS = {FIELD_TYPE.VAR_STRING, FIELD_TYPE.STRING, FIELD_TYPE.VARCHAR}


def _result_type(item: Any) -> ColumnType:
    """A computed result column by its protocol metadata (no table behind it)."""
    code, scale, length = int(item.type_code), int(item.scale), int(item.length)
    unsigned = bool(int(item.flags) & 32)
    declared = f"computed type {code}"
    if code in _RESULT_INTEGERS:
        return ColumnType(declared, "integer", bits=_RESULT_INTEGERS[code], unsigned=unsigned)
    if code in (FIELD_TYPE.NEWDECIMAL, FIELD_TYPE.DECIMAL):
        precision = length - (1 if scale else 0) - (0 if unsigned else 1)
        return ColumnType(
            f"decimal({precision},{scale})", "decimal", precision=precision, scale=scale
        )
    if code in (FIELD_TYPE.FLOAT, FIELD_TYPE.DOUBLE):
        return ColumnType(declared, "float", bits=24 if code == FIELD_TYPE.FLOAT else 53)
    fsp = scale if scale <= 6 else 6
    if code == FIELD_TYPE.DATETIME:
        return ColumnType(f"datetime({fsp})", "timestamp", fsp=fsp)
    if code == FIELD_TYPE.TIMESTAMP:
        return ColumnType(f"timestamp({fsp})", "timestamp", fsp=fsp, tz=True, epoch_range=True)
    if code == FIELD_TYPE.TIME:
        return ColumnType(f"time({fsp})", "time", fsp=fsp, duration=True)
    if code == FIELD_TYPE.DATE:
        return ColumnType("date", "date")
    if code == FIELD_TYPE.JSON:  # MySQL 8 only: MariaDB describes JSON as text
        return ColumnType("json", "json", normal_form=MY_JSON)
    if code == FIELD_TYPE.BIT:  # read as ceil(n/8) bytes
        return ColumnType(f"bit({length})", "binary", bits=length, length=(length + 7) // 8)
    if code == FIELD_TYPE.GEOMETRY:
        return ColumnType("geometry", "binary")
    if code in _RESULT_STRINGS or code in _RESULT_BLOBS:
        binary = int(item.charsetnr) == 63
        size = length if binary else length // _widest_character(int(item.charsetnr))
        return ColumnType(declared, "binary" if binary else "text", length=size)
    return ColumnType(declared, "other")


#: bytes of a character set's widest character (the protocol gives a text column's length in
#: bytes: a varchar(100) of utf8mb4 is 400); any other set is one byte a character
_WIDEST = {"utf8mb4": 4, "utf8mb3": 3, "utf8": 3, "ucs2": 2, "utf16": 4, "utf16le": 4}
_WIDEST |= {"utf32": 4, "big5": 2, "gbk": 2, "gb2312": 2, "gb18030": 4, "sjis": 2, "cp932": 2}
_WIDEST |= {"ujis": 3, "eucjpms": 3, "euckr": 2}


def _widest_character(charsetnr: int) -> int:
    """Bytes a character of result charset ``charsetnr`` takes at most; 4 for a collation this
    driver does not know (the session's results are utf8mb4)."""
    try:
        name = pymysql.charset.charset_by_id(charsetnr).name
    except KeyError:
        return 4
    return _WIDEST.get(name, 1)


class _WarningCounter(pymysql.cursors.Cursor):  # type: ignore[misc]  # untyped driver
    """A cursor that adds up the warnings of every statement it runs: executemany sends one
    INSERT per max_stmt_length of rows, and the server reports warnings per statement."""

    warnings_seen = 0
    #: the session's max_allowed_packet: a statement the server would refuse is never sent
    packet_limit: int | None = None

    def _query(self, q: Any) -> int:
        """The formatted statement, refused unsent when the server would take it as too large:
        it refuses a packet (the command byte and the statement) of max_allowed_packet or more."""
        if self.packet_limit is not None:
            size = len(q.encode(self._get_db().encoding) if isinstance(q, str) else q)
            if size + 1 >= self.packet_limit:
                raise PacketTooLarge(size, self.packet_limit)
        return int(super()._query(q))

    def execute(self, query: Any, args: Any = None) -> int:
        result = super().execute(query, args)
        self.warnings_seen += int(self.warning_count)
        return int(result)


# --- sink -----------------------------------------------------------------------------------------
def _packet_limit(what: str, limit: int | None, size: int | None) -> DponeError:
    """SINK_FAILED for a row over the server's max_allowed_packet: the same data fails the same
    way on every attempt, so it is not retryable (a dropped connection would say it is)."""
    server = f"max_allowed_packet of {limit} bytes" if limit else "max_allowed_packet"
    sent = f" (a {size}-byte INSERT of one row)" if size is not None else ""
    return DponeError(
        errors.SINK_FAILED,
        f"{what}: a row is over the packet limit, the server's {server}{sent}; raise "
        "max_allowed_packet on the server (it caps one row's INSERT) to move it",
    )


class MysqlSink(sql_base.SqlSink["pymysql.connections.Connection[Any]"]):
    """Writes chunks into one MySQL/MariaDB table (InnoDB), one transaction per chunk; with a
    fence the chunk's row in ``dpone_chunk_fence`` is claimed first (see docs/connectors.md,
    MySQL and MariaDB)."""

    kind = "mysql"
    dialect = MysqlDialect
    db: MysqlConnection

    def __init__(self, spec: base.SinkSpec, dsn: str, options: base.SinkOptions) -> None:
        super().__init__(spec, dsn, options)
        schema = spec.table.schema
        self._stage_prefix = "" if schema is None else quote(schema, "database") + "."
        self._load_data = True  # until the server refuses LOAD DATA LOCAL
        self._floats: frozenset[str] | None = None  # the target's FLOAT columns, once read
        self.deadlocks_retried = 0  # chunk transactions run again after a deadlock

    def connection(self, dsn: str, label: str) -> MysqlConnection:
        return MysqlConnection(dsn, label, sink=True)

    def _begin(self, conn: pymysql.connections.Connection[Any]) -> Any:
        conn.begin()
        return conn.cursor()

    def _commit(self, conn: pymysql.connections.Connection[Any], handle: Any) -> None:
        handle.close()
        conn.commit()

    def _retry(self, exc: BaseException, attempt: int) -> bool:
        """A deadlock (InnoDB rolled the transaction back: adjacent chunks' gap locks, or two
        first claims of one fence row) is retried from the start a few times."""
        if not isinstance(exc, pymysql.err.OperationalError) or _errno(exc) != _DEADLOCK:
            return False
        if attempt >= DEADLOCK_RETRIES:
            return False
        self.deadlocks_retried += 1
        time.sleep(random.uniform(0.05, 0.25) * attempt)
        return True

    def _failure(self, exc: BaseException, what: str, attempt: int) -> DponeError:
        """The chunk's error; a connection the failure left dead is dropped here, so the next
        chunk reconnects (a connection loss is dropped by ``translate`` already)."""
        try:
            return self._classify(exc, what, attempt)
        finally:
            self.db.drop_if_unusable()

    def _classify(self, exc: BaseException, what: str, attempt: int) -> DponeError:
        if isinstance(exc, PacketTooLarge):
            return _packet_limit(what, exc.limit, exc.size)
        if isinstance(exc, pymysql.err.OperationalError) and _errno(exc) == _PACKET_TOO_LARGE:
            return _packet_limit(what, self.db.packet_limit, None)
        if isinstance(exc, pymysql.err.OperationalError) and _errno(exc) in (
            _DEADLOCK,
            _LOCK_WAIT_TIMEOUT,
        ):
            return DponeError(
                errors.CHUNK_BUSY,
                f"{what}: {describe_error(exc)} (after {attempt} attempt(s)); nothing was written",
            )
        error = super()._failure(exc, what, attempt)
        error.key_conflict = error.key_conflict or _errno(exc) == _DUPLICATE_KEY
        return error

    # fence --------------------------------------------------------------------------------------
    def _ensure_fence_table(self, conn: pymysql.connections.Connection[Any]) -> None:
        """CREATE TABLE IF NOT EXISTS, in autocommit (DDL commits implicitly in MySQL)."""
        try:
            with conn.cursor() as cur:
                cur.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._fence_table} ("
                    "`campaign` varchar(120) NOT NULL, `chunk_index` bigint NOT NULL, "
                    "`attempt` bigint NOT NULL, `claimed_at` timestamp(6) NULL, "
                    "PRIMARY KEY (`campaign`, `chunk_index`)) ENGINE=InnoDB"
                )
        except Exception as exc:
            what = f"{self.spec.display()}: creating {base.FENCE_TABLE}"
            raise self.db.translate(exc, errors.SINK_FAILED, what) from None

    def _claim_fence(self, handle: Any, fence: base.ChunkFence) -> bool:
        """Upsert the fence row (attempt only grows) = the chunk's row lock until commit; then
        refuse when a newer attempt already claimed the chunk. True when the row was there
        already: the upsert reports 1 affected row for an insert only (no CLIENT_FOUND_ROWS)."""
        cur = handle
        key = (fence.campaign, fence.chunk_index)
        try:
            cur.execute(
                f"INSERT INTO {self._fence_table} (`campaign`, `chunk_index`, `attempt`, "
                "`claimed_at`) VALUES (%s, %s, %s, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE "
                "`claimed_at` = IF(VALUES(`attempt`) >= `attempt`, VALUES(`claimed_at`), "
                "`claimed_at`), `attempt` = GREATEST(`attempt`, VALUES(`attempt`))",
                (*key, fence.attempt),
            )
            claimed_before = int(cur.rowcount) != 1
            cur.execute(
                f"SELECT `attempt` FROM {self._fence_table} "
                "WHERE `campaign` = %s AND `chunk_index` = %s FOR UPDATE",
                key,
            )
            found = cur.fetchone()
        except pymysql.err.OperationalError as exc:
            if _errno(exc) == _LOCK_WAIT_TIMEOUT:
                raise sql_base.busy_fence(
                    self.spec.display(), fence, str(self.db.lock_timeout_s)
                ) from None
            raise
        self._refuse_superseded(fence, int(found[0]) if found else fence.attempt)
        return claimed_before

    # preflight ----------------------------------------------------------------------------------
    def preflight(self, window_column: str | None = None) -> list[str]:
        conn = self.db.get()
        shown = self.spec.table.display()
        schema = "%s" if self.spec.table.schema is not None else "DATABASE()"
        params: list[object] = [self.spec.table.name]
        if self.spec.table.schema is not None:
            params.insert(0, self.spec.table.schema)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT COLUMN_NAME FROM information_schema.COLUMNS "
                    f"WHERE TABLE_SCHEMA = {schema} AND TABLE_NAME = %s",
                    params,
                )
                columns = {str(row[0]) for row in cur.fetchall()}
                if not columns:
                    return [f"target table {shown} does not exist: every chunk will fail"]
                cur.execute(
                    "SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME FROM information_schema.STATISTICS "
                    f"WHERE TABLE_SCHEMA = {schema} AND TABLE_NAME = %s "
                    "ORDER BY INDEX_NAME, SEQ_IN_INDEX",
                    params,
                )
                grouped: dict[str, tuple[list[str], bool]] = {}
                for name, non_unique, column in cur.fetchall():
                    entry = grouped.setdefault(str(name), ([], not int(non_unique)))
                    entry[0].append(str(column))
        except Exception as exc:
            raise self._preflight_failed(exc) from None
        return base.index_warnings(shown, self.spec, window_column, columns, list(grouped.values()))

    # paths --------------------------------------------------------------------------------------
    def _write(
        self, handle: Any, source: base.Source, window: base.Scope, columns: tuple[str, ...]
    ) -> base.ChunkWrite:
        cur = handle
        cols = _columns_sql(columns)
        if (
            isinstance(source, MysqlSource)
            and (source.same_dsn(self._dsn) or source.same_server(self.db.dsn))
            and not self._widens_singles(cur, source, columns)
        ):
            select = source.select_sql(window, columns, qualified=not source.same_dsn(self._dsn))

            def fill_select(rel: str) -> int:
                cur.execute(f"INSERT INTO {rel} ({cols}) {select}", MysqlDialect.params(window))
                self._no_warnings(int(cur.warning_count), "INSERT .. SELECT")
                return int(cur.rowcount)

            return self._modes(cur, window, columns, fill_select, "insert-select")

        def fill_rows(rel: str) -> int:
            count = 0
            with (
                tempfile.TemporaryDirectory(prefix="dpone-load-") as folder,
                contextlib.closing(source.rows(window, self.options.batch_rows)) as batches,
            ):
                path = os.path.join(folder, "batch.tsv")
                for batch in batches:
                    self._load(cur, rel, columns, batch, path)
                    count += len(batch)
            return count

        written = self._modes(cur, window, columns, fill_rows, "load-data")
        return written if self._load_data else dataclasses.replace(written, method="executemany")

    def _load(
        self, cur: Any, rel: str, columns: Sequence[str], batch: Sequence[base.Row], path: str
    ) -> None:
        """One batch into ``rel``: LOAD DATA LOCAL INFILE, or executemany when it holds bytes.

        LOCAL makes the server downgrade data errors to warnings (and skip duplicate keys), so any
        warning fails the chunk here; the transaction is then rolled back.
        """
        cols = _columns_sql(columns)
        try:
            if not self._load_data:
                raise BinaryValue
            with open(path, "w", encoding="utf-8", newline="\n") as out:
                out.writelines("\t".join(map(tsv_field, row)) + "\n" for row in batch)
        except BinaryValue:
            marks = ", ".join("%s" for _ in columns)
            limit = self.db.max_packet(cur.connection)
            with cur.connection.cursor(_WarningCounter) as counted:
                counted.packet_limit = limit
                # PyMySQL joins rows into statements of up to max_stmt_length (1,000 KB): never
                # more than the server takes; only a single row can then be over it
                counted.max_stmt_length = max(1, min(counted.max_stmt_length, limit - 2))
                counted.executemany(
                    f"INSERT INTO {rel} ({cols}) VALUES ({marks})",
                    [tuple(map(to_mysql, row)) for row in batch],
                )
                self._no_warnings(counted.warnings_seen, "batched insert")
            return
        try:
            cur.execute(
                f"LOAD DATA LOCAL INFILE %s INTO TABLE {rel} CHARACTER SET utf8mb4 ({cols})",
                (path,),
            )
        except pymysql.err.OperationalError as exc:
            if _errno(exc) not in _LOCAL_INFILE_REFUSED:
                raise
            self._load_data = False  # the server refuses LOCAL (MySQL 8's default): insert
            self._load(cur, rel, columns, batch, path)
            return
        loaded = int(cur.rowcount)
        cur.execute("SELECT @@warning_count")
        found = cur.fetchone()
        warnings = int(found[0]) if found else 0
        if warnings or loaded != len(batch):
            cur.execute("SHOW WARNINGS")  # LOAD DATA LOCAL skips a duplicate key's row: why?
            codes = {int(row[1]) for row in cur.fetchall()}
            error = DponeError(
                errors.SINK_FAILED,
                f"{self.spec.display()}: the server loaded {loaded} of {len(batch)} rows with "
                f"{warnings} warning(s) (a value that does not fit its column, or a duplicate "
                "key); the chunk was rolled back",
            )
            error.key_conflict = codes == {_DUPLICATE_KEY}
            raise error

    def _no_warnings(self, warnings: int, path: str) -> None:
        """Strict mode makes a value that does not fit an error, but the server still rounds
        DECIMAL scale (and trailing spaces) with a note only: any warning or note fails the
        chunk, as it does on the LOAD DATA path, so the outcome never depends on the path."""
        if warnings:
            raise DponeError(
                errors.SINK_FAILED,
                f"{self.spec.display()}: the server changed values while writing ({path}, "
                f"{warnings} warning(s): a value that does not fit its column, e.g. more "
                "decimal places than the column keeps); the chunk was rolled back",
            )

    # inner modes: InnoDB's next-key locks keep concurrent writers out of a replaced range until
    # commit; DELETE, not TRUNCATE (which would commit implicitly); stages are TEMPORARY tables.
    def _checksum(self, handle: Any, columns: Sequence[str], query: str, params: Any) -> str:
        """The read-back's checksum, its FLOAT columns (read as DOUBLE) as singles."""
        assert self._floats is not None  # the read list described the target
        positions = [i for i, name in enumerate(columns) if name in self._floats]
        cur = self._query(handle, query, params)
        if not positions:
            return sql_base.read_checksum(cur, columns)
        check = base.RowChecksum(columns)
        while batch := cur.fetchmany(sql_base.CHECKSUM_BATCH):
            check.add_many([single_floats(row, positions) for row in batch])
        return check.value()

    def _read_list(self, handle: Any, columns: Sequence[str], prefix: str = "") -> str:
        """FLOAT columns read back as DOUBLE (see MysqlDialect.read_columns_sql); the target's
        are described once (its stage has the same types)."""
        return MysqlDialect.read_columns_sql(columns, self._target_floats(handle), prefix)

    def _target_floats(self, handle: Any) -> frozenset[str]:
        if self._floats is None:
            handle.execute(f"SELECT * FROM {self._table} LIMIT 0")
            self._floats = float_columns(handle.description)
        return self._floats

    def _widens_singles(self, handle: Any, source: MysqlSource, columns: Sequence[str]) -> bool:
        """A source FLOAT written into a wider column: INSERT .. SELECT would store the single's
        exact value (0.10000000149011612 for 0.1), which no client reads as the source's and the
        read-back gate refuses; streamed, it moves as its shortest decimal, as from any source."""
        singles = set(source._floats()) & set(columns)
        return bool(singles - self._target_floats(handle))

    def _query(self, handle: Any, query: str, params: Any) -> Any:
        handle.execute(query, params)
        return handle

    def _delete_sql(self, window: base.Scope) -> str:
        """A single-table DELETE without an alias: MariaDB resolves the alias of the multi-table
        form (``DELETE a FROM db.t AS a``) in the default database, which a DSN without one
        lacks (1046), and takes no alias in the single-table form."""
        if window is None:
            return f"DELETE FROM {self._table}"
        column, mark = quote(window.column, "chunk column"), MysqlDialect.marker
        return f"DELETE FROM {self._table} WHERE {column} >= {mark} AND {column} < {mark}"

    def _create_stage(self, handle: Any, columns: Sequence[str]) -> str:
        stage = self._stage_prefix + quote(f"dpone_stage_{uuid.uuid4().hex[:16]}", "stage")
        handle.execute(
            f"CREATE TEMPORARY TABLE {stage} ENGINE=InnoDB AS SELECT {_columns_sql(columns)} "
            f"FROM {self._table} WHERE 1 = 0"
        )
        return stage

    def _moved_rows(self, cur: Any, filled: int) -> int:
        return filled  # ON DUPLICATE KEY UPDATE counts an updated row twice

    def _drop_stage(self, handle: Any, stage: str, done: bool) -> None:
        with contextlib.suppress(pymysql.err.Error):
            handle.execute(f"DROP TEMPORARY TABLE IF EXISTS {stage}")

    def _upsert(self, columns: Sequence[str]) -> str:
        sets = ", ".join(
            f"{quote(c, 'column')} = VALUES({quote(c, 'column')})" for c in self._updated(columns)
        )
        return f"ON DUPLICATE KEY UPDATE {sets}"
