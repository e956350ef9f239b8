"""Which campaign a catalog change starts: keeps, extends or replaces the previous plan's.

Every generated DAG file names, in one header comment per chunked process, the campaign it runs
(run_key, chunk count, plan hash). Comparing the current plan with those lines says, without a
database, what a deploy does to each campaign (ADR 0020): the same key and plan keeps it; the
same key with the stored chunks as its first chunks extends it; another key starts a new one
whose committed chunks are not reused; the same key with any other plan is refused by the ledger.
"""

from __future__ import annotations

import re
from typing import Any

from dpone.packing.pack import ProcessPlan
from dpone.plan.chunks import plan_hash
from dpone.records import record

LINE_PREFIX = "# campaign "
_LINE = re.compile(
    r"^# campaign (?P<process>\S+): run_key (?P<run_key>\S+), (?P<chunks>\d+) chunks, "
    r"plan (?P<plan_hash>sha256:[0-9a-f]{64})$"
)
KEEPS, EXTENDS, REPLACES, CONFLICTS, NEW = "keeps", "extends", "replaces", "conflicts", "new"


@record
class PriorCampaign:
    """A campaign as a previously generated DAG file names it."""

    process: str
    run_key: str
    chunks: int
    plan_hash: str


def campaign_line(plan: ProcessPlan) -> str | None:
    """The header line (without ``# ``) naming ``plan``'s campaign; None without chunks."""
    if plan.run_key is None or plan.backfill_plan_hash is None:
        return None
    return (
        f"campaign {plan.name}: run_key {plan.run_key}, {plan.chunks_total} chunks, "
        f"plan {plan.backfill_plan_hash}"
    )


def prior_campaigns(text: str) -> dict[str, PriorCampaign]:
    """The campaigns a generated DAG file's header names, by process (none in a file written
    before the header carried them)."""
    found: dict[str, PriorCampaign] = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            if line.strip():
                break  # the header ends at the first line that is not a comment
            continue
        match = _LINE.match(line)
        if match:
            found[match["process"]] = PriorCampaign(
                match["process"], match["run_key"], int(match["chunks"]), match["plan_hash"]
            )
    return found


def classify(prior: PriorCampaign | None, plan: ProcessPlan) -> dict[str, Any] | None:
    """What ``plan`` does to the campaign ``prior`` names: its verdict and a sentence."""
    if plan.run_key is None or plan.backfill_plan_hash is None:
        return None
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
