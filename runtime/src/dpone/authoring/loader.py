"""Load a workload catalog and its manifests into frozen objects, collecting every error.

Steps: parse YAML with positions -> validate against the published JSON Schema -> apply the
rules a schema cannot express (one of table/query, merge keys, mapping policy, provider-owned
env) -> normalise to ``Catalog``. Nothing here touches a database or the network.
"""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

from dpone import errors
from dpone.authoring.models import (
    DEFAULT_COALESCE_CHUNKS,
    DEFAULT_COALESCE_ROWS,
    DEFAULT_COALESCE_SECONDS,
    AirflowConfig,
    AirflowConnectionRef,
    BackfillConfig,
    Catalog,
    CoalesceConfig,
    Hook,
    Manifest,
    ProcessConfig,
    SecretFile,
    SecretRef,
    SinkConfig,
    SourceConfig,
    StateConfig,
    TableName,
    Workload,
)
from dpone.authoring.schema import load_schema, validate
from dpone.authoring.yamldoc import YamlDocument, load_yaml
from dpone.credentials.redaction import (
    has_credentials,
    json_secrets,
    secret_assignment,
    secret_env_name,
)
from dpone.errors import ErrorCollector, ErrorRecord, Location
from dpone.ledger.sql import SCHEMA_NAME
from dpone.plan.chunks import ChunkPlanError, ChunkSpec, canonical_bound
from dpone.plan.mapping import MappingPolicy, normalize_policy
from dpone.suggest import did_you_mean
from dpone.task.item import PROVIDER_OWNED_ENV

CATALOG_SCHEMA = "workload-catalog.v1.schema.json"
#: the process keys rules checked after loading point at (ProcessConfig.at)
LOCATED_PROCESS_KEYS = (
    "backfill.chunk",
    "backfill.chunk.end",
    "backfill.inner_mode",
    "backfill.parallel_workers",
    "sink.strategy",
    "state.backend",
    "state.connection",
    "state.require_distributed_lock",
)
#: the catalog's top-level keys every workload depends on (a violation there stops the planning)
_SHARED_KEYS = frozenset({"schema", "defaults", "workloads"})
MANIFEST_SCHEMA = "pipeline.v1.schema.json"
DEFAULT_UNITS = {"date": "day", "timestamp": "hour", "integer": "value"}
# Where deploy/Containerfile copies the catalog folder (tests/unit/test_check_one_pass.py keeps them equal).
DEFAULT_IMAGE_CATALOG_PATH = "/opt/dpone/catalog/workloads.yaml"
DEFAULT_LEASE_SECONDS = 60
DEFAULT_START_DATE = "2024-01-01"
# Airflow task arguments the catalog may set beside ``retries``, in the order the DAG file writes them.
TASK_OPTIONS = (
    "retry_delay",
    "retry_exponential_backoff",
    "max_retry_delay",
    "execution_timeout",
    "owner",
    "queue",
    "priority_weight",
)
# Operator arguments dpone writes itself: the catalog sets them through its own fields (image,
# namespace, env, secrets, resources, retries, mapping) or never (the item env and the expand list).
OWNED_ARGUMENTS = frozenset(
    {
        "arguments",
        "cmds",
        "command",
        "container_resources",
        "do_xcom_push",
        "env_vars",
        "expand",
        "image",
        "map_index_template",
        "max_active_tis_per_dag",
        "name",
        "namespace",
        "partial",
        "pool",
        "pool_slots",
        "retries",
        "secrets",
        "task_id",
        "validate_result",
    }
)


def pod_option_names() -> tuple[str, ...]:
    """The ``airflow.pod`` keys in the order the DAG file writes them: the schema's order."""
    return tuple(load_schema(CATALOG_SCHEMA)["$defs"]["pod"]["properties"])


def _owned_argument(path: tuple[str | int, ...]) -> bool:
    """An unknown key directly under ``airflow`` or ``airflow.pod`` that dpone itself writes."""
    if len(path) < 2 or path[-1] not in OWNED_ARGUMENTS:
        return False
    return path[-2] == "pod" or (path[-2] == "airflow" and path[-1] not in ("image", "namespace"))


def _in_mapping_policy(path: tuple[str | int, ...]) -> bool:
    """Inside an ``airflow.mapping`` node, whose problems normalize_policy reports with its codes.

    Only those exact positions: a workload or env key that happens to be named "mapping" is not
    a policy, and its schema violations must still be reported.
    """
    return path[:3] in (("defaults", "airflow", "mapping"), ("gitops", "airflow", "mapping")) or (
        len(path) >= 4 and path[0] == "workloads" and path[2:4] == ("airflow", "mapping")
    )


def _schema_violations(
    doc: YamlDocument, schema_name: str, code: str, out: ErrorCollector
) -> list[tuple[str | int, ...]]:
    """Report schema violations (mapping policies are left to normalize_policy's own codes);
    the path of each one reported."""
    paths: list[tuple[str | int, ...]] = []
    for violation in validate(doc.data, load_schema(schema_name)):
        if _in_mapping_policy(violation.path):
            continue
        paths.append(tuple(violation.path))
        unknown = violation.message.startswith("unknown field")
        where = doc.locate(violation.path, key=unknown)
        shown = ".".join(str(p) for p in violation.path) or "document"
        message = violation.message
        if unknown and _owned_argument(violation.path):
            message = (
                f"{violation.path[-1]!r} is written by dpone, not set in the catalog (use the "
                "airflow fields image, namespace, env, secrets, resources, retries, mapping)"
            )
        out.add(code, f"{shown}: {message}", where)
    return paths


