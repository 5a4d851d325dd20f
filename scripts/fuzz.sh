#!/usr/bin/env bash
# Parser and validator fuzzing with proptest, for a bounded time.
#
# cargo-fuzz needs a nightly toolchain (libFuzzer, -Z sanitizer flags), which this project does
# not require; the same targets are fuzzed here as proptest properties (tests/props_*.rs):
# the config loader, the filter-pack compiler and JSON pointers, the API request validators,
# record extraction and lockstep rewriting, and the RFC 8785 canonicalizer.
#
# The properties run in rounds, each with a fresh random seed (printed) and many cases, until the
# time budget is spent. A failing input is shrunk by proptest and saved to
# tests/props_*.proptest-regressions, which every later `cargo test` replays first: commit those
# files (and, better, add the input as a plain #[test] beside the property, as
# `found_by_properties` does).
#
# Usage: scripts/fuzz.sh [SECONDS]            (default 300; the budget for all rounds together)
# Environment:
#   FUZZ_CASES     cases per property per round (default 4000)
#   FUZZ_TARGETS   space-separated test targets (default: every tests/props_*.rs)
#   FUZZ_PROFILE   release (default: parsing a config compiles its detectors, ~40x faster
#                  optimized) or dev
#   FUZZ_SEED      seed of the first round (replay: FUZZ_SEED=<printed seed> FUZZ_ROUNDS=1)
#   FUZZ_ROUNDS    stop after this many rounds even if time is left
# Exit status: 0 when no property failed, 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

budget=${1:-300}
cases=${FUZZ_CASES:-4000}
profile=${FUZZ_PROFILE:-release}
targets=${FUZZ_TARGETS:-$(ls tests/props_*.rs | xargs -n1 basename | sed 's/\.rs$//' | tr '\n' ' ')}
max_rounds=${FUZZ_ROUNDS:-1000000}

profile_flag=()
[[ $profile == release ]] && profile_flag=(--release)
target_flags=()
for t in $targets; do target_flags+=(--test "$t"); done

echo "fuzz.sh: building ${targets} (${profile})"
cargo test "${profile_flag[@]}" --no-run "${target_flags[@]}" --quiet

start=$(date +%s)
round=0
failed=0
total_cases=0
runs=0
seed=${FUZZ_SEED:-}
log=$(mktemp -t substrate-gate-fuzz.XXXXXX)
trap 'rm -f "$log"' EXIT
while (( failed == 0 && round < max_rounds )); do
  (( budget - ($(date +%s) - start) > 0 )) || break
  round=$((round + 1))
  [[ -n $seed ]] || seed=$(( (RANDOM << 30) | (RANDOM << 15) | RANDOM ))
  echo "fuzz.sh: round $round, seed $seed, $cases cases per property"
  for t in $targets; do
    left=$(( budget - ($(date +%s) - start) ))
    (( left > 0 )) || break
    set +e
    # A run that outlives the budget is cut (a failure found so far is already persisted).
    PROPTEST_CASES=$cases PROPTEST_RNG_SEED=$seed PROPTEST_MAX_SHRINK_TIME=60000 \
      timeout --signal=TERM "$left" \
      cargo test "${profile_flag[@]}" --quiet --test "$t" -- --test-threads=2 >"$log" 2>&1
    rc=$?
    set -e
    passed=$(grep -Eo 'test result: [a-zA-Z]+\. [0-9]+ passed' "$log" | awk '{n += $4} END {print n + 0}')
    if [[ $rc -eq 124 ]]; then
      echo "fuzz.sh:   $t cut at the time limit"
      break
    fi
    runs=$((runs + 1))
    total_cases=$(( total_cases + passed * cases ))
    if [[ $rc -ne 0 ]]; then
      failed=1
      grep -E 'panicked at|minimal failing input|Test failed|^test .* FAILED' "$log" | head -40
      echo "fuzz.sh:   $t FAILED (seed $seed); the shrunk input is in tests/$t.proptest-regressions"
      break
    fi
    echo "fuzz.sh:   $t: $passed tests passed"
  done
  seed=""
done
elapsed=$(( $(date +%s) - start ))
git status --porcelain -- 'tests/*.proptest-regressions' | sed 's/^/fuzz.sh: changed: /'
echo "fuzz.sh: $round round(s), $runs target runs in ${elapsed}s, about $total_cases property cases (tests x cases; fixed tests count as one case each); $([[ $failed -eq 0 ]] && echo 'no failure' || echo 'FAILURES')"
exit $failed
