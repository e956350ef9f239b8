"""The YAML subset reader agrees with ruamel on every text it accepts.

``yaml_subset`` reads the common part of YAML without ruamel; for any other text it must give up.
The oracle, for generated documents (nested mappings and sequences in block and flow style,
tricky scalars, comments, odd spacing) and for mutants of them and of the golden files (tokens
spliced in, lines re-indented, duplicated, cut): ``parse_subset`` returns None, or ruamel reads
the same text without an error into the same data (types included: ``1`` is not ``True``) and
the same positions.
"""

from __future__ import annotations

from typing import Any

import fuzzkit
from dpone.authoring import yaml_ruamel
from dpone.authoring.yaml_subset import parse_subset
from dpone.errors import ErrorRecord
from hypothesis import given, settings
from hypothesis import strategies as st

TRICKY = [
    "yes", "no", "on", "off", "y", "n", "true", "True", "TRUE", "tRue", "false", "null", "Null",
    "NULL", "nULL", "~", "0", "-0", "+0", "1", "-1", "+1", "007", "08", "0o17", "0x1F", "0b101",
    "1_000", "1.5", "1.", ".5", "-.5", "1e3", "1E-3", ".inf", "-.Inf", ".nan", "12:30", "1:20:30",
    "2023-01-01", "2023-1-1", "2023-01-01T10:00:00", "2023-01-01 10:00:00Z", "2023-01-01x",
    "500m", "1Gi", "-m", "--version", "-", "a:b", "a: b", "a:", ":a", "?a", "a?", "it's", "a#b",
    "a #b", "#a", "a,b", "[a]", "{a}", "a]", "@a", "`a", "%a", "!a", "&a", "*a", "|", ">", "=",
    "<<", "a b", "a  b", " a", "a ", "é", "ü-x", "\u00a0x", "\\n", "a\\b", "''", '""', "'", '"',
    "x" * 40, "registry.example.com/app:1.0", "s3://bucket/key", "SELECT 1", "${VAR}", "{{ ds }}",
]  # fmt: skip
ORDINARY = [
    "orders", "raw", "analytics", "order_id", "2023-01-01", "day", "1", "40", "500m", "1Gi",
    "replace", "backfill", "true", "false", "dpone_audit", "registry.example.com/app:1.0",
    "-m", "--version", "a b", "it's", "x-y_z", "/opt/dpone/catalog/workloads.yaml",
]  # fmt: skip
KEYS = [
    *("name", "schema", "table", "column", "type", "start", "end", "mode", "pool", "cpu", "keys"),
    *("max_items", "image", "tags", "1", "true", "null", "~", "-k", "k k", "k:v", "k#", "é"),
]
TOKENS = [
    ": ", ":", " #", "#", "- ", "-", "? ", "'", '"', "''", "[", "]", "{", "}", ",", ", ", "&a ",
    "*a", "!!str ", "!x ", "|", ">", "\t", "\r", "\n", "\n  ", "---\n", "...\n", "%YAML 1.2\n",
    "\\", "\ufeff", "\x85", "\u2028", "\x00", "\x7f", " ", "  ", "1.5", "007", "yes", "<<: ",
]  # fmt: skip


SCALAR_TEXT = st.one_of(
    st.sampled_from(ORDINARY),
    st.sampled_from(ORDINARY),
    st.sampled_from(TRICKY),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=10),
)


def quoted(draw: st.DrawFn, text: str) -> str:
    style = draw(st.sampled_from(["plain", "plain", "single", "double"]))
    if style == "single":
        return "'" + text.replace("'", "''") + "'"
    if style == "double":
        return '"' + text + '"'
    return text


def gap(draw: st.DrawFn) -> str:
    return draw(st.sampled_from([" ", " ", " ", "  ", "   "]))


def comment(draw: st.DrawFn) -> str:
    return draw(st.sampled_from(["", "", "", " # note", "  #", " #: x", "# x"]))


def flow(draw: st.DrawFn, depth: int) -> str:
    kind = draw(st.sampled_from(["scalar", "scalar", "seq", "map"] if depth < 4 else ["scalar"]))
    if kind == "scalar":
        return quoted(draw, draw(SCALAR_TEXT))
    sep = draw(st.sampled_from([", ", ",", " , ", ",  "]))
    size = draw(st.integers(0, 3))
    if kind == "seq":
        return "[" + sep.join(flow(draw, depth + 1) for _ in range(size)) + "]"
    pairs = [
        f"{draw(st.sampled_from(KEYS))}:{gap(draw)}{flow(draw, depth + 1)}" for _ in range(size)
    ]
    return "{" + sep.join(pairs) + "}"


