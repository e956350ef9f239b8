"""Every connector through the same behaviours (the kit is contract.py): a chunk's round trip
in each inner mode, the read-back gate, the fence, interruption and secret-free errors."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dpone import errors
from dpone.connectors.base import ChunkFence, InnerMode, SinkOptions, Source, checksum_rows
from dpone.errors import DponeError

from .contract import CONNECTORS, Connector, Tampered, connector
from .support import SECRET, WINDOWS, expected

WINDOW = WINDOWS["date"]
CAMPAIGN = "bf-0123456789abcdef01234567"


@pytest.fixture(params=CONNECTORS)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Connector]:
    with connector(request.param, request, tmp_path) as found:
        yield found


def target_checksum(db: Connector, source: Source | None = None) -> str:
    """The target's checksum: what the gate and ``dpone verify`` compare with the source's."""
    with db.source("dst") as target:
        if source is not None:
            Source.agree_both(target, source)  # two Postgres sides: the chained form
        return target.checksum(None)


@pytest.mark.parametrize("mode", ["replace", "merge", "append"])
def test_a_chunk_round_trips_in_every_inner_mode(db: Connector, mode: InnerMode) -> None:
    with db.source("orders") as source, db.sink(mode, SinkOptions()) as sink:
        written = sink.write_chunk(source, WINDOW)
        target = target_checksum(db, source)
        want = source.checksum(WINDOW)
    assert written.rows == len(expected(WINDOW)) == checksum_rows(want)
    assert written.checksum == want == written.source_checksum  # read back, gated, equal
    assert target == want


@pytest.mark.parametrize("mode", ["replace", "merge"])
def test_writing_a_chunk_again_changes_nothing(db: Connector, mode: InnerMode) -> None:
    with db.source("orders") as source, db.sink(mode, SinkOptions()) as sink:
        sink.write_chunk(source, WINDOW)
        again = sink.write_chunk(source, WINDOW)
        target = target_checksum(db, source)
        assert again.checksum == source.checksum(WINDOW) == target


def test_full_refresh_replaces_every_row(db: Connector) -> None:
    with db.source("orders") as source:
        with db.sink("replace", SinkOptions()) as sink:
            sink.write_chunk(source, WINDOWS["integer"])
        with db.sink("full_refresh", SinkOptions()) as sink:
            written = sink.write_all(source)
        target = target_checksum(db, source)
        assert written.checksum == source.checksum(None) == target


def test_the_read_back_gate_refuses_a_changed_value(db: Connector) -> None:
    with db.source("orders") as source, db.sink("replace", SinkOptions()) as sink:
        before = target_checksum(db)
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(Tampered(source), WINDOW)
    assert caught.value.code == errors.READ_BACK_MISMATCH
    assert "different content" in caught.value.message
    assert target_checksum(db) == before  # rolled back


def test_the_fence_refuses_a_stale_attempt(db: Connector) -> None:
    with db.source("orders") as source, db.sink("replace", SinkOptions()) as sink:
        sink.write_chunk(source, WINDOW, fence=ChunkFence(CAMPAIGN, 3, 2))
        off = SinkOptions(read_back="off")  # the target is its own source here
        with db.sink("full_refresh", off) as emptier, db.source("dst") as empty:
            emptier.write_all(empty)  # empty the target (the fence row stays)
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, WINDOW, fence=ChunkFence(CAMPAIGN, 3, 1))
        assert caught.value.code == errors.CHUNK_LEASE_LOST
        assert "superseded by attempt 2" in caught.value.message
        assert checksum_rows(target_checksum(db)) == 0  # nothing of the stale attempt
        newer = sink.write_chunk(source, WINDOW, fence=ChunkFence(CAMPAIGN, 3, 3))
        assert newer.rows == len(expected(WINDOW))


def test_interrupt_when_idle_is_harmless(db: Connector) -> None:
    with db.source("orders") as source, db.sink("replace", SinkOptions()) as sink:
        source.interrupt()
        sink.interrupt()
        assert sink.write_chunk(source, WINDOW).rows == len(expected(WINDOW))
        source.interrupt()
        sink.interrupt()


def test_interrupt_ends_a_read_in_flight(db: Connector) -> None:
    if db.slow_source is None:
        pytest.skip(f"the {db.kind} connector cannot cancel a statement (docs/connectors.md)")
    failure: list[BaseException] = []
    with db.slow_source() as source:
        columns = source.columns()
        assert "customer" in columns

        def read() -> None:
            try:
                source.checksum(None)
            except BaseException as exc:  # re-checked on the test's thread
                failure.append(exc)

        reader = threading.Thread(target=read)
        started = time.monotonic()
        reader.start()
        time.sleep(1.0)
        source.interrupt()
        reader.join(timeout=30)
        elapsed = time.monotonic() - started
    assert not reader.is_alive()
    assert failure and isinstance(failure[0], DponeError)
    assert failure[0].code == errors.SOURCE_FAILED
    assert elapsed < 15


def test_a_driver_error_is_translated_without_secrets(db: Connector) -> None:
    with db.source("orders") as source, db.broken_sink() as sink:
        with pytest.raises(DponeError) as caught:
            sink.write_chunk(source, WINDOW)
    err = caught.value
    assert err.code in (errors.CONNECTION_FAILED, errors.SINK_FAILED, errors.CONFIG_INVALID)
    assert SECRET not in err.message and SECRET not in str(err)
    assert "Traceback" not in err.message
