#!/usr/bin/env python3
"""Host time per call of syncbn.torch.SyncBatchNorm against nn.BatchNorm2d, on CPU or a GPU.

A team of one and tiny tensors (N=2, C=8, 4x4 by default: the arithmetic is a few hundred
elements, so what is timed is the binding: Python, the dispatcher, autograd, the
allocations, the C call and, on a GPU, the launches). It reports, it does not judge: per
path and call kind the median over rounds of the mean time per call (us), and the ratio
syncbn.torch / BatchNorm2d of the same run. The paths run interleaved, round by round, so
that drift of the machine falls on all of them alike (a GPU host that slows down during a
run moves every path's rounds together; torch_baseline.py times each path's row apart).

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

--device cpu (default): a CPU team of one (syncbn.cpu_team(1)), one torch thread.
--device cuda: an NCCL team of one on cuda:0 (syncbn.nccl_team), the tensors on it. What is
timed is the host's part of a call (the launches enqueued, not waited for: the device is
synchronized after each batch of calls, outside the timer); the backward's includes the
autograd engine's hand-over to the device's thread and the wait for it, for every path
alike. Exit 77 (and why) where there is no CUDA device; 1 (and why) where syncbn cannot make
a team on it (a library built without CUDA or NCCL: on a GPU machine, a broken install).

Usage: python bench/torch_host.py [--device cpu|cuda] [--dtype fp32|bf16|fp16]
       [--layout NCHW|NHWC] [--shape N,C,H,W] [--rounds 15] [--calls 300] [--json FILE]
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

from torch_baseline_util import (copy_us, cuda_driver_version, git_commit,  # no torch in them
                                 json_path_unwritable, nvidia_driver)

# torch and syncbn are imported in main(), after the arguments are read: importing
# syncbn.torch may compile its C++ operators (~15-25 s on a cold cache), which --help and a
# bad argument should not wait for

EXIT_SKIP = 77
DTYPES = ("fp32", "bf16", "fp16")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def copy_bandwidth(dev):
    """Copy bandwidth of this run (GB/s, 2 * bytes / time, median of 10 copies with torch's
    copy_): 64 MiB on one thread on the host; 256 MiB device to device, CUDA events, on a GPU."""
    a = torch.empty((256 if dev.type == "cuda" else 64) * 1024 * 1024 // 4, device=dev)
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / copy_us(torch, b, a, 10, 1) / 1e3


def positive(text):
    """argparse type: an integer >= 1."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"'{text}': at least 1")
    return v


def shape4(text):
    """argparse type: N,C,H,W, each >= 1 (N*H*W >= 2: one value per channel is refused in
    training, by nn.BatchNorm2d as by the layer)."""
    try:
        v = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not N,C,H,W") from None
    if len(v) != 4 or min(v) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': four integers >= 1, N,C,H,W")
    if v[0] * v[2] * v[3] < 2:
        raise argparse.ArgumentTypeError(f"'{text}': N*H*W must be at least 2 (one value per channel in training)")
    return v


