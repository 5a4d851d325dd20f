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

Beside it, on the same windows and weights, a network with one hidden ReLU layer over the same
features (each bucket's low NET_BITS bits; scikit-learn's MLPClassifier, Adam, seeded). The
model's logit is the linear one plus the network's, the network's scaled so both spread the
same over clean windows. The network's rows are quantized to int8 with one scale. The kernel
consults the network only for windows whose linear logit reaches a gate (the linear logit above
which GATE_SHARE of the clean training windows lie): below it a window is far from any
threshold, and the two-stage reading keeps the kernel's cost close to the linear model's.
"""
import argparse
import json
import os
import struct
import sys
import warnings

import numpy as np
from scipy import sparse
from sklearn.linear_model import SGDClassifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier

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
NET_BITS = 18
NET_HIDDEN = 32
NET_EPOCHS = 3
NET_ALPHA = 1e-6
NET_LEARNING_RATE = 2e-3
NET_BATCH = 4096
GATE_SHARE = 0.03


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


def fit_net(X, y, w):
    net = MLPClassifier(hidden_layer_sizes=(NET_HIDDEN,), activation="relu", solver="adam",
                        alpha=NET_ALPHA, batch_size=NET_BATCH, learning_rate_init=NET_LEARNING_RATE,
                        max_iter=NET_EPOCHS, shuffle=True, random_state=0, tol=0,
                        n_iter_no_change=NET_EPOCHS + 1)
    with warnings.catch_warnings():
        # A fixed number of epochs is the point: it does not "converge".
        warnings.simplefilter("ignore", ConvergenceWarning)
        net.fit(X, y, sample_weight=w)
    return net


def net_logit(net, X):
    h = np.maximum(X @ net.coefs_[0] + net.intercepts_[0], 0)
    return (h @ net.coefs_[1]).ravel() + net.intercepts_[1][0]


def quantize(a, top):
    a = np.asarray(a, dtype=np.float64)
    scale = float(np.abs(a).max()) / top if np.abs(a).max() > 0 else 1.0
    return np.clip(np.rint(a / scale), -top, top), scale


def write_model(path, coef, bias, spec, hold, warn, net=None):
    """`net`: (rows [2^bits x hidden], hidden biases, output weights, gate) in the final logit's
    units (format 2), or None (format 1)."""
    q, scale = quantize(coef, 32767)
    with open(path, "wb") as f:
        f.write(b"SGIM")
        f.write(struct.pack("<5I", 1 if net is None else 2, *spec))
        f.write(struct.pack("<4d", float(bias), scale, hold, warn))
        f.write(q.astype("<i2").tobytes())
        if net is not None:
            rows, b1, out, gate = net
            rq, row_scale = quantize(rows, 127)
            bits = rows.shape[0].bit_length() - 1
            f.write(struct.pack("<2I2d", bits, rows.shape[1], row_scale, float(gate)))
            f.write(np.asarray(b1, dtype="<f8").tobytes())
            f.write(np.asarray(out, dtype="<f8").tobytes())
            f.write(rq.astype("<i1").tobytes())


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
    del indptr, indices, values  # the full matrix: memory for the network's copy
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
    lin = model.decision_function(X)
    # The network: the same windows and weights, each bucket's low NET_BITS bits.
    Xn = sparse.csr_matrix((X.data, X.indices & ((1 << NET_BITS) - 1), X.indptr),
                           shape=(X.shape[0], 1 << NET_BITS))
    Xn.sum_duplicates()
    windows = X.shape[0]
    del X  # the linear copy is done with: memory for the network's fit
    net = fit_net(Xn, y, w)
    nl = net_logit(net, Xn)
    neg = y == 0
    mix = float(lin[neg].std() / nl[neg].std())
    gate = float(np.quantile(lin[neg], 1.0 - GATE_SHARE))
    # Final logit = A * (linear + mix * network) + B, A and B the calibration: the linear
    # part keeps the constants, the gate is moved into the same units.
    A, B = a.calibration
    const = A * (model.intercept_[0] + mix * net.intercepts_[1][0]) + B
    gate_final = A * (gate - model.intercept_[0]) + const
    write_model(a.out, A * coef, const, a.spec, a.hold, a.warn,
                net=(net.coefs_[0], net.intercepts_[0], A * mix * net.coefs_[1].ravel(), gate_final))
    print(f"train: {windows} windows ({int(y.sum())} injected, {int(hard.sum())} hard negatives); "
          f"network {NET_BITS} bits x {NET_HIDDEN}, mix {mix:.4f}, gate {gate:.4f} -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
