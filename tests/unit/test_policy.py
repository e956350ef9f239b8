"""normalize_policy: the contract's validation table, every boundary and its stable error code."""

from __future__ import annotations

from typing import Any

import pytest
from dpone import errors
from dpone.plan.mapping import (
    DEFAULT_MAX_ACTIVE,
    DEFAULT_MAX_ITEMS,
    DEFAULT_POOL,
    MappingPolicy,
    PolicyProblem,
    normalize_policy,
)

INVALID = errors.MAPPING_POLICY_INVALID
POOL_REQUIRED = errors.MAPPING_POOL_REQUIRED


def problems_of(raw: object) -> list[PolicyProblem]:
    policy, problems = normalize_policy(raw)
    assert (policy is None) == bool(problems)
    return problems


def codes_by_field(raw: object) -> dict[str | None, str]:
    return {p.field: p.code for p in problems_of(raw)}


def test_defaults_when_absent_or_empty() -> None:
    expected = MappingPolicy("internal", 200, 16, "dpone_backfill")
    assert (DEFAULT_MAX_ITEMS, DEFAULT_MAX_ACTIVE, DEFAULT_POOL) == (200, 16, "dpone_backfill")
    assert normalize_policy(None) == (expected, [])
    assert normalize_policy({}) == (expected, [])
    assert not expected.mapped
    assert expected.canonical() == {
        "mode": "internal",
        "max_items": 200,
        "max_active": 16,
        "pool": "dpone_backfill",
    }


@pytest.mark.parametrize("mode", ["internal", "visible", "summary"])
def test_each_mode_is_accepted(mode: str) -> None:
    policy, problems = normalize_policy({"mode": mode})
    assert problems == [] and policy is not None
    assert policy.mode == mode and policy.mapped == (mode != "internal")


@pytest.mark.parametrize(
    ("max_items", "ok"), [(0, False), (1, True), (200, True), (201, False), (-1, False)]
)
def test_max_items_boundaries(max_items: int, ok: bool) -> None:
    raw = {"mode": "summary", "max_items": max_items, "max_active": 1}
    assert (problems_of(raw) == []) is ok
    if not ok:
        assert codes_by_field(raw) == {"max_items": INVALID}


@pytest.mark.parametrize(
    ("max_active", "ok"), [(0, False), (1, True), (64, True), (65, False), (-3, False)]
)
def test_max_active_boundaries(max_active: int, ok: bool) -> None:
    raw = {"mode": "visible", "max_items": 200, "max_active": max_active}
    assert (problems_of(raw) == []) is ok
    if not ok:
        assert codes_by_field(raw) == {"max_active": INVALID}


@pytest.mark.parametrize(("max_items", "max_active"), [(10, 11), (1, 2), (63, 64)])
def test_max_active_above_max_items_is_invalid(max_items: int, max_active: int) -> None:
    problems = problems_of({"mode": "summary", "max_items": max_items, "max_active": max_active})
    assert [(p.field, p.code) for p in problems] == [("max_active", INVALID)]
    assert f"max_active {max_active} must not exceed max_items {max_items}" in problems[0].message


def test_max_active_equal_to_max_items_is_fine() -> None:
    assert problems_of({"mode": "summary", "max_items": 7, "max_active": 7}) == []


def test_default_max_active_above_a_small_max_items_is_invalid() -> None:
    # max_active defaults to 16: a policy with max_items 5 must set max_active too.
    assert codes_by_field({"mode": "summary", "max_items": 5}) == {"max_active": INVALID}


@pytest.mark.parametrize("mode", ["visible", "summary"])
@pytest.mark.parametrize(
    "pool",
    ["", " ", "has space", "bad/pool", "-starts-with-dash", "dpone_backfill\n", "x" * 251, None, 5],
    ids=["empty", "blank", "space", "slash", "dash", "newline", "too-long", "null", "int"],
)
def test_bad_pool_is_pool_required_for_mapped_modes(mode: str, pool: object) -> None:
    assert codes_by_field({"mode": mode, "pool": pool}) == {"pool": POOL_REQUIRED}


def test_bad_pool_is_policy_invalid_for_internal() -> None:
    assert codes_by_field({"mode": "internal", "pool": ""}) == {"pool": INVALID}
    assert codes_by_field({"pool": "bad pool"}) == {"pool": INVALID}


@pytest.mark.parametrize("pool", ["p", "dpone_backfill", "a.b-c_d", "0pool", "x" * 250])
def test_good_pools(pool: str) -> None:
    assert problems_of({"mode": "visible", "pool": pool, "max_items": 200}) == []


@pytest.mark.parametrize(
    "value",
    [True, False, 5.0, 5.5, "5", None, [5], {"n": 5}],
    ids=["true", "false", "float-integral", "float", "string", "null", "list", "dict"],
)
@pytest.mark.parametrize("field", ["max_items", "max_active"])
def test_limits_must_be_real_integers(field: str, value: Any) -> None:
    raw: dict[str, Any] = {"mode": "summary", "max_items": 20, "max_active": 4}
    raw[field] = value
    assert codes_by_field(raw) == {field: INVALID}


@pytest.mark.parametrize("mode", ["Visible", "mapped", "", None, True, 1, ["visible"]])
def test_invalid_mode(mode: object) -> None:
    assert codes_by_field({"mode": mode}) == {"mode": INVALID}


@pytest.mark.parametrize("field", ["workers", "max_item", "Mode", "pools"])
def test_unknown_policy_field(field: str) -> None:
    problems = problems_of({"mode": "internal", field: 1})
    assert [(p.field, p.code) for p in problems] == [(field, INVALID)]
    assert repr(field) in problems[0].message


@pytest.mark.parametrize("raw", [[], "summary", 3, True], ids=["list", "str", "int", "bool"])
def test_policy_must_be_a_mapping(raw: object) -> None:
    assert [(p.field, p.code) for p in problems_of(raw)] == [(None, INVALID)]


def test_every_problem_is_reported_at_once() -> None:
    problems = problems_of(
        {"mode": "sometimes", "max_items": 0, "max_active": 65, "pool": "", "colour": "red"}
    )
    assert sorted(str(p.field) for p in problems) == [
        "colour",
        "max_active",
        "max_items",
        "mode",
        "pool",
    ]
    assert all(p.code in errors.REGISTRY for p in problems)


def test_messages_quote_the_offending_value() -> None:
    [problem] = problems_of({"max_items": 999, "max_active": 1})
    assert "999" in problem.message and "1..200" in problem.message
