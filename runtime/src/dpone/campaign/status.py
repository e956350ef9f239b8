"""`dpone ledger status|cancel`: what the ledger says about a campaign, as text, JSON or HTML.

The ledger is the authority, so this is the place an operator looks before clearing an Airflow
task: chunk states grouped by mapped item, running leases with owner and expiry, failures.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shlex
import sys
import tempfile
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dpone import errors
from dpone.campaign.campaigns import moving_held
from dpone.campaign.restate import requested_by, stored_shape
from dpone.credentials.redaction import redact_document, redact_text
from dpone.errors import DponeError
from dpone.ledger.port import (
    Amendment,
    ChunkState,
    Ledger,
    LedgerStore,
    Restatement,
)
from dpone.observability.exporting import escape_controls
from dpone.observability.reporting import use_colour
from dpone.observability.result import write_text_atomic
from dpone.packing.pack import ProcessPlan, WorkloadPack, load_workload_pack
from dpone.packing.task_env import runtime_task_id
from dpone.plan.mapping import MappingItem
from dpone.records import record
from dpone.suggest import not_in
from dpone.task.airflow_context import attribution, describe_attribution

STATUS_SCHEMA = "dpone.ledger-status.v1"
STATE_COLOURS = {
    "committed": "#2e9e44",
    "running": "#e0a800",
    "failed": "#d1302f",
    "pending": "#c9ced6",
}
ANSI = {"committed": "32", "running": "33", "failed": "31", "pending": "2"}
GLYPH = {"committed": "█", "running": "▒", "failed": "✖", "pending": "·"}
#: the cells on a terminal whose encoding cannot show GLYPH (PYTHONIOENCODING=ascii, C locale)
ASCII_GLYPH = {"committed": "#", "running": "~", "failed": "x", "pending": "."}


def glyphs_for(stream: Any) -> dict[str, str]:
    """GLYPH when ``stream``'s encoding can show it, else ASCII_GLYPH."""
    try:
        "".join(GLYPH.values()).encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return ASCII_GLYPH
    return GLYPH


@record
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
    chunks = (
        f"chunk {item.first_chunk_index}"
        if item.first_chunk_index == item.last_chunk_index
        else f"chunks {item.first_chunk_index}-{item.last_chunk_index}"
    )
    return Group(
        f"item {item.item_index} {chunks} [{first.start} .. {last.end})",
        item.first_chunk_index,
        item.last_chunk_index,
    )


def _require_same_campaign(pack: WorkloadPack, plan: ProcessPlan, ledger: Ledger) -> None:
    """DPONE_LEDGER_SHAPE_MISMATCH (as `dpone run` refuses it) unless the catalog plans the
    stored campaign or extends it: the states are shown over the catalog's chunks by index,
    which would put the stored chunks' states on chunks of another grid."""
    stored_shape(pack, plan, ledger)


def status_document(
    pack: WorkloadPack,
    plan: ProcessPlan,
    ledger: Ledger | None,
    amendments: Sequence[Amendment] = (),
    restatements: Sequence[Restatement] = (),
    held: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """``held``: chunks whose lock a live transaction holds (the one-commit placement's lease,
    ADR 0021), shown as running by that holder."""
    states = {
        c.index: (ledger.state_of(c.index).value if ledger else "pending") for c in plan.chunks
    }
    held = moving_held(states, held or {})
    states.update({index: "running" for index in held})
    counts = Counter(states.values())
    leases: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
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
                        "moved_by": attribution(record.lease_owner),
                        "attempt": record.attempt,
                        "expires_at": (
                            record.lease_expires_at.isoformat() if record.lease_expires_at else None
                        ),
                        "expired": expired,
                    }
                )
            elif record.state is ChunkState.FAILED and index not in held:
                failures.append(
                    {
                        "chunk_index": index,
                        "attempt": record.attempt,
                        "error_code": record.error_code,
                        "error_message": (record.error_message or "")[:300],
                    }
                )
    for index, who in sorted(held.items()):
        if ledger is not None and index in ledger.records:
            if ledger.records[index].state is ChunkState.RUNNING:
                continue  # its committed RUNNING record is listed (the split placement)
        leases.append(
            {
                "chunk_index": index,
                "owner": who,
                "attempt": None,
                "expires_at": None,
                "expired": False,
                "in_transaction": True,
            }
        )
    leases.sort(key=lambda lease: lease["chunk_index"])
    restated = restated_chunks(ledger, restatements)
    document: dict[str, Any] = redact_document(
        {
            "schema": STATUS_SCHEMA,
            "airflow_clear": airflow_clear(pack, plan, failures, leases, restated),
            "workload": pack.workload.name,
            "process": plan.name,
            "run_key": plan.run_key,
            "mode": plan.mapping_policy.mode,
            "exists": ledger is not None,
            "as_of": ledger.now.isoformat() if ledger is not None and ledger.now else None,
            "cancelled": bool(ledger and ledger.cancelled),
            "cancel_reason": ledger.cancel_reason if ledger is not None else None,
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
            "moved_by": moved_by(ledger),
            "failures": failures,
            "restated": restated,
            "amendments": [
                {
                    "old_chunk_count": a.old_chunk_count,
                    "new_chunk_count": a.new_chunk_count,
                    "old_plan_hash": a.old_plan_hash,
                    "new_plan_hash": a.new_plan_hash,
                    "amended_by": a.amended_by,
                    "amended_at": a.amended_at.isoformat() if a.amended_at else None,
                }
                for a in amendments
            ],
        }
    )
    return document


