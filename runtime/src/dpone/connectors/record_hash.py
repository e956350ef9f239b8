"""Which columns two Postgres sides may hash by their own type instead of by canonical text.

The checksum of the read-back gate and of ``dpone verify`` sums a 64-bit hash of each row. Its
portable form hashes the row's canonical text (``rowsum-pghash64-v1``, the same value in every
dialect and in Python); building that text is most of what the checksum costs. When both sides
are Postgres, a cheaper form exists (``rowsum-pgrecord-v2``, ADR 0023): Postgres's
``hash_record_extended`` over the row, mixed by ``hashint8extended`` (the record hash alone is
linear in its columns' hashes, so its sum could not tell values swapped between rows), a column of a type below hashed by its type's own
extended hash function, any other column as its canonical text. Each side computes it from its
own types alone, so two sides agree on it when every column they share hashes in the same
family on both: the same type, or types Postgres itself hashes alike (``int2``/``int4``/``int8``;
``text``/``varchar``). Each type's equality is no looser than its canonical text's, so the record
form tells apart every pair of values the canonical text does. Two sides that do not agree (a
column widened from ``integer`` to ``numeric``, another dialect) compare in canonical text.
Database-neutral: type OIDs only, standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence

#: checksum scheme of the record form (the canonical-text form is base.CHECKSUM_SCHEME)
RECORD_CHECKSUM_SCHEME = "rowsum-pgrecord-v2"

#: type OID -> hash family: two columns hash alike when their families are equal. Each type's
#: equality here is no looser than its canonical text (numeric and its trailing zeros: trim_scale;
#: timestamptz: the instant, read in UTC; text under COLLATE "C": its bytes; bpchar: without its
#: trailing blanks, as its text; float: -0 equals 0, both ways).
_FAMILIES: dict[int, str] = {
    20: "integer",  # int8
    21: "integer",  # int2
    23: "integer",  # int4
    25: "text",
    1043: "text",  # varchar
    1042: "bpchar",
    1700: "numeric",
    700: "float4",
    701: "float8",
    16: "bool",
    1082: "date",
    1083: "time",
    1114: "timestamp",
    1184: "timestamptz",
    2950: "uuid",
    17: "bytea",
}
#: families hashed as text (under COLLATE "C", so by their bytes)
TEXT_FAMILIES = frozenset({"text", "bpchar"})


def hash_family(oid: int) -> str | None:
    """The family a column of type ``oid`` hashes in by its type, or None (as canonical text)."""
    return _FAMILIES.get(oid)


def same_hash_families(one: Sequence[tuple[str, int]], other: Sequence[tuple[str, int]]) -> bool:
    """True when every column both sides describe hashes in one family on both (or as canonical
    text on both): then each side's record form, computed from its own types alone, agrees
    with the other's, so the two sides may compare checksums in it."""
    families = {name: hash_family(oid) for name, oid in other}
    return all(families[name] == hash_family(oid) for name, oid in one if name in families)
