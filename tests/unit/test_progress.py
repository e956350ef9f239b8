"""Chunk lines: rate and ETA from a controlled clock, text and JSON carrying the same facts."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from dpone import errors
from dpone.errors import DponeError
from dpone.observability.progress import ChunkLines, choose_progress, log_format
from dpone.observability.result import ChunkTiming


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lines(json_lines: bool) -> tuple[list[str], ChunkLines]:
    out, clock = io.StringIO(), Clock()
    sink = ChunkLines({1: ("2024-01-01", "2024-01-02"), 2: ("2024-01-02", "2024-01-03"), 3: ("2024-01-03", "2024-01-04"), 4: ("2024-01-04", "2024-01-05")}, out, json_lines, clock)  # fmt: skip
    sink.start(4, "w/p")
    sink.advance(0, 1, 0, 0, ChunkTiming(1, "skipped_resume"))
    clock.now += 2.0
    sink.advance(1, 1, 0, 500, ChunkTiming(2, "committed", 1, 500, "x", 2000))
    clock.now += 2.0
    sink.advance(1, 1, 1, 500, ChunkTiming(3, "failed", 1, None, None, 1500, "DPONE_SINK_FAILED"))
    sink.advance(1, 1, 1, 500, ChunkTiming(4, "not_started"))
    sink.finish()
    return out.getvalue().splitlines(), sink


def test_text_lines_show_range_rows_ms_outcome_rate_and_eta() -> None:
    lines, _ = _lines(json_lines=False)
    assert lines[0] == "dpone: w/p: 4 chunk(s) selected"
    # a resumed chunk moved nothing: no rate yet, no ETA
    assert lines[1].endswith("1/4 chunks, 0 rows, 0 rows/s, 0.00 chunks/s, ETA ?")
    assert lines[1].startswith("dpone: w/p: chunk 1 [2024-01-01, 2024-01-02) already committed |")
    # 1 chunk moved in 2 s: 0.5 chunks/s, 2 chunks left → ETA 4 s; 500 rows / 2 s
    assert lines[2] == (
        "dpone: w/p: chunk 2 [2024-01-02, 2024-01-03) committed, 500 rows, 2000 ms | "
        "2/4 chunks, 500 rows, 250 rows/s, 0.50 chunks/s, ETA 4s"
    )
    assert lines[3] == (
        "dpone: w/p: chunk 3 [2024-01-03, 2024-01-04) failed DPONE_SINK_FAILED, 1500 ms | "
        "3/4 chunks, 500 rows, 125 rows/s, 0.50 chunks/s, ETA 2s"
    )
    assert len(lines) == 5 and lines[4].startswith("dpone: w/p: end | 3/4 chunks")


def test_json_lines_carry_the_same_facts() -> None:
    lines, _ = _lines(json_lines=True)
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events] == ["start", "chunk", "chunk", "chunk", "end"]
    committed = events[2]
    assert committed == {
        "schema": "dpone.progress.v1",
        "label": "w/p",
        "event": "chunk",
        "index": 2,
        "start": "2024-01-02",
        "end": "2024-01-03",
        "outcome": "committed",
        "rows": 500,
        "duration_ms": 2000,
        "error_code": None,
        "done": 2,
        "total": 4,
        "committed": 1,
        "already_committed": 1,
        "failed": 0,
        "rows_total": 500,
        "elapsed_s": 2.0,
        "rows_per_s": 250.0,
        "chunks_per_s": 0.5,
        "eta_s": 4.0,
    }
    assert events[1]["eta_s"] is None


def test_long_etas_read_as_hours_and_minutes() -> None:
    out, clock = io.StringIO(), Clock()
    sink = ChunkLines({}, out, False, clock)
    sink.start(10001, "w/p")
    clock.now += 1.0
    sink.advance(1, 0, 0, 1, ChunkTiming(1, "committed", 1, 1, "x", 1000))
    assert out.getvalue().splitlines()[-1].endswith("ETA 2h46m40s")
    assert "(whole source)" in out.getvalue()


def test_log_format_and_off_terminal_choice() -> None:
    assert log_format({}) == "text" and log_format({"DPONE_LOG_FORMAT": "JSON"}) == "json"
    assert isinstance(choose_progress({}, io.StringIO(), "text"), ChunkLines)
    assert choose_progress({}, io.StringIO(), "json").json_lines


def test_log_format_accepts_any_case_and_blank_as_documented() -> None:
    """docs/cli.md states the lenient reading the code does: any case, blank means text."""
    row = next(
        line
        for line in (Path(__file__).parents[2] / "docs" / "cli.md").read_text().splitlines()
        if line.startswith("| `DPONE_LOG_FORMAT` |")
    )
    assert "any case" in row and "empty or blank means `text`" in row
    assert log_format({"DPONE_LOG_FORMAT": " Json "}) == "json"
    assert log_format({"DPONE_LOG_FORMAT": ""}) == log_format({"DPONE_LOG_FORMAT": "  "}) == "text"
    with pytest.raises(DponeError) as caught:
        log_format({"DPONE_LOG_FORMAT": "yaml"})
    assert caught.value.records[0].code == errors.USAGE and "'yaml'" in str(caught.value)