def moved_by(ledger: Ledger | None) -> list[dict[str, Any]]:
    """Which Airflow run, try and map index committed or holds each chunk (from its latest
    transition's lease owner), as runs of consecutive chunks that share all three and a state."""
    if ledger is None:
        return []
    groups: list[dict[str, Any]] = []
    for index in sorted(ledger.records):
        record = ledger.records[index]
        if record.state not in (ChunkState.COMMITTED, ChunkState.RUNNING):
            continue
        who = attribution(record.lease_owner)
        last = groups[-1] if groups else None
        if (
            last is not None
            and last["last_chunk_index"] == index - 1
            and last["state"] == record.state.value
            and last["by"] == who
        ):
            last["last_chunk_index"] = index
            continue
        groups.append(
            {
                "first_chunk_index": index,
                "last_chunk_index": index,
                "state": record.state.value,
                "by": who,
            }
        )
    return groups


MOVED_BY_SHOWN = 20


def _chunk_range(group: dict[str, Any]) -> str:
    first, last = group["first_chunk_index"], group["last_chunk_index"]
    return f"chunk {first}" if first == last else f"chunks {first}-{last}"


def _moved_by_verb(group: dict[str, Any]) -> str:
    """A running chunk is not moved yet: its run holds it."""
    return "committed" if group["state"] == "committed" else "held"


def _moved_by_lines(doc: dict[str, Any]) -> list[str]:
    groups = doc.get("moved_by", ())
    lines = []
    for group in groups[:MOVED_BY_SHOWN]:
        lines.append(
            f"  {_moved_by_verb(group)}: {_chunk_range(group)} {describe_attribution(group['by'])}"
        )
    if len(groups) > MOVED_BY_SHOWN:
        lines.append(f"  ... {len(groups) - MOVED_BY_SHOWN} more in --format json (moved_by)")
    return lines


def restated_chunks(
    ledger: Ledger | None, restatements: Sequence[Restatement]
) -> list[dict[str, Any]]:
    """Each restated chunk's latest restatement, and whether it has moved again since."""
    latest: dict[int, Restatement] = {}
    for restatement in restatements:
        latest[restatement.chunk_index] = restatement
    out = []
    for index in sorted(latest):
        r = latest[index]
        state = ledger.state_of(index) if ledger is not None else ChunkState.PENDING
        out.append(
            {
                "chunk_index": index,
                "reason": r.reason,
                "requested_by": r.requested_by,
                "requested_at": r.requested_at.isoformat() if r.requested_at else None,
                "prior_rows": r.prior_rows,
                "prior_checksum": r.prior_checksum,
                "moved_again": state is ChunkState.COMMITTED,
                "times": sum(1 for x in restatements if x.chunk_index == index),
            }
        )
    return out


def airflow_clear(
    pack: WorkloadPack,
    plan: ProcessPlan,
    failures: Sequence[dict[str, Any]],
    leases: Sequence[dict[str, Any]],
    restated: Sequence[dict[str, Any]] = (),
) -> dict[str, Any] | None:
    """What to clear in Airflow to retry the failed and stuck (lease expired) chunks: the map
    indexes of their items and the `airflow tasks clear` command that restarts them.

    Airflow's CLI clears by task and state, not by map index (2.10 and 3.x), so the command
    clears every failed instance of the runtime task; a pod that died holding a lease is failed
    by Airflow too. Clearing more than needed is safe: committed chunks are skipped. None when
    nothing needs a retry.
    """
    failed = {x["chunk_index"] for x in failures}
    stuck = {x["chunk_index"] for x in leases if x["expired"]}
    to_move = {x["chunk_index"] for x in restated if not x["moved_again"]}
    if not failed and not stuck and not to_move:
        return None
    task_id = runtime_task_id(plan)
    command = " ".join(
        [
            "airflow tasks clear",
            shlex.quote(pack.workload.airflow.dag_id),
            "--task-regex",
            shlex.quote(f"^{re.escape(task_id)}$"),
            # the items holding restated chunks succeeded in Airflow: clear those too
            *([] if to_move else ["--only-failed"]),
            "--yes",
        ]
    )

    def items_of(chunks: set[int]) -> list[int]:
        mapping = plan.mapping_plan
        if mapping is None:
            return []
        return [
            item.item_index
            for item in mapping.items
            if any(item.first_chunk_index <= c <= item.last_chunk_index for c in chunks)
        ]

    return {
        "task_id": task_id,
        "failed_map_indexes": items_of(failed),
        "stuck_map_indexes": items_of(stuck),
        "restated_map_indexes": items_of(to_move),
        "command": command,
    }


