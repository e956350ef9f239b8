"""`dpone preview CATALOG`: what each workload will look like in Airflow, before anything ships.

Text shows per workload and process: mode, chunks_total, items_total, chunks per item, max
concurrency, pool, state requirement, plan fingerprint, and the first and last items with their
chunk bounds. JSON is one document holding each process's dpone.airflow-mapping-plan.v1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dpone import errors
from dpone.campaign.campaign_change import PriorCampaign, classify, prior_campaigns
from dpone.credentials.redaction import redact_document, redact_text
from dpone.errors import DponeError
from dpone.observability.reporting import CommandParser
from dpone.packing.pack import ProcessPlan, WorkloadPack
from dpone.plan.mapping import MappingItem
from dpone.suggest import not_in

from .check import catalog_problems


def _parser() -> CommandParser:
    parser = CommandParser(
        prog="dpone preview",
        description="Show the chunk and mapping plan of every workload (or one).",
        epilog="example:\n  dpone preview golden/summary_365_into_40/workloads.yaml --workload "
        "orders_history\nexit codes: 0 shown, 1 the catalog has errors (run dpone check), "
        "2 usage or unknown workload",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_catalog("path of the workload catalog")
    parser.add_argument("--workload", help="only this workload")
    parser.add_argument(
        "--previous",
        metavar="PATH",
        help="the previously generated DAG file, or its folder: say per process whether this "
        "catalog keeps, extends or replaces that plan's campaign (no database needed)",
    )
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="json: every process with its dpone.airflow-mapping-plan.v1 (text)",
    )
    return parser


def state_requirement(plan: ProcessPlan) -> str:
    if plan.mapping_plan is not None:
        return "distributed lock + chunk lease + compare-and-set (audit_schema)"
    return f"{plan.config.state.backend} (any store)"


def _bounds(plan: ProcessPlan, item: MappingItem) -> str:
    first = plan.chunks[item.first_chunk_index - 1]
    last = plan.chunks[item.last_chunk_index - 1]
    return f"[{first.start} .. {last.end})"


Priors = dict[str, dict[str, PriorCampaign]]
"""The previous plan's campaigns, by workload then process; None when --previous is not given."""


def campaign_json(
    pack: WorkloadPack, plan: ProcessPlan, priors: Priors | None
) -> dict[str, Any] | None:
    """The process's campaign and, against a previous plan, what this catalog does to it."""
    if priors is None:
        if plan.run_key is None:
            return None
        return {"run_key": plan.run_key, "chunks": plan.chunks_total, "change": None}
    return classify(priors.get(pack.workload.name, {}).get(plan.name), plan)


def load_priors(path: str, packs: list[WorkloadPack]) -> Priors:
    """The campaigns the previous DAG file of each workload names (PATH itself, or
    PATH/<dag_id>.py); a workload without one has none (every campaign is new)."""
    root = Path(path)
    if not root.exists():
        raise DponeError(errors.USAGE, f"--previous {path!r}: no such file or folder")
    priors: Priors = {}
    for pack in packs:
        file = root / f"{pack.workload.airflow.dag_id}.py" if root.is_dir() else root
        if file.is_file():
            text = file.read_text(encoding="utf-8", errors="replace")
            if root.is_dir() or f"# workload: {pack.workload.name}" in text:
                priors[pack.workload.name] = prior_campaigns(text)
    return priors


def process_json(
    pack: WorkloadPack, plan: ProcessPlan, priors: Priors | None = None
) -> dict[str, Any]:
    mapping = plan.mapping_plan
    return {
        "campaign": campaign_json(pack, plan, priors),
        "name": plan.name,
        "mode": plan.mapping_policy.mode,
        "run_key": plan.run_key,
        "chunks_total": plan.chunks_total,
        "backfill_plan_hash": plan.backfill_plan_hash,
        "state_requirement": state_requirement(plan),
        "limits": plan.mapping_policy.canonical(),
        "mapping_plan": mapping.to_artifact() if mapping else None,
    }


