"""`dpone ledger restate`: mark committed chunks of one process to be moved again.

The ledger decides what is committed, so re-moving a range (a source corrected after its chunks
moved) is a ledger transition, not a new campaign: the selected committed chunks get a PENDING
transition with the reason and who asked, under each chunk's lock; the next run moves them under
the usual lease and fence. Refused where moving a chunk again cannot be exact (append), for
chunks a pod is moving now, and for a catalog whose plan is not the stored campaign's.
"""

from __future__ import annotations

import argparse
import functools
import getpass
import json
import os
import re
from collections.abc import Collection, Sequence
from typing import Any

from dpone import errors
from dpone.campaign.reconcile import format_chunk_ranges, parse_chunk_ranges
from dpone.credentials.redaction import redact_document
from dpone.errors import DponeError
from dpone.ledger.amend import check_extension, config_changed
from dpone.ledger.port import CampaignShape, ChunkState, Ledger, LedgerStore
from dpone.packing.pack import ProcessPlan, WorkloadPack, config_hash_at
from dpone.plan.chunks import Bound, ChunkPlanError, canonical_bound

RESTATE_SCHEMA = "dpone.ledger-restate.v1"
EXACT_MODES = {
    "replace": "deletes the chunk's range in the target, then inserts it: exact",
    "full_refresh": "deletes every target row, then inserts the chunk: exact",
    "merge": (
        "upserts on the keys: corrected and added source rows are exact; rows deleted at the "
        "source since the chunk moved stay in the target"
    ),
}


def requested_by(given: str | None) -> str:
    """Who asked: --by, else the operating-system user at this host."""
    if given:
        return given
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{os.uname().nodename}"


def check_exact(plan: ProcessPlan) -> str:
    """What moving a chunk again does in this inner mode, or DPONE_LEDGER_RESTATE_REFUSED."""
    bf = plan.config.backfill
    assert bf is not None
    note = EXACT_MODES.get(bf.inner_mode)
    if note is None:
        raise DponeError(
            errors.RESTATE_REFUSED,
            f"process {plan.name!r}: inner_mode {bf.inner_mode} inserts a chunk's rows without "
            "removing the ones moved before, so moving a chunk again would duplicate them; "
            "restate is for replace, merge and full_refresh (move a corrected range with "
            "replace under a new backfill_id instead)",
        )
    return note


def select_by_time(plan: ProcessPlan, start: str, end: str) -> list[int]:
    """The chunks overlapping [start, end) of the chunk column (whole chunks: a chunk moves
    whole)."""
    bf = plan.config.backfill
    assert bf is not None
    bounds: list[Bound] = []
    for flag, value in (("--from", start), ("--to", end)):
        try:
            bounds.append(canonical_bound(bf.chunk.type, _typed(bf.chunk.type, value)))
        except ChunkPlanError as exc:
            raise DponeError(errors.USAGE, f"{flag} {value!r}: {exc}") from None
    low, high = bounds
    if not _before(low, high):
        raise DponeError(errors.USAGE, f"--from {low} is not before --to {high}")
    picked = [c.index for c in plan.chunks if _before(c.start, high) and _before(low, c.end)]
    if not picked:
        raise DponeError(
            errors.USAGE,
            f"no chunk of process {plan.name!r} overlaps [{low}, {high}) (the campaign covers "
            f"[{plan.chunks[0].start}, {plan.chunks[-1].end}))",
        )
    return picked


#: an integer bound as the manifest writes one: ASCII digits, an optional minus sign; int()
#: alone would also take "+5", "1_000", " 5" and digits of other scripts ("٣")
_INTEGER = re.compile(r"-?[0-9]+")


def _typed(type_: str, value: str) -> object:
    if type_ != "integer" or not _INTEGER.fullmatch(value):
        return value  # canonical_bound names the problem
    try:
        return int(value)
    except ValueError:  # more digits than Python converts
        return value


def _before(a: Bound, b: Bound) -> bool:
    """Canonical bounds of one type order as they compare (ISO text, or integers)."""
    return a < b  # type: ignore[operator]


def stored_shape(pack: WorkloadPack, plan: ProcessPlan, ledger: Ledger | None) -> CampaignShape:
    """The campaign the ledger holds for ``plan``: refused when it has none, holds another
    configuration, or a plan the catalog neither equals nor extends (DPONE_LEDGER_SHAPE_MISMATCH,
    as `dpone run` refuses it). A catalog that extends it (a later end not run yet) restates the
    stored chunks, which are its first ones; the added chunks are not committed."""
    if ledger is None:
        raise not_in_ledger(plan)
    if ledger.shape.plan_hash == plan.backfill_plan_hash:
        if ledger.shape.config_hash != plan.config_hash:
            raise config_changed(plan.run_key or plan.name)
        return ledger.shape
    assert plan.run_key is not None and plan.backfill_plan_hash is not None
    planned = CampaignShape(
        run_key=plan.run_key,
        workload=pack.workload.name,
        process=plan.name,
        plan_hash=plan.backfill_plan_hash,
        config_hash=plan.config_hash,
        chunks=plan.chunks,
    )
    at = functools.partial(config_hash_at, plan.config)
    check_extension(ledger.shape, ledger.shape.config_hash, planned, at)
    return ledger.shape


def not_in_ledger(plan: ProcessPlan) -> DponeError:
    return DponeError(
        errors.USAGE,
        f"campaign {plan.run_key!r} ({plan.name}) is not in the ledger: nothing ran, nothing "
        "to restate",
    )


