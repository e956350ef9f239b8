"""Fuzz DPONE_AIRFLOW_MAPPING_ITEM through the real `dpone run` composition root, in-process.

Targets: arbitrary text (including the surrogate-escaped bytes os.environ yields for non-UTF-8
values), JSON with wrong types / huge numbers / duplicate keys / deep nesting / missing and extra
fields, and mutations of the real items of two golden plans. No DSN is set, so a case that got
past verification would stop at DPONE_CONNECTION_MISSING: no case touches a database.
"""

from __future__ import annotations

import json
from functools import cache

import fuzzkit
from dpone import errors
from dpone.packing.pack import ProcessPlan, load_and_compile
from dpone.packing.verify import expected_identity
from hypothesis import given
from hypothesis import strategies as st

ENV_ITEM = "DPONE_AIRFLOW_MAPPING_ITEM"
CANARY = "dpone-canary-5ecret-"

PROJECTS = {
    "visible": (fuzzkit.GOLDEN / "visible_30_daily" / "workloads.yaml", "payments_daily"),
    "summary": (fuzzkit.GOLDEN / "summary_365_into_40" / "workloads.yaml", "orders_history"),
}
# Variables that must not leak in from the developer's shell: they would change the code path.
CLEAN_ENV: dict[str, str | None] = {
    "DPONE_AIRFLOW_RUN_IDENTITY": None,
    "DPONE_CONN_WAREHOUSE": None,
    "DPONE_XCOM_PATH": None,
    "DPONE_EVIDENCE_DIR": None,
    "DPONE_DEBUG": None,
    "DPONE_TEST_FAULT": None,
}
# What an item can legitimately lead to before any data I/O.
ITEM_OUTCOMES = {errors.MAPPING_ITEM_INVALID}
MUTANT_OUTCOMES = {
    errors.MAPPING_ITEM_INVALID,
    errors.MAPPING_PLAN_MISMATCH,
    errors.CONNECTION_MISSING,  # an unmutated (still valid) item reaches the ledger's DSN lookup
}


@cache
def plan_of(kind: str) -> ProcessPlan:
    catalog, workload = PROJECTS[kind]
    _, packs, problems = load_and_compile(str(catalog))
    assert not problems, problems
    (pack,) = [p for p in packs if p.workload.name == workload]
    return pack.processes[0]


@cache
def identity_of(kind: str) -> str:
    """The run identity the generated DAG passes beside the project's items."""
    catalog, workload = PROJECTS[kind]
    _, packs, _ = load_and_compile(str(catalog))
    (pack,) = [p for p in packs if p.workload.name == workload]
    return expected_identity(pack, pack.processes[0].name).env_value()


@cache
def valid_items(kind: str) -> tuple[str, ...]:
    plan = plan_of(kind)
    assert plan.mapping_plan is not None
    return tuple(plan.mapping_plan.item_env_value(i) for i in plan.mapping_plan.items)


def run_with_item(kind: str, raw: str) -> fuzzkit.CliResult:
    catalog, workload = PROJECTS[kind]
    plan = plan_of(kind)
    argv = ["run", "--catalog", str(catalog), "--workload", workload, "--process", plan.name]
    env = {**CLEAN_ENV, "DPONE_AIRFLOW_RUN_IDENTITY": identity_of(kind), ENV_ITEM: raw}
    return fuzzkit.run_cli(argv, env)


def check_item_case(kind: str, raw: str, allowed: set[str], target: str) -> dict[str, object]:
    result = run_with_item(kind, raw)
    # Messages never echo item values (they may hold something secret-like that was pasted in).
    assert CANARY not in result.stderr, f"{target}: a value was echoed: {result.stderr[-500:]}"
    fuzzkit.count(target)
    record = fuzzkit.check_run_result(result, f"{target} item={raw[:200]!r}")
    assert record is not None, f"{target}: exit 0 for item {raw[:200]!r}"
    assert record["code"] in allowed, f"{target}: {record} for item {raw[:200]!r}"
    # Refused before any data I/O: exit 3 (docs/cli.md).
    assert result.code == 3, f"{target}: exit {result.code}: {record}"
    return record


# --- strategies ----------------------------------------------------------------------------------

# os.environ cannot hold NUL; non-UTF-8 bytes arrive as surrogate escapes (PEP 383).
env_text = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=300),
    st.binary(max_size=300).map(
        lambda b: b.replace(b"\x00", b"").decode("utf-8", "surrogateescape")
    ),
    st.text(alphabet='{}[]":,0123456789.eE+-truefalsn \\u', max_size=200),
)

