"""One error root for dpone, a registry of every stable code, and the dpone.error.v1 shape.

Every failure a user can see carries a stable ``code`` (documented in docs/errors.md, which is
generated from ``REGISTRY``), a message that quotes the offending value, and where there is a file,
its file:line:column. Errors are collected as data so one ``dpone check`` reports all of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from dpone.records import record


@record
class Location:
    """Where in an input file a problem sits (1-based line and column)."""

    file: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        parts = [self.file]
        if self.line is not None:
            parts.append(str(self.line))
            if self.column is not None:
                parts.append(str(self.column))
        return ":".join(parts)


@record
class ErrorCode:
    """A registered code: what it means, why it usually happens and how to fix it."""

    code: str
    meaning: str
    cause: str
    fix: str
    retryable: bool = False


REGISTRY: dict[str, ErrorCode] = {}


def _register(code: str, meaning: str, cause: str, fix: str, retryable: bool = False) -> str:
    REGISTRY[code] = ErrorCode(code, meaning, cause, fix, retryable)
    return code


# --- authoring (catalog / manifest) -------------------------------------------------------------
YAML_INVALID = _register(
    "DPONE_YAML_INVALID",
    "A catalog or manifest file is not valid YAML (or uses a duplicate key).",
    "A syntax error, a tab indent, or the same key twice in one mapping.",
    "Fix the YAML at the reported line; `dpone check` shows every such problem at once.",
)
FILE_NOT_FOUND = _register(
    "DPONE_FILE_NOT_FOUND",
    "A catalog or a manifest it references does not exist or cannot be read.",
    "A wrong path; manifest paths are relative to the catalog file.",
    "Correct the path (relative to the catalog's folder) or add the file.",
)
CATALOG_INVALID = _register(
    "DPONE_CATALOG_INVALID",
    "The workload catalog violates the dpone.workload-catalog.v1 schema.",
    "A missing required field, an unknown field, or a value of the wrong type.",
    "Compare the reported node with docs/reference/schemas.md (workload-catalog).",
)
MANIFEST_INVALID = _register(
    "DPONE_MANIFEST_INVALID",
    "A pipeline manifest violates the dpone.pipeline.v1 schema or its rules.",
    "A missing required field, an unknown field, a bad chunk spec, a wrong type, or a state "
    "backend this release has no store for (clickhouse).",
    "Compare the reported node with docs/reference/schemas.md (pipeline).",
)
BACKFILL_PLAN_INVALID = _register(
    "DPONE_BACKFILL_PLAN_INVALID",
    "The backfill window cannot be split into a valid chunk plan.",
    "start is not before end (a zero-length plan), an unparsable bound, or too many chunks.",
    "Make start < end and choose a step that yields at most 100,000 chunks.",
)
BACKFILL_FULL_REFRESH_MULTI_CHUNK = _register(
    "DPONE_BACKFILL_FULL_REFRESH_MULTI_CHUNK",
    "inner_mode full_refresh was combined with a window of more than one chunk.",
    "full_refresh replaces the whole target; chunk by chunk it would erase earlier chunks.",
    "Use replace or merge for multi-chunk backfills, or make the window a single chunk.",
)
MAPPED_APPEND_UNSAFE = _register(
    "DPONE_AIRFLOW_MAPPING_APPEND_UNSAFE",
    "A mapped (visible/summary) process uses inner_mode append while its ledger and sink differ.",
    "append is not idempotent; without one transaction for data and completion a retry can "
    "duplicate rows.",
    "Use replace or merge, or keep the ledger in the same Postgres connection as the sink.",
)
PROVIDER_OWNED_ENV = _register(
    "DPONE_AIRFLOW_PROVIDER_OWNED_ENV",
    "The catalog sets an environment variable that dpone itself owns.",
    "DPONE_AIRFLOW_MAPPING_ITEM, DPONE_AIRFLOW_RUN_IDENTITY and DPONE_AIRFLOW_MAPPING_LABEL are "
    "written by the generator; DPONE_AIRFLOW_CONTEXT by the operator at execute time.",
    "Remove that key from airflow.env; dpone sets it per task.",
)
ENV_CREDENTIAL = _register(
    "DPONE_AIRFLOW_ENV_CREDENTIAL",
    "A string of a workload's or of defaults' airflow entry (env, pod, a hook's command, "
    "command, catalog_path, ...) carries a connection credential.",
    "A DPONE_CONN_<NAME> key, a variable named as a secret (PGPASSWORD, *_TOKEN, *_API_KEY, "
    "an OTLP headers list with an authorization header), or a value that reads as a connection "
    "string with a password (user:password@, password=, PWD=), in airflow.env, anywhere in "
    "airflow.pod (labels, annotations, ...), in a pre_hooks/post_hooks command or in any other "
    "string of the airflow entry: all are written in clear into the DAG file.",
    "Remove it. On the kubernetes flavour project the DSN (or its password) from a Kubernetes "
    "secret with airflow.secrets; on the subprocess flavour set it in the worker's environment, "
    "or use airflow.airflow_connections or airflow.secret_files (docs/security.md).",
)
GENERATED_FILE_CONFLICT = _register(
    "DPONE_GENERATE_CONFLICT",
    "An output file exists that dpone did not generate, or two workloads want the same file.",
    "A hand-written DAG with the same dag_id, or a duplicate dag_id in the catalog.",
    "Rename the dag_id or move the hand-written file; dpone never overwrites files it did not write.",
)
GENERATE_OUTPUT_FAILED = _register(
    "DPONE_GENERATE_OUTPUT_FAILED",
    "`dpone generate` could not read or write its output folder.",
    "--out names a file, a folder without write permission, or a full disk.",
    "Point --out at a writable folder; nothing is half-written (files are replaced atomically).",
)
GENERATE_IMAGE_REQUIRED = _register(
    "DPONE_GENERATE_IMAGE_REQUIRED",
    "A workload of the kubernetes flavour has no airflow.image.",
    "The pod needs an image with dpone-runtime and the catalog inside; none was given.",
    "Set airflow.image (in defaults or the workload), or use airflow.flavour: subprocess.",
)
# --- mapping policy (contract) ------------------------------------------------------------------
MAPPING_POLICY_INVALID = _register(
    "DPONE_AIRFLOW_MAPPING_POLICY_INVALID",
    "The Airflow mapping mode or a limit is malformed.",
    "mode outside internal|visible|summary, max_items outside 1..200, max_active outside 1..64 "
    "or above max_items, a non-integer limit, or two conflicting policies.",
    "Set mode, max_items (1..200) and max_active (1..64, <= max_items) as integers in one place.",
)
MAPPING_REQUIRES_CHUNKED_BACKFILL = _register(
    "DPONE_AIRFLOW_MAPPING_REQUIRES_CHUNKED_BACKFILL",
    "visible/summary was chosen for a process that is not a chunked backfill.",
    "sink.strategy.mode is not backfill, or backfill.chunk is missing.",
    "Declare sink.strategy.mode: backfill with a backfill.chunk, or use mode: internal.",
)
MAPPING_TASK_LIMIT_EXCEEDED = _register(
    "DPONE_AIRFLOW_MAPPING_TASK_LIMIT_EXCEEDED",
    "visible mode would create more mapped tasks than max_items allows.",
    "One mapped task per chunk and the window has more chunks than max_items.",
    "Use mode: summary, a larger step, a shorter window, or raise max_items (at most 200).",
)
MAPPING_POOL_REQUIRED = _register(
    "DPONE_AIRFLOW_MAPPING_POOL_REQUIRED",
    "visible/summary has no valid Airflow pool.",
    "pool is null, empty, or not an Airflow identifier (letters, digits, _ . -), or it is "
    "Airflow's default_pool, which the pools file would resize for every task; a mapping that "
    "leaves pool out takes the default pool dpone_backfill.",
    "Set mapping.pool to a pool name; `dpone generate` writes the pools file.",
)
MAPPING_PARALLELISM_MULTIPLIER = _register(
    "DPONE_AIRFLOW_MAPPING_PARALLELISM_MULTIPLIER",
    "A mapped process sets backfill.parallel_workers other than 1.",
    "Each mapped task would run several workers: concurrency would multiply past max_active.",
    "Set backfill.parallel_workers: 1 and control concurrency with mapping.max_active.",
)
MAPPING_STATE_UNSUPPORTED = _register(
    "DPONE_AIRFLOW_MAPPING_STATE_UNSUPPORTED",
    "The state backend lacks a distributed lock, chunk lease or compare-and-set completion.",
    "local_file state, or require_distributed_lock is not true.",
    "Use state.backend: audit_schema on Postgres or MSSQL with require_distributed_lock: true.",
)
MAPPING_PLAN_MISMATCH = _register(
    "DPONE_AIRFLOW_MAPPING_PLAN_MISMATCH",
    "The runtime's re-computed plan differs from the one the DAG was generated from.",
    "The image's catalog or manifests differ from the commit the DAG file was generated from.",
    "Deploy the image built from the same commit as the DAG files, or regenerate the DAGs.",
)
MAPPING_ITEM_INVALID = _register(
    "DPONE_AIRFLOW_MAPPING_ITEM_INVALID",
    "DPONE_AIRFLOW_MAPPING_ITEM is malformed, oversized or out of range.",
    "The env value was edited by hand, truncated, or comes from another plan.",
    "Do not set it yourself; regenerate the DAG and clear the task.",
)
MAPPING_CAMPAIGN_BUSY = _register(
    "DPONE_AIRFLOW_MAPPING_CAMPAIGN_BUSY",
    "The short campaign initialization lock could not be taken in time.",
    "Another task is initializing or verifying the same campaign ledger.",
    "Retry the task; the lock is held for milliseconds unless the database is overloaded.",
    retryable=True,
)
CHUNK_LEASE_LOST = _register(
    "DPONE_BACKFILL_CHUNK_LEASE_LOST",
    "An attempt lost ownership of its chunk before completing it (compare-and-set failed).",
    "The lease expired (a stalled pod) and another attempt took the chunk over; the sink's fence "
    "refused (rolled back) this attempt's writes, or the newer attempt replaces them.",
    "Nothing to repair: the newer attempt owns the chunk. Raise lease_seconds if pods stall often.",
    retryable=True,
)
APPEND_ALREADY_WRITTEN = _register(
    "DPONE_APPEND_ALREADY_WRITTEN",
    "An append chunk's rows are already in the sink from an earlier attempt whose completion the "
    "ledger never recorded; appending them again would duplicate them, so the chunk failed.",
    "The ledger lives apart from the sink (the fenced placement) and the process ended between "
    "the sink's commit and the ledger's (a killed pod, a lost ledger connection). The sink's "
    "fence row shows that the earlier attempt committed, after its own read-back gate.",
    "Nothing was written twice. Look at the target's rows in the chunk's range: to move the "
    "chunk again, delete them and the chunk's row in dpone_chunk_fence, then run again. To avoid "
    "it, keep the ledger in the sink's database (one transaction per chunk) or use replace or "
    "merge, whose retries rewrite the chunk.",
)
CHUNK_BUSY = _register(
    "DPONE_BACKFILL_CHUNK_BUSY",
    "A chunk of this item holds an active, unexpired lease of another attempt, or another "
    "transaction held what its write needs.",
    "Another task is running the same chunk, a crashed attempt's lease has not expired yet, or "
    "another session held rows of the chunk's range past DPONE_FENCE_LOCK_TIMEOUT (or "
    "deadlocked with its write), or the server cancelled a statement as a serialization failure "
    "(SQLSTATE 40001, also a standby's conflict with recovery).",
    "Wait for the lease to expire or the other transaction to end (see `dpone ledger status`) "
    "and retry the task.",
    retryable=True,
)
MAPPING_UNSUPPORTED = _register(
    "DPONE_AIRFLOW_MAPPING_UNSUPPORTED",
    "A generated DAG file's import fails: the running Airflow lacks what the file uses.",
    "No dynamic task mapping (partial/expand), no map_index_template, or no cncf.kubernetes "
    "KubernetesPodOperator (kubernetes flavour); the import error names what is missing.",
    "Run the DAG files on Airflow 2.10.5, 2.11.x, 3.2.x or 3.3.x with the cncf.kubernetes "
    "provider (docs/compatibility.md).",
)
RUN_IDENTITY_INVALID = _register(
    "DPONE_AIRFLOW_RUN_IDENTITY_INVALID",
    "DPONE_AIRFLOW_RUN_IDENTITY is malformed.",
    "The env value was edited by hand or truncated.",
    "Regenerate the DAG; do not set this variable yourself.",
)
AIRFLOW_CONTEXT_INVALID = _register(
    "DPONE_AIRFLOW_CONTEXT_INVALID",
    "DPONE_AIRFLOW_CONTEXT is malformed or names another DAG or map index than the task's.",
    "The env value was edited by hand, truncated, or set outside the generated operator.",
    "Regenerate the DAG; do not set this variable yourself (local runs leave it unset).",
)
PACK_MISMATCH = _register(
    "DPONE_PACK_MISMATCH",
    "The workload pack compiled in the pod differs from the one the DAG was generated from.",
    "The image and the DAG file come from different commits.",
    "Deploy matching image and DAG files (same commit), or regenerate the DAGs.",
)
# --- runtime ------------------------------------------------------------------------------------
USAGE = _register(
    "DPONE_USAGE",
    "The command line is incomplete or contradictory.",
    "A missing argument, an unknown workload or process name.",
    "See `dpone <command> --help`.",
)
CONNECTION_MISSING = _register(
    "DPONE_CONNECTION_MISSING",
    "A connection name has no DSN in the environment.",
    "DPONE_CONN_<NAME> is not set (in Kubernetes it comes from a secret reference), a file a "
    "..._FILE variable names cannot be read, or `dpone run --item` meets an airflow.secret_files "
    "path that is not mounted here or a connection only an Airflow Connection provides.",
    "Set DPONE_CONN_<NAME> (upper-case name) to the connection's DSN or mount the file; for a "
    "local --item re-run, set the variable (or its _FILE) in your shell: it wins over the task's.",
)
CONNECTION_FAILED = _register(
    "DPONE_CONNECTION_FAILED",
    "A source, sink or ledger database could not be reached or dropped the connection.",
    "The server is down or restarting, the network failed, or credentials are wrong.",
    "Check the server; retry the task: committed chunks are skipped, running leases expire.",
    retryable=True,
)
SOURCE_FAILED = _register(
    "DPONE_SOURCE_FAILED",
    "Reading a chunk from the source failed.",
    "A missing table or column, a permission problem, or a bad trusted query.",
    "Fix the source; the failed chunk is retried on the next run.",
)
SINK_FAILED = _register(
    "DPONE_SINK_FAILED",
    "Writing a chunk into the sink failed (the chunk's transaction was rolled back), or the "
    "target could not be read back (`dpone verify`).",
    "A constraint violation, a type mismatch, a missing target table, or a privilege the sink's "
    "user lacks on the target.",
    "Fix the data or the target (its table, columns or grants; the message names it); re-run the "
    "task: committed chunks are skipped.",
)
READ_BACK_MISMATCH = _register(
    "DPONE_READ_BACK_MISMATCH",
    "After writing a chunk, the sink does not hold what the source holds for it (row count, or "
    "same count with different content); the chunk's transaction was rolled back and the chunk "
    "failed.",
    "The target stores values differently (a narrower column rounded a timestamp into another "
    "chunk, truncated text or a number), a trigger or default changed rows, merge keys repeat or "
    "are NULL in the chunk, or the source changed while the chunk moved.",
    "Widen the target column (or accept the narrowing explicitly), fix the duplicate keys, or "
    "re-run once the source is quiet; `sink.read_back: count` or `off` trades the proof away.",
)
CONNECTOR_INVALID = _register(
    "DPONE_CONNECTOR_INVALID",
    "A source, sink or chunk window cannot be used as specified.",
    "Both or neither of table and query, merge without keys, an unknown inner mode, a chunk column "
    "or key that is not among the moved columns, or bounds of the wrong type or order.",
    "Correct the process's source/sink/backfill settings named in the message.",
)
IDENTIFIER_INVALID = _register(
    "DPONE_IDENTIFIER_INVALID",
    "A table, schema or column name cannot be used safely.",
    "An empty name, a NUL character, or a name longer than the database keeps (Postgres silently "
    "truncates names over 63 bytes).",
    "Rename the object or correct the name in the manifest.",
)
DRIVER_MISSING = _register(
    "DPONE_DRIVER_MISSING",
    "The database driver for a source or sink is not installed.",
    "dpone-runtime was installed without the extra for that database, or the ODBC driver an "
    "MSSQL connection names is not installed (or misspelt in its driver= option).",
    "Install the dpone-runtime wheel, by path, with its [postgres] (psycopg), [mssql] (pyodbc + "
    "unixODBC) or [mysql] (PyMySQL) extra (docs/deploy-kubernetes.md); for MSSQL also "
    "Microsoft's ODBC Driver 18 for SQL Server, or name an installed driver with driver=.",
)
LEDGER_CORRUPT = _register(
    "DPONE_LEDGER_CORRUPT",
    "A ledger record does not match the campaign's shape.",
    "A chunk record's idempotency key or bounds differ from the campaign, an unknown state, or "
    "committed transitions disappeared (rows deleted by hand or a partial restore).",
    "Inspect the record with `dpone ledger status`; never edit ledger rows by hand. Restore the "
    "ledger from a backup; dpone refuses to move those chunks again.",
)
LEDGER_SHAPE_MISMATCH = _register(
    "DPONE_LEDGER_SHAPE_MISMATCH",
    "The stored campaign has another plan hash, config hash or chunk count than this run.",
    "The window shrank, its start moved, the chunk grid or the source/sink changed under the "
    "same backfill_id (a later end on the same grid extends the campaign instead).",
    "Restore the stored window, or use a new backfill_id for a new campaign; to add a range, "
    "move only the end (docs/runbook.md 'Extend a backfill').",
)
RESTATE_REFUSED = _register(
    "DPONE_LEDGER_RESTATE_REFUSED",
    "Chunks cannot be restated: moving them again would not be exact.",
    "The process's inner_mode is append: moving a chunk again inserts its rows next to the ones "
    "moved before.",
    "Restate processes with inner_mode replace, merge or full_refresh; for an append process, "
    "move the corrected range with replace under a new backfill_id.",
)
LEDGER_UNAVAILABLE = _register(
    "DPONE_LEDGER_UNAVAILABLE",
    "The state store cannot be used (missing driver, unsupported backend or schema version).",
    "psycopg/pyodbc not installed, the audit schema was created by a newer dpone, or the local "
    "ledger's file system is full or read-only.",
    "Install the dpone-runtime wheel, by path, with its [postgres] or [mssql] extra; upgrade "
    "dpone to the schema's version.",
)
CAMPAIGN_CANCELLED = _register(
    "DPONE_BACKFILL_CANCELLED",
    "The campaign was cancelled; no new chunk is started.",
    "Someone ran `dpone ledger cancel`.",
    "Start a new campaign (new backfill_id) or resume with `dpone ledger cancel --undo`.",
)
CHUNK_FAILED = _register(
    "DPONE_BACKFILL_CHUNK_FAILED",
    "One or more chunks failed; the run's status is failed.",
    "See the chunk's error code in the evidence or `dpone ledger status`.",
    "Fix the cause and re-run; committed chunks are skipped.",
)
RUN_INTERRUPTED = _register(
    "DPONE_RUN_INTERRUPTED",
    "The run was stopped by SIGTERM or SIGINT; the chunk in flight was rolled back.",
    "Kubernetes deleted the pod, Airflow killed the task (on_kill), or Ctrl-C.",
    "Nothing to repair: the chunk's lease was released, so the next run takes it at once.",
    retryable=True,
)
RESULT_WRITE_FAILED = _register(
    "DPONE_RESULT_WRITE_FAILED",
    "The run result (XCom), the evidence file or the campaign's verification export could not be "
    "written after data was committed; the result says so when its own folder still works.",
    "The XCom or evidence folder became unwritable or full during the run.",
    "The committed chunks are in the ledger and the target: fix the folder and re-run the task "
    "(committed chunks are skipped) to get the result.",
)
OUTPUT_UNWRITABLE = _register(
    "DPONE_OUTPUT_UNWRITABLE",
    "The XCom result file, the evidence folder or a `ledger status --html` page cannot be "
    "written; nothing was moved or written.",
    "DPONE_XCOM_PATH, DPONE_EVIDENCE_DIR or --html points to a read-only, missing or full "
    "location, or to the wrong kind of entry: a folder named as the result file or page, a file "
    "as the evidence folder.",
    "Mount a writable volume there (docs/deploy-kubernetes.md), name a file (XCom, --html) or a "
    "folder (evidence), or unset the variable.",
)
PREFLIGHT_FAILED = _register(
    "DPONE_PREFLIGHT_FAILED",
    "Before any chunk was leased, a table or column the process needs was not found, or a "
    "target column can change the values it receives; nothing was moved or recorded as failed.",
    "The source or target table does not exist (yet), the chunk column is not in the source, "
    "the target lacks a column the source moves, so every chunk would fail; or a moved column's "
    "target type is narrower than its source type (fewer digits or decimal places, shorter or "
    "fixed-width text, fewer fractional seconds, a narrower integer, no time zone, a narrower "
    "character set, another kind of value: docs/connectors.md, Type preflight), so the sink "
    "would round, truncate or pad values without an error.",
    "Create or correct the table, or fix the process's source, sink or chunk column at the "
    "reported manifest location, then run again. For a narrowing: widen the target column, or "
    "list the column in `sink.accept_narrowing` when the target's form of the values is what "
    "you want. An internal run refused before its campaign existed leaves none behind, so the "
    "corrected configuration starts it; a mapped item's campaign is recorded when the item "
    "starts, so a fix that changes the source, sink or chunk needs a new `backfill_id`.",
)
VERIFY_MISMATCH = _register(
    "DPONE_VERIFY_MISMATCH",
    "`dpone verify` found chunks whose target rows differ from the source rows.",
    "The chunk has not run yet, the source changed after the chunk was moved, another writer "
    "changed the target, or the sink's inner mode (append) keeps rows the source no longer has.",
    "A chunk not yet committed has simply not run (see `dpone ledger status`); for a committed "
    "one, find what changed the source or target, move that window again under a new backfill_id "
    "and verify again.",
)
INTERNAL = _register(
    "DPONE_INTERNAL",
    "An unexpected error inside dpone.",
    "A bug.",
    "Report it with the command and the error JSON.",
)
CONFIG_INVALID = _register(
    "DPONE_CONFIG_INVALID",
    "A setting in the environment or on the command line has an invalid value.",
    "A malformed DPONE_* variable or option, or a connection's DSN (DPONE_CONN_<NAME>) with a "
    "setting that can never connect: an unknown sslmode, a port or a connect_timeout that is not "
    "a number (by address or by host name), a raw / or @ in a URL DSN's password (libpq reads "
    "part of it as the port, the host or the database: percent-encode it), options the server "
    "refuses, a certificate file that is not there.",
    "Correct the setting named in the message (in a pod: the secret the DSN comes from); another "
    "attempt with the same value cannot succeed, so the task is not retried.",
)


@record
class ErrorRecord:
    """One problem as data (the dpone.error.v1 shape), not yet raised."""

    code: str
    message: str
    location: Location | None = None

    def to_json(self) -> dict[str, Any]:
        loc = self.location
        return {
            "schema": "dpone.error.v1",
            "code": self.code,
            "message": self.message,
            "file": loc.file if loc else None,
            "line": loc.line if loc else None,
            "column": loc.column if loc else None,
            "retryable": REGISTRY[self.code].retryable,
        }

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location else ""
        return f"{where}{self.code}: {self.message}"


class DponeError(Exception):
    """The root of every dpone failure; carries one or more records (``records[0]`` is primary)."""

    #: set by a sink whose write met a unique key the target already holds: when another chunk's
    #: rows hold it (a row the source moved to an earlier chunk), the chunk can be moved once
    #: that chunk has been, so a run tries it again after its other chunks
    key_conflict: bool = False

    def __init__(
        self,
        code: str,
        message: str,
        location: Location | None = None,
        *,
        records: Iterable[ErrorRecord] = (),
    ) -> None:
        if code not in REGISTRY:
            raise ValueError(f"unregistered error code {code!r}")
        first = ErrorRecord(code, message, location)
        extra = tuple(records)
        self.records: tuple[ErrorRecord, ...] = (first, *extra) if code else extra
        super().__init__(str(first))

    @classmethod
    def from_records(cls, records: Iterable[ErrorRecord]) -> DponeError:
        recs = list(records)
        if not recs:
            raise ValueError("no records")
        first = recs[0]
        return cls(first.code, first.message, first.location, records=recs[1:])

    @property
    def code(self) -> str:
        return self.records[0].code

    @property
    def message(self) -> str:
        return self.records[0].message

    @property
    def location(self) -> Location | None:
        return self.records[0].location

    @property
    def retryable(self) -> bool:
        return REGISTRY[self.code].retryable

    def to_json(self) -> dict[str, Any]:
        return self.records[0].to_json()


@dataclass
class ErrorCollector:
    """Collects records so validation can report every problem at once; a record equal to one
    already held (a manifest two workloads share, checked for each) is one problem, kept once."""

    records: list[ErrorRecord] = field(default_factory=list)
    _held: set[ErrorRecord] = field(default_factory=set, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._held.update(self.records)

    def add(self, code: str, message: str, location: Location | None = None) -> None:
        if code not in REGISTRY:
            raise ValueError(f"unregistered error code {code!r}")
        self.extend([ErrorRecord(code, message, location)])

    def extend(self, records: Iterable[ErrorRecord]) -> None:
        for problem in records:
            if problem not in self._held:
                self._held.add(problem)
                self.records.append(problem)

    def __bool__(self) -> bool:
        return bool(self.records)

    def __iter__(self) -> Iterator[ErrorRecord]:
        return iter(self.records)

    def raise_if_any(self) -> None:
        if self.records:
            raise DponeError.from_records(self.records)


def error_json_line(record: ErrorRecord) -> str:
    """The single stderr line machines read: compact dpone.error.v1 JSON."""
    return json.dumps(record.to_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
