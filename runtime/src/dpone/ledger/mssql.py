"""The MSSQL ledger: the same audit schema and protocol in T-SQL, locks by ``sp_getapplock``.

``sp_getapplock`` with ``@LockOwner = 'Transaction'`` is the analogue of Postgres's
transaction-level advisory lock: commit or rollback releases it. Its return code is read through a
one-batch ``DECLARE / EXEC / SELECT``: 0 and 1 mean granted, -1 timeout, -2 cancelled, -3 deadlock
victim (SQL Server does NOT roll the transaction back then: we do), -999 a call error.

Live status: UNVERIFIED. No SQL Server runs where this was built; the adapter is held to the
Postgres contract tests through a recording DB-API double and every statement is parsed as T-SQL.
"""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Unpack
from urllib.parse import parse_qsl, unquote, urlsplit

from dpone import errors
from dpone.credentials.connections import current_dsn, redact
from dpone.credentials.odbc_driver import driver_missing, driver_not_loadable
from dpone.errors import DponeError
from dpone.ledger import sql as ledger_sql
from dpone.ledger.port import Amendment, ChunkState, Restatement

DEFAULT_DRIVER = "ODBC Driver 18 for SQL Server"
APPLOCK_GRANTED = (0, 1)
APPLOCK_MEANING = {
    -1: "timed out",
    -2: "was cancelled",
    -3: "was chosen as a deadlock victim",
    -999: "failed (parameter or call error)",
}


def load_pyodbc() -> ModuleType:
    """pyodbc, or DPONE_LEDGER_UNAVAILABLE naming the extra (and unixODBC, which it links)."""
    try:
        return importlib.import_module("pyodbc")
    except ImportError as exc:
        raise DponeError(
            errors.LEDGER_UNAVAILABLE,
            f"the MSSQL ledger needs pyodbc and the unixODBC library ({exc}): "
            "install the dpone-runtime wheel with its [mssql] extra, by path "
            "(docs/deploy-kubernetes.md), and the system package unixodbc",
        ) from exc


def _odbc_value(value: str) -> str:
    """Brace a connection-string value that holds ; { } or spaces (closing braces doubled)."""
    if any(ch in value for ch in ";{}= ") or value != value.strip():
        return "{" + value.replace("}", "}}") + "}"
    return value


