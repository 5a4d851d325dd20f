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
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
ORIGIN=$(free_port)
COL="0b7e6a52-6a3c-4c7e-9d7a-5d2f0c1e9a11"
URL_PATH="/api/v2/tenants/default_tenant/databases/default_database/collections/$COL/add"
mkdir -p "$WORK/logs"
cat > "$WORK/origin.conf" <<EOC
worker_processes 1;
pid $WORK/origin.pid;
error_log $WORK/logs/origin.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/cbt; proxy_temp_path $WORK/pt; fastcgi_temp_path $WORK/ft; uwsgi_temp_path $WORK/ut; scgi_temp_path $WORK/st;
  keepalive_requests 1000000;
  server { listen 127.0.0.1:$ORIGIN; default_type application/json;
    location / { client_body_buffer_size 64k; return 201 '{}'; } }
}
EOC
nginx -c "$WORK/origin.conf" -p "$WORK"
cat > "$WORK/add.lua" <<'EOL'
local n = 0
local emb = "[" .. string.rep("0.0123,", 383) .. "0.0123]"
request = function()
  n = n + 1
  local id = string.format("t%d-%d", math.random(1, 1000000000), n)
  local body = '{"ids":["' .. id .. '"],"embeddings":[' .. emb .. '],"metadatas":[{"source":"bench","n":' .. n ..
    '}],"documents":["Invoices are sent on the first business day of each month as PDF attachments."],"uris":null}'
  return wrk.format("POST", wrk.path, {["Content-Type"] = "application/json"}, body)
end
EOL
wait_port() { for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 did not open" >&2; exit 1; }
tick=$(getconf CLK_TCK)
for bin in "$@"; do
  API=$(free_port); PROXY=$(free_port); METRICS=$(free_port)
  rm -f "$WORK"/gate.db*
  cat > "$WORK/gate.toml" <<EOC
[service]
watch = false
[listeners]
api = "127.0.0.1:$API"
proxy = "127.0.0.1:$PROXY"
metrics = "127.0.0.1:$METRICS"
proxy_threads = 1
[storage]
url = "sqlite://$WORK/gate.db"
[logging]
level = "warn"
[upstream]
address = "127.0.0.1:$ORIGIN"
[proxy]
packs = ["$PWD/filters/chroma.toml"]
tenant = "00000000-0000-4000-8000-000000000001"
[[tenants]]
id = "00000000-0000-4000-8000-000000000001"
name = "bench"
policy = "default"
EOC
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
