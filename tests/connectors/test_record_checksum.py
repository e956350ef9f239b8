"""The record form of the checksum between two Postgres sides (ADR 0023), on the real server.

Each pair of values the canonical text tells apart, the record form tells apart too; values the
canonical text calls equal, it calls equal, across the types Postgres hashes alike; two sides
whose columns do not hash alike agree on the canonical text. The gate in the record form still
refuses a chunk the sink changed.
"""

from __future__ import annotations

import pytest
from dpone import errors
from dpone.connectors import (
    ChunkWindow,
    SinkOptions,
    SinkSpec,
    SourceSpec,
    TableRef,
    open_sink,
    open_source,
    pair_checksums,
    table_checksum,
)
from dpone.connectors.record_hash import hash_family, same_hash_families
from dpone.errors import DponeError

from .support import Pg

pytestmark = pytest.mark.postgres
RECORD, TEXT = "rowsum-pgrecord-v2:", "rowsum-pghash64-v1:"
CI = "COLLATE {schema}.dpone_ci"  # a nondeterministic (case-insensitive) ICU collation


def _schema_with_collation(pg: Pg) -> str:
    """A new schema holding the collation CI names (in the schema: dropped with it, and two
    tests at once never race to create one name)."""
    schema = pg.schema()
    pg.run(
        f'CREATE COLLATION "{schema}".dpone_ci '
        "(provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
    )
    return schema


def _sides(pg: Pg, a_type: str, b_type: str, a: str, b: str) -> str:
    """Two one-row tables ``a`` and ``b`` (``id``, ``v``) holding the SQL literals ``a``, ``b``."""
    schema = _schema_with_collation(pg)
    for name, declared, value in (("a", a_type, a), ("b", b_type, b)):
        kind = declared.replace("{schema}", f'"{schema}"')
        pg.run(f'CREATE TABLE "{schema}".{name} (id int NOT NULL, v {kind})')
        pg.run(f'INSERT INTO "{schema}".{name} VALUES (1, {value})')
    return schema


def _both_forms(pg: Pg, schema: str) -> tuple[tuple[str, str], tuple[str, str]]:
    a, b = TableRef(schema, "a"), TableRef(schema, "b")
    agreed = pair_checksums((pg.dsn, a), (pg.dsn, b))
    text = (table_checksum(pg.dsn, a), table_checksum(pg.dsn, b))
    return agreed, text


@pytest.mark.parametrize(
    ("a_type", "b_type", "a", "b"),
    [
        ("numeric", "numeric", "1.25", "1.2"),
        ("numeric(12,2)", "numeric(12,2)", "1.25", "1.3"),
        ("integer", "bigint", "5", "6"),
        ("bigint", "smallint", "-7", "7"),
        ("integer", "integer", "0", "NULL"),
        ("text", "text", "''", "NULL"),
        ("text", "varchar(10)", "'Zoë'", "'Zoe'"),
        (f"text {CI}", f"text {CI}", "'Abc'", "'abc'"),
        ("char(5)", "char(5)", "'ab'", "'abc'"),
        ("double precision", "double precision", "0.1", "0.1000000001"),
        ("real", "real", "1.5", "1.25"),
        ("boolean", "boolean", "true", "false"),
        ("date", "date", "'2024-01-01'", "'2024-01-02'"),
        ("time", "time", "'10:00:00.5'", "'10:00:00'"),
        ("timestamp", "timestamp", "'2024-01-01 10:00:00.7'", "'2024-01-01 10:00:01'"),
        (
            "timestamptz",
            "timestamptz",
            "'2024-01-01 10:00:00+00'",
            "'2024-01-01 10:00:00.000001+00'",
        ),
        ("uuid", "uuid", "'00000000-0000-0000-0000-000000000001'", "gen_random_uuid()"),
        ("bytea", "bytea", "'\\x00'", "'\\x0000'"),
    ],
)
def test_values_the_canonical_text_tells_apart_the_record_form_tells_apart(
    pg: Pg, a_type: str, b_type: str, a: str, b: str
) -> None:
    agreed, text = _both_forms(pg, _sides(pg, a_type, b_type, a, b))
    assert text[0] != text[1]  # a real difference
    assert agreed[0].startswith(RECORD) and agreed[1].startswith(RECORD)
    assert agreed[0] != agreed[1]


@pytest.mark.parametrize(
    ("a_type", "b_type", "a", "b"),
    [
        ("numeric", "numeric", "1.50", "1.5"),
        ("numeric(12,2)", "numeric(14,4)", "1.5", "1.5"),
        ("integer", "bigint", "-2147483648", "-2147483648"),
        ("smallint", "bigint", "32767", "32767"),
        ("text", "varchar(10)", "'Zoë \"q\"'", "'Zoë \"q\"'"),
        ("char(3)", "char(6)", "'ab'", "'ab'"),
        ("double precision", "double precision", "'-0'", "0"),
        (
            "timestamptz",
            "timestamptz",
            "'2024-01-01 10:00:00+00'",
            "'2024-01-01 12:00:00+02'",
        ),
        ("interval", "interval", "'1 day'", "'24 hours'::interval + '0 s'"),
        ("jsonb", "jsonb", '\'{"b": 1, "a": 2}\'', '\'{"a": 2, "b": 1}\''),
    ],
)
def test_values_the_canonical_text_calls_equal_the_record_form_calls_equal(
    pg: Pg, a_type: str, b_type: str, a: str, b: str
) -> None:
    agreed, text = _both_forms(pg, _sides(pg, a_type, b_type, a, b))
    if text[0] != text[1]:  # '1 day' and '24 hours' are two texts: the forms agree on that too
        assert agreed[0] != agreed[1]
        return
    assert agreed[0] == agreed[1] and agreed[0].startswith(RECORD)


