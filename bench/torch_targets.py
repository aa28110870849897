#!/usr/bin/env python3
"""torch_targets.py - syncbn.torch's targets (issue 49), row by row, from a GPU run's files.

    python3 bench/torch_targets.py TORCH_JSON BENCH_JSON

TORCH_JSON: torch_baseline.py --json (paths syncbn_torch and/or syncbn_torch_op, with
torch_syncbn and torch_bn_module beside them); BENCH_JSON: sbn-bench --json of the same run
(its coop rows of ranks 1: the C op). For each row of the layer (syncbn_torch) and of its
operators called directly (syncbn_torch_op), forward and backward:

  gpu   the GPU time (median) at most 1.1 x the C op's coop row of the same shape, dtype,
        layout and epilogue + 2 us
  seq   faster than nn.SyncBatchNorm's op sequence (torch_syncbn) of the same row
  host  the host time (median) at most nn.BatchNorm2d's (torch_bn_module) of the same row

A cell without its comparison row reads '-' and counts for neither side; a row that failed or
had wrong values is no comparison (on either side, the C op's too). Rows whose host
reference (torch_baseline's host_ref_us) was above its slow factor x the run's median are
marked 'slow host'. A report: exit 0 whatever it finds, 2 on a file it cannot read. No torch.
"""

import json
import sys

from torch_baseline_util import host_ref_slow  # beside this file (no torch in it)

GPU_FACTOR, GPU_SLACK_US = 1.1, 2.0
SYNCBN_PATHS = ("syncbn_torch", "syncbn_torch_op")


def cell_key(r):
    return (r.get("shape"), r.get("dtype"), r.get("layout"), r.get("epilogue") or "none")


def valid(r):
    """A row whose times count: it ran (no error) and its values were right."""
    return r.get("error") is None and not r.get("wrong")


def median_us(r, op, col="us_median"):
    o = (r or {}).get(op)
    v = o.get(col) if isinstance(o, dict) else None
    return v if isinstance(v, (int, float)) and v > 0 else None


def judge(rows, coop, slow_factor=None, median_ref=None):
    """The verdicts: a list of dicts (path, key, op, values, gpu/seq/host True/False/None,
    slow) for every syncbn row of `rows` (torch_baseline's), coop: {cell_key: sbn-bench row}."""
    by = {}
    for r in rows:
        if valid(r):
            by.setdefault(cell_key(r), {})[r.get("path")] = r
    out = []
    for key, paths in by.items():
        for path in SYNCBN_PATHS:
            r = paths.get(path)
            if r is None:
                continue
            ref = r.get("host_ref_us")
            slow = host_ref_slow(ref, median_ref, slow_factor)
            for op in ("fwd", "bwd"):
                t = median_us(r, op)
                c = median_us(coop.get(key), op)
                seq = median_us(paths.get("torch_syncbn"), op)
                h = median_us(r, op, "host_us_median")
                hm = median_us(paths.get("torch_bn_module"), op, "host_us_median")
                bound = GPU_FACTOR * c + GPU_SLACK_US if c is not None else None
                out.append({
                    "path": path, "key": key, "op": op, "us": t, "coop_us": c, "bound_us": bound,
                    "seq_us": seq, "host_us": h, "module_host_us": hm, "slow": slow,
                    "gpu": None if t is None or bound is None else t <= bound,
                    "seq": None if t is None or seq is None else t < seq,
                    "host": None if h is None or hm is None else h <= hm,
                })
    return out


def counts(verdicts, path, op):
    """{target: (met, judged)} of one path and op."""
    res = {}
    for t in ("gpu", "seq", "host"):
        v = [x[t] for x in verdicts if x["path"] == path and x["op"] == op and x[t] is not None]
        res[t] = (sum(v), len(v))
    return res


def load(path, tool):
    with open(path, encoding="utf-8") as f:
        top = json.load(f)
    if not isinstance(top, dict) or not isinstance(top.get("rows"), list) or \
            (tool and top.get("tool") != tool):
        raise ValueError(f"{path}: not a {tool or 'torch_baseline'} --json file")
    return top


def fmt(v):
    return "-" if v is None else f"{v:.1f}"


def mark(v):
    return "-" if v is None else ("ok" if v else "MISS")


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        torch_top = load(argv[0], None)
        bench_top = load(argv[1], "sbn-bench")
    except (OSError, ValueError) as e:
        print(f"torch_targets: {e}", file=sys.stderr)
        return 2
    coop = {cell_key(r): r for r in bench_top["rows"]
            if r.get("path") == "coop" and r.get("ranks") == 1 and valid(r)}
    h = torch_top.get("host_ref") or {}
    v = judge(torch_top["rows"], coop, h.get("slow_factor"), h.get("median_us"))
    print(f"# syncbn.torch's targets: {argv[0]} against the C op of {argv[1]}")
    print(f"# gpu: time <= {GPU_FACTOR} x coop + {GPU_SLACK_US:g} us; seq: time < torch_syncbn's; "
          "host: host time <= torch_bn_module's; '-': no row to compare with")
    print("# %-15s %-4s %-4s %-4s %-8s %3s | %8s %8s %8s %4s | %8s %4s | %8s %8s %4s" % (
        "path", "shp", "dt", "lay", "epi", "op", "us", "coop", "bound", "gpu", "seq us", "seq",
        "host", "module", "host"))
    for x in v:
        k = x["key"]
        print("  %-15s %-4s %-4s %-4s %-8s %3s | %8s %8s %8s %4s | %8s %4s | %8s %8s %4s%s" % (
            x["path"], k[0], k[1], k[2], k[3], x["op"], fmt(x["us"]), fmt(x["coop_us"]),
            fmt(x["bound_us"]), mark(x["gpu"]), fmt(x["seq_us"]), mark(x["seq"]), fmt(x["host_us"]),
            fmt(x["module_host_us"]), mark(x["host"]), "  slow host" if x["slow"] else ""))
    for path in SYNCBN_PATHS:
        if not any(x["path"] == path for x in v):
            continue
        for op in ("fwd", "bwd"):
            c = counts(v, path, op)
            print(f"# {path} {op}: " + ", ".join(f"{t} {m} of {n}" for t, (m, n) in c.items()))
    nslow = len({(x["path"], x["key"]) for x in v if x["slow"]})
    if nslow:
        print(f"# {nslow} row(s) ran on a slowed host (host reference above "
              f"{h.get('slow_factor')}x the run's median)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
