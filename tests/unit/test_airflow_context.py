"""DPONE_AIRFLOW_CONTEXT: parsed as strictly as the other provider-owned env values, recorded in
the result, the evidence and the ledger's lease owners, and read back by `dpone ledger status`;
a run outside Airflow says so. The runs are real `dpone run`s of the internal_default golden
project (SQLite data, local file ledger)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.observability.lineage import airflow_facet, parent_of
from dpone.packing.pack import load_workload_pack
from dpone.run.orchestrator import new_owner
from dpone.run.runner import (
    env_airflow_context,
    environment,
    held_to_task,
    mapped_task_env,
    read_env_inputs,
)
from dpone.task.airflow_context import (
    CONTEXT_SCHEMA,
    attribution,
    describe_attribution,
    owner_prefix,
    parse_airflow_context,
)

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"
GOLDEN = ROOT / "golden" / "internal_default"
RUN_ID = "manual__2026-01-02T03:04:05+00:00"


def _context(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": CONTEXT_SCHEMA,
        "dag_id": "dpone_orders_history",
        "task_id": "run_orders",
        "run_id": RUN_ID,
        "try_number": 2,
        "map_index": -1,
        "logical_date": "2026-01-02T03:04:05+00:00",
        "data_interval_start": "2026-01-01T03:04:05+00:00",
        "data_interval_end": None,
    }
    doc.update(changes)
    return doc


def test_a_context_parses_and_names_its_attempt_in_the_lease_owner() -> None:
    context = parse_airflow_context(json.dumps(_context()))
    assert (context.run_id, context.try_number, context.map_index) == (RUN_ID, 2, -1)
    owner = new_owner(owner_prefix(context))
    assert attribution(owner) == {
        "outside_airflow": False,
        "run_id": RUN_ID,
        "try_number": 2,
        "map_index": -1,
    }
    assert describe_attribution(attribution(owner)) == f"by run {RUN_ID}, try 2, map index -1"
    assert attribution(new_owner(owner_prefix(None))) == {"outside_airflow": True}
    assert attribution(new_owner()) is None  # an owner written before dpone recorded it
    assert (
        len(
            new_owner(
                owner_prefix(
                    parse_airflow_context(
                        json.dumps(
                            _context(run_id="r" * 250, try_number=100_000, map_index=100_000)
                        )
                    )
                )
            )
        )
        <= 400
    )  # MSSQL's lease_owner column


def test_the_lineage_parent_is_the_airflow_task_instance_try_under_its_dag_run() -> None:
    context = parse_airflow_context(json.dumps(_context()))
    parent, root = parent_of({}, context)
    assert parent is not None and root is not None
    assert parent[1] == "dpone_orders_history.run_orders" and root[1] == "dpone_orders_history"
    assert (parent[0], root[0]) == ("default", "default")
    assert parent_of({}, context) == (parent, root)  # derived, the same in every process
    # as Airflow's OpenLineage provider counts task runs: one per DAG run, map index and try
    for other in (
        _context(run_id="scheduled__x"),
        _context(try_number=3),
        _context(map_index=4),
        _context(task_id="run_other"),
    ):
        other_parent, other_root = parent_of({}, parse_airflow_context(json.dumps(other)))
        assert other_parent is not None and other_parent[2] != parent[2]
        assert (other_root == root) is (other["run_id"] == RUN_ID)  # the DAG run is the root
    assert parent_of({}, None) == (None, None)  # outside Airflow, no parent of its own
    assert parent_of({"OPENLINEAGE_NAMESPACE": "prod"}, context)[0][0] == "prod"  # type: ignore[index]
    run_id = str(uuid.uuid4())
    given, derived_root = parent_of({"OPENLINEAGE_PARENT_ID": f"ns/job.task/{run_id}"}, context)
    assert given == ("ns", "job.task", run_id)
    assert derived_root == root


def test_the_lineage_airflow_facet_names_run_try_and_map_index() -> None:
    context = parse_airflow_context(json.dumps(_context(map_index=7)))
    assert airflow_facet(context) == {
        "dagId": "dpone_orders_history",
        "taskId": "run_orders",
        "runId": RUN_ID,
        "tryNumber": 2,
        "mapIndex": 7,
        "logicalDate": "2026-01-02T03:04:05+00:00",
        "dataIntervalStart": "2026-01-01T03:04:05+00:00",
        "dataIntervalEnd": None,
    }
    assert airflow_facet(None) is None


SECRET = "postgresql://u:hunter2@db/x"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"schema": 1, "schema": 2}', "duplicate key 'schema'"),
        (json.dumps({**_context(), SECRET: 1}), "1 unknown field(s)"),
        (json.dumps(_context(schema="x")), "schema must be"),
        (json.dumps(_context(dag_id="")), "dag_id must be a non-empty string"),
        (json.dumps(_context(run_id="a\nb")), "run_id must be at most 250 printable"),
        (json.dumps(_context(run_id="r" * 251)), "run_id must be at most 250 printable"),
        (json.dumps(_context(task_id=7)), "task_id must be a non-empty string"),
        (json.dumps(_context(try_number=-1)), "try_number must be an integer from 0"),
        (json.dumps(_context(try_number=True)), "try_number must be an integer from 0"),
        (json.dumps(_context(try_number=1.0)), "try_number must be an integer from 0"),
        (json.dumps(_context(map_index=-2)), "map_index must be an integer from -1"),
        (json.dumps(_context(logical_date=SECRET)), "logical_date must be an ISO 8601"),
        (json.dumps(_context(data_interval_end=5)), "data_interval_end must be an ISO 8601"),
        ('{"try_number": NaN}', "non-standard number NaN"),
        (json.dumps(_context(run_id="x" * 5000)), "value exceeds 4096 bytes"),
        # a lone surrogate, escaped in the JSON or an undecodable byte held as a surrogate escape
        (json.dumps(_context(task_id="run_\ud800")), "task_id is not valid UTF-8"),
        (json.dumps(_context(task_id="run_X")).replace("X", "\udcff"), "task_id is not valid"),
        (json.dumps(_context(dag_id="d\udcff", task_id="é")), "dag_id is not valid UTF-8"),
        # C1 controls and Unicode line/paragraph separators are not printable
        (json.dumps(_context(task_id="run_\x9b")), "task_id must be at most 250 printable"),
        (json.dumps(_context(run_id="a\x85b")), "run_id must be at most 250 printable"),
        (json.dumps(_context(dag_id="a\u2028b")), "dag_id must be at most 250 printable"),
        (json.dumps(_context(run_id="a\u2029b\u00a0")), "run_id must be at most 250 printable"),
        (json.dumps(_context(logical_date="2024-99-99T::::")), "logical_date must be an ISO"),
        (json.dumps(_context(logical_date="2024-13-01T00:00:00")), "logical_date must be an ISO"),
        (json.dumps(_context(logical_date="2024-01-01T25:00:00Z")), "logical_date must be an"),
        (json.dumps(_context(data_interval_start="2024-01-01T00:00:00+24:00")), "data_interval"),
        (json.dumps(_context(data_interval_end="2024-01-01T00:00:00\n")), "data_interval_end"),
        (json.dumps(_context(data_interval_end="\u0662\u0660\u0662\u0664-01-01T00:00:00")), "data"),
        (json.dumps(_context(logical_date="2024-01-01")), "logical_date must be an ISO 8601"),
    ],
)
def test_a_malformed_context_is_refused_without_echoing_it(raw: str, message: str) -> None:
    with pytest.raises(DponeError) as caught:
        parse_airflow_context(raw)
    assert caught.value.code == errors.AIRFLOW_CONTEXT_INVALID
    assert message in caught.value.message
    assert "hunter2" not in caught.value.message and "xxxxxxxxxx" not in caught.value.message
    assert caught.value.message.isascii()  # no bad character echoed, none to fail a write


@pytest.mark.parametrize(
    "moment",
    [
        "2024-01-01T00:00:00+00:00",  # Airflow 2.10 (pendulum) and 3.x isoformat() in UTC
        "2024-01-01T00:00:00.123456+00:00",
        "2026-01-02T03:04:05-05:30",
        "2024-02-29T23:59:59.5Z",
        "2024-01-01T00:00",
        None,  # an Airflow 3 run without a logical date
    ],
)
def test_the_dates_airflow_sends_are_accepted(moment: str | None) -> None:
    context = parse_airflow_context(
        json.dumps(_context(logical_date=moment, data_interval_end=moment))
    )
    assert context.logical_date == context.data_interval_end == moment


def test_printable_unicode_ids_are_accepted() -> None:
    context = parse_airflow_context(json.dumps(_context(dag_id="données_日次", run_id="a b~:+")))
    assert (context.dag_id, context.run_id) == ("données_日次", "a b~:+")


@pytest.fixture
def demo(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    for name in ("workloads.yaml", "orders_history.yaml"):
        shutil.copy(GOLDEN / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "PYTHONIO"))}
    env["DPONE_CONN_DEMO"] = f"sqlite:///{tmp_path / 'demo.db'}"
    env["DPONE_XCOM_PATH"] = str(tmp_path / "xcom" / "return.json")
    env["DPONE_EVIDENCE_DIR"] = str(tmp_path / "evidence")
    seeded = subprocess.run(
        [
            str(DPONE.with_name("python")),
            str(ROOT / "scripts" / "demo_seed.py"),
            str(tmp_path / "demo.db"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert seeded.returncode == 0, seeded.stderr
    return tmp_path, env


def _dpone(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DPONE), *args],
        check=False,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


RUN = ("run", "--catalog", "workloads.yaml", "--workload", "orders_history", "--no-progress")
STATUS = ("ledger", "status", "--catalog", "workloads.yaml", "--workload", "orders_history")


def test_a_local_run_records_that_it_ran_outside_airflow(
    demo: tuple[Path, dict[str, str]],
) -> None:
    folder, env = demo
    done = _dpone(folder, env, *RUN)
    result = json.loads((folder / "xcom" / "return.json").read_text(encoding="utf-8"))
    assert result["airflow"] == {"outside_airflow": True}, done.stderr
    assert result["backfill"]["chunks_committed"] == 9, done.stderr
    status = _dpone(folder, env, *STATUS)
    assert "  committed: chunks 1-9 outside Airflow\n" in status.stdout, status.stdout


def test_a_run_in_airflow_records_its_run_try_and_map_index(
    demo: tuple[Path, dict[str, str]],
) -> None:
    folder, env = demo
    env["DPONE_AIRFLOW_CONTEXT"] = json.dumps(_context())
    done = _dpone(folder, env, *RUN)
    result = json.loads((folder / "xcom" / "return.json").read_text(encoding="utf-8"))
    assert result["airflow"] == {
        "outside_airflow": False,
        **{k: v for k, v in _context().items() if k != "schema"},
    }, done.stderr
    (evidence,) = (folder / "evidence").rglob("internal.*.json")
    assert (
        json.loads(evidence.read_text(encoding="utf-8"))["result"]["airflow"] == result["airflow"]
    )
    status = json.loads(_dpone(folder, env, *STATUS, "--format", "json").stdout)
    committed = [g for g in status["moved_by"] if g["state"] == "committed"]
    assert committed and all(
        g["by"] == {"outside_airflow": False, "run_id": RUN_ID, "try_number": 2, "map_index": -1}
        for g in committed
    ), status["moved_by"]
    text = _dpone(folder, env, *STATUS).stdout
    assert f"by run {RUN_ID}, try 2, map index -1" in text, text


def test_a_malformed_context_refuses_the_run_before_the_catalog_is_read(
    demo: tuple[Path, dict[str, str]],
) -> None:
    folder, env = demo
    env["DPONE_AIRFLOW_CONTEXT"] = json.dumps(_context(try_number="2"))
    done = _dpone(folder, env, "run", "--catalog", "missing.yaml", "--workload", "x")
    assert done.returncode != 0
    error = json.loads([x for x in done.stderr.splitlines() if x.startswith("{")][-1])
    assert error["code"] == errors.AIRFLOW_CONTEXT_INVALID, done.stderr
    result = json.loads((folder / "xcom" / "return.json").read_text(encoding="utf-8"))
    assert result["error"]["code"] == errors.AIRFLOW_CONTEXT_INVALID
    assert result["error"]["retryable"] is False


@pytest.mark.parametrize(
    "bad",
    [
        "run_\udcff",  # an undecodable byte (0xff) in the env value: a surrogate escape in Python
        "run_\\ud800",  # a lone surrogate escaped in the JSON
        "run_\\u009b",  # a C1 control (CSI)
        "run_\\u2028",  # a line separator
    ],
)
def test_a_context_with_a_bad_character_refuses_the_run_before_data_moves(
    demo: tuple[Path, dict[str, str]], bad: str
) -> None:
    folder, env = demo
    env["DPONE_AIRFLOW_CONTEXT"] = json.dumps(_context(task_id="X")).replace("X", bad)
    done = _dpone(folder, env, *RUN)
    assert done.returncode == 3, done.stderr  # not retryable (docs/errors.md)
    assert "DPONE_INTERNAL" not in done.stderr and "UnicodeEncodeError" not in done.stderr
    error = json.loads([x for x in done.stderr.splitlines() if x.startswith("{")][-1])
    assert error["code"] == errors.AIRFLOW_CONTEXT_INVALID, done.stderr
    assert "run_" not in done.stderr  # the value is never echoed
    result = json.loads((folder / "xcom" / "return.json").read_text(encoding="utf-8"))
    assert result["error"]["code"] == errors.AIRFLOW_CONTEXT_INVALID
    assert not (folder / ".dpone-demo").exists()  # no ledger: not one chunk moved


def test_a_context_of_another_dag_or_map_index_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pack = load_workload_pack(
        str(ROOT / "golden" / "summary_365_into_40" / "workloads.yaml"), "orders_history"
    )
    _, env = mapped_task_env(pack, None, 3)
    with environment(env):
        item, identity = read_env_inputs()
    assert item is not None and identity is not None
    own = _context(dag_id=identity.dag_id, map_index=3)
    monkeypatch.setenv("DPONE_AIRFLOW_CONTEXT", json.dumps(own))
    context = held_to_task(env_airflow_context(), item, identity)
    assert context is not None and context.map_index == 3
    for wrong in ({"dag_id": "another_dag"}, {"map_index": 4}):
        monkeypatch.setenv("DPONE_AIRFLOW_CONTEXT", json.dumps({**own, **wrong}))
        with pytest.raises(DponeError) as caught:
            held_to_task(env_airflow_context(), item, identity)
        assert caught.value.code == errors.AIRFLOW_CONTEXT_INVALID, wrong
    monkeypatch.delenv("DPONE_AIRFLOW_CONTEXT")
    assert held_to_task(env_airflow_context(), item, identity) is None


def test_item_refuses_an_inherited_context(demo: tuple[Path, dict[str, str]]) -> None:
    folder, env = demo
    env["DPONE_AIRFLOW_CONTEXT"] = json.dumps(_context(dag_id="another_dag"))
    done = _dpone(folder, env, "run", "--item", "0", *RUN[1:])
    assert done.returncode == 2, done.stderr  # --item computes the env: a set context is refused
    assert "DPONE_AIRFLOW_CONTEXT" in done.stderr


def test_try_zero_is_a_task_instance_with_no_try_yet() -> None:
    """`airflow tasks test` on a fresh date runs the task instance with try_number 0 on every
    supported Airflow: it is recorded as it is, not refused."""
    context = parse_airflow_context(json.dumps(_context(try_number=0)))
    owner = new_owner(owner_prefix(context))
    assert describe_attribution(attribution(owner)) == f"by run {RUN_ID}, try 0, map index -1"
