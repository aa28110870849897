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

weight, bias and running stats are fp32 for every dtype, as in sbn-bench (and in PyTorch
mixed precision, where BatchNorm parameters stay fp32).

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
  bf16/fp16 y and dx (stored rounded; bf16 keeps 8 significant bits): tol = 1e-2,
  against the reference of the rounded input.
sbn-bench checks its own statistics at 1e-5; PyTorch's are checked at 1e-4 here: the
check asks whether PyTorch computes the right thing, not how precisely.

Shapes: --scale S divides each shape's H*W by S (integer division, kept >= 1; N and C
kept), exactly as sbn-bench --scale does; the GPU default is 1 (real sizes). With S > 1
the tensor is (N, C, H*W/S, 1).

Then a latency table: tiny (N=4, C=512, 1x1, fp32 NCHW, like S10) and empty (n = 0,
C = 512) ops of both paths at W = 1 (an empty op PyTorch rejects is reported, not
counted as a failure).

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

Exit status: 0 all checked values within tolerance, 1 a wrong value or a failed row,
2 usage error, 77 no torch or no CUDA device (with a message).
"""

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

EXIT_SKIP = 77
TOL_F32 = 1e-4
TOL_HALF = 1e-2
EPS = 1e-5
MOMENTUM = 0.1
COPY_REPS = 20
DEFAULT_ITERS = 50
MIN_ITERS = 50
DEFAULT_WARMUP = 5
DEFAULT_SCALE = 1
DEFAULT_CHECK_CHANNELS = 16
MAX_WRONG_PRINTED = 5
PATHS = ("torch_bn", "torch_syncbn")
DTYPES = ("fp32", "bf16", "fp16")
LAYOUTS = ("NCHW", "NHWC")
HERE = os.path.dirname(os.path.abspath(__file__))
NO_FLOORS = "none: no --floors-from (sbn-bench's JSON defines the bytes and the floors)"


# ---- shapes (no torch needed) -------------------------------------------------------------
class ShapeError(ValueError):
    pass


def parse_shapes(text, source="shapes"):
    """Parses a shape table as sbn-bench's parse_shapes does: one 'id N C H W [where...]'
    per line, fields separated by blanks, '#' (after leading blanks) starts a comment line,
    N, C, H, W integers >= 1, 'where' = the rest of the line without trailing blanks."""
    shapes = []
    for lineno, line in enumerate(text.split("\n"), 1):
        s = line.lstrip(" \t\r")
        if not s or s.startswith("#"):
            continue
        parts = s.split(None, 5)
        try:
            if len(parts) < 5:
                raise ValueError
            sid = parts[0][:31]
            n, c, h, w = (int(v) for v in parts[1:5])
            if min(n, c, h, w) < 1:
                raise ValueError
        except ValueError:
            raise ShapeError(f"{source}:{lineno}: expected 'id N C H W [where]' with N, C, H, W >= 1")
        where = parts[5].rstrip("\r ") if len(parts) > 5 else ""
        shapes.append({"id": sid, "n": n, "c": c, "h": h, "w": w, "where": where})
    return shapes


def scaled_spatial(h, w, scale):
    """sbn-bench: spatial = H*W / scale (C integer division), kept >= 1."""
    return max(1, (h * w) // scale)


def load_shapes(path, scale, only=None):
    """The shapes of `path` (sbn-bench's --shapes format) with 'spatial' after --scale,
    filtered by the comma list `only` (exact ids, case-insensitive) when given."""
    with open(path, encoding="utf-8") as f:
        shapes = parse_shapes(f.read(), path)
    if only:
        wanted = {t.lower() for t in only.split(",") if t}
        shapes = [s for s in shapes if s["id"].lower() in wanted]
        if not shapes:
            raise ShapeError(f"--only '{only}' names no shape")
    for s in shapes:
        s["spatial"] = scaled_spatial(s["h"], s["w"], scale)
    return shapes


# ---- small helpers ------------------------------------------------------------------------
def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def times_stats(v):
    """median, min, p90 (nearest rank: sorted[ceil(0.9 n) - 1]) as sbn-bench's times_stats."""
    s = sorted(v)
    i90 = (9 * len(s) + 9) // 10 - 1
    return median(s), s[0], s[max(i90, 0)]


def fnv1a(s):
    h = 1469598103934665603
    for ch in s.encode():
        h = ((h ^ ch) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def num(v):
    """JSON number: 6 significant digits like sbn-bench's %.6g; None for NaN/inf/None."""
    if v is None or not math.isfinite(v):
        return None
    return float(f"{v:.6g}")


def git_commit():
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--tags"], cwd=HERE,
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def elem_size(dtype):
    return 4 if dtype == "fp32" else 2


# ---- bytes and floors, read from sbn-bench's JSON --------------------------------------------
class FloorsError(ValueError):
    pass


def floor_key(shape, dtype, layout, n, c, spatial):
    return (str(shape).lower(), dtype, layout, n, c, spatial)


def load_floors(path):
    """{floor_key: {"fwd": {...}, "bwd": {...}}} from an sbn-bench --json file (rows and
    latency, any mode): the bytes and floors of its rows of ranks 1 (a row of W ranks moves W
    ranks' bytes), and its "bytes" and "floors" texts. Rows without floor bytes (a JSON from
    before schema 2) are left out."""
    try:
        with open(path, encoding="utf-8") as f:
            top = json.load(f)
    except (OSError, ValueError) as e:
        raise FloorsError(f"--floors-from {path}: cannot read: {e}")
    if not isinstance(top, dict) or top.get("tool") != "sbn-bench" or \
            not isinstance(top.get("rows"), list):
        raise FloorsError(f"--floors-from {path}: not an sbn-bench --json file")
    table = {}
    for r in top["rows"] + (top.get("latency") or []):
        if not isinstance(r, dict) or r.get("ranks") != 1:
            continue
        ops = {op: r.get(op) for op in ("fwd", "bwd")}
        if not all(isinstance(o, dict) and o.get("floor_a_bytes") is not None for o in ops.values()):
            continue
        key = floor_key(r.get("shape"), r.get("dtype"), r.get("layout"), r.get("n"), r.get("c"),
                        r.get("spatial"))
        table[key] = {op: {k: o.get(k) for k in ("bytes_rank", "bytes_total", "floor_a_bytes",
                                                  "floor_b_bytes")} for op, o in ops.items()}
    return {"file": path, "rows": table, "bytes": top.get("bytes"), "floors": top.get("floors")}


def op_derived(ref, us, B):
    """One op's bytes, GB/s, floors (a)/(b) in us and % of floor, from ref: the sbn-bench
    row's fwd or bwd bytes and floor bytes (None: unknown, every value None)."""
    def div(a, b):
        return a / b if a is not None and b else None

    ref = ref or {}
    us = us if us is not None and us > 0 else None
    fa = div(ref.get("floor_a_bytes"), B * 1e3 if B else None)  # B in GB/s = 1e3 bytes/us
    fb = div(ref.get("floor_b_bytes"), B * 1e3 if B else None)
    return {
        "bytes_rank": ref.get("bytes_rank"),
        "bytes_total": ref.get("bytes_total"),
        "gbps_rank": div(ref.get("bytes_rank"), us * 1e3 if us else None),
        "gbps_total": div(ref.get("bytes_total"), us * 1e3 if us else None),
        "floor_a_bytes": ref.get("floor_a_bytes"),
        "floor_b_bytes": ref.get("floor_b_bytes"),
        "floor_a_us": fa,
        "floor_b_us": fb,
        "pct_floor_a": div(fa, us) * 100.0 if div(fa, us) is not None else None,
        "pct_floor_b": div(fb, us) * 100.0 if div(fb, us) is not None else None,
    }


# ---- the benchmark (torch imported only here) ------------------------------------------------
class Bench:
    def __init__(self, args, torch):
        self.args = args
        self.torch = torch
        import torch.nn.functional as F
        import torch.distributed as dist
        self.F = F
        self.dist = dist
        self.cuda = args.device == "cuda"
        self.dev = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        self.pg = None
        self.pg_error = None
        self.store_dir = None
        self.flush = None
        self.flush_bytes = 0
        self.B = None
        self.copy = {}

    # -- environment ---------------------------------------------------------------------
    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def setup(self):
        torch = self.torch
        if self.cuda:
            torch.cuda.set_device(self.dev)
            p = torch.cuda.get_device_properties(self.dev)
            l2 = int(getattr(p, "L2_cache_size", 0) or 0)
            self.flush_bytes = ((2 * l2 + (1 << 20) - 1) >> 20) << 20 if l2 > 0 else 64 << 20
            self.flush = torch.empty(self.flush_bytes, dtype=torch.uint8, device=self.dev)
        else:
            self.flush_bytes = 0
        self.measure_copy()
        self.init_process_group()

    def init_process_group(self):
        dist = self.dist
        backend = "nccl" if self.cuda else "gloo"
        try:
            if dist.is_initialized():
                self.pg = dist.group.WORLD
                return
            self.store_dir = tempfile.mkdtemp(prefix="torch_baseline.")
            store = dist.FileStore(os.path.join(self.store_dir, "store"), 1)
            kw = {"backend": backend, "store": store, "rank": 0, "world_size": 1}
            if self.cuda:
                kw["device_id"] = self.dev  # eager NCCL init where supported (PyTorch >= 2.3)
            try:
                dist.init_process_group(**kw)
            except TypeError:
                kw.pop("device_id", None)
                dist.init_process_group(**kw)
            self.pg = dist.group.WORLD
        except Exception as e:  # noqa: BLE001 - reported in every torch_syncbn row
            self.pg_error = f"init_process_group({backend}, 1 rank): {type(e).__name__}: {e}"

    def teardown(self):
        try:
            if self.pg is not None and self.dist.is_initialized():
                self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
        if self.store_dir:
            for name in os.listdir(self.store_dir):
                try:
                    os.unlink(os.path.join(self.store_dir, name))
                except OSError:
                    pass
            try:
                os.rmdir(self.store_dir)
            except OSError:
                pass

    def measure_copy(self):
        """B = 2 * bytes / median time of a device-to-device copy (sbn-bench's method)."""
        torch = self.torch
        if self.cuda:
            free, _ = torch.cuda.mem_get_info(self.dev)
            nbytes = (1 << 30) if free >= (4 << 30) else (256 << 20)
        else:
            nbytes = 64 << 20
        src = torch.full((nbytes,), 0x3C, dtype=torch.uint8, device=self.dev)
        dst = torch.zeros_like(src)
        us = []
        if self.cuda:
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
        for it in range(-3, COPY_REPS):
            if self.cuda:
                e0.record()
                dst.copy_(src)
                e1.record()
                e1.synchronize()
                t = e0.elapsed_time(e1) * 1e3
            else:
                t0 = time.perf_counter()
                dst.copy_(src)
                t = (time.perf_counter() - t0) * 1e6
            if it >= 0:
                us.append(t)
        del src, dst
        t = median(us)
        self.B = 2.0 * nbytes / (t * 1e3)
        self.copy = {"gbps": num(self.B), "bytes": nbytes, "us_median": num(t), "reps": COPY_REPS,
                     "formula": "B = 2*bytes/time (" + ("device-to-device copy_ of uint8 tensors, "
                                "cudaMemcpyAsync" if self.cuda else "DRY RUN: host memory copy_")
                                + ": every byte read and written)"}

    def device_info(self):
        torch = self.torch
        if not self.cuda:
            return {"index": -1, "name": f"CPU ({platform.machine()}), dry run: not a GPU",
                    "arch": None, "pci": None, "sm_count": None, "l2_bytes": None,
                    "memory_bytes": None}
        p = torch.cuda.get_device_properties(self.dev)
        pci = "?"
        if hasattr(p, "pci_bus_id"):
            pci = "%04X:%02X:%02X.0" % (getattr(p, "pci_domain_id", 0), p.pci_bus_id,
                                        getattr(p, "pci_device_id", 0))
        return {"index": self.dev.index, "name": p.name, "arch": f"sm_{p.major}{p.minor}",
                "pci": pci, "sm_count": p.multi_processor_count,
                "l2_bytes": int(getattr(p, "L2_cache_size", 0) or 0) or None,
                "memory_bytes": p.total_memory}

    def versions(self):
        torch = self.torch
        v = {"torch_version": torch.__version__, "cuda_version": torch.version.cuda,
             "cudnn_version": None, "nccl_version": None, "driver_version": None,
             "driver": None, "runtime_version": None}
        try:
            if torch.backends.cudnn.is_available():
                v["cudnn_version"] = torch.backends.cudnn.version()
        except Exception:  # noqa: BLE001
            pass
        try:
            nv = torch.cuda.nccl.version()  # (2, 27, 3), or an int in old PyTorch
            if isinstance(nv, tuple):  # NCCL_VERSION_CODE as sbn-bench's ncclGetVersion: 22703
                v["nccl_version"] = nv[0] * 10000 + nv[1] * 100 + nv[2]
                v["nccl_version_string"] = ".".join(str(p) for p in nv)
            else:
                v["nccl_version"] = int(nv)
        except Exception:  # noqa: BLE001
            pass
        if torch.version.cuda:
            try:
                major, minor = (int(p) for p in torch.version.cuda.split(".")[:2])
                v["runtime_version"] = major * 1000 + minor * 10  # cudaRuntimeGetVersion's form
            except ValueError:
                pass
        if self.cuda:
            try:  # cuDriverGetVersion: the same integer as sbn-bench's cudaDriverGetVersion
                import ctypes
                lib = ctypes.CDLL("libcuda.so.1")
                out = ctypes.c_int(0)
                if lib.cuDriverGetVersion(ctypes.byref(out)) == 0:
                    v["driver_version"] = out.value
            except OSError:
                pass
            try:  # the driver's own version string, where nvidia-ml-py is installed
                import pynvml
                pynvml.nvmlInit()
                d = pynvml.nvmlSystemGetDriverVersion()
                v["driver"] = d.decode() if isinstance(d, bytes) else str(d)
                pynvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
        return v

    # -- timing -------------------------------------------------------------------------
    def time_op(self, fn):
        """warmup + iters calls of fn, each after the L2 flush; CUDA events around the call of
        the timed ones only. Returns (GPU us list, host us list)."""
        torch = self.torch
        a = self.args
        ev = []
        if self.cuda:
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(a.iters)]
        host, wall = [], []
        out = None
        for it in range(a.warmup + a.iters):
            j = it - a.warmup
            if self.flush is not None:
                self.flush.fill_(it & 0xFF)
            if j >= 0 and self.cuda:
                ev[j][0].record()
            t0 = time.perf_counter()
            out = fn()
            t1 = time.perf_counter()
            if j >= 0:
                host.append((t1 - t0) * 1e6)
                if self.cuda:
                    ev[j][1].record()
                else:
                    wall.append((t1 - t0) * 1e6)
            del out
        self.sync()
        gpu = [s.elapsed_time(e) * 1e3 for s, e in ev] if self.cuda else wall
        return gpu, host

    # -- the SyncBatchNorm op sequence --------------------------------------------------------
    def ops(self):
        return CudaOps(self.torch) if self.cuda else EmulatedOps(self.torch)

    def sync_forward(self, ops, x, weight, bias, running_mean, running_var):
        """torch.nn.modules._functions.SyncBatchNorm.forward, world_size 1, this process group."""
        torch, dist = self.torch, self.dist
        world_size = 1
        pg = self.pg
        inp = x
        if not (inp.is_contiguous(memory_format=torch.channels_last)
                or inp.is_contiguous(memory_format=torch.channels_last_3d)):
            inp = inp.contiguous()
        if weight is not None:
            weight = weight.contiguous()
        num_channels = inp.shape[1]
        if inp.numel() > 0:
            mean, invstd = ops.batch_norm_stats(inp, EPS)
            count = torch.full((1,), inp.numel() // inp.size(1), dtype=mean.dtype,
                               device=mean.device)
            combined = torch.cat([mean, invstd, count], dim=0)
        else:
            combined = torch.zeros(2 * num_channels + 1, dtype=inp.dtype, device=inp.device)
        if pg is not None and self._backend_name() != "gloo":
            combined_size = combined.numel()
            combined_flat = torch.empty(1, combined_size * world_size, dtype=combined.dtype,
                                        device=combined.device)
            gather = getattr(dist, "all_gather_into_tensor", None) or dist.all_gather_single
            gather(combined_flat, combined, pg, async_op=False)
            combined = torch.reshape(combined_flat, (world_size, combined_size))
        else:
            combined_list = [torch.empty_like(combined) for _ in range(world_size)]
            dist.all_gather(combined_list, combined, pg, async_op=False)
            combined = torch.stack(combined_list, dim=0)
        mean_all, invstd_all, count_all = torch.split(combined, num_channels, dim=1)
        # outside CUDA graph capture PyTorch drops the empty ranks (a host synchronization)
        mask = count_all.squeeze(-1) >= 1
        count_all = count_all[mask]
        mean_all = mean_all[mask]
        invstd_all = invstd_all[mask]
        counts = count_all.view(-1)
        if running_mean is not None and counts.dtype != running_mean.dtype:
            counts = counts.to(running_mean.dtype)
        mean, invstd = ops.batch_norm_gather_stats_with_counts(
            inp, mean_all, invstd_all, running_mean, running_var, MOMENTUM, EPS, counts)
        count_i32 = count_all.to(torch.int32)
        if inp.numel() > 0:
            y = ops.batch_norm_elemt(inp, weight, bias, mean, invstd, EPS)
        else:
            y = torch.empty_like(inp)
        return y, mean, invstd, count_i32

    def sync_backward(self, ops, dy, x, weight, mean, invstd, count_i32):
        """torch.nn.modules._functions.SyncBatchNorm.backward (input, weight and bias grads)."""
        torch, dist = self.torch, self.dist
        if not (dy.is_contiguous(memory_format=torch.channels_last)
                or dy.is_contiguous(memory_format=torch.channels_last_3d)):
            dy = dy.contiguous()
        if x.numel() > 0:
            sum_dy, sum_dy_xmu, grad_weight, grad_bias = ops.batch_norm_backward_reduce(
                dy, x, mean, invstd, weight, True, True, True)
            num_channels = sum_dy.shape[0]
            combined = torch.cat([sum_dy, sum_dy_xmu], dim=0)
            dist.all_reduce(combined, dist.ReduceOp.SUM, self.pg, async_op=False)
            sum_dy, sum_dy_xmu = torch.split(combined, num_channels)
            if weight is not None and weight.dtype != mean.dtype:
                weight = weight.to(mean.dtype)
            dx = ops.batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu,
                                               count_i32)
            return dx, grad_weight, grad_bias
        combined = torch.zeros(2 * x.shape[1], dtype=x.dtype, device=x.device)
        dist.all_reduce(combined, dist.ReduceOp.SUM, self.pg, async_op=False)
        return None, None, None

    def _backend_name(self):
        pg = self.pg
        try:
            return pg._get_backend_name()
        except Exception:  # noqa: BLE001
            return self.dist.get_backend(pg)

    # -- rows ---------------------------------------------------------------------------
    def make_inputs(self, shape, dtype, layout, spatial):
        """x = offset_c + scale_c * N(0,1), dy = N(0,1); weight in [0.5, 1.5), bias in
        [-0.5, 0.5); like sbn-bench's inputs (same distributions, not the same numbers)."""
        torch = self.torch
        n, c = shape["n"], shape["c"]
        dims = (n, c, shape["h"], shape["w"]) if spatial == shape["h"] * shape["w"] else (n, c, spatial, 1)
        g = torch.Generator(device="cpu")
        g.manual_seed(fnv1a(shape["id"]) & 0x7FFFFFFFFFFFFFFF)
        u = torch.rand(4, c, generator=g, dtype=torch.float64)
        offset = (u[0] * 6.0 - 3.0).float()
        scale = (0.5 + u[1] * 1.5).float()
        weight = (0.5 + u[2]).float().to(self.dev)
        bias = (u[3] - 0.5).float().to(self.dev)
        gd = torch.Generator(device=self.dev)
        gd.manual_seed(fnv1a(shape["id"] + dtype + layout) & 0x7FFFFFFFFFFFFFFF)
        mf = torch.channels_last if layout == "NHWC" else torch.contiguous_format
        td = self.tdtype[dtype]
        x32 = torch.randn(dims, generator=gd, device=self.dev, dtype=torch.float32)
        x32.mul_(scale.to(self.dev).view(1, c, 1, 1)).add_(offset.to(self.dev).view(1, c, 1, 1))
        x = x32.to(td).contiguous(memory_format=mf)
        del x32
        dy = torch.randn(dims, generator=gd, device=self.dev, dtype=torch.float32)
        dy = dy.to(td).contiguous(memory_format=mf)
        return x, dy, weight, bias

    def run_row(self, row, shape, dtype, layout, path, inputs, check=True):
        torch, F = self.torch, self.F
        x, dy, weight, bias = inputs
        c = shape["c"]
        rm = torch.zeros(c, dtype=torch.float32, device=self.dev)
        rv = torch.ones(c, dtype=torch.float32, device=self.dev)
        if path == "torch_bn":
            w = weight.clone().requires_grad_(True)
            b = bias.clone().requires_grad_(True)
            xg = x.detach().requires_grad_(True)

            def fwd():
                return F.batch_norm(xg, rm, rv, w, b, True, MOMENTUM, EPS)

            tf = self.time_op(fwd)
            y = fwd()
            tb = self.time_op(lambda: torch.autograd.grad(y, (xg, w, b), dy, retain_graph=True))
            del y
            if check:
                rm.zero_()
                rv.fill_(1.0)
                y = fwd()
                dx, dw, db = torch.autograd.grad(y, (xg, w, b), dy)
                self.sync()
                got = {"y": y.detach(), "dx": dx, "dweight": dw, "dbias": db,
                       "running_mean": rm, "running_var": rv}
        else:
            if self.pg is None:
                raise RuntimeError(self.pg_error or "no process group")
            ops = self.ops()
            tf = self.time_op(lambda: self.sync_forward(ops, x, weight, bias, rm, rv))
            _, mean, invstd, cnt = self.sync_forward(ops, x, weight, bias, rm, rv)
            tb = self.time_op(lambda: self.sync_backward(ops, dy, x, weight, mean, invstd, cnt))
            if check:
                rm.zero_()
                rv.fill_(1.0)
                y, mean, invstd, cnt = self.sync_forward(ops, x, weight, bias, rm, rv)
                dx, dw, db = self.sync_backward(ops, dy, x, weight, mean, invstd, cnt)
                self.sync()
                got = {"y": y, "dx": dx, "dweight": dw, "dbias": db, "running_mean": rm,
                       "running_var": rv, "save_mean": mean, "save_invstd": invstd}
        for key, (gpu, host) in (("fwd", tf), ("bwd", tb)):
            med, mn, p90 = times_stats(gpu)
            row["_t"][key] = {"us_median": med, "us_min": mn, "us_p90": p90,
                              "host_us_median": median(host)}
        if check and x.numel() > 0:
            self.check(row, x, dy, weight, bias, got, dtype)

    def check(self, row, x, dy, weight, bias, got, dtype):
        """Compares `got` with a float64 reference on the CPU on up to --check-channels
        channels spread over C (first and last included)."""
        torch = self.torch
        C = x.shape[1]
        kmax = self.args.check_channels
        k = C if kmax <= 0 or kmax >= C else kmax
        chs = [0] if k == 1 else [j * (C - 1) // (k - 1) for j in range(k)]
        idx = torch.tensor(chs, dtype=torch.long, device=x.device)

        def sample(t):  # (N, k, S) float64 on the CPU
            return t.detach().index_select(1, idx).to("cpu", torch.float64).reshape(t.shape[0], k, -1)

        def chan(t):
            return t.detach().index_select(0, idx).to("cpu", torch.float64)

        xs, dys = sample(x), sample(dy)
        w, b = chan(weight), chan(bias)
        M = xs.shape[0] * xs.shape[2]
        mean = xs.mean(dim=(0, 2))
        xmu = xs - mean.view(1, k, 1)
        var = (xmu * xmu).mean(dim=(0, 2))
        invstd = 1.0 / torch.sqrt(var + EPS)
        y_ref = xmu * (invstd * w).view(1, k, 1) + b.view(1, k, 1)
        sum_dy = dys.sum(dim=(0, 2))
        sum_dy_xmu = (dys * xmu).sum(dim=(0, 2))
        dx_ref = (w * invstd).view(1, k, 1) * (
            dys - (sum_dy / M).view(1, k, 1)
            - xmu * (invstd * invstd * sum_dy_xmu / M).view(1, k, 1))
        refs = {"y": y_ref, "dx": dx_ref, "dweight": sum_dy_xmu * invstd, "dbias": sum_dy,
                "running_mean": MOMENTUM * mean,
                "running_var": (1 - MOMENTUM) + MOMENTUM * var * M / (M - 1),
                "save_mean": mean, "save_invstd": invstd}
        tol_out = TOL_F32 if dtype == "fp32" else TOL_HALF
        for name, ref in refs.items():
            if name not in got:
                continue
            g = got[name]
            if g is None:
                row["_wrong"] += ref.numel()
                row["_checked"] += ref.numel()
                self.note_worst(row, math.inf, f"{name} missing")
                continue
            gv = sample(g) if name in ("y", "dx") else chan(g)
            tol = tol_out if name in ("y", "dx") else TOL_F32
            err = (gv - ref).abs()
            lim = tol + tol * ref.abs()
            ok = err <= lim
            bad = int((~ok).sum())
            row["_checked"] += ref.numel()
            row["_wrong"] += bad
            used = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err / lim)
            flat = int(torch.argmax(used).item())
            worst = float(used.flatten()[flat])
            def at(pos):
                if name in ("y", "dx"):  # packed (N, k, S): sample n, channel chs[j], spatial s
                    S = ref.shape[2]
                    return f"{name} c{chs[(pos // S) % k]} n{pos // (k * S)} s{pos % S}"
                return f"{name} c{chs[pos]}"

            self.note_worst(row, worst, at(flat))
            if bad:
                for pos in torch.nonzero(~ok.flatten()).flatten()[:MAX_WRONG_PRINTED].tolist():
                    if row["_printed"] >= MAX_WRONG_PRINTED:
                        break
                    row["_printed"] += 1
                    print(f"# WRONG {row['_label']}: {at(pos)}: got {float(gv.flatten()[pos]):.9g} "
                          f"ref {float(ref.flatten()[pos]):.9g} (|diff| "
                          f"{float(err.flatten()[pos]):.3g} > tol {float(lim.flatten()[pos]):.3g})",
                          file=sys.stderr)

    @staticmethod
    def note_worst(row, used, what):
        if used > row["_worst"] or row["_worst_what"] == "":
            row["_worst"] = used
            row["_worst_what"] = what


