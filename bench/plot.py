#!/usr/bin/env python3
"""plot.py - PNG charts and a markdown table from sbn-bench and torch_baseline JSON files.

  python3 bench/plot.py bench/results/sbn-bench.json bench/results/torch.json --out bench/results

reads the GPU-mode JSON of sbn-bench (paths coop, nccl, cudnn) and of torch_baseline.py
(paths torch_bn, torch_syncbn), in any number and order (a row seen twice: the later file
wins, with a warning), and writes into --out:

  shape_<id>.png            per shape, one panel per dtype x layout: median us of every path
                            at W = 1, forward and backward, with floor (a) and floor (b) drawn
                            (the coop row's, else the first row that has them)
  scaling_<dtype>_<layout>.png  per shape: coop and nccl-path us against W, with coop's
                            floor (a) (only when some row has W > 1)
  latency.png               the latency section: tiny and empty op, us against W
  summary.png               per shape (geometric mean over dtype x layout): t_path / t_coop
                            and coop's % of floor (a) and (b)
  results.md                the same numbers as tables: headline ratios per shape, forward and
                            backward per shape x dtype x layout, coop vs nccl-path per W,
                            latency, correctness

Ratios are t_path / t_coop on median times of the same shape, dtype, layout and W (> 1:
coop is faster), as sbn-bench prints them. The floors are read from each row (floor_a_us,
floor_b_us: sbn-bench defines them once, bench/floors.c, and torch_baseline.py takes them
from sbn-bench's JSON), never recomputed here; a row without them has none. % of floor =
floor / median time x 100 (pct_floor_a/b, or from the row's own floor and time).
Fields may be missing or null (a path that did not run, a failed row, an older file): such
cells say "-", and charts leave them out. Files whose mode is not "gpu" (sbn-bench's CPU
mode, torch_baseline's --device cpu dry run) are skipped unless --any-mode is given.

matplotlib is needed for the charts (pip install -r bench/requirements-plot.txt); without
it plot.py exits 77 and says so. --md-only writes results.md alone and needs no matplotlib.

Exit status: 0 written, 1 no usable rows or a file that cannot be read, 2 usage error,
77 matplotlib missing.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # its modules beside it, also when imported from elsewhere
    sys.path.insert(0, HERE)

from plot_charts import plot_latency, plot_scaling, plot_shape, plot_summary  # noqa: E402
from plot_data import load  # noqa: E402
from plot_md import write_markdown  # noqa: E402

EXIT_SKIP = 77


def main(argv=None):
    ap = argparse.ArgumentParser(description="Charts (PNG) and results.md from sbn-bench / "
                                             "torch_baseline GPU JSON files.")
    ap.add_argument("json", nargs="+", help="JSON files (sbn-bench --json, torch_baseline.py --json)")
    ap.add_argument("--out", required=True, help="output directory (created if missing)")
    ap.add_argument("--md-only", action="store_true", help="write results.md alone (no matplotlib)")
    ap.add_argument("--any-mode", action="store_true",
                    help="also use files whose mode is not 'gpu' (dry runs; for testing)")
    args = ap.parse_args(argv)
    plt = None
    if not args.md_only:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt  # noqa: F811
        except ImportError as e:
            print(f"plot.py: SKIP: matplotlib is not installed ({e}); install it with "
                  "'python3 -m pip install -r bench/requirements-plot.txt', or pass --md-only "
                  "for results.md alone", file=sys.stderr)
            return EXIT_SKIP
    data = load(args.json, args.any_mode)
    if not data.rows:
        print("plot.py: no usable rows in " + ", ".join(args.json), file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    written = []
    md = os.path.join(args.out, "results.md")
    write_markdown(data, md)
    written.append(md)
    if plt is not None:
        for sid in data.shapes():
            n = plot_shape(plt, data, sid, args.out)
            if n:
                written.append(n)
        written += plot_scaling(plt, data, args.out)
        for fn in (plot_latency, plot_summary):
            n = fn(plt, data, args.out)
            if n:
                written.append(n)
    for n in written:
        print(n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
