"""The Postgres ledger: append-only chunk transitions under transaction-level advisory locks.

Only transaction-scoped locks are used (``pg_advisory_xact_lock``), so PgBouncer transaction pooling
is safe and a crashed process can never leave a lock behind. A lease or a completion is one
function call in a short transaction (BEGIN; lease_append(...) or close_append(...); COMMIT): the
function takes the chunk lock with a bounded wait, reads the chunk and appends conditionally.
Times come from the server's ``clock_timestamp()``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Unpack

from dpone import errors
from dpone.credentials.connections import current_dsn
from dpone.credentials.dsn_settings import (
    invalid_setting,
    missing_file,
    postgres_connect_problem,
    postgres_connect_reason,
    postgres_missing_file,
    postgres_parse_problem,
)
from dpone.credentials.postgres_errors import describe_postgres_error
from dpone.errors import DponeError
from dpone.ledger.port import (
    Amendment,
    CampaignShape,
    ChunkResult,
    ChunkState,
    Lease,
    Ledger,
    Restatement,
)
from dpone.ledger.sql import (
    AMENDMENTS,
    CAMPAIGNS,
    DEFAULT_SCHEMA,
    INSERT_TRANSITION_COLUMNS,
    RESTATEMENTS,
    SCHEMA_VERSION,
    TRANSITIONS,
    Appended,
    CampaignCheck,
    CampaignHead,
    ChunkLockTimeout,
    ChunkView,
    NewTransition,
    ScopedState,
    ShapeRow,
    SqlLedger,
    SqlStoreOptions,
    StoredState,
    StoredTransition,
    TxMode,
    WriteFailed,
    campaign_lock_key,
    chunk_lock_class,
    first_line,
    rows_as_shape,
    schema_lock_key,
    scoped_ledger,
    stored_text,
    transition_params,
    utc,
    view_from_row,
)
from dpone.lifecycle.session_limits import TEXT_FORM_SETTINGS, mark_text_forms, session_limits
from dpone.plan.chunks import Chunk

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
except ImportError as missing:  # pragma: no cover - exercised by the factory guard test
    raise DponeError(
        errors.LEDGER_UNAVAILABLE,
        f"the Postgres ledger needs psycopg ({missing}): install the dpone-runtime wheel "
        "with its [postgres] extra, by path (docs/deploy-kubernetes.md)",
    ) from missing

CONNECTION_DEFAULTS = {"connect_timeout": "10"}
"""Applied unless the DSN sets them, with the client keepalives of dpone.lifecycle.session_limits: a lost
node is noticed in about a minute, not two hours."""

# SQLSTATE classes that mean the session is gone (connection exception, admin shutdown).
CONNECTION_LOST_STATES = ("08", "57P01", "57P02", "57P03", "25P03")
#: the states a connection is left in by a command the server never answered
_UNUSABLE = (psycopg.pq.TransactionStatus.ACTIVE, psycopg.pq.TransactionStatus.UNKNOWN)
#: the tries of chunks_held_elsewhere: at once, then after each pause (a committing session's
#: locks are all gone within microseconds; a run's transaction holds them for its whole chunk)
_RELEASE_PAUSES_S = (0.0, 0.02, 0.1)


def refused_at_commit(exc: psycopg.Error) -> DponeError:
    """A COMMIT that refused the rows of a chunk sharing the ledger's transaction: the sink's
    failure (its class, SQLSTATE and object names only: the message may quote row values)."""
    return DponeError(
        errors.SINK_FAILED,
        "the target refused the chunk's rows at the commit they share with their ledger record "
        f"(rolled back): {describe_postgres_error(exc)}",
    )


def _audit_log(s: str, table: str, columns: str) -> str:
    """The CREATE TABLE of an append-only audit table: an identity ``seq`` (audit order only)
    and the campaign's ``run_key`` lead every one, then ``columns``."""
    return (
        f"CREATE TABLE IF NOT EXISTS {s}.{table} (\n"
        "            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,\n"
        f"            run_key text NOT NULL,{columns}"
    )


def ddl_v1(s: str) -> list[str]:
    """Version 1 of the audit schema (idempotent statements; run under the DDL advisory lock)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {s}.schema_version (
            version integer PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT clock_timestamp())""",
        _audit_log(
            s,
            "campaign",
            """
            workload text NOT NULL,
            process text NOT NULL,
            plan_hash text NOT NULL,
            config_hash text NOT NULL,
            chunk_count integer NOT NULL CHECK (chunk_count > 0),
            cancelled boolean NOT NULL DEFAULT false,
            cancel_reason text,
            created_by text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp())""",
        ),
        f"CREATE INDEX IF NOT EXISTS campaign_run_key_seq ON {s}.campaign (run_key, seq DESC)",
        f"""CREATE TABLE IF NOT EXISTS {s}.campaign_chunk (
            run_key text NOT NULL,
            chunk_index integer NOT NULL,
            chunk_start text NOT NULL,
            chunk_end text NOT NULL,
            idempotency_key text NOT NULL,
            PRIMARY KEY (run_key, chunk_index))""",
        _audit_log(
            s,
            "chunk_transition",
            """
            chunk_index integer NOT NULL,
            transition integer NOT NULL,
            state text NOT NULL CHECK (state IN ('pending', 'running', 'committed', 'failed')),
            attempt integer NOT NULL,
            idempotency_key text NOT NULL,
            chunk_start text NOT NULL,
            chunk_end text NOT NULL,
            lease_owner text,
            lease_expires_at timestamptz,
            started_at timestamptz,
            rows_moved bigint,
            checksum text,
            error_code text,
            error_message text,
            recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            CONSTRAINT chunk_transition_fence UNIQUE (run_key, chunk_index, transition))""",
        ),
        *chunk_functions(s),
    ]


VIEW_ROW_TYPE = (
    "now timestamptz, cancelled boolean, cancel_reason text, sh_index integer, sh_start text, "
    "sh_end text, sh_key text, seq bigint, chunk_index integer, transition integer, state text, "
    "attempt integer, idempotency_key text, chunk_start text, chunk_end text, lease_owner text, "
    "lease_expires_at timestamptz, started_at timestamptz, rows_moved bigint, checksum text, "
    "error_code text, error_message text, recorded_at timestamptz, source_checksum text, "
    "new_transition integer, "
    "new_attempt integer, new_lease_expires_at timestamptz"
)
"""The row both chunk functions return: the chunk view (as view_from_row reads it) + what was
appended (NULLs when the condition did not hold)."""


