"""Between two Postgres sides the checksum chains each row's fields' canonical texts (ADR 0027),
never the row as Postgres's own hash functions combine it: those fold a bigint, time or
timestamp to 32 bits, hash NaN and both infinities of numeric alike, hash a float 0 as a NULL,
and combine a row's column hashes linearly (values swapped between rows sum the same). Each pair
below held equal sums in that record form; both the chained form and the joined text every
dialect computes tell every one apart, as plain SQL does, and so they do for rows whose fields
a careless chain or join could confuse (a value moved across a field boundary, NULL and 'N')."""

from __future__ import annotations

import pytest
from dpone.connectors import TableRef, pair_checksums, table_checksum

from .support import Pg

pytestmark = pytest.mark.postgres

# (column type, rows of a, rows of b): each pair differs, as EXCEPT ALL shows
PAIRS = [
    ("integer, y text", "(1, 10, '100'), (2, 20, '200')", "(1, 10, '200'), (2, 20, '100')"),
    ("double precision", "(1, NULL)", "(1, 0)"),
    ("real", "(1, NULL)", "(1, 0)"),
    (
        "numeric",
        "(1, NULL), (2, 'Infinity'), (3, 'NaN')",
        "(1, 'NaN'), (2, '-Infinity'), (3, NULL)",
    ),
    ("bigint", "(1, 1), (2, -1)", "(1, 4294967296), (2, -4294967298)"),
    ("time", "(1, '00:00:00.000001')", "(1, '01:11:34.967296')"),
    ("timestamp", "(1, '2024-06-01 12:00:00')", "(1, '2024-06-01 10:48:25.032705')"),
    ("timestamptz", "(1, '2024-06-01 12:00:00+00')", "(1, '2024-06-01 10:48:25.032705+00')"),
    ("text", "(1, 'k119510')", "(1, 'k174879')"),
    ("text, y text", "(1, 'a,b', '')", "(1, 'a', 'b,')"),
    ("text, y text", "(1, 'a\"', 'b')", "(1, 'a', '\"b')"),
    ("text, y text", "(1, NULL, 'N')", "(1, 'N', NULL)"),
    ("text, y text", "(1, NULL, '')", "(1, '', NULL)"),
]


@pytest.mark.parametrize(("kind", "a", "b"), PAIRS, ids=[p[0].split(",")[0] for p in PAIRS])
def test_rows_postgres_hashes_alike_have_different_checksums(
    pg: Pg, kind: str, a: str, b: str
) -> None:
    schema = pg.schema()
    for name, rows in (("a", a), ("b", b)):
        pg.run(f'CREATE TABLE "{schema}".{name} (id int NOT NULL, x {kind})')
        pg.run(f'INSERT INTO "{schema}".{name} VALUES {rows}')
    differing = pg.rows(
        f'(SELECT * FROM "{schema}".a EXCEPT ALL SELECT * FROM "{schema}".b) UNION ALL '
        f'(SELECT * FROM "{schema}".b EXCEPT ALL SELECT * FROM "{schema}".a)'
    )
    assert differing, "the pair must differ"
    one, other = TableRef(schema, "a"), TableRef(schema, "b")
    compared = pair_checksums((pg.dsn, one), (pg.dsn, other))
    assert compared[0] != compared[1]
    assert all(c.startswith("rowsum-pgchain64-v1:") for c in compared)
    joined = (table_checksum(pg.dsn, one), table_checksum(pg.dsn, other))
    assert joined[0] != joined[1]
    assert all(c.startswith("rowsum-pghash64-v1:") for c in joined)
