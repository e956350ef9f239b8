"""`dpone verify`: prove a backfill by comparing every chunk's source rows with its target rows.

Per chunk, both sides are summarised by the connectors' order-independent checksum (row count and
the sum of a 64-bit hash of each row, ``rowsum-pgchain64-v1`` between two Postgres sides and
``rowsum-pghash64-v1`` otherwise), over the source's columns, so a
target that has extra columns (a ``loaded_at``) still compares. Postgres computes it in SQL; SQLite
and MSSQL stream the chunk's rows into the same hash. Both sides are read only: Postgres sessions
run read-only transactions, SQLite files are opened read-only, and MSSQL (no read-only session) is
sent nothing but SELECT statements. The ledger is not read: this checks the data, not the
bookkeeping.

Where both sides are Postgres, consecutive chunks are summed per chunk in one grouped statement a
side (``Source.window_checksums``, the run's set-based path: the same value as each chunk alone),
the source's on a thread beside the target's: a year of hourly chunks is some 44 statements a
side, not 8,760. Progress goes to stderr (see VerifyProgress).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO, TypeVar

from dpone import errors
from dpone.connectors.base import ChunkWindow, Source, SourceSpec, checksum_rows
from dpone.credentials.connections import require_connections, resolve_dsn
from dpone.errors import DponeError, ErrorRecord
from dpone.observability.progress import PROGRESS_EVENT_SCHEMA, log_format
from dpone.observability.reporting import EXIT_FAILED, EXIT_OK, report_error
from dpone.packing.pack import ProcessPlan, WorkloadPack, load_workload_pack, select_process
from dpone.plan.chunks import Bound, Chunk
from dpone.records import record

REPORT_SCHEMA = "dpone.verify-report.v1"
#: chunks one grouped statement sums a side (the run's set-based group budget, max_chunks)
GROUP_CHUNKS = 200
_T = TypeVar("_T")
_U = TypeVar("_U")
_RANGE = re.compile(r"^\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?$")


@record
class ChunkComparison:
    """One chunk's two sides; ``lower``/``upper`` are None for a full refresh (every row)."""

    index: int
    lower: Bound | None
    upper: Bound | None
    source_checksum: str
    target_checksum: str

    @property
    def source_rows(self) -> int:
        return checksum_rows(self.source_checksum)

    @property
    def target_rows(self) -> int:
        return checksum_rows(self.target_checksum)

    @property
    def matches(self) -> bool:
        return self.source_checksum == self.target_checksum

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "lower": self.lower,
            "upper": self.upper,
            "source_rows": self.source_rows,
            "target_rows": self.target_rows,
            "source_checksum": self.source_checksum,
            "target_checksum": self.target_checksum,
            "matches": self.matches,
        }


def parse_chunk_ranges(text: str, total: int) -> list[int]:
    """``"1-40"``, ``"7"`` or ``"1-5,9,20-22"`` as sorted chunk indexes within 1..total."""
    picked: set[int] = set()
    shown = text if len(text) <= 60 else text[:57] + "..."
    for part in text.split(","):
        found = _RANGE.match(part)
        if found is None:
            raise DponeError(
                errors.USAGE, f"--chunks {shown!r}: write a range like 1-40, 7 or 1-5,9,20-22"
            )
        digits = (found.group(1), found.group(2) or found.group(1))
        # a chunk index has at most 6 digits (100,000 chunks): a longer number is outside, and
        # is not converted (Python refuses integers of over 4,300 digits)
        significant = [d.strip().lstrip("0") or "0" for d in digits]
        first, last = (int(d) if len(d) <= 9 else total + 1 for d in significant)
        if not 1 <= first <= last <= total:
            raise DponeError(
                errors.USAGE,
                f"--chunks {shown!r}: {part.strip()[:60]!r} is outside chunks 1-{total} "
                "(or its end is before its start)",
            )
        picked.update(range(first, last + 1))
    return sorted(picked)


def format_chunk_ranges(indexes: Sequence[int]) -> str:
    """Chunk indexes in the form --chunks takes: [1, 2, 3, 7] -> "1-3,7"."""
    parts: list[str] = []
    run: list[int] = []
    for index in sorted(set(indexes)):
        if run and index == run[-1] + 1:
            run.append(index)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [index]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


RESTATE_REASON = "verify: source and target differ"


def restate_hint(
    catalog: str, pack: WorkloadPack, plan: ProcessPlan, bad: Sequence[int]
) -> dict[str, str] | None:
    """The `dpone ledger restate` command that marks the mismatched chunks to be moved again
    (verify -> restate -> run -> verify), or None where restating cannot repair them (no
    chunked campaign, or append, which the restate command refuses)."""
    bf = plan.config.backfill
    if not bad or plan.run_key is None or bf is None or bf.inner_mode == "append":
        return None
    chunks = format_chunk_ranges(bad)
    command = " ".join(
        [
            "dpone ledger restate --catalog",
            shlex.quote(catalog),
            "--workload",
            shlex.quote(pack.workload.name),
            "--process",
            shlex.quote(plan.name),
            "--chunks",
            chunks,
            "--reason",
            shlex.quote(RESTATE_REASON),
        ]
    )
    return {"chunks": chunks, "command": command}


