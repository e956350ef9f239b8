"""The YAML subset reader: what it reads, what it leaves to ruamel, and that a pod skips ruamel.

Every YAML file of the project is read by both readers; where the subset reads one, the data
(with types) and the positions are ruamel's. The golden projects and the example project are
written in the subset, so a pod running them never imports ruamel.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dpone.authoring import yaml_ruamel
from dpone.authoring.yaml_subset import parse_subset
from dpone.authoring.yamldoc import load_yaml
from dpone.errors import ErrorRecord

REPO = Path(__file__).resolve().parents[2]
PROJECT_YAML = sorted(
    p
    for folder in ("golden", "tests", "examples", "deploy")
    if (REPO / folder).is_dir()
    for p in (REPO / folder).rglob("*.y*ml")
)
# Files the subset leaves to ruamel on purpose (an escape in a double-quoted string, an error
# to report, a float where an integer belongs, a tag, a duplicate key, an empty value).
LEFT_TO_RUAMEL = {
    "golden/gitops_policy/workloads.yaml",
    "tests/invalid_catalogs/duplicate_key/workloads.yaml",
    "tests/invalid_catalogs/octal_file_mode/workloads.yaml",
    "tests/invalid_catalogs/pod_options_invalid/workloads.yaml",
    "tests/invalid_catalogs/yaml_tag/workloads.yaml",
    "tests/invalid_catalogs/yaml_syntax_error/workloads.yaml",
    "tests/invalid_catalogs/float_for_integer/orders.yaml",
    "tests/invalid_catalogs/float_for_integer/workloads.yaml",
}


def typed(value: Any) -> Any:
    if isinstance(value, dict):
        return [("map", typed(k), typed(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["seq", *(typed(v) for v in value)]
    return (type(value).__name__, value)


def ruamel(text: str) -> Any:
    outcome = yaml_ruamel.parse(text, "doc.yaml")
    assert not isinstance(outcome, ErrorRecord), outcome
    return outcome


@pytest.mark.parametrize("path", PROJECT_YAML, ids=lambda p: str(p.relative_to(REPO)))
def test_every_project_file_reads_as_ruamel_reads_it(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    fast = parse_subset(text)
    name = str(path.relative_to(REPO))
    if name in LEFT_TO_RUAMEL or path.name.startswith("."):
        return
    assert fast is not None, f"{name} is no longer in the subset"
    data, positions = ruamel(text)
    assert typed(fast[0]) == typed(data)
    assert fast[1] == positions


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("orders", "orders"),
        ("yes", "yes"),  # YAML 1.2: a string
        ("on", "on"),
        ("True", True),
        ("FALSE", False),
        ("~", None),
        ("Null", None),
        ("42", 42),
        ("-7", -7),
        ("500m", "500m"),
        ("1Gi", "1Gi"),
        ("2023-01-01", "2023-01-01"),  # kept as written
        ("-m", "-m"),
        ("--version", "--version"),
        ("a#b", "a#b"),
        ("a # comment", "a"),
        ("it's", "it's"),
        ("'it''s'", "it's"),
        ('"a: b # c"', "a: b # c"),
        ("registry.example.com/app:1.0", "registry.example.com/app:1.0"),
        ("[a, 'b', -m, 3]", ["a", "b", "-m", 3]),
        ("{schema: raw, name: orders}", {"schema": "raw", "name": "orders"}),
        ("[{a: [1, []]}, {}]", [{"a": [1, []]}, {}]),
    ],
)
def test_values_read_as_yaml_1_2_reads_them(value: str, expected: Any) -> None:
    text = f"key: {value}\n"
    fast = parse_subset(text)
    assert fast is not None
    assert typed(fast[0]) == typed({"key": expected})
    assert typed(fast[0]) == typed(ruamel(text)[0])
    assert fast[1] == ruamel(text)[1]


@pytest.mark.parametrize(
    "text",
    [
        "key: 1.5\n",  # a float
        "key: 007\n",  # octal to ruamel
        "key: 0x1F\n",
        "key: 1_000\n",
        "key: .inf\n",
        "key: &a x\nother: *a\n",  # anchors and aliases
        "key: !!str 1\n",  # a tag
        "key: |\n  text\n",  # a block scalar
        "key: a\n  continued\n",  # a multi-line plain scalar
        'key: "a\\nb"\n',  # an escape
        "key: [a,\n  b]\n",  # a flow collection over two lines
        "key:\n",  # an empty value
        "key: a\nkey: b\n",  # a duplicate key (ruamel reports it)
        "key:\ta\n",  # a tab
        "---\nkey: a\n",  # a document marker
        "key: a\r\n",  # a carriage return
        "\ufeffkey: a\n",  # a byte order mark
        "key: a\u2028b\n",  # a line separator (a line break to ruamel)
        "? key\n: a\n",  # an explicit key
        "key: a: b\n",  # an error
        "'key': a\n",  # a quoted key
        "key: [a, b,]\n",  # a trailing comma
        "key: {a: 1:2}\n",
        "- - a\n",
        "<<: {a: 1}\n",
        "key: =\n",
        "just a scalar\n",
        "",
    ],
)
def test_anything_else_is_left_to_ruamel(text: str) -> None:
    assert parse_subset(text) is None


def test_positions_of_block_nodes_are_the_first_key_or_dash() -> None:
    text = "a:\n  b: 1\nc:\n- x\n- y: 2\n  z: [3]\n"
    fast = parse_subset(text)
    assert fast is not None
    data, positions = fast
    assert data == {"a": {"b": 1}, "c": ["x", {"y": 2, "z": [3]}]}
    assert positions[("a",)] == (2, 3)
    assert positions[("c",)] == (4, 1)
    assert positions[("c", 1)] == (5, 3)
    assert positions[("c", 1, "z", "__key__")] == (6, 3)
    assert positions[("c", 1, "z", 0)] == (6, 7)
    assert positions == ruamel(text)[1]


def test_a_document_outside_the_subset_is_read_by_ruamel(tmp_path: Path) -> None:
    path = tmp_path / "doc.yaml"
    path.write_text("base: &b {x: 1}\nuse: *b\nfloat: 1.5\n", encoding="utf-8")
    document, problems = load_yaml(path, "doc.yaml")
    assert not problems and document is not None
    assert document.data == {"base": {"x": 1}, "use": {"x": 1}, "float": 1.5}
    assert document.positions[("float",)] == (3, 8)


def test_loading_the_example_catalog_does_not_import_ruamel() -> None:
    """A pod's catalog and manifest in the subset: ruamel is never imported (its import and
    parser cost each pod more than the rest of its start-up)."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from dpone.authoring.yamldoc import load_yaml\n"
        "for name in sys.argv[1:]:\n"
        "    document, problems = load_yaml(Path(name), name)\n"
        "    assert document is not None and not problems, problems\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('ruamel'))\n"
        "assert not loaded, loaded\n"
    )
    files = [str(p) for p in sorted((REPO / "golden" / "summary_365_into_40").glob("*.yaml"))]
    subprocess.run([sys.executable, "-c", code, *files], check=True)


