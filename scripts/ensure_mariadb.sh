#!/usr/bin/env bash
# Makes sure the test MariaDB/MySQL answers: starts the local mariadbd when it is installed and
# down (installing Debian's mariadb-server first when it is missing and this is root).
# Fails loudly (exit 1) when no server can be reached: MySQL tests are never skipped.
set -euo pipefail
HOST=127.0.0.1
PORT=3306
ping() { mysqladmin --host="$HOST" --port="$PORT" --user=root --connect-timeout=2 ping >/dev/null 2>&1; }
if ping; then exit 0; fi
if [ ! -x /usr/sbin/mariadbd ] && [ "$(id -u)" -eq 0 ]; then
  echo "ensure_mariadb: installing Debian's mariadb-server" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends mariadb-server mariadb-client >/dev/null
fi
if [ -x /usr/sbin/mariadbd ]; then
  echo "ensure_mariadb: starting /usr/sbin/mariadbd" >&2
  mkdir -p /run/mysqld
  chown mysql:mysql /run/mysqld 2>/dev/null || true
  start-stop-daemon --start --oknodo --background --chuid mysql --exec /usr/sbin/mariadbd
  for _ in $(seq 1 60); do
    ping && break
    sleep 1
  done
fi
if ! ping; then
  echo "ensure_mariadb: MariaDB/MySQL is not reachable at $HOST:$PORT (root, no password)" >&2
  exit 1
fi
