"""OpenLineage run events for `dpone run`: off unless OPENLINEAGE_URL or an OpenLineage config is
found.

One run per `dpone run` process and backfill process: START before the first chunk, then COMPLETE
or FAIL. Inputs and outputs are the source and target tables, named as OpenLineage names them
(Postgres ``postgres://host:port`` + ``db.schema.table``, MySQL ``mysql://host:port`` +
``db.table``, MSSQL ``mssql://host:port`` + ``db.schema.table``; SQLite, which the spec does not
name, as a local file: ``file`` + ``/path/to/db.sqlite/table``). Only host, port, database and
object names leave a DSN, never a user or password. The chunk range rides in the custom run facet
``dpone_chunks``; a run started by an Airflow task (DPONE_AIRFLOW_CONTEXT) carries the parent run
facet (the task instance's try as the parent run, the DAG run as the root) and the Airflow run,
try and map index in the custom facet ``dpone_airflow``; a run outside Airflow carries neither. The
``openlineage-python`` client (the ``lineage`` extra) is imported only when lineage is on. Events
are sent on the export worker (dpone.observability.exporting), never on the data path; a bad
setting or a failed send is one warning and never fails a backfill. Dataset names come from the
DSN's parts as its driver parses them, validated (dpone.credentials.dsn_parts). See
docs/observability.md.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import unicodedata
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dpone.credentials.connections import dsn_kind, sqlite_path
from dpone.credentials.dsn_parts import server_parts
from dpone.credentials.redaction import redact_text
from dpone.observability.exporting import (
    BUDGET_VARIABLE,
    DEFAULT_BUDGET_S,
    ExportWorker,
    RunLineage,
    build_client,
    lineage_config_file,
    lineage_requested,
    one_line_warnings,
    register_exporter_secrets,
)
from dpone.records import record
from dpone.task.airflow_context import AirflowContext

DEFAULT_JOB_NAMESPACE = "dpone"
FACET_NAME = "dpone_chunks"
FACET_SCHEMA_URL = "urn:dpone:openlineage:DponeChunksRunFacet:1"
AIRFLOW_FACET_NAME = "dpone_airflow"
AIRFLOW_FACET_SCHEMA_URL = "urn:dpone:openlineage:DponeAirflowRunFacet:1"
PRODUCER = "urn:dpone:runtime"


@record
class DatasetName:
    """An OpenLineage dataset identity: the datasource namespace and the dataset's name."""

    namespace: str
    name: str


# --- dataset naming -------------------------------------------------------------------------------
#: the host of a namespace whose DSN did not parse into validated parts
NEUTRAL_HOST = "unknown"


def dataset_name(dsn: str, schema: str | None, table: str) -> DatasetName:
    """The OpenLineage namespace and name of ``table`` on the database ``dsn`` points at, built
    from the DSN's parts as its driver parses them and validated (host, port, database); a DSN
    whose parts do not parse or validate gives the neutral namespace ``<kind>://unknown``."""
    kind = dsn_kind(dsn)
    if kind == "sqlite":
        path = _sqlite_file(dsn)
        return DatasetName("file", f"{path}/{table if schema is None else f'{schema}.{table}'}")
    parts = server_parts(dsn, kind)
    if parts is None:
        namespace, database = f"{kind}://{NEUTRAL_HOST}", None
    else:
        namespace, database = f"{kind}://{parts.host}:{parts.port}", parts.database
    if kind == "mysql":
        return DatasetName(namespace, f"{schema or database or ''}.{table}")
    default_schema = "public" if kind == "postgres" else "dbo"
    return DatasetName(namespace, f"{database or ''}.{schema or default_schema}.{table}")


def _sqlite_file(dsn: str) -> str:
    """The absolute path of a SQLite DSN's file: the path only, never its ``?query`` or
    ``#fragment`` (``?key=``, ``?password=``); ``unknown`` when what is left still reads as a
    secret (a registered password, a ``user:password@`` prefix)."""
    path = re.split(r"[?#]", sqlite_path(dsn), maxsplit=1)[0]
    if not path or redact_text(path) != path:
        return NEUTRAL_HOST
    return os.path.realpath(path)


# --- the run --------------------------------------------------------------------------------------
@record
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
    airflow: dict[str, Any] | None  # the dpone_airflow facet's fields (airflow_facet)


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


