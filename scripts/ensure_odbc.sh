#!/usr/bin/env bash
# Makes sure unixODBC's libodbc is present so pyodbc (the MSSQL adapters' driver) imports.
# No MSSQL server runs here; the adapters are tested through a recording DB-API double, but the
# real driver module must load. Idempotent; needs root (apt-get) on a fresh machine.
set -euo pipefail
if ldconfig -p 2>/dev/null | grep -q 'libodbc\.so\.2'; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "ensure_odbc: libodbc is missing and this is not root: run 'apt-get install -y unixodbc'" >&2
  exit 1
fi
echo "ensure_odbc: installing Debian's unixodbc (libodbc for pyodbc)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends unixodbc >/dev/null
