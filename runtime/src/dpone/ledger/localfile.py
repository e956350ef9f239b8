"""The local_file ledger: internal mode on one machine, many worker threads, no database.

Layout, for ``path`` = ``ledger.json``:

- ``ledger.json``: the compacted snapshot (campaigns + the latest record of every chunk), written
  only by compaction as temp file + fsync + ``os.replace`` + directory fsync, so it is always whole.
- ``ledger.json.journal``: JSON lines appended (and fdatasync-ed) one per transition since the last
  compaction. Each line carries a global ``seq``; the snapshot keeps ``last_seq``, so a crash between
  writing the snapshot and truncating the journal replays nothing twice. A torn last line (a crash
  mid-append) is ignored and cut off before the next append.
- ``ledger.json.lock``: the ``fcntl.flock`` taken around every read-decide-append (process safety);
  a threading lock orders threads of one process before they reach it. A wait for another process's
  flock is bounded (``lock_timeout_s``, then DPONE_AIRFLOW_MAPPING_CAMPAIGN_BUSY): a frozen holder
  must not stall every run on the machine.

A reader (``read_only=True``: ``dpone ledger status`` and ``list``) opens the files read-only and
creates none; it takes the flock shared, so it never sees a compaction half done (new snapshot, old
journal), and reads a torn last line as absent without cutting it.

A transition therefore costs one small append, not a rewrite of the whole file; the journal is folded
into the snapshot every ``compact_every`` lines. Leases use the local clock, which is the only clock
of a one-machine run. The store has no distributed capability: mapped execution refuses it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dpone import errors
from dpone.errors import DponeError
from dpone.ledger import port
from dpone.ledger.sql import (
    AMENDMENTS,
    CAMPAIGNS,
    RESTATEMENTS,
    TRANSITIONS,
    CampaignHead,
    Extension,
    NewTransition,
    ShapeRow,
    StoreBase,
    StoredTransition,
    check_chunk,
    check_lease_chunk,
    check_owner,
    check_renewal,
    check_shape_input,
    completion_record,
    corrupt,
    decide_lease,
    merge_ledger,
    renewal_record,
    restate_plan,
    restate_selection,
    restated_record,
    restatement_of,
    running_record,
    shape_from_rows,
    validate_transition,
    verify_shape,
)
from dpone.lifecycle.interrupt import STOP
from dpone.plan.chunks import Chunk

FORMAT = "dpone.ledger.local_file.v1"
FORMAT_VERSION = 1
LOCAL_ONLY = port.Capabilities(
    distributed_lock=False, distributed_chunk_lease=False, compare_and_set_completion=False
)


def _stamp(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat()


@dataclass
class CampaignEntry:
    """One campaign in memory: its latest head, its stored shape rows and every chunk's latest row."""

    head: CampaignHead
    shape: list[ShapeRow]
    latest: dict[int, StoredTransition] = field(default_factory=dict)
    amendments: list[port.Amendment] = field(default_factory=list)
    restatements: list[port.Restatement] = field(default_factory=list)


def _transition_json(
    seq: int,
    run_key: str,
    record: NewTransition | StoredTransition,
    recorded_at: dt.datetime | None,
) -> dict[str, Any]:
    """A transition's journal line (a new one is recorded now, a compacted one keeps its time)."""
    return {
        "seq": seq,
        "kind": "transition",
        "run_key": run_key,
        **TRANSITIONS.to_json(record, omit="seq recorded_at source_checksum"),
        "recorded_at": _stamp(recorded_at),
        **({"source_checksum": record.source_checksum} if record.source_checksum else {}),
    }


def _campaign_json(
    seq: int,
    head: CampaignHead,
    shape: list[ShapeRow] | None,
    amendments: list[port.Amendment] | None = None,
    restatements: list[port.Restatement] | None = None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "seq": seq,
        "kind": "campaign",
        "run_key": head.run_key,
        "workload": head.workload,
        "process": head.process,
        "plan_hash": head.plan_hash,
        "config_hash": head.config_hash,
        "chunk_count": head.chunk_count,
        "cancelled": head.cancelled,
        "cancel_reason": head.cancel_reason,
        "created_by": head.created_by,
        "created_at": _stamp(head.created_at),
    }
    if amendments:
        entry["amendments"] = [AMENDMENTS.to_json(a, omit="run_key") for a in amendments]
    if restatements:
        entry["restatements"] = [RESTATEMENTS.to_json(r, omit="run_key") for r in restatements]
    if shape is not None:
        entry["chunks"] = [
            [r.chunk_index, r.chunk_start, r.chunk_end, r.idempotency_key] for r in shape
        ]
    return entry


