#!/usr/bin/env bash
# Creates (or refreshes) the project virtual environment .venv with both distributions installed
# editable plus the pinned dev tools. Idempotent: a stamp keyed by the requirement files skips work.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${DPONE_PYTHON:-python3}
VENV=.venv
stamp_key=$(cat pyproject.toml runtime/pyproject.toml requirements/dev.txt | sha256sum | cut -c1-16)
if [ -f "$VENV/.dpone-stamp" ] && [ "$(cat "$VENV/.dpone-stamp")" = "$stamp_key" ]; then
  exit 0
fi
echo "bootstrap: creating $VENV (python: $($PY --version))" >&2
rm -rf "$VENV"
$PY -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
# The generator's import name (dpone_generator) maps to generator/, so setuptools installs it
# editable through an import hook and prints a note saying so ("Editable installation."); that
# note is the one warning the install gives, and it is informational: keep it off the terminal.
PYTHONWARNINGS="ignore:Editable installation" "$VENV/bin/python" -m pip install --quiet \
  --disable-pip-version-check \
  -r requirements/dev.txt -e "./runtime[postgres,mssql,mysql,progress,metrics,lineage]" -e .
echo "$stamp_key" > "$VENV/.dpone-stamp"