def preview_document(packs: list[WorkloadPack], priors: Priors | None = None) -> dict[str, Any]:
    return {
        "workloads": [
            {
                "name": pack.workload.name,
                "dag_id": pack.workload.airflow.dag_id,
                "pack_fingerprint": pack.fingerprint,
                "mapping_source": pack.workload.mapping_source,
                "processes": [process_json(pack, plan, priors) for plan in pack.processes],
            }
            for pack in packs
        ]
    }


def preview_text(packs: list[WorkloadPack], priors: Priors | None = None) -> str:
    lines: list[str] = []
    for pack in packs:
        wl = pack.workload
        lines.append(f"workload {wl.name}  (dag {wl.airflow.dag_id}, flavour {wl.airflow.flavour})")
        lines.append(f"  pack fingerprint   {pack.fingerprint}")
        lines.append(f"  mapping policy     from {wl.mapping_source}")
        for plan in pack.processes:
            policy = plan.mapping_policy
            lines.append(f"  process {plan.name}")
            lines.append(f"    mode             {policy.mode}")
            lines.append(f"    chunks_total     {plan.chunks_total}")
            mapping = plan.mapping_plan
            if mapping is None:
                workers = plan.config.backfill.parallel_workers if plan.config.backfill else 1
                lines.append("    items_total      1 (one Airflow task)")
                lines.append(f"    max concurrency  {workers} worker(s) inside the task")
                lines.append("    pool             (none)")
            else:
                sizes = [i.chunks_count for i in mapping.items]
                lines.append(f"    items_total      {mapping.items_total}")
                lines.append(f"    chunks per item  {min(sizes)}..{max(sizes)}")
                lines.append(f"    max concurrency  {policy.max_active} (max_active_tis_per_dag)")
                lines.append(f"    pool             {policy.pool}")
            campaign = campaign_json(pack, plan, priors)
            if campaign is not None:
                change = campaign["change"]
                verdict = f"  {change.upper()}: {campaign['detail']}" if change else ""
                lines.append(f"    campaign         {campaign['run_key']}{verdict}")
            lines.append(f"    state            {state_requirement(plan)}")
            if plan.backfill_plan_hash:
                lines.append(f"    backfill plan    {plan.backfill_plan_hash}")
            if mapping is not None:
                lines.append(f"    plan fingerprint {mapping.plan_fingerprint}")
                shown = [mapping.items[0]]
                if mapping.items_total > 1:
                    shown.append(mapping.items[-1])
                for item in shown:
                    lines.append(
                        f"    item {item.item_index:>3}  chunks {item.first_chunk_index}-"
                        f"{item.last_chunk_index}  {_bounds(plan, item)}"
                    )
            elif plan.chunks:
                first, last = plan.chunks[0], plan.chunks[-1]
                lines.append(f"    window           [{first.start} .. {last.end})")
        lines.append("")
    return "\n".join(lines)


def main_preview(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    catalog = parser.catalog_of(args)
    packs, problems = catalog_problems(catalog)
    if problems and args.format == "json":  # as dpone check --format json prints them
        print(
            json.dumps(
                [redact_document(p.to_json()) for p in problems], indent=2, ensure_ascii=False
            )
        )
        return 1
    if problems:
        for problem in problems:
            print(redact_text(str(problem)), file=sys.stderr)
        print(
            f"dpone preview: {len(problems)} error(s) in {catalog}, as dpone check reports them",
            file=sys.stderr,
        )
        return 1
    if args.workload:
        names = [p.workload.name for p in packs]
        packs = [p for p in packs if p.workload.name == args.workload]
        if not packs:
            raise DponeError(errors.USAGE, not_in("workload", args.workload, catalog, names))
    priors = load_priors(args.previous, packs) if args.previous else None
    if args.format == "json":
        doc = preview_document(packs, priors)
        print(json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=True))
    else:
        print(preview_text(packs, priors), end="")
    return 0
