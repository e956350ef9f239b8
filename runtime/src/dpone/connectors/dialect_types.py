"""Each dialect's catalog spelling of a column type, translated into a :class:`ColumnType`.

Pure functions over what the catalogs return (Postgres ``format_type``, MySQL/MariaDB
``information_schema.COLUMNS``, SQLite declared types, SQL Server ``INFORMATION_SCHEMA``), so they
are tested without a server; the connectors run the catalog queries. What each dialect can lose
is documented in docs/connectors.md ("Type preflight").
"""

from __future__ import annotations

import re

from dpone.connectors.column_types import ColumnType, Family

# --- Postgres -------------------------------------------------------------------------------------
_PG_TYPE = re.compile(
    r"^(?P<base>[a-z][a-z ]*?)(?:\((?P<a>\d+)(?:,(?P<b>\d+))?\))?"
    r"(?P<zone> with time zone| without time zone)?$"
)
_PG_INTEGERS = {"smallint": 16, "integer": 32, "bigint": 64}
#: Types that carry no length, precision or zone: the family says all.
_PG_PLAIN: dict[str, Family] = {"boolean": "boolean", "bytea": "binary", "date": "date"}
_PG_PLAIN |= {"uuid": "uuid", "json": "json"}


def pg_column_type(declared: str) -> ColumnType:
    """A type as Postgres's ``format_type(oid, typmod)`` spells it (domains by their base)."""
    match = _PG_TYPE.match(declared)
    if match is None:  # arrays, quoted or schema-qualified user types
        return ColumnType(declared, "other")
    base, a, b = match.group("base"), match.group("a"), match.group("b")
    first = int(a) if a is not None else None
    tz = match.group("zone") == " with time zone"
    if base in _PG_PLAIN:
        return ColumnType(declared, _PG_PLAIN[base])
    if base == "jsonb":
        return ColumnType(declared, "json", normal_form="jsonb")
    # numbers: no assignment cast from boolean, so a boolean source fails every chunk
    if base in _PG_INTEGERS:
        return ColumnType(declared, "integer", bits=_PG_INTEGERS[base], refuses_booleans=True)
    if base == "numeric":
        scale = int(b) if b is not None else None
        return ColumnType(declared, "decimal", precision=first, scale=scale, refuses_booleans=True)
    if base in ("real", "double precision"):
        bits = 24 if base == "real" else 53
        return ColumnType(declared, "float", bits=bits, refuses_booleans=True)
    if base in ("text", "character varying"):
        return ColumnType(declared, "text", length=first)
    if base == "character":
        return ColumnType(declared, "text", length=first or 1, padded="kept")
    if base in ("time", "timestamp"):
        family: Family = "time" if base == "time" else "timestamp"
        return ColumnType(declared, family, fsp=6 if first is None else first, tz=tz)
    return ColumnType(declared, "other")


# --- MySQL / MariaDB ------------------------------------------------------------------------------
_MY_INTEGERS = {"tinyint": 8, "smallint": 16, "mediumint": 24, "int": 32, "integer": 32}
_MY_INTEGERS["bigint"] = 64
#: Bytes a character takes at most (information_schema.CHARACTER_SETS.MAXLEN) and at least in a
#: character set; any other set: one byte a character.
_MY_CHAR_BYTES = {"utf8mb4": 4, "utf8mb3": 3, "utf8": 3, "ucs2": 2, "utf16": 4, "utf32": 4}
_MY_CHAR_BYTES |= {"utf16le": 4, "big5": 2, "cp932": 2, "eucjpms": 3, "euckr": 2, "gb2312": 2}
_MY_CHAR_BYTES |= {"gbk": 2, "gb18030": 4, "sjis": 2, "ujis": 3}
_MY_CHAR_MIN_BYTES = {"ucs2": 2, "utf16": 2, "utf16le": 2, "utf32": 4}
#: the MySQL character sets that hold every Unicode character (ucs2 and utf8mb3 do not: the BMP)
_MY_UNICODE = frozenset({None, "utf8mb4", "utf16", "utf16le", "utf32", "binary"})
_MY_TEXT_BYTES = {"tinytext": 255, "text": 65_535, "mediumtext": 16_777_215}
_MY_BLOB_BYTES = {"tinyblob": 255, "blob": 65_535, "mediumblob": 16_777_215}
#: MySQL 8's JSON type stores a document normalised (key order, whitespace), as jsonb does in
#: its own way; MariaDB's JSON is a LONGTEXT and keeps the text.
MY_JSON = "MySQL JSON"
#: Spatial types: the driver reads their internal form (SRID + WKB) as bytes.
MY_GEOMETRY = frozenset(
    {"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring"}
    | {"multipolygon", "geometrycollection", "geomcollection"}
)


