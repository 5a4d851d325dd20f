#!/usr/bin/env python3
"""Fits the learned injection detector on the windows `detector-lab featurize` wrote.

    python3 scripts/detector/train.py WORKDIR fit --out MODEL [--exclude-fold F] [--hold P --warn P]

Reads WORKDIR/train.{indptr,indices,values,rows} and WORKDIR/train_meta.jsonl. A window is a
positive when it is mostly injected text, a negative when it is clean; windows that only touch
an injection are left out. Logistic regression fitted by averaged stochastic gradient descent
(seeded, so the same data gives the same bytes) on the hashed features: the positives weighted
to half the negatives' total weight, the hard benign look-alikes weighted up, then one round of
hard negatives (the clean windows the first fit scores highest are weighted up and the model
is fitted again). Weights are quantized to int16 with one scale, as the kernel reads them.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
from scipy import sparse
from sklearn.linear_model import SGDClassifier

ALPHA = 3e-7
EPOCHS = 8
POSITIVE_SHARE = 0.5
LOOKALIKE_WEIGHT = 10.0
HARD_NEGATIVE_QUANTILE = 0.995
HARD_NEGATIVE_WEIGHT = 4.0
# A hard negative's weight after the boost is at most this: a look-alike that is already
# weighted up is not multiplied again, or quoted attack strings in security writing would teach
# the model that the attack string itself is benign.
HARD_NEGATIVE_CAP = LOOKALIKE_WEIGHT


def load(workdir):
    indptr = np.fromfile(os.path.join(workdir, "train.indptr"), dtype="<u8").astype(np.int64)
    indices = np.fromfile(os.path.join(workdir, "train.indices"), dtype="<u4").astype(np.int32)
    values = np.fromfile(os.path.join(workdir, "train.values"), dtype="<f4")
    rows = np.fromfile(os.path.join(workdir, "train.rows"), dtype=np.dtype([("doc", "<u4"), ("label", "u1"), ("pair", "u1"), ("pad", "<u2")]))
    with open(os.path.join(workdir, "train_meta.jsonl"), encoding="utf-8") as f:
        meta = [json.loads(l) for l in f]
    folds = np.array([m["fold"] for m in meta], dtype=np.int32)
    lookalike = np.array([m["kind"] == "lookalike" for m in meta])
    return indptr, indices, values, rows, folds, lookalike


def fit(X, y, w):
    model = SGDClassifier(loss="log_loss", alpha=ALPHA, max_iter=EPOCHS, tol=None, average=True,
                          random_state=0)
    model.fit(X, y, sample_weight=w)
    return model


def weights_for(y):
    w = np.ones(len(y), dtype=np.float64)
    pos = y == 1
    if pos.any():
        w[pos] = POSITIVE_SHARE * (~pos).sum() / pos.sum()
    return w


def write_model(path, coef, bias, spec, hold, warn):
    coef = np.asarray(coef, dtype=np.float64)
    scale = float(np.abs(coef).max()) / 32767.0 if np.abs(coef).max() > 0 else 1.0
    q = np.clip(np.rint(coef / scale), -32767, 32767).astype("<i2")
    with open(path, "wb") as f:
        f.write(b"SGIM")
        f.write(struct.pack("<5I", 1, *spec))
        f.write(struct.pack("<4d", float(bias), scale, hold, warn))
        f.write(q.tobytes())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec", type=int, nargs=4, default=(20, 3, 6, 3),
                    metavar=("BITS", "CHAR_MIN", "CHAR_MAX", "WORD_MAX"),
                    help="the features featurize used (the model file records them)")
    ap.add_argument("--exclude-fold", type=int, default=None)
    ap.add_argument("--hold", type=float, default=0.9)
    ap.add_argument("--warn", type=float, default=0.5)
    ap.add_argument("--calibration", type=float, nargs=2, default=(1.0, 0.0), metavar=("A", "B"),
                    help="Platt scaling: the model's logit becomes A * logit + B")
    a = ap.parse_args()

    indptr, indices, values, rows, folds, lookalike = load(a.workdir)
    X = sparse.csr_matrix((values, indices, indptr), shape=(len(rows), 1 << a.spec[0]))
    keep = rows["label"] != 2
    if a.exclude_fold is not None:
        keep &= folds[rows["doc"]] != a.exclude_fold
    X = X[np.flatnonzero(keep)]
    y = (rows["label"][keep] == 1).astype(np.int8)
    w = weights_for(y)
    w[lookalike[rows["doc"][keep]]] *= LOOKALIKE_WEIGHT
    model = fit(X, y, w)
    # Hard negatives: the clean windows scored highest get more weight, then fit again.
    margin = model.decision_function(X)
    neg = y == 0
    cut = np.quantile(margin[neg], HARD_NEGATIVE_QUANTILE)
    hard = neg & (margin >= cut)
    w[hard] = np.minimum(w[hard] * HARD_NEGATIVE_WEIGHT, np.maximum(w[hard], HARD_NEGATIVE_CAP))
    model = fit(X, y, w)
    coef = model.coef_.ravel()
    scale_a, shift_b = a.calibration
    write_model(a.out, scale_a * coef, scale_a * model.intercept_[0] + shift_b, a.spec, a.hold, a.warn)
    print(f"train: {X.shape[0]} windows ({int(y.sum())} injected, {int(hard.sum())} hard negatives) -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