#: the variables naming a parent (and root) job run explicitly, and what a bad value loses
PARENT_VARIABLES = {
    "OPENLINEAGE_PARENT_ID": "that parent",
    "OPENLINEAGE_ROOT_PARENT_ID": "that root",
}


def parent_problems(environ: Mapping[str, str]) -> list[str]:
    """The explicit parent settings that are given but unusable, each named (never quoted): the
    run then ignores it, as parent_of does, instead of dropping it without a word."""
    return [
        f"{name} is not namespace/name/runId with a UUID as the runId; lineage is sent without "
        + lost
        for name, lost in PARENT_VARIABLES.items()
        if environ.get(name, "").strip() and _triple(environ[name]) is None
    ]


def parent_of(
    environ: Mapping[str, str], context: AirflowContext | None
) -> tuple[tuple[str, str, str] | None, tuple[str, str, str] | None]:
    """(parent, root) job runs: OPENLINEAGE_PARENT_ID / OPENLINEAGE_ROOT_PARENT_ID when given;
    else, for a run started by an Airflow task, the task instance's try (as Airflow's own
    OpenLineage provider counts runs: one per try and map index) under its DAG run."""
    parent = _triple(environ.get("OPENLINEAGE_PARENT_ID", ""))
    root = _triple(environ.get("OPENLINEAGE_ROOT_PARENT_ID", ""))
    if context is None:
        return parent, root
    namespace = environ.get("OPENLINEAGE_NAMESPACE") or "default"
    dag_run = f"airflow:{context.dag_id}:{context.run_id}"
    if parent is None:
        task_try = f"{dag_run}:{context.task_id}:{context.map_index}:{context.try_number}"
        parent = (
            namespace,
            f"{context.dag_id}.{context.task_id}",
            str(uuid.uuid5(uuid.NAMESPACE_URL, task_try)),
        )
    if root is None:
        root = (namespace, context.dag_id, str(uuid.uuid5(uuid.NAMESPACE_URL, dag_run)))
    return parent, root


def airflow_facet(context: AirflowContext | None) -> dict[str, Any] | None:
    """The ``dpone_airflow`` facet's fields: which Airflow run, try and map index ran this."""
    if context is None:
        return None
    return {
        "dagId": context.dag_id,
        "taskId": context.task_id,
        "runId": context.run_id,
        "tryNumber": context.try_number,
        "mapIndex": context.map_index,
        "logicalDate": context.logical_date,
        "dataIntervalStart": context.data_interval_start,
        "dataIntervalEnd": context.data_interval_end,
    }


#: transport types openlineage-python 1.x registers (a dotted class path is also accepted)
TRANSPORT_TYPES = (
    "amazon_datazone_api",
    "async_http",
    "composite",
    "console",
    "datadog",
    "file",
    "gcplineage",
    "http",
    "kafka",
    "msk-iam",
    "noop",
    "transform",
)
_CLASS_PATH = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+")


def _http_url_problem(value: str) -> str | None:
    """Why ``value`` is not an http(s) URL with a host (never quoting it: it may hold a token)."""
    try:
        parts = urlsplit(value.strip())
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return "is not a valid URL (bad host or port)"
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return "is not an http:// or https:// URL with a host"
    return None


def _positive(value: object) -> bool:
    try:
        number = float(str(value).strip())
    except ValueError:
        return False
    return 0 < number < float("inf")