def _broken_workloads(doc: YamlDocument, paths: list[tuple[str | int, ...]]) -> set[str] | None:
    """The workloads whose own catalog entry breaks the schema, when every violation lies in
    one (an unknown top-level key touches none); None when one lies in what every workload
    shares (``defaults``, the ``workloads`` mapping itself): nothing can be planned then."""
    broken: set[str] = set()
    for path in paths:
        if len(path) >= 2 and path[0] == "workloads" and isinstance(path[1], str):
            broken.add(path[1])
        elif not (len(path) == 1 and path[0] not in _SHARED_KEYS):
            return None
    workloads = doc.data.get("workloads") if isinstance(doc.data, dict) else None
    if not isinstance(workloads, dict) or not set(workloads) - broken:
        return None
    return broken


def _policy(
    raw: Any, doc: YamlDocument, path: tuple[str | int, ...], out: ErrorCollector
) -> MappingPolicy | None:
    policy, problems = normalize_policy(raw)
    for problem in problems:
        field_path = (*path, problem.field) if problem.field else path
        key = problem.message.startswith("unknown mapping field")
        shown = ".".join(str(p) for p in field_path)
        out.add(problem.code, f"{shown}: {problem.message}", doc.locate(field_path, key=key))
    return policy


def _table(raw: dict[str, Any] | None) -> TableName | None:
    if raw is None:
        return None
    return TableName(raw.get("schema"), raw["name"])


def _process(
    raw: dict[str, Any], doc: YamlDocument, index: int, out: ErrorCollector
) -> ProcessConfig | None:
    path: tuple[str | int, ...] = ("processes", index)
    name = raw["name"]
    src = raw["source"]
    has_table, has_query = "table" in src, "query" in src
    if has_table == has_query:
        out.add(
            errors.MANIFEST_INVALID,
            f"process {name!r}: source needs exactly one of table or query",
            doc.locate((*path, "source")),
        )
    sink_raw = raw["sink"]
    strategy = sink_raw["strategy"]["mode"]
    keys = tuple(sink_raw.get("keys", ()))
    accepted = tuple(sink_raw.get("accept_narrowing", ()))
    listed = src.get("columns")
    for i, column in enumerate(accepted):
        if column in accepted[:i]:
            out.add(
                errors.MANIFEST_INVALID,
                f"process {name!r}: sink.accept_narrowing names {column!r} twice",
                doc.locate((*path, "sink", "accept_narrowing", i)),
            )
        elif listed is not None and column not in listed:
            out.add(
                errors.MANIFEST_INVALID,
                f"process {name!r}: sink.accept_narrowing names {column!r}, which is not among "
                "source.columns",
                doc.locate((*path, "sink", "accept_narrowing", i)),
            )
    backfill: BackfillConfig | None = None
    bf_raw = raw.get("backfill")
    if strategy == "backfill" and bf_raw is None:
        out.add(
            errors.MANIFEST_INVALID,
            f"process {name!r}: sink.strategy.mode backfill needs a backfill section",
            doc.locate((*path, "sink", "strategy", "mode")),
        )
    if strategy == "full_refresh" and bf_raw is not None:
        out.add(
            errors.MANIFEST_INVALID,
            f"process {name!r}: sink.strategy.mode full_refresh takes no backfill section",
            doc.locate((*path, "backfill"), key=True),
        )
    if bf_raw is not None and strategy == "backfill":
        backfill = _backfill(bf_raw, doc, (*path, "backfill"), name, keys, out)
    if backfill is not None and backfill.inner_mode == "merge":
        for i, column in enumerate(accepted):
            role = "a merge key" if column in keys else None
            role = "the chunk column" if column == backfill.chunk.column else role
            if role is not None:
                out.add(
                    errors.MANIFEST_INVALID,
                    f"process {name!r}: sink.accept_narrowing names {column!r}, {role} of a "
                    "merge: the read-back gate reads a merge back by its keys, so a row the "
                    "target moved into another chunk, or two keys it rounded into one, would "
                    "pass; widen the target column instead",
                    doc.locate((*path, "sink", "accept_narrowing", i)),
                )
    st = raw.get("state", {"backend": "local_file"})
    backend = st["backend"]
    if backend == "audit_schema" and "connection" not in st:
        out.add(
            errors.MANIFEST_INVALID,
            f"process {name!r}: state.backend audit_schema needs state.connection",
            doc.locate((*path, "state")),
        )
    if backend == "clickhouse":
        out.add(
            errors.MANIFEST_INVALID,
            f"process {name!r}: state.backend clickhouse is not supported in this release (dpone "
            "has no ClickHouse ledger store; the pod would fail with DPONE_LEDGER_UNAVAILABLE): "
            "use audit_schema (Postgres or MSSQL) or local_file",
            doc.locate((*path, "state", "backend")),
        )
    schema = st.get("schema", "dpone_audit")
    if backend == "audit_schema" and not (isinstance(schema, str) and SCHEMA_NAME.match(schema)):
        out.add(
            errors.MANIFEST_INVALID,
            f"process {name!r}: state.schema {schema!r} is not a plain identifier (letters, "
            "digits, _; at most 63 characters, not starting with a digit)",
            doc.locate((*path, "state", "schema")),
        )
    state_path = st.get("path")
    if backend == "local_file" and isinstance(state_path, str) and _system_path(state_path):
        out.add(
            errors.MANIFEST_INVALID,
            f"process {name!r}: state.path {state_path!r} is under a kernel file system "
            "(/proc, /sys, /dev), where no ledger file can live",
            doc.locate((*path, "state", "path")),
        )
    state = StateConfig(
        backend=backend,
        connection=st.get("connection"),
        schema=schema,
        path=st.get("path"),
        require_distributed_lock=bool(st.get("require_distributed_lock", False)),
    )
    return ProcessConfig(
        name=name,
        source=SourceConfig(
            connection=src["connection"],
            table=_table(src.get("table")),
            query=src.get("query"),
            columns=tuple(src["columns"]) if "columns" in src else None,
        ),
        sink=SinkConfig(
            connection=sink_raw["connection"],
            table=TableName(sink_raw["table"].get("schema"), sink_raw["table"]["name"]),
            keys=keys,
            strategy=strategy,
            read_back=sink_raw.get("read_back", "checksum"),
            accept_narrowing=accepted,
            table_location=doc.locate((*path, "sink", "table")),
            narrowing_locations=tuple(
                doc.locate((*path, "sink", "accept_narrowing", i)) for i in range(len(accepted))
            ),
        ),
        backfill=backfill,
        state=state,
        location=doc.locate(path),
        key_locations=tuple(
            (dotted, doc.locate((*path, *dotted.split(".")))) for dotted in LOCATED_PROCESS_KEYS
        ),
    )


