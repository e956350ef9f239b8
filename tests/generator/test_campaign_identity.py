"""A campaign is its run key (ADR 0020): `dpone preview --previous` and `generate --check` match
the previous plan's campaigns by key, not by process, workload or DAG name; a workload whose name
begins another's is never taken for it; a previous campaign no process runs any more is named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dpone.campaign.campaign_change import prior_campaigns
from dpone.cli import main

AIRFLOW = """\
    airflow:
      image: registry.example.com/dpone-runtime:0.1.0
      secrets: [{connection: warehouse, secret: dpone-conn-warehouse, key: dsn}]
      mapping: {mode: summary, max_items: 4, max_active: 2, pool: dpone_backfill}"""
PROCESS = """\
  - name: {name}
    source: {{connection: warehouse, table: {{schema: raw, name: {table}}}}}
    sink:
      connection: warehouse
      table: {{schema: analytics, name: {table}}}
      keys: [order_id]
      strategy: {{mode: backfill}}
    backfill:
{pin}      chunk: {{column: order_date, type: date, start: 2024-01-01, end: {end}}}
      inner_mode: replace
    state: {{backend: audit_schema, connection: warehouse, schema: dpone_audit, require_distributed_lock: true}}
"""


def process(name: str, table: str, end: str = "2024-01-09", key: str | None = None) -> str:
    """One chunked process; ``key`` pins its backfill_id, else its run key is derived."""
    pin = f"      backfill_id: {key}\n" if key else ""
    return PROCESS.format(name=name, table=table, end=end, pin=pin)


def write(
    root: Path, workloads: dict[str, list[str]], dag_ids: dict[str, str] | None = None
) -> str:
    """A catalog of ``workloads`` (name -> its processes), each in its own manifest."""
    catalog = ["schema: dpone.workload-catalog.v1", "workloads:"]
    for name, processes in workloads.items():
        catalog += [f"  {name}:", f"    manifest: {name}.yaml", AIRFLOW]
        if name in (dag_ids or {}):
            catalog.append(f"      dag_id: {(dag_ids or {})[name]}")
        manifest = "schema: dpone.pipeline.v1\nprocesses:\n" + "".join(processes)
        (root / f"{name}.yaml").write_text(manifest, encoding="utf-8")
    (root / "workloads.yaml").write_text("\n".join(catalog) + "\n", encoding="utf-8")
    return str(root / "workloads.yaml")


def generate(capsys: pytest.CaptureFixture[str], catalog: str, dags: Path) -> None:
    assert main(["generate", catalog, "--out", str(dags)]) == 0
    capsys.readouterr()


def preview(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict[str, Any], str]:
    """The JSON document and the text of `dpone preview ARGS`."""
    assert main(["preview", *args, "--format", "json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert main(["preview", *args]) == 0
    return doc, capsys.readouterr().out


def verdicts(doc: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """workload/process -> (change, detail)."""
    return {
        f"{w['name']}/{p['name']}": (p["campaign"]["change"], p["campaign"]["detail"])
        for w in doc["workloads"]
        for p in w["processes"]
    }


def check(capsys: pytest.CaptureFixture[str], catalog: str, dags: Path) -> tuple[str, list[Any]]:
    """`generate --check`'s campaigns summary line (or "") and its JSON campaigns."""
    code = main(["generate", catalog, "--out", str(dags), "--check"])
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("  campaigns: ")]
    assert main(["generate", catalog, "--out", str(dags), "--check", "--format", "json"]) == code
    campaigns: list[Any] = json.loads(capsys.readouterr().out)["campaigns"]
    return (lines[0] if lines else ""), campaigns


