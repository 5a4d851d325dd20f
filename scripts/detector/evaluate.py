#!/usr/bin/env python3
"""Out-of-fold calibration and the evaluation report of the learned injection detector.

    evaluate.py split WORKDIR              oof_records.jsonl -> oof_F.jsonl per fold
    evaluate.py calibrate WORKDIR          oof_scores_F.jsonl -> thresholds.json (Platt scaling
                                           of the logit, and the hold and warn thresholds)
    evaluate.py info WORKDIR MODEL         what the report says of the data and the model
    evaluate.py golden-texts WORKDIR       a fixed sample of training texts -> golden_records.jsonl
    evaluate.py golden WORKDIR OUT         their scores by the final model -> OUT (a unit test
                                           checks the kernel reproduces every logit bit for bit)
    evaluate.py report WORKDIR OUT.md CMD  held-out and out-of-fold scores -> the report

"Held back" is a kernel decision that keeps the record from the store (quarantine, block,
require_review, defer, escalate, repair). For the model alone, a record is held when its best
window's probability reaches the hold threshold; a rule alone holds it when the kernel with
the model switched off does.
"""
import collections
import json
import math
import os
import sys

FOLDS = 5
HELD = {"quarantine", "block", "require_review", "defer", "escalate", "repair"}
WARNED = {"allow_with_warning", "mark_untrusted"}
# The operating point: the lowest hold threshold that flags at most this share of each benign
# family out of fold, and the warning threshold at a looser share.
HOLD_MAX_FLAGGED = {"writers": 0.015, "harvest": 0.0075}
WARN_MAX_FLAGGED = {"writers": 0.04, "harvest": 0.02}


def jl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]


def dump(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def split(w):
    recs, meta = jl(os.path.join(w, "oof_records.jsonl")), jl(os.path.join(w, "oof_meta.jsonl"))
    for f in range(FOLDS):
        dump(os.path.join(w, f"oof_{f}.jsonl"), [r for r, m in zip(recs, meta) if m["fold"] == f])
        dump(os.path.join(w, f"oof_{f}_meta.jsonl"), [m for m in meta if m["fold"] == f])


def oof(w):
    rows = []
    for f in range(FOLDS):
        for s, m in zip(jl(os.path.join(w, f"oof_scores_{f}.jsonl")), jl(os.path.join(w, f"oof_{f}_meta.jsonl"))):
            rows.append((s, m))
    return rows


def family(m):
    return "harvest" if m["writer"] == "harvest" else "writers"


def threshold_at(ps, share):
    """The lowest threshold, in steps of 0.0001, that flags at most `share` of `ps` (p >= t)."""
    ps = sorted(ps, reverse=True)
    k = int(share * len(ps))
    if k >= len(ps):
        return 0.0
    # Flag at most the k highest: a threshold just above the (k+1)-th highest.
    return min(1.0, math.floor(ps[k] * 1e4 + 1) / 1e4)


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, x))))


def calibrate(w):
    """Platt scaling of the best window's logit (classes balanced), then the thresholds on the
    calibrated probability. Out of fold: every score comes from a model that did not see it."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    rows = oof(w)
    logits = np.array([s["logit"] if s["logit"] is not None else -30.0 for s, _ in rows])
    y = np.array([m["label"] == "attack" for _, m in rows], dtype=np.int8)
    lr = LogisticRegression(C=1e6, class_weight="balanced", max_iter=1000).fit(logits.reshape(-1, 1), y)
    a, b = float(lr.coef_[0, 0]), float(lr.intercept_[0])
    benign = collections.defaultdict(list)
    for (s, m), z in zip(rows, logits):
        if m["label"] == "benign":
            benign[family(m)].append(sigmoid(a * z + b))
    hold = max(threshold_at(benign[k], v) for k, v in HOLD_MAX_FLAGGED.items())
    warn = min(hold, max(threshold_at(benign[k], v) for k, v in WARN_MAX_FLAGGED.items()))
    json.dump({"hold": hold, "warn": warn, "a": a, "b": b}, open(os.path.join(w, "thresholds.json"), "w"))
    print(f"calibrate: logit scale {a:.4f}, shift {b:.4f}; hold {hold}, warn {warn}", file=sys.stderr)


def pct(a, b):
    return f"{100.0 * a / b:.1f}%" if b else "n/a"


class Tally:
    def __init__(self):
        self.n = 0
        self.rules = self.model = self.both = self.warned = 0

    def add(self, rules, model, both, warned):
        self.n += 1
        self.rules += rules
        self.model += model
        self.both += both
        self.warned += warned


def outcomes(s, hold, kernel=True, calibration=None):
    """(held by rules alone, by the model alone, by both as the kernel combines them, warned).
    Out-of-fold scores come from fold models written before calibration: `calibration` (a, b)
    maps their logit as the final model's is mapped."""
    rules = s["rules"] in HELD
    if calibration is None:
        p = s["p"] or 0.0
    else:
        p = sigmoid(calibration[0] * s["logit"] + calibration[1]) if s["logit"] is not None else 0.0
    model = p >= hold
    both = s["both"] in HELD if kernel else (rules or model)
    warned = (not both) and (s["both"] in WARNED if kernel else False)
    return rules, model, both, warned