def _backfill(
    raw: dict[str, Any],
    doc: YamlDocument,
    path: tuple[str | int, ...],
    process: str,
    keys: tuple[str, ...],
    out: ErrorCollector,
) -> BackfillConfig | None:
    chunk = raw["chunk"]
    ctype = chunk["type"]
    unit = chunk.get("unit", DEFAULT_UNITS[ctype])
    from dpone.plan.chunks import UNITS_BY_TYPE

    ok = True
    if unit not in UNITS_BY_TYPE[ctype]:
        out.add(
            errors.MANIFEST_INVALID,
            f"process {process!r}: unit {unit!r} does not fit chunk type {ctype!r} "
            f"(use {', '.join(UNITS_BY_TYPE[ctype])})",
            doc.locate((*path, "chunk", "unit")),
        )
        ok = False
    bounds: dict[str, Any] = {}
    for bound in ("start", "end"):
        try:
            bounds[bound] = canonical_bound(ctype, chunk[bound])
        except ChunkPlanError as exc:
            out.add(
                errors.BACKFILL_PLAN_INVALID,
                f"process {process!r}: backfill.chunk.{bound}: {exc}",
                doc.locate((*path, "chunk", bound)),
            )
            ok = False
    inner_mode = raw.get("inner_mode", "replace")
    if inner_mode == "merge" and not keys:
        out.add(
            errors.MANIFEST_INVALID,
            f"process {process!r}: inner_mode merge needs sink.keys",
            doc.locate((*path, "inner_mode")),
        )
    if not ok:
        return None
    return BackfillConfig(
        chunk=ChunkSpec(
            column=chunk["column"],
            type=ctype,
            start=bounds["start"],
            end=bounds["end"],
            step=chunk.get("step", 1),
            unit=unit,
        ),
        inner_mode=inner_mode,
        parallel_workers=raw.get("parallel_workers", 1),
        backfill_id=raw.get("backfill_id"),
        lease_seconds=raw.get("lease_seconds", DEFAULT_LEASE_SECONDS),
        coalesce=_coalesce(raw.get("coalesce", True)),
    )


def _coalesce(raw: bool | dict[str, Any]) -> CoalesceConfig:
    """``backfill.coalesce``: true (the default budget), false (off) or a budget."""
    if raw is True or raw is False:
        return CoalesceConfig(enabled=raw)
    return CoalesceConfig(
        max_rows=int(raw.get("max_rows", DEFAULT_COALESCE_ROWS)),
        max_seconds=float(raw.get("max_seconds", DEFAULT_COALESCE_SECONDS)),
        max_chunks=int(raw.get("max_chunks", DEFAULT_COALESCE_CHUNKS)),
    )


def load_manifest(path: Path, display: str, out: ErrorCollector) -> Manifest | None:
    """The manifest at ``path``; None when it cannot be read or breaks its schema (its problems,
    every rule's included, are in ``out``)."""
    manifest, whole = _read_manifest(path, display, out)
    return manifest if whole else None


