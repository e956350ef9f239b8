"""Fixtures of the Airflow matrix: one cached virtual environment per Airflow version.

The tests run in the project venv; Airflow itself only ever runs inside the venvs that
scripts/airflow_envs.py builds (or reuses) under .cache/airflow/. A venv that cannot be built makes the
tests FAIL, never skip.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "airflow" / "harness"
REFERENCE = ROOT / "tests" / "airflow" / "reference"

sys.path.insert(0, str(HARNESS))  # hostile_values, reference_data (standard library only)

from reference_data import AIRFLOW_VERSIONS, SMOKES, smoke_versions  # noqa: E402


@pytest.fixture(scope="session")
def airflow_envs() -> dict[str, str]:
    """{version: python of its venv}; builds missing venvs (two at a time)."""
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "airflow_envs.py"),
        "--versions",
        ",".join(AIRFLOW_VERSIONS),
        "--jobs",
        "2",
        "--print-paths",
    ]
    t = time.monotonic()
    r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=1800)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        pytest.fail(f"building the Airflow venvs failed ({r.returncode}):\n{r.stderr[-6000:]}")
    paths = json.loads(r.stdout)
    missing = [v for v in AIRFLOW_VERSIONS if v not in paths or not Path(paths[v]).exists()]
    if missing:
        pytest.fail(f"no Airflow venv for {missing}: {r.stderr[-3000:]}")
    sys.stderr.write(f"airflow venvs ready in {time.monotonic() - t:.1f}s\n")
    return paths


def run_harness(python: str, script: str, args: list[str], timeout: int = 600) -> dict:
    """Run a harness script in an Airflow venv; return its JSON (written to a temp file)."""
    with tempfile.TemporaryDirectory(prefix="dpone-af-facts-") as tmp:
        out = os.path.join(tmp, "facts.json")
        # no Airflow/Python settings of the caller, and no DPONE_* (the smoke echoes those back)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "DPONE_"))
        }
        r = subprocess.run(
            [python, str(HARNESS / script), *args, "--out", out],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=tmp,
        )
        if r.returncode != 0 or not os.path.exists(out):
            raise AssertionError(
                f"{script} {' '.join(args)} failed ({r.returncode}) with {python}:\n"
                f"--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-6000:]}"
            )
        with open(out, encoding="utf-8") as fh:
            return json.load(fh)


@pytest.fixture(scope="session")
def reference_facts(airflow_envs) -> dict[str, dict]:
    """inspect_dag.py over every reference DAG, once per version (two versions at a time)."""
    files = sorted(str(p) for p in REFERENCE.glob("*.py"))
    t = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futs = {
            v: pool.submit(
                run_harness,
                airflow_envs[v],
                "inspect_dag.py",
                [
                    *files,
                    "--outcome",
                    "--probe-raw=kubernetes_env_fidelity.py,subprocess_env_fidelity.py",
                ],
            )
            for v in AIRFLOW_VERSIONS
        }
        facts: dict[str, dict] = {}
        errors = {}
        for v, fut in futs.items():
            try:
                facts[v] = fut.result()
            except AssertionError as exc:
                errors[v] = str(exc)
    sys.stderr.write(
        f"inspect_dag over {len(files)} files x 4 versions: {time.monotonic() - t:.1f}s\n"
    )
    for v, err in errors.items():
        facts[v] = {"harness_error": err}
    return facts


@pytest.fixture(scope="session")
def smoke_facts(airflow_envs) -> dict:
    """dagtest_smoke.py: all smoke DAGs of one version in one process (one DB migrate); versions two
    at a time. {version: facts}."""
    args = [
        f"{REFERENCE / f}:{fail}" if fail is not None else str(REFERENCE / f)
        for f, fail in SMOKES.values()
    ]
    t = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futs = {
            v: pool.submit(run_harness, airflow_envs[v], "dagtest_smoke.py", [*args, "--stub-kpo"])
            for v in smoke_versions()
        }
        out = {}
        for v, fut in futs.items():
            try:
                out[v] = fut.result()
            except AssertionError as exc:
                out[v] = {"harness_error": str(exc)}
    sys.stderr.write(f"dag.test smokes: {time.monotonic() - t:.1f}s\n")
    return out
