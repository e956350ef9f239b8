"""The type preflight's rule (dpone.connectors.column_types.narrowing) and each dialect's catalog
translation (dpone.connectors.dialect_types): every narrowing class refused, equal and wider
types accepted; properties over generated integer, decimal, text and timestamp types."""

from __future__ import annotations

import pytest
from dpone.connectors.column_types import ColumnType, integer_range, narrowing
from dpone.connectors.dialect_types import (
    mssql_column_type,
    mysql_column_type,
    pg_column_type,
    sqlite_column_type,
)
from hypothesis import given
from hypothesis import strategies as st


def pg(text: str) -> ColumnType:
    return pg_column_type(text)


def my(column_type: str, **kw: object) -> ColumnType:
    """A MySQL column as information_schema.COLUMNS describes it (the numbers from COLUMN_TYPE)."""
    data_type = column_type.split("(", maxsplit=1)[0].split(maxsplit=1)[0]
    inner = (
        column_type[column_type.find("(") + 1 : column_type.find(")")] if "(" in column_type else ""
    )
    numbers = [int(n) for n in inner.split(",")] if inner else []
    length = numbers[0] if data_type in ("char", "varchar", "binary", "varbinary") else None
    precision = numbers[0] if data_type == "decimal" else None
    scale = numbers[1] if data_type == "decimal" else None
    fsp = (numbers[0] if numbers else 0) if data_type in ("datetime", "timestamp", "time") else None
    charset = kw.get("charset", "utf8mb4" if data_type.endswith(("char", "text")) else None)
    return mysql_column_type(data_type, column_type, length, precision, scale, fsp, charset)  # type: ignore[arg-type]


REFUSED = [
    # numeric precision and scale
    (pg("numeric(40,12)"), pg("numeric(38,10)"), "digit(s) after the point"),
    (pg("numeric(12,2)"), pg("numeric(10,2)"), "before the point"),
    (pg("numeric"), pg("numeric(38,10)"), "any precision"),
    (pg("numeric(40,12)"), my("decimal(38,10)"), "after the point"),
    (my("decimal(12,4)"), pg("numeric(12,2)"), "after the point"),
    (my("decimal(12,4)"), my("decimal(12,2)"), "after the point"),
    # character length and fixed-width padding
    (pg("text"), pg("character varying(5)"), "up to 5 characters"),
    (pg("character varying(10)"), pg("character varying(5)"), "up to 5 characters"),
    (pg("text"), my("varchar(5)"), "up to 5 characters"),
    (pg("text"), my("text"), "16383 characters"),
    (pg("character varying(5)"), pg("character(5)"), "padding"),
    (pg("character(5)"), pg("text"), "padding"),
    (pg("character(5)"), my("char(5)"), "padding"),
    (my("varchar(10)"), my("varchar(10)", charset="utf8mb3"), "character set utf8mb3"),
    (my("varchar(10)"), my("varchar(10)", charset="latin1"), "character set latin1"),
    (pg("bytea"), my("blob"), "65535 bytes"),
    # fractional seconds
    (pg("timestamp(6) without time zone"), pg("timestamp(0) without time zone"), "0 fractional"),
    (pg("timestamp without time zone"), my("datetime"), "0 fractional"),
    (my("datetime(6)"), my("datetime(3)"), "3 fractional"),
    (pg("time(6) without time zone"), my("time(0)"), "0 fractional"),
    # integer width and sign
    (pg("bigint"), pg("integer"), "-2147483648..2147483647"),
    (my("int"), my("smallint"), "-32768..32767"),
    (my("int unsigned"), my("int"), "0..4294967295"),
    (my("tinyint"), my("tinyint unsigned"), "0..255"),
    (pg("numeric(12,0)"), pg("integer"), "12-digit"),
    (pg("bigint"), pg("numeric(10,0)"), "before the point"),
    # time zone and ranges
    (pg("timestamp with time zone"), pg("timestamp without time zone"), "time zone is lost"),
    (pg("timestamp(6) with time zone"), my("datetime(6)"), "time zone is lost"),
    (pg("timestamp(6) without time zone"), my("timestamp(6)"), "2038"),
    (my("time(6)"), pg("time without time zone"), "beyond one day"),
    (pg("time with time zone"), pg("time without time zone"), "time zone is lost"),
    # float and kind changes
    (pg("double precision"), pg("integer"), "whole numbers"),
    (pg("double precision"), pg("numeric(38,10)"), "binary float"),
    (pg("double precision"), pg("real"), "24 mantissa bits"),
    (pg("bigint"), pg("double precision"), "cannot hold every integer"),
    (pg("numeric(20,2)"), pg("double precision"), "15 significant digits"),
    (my("tinyint(1)"), pg("boolean"), "converted"),
    (pg("timestamp with time zone"), pg("text"), "converted"),
    (pg("date"), pg("timestamp without time zone"), "converted"),
    (pg("text"), pg("integer"), "converted"),
    (pg("integer[]"), pg("bigint[]"), "cannot tell"),
]

