#!/usr/bin/env bash
# Gate CPU per proxied write, for A/B comparisons on a machine whose speed drifts (rates move by
# more than the change being measured; CPU time per write moves much less). For each binary
# given, in the order given (alternate them: A B A B ...), starts a fixed-answer origin and a
# fresh gate (SQLite, the Chroma pack, one proxy thread), drives one-record Chroma adds with wrk
# for SECS seconds, and prints writes/s, p99 and the gate's CPU time (user + system) per receipt
# written. Usage:
#   benches/write_cpu.sh [-s SECS] BINARY [BINARY ...]
#   e.g. benches/write_cpu.sh /tmp/gate-before target/release/substrate-gate /tmp/gate-before target/release/substrate-gate
# Needs nginx, wrk and sqlite3.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=10
if [ "${1:-}" = "-s" ]; then SECS=$2; shift 2; fi
[ $# -ge 1 ] || { sed -n 2,10p "$0"; exit 2; }
for t in nginx wrk sqlite3; do command -v $t >/dev/null || { echo "needs $t" >&2; exit 1; }; done

WORK="$(mktemp -d /tmp/gate-cpu.XXXXXX)"
GATE_PID=""
cleanup() {
  [ -n "$GATE_PID" ] && kill "$GATE_PID" 2>/dev/null || true
  [ -f "$WORK/origin.pid" ] && kill "$(cat "$WORK/origin.pid")" 2>/dev/null || true
  sleep 0.3; rm -rf "$WORK"
}
trap cleanup EXIT
. benches/lib.sh
ORIGIN=$(free_port)
COL="0b7e6a52-6a3c-4c7e-9d7a-5d2f0c1e9a11"
URL_PATH="/api/v2/tenants/default_tenant/databases/default_database/collections/$COL/add"
start_origin "$WORK" "$ORIGIN"
write_add_lua "$WORK/add.lua"
tick=$(getconf CLK_TCK)
for bin in "$@"; do
  API=$(free_port); PROXY=$(free_port); METRICS=$(free_port)
  rm -f "$WORK"/gate.db*
  gate_config "$WORK/gate.toml" "$API" "$PROXY" "$METRICS" "$ORIGIN" "$WORK/gate.db"
  "$bin" serve --config "$WORK/gate.toml" >"$WORK/logs/gate.log" 2>&1 &
  GATE_PID=$!
  wait_port "$PROXY"
  wrk -t1 -c32 -d2s -s "$WORK/add.lua" "http://127.0.0.1:$PROXY$URL_PATH" >/dev/null
  before_cpu=$(awk '{print $14+$15}' "/proc/$GATE_PID/stat")
  before_n=$(sqlite3 "$WORK/gate.db" 'select count(*) from receipts')
  out=$(wrk -t1 -c32 -d"${SECS}s" --latency -s "$WORK/add.lua" "http://127.0.0.1:$PROXY$URL_PATH")
  after_cpu=$(awk '{print $14+$15}' "/proc/$GATE_PID/stat")
  after_n=$(sqlite3 "$WORK/gate.db" 'select count(*) from receipts')
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  us=$(( (after_cpu - before_cpu) * 1000000 / tick / (after_n - before_n) ))
  printf '%-50s writes/s %10s  p99 %9s  gate CPU per write %5s us\n' "$bin" "$rps" "$p99" "$us"
  kill "$GATE_PID"; wait "$GATE_PID" 2>/dev/null || true; GATE_PID=""
done
