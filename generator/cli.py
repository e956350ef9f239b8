"""`dpone generate CATALOG --out DIR [--check]`: a thin layer over build and emit.

Exit codes: 0 written / up to date, 1 ``--check`` found a difference, 2 an error (every error is
printed, as ``file:line:col: CODE: message`` lines or with ``--format json`` as a dpone.error.v1
list on stdout).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from dpone import errors
from dpone.campaign.campaign_change import (
    CONFLICTS,
    EXTENDS,
    REPLACES,
    PriorCampaign,
    classify,
    left_behind,
    match_campaigns,
    plan_campaign,
    prior_campaigns,
)
from dpone.credentials.redaction import redact_document, redact_text
from dpone.errors import ErrorRecord
from dpone.observability.reporting import CommandParser, report_error
from dpone.packing.pack import WorkloadPack

from .build import build
from .emit import EmitPlan, apply_emit, plan_emit, unified_diff

EXIT_OK, EXIT_DIFF, EXIT_ERROR = 0, 1, 2

EPILOG = """examples:
  dpone generate golden/summary_365_into_40/workloads.yaml --out dags/
  dpone generate golden/summary_365_into_40/workloads.yaml --out dags/ --check   # in CI

Writes one <dag_id>.py per workload and dpone_pools.json (for `airflow pools import`) into DIR.
Files are replaced atomically and only when their bytes change; generated files of this catalog
that are no longer produced are removed; a file dpone did not generate is never touched. Keep one
catalog per output folder. Headers name the catalog by its path relative to the git checkout's
root, so the working folder and an absolute path change nothing (outside a checkout: as given,
relative to the working folder). --check writes nothing: it prints a unified diff per changed, missing or stale file.
exit codes: 0 up to date / written, 1 --check found differences, 2 error."""


def _parser() -> CommandParser:
    parser = CommandParser(
        prog="dpone generate",
        description="Render the frozen Airflow DAG file of every workload, and the pools file.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_catalog("path of the workload catalog (dpone.workload-catalog.v1)")
    parser.add_argument("--out", required=True, metavar="DIR", help="the folder of DAG files")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when DIR is not up to date"
    )
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="json: errors as a dpone.error.v1 list, results as one object, on stdout",
    )
    return parser


def _report_errors(
    problems: list[ErrorRecord], output_format: str, outcome: str = "nothing was written"
) -> int:
    if output_format == "json":
        docs = [redact_document(p.to_json()) for p in problems]
        print(json.dumps(docs, indent=2, ensure_ascii=False))
    else:
        for problem in problems:
            print(redact_text(str(problem)), file=sys.stderr)
        print(f"dpone generate: {len(problems)} error(s); {outcome}", file=sys.stderr)
    return EXIT_ERROR


def _names(plan: EmitPlan, kind: str) -> list[str]:
    return [change.name for change in plan.changes if change.kind == kind]


def campaign_changes(plan: EmitPlan, packs: tuple[WorkloadPack, ...]) -> list[dict[str, Any]]:
    """What the catalog does to the campaigns the folder's DAG files name (a changed or stale
    file's previous version, an unchanged file as it is), matched by run key as `dpone preview
    --previous` matches them: each process that extends, replaces or conflicts with one, then
    each previous campaign no process runs any more (left behind). A kept campaign, or a process
    without one before, is not a change."""
    previous: list[PriorCampaign] = []
    for change in plan.changes:
        if change.old is not None:
            previous.extend(prior_campaigns(change.old, Path(change.name).stem).values())
    unchanged = set(plan.unchanged)
    for pack in packs:
        if f"{pack.workload.airflow.dag_id}.py" in unchanged:
            same = (plan_campaign(pack, process) for process in pack.processes)
            previous.extend(prior for prior in same if prior is not None)
    matches = match_campaigns(previous, packs)
    found: list[dict[str, Any]] = []
    for pack in packs:
        name = pack.workload.name
        for process in pack.processes:
            prior = matches.priors.get((name, process.name))
            verdict = classify(prior, process, name) if prior is not None else None
            if verdict is not None and verdict["change"] in (EXTENDS, REPLACES, CONFLICTS):
                found.append({"workload": name, "process": process.name, **verdict})
    return found + [left_behind(prior) for prior in matches.left]


def _campaign_summary(changes: list[dict[str, Any]]) -> str:
    if not changes:
        return ""
    shown = "; ".join(
        f"{c['workload']}/{c['process']} {c['change'].upper()}: {c['detail']}" for c in changes
    )
    return f"\n  campaigns: {shown}"


def _report_check(
    plan: EmitPlan,
    out_display: str,
    fix: str,
    output_format: str,
    packs: tuple[WorkloadPack, ...] = (),
) -> int:
    code = EXIT_OK if plan.up_to_date else EXIT_DIFF
    changes = campaign_changes(plan, packs)
    if output_format == "json":
        doc = {
            "up_to_date": plan.up_to_date,
            "changed": _names(plan, "changed"),
            "missing": _names(plan, "missing"),
            "stale": _names(plan, "stale"),
            "unchanged": list(plan.unchanged),
            "campaigns": changes,
        }
        print(json.dumps(doc, indent=2, ensure_ascii=False))
        return code
    if plan.up_to_date:
        print(f"dpone generate --check: {out_display} is up to date ({len(plan.unchanged)} files)")
        return code
    for change in plan.changes:
        sys.stdout.write(unified_diff(change, out_display))
    print(
        f"dpone generate --check: {out_display} is out of date: {plan.count('changed')} changed, "
        f"{plan.count('missing')} missing, {plan.count('stale')} stale"
        f"{_campaign_summary(changes)}\n  update with: {fix}",
        file=sys.stderr,
    )
    return code


def _report_written(plan: EmitPlan, out_display: str, output_format: str) -> int:
    written = _names(plan, "changed") + _names(plan, "missing")
    removed = _names(plan, "stale")
    if output_format == "json":
        doc = {"written": sorted(written), "removed": removed, "unchanged": list(plan.unchanged)}
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        print(
            f"dpone generate: {out_display}: {len(written)} written, "
            f"{len(plan.unchanged)} unchanged, {len(removed)} removed"
        )
    return EXIT_OK


def generate_command(catalog: str, out: str, check: bool, output_format: str = "text") -> int:
    """Generate (or with ``check`` compare) the DAG files of ``catalog`` in ``out``."""
    if not out.strip():
        report_error(ErrorRecord(errors.USAGE, "dpone generate: --out needs a folder, not ''"))
        return EXIT_ERROR
    result = build(catalog)
    if result.errors:
        return _report_errors(list(result.errors), output_format)
    out_display = out.rstrip("/") or "/"
    plan, problems = plan_emit(Path(out), out_display, result.files, result.owner)
    if plan is None:
        return _report_errors(problems, output_format)
    if check:
        fix = f"dpone generate {catalog} --out {out}"
        return _report_check(plan, out_display, fix, output_format, result.packs)
    problems, restored = apply_emit(plan, out_display)
    if problems:
        outcome = "nothing was changed" if restored else "the folder is left part-written"
        return _report_errors(problems, output_format, outcome)
    return _report_written(plan, out_display, output_format)


def main_generate(args: list[str]) -> int:
    """Entry point for `dpone generate` (dispatched by dpone.cli through commands.main)."""
    parser = _parser()
    parsed = parser.parse_args(args)
    catalog = parser.catalog_of(parsed)
    return generate_command(catalog, parsed.out, parsed.check, parsed.format)
