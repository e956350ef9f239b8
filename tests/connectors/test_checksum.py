"""The row checksum: one definition, computed identically in Python and in Postgres SQL."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from dpone.connectors.base import (
    RowChecksum,
    canonical_decimal,
    canonical_float,
    canonical_text,
    chained_row_hash,
    format_checksum,
    pg_hash64,
)
from dpone.connectors.postgres import PgConnection, checksum_select, checksum_value
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from .support import Pg


def test_canonical_forms() -> None:
    assert canonical_text(None) is None
    assert [canonical_text(v) for v in (True, False, 12, Decimal("12.00"), 12.0)] == [
        "1",
        "0",
        "12",
        "12",
        "12",
    ]
    assert canonical_decimal(Decimal("-0.000")) == "0"
    assert canonical_decimal(Decimal("1E+3")) == "1000"
    assert canonical_decimal(Decimal("12345678901234567890123456789.1230")) == (
        "12345678901234567890123456789.123"
    )
    assert canonical_float(0.1 + 0.2) == "0.3"  # 15 significant digits, as Postgres casts
    assert canonical_float(float("inf")) == "Infinity"
    assert canonical_float(1e16) == "10000000000000000"
    stamp = dt.datetime(2024, 1, 1, 5, 30, 0, 250000, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    assert canonical_text(stamp) == "2024-01-01 00:30:00.25"
    assert canonical_text(dt.datetime(2024, 1, 1)) == "2024-01-01 00:00:00"
    assert canonical_text(b"\x00\xff") == "\\x00ff"


def test_checksum_is_order_independent_and_counts_duplicates() -> None:
    rows = [(1, "a"), (2, None), (3, 'q"uote')]
    one, two, dup = RowChecksum(["id", "v"]), RowChecksum(["id", "v"]), RowChecksum(["id", "v"])
    one.add_many(rows)
    two.add_many(list(reversed(rows)))
    dup.add_many(rows + rows[:1])
    assert one.value() == two.value() != dup.value()
    # physical column order does not matter: fields are hashed in column-name order
    swapped = RowChecksum(["v", "id"])
    swapped.add_many([(v, i) for i, v in rows])
    assert swapped.value() == one.value()
    # NULL and the empty string differ
    null, empty = RowChecksum(["v"]), RowChecksum(["v"])
    null.add((None,))
    empty.add(("",))
    assert null.value() != empty.value()


def test_checksum_scheme_is_frozen() -> None:
    """A change here changes every stored checksum: bump CHECKSUM_SCHEME instead."""
    check = RowChecksum(["id", "name", "day"])
    check.add_many([(1, 'a "b", c', dt.date(2024, 1, 1)), (2, None, dt.date(2024, 1, 2))])
    first = pg_hash64(b'"2024-01-01","1","a ""b"", c"')
    second = pg_hash64(b'"2024-01-02","2",N')
    assert check.value() == format_checksum(2, first + second)
    assert check.value().startswith("rowsum-pghash64-v1:2:")
    # fixed vectors of Postgres 15's hashtextextended(text, 0) on x86_64
    assert pg_hash64(b"") == 0x9FB1B765A7EA466D
    assert pg_hash64(b"dpone") == 0x04F0519AEAE8132D


def test_the_chained_form_is_frozen_and_depends_on_where_each_field_stands() -> None:
    """Two Postgres sides chain a row's fields (ADR 0027): each hashed alone, seeded with the
    hash of the fields before it, ``N`` for NULL, ``"`` + text otherwise. No two field lists
    share a hash for being joined alike (a separator in a value, NULL against 'N' or '')."""
    check = RowChecksum(["id", "name"], chained=True)
    check.add_many([(1, 'a "b", c'), (2, None)])
    first = pg_hash64(b'"a "b", c', pg_hash64(b'"1'))
    second = pg_hash64(b"N", pg_hash64(b'"2'))
    assert check.value() == format_checksum(2, first + second, "rowsum-pgchain64-v1")
    # fixed vectors of Postgres 15's hashtextextended(text, seed) on x86_64
    assert pg_hash64(b"abc", (-5) % 2**64) == 6598607941938570015
    assert pg_hash64(b"abc", 1234567890123) == (-7559745029679409952) % 2**64
    rows = [
        ["a", "b"],
        ["b", "a"],
        ["a,b", ""],
        ["a", "b,"],
        ['a"', "b"],
        ["a", '"b'],
        [None, "N"],
        ["N", None],
        [None, ""],
        ["", None],
        [None, None],
        ["", ""],
    ]
    assert len({chained_row_hash(row) for row in rows}) == len(rows)


@pytest.mark.postgres
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    texts=st.lists(
        st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=70),
        max_size=60,
    ),
    seed=st.integers(-(2**63), 2**63 - 1),
)
def test_pg_hash64_is_hashtextextended(pg: Pg, texts: list[str], seed: int) -> None:
    found = pg.rows(
        'SELECT hashtextextended(s COLLATE "C", 0), hashtextextended(s COLLATE "C", %s)'
        " FROM unnest(%s::text[]) WITH ORDINALITY AS t(s, i) ORDER BY i",
        (seed, texts),
    )
    assert [int(v) % 2**64 for v, _ in found] == [pg_hash64(t.encode()) for t in texts]
    assert [int(v) % 2**64 for _, v in found] == [
        pg_hash64(t.encode(), seed % 2**64) for t in texts
    ]


# --- Python == Postgres SQL, for generated values -------------------------------------------------
_TYPES: dict[str, st.SearchStrategy[Any]] = {
    "bigint": st.integers(-(2**63), 2**63 - 1),
    "numeric(30,6)": st.decimals(min_value=-(10**20), max_value=10**20, places=6, allow_nan=False),
    "numeric": st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
        lambda d: abs(d.adjusted()) < 100
    ),
    "float8": st.floats(allow_nan=True, allow_infinity=True),
    "text": st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00")),
    "date": st.dates(min_value=dt.date(1000, 1, 1), max_value=dt.date(9999, 12, 31)),
    "timestamptz": st.datetimes(
        min_value=dt.datetime(1000, 1, 2),
        max_value=dt.datetime(9999, 12, 30),
        timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=-7, minutes=-30))]),
    ),
    "timestamp": st.datetimes(
        min_value=dt.datetime(1000, 1, 1), max_value=dt.datetime(9999, 12, 31)
    ),
    "bool": st.booleans(),
    "bytea": st.binary(max_size=20),
}
_NAMES = [f"c{i}_{t.split('(')[0]}" for i, t in enumerate(_TYPES)]


@pytest.mark.postgres
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.lists(st.tuples(*(st.none() | s for s in _TYPES.values())), min_size=0, max_size=8),
    not_null=st.sets(st.sampled_from(_NAMES)),
)
def test_python_and_postgres_agree(pg: Pg, rows: list[tuple[Any, ...]], not_null: set[str]) -> None:
    """Also with columns named NOT NULL that hold NULLs: the short form must fall back, never
    hash a wrong text."""
    conn = PgConnection(pg.dsn, "test").get()
    try:
        with conn.transaction(force_rollback=True), conn.cursor() as cur:
            cur.execute(
                sql.SQL("CREATE TEMP TABLE gen ({})").format(
                    sql.SQL(", ").join(
                        sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t))  # type: ignore[arg-type]
                        for n, t in zip(_NAMES, _TYPES, strict=True)
                    )
                )
            )
            with cur.copy("COPY gen FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            cur.execute("SELECT * FROM gen LIMIT 0")
            typed = [(d.name, int(d.type_code)) for d in cur.description or []]
            cur.execute(checksum_select(sql.SQL("gen"), typed))
            in_sql = checksum_value(cur.fetchone())[1]
            cur.execute(checksum_select(sql.SQL("gen"), typed, not_null))
            short_form = checksum_value(cur.fetchone())[1]
            cur.execute(checksum_select(sql.SQL("gen"), typed, chained=True))
            chained_sql = checksum_value(cur.fetchone(), chained=True)[1]
            cur.execute("SELECT * FROM gen")
            loaded = cur.fetchall()
    finally:
        conn.close()
    written, read = RowChecksum(_NAMES), RowChecksum(_NAMES)
    written.add_many(rows)
    read.add_many(loaded)
    assert in_sql == short_form == read.value() == written.value()
    chained = RowChecksum(_NAMES, chained=True)
    chained.add_many(loaded)
    assert chained_sql == chained.value()
