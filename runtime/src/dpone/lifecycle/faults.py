"""Test-only crash injection at named points; inert unless DPONE_TEST_FAULT is set.

``DPONE_TEST_FAULT=point:probability[:stop][,...]`` (probability 0..1, ``*`` names every point).
When a listed point is reached the process, with that probability, writes one line naming the
point to stderr and kills itself with SIGKILL: no ``finally``, no rollback, no goodbye to the
database, exactly like a crashed pod. With ``:stop`` it sends itself SIGSTOP instead (a stalled
pod; whoever set the fault resumes it with SIGCONT, typically after its lease expired). The chaos
suite (tests/chaos) uses it to crash or stall at the places a random timer rarely hits.

Points:
  campaign_locked  inside initialize, holding the campaign lock
  lease_locked     inside acquire_lease, the RUNNING record appended, chunk lock held, not committed
  chunk_leased     the lease is committed; nothing written to the sink yet
  chunk_written    same-transaction mode: the chunk's rows written, not committed, chunk lock held
  group_closed     same-transaction mode: a coalesced group's chunks written and recorded
                   COMMITTED, the group's one commit not sent yet, every chunk lock held
  sink_written     separate ledger: the chunk's rows written and its fence row claimed in the
                   sink's open transaction, not committed
  data_committed   separate ledger: the sink committed the chunk, no completion record yet
  close_locked     inside complete, the completion appended, chunk lock held, not committed
  result_written   a process's result (and evidence) written, before the next process starts
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

from dpone import errors
from dpone.errors import DponeError

ENV = "DPONE_TEST_FAULT"
POINTS = (
    "campaign_locked",
    "lease_locked",
    "chunk_leased",
    "chunk_written",
    "group_closed",
    "sink_written",
    "data_committed",
    "close_locked",
    "result_written",
)
ACTIONS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}
RESUME_PAUSE_S = 0.2
_CACHE: dict[str, dict[str, tuple[float, str]]] = {}


def _spec(raw: str) -> dict[str, tuple[float, str]]:
    if raw in _CACHE:
        return _CACHE[raw]
    spec: dict[str, tuple[float, str]] = {}
    for part in raw.split(","):
        name, _, rest = part.strip().partition(":")
        probability, _, action = rest.partition(":")
        try:
            value = float(probability)
        except ValueError:
            value = -1.0
        action = action or "kill"
        if (name != "*" and name not in POINTS) or not 0.0 <= value <= 1.0 or action not in ACTIONS:
            raise DponeError(
                errors.CONFIG_INVALID,
                f"{ENV}: {part.strip()!r} is not point:probability[:stop] "
                f"(points: {', '.join(POINTS)})",
            )
        spec[name] = (value, action)
    _CACHE[raw] = spec
    return spec


def fault_point(name: str) -> None:
    """Maybe crash (or stall) here: only when DPONE_TEST_FAULT lists this point."""
    raw = os.environ.get(ENV)
    if not raw:
        return
    spec = _spec(raw)
    probability, action = spec.get(name, spec.get("*", (0.0, "kill")))
    if probability > 0.0 and random.random() < probability:
        signum = ACTIONS[action]
        print(f"dpone: test fault: {signum.name} at {name}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signum)
        if signum == signal.SIGSTOP:  # continued: a signal sent while stopped is taken first
            time.sleep(RESUME_PAUSE_S)  # (the signal watcher thread reads it)
