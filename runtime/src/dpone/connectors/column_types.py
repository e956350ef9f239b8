"""Column types as every dialect describes them, and the rule that says when a target narrows.

A sink that stores a value in a narrower column changes it without an error on most servers
(Postgres rounds numeric scale and fractional seconds, MySQL rounds DECIMAL scale with a note,
truncates DATETIME fractions, pads CHAR). The preflight therefore compares, before any chunk is
leased, each moved column's source type with the target's: :func:`narrowing` returns why the
target can change a value, or None when every value of the source type is stored unchanged.
Each dialect translates its catalog into a :class:`ColumnType`; this module is database-neutral
and imports only the standard library.
"""

from __future__ import annotations

from typing import Literal

from dpone.records import record

Family = Literal[
    "integer",
    "decimal",
    "float",
    "boolean",
    "text",
    "binary",
    "date",
    "time",
    "timestamp",
    "uuid",
    "json",
    "other",
    "any",
]
#: Families whose text form is exact, so an unbounded Unicode text column keeps every value.
_EXACT_AS_TEXT = frozenset({"integer", "decimal", "uuid", "json", "other"})
#: Significant decimal digits a binary float keeps on a round trip through text (float4, float8).
_FLOAT_DIGITS = {24: 6, 53: 15}


@record
class ColumnType:
    """One column's type, reduced to what decides whether a value survives being stored.

    ``None`` in a limit means unbounded (Postgres ``numeric``, ``text``, ``bytea``). ``bits`` is
    an integer's storage width, a float's mantissa width or a MySQL ``BIT(n)``'s n; ``fsp`` the
    fractional-second digits kept (-1: whole minutes only); ``tz`` a timestamp that stores an
    instant, not a wall clock;
    ``padded`` how a fixed-width ``char(n)``/``binary(n)`` pads ("kept": read back padded,
    "trimmed": MySQL strips trailing spaces on read); ``charset`` a character set narrower than
    Unicode (MySQL ``utf8mb3``, ``latin1``); ``epoch_range`` MySQL ``TIMESTAMP`` (1970-2038);
    ``duration`` MySQL ``TIME`` (up to 838 hours, negative too); ``exact_integers`` the integer
    width a float column still stores exactly (SQLite's NUMERIC affinity keeps 64-bit integers).

    A text limited in bytes (MySQL ``TINYTEXT``/``TEXT``/``MEDIUMTEXT``) holds ``length``
    characters of its character set's widest (16,383 four-byte ones in a utf8mb4 ``TEXT``), but a
    value of it has up to ``longest`` (65,535 one-byte ones); ``octets`` is the limit in bytes of
    ``encoding``, so two such columns of one character set compare exactly. ``refuses_booleans``:
    a number column the server stores no boolean in (Postgres has no assignment cast from
    boolean to a number); ``normal_form``: a JSON column that stores its own normal form of a
    document, named by whose (Postgres ``jsonb``: key order, whitespace, duplicate keys).

    Family ``any`` is a column that stores each value as given (SQLite with no declared type or
    BLOB affinity; a SQLite query's result): as a target it keeps integers of up to ``bits``,
    floats, text and bytes as they are and stores the rest as their text (times to ``fsp``
    digits); as a source its values' kind is unknown.
    """

    declared: str
    family: Family
    bits: int | None = None
    unsigned: bool = False
    precision: int | None = None
    scale: int | None = None
    length: int | None = None
    padded: str | None = None
    fsp: int | None = None
    tz: bool = False
    charset: str | None = None
    epoch_range: bool = False
    duration: bool = False
    exact_integers: int | None = None
    longest: int | None = None
    octets: int | None = None
    encoding: str | None = None
    refuses_booleans: bool = False
    normal_form: str | None = None


def integer_range(kind: ColumnType) -> tuple[int, int]:
    """The values an integer column holds (64-bit signed when the width is unknown)."""
    bits = kind.bits or 64
    if kind.unsigned:
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _integer_digits(kind: ColumnType) -> int:
    low, high = integer_range(kind)
    return max(len(str(abs(low))), len(str(high)))


def _integer_fits(source: ColumnType, target: ColumnType) -> str | None:
    low, high = integer_range(source)
    t_low, t_high = integer_range(target)
    if low < t_low or high > t_high:
        return f"the target holds integers {t_low}..{t_high}, the source {low}..{high}"
    return None