def _read_manifest(path: Path, display: str, out: ErrorCollector) -> tuple[Manifest | None, bool]:
    """The manifest with every process its rules could check, and whether it is whole (its
    schema kept, its mapping policy valid).

    A manifest that breaks its schema still has its rules run on each process that stays sound
    without the refused values (_checkable_processes), so one pass reports both; it comes back
    with those processes only, which the DAG rules read and nothing plans.
    """
    doc, problems = load_yaml(path, display)
    out.extend(problems)
    if doc is None:
        return None, False
    violations = _schema_violations(doc, MANIFEST_SCHEMA, errors.MANIFEST_INVALID, out)
    data = doc.data
    if not isinstance(data, dict):
        return None, False
    if violations:
        raws = _checkable_processes(data, violations)
    else:
        raws = dict(enumerate(data["processes"]))
    processes: list[ProcessConfig] = []
    seen: set[str] = set()
    for index, raw in raws.items():
        if raw["name"] in seen:
            out.add(
                errors.MANIFEST_INVALID,
                f"duplicate process name {raw['name']!r}",
                doc.locate(("processes", index, "name")),
            )
        seen.add(raw["name"])
        process = _process(raw, doc, index, out)
        if process is not None:
            processes.append(process)
    gitops = data.get("gitops")
    airflow = gitops.get("airflow") if isinstance(gitops, dict) else None
    mapping_raw = airflow.get("mapping") if isinstance(airflow, dict) else None
    mapping = None
    policy_valid = True
    if _stated(mapping_raw):
        mapping = _policy(mapping_raw, doc, ("gitops", "airflow", "mapping"), out)
        policy_valid = mapping is not None
    location = doc.locate(("gitops", "airflow", "mapping"), key=True) if mapping else None
    name = data.get("name")
    manifest = Manifest(
        display, name if isinstance(name, str) else None, tuple(processes), mapping, location
    )
    return manifest, not violations and policy_valid


#: process fields whose absence a rule reads as "not given" (exactly one of table or query, merge
#: keys, the backfill section, the audit schema's connection): a refused value there is not left
#: out, or the rule would report a value that is written, only wrongly
_ABSENCE_READ: tuple[tuple[str, ...], ...] = (
    ("source", "table"),
    ("source", "query"),
    ("sink", "keys"),
    ("backfill",),
    ("state", "connection"),
)


def _checkable_processes(
    data: dict[str, Any], violations: list[tuple[str | int, ...]]
) -> dict[int, dict[str, Any]]:
    """The processes of a manifest that breaks its schema whose rules can still run, by index,
    each without its refused values (a refused list item takes its whole list: the others keep
    their indexes, so their positions). A process waits for the next pass when leaving a value
    out breaks its structure (a required field) or changes what a rule reads (_ABSENCE_READ)."""
    processes = data.get("processes")
    if not isinstance(processes, list):
        return {}
    cuts: dict[int, set[tuple[str | int, ...]]] = {}
    whole: set[int] = set()  # refused as a whole (not a mapping, a required field missing)
    for path in violations:
        if len(path) < 2 or path[0] != "processes" or not isinstance(path[1], int):
            if path[:1] == ("processes",):
                return {}  # the list itself
            continue
        inner = path[2:]
        last = max((i for i, part in enumerate(inner) if isinstance(part, str)), default=None)
        if last is None:
            whole.add(path[1])
        else:
            cuts.setdefault(path[1], set()).add(inner[: last + 1])
    root = load_schema(MANIFEST_SCHEMA)
    found: dict[int, dict[str, Any]] = {}
    for index, written in enumerate(processes):
        taken = cuts.get(index, set())
        if index in whole or any(
            read[: len(cut)] == cut for cut in taken for read in _ABSENCE_READ
        ):
            continue
        kept = _without(written, taken) if taken else written
        if taken and validate(kept, {"$ref": "#/$defs/process"}, root):
            continue
        found[index] = kept
    return found


def _without(raw: dict[str, Any], cuts: set[tuple[str | int, ...]]) -> dict[str, Any]:
    """A copy of ``raw`` without the fields at ``cuts`` (paths ending at a mapping's key)."""
    kept = copy.deepcopy(raw)
    for cut in cuts:
        node: Any = kept
        for part in cut[:-1]:
            if isinstance(node, dict):
                node = node.get(part)
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            else:
                node = None
        if isinstance(node, dict):
            node.pop(cut[-1], None)
    return kept


def _system_path(path: str) -> bool:
    """A path under /proc, /sys or /dev (after normalising ``..`` and repeated slashes)."""
    parts = Path("/" + os.path.normpath(path).lstrip("/") if path.startswith("/") else path).parts
    return len(parts) > 1 and parts[0] == "/" and parts[1] in ("proc", "sys", "dev")


def _stated(mapping: object) -> bool:
    """Whether an ``airflow.mapping`` node states a policy: ``null`` and ``{}`` say nothing, so
    they are absent (the contract: absence means internal, or the manifest's or the defaults'
    policy), never an explicit internal one that conflicts with the manifest's."""
    return mapping is not None and mapping != {}


