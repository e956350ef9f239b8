"""The Airflow commands dpone prints or documents for operators are ones Airflow's own CLI parser
accepts, with the meaning dpone gives them, on every Airflow version of the matrix:

- `dpone ledger status` prints `airflow tasks clear ... --only-failed --yes` (Airflow's CLI has
  no map-index option, which is why the command clears the task's failed instances);
- the runbook throttles with `airflow pools set` / `pools get` and pauses with
  `airflow dags pause` / `unpause`;
- every `airflow pools set` line of the runbook and deploy-kubernetes.md, run against a real
  metadata database after `airflow pools import` of a generated pools file, changes the slots
  and keeps `include_deferred` on.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from reference_data import AIRFLOW_VERSIONS

CLEAR = "airflow tasks clear orders_backfill --task-regex '^run_orders$' --only-failed --yes"
POOL = "airflow pools set dpone_backfill 2 'dpone backfills (throttled)' --include-deferred"
PAUSE = "airflow dags pause orders_backfill"
UNPAUSE = "airflow dags unpause orders_backfill"
POOL_GET = "airflow pools get dpone_backfill"
PROBE = """
import json, sys
from airflow.cli import cli_parser
args = cli_parser.get_parser().parse_args(sys.argv[1:])
facts = {k: v for k, v in vars(args).items() if isinstance(v, (str, int, bool, type(None)))}
tasks = cli_parser.get_parser()._subparsers._group_actions[0].choices["tasks"]
clear = tasks._subparsers._group_actions[0].choices["clear"]
facts["clear_options"] = sorted(o for a in clear._actions for o in a.option_strings)
print(json.dumps(facts))
"""


def _parse(python: str, command: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dpone-af-home-") as home:
        env = {"PATH": os.environ.get("PATH", ""), "AIRFLOW_HOME": home, "HOME": home}
        done = subprocess.run(
            [python, "-c", PROBE, *shlex.split(command)[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    facts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return facts


@pytest.mark.airflow
@pytest.mark.parametrize("version", AIRFLOW_VERSIONS)
def test_the_printed_and_documented_commands_parse_in_airflow(
    airflow_envs: dict[str, str], version: str
) -> None:
    python = airflow_envs[version]
    clear = _parse(python, CLEAR)
    assert clear["dag_id"] == "orders_backfill" and clear["task_regex"] == "^run_orders$"
    assert clear["only_failed"] is True and clear["only_running"] is False and clear["yes"]
    assert not [o for o in clear["clear_options"] if "map" in o], clear["clear_options"]
    pool = _parse(python, POOL)
    assert (pool["pool"], pool["slots"], pool["description"], pool["include_deferred"]) == (
        "dpone_backfill",
        2,
        "dpone backfills (throttled)",
        True,
    )
    for command in (PAUSE, UNPAUSE):
        assert _parse(python, command)["dag_id"] == "orders_backfill"
    assert _parse(python, POOL_GET)["pool"] == "dpone_backfill"


DOCS = Path(__file__).resolve().parents[2] / "docs"


def _documented_pool_commands() -> list[str]:
    """Each `airflow pools set` line of the docs' shell blocks, without its trailing comment."""
    found = []
    for name in ("runbook.md", "deploy-kubernetes.md"):
        for line in (DOCS / name).read_text(encoding="utf-8").splitlines():
            if line.startswith("airflow pools set "):
                found.append(re.sub(r"\s+#.*$", "", line))
    return found


@pytest.mark.airflow
@pytest.mark.parametrize("version", AIRFLOW_VERSIONS)
def test_the_documented_throttle_keeps_include_deferred(
    airflow_envs: dict[str, str], version: str
) -> None:
    commands = _documented_pool_commands()
    assert len(commands) == 3, commands
    airflow = str(Path(airflow_envs[version]).parent / "airflow")
    with tempfile.TemporaryDirectory(prefix="dpone-af-home-") as home:
        env = {"PATH": os.environ.get("PATH", ""), "AIRFLOW_HOME": home, "HOME": home}

        def cli(*argv: str) -> str:
            done = subprocess.run(
                [airflow, *argv], env=env, capture_output=True, text=True, timeout=600, check=False
            )
            assert done.returncode == 0, (argv, done.stderr[-3000:])
            return done.stdout

        cli("db", "migrate")
        pools = Path(home) / "dpone_pools.json"
        generated = {"slots": 8, "description": "dpone backfills", "include_deferred": True}
        pools.write_text(json.dumps({"dpone_backfill": generated}), encoding="utf-8")
        cli("pools", "import", str(pools))
        for command in commands:
            argv = shlex.split(command)
            cli(*argv[1:])
            # Airflow 3.2 logs its plugin set-up to stdout too: the JSON is the last line
            shown = json.loads(cli("pools", "get", argv[3], "-o", "json").strip().splitlines()[-1])
            assert len(shown) == 1, shown
            assert (shown[0]["slots"], shown[0]["description"]) == (argv[4], argv[5]), shown
            assert shown[0]["include_deferred"] == "True", (command, shown)
