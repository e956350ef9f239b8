"""Render a DagFile through the jinja templates into Python source (not yet formatted).

One Environment, created once: StrictUndefined (a missing value is a bug, never an empty string),
trim_blocks + lstrip_blocks (template tags leave no stray whitespace), keep_trailing_newline. Every
filter is registered from the one FILTERS dict. Values reach the source only through ``py`` (a
Python literal) or the ``place`` object's env dicts (envcodec, then a literal).

Two renderings of the same templates exist. ``render_source`` writes everything inline: black then
formats the whole file (the reference path). ``render_dag`` leaves the bulky, regular parts as
placeholders (the operator code shared by every file, and the env dicts: up to 200 per task) and
records them as splices that format.py inserts after black has formatted the small rest, in the
exact layout black gives them. Both must give the same bytes; tests hold them equal.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jinja2
from black.strings import normalize_string_quotes

from .dagspec import GENERATED_MARKER, DagFile, Env, RuntimeTask
from .envcodec import encode_env_value

# The templates ship as the package ``dpone_generator.templates`` (the repository's templates/).
TEMPLATE_DIR = Path(str(importlib.resources.files("dpone_generator.templates")))
DAG_TEMPLATE = "dag.py.jinja"

# Characters written as escapes although Python would accept them raw: controls, and invisible or
# direction-changing characters that could make a reviewed diff read differently from what runs.
# A fixed list (not str.isprintable) so the output is the same on every Python's Unicode version.
_ESCAPED = re.compile(
    r'[\\"\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2069'
    r"\ufeff\ufff9-\ufffb\ud800-\udfff]"
)
_SIMPLE_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    if ch in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def py_string(value: str) -> str:
    """A double-quoted Python literal of ``value`` (black may pick the other quote later)."""
    return '"' + _ESCAPED.sub(_escape, value) + '"'


def py_literal(value: Any) -> str:
    """The Python literal of a str, int, bool, None, or a list/tuple/dict of them."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return py_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(py_literal(item) for item in value) + "]"
    if isinstance(value, dict):
        pairs = (f"{py_literal(k)}: {py_literal(v)}" for k, v in value.items())
        return "{" + ", ".join(pairs) + "}"
    raise TypeError(f"no Python literal for {type(value).__name__}")


def black_string(value: str) -> str:
    """The literal of ``value`` exactly as black writes it: black's own quote preference applied.

    py_string never writes a prefix and writes hex escapes in lower case, so black's other
    literal normalisations (prefix case, escape-digit case) have nothing to change.
    """
    return normalize_string_quotes(py_string(value))


@functools.lru_cache(maxsize=8192)
def env_literal(value: str) -> str:
    """An env value as it must appear in the file: render-proof (envcodec), then a literal."""
    return black_string(encode_env_value(value))


def comment_text(value: str) -> str:
    """Text safe inside a ``#`` comment: one line, escapes as in a literal, no quotes added."""
    return py_string(value)[1:-1]


def pod_name(task_id: str) -> str:
    """A DNS-1123 pod name prefix for a task id (the pod operator appends a random suffix)."""
    name = "dpone-" + task_id.lower().replace("_", "-")
    return name.strip("-")[:63].rstrip("-")


def task_summary(task: RuntimeTask) -> str:
    return task.summary


FILTERS: dict[str, Callable[..., str]] = {
    "py": py_literal,
    "comment": comment_text,
    "pod_name": pod_name,
    "task_summary": task_summary,
}


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters.update(FILTERS)
    return env


ENVIRONMENT = _environment()


SPLICE_NAME = "_dpone_splice_{}_"


@dataclass(frozen=True)
class CodeSplice:
    """Top-level code (the flavour's imports and operator classes), formatted on its own."""

    code: str


@dataclass(frozen=True)
class EnvSplice:
    """One env dict (``single``) or the elements of a list of env dicts."""

    envs: tuple[Env, ...]
    single: bool


Splice = CodeSplice | EnvSplice


@dataclass(frozen=True)
class Rendered:
    """Source with placeholders, and what each placeholder ``_dpone_splice_<n>_`` stands for."""

    skeleton: str
    splices: tuple[Splice, ...]


class Placer(Protocol):
    """What the templates call to write the bulky parts (see the module docstring)."""

    def code(self, text: str) -> str: ...

    def env(self, env: Env) -> str: ...

    def envs(self, envs: Sequence[Env]) -> str: ...


def raw_env_literal(value: str) -> str:
    """envcodec then a plain literal, leaving the quote choice to black (the inline path)."""
    return py_string(encode_env_value(value))


def env_dict_lines(env: Env, indent: str, literal: Callable[[str], str] = env_literal) -> list[str]:
    """An exploded dict, one key per line, in black's layout (keys and values are literals)."""
    lines = [f"{indent}{{"]
    lines += [f"{indent}    {py_string(k)}: {literal(v)}," for k, v in env]
    lines.append(f"{indent}}}")
    return lines


class InlinePlacer:
    """Everything inline: black formats the whole file."""

    def code(self, text: str) -> str:
        return text.rstrip("\n")

    def env(self, env: Env) -> str:
        return "\n".join(env_dict_lines(env, "", raw_env_literal))

    def envs(self, envs: Sequence[Env]) -> str:
        return "\n".join(self.env(env) + "," for env in envs)


class SplicePlacer:
    """Placeholders black keeps on a line of their own; the splices are recorded in order."""

    def __init__(self) -> None:
        self.splices: list[Splice] = []

    def _name(self, splice: Splice) -> str:
        self.splices.append(splice)
        return SPLICE_NAME.format(len(self.splices) - 1)

    def code(self, text: str) -> str:
        return self._name(CodeSplice(text))

    def env(self, env: Env) -> str:
        return self._name(EnvSplice((env,), single=True))

    def envs(self, envs: Sequence[Env]) -> str:
        # The trailing comma is black's "magic" one: the list stays one element per line.
        return self._name(EnvSplice(tuple(envs), single=False)) + ","


def _render(dag: DagFile, place: Placer) -> str:
    template = ENVIRONMENT.get_template(DAG_TEMPLATE)
    return template.render(dag=dag, marker=GENERATED_MARKER, place=place)


def render_dag(dag: DagFile) -> Rendered:
    """The DAG file as a skeleton plus splices (what format.format_rendered takes)."""
    place = SplicePlacer()
    skeleton = _render(dag, place)
    return Rendered(skeleton, tuple(place.splices))


def render_source(dag: DagFile) -> str:
    """The DAG file's whole Python source, before formatting (the reference for render_dag)."""
    return _render(dag, InlinePlacer())