def settings_problem(environ: Mapping[str, str], cwd: str | None = None) -> str | None:
    """What is wrong with the OpenLineage settings, naming the setting, or None.

    Checked before the client is built, so that a bad setting is one warning that says which
    one, rather than the client's traceback, a silent fall-back to printing events on stdout or
    a failure at the first send."""
    url = environ.get("OPENLINEAGE_URL", "").strip()
    if url and (problem := _http_url_problem(url)):
        return f"OPENLINEAGE_URL {problem}"
    level = environ.get("OPENLINEAGE_CLIENT_LOGGING")
    if level and level not in logging.getLevelNamesMapping():  # the client calls setLevel(it)
        return (
            "OPENLINEAGE_CLIENT_LOGGING is not a logging level name (DEBUG, INFO, WARNING, "
            "ERROR or CRITICAL, in capitals)"
        )
    transport: dict[str, Any] = {}
    whole = environ.get("OPENLINEAGE__TRANSPORT")
    if whole is not None:  # the whole transport as JSON: the client needs an object
        try:
            parsed = json.loads(whole)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            return (
                "OPENLINEAGE__TRANSPORT is not a JSON object (it needs one like "
                '{"type": "http", "url": "https://..."})'
            )
    for name in sorted(environ):
        # the client reads each OPENLINEAGE__* value as JSON, else as a string (and logs it)
        value = environ[name]
        if name.startswith("OPENLINEAGE__") and value.lstrip()[:1] in ("{", "["):
            try:
                json.loads(value)
            except ValueError:
                return f"{name} looks like JSON (it has brackets) but is not valid JSON"
    if problem := _env_header_problem(environ):
        return problem
    config_given = environ.get("OPENLINEAGE_CONFIG", "")
    if config_given and not Path(config_given).is_file():
        return "OPENLINEAGE_CONFIG names no readable file"
    path = lineage_config_file(environ, cwd)
    if path is not None:
        where = f"the OpenLineage config file {path}"
        try:
            import yaml  # type: ignore[import-untyped]  # openlineage-python's YAML reader

            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except ImportError:
            loaded = None  # the missing client is reported by the caller
        except (OSError, UnicodeDecodeError) as exc:
            return f"{where} cannot be read ({type(exc).__name__})"
        except Exception as exc:  # yaml.YAMLError and its subclasses
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            return f"{where}{line} is not valid YAML ({getattr(exc, 'problem', None) or 'error'})"
        if loaded is not None and not isinstance(loaded, dict):
            return f"{where} is not a mapping (it needs `transport:` with a `type:`)"
        section = (loaded or {}).get("transport")
        if section is not None and not isinstance(section, dict):
            return f"{where}: `transport` is not a mapping"
        transport = dict(section or {})
        if (
            not transport
            and not url
            and not any(key.startswith("OPENLINEAGE__TRANSPORT") for key in environ)
        ):
            return f"{where} has no `transport:` section (with a `type:`)"
    if whole is not None:  # it replaces the file's and the other variables' transport
        transport = json.loads(whole)
        if "type" not in transport:
            return 'OPENLINEAGE__TRANSPORT has no "type"'
        env_type, setting = transport["type"], "OPENLINEAGE__TRANSPORT.type"
    else:
        env_type = environ.get("OPENLINEAGE__TRANSPORT__TYPE")
        setting = "OPENLINEAGE__TRANSPORT__TYPE" if env_type is not None else "transport.type"
    kind = env_type if env_type is not None else transport.get("type")
    if kind is not None and not (
        str(kind).strip() in TRANSPORT_TYPES or _CLASS_PATH.fullmatch(str(kind))
    ):
        shown = str(kind)[:40]
        return (
            f"{setting}={shown!r} is not an OpenLineage transport type (one of: "
            f"{', '.join(TRANSPORT_TYPES)}, or a transport class path)"
        )
    if kind is not None and str(kind).strip() in ("http", "async_http"):
        given = None if whole is not None else environ.get("OPENLINEAGE__TRANSPORT__URL")
        name = "OPENLINEAGE__TRANSPORT__URL" if given is not None else "transport.url"
        if whole is not None:
            name = "OPENLINEAGE__TRANSPORT.url"
        given = given if given is not None else transport.get("url")
        if given is None and not url:
            return f"{setting}={str(kind).strip()!r} needs OPENLINEAGE__TRANSPORT__URL"
        if given is not None and (problem := _http_url_problem(str(given))):
            return f"{name} {problem}"
    if kind is None and any(key.startswith("OPENLINEAGE__TRANSPORT__") for key in environ):
        if not url:
            return (
                "OPENLINEAGE__TRANSPORT__* variables are set without OPENLINEAGE__TRANSPORT__TYPE"
            )
    where = "OPENLINEAGE__TRANSPORT" if whole is not None else "transport"
    if problem := _transport_header_problem(transport, where):
        return problem
    timeout = None if whole is not None else environ.get("OPENLINEAGE__TRANSPORT__TIMEOUT")
    if timeout is None and "timeout" in transport:
        where = "OPENLINEAGE__TRANSPORT" if whole is not None else "transport"
        timeout, setting = transport["timeout"], f"{where}.timeout"
    else:
        setting = "OPENLINEAGE__TRANSPORT__TIMEOUT"
    if timeout is not None and not _positive(timeout):
        return f"{setting} must be a positive number of seconds"
    return None