OpenSource = Callable[[SourceSpec, str], Source]


def _sides(plan: ProcessPlan, open_source: OpenSource) -> tuple[Source, Source]:
    """The source as the process reads it, and the target table read through the same connector
    interface over the source's columns; both read-only."""
    from dpone.run.orchestrator import connector_specs

    source_spec, sink_spec = connector_specs(plan)
    cfg = plan.config
    source = open_source(source_spec, resolve_dsn(cfg.source.connection)).read_only()
    try:
        target_spec = SourceSpec(
            connection=sink_spec.connection,
            table=sink_spec.table,
            columns=source.columns(),
            role="target",
        )
        target = open_source(target_spec, resolve_dsn(cfg.sink.connection)).read_only()
    except BaseException:
        source.close()
        raise
    Source.agree_both(source, target)  # the gate's form (two Postgres sides: chained)
    return source, target


def _open_source(spec: SourceSpec, dsn: str) -> Source:
    from dpone.connectors.factory import open_source

    return open_source(spec, dsn)


class VerifyProgress:
    """How far `dpone verify` is, on stderr: a line rewritten in place on a terminal; elsewhere
    (pods, CI logs) a line at each further tenth of a selection of more than GROUP_CHUNKS chunks,
    so the output depends on the counts only; with DPONE_LOG_FORMAT=json each line is a
    ``dpone.progress.v1`` object (event ``verify``). Counts only: no range, no value."""

    def __init__(self, stream: TextIO, json_lines: bool, workload: str) -> None:
        self.stream = stream
        self.workload = workload
        self.json_lines = json_lines
        self.live = stream.isatty() and not json_lines
        self._label = ""
        self._total = 0
        self._shown = 0  # tenths reported (lines mode)

    def start(self, process: str, total: int) -> None:
        self._label, self._total, self._shown = f"{self.workload}/{process}", total, 0

    def advance(self, done: int, mismatched: int) -> None:
        text = (
            f"dpone verify: {self._label}: {done:,} of {self._total:,} chunk(s) checked, "
            f"{mismatched:,} mismatched"
        )
        if self.live:
            end = "\n" if done >= self._total else ""
            print(f"\r\x1b[K{text}", end=end, file=self.stream, flush=True)
            return
        tenth = done * 10 // max(self._total, 1)
        if self._total <= GROUP_CHUNKS or tenth <= self._shown:
            return
        self._shown = tenth
        if self.json_lines:
            event = {
                "schema": PROGRESS_EVENT_SCHEMA,
                "event": "verify",
                "label": self._label,
                "done": done,
                "total": self._total,
                "mismatched": mismatched,
            }
            text = json.dumps(event, sort_keys=True, separators=(",", ":"))
        print(text, file=self.stream, flush=True)


