"""OpenLineage events from a real `dpone run` process against the real Postgres, received on a
loopback HTTP server (the client's own HTTP transport) and validated: START then FAIL, START then
COMPLETE, datasets named as OpenLineage names them, the chunk range facet, the Airflow parent
run facet; off by default. Dataset naming for MySQL, MSSQL and SQLite DSNs."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import psycopg
import pytest
from dpone.observability.lineage import DatasetName, dataset_name, lineage_requested, parent_of
from dpone.packing.pack import load_and_compile
from dpone.packing.verify import expected_identity
from dpone.task.airflow_context import CONTEXT_SCHEMA, parse_airflow_context

from .receiver import receiver
from .runproject import DPONE, PASSWORD, dpone_run

pytestmark = pytest.mark.postgres
SCHEMA = json.loads((Path(__file__).with_name("openlineage_run_event.schema.json")).read_text())


def check_event(event: dict[str, Any]) -> None:
    """The JSON schema, then the formats it leaves to code: uuid, date-time, uri."""
    jsonschema.validate(event, SCHEMA)
    uuid.UUID(event["run"]["runId"])
    assert dt.datetime.fromisoformat(event["eventTime"]).tzinfo is not None
    for uri in [event["producer"], event["schemaURL"]] + [
        facet["_schemaURL"]
        for holder in [event["run"], event["job"], *event.get("outputs", [])]
        for key in ("facets", "outputFacets")
        for facet in holder.get(key, {}).values()
    ]:
        assert urlsplit(uri).scheme, uri


def events_of(bodies: list[bytes]) -> list[dict[str, Any]]:
    events = [json.loads(body) for body in bodies]
    for event in events:
        check_event(event)
    return events


def _context(dag_id: str, task_id: str, run_id: str, try_number: int = 1) -> str:
    """DPONE_AIRFLOW_CONTEXT as the generated operator builds it."""
    return json.dumps(
        {
            "schema": CONTEXT_SCHEMA,
            "dag_id": dag_id,
            "task_id": task_id,
            "run_id": run_id,
            "try_number": try_number,
            "map_index": -1,
            "logical_date": "2026-12-01T00:00:00+00:00",
            "data_interval_start": "2026-12-01T00:00:00+00:00",
            "data_interval_end": "2026-12-02T00:00:00+00:00",
        },
        separators=(",", ":"),
    )


def test_run_events_with_datasets_chunk_range_and_parent(project: dict[str, Any]) -> None:
    catalog = project["catalog"]
    _, packs, problems = load_and_compile(catalog)
    assert not problems
    identity = expected_identity(packs[0], "orders")  # what the generated DAG passes
    dag = identity.dag_id
    # its operator at execute time; the task's retry is its try 2
    tries = [_context(dag, "orders", "backfill__2026-12-01", n) for n in (1, 2)]
    # no AIRFLOW_CTX_* (as in a pod): the context names the task and the DAG run
    env = {"DPONE_AIRFLOW_RUN_IDENTITY": identity.env_value()}
    with receiver() as (url, got):
        failed = dpone_run(
            project, {"OPENLINEAGE_URL": url, **env, "DPONE_AIRFLOW_CONTEXT": tries[0]}
        )
        assert failed.returncode != 0 and "DPONE_SINK_FAILED" in failed.stderr
        with psycopg.connect(project["pg"], autocommit=True) as conn:
            conn.execute(f"UPDATE {project['schema']}.raw_orders SET amount = 1 WHERE amount < 0")
        passed = dpone_run(
            project, {"OPENLINEAGE_URL": url, **env, "DPONE_AIRFLOW_CONTEXT": tries[1]}
        )
        assert passed.returncode == 0, passed.stderr
        bodies = got.bodies("/api/v1/lineage")
    raw = b"".join(bodies)
    assert PASSWORD.encode() not in raw and b"postgres@" not in raw  # no user, no password
    events = events_of(bodies)
    assert [e["eventType"] for e in events] == ["START", "FAIL", "START", "COMPLETE"]
    first, second = events[:2], events[2:]
    assert first[0]["run"]["runId"] == first[1]["run"]["runId"]
    assert second[0]["run"]["runId"] == second[1]["run"]["runId"] != first[0]["run"]["runId"]
    schema = project["schema"]
    for event in events:
        assert event["job"] == {
            "namespace": "dpone",
            "name": "orders.orders",
            "facets": event["job"]["facets"],
        }
        assert event["job"]["facets"]["jobType"]["jobType"] == "BACKFILL"
        assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [
            ("postgres://127.0.0.1:5432", f"test.{schema}.raw_orders")
        ]
        assert [(d["namespace"], d["name"]) for d in event["outputs"]] == [
            ("postgres://127.0.0.1:5432", f"test.{schema}.orders")
        ]
        chunks = event["run"]["facets"]["dpone_chunks"]
        assert chunks["chunkColumn"] == "order_date" and chunks["chunksSelected"] == 12
        assert (chunks["firstChunkIndex"], chunks["lastChunkIndex"]) == (1, 12)
        assert (chunks["lowerBound"], chunks["upperBound"]) == ("2023-01-01", "2023-01-13")
        assert chunks["mode"] == "internal" and chunks["campaign"]
        parent = event["run"]["facets"]["parent"]
        assert (parent["job"]["namespace"], parent["job"]["name"]) == ("default", f"{dag}.orders")
        root = parent["root"]["job"]
        assert (root["namespace"], root["name"]) == ("default", dag)
        uuid.UUID(parent["run"]["runId"])
    # each try of the task is a parent run of its own (as Airflow's provider counts them), and
    # both tries are under the one DAG run
    for pair, context in zip((first, second), tries, strict=True):
        parent, root = parent_of({}, parse_airflow_context(context))
        assert parent is not None and root is not None
        assert {e["run"]["facets"]["parent"]["run"]["runId"] for e in pair} == {parent[2]}
        assert {e["run"]["facets"]["parent"]["root"]["run"]["runId"] for e in pair} == {root[2]}
        assert [e["run"]["facets"]["dpone_airflow"] for e in pair] == 2 * [
            {
                "_producer": "urn:dpone:runtime",
                "_schemaURL": "urn:dpone:openlineage:DponeAirflowRunFacet:1",
                "dagId": dag,
                "taskId": "orders",
                "runId": "backfill__2026-12-01",
                "tryNumber": json.loads(context)["try_number"],
                "mapIndex": -1,
                "logicalDate": "2026-12-01T00:00:00+00:00",
                "dataIntervalStart": "2026-12-01T00:00:00+00:00",
                "dataIntervalEnd": "2026-12-02T00:00:00+00:00",
            }
        ]
    assert first[0]["run"]["facets"]["parent"] != second[0]["run"]["facets"]["parent"]
    message = events[1]["run"]["facets"]["errorMessage"]["message"]
    assert message.startswith("DPONE_") and PASSWORD not in message
    assert events[3]["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 100
    assert (
        "outputFacets" not in events[0]["outputs"][0] or not events[0]["outputs"][0]["outputFacets"]
    )


MAPPED_CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders:
    manifest: orders_mapped.yaml
    airflow:
      image: example/dpone:1
      dag_id: orders_backfill
      mapping: {mode: summary, max_items: 3, max_active: 3, pool: dpone_test}
"""