def _clear_lines(clear: dict[str, Any] | None) -> list[str]:
    if clear is None:
        return []
    parts = []
    if clear["failed_map_indexes"]:
        parts.append("failed map indexes " + ", ".join(map(str, clear["failed_map_indexes"])))
    if clear["stuck_map_indexes"]:
        parts.append(
            "stuck (lease expired) map indexes " + ", ".join(map(str, clear["stuck_map_indexes"]))
        )
    if clear.get("restated_map_indexes"):
        parts.append(
            "map indexes holding restated chunks "
            + ", ".join(map(str, clear["restated_map_indexes"]))
        )
    what = "; ".join(parts) if parts else f"task {clear['task_id']}"
    return [f"  retry in Airflow ({what}):", f"    {clear['command']}"]


RESTATED_SHOWN = 20


def _cancel_flag(doc: dict[str, Any]) -> str:
    reason = doc.get("cancel_reason")
    return f"  [CANCELLED: {reason}]" if reason else "  [CANCELLED]"


def shown(text: str) -> str:
    """``text`` as one printable line: a control or format character (a newline, ESC, a bidi
    override) is shown escaped, so text kept in a ledger row cannot forge a status line or drive
    the terminal; other spaces (a no-break space) are shown as they are."""
    return escape_controls(text)


def _printable(value: Any) -> Any:
    """Every string of a status document through :func:`shown` (the JSON form needs none)."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return {key: _printable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_printable(item) for item in value]
    return value


def render_text(doc: dict[str, Any], colour: bool, glyph: dict[str, str] = GLYPH) -> str:
    def paint(state: str, text: str) -> str:
        return f"\033[{ANSI[state]}m{text}\033[0m" if colour else text

    doc = _printable(doc)  # defence in depth: --by and --reason are checked when stored
    c = doc["counts"]
    lines = [
        f"campaign {doc['run_key']}  ({doc['workload']}/{doc['process']}, mode {doc['mode']})",
        f"  {doc['chunks_total']} chunks: {c['committed']} committed, {c['running']} running, "
        f"{c['failed']} failed, {c['pending']} pending"
        + (_cancel_flag(doc) if doc["cancelled"] else "")
        + ("" if doc["exists"] else "  (no ledger yet: nothing has run)"),
    ]
    width = max((len(g["label"]) for g in doc["items"]), default=0)
    for group in doc["items"]:
        cells = "".join(paint(s, glyph[s]) for s in group["states"])
        done = sum(1 for s in group["states"] if s == "committed")
        lines.append(f"  {group['label']:<{width}}  {cells} {done}/{len(group['states'])}")
    for lease in doc["running_leases"]:
        if lease.get("in_transaction"):
            lines.append(
                f"  lease: chunk {lease['chunk_index']} held by {lease['owner']}: moving in one "
                "transaction (a crash releases it at once)"
            )
            continue
        flag = " (expired: retryable)" if lease["expired"] else ""
        lines.append(
            f"  lease: chunk {lease['chunk_index']} attempt {lease['attempt']} owner "
            f"{lease['owner']} until {lease['expires_at']}{flag}"
        )
    lines.extend(_moved_by_lines(doc))
    for failure in doc["failures"]:
        lines.append(
            f"  failed: chunk {failure['chunk_index']} attempt {failure['attempt']} "
            f"{failure['error_code']}: {failure['error_message']}"
        )
    restated = doc.get("restated", ())
    for entry in restated[:RESTATED_SHOWN]:
        moved = "moved again" if entry["moved_again"] else "to move again"
        lines.append(
            f"  restated: chunk {entry['chunk_index']} at {entry['requested_at']} by "
            f"{entry['requested_by']} ({moved}): {entry['reason']}"
        )
    if len(restated) > RESTATED_SHOWN:
        lines.append(
            f"  ... {len(restated) - RESTATED_SHOWN} more restated chunk(s) in --format json"
        )
    for amendment in doc.get("amendments", ()):
        # the run that extended it, in the words of `moved_by` (the raw owner when older)
        who = attribution(amendment["amended_by"])
        by = describe_attribution(who) if who is not None else f"by {amendment['amended_by']}"
        lines.append(
            f"  extended: {amendment['old_chunk_count']} -> {amendment['new_chunk_count']} "
            f"chunks at {amendment['amended_at']} {by}"
        )
    lines.extend(_clear_lines(doc.get("airflow_clear")))
    legend = "  legend: " + "  ".join(f"{paint(s, glyph[s])} {s}" for s in STATE_COLOURS)
    lines.append(legend)
    return "\n".join(lines) + "\n"


HTML_STYLE = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1f2328;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 6px}h3{font-size:14px;margin:18px 0 6px}
section{margin-bottom:32px}
.meta{color:#57606a;margin:2px 0}.meta code{color:#1f2328}
.banner{background:#fff1f0;border:1px solid #d1302f;color:#82071e;padding:6px 10px;margin:8px 0;border-radius:4px}
.bar{display:flex;height:12px;width:720px;max-width:100%;border-radius:3px;overflow:hidden;margin:8px 0}
.legend span.cell{vertical-align:-2px}.legend{margin:6px 0 10px}
.grid{display:grid;grid-template-columns:max-content max-content 1fr;gap:2px 12px;align-items:center}
.group{display:contents}
.label{font:12px ui-monospace,monospace;white-space:nowrap}
.cells{display:flex;flex-wrap:wrap;gap:2px;max-width:820px}
.cell{display:inline-block;width:14px;height:14px;border-radius:2px}
.cell.expired{box-shadow:inset 0 0 0 2px #1f2328}
.done{font:12px ui-monospace,monospace;color:#57606a;text-align:right}
table{border-collapse:collapse}td,th{border:1px solid #d0d7de;padding:3px 8px;font-size:12px;text-align:left}
th{background:#f6f8fa}td.code{font-family:ui-monospace,monospace}
.none{color:#57606a;font-size:12px}
footer{color:#57606a;font-size:12px;margin-top:24px}
"""


