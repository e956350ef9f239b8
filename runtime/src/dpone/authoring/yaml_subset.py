"""The common subset of YAML that catalogs and manifests are written in, read without ruamel.

Every pod parses the catalog and its workload's manifest; ruamel's pure-Python composer and its
import cost that pod more than all of dpone's own start-up work. Catalogs and manifests are
almost always written in a small part of YAML: block mappings and sequences, one-line flow
collections (``{schema: raw, name: orders}``, ``[order_id]``), plain and simply quoted scalars,
comments. This module reads exactly that part and gives up (returns None) at the first thing
outside it: anchors, aliases, tags, block scalars, multi-line scalars, escapes, tabs, document
markers, duplicate keys, floats, non-ASCII control characters, anything unusual. ``yamldoc``
then hands the text to ruamel, which reads it, or reports the error with its position.

What it returns is what ruamel's safe (YAML 1.2) composer and ``yamldoc``'s builder return for
the same text: the same values with the same types, the same positions; the property tests
compare the two on every project file and on generated documents.
"""

from __future__ import annotations

import re
from typing import Any

Path = tuple[str | int, ...]
Positions = dict[Path, tuple[int, int]]
Parsed = tuple[Any, Positions]

MAX_FLOW_DEPTH = 64

# YAML 1.2 core schema as ruamel resolves a plain scalar (ruamel.yaml.resolver, version (1, 2)).
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_NULLS = frozenset({"~", "null", "Null", "NULL"})
# A scalar made of these (an exponent's sign aside) may be a float or an int to ruamel.
_NUMBER_CHARS = frozenset("0123456789_.eE")
# First characters a plain scalar may not start with here (YAML indicators, quotes handled apart).
_NOT_PLAIN_START = frozenset("-?:,[]{}#&*!|>'\"%@`=<")
_FLOW_STOP = frozenset(",[]{}")
_FLOW_PLAIN_END = re.compile(r"[,\[\]{}]|: |:$| #")


class _Outside(Exception):
    """The text leaves the subset: ruamel reads it instead."""


def _resolve(text: str) -> Any:
    """A plain scalar's value, as ruamel's YAML 1.2 resolver and safe constructor make it."""
    if text in _BOOLS:
        return _BOOLS[text]
    if text in _NULLS:
        return None
    if text[0] in "-+.0123456789":
        body = text[1:] if text[0] in "-+" else text
        if body.isdecimal() and body.isascii() and (body == "0" or body[0] != "0"):
            if text[0] != "+":
                return int(text)
        if _may_be_number(body):
            raise _Outside
    # Any other text, a timestamp among them: yamldoc keeps the text the author wrote.
    return text


def _may_be_number(body: str) -> bool:
    """Whether ruamel might read a float or a non-decimal int (a superset of its patterns, so a
    scalar that is not left to ruamel is a string to it too)."""
    if body[:2] in ("0x", "0b", "0o") or body.lower() in (".inf", ".nan"):
        return True
    for sign in ("e-", "e+", "E-", "E+"):
        body = body.replace(sign, "e")
    return set(body) <= _NUMBER_CHARS


def _outside_characters(text: str) -> bool:
    """Characters ruamel refuses or reads as a line break, a tab, a byte order mark, a NUL..."""
    for char in set(text):
        code = ord(char)
        if code < 0x7F:
            if code < 0x20 and char != "\n":
                return True
        elif not (
            0xA0 <= code <= 0x2027
            or 0x202A <= code <= 0xD7FF
            or 0xE000 <= code <= 0xFEFE
            or 0xFF00 <= code <= 0xFFFD
            or code >= 0x10000
        ):
            return True
    return False


def _quoted(line: str, start: int) -> tuple[str, int]:
    """A one-line quoted scalar starting at ``start``: its value and the index after it."""
    quote = line[start]
    if quote == "'":
        index = start + 1
        parts = []
        while True:
            end = line.find("'", index)
            if end < 0:
                raise _Outside
            parts.append(line[index:end])
            if line.startswith("''", end):
                parts.append("'")
                index = end + 2
                continue
            return "".join(parts), end + 1
    end = line.find('"', start + 1)
    if end < 0 or "\\" in line[start + 1 : end]:
        raise _Outside
    return line[start + 1 : end], end + 1