def block(draw: st.DrawFn, indent: int, depth: int) -> list[str]:
    """Lines of a block mapping or sequence at ``indent``."""
    pad = " " * indent
    step = draw(st.sampled_from([1, 2, 2, 4]))
    lines: list[str] = []
    sequence = draw(st.booleans()) and depth > 0
    for _ in range(draw(st.integers(1, 4))):
        head = f"{pad}-{gap(draw)}" if sequence else f"{pad}{draw(st.sampled_from(KEYS))}:"
        nested = depth < 4 and draw(st.integers(0, 3)) == 0
        if nested:
            inner = indent + step
            if not sequence and draw(st.booleans()):
                inner = indent  # an indentless sequence under a key
            child = block(draw, inner, depth + 1)
            if sequence and draw(st.booleans()):  # "- key: value" with the rest below it
                first = child[0].lstrip(" ")
                column = len(head)
                child = [head + first] + [" " * column + c.lstrip(" ") for c in child[1:]]
                lines.extend(child)
                continue
            lines.append(head.rstrip(" ") + comment(draw))
            lines.extend(child)
            continue
        value = flow(draw, 0) if draw(st.booleans()) else quoted(draw, draw(SCALAR_TEXT))
        separator = "" if sequence else gap(draw)
        lines.append(head + separator + value + comment(draw))
        if draw(st.integers(0, 5)) == 0:
            lines.append(draw(st.sampled_from(["", "#", "   # c", "  "])))
    return lines


@st.composite
def documents(draw: st.DrawFn) -> str:
    return "\n".join(block(draw, 0, 0)) + draw(st.sampled_from(["\n", "", "\n\n"]))


@st.composite
def mutants(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        text = draw(documents())
    else:
        name = draw(st.sampled_from(sorted(str(p) for p in fuzzkit.GOLDEN.glob("*/*.yaml"))))
        text = (fuzzkit.GOLDEN / name).read_text(encoding="utf-8")
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["token", "token", "indent", "dup", "cut"]))
        pos = draw(st.integers(0, max(0, len(text) - 1)))
        if op == "token":
            text = text[:pos] + draw(st.sampled_from(TOKENS)) + text[pos:]
        elif op == "cut":
            text = text[:pos] + text[pos + draw(st.integers(1, 6)) :]
        else:
            lines = text.split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            if op == "dup":
                lines.insert(i, lines[i])
            else:
                lines[i] = " " * draw(st.integers(0, 6)) + lines[i].lstrip(" ")
            text = "\n".join(lines)
    return text


def typed(value: Any) -> Any:
    """The value with every scalar's type beside it: ``1 == True`` must not pass."""
    if isinstance(value, dict):
        return [("map", typed(k), typed(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["seq", *(typed(v) for v in value)]
    return (type(value).__name__, value)


def assert_agrees(text: str) -> bool:
    """The oracle; returns whether the subset read the text."""
    fast = parse_subset(text)
    if fast is None:
        return False
    full = yaml_ruamel.parse(text, "doc.yaml")
    assert not isinstance(full, ErrorRecord), (text, full)
    assert typed(fast[0]) == typed(full[0]), text
    assert fast[1] == full[1], text
    return True


@fuzzkit.fuzz_settings(0.05)
@given(documents())
def test_generated_documents_read_alike(text: str) -> None:
    assert_agrees(text)


@fuzzkit.fuzz_settings(0.05)
@given(mutants())
def test_mutated_documents_read_alike_or_go_to_ruamel(text: str) -> None:
    assert_agrees(text)


def test_the_generator_reaches_the_subset() -> None:
    """A fuzz run that only saw declined texts would prove nothing: a quarter at least is read."""
    read = []

    @settings(max_examples=200, deadline=None, derandomize=True, database=None)
    @given(documents())
    def probe(text: str) -> None:
        read.append(assert_agrees(text))

    probe()
    assert sum(read) >= len(read) // 4, f"{sum(read)} of {len(read)} generated texts were read"
