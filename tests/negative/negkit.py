"""Helpers of the negative suite: a small project written per test, the CLI in-process, and a
private Postgres database (so these tests never touch other suites' tables)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from dpone import errors
from dpone.cli import main as dpone_main
from dpone.packing.pack import ProcessPlan, load_and_compile
from dpone.packing.verify import expected_identity
from psycopg import sql
from ruamel.yaml import YAML

DATABASE = "dpone_negative"
CONN = "neg"
ENV_ITEM = "DPONE_AIRFLOW_MAPPING_ITEM"
ENV_IDENTITY = "DPONE_AIRFLOW_RUN_IDENTITY"

CATALOG: dict[str, Any] = {
    "schema": "dpone.workload-catalog.v1",
    "workloads": {
        "neg": {
            "manifest": "neg.yaml",
            "airflow": {
                "flavour": "subprocess",
                "mapping": {"mode": "summary", "max_items": 4, "max_active": 2, "pool": "neg_pool"},
            },
        }
    },
}
MANIFEST: dict[str, Any] = {
    "schema": "dpone.pipeline.v1",
    "name": "neg",
    "processes": [
        {
            "name": "copy",
            "source": {"connection": CONN, "table": {"schema": "neg", "name": "src"}},
            "sink": {
                "connection": CONN,
                "table": {"schema": "neg", "name": "dst"},
                "keys": ["id"],
                "strategy": {"mode": "backfill"},
            },
            "backfill": {
                "chunk": {
                    "column": "d",
                    "type": "date",
                    "start": "2023-01-01",
                    "end": "2023-01-13",
                    "step": 1,
                    "unit": "day",
                },
                "inner_mode": "replace",
                "parallel_workers": 1,
                "lease_seconds": 5,
            },
            "state": {
                "backend": "audit_schema",
                "connection": CONN,
                "schema": "neg_audit",
                "require_distributed_lock": True,
            },
        }
    ],
}


def dump(data: Any, path: Path) -> None:
    yaml = YAML(typ="safe")
    yaml.default_flow_style = False
    with path.open("w", encoding="utf-8") as handle:
        yaml.dump(data, handle)


@dataclass
class Project:
    """A catalog + manifest pair on disk, editable as dicts."""

    folder: Path
    catalog: dict[str, Any]
    manifest: dict[str, Any]

    @classmethod
    def create(cls, folder: Path) -> Project:
        folder.mkdir(parents=True, exist_ok=True)
        project = cls(folder, copy.deepcopy(CATALOG), copy.deepcopy(MANIFEST))
        project.write()
        return project

    @property
    def catalog_path(self) -> Path:
        return self.folder / "workloads.yaml"

    @property
    def process(self) -> dict[str, Any]:
        proc: dict[str, Any] = self.manifest["processes"][0]
        return proc

    @property
    def airflow(self) -> dict[str, Any]:
        af: dict[str, Any] = self.catalog["workloads"]["neg"]["airflow"]
        return af

    def write(self) -> None:
        dump(self.catalog, self.catalog_path)
        dump(self.manifest, self.folder / "neg.yaml")

    def plan(self) -> ProcessPlan:
        _, packs, problems = load_and_compile(str(self.catalog_path))
        assert not problems, problems
        return packs[0].processes[0]

    def identity_env(self) -> dict[str, str | None]:
        """The run identity the generated DAG passes beside every mapped item."""
        _, packs, problems = load_and_compile(str(self.catalog_path))
        assert not problems, problems
        identity = expected_identity(packs[0], packs[0].processes[0].name)
        return {ENV_IDENTITY: identity.env_value()}

    def item(self, index: int) -> str:
        plan = self.plan()
        assert plan.mapping_plan is not None
        return plan.mapping_plan.item_env_value(plan.mapping_plan.items[index])

    def run_argv(self) -> list[str]:
        return [
            "run",
            "--catalog",
            str(self.catalog_path),
            "--workload",
            "neg",
            "--process",
            "copy",
        ]


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str

    def error(self) -> dict[str, Any]:
        """The dpone.error.v1 record on the last stderr line."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        assert lines, "no stderr"
        # A run prints its summary after the error line; the error JSON is the last JSON line.
        for line in reversed(lines):
            if line.startswith("{"):
                record: dict[str, Any] = json.loads(line)
                assert record["schema"] == "dpone.error.v1"
                assert record["code"] in errors.REGISTRY
                return record
        raise AssertionError(f"no dpone.error.v1 line in {self.stderr[-800:]}")


