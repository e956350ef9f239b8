"""`dpone ledger status` as a picture: the HTML page in a real headless Chromium, and the terminal grid.

The page is built from a real compiled pack (a 240-chunk summary campaign in 12 mapped items) and
a ledger made of dpone.ledger.port records with known states; Chromium (Debian's package) takes
a screenshot, and a small stdlib PNG decoder counts the pixels of each state colour.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import html
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest
from dpone.campaign.status import (
    ANSI,
    GLYPH,
    STATE_COLOURS,
    render_html,
    render_html_page,
    render_text,
    status_document,
)
from dpone.ledger.port import Amendment, CampaignShape, ChunkRecord, ChunkState, Ledger
from dpone.observability.reporting import use_colour
from dpone.packing.pack import ProcessPlan, WorkloadPack, load_and_compile

ROOT = Path(__file__).resolve().parents[2]
NOW = dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC)
# 240 chunks: the proportions the screenshot must show (10 : 2 : 3 : 5).
COUNTS = {"committed": 120, "running": 24, "failed": 36, "pending": 60}

CATALOG = """\
schema: dpone.workload-catalog.v1
workloads:
  orders_history:
    manifest: orders.yaml
    airflow:
      image: registry.example.com/dpone-runtime:0.1.0
      mapping: {mode: summary, max_items: 12, max_active: 4, pool: dpone_backfill}
"""
MANIFEST = """\
schema: dpone.pipeline.v1
processes:
  - name: orders
    source: {connection: warehouse, table: {schema: raw, name: orders}}
    sink:
      connection: warehouse
      table: {schema: analytics, name: orders}
      strategy: {mode: backfill}
    backfill:
      chunk: {column: order_date, type: date, start: 2023-01-01, end: 2023-08-29}
    state: {backend: audit_schema, connection: warehouse, require_distributed_lock: true}
"""


# --- a tiny PNG decoder (8-bit RGB/RGBA, non-interlaced), standard library only ------------------


def decode_png(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """(width, height, row-major RGB pixels) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour not in (2, 6) or interlace != 0:
                raise ValueError(
                    f"unsupported PNG: depth {depth} colour {colour} interlace {interlace}"
                )
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = width * channels
    previous = bytearray(stride)
    pixels: list[tuple[int, int, int]] = []
    offset = 0
    for _ in range(height):
        kind = raw[offset]
        line = bytearray(raw[offset + 1 : offset + 1 + stride])
        offset += 1 + stride
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            upper_left = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                p = left + up - upper_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - upper_left)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else upper_left)
                line[i] = (line[i] + pred) & 0xFF
            elif kind != 0:
                raise ValueError(f"bad PNG filter {kind}")
        pixels.extend((line[i], line[i + 1], line[i + 2]) for i in range(0, stride, channels))
        previous = line
    return width, height, pixels


def _png(width: int, height: int, rows: list[bytes], channels: int = 3) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2 if channels == 3 else 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


def test_png_decoder_undoes_every_filter() -> None:
    """Known pixels through filters 0..4 (RGB and RGBA) come back exactly."""
    width = 3
    truth = [[(10 * x + y, 200 - x, 7 * y) for x in range(width)] for y in range(5)]
    rows = []
    previous = [0] * (width * 3)
    for y, filter_kind in enumerate((0, 1, 2, 3, 4)):
        line = [v for px in truth[y] for v in px]
        encoded = []
        for i, value in enumerate(line):
            left = line[i - 3] if i >= 3 else 0
            up = previous[i]
            upper_left = previous[i - 3] if i >= 3 else 0
            pred = 0
            if filter_kind == 1:
                pred = left
            elif filter_kind == 2:
                pred = up
            elif filter_kind == 3:
                pred = (left + up) >> 1
            elif filter_kind == 4:
                p = left + up - upper_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - upper_left)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else upper_left)
            encoded.append((value - pred) & 0xFF)
        rows.append(bytes([filter_kind, *encoded]))
        previous = line
    w, h, pixels = decode_png(_png(width, 5, rows))
    assert (w, h) == (3, 5)
    assert pixels == [px for row in truth for px in row]
    rgba_rows = [bytes([0, 1, 2, 3, 255, 4, 5, 6, 128])]
    assert decode_png(_png(2, 1, rgba_rows, channels=4))[2] == [(1, 2, 3), (4, 5, 6)]


