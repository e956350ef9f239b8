#!/usr/bin/env python3
"""Print JSON facts about dpone DAG files as one real Airflow version sees them.

Runs INSIDE an Airflow virtual environment (see scripts/airflow_envs.py)::

    <airflow-venv>/bin/python tests/airflow/harness/inspect_dag.py DAG.py [DAG2.py ...]
        [--out facts.json] [--indexes 0,2] [--probe-raw[=a.py,b.py]] [--outcome]

Everything happens in a throwaway AIRFLOW_HOME (sqlite, no examples, unit-test mode), without a
cluster and without a metadata database. Per file:

* ``io_guard``: the DAG file's code is compiled and executed once under an audit hook
  (``sys.addaudithook``) that is active only during that exec. Everything the file imports is imported
  BEFORE the guard goes up. Rule: any file/socket/process/environment access whose first non-stdlib
  caller frame is the DAG file itself is a violation. Library code (Airflow, the provider) may READ
  files below the interpreter's prefixes (lazy imports of installed modules, package metadata, tz data)
  during DAG construction: those are listed under ``allowed``, never failed. Any other library I/O
  (writes, files elsewhere, sockets, processes, sqlite) is a violation too.
* ``import_errors`` of a DagBag over a temp folder holding a copy of the file.
* per DAG and task: type, mapping facts, pool, max_active_tis_per_dag, wiring, map_index_template;
  the same after a SerializedDAG round trip; and for every map index (or ``--indexes``) the env of a
  concrete pod (KubernetesPodOperator: ``unmap`` + ``render_template_fields`` +
  ``build_pod_request_obj``) or the rendered ``env_vars`` (subprocess flavour); hooks and plain tasks too.
* ``--outcome``: the runtime operator's result validation, exercised on this version's class
  hierarchy (KPO: the provider's pod launch is stubbed, the override methods are the real ones).
* ``--probe-raw``: what the pod / process of a mapped task receives for every value of
  hostile_values' corpora, and (control) what the same operator would receive with ``env_vars``
  rendered by Jinja (mapped tasks of every file, or of the listed file names).
"""

from __future__ import annotations

import argparse
import ast
import collections.abc
import contextlib
import copy
import importlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
import traceback
import types
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
T0 = time.monotonic()


# ----------------------------------------------------------------------------------------------
# environment (before Airflow is imported)


def setup_airflow_home() -> str:
    home = tempfile.mkdtemp(prefix="dpone-af-inspect-")
    dags = os.path.join(home, "dags")
    os.makedirs(dags)
    kubeconfig = os.path.join(home, "kubeconfig")
    with open(kubeconfig, "w") as fh:
        fh.write(DUMMY_KUBECONFIG)
    os.environ.update(
        AIRFLOW_HOME=home,
        AIRFLOW__CORE__DAGS_FOLDER=dags,
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__UNIT_TEST_MODE="True",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
        AIRFLOW__LOGGING__LOGGING_LEVEL="WARNING",
        # the KPO hook looks its connection up: answer from the environment, never the DB
        AIRFLOW_CONN_KUBERNETES_DEFAULT='{"conn_type": "kubernetes"}',
        KUBECONFIG=kubeconfig,
    )
    return home


DUMMY_KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- name: dummy
  cluster: {server: "https://127.0.0.1:9"}
contexts:
- name: dummy
  context: {cluster: dummy, user: dummy, namespace: dpone}
current-context: dummy
users:
- name: dummy
  user: {token: dummy}
