"""Fuzz catalogs and manifests through the real `dpone check --format json`, in-process.

Every golden project is copied into a scratch folder per case with one file replaced by a
mutant: structural (keys dropped or added, values of the wrong type, deep nesting, long strings,
odd manifest paths), textual (byte flips, YAML tokens and tags spliced in, lines duplicated into
duplicate keys, indentation broken), alias bombs, and random bytes. The oracle: exit 0 or 1, and
stdout a list of dpone.error.v1 records with registered codes; never a traceback or an
internal error.
"""

from __future__ import annotations

import io
import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import fuzzkit
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ruamel.yaml import YAML

PROJECTS = tuple(
    sorted(p.name for p in fuzzkit.GOLDEN.iterdir() if (p / "workloads.yaml").is_file())
)
CHARS = st.characters(codec="utf-8")


@cache
def project_files(project: str) -> tuple[tuple[str, bytes], ...]:
    folder = fuzzkit.GOLDEN / project
    return tuple((p.name, p.read_bytes()) for p in sorted(folder.iterdir()) if p.suffix == ".yaml")


@cache
def project_data(project: str, name: str) -> Any:
    text = dict(project_files(project))[name].decode("utf-8")
    return json.loads(json.dumps(YAML(typ="safe").load(text), default=str))


def dump_yaml(data: Any, flow: bool) -> bytes:
    yaml = YAML(typ="safe")
    yaml.default_flow_style = flow
    buffer = io.StringIO()
    try:
        yaml.dump(data, buffer)
    except Exception:  # a value ruamel cannot represent: JSON is YAML 1.2 too
        return json.dumps(data, ensure_ascii=False).encode("utf-8")
    return buffer.getvalue().encode("utf-8")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-authoring")


def check_project(scratch: Path, project: str, name: str, content: bytes, target: str) -> None:
    """Write the project with ``name`` replaced by ``content`` and run `dpone check` on it."""
    folder = scratch / "project"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    for file_name, data in project_files(project):
        (folder / file_name).write_bytes(content if file_name == name else data)
    catalog = folder / "workloads.yaml"
    result = fuzzkit.run_cli(["check", str(catalog), "--format", "json"])
    fuzzkit.count(target)
    records = fuzzkit.check_check_result(result, f"{target} {project}/{name}: {content[:300]!r}")
    for record in records:
        # Every located problem names a file of this project (never a Python source file).
        if record["file"] is not None:
            assert not str(record["file"]).endswith(".py"), record


# --- strategies ----------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**18, max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(CHARS, max_size=30),
    st.text(CHARS, min_size=900, max_size=2000),
    st.sampled_from(
        [
            "",
            "2023-02-30",
            "2024-01-01T00:00:00",
            "24:00",
            "0x1F",
            "yes",
            "~",
            "dpone_backfill",
            "DPONE_AIRFLOW_MAPPING_ITEM",
            "../../etc/passwd",
            "/dev/zero",
            "/dev/null",
            ".",
            "a\x00b.yaml",
            "summary",
            "visible",
            "internal",
            "audit_schema",
            "local_file",
            "clickhouse",
            "{{ ds }}",
            "{# x",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.text(CHARS, max_size=12), children, max_size=3),
    ),
    max_leaves=8,
)
KNOWN_KEYS = (
    "schema",
    "name",
    "workloads",
    "defaults",
    "manifest",
    "airflow",
    "mapping",
    "mode",
    "max_items",
    "max_active",
    "pool",
    "env",
    "processes",
    "source",
    "sink",
    "backfill",
    "chunk",
    "state",
    "backend",
    "parallel_workers",
    "inner_mode",
    "gitops",
    "step",
    "unit",
    "start",
    "end",
    "table",
    "query",
    "keys",
    "strategy",
    "flavour",
    "command",
    "secrets",
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out.extend(_paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            out.extend(_paths(value, (*prefix, index)))
    return out


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        node = node[part]
    return node


@st.composite
def structural_mutant(draw: st.DrawFn, data: Any) -> bytes:
    doc = json.loads(json.dumps(data))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["drop", "add", "retype", "nest", "dup_item", "swap_known"]))
        if not path:
            if action in ("retype", "nest"):
                doc = draw(values)
            continue
        parent, last = _get(doc, path[:-1]), path[-1]
        if action == "drop":
            del parent[last]
        elif action == "add":
            target = _get(doc, path)
            if isinstance(target, dict):
                key = draw(st.one_of(st.sampled_from(KNOWN_KEYS), st.text(CHARS, max_size=20)))
                target[key] = draw(values)
            elif isinstance(target, list):
                target.append(draw(values))
            else:
                parent[last] = draw(values)
        elif action == "retype":
            parent[last] = draw(values)
        elif action == "nest":
            depth = draw(st.integers(2, 400))
            value: Any = draw(scalars)
            for _ in range(depth):
                value = {"a": value} if draw(st.booleans()) else [value]
            parent[last] = value
        elif action == "dup_item" and isinstance(parent, list):
            parent.append(json.loads(json.dumps(parent[last])))
        elif action == "swap_known" and isinstance(parent, dict):
            parent[draw(st.sampled_from(KNOWN_KEYS))] = parent.pop(last)
    return dump_yaml(doc, flow=draw(st.booleans()))


