"""Hostile and plain string values for the Airflow matrix (standard library only).

Airflow renders an operator's template fields through Jinja at task time. Measured on Airflow
2.10.5, 2.11.2, 3.2.2 and 3.3.2 (cncf.kubernetes 10.10.0 / 10.25.0, Jinja2 3.1.6; see
docs/airflow-notes.md), rendering alters a literal string in several ways: ``{{ ... }}`` is
evaluated, ``{% ... %}`` runs a statement, an unclosed ``{#`` raises TemplateSyntaxError (the task
fails before it starts), ``\\r\\n`` and ``\\r`` become ``\\n``, one trailing newline is dropped, and
a value ending in a ``template_ext`` suffix is read as a file name. dpone's operators declare no
template field, so none of this happens; the matrix proves it with these values, and a control
(the same operator with ``env_vars`` rendered) shows what rendering would have done.

Not covered here (outside Airflow): the kubelet expands ``$(VAR)`` and reduces ``$$`` to ``$`` in a
container's env values; a value must not rely on those sequences (plain ``$HOME`` is left alone).
"""

from __future__ import annotations

__all__ = ["HOSTILE_CORPUS", "PLAIN_CORPUS"]


def _big_value() -> str:
    unit = "{{ ds }}{# x\r\n'\"\\u0041 ünï✓ $HOME }}{% raw %}{%endraw%}\t|"
    return (unit * (7 * 1024 // len(unit) + 1))[: 7 * 1024]


# (env var name, original value) pairs every reference DAG carries; the pod/process must see the
# original byte-for-byte.
HOSTILE_CORPUS: tuple[tuple[str, str], ...] = (
    ("DPONE_T_JINJA_EXPR", "{{ ds }}"),
    ("DPONE_T_JINJA_COMMENT", "{# x"),
    ("DPONE_T_RAW_BLOCK", "a{%raw%}b{%endraw%}c"),
    ("DPONE_T_JSON_EXT", "x.json"),
    ("DPONE_T_YAML_EXT", "conf.yaml"),
    ("DPONE_T_CRLF", "line1\r\nline2"),
    ("DPONE_T_TRAILING_NL", "trailing\n"),
    ("DPONE_T_EMPTY", ""),
    ("DPONE_T_UNICODE", "ünïcødé ✓"),
    ("DPONE_T_DOLLAR", "$HOME"),
    ("DPONE_T_BACKSLASH_U", "\\u0041"),
    ("DPONE_T_QUOTES", "'\""),
    ("DPONE_T_BRACES_REVERSED", "}}{{"),
    ("DPONE_T_BIG_7KIB", _big_value()),
    ("DPONE_T_JSON_OBJECT", '{"a":"b\\n","c":[1,2],"d":"\'"}'),
    ("DPONE_T_CR_ONLY", "a\rb"),
    ("DPONE_T_TAB_CTRL", "a\tb\x01c\x7f"),
    ("DPONE_T_ENDRAW_IN_STRING", "x{% endraw %}' }}y"),
    ("DPONE_T_LEADING_TRAILING_SPACE", "  spaced  "),
    ("DPONE_T_HASH", "## not a comment #}"),
    ("DPONE_T_JSON_WITH_TEMPLATE", '{"q":"{{ x }}","n":{"m":[1]}}'),
    ("DPONE_T_LF_INSIDE", "a\nb"),
    ("DPONE_T_DOUBLE_TRAILING_NL", "x\n\n"),
    ("DPONE_T_LONE_BRACES", "{a} {b}"),
)

# Values Jinja rendering leaves alone: the control operator (rendering on) keeps them too.
PLAIN_CORPUS: tuple[str, ...] = (
    "",
    "plain",
    "2024-01-11",
    "sha256:" + "0" * 64,
    "item 1: chunks 11-20 (2024-01-11 .. 2024-01-21)",
    "$HOME",
    "'\"",
    "\\u0041",
    "ünïcødé ✓",
    "v0.1.0",
    "  spaced  ",
    "50%",
    "# hash",
    "a%b",
)