"""


# ----------------------------------------------------------------------------------------------
# I/O guard

_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])
_ALLOWED_READ_ROOTS = tuple(
    sorted({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
)
_WATCHED_PREFIXES = (
    "socket.",
    "subprocess.",
    "os.exec",
    "os.spawn",
    "os.posix_spawn",
    "os.system",
    "os.fork",
    "os.kill",
    "urllib.",
    "http.client.",
    "ftplib.",
    "smtplib.",
    "sqlite3.",
    "shutil.",
    "tempfile.",
    "glob.",
    "pathlib.",
    "webbrowser.",
)
_WATCHED = {
    "open",
    "os.listdir",
    "os.scandir",
    "os.mkdir",
    "os.remove",
    "os.rmdir",
    "os.rename",
    "os.truncate",
    "os.chmod",
    "os.chown",
    "os.link",
    "os.symlink",
    "os.utime",
    "os.chdir",
    "os.putenv",
    "os.unsetenv",
    "ctypes.dlopen",
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class IOGuard:
    """One audit hook for the process; it records only while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.dag_path = ""
        self.violations: list[dict] = []
        self.allowed: list[dict] = []
        self._roots_key: tuple = ()
        self._roots: tuple = _ALLOWED_READ_ROOTS
        self._busy = False
        sys.addaudithook(self._hook)

    @contextlib.contextmanager
    def watching(self, dag_path: str):
        self.dag_path = os.path.realpath(dag_path)
        self.violations, self.allowed = [], []
        real_environ = os.environ
        # B003: swapping the mapping object on purpose, restored below
        os.environ = _TrackedEnviron(real_environ, self)  # type: ignore[assignment]  # noqa: B003
        self.active = True
        try:
            yield self
        finally:
            self.active = False
            os.environ = real_environ  # noqa: B003

    def _origin(self) -> tuple[str, bool]:
        """(first caller file outside the stdlib and this harness, whether a module is being
        imported somewhere on the stack, i.e. the event is a side effect of a (lazy) import)."""
        frame = sys._getframe(2)
        importing = False
        origin = None
        while frame is not None:
            fn = frame.f_code.co_filename
            if fn.startswith("<frozen importlib"):
                importing = True
            elif origin is None and not (
                fn.startswith("<")
                or fn == __file__
                or os.path.realpath(fn).startswith(_STDLIB + os.sep)
            ):
                origin = fn
            frame = frame.f_back
        return origin or "?", importing

    def _hook(self, event: str, args: tuple) -> None:
        if not self.active or self._busy:
            return
        if event not in _WATCHED and not event.startswith(_WATCHED_PREFIXES):
            return
        self._busy = True
        try:
            origin, importing = self._origin()
            self.record(event, args, origin, importing)
        finally:
            self._busy = False

    def record(self, event: str, args: tuple, origin: str, importing: bool) -> None:
        from_dag = os.path.realpath(origin) == self.dag_path
        entry = {
            "event": event,
            "args": _short(args),
            "origin": "dag" if from_dag else origin,
            "via_import": importing,
        }
        if from_dag:
            self.violations.append(entry)
        elif self._is_installed_read(event, args):
            entry["why"] = "library reads an installed file / import path entry"
            self.allowed.append(entry)
        elif importing:
            entry["why"] = "side effect of a library module's first import"
            self.allowed.append(entry)
        else:
            self.violations.append(entry)

    def _is_installed_read(self, event: str, args: tuple) -> bool:
        if event == "open":
            path, mode, flags = [*args, None, None, None][:3]
            if isinstance(path, int):
                return False
            if isinstance(mode, str) and any(c in mode for c in "wax+"):
                return False
            if isinstance(flags, int) and flags & _WRITE_FLAGS:
                return False
        elif event in ("os.listdir", "os.scandir"):
            path = args[0] if args else None
        else:
            return False
        if path is None:
            return False
        path = os.path.realpath(os.fsdecode(path))
        roots = self._read_roots()
        return path.startswith(roots) or path + os.sep in roots

    def _read_roots(self) -> tuple:
        """Interpreter prefixes + the import path as it stands now (Airflow 2 appends
        $AIRFLOW_HOME/config and /plugins while a DAG is built), never the DAG file's folder."""
        key = tuple(sys.path)
        if key != self._roots_key:
            dag_dir = os.path.dirname(self.dag_path) + os.sep
            extra = {os.path.realpath(p) + os.sep for p in sys.path if p}
            extra.discard(dag_dir)
            self._roots = _ALLOWED_READ_ROOTS + tuple(sorted(extra))
            self._roots_key = key
        return self._roots


class _TrackedEnviron(collections.abc.MutableMapping):
    """os.environ stand-in while the guard is up: the DAG's own code must not read the environment."""

    def __init__(self, real, guard: IOGuard) -> None:
        self._real = real
        self._guard = guard

    def _note(self, key, event="os.environ") -> None:
        if self._guard.active and not self._guard._busy:
            self._guard._busy = True
            try:
                origin, importing = self._guard._origin()
                if os.path.realpath(origin) == self._guard.dag_path:
                    self._guard.record(event, (key,), origin, importing)
            finally:
                self._guard._busy = False

    def __getitem__(self, key):
        self._note(key)
        return self._real[key]

    def __setitem__(self, key, value):
        self._note(key, "os.environ.set")
        self._real[key] = value

    def __delitem__(self, key):
        self._note(key, "os.environ.del")
        del self._real[key]

    def __iter__(self):
        self._note("*")
        return iter(self._real)

    def __len__(self):
        return len(self._real)

    def copy(self):
        self._note("*")
        return dict(self._real)

    def __getattr__(self, name):  # encodekey, decodevalue, ... of os._Environ
        return getattr(self._real, name)