class CudaOps:
    """The five CUDA ops of torch.nn.SyncBatchNorm, called as PyTorch calls them."""

    def __init__(self, torch):
        self.batch_norm_stats = torch.batch_norm_stats
        self.batch_norm_gather_stats_with_counts = torch.batch_norm_gather_stats_with_counts
        self.batch_norm_elemt = torch.batch_norm_elemt
        self.batch_norm_backward_reduce = torch.batch_norm_backward_reduce
        self.batch_norm_backward_elemt = torch.batch_norm_backward_elemt


class EmulatedOps:
    """--device cpu only: float32 CPU stand-ins for the five CUDA-only ops, with the same
    arguments and results (PyTorch registers them for CUDA alone). For testing the script's
    plumbing; nothing here is timed as a baseline."""

    def __init__(self, torch):
        self.t = torch

    def _dims(self, x):
        return [d for d in range(x.dim()) if d != 1]

    def _bc(self, v, x):
        return v.view([1, -1] + [1] * (x.dim() - 2))

    def batch_norm_stats(self, x, eps):
        xf = x.float()
        mean = xf.mean(dim=self._dims(x))
        var = xf.var(dim=self._dims(x), unbiased=False)
        return mean, self.t.rsqrt(var + eps)

    def batch_norm_gather_stats_with_counts(self, x, mean_all, invstd_all, rm, rv, momentum, eps,
                                            counts):
        cnt = counts.float().view(-1, 1)
        total = cnt.sum()
        mean = (mean_all * cnt).sum(0) / total
        var_i = 1.0 / (invstd_all * invstd_all) - eps
        var = ((var_i + (mean_all - mean) ** 2) * cnt).sum(0) / total
        if rm is not None:
            rm.mul_(1 - momentum).add_(mean * momentum)
            rv.mul_(1 - momentum).add_(var * total / (total - 1) * momentum)
        return mean, self.t.rsqrt(var + eps)

    def batch_norm_elemt(self, x, w, b, mean, invstd, eps):
        y = (x.float() - self._bc(mean, x)) * self._bc(invstd * w, x) + self._bc(b, x)
        out = self.t.empty_like(x)
        out.copy_(y)
        return out

    def batch_norm_backward_reduce(self, dy, x, mean, invstd, w, ig, wg, bg):
        dyf = dy.float()
        sum_dy = dyf.sum(dim=self._dims(x))
        sum_dy_xmu = (dyf * (x.float() - self._bc(mean, x))).sum(dim=self._dims(x))
        return sum_dy, sum_dy_xmu, sum_dy_xmu * invstd if wg else None, sum_dy if bg else None

    def batch_norm_backward_elemt(self, dy, x, mean, invstd, w, sum_dy, sum_dy_xmu, count):
        total = count.float().sum()
        xmu = x.float() - self._bc(mean, x)
        dx = (dy.float() - self._bc(sum_dy / total, x)
              - xmu * self._bc(invstd * invstd * sum_dy_xmu / total, x)) * self._bc(invstd * w, x)
        out = self.t.empty_like(dy)
        out.copy_(dx)
        return out


