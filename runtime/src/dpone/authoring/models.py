"""Frozen, typed objects the loaders normalise catalogs and manifests into."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from dpone.errors import Location
from dpone.plan.canonical import FieldRecord
from dpone.plan.chunks import ChunkSpec
from dpone.plan.mapping import MappingPolicy
from dpone.records import record


@record
class TableName(FieldRecord):
    schema: str | None
    name: str

    @property
    def dotted(self) -> str:
        return f"{self.schema}.{self.name}" if self.schema else self.name


@record
class SourceConfig:
    connection: str
    table: TableName | None
    query: str | None
    columns: tuple[str, ...] | None

    def canonical(self) -> dict[str, object]:
        return {
            "connection": self.connection,
            "table": self.table.canonical() if self.table else None,
            "query": self.query,
            "columns": list(self.columns) if self.columns else None,
        }


@record
class SinkConfig:
    connection: str
    table: TableName
    keys: tuple[str, ...]
    strategy: str
    read_back: str = "checksum"  # the read-back gate: checksum | count | off
    #: Columns whose narrower target type the manifest accepts (the type preflight lets them by).
    accept_narrowing: tuple[str, ...] = ()
    #: Where the manifest names the target table and each accepted column, for preflight errors.
    table_location: Location | None = field(default=None, compare=False)
    narrowing_locations: tuple[Location, ...] = field(default=(), compare=False)

    def canonical(self) -> dict[str, object]:
        out: dict[str, object] = {
            "connection": self.connection,
            "table": self.table.canonical(),
            "keys": list(self.keys),
            "strategy": self.strategy,
        }
        if self.read_back != "checksum":  # the default leaves packs and fingerprints as they were
            out["read_back"] = self.read_back
        if self.accept_narrowing:  # absent when unset: existing packs keep their fingerprints
            out["accept_narrowing"] = list(self.accept_narrowing)
        return out


#: A coalesced group of chunks (ADR 0022) commits once it moved this many rows ...
DEFAULT_COALESCE_ROWS = 100_000
#: ... or after this many seconds ...
DEFAULT_COALESCE_SECONDS = 2.0
#: ... or once it holds this many chunks (a chunk lock each), whichever comes first.
DEFAULT_COALESCE_CHUNKS = 200


@record
class CoalesceConfig:
    """``backfill.coalesce``: consecutive chunks of one worker in one sink transaction, up to
    a row and a time budget (only where the ledger lives in the sink's Postgres database)."""

    enabled: bool = True
    max_rows: int = DEFAULT_COALESCE_ROWS
    max_seconds: float = DEFAULT_COALESCE_SECONDS
    max_chunks: int = DEFAULT_COALESCE_CHUNKS

    def canonical(self) -> object:
        if not self.enabled:
            return False
        # hashed artifacts hold no floats: the time budget in whole milliseconds
        return {
            "max_rows": self.max_rows,
            "max_ms": round(self.max_seconds * 1000),
            "max_chunks": self.max_chunks,
        }


@record
class BackfillConfig:
    chunk: ChunkSpec
    inner_mode: str
    parallel_workers: int
    backfill_id: str | None
    lease_seconds: int
    coalesce: CoalesceConfig = CoalesceConfig()

    def canonical(self) -> dict[str, object]:
        out: dict[str, object] = {
            "chunk": self.chunk.canonical(),
            "inner_mode": self.inner_mode,
            "parallel_workers": self.parallel_workers,
            "backfill_id": self.backfill_id,
            "lease_seconds": self.lease_seconds,
        }
        if self.coalesce != CoalesceConfig():  # the default leaves packs as they were
            out["coalesce"] = self.coalesce.canonical()
        return out


@record
class StateConfig(FieldRecord):
    backend: str
    connection: str | None
    schema: str
    path: str | None
    require_distributed_lock: bool


@record
class ProcessConfig:
    name: str
    source: SourceConfig
    sink: SinkConfig
    backfill: BackfillConfig | None
    state: StateConfig
    location: Location  # the process node, for errors found after loading
    #: Where the manifest states the keys a rule checked after loading names (dotted paths
    #: under the process, such as ``backfill.parallel_workers``), for its error's location.
    key_locations: tuple[tuple[str, Location], ...] = field(default=(), compare=False)

    def at(self, dotted: str) -> Location:
        """Where the manifest states ``dotted`` (or its closest stated parent), else the process."""
        return dict(self.key_locations).get(dotted, self.location)


@record
class Manifest:
    path: str
    name: str | None
    processes: tuple[ProcessConfig, ...]
    mapping: MappingPolicy | None  # gitops.airflow.mapping, when present
    mapping_location: Location | None


@record
class Hook:
    name: str
    command: tuple[str, ...]


@record
class SecretRef:
    """One Kubernetes secret key projected into DPONE_CONN_<NAME> (field "dsn") or into one part
    of the connection, DPONE_CONN_<NAME>_<FIELD> (dpone.credentials.credential_parts)."""

    connection: str
    secret: str
    key: str
    field: str = "dsn"


@record
class SecretFile:
    """A file (a mounted secret volume) holding the DSN or one part of a connection: the task
    gets DPONE_CONN_<NAME>[_<FIELD>]_FILE and the runtime reads the file at each connect."""

    connection: str
    field: str
    path: str


@record
class AirflowConnectionRef:
    """subprocess flavour: an Airflow Connection the operator resolves at execute time into
    DPONE_CONN_<NAME> of the child process's environment."""

    connection: str
    conn_id: str


@record
class AirflowConfig:
    dag_id: str
    schedule: str | None
    start_date: str
    tags: tuple[str, ...]
    image: str | None
    namespace: str
    flavour: str
    catalog_path: str
    command: tuple[str, ...]
    requests: tuple[tuple[str, str], ...]
    limits: tuple[tuple[str, str], ...]
    secrets: tuple[SecretRef, ...]
    env: tuple[tuple[str, str], ...]
    retries: int
    pre_hooks: tuple[Hook, ...]
    post_hooks: tuple[Hook, ...]
    # Airflow task arguments beside retries (retry_delay, owner, ...), in TASK_OPTIONS order.
    task_options: tuple[tuple[str, Any], ...] = ()
    # KubernetesPodOperator arguments (airflow.pod), in POD_OPTIONS order; nested values stay in
    # their manifest form (camelCase keys), exactly as the catalog wrote them.
    pod_options: tuple[tuple[str, Any], ...] = ()
    secret_files: tuple[SecretFile, ...] = ()
    airflow_connections: tuple[AirflowConnectionRef, ...] = ()


@record
class Workload:
    name: str
    manifest: Manifest
    airflow: AirflowConfig
    mapping: MappingPolicy
    mapping_source: str  # "catalog", "manifest", "defaults" or "built-in"
    mapping_location: Location


@record
class Catalog:
    path: str  # as given by the user (display form)
    workloads: tuple[Workload, ...]
    #: every workload the catalog names, in order (``workloads`` may hold only one, see
    #: load_catalog's ``only``); empty means the same names as ``workloads``
    names: tuple[str, ...] = ()

    def workload(self, name: str) -> Workload | None:
        for workload in self.workloads:
            if workload.name == name:
                return workload
        return None
