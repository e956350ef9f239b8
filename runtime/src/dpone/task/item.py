"""Strict parsing of DPONE_AIRFLOW_MAPPING_ITEM at the CLI composition root.

The env value is an execution scope, not an authority: it is parsed before any manifest is read
or connector built, and everything in it is checked against the re-derived plan afterwards.
"""

from __future__ import annotations

from typing import Any

from dpone import errors
from dpone.errors import DponeError
from dpone.plan.canonical import is_fingerprint, strict_json_object
from dpone.plan.chunks import MAX_CHUNKS
from dpone.plan.mapping import (
    HARD_MAX_ITEMS,
    ITEM_MAX_BYTES,
    ITEM_SCHEMA,
    MAPPED_MODES,
    MappingItem,
)
from dpone.records import record

ENV_ITEM = "DPONE_AIRFLOW_MAPPING_ITEM"
ENV_RUN_IDENTITY = "DPONE_AIRFLOW_RUN_IDENTITY"
ENV_LABEL = "DPONE_AIRFLOW_MAPPING_LABEL"
ENV_CONTEXT = "DPONE_AIRFLOW_CONTEXT"  # parsed by dpone.task.airflow_context
PROVIDER_OWNED_ENV = (ENV_ITEM, ENV_RUN_IDENTITY, ENV_LABEL, ENV_CONTEXT)
ITEM_FIELDS = (
    "schema",
    "mode",
    "mapping_plan_fingerprint",
    "backfill_plan_hash",
    "item_index",
    "first_chunk_index",
    "last_chunk_index",
    "chunks_count",
)


@record
class ParsedItem(MappingItem):
    """A mapped task's item as its environment carries it: the chunk range, plus the plan it
    was cut from."""

    mode: str
    mapping_plan_fingerprint: str
    backfill_plan_hash: str

    def to_mapping_section(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "plan_fingerprint": self.mapping_plan_fingerprint,
            "backfill_plan_hash": self.backfill_plan_hash,
            **self.canonical(),
        }


def _fail(message: str) -> DponeError:
    return DponeError(errors.MAPPING_ITEM_INVALID, f"{ENV_ITEM}: {message}")


def _strict_int(doc: dict[str, Any], key: str, low: int, high: int) -> int:
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(f"{key} must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise _fail(f"{key} {value} is outside {low}..{high}")
    return value


def parse_mapping_item(raw: str) -> ParsedItem:
    """Parse and bound-check one item; DponeError(DPONE_AIRFLOW_MAPPING_ITEM_INVALID) otherwise.

    Messages never echo the raw value: it may hold something secret-like that was pasted in.
    """
    doc = strict_json_object(raw, ITEM_MAX_BYTES, ITEM_FIELDS, _fail)
    missing = [key for key in ITEM_FIELDS if key not in doc]
    if missing:
        raise _fail(f"missing field(s) {', '.join(missing)}")
    if doc["schema"] != ITEM_SCHEMA:
        raise _fail(f"schema must be {ITEM_SCHEMA!r}")
    if doc["mode"] not in MAPPED_MODES:
        raise _fail(f"mode must be one of {', '.join(MAPPED_MODES)}")
    for key in ("mapping_plan_fingerprint", "backfill_plan_hash"):
        if not is_fingerprint(doc[key]):
            raise _fail(f"{key} must be sha256: followed by 64 lowercase hex digits")
    item_index = _strict_int(doc, "item_index", 0, HARD_MAX_ITEMS - 1)
    first = _strict_int(doc, "first_chunk_index", 1, MAX_CHUNKS)
    last = _strict_int(doc, "last_chunk_index", 1, MAX_CHUNKS)
    count = _strict_int(doc, "chunks_count", 1, MAX_CHUNKS)
    if last < first:
        raise _fail(f"last_chunk_index {last} is before first_chunk_index {first}")
    if count != last - first + 1:
        raise _fail(f"chunks_count {count} does not match range {first}..{last}")
    return ParsedItem(
        mode=doc["mode"],
        mapping_plan_fingerprint=doc["mapping_plan_fingerprint"],
        backfill_plan_hash=doc["backfill_plan_hash"],
        item_index=item_index,
        first_chunk_index=first,
        last_chunk_index=last,
    )
