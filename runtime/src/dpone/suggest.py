""" "Did you mean" for a misspelled name, from the names that exist (standard library only, so
the pure core's validation can use it too)."""

from __future__ import annotations

from collections.abc import Iterable


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known name, or ``""`` when none is close."""
    if not isinstance(name, str):
        return ""
    names = sorted(set(known))
    folded = {n.casefold(): n for n in names}
    if name.casefold() in folded and folded[name.casefold()] != name:
        return f" (did you mean {folded[name.casefold()]!r}?)"
    import difflib  # only when a name is wrong: not on the path of a run that is right

    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def not_in(what: str, name: str, where: str, known: Iterable[str]) -> str:
    """``workload 'x' is not in catalog.yaml (has: a, b) (did you mean 'a'?)``."""
    names = sorted(set(known))
    return f"{what} {name!r} is not in {where} (has: {', '.join(names)}){did_you_mean(name, names)}"