# ---- rows, table, JSON ----------------------------------------------------------------------
def new_row(shape, spatial, dtype, layout, path):
    xb = shape["n"] * shape["c"] * spatial * elem_size(dtype)
    return {"path": path, "shape": shape["id"], "where": shape["where"], "n": shape["n"],
            "c": shape["c"], "h": shape["h"], "w": shape["w"], "spatial": spatial,
            "dtype": dtype, "layout": layout, "ranks": 1, "bytes_x_rank": xb, "bytes_x_total": xb,
            "_t": {}, "_checked": 0, "_wrong": 0, "_worst": 0.0, "_worst_what": "",
            "_printed": 0, "_label": f"{shape['id']} {dtype} {layout} {path}", "_error": None,
            "_note": None, "_optional_error": False}


def finish_row(row, B, floors):
    """The row as JSON. floors: load_floors() or None; the row's bytes and floors are its
    sbn-bench twin's (same shape, dtype, layout and size at ranks 1), null without one."""
    out = {k: v for k, v in row.items() if not k.startswith("_")}
    twin = None
    if floors:
        twin = floors["rows"].get(floor_key(row["shape"], row["dtype"], row["layout"], row["n"],
                                            row["c"], row["spatial"]))
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
        row["_note"] = f"no bytes or floors: {floors['file']} has no ranks-1 row of this shape"
    out["checked"] = row["_checked"]
    out["wrong"] = row["_wrong"]
    out["tol_used"] = num(row["_worst"]) if math.isfinite(row["_worst"]) else None
    out["worst"] = row["_worst_what"]
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
    print("# torch_bn: F.batch_norm(training=True) + autograd backward alone; torch_syncbn: "
          "SyncBatchNorm's op sequence on a 1-rank " + ("NCCL" if args.device == "cuda" else "gloo")
          + " process group; weight, bias, running stats fp32")
    print(f"# scale {args.scale} (spatial = H*W / {args.scale}, >= 1), checked channels per row "
          f"{'<= ' + str(args.check_channels) if args.check_channels else 'all'}")
    print("#")
    print("#%56s %45s %45s" % ("", "------------------ forward ------------------",
                               "------------------ backward -----------------"))
    print("# %5s %5s %6s %8s %5s %6s %12s %10s %8s %9s %7s %7s %10s %8s %9s %7s %7s %6s %8s" % (
        "shape", "N", "C", "spatial", "dtype", "layout", "path", "time(us)", "GB/s/rk", "GB/s all",
        "%fl(a)", "%fl(b)", "time(us)", "GB/s/rk", "GB/s all", "%fl(a)", "%fl(b)", "#wrong",
        "tol used"))


