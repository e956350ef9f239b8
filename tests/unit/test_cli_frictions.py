"""The small frictions of a first week, each checked through the real `dpone` entry point:
--catalog everywhere, "did you mean", every missing connection at once, preview refusing what
check refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dpone.cli import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "golden" / "internal_default" / "workloads.yaml")
SUMMARY = str(ROOT / "golden" / "summary_365_into_40" / "workloads.yaml")
GENERATOR_RULES = str(ROOT / "tests" / "invalid_catalogs" / "generator_rules" / "workloads.yaml")


def _last(err: str) -> dict[str, object]:
    record: dict[str, object] = json.loads(err.strip().splitlines()[-1])
    return record


@pytest.mark.parametrize("command", ["check", "preview"])
def test_check_and_preview_take_the_catalog_either_way(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, SUMMARY]) == 0
    positional = capsys.readouterr().out
    assert main([command, "--catalog", SUMMARY]) == 0
    assert capsys.readouterr().out == positional
    assert main([command, SUMMARY, "--catalog", SUMMARY]) == 0  # the same twice is fine
    capsys.readouterr()
    assert main([command, SUMMARY, "--catalog", DEMO]) == 2
    assert "give the catalog once" in capsys.readouterr().err
    assert main([command]) == 2
    assert _last(capsys.readouterr().err)["code"] == "DPONE_USAGE"


def test_generate_takes_the_catalog_as_an_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(ROOT / "golden" / "summary_365_into_40" / "expected")
    assert main(["generate", "--catalog", SUMMARY, "--out", out, "--check"]) == 0
    assert main(["generate", SUMMARY, "--out", out, "--check"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--catalog", SUMMARY, "--workload", "order_history"],
        ["verify", "--catalog", SUMMARY, "--workload", "order_history"],
        ["ledger", "status", "--catalog", SUMMARY, "--workload", "order_history"],
        ["preview", SUMMARY, "--workload", "order_history"],
    ],
    ids=["run", "verify", "ledger", "preview"],
)
def test_a_misspelled_workload_gets_a_suggestion(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    record = _last(capsys.readouterr().err)
    assert record["code"] == "DPONE_USAGE"
    assert record["message"] == (
        f"workload 'order_history' is not in {SUMMARY} (has: orders_history) "
        "(did you mean 'orders_history'?)"
    )


@pytest.mark.parametrize("command", [["run"], ["verify"], ["ledger", "status"]])
def test_a_misspelled_process_gets_a_suggestion(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*command, "--catalog", SUMMARY, "--workload", "orders_history", "--process", "order"]
    assert main(argv) == 2
    message = str(_last(capsys.readouterr().err)["message"])
    assert message.startswith("process 'order' is not in ")
    assert message.endswith("(has: orders) (did you mean 'orders'?)")


def test_no_suggestion_when_nothing_is_close(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--catalog", SUMMARY, "--workload", "zzz"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def _project(tmp_path: Path, manifest_extra: str = "", mapping: str = "") -> str:
    (tmp_path / "workloads.yaml").write_text(
        "schema: dpone.workload-catalog.v1\nworkloads:\n  orders:\n    manifest: orders.yaml\n"
        + (f"    airflow:\n      mapping: {mapping}\n" if mapping else "")
    )
    (tmp_path / "orders.yaml").write_text(
        "schema: dpone.pipeline.v1\nprocesses:\n  - name: orders\n"
        "    source: {connection: src, table: {name: raw}}\n"
        "    sink: {connection: dst, table: {name: orders}, keys: [id], strategy: {mode: backfill}}\n"
        "    backfill:\n"
        "      chunk: {column: d, type: date, start: 2024-01-01, end: 2024-01-03}\n"
        f"{manifest_extra}"
        "    state: {backend: audit_schema, connection: ledger}\n"
    )
    return str(tmp_path / "workloads.yaml")


def test_unknown_keys_get_a_suggestion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    catalog = _project(
        tmp_path, manifest_extra="      inner_mod: merge\n", mapping="{mode: summary, max_item: 2}"
    )
    assert main(["check", catalog]) == 1
    err = capsys.readouterr().err
    assert "unknown field 'inner_mod' (did you mean 'inner_mode'?)" in err
    assert "unknown mapping field 'max_item' (did you mean 'max_items'?)" in err


@pytest.mark.parametrize("command", [["run"], ["verify"]])
def test_every_missing_connection_is_reported_at_once(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: list[str],
) -> None:
    for name in ("SRC", "DST", "LEDGER"):
        monkeypatch.delenv(f"DPONE_CONN_{name}", raising=False)
    catalog = _project(tmp_path)
    assert main([*command, "--catalog", catalog, "--workload", "orders"]) == 3
    err = capsys.readouterr().err
    wanted = ["DST", "LEDGER", "SRC"] if command == ["run"] else ["DST", "SRC"]
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert [line.split("set DPONE_CONN_")[1].split()[0] for line in lines] == wanted
    assert _last(err)["code"] == "DPONE_CONNECTION_MISSING"
    monkeypatch.setenv("DPONE_CONN_SRC", "sqlite:///nowhere.db")
    assert main([*command, "--catalog", catalog, "--workload", "orders"]) == 3
    assert "DPONE_CONN_SRC" not in capsys.readouterr().err


def test_preview_refuses_what_check_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", GENERATOR_RULES]) == 1
    checked = [line for line in capsys.readouterr().err.splitlines() if "DPONE_" in line]
    assert main(["preview", GENERATOR_RULES]) == 1
    previewed = [line for line in capsys.readouterr().err.splitlines() if "DPONE_" in line]
    assert previewed == checked and len(checked) == 3


def test_run_help_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    text = capsys.readouterr().out
    codes = text[text.index("exit codes:") :]
    for code in ("0  passed", "1  a chunk failed", "2  usage", "3  refused", "4  transient", "5  "):
        assert f"  {code}" in codes, code
