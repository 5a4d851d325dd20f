#!/usr/bin/env bash
# The sidecar's cost, measured against what it stands beside. Starts:
#   - a fixed-answer origin (nginx `return`, one worker): answers a Chroma count (GET) and add (POST);
#   - nginx as a plain reverse proxy to it (one worker, keep-alive upstream);
#   - a bare Pingora pass-through proxy (examples/bare_proxy.rs, one thread): the framework's floor;
#   - the gate (one proxy thread, SQLite, the Chroma pack, the default policy);
# then drives each with wrk and prints requests per second and p99 for
#   reads:  GET .../collections/{id}/count   (a read no pack treats: only the route lookup)
#   writes: POST .../collections/{id}/add    (one record, unique id per request: judged by the
#           kernel, receipt and journal row committed before dispatch, for the gate)
# and the ratios. Usage:
#   benches/proxy.sh [seconds per run (default 10)] [connections (default 32)]
# Environment: TARGETS (default "origin nginx bare gate") limits what is measured;
# PERF_OUT=<file> records a `perf record -g` profile of the gate during its write run.
# Needs nginx and wrk (apt-get install -y nginx wrk). Builds the release binaries first.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR="${1:-10}"
CONNS="${2:-32}"
WRK_THREADS="${WRK_THREADS:-1}"
command -v nginx >/dev/null && command -v wrk >/dev/null || {
  echo "needs nginx and wrk: apt-get install -y nginx wrk" >&2; exit 1; }

cargo build --release --quiet --bin substrate-gate --example bare_proxy
GATE=target/release/substrate-gate
BARE=target/release/examples/bare_proxy

WORK="$(mktemp -d /tmp/gate-bench.XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$WORK/origin.pid" ] && kill "$(cat "$WORK/origin.pid")" 2>/dev/null || true
  [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
  sleep 0.3
  rm -rf "$WORK"
}
trap cleanup EXIT

. benches/lib.sh
ORIGIN=$(free_port); NGINX=$(free_port); BAREP=$(free_port)
GATE_API=$(free_port); GATE_PROXY=$(free_port); GATE_METRICS=$(free_port)
COL="0b7e6a52-6a3c-4c7e-9d7a-5d2f0c1e9a11"
BASE="/api/v2/tenants/default_tenant/databases/default_database/collections/$COL"

mkdir -p "$WORK/logs"
start_origin "$WORK" "$ORIGIN"
cat > "$WORK/nginx.conf" <<EOF
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/logs/nginx.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/cbt2; proxy_temp_path $WORK/pt2; fastcgi_temp_path $WORK/ft2; uwsgi_temp_path $WORK/ut2; scgi_temp_path $WORK/st2;
  keepalive_requests 1000000;
  upstream origin { server 127.0.0.1:$ORIGIN; keepalive 256; }
  server {
    listen 127.0.0.1:$NGINX;
    location / {
      proxy_pass http://origin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      client_body_buffer_size 64k;
    }
  }
}
EOF
nginx -c "$WORK/nginx.conf" -p "$WORK"

"$BARE" "127.0.0.1:$BAREP" "127.0.0.1:$ORIGIN" 1 >"$WORK/logs/bare.log" 2>&1 &
PIDS+=($!)

gate_config "$WORK/gate.toml" "$GATE_API" "$GATE_PROXY" "$GATE_METRICS" "$ORIGIN" "$WORK/gate.db"
"$GATE" serve --config "$WORK/gate.toml" >"$WORK/logs/gate.log" 2>&1 &
GATE_PID=$!
PIDS+=($GATE_PID)

for p in $ORIGIN $NGINX $BAREP $GATE_PROXY; do wait_port "$p"; done
curl -sf "http://127.0.0.1:$GATE_API/readyz" >/dev/null

write_add_lua "$WORK/add.lua"