def test_a_run_outside_airflow_has_no_airflow_parent(
    project: dict[str, Any], tmp_path: Path
) -> None:
    """`dpone run --item N` re-runs a mapped task outside Airflow (its result says so): its events
    name no Airflow DAG as parent, even with AIRFLOW_CTX_* inherited from the shell; an explicit
    OPENLINEAGE_PARENT_ID still sets the parent, with no Airflow root derived beside it."""
    catalog = Path(project["catalog"]).with_name("mapped.yaml")
    catalog.write_text(MAPPED_CATALOG)
    manifest = catalog.with_name("orders.yaml").read_text()  # as a summary mapping needs it
    manifest = manifest.replace("parallel_workers: 2", "parallel_workers: 1")
    manifest = manifest.replace("_audit\n", "_audit\n      require_distributed_lock: true\n")
    catalog.with_name("orders_mapped.yaml").write_text(manifest)
    item_run = [str(DPONE), "run", "--catalog", str(catalog), "--workload", "orders"]
    item_run += ["--process", "orders", "--no-progress", "--item"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "OPENLINEAGE"))}
    env.update(
        DPONE_CONN_WH=project["dsn"],
        DPONE_XCOM_PATH=str(tmp_path / "xcom.json"),
        AIRFLOW_CTX_DAG_ID="orders_backfill",
        AIRFLOW_CTX_TASK_ID="run_orders",
        AIRFLOW_CTX_DAG_RUN_ID="manual__2026-12-01",
    )
    explicit = f"my_ns/my_job/{uuid.uuid4()}"
    with receiver() as (url, got):
        env["OPENLINEAGE_URL"] = url
        for item, extra in (("0", {}), ("2", {"OPENLINEAGE_PARENT_ID": explicit})):
            done = subprocess.run(
                [*item_run, item],
                check=False,
                env={**env, **extra},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            result = json.loads((tmp_path / "xcom.json").read_text())
            assert result["airflow"] == {"outside_airflow": True}
        bodies = got.bodies("/api/v1/lineage")
    events = events_of(bodies)
    assert [e["eventType"] for e in events] == ["START", "COMPLETE", "START", "COMPLETE"]
    assert [e["run"]["facets"]["dpone_chunks"]["itemIndex"] for e in events] == [0, 0, 2, 2]
    assert all("parent" not in e["run"]["facets"] for e in events[:2]), events[0]["run"]
    assert all("dpone_airflow" not in e["run"]["facets"] for e in events)
    assert b"orders_backfill" not in b"".join(bodies)  # no Airflow DAG named anywhere
    for event in events[2:]:
        parent = event["run"]["facets"]["parent"]
        assert (parent["job"]["namespace"], parent["job"]["name"]) == ("my_ns", "my_job")
        assert parent["run"]["runId"] == explicit.rsplit("/", 1)[1]
        assert "root" not in parent or parent["root"] is None


def test_lineage_is_off_by_default_and_the_client_is_not_imported(
    project: dict[str, Any], tmp_path: Path
) -> None:
    assert not lineage_requested({"HOME": str(tmp_path)}, cwd=str(tmp_path))
    assert lineage_requested({"OPENLINEAGE_URL": "http://x"}, cwd=str(tmp_path))
    assert not lineage_requested(
        {"OPENLINEAGE_URL": "http://x", "OPENLINEAGE_DISABLED": "true"}, cwd=str(tmp_path)
    )
    (tmp_path / "openlineage.yml").write_text("transport: {type: console}\n")
    assert lineage_requested({"HOME": str(tmp_path)}, cwd=str(tmp_path))
    probe = (
        "import sys\nfrom dpone.cli import main\ncode = main(['run', '--catalog', sys.argv[1], "
        "'--workload', 'orders', '--process', 'orders', '--no-progress'])\n"
        "print('OL_IMPORTED' if 'openlineage' in sys.modules else 'CLEAN', code)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "OPENLINEAGE"))}
    env["DPONE_CONN_WH"] = project["dsn"]
    done = subprocess.run(
        [sys.executable, "-c", probe, project["catalog"]],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.startswith("CLEAN"), done.stdout + done.stderr


@pytest.mark.parametrize(
    ("dsn", "schema", "table", "want"),
    [
        (
            "postgresql://u:pw@db.internal:6432/wh",
            "sales",
            "orders",
            DatasetName("postgres://db.internal:6432", "wh.sales.orders"),
        ),
        ("postgres://db/wh", None, "orders", DatasetName("postgres://db:5432", "wh.public.orders")),
        (
            "mysql://u:pw@my.host:3307/shop",
            None,
            "orders",
            DatasetName("mysql://my.host:3307", "shop.orders"),
        ),
        (
            "mariadb://u:pw@my.host/shop",
            "other",
            "orders",
            DatasetName("mysql://my.host:3306", "other.orders"),
        ),
        (
            "mssql://u:pw@sql.host:1444/dw?driver=x",
            "etl",
            "facts",
            DatasetName("mssql://sql.host:1444", "dw.etl.facts"),
        ),
        (
            "odbc://DRIVER={x};SERVER=sql.host,1435;DATABASE=dw;UID=u;PWD={p}",
            None,
            "facts",
            DatasetName("mssql://sql.host:1435", "dw.dbo.facts"),
        ),
    ],
)
def test_dataset_names_follow_the_openlineage_spec(
    dsn: str, schema: str | None, table: str, want: DatasetName
) -> None:
    got = dataset_name(dsn, schema, table)
    assert got == want
    assert "pw" not in got.namespace + got.name and "u:" not in got.namespace


def test_sqlite_is_named_as_a_local_file(tmp_path: Path) -> None:
    path = tmp_path / "demo.db"
    path.write_bytes(b"")
    got = dataset_name(f"sqlite:///{path}", None, "orders")
    assert got == DatasetName("file", f"{os.path.realpath(path)}/orders")