class LocalFileLedger(StoreBase):
    """A thread-safe, process-safe ledger in one file plus its journal (see the module doc)."""

    capabilities: port.Capabilities = LOCAL_ONLY
    name = "local_file"

    def __init__(
        self,
        path: str | os.PathLike[str],
        lease_seconds: float = 300.0,
        *,
        compact_every: int = 5000,
        durable: bool = True,
        lock_timeout_s: float = 10.0,
        clock: Callable[[], dt.datetime] | None = None,
        read_only: bool = False,
    ) -> None:
        self.path = Path(path)
        self.journal_path = self.path.with_name(self.path.name + ".journal")
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.lease_seconds = float(lease_seconds)
        self.compact_every = compact_every
        self.durable = durable
        self.lock_timeout_s = lock_timeout_s
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._thread_lock = threading.RLock()
        self.read_only = read_only
        for file in (self.path, self.journal_path, self.lock_path):
            self._require_regular(file)
        if read_only:
            self._lock_fd = self._open_for_reading(self.lock_path)
            self._journal_fd = self._open_for_reading(self.journal_path)
            # no lock file: no writer has opened this ledger, so there is nobody to wait for
            self._lockless = self._lock_fd < 0
        else:
            self._lockless = False
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            self._journal_fd = os.open(
                self.journal_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644
            )
        self._campaigns: dict[str, CampaignEntry] = {}
        self._last_seq = 0
        self._snapshot_identity: tuple[int, int, int] | None = None
        self._journal_offset = 0
        self._journal_lines = 0

    @staticmethod
    def _require_regular(path: Path) -> None:
        """A ledger file that is there must be a regular file: opening a FIFO blocks for ever
        and reading /dev/zero never ends. A folder is refused where it is opened."""
        try:
            mode = path.stat().st_mode
        except OSError:  # not there (created or skipped later), or refused where it is opened
            return
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
            raise DponeError(
                errors.LEDGER_UNAVAILABLE,
                f"local ledger {path}: cannot be used (not a regular file: a pipe, a device or "
                "a socket)",
            )

    def _open_for_reading(self, path: Path) -> int:
        """A reader's descriptor, or -1 for a file that is not there: a reader creates nothing."""
        try:
            return os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return -1
        except OSError as exc:
            raise DponeError(
                errors.LEDGER_UNAVAILABLE,
                f"local ledger {path}: cannot be read ({exc.strerror or type(exc).__name__})",
            ) from None

    def _check_writable(self) -> None:
        if self.read_only:
            raise DponeError(
                errors.LEDGER_UNAVAILABLE,
                f"local ledger {self.path} is open read-only: it records nothing",
            )

    # --- locking and syncing --------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self, timeout_s: float | None = None) -> Iterator[None]:
        """Thread lock (bounded when timeout_s is given) + flock, exclusive for a writer and
        shared for a reader, waited for at most timeout_s or lock_timeout_s; then a fresh view."""
        wait = self.lock_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + max(0.0, wait)
        if not self._thread_lock.acquire(timeout=-1 if timeout_s is None else max(0.0, timeout_s)):
            raise self._busy(wait)
        mode = fcntl.LOCK_SH if self.read_only else fcntl.LOCK_EX
        try:
            while not self._lockless:
                try:
                    fcntl.flock(self._lock_fd, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise self._busy(wait) from None
                    if STOP.requested:  # a stop does not wait out the lock
                        raise DponeError(
                            errors.RUN_INTERRUPTED,
                            STOP.record(
                                f"waiting for the local ledger lock {self.lock_path}"
                            ).message,
                        ) from None
                    time.sleep(0.01)
            try:
                self._sync()
                yield
            finally:
                if not self._lockless:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def _busy(self, timeout_s: float) -> DponeError:
        return DponeError(
            errors.MAPPING_CAMPAIGN_BUSY,
            f"the local ledger lock {self.lock_path} was not free within {timeout_s:g}s: another "
            "process holds it (a run, a cancel, or one that is stuck); retry, or stop that process",
        )

    def _unreadable(self, exc: OSError) -> DponeError:
        return DponeError(
            errors.LEDGER_UNAVAILABLE,
            f"local ledger {self.path}: cannot be used ({exc.strerror or type(exc).__name__}"
            + (f": {exc.filename}" if exc.filename else "")
            + ")",
        )

    def _sync(self) -> None:
        """:meth:`_sync_files`, a file that cannot be read (a folder where a file belongs) or a
        record of the wrong shape (a snapshot that is a list, a number too large for an index)
        said as such, never as an internal error."""
        try:
            self._sync_files()
        except DponeError:
            raise
        except OSError as exc:
            raise self._unreadable(exc) from None
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise self._file_corrupt(
                f"local ledger {self.path}: a record of its snapshot or journal is malformed "
                f"({type(exc).__name__})"
            ) from None

    def _sync_files(self) -> None:
        """Reload the snapshot if another process compacted, then apply new journal lines."""
        try:
            info = os.stat(self.path)
            identity: tuple[int, int, int] | None = (info.st_ino, info.st_mtime_ns, info.st_size)
        except FileNotFoundError:
            identity = None
        if identity != self._snapshot_identity:
            self._load_snapshot()
            self._snapshot_identity = identity
            self._journal_offset = 0
            self._journal_lines = 0
        size = 0 if self.read_only and self._journal_fd < 0 else os.fstat(self._journal_fd).st_size
        if size < self._journal_offset:  # truncated by a compaction we already reloaded
            self._journal_offset = 0
        if size == self._journal_offset:
            return
        data = os.pread(self._journal_fd, size - self._journal_offset, self._journal_offset)
        end = data.rfind(b"\n") + 1  # a torn last line (no newline) is not applied
        for number, line in enumerate(data[:end].splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                raise self._file_corrupt(
                    f"journal {self.journal_path} has an unreadable line "
                    f"{number} after byte {self._journal_offset}"
                ) from None
            self._apply(entry)
            self._journal_lines += 1
        self._journal_offset += end

    @staticmethod
    def _file_corrupt(why: str) -> DponeError:
        return DponeError(errors.LEDGER_CORRUPT, why)

    def _load_snapshot(self) -> None:
        self._campaigns = {}
        self._last_seq = 0
        try:
            document = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except ValueError:
            raise self._file_corrupt(f"snapshot {self.path} is not valid JSON") from None
        version = document.get("format_version")
        if document.get("format") != FORMAT or not isinstance(version, int):
            raise self._file_corrupt(f"{self.path} is not a dpone local ledger ({FORMAT})")
        if version > FORMAT_VERSION:
            raise DponeError(
                errors.LEDGER_UNAVAILABLE,
                f"local ledger {self.path} has format version {version}; this dpone reads up to "
                f"{FORMAT_VERSION}: upgrade dpone",
            )
        for entry in document["campaigns"]:
            self._apply(entry, replay=False)
        for entry in document["latest"]:
            self._apply(entry, replay=False)
        self._last_seq = int(document["last_seq"])

    def _apply(self, entry: dict[str, Any], replay: bool = True) -> None:
        """Apply one entry; a journal replay skips entries the snapshot already holds. A
        ``batch`` line holds the entries of one operation (_append_all), applied in order."""
        if entry["kind"] == "batch":
            for part in entry["entries"]:
                self._apply(part, replay)
            return
        seq = int(entry["seq"])
        if replay and seq <= self._last_seq:
            return
        run_key = str(entry["run_key"])
        if entry["kind"] == "campaign":
            existing = self._campaigns.get(run_key)
            if "chunks" in entry:
                rows = [
                    ShapeRow(int(c[0]), str(c[1]), str(c[2]), str(c[3])) for c in entry["chunks"]
                ]
            elif existing is not None:
                rows = existing.shape
            else:
                raise corrupt(
                    run_key, None, f"journal seq {seq} updates a campaign that was never created"
                )
            latest = existing.latest if existing is not None else {}
            # a snapshot's campaign lists every amendment, a journal line at most its own one
            amended = list(existing.amendments) if existing is not None else []
            amended.extend(
                AMENDMENTS.from_json(a, run_key=run_key) for a in entry.get("amendments", ())
            )
            restated = list(existing.restatements) if existing is not None else []
            restated.extend(
                RESTATEMENTS.from_json(r, run_key=run_key) for r in entry.get("restatements", ())
            )
            self._campaigns[run_key] = CampaignEntry(
                CAMPAIGNS.from_json(entry), rows, latest, amended, restated
            )
        elif entry["kind"] == "transition":
            campaign = self._campaigns.get(run_key)
            if campaign is None:
                raise corrupt(
                    run_key, entry.get("chunk_index"), f"journal seq {seq} has no campaign"
                )
            row = TRANSITIONS.from_json(entry)
            campaign.latest[row.chunk_index] = row
            if "restated" in entry:  # the PENDING transition of a restatement carries it
                campaign.restatements.append(
                    RESTATEMENTS.from_json(entry["restated"], run_key=run_key)
                )
        else:
            raise corrupt(run_key, None, f"journal seq {seq} has unknown kind {entry['kind']!r}")
        self._last_seq = max(self._last_seq, seq)

    def _append(self, entry: dict[str, Any]) -> None:
        """Append one journal line (fdatasync when durable), apply it, compact when due."""
        self._append_all([entry])

    def _append_all(self, entries: Sequence[dict[str, Any]]) -> None:
        """Append the entries of one operation as ONE journal line (a ``batch`` of them when
        there are several), apply them, compact when due: a line is written whole or not at
        all (a torn one is never applied), so a full disk or a crash never leaves part of an
        operation recorded."""
        size = os.fstat(self._journal_fd).st_size
        if size > self._journal_offset:  # a torn line from a crashed writer: cut it off
            os.ftruncate(self._journal_fd, self._journal_offset)
        entry = entries[0] if len(entries) == 1 else {"kind": "batch", "entries": list(entries)}
        line = (json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        self._write_line(line)
        self._journal_offset += len(line)
        self._journal_lines += 1
        self._apply(entry)
        if self._journal_lines >= self.compact_every:
            try:
                self._compact()
            except OSError:  # the journal holds every record: a snapshot can wait for room
                with contextlib.suppress(OSError):
                    self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp").unlink()

    def _write_line(self, line: bytes) -> None:
        """Write the whole line and sync it, or raise DPONE_LEDGER_UNAVAILABLE with nothing of
        it left: a short write (a full tmpfs returns one instead of ENOSPC) was counted as
        written, so a run said passed over records that were never on disk."""
        written = 0
        try:
            while written < len(line):
                count = os.write(self._journal_fd, line[written:])
                if count <= 0:
                    raise OSError(28, "No space left on device")
                written += count
            if self.durable:
                os.fdatasync(self._journal_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._journal_fd, self._journal_offset)
            raise DponeError(
                errors.LEDGER_UNAVAILABLE,
                f"local ledger {self.path.name}: a record could not be written to its journal "
                f"({exc.strerror or type(exc).__name__}); it is not recorded: free space on the "
                "ledger's file system (or make it writable), then run again",
            ) from None

    def _compact(self) -> None:
        """Fold the journal into a new snapshot (atomic replace), then empty the journal."""
        document = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "last_seq": self._last_seq,
            "campaigns": [
                _campaign_json(c.head.seq, c.head, c.shape, c.amendments, c.restatements)
                for c in self._campaigns.values()
            ],
            "latest": [
                _transition_json(row.seq, run_key, row, row.recorded_at)
                for run_key, c in self._campaigns.items()
                for row in c.latest.values()
            ],
        }
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(temp, "w", encoding="utf-8") as handle:
            json.dump(document, handle, ensure_ascii=False, separators=(",", ":"))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        os.ftruncate(self._journal_fd, 0)
        os.fsync(self._journal_fd)
        info = os.stat(self.path)
        self._snapshot_identity = (info.st_ino, info.st_mtime_ns, info.st_size)
        self._journal_offset = 0
        self._journal_lines = 0

    def compact(self) -> None:
        """Fold the journal into the snapshot now (also done every compact_every transitions)."""
        self._check_writable()
        with self._locked():
            self._compact()

    # --- the port -------------------------------------------------------------------------------
    def initialize(
        self,
        shape: port.CampaignShape,
        owner: str,
        lock_timeout_s: float,
        scope: tuple[int, int] | None = None,
    ) -> port.Ledger:
        """The whole campaign's ledger whatever the scope: the file holds it in memory."""
        check_shape_input(shape)
        self._check_writable()
        with self._locked(lock_timeout_s):
            existing = self._campaigns.get(shape.run_key)
            if existing is None:
                head = replace(
                    CampaignHead.new(shape, owner), seq=self._last_seq + 1, created_at=self._clock()
                )
                rows = [ShapeRow.of(chunk) for chunk in shape.chunks]
                self._append(_campaign_json(head.seq, head, rows))
            else:
                verify_shape(existing.head, shape)
            ledger = self._ledger(shape.run_key)
        assert ledger is not None
        if ledger.shape.chunks != shape.chunks:
            raise corrupt(shape.run_key, None, "stored chunks differ from the planned chunks")
        return ledger

    def _grow(self, extension: Extension, lock_timeout_s: float) -> None:
        """One journal line carries the grown chunk list, the new snapshot and the amendment."""
        shape = extension.shape
        self._check_writable()
        with self._locked(lock_timeout_s):
            existing = self._campaigns.get(shape.run_key)
            head = None if existing is None else existing.head
            grown = extension.of(head, lambda: existing.shape if existing is not None else [])
            if grown is not None:
                now = self._clock()
                extended, amendment = grown
                extended = replace(extended, seq=self._last_seq + 1, created_at=now)
                rows = [ShapeRow.of(chunk) for chunk in shape.chunks]
                entry = _campaign_json(
                    extended.seq, extended, rows, [replace(amendment, amended_at=now)]
                )
                self._append(entry)

    def amendments(self, run_key: str) -> list[port.Amendment]:
        with self._locked():
            campaign = self._campaigns.get(run_key)
            return [] if campaign is None else list(campaign.amendments)

    def restate(
        self, shape: port.CampaignShape, indexes: Sequence[int], reason: str, requested_by: str
    ) -> list[int]:
        """Mark committed chunks to be moved again (see the port), under the file lock: one
        journal line for the call, a PENDING transition per restated chunk carrying its
        restatement (all of them are recorded, or none)."""
        chunks = restate_selection(shape, indexes)
        self._check_writable()
        with self._locked(self.lock_timeout_s):
            now = self._clock()
            seen = []
            for chunk in chunks:
                _, latest, transition = self._view(shape.run_key, chunk)
                seen.append((chunk, latest, transition))
            todo = restate_plan(shape.run_key, [(c, now, r) for c, r, _ in seen])
            entries: list[dict[str, Any]] = []
            for chunk, latest, transition in seen:
                if chunk.index not in todo:
                    continue
                assert latest is not None
                record = restated_record(chunk, latest, transition + 1)
                restatement = replace(
                    restatement_of(shape.run_key, record, latest, reason, requested_by),
                    requested_at=now,
                )
                seq = self._last_seq + 1 + len(entries)
                entry = _transition_json(seq, shape.run_key, record, now)
                entry["restated"] = RESTATEMENTS.to_json(restatement, omit="run_key")
                entries.append(entry)
            if entries:
                self._append_all(entries)
        return todo

    def restatements(self, run_key: str) -> list[port.Restatement]:
        with self._locked():
            campaign = self._campaigns.get(run_key)
            return [] if campaign is None else list(campaign.restatements)

    def _ledger(self, run_key: str) -> port.Ledger | None:
        campaign = self._campaigns.get(run_key)
        if campaign is None:
            return None
        shape = shape_from_rows(campaign.head, campaign.shape)
        return merge_ledger(campaign.head, shape, list(campaign.latest.values()), self._clock())

    def load_checked(self, shape: port.CampaignShape) -> port.Ledger | None:
        """The whole campaign: the file is read whole anyway."""
        return self.load(shape.run_key)

    def load(self, run_key: str) -> port.Ledger | None:
        with self._locked():
            return self._ledger(run_key)

    def committed_count(self, run_key: str) -> int:
        with self._locked():
            campaign = self._campaigns.get(run_key)
            if campaign is None:
                return 0
            committed = port.ChunkState.COMMITTED.value
            return sum(1 for row in campaign.latest.values() if row.state == committed)

    def _view(
        self, run_key: str, chunk: Chunk
    ) -> tuple[CampaignEntry, port.ChunkRecord | None, int]:
        campaign = self._campaigns.get(run_key)
        if campaign is None:
            raise corrupt(run_key, chunk.index, "no campaign: initialize the campaign first")
        stored = (
            campaign.shape[chunk.index - 1] if 1 <= chunk.index <= len(campaign.shape) else None
        )
        check_chunk(run_key, chunk, stored)
        assert stored is not None
        row = campaign.latest.get(chunk.index)
        if row is None:
            return campaign, None, 0
        return campaign, validate_transition(run_key, {chunk.index: stored}, row), row.transition

    def acquire_lease(
        self, shape: port.CampaignShape, chunk: Chunk, owner: str, lease_seconds: float
    ) -> port.LeaseOutcome:
        self._check_writable()
        with self._locked():
            campaign, latest, transition = self._view(shape.run_key, chunk)
            now = self._clock()
            decision = decide_lease(campaign.head.cancelled, latest, now, owner)
            if decision.status is not port.LeaseStatus.ACQUIRED:
                reason = campaign.head.cancel_reason if campaign.head.cancelled else None
                return port.LeaseOutcome(decision.status, holder=latest, cancel_reason=reason)
            assert decision.attempt is not None
            if decision.reuse:
                assert latest is not None and latest.lease_expires_at is not None
                expires = latest.lease_expires_at
            else:
                expires = now + dt.timedelta(seconds=lease_seconds)
                record = running_record(
                    chunk, transition + 1, decision.attempt, owner, expires, now
                )
                self._append(_transition_json(self._last_seq + 1, shape.run_key, record, now))
        lease = port.Lease(shape.run_key, chunk.index, owner, decision.attempt, expires)
        return port.LeaseOutcome(port.LeaseStatus.ACQUIRED, lease=lease)

    def complete(self, lease: port.Lease, chunk: Chunk, result: port.ChunkResult) -> None:
        check_lease_chunk(lease, chunk)
        self._check_writable()
        with self._locked():
            _, latest, transition = self._view(lease.run_key, chunk)
            running = check_owner(lease, latest)
            record = completion_record(lease, chunk, running, transition + 1, result)
            now = self._clock()
            self._append(_transition_json(self._last_seq + 1, lease.run_key, record, now))

    def complete_in_transaction(
        self, lease: port.Lease, chunk: Chunk, write: Callable[[Any], port.ChunkResult]
    ) -> port.ChunkResult:
        raise NotImplementedError("the local_file ledger cannot share a transaction with a sink")

    def renew(self, lease: port.Lease, lease_seconds: float) -> port.Lease:
        self._check_writable()
        with self._locked():
            campaign = self._campaigns.get(lease.run_key)
            stored = None
            if campaign is not None and 1 <= lease.chunk_index <= len(campaign.shape):
                stored = campaign.shape[lease.chunk_index - 1]
            row = None if campaign is None else campaign.latest.get(lease.chunk_index)
            running = check_renewal(lease, stored, row)
            assert stored is not None and row is not None
            now = self._clock()
            expires = now + dt.timedelta(seconds=lease_seconds)
            record = renewal_record(lease, running, stored, row.transition + 1, expires)
            self._append(_transition_json(self._last_seq + 1, lease.run_key, record, now))
        return port.Lease(lease.run_key, lease.chunk_index, lease.owner, lease.attempt, expires)

    def cancel(self, run_key: str, reason: str, undo: bool = False, by: str | None = None) -> bool:
        self._check_writable()
        with self._locked(self.lock_timeout_s):
            campaign = self._campaigns.get(run_key)
            if campaign is None:
                raise DponeError(errors.USAGE, f"no campaign {run_key!r} in {self.path}")
            head = campaign.head
            if undo and not head.cancelled:
                return False
            updated = replace(
                head.cancelling(reason, undo, by), seq=self._last_seq + 1, created_at=self._clock()
            )
            self._append(_campaign_json(updated.seq, updated, None))
            return True

    def list_campaigns(self, workload: str | None = None) -> list[str]:
        with self._locked():
            return sorted(
                key
                for key, c in self._campaigns.items()
                if workload is None or c.head.workload == workload
            )

    def close(self) -> None:
        with self._thread_lock:
            for fd in (self._journal_fd, self._lock_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._journal_fd = self._lock_fd = -1
