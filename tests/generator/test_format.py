"""The fast formatter (black on a skeleton + spliced env dicts) gives black's exact bytes.

format.format_rendered exists for speed; the contract is "black-formatted with the pinned black".
These tests hold the two equal: on every golden case, on hostile env values, and as a fixed point.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
from dpone.packing.task_env import Env
from dpone_generator.build import build
from dpone_generator.dagspec import DagFile, HookTask, RuntimeTask
from dpone_generator.format import format_python, format_rendered
from dpone_generator.render import black_string, py_string, render_dag, render_source
from generator_support import golden_cases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@functools.cache
def _dags(case: str) -> tuple[DagFile, ...]:
    result = build(f"golden/{case}/workloads.yaml")
    assert not result.errors
    return result.dags


@pytest.mark.parametrize("case", golden_cases())
def test_fast_path_equals_black_over_the_whole_file(case: str, in_root: Path) -> None:
    for dag in _dags(case):
        fast = format_rendered(render_dag(dag))
        assert fast == format_python(render_source(dag))
        assert format_python(fast) == fast  # a fixed point: black changes nothing


names = st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,20}\Z")
values = st.one_of(
    st.text(max_size=60),
    st.sampled_from(["{{ ds }}", "{# x", "a.json", "'\"", '"', "\\", "\r\n", "\u2028", "\x7f", ""]),
    st.text(alphabet="'\"\\{}#%\n\r\t ab.", max_size=30),
)
envs = st.lists(st.tuples(names, values), min_size=1, max_size=6, unique_by=lambda kv: kv[0])


def _with_envs(dag: DagFile, hook_env: Env, item_envs: list[Env]) -> DagFile:
    task = dag.runtime_tasks[0]
    # A mapped item's env extends the task's (the file writes {**TASK_ENV[...], <item keys>}).
    mapped = tuple((*hook_env, *env) for env in item_envs) if task.mapped else ()
    new_task: RuntimeTask = dataclasses.replace(task, env=hook_env, mapped_envs=mapped)
    pre = tuple(HookTask(h.task_id, h.command, hook_env) for h in dag.pre_hooks)
    post = tuple(HookTask(h.task_id, h.command, hook_env) for h in dag.post_hooks)
    return dataclasses.replace(dag, runtime_tasks=(new_task,), pre_hooks=pre, post_hooks=post)


@pytest.mark.parametrize("case", ["gitops_policy", "hooks_subprocess"])
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(hook_env=envs, item_envs=st.lists(envs, min_size=1, max_size=4))
def test_fast_path_equals_black_for_hostile_env_values(
    case: str,
    in_root: Path,
    hook_env: list[tuple[str, str]],
    item_envs: list[list[tuple[str, str]]],
) -> None:
    dag = _with_envs(_dags(case)[0], tuple(hook_env), [tuple(e) for e in item_envs])
    assert format_rendered(render_dag(dag)) == format_python(render_source(dag))


@given(st.text(max_size=80))
def test_black_string_is_what_black_writes_and_evaluates_back(value: str) -> None:
    literal = black_string(value)
    assert format_python(f"x = {py_string(value)}\n") == f"x = {literal}\n"
    assert eval(literal) == value


def test_literals_never_depend_on_the_python_unicode_database() -> None:
    # Controls, C1 controls and invisible/bidi characters are always escaped; other text is raw.
    assert py_string("ünï ✓") == '"ünï ✓"'
    assert py_string("a\u202eb\u2028c\x85d\x00") == '"a\\u202eb\\u2028c\\x85d\\x00"'
