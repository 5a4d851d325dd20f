"""Summarises a Schemathesis NDJSON event report: test cases and HTTP status codes per documented
operation and phase, so a run shows that it reached the success paths (2xx) and not only the
error paths. Usage: python3 scripts/schemathesis_summary.py REPORT.ndjson OPENAPI.json"""

from __future__ import annotations

import collections
import json
import re
import sys


def templates(openapi: dict) -> list[tuple[str, re.Pattern[str], str]]:
    out = []
    for path, item in openapi.get("paths", {}).items():
        rx = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]*", re.escape(path)) + "$")
        for method in item:
            if method in ("get", "post", "put", "patch", "delete"):
                out.append((method.upper(), rx, path))
    # Literal segments before parameters: longest template first.
    out.sort(key=lambda t: -len(t[2]))
    return out


def main() -> int:
    report, spec = sys.argv[1], sys.argv[2]
    with open(spec) as f:
        ops = templates(json.load(f))
    per_op: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    phases: collections.Counter[str] = collections.Counter()
    total = 0
    with open(report) as f:
        for line in f:
            event = json.loads(line)
            finished = event.get("ScenarioFinished")
            if not finished:
                continue
            interactions = (finished.get("recorder") or {}).get("interactions") or {}
            for inter in interactions.values():
                req = inter.get("request") or {}
                resp = inter.get("response") or {}
                method = req.get("method", "?")
                uri = req.get("uri", "")
                path = re.sub(r"^[a-z]+://[^/]+", "", uri).split("?")[0]
                label = f"{method} (undocumented) {path[:40]}"
                for m, rx, template in ops:
                    if m == method and rx.match(path):
                        label = f"{method} {template}"
                        break
                per_op[label][str(resp.get("status_code", "no response"))] += 1
                phases[finished.get("phase", "?")] += 1
                total += 1
    print(f"schemathesis summary: {total} requests")
    for phase, n in sorted(phases.items()):
        print(f"  phase {phase:<10} {n:>6} requests")
    documented = sorted(k for k in per_op if "(undocumented)" not in k)
    other = sum(sum(v.values()) for k, v in per_op.items() if "(undocumented)" in k)
    for label in documented:
        counts = ", ".join(f"{s}: {n}" for s, n in sorted(per_op[label].items()))
        print(f"  {label:<48} {counts}")
    if other:
        print(f"  (methods/paths not documented, probed for 404/405) {other} requests")
    untested = [f"{m} {t}" for m, _, t in ops if f"{m} {t}" not in per_op]
    if untested:
        print(f"  NOT TESTED: {', '.join(untested)}")
    no_success = [k for k in documented if not any(s.startswith("2") for s in per_op[k])]
    if no_success:
        print(f"  never answered 2xx: {', '.join(no_success)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
