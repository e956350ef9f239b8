#!/usr/bin/env bash
# The embedded demo: no server, no Airflow. Installs the project, checks and previews the example
# project, generates its DAG files, runs an internal backfill on SQLite with local_file state,
# and prints the ledger status.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
CATALOG=golden/internal_default/workloads.yaml
DEMO=.dpone-demo
rm -rf "$DEMO"
python scripts/demo_seed.py "$DEMO/demo.db"
export DPONE_CONN_DEMO="sqlite:///$DEMO/demo.db"
export DPONE_EVIDENCE_DIR="$DEMO/evidence"
echo "\$ dpone check $CATALOG"
dpone check "$CATALOG"
echo "\$ dpone preview $CATALOG"
dpone preview "$CATALOG"
echo "\$ dpone generate $CATALOG --out $DEMO/dags"
dpone generate "$CATALOG" --out "$DEMO/dags"
ls "$DEMO/dags"
echo "\$ dpone run --catalog $CATALOG --workload orders_history"
dpone run --catalog "$CATALOG" --workload orders_history
echo "\$ dpone ledger status --catalog $CATALOG --workload orders_history"
dpone ledger status --catalog "$CATALOG" --workload orders_history
echo "demo: done. Source and target row counts:"
python - "$DEMO/demo.db" <<'PY'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
src = con.execute("select count(*) from raw_orders").fetchone()[0]
dst = con.execute("select count(*) from orders").fetchone()[0]
print(f"  raw_orders={src} orders={dst}")
sys.exit(0 if src == dst else 1)
PY
