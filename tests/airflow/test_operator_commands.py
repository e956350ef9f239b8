"""The Airflow commands dpone prints or documents for operators are ones Airflow's own CLI parser
accepts, with the meaning dpone gives them, on every Airflow version of the matrix:

- `dpone ledger status` prints `airflow tasks clear ... --only-failed --yes` (Airflow's CLI has
  no map-index option, which is why the command clears the task's failed instances);
- the runbook throttles with `airflow pools set` / `pools get` and pauses with
  `airflow dags pause` / `unpause`.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
from typing import Any

import pytest
from reference_data import AIRFLOW_VERSIONS

CLEAR = "airflow tasks clear orders_backfill --task-regex '^run_orders$' --only-failed --yes"
POOL = "airflow pools set dpone_backfill 2 'dpone backfills (throttled)'"
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
    assert (pool["pool"], pool["slots"], pool["description"]) == (
        "dpone_backfill",
        2,
        "dpone backfills (throttled)",
    )
    for command in (PAUSE, UNPAUSE):
        assert _parse(python, command)["dag_id"] == "orders_backfill"
    assert _parse(python, POOL_GET)["pool"] == "dpone_backfill"
