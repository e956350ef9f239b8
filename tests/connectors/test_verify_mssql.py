"""`dpone verify` over MSSQL, contract-tested through the recording pyodbc double (no SQL Server
runs here: the statements' shape and the comparison are proven, a live server is UNVERIFIED).

The expected checksums are computed independently of the double, from the test rows themselves.
"""

from __future__ import annotations

import copy
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlglot
from dpone.campaign.reconcile import compare_process
from dpone.connectors.base import (
    ChunkWindow,
    RowChecksum,
    SinkOptions,
    SinkSpec,
    Source,
    SourceSpec,
    TableRef,
)
from dpone.connectors.factory import open_source
from dpone.connectors.mssql import MssqlSink, MssqlSource
from dpone.packing.pack import ProcessPlan, load_workload_pack
from sqlglot import exp

from .mssql_double import Engine, Table
from .support import COLUMNS, ROWS, create_sqlite, in_window
from .test_mssql import DSN, TYPES, load

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {{connection: {source}, table: {{schema: {schema}, name: {table}}}}}
    sink:
      connection: wh
      table: {{schema: dbo, name: orders}}
      keys: [id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2024-01-01, end: 2024-01-07, step: 2, unit: day}}
      inner_mode: replace
    state: {{backend: local_file, path: ledger}}
"""


def _plan(
    tmp_path: Path, source: str = "wh", schema: str = "dbo", table: str = "src"
) -> ProcessPlan:
    (tmp_path / "workloads.yaml").write_text(CATALOG)
    (tmp_path / "orders.yaml").write_text(
        MANIFEST.format(source=source, schema=schema, table=table)
    )
    return load_workload_pack(str(tmp_path / "workloads.yaml"), "orders").processes[0]


def _opener(engine: Engine) -> Callable[[SourceSpec, str], Source]:
    def open_side(spec: SourceSpec, dsn: str) -> Source:
        if dsn.startswith("mssql://"):
            return MssqlSource(spec, dsn, driver=engine)  # type: ignore[arg-type]
        return open_source(spec, dsn)

    return open_side


def _expected(plan: ProcessPlan) -> list[str]:
    """Each chunk's checksum from the test rows, without any connector or double."""
    out = []
    for chunk in plan.chunks:
        window = ChunkWindow("order_date", "date", chunk.start, chunk.end)
        check = RowChecksum(COLUMNS)
        check.add_many([r for r in ROWS if in_window(r, window)])
        out.append(check.value())
    return out


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Engine:
    monkeypatch.setenv("DPONE_CONN_WH", DSN)
    eng = Engine()
    load(eng, "dbo.src")
    return eng


def test_mssql_source_and_target_compared_chunk_by_chunk(engine: Engine, tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    assert plan.chunks_total == 3
    engine.tables["dbo.orders"] = copy.deepcopy(engine.tables["dbo.src"])
    compared = compare_process(plan, None, _opener(engine))
    assert [c.index for c in compared] == [1, 2, 3]
    assert all(c.matches for c in compared)
    assert [c.source_checksum for c in compared] == _expected(plan)
    assert sum(c.source_rows for c in compared) == len(ROWS)
    # nothing but reads: SET XACT_ABORT ON at connect, then SELECTs
    trees = [sqlglot.parse_one(sql, read="tsql") for sql in engine.statements()]
    assert trees and all(isinstance(t, exp.Select | exp.Set) for t in trees), engine.statements()
    assert any(isinstance(t, exp.Select) and t.find(exp.Where) for t in trees)

    target = engine.tables["dbo.orders"]
    changed = next(r for r in target.rows if str(r["order_date"]) == "2024-01-03")
    changed["amount"] = target.coerce("amount", "999.99")
    lost = next(r for r in target.rows if str(r["order_date"]) == "2024-01-06")
    target.rows.remove(lost)
    compared = compare_process(plan, [2, 3], _opener(engine))
    assert [(c.index, c.matches) for c in compared] == [(2, False), (3, False)]
    assert compared[0].source_rows == compared[0].target_rows
    assert compared[1].target_rows == compared[1].source_rows - 1
    assert compare_process(plan, [1], _opener(engine))[0].matches


def test_sqlite_source_verified_against_an_mssql_target(
    engine: Engine,
    tmp_path: Path,
    sqlite_db: Callable[[str], tuple[str, sqlite3.Connection]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Across kinds: the rows dpone moved from SQLite into MSSQL prove equal by checksum."""
    dsn, conn = sqlite_db("src")
    create_sqlite(conn)
    monkeypatch.setenv("DPONE_CONN_LOCAL", dsn)
    plan = _plan(tmp_path, source="local", schema="main", table="orders")
    engine.tables["dbo.orders"] = Table(dict(TYPES))
    spec = SinkSpec("wh", TableRef("dbo", "orders"), "replace")
    sink = MssqlSink(spec, DSN, SinkOptions(), driver=engine)  # type: ignore[arg-type]
    with open_source(SourceSpec("local", table=TableRef("main", "orders")), dsn) as source:
        for chunk in plan.chunks[:2]:
            sink.write_chunk(source, ChunkWindow("order_date", "date", chunk.start, chunk.end))
    sink.close()
    compared = compare_process(plan, None, _opener(engine))
    assert [(c.index, c.matches) for c in compared] == [(1, True), (2, True), (3, False)]
    assert [c.source_checksum for c in compared] == _expected(plan)
    assert compared[2].target_rows == 0
