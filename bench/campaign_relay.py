"""A campaign's data path with no dpone code: each chunk relayed from the source's COPY TO into
the target's COPY FROM, one target transaction per chunk (DELETE of the range, COPY, checksum,
COMMIT).

The relay estimates of campaign_floors.py are built from it. It imports psycopg and nothing of
dpone, so an estimate pays for none of dpone's code: run as a script it is one mapped item of the
summary's estimate (a fresh interpreter, as every item is), given its job as JSON on stdin (not on
argv, where another user's ``ps`` would see the DSNs):

    echo '{"src": ..., "dst": ..., "statements": {...}, "days": [...]}' | python bench/campaign_relay.py
"""

from __future__ import annotations

import json
import selectors
import sys
from collections.abc import Iterator, Sequence

import psycopg
from psycopg import pq
from psycopg.copy import QueuedLibpqWriter

BLOCK_BYTES = 1 << 20
Day = tuple[str, str]


def copy_out_blocks(conn: psycopg.Connection) -> Iterator[bytearray]:
    """The COPY TO in flight on ``conn`` in blocks of about 1 MB: one libpq call per row and
    nothing else per row (the cheapest relay psycopg allows; dpone's raw_copy_blocks does the
    same)."""
    pgconn = conn.pgconn
    get_copy_data = pgconn.get_copy_data
    with selectors.DefaultSelector() as selector:
        selector.register(pgconn.socket, selectors.EVENT_READ)
        buf, size = bytearray(), 0
        while True:
            nbytes, data = get_copy_data(1)
            if nbytes > 0:
                buf += data
                size += nbytes
                if size >= BLOCK_BYTES:
                    yield buf
                    buf, size = bytearray(), 0
            elif nbytes == 0:
                selector.select()
                pgconn.consume_input()
            else:
                break
        if buf:
            yield buf
        while True:
            while pgconn.is_busy():
                selector.select()
                pgconn.consume_input()
            result = pgconn.get_result()
            if result is None:
                break
            if result.status != pq.ExecStatus.COMMAND_OK:
                raise SystemExit("relay: the source's COPY TO failed")


def read_day(src: psycopg.Connection, statements: dict[str, str], day: Day) -> list[bytearray]:
    """One chunk's COPY data from the source, whole, in memory."""
    with src.cursor() as cur, cur.copy(statements["copy_out"], day):
        return list(copy_out_blocks(src))


def write_day(
    cur: psycopg.Cursor, statements: dict[str, str], day: Day, blocks: Iterator[bytearray]
) -> None:
    """The target's part of one chunk, inside the caller's transaction. The blocks go to libpq
    from a writer thread (as dpone's do), so reading the next block overlaps sending this one."""
    cur.execute(statements["delete"], day)
    with cur.copy(statements["copy_in"], writer=QueuedLibpqWriter(cur)) as copy:
        for block in blocks:
            copy.write(block)
    cur.execute(statements["checksum"], day)
    cur.fetchone()


def relay(src_dsn: str, dst_dsn: str, statements: dict[str, str], days: Sequence[Day]) -> None:
    """Every day read from the source while it is written to the target, one commit each."""
    with psycopg.connect(src_dsn, autocommit=True) as src, psycopg.connect(dst_dsn) as dst:
        for day in days:
            with dst.transaction(), dst.cursor() as cur, src.cursor() as out:
                with out.copy(statements["copy_out"], day):
                    write_day(cur, statements, day, copy_out_blocks(src))


def main() -> int:
    job = json.load(sys.stdin)
    relay(job["src"], job["dst"], job["statements"], [tuple(day) for day in job["days"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
