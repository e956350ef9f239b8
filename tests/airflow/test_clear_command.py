"""The `airflow tasks clear` command `dpone ledger status` prints is one Airflow's own CLI parser
accepts, with the meaning dpone documents, on every Airflow version of the matrix. (Airflow's CLI
has no map-index option, which is why the command clears the task's failed instances.)"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile

import pytest
from reference_data import AIRFLOW_VERSIONS

COMMAND = "airflow tasks clear orders_backfill --task-regex '^run_orders$' --only-failed --yes"
PROBE = """
import json, sys
from airflow.cli import cli_parser
args = cli_parser.get_parser().parse_args(sys.argv[1:])
clear = cli_parser.get_parser()._subparsers._group_actions[0].choices["tasks"]
options = sorted(o for a in clear._subparsers._group_actions[0].choices["clear"]._actions
                 for o in a.option_strings)
print(json.dumps({"dag_id": args.dag_id, "task_regex": args.task_regex,
                  "only_failed": args.only_failed, "only_running": args.only_running,
                  "yes": args.yes, "options": options}))
"""


@pytest.mark.airflow
@pytest.mark.parametrize("version", AIRFLOW_VERSIONS)
def test_the_printed_clear_command_parses_in_airflow(
    airflow_envs: dict[str, str], version: str
) -> None:
    argv = shlex.split(COMMAND)[1:]
    with tempfile.TemporaryDirectory(prefix="dpone-af-home-") as home:
        env = {"PATH": os.environ.get("PATH", ""), "AIRFLOW_HOME": home, "HOME": home}
        done = subprocess.run(
            [airflow_envs[version], "-c", PROBE, *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["dag_id"] == "orders_backfill" and facts["task_regex"] == "^run_orders$"
    assert facts["only_failed"] is True and facts["only_running"] is False and facts["yes"]
    assert not [o for o in facts["options"] if "map" in o], facts["options"]
