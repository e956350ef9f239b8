"""Render a DagFile through the jinja templates into Python source (not yet formatted).

One Environment, created once: StrictUndefined (a missing value is a bug, never an empty string),
trim_blocks + lstrip_blocks (template tags leave no stray whitespace), keep_trailing_newline. Every
filter is registered from the one FILTERS dict. Values reach the source only as literals: ``py``
(one line), ``kwarg`` (a keyword argument laid out as black does) or the ``place`` object's env
dicts. A literal is the exact value: the generated operators render no template field.

What every task of a workload shares is written once, as module-level literals the tasks expand
(``POD_OPTIONS``, ``TASK_ARGS``, ``TASK_ENV``: see ``pod_arguments``, ``task_arguments``,
``task_envs``); a task's own call holds only what is its own.

Two renderings of the same templates exist. ``render_source`` writes everything inline: black then
formats the whole file (the reference path). ``render_dag`` leaves the bulky, regular parts as
placeholders (the operator code shared by every file, and the mapped items' env dicts: up to 200
per task) and records them as splices that format.py inserts after black has formatted the small
rest, in the exact layout black gives them. Both must give the same bytes; tests hold them equal.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jinja2
from black.strings import str_width
from dpone.packing.task_env import Env

from .dagspec import GENERATED_MARKER, DagFile, SecretEnv

LINE_LENGTH = 100  # black's line length (format.MODE uses the same)
# The templates ship as the package ``dpone_generator.templates`` (the repository's templates/).
TEMPLATE_DIR = Path(str(importlib.resources.files("dpone_generator.templates")))
DAG_TEMPLATE = "dag.py.jinja"

# Characters written as escapes although Python would accept them raw: controls, and invisible or
# direction-changing characters that could make a reviewed diff read differently from what runs.
# A fixed list (not str.isprintable) so the output is the same on every Python's Unicode version.
_ESCAPED_CODES = [
    *range(0x20),
    *range(0x7F, 0xA0),
    0x00AD,
    0x061C,
    0x180E,
    0xFEFF,
    *range(0x200B, 0x2010),
    *range(0x2028, 0x202F),
    *range(0x2060, 0x206A),
    *range(0xFFF9, 0xFFFC),
    *range(0xD800, 0xE000),
]
_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
_CONTROL = {
    c: _NAMED.get(c) or (f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}") for c in _ESCAPED_CODES
}
_DOUBLE = str.maketrans({**_CONTROL, ord("\\"): "\\\\", ord('"'): '\\"'})
_SINGLE = str.maketrans({**_CONTROL, ord("\\"): "\\\\", ord("'"): "\\'"})


def py_string(value: str) -> str:
    """A double-quoted Python literal of ``value``."""
    return '"' + value.translate(_DOUBLE) + '"'


def black_string(value: str) -> str:
    """The literal of ``value`` exactly as black writes it.

    black prefers double quotes unless single quotes need fewer backslashes; with this module's
    escaping that is exactly when the value holds fewer ``'`` than ``"`` (test_format.py holds this
    equal to black's own ``normalize_string_quotes``). Prefixes and hex escape case never differ.
    """
    if value.count("'") < value.count('"'):
        return "'" + value.translate(_SINGLE) + "'"
    return py_string(value)


@dataclass(frozen=True)
class PyCall:
    """A call expression inside a literal, e.g. ``Secret("env", ...)``."""

    func: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class PyExpr:
    """A Python expression written as is (a name such as ``datetime.timezone.utc``)."""

    text: str


def py_literal(value: Any) -> str:
    """One-line Python source of a str, int, bool, None, list/tuple, dict, PyCall or PyExpr."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return black_string(value)
    if isinstance(value, PyExpr):
        return value.text
    if isinstance(value, list | tuple):
        return "[" + ", ".join(py_literal(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py_literal(k)}: {py_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, PyCall):
        args = [py_literal(a) for a in value.args]
        args += [f"{k}={py_literal(v)}" for k, v in value.kwargs]
        return f"{value.func}({', '.join(args)})"
    raise TypeError(f"no Python literal for {type(value).__name__}")


def _items(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [(f"{py_literal(k)}: ", v) for k, v in value.items()]
    if isinstance(value, PyCall):
        return [("", a) for a in value.args] + [(f"{k}=", v) for k, v in value.kwargs]
    return [("", item) for item in value]


def layout(value: Any, indent: int, prefix: str = "", suffix: str = "") -> list[str]:
    """``prefix + value + suffix`` as lines in black's layout for literal trees.

    A line that fits stays whole; a list or dict that does not is exploded one item per line with
    a trailing comma; a call's arguments first try one line of their own. This only spares black
    its second pass: black still formats the result, so a miss here costs time, never bytes.
    """
    pad = " " * indent
    line = pad + prefix + py_literal(value) + suffix
    if str_width(line) <= LINE_LENGTH or not isinstance(value, list | tuple | dict | PyCall):
        return [line]
    items = _items(value)
    if not items:
        return [line]
    if isinstance(value, PyCall):
        opener, closer = value.func + "(", ")"
        body = " " * (indent + 4) + ", ".join(p + py_literal(v) for p, v in items)
        if str_width(body) <= LINE_LENGTH:
            return [pad + prefix + opener, body, pad + closer + suffix]
    else:
        opener, closer = ("{", "}") if isinstance(value, dict) else ("[", "]")
    lines = [pad + prefix + opener]
    for item_prefix, item in items:
        lines += layout(item, indent + 4, item_prefix, ",")
    lines.append(pad + closer + suffix)
    return lines


def kwarg(value: Any, name: str, indent: int = 8) -> str:
    """One keyword argument of an exploded call, as full lines (``name=value,``)."""
    return "\n".join(layout(value, indent, f"{name}=", ","))


def secret_refs(secrets: Sequence[SecretEnv]) -> list[PyCall]:
    """Secret("env", DPONE_CONN_<NAME>, secret, key): the only way a DSN reaches a pod."""
    return [PyCall("Secret", ("env", s.env_name, s.secret, s.key)) for s in secrets]


def utc_datetime(day: tuple[int, int, int]) -> PyCall:
    return PyCall("datetime.datetime", day, (("tzinfo", PyExpr("datetime.timezone.utc")),))


@functools.lru_cache(maxsize=8192)
def env_literal(value: str) -> str:
    """An env value as it appears in the file: the literal black writes for it."""
    return black_string(value)


# Task arguments given in seconds in the catalog; Airflow takes a timedelta.
_SECONDS_OPTIONS = frozenset({"retry_delay", "max_retry_delay", "execution_timeout"})


def task_option(value: Any, name: str) -> Any:
    """A catalog task argument as the operator takes it (``datetime.timedelta`` for seconds;
    ``EXPONENTIAL_BACKOFF``, the flag or multiplier this Airflow reads, for a true backoff)."""
    if name in _SECONDS_OPTIONS:
        return PyCall("datetime.timedelta", kwargs=(("seconds", value),))
    if name == "retry_exponential_backoff" and value is True:
        return PyExpr("EXPONENTIAL_BACKOFF")
    return value


def assign(value: Any, name: str) -> str:
    """A module-level ``name = value`` in black's layout for literal trees."""
    return "\n".join(layout(value, 0, f"{name} = "))


def pod_arguments(dag: DagFile) -> dict[str, Any]:
    """POD_OPTIONS: the pod every task of a kubernetes workload runs in (image, namespace, secret
    projections, resources, the catalog's pod options), written once and expanded by each task."""
    found: dict[str, Any] = {"image": dag.image, "namespace": dag.namespace}
    if dag.secrets:
        found["secrets"] = secret_refs(dag.secrets)
    if dag.has_resources:
        found["container_resources"] = dag.resources
    found.update(dag.pod_options)
    return found


def task_arguments(dag: DagFile) -> dict[str, Any]:
    """TASK_ARGS: the operator arguments every task of the workload takes alike (retries, the
    catalog's task options; the subprocess flavour's Airflow connections), written once."""
    found: dict[str, Any] = {"retries": dag.retries}
    found.update((name, task_option(value, name)) for name, value in dag.task_options)
    if dag.airflow_connections:
        found["airflow_connections"] = dag.connection_ids
    return found


def task_envs(dag: DagFile) -> dict[str, dict[str, str]]:
    """TASK_ENV: the env of each runtime task, by task id (hooks take their neighbour's; each
    mapped item adds only its mapping item and label)."""
    return {task.task_id: dict(task.env) for task in dag.runtime_tasks}


def env_ref(task_id: str) -> str:
    """The expression naming a runtime task's env in TASK_ENV."""
    return f"TASK_ENV[{py_literal(task_id)}]"


def comment_text(value: str) -> str:
    """Text safe inside a ``#`` comment: one line, escapes as in a literal, no quotes added."""
    return py_string(value)[1:-1]


def pod_name(task_id: str) -> str:
    """A DNS-1123 pod name prefix for a task id (the pod operator appends a random suffix)."""
    name = "dpone-" + task_id.lower().replace("_", "-")
    return name.strip("-")[:63].rstrip("-")


FILTERS: dict[str, Callable[..., Any]] = {
    "py": py_literal,
    "kwarg": kwarg,
    "secret_refs": secret_refs,
    "utc_datetime": utc_datetime,
    "comment": comment_text,
    "pod_name": pod_name,
    "task_option": task_option,
    "assign": assign,
    "pod_arguments": pod_arguments,
    "task_arguments": task_arguments,
    "task_envs": task_envs,
    "env_ref": env_ref,
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
    """The elements of a list of env dicts, each ``{**base, <its own keys>}``."""

    base: str
    envs: tuple[Env, ...]


Splice = CodeSplice | EnvSplice


@dataclass(frozen=True)
class Rendered:
    """Source with placeholders, and what each placeholder ``_dpone_splice_<n>_`` stands for."""

    skeleton: str
    splices: tuple[Splice, ...]


class Placer(Protocol):
    """What the templates call to write the bulky parts (see the module docstring)."""

    def code(self, text: str) -> str: ...

    def envs(self, base: str, envs: Sequence[Env]) -> str: ...


def raw_env_literal(value: str) -> str:
    """A plain literal, leaving the quote choice to black (the inline path)."""
    return py_string(value)


def env_dict_lines(
    base: str, env: Env, indent: str, literal: Callable[[str], str] = env_literal
) -> list[str]:
    """``{**base, ...env}`` exploded, one entry per line, in black's layout (literal keys and
    values; ``base`` is the expression of the shared env the dict extends)."""
    lines = [f"{indent}{{", f"{indent}    **{base},"]
    lines += [f"{indent}    {py_string(k)}: {literal(v)}," for k, v in env]
    lines.append(f"{indent}}}")
    return lines


class InlinePlacer:
    """Everything inline: black formats the whole file."""

    def code(self, text: str) -> str:
        return text.rstrip("\n")

    def envs(self, base: str, envs: Sequence[Env]) -> str:
        return "\n".join(
            "\n".join(env_dict_lines(base, env, "", raw_env_literal)) + "," for env in envs
        )


class SplicePlacer:
    """Placeholders black keeps on a line of their own; the splices are recorded in order."""

    def __init__(self) -> None:
        self.splices: list[Splice] = []

    def _name(self, splice: Splice) -> str:
        self.splices.append(splice)
        return SPLICE_NAME.format(len(self.splices) - 1)

    def code(self, text: str) -> str:
        return self._name(CodeSplice(text))

    def envs(self, base: str, envs: Sequence[Env]) -> str:
        # The trailing comma is black's "magic" one: the list stays one element per line.
        return self._name(EnvSplice(base, tuple(envs))) + ","


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
