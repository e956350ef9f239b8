"""A real Airflow deployment for one test: LocalExecutor on a Postgres metadata database of its own,
`airflow scheduler` plus, on 3.x, `airflow dag-processor` and `airflow api-server` (2.x: the
scheduler parses the DAGs itself and `airflow webserver` serves the REST API).

Everything runs from the cached Airflow venv (scripts/airflow_envs.py); the processes are started
in their own sessions and stopped by their process ids when the test ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/pg.py
import e2ekit


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _clean_environ() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "DPONE_"))
    }


@dataclass
class Deployment:
    version: str
    python: str
    home: Path
    meta_dsn: str
    extra_env: dict[str, str]
    port: int = field(default_factory=free_port)
    processes: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def airflow(self) -> str:
        return str(Path(self.python).with_name("airflow"))

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/{'v2' if self.major >= 3 else 'v1'}"

    def env(self) -> dict[str, str]:
        url = e2ekit.as_url(self.meta_dsn).replace("postgresql://", "postgresql+psycopg2://")
        env = {
            **_clean_environ(),
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "16",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW__SCHEDULER__DAG_DIR_LIST_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "10",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
            **self.extra_env,
        }
        if self.major >= 3:
            base = f"http://127.0.0.1:{self.port}"
            env.update(
                {
                    "AIRFLOW__API__BASE_URL": base,
                    "AIRFLOW__API__PORT": str(self.port),
                    "AIRFLOW__API__HOST": "127.0.0.1",
                    "AIRFLOW__API__WORKERS": "1",
                    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
                    "AIRFLOW__API_AUTH__JWT_SECRET": "dpone-scheduler-test-only",
                    "AIRFLOW__API__SECRET_KEY": "dpone-scheduler-test-only",
                    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                }
            )
        else:
            env.update(
                {
                    "AIRFLOW__WEBSERVER__WEB_SERVER_PORT": str(self.port),
                    "AIRFLOW__WEBSERVER__WEB_SERVER_HOST": "127.0.0.1",
                    "AIRFLOW__WEBSERVER__WORKERS": "1",
                    "AIRFLOW__WEBSERVER__SECRET_KEY": "dpone-scheduler-test-only",
                    "AIRFLOW__API__AUTH_BACKENDS": "airflow.api.auth.backend.default",
                }
            )
        return env

    def cli(self, *args: str, timeout: int = 300) -> str:
        done = subprocess.run(
            [self.airflow, *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=self.home,
        )
        if done.returncode != 0:
            raise AssertionError(
                f"airflow {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return done.stdout

    def start(self) -> None:
        if self.major < 3:  # the 2.x REST API: anonymous requests act as Admin (test only)
            (self.home / "webserver_config.py").write_text(
                'AUTH_ROLE_PUBLIC = "Admin"\nWTF_CSRF_ENABLED = False\n', encoding="utf-8"
            )
        commands = [["scheduler"]]
        if self.major >= 3:
            commands += [["dag-processor"], ["api-server", "--port", str(self.port)]]
        else:
            commands += [["webserver", "--port", str(self.port)]]
        for argv in commands:
            with open(self.home / f"{argv[0]}.log", "wb") as log:  # the child keeps its copy
                proc = subprocess.Popen(
                    [self.airflow, *argv],
                    env=self.env(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=self.home,
                    start_new_session=True,
                )
            self.processes.append((argv[0], proc))

    def stop(self) -> None:
        for _, proc in self.processes:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for _, proc in self.processes:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)

    def logs_tail(self) -> str:
        parts = []
        for name, _ in self.processes:
            path = self.home / f"{name}.log"
            if path.exists():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def rest(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.api + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise AssertionError(
                f"{method} {path}: HTTP {exc.code}: {exc.read()[:2000]!r}"
            ) from exc

    def clear_map_index(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> str:
        """Clear exactly one mapped task instance the way a user does; returns how.

        3.x: the REST API's clearTaskInstances with a ``[task_id, map_index]`` pair. 2.x's REST
        API takes task ids only (every map index of a task), so there it is the webserver's
        ``/clear`` endpoint with ``map_index``, which the Grid's Clear button of a mapped
        instance posts."""
        if self.major >= 3:
            body = {
                "dry_run": False,
                "dag_run_id": run_id,
                "task_ids": [[task_id, map_index]],
                "only_failed": False,
                "reset_dag_runs": True,
            }
            self.rest("POST", f"/dags/{dag_id}/clearTaskInstances", body)
            return "REST API POST /api/v2/dags/{dag_id}/clearTaskInstances [task_id, map_index]"
        with psycopg.connect(self.meta_dsn) as conn:
            row = conn.execute(
                "SELECT execution_date FROM dag_run WHERE dag_id = %s AND run_id = %s",
                (dag_id, run_id),
            ).fetchone()
        assert row is not None
        form = urllib.parse.urlencode(
            {
                "dag_id": dag_id,
                "task_id": task_id,
                "map_index": str(map_index),
                "execution_date": row[0].isoformat(),
                "confirmed": "true",
            }
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/clear",
            data=form,
            method="POST",
            headers={"Accept": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200, response.read()[:2000]
        return "webserver POST /clear with map_index (the Grid's Clear of a mapped instance)"

    def wait_for(self, what: str, probe: Any, timeout: float) -> Any:
        """Poll ``probe()`` until it returns a truthy value; fail with the logs after ``timeout``."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            for name, proc in self.processes:
                if proc.poll() is not None:
                    raise AssertionError(f"airflow {name} exited:\n{self.logs_tail()}")
            try:
                last = probe()
            except (AssertionError, OSError) as exc:
                last = exc
            else:
                if last:
                    return last
            time.sleep(1)
        raise AssertionError(f"timed out waiting for {what} (last: {last!r}):\n{self.logs_tail()}")

    def task_instances(self, dag_id: str, run_id: str) -> dict[int, dict[str, Any]]:
        """map index -> state, try_number of the mapped instances, from the metadata database."""
        with psycopg.connect(self.meta_dsn) as conn:
            rows = conn.execute(
                "SELECT map_index, state, try_number FROM task_instance "
                "WHERE dag_id = %s AND run_id = %s AND map_index >= 0",
                (dag_id, run_id),
            ).fetchall()
        return {int(i): {"state": s, "try_number": int(t)} for i, s, t in rows}

    def xcom_results(self, dag_id: str, run_id: str, task_id: str) -> dict[int, Any]:
        """map index -> the task's return_value XCom (the dpone run result), from the metadata
        database (2.x keeps the JSON as bytes, 3.x in a JSON column)."""
        with psycopg.connect(self.meta_dsn) as conn:
            rows = conn.execute(
                "SELECT map_index, value FROM xcom WHERE dag_id = %s AND run_id = %s "
                "AND task_id = %s AND key = 'return_value'",
                (dag_id, run_id, task_id),
            ).fetchall()
        out: dict[int, Any] = {}
        for index, stored in rows:
            value = stored
            while isinstance(value, (bytes, memoryview, str)):
                value = json.loads(bytes(value) if not isinstance(value, str) else value)
            out[int(index)] = value
        return out

    def task_logs(self) -> dict[str, str]:
        """Every task log file under AIRFLOW_HOME/logs (path relative to it -> text)."""
        root = self.home / "logs"
        return {
            str(path.relative_to(root)): path.read_text(errors="replace")
            for path in sorted(root.rglob("*"))
            if path.is_file() and "map_index=" in str(path)
        }

    def dag_run_state(self, dag_id: str, run_id: str) -> str | None:
        with psycopg.connect(self.meta_dsn) as conn:
            row = conn.execute(
                "SELECT state FROM dag_run WHERE dag_id = %s AND run_id = %s", (dag_id, run_id)
            ).fetchone()
        return None if row is None else str(row[0])