def test_a_workload_whose_name_begins_another_is_not_taken_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dags = tmp_path / "dags"
    both = {
        "orders": [process("orders", "orders")],
        "orders_history": [process("orders", "orders_hist", key="hist-1")],
    }
    generate(capsys, write(tmp_path, both), dags)
    later = {
        "orders": [process("orders", "orders", end="2024-01-13")],
        "orders_history": [process("orders", "orders_hist", end="2024-01-13", key="hist-1")],
    }
    catalog = write(tmp_path, later)

    doc, text = preview(capsys, catalog, "--previous", str(dags / "orders_history.py"))
    found = verdicts(doc)
    assert found["orders/orders"] == ("new", "no previous plan names this process")
    assert found["orders_history/orders"][0] == "extends"
    assert "hist-1" not in text.split("workload orders_history")[0]  # orders' block
    assert doc["left_behind"] == [] and "left behind" not in text

    # hist-1 is held by no process now: only orders_history, whose file it is, replaces it.
    later["orders_history"] = [process("orders", "orders_hist", end="2024-01-13", key="hist-2")]
    catalog = write(tmp_path, later)
    for previous in (dags / "orders_history.py", dags):
        found = verdicts(preview(capsys, catalog, "--previous", str(previous))[0])
        assert found["orders/orders"][0] == ("new" if previous.is_file() else "replaces")
        assert "hist-1" not in found["orders/orders"][1]
        assert found["orders_history/orders"][0] == "replaces"
        assert "a new campaign hist-2 replaces hist-1" in found["orders_history/orders"][1]


def test_the_workload_is_the_whole_header_line() -> None:
    text = (
        "# Generated by dpone — do not edit.\n# workload: orders_history\n"
        f"# campaign orders: run_key hist-1, 8 chunks, plan sha256:{'0' * 64}\n"
        "x = 1\n# workload: orders\n"
    )
    (prior,) = prior_campaigns(text).values()
    assert (prior.workload, prior.process, prior.run_key, prior.dag_id) == (
        "orders_history",
        "orders",
        "hist-1",
        None,
    )
    assert prior_campaigns(text, "orders_history")["orders"].dag_id == "orders_history"


@pytest.mark.parametrize("empty", ["", "   "])
def test_an_empty_previous_path_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], empty: str
) -> None:
    catalog = write(tmp_path, {"orders": [process("orders", "orders")]})
    for output in ("text", "json"):
        assert main(["preview", catalog, "--previous", empty, "--format", output]) == 2
        captured = capsys.readouterr()
        assert "DPONE_USAGE" in captured.err and "--previous" in captured.err
        assert captured.out == ""


@pytest.mark.parametrize(
    ("workload", "name", "dag_id"),
    [
        ("orders_history", "orders_v2", None),
        ("history", "orders", "history_v2"),
        ("orders_history", "orders", None),
    ],
    ids=["process", "workload-and-dag", "no-rename"],
)
def test_a_rename_that_keeps_the_run_key_keeps_the_campaign(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    workload: str,
    name: str,
    dag_id: str | None,
) -> None:
    dags = tmp_path / "dags"
    before = {"orders_history": [process("orders", "orders_hist", key="hist-1")]}
    generate(capsys, write(tmp_path, before), dags)
    dag_ids = {workload: dag_id} if dag_id else None
    catalog = write(tmp_path, {workload: [process(name, "orders_hist", key="hist-1")]}, dag_ids)
    renamed = (workload, name) != ("orders_history", "orders")
    kept = "the same campaign and plan" + (
        "; the previous plan ran hist-1 as orders_history/orders" if renamed else ""
    )
    for previous in (dags, dags / "orders_history.py"):
        doc, text = preview(capsys, catalog, "--previous", str(previous))
        assert verdicts(doc) == {f"{workload}/{name}": ("keeps", kept)}
        assert f"    campaign         hist-1  KEEPS: {kept}\n" in text
        assert doc["left_behind"] == [] and "left behind" not in text
    assert check(capsys, catalog, dags) == ("", [])

    longer = {workload: [process(name, "orders_hist", end="2024-01-13", key="hist-1")]}
    catalog = write(tmp_path, longer, dag_ids)
    change, detail = verdicts(preview(capsys, catalog, "--previous", str(dags))[0])[
        f"{workload}/{name}"
    ]
    assert change == "extends" and detail.startswith("extends 8 -> 12 chunks; committed")
    line, campaigns = check(capsys, catalog, dags)
    assert [(c["workload"], c["process"], c["change"]) for c in campaigns] == [
        (workload, name, "extends")
    ]
    assert line == f"  campaigns: {workload}/{name} EXTENDS: {detail}"


