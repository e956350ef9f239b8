"""A small, standard-library validator for the subset of JSON Schema that dpone's schemas use.

The schemas in ``dpone/schemas`` (published as ``schemas/``) are the single description of the
authoring surface: this module walks them so the Python validation and the published schema can
never disagree, and reports every violation with its document path.
"""

from __future__ import annotations

import json
import math
import os
import re
from functools import cache
from typing import Any

from dpone.records import record
from dpone.suggest import did_you_mean

Path = tuple[str | int, ...]


@record
class SchemaViolation:
    path: Path
    message: str


@cache
def load_schema(name: str) -> dict[str, Any]:
    """A schema by file name, from the package (``schemas/`` in the repository).

    Read beside this module when the package is on disk (a wheel or an editable install):
    importlib.resources costs a pod about 3 ms more to import and set up for the same bytes; it
    stays the way in for a package imported from a zip file."""
    here = os.path.join(os.path.dirname(os.path.dirname(__file__)), "schemas", name)
    try:
        with open(here, encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        from importlib import resources

        text = resources.files("dpone").joinpath("schemas", name).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@cache
def _pattern(expr: str) -> re.Pattern[str]:
    # JSON Schema patterns are ECMA-262 regexes, whose ``$`` matches only at the very end;
    # Python's also matches before a final newline, which would let "name\n" through.
    if expr.endswith("$") and not expr.endswith("\\$"):
        expr = expr[:-1] + r"\Z"
    return re.compile(expr)


def _type_ok(value: Any, expected: str) -> bool:
    if expected == "object":
        return isinstance(value, dict)
    if expected == "array":
        return isinstance(value, list)
    if expected == "string":
        return isinstance(value, str)
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "boolean":
        return isinstance(value, bool)
    if expected == "null":
        return value is None
    if expected == "number":  # YAML's .nan and .inf are not: JSON has none, no bound holds them
        finite = not isinstance(value, float) or math.isfinite(value)
        return isinstance(value, int | float) and not isinstance(value, bool) and finite
    raise ValueError(f"unsupported schema type {expected!r}")


def _any_type_ok(value: Any, types: list[str]) -> bool:
    return any(_type_ok(value, t) for t in types)


#: How an error names a value's kind; bool before int (a bool is an int to isinstance).
_KINDS: tuple[tuple[type, str], ...] = (
    (type(None), "null"),
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a number"),
    (str, "a string"),
    (list, "a list"),
    (dict, "a mapping"),
)


def _describe(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "not a finite number (.nan or .inf)"
    return next((text for kind, text in _KINDS if isinstance(value, kind)), type(value).__name__)


def _resolve(ref: str, root: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    if ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node[part]
        return node, root
    other = load_schema(ref)
    return other, other


def validate(
    value: Any, schema: dict[str, Any], root: dict[str, Any] | None = None
) -> list[SchemaViolation]:
    """Every violation of ``schema`` by ``value``, in document order."""
    out: list[SchemaViolation] = []
    _walk(value, schema, root or schema, (), out)
    return out


def _walk(
    value: Any, schema: dict[str, Any], root: dict[str, Any], path: Path, out: list[SchemaViolation]
) -> None:
    if "$ref" in schema:
        target, target_root = _resolve(schema["$ref"], root)
        _walk(value, target, target_root, path, out)
        return
    if "const" in schema and value != schema["const"]:
        out.append(SchemaViolation(path, f"must be {schema['const']!r}, got {value!r}"))
        return
    if "enum" in schema and not any(
        value == option and type(value) is type(option) for option in schema["enum"]
    ):
        options = ", ".join(str(o) for o in schema["enum"])
        out.append(SchemaViolation(path, f"must be one of {options}, got {value!r}"))
        return
    expected = schema.get("type")
    if expected is not None:
        types = expected if isinstance(expected, list) else [expected]
        if not (_type_ok(value, types[0]) if len(types) == 1 else _any_type_ok(value, types)):
            out.append(
                SchemaViolation(path, f"must be {' or '.join(types)}, got {_describe(value)}")
            )
            return
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            out.append(
                SchemaViolation(path, f"must have at least {schema['minLength']} character(s)")
            )
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            out.append(SchemaViolation(path, f"must have at most {schema['maxLength']} characters"))
        if "pattern" in schema and not _pattern(schema["pattern"]).search(value):
            out.append(SchemaViolation(path, f"{value[:80]!r} does not match {schema['pattern']}"))
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(SchemaViolation(path, f"must be >= {schema['minimum']}, got {value}"))
        if "maximum" in schema and value > schema["maximum"]:
            out.append(SchemaViolation(path, f"must be <= {schema['maximum']}, got {value}"))
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            out.append(SchemaViolation(path, f"must have at least {schema['minItems']} item(s)"))
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.append(SchemaViolation(path, f"must have at most {schema['maxItems']} items"))
        if "items" in schema:
            for index, item in enumerate(value):
                _walk(item, schema["items"], root, (*path, index), out)
    if isinstance(value, dict):
        _walk_object(value, schema, root, path, out)


def _walk_object(
    value: dict[Any, Any],
    schema: dict[str, Any],
    root: dict[str, Any],
    path: Path,
    out: list[SchemaViolation],
) -> None:
    props: dict[str, Any] = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in value:
            out.append(SchemaViolation(path, f"missing required field {key!r}"))
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        out.append(
            SchemaViolation(path, f"must have at least {schema['minProperties']} entr(y/ies)")
        )
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        out.append(SchemaViolation(path, f"must have at most {schema['maxProperties']} entries"))
    names = schema.get("propertyNames")
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if not isinstance(key, str):
            out.append(SchemaViolation(path, f"key {key!r} must be a string"))
            continue
        if names is not None:
            for violation in validate(key, names, root):
                out.append(SchemaViolation((*path, key), f"name {violation.message}"))
        if key in props:
            _walk(item, props[key], root, (*path, key), out)
        elif extra is False:
            hint = did_you_mean(key, props)
            out.append(SchemaViolation((*path, key), f"unknown field {key!r}{hint}"))
        elif isinstance(extra, dict):
            _walk(item, extra, root, (*path, key), out)
