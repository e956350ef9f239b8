"""Compile a workload into its pack: every process's chunk plan and mapping plan.

The pack is the canonical description of what data moves; its fingerprint is what the DAG file
(through the run identity) and the pod compare. Deployment details (image, resources, hooks,
schedule) are deliberately outside it: a catalog inside an image cannot know its own tag.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dpone import errors
from dpone.authoring.models import Catalog, ProcessConfig, Workload
from dpone.errors import DponeError, ErrorCollector, ErrorRecord
from dpone.plan.canonical import fingerprint
from dpone.plan.chunks import Bound, Chunk, ChunkPlanError, backfill_run_key, plan_chunks_hashed
from dpone.plan.mapping import MappingPlan, MappingPlanError, MappingPolicy, plan_mapping
from dpone.records import record
from dpone.suggest import not_in

PACK_SCHEMA = "dpone.workload-pack.v1"


@record
class ProcessPlan:
    """One process, compiled: its configuration, campaign key, chunks and mapping plan."""

    config: ProcessConfig
    run_key: str | None
    chunks: tuple[Chunk, ...]
    backfill_plan_hash: str | None
    config_hash: str
    mapping_policy: MappingPolicy
    mapping_plan: MappingPlan | None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def chunks_total(self) -> int:
        return len(self.chunks)

    def chunk_range(self, first: int, last: int) -> tuple[Chunk, ...]:
        return self.chunks[first - 1 : last]

    def canonical(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "name": cfg.name,
            "source": cfg.source.canonical(),
            "sink": cfg.sink.canonical(),
            "backfill": cfg.backfill.canonical() if cfg.backfill else None,
            "state": cfg.state.canonical(),
            "run_key": self.run_key,
            "chunks_total": self.chunks_total,
            "backfill_plan_hash": self.backfill_plan_hash,
            "config_hash": self.config_hash,
            "mapping": (
                self.mapping_plan.to_artifact()
                if self.mapping_plan
                else {"mode": "internal", "limits": self.mapping_policy.canonical()}
            ),
        }


@record
class WorkloadPack:
    workload: Workload
    processes: tuple[ProcessPlan, ...]
    fingerprint: str

    def process(self, name: str) -> ProcessPlan | None:
        for plan in self.processes:
            if plan.name == name:
                return plan
        return None


def config_hash(config: ProcessConfig) -> str:
    """What decides the campaign's data: not mapping, workers, lease length, the read-back
    gate's level or accepted narrowings (those may change without starting a new campaign: a
    campaign the type preflight refuses mid-way can accept a narrowing and go on)."""
    bf = config.backfill
    sink = {
        k: v
        for k, v in config.sink.canonical().items()
        if k not in ("read_back", "accept_narrowing")
    }
    return fingerprint(
        {
            "source": config.source.canonical(),
            "sink": sink,
            "chunk": bf.chunk.canonical() if bf else None,
            "inner_mode": bf.inner_mode if bf else None,
        }
    )


def config_hash_at(config: ProcessConfig, end: Bound) -> str:
    """config_hash of ``config`` with the window's end set to ``end``: what a campaign this
    configuration extends (only the end moved) has stored (ADR 0020)."""
    bf = config.backfill
    if bf is None:
        return config_hash(config)
    moved = replace(bf, chunk=replace(bf.chunk, end=end))
    return config_hash(replace(config, backfill=moved))


def _check_mapped(config: ProcessConfig, policy: MappingPolicy, out: ErrorCollector) -> bool:
    """The rules a mapped process obeys, each located at the key it names."""
    ok = True
    name = config.name
    if config.sink.strategy != "backfill" or config.backfill is None:
        out.add(
            errors.MAPPING_REQUIRES_CHUNKED_BACKFILL,
            f"process {name!r}: mode {policy.mode} needs sink.strategy.mode backfill with a "
            f"backfill.chunk (got strategy {config.sink.strategy!r})",
            config.at("sink.strategy") if config.sink.strategy != "backfill" else config.location,
        )
        return False
    if config.backfill.parallel_workers != 1:
        out.add(
            errors.MAPPING_PARALLELISM_MULTIPLIER,
            f"process {name!r}: backfill.parallel_workers is {config.backfill.parallel_workers}; "
            f"mode {policy.mode} needs 1 (concurrency comes from max_active)",
            config.at("backfill.parallel_workers"),
        )
        ok = False
    state = config.state
    if state.backend != "audit_schema" or not state.require_distributed_lock:
        out.add(
            errors.MAPPING_STATE_UNSUPPORTED,
            f"process {name!r}: mode {policy.mode} needs state.backend audit_schema with "
            f"require_distributed_lock: true (got backend {state.backend!r}, "
            f"require_distributed_lock {str(state.require_distributed_lock).lower()})",
            config.at(
                "state.backend"
                if state.backend != "audit_schema"
                else "state.require_distributed_lock"
            ),
        )
        ok = False
    if config.backfill.inner_mode == "append" and state.connection != config.sink.connection:
        out.add(
            errors.MAPPED_APPEND_UNSAFE,
            f"process {name!r}: mapped append needs the ledger in the sink's own connection "
            f"(state.connection {state.connection!r} != sink.connection "
            f"{config.sink.connection!r}); use replace or merge",
            config.at("state.connection"),
        )
        ok = False
    return ok


def compile_process(
    workload: Workload, config: ProcessConfig, out: ErrorCollector
) -> ProcessPlan | None:
    policy = workload.mapping
    mapped_ok = True
    if policy.mapped:
        mapped_ok = _check_mapped(config, policy, out)
    chunks: tuple[Chunk, ...] = ()
    run_key: str | None = None
    hash_: str | None = None
    bf = config.backfill
    if bf is not None:
        dataset = config.sink.table.dotted
        run_key = bf.backfill_id or backfill_run_key(dataset, bf.chunk, bf.inner_mode)
        try:
            chunks, hash_ = plan_chunks_hashed(bf.chunk, run_key)
        except ChunkPlanError as exc:
            out.add(
                errors.BACKFILL_PLAN_INVALID,
                f"process {config.name!r}: {exc}",
                config.at("backfill.chunk"),
            )
            return None
        if bf.inner_mode == "full_refresh" and len(chunks) > 1:
            out.add(
                errors.BACKFILL_FULL_REFRESH_MULTI_CHUNK,
                f"process {config.name!r}: inner_mode full_refresh over {len(chunks)} chunks "
                f"would erase earlier chunks; use replace or merge",
                config.at("backfill.inner_mode"),
            )
            return None
    mapping_plan = None
    if policy.mapped and mapped_ok and hash_ is not None:
        try:
            mapping_plan = plan_mapping(policy, len(chunks), hash_)
        except MappingPlanError as exc:
            out.add(exc.code, f"process {config.name!r}: {exc}", workload.mapping_location)
            return None
    if policy.mapped and mapping_plan is None:
        return None
    return ProcessPlan(
        config=config,
        run_key=run_key,
        chunks=chunks,
        backfill_plan_hash=hash_,
        config_hash=config_hash(config),
        mapping_policy=policy,
        mapping_plan=mapping_plan,
    )


def pack_document(workload: Workload, processes: tuple[ProcessPlan, ...]) -> dict[str, Any]:
    return {
        "schema": PACK_SCHEMA,
        "workload": workload.name,
        "processes": [plan.canonical() for plan in processes],
    }


def compile_workload(workload: Workload) -> tuple[WorkloadPack | None, list[ErrorRecord]]:
    out = ErrorCollector()
    plans = []
    for config in workload.manifest.processes:
        plan = compile_process(workload, config, out)
        if plan is not None:
            plans.append(plan)
    if out:
        return None, out.records
    processes = tuple(plans)
    return WorkloadPack(workload, processes, fingerprint(pack_document(workload, processes))), []


def compile_catalog(catalog: Catalog) -> tuple[list[WorkloadPack], list[ErrorRecord]]:
    """Every workload's pack, in catalog order; all errors of all workloads at once."""
    packs: list[WorkloadPack] = []
    problems: list[ErrorRecord] = []
    for workload in catalog.workloads:
        pack, errs = compile_workload(workload)
        problems.extend(errs)
        if pack is not None:
            packs.append(pack)
    return packs, problems


