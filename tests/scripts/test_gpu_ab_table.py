#!/usr/bin/env python3
"""scripts/gpu_ab_table.py (scripts/gpu-ab.sh's table) on two variants of two rounds each,
written here: each row's median over the rounds and its ratio to the first variant; a row
that a run skipped (cuDNN absent or refusing the shape: us_fwd and us_bwd null, error null,
as sbn-bench writes it) is left out, where the table failed on its null time.

Run with the script to test as the first argument (a mutant's path, or by default the
project's).
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
script = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "scripts",
                                                            "gpu_ab_table.py")
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import checks  # noqa: E402
from checks import check  # noqa: E402


def row(path, fwd, bwd):
    return {"path": path, "shape": "S2", "dtype": "fp32", "layout": "NCHW", "ranks": 1,
            "us_fwd": fwd, "us_bwd": bwd, "error": None, "kernel": "unit"}


# coop: a 10, 12 -> 11 and 20, 20; b 5.5, 6.6 -> 6.05 (0.55) and 30, 30 (1.50)
TIMES = {"a": [(10.0, 20.0), (12.0, 20.0)], "b": [(5.5, 30.0), (6.6, 30.0)]}
with tempfile.TemporaryDirectory() as out:
    for label, rounds in TIMES.items():
        for r, (f, b) in enumerate(rounds, start=1):
            doc = {"copy_bandwidth": {"gbps": 4000.0 + r},
                   "rows": [row("coop", f, b), row("cudnn", None, None)]}
            with open(f"{out}/{label}.r{r}.json", "w") as fh:
                json.dump(doc, fh)
    p = subprocess.run([sys.executable, script, out, "2", "a", "b"], capture_output=True,
                       text=True)
    print(p.stdout + p.stderr)
    check(p.returncode == 0, f"the table is made (exit {p.returncode})")
    lines = p.stdout.splitlines()
    coop = [l for l in lines if l.startswith("coop")]
    check(len(coop) == 1 and "11.0" in coop[0] and "6.0(0.55)" in coop[0]
          and "30.0(1.50)" in coop[0], "coop's medians and ratios: " + repr(coop))
    check(not any(l.startswith("cudnn") for l in lines), "the skipped cudnn row left out")
    check(any("copy bandwidth 4001.5 GB/s" in l for l in lines), "a's copy bandwidth's median")
sys.exit(1 if checks.failures else 0)
