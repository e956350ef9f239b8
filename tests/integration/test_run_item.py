"""`dpone run --item N` and the retry commands of `dpone ledger status`.

- the env `--item N` computes is, for every item of every golden project, the env the golden DAG
  file passes to mapped task N (read from the file itself);
- on the real Postgres: `--item N` moves exactly item N's chunks, verified like a pod's run; a
  failed item is named by `ledger status` with the `airflow tasks clear` command to retry it.
"""

from __future__ import annotations

import ast
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import jinja2
import psycopg
import pytest
from dpone.cli import main
from dpone.packing.pack import load_and_compile
from dpone.run.runner import mapped_task_env

ROOT = Path(__file__).resolve().parents[2]


def _rendered(value: str) -> str:
    """What Airflow's task-time rendering makes of a value the generator Jinja-encoded."""
    if value.startswith("{{ '") and value.endswith("' }}"):
        return jinja2.Environment().from_string(value).render()
    return value


def _literal_envs(node: ast.expr, task_env: dict[str, dict[str, str]]) -> list[dict[str, str]]:
    """The expand list's env dicts: literals, each extending a task's env (``**TASK_ENV[...]``)."""
    assert isinstance(node, ast.List)
    envs = []
    for element in node.elts:
        assert isinstance(element, ast.Dict)
        env: dict[str, str] = {}
        for key, value in zip(element.keys, element.values, strict=True):
            if key is None:  # **TASK_ENV["run_<process>"]
                assert isinstance(value, ast.Subscript) and ast.unparse(value.value) == "TASK_ENV"
                env.update(task_env[ast.literal_eval(value.slice)])
            else:
                env[ast.literal_eval(key)] = ast.literal_eval(value)
        envs.append(env)
    return envs


def _dag_envs(path: Path) -> tuple[str, dict[str, list[dict[str, str]]]]:
    """(dag_id, {task_id: [env of map index 0, 1, ...]}) read from a generated DAG file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    dag_id = ""
    envs: dict[str, list[dict[str, str]]] = {}
    task_env = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "TASK_ENV"
    )
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        kwargs = {k.arg: k.value for k in node.keywords}
        if isinstance(node.func, ast.Attribute) and node.func.attr == "expand":
            partial = node.func.value
            assert isinstance(partial, ast.Call)
            task_id = ast.literal_eval({k.arg: k.value for k in partial.keywords}["task_id"])
            envs[task_id] = [
                {key: _rendered(value) for key, value in env.items()}
                for env in _literal_envs(kwargs["env_vars"], task_env)
            ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DAG":
            dag_id = ast.literal_eval({k.arg: k.value for k in node.keywords}["dag_id"])
    return dag_id, envs


def test_item_env_is_the_env_of_the_golden_dag_files() -> None:
    checked = 0
    for catalog in sorted(ROOT.glob("golden/*/workloads.yaml")):
        _, packs, problems = load_and_compile(str(catalog))
        assert not problems
        by_dag = {pack.workload.airflow.dag_id: pack for pack in packs}
        for dag_path in sorted((catalog.parent / "expected").glob("*.py")):
            dag_id, envs = _dag_envs(dag_path)
            pack = by_dag[dag_id]
            for task_id, items in envs.items():
                process = task_id.removeprefix("run_")
                for index, dag_env in enumerate(items):
                    name, env = mapped_task_env(pack, process, index)
                    assert name == process
                    assert dict(env) == dag_env, (dag_path, task_id, index)
                    checked += 1
    assert checked >= 300  # 40 + 200 + 30 + ... mapped items across the golden projects


CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders.yaml
    airflow:
      image: example/dpone:1
      dag_id: orders_backfill
      env: {{LOG_FORMAT: json, DPONE_EVIDENCE_DIR: {evidence}}}
      mapping: {{mode: summary, max_items: 6, max_active: 3, pool: dpone_test}}
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {{connection: wh, table: {{schema: {s}, name: raw_orders}}}}
    sink:
      connection: wh
      table: {{schema: {s}, name: orders}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
      chunk: {{column: order_date, type: date, start: 2023-01-01, end: 2023-01-31}}
      inner_mode: replace
    state: {{backend: audit_schema, connection: wh, schema: {s}_audit, require_distributed_lock: true}}
"""