scalar_json = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63 - 2, max_value=2**64 + 2),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.just(CANARY + "value"),
)
json_values = st.recursive(
    scalar_json,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=6,
)
# Number spellings json.loads treats specially (or rejects): huge, non-standard, exponent forms.
number_tokens = st.one_of(
    st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n),
    st.integers(min_value=1, max_value=400).map(lambda n: f"1e{n}"),
    st.sampled_from(
        ["NaN", "Infinity", "-Infinity", "-0", "0.0", "1.0", "1e2", "01", "0x10", "1_0", "+1"]
    ),
)

ITEM_KEYS = (
    "schema",
    "mode",
    "mapping_plan_fingerprint",
    "backfill_plan_hash",
    "item_index",
    "first_chunk_index",
    "last_chunk_index",
    "chunks_count",
)


def _pairs_text(pairs: list[tuple[str, str]]) -> str:
    """A JSON object from already-serialised values; duplicate keys stay duplicated."""
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in pairs) + "}"


@st.composite
def structured_items(draw: st.DrawFn) -> str:
    """A real item with one or more fields broken in type, size, presence or repetition."""
    kind = draw(st.sampled_from(sorted(PROJECTS)))
    base = json.loads(draw(st.sampled_from(valid_items(kind))))
    pairs = [(k, json.dumps(v)) for k, v in base.items()]
    for _ in range(draw(st.integers(1, 3))):
        action = draw(
            st.sampled_from(
                ["wrong_type", "number_token", "drop", "extra", "duplicate", "nest", "top_level"]
            )
        )
        if action == "wrong_type" and pairs:
            i = draw(st.integers(0, len(pairs) - 1))
            pairs[i] = (pairs[i][0], json.dumps(draw(json_values)))
        elif action == "number_token" and pairs:
            i = draw(st.integers(0, len(pairs) - 1))
            pairs[i] = (pairs[i][0], draw(number_tokens))
        elif action == "drop" and pairs:
            pairs.pop(draw(st.integers(0, len(pairs) - 1)))
        elif action == "extra":
            key = draw(st.one_of(st.text(max_size=60), st.sampled_from(["predicate", "sql"])))
            pairs.append((key, json.dumps(draw(json_values))))
        elif action == "duplicate" and pairs:
            key = draw(st.sampled_from(ITEM_KEYS))
            pairs.append((key, json.dumps(draw(json_values))))
        elif action == "nest":
            depth = draw(st.integers(1, 20_000))
            i = draw(st.integers(0, max(0, len(pairs) - 1)))
            nested = "[" * depth + "]" * depth
            if pairs:
                pairs[i] = (pairs[i][0], nested)
            else:
                pairs.append(("item_index", nested))
        elif action == "top_level":
            return draw(
                st.one_of(
                    json_values.map(json.dumps),
                    st.lists(st.just(_pairs_text(pairs)), min_size=1, max_size=3).map(
                        lambda xs: "[" + ",".join(xs) + "]"
                    ),
                )
            )
    return _pairs_text(pairs)


def _flip(text: str, draw: st.DrawFn) -> str:
    if not text:
        return text
    i = draw(st.integers(0, len(text) - 1))
    return text[:i] + draw(st.characters(codec="utf-8", exclude_characters="\x00")) + text[i + 1 :]


