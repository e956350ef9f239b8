"""verify: the pod's re-derived plan must match the item and the pack the DAG was made from."""

from __future__ import annotations

import dataclasses

import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.packing.pack import ProcessPlan, WorkloadPack
from dpone.packing.verify import select_chunks, verify_identity
from dpone.task.identity import RunIdentity, parse_run_identity
from dpone.task.item import ParsedItem, parse_mapping_item

from .support import GOLDEN, golden_packs

OTHER_FP = "sha256:" + "ee" * 32


@pytest.fixture(scope="module")
def summary_pack() -> WorkloadPack:
    [pack] = golden_packs(GOLDEN / "summary_365_into_40" / "workloads.yaml")
    return pack


@pytest.fixture(scope="module")
def summary(summary_pack: WorkloadPack) -> ProcessPlan:
    return summary_pack.processes[0]


@pytest.fixture(scope="module")
def internal() -> ProcessPlan:
    [pack] = golden_packs(GOLDEN / "internal_default" / "workloads.yaml")
    return pack.processes[0]


def item_of(plan: ProcessPlan, index: int) -> ParsedItem:
    mapping = plan.mapping_plan
    assert mapping is not None
    return parse_mapping_item(mapping.item_env_value(mapping.items[index]))


def mismatch(plan: ProcessPlan, item: ParsedItem) -> DponeError:
    with pytest.raises(DponeError) as caught:
        select_chunks(plan, item)
    assert caught.value.code == errors.MAPPING_PLAN_MISMATCH
    return caught.value


def test_internal_run_selects_every_chunk(summary: ProcessPlan) -> None:
    selection = select_chunks(summary, None)
    assert selection.chunks == summary.chunks and len(selection.chunks) == 365
    assert selection.mode == "internal" and selection.item is None


@pytest.mark.parametrize("index", [0, 1, 4, 5, 39])
def test_item_selects_exactly_its_planned_range(summary: ProcessPlan, index: int) -> None:
    item = item_of(summary, index)
    selection = select_chunks(summary, item)
    assert selection.mode == "summary"
    assert selection.mapping_item is not None
    assert [c.index for c in selection.chunks] == list(
        range(item.first_chunk_index, item.last_chunk_index + 1)
    )
    assert selection.chunks == summary.chunks[item.first_chunk_index - 1 : item.last_chunk_index]


def test_every_item_together_selects_every_chunk_once(summary: ProcessPlan) -> None:
    assert summary.mapping_plan is not None
    selected = [
        c.index
        for i in range(summary.mapping_plan.items_total)
        for c in select_chunks(summary, item_of(summary, i)).chunks
    ]
    assert selected == list(range(1, 366))


def test_mode_mismatch(summary: ProcessPlan) -> None:
    exc = mismatch(summary, dataclasses.replace(item_of(summary, 0), mode="visible"))
    assert "mode" in exc.message and "visible" in exc.message and "summary" in exc.message


def test_backfill_plan_hash_mismatch(summary: ProcessPlan) -> None:
    exc = mismatch(summary, dataclasses.replace(item_of(summary, 0), backfill_plan_hash=OTHER_FP))
    assert OTHER_FP in exc.message and str(summary.backfill_plan_hash) in exc.message


def test_mapping_plan_fingerprint_mismatch(summary: ProcessPlan) -> None:
    item = dataclasses.replace(item_of(summary, 0), mapping_plan_fingerprint=OTHER_FP)
    exc = mismatch(summary, item)
    assert summary.mapping_plan is not None
    assert OTHER_FP in exc.message and summary.mapping_plan.plan_fingerprint in exc.message


@pytest.mark.parametrize(
    ("index", "first", "last"), [(40, 356, 365), (41, 356, 365), (199, 356, 365), (39, 356, 366)]
)
def test_an_item_outside_its_plan_is_invalid(
    summary: ProcessPlan, index: int, first: int, last: int
) -> None:
    # the spec: DPONE_AIRFLOW_MAPPING_ITEM_INVALID, "item JSON or range is invalid" (the plan it
    # names is the same; it cannot hold this item)
    item = dataclasses.replace(
        item_of(summary, 39), item_index=index, first_chunk_index=first, last_chunk_index=last
    )
    with pytest.raises(DponeError) as caught:
        select_chunks(summary, item)
    assert caught.value.code == errors.MAPPING_ITEM_INVALID
    assert "items 0-39 over chunks 1-365" in caught.value.message


@pytest.mark.parametrize(("first", "last"), [(2, 10), (1, 11), (11, 20), (1, 1), (1, 365)], ids=str)
def test_item_range_mismatch(summary: ProcessPlan, first: int, last: int) -> None:
    item = dataclasses.replace(item_of(summary, 0), first_chunk_index=first, last_chunk_index=last)
    exc = mismatch(summary, item)
    assert f"{first}..{last}" in exc.message and "1..10" in exc.message


def test_internal_plan_refuses_a_mapping_item(summary: ProcessPlan, internal: ProcessPlan) -> None:
    exc = mismatch(internal, item_of(summary, 0))
    assert "internal" in exc.message


def identity(pack: WorkloadPack, **changes: str) -> RunIdentity:
    base = RunIdentity(
        dag_id=pack.workload.airflow.dag_id,
        workload=pack.workload.name,
        process=pack.processes[0].name,
        pack_fingerprint=pack.fingerprint,
        flavour=pack.workload.airflow.flavour,
        image=pack.workload.airflow.image,
    )
    return dataclasses.replace(base, **changes)


def test_matching_or_absent_identity_passes(summary_pack: WorkloadPack) -> None:
    verify_identity(summary_pack, "orders", None)
    verify_identity(summary_pack, "orders", identity(summary_pack))
    round_trip = parse_run_identity(identity(summary_pack).env_value())
    verify_identity(summary_pack, "orders", round_trip)


def test_pack_mismatch_names_both_fingerprints(summary_pack: WorkloadPack) -> None:
    with pytest.raises(DponeError) as caught:
        verify_identity(summary_pack, "orders", identity(summary_pack, pack_fingerprint=OTHER_FP))
    assert caught.value.code == errors.PACK_MISMATCH
    assert OTHER_FP in caught.value.message
    assert summary_pack.fingerprint in caught.value.message


@pytest.mark.parametrize(("field", "value"), [("workload", "other"), ("process", "other")])
def test_identity_for_another_workload_or_process(
    summary_pack: WorkloadPack, field: str, value: str
) -> None:
    with pytest.raises(DponeError) as caught:
        verify_identity(summary_pack, "orders", identity(summary_pack, **{field: value}))
    assert caught.value.code == errors.MAPPING_PLAN_MISMATCH
