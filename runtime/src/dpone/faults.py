"""Test-only crash injection at named points; inert unless DPONE_TEST_FAULT is set.

``DPONE_TEST_FAULT=point:probability[,point:probability...]`` (probability 0..1, ``*`` names every
point). When a listed point is reached the process, with that probability, writes one line naming
the point to stderr and kills itself with SIGKILL: no ``finally``, no rollback, no goodbye to the
database, exactly like a crashed pod. The chaos suite (tests/chaos) uses it to crash at the
places a random timer rarely hits.

Points:
  campaign_locked  inside initialize, holding the campaign lock
  lease_locked     inside acquire_lease, the RUNNING record appended, chunk lock held, not committed
  chunk_written    same-transaction mode: the chunk's rows written, not committed, chunk lock held
  data_committed   separate ledger: the sink committed the chunk, no completion record yet
  close_locked     inside complete, the completion appended, chunk lock held, not committed
"""

from __future__ import annotations

import os
import random
import signal
import sys

from dpone import errors
from dpone.errors import DponeError

ENV = "DPONE_TEST_FAULT"
POINTS = ("campaign_locked", "lease_locked", "chunk_written", "data_committed", "close_locked")
_CACHE: dict[str, dict[str, float]] = {}


def _spec(raw: str) -> dict[str, float]:
    if raw in _CACHE:
        return _CACHE[raw]
    spec: dict[str, float] = {}
    for part in raw.split(","):
        name, _, probability = part.strip().partition(":")
        try:
            value = float(probability)
        except ValueError:
            value = -1.0
        if (name != "*" and name not in POINTS) or not 0.0 <= value <= 1.0:
            raise DponeError(
                errors.CONFIG_INVALID,
                f"{ENV}: {part.strip()!r} is not point:probability (points: {', '.join(POINTS)})",
            )
        spec[name] = value
    _CACHE[raw] = spec
    return spec


def fault_point(name: str) -> None:
    """Maybe crash here (only when DPONE_TEST_FAULT lists this point)."""
    raw = os.environ.get(ENV)
    if not raw:
        return
    spec = _spec(raw)
    probability = spec.get(name, spec.get("*", 0.0))
    if probability > 0.0 and random.random() < probability:
        print(f"dpone: test fault: SIGKILL at {name}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
