#!/usr/bin/env python3
"""Composes the detector's training documents and evaluation records from
tests/detector_corpus (see its README for the layout and the taxonomy).

Training writers wrote injections and clean carrier documents apart; every injection is used
alone (a record written straight into a store) and placed into several carriers at a random
position with a random separator, so the model learns the injection rather than the carrier.
Each composed poison keeps its carrier as a benign control. Encoded wrappers get a real
encoding of another injection of the same writer. Everything is seeded: same corpus, same bytes.

Writes, under the output directory (default target/detector):
  train_docs.jsonl   documents for `detector-lab featurize` ({"parts": [{"t", "inj"}]})
  train_meta.jsonl   one line per training document: writer, fold, label, kind, taxonomy
  oof_records.jsonl  training records to score out of fold ({"text", "metadata"})
  oof_meta.jsonl     their writer, fold, label and taxonomy
  heldout_records.jsonl, heldout_meta.jsonl   the held-out sets, never trained on
"""
import base64
import codecs
import glob
import gzip
import hashlib
import json
import os
import random
import re
import sys
import urllib.parse

SEED = 20261127
FOLDS = 5
PLACEMENTS_PER_INJECTION = 7
CARRIER_FROM_HARVEST = 0.35
HARVEST_OOF = 6000  # harvested documents scored out of fold (a sample; all are trained on)
SEPARATORS = [" ", " ", "\n", "\n", "\n\n", "\n\n", "  ", "\n \n", " \n"]

ROOT = "tests/detector_corpus"


def read_jsonl(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]


def fold_of(key):
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % FOLDS


def sentence_bounds(text):
    """Offsets where a sentence or line starts (0 included), for placing an injection."""
    bounds = [0]
    for m in re.finditer(r"(?<=[.!?。！？])\s+|\n+", text):
        if 0 < m.end() < len(text):
            bounds.append(m.end())
    return sorted(set(bounds))


def encode(rng, text):
    kind = rng.choices(["base64", "rot13", "hex", "reversed", "url"], [6, 1.5, 1, 0.5, 1])[0]
    if kind == "base64":
        return base64.b64encode(text.encode()).decode()
    if kind == "rot13":
        return codecs.encode(text, "rot13")
    if kind == "hex":
        return text.encode().hex()
    if kind == "reversed":
        return text[::-1]
    return urllib.parse.quote(text)


