"""MySQL/MariaDB sinks are strict on every write path: a value the target column would change
(rounded decimal places, text too long, an integer out of range) fails the chunk and rolls it back
on LOAD DATA, batched inserts (a table with a BLOB column, or a server refusing LOAD DATA LOCAL)
and INSERT .. SELECT alike, so the outcome never depends on which columns the table has. Real
MariaDB (the ``mysql_dsn`` fixture)."""

from __future__ import annotations

import decimal
from collections.abc import Iterator
from typing import Any

import pytest
from dpone import errors
from dpone.connectors import ChunkWindow, SinkSpec, SourceSpec, TableRef, open_sink, open_source
from dpone.errors import DponeError

from .mysql_support import My

WINDOW = ChunkWindow("id", "integer", 1, 4)
#: (source column type, target column type, a source value the target cannot keep)
BAD = {
    "decimal-scale": ("decimal(20,6)", "decimal(20,2)", decimal.Decimal("1.123456")),
    "text-length": ("varchar(20)", "varchar(5)", "abcdefgh"),
    "trailing-spaces": ("varchar(20)", "varchar(5)", "abc      "),
    "integer-range": ("int", "tinyint", 1000),
}
PATHS = ("load-data", "executemany-blob", "executemany-no-local-infile", "insert-select")


@pytest.fixture
def my(mysql_dsn: str) -> Iterator[My]:
    helper = My(mysql_dsn)
    try:
        yield helper
    finally:
        helper.close()


def _tables(my: My, db: str, source_type: str, target_type: str, blob: bool, value: Any) -> None:
    extra = ", data blob" if blob else ""
    my.run(f"CREATE TABLE `{db}`.src (id int PRIMARY KEY, v {source_type}{extra})")
    my.run(f"CREATE TABLE `{db}`.dst (id int PRIMARY KEY, v {target_type}{extra})")
    cols = "id, v, data" if blob else "id, v"
    marks = "%s, %s, %s" if blob else "%s, %s"
    rows = [(i, value, b"\x00\xff") if blob else (i, value) for i in (1, 2, 3)]
    my.many(f"INSERT INTO `{db}`.src ({cols}) VALUES ({marks})", rows)
    my.run(f"INSERT INTO `{db}`.dst (id) VALUES (99)")  # a row the failed chunk must keep


def _write(my: My, db: str, path: str, mode: str) -> Any:
    same = my.dsn(db)
    other = same + "?connect_timeout=7"  # another DSN string: the rows leave the server
    src = open_source(
        SourceSpec("src", TableRef(None, "src")), same if path == "insert-select" else other
    )
    keys = ("id",) if mode == "merge" else ()
    dst = open_sink(SinkSpec("dst", TableRef(None, "dst"), mode, keys), same)  # type: ignore[arg-type]
    with src, dst:
        if path == "executemany-no-local-infile":
            dst.db.local_infile = False
        return dst.write_chunk(src, WINDOW)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("mode", ["replace", "merge", "append"])
def test_a_value_the_target_would_change_fails_the_chunk_on_every_path(
    my: My, path: str, case: str, mode: str
) -> None:
    db = my.database()
    source_type, target_type, value = BAD[case]
    _tables(my, db, source_type, target_type, path == "executemany-blob", value)
    with pytest.raises(DponeError) as caught:
        _write(my, db, path, mode)
    assert caught.value.code == errors.SINK_FAILED, caught.value.message
    assert "rolled back" in caught.value.message
    assert str(value).strip() not in caught.value.message  # no row value in the message
    assert my.rows(f"SELECT id, v FROM `{db}`.dst") == [(99, None)]


@pytest.mark.parametrize("path", PATHS)
def test_values_that_fit_are_written_on_every_path(my: My, path: str) -> None:
    db = my.database()
    _tables(
        my,
        db,
        "decimal(20,2)",
        "decimal(30,6)",
        path == "executemany-blob",
        decimal.Decimal("1.25"),
    )
    written = _write(my, db, path, "replace")
    # a batch holding bytes is inserted, not loaded, but the chunk reports the path it chose
    expected = {"executemany-no-local-infile": "executemany", "insert-select": "insert-select"}
    assert written.rows == 3 and written.method == expected.get(path, "load-data")
    got = my.rows(f"SELECT id, v FROM `{db}`.dst ORDER BY id")
    assert got == [(i, decimal.Decimal("1.250000")) for i in (1, 2, 3)] + [(99, None)]
