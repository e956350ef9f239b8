"""The read-back gate against the real Postgres and MariaDB: a chunk commits only when the sink,
read back inside its transaction, holds what the source holds for the chunk.

The case that motivated it: a source timestamp with fractions, a target column without them. A
Postgres target rounds ``23:59:59.7`` up into the next day (the chunk's range loses the row: the
counts differ); a MariaDB target truncates it to ``23:59:59`` (same count, other content). Each
pair is built here directly on the connectors, so a type preflight cannot refuse it first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from dpone import errors
from dpone.connectors.base import (
    ChunkWindow,
    InnerMode,
    ReadBack,
    SinkOptions,
    SinkSpec,
    SourceSpec,
    TableRef,
    checksum_rows,
)
from dpone.connectors.factory import open_sink, open_source
from dpone.errors import DponeError

from .mysql_support import My
from .support import Pg

pytestmark = pytest.mark.postgres

ROWS = [
    (1, "2024-01-01 10:00:00", "a"),
    (2, "2024-01-01 23:59:59.7", "b"),
    (3, "2024-01-02 23:59:59.9", "c"),
    (4, "2024-01-02 05:00:00", "d"),
    (5, "2024-01-03 01:00:00", "e"),
]
DAY1 = ChunkWindow("ts", "timestamp", "2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z")
DAY3 = ChunkWindow("ts", "timestamp", "2024-01-03T00:00:00Z", "2024-01-04T00:00:00Z")


@dataclass
class Side:
    """One table in one database: its DSN, its reference, and a way to run SQL on it."""

    kind: str
    dsn: str
    table: TableRef
    rows: Callable[[str], list[tuple[object, ...]]]
    run: Callable[[str], None]

    def count(self) -> int:
        return int(self.rows(f"SELECT count(*) FROM {self.qualified}")[0][0])

    @property
    def qualified(self) -> str:
        q = '"' if self.kind == "postgres" else "`"
        return f"{q}{self.table.schema}{q}.{q}{self.table.name}{q}"


def _pg_side(pg: Pg, schema: str, name: str, ts_type: str) -> Side:
    pg.run(
        f'CREATE TABLE "{schema}"."{name}" (id int PRIMARY KEY, ts {ts_type} NOT NULL, note text)'
    )
    pg.run(f'CREATE INDEX ON "{schema}"."{name}" (ts)')
    return Side("postgres", pg.dsn, TableRef(schema, name), pg.rows, pg.run)


def _my_side(my: My, db: str, name: str, ts_type: str) -> Side:
    my.run(f"CREATE TABLE `{db}`.`{name}` (id int PRIMARY KEY, ts {ts_type} NOT NULL, note text)")
    return Side("mysql", my.dsn(db), TableRef(db, name), my.rows, my.run)


@pytest.fixture
def my(mysql_dsn: str) -> Iterator[My]:
    helper = My(mysql_dsn)
    try:
        yield helper
    finally:
        helper.close()


@pytest.fixture
def sides(pg: Pg, my: My) -> Iterator[Callable[[str, str, bool], tuple[Side, Side]]]:
    """``make(source_kind, target_kind, narrow)``: a filled source and an empty target whose ts
    column keeps fractions (narrow False) or not (narrow True)."""
    schema = pg.schema()
    db = my.database()

    def make(src: str, dst: str, narrow: bool = True) -> tuple[Side, Side]:
        if src == "postgres":
            source = _pg_side(pg, schema, "src", "timestamp(6)")
        else:
            source = _my_side(my, db, "src", "datetime(6)")
        for row in ROWS:
            source.run(f"INSERT INTO {source.qualified} VALUES ({row[0]}, '{row[1]}', '{row[2]}')")
        if dst == "postgres":
            target = _pg_side(pg, schema, "dst", "timestamp(0)" if narrow else "timestamp(6)")
        else:
            target = _my_side(my, db, "dst", "datetime" if narrow else "datetime(6)")
        return source, target

    yield make


def _write(
    source: Side,
    target: Side,
    window: ChunkWindow,
    level: ReadBack = "checksum",
    mode: InnerMode = "replace",
    keys: tuple[str, ...] = (),
    source_dsn: str | None = None,
    accept: tuple[str, ...] = (),
):  # type: ignore[no-untyped-def]
    spec = SinkSpec("dst", target.table, mode, keys)
    options = SinkOptions(read_back=level, accept_narrowing=accept)
    with (
        open_source(SourceSpec("src", table=source.table), source_dsn or source.dsn) as src,
        open_sink(spec, target.dsn, options) as sink,
    ):
        return sink.write_chunk(src, window)


PAIRS = [
    ("postgres", "postgres"),
    ("postgres", "mysql"),
    ("mysql", "postgres"),
    ("mysql", "mysql"),
]


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_rounding_across_chunks_fails_the_chunk_and_commits_nothing(
    sides: Callable[[str, str, bool], tuple[Side, Side]], src: str, dst: str
) -> None:
    source, target = sides(src, dst, True)
    with pytest.raises(DponeError) as caught:
        _write(source, target, DAY1)
    err = caught.value
    assert err.code == errors.READ_BACK_MISMATCH
    assert not errors.REGISTRY[err.code].retryable
    assert "ts [2024-01-01T00:00:00Z, 2024-01-02T00:00:00Z)" in err.message
    if dst == "postgres":  # 23:59:59.7 rounded into the next day: the range lost a row
        assert "the source has 2 row(s), the target holds 1" in err.message
    else:  # MariaDB truncates the fraction: the row stays, its value changed
        assert "same count (2 row(s)), different content" in err.message
    assert "23:59:59" not in err.message and "'b'" not in err.message  # no row values
    assert target.count() == 0  # nothing of the chunk was committed


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_an_equal_chunk_commits_with_both_checksums(
    sides: Callable[[str, str, bool], tuple[Side, Side]], src: str, dst: str
) -> None:
    source, target = sides(src, dst, False)
    written = _write(source, target, DAY1)
    assert written.rows == 2 and target.count() == 2
    assert written.checksum is not None and written.source_checksum == written.checksum
    # a chunk whose values survive the narrowing passes even with the narrow column
    narrow_source, narrow_target = source, target
    narrow_target.run(f"DELETE FROM {narrow_target.qualified}")
    assert _write(narrow_source, narrow_target, DAY3).rows == 1


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_levels_count_and_off(
    sides: Callable[[str, str, bool], tuple[Side, Side]], src: str, dst: str
) -> None:
    """count proves the row count only; off proves nothing (and commits what the sink kept)."""
    source, target = sides(src, dst, True)
    if dst == "postgres":
        with pytest.raises(DponeError) as caught:
            _write(source, target, DAY1, "count")
        assert caught.value.code == errors.READ_BACK_MISMATCH
        assert "read_back count" in caught.value.message
        assert target.count() == 0
    else:  # the truncated row is still in the range: a count cannot see it
        written = _write(source, target, DAY1, "count")
        assert written.rows == 2 and written.source_checksum is None
        target.run(f"DELETE FROM {target.qualified}")
    written = _write(source, target, DAY1, "off")
    assert written.rows == 2 and written.source_checksum is None
    # both rows are in the target; a Postgres target rounded one out of the chunk's range
    in_range = 1 if dst == "postgres" else 2
    assert checksum_rows(written.checksum or "") == in_range and target.count() == 2


def test_same_database_paths_are_gated_too(
    sides: Callable[[str, str, bool], tuple[Side, Side]], pg: Pg
) -> None:
    """INSERT .. SELECT (one DSN) and the binary COPY pipe (another DSN string, same types but a
    narrower typmod) both fail the chunk."""
    source, target = sides("postgres", "postgres", True)
    for dsn in (pg.dsn, pg.alt_dsn):
        with pytest.raises(DponeError) as caught:
            _write(source, target, DAY1, source_dsn=dsn)
        assert caught.value.code == errors.READ_BACK_MISMATCH
        assert target.count() == 0


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_merge_reads_back_the_target_rows_of_the_chunks_keys(
    sides: Callable[[str, str, bool], tuple[Side, Side]], src: str, dst: str
) -> None:
    source, target = sides(src, dst, False)
    # rows of other keys in the target are not the chunk's: they never fail the gate
    target.run(f"INSERT INTO {target.qualified} VALUES (90, '2024-01-01 12:00:00', 'other')")
    # a key the chunk carries, with an older value: the upsert replaces it
    target.run(f"INSERT INTO {target.qualified} VALUES (2, '2024-01-01 01:00:00', 'old')")
    written = _write(source, target, DAY1, mode="merge", keys=("id",))
    assert written.source_checksum == written.checksum
    assert checksum_rows(written.checksum or "") == 2
    assert target.count() == 3


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_merge_into_a_narrow_column_fails(
    sides: Callable[[str, str, bool], tuple[Side, Side]], src: str, dst: str
) -> None:
    source, target = sides(src, dst, True)
    target.run(f"INSERT INTO {target.qualified} VALUES (90, '2024-01-01 12:00:00', 'other')")
    with pytest.raises(DponeError) as caught:
        _write(source, target, DAY1, mode="merge", keys=("id",))
    assert caught.value.code == errors.READ_BACK_MISMATCH
    # merge compares the rows of the chunk's keys: same count, content rounded or truncated
    assert "same count (2 row(s)), different content" in caught.value.message
    assert target.count() == 1  # only the row that was there before
    # a count cannot see a changed value: the chunk's keys hold two rows, as in the source
    written = _write(source, target, DAY1, "count", mode="merge", keys=("id",))
    assert written.rows == 2 and target.count() == 3


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_append_compares_the_rows_it_added(
    sides: Callable[[str, str, bool], tuple[Side, Side]], src: str, dst: str
) -> None:
    source, target = sides(src, dst, True)
    target.run(f"INSERT INTO {target.qualified} VALUES (90, '2024-01-01 12:00:00', 'other')")
    with pytest.raises(DponeError) as caught:
        _write(source, target, DAY1, mode="append")
    assert caught.value.code == errors.READ_BACK_MISMATCH
    assert "the rows this write added" in caught.value.message
    assert target.count() == 1
    written = _write(source, target, DAY3, mode="append")  # whole seconds survive
    assert written.source_checksum == written.checksum and target.count() == 2


def _rewrite_note_on_insert(target: Side) -> None:
    """A BEFORE INSERT trigger on the target that changes every row's note as it lands."""
    if target.kind == "postgres":
        schema = target.table.schema
        target.run(
            f'CREATE FUNCTION "{schema}".bang() RETURNS trigger LANGUAGE plpgsql AS '
            "$$ BEGIN NEW.note := NEW.note || '!'; RETURN NEW; END $$"
        )
        target.run(
            f"CREATE TRIGGER bang BEFORE INSERT ON {target.qualified} "
            f'FOR EACH ROW EXECUTE FUNCTION "{schema}".bang()'
        )
    else:
        target.run(
            f"CREATE TRIGGER `{target.table.schema}`.`bang` BEFORE INSERT ON {target.qualified} "
            "FOR EACH ROW SET NEW.note = CONCAT(NEW.note, '!')"
        )


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_append_reads_back_what_the_target_holds_after_its_triggers(
    sides: Callable[[str, str, bool], tuple[Side, Side]], src: str, dst: str
) -> None:
    # Regression: append read its stage back, which no target trigger touches, and passed
    source, target = sides(src, dst, False)
    target.run(f"INSERT INTO {target.qualified} VALUES (90, '2024-01-01 12:00:00', 'other')")
    _rewrite_note_on_insert(target)
    with pytest.raises(DponeError) as caught:
        _write(source, target, DAY1, mode="append")
    assert caught.value.code == errors.READ_BACK_MISMATCH
    assert "same count (2 row(s)), different content" in caught.value.message
    assert target.count() == 1  # rolled back: only the row that was there before
    # the rows already in the range are not the chunk's: without the trigger it commits
    if dst == "postgres":
        target.run(f"DROP TRIGGER bang ON {target.qualified}")
    else:
        target.run(f"DROP TRIGGER `{target.table.schema}`.`bang`")
    written = _write(source, target, DAY1, mode="append")
    assert (
        written.source_checksum == written.checksum and checksum_rows(written.checksum or "") == 2
    )
    assert target.count() == 3


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_an_accepted_narrowing_still_cannot_move_a_row_out_of_its_chunk(
    sides: Callable[[str, str, bool], tuple[Side, Side]], src: str, dst: str
) -> None:
    """With ts in accept_narrowing its values are left out of the content hash, never the
    range's row count: a Postgres target that rounds a row into the next day still fails the
    chunk; a MariaDB target that truncates it inside the day commits (what was accepted)."""
    source, target = sides(src, dst, True)
    if dst == "postgres":
        with pytest.raises(DponeError) as caught:
            _write(source, target, DAY1, accept=("ts",))
        assert caught.value.code == errors.READ_BACK_MISMATCH
        assert "the source has 2 row(s), the target holds 1" in caught.value.message
        assert target.count() == 0
    else:
        written = _write(source, target, DAY1, accept=("ts",))
        assert written.rows == 2 and written.source_checksum == written.checksum
        assert target.count() == 2
    # the columns not accepted are still compared by content
    target.run(f"DELETE FROM {target.qualified}")
    with pytest.raises(DponeError) as other:
        _write(source, target, DAY1, accept=("note",))
    assert other.value.code == errors.READ_BACK_MISMATCH
    # every moved column accepted: the gate compares the row count only
    if dst == "mysql":
        assert _write(source, target, DAY1, accept=("id", "ts", "note")).rows == 2


