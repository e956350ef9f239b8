#!/usr/bin/env bash
# The whole test suite: lint, types, then every test (unit, schema, Postgres, Airflow matrix,
# end to end, chaos and fuzz at CI size). What the README's second command runs and .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/ensure_postgres.sh
bash scripts/ensure_mariadb.sh
bash scripts/ensure_odbc.sh
bash scripts/ensure_chromium.sh
bash scripts/ensure_netns.sh
echo "== airflow venvs" >&2
.venv/bin/python scripts/airflow_envs.py --jobs 2
echo "== lint" >&2
.venv/bin/ruff check .
.venv/bin/black --check -q .
.venv/bin/mypy
echo "== tests" >&2
set +e
.venv/bin/python -m pytest -p no:cacheprovider "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"
