"""local_file specifics: journal + compaction, torn lines, many threads, two processes."""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.ledger.localfile import LocalFileLedger
from dpone.ledger.port import ChunkResult, ChunkState, LeaseStatus
from ledger_backends import make_shape


def _run_all(path: str, run_key: str, chunks: int, owner: str) -> list[int]:
    store = LocalFileLedger(path, compact_every=50)
    shape = make_shape(run_key, chunks)
    store.initialize(shape, owner, 10)
    mine = []
    for chunk in shape.chunks:
        outcome = store.acquire_lease(shape, chunk, owner, 30)
        if outcome.status is LeaseStatus.ACQUIRED and outcome.lease is not None:
            store.complete(outcome.lease, chunk, ChunkResult(committed=True))
            mine.append(chunk.index)
    store.close()
    return mine


def test_journal_appends_and_compaction_keep_every_record(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    store = LocalFileLedger(path, compact_every=25)
    shape = make_shape("bf-local", 40)
    store.initialize(shape, "a", 5)
    for chunk in shape.chunks:
        lease = store.acquire_lease(shape, chunk, "a", 30).lease
        assert lease is not None
        store.complete(lease, chunk, ChunkResult(committed=True, rows=chunk.index))
    assert path.exists()  # compacted at least once
    lines = (tmp_path / "ledger.json.journal").read_text().splitlines()
    assert len(lines) < 25  # the journal was folded into the snapshot
    reopened = LocalFileLedger(path)
    ledger = reopened.load("bf-local")
    assert ledger is not None and ledger.complete
    assert ledger.records[40].rows == 40
    store.close()
    reopened.close()


def test_a_torn_last_line_is_ignored_and_cut(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    store = LocalFileLedger(path)
    shape = make_shape("bf-torn", 2)
    store.initialize(shape, "a", 5)
    store.close()
    with open(tmp_path / "ledger.json.journal", "a") as journal:
        journal.write('{"seq": 99, "kind": "transi')  # a crash mid-append
    store = LocalFileLedger(path)
    outcome = store.acquire_lease(shape, shape.chunks[0], "a", 30)
    assert outcome.status is LeaseStatus.ACQUIRED
    for line in (tmp_path / "ledger.json.journal").read_text().splitlines():
        json.loads(line)  # every line whole again
    store.close()


def _disk_with_room(room: int) -> Any:
    """os.write on a "disk" with ``room`` bytes left: a short count, then ENOSPC (what a full
    tmpfs answers)."""
    real_write = os.write
    left = [room]

    def full_disk(fd: int, data: bytes) -> int:
        if left[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        count = real_write(fd, data[: left[0]])
        left[0] -= count
        return count

    return full_disk


def test_a_full_file_system_fails_the_record_and_leaves_none_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a full tmpfs answers a write with a short count, not ENOSPC; the count was
    ignored, so completions were counted as recorded and the run said passed over a journal
    that lacked them. The write is now whole and synced, or DPONE_LEDGER_UNAVAILABLE with the
    partial line cut, and the ledger on disk says what the store says."""
    path = tmp_path / "ledger.json"
    store = LocalFileLedger(path)
    shape = make_shape("bf-full", 3)
    store.initialize(shape, "a", 5)
    lease = store.acquire_lease(shape, shape.chunks[0], "a", 30).lease
    assert lease is not None
    real_write = os.write
    monkeypatch.setattr(os, "write", _disk_with_room(10))
    with pytest.raises(DponeError) as caught:
        store.complete(lease, shape.chunks[0], ChunkResult(committed=True, rows=7))
    monkeypatch.setattr(os, "write", real_write)
    assert caught.value.code == errors.LEDGER_UNAVAILABLE
    assert "not recorded" in caught.value.message
    for line in (tmp_path / "ledger.json.journal").read_text().splitlines():
        json.loads(line)  # the partial line is gone
    store.close()
    reopened = LocalFileLedger(path)
    ledger = reopened.load("bf-full")
    assert ledger is not None and ledger.state_of(1) is ChunkState.RUNNING, "not committed"
    reopened.close()


def _committed(path: Path, shape: Any) -> LocalFileLedger:
    path.parent.mkdir()
    store = LocalFileLedger(path)
    store.initialize(shape, "a", 5)
    for chunk in shape.chunks:
        lease = store.acquire_lease(shape, chunk, "a", 30).lease
        assert lease is not None
        store.complete(lease, chunk, ChunkResult(committed=True, rows=1))
    return store


def test_a_restatement_the_disk_cannot_hold_records_none_of_its_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a restatement wrote one journal line per chunk, so a disk that filled up
    part way left the first chunks restated while the error said nothing was recorded. The
    call is one line now: all of its chunks are recorded, or none."""
    shape = make_shape("bf-restate-full", 6)
    measured = _committed(tmp_path / "measured" / "ledger.json", shape)
    journal = tmp_path / "measured" / "ledger.json.journal"
    before = journal.stat().st_size
    assert measured.restate(shape, [2, 3, 4, 5, 6], "fix", "ana") == [2, 3, 4, 5, 6]
    room = (journal.stat().st_size - before) // 2  # half of what the restatement writes
    measured.close()

    path = tmp_path / "full" / "ledger.json"
    store = _committed(path, shape)
    journal = path.with_name("ledger.json.journal")
    before = journal.stat().st_size
    real_write = os.write
    monkeypatch.setattr(os, "write", _disk_with_room(room))
    with pytest.raises(DponeError) as caught:
        store.restate(shape, [2, 3, 4, 5, 6], "fix", "ana")
    monkeypatch.setattr(os, "write", real_write)
    assert caught.value.code == errors.LEDGER_UNAVAILABLE
    assert journal.stat().st_size == before
    store.close()
    reopened = LocalFileLedger(path)
    ledger = reopened.load(shape.run_key)
    assert ledger is not None
    assert [ledger.state_of(c.index) for c in shape.chunks] == [ChunkState.COMMITTED] * 6
    assert reopened.restatements(shape.run_key) == []
    assert reopened.restate(shape, [2, 3], "fix", "ana") == [2, 3]  # and it can go on
    reopened.close()


def test_one_instance_shared_by_many_threads(tmp_path: Path) -> None:
    store = LocalFileLedger(tmp_path / "ledger.json", compact_every=100)
    shape = make_shape("bf-threads", 60)
    store.initialize(shape, "setup", 5)
    taken: list[int] = []
    guard = threading.Lock()

    def worker(number: int) -> None:
        for chunk in shape.chunks:
            outcome = store.acquire_lease(shape, chunk, f"t{number}", 30)
            if outcome.status is LeaseStatus.ACQUIRED and outcome.lease is not None:
                with guard:
                    taken.append(chunk.index)
                store.complete(outcome.lease, chunk, ChunkResult(committed=True))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(taken) == list(range(1, 61))
    ledger = store.load("bf-threads")
    assert ledger is not None and all(
        r.state is ChunkState.COMMITTED for r in ledger.records.values()
    )
    store.close()


def test_two_processes_share_one_file(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.json")
    with mp.get_context("spawn").Pool(2) as pool:
        results = pool.starmap(_run_all, [(path, "bf-mp", 40, "p0"), (path, "bf-mp", 40, "p1")])
    assert sorted(results[0] + results[1]) == list(range(1, 41))
    ledger = LocalFileLedger(path).load("bf-mp")
    assert ledger is not None and ledger.complete
