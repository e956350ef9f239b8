"""`dpone run`: the composition root of a pod.

Order matters and is the contract: read and parse the provider-owned env first (before any
manifest or connector), recompile the pack, verify identity and plan, and only then open the
ledger and connectors.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from dpone import errors
from dpone.credentials.connections import check_dsns, env_key, require_connections
from dpone.credentials.credential_parts import dsn_file_env
from dpone.credentials.redaction import redact_text
from dpone.errors import DponeError, ErrorRecord, error_json_line
from dpone.lifecycle.faults import fault_point
from dpone.lifecycle.interrupt import STOP, install_handlers
from dpone.lifecycle.read_ahead import read_ahead_budget
from dpone.lifecycle.session_limits import session_limits
from dpone.lifecycle.sessions import shared_sessions
from dpone.observability.exporting import (
    ExportWorker,
    RunLineage,
    RunObserver,
    export_budget,
    lineage_requested,
    metrics_requested,
    take_over_library_output,
)
from dpone.observability.progress import (
    ENV_LOG_FORMAT,
    PROGRESS_EVENT_SCHEMA,
    NoProgressSink,
    choose_progress,
    log_format,
)
from dpone.observability.reporting import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_OK,
    exit_code_for,
    report_error,
)
from dpone.observability.result import RunOutcome, write_json_atomic, xcom_path
from dpone.packing.pack import ProcessPlan, WorkloadPack, load_workload_pack, select_process
from dpone.packing.task_env import Env, mapped_item_env, runtime_env, secret_file_env
from dpone.packing.verify import select_chunks, verify_identity
from dpone.run import refusal
from dpone.run.orchestrator import (
    RunContext,
    RunSettings,
    new_owner,
    run_backfill,
    run_full_refresh,
)
from dpone.task.airflow_context import (
    AirflowContext,
    airflow_section,
    owner_prefix,
    parse_airflow_context,
)
from dpone.task.identity import RunIdentity, parse_run_identity
from dpone.task.item import ENV_CONTEXT, ENV_ITEM, ENV_RUN_IDENTITY, ParsedItem, parse_mapping_item


def read_env_inputs() -> tuple[ParsedItem | None, RunIdentity | None]:
    """Parse the provider-owned env values; nothing else has been read yet."""
    raw_item = os.environ.get(ENV_ITEM)
    raw_identity = os.environ.get(ENV_RUN_IDENTITY)
    item = parse_mapping_item(raw_item) if raw_item is not None else None
    identity = parse_run_identity(raw_identity) if raw_identity is not None else None
    return item, identity


def env_airflow_context() -> AirflowContext | None:
    """DPONE_AIRFLOW_CONTEXT, parsed; None outside Airflow."""
    raw = os.environ.get(ENV_CONTEXT)
    return None if raw is None else parse_airflow_context(raw)


def held_to_task(
    context: AirflowContext | None, item: ParsedItem | None, identity: RunIdentity | None
) -> AirflowContext | None:
    """``context`` when it names the task's own DAG and map index (the operator reads it from
    the same task instance as the item and the identity)."""
    if context is None:
        return None
    if identity is not None and context.dag_id != identity.dag_id:
        raise DponeError(
            errors.AIRFLOW_CONTEXT_INVALID,
            f"{ENV_CONTEXT}: dag_id differs from the run identity's {identity.dag_id!r}",
        )
    if item is not None and context.map_index != item.item_index:
        raise DponeError(
            errors.AIRFLOW_CONTEXT_INVALID,
            f"{ENV_CONTEXT}: map_index {context.map_index} is not the mapped item's "
            f"{item.item_index}",
        )
    return context


def evidence_key(outcome: RunOutcome) -> str | None:
    """The evidence folder: the campaign's run_key, or ``fr-<workload>.<process>`` for a full
    refresh (which has no campaign; every run adds its own file there)."""
    if outcome.strategy == "full_refresh":
        return f"fr-{outcome.workload}.{outcome.process}"
    return outcome.run_key


#: what the up-front check writes and syncs: an empty file can still be created on a full
#: filesystem, a few KiB cannot (larger than a result document, cheap on every pod start)
PROBE_BYTES = 16 * 1024


def check_outputs_writable() -> None:
    """Prove the result (XCom) and evidence destinations writable, with room to spare, before any
    data moves, so a read-only, missing or full volume refuses the run instead of losing its
    result after a commit."""
    targets: list[tuple[str, Path]] = []
    target = xcom_path()
    if target is not None:
        problem = _not_a_result_file(target)
        if problem is not None:
            # The final rename would fail on a folder only after every chunk had committed,
            # and would replace a pipe or a device with a regular file.
            raise DponeError(
                errors.OUTPUT_UNWRITABLE,
                f"the result file (DPONE_XCOM_PATH) {str(target)!r} {problem}; nothing was moved",
            )
        folder = target.parent
        if target.is_symlink():  # written through (write_text_atomic): its folder is the probe's
            folder = Path(os.path.realpath(target)).parent
            if not folder.is_dir():
                raise DponeError(
                    errors.OUTPUT_UNWRITABLE,
                    f"the result file (DPONE_XCOM_PATH) {str(target)!r} is a link into a folder "
                    f"that does not exist ({str(folder)!r}); nothing was moved",
                )
        targets.append(("the result file (DPONE_XCOM_PATH)", folder))
    evidence_dir = os.environ.get("DPONE_EVIDENCE_DIR")
    if evidence_dir:
        targets.append(("the evidence folder (DPONE_EVIDENCE_DIR)", Path(evidence_dir)))
    for what, folder in targets:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".dpone-probe-") as probe:
                # random bytes, synced: a compressing filesystem would store zeros in no space,
                # and a delayed allocation may report a full disk only at the sync
                probe.write(os.urandom(PROBE_BYTES))
                probe.flush()
                os.fsync(probe.fileno())
        except OSError as exc:
            raise DponeError(
                errors.OUTPUT_UNWRITABLE,
                f"{what} is not writable ({type(exc).__name__}: {exc.strerror or 'error'}); "
                "nothing was moved",
            ) from None


def _connection_roles(plans: list[ProcessPlan]) -> dict[str, str]:
    """Each connection the processes open, with the first role that uses it (for messages)."""
    roles: dict[str, str] = {}
    for plan in plans:
        cfg = plan.config
        source = f"table {cfg.source.table.dotted!r}" if cfg.source.table else "query"
        roles.setdefault(cfg.source.connection, f"source {cfg.source.connection!r} {source}")
        target = f"target {cfg.sink.connection!r} table {cfg.sink.table.dotted!r}"
        roles.setdefault(cfg.sink.connection, target)
        if cfg.backfill is not None and cfg.state.connection:
            roles.setdefault(cfg.state.connection, "the ledger database")
    return roles


def _not_a_result_file(target: Path) -> str | None:
    """Why the result cannot be written at ``target`` (a link is followed), or None: nothing
    there yet, or a regular file the result replaces."""
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:  # a name too long, a loop of links, a folder that is a file
        return f"cannot be used ({type(exc).__name__}: {exc.strerror or 'error'})"
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(mode):
        return "is not a regular file (a pipe, a device or a socket)"
    return None


def _emit(outcome: RunOutcome, owner: str) -> None:
    """Write the evidence, then the result: an evidence file that cannot be written turns a
    passed outcome into DPONE_RESULT_WRITE_FAILED, which the result then says. A result that
    cannot be written raises DPONE_RESULT_WRITE_FAILED, saying that data moved."""
    evidence_dir = os.environ.get("DPONE_EVIDENCE_DIR")
    key = evidence_key(outcome)
    if evidence_dir and key:
        scope = f"item-{outcome.mapping['item_index']:03d}" if outcome.mapping else "internal"
        safe_owner = "".join(c if c.isalnum() else "-" for c in owner)
        path = Path(evidence_dir) / key / f"{scope}.{safe_owner}.json"
        try:
            write_json_atomic(path, outcome.evidence_document(owner))
        except OSError as exc:
            problem = (
                f"the evidence file {str(path)!r} could not be written ({type(exc).__name__}: "
                f"{exc.strerror or 'error'})"
            )
            if outcome.error is None:
                outcome.error = ErrorRecord(
                    errors.RESULT_WRITE_FAILED,
                    f"{outcome.workload}/{outcome.process}: {outcome.chunks_committed} chunk(s) "
                    f"committed ({outcome.rows_written:,} rows; the ledger and the target have "
                    f"them), but {problem}",
                )
            else:  # the run's own failure stays its error; its retry writes the evidence
                _warn(f"{outcome.workload}/{outcome.process}: {problem}")
    target = xcom_path()
    if target is None:
        return
    try:
        write_json_atomic(target, outcome.result_document())
    except OSError as exc:
        raise DponeError(
            errors.RESULT_WRITE_FAILED,
            f"{outcome.workload}/{outcome.process}: {outcome.chunks_committed} chunk(s) "
            f"committed ({outcome.rows_written:,} rows; the ledger and the target have them), but "
            f"the result could not be written ({type(exc).__name__}: "
            f"{exc.strerror or 'error'})",
        ) from None


def _summary_json(outcome: RunOutcome) -> str:
    """The summary line as one JSON object (``DPONE_LOG_FORMAT=json``): counts, never values."""
    error = outcome.error.code if outcome.error else None
    return json.dumps(
        {
            "schema": "dpone.progress.v1",
            "event": "summary",
            "label": f"{outcome.workload}/{outcome.process}",
            "status": outcome.status,
            "strategy": outcome.strategy,
            "committed": outcome.chunks_committed,
            "already_committed": outcome.chunks_skipped_resume,
            "failed": outcome.chunks_failed,
            "not_started": outcome.chunks_not_started,
            "busy": outcome.chunks_busy,
            "interrupted": outcome.chunks_interrupted,
            "cancelled": outcome.chunks_cancelled,
            "rows_total": outcome.rows_written,
            "duration_ms": outcome.duration_ms,
            "error_code": error,
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def _summary(outcome: RunOutcome) -> str:
    if outcome.strategy == "full_refresh":
        what = (
            f"{outcome.rows_written:,} rows replaced the target via {outcome.method}"
            if outcome.status == "passed"
            else "rolled back, target unchanged"
        )
        return (
            f"dpone: {outcome.workload}/{outcome.process}: {outcome.status} — full refresh, "
            f"{what} ({outcome.duration_ms} ms)"
        )
    others = [
        f"{count} {label}"
        for count, label in (
            (outcome.chunks_busy, "busy"),
            (outcome.chunks_interrupted, "interrupted"),
            (outcome.chunks_cancelled, "cancelled"),
            (outcome.chunks_not_started, "not started"),
        )
        if count
    ]
    return (
        f"dpone: {outcome.workload}/{outcome.process}: {outcome.status} — "
        f"{outcome.chunks_committed} committed, {outcome.chunks_skipped_resume} already "
        f"committed, {outcome.chunks_failed} failed, "
        + "".join(f"{other}, " for other in others)
        + f"{outcome.rows_written:,} rows ({outcome.duration_ms} ms)"
    )


def _warn(message: str) -> None:
    """One ``dpone: warning:`` line (a dpone.progress.v1 ``warning`` event in JSON log mode)."""
    text = redact_text(message)
    if os.environ.get(ENV_LOG_FORMAT, "").strip().lower() == "json":
        line = json.dumps(
            {"schema": PROGRESS_EVENT_SCHEMA, "event": "warning", "message": text},
            sort_keys=True,
            separators=(",", ":"),
        )
        print(line, file=sys.stderr, flush=True)
        return
    print(f"dpone: warning: {text}", file=sys.stderr, flush=True)


def mapped_task_env(pack: WorkloadPack, process: str | None, index: int) -> tuple[str, Env]:
    """The process name and the env of mapped task ``index``, as its generated DAG passes it."""
    if process is None:
        if len(pack.processes) != 1:
            names = ", ".join(p.name for p in pack.processes)
            raise DponeError(errors.USAGE, f"--item needs --process (one of: {names})")
        process = pack.processes[0].name
    plan = select_process(pack, process)
    mapping = plan.mapping_plan
    if mapping is None:
        raise DponeError(
            errors.USAGE,
            f"process {process!r} runs in mode internal (one task, no map index): run it "
            "without --item",
        )
    if not 0 <= index < mapping.items_total:
        raise DponeError(
            errors.USAGE,
            f"--item {index}: process {process!r} has items 0-{mapping.items_total - 1} "
            "(Airflow map indexes)",
        )
    env = mapped_item_env(runtime_env(pack, plan), plan, mapping, mapping.items[index])
    return process, env


def local_credential_env(
    pack: WorkloadPack, env: Env, environ: Mapping[str, str] | None = None
) -> Env:
    """``env`` (a task's env) for a local `--item` re-run: an ``airflow.secret_files`` path
    (``DPONE_CONN_<NAME>[_<FIELD>]_FILE``) is dropped where this shell sets that variable or the
    part itself (which wins over its file, as in the task). Refused before any I/O
    (DPONE_CONNECTION_MISSING, every problem at once) when a file left is not readable here, or
    when a connection the Airflow task takes from an Airflow Connection
    (``airflow.airflow_connections``, resolved only by the operator) has no DPONE_CONN_<NAME>
    here."""
    shell = os.environ if environ is None else environ
    airflow = pack.workload.airflow
    problems: list[ErrorRecord] = []
    for ref in airflow.airflow_connections:
        if not shell.get(env_key(ref.connection)) and not shell.get(dsn_file_env(ref.connection)):
            problems.append(
                ErrorRecord(
                    errors.CONNECTION_MISSING,
                    f"--item: connection {ref.connection!r} comes from the Airflow Connection "
                    f"{ref.conn_id!r} (airflow.airflow_connections), which only the Airflow task "
                    f"resolves: set {env_key(ref.connection)} for a local re-run",
                )
            )
    files = dict(secret_file_env(airflow))
    kept: list[tuple[str, str]] = []
    for key, value in env:
        if key in files:
            if shell.get(key) or shell.get(key.removesuffix("_FILE")):
                continue  # this shell's own file or value wins, as it would in the task
            if not (os.path.isfile(value) and os.access(value, os.R_OK)):
                problems.append(
                    ErrorRecord(
                        errors.CONNECTION_MISSING,
                        f"--item: {key} is {value!r} in the Airflow task (airflow.secret_files), "
                        "which is not a readable file here: run where it is mounted, or set "
                        f"{key} to a readable copy (or {key.removesuffix('_FILE')} to the value)",
                    )
                )
        kept.append((key, value))
    if problems:
        raise DponeError.from_records(problems)
    return tuple(kept)


@contextlib.contextmanager
def environment(env: Env) -> Iterator[None]:
    """``env`` set in os.environ for the duration, the previous values restored after."""
    saved = {key: os.environ.get(key) for key, _ in env}
    os.environ.update(dict(env))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_mapped_item(args: argparse.Namespace) -> int:
    """`dpone run --item N`: mapped task N re-run locally with exactly its generated env; from
    there on the same path as in the pod (the env is parsed and verified like any other)."""
    present = [key for key in (ENV_ITEM, ENV_RUN_IDENTITY, ENV_CONTEXT) if key in os.environ]
    if present:
        raise DponeError(
            errors.USAGE,
            f"--item runs mapped item N as its Airflow task would, with the item and run "
            f"identity computed from the plan and no Airflow context: unset "
            f"{' and '.join(present)} first",
        )
    pack = load_workload_pack(args.catalog, args.workload)
    process, env = mapped_task_env(pack, args.process, args.item)
    env = local_credential_env(pack, env)
    keys = ", ".join(key for key, _ in env)
    print(
        f"dpone: {pack.workload.name}/{process}: re-running mapped item {args.item} with the env "
        f"of its Airflow task ({keys})",
        file=sys.stderr,
    )
    with environment(env):
        session_limits()  # the task's own settings (airflow.env), refused as the pod refuses them
        read_ahead_budget()
        item, identity = read_env_inputs()
        return run_plans(args, pack, item, identity, None)


def run_command(args: argparse.Namespace) -> int:
    install_handlers()
    if getattr(args, "item", None) is not None:
        session_limits()  # a bad session limit variable is refused before any I/O
        read_ahead_budget()  # so is a bad read-ahead budget
        refusal.SCOPE.note(airflow=airflow_section(None))
        return run_mapped_item(args)
    # the Airflow run first: from here on a refusal's result says which run and try it failed
    context = env_airflow_context()
    refusal.SCOPE.note(airflow=airflow_section(context))
    item, identity = read_env_inputs()
    airflow = held_to_task(context, item, identity)  # before any catalog is read, like the rest
    session_limits()  # a bad session limit variable is refused before any I/O
    read_ahead_budget()  # so is a bad read-ahead budget
    if item is not None and identity is None:
        raise DponeError(
            errors.RUN_IDENTITY_INVALID,
            "DPONE_AIRFLOW_RUN_IDENTITY is missing: a mapped item runs only with the identity of "
            "the DAG it came from (the generated DAG sets both; use `dpone run --item N` locally)",
        )
    refusal.SCOPE.note(mode=item.mode if item else None)
    pack = load_workload_pack(args.catalog, args.workload)
    return run_plans(args, pack, item, identity, airflow)


def run_plans(
    args: argparse.Namespace,
    pack: WorkloadPack,
    item: ParsedItem | None,
    identity: RunIdentity | None,
    airflow: AirflowContext | None,
) -> int:
    """Verify the env's item and identity against the plan, then run the selected processes
    (recording the Airflow run they serve, or that they ran outside Airflow)."""
    refusal.SCOPE.note(workload=pack.workload.name, pack_fingerprint=pack.fingerprint)
    fmt = log_format(os.environ)
    summary = _summary_json if fmt == "json" else _summary
    if args.process is not None:
        plans = [select_process(pack, args.process)]
    else:
        if item is not None and len(pack.processes) > 1:
            raise DponeError(errors.USAGE, "a mapped item needs --process")
        plans = list(pack.processes)
    if len(plans) == 1:
        refusal.SCOPE.note(process=plans[0].name, run_key=plans[0].run_key)
    for plan in plans:
        verify_identity(pack, plan.name, identity)
    selections = [select_chunks(plan, item) for plan in plans]
    refusal.SCOPE.note(mode=selections[0].mode if len(selections) == 1 else None)
    # after the plan checks (a wrong item is a plan mismatch whatever the env), before any I/O
    require_connections(
        name
        for plan in plans
        for name in (plan.config.source.connection, plan.config.sink.connection)
        + ((plan.config.state.connection,) if plan.config.backfill is not None else ())
    )
    check_dsns(_connection_roles(plans))
    check_outputs_writable()
    exports = ExportWorker(export_budget(os.environ, _warn), _warn)
    take_over_library_output(exports)
    worst = EXIT_OK
    first_failed: tuple[RunOutcome, str] | None = None  # of several processes, the first failed
    outcome: RunOutcome | None = None
    stopped_between = True  # until the loop ran to its end
    for plan, selection in zip(plans, selections, strict=True):
        if STOP.requested:
            break
        full_refresh = plan.config.backfill is None
        ranges = {c.index: (c.start, c.end) for c in selection.chunks}
        progress = (
            NoProgressSink() if args.no_progress else choose_progress(ranges, sys.stderr, fmt)
        )
        observer = RunObserver()
        if metrics_requested(
            os.environ
        ):  # dpone.observability.metrics and its SDK only when asked for
            from dpone.observability.metrics import RunLabels, open_run_observer

            labels = RunLabels(
                workload=pack.workload.name,
                process=plan.name,
                mode=selection.mode,
                item=str(selection.item.item_index) if selection.item else "internal",
                dag_id=airflow.dag_id if airflow else None,
                task_id=airflow.task_id if airflow else None,
            )
            observer = open_run_observer(labels, os.environ, _warn, exports)
        settings = RunSettings(
            lock_timeout_s=args.lock_timeout,
            progress=progress,
            owner_prefix=owner_prefix(airflow),
            warn=_warn,
            observer=observer,
        )
        outcome = RunOutcome(
            workload=pack.workload.name,
            process=plan.name,
            run_key=plan.run_key,
            mode=selection.mode,
            pack_fingerprint=pack.fingerprint,
            mapping=selection.item.to_mapping_section() if selection.item else None,
            strategy="full_refresh" if full_refresh else "backfill",
            airflow=airflow_section(airflow),
        )
        owner = new_owner()
        run = run_full_refresh if full_refresh else run_backfill
        lineage = RunLineage()
        if lineage_requested(
            os.environ
        ):  # dpone.observability.lineage and its client only when asked for
            from dpone.observability.lineage import describe_run, open_run_lineage

            described = describe_run(pack, plan, selection, airflow, os.environ)
            lineage = open_run_lineage(described, os.environ, _warn, exports)
        refusal.SCOPE.entered = True  # from here on the run writes its own result
        observer.run_started(len(selection.chunks) if not full_refresh else 1)
        lineage.start()
        raised: DponeError | None = None
        try:
            with shared_sessions():  # one connection per database and use, not per connector
                run(RunContext(pack, plan, selection, settings), outcome)
        except DponeError as exc:
            if not STOP.requested:
                outcome.error = exc.records[0]
                raised = exc
            else:
                outcome.error = STOP.record(f"stopped while {exc.code} ({exc.message[:200]})")
        except BaseException:
            observer.run_finished()
            exports.drain()
            raise
        # The result first, then the exit-time exports (within a budget, waited for once, after
        # the last process: a later process's data never waits for this one's sends). From here
        # on the exit code is the result's: a stop during the exporters' wait only shortens it.
        try:
            _emit(outcome, owner)
            fault_point("result_written")
        except DponeError as exc:
            raised = exc  # the run ends with it, after its FAIL event and its final metrics
        observer.run_finished()
        if raised is not None:
            lineage.fail(f"{raised.code}: {raised.message}")
        elif outcome.status == "passed":
            lineage.complete(outcome.rows_written)
        else:
            assert outcome.error is not None
            lineage.fail(f"{outcome.error.code}: {outcome.error.message}")
        if raised is not None or plan is plans[-1]:
            exports.drain()  # then the summary and the error line, the last ones on stderr
        if raised is not None:
            raise raised
        if outcome.status == "passed":
            print(summary(outcome), file=sys.stderr)
            continue
        assert outcome.error is not None
        print(summary(outcome), file=sys.stderr)
        report_error(outcome.error)  # the dpone.error.v1 line stays the last line on stderr
        if outcome.cancelled:
            code = EXIT_CANCELLED
        elif outcome.error.code == errors.RUN_INTERRUPTED:
            code = STOP.exit_code  # 130 for SIGINT
        else:
            code = exit_code_for(outcome.error.code)
        worst = max(worst, code if code != EXIT_OK else EXIT_FAILED)
        first_failed = first_failed or (outcome, owner)
    else:
        stopped_between = False
    if stopped_between:
        # a process never started: the run was interrupted, whatever an earlier result said
        if outcome is None or outcome.error is None or outcome.error.code != errors.RUN_INTERRUPTED:
            record = STOP.record(f"{plan.name} and any later process not started")
            # the result says so too (as the exit code does), also over an earlier process's
            refusal.SCOPE.note(process=plan.name, run_key=plan.run_key)
            refusal.SCOPE.entered = False
            refusal.SCOPE.write(record)
            exports.drain()
            report_error(record)
        return STOP.exit_code
    if first_failed is not None and first_failed[0] is not outcome:
        # a later process passed after this one failed: the result file and the last line on
        # stderr are the failure's, as the exit code is (not the last process's "passed")
        failed, failed_owner = first_failed
        assert failed.error is not None
        _emit(failed, failed_owner)
        safe = ErrorRecord(
            failed.error.code, redact_text(failed.error.message), failed.error.location
        )
        print(error_json_line(safe), file=sys.stderr, flush=True)
    return worst