def _decimal_fits(source: ColumnType, target: ColumnType) -> str | None:
    if target.precision is None:
        return None
    if source.precision is None:
        return (
            f"the source holds numbers of any precision, the target {target.precision} digits "
            f"with {target.scale or 0} after the point"
        )
    s_scale, t_scale = source.scale or 0, target.scale or 0
    if t_scale < s_scale:
        return (
            f"the target keeps {t_scale} digit(s) after the point, the source {s_scale}: "
            "values are rounded"
        )
    if target.precision - t_scale < source.precision - s_scale:
        return (
            f"the target keeps {target.precision - t_scale} digit(s) before the point, "
            f"the source {source.precision - s_scale}"
        )
    return None


def _length_fits(source: ColumnType, target: ColumnType, unit: str) -> str | None:
    if source.padded and not target.padded and (source.padded == "trimmed" or unit == "bytes"):
        # read back without padding (MySQL CHAR) or as exactly n bytes: a value of at most n
        source = ColumnType(source.declared, source.family, length=source.length)
    if source.padded or target.padded:
        same = (
            source.padded == target.padded
            and source.length == target.length
            and source.charset == target.charset
        )
        if not same:
            return (
                "fixed-width padding differs (a char(n)/binary(n) pads or trims values to its "
                "width, so a value read back is not the value written)"
            )
        return None
    s_octets, t_octets = source.octets, target.octets
    if s_octets is not None and t_octets is not None and source.encoding == target.encoding:
        # one character set on both sides: its bytes decide, not its characters
        if s_octets > t_octets:
            return (
                f"the target holds up to {target.octets} bytes of {target.encoding}, the "
                f"source {source.octets}"
            )
        return None
    longest = source.length if source.longest is None else source.longest
    if target.length is not None and (longest is None or longest > target.length):
        held = "any length" if longest is None else f"up to {longest} {unit}"
        return f"the target holds up to {target.length} {unit}, the source {held}"
    return None


def _to_integer(source: ColumnType, target: ColumnType) -> str | None:
    if source.family == "boolean":
        return None
    if source.family == "integer":
        return _integer_fits(source, target)
    if source.family == "decimal" and source.precision is not None and not source.scale:
        _, high = integer_range(target)
        low, _ = integer_range(target)
        most = 10**source.precision - 1
        if most <= high and -most >= low:
            return None
        return f"the source holds {source.precision}-digit numbers, the target {low}..{high}"
    if source.family in ("decimal", "float"):
        return "the target stores whole numbers only: fractions are rounded away"
    return None  # handled by the family check


def _to_decimal(source: ColumnType, target: ColumnType) -> str | None:
    fits = _decimal_fits_exactly(source, target)
    if fits is not None or target.bits is None:
        return fits
    # a decimal kept in a binary float (MySQL FLOAT(M,D) / DOUBLE(M,D)): exact to so many digits
    digits = _FLOAT_DIGITS.get(target.bits, 6)
    if source.bits is not None and source.bits <= target.bits:
        return None  # a float of at most as many bits, rounded to fitting decimals: kept
    held: int | None = None
    if source.family == "decimal":
        held = source.precision
    elif source.family == "integer":
        held = _integer_digits(source)
    if held is None or held > digits:
        shown = "any number of" if held is None else str(held)
        return (
            f"the target stores each value in a binary float of {target.bits} mantissa bits, "
            f"exact to {digits} significant digits; the source has {shown} digits"
        )
    return None


def _decimal_fits_exactly(source: ColumnType, target: ColumnType) -> str | None:
    if source.family == "decimal":
        return _decimal_fits(source, target)
    if source.family == "integer":
        if target.precision is None:
            return None
        digits = _integer_digits(source)
        if target.precision - (target.scale or 0) < digits:
            return (
                f"the target keeps {target.precision - (target.scale or 0)} digit(s) before "
                f"the point, the source's integers have up to {digits}"
            )
        return None
    if source.family == "float":
        return "a binary float has no exact decimal form of fixed scale: values are rounded"
    return None