def _chunk_view_sql(s: str) -> str:
    return (
        "SELECT clock_timestamp() AS now, c.cancelled, c.cancel_reason, "
        "sh.chunk_index AS sh_index, sh.chunk_start AS sh_start, sh.chunk_end AS sh_end, "
        "sh.idempotency_key AS sh_key, t.* "
        "FROM (SELECT 1 AS one) AS o "
        f"LEFT JOIN (SELECT cc.cancelled, cc.cancel_reason FROM {s}.campaign AS cc "
        "WHERE cc.run_key = p_run_key ORDER BY cc.seq DESC LIMIT 1) AS c ON true "
        f"LEFT JOIN {s}.campaign_chunk AS sh ON sh.run_key = p_run_key "
        "AND sh.chunk_index = p_chunk_index "
        f"LEFT JOIN (SELECT {TRANSITIONS.selected.replace(', ', ', tt.').replace('seq,', 'tt.seq,', 1)} "
        f"FROM {s}.chunk_transition AS tt WHERE tt.run_key = p_run_key "
        "AND tt.chunk_index = p_chunk_index ORDER BY tt.transition DESC LIMIT 1) AS t ON true"
    )


_SAME_CHUNK = (
    "v.sh_key = p_key AND v.sh_start = p_start AND v.sh_end = p_end AND v.cancelled IS NOT NULL"
)
_SAME_RECORD = (
    "v.idempotency_key = p_key AND v.chunk_start = p_start AND v.chunk_end = p_end "
    "AND v.attempt >= 1"
)
_LOCK = (
    "PERFORM set_config('lock_timeout', p_lock_timeout, true); "
    "PERFORM set_config('idle_in_transaction_session_timeout', p_idle_timeout, true); "
    "PERFORM pg_advisory_xact_lock(p_lock_class, p_chunk_index); "
)
_RETURNING = (
    "RETURNING chunk_transition.transition, chunk_transition.attempt, "
    "chunk_transition.lease_expires_at) "
    "SELECT v.*, ins.transition, ins.attempt, ins.lease_expires_at FROM v LEFT JOIN ins ON true"
)


def chunk_functions(s: str) -> list[str]:
    """lease_append and close_append: chunk lock, read and conditional append in one call.

    One statement per ledger transaction (plus BEGIN/COMMIT), like a SKIP LOCKED claim. Each
    statement inside a volatile PL/pgSQL function takes a fresh snapshot, so the read after the
    lock sees every transition committed before the lock was granted. The rules mirror
    dpone.ledger.sql (decide_lease, check_owner), which re-decides from the returned view and
    rolls back on any disagreement.
    """
    view = _chunk_view_sql(s)
    lease = (
        f"CREATE OR REPLACE FUNCTION {s}.lease_append(p_lock_class integer, p_run_key text, "
        "p_chunk_index integer, p_key text, p_start text, p_end text, p_owner text, "
        "p_lease_seconds double precision, p_lock_timeout text, p_idle_timeout text) "
        f"RETURNS TABLE ({VIEW_ROW_TYPE}) LANGUAGE plpgsql VOLATILE AS $fn$ "
        "#variable_conflict use_column\nBEGIN "
        f"{_LOCK}"
        f"RETURN QUERY WITH v AS ({view}), ins AS (INSERT INTO {s}.chunk_transition (run_key, "
        "chunk_index, transition, state, attempt, idempotency_key, chunk_start, chunk_end, "
        "lease_owner, lease_expires_at, started_at) "
        "SELECT p_run_key, p_chunk_index, coalesce(v.transition, 0) + 1, 'running', "
        "coalesce(v.attempt, 0) + 1, p_key, p_start, p_end, p_owner, "
        "v.now + make_interval(secs => p_lease_seconds), v.now FROM v "
        f"WHERE v.cancelled IS false AND {_SAME_CHUNK} AND (v.seq IS NULL OR ({_SAME_RECORD} AND "
        "(v.state IN ('failed', 'pending') OR (v.state = 'running' AND v.lease_owner IS NOT NULL "
        f"AND v.lease_expires_at <= v.now)))) {_RETURNING}; "
        "END $fn$"
    )
    close = (
        f"CREATE OR REPLACE FUNCTION {s}.close_append(p_lock_class integer, p_run_key text, "
        "p_chunk_index integer, p_key text, p_start text, p_end text, p_owner text, "
        "p_attempt integer, p_state text, p_rows bigint, p_checksum text, p_error_code text, "
        "p_error_message text, p_source_checksum text, p_lock_timeout text, p_idle_timeout text) "
        f"RETURNS TABLE ({VIEW_ROW_TYPE}) LANGUAGE plpgsql VOLATILE AS $fn$ "
        "#variable_conflict use_column\nBEGIN "
        f"{_LOCK}"
        f"RETURN QUERY WITH v AS ({view}), ins AS (INSERT INTO {s}.chunk_transition "
        f"({INSERT_TRANSITION_COLUMNS}) "
        "SELECT p_run_key, p_chunk_index, v.transition + 1, p_state, v.attempt, p_key, p_start, "
        "p_end, p_owner, NULL, v.started_at, p_rows, p_checksum, p_error_code, p_error_message, "
        "p_source_checksum "
        f"FROM v WHERE {_SAME_CHUNK} AND {_SAME_RECORD} AND v.state = 'running' AND "
        "v.lease_owner = p_owner AND v.attempt = p_attempt AND v.lease_expires_at IS NOT NULL "
        f"{_RETURNING}; "
        "END $fn$"
    )
    return [lease, close]


#: the transaction-local setting through which a group's lock statement tells its lease
#: statement how many of the group's chunks it locked
GROUP_LOCKED = "dpone.group_locked"


def group_lock_sql(wait_first: bool) -> str:
    """A set-based group's locks (ADR 0022), in chunk order, as one statement: the first chunk's
    lock with the bounded wait (or, ``wait_first`` False, only if free now, like the others),
    each later one only if free now, stopping at the first that is not; the count taken is
    returned and kept in GROUP_LOCKED for the lease statement sent right after it."""
    first = (
        "SELECT 1 FROM (SELECT pg_advisory_xact_lock(%(cls)s, (%(ix)b::integer[])[1]) FROM "
        "(SELECT set_config('lock_timeout', %(wait)s, true), "
        "set_config('idle_in_transaction_session_timeout', %(idle)s, true) OFFSET 0) AS t "
        "OFFSET 0) AS f"
        if wait_first
        else "SELECT 1 FROM (SELECT set_config('idle_in_transaction_session_timeout', "
        "%(idle)s, true) OFFSET 0) AS t "
        "WHERE pg_try_advisory_xact_lock(%(cls)s, (%(ix)b::integer[])[1])"
    )
    return (
        f"WITH RECURSIVE walk(pos) AS ({first} UNION ALL SELECT pos + 1 FROM walk "
        "WHERE pos < cardinality(%(ix)b::integer[]) "
        "AND pg_try_advisory_xact_lock(%(cls)s, (%(ix)b::integer[])[pos + 1])) "
        f"SELECT set_config('{GROUP_LOCKED}', coalesce(max(pos), 0)::text, true) FROM walk"
    )