#: an HTTP header name (RFC 9110 token), as requests checks it before a send
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_API_KEYS = ("apiKey", "apikey", "api_key")


def _header_value_problem(value: object) -> str | None:
    """Why ``value`` cannot be an HTTP header's value (requests and http.client refuse it only at
    the send, naming no setting), never quoting it: it may be a key."""
    if not isinstance(value, str):
        return (
            f"is {type(value).__name__}, not text (the client reads an OPENLINEAGE__* value as "
            "JSON: write a number or true/false as a JSON string, in double quotes)"
        )
    if any(ord(char) > 255 or unicodedata.category(char) == "Cc" for char in value):
        return (
            "holds a character an HTTP header cannot carry (a line break or another control "
            "character, or one beyond Latin-1)"
        )
    return None


def _headers_problem(value: object) -> str | None:
    """Why ``value`` is not a usable ``custom_headers`` mapping (header name -> value)."""
    if not isinstance(value, dict):
        return "is not a mapping of header names to values (a JSON object)"
    for name, text in value.items():
        if not _HEADER_NAME.fullmatch(str(name)):
            return "names a header with a character no HTTP header name has"
        if problem := _header_value_problem(text):
            return f"has a value that {problem}"
    return None


def _env_header_problem(environ: Mapping[str, str]) -> str | None:
    """The first OpenLineage variable that would put an unusable header on every send:
    OPENLINEAGE_API_KEY, ``..__CUSTOM_HEADERS`` (an object) or ``..__CUSTOM_HEADERS__<NAME>``,
    ``..__AUTH`` (an object) or ``..__AUTH__API_KEY``, read as the client reads them (JSON, else
    text)."""
    key = environ.get("OPENLINEAGE_API_KEY")
    if key and (problem := _header_value_problem(key)):
        return f"OPENLINEAGE_API_KEY {problem}"
    for name in sorted(environ):
        if not name.startswith("OPENLINEAGE__"):
            continue
        path = name.lower().split("__")
        try:
            value: Any = json.loads(environ[name])
        except ValueError:
            value = environ[name]
        problem = None
        if path[-1] == "custom_headers":
            problem = _headers_problem(value)
        elif len(path) > 1 and path[-2] == "custom_headers":
            problem = _headers_problem({path[-1]: value})
        elif path[-1] == "auth" and isinstance(value, dict):
            auth_key = next((k for k in _API_KEYS if k in value), None)
            if auth_key is not None and (problem := _header_value_problem(value[auth_key])):
                problem = f"({auth_key}) {problem}"
        elif path[-1] in ("apikey", "api_key") and len(path) > 1 and path[-2] == "auth":
            problem = _header_value_problem(value)
        if problem:
            return f"{name} {problem}"
    return None


def _transport_header_problem(transport: Mapping[str, Any], where: str) -> str | None:
    """The first unusable header of a transport from the config file or OPENLINEAGE__TRANSPORT
    (a composite's transports included): ``custom_headers`` and ``auth``'s API key."""
    if "custom_headers" in transport:
        if problem := _headers_problem(transport["custom_headers"]):
            return f"{where}.custom_headers {problem}"
    auth = transport.get("auth")
    if isinstance(auth, dict):
        for key in _API_KEYS:
            if key in auth and (problem := _header_value_problem(auth[key])):
                return f"{where}.auth.{key} {problem}"
    inner = transport.get("transports")
    items = (
        inner.items()
        if isinstance(inner, dict)
        else enumerate(inner) if isinstance(inner, list) else ()
    )
    for name, nested in items:
        if isinstance(nested, dict):
            if problem := _transport_header_problem(nested, f"{where}.transports.{name}"):
                return problem
    return None


def transport_setting(environ: Mapping[str, str]) -> str:
    """The setting that chose the OpenLineage transport, for a warning."""
    if "OPENLINEAGE__TRANSPORT" in environ:
        return "OPENLINEAGE__TRANSPORT"
    if (kind := environ.get("OPENLINEAGE__TRANSPORT__TYPE")) is not None:
        return f"OPENLINEAGE__TRANSPORT__TYPE={kind.strip()[:40]!r}"
    path = lineage_config_file(environ)
    if path is not None:
        return f"the transport of the OpenLineage config file {path}"
    return "OPENLINEAGE_URL"


