#!/usr/bin/env python3
"""The table of scripts/gpu-ab.sh: per row of sbn-bench's JSON (path, shape, dtype, layout,
W; the latency table's rows too: shapes "tiny" and "empty"; and the inference table's, as
path "<path>-inf" with the one op's time in the forward column), each variant's median
over its rounds of the run's median forward and backward times, and its ratio to the
first variant (< 1: faster than it).

usage: gpu_ab_table.py OUTDIR ROUNDS LABEL...
"""
import json
import statistics
import sys


def rows_of(path):
    try:
        with open(path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return {}, None
    out = {}
    for r in d.get("rows", []) + d.get("latency", []):
        if r.get("error") or r.get("us_fwd") is None:  # failed, or skipped (null times)
            continue
        key = (r["path"], r["shape"], r["dtype"], r["layout"], r["ranks"])
        out[key] = (r["us_fwd"], r["us_bwd"], r.get("kernel"))
    for r in d.get("inference", []):
        if r.get("error") or r.get("us_median") is None:
            continue
        key = (r["path"] + "-inf", r["shape"], r["dtype"], r["layout"], r["ranks"])
        out[key] = (r["us_median"], None, r.get("kernel"))
    return out, (d.get("copy_bandwidth") or {}).get("gbps")


def main():
    out, rounds, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    times = {l: {} for l in labels}
    bw = {l: [] for l in labels}
    for l in labels:
        for r in range(1, rounds + 1):
            rows, b = rows_of(f"{out}/{l}.r{r}.json")
            if b:
                bw[l].append(b)
            for k, v in rows.items():
                times[l].setdefault(k, []).append(v)
    keys = sorted({k for l in labels for k in times[l]})
    print("# medians over rounds of each run's median (us); ratio = t / t(" + labels[0] + ")")
    for l in labels:
        if bw[l]:
            print(f"# {l}: copy bandwidth {statistics.median(bw[l]):.1f} GB/s "
                  f"(median of {len(bw[l])} runs)")
    head = f"{'path':9} {'shape':5} {'dtype':5} {'layout':6} {'W':>2}"
    for l in labels:
        head += f" {l + ' fwd':>14} {'bwd':>12}"
    print(head)
    for k in keys:
        line = f"{k[0]:9} {k[1]:5} {k[2]:5} {k[3]:6} {k[4]:>2}"
        base = times[labels[0]].get(k)
        for l in labels:
            v = times[l].get(k)
            if not v:
                line += f" {'--':>14} {'--':>12}"
                continue
            f = statistics.median(x[0] for x in v)
            b = None if v[0][1] is None else statistics.median(x[1] for x in v)
            if base and l != labels[0]:
                f0 = statistics.median(x[0] for x in base)
                line += f" {f:8.1f}({f / f0:4.2f})"
                if b is None:
                    line += f" {'--':>12}"
                else:
                    b0 = statistics.median(x[1] for x in base)
                    line += f" {b:6.1f}({b / b0:4.2f})"
            else:
                line += f" {f:14.1f}" + (f" {'--':>12}" if b is None else f" {b:12.1f}")
        print(line)


if __name__ == "__main__":
    main()