def load_and_compile(
    path: str, only: str | None = None
) -> tuple[Catalog | None, list[WorkloadPack], list[ErrorRecord]]:
    """The whole pure front half: load, validate, plan. Used by check, preview, generate, run;
    ``only`` limits the manifests read and planned to one workload (see load_catalog)."""
    from dpone.authoring.loader import load_catalog

    catalog, problems = load_catalog(path, only)
    if catalog is None:
        return None, [], problems
    packs, problems = compile_catalog(catalog)
    return catalog, packs, problems


def select_process(pack: WorkloadPack, process: str) -> ProcessPlan:
    """The named process of ``pack``; DPONE_USAGE with the names it has otherwise."""
    plan = pack.process(process)
    if plan is None:
        names = [p.name for p in pack.processes]
        where = f"workload {pack.workload.name!r}"
        raise DponeError(errors.USAGE, not_in("process", process, where, names))
    return plan


def load_workload_pack(catalog: str, workload: str) -> WorkloadPack:
    """The compiled pack of one workload: the catalog file validated whole, then only this
    workload's manifest read and planned (a pod recompiles its own workload, not the catalog's
    every other one; `dpone check` validates them all). Any problem in either refuses."""
    loaded, packs, problems = load_and_compile(catalog, workload)
    if problems:
        raise DponeError.from_records(problems)
    assert loaded is not None
    for pack in packs:
        if pack.workload.name == workload:
            return pack
    names = list(loaded.names or (w.name for w in loaded.workloads))
    raise DponeError(errors.USAGE, not_in("workload", workload, catalog, names))
