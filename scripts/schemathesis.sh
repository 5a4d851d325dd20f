#!/usr/bin/env bash
# Property-based API fuzzing with Schemathesis (PyPI) against the gate's own /openapi.json.
#
# Starts a gate itself (the cargo-built debug binary, a temporary SQLite database, a copy of
# config/local.toml on free ports), runs every documented operation with positive and negative
# cases, then stops the gate. Exit status: 0 when Schemathesis finds nothing, 1 on any failure
# (a 5xx, a response that violates the documented schema, an undocumented status code or content
# type, a negative case accepted), 2 when the gate or the tool cannot be started.
#
# Usage: scripts/schemathesis.sh
# Environment:
#   SCHEMATHESIS_SEED          seed of the run (default: random, printed; pass it to replay a run)
#   SCHEMATHESIS_MAX_EXAMPLES  test cases per operation and phase (default 60)
#   SCHEMATHESIS_PHASES        default "examples,coverage,fuzzing,stateful"
#   SCHEMATHESIS_MAX_TIME      time budget in seconds for the whole run (default 150)
#   SUBSTRATE_GATE_BIN         a binary to test instead of target/debug/substrate-gate
#   SUBSTRATE_GATE_CI_TOOLS    where tools are installed (default ~/.cache/substrate-gate/ci-tools)
# Reports (JUnit, NDJSON events, the failing cases as a pytest file) go to
# $SCHEMATHESIS_REPORT_DIR (default target/schemathesis).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

schemathesis_version=4.32.5
seed=${SCHEMATHESIS_SEED:-$(( (RANDOM << 15 | RANDOM) ))}
max_examples=${SCHEMATHESIS_MAX_EXAMPLES:-60}
phases=${SCHEMATHESIS_PHASES:-examples,coverage,fuzzing,stateful}
max_time=${SCHEMATHESIS_MAX_TIME:-150}
report_dir=${SCHEMATHESIS_REPORT_DIR:-$root/target/schemathesis}
tools=${SUBSTRATE_GATE_CI_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/substrate-gate/ci-tools}
demo_key=demo-key-change-me

say() { echo "schemathesis.sh: $*"; }
die() { echo "schemathesis.sh: $*" >&2; exit 2; }

# --- the tool, pinned, in its own venv -------------------------------------------------------
venv="$tools/schemathesis-venv"
mkdir -p "$tools"
exec 8>"$tools/.schemathesis.lock"
command -v flock >/dev/null && flock 8
if [[ ! -x $venv/bin/schemathesis || $(cat "$venv/.version" 2>/dev/null) != "$schemathesis_version" ]]; then
  say "installing schemathesis==$schemathesis_version into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || die "cannot create a Python venv (Debian: apt-get install python3-venv)"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$schemathesis_version" \
    || die "cannot install schemathesis from PyPI"
  echo "$schemathesis_version" >"$venv/.version"
fi
flock -u 8 2>/dev/null || true

# --- the gate ----------------------------------------------------------------------------------
bin=${SUBSTRATE_GATE_BIN:-}
if [[ -z $bin ]]; then
  cargo build --quiet --bin substrate-gate || die "cargo build failed"
  bin=$root/target/debug/substrate-gate
fi
[[ -x $bin ]] || die "no binary at $bin"

