"""torch_baseline_util.py - the method's numbers and the small helpers of torch_baseline.py
(statistics of the timed calls, JSON numbers, seeds, the commit). No torch."""

import math
import os
import subprocess

TOL_F32 = 1e-4
TOL_HALF = 1e-2
EPS = 1e-5
MOMENTUM = 0.1
COPY_REPS = 20
MAX_WRONG_PRINTED = 5
HERE = os.path.dirname(os.path.abspath(__file__))


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
