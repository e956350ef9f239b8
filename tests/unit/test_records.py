"""`record` behaves as `@dataclass(frozen=True)` does, for every shape the runtime uses.

Each shape is declared twice, once with each decorator, and the two classes are driven through
the same operations: construction (positional, keyword, defaults, default factories, fields
outside __init__, __post_init__), equality, hashing, repr, frozenness, `dataclasses.replace`,
`fields`, `asdict`, `__match_args__`, copying and subclassing. Every outcome, an exception's
type and message included, must be the same."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from dpone.records import record


def _both(body: Callable[[Callable[[type], type]], type]) -> tuple[type, type]:
    return body(dataclasses.dataclass(frozen=True)), body(record)


def plain(deco: Callable[[type], type]) -> type:
    @deco
    class Plain:
        """Required and defaulted fields, one left out of comparison and repr."""

        a: int
        b: str = "b"
        hidden: float = dataclasses.field(default=0.5, compare=False, repr=False)
        tags: tuple[str, ...] = ()
        limit: ClassVar[int] = 3

    return Plain


def factories(deco: Callable[[type], type]) -> type:
    @deco
    class Factories:
        name: str
        items: list[int] = dataclasses.field(default_factory=list)
        derived: str = dataclasses.field(init=False, default="fixed")
        made: dict[str, int] = dataclasses.field(init=False, default_factory=dict)

    return Factories


def post_init(deco: Callable[[type], type]) -> type:
    @deco
    class Checked:
        """Validates in __post_init__ and fills a field outside __init__."""

        low: int
        high: int
        span: int = dataclasses.field(init=False, default=0)

        def __post_init__(self) -> None:
            if self.low > self.high:
                raise ValueError(f"low {self.low} > high {self.high}")
            object.__setattr__(self, "span", self.high - self.low)

    return Checked


def hashing(deco: Callable[[type], type]) -> type:
    @deco
    class Hashing:
        key: str
        weight: int = dataclasses.field(default=0, hash=False)
        note: str = dataclasses.field(default="", compare=False)

    return Hashing


def empty(deco: Callable[[type], type]) -> type:
    @deco
    class Empty:
        pass

    return Empty


SHAPES = [plain, factories, post_init, hashing, empty]
ARGUMENTS: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {
    "plain": [((1,), {}), ((1, "x"), {}), ((), {"a": 2, "tags": ("t",)}), ((1, "x", 9.0), {})],
    "factories": [(("n",), {}), (("n", [1, 2]), {}), ((), {"name": "m", "items": [3]})],
    "post_init": [((1, 5), {}), ((), {"low": 2, "high": 2}), ((6, 1), {})],
    "hashing": [(("k",), {}), (("k", 5, "n"), {}), (("j", 5), {})],
    "empty": [((), {})],
}


def _outcome(action: Callable[[], Any]) -> Any:
    try:
        return ("ok", action())
    except Exception as exc:  # the type and message must match too
        return ("raised", type(exc).__name__, str(exc))


def _instances(kind: type, shape: str) -> list[Any]:
    made = [_outcome(lambda a=a, k=k: kind(*a, **k)) for a, k in ARGUMENTS[shape]]
    return [value for status, value, *_ in made if status == "ok"]


def _same_outcome(action: Callable[[Any], Any], reference: Any, ours: Any) -> None:
    assert _outcome(functools.partial(action, ours)) == _outcome(
        functools.partial(action, reference)
    )


def _hash_equal(a: Any, b: Any) -> bool:
    return hash(a) == hash(b)


def _construct(kind: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return kind(*args, **kwargs)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.__name__)
def test_a_record_behaves_as_a_frozen_dataclass(shape: Callable[..., type]) -> None:
    reference, ours = _both(shape)
    name = shape.__name__
    for args, kwargs in ARGUMENTS[name] + [((1, 2, 3, 4, 5, 6), {}), ((), {"nope": 1})]:
        expected = _outcome(functools.partial(_construct, reference, args, kwargs))
        found = _outcome(functools.partial(_construct, ours, args, kwargs))
        assert found[0] == expected[0], (found, expected)
        if expected[0] == "ok":
            assert repr(found[1]) == repr(expected[1])
        else:
            assert found == expected
    left, right = _instances(reference, name), _instances(ours, name)
    assert len(left) == len(right) > 0
    for i, (x, y) in enumerate(zip(left, right, strict=True)):
        for j, (u, v) in enumerate(zip(left, right, strict=True)):
            assert (x == u) == (y == v), (i, j)
            same_hash = _outcome(functools.partial(_hash_equal, x, u))
            assert _outcome(functools.partial(_hash_equal, y, v)) == same_hash, (i, j)
        assert (y == object()) is False and (y != object()) is True
        assert [f.name for f in dataclasses.fields(y)] == [f.name for f in dataclasses.fields(x)]
        assert dataclasses.asdict(y) == dataclasses.asdict(x)
        assert copy.deepcopy(y) == y and copy.copy(y) == y
        names = [*[f.name for f in dataclasses.fields(y)][:1], "other"]
        for attribute in names:
            _same_outcome(lambda o, a=attribute: setattr(o, a, 1), x, y)
            _same_outcome(lambda o, a=attribute: delattr(o, a), x, y)
        if dataclasses.fields(y):
            first = dataclasses.fields(y)[0].name
            assert dataclasses.replace(y, **{first: getattr(y, first)}) == y
    assert getattr(ours, "__match_args__", None) == getattr(reference, "__match_args__", None)


def test_a_record_subclass_is_frozen_and_compares_by_its_own_class() -> None:
    @record
    class Base:
        a: int

    @record
    class Child(Base):
        b: int = 0

    child = Child(1, 2)
    assert child == Child(1, 2) and child != Child(1, 3) and child != Base(1)
    assert repr(child) == f"{Child.__qualname__}(a=1, b=2)"
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'a'"):
        child.a = 5  # type: ignore[misc]


def test_a_body_that_defines_its_own_methods_keeps_them() -> None:
    @record
    class Own:
        a: int

        def __repr__(self) -> str:
            return "own"

        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return 7

    assert repr(Own(1)) == "own" and Own(1) == Own(2) and hash(Own(3)) == 7


def test_a_body_with_only_eq_is_hashed_by_its_fields_as_dataclasses_does() -> None:
    @record
    class OnlyEq:  # noqa: PLW1641 - dataclasses gives it a __hash__, and so does record
        a: int

        def __eq__(self, other: object) -> bool:
            return isinstance(other, OnlyEq) and other.a == self.a

    assert hash(OnlyEq(1)) == hash(OnlyEq(1))


def test_what_a_record_refuses() -> None:
    with pytest.raises(TypeError, match="Cannot overwrite attribute __setattr__"):

        @record
        class Settable:
            a: int

            def __setattr__(self, name: str, value: Any) -> None:
                pass

    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):

        @record
        class Ordered:
            a: int = 0
            b: int  # type: ignore[misc]

    with pytest.raises(TypeError, match="keyword-only"):

        @record
        class KeywordOnly:
            a: int = dataclasses.field(kw_only=True)

    with pytest.raises(TypeError, match="InitVar"):

        @record
        class WithInitVar:
            a: dataclasses.InitVar[int]


def test_every_frozen_runtime_record_is_a_record() -> None:
    """One way to declare a frozen record in the runtime: `@dataclass(frozen=True)` compiles
    five more methods at every pod's start."""
    from pathlib import Path

    runtime = Path(__file__).resolve().parents[2] / "runtime" / "src" / "dpone"
    found = [
        str(path.relative_to(runtime))
        for path in sorted(runtime.rglob("*.py"))
        if path.name != "records.py" and "dataclass(frozen=True" in path.read_text("utf-8")
    ]
    assert not found, f"use dpone.records.record for frozen records in {found}"