def _html_moved_by(doc: dict[str, Any]) -> str:
    """Who moved (or holds) each run of chunks, as the text's `committed:` lines say it: the
    Airflow run, try and map index, or outside Airflow; every run, not only the text's first 20.
    Stored strings go through :func:`shown` too, so a run id cannot reorder the line."""
    e = html.escape
    rows = []
    for group in doc.get("moved_by", ()):
        by = group["by"]
        if by is None:
            who = '<td colspan="3">an unrecorded run (written before dpone recorded it)</td>'
        elif by["outside_airflow"]:
            who = '<td colspan="3">outside Airflow</td>'
        else:
            who = (
                f'<td class="code">{e(shown(str(by["run_id"])))}</td>'
                f"<td>{e(str(by['try_number']))}</td><td>{e(str(by['map_index']))}</td>"
            )
        first, last = group["first_chunk_index"], group["last_chunk_index"]
        chunks = str(first) if first == last else f"{first}-{last}"
        rows.append(f"<tr><td>{chunks}</td><td>{_moved_by_verb(group)}</td>{who}</tr>")
    table = (
        "<table><tr><th>chunks</th><th>state</th><th>Airflow run</th><th>try</th>"
        f"<th>map index</th></tr>{''.join(rows)}</table>"
        if rows
        else '<p class="none">none</p>'
    )
    return f"<h3>Who moved the chunks</h3>\n{table}"


def _html_grouping(doc: dict[str, Any]) -> str:
    """How the campaign runs in Airflow: its mapped items (map indexes), or one runtime task for
    an internal campaign; the grid's rows of 50 chunks are layout, not a figure (nor rows moved)."""
    if doc["mode"] == "internal":
        return " · one runtime task"
    items = len(doc["items"])
    return f" · {items} mapped item{'' if items == 1 else 's'}"


