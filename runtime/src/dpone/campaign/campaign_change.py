"""Which campaign a catalog change starts: keeps, extends or replaces the previous plan's.

Every generated DAG file names, in one header comment per chunked process, the campaign it runs
(run_key, chunk count, plan hash). Comparing the current plan with those lines says, without a
database, what a deploy does to each campaign (ADR 0020): the same key and plan keeps it; the
same key with the stored chunks as its first chunks extends it; another key starts a new one
whose committed chunks are not reused; the same key with any other plan is refused by the ledger.
A campaign is its run key, not its process: a process, workload or DAG renamed with the key kept
carries the campaign on, and a previous campaign no process holds any more is left behind.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from dpone.packing.pack import ProcessPlan, WorkloadPack
from dpone.plan.chunks import plan_hash
from dpone.records import record

LINE_PREFIX = "# campaign "
WORKLOAD_PREFIX = "# workload: "
_LINE = re.compile(
    r"^# campaign (?P<process>\S+): run_key (?P<run_key>\S+), (?P<chunks>\d+) chunks, "
    r"plan (?P<plan_hash>sha256:[0-9a-f]{64})$"
)
KEEPS, EXTENDS, REPLACES, CONFLICTS, NEW = "keeps", "extends", "replaces", "conflicts", "new"
LEAVES = "leaves"


@record
class PriorCampaign:
    """A campaign as a previously generated DAG file names it, with the workload its header
    names and the dag_id its file name gives (None when unknown: a file given alone may have
    been copied under any name)."""

    process: str
    run_key: str
    chunks: int
    plan_hash: str
    workload: str | None = None
    dag_id: str | None = None

    @property
    def where(self) -> str:
        return f"{self.workload}/{self.process}" if self.workload else self.process


def campaign_line(plan: ProcessPlan) -> str | None:
    """The header line (without ``# ``) naming ``plan``'s campaign; None without chunks."""
    if plan.run_key is None or plan.backfill_plan_hash is None:
        return None
    return (
        f"campaign {plan.name}: run_key {plan.run_key}, {plan.chunks_total} chunks, "
        f"plan {plan.backfill_plan_hash}"
    )


def _header(text: str) -> list[str]:
    """The comment lines a generated DAG file starts with (the header ends at the first line
    that is neither a comment nor blank)."""
    lines: list[str] = []
    for line in text.splitlines():
        if not line.startswith("#"):
            if line.strip():
                break
            continue
        lines.append(line)
    return lines


def prior_campaigns(text: str, dag_id: str | None = None) -> dict[str, PriorCampaign]:
    """The campaigns a generated DAG file's header names, by process (none in a file written
    before the header carried them). Their workload is the header's ``# workload:`` line as a
    whole, so a workload whose name begins another's is never taken for it."""
    header = _header(text)
    workload = next(
        (line[len(WORKLOAD_PREFIX) :] for line in header if line.startswith(WORKLOAD_PREFIX)),
        None,
    )
    found: dict[str, PriorCampaign] = {}
    for line in header:
        match = _LINE.match(line)
        if match:
            found[match["process"]] = PriorCampaign(
                match["process"],
                match["run_key"],
                int(match["chunks"]),
                match["plan_hash"],
                workload,
                dag_id,
            )
    return found


def plan_campaign(pack: WorkloadPack, plan: ProcessPlan) -> PriorCampaign | None:
    """The campaign ``plan`` runs as its DAG file's header names it (an unchanged file's)."""
    if plan.run_key is None or plan.backfill_plan_hash is None:
        return None
    workload = pack.workload
    return PriorCampaign(
        plan.name,
        plan.run_key,
        plan.chunks_total,
        plan.backfill_plan_hash,
        workload.name,
        workload.airflow.dag_id,
    )


def _order(prior: PriorCampaign) -> tuple[str, str, str, str]:
    return (prior.workload or "", prior.process, prior.run_key, prior.dag_id or "")


@record
class Matches:
    """The previous campaign each process is compared with, by (workload, process), and the
    previous campaigns no process holds any more (sorted)."""

    priors: dict[tuple[str, str], PriorCampaign]
    left: tuple[PriorCampaign, ...]


def match_campaigns(previous: Iterable[PriorCampaign], packs: Iterable[WorkloadPack]) -> Matches:
    """Pair each process of the catalog (all of it: a key may move to any workload) with a
    previous campaign. A campaign is its run key (ADR 0020), so the one with the process's key
    comes first, wherever it was: the ledger resumes it under any process, workload or DAG name
    (its own process's, then its workload's, when several files name the key). Without one, the
    campaign its own process ran in its workload's previous file (by the header's workload, or
    the file's dag_id) is replaced, unless another process holds that key. A previous campaign
    neither held nor replaced is left behind: said, never dropped silently."""
    priors = sorted(previous, key=_order)
    pack_list = list(packs)
    held = {
        plan.run_key
        for pack in pack_list
        for plan in pack.processes
        if plan.run_key is not None and plan.backfill_plan_hash is not None
    }
    paired: dict[tuple[str, str], PriorCampaign] = {}
    replaced: list[PriorCampaign] = []
    for pack in pack_list:
        name, dag_id = pack.workload.name, pack.workload.airflow.dag_id
        ours = [p for p in priors if p.workload == name or p.dag_id == dag_id]
        for plan in pack.processes:
            if plan.run_key is None or plan.backfill_plan_hash is None:
                continue
            same_key = [p for p in priors if p.run_key == plan.run_key]
            if same_key:
                paired[(name, plan.name)] = min(
                    same_key,
                    key=lambda p: (p not in ours or p.process != plan.name, p not in ours),
                )
                continue
            own = [p for p in ours if p.process == plan.name and p.run_key not in held]
            if own:
                prior = min(own, key=lambda p: p.workload != name)
                paired[(name, plan.name)] = prior
                replaced.append(prior)
    left = tuple(p for p in priors if p.run_key not in held and p not in replaced)
    return Matches(paired, left)


def left_behind(prior: PriorCampaign) -> dict[str, Any]:
    """The verdict on a previous campaign no process of the catalog runs any more."""
    detail = (
        f"no process of this catalog runs campaign {prior.run_key} ({prior.chunks} chunks): it is "
        "left behind, its committed chunks are not reused (to carry it on, pin "
        f"backfill_id: {prior.run_key} on the process that runs it)"
    )
    return {
        "workload": prior.workload,
        "process": prior.process,
        "run_key": None,
        "chunks": None,
        "previous": {"run_key": prior.run_key, "chunks": prior.chunks},
        "change": LEAVES,
        "detail": detail,
    }


def classify(
    prior: PriorCampaign | None, plan: ProcessPlan, workload: str | None = None
) -> dict[str, Any] | None:
    """What ``plan`` (of ``workload``) does to the campaign ``prior`` names: its verdict and a
    sentence, which says where the previous plan ran the campaign when that was elsewhere."""
    if plan.run_key is None or plan.backfill_plan_hash is None:
        return None
    verdict = _verdict(prior, plan)
    if prior is not None:
        elsewhere = prior.process != plan.name or (
            None not in (workload, prior.workload) and prior.workload != workload
        )
        if elsewhere:
            verdict["detail"] += f"; the previous plan ran {prior.run_key} as {prior.where}"
    return verdict


def _verdict(prior: PriorCampaign | None, plan: ProcessPlan) -> dict[str, Any]:
    out: dict[str, Any] = {
        "run_key": plan.run_key,
        "chunks": plan.chunks_total,
        "previous": None,
    }
    if prior is None:
        return out | {"change": NEW, "detail": "no previous plan names this process"}
    out["previous"] = {"run_key": prior.run_key, "chunks": prior.chunks}
    if prior.run_key != plan.run_key:
        detail = (
            f"a new campaign {plan.run_key} replaces {prior.run_key}: its committed chunks are "
            "not reused, every chunk moves again (pin backfill_id to extend instead)"
        )
        return out | {"change": REPLACES, "detail": detail}
    if prior.plan_hash == plan.backfill_plan_hash:
        return out | {"change": KEEPS, "detail": "the same campaign and plan"}
    if (
        plan.chunks_total > prior.chunks
        and plan_hash(plan.chunks[: prior.chunks]) == prior.plan_hash
    ):
        detail = f"extends {prior.chunks} -> {plan.chunks_total} chunks; committed chunks stay"
        return out | {"change": EXTENDS, "detail": detail}
    detail = (
        f"the same key with another plan ({prior.chunks} -> {plan.chunks_total} chunks, not an "
        "extension): the ledger refuses it (DPONE_LEDGER_SHAPE_MISMATCH)"
    )
    return out | {"change": CONFLICTS, "detail": detail}
