"""`dpone ledger status|cancel`: what the ledger says about a campaign, as text, JSON or HTML.

The ledger is the authority, so this is the place an operator looks before clearing an Airflow
task: chunk states grouped by mapped item, running leases with owner and expiry, failures.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpone import errors
from dpone.errors import DponeError
from dpone.ledger.port import ChunkState, Ledger, LedgerStore
from dpone.pack import ProcessPlan, WorkloadPack
from dpone.plan.mapping import MappingItem

STATUS_SCHEMA = "dpone.ledger-status.v1"
STATE_COLOURS = {
    "committed": "#2e9e44",
    "running": "#e0a800",
    "failed": "#d1302f",
    "pending": "#c9ced6",
}
ANSI = {"committed": "32", "running": "33", "failed": "31", "pending": "2"}
GLYPH = {"committed": "█", "running": "▒", "failed": "✖", "pending": "·"}


@dataclass(frozen=True)
class Group:
    """A run of chunks shown together: one mapped item, or a row of an internal campaign."""

    label: str
    first: int
    last: int


def groups_for(plan: ProcessPlan) -> list[Group]:
    if plan.mapping_plan is not None:
        return [_item_group(plan, item) for item in plan.mapping_plan.items]
    width = 50
    return [
        Group(
            f"chunks {lo}-{min(lo + width - 1, plan.chunks_total)}",
            lo,
            min(lo + width - 1, plan.chunks_total),
        )
        for lo in range(1, plan.chunks_total + 1, width)
    ]


def _item_group(plan: ProcessPlan, item: MappingItem) -> Group:
    first = plan.chunks[item.first_chunk_index - 1]
    last = plan.chunks[item.last_chunk_index - 1]
    return Group(
        f"item {item.item_index} [{first.start} .. {last.end})",
        item.first_chunk_index,
        item.last_chunk_index,
    )


def status_document(pack: WorkloadPack, plan: ProcessPlan, ledger: Ledger | None) -> dict[str, Any]:
    states = {
        c.index: (ledger.state_of(c.index).value if ledger else "pending") for c in plan.chunks
    }
    counts = Counter(states.values())
    leases, failures = [], []
    if ledger is not None:
        for index in sorted(ledger.records):
            record = ledger.records[index]
            if record.state is ChunkState.RUNNING:
                expired = bool(
                    ledger.now and record.lease_expires_at and record.lease_expires_at <= ledger.now
                )
                leases.append(
                    {
                        "chunk_index": index,
                        "owner": record.lease_owner,
                        "attempt": record.attempt,
                        "expires_at": (
                            record.lease_expires_at.isoformat() if record.lease_expires_at else None
                        ),
                        "expired": expired,
                    }
                )
            elif record.state is ChunkState.FAILED:
                failures.append(
                    {
                        "chunk_index": index,
                        "attempt": record.attempt,
                        "error_code": record.error_code,
                        "error_message": (record.error_message or "")[:300],
                    }
                )
    return {
        "schema": STATUS_SCHEMA,
        "workload": pack.workload.name,
        "process": plan.name,
        "run_key": plan.run_key,
        "mode": plan.mapping_policy.mode,
        "exists": ledger is not None,
        "cancelled": bool(ledger and ledger.cancelled),
        "chunks_total": plan.chunks_total,
        "counts": {state: counts.get(state, 0) for state in STATE_COLOURS},
        "items": [
            {
                "label": g.label,
                "first_chunk_index": g.first,
                "last_chunk_index": g.last,
                "states": [states[i] for i in range(g.first, g.last + 1)],
            }
            for g in groups_for(plan)
        ],
        "running_leases": leases,
        "failures": failures,
    }


def render_text(doc: dict[str, Any], colour: bool) -> str:
    def paint(state: str, text: str) -> str:
        return f"\033[{ANSI[state]}m{text}\033[0m" if colour else text

    c = doc["counts"]
    lines = [
        f"campaign {doc['run_key']}  ({doc['workload']}/{doc['process']}, mode {doc['mode']})",
        f"  {doc['chunks_total']} chunks: {c['committed']} committed, {c['running']} running, "
        f"{c['failed']} failed, {c['pending']} pending"
        + ("  [CANCELLED]" if doc["cancelled"] else "")
        + ("" if doc["exists"] else "  (no ledger yet: nothing has run)"),
    ]
    width = max((len(g["label"]) for g in doc["items"]), default=0)
    for group in doc["items"]:
        cells = "".join(paint(s, GLYPH[s]) for s in group["states"])
        done = sum(1 for s in group["states"] if s == "committed")
        lines.append(f"  {group['label']:<{width}}  {cells} {done}/{len(group['states'])}")
    for lease in doc["running_leases"]:
        flag = " (expired: retryable)" if lease["expired"] else ""
        lines.append(
            f"  lease: chunk {lease['chunk_index']} attempt {lease['attempt']} owner "
            f"{lease['owner']} until {lease['expires_at']}{flag}"
        )
    for failure in doc["failures"]:
        lines.append(
            f"  failed: chunk {failure['chunk_index']} attempt {failure['attempt']} "
            f"{failure['error_code']}: {failure['error_message']}"
        )
    legend = "  legend: " + "  ".join(f"{paint(s, GLYPH[s])} {s}" for s in STATE_COLOURS)
    lines.append(legend)
    return "\n".join(lines) + "\n"


def render_html(doc: dict[str, Any]) -> str:
    """A self-contained page: one coloured cell per chunk, grouped by item; no external assets."""
    e = html.escape
    c = doc["counts"]
    rows = []
    for group in doc["items"]:
        cells = "".join(
            f'<span class="cell {s}" title="chunk {group["first_chunk_index"] + i}: {s}"></span>'
            for i, s in enumerate(group["states"])
        )
        rows.append(
            f'<div class="group"><div class="label">{e(group["label"])}</div><div class="cells">{cells}</div></div>'
        )
    lease_rows = "".join(
        f"<tr><td>{x['chunk_index']}</td><td>{x['attempt']}</td><td>{e(str(x['owner']))}</td>"
        f"<td>{e(str(x['expires_at']))}</td><td>{'yes' if x['expired'] else 'no'}</td></tr>"
        for x in doc["running_leases"]
    )
    failure_rows = "".join(
        f"<tr><td>{x['chunk_index']}</td><td>{x['attempt']}</td><td>{e(str(x['error_code']))}</td>"
        f"<td>{e(x['error_message'])}</td></tr>"
        for x in doc["failures"]
    )
    style = "".join(f".{s}{{background:{col}}}" for s, col in STATE_COLOURS.items())
    legend = "".join(f'<span class="cell {s}"></span> {s} ({c[s]}) ' for s in STATE_COLOURS)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>dpone campaign {e(str(doc['run_key']))}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:24px;color:#222;background:#fff}}
.group{{display:flex;align-items:center;margin:2px 0}}
.label{{width:360px;font:12px monospace;white-space:nowrap;overflow:hidden}}
.cells{{display:flex;flex-wrap:wrap;gap:2px}}
.cell{{display:inline-block;width:14px;height:14px;border-radius:2px}}
{style}
table{{border-collapse:collapse;margin-top:12px}}td,th{{border:1px solid #ccc;padding:2px 6px;font-size:12px}}
</style></head><body>
<h1>{e(doc['workload'])}/{e(doc['process'])}</h1>
<p>campaign <code>{e(str(doc['run_key']))}</code>, mode {e(doc['mode'])}, {doc['chunks_total']} chunks{' — CANCELLED' if doc['cancelled'] else ''}</p>
<p class="legend">{legend}</p>
<div id="grid">{''.join(rows)}</div>
<h2>Running leases ({len(doc['running_leases'])})</h2>
<table><tr><th>chunk</th><th>attempt</th><th>owner</th><th>expires at</th><th>expired</th></tr>{lease_rows}</table>
<h2>Failures ({len(doc['failures'])})</h2>
<table><tr><th>chunk</th><th>attempt</th><th>code</th><th>message</th></tr>{failure_rows}</table>
</body></html>
"""


