"""A recording pyodbc double with a tiny T-SQL engine, for the MSSQL connector's contract tests.

Every statement the connector sends is parsed with sqlglot (read="tsql"); a statement that does not
parse fails the test. The parse tree then drives an in-memory table store just far enough to give
the connector honest answers (chunk predicates with ? parameters, DELETE, INSERT .. VALUES
executemany, SELECT .. INTO #temp, INSERT .. SELECT, MERGE, DROP, catalog queries), with
transactions (snapshot on the first statement, restored on rollback) and typed columns converting
values the way SQL Server would. It proves the SQL is well-formed and quoted; it does not prove
SQL Server accepts it (docs/connectors.md: UNVERIFIED).
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import sqlglot
from sqlglot import exp


class FakeOdbcError(Exception):
    """pyodbc.Error-alike: args are (sqlstate, driver message)."""


Converter = Callable[[Any], Any]


def _to_date(v: Any) -> Any:
    if isinstance(v, str):
        return dt.date.fromisoformat(v[:10])
    return v.date() if isinstance(v, dt.datetime) else v


def _to_datetime2(v: Any) -> Any:
    if isinstance(v, str):
        v = dt.datetime.fromisoformat(v)
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        raise FakeOdbcError("HY000", "[HY000] tz-aware datetime is not a datetime2 value")
    return v


TYPES: dict[str, Converter] = {
    "int": lambda v: None if v is None else int(v),
    "date": lambda v: None if v is None else _to_date(v),
    "datetime2": lambda v: None if v is None else _to_datetime2(v),
    "decimal": lambda v: None if v is None else Decimal(str(v)).quantize(Decimal("0.01")),
    "nvarchar": lambda v: None if v is None else str(v),
}


#: How sys.dm_exec_describe_first_result_set spells each of the double's types
#: (a Table's ``declared`` overrides it per column).
SYSTEM_TYPE_NAMES = {
    "int": "int",
    "date": "date",
    "datetime2": "datetime2(7)",
    "decimal": "decimal(18,2)",
    "nvarchar": "nvarchar(max)",
}


@dataclass
class Table:
    columns: dict[str, str]  # name -> type in TYPES
    rows: list[dict[str, Any]] = field(default_factory=list)
    declared: dict[str, str] = field(default_factory=dict)  # name -> system_type_name

    def system_type_name(self, name: str) -> str:
        return self.declared.get(name, SYSTEM_TYPE_NAMES[self.columns.get(name, "nvarchar")])

    def coerce(self, name: str, value: Any) -> Any:
        return TYPES[self.columns.get(name, "nvarchar")](value)


def table_key(table: exp.Table) -> str:
    ident = table.this
    if isinstance(ident, exp.Identifier) and ident.args.get("temporary"):
        return "#" + ident.name
    return ".".join(part for part in (table.db, table.name) if part)


class Engine:
    """Tables by key ('schema.name' or '#temp'), plus a log of every statement."""

    def __init__(self) -> None:
        self.tables: dict[str, Table] = {}
        self.indexes: dict[str, list[tuple[int, bool, str]]] = {}
        self.log: list[tuple[str, str, Any]] = []
        self.fail: Callable[[str, str], Exception | None] = lambda kind, sql: None
        self.connects: list[tuple[str, bool]] = []
        self.commits = 0
        self.rollbacks = 0
        self.snapshot: dict[str, Table] | None = None

    # pyodbc module surface
    Error = FakeOdbcError

    def connect(self, connection_string: str, *, autocommit: bool) -> FakeConnection:
        self.connects.append((connection_string, autocommit))
        return FakeConnection(self, autocommit)

    def statements(self) -> list[str]:
        return [sql for _, sql, _ in self.log]

    # execution ------------------------------------------------------------------------------------
    def run(
        self, sql: str, params: Sequence[Any], autocommit: bool
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        tree = sqlglot.parse_one(sql, read="tsql")  # raises on anything that is not T-SQL
        if not autocommit and self.snapshot is None:
            self.snapshot = copy.deepcopy(self.tables)
        if isinstance(tree, exp.Set):
            return [], []
        if isinstance(tree, exp.Union):
            into = tree.this.args.get("into")
            assert into is not None, sql
            source = self.tables[table_key(tree.this.find(exp.From).this)]
            names = [c.name for c in tree.this.expressions]
            self.tables[table_key(into.this)] = Table({n: source.columns[n] for n in names})
            return [], []
        if isinstance(tree, exp.Select) and "dm_exec_describe_first_result_set" in sql:
            return self.describe_first_result_set(str(params[0]))
        if isinstance(tree, exp.Select):
            return self.select(tree, list(params))
        if isinstance(tree, exp.Delete):
            target = self.tables[table_key(tree.this)]
            keep = [
                r for r in target.rows if not self.matches(tree.args.get("where"), r, list(params))
            ]
            target.rows = keep
            return [], []
        if isinstance(tree, exp.Insert):
            target = self.tables[table_key(tree.this.this)]
            names = [i.name for i in tree.this.expressions]
            if isinstance(tree.expression, exp.Values):
                rows = [params]
            else:
                rows = self.select(tree.expression, list(params))[1]
            for values in rows:
                target.rows.append(
                    {n: target.coerce(n, v) for n, v in zip(names, values, strict=True)}
                )
            self.rowcount = len(rows)
            return [], []
        if isinstance(tree, exp.Merge):
            return self.merge(tree)
        if isinstance(tree, exp.Create):
            schema = tree.this
            kinds = {
                "NVARCHAR": "nvarchar",
                "BIGINT": "int",
                "INT": "int",
                "DATETIME2": "datetime2",
            }
            columns = {
                c.name: kinds.get(c.args["kind"].this.name, "nvarchar")
                for c in schema.expressions
                if isinstance(c, exp.ColumnDef)
            }
            self.tables[table_key(schema.this)] = Table(columns)
            return [], []
        if isinstance(tree, exp.Update):
            target = self.tables[table_key(tree.this)]
            queue = list(params)
            assignments: list[tuple[str, Any]] = []
            for eq in tree.expressions:  # SET parameters come first, then the WHERE ones
                if isinstance(eq.expression, exp.Placeholder):
                    assignments.append((eq.this.name, queue.pop(0)))
            count = 0
            for row in target.rows:
                if self.matches(tree.args.get("where"), row, list(queue)):
                    for name, value in assignments:
                        row[name] = target.coerce(name, value)
                    count += 1
            self.rowcount = count
            return [], []
        if isinstance(tree, exp.Drop):
            for table in tree.expressions:
                del self.tables[table_key(table)]
            return [], []
        raise AssertionError(f"the double does not know {type(tree).__name__}: {sql}")

    def describe_first_result_set(self, tsql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """(name, system_type_name) of the statement's columns, which must parse as T-SQL."""
        inner = sqlglot.parse_one(tsql, read="tsql")
        assert isinstance(inner, exp.Select), tsql
        source = inner.find(exp.From).this
        if isinstance(source, exp.Subquery):
            inner = source.this
            source = inner.find(exp.From).this
        table = self.tables[table_key(source)]
        star = any(
            isinstance(e, exp.Star) or isinstance(e.this, exp.Star) for e in inner.expressions
        )
        names = list(table.columns) if star else [e.alias_or_name for e in inner.expressions]
        return ["name", "system_type_name"], [(n, table.system_type_name(n)) for n in names]

    def select(
        self, tree: exp.Select, params: list[Any]
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        source = tree.find(exp.From).this
        if isinstance(source, exp.Subquery):
            source = source.this.find(exp.From).this
        key = table_key(source)
        if key == "sys.columns":
            name = params[0].replace("[", "").replace("]", "")
            table = self.tables.get(name)
            return ["name"], [(c,) for c in (table.columns if table else [])]
        if key == "sys.indexes":
            name = params[0].replace("[", "").replace("]", "")
            return ["index_id", "is_unique", "name"], list(self.indexes.get(name, []))
        table = self.tables[key]
        star = any(
            isinstance(e, exp.Star) or isinstance(e.this, exp.Star) for e in tree.expressions
        )
        names = list(table.columns) if star else [e.name for e in tree.expressions]
        limit = tree.args.get("limit")
        if limit is not None and int(limit.expression.name) == 0:
            return names, []
        rows = [r for r in table.rows if self.matches(tree.args.get("where"), r, params)]
        return names, [tuple(r[n] for n in names) for r in rows]

    def matches(self, where: exp.Where | None, row: dict[str, Any], params: list[Any]) -> bool:
        if where is None:
            return True
        exists = where.find(exp.Exists)
        if exists is not None:  # WHERE EXISTS (SELECT 1 FROM stage AS s WHERE s.k = t.k ..)
            sub = exists.this
            stage = self.tables[table_key(sub.find(exp.From).this)]
            keys = [eq.this.name for eq in sub.find_all(exp.EQ)]
            return any(all(s[k] == row[k] for k in keys) for s in stage.rows)
        equalities = list(where.find_all(exp.EQ))
        if equalities and all(isinstance(eq.expression, exp.Placeholder) for eq in equalities):
            # WHERE a = ? AND b = ? (the fence row), parameters in order
            return all(
                row.get(eq.this.name) == value for eq, value in zip(equalities, params, strict=True)
            )
        if isinstance(where.this, exp.EQ):  # WHERE 1 = 0
            return False
        lower, upper = where.this.this, where.this.expression
        assert isinstance(lower, exp.GTE) and isinstance(upper, exp.LT), where.sql("tsql")
        assert isinstance(lower.expression, exp.Placeholder)
        assert isinstance(upper.expression, exp.Placeholder)
        value = row[lower.this.name]
        return bool(value is not None and params[0] <= value < params[1])

    def merge(self, tree: exp.Merge) -> tuple[list[str], list[tuple[Any, ...]]]:
        target = self.tables[table_key(tree.this)]
        stage = self.tables[table_key(tree.args["using"])]
        keys = [eq.this.name for eq in tree.args["on"].find_all(exp.EQ)]
        whens = tree.args["whens"].expressions
        updated: list[str] = []
        inserted: list[str] = []
        for when in whens:
            then = when.args["then"]
            if isinstance(then, exp.Update):
                updated = [eq.this.name for eq in then.expressions]
            else:
                inserted = [c.name for c in then.this.expressions]
        count = 0
        for row in stage.rows:
            hit = next((t for t in target.rows if all(t[k] == row[k] for k in keys)), None)
            if hit is not None and updated:
                for name in updated:
                    hit[name] = target.coerce(name, row[name])
            elif hit is None:
                target.rows.append({n: target.coerce(n, row[n]) for n in inserted})
            count += 1
        self.rowcount = count
        return [], []

    rowcount = -1


class FakeCursor:
    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn
        self.engine = conn.engine
        self.fast_executemany = False
        self.description: list[tuple[Any, ...]] | None = None
        self._rows: list[tuple[Any, ...]] = []
        self.rowcount = -1

    def _check(self, kind: str, sql: str) -> None:
        if self.conn.closed:
            raise FakeOdbcError("08003", "[08003] connection is closed")
        failure = self.engine.fail(kind, sql)
        if failure is not None:
            raise failure

    def execute(self, sql: str, *params: Any) -> FakeCursor:
        if len(params) == 1 and isinstance(params[0], list | tuple):
            params = tuple(params[0])
        self.engine.log.append(("execute", sql, params))
        self._check("execute", sql)
        self.engine.rowcount = -1
        names, rows = self.engine.run(sql, params, self.conn.autocommit)
        self.description = [(n, None, None, None, None, None, True) for n in names] or None
        self._rows = list(rows)
        self.rowcount = self.engine.rowcount if self.engine.rowcount >= 0 else len(rows)
        return self

    def executemany(self, sql: str, seq: Sequence[Sequence[Any]]) -> None:
        self.engine.log.append(
            ("executemany", sql, {"rows": len(seq), "fast": self.fast_executemany})
        )
        self._check("executemany", sql)
        for params in seq:
            self.engine.run(sql, params, self.conn.autocommit)

    def fetchmany(self, n: int) -> list[tuple[Any, ...]]:
        out, self._rows = self._rows[:n], self._rows[n:]
        return out

    def fetchall(self) -> list[tuple[Any, ...]]:
        out, self._rows = self._rows, []
        return out

    def close(self) -> None:
        pass


class FakeConnection:
    def __init__(self, engine: Engine, autocommit: bool) -> None:
        self.engine = engine
        self.autocommit = autocommit
        self.closed = False
        self.converters: dict[int, Any] = {}

    def add_output_converter(self, sqltype: int, func: Any) -> None:
        self.converters[sqltype] = func

    def cursor(self) -> FakeCursor:
        return FakeCursor(self)

    def execute(self, sql: str, *params: Any) -> FakeCursor:
        return self.cursor().execute(sql, *params)

    def commit(self) -> None:
        self.engine.commits += 1
        self.engine.snapshot = None

    def rollback(self) -> None:
        self.engine.rollbacks += 1
        if self.engine.snapshot is not None:
            self.engine.tables = self.engine.snapshot
            self.engine.snapshot = None

    def close(self) -> None:
        self.closed = True
