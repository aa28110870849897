"""torch_baseline_util.py - the method's numbers and the small helpers of torch_baseline.py
(statistics of the timed calls, JSON numbers, seeds, the commit). No torch."""

import math
import os
import subprocess
import time

TOL_F32 = 1e-4
# fp16 y and dx: 11 significant bits, a value rounded once is within 2^-11 (4.9e-4) of
# the exact one; 2e-3 is ~4 of its ulps, as sbn-bench's (bench/check.c). bf16: 8 bits,
# 2^-8 (3.9e-3); 1e-2 is ~2.5 of its ulps.
TOL_F16 = 2e-3
TOL_BF16 = 1e-2
EPS = 1e-5
MOMENTUM = 0.1
COPY_REPS = 20
MAX_WRONG_PRINTED = 5
# PyTorch's own accuracy (bench/notes/tolerances.md): its channels-first backward reduction
# (aten/src/ATen/native/cuda/Normalization.cuh: GradOp, Float2, SumReduceOp) rounds every
# product dy * (x - mean) and every partial sum a warp shuffle moves to the input dtype
# before adding it in fp32. A term then passes through at most 1 + 10 (two warp reductions
# of 5 shuffles) + 1 (the fp32 store) such roundings: its dweight and dbias are within
# gamma(12) * sum |term| at the dtype's unit roundoff. channels_last and fp32 are not.
TORCH_OWN_ROUNDING = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
TORCH_OWN_ROUNDINGS = 12
HERE = os.path.dirname(os.path.abspath(__file__))
HOST_REF_CALLS = 32  # torch.add calls a row's host reference takes the median of
HOST_REF_SLOW = 1.5  # a row's host reference above this x the run's median: a slower host


# ---- small helpers ------------------------------------------------------------------------
def host_ref_slow(ref, median_ref, factor=HOST_REF_SLOW):
    """Whether a row's host reference (us) says that it ran on a slowed host: above factor x
    the run's median reference (the median, not the least, so that one quick row does not
    mark the rest). False where either number is missing."""
    return bool(factor and isinstance(median_ref, (int, float)) and median_ref > 0
                and isinstance(ref, (int, float)) and ref > factor * median_ref)


def torch_own_bound(name, dtype, layout):
    """The factor f such that PyTorch's own rounding keeps |got - ref| <= f * sum |term| for
    this value, or None where PyTorch is held to sbn-bench's tolerance (every value but
    dweight and dbias of fp16/bf16 channels-first tensors)."""
    u = TORCH_OWN_ROUNDING.get(dtype)
    if u is None or layout != "NCHW" or name not in ("dweight", "dbias"):
        return None
    k = TORCH_OWN_ROUNDINGS
    return k * u / (1.0 - k * u)


def classify(err, lim, abs_sum, bound):
    """A checked value: "ok" within sbn-bench's tolerance lim; "torch" beyond it but within
    PyTorch's own rounding (bound * abs_sum, bound from torch_own_bound): reported as
    PyTorch's accuracy, not a failure; "wrong" otherwise (NaN included)."""
    if err <= lim:
        return "ok"
    if bound is not None and err <= bound * abs_sum:
        return "torch"
    return "wrong"


def run_status(wrong, failed):
    """The exit status: 1 for a wrong value or a failed row; values that only PyTorch's own
    accuracy puts beyond the tolerance (classify: "torch") do not count."""
    return 0 if wrong == 0 and failed == 0 else 1

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


def copy_us(torch, dst, src, reps, warmup):
    """The median time (us) of dst.copy_(src) over `reps` copies after `warmup` untimed ones:
    CUDA events around each copy of device tensors, the host's clock otherwise. `torch` is
    the caller's module (nothing here imports it)."""
    cuda = dst.is_cuda
    if cuda:
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
    us = []
    for it in range(-warmup, reps):
        if cuda:
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
    return median(us)


def cuda_driver_version():
    """cuDriverGetVersion's integer (13000 for 13.0: sbn-bench's cudaDriverGetVersion's), or
    None where libcuda cannot be loaded."""
    try:
        import ctypes
        lib = ctypes.CDLL("libcuda.so.1")
        out = ctypes.c_int(0)
        return out.value if lib.cuDriverGetVersion(ctypes.byref(out)) == 0 else None
    except (OSError, AttributeError):
        return None


def nvidia_driver():
    """The NVIDIA driver's release ("580.159.04"): from nvidia-ml-py where it is installed,
    else /proc/driver/nvidia/version; None where neither says."""
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            d = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return d.decode() if isinstance(d, bytes) else str(d)
    except Exception:  # noqa: BLE001 (no pynvml, no NVML, no device)
        pass
    try:
        with open("/proc/driver/nvidia/version") as f:
            words = f.readline().split()
        # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  <date>"
        for w in words:
            if w[:1].isdigit() and w.count(".") >= 1:
                return w
    except OSError:
        pass
    return None


def json_path_unwritable(path):
    """Whether --json `path` cannot be written (a directory, or no write access to it or to
    the folder it would be made in): checked before a run, as sbn-bench checks its own."""
    where = path if os.path.exists(path) else (os.path.dirname(path) or ".")
    return os.path.isdir(path) or not os.access(where, os.W_OK)


def elem_size(dtype):
    return 4 if dtype == "fp32" else 2