work=$(mktemp -d -t substrate-gate-schemathesis.XXXXXX)
gate_pid=""
cleanup() {
  if [[ -n $gate_pid ]] && kill -0 "$gate_pid" 2>/dev/null; then
    kill -TERM "$gate_pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$gate_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$gate_pid" 2>/dev/null || true
    wait "$gate_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
api_port=$(free_port); proxy_port=$(free_port); metrics_port=$(free_port)
# The shipped config, on free ports and a throw-away database; the pack path made absolute
# (the copy lives elsewhere); the demo key's rate limit raised so the run measures the API,
# not the limiter (429 is documented and checked all the same).
sed -e "s|^api = \"127.0.0.1:8080\"|api = \"127.0.0.1:$api_port\"|" \
    -e "s|^proxy = \"127.0.0.1:8081\"|proxy = \"127.0.0.1:$proxy_port\"|" \
    -e "s|^metrics = \"127.0.0.1:9090\"|metrics = \"127.0.0.1:$metrics_port\"|" \
    -e "s|^url = \"sqlite://data/gate.db\"|url = \"sqlite://$work/gate.db\"|" \
    -e "s|\"\\.\\./filters/|\"$root/filters/|g" \
    -e "s|^rate_limit_per_second = 1000|rate_limit_per_second = 100000|" \
    -e "s|^rate_limit_burst = 2000|rate_limit_burst = 100000|" \
    -e "s|^watch = true|watch = false|" \
    config/local.toml >"$work/gate.toml"
grep -q "127.0.0.1:$api_port" "$work/gate.toml" || die "could not rewrite config/local.toml (listeners changed?)"
grep -q "sqlite://$work/gate.db" "$work/gate.toml" || die "could not rewrite config/local.toml (storage changed?)"

"$bin" serve --config "$work/gate.toml" >"$work/gate.log" 2>&1 &
gate_pid=$!
base="http://127.0.0.1:$api_port"
for _ in $(seq 1 300); do
  if curl -fsS "$base/readyz" >/dev/null 2>&1; then break; fi
  kill -0 "$gate_pid" 2>/dev/null || { tail -40 "$work/gate.log" >&2; die "the gate exited during start"; }
  sleep 0.1
done
curl -fsS "$base/readyz" >/dev/null 2>&1 || { tail -40 "$work/gate.log" >&2; die "the gate did not become ready"; }
ops=$(curl -fsS "$base/openapi.json" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(sum(len([m for m in v if m in ("get","post","put","patch","delete")]) for v in d["paths"].values()))')
say "gate pid $gate_pid at $base; $ops documented operations"

# --- the run -----------------------------------------------------------------------------------
mkdir -p "$report_dir"
say "seed $seed (replay: SCHEMATHESIS_SEED=$seed bash scripts/schemathesis.sh), $max_examples examples per operation, phases $phases"
checks=not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,negative_data_rejection,positive_data_acceptance
run_schemathesis() {
SCHEMATHESIS_HOOKS=scripts.schemathesis_hooks PYTHONPATH="$root" \
"$venv/bin/schemathesis" run "$base/openapi.json" \
  --header "Authorization: Bearer $demo_key" \
  --checks "$checks" \
  --mode all \
  --phases "$phases" \
  --max-examples "$max_examples" \
  --seed "$seed" \
  --max-time "$max_time" \
  --workers "$1" \
  --request-timeout 30 \
  --suppress-health-check all \
  --report junit,ndjson,pytest \
  --report-dir "$report_dir" \
  --output-truncate true \
  --warnings off 2>&1 | tee "$work/run.log"
return "${PIPESTATUS[0]}"
}
set +e
run_schemathesis 2
rc=$?
# Two workers can parse Python source at once inside Hypothesis (it reads a filter lambda's
# source to describe it), and CPython 3.11's AST constructor keeps its depth counter per
# interpreter, so it can raise a spurious SystemError ("AST constructor recursion depth
# mismatch", python/cpython#106905): the tool crashes on an operation without sending anything.
# When that crash is the only error and nothing failed, the run is repeated once, with the next
# seed and one worker; any failure still fails.
if [[ $rc -ne 0 ]] && grep -q "AST constructor recursion depth mismatch" "$work/run.log" \
   && ! grep -q "= FAILURES =" "$work/run.log"; then
  seed=$((seed + 1))
  say "the tool itself crashed (CPython AST bug under two workers), nothing failed; once more with seed $seed and one worker"
  run_schemathesis 1
  rc=$?
fi
set -e

curl -fsS "$base/openapi.json" >"$work/openapi.json" 2>/dev/null || true
latest=$(ls -t "$report_dir"/ndjson-*.ndjson 2>/dev/null | head -n1 || true)
if [[ -n $latest && -s $work/openapi.json ]]; then
  python3 scripts/schemathesis_summary.py "$latest" "$work/openapi.json" || true
fi

if ! kill -0 "$gate_pid" 2>/dev/null; then
  tail -40 "$work/gate.log" >&2
  say "FAILED: the gate died during the run"
  exit 1
fi
panics=$(grep -c '"handler panicked"' "$work/gate.log" || true)
if [[ $panics -gt 0 ]]; then
  grep '"handler panicked"' "$work/gate.log" | head -5 >&2
  say "FAILED: $panics handler panic(s) in the gate log (answered 503, but a panic is a bug)"
  exit 1
fi
if [[ $rc -ne 0 ]]; then
  say "FAILED (exit $rc); seed $seed; reports in $report_dir"
  exit 1
fi
say "passed: seed $seed, $ops operations, no failures"
