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

from .receiver import receiver
from .runproject import PASSWORD, dpone_run

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


def test_run_events_with_datasets_chunk_range_and_parent(project: dict[str, Any]) -> None:
    catalog = project["catalog"]
    _, packs, problems = load_and_compile(catalog)
    assert not problems
    identity = expected_identity(packs[0], "orders")  # what the generated DAG passes
    dag = identity.dag_id
    env = {
        "DPONE_AIRFLOW_RUN_IDENTITY": identity.env_value(),
        "AIRFLOW_CTX_DAG_RUN_ID": "backfill__2026-12-01",
        "AIRFLOW_CTX_TASK_ID": "orders",
    }
    with receiver() as (url, got):
        failed = dpone_run(project, {"OPENLINEAGE_URL": url, **env})
        assert failed.returncode != 0 and "DPONE_SINK_FAILED" in failed.stderr
        with psycopg.connect(project["pg"], autocommit=True) as conn:
            conn.execute(f"UPDATE {project['schema']}.raw_orders SET amount = 1 WHERE amount < 0")
        passed = dpone_run(project, {"OPENLINEAGE_URL": url, **env})
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
    # both runs of the task share the parent run: the DAG run id drives it
    assert {e["run"]["facets"]["parent"]["run"]["runId"] for e in events} == {
        parent_of(env, dag, None)[0][2]  # type: ignore[index]
    }
    message = events[1]["run"]["facets"]["errorMessage"]["message"]
    assert message.startswith("DPONE_") and PASSWORD not in message
    assert events[3]["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"] == 100
    assert (
        "outputFacets" not in events[0]["outputs"][0] or not events[0]["outputs"][0]["outputFacets"]
    )


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