def _merged_airflow(defaults: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """The workload's airflow fields over the defaults; ``pod`` is merged key by key."""
    merged = dict(defaults)
    merged.update(own)
    if "pod" in defaults and "pod" in own:
        merged["pod"] = {**defaults["pod"], **own["pod"]}
    return merged


#: where a credential belongs instead of the catalog, by the flavour that would run it
KEEP_OUT = {
    "kubernetes": "project it from a Kubernetes secret with airflow.secrets instead",
    "subprocess": (
        "set it in the worker's environment instead (a connection: DPONE_CONN_<NAME>, an "
        "Airflow Connection in airflow.airflow_connections or a file in airflow.secret_files)"
    ),
}


def _keep_out(flavour: object) -> str:
    """The way out a credential refusal names: the flavour's (a malformed flavour: kubernetes,
    the default)."""
    return KEEP_OUT["subprocess" if flavour == "subprocess" else "kubernetes"]


def _clear_text_rules(
    scope: str,
    airflow: Any,
    path: tuple[str | int, ...],
    flavour: object,
    doc: YamlDocument,
    out: ErrorCollector,
) -> None:
    """Every value of an airflow entry (a workload's, or ``defaults``) that the DAG file writes in
    clear, which is all of them: airflow.env by its names and values, every other string (pod
    options, hook and task commands, the catalog path, tags, ...) by its text. Reads single
    values only, so it runs on an entry that breaks the schema too."""
    if not isinstance(airflow, dict):
        return
    keep_out = _keep_out(flavour)
    _env_credentials(scope, airflow.get("env"), path, doc, out, keep_out)
    for key, value in airflow.items():  # as written, so the refusals come in line order
        if key != "env":
            _string_credentials(
                scope, value, (*path, "airflow", key), len(path), doc, out, keep_out
            )


def _env_credentials(
    scope: str,
    env: Any,
    path: tuple[str | int, ...],
    doc: YamlDocument,
    out: ErrorCollector,
    keep_out: str,
) -> None:
    """airflow.env is written in clear into the DAG file: no DSN, no password, no variable whose
    name says it holds a secret may be in it."""
    if not isinstance(env, dict):
        return
    for key in sorted(env, key=str):
        value = env[key]
        is_conn = str(key).upper().startswith("DPONE_CONN_")
        text = value if isinstance(value, str) else "" if value is None else str(value)
        if is_conn:
            what = "is a connection DSN"
        elif has_credentials(text):
            what = "holds a connection string with a password"
        elif secret_env_name(str(key), text):
            what = "names a secret (a password, token or key)"
        elif (name := secret_assignment(text)) is not None:
            what = f"sets {name}, a variable named as a secret, to a value"
        elif secrets := json_secrets(text):
            what = f"is JSON whose field {secrets[0][0]!r} holds a secret"
        else:
            continue
        out.add(
            errors.ENV_CREDENTIAL,
            f"{scope}: airflow.env.{key} {what}: the DAG file would carry it in clear; {keep_out}",
            doc.locate((*path, "airflow", "env", key), key=True),
        )


def _string_credentials(
    scope: str,
    value: Any,
    path: tuple[str | int, ...],
    start: int,
    doc: YamlDocument,
    out: ErrorCollector,
    keep_out: str,
) -> None:
    """No string under ``path`` (shown from ``path[start]`` on) may carry a connection string
    with a password or set a variable named as a secret: the DAG file writes each in clear. The
    refusal names the field, never the value."""
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            _string_credentials(scope, value[key], (*path, key), start, doc, out, keep_out)
    elif isinstance(value, list):
        for index, entry in enumerate(value):
            _string_credentials(scope, entry, (*path, index), start, doc, out, keep_out)
    elif isinstance(value, str):
        shown = ".".join(str(part) for part in path[start:])
        if has_credentials(value):
            what = "holds a connection string with a password"
        elif (name := secret_assignment(value)) is not None:
            what = f"sets {name}, a variable named as a secret, to a value"
        elif secrets := json_secrets(value):
            what = f"is JSON whose field {secrets[0][0]!r} holds a secret"
        else:
            return
        out.add(
            errors.ENV_CREDENTIAL,
            f"{scope}: {shown} {what}: the DAG file would carry it in clear; {keep_out}",
            doc.locate(path),
        )


def _owned_env(
    name: str, env: Any, doc: YamlDocument, wpath: tuple[str | int, ...], out: ErrorCollector
) -> None:
    """The variables dpone sets itself (DPONE_AIRFLOW_*) cannot come from the catalog; a key the
    workload inherits is located in ``defaults``."""
    if not isinstance(env, dict):
        return
    for key in sorted(k for k in env if isinstance(k, str)):
        where = doc.locate((*wpath, "airflow", "env", key), key=True)
        if (*wpath, "airflow", "env", key, "__key__") not in doc.positions:
            where = doc.locate(("defaults", "airflow", "env", key), key=True)
        if key in PROVIDER_OWNED_ENV or key.startswith("DPONE_AIRFLOW_"):
            out.add(
                errors.PROVIDER_OWNED_ENV,
                f"workload {name!r}: airflow.env.{key} is owned by dpone and cannot be set",
                where,
            )


def _entry_values(
    name: str, own: Any, defaults: Any, doc: YamlDocument, out: ErrorCollector
) -> None:
    """The rules on single values of a workload's airflow entry (credentials in clear, dpone's
    own variables) for an entry that breaks the schema: one pass reports them beside its
    schema problems, although the entry is neither planned nor given the DAG rules."""
    if not isinstance(own, dict):
        return
    inherited = defaults if isinstance(defaults, dict) else {}
    wpath: tuple[str | int, ...] = ("workloads", name)
    flavour = own.get("flavour", inherited.get("flavour", "kubernetes"))
    _clear_text_rules(f"workload {name!r}", own, wpath, flavour, doc, out)
    _owned_env(name, own.get("env", inherited.get("env")), doc, wpath, out)


def _quantities(
    name: str,
    resources: dict[str, Any],
    kind: str,
    doc: YamlDocument,
    wpath: tuple[str | int, ...],
    out: ErrorCollector,
) -> tuple[tuple[str, str], ...]:
    """``resources.<kind>`` as Kubernetes quantity strings: the API takes ``cpu: 1`` and
    ``cpu: 0.5`` as numbers too; the DAG file writes each as the string Kubernetes parses alike."""
    found: list[tuple[str, str]] = []
    for key, value in sorted(resources.get(kind, {}).items()):
        if isinstance(value, float) and not math.isfinite(value):
            field = (*wpath, "airflow", "resources", kind, key)
            if field not in doc.positions:
                field = ("defaults", "airflow", "resources", kind, key)
            out.add(
                errors.CATALOG_INVALID,
                f"workload {name!r}: airflow.resources.{kind}.{key} must be a finite quantity, "
                f"got {value!r}",
                doc.locate(field),
            )
            continue
        found.append((key, value if isinstance(value, str) else repr(value)))
    return tuple(found)


#: the labels the KubernetesPodOperator sets on every pod it starts (and would overwrite)
OPERATOR_LABELS = frozenset(
    {
        "dag_id",
        "task_id",
        "run_id",
        "map_index",
        "try_number",
        "parent_dag_id",
        "kubernetes_pod_operator",
        "airflow_version",
        "airflow_kpo_in_cluster",
        "already_checked",
    }
)


def _pod_shape(
    name: str,
    pod: Any,
    doc: YamlDocument,
    wpath: tuple[str | int, ...],
    out: ErrorCollector,
) -> None:
    """What the schema cannot say of airflow.pod: a label the operator sets itself (it would
    replace the catalog's value without a word) and a volume without exactly one source (the
    API server refuses it when the task starts). Located in the workload or in defaults."""
    if not isinstance(pod, dict):
        return

    def where(*rest: str | int, key: bool = False) -> Any:
        own = (*wpath, "airflow", "pod", *rest)
        found = (*own, "__key__") in doc.positions or own in doc.positions
        return doc.locate(own if found else ("defaults", "airflow", "pod", *rest), key=key)

    labels = pod.get("labels")
    for label in (
        sorted(k for k in labels if k in OPERATOR_LABELS) if isinstance(labels, dict) else ()
    ):
        out.add(
            errors.CATALOG_INVALID,
            f"workload {name!r}: airflow.pod.labels.{label} is a label the KubernetesPodOperator "
            "sets on every pod, replacing the catalog's value: name the label otherwise",
            where("labels", label, key=True),
        )
    for field, kind in (("affinity", "V1Affinity"), ("volumes", "list[V1Volume]")):
        if field not in pod:
            continue
        # imported here: a pod whose catalog has no such structure (a no-op item) never needs it
        from dpone.authoring.kubernetes_fields import unknown_keys

        for inner, key, known in unknown_keys(pod[field], kind):
            shown = ".".join(str(part) for part in (field, *inner, key))
            out.add(
                errors.CATALOG_INVALID,
                f"workload {name!r}: airflow.pod.{shown}: Kubernetes has no field {key!r} "
                f"here{did_you_mean(key, known)}; the DAG file could not build the pod",
                where(field, *inner, key, key=True),
            )
    volumes = pod.get("volumes")
    for index, volume in enumerate(volumes if isinstance(volumes, list) else ()):
        if not isinstance(volume, dict):
            continue
        sources = sorted(str(k) for k in volume if k != "name")
        if len(sources) != 1:
            out.add(
                errors.CATALOG_INVALID,
                f"workload {name!r}: airflow.pod.volumes.{index} has "
                f"{len(sources)} sources ({', '.join(sources) or 'none'}): a volume takes "
                "exactly one (configMap, csi, emptyDir, secret, ...)",
                where("volumes", index),
            )


def _airflow(
    name: str,
    raw: dict[str, Any],
    doc: YamlDocument,
    wpath: tuple[str | int, ...],
    out: ErrorCollector,
) -> AirflowConfig:
    env = raw.get("env", {})
    _owned_env(name, env, doc, wpath, out)
    resources = raw.get("resources", {})
    flavour = raw.get("flavour", "kubernetes")
    pod = raw.get("pod", {})
    secrets = raw.get("secrets", [])
    if flavour == "kubernetes":
        _pod_shape(name, pod, doc, wpath, out)
    if flavour != "kubernetes":
        if (*wpath, "airflow", "pod", "__key__") in doc.positions:
            out.add(
                errors.CATALOG_INVALID,
                f"workload {name!r}: airflow.pod applies to the kubernetes flavour only "
                f"(this workload's flavour is {flavour!r})",
                doc.locate((*wpath, "airflow", "pod"), key=True),
            )
        pod = {}  # defaults.airflow.pod applies to the kubernetes workloads of the catalog
        if (*wpath, "airflow", "secrets", "__key__") not in doc.positions:
            secrets = []  # so do defaults.airflow.secrets: Kubernetes secrets reach pods only
    return AirflowConfig(
        dag_id=raw.get("dag_id", name),
        schedule=raw.get("schedule"),
        start_date=raw.get("start_date", DEFAULT_START_DATE),
        tags=tuple(raw.get("tags", ("dpone",))),
        image=raw.get("image"),
        namespace=raw.get("namespace", "default"),
        flavour=flavour,
        catalog_path=raw.get("catalog_path", DEFAULT_IMAGE_CATALOG_PATH),
        command=tuple(raw.get("command", ("dpone",))),
        requests=_quantities(name, resources, "requests", doc, wpath, out),
        limits=_quantities(name, resources, "limits", doc, wpath, out),
        secrets=tuple(
            SecretRef(s["connection"], s["secret"], s["key"], s.get("field", "dsn"))
            for s in secrets
        ),
        secret_files=tuple(
            SecretFile(f["connection"], f.get("field", "dsn"), f["path"])
            for f in raw.get("secret_files", ())
        ),
        airflow_connections=tuple(
            AirflowConnectionRef(c["connection"], c["conn_id"])
            for c in raw.get("airflow_connections", ())
        ),
        env=tuple(sorted(env.items())),
        retries=raw.get("retries", 0),
        pre_hooks=tuple(Hook(h["name"], tuple(h["command"])) for h in raw.get("pre_hooks", ())),
        post_hooks=tuple(Hook(h["name"], tuple(h["command"])) for h in raw.get("post_hooks", ())),
        task_options=tuple((key, raw[key]) for key in TASK_OPTIONS if key in raw),
        pod_options=tuple((key, pod[key]) for key in pod_option_names() if key in pod),
    )


def load_catalog(
    path: str | Path, only: str | None = None
) -> tuple[Catalog | None, list[ErrorRecord]]:
    """Load a catalog and every manifest it names; (catalog, []) or (None, all errors).

    With ``only`` (a workload name) the catalog is validated whole but only that workload's
    manifest is read: what a pod needs, without parsing every other workload's manifest per
    run (`dpone check` and `dpone generate` still load them all).
    """
    catalog, records = load_catalog_partly(path, only)
    return (None, records) if records else (catalog, [])


def load_catalog_partly(
    path: str | Path, only: str | None = None
) -> tuple[Catalog | None, list[ErrorRecord]]:
    """Every problem of the catalog and of every manifest it names, in one pass, with the
    workloads whose own entry and manifest are clean (``dpone check`` plans and checks those
    too, so one run reports everything); see load_catalog_checked."""
    catalog, _, records = load_catalog_checked(path, only)
    return catalog, records


def load_catalog_checked(
    path: str | Path, only: str | None = None
) -> tuple[Catalog | None, tuple[Workload, ...], list[ErrorRecord]]:
    """load_catalog_partly's catalog and problems, and the workloads the DAG rules can read.

    Those are, in catalog order, the planned workloads and every other whose catalog entry
    keeps the schema, whose mapping policy is valid and whose manifest could be parsed, problems
    and all: its processes that the rules could check are kept (never planned). The rules on
    single values of an entry (credentials written in clear, dpone's own env) run on every
    entry, one that breaks the schema included. A catalog that breaks its schema in what every
    workload shares still has each manifest it names read and checked; the catalog is then
    None. A manifest that cannot be parsed is one problem.
    """
    display = str(path)
    catalog_path = Path(path)
    out = ErrorCollector()
    doc, problems = load_yaml(catalog_path, display)
    out.extend(problems)
    if doc is None:
        return None, (), out.records
    violations = _schema_violations(doc, CATALOG_SCHEMA, errors.CATALOG_INVALID, out)
    data = doc.data
    if violations:
        broken = _broken_workloads(doc, violations)
        if broken is None:
            defaults = data.get("defaults") if isinstance(data, dict) else None
            shared = defaults.get("airflow") if isinstance(defaults, dict) else None
            if isinstance(shared, dict):
                flavour = shared.get("flavour", "kubernetes")
                _clear_text_rules("defaults", shared, ("defaults",), flavour, doc, out)
            _named_manifests(doc, display, catalog_path.parent, only, out)
            return None, (), out.records
        # the other workloads are still planned and checked: one pass reports everything
        _named_manifests(doc, display, catalog_path.parent, only, out, broken)
        workload_entries = {k: v for k, v in data["workloads"].items() if k not in broken}
        data = {**data, "workloads": workload_entries}
    defaults_airflow = data.get("defaults", {}).get("airflow", {})
    default_policy = None
    if _stated(defaults_airflow.get("mapping")):
        default_policy = _policy(
            defaults_airflow["mapping"], doc, ("defaults", "airflow", "mapping"), out
        )
    default_flavour = defaults_airflow.get("flavour", "kubernetes")
    _clear_text_rules("defaults", defaults_airflow, ("defaults",), default_flavour, doc, out)
    workloads: list[Workload] = []
    checked: list[Workload] = []
    dag_ids: dict[str, str] = {}
    base = catalog_path.parent
    for name in data["workloads"]:
        if only is not None and name != only:
            continue
        wraw = data["workloads"][name]
        wpath: tuple[str | int, ...] = ("workloads", name)
        manifest_rel = wraw["manifest"]
        before = len(out.records)
        manifest = _workload_manifest(doc, display, base, name, manifest_rel, out)
        manifest_clean = len(out.records) == before
        own_airflow = wraw.get("airflow", {})
        airflow_raw = _merged_airflow(defaults_airflow, own_airflow)
        flavour = airflow_raw.get("flavour", "kubernetes")
        _clear_text_rules(f"workload {name!r}", own_airflow, wpath, flavour, doc, out)
        airflow = _airflow(name, airflow_raw, doc, wpath, out)
        if airflow.dag_id in dag_ids:
            out.add(
                errors.GENERATED_FILE_CONFLICT,
                f"workload {name!r}: dag_id {airflow.dag_id!r} is already used by workload "
                f"{dag_ids[airflow.dag_id]!r}",
                (
                    doc.locate((*wpath, "airflow", "dag_id"))
                    if "dag_id" in own_airflow
                    else doc.locate(wpath, key=True)
                ),
            )
        dag_ids.setdefault(airflow.dag_id, name)
        catalog_policy = None
        if _stated(own_airflow.get("mapping")):
            catalog_policy = _policy(
                own_airflow["mapping"], doc, (*wpath, "airflow", "mapping"), out
            )
            if catalog_policy is None:
                continue
        if manifest is None:
            continue
        policy, source, location = _choose_policy(
            name, catalog_policy, manifest, default_policy, doc, wpath, out
        )
        if policy is None:
            continue
        workload = Workload(name, manifest, airflow, policy, source, location)
        checked.append(workload)  # a manifest with problems is not planned, only checked
        if manifest_clean:
            workloads.append(workload)
    catalog = Catalog(display, tuple(workloads), tuple(doc.data["workloads"]))
    return catalog, tuple(checked), out.records


def _workload_manifest(
    doc: YamlDocument, display: str, base: Path, name: str, relative: str, out: ErrorCollector
) -> Manifest | None:
    """The manifest of workload ``name``, with only the processes its rules could check when it
    breaks its schema (_read_manifest); a missing file is reported at the catalog entry."""
    manifest, _ = _read_manifest(base / relative, _join_display(display, relative), out)
    if manifest is None and not (base / relative).exists():
        # load_yaml reported the file as missing; point at the catalog entry instead.
        last = out.records[-1]
        out.records[-1] = ErrorRecord(
            last.code,
            f"workload {name!r}: manifest {relative!r} not found "
            f"(paths are relative to the catalog's folder)",
            doc.locate(("workloads", name, "manifest")),
        )
    return manifest


def _named_manifests(
    doc: YamlDocument,
    display: str,
    base: Path,
    only: str | None,
    out: ErrorCollector,
    names: set[str] | None = None,
) -> None:
    """Check every manifest a schema-invalid catalog still names readably (a workload entry
    that is a mapping with a string ``manifest``), and the single values of each entry
    (_entry_values), so one run reports both files' problems; only those of ``names`` when
    given."""
    workloads = doc.data.get("workloads") if isinstance(doc.data, dict) else None
    if not isinstance(workloads, dict):
        return
    defaults = doc.data.get("defaults")
    shared = defaults.get("airflow") if isinstance(defaults, dict) else None
    for name, entry in workloads.items():
        if (only is not None and name != only) or (names is not None and name not in names):
            continue
        relative = entry.get("manifest") if isinstance(entry, dict) else None
        if isinstance(name, str) and isinstance(relative, str) and relative:
            _workload_manifest(doc, display, base, name, relative, out)
        if isinstance(name, str) and isinstance(entry, dict):
            _entry_values(name, entry.get("airflow"), shared, doc, out)


def _join_display(catalog_display: str, relative: str) -> str:
    parent = Path(catalog_display).parent
    joined = parent / relative
    return joined.as_posix()


def _choose_policy(
    name: str,
    catalog_policy: MappingPolicy | None,
    manifest: Manifest,
    default_policy: MappingPolicy | None,
    doc: YamlDocument,
    wpath: tuple[str | int, ...],
    out: ErrorCollector,
) -> tuple[MappingPolicy | None, str, Location]:
    """Catalog and manifest policies may both be present only when they are identical."""
    catalog_loc = doc.locate((*wpath, "airflow", "mapping"), key=True)
    manifest_loc = manifest.mapping_location or Location(manifest.path)
    if catalog_policy is not None and manifest.mapping is not None:
        if catalog_policy != manifest.mapping:
            out.add(
                errors.MAPPING_POLICY_INVALID,
                f"workload {name!r}: workloads.{name}.airflow.mapping "
                f"{catalog_policy.canonical()} conflicts with gitops.airflow.mapping "
                f"{manifest.mapping.canonical()} in {manifest.path}; keep one (or make them equal)",
                catalog_loc,
            )
            return None, "", catalog_loc
        return catalog_policy, "catalog+manifest", catalog_loc
    if catalog_policy is not None:
        return catalog_policy, "catalog", catalog_loc
    if manifest.mapping is not None:
        return manifest.mapping, "manifest", manifest_loc
    if default_policy is not None:
        return default_policy, "defaults", doc.locate(("defaults", "airflow", "mapping"), key=True)
    return MappingPolicy(), "built-in", doc.locate(wpath, key=True)
