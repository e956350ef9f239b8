"""Encode env values so Airflow's task-time Jinja rendering gives back the exact original string.

Why this exists
---------------
``env_vars`` is a template field of KubernetesPodOperator (and of dpone's subprocess operator), so at
task time Airflow renders every env VALUE through its Jinja environment before the pod/process sees it.
That rendering can alter a literal value in several ways (measured on Airflow 2.10.5, 2.11.2, 3.2.2,
3.3.2 with cncf.kubernetes 10.10.0 / 10.25.0, Jinja2 3.1.6; see docs/airflow-notes.md):

* ``{{ ... }}`` is evaluated, ``{% ... %}`` runs a statement, ``{#`` opens a comment (an unclosed one
  raises TemplateSyntaxError, so the task fails before it starts);
* Jinja's lexer normalises ``\\r\\n`` and ``\\r`` in template data to ``\\n``, and drops one trailing
  newline (``keep_trailing_newline`` is off);
* a string that ends with one of the operator's ``template_ext`` suffixes (``.json``, ``.yaml``, ``.sql``
  ... depending on operator and version) is treated as a template FILE name and read from disk.

The rule
--------
``encode_env_value(v)`` returns ``v`` itself when rendering cannot alter it, which is exactly when it
contains none of Jinja's begin tokens ``{{``, ``{%``, ``{#``, no carriage return, does not end with a
newline, and does not end in a file-extension-like suffix (``.<letters/digits/_>`` with a letter, e.g.
``x.json``, ``conf.yaml``; ``v0.1.0`` is fine). The first three are precise (Jinja's lexer with
Airflow's settings; a lone ``{``, ``}`` or ``#``, tabs, other control characters, quotes,
backslashes, ``$`` and non-ASCII pass through untouched, so compact JSON normally stays readable).
The suffix rule is deliberately conservative: no KPO version here has a ``template_ext``
(``x.json`` passes unchanged), but operators and provider versions differ. Otherwise it returns one
Jinja expression holding a single-quoted Jinja string literal::

    {{ '<v with \\ -> \\\\, ' -> \\', CR/LF/TAB -> \\r \\n \\t, other C0/DEL -> \\xNN>' }}

Why that round-trips exactly: Jinja's lexer reads a string literal whole (``}}``, ``{%``, ``{#`` inside
it are plain characters), normalises raw newlines inside it (so none are left raw), and decodes it
with ``encode("ascii", "backslashreplace").decode("unicode-escape")``: non-ASCII characters survive
(they become ``\\xNN``/``\\uNNNN`` and decode back), and every backslash in the literal is one we wrote
as an escape. An expression's output is not template data, so the trailing-newline rule does not
apply to it, and the whole value ends with ``}}``, never with a file extension. Single quotes keep
JSON (the run identity, the mapping item) readable in the generated file: only ``\\`` and ``'`` are
escaped. Airflow's native-object rendering (``render_template_as_native_obj=True``) would turn some
outputs into non-strings: dpone DAGs never set it.

Not covered here (outside Airflow): the kubelet expands ``$(VAR)`` and reduces ``$$`` to ``$`` in a
container's env values; a value must not rely on those sequences (plain ``$HOME`` is left alone).

Standard library only: the generator (project venv) and the harness (Airflow venvs) both import it.
"""

from __future__ import annotations

import re

__all__ = ["HOSTILE_CORPUS", "PLAIN_CORPUS", "encode_env_value", "needs_encoding"]

_BEGIN_TOKENS = ("{{", "{%", "{#")
# A trailing ".ext" with at least one letter: what `template_ext` suffixes look like (.json, .yaml,
# .yml, .sql, .sh, .j2 ...). Conservative on purpose: the set differs per operator and version.
_FILE_SUFFIX = re.compile(r"\.[A-Za-z0-9_]*[A-Za-z][A-Za-z0-9_]*\Z")
_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def needs_encoding(value: str) -> bool:
    """True when Airflow's Jinja rendering could change ``value`` (see module docstring)."""
    return (
        any(token in value for token in _BEGIN_TOKENS)
        or "\r" in value
        or value.endswith("\n")
        or _FILE_SUFFIX.search(value) is not None
    )


def _escape_char(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    if ch < " " or ch == "\x7f":
        return f"\\x{ord(ch):02x}"
    return ch


def encode_env_value(value: str) -> str:
    """Return ``value`` unchanged if rendering cannot alter it, else ``{{ '<escaped>' }}``."""
    if not isinstance(value, str):
        raise TypeError(f"env values must be str, got {type(value).__name__}")
    if not needs_encoding(value):
        return value
    return "{{ '" + "".join(_escape_char(ch) for ch in value) + "' }}"


def _big_value() -> str:
    unit = "{{ ds }}{# x\r\n'\"\\u0041 ünï✓ $HOME }}{% raw %}{%endraw%}\t|"
    return (unit * (7 * 1024 // len(unit) + 1))[: 7 * 1024]


# (env var name, original value) pairs every reference DAG carries encoded; the pod/process must see
# the original byte-for-byte.
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

# Values encode_env_value leaves unchanged: raw rendering must keep them byte-for-byte.
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
