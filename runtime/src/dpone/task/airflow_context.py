"""``dpone.airflow-context.v1`` (DPONE_AIRFLOW_CONTEXT): the Airflow run a task serves.

The generated operators read it from the task context at execute time (never Jinja) and pass it
as one compact JSON value. It says who moved a chunk, not what to move: it is parsed as strictly
as the mapping item, recorded in the result, the evidence and the ledger's lease owner, and never
widens or narrows what runs. A run without it ran outside Airflow and says so.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from dpone import errors
from dpone.errors import DponeError
from dpone.plan.canonical import field_values, strict_json_object
from dpone.records import record
from dpone.task.item import ENV_CONTEXT

CONTEXT_SCHEMA = "dpone.airflow-context.v1"
CONTEXT_MAX_BYTES = 4096
ID_MAX_CHARS = 250  # Airflow's ID_LEN (dag_id, task_id, run_id columns)
TRY_MAX = 100_000
DATE_MAX_CHARS = 40
_FIELDS = (
    "schema",
    "dag_id",
    "task_id",
    "run_id",
    "try_number",
    "map_index",
    "logical_date",
    "data_interval_start",
    "data_interval_end",
)
_DATES = ("logical_date", "data_interval_start", "data_interval_end")
# What datetime.isoformat() gives (Airflow 2.x pendulum and 3.x datetimes alike), "Z" too; ASCII
# digits only, and datetime.fromisoformat() must then accept it (no month 99, no hour 25).
_DATE = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,6})?)?"
    r"(?:Z|[+-][0-9]{2}:[0-9]{2}(?::[0-9]{2})?)?$"
)
# The ledger's lease owner of an Airflow attempt: "airflow try=T map=M run=R on <host:pid:token>".
_OWNER = re.compile(r"^airflow try=(\d+) map=(-?\d+) run=(.+) on [^ ]+$")
LOCAL_OWNER_PREFIX = "local on "


@record
class AirflowContext:
    dag_id: str
    task_id: str
    run_id: str
    try_number: int
    map_index: int
    logical_date: str | None
    data_interval_start: str | None
    data_interval_end: str | None

    def to_json(self) -> dict[str, Any]:
        """The result's and evidence's ``airflow`` section."""
        return {"outside_airflow": False, **field_values(self)}

    def owner_prefix(self) -> str:
        """The start of the ledger's lease owner: which run, try and map index moved a chunk."""
        return f"airflow try={self.try_number} map={self.map_index} run={self.run_id} on "


OUTSIDE_AIRFLOW: dict[str, Any] = {"outside_airflow": True}


def airflow_section(context: AirflowContext | None) -> dict[str, Any]:
    """What the result records: the Airflow run, or that the run was outside Airflow."""
    return context.to_json() if context is not None else dict(OUTSIDE_AIRFLOW)


def owner_prefix(context: AirflowContext | None) -> str:
    return context.owner_prefix() if context is not None else LOCAL_OWNER_PREFIX


def attribution(owner: str | None) -> dict[str, Any] | None:
    """Who a lease owner says moved (or holds) a chunk: the Airflow run, try and map index, or
    outside Airflow; None for an owner written before dpone recorded it."""
    if owner is None:
        return None
    if owner.startswith(LOCAL_OWNER_PREFIX):
        return dict(OUTSIDE_AIRFLOW)
    match = _OWNER.match(owner)
    if match is None:
        return None
    return {
        "outside_airflow": False,
        "run_id": match.group(3),
        "try_number": int(match.group(1)),
        "map_index": int(match.group(2)),
    }


def describe_attribution(moved_by: dict[str, Any] | None) -> str:
    """One line's words for :func:`attribution`."""
    if moved_by is None:
        return "by an unrecorded run"
    if moved_by["outside_airflow"]:
        return "outside Airflow"
    return (
        f"by run {moved_by['run_id']}, try {moved_by['try_number']}, "
        f"map index {moved_by['map_index']}"
    )


def _fail(message: str) -> DponeError:
    return DponeError(errors.AIRFLOW_CONTEXT_INVALID, f"{ENV_CONTEXT}: {message}")


def _utf8(value: str) -> bool:
    """Whether ``value`` encodes as UTF-8: a lone surrogate (``\\ud800`` in the JSON, or an
    undecodable byte in the env value, which Python holds as a surrogate escape) does not, and
    would fail the run only when it writes its result and ledger rows, after data moved."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _identifier(doc: dict[str, Any], key: str) -> str:
    """An id as Airflow's ID_LEN allows, printable (str.isprintable: no C0/C1 controls, no line or
    paragraph separators), since it goes into the lease owner and `dpone ledger status` text."""
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise _fail(f"{key} must be a non-empty string")
    if not _utf8(value):
        raise _fail(f"{key} is not valid UTF-8 (a lone surrogate or an undecodable byte)")
    if len(value) > ID_MAX_CHARS or not value.isprintable():
        raise _fail(f"{key} must be at most {ID_MAX_CHARS} printable characters")
    return value


def _integer(doc: dict[str, Any], key: str, low: int) -> int:
    value = doc.get(key)
    if type(value) is not int or not low <= value <= TRY_MAX:
        raise _fail(f"{key} must be an integer from {low} to {TRY_MAX}")
    return value


def _date(doc: dict[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > DATE_MAX_CHARS or not _DATE.fullmatch(value):
        raise _fail(f"{key} must be an ISO 8601 date-time or null")
    try:
        dt.datetime.fromisoformat(value)
    except ValueError:
        raise _fail(f"{key} must be an ISO 8601 date-time or null") from None
    return value


def parse_airflow_context(raw: str) -> AirflowContext:
    """Parse the context as strictly as the run identity: bounded, no duplicate keys, no unknown
    fields, typed; messages never echo the raw value."""
    doc = strict_json_object(raw, CONTEXT_MAX_BYTES, _FIELDS, _fail)
    if doc.get("schema") != CONTEXT_SCHEMA:
        raise _fail(f"schema must be {CONTEXT_SCHEMA!r}")
    return AirflowContext(
        dag_id=_identifier(doc, "dag_id"),
        task_id=_identifier(doc, "task_id"),
        run_id=_identifier(doc, "run_id"),
        # 0: a task instance with no try yet (``airflow tasks test`` on a fresh date)
        try_number=_integer(doc, "try_number", 0),
        map_index=_integer(doc, "map_index", -1),
        logical_date=_date(doc, "logical_date"),
        data_interval_start=_date(doc, "data_interval_start"),
        data_interval_end=_date(doc, "data_interval_end"),
    )