def _short(args: tuple) -> list:
    out = []
    for a in args[:3]:
        s = os.fsdecode(a) if isinstance(a, (str, bytes)) else repr(a)
        out.append(s if len(s) <= 200 else s[:200] + "...")
    return out


GUARD = IOGuard()


# ----------------------------------------------------------------------------------------------
# helpers


def top_level_imports(tree: ast.AST) -> list[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return sorted(names)


def preimport(modules: list[str]) -> dict[str, str]:
    """Import everything the DAG imports (submodule-or-attribute names may fail: fine)."""
    failed = {}
    for name in modules:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                importlib.import_module(name)
            except ImportError as exc:
                failed[name] = f"{type(exc).__name__}: {exc}"
            except Exception as exc:
                failed[name] = f"{type(exc).__name__}: {exc}"
    return failed


def guarded_exec(path: str, index: int) -> dict:
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    tree = ast.parse(source, path)
    imports = top_level_imports(tree)
    failed = preimport(imports)
    code = compile(tree, path, "exec")
    module = types.ModuleType(f"dpone_inspected_dag_{index}")
    module.__file__ = path
    sys.modules[module.__name__] = module
    error = None
    caught: list[str] = []
    t = time.monotonic()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with GUARD.watching(path):
            try:
                exec(code, module.__dict__)
            except BaseException as exc:
                error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    for w in rec:
        caught.append(
            f"{w.category.__name__}: {w.message} ({os.path.basename(w.filename)}:{w.lineno})"
        )
    return {
        "imports": imports,
        "unimportable_names": sorted(failed),
        "exec_error": error,
        "exec_ms": round((time.monotonic() - t) * 1000, 2),
        "violations": GUARD.violations,
        "allowed_count": len(GUARD.allowed),
        "allowed_sample": GUARD.allowed[:20],
        "warnings": caught,
    }


def make_dagbag(folder: str):
    try:
        from airflow.dag_processing.dagbag import DagBag  # 3.1+
    except ImportError:
        from airflow.models.dagbag import DagBag
    import inspect

    params = inspect.signature(DagBag.__init__).parameters
    kwargs = {"dag_folder": folder}
    if "include_examples" in params:
        kwargs["include_examples"] = False
    if "read_dags_from_db" in params:
        kwargs["read_dags_from_db"] = False
    if "safe_mode" in params:
        kwargs["safe_mode"] = True
    return DagBag(**kwargs)


def is_mapped(task) -> bool:
    return type(task).__name__ == "MappedOperator" or hasattr(task, "expand_input")


def expand_values(task):
    value = task.expand_input.value
    return value["env_vars"] if isinstance(value, dict) else None


def map_index_template(task):
    tmpl = getattr(task, "map_index_template", None)
    if tmpl is None and hasattr(task, "partial_kwargs"):
        tmpl = task.partial_kwargs.get("map_index_template")
    return tmpl


def task_summary(task) -> dict:
    mapped = is_mapped(task)
    out = {
        "task_type": task.task_type,
        "is_mapped": mapped,
        "pool": task.pool,
        "max_active_tis_per_dag": task.max_active_tis_per_dag,
        "upstream": sorted(task.upstream_task_ids),
        "downstream": sorted(task.downstream_task_ids),
        "map_index_template": map_index_template(task),
    }
    if mapped:
        values = expand_values(task)
        out["expand_keys"] = (
            sorted(task.expand_input.value) if isinstance(task.expand_input.value, dict) else None
        )
        out["expand_length"] = len(values) if values is not None else None
    return out


def serialized_round_trip(dag) -> dict:
    import airflow.serialization.serialized_objects as so

    # DagSerialization on 3.2+, SerializedDAG before
    ser = getattr(so, "DagSerialization", None) or so.SerializedDAG
    data = json.loads(json.dumps(ser.to_dict(dag)))  # through real JSON, as the DB stores it
    sdag = ser.from_dict(data)
    return {tid: task_summary(t) for tid, t in sorted(sdag.task_dict.items())}


def render(op) -> None:
    op.render_template_fields(context={})


def kpo_pod_facts(op) -> dict:
    import inspect

    render(op)
    kwargs = {}
    if "dry_run" in inspect.signature(op.build_pod_request_obj).parameters:
        kwargs["dry_run"] = True
    pod = op.build_pod_request_obj(**kwargs)
    container = pod.spec.containers[0]
    env, secrets = {}, {}
    for var in container.env or []:
        if var.value_from is not None:
            ref = var.value_from.secret_key_ref
            secrets[var.name] = {"secret": ref.name, "key": ref.key} if ref else "value_from"
        else:
            env[var.name] = var.value
    return {
        "kind": "pod",
        "env": env,
        "env_order": [var.name for var in container.env or []],
        "secrets": secrets,
        "cmds": container.command,
        "args": container.args,
        "image": container.image,
        "namespace": pod.metadata.namespace,
        "containers": [c.name for c in pod.spec.containers],
    }


def subprocess_facts(op) -> dict:
    render(op)
    return {"kind": "process", "env": dict(op.env_vars), "command": list(op.command)}


def is_kpo(op) -> bool:
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    return isinstance(op, KubernetesPodOperator)


def concrete_facts(op) -> dict:
    try:
        return kpo_pod_facts(op) if is_kpo(op) else subprocess_facts(op)
    except Exception as exc:
        return {"error": "".join(traceback.format_exception_only(type(exc), exc)).strip()}


def unmapped(task, k: int):
    return task.unmap({"env_vars": expand_values(task)[k]})


def concrete_tasks(task, indexes):
    if is_mapped(task):
        n = len(expand_values(task))
        for k in indexes if indexes is not None else range(n):
            if k < n:
                yield str(k), unmapped(task, k)
    else:
        yield "-", copy.deepcopy(task)


# ----------------------------------------------------------------------------------------------
# outcome validation (runtime operator classes)

PASSED = {"schema": "dpone.run-result.v1", "status": "passed", "error": None, "chunks": 10}
FAILED = {
    "schema": "dpone.run-result.v1",
    "status": "failed",
    "error": {
        "code": "DPONE_BACKFILL_CHUNK_LEASE_LOST",
        "message": "lease lost on chunk 12",
        "retryable": True,
    },
}
FAILED_FINAL = {
    "schema": "dpone.run-result.v1",
    "status": "failed",
    "error": {
        "code": "DPONE_PACK_MISMATCH",
        "message": "the image's pack differs from the DAG's",
        "retryable": False,
    },
}


def _outcome(fn) -> dict:
    try:
        value = fn()
        return {"returned": value}
    except BaseException as exc:
        return {
            "raised": type(exc).__name__,
            "message": str(exc)[:400],
            "is_airflow_exception": _is_airflow_exc(exc),
            "is_fail_exception": _is_fail_exc(exc),
        }


def _is_airflow_exc(exc) -> bool:
    from airflow.exceptions import AirflowException

    return isinstance(exc, AirflowException)


def _is_fail_exc(exc) -> bool:
    """AirflowFailException (2.x) or its Task SDK twin (3.x): the task fails without retries."""
    return any(cls.__name__ == "AirflowFailException" for cls in type(exc).__mro__)


def kpo_outcome_checks(task) -> dict:
    """Drive the subclass's execute / trigger_reentry with the provider's pod launch stubbed."""
    import inspect
    from unittest import mock

    from airflow.exceptions import AirflowException
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator as KPO

    facts: dict = {
        "defers_to": [
            m for m in ("trigger_reentry", "execute_complete") if f'"{m}"' in inspect.getsource(KPO)
        ],
        "kpo_has_execute_complete": hasattr(KPO, "execute_complete"),
    }
    cls = type(unmapped(task, 0)) if is_mapped(task) else type(task)
    facts["overrides"] = sorted(
        name
        for name in ("execute", "trigger_reentry", "execute_complete", "extract_xcom")
        if name in cls.__dict__
    )

    def op_for():
        return unmapped(task, 0) if is_mapped(task) else copy.deepcopy(task)

    def sync(result, pod_fails=False):
        def fake_execute_sync(self, context):
            r = self.extract_xcom(pod=None)
            if pod_fails:
                raise AirflowException("Pod dpone-run-x returned a failure.")
            return r

        op = op_for()
        render(op)
        op.deferrable = False
        ctx: dict = {}
        with (
            mock.patch.object(KPO, "execute_sync", fake_execute_sync),
            mock.patch.object(KPO, "extract_xcom", lambda self, pod, **kw: copy.deepcopy(result)),
        ):
            out = _outcome(lambda: op.execute(ctx))
        out["label"] = ctx.get("dpone_item_label")
        return out

    def deferred(result, returns_xcom, status="success"):
        def fake_reentry(self, context, event):
            r = self.extract_xcom(pod=None)
            if event["status"] != "success":
                raise AirflowException(event["message"])
            return r if returns_xcom else None  # 10.10.0 returns None here

        op = op_for()
        render(op)
        ctx: dict = {}
        event = {"status": status, "name": "p", "namespace": "dpone", "message": "Container failed"}
        with (
            mock.patch.object(KPO, "trigger_reentry", fake_reentry),
            mock.patch.object(KPO, "extract_xcom", lambda self, pod, **kw: copy.deepcopy(result)),
        ):
            out = _outcome(lambda: op.trigger_reentry(ctx, event))
        out["label"] = ctx.get("dpone_item_label")
        return out

    facts["sync_passed"] = sync(PASSED)
    facts["sync_failed"] = sync(FAILED)
    facts["sync_no_result"] = sync(None)
    facts["sync_pod_failed_with_result"] = sync(FAILED, pod_fails=True)
    facts["deferred_passed_returns_none"] = deferred(PASSED, returns_xcom=False)
    facts["deferred_passed_returns_xcom"] = deferred(PASSED, returns_xcom=True)
    facts["deferred_failed"] = deferred(FAILED, returns_xcom=True)
    facts["deferred_pod_failed_with_result"] = deferred(FAILED, returns_xcom=True, status="failed")
    facts["sync_failed_final"] = sync(FAILED_FINAL)
    facts["sync_pod_failed_final"] = sync(FAILED_FINAL, pod_fails=True)
    facts["deferred_failed_final"] = deferred(FAILED_FINAL, returns_xcom=True)
    facts["deferred_pod_failed_final"] = deferred(FAILED_FINAL, returns_xcom=False, status="failed")
    return facts


SCRIPT = (
    "import json, os, sys; mode = sys.argv[1]; print('dpone stub', mode); "
    "p = os.environ.get('DPONE_XCOM_PATH'); "
    "r = {'schema': 'dpone.run-result.v1', 'status': 'passed' if mode == 'pass' else 'failed', "
    "'error': None if mode == 'pass' else {'code': 'DPONE_STUB', 'message': 'stub failed', "
    "'retryable': mode != 'final'}}; "
    "(mode != 'none' and p) and open(p, 'w').write(json.dumps(r)); "
    "sys.exit(3 if mode == 'exit' else 0)"
)


def subprocess_outcome_checks(task) -> dict:
    def run(mode, validate=True):
        op = unmapped(task, 0) if is_mapped(task) else copy.deepcopy(task)
        render(op)
        op.command = [sys.executable, "-c", SCRIPT, mode]
        op.validate_result = validate
        ctx: dict = {}
        out = _outcome(lambda: op.execute(ctx))
        out["label"] = ctx.get("dpone_item_label")
        return out

    return {
        "passed": run("pass"),
        "failed": run("fail"),
        "failed_final": run("final"),
        "no_result": run("none"),
        "nonzero_exit": run("exit"),
        "hook_ok": run("none", validate=False),
        "hook_nonzero_exit": run("exit", validate=False),
    }


# ----------------------------------------------------------------------------------------------
# raw rendering probe


@contextlib.contextmanager
def quiet_output():
    """Airflow logs every failed rendering with a traceback (to stdout on 2.x, stderr on 3.x):
    keep the probe quiet at the file-descriptor level."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in saved:
        os.dup2(devnull, fd)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy_fd in saved.items():
            os.dup2(copy_fd, fd)
            os.close(copy_fd)
        os.close(devnull)


def probe_raw(task) -> dict:
    with quiet_output():
        return _probe_raw(task)


def _probe_raw(task) -> dict:
    sys.path.insert(0, HERE)
    from hostile_values import HOSTILE_CORPUS, PLAIN_CORPUS

    values = dict(HOSTILE_CORPUS)
    values.update({f"PLAIN_{i:02d}": v for i, v in enumerate(PLAIN_CORPUS)})
    out = {}
    for name, value in values.items():
        facts = {}
        for variant in ("dpone", "control"):
            op = task.unmap({"env_vars": {name: value}})
            if variant == "control":
                op.template_fields = ("env_vars",)  # what a rendering operator would do
            got = concrete_facts(op)
            if "error" in got:
                facts[variant] = {"unchanged": False, "error": got["error"][:300]}
            else:
                seen = got["env"].get(name)
                facts[variant] = {
                    "unchanged": seen == value,
                    "rendered": None if seen == value else seen,
                }
        out[name] = facts
    return out


# ----------------------------------------------------------------------------------------------


def inspect_file(path: str, index: int, args, dags_root: str) -> dict:
    t = time.monotonic()
    facts: dict = {"path": path}
    facts["io_guard"] = guarded_exec(path, index)

    folder = os.path.join(dags_root, f"f{index}")
    os.makedirs(folder)
    shutil.copy(path, os.path.join(folder, os.path.basename(path)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bag = make_dagbag(folder)
    facts["import_errors"] = {os.path.basename(k): v for k, v in bag.import_errors.items()}
    facts["dags"] = {}
    indexes = [int(i) for i in args.indexes.split(",")] if args.indexes else None
    for dag_id, dag in sorted(bag.dags.items()):
        dfacts: dict = {
            "fileloc": os.path.basename(dag.fileloc),
            "tags": sorted(dag.tags or []),
            "tasks": {tid: task_summary(tk) for tid, tk in sorted(dag.task_dict.items())},
        }
        try:
            dfacts["serialized"] = serialized_round_trip(dag)
        except Exception as exc:
            dfacts["serialized_error"] = "".join(traceback.format_exception(exc))[-2000:]
        for tid, task in sorted(dag.task_dict.items()):
            dfacts["tasks"][tid]["concrete"] = {
                k: concrete_facts(op) for k, op in concrete_tasks(task, indexes)
            }
            if args.outcome and task.task_type.startswith("DponeRuntime"):
                if not is_mapped(task) and not getattr(task, "validate_result", True):
                    continue  # a hook of the subprocess flavour
                try:
                    checks = (
                        kpo_outcome_checks(task)
                        if task.task_type == "DponeRuntimeOperator"
                        else subprocess_outcome_checks(task)
                    )
                except Exception as exc:
                    checks = {"error": "".join(traceback.format_exception(exc))[-2000:]}
                dfacts["tasks"][tid]["outcome_checks"] = checks
            probe = args.probe_raw == "*" or os.path.basename(path) in (args.probe_raw or "").split(
                ","
            )
            if probe and is_mapped(task):
                dfacts["tasks"][tid]["raw_probe"] = probe_raw(task)
        facts["dags"][dag_id] = dfacts
    facts["seconds"] = round(time.monotonic() - t, 3)
    return facts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dag_files", nargs="+")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    ap.add_argument("--indexes", help="comma-separated map indexes (default: all)")
    ap.add_argument("--probe-raw", nargs="?", const="*", metavar="FILE,...")
    ap.add_argument("--outcome", action="store_true")
    args = ap.parse_args(argv)

    home = setup_airflow_home()
    try:
        t = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from importlib import metadata

            import airflow
            import airflow.providers.cncf.kubernetes.operators.pod
        import_s = time.monotonic() - t
        result = {
            "airflow_version": airflow.__version__,
            "provider_version": metadata.version("apache-airflow-providers-cncf-kubernetes"),
            "python": sys.version.split()[0],
            "airflow_import_seconds": round(import_s, 3),
            "files": {},
        }
        dags_root = os.path.join(home, "bags")
        os.makedirs(dags_root)
        for i, path in enumerate(args.dag_files):
            result["files"][os.path.basename(path)] = inspect_file(
                os.path.abspath(path), i, args, dags_root
            )
        result["total_seconds"] = round(time.monotonic() - T0, 3)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    text = json.dumps(result, indent=1, sort_keys=True, ensure_ascii=False, default=repr)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
