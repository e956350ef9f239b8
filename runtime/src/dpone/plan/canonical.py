"""Canonical JSON and sha256 fingerprints: the one byte form every hash and env value uses."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring
from typing import Any

# The exact encoder json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False) builds
# on every call; made once, it gives the same bytes without the per-call construction.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_PLAIN_SCALARS = frozenset({str, int, bool, type(None)})


def _reject_floats(value: Any, path: str = "$") -> None:
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return
    if isinstance(value, float):
        raise TypeError(f"float at {path}: hashed artifacts hold no floats")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"non-string key at {path}")
            _reject_floats(item, f"{path}.{key}")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _reject_floats(item, f"{path}[{index}]")
        return
    raise TypeError(f"{type(value).__name__} at {path} is not canonical JSON")


def _plainly_canonical(value: Any) -> bool:
    """True when ``value`` holds only exact str/int/bool/None, str-keyed dicts, lists and tuples.

    The common case, checked without building error paths; anything else (a float, a subclass,
    a foreign type) goes through the precise walk, which raises or accepts exactly as before.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _PLAIN_SCALARS:
            continue
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    return False
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        else:
            return False
    return True


def canonical_text(value: Any) -> str:
    """sort_keys, no spaces, UTF-8 kept as is; raises TypeError on floats and foreign types."""
    if not _plainly_canonical(value):
        _reject_floats(value)
    return _ENCODER.encode(value)


def canonical_bytes(value: Any) -> bytes:
    return canonical_text(value).encode("utf-8")


def field_values(record: Any, kind: type | None = None) -> dict[str, Any]:
    """The dataclass fields of ``kind`` (the record's own class by default) by name, in
    declaration order, shallow: the canonical or JSON form of a record of plain values, written
    once, so a field added to the record cannot be left out of its hash or its output."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(kind or record)}


class FieldRecord:
    """A dataclass whose canonical form is its fields (:func:`field_values`)."""

    def canonical(self) -> dict[str, Any]:
        return field_values(self)


def fingerprint(value: Any) -> str:
    """``sha256:`` + 64 lowercase hex over the canonical bytes of ``value``."""
    return "sha256:" + hashlib.sha256(canonical_bytes(value)).hexdigest()


# --- fixed-shape fast paths -----------------------------------------------------------------------
# Chunk keys, plan hashes and item env values have a fixed set of keys and only str/int values.
# Their planners write the canonical text directly with these helpers (keys in sorted order, no
# spaces) instead of building a dict per value; tests prove the bytes equal canonical_text().


def json_scalar(value: Any) -> str | None:
    """The canonical JSON of an exact str or int (as json.dumps writes it), else None."""
    kind = type(value)
    if kind is str:
        return encode_basestring(value)
    if kind is int:
        return int.__repr__(value)
    return None


def fingerprint_text(text: str) -> str:
    """``sha256:`` + hex over text that is already canonical JSON."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_fingerprint(value: object) -> bool:
    if not isinstance(value, str) or len(value) != 71 or not value.startswith("sha256:"):
        return False
    return all(c in "0123456789abcdef" for c in value[7:])


class _Refused(Exception):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error


def strict_json_object(
    raw: str, max_bytes: int, fields: Sequence[str], fail: Callable[[str], Exception]
) -> dict[str, Any]:
    """``raw`` (an environment value dpone itself wrote) as one JSON object, parsed strictly:
    at most ``max_bytes``, no duplicate keys, no NaN/Infinity, no field outside ``fields``.
    Refusals are ``fail(message)``; a message never echoes the raw value or an unknown key's name
    (a pasted secret?): it counts them."""
    if len(raw.encode("utf-8", errors="surrogatepass")) > max_bytes:
        raise fail(f"value exceeds {max_bytes} bytes")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                # Name only our own field names: anything else is part of the raw value.
                shown = f"duplicate key {key!r}" if key in fields else "a duplicate key"
                raise _Refused(fail(shown))
            seen[key] = value
        return seen

    def reject_constant(name: str) -> Any:
        raise _Refused(fail(f"non-standard number {name}"))

    try:
        doc = json.loads(raw, object_pairs_hook=no_duplicates, parse_constant=reject_constant)
    except _Refused as refused:
        raise refused.error from None
    except (ValueError, RecursionError) as exc:
        raise fail(f"not valid JSON ({type(exc).__name__})") from None
    if not isinstance(doc, dict):
        raise fail(f"must be a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(fields))
    if unknown:
        raise fail(f"{len(unknown)} unknown field(s); allowed: {', '.join(fields)}")
    return doc
