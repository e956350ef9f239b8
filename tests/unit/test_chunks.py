"""The chunk planner: half-open, one-based, clipped, canonical bounds; run keys and plan hashes."""

from __future__ import annotations

import datetime as dt
import itertools
import re
from pathlib import Path

import pytest
from dpone import errors
from dpone.plan.chunks import (
    MAX_CHUNKS,
    Bound,
    Chunk,
    ChunkPlanError,
    ChunkSpec,
    backfill_run_key,
    canonical_bound,
    idempotency_key,
    plan_chunks,
    plan_hash,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from .support import backfill_manifest, catalog_with, compile_project, independent_fingerprint

RUN_KEY_RE = re.compile(r"bf-[0-9a-f]{24}")


def spec(type_: str, start: Bound, end: Bound, step: int = 1, unit: str | None = None) -> ChunkSpec:
    default_unit = {"date": "day", "timestamp": "hour", "integer": "value"}[type_]
    return ChunkSpec("c", type_, start, end, step, unit or default_unit)


def ranges(chunk_spec: ChunkSpec) -> list[tuple[Bound, Bound]]:
    return [(c.start, c.end) for c in plan_chunks(chunk_spec, "rk")]


# --- dates ------------------------------------------------------------------------------------


def test_date_days_half_open_one_based() -> None:
    chunks = plan_chunks(spec("date", "2024-01-01", "2024-01-04"), "rk")
    assert [c.index for c in chunks] == [1, 2, 3]
    assert [(c.start, c.end) for c in chunks] == [
        ("2024-01-01", "2024-01-02"),
        ("2024-01-02", "2024-01-03"),
        ("2024-01-03", "2024-01-04"),
    ]


def test_date_weeks_last_chunk_clipped_to_end() -> None:
    assert ranges(spec("date", "2024-01-01", "2024-01-20", 1, "week")) == [
        ("2024-01-01", "2024-01-08"),
        ("2024-01-08", "2024-01-15"),
        ("2024-01-15", "2024-01-20"),
    ]


def test_date_days_with_step_clipped() -> None:
    assert ranges(spec("date", "2024-01-01", "2024-01-06", 2)) == [
        ("2024-01-01", "2024-01-03"),
        ("2024-01-03", "2024-01-05"),
        ("2024-01-05", "2024-01-06"),
    ]


def test_month_end_clipping_is_anchored_to_the_start_day() -> None:
    # Jan 31 + 1 month is Feb 29 (leap year), + 2 months is Mar 31 again: no drift to the 29th.
    assert ranges(spec("date", "2024-01-31", "2024-05-31", 1, "month")) == [
        ("2024-01-31", "2024-02-29"),
        ("2024-02-29", "2024-03-31"),
        ("2024-03-31", "2024-04-30"),
        ("2024-04-30", "2024-05-31"),
    ]


def test_month_end_clipping_non_leap_and_quarterly_step() -> None:
    assert ranges(spec("date", "2023-01-31", "2023-03-15", 1, "month")) == [
        ("2023-01-31", "2023-02-28"),
        ("2023-02-28", "2023-03-15"),
    ]
    assert ranges(spec("date", "2023-11-30", "2024-09-01", 3, "month")) == [
        ("2023-11-30", "2024-02-29"),
        ("2024-02-29", "2024-05-30"),
        ("2024-05-30", "2024-08-30"),
        ("2024-08-30", "2024-09-01"),
    ]


def test_month_over_a_year_gives_twelve_chunks() -> None:
    chunks = plan_chunks(spec("date", "2023-01-31", "2024-01-31", 1, "month"), "rk")
    assert len(chunks) == 12
    assert chunks[-1].start == "2023-12-31" and chunks[-1].end == "2024-01-31"


def test_window_near_the_last_representable_date_is_clipped_not_crashed() -> None:
    # Regression: bounds past dt.date.max used to raise OverflowError / ValueError.
    assert ranges(spec("date", "9999-12-20", "9999-12-31", 1, "week")) == [
        ("9999-12-20", "9999-12-27"),
        ("9999-12-27", "9999-12-31"),
    ]
    assert ranges(spec("date", "9999-10-31", "9999-12-31", 3, "month")) == [
        ("9999-10-31", "9999-12-31")
    ]
    assert plan_chunks(spec("date", "9999-01-31", "9999-12-31", 1, "month"), "rk")[-1].end == (
        "9999-12-31"
    )
    stamps = ranges(spec("timestamp", "9999-12-31T20:00:00Z", "9999-12-31T23:30:00Z"))
    assert stamps[-1] == ("9999-12-31T23:00:00Z", "9999-12-31T23:30:00Z")


@pytest.mark.parametrize(
    ("value", "canonical"),
    [("2024-02-29", "2024-02-29"), (dt.date(2024, 1, 5), "2024-01-05")],
)
def test_date_bounds_are_canonical(value: object, canonical: str) -> None:
    assert canonical_bound("date", value) == canonical


@pytest.mark.parametrize(
    "value",
    [
        "2024-1-1",
        "2024/01/01",
        "2024-02-30",
        "20240101",
        "",
        20240101,
        None,
        True,
        dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        "2024-01-01T00:00:00Z",
    ],
)
def test_bad_date_bounds_are_refused(value: object) -> None:
    with pytest.raises(ChunkPlanError):
        canonical_bound("date", value)


# --- timestamps -------------------------------------------------------------------------------


def test_timestamp_offsets_are_normalised_to_utc() -> None:
    assert canonical_bound("timestamp", "2024-03-01T02:00:00+02:00") == "2024-03-01T00:00:00Z"
    assert canonical_bound("timestamp", "2024-03-01T00:00:00-05:30") == "2024-03-01T05:30:00Z"
    assert canonical_bound("timestamp", "2024-03-01T00:00:00Z") == "2024-03-01T00:00:00Z"
    aware = dt.datetime(2024, 3, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert canonical_bound("timestamp", aware) == "2024-03-01T00:00:00Z"


@pytest.mark.parametrize(
    "value",
    ["2024-03-01T00:00:00", "2024-03-01 00:00:00", "2024-03-01", dt.datetime(2024, 3, 1)],
    ids=["naive-T", "naive-space", "date-only", "naive-datetime"],
)
def test_naive_timestamps_are_refused(value: object) -> None:
    with pytest.raises(ChunkPlanError, match="timezone"):
        canonical_bound("timestamp", value)


@pytest.mark.parametrize("value", ["2024-03-01T00:00:00.5Z", "yesterday", 1700000000, None])
def test_bad_timestamp_bounds_are_refused(value: object) -> None:
    with pytest.raises(ChunkPlanError):
        canonical_bound("timestamp", value)


def test_naive_window_is_refused_by_the_planner_too() -> None:
    with pytest.raises(ChunkPlanError, match="timezone"):
        plan_chunks(spec("timestamp", "2024-03-01T00:00:00", "2024-03-02T00:00:00Z"), "rk")


def test_timestamp_hours_across_an_offset_window() -> None:
    chunks = plan_chunks(
        spec("timestamp", "2024-03-31T00:00:00+01:00", "2024-03-31T03:30:00+02:00"), "rk"
    )
    assert [(c.start, c.end) for c in chunks] == [
        ("2024-03-30T23:00:00Z", "2024-03-31T00:00:00Z"),
        ("2024-03-31T00:00:00Z", "2024-03-31T01:00:00Z"),
        ("2024-03-31T01:00:00Z", "2024-03-31T01:30:00Z"),
    ]


def test_timestamp_minutes_with_step() -> None:
    assert ranges(
        spec("timestamp", "2024-01-01T00:00:00Z", "2024-01-01T00:40:00Z", 15, "minute")
    ) == [
        ("2024-01-01T00:00:00Z", "2024-01-01T00:15:00Z"),
        ("2024-01-01T00:15:00Z", "2024-01-01T00:30:00Z"),
        ("2024-01-01T00:30:00Z", "2024-01-01T00:40:00Z"),
    ]


# --- integers ---------------------------------------------------------------------------------


def test_integer_ranges_clip_the_last_chunk() -> None:
    assert ranges(spec("integer", 0, 10, 3)) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert ranges(spec("integer", -5, 5, 5)) == [(-5, 0), (0, 5)]


@pytest.mark.parametrize("value", [True, False, 1.0, 1.5, "1", None])
def test_integer_bounds_refuse_other_types(value: object) -> None:
    with pytest.raises(ChunkPlanError):
        canonical_bound("integer", value)


def test_unknown_chunk_type_is_refused() -> None:
    with pytest.raises(ChunkPlanError):
        canonical_bound("uuid", "x")


# --- invalid plans ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "chunk_spec",
    [
        spec("date", "2024-01-01", "2024-01-01"),
        spec("date", "2024-01-02", "2024-01-01"),
        spec("timestamp", "2024-01-01T00:00:00Z", "2024-01-01T00:00:00Z"),
        spec("timestamp", "2024-01-01T01:00:00+01:00", "2024-01-01T00:00:00Z"),
        spec("integer", 5, 5),
        spec("integer", 6, 5),
    ],
    ids=["date-equal", "date-reversed", "ts-equal", "ts-equal-after-utc", "int-equal", "int-rev"],
)
def test_zero_length_plans_are_invalid(chunk_spec: ChunkSpec) -> None:
    with pytest.raises(ChunkPlanError, match="zero-length"):
        plan_chunks(chunk_spec, "rk")


@pytest.mark.parametrize(
    "chunk_spec",
    [
        spec("integer", 0, MAX_CHUNKS + 1),
        spec("integer", 0, 10 * MAX_CHUNKS + 1, 10),
        spec(
            "date",
            "1900-01-01",
            (dt.date(1900, 1, 1) + dt.timedelta(days=MAX_CHUNKS + 1)).isoformat(),
        ),
        spec("timestamp", "2000-01-01T00:00:00Z", "2000-03-11T10:41:00Z", 1, "minute"),
    ],
    ids=["int", "int-step", "date", "ts-minutes"],
)
def test_more_than_100k_chunks_is_invalid(chunk_spec: ChunkSpec) -> None:
    with pytest.raises(ChunkPlanError, match="100000"):
        plan_chunks(chunk_spec, "rk")


@pytest.mark.parametrize(
    "chunk_spec",
    [
        spec("integer", 0, MAX_CHUNKS),
        spec(
            "date",
            "1900-01-01",
            (dt.date(1900, 1, 1) + dt.timedelta(days=MAX_CHUNKS)).isoformat(),
        ),
        spec("timestamp", "2000-01-01T00:00:00Z", "2000-03-10T10:40:00Z", 1, "minute"),
    ],
    ids=["int", "date", "ts-minutes"],
)
def test_exactly_100k_chunks_is_allowed(chunk_spec: ChunkSpec) -> None:
    chunks = plan_chunks(chunk_spec, "rk")
    assert len(chunks) == MAX_CHUNKS and chunks[-1].index == MAX_CHUNKS
    assert chunks[0].start == chunk_spec.start and chunks[-1].end == chunk_spec.end


@pytest.mark.parametrize(
    "chunk_spec",
    [
        spec("integer", 0, 10, 0),
        spec("integer", 0, 10, -1),
        spec("date", "2024-01-01", "2024-02-01", 1, "hour"),
        spec("timestamp", "2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z", 1, "value"),
    ],
    ids=["step-0", "step-negative", "date-hour", "ts-value"],
)
def test_bad_step_or_unit_is_invalid(chunk_spec: ChunkSpec) -> None:
    with pytest.raises(ChunkPlanError):
        plan_chunks(chunk_spec, "rk")


# --- properties -------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    start=st.integers(-(10**9), 10**9),
    length=st.integers(1, 5000),
    step=st.integers(1, 700),
)
def test_integer_chunks_tile_the_window(start: int, length: int, step: int) -> None:
    chunks = plan_chunks(spec("integer", start, start + length, step), "rk")
    assert [c.index for c in chunks] == list(range(1, len(chunks) + 1))
    assert chunks[0].start == start and chunks[-1].end == start + length
    for left, right in itertools.pairwise(chunks):
        assert left.end == right.start
    assert all(0 < int(c.end) - int(c.start) <= step for c in chunks)
    assert len(chunks) == -(-length // step)


@settings(max_examples=100, deadline=None)
@given(
    first=st.dates(dt.date(1990, 1, 1), dt.date(2060, 12, 31)),
    days=st.integers(1, 1500),
    step=st.integers(1, 14),
    unit=st.sampled_from(["day", "week", "month"]),
)
def test_date_chunks_tile_the_window(first: dt.date, days: int, step: int, unit: str) -> None:
    last = first + dt.timedelta(days=days)
    chunks = plan_chunks(spec("date", first.isoformat(), last.isoformat(), step, unit), "rk")
    assert chunks[0].start == first.isoformat() and chunks[-1].end == last.isoformat()
    for left, right in itertools.pairwise(chunks):
        assert left.end == right.start
    assert all(c.start < c.end for c in chunks)  # ISO dates order as strings


# --- run keys, idempotency keys, plan hash ----------------------------------------------------

DAILY = ChunkSpec("order_date", "date", "2024-01-01", "2024-01-11", 1, "day")


def test_derived_run_key_is_stable_and_input_sensitive() -> None:
    key = backfill_run_key("analytics.orders", DAILY, "replace")
    assert RUN_KEY_RE.fullmatch(key)
    assert key == "bf-46e9accefaa38057410d8f67"  # pinned: a change here restarts every campaign
    assert key == backfill_run_key("analytics.orders", DAILY, "replace")
    assert key != backfill_run_key("analytics.orders", DAILY, "merge")
    assert key != backfill_run_key("analytics.orders_v2", DAILY, "replace")
    later = ChunkSpec("order_date", "date", "2024-01-01", "2024-01-12", 1, "day")
    assert key != backfill_run_key("analytics.orders", later, "replace")


def test_idempotency_keys_are_unique_fingerprints_of_run_key_index_and_bounds() -> None:
    chunks = plan_chunks(DAILY, "bf-x")
    keys = [c.idempotency_key for c in chunks]
    assert len(set(keys)) == len(keys) == 10
    for c in chunks:
        assert c.idempotency_key == idempotency_key("bf-x", c.index, c.start, c.end)
        assert c.idempotency_key == independent_fingerprint(
            {"run_key": "bf-x", "index": c.index, "start": c.start, "end": c.end}
        )
    assert set(keys).isdisjoint(c.idempotency_key for c in plan_chunks(DAILY, "bf-y"))


def test_backfill_plan_hash_is_stable_and_independently_recomputable() -> None:
    chunks = plan_chunks(DAILY, backfill_run_key("analytics.orders", DAILY, "replace"))
    expected = independent_fingerprint([c.canonical() for c in chunks])
    assert plan_hash(chunks) == expected
    # pinned: golden outputs depend on these bytes
    assert expected == "sha256:600b38f3d9a27df520e9f07621c912430d369975a447f6f2b1b826deebd04fdc"
    again = plan_chunks(DAILY, backfill_run_key("analytics.orders", DAILY, "replace"))
    assert plan_hash(again) == plan_hash(chunks)
    assert plan_hash(chunks[:-1]) != plan_hash(chunks)


def test_chunk_canonical_shape() -> None:
    chunk = Chunk(1, 0, 10, "sha256:" + "0" * 64)
    assert chunk.canonical() == {
        "index": 1,
        "start": 0,
        "end": 10,
        "idempotency_key": chunk.idempotency_key,
    }


# --- through the compiler: explicit vs derived run key, inner mode, full_refresh -------------


def test_run_key_explicit_vs_derived(tmp_path: Path) -> None:
    derived = compile_project(tmp_path / "a", catalog_with(), {"orders.yaml": backfill_manifest()})
    explicit = compile_project(
        tmp_path / "b",
        catalog_with(),
        {
            "orders.yaml": backfill_manifest(
                **{
                    "      parallel_workers: 1": "      parallel_workers: 1\n      backfill_id: orders-2024"
                }
            )
        },
    )
    plan_derived, plan_explicit = derived.only_plan(), explicit.only_plan()
    assert plan_derived.run_key == backfill_run_key(
        "analytics.orders", plan_derived.config.backfill.chunk, "replace"  # type: ignore[union-attr]
    )
    assert plan_explicit.run_key == "orders-2024"
    assert plan_explicit.chunks[0].idempotency_key == idempotency_key(
        "orders-2024", 1, "2024-01-01", "2024-01-02"
    )
    assert plan_explicit.backfill_plan_hash != plan_derived.backfill_plan_hash


def test_inner_mode_change_changes_the_derived_run_key(tmp_path: Path) -> None:
    replace = compile_project(tmp_path / "a", catalog_with(), {"orders.yaml": backfill_manifest()})
    merge = compile_project(
        tmp_path / "b",
        catalog_with(),
        {"orders.yaml": backfill_manifest(**{"inner_mode: replace": "inner_mode: merge"})},
    )
    assert replace.only_plan().run_key != merge.only_plan().run_key
    again = compile_project(tmp_path / "c", catalog_with(), {"orders.yaml": backfill_manifest()})
    assert again.only_plan().run_key == replace.only_plan().run_key
    assert again.only_plan().backfill_plan_hash == replace.only_plan().backfill_plan_hash


@pytest.mark.parametrize("mapping", [None, "{mode: summary, max_items: 5, max_active: 2}"])
def test_multi_chunk_full_refresh_is_rejected_once(tmp_path: Path, mapping: str | None) -> None:
    result = compile_project(
        tmp_path,
        catalog_with(mapping),
        {"orders.yaml": backfill_manifest(**{"inner_mode: replace": "inner_mode: full_refresh"})},
    )
    assert result.codes == [errors.BACKFILL_FULL_REFRESH_MULTI_CHUNK]
    assert "10 chunks" in result.problems[0].message


def test_single_chunk_full_refresh_is_allowed(tmp_path: Path) -> None:
    result = compile_project(
        tmp_path,
        catalog_with(),
        {
            "orders.yaml": backfill_manifest(
                **{
                    "inner_mode: replace": "inner_mode: full_refresh",
                    "end: 2024-01-11": "end: 2024-01-02",
                }
            )
        },
    )
    assert result.only_plan().chunks_total == 1


# --- calendar units on timestamps (UTC) -------------------------------------------------------


@pytest.mark.parametrize(("unit", "hours"), [("day", 24), ("week", 24 * 7)], ids=["day", "week"])
@pytest.mark.parametrize("step", [1, 3])
def test_timestamp_days_and_weeks_are_fixed_utc_hours(unit: str, hours: int, step: int) -> None:
    """UTC has no daylight saving: a day is 24 hours, a week 168, from any start instant."""
    for start in ("2024-03-30T00:00:00Z", "2024-10-26T05:30:00+02:00"):
        calendar = ranges(spec("timestamp", start, "2025-01-01T00:00:00Z", step, unit))
        as_hours = ranges(spec("timestamp", start, "2025-01-01T00:00:00Z", step * hours, "hour"))
        assert calendar == as_hours


def test_timestamp_days_of_a_leap_year() -> None:
    got = ranges(spec("timestamp", "2024-01-01T00:00:00Z", "2025-01-01T00:00:00Z", 1, "day"))
    assert len(got) == 366
    assert got[59] == ("2024-02-29T00:00:00Z", "2024-03-01T00:00:00Z")
    day = dt.date(2024, 1, 1)
    for lower, upper in got:
        assert (lower, upper) == (f"{day}T00:00:00Z", f"{day + dt.timedelta(days=1)}T00:00:00Z")
        day += dt.timedelta(days=1)


def test_timestamp_months_are_calendar_months_in_utc() -> None:
    got = ranges(spec("timestamp", "2023-07-01T00:00:00Z", "2024-07-01T00:00:00Z", 1, "month"))
    firsts = [dt.date(2023 + (6 + m) // 12, (6 + m) % 12 + 1, 1) for m in range(13)]
    assert got == [(f"{a}T00:00:00Z", f"{b}T00:00:00Z") for a, b in itertools.pairwise(firsts)]


def test_timestamp_months_keep_the_time_of_day_and_clip_to_month_ends() -> None:
    assert ranges(
        spec("timestamp", "2024-01-31T06:00:00+01:00", "2024-05-15T00:00:00Z", 1, "month")
    ) == [
        ("2024-01-31T05:00:00Z", "2024-02-29T05:00:00Z"),
        ("2024-02-29T05:00:00Z", "2024-03-31T05:00:00Z"),
        ("2024-03-31T05:00:00Z", "2024-04-30T05:00:00Z"),
        ("2024-04-30T05:00:00Z", "2024-05-15T00:00:00Z"),
    ]
    quarterly = ranges(
        spec("timestamp", "2023-11-30T00:00:00Z", "2024-12-01T00:00:00Z", 3, "month")
    )
    assert [lower for lower, _ in quarterly] == [
        "2023-11-30T00:00:00Z",
        "2024-02-29T00:00:00Z",
        "2024-05-30T00:00:00Z",
        "2024-08-30T00:00:00Z",
        "2024-11-30T00:00:00Z",
    ]


def test_timestamp_calendar_units_near_the_end_of_time_are_clipped() -> None:
    for unit in ("day", "week", "month"):
        got = ranges(spec("timestamp", "9999-12-01T00:00:00Z", "9999-12-31T23:59:59Z", 1, unit))
        assert got[-1][1] == "9999-12-31T23:59:59Z"


def test_timestamp_calendar_units_respect_the_chunk_limit() -> None:
    with pytest.raises(ChunkPlanError, match="more than"):
        plan_chunks(
            spec("timestamp", "0001-01-01T00:00:00Z", "9999-01-01T00:00:00Z", 1, "day"), "rk"
        )
    with pytest.raises(ChunkPlanError, match="more than"):
        plan_chunks(
            spec("timestamp", "0001-01-01T00:00:00Z", "9999-01-01T00:00:00Z", 1, "month"), "rk"
        )


@pytest.mark.parametrize("unit", ["minute", "hour", "day", "week"])
@pytest.mark.parametrize("step", [142_857_143, 999_999_999, 1_000_000_000])
def test_a_timestamp_step_past_any_datetime_span_is_one_chunk(unit: str, step: int) -> None:
    # Regression: a step of a billion days (the schema allows it) raised OverflowError.
    window = ("2024-01-01T00:00:00Z", "2025-01-01T00:00:00Z")
    assert ranges(spec("timestamp", *window, step, unit)) == [window]


@pytest.mark.parametrize(
    "value", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:00:00-05:00"], ids=["before", "after"]
)
def test_timestamps_outside_the_utc_range_are_refused(value: str) -> None:
    with pytest.raises(ChunkPlanError, match="out of range in UTC"):
        canonical_bound("timestamp", value)


def test_timestamps_before_year_1000_keep_four_digits() -> None:
    # strftime writes year 1 as "1", which Postgres reads as 2001
    assert canonical_bound("timestamp", "0001-01-01T00:00:00Z") == "0001-01-01T00:00:00Z"
    assert ranges(spec("timestamp", "0999-12-31T22:00:00Z", "0999-12-31T23:30:00Z")) == [
        ("0999-12-31T22:00:00Z", "0999-12-31T23:00:00Z"),
        ("0999-12-31T23:00:00Z", "0999-12-31T23:30:00Z"),
    ]


def test_value_is_still_refused_for_timestamps() -> None:
    with pytest.raises(ChunkPlanError, match="does not fit"):
        plan_chunks(
            spec("timestamp", "2024-01-01T00:00:00Z", "2024-02-01T00:00:00Z", 1, "value"), "rk"
        )


def test_month_chunks_in_december_9999_are_planned() -> None:
    """The month arithmetic never builds a date past 9999-12-31 (it once returned no chunk)."""
    assert ranges(spec("date", "9999-10-31", "9999-12-31", 1, "month")) == [
        ("9999-10-31", "9999-11-30"),
        ("9999-11-30", "9999-12-31"),
    ]
