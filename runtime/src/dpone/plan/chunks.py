"""The deterministic backfill chunk planner.

A window ``[start, end)`` is split into half-open chunks of ``step`` units; indexes are one-based and
the last chunk is clipped to ``end``. Bounds are canonical strings (dates ``YYYY-MM-DD``, timestamps
``YYYY-MM-DDTHH:MM:SSZ`` in UTC) or integers, so plans hash the same on every machine.
"""

from __future__ import annotations

import calendar
import contextlib
import datetime as dt
import gc
import hashlib
import itertools
from collections.abc import Iterator
from json.encoder import encode_basestring
from typing import cast

from dpone.plan.canonical import FieldRecord, fingerprint, fingerprint_text, json_scalar
from dpone.records import record

CHUNK_TYPES = ("date", "timestamp", "integer")
UNITS_BY_TYPE: dict[str, tuple[str, ...]] = {
    "date": ("day", "week", "month"),
    "timestamp": ("hour", "minute", "day", "week", "month"),
    "integer": ("value",),
}
MAX_CHUNKS = 100_000
INNER_MODES = ("replace", "merge", "append", "full_refresh")

Bound = str | int


class ChunkPlanError(ValueError):
    """A window that cannot be planned; the caller turns it into a located dpone error."""


@record
class ChunkSpec(FieldRecord):
    """What to split: the column, its type, the half-open window and the step."""

    column: str
    type: str
    start: Bound
    end: Bound
    step: int
    unit: str


@record
class Chunk(FieldRecord):
    """One half-open slice ``[start, end)`` of the window with its idempotency key."""

    index: int
    start: Bound
    end: Bound
    idempotency_key: str


def parse_date(value: object) -> dt.date:
    if isinstance(value, dt.datetime):
        raise ChunkPlanError(f"expected a date, got a timestamp {value.isoformat()!r}")
    if isinstance(value, dt.date):
        return value
    if not isinstance(value, str):
        raise ChunkPlanError(f"expected a date string YYYY-MM-DD, got {value!r}")
    try:
        if len(value) != 10:
            raise ValueError
        return dt.date.fromisoformat(value)
    except ValueError:
        raise ChunkPlanError(f"expected a date YYYY-MM-DD, got {value!r}") from None