def table(title, groups, label, note=""):
    out = [f"### {title}", ""]
    if note:
        out += [note, ""]
    verb = "held back" if label == "attack" else "flagged (held)"
    out.append(f"| group | records | rules alone {verb} | model alone | rules and model (the kernel) |")
    out.append("|---|---:|---:|---:|---:|")
    for g, t in groups:
        if t.n:
            out.append(f"| {g} | {t.n} | {pct(t.rules, t.n)} | {pct(t.model, t.n)} | **{pct(t.both, t.n)}** |")
    out.append("")
    return out


def report(w, out_path, command):
    th = json.load(open(os.path.join(w, "thresholds.json")))
    hold, warn = th["hold"], th["warn"]
    cal = (th["a"], th["b"])
    held_s, held_m = jl(os.path.join(w, "heldout_scores.jsonl")), jl(os.path.join(w, "heldout_meta.jsonl"))
    info = json.load(open(os.path.join(w, "info.json")))
    L = ["# Learned injection detector: evaluation report", "",
         f"Generated by `{command}` from `tests/detector_corpus`; do not edit by hand.", "",
         f"Model `models/injection.sgim`, sha256 `{info['digest']}`: {info['features']}.",
         f"Training: {info['train_docs']} documents ({info['train_poisoned']} poisoned, {info['train_benign']} benign), "
         f"{info['train_windows']} windows.",
         f"Thresholds (the best window's probability, Platt-calibrated), set out of fold on training data only: **hold {hold}**, warn {warn}. "
         "A record is held when its best window reaches the hold threshold; between warn and hold it is admitted with "
         "a warning.", "",
         "Records are scored as a low-trust source (`retrieved_document`, trust 0.2) writing into a RAG store, "
         "through the whole kernel: rules alone (learned detector off), the model alone (its best window over "
         "every reading of the record: text, hidden and decoded parts, metadata), and both as the kernel combines them.",
         ""]

    # Held-out: per set.
    sets = collections.OrderedDict()
    for s, m in zip(held_s, held_m):
        key = m["writer"]
        sets.setdefault(key, {"attack": Tally(), "benign": Tally()})
        sets[key][m["label"]].add(*outcomes(s, hold))
    roles = info.get("heldout_roles", {})
    L += ["## Held-out sets (never trained on)", "",
          "| set | writer | attacks | held back: rules / model / **both** | benign | held: rules / model / **both** | benign admitted with a warning or as untrusted (both) |",
          "|---|---|---:|---|---:|---|---:|"]
    tot = {"attack": Tally(), "benign": Tally()}
    fresh = {"attack": Tally(), "benign": Tally()}
    for k, v in sets.items():
        a, b = v["attack"], v["benign"]
        L.append(f"| {k} | {roles.get(k, '')} | {a.n} | {pct(a.rules, a.n)} / {pct(a.model, a.n)} / **{pct(a.both, a.n)}** | "
                 f"{b.n} | {pct(b.rules, b.n)} / {pct(b.model, b.n)} / **{pct(b.both, b.n)}** | {pct(b.warned, b.n)} |")
        for total, writers in ((tot, info.get("new_writers", [])), (fresh, info.get("fresh_writers", []))):
            if k in writers:
                for lab in ("attack", "benign"):
                    t, into = v[lab], total[lab]
                    into.n += t.n; into.rules += t.rules; into.model += t.model; into.both += t.both; into.warned += t.warned
    for title, total in (("writers not in training, together", tot),
                         ("of them, sets no setting was ever chosen with (" + ", ".join(info.get("fresh_writers", [])) + ")", fresh)):
        a, b = total["attack"], total["benign"]
        if a.n + b.n:
            L.append(f"| **{title}** | | {a.n} | {pct(a.rules, a.n)} / {pct(a.model, a.n)} / **{pct(a.both, a.n)}** | "
                     f"{b.n} | {pct(b.rules, b.n)} / {pct(b.model, b.n)} / **{pct(b.both, b.n)}** | {pct(b.warned, b.n)} |")
    L.append("")

    new = [(s, m) for s, m in zip(held_s, held_m) if m["writer"] in info.get("new_writers", [])]
    for dim, title in (("intent", "by intent"), ("carrier", "by carrier"), ("form", "by form"),
                       ("length", "short records and long documents"), ("position", "by position of the injection"),
                       ("lang", "by language")):
        for label in ("attack", "benign"):
            if label == "benign" and dim in ("intent", "form", "position"):
                continue
            groups = collections.defaultdict(Tally)
            for s, m in new:
                if m["label"] != label:
                    continue
                g = m.get(dim) or "(none)"
                if dim == "lang" and g != "en":
                    g = "not English"
                groups[g].add(*outcomes(s, hold))
            L += table(f"Held-out, writers not in training: {'attacks' if label == 'attack' else 'benign records'} {title}",
                       sorted(groups.items(), key=lambda kv: -kv[1].n), label)

    # Out of fold: leave one writer out.
    rows = oof(w)
    L += ["## Leave one writer out (training data, out of fold)", "",
          "Each training writer's records scored by a model trained without that writer's fold "
          "(folds group whole writers; harvested text is split by source). Composed poisons put the "
          "writer's own injections into its own carriers or into harvested text. **both** here is "
          "held by either, before the phrase rules' corroboration threshold (its own table follows).", "",
          "| writer | poisoned | held back: rules / model / **both** | benign | flagged: rules / model / **both** |",
          "|---|---:|---|---:|---|"]
    by_w = collections.OrderedDict()
    for s, m in sorted(rows, key=lambda r: r[1]["writer"]):
        by_w.setdefault(m["writer"], {"attack": Tally(), "benign": Tally()})
        by_w[m["writer"]][m["label"]].add(*outcomes(s, hold, kernel=False, calibration=cal))
    for k, v in by_w.items():
        a, b = v["attack"], v["benign"]
        L.append(f"| {k} | {a.n} | {pct(a.rules, a.n)} / {pct(a.model, a.n)} / **{pct(a.both, a.n)}** | "
                 f"{b.n} | {pct(b.rules, b.n)} / {pct(b.model, b.n)} / **{pct(b.both, b.n)}** |")
    L.append("")
    kinds = collections.defaultdict(Tally)
    for s, m in rows:
        if m["label"] == "attack":
            kinds[m["kind"] + (" in metadata" if m.get("position") == "metadata" else "")].add(
                *outcomes(s, hold, kernel=False, calibration=cal))
    L += table("Out of fold, poisoned records by kind", sorted(kinds.items()), "attack",
               "`short`: an injection alone; `composed`: an injection placed into a carrier document; `record`: whole records.")
    L += corroboration_sweep(rows, hold, cal)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write("\n".join(L) + "\n")
    print(f"report: {out_path}", file=sys.stderr)