def fmt(v, spec):
    return format(v, spec) if v is not None else "-"


def print_row(r):
    line = "  %5s %5d %6d %8d %5s %6s %12s" % (r["shape"], r["n"], r["c"], r["spatial"], r["dtype"],
                                               r["layout"], r["path"])
    if r["error"]:
        print(f"{line}   FAILED: {r['error']}" + (f" ({r['note']})" if r["note"] else ""), flush=True)
        return
    for key in ("fwd", "bwd"):
        o = r[key]
        line += " %10s %8s %9s %7s %7s" % (fmt(o["us_median"], ".1f"), fmt(o["gbps_rank"], ".1f"),
                                           fmt(o["gbps_total"], ".1f"), fmt(o["pct_floor_a"], ".1f"),
                                           fmt(o["pct_floor_b"], ".1f"))
    tu = r["tol_used"]
    tus = "inf" if tu is None else (f"{tu:.3f}" if tu < 1000 else f"{tu:.1e}")
    line += " %6d %8s" % (r["wrong"], tus)
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
    p.add_argument("--paths", default=",".join(PATHS), help="comma list of torch_bn, torch_syncbn")
    p.add_argument("--check-channels", type=int, default=DEFAULT_CHECK_CHANNELS,
                   help=f"channels checked per row, spread over C; 0 = all (default {DEFAULT_CHECK_CHANNELS})")
    p.add_argument("--no-latency", action="store_true", help="skip the latency rows (tiny, empty)")
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
    if a.iters < 1 or a.warmup < 0 or a.scale < 1 or a.check_channels < 0:
        p.error("-i >= 1, --warmup >= 0, --scale >= 1, --check-channels >= 0")
    return a


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
    meta["tolerance"] = {"stat": TOL_F32, "fp32": TOL_F32, "half": TOL_HALF}
    meta["process_group_error"] = bench.pg_error
    print_header(meta, args)

    rows, lat = [], []
    wrong = checked = failed = 0
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
                        r = new_row(s, s["spatial"], dtype, layout, path)
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
            print("# %12s %8s %8s %8s %8s %8s %8s %8s %8s" % (
                "path", "fwd", "bwd", "host fwd", "host bwd", "fwd", "bwd", "host fwd", "host bwd"))
            print("# %12s %35s %35s" % ("", "--------------- tiny --------------",
                                        "-------------- empty --------------"))
            for path in args.path_list:
                line = "  %12s" % path
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
    finally:
        bench.teardown()
    total_s = time.perf_counter() - t_start
    print(f"#\n# GB/s: {meta['bytes']}")
    print(f"# %fl(a), %fl(b): {meta['floors']}; B = {bench.B:.1f} GB/s"
          + (f" (bytes and floors from {floors['file']})" if floors else ""))
    print(f"# #wrong: checked values outside |got-ref| <= tol + tol*|ref| (fp32 values and every "
          f"per-channel value {TOL_F32}, bf16/fp16 y and dx {TOL_HALF}; reference: float64 on the "
          "CPU from the tensors' own values) in y, dx, dweight, dbias, running stats (and saved "
          "mean/invstd for torch_syncbn) on the checked channels of one more forward + backward")
    print("# tol used: worst |got-ref| / tolerance of the row (1.0 = at the limit)")
    print(f"# rows {len(rows)} + latency {len(lat)}, failed {failed}, values checked {checked}, "
          f"wrong {wrong}")
    print(f"# total time {total_s:.1f} s")
    status = 0 if wrong == 0 and failed == 0 else 1
    if args.json:
        meta["rows"] = rows
        meta["latency"] = lat
        meta["wrong"] = wrong
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