def _html_section(doc: dict[str, Any]) -> str:
    e = html.escape
    c = doc["counts"]
    total = max(doc["chunks_total"], 1)
    expired = {x["chunk_index"] for x in doc["running_leases"] if x["expired"]}
    rows = []
    for group in doc["items"]:
        cells = []
        for offset, state in enumerate(group["states"]):
            index = group["first_chunk_index"] + offset
            extra = " expired" if index in expired else ""
            tip = f"chunk {index}: {state}" + (" (lease expired)" if extra else "")
            cells.append(f'<span class="cell {state}{extra}" title="{tip}"></span>')
        done = sum(1 for s in group["states"] if s == "committed")
        rows.append(
            f'<div class="group"><div class="label" title="{e(group["label"])}">'
            f'{e(group["label"])}</div><div class="done">{done}/{len(group["states"])}</div>'
            f'<div class="cells">{"".join(cells)}</div></div>'
        )
    bar = "".join(
        f'<span class="{s}" style="width:{100 * c[s] / total:.3f}%" title="{s}: {c[s]}"></span>'
        for s in STATE_COLOURS
        if c[s]
    )
    legend = " &nbsp; ".join(
        f'<span class="cell {s}"></span> {s} <b>{c[s]}</b>' for s in STATE_COLOURS
    )
    leases = "".join(
        f"<tr><td>{x['chunk_index']}</td><td>{x['attempt'] or '-'}</td>"
        f'<td class="code">{e(str(x["owner"]))}</td>'
        f'<td>{e(str(x["expires_at"] or "while its transaction lives"))}</td>'
        f"<td>{'yes: retryable' if x['expired'] else 'no'}</td></tr>"
        for x in doc["running_leases"]
    )
    failures = "".join(
        f"<tr><td>{x['chunk_index']}</td><td>{x['attempt']}</td>"
        f'<td class="code">{e(str(x["error_code"]))}</td><td>{e(x["error_message"])}</td></tr>'
        for x in doc["failures"]
    )
    lease_table = (
        "<table><tr><th>chunk</th><th>attempt</th><th>owner</th><th>expires at "
        f"(database clock)</th><th>expired</th></tr>{leases}</table>"
        if leases
        else '<p class="none">none</p>'
    )
    failure_table = (
        "<table><tr><th>chunk</th><th>attempt</th><th>code</th><th>message</th></tr>"
        f"{failures}</table>"
        if failures
        else '<p class="none">none</p>'
    )
    banner = ""
    if doc["cancelled"]:
        banner = (
            '<p class="banner">This campaign is <b>cancelled</b>'
            + (f" ({e(doc['cancel_reason'])})" if doc.get("cancel_reason") else "")
            + ": no new chunk starts until <code>dpone ledger cancel --undo</code>.</p>"
        )
    elif not doc["exists"]:
        banner = '<p class="meta">No ledger yet: nothing has run for this campaign.</p>'
    extensions = "".join(
        f"<tr><td>{x['old_chunk_count']} &rarr; {x['new_chunk_count']}</td>"
        f"<td>{e(str(x['amended_at']))}</td><td class=\"code\">{e(str(x['amended_by']))}</td>"
        f'<td class="code">{e(x["old_plan_hash"])} &rarr; {e(x["new_plan_hash"])}</td></tr>'
        for x in doc.get("amendments", ())
    )
    restated_rows = "".join(
        f"<tr><td>{x['chunk_index']}</td><td>{e(str(x['requested_at']))}</td>"
        f'<td class="code">{e(str(x["requested_by"]))}</td><td>{e(x["reason"])}</td>'
        f"<td>{'moved again' if x['moved_again'] else 'to move again'}</td></tr>"
        for x in doc.get("restated", ())
    )
    restated_table = (
        f"<h3>Restated chunks ({len(doc.get('restated', ()))})</h3><table><tr><th>chunk</th>"
        "<th>when (database clock)</th><th>by</th><th>reason</th><th>now</th></tr>"
        f"{restated_rows}</table>"
        if restated_rows
        else ""
    )
    extension_table = (
        "<h3>Extensions</h3><table><tr><th>chunks</th><th>when (database clock)</th>"
        f"<th>by run</th><th>plan hash</th></tr>{extensions}</table>"
        if extensions
        else ""
    )
    clear = doc.get("airflow_clear")
    retry = (
        f'<h3>Retry in Airflow</h3><p class="meta">{e(_clear_lines(clear)[0].strip())}</p>'
        f"<pre>{e(clear['command'])}</pre>"
        if clear
        else ""
    )
    as_of = f", as of {e(doc['as_of'])}" if doc.get("as_of") else ""
    return f"""<section>
<h1>{e(doc['workload'])} / {e(doc['process'])}</h1>
<p class="meta">campaign <code>{e(str(doc['run_key']))}</code> · mode <b>{e(doc['mode'])}</b> · {doc['chunks_total']} chunk{'' if doc['chunks_total'] == 1 else 's'}{_html_grouping(doc)}{as_of}</p>
{banner}<div class="bar">{bar}</div>
<p class="legend">{legend}</p>
<div class="grid">{''.join(rows)}</div>
<h3>Running leases ({len(doc['running_leases'])})</h3>
{lease_table}
{_html_moved_by(doc)}
<h3>Failures ({len(doc['failures'])})</h3>
{failure_table}
{restated_table}{extension_table}{retry}</section>"""


def render_html_page(docs: Sequence[dict[str, Any]]) -> str:
    """One self-contained page (inline CSS, no script, no external asset) for one or more
    processes: a coloured cell per chunk grouped by mapped item, counts, leases, who moved the
    chunks, failures."""
    style = HTML_STYLE + "".join(f".{s}{{background:{col}}}" for s, col in STATE_COLOURS.items())
    title = ", ".join(f"{d['workload']}/{d['process']}" for d in docs) or "no campaign"
    sections = "\n".join(_html_section(doc) for doc in docs)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<title>dpone ledger status: {html.escape(title)}</title>
