"""YAML loading with source positions, so every error can name file:line:column.

The document is composed into nodes by ruamel.yaml's safe (YAML 1.2) parser and turned into plain
data here, recording the line and column of every mapping key, value and sequence item. YAML 1.2 rules
apply (``yes``/``no`` stay strings); duplicate keys are errors; timestamps are kept as the text
the author wrote, so chunk bounds are parsed once, by the chunk planner.
"""

from __future__ import annotations

import errno
import stat
import warnings
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.scanner import Scanner, ScannerError

from dpone import errors
from dpone.errors import ErrorRecord, Location
from dpone.records import record

MAX_DOCUMENT_BYTES = 5 * 1024 * 1024
MAX_NODES = 200_000
MAX_FLOW_DEPTH = 64
TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
MERGE_TAG = "tag:yaml.org,2002:merge"
# YAML 1.2's core schema: the only tags a catalog or manifest may carry, implicitly or written out.
# Any other tag (``!!binary``, ``!!set``, ``!!python/...``, ``!local``) would turn a value into
# something else than the text the reviewer reads (``!!binary aGVsbG8=`` is bytes, not a string).
CORE_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}"
    for name in ("str", "int", "float", "bool", "null", "map", "seq", "timestamp", "merge")
)


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


class _DuplicateKey(Exception):
    def __init__(self, key: object, node: Node, first: Node | None = None) -> None:
        super().__init__(key)
        self.key = key
        self.node = node
        self.first = first


Position = tuple[int, int]


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
        self.positions: dict[tuple[str | int, ...], Position] = {}
        self.budget = _Budget()

    def scalar(self, node: ScalarNode) -> Any:
        if node.tag == TIMESTAMP_TAG:
            return str(node.value)
        if node.tag == MERGE_TAG:
            return "<<"
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


@record
class YamlDocument:
    """A parsed document: plain data plus a path -> (line, column) index (1-based)."""

    path: str
    data: Any
    positions: dict[tuple[str | int, ...], tuple[int, int]]

    def locate(self, path: tuple[str | int, ...], key: bool = False) -> Location:
        """The closest known position of ``path`` (walking up to the parent when unknown)."""
        probe = path
        while probe:
            if key and (*probe, "__key__") in self.positions:
                line, col = self.positions[(*probe, "__key__")]
                return Location(self.path, line, col)
            if probe in self.positions:
                line, col = self.positions[probe]
                return Location(self.path, line, col)
            probe = probe[:-1]
        return Location(self.path, 1, 1)


def _parse(yaml: YAML, text: str) -> tuple[Any, dict[tuple[str | int, ...], Position]]:
    with warnings.catch_warnings():
        # ruamel warns (ReusedAnchorWarning) on stderr; a reused anchor is legal YAML and the
        # structured output must stay the only thing dpone prints.
        warnings.simplefilter("ignore")
        node = yaml.compose(text)
    if node is None:
        return None, {}
    builder = _Builder(yaml)
    return builder.build(node, ()), builder.positions


def _read_bounded(path: Path) -> bytes:
    """At most MAX_DOCUMENT_BYTES + 1 bytes of a regular file: a path naming /dev/zero, a FIFO
    or a device must fail fast, not read forever or block."""
    if not stat.S_ISREG(path.stat().st_mode):
        raise IsADirectoryError(errno.EISDIR, "not a regular file")
    with path.open("rb") as handle:
        return handle.read(MAX_DOCUMENT_BYTES + 1)


def load_yaml(path: Path, display: str) -> tuple[YamlDocument | None, list[ErrorRecord]]:
    """Parse one YAML file; returns the document or the located errors (never raises)."""
    try:
        raw = _read_bounded(path)
    except ValueError:  # an embedded NUL byte in the path
        return None, [
            ErrorRecord(errors.FILE_NOT_FOUND, f"invalid file name: {display!r}", Location(display))
        ]
    except FileNotFoundError:
        return None, [
            ErrorRecord(errors.FILE_NOT_FOUND, f"file not found: {display}", Location(display))
        ]
    except OSError as exc:
        return None, [
            ErrorRecord(
                errors.FILE_NOT_FOUND, f"cannot read {display}: {exc.strerror}", Location(display)
            )
        ]
    if len(raw) > MAX_DOCUMENT_BYTES:
        return None, [
            ErrorRecord(
                errors.YAML_INVALID,
                f"{display} exceeds {MAX_DOCUMENT_BYTES} bytes",
                Location(display),
            )
        ]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [
            ErrorRecord(errors.YAML_INVALID, f"not UTF-8 at byte {exc.start}", Location(display))
        ]
    try:
        data, positions = _parse(_new_yaml(), text)
    except _DuplicateKey as dup:
        dup_line, dup_col = _mark(dup.node)
        if dup.key is None:
            message = "mapping keys must be plain values, not mappings or lists"
        else:
            first = f" (first at line {_mark(dup.first)[0]})" if dup.first is not None else ""
            message = f"duplicate key {dup.key!r}{first}"
        where = Location(display, dup_line, dup_col)
        return None, [ErrorRecord(errors.YAML_INVALID, message, where)]
    except _ForbiddenTag as bad:
        tag_line, tag_col = _mark(bad.node)
        tag = str(bad.node.tag).replace("tag:yaml.org,2002:", "!!")
        message = (
            f"the YAML tag {tag[:80]!r} is not allowed: values are plain strings, numbers, "
            "booleans, null, lists and mappings (YAML 1.2 core schema)"
        )
        where = Location(display, tag_line, tag_col)
        return None, [ErrorRecord(errors.YAML_INVALID, message, where)]
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        col = mark.column + 1 if mark is not None else None
        problem = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        return None, [ErrorRecord(errors.YAML_INVALID, problem, Location(display, line, col))]
    except (RecursionError, _TooManyNodes):
        return None, [
            ErrorRecord(
                errors.YAML_INVALID,
                f"document nests too deeply or expands beyond {MAX_NODES} nodes (aliases)",
                Location(display),
            )
        ]
    except (YAMLError, ValueError, TypeError, AttributeError, OverflowError) as exc:
        message = " ".join(str(exc).split())[:300] or type(exc).__name__
        return None, [ErrorRecord(errors.YAML_INVALID, message, Location(display))]
    return YamlDocument(display, data, positions), []
