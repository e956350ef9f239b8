"""``dpone.airflow-run-identity.v1``: what a DAG task was generated from, shared by all its items."""

from __future__ import annotations

from typing import Any

from dpone import errors
from dpone.errors import DponeError
from dpone.plan.canonical import canonical_text, field_values, is_fingerprint, strict_json_object
from dpone.records import record

RUN_IDENTITY_SCHEMA = "dpone.airflow-run-identity.v1"
IDENTITY_MAX_BYTES = 4096
_FIELDS = ("schema", "dag_id", "workload", "process", "pack_fingerprint", "flavour", "image")


@record
class RunIdentity:
    dag_id: str
    workload: str
    process: str
    pack_fingerprint: str
    flavour: str
    image: str | None

    def to_json(self) -> dict[str, Any]:
        return {"schema": RUN_IDENTITY_SCHEMA, **field_values(self)}

    def env_value(self) -> str:
        return canonical_text(self.to_json())


def _fail(message: str) -> DponeError:
    return DponeError(errors.RUN_IDENTITY_INVALID, f"DPONE_AIRFLOW_RUN_IDENTITY: {message}")


def parse_run_identity(raw: str) -> RunIdentity:
    """Parse the identity as strictly as the mapping item (dpone.task.item): no duplicate keys, no
    NaN/Infinity, and messages that never echo the raw value or its unknown key names."""
    doc = strict_json_object(raw, IDENTITY_MAX_BYTES, _FIELDS, _fail)
    if doc.get("schema") != RUN_IDENTITY_SCHEMA:
        raise _fail(f"schema must be {RUN_IDENTITY_SCHEMA!r}")
    for key in ("dag_id", "workload", "process", "flavour"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise _fail(f"{key} must be a non-empty string")
    if not is_fingerprint(doc.get("pack_fingerprint")):
        raise _fail("pack_fingerprint must be sha256: followed by 64 lowercase hex digits")
    image = doc.get("image")
    if image is not None and not isinstance(image, str):
        raise _fail("image must be a string or null")
    return RunIdentity(
        doc["dag_id"],
        doc["workload"],
        doc["process"],
        doc["pack_fingerprint"],
        doc["flavour"],
        image,
    )
