#!/usr/bin/env bash
# Installs what building and testing substrate-gate needs on a fresh Debian
# machine, idempotently: cmake (Pingora's zlib-ng), and with --test the
# PostgreSQL server start and the Python packages of the end-to-end tests.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
if [ "${1:-}" = "--test" ]; then
  command -v nginx >/dev/null 2>&1 || need_apt+=(nginx)
  command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [ "${1:-}" = "--test" ]; then
  # PostgreSQL for the fleet backend of every integration test.
  if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
    if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
      echo "setup: starting PostgreSQL"
      pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
      for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1 && break; sleep 1; done
    fi
  fi
  pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1 || { echo "setup: PostgreSQL is not reachable at 127.0.0.1:5432" >&2; exit 1; }
  if [ -f tests/e2e/requirements.txt ]; then
    python3 -m pip install -q --disable-pip-version-check -r tests/e2e/requirements.txt
  fi
fi