@st.composite
def mutated_items(draw: st.DrawFn) -> tuple[str, str]:
    """A real item mutated textually or semantically (ranges shifted, fingerprints swapped)."""
    kind = draw(st.sampled_from(sorted(PROJECTS)))
    items = valid_items(kind)
    raw = draw(st.sampled_from(items))
    doc = json.loads(raw)
    strategy = draw(st.sampled_from(["text", "semantic", "semantic", "identity"]))
    if strategy == "identity":
        return kind, raw
    if strategy == "text":
        text = raw
        for _ in range(draw(st.integers(1, 4))):
            op = draw(st.sampled_from(["flip", "delete", "insert", "dup", "truncate", "ws"]))
            if op == "flip":
                text = _flip(text, draw)
            elif op == "delete" and text:
                i = draw(st.integers(0, len(text) - 1))
                text = text[:i] + text[i + draw(st.integers(1, 12)) :]
            elif op == "insert":
                i = draw(st.integers(0, len(text)))
                text = (
                    text[:i]
                    + draw(
                        st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
                    )
                    + text[i:]
                )
            elif op == "dup" and text:
                i = draw(st.integers(0, len(text) - 1))
                j = draw(st.integers(i, len(text)))
                text = text[:j] + text[i:j] + text[j:]
            elif op == "truncate":
                text = text[: draw(st.integers(0, len(text)))]
            elif op == "ws":
                text = draw(st.sampled_from([" ", "\n", "\t", "\ufeff"])) + text
        return kind, text
    # Semantic: a well-formed item that disagrees with the plan in exactly one way (or a few).
    other_kind = "summary" if kind == "visible" else "visible"
    other = json.loads(draw(st.sampled_from(valid_items(other_kind))))
    for _ in range(draw(st.integers(1, 2))):
        field = draw(
            st.sampled_from(
                ["range", "index", "mode", "fingerprint", "hash", "swap_item", "foreign", "count"]
            )
        )
        if field == "range":
            delta = draw(st.integers(-3, 3).filter(bool))
            doc["first_chunk_index"] = max(1, doc["first_chunk_index"] + delta)
            doc["last_chunk_index"] = max(doc["first_chunk_index"], doc["last_chunk_index"] + delta)
        elif field == "index":
            doc["item_index"] = draw(st.integers(0, 199))
        elif field == "mode":
            doc["mode"] = "visible" if doc["mode"] == "summary" else "summary"
        elif field == "fingerprint":
            doc["mapping_plan_fingerprint"] = "sha256:" + draw(
                st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
            )
        elif field == "hash":
            doc["backfill_plan_hash"] = other["backfill_plan_hash"]
        elif field == "swap_item":
            # Another item's range under this item's index: a duplicate range.
            twin = json.loads(draw(st.sampled_from(items)))
            for key in ("first_chunk_index", "last_chunk_index"):
                doc[key] = twin[key]
        elif field == "foreign":
            doc = dict(other)
        elif field == "count":
            doc["chunks_count"] = draw(st.integers(-2, 100_001))
        doc["chunks_count"] = (
            doc["last_chunk_index"] - doc["first_chunk_index"] + 1
            if field != "count"
            else doc["chunks_count"]
        )
    return kind, json.dumps(doc, sort_keys=draw(st.booleans()))


# --- tests ---------------------------------------------------------------------------------------


@fuzzkit.fuzz_settings(0.462)
@given(raw=env_text, kind=st.sampled_from(sorted(PROJECTS)))
def test_fuzz_item_arbitrary_text_is_refused_with_item_invalid(raw: str, kind: str) -> None:
    check_item_case(kind, raw, ITEM_OUTCOMES, "item.arbitrary_text")


@fuzzkit.fuzz_settings(0.26)
@given(raw=structured_items())
def test_fuzz_item_structured_json_is_refused_and_never_echoes_values(raw: str) -> None:
    check_item_case("summary", raw, ITEM_OUTCOMES | MUTANT_OUTCOMES, "item.structured_json")


@fuzzkit.fuzz_settings(0.10)
@given(case=mutated_items())
def test_fuzz_item_mutations_of_real_items(case: tuple[str, str]) -> None:
    kind, raw = case
    record = check_item_case(kind, raw, MUTANT_OUTCOMES, "item.mutated_real")
    if raw in valid_items(kind):
        assert record["code"] == errors.CONNECTION_MISSING, record


@fuzzkit.fuzz_settings(0.012)
@given(size=st.integers(8 * 1024 - 64, 64 * 1024), kind=st.sampled_from(sorted(PROJECTS)))
def test_fuzz_item_oversized_values(size: int, kind: str) -> None:
    base = valid_items(kind)[0]
    raw = base[:-1] + ',"pad":"' + "x" * max(0, size - len(base)) + '"}'
    record = check_item_case(kind, raw, ITEM_OUTCOMES, "item.oversized")
    if len(raw.encode()) > 8 * 1024:
        assert "8192 bytes" in str(record["message"]), record


@fuzzkit.fuzz_settings(0.012)
@given(raw=st.one_of(env_text, json_values.map(json.dumps)))
def test_fuzz_run_identity_env(raw: str) -> None:
    """The other provider-owned value, DPONE_AIRFLOW_RUN_IDENTITY, next to a valid item."""
    catalog, workload = PROJECTS["visible"]
    env = {**CLEAN_ENV, ENV_ITEM: valid_items("visible")[0], "DPONE_AIRFLOW_RUN_IDENTITY": raw}
    argv = ["run", "--catalog", str(catalog), "--workload", workload, "--process", "payments"]
    result = fuzzkit.run_cli(argv, env)
    fuzzkit.count("run_identity.arbitrary")
    record = fuzzkit.check_run_result(result, f"identity={raw[:200]!r}")
    assert record is not None and result.code == 3, record
    assert record["code"] in {errors.RUN_IDENTITY_INVALID, errors.MAPPING_PLAN_MISMATCH}, record