@pytest.fixture
def project(tmp_path: Path, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    schema = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.raw_orders (order_id bigint PRIMARY KEY, "
            "order_date date NOT NULL, amount integer NOT NULL)"
        )
        conn.execute(
            f"CREATE TABLE {schema}.orders (order_id bigint PRIMARY KEY, order_date date NOT NULL,"
            " amount integer NOT NULL CHECK (amount >= 0))"
        )
        conn.execute(
            f"INSERT INTO {schema}.raw_orders SELECT g, date '2023-01-01' + (g % 30), g % 1000 "
            "FROM generate_series(1, 3000) g"
        )
        # one row the target's CHECK refuses, on 2023-01-23 (chunk 23, item 4 of 0-5)
        conn.execute(f"INSERT INTO {schema}.raw_orders VALUES (99999, '2023-01-23', -1)")
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    for key in ("DPONE_AIRFLOW_MAPPING_ITEM", "DPONE_AIRFLOW_RUN_IDENTITY", "LOG_FORMAT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DPONE_EVIDENCE_DIR", str(tmp_path / "shell-evidence"))
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    (tmp_path / "workloads.yaml").write_text(CATALOG.format(evidence=tmp_path / "evidence"))
    (tmp_path / "orders.yaml").write_text(MANIFEST.format(s=schema))
    yield str(tmp_path / "workloads.yaml")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        conn.execute(f"DROP SCHEMA IF EXISTS {schema}_audit CASCADE")


def _status(catalog: str, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    code = main(["ledger", "status", "--catalog", catalog, "--workload", "orders", *extra])
    assert code == 0
    return capsys.readouterr().out


@pytest.mark.postgres
def test_run_item_moves_exactly_that_item_and_status_names_the_retry(
    project: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    base = ["run", "--catalog", project, "--workload", "orders", "--process", "orders"]
    assert main([*base, "--item", "2"]) == 0
    err = capsys.readouterr().err
    assert "re-running mapped item 2 with the env of its Airflow task" in err
    result = json.loads((tmp_path / "xcom.json").read_text())
    mapping = result["backfill"]["mapping"]
    assert mapping["item_index"] == 2 and result["mode"] == "summary"
    assert (mapping["first_chunk_index"], mapping["last_chunk_index"]) == (11, 15)
    assert result["backfill"]["chunks_committed"] == 5
    # the catalog's airflow.env applied for the run (evidence went to its folder) and then undone
    assert list((tmp_path / "evidence").rglob("item-002.*.json"))
    assert not (tmp_path / "shell-evidence").exists()
    assert "LOG_FORMAT" not in os.environ and "DPONE_AIRFLOW_MAPPING_ITEM" not in os.environ
    doc = json.loads(_status(project, capsys, "--format", "json"))
    assert doc["counts"]["committed"] == 5
    assert doc["airflow_clear"] is None

    assert main([*base, "--item", "4"]) == 1  # chunk 23 violates the target's CHECK
    capsys.readouterr()
    doc = json.loads(_status(project, capsys, "--format", "json"))
    assert doc["airflow_clear"] == {
        "task_id": "run_orders",
        "failed_map_indexes": [4],
        "stuck_map_indexes": [],
        "restated_map_indexes": [],
        "command": "airflow tasks clear orders_backfill --task-regex '^run_orders$' "
        "--only-failed --yes",
    }
    text = _status(project, capsys)
    assert "  retry in Airflow (failed map indexes 4):\n" in text
    assert (
        "    airflow tasks clear orders_backfill --task-regex '^run_orders$' --only-failed --yes\n"
        in text
    )


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("extra", "env", "needle"),
    [
        (["--item", "6"], {}, "has items 0-5"),
        (["--item", "-1"], {}, "has items 0-5"),
        (
            ["--item", "0"],
            {"DPONE_AIRFLOW_MAPPING_ITEM": "{}"},
            "unset DPONE_AIRFLOW_MAPPING_ITEM first",
        ),
        (["--item", "x"], {}, "invalid int value"),
    ],
)
def test_run_item_refusals(
    project: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    extra: list[str],
    env: dict[str, str],
    needle: str,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    base = ["run", "--catalog", project, "--workload", "orders", "--process", "orders"]
    assert main([*base, *extra]) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert json.loads(err.strip().splitlines()[-1])["code"] == "DPONE_USAGE"


@pytest.mark.postgres
def test_run_item_refuses_the_tasks_bad_settings_before_any_io(
    project: str, pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Regression: the pod refuses a bad DPONE_READ_AHEAD_MB from airflow.env at its start; the
    # local --item re-run checked only this shell's env and went on to the ledger
    text = Path(project).read_text(encoding="utf-8")
    Path(project).write_text(
        text.replace("LOG_FORMAT: json", "LOG_FORMAT: json, DPONE_READ_AHEAD_MB: abc")
    )
    manifest = Path(project).with_name("orders.yaml").read_text(encoding="utf-8")
    schema = manifest.split("table: {schema: ")[1].split(",")[0]
    base = ["run", "--catalog", project, "--workload", "orders", "--process", "orders"]
    assert main([*base, "--item", "0"]) == 3
    err = capsys.readouterr().err
    assert json.loads(err.strip().splitlines()[-1])["code"] == "DPONE_CONFIG_INVALID"
    assert "DPONE_READ_AHEAD_MB" in err
    with psycopg.connect(pg_dsn) as conn:
        found = conn.execute("SELECT to_regnamespace(%s)", (f"{schema}_audit",)).fetchone()
    assert found == (None,), "nothing was opened: the ledger schema was never created"


def test_run_item_on_an_internal_process_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    catalog = str(ROOT / "golden" / "internal_default" / "workloads.yaml")
    assert main(["run", "--catalog", catalog, "--workload", "orders_history", "--item", "0"]) == 2
    assert "runs in mode internal" in capsys.readouterr().err


CREDENTIALS = """\
      flavour: subprocess
      command: [dpone]
      catalog_path: workloads.yaml
      secret_files: [{{connection: wh, field: dsn, path: {path}}}]
      airflow_connections: [{{connection: wh_af, conn_id: dpone_wh}}]
"""


def _with_credentials(catalog: str, path: Path) -> None:
    """The project's catalog, subprocess flavour, its `wh` DSN from a mounted file and a second
    (unused by the manifest) connection `wh_af` from an Airflow Connection."""
    text = Path(catalog).read_text(encoding="utf-8")
    text = text.replace("      image: example/dpone:1\n", CREDENTIALS.format(path=path))
    Path(catalog).write_text(text, encoding="utf-8")


@pytest.mark.postgres
def test_run_item_recreates_secret_files_or_refuses(
    project: str,
    tmp_path: Path,
    pg_dsn: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`--item` gives the re-run the `airflow.secret_files` paths of the task: the DSN reaches it
    only through the file. A file that is not there, or an Airflow Connection it cannot resolve,
    is refused before anything moves (DPONE_CONNECTION_MISSING, both at once)."""
    dsn_file = tmp_path / "mounted" / "wh_dsn"
    _with_credentials(project, dsn_file)
    monkeypatch.delenv("DPONE_CONN_WH")
    base = ["run", "--catalog", project, "--workload", "orders", "--process", "orders"]

    assert main([*base, "--item", "2"]) == 3  # nothing mounted, no DPONE_CONN_WH_AF
    err = capsys.readouterr().err
    assert json.loads(err.splitlines()[-1])["code"] == "DPONE_CONNECTION_MISSING", err
    assert err.count("DPONE_CONNECTION_MISSING") >= 2, err  # both problems, not the first only
    assert f"DPONE_CONN_WH_FILE is '{dsn_file}' in the Airflow task" in err
    assert "from the Airflow Connection 'dpone_wh'" in err and "DPONE_CONN_WH_AF" in err
    refused = json.loads((tmp_path / "xcom.json").read_text())  # the refusal's result
    assert refused["status"] == "failed" and refused["error"]["code"] == "DPONE_CONNECTION_MISSING"

    dsn_file.parent.mkdir()
    dsn_file.write_text(pg_dsn + "\n", encoding="utf-8")
    monkeypatch.setenv("DPONE_CONN_WH_AF", pg_dsn)
    assert main([*base, "--item", "2"]) == 0
    assert "DPONE_CONN_WH_FILE" in capsys.readouterr().err  # the keys it set
    result = json.loads((tmp_path / "xcom.json").read_text())
    assert result["backfill"]["chunks_committed"] == 5
    assert result["airflow"] == {"outside_airflow": True}

    # this shell's own value wins over the task's file, which need not exist here then
    dsn_file.unlink()
    monkeypatch.setenv("DPONE_CONN_WH", pg_dsn)
    assert main([*base, "--item", "3"]) == 0
    assert "DPONE_CONN_WH_FILE" not in capsys.readouterr().err
    assert json.loads((tmp_path / "xcom.json").read_text())["backfill"]["chunks_committed"] == 5
