"""The planners write canonical JSON of fixed shapes directly (bench/plan_bench.py): those bytes
must equal the generic canonical_text of the same value, on every input, including the inputs
that fall back to the generic path."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
from typing import Any

import pytest
from dpone.plan.canonical import canonical_text, fingerprint, fingerprint_text, json_scalar
from dpone.plan.chunks import (
    Chunk,
    ChunkSpec,
    _bounds,
    format_timestamp,
    idempotency_key,
    parse_timestamp,
    plan_chunks,
    plan_chunks_hashed,
    plan_hash,
)
from dpone.plan.mapping import MappingItem, MappingPolicy, plan_mapping
from hypothesis import given, settings
from hypothesis import strategies as st

from .support import independent_fingerprint


class Level(enum.IntEnum):
    ONE = 1


class Name(str):
    pass


@settings(max_examples=300, deadline=None)
@given(st.text() | st.integers())
def test_json_scalar_is_canonical_text(value: str | int) -> None:
    assert json_scalar(value) == canonical_text(value)


@pytest.mark.parametrize("value", [True, False, None, 1.0, Level.ONE, Name("x"), [1], {"a": 1}])
def test_json_scalar_refuses_everything_else(value: Any) -> None:
    assert json_scalar(value) is None


def test_fingerprint_text_is_fingerprint_of_canonical_text() -> None:
    value = {"b": [1, "ü"], "a": None}
    assert fingerprint_text(canonical_text(value)) == fingerprint(value)


def test_canonical_text_still_accepts_int_and_str_subclasses() -> None:
    assert canonical_text({"a": Level.ONE, "b": Name("x")}) == '{"a":1,"b":"x"}'
    assert canonical_text({"t": (Level.ONE,)}) == '{"t":[1]}'


run_keys = st.text(min_size=1, max_size=30) | st.sampled_from(["bf-0123", 'q"uote\\', "ü\n\t"])


@st.composite
def specs(draw: st.DrawFn) -> ChunkSpec:
    kind = draw(st.sampled_from(["integer", "date", "timestamp"]))
    step = draw(st.integers(1, 9))
    if kind == "integer":
        start = draw(st.integers(-(10**12), 10**12))
        return ChunkSpec("c", kind, start, start + draw(st.integers(1, 300)), step, "value")
    if kind == "date":
        unit = draw(st.sampled_from(["day", "week", "month"]))
        year = draw(st.integers(1990, 2040))
        return ChunkSpec("c", kind, f"{year}-01-31", f"{year + 1}-03-01", step, unit)
    unit = draw(st.sampled_from(["hour", "minute"]))
    return ChunkSpec("c", kind, "2024-03-30T22:00:00Z", "2024-04-01T03:00:00Z", step * 7, unit)


@settings(max_examples=150, deadline=None)
@given(specs(), run_keys)
def test_chunk_keys_and_plan_hash_equal_the_generic_form(spec: ChunkSpec, run_key: str) -> None:
    chunks = plan_chunks(spec, run_key)
    for chunk in chunks:
        assert chunk.idempotency_key == idempotency_key(
            run_key, chunk.index, chunk.start, chunk.end
        )
        assert chunk == Chunk(chunk.index, chunk.start, chunk.end, chunk.idempotency_key)
        assert hash(chunk) == hash(
            Chunk(chunk.index, chunk.start, chunk.end, chunk.idempotency_key)
        )
    assert plan_hash(chunks) == independent_fingerprint([c.canonical() for c in chunks])
    assert plan_chunks_hashed(spec, run_key) == (chunks, plan_hash(chunks))


def _datetime_bounds(spec: ChunkSpec) -> list[tuple[str, str]]:
    """The timestamp bounds the way they were first written: datetimes and strftime."""
    begin, finish = parse_timestamp(spec.start), parse_timestamp(spec.end)
    delta = dt.timedelta(**{spec.unit + "s": spec.step})
    out, lower = [], begin
    while lower < finish:
        try:
            upper = min(lower + delta, finish)
        except OverflowError:
            upper = finish
        out.append((format_timestamp(lower), format_timestamp(upper)))
        lower = upper
    return out


@settings(max_examples=300, deadline=None)
@given(
    start=st.datetimes(dt.datetime(900, 1, 1), dt.datetime(9999, 12, 30)),
    minutes=st.integers(1, 3_000),
    whole=st.booleans(),
    unit=st.sampled_from(["hour", "minute", "day", "week"]),
    step=st.integers(1, 90),
)
def test_timestamp_bounds_equal_the_datetime_form(
    start: dt.datetime, minutes: int, whole: bool, unit: str, step: int
) -> None:
    if whole:
        start = start.replace(microsecond=0)
    begin = start.replace(tzinfo=dt.UTC)
    try:
        end = begin + dt.timedelta(minutes=minutes, seconds=minutes % 7)
    except OverflowError:
        end = dt.datetime.max.replace(tzinfo=dt.UTC)
    spec = ChunkSpec("c", "timestamp", begin.isoformat(), end.isoformat(), step, unit)
    assert _bounds(spec) == _datetime_bounds(spec)


def test_a_year_of_hours_has_8760_chunks_and_the_generic_hash() -> None:
    spec = ChunkSpec("ts", "timestamp", "2023-01-01T00:00:00Z", "2024-01-01T00:00:00Z", 1, "hour")
    chunks, hashed = plan_chunks_hashed(spec, "bf-year")
    assert len(chunks) == 8_760 and chunks[-1].end == "2024-01-01T00:00:00Z"
    assert chunks[24].start == "2023-01-02T00:00:00Z" and chunks[24].end == "2023-01-02T01:00:00Z"
    assert hashed == independent_fingerprint([c.canonical() for c in chunks])


def test_fast_chunks_are_ordinary_frozen_chunks() -> None:
    chunk = plan_chunks(ChunkSpec("c", "integer", 0, 10, 5, "value"), "rk")[0]
    assert type(chunk) is Chunk and dataclasses.asdict(chunk)["index"] == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        chunk.index = 2  # type: ignore[misc]
    assert repr(chunk).startswith("Chunk(index=1, start=0, end=5, idempotency_key='sha256:")


def test_plan_hash_falls_back_for_unusual_chunks() -> None:
    chunks = (Chunk(1, Level.ONE, 2, "k"), Chunk(2, 2, Name("3"), "k2"))
    assert plan_hash(chunks) == fingerprint([c.canonical() for c in chunks])
    with pytest.raises(TypeError, match="float"):
        plan_hash((Chunk(1, 0.5, 1, "k"),))


def test_run_key_of_another_type_takes_the_generic_path() -> None:
    spec = ChunkSpec("c", "integer", 0, 3, 1, "value")
    chunks = plan_chunks(spec, Name("rk"))
    assert [c.idempotency_key for c in chunks] == [
        c.idempotency_key for c in plan_chunks(spec, "rk")
    ]


@settings(max_examples=150, deadline=None)
@given(
    chunks=st.integers(1, 2000),
    max_items=st.integers(1, 200),
    mode=st.sampled_from(["summary", "visible"]),
    pool=st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,30}", fullmatch=True),
)
def test_item_env_values_equal_the_generic_form(
    chunks: int, max_items: int, mode: str, pool: str
) -> None:
    if mode == "visible":
        chunks = min(chunks, max_items)
    plan = plan_mapping(
        MappingPolicy(mode, max_items, min(16, max_items), pool), chunks, "sha256:" + "9" * 64
    )
    assert plan is not None
    for item in plan.items:
        env = plan.item_env_value(item)
        assert env == canonical_text(plan.item_payload(item))
        assert json.loads(env) == plan.item_payload(item)
    artifact = plan.to_artifact()
    body = {k: v for k, v in artifact.items() if k != "plan_fingerprint"}
    assert artifact["plan_fingerprint"] == independent_fingerprint(body)


def test_item_env_value_falls_back_for_unusual_fields() -> None:
    plan = plan_mapping(MappingPolicy("summary", 2, 1, "p"), 4, "sha256:" + "1" * 64)
    assert plan is not None
    odd = dataclasses.replace(plan, mode=Name("summary"))
    item = MappingItem(Level.ONE, 3, 4)
    assert odd.item_env_value(item) == canonical_text(odd.item_payload(item))
    assert plan.item_env_value(item) == canonical_text(plan.item_payload(item))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.integers(), st.booleans()))
def test_bound_text_is_the_json_dumps_form(value: Any) -> None:
    """The stored bound text (dpone.ledger.sql.bound_text) takes json_scalar for str and int:
    still byte for byte what json.dumps wrote before, NUL, quotes, non-ASCII and bool included."""
    from dpone.ledger.sql import bound_text

    assert bound_text(value) == json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def test_plan_hash_is_kept_per_tuple_and_never_for_what_can_change() -> None:
    """plan_hash keeps the hash of a tuple of exact chunks (immutable) by identity; an equal
    tuple hashes equal, more tuples than are kept still hash right, and a sequence that can
    change (a list, or objects that are not exact chunks) is hashed anew each time."""
    spec = ChunkSpec("c", "integer", 0, 40, 1, "value")
    chunks = plan_chunks(spec, "bf-keep")
    first = plan_hash(chunks)
    assert plan_hash(chunks) == first == plan_hash(tuple(list(chunks)))
    others = [
        plan_chunks(ChunkSpec("c", "integer", 0, n, 1, "value"), "bf-keep") for n in range(1, 20)
    ]
    for other in others:
        assert plan_hash(other) == independent_fingerprint([c.canonical() for c in other])
    assert plan_hash(chunks) == first
    listed = list(chunks)
    assert plan_hash(listed) == first  # type: ignore[arg-type]
    listed.pop()
    assert plan_hash(listed) == plan_hash(chunks[:-1]) != first  # type: ignore[arg-type]

    @dataclasses.dataclass
    class Loose:  # a chunk-like object whose bounds can change after hashing
        index: int
        start: int
        end: int
        idempotency_key: str

        def canonical(self) -> dict[str, object]:
            return dataclasses.asdict(self)

    loose = (Loose(1, 0, 1, "k"),)
    before = plan_hash(loose)  # type: ignore[arg-type]
    loose[0].end = 2
    assert plan_hash(loose) != before  # type: ignore[arg-type]
