#!/usr/bin/env python3
"""torch_baseline.py - what PyTorch users get today, timed the way sbn-bench times syncbn.

For every shape of bench/shapes.tsv x dtype (fp32, bf16) x layout (NCHW = contiguous,
NHWC = channels_last) it times two paths on GPU 0, W = 1 rank:

  torch_bn      torch.nn.functional.batch_norm(training=True) (affine, running stats,
                eps 1e-5, momentum 0.1) and its backward alone: torch.autograd.grad of
                (x, weight, bias) on a graph kept with retain_graph=True. No sync: the
                speed of plain BatchNorm (PyTorch picks cuDNN or its own kernels).
  torch_syncbn  the op sequence of torch.nn.SyncBatchNorm (torch/nn/modules/_functions.py,
                class SyncBatchNorm), here on a 1-rank NCCL process group:
                forward  torch.batch_norm_stats -> cat(mean, invstd, count) ->
                         all_gather_into_tensor -> drop empty ranks (count >= 1; a host
                         sync, as in PyTorch outside graph capture) ->
                         torch.batch_norm_gather_stats_with_counts (running stats) ->
                         torch.batch_norm_elemt
                backward torch.batch_norm_backward_reduce -> all_reduce(cat(sum_dy,
                         sum_dy_xmu)) -> torch.batch_norm_backward_elemt
                The sequence is called directly: nn.SyncBatchNorm on one rank falls back
                to F.batch_norm and would not sync at all.
  torch_bn_module (--paths only) torch.nn.BatchNorm2d, the module (torch_bn's arithmetic
                and backward; the host column adds what a module call and its
                num_batches_tracked += 1 cost, as syncbn_torch's layer pays them)
  syncbn_torch  (--paths only) syncbn.torch.SyncBatchNorm, this project's layer, on the
                team of the same process group (libsyncbn through ctypes; PYTHONPATH and
                SYNCBN_LIBRARY as scripts/gpu-suite.sh sets them): forward = the layer,
                backward = torch.autograd.grad of (x, weight, bias), as torch_bn. Its
                time minus coop's in sbn-bench is the binding's cost.
  syncbn_torch_op (--paths only) the layer's registered operators called directly, as
                torch_syncbn calls PyTorch's sequence: syncbn::batch_norm_train, then
                syncbn::batch_norm_backward of its saved statistics (with --epilogue the
                fused batch_norm_act_train / _backward); no module, no autograd engine.
                Against torch_syncbn: operator against operator sequence; against
                syncbn_torch: what the module and the autograd engine add.

Before each row (and each row of the engine table) a host reference: the median host time
of 32 calls of torch.add on 1-element tensors of the device (a dispatch and, on CUDA, a
launch), in the JSON as host_ref_us; the summary names the rows where it was above 1.5x the
run's median, whose host-bound times (small shapes, the backward's autograd engine) a slower
host moved, not the path.

weight, bias and running stats are fp32 for every dtype, as in sbn-bench (and in PyTorch
mixed precision, where BatchNorm parameters stay fp32).

--epilogue relu | add-relu (sbn-bench --epilogue's): batch norm + ReLU, or + residual add
+ ReLU (a ResNet block's last batch norm), each path as a model runs it: torch_bn and
torch_syncbn as a torchvision block does (`out += identity`, then nn.ReLU(inplace=True);
backward: ReLU's threshold_backward of the output, then the batch norm's backward, whose
input gradient is also the residual's), syncbn_torch as one fused op
(SyncBatchNorm(activation="relu"), forward(x, z)). The check's reference gains the
epilogue (the mask from the row's own y; dz); the floors come from an sbn-bench
--epilogue JSON of the same epilogue (its rows carry it); no latency rows.

Method (the same as sbn-bench's GPU mode, docs/DESIGN.md "Benchmark methodology"):
--warmup calls (default 5), then -i calls (default 50) timed with CUDA events recorded
around the op only; before every call a buffer of >= 2x the L2 size is written (fill_, a
memset-like kernel) outside the events. Median, min and p90 (nearest rank) per op, and the
median host time of the calls that enqueue the op. The device-to-device copy bandwidth B
is measured in the same run (copy_ of 1 GiB, 256 MiB when less than 4 GiB is free; 3
untimed, median of 20; B = 2*bytes/time). The bytes each op moves and its floors (the bytes-moved
lower bounds, defined once in sbn-bench: bench/floors.c) are READ from an sbn-bench JSON of
the same shapes (--floors-from FILE, any mode: its rows of ranks 1 with the same shape,
dtype, layout and size): GB/s = those bytes / median time, floor (us) = floor bytes / B.
Without --floors-from, GB/s and % of floor are "-" (null in the JSON).

After the timed calls, one more forward + backward (running stats reset to (0, 1)) is
checked against a float64 reference computed on the CPU from the tensors' own values (for
bf16: the rounded input) on up to --check-channels channels spread over C (first and last
included, as sbn-bench picks them): y and dx element by element, dweight, dbias and the
running stats per channel, and for torch_syncbn the saved mean and invstd.
Tolerances |got - ref| <= tol + tol*|ref|:
  fp32 values (fp32 y and dx, every per-channel value, any dtype): tol = 1e-4
  fp16 y and dx (stored rounded; 11 significant bits): tol = 2e-3; bf16 (8 bits): 1e-2;
  against the reference of the rounded input (sbn-bench's tolerances).
sbn-bench checks its own statistics at 1e-5; PyTorch's are checked at 1e-4 here: the
check asks whether PyTorch computes the right thing, not how precisely.

Shapes: --scale S divides each shape's H*W by S (integer division, kept >= 1; N and C
kept), exactly as sbn-bench --scale does; the GPU default is 1 (real sizes). With S > 1
the tensor is (N, C, H*W/S, 1).

Then a latency table: tiny (N=4, C=512, 1x1, fp32 NCHW, like S10) and empty (n = 0,
C = 512) ops of both paths at W = 1 (an empty op PyTorch rejects is reported, not
counted as a failure). Then the autograd engine's table (--chain-depth K, default 8): the
tiny op of the paths that go through autograd (torch_bn, syncbn_torch) as 1 and as K
layers in a chain, each its own parameters, one forward and ONE torch.autograd.grad over
all, as in a model: per layer = (t(K) - t(1)) / (K - 1) is what one more layer adds to a
step, fixed = t(1) - per layer what one call costs whatever its layers (the backward's:
the engine's graph task, the hand-over to the device's autograd thread, the wait). A
one-layer backward row pays the fixed cost in full; a model pays it once per step.

Output: a table on stdout; --json FILE in sbn-bench's GPU schema (rows with path
"torch_bn" / "torch_syncbn", ranks 1).

  python3 bench/torch_baseline.py --floors-from bench/results/sbn-bench.json \
      --json bench/results/torch.json
  python3 bench/torch_baseline.py --only S5 --dtype bf16 -i 100
  python3 bench/torch_baseline.py --list-shapes --scale 8     (no torch needed)

--device cpu is for testing this script on a machine without a GPU: CPU tensors, the gloo
backend, wall-clock timing, and float32 emulations (written here) of the five SyncBN ops
that PyTorch has only for CUDA. Its numbers are not a baseline; its JSON says mode
"cpu-dryrun" and plot.py skips it.

PyTorch's own accuracy is reported, not failed: its channels-first backward reduction rounds
each product dy*(x-mean) and each partial sum a warp shuffle moves to the input dtype
(bench/notes/tolerances.md), so fp16/bf16 NCHW dweight and dbias miss the tolerance above
by 100-3500x. Such values, when within PyTorch's own rounding bound (gamma(12) * sum|term|
at the dtype's unit roundoff), are counted in the row's "beyond_tol_torch" (table: #torch),
not in "wrong"; the row's tol_used is PyTorch's, tol_used_sbn sbn-bench's coop row's of the
same shape, dtype and layout at W = 1 (from --floors-from).

Exit status: 0 all checked values within tolerance or within PyTorch's own accuracy as
above, 1 a wrong value or a failed row, 2 usage error, 77 no torch or no CUDA device (with
a message).
"""