def make_team(dev):
    """(a syncbn team of one for dev, or None), why not."""
    if dev.type == "cpu":
        return syncbn.cpu_team(1)[0], None
    torch.cuda.set_device(dev)
    try:
        return syncbn.nccl_team(syncbn.nccl_unique_id(), 1, 0), None
    except syncbn.SyncBNError as e:  # a library built without CUDA or NCCL, or no device it can use
        return None, f"syncbn cannot make a team on {dev}: {e}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu (a CPU team of one; default) or cuda (an NCCL team of one on cuda:0)")
    ap.add_argument("--dtype", choices=DTYPES, default="fp32", help="x's dtype (parameters fp32); default fp32")
    ap.add_argument("--layout", choices=("NCHW", "NHWC"), default="NCHW",
                    help="NCHW (contiguous; default) or NHWC (channels_last)")
    ap.add_argument("--shape", type=shape4, default=(2, 8, 4, 4), help="N,C,H,W (default 2,8,4,4)")
    ap.add_argument("--rounds", type=positive, default=15, help="rounds (>= 1; default 15)")
    ap.add_argument("--calls", type=positive, default=300, help="calls per path per round (>= 1; default 300)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    if args.json and json_path_unwritable(args.json):  # before the run (exit 2)
        ap.error(f"--json '{args.json}': cannot be written")
    global torch, syncbn, sbt, _ops
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():  # before syncbn.torch's build
        print("torch_host: skipped: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return EXIT_SKIP
    import syncbn
    dev = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    comm, why = make_team(dev)  # before syncbn.torch, which may compile its operators first
    if comm is None:
        print(f"torch_host: {why}", file=sys.stderr)
        return 1
    import syncbn.torch as sbt
    from syncbn import _ops
    operators = ("C++ operators" if _ops.NATIVE is not None
                 else f"Python operators (the fallback: {_ops.NATIVE_WHY})")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    n, c, h, w = args.shape
    td = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    mf = torch.channels_last if args.layout == "NHWC" else torch.contiguous_format
    bn = torch.nn.BatchNorm2d(c).to(dev)
    ours = sbt.SyncBatchNorm(c, comm=comm).to(dev)
    x = (torch.randn(n, c, h, w) + 1).to(dev, td).contiguous(memory_format=mf).requires_grad_()
    g = torch.randn(n, c, h, w).to(dev, td).contiguous(memory_format=mf)

    def op_forward():
        return _ops.batch_norm_train(x, ours.weight, ours.bias, ours.running_mean, ours.running_var,
                                     ours.num_batches_tracked, ours.eps, ours.momentum, comm.id)[0]

    bn_relu = torch.nn.Sequential(torch.nn.BatchNorm2d(c), torch.nn.ReLU()).to(dev)
    ours_relu = sbt.SyncBatchNorm(c, comm=comm, activation="relu").to(dev)
    modules = (bn, ours, bn_relu, ours_relu)
    layers = {"bn": bn, "syncbn": ours, "syncbn_op": op_forward, "bn_relu": bn_relu, "syncbn_relu": ours_relu}

    def forward_fn(path):
        m = layers[path]
        return m if path == "syncbn_op" else (lambda: m(x))

    def per_call(f, k):  # host seconds per call of k calls of f, the device idle before and after
        sync()
        t0 = time.perf_counter()
        for _ in range(k):
            f()
        t = (time.perf_counter() - t0) / k
        sync()
        return t

    def time_forward(path, k):
        return per_call(forward_fn(path), k)

    def time_backward(path, k):
        f = forward_fn(path)
        total = 0.0
        for _ in range(k):
            y = f()
            t0 = time.perf_counter()
            y.backward(g)
            total += time.perf_counter() - t0
        sync()
        return total / k

    def time_eval(path, k):
        if path == "syncbn_op":
            rm, rv, wt, b = ours.running_mean, ours.running_var, ours.weight, ours.bias

            def f():
                return _ops.batch_norm_infer(x, rm, rv, wt, b, 1e-5)
        else:
            m = layers[path]

            def f():
                return m(x)
        for m in modules:
            m.eval()
        try:
            with torch.no_grad():
                return per_call(f, k)
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
    bw = copy_bandwidth(dev)
    drv = nvd = None
    if cuda:
        drv, nvd = cuda_driver_version(), nvidia_driver()
        device = f"{torch.cuda.get_device_name(dev)} (cuda:0), host CPU: {cpu_model()}, one torch thread"
        driver = (f"NVIDIA driver {nvd or 'unknown'}, CUDA driver API "
                  + (f"{drv // 1000}.{drv % 1000 // 10}" if drv else "unknown"))
        copy_what = "device-to-device copy of 256 MiB, CUDA events"
    else:
        device = f"CPU: {cpu_model()} ({os.cpu_count()} cores), one torch thread"
        driver = "none (CPU)"
        copy_what = "host copy of 64 MiB, one thread"
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git_commit(),
        "device": device,
        "driver": driver,
        "nvidia_driver": nvd,
        "driver_version": drv,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "copy_bandwidth_GBps": round(bw, 1),
        "copy_bandwidth_what": copy_what,
        "team": "an NCCL team of one (syncbn.nccl_team)" if cuda else "a CPU team of one (syncbn.cpu_team)",
        "shape": [n, c, h, w],
        "dtype": args.dtype,
        "layout": args.layout,
        "rounds": args.rounds,
        "calls_per_round": args.calls,
        "operators": operators,
    }
    print(f"# torch_host  {info['date']}  commit {info['commit']}  torch {info['torch']}  "
          f"python {info['python']}")
    print(f"# {info['device']}; {driver}; copy bandwidth {bw:.1f} GB/s (2 x bytes / median of 10, {copy_what})")
    print(f"# syncbn.torch on its {operators}, {info['team']}")
    print(f"# x ({n}, {c}, {h}, {w}) {args.dtype} {args.layout}; median over {args.rounds} round{'s' if args.rounds > 1 else ''} of the mean of "
          f"{args.calls} calls (us per call of host time; each round's, min and max, in the JSON)")
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