def _beside(
    first: Callable[[], _T], second: Callable[[], _U], stop: Callable[[], None]
) -> tuple[_T, _U]:
    """``first()`` on a thread of its own while ``second()`` runs on this one; ``stop`` cancels
    ``first`` should ``second`` (or an interrupt) end this thread's wait early."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = first()
        except BaseException as exc:  # re-raised below, on the calling thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="dpone-verify-source", daemon=True)
    thread.start()
    try:
        other = second()
        thread.join()
    except BaseException:
        stop()
        thread.join(5.0)
        raise
    if "error" in box:
        raise box["error"]
    return box["value"], other


def _groups(chunks: Sequence[Chunk], size: int) -> list[list[Chunk]]:
    """Runs of consecutive chunks (each starts where the one before ends), at most ``size``
    long: what one grouped statement sums."""
    out: list[list[Chunk]] = []
    for chunk in chunks:
        last = out[-1] if out else None
        if last and len(last) < size and last[-1].index + 1 == chunk.index:
            last.append(chunk)
        else:
            out.append([chunk])
    return out


def compare_process(
    plan: ProcessPlan,
    indexes: Sequence[int] | None,
    open_source: OpenSource = _open_source,
    progress: VerifyProgress | None = None,
) -> list[ChunkComparison]:
    """Compare the selected chunks (every chunk when ``indexes`` is None) of one process; a
    process without chunks (a full refresh) compares every row as one unit, index 1.
    ``open_source`` is the connector factory (the MSSQL contract tests pass their double)."""
    source, target = _sides(plan, open_source)
    try:
        spec = plan.config.backfill
        if spec is None:
            return [ChunkComparison(1, None, None, source.checksum(None), target.checksum(None))]
        chunks = plan.chunks if indexes is None else [plan.chunks[i - 1] for i in indexes]
        grouped = all(hasattr(side, "window_checksums") for side in (source, target))
        out: list[ChunkComparison] = []
        if progress is not None:
            progress.start(plan.name, len(chunks))
        for group in _groups(chunks, GROUP_CHUNKS if grouped else 1):
            windows = [
                ChunkWindow(spec.chunk.column, spec.chunk.type, c.start, c.end) for c in group
            ]
            if grouped:
                sides = _beside(
                    functools.partial(source.window_checksums, windows),  # type: ignore[attr-defined]
                    functools.partial(target.window_checksums, windows),  # type: ignore[attr-defined]
                    source.interrupt,
                )
            else:
                sides = ([source.checksum(windows[0])], [target.checksum(windows[0])])
            for chunk, ours, theirs in zip(group, *sides, strict=True):
                out.append(ChunkComparison(chunk.index, chunk.start, chunk.end, ours, theirs))
            if progress is not None:
                progress.advance(len(out), sum(not c.matches for c in out))
        return out
    finally:
        source.close()
        target.close()


def report_document(
    pack: WorkloadPack,
    plan: ProcessPlan,
    compared: Sequence[ChunkComparison],
    duration_ms: int,
    catalog: str | None = None,
) -> dict[str, Any]:
    mismatched = [c for c in compared if not c.matches]
    hint = None
    if catalog is not None:
        hint = restate_hint(catalog, pack, plan, [c.index for c in mismatched])
    return {
        "schema": REPORT_SCHEMA,
        "workload": pack.workload.name,
        "process": plan.name,
        "run_key": plan.run_key,
        "chunks_total": max(plan.chunks_total, 1),
        "chunks_checked": len(compared),
        "chunks_matching": len(compared) - len(mismatched),
        "chunks_mismatched": len(mismatched),
        "source_rows": sum(c.source_rows for c in compared),
        "target_rows": sum(c.target_rows for c in compared),
        "matches": not mismatched,
        "mismatches": [c.to_json() for c in mismatched],
        "chunks": [c.to_json() for c in compared],
        "duration_ms": duration_ms,
        "restate": hint,
    }


def render_text(doc: dict[str, Any]) -> str:
    label = f"{doc['workload']}/{doc['process']}"
    lines = []
    for chunk in doc["mismatches"]:
        where = "all rows" if chunk["lower"] is None else f"[{chunk['lower']}, {chunk['upper']})"
        what = (
            f"rows: source {chunk['source_rows']:,}, target {chunk['target_rows']:,}"
            if chunk["source_rows"] != chunk["target_rows"]
            else f"same row count ({chunk['source_rows']:,}), different content"
        )
        lines.append(f"MISMATCH {label} chunk {chunk['index']} {where}: {what}")
    verdict = "match" if doc["matches"] else "MISMATCH"
    lines.append(
        f"dpone verify: {label}: {verdict} — {doc['chunks_matching']} of {doc['chunks_checked']} "
        f"checked chunk(s) match ({doc['chunks_total']} in the plan), "
        f"{doc['chunks_mismatched']} mismatched; {doc['source_rows']:,} source rows, "
        f"{doc['target_rows']:,} target rows ({doc['duration_ms']} ms)"
    )
    if doc.get("restate"):
        lines.append(f"  to move chunks {doc['restate']['chunks']} again (then run, then verify):")
        lines.append(f"    {doc['restate']['command']}")
    return "\n".join(lines) + "\n"


def _plans(pack: WorkloadPack, process: str | None) -> list[ProcessPlan]:
    if process is None:
        return list(pack.processes)
    return [select_process(pack, process)]


def verify_command(args: argparse.Namespace) -> int:
    pack = load_workload_pack(args.catalog, args.workload)
    plans = _plans(pack, args.process)
    require_connections(
        name
        for plan in plans
        for name in (plan.config.source.connection, plan.config.sink.connection)
    )
    selections = [
        (
            parse_chunk_ranges(args.chunks, max(plan.chunks_total, 1))
            if args.chunks is not None
            else None
        )
        for plan in plans
    ]
    docs = []
    fmt = log_format(os.environ)
    progress = (
        None if args.no_progress else VerifyProgress(sys.stderr, fmt == "json", pack.workload.name)
    )
    for plan, indexes in zip(plans, selections, strict=True):
        started = time.monotonic()
        compared = compare_process(plan, indexes, progress=progress)
        elapsed = int((time.monotonic() - started) * 1000)
        docs.append(report_document(pack, plan, compared, elapsed, args.catalog))
    if args.format == "json":
        print(json.dumps(docs if len(docs) != 1 else docs[0], indent=2, sort_keys=True))
    else:
        print("".join(render_text(doc) for doc in docs), end="")
    bad = [doc for doc in docs if not doc["matches"]]
    if not bad:
        return EXIT_OK
    chunks = sum(doc["chunks_mismatched"] for doc in bad)
    names = ", ".join(f"{doc['workload']}/{doc['process']}" for doc in bad)
    report_error(
        ErrorRecord(
            errors.VERIFY_MISMATCH,
            f"{chunks} chunk(s) of {names} differ between source and target",
        )
    )
    return EXIT_FAILED
