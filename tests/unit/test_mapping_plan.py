"""The bounded mapping planner: range construction, coverage, balance, fingerprints, items."""

from __future__ import annotations

import dataclasses
import json

import pytest
from dpone import errors
from dpone.plan.canonical import canonical_text, is_fingerprint
from dpone.plan.mapping import (
    ITEM_MAX_BYTES,
    ITEM_SCHEMA,
    PLAN_SCHEMA,
    MappingItem,
    MappingPlan,
    MappingPlanError,
    MappingPolicy,
    balanced_ranges,
    plan_mapping,
    verify_coverage,
)
from dpone.task.item import parse_mapping_item
from hypothesis import given, settings
from hypothesis import strategies as st

from .support import FAKE_HASH, independent_fingerprint, summary_plan

OTHER_HASH = "sha256:" + "cd" * 32


def sizes(plan: MappingPlan) -> list[int]:
    return [item.chunks_count for item in plan.items]


def covered(plan: MappingPlan) -> list[int]:
    return [
        i for item in plan.items for i in range(item.first_chunk_index, item.last_chunk_index + 1)
    ]


def test_internal_has_no_mapping_plan() -> None:
    assert plan_mapping(MappingPolicy(), 365, FAKE_HASH) is None


# --- visible: 1, exact max, max + 1, 1000 ---------------------------------------------------


@pytest.mark.parametrize(("chunks", "max_items"), [(1, 1), (1, 200), (30, 30), (200, 200)])
def test_visible_one_item_per_chunk_up_to_max(chunks: int, max_items: int) -> None:
    plan = summary_plan(chunks, max_items, mode="visible")
    assert plan.items_total == chunks
    assert [(i.first_chunk_index, i.last_chunk_index) for i in plan.items] == [
        (n, n) for n in range(1, chunks + 1)
    ]


@pytest.mark.parametrize(("chunks", "max_items"), [(2, 1), (31, 30), (201, 200), (1000, 200)])
def test_visible_above_max_items_is_blocked(chunks: int, max_items: int) -> None:
    with pytest.raises(MappingPlanError) as caught:
        summary_plan(chunks, max_items, mode="visible")
    assert caught.value.code == errors.MAPPING_TASK_LIMIT_EXCEEDED
    assert f"{chunks} chunks exceed max_items {max_items}" in str(caught.value)


# --- summary: 1, exact max, max + 1, 1000 ---------------------------------------------------


@pytest.mark.parametrize(
    ("chunks", "max_items", "expected_sizes"),
    [
        (1, 1, [1]),
        (1, 200, [1]),
        (200, 200, [1] * 200),
        (201, 200, [2] + [1] * 199),
        (1000, 200, [5] * 200),
        (1000, 7, [143] * 6 + [142]),
        (365, 40, [10] * 5 + [9] * 35),
        (12, 6, [2] * 6),
    ],
)
def test_summary_sizes(chunks: int, max_items: int, expected_sizes: list[int]) -> None:
    plan = summary_plan(chunks, max_items)
    assert sizes(plan) == expected_sizes
    assert covered(plan) == list(range(1, chunks + 1))


def test_contract_example_365_into_40() -> None:
    plan = summary_plan(365, 40)
    first, second = plan.items[0], plan.items[1]
    assert (first.first_chunk_index, first.last_chunk_index, first.chunks_count) == (1, 10, 10)
    assert (second.first_chunk_index, second.last_chunk_index, second.chunks_count) == (11, 20, 10)
    assert plan.items[-1].last_chunk_index == 365


@pytest.mark.parametrize(("chunks", "items"), [(0, 1), (5, 0), (5, 6), (-1, 1)])
def test_balanced_ranges_refuses_impossible_splits(chunks: int, items: int) -> None:
    with pytest.raises(ValueError, match="cannot split"):
        balanced_ranges(chunks, items)


# --- the artifact and its fingerprint ------------------------------------------------------


