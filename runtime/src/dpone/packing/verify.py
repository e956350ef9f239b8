"""Verification before any I/O: the pod's recompiled pack must be the one the DAG was made from.

Everything the env says is checked against the re-derived plan; the chunk tuple (and so every SQL
predicate) comes only from the recompiled plan, never from the environment.
"""

from __future__ import annotations

from dpone import errors
from dpone.errors import DponeError
from dpone.packing.pack import ProcessPlan, WorkloadPack
from dpone.packing.task_env import run_identity
from dpone.plan.chunks import Chunk
from dpone.plan.mapping import MappingItem
from dpone.records import record
from dpone.task.identity import RunIdentity
from dpone.task.item import ParsedItem


@record
class Selection:
    """What this run executes: the chunk tuple, and the mapped item when there is one."""

    chunks: tuple[Chunk, ...]
    item: ParsedItem | None
    mapping_item: MappingItem | None

    @property
    def mode(self) -> str:
        return self.item.mode if self.item else "internal"


def expected_identity(pack: WorkloadPack, process: str) -> RunIdentity:
    """The run identity the generated DAG passes to this workload's process task."""
    plan = pack.process(process)
    if plan is None:
        raise DponeError(
            errors.USAGE, f"process {process!r} is not in workload {pack.workload.name!r}"
        )
    return run_identity(pack, plan)


def verify_identity(pack: WorkloadPack, process: str, identity: RunIdentity | None) -> None:
    """An internal run may come without an identity (a local run); a mapped item may not (the
    caller refuses that before this)."""
    if identity is None:
        return
    if identity.workload != pack.workload.name or identity.process != process:
        raise DponeError(
            errors.MAPPING_PLAN_MISMATCH,
            f"run identity names workload {identity.workload!r} process {identity.process!r}, "
            f"but this run is workload {pack.workload.name!r} process {process!r}",
        )
    airflow = pack.workload.airflow
    if identity.dag_id != airflow.dag_id or identity.flavour != airflow.flavour:
        raise DponeError(
            errors.MAPPING_PLAN_MISMATCH,
            f"run identity names dag {identity.dag_id!r} flavour {identity.flavour!r}, but the "
            f"catalog in this image has dag {airflow.dag_id!r} flavour {airflow.flavour!r}",
        )
    if identity.pack_fingerprint != pack.fingerprint:
        raise DponeError(
            errors.PACK_MISMATCH,
            f"the DAG was generated from pack {identity.pack_fingerprint} but the catalog in "
            f"this image compiles to {pack.fingerprint}: the image and the DAG come from "
            f"different commits",
        )


def _mismatch(what: str, env_value: object, planned: object) -> DponeError:
    return DponeError(
        errors.MAPPING_PLAN_MISMATCH,
        f"{what}: the mapping item says {env_value} but the re-computed plan has {planned}",
    )


def select_chunks(plan: ProcessPlan, item: ParsedItem | None) -> Selection:
    """The chunks to run: the whole campaign (internal) or exactly the item's planned range."""
    if item is None:
        return Selection(plan.chunks, None, None)
    mapping = plan.mapping_plan
    if mapping is None:
        raise DponeError(
            errors.MAPPING_PLAN_MISMATCH,
            f"process {plan.name!r} compiles to mode internal here, but the task carries a "
            f"{item.mode} mapping item",
        )
    if item.mode != mapping.mode:
        raise _mismatch("mode", item.mode, mapping.mode)
    if item.backfill_plan_hash != plan.backfill_plan_hash:
        raise _mismatch("backfill_plan_hash", item.backfill_plan_hash, plan.backfill_plan_hash)
    if item.mapping_plan_fingerprint != mapping.plan_fingerprint:
        raise _mismatch(
            "mapping_plan_fingerprint", item.mapping_plan_fingerprint, mapping.plan_fingerprint
        )
    if item.item_index >= mapping.items_total or item.last_chunk_index > plan.chunks_total:
        # an item the plan it names cannot hold: the item is invalid, the plan is the same
        raise DponeError(
            errors.MAPPING_ITEM_INVALID,
            f"mapping item {item.item_index} (chunks {item.first_chunk_index}.."
            f"{item.last_chunk_index}) is outside its plan: items 0-{mapping.items_total - 1} "
            f"over chunks 1-{plan.chunks_total}",
        )
    planned = mapping.items[item.item_index]
    if (item.first_chunk_index, item.last_chunk_index) != (
        planned.first_chunk_index,
        planned.last_chunk_index,
    ):
        raise _mismatch(
            f"item {item.item_index} range",
            f"{item.first_chunk_index}..{item.last_chunk_index}",
            f"{planned.first_chunk_index}..{planned.last_chunk_index}",
        )
    return Selection(
        plan.chunk_range(planned.first_chunk_index, planned.last_chunk_index), item, planned
    )