# --- the campaign under test --------------------------------------------------------------------


def _compile(tmp_path: Path) -> tuple[WorkloadPack, ProcessPlan]:
    (tmp_path / "workloads.yaml").write_text(CATALOG, encoding="utf-8")
    (tmp_path / "orders.yaml").write_text(MANIFEST, encoding="utf-8")
    _, packs, problems = load_and_compile(str(tmp_path / "workloads.yaml"))
    assert not problems, problems
    pack = packs[0]
    plan = pack.processes[0]
    assert plan.chunks_total == 240 and plan.mapping_plan is not None
    assert plan.mapping_plan.items_total == 12
    return pack, plan


def _ledger(plan: ProcessPlan, expired: int = 0, cancelled: bool = False) -> Ledger:
    """Chunks 1..120 committed, 121..144 running, 145..180 failed, the rest pending."""
    assert plan.run_key is not None and plan.backfill_plan_hash is not None
    shape = CampaignShape(
        plan.run_key,
        "orders_history",
        plan.name,
        plan.backfill_plan_hash,
        plan.config_hash,
        plan.chunks,
    )
    records: dict[int, ChunkRecord] = {}
    running_first = COUNTS["committed"] + 1
    failed_first = running_first + COUNTS["running"]
    pending_first = failed_first + COUNTS["failed"]
    for chunk in plan.chunks:
        i = chunk.index
        if i < running_first:
            records[i] = ChunkRecord(i, ChunkState.COMMITTED, 1, chunk.idempotency_key, rows=10)
        elif i < failed_first:
            stale = i < running_first + expired
            records[i] = ChunkRecord(
                i,
                ChunkState.RUNNING,
                2,
                chunk.idempotency_key,
                lease_owner=f"pod-{i}:1:abc",
                lease_expires_at=NOW + dt.timedelta(minutes=-5 if stale else 5),
            )
        elif i < pending_first:
            records[i] = ChunkRecord(
                i,
                ChunkState.FAILED,
                1,
                chunk.idempotency_key,
                error_code="DPONE_SINK_FAILED",
                error_message="<script>alert(1)</script> duplicate key",
            )
    return Ledger(shape, records, cancelled=cancelled, cancel_reason=None, now=NOW)


@pytest.fixture
def campaign(tmp_path: Path) -> dict[str, Any]:
    pack, plan = _compile(tmp_path)
    return status_document(pack, plan, _ledger(plan, expired=2))


def test_status_document_counts_and_groups(campaign: dict[str, Any]) -> None:
    assert campaign["counts"] == COUNTS
    assert [len(g["states"]) for g in campaign["items"]] == [20] * 12
    assert campaign["items"][0]["label"] == "item 0 chunks 1-20 [2023-01-01 .. 2023-01-21)"
    assert len(campaign["running_leases"]) == COUNTS["running"]
    assert [x["expired"] for x in campaign["running_leases"][:3]] == [True, True, False]
    assert len(campaign["failures"]) == COUNTS["failed"]
    assert campaign["as_of"] == NOW.isoformat()


def test_status_names_the_failed_and_stuck_items_to_clear(campaign: dict[str, Any]) -> None:
    """Chunks 121-122 hold expired leases (item 6), chunks 145-180 failed (items 7 and 8); the
    chunks of items 6 still running on live leases need no retry."""
    clear = campaign["airflow_clear"]
    assert clear["failed_map_indexes"] == [7, 8] and clear["stuck_map_indexes"] == [6]
    assert clear["command"] == (
        "airflow tasks clear orders_history --task-regex '^run_orders$' --only-failed --yes"
    )
    text = render_text(campaign, colour=False)
    assert (
        "  retry in Airflow (failed map indexes 7, 8; stuck (lease expired) map indexes 6):\n"
        f"    {clear['command']}\n" in text
    )
    assert html.escape(clear["command"]) in render_html(campaign)


