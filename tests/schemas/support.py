"""The published JSON Schemas, loaded the way a third party would: the `jsonschema` library,
Draft 2020-12, with a `referencing` registry so cross-file refs such as
"mapping-policy.v1.schema.json" resolve. Plus the golden documents the schemas describe."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from dpone.authoring.yamldoc import load_yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

REPO = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO / "schemas"
GOLDEN = REPO / "golden"
SCHEMA_FILES: tuple[Path, ...] = tuple(sorted(SCHEMA_DIR.glob("*.schema.json")))
CATALOG = "workload-catalog.v1.schema.json"
PIPELINE = "pipeline.v1.schema.json"
POLICY = "mapping-policy.v1.schema.json"
PLAN = "mapping-plan.v1.schema.json"
ITEM = "mapping-item.v1.schema.json"
ERROR = "error.v1.schema.json"
IDENTITY = "run-identity.v1.schema.json"


@cache
def schema_json(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SCHEMA_DIR / name).read_text(encoding="utf-8"))
    return loaded


@cache
def registry() -> Registry[Any]:
    resources = [
        (
            path.name,
            Resource.from_contents(schema_json(path.name), default_specification=DRAFT202012),
        )
        for path in SCHEMA_FILES
    ]
    return Registry().with_resources(resources)


@cache
def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(schema_json(name), registry=registry())


def errors_of(name: str, instance: Any) -> list[str]:
    return [error.message for error in validator(name).iter_errors(instance)]


@dataclass(frozen=True)
class GoldenDoc:
    """One golden YAML document as plain data, with the schema it must satisfy."""

    project: str
    file: str
    schema: str
    data: Any

    @property
    def id(self) -> str:
        return f"{self.project}/{self.file}"


def _plain(path: Path) -> Any:
    doc, problems = load_yaml(path, str(path))
    assert doc is not None, problems
    return doc.data


@cache
def golden_docs() -> tuple[GoldenDoc, ...]:
    """Every golden catalog and every manifest it references."""
    found: list[GoldenDoc] = []
    for catalog in sorted(GOLDEN.glob("*/workloads.yaml")):
        project = catalog.parent.name
        data = _plain(catalog)
        found.append(GoldenDoc(project, catalog.name, CATALOG, data))
        manifests = sorted({w["manifest"] for w in data["workloads"].values()})
        for manifest in manifests:
            found.append(GoldenDoc(project, manifest, PIPELINE, _plain(catalog.parent / manifest)))
    return tuple(found)


def has_integral_float(value: Any) -> bool:
    """5.0 and friends: JSON Schema's data model calls them integers; dpone does not."""
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, dict):
        return any(has_integral_float(v) for v in value.values())
    if isinstance(value, list):
        return any(has_integral_float(v) for v in value)
    return False


def has_trailing_newline(value: Any) -> bool:
    """A string ending in a newline, which Python's ``$`` accepts and ECMA-262's does not."""
    if isinstance(value, str):
        return value.endswith("\n")
    if isinstance(value, dict):
        return any(has_trailing_newline(k) or has_trailing_newline(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_trailing_newline(v) for v in value)
    return False
