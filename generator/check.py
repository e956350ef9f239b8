"""`dpone check CATALOG`: every problem of a catalog and its manifests, at once.

Exit 0 clean, 1 errors found, 2 usage. Text lines are ``file:line:col: CODE: message``;
``--format json`` prints the dpone.error.v1 list.
"""

from __future__ import annotations

import argparse
import json
import sys

from dpone.pack import load_and_compile
from dpone.redaction import redact_document, redact_text
from dpone.reporting import CommandParser

from .validate import validate_for_airflow


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="dpone check",
        description="Validate a workload catalog, its manifests and every mapping plan.",
        epilog="example:\n  dpone check golden/summary_365_into_40/workloads.yaml --format json\n"
        "exit codes: 0 no errors, 1 errors found (each as file:line:column: CODE: message), "
        "2 usage",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("catalog", help="path of the workload catalog (dpone.workload-catalog.v1)")
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="json: the errors as a dpone.error.v1 list on stdout (text)",
    )
    return parser


def main_check(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    catalog, packs, problems = load_and_compile(args.catalog)
    if catalog is not None:
        # The rules only a DAG file needs (image, secrets per connection, unique hook names)
        # belong to check too: CI should not learn about them first from generate.
        problems = [*problems, *validate_for_airflow(catalog)]
    if args.format == "json":
        docs = [redact_document(p.to_json()) for p in problems]
        print(json.dumps(docs, indent=2, ensure_ascii=False))
    elif problems:
        for problem in problems:
            print(redact_text(str(problem)), file=sys.stderr)
        print(f"dpone check: {len(problems)} error(s) in {args.catalog}", file=sys.stderr)
    else:
        assert catalog is not None
        processes = sum(len(p.processes) for p in packs)
        print(
            f"dpone check: {args.catalog}: OK — {len(packs)} workload(s), {processes} process(es)"
        )
    return 1 if problems else 0
