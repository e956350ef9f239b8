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
from dpone.campaign.campaign_change import (
    Matches,
    PriorCampaign,
    classify,
    left_behind,
    match_campaigns,
    prior_campaigns,
)
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
        "catalog keeps, extends or replaces the campaign of its run key, and which previous "
        "campaigns it leaves behind (no database needed)",
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


def campaign_json(
    pack: WorkloadPack, plan: ProcessPlan, priors: Matches | None
) -> dict[str, Any] | None:
    """The process's campaign and, against a previous plan, what this catalog does to it."""
    if priors is None:
        if plan.run_key is None:
            return None
        return {"run_key": plan.run_key, "chunks": plan.chunks_total, "change": None}
    name = pack.workload.name
    return classify(priors.priors.get((name, plan.name)), plan, name)


def load_priors(path: str) -> list[PriorCampaign]:
    """The campaigns the previous plan names: PATH itself, or every DAG file of the folder
    PATH (a workload or DAG renamed since still names its campaigns there)."""
    if not path.strip():
        raise DponeError(errors.USAGE, "--previous needs a DAG file or folder, not ''")
    root = Path(path)
    if not root.exists():
        raise DponeError(errors.USAGE, f"--previous {path!r}: no such file or folder")
    if not root.is_dir() and not root.is_file():  # a FIFO would block, /dev/zero never end
        raise DponeError(
            errors.USAGE,
            f"--previous {path!r}: not a regular file or a folder (a pipe, a device or a socket)",
        )
    files = sorted(p for p in root.glob("*.py") if p.is_file()) if root.is_dir() else [root]
    priors: list[PriorCampaign] = []
    for file in files:
        try:
            text = file.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise DponeError(
                errors.USAGE, f"--previous {path!r}: cannot read {file}: {exc.strerror or exc}"
            ) from exc
        # A file given alone may have any name: only its header says which workload it was.
        dag_id = file.stem if root.is_dir() else None
        priors.extend(prior_campaigns(text, dag_id).values())
    return priors


def process_json(
    pack: WorkloadPack, plan: ProcessPlan, priors: Matches | None = None
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


def preview_document(packs: list[WorkloadPack], priors: Matches | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
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
    if priors is not None:
        doc["left_behind"] = [left_behind(prior) for prior in priors.left]
    return doc


def preview_text(packs: list[WorkloadPack], priors: Matches | None = None) -> str:
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
    if priors is not None and priors.left:
        lines.append("previous campaigns left behind")
        for prior in priors.left:
            lines.append(f"  campaign {prior.where}  LEAVES: {left_behind(prior)['detail']}")
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
    every, names = packs, [p.workload.name for p in packs]
    if args.workload:
        packs = [p for p in packs if p.workload.name == args.workload]
        if not packs:
            raise DponeError(errors.USAGE, not_in("workload", args.workload, catalog, names))
    priors = None
    if args.previous is not None:
        # Against the whole catalog: a campaign may have moved to (or be held by) any workload.
        priors = match_campaigns(load_priors(args.previous), every)
        if args.workload:  # its own left behind, and those of a workload no longer in it
            shown = [
                p for p in priors.left if p.workload == args.workload or p.workload not in names
            ]
            priors = Matches(priors.priors, tuple(shown))
    if args.format == "json":
        doc = preview_document(packs, priors)
        print(json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=True))
    else:
        print(preview_text(packs, priors), end="")
    return 0
