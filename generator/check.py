"""`dpone check CATALOG`: every problem of a catalog and its manifests, at once.

Exit 0 clean, 1 errors found, 2 usage. Text lines are ``file:line:col: CODE: message``;
``--format json`` prints the dpone.error.v1 list.
"""

from __future__ import annotations

import argparse
import json
import sys

from dpone.authoring.loader import load_catalog_checked
from dpone.credentials.redaction import redact_document, redact_text
from dpone.errors import ErrorRecord
from dpone.observability.reporting import CommandParser
from dpone.packing.pack import WorkloadPack, compile_catalog

from .validate import validate_for_airflow


def _parser() -> CommandParser:
    parser = CommandParser(
        prog="dpone check",
        description="Validate a workload catalog, its manifests and every mapping plan.",
        epilog="example:\n  dpone check golden/summary_365_into_40/workloads.yaml --format json\n"
        "exit codes: 0 no errors, 1 errors found (each as file:line:column: CODE: message), "
        "2 usage",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_catalog("path of the workload catalog (dpone.workload-catalog.v1)")
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="json: the errors as a dpone.error.v1 list on stdout (text)",
    )
    return parser


def catalog_problems(path: str) -> tuple[list[WorkloadPack], list[ErrorRecord]]:
    """Everything `dpone check` refuses, in one pass: the pure front half's problems and the
    rules only a DAG file needs (image, secrets per connection, unique hook names), which CI
    should not learn about first from generate. Each workload whose entry and manifest load
    cleanly is planned and checked even when another one fails; one whose manifest has
    problems still gets the DAG rules, which need no plan. `preview` and `generate` refuse the
    same."""
    catalog, checked, problems = load_catalog_checked(path)
    if catalog is None:
        return [], problems
    packs, plan_problems = compile_catalog(catalog)
    return packs, [*problems, *plan_problems, *validate_for_airflow(catalog.path, checked)]


def main_check(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args.catalog = parser.catalog_of(args)
    packs, problems = catalog_problems(args.catalog)
    if args.format == "json":
        docs = [redact_document(p.to_json()) for p in problems]
        print(json.dumps(docs, indent=2, ensure_ascii=False))
    elif problems:
        for problem in problems:
            print(redact_text(str(problem)), file=sys.stderr)
        print(f"dpone check: {len(problems)} error(s) in {args.catalog}", file=sys.stderr)
    else:
        processes = sum(len(p.processes) for p in packs)
        print(
            f"dpone check: {args.catalog}: OK — {len(packs)} workload(s), {processes} process(es)"
        )
    return 1 if problems else 0
