#!/usr/bin/env bash
# Quick start: run every test. Unit and integration tests on SQLite and
# PostgreSQL, the end-to-end sidecar tests against a real Chroma server,
# and the deployment manifest checks. Fails on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export TEST_DATABASE_URL="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
# The crash test stops and restarts the local PostgreSQL for a few seconds.
export SUBSTRATE_GATE_PG_OUTAGE_TEST="${SUBSTRATE_GATE_PG_OUTAGE_TEST:-1}"

# Where cargo puts binaries (CARGO_TARGET_DIR, when set, e.g. to share a build between clones).
bin="${CARGO_TARGET_DIR:-$PWD/target}/debug/substrate-gate"

echo "== cargo build"
cargo build --all-targets --locked
echo "== cargo test (SQLite and PostgreSQL at $TEST_DATABASE_URL)"
cargo test --locked -- --test-threads=2

if [ -d tests/e2e ] && ls tests/e2e/test_*.py >/dev/null 2>&1; then
  echo "== end-to-end: chromadb client -> gate -> real Chroma"
  GATE_BIN="$bin" python3 -m pytest -q tests/e2e -m e2e -p no:cacheprovider
fi

echo "== schemathesis: every documented route against /openapi.json (bounded, seed printed)"
SUBSTRATE_GATE_BIN="$bin" bash scripts/schemathesis.sh

if [ -x .ci/validate-deploy.sh ] || [ -f .ci/validate-deploy.sh ]; then
  echo "== deploy/: kustomize render + Kubernetes schema validation"
  SUBSTRATE_GATE_BIN="$bin" bash .ci/validate-deploy.sh
  SUBSTRATE_GATE_BIN="$bin" bash tests/deploy/test_validate_broken.sh
fi
echo "== all tests passed"