# Reason codes of the rules-alone decision that a phrase rule's uncorroborated order leaves
# without holding power: the order itself, the risk it raised, and findings that only warn.
SOFT_CODES = {"prompt_injection_imperative", "risk_above_quarantine_threshold", "risk_above_block_threshold",
              "pii_email", "pii_phone", "url_unknown_host", "policy_claim_language", "authority_claim",
              "source_laundering"}
CORROBORATION_DEFAULT = 0.4


def corroboration_sweep(rows, hold, cal):
    """How the phrase rules' corroboration threshold trades recall for benign records flagged,
    out of fold on the training writers, each writer weighted the same. A record counts as held
    when the model holds it, or the rules alone hold it and either the model's window reaches
    the threshold, or an exact rule (the classic override, a planted tool call or command) matched, or a finding other than a
    phrase-rule order (a secret, hidden text, a control token) is among the reasons."""
    L = ["### Phrase rules and the model: the corroboration threshold, out of fold", "",
         "A phrase rule's order (`prompt_injection_imperative`) holds a record only when the model's best "
         "window reaches `corroboration_threshold`, unless the rule is exact (the classic override, a planted tool call or command). Per training writer (each weighted the same), recall and "
         "benign records flagged, and recall minus four times the benign rate, the objective the default "
         f"({CORROBORATION_DEFAULT}) was chosen by:", "",
         "| threshold | recall | benign flagged | objective |", "|---:|---:|---:|---:|"]
    for floor in [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, hold]:
        by = collections.defaultdict(lambda: [0, 0, 0, 0])
        for s, m in rows:
            if m["writer"] == "harvest":
                continue
            p = sigmoid(cal[0] * s["logit"] + cal[1]) if s["logit"] is not None else 0.0
            rules = s["rules"] in HELD and (floor == 0.0 or p >= floor or s.get("exact")
                                            or not set(s["rules_codes"]) <= SOFT_CODES)
            held = p >= hold or rules
            b = by[m["writer"]]
            if m["label"] == "attack":
                b[0] += 1
                b[1] += held
            else:
                b[2] += 1
                b[3] += held
        rec = [b[1] / b[0] for b in by.values() if b[0]]
        ben = [b[3] / b[2] for b in by.values() if b[2]]
        r, f = 100 * sum(rec) / len(rec), 100 * sum(ben) / len(ben)
        name = f"{floor:g}" + (" (= hold)" if floor == hold else "") + (" **default**" if floor == CORROBORATION_DEFAULT else "")
        L.append(f"| {name} | {r:.1f}% | {f:.2f}% | {r - 4 * f:.1f} |")
    L.append("")
    return L


