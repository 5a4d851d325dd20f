#!/usr/bin/env bash
# Copies the repository's filter packs (filters/*.toml) into the Kubernetes overlays that ship
# them. Kustomize reads no file outside its own directory tree, so each overlay carries a copy;
# .ci/validate-deploy.sh fails while a copy differs from its source. Run after changing filters/.
set -euo pipefail
deploy=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$deploy/.." && pwd)
status=0
for copy in "$deploy"/k8s/overlays/*/filters/*.toml; do
  [[ -e $copy ]] || continue
  src="$repo/filters/$(basename "$copy")"
  if [[ ! -f $src ]]; then
    echo "sync-filter-packs: no $src for ${copy#"$repo/"}" >&2
    status=1
    continue
  fi
  if ! cmp -s "$src" "$copy"; then
    cp "$src" "$copy"
    echo "updated ${copy#"$repo/"} from filters/$(basename "$copy")"
  fi
done
exit $status
