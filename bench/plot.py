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
                            latency, inference (sbn-bench's inference table), correctness
                            (every table's rows: a wrong inference value is a wrong value)

Ratios are t_path / t_coop on median times of the same shape, dtype, layout and W (> 1:
coop is faster), as sbn-bench prints them. The floors are read from each row (floor_a_us,
floor_b_us: sbn-bench defines them once, bench/floors.c, and torch_baseline.py takes them
from sbn-bench's JSON), never recomputed here; a row without them has none. % of floor =
floor / median time x 100 (pct_floor_a/b, or from the row's own floor and time).
Fields may be missing or null (a path that did not run, a failed row, an older file): such
cells say "-", and charts leave them out. Files whose mode is not "gpu" (sbn-bench's CPU
mode, torch_baseline's --device cpu dry run) are skipped unless --any-mode is given.

  python3 bench/plot.py --history bench/results --out bench/results [--md-only | --check]

indexes the GPU runs kept under a results directory instead (plot_history.py): its runs.tsv
names each run folder's main sbn-bench JSON, torch_baseline JSON and what ran; the headline
numbers (S5 fp32 NCHW forward / backward, S10 forward + backward, the empty op at W = 1 and
at the largest W, how many W = 1 cells coop is at or above cuDNN, PyTorch's S10) are read
from those files and written into --out (default: the results directory):

  README.md                 the index table, between <!-- history:begin --> and
                            <!-- history:end --> (the rest of the file is kept)
  history.png               the same numbers against the runs, in date/commit order

--check writes nothing: it exits 1, with a diff, when README.md's table is not what the
files give (0 when it is), and needs no matplotlib.

matplotlib is needed for the charts (pip install -r bench/requirements-plot.txt); without
it plot.py exits 77 and says so. --md-only writes results.md (or, with --history, README.md)
alone and needs no matplotlib.

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


def import_pyplot():
    """matplotlib.pyplot on the Agg backend, or EXIT_SKIP (said on stderr) without it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot.py: SKIP: matplotlib is not installed ({e}); install it with "
              "'python3 -m pip install -r bench/requirements-plot.txt', or pass --md-only "
              "for the markdown alone", file=sys.stderr)
        return EXIT_SKIP
    return plt


def history_main(args):
    """plot.py --history DIR: README.md's index table and history.png (plot_history.py)."""
    import plot_history as ph
    out = args.out or args.history
    try:
        hs = ph.history(args.history)
        if args.check:
            msg = ph.check_readme(hs, out)
            if msg:
                print(f"plot.py: {msg}", file=sys.stderr)
                print("plot.py: regenerate it with 'python3 bench/plot.py --history "
                      f"{args.history} --out {out}'", file=sys.stderr)
                return 1
            print(f"{os.path.join(out, 'README.md')}: the table is what the JSON files give "
                  f"({len(hs)} runs)")
            return 0
        plt = None if args.md_only else import_pyplot()
        if plt is EXIT_SKIP:
            return EXIT_SKIP
        os.makedirs(out, exist_ok=True)
        print(ph.write_readme(hs, out))
        if plt is not None:
            print(ph.plot_history(plt, hs, out))
    except ph.HistoryError as e:
        print(f"plot.py: --history: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description="Charts (PNG) and results.md from sbn-bench / "
                                             "torch_baseline GPU JSON files.")
    ap.add_argument("json", nargs="*", help="JSON files (sbn-bench --json, torch_baseline.py --json)")
    ap.add_argument("--out", help="output directory (created if missing; with --history, "
                                  "default: the results directory)")
    ap.add_argument("--md-only", action="store_true",
                    help="write results.md (with --history: README.md's table) alone (no matplotlib)")
    ap.add_argument("--any-mode", action="store_true",
                    help="also use files whose mode is not 'gpu' (dry runs; for testing)")
    ap.add_argument("--history", metavar="DIR",
                    help="index the runs of DIR (its runs.tsv) instead: README.md's table and history.png")
    ap.add_argument("--check", action="store_true",
                    help="with --history: write nothing, exit 1 if README.md's table is not "
                         "what the JSON files give")
    args = ap.parse_args(argv)
    if args.history is not None:
        if args.json or args.any_mode:
            ap.error("--history takes no JSON files and no --any-mode (runs.tsv names the files)")
        return history_main(args)
    if args.check:
        ap.error("--check goes with --history")
    if not args.json or not args.out:
        ap.error("JSON files and --out are required (or --history DIR)")
    plt = None if args.md_only else import_pyplot()
    if plt is EXIT_SKIP:
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