def parse_timestamp(value: object) -> dt.datetime:
    """Timezone-aware ISO-8601 to UTC; a naive timestamp is refused (UTC must be explicit)."""
    if isinstance(value, dt.datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ChunkPlanError(f"expected an ISO-8601 timestamp, got {value!r}") from None
    else:
        raise ChunkPlanError(f"expected an ISO-8601 timestamp string, got {value!r}")
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise ChunkPlanError(f"timestamp {value!r} has no timezone; add Z or an offset")
    try:
        return parsed.astimezone(dt.UTC)
    except OverflowError:  # 0001-01-01T00:00:00+05:00 is before the first UTC instant
        raise ChunkPlanError(f"timestamp {value!r} is out of range in UTC") from None


def format_timestamp(value: dt.datetime) -> str:
    """ISO-8601 in UTC with a four-digit year (strftime writes year 1 as "1", which a database
    reads as 2001)."""
    utc = value.astimezone(dt.UTC)
    return f"{utc.year:04d}{utc.strftime('-%m-%dT%H:%M:%SZ')}"


def canonical_bound(type_: str, value: object) -> Bound:
    """The canonical form of a window bound, or ChunkPlanError."""
    if type_ == "date":
        return parse_date(value).isoformat()
    if type_ == "timestamp":
        stamp = parse_timestamp(value)
        if stamp.microsecond:
            raise ChunkPlanError(f"timestamp {value!r} has sub-second precision")
        return format_timestamp(stamp)
    if type_ == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ChunkPlanError(f"expected an integer bound, got {value!r}")
        return value
    raise ChunkPlanError(f"unknown chunk type {type_!r}")


def _add_months(day: dt.date, months: int) -> dt.date:
    month0 = day.month - 1 + months
    year = day.year + month0 // 12
    month = month0 % 12 + 1
    last = calendar.monthrange(year, month)[1]  # no date of the next month: December 9999 works
    return dt.date(year, month, min(day.day, last))


_TIMEDELTA_UNIT = {"minute": "minutes", "hour": "hours", "day": "days", "week": "weeks"}


def _month_stamps(begin: dt.datetime, finish: dt.datetime, step: int) -> list[Bound]:
    """The edges of timestamp chunks of ``step`` calendar months in UTC: each boundary is
    ``begin`` moved by whole months with its UTC time of day kept (the day clipped to the month's
    last day, always counted from ``begin`` so a 31st never drifts)."""

    def shifted(steps: int) -> dt.datetime | None:
        try:
            day = _add_months(begin.date(), steps * step)
        except (OverflowError, ValueError):
            return None
        return dt.datetime.combine(day, begin.timetz())

    out: list[Bound] = [format_timestamp(begin)]
    k = 1
    while True:
        upper = shifted(k)
        if upper is None or upper >= finish:
            out.append(format_timestamp(finish))
            return out
        out.append(format_timestamp(upper))
        k += 1
        if k > MAX_CHUNKS:
            raise ChunkPlanError(f"window yields more than {MAX_CHUNKS} chunks")


def _bounds(spec: ChunkSpec) -> list[tuple[Bound, Bound]]:
    """Every chunk's ``(start, end)``, in order."""
    return list(itertools.pairwise(_edges(spec)))


def _edges(spec: ChunkSpec) -> list[Bound]:
    """The chunk boundaries of the window: its start, then each chunk's end (chunks are
    contiguous, so chunk i is ``[edges[i-1], edges[i])``), all of one type (``str`` for dates and
    timestamps, ``int`` for integers); ChunkPlanError on a zero-length or oversized window."""
    if spec.step < 1:
        raise ChunkPlanError(f"step must be a positive integer, got {spec.step!r}")
    if spec.unit not in UNITS_BY_TYPE.get(spec.type, ()):
        raise ChunkPlanError(f"unit {spec.unit!r} does not fit chunk type {spec.type!r}")
    if spec.type == "integer":
        lo, hi = canonical_bound("integer", spec.start), canonical_bound("integer", spec.end)
        assert isinstance(lo, int) and isinstance(hi, int)
        if lo >= hi:
            raise ChunkPlanError(f"zero-length window: start {lo} is not before end {hi}")
        if (hi - lo + spec.step - 1) // spec.step > MAX_CHUNKS:
            raise ChunkPlanError(f"window yields more than {MAX_CHUNKS} chunks")
        numbers: list[Bound] = list(range(lo, hi, spec.step))
        numbers.append(hi)
        return numbers
    if spec.type == "date":
        first, last = parse_date(spec.start), parse_date(spec.end)
        if first >= last:
            raise ChunkPlanError(f"zero-length window: start {first} is not before end {last}")
        days = spec.step * (7 if spec.unit == "week" else 1)

        def shifted(steps: int) -> dt.date | None:
            """``first`` moved by ``steps`` steps; None past dt.date.max (so past ``last``)."""
            try:
                if spec.unit == "month":
                    return _add_months(first, steps * spec.step)
                return first + dt.timedelta(days=steps * days)
            except (OverflowError, ValueError):
                return None

        dates: list[Bound] = [first.isoformat()]
        k = 1
        while True:
            upper_day = shifted(k)
            if upper_day is None or upper_day >= last:
                dates.append(last.isoformat())
                return dates
            dates.append(upper_day.isoformat())
            k += 1
            if k > MAX_CHUNKS:
                raise ChunkPlanError(f"window yields more than {MAX_CHUNKS} chunks")
    begin, finish = parse_timestamp(spec.start), parse_timestamp(spec.end)
    if begin >= finish:
        raise ChunkPlanError(f"zero-length window: start {spec.start} is not before end {spec.end}")
    if spec.unit == "month":
        return _month_stamps(begin, finish, spec.step)
    try:
        delta = dt.timedelta(**{_TIMEDELTA_UNIT[spec.unit]: spec.step})
    except OverflowError:  # a step longer than any datetime window: the whole window is one chunk
        return [format_timestamp(begin), format_timestamp(finish)]
    if (finish - begin) / delta > MAX_CHUNKS:
        raise ChunkPlanError(f"window yields more than {MAX_CHUNKS} chunks")
    seconds = delta // dt.timedelta(seconds=1)
    if begin.microsecond == 0 and finish.microsecond == 0 and begin.year >= 1000:
        edges = _whole_second_edges(_epoch_seconds(begin), _epoch_seconds(finish), seconds)
        return cast(list[Bound], edges)
    stamps: list[Bound] = [format_timestamp(begin)]
    lower_ts = begin
    while lower_ts < finish:
        try:
            upper_ts = min(lower_ts + delta, finish)
        except OverflowError:  # past dt.datetime.max, so past ``finish``: clip
            upper_ts = finish
        stamps.append(format_timestamp(upper_ts))
        lower_ts = upper_ts
    return stamps


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_ORDINAL = _EPOCH.date().toordinal()


def _epoch_seconds(value: dt.datetime) -> int:
    since = value - _EPOCH
    return since.days * 86_400 + since.seconds


def _whole_second_edges(first: int, last: int, step: int) -> list[str]:
    """Every chunk boundary of [first, last) (the first lower bound, then each upper bound), as
    format_timestamp writes them, without a datetime or strftime per edge. Only for years of four
    digits (strftime writes year 999 as "999"): the caller keeps earlier years off this path.

    When ``step`` divides a day, every day repeats the same times of day: their texts are made
    once and each day's edges are its date text joined to them (8,760 hourly chunks in about
    1 ms); other steps build each edge's date and time text from caches (about 6 ms).
    """
    day_first, day_last = first // 86_400, last // 86_400
    if 86_400 % step == 0 and day_last - day_first < MAX_CHUNKS:
        offset = first % step
        clocks = [_clock_text(second) for second in range(offset, 86_400, step)]
        edges: list[str] = []
        extend = edges.extend
        for day in range(day_first, day_last + 1):
            date = dt.date.fromordinal(_EPOCH_ORDINAL + day).isoformat()
            extend([date + clock for clock in clocks])
        skip = (first - day_first * 86_400 - offset) // step  # edges before ``first``
        keep = (last - first + step - 1) // step  # edges from ``first`` below ``last``
        del edges[skip + keep :]
        del edges[:skip]
        edges.append(_moment_text(last))
        return edges
    days: dict[int, str] = {}
    times: dict[int, str] = {}

    def text(moment: int) -> str:
        day, second = divmod(moment, 86_400)
        date = days.get(day)
        if date is None:
            date = days[day] = dt.date.fromordinal(_EPOCH_ORDINAL + day).isoformat()
        clock = times.get(second)
        if clock is None:
            clock = times[second] = _clock_text(second)
        return date + clock

    return [text(moment) for moment in range(first, last, step)] + [text(last)]


def _clock_text(second: int) -> str:
    hours, rest = divmod(second, 3_600)
    return f"T{hours:02d}:{rest // 60:02d}:{rest % 60:02d}Z"


def _moment_text(moment: int) -> str:
    day, second = divmod(moment, 86_400)
    return dt.date.fromordinal(_EPOCH_ORDINAL + day).isoformat() + _clock_text(second)


def idempotency_key(run_key: str, index: int, start: Bound, end: Bound) -> str:
    return fingerprint({"run_key": run_key, "index": index, "start": start, "end": end})


def plan_chunks(spec: ChunkSpec, run_key: str) -> tuple[Chunk, ...]:
    """Split the window into its chunks; ChunkPlanError on a zero-length or oversized plan."""
    return plan_chunks_hashed(spec, run_key)[0]


def plan_chunks_hashed(spec: ChunkSpec, run_key: str) -> tuple[tuple[Chunk, ...], str]:
    """``plan_chunks`` and its ``plan_hash`` in one pass: the canonical text of each chunk is
    written next to its key's, from the same encoded edges (what a pod recompiles)."""
    edges = _edges(spec)
    run_key_json = json_scalar(run_key)
    kind = type(edges[0])
    if type(run_key) is not str or run_key_json is None or (kind is not str and kind is not int):
        return _plan_chunks_generic(list(itertools.pairwise(edges)), run_key)
    with _gc_paused():
        if kind is str:
            coded = [encode_basestring(edge) for edge in cast(list[str], edges)]
        else:
            coded = [int.__repr__(edge) for edge in cast(list[int], edges)]
        indexes = range(1, len(edges))
        sha256 = hashlib.sha256
        # the canonical text of idempotency_key's dict, keys in sorted order
        keys = [
            "sha256:"
            + sha256(
                f'{{"end":{high},"index":{index},"run_key":{run_key_json},"start":{low}}}'.encode()
            ).hexdigest()
            for index, low, high in zip(indexes, coded, coded[1:], strict=False)
        ]
        # the canonical text of chunk.canonical() for each chunk, keys in sorted order
        text = ",".join(
            [
                f'{{"end":{high},"idempotency_key":"{key}","index":{index},"start":{low}}}'
                for index, low, high, key in zip(indexes, coded, coded[1:], keys, strict=False)
            ]
        )
        chunks = tuple(map(_new_chunk, indexes, edges, edges[1:], keys))
    # fingerprint_text("[" + text + "]") without copying the 1 MB text twice more
    digest = hashlib.sha256(b"[")
    digest.update(text.encode())
    digest.update(b"]")
    return chunks, "sha256:" + digest.hexdigest()


def _new_chunk(index: int, start: Bound, end: Bound, key: str) -> Chunk:
    """Chunk(index, start, end, key) without the frozen dataclass's four object.__setattr__
    calls (a third of the planner's time); the object is the same in every respect."""
    chunk = object.__new__(Chunk)
    chunk.__dict__.update(index=index, start=start, end=end, idempotency_key=key)
    return chunk


def _plan_chunks_generic(
    bounds: list[tuple[Bound, Bound]], run_key: str
) -> tuple[tuple[Chunk, ...], str]:
    chunks = tuple(
        Chunk(index, lower, upper, idempotency_key(run_key, index, lower, upper))
        for index, (lower, upper) in enumerate(bounds, start=1)
    )
    return chunks, plan_hash(chunks)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a plan's objects are made: they hold no cycles, and
    a year of hourly chunks would otherwise trigger collections that walk the whole heap
    (measured: a third of the planner's time in a pod, most of its variance)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def backfill_run_key(dataset: str, spec: ChunkSpec, inner_mode: str) -> str:
    """Derived campaign key: the same dataset, chunking and inner mode resume the same ledger."""
    digest = fingerprint({"dataset": dataset, "chunk": spec.canonical(), "inner_mode": inner_mode})
    return "bf-" + digest[7:31]


#: plan hashes of the last few chunk tuples, by identity (the tuple is kept, so its id stays its
#: own): a run hashes its plan when it compiles the pack and again when the ledger checks the
#: shape it is handed, 20 ms each for a year of hourly chunks
_HASHED: dict[int, tuple[tuple[Chunk, ...], str]] = {}
_HASHED_MAX = 8


def plan_hash(chunks: tuple[Chunk, ...]) -> str:
    """``backfill_plan_hash``: the fingerprint of the canonical chunk list."""
    hit = _HASHED.get(id(chunks))
    if hit is not None and hit[0] is chunks:
        return hit[1]
    parts: list[str] = []
    for chunk in chunks:
        if type(chunk) is not Chunk or type(chunk.index) is not int:
            return fingerprint([chunk.canonical() for chunk in chunks])
        low, high = json_scalar(chunk.start), json_scalar(chunk.end)
        key = json_scalar(chunk.idempotency_key)
        if low is None or high is None or key is None:
            return fingerprint([chunk.canonical() for chunk in chunks])  # raises on a float
        # the canonical text of chunk.canonical(), keys in sorted order
        parts.append(
            f'{{"end":{high},"idempotency_key":{key},"index":{chunk.index},"start":{low}}}'
        )
    digest = fingerprint_text("[" + ",".join(parts) + "]")
    if type(chunks) is tuple:  # of frozen chunks of exact str and int: it cannot change
        if len(_HASHED) >= _HASHED_MAX:
            _HASHED.clear()
        _HASHED[id(chunks)] = (chunks, digest)
    return digest
