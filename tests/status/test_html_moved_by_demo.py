"""`dpone ledger status --html` names who moved each chunk, as text and JSON do, on a real ledger.

The internal_default golden project (SQLite data, local_file ledger) runs outside Airflow, its
chunks 3-5 are restated and moved again by a run with DPONE_AIRFLOW_CONTEXT; the page must show
the three runs of chunks with the run id, try and map index, or outside Airflow. Regressions: the
page showed none of it, and its header said "9 chunks · 1 rows" (the grid's rows of 50 chunks,
read as the rows moved) for a campaign that moved 2,400 rows.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DPONE = ROOT / ".venv" / "bin" / "dpone"
GOLDEN = ROOT / "golden" / "internal_default"
# printable, so the context accepts it, and markup, so the page must escape it
RUN_ID = 'manual__2026-01-02T03:04:05+00:00<b>&"'
CONTEXT = {
    "schema": "dpone.airflow-context.v1",
    "dag_id": "dpone_orders_history",
    "task_id": "run_orders",
    "run_id": RUN_ID,
    "try_number": 3,
    "map_index": -1,
    "logical_date": "2026-01-02T03:04:05+00:00",
    "data_interval_start": None,
    "data_interval_end": None,
}
CATALOG = ("--catalog", "workloads.yaml", "--workload", "orders_history")
RUN = ("run", *CATALOG, "--no-progress")
STATUS = ("ledger", "status", *CATALOG)


@pytest.fixture
def demo(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    for name in ("workloads.yaml", "orders_history.yaml"):
        shutil.copy(GOLDEN / name, tmp_path / name)
    database = tmp_path / ".dpone-demo" / "demo.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPONE_", "PYTHONIO"))}
    env["DPONE_CONN_DEMO"] = f"sqlite:///{database}"
    env["DPONE_XCOM_PATH"] = str(tmp_path / "xcom" / "return.json")
    env["DPONE_EVIDENCE_DIR"] = str(tmp_path / "evidence")
    seeded = subprocess.run(
        [str(DPONE.with_name("python")), str(ROOT / "scripts" / "demo_seed.py"), str(database)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert seeded.returncode == 0, seeded.stderr
    return tmp_path, env


def _dpone(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(DPONE), *args],
        check=False,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def _moved_by_rows(page: str) -> list[list[str]]:
    """The cells of the page's "Who moved the chunks" table, row by row, unescaped."""
    table = page.split("<h3>Who moved the chunks</h3>", 1)[1].split("</table>", 1)[0]
    return [
        [html.unescape(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", table)[1:]
    ]


def _html(folder: Path, env: dict[str, str], name: str) -> str:
    _dpone(folder, env, *STATUS, "--html", name)
    return (folder / name).read_text(encoding="utf-8")


def test_html_names_the_run_that_moved_each_chunk_in_and_outside_airflow(
    demo: tuple[Path, dict[str, str]],
) -> None:
    folder, env = demo
    _dpone(folder, env, *RUN)
    page = _html(folder, env, "local.html")
    assert _moved_by_rows(page) == [["1-9", "committed", "outside Airflow"]]
    assert "· 9 chunks · one runtime task, as of " in page and "1 rows" not in page

    _dpone(folder, env, "ledger", "restate", *CATALOG, "--chunks", "3-5", "--reason", "fixed")
    airflow = dict(env, DPONE_AIRFLOW_CONTEXT=json.dumps(CONTEXT))
    _dpone(folder, airflow, *RUN)
    page = _html(folder, env, "mixed.html")
    assert _moved_by_rows(page) == [
        ["1-2", "committed", "outside Airflow"],
        ["3-5", "committed", RUN_ID, "3", "-1"],
        ["6-9", "committed", "outside Airflow"],
    ]
    # the same runs of chunks and the same words as the JSON's moved_by and the text
    doc: dict[str, Any] = json.loads(_dpone(folder, env, *STATUS, "--format", "json").stdout)
    assert [(g["first_chunk_index"], g["last_chunk_index"], g["by"]) for g in doc["moved_by"]] == [
        (1, 2, {"outside_airflow": True}),
        (3, 5, {"outside_airflow": False, "run_id": RUN_ID, "try_number": 3, "map_index": -1}),
        (6, 9, {"outside_airflow": True}),
    ]
    text = _dpone(folder, env, *STATUS).stdout
    assert f"  committed: chunks 3-5 by run {RUN_ID}, try 3, map index -1\n" in text, text
    # escaped, and the same ledger gives the same page apart from its as-of time
    assert "<b>&" not in page and html.escape(RUN_ID) in page
    again = _html(folder, env, "again.html")
    as_of = re.compile(r", as of [^<]+</p>")
    assert as_of.sub("", again) == as_of.sub("", page)
