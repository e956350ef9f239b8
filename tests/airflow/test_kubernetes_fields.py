"""The Kubernetes field map `dpone check` walks nested pod options with is the one every cached
Airflow environment's kubernetes client gives (scripts/kubernetes_fields.py --check): a key
check lets through builds its model on each supported Airflow, and a key one of them lacks is
refused at its line instead of failing the DAG's import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_field_map_is_what_every_airflow_client_knows(airflow_envs: dict[str, str]) -> None:
    assert len(airflow_envs) == 4, airflow_envs
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "kubernetes_fields.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "up to date" in done.stdout
