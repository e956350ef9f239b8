"""`dpone-runtime` alone, installed from its wheel with the postgres extra into a fresh virtual
environment (what a pod gets).

`bash scripts/build.sh` builds the wheels (into a temporary folder here). The generator's
dependencies (jinja2, black) and Airflow must not be in the runtime's dependency closure, `dpone
run --help` must work there, the generator commands must say how to get them, the JSON Schemas must
ship inside the wheel, the installed size stays within 40 MB, and a real `dpone run` of a golden
catalog moves its data on the real Postgres (a frozen DAG's mapped item first, then the rest of the
campaign). Nothing is written into the repository. No network: package indexes come from this
machine's pip configuration (local file:// indexes here) and uv runs --offline; set
DPONE_TEST_ALLOW_NETWORK=1 on a machine that has to download ruamel.yaml, psycopg and setuptools.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = (
    "jinja2",
    "black",
    "apache-airflow",
    "apache-airflow-providers-cncf-kubernetes",
    "dpone",  # the generator distribution
)
CONTRACT_SCHEMAS = (
    "error.v1.schema.json",
    "mapping-item.v1.schema.json",
    "mapping-plan.v1.schema.json",
    "mapping-policy.v1.schema.json",
    "pipeline.v1.schema.json",
    "run-identity.v1.schema.json",
    "workload-catalog.v1.schema.json",
)

PROBE = r"""
import hashlib, importlib.metadata as md, importlib.util, json, re
from importlib import resources
import dpone
def norm(name): return re.sub(r"[-_.]+", "-", name).lower()
schemas = {
    entry.name: hashlib.sha256(entry.read_bytes()).hexdigest()
    for entry in resources.files("dpone").joinpath("schemas").iterdir()
    if entry.name.endswith(".json")
}
print(json.dumps({
    "distributions": sorted(norm(d.metadata["Name"]) for d in md.distributions()),
    "requires": md.requires("dpone-runtime") or [],
    "dpone_file": dpone.__file__,
    "generator_importable": importlib.util.find_spec("dpone_generator") is not None,
    "schemas": schemas,
}))
"""


@dataclass(frozen=True)
class RuntimeVenv:
    root: Path
    python: Path
    dpone: Path
    env: dict[str, str]

    def run(self, *argv: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in argv],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def _pip_index_args() -> list[str]:
    """This machine's pip indexes and find-links, as uv options (uv does not read pip.conf)."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout
    flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url"}
    flags["find-links"] = "--find-links"
    args: list[str] = []
    for line in listed.splitlines():
        key, _, raw = line.partition("=")
        option = flags.get(key.rsplit(".", 1)[-1])
        if option is None:
            continue
        for value in raw.strip().strip("'\"").split():
            if value not in args:  # pip lists env and file settings separately
                args += [option, value]
    return args


def _checked(result: subprocess.CompletedProcess[str], what: str) -> None:
    assert result.returncode == 0, f"{what} failed:\n{result.stdout}\n{result.stderr}"


def _clean_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["UV_CACHE_DIR"] = str(root / "uv-cache")
    env["NO_COLOR"] = "1"
    return env


