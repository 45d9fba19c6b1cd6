"""Medians of the runs bench/lib.sh's wrk_run appended to a results file.

Each line is "WORKLOAD TARGET req/s p50 p99", latencies as wrk prints them (us, ms, s).
"""
import statistics


def ms(v):
    for unit, f in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if v.endswith(unit):
            return float(v[: -len(unit)]) * f
    return float(v)


def medians(path):
    """{(workload, target): (req/s, p50 ms, p99 ms)}, medians over the rounds."""
    runs = {}
    for line in open(path):
        w, t, rps, p50, p99 = line.split()
        runs.setdefault((w, t), []).append((float(rps), ms(p50), ms(p99)))
    return {k: tuple(statistics.median(col) for col in zip(*v)) for k, v in runs.items()}
