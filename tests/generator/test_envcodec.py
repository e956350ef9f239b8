"""The product env codec: the same rule as the proven reference codec, and it survives Jinja.

The Airflow matrix (tests/airflow) proves the reference codec against real task-time rendering on
every supported version; here the product copy is held equal to it, and a plain Jinja environment
configured like Airflow's (no keep_trailing_newline) renders every encoded value back to itself.
"""

from __future__ import annotations

import envcodec as reference
import jinja2
import pytest
from dpone_generator import envcodec
from hypothesis import given
from hypothesis import strategies as st

AIRFLOW_LIKE = jinja2.Environment(undefined=jinja2.StrictUndefined, cache_size=0)
tricky = st.text(alphabet="{}%#'\"\\\r\n\t\x00\x01\x7f.jsonyaml ü✓$", max_size=40)
anything = st.one_of(st.text(max_size=200), tricky)


@given(anything)
def test_product_codec_equals_reference_codec(value: str) -> None:
    assert envcodec.encode_env_value(value) == reference.encode_env_value(value)
    assert envcodec.needs_encoding(value) == reference.needs_encoding(value)


@pytest.mark.parametrize(("name", "value"), reference.HOSTILE_CORPUS)
def test_reference_hostile_corpus(name: str, value: str) -> None:
    encoded = envcodec.encode_env_value(value)
    assert encoded == reference.encode_env_value(value), name
    assert AIRFLOW_LIKE.from_string(encoded).render() == value, name


@pytest.mark.parametrize("value", reference.PLAIN_CORPUS)
def test_plain_values_are_left_alone(value: str) -> None:
    assert envcodec.encode_env_value(value) == value
    assert AIRFLOW_LIKE.from_string(value).render() == value


@given(anything)
def test_encoded_values_render_back_byte_for_byte(value: str) -> None:
    assert AIRFLOW_LIKE.from_string(envcodec.encode_env_value(value)).render() == value


@given(anything)
def test_encoded_values_never_end_like_a_template_file(value: str) -> None:
    encoded = envcodec.encode_env_value(value)
    assert not envcodec.needs_encoding(encoded) or encoded.endswith("' }}")


def test_rejects_non_strings() -> None:
    with pytest.raises(TypeError):
        envcodec.encode_env_value(3)  # type: ignore[arg-type]