class Composer:
    def __init__(self, root, out):
        self.root, self.out = root, out
        self.rng = random.Random(SEED)
        self.train_docs, self.train_meta = [], []
        self.oof_records, self.oof_meta = [], []

    def doc(self, parts, meta, oof=True, metadata=None):
        parts = [p for p in parts if p["t"]]
        self.train_docs.append({"parts": parts})
        self.train_meta.append(meta)
        if oof:
            text = "".join(p["t"] for p in parts)
            if metadata is not None:
                # The injection sits in the record's metadata; the text is the carrier only.
                text = "".join(p["t"] for p in parts if not p["inj"])
            self.oof_records.append({"text": text, "metadata": metadata or {}})
            self.oof_meta.append(meta)

    def run(self):
        harvest = self.load_harvest()
        carriers_pool = [h for h in harvest if 200 <= len(h["text"]) <= 2400 and h["genre"] != "ui_strings"]
        writers = sorted(d for d in os.listdir(os.path.join(self.root, "train"))
                         if re.fullmatch(r"w\d+", d) and os.path.isdir(os.path.join(self.root, "train", d)))
        for i, w in enumerate(writers):
            self.compose_writer(w, i % FOLDS, carriers_pool)
        for i, path in enumerate(sorted(glob.glob(os.path.join(self.root, "train", "records", "*.jsonl")))):
            w = os.path.basename(path)[:-6]
            for r in read_jsonl(path):
                meta = {"writer": w, "fold": (i + 2) % FOLDS, "label": r["label"], "kind": "record",
                        "intent": r.get("intent", r.get("family", "")), "carrier": r.get("carrier", ""),
                        "form": r.get("form", ""), "lang": r.get("lang", "")}
                md = r.get("metadata") or None
                if md and r["label"] == "attack":
                    # The injection is in the metadata: the model reads its string values.
                    values = "\n".join(str(v) for v in md.values() if isinstance(v, (str, int, float)))
                    self.train_docs.append({"parts": [{"t": values, "inj": True}]})
                    self.train_meta.append(meta)
                    self.oof_records.append({"text": r["text"], "metadata": md})
                    self.oof_meta.append(meta)
                    continue
                self.doc([{"t": r["text"], "inj": r["label"] == "attack"}], meta, metadata=md)
        self.rng.shuffle(harvest)
        for j, h in enumerate(harvest):
            meta = {"writer": "harvest", "fold": fold_of(h["source_group"]), "label": "benign",
                    "kind": "harvest", "carrier": h["genre"], "lang": h["lang"], "intent": "", "form": ""}
            self.doc([{"t": h["text"], "inj": False}], meta, oof=j < HARVEST_OOF)
        self.write()

    def load_harvest(self):
        recs = read_jsonl(os.path.join(self.root, "train", "benign_harvest.jsonl.gz"))
        for r in recs:
            src = r["source"]
            r["source_group"] = re.split(r"[/:]", src)[3] if src.startswith("/usr/share/") else src.split(":")[0] + ":" + os.path.basename(src)[:24]
        return recs

    def compose_writer(self, w, fold, harvest_carriers):
        base = os.path.join(self.root, "train", w)
        injections = read_jsonl(os.path.join(base, "injections.jsonl"))
        carriers = read_jsonl(os.path.join(base, "carriers.jsonl"))
        lookalikes = read_jsonl(os.path.join(base, "lookalikes.jsonl"))
        plain_en = [x["text"] for x in injections if x.get("form") == "plain" and x.get("lang") == "en"] or \
                   [x["text"] for x in injections]
        rng = self.rng
        for c in carriers:
            self.doc([{"t": c["text"], "inj": False}],
                     {"writer": w, "fold": fold, "label": "benign", "kind": "carrier",
                      "carrier": c.get("carrier", ""), "lang": c.get("lang", ""), "intent": "", "form": ""})
        for l in lookalikes:
            self.doc([{"t": l["text"], "inj": False}],
                     {"writer": w, "fold": fold, "label": "benign", "kind": "lookalike",
                      "carrier": l.get("genre", ""), "lang": l.get("lang", ""), "intent": "", "form": ""})
        for x in injections:
            text = x["text"]
            if "{ENCODED}" in text:
                text = text.replace("{ENCODED}", encode(rng, rng.choice(plain_en)))
            tax = {"intent": x.get("intent", ""), "form": x.get("form", ""), "lang": x.get("lang", "")}
            self.doc([{"t": text, "inj": True}],
                     dict(writer=w, fold=fold, label="attack", kind="short", carrier="", position="whole", **tax))
            for _ in range(PLACEMENTS_PER_INJECTION):
                if carriers and rng.random() >= CARRIER_FROM_HARVEST:
                    c = rng.choice(carriers)
                    ctext, cgenre = c["text"], c.get("carrier", "")
                else:
                    c = rng.choice(harvest_carriers)
                    ctext, cgenre = c["text"], c["genre"]
                position = rng.choice(["start", "middle", "end", "middle", "metadata"] if rng.random() < 0.12
                                      else ["start", "middle", "end", "middle"])
                meta = dict(writer=w, fold=fold, label="attack", kind="composed", carrier=cgenre,
                            position=position, **tax)
                if position == "metadata":
                    key = rng.choice(["note", "description", "comment", "summary", "title", "author_note"])
                    self.doc([{"t": ctext, "inj": False}], meta, oof=True,
                             metadata={"source": rng.choice(["import", "crawler", "upload", "sync"]), key: text})
                    # The injection alone is a training document already (kind short).
                    continue
                bounds = sentence_bounds(ctext)
                if position == "start":
                    at = 0
                elif position == "end":
                    at = len(ctext)
                else:
                    inner = [b for b in bounds if 0 < b < len(ctext)]
                    at = rng.choice(inner) if inner else len(ctext) // 2
                    if not inner:
                        sp = ctext.find(" ", at)
                        at = sp + 1 if sp >= 0 else len(ctext)
                sep1, sep2 = rng.choice(SEPARATORS), rng.choice(SEPARATORS)
                pre, post = ctext[:at].rstrip(), ctext[at:].lstrip()
                parts = [{"t": pre + (sep1 if pre else ""), "inj": False}, {"t": text, "inj": True},
                         {"t": (sep2 if post else "") + post, "inj": False}]
                self.doc(parts, meta)

    def write(self):
        os.makedirs(self.out, exist_ok=True)

        def dump(name, rows):
            with open(os.path.join(self.out, name), "w", encoding="utf-8") as f:
                for r in rows:
                    f.write(json.dumps(r, ensure_ascii=False) + "\n")
        dump("train_docs.jsonl", self.train_docs)
        dump("train_meta.jsonl", self.train_meta)
        dump("oof_records.jsonl", self.oof_records)
        dump("oof_meta.jsonl", self.oof_meta)
        held, held_meta = [], []
        for path in sorted(glob.glob(os.path.join(self.root, "heldout", "*.jsonl"))):
            w = os.path.basename(path)[:-6]
            for r in read_jsonl(path):
                held.append({"text": r["text"], "metadata": r.get("metadata") or {}})
                held_meta.append({"writer": w, "label": r["label"], "kind": "record",
                                  "intent": r.get("intent", r.get("family", "")), "carrier": r.get("carrier", ""),
                                  "form": r.get("form", ""), "lang": r.get("lang", ""),
                                  "position": r.get("position", ""), "length": r.get("length", "")})
        for r in read_jsonl(os.path.join(self.root, "heldout", "benign_harvest.jsonl.gz")):
            held.append({"text": r["text"], "metadata": {}})
            held_meta.append({"writer": "harvest", "label": "benign", "kind": "harvest", "carrier": r["genre"],
                              "lang": r["lang"], "intent": "", "form": "", "position": "", "length": ""})
        dump("heldout_records.jsonl", held)
        dump("heldout_meta.jsonl", held_meta)
        n_att = sum(m["label"] == "attack" for m in self.train_meta)
        print(f"compose: {len(self.train_docs)} training documents ({n_att} poisoned, "
              f"{len(self.train_docs) - n_att} benign); {len(self.oof_records)} out-of-fold records; "
              f"{len(held)} held-out records", file=sys.stderr)


if __name__ == "__main__":
    Composer(ROOT, sys.argv[1] if len(sys.argv) > 1 else "target/detector").run()