@pytest.mark.parametrize(
    ("a_type", "b_type"),
    [("integer", "numeric"), ("date", "timestamp"), ("real", "double precision")],
)
def test_sides_whose_columns_hash_apart_agree_on_the_canonical_text(
    pg: Pg, a_type: str, b_type: str
) -> None:
    value = "'2024-01-01'" if a_type == "date" else "1"
    agreed, text = _both_forms(pg, _sides(pg, a_type, b_type, value, value))
    assert agreed == text and agreed[0].startswith(TEXT)


def test_the_families_are_the_ones_postgres_hashes_alike() -> None:
    assert hash_family(23) == hash_family(20) == hash_family(21) == "integer"
    assert hash_family(25) == hash_family(1043) == "text"
    assert hash_family(1042) == "bpchar" and hash_family(26) is None  # oid: unsigned
    assert hash_family(3802) is None  # jsonb: hashed as its canonical text
    assert same_hash_families([("a", 23), ("b", 25)], [("b", 1043), ("a", 20), ("c", 1700)])
    assert not same_hash_families([("a", 23)], [("a", 1700)])
    assert same_hash_families([("a", 3802)], [("a", 114)])  # both as canonical text


def test_the_gate_in_the_record_form_refuses_a_value_the_sink_changed(pg: Pg, pg_other: Pg) -> None:
    """A trigger on the target changes only the case of a value in a case-insensitive column:
    the canonical text would see it (its bytes); so must the record form, and the chunk's
    transaction rolls back."""
    src = _sides(pg, f"text {CI}", "text", "'Abc'", "'x'")
    dst = _schema_with_collation(pg_other)
    pg_other.run(f'CREATE TABLE "{dst}".t (id int NOT NULL, v text COLLATE "{dst}".dpone_ci)')
    pg_other.run(
        f'CREATE FUNCTION "{dst}".lower_v() RETURNS trigger LANGUAGE plpgsql AS '
        "$$ BEGIN NEW.v := lower(NEW.v); RETURN NEW; END $$"
    )
    pg_other.run(
        f'CREATE TRIGGER lower_v BEFORE INSERT ON "{dst}".t '
        f'FOR EACH ROW EXECUTE FUNCTION "{dst}".lower_v()'
    )
    window = ChunkWindow("id", "integer", 1, 2)
    spec = SinkSpec("dst", TableRef(dst, "t"), "replace")
    with (
        open_source(SourceSpec("src", TableRef(src, "a")), pg.dsn) as source,
        open_sink(spec, pg_other.dsn, SinkOptions()) as sink,
    ):
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, window)
    assert caught.value.code == errors.READ_BACK_MISMATCH
    assert "different content" in caught.value.message
    assert pg_other.rows(f'SELECT count(*) FROM "{dst}".t') == [(0,)]
    pg_other.run(f'DROP TRIGGER lower_v ON "{dst}".t')
    with (
        open_source(SourceSpec("src", TableRef(src, "a")), pg.dsn) as source,
        open_sink(spec, pg_other.dsn, SinkOptions()) as sink,
    ):
        written = sink.write_chunk(source, window)
    assert written.checksum is not None and written.checksum.startswith(RECORD)
    assert written.checksum == written.source_checksum


@pytest.mark.parametrize(
    "columns",
    [
        ("integer", "integer"),  # two hash families
        ("integer", "text"),
        ("numeric(12,2)", "jsonb"),  # one column as its canonical text
    ],
)
def test_values_swapped_between_rows_change_the_record_form(
    pg: Pg, columns: tuple[str, str]
) -> None:
    """The record hash is linear in its columns' hashes: summed bare, rows (1, 10, 100) and
    (2, 20, 200) hash the same as (1, 10, 200) and (2, 20, 100). Each row's hash is mixed
    before the sum, so a swap between rows is a difference, as in the canonical text."""
    schema = pg.schema()
    first, second = columns
    rows = {"a": ("(1, 10, '100')", "(2, 20, '200')"), "b": ("(1, 10, '200')", "(2, 20, '100')")}
    for name, values in rows.items():
        pg.run(f'CREATE TABLE "{schema}".{name} (id int NOT NULL, x {first}, y {second})')
        pg.run(f'INSERT INTO "{schema}".{name} VALUES {", ".join(values)}')
    a, b = TableRef(schema, "a"), TableRef(schema, "b")
    agreed = pair_checksums((pg.dsn, a), (pg.dsn, b))
    assert agreed[0].startswith(RECORD) and agreed[1].startswith(RECORD)
    assert agreed[0] != agreed[1]
    assert table_checksum(pg.dsn, a) != table_checksum(pg.dsn, b)
