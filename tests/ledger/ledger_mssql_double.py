"""A recording, pyodbc-shaped double of SQL Server, so the MSSQL ledger runs the contract tests.

No SQL Server runs here. The double keeps what matters to the ledger protocol real:

- every batch the adapter sends is recorded and parsed as T-SQL by sqlglot (tests re-parse each
  statement with ``parse_one(..., read="tsql")``);
- data statements are executed for real: the T-SQL AST is rewritten (``[schema].[table]`` ->
  ``schema__table``, type parameters dropped, column defaults parenthesized) and run on SQLite,
  with SYSUTCDATETIME / SCHEMA_ID / OBJECT_ID as SQLite functions;
- ``sp_getapplock`` is modelled: exclusive, transaction-owned (released on commit and rollback),
  bounded wait, return codes 0 (granted), 1 (granted after waiting) and -1 (timeout);
- SQLite's own lock serializes data transactions (BEGIN IMMEDIATE at the first data statement);
  the adapter always takes applocks before data statements, so the two never deadlock.
"""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.tokens import TokenType

TIMESTAMP_TEXT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}$")


class Error(Exception):
    """pyodbc.Error: args are (sqlstate, message)."""


class DatabaseError(Error):
    pass


class OperationalError(DatabaseError):
    pass


class IntegrityError(DatabaseError):
    pass


class ProgrammingError(DatabaseError):
    pass


def split_statements(batch: str) -> list[str]:
    """The statements of a T-SQL batch, split on top-level semicolons by sqlglot's tokenizer."""
    tokens = sqlglot.Dialect.get_or_raise("tsql").tokenize(batch)
    pieces: list[str] = []
    start = 0
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            pieces.append(batch[start : token.start].strip())
            start = token.end + 1
    pieces.append(batch[start:].strip())
    return [piece for piece in pieces if piece]


def _sqlite_name(schema: str, name: str) -> str:
    return f"{schema}__{name}"


def _object_name(text: str) -> str:
    parts = [part.strip('[]"') for part in text.split(".")]
    return _sqlite_name(parts[-2], parts[-1]) if len(parts) >= 2 else parts[-1]


