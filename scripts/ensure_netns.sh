#!/usr/bin/env bash
# Makes sure iproute2 and iptables are present for the network-cut chaos test
# (tests/chaos/test_chaos_partition.py: two network namespaces joined by a veth pair, then every
# packet of one dropped). Idempotent; needs root (apt-get) on a fresh machine.
set -euo pipefail
missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "ensure_netns: ${missing[*]} missing and this is not root: run 'apt-get install -y ${missing[*]}'" >&2
  exit 1
fi
echo "ensure_netns: installing Debian's ${missing[*]} (network-cut test)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