@contextlib.contextmanager
def running(deployment: Deployment) -> Iterator[Deployment]:
    deployment.start()
    try:
        yield deployment
    finally:
        deployment.stop()


def attempt_intervals(
    dsn: str, run_key: str, items: list[Any]
) -> dict[str, tuple[int, float, float]]:
    """lease owner -> (item index, first lease taken, last chunk completed), from the ledger's
    transitions as epoch seconds of the database clock (one clock for every process).

    Every try of a mapped task is one `dpone run` process with its own lease owner, so an owner's
    span is the time that try held chunks (a retried item has one span per try, and the wait for a
    retry, when it holds no pool slot, is in none)."""
    owner_item: dict[int, int] = {}
    for item in items:
        for index in range(item.first_chunk_index, item.last_chunk_index + 1):
            owner_item[index] = item.item_index
    spans: dict[str, tuple[int, list[float]]] = {}
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f"SELECT chunk_index, lease_owner, extract(epoch FROM recorded_at)::float8 "
            f"FROM {e2ekit.AUDIT}.chunk_transition WHERE run_key = %s AND lease_owner IS NOT NULL "
            f"AND lease_owner NOT LIKE 'dpone-test-holder%%' ORDER BY seq",
            (run_key,),
        ).fetchall()
    for index, owner, at in rows:
        item, times = spans.setdefault(str(owner), (owner_item[int(index)], []))
        assert owner_item[int(index)] == item, f"owner {owner} leased chunks of two items"
        times.append(float(at))
    return {owner: (item, min(times), max(times)) for owner, (item, times) in spans.items()}


def lease_owners(dsn: str, run_key: str) -> dict[int, list[tuple[str, int, str | None]]]:
    """chunk index -> [(state, attempt, lease owner)] of every transition, in order."""
    out: dict[int, list[tuple[str, int, str | None]]] = {}
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f"SELECT chunk_index, state, attempt, lease_owner FROM {e2ekit.AUDIT}.chunk_transition "
            "WHERE run_key = %s ORDER BY chunk_index, transition",
            (run_key,),
        ).fetchall()
    for index, state, attempt, owner in rows:
        out.setdefault(int(index), []).append((str(state), int(attempt), owner))
    return out


def ledger_rows_text(dsn: str) -> str:
    """Every row of every table of the ledger's schema, as text (for the secret scan)."""
    parts: list[str] = []
    with psycopg.connect(dsn) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (e2ekit.AUDIT,),
        ).fetchall()
        for (table,) in tables:
            rows = conn.execute(f"SELECT t::text FROM {e2ekit.AUDIT}.{table} AS t").fetchall()
            parts.extend(str(row[0]) for row in rows)
    assert tables, "no ledger tables"
    return "\n".join(parts)


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end before a start at the same time)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running_now = peak = 0
    for _, step in events:
        running_now += step
        peak = max(peak, running_now)
    return peak