@pytest.mark.parametrize("after", ["update", "delete"])
@pytest.mark.parametrize("src", ["postgres", "mysql"])
def test_append_reads_back_what_the_target_holds_after_its_after_triggers(
    sides: Callable[[str, str, bool], tuple[Side, Side]], src: str, after: str
) -> None:
    """An AFTER INSERT trigger that rewrites or removes the row it follows: RETURNING shows the
    row before it runs, so the read-back reads the inserted row versions once it has."""
    source, target = sides(src, "postgres", False)
    schema = target.table.schema
    act = (
        f"UPDATE {target.qualified} SET note = note || '!' WHERE id = NEW.id"
        if after == "update"
        else f"DELETE FROM {target.qualified} WHERE id = NEW.id"
    )
    target.run(
        f'CREATE FUNCTION "{schema}".later() RETURNS trigger LANGUAGE plpgsql AS '
        f"$$ BEGIN {act}; RETURN NULL; END $$"
    )
    target.run(
        f"CREATE TRIGGER later AFTER INSERT ON {target.qualified} "
        f'FOR EACH ROW EXECUTE FUNCTION "{schema}".later()'
    )
    with pytest.raises(DponeError) as caught:
        _write(source, target, DAY1, mode="append")
    assert caught.value.code == errors.READ_BACK_MISMATCH, caught.value.message
    assert target.count() == 0  # rolled back
    target.run(f"DROP TRIGGER later ON {target.qualified}")
    written = _write(source, target, DAY1, mode="append")
    assert written.source_checksum == written.checksum and target.count() == 2
