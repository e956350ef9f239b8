"""Encode env values so Airflow's task-time Jinja rendering hands the pod the exact original string.

Why this module exists: ``env_vars`` is a template field of KubernetesPodOperator and of dpone's
subprocess operator, so Airflow renders every env value through Jinja before the pod or process
sees it. Rendering evaluates ``{{ }}`` and ``{% %}``, fails on an unclosed ``{#``, turns CR/CRLF
into LF, drops one trailing newline, and reads a value ending in a template extension (``.json``,
``.sql`` ...) as a file name. Catalog ``airflow.env`` values are arbitrary strings, so every value
the generator writes goes through this codec.

The rule (identical to the proven reference codec ``tests/airflow/harness/envcodec.py``, which runs
inside the Airflow test environments where dpone is not installed; a test holds the two equal):
a value is written as is when rendering cannot alter it, which is exactly when it holds none of
Jinja's begin tokens ``{{`` ``{%`` ``{#``, no carriage return, no trailing newline, and no trailing
``.ext`` suffix with a letter (so compact JSON such as the run identity stays readable). Any other
value becomes one Jinja expression around a single-quoted Jinja string literal, ``{{ '<escaped>' }}``,
escaping only ``\\``, ``'`` and control characters. Jinja reads the literal whole and decodes it back
to the original, and an expression's output is neither template data (no newline rules) nor a file
name.
"""

from __future__ import annotations

import re

__all__ = ["encode_env_value", "needs_encoding"]

_BEGIN_TOKENS = ("{{", "{%", "{#")
# A trailing ".ext" with at least one letter: what ``template_ext`` suffixes look like. Broader than
# any one operator's list on purpose: the list differs per operator and Airflow version.
_FILE_SUFFIX = re.compile(r"\.[A-Za-z0-9_]*[A-Za-z][A-Za-z0-9_]*\Z")
_ESCAPES = str.maketrans(
    {
        **{code: f"\\x{code:02x}" for code in [*range(0x20), 0x7F]},
        ord("\\"): "\\\\",
        ord("'"): "\\'",
        ord("\n"): "\\n",
        ord("\r"): "\\r",
        ord("\t"): "\\t",
    }
)


def needs_encoding(value: str) -> bool:
    """True when Airflow's Jinja rendering could change ``value``."""
    return (
        any(token in value for token in _BEGIN_TOKENS)
        or "\r" in value
        or value.endswith("\n")
        or _FILE_SUFFIX.search(value) is not None
    )


def encode_env_value(value: str) -> str:
    """``value`` unchanged when rendering cannot alter it, else ``{{ '<escaped>' }}``."""
    if not isinstance(value, str):
        raise TypeError(f"env values must be str, got {type(value).__name__}")
    if not needs_encoding(value):
        return value
    return "{{ '" + value.translate(_ESCAPES) + "' }}"