def mysql_column_type(
    data_type: str,
    column_type: str,
    char_length: int | None,
    numeric_precision: int | None,
    numeric_scale: int | None,
    datetime_precision: int | None,
    charset: str | None,
) -> ColumnType:
    """A column from ``information_schema.COLUMNS`` (DATA_TYPE, COLUMN_TYPE,
    CHARACTER_MAXIMUM_LENGTH, NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION,
    CHARACTER_SET_NAME). TEXT types are bounded in bytes: as a target they hold the byte limit
    over the character set's widest character (16,383 in a utf8mb4 TEXT), as a source a value
    has up to the limit over its narrowest (65,535 one-byte characters); LONGTEXT/LONGBLOB
    (4 GiB) count as unbounded."""
    kind = data_type.lower()
    declared = column_type
    unsigned = "unsigned" in column_type.lower()
    narrow_set = None if charset in _MY_UNICODE else charset
    if kind in _MY_INTEGERS:
        return ColumnType(declared, "integer", bits=_MY_INTEGERS[kind], unsigned=unsigned)
    if kind in ("decimal", "numeric"):
        return ColumnType(declared, "decimal", precision=numeric_precision, scale=numeric_scale)
    if kind in ("float", "double", "real") and numeric_scale is not None and "," in column_type:
        # FLOAT(M,D) / DOUBLE(M,D) round every value to D decimals within M digits: a decimal,
        # stored in a binary float of ``bits`` mantissa bits (FLOAT single, DOUBLE double)
        bits = 24 if kind == "float" else 53
        return ColumnType(
            declared, "decimal", bits=bits, precision=numeric_precision, scale=numeric_scale
        )
    if kind in ("float", "double", "real"):
        return ColumnType(declared, "float", bits=24 if kind == "float" else 53)
    if kind in ("char", "varchar"):
        padded = "trimmed" if kind == "char" else None
        return ColumnType(declared, "text", length=char_length, padded=padded, charset=narrow_set)
    if kind in _MY_TEXT_BYTES:
        encoding, octets = charset or "utf8mb4", _MY_TEXT_BYTES[kind]
        return ColumnType(
            declared,
            "text",
            length=octets // _MY_CHAR_BYTES.get(encoding, 1),
            charset=narrow_set,
            longest=octets // _MY_CHAR_MIN_BYTES.get(encoding, 1),
            octets=octets,
            encoding=encoding,
        )
    if kind == "longtext":
        return ColumnType(declared, "text", charset=narrow_set)
    if kind in ("binary", "varbinary"):
        padded = "kept" if kind == "binary" else None
        return ColumnType(declared, "binary", length=char_length, padded=padded)
    if kind in _MY_BLOB_BYTES:
        return ColumnType(declared, "binary", length=_MY_BLOB_BYTES[kind])
    if kind == "longblob" or kind in MY_GEOMETRY:
        return ColumnType(declared, "binary")
    if kind == "bit":  # read as ceil(n/8) bytes; NUMERIC_PRECISION is n
        bits = numeric_precision or 1
        return ColumnType(declared, "binary", bits=bits, length=(bits + 7) // 8)
    if kind == "date":
        return ColumnType(declared, "date")
    fsp = datetime_precision or 0
    if kind == "datetime":
        return ColumnType(declared, "timestamp", fsp=fsp)
    if kind == "timestamp":
        return ColumnType(declared, "timestamp", fsp=fsp, tz=True, epoch_range=True)
    if kind == "time":
        return ColumnType(declared, "time", fsp=fsp, duration=True)
    if kind == "json":  # MySQL 8 (MariaDB's JSON is LONGTEXT): stored in MySQL's normal form
        return ColumnType(declared, "json", normal_form=MY_JSON)
    if kind == "uuid":  # MariaDB 10.7+
        return ColumnType(declared, "uuid")
    return ColumnType(declared, "other")


# --- SQLite ---------------------------------------------------------------------------------------
def sqlite_column_type(declared: str) -> ColumnType:
    """A declared type by SQLite's affinity rules (https://sqlite.org/datatype3.html, 3.1).

    SQLite enforces no length, precision or fractional-second limit, so what it can lose is its
    affinity's conversion: INTEGER/NUMERIC turn numeric-looking text into numbers and keep 15
    significant digits of a fraction; TEXT stores numbers as their text. No declared type (a
    query's result columns too) or BLOB affinity stores every value as given: family ``any``,
    which as a target keeps what dpone binds (64-bit integers, floats, text, bytes, and the
    rest as text: decimals without their trailing zeros, times as UTC wall clocks) and as a
    source holds values of any kind.
    """
    name = declared.strip().upper()
    if not name or "BLOB" in name:
        return ColumnType(declared.strip() or "(no declared type)", "any", bits=64, fsp=6)
    if "INT" in name:
        return ColumnType(declared, "integer", bits=64)
    if any(part in name for part in ("CHAR", "CLOB", "TEXT")):
        return ColumnType(declared, "text")
    if any(part in name for part in ("REAL", "FLOA", "DOUB")):
        return ColumnType(declared, "float", bits=53)
    base = name.split("(", 1)[0].strip()
    if base == "DATE":
        return ColumnType(declared, "date")
    if base in ("DATETIME", "TIMESTAMP"):
        return ColumnType(declared, "timestamp", fsp=6)
    if base == "TIME":
        return ColumnType(declared, "time", fsp=6)
    return ColumnType(declared, "float", bits=53, exact_integers=64)  # NUMERIC affinity


# --- SQL Server -----------------------------------------------------------------------------------
_MS_TYPE = re.compile(r"^(?P<base>[a-z0-9_]+)(?:\((?P<a>max|\d+)(?:,\s*(?P<b>\d+))?\))?$")
_MS_INTEGERS = {"tinyint": (8, True), "smallint": (16, False), "int": (32, False)}
_MS_INTEGERS["bigint"] = (64, False)
_MS_PLAIN: dict[str, Family] = {"bit": "boolean", "date": "date", "uniqueidentifier": "uuid"}


def mssql_column_type(declared: str) -> ColumnType:
    """A type as ``sys.dm_exec_describe_first_result_set`` spells it (``system_type_name``:
    ``decimal(18,2)``, ``nvarchar(max)``, ``datetime2(3)``). UNVERIFIED against a real SQL
    Server: tested through the recording double only."""
    match = _MS_TYPE.match(declared.strip().lower())
    if match is None:
        return ColumnType(declared, "other")
    kind, a, b = match.group("base"), match.group("a"), match.group("b")
    first = None if a in (None, "max") else int(a)
    if kind in _MS_PLAIN:
        return ColumnType(declared, _MS_PLAIN[kind])
    if kind in _MS_INTEGERS:
        bits, unsigned = _MS_INTEGERS[kind]
        return ColumnType(declared, "integer", bits=bits, unsigned=unsigned)
    if kind in ("decimal", "numeric"):
        scale = int(b) if b is not None else 0
        return ColumnType(declared, "decimal", precision=first or 18, scale=scale)
    if kind in ("money", "smallmoney"):
        return ColumnType(declared, "decimal", precision=19 if kind == "money" else 10, scale=4)
    if kind in ("real", "float"):
        bits = 24 if kind == "real" or (first is not None and first <= 24) else 53
        return ColumnType(declared, "float", bits=bits)
    code_page = None if kind.startswith("n") else "code page"
    if kind in ("varchar", "nvarchar", "text", "ntext"):
        return ColumnType(declared, "text", length=first, charset=code_page)
    if kind in ("char", "nchar"):
        return ColumnType(declared, "text", length=first or 1, padded="kept", charset=code_page)
    if kind in ("varbinary", "image"):
        return ColumnType(declared, "binary", length=first)
    if kind == "binary":
        return ColumnType(declared, "binary", length=first or 1, padded="kept")
    if kind in ("datetime2", "datetimeoffset", "time"):
        family: Family = "time" if kind == "time" else "timestamp"
        fsp = 7 if first is None else first
        return ColumnType(declared, family, fsp=fsp, tz=kind == "datetimeoffset")
    if kind == "datetime":  # 1/300 s ticks: two fractional digits survive exactly
        return ColumnType(declared, "timestamp", fsp=2)
    if kind == "smalldatetime":
        return ColumnType(declared, "timestamp", fsp=-1)
    return ColumnType(declared, "other")