import argparse
import datetime
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # its modules beside it, also when imported from elsewhere (the tests)
    sys.path.insert(0, HERE)

from torch_baseline_bench import Bench  # noqa: E402
from torch_baseline_floors import FloorsError, floor_key, load_floors, op_derived  # noqa: E402
from torch_baseline_shapes import ShapeError, load_shapes  # noqa: E402
from torch_baseline_util import (COPY_REPS, HOST_REF_CALLS, HOST_REF_SLOW, TOL_BF16, TOL_F16, TOL_F32,  # noqa: E402
                                 elem_size, git_commit, host_ref_slow, json_path_unwritable, median, num,
                                 run_status, times_stats)

EXIT_SKIP = 77
DEFAULT_ITERS = 50
MIN_ITERS = 50
DEFAULT_WARMUP = 5
DEFAULT_SCALE = 1
DEFAULT_CHECK_CHANNELS = 16
DEFAULT_CHAIN_DEPTH = 8
PATHS = ("torch_bn", "torch_bn_module", "torch_syncbn", "syncbn_torch", "syncbn_torch_op")
CHAIN_PATHS = ("torch_bn", "syncbn_torch")  # the engine table's: the paths through autograd
DEFAULT_PATHS = ("torch_bn", "torch_syncbn")  # syncbn_torch by --paths (needs syncbn importable)
DTYPES = ("fp32", "bf16", "fp16")
LAYOUTS = ("NCHW", "NHWC")
EPILOGUES = ("none", "relu", "add-relu")  # sbn-bench --epilogue's
NO_FLOORS = "none: no --floors-from (sbn-bench's JSON defines the bytes and the floors)"


