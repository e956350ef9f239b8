#!/usr/bin/env bash
# Makes sure Debian's headless Chromium is installed: the HTML status test (tests/status) takes a
# real screenshot with it. Idempotent: does nothing when /usr/bin/chromium already runs.
# Needs root (apt-get) on a fresh machine; prints the reason and exits 1 when it cannot install.
set -euo pipefail
CHROMIUM=${DPONE_CHROMIUM:-/usr/bin/chromium}
if [ -x "$CHROMIUM" ] && "$CHROMIUM" --headless --no-sandbox --version >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "ensure_chromium: $CHROMIUM is missing and this is not root: run 'apt-get install -y chromium'" >&2
  exit 1
fi
echo "ensure_chromium: installing Debian's chromium (headless screenshots for tests/status)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
"$CHROMIUM" --headless --no-sandbox --version >/dev/null 2>&1 || {
  echo "ensure_chromium: $CHROMIUM was installed but does not start" >&2
  exit 1
}