def _transports(transport: Any) -> Iterator[Any]:
    """``transport`` and, for a composite, every transport it sends through."""
    yield transport
    if getattr(transport, "kind", None) == "composite":
        for inner in transport.transports:
            yield from _transports(inner)


def _own_output(path: str) -> bool:
    """Whether a file transport's path is this process's stdout, stderr or terminal."""
    local = path.removeprefix("file://")
    if not local or "://" in local:
        return False
    try:
        target = os.stat(local)
    except OSError:
        return False
    if os.path.realpath(local) == "/dev/tty":
        return True
    for fd in (1, 2):
        try:
            own = os.fstat(fd)
        except OSError:
            continue
        if (own.st_dev, own.st_ino) == (target.st_dev, target.st_ino):
            return True
    return False


def open_run_lineage(
    run: LineageRun,
    environ: Mapping[str, str] | None = None,
    warn: Callable[[str], None] = lambda message: None,
    exports: ExportWorker | None = None,
) -> RunLineage:
    """The OpenLineage emitter of this run, or the silent one when lineage is off or its settings
    are unusable (one warning naming the setting: lineage never fails a run)."""
    env = os.environ if environ is None else environ
    if not lineage_requested(env):
        return RunLineage()
    register_exporter_secrets(env)
    # one worker per `dpone run` process: a warning its other processes gave is not repeated
    worker = exports or ExportWorker(DEFAULT_BUDGET_S, warn)
    warn = worker.once(one_line_warnings(warn))
    try:
        import openlineage.client  # noqa: F401
    except ImportError:
        warn(
            "OPENLINEAGE_URL or an OpenLineage config is set but openlineage-python is missing: "
            "install the dpone-runtime wheel with its [lineage] extra, by path "
            "(docs/deploy-kubernetes.md); this run emits no lineage"
        )
        return RunLineage()
    problem = settings_problem(env)
    if problem is not None:
        warn(f"{problem}; this run emits no lineage")
        return RunLineage()
    emitter, records = build_client(
        lambda: OpenLineageRun(run, worker),
        warn,
        f"{transport_setting(env)}: the transport's settings are incomplete or invalid",
        "this run emits no lineage",
    )
    if emitter is None:
        return RunLineage()
    if emitter.prints_to_console:
        warn(
            "the OpenLineage settings name no transport the client could build (it would print "
            "the events on the console); this run emits no lineage"
        )
        return RunLineage()
    if emitter.console_asked:
        warn(
            "the OpenLineage console transport writes through the client's logging, which dpone "
            "keeps off stderr (its last line is the run's); use the file transport to see the "
            "events; this run emits no lineage"
        )
        return RunLineage()
    if emitter.writes_own_output:
        warn(
            "the OpenLineage file transport's log_file_path is this process's stdout, stderr or "
            "terminal, which dpone keeps for its own lines (its last line is the run's); write "
            "the events to a file; this run emits no lineage"
        )
        return RunLineage()
    if emitter.environment_facet:
        warn(
            "the OpenLineage environment_variables facet (OPENLINEAGE__FACETS__"
            "ENVIRONMENT_VARIABLES, or facets.environment_variables in the config file) would "
            "send environment values, which hold DSNs and keys: lineage is sent without it"
        )
    for problem in parent_problems(env):
        warn(problem)
    if records:
        worker.problem(
            "OpenLineage",
            f"the client reported at start-up: {records[0]}",
            "lineage is emitted as the client set it up",
        )
    return emitter