def _set_view_sql(s: str, params: str) -> str:
    """Each chunk's view as _chunk_view_sql reads it, for the unnested arrays ``params`` (the
    columns p_chunk_index, p_key, p_start, p_end, ... and pos, its place in the group)."""
    transition = TRANSITIONS.selected.replace(", ", ", tt.").replace("seq,", "tt.seq,", 1)
    return (
        "SELECT c.*, clock_timestamp() AS now, cc.cancelled, cc.cancel_reason, "
        "sh.chunk_index AS sh_index, sh.chunk_start AS sh_start, sh.chunk_end AS sh_end, "
        f"sh.idempotency_key AS sh_key, t.* FROM {params} AS c "
        f"LEFT JOIN (SELECT cancelled, cancel_reason FROM {s}.campaign "
        "WHERE run_key = %(rk)s ORDER BY seq DESC LIMIT 1) AS cc ON true "
        f"LEFT JOIN {s}.campaign_chunk AS sh ON sh.run_key = %(rk)s "
        "AND sh.chunk_index = c.p_chunk_index "
        f"LEFT JOIN LATERAL (SELECT {transition} FROM {s}.chunk_transition AS tt "
        "WHERE tt.run_key = %(rk)s AND tt.chunk_index = c.p_chunk_index "
        "ORDER BY tt.transition DESC LIMIT 1) AS t ON true"
    )


def _set_rows(cte: str) -> str:
    """The rows of a set statement, as the chunk functions return them, in group order."""
    transition = ", ".join(f"v.{name}" for name in TRANSITIONS.selected.split(", "))
    return (
        "SELECT v.now, v.cancelled, v.cancel_reason, v.sh_index, v.sh_start, v.sh_end, "
        f"v.sh_key, {transition}, ins.transition, ins.attempt, ins.lease_expires_at "
        f"FROM {cte} AS v LEFT JOIN ins ON ins.chunk_index = v.p_chunk_index ORDER BY v.pos"
    )


def group_lease_sql(s: str) -> str:
    """A set-based group's lease statements as one (ADR 0022): for the chunks group_lock_sql
    locked, lease_append's condition and RUNNING record, chunk by chunk up to the first whose
    condition does not hold (that one's view ends the rows, nothing appended for it: refused,
    or its lease reused). The statement runs after the locks (a fresh snapshot), so it reads
    every transition committed before each lock was granted."""
    chunks = (
        "(SELECT * FROM unnest(%(ix)b::integer[], %(key)b::text[], %(st)b::text[], "
        "%(en)b::text[]) WITH ORDINALITY AS u(p_chunk_index, p_key, p_start, p_end, pos) "
        f"WHERE pos <= current_setting('{GROUP_LOCKED}')::integer)"
    )
    leasable = (
        f"coalesce(v.cancelled IS false AND {_SAME_CHUNK} AND (v.seq IS NULL OR ({_SAME_RECORD} "
        "AND (v.state IN ('failed', 'pending') OR (v.state = 'running' AND v.lease_owner IS "
        "NOT NULL AND v.lease_expires_at <= v.now)))), false)"
    )
    return (
        f"WITH v AS ({_set_view_sql(s, chunks)}), "
        f"d AS (SELECT v.*, {leasable} AS leasable FROM v), "
        "stop AS (SELECT coalesce(min(pos), 2147483647) AS at FROM d WHERE NOT d.leasable), "
        "upto AS (SELECT d.* FROM d, stop WHERE d.pos <= stop.at), "
        f"ins AS (INSERT INTO {s}.chunk_transition (run_key, chunk_index, transition, state, "
        "attempt, idempotency_key, chunk_start, chunk_end, lease_owner, lease_expires_at, "
        "started_at) SELECT %(rk)s, v.p_chunk_index, coalesce(v.transition, 0) + 1, 'running', "
        "coalesce(v.attempt, 0) + 1, v.p_key, v.p_start, v.p_end, %(owner)s, "
        "v.now + make_interval(secs => %(secs)s), v.now FROM upto AS v WHERE v.leasable "
        "RETURNING chunk_transition.chunk_index, chunk_transition.transition, "
        f"chunk_transition.attempt, chunk_transition.lease_expires_at) {_set_rows('upto')}"
    )


def group_close_sql(s: str) -> str:
    """A set-based group's completion statements as one (ADR 0022): for each chunk (its lock
    held since its lease), close_append's compare-and-set and COMMITTED or FAILED record."""
    chunks = (
        "(SELECT * FROM unnest(%(ix)b::integer[], %(key)b::text[], %(st)b::text[], %(en)b::text[], "
        "%(attempt)b::integer[], %(state)b::text[], %(rows)b::bigint[], %(checksum)b::text[], "
        "%(code)b::text[], %(message)b::text[], %(source)b::text[]) WITH ORDINALITY AS "
        "u(p_chunk_index, p_key, p_start, p_end, p_attempt, p_state, p_rows, p_checksum, "
        "p_error_code, p_error_message, p_source_checksum, pos))"
    )
    return (
        f"WITH v AS ({_set_view_sql(s, chunks)}), "
        f"ins AS (INSERT INTO {s}.chunk_transition ({INSERT_TRANSITION_COLUMNS}) "
        "SELECT %(rk)s, v.p_chunk_index, v.transition + 1, v.p_state, v.attempt, v.p_key, "
        "v.p_start, v.p_end, %(owner)s, NULL, v.started_at, v.p_rows, v.p_checksum, "
        "v.p_error_code, v.p_error_message, v.p_source_checksum "
        f"FROM v WHERE {_SAME_CHUNK} AND {_SAME_RECORD} AND v.state = 'running' AND "
        "v.lease_owner = %(owner)s AND v.attempt = v.p_attempt AND v.lease_expires_at IS NOT "
        "NULL RETURNING chunk_transition.chunk_index, chunk_transition.transition, "
        f"chunk_transition.attempt, chunk_transition.lease_expires_at) {_set_rows('v')}"
    )


def ddl_v2(s: str) -> list[str]:
    """Version 2: ``committed_chunk`` marks, written by a trigger in the COMMITTED transition's
    own transaction (no extra round trip), backfilled from the committed transitions."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {s}.committed_chunk (
            run_key text NOT NULL,
            chunk_index integer NOT NULL,
            committed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (run_key, chunk_index))""",
        f"CREATE OR REPLACE FUNCTION {s}.mark_committed() RETURNS trigger LANGUAGE plpgsql AS "
        f"$fn$ BEGIN INSERT INTO {s}.committed_chunk (run_key, chunk_index) "
        "VALUES (NEW.run_key, NEW.chunk_index) ON CONFLICT DO NOTHING; RETURN NULL; END $fn$",
        f"DROP TRIGGER IF EXISTS chunk_transition_committed ON {s}.chunk_transition",
        f"CREATE TRIGGER chunk_transition_committed AFTER INSERT ON {s}.chunk_transition "
        f"FOR EACH ROW WHEN (NEW.state = 'committed') EXECUTE FUNCTION {s}.mark_committed()",
        f"INSERT INTO {s}.committed_chunk (run_key, chunk_index) SELECT DISTINCT run_key, "
        f"chunk_index FROM {s}.chunk_transition WHERE state = 'committed' ON CONFLICT DO NOTHING",
    ]


