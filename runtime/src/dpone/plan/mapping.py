"""Mapping policy normalisation and the bounded mapping planner (internal / visible / summary).

The plan is a static projection of the chunk plan onto at most ``max_items`` Airflow task
instances; it decides nothing about commit state, which belongs to the ledger.
"""

from __future__ import annotations

import re
from typing import Any

from dpone.plan.canonical import FieldRecord, canonical_text, field_values, fingerprint, json_scalar
from dpone.records import record

PLAN_SCHEMA = "dpone.airflow-mapping-plan.v1"
ITEM_SCHEMA = "dpone.airflow-mapping-item.v1"
MODES = ("internal", "visible", "summary")
MAPPED_MODES = ("visible", "summary")
HARD_MAX_ITEMS = 200
HARD_MAX_ACTIVE = 64
DEFAULT_MAX_ITEMS = 200
DEFAULT_MAX_ACTIVE = 16
DEFAULT_POOL = "dpone_backfill"
#: Airflow's own pool of every task: a backfill sizing it would throttle the whole deployment
AIRFLOW_DEFAULT_POOL = "default_pool"
ITEM_MAX_BYTES = 8 * 1024
POOL_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,249}$")
POLICY_FIELDS = ("mode", "max_items", "max_active", "pool")
_ITEM_SCHEMA_JSON = '"' + ITEM_SCHEMA + '"'  # plain ASCII: its JSON string is itself in quotes


@record
class PolicyProblem:
    """One rule the raw policy breaks: which field, which code, what to say."""

    field: str | None
    code: str
    message: str


