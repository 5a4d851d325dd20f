#!/usr/bin/env bash
# Soak benchmark (not a test): mixed load through the sidecar proxy (and a share of API
# ingest + evaluate pairs) at a fixed rate for a long time, on a release build and SQLite.
# Prints p50/p99 latency per interval, the gate's RSS and open file descriptors at the start and
# the end, and the errors (exit 1 if there are any). See benches/soak/driver.rs for the mix.
#
# Usage: benches/soak.sh [SECONDS]        (default 600)
# Environment: SOAK_RATE requests per second (default 200), SOAK_INTERVAL seconds per report
# line (default 60), SUBSTRATE_GATE_BIN a gate binary (default: cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
rate=${SOAK_RATE:-200}
interval=${SOAK_INTERVAL:-60}
bin=${SUBSTRATE_GATE_BIN:-}
if [[ -z $bin ]]; then
  cargo build --release --quiet --bin substrate-gate
  bin=$PWD/target/release/substrate-gate
fi
cargo build --release --quiet --example soak_driver
ulimit -n 65536 2>/dev/null || true
exec target/release/examples/soak_driver --gate-bin "$bin" --seconds "$seconds" --rate "$rate" --interval "$interval"