def test_artifact_shape_and_independent_fingerprint() -> None:
    plan = summary_plan(365, 40)
    artifact = plan.to_artifact()
    assert list(artifact) == [
        "schema",
        "mode",
        "backfill_plan_hash",
        "chunks_total",
        "items_total",
        "limits",
        "items",
        "plan_fingerprint",
    ]
    assert artifact["schema"] == PLAN_SCHEMA
    assert artifact["limits"] == {"max_items": 40, "max_active": 16, "pool": "dpone_backfill"}
    assert artifact["items"][0] == {
        "item_index": 0,
        "first_chunk_index": 1,
        "last_chunk_index": 10,
        "chunks_count": 10,
    }
    without = {k: v for k, v in artifact.items() if k != "plan_fingerprint"}
    assert artifact["plan_fingerprint"] == independent_fingerprint(without)
    assert is_fingerprint(artifact["plan_fingerprint"])
    # the artifact itself is canonical-JSON clean and holds no SQL or connection data
    text = canonical_text(artifact)
    assert "SELECT" not in text.upper() and "postgres" not in text


def test_one_field_changes_change_the_fingerprint() -> None:
    base = MappingPolicy("summary", 40, 8, "dpone_backfill")
    reference = plan_mapping(base, 365, FAKE_HASH)
    assert reference is not None
    variants = [
        plan_mapping(dataclasses.replace(base, max_items=41), 365, FAKE_HASH),
        plan_mapping(dataclasses.replace(base, max_active=9), 365, FAKE_HASH),
        plan_mapping(dataclasses.replace(base, pool="other_pool"), 365, FAKE_HASH),
        plan_mapping(base, 366, FAKE_HASH),
        plan_mapping(base, 365, OTHER_HASH),
    ]
    fingerprints = {v.plan_fingerprint for v in variants if v is not None}
    assert len(fingerprints) == len(variants)
    assert reference.plan_fingerprint not in fingerprints


def test_mode_alone_changes_the_fingerprint() -> None:
    # 30 chunks under max_items 30: visible and summary have identical items.
    visible = summary_plan(30, 30, mode="visible")
    summary = summary_plan(30, 30)
    assert visible.items == summary.items
    assert visible.plan_fingerprint != summary.plan_fingerprint


# --- coverage verification -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("items", "total", "why"),
    [
        ((MappingItem(0, 1, 2), MappingItem(1, 4, 5)), 5, "gap"),
        ((MappingItem(0, 1, 3), MappingItem(1, 3, 5)), 5, "overlap"),
        ((MappingItem(0, 1, 2), MappingItem(1, 1, 2)), 2, "duplicate range"),
        ((MappingItem(0, 1, 2), MappingItem(1, 3, 4)), 5, "short"),
        ((MappingItem(0, 1, 6),), 5, "long"),
        ((MappingItem(1, 1, 5),), 5, "item index"),
        ((MappingItem(0, 1, 2), MappingItem(2, 3, 5)), 5, "item index gap"),
        ((MappingItem(0, 2, 5),), 5, "does not start at 1"),
        ((MappingItem(0, 3, 2),), 2, "reversed"),
        ((), 1, "empty"),
    ],
)
def test_verify_coverage_rejects(items: tuple[MappingItem, ...], total: int, why: str) -> None:
    with pytest.raises(MappingPlanError) as caught:
        verify_coverage(items, total)
    assert caught.value.code == errors.MAPPING_ITEM_INVALID, why


# --- items -----------------------------------------------------------------------------------


def test_item_payload_and_env_value() -> None:
    plan = summary_plan(365, 40)
    item = plan.items[1]
    payload = plan.item_payload(item)
    assert payload == {
        "schema": ITEM_SCHEMA,
        "mode": "summary",
        "mapping_plan_fingerprint": plan.plan_fingerprint,
        "backfill_plan_hash": FAKE_HASH,
        "item_index": 1,
        "first_chunk_index": 11,
        "last_chunk_index": 20,
        "chunks_count": 10,
    }
    env = plan.item_env_value(item)
    assert env == json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --- properties ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(chunks=st.integers(1, 100_000), max_items=st.integers(1, 200))
def test_summary_properties(chunks: int, max_items: int) -> None:
    plan = summary_plan(chunks, max_items)
    items_total = min(chunks, max_items)
    assert plan.items_total == items_total == len(plan.to_artifact()["items"])
    # coverage: every chunk exactly once, in order (checked arithmetically: chunks may be 100k)
    assert plan.items[0].first_chunk_index == 1 and plan.items[-1].last_chunk_index == chunks
    for position, item in enumerate(plan.items):
        assert item.item_index == position
        if position:
            assert item.first_chunk_index == plan.items[position - 1].last_chunk_index + 1
    assert sum(sizes(plan)) == chunks
    # balance: divmod, the first r items get q + 1
    q, r = divmod(chunks, items_total)
    assert sizes(plan) == [q + 1] * r + [q] * (items_total - r)
    assert max(sizes(plan)) - min(sizes(plan)) <= 1
    # determinism
    assert summary_plan(chunks, max_items) == plan


