"""`dpone ledger list`: every campaign one ledger holds, without the catalog that made them.

An operator who inherits a ledger (or cleans one up) needs to see what is in it: each campaign's
workload and process, its chunks by state, whether it is cancelled and when anything last
happened. The ledger does not record the Airflow mode (internal, visible, summary), so that column
comes from ``--catalog`` when given and is ``null`` otherwise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from dpone.credentials.redaction import redact_document
from dpone.ledger.port import ChunkState, Ledger, LedgerStore
from dpone.observability.exporting import escape_controls

LIST_SCHEMA = "dpone.ledger-list.v1"
STATES = ("committed", "running", "failed", "pending")


def moving_held(states: Mapping[int, str], held: Mapping[int, str]) -> dict[int, str]:
    """The chunks of ``held`` (whose lock a live transaction holds: the one-commit placement's
    lease, ADR 0021) that are not committed, with their holders: those are being moved now, and
    `ledger status` and `ledger list` count them as running."""
    return {i: who for i, who in held.items() if states.get(i, "committed") != "committed"}


def campaign_summary(
    ledger: Ledger, mode: str | None, held: Mapping[int, str] | None = None
) -> dict[str, Any]:
    """One campaign's row; ``held``: see moving_held."""
    shape = ledger.shape
    states = {chunk.index: ledger.state_of(chunk.index).value for chunk in shape.chunks}
    states.update({i: "running" for i in moving_held(states, held or {})})
    counts = Counter(states.values())
    stuck = sum(
        1
        for record in ledger.records.values()
        if record.state is ChunkState.RUNNING
        and ledger.now is not None
        and record.lease_expires_at is not None
        and record.lease_expires_at <= ledger.now
    )
    stamps = [r.recorded_at for r in ledger.records.values() if r.recorded_at is not None]
    return {
        "run_key": shape.run_key,
        "workload": shape.workload,
        "process": shape.process,
        "mode": mode,
        "chunks_total": shape.chunk_count,
        "counts": {state: counts.get(state, 0) for state in STATES},
        "expired_leases": stuck,
        "complete": ledger.complete,
        "cancelled": ledger.cancelled,
        "cancel_reason": ledger.cancel_reason,
        "last_activity": max(stamps).isoformat() if stamps else None,
    }


def list_document(
    store: LedgerStore, where: str, workload: str | None, modes: Mapping[str, str]
) -> dict[str, Any]:
    """Every campaign of ``store`` (of one workload when given), most recent activity first;
    ``where`` names the ledger for people, ``modes`` maps run keys to a catalog's modes."""
    campaigns = []
    holders = getattr(store, "chunk_lock_holders", None)
    for run_key in store.list_campaigns(workload):
        ledger = store.load(run_key)
        if ledger is not None:
            held = holders(run_key) if holders is not None else {}
            campaigns.append(campaign_summary(ledger, modes.get(run_key), held))
    campaigns.sort(key=lambda c: (c["last_activity"] or "", c["run_key"]), reverse=True)
    # a cancel reason is text a ledger row holds: redacted as `ledger status` shows it
    document: dict[str, Any] = redact_document(
        {"schema": LIST_SCHEMA, "ledger": where, "campaigns": campaigns}
    )
    return document


def render_text(doc: dict[str, Any]) -> str:
    rows: list[Sequence[str]] = [
        ("campaign", "workload/process", "mode", "chunks", *STATES, "last activity", "")
    ]
    for c in doc["campaigns"]:
        flags = []
        if c["cancelled"]:
            reason = c.get("cancel_reason")
            flags.append(f"cancelled: {reason}" if reason else "cancelled")
        if c["complete"]:
            flags.append("complete")
        if c["expired_leases"]:
            flags.append(f"{c['expired_leases']} lease(s) expired")
        # each cell one printable line: text a ledger row holds (a cancel reason, a name) cannot
        # forge a row with a newline or drive the terminal with ESC
        rows.append(
            tuple(
                map(
                    escape_controls,
                    (
                        c["run_key"],
                        f"{c['workload']}/{c['process']}",
                        c["mode"] or "?",
                        str(c["chunks_total"]),
                        *(str(c["counts"][s]) for s in STATES),
                        c["last_activity"] or "never",
                        ", ".join(flags),
                    ),
                )
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    count = len(doc["campaigns"])
    lines.append(f"{count} campaign(s) in ledger {doc['ledger']}")
    if any(c["mode"] is None for c in doc["campaigns"]):
        lines.append("mode ?: the ledger does not record it; pass --catalog to show it")
    return "\n".join(lines) + "\n"