def test_chunks_held_by_a_live_transaction_show_as_running_by_their_holder(tmp_path: Path) -> None:
    """The one-commit placement (ADR 0021): a chunk being moved has no committed RUNNING record;
    the ledger store names who holds its lock, and status shows it running by that holder."""
    pack, plan = _compile(tmp_path)
    who = "dpone-ledger pid 4242 (transaction since 2024-05-01T11:59:00+00:00)"
    held = {5: "a restate holding a committed chunk", 150: who, 200: who}
    doc = status_document(pack, plan, _ledger(plan), held=held)
    assert doc["counts"] == {
        "committed": COUNTS["committed"],
        "running": COUNTS["running"] + 2,
        "failed": COUNTS["failed"] - 1,
        "pending": COUNTS["pending"] - 1,
    }
    mine = [x for x in doc["running_leases"] if x.get("in_transaction")]
    assert [(x["chunk_index"], x["owner"]) for x in mine] == [(150, who), (200, who)]
    assert 150 not in {x["chunk_index"] for x in doc["failures"]}  # being retried now
    text = render_text(doc, colour=False)
    assert f"  lease: chunk 200 held by {who}: moving in one transaction" in text
    assert "while its transaction lives" in render_html(doc)


# --- HTML ---------------------------------------------------------------------------------------


def test_html_is_self_contained_and_escaped(campaign: dict[str, Any]) -> None:
    page = render_html(campaign)
    lowered = page.lower()
    for external in ("http://", "https://", "<script", "src=", "url(", "@import", "<link"):
        assert external not in lowered, f"{external!r} in a page that must be self-contained"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert page.count('class="cell committed') == COUNTS["committed"] + 1  # + the legend swatch
    assert page.count('class="cell failed') == COUNTS["failed"] + 1
    assert page.count("expired") >= 2 and "yes: retryable" in page


def test_html_page_holds_every_process(tmp_path: Path, campaign: dict[str, Any]) -> None:
    second = dict(campaign, process="orders_again")
    page = render_html_page([campaign, second])
    assert page.count("<section>") == 2 and "orders_again" in page


def test_html_cancelled_and_empty_campaigns(tmp_path: Path) -> None:
    pack, plan = _compile(tmp_path)
    cancelled = render_html(status_document(pack, plan, _ledger(plan, cancelled=True)))
    assert "cancelled" in cancelled and "dpone ledger cancel --undo" in cancelled
    empty = render_html(status_document(pack, plan, None))
    assert "No ledger yet" in empty and empty.count('class="cell pending') == 241


def test_extensions_and_cancel_reason_in_text_json_and_html(tmp_path: Path) -> None:
    pack, plan = _compile(tmp_path)
    ledger = _ledger(plan, cancelled=True)
    ledger = Ledger(ledger.shape, ledger.records, True, "<i>source</i> reloaded", now=NOW)
    amendment = Amendment(
        plan.run_key or "", "sha256:old", "sha256:new", 200, 240, "pod-7:1:abc", NOW
    )
    doc = status_document(pack, plan, ledger, [amendment])
    assert doc["cancel_reason"] == "<i>source</i> reloaded"
    assert doc["amendments"] == [
        {
            "old_chunk_count": 200,
            "new_chunk_count": 240,
            "old_plan_hash": "sha256:old",
            "new_plan_hash": "sha256:new",
            "amended_by": "pod-7:1:abc",
            "amended_at": NOW.isoformat(),
        }
    ]
    text = render_text(doc, colour=False)
    assert "[CANCELLED: <i>source</i> reloaded]" in text
    assert f"extended: 200 -> 240 chunks at {NOW.isoformat()} by pod-7:1:abc" in text
    page = render_html(doc)
    assert "(&lt;i&gt;source&lt;/i&gt; reloaded)" in page and "<i>source" not in page
    assert "<h3>Extensions</h3>" in page and "200 &rarr; 240" in page
    # an extending run's lease owner is said as `moved_by` says it
    by_airflow = Amendment(
        plan.run_key or "", "sha256:old", "sha256:new", 200, 240,
        "airflow try=2 map=5 run=scheduled__2026 on vm:1:abc", NOW,
    )  # fmt: skip
    locally = Amendment(
        plan.run_key or "", "sha256:new", "sha256:more", 240, 250, "local on vm:1:abc", NOW
    )
    text = render_text(status_document(pack, plan, ledger, [by_airflow, locally]), colour=False)
    assert (
        "240 chunks at " + NOW.isoformat() + " by run scheduled__2026, try 2, map index 5" in text
    )
    assert "250 chunks at " + NOW.isoformat() + " outside Airflow" in text
    plain = render_html(status_document(pack, plan, _ledger(plan)))
    assert "Extensions" not in plain and "extended:" not in render_text(
        status_document(pack, plan, _ledger(plan)), colour=False
    )