@record
class MappingPolicy(FieldRecord):
    mode: str = "internal"
    max_items: int = DEFAULT_MAX_ITEMS
    max_active: int = DEFAULT_MAX_ACTIVE
    pool: str = DEFAULT_POOL

    @property
    def mapped(self) -> bool:
        return self.mode in MAPPED_MODES


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count_ok(name: str, value: object, limit: int, problems: list[PolicyProblem]) -> bool:
    """True for an integer 1..limit; otherwise the problem is added to ``problems``."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= limit:
        return True
    from dpone import errors

    message = f"{name} must be an integer 1..{limit}, got {value!r}"
    problems.append(PolicyProblem(name, errors.MAPPING_POLICY_INVALID, message))
    return False


def normalize_policy(raw: object) -> tuple[MappingPolicy | None, list[PolicyProblem]]:
    """Apply the contract's validation table; returns the policy or every problem found."""
    from dpone import errors
    from dpone.suggest import did_you_mean

    invalid = errors.MAPPING_POLICY_INVALID
    if raw is None:
        return MappingPolicy(), []
    if not isinstance(raw, dict):
        return None, [PolicyProblem(None, invalid, f"mapping must be a mapping, got {raw!r}")]
    problems: list[PolicyProblem] = []
    for key in raw:
        if key not in POLICY_FIELDS:
            hint = did_you_mean(key, POLICY_FIELDS)
            problems.append(PolicyProblem(key, invalid, f"unknown mapping field {key!r}{hint}"))
    mode = raw.get("mode", "internal")
    if mode not in MODES:
        problems.append(
            PolicyProblem("mode", invalid, f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        )
    max_items = raw.get("max_items", DEFAULT_MAX_ITEMS)
    items_ok = _count_ok("max_items", max_items, HARD_MAX_ITEMS, problems)
    max_active = raw.get("max_active", DEFAULT_MAX_ACTIVE)
    active_ok = _count_ok("max_active", max_active, HARD_MAX_ACTIVE, problems)
    if items_ok and active_ok and max_active > max_items:
        problems.append(
            PolicyProblem(
                "max_active",
                invalid,
                f"max_active {max_active} must not exceed max_items {max_items}",
            )
        )
    pool = raw.get("pool", DEFAULT_POOL)
    # fullmatch: with match(), ``$`` also accepts a trailing newline ("dpone_backfill\n").
    pool_ok = isinstance(pool, str) and bool(POOL_PATTERN.fullmatch(pool))
    if not pool_ok:
        code = errors.MAPPING_POOL_REQUIRED if mode in MAPPED_MODES else invalid
        problems.append(
            PolicyProblem(
                "pool",
                code,
                f"pool must be a non-empty Airflow identifier (letters, digits, _ . -), "
                f"got {pool!r}",
            )
        )
    elif pool == AIRFLOW_DEFAULT_POOL and mode in MAPPED_MODES:
        problems.append(
            PolicyProblem(
                "pool",
                errors.MAPPING_POOL_REQUIRED,
                f"pool {pool!r} is Airflow's pool of every task: the pools file would set its "
                "slots to this workload's max_active; name a pool of the backfill's own",
            )
        )
    if problems:
        return None, problems
    assert isinstance(mode, str) and isinstance(pool, str)
    assert _is_int(max_items) and _is_int(max_active)
    return MappingPolicy(mode, max_items, max_active, pool), []


@record
class MappingItem:
    """One mapped task's execution scope: a contiguous, one-based chunk range."""

    item_index: int
    first_chunk_index: int
    last_chunk_index: int

    @property
    def chunks_count(self) -> int:
        return self.last_chunk_index - self.first_chunk_index + 1

    def canonical(self) -> dict[str, int]:
        # MappingItem's own fields: a subclass (the task's parsed item) adds its own beside them
        return {**field_values(self, MappingItem), "chunks_count": self.chunks_count}


@record
class MappingPlan:
    """``dpone.airflow-mapping-plan.v1``: the static, fingerprinted item list of one process."""

    mode: str
    backfill_plan_hash: str
    chunks_total: int
    policy: MappingPolicy
    items: tuple[MappingItem, ...]
    plan_fingerprint: str

    @property
    def items_total(self) -> int:
        return len(self.items)

    def to_artifact(self) -> dict[str, Any]:
        body = _plan_body(
            self.mode, self.backfill_plan_hash, self.chunks_total, self.policy, self.items
        )
        body["plan_fingerprint"] = self.plan_fingerprint
        return body

    def item_payload(self, item: MappingItem) -> dict[str, Any]:
        """The ``dpone.airflow-mapping-item.v1`` document for one item."""
        return {
            "schema": ITEM_SCHEMA,
            "mode": self.mode,
            "mapping_plan_fingerprint": self.plan_fingerprint,
            "backfill_plan_hash": self.backfill_plan_hash,
            **item.canonical(),
        }

    def item_env_value(self, item: MappingItem) -> str:
        """Canonical JSON of the item, as written into DPONE_AIRFLOW_MAPPING_ITEM (<= 8 KiB)."""
        text = self._item_text(item)
        if len(text.encode("utf-8")) > ITEM_MAX_BYTES:
            raise ValueError(f"mapping item exceeds {ITEM_MAX_BYTES} bytes")
        return text

    def _item_text(self, item: MappingItem) -> str:
        """canonical_text(self.item_payload(item)), written directly (keys in sorted order)."""
        plan_hash, plan_fp = json_scalar(self.backfill_plan_hash), json_scalar(
            self.plan_fingerprint
        )
        mode = json_scalar(self.mode)
        numbers = (item.item_index, item.first_chunk_index, item.last_chunk_index)
        if plan_hash is None or plan_fp is None or mode is None:
            return canonical_text(self.item_payload(item))
        if any(type(number) is not int for number in numbers):
            return canonical_text(self.item_payload(item))
        return (
            f'{{"backfill_plan_hash":{plan_hash},"chunks_count":{item.chunks_count},'
            f'"first_chunk_index":{item.first_chunk_index},"item_index":{item.item_index},'
            f'"last_chunk_index":{item.last_chunk_index},"mapping_plan_fingerprint":{plan_fp},'
            f'"mode":{mode},"schema":{_ITEM_SCHEMA_JSON}}}'
        )


def _plan_body(
    mode: str,
    backfill_plan_hash: str,
    chunks_total: int,
    policy: MappingPolicy,
    items: tuple[MappingItem, ...],
) -> dict[str, Any]:
    return {
        "schema": PLAN_SCHEMA,
        "mode": mode,
        "backfill_plan_hash": backfill_plan_hash,
        "chunks_total": chunks_total,
        "items_total": len(items),
        "limits": {
            "max_items": policy.max_items,
            "max_active": policy.max_active,
            "pool": policy.pool,
        },
        "items": [item.canonical() for item in items],
    }


class MappingPlanError(ValueError):
    """visible over more chunks than max_items, or a broken coverage invariant."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def balanced_ranges(chunks_total: int, items_total: int) -> list[tuple[int, int]]:
    """divmod split: the first r items get q + 1 chunks, the rest q; one-based, contiguous."""
    if chunks_total < 1 or not 1 <= items_total <= chunks_total:
        raise ValueError(f"cannot split {chunks_total} chunks into {items_total} items")
    q, r = divmod(chunks_total, items_total)
    ranges: list[tuple[int, int]] = []
    first = 1
    for index in range(items_total):
        size = q + 1 if index < r else q
        ranges.append((first, first + size - 1))
        first += size
    return ranges


def verify_coverage(items: tuple[MappingItem, ...], chunks_total: int) -> None:
    """Every chunk index 1..chunks_total exactly once, in order, item indexes 0..n-1."""
    from dpone import errors

    expected_first = 1
    for position, item in enumerate(items):
        if item.item_index != position:
            raise MappingPlanError(
                errors.MAPPING_ITEM_INVALID,
                f"item index {item.item_index} at position {position}",
            )
        if (
            item.first_chunk_index != expected_first
            or item.last_chunk_index < item.first_chunk_index
        ):
            raise MappingPlanError(
                errors.MAPPING_ITEM_INVALID,
                f"item {position} covers {item.first_chunk_index}..{item.last_chunk_index}, "
                f"expected to start at {expected_first} (gap, overlap or duplicate range)",
            )
        expected_first = item.last_chunk_index + 1
    if expected_first != chunks_total + 1:
        raise MappingPlanError(
            errors.MAPPING_ITEM_INVALID,
            f"items cover chunks 1..{expected_first - 1}, expected 1..{chunks_total}",
        )


def plan_mapping(
    policy: MappingPolicy, chunks_total: int, backfill_plan_hash: str
) -> MappingPlan | None:
    """The mapping plan for a mapped policy (None for internal), or MappingPlanError."""
    from dpone import errors

    if not policy.mapped:
        return None
    if policy.mode == "visible":
        if chunks_total > policy.max_items:
            raise MappingPlanError(
                errors.MAPPING_TASK_LIMIT_EXCEEDED,
                f"visible mode needs one task per chunk: {chunks_total} chunks exceed "
                f"max_items {policy.max_items}",
            )
        ranges = [(i, i) for i in range(1, chunks_total + 1)]
    else:
        ranges = balanced_ranges(chunks_total, min(chunks_total, policy.max_items))
    items = tuple(MappingItem(i, lo, hi) for i, (lo, hi) in enumerate(ranges))
    verify_coverage(items, chunks_total)
    body = _plan_body(policy.mode, backfill_plan_hash, chunks_total, policy, items)
    return MappingPlan(
        mode=policy.mode,
        backfill_plan_hash=backfill_plan_hash,
        chunks_total=chunks_total,
        policy=policy,
        items=items,
        plan_fingerprint=fingerprint(body),
    )
