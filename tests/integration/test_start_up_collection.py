"""The process's own `dpone run` holds the cyclic garbage collector off while it starts and
turns it back on, with start-up's objects frozen, before the first row moves
(dpone.lifecycle.collection). Real runs on SQLite (the demo project's backfill, and a full
refresh) through the CLI's entry, in this process, observed at start-up and at each write."""

from __future__ import annotations

import gc
import runpy
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dpone.cli import main
from dpone.connectors.base import Sink
from dpone.lifecycle import collection
from dpone.run import runner

ROOT = Path(__file__).resolve().parents[2]
CATALOG = str(ROOT / "golden" / "internal_default" / "workloads.yaml")
RUN = ["run", "--catalog", CATALOG, "--workload", "orders_history", "--no-progress"]


@pytest.fixture
def observed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[bool]]]:
    """The demo project seeded in tmp_path; the collector's state recorded when the pack is
    loaded (start-up) and at every chunk's write (rows moving). The test process's collector is
    restored at the end whatever the run did to it."""
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(ROOT / "scripts" / "demo_seed.py"))["seed"](tmp_path / "demo.db")
    monkeypatch.setenv("DPONE_CONN_DEMO", "sqlite:///demo.db")
    monkeypatch.setenv("DPONE_XCOM_PATH", str(tmp_path / "xcom.json"))
    seen: dict[str, list[bool]] = {"start-up": [], "moving": []}
    load, write, write_all = runner.load_workload_pack, Sink.write_chunk, Sink.write_all

    def loading(*args: Any, **kwargs: Any) -> Any:
        seen["start-up"].append(gc.isenabled())
        return load(*args, **kwargs)

    def writing(self: Sink, *args: Any, **kwargs: Any) -> Any:
        seen["moving"].append(gc.isenabled())
        return write(self, *args, **kwargs)

    def writing_all(self: Sink, *args: Any, **kwargs: Any) -> Any:
        seen["moving"].append(gc.isenabled())
        return write_all(self, *args, **kwargs)

    monkeypatch.setattr(runner, "load_workload_pack", loading)
    monkeypatch.setattr(Sink, "write_chunk", writing)
    monkeypatch.setattr(Sink, "write_all", writing_all)
    try:
        yield seen
    finally:
        gc.unfreeze()
        gc.enable()
        collection._held["off"] = False


def test_the_process_own_run_collects_again_before_the_first_row_moves(
    observed: dict[str, list[bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["dpone", *RUN])
    assert main() == 0
    assert observed["start-up"] == [False]
    assert observed["moving"] and all(observed["moving"]), observed
    assert gc.get_freeze_count() > 0  # start-up's objects were kept out of later collections


def test_a_full_refresh_collects_again_before_it_writes(
    observed: dict[str, list[bool]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "refresh.yaml").write_text(
        "schema: dpone.pipeline.v1\n"
        "processes:\n"
        "  - name: orders\n"
        "    source: {connection: demo, table: {name: raw_orders}}\n"
        "    sink: {connection: demo, table: {name: orders}, strategy: {mode: full_refresh}}\n",
        encoding="utf-8",
    )
    (tmp_path / "refresh_catalog.yaml").write_text(
        "schema: dpone.workload-catalog.v1\n"
        "workloads:\n"
        "  refresh: {manifest: refresh.yaml, airflow: {image: example/dpone:1}}\n",
        encoding="utf-8",
    )
    run = ["run", "--catalog", "refresh_catalog.yaml", "--workload", "refresh", "--no-progress"]
    monkeypatch.setattr(sys, "argv", ["dpone", *run])
    assert main() == 0
    assert observed == {"start-up": [False], "moving": [True]}
    with sqlite3.connect(tmp_path / "demo.db") as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (2400,)


def test_a_run_called_in_process_leaves_the_collector_alone(
    observed: dict[str, list[bool]],
) -> None:
    assert main(RUN) == 0
    assert observed == {"start-up": [True], "moving": observed["moving"]}
    assert observed["moving"] and all(observed["moving"])
    assert gc.get_freeze_count() == 0


def test_a_collector_its_caller_turned_off_stays_off() -> None:
    gc.disable()
    try:
        collection.hold_while_starting()
        collection.collect_from_here()
        assert not gc.isenabled()
        assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_collecting_again_without_a_hold_changes_nothing() -> None:
    assert gc.isenabled()
    collection.collect_from_here()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    collection.hold_while_starting()
    assert not gc.isenabled()
    collection.collect_from_here()
    collection.collect_from_here()  # the second mover of a multi-process run: nothing more
    try:
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
