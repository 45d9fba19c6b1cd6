#!/usr/bin/env python3
"""Hit ratio where compression matters (issue 42, acceptance 4): a ring a third the size of the
data, under a Zipf workload, with --compression none and zstd.

The keys are the HTML pages of Debian's package documentation (bench/compression.py's corpus,
pages of at most 64 KiB), each under several keys so that the set is a few MiB. Each run
starts a fresh larder whose ring (--volume-count x --volume-size) is a third of the keys'
bytes, memory tier off, and sends GETs by a Zipf law over the keys (the same seeded sequence
for every setting); a miss is filled with a PUT, as a cache in front of an origin would be.
The hit ratio is counted over the requests after a warm-up of the same length.

usage: target/python/bin/python bench/compression-hits.py [--requests 20000] [--zipf 0.9]
       [--copies 6] [--out bench/results/issue42-hits.md]
"""

from __future__ import annotations

import argparse
import bisect
import http.client
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
compression = __import__("compression")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOLUMES = 16


def run(binary: str, data: str, args: list, keys: list, sequence: list) -> tuple:
    ring = sum(len(v) for _, v in keys) // 3
    volume = max(64 << 10, ring // VOLUMES)
    l = compression.Larder(binary, data, ["--memory-capacity", "0", "--max-value-size", "64KiB"] + args,
                           ring=["--volume-count", str(VOLUMES), "--volume-size", str(volume)])
    c = http.client.HTTPConnection("127.0.0.1", l.http, timeout=30)
    hits = counted = 0
    warm = len(sequence) // 2
    for n, k in enumerate(sequence):
        name, body = keys[k]
        c.request("GET", name)
        r = c.getresponse()
        got = r.read()
        if r.status == 200:
            if got != body:
                sys.exit(f"{name}: other bytes")
            hits += n >= warm
        else:
            c.request("PUT", name, body=body)
            p = c.getresponse()
            p.read()
            if p.status != 200:
                sys.exit(f"PUT {name}: {p.status}")
        counted += n >= warm
    st = l.stats()
    c.close()
    l.stop()
    return hits / counted, st["bytes_used"], ring, st["volumes_evicted"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--larder", default=os.path.join(ROOT, "target/release/larder"))
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--zipf", type=float, default=0.9)
    ap.add_argument("--copies", type=int, default=6)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/issue42-hits.md"))
    a = ap.parse_args()
    pages = [b for _, b in compression.corpus("html", 400) if len(b) <= 64 << 10]
    keys = [(f"/doc/{c}/{i}", body) for c in range(a.copies) for i, body in enumerate(pages)]
    rnd = random.Random(42)
    order = list(range(len(keys)))
    rnd.shuffle(order)  # popularity independent of size
    weights = [1 / (r + 1) ** a.zipf for r in range(len(keys))]
    cdf, total = [], 0.0
    for w in weights:
        total += w
        cdf.append(total)
    sequence = [order[bisect.bisect_left(cdf, rnd.random() * total)] for _ in range(a.requests)]
    tmp = tempfile.mkdtemp(prefix="larder-compression-hits-")
    rows = []
    try:
        for setting, args in (("none", []), ("zstd", ["--compression", "zstd"]), ("lz4", ["--compression", "lz4"])):
            ratio, used, ring, evicted = run(a.larder, os.path.join(tmp, setting), args, keys, sequence)
            rows.append((setting, ratio, used, evicted))
            shutil.rmtree(os.path.join(tmp, setting))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    data = sum(len(v) for _, v in keys)
    md = [f"{time.strftime('%Y-%m-%d')}: {len(keys)} keys ({len(pages)} pages of Debian's package documentation, "
          f"each under {a.copies} keys), {data:,} bytes; ring {VOLUMES} volumes, a third of that; memory tier off; "
          f"{a.requests} GETs by a Zipf law (s = {a.zipf}), a miss filled by a PUT; hit ratio over the second half.", "",
          "| compression | hit ratio | bytes_used at the end | volumes the ring overwrote |", "|---|---|---|---|"]
    md += [f"| {s} | {r:.3f} | {u:,} | {e} |" for s, r, u, e in rows]
    base = rows[0][1]
    md += ["", "Hit ratio against none's: " + ", ".join(f"{s} {r / base:.2f}x" for s, r, _, _ in rows[1:]) + "."]
    text = "\n".join(md) + "\n"
    print(text)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
