"""Capability guard: on an Airflow without what a generated file uses, its import fails with
DPONE_AIRFLOW_MAPPING_UNSUPPORTED and the supported versions (marker: airflow).

Simulated inside the real Airflow 2.10.5, 2.11.2, 3.2.2 and 3.3.2 venvs (airflow_guard_probe.py):
the cncf.kubernetes pod operator cannot be imported, BaseOperator has no ``partial``, or its
``__init__`` takes no ``map_index_template``. Every golden DAG file is parsed under each; with the
real Airflow none fails. Run: .venv/bin/pytest tests/generator/test_airflow_capability_guard.py -m airflow
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from generator_support import GOLDEN, ROOT

VERSIONS = ("2.10.5", "2.11.2", "3.2.2", "3.3.2")
PROBE = ROOT / "tests" / "generator" / "airflow_guard_probe.py"
CODE = "DPONE_AIRFLOW_MAPPING_UNSUPPORTED"
SUPPORTED = "2.10.5, 2.11.x, 3.2.x and 3.3.x"
pytestmark = pytest.mark.airflow


def _golden_files() -> list[Path]:
    return sorted(GOLDEN.glob("*/expected/*.py"))


def _is_kubernetes(path: Path) -> bool:
    return "class DponeRuntimeOperator(DponePodOperator)" in path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def guard_facts() -> dict[str, dict[str, Any]]:
    built = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "airflow_envs.py"),
            "--versions",
            ",".join(VERSIONS),
            "--jobs",
            "2",
            "--print-paths",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    pythons: dict[str, str] = json.loads(built.stdout)
    prefixes = ("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "DPONE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    files = [str(p) for p in _golden_files()]

    def probe(version: str) -> dict[str, Any]:
        done = subprocess.run(
            [pythons[version], str(PROBE), *files],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-6000:]
        facts: dict[str, Any] = json.loads(done.stdout)
        return facts

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(VERSIONS, pool.map(probe, VERSIONS), strict=True))


@pytest.mark.parametrize("version", VERSIONS)
def test_unsupported_airflow_fails_the_import_with_the_registered_code(
    guard_facts: dict[str, dict[str, Any]], version: str
) -> None:
    facts = guard_facts[version]
    assert facts["airflow_version"] == version
    files = _golden_files()
    assert all(error is None for error in facts["none"].values()), facts["none"]
    for simulation, missing in (
        ("no_provider", "KubernetesPodOperator"),
        ("no_mapping", "dynamic task mapping (partial/expand)"),
        ("no_map_index_template", "map_index_template"),
    ):
        for path in files:
            error = facts[simulation][path.name]
            if simulation == "no_provider" and not _is_kubernetes(path):
                assert error is None, (simulation, path.name, error)  # needs no provider
                continue
            assert error is not None, (simulation, path.name)
            assert f"ImportError: {CODE}: this dpone DAG file needs" in error, error
            assert missing in error and f"it runs on Airflow {SUPPORTED}" in error, error