def _uv(root: Path, env: dict[str, str], *argv: str | Path) -> None:
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert uv, "uv is part of requirements/dev.txt; run scripts/bootstrap.sh"
    offline: Sequence[str] = () if os.environ.get("DPONE_TEST_ALLOW_NETWORK") else ("--offline",)
    command = [uv, *map(str, argv[:2]), *offline, *map(str, argv[2:])]
    result = subprocess.run(
        command, cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    _checked(result, " ".join(command))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`bash scripts/build.sh OUT`: the wheels of both distributions."""
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "build.sh"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    _checked(built, "scripts/build.sh")
    found = {p.name.split("-")[0]: p for p in out.glob("*.whl")}
    assert set(found) == {"dpone", "dpone_runtime"}, sorted(out.iterdir())
    assert not (REPO / "runtime" / "build").exists() and not (REPO / "build").exists()
    return found


@pytest.fixture(scope="module")
def runtime_venv(tmp_path_factory: pytest.TempPathFactory, wheels: dict[str, Path]) -> RuntimeVenv:
    root = tmp_path_factory.mktemp("runtime-install")
    env = _clean_env(root)
    venv = root / "venv"
    _uv(root, env, "venv", "--quiet", "--python", sys.executable, venv)
    python = venv / "bin" / "python"
    wheel = f"{wheels['dpone_runtime']}[postgres]"
    _uv(root, env, "pip", "install", "--quiet", "--python", python, *_pip_index_args(), wheel)
    return RuntimeVenv(root, python, venv / "bin" / "dpone", env)


@pytest.fixture(scope="module")
def probe(runtime_venv: RuntimeVenv) -> dict[str, Any]:
    result = runtime_venv.run(runtime_venv.python, "-I", "-c", PROBE)
    _checked(result, "probe")
    loaded: dict[str, Any] = json.loads(result.stdout)
    return loaded


def test_installed_non_editable_into_the_venv(
    runtime_venv: RuntimeVenv, probe: dict[str, Any]
) -> None:
    assert Path(probe["dpone_file"]).is_relative_to(runtime_venv.root / "venv")
    assert "dpone-runtime" in probe["distributions"]
    assert not (REPO / "runtime" / "build").exists(), "the install wrote into the repository"


def test_generator_and_airflow_are_not_in_the_dependency_closure(probe: dict[str, Any]) -> None:
    installed = set(probe["distributions"])
    assert installed.isdisjoint(FORBIDDEN), sorted(installed)
    declared = {re.split(r"[ <>=!;\[]", r, maxsplit=1)[0].lower() for r in probe["requires"]}
    assert declared.isdisjoint(FORBIDDEN), probe["requires"]
    assert not probe["generator_importable"]
    # the whole closure, for the record: the runtime, its YAML parser and the Postgres driver
    closure = {"dpone-runtime", "ruamel-yaml", "ruamel-yaml-clib", "psycopg", "psycopg-binary"}
    assert installed <= closure | {"typing-extensions"}, sorted(installed)
    assert {"dpone-runtime", "psycopg", "psycopg-binary"} <= installed


def test_dpone_run_help_works(runtime_venv: RuntimeVenv) -> None:
    result = runtime_venv.run(runtime_venv.dpone, "run", "--help")
    _checked(result, "dpone run --help")
    assert result.stdout.startswith("usage: dpone run")
    assert "DPONE_AIRFLOW_MAPPING_ITEM" in result.stdout


@pytest.mark.parametrize("command", ["check", "preview", "generate"])
def test_generator_commands_say_how_to_get_them(runtime_venv: RuntimeVenv, command: str) -> None:
    result = runtime_venv.run(runtime_venv.dpone, command, "x")
    assert result.returncode == 2, result.stderr
    record = json.loads(result.stderr.strip().splitlines()[-1])
    assert record["schema"] == "dpone.error.v1" and record["code"] == "DPONE_USAGE"
    assert "dist/dpone-0.1.0-py3-none-any.whl" in record["message"]
    assert "pip install dpone" not in result.stderr  # never the bare name: another project owns it


def test_schemas_ship_inside_the_wheel(probe: dict[str, Any]) -> None:
    shipped: dict[str, str] = probe["schemas"]
    assert set(shipped) >= set(CONTRACT_SCHEMAS)
    source = REPO / "runtime" / "src" / "dpone" / "schemas"
    assert set(shipped) == {p.name for p in source.glob("*.json")}
    for name, digest in shipped.items():
        assert digest == hashlib.sha256((source / name).read_bytes()).hexdigest(), name


def test_the_pure_core_runs_there(runtime_venv: RuntimeVenv) -> None:
    code = (
        "from dpone.authoring.schema import load_schema, validate;"
        "from dpone.plan.mapping import MappingPolicy, plan_mapping;"
        "p = plan_mapping(MappingPolicy('summary', 200, 16, 'p'), 1000, 'sha256:' + '0' * 64);"
        "assert not validate(p.to_artifact(), load_schema('mapping-plan.v1.schema.json'));"
        "print(p.items_total)"
    )
    result = runtime_venv.run(runtime_venv.python, "-I", "-c", code)
    _checked(result, "pure core")
    assert result.stdout.strip() == "200"


MAX_INSTALLED_MB = 40
GOLDEN = REPO / "golden" / "summary_365_into_40"


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def test_installed_size_is_within_budget(runtime_venv: RuntimeVenv) -> None:
    (site,) = (runtime_venv.root / "venv" / "lib").glob("python3*/site-packages")
    size = _tree_bytes(site)
    report = os.environ.get("DPONE_INSTALL_REPORT")
    if report:
        Path(report).write_text(json.dumps({"site_packages_bytes": size}) + "\n")
    assert size <= MAX_INSTALLED_MB * 1024 * 1024, f"{size / 1e6:.1f} MB installed"


@pytest.fixture
def golden_db(pg_dsn: str) -> Any:
    """A private database with the golden project's tables: raw.orders (50 rows a day in 2023)
    and the empty target analytics.orders."""
    import psycopg
    from psycopg import sql

    name = f"dpone_install_{os.getpid()}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    info["dbname"] = name
    dsn = psycopg.conninfo.make_conninfo(**info)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA raw")
        conn.execute("CREATE SCHEMA analytics")
        for table in ("raw.orders", "analytics.orders"):
            conn.execute(
                f"CREATE TABLE {table} (order_id bigint PRIMARY KEY, order_date date NOT NULL, "
                f"amount numeric(12,2) NOT NULL)"
            )
        conn.execute(
            "INSERT INTO raw.orders SELECT g, date '2023-01-01' + ((g - 1) % 365), g % 1000 "
            "FROM generate_series(1, 18250) AS g"
        )
    url = (
        f"postgresql://{info.get('user', 'postgres')}@{info.get('host', '127.0.0.1')}:"
        f"{info.get('port', '5432')}/{name}"
    )
    try:
        yield {"dsn": dsn, "url": url}
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _golden_item_env(item: int) -> dict[str, str]:
    """The env the golden frozen DAG gives mapped item ``item`` (run identity and item)."""
    text = (GOLDEN / "expected" / "orders_history_backfill.py").read_text(encoding="utf-8")
    # the run identity is written once (TASK_ENV) and every item extends it
    (identity,) = re.findall(r'"DPONE_AIRFLOW_RUN_IDENTITY": \'([^\']*)\'', text)
    items = re.findall(r'"DPONE_AIRFLOW_MAPPING_ITEM": \'([^\']*)\'', text)
    assert len(items) == 40 and text.count('**TASK_ENV["run_orders"],') == 40
    return {
        "DPONE_AIRFLOW_RUN_IDENTITY": identity,
        "DPONE_AIRFLOW_MAPPING_ITEM": items[item],
    }


@pytest.mark.postgres
def test_dpone_run_of_a_golden_catalog_against_postgres(
    runtime_venv: RuntimeVenv, golden_db: dict[str, str], tmp_path: Path
) -> None:
    import psycopg

    project = tmp_path / "golden"
    shutil.copytree(GOLDEN, project, ignore=shutil.ignore_patterns("expected"))
    catalog = project / "workloads.yaml"
    base = {**runtime_venv.env, "DPONE_CONN_WAREHOUSE": golden_db["url"]}
    base["DPONE_EVIDENCE_DIR"] = str(tmp_path / "evidence")
    argv = [str(runtime_venv.dpone), "run", "--catalog", str(catalog), "--workload"]
    argv += ["orders_history", "--process", "orders"]

    def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        env = {**env, "DPONE_XCOM_PATH": str(tmp_path / "xcom.json")}
        return subprocess.run(
            argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False
        )

    # 1. mapped item 7 exactly as the frozen golden DAG runs it in a pod
    item = run({**base, **_golden_item_env(7)})
    assert item.returncode == 0, item.stderr
    result = json.loads((tmp_path / "xcom.json").read_text())
    assert result["status"] == "passed" and result["mode"] == "summary"
    assert result["backfill"]["mapping"]["item_index"] == 7
    moved_by_item = result["backfill"]["chunks_committed"]
    assert moved_by_item == 9
    assert sum(1 for line in item.stderr.splitlines() if ": chunk " in line) == 9
    # 2. the rest of the campaign, one internal run
    rest = run(base)
    assert rest.returncode == 0, rest.stderr
    result = json.loads((tmp_path / "xcom.json").read_text())
    assert result["backfill"]["chunks_committed"] == 365 - moved_by_item
    assert result["backfill"]["chunks_skipped_resume"] == moved_by_item
    assert result["backfill"]["campaign_complete"] is True
    digest = "SELECT count(*), sum(order_id), sum(amount) FROM {}"
    with psycopg.connect(golden_db["dsn"]) as conn:
        source = conn.execute(digest.format("raw.orders")).fetchone()
        target = conn.execute(digest.format("analytics.orders")).fetchone()
    assert source == target and source is not None and source[0] == 18250
    assert golden_db["url"] not in item.stderr + rest.stderr