<style>{style}</style></head><body>
{sections}
<footer>Written by <code>dpone ledger status --html</code>. The dpone ledger, not Airflow, decides what is committed.</footer>
</body></html>
"""


def render_html(doc: dict[str, Any]) -> str:
    """The page for one process (see render_html_page)."""
    return render_html_page([doc])


def _open_store(plan: ProcessPlan, read_only: bool = False) -> LedgerStore:
    from dpone.credentials.connections import resolve_dsn
    from dpone.ledger.factory import open_store

    state = plan.config.state
    dsn = resolve_dsn(state.connection) if state.connection else None
    # a local_file reader opens its files read-only and waits a bounded time for a writer
    options = {"read_only": True} if read_only and state.backend == "local_file" else {}
    store: LedgerStore = open_store(
        state.backend, dsn=dsn, schema=state.schema, path=state.path, **options
    )
    return store


def _open_existing(plan: ProcessPlan, read_only: bool = False) -> LedgerStore | None:
    """The process's ledger, or None when there is none yet: status, cancel and restate never
    create one (an audit schema of seven tables, or an empty journal) only to say it is empty;
    status reads a local_file ledger read-only (a read-only folder, a lock another holds)."""
    from dpone.credentials.connections import resolve_dsn
    from dpone.ledger.factory import open_store

    state = plan.config.state
    if state.backend == "local_file" and state.path:
        if not Path(state.path).exists() and not Path(state.path + ".journal").exists():
            existing = next(p for p in Path(state.path).absolute().parents if p.exists())
            if existing.is_dir():
                return None  # else a file stands in the way: the store names the problem
        else:
            return _open_store(plan, read_only)
    elif state.backend == "audit_schema" and state.connection:
        dsn = resolve_dsn(state.connection)
        try:
            probe = open_store("audit_schema", dsn, state.schema, None, create=False)
        except DponeError as exc:
            if exc.code != errors.LEDGER_UNAVAILABLE:
                raise
            return _open_store(plan)  # an older schema: migrated as a run would, or refused
        if getattr(probe, "absent", False):
            probe.close()
            return None
        return probe
    return _open_store(plan)


def _check_html_target(path: str) -> None:
    """Prove --html writable before the ledger is read: a missing folder, a folder as the file
    or a read-only place is DPONE_OUTPUT_UNWRITABLE, not a traceback after the status printed."""
    target = Path(path)
    try:
        if target.is_dir():
            raise IsADirectoryError(21, "a folder, not a file")
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".dpone-probe-"):
            pass
    except OSError as exc:
        raise _html_unwritable(path, exc) from None


def _html_unwritable(path: str, exc: OSError) -> DponeError:
    return DponeError(
        errors.OUTPUT_UNWRITABLE,
        f"--html {path!r} cannot be written ({type(exc).__name__}: {exc.strerror or 'error'}); "
        "nothing was written",
    )


def _write_html(path: str, page: str) -> None:
    """Never a half-written page: written beside it, then renamed over it."""
    try:
        write_text_atomic(Path(path), page)
    except OSError as exc:
        raise _html_unwritable(path, exc) from None


def _plans(pack: WorkloadPack, process: str | None) -> list[ProcessPlan]:
    """The workload's chunked processes (--process: that one): only they keep a campaign in
    the ledger. A workload with none (every process a full_refresh) is a usage error, never a
    silent exit 0 with nothing shown, cancelled or restated."""
    plans = [p for p in pack.processes if p.run_key is not None]
    if not plans:
        names = ", ".join(repr(p.name) for p in pack.processes)
        raise DponeError(
            errors.USAGE,
            f"workload {pack.workload.name!r} has no chunked process ({names}: full_refresh, "
            "moved whole by each run): it keeps no campaign in the ledger, so there is nothing "
            "to show, cancel or restate",
        )
    if process is not None:
        chunked = [p.name for p in plans]
        plans = [p for p in plans if p.name == process]
        if not plans:
            where = f"the chunked processes of {pack.workload.name!r}"
            raise DponeError(errors.USAGE, not_in("process", process, where, chunked))
    return plans


REASON_MAX = 500


#: what a stored argument may not hold (a control, format, surrogate or line/paragraph break
#: character: each could forge a line or reorder the text a status page shows); spaces such as
#: U+00A0 are text
_UNSAFE_IN_A_LINE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def cancel_reason(text: str) -> str:
    """--reason: printable UTF-8 text of at most REASON_MAX characters (it is stored in the ledger
    and shown by status pages); undecodable bytes and control characters are usage errors."""
    return _stored_argument(text, "the reason")


def requester(text: str) -> str:
    """restate --by: checked as --reason is, since it is stored and shown beside it (a newline
    or an ESC sequence in it would forge a `ledger status` line)."""
    return _stored_argument(text, "--by")


def _stored_argument(text: str, what: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{what} is not valid UTF-8") from None
    if len(text) > REASON_MAX:
        raise argparse.ArgumentTypeError(
            f"{what} has {len(text)} characters; at most {REASON_MAX} are kept"
        )
    unsafe = next((ch for ch in text if unicodedata.category(ch) in _UNSAFE_IN_A_LINE), None)
    if unsafe is not None:
        raise argparse.ArgumentTypeError(
            f"{what} contains U+{ord(unsafe):04X}, a control, format or line-break character"
        )
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{what} is empty")
    return text


LEDGER_ACTIONS = (
    (
        "status",
        "show a campaign's chunks, running leases and failures, as the ledger records them",
        "dpone ledger status --catalog golden/internal_default/workloads.yaml "
        "--workload orders_history --html campaign.html",
    ),
    (
        "cancel",
        "cancel a campaign: running items finish their current chunk and start no new one",
        "dpone ledger cancel --catalog golden/internal_default/workloads.yaml "
        "--workload orders_history --reason 'wrong source table'",
    ),
    (
        "restate",
        "mark committed chunks of one process to be moved again by the next run (reason kept)",
        "dpone ledger restate --catalog golden/internal_default/workloads.yaml "
        "--workload orders_history --chunks 3-5 --reason 'source corrected on 3 May'",
    ),
    (
        "list",
        "list every campaign in a ledger: workload, process, mode, chunks by state, last activity",
        "dpone ledger list --connection warehouse --schema dpone_audit",
    ),
)


def _list_campaigns(args: argparse.Namespace) -> int:
    from dpone.campaign.campaigns import list_document
    from dpone.campaign.campaigns import render_text as render_list
    from dpone.credentials.connections import resolve_dsn
    from dpone.ledger.factory import open_store
    from dpone.ledger.sql import DEFAULT_SCHEMA

    if (args.connection is None) == (args.path is None):
        raise DponeError(
            errors.USAGE,
            "dpone ledger list needs exactly one of --connection (audit_schema) or --path "
            "(local_file)",
        )
    modes: dict[str, str] = {}
    if args.catalog is not None:
        from dpone.packing.pack import load_and_compile

        _, packs, problems = load_and_compile(args.catalog)
        if problems:
            raise DponeError.from_records(problems)
        modes = {
            p.run_key: p.mapping_policy.mode
            for pack in packs
            for p in pack.processes
            if p.run_key is not None
        }
    if args.connection is not None:
        if args.schema is not None and not args.schema.strip():
            raise DponeError(
                errors.USAGE,
                f"--schema {args.schema!r} is empty: name the audit schema, or leave --schema "
                f"out for the default {DEFAULT_SCHEMA}",
            )
        schema = args.schema or DEFAULT_SCHEMA
        # read-only: listing never creates or migrates a ledger (no schema: no campaigns)
        store = open_store("audit_schema", resolve_dsn(args.connection), schema, None, create=False)
        where = f"{args.connection} schema {schema}"
    else:
        if args.schema is not None:
            raise DponeError(errors.USAGE, "--schema goes with --connection, not with --path")
        _require_ledger_file(args.path)
        store = open_store("local_file", None, None, args.path, read_only=True)
        where = args.path
    try:
        doc = list_document(store, where, args.workload, modes)
    finally:
        store.close()
    if args.format == "json":
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render_list(doc), end="")
    return 0


def _require_ledger_file(path: str) -> None:
    """--path names a local_file ledger: a file (or its journal), not a folder."""
    given = Path(path)
    if given.is_dir():
        raise DponeError(
            errors.USAGE,
            f"--path {path!r} is a folder: give the local_file ledger's file (state.path)",
        )
    if not Path(path + ".journal").exists() and not given.exists():
        raise DponeError(errors.USAGE, f"no local_file ledger at {path!r}")


def ledger_command(argv: Sequence[str], parser_class: type[argparse.ArgumentParser]) -> int:
    parser = parser_class(
        prog="dpone ledger",
        description="Show, cancel, restate or list the campaigns of a ledger.",
        epilog="examples:\n  dpone ledger status --catalog workloads.yaml --workload orders_history\n"
        "  dpone ledger status --catalog workloads.yaml --workload orders_history --html campaign.html\n"
        "  dpone ledger cancel --catalog workloads.yaml --workload orders_history --reason 'bad source'\n"
        "  dpone ledger restate --catalog workloads.yaml --workload orders_history --chunks 3-5 "
        "--reason 'source fixed'\n"
        "  dpone ledger list --connection warehouse",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="action", required=True)
    for name, summary, example in LEDGER_ACTIONS:
        p = sub.add_parser(
            name,
            help=summary,
            description=summary,
            epilog=f"example:\n  {example}\nexit codes: docs/cli.md",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name == "list":
            p.add_argument("--connection", help="the audit_schema ledger's connection name")
            p.add_argument("--schema", help="its audit schema (default dpone_audit)")
            p.add_argument("--path", help="or: the path of a local_file ledger")
            p.add_argument("--catalog", help="a catalog, to show each campaign's mode")
            p.add_argument("--workload", help="only this workload's campaigns")
            p.add_argument(
                "--format", choices=("text", "json"), default="text", help="output (text)"
            )
            continue
        p.add_argument("--catalog", required=True, help="path of the workload catalog")
        p.add_argument("--workload", required=True, help="workload name in the catalog")
        p.add_argument(
            "--process",
            help=(
                "the process to restate (needed when the workload has several chunked processes)"
                if name == "restate"
                else "only this process (default: every chunked process)"
            ),
        )
        if name == "status":
            p.add_argument(
                "--format", choices=("text", "json"), default="text", help="output (text)"
            )
            p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page")
        elif name == "restate":
            p.add_argument("--chunks", metavar="RANGES", help="chunks to restate: 3-5, 7 or 1-5,9")
            p.add_argument("--from", dest="start", metavar="T", help="or: chunks overlapping [T,")
            p.add_argument("--to", dest="end", metavar="T", help="... T) of the chunk column")
            p.add_argument(
                "--reason",
                type=cancel_reason,
                required=True,
                help=f"why, recorded with each restated chunk (at most {REASON_MAX} characters)",
            )
            p.add_argument(
                "--by",
                type=requester,
                help=f"who asked (default: user@host; at most {REASON_MAX} characters of text)",
            )
            p.add_argument(
                "--dry-run", action="store_true", help="show what would change, change nothing"
            )
            p.add_argument(
                "--format", choices=("text", "json"), default="text", help="output (text)"
            )
        else:
            p.add_argument(
                "--reason",
                type=cancel_reason,
                default="cancelled by operator",
                help=f"recorded with the cancellation (at most {REASON_MAX} characters of text)",
            )
            p.add_argument("--undo", action="store_true", help="lift a cancellation")
            p.add_argument(
                "--by",
                type=requester,
                help=f"who asked (default: user@host; at most {REASON_MAX} characters of text)",
            )
    args = parser.parse_args(list(argv))
    if args.action == "list":
        return _list_campaigns(args)
    pack = load_workload_pack(args.catalog, args.workload)
    plans = _plans(pack, args.process)
    if args.action == "restate":
        from dpone.campaign.restate import restate_command

        return restate_command(args, pack, plans, _open_existing)
    if args.action == "cancel":
        for plan in plans:
            store = _open_existing(plan)
            if store is None:
                raise DponeError(
                    errors.USAGE,
                    f"campaign {plan.run_key!r} ({plan.name}) is not in the ledger: nothing ran, "
                    "nothing to cancel",
                )
            try:
                assert plan.run_key is not None
                # the campaign read whole first, as status and run read it: a ledger they refuse
                # (corrupt, another plan's) is not written to either
                ledger = store.load(plan.run_key)
                if ledger is not None:
                    _require_same_campaign(pack, plan, ledger)
                who = requested_by(args.by)
                changed = store.cancel(plan.run_key, args.reason, undo=args.undo, by=who)
            finally:
                store.close()
            if not changed:
                print(
                    f"dpone: campaign {plan.run_key} ({plan.name}) is not cancelled: nothing to resume"
                )
                continue
            verb = "resumed" if args.undo else "cancelled"
            print(redact_text(f"dpone: campaign {plan.run_key} ({plan.name}) {verb} by {who}"))
        return 0
    if args.html:
        _check_html_target(args.html)
    docs = []
    for plan in plans:
        store = _open_existing(plan, read_only=True)
        if store is None:
            docs.append(status_document(pack, plan, None, [], [], {}))
            continue
        try:
            assert plan.run_key is not None
            ledger = store.load(plan.run_key)
            if ledger is not None:
                _require_same_campaign(pack, plan, ledger)
            amendments = store.amendments(plan.run_key) if ledger is not None else []
            restatements = store.restatements(plan.run_key) if ledger is not None else []
            holders = getattr(store, "chunk_lock_holders", None)
            held = holders(plan.run_key) if holders is not None and ledger is not None else {}
        finally:
            store.close()
        docs.append(status_document(pack, plan, ledger, amendments, restatements, held))
    if args.format == "json":
        print(json.dumps(docs if len(docs) != 1 else docs[0], indent=2, sort_keys=True))
    else:
        colour = use_colour(sys.stdout)
        glyph = glyphs_for(sys.stdout)
        print("".join(render_text(doc, colour, glyph) for doc in docs), end="")
    if args.html:
        _write_html(args.html, render_html_page(docs))
        print(f"dpone: wrote {args.html}", file=sys.stderr)
    return 0
