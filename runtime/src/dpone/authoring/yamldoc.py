"""YAML loading with source positions, so every error can name file:line:column.

A document is plain data plus the line and column of every mapping key, value and sequence item.
YAML 1.2 rules apply (``yes``/``no`` stay strings); duplicate keys are errors; timestamps are kept
as the text the author wrote, so chunk bounds are parsed once, by the chunk planner. The common
subset catalogs and manifests are written in is read by ``yaml_subset`` (fast, no dependency);
anything else, and every error, by ruamel.yaml in ``yaml_ruamel``: both give the same result.
"""

from __future__ import annotations

import errno
import stat
from pathlib import Path
from typing import Any

from dpone import errors
from dpone.authoring.yaml_subset import parse_subset
from dpone.errors import ErrorRecord, Location
from dpone.records import record

MAX_DOCUMENT_BYTES = 5 * 1024 * 1024


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
        from dpone.authoring.yaml_ruamel import line_column

        before = raw[: exc.start].decode("utf-8")  # the bytes up to the first bad one decode
        line, col = line_column(before, len(before))
        message = f"not UTF-8 at byte {exc.start} (0x{raw[exc.start]:02x})"
        return None, [ErrorRecord(errors.YAML_INVALID, message, Location(display, line, col))]
    parsed = parse_subset(text)
    if parsed is None:
        from dpone.authoring import yaml_ruamel

        outcome = yaml_ruamel.parse(text, display)
        if isinstance(outcome, ErrorRecord):
            return None, [outcome]
        parsed = outcome
    data, positions = parsed
    return YamlDocument(display, data, positions), []
