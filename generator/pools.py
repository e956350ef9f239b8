"""The Airflow pools the generated DAGs name, as the JSON file `airflow pools import` reads.

Format (Airflow 2.10-3.3 ``pool_import_helper``): ``{"<pool>": {"slots": n, "description": "...",
"include_deferred": true}}``; a pool without ``slots`` or ``description`` is rejected by Airflow.
``include_deferred`` is true because a deferred KubernetesPodOperator still has its pod running:
without it a deferrable task would free its slot and the pool would stop bounding live pods.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from dpone.packing.pack import WorkloadPack


@dataclass(frozen=True)
class PoolUser:
    workload: str
    max_active: int


@dataclass(frozen=True)
class PoolSpec:
    """One pool: its slots are the largest max_active of the workloads that use it."""

    name: str
    users: tuple[PoolUser, ...]

    @property
    def slots(self) -> int:
        return max(user.max_active for user in self.users)

    @property
    def description(self) -> str:
        if len(self.users) == 1:
            user = self.users[0]
            return (
                f"dpone: mapped backfill tasks of workload {user.workload} "
                f"(max_active {user.max_active})"
            )
        shown = ", ".join(f"{u.workload} (max_active {u.max_active})" for u in self.users)
        return (
            f"dpone: shared by workloads {shown}; slots = the largest max_active, so together "
            f"they never run more than {self.slots} mapped tasks at once"
        )


def plan_pools(packs: list[WorkloadPack]) -> tuple[PoolSpec, ...]:
    """Every pool a mapped task names, sorted by pool name; users sorted by workload name."""
    users: dict[str, dict[str, int]] = {}
    for pack in packs:
        for process in pack.processes:
            mapping = process.mapping_plan
            if mapping is None:
                continue
            pool = users.setdefault(mapping.policy.pool, {})
            name = pack.workload.name
            pool[name] = max(pool.get(name, 0), mapping.policy.max_active)
    return tuple(
        PoolSpec(name, tuple(PoolUser(w, users[name][w]) for w in sorted(users[name])))
        for name in sorted(users)
    )


def pools_document(pools: tuple[PoolSpec, ...]) -> str:
    """The pools file's text: stable key order, two-space indent, trailing newline."""
    doc = {
        pool.name: {
            "slots": pool.slots,
            "description": pool.description,
            "include_deferred": True,
        }
        for pool in pools
    }
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def is_pools_document(text: str) -> bool:
    """Whether ``text`` is a pools file this module wrote (so emit may replace it): our shape, and
    every description starts with ``dpone:``."""
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    if not isinstance(doc, dict):
        return False
    allowed = {"slots", "description", "include_deferred"}
    return all(
        isinstance(value, dict)
        and {"slots", "description"} <= set(value) <= allowed
        and str(value["description"]).startswith("dpone:")
        for value in doc.values()
    )