def test_a_reused_anchor_is_read_without_a_warning(tmp_path: Path) -> None:
    """A reused anchor is legal YAML (the later one wins); ruamel's ReusedAnchorWarning must not
    reach stderr beside dpone's structured output (a fresh interpreter: pytest would catch it)."""
    path = tmp_path / "doc.yaml"
    path.write_text("a: &x 1\nb: &x 2\nc: *x\n", encoding="utf-8")
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from dpone.authoring.yamldoc import load_yaml\n"
        "document, problems = load_yaml(Path(sys.argv[1]), 'doc.yaml')\n"
        "assert not problems and document is not None\n"
        "print(document.data)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "{'a': 1, 'b': 2, 'c': 2}"
    assert done.stderr == ""


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("m: 0o400\n", 256),
        ('m: "0400"\n', "0400"),
        ("m: 0\n", 0),
        ("m: -0\n", 0),
        ("m: 400\n", 400),
    ],
)
def test_an_integer_without_a_leading_zero_reads_as_written(text: str, value: object) -> None:
    data, _ = ruamel(text) if parse_subset(text) is None else parse_subset(text)  # type: ignore[misc]
    assert data == {"m": value}


@pytest.mark.parametrize(
    "text", ["m: 0400\n", "m: {x: 0644}\n", "m: [-012]\n", "m: 08\n", "m: !!int '0400'\n"]
)
def test_an_integer_with_a_leading_zero_is_refused_where_it_is(text: str) -> None:
    """kubectl and other YAML 1.1 readers take 0400 for octal 256, YAML 1.2 for 400: a file
    mode copied from a pod manifest would reach the pod with another value."""
    assert parse_subset(text) is None
    outcome = yaml_ruamel.parse(text, "doc.yaml")
    assert isinstance(outcome, ErrorRecord) and outcome.code == "DPONE_YAML_INVALID"
    assert "leading zero" in outcome.message and outcome.location is not None
    assert outcome.location.line == 1 and outcome.location.column > 3