def test_a_campaign_replaced_with_a_rename_is_left_behind_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dags = tmp_path / "dags"
    generate(capsys, write(tmp_path, {"orders": [process("orders", "orders")]}), dags)
    old_key = prior_campaigns((dags / "orders.py").read_text(encoding="utf-8"))["orders"].run_key
    # A new window (so a new derived key) and a new process name at once.
    catalog = write(tmp_path, {"orders": [process("orders_v2", "orders", end="2024-01-13")]})

    for previous in (dags, dags / "orders.py"):
        doc, text = preview(capsys, catalog, "--previous", str(previous))
        assert verdicts(doc)["orders/orders_v2"][0] == "new"
        (left,) = doc["left_behind"]
        assert left["workload"] == "orders" and left["process"] == "orders"
        assert left["change"] == "leaves" and left["previous"] == {"run_key": old_key, "chunks": 8}
        assert "committed chunks are not reused" in left["detail"]
        assert text.endswith(
            f"previous campaigns left behind\n  campaign orders/orders  LEAVES: {left['detail']}\n"
        )

    line, campaigns = check(capsys, catalog, dags)
    assert [(c["workload"], c["process"], c["change"]) for c in campaigns] == [
        ("orders", "orders", "leaves")
    ]
    assert line == f"  campaigns: orders/orders LEAVES: {campaigns[0]['detail']}"
    assert old_key in line and "committed chunks are not reused" in line


def test_a_workload_removed_leaves_its_campaigns_and_only_its_own_are_shown_for_one_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dags = tmp_path / "dags"
    three = {
        "archive": [process("orders", "orders_archive", key="arch-1")],
        "orders": [process("orders", "orders", key="ord-1")],
        "sessions": [process("sessions", "sessions", key="ses-1")],
    }
    generate(capsys, write(tmp_path, three), dags)
    # archive is gone; sessions takes a new campaign under a new process name.
    catalog = write(
        tmp_path,
        {
            "orders": [process("orders", "orders", key="ord-1")],
            "sessions": [process("sessions_v2", "sessions", key="ses-2")],
        },
    )
    doc, text = preview(capsys, catalog, "--previous", str(dags))
    assert [(x["workload"], x["previous"]["run_key"]) for x in doc["left_behind"]] == [
        ("archive", "arch-1"),
        ("sessions", "ses-1"),
    ]
    assert text.count("LEAVES: ") == 2
    line, campaigns = check(capsys, catalog, dags)
    assert [(c["workload"], c["change"]) for c in campaigns] == [
        ("archive", "leaves"),
        ("sessions", "leaves"),
    ]
    assert line.index("archive/orders LEAVES: ") < line.index("sessions/sessions LEAVES: ")

    # One workload: its own, and those of a workload the catalog no longer has (its past, maybe).
    doc, _ = preview(capsys, catalog, "--workload", "orders", "--previous", str(dags))
    assert [x["workload"] for x in doc["left_behind"]] == ["archive"]
    doc, _ = preview(capsys, catalog, "--workload", "sessions", "--previous", str(dags))
    assert [x["workload"] for x in doc["left_behind"]] == ["archive", "sessions"]


def test_a_key_another_process_now_holds_is_not_said_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dags = tmp_path / "dags"
    before = [process("a", "ta", key="k1"), process("b", "tb", key="k2")]
    generate(capsys, write(tmp_path, {"w": before}), dags)
    catalog = write(tmp_path, {"w": [process("a", "ta", key="k2"), process("b", "tb", key="k3")]})
    doc, _ = preview(capsys, catalog, "--previous", str(dags))
    found = verdicts(doc)
    assert found["w/a"] == ("keeps", "the same campaign and plan; the previous plan ran k2 as w/b")
    assert found["w/b"][0] == "new"  # k2 goes on under a: b replaces nothing
    assert [x["previous"]["run_key"] for x in doc["left_behind"]] == ["k1"]