@settings(max_examples=150, deadline=None)
@given(chunks=st.integers(1, 400), max_items=st.integers(1, 200))
def test_visible_properties(chunks: int, max_items: int) -> None:
    if chunks > max_items:
        with pytest.raises(MappingPlanError) as caught:
            summary_plan(chunks, max_items, mode="visible")
        assert caught.value.code == errors.MAPPING_TASK_LIMIT_EXCEEDED
        return
    plan = summary_plan(chunks, max_items, mode="visible")
    assert covered(plan) == list(range(1, chunks + 1))
    assert sizes(plan) == [1] * chunks


@settings(max_examples=150, deadline=None)
@given(
    chunks=st.integers(1, 3000),
    max_items=st.integers(1, 200),
    max_active=st.integers(1, 64),
    pool=st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,20}", fullmatch=True),
    field=st.sampled_from(["max_items", "max_active", "pool", "chunks", "hash", "mode"]),
)
def test_one_field_change_always_changes_the_fingerprint(
    chunks: int, max_items: int, max_active: int, pool: str, field: str
) -> None:
    policy = MappingPolicy("summary", max_items, min(max_active, max_items), pool)
    base = plan_mapping(policy, chunks, FAKE_HASH)
    assert base is not None
    if field == "max_items":
        new_items = max_items % 200 + 1
        changed = plan_mapping(
            dataclasses.replace(
                policy, max_items=new_items, max_active=min(policy.max_active, new_items)
            ),
            chunks,
            FAKE_HASH,
        )
    elif field == "max_active":
        new_active = policy.max_active % min(64, max_items) + 1
        if new_active == policy.max_active:  # max_items == 1: max_active cannot move
            return
        changed = plan_mapping(
            dataclasses.replace(policy, max_active=new_active), chunks, FAKE_HASH
        )
    elif field == "pool":
        changed = plan_mapping(dataclasses.replace(policy, pool=pool + "x"), chunks, FAKE_HASH)
    elif field == "chunks":
        changed = plan_mapping(policy, chunks + 1, FAKE_HASH)
    elif field == "hash":
        changed = plan_mapping(policy, chunks, OTHER_HASH)
    else:
        if chunks > max_items:
            return
        changed = plan_mapping(dataclasses.replace(policy, mode="visible"), chunks, FAKE_HASH)
    assert changed is not None
    assert changed.plan_fingerprint != base.plan_fingerprint


@settings(max_examples=100, deadline=None)
@given(chunks=st.integers(1, 100_000), max_items=st.integers(1, 200), data=st.data())
def test_item_env_value_is_bounded_and_parses_back(
    chunks: int, max_items: int, data: st.DataObject
) -> None:
    plan = summary_plan(chunks, max_items)
    item = data.draw(st.sampled_from(plan.items))
    env = plan.item_env_value(item)
    assert len(env.encode("utf-8")) <= ITEM_MAX_BYTES
    assert canonical_text(json.loads(env)) == env
    parsed = parse_mapping_item(env)
    assert parsed.mode == plan.mode
    assert parsed.mapping_plan_fingerprint == plan.plan_fingerprint
    assert parsed.backfill_plan_hash == plan.backfill_plan_hash
    assert (parsed.item_index, parsed.first_chunk_index, parsed.last_chunk_index) == (
        item.item_index,
        item.first_chunk_index,
        item.last_chunk_index,
    )
    assert parsed.chunks_count == item.chunks_count
    assert parsed.to_mapping_section()["plan_fingerprint"] == plan.plan_fingerprint


def test_airflows_default_pool_is_refused_for_a_mapped_task() -> None:
    """The pools file sets a mapped task's pool to max_active slots: Airflow's default_pool,
    shared by every task of the deployment, would be shrunk with it."""
    from dpone.plan.mapping import normalize_policy

    for mode in ("visible", "summary"):
        policy, problems = normalize_policy({"mode": mode, "pool": "default_pool"})
        assert policy is None
        assert [(p.field, p.code) for p in problems] == [("pool", errors.MAPPING_POOL_REQUIRED)]
        assert "default_pool" in problems[0].message
    policy, problems = normalize_policy({"mode": "internal", "pool": "default_pool"})
    assert problems == [] and policy is not None  # an internal task uses no pool of dpone's
