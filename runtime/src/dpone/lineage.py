"""OpenLineage run events for `dpone run`: off unless OPENLINEAGE_URL or an OpenLineage config is
found.

One run per `dpone run` process and backfill process: START before the first chunk, then COMPLETE
or FAIL. Inputs and outputs are the source and target tables, named as OpenLineage names them
(Postgres ``postgres://host:port`` + ``db.schema.table``, MySQL ``mysql://host:port`` +
``db.table``, MSSQL ``mssql://host:port`` + ``db.schema.table``; SQLite, which the spec does not
name, as a local file: ``file`` + ``/path/to/db.sqlite/table``). Only host, port, database and
object names leave a DSN, never a user or password. The chunk range rides in the custom run facet
``dpone_chunks``; a run started by an Airflow task carries the parent run facet (the DAG as the
parent job). The ``openlineage-python`` client (the ``lineage`` extra) is imported only when
lineage is on; emitting never fails a backfill (a failed send is a warning). See
docs/observability.md.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from dpone.connections import dsn_kind, sqlite_path

DEFAULT_JOB_NAMESPACE = "dpone"
FACET_NAME = "dpone_chunks"
FACET_SCHEMA_URL = "urn:dpone:openlineage:DponeChunksRunFacet:1"
PRODUCER = "urn:dpone:runtime"
_DEFAULT_PORTS = {"postgres": 5432, "mysql": 3306, "mssql": 1433}
_KEYWORD = re.compile(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")


@dataclass(frozen=True)
class DatasetName:
    """An OpenLineage dataset identity: the datasource namespace and the dataset's name."""

    namespace: str
    name: str


def lineage_requested(environ: Mapping[str, str], cwd: str | None = None) -> bool:
    """True when the OpenLineage client would find a transport: OPENLINEAGE_URL, an
    OPENLINEAGE__TRANSPORT__* variable or a config file (OPENLINEAGE_CONFIG, ./openlineage.yml,
    ~/.openlineage/openlineage.yml); OPENLINEAGE_DISABLED=true turns it off."""
    if environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OPENLINEAGE_URL", "").strip():
        return True
    if any(key.startswith("OPENLINEAGE__TRANSPORT") for key in environ):
        return True
    config = environ.get("OPENLINEAGE_CONFIG", "")
    folder = Path(cwd or os.getcwd())
    home = Path(environ.get("HOME") or Path.home())
    candidates = [Path(config)] if config else []
    candidates += [folder / "openlineage.yml", home / ".openlineage" / "openlineage.yml"]
    return any(path.is_file() for path in candidates)


# --- dataset naming -------------------------------------------------------------------------------
def _server_parts(dsn: str, kind: str) -> tuple[str, int, str | None]:
    """(host, port, database) of a URL or a key=value DSN; no user or password is read."""
    if "://" in dsn:
        parts = urlsplit(dsn.strip())
        if kind == "mssql" and parts.scheme.lower() == "odbc":
            fields = {
                k.strip().upper(): v.strip().strip("{}")
                for k, _, v in (p.partition("=") for p in dsn.split("://", 1)[1].split(";"))
            }
            server = fields.get("SERVER", "localhost").replace("tcp:", "")
            host, _, odbc_port = server.partition(",")
            return host, int(odbc_port) if odbc_port.isdigit() else 1433, fields.get("DATABASE")
        try:
            url_port = parts.port or _DEFAULT_PORTS[kind]
        except ValueError:
            url_port = _DEFAULT_PORTS[kind]
        database = unquote(parts.path.lstrip("/")) or None
        return parts.hostname or "localhost", url_port, database
    keywords = {k: v.strip("'") for k, v in _KEYWORD.findall(dsn)}
    port_text = keywords.get("port", "")
    port = int(port_text) if port_text.isdigit() else _DEFAULT_PORTS[kind]
    return keywords.get("host", "localhost").split(",")[0], port, keywords.get("dbname")


def dataset_name(dsn: str, schema: str | None, table: str) -> DatasetName:
    """The OpenLineage namespace and name of ``table`` on the database ``dsn`` points at."""
    kind = dsn_kind(dsn)
    if kind == "sqlite":
        path = os.path.realpath(sqlite_path(dsn))
        return DatasetName("file", f"{path}/{table if schema is None else f'{schema}.{table}'}")
    host, port, database = _server_parts(dsn, kind)
    namespace = f"{kind}://{host}:{port}"
    if kind == "mysql":
        return DatasetName(namespace, f"{schema or database or ''}.{table}")
    default_schema = "public" if kind == "postgres" else "dbo"
    return DatasetName(namespace, f"{database or ''}.{schema or default_schema}.{table}")


