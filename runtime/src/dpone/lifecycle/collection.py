"""The cyclic garbage collector held off while `dpone run` starts.

Start-up builds the objects a run lives with: its modules (psycopg's ~250 error classes among
them), the plan, the ledger's records, the connections. None of it is garbage, yet the collector
traverses it again and again while it grows; once it is built, every full collection traverses it
all again (about 15 ms for the 40,000 objects of a mapped item). So the process's own `dpone run`
holds the collector off until the run starts moving rows, then freezes what start-up made (kept
out of every later collection, with the few hundred cyclic leftovers of start-up, tens of KB) and
turns the collector back on for the chunks. Measured on a mapped item: 10 ms less of its process's
CPU (docs/benchmarks.md). A caller that turned the collector off itself keeps it off.
"""

from __future__ import annotations

import gc

_held = {"off": False}


def hold_while_starting() -> None:
    """Turn the collector off until :func:`collect_from_here` (when it is on now)."""
    if gc.isenabled():
        gc.disable()
        _held["off"] = True


def collect_from_here() -> None:
    """The run starts moving rows: freeze what start-up made and turn the collector back on.
    Does nothing unless :func:`hold_while_starting` turned it off, so every mover may call it."""
    if _held["off"]:
        _held["off"] = False
        gc.freeze()
        gc.enable()