def _indicator_first(text: str) -> bool:
    """Whether a plain scalar would start with an indicator (``-`` only before a space)."""
    if text[0] == "-":
        return len(text) == 1 or text[1] in " ,[]{}"
    return text[0] in _NOT_PLAIN_START


def _plain_key(text: str) -> Any:
    """A mapping key: a plain scalar on one line, with no indicator or separator in it."""
    if (
        not text
        or _indicator_first(text)
        or text != text.strip(" ")
        or any(mark in text for mark in ",[]{}:#")
    ):
        raise _Outside
    return _resolve(text)


def _plain_block(text: str) -> Any:
    """A plain scalar ending a block line (its comment already cut)."""
    if not text or _indicator_first(text) or ": " in text or text.endswith(":"):
        raise _Outside
    if any(mark in text for mark in "[]{}"):
        raise _Outside
    return _resolve(text)


class _Reader:
    """One document: lines with their indent, read by recursive descent."""

    def __init__(self, text: str) -> None:
        self.positions: Positions = {}
        # (line number, indent, line without its trailing spaces): indexes into a line are columns
        self.lines: list[tuple[int, int, str]] = []
        for number, raw in enumerate(text.split("\n"), 1):
            line = raw.rstrip(" ")
            content = line.lstrip(" ")
            if not content or content.startswith("#"):
                continue
            self.lines.append((number, len(line) - len(content), line))
        self.index = 0

    # -- flow collections on one line -------------------------------------------------------

    def flow(self, line: str, at: int, number: int, path: Path, depth: int) -> tuple[Any, int]:
        """The flow node starting at ``line[at]`` (not a space): its value and the index after."""
        if at >= len(line):
            raise _Outside  # a collection or a value going on to the next line
        opener = line[at]
        if opener in "[{":
            if depth >= MAX_FLOW_DEPTH:
                raise _Outside
            closer = "]" if opener == "[" else "}"
            result: Any = [] if opener == "[" else {}
            at = self.spaces(line, at + 1)
            if line.startswith(closer, at):
                return result, at + 1
            while True:
                if opener == "[":
                    self.positions[(*path, len(result))] = (number, at + 1)
                    value, at = self.flow(line, at, number, (*path, len(result)), depth + 1)
                    result.append(value)
                else:
                    key_at = at
                    key, at = self.flow_key(line, at)
                    if key in result:
                        raise _Outside
                    at = self.spaces(line, at)
                    child = (*path, str(key))
                    self.positions[(*child, "__key__")] = (number, key_at + 1)
                    self.positions[child] = (number, at + 1)
                    result[key], at = self.flow(line, at, number, child, depth + 1)
                at = self.spaces(line, at)
                if line.startswith(closer, at):
                    return result, at + 1
                if not line.startswith(",", at):
                    raise _Outside
                at = self.spaces(line, at + 1)
                if at >= len(line) or line[at] in "]}":
                    raise _Outside  # a trailing comma or an unclosed collection
        if opener in "'\"":
            return _quoted(line, at)
        match = _FLOW_PLAIN_END.search(line, at)
        end = match.start() if match else len(line)
        text = line[at:end].rstrip(" ")
        if not text or _indicator_first(text) or ":" in text or "#" in text:
            raise _Outside
        return _resolve(text), at + len(text)

    def flow_key(self, line: str, at: int) -> tuple[Any, int]:
        """A plain key of a flow mapping and the index after its ``: ``."""
        end = line.find(": ", at)
        if end < 0:
            raise _Outside
        return _plain_key(line[at:end]), end + 2

    @staticmethod
    def spaces(line: str, at: int) -> int:
        while at < len(line) and line[at] == " ":
            at += 1
        return at

    # -- block structure ----------------------------------------------------------------------

    def inline(self, line: str, at: int, number: int, path: Path) -> Any:
        """The value written on the line after a key or a ``- ``: a flow node or a scalar."""
        first = line[at]
        if first in "[{'\"":
            value, end = self.flow(line, at, number, path, 0)
            rest = line[end:].lstrip(" ")
            if rest and not (rest.startswith("#") and line[end] == " "):
                raise _Outside
            return value
        comment = line.find(" #", at)
        return _plain_block(line[at:comment].rstrip(" ") if comment >= 0 else line[at:])

    def after_inline(self, indent: int) -> None:
        """A scalar on one line is whole: a deeper line after it would continue it."""
        if self.index < len(self.lines) and self.lines[self.index][1] > indent:
            raise _Outside

    def node(self, path: Path) -> Any:
        _, indent, line = self.lines[self.index]
        if _is_entry(line, indent):
            return self.sequence(indent, path)
        return self.mapping(indent, path)

    def mapping(self, indent: int, path: Path) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        while self.index < len(self.lines):
            number, line_indent, line = self.lines[self.index]
            if line_indent < indent:
                break
            if line_indent > indent or _is_entry(line, indent):
                raise _Outside
            colon = line.find(": ", indent)
            if colon < 0:
                if not line.endswith(":"):
                    raise _Outside
                colon = len(line) - 1
            key = _plain_key(line[indent:colon])
            if key in result:
                raise _Outside
            child = (*path, str(key))
            self.positions[(*child, "__key__")] = (number, indent + 1)
            self.index += 1
            value_at = self.spaces(line, colon + 1)
            if value_at < len(line) and line[value_at] != "#":
                self.positions[child] = (number, value_at + 1)
                result[key] = self.inline(line, value_at, number, child)
                self.after_inline(indent)
                continue
            if self.index >= len(self.lines):
                raise _Outside  # an empty value: left to ruamel
            next_number, next_indent, next_line = self.lines[self.index]
            if next_indent > indent or (next_indent == indent and _is_entry(next_line, indent)):
                self.positions[child] = (next_number, next_indent + 1)
                result[key] = self.node(child)
            else:
                raise _Outside  # an empty value: left to ruamel
        return result

    def sequence(self, indent: int, path: Path) -> list[Any]:
        result: list[Any] = []
        while self.index < len(self.lines):
            number, line_indent, line = self.lines[self.index]
            if line_indent < indent or not _is_entry(line, indent):
                break
            if line_indent > indent:
                raise _Outside
            item_at = self.spaces(line, indent + 1)
            if item_at >= len(line) or line[item_at] == "#":
                raise _Outside  # an item on the next lines, or an empty one: left to ruamel
            item_path = (*path, len(result))
            self.positions[item_path] = (number, item_at + 1)
            if _is_entry(line, item_at):
                raise _Outside  # a sequence in a sequence on one line
            rest = line[item_at:]
            if rest[0] not in "[{'\"" and (": " in rest or rest.endswith(":")):
                # "- key: value": a mapping whose keys sit at the column of its first key
                self.lines[self.index] = (number, item_at, " " * item_at + rest)
                result.append(self.mapping(item_at, item_path))
                continue
            self.index += 1
            result.append(self.inline(line, item_at, number, item_path))
            self.after_inline(indent)
        return result


def _is_entry(line: str, indent: int) -> bool:
    """Whether the line holds a block sequence entry (``-`` then a space or the end) at ``indent``."""
    return line.startswith("-", indent) and (len(line) == indent + 1 or line[indent + 1] == " ")


def parse_subset(text: str) -> Parsed | None:
    """``(data, positions)`` as ``yamldoc`` builds them, or None when the text leaves the subset."""
    if _outside_characters(text):
        return None
    reader = _Reader(text)
    if not reader.lines:
        return None
    if reader.lines[0][1] != 0 or reader.lines[0][2].startswith(("---", "...", "%")):
        return None
    try:
        data = reader.node(())
    except (_Outside, RecursionError):
        return None
    if reader.index != len(reader.lines) or len(reader.positions) > 100_000:
        return None
    return data, reader.positions