ACCEPTED = [
    (pg("numeric(38,10)"), pg("numeric(40,12)")),
    (pg("numeric(12,2)"), pg("numeric")),
    (pg("numeric(12,2)"), my("decimal(12,2)")),
    (my("decimal(38,10)"), pg("numeric(38,10)")),
    (pg("character varying(5)"), pg("text")),
    (pg("character varying(5)"), my("varchar(5)")),
    (pg("text"), my("longtext")),
    (pg("character(5)"), pg("character(5)")),
    (my("char(5)"), my("char(5)")),
    (pg("timestamp(0) without time zone"), pg("timestamp(6) without time zone")),
    (pg("timestamp without time zone"), my("datetime(6)")),
    (my("datetime"), pg("timestamp(0) without time zone")),
    (my("datetime(6)"), pg("timestamp without time zone")),
    (pg("timestamp without time zone"), pg("timestamp with time zone")),
    (my("timestamp(6)"), pg("timestamp with time zone")),
    (pg("timestamp with time zone"), pg("timestamp with time zone")),
    (pg("integer"), pg("bigint")),
    (my("int unsigned"), pg("bigint")),
    (my("tinyint(1)"), pg("smallint")),
    (pg("boolean"), my("tinyint(1)")),
    (pg("boolean"), pg("boolean")),
    (pg("integer"), pg("numeric(10,0)")),
    (pg("integer"), pg("double precision")),
    (pg("numeric(15,2)"), pg("double precision")),
    (pg("real"), pg("double precision")),
    (pg("integer"), pg("text")),
    (pg("uuid"), pg("text")),
    (pg("jsonb"), pg("json")),
    (pg("bytea"), my("longblob")),
    (pg("integer[]"), pg("integer[]")),
    (my("varchar(10)", charset="latin1"), pg("text")),
]


@pytest.mark.parametrize(
    ("source", "target", "needle"), REFUSED, ids=lambda v: getattr(v, "declared", v)
)
def test_each_narrowing_class_is_refused_with_its_reason(
    source: ColumnType, target: ColumnType, needle: str
) -> None:
    reason = narrowing(source, target)
    assert reason is not None and needle in reason, (source.declared, target.declared, reason)


@pytest.mark.parametrize(("source", "target"), ACCEPTED, ids=lambda v: v.declared)
def test_equal_and_wider_types_are_accepted(source: ColumnType, target: ColumnType) -> None:
    assert narrowing(source, target) is None


# --- properties -----------------------------------------------------------------------------------
integers = st.builds(
    lambda bits, unsigned: ColumnType("int", "integer", bits=bits, unsigned=unsigned),
    st.sampled_from([8, 16, 24, 32, 64]),
    st.booleans(),
)
decimals = st.builds(
    lambda p, s: ColumnType(f"numeric({p},{min(s, p)})", "decimal", precision=p, scale=min(s, p)),
    st.integers(1, 65),
    st.integers(0, 30),
) | st.just(ColumnType("numeric", "decimal"))
texts = st.builds(
    lambda n: ColumnType(f"varchar({n})", "text", length=n), st.none() | st.integers(1, 10_000)
)
stamps = st.builds(
    lambda fsp, tz: ColumnType("timestamp", "timestamp", fsp=fsp, tz=tz),
    st.integers(0, 6),
    st.booleans(),
)
numbers = integers | decimals
anything = numbers | texts | stamps


@given(anything)
def test_a_type_never_narrows_into_itself(kind: ColumnType) -> None:
    assert narrowing(kind, kind) is None


@given(integers, integers)
def test_an_integer_is_accepted_exactly_when_its_range_fits(a: ColumnType, b: ColumnType) -> None:
    low, high = integer_range(a)
    t_low, t_high = integer_range(b)
    assert (narrowing(a, b) is None) == (t_low <= low and high <= t_high)


@given(decimals, decimals)
def test_a_decimal_is_accepted_exactly_when_both_sides_of_the_point_fit(
    a: ColumnType, b: ColumnType
) -> None:
    if b.precision is None:
        fits = True
    elif a.precision is None:
        fits = False
    else:
        fits = (b.scale or 0) >= (a.scale or 0) and b.precision - (b.scale or 0) >= a.precision - (
            a.scale or 0
        )
    assert (narrowing(a, b) is None) == fits