def odbc_connection_string(dsn: str, application_name: str = "dpone-ledger") -> str:
    """ODBC connection string from ``mssql://user:pass@host:port/db?driver=...&Key=value`` or
    ``odbc://?odbc_connect=<url-encoded connection string>``."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        raise DponeError(
            errors.CONFIG_INVALID, "the MSSQL DSN is malformed (an invalid IPv6 host)"
        ) from None
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if "odbc_connect" in query:
        raw = unquote(query["odbc_connect"])
        if "app=" not in raw.lower():
            raw = raw.rstrip(";") + f";APP={_odbc_value(application_name)}"
        return raw
    if not parts.hostname:
        raise DponeError(
            errors.CONFIG_INVALID,
            f"MSSQL DSN {redact(dsn)} names no host: use mssql://user:pass@host:1433/database",
        )
    try:
        port = parts.port
    except ValueError:
        raise DponeError(
            errors.CONFIG_INVALID, "the MSSQL DSN is malformed (an invalid host or port)"
        ) from None
    driver = query.pop("driver", DEFAULT_DRIVER)
    fields = {"DRIVER": "{" + driver.replace("}", "}}") + "}"}
    fields["SERVER"] = parts.hostname + (f",{port}" if port else "")
    database = parts.path.lstrip("/")
    if database:
        fields["DATABASE"] = _odbc_value(unquote(database))
    if parts.username:
        fields["UID"] = _odbc_value(unquote(parts.username))
    if parts.password:
        fields["PWD"] = _odbc_value(unquote(parts.password))
    given = {key.upper() for key in query}
    if "APP" not in given:
        fields["APP"] = _odbc_value(application_name)
    if "ODBC DRIVER" in driver.upper() and "KEEPALIVE" not in given:
        fields["KeepAlive"] = "30"
        fields["KeepAliveInterval"] = "10"
    for key, value in query.items():
        fields[key] = _odbc_value(value)
    return ";".join(f"{key}={value}" for key, value in fields.items())


def ddl_v1(s: str) -> list[str]:
    """Version 1 of the audit schema in T-SQL (each statement its own batch)."""
    return [
        f"""CREATE TABLE {s}.[schema_version] (
            version INT NOT NULL PRIMARY KEY,
            applied_at DATETIME2(6) NOT NULL DEFAULT SYSUTCDATETIME())""",
        f"""CREATE TABLE {s}.[campaign] (
            seq BIGINT IDENTITY(1, 1) NOT NULL PRIMARY KEY,
            run_key NVARCHAR(200) NOT NULL,
            workload NVARCHAR(400) NOT NULL,
            process NVARCHAR(400) NOT NULL,
            plan_hash VARCHAR(100) NOT NULL,
            config_hash VARCHAR(100) NOT NULL,
            chunk_count INT NOT NULL CHECK (chunk_count > 0),
            cancelled BIT NOT NULL DEFAULT 0,
            cancel_reason NVARCHAR(2000) NULL,
            created_by NVARCHAR(400) NOT NULL,
            created_at DATETIME2(6) NOT NULL DEFAULT SYSUTCDATETIME())""",
        f"CREATE INDEX [campaign_run_key_seq] ON {s}.[campaign] (run_key, seq DESC)",
        f"""CREATE TABLE {s}.[campaign_chunk] (
            run_key NVARCHAR(200) NOT NULL,
            chunk_index INT NOT NULL,
            chunk_start NVARCHAR(100) NOT NULL,
            chunk_end NVARCHAR(100) NOT NULL,
            idempotency_key VARCHAR(100) NOT NULL,
            CONSTRAINT [campaign_chunk_pk] PRIMARY KEY (run_key, chunk_index))""",
        f"""CREATE TABLE {s}.[chunk_transition] (
            seq BIGINT IDENTITY(1, 1) NOT NULL PRIMARY KEY,
            run_key NVARCHAR(200) NOT NULL,
            chunk_index INT NOT NULL,
            [transition] INT NOT NULL,
            state VARCHAR(16) NOT NULL CHECK (state IN ('pending', 'running', 'committed', 'failed')),
            attempt INT NOT NULL,
            idempotency_key VARCHAR(100) NOT NULL,
            chunk_start NVARCHAR(100) NOT NULL,
            chunk_end NVARCHAR(100) NOT NULL,
            lease_owner NVARCHAR(400) NULL,
            lease_expires_at DATETIME2(6) NULL,
            started_at DATETIME2(6) NULL,
            rows_moved BIGINT NULL,
            checksum NVARCHAR(200) NULL,
            error_code VARCHAR(100) NULL,
            error_message NVARCHAR(MAX) NULL,
            recorded_at DATETIME2(6) NOT NULL DEFAULT SYSUTCDATETIME(),
            CONSTRAINT [chunk_transition_fence] UNIQUE (run_key, chunk_index, [transition]))""",
    ]


def ddl_v2(s: str) -> list[str]:
    """Version 2: ``committed_chunk`` marks (written with each COMMITTED transition)."""
    return [
        f"""CREATE TABLE {s}.[committed_chunk] (
            run_key NVARCHAR(200) NOT NULL,
            chunk_index INT NOT NULL,
            committed_at DATETIME2(6) NOT NULL DEFAULT SYSUTCDATETIME(),
            CONSTRAINT [committed_chunk_pk] PRIMARY KEY (run_key, chunk_index))""",
        f"INSERT INTO {s}.[committed_chunk] (run_key, chunk_index) SELECT DISTINCT run_key, "
        f"chunk_index FROM {s}.[chunk_transition] WHERE state = 'committed'",
    ]


def ddl_v3(s: str) -> list[str]:
    """Version 3: ``source_checksum`` on every transition (the read-back gate's source side)."""
    return [f"ALTER TABLE {s}.[chunk_transition] ADD source_checksum NVARCHAR(200) NULL"]


def ddl_v4(s: str) -> list[str]:
    """Version 4 (additive): ``campaign_amendment``, one row per extension of a campaign, and
    ``chunk_restatement``, one row per committed chunk marked to be moved again."""
    return [
        f"""CREATE TABLE {s}.[campaign_amendment] (
            seq BIGINT IDENTITY(1, 1) NOT NULL PRIMARY KEY,
            run_key NVARCHAR(200) NOT NULL,
            old_plan_hash VARCHAR(100) NOT NULL,
            new_plan_hash VARCHAR(100) NOT NULL,
            old_chunk_count INT NOT NULL,
            new_chunk_count INT NOT NULL CHECK (new_chunk_count > old_chunk_count),
            amended_by NVARCHAR(400) NOT NULL,
            amended_at DATETIME2(6) NOT NULL DEFAULT SYSUTCDATETIME())""",
        f"CREATE INDEX [campaign_amendment_run_key] ON {s}.[campaign_amendment] (run_key, seq)",
        f"""CREATE TABLE {s}.[chunk_restatement] (
            seq BIGINT IDENTITY(1, 1) NOT NULL PRIMARY KEY,
            run_key NVARCHAR(200) NOT NULL,
            chunk_index INT NOT NULL,
            [transition] INT NOT NULL,
            reason NVARCHAR(2000) NOT NULL,
            requested_by NVARCHAR(2000) NOT NULL,
            prior_rows BIGINT NULL,
            prior_checksum NVARCHAR(200) NULL,
            requested_at DATETIME2(6) NOT NULL DEFAULT SYSUTCDATETIME(),
            CONSTRAINT [chunk_restatement_once] UNIQUE (run_key, chunk_index, [transition]))""",
    ]


MIGRATIONS = {1: ddl_v1, 2: ddl_v2, 3: ddl_v3, 4: ddl_v4}


def _naive_utc(value: dt.datetime | None) -> dt.datetime | None:
    """DATETIME2 has no zone; the ledger stores UTC (SYSUTCDATETIME) and sends UTC."""
    return None if value is None else value.astimezone(dt.UTC).replace(tzinfo=None)


class MssqlStatements:
    """Every T-SQL statement of the adapter, composed once per schema."""

    def __init__(self, schema: str) -> None:
        s = "[" + schema + "]"
        self.schema = s
        self.applock = (
            "SET NOCOUNT ON; DECLARE @rc INT; "
            "EXEC @rc = sp_getapplock @Resource = ?, @LockMode = 'Exclusive', "
            "@LockOwner = 'Transaction', @LockTimeout = ?; SELECT @rc AS rc"
        )
        self.schema_id = "SELECT SCHEMA_ID(?)"
        self.object_id = "SELECT OBJECT_ID(?, N'U')"
        self.create_schema = f"CREATE SCHEMA {s}"
        self.version = f"SELECT MAX(version) FROM {s}.[schema_version]"
        self.record_version = f"INSERT INTO {s}.[schema_version] (version) VALUES (?)"
        self.campaign_head = f"SELECT TOP 1 {ledger_sql.CAMPAIGNS.selected} FROM {s}.[campaign] WHERE run_key = ? ORDER BY seq DESC"
        self.insert_campaign = f"INSERT INTO {s}.[campaign] ({ledger_sql.CAMPAIGNS.inserted}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        self.insert_shape = (
            f"INSERT INTO {s}.[campaign_chunk] (run_key, chunk_index, chunk_start, chunk_end, "
            "idempotency_key) VALUES (?, ?, ?, ?, ?)"
        )
        self.shape_rows = (
            f"SELECT chunk_index, chunk_start, chunk_end, idempotency_key FROM {s}.[campaign_chunk] "
            "WHERE run_key = ? ORDER BY chunk_index"
        )
        columns = ledger_sql.TRANSITIONS.selected.replace("transition,", "[transition],")
        self.chunk_view = (
            "SELECT SYSUTCDATETIME(), c.cancelled, c.cancel_reason, "
            "sh.chunk_index, sh.chunk_start, sh.chunk_end, sh.idempotency_key, t.* "
            "FROM (SELECT 1 AS one) AS o "
            f"LEFT JOIN (SELECT TOP 1 cancelled, cancel_reason FROM {s}.[campaign] WHERE run_key = ? "
            "ORDER BY seq DESC) AS c ON 1 = 1 "
            f"LEFT JOIN {s}.[campaign_chunk] AS sh ON sh.run_key = ? AND sh.chunk_index = ? "
            f"LEFT JOIN (SELECT TOP 1 {columns} FROM {s}.[chunk_transition] "
            "WHERE run_key = ? AND chunk_index = ? ORDER BY [transition] DESC) AS t ON 1 = 1"
        )
        insert_columns = ledger_sql.INSERT_TRANSITION_COLUMNS.replace(
            "transition,", "[transition],"
        )
        self.append_transition = (
            f"INSERT INTO {s}.[chunk_transition] ({insert_columns}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self.latest_transitions = (
            f"SELECT {columns} FROM (SELECT {columns}, ROW_NUMBER() OVER "
            "(PARTITION BY chunk_index ORDER BY [transition] DESC) AS recency "
            f"FROM {s}.[chunk_transition] WHERE run_key = ?) AS ranked "
            "WHERE recency = 1 ORDER BY chunk_index"
        )
        self.mark_committed = (
            f"INSERT INTO {s}.[committed_chunk] (run_key, chunk_index) VALUES (?, ?)"
        )
        self.committed_marks = f"SELECT chunk_index FROM {s}.[committed_chunk] WHERE run_key = ?"
        self.insert_amendment = f"INSERT INTO {s}.[campaign_amendment] ({ledger_sql.AMENDMENTS.inserted}) VALUES (?, ?, ?, ?, ?, ?)"
        self.amendments = (
            f"SELECT {ledger_sql.AMENDMENTS.inserted}, amended_at FROM {s}.[campaign_amendment] "
            "WHERE run_key = ? ORDER BY seq"
        )
        restatement_columns = ledger_sql.RESTATEMENTS.inserted.replace(
            "transition,", "[transition],"
        )
        self.insert_restatement = (
            f"INSERT INTO {s}.[chunk_restatement] ({restatement_columns}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        self.unmark_committed = (
            f"DELETE FROM {s}.[committed_chunk] WHERE run_key = ? AND chunk_index = ?"
        )
        self.restatements = (
            f"SELECT {restatement_columns}, requested_at FROM {s}.[chunk_restatement] "
            "WHERE run_key = ? ORDER BY seq"
        )
        self.run_keys = f"SELECT DISTINCT run_key FROM {s}.[campaign] ORDER BY run_key"
        self.run_keys_of = (
            f"SELECT DISTINCT run_key FROM {s}.[campaign] WHERE workload = ? ORDER BY run_key"
        )
        self.now = "SELECT SYSUTCDATETIME()"


