"""`ledger restate --from/--to` on an integer campaign: bounds written as the manifest writes
them (ASCII digits, an optional minus), never what int() would also take."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from dpone import errors
from dpone.campaign.restate import select_by_time
from dpone.errors import DponeError
from dpone.plan.chunks import ChunkSpec, plan_chunks


def _plan() -> SimpleNamespace:
    spec = ChunkSpec("id", "integer", -1000, 2000, 100, "value")
    return SimpleNamespace(
        name="orders",
        chunks=plan_chunks(spec, "bf-int"),
        config=SimpleNamespace(backfill=SimpleNamespace(chunk=spec)),
    )


def test_integer_bounds_select_the_overlapping_chunks() -> None:
    plan = _plan()
    assert select_by_time(plan, "0", "150") == [11, 12]  # type: ignore[arg-type]
    assert select_by_time(plan, "-1000", "-950") == [1]  # type: ignore[arg-type]


@pytest.mark.parametrize("given", ["٣", "１", "1_000", "+5", " 5", "5 ", "0x10", "1e3", "", "-"])
def test_a_bound_int_would_read_but_the_manifest_never_writes_is_a_usage_error(
    given: str,
) -> None:
    for start, end in ((given, "2000"), ("0", given)):
        with pytest.raises(DponeError) as caught:
            select_by_time(_plan(), start, end)  # type: ignore[arg-type]
        assert caught.value.code == errors.USAGE
        assert "expected an integer bound" in caught.value.message


def test_a_bound_of_more_digits_than_python_converts_is_a_usage_error() -> None:
    with pytest.raises(DponeError) as caught:
        select_by_time(_plan(), "1" * 5000, "2000")  # type: ignore[arg-type]
    assert caught.value.code == errors.USAGE