def _to_sqlite(statement: exp.Expression) -> str:
    """Rewrite a parsed T-SQL statement into SQLite text (schemas flattened into table names)."""

    def rewrite(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and node.args.get("db") is not None:
            renamed = node.copy()
            renamed.set("this", exp.to_identifier(_sqlite_name(node.db, node.name), quoted=True))
            renamed.set("db", None)
            return renamed
        if isinstance(node, exp.National):
            return exp.Literal.string(node.name)
        if isinstance(node, exp.DataType):
            node = node.copy()
            node.set("expressions", [])
            return node
        if isinstance(node, exp.DefaultColumnConstraint) and isinstance(node.this, exp.Func):
            return exp.DefaultColumnConstraint(this=exp.Paren(this=node.this.copy()))
        return node

    if isinstance(statement, exp.Create) and isinstance(statement.this, exp.Index):
        index = statement.this
        table = index.args["table"]
        index.set("this", exp.to_identifier(_sqlite_name(table.db, index.name), quoted=True))
    return statement.transform(rewrite).sql(dialect="sqlite")


class MssqlDouble:
    """One fake server: a SQLite file, the applock table, the schema list and the statement log.

    It is also the pyodbc module surface the adapter uses (``connect`` and the exception classes).
    """

    Error = Error
    DatabaseError = DatabaseError
    OperationalError = OperationalError
    IntegrityError = IntegrityError
    ProgrammingError = ProgrammingError

    def __init__(self, directory: Path) -> None:
        self.path = directory / "mssql-double.sqlite"
        self.statements: list[str] = []
        self.connection_strings: list[str] = []
        self._guard = threading.Condition()
        self._applocks: dict[str, tuple[int, int]] = {}  # resource -> (connection id, count)
        self._generation = 0
        with sqlite3.connect(self.path) as setup:
            setup.execute("PRAGMA journal_mode=WAL")
            setup.execute("CREATE TABLE IF NOT EXISTS __schemas (name TEXT PRIMARY KEY)")

    def connect(self, connection_string: str, autocommit: bool = False) -> DoubleConnection:
        self.connection_strings.append(connection_string)
        return DoubleConnection(self, autocommit)

    def kill_connections(self) -> None:
        """Simulate a server restart: every open connection fails on its next call."""
        with self._guard:
            self._generation += 1
            self._applocks.clear()
            self._guard.notify_all()

    # --- applocks --------------------------------------------------------------------------------
    def applock(self, owner: int, resource: str, timeout_ms: int) -> int:
        deadline = time.monotonic() + timeout_ms / 1000
        waited = False
        with self._guard:
            while True:
                holder = self._applocks.get(resource)
                if holder is None or holder[0] == owner:
                    count = 0 if holder is None else holder[1]
                    self._applocks[resource] = (owner, count + 1)
                    return 1 if waited else 0
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return -1
                waited = True
                self._guard.wait(remaining)

    def release_applocks(self, owner: int) -> None:
        with self._guard:
            for resource in [r for r, (o, _) in self._applocks.items() if o == owner]:
                del self._applocks[resource]
            self._guard.notify_all()

    def held_applocks(self) -> list[str]:
        with self._guard:
            return sorted(self._applocks)


class DoubleConnection:
    """pyodbc.Connection: implicit transactions (autocommit=False), commit(), rollback()."""

    _ids = iter(range(1, 1 << 62))

    def __init__(self, server: MssqlDouble, autocommit: bool) -> None:
        self.server = server
        self.autocommit = autocommit
        self.id = next(self._ids)
        self.generation = server._generation
        self.closed = False
        self.in_transaction = False
        self.db = sqlite3.connect(
            server.path, isolation_level=None, check_same_thread=False, timeout=30
        )
        self.db.create_function("SYSUTCDATETIME", 0, self._utc_now)
        self.db.create_function("SCHEMA_ID", 1, self._schema_id)
        self.db.create_function("OBJECT_ID", 2, self._object_id)

    @staticmethod
    def _utc_now() -> str:
        return dt.datetime.now(dt.UTC).replace(tzinfo=None).isoformat(" ", "microseconds")

    def _schema_id(self, name: str) -> int | None:
        row = self.db.execute("SELECT rowid FROM __schemas WHERE name = ?", (name,)).fetchone()
        return None if row is None else int(row[0])

    def _object_id(self, name: str, kind: str) -> int | None:
        row = self.db.execute(
            "SELECT rowid FROM sqlite_master WHERE type = 'table' AND name = ?",
            (_object_name(name),),
        ).fetchone()
        return None if row is None else int(row[0])

    def check_alive(self) -> None:
        if self.closed:
            raise ProgrammingError("08003", "Attempt to use a closed connection.")
        if self.generation != self.server._generation:
            raise OperationalError(
                "08S01", "[08S01] Communication link failure (double: server restarted)"
            )

    def begin(self) -> None:
        if not self.in_transaction and not self.autocommit:
            self.db.execute("BEGIN IMMEDIATE")
            self.in_transaction = True

    def cursor(self) -> DoubleCursor:
        self.check_alive()
        return DoubleCursor(self)

    def commit(self) -> None:
        self.check_alive()
        if self.in_transaction:
            self.db.execute("COMMIT")
            self.in_transaction = False
        self.server.release_applocks(self.id)

    def rollback(self) -> None:
        self.check_alive()
        self._end()

    def _end(self) -> None:
        if self.in_transaction:
            self.db.execute("ROLLBACK")
            self.in_transaction = False
        self.server.release_applocks(self.id)

    def close(self) -> None:
        if not self.closed:
            self._end()
            self.db.close()
            self.closed = True


class DoubleCursor:
    """pyodbc.Cursor: execute(sql, *params), executemany, fetchone/fetchall, nextset, description."""

    def __init__(self, connection: DoubleConnection) -> None:
        self.connection = connection
        self.description: Any = None
        self.rowcount = -1
        self.fast_executemany = False
        self._rows: list[tuple[Any, ...]] = []
        self._variables: dict[str, Any] = {}

    def execute(self, sql: str, *params: Any) -> DoubleCursor:
        if len(params) == 1 and isinstance(params[0], list | tuple):
            params = tuple(params[0])
        self.connection.check_alive()
        self.connection.server.statements.append(sql)
        self.description, self._rows = None, []
        queue = [_bindable(value) for value in params]
        for statement in sqlglot.parse(sql, read="tsql"):
            assert statement is not None
            self._run(statement, queue)
        if queue:
            raise ProgrammingError("07002", f"{len(queue)} parameters left unbound")
        return self

    def executemany(self, sql: str, seq_of_params: Sequence[Sequence[Any]]) -> None:
        for params in seq_of_params:
            self.execute(sql, *params)

    def _run(self, statement: exp.Expression, queue: list[Any]) -> None:
        placeholders = len(list(statement.find_all(exp.Placeholder)))
        params, queue[:] = queue[:placeholders], queue[placeholders:]
        if isinstance(statement, exp.Set | exp.Declare):
            return
        if isinstance(statement, exp.Execute):
            self._execute_procedure(statement, params)
            return
        if isinstance(statement, exp.Select) and all(
            isinstance(e.unalias(), exp.Parameter) for e in statement.expressions
        ):
            names = [e.unalias().name for e in statement.expressions]
            self._rows = [tuple(self._variables.get(name) for name in names)]
            self.description = [(name,) for name in names]
            return
        if (
            isinstance(statement, exp.Create)
            and str(statement.args.get("kind")).upper() == "SCHEMA"
        ):
            self.connection.begin()
            self._sqlite(
                "INSERT INTO __schemas (name) VALUES (?)",
                [statement.this.db or statement.this.name],
            )
            return
        self.connection.begin()
        self._sqlite(_to_sqlite(statement), params)

    def _execute_procedure(self, statement: exp.Execute, params: list[Any]) -> None:
        name = statement.this.name.lower()
        if name != "sp_getapplock":
            raise ProgrammingError("2812", f"Could not find stored procedure '{name}'.")
        queue = list(params)
        args: dict[str, Any] = {}
        for assignment in statement.expressions:
            value = assignment.expression
            args[assignment.this.name.lower()] = (
                queue.pop(0) if isinstance(value, exp.Placeholder) else value.name
            )
        if args.get("lockowner") != "Transaction" or args.get("lockmode") != "Exclusive":
            raise ProgrammingError(
                "42000", f"the double models Exclusive Transaction applocks only: {args}"
            )
        code = self.connection.server.applock(
            self.connection.id, str(args["resource"]), int(args["locktimeout"])
        )
        status = statement.args.get("return_status")
        if status is not None:
            self._variables[status.name] = code

    def _sqlite(self, sql: str, params: Sequence[Any]) -> None:
        try:
            cursor = self.connection.db.execute(sql, tuple(params))
        except sqlite3.IntegrityError as exc:
            raise IntegrityError("23000", f"[23000] Violation of constraint: {exc}") from exc
        except sqlite3.Error as exc:
            raise ProgrammingError("42000", f"[42000] {exc} (sqlite: {sql})") from exc
        self.rowcount = cursor.rowcount
        if cursor.description is not None:
            self.description = cursor.description
            self._rows = [tuple(_result(value) for value in row) for row in cursor.fetchall()]

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows.pop(0) if self._rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows

    def nextset(self) -> bool:
        return False


def _bindable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            raise ProgrammingError(
                "22007", "pyodbc sends DATETIME2 without a zone: got an aware datetime"
            )
        return value.isoformat(" ", "microseconds")
    return value


def _result(value: Any) -> Any:
    if isinstance(value, str) and TIMESTAMP_TEXT.match(value):
        return dt.datetime.fromisoformat(value)
    return value