# ---- rows, table, JSON ----------------------------------------------------------------------
def new_row(shape, spatial, dtype, layout, path, epilogue="none"):
    xb = shape["n"] * shape["c"] * spatial * elem_size(dtype)
    return {"path": path, "epilogue": epilogue, "shape": shape["id"], "where": shape["where"], "n": shape["n"],
            "c": shape["c"], "h": shape["h"], "w": shape["w"], "spatial": spatial,
            "dtype": dtype, "layout": layout, "ranks": 1, "bytes_x_rank": xb, "bytes_x_total": xb,
            "_t": {}, "_checked": 0, "_wrong": 0, "_beyond": 0, "_worst": 0.0, "_worst_what": "",
            "_printed": 0, "_label": f"{shape['id']} {dtype} {layout} {path}"
            + (f" {epilogue}" if epilogue != "none" else ""), "_error": None,
            "_note": None, "_optional_error": False, "_host_ref": None}


def finish_row(row, B, floors):
    """The row as JSON. floors: load_floors() or None; the row's bytes and floors are its
    sbn-bench twin's (same shape, dtype, layout and size at ranks 1), null without one."""
    out = {k: v for k, v in row.items() if not k.startswith("_")}
    twin = None
    if floors:
        twin = floors["rows"].get(floor_key(row["shape"], row["dtype"], row["layout"], row["n"],
                                            row["c"], row["spatial"], row["epilogue"]))
    for key in ("fwd", "bwd"):
        t = row["_t"].get(key, {}) if row["_error"] is None else {}
        d = op_derived(twin[key] if twin else None, t.get("us_median"), B)
        out[key] = {"us_median": num(t.get("us_median")), "us_min": num(t.get("us_min")),
                    "us_p90": num(t.get("us_p90")), "host_us_median": num(t.get("host_us_median")),
                    "bytes_rank": d["bytes_rank"], "bytes_total": d["bytes_total"],
                    "gbps_rank": num(d["gbps_rank"]), "gbps_total": num(d["gbps_total"]),
                    "floor_a_bytes": d["floor_a_bytes"], "floor_b_bytes": d["floor_b_bytes"],
                    "floor_a_us": num(d["floor_a_us"]), "floor_b_us": num(d["floor_b_us"]),
                    "pct_floor_a": num(d["pct_floor_a"]), "pct_floor_b": num(d["pct_floor_b"])}
    if floors and twin is None and not row["_note"]:
        row["_note"] = f"no bytes or floors: {floors['file']} has no ranks-1 row of this shape" + \
            (f" and epilogue ({row['epilogue']})" if row["epilogue"] != "none" else "")
    out["checked"] = row["_checked"]
    out["wrong"] = row["_wrong"]
    # PyTorch's accuracy next to ours: the values only PyTorch's own rounding put beyond the
    # tolerance (not failures), and the tol_used of sbn-bench's coop (or CPU) row of the
    # same shape, dtype, layout and size at W = 1 (from --floors-from; null without one)
    out["beyond_tol_torch"] = row["_beyond"]
    out["tol_used"] = num(row["_worst"]) if math.isfinite(row["_worst"]) else None
    out["tol_used_sbn"] = num(floors["tol_used"].get(floor_key(
        row["shape"], row["dtype"], row["layout"], row["n"], row["c"], row["spatial"], row["epilogue"]))) \
        if floors else None
    out["worst"] = row["_worst_what"]
    out["host_ref_us"] = num(row["_host_ref"])
    out["error"] = row["_error"]
    out["note"] = row["_note"] or ""  # as sbn-bench: "" or a remark
    return out