class MssqlTx(ledger_sql.ViewThenAppend):
    """One ledger transaction on the store's pyodbc connection (see LedgerTx)."""

    def __init__(self, store: MssqlLedger, conn: Any) -> None:
        self.store = store
        self.connection = conn
        self.sql = store.statements
        self.cursor = conn.cursor()

    def _one(self, query: str, *params: Any) -> Any:
        self.cursor.execute(query, *params)
        while self.cursor.description is None:
            if not self.cursor.nextset():
                return None
        return self.cursor.fetchone()

    def _all(self, query: str, *params: Any) -> list[Any]:
        self.cursor.execute(query, *params)
        return list(self.cursor.fetchall())

    def applock(self, resource: str, timeout_s: float) -> int:
        row = self._one(self.sql.applock, resource, max(0, int(timeout_s * 1000)))
        return -999 if row is None or row[0] is None else int(row[0])

    def lock_campaign(self, run_key: str, timeout_s: float) -> None:
        code = self.applock(ledger_sql.lock_resource(self.store.schema, run_key), timeout_s)
        if code in APPLOCK_GRANTED:
            return
        if code == -999:
            raise DponeError(
                errors.LEDGER_UNAVAILABLE, f"campaign {run_key!r}: sp_getapplock failed"
            )
        raise DponeError(
            errors.MAPPING_CAMPAIGN_BUSY,
            f"campaign {run_key!r}: the campaign lock request {APPLOCK_MEANING.get(code, code)} "
            f"within {timeout_s:g}s",
        )

    def lock_chunk(self, run_key: str, chunk_index: int) -> None:
        timeout_s = self.store.chunk_lock_timeout_s
        code = self.applock(
            ledger_sql.lock_resource(self.store.schema, run_key, chunk_index), timeout_s
        )
        if code in APPLOCK_GRANTED:
            return
        if code == -999:
            raise DponeError(
                errors.LEDGER_UNAVAILABLE,
                f"campaign {run_key!r} chunk {chunk_index}: sp_getapplock failed",
            )
        raise ledger_sql.ChunkLockTimeout(run_key, chunk_index, timeout_s)

    def campaign_head(self, run_key: str) -> ledger_sql.CampaignHead | None:
        row = self._one(self.sql.campaign_head, run_key)
        return None if row is None else ledger_sql.CAMPAIGNS.decode(row)

    def insert_campaign(self, head: ledger_sql.CampaignHead) -> None:
        self.cursor.execute(self.sql.insert_campaign, *ledger_sql.CAMPAIGNS.params(head))

    def insert_shape(self, run_key: str, rows: Sequence[ledger_sql.ShapeRow]) -> None:
        self.cursor.fast_executemany = True
        self.cursor.executemany(
            self.sql.insert_shape,
            [(run_key, r.chunk_index, r.chunk_start, r.chunk_end, r.idempotency_key) for r in rows],
        )

    def chunk_view(self, run_key: str, chunk_index: int) -> ledger_sql.ChunkView:
        row = self._one(self.sql.chunk_view, run_key, run_key, chunk_index, run_key, chunk_index)
        return ledger_sql.view_from_row(tuple(row))

    def append_transition(self, run_key: str, record: ledger_sql.NewTransition) -> None:
        params = list(ledger_sql.transition_params(run_key, record))
        params[9] = _naive_utc(record.lease_expires_at)
        params[10] = _naive_utc(record.started_at)
        self.cursor.execute(self.sql.append_transition, *params)
        if record.state is ChunkState.COMMITTED:  # a chunk commits once: no duplicate mark
            self.cursor.execute(self.sql.mark_committed, run_key, record.chunk_index)

    def committed_marks(self, run_key: str) -> set[int]:
        return {int(row[0]) for row in self._all(self.sql.committed_marks, run_key)}

    def load_state(self, run_key: str, with_shape: bool) -> ledger_sql.StoredState:
        return ledger_sql.state_in_turn(self, run_key, with_shape)

    def shape_rows(self, run_key: str) -> list[ledger_sql.ShapeRow]:
        return ledger_sql.rows_as_shape(self._all(self.sql.shape_rows, run_key))

    def latest_transitions(self, run_key: str) -> list[ledger_sql.StoredTransition]:
        return [
            ledger_sql.TRANSITIONS.decode(row)
            for row in self._all(self.sql.latest_transitions, run_key)
        ]

    def insert_amendment(self, amendment: Amendment) -> None:
        self.cursor.execute(self.sql.insert_amendment, *ledger_sql.AMENDMENTS.params(amendment))

    def amendments(self, run_key: str) -> list[Amendment]:
        return [
            ledger_sql.AMENDMENTS.decode(row) for row in self._all(self.sql.amendments, run_key)
        ]

    def insert_restatement(self, restatement: Restatement) -> None:
        self.cursor.execute(
            self.sql.insert_restatement, *ledger_sql.RESTATEMENTS.params(restatement)
        )

    def unmark_committed(self, run_key: str, chunk_index: int) -> None:
        self.cursor.execute(self.sql.unmark_committed, run_key, chunk_index)

    def restatements(self, run_key: str) -> list[Restatement]:
        return [
            ledger_sql.RESTATEMENTS.decode(r) for r in self._all(self.sql.restatements, run_key)
        ]

    def db_now(self) -> dt.datetime:
        return ledger_sql.utc(self._one(self.sql.now)[0])

    def run_keys(self, workload: str | None) -> list[str]:
        if workload is None:
            return [str(r[0]) for r in self._all(self.sql.run_keys)]
        return [str(r[0]) for r in self._all(self.sql.run_keys_of, workload)]


