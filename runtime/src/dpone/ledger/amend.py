"""When a grown plan extends the stored campaign, and, when it does not, why (ADR 0020).

A campaign is its run_key; its chunks are keyed by index, and a chunk's idempotency key hashes the
run_key, the index and the bounds. A plan therefore extends the stored campaign only when the
stored chunks are, index for index, the plan's first chunks (same bounds, same keys) and the plan
has more of them: a later end on the same grid under the same run_key (a pinned backfill_id; a
derived run_key hashes the window, so a new end is a new key). Shared by every store, so the
three cannot disagree on what an extension is.
"""

from __future__ import annotations

from dpone import errors
from dpone.errors import DponeError
from dpone.ledger.port import CampaignShape, ConfigHashAt
from dpone.plan.chunks import Chunk

WAY_OUT = (
    "restore the stored window, or start a new campaign under a new backfill_id "
    "(docs/runbook.md 'Extend a backfill', docs/adr/0020-extend-a-campaign.md)"
)


def config_changed(run_key: str) -> DponeError:
    """DPONE_LEDGER_SHAPE_MISMATCH for a catalog that plans the stored chunks under another
    configuration: a campaign's chunks were committed under one source, sink and inner mode."""
    return DponeError(
        errors.LEDGER_SHAPE_MISMATCH,
        f"campaign {run_key!r}: the catalog plans the stored chunks, but its source, sink, merge "
        "keys, chunk column, chunk step or unit (also when another spelling gives the same "
        "chunks, such as 120 minutes for 2 hours) or inner mode changed since the campaign "
        "started (its config_hash differs): the committed chunks were moved under the stored configuration; restore it, "
        "or start a new campaign under a new backfill_id (docs/runbook.md 'Extend a backfill')",
    )


def _bounds(chunk: Chunk) -> str:
    return f"[{chunk.start}, {chunk.end})"


def _window(shape: CampaignShape) -> str:
    return f"[{shape.chunks[0].start}, {shape.chunks[-1].end})"


def extension_refusal(stored: CampaignShape, planned: CampaignShape) -> str | None:
    """None when ``planned`` extends ``stored``; else why it does not, in words."""
    old, new = stored.chunks, planned.chunks
    if new[: len(old)] == old and len(new) > len(old):
        return None
    if old[0].start != new[0].start:
        return (
            f"the window starts at {new[0].start}, the stored campaign at {old[0].start}: a moved "
            "start shifts every chunk's index, so it is never an extension (move an earlier "
            "range as a campaign of its own)"
        )
    index = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), None)
    if len(new) < len(old) and (
        index is None or (index == len(new) - 1 and old[index].start == new[index].start)
    ):  # the stored chunks cut short (the new last one perhaps clipped): not another grid
        return (
            f"the plan has {len(new)} chunks, the stored campaign {len(old)}: a campaign never "
            "shrinks (its committed chunks stay committed)"
        )
    assert index is not None  # a plan with the stored chunks and more extends them
    was, now = old[index], new[index]
    if index == len(old) - 1 and was.start == now.start and was.end != now.end:
        return (
            f"the stored last chunk {index + 1} {_bounds(was)} was clipped to the old end, which "
            f"is not on the chunk grid (the grown plan has {_bounds(now)}): extend from an end on "
            "the grid only"
        )
    if (was.start, was.end) != (now.start, now.end):
        return (
            f"chunk {index + 1} is {_bounds(was)} in the stored campaign and {_bounds(now)} in the "
            "plan: the chunk grid changed (type, unit, step or anchor)"
        )
    return (
        f"chunk {index + 1} has another idempotency key than the stored one: the campaign "
        "key or the chunk column changed"
    )


def check_extension(
    stored: CampaignShape, stored_config_hash: str, planned: CampaignShape, at: ConfigHashAt
) -> None:
    """DPONE_LEDGER_SHAPE_MISMATCH (reason and way out) unless ``planned`` extends ``stored``:
    its chunks start with the stored ones and only the window's end moved in the configuration
    (the planned configuration, its end set back to the stored end, hashes to the stored
    config_hash: same source, sink, keys, chunk column and inner mode)."""
    why = extension_refusal(stored, planned)
    if why is None and at(stored.chunks[-1].end) != stored_config_hash:
        why = (
            "the source, sink, merge keys, chunk column, chunk step or unit (also when another "
            "spelling gives the same chunks) or inner mode changed as well as the window's end "
            "(an extension may move the end only)"
        )
    if why is not None:
        raise DponeError(
            errors.LEDGER_SHAPE_MISMATCH,
            f"campaign {planned.run_key!r}: {stored.chunk_count} chunks stored over "
            f"{_window(stored)}, {planned.chunk_count} planned over {_window(planned)}; "
            f"not an extension: {why}; {WAY_OUT}",
        )