def ddl_v3(s: str) -> list[str]:
    """Version 3: ``source_checksum`` on every transition (the read-back gate's source side);
    both chunk functions return and close_append writes it, so they are replaced."""
    return [
        f"ALTER TABLE {s}.chunk_transition ADD COLUMN IF NOT EXISTS source_checksum text",
        f"DROP FUNCTION IF EXISTS {s}.lease_append(integer, text, integer, text, text, text, "
        "text, double precision, text, text)",
        f"DROP FUNCTION IF EXISTS {s}.close_append(integer, text, integer, text, text, text, "
        "text, integer, text, bigint, text, text, text, text, text)",
        *chunk_functions(s),
    ]


def ddl_v4(s: str) -> list[str]:
    """Version 4 (additive): ``campaign_amendment``, one row per extension of a campaign, and
    ``chunk_restatement``, one row per committed chunk marked to be moved again."""
    return [
        _audit_log(
            s,
            "campaign_amendment",
            """
            old_plan_hash text NOT NULL,
            new_plan_hash text NOT NULL,
            old_chunk_count integer NOT NULL,
            new_chunk_count integer NOT NULL CHECK (new_chunk_count > old_chunk_count),
            amended_by text NOT NULL,
            amended_at timestamptz NOT NULL DEFAULT clock_timestamp())""",
        ),
        f"CREATE INDEX IF NOT EXISTS campaign_amendment_run_key ON {s}.campaign_amendment "
        "(run_key, seq)",
        _audit_log(
            s,
            "chunk_restatement",
            """
            chunk_index integer NOT NULL,
            transition integer NOT NULL,
            reason text NOT NULL,
            requested_by text NOT NULL,
            prior_rows bigint,
            prior_checksum text,
            requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            UNIQUE (run_key, chunk_index, transition))""",
        ),
    ]


MIGRATIONS = {1: ddl_v1, 2: ddl_v2, 3: ddl_v3, 4: ddl_v4}


