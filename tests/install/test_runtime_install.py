"""`dpone-runtime` alone, installed non-editable into a fresh virtual environment (what a pod gets).

The generator's dependencies (jinja2, black) and Airflow must not be in its dependency closure,
`dpone run --help` must work there, the generator commands must say how to get them, and the
JSON Schemas must ship inside the wheel. Nothing is cached in the repository: the source is
copied to tmp and uv gets its own cache there. No network: package indexes come from this
machine's pip configuration (local file:// indexes here) and uv runs --offline; set
DPONE_TEST_ALLOW_NETWORK=1 on a machine that has to download ruamel.yaml and setuptools.
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
def runtime_venv(tmp_path_factory: pytest.TempPathFactory) -> RuntimeVenv:
    root = tmp_path_factory.mktemp("runtime-install")
    source = root / "runtime"
    shutil.copytree(
        REPO / "runtime",
        source,
        ignore=shutil.ignore_patterns("*.egg-info", "build", "dist", "__pycache__", ".*cache"),
    )
    env = _clean_env(root)
    venv = root / "venv"
    _uv(root, env, "venv", "--quiet", "--python", sys.executable, venv)
    python = venv / "bin" / "python"
    _uv(root, env, "pip", "install", "--quiet", "--python", python, *_pip_index_args(), source)
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
    # the whole closure, for the record: the runtime and its YAML parser
    assert installed <= {"dpone-runtime", "ruamel-yaml", "ruamel-yaml-clib"}, sorted(installed)


def test_dpone_run_help_works(runtime_venv: RuntimeVenv) -> None:
    result = runtime_venv.run(runtime_venv.dpone, "run", "--help")
    _checked(result, "dpone run --help")
    assert result.stdout.startswith("usage: dpone run")
    assert "DPONE_AIRFLOW_MAPPING_ITEM" in result.stdout


@pytest.mark.parametrize("command", ["check", "preview", "generate"])
def test_generator_commands_say_how_to_get_them(runtime_venv: RuntimeVenv, command: str) -> None:
    result = runtime_venv.run(runtime_venv.dpone, command, "x")
    assert result.returncode == 2, result.stderr
    assert "pip install dpone" in result.stderr
    record = json.loads(result.stderr.strip().splitlines()[-1])
    assert record["schema"] == "dpone.error.v1" and record["code"] == "DPONE_USAGE"


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
