"""The relay estimates of bench/campaign_floors.py do the whole work of the runs beside them.

An estimate that skipped rows, chunks or the ledger would make dpone's own code look slower than
it is: each one here moves a small copy of the benchmark's table (365 daily chunks) on a real
server, and the target must then hold exactly the source's rows.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.pg import fresh_schema_name, require_postgres

BENCH = Path(__file__).resolve().parents[2] / "bench"
COLUMNS = "id, order_date, customer, amount, payload"
DDL = (
    "CREATE TABLE {} (id bigint NOT NULL, order_date date NOT NULL, customer text NOT NULL,"
    " amount numeric(12,2) NOT NULL, payload text)"
)


@pytest.fixture(scope="module")
def floors() -> Iterator[object]:
    sys.path.insert(0, str(BENCH))
    try:
        import campaign_floors

        yield campaign_floors
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture
def tables() -> Iterator[tuple[str, str, str]]:
    """The DSN, a source table of 3,650 rows (10 a day of 2023, one with a NULL payload) and
    an empty target table, each in its own throwaway schema."""
    dsn = require_postgres()
    src_schema, dst_schema = fresh_schema_name("dpone_fsrc"), fresh_schema_name("dpone_fdst")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in (src_schema, dst_schema):
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            conn.execute(sql.SQL(DDL).format(sql.Identifier(schema, "orders")))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} SELECT g, date '2023-01-01' + (g - 1) / 10,"
                " 'customer_' || (g % 7), g * 1.25,"
                " CASE WHEN g = 1234 THEN NULL ELSE 'p\"' || g END"
                " FROM generate_series(1, 3650) AS g"
            ).format(sql.Identifier(src_schema, "orders"))
        )
    try:
        yield dsn, f"{src_schema}.orders", f"{dst_schema}.orders"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for schema in (src_schema, dst_schema):
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )


def facts(dsn: str, table: str) -> tuple[int, int, int]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            f"SELECT count(*), sum(id), count(DISTINCT order_date) FROM {table}"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1] or 0), int(row[2])


def test_each_relay_estimate_moves_every_row_of_every_chunk(
    floors: object, tables: tuple[str, str, str]
) -> None:
    dsn, source, target = tables
    cf = floors  # the module, typed loosely: the bench folder is not a package
    expected = facts(dsn, source)
    assert expected == (3650, 3650 * 3651 // 2, 365)

    def statements() -> dict[str, str]:
        # read from the source table, written to the target table: the same SQL but for names
        read = cf.relay_statements(source, COLUMNS)  # type: ignore[attr-defined]
        write = cf.relay_statements(target, COLUMNS)  # type: ignore[attr-defined]
        return {
            "copy_out": read["copy_out"],
            **{k: write[k] for k in ("copy_in", "delete")},
            "checksum": write["checksum"],
        }

    runs = {
        "relay, 4 processes": lambda: cf.relay_processes(  # type: ignore[attr-defined]
            dsn, dsn, statements(), 4
        ),
        "relay, 40 interpreters x 8": lambda: cf.relay_items(  # type: ignore[attr-defined]
            sys.executable, dsn, dsn, statements(), 40, 8
        ),
        "relay + ledger, reading ahead": lambda: (
            cf.relay_with_ledger_reading_ahead(dsn, dsn, statements())  # type: ignore[attr-defined]
        ),
    }
    for name, run in runs.items():
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {target}")
        assert run() > 0
        assert facts(dsn, target) == expected, name


def test_the_summary_estimate_cuts_the_days_as_contiguous_items(floors: object) -> None:
    days = floors._iso_days()  # type: ignore[attr-defined]
    items = floors.contiguous(days, 40)  # type: ignore[attr-defined]
    assert [len(item) for item in items] == [10] * 5 + [9] * 35
    assert [day for item in items for day in item] == days
