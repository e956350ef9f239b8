"""A catalog or manifest with a byte YAML cannot read (not UTF-8, a NUL) is located at
file:line:column like every other YAML error (docs/errors.md: "Fix the YAML at the reported
line"), counted as ruamel counts its marks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dpone import errors
from dpone.authoring.yaml_ruamel import parse
from dpone.authoring.yamldoc import load_yaml

DPONE = str(Path(sys.executable).with_name("dpone"))
GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "internal_default"
CATALOG = b"schema: dpone.workload-catalog.v1\nworkloads:\n  orders: {manifest: orders.yaml}\n"


def located(tmp_path: Path, raw: bytes) -> tuple[str, int | None, int | None, str]:
    path = tmp_path / "workloads.yaml"
    path.write_bytes(raw)
    doc, problems = load_yaml(path, "workloads.yaml")
    assert doc is None and [p.code for p in problems] == [errors.YAML_INVALID], problems
    where = problems[0].location
    assert where is not None
    return where.file, where.line, where.column, problems[0].message


@pytest.mark.parametrize(
    ("raw", "line", "column"),
    [
        (CATALOG.replace(b"orders:", b"ord\xffers:"), 3, 6),
        (CATALOG.replace(b"orders:", b"caf\xc3\xa9\xe9:"), 3, 7),  # columns count characters
        (b"\xff" + CATALOG, 1, 1),
        (CATALOG + b"# a truncated sequence: \xe2\x82", 4, 25),
        (CATALOG.replace(b"\n", b"\r\n") + b"x: \xff\n", 4, 4),  # CRLF is one line break
    ],
)
def test_a_byte_that_is_not_utf8_is_located(
    tmp_path: Path, raw: bytes, line: int, column: int
) -> None:
    assert located(tmp_path, raw)[:3] == ("workloads.yaml", line, column)
    message = located(tmp_path, raw)[3]
    assert message.startswith("not UTF-8 at byte ") and "position" not in message


@pytest.mark.parametrize(
    ("raw", "line", "column", "code"),
    [
        (CATALOG.replace(b"orders:", b"ord\x00ers:"), 3, 6, "#x0000"),
        (b"\x00" + CATALOG, 1, 1, "#x0000"),
        (CATALOG + b"last: v\x01\n", 4, 8, "#x0001"),
        (b"\xef\xbb\xbf" + CATALOG.replace(b"schema", b"sch\x00ema"), 1, 4, "#x0000"),  # BOM
    ],
)
def test_a_character_yaml_forbids_is_located(
    tmp_path: Path, raw: bytes, line: int, column: int, code: str
) -> None:
    file, got_line, got_column, message = located(tmp_path, raw)
    assert (file, got_line, got_column) == ("workloads.yaml", line, column)
    assert code in message and "not allowed" in message and "position" not in message


@pytest.mark.parametrize("bom", ["", "\ufeff"])
def test_a_forbidden_character_is_located_as_ruamel_locates_its_errors(bom: str) -> None:
    """The same counting as ruamel's own marks (CRLF and a lone CR break lines, a byte order
    mark takes no column): a NUL sits where a misplaced ``}`` is reported."""
    text = bom + "a: 1\r\nb: 2\rc: [x\n  d: 3\n"
    marked, nul = parse(text.replace("x", "x}"), "f.yaml"), parse(
        text.replace("x", "x\x00"), "f.yaml"
    )
    assert not isinstance(marked, tuple) and not isinstance(nul, tuple)
    assert marked.location == nul.location and marked.location is not None
    assert (marked.location.line, marked.location.column) == (3, 6)


@pytest.mark.parametrize("bad", [b"\xff", b"\x00"])
@pytest.mark.parametrize("name", ["workloads.yaml", "orders_history.yaml"])
def test_dpone_check_prints_file_line_column(tmp_path: Path, name: str, bad: bytes) -> None:
    """What the author sees, from a catalog or a manifest: ``file:line:column: CODE: message``
    in text, and the line and column in ``--format json``."""
    folder = tmp_path / "project"
    shutil.copytree(GOLDEN, folder)
    path = folder / name
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2][:4] + bad + lines[2][4:]
    path.write_bytes(b"\n".join(lines))
    catalog = str(folder / "workloads.yaml")
    text = subprocess.run([DPONE, "check", catalog], capture_output=True, text=True, check=False)
    assert text.returncode == 1 and f"{name}:3:5: DPONE_YAML_INVALID: " in text.stderr, text
    assert "position" not in text.stderr
    done = subprocess.run(
        [DPONE, "check", "--format", "json", catalog], capture_output=True, text=True, check=False
    )
    [record] = json.loads(done.stdout or done.stderr)
    assert (record["code"], record["line"], record["column"]) == (errors.YAML_INVALID, 3, 5)
    assert record["file"].endswith(name), record
