"""ReadAhead on its own: what is handed over, what is dropped, and the memory it may hold."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.lifecycle.read_ahead import DEFAULT_READ_AHEAD_MB, ReadAhead, read_ahead_budget


class Producer:
    """Blocks of ``size`` bytes; ``gate`` holds the producer after ``hold_after`` blocks."""

    def __init__(self, blocks: int, size: int = 10, hold_after: int | None = None) -> None:
        self.blocks, self.size, self.hold_after = blocks, size, hold_after
        self.gate = threading.Event()
        self.cancelled = threading.Event()
        self.produced = 0
        self.fail_at: int | None = None

    def produce(self) -> Iterator[bytearray]:
        for i in range(self.blocks):
            if self.hold_after is not None and i == self.hold_after:
                self.gate.wait(5)
            if self.cancelled.is_set():
                raise RuntimeError("canceling statement due to user request")
            if self.fail_at == i:
                raise RuntimeError("source failed")
            self.produced += 1
            yield bytearray([i % 256]) * self.size

    def cancel(self) -> None:
        self.cancelled.set()
        self.gate.set()


def start(producer: Producer, budget: int = 1000) -> ReadAhead:
    return ReadAhead("key", None, producer.produce, producer.cancel, budget)


def until(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_every_block_is_handed_over_in_order() -> None:
    producer = Producer(blocks=7)
    ahead = start(producer)
    blocks = ahead.take()
    assert blocks is not None
    assert [bytes(b) for b in blocks] == [bytes([i]) * 10 for i in range(7)]
    assert ahead.wait() is True
    assert not producer.cancelled.is_set()


def test_an_empty_statement_hands_over_nothing() -> None:
    ahead = start(Producer(blocks=0))
    blocks = ahead.take()
    assert blocks is not None and list(blocks) == []
    assert ahead.wait() is True


def test_a_chunk_that_outgrows_the_budget_before_it_is_taken_is_dropped_and_cancelled() -> None:
    producer = Producer(blocks=50, size=100)
    ahead = start(producer, budget=450)
    until(lambda: ahead.overflowed)
    assert ahead.take() is None  # read it again as a stream
    assert producer.cancelled.is_set()
    assert ahead.drop() is False  # cancelled: its connection must not be reused


def test_a_slow_writer_bounds_what_is_held() -> None:
    producer = Producer(blocks=100, size=100, hold_after=1)
    ahead = start(producer, budget=300)
    until(lambda: producer.produced == 1)
    blocks = ahead.take()  # taken while the producer waits at its gate
    assert blocks is not None
    producer.gate.set()
    first = next(blocks)
    time.sleep(0.1)  # the writer stalls on its first block
    assert producer.produced <= 6, producer.produced
    assert len(first) + sum(len(b) for b in blocks) == 100 * 100
    assert ahead.wait() is True


def test_a_failure_before_the_take_means_read_again() -> None:
    producer = Producer(blocks=5)
    producer.fail_at = 3
    ahead = start(producer)
    until(lambda: not ahead._thread.is_alive())
    assert ahead.take() is None  # three blocks were read, none handed over: read again
    assert ahead.drop() is False


def test_a_failure_after_the_take_is_raised_to_the_writer() -> None:
    producer = Producer(blocks=5, hold_after=2)
    producer.fail_at = 3
    ahead = start(producer)
    blocks = ahead.take()
    assert blocks is not None
    assert len(bytes(next(blocks))) == 10
    producer.gate.set()
    with pytest.raises(RuntimeError, match="source failed"):
        list(blocks)
    assert ahead.wait() is False


def test_drop_cancels_a_running_read_and_waits_for_its_end() -> None:
    producer = Producer(blocks=10, hold_after=2)
    ahead = start(producer)
    until(lambda: producer.produced == 2)
    assert ahead.drop() is False
    assert producer.cancelled.is_set()
    assert not ahead._thread.is_alive()


def test_drop_after_a_clean_end_keeps_the_connection() -> None:
    producer = Producer(blocks=3)
    ahead = start(producer)
    until(lambda: not ahead._thread.is_alive())
    assert ahead.drop() is True
    assert not producer.cancelled.is_set()


@pytest.mark.parametrize(
    ("raw", "budget"),
    [
        (None, DEFAULT_READ_AHEAD_MB << 20),
        ("", DEFAULT_READ_AHEAD_MB << 20),
        ("0", 0),
        ("1", 1 << 20),
        ("0.5", 1 << 19),
    ],
)
def test_the_budget_comes_from_the_environment(raw: str | None, budget: int) -> None:
    environ = {} if raw is None else {"DPONE_READ_AHEAD_MB": raw}
    assert read_ahead_budget(environ) == budget


@pytest.mark.parametrize("raw", ["-1", "lots", "nan", "inf", "1e9"])
def test_a_bad_budget_is_a_config_error(raw: str) -> None:
    with pytest.raises(DponeError) as caught:
        read_ahead_budget({"DPONE_READ_AHEAD_MB": raw})
    assert caught.value.code == errors.CONFIG_INVALID
    assert "DPONE_READ_AHEAD_MB" in caught.value.message
