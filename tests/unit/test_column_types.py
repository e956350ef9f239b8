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
    # a MySQL TEXT's values have up to its byte limit in characters (one byte each)
    (my("tinytext"), pg("character varying(100)"), "up to 255 characters"),
    (my("text"), pg("character varying(16383)"), "up to 65535 characters"),
    (my("mediumtext"), pg("character varying(4194303)"), "up to 16777215 characters"),
    (my("text"), my("tinytext"), "255 bytes of utf8mb4"),
    # pairs Postgres refuses or changes in every chunk
    (pg("boolean"), pg("integer"), "no assignment cast"),
    (pg("boolean"), pg("numeric(5,0)"), "no assignment cast"),
    (pg("boolean"), pg("double precision"), "no assignment cast"),
    (pg("json"), pg("jsonb"), "normal form"),
    (pg("time without time zone"), pg("time with time zone"), "gains an offset"),
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
    (my("tinytext"), pg("character varying(255)")),
    (my("text"), my("text")),
    (my("tinytext"), my("mediumtext")),
    (pg("character varying(63)"), my("tinytext")),
    (pg("boolean"), my("int")),
    (pg("boolean"), my("decimal(5,0)")),
    (pg("boolean"), my("double")),
    (pg("boolean"), sqlite_column_type("INTEGER")),
    (pg("boolean"), sqlite_column_type("REAL")),
    (pg("json"), pg("json")),
    (pg("jsonb"), pg("jsonb")),
    (pg("time with time zone"), pg("time with time zone")),
    (pg("time(3) without time zone"), pg("time without time zone")),
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
    lambda n: ColumnType(f"varchar({n})", "text", length=n), st.none() | st.integers(1, 100_000)
) | st.builds(  # limited in bytes: as many characters as bytes, or fewer (their widest)
    lambda kind, charset: mysql_column_type(kind, kind, None, None, None, None, charset),
    st.sampled_from(["tinytext", "text", "mediumtext", "longtext"]),
    st.sampled_from(["utf8mb4", "utf8mb3", "latin1", "utf16", "utf32", "sjis"]),
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
    assert pg("numeric(40,12)") == ColumnType(
        "numeric(40,12)", "decimal", precision=40, scale=12, refuses_booleans=True
    )
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


def test_a_mysql_float_with_decimals_keeps_only_a_floats_digits() -> None:
    # Regression: FLOAT(12,2) was taken for DECIMAL(12,2), so a decimal(10,2) went in and
    # 12345678.91 came back as 12345679.00 (a single float keeps 6 digits exactly)
    single = mysql_column_type("float", "float(12,2)", None, 12, 2, None, None)
    double = mysql_column_type("double", "double(20,2)", None, 20, 2, None, None)
    assert (single.family, single.bits, double.bits) == ("decimal", 24, 53)
    assert "6 significant digits" in (narrowing(my("decimal(10,2)"), single) or "")
    assert "15 significant digits" in (narrowing(my("decimal(18,2)"), double) or "")
    assert narrowing(my("int"), single) is not None  # 10 digits
    assert narrowing(my("decimal(6,2)"), single) is None
    assert narrowing(my("smallint"), single) is None
    assert narrowing(my("decimal(15,2)"), double) is None
    assert narrowing(single, single) is None and narrowing(single, double) is None
    assert narrowing(mysql_column_type("double", "double(10,2)", None, 10, 2, None, None), single)


def test_an_unsigned_bigint_does_not_fit_sqlites_integers() -> None:
    # Regression: SQLite NUMERIC keeps 64-bit signed integers; 2**64 - 1 overflowed at the write
    numeric = sqlite_column_type("NUMERIC")
    assert narrowing(my("bigint(20) unsigned"), numeric) is not None
    assert narrowing(my("bigint(20)"), numeric) is None
    assert narrowing(my("int(10) unsigned"), numeric) is None


def test_sqlite_affinity() -> None:
    assert sqlite_column_type("").family == sqlite_column_type("BLOB").family == "any"
    assert sqlite_column_type("BIGINT") == ColumnType("BIGINT", "integer", bits=64)
    assert sqlite_column_type("VARCHAR(5)") == ColumnType("VARCHAR(5)", "text")  # no limit kept
    numeric = sqlite_column_type("DECIMAL(12,2)")
    assert numeric.family == "float" and numeric.exact_integers == 64
    assert narrowing(pg("bigint"), numeric) is None
    assert narrowing(pg("numeric(20,2)"), numeric) is not None  # 15 significant digits
    assert narrowing(pg("text"), sqlite_column_type("VARCHAR(5)")) is None
    assert narrowing(pg("text"), sqlite_column_type("INTEGER")) is not None
    stamp = sqlite_column_type("TIMESTAMP")
    assert narrowing(pg("timestamp with time zone"), stamp) is not None


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
        # MariaDB's own INSERT .. SELECT writes a ZEROFILL decimal's text padded: '00000042'
        (my("decimal(8,0) unsigned zerofill"), my("longtext"), True),
        (my("int(8) unsigned zerofill"), my("varchar(20)"), True),
        (my("int(8) unsigned zerofill"), my("bigint(20)"), False),
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


# --- byte-limited text, booleans, JSON and times by target dialect -------------------------------
@pytest.mark.parametrize(
    ("kind", "charset", "held", "longest"),
    [
        ("tinytext", "utf8mb4", 63, 255),
        ("text", "utf8mb4", 16_383, 65_535),
        ("mediumtext", "utf8mb4", 4_194_303, 16_777_215),
        ("text", "utf8mb3", 21_845, 65_535),
        ("text", "latin1", 65_535, 65_535),
        ("tinytext", "utf16", 63, 127),  # 2 or 4 bytes a character
        ("tinytext", "utf32", 63, 63),
        ("tinytext", "sjis", 127, 255),
    ],
)
def test_a_mysql_text_holds_its_widest_characters_and_gives_its_narrowest(
    kind: str, charset: str, held: int, longest: int
) -> None:
    """Regression: a utf8mb4 TINYTEXT counted as 63 characters as a source, so TINYTEXT ->
    varchar(100) was accepted and Postgres cut a 150-character value of one-byte characters."""
    column = mysql_column_type(kind, kind, None, None, None, None, charset)
    assert (column.length, column.longest) == (held, longest)
    if column.charset is None:  # a Unicode set: any text of `held` characters fits
        assert narrowing(ColumnType("v", "text", length=held), column) is None
        assert narrowing(ColumnType("v", "text", length=held + 1), column) is not None
    fits = ColumnType(f"varchar({longest})", "text", length=longest)
    short = ColumnType(f"varchar({longest - 1})", "text", length=longest - 1)
    assert narrowing(column, fits) is None
    reason = narrowing(column, short)
    assert reason is not None and f"up to {longest} characters" in reason
    assert narrowing(column, column) is None  # one character set: compared in bytes


@pytest.mark.parametrize(
    ("target", "refused"),
    [
        (pg("integer"), True),
        (pg("smallint"), True),
        (pg("bigint"), True),
        (pg("numeric(5,0)"), True),
        (pg("numeric"), True),
        (pg("real"), True),
        (pg("double precision"), True),
        (pg("boolean"), False),
        (my("tinyint(1)"), False),  # MariaDB BOOLEAN is TINYINT(1)
        (my("int"), False),
        (my("decimal(5,0)"), False),
        (my("double"), False),
        (sqlite_column_type("INTEGER"), False),  # sqlite3 binds True as 1
        (sqlite_column_type("BOOLEAN"), False),
        (sqlite_column_type(""), False),
        (mssql_column_type("int"), False),  # SQL Server converts bit implicitly (UNVERIFIED)
    ],
    ids=lambda v: getattr(v, "declared", v),
)
def test_a_boolean_into_a_number_by_the_target_dialect(target: ColumnType, refused: bool) -> None:
    """Regression: Postgres has no assignment cast from boolean to a number, so boolean ->
    integer failed every chunk (DatatypeMismatch); MySQL and SQLite store 1/0."""
    for source in (pg("boolean"), mssql_column_type("bit")):
        reason = narrowing(source, target)
        assert (reason is not None) == refused, (source, target, reason)
        assert reason is None or "no assignment cast" in reason


@pytest.mark.parametrize(
    ("source", "target", "refused"),
    [
        (pg("json"), pg("jsonb"), True),  # jsonb rewrites {"a":1} as {"a": 1}
        (pg("jsonb"), pg("jsonb"), False),
        (pg("jsonb"), pg("json"), False),  # json keeps jsonb's text
        (pg("json"), pg("json"), False),
        (pg("json"), pg("text"), False),
        (pg("json"), my("longtext"), False),  # MariaDB's JSON
        (pg("json"), my("json"), True),  # MySQL 8 normalises too
        (pg("jsonb"), my("json"), True),  # in its own way
        (my("json"), pg("jsonb"), True),
        (my("json"), my("json"), False),
        (pg("time without time zone"), pg("time with time zone"), True),
        (pg("time(3) without time zone"), pg("time(6) with time zone"), True),
        (pg("time with time zone"), pg("time with time zone"), False),
        (pg("time with time zone"), pg("time without time zone"), True),  # the zone is lost
        (pg("timestamp without time zone"), pg("timestamp with time zone"), False),
        (mssql_column_type("time(6)"), pg("time with time zone"), True),
    ],
    ids=lambda v: getattr(v, "declared", v),
)
def test_json_normal_forms_and_times_gaining_a_zone(
    source: ColumnType, target: ColumnType, refused: bool
) -> None:
    """Regression: json -> jsonb and time -> timetz were accepted, and the read-back gate failed
    every chunk (jsonb stores its normal form; a time gains the offset +00)."""
    assert (narrowing(source, target) is not None) == refused, narrowing(source, target)


UNTYPED = sqlite_column_type("")


@pytest.mark.parametrize("declared", ["", "BLOB", "blob sub_type 1"])
@pytest.mark.parametrize(
    ("source", "needle"),
    [
        (pg("numeric(10,2)"), "trailing zeros"),  # stored as the text '1.5'
        (pg("numeric"), "trailing zeros"),
        (my("decimal(10,2)"), "trailing zeros"),
        (pg("timestamp with time zone"), "time zone is lost"),  # UTC wall-clock text
        (my("timestamp(6)"), "time zone is lost"),
        (pg("character(5)"), "padding"),  # read padded, stored padded, checksummed trimmed
        (my("time(6)"), "beyond one day"),
        (my("bigint(20) unsigned"), "-9223372036854775808..9223372036854775807"),
        (pg("numeric(10,0)"), None),
        (pg("integer"), None),
        (pg("boolean"), None),
        (pg("double precision"), None),
        (pg("real"), None),
        (pg("text"), None),
        (my("char(5)"), None),  # read back trimmed
        (pg("bytea"), None),  # a blob stays a blob
        (my("binary(16)"), None),
        (my("bit(8)"), None),
        (pg("uuid"), None),
        (pg("jsonb"), None),
        (pg("interval"), None),
        (pg("date"), None),
        (pg("timestamp without time zone"), None),
        (pg("time without time zone"), None),
        (UNTYPED, None),
    ],
    ids=lambda v: getattr(v, "declared", v),
)
def test_an_untyped_sqlite_target_is_compared_by_what_it_stores(
    declared: str, source: ColumnType, needle: str | None
) -> None:
    """Regression: a SQLite column with no declared type or BLOB affinity was not compared, and
    numeric(10,2) 1.50 arrived as the text '1.5' (refused into TEXT), a timestamptz as its UTC
    wall clock (refused into TIMESTAMP), both while the gate passed."""
    target = sqlite_column_type(declared)
    assert target.family == "any"
    reason = narrowing(source, target)
    if needle is None:
        assert reason is None, reason
    else:
        assert reason is not None and needle in reason, reason


@pytest.mark.parametrize(
    ("target", "refused"),
    [
        (pg("character(5)"), True),  # 'ab' read back as 'ab   ', checksummed trimmed
        (my("char(5)"), True),  # 'ab ' read back as 'ab'
        (my("binary(4)"), True),
        (mssql_column_type("nchar(5)"), True),
        (pg("character varying(5)"), False),  # not compared: the sink's checks and the gate
        (pg("text"), False),
        (pg("integer"), False),
        (pg("bytea"), False),
        (sqlite_column_type("TEXT"), False),
        (UNTYPED, False),
    ],
    ids=lambda v: getattr(v, "declared", v),
)
def test_a_source_of_unknown_type_into_a_fixed_width_column_is_refused(
    target: ColumnType, refused: bool
) -> None:
    """Regression: a SQLite query's result (or an untyped column) 'ab' into a Postgres char(5)
    was stored as 'ab   ' and passed; a typed TEXT source was refused for the padding."""
    for source in (UNTYPED, sqlite_column_type("BLOB")):
        reason = narrowing(source, target)
        assert (reason is not None) == refused, reason
        assert reason is None or "unknown" in reason
