#!/usr/bin/env bash
# Makes sure the test Postgres answers: starts the local cluster when it is installed and down.
# Fails loudly (exit 1) when no server can be reached: Postgres tests are never skipped.
set -euo pipefail
DSN=${DPONE_TEST_POSTGRES_DSN:-postgresql://postgres@127.0.0.1:5432/test}
if pg_isready -d "$DSN" -q 2>/dev/null; then exit 0; fi
if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  version=$(ls /etc/postgresql | sort -V | tail -n1)
  echo "ensure_postgres: starting local cluster $version/main" >&2
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 30); do
    pg_isready -d "$DSN" -q 2>/dev/null && break
    sleep 1
  done
fi
if ! pg_isready -d "$DSN" -q 2>/dev/null; then
  echo "ensure_postgres: Postgres is not reachable at DPONE_TEST_POSTGRES_DSN=$DSN" >&2
  exit 1
fi
# The test database must exist (trust auth on the local cluster).
if ! psql "$DSN" -Atc 'select 1' >/dev/null 2>&1; then
  base=${DSN%/*}
  psql "$base/postgres" -c "CREATE DATABASE ${DSN##*/}" >/dev/null
fi
