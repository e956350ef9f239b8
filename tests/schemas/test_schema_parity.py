"""The published schemas and dpone's Python validation accept and reject the same inputs.

Python side: ``dpone.authoring.schema.validate`` for catalogs and manifests, ``normalize_policy``
for mapping policies, ``parse_mapping_item`` for items. Corpus: hand-written cases plus
hypothesis mutations of the golden documents (drop a required key, add an unknown key, wrong
types, out-of-range integers, booleans for integers, ...).

Where the two may differ, Python is STRICTER and never laxer. The differences, each pinned by a
test below, are rules JSON Schema cannot express or that the `jsonschema` library evaluates
differently from the JSON Schema specification:

1. ``max_active <= max_items`` (policy) and ``chunks_count == last - first + 1``,
   ``first <= last`` (item): cross-field rules, not expressible in JSON Schema.
2. Integral floats such as ``5.0``: JSON Schema's data model treats them as integers; dpone
   refuses floats wherever an integer is expected (YAML ``5.0`` is a typo, not a count).
3. A string ending in a newline: the `jsonschema` library runs ``pattern`` with Python's
   ``re.search``, whose ``$`` also matches before a final ``\\n``; the specification says
   ECMA-262 regexes, whose ``$`` does not. dpone follows ECMA-262 (``"pool\\n"`` is refused).

Everywhere else the verdicts are asserted equal.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from dpone.authoring.schema import load_schema
from dpone.authoring.schema import validate as dpone_validate
from dpone.errors import DponeError
from dpone.plan.mapping import normalize_policy
from dpone.task.item import parse_mapping_item
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from .support import (
    CATALOG,
    ITEM,
    PIPELINE,
    POLICY,
    golden_docs,
    has_integral_float,
    has_trailing_newline,
    validator,
)

Path = tuple[str | int, ...]


# --- the two verdicts --------------------------------------------------------------------------


def schema_ok(name: str, value: Any) -> bool:
    return bool(validator(name).is_valid(value))


def python_doc_ok(name: str, value: Any) -> bool:
    return not dpone_validate(value, load_schema(name))


def python_policy_ok(value: Any) -> bool:
    return normalize_policy(value)[0] is not None


def python_item_ok(value: Any) -> bool:
    try:
        parse_mapping_item(json.dumps(value, ensure_ascii=False))
    except DponeError:
        return False
    return True


def known_divergence(value: Any) -> bool:
    return has_integral_float(value) or has_trailing_newline(value)


def policy_cross_field(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    items, active = value.get("max_items", 200), value.get("max_active", 16)
    both_int = all(isinstance(v, int) and not isinstance(v, bool) for v in (items, active))
    return both_int and active > items


def item_cross_field(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    fields = [value.get(k) for k in ("first_chunk_index", "last_chunk_index", "chunks_count")]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in fields):
        return False
    first, last, count = fields
    return bool(last < first or count != last - first + 1)


def assert_parity(schema_verdict: bool, python_verdict: bool, python_stricter: bool) -> None:
    """Equal verdicts; where a documented divergence applies, Python may only be stricter."""
    if python_stricter:
        assert not (
            python_verdict and not schema_verdict
        ), "Python accepted what the schema refuses"
    else:
        assert python_verdict == schema_verdict


def check_document(name: str, value: Any) -> None:
    assert_parity(schema_ok(name, value), python_doc_ok(name, value), known_divergence(value))


def check_policy(value: Any) -> None:
    stricter = known_divergence(value) or policy_cross_field(value)
    assert_parity(schema_ok(POLICY, value), python_policy_ok(value), stricter)


def check_item(value: Any) -> None:
    stricter = known_divergence(value) or item_cross_field(value)
    assert_parity(schema_ok(ITEM, value), python_item_ok(value), stricter)


# --- the documented divergences, pinned --------------------------------------------------------


def test_divergence_cross_field_policy_rule() -> None:
    policy = {"mode": "summary", "max_items": 5, "max_active": 6}
    assert schema_ok(POLICY, policy) and not python_policy_ok(policy)


def test_divergence_cross_field_item_rules() -> None:
    item = dict(ITEM_OK, chunks_count=9)
    assert schema_ok(ITEM, item) and not python_item_ok(item)
    reversed_item = dict(ITEM_OK, first_chunk_index=20, last_chunk_index=11)
    assert schema_ok(ITEM, reversed_item) and not python_item_ok(reversed_item)


def test_divergence_integral_floats() -> None:
    policy = {"mode": "summary", "max_items": 5.0, "max_active": 2}
    assert schema_ok(POLICY, policy) and not python_policy_ok(policy)
    item = dict(ITEM_OK, item_index=1.0)
    assert schema_ok(ITEM, item) and not python_item_ok(item)


def test_divergence_trailing_newline_follows_ecma_262() -> None:
    policy = {"mode": "summary", "pool": "dpone_backfill\n"}
    assert schema_ok(POLICY, policy), "jsonschema uses Python's re.search"
    assert not python_policy_ok(policy)
    catalog = copy.deepcopy(golden_catalog())
    first = next(iter(catalog["workloads"].values()))
    first.setdefault("airflow", {})["dag_id"] = "orders\n"
    assert schema_ok(CATALOG, catalog) and not python_doc_ok(CATALOG, catalog)


# --- hand-written corpus -----------------------------------------------------------------------

ITEM_OK: dict[str, Any] = {
    "schema": "dpone.airflow-mapping-item.v1",
    "mode": "summary",
    "mapping_plan_fingerprint": "sha256:" + "1f" * 32,
    "backfill_plan_hash": "sha256:" + "2e" * 32,
    "item_index": 1,
    "first_chunk_index": 11,
    "last_chunk_index": 20,
    "chunks_count": 10,
}

POLICIES: list[Any] = [
    None,
    {},
    {"mode": "internal"},
    {"mode": "visible", "max_items": 200, "max_active": 64, "pool": "p"},
    {"mode": "summary", "max_items": 1, "max_active": 1},
    {"mode": "summary", "max_items": 0},
    {"mode": "summary", "max_items": 201},
    {"mode": "summary", "max_active": 0},
    {"mode": "summary", "max_active": 65},
    {"mode": "summary", "max_items": True},
    {"mode": "summary", "max_active": False},
    {"mode": "summary", "max_items": "20"},
    {"mode": "summary", "max_items": 20.5},
    {"mode": "summary", "max_items": None},
    {"mode": "Summary"},
    {"mode": None},
    {"mode": 1},
    {"pool": ""},
    {"pool": "has space"},
    {"pool": "x" * 250},
    {"pool": "x" * 251},
    {"pool": ["p"]},
    {"colour": "red"},
    {"mode": "visible", "extra": None},
    [],
    "summary",
    7,
]


@pytest.mark.parametrize("policy", POLICIES, ids=[json.dumps(p)[:40] for p in POLICIES])
def test_policy_corpus(policy: Any) -> None:
    if policy is None:  # absent policy: the schema is only applied to a present node
        assert python_policy_ok(policy)
        return
    check_policy(policy)


ITEMS: list[dict[str, Any]] = [
    ITEM_OK,
    {k: v for k, v in ITEM_OK.items() if k != "mode"},
    dict(ITEM_OK, extra=1),
    dict(ITEM_OK, item_index=True),
    dict(ITEM_OK, item_index=-1),
    dict(ITEM_OK, item_index=199),
    dict(ITEM_OK, item_index=200),
    dict(ITEM_OK, first_chunk_index=0, chunks_count=21),
    dict(ITEM_OK, last_chunk_index=100_001, chunks_count=100_001 - 10),
    dict(ITEM_OK, mode="internal"),
    dict(ITEM_OK, mode={"m": 1}),
    dict(ITEM_OK, schema="dpone.airflow-mapping-item.v2"),
    dict(ITEM_OK, backfill_plan_hash="sha256:" + "A" * 64),
    dict(ITEM_OK, backfill_plan_hash="sha256:" + "a" * 63),
    dict(ITEM_OK, mapping_plan_fingerprint="sk_live_0123456789"),
    dict(ITEM_OK, chunks_count="10"),
    dict(ITEM_OK, chunks_count=None),
    dict(ITEM_OK, first_chunk_index=[11]),
]


@pytest.mark.parametrize("item", ITEMS, ids=[str(i) for i in range(len(ITEMS))])
def test_item_corpus(item: dict[str, Any]) -> None:
    check_item(item)


@pytest.mark.parametrize("doc", golden_docs(), ids=[d.id for d in golden_docs()])
def test_golden_documents_agree(doc: Any) -> None:
    assert schema_ok(doc.schema, doc.data) and python_doc_ok(doc.schema, doc.data)


def golden_catalog() -> dict[str, Any]:
    return next(
        d.data for d in golden_docs() if d.schema == CATALOG and d.project == "multi_workload"
    )


def golden_manifest() -> dict[str, Any]:
    return next(d.data for d in golden_docs() if d.schema == PIPELINE)


HAND_DOCS: list[tuple[str, str, Any, bool]] = []


def _hand(name: str, label: str, mutate: Any, base: Any, valid: bool = False) -> None:
    doc = copy.deepcopy(base)
    mutate(doc)
    HAND_DOCS.append((name, label, doc, valid))


def _set(path: Path, value: Any) -> Any:
    def apply(doc: Any) -> None:
        node = doc
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value

    return apply


def _drop(path: Path) -> Any:
    def apply(doc: Any) -> None:
        node = doc
        for part in path[:-1]:
            node = node[part]
        del node[path[-1]]

    return apply


def _build_hand_docs() -> None:
    catalog, manifest = golden_catalog(), golden_manifest()
    workload = ("workloads", "sessions_hourly")
    _hand(CATALOG, "drop schema", _drop(("schema",)), catalog)
    _hand(CATALOG, "drop workloads", _drop(("workloads",)), catalog)
    _hand(CATALOG, "drop manifest", _drop((*workload, "manifest")), catalog)
    _hand(CATALOG, "unknown top key", _set(("colour",), "red"), catalog)
    _hand(CATALOG, "unknown workload key", _set((*workload, "colour"), "red"), catalog)
    _hand(CATALOG, "empty workloads", _set(("workloads",), {}), catalog)
    _hand(CATALOG, "bad workload name", _set(("workloads", "1bad"), {"manifest": "m"}), catalog)
    _hand(CATALOG, "retries bool", _set((*workload, "airflow", "retries"), True), catalog)
    _hand(CATALOG, "retries 21", _set((*workload, "airflow", "retries"), 21), catalog)
    _hand(CATALOG, "retries float", _set((*workload, "airflow", "retries"), 2.5), catalog)
    _hand(CATALOG, "env int", _set((*workload, "airflow", "env"), {"A": 1}), catalog)
    _hand(CATALOG, "env bad name", _set((*workload, "airflow", "env"), {"1A": "x"}), catalog)
    _hand(CATALOG, "flavour", _set((*workload, "airflow", "flavour"), "docker"), catalog)
    _hand(CATALOG, "namespace", _set((*workload, "airflow", "namespace"), "Data"), catalog)
    _hand(
        CATALOG, "policy bool", _set((*workload, "airflow", "mapping", "max_items"), True), catalog
    )
    _hand(CATALOG, "policy 201", _set((*workload, "airflow", "mapping", "max_items"), 201), catalog)
    _hand(CATALOG, "policy unknown", _set((*workload, "airflow", "mapping", "x"), 1), catalog)
    _hand(CATALOG, "schedule null", _set((*workload, "airflow", "schedule"), None), catalog, True)
    _hand(CATALOG, "description", _set((*workload, "description"), "x" * 2000), catalog, True)
    _hand(CATALOG, "schedule empty", _set((*workload, "airflow", "schedule"), ""), catalog)
    process = ("processes", 0)
    _hand(PIPELINE, "drop processes", _drop(("processes",)), manifest)
    _hand(PIPELINE, "no processes", _set(("processes",), []), manifest)
    _hand(PIPELINE, "drop sink", _drop((*process, "sink")), manifest)
    _hand(PIPELINE, "unknown process key", _set((*process, "colour"), 1), manifest)
    _hand(PIPELINE, "strategy", _set((*process, "sink", "strategy", "mode"), "upsert"), manifest)
    _hand(PIPELINE, "name bad", _set((*process, "name"), "has space"), manifest)
    _hand(PIPELINE, "table empty", _set((*process, "sink", "table", "name"), ""), manifest)
    _hand(PIPELINE, "state backend", _set((*process, "state", "backend"), "redis"), manifest)
    _hand(
        PIPELINE,
        "lock string",
        _set((*process, "state", "require_distributed_lock"), "yes"),
        manifest,
    )
    if "backfill" in manifest["processes"][0]:
        chunk = (*process, "backfill", "chunk")
        _hand(PIPELINE, "step 0", _set((*chunk, "step"), 0), manifest)
        _hand(PIPELINE, "step bool", _set((*chunk, "step"), True), manifest)
        _hand(PIPELINE, "step 1e9+1", _set((*chunk, "step"), 10**9 + 1), manifest)
        _hand(PIPELINE, "bound float", _set((*chunk, "start"), 1.5), manifest)
        _hand(PIPELINE, "bound list", _set((*chunk, "start"), [1]), manifest)
        _hand(
            PIPELINE, "workers 65", _set((*process, "backfill", "parallel_workers"), 65), manifest
        )
        _hand(PIPELINE, "lease 4", _set((*process, "backfill", "lease_seconds"), 4), manifest)
        _hand(PIPELINE, "backfill_id", _set((*process, "backfill", "backfill_id"), "-x"), manifest)


_build_hand_docs()


@pytest.mark.parametrize(
    ("schema", "doc", "valid"),
    [(name, doc, valid) for name, _, doc, valid in HAND_DOCS],
    ids=[f"{name.split('.')[0]}:{label}" for name, label, _, _ in HAND_DOCS],
)
def test_hand_written_document_corpus(schema: str, doc: Any, valid: bool) -> None:
    check_document(schema, doc)
    assert python_doc_ok(schema, doc) is valid


# --- hypothesis mutations of the golden documents ----------------------------------------------

WRONG_VALUES: list[Any] = [
    True, False, None, 0, -1, 1, 2, 16, 64, 65, 199, 200, 201, 100_000, 100_001, 10**12, -(10**12),
    0.5, -2.5, "", "x", "summary", "visible", "internal", "dpone_backfill", "bad pool", "Data",
    "sha256:" + "a" * 64, "2024-01-01", "2024-01-01T00:00:00Z", "backfill", "audit_schema",
    "kubernetes", [], [1], ["x"], {}, {"a": 1}, {"name": "t"},
]  # fmt: skip

text_values = st.text(max_size=24).filter(lambda s: not s.endswith("\n"))
values = (
    # a fresh copy each draw: mutations below edit drawn containers in place, and a shared one
    # would leak between examples (cycles, and hypothesis's FlakyStrategyDefinition)
    st.sampled_from(WRONG_VALUES).map(copy.deepcopy)
    | st.integers(-(10**10), 10**10)
    | text_values
    | st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: not f.is_integer())
)


def paths(node: Any, prefix: Path = ()) -> list[Path]:
    found: list[Path] = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, child in node.items():
            found.extend(paths(child, (*prefix, key)))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found.extend(paths(child, (*prefix, index)))
    return found


def parent_of(doc: Any, path: Path) -> Any:
    node = doc
    for part in path[:-1]:
        node = node[part]
    return node


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> Any:
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        targets = paths(doc)
        op = draw(st.sampled_from(["replace", "replace", "drop", "add", "rename"]))
        if not targets:
            op = "add"
        if op == "add":
            containers = [p for p in [(), *targets] if isinstance(_get(doc, p), dict)]
            node = _get(doc, draw(st.sampled_from(containers)))
            keys = st.sampled_from(["colour", "extra", "x", "mode", "pool", "max_items"])
            node[draw(keys | text_values)] = draw(values)
            continue
        path = draw(st.sampled_from(targets))
        parent = parent_of(doc, path)
        key = path[-1]
        if op == "replace":
            parent[key] = draw(values)
        elif op == "drop":
            if isinstance(parent, dict):
                del parent[key]
            else:
                parent.pop(key)
        elif isinstance(parent, dict):  # rename
            parent[draw(text_values)] = parent.pop(key)
    return doc


def _get(doc: Any, path: Path) -> Any:
    node = doc
    for part in path:
        node = node[part]
    return node


PROPERTY_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(data=st.data())
def test_mutated_catalogs(data: st.DataObject) -> None:
    base = data.draw(st.sampled_from([d.data for d in golden_docs() if d.schema == CATALOG]))
    check_document(CATALOG, data.draw(mutated(base)))


@PROPERTY_SETTINGS
@given(data=st.data())
def test_mutated_manifests(data: st.DataObject) -> None:
    base = data.draw(st.sampled_from([d.data for d in golden_docs() if d.schema == PIPELINE]))
    check_document(PIPELINE, data.draw(mutated(base)))


GOLDEN_POLICIES = [
    workload["airflow"]["mapping"]
    for doc in golden_docs()
    if doc.schema == CATALOG
    for workload in doc.data["workloads"].values()
    if "mapping" in workload.get("airflow", {})
]


@PROPERTY_SETTINGS
@given(data=st.data())
def test_mutated_policies(data: st.DataObject) -> None:
    base = data.draw(st.sampled_from(GOLDEN_POLICIES))
    check_policy(data.draw(mutated(base)))


@PROPERTY_SETTINGS
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "mode": st.sampled_from(["internal", "visible", "summary", "other"]) | values,
            "max_items": st.integers(-2, 203) | values,
            "max_active": st.integers(-2, 67) | values,
            "pool": st.from_regex(r"[A-Za-z0-9_.\-]{0,12}", fullmatch=True) | values,
            "unknown": values,
        },
    )
)
def test_generated_policies(policy: dict[str, Any]) -> None:
    check_policy(policy)


@PROPERTY_SETTINGS
@given(data=st.data())
def test_mutated_items(data: st.DataObject) -> None:
    check_item(data.draw(mutated(ITEM_OK)))


def test_the_mutation_corpus_holds_both_verdicts() -> None:
    """Guard against a vacuous property: mutants include valid and invalid documents."""
    quick = settings(max_examples=300, phases=[Phase.generate], database=None)
    catalog = golden_catalog()
    invalid = find(mutated(catalog), lambda d: not python_doc_ok(CATALOG, d), settings=quick)
    assert not schema_ok(CATALOG, invalid)
    valid = find(
        mutated(catalog), lambda d: d != catalog and python_doc_ok(CATALOG, d), settings=quick
    )
    assert schema_ok(CATALOG, valid)