def print_header(meta, args):
    v = meta
    print(f"# torch_baseline  torch {v['torch_version']} (CUDA {v['cuda_version']}, cuDNN "
          f"{v['cudnn_version']}, NCCL {v.get('nccl_version_string', v['nccl_version'])})  commit "
          f"{v['commit']}  {v['date']}")
    d = v["device"]
    if args.device == "cuda":
        l2 = (d["l2_bytes"] or 0) / 1048576.0
        print(f"# device {d['index']}: {d['name']}, {d['arch']}, {d['sm_count']} SMs, L2 {l2:.1f} "
              f"MiB, memory {d['memory_bytes'] / 1073741824.0:.1f} GiB, PCI {d['pci']}")
        print(f"# driver {v['driver_version']} ({v['driver']}), runtime {v['runtime_version']}")
    else:
        print(f"# DRY RUN on the CPU ({d['name']}): wall-clock times of emulated ops, NOT a baseline")
    cb = v["copy_bandwidth"]
    print(f"# copy bandwidth B = {cb['gbps']:.1f} GB/s (device-to-device copy_ of "
          f"{cb['bytes'] >> 20} MiB, B = 2*bytes/time, median of {COPY_REPS}: {cb['us_median']:.1f} us)")
    print("# bytes and floors: " + (f"read from {v['floors_from']} (sbn-bench's rows of ranks 1)"
                                    if v["floors_from"] else NO_FLOORS))
    note = "; NOTE: fewer iters than the methodology's 50" if args.iters < MIN_ITERS else ""
    clock = "CUDA events around the op" if args.device == "cuda" else "wall clock, DRY RUN"
    print(f"# W 1; warm-up {args.warmup}, iters {args.iters} ({clock}; median here, min and p90 "
          f"in the JSON){note}")
    if args.device == "cuda":
        print(f"# L2 flushed before every call: fill_ of {v['l2_flush_bytes'] >> 20} MiB (>= 2 x "
              "L2), outside the events")
    print("# torch_bn: F.batch_norm(training=True) + autograd backward alone; torch_bn_module: "
          "nn.BatchNorm2d, the same through the module; torch_syncbn: "
          "SyncBatchNorm's op sequence on a 1-rank " + ("NCCL" if args.device == "cuda" else "gloo")
          + " process group; weight, bias, running stats fp32")
    if args.epilogue != "none":
        add = args.epilogue == "add-relu"
        print(f"# epilogue {args.epilogue}: y = relu(bn(x){' + z' if add else ''}), backward to x, weight, bias"
              f"{', z' if add else ''}; torch_bn and torch_syncbn as a torchvision block runs them "
              f"({'out += identity, then ' if add else ''}ReLU(inplace=True); the backward: ReLU's "
              "threshold_backward of the output, then batch norm's), syncbn_torch as "
              "SyncBatchNorm(activation='relu')" + (", forward(x, z)" if add else "") + " (one op)")
    print(f"# scale {args.scale} (spatial = H*W / {args.scale}, >= 1), checked channels per row "
          f"{'<= ' + str(args.check_channels) if args.check_channels else 'all'}")
    print("#")
    print("#%59s %45s %45s" % ("", "------------------ forward ------------------",
                               "------------------ backward -----------------"))
    print("# %5s %5s %6s %8s %5s %6s %15s %10s %8s %9s %7s %7s %10s %8s %9s %7s %7s %6s %6s %8s %8s"
          % ("shape", "N", "C", "spatial", "dtype", "layout", "path", "time(us)", "GB/s/rk",
             "GB/s all", "%fl(a)", "%fl(b)", "time(us)", "GB/s/rk", "GB/s all", "%fl(a)",
             "%fl(b)", "#wrong", "#torch", "tol used", "sbn tol"))


def fmt(v, spec):
    return format(v, spec) if v is not None else "-"


