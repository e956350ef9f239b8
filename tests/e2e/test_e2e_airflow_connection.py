"""subprocess flavour: a connection kept as an Airflow Connection, resolved by the generated
operator at execute time under real Airflow (`dag.test()`, 3.3.2 and 2.10.5) and handed to the
real `dpone run` in its environment only.

The worker has no DPONE_CONN_E2E: the Connection `dpone_e2e` (Airflow's environment secrets
backend, AIRFLOW_CONN_DPONE_E2E) is the only source of the DSN. Its password is a planted secret
(the shared Postgres trusts local connections, so the run connects): it must not appear in the task
log, the XCom result or the generated file.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import e2ekit
import psycopg
import pytest

VERSIONS = ["3.3.2", "2.10.5"]
pytestmark = [pytest.mark.postgres, pytest.mark.airflow]


@pytest.fixture  # per version: each run starts a fresh campaign
def e2e_db(pg_dsn: str) -> Iterator[str]:
    with e2ekit.private_database(pg_dsn, prefix="dpone_afconn_e2e") as dsn:
        e2ekit.seed(dsn)
        yield dsn


def _project(root: Path) -> Path:
    """The e2e project's internal workload, cut to 5 days, taking e2e from an Airflow Connection."""
    catalog = e2ekit.copy_project(root / "project")
    text = catalog.read_text(encoding="utf-8")
    anchor = "      dag_id: dpone_e2e_orders_internal\n"
    assert anchor in text
    text = text.replace(
        anchor, anchor + "      airflow_connections: [{connection: e2e, conn_id: dpone_e2e}]\n"
    )
    catalog.write_text(text, encoding="utf-8")
    manifest = catalog.with_name("orders_internal.yaml")
    text = manifest.read_text(encoding="utf-8")
    assert "end: 2024-01-01" in text
    manifest.write_text(text.replace("end: 2024-01-01", "end: 2023-01-06"), encoding="utf-8")
    return catalog


@pytest.mark.parametrize("version", VERSIONS)
def test_airflow_connection_reaches_dpone_run_only(
    version: str, e2e_db: str, tmp_path: Path
) -> None:
    python = e2ekit.airflow_python(version)
    catalog = _project(tmp_path)
    out = tmp_path / "dags"
    generated = e2ekit.dpone("generate", str(catalog), "--out", str(out))
    assert generated.returncode == 0, generated.stderr
    dag_file = out / f"{e2ekit.INTERNAL_DAG}.py"
    secret = "AfConn-" + uuid.uuid4().hex[:10] + "/@:?#%"
    info = psycopg.conninfo.conninfo_to_dict(e2ekit.as_url(e2e_db))
    uri = (
        f"postgresql://{info.get('user', 'postgres')}:{quote(secret, safe='')}@"
        f"{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{info['dbname']}"
    )
    facts = e2ekit.harness(
        python,
        {"AIRFLOW_CONN_DPONE_E2E": uri},
        "dagtest",
        "--home",
        str(tmp_path / "airflow-home"),
        "--dag-file",
        str(dag_file),
    )
    assert facts["import_errors"] == {}, facts["import_errors"]
    (ti,) = [t for t in facts["task_instances"] if t["task_id"] == e2ekit.TASK]
    assert ti["state"] == "success", facts["_log_tail"]
    result = facts["xcom"][f"{e2ekit.TASK}[-1]"]
    assert result["status"] == "passed" and result["backfill"]["chunks_committed"] == 5, result
    with psycopg.connect(e2ekit.as_url(e2e_db)) as conn:
        row = conn.execute("SELECT count(*) FROM e2e.orders_internal").fetchone()
    assert row is not None and row[0] == 5 * e2ekit.ROWS_PER_DAY
    shown = "\n".join(
        [str(facts), dag_file.read_text(encoding="utf-8"), generated.stdout, generated.stderr]
    )
    for needle in (secret, quote(secret, safe="")):
        assert needle not in shown
