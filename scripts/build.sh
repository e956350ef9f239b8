#!/usr/bin/env bash
# Build the wheels of both distributions into dist/ (git-ignored), or into the folder given as the
# first argument (tests/install builds into a temporary folder):
#   dist/dpone_runtime-<version>-py3-none-any.whl   what a pod installs (`dpone run`, `dpone ledger`)
#   dist/dpone-<version>-py3-none-any.whl           the generator (`dpone check/preview/generate`)
# The sources are built from a temporary copy, so nothing (build/, *.egg-info) is left in the
# tree. pip builds them in isolated environments and takes setuptools from the package index
# your pip is configured with. Install them by path, never by a bare index name (the name `dpone`
# on PyPI belongs to another project):
#   pip install 'dist/dpone_runtime-0.1.0-py3-none-any.whl[postgres]'
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
python=${DPONE_PYTHON:-python3}
if [ -x .venv/bin/python ]; then python=.venv/bin/python; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar --exclude='*.egg-info' --exclude=build --exclude=dist --exclude=__pycache__ \
  -cf - pyproject.toml README.md generator templates runtime | tar -xf - -C "$work"
rm -f "$out"/dpone_runtime-*.whl "$out"/dpone-*.whl
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$out" "$work/runtime" "$work"
ls -l "$out"/dpone_runtime-*.whl "$out"/dpone-*.whl >&2