@contextlib.contextmanager
def patched_environ(env: Mapping[str, str | None]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in env}
    try:
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_cli(argv: list[str], env: Mapping[str, str | None] | None = None) -> CliResult:
    base: dict[str, str | None] = {
        ENV_ITEM: None,
        ENV_IDENTITY: None,
        "DPONE_XCOM_PATH": None,
        "DPONE_EVIDENCE_DIR": None,
        "DPONE_TEST_FAULT": None,
        "DPONE_DEBUG": None,
    }
    out, err = io.StringIO(), io.StringIO()
    with patched_environ({**base, **(env or {})}):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = dpone_main(argv)
    result = CliResult(code, out.getvalue(), err.getvalue())
    assert "Traceback" not in result.stderr, result.stderr
    return result


def check_codes(project: Project) -> list[dict[str, Any]]:
    """`dpone check --format json` on the project: the error records (exit 1) or [] (exit 0)."""
    project.write()
    result = run_cli(["check", str(project.catalog_path), "--format", "json"])
    records: list[dict[str, Any]] = json.loads(result.stdout)
    assert result.code == (1 if records else 0), (result.code, records)
    return records


# --- Postgres ------------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def private_database(base_dsn: str, prefix: str = DATABASE) -> Iterator[str]:
    """A database of this test process only (``<prefix>_<pid>``), dropped afterwards; leftovers
    of dead test processes are dropped first. Concurrent test runs never share tables."""
    with psycopg.connect(base_dsn, autocommit=True) as conn:
        for (name,) in conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", (prefix + "\\_%",)
        ).fetchall():
            suffix = name[len(prefix) + 1 :]
            if suffix.isdigit() and not _pid_alive(int(suffix)):
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
        name = f"{prefix}_{os.getpid()}"
        with contextlib.suppress(psycopg.errors.DuplicateDatabase):
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(base_dsn)
    info["dbname"] = name
    try:
        yield psycopg.conninfo.make_conninfo(**info)
    finally:
        with psycopg.connect(base_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def as_url(dsn: str) -> str:
    """A postgresql:// URL for DPONE_CONN_* (dpone picks the dialect from the scheme)."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    user = info.get("user", "postgres")
    password = f":{info['password']}" if info.get("password") else ""
    host = info.get("host", "127.0.0.1")
    port = info.get("port", "5432")
    return f"postgresql://{user}{password}@{host}:{port}/{info['dbname']}"


def reset_schemas(dsn: str, *schemas: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def schema_exists(dsn: str, schema: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
        return row is not None


def seed_source(dsn: str, rows_per_day: int = 20, days: int = 12) -> None:
    """neg.src with ``rows_per_day`` rows a day from 2023-01-01; neg.dst with a CHECK."""
    reset_schemas(dsn, "neg", "neg_audit")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA neg")
        conn.execute(
            "CREATE TABLE neg.src (id integer PRIMARY KEY, d date NOT NULL, amount integer NOT NULL)"
        )
        conn.execute(
            "INSERT INTO neg.src SELECT g, date '2023-01-01' + ((g - 1) / %s), g "
            "FROM generate_series(1, %s) AS g",
            (rows_per_day, rows_per_day * days),
        )
        conn.execute(
            "CREATE TABLE neg.dst (id integer PRIMARY KEY, d date NOT NULL, "
            "amount integer NOT NULL CHECK (amount >= 0))"
        )
        conn.execute("CREATE INDEX ON neg.dst (d)")


def scalar(dsn: str, query: str, params: Any = None) -> Any:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query, params).fetchone()
        return None if row is None else row[0]
