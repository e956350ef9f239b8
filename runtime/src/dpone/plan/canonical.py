"""Canonical JSON and sha256 fingerprints: the one byte form every hash and env value uses."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def _reject_floats(value: Any, path: str = "$") -> None:
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return
    if isinstance(value, float):
        raise TypeError(f"float at {path}: hashed artifacts hold no floats")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"non-string key at {path}")
            _reject_floats(item, f"{path}.{key}")
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _reject_floats(item, f"{path}[{index}]")
        return
    raise TypeError(f"{type(value).__name__} at {path} is not canonical JSON")


def canonical_text(value: Any) -> str:
    """sort_keys, no spaces, UTF-8 kept as is; raises TypeError on floats and foreign types."""
    _reject_floats(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_bytes(value: Any) -> bytes:
    return canonical_text(value).encode("utf-8")


def fingerprint(value: Any) -> str:
    """``sha256:`` + 64 lowercase hex over the canonical bytes of ``value``."""
    return "sha256:" + hashlib.sha256(canonical_bytes(value)).hexdigest()


def is_fingerprint(value: object) -> bool:
    if not isinstance(value, str) or len(value) != 71 or not value.startswith("sha256:"):
        return False
    return all(c in "0123456789abcdef" for c in value[7:])
