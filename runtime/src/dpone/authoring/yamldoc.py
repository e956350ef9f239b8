"""YAML loading with source positions, so every error can name file:line:column.

ruamel.yaml (YAML 1.2: ``yes``/``no`` stay strings) in round-trip mode keeps line and column
for every mapping key and sequence item; duplicate keys are errors. Timestamps are kept as the
text the author wrote, so chunk bounds are parsed once, by the chunk planner.
"""

from __future__ import annotations

import errno
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.constructor import RoundTripConstructor
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.scanner import RoundTripScanner, ScannerError

from dpone import errors
from dpone.errors import ErrorRecord, Location

MAX_DOCUMENT_BYTES = 5 * 1024 * 1024


class _TextTimestampConstructor(RoundTripConstructor):
    """Keeps YAML timestamps as their source text (the planner parses bounds itself)."""


def _timestamp_as_text(loader: RoundTripConstructor, node: Any) -> str:
    return str(loader.construct_scalar(node))


_TextTimestampConstructor.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_text)


MAX_NODES = 200_000
MAX_FLOW_DEPTH = 64


class _BoundedScanner(RoundTripScanner):
    """Refuses flow collections (``[ ]``, ``{ }``) nested deeper than MAX_FLOW_DEPTH.

    ruamel's scanner slows down super-linearly with flow depth: 1,000 nested ``[`` (4 KB) took
    7 s to reject. The scanner knows the real flow context, so the check is exact and cheap.
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


class _Budget:
    """Counts visited nodes: aliases can make a small file expand exponentially."""

    def __init__(self) -> None:
        self.left = MAX_NODES

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise RecursionError("too many nodes")


def _plain(value: Any, budget: _Budget) -> Any:
    """Round-trip containers to plain dicts/lists (positions are kept in a separate index)."""
    budget.spend()
    if isinstance(value, dict):
        return {key: _plain(item, budget) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item, budget) for item in value]
    if isinstance(value, float):
        return value
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value if not isinstance(value, str) else str(value)
    return str(value)


@dataclass(frozen=True)
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


def _index(
    node: Any,
    path: tuple[str | int, ...],
    out: dict[tuple[str | int, ...], tuple[int, int]],
    budget: _Budget,
) -> None:
    budget.spend()
    if isinstance(node, CommentedMap):
        for key in node:
            try:
                kline, kcol = node.lc.key(key)
                vline, vcol = node.lc.value(key)
            except (KeyError, TypeError, AttributeError):
                continue
            child = (*path, str(key))
            out[(*child, "__key__")] = (kline + 1, kcol + 1)
            out[child] = (vline + 1, vcol + 1)
            _index(node[key], child, out, budget)
    elif isinstance(node, CommentedSeq):
        for i, item in enumerate(node):
            try:
                line, col = node.lc.item(i)
            except (KeyError, TypeError, AttributeError):
                continue
            out[(*path, i)] = (line + 1, col + 1)
            _index(item, (*path, i), out, budget)


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
    yaml = YAML(typ="rt")
    yaml.Constructor = _TextTimestampConstructor
    yaml.Scanner = _BoundedScanner
    yaml.allow_duplicate_keys = False
    try:
        node = yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        col = mark.column + 1 if mark is not None else None
        problem = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        return None, [ErrorRecord(errors.YAML_INVALID, problem, Location(display, line, col))]
    except (YAMLError, RecursionError, ValueError, TypeError, AttributeError) as exc:
        message = " ".join(str(exc).split())[:300] or type(exc).__name__
        return None, [ErrorRecord(errors.YAML_INVALID, message, Location(display))]
    positions: dict[tuple[str | int, ...], tuple[int, int]] = {}
    try:
        _index(node, (), positions, _Budget())
        data = _plain(node, _Budget())
    except RecursionError:
        return None, [
            ErrorRecord(
                errors.YAML_INVALID,
                f"document nests too deeply or expands beyond {MAX_NODES} nodes (aliases)",
                Location(display),
            )
        ]
    return YamlDocument(display, data, positions), []
