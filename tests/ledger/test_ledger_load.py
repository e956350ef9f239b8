"""Loading a campaign: its reads in one transaction, pipelined on Postgres.

Every pod loads its campaign, a no-op item included. On Postgres the head (with the database
clock), the chunk rows, each chunk's latest transition and the committed marks are sent as one
pipeline, their results read after one sync, where reading them one statement after another
waited for each in turn. What is read must be exactly what the statements read in
turn (the MSSQL store's way), for a campaign with running, failed, committed and untouched
chunks; a campaign that does not exist loads as none; the chunk rows are read once per plan.
"""

from __future__ import annotations

from typing import Any

import pytest
from dpone.ledger.port import ChunkResult, LeaseStatus
from dpone.ledger.postgres import PostgresLedger
from dpone.ledger.sql import TxMode, state_in_turn
from ledger_backends import make_shape

pytestmark = pytest.mark.postgres


def _campaign(store: PostgresLedger) -> Any:
    """A campaign whose first chunks are committed (two), failed, running, then new."""
    shape = make_shape()
    store.initialize(shape, "a", 5)
    for index, committed in ((0, True), (1, True), (2, False), (3, None)):
        chunk = shape.chunks[index]
        outcome = store.acquire_lease(shape, chunk, "w", 60)
        assert outcome.status is LeaseStatus.ACQUIRED and outcome.lease is not None
        if committed is not None:
            result = ChunkResult(committed=committed, rows=index, checksum=f"c{index}")
            if not committed:
                result = ChunkResult(committed=False, error_code="E", error_message="boom")
            store.complete(outcome.lease, chunk, result)
    return shape


def test_a_load_is_one_pipelined_read_and_reads_what_the_statements_read_in_turn(
    pg_dsn: str, pg_schema: str, sent: list[tuple[str, bool]]
) -> None:
    store = PostgresLedger(pg_dsn, pg_schema)
    try:
        shape = _campaign(store)
        fresh = PostgresLedger(pg_dsn, pg_schema)  # no chunk rows verified yet, as in a new pod
        try:
            sent.clear()
            ledger = fresh.load(shape.run_key)
            assert len(sent) == 4 and all(piped for _, piped in sent), sent
            assert ledger is not None
            assert [ledger.state_of(c.index) for c in shape.chunks[:5]] == [
                "committed",
                "committed",
                "failed",
                "running",
                "pending",
            ]
            with fresh._transaction("load", TxMode.READ) as tx:
                piped = tx.load_state(shape.run_key, with_shape=True)
            with fresh._transaction("load", TxMode.READ) as tx:
                in_turn = state_in_turn(tx, shape.run_key, with_shape=True)
            assert piped.head == in_turn.head and piped.shape_rows == in_turn.shape_rows
            assert piped.latest == in_turn.latest and piped.marks == in_turn.marks == {
                c.index for c in shape.chunks[:2]
            }
            assert piped.now is not None and in_turn.now is not None
            sent.clear()
            again = fresh.load(shape.run_key)  # the rows are verified: not read again
            assert again is not None and len(sent) == 3 and all(piped for _, piped in sent)
            assert not any(".campaign_chunk" in statement for statement, _ in sent), sent
            with fresh._transaction("load", TxMode.READ) as tx:
                assert tx.load_state(shape.run_key, with_shape=False).shape_rows is None
        finally:
            fresh.close()
    finally:
        store.close()


def test_a_campaign_that_does_not_exist_loads_as_none(pg_dsn: str, pg_schema: str) -> None:
    store = PostgresLedger(pg_dsn, pg_schema)
    try:
        assert store.load("no-such-run-key") is None
        with store._transaction("load", TxMode.READ) as tx:
            assert tx.load_state("no-such-run-key", with_shape=True).head is None
    finally:
        store.close()