class OpenLineageRun(RunLineage):
    """Builds the events with openlineage-python's typed classes and sends them with the client
    configured by the environment (OPENLINEAGE_URL, OPENLINEAGE_CONFIG, openlineage.yml)."""

    def __init__(self, run: LineageRun, exports: ExportWorker) -> None:
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

        @attr.define
        class DponeAirflowRunFacet(RunFacet):
            """The Airflow run, try and map index that ran this (custom facet ``dpone_airflow``)."""

            dagId: str = attr.field(default="")
            taskId: str = attr.field(default="")
            runId: str = attr.field(default="")
            tryNumber: int = attr.field(default=0)
            mapIndex: int = attr.field(default=-1)
            logicalDate: str | None = attr.field(default=None)
            dataIntervalStart: str | None = attr.field(default=None)
            dataIntervalEnd: str | None = attr.field(default=None)

            @staticmethod
            def _get_schema() -> str:
                return AIRFLOW_FACET_SCHEMA_URL

        self._run = run
        self._exports = exports
        self._facet_type = DponeChunksRunFacet
        self._airflow_facet_type = DponeAirflowRunFacet
        self._client = OpenLineageClient()
        self._run_id = str(generate_new_uuid())
        transport = self._client.transport
        asked = (self._client.config.transport or {}).get("type")
        nested = list(_transports(transport))[1:]  # a composite's (at any depth)
        self.console_asked = (transport.kind == "console" and asked == "console") or any(
            t.kind == "console" for t in nested
        )
        self.prints_to_console = transport.kind == "console" and asked != "console"
        self.writes_own_output = any(
            t.kind == "file" and _own_output(str(getattr(t.config, "log_file_path", "")))
            for t in _transports(transport)
        )
        facets = getattr(self._client.config, "facets", None)
        self.environment_facet = bool(getattr(facets, "environment_variables", None))
        if facets is not None and self.environment_facet:
            facets.environment_variables = []  # never sent: environment values hold secrets

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
        if run.airflow is not None:
            facets[AIRFLOW_FACET_NAME] = self._airflow_facet_type(producer=PRODUCER, **run.airflow)
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
        """Build the event now (its time is now), send it on the export worker."""
        try:
            event = self._event(state, run_facets, rows)
        except Exception as exc:  # lineage never stops a backfill
            self._exports.problem(
                "OpenLineage", f"could not build the {state} event ({type(exc).__name__})"
            )
            return
        self._exports.submit("OpenLineage", f"{state} event", lambda: self._client.emit(event))

    def start(self) -> None:
        self._emit("START", {})

    def complete(self, rows_written: int) -> None:
        self._emit("COMPLETE", {}, rows_written)
        self._close()

    def fail(self, message: str) -> None:
        from openlineage.client.facet_v2 import error_message_run

        facet = error_message_run.ErrorMessageRunFacet(
            message=redact_text(message)[:2000], programmingLanguage="python", producer=PRODUCER
        )
        self._emit("FAIL", {"errorMessage": facet})
        self._close()

    def _close(self) -> None:
        self._exports.submit("OpenLineage", "client's close", self._close_client)

    def _close_client(self) -> None:
        # A transport that sends in the background (async_http) is waited for here, within what
        # the run will still wait; what it still holds then is dropped and said once.
        transport = self._client.transport
        stats = getattr(transport, "get_stats", None)
        delivered = self._client.close(timeout=max(self._exports.time_left() - 0.2, 0.0))
        if delivered is False:
            pending = stats().get("pending") if callable(stats) else None
            count = f"{pending} event(s)" if isinstance(pending, int) and pending > 0 else "events"
            self._exports.problem(
                "OpenLineage",
                f"the {transport.kind} transport still held {count} unsent when the export "
                f"budget ({BUDGET_VARIABLE}={self._exports.budget_s:g} s) was spent",
                "dropped, the run's result is unaffected",
            )


def describe_run(
    pack: Any,
    plan: Any,
    selection: Any,
    context: AirflowContext | None,
    environ: Mapping[str, str],
) -> LineageRun:
    """The LineageRun of one process run (a WorkloadPack, ProcessPlan and Selection) and the
    Airflow run that started it (None outside Airflow)."""
    from dpone.credentials.connections import resolve_dsn
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
    # Only a run started by an Airflow task (its operator passed DPONE_AIRFLOW_CONTEXT, parsed by
    # the runner before this) has an Airflow parent; a run its result records as outside Airflow
    # (a shell, `dpone run --item N`) has only an explicit OPENLINEAGE_PARENT_ID, whatever
    # AIRFLOW_CTX_* variables its shell holds.
    parent, root = parent_of(environ, context)
    return LineageRun(
        job_namespace=environ.get("OPENLINEAGE_NAMESPACE") or DEFAULT_JOB_NAMESPACE,
        job_name=f"{pack.workload.name}.{plan.name}",
        job_type="BACKFILL" if backfill else "FULL_REFRESH",
        inputs=named(cfg.source.connection, cfg.source.table),
        outputs=named(cfg.sink.connection, cfg.sink.table),
        chunks=facet,
        parent=parent,
        root=root,
        airflow=airflow_facet(context),
    )