# --- the run --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LineageRun:
    """What the events of one run say, gathered before any I/O (names only, no secrets)."""

    job_namespace: str
    job_name: str
    job_type: str  # BACKFILL | FULL_REFRESH
    inputs: tuple[DatasetName, ...]
    outputs: tuple[DatasetName, ...]
    chunks: dict[str, Any]  # the dpone_chunks facet's fields
    parent: tuple[str, str, str] | None  # (namespace, name, runId) of the parent job run
    root: tuple[str, str, str] | None


def _triple(value: str) -> tuple[str, str, str] | None:
    """``namespace/name/runId`` (the form of Airflow's lineage_parent_id macro)."""
    parts = value.strip().split("/")
    if len(parts) < 3:
        return None
    namespace, run_id, name = parts[0], parts[-1], "/".join(parts[1:-1])
    try:
        uuid.UUID(run_id)
    except ValueError:
        return None
    return (namespace, name, run_id) if namespace and name else None


def parent_of(
    environ: Mapping[str, str], dag_id: str | None, campaign: str | None
) -> tuple[tuple[str, str, str] | None, tuple[str, str, str] | None]:
    """(parent, root) job runs: OPENLINEAGE_PARENT_ID / OPENLINEAGE_ROOT_PARENT_ID when given;
    else, for a run started by an Airflow task, the DAG (its dag_id, plus the task id when Airflow
    exports it) with a run id derived from the DAG run id or, failing that, the campaign."""
    parent = _triple(environ.get("OPENLINEAGE_PARENT_ID", ""))
    root = _triple(environ.get("OPENLINEAGE_ROOT_PARENT_ID", ""))
    if parent is None and dag_id:
        namespace = environ.get("OPENLINEAGE_NAMESPACE") or "default"
        task = environ.get("AIRFLOW_CTX_TASK_ID")
        name = f"{dag_id}.{task}" if task else dag_id
        run_of = environ.get("AIRFLOW_CTX_DAG_RUN_ID") or campaign or ""
        run_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"airflow:{dag_id}:{run_of}:{task or ''}"))
        parent = (namespace, name, run_id)
    if parent is not None and root is None and dag_id:
        namespace = environ.get("OPENLINEAGE_NAMESPACE") or "default"
        run_of = environ.get("AIRFLOW_CTX_DAG_RUN_ID") or campaign or ""
        root = (
            namespace,
            dag_id,
            str(uuid.uuid5(uuid.NAMESPACE_URL, f"airflow:{dag_id}:{run_of}")),
        )
    return parent, root


class RunLineage:
    """The silent default: lineage is off."""

    def start(self) -> None:
        """Emit START."""

    def complete(self, rows_written: int) -> None:
        """Emit COMPLETE with the rows written to the output."""

    def fail(self, message: str) -> None:
        """Emit FAIL with a secret-free message (a dpone error code and text)."""


def open_run_lineage(
    run: LineageRun,
    environ: Mapping[str, str] | None = None,
    warn: Callable[[str], None] = lambda message: None,
) -> RunLineage:
    env = os.environ if environ is None else environ
    if not lineage_requested(env):
        return RunLineage()
    try:
        return OpenLineageRun(run, warn)
    except ImportError:
        warn(
            "OPENLINEAGE_URL or an OpenLineage config is set but openlineage-python is missing: "
            "install dpone-runtime[lineage]; this run emits no lineage"
        )
        return RunLineage()


