"""YAML composed by ruamel.yaml, with positions: the full language and its located errors.

``yamldoc`` reads catalogs and manifests with ``yaml_subset`` first; a document outside that
subset (anchors, tags, block scalars, an error to report, ...) comes here. ruamel's safe (YAML
1.2) pure-Python composer turns it into nodes and the builder below into plain data, recording
the line and column of every mapping key, value and sequence item. Imported only when needed: its
import and its parser cost a pod more than the rest of its start-up.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.reader import ReaderError
from ruamel.yaml.scanner import Scanner, ScannerError

from dpone import errors
from dpone.errors import ErrorRecord, Location

MAX_NODES = 200_000
MAX_FLOW_DEPTH = 64
TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
INT_TAG = "tag:yaml.org,2002:int"
#: A plain integer with a leading zero: YAML 1.2 reads ``0400`` as 400, YAML 1.1 (kubectl, PyYAML,
#: a Kubernetes manifest's ``defaultMode: 0400``) as octal 256.
_LEADING_ZERO = re.compile(r"[-+]?0[0-9_]+")
MERGE_TAG = "tag:yaml.org,2002:merge"
# YAML 1.2's core schema: the only tags a catalog or manifest may carry, implicitly or written out.
# Any other tag (``!!binary``, ``!!set``, ``!!python/...``, ``!local``) would turn a value into
# something else than the text the reviewer reads (``!!binary aGVsbG8=`` is bytes, not a string).
CORE_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}"
    for name in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp", "merge")
)
# The line breaks ruamel's YAML 1.2 reader counts in its marks (``Reader.forward``).
_LINE_BREAK = re.compile("\r\n|\r|\n")


def line_column(text: str, index: int) -> tuple[int, int]:
    """The 1-based line and column of ``text[index]``, counted as ruamel counts its marks (a
    byte order mark takes no column), for the errors its reader raises without a mark."""
    lines = _LINE_BREAK.split(text[:index])
    return len(lines), len(lines[-1].replace("\ufeff", "")) + 1


class _BoundedScanner(Scanner):
    """Refuses flow collections (``[ ]``, ``{ }``) nested deeper than MAX_FLOW_DEPTH.

    ruamel's pure-Python scanner slows down super-linearly with flow depth: 1,000 nested ``[``
    (4 KB) took 7 s to reject. The scanner knows the real flow context, so the check is exact.
    """

    def fetch_flow_collection_start(self, TokenClass: Any, to_push: str) -> None:
        if self.flow_level >= MAX_FLOW_DEPTH:
            raise ScannerError(
                None,
                None,
                f"flow collections ([ ] or {{ }}) nest deeper than {MAX_FLOW_DEPTH} levels",
                self.reader.get_mark(),
            )
        super().fetch_flow_collection_start(TokenClass, to_push)


def _new_yaml() -> YAML:
    """A safe (YAML 1.2) pure-Python loader with the bounded scanner.

    Not libyaml's C parser: its composer recurses in C and crashes the interpreter on a deeply
    nested hostile document (50,000 ``[``), and it speaks YAML 1.1's grammar (it refuses
    ``{image: repo/app:1.0}``). The safe composer is still about twice as fast as round-trip.
    """
    yaml = YAML(typ="safe", pure=True)
    yaml.Scanner = _BoundedScanner
    return yaml


class _Budget:
    """Counts visited nodes: aliases can make a small file expand exponentially."""

    def __init__(self) -> None:
        self.left = MAX_NODES

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _TooManyNodes


class _TooManyNodes(Exception):
    """The node budget ran out (an alias bomb or an absurdly large document)."""


class _ForbiddenTag(Exception):
    def __init__(self, node: Node) -> None:
        super().__init__(node.tag)
        self.node = node


class _AmbiguousInteger(Exception):
    def __init__(self, node: ScalarNode) -> None:
        super().__init__(node.value)
        self.node = node


class _DuplicateKey(Exception):
    def __init__(self, key: object, node: Node, first: Node | None = None) -> None:
        super().__init__(key)
        self.key = key
        self.node = node
        self.first = first


Position = tuple[int, int]
Positions = dict[tuple[str | int, ...], Position]


def _mark(node: Node) -> Position:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def _plain_scalar(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, int | float | str):
        return value
    return str(value)


class _Builder:
    """Nodes to plain dicts/lists/scalars plus a path -> position index."""

    def __init__(self, yaml: YAML) -> None:
        self.constructor = yaml.constructor
        self.positions: Positions = {}
        self.budget = _Budget()

    def scalar(self, node: ScalarNode) -> Any:
        if node.tag == TIMESTAMP_TAG:
            return str(node.value)
        if node.tag == MERGE_TAG:
            return "<<"
        # plain, or quoted under an explicit !!int (YAML 1.1 tools read both as octal)
        if node.tag == INT_TAG and _LEADING_ZERO.fullmatch(node.value):
            raise _AmbiguousInteger(node)
        return _plain_scalar(self.constructor.construct_object(node, deep=True))

    def build(self, node: Node, path: tuple[str | int, ...]) -> Any:
        self.budget.spend()
        if node.tag not in CORE_TAGS:
            raise _ForbiddenTag(node)
        if isinstance(node, MappingNode):
            result: dict[Any, Any] = {}
            key_nodes: dict[Any, Node] = {}
            for key_node, value_node in node.value:
                key = self.build(key_node, (*path, "__key__"))
                if isinstance(key, dict | list):
                    raise _DuplicateKey(None, key_node)
                if key in result:
                    raise _DuplicateKey(key, key_node, key_nodes[key])
                key_nodes[key] = key_node
                child = (*path, str(key))
                self.positions[(*child, "__key__")] = _mark(key_node)
                self.positions[child] = _mark(value_node)
                result[key] = self.build(value_node, child)
            return result
        if isinstance(node, SequenceNode):
            items = []
            for index, item in enumerate(node.value):
                self.positions[(*path, index)] = _mark(item)
                items.append(self.build(item, (*path, index)))
            return items
        assert isinstance(node, ScalarNode)
        return self.scalar(node)


def compose(yaml: YAML, text: str) -> tuple[Any, Positions]:
    """Plain data and its positions; raises what ruamel and the builder raise."""
    with warnings.catch_warnings():
        # ruamel warns (ReusedAnchorWarning) on stderr; a reused anchor is legal YAML and the
        # structured output must stay the only thing dpone prints.
        warnings.simplefilter("ignore")
        node = yaml.compose(text)
    if node is None:
        return None, {}
    builder = _Builder(yaml)
    return builder.build(node, ()), builder.positions


def parse(text: str, display: str) -> tuple[Any, Positions] | ErrorRecord:
    """The document's data and positions, or the error located in ``display`` (never raises)."""
    try:
        return compose(_new_yaml(), text)
    except _DuplicateKey as dup:
        dup_line, dup_col = _mark(dup.node)
        if dup.key is None:
            message = "mapping keys must be plain values, not mappings or lists"
        else:
            first = f" (first at line {_mark(dup.first)[0]})" if dup.first is not None else ""
            message = f"duplicate key {dup.key!r}{first}"
        where = Location(display, dup_line, dup_col)
        return ErrorRecord(errors.YAML_INVALID, message, where)
    except _AmbiguousInteger as bad:
        text = str(bad.node.value)
        sign = "-" if text.startswith("-") else ""
        digits = text.lstrip("+-").replace("_", "")
        decimal = int(text.replace("_", ""))
        if set(digits) <= set("01234567"):
            octal = f"{sign}0o{digits.lstrip('0') or '0'}"
            theirs = f"octal {text} ({int(octal, 8)})"
            ways = f"write {decimal}, or {octal} for the octal value, or quote it for text"
        else:
            theirs = f"the text {text!r}"
            ways = f"write {decimal}, or quote it for text"
        message = (
            f"the integer {text!r} has a leading zero: dpone (YAML 1.2) reads it as {decimal}, "
            f"kubectl and other YAML 1.1 tools as {theirs}; {ways}"
        )
        at_line, at_col = _mark(bad.node)
        return ErrorRecord(errors.YAML_INVALID, message, Location(display, at_line, at_col))
    except _ForbiddenTag as bad:
        tag_line, tag_col = _mark(bad.node)
        tag = str(bad.node.tag).replace("tag:yaml.org,2002:", "!!")
        message = (
            f"the YAML tag {tag[:80]!r} is not allowed: values are plain strings, numbers, "
            "booleans, null, lists and mappings (YAML 1.2 core schema)"
        )
        where = Location(display, tag_line, tag_col)
        return ErrorRecord(errors.YAML_INVALID, message, where)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        col = mark.column + 1 if mark is not None else None
        problem = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        return ErrorRecord(errors.YAML_INVALID, problem, Location(display, line, col))
    except ReaderError as exc:  # a character YAML forbids (NUL, other controls): no mark, an index
        line, col = line_column(text, exc.position)
        code = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
        message = f"unacceptable character {code}: {exc.reason}"
        return ErrorRecord(errors.YAML_INVALID, message, Location(display, line, col))
    except (RecursionError, _TooManyNodes):
        return ErrorRecord(
            errors.YAML_INVALID,
            f"document nests too deeply or expands beyond {MAX_NODES} nodes (aliases)",
            Location(display),
        )
    except (YAMLError, ValueError, TypeError, AttributeError, OverflowError) as exc:
        message = " ".join(str(exc).split())[:300] or type(exc).__name__
        return ErrorRecord(errors.YAML_INVALID, message, Location(display))