@given(anything, anything, anything)
def test_accepting_is_transitive(a: ColumnType, b: ColumnType, c: ColumnType) -> None:
    """Two accepted hops never add up to a refused one: the rule measures what a type holds."""
    if narrowing(a, b) is None and narrowing(b, c) is None:
        assert narrowing(a, c) is None, (a, b, c)


@given(integers, st.integers(1, 40), st.integers(0, 10))
def test_an_integer_into_a_decimal_needs_its_digits_before_the_point(
    a: ColumnType, p: int, s: int
) -> None:
    s = min(s, p)
    target = ColumnType(f"numeric({p},{s})", "decimal", precision=p, scale=s)
    low, high = integer_range(a)
    digits = max(len(str(abs(low))), len(str(high)))
    assert (narrowing(a, target) is None) == (p - s >= digits)


# --- dialect catalogs -----------------------------------------------------------------------------
def test_postgres_format_type_spellings() -> None:
    assert pg("numeric(40,12)") == ColumnType("numeric(40,12)", "decimal", precision=40, scale=12)
    assert pg("timestamp(3) with time zone").fsp == 3 and pg("timestamp with time zone").tz
    assert pg("timestamp without time zone").fsp == 6
    assert pg("character(5)").padded == "kept" and pg("character(5)").length == 5
    assert pg("character varying").length is None
    assert pg('"MyType"').family == pg("public.thing").family == pg("integer[]").family == "other"


def test_mysql_catalog_rows() -> None:
    assert my("tinyint(1)").bits == 8 and not my("tinyint(1)").unsigned
    assert my("bigint(20) unsigned").unsigned
    assert my("datetime").fsp == 0 and not my("datetime").tz
    stamp = my("timestamp(3)")
    assert stamp.tz and stamp.epoch_range and stamp.fsp == 3
    assert my("char(5)").padded == "trimmed" and my("binary(4)").padded == "kept"
    assert my("text").length == 65_535 // 4 and my("longtext").length is None
    assert mysql_column_type("text", "text", 65535, None, None, None, "latin1").length == 65_535
    assert my("varchar(5)", charset="utf8mb3").charset == "utf8mb3"
    for unicode in ("utf16", "utf16le", "utf32"):  # every character, like utf8mb4
        assert narrowing(my("varchar(5)"), my("varchar(5)", charset=unicode)) is None
    assert narrowing(my("varchar(5)"), my("varchar(5)", charset="ucs2")) is not None


def test_a_mysql_float_with_decimals_is_a_decimal() -> None:
    # Regression: DOUBLE(10,2) rounds every value to 2 decimals, and the preflight let a float in
    fixed = mysql_column_type("double", "double(10,2)", None, 10, 2, None, None)
    assert (fixed.family, fixed.precision, fixed.scale) == ("decimal", 10, 2)
    assert narrowing(my("double"), fixed) is not None
    assert narrowing(my("decimal(8,2)"), fixed) is None
    plain = mysql_column_type("double", "double", None, 22, None, None, None)
    assert (plain.family, plain.bits) == ("float", 53)


def test_an_unsigned_bigint_does_not_fit_sqlites_integers() -> None:
    # Regression: SQLite NUMERIC keeps 64-bit signed integers; 2**64 - 1 overflowed at the write
    numeric = sqlite_column_type("NUMERIC")
    assert numeric is not None
    assert narrowing(my("bigint(20) unsigned"), numeric) is not None
    assert narrowing(my("bigint(20)"), numeric) is None
    assert narrowing(my("int(10) unsigned"), numeric) is None


def test_sqlite_affinity() -> None:
    assert sqlite_column_type("") is None and sqlite_column_type("BLOB") is None
    assert sqlite_column_type("BIGINT") == ColumnType("BIGINT", "integer", bits=64)
    assert sqlite_column_type("VARCHAR(5)") == ColumnType("VARCHAR(5)", "text")  # no limit kept
    numeric = sqlite_column_type("DECIMAL(12,2)")
    assert numeric is not None and numeric.family == "float" and numeric.exact_integers == 64
    assert narrowing(pg("bigint"), numeric) is None
    assert narrowing(pg("numeric(20,2)"), numeric) is not None  # 15 significant digits
    assert narrowing(pg("text"), sqlite_column_type("VARCHAR(5)")) is None  # type: ignore[arg-type]
    assert narrowing(pg("text"), sqlite_column_type("INTEGER")) is not None  # type: ignore[arg-type]
    stamp = sqlite_column_type("TIMESTAMP")
    assert stamp is not None and narrowing(pg("timestamp with time zone"), stamp) is not None


