#!/usr/bin/env bash
# Quick start: run the gate on its embedded default (SQLite, loopback, demo key).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec cargo run --release -- serve --config config/local.toml
