"""local_file readers and bounded lock waits: `ledger status`/`list` open the ledger read-only
(creating, cutting or locking out nothing), and no caller waits forever for a frozen lock holder."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.ledger.factory import open_store
from dpone.ledger.localfile import LocalFileLedger
from dpone.ledger.port import ChunkResult, ChunkState
from ledger_backends import make_shape

HOLD = """\
import fcntl, sys, time
handle = open(sys.argv[1], "a")
fcntl.flock(handle, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


def _written(path: Path, chunks: int = 3, committed: int = 2) -> None:
    store = LocalFileLedger(path)
    shape = make_shape("bf-reader", chunks)
    store.initialize(shape, "a", 5)
    for chunk in shape.chunks[:committed]:
        lease = store.acquire_lease(shape, chunk, "a", 30).lease
        assert lease is not None
        store.complete(lease, chunk, ChunkResult(committed=True, rows=chunk.index))
    store.close()


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Path]:
    """The ledger's lock file, held exclusively by another process until the test ends."""
    path = tmp_path / "ledger.json"
    _written(path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path) + ".lock"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield path
    finally:
        holder.kill()
        holder.wait()


def _bounded(call: Callable[[], Any], limit_s: float = 5.0) -> BaseException | None:
    """Run call in a thread: its exception, or a test failure when it is still waiting."""
    caught: list[BaseException | None] = [None]

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # handed back to the test
            caught[0] = exc

    thread = threading.Thread(target=target, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        pytest.fail(f"still waiting for the ledger lock after {limit_s}s")
    assert time.monotonic() - started < limit_s
    return caught[0]


def test_a_reader_creates_nothing_and_leaves_a_torn_line_alone(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    _written(path)
    (tmp_path / "ledger.json.lock").unlink()
    journal = tmp_path / "ledger.json.journal"
    with open(journal, "a") as handle:
        handle.write('{"seq": 99, "kind": "transi')  # a writer died mid-append
    before = journal.read_bytes()
    reader = LocalFileLedger(path, read_only=True)
    ledger = reader.load("bf-reader")
    assert reader.list_campaigns() == ["bf-reader"]
    assert reader.committed_count("bf-reader") == 2
    reader.close()
    assert ledger is not None and ledger.state_of(2) is ChunkState.COMMITTED
    assert ledger.state_of(3) is ChunkState.PENDING
    assert journal.read_bytes() == before, "a reader cut the journal"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.json.journal"]


def test_a_reader_of_a_compacted_ledger_reads_snapshot_and_journal(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    store = LocalFileLedger(path, compact_every=4)
    shape = make_shape("bf-reader", 5)
    store.initialize(shape, "a", 5)
    for chunk in shape.chunks:
        lease = store.acquire_lease(shape, chunk, "a", 30).lease
        assert lease is not None
        store.complete(lease, chunk, ChunkResult(committed=True))
    store.close()
    assert path.exists() and (tmp_path / "ledger.json.journal").stat().st_size > 0
    reader = LocalFileLedger(path, read_only=True)
    ledger = reader.load("bf-reader")
    reader.close()
    assert ledger is not None and ledger.complete


def test_a_reader_records_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    _written(path)
    before = (tmp_path / "ledger.json.journal").read_bytes()
    reader = LocalFileLedger(path, read_only=True)
    with pytest.raises(DponeError) as refused:
        reader.cancel("bf-reader", "no")
    assert refused.value.code == errors.LEDGER_UNAVAILABLE
    with pytest.raises(DponeError):
        reader.acquire_lease(
            make_shape("bf-reader", 3), make_shape("bf-reader", 3).chunks[2], "b", 30
        )
    reader.close()
    assert (tmp_path / "ledger.json.journal").read_bytes() == before


def test_readers_share_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    _written(path)
    first = LocalFileLedger(path, read_only=True, lock_timeout_s=0.5)
    second = LocalFileLedger(path, read_only=True, lock_timeout_s=0.5)
    with first._locked():
        assert second.committed_count("bf-reader") == 2
    first.close()
    second.close()


def test_a_reader_gives_up_on_a_held_lock_as_busy(held: Path) -> None:
    reader = LocalFileLedger(held, read_only=True, lock_timeout_s=0.3)
    failure = _bounded(lambda: reader.load("bf-reader"))
    reader.close()
    assert isinstance(failure, DponeError), failure
    assert failure.code == errors.MAPPING_CAMPAIGN_BUSY
    assert "not free within 0.3s" in failure.message


@pytest.mark.parametrize("step", ["load", "lease", "complete", "renew"])
def test_a_run_gives_up_on_a_held_lock_as_busy(tmp_path: Path, step: str) -> None:
    """A frozen process holding the lock must not stall every run's lease, completion or
    renewal forever: after lock_timeout_s the call fails retryable (BUSY)."""
    path = tmp_path / "ledger.json"
    store = LocalFileLedger(path, lock_timeout_s=0.3)
    shape = make_shape("bf-run", 2)
    store.initialize(shape, "a", 5)
    lease = store.acquire_lease(shape, shape.chunks[0], "a", 30).lease
    assert lease is not None
    calls: dict[str, Callable[[], Any]] = {
        "load": lambda: store.load("bf-run"),
        "lease": lambda: store.acquire_lease(shape, shape.chunks[1], "a", 30),
        "complete": lambda: store.complete(lease, shape.chunks[0], ChunkResult(committed=True)),
        "renew": lambda: store.renew(lease, 30),
    }
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path) + ".lock"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        failure = _bounded(calls[step])
    finally:
        holder.kill()
        holder.wait()
    assert isinstance(failure, DponeError), failure
    assert failure.code == errors.MAPPING_CAMPAIGN_BUSY
    assert errors.REGISTRY[failure.code].retryable
    calls[step]()  # the holder is gone: the same call goes through
    store.close()


def _compacted(path: Path) -> None:
    """A ledger whose records all sit in its snapshot (no journal line left)."""
    _written(path)
    store = LocalFileLedger(path, compact_every=1)
    store.compact()
    store.close()


@pytest.mark.parametrize(
    ("damage", "code"),
    [
        ("snapshot-a-list", errors.LEDGER_CORRUPT),
        ("snapshot-no-campaigns", errors.LEDGER_CORRUPT),
        ("journal-seq-too-large", errors.LEDGER_CORRUPT),
        ("journal-index-a-string", errors.LEDGER_CORRUPT),
        ("snapshot-a-folder", errors.LEDGER_UNAVAILABLE),
        ("journal-a-folder", errors.LEDGER_UNAVAILABLE),
    ],
)
@pytest.mark.parametrize("read_only", [True, False], ids=["reader", "writer"])
def test_a_malformed_ledger_is_refused_as_such_never_as_an_internal_error(
    tmp_path: Path, damage: str, code: str, read_only: bool
) -> None:
    path = tmp_path / "ledger"
    journal = path.with_name("ledger.journal")
    if damage.startswith("snapshot"):
        _compacted(path)
    else:
        _written(path)
    if damage == "snapshot-a-list":
        path.write_text("[]")
    elif damage == "snapshot-no-campaigns":
        path.write_text('{"format": "dpone-local-ledger", "format_version": 1}')
    elif damage == "journal-seq-too-large":
        lines = journal.read_text().splitlines()
        journal.write_text(
            "\n".join([lines[0].replace('"seq":1', '"seq":1e400', 1), *lines[1:]]) + "\n"
        )
    elif damage == "journal-index-a-string":
        lines = journal.read_text().splitlines()
        journal.write_text(
            "\n".join(
                [*lines[:-1], lines[-1].replace('"chunk_index":', '"chunk_index":"x",  "was":', 1)]
            )
            + "\n"
        )
    elif damage == "snapshot-a-folder":
        path.unlink()
        path.mkdir()
    else:
        journal.unlink()
        journal.mkdir()
    with pytest.raises(DponeError) as caught:
        store = open_store("local_file", None, None, str(path), read_only=read_only)
        try:
            store.load("bf-reader")
        finally:
            store.close()
    assert caught.value.code == code, caught.value
