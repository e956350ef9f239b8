"""parse_mapping_item: strict, bounded, fail-closed, and never echoing the raw value."""

from __future__ import annotations

import json
from typing import Any

import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.plan.mapping import ITEM_MAX_BYTES
from dpone.task.item import ENV_ITEM, ITEM_FIELDS, ParsedItem, parse_mapping_item
from hypothesis import given, settings
from hypothesis import strategies as st

FP = "sha256:" + "1f" * 32
BH = "sha256:" + "2e" * 32
SECRET = "hunter2-s3cr3t"  # planted in bad inputs: no error message may ever contain it

VALID: dict[str, Any] = {
    "schema": "dpone.airflow-mapping-item.v1",
    "mode": "summary",
    "mapping_plan_fingerprint": FP,
    "backfill_plan_hash": BH,
    "item_index": 1,
    "first_chunk_index": 11,
    "last_chunk_index": 20,
    "chunks_count": 10,
}


def dumps(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def with_(**changes: Any) -> str:
    doc = dict(VALID)
    doc.update(changes)
    return dumps(doc)


def without(key: str) -> str:
    return dumps({k: v for k, v in VALID.items() if k != key})


def assert_invalid(raw: str) -> DponeError:
    with pytest.raises(DponeError) as caught:
        parse_mapping_item(raw)
    exc = caught.value
    assert exc.code == errors.MAPPING_ITEM_INVALID
    assert all(record.code == errors.MAPPING_ITEM_INVALID for record in exc.records)
    for text in (exc.message, str(exc), json.dumps(exc.to_json())):
        assert SECRET not in text
        if len(raw) >= 12:
            assert raw not in text
    assert exc.message.startswith(f"{ENV_ITEM}: ")
    assert not exc.retryable
    return exc


def test_valid_item_parses() -> None:
    parsed = parse_mapping_item(dumps(VALID))
    assert parsed == ParsedItem(1, 11, 20, "summary", FP, BH)
    assert parsed.chunks_count == 10
    assert parsed.to_mapping_section() == {
        "mode": "summary",
        "plan_fingerprint": FP,
        "backfill_plan_hash": BH,
        "item_index": 1,
        "first_chunk_index": 11,
        "last_chunk_index": 20,
        "chunks_count": 10,
    }


def test_key_order_and_whitespace_do_not_matter() -> None:
    spaced = json.dumps(dict(reversed(list(VALID.items()))), indent=2)
    assert parse_mapping_item(spaced) == parse_mapping_item(dumps(VALID))


@pytest.mark.parametrize(
    ("first", "last", "item_index"),
    [(1, 1, 0), (100_000, 100_000, 199), (1, 100_000, 0)],
)
def test_range_boundaries_accepted(first: int, last: int, item_index: int) -> None:
    raw = with_(
        first_chunk_index=first,
        last_chunk_index=last,
        chunks_count=last - first + 1,
        item_index=item_index,
    )
    assert parse_mapping_item(raw).chunks_count == last - first + 1


def test_exactly_8_kib_is_accepted_and_one_byte_more_is_not() -> None:
    body = dumps(VALID)
    exact = body + " " * (ITEM_MAX_BYTES - len(body))
    assert len(exact.encode()) == ITEM_MAX_BYTES
    assert parse_mapping_item(exact).item_index == 1
    exc = assert_invalid(exact + " ")
    assert str(ITEM_MAX_BYTES) in exc.message


def test_size_is_counted_in_utf8_bytes_not_characters() -> None:
    body = with_(mode="é" * 3000)  # 3000 characters, 6000 bytes: fine; 5000: too large
    assert len(body.encode()) < ITEM_MAX_BYTES
    assert "bytes" not in assert_invalid(body).message
    big = with_(mode="é" * 4500)
    assert len(big) < ITEM_MAX_BYTES < len(big.encode())
    assert "bytes" in assert_invalid(big).message


NEGATIVE: dict[str, str] = {
    # malformed JSON
    "empty": "",
    "truncated": dumps(VALID)[:-1],
    "single-quotes": dumps(VALID).replace('"', "'"),
    "trailing-comma": dumps(VALID)[:-1] + ",}",
    "not-json": f"mode=summary token={SECRET}",
    "bom": "\ufeff" + dumps(VALID),
    "comment": "/*" + SECRET + "*/" + dumps(VALID),
    "two-documents": dumps(VALID) + dumps(VALID),
    # not an object
    "array": dumps([VALID]),
    "string": dumps(SECRET),
    "number": "42",
    "null": "null",
    # unknown fields
    "unknown-field": with_(token=SECRET),
    "unknown-secret-key": with_(**{f"password={SECRET}": 1}),
    "predicate-field": with_(predicate=f"1=1; DROP TABLE {SECRET}"),
    # duplicate keys
    "duplicate-known": dumps(VALID)[:-1] + ',"item_index":2}',
    "duplicate-unknown": '{"' + SECRET + '":1,"' + SECRET + '":2}',
    # missing fields
    **{f"missing-{key}": without(key) for key in ITEM_FIELDS},
    # wrong constants
    "schema-other": with_(schema="dpone.airflow-mapping-item.v2"),
    "schema-secret": with_(schema=SECRET),
    "mode-internal": with_(mode="internal"),
    "mode-case": with_(mode="SUMMARY"),
    "mode-secret": with_(mode=SECRET),
    # wrong types where an integer is expected
    "index-bool": with_(item_index=True),
    "index-float": with_(item_index=1.0),
    "index-string": with_(item_index="1"),
    "index-null": with_(item_index=None),
    "first-float": with_(first_chunk_index=11.0),
    "last-bool": with_(last_chunk_index=False),
    "count-string": with_(chunks_count=SECRET),
    "count-exponent": dumps(VALID).replace('"chunks_count":10', '"chunks_count":1e1'),
    "count-huge-exponent": dumps(VALID).replace('"chunks_count":10', '"chunks_count":1e999'),
    # negative and out of range
    "index-negative": with_(item_index=-1),
    "first-zero": with_(first_chunk_index=0, chunks_count=21),
    "first-negative": with_(first_chunk_index=-5, chunks_count=26),
    "index-200": with_(item_index=200),
    "last-above-100k": with_(last_chunk_index=100_001, chunks_count=100_001 - 11 + 1),
    "count-above-100k": with_(first_chunk_index=1, last_chunk_index=100_001, chunks_count=100_001),
    "huge-int": dumps(VALID).replace('"item_index":1', '"item_index":' + "9" * 5000),
    # inconsistent range
    "count-inconsistent": with_(chunks_count=9),
    "last-before-first": with_(first_chunk_index=20, last_chunk_index=11, chunks_count=10),
    # fingerprints (including secret-like strings)
    "fp-uppercase": with_(mapping_plan_fingerprint=FP.upper()),
    "fp-short": with_(mapping_plan_fingerprint=FP[:-1]),
    "fp-long": with_(mapping_plan_fingerprint=FP + "0"),
    "fp-md5": with_(mapping_plan_fingerprint="md5:" + "0" * 32),
    "fp-newline": with_(backfill_plan_hash=BH + "\n"),
    "fp-secret": with_(mapping_plan_fingerprint=f"sk_live_{SECRET}"),
    "fp-dsn": with_(backfill_plan_hash=f"postgresql://etl:{SECRET}@db:5432/wh"),
    "fp-token-padded": with_(mapping_plan_fingerprint=f"sha256:{SECRET}" + "0" * 50),
    "fp-number": with_(backfill_plan_hash=12345),
    # non-standard numbers
    "nan": dumps(VALID).replace('"item_index":1', '"item_index":NaN'),
    "infinity": dumps(VALID).replace('"chunks_count":10', '"chunks_count":Infinity'),
    "minus-infinity": dumps(VALID).replace('"item_index":1', '"item_index":-Infinity'),
    # nested objects and arrays
    "nested-mode": with_(mode={"mode": "summary", "secret": SECRET}),
    "nested-index": with_(item_index={"value": 1}),
    "nested-schema": with_(schema={"$ref": SECRET}),
    "list-index": with_(item_index=[1]),
    "deep-nesting": "[" * 4000 + "]" * 4000,
    "deep-object": '{"a":' * 2000 + "1" + "}" * 2000,
    # encodings
    "lone-surrogate": with_(mode="\ud800"),
    "control-char": with_(mode="summary\x00" + SECRET),
}


@pytest.mark.parametrize("raw", list(NEGATIVE.values()), ids=list(NEGATIVE))
def test_negative_items_fail_closed(raw: str) -> None:
    assert_invalid(raw)


def test_oversized_item_is_refused_before_parsing() -> None:
    raw = with_(mode="summary", padding=SECRET * 1000)
    assert len(raw.encode()) > ITEM_MAX_BYTES
    exc = assert_invalid(raw)
    assert "exceeds 8192 bytes" in exc.message


def test_duplicate_of_a_known_field_is_named_but_unknown_keys_never_are() -> None:
    assert "'item_index'" in assert_invalid(NEGATIVE["duplicate-known"]).message
    message = assert_invalid(NEGATIVE["unknown-secret-key"]).message
    assert "1 unknown field(s)" in message and "password" not in message


def test_messages_name_the_problem() -> None:
    assert (
        "chunks_count 9 does not match range 11..20"
        in assert_invalid(NEGATIVE["count-inconsistent"]).message
    )
    assert (
        "item_index must be an integer, got bool" in assert_invalid(NEGATIVE["index-bool"]).message
    )
    assert "item_index 200 is outside 0..199" in assert_invalid(NEGATIVE["index-200"]).message
    assert (
        "missing field(s) chunks_count" in assert_invalid(NEGATIVE["missing-chunks_count"]).message
    )
    assert "non-standard number NaN" in assert_invalid(NEGATIVE["nan"]).message


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_is_an_item_or_item_invalid(raw: str) -> None:
    try:
        parse_mapping_item(raw)
    except DponeError as exc:
        assert exc.code == errors.MAPPING_ITEM_INVALID


scalar = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=20)
json_like = st.recursive(
    scalar | st.floats(),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(ITEM_FIELDS), value=json_like)
def test_any_single_field_mutation_is_accepted_only_when_still_valid(key: str, value: Any) -> None:
    doc = dict(VALID)
    doc[key] = value
    raw = json.dumps(doc)
    try:
        parsed = parse_mapping_item(raw)
    except DponeError as exc:
        assert exc.code == errors.MAPPING_ITEM_INVALID
        return
    # accepted: the mutation must have produced another valid item
    assert type(value) is (int if key.endswith(("index", "count")) else str)
    assert parsed.chunks_count == parsed.last_chunk_index - parsed.first_chunk_index + 1
