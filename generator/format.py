"""Format a rendered DAG file with the exactly pinned black, in-process.

The formatter is part of the output contract: the same inputs must give the same bytes on every
machine, so the mode is spelled out here (not read from any pyproject) and black is pinned.

Speed: black costs about 1 ms per env dict and 50 ms for the operator code every file repeats,
so 500 workloads formatted whole would take minutes. ``format_rendered`` runs black on the small
skeleton only, formats each distinct operator code block once per process, and writes the env
dicts in the one layout black gives them (exploded by the magic trailing comma, one key per line,
literals quote-normalised by black's own function). tests/generator/test_format.py holds the result
byte-equal to black over the whole inline source, so the contract stays "black-formatted".
"""

from __future__ import annotations

import functools
import re

import black
from black.mode import Mode, TargetVersion
from black.parsing import InvalidInput

from .render import LINE_LENGTH, CodeSplice, EnvSplice, Rendered, env_dict_lines

# Airflow 2.10 still runs on Python 3.9: never let black use syntax newer than that.
MODE = Mode(
    target_versions={TargetVersion.PY39},
    line_length=LINE_LENGTH,
    string_normalization=True,
    magic_trailing_comma=True,
)
_PLACEHOLDER = re.compile(r"^(?P<indent>[ ]*)(?P<head>.*?)_dpone_splice_(?P<n>\d+)_(?P<tail>.*)$")


class FormatError(ValueError):
    """The renderer produced text black cannot parse, or lost a splice: a template bug."""


def format_python(source: str) -> str:
    """The black-formatted form of ``source``."""
    try:
        return black.format_str(source, mode=MODE)
    except InvalidInput as exc:
        raise FormatError(f"rendered DAG is not valid Python: {exc}") from exc


@functools.lru_cache(maxsize=16)
def format_code_block(code: str) -> str:
    """A top-level code block formatted on its own (cached: every file of a flavour shares it)."""
    return format_python(code).rstrip("\n")


def _expand(line: str, rendered: Rendered, used: set[int]) -> list[str]:
    match = _PLACEHOLDER.match(line)
    if match is None:
        return [line]
    index = int(match["n"])
    if index >= len(rendered.splices) or index in used:
        raise FormatError(f"unknown or repeated splice {index}")
    used.add(index)
    splice = rendered.splices[index]
    indent, head, tail = match["indent"], match["head"], match["tail"]
    if isinstance(splice, CodeSplice):
        if indent or head or tail:
            raise FormatError(f"code splice {index} is not a top-level line: {line!r}")
        return format_code_block(splice.code).split("\n")
    assert isinstance(splice, EnvSplice)
    if head or tail != ",":
        raise FormatError(f"env list splice {index} is not a list element line: {line!r}")
    out: list[str] = []
    for env in splice.envs:
        lines = env_dict_lines(splice.base, env, indent)
        lines[-1] += ","
        out += lines
    return out


def format_rendered(rendered: Rendered) -> str:
    """black over the skeleton, then every splice in black's layout (see the module docstring)."""
    skeleton = format_python(rendered.skeleton)
    used: set[int] = set()
    out: list[str] = []
    for line in skeleton.split("\n"):
        out += _expand(line, rendered, used)
    if len(used) != len(rendered.splices):
        raise FormatError("black dropped or merged a splice placeholder")
    return "\n".join(out)