# run NAME PORT KIND -> prints "rps p99_ms"
run() {
  local port=$2 kind=$3 out
  if [ "$kind" = read ]; then
    wrk -t"$WRK_THREADS" -c"$CONNS" -d2s "http://127.0.0.1:$port$BASE/count" >/dev/null
    out=$(wrk -t"$WRK_THREADS" -c"$CONNS" -d"${DUR}s" --latency "http://127.0.0.1:$port$BASE/count")
  else
    wrk -t"$WRK_THREADS" -c"$CONNS" -d2s -s "$WORK/add.lua" "http://127.0.0.1:$port$BASE/add" >/dev/null
    out=$(wrk -t"$WRK_THREADS" -c"$CONNS" -d"${DUR}s" --latency -s "$WORK/add.lua" "http://127.0.0.1:$port$BASE/add")
  fi
  local rps p99 non2xx
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $5}')
  [ -n "$non2xx" ] && echo "WARNING: $1 $kind: $non2xx non-2xx answers" >&2
  echo "$rps $(to_ms "$p99")"
}
to_ms() { python3 -c 'import sys,re; v=sys.argv[1]; m=re.match(r"([\d.]+)(us|ms|s)",v); f={"us":0.001,"ms":1,"s":1000}; print("%.3f"%(float(m.group(1))*f[m.group(2)]) if m else "nan")' "$1"; }

declare -A RPS P99
TARGETS="${TARGETS:-origin nginx bare gate}"
declare -A PORT=([origin]=$ORIGIN [nginx]=$NGINX [bare]=$BAREP [gate]=$GATE_PROXY)
for name in $TARGETS; do
  port=${PORT[$name]}
  for kind in read write; do
    if [ -n "${PERF_OUT:-}" ] && [ "$name" = gate ] && [ "$kind" = write ]; then
      (sleep 3; perf record -g -o "$PERF_OUT" -p "$GATE_PID" -- sleep "$DUR" >/dev/null 2>&1) &
    fi
    read -r r p < <(run "$name" "$port" "$kind")
    RPS[$name-$kind]=$r; P99[$name-$kind]=$p
  done
done

ratio() { python3 -c 'import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print("%.2f" % (a/b) if b else "nan")' "$1" "$2"; }
diff_ms() { python3 -c 'import sys; print("%.3f" % (float(sys.argv[1])-float(sys.argv[2])))' "$1" "$2"; }

echo
echo "substrate-gate proxy benchmark: ${DUR}s per run, $CONNS connections, wrk -t$WRK_THREADS, one worker each, $(nproc) cores"
printf '%-22s %12s %10s %12s %10s\n' "" "reads rps" "p99 ms" "writes rps" "p99 ms"
for n in $TARGETS; do
  label=$n; [ $n = origin ] && label="origin (direct)"; [ $n = bare ] && label="bare pingora"; [ $n = nginx ] && label="nginx proxy"; [ $n = gate ] && label="gate"
  printf '%-22s %12s %10s %12s %10s\n' "$label" "${RPS[$n-read]}" "${P99[$n-read]}" "${RPS[$n-write]}" "${P99[$n-write]}"
done
echo
echo "ratios (requests per second)"
echo "  bare pingora / nginx, reads:   $(ratio "${RPS[bare-read]:-0}" "${RPS[nginx-read]:-0}")"
echo "  gate / bare pingora, reads:    $(ratio "${RPS[gate-read]:-0}" "${RPS[bare-read]:-0}")   (target >= 0.9)"
echo "  gate / nginx, reads:           $(ratio "${RPS[gate-read]:-0}" "${RPS[nginx-read]:-0}")"
echo "  bare pingora / nginx, writes:  $(ratio "${RPS[bare-write]:-0}" "${RPS[nginx-write]:-0}")"
echo "  gate / bare pingora, writes:   $(ratio "${RPS[gate-write]:-0}" "${RPS[bare-write]:-0}")   (target >= 0.5)"
echo "p99 added by the gate to a write: $(diff_ms "${P99[gate-write]:-0}" "${P99[bare-write]:-0}") ms over bare pingora, $(diff_ms "${P99[gate-write]:-0}" "${P99[origin-write]:-0}") ms over the origin (target < 2 ms)"
echo "gate journal: $(sqlite3 "$WORK/gate.db" 'select count(*) from receipts' 2>/dev/null || echo '?') receipts written"
