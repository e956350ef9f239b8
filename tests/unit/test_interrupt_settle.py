"""StopRequest.settle: a worker that releases its chunk after a stop waits until every cancel
of that stop was sent, so a late cancel cannot land on the statement that records the release."""

from __future__ import annotations

import threading
import time

from dpone.lifecycle.interrupt import StopRequest


def test_settle_returns_at_once_without_a_stop() -> None:
    stop = StopRequest()
    started = time.monotonic()
    stop.settle(timeout_s=30)
    assert time.monotonic() - started < 5  # did not wait for a stop that never came


def test_settle_waits_for_every_canceller_of_the_stop() -> None:
    stop = StopRequest()
    entered, gate = threading.Event(), threading.Event()
    called: list[str] = []

    def first() -> None:
        called.append("first")

    def slow() -> None:
        entered.set()
        gate.wait(10)
        called.append("slow")

    settled: list[list[str]] = []
    with stop.cancellable(first), stop.cancellable(slow):
        watcher = threading.Thread(target=stop.request, args=(15,))
        watcher.start()
        assert entered.wait(10)
        assert stop.requested  # the flag is up while the cancels are still going out
        waiter = threading.Thread(target=lambda: (stop.settle(30), settled.append(list(called))))
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive() and not settled  # still waiting for the slow cancel
        gate.set()
        waiter.join(10)
        watcher.join(10)
    assert settled == [["first", "slow"]]


def test_reset_clears_the_settled_stop() -> None:
    stop = StopRequest()
    stop.request(15)
    assert stop.settled.is_set()
    stop.reset()
    assert not stop.requested and not stop.settled.is_set()