def print_row(r):
    line = "  %5s %5d %6d %8d %5s %6s %15s" % (r["shape"], r["n"], r["c"], r["spatial"], r["dtype"],
                                               r["layout"], r["path"])
    if r["error"]:
        print(f"{line}   FAILED: {r['error']}" + (f" ({r['note']})" if r["note"] else ""), flush=True)
        return
    for key in ("fwd", "bwd"):
        o = r[key]
        line += " %10s %8s %9s %7s %7s" % (fmt(o["us_median"], ".1f"), fmt(o["gbps_rank"], ".1f"),
                                           fmt(o["gbps_total"], ".1f"), fmt(o["pct_floor_a"], ".1f"),
                                           fmt(o["pct_floor_b"], ".1f"))
    def tol(tu):
        return "inf" if tu is None else (f"{tu:.3f}" if tu < 1000 else f"{tu:.1e}")
    sbn = "-" if r["tol_used_sbn"] is None else tol(r["tol_used_sbn"])
    line += " %6d %6d %8s %8s" % (r["wrong"], r["beyond_tol_torch"], tol(r["tol_used"]), sbn)
    print(line, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="PyTorch BatchNorm and SyncBatchNorm baselines on sbn-bench's shapes, timed "
                    "like sbn-bench (GPU 0, W = 1), JSON in sbn-bench's schema.")
    p.add_argument("-i", "--iters", type=int, default=DEFAULT_ITERS,
                   help=f"timed calls per op; the median is reported (default {DEFAULT_ITERS})")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help=f"untimed calls before them (default {DEFAULT_WARMUP})")
    p.add_argument("--scale", type=int, default=DEFAULT_SCALE,
                   help="divide each shape's H*W by S (kept >= 1; N, C kept), as sbn-bench "
                        f"--scale; 1 = full size (default {DEFAULT_SCALE})")
    p.add_argument("--shapes", default=os.path.join(HERE, "shapes.tsv"),
                   help="shape table, lines 'id N C H W [where]' (default: bench/shapes.tsv)")
    p.add_argument("--only", help="comma list of shape ids, e.g. S3,S5")
    p.add_argument("--dtype", default="fp32,bf16", help="comma list of fp32, bf16, fp16 (default fp32,bf16)")
    p.add_argument("--layout", default="NCHW,NHWC", help="comma list of NCHW, NHWC (default both)")
    p.add_argument("--paths", default=",".join(DEFAULT_PATHS),
                   help="comma list of torch_bn, torch_bn_module, torch_syncbn, syncbn_torch, "
                        "syncbn_torch_op (default: torch_bn, torch_syncbn)")
    p.add_argument("--check-channels", type=int, default=DEFAULT_CHECK_CHANNELS,
                   help=f"channels checked per row, spread over C; 0 = all (default {DEFAULT_CHECK_CHANNELS})")
    p.add_argument("--no-latency", action="store_true", help="skip the latency rows (tiny, empty)")
    p.add_argument("--chain-depth", type=int, default=DEFAULT_CHAIN_DEPTH, metavar="K",
                   help="after the latency rows, the tiny op of the autograd paths (torch_bn, "
                        "syncbn_torch) as 1 and as K layers in a chain, one autograd.grad over "
                        "all: what a layer adds to a model's step and what one call of the "
                        "engine costs; runs with the latency rows (not with --no-latency or "
                        f"--epilogue); 0 = none (default {DEFAULT_CHAIN_DEPTH})")
    p.add_argument("--epilogue", choices=EPILOGUES, default="none",
                   help="none (default); relu: batch norm + ReLU; add-relu: batch norm + residual add + "
                        "ReLU (a ResNet block's last), each path as a model runs it (no latency rows)")
    p.add_argument("--json", help="also write the metadata and every row as JSON")
    p.add_argument("--floors-from", metavar="FILE",
                   help="an sbn-bench --json file of the same shapes (any mode): each row's "
                        "bytes and floors are read from it (sbn-bench defines them); without "
                        "it GB/s and %% of floor are '-'")
    p.add_argument("--list-shapes", action="store_true",
                   help="print 'id N C H W spatial' after --scale/--only and exit (no torch needed)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a dry run that tests this script without a GPU (not a baseline)")
    a = p.parse_args(argv)

    def names(val, allowed, what):
        out = []
        for t in val.split(","):
            m = [n for n in allowed if n.lower() == t.strip().lower()]
            if not m:
                p.error(f"bad --{what} '{val}' ({', '.join(allowed)})")
            if m[0] not in out:
                out.append(m[0])
        return [n for n in allowed if n in out]

    a.dtypes = names(a.dtype, DTYPES, "dtype")
    a.layouts = names(a.layout, LAYOUTS, "layout")
    a.path_list = names(a.paths, PATHS, "paths")
    for bad, what in ((a.iters < 1, f"-i '{a.iters}': at least 1"),
                      (a.warmup < 0, f"--warmup '{a.warmup}': at least 0"),
                      (a.scale < 1, f"--scale '{a.scale}': at least 1"),
                      (a.check_channels < 0, f"--check-channels '{a.check_channels}': at least 0 (0 = all)"),
                      (a.chain_depth < 0 or a.chain_depth == 1, f"--chain-depth '{a.chain_depth}': 0 or at least 2")):
        if bad:
            p.error(what)
    if a.json and json_path_unwritable(a.json):  # before the run, as sbn-bench
        p.error(f"--json '{a.json}': cannot be written")
    if a.epilogue != "none":
        a.no_latency = True  # the latency table is the plain ops' (as sbn-bench's)
    return a


def host_ref_summary(rows, lat, engine):
    """The host references of the run's rows (rows, latency, engine): least, median, most,
    and the rows whose reference was above HOST_REF_SLOW x the median (labels; the median,
    not the least, so that one quick row does not mark the rest), for the JSON (host_ref)
    and the summary line."""
    refs = [(f"{r['shape']} {r['dtype']} {r['layout']} {r['path']}", r.get("host_ref_us"))
            for r in rows + lat]
    refs += [(f"engine {e['path']} x{e['depth']}", e.get("host_ref_us"))
             for e in (engine or {}).get("rows", [])]
    refs = [(k, v) for k, v in refs if v is not None]
    if not refs:
        return None
    vals = [v for _, v in refs]
    mid = median(vals)
    slow = [k for k, v in refs if host_ref_slow(v, mid)]
    return {"what": f"median host us of {HOST_REF_CALLS} calls of torch.add on 1-element tensors of the device, "
                    "before each row",
            "least_us": num(min(vals)), "median_us": num(mid), "most_us": num(max(vals)),
            "slow_factor": HOST_REF_SLOW, "slow_rows": slow}


def print_host_ref(h):
    if h is None:
        return
    line = (f"# host reference (torch.add of 1-element tensors, median of {HOST_REF_CALLS} calls before each row): "
            f"{h['least_us']:.2f}-{h['most_us']:.2f} us, median {h['median_us']:.2f}; ")
    slow = h["slow_rows"]
    if not slow:
        print(line + f"no row above {h['slow_factor']}x the median")
    else:
        print(line + f"{len(slow)} row(s) above {h['slow_factor']}x the median, their host-bound times moved "
              f"with the host: {', '.join(slow[:6])}" + (", ..." if len(slow) > 6 else ""))