RUN_A = "scheduled__2024-05-01T00:00:00+00:00"
HOSTILE = 'manual__<script>alert("x")</script>&\u202e'


def _attributed(plan: ProcessPlan) -> Ledger:
    """The campaign of :func:`_ledger` with lease owners as runs write them: chunks 1-40 by run
    RUN_A (items 0 and 1), 41-60 by its try 2, 61-80 outside Airflow, 81-100 before dpone
    recorded it, 101-120 by a run whose id is markup and a bidi override; the running chunks'
    leases by RUN_A's item 6."""
    ledger = _ledger(plan)

    def owner(index: int) -> str | None:
        if index <= 40:
            return f"airflow try=1 map={(index - 1) // 20} run={RUN_A} on pod-a:1:aaa"
        if index <= 60:
            return f"airflow try=2 map=2 run={RUN_A} on pod-b:1:bbb"
        if index <= 80:
            return "local on laptop:42:ccc"
        if index <= 100:
            return "pod-d:1:ddd"
        if index <= 120:
            return f"airflow try=1 map=5 run={HOSTILE} on pod-e:1:eee"
        return f"airflow try=1 map=6 run={RUN_A} on pod-f:1:fff"

    records = {
        i: (
            dataclasses.replace(r, lease_owner=owner(i))
            if r.state in (ChunkState.COMMITTED, ChunkState.RUNNING)
            else r
        )
        for i, r in ledger.records.items()
    }
    return Ledger(ledger.shape, records, cancelled=False, cancel_reason=None, now=NOW)


def _moved_by_rows(page: str) -> list[list[str]]:
    """The cells of the page's "Who moved the chunks" table, row by row, unescaped."""
    table = page.split("<h3>Who moved the chunks</h3>", 1)[1].split("</table>", 1)[0]
    return [
        [html.unescape(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", table)[1:]
    ]


def test_html_shows_who_moved_each_run_of_chunks_as_text_does(tmp_path: Path) -> None:
    """The page says what the text's `committed:` / `held:` lines say: the Airflow run, try and
    map index, outside Airflow or unrecorded, in the same runs of consecutive chunks."""
    pack, plan = _compile(tmp_path)
    doc = status_document(pack, plan, _attributed(plan))
    page = render_html(doc)
    shown_id = 'manual__<script>alert("x")</script>&\\u202e'  # the override escaped, as in text
    assert _moved_by_rows(page) == [
        ["1-20", "committed", RUN_A, "1", "0"],
        ["21-40", "committed", RUN_A, "1", "1"],
        ["41-60", "committed", RUN_A, "2", "2"],
        ["61-80", "committed", "outside Airflow"],
        ["81-100", "committed", "an unrecorded run (written before dpone recorded it)"],
        ["101-120", "committed", shown_id, "1", "5"],
        ["121-144", "held", RUN_A, "1", "6"],
    ]
    text = render_text(doc, colour=False)
    assert f"  committed: chunks 1-20 by run {RUN_A}, try 1, map index 0\n" in text
    assert "  committed: chunks 61-80 outside Airflow\n" in text
    assert f"  committed: chunks 101-120 by run {shown_id}, try 1, map index 5\n" in text
    assert f"  held: chunks 121-144 by run {RUN_A}, try 1, map index 6\n" in text
    # escaped: no markup and no bidi override from a stored run id reaches the page
    assert "<script" not in page and "\u202e" not in page
    assert "manual__&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;\\u202e" in page
    assert render_html(status_document(pack, plan, _attributed(plan))) == page


def test_html_says_none_moved_before_any_run(tmp_path: Path) -> None:
    pack, plan = _compile(tmp_path)
    page = render_html(status_document(pack, plan, None))
    assert '<h3>Who moved the chunks</h3>\n<p class="none">none</p>' in page


def test_html_header_counts_mapped_items_not_rows(campaign: dict[str, Any]) -> None:
    """The header's second figure is how the campaign runs in Airflow (its mapped items), never
    a count of the grid's rows that reads as rows moved."""
    page = render_html(campaign)
    assert "· 240 chunks · 12 mapped items, as of " in page
    one = dict(campaign, items=campaign["items"][:1])
    assert "· 1 mapped item, as of " in render_html(one)
    internal = dict(campaign, mode="internal")
    assert "· 240 chunks · one runtime task, as of " in render_html(internal)
    assert " rows" not in render_html(internal).split("</p>", 1)[0]


def _chromium() -> str:
    chromium = os.environ.get("DPONE_CHROMIUM", "/usr/bin/chromium")
    if not (shutil.which(chromium) or os.access(chromium, os.X_OK)):
        installed = subprocess.run(
            ["bash", str(ROOT / "scripts" / "ensure_chromium.sh")],
            check=False,
            capture_output=True,
            text=True,
        )
        if installed.returncode != 0:
            pytest.fail(
                f"headless Chromium is required ({chromium}): run scripts/ensure_chromium.sh\n"
                f"{installed.stderr}",
                pytrace=False,
            )
    return chromium


def screenshot(page: Path, png: Path, profile: Path) -> bytes:
    command = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--screenshot={png}",
        "--window-size=1200,800",
        page.resolve().as_uri(),
    ]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=180)
    assert png.exists(), f"chromium wrote no screenshot (exit {done.returncode}):\n{done.stderr}"
    return png.read_bytes()


