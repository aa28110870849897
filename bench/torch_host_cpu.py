#!/usr/bin/env python3
"""Host time per call of syncbn.torch.SyncBatchNorm against nn.BatchNorm2d, on CPU.

A CPU team of one and tiny tensors (N=2, C=8, 4x4: the arithmetic is a few hundred
elements, so what is timed is the binding: Python, the dispatcher, autograd, the
allocations and the C call). It reports, it does not judge: per path and call kind the
median over rounds of the mean time per call (µs), and the ratio syncbn.torch / BatchNorm2d
of the same run. The paths run interleaved, round by round, so that drift of the machine
falls on all of them alike.

  paths:  bn        torch.nn.BatchNorm2d
          syncbn    syncbn.torch.SyncBatchNorm (eager calls: the operators' kernels and
                    autograd, without the dispatcher)
          syncbn_op the same layer's operator through the dispatcher (as torch.compile,
                    FX and fake tensors call it): torch.ops.syncbn.batch_norm_train
          bn_relu   nn.BatchNorm2d then nn.ReLU (a Sequential)
          syncbn_relu  SyncBatchNorm(activation="relu"): the fused operators
                    (syncbn::batch_norm_act_*), what convert_fused makes of bn_relu
  calls:  forward   training forward, input requiring grad (the autograd node is made)
          backward  y.backward(g) alone (the forward outside the timer)
          eval      eval forward (running statistics), no grad

Usage: python bench/torch_host_cpu.py [--rounds 15] [--calls 300] [--json FILE]
Needs syncbn importable (pip install ., or PYTHONPATH=python SYNCBN_LIBRARY=...).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

from torch_baseline_util import git_commit, json_path_unwritable  # beside this file (no torch in it)

# torch and syncbn are imported in main(), after the arguments are read: importing
# syncbn.torch may compile its C++ operators (~15-25 s on a cold cache), which --help and a
# bad argument should not wait for


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def copy_bandwidth():
    """Host copy bandwidth of this run (GB/s, 2 * bytes / time, median of 10 copies of
    64 MiB with torch's copy_ on one thread)."""
    import torch

    a = torch.empty(16 * 1024 * 1024)
    b = torch.empty_like(a)
    b.copy_(a)
    ts = []
    for _ in range(10):
        t0 = time.perf_counter()
        b.copy_(a)
        ts.append(time.perf_counter() - t0)
    return 2 * a.numel() * 4 / statistics.median(ts) / 1e9


def positive(text):
    """argparse type: an integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"'{text}': at least 1")
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=positive, default=15, help="rounds (>= 1; default 15)")
    ap.add_argument("--calls", type=positive, default=300, help="calls per path per round (>= 1; default 300)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.json and json_path_unwritable(args.json):  # before the run (exit 2)
        ap.error(f"--json '{args.json}': cannot be written")
    global torch, syncbn, sbt, _ops
    import torch
    import syncbn
    import syncbn.torch as sbt
    from syncbn import _ops
    operators = ("C++ operators" if _ops.NATIVE is not None
                 else f"Python operators (the fallback: {_ops.NATIVE_WHY})")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    comm = syncbn.cpu_team(1)[0]
    c = 8
    bn = torch.nn.BatchNorm2d(c)
    ours = sbt.SyncBatchNorm(c, comm=comm)
    x = (torch.randn(2, c, 4, 4) + 1).requires_grad_()
    g = torch.randn(2, c, 4, 4)

    def op_forward():
        return _ops.batch_norm_train(x, ours.weight, ours.bias, ours.running_mean, ours.running_var,
                                     ours.num_batches_tracked, ours.eps, ours.momentum, comm.id)[0]

    bn_relu = torch.nn.Sequential(torch.nn.BatchNorm2d(c), torch.nn.ReLU())
    ours_relu = sbt.SyncBatchNorm(c, comm=comm, activation="relu")
    modules = (bn, ours, bn_relu, ours_relu)
    layers = {"bn": bn, "syncbn": ours, "syncbn_op": op_forward, "bn_relu": bn_relu, "syncbn_relu": ours_relu}

    def forward_fn(path):
        m = layers[path]
        return m if path == "syncbn_op" else (lambda: m(x))

    def time_forward(path, n):
        f = forward_fn(path)
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        return (time.perf_counter() - t0) / n

    def time_backward(path, n):
        f = forward_fn(path)
        total = 0.0
        for _ in range(n):
            y = f()
            t0 = time.perf_counter()
            y.backward(g)
            total += time.perf_counter() - t0
        return total / n

    def time_eval(path, n):
        if path == "syncbn_op":
            rm, rv, w, b = ours.running_mean, ours.running_var, ours.weight, ours.bias

            def f():
                return _ops.batch_norm_infer(x, rm, rv, w, b, 1e-5)
        else:
            m = layers[path]

            def f():
                return m(x)
        for m in modules:
            m.eval()
        try:
            with torch.no_grad():
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                return (time.perf_counter() - t0) / n
        finally:
            for m in modules:
                m.train()

    kinds = {"forward": time_forward, "backward": time_backward, "eval": time_eval}
    paths = list(layers)
    for fn in kinds.values():  # warm up every path
        for p in paths:
            fn(p, 50)
    samples = {(k, p): [] for k in kinds for p in paths}
    for _ in range(args.rounds):
        for k, fn in kinds.items():
            for p in paths:
                samples[(k, p)].append(fn(p, args.calls) * 1e6)
    med = {key: statistics.median(v) for key, v in samples.items()}
    spread = {key: (min(v), max(v)) for key, v in samples.items()}
    bw = copy_bandwidth()
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git_commit(),
        "device": f"CPU: {cpu_model()} ({os.cpu_count()} cores), one torch thread",
        "driver": "none (CPU)",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "copy_bandwidth_GBps": round(bw, 1),
        "shape": [2, c, 4, 4],
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "operators": operators,
    }
    print(f"# torch_host_cpu  {info['date']}  commit {info['commit']}  torch {info['torch']}  "
          f"python {info['python']}")
    print(f"# {info['device']}; host copy bandwidth {bw:.1f} GB/s (2 x 64 MiB / median of 10)")
    print(f"# syncbn.torch on its {operators}")
    print(f"# a CPU team of one, x (2, {c}, 4, 4) fp32; median over {args.rounds} rounds of the mean of "
          f"{args.calls} calls (us per call; each round's, min and max, in the JSON)")
    print(f"{'call':10s}" + "".join(f"{p:>12s}" for p in paths) + f"{'syncbn/bn':>11s}{'op/bn':>7s}"
          f"{'relu: syncbn/bn':>17s}")
    rows = []
    for k in kinds:
        r = {p: round(med[(k, p)], 2) for p in paths}
        r["min_max"] = {p: [round(spread[(k, p)][0], 2), round(spread[(k, p)][1], 2)] for p in paths}
        ratio = med[(k, "syncbn")] / med[(k, "bn")]
        ratio_op = med[(k, "syncbn_op")] / med[(k, "bn")]
        ratio_relu = med[(k, "syncbn_relu")] / med[(k, "bn_relu")]
        rows.append({"call": k, **r, "ratio": round(ratio, 3), "ratio_op": round(ratio_op, 3),
                     "ratio_relu": round(ratio_relu, 3)})
        print(f"{k:10s}" + "".join(f"{med[(k, p)]:12.2f}" for p in paths) + f"{ratio:11.2f}{ratio_op:7.2f}"
              f"{ratio_relu:17.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "rows": rows}, f, indent=1)
    comm.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