def run_chain(bench, args, shape):
    """The tiny op of the autograd paths as 1 and as K = --chain-depth layers in a chain
    (Bench.time_chain), in this run: per layer = (t(K) - t(1)) / (K - 1), what one more
    layer adds to a model's forward or backward; fixed = t(1) - per layer, what a call
    costs whatever its layers (for the backward: torch.autograd.grad's graph task, the
    hand-over to the device's autograd thread and the wait for it). Prints a table and
    returns the JSON block. The backward is torch.autograd.grad, as the one-layer rows
    time it: a model's loss.backward() also runs each parameter's AccumulateGrad node,
    which this leaves out. Depth 1 is timed before depth K, once each: drift between the
    two goes into the per-layer figure (repeat the run to see its spread)."""
    K = args.chain_depth
    out = {"shape": {k: shape[k] for k in ("id", "n", "c", "h", "w")}, "dtype": "fp32",
           "layout": "NCHW", "depths": [1, K], "rows": [], "derived": []}
    paths = [p for p in args.path_list if p in CHAIN_PATHS]
    for path in paths:
        t = {}
        for depth in (1, K):
            e = {"path": path, "depth": depth, "fwd": None, "bwd": None, "error": None,
                 "host_ref_us": None}
            try:
                e["host_ref_us"] = num(bench.host_ref())
                inputs = bench.make_inputs(shape, "fp32", "NCHW", shape["h"] * shape["w"])
                tf, tb = bench.time_chain(inputs, path, depth)
                for key, (gpu, host) in (("fwd", tf), ("bwd", tb)):
                    med, mn, p90 = times_stats(gpu)
                    e[key] = {"us_median": num(med), "us_min": num(mn), "us_p90": num(p90),
                              "host_us_median": num(median(host))}
                t[depth] = e
            except Exception as ex:  # noqa: BLE001
                e["error"] = f"{type(ex).__name__}: {ex}".replace("\n", " ")[:400]
            out["rows"].append(e)
        if len(t) == 2:
            d = {"path": path}
            for key in ("fwd", "bwd"):
                for col, name in (("us_median", ""), ("host_us_median", "host_")):
                    a, b = t[1][key][col], t[K][key][col]
                    per = (b - a) / (K - 1)
                    d[f"{name}{key}_per_layer_us"] = num(per)
                    d[f"{name}{key}_fixed_us"] = num(a - per)
            out["derived"].append(d)
    print(f"#\n# the autograd engine: the tiny op (N=4, C=512, 1x1, fp32 NCHW) as 1 and as {K} layers "
          "in a chain, one forward and ONE torch.autograd.grad over all; per layer = "
          f"(t({K}) - t(1)) / {K - 1}: what one more layer adds to a model's step; fixed = t(1) - "
          "per layer: what one call costs whatever its layers (the backward's: the engine's graph "
          "task, its hand-over to the device's autograd thread and the wait). Median us, GPU = "
          "CUDA events, host = the call")
    print("# %15s %8s %8s %8s %8s | %8s %8s %8s %8s | %8s %8s" % (
        "path", "fwd 1", "bwd 1", f"fwd {K}", f"bwd {K}", "fwd/lyr", "bwd/lyr", "hfwd/lyr",
        "hbwd/lyr", "bwd fix", "hbwd fix"))
    for path in paths:
        es = {e["depth"]: e for e in out["rows"] if e["path"] == path}
        d = next((x for x in out["derived"] if x["path"] == path), None)
        if d is None:
            err = "; ".join(f"depth {e['depth']}: {e['error']}" for e in es.values() if e["error"])
            print(f"  {path:>15} FAILED: {err}")
            continue
        print("  %15s %8s %8s %8s %8s | %8s %8s %8s %8s | %8s %8s" % (
            path, fmt(es[1]["fwd"]["us_median"], ".1f"), fmt(es[1]["bwd"]["us_median"], ".1f"),
            fmt(es[K]["fwd"]["us_median"], ".1f"), fmt(es[K]["bwd"]["us_median"], ".1f"),
            fmt(d["fwd_per_layer_us"], ".1f"), fmt(d["bwd_per_layer_us"], ".1f"),
            fmt(d["host_fwd_per_layer_us"], ".1f"), fmt(d["host_bwd_per_layer_us"], ".1f"),
            fmt(d["bwd_fixed_us"], ".1f"), fmt(d["host_bwd_fixed_us"], ".1f")))
    return out


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        shapes = load_shapes(args.shapes, args.scale, args.only)
    except (OSError, ShapeError) as e:
        print(f"torch_baseline: {e}", file=sys.stderr)
        return 2
    floors = None
    if args.floors_from:
        try:
            floors = load_floors(args.floors_from)
        except FloorsError as e:
            print(f"torch_baseline: {e}", file=sys.stderr)
            return 2
    if floors is not None:  # say now, not only in the JSON, when its rows fit none of this run's
        keys = [floor_key(s["id"], dt, lay, s["n"], s["c"], s["spatial"], args.epilogue)
                for s in shapes for dt in args.dtypes for lay in args.layouts]
        missing = sum(k not in floors["rows"] for k in keys)
        if missing:
            print(f"torch_baseline: --floors-from {args.floors_from}: {missing} of this run's {len(keys)} "
                  f"(shape, dtype, layout) cells have no row of ranks 1 there (same shape, dtype, layout, --scale {args.scale} and epilogue): their "
                  "GB/s and % of floor will be '-' (sbn-bench -w 1 with the same --scale and --epilogue makes them)",
                  file=sys.stderr)
    if args.list_shapes:
        for s in shapes:
            print(s["id"], s["n"], s["c"], s["h"], s["w"], s["spatial"])
        return 0
    try:
        import torch
    except ImportError as e:
        print(f"torch_baseline: SKIP: PyTorch is not installed ({e}); run it where PyTorch and a "
              "CUDA GPU are", file=sys.stderr)
        return EXIT_SKIP
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"torch_baseline: SKIP: no CUDA device for PyTorch {torch.__version__} "
              f"(torch.cuda.is_available() is False; CUDA build: {torch.version.cuda})",
              file=sys.stderr)
        return EXIT_SKIP
    t_start = time.perf_counter()
    bench = Bench(args, torch)
    bench.setup()
    meta = {"tool": "torch_baseline", "library_version": None}
    meta.update(bench.versions())
    meta["commit"] = git_commit()
    meta["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta["mode"] = "gpu" if args.device == "cuda" else "cpu-dryrun"
    meta["paths"] = args.path_list
    meta["epilogue"] = args.epilogue
    meta["team"] = ("torch: one process, a 1-rank " + ("NCCL" if bench.cuda else "gloo")
                    + " process group (torch.distributed, FileStore)")
    meta["device"] = bench.device_info()
    meta["cores_online"] = os.cpu_count()
    meta["copy_bandwidth"] = bench.copy
    meta["ranks"] = [1]
    meta["scale"] = args.scale
    meta["warmup"] = args.warmup
    meta["iters"] = args.iters
    meta["l2_flush_bytes"] = bench.flush_bytes
    meta["check_channels"] = args.check_channels
    meta["grad_mode"] = "global"
    meta["timing"] = ("CUDA events recorded around the op only; L2 flushed (fill_ of a buffer "
                      ">= 2x L2) before every call, outside the events" if bench.cuda else
                      "DRY RUN: wall clock around each call on the CPU; not a baseline")
    meta["shapes_source"] = os.path.relpath(args.shapes, os.path.dirname(HERE)) \
        if os.path.abspath(args.shapes).startswith(os.path.dirname(HERE) + os.sep) else args.shapes
    meta["bytes"] = floors["bytes"] if floors else NO_FLOORS
    meta["floors"] = floors["floors"] if floors else NO_FLOORS
    meta["floors_from"] = floors["file"] if floors else None
    meta["tolerance"] = {"stat": TOL_F32, "fp32": TOL_F32, "fp16": TOL_F16, "bf16": TOL_BF16}
    meta["process_group_error"] = bench.pg_error
    print_header(meta, args)

    rows, lat, engine = [], [], None
    wrong = checked = failed = beyond = 0
    try:
        for s in shapes:
            for dtype in args.dtypes:
                for layout in args.layouts:
                    inputs, in_err = None, None
                    try:
                        inputs = bench.make_inputs(s, dtype, layout, s["spatial"])
                    except Exception as e:  # noqa: BLE001
                        in_err = f"inputs: {type(e).__name__}: {e}"
                    for path in args.path_list:
                        r = new_row(s, s["spatial"], dtype, layout, path, args.epilogue)
                        if in_err:
                            r["_error"] = in_err
                        else:
                            try:
                                bench.run_row(r, s, dtype, layout, path, inputs)
                            except Exception as e:  # noqa: BLE001
                                r["_error"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:400]
                        out = finish_row(r, bench.B, floors)
                        print_row(out)
                        rows.append(out)
                        wrong += out["wrong"]
                        beyond += out["beyond_tol_torch"]
                        checked += out["checked"]
                        failed += out["error"] is not None
                    del inputs
                    if bench.cuda:
                        torch.cuda.empty_cache()
        if not args.no_latency:
            lat_shapes = [
                {"id": "tiny", "n": 4, "c": 512, "h": 1, "w": 1,
                 "where": "latency: N=4, C=512, 1x1 per rank (like S10)"},
                {"id": "empty", "n": 0, "c": 512, "h": 1, "w": 1,
                 "where": "latency: n=0 on every rank, C=512"}]
            for s in lat_shapes:
                for path in args.path_list:
                    r = new_row(s, 1, "fp32", "NCHW", path)
                    try:
                        inputs = bench.make_inputs(s, "fp32", "NCHW", 1)
                        bench.run_row(r, s, "fp32", "NCHW", path, inputs)
                    except Exception as e:  # noqa: BLE001
                        r["_error"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:400]
                        if s["n"] == 0:
                            r["_note"] = "PyTorch rejected the empty op: reported, not a failure"
                            r["_optional_error"] = True
                    out = finish_row(r, bench.B, floors)
                    lat.append(out)
                    wrong += out["wrong"]
                    checked += out["checked"]
                    failed += out["error"] is not None and not r["_optional_error"]
            print("#\n# latency: fp32 NCHW, C=512; tiny = N=4, 1x1 (like S10); empty = n=0. Median "
                  "us: GPU = CUDA events, host = the enqueueing calls")
            print("# %15s %8s %8s %8s %8s %8s %8s %8s %8s" % (
                "path", "fwd", "bwd", "host fwd", "host bwd", "fwd", "bwd", "host fwd", "host bwd"))
            print("# %15s %35s %35s" % ("", "--------------- tiny --------------",
                                        "-------------- empty --------------"))
            for path in args.path_list:
                line = "  %15s" % path
                for sid in ("tiny", "empty"):
                    r = next(x for x in lat if x["path"] == path and x["shape"] == sid)
                    if r["error"]:
                        line += " %8s %8s %8s %8s" % ("FAILED", "-", "-", "-")
                    else:
                        line += " %8s %8s %8s %8s" % (
                            fmt(r["fwd"]["us_median"], ".1f"), fmt(r["bwd"]["us_median"], ".1f"),
                            fmt(r["fwd"]["host_us_median"], ".1f"), fmt(r["bwd"]["host_us_median"], ".1f"))
                print(line)
                for sid in ("tiny", "empty"):
                    r = next(x for x in lat if x["path"] == path and x["shape"] == sid)
                    if r["error"]:
                        print(f"#   {path} {sid} FAILED: {r['error']}" +
                              (f" ({r['note']})" if r.get("note") else ""))
            if args.chain_depth:
                engine = run_chain(bench, args, lat_shapes[0])
                # a path whose chain failed counts once, however many depths failed
                failed += len({e["path"] for e in engine["rows"] if e["error"]})
    finally:
        bench.teardown()
    total_s = time.perf_counter() - t_start
    print(f"#\n# GB/s: {meta['bytes']}")
    print(f"# %fl(a), %fl(b): {meta['floors']}; B = {bench.B:.1f} GB/s"
          + (f" (bytes and floors from {floors['file']})" if floors else ""))
    print(f"# #wrong: checked values outside |got-ref| <= tol + tol*|ref| (fp32 values and every "
          f"per-channel value {TOL_F32}, fp16 y and dx {TOL_F16}, bf16 {TOL_BF16}; reference: float64 on the "
          "CPU from the tensors' own values) in y, dx, dweight, dbias, running stats (and saved "
          "mean/invstd for torch_syncbn; dz with --epilogue add-relu) on the checked channels of one more "
          "forward + backward")
    print("# #torch: values beyond that tolerance where PyTorch's own rounding puts them (fp16/"
          "bf16 channels-first dweight and dbias: its backward reduction rounds each product and "
          "each shuffled partial sum to the input dtype, within gamma(12) * sum|term| at the "
          "dtype's unit roundoff; bench/notes/tolerances.md): PyTorch's accuracy, reported, "
          "not a failure of the run")
    print("# tol used: worst |got-ref| / tolerance of the row (1.0 = at the limit), #torch values "
          "included; sbn tol: the same for sbn-bench's coop row of this shape, dtype and layout "
          "at W = 1 (from --floors-from)")
    n_engine = len(engine["rows"]) if engine else 0
    print(f"# rows {len(rows)} + latency {len(lat)} + engine {n_engine}, failed {failed}, values checked {checked}, "
          f"wrong {wrong}, beyond tolerance by PyTorch's own accuracy {beyond}")
    host_ref = host_ref_summary(rows, lat, engine)
    print_host_ref(host_ref)
    print(f"# total time {total_s:.1f} s")
    status = run_status(wrong, failed)
    if args.json:
        meta["rows"] = rows
        meta["latency"] = lat
        meta["engine"] = engine
        meta["host_ref"] = host_ref
        meta["wrong"] = wrong
        meta["beyond_tol_torch"] = beyond
        meta["failed_rows"] = failed
        meta["total_s"] = num(total_s)
        meta["ok"] = status == 0
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(meta, f, indent=1, allow_nan=False)
                f.write("\n")
            print(f"# json: {args.json}")
        except OSError as e:
            print(f"torch_baseline: cannot write {args.json}: {e}", file=sys.stderr)
            status = 1
    print("# " + ("OK" if status == 0 else "FAILED"))
    return status


if __name__ == "__main__":
    sys.exit(main())
