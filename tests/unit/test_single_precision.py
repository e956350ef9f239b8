"""base.single_precision: a FLOAT read as a DOUBLE checks and moves as the shortest decimal of
its single-precision value (what Postgres prints for a real), whatever database it came from."""

from __future__ import annotations

import math
import struct

import pytest
from dpone.connectors.base import single_precision
from hypothesis import given
from hypothesis import strategies as st


def single(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


@pytest.mark.parametrize(
    ("exact", "shortest"),
    [
        (single(1.2345678), 1.2345678),
        (16777216.0, 16777216.0),
        (single(123456789.0), 123456790.0),
        (single(0.1), 0.1),
        (0.0, 0.0),
        (-2.5, -2.5),
    ],
)
def test_known_singles(exact: float, shortest: float) -> None:
    assert single_precision(exact) == shortest


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_the_shortest_decimal_reads_back_as_the_same_single(value: float) -> None:
    shortest = single_precision(value)
    assert isinstance(shortest, float)
    assert single(shortest) == value
    assert float(f"{shortest:.9g}") == shortest  # at most 9 significant digits


def test_other_values_pass_through() -> None:
    assert single_precision(None) is None
    assert single_precision(7) == 7
    assert math.isnan(single_precision(math.nan))  # type: ignore[arg-type]
    assert single_precision(math.inf) == math.inf