class MssqlLedger(ledger_sql.SqlLedger):
    """The audit-schema ledger on SQL Server (one connection per instance; not thread-safe).

    ``driver`` is a pyodbc-compatible DB-API module (pyodbc by default); tests pass a double.
    """

    name = "mssql"

    def __init__(
        self,
        dsn: str,
        schema: str = ledger_sql.DEFAULT_SCHEMA,
        lease_seconds: float = 300.0,
        *,
        driver: ModuleType | Any | None = None,
        **options: Unpack[ledger_sql.SqlStoreOptions],
    ) -> None:
        self.driver: Any = driver
        self._conn: Any = None
        super().__init__(dsn, schema, lease_seconds, **options)

    def _prepare(self, dsn: str, application_name: str) -> None:
        if self.driver is None:
            self.driver = load_pyodbc()
        self.statements = MssqlStatements(self.schema)
        self._application_name = application_name
        odbc_connection_string(dsn, application_name)  # a malformed DSN is refused at once

    def _connection(self) -> Any:
        """The store's one connection; a (re)connect reads the connection's DSN again, so a
        password rotated while a run goes on is used without a restart."""
        if self._conn is not None:
            return self._conn
        self._dsn = current_dsn(self._dsn)
        connection_string = odbc_connection_string(self._dsn, self._application_name)
        try:
            self._conn = self.driver.connect(connection_string, autocommit=False)
        except self.driver.Error as exc:
            if driver_not_loadable(exc):
                raise driver_missing("the ledger database") from None
            raise self._unreachable(self._message(exc)) from exc
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except self.driver.Error:
                pass
            self._conn = None

    @staticmethod
    def _sqlstate(exc: BaseException) -> str:
        return str(exc.args[0]) if exc.args else ""

    def _message(self, exc: BaseException) -> str:
        text = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
        return ledger_sql.first_line(text)

    def _translate(self, exc: BaseException, op: str, mode: ledger_sql.TxMode) -> DponeError:
        state = self._sqlstate(exc)
        if state.startswith("08") or isinstance(exc, self.driver.OperationalError):
            self.close()  # the next call reconnects
            return self._lost_during(op, f"{state} {self._message(exc)}")
        if state.startswith("23") and mode in (ledger_sql.TxMode.CHUNK, ledger_sql.TxMode.WRITE):
            return DponeError(
                errors.CHUNK_LEASE_LOST,
                f"{op}: a concurrent writer appended the same chunk transition first ({state})",
            )
        return self._database_error(op, f"{state} {self._message(exc)}")

    @contextmanager
    def _transaction(self, op: str, mode: ledger_sql.TxMode) -> Iterator[MssqlTx]:
        conn = self._connection()
        try:
            try:
                yield MssqlTx(self, conn)
            except BaseException:
                self._rollback(conn)
                raise
            conn.commit()
        except ledger_sql.WriteFailed:
            raise
        except self.driver.Error as exc:
            raise self._translate(exc, op, mode) from exc

    def _rollback(self, conn: Any) -> None:
        """Always roll back ourselves: a deadlock victim's (-3) transaction is left open."""
        try:
            conn.rollback()
        except self.driver.Error:
            self.close()

    def ensure_schema(self) -> None:
        """Create or migrate the audit schema under an applock, safely from many processes."""
        sql = self.statements
        with self._transaction("schema creation", ledger_sql.TxMode.CAMPAIGN) as tx:
            version = self._stored_version(tx)
            if version == ledger_sql.SCHEMA_VERSION:
                return
            self._check_version(version)
            code = tx.applock(f"dpone/{self.schema}/ddl", 60.0)
            if code not in APPLOCK_GRANTED:
                raise DponeError(
                    errors.LEDGER_UNAVAILABLE,
                    f"schema {self.schema!r}: the DDL lock request {APPLOCK_MEANING.get(code, code)}",
                )
            version = self._stored_version(tx)
            self._check_version(version)
            if tx._one(sql.schema_id, self.schema)[0] is None:
                tx.cursor.execute(sql.create_schema)
            for target in range(int(version or 0) + 1, ledger_sql.SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[target](sql.schema):
                    tx.cursor.execute(statement)
                tx.cursor.execute(sql.record_version, target)

    def inspect_schema(self) -> None:
        """Read the audit schema without creating or migrating anything (`dpone ledger list`)."""
        with self._transaction("reading the schema version", ledger_sql.TxMode.READ) as tx:
            version = self._stored_version(tx)
        self._inspected(version)

    def _stored_version(self, tx: MssqlTx) -> int | None:
        found = tx._one(self.statements.object_id, f"{self.statements.schema}.[schema_version]")
        if found is None or found[0] is None:
            return None
        row = tx._one(self.statements.version)
        if row is None or row[0] is None:
            return None
        if isinstance(row[0], int):
            return int(row[0])
        raise self._foreign_version_table()
