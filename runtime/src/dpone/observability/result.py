"""The run result (``dpone.run-result.v1``, XCom) and the backfill evidence file.

The result is bounded and safe to show in Airflow: counts, fingerprints and the mapping section,
never a per-chunk list, predicates, row values or secrets. Evidence carries the chunk records.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpone.credentials.redaction import redact_document
from dpone.errors import REGISTRY, ErrorRecord
from dpone.ledger.port import ChunkRecord, Ledger
from dpone.plan.canonical import field_values

RESULT_SCHEMA = "dpone.run-result.v1"
EVIDENCE_SCHEMA = "dpone.backfill-evidence.v1"
VERIFICATION_SCHEMA = "dpone.backfill-verification.v1"
XCOM_DEFAULT_PATH = "/airflow/xcom/return.json"
EVIDENCE_MAX_CHUNKS = 10_000
MESSAGE_MAX = 500


@dataclass
class ChunkTiming:
    index: int
    #: committed | failed | skipped_resume | busy | lease_lost | cancelled | interrupted |
    #: not_started
    status: str
    attempt: int | None = None
    rows: int | None = None
    checksum: str | None = None
    duration_ms: int | None = None
    error_code: str | None = None
    #: the source's checksum of the chunk, when the read-back gate compared content
    source_checksum: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = field_values(self)
        if self.source_checksum is None:  # absent, not null, where no content was compared
            del out["source_checksum"]
        return out


@dataclass
class RunOutcome:
    """Aggregated facts of one `dpone run`; turned into result and evidence documents."""

    workload: str
    process: str
    run_key: str | None
    mode: str
    pack_fingerprint: str
    chunks_selected: int = 0
    chunks_committed: int = 0
    chunks_skipped_resume: int = 0
    chunks_failed: int = 0
    chunks_not_started: int = 0
    #: leased by another live attempt (not failed: that attempt is working on it)
    chunks_busy: int = 0
    #: refused by a campaign cancellation at lease time
    chunks_cancelled: int = 0
    #: rolled back and released by SIGTERM/SIGINT
    chunks_interrupted: int = 0
    rows_written: int = 0
    duration_ms: int = 0
    cancelled: bool = False
    error: ErrorRecord | None = None
    mapping: dict[str, Any] | None = None
    airflow: dict[str, Any] | None = None  # dpone.task.airflow_context.airflow_section
    timings: list[ChunkTiming] = field(default_factory=list)
    campaign_complete: bool | None = None
    #: "backfill" or "full_refresh" (one unit, no ledger: run_key and campaign_complete stay None)
    strategy: str = "backfill"
    #: the write path of a full refresh (ChunkWrite.method), for the summary line only
    method: str | None = None

    @property
    def status(self) -> str:
        if self.cancelled:
            return "cancelled"
        unfinished = self.chunks_not_started + self.chunks_busy + self.chunks_interrupted
        if self.error is not None or self.chunks_failed or unfinished:
            return "failed"
        return "passed"

    def item_status(self) -> str:
        if self.status == "passed":
            if self.chunks_selected and self.chunks_skipped_resume == self.chunks_selected:
                return "chunks_skipped_resume"
            return "success"
        return self.status

    def result_document(self) -> dict[str, Any]:
        error = None
        if self.error is not None:
            # retryable: whether another attempt can help; the DAG file fails the task without
            # Airflow retries when it is false (a pack mismatch is not cured by a new pod).
            error = {
                "code": self.error.code,
                "message": self.error.message[:MESSAGE_MAX],
                "retryable": REGISTRY[self.error.code].retryable,
            }
        backfill: dict[str, Any] = {
            "run_key": self.run_key,
            "chunks_selected": self.chunks_selected,
            "chunks_committed": self.chunks_committed,
            "chunks_skipped_resume": self.chunks_skipped_resume,
            "chunks_failed": self.chunks_failed,
            "chunks_not_started": self.chunks_not_started,
            "chunks_busy": self.chunks_busy,
            "chunks_cancelled": self.chunks_cancelled,
            "chunks_interrupted": self.chunks_interrupted,
            "rows_written": self.rows_written,
            "campaign_complete": self.campaign_complete,
        }
        if self.mapping is not None:
            backfill["mapping"] = {**self.mapping, "item_status": self.item_status()}
        document: dict[str, Any] = {
            "schema": RESULT_SCHEMA,
            "status": self.status,
            "workload": self.workload,
            "process": self.process,
            "mode": self.mode,
            "pack_fingerprint": self.pack_fingerprint,
            "duration_ms": self.duration_ms,
            "error": error,
            "backfill": backfill,
        }
        if self.airflow is not None:
            document["airflow"] = self.airflow
        return document

    def evidence_document(self, owner: str) -> dict[str, Any]:
        timings = sorted(self.timings, key=lambda t: t.index)
        truncated = len(timings) > EVIDENCE_MAX_CHUNKS
        return {
            "schema": EVIDENCE_SCHEMA,
            "result": self.result_document(),
            "owner": owner,
            "chunks": [t.to_json() for t in timings[:EVIDENCE_MAX_CHUNKS]],
            "chunks_truncated": truncated,
        }


def write_json_atomic(path: Path, document: dict[str, Any]) -> None:
    """Write ``document`` atomically (see write_text_atomic); every string passes the redaction
    first (results become XCom, evidence is shared)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (
        json.dumps(redact_document(document), sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    )
    write_text_atomic(path, data)


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temp file in the same folder, fsync, then rename over the target: a reader
    sees the old file or the new one, never half of one. A symbolic link is written through
    (the file it names is replaced, the link stays)."""
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(path.stat().st_mode):  # never replace a pipe, a device, a folder
            raise OSError(errno.EINVAL, "not a regular file", str(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def xcom_path() -> Path | None:
    """DPONE_XCOM_PATH, else Airflow's sidecar file when its folder exists (the KPO convention)."""
    explicit = os.environ.get("DPONE_XCOM_PATH")
    if explicit:
        return Path(explicit)
    default = Path(XCOM_DEFAULT_PATH)
    return default if default.parent.is_dir() else None


def verification_document(ledger: Ledger) -> dict[str, Any]:
    """Per-chunk rows and checksums of a complete campaign: equal for every finisher."""
    records: list[ChunkRecord] = [ledger.records[c.index] for c in ledger.shape.chunks]
    return {
        "schema": VERIFICATION_SCHEMA,
        "run_key": ledger.shape.run_key,
        "plan_hash": ledger.shape.plan_hash,
        "config_hash": ledger.shape.config_hash,
        "chunks_total": ledger.shape.chunk_count,
        "rows_total": sum(r.rows or 0 for r in records),
        "chunks": [
            {"index": r.chunk_index, "rows": r.rows, "checksum": r.checksum} for r in records
        ],
    }
