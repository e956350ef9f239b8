"""A refusal before data moves still leaves a run result.

The generated operators read the result (XCom) to decide whether Airflow may retry: without one they
must assume a transient failure. So a `dpone run` refused before it entered the data path (a pack or
plan mismatch, a tampered item, an unreadable catalog, a missing connection, a usage error) writes a
``dpone.run-result.v1`` with status failed and its error's ``retryable`` from the registry: a pack
mismatch fails the task at once, a busy campaign stays retryable. The result path comes from the
environment (DPONE_XCOM_PATH or Airflow's sidecar folder), never from the catalog, so this works when
the catalog itself cannot be read. What is not known yet at the refusal (the pack's fingerprint
before it compiled, the mode before the item parsed) is null; the Airflow run it served (or that
it ran outside Airflow) is recorded from the moment DPONE_AIRFLOW_CONTEXT was read, the first
thing a run reads.

Once a process entered the data path its own result (with its counts) is the one written, so the
refusal result is off from then on.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dpone import errors
from dpone.errors import REGISTRY, DponeError, ErrorRecord
from dpone.observability.result import MESSAGE_MAX, RESULT_SCHEMA, write_json_atomic, xcom_path

NAME_MAX = 100  # the run-result schema's bound on workload and process


@dataclass
class RefusalScope:
    """What is known about the run so far, for the result of a refusal."""

    workload: str | None = None
    process: str | None = None
    mode: str | None = None
    pack_fingerprint: str | None = None
    run_key: str | None = None
    #: dpone.task.airflow_context.airflow_section, once the context was read
    airflow: dict[str, Any] | None = None
    started: float = field(default_factory=time.monotonic)
    #: a process entered the data path: it writes its own result from then on
    entered: bool = False

    def reset(self) -> None:
        """Forget a previous run of this process (tests call `dpone run` in one interpreter)."""
        vars(self).update(vars(RefusalScope()))

    def note(self, **facts: Any) -> None:
        """Record facts as they become known (None leaves a fact as it was)."""
        for key, value in facts.items():
            if value is not None:
                setattr(self, key, value)

    def document(self, record: ErrorRecord) -> dict[str, Any]:
        document = {
            "schema": RESULT_SCHEMA,
            "status": "failed",
            "workload": _bounded(self.workload),
            "process": _bounded(self.process),
            "mode": self.mode,
            "pack_fingerprint": self.pack_fingerprint,
            "duration_ms": max(0, int((time.monotonic() - self.started) * 1000)),
            "error": {
                "code": record.code,
                "message": record.message[:MESSAGE_MAX],
                "retryable": REGISTRY[record.code].retryable,
            },
            "backfill": {
                "run_key": self.run_key,
                "chunks_selected": 0,
                "chunks_committed": 0,
                "chunks_skipped_resume": 0,
                "chunks_failed": 0,
                "chunks_not_started": 0,
                "chunks_busy": 0,
                "chunks_cancelled": 0,
                "chunks_interrupted": 0,
                "rows_written": 0,
                "campaign_complete": None,
            },
        }
        if self.airflow is not None:
            document["airflow"] = self.airflow
        return document

    def write(self, record: ErrorRecord) -> None:
        """Write the refusal's result where the run's result goes; an unwritable destination
        leaves the refusal as it is (the error on stderr and the exit code still say it)."""
        if self.entered:
            return
        target = xcom_path()
        if target is None:
            return
        with contextlib.suppress(OSError):
            write_json_atomic(target, self.document(record))


def _bounded(name: str | None) -> str | None:
    return None if name is None else name[:NAME_MAX]


#: the scope of the `dpone run` in this process (one per process, like the stop flag)
SCOPE = RefusalScope()


@contextlib.contextmanager
def refusals_leave_a_result(usage: list[ErrorRecord]) -> Iterator[RefusalScope]:
    """Around `dpone run`: a DponeError, a usage error (its record appended to ``usage`` by the
    parser) or an unexpected exception before the data path writes the refusal's result, then
    propagates unchanged to the reporting in dpone.cli."""
    SCOPE.reset()
    try:
        yield SCOPE
    except DponeError as exc:
        SCOPE.write(exc.records[0])
        raise
    except SystemExit as exc:
        if exc.code not in (0, None):
            SCOPE.write(usage[-1] if usage else ErrorRecord(errors.USAGE, "usage error"))
        raise
    except Exception as exc:
        SCOPE.write(ErrorRecord(errors.INTERNAL, f"{type(exc).__name__}: {str(exc)[:300]}"))
        raise
