"""Frozen records: dataclasses that compile one method per class, not six.

A frozen dataclass compiles six generated methods with ``exec`` when its module is imported
(``__init__``, ``__setattr__``, ``__delattr__``, ``__eq__``, ``__hash__``, ``__repr__``: on
CPython 3.11 about 0.5 ms a class), and a pod imports some sixty records before it can tell that
its chunks are already committed. ``record`` lets ``dataclasses`` collect the fields (so
``fields``, ``replace``, ``asdict`` and ``__match_args__`` work as for any dataclass) and
compiles only ``__init__``, the one method whose signature is the class's own; the other five
are closures over the class's field names, made without compiling anything. They behave as a
frozen dataclass's do: equal only to an instance of the very same class with equal compared
fields, hashed over the fields that take part in the hash, shown as ``Name(field=value, ...)``,
and any assignment or deletion of a field raises ``dataclasses.FrozenInstanceError``.

Not supported (refused when the class is made): ``InitVar`` pseudo-fields, keyword-only fields,
and a class body that defines ``__setattr__`` or ``__delattr__``.
"""

from __future__ import annotations

import dataclasses
import inspect
import reprlib
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform

__all__ = ["record"]

T = TypeVar("T", bound=type)

_FACTORY = object()  # the default of an argument whose field has a default_factory
_INIT_GLOBALS = {"_set": object.__setattr__, "_FACTORY": _FACTORY}


def _getter(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """A function giving the tuple of ``names``' values (a tuple even for one or none)."""
    if not names:
        return lambda _: ()
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda instance: (one(instance),)
    return attrgetter(*names)


def _init(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> Callable[..., None]:
    """The ``__init__`` a frozen dataclass would have: each field set through
    ``object.__setattr__`` (defaults and default factories as dataclasses apply them), then
    ``__post_init__`` when the class has one."""
    names: dict[str, Any] = dict(_INIT_GLOBALS)
    params: list[str] = []
    lines: list[str] = []
    defaulted = ""
    for f in fields:
        if f.kw_only:
            raise TypeError(f"{cls.__qualname__}.{f.name}: a record has no keyword-only fields")
        if f.default is not dataclasses.MISSING:
            names[f"_d_{f.name}"] = f.default
            default, given = f"=_d_{f.name}", f.name
        elif f.default_factory is not dataclasses.MISSING:
            names[f"_f_{f.name}"] = f.default_factory
            default = "=_FACTORY"
            given = f"_f_{f.name}() if {f.name} is _FACTORY else {f.name}"
        else:
            default, given = "", f.name
        if not f.init:
            if not default:
                continue  # dataclasses leaves such a field unset too
            given = f"_d_{f.name}" if f.default is not dataclasses.MISSING else f"_f_{f.name}()"
        elif default:
            params.append(f"{f.name}{default}")
            defaulted = f.name
        elif defaulted:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
        else:
            params.append(f.name)
        lines.append(f"_set(__record_self__, {f.name!r}, {given})")
    if hasattr(cls, "__post_init__"):
        lines.append("__record_self__.__post_init__()")
    source = f"def __init__(__record_self__, {', '.join(params)}) -> None:\n    " + (
        "\n    ".join(lines) or "pass"
    )
    made: dict[str, Any] = {}
    exec(source, names, made)  # the text is built above from field names only
    init: Callable[..., None] = made["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


def _explicit_hash(cls: type) -> bool:
    """True when the class body defines ``__hash__`` (a body with only ``__eq__`` gets None)."""
    found = cls.__dict__.get("__hash__", dataclasses.MISSING)
    return not (found is dataclasses.MISSING or (found is None and "__eq__" in cls.__dict__))


def _methods(cls: type, fields: tuple[dataclasses.Field[Any], ...]) -> dict[str, Any]:
    """A frozen dataclass's other five methods, as closures over ``cls`` and its field names."""
    compared = _getter([f.name for f in fields if f.compare])
    hashed = _getter([f.name for f in fields if (f.compare if f.hash is None else f.hash)])
    shown = tuple(f.name for f in fields if f.repr)
    frozen = tuple(f.name for f in fields)
    owner: Any = cls

    def __eq__(self: Any, other: object) -> bool:
        if other.__class__ is self.__class__:
            return bool(compared(self) == compared(other))
        return NotImplemented

    def __hash__(self: Any) -> int:
        return hash(hashed(self))

    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        values = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"{self.__class__.__qualname__}({values})"

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is owner or name in frozen:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(owner, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is owner or name in frozen:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(owner, self).__delattr__(name)

    return {
        "__eq__": __eq__,
        "__hash__": __hash__,
        "__repr__": __repr__,
        "__setattr__": __setattr__,
        "__delattr__": __delattr__,
    }


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def record(cls: T) -> T:
    """``@dataclass(frozen=True)``, compiling only ``__init__`` (see the module's docstring)."""
    for name in ("__setattr__", "__delattr__"):
        if name in cls.__dict__:
            raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
    explicit_hash = _explicit_hash(cls)
    if cls.__doc__ is None:  # dataclasses would build one from inspect.signature (slow)
        cls.__doc__ = f"{cls.__name__} record"
    dataclasses.dataclass(init=False, eq=False, repr=False)(cls)  # the fields; cls is changed
    fields = dataclasses.fields(cls)
    if any("InitVar" in str(kind) for kind in inspect.get_annotations(cls).values()):
        raise TypeError(f"{cls.__qualname__}: a record has no InitVar fields")
    methods = {"__init__": _init(cls, fields), **_methods(cls, fields)}
    if explicit_hash:
        del methods["__hash__"]
    for name, method in methods.items():
        if name not in cls.__dict__ or name in ("__setattr__", "__delattr__", "__hash__"):
            method.__qualname__ = f"{cls.__qualname__}.{name}"
            setattr(cls, name, method)
    return cls