def _open_store(plan: ProcessPlan) -> LedgerStore:
    from dpone.connections import resolve_dsn
    from dpone.ledger.factory import open_store

    state = plan.config.state
    dsn = resolve_dsn(state.connection) if state.connection else None
    store: LedgerStore = open_store(state.backend, dsn=dsn, schema=state.schema, path=state.path)
    return store


def _plans(pack: WorkloadPack, process: str | None) -> list[ProcessPlan]:
    plans = [p for p in pack.processes if p.run_key is not None]
    if process is not None:
        plans = [p for p in plans if p.name == process]
        if not plans:
            raise DponeError(
                errors.USAGE, f"no chunked process {process!r} in {pack.workload.name!r}"
            )
    return plans


def ledger_command(argv: Sequence[str], parser_class: type[argparse.ArgumentParser]) -> int:
    from dpone.runner import load_workload_pack

    parser = parser_class(
        prog="dpone ledger",
        description="Show or cancel a campaign's ledger.",
        epilog="examples:\n  dpone ledger status --catalog workloads.yaml --workload orders_history\n"
        "  dpone ledger status --catalog workloads.yaml --workload orders_history --html campaign.html\n"
        "  dpone ledger cancel --catalog workloads.yaml --workload orders_history --reason 'bad source'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="action", required=True)
    for name in ("status", "cancel"):
        p = sub.add_parser(name, help=f"{name} a campaign")
        p.add_argument("--catalog", required=True)
        p.add_argument("--workload", required=True)
        p.add_argument("--process")
        if name == "status":
            p.add_argument("--format", choices=("text", "json"), default="text")
            p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page")
        else:
            p.add_argument("--reason", default="cancelled by operator")
            p.add_argument("--undo", action="store_true", help="lift a cancellation")
    args = parser.parse_args(list(argv))
    pack = load_workload_pack(args.catalog, args.workload)
    plans = _plans(pack, args.process)
    if args.action == "cancel":
        for plan in plans:
            store = _open_store(plan)
            try:
                assert plan.run_key is not None
                store.cancel(plan.run_key, args.reason, undo=args.undo)
            finally:
                store.close()
            verb = "resumed" if args.undo else "cancelled"
            print(f"dpone: campaign {plan.run_key} ({plan.name}) {verb}")
        return 0
    docs = []
    for plan in plans:
        store = _open_store(plan)
        try:
            assert plan.run_key is not None
            ledger = store.load(plan.run_key)
        finally:
            store.close()
        docs.append(status_document(pack, plan, ledger))
    if args.format == "json":
        print(json.dumps(docs if len(docs) != 1 else docs[0], indent=2, sort_keys=True))
    else:
        colour = sys.stdout.isatty() and "NO_COLOR" not in os.environ
        print("".join(render_text(doc, colour) for doc in docs), end="")
    if args.html:
        Path(args.html).write_text("".join(render_html(doc) for doc in docs[:1]), encoding="utf-8")
        print(f"dpone: wrote {args.html}", file=sys.stderr)
    return 0