# Held-out sets by writer: written by writers who wrote no training data, or held out by file
# from a writer who also wrote training records.
NEW_WRITERS = ["w06", "w07", "w08", "w12", "w43", "w44", "w45", "w46", "w53", "w54", "w55", "w56", "w59"]
# Of those, the sets that were never measured while a setting (threshold, exact rules, the
# network's size) was being chosen: the most honest figure. Sets move out of this list once a
# choice looks at them; the network beside the linear model was chosen looking at every set
# before w55, the network's gate and the looser hold share with every set before w56, and the
# rule that a quoted classic override needs the model's backing with w59 (its first measurement,
# before that rule: 90.0% of attacks held back at 6.2% of benign records held).
FRESH_WRITERS = ["w56"]
HELDOUT_ROLES = {
    "w06": "not in training", "w07": "not in training", "w08": "not in training", "w12": "not in training",
    "w43": "not in training", "w44": "not in training", "w45": "not in training", "w46": "not in training",
    "w53": "not in training", "w54": "not in training", "w55": "not in training",
    "w56": "not in training", "w59": "not in training",
    "w09": "held out by file (writer in training)", "w11": "held out by file (writer in training)",
    "harvest": "sources not in training",
}


def info(w, model_path):
    import hashlib
    meta = jl(os.path.join(w, "train_meta.jsonl"))
    log = open(os.path.join(w, "featurize.log")).read()
    windows = int(log.split(" documents, ")[1].split(" windows")[0])
    out = {
        "digest": hashlib.sha256(open(model_path, "rb").read()).hexdigest(),
        "features": "word 1-3-grams and character 3-6-grams hashed into 2^20 int16 weights (linear), "
                    "and a 32-unit ReLU network over the same features in 2^18 int8 rows, added to the "
                    "linear logit for windows past the linear gate",
        "train_docs": len(meta),
        "train_poisoned": sum(m["label"] == "attack" for m in meta),
        "train_benign": sum(m["label"] == "benign" for m in meta),
        "train_windows": windows,
        "new_writers": NEW_WRITERS,
        "fresh_writers": FRESH_WRITERS,
        "heldout_roles": HELDOUT_ROLES,
    }
    json.dump(out, open(os.path.join(w, "info.json"), "w"), indent=1)


GOLDEN_EVERY = 2500


def golden_texts(w):
    docs = jl(os.path.join(w, "train_docs.jsonl"))
    texts = ["".join(p["t"] for p in d["parts"]) for d in docs[::GOLDEN_EVERY]]
    dump(os.path.join(w, "golden_records.jsonl"), [{"text": t} for t in texts])


def golden(w, out):
    texts = jl(os.path.join(w, "golden_records.jsonl"))
    scores = jl(os.path.join(w, "golden_scores.jsonl"))
    dump(out, [{"text": t["text"], "logit": s["logit"]} for t, s in zip(texts, scores)])


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "split":
        split(sys.argv[2])
    elif cmd == "calibrate":
        calibrate(sys.argv[2])
    elif cmd == "golden-texts":
        golden_texts(sys.argv[2])
    elif cmd == "golden":
        golden(sys.argv[2], sys.argv[3])
    elif cmd == "info":
        info(sys.argv[2], sys.argv[3])
    elif cmd == "report":
        report(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(f"unknown command {cmd}")
