#!/usr/bin/env python3
"""The largest batch a route allows, through the gate into a real Chroma: the gate's peak
memory, the batch's time, the latency of small writes sent beside it (against the same small
writes with no batch running), and the gate's database bytes per judged record.

    cargo build --release --bin substrate-gate
    python3 benches/batch_memory.py [--records 5461] [--batches 1] [--gate target/release/substrate-gate]

With `--batches K`, K batches of that size are sent at once (each on its own connection): the
gate's `limits.proxy_records_in_flight` (one batch at the cap by default) bounds how many are
handled together, and the others wait their turn (up to the body deadline, 30 s).

Needs `chroma` (pip install -r tests/e2e/requirements.txt). Peak memory is the gate process's
VmHWM from /proc (Linux); the batch's records are tiny (3-dimension embeddings, short
documents), the shape that costs the gate most per byte.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from conftest import _wait_http_ok, _wait_tcp, free_port, gate_config  # noqa: E402

API = "/api/v2/tenants/default_tenant/databases/default_database"


def rss_kib(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def small_writes(url, stop, latencies, prefix):
    i = 0
    s = requests.Session()
    while not stop.is_set():
        body = {"ids": [f"{prefix}{i}"], "embeddings": [[0.3, 0.2, 0.1]],
                "documents": [f"small note {i}: the depot opens at six"], "metadatas": None, "uris": None}
        t = time.perf_counter()
        r = s.post(url, json=body, timeout=120)
        latencies.append((time.perf_counter() - t) * 1000)
        assert r.status_code in (200, 201), r.text
        i += 1
        time.sleep(0.02)


def db_bytes(tmp):
    """The gate's SQLite database as a reader sees it (its pages, the write-ahead log's
    included): page count times page size."""
    import sqlite3
    con = sqlite3.connect(f"file:{tmp / 'gate.db'}?mode=ro", uri=True)
    try:
        return con.execute("PRAGMA page_count").fetchone()[0] * con.execute("PRAGMA page_size").fetchone()[0]
    finally:
        con.close()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=5461)
    ap.add_argument("--batches", type=int, default=1)
    ap.add_argument("--gate", default=str(REPO / "target/release/substrate-gate"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="batch-memory-"))
    procs = []
    try:
        cport, api, proxy, metrics = free_port(), free_port(), free_port(), free_port()
        log = open(tmp / "chroma.log", "wb")
        chroma = subprocess.Popen([shutil.which("chroma") or "chroma", "run", "--host", "127.0.0.1", "--port",
                                   str(cport), "--path", str(tmp / "chroma")], stdout=log, stderr=subprocess.STDOUT)
        procs.append(chroma)
        _wait_http_ok(f"http://127.0.0.1:{cport}/api/v2/heartbeat", chroma, tmp / "chroma.log", "chroma")
        (tmp / "gate.toml").write_text(gate_config(tmp, api, proxy, metrics, cport))
        glog = open(tmp / "gate.log", "wb")
        gate = subprocess.Popen([a.gate, "serve", "--config", str(tmp / "gate.toml")], stdout=glog,
                                stderr=subprocess.STDOUT, env={**os.environ, "RUST_LOG": "warn"})
        procs.append(gate)
        _wait_tcp(proxy, gate, tmp / "gate.log", "gate")
        base = f"http://127.0.0.1:{proxy}{API}"
        coll = requests.post(f"http://127.0.0.1:{cport}{API}/collections", json={"name": "bench"}).json()["id"]
        url = f"{base}/collections/{coll}/add"

        # Small writes alone: the baseline.
        stop, alone = threading.Event(), []
        t = threading.Thread(target=small_writes, args=(url, stop, alone, "alone-"))
        t.start()
        time.sleep(5)
        stop.set()
        t.join()
        idle = rss_kib(gate.pid, "VmRSS")
        db_before = db_bytes(tmp)

        # The batches, with small writes beside them: straight into Chroma (the baseline, a
        # collection of its own), then through the gate.
        n, k = a.records, a.batches

        def batch(target, j, out):
            body = {"ids": [f"b{j}-{i}" for i in range(n)], "embeddings": [[0.1, 0.2, 0.3]] * n,
                    "documents": [f"catalogue {j} entry {i}: part {1000 + i}" for i in range(n)],
                    "metadatas": [{"i": i} for i in range(n)], "uris": None}
            t0 = time.perf_counter()
            r = requests.post(target, json=body, timeout=600)
            out.append((r.status_code, time.perf_counter() - t0))

        def run(target):
            stop, beside, results = threading.Event(), [], []
            t = threading.Thread(target=small_writes, args=(target, stop, beside, "beside-"))
            t.start()
            time.sleep(0.5)
            start = time.perf_counter()
            batches = [threading.Thread(target=batch, args=(target, j, results)) for j in range(k)]
            for b in batches:
                b.start()
            for b in batches:
                b.join()
            took = time.perf_counter() - start
            time.sleep(0.5)
            stop.set()
            t.join()
            return results, took, beside

        direct_coll = requests.post(f"http://127.0.0.1:{cport}{API}/collections", json={"name": "direct"}).json()["id"]
        d_results, d_took, d_beside = run(f"http://127.0.0.1:{cport}{API}/collections/{direct_coll}/add")
        results, took, beside = run(url)
        peak = rss_kib(gate.pid, "VmHWM")
        after = rss_kib(gate.pid, "VmRSS")
        grown = db_bytes(tmp) - db_before
        for name, res, all_in in (("straight into Chroma", d_results, d_took), ("through the gate", results, took)):
            print(f"{k} batch(es) of {n} records at once, {name}: HTTP {sorted(c for c, _ in res)}, "
                  f"each in {', '.join(f'{d:.2f}' for _, d in sorted(res, key=lambda x: x[1]))} s, all in {all_in:.2f} s")
        print(f"gate database grew {grown / 1e6:.1f} MB with the batches and the small writes beside them: "
              f"{grown / (n * k + len(beside)) / 1024:.1f} KiB per judged record")
        print(f"gate memory: {idle / 1024:.0f} MiB after small writes, peak {peak / 1024:.0f} MiB, "
              f"{after / 1024:.0f} MiB resident after the batches (the kernel's decision cache keeps up to "
              f"16,384 decisions)")
        for name, xs in (("alone, through the gate", alone), ("beside the batches, straight into Chroma", d_beside),
                         ("beside the batches, through the gate", beside)):
            print(f"small writes {name}: n={len(xs)} p50 {statistics.median(xs):.1f} ms, "
                  f"p99 {pct(xs, 0.99):.1f} ms, max {max(xs):.1f} ms")
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
