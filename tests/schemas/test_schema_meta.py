"""Every published schema is a valid Draft 2020-12 schema inside the subset dpone's own validator
implements, and the repository's schemas/ is exactly what the package ships."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from dpone.authoring.schema import load_schema
from jsonschema import Draft202012Validator

from .support import REPO, SCHEMA_DIR, SCHEMA_FILES, registry, schema_json

IDS = [path.name for path in SCHEMA_FILES]

# Keywords dpone.authoring.schema evaluates, plus annotations it may ignore. A schema using any
# other keyword would be enforced by third-party validators but silently skipped by dpone.
ENFORCED = {
    "type", "const", "enum", "$ref", "pattern", "minLength", "maxLength", "minimum", "maximum",
    "items", "minItems", "maxItems", "required", "properties", "additionalProperties",
    "minProperties", "maxProperties", "propertyNames",
}  # fmt: skip
ANNOTATIONS = {"$schema", "$id", "$defs", "title", "description"}


def subschemas(schema: dict[str, Any]) -> list[dict[str, Any]]:
    found = [schema]
    for key in ("properties", "$defs"):
        for child in schema.get(key, {}).values():
            found.extend(subschemas(child))
    for key in ("items", "additionalProperties", "propertyNames"):
        if isinstance(schema.get(key), dict):
            found.extend(subschemas(schema[key]))
    return found


def test_the_contract_schemas_are_published() -> None:
    assert set(IDS) >= {
        "error.v1.schema.json",
        "mapping-item.v1.schema.json",
        "mapping-plan.v1.schema.json",
        "mapping-policy.v1.schema.json",
        "pipeline.v1.schema.json",
        "run-identity.v1.schema.json",
        "workload-catalog.v1.schema.json",
    }


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=IDS)
def test_schema_is_valid_draft_2020_12(path: Path) -> None:
    schema = schema_json(path.name)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == path.name
    Draft202012Validator.check_schema(schema)
    assert Draft202012Validator.META_SCHEMA["$id"].startswith(
        "https://json-schema.org/draft/2020-12/"
    )


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=IDS)
def test_schema_uses_only_keywords_dpone_enforces(path: Path) -> None:
    for sub in subschemas(schema_json(path.name)):
        unknown = set(sub) - ENFORCED - ANNOTATIONS
        assert not unknown, f"{path.name}: {sorted(unknown)} not enforced by dpone's validator"
        if "$ref" in sub:
            assert set(sub) <= {"$ref", "description"}, f"{path.name}: siblings of $ref: {sub}"


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=IDS)
def test_every_ref_resolves(path: Path) -> None:
    resolver = registry().resolver(base_uri=path.name)
    for sub in subschemas(schema_json(path.name)):
        if "$ref" in sub:
            resolved = resolver.lookup(sub["$ref"]).contents
            assert isinstance(resolved, dict) and resolved


def test_repository_schemas_are_the_packaged_schemas() -> None:
    assert SCHEMA_DIR.resolve() == (REPO / "runtime" / "src" / "dpone" / "schemas").resolve()
    packaged = resources.files("dpone").joinpath("schemas")
    names = sorted(entry.name for entry in packaged.iterdir() if entry.name.endswith(".json"))
    assert names == IDS
    for name in names:
        assert load_schema(name) == schema_json(name)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_number_that_is_not_finite_is_refused_whatever_its_bounds(value: float) -> None:
    """YAML's .nan passes every minimum and maximum (no comparison with it is true) and JSON
    has no such number: `backfill.coalesce.max_seconds: .nan` once reached the planner."""
    from dpone.authoring.schema import validate

    schema = {"type": "number", "minimum": 0.1, "maximum": 3600}
    (violation,) = validate(value, schema)
    assert "not a finite number" in violation.message
    assert validate(1.5, schema) == [] and validate(2, {"type": ["number", "null"]}) == []