YAML_TOKENS = [
    "&a ",
    "*a",
    "*undefined",
    "<<: *a\n",
    "!!python/object:os.system ",
    "!!binary ",
    "!!set ",
    "!!omap ",
    "!custom ",
    "? ",
    "- ",
    ": ",
    "---\n",
    "...\n",
    "%YAML 1.1\n",
    "%TAG ! tag:x,2024:\n",
    "\t",
    "{",
    "}",
    "[",
    "]",
    "'",
    '"',
    "|",
    ">-",
    "#",
    "\ufeff",
    "\r",
    "\x85",
    "\u2028",
    "\x00",
    "\x1b",
    ":\n  ",
    "\n  - ",
    "2023-01-01",
    "1e999",
    ".inf",
    ".nan",
    "0o17",
    "null",
    "~",
]


@st.composite
def text_mutant(draw: st.DrawFn, content: bytes) -> bytes:
    data = bytearray(content)
    for _ in range(draw(st.integers(1, 5))):
        op = draw(
            st.sampled_from(["flip", "insert", "token", "delete", "dup_line", "indent", "swap"])
        )
        pos = draw(st.integers(0, len(data)))
        if op == "flip" and data:
            data[min(pos, len(data) - 1)] = draw(st.integers(0, 255))
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "token":
            data[pos:pos] = draw(st.sampled_from(YAML_TOKENS)).encode("utf-8")
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 40))]
        elif op in ("dup_line", "indent", "swap"):
            lines = bytes(data).split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            if op == "dup_line":  # usually a duplicate key
                lines.insert(i, lines[i])
            elif op == "indent":
                lines[i] = b" " * draw(st.integers(0, 7)) + lines[i].lstrip(b" ")
            else:
                j = draw(st.integers(0, len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
            data = bytearray(b"\n".join(lines))
    return bytes(data)


def alias_bomb(levels: int, width: int, key: str) -> bytes:
    lines = ["a0: &a0 [x, x]"]
    for level in range(1, levels + 1):
        refs = ", ".join([f"*a{level - 1}"] * width)
        lines.append(f"a{level}: &a{level} [{refs}]")
    lines.append(f"{key}: *a{levels}")
    return ("\n".join(lines) + "\n").encode()


LONG = fuzzkit.total_budget() > fuzzkit.DEFAULT_TOTAL
# Past ~400 levels ruamel hits the recursion limit and needs seconds to unwind (measured: 4.7 s
# at 900 levels); CI keeps generated depths below that and tests one deep case explicitly.
MAX_DEPTH = 50_000 if LONG else 300


@st.composite
def special_documents(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["bomb", "deep_flow", "deep_block", "random", "huge", "multi"]))
    if kind == "bomb":
        levels = draw(st.integers(2, 12))
        width = draw(st.integers(2, 10))
        if not LONG:
            while width**levels > 200_000 and levels > 2:
                levels -= 1
        return alias_bomb(
            levels, width, draw(st.sampled_from(["workloads", "processes", "schema"]))
        )
    if kind == "deep_flow":
        depth = draw(st.integers(2, MAX_DEPTH))
        return ("processes: " + "[" * depth + "]" * depth + "\n").encode()
    if kind == "deep_block":
        depth = draw(st.integers(2, min(MAX_DEPTH, 3_000)))
        return "".join(f"{'  ' * i}k{i}:\n" for i in range(depth)).encode() + b"  " * depth + b"v\n"
    if kind == "random":
        return draw(st.binary(max_size=2_000))
    if kind == "huge":
        return b"schema: " + b"x" * (5 * 1024 * 1024 + draw(st.integers(1, 10)))
    return b"---\nschema: a\n---\nschema: b\n"


# --- tests ---------------------------------------------------------------------------------------


@st.composite
def target_file(draw: st.DrawFn) -> tuple[str, str]:
    project = draw(st.sampled_from(PROJECTS))
    name = draw(st.sampled_from([n for n, _ in project_files(project)]))
    return project, name


@fuzzkit.fuzz_settings(0.06)
@given(target=target_file(), data=st.data())
def test_fuzz_check_structural_mutations(scratch: Path, target: tuple[str, str], data: Any) -> None:
    project, name = target
    content = data.draw(structural_mutant(project_data(project, name)))
    check_project(scratch, project, name, content, "check.structural")


@fuzzkit.fuzz_settings(0.07)
@given(target=target_file(), data=st.data())
def test_fuzz_check_text_mutations(scratch: Path, target: tuple[str, str], data: Any) -> None:
    project, name = target
    content = data.draw(text_mutant(dict(project_files(project))[name]))
    check_project(scratch, project, name, content, "check.text")


@fuzzkit.fuzz_settings(0.004)
@given(target=target_file(), content=special_documents())
def test_fuzz_check_bombs_nesting_and_random_bytes(
    scratch: Path, target: tuple[str, str], content: bytes
) -> None:
    project, name = target
    check_project(scratch, project, name, content, "check.special")


@pytest.mark.parametrize("levels,width", [(9, 9), (20, 2), (6, 40)])
def test_check_alias_bomb_is_refused(scratch: Path, levels: int, width: int) -> None:
    """A billion-laughs manifest is refused (node budget) instead of expanding in memory."""
    project = "summary_365_into_40"
    check_project(
        scratch,
        project,
        "orders_history.yaml",
        alias_bomb(levels, width, "processes"),
        "check.bomb",
    )


@pytest.mark.parametrize("depth", [2_000, 50_000])
def test_check_deep_flow_nesting_is_refused(scratch: Path, depth: int) -> None:
    """Nesting past the recursion limit ends in DPONE_YAML_INVALID, not a RecursionError."""
    content = ("processes: " + "[" * depth + "]" * depth + "\n").encode()
    check_project(scratch, "summary_365_into_40", "orders_history.yaml", content, "check.deep")