def _to_float(source: ColumnType, target: ColumnType) -> str | None:
    mantissa = target.bits or 53
    if source.family == "float":
        if (source.bits or 53) > mantissa:
            return (
                f"the target float keeps {mantissa} mantissa bits, the source {source.bits or 53}"
            )
        return None
    digits = _FLOAT_DIGITS.get(mantissa, 6)
    if source.family == "integer":
        low, high = integer_range(source)
        exact = target.exact_integers
        if exact and -(1 << (exact - 1)) <= low and high < (1 << (exact - 1)):
            return None  # the target's integers hold the source's (signed: an unsigned 64 not)
        if max(abs(low), high) > (1 << mantissa):
            return f"a float of {mantissa} mantissa bits cannot hold every integer of the source"
        return None
    if source.family == "decimal":
        if source.precision is None or source.precision > digits:
            held = "any number of" if source.precision is None else str(source.precision)
            return f"a float keeps {digits} significant digits exactly, the source {held} digits"
        return None
    return None


def _to_temporal(source: ColumnType, target: ColumnType) -> str | None:
    if source.tz and not target.tz:
        return (
            "the source stores instants (with a time zone), the target wall-clock times: "
            "the time zone is lost"
        )
    if source.family == "time" and target.tz and not source.tz:
        # a timestamp is read back as the UTC wall clock it was taken as; a timetz keeps the
        # offset it was given, so 10:00 reads back as 10:00+00 and no chunk ever passes
        return (
            "a time of day without a zone stored as a time with a zone (timetz) gains an "
            "offset: the value read back is not the value written"
        )
    s_fsp = 6 if source.fsp is None else source.fsp
    t_fsp = 6 if target.fsp is None else target.fsp
    if t_fsp < s_fsp:
        kept = "whole minutes" if t_fsp < 0 else f"{t_fsp} fractional-second digit(s)"
        return (
            f"the target keeps {kept}, the source {s_fsp}: "
            "values are rounded or truncated (and can move to another chunk)"
        )
    if target.epoch_range and not source.epoch_range:
        return (
            "the target (MySQL TIMESTAMP) holds 1970-01-01..2038-01-19 only, " "the source any date"
        )
    if source.duration and not target.duration:
        return "the source (MySQL TIME) holds durations beyond one day and negative ones"
    return None


def narrowing(source: ColumnType, target: ColumnType) -> str | None:
    """Why storing a value of ``source`` in a ``target`` column can change it; None if it
    cannot (equal or wider types, or a value-preserving change of kind such as integer to
    decimal). Different kinds of value that no rule knows to be safe are refused."""
    if source.family == "any" or target.family == "any":
        return _as_given(source, target)
    if source.family == "other" and target.family == "other":
        if source.declared.casefold() == target.declared.casefold():
            return None
        return "dpone cannot tell whether the target type holds every value of the source type"
    if target.family == "text" and source.family != "text":
        if source.family in _EXACT_AS_TEXT:
            return _as_text(source, target)
        if source.family == "binary":
            return (
                "binary values stored as text are converted, not kept (Postgres stores their "
                "\\x hex text, which a checksum cannot tell from the bytes; MySQL reads the "
                "bytes in the column's character set)"
            )
        return _different(source, target)
    if source.family == "boolean" and target.family in ("integer", "decimal", "float"):
        if target.refuses_booleans:
            return (
                "the target stores no boolean in a number column (Postgres has no assignment "
                "cast from boolean): every chunk would fail; cast it in a query (v::integer)"
            )
        return None
    if source.family == "boolean" and target.family == "boolean":
        return None
    if target.family == "integer":
        if source.family not in ("integer", "decimal", "float"):
            return _different(source, target)
        return _to_integer(source, target)
    if target.family == "decimal":
        if source.family not in ("integer", "decimal", "float"):
            return _different(source, target)
        return _to_decimal(source, target)
    if target.family == "float":
        if source.family not in ("integer", "decimal", "float"):
            return _different(source, target)
        return _to_float(source, target)
    if source.family != target.family:
        return _different(source, target)
    if source.family == "text":
        if target.charset is not None and source.charset != target.charset:
            return (
                f"the target's character set {target.charset} cannot hold every character of "
                f"the source's ({source.charset or 'Unicode'})"
            )
        return _length_fits(source, target, "characters")
    if source.family == "binary":
        if target.bits is not None:
            return _bits_fit(source, target)
        return _length_fits(source, target, "bytes")
    if source.family in ("time", "timestamp"):
        return _to_temporal(source, target)
    if source.family == "json" and target.normal_form not in (None, source.normal_form):
        return (
            f"the target stores its own normal form of a JSON document ({target.normal_form}: "
            "key order, whitespace, duplicate keys), so the text read back is not the text "
            "written"
        )
    return None