class PostgresStatements:
    """Every statement of the adapter, composed once per schema (psycopg prepares them)."""

    def __init__(self, schema: str) -> None:
        s = '"' + schema + '"'
        self.schema = s
        # clock_timestamp() rides along: a load's "now" without a statement of its own
        self.campaign_head = f"SELECT {CAMPAIGNS.selected}, clock_timestamp() FROM {s}.campaign WHERE run_key = %s ORDER BY seq DESC LIMIT 1"
        self.insert_campaign = (
            f"INSERT INTO {s}.campaign ({CAMPAIGNS.inserted}) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        )
        self.copy_shape = (
            f"COPY {s}.campaign_chunk (run_key, chunk_index, chunk_start, chunk_end, idempotency_key) "
            "FROM STDIN"
        )
        self.shape_rows = (
            f"SELECT chunk_index, chunk_start, chunk_end, idempotency_key FROM {s}.campaign_chunk "
            "WHERE run_key = %s ORDER BY chunk_index"
        )
        self.chunk_view = (
            "SELECT clock_timestamp(), c.cancelled, c.cancel_reason, "
            "sh.chunk_index, sh.chunk_start, sh.chunk_end, sh.idempotency_key, t.* "
            "FROM (SELECT 1 AS one) AS o "
            f"LEFT JOIN (SELECT cancelled, cancel_reason FROM {s}.campaign WHERE run_key = %(rk)s "
            "ORDER BY seq DESC LIMIT 1) AS c ON true "
            f"LEFT JOIN {s}.campaign_chunk AS sh ON sh.run_key = %(rk)s AND sh.chunk_index = %(ix)s "
            f"LEFT JOIN (SELECT {TRANSITIONS.selected} FROM {s}.chunk_transition "
            "WHERE run_key = %(rk)s AND chunk_index = %(ix)s ORDER BY transition DESC LIMIT 1) AS t ON true"
        )
        self.lease_append = (
            f"SELECT * FROM {s}.lease_append(%s::integer, %s::text, %s::integer, %s::text, "
            "%s::text, %s::text, %s::text, %s::double precision, %s::text, %s::text)"
        )
        self.close_append = (
            f"SELECT * FROM {s}.close_append(%s::integer, %s::text, %s::integer, %s::text, "
            "%s::text, %s::text, %s::text, %s::integer, %s::text, %s::bigint, %s::text, %s::text, "
            "%s::text, %s::text, %s::text, %s::text)"
        )
        self.group_lock = {wait: group_lock_sql(wait) for wait in (True, False)}
        self.group_lease = group_lease_sql(s)
        self.group_close = group_close_sql(s)
        self.append_transition = (
            f"INSERT INTO {s}.chunk_transition ({INSERT_TRANSITION_COLUMNS}) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        )
        self.latest_transitions = (
            f"SELECT DISTINCT ON (chunk_index) {TRANSITIONS.selected} FROM {s}.chunk_transition "
            "WHERE run_key = %s ORDER BY chunk_index, transition DESC"
        )
        self.committed_marks = f"SELECT chunk_index FROM {s}.committed_chunk WHERE run_key = %s"
        self.latest_in_scope = (
            f"SELECT DISTINCT ON (chunk_index) {TRANSITIONS.selected} FROM {s}.chunk_transition "
            "WHERE run_key = %s AND chunk_index BETWEEN %s AND %s "
            "ORDER BY chunk_index, transition DESC"
        )
        # sql.CampaignCheck in one statement: the chunk rows' count and plan hash, the latest
        # records validate_transition would refuse (NULLs count as refused), the committed
        # marks merge_ledger would refuse, and the committed chunks
        self.campaign_check = (
            "WITH latest AS (SELECT DISTINCT ON (chunk_index) chunk_index, state, attempt, "
            "idempotency_key, chunk_start, chunk_end, lease_owner, lease_expires_at "
            f"FROM {s}.chunk_transition WHERE run_key = %(rk)s "
            "ORDER BY chunk_index, transition DESC), "
            "shape AS (SELECT chunk_index, chunk_start, chunk_end, idempotency_key "
            f"FROM {s}.campaign_chunk WHERE run_key = %(rk)s) "
            "SELECT (SELECT count(*) FROM shape), "
            "(SELECT 'sha256:' || encode(sha256(convert_to('[' || string_agg('{\"end\":' "
            '|| chunk_end || \',"idempotency_key":"\' || idempotency_key || \'","index":\' '
            "|| chunk_index::text || ',\"start\":' || chunk_start || '}', ',' "
            "ORDER BY chunk_index) || ']', 'UTF8')), 'hex') FROM shape), "
            "(SELECT count(*) FROM latest AS l LEFT JOIN shape AS sh USING (chunk_index) "
            "WHERE sh.chunk_index IS NULL "
            "OR l.idempotency_key IS DISTINCT FROM sh.idempotency_key "
            "OR l.chunk_start IS DISTINCT FROM sh.chunk_start "
            "OR l.chunk_end IS DISTINCT FROM sh.chunk_end "
            "OR l.state IS NULL OR l.state NOT IN ('pending', 'running', 'committed', 'failed') "
            "OR l.attempt IS NULL OR l.attempt < 1 "
            "OR (l.state = 'running' AND (l.lease_owner IS NULL OR l.lease_expires_at IS NULL))), "
            f"(SELECT count(*) FROM {s}.committed_chunk AS m LEFT JOIN latest AS l "
            "USING (chunk_index) WHERE m.run_key = %(rk)s "
            "AND l.state IS DISTINCT FROM 'committed'), "
            "(SELECT count(*) FROM latest WHERE state = 'committed')"
        )
        self.insert_amendment = (
            f"INSERT INTO {s}.campaign_amendment ({AMENDMENTS.inserted}) "
            "VALUES (%s, %s, %s, %s, %s, %s)"
        )
        self.amendments = (
            f"SELECT {AMENDMENTS.inserted}, amended_at FROM {s}.campaign_amendment "
            "WHERE run_key = %s ORDER BY seq"
        )
        self.insert_restatement = (
            f"INSERT INTO {s}.chunk_restatement ({RESTATEMENTS.inserted}) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)"
        )
        self.unmark_committed = (
            f"DELETE FROM {s}.committed_chunk WHERE run_key = %s AND chunk_index = %s"
        )
        self.restatements = (
            f"SELECT {RESTATEMENTS.inserted}, requested_at FROM {s}.chunk_restatement "
            "WHERE run_key = %s ORDER BY seq"
        )
        self.run_keys = f"SELECT DISTINCT run_key FROM {s}.campaign ORDER BY run_key"
        self.run_keys_of = (
            f"SELECT DISTINCT run_key FROM {s}.campaign WHERE workload = %s ORDER BY run_key"
        )
        self.version = f"SELECT max(version) FROM {s}.schema_version"
        self.record_version = (
            f"INSERT INTO {s}.schema_version (version) VALUES (%s) ON CONFLICT DO NOTHING"
        )


def connection_info(dsn: str, application_name: str) -> str:
    """The DSN's own parameters win; keepalives, a connect timeout and a name are defaults."""
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise DponeError(
            errors.CONFIG_INVALID,
            f"the ledger's Postgres DSN is malformed ({postgres_parse_problem(exc)})",
        ) from None
    missing = postgres_missing_file(given)
    if missing is not None:
        raise missing_file("the ledger database", missing)
    defaults = {**CONNECTION_DEFAULTS, **session_limits().libpq_client()}
    extra = {key: value for key, value in defaults.items() if key not in given}
    if "application_name" not in given:
        extra["application_name"] = application_name
    return make_conninfo(dsn, **extra)


def _closing_state(result: ChunkResult) -> str:
    return (ChunkState.COMMITTED if result.committed else ChunkState.FAILED).value


class PostgresTx:
    """One ledger transaction on the store's connection (see LedgerTx)."""

    def __init__(self, store: PostgresLedger, conn: psycopg.Connection[Any], mode: TxMode) -> None:
        self.store = store
        self.connection = conn
        self.mode = mode
        self.sql = store.statements
        self.lock_wanted: tuple[str, int] | None = None
        self.head_read_at: dt.datetime | None = None

    def _one(self, query: str, params: Any = None) -> tuple[Any, ...] | None:
        return self.connection.execute(query, params).fetchone()

    def lock_campaign(self, run_key: str, timeout_s: float) -> None:
        """Bounded FIFO wait via a transaction-local lock_timeout; 0 means try once."""
        key = campaign_lock_key(self.store.schema, run_key)
        if timeout_s <= 0:
            row = self._one("SELECT pg_try_advisory_xact_lock(%s)", (key,))
            if row is not None and row[0]:
                return
        else:
            try:
                # one round trip: the subquery (OFFSET 0 keeps it a subquery) sets the timeout
                # before the lock call that reads its row can wait
                self._one(
                    "SELECT pg_advisory_xact_lock(%s) FROM "
                    "(SELECT set_config('lock_timeout', %s, true) OFFSET 0) AS timeout",
                    (key, f"{max(1, int(timeout_s * 1000))}ms"),
                )
                return
            except pg_errors.LockNotAvailable:
                pass
        raise DponeError(
            errors.MAPPING_CAMPAIGN_BUSY,
            f"campaign {run_key!r}: the campaign lock was not free within {timeout_s:g}s",
        )

    def lock_chunk(self, run_key: str, chunk_index: int) -> None:
        """Deferred: lease_append / close_append lock inside their one call; a plain read takes
        the lock first (see _take_chunk_lock)."""
        self.lock_wanted = (run_key, chunk_index)

    def try_lock_chunk(self, run_key: str, chunk_index: int) -> bool:
        """Take the chunk lock only if it is free now: a coalesced group's next chunk (ADR 0022)
        never waits while the group holds the locks of the chunks before it."""
        row = self._one(
            "SELECT pg_try_advisory_xact_lock(%s, %s)",
            (chunk_lock_class(self.store.schema, run_key), chunk_index),
        )
        return bool(row is not None and row[0])

    def chunks_held_elsewhere(self, run_key: str, indexes: Sequence[int]) -> list[int]:
        """Take each chunk's lock if it is free now, ascending, in one statement; the indexes
        whose lock another session holds (in the one-commit placement, ADR 0021, a chunk being
        moved: its lock is the lease and its RUNNING record is not committed yet).

        A session that just committed releases its locks one at a time: a waiter woken by the
        first (the campaign lock) can find some of the others still held for a moment, so the
        held ones are tried again after short pauses before they are called held."""
        held = sorted(indexes)
        for pause in _RELEASE_PAUSES_S:
            if pause:
                time.sleep(pause)
            rows = self.connection.execute(
                "SELECT i FROM unnest(%s::integer[]) WITH ORDINALITY AS c(i, n) "
                "WHERE NOT pg_try_advisory_xact_lock(%s, i) ORDER BY n",
                (held, chunk_lock_class(self.store.schema, run_key)),
            ).fetchall()
            held = [int(row[0]) for row in rows]
            if not held:
                break
        return held

    def _take_chunk_lock(self) -> None:
        if self.lock_wanted is None:
            return
        run_key, chunk_index = self.lock_wanted
        self.lock_wanted = None
        wait_ms, idle_ms = self._timeouts()
        self.store.pending_chunk_lock = (run_key, chunk_index)
        self.connection.execute(  # one round trip, the timeouts set first (see lock_campaign)
            "SELECT pg_advisory_xact_lock(%s, %s) FROM (SELECT set_config('lock_timeout', %s, "
            "true), set_config('idle_in_transaction_session_timeout', %s, true) OFFSET 0) AS t",
            (chunk_lock_class(self.store.schema, run_key), chunk_index, wait_ms, idle_ms),
        )

    def campaign_head(self, run_key: str) -> CampaignHead | None:
        row = self._one(self.sql.campaign_head, (run_key,))
        if row is None:
            return None
        self.head_read_at = utc(row[-1])
        return CAMPAIGNS.decode(row)

    def insert_campaign(self, head: CampaignHead) -> None:
        self.connection.execute(self.sql.insert_campaign, CAMPAIGNS.params(head))

    def insert_shape(self, run_key: str, rows: Sequence[ShapeRow]) -> None:
        with self.connection.cursor().copy(self.sql.copy_shape) as copy:
            for row in rows:
                copy.write_row(
                    (run_key, row.chunk_index, row.chunk_start, row.chunk_end, row.idempotency_key)
                )

    def chunk_view(self, run_key: str, chunk_index: int) -> ChunkView:
        self._take_chunk_lock()
        row = self._one(self.sql.chunk_view, {"rk": run_key, "ix": chunk_index})
        self.store.pending_chunk_lock = None
        assert row is not None
        return view_from_row(row)

    def append_transition(self, run_key: str, record: NewTransition) -> None:
        self.connection.execute(self.sql.append_transition, transition_params(run_key, record))

    def _combined(self, query: str, params: Sequence[Any]) -> tuple[ChunkView, Appended | None]:
        self.lock_wanted = None  # the function takes the chunk lock itself
        row = self._one(query, params)
        self.store.pending_chunk_lock = None
        assert row is not None
        return self._decoded(row)

    def _lock_params(self, run_key: str, chunk: Chunk) -> list[Any]:
        shape = ShapeRow.of(chunk)
        self.store.pending_chunk_lock = (run_key, chunk.index)
        return [
            chunk_lock_class(self.store.schema, run_key),
            run_key,
            chunk.index,
            shape.idempotency_key,
            shape.chunk_start,
            shape.chunk_end,
        ]

    def _timeouts(self) -> list[str]:
        """Lock wait and idle-in-transaction limit; a WRITE transaction (the data moves inside
        it) is idle only between its statements, so the same limit frees a frozen writer."""
        idle = f"{max(1, int(self.store.idle_timeout_s * 1000))}ms"
        return [f"{max(1, int(self.store.chunk_lock_timeout_s * 1000))}ms", idle]

    def lease_append(
        self, run_key: str, chunk: Chunk, owner: str, lease_seconds: float
    ) -> tuple[ChunkView, Appended | None]:
        params = [
            *self._lock_params(run_key, chunk),
            owner,
            float(lease_seconds),
            *self._timeouts(),
        ]
        return self._combined(self.sql.lease_append, params)

    def close_append(
        self, run_key: str, chunk: Chunk, lease: Lease, result: ChunkResult
    ) -> tuple[ChunkView, Appended | None]:
        message = result.error_message
        params = [
            *self._lock_params(run_key, chunk),
            lease.owner,
            lease.attempt,
            _closing_state(result),
            result.rows,
            result.checksum,
            result.error_code,
            stored_text(message),
            result.source_checksum,
            *self._timeouts(),
        ]
        return self._combined(self.sql.close_append, params)

    def lease_set(
        self, run_key: str, chunks: Sequence[Chunk], owner: str, lease_seconds: float, wait: bool
    ) -> tuple[int, list[tuple[ChunkView, Appended | None]]]:
        """A set-based group's locks and lease statements in ONE round trip (a pipeline of
        group_lock_sql and group_lease_sql): how many chunks were locked, and the rows of the
        lease statement (see group_lease_sql)."""
        shapes = [ShapeRow.of(chunk) for chunk in chunks]
        wait_ms, idle_ms = self._timeouts()
        params = {
            "cls": chunk_lock_class(self.store.schema, run_key),
            "rk": run_key,
            "ix": [chunk.index for chunk in chunks],
            "key": [shape.idempotency_key for shape in shapes],
            "st": [shape.chunk_start for shape in shapes],
            "en": [shape.chunk_end for shape in shapes],
            "owner": owner,
            "secs": float(lease_seconds),
            "wait": wait_ms,
            "idle": idle_ms,
        }
        self.lock_wanted = None
        self.store.pending_chunk_lock = (run_key, chunks[0].index)
        with self.connection.pipeline():
            locking = self.connection.execute(self.sql.group_lock[wait], params)
            leasing = self.connection.execute(self.sql.group_lease, params)
        self.store.pending_chunk_lock = None
        counted = locking.fetchone()
        locked = int(counted[0]) if counted is not None else 0
        return locked, [self._decoded(row) for row in leasing.fetchall()]

    def close_set(
        self, run_key: str, closing: Sequence[tuple[Chunk, Lease, ChunkResult]]
    ) -> list[tuple[ChunkView, Appended | None]]:
        """A set-based group's completion statements in ONE round trip (group_close_sql): the
        chunks' locks are held since their lease, in this transaction."""
        shapes = [ShapeRow.of(chunk) for chunk, _, _ in closing]
        results = [result for _, _, result in closing]
        params = {
            "rk": run_key,
            "owner": closing[0][1].owner,
            "ix": [chunk.index for chunk, _, _ in closing],
            "key": [shape.idempotency_key for shape in shapes],
            "st": [shape.chunk_start for shape in shapes],
            "en": [shape.chunk_end for shape in shapes],
            "attempt": [lease.attempt for _, lease, _ in closing],
            "state": [_closing_state(result) for result in results],
            "rows": [result.rows for result in results],
            "checksum": [result.checksum for result in results],
            "code": [result.error_code for result in results],
            "message": [stored_text(result.error_message) for result in results],
            "source": [result.source_checksum for result in results],
        }
        rows = self.connection.execute(self.sql.group_close, params).fetchall()
        return [self._decoded(row) for row in rows]

    @staticmethod
    def _decoded(row: Sequence[Any]) -> tuple[ChunkView, Appended | None]:
        appended = None if row[24] is None else Appended(int(row[24]), int(row[25]), row[26])
        return view_from_row(row[:24]), appended

    def shape_rows(self, run_key: str) -> list[ShapeRow]:
        return rows_as_shape(self.connection.execute(self.sql.shape_rows, (run_key,)).fetchall())

    def latest_transitions(self, run_key: str) -> list[StoredTransition]:
        rows = self.connection.execute(self.sql.latest_transitions, (run_key,)).fetchall()
        return [TRANSITIONS.decode(row) for row in rows]

    def committed_marks(self, run_key: str) -> set[int]:
        rows = self.connection.execute(self.sql.committed_marks, (run_key,)).fetchall()
        return {int(row[0]) for row in rows}

    def load_state(self, run_key: str, with_shape: bool) -> StoredState:
        """A load's reads as one pipeline, their results read after one sync: the head with
        the clock, the chunk rows when asked for, the latest transitions, the committed marks."""
        conn = self.connection
        with conn.pipeline():
            head = conn.execute(self.sql.campaign_head, (run_key,))
            rows = conn.execute(self.sql.shape_rows, (run_key,)) if with_shape else None
            latest = conn.execute(self.sql.latest_transitions, (run_key,))
            marks = conn.execute(self.sql.committed_marks, (run_key,))
        found = head.fetchone()
        if found is None:
            return StoredState(None)
        return StoredState(
            CAMPAIGNS.decode(found),
            utc(found[-1]),
            None if rows is None else rows_as_shape(rows.fetchall()),
            [TRANSITIONS.decode(row) for row in latest.fetchall()],
            {int(row[0]) for row in marks.fetchall()},
        )

    def load_scoped(self, run_key: str, first: int, last: int) -> ScopedState:
        """A scoped load's reads as one pipeline: the head with the clock, the campaign's check
        in the database, the latest transitions of chunks ``first``..``last``."""
        conn = self.connection
        with conn.pipeline():
            head = conn.execute(self.sql.campaign_head, (run_key,))
            check = conn.execute(self.sql.campaign_check, {"rk": run_key})
            latest = conn.execute(self.sql.latest_in_scope, (run_key, first, last))
        found = head.fetchone()
        if found is None:
            return ScopedState(None)
        checked = check.fetchone()
        assert checked is not None
        chunk_rows, rows_plan_hash, bad_records, lost_marks, committed = checked
        return ScopedState(
            CAMPAIGNS.decode(found),
            utc(found[-1]),
            CampaignCheck(
                int(chunk_rows), rows_plan_hash, int(bad_records), int(lost_marks), int(committed)
            ),
            [TRANSITIONS.decode(row) for row in latest.fetchall()],
        )

    def insert_amendment(self, amendment: Amendment) -> None:
        self.connection.execute(self.sql.insert_amendment, AMENDMENTS.params(amendment))

    def amendments(self, run_key: str) -> list[Amendment]:
        rows = self.connection.execute(self.sql.amendments, (run_key,)).fetchall()
        return [AMENDMENTS.decode(row) for row in rows]

    def insert_restatement(self, restatement: Restatement) -> None:
        self.connection.execute(self.sql.insert_restatement, RESTATEMENTS.params(restatement))

    def unmark_committed(self, run_key: str, chunk_index: int) -> None:
        self.connection.execute(self.sql.unmark_committed, (run_key, chunk_index))

    def restatements(self, run_key: str) -> list[Restatement]:
        rows = self.connection.execute(self.sql.restatements, (run_key,)).fetchall()
        return [RESTATEMENTS.decode(row) for row in rows]

    def db_now(self) -> dt.datetime:
        """The database clock: the time the campaign head was just read, once (no round trip),
        else a fresh reading."""
        if self.head_read_at is not None:
            now, self.head_read_at = self.head_read_at, None
            return now
        row = self._one("SELECT clock_timestamp()")
        assert row is not None
        return utc(row[0])

    def run_keys(self, workload: str | None) -> list[str]:
        if workload is None:
            rows = self.connection.execute(self.sql.run_keys).fetchall()
        else:
            rows = self.connection.execute(self.sql.run_keys_of, (workload,)).fetchall()
        return [str(row[0]) for row in rows]


class PostgresLedger(SqlLedger):
    """The audit-schema ledger on Postgres (one connection per instance; not thread-safe)."""

    name = "postgres"

    def __init__(
        self,
        dsn: str,
        schema: str = DEFAULT_SCHEMA,
        lease_seconds: float = 300.0,
        *,
        idle_timeout_s: float | None = None,
        **options: Unpack[SqlStoreOptions],
    ) -> None:
        self._idle_timeout_option = idle_timeout_s
        self.pending_chunk_lock: tuple[str, int] | None = None
        self._conn: psycopg.Connection[Any] | None = None
        super().__init__(dsn, schema, lease_seconds, **options)

    def _prepare(self, dsn: str, application_name: str) -> None:
        option = self._idle_timeout_option
        self.idle_timeout_s = session_limits().idle_in_transaction_s if option is None else option
        self.statements = PostgresStatements(self.schema)
        self._application_name = application_name
        connection_info(dsn, application_name)  # a malformed DSN is refused before any connect

    def _current_conninfo(self) -> str:
        """The connection's DSN read again at each (re)connect: a password rotated while a run
        goes on is used by the next connection, not only by the next process."""
        self._dsn = current_dsn(self._dsn)
        return connection_info(self._dsn, self._application_name)

    # --- connection -----------------------------------------------------------------------------
    def _connection(self) -> psycopg.Connection[Any]:
        """The store's one connection, reopened after a loss (the failed call already raised).

        Between calls a live connection has no command in progress: one left ACTIVE (a send
        that failed as the server went away, before libpq read the connection's end) or in an
        unknown state would refuse every later call ("another command is already in
        progress"), so it is replaced like a closed one."""
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            if conn.info.transaction_status not in _UNUSABLE:
                return conn
        conn = self._open()[0]
        conn.autocommit = False
        return conn

    def _open(
        self, probe: str = "", params: Sequence[Any] = ()
    ) -> tuple[psycopg.Connection[Any], tuple[Any, ...]]:
        """Connect and set the session up in one statement (autocommit: no BEGIN or COMMIT
        round trip), with ``probe``'s columns read in that same statement (the schema check's);
        returns the connection, still in autocommit (the caller turns it off), and those
        columns."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        connected = False
        try:
            conn = psycopg.connect(self._current_conninfo(), autocommit=True)
            connected = True
            # Server-side: the server, not only this client, gives up on a silent peer, and a
            # stuck statement ends (docs/ledger.md "Lost pods").
            # And the text forms a chunk written inside the ledger's transaction depends on.
            settings = TEXT_FORM_SETTINGS + session_limits().postgres_settings(
                conn.info.server_version
            )
            row = conn.execute(
                "SELECT " + ", ".join("set_config(%s, %s, false)" for _ in settings) + probe,
                [*(value for pair in settings for value in pair), *params],
            ).fetchone()
            mark_text_forms(conn)
            self._conn = conn
        except psycopg.Error as exc:
            setting = postgres_connect_problem(self._dsn, str(exc))
            if setting is not None:
                raise invalid_setting("the ledger database", setting) from None
            if not connected:  # libpq's text names the host, the user and the database
                raise self._unreachable(postgres_connect_reason(str(exc))) from None
            raise self._unreachable(first_line(str(exc))) from exc
        assert row is not None
        return conn, tuple(row[len(settings) :])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def interrupt(self) -> None:
        """Cancel the statement in flight (thread-safe; a stop request's helper)."""
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            try:
                conn.cancel_safe(timeout=5.0)
            except Exception:
                pass

    def _lost(self, exc: psycopg.Error) -> bool:
        """True when ``exc`` means the session is gone (the outcome of its call is unknown)."""
        conn = self._conn
        return (
            conn is None
            or conn.closed
            or conn.broken
            or (exc.sqlstate or "").startswith(CONNECTION_LOST_STATES)
        )

    def _translate(self, exc: psycopg.Error, op: str) -> DponeError:
        if isinstance(exc, pg_errors.LockNotAvailable) and self.pending_chunk_lock is not None:
            run_key, index = self.pending_chunk_lock
            return ChunkLockTimeout(run_key, index, self.chunk_lock_timeout_s)
        if self._lost(exc) or isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            return self._lost_during(op, first_line(str(exc)))
        # a chunk's data commits in the ledger's transaction when they share a database: a
        # deferred constraint or a trigger's RAISE then fails here, its message holding row
        # values, so only what a connector would say leaves (class, SQLSTATE, object names)
        return self._database_error(op, describe_postgres_error(exc))

    def _load_scope(self, planned: CampaignShape, scope: tuple[int, int]) -> Ledger | None:
        """The campaign checked in the database and only the scope's records read (one
        pipeline): a mapped item's load no longer grows with the campaign."""
        with self._transaction("load", TxMode.READ) as tx:
            state = tx.load_scoped(planned.run_key, *scope)
        ledger = scoped_ledger(planned, scope, state)
        if ledger is not None:
            self._verified_shapes[(planned.run_key, planned.plan_hash)] = planned
        return ledger

    @contextmanager
    def _transaction(self, op: str, mode: TxMode) -> Iterator[PostgresTx]:
        """One transaction; the block's own exception is what leaves it, even when the
        rollback then fails (a session the server ended: it rolled back itself), as the MSSQL
        store's does: an exit in flight stays an exit, a refused write stays that refusal."""
        conn = self._connection()
        self.pending_chunk_lock = None
        raised: BaseException | None = None  # by the block, before its rollback
        try:
            read = mode is TxMode.READ
            if conn.read_only is not (True if read else None):
                # READ: the BEGIN itself says REPEATABLE READ, READ ONLY (no SET TRANSACTION
                # round trip); set between transactions, where psycopg allows it
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ if read else None
                conn.read_only = True if read else None
            with conn.transaction():
                try:
                    yield PostgresTx(self, conn, mode)
                except BaseException as exc:
                    raised = exc
                    raise
        except WriteFailed:
            raise
        except psycopg.Error as exc:
            if raised is not None and exc is not raised:  # the rollback failed after it
                if not isinstance(raised, psycopg.Error):
                    raise raised from None
                exc = raised
            if raised is None and mode is TxMode.WRITE and not self._lost(exc):
                # the COMMIT the caller's rows share with their records refused them (a check
                # the sink's write could not run first): the write failed, not the ledger
                raise WriteFailed(refused_at_commit(exc)) from exc
            raise self._translate(exc, op) from exc
        finally:
            self.pending_chunk_lock = None

    def chunk_lock_holders(self, run_key: str) -> dict[int, str]:
        """Chunks whose lock another session holds now, and who: in the one-commit placement
        (ADR 0021) a chunk being moved has no committed RUNNING record, its lock is the lease.
        Read from pg_locks (no lock is taken; a collision of two campaigns' lock class can only
        name a chunk of the other campaign as held, never hide one)."""
        key = chunk_lock_class(self.schema, run_key) & 0xFFFFFFFF
        try:
            with self._transaction("chunk_lock_holders", TxMode.READ) as tx:
                rows = tx.connection.execute(
                    "SELECT l.objid::bigint, a.pid, a.application_name, a.xact_start "
                    "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 "
                    "AND l.classid = %s::bigint::oid AND l.pid <> pg_backend_pid() "
                    "AND l.database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database())",
                    (key,),
                ).fetchall()
        except DponeError as exc:
            if exc.code != errors.LEDGER_UNAVAILABLE:
                raise
            return {}  # no right to read other sessions' locks: the committed records only
        holders: dict[int, str] = {}
        for index, pid, application, since in rows:
            began = utc(since).isoformat() if since is not None else "?"
            holders[int(index)] = (
                f"{application or 'session'} pid {pid} (transaction since {began})"
            )
        return holders

    # --- schema ---------------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Create or migrate the audit schema once, safely from many processes at once."""
        sql = self.statements
        try:
            version = self._opened_version()
            if version == SCHEMA_VERSION:
                return
            self._check_version(version)
            conn = self._connection()
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (schema_lock_key(self.schema),))
                version = self._stored_version(conn)
                self._check_version(version)
                namespace = conn.execute(
                    "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)
                ).fetchone()
                if namespace is None:
                    conn.execute(f"CREATE SCHEMA {sql.schema}")
                for target in range(int(version or 0) + 1, SCHEMA_VERSION + 1):
                    for statement in MIGRATIONS[target](sql.schema):
                        conn.execute(statement)
                    conn.execute(sql.record_version, (target,))
        except psycopg.Error as exc:
            raise self._translate(exc, "schema creation") from exc

    def inspect_schema(self) -> None:
        """Read the audit schema without creating or migrating anything (`dpone ledger list`):
        no schema yet is an empty ledger; an older one is refused, since reading it needs the
        migration a run applies."""
        try:
            version = self._opened_version()
        except psycopg.Error as exc:
            raise self._translate(exc, "reading the schema version") from exc
        self._inspected(version)

    #: what tells a dpone schema_version table from another's, and whether the schema holds a
    #: campaign table: one statement (the version itself needs the table to exist to be named)
    _SCHEMA_PROBE = (
        ", to_regclass(%s) IS NOT NULL, (SELECT format_type(atttypid, atttypmod) "
        "FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = 'version' "
        "AND attnum > 0 AND NOT attisdropped), to_regclass(%s) IS NOT NULL"
    )

    def _opened_version(self) -> int | None:
        """Connect, set the session up and probe the schema in one autocommit statement, then
        read the version (a second one) when the table is there: two round trips in all."""
        table = f"{self.statements.schema}.schema_version"
        campaign = f"{self.statements.schema}.campaign"
        conn, (exists, kind, present) = self._open(self._SCHEMA_PROBE, (table, table, campaign))
        try:  # still in autocommit: the one read needs no BEGIN or COMMIT round trip
            return self._version_of(conn, kind, present) if exists else None
        finally:
            conn.autocommit = False

    def _stored_version(self, conn: psycopg.Connection[Any]) -> int | None:
        """The audit schema's version, None when it has no schema_version table yet. A table of
        that name that is not dpone's (another tool's migrations) is refused, not migrated."""
        table = f"{self.statements.schema}.schema_version"
        campaign = f"{self.statements.schema}.campaign"
        row = conn.execute("SELECT true" + self._SCHEMA_PROBE, (table, table, campaign)).fetchone()
        assert row is not None
        _, exists, kind, present = row
        return self._version_of(conn, kind, present) if exists else None

    def _version_of(
        self, conn: psycopg.Connection[Any], kind: str | None, present: bool
    ) -> int | None:
        """The version a dpone schema_version table holds (``kind``: its version column's type;
        ``present``: the campaign table exists); another tool's table is refused."""
        if kind == "integer":
            found = conn.execute(self.statements.version).fetchone()
            version = None if found is None or found[0] is None else int(found[0])
            if version is None or present:
                return version
        raise self._foreign_version_table()
