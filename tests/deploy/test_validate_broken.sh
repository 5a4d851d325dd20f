#!/usr/bin/env bash
# Proves that .ci/validate-deploy.sh can fail: an intact copy of deploy/ passes, and copies broken
# in one place each (a schema error, a container without an image, a subPath config mount that
# would defeat hot reload, and, when the crate is built, a policy `check-config` refuses) are each
# refused with exit status 1 and a message naming the fault.
# Usage: tests/deploy/test_validate_broken.sh      (exit 0 when every case behaves)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
validate="$repo/.ci/validate-deploy.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Each case is a bare copy of deploy/ (no repository around it), so only deploy/ is judged.
copy() { mkdir -p "$tmp/$1" && cp -R "$repo/deploy" "$tmp/$1/deploy"; }

# Replaces exactly one occurrence of a literal text in a file, or fails the test: a break that
# silently does not apply would make the case pass for the wrong reason.
break_file() {
  python3 - "$@" <<'PY'
import sys
path, old, new = sys.argv[1:4]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"test setup: expected exactly one {old!r} in {path}, found {text.count(old)}")
open(path, "w").write(text.replace(old, new))
PY
}

copy intact

copy replicas
break_file "$tmp/replicas/deploy/k8s/base/deployment.yaml" "  replicas: 1
" '  replicas: "two"
'

copy no-image
break_file "$tmp/no-image/deploy/k8s/base/deployment.yaml" "        - name: gate
          image: substrate-gate:0.1.0
" "        - name: gate
"

copy subpath
break_file "$tmp/subpath/deploy/k8s/base/deployment.yaml" "            - name: config
              mountPath: /etc/substrate-gate
              readOnly: true
            - name: gate-data
              mountPath: /var/lib/substrate-gate
            - name: gate-tmp
              mountPath: /tmp
        - name: store" "            - name: config
              mountPath: /etc/substrate-gate/gate.toml
              subPath: gate.toml
              readOnly: true
            - name: gate-data
              mountPath: /var/lib/substrate-gate
            - name: gate-tmp
              mountPath: /tmp
        - name: store"

cases=(intact replicas no-image subpath)

# With a built binary, a policy the gate itself refuses (schemas and TOML are fine) must fail too.
gate_bin=${SUBSTRATE_GATE_BIN:-}
for candidate in "$repo"/target/{debug,release}/substrate-gate; do
  [[ -z $gate_bin && -x $candidate ]] && gate_bin=$candidate
done
if [[ -n $gate_bin ]] && "$gate_bin" check-config --help >/dev/null 2>&1; then
  copy bad-policy
  break_file "$tmp/bad-policy/deploy/k8s/overlays/qdrant/gate.toml" "quarantine_threshold = 0.7" \
    "quarantine_threshold = 1.5"
  cases+=(bad-policy)
else
  echo "skip bad-policy: no substrate-gate binary with check-config (build the crate first)"
fi

# The runs are independent; run them side by side (the validator only serializes tool installs).
# check-config runs only where a case asks for it, so a developer's SUBSTRATE_GATE_BIN cannot leak in.
for c in "${cases[@]}"; do
  (
    rc=0
    if [[ $c == bad-policy ]]; then
      SUBSTRATE_GATE_BIN=$gate_bin "$validate" "$tmp/$c/deploy" >"$tmp/$c.out" 2>&1 || rc=$?
    else
      SUBSTRATE_GATE_CHECK_CONFIG=0 "$validate" "$tmp/$c/deploy" >"$tmp/$c.out" 2>&1 || rc=$?
    fi
    echo "$rc" >"$tmp/$c.rc"
  ) &
done
wait

failures=0
expect() {
  local case=$1 want_rc=$2 want_text=$3 rc
  rc=$(cat "$tmp/$case.rc")
  if [[ $rc != "$want_rc" ]]; then
    echo "FAIL $case: exit status $rc, expected $want_rc" >&2
    sed 's/^/    /' "$tmp/$case.out" >&2
    failures=$((failures + 1))
  elif ! grep -qF -- "$want_text" "$tmp/$case.out"; then
    echo "FAIL $case: output lacks: $want_text" >&2
    sed 's/^/    /' "$tmp/$case.out" >&2
    failures=$((failures + 1))
  else
    echo "ok   $case: exit $rc, reports: $want_text"
  fi
}

expect intact 0 "OK: $tmp/intact/deploy is valid"
expect replicas 1 "spec.replicas: 'two' is not of type 'integer'"
expect no-image 1 "container 'gate' has no image"
expect subpath 1 "mounts 'config' with subPath"
if [[ " ${cases[*]} " == *" bad-policy "* ]]; then
  expect bad-policy 1 "policies.default.quarantine_threshold: must be 0 to 1"
fi

if ((failures)); then
  echo "test_validate_broken: $failures case(s) failed" >&2
  exit 1
fi
echo "test_validate_broken: all ${#cases[@]} cases behave"