def test_mssql_system_type_names() -> None:
    assert mssql_column_type("decimal(18,2)").precision == 18
    assert mssql_column_type("nvarchar(max)").length is None
    assert mssql_column_type("varchar(10)").charset == "code page"
    assert mssql_column_type("datetime2(3)").fsp == 3
    assert mssql_column_type("datetimeoffset(7)").tz
    assert mssql_column_type("tinyint").unsigned
    assert (
        narrowing(pg("timestamp(6) without time zone"), mssql_column_type("datetime")) is not None
    )
    assert (
        narrowing(pg("timestamp(6) without time zone"), mssql_column_type("datetime2(7)")) is None
    )
    assert narrowing(pg("text"), mssql_column_type("varchar(max)")) is not None  # a code page
    assert narrowing(pg("text"), mssql_column_type("nvarchar(max)")) is None


@pytest.mark.parametrize(
    ("source", "target", "refused"),
    [
        (pg("uuid"), my("char(36)"), False),
        (pg("uuid"), pg("character(36)"), False),
        (pg("uuid"), my("varchar(36)", charset="latin1"), False),
        (pg("uuid"), pg("character varying(32)"), True),
        (pg("integer"), pg("character varying(11)"), False),
        (pg("integer"), pg("character varying(10)"), True),
        (pg("integer"), pg("character(11)"), True),  # padded with spaces
        (pg("numeric(10,0)"), my("varchar(11)"), False),
        (pg("numeric(10,0)"), my("varchar(10)"), True),
        (pg("numeric(10,2)"), my("varchar(12)"), True),  # trailing zeros: '1.50' or '1.5'
        (pg("numeric(10,2)"), pg("text"), True),
        (pg("numeric"), pg("text"), True),  # an unbounded numeric keeps each value's scale
        (my("decimal(10,2)"), my("varchar(20)"), True),
        (pg("numeric"), my("varchar(100)"), True),
        (pg("jsonb"), my("longtext", charset="latin1"), True),
        (my("char(5)"), pg("character varying(5)"), False),  # MySQL reads CHAR trimmed
        (my("char(5)"), pg("character varying(4)"), True),
        (my("binary(16)"), pg("bytea"), False),  # read as exactly 16 bytes
        (my("binary(16)"), my("varbinary(15)"), True),
        (pg("character(5)"), pg("character varying(5)"), True),  # a cast trims the padding
    ],
    ids=lambda v: getattr(v, "declared", v),
)
def test_values_into_text_and_out_of_fixed_width(
    source: ColumnType, target: ColumnType, refused: bool
) -> None:
    assert (narrowing(source, target) is not None) == refused, narrowing(source, target)


def _my_bit(n: int) -> ColumnType:
    return mysql_column_type("bit", f"bit({n})", None, n, None, None, None)


BINARY_INTO_TEXT = [
    pg("bytea"),
    my("varbinary(16)"),
    my("blob"),
    my("point"),
    my("geometry"),
    _my_bit(8),
    mssql_column_type("varbinary(max)"),
]


@pytest.mark.parametrize("source", BINARY_INTO_TEXT, ids=lambda v: v.declared)
@pytest.mark.parametrize(
    "target", [pg("text"), pg("character varying(100)"), my("longtext")], ids=lambda v: v.declared
)
def test_binary_values_into_text_are_refused(source: ColumnType, target: ColumnType) -> None:
    """Regression: bytes stored in a Postgres text column become their \\x hex text, which the
    checksum (bytes are \\x + hex there too) cannot tell from the bytes. MySQL BIT and spatial
    types were 'unknown types', accepted into unbounded text."""
    reason = narrowing(source, target)
    assert reason is not None and "binary values stored as text" in reason


@pytest.mark.parametrize(
    ("source", "target", "refused"),
    [
        (_my_bit(8), pg("bytea"), False),
        (_my_bit(8), my("longblob"), False),
        (_my_bit(8), _my_bit(8), False),
        (_my_bit(5), _my_bit(8), False),
        (_my_bit(8), _my_bit(4), True),
        (_my_bit(8), _my_bit(12), True),  # read back as two bytes, not one
        (my("varbinary(1)"), _my_bit(8), True),
        (my("point"), my("point"), False),
        (my("point"), pg("bytea"), False),
    ],
    ids=lambda v: getattr(v, "declared", v),
)
def test_bit_and_spatial_columns_between_binary_types(
    source: ColumnType, target: ColumnType, refused: bool
) -> None:
    assert (narrowing(source, target) is not None) == refused