def _hex(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


def colour_counts(pixels: list[tuple[int, int, int]], tolerance: int = 3) -> dict[str, int]:
    targets = {state: _hex(colour) for state, colour in STATE_COLOURS.items()}
    counts = dict.fromkeys(targets, 0)
    histogram: dict[tuple[int, int, int], int] = {}
    for px in pixels:
        histogram[px] = histogram.get(px, 0) + 1
    for px, n in histogram.items():
        for state, (r, g, b) in targets.items():
            if (
                abs(px[0] - r) <= tolerance
                and abs(px[1] - g) <= tolerance
                and abs(px[2] - b) <= tolerance
            ):
                counts[state] += n
    return counts


def test_screenshot_shows_the_states_in_proportion(tmp_path: Path) -> None:
    pack, plan = _compile(tmp_path)
    doc = status_document(pack, plan, _ledger(plan))  # no expired outline: clean proportions
    page = tmp_path / "campaign.html"
    page.write_text(render_html(doc), encoding="utf-8")
    png = screenshot(page, tmp_path / "campaign.png", tmp_path / "profile")
    width, height, pixels = decode_png(png)
    assert (width, height) == (1200, 800)
    counts = colour_counts(pixels)
    # Every cell is 14x14 px; the legend swatches and the stacked bar add to each state in the
    # same proportion, so the pixel counts follow the chunk counts. The tolerance is tight
    # because anti-aliased grey text passes close to the pending grey.
    cell = 14 * 14
    assert counts["committed"] > COUNTS["committed"] * cell * 0.8, counts
    for state in ("running", "failed", "pending"):
        expected = COUNTS[state] / COUNTS["committed"]
        measured = counts[state] / counts["committed"]
        assert abs(measured - expected) <= 0.10 * expected, (state, measured, expected, counts)
    coloured = sum(counts.values())
    assert coloured < 0.5 * width * height, "the page should be mostly background"


# --- the terminal grid --------------------------------------------------------------------------


def test_render_text_plain(campaign: dict[str, Any]) -> None:
    text = render_text(campaign, colour=False)
    assert "\033[" not in text
    assert "240 chunks: 120 committed, 24 running, 36 failed, 60 pending" in text
    grid = "".join(line for line in text.splitlines() if line.lstrip().startswith("item "))
    for state, n in COUNTS.items():
        assert grid.count(GLYPH[state]) == n, state
    assert " 20/20" in text and " 0/20" in text
    assert "(expired: retryable)" in text
    assert "failed: chunk 145 attempt 1 DPONE_SINK_FAILED" in text
    assert text.rstrip().splitlines()[-1].startswith("  legend:")


def test_render_text_colour(campaign: dict[str, Any]) -> None:
    text = render_text(campaign, colour=True)
    for state in COUNTS:
        assert f"\033[{ANSI[state]}m{GLYPH[state]}\033[0m" in text, state
    plain = render_text(campaign, colour=False)
    assert re.sub(r"\033\[[0-9;]*m", "", text) == plain


class _Stream:
    def __init__(self, tty: bool) -> None:
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_colour_only_on_a_terminal_and_no_color_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_colour(_Stream(True)) is True
    assert use_colour(_Stream(False)) is False
    monkeypatch.setenv("NO_COLOR", "1")
    assert use_colour(_Stream(True)) is False
    monkeypatch.setenv("NO_COLOR", "")  # no-color.org: only a non-empty value disables colour
    assert use_colour(_Stream(True)) is True