def preview(
    ledger: Ledger, indexes: Sequence[int], held: Collection[int] = ()
) -> dict[str, list[int]]:
    """What a restatement of ``indexes`` would do now (read without locks: a dry run);
    ``held``: the chunks whose lock a run's open transaction holds now (the one-commit
    placement moves a chunk with no committed RUNNING record)."""
    now = ledger.now
    out: dict[str, list[int]] = {"restate": [], "leased_now": [], "not_committed": []}
    for index in sorted(set(indexes)):
        record = ledger.records.get(index)
        if index in held:
            out["leased_now"].append(index)
        elif record is not None and record.state is ChunkState.COMMITTED:
            out["restate"].append(index)
        elif record is not None and record.state is ChunkState.RUNNING:
            live = record.lease_expires_at is not None and (
                now is None or record.lease_expires_at > now
            )
            # an expired lease is restated: its attempt may still wake and try to complete
            out["leased_now" if live else "restate"].append(index)
        else:
            out["not_committed"].append(index)
    return out


def restate_command(
    args: argparse.Namespace, pack: WorkloadPack, plans: Sequence[ProcessPlan], store_for: Any
) -> int:
    """Run `dpone ledger restate` for the one selected process (see the module doc)."""
    if len(plans) != 1:
        names = ", ".join(p.name for p in plans)
        raise DponeError(errors.USAGE, f"restate one process at a time: --process ({names})")
    (plan,) = plans
    if (args.chunks is None) == (args.start is None and args.end is None):
        raise DponeError(errors.USAGE, "give --chunks RANGES, or --from T and --to T")
    if args.chunks is None and (args.start is None or args.end is None):
        raise DponeError(errors.USAGE, "--from and --to go together")
    note = check_exact(plan)
    assert plan.config.backfill is not None
    if args.chunks is not None:
        indexes = parse_chunk_ranges(args.chunks, plan.chunks_total)
    else:
        indexes = select_by_time(plan, args.start, args.end)
    who = requested_by(args.by)
    store: LedgerStore | None = store_for(plan)  # None: no ledger yet, and none is created
    if store is None:
        raise not_in_ledger(plan)
    try:
        assert plan.run_key is not None
        ledger = store.load(plan.run_key)
        shape = stored_shape(pack, plan, ledger)
        assert ledger is not None
        holders = getattr(store, "chunk_lock_holders", None)
        held = holders(plan.run_key) if holders is not None and args.dry_run else {}
        would = preview(ledger, indexes, held)
        restated = would["restate"]
        stored = [index for index in indexes if index <= shape.chunk_count]
        if not args.dry_run and stored:
            restated = store.restate(shape, stored, args.reason, who)
        elif not args.dry_run:
            restated = []  # only chunks an extension adds: none is stored, none committed
    finally:
        store.close()
    # the reason and --by are the user's text: a secret typed into them is printed as the ledger
    # stores it (redacted), never as typed
    doc = redact_document(
        {
            "schema": RESTATE_SCHEMA,
            "dry_run": bool(args.dry_run),
            "workload": pack.workload.name,
            "process": plan.name,
            "run_key": plan.run_key,
            "selected": sorted(set(indexes)),
            "restated": restated,
            # a restatement that went through found no chunk leased (it refuses otherwise)
            "leased_now": would["leased_now"] if args.dry_run else [],
            "not_committed": (
                [i for i in sorted(set(indexes)) if i not in restated]
                if not args.dry_run
                else would["not_committed"]
            ),
            "reason": args.reason,
            "requested_by": who,
            "inner_mode": plan.config.backfill.inner_mode,
            "moving_again": note,
            # a cancelled campaign starts no chunk: the restated ones wait for `cancel --undo`
            "cancelled": bool(ledger.cancelled),
        }
    )
    if args.format == "json":
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render_text(doc), end="")
    return 0


def render_text(doc: dict[str, Any]) -> str:
    verb = "would restate" if doc["dry_run"] else "restated"
    lines = [
        f"dpone: {verb} {len(doc['restated'])} chunk(s) of campaign {doc['run_key']} "
        f"({doc['workload']}/{doc['process']})"
        + (f": chunks {format_chunk_ranges(doc['restated'])}" if doc["restated"] else "")
    ]
    if doc["not_committed"]:
        lines.append(
            f"  not committed (they move on the next run anyway): chunks "
            f"{format_chunk_ranges(doc['not_committed'])}"
        )
    if doc["leased_now"]:
        lines.append(
            f"  leased now (a restatement is refused until they commit): chunks "
            f"{format_chunk_ranges(doc['leased_now'])}"
        )
    lines.append(f"  reason: {doc['reason']} (by {doc['requested_by']})")
    lines.append(f"  moving again ({doc['inner_mode']}): {doc['moving_again']}")
    if doc["cancelled"]:
        lines.append(
            "  the campaign is cancelled: no chunk moves, these included, until "
            "`dpone ledger cancel --undo`"
        )
    if doc["restated"] and not doc["dry_run"]:
        lines.append(
            "  next: "
            + ("lift the cancellation, then " if doc["cancelled"] else "")
            + "run the campaign again (internal), or clear its mapped items; "
            "`dpone ledger status` prints the `airflow tasks clear` command"
        )
    return "\n".join(lines) + "\n"