def _as_given(source: ColumnType, target: ColumnType) -> str | None:
    """A column of family ``any`` on either side. Into one, a value is judged as in the column
    of its own kind that stores it alike: integers and booleans as integers of ``bits``, floats
    and bytes as they are, dates and times as text a column of their kind holds (SQLite: UTC
    wall clock), decimals and the rest as text (where a decimal's trailing zeros and a char(n)'s
    padding go). Out of one, the kind is unknown: only a fixed-width target is refused, which
    pads a shorter value."""
    if source.family == "any":
        if target.padded is None:
            return None  # not compared: the sink's own checks and the read-back see the values
        return (
            "the source's type is unknown (no declared type) and the target's fixed-width "
            "char(n)/binary(n) pads values to its width: a value read back may not be the "
            "value written"
        )
    kept: ColumnType
    if source.family in ("integer", "boolean"):
        kept = ColumnType(target.declared, "integer", bits=target.bits)
    elif source.family in ("float", "binary", "date"):
        kept = ColumnType(target.declared, source.family)
    elif source.family in ("time", "timestamp"):
        kept = ColumnType(target.declared, source.family, fsp=target.fsp)
    else:
        kept = ColumnType(target.declared, "text")
    return narrowing(source, kept)


def _bits_fit(source: ColumnType, target: ColumnType) -> str | None:
    """Bytes into a MySQL ``BIT(n)`` are read as a number and read back as n bits: only a BIT
    as wide in bytes and at most as wide in bits keeps them."""
    if source.bits is None:
        return f"the target {target.declared} stores a number of {target.bits} bits, not bytes"
    if source.bits > (target.bits or 0) or source.length != target.length:
        return (
            f"the target holds {target.bits} bits read back as {target.length} byte(s), "
            f"the source {source.bits} bits as {source.length}"
        )
    return None


def _text_width(source: ColumnType) -> tuple[int | None, int]:
    """The longest and shortest text of a value of an exact-as-text family (None: unbounded):
    digits and a sign for integers, and a point for decimals; 36 for a UUID."""
    if source.family == "integer":
        low, high = integer_range(source)
        return max(len(str(low)), len(str(high))), 1
    if source.family == "decimal" and source.precision is not None:
        return source.precision + (2 if source.scale else 1), 1
    if source.family == "uuid":
        return 36, 36
    return None, 0


def _as_text(source: ColumnType, target: ColumnType) -> str | None:
    """A value of an exact-as-text family into a text column: its text must fit, unpadded;
    JSON and unknown types need Unicode (numbers and UUIDs are ASCII). A decimal with digits after
    the point (or an unbounded one, which keeps each value's own scale) is refused: its text keeps or drops trailing zeros by the write path (1.50 arrives
    as '1.50' or '1.5'), and the checksum compares decimals without them."""
    if source.family == "decimal" and (source.scale or source.precision is None):
        return (
            "a decimal with digits after the point stored as text keeps or drops its trailing "
            "zeros by the write path (2.10 as '2.10' or '2.1'): store it in a decimal column"
        )
    if "zerofill" in source.declared.lower():
        return (
            "a MySQL ZEROFILL number's text is zero-padded where the server copies it itself "
            "(42 as '00000042'): store it in a number column"
        )
    longest, shortest = _text_width(source)
    if longest is None and target.charset is not None:
        return f"the target's character set {target.charset} cannot hold every character"
    if target.length is not None and (longest is None or longest > target.length):
        held = "text of any length" if longest is None else f"text of up to {longest} characters"
        return f"the target holds up to {target.length} characters, the source's values {held}"
    if target.padded == "kept" and shortest != target.length:
        return "the target char(n) pads shorter values with spaces"
    return None


def _different(source: ColumnType, target: ColumnType) -> str:
    return (
        f"{source.family} values stored as {target.family} are converted, not kept "
        "(another kind of value)"
    )