class OpenLineageRun(RunLineage):
    """Builds the events with openlineage-python's typed classes and sends them with the client
    configured by the environment (OPENLINEAGE_URL, OPENLINEAGE_CONFIG, openlineage.yml)."""

    def __init__(self, run: LineageRun, warn: Callable[[str], None]) -> None:
        import attr
        from openlineage.client import OpenLineageClient
        from openlineage.client.facet_v2 import RunFacet
        from openlineage.client.uuid import generate_new_uuid

        @attr.define
        class DponeChunksRunFacet(RunFacet):
            """dpone's chunk range of this run (custom facet ``dpone_chunks``)."""

            campaign: str | None = attr.field(default=None)
            mode: str = attr.field(default="internal")
            itemIndex: int | None = attr.field(default=None)
            chunkColumn: str | None = attr.field(default=None)
            chunkType: str | None = attr.field(default=None)
            firstChunkIndex: int | None = attr.field(default=None)
            lastChunkIndex: int | None = attr.field(default=None)
            chunksSelected: int = attr.field(default=0)
            lowerBound: str | None = attr.field(default=None)
            upperBound: str | None = attr.field(default=None)

            @staticmethod
            def _get_schema() -> str:
                return FACET_SCHEMA_URL

        self._run = run
        self._warn = warn
        self._facet_type = DponeChunksRunFacet
        self._client = OpenLineageClient()
        self._run_id = str(generate_new_uuid())

    def _event(self, state: str, run_facets: dict[str, Any], rows: int | None = None) -> Any:
        from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent
        from openlineage.client.event_v2 import RunState as EventType
        from openlineage.client.facet_v2 import (
            job_type_job,
            output_statistics_output_dataset,
            parent_run,
        )

        run = self._run
        facets: dict[str, Any] = {FACET_NAME: self._facet_type(producer=PRODUCER, **run.chunks)}
        if run.parent is not None:
            namespace, name, run_id = run.parent
            root = None
            if run.root is not None:
                root = parent_run.Root(
                    run=parent_run.RootRun(runId=run.root[2]),
                    job=parent_run.RootJob(namespace=run.root[0], name=run.root[1]),
                )
            facets["parent"] = parent_run.ParentRunFacet(
                run=parent_run.Run(runId=run_id),
                job=parent_run.Job(namespace=namespace, name=name),
                root=root,
                producer=PRODUCER,
            )
        facets.update(run_facets)
        outputs = []
        for dataset in run.outputs:
            output_facets: dict[str, Any] = {}
            if rows is not None:
                output_facets["outputStatistics"] = (
                    output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                        rowCount=rows, producer=PRODUCER
                    )
                )
            outputs.append(
                OutputDataset(
                    namespace=dataset.namespace,
                    name=dataset.name,
                    outputFacets=output_facets,
                )
            )
        job_type = job_type_job.JobTypeJobFacet(
            processingType="BATCH", integration="DPONE", jobType=run.job_type, producer=PRODUCER
        )
        return RunEvent(
            eventType=getattr(EventType, state),
            eventTime=dt.datetime.now(dt.UTC).isoformat(),
            run=Run(runId=self._run_id, facets=facets),
            job=Job(namespace=run.job_namespace, name=run.job_name, facets={"jobType": job_type}),
            producer=PRODUCER,
            inputs=[InputDataset(namespace=d.namespace, name=d.name) for d in run.inputs],
            outputs=outputs,
        )

    def _emit(self, state: str, run_facets: dict[str, Any], rows: int | None = None) -> None:
        try:
            self._client.emit(self._event(state, run_facets, rows))
        except Exception as exc:  # lineage never stops a backfill
            self._warn(f"could not emit the OpenLineage {state} event ({type(exc).__name__})")

    def start(self) -> None:
        self._emit("START", {})

    def complete(self, rows_written: int) -> None:
        self._emit("COMPLETE", {}, rows_written)
        self._close()

    def fail(self, message: str) -> None:
        from openlineage.client.facet_v2 import error_message_run

        facet = error_message_run.ErrorMessageRunFacet(
            message=message[:2000], programmingLanguage="python", producer=PRODUCER
        )
        self._emit("FAIL", {"errorMessage": facet})
        self._close()

    def _close(self) -> None:
        try:
            self._client.close(timeout=10.0)
        except Exception as exc:
            self._warn(f"could not close the OpenLineage client ({type(exc).__name__})")


def describe_run(
    pack: Any, plan: Any, selection: Any, dag_id: str | None, environ: Mapping[str, str]
) -> LineageRun:
    """The LineageRun of one process run (a WorkloadPack, ProcessPlan and Selection)."""
    from dpone.connections import resolve_dsn
    from dpone.errors import DponeError

    cfg = plan.config

    def named(connection: str, table: Any) -> tuple[DatasetName, ...]:
        if table is None:  # a trusted query: no single dataset to name
            return ()
        try:
            return (dataset_name(resolve_dsn(connection, environ), table.schema, table.name),)
        except DponeError:  # a missing or odd DSN: the run itself reports it
            return ()

    chunks = selection.chunks
    backfill = cfg.backfill
    facet: dict[str, Any] = {
        "campaign": plan.run_key,
        "mode": selection.mode,
        "itemIndex": selection.item.item_index if selection.item else None,
        "chunkColumn": backfill.chunk.column if backfill else None,
        "chunkType": backfill.chunk.type if backfill else None,
        "firstChunkIndex": chunks[0].index if chunks else None,
        "lastChunkIndex": chunks[-1].index if chunks else None,
        "chunksSelected": len(chunks),
        "lowerBound": str(chunks[0].start) if chunks else None,
        "upperBound": str(chunks[-1].end) if chunks else None,
    }
    parent, root = parent_of(environ, dag_id, plan.run_key)
    return LineageRun(
        job_namespace=environ.get("OPENLINEAGE_NAMESPACE") or DEFAULT_JOB_NAMESPACE,
        job_name=f"{pack.workload.name}.{plan.name}",
        job_type="BACKFILL" if backfill else "FULL_REFRESH",
        inputs=named(cfg.source.connection, cfg.source.table),
        outputs=named(cfg.sink.connection, cfg.sink.table),
        chunks=facet,
        parent=parent,
        root=root,
    )
