"""Canonical JSON: the exact byte form behind every fingerprint and env value."""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

import pytest
from dpone.plan.canonical import canonical_bytes, canonical_text, fingerprint, is_fingerprint
from hypothesis import given, settings
from hypothesis import strategies as st

from .support import independent_fingerprint

FINGERPRINT_RE = re.compile(r"sha256:[0-9a-f]{64}")

# JSON values without floats (canonical artifacts hold none).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


def test_exact_bytes_sorted_compact_utf8() -> None:
    value = {"b": 1, "a": [1, "é", True, None], "c": {"z": "x\n", "y": -2}, "ü": "☃"}
    assert canonical_bytes(value) == (
        '{"a":[1,"é",true,null],"b":1,"c":{"y":-2,"z":"x\\n"},"ü":"☃"}'.encode()
    )


def test_same_as_json_dumps_with_the_contract_settings() -> None:
    value = {"k": ["\u2028", "\x00", '"quoted"', "back\\slash"], "n": 10**30}
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_text(value) == expected
    assert " " not in canonical_text({"a": 1, "b": [1, 2]})


def test_insertion_order_does_not_matter() -> None:
    assert canonical_text({"a": 1, "b": 2}) == canonical_text({"b": 2, "a": 1})
    assert fingerprint({"a": 1, "b": 2}) == fingerprint({"b": 2, "a": 1})


def test_tuples_serialise_as_lists() -> None:
    assert canonical_text({"t": (1, 2)}) == canonical_text({"t": [1, 2]}) == '{"t":[1,2]}'


@pytest.mark.parametrize(
    "value",
    [1.0, 0.5, math.nan, math.inf, -math.inf, {"a": 1.0}, [1, [2, 3.5]], {"a": {"b": [0.0]}}],
    ids=["1.0", "0.5", "nan", "inf", "-inf", "dict", "nested-list", "deep"],
)
def test_floats_are_rejected(value: Any) -> None:
    with pytest.raises(TypeError, match="float"):
        canonical_text(value)
    with pytest.raises(TypeError):
        fingerprint(value)


def test_float_error_names_the_path() -> None:
    with pytest.raises(TypeError, match=r"\$\.a\.b\[1\]"):
        canonical_text({"a": {"b": [1, 2.5]}})


@pytest.mark.parametrize(
    "value", [{1: "int key"}, {"s": {1, 2}}, b"bytes", object(), {"a": [bytearray(b"x")]}]
)
def test_foreign_types_and_keys_are_rejected(value: Any) -> None:
    with pytest.raises(TypeError):
        canonical_text(value)


def test_fingerprint_format_and_independent_recomputation() -> None:
    value = {"schema": "x", "items": [{"i": 1}, {"i": 2}], "name": "naïve"}
    fp = fingerprint(value)
    assert FINGERPRINT_RE.fullmatch(fp)
    assert fp == independent_fingerprint(value)
    assert fp == "sha256:" + hashlib.sha256(canonical_bytes(value)).hexdigest()


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("sha256:" + "0" * 64, True),
        ("sha256:" + "0123456789abcdef" * 4, True),
        ("sha256:" + "A" * 64, False),
        ("sha256:" + "0" * 63, False),
        ("sha256:" + "0" * 65, False),
        ("sha256:" + "0" * 64 + "\n", False),
        ("sha512:" + "0" * 64, False),
        ("SHA256:" + "0" * 64, False),
        ("sha256:" + "g" * 64, False),
        ("", False),
        (None, False),
        (12345, False),
        (["sha256:" + "0" * 64], False),
    ],
)
def test_is_fingerprint(value: object, ok: bool) -> None:
    assert is_fingerprint(value) is ok


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_canonical_round_trips_and_is_deterministic(value: Any) -> None:
    text = canonical_text(value)
    assert json.loads(text) == value
    assert canonical_text(json.loads(text)) == text
    assert fingerprint(value) == independent_fingerprint(value)
    assert FINGERPRINT_RE.fullmatch(fingerprint(value))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=5), st.integers(), min_size=1, max_size=6), st.data())
def test_one_field_change_changes_the_fingerprint(
    value: dict[str, int], data: st.DataObject
) -> None:
    key = data.draw(st.sampled_from(sorted(value)))
    changed = dict(value)
    changed[key] = value[key] + data.draw(st.integers(min_value=1, max_value=10**6))
    assert fingerprint(changed) != fingerprint(value)
