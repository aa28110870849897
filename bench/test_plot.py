#!/usr/bin/env python3
"""test_plot.py - tests of bench/plot.py and of bench/torch_baseline.py's CPU-side parts.

The JSON built here is SYNTHETIC: every time, floor and count in it is made up (by simple
formulas below) to exercise the plotting and table code. None of it is a measurement, and
nothing here says anything about how fast syncbn, cuDNN or PyTorch are.

Checks:
  1. torch_baseline.py compiles (py_compile) and its shape reading and --scale arithmetic
     give the shapes sbn-bench uses: --list-shapes against bench/shapes.tsv read here
     independently (scale 1), and against the rows of `sbn-bench --gpu off --json` at
     scales 7 and 4096 when an sbn-bench binary is given (--sbn-bench PATH) or found in
     build/default/bench/ (otherwise against H*W // scale computed here). Also --only.
     The floors: sbn-bench's JSON (schema 2 and later) carries them in every row, with the values
     asserted here (fwd 3|x| and 2|x|, bwd 5|x| and 3|x|); torch_baseline.py reads them
     from it (--floors-from) and does not compute its own: its rows get the sbn-bench
     row's bytes and floors, floor (us) = floor bytes / B; a bad --floors-from is exit 2.
  2. With PyTorch importable (never in CI; optional): a torch_baseline.py --device cpu
     dry run on two small shapes, --floors-from sbn-bench's JSON when a binary is there,
     writes a JSON in sbn-bench's GPU row schema with sbn-bench's floor bytes.
  3. plot.py on the synthetic JSON (an sbn-bench-like file with coop, nccl and cudnn rows
     for W = 1, 2, 4 and a latency section, and a torch_baseline-like file): every PNG
     exists and is a valid PNG (signature, IHDR with nonzero size); results.md holds the
     ratios and % of floor computed here independently from the synthetic numbers, and
     the floors exactly as the rows give them (made-up values that follow no formula, so
     a plot.py that recomputed them would fail; a coop row without floors makes plot.py
     take the next path's, and its % of floor is "-"); rows with null fields, a failed
     row and a missing path give "-" / "n/a" and no crash.
  4. plot.py exits 77 with a message when matplotlib cannot be imported.
  5. plot.py --history on the COMMITTED GPU runs (bench/results, runs.tsv; real measurements,
     not synthetic): --check passes (bench/results/README.md's table is what the JSON files
     give), and every cell of the committed table equals the number read here from the run's
     JSON with json (independently of plot_history.py), one row per run folder, in date order;
     in a copy of two runs, numbers changed in their JSON files (S5 forward, a cuDNN time, an
     empty-op time, a torch_bn time, a date) make --check fail until the table is regenerated,
     then change exactly those cells, the coop >= cuDNN count and the row order, and the
     series history.png draws; a run folder missing from runs.tsv, a missing file and a JSON
     of the wrong tool are exit 1. With matplotlib: history.png is written and is a PNG.
Parts 3-4 and 5's picture need matplotlib: without it this test exits 77 after parts 1,
3's results.md tables (plot.py --md-only) and 5's table (and says why); --no-plot runs parts 1-2 only (exit 0 on success);
--history-only runs part 5 (--history-only --no-plot: its table alone, exit 0 on success;
CTest's test_results_history).

  python3 bench/test_plot.py [--sbn-bench build/default/bench/sbn-bench] [--no-plot]
                             [--history-only]
"""

import argparse
import importlib.util
import json
import math
import os
import py_compile
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PLOT = os.path.join(HERE, "plot.py")
BASELINE = os.path.join(HERE, "torch_baseline.py")
SHAPES = os.path.join(HERE, "shapes.tsv")
EXIT_SKIP = 77
PNG_SIG = b"\x89PNG\r\n\x1a\n"

failures = []


def check(cond, what):
    if cond:
        print(f"ok   {what}")
    else:
        print(f"FAIL {what}")
        failures.append(what)
    return cond


def run(cmd, **kw):
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.update(kw.pop("env", {}))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, **kw)


# ---- 1. torch_baseline.py: compiles, shapes ------------------------------------------------------
def shapes_from_tsv(path):
    """bench/shapes.tsv read independently: id N C H W per non-comment line."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            s = line.strip()
            if not s or s.startswith("#"):
                continue
            p = s.split()
            out.append((p[0], int(p[1]), int(p[2]), int(p[3]), int(p[4])))
    return out


def list_shapes(scale, only=None):
    cmd = [sys.executable, BASELINE, "--list-shapes", "--scale", str(scale)]
    if only:
        cmd += ["--only", only]
    r = run(cmd)
    if r.returncode != 0:
        return None, r.stderr
    return [tuple([p[0]] + [int(v) for v in p[1:]]) for p in (l.split() for l in r.stdout.splitlines())], ""


def sbn_bench_shapes(exe, scale, tmp):
    js = os.path.join(tmp, f"sbn_scale{scale}.json")
    r = run([exe, "--gpu", "off", "--scale", str(scale), "-i", "1", "--warmup", "0", "-w", "1",
             "--dtype", "fp32", "--layout", "NCHW", "--check-channels", "1", "--json", js])
    if r.returncode != 0:
        return None, (r.stdout + r.stderr)[-2000:]
    with open(js, encoding="utf-8") as f:
        d = json.load(f)
    return [(x["shape"], x["n"], x["c"], x["h"], x["w"], x["spatial"]) for x in d["rows"]], ""


def test_baseline_shapes(sbn_exe, tmp):
    try:
        py_compile.compile(BASELINE, cfile=os.path.join(tmp, "tb.pyc"), doraise=True)
        check(True, "torch_baseline.py compiles")
    except py_compile.PyCompileError as e:
        check(False, f"torch_baseline.py compiles: {e}")
        return
    tsv = shapes_from_tsv(SHAPES)
    got, err = list_shapes(1)
    check(got == [t + (t[3] * t[4],) for t in tsv],
          f"--list-shapes --scale 1 = shapes.tsv with spatial H*W ({len(tsv)} shapes) {err}")
    got, err = list_shapes(8, "s2,S10")
    check(got == [t + (max(1, t[3] * t[4] // 8),) for t in tsv if t[0] in ("S2", "S10")],
          f"--only s2,S10 --scale 8 keeps those two, case-insensitive {err}")
    r = run([sys.executable, BASELINE, "--list-shapes", "--only", "S99"])
    check(r.returncode == 2, "--only naming no shape: exit 2")
    r = run([sys.executable, BASELINE, "--list-shapes", "--only", "S10,S99"])
    check(r.returncode == 2 and "S99 is no shape" in r.stderr,
          f"--only with one id that is no shape among good ones: exit 2, naming it {r.stderr[-300:]}")
    r = run([sys.executable, BASELINE, "--list-shapes", "--only", ""])
    check(r.returncode == 2 and "names no shape" in r.stderr, f"--only '': exit 2 {r.stderr[-200:]}")
    r = run([sys.executable, BASELINE, "--list-shapes", "--only", "S10, s2,"])
    check(r.returncode == 0 and [ln.split()[0] for ln in r.stdout.splitlines()] == ["S2", "S10"],
          f"--only with spaces around ids: those shapes {r.stdout!r}")
    for scale in (7, 4096):
        got, err = list_shapes(scale)
        if sbn_exe:
            want, err2 = sbn_bench_shapes(sbn_exe, scale, tmp)
            check(want is not None and got == want,
                  f"--scale {scale}: the shapes of sbn-bench --gpu off --scale {scale} "
                  f"({os.path.relpath(sbn_exe, ROOT)}) {err}{err2}")
        else:
            want = [t + (max(1, t[3] * t[4] // scale),) for t in tsv]
            check(got == want, f"--scale {scale}: H*W // {scale}, >= 1 (no sbn-bench binary) {err}")
    # without torch (the interpreter running this test may or may not have it)
    has_torch = run([sys.executable, "-c", "import torch"]).returncode == 0
    if not has_torch:
        r = run([sys.executable, BASELINE, "--only", "S10"])
        check(r.returncode == EXIT_SKIP and "PyTorch is not installed" in r.stderr,
              "torch_baseline.py without torch: exit 77 and says why")
    return has_torch


def sbn_bench_json(exe, tmp):
    """sbn-bench --gpu off -w 1 on S7 and S10 at scale 64, fp32 and bf16: (path, JSON)."""
    js = os.path.join(tmp, "sbn_floors.json")
    r = run([exe, "--gpu", "off", "-w", "1", "--only", "S7,S10", "--scale", "64", "-i", "1",
             "--warmup", "0", "--dtype", "fp32,bf16", "--check-channels", "1", "--json", js])
    if not check(r.returncode == 0, "sbn-bench --gpu off --json: exit 0"):
        print((r.stdout + r.stderr)[-1500:])
        return None, None
    with open(js, encoding="utf-8") as f:
        return js, json.load(f)


SCHEMA2_ROW_KEYS = {"path", "shape", "where", "n", "c", "h", "w", "spatial", "dtype", "layout",
                    "ranks", "kernel", "bytes_x_rank", "bytes_x_total", "us_fwd", "us_bwd",
                    "gbps_fwd", "gbps_bwd", "fwd", "bwd", "checked", "wrong", "tol_used", "worst",
                    "error", "note"}


def test_sbn_bench_floors(d):
    """The floors of sbn-bench's CPU-mode JSON: there in every row, the values of the
    definition (asserted here, independently of bench/floors.c)."""
    rows = d.get("rows", [])
    check(d.get("schema") == 5 and d.get("mode") == "cpu" and len(rows) == 8 and
          d.get("complete") is True and d.get("rows_planned") == 8,
          "sbn-bench JSON: schema 5, CPU mode, complete, 8 rows (2 shapes x 2 dtypes x 2 layouts)")
    check(all(SCHEMA2_ROW_KEYS <= set(x) for x in rows), "sbn-bench CPU rows have every schema-2 row key")
    ok = True
    for x in rows:
        xt, xr = x["bytes_x_total"], x["bytes_x_rank"]
        es = 4 if x["dtype"] == "fp32" else 2
        ok &= xr == x["n"] * x["c"] * x["spatial"] * es and xt == xr * x["ranks"]
        for op, ka, kb in (("fwd", 3, 2), ("bwd", 5, 3)):
            o = x[op]
            ok &= o["floor_a_bytes"] == ka * xt and o["floor_b_bytes"] == kb * xt
            ok &= o["bytes_rank"] == kb * xr and o["bytes_total"] == kb * xt
            # CPU mode measures no copy bandwidth: no floor in us, no % of floor
            ok &= all(o[k] is None for k in ("floor_a_us", "floor_b_us", "pct_floor_a", "pct_floor_b"))
            ok &= o["us_median"] is not None and o["us_median"] == x["us_" + op]
    check(ok, "sbn-bench rows: floor_a_bytes = 3|x| fwd, 5|x| bwd; floor_b_bytes = bytes_total = "
              "2|x|, 3|x|; floor us and % null in CPU mode; us_fwd/us_bwd = fwd/bwd us_median")
    check(isinstance(d.get("floors"), str) and isinstance(d.get("bytes"), str),
          "sbn-bench JSON: the floors and bytes formulas as text")


INFERENCE_ROW_KEYS = {"path", "shape", "where", "n", "c", "h", "w", "spatial", "dtype", "layout",
                      "ranks", "kernel", "us_median", "us_min", "us_p90", "host_us_median", "bytes",
                      "gbps", "floor_us", "x_copy", "copy_us_median", "t_over_copy", "t_over_coop", "checked", "wrong", "tol_used",
                      "worst", "error", "note"}


def test_sbn_bench_inference(d):
    """The inference table of sbn-bench's CPU-mode JSON (schema 4): one row per shape x dtype
    x layout, path cpu at W = 1, every key, bytes = 2|x|, no floor (no B in CPU mode), y
    checked with nothing wrong."""
    inf = d.get("inference")
    check(isinstance(inf, list) and len(inf) == 8 and d.get("inference_planned") == 8 and
          d.get("inference_target") == 1.1 and isinstance(d.get("inference_formula"), str) and
          isinstance(d.get("inference_running_stats"), str),
          "sbn-bench JSON: inference, 8 rows of 8 planned, the target 1.1 and the formulas as text")
    if not isinstance(inf, list):
        return
    ok = all(INFERENCE_ROW_KEYS <= set(x) for x in inf)
    check(ok, "sbn-bench inference rows have every key")
    if not ok:
        return
    want = sorted((x["shape"], x["dtype"], x["layout"]) for x in d.get("rows", []))
    check(sorted((x["shape"], x["dtype"], x["layout"]) for x in inf) == want,
          "sbn-bench inference rows: the shapes, dtypes and layouts of the main rows")
    ok = True
    for x in inf:
        es = 4 if x["dtype"] == "fp32" else 2
        ok &= x["path"] == "cpu" and x["ranks"] == 1 and x["kernel"] == "cpu"
        ok &= x["bytes"] == 2 * x["n"] * x["c"] * x["spatial"] * es
        ok &= x["floor_us"] is None and x["x_copy"] is None and x["t_over_coop"] is None
        ok &= x["us_median"] is not None and x["us_min"] <= x["us_median"] <= x["us_p90"]
        # the timed copy of x (memcpy in CPU mode) and the call's time over it
        ok &= x["copy_us_median"] is not None and x["copy_us_median"] > 0
        ok &= x["t_over_copy"] is not None and abs(x["t_over_copy"] * x["copy_us_median"] - x["us_median"]) <= \
            1e-4 * x["us_median"]  # the JSON's 6 significant digits
        ok &= x["error"] is None and x["checked"] > 0 and x["wrong"] == 0
    check(ok, "sbn-bench inference rows: path cpu, W = 1, bytes = 2|x|, floor and x_copy null in "
              "CPU mode, times and the timed copy there (t_over_copy = us_median / copy_us_median), "
              "checked > 0, wrong 0, no error")


def import_baseline():
    spec = importlib.util.spec_from_file_location("torch_baseline", BASELINE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports no torch: that happens in main()
    return mod


def test_baseline_accuracy():
    """PyTorch's own accuracy (torch_baseline_util): reported, not a failure, only where its
    rounding explains it (fp16/bf16 NCHW dweight and dbias, within gamma(12) * sum|term|);
    elsewhere a value beyond the tolerance is wrong and the exit status is 1."""
    sys.path.insert(0, HERE)
    import torch_baseline_util as u
    b = u.torch_own_bound("dweight", "bf16", "NCHW")
    check(b is not None and abs(b - 12 * 2.0 ** -8 / (1 - 12 * 2.0 ** -8)) < 1e-15,
          "PyTorch's own bound: bf16 NCHW dweight, gamma(12) at u = 2^-8")
    check(all(u.torch_own_bound(n, dt, lay) is None for n, dt, lay in (
        ("dweight", "bf16", "NHWC"), ("dbias", "fp32", "NCHW"), ("dx", "bf16", "NCHW"),
        ("y", "fp16", "NCHW"), ("save_mean", "bf16", "NCHW"))),
          "PyTorch is held to sbn-bench's tolerance elsewhere (NHWC, fp32, y, dx, statistics)")
    # S1 bf16 NCHW channel 12 of the first GPU run: |diff| 4.63 on -155.3, tol 0.0156;
    # sum|term| there ~ 0.6 * 262144
    check(u.classify(4.63, 0.0156, 0.6 * 262144, b) == "torch",
          "the GPU run's bf16 NCHW dweight miss (300x the tolerance) is PyTorch's accuracy")
    check(u.classify(4.63, 0.0156, 0.6 * 262144, None) == "wrong",
          "the same miss on an NHWC or fp32 row is wrong")
    check(u.classify(1e-3, 0.0156, 1.0, b) == "ok" and
          u.classify(0.5, 0.0156, 10.0, b) == "wrong" and
          u.classify(float("nan"), 0.0156, 10.0, b) == "wrong",
          "within tolerance: ok; beyond PyTorch's own bound, or NaN: wrong")
    check(u.run_status(0, 0) == 0 and u.run_status(1, 0) == 1 and u.run_status(0, 1) == 1,
          "exit status: 1 only for wrong values or failed rows")


def test_baseline_floors(js, d, tmp):
    """torch_baseline.py reads the bytes and floors of sbn-bench's JSON, and computes none."""
    tb = import_baseline()
    floors = tb.load_floors(js)
    check(len(floors["rows"]) == len(d["rows"]) and floors["floors"] == d["floors"],
          "load_floors: one entry per ranks-1 row, and the floors text")
    B, us = 50.0, 100.0
    ok = True
    for x in d["rows"]:
        r = tb.new_row({"id": x["shape"], "n": x["n"], "c": x["c"], "h": x["h"], "w": x["w"],
                        "where": x["where"]}, x["spatial"], x["dtype"], x["layout"], "torch_bn")
        r["_t"] = {op: {"us_median": us} for op in ("fwd", "bwd")}
        out = tb.finish_row(r, B, floors)
        for op in ("fwd", "bwd"):
            o, ref = out[op], x[op]
            ok &= o["floor_a_bytes"] == ref["floor_a_bytes"] and o["floor_b_bytes"] == ref["floor_b_bytes"]
            ok &= o["bytes_rank"] == ref["bytes_rank"] and o["bytes_total"] == ref["bytes_total"]
            ok &= math.isclose(o["floor_a_us"], ref["floor_a_bytes"] / (B * 1e3), rel_tol=1e-5)
            ok &= math.isclose(o["floor_b_us"], ref["floor_b_bytes"] / (B * 1e3), rel_tol=1e-5)
            ok &= math.isclose(o["pct_floor_a"], ref["floor_a_bytes"] / (B * 1e3) / us * 100, rel_tol=1e-5)
            ok &= math.isclose(o["gbps_rank"], ref["bytes_rank"] / (us * 1e3), rel_tol=1e-5)
    check(ok, "torch_baseline rows: sbn-bench's bytes and floor bytes; floor us = bytes / B")
    def unknown_row():
        r = tb.new_row({"id": "S99", "n": 1, "c": 1, "h": 1, "w": 1, "where": ""}, 1, "fp32", "NCHW",
                       "torch_bn")
        r["_t"] = {op: {"us_median": us} for op in ("fwd", "bwd")}
        return r

    out = tb.finish_row(unknown_row(), B, floors)
    check(all(out[op][k] is None for op in ("fwd", "bwd")
              for k in ("bytes_rank", "floor_a_bytes", "floor_a_us", "pct_floor_b", "gbps_rank"))
          and "no bytes or floors" in out["note"],
          "torch_baseline row without an sbn-bench twin: bytes and floors null, the note says why")
    x = d["rows"][0]
    r = tb.new_row({"id": x["shape"], "n": x["n"], "c": x["c"], "h": x["h"], "w": x["w"], "where": ""},
                   x["spatial"], x["dtype"], x["layout"], "torch_bn")
    r["_t"] = {op: {"us_median": us} for op in ("fwd", "bwd")}
    out = tb.finish_row(r, B, None)
    check(all(out[op]["floor_b_us"] is None for op in ("fwd", "bwd")) and out["note"] == "",
          "torch_baseline without --floors-from: floors null, nothing recomputed")
    # a file whose rows fit none of the run's: said on stderr before the run (the rows' notes
    # alone said it before); the same file at its own --scale: nothing said
    base = [sys.executable, BASELINE, "--list-shapes", "--only", "S7,S10", "--dtype", "fp32,bf16",
            "--layout", "NCHW,NHWC", "--floors-from", js]
    r = run(base + ["--scale", "64"])
    check(r.returncode == 0 and "--floors-from" not in r.stderr,
          f"torch_baseline --floors-from sbn-bench's JSON at its own --scale: nothing to say {r.stderr[-300:]}")
    r = run(base + ["--scale", "8"])
    check(r.returncode == 0 and "4 of this run's 8 (shape, dtype, layout) cells have no row of ranks 1" in r.stderr,
          f"torch_baseline --floors-from at another --scale: the rows without floors counted on stderr "
          f"(S7's spatial changes, S10's does not) {r.stderr[-300:]}")
    r = run([sys.executable, BASELINE, "--list-shapes", "--floors-from", os.path.join(tmp, "missing.json")])
    check(r.returncode == 2 and "--floors-from" in r.stderr and "cannot read" in r.stderr,
          "torch_baseline --floors-from a missing file: exit 2 naming it")
    bad = os.path.join(tmp, "not_sbn.json")
    with open(bad, "w", encoding="utf-8") as f:
        json.dump({"tool": "torch_baseline", "rows": []}, f)
    r = run([sys.executable, BASELINE, "--list-shapes", "--floors-from", bad])
    check(r.returncode == 2 and "not an sbn-bench" in r.stderr,
          "torch_baseline --floors-from a JSON that is not sbn-bench's: exit 2")


# ---- 2. torch_baseline.py dry run (only where torch is installed) ------------------------------
ROW_KEYS = {"path", "shape", "where", "n", "c", "h", "w", "spatial", "dtype", "layout", "ranks",
            "bytes_x_rank", "bytes_x_total", "fwd", "bwd", "checked", "wrong", "tol_used", "worst",
            "error"}
OP_KEYS = {"us_median", "us_min", "us_p90", "host_us_median", "bytes_rank", "bytes_total",
           "gbps_rank", "gbps_total", "floor_a_bytes", "floor_b_bytes", "floor_a_us", "floor_b_us",
           "pct_floor_a", "pct_floor_b"}


def test_baseline_dryrun(tmp, sbn_js, sbn):
    js = os.path.join(tmp, "torch_dry.json")
    r = run([sys.executable, BASELINE, "--device", "cpu", "--only", "S7,S10", "--scale", "64",
             "-i", "3", "--warmup", "1", "--check-channels", "4", "--json", js]
            + (["--floors-from", sbn_js] if sbn_js else []))
    if not check(r.returncode == 0, "torch_baseline.py --device cpu dry run: exit 0"):
        print(r.stdout[-3000:], r.stderr[-3000:])
        return None
    with open(js, encoding="utf-8") as f:
        d = json.load(f)
    check(d.get("mode") == "cpu-dryrun" and d.get("tool") == "torch_baseline", "dry run JSON: mode, tool")
    rows = d.get("rows", [])
    check(len(rows) == 2 * 2 * 2 * 2, f"dry run: 16 rows (2 shapes x 2 dtypes x 2 layouts x 2 paths), got {len(rows)}")
    check(all(ROW_KEYS <= set(x) and OP_KEYS <= set(x["fwd"]) and OP_KEYS <= set(x["bwd"]) for x in rows),
          "dry run rows have sbn-bench's GPU row fields")
    check(all(x["checked"] > 0 and x["wrong"] == 0 and x["error"] is None for x in rows),
          "dry run rows: checked, nothing wrong")
    check({(x["path"], x["shape"]) for x in d.get("latency", [])} ==
          {(p, s) for p in ("torch_bn", "torch_syncbn") for s in ("tiny", "empty")}, "dry run latency rows")
    eng = d.get("engine") or {}
    der = {x["path"]: x for x in eng.get("derived", [])}
    bn_rows = [e for e in eng.get("rows", []) if e["path"] == "torch_bn"]
    ok = eng.get("depths") == [1, 8] and set(der) == {"torch_bn"} and len(bn_rows) == 2 and not any(
        e["error"] for e in bn_rows)
    if ok:  # per layer and fixed from the two depths' medians, as the docstring defines them
        t = {e["depth"]: e for e in bn_rows}
        for key in ("fwd", "bwd"):
            a, b = t[1][key]["us_median"], t[8][key]["us_median"]
            per = der["torch_bn"][f"{key}_per_layer_us"]
            ok = ok and abs(per - (b - a) / 7) <= 1e-3 * (1 + abs(per)) and \
                abs(der["torch_bn"][f"{key}_fixed_us"] - (a - per)) <= 1e-3 * (1 + abs(a))
    check(ok, "dry run engine block: torch_bn at depths 1 and 8, per layer = (t8 - t1) / 7, fixed = t1 - per layer")
    s7 = [x for x in rows if x["shape"] == "S7"][0]
    check(s7["spatial"] == 97 * 97 // 64 and s7["bytes_x_rank"] == 2 * 512 * (97 * 97 // 64) * 4
          if s7["dtype"] == "fp32" else True, "dry run: S7 spatial and bytes at --scale 64")
    if sbn:
        twins = {(x["shape"], x["dtype"], x["layout"]): x for x in sbn["rows"]}
        check(all(x[op]["floor_a_bytes"] == twins[(x["shape"], x["dtype"], x["layout"])][op]["floor_a_bytes"]
                  for x in rows for op in ("fwd", "bwd")),
              "dry run rows: sbn-bench's floor bytes (--floors-from)")
    return js


# ---- 3. plot.py on synthetic JSON --------------------------------------------------------------
SYN_SHAPES = [("S1", 4, 64, 256, 256, "stem"), ("S10", 4, 512, 1, 1, "pool | branch")]
SYN_DTYPES = ["fp32", "bf16"]
SYN_LAYOUTS = ["NCHW", "NHWC"]
B_SBN = 3000.0
FAILED_NCCL = ("S10", "fp32", "NHWC", 1)
FLOORLESS_COOP = ("S10", "bf16", "NHWC", 1)  # a coop row without floors: plot.py takes nccl's
B_TORCH = 2900.0


def syn_us(path, si, di, li, op, W=1):
    """Made-up median times (us). Not measurements."""
    base = 100.0 + 40.0 * si + 10.0 * di + 4.0 * li + (30.0 if op == "bwd" else 0.0)
    f = {"coop": 1.0, "nccl": 1.5, "cudnn": 1.2, "torch_bn": 1.3, "torch_syncbn": 2.7}[path]
    return round(base * f * (1.0 + 0.9 * (W - 1)) + (3.0 if path != "coop" else 0.0), 3)


def syn_floor(path, si, di, li, op, W, which):
    """Made-up floors (us), on purpose no formula of the bytes or of B: plot.py must show
    what the JSON says. The nccl rows' differ from coop's so the tests see whose is used."""
    base = 17.0 + 7.0 * si + 3.0 * di + 1.0 * li + (5.0 if op == "bwd" else 0.0) + 2.0 * W
    return round(base * (1.0 if which == "a" else 0.55) + (0.25 if path == "nccl" else 0.0), 3)


def syn_row(path, s, si, dtype, di, layout, li, W, B, full=True):
    sid, n, c, h, w, where = s
    es = 4 if dtype == "fp32" else 2
    xr = n * c * h * w * es
    xt = xr * W
    row = {"path": path, "shape": sid, "where": where, "n": n, "c": c, "h": h, "w": w, "spatial": h * w,
           "dtype": dtype, "layout": layout, "ranks": W, "bytes_x_rank": xr, "bytes_x_total": xt,
           "checked": 1000, "wrong": 0, "tol_used": 0.1, "worst": "y r0 c0", "error": None,
           "note": "nccl-path on a virtual team: a remark" if path == "nccl" else "",
           "some_future_field": {"x": 1}}
    for op, kbytes in (("fwd", 2), ("bwd", 3)):
        us = syn_us(path, si, di, li, op, W)
        fa, fb = syn_floor(path, si, di, li, op, W, "a"), syn_floor(path, si, di, li, op, W, "b")
        o = {"us_median": us, "us_min": us * 0.95, "us_p90": us * 1.1, "host_us_median": 5.0,
             "bytes_rank": kbytes * xr, "bytes_total": kbytes * xt, "gbps_rank": kbytes * xr / (us * 1e3),
             "gbps_total": kbytes * xt / (us * 1e3), "floor_a_bytes": fa * B * 1e3, "floor_b_bytes": fb * B * 1e3,
             "floor_a_us": fa, "floor_b_us": fb, "pct_floor_a": fa / us * 100, "pct_floor_b": fb / us * 100}
        if path == "coop" and (sid, dtype, layout, W) == FLOORLESS_COOP:
            for k in ("floor_a_bytes", "floor_b_bytes", "floor_a_us", "floor_b_us", "pct_floor_a", "pct_floor_b"):
                o[k] = None
        if not full:  # an older or partial file: optional fields missing or null
            for k in ("us_min", "us_p90", "pct_floor_a", "pct_floor_b", "gbps_total"):
                o.pop(k)
            o["host_us_median"] = None
        row[op] = o
    return row


def syn_lat(path, sid, W):
    n = 4 if sid == "tiny" else 0
    us = {"coop": 6.0, "nccl": 20.0, "torch_bn": 30.0, "torch_syncbn": 250.0}[path] + 1.5 * (W - 1)
    if sid == "empty":
        us -= 1.0
    return {"path": path, "shape": sid, "where": "latency", "n": n, "c": 512, "h": 1, "w": 1, "spatial": 1,
            "dtype": "fp32", "layout": "NCHW", "ranks": W, "bytes_x_rank": n * 512 * 4,
            "bytes_x_total": n * 512 * 4 * W,
            "fwd": {"us_median": us, "host_us_median": 3.0}, "bwd": {"us_median": us + 2.0},
            "checked": 0, "wrong": 0, "tol_used": 0, "worst": "", "error": None}


def synthetic_files(tmp):
    sbn_rows, torch_rows = [], []
    for si, s in enumerate(SYN_SHAPES):
        for di, d in enumerate(SYN_DTYPES):
            for li, l in enumerate(SYN_LAYOUTS):
                for W in (1, 2, 4):
                    sbn_rows.append(syn_row("coop", s, si, d, di, l, li, W, B_SBN))
                    nr = syn_row("nccl", s, si, d, di, l, li, W, B_SBN, full=(W != 2))
                    if (s[0], d, l, W) == FAILED_NCCL:  # a failed row: error set, times null
                        nr["error"] = "sbnGroupEnd: made-up failure"
                        for op in ("fwd", "bwd"):
                            nr[op]["us_median"] = None
                    sbn_rows.append(nr)
                cud = syn_row("cudnn", s, si, d, di, l, li, 1, B_SBN)
                if s[0] == "S10" and d == "bf16" and l == "NCHW":  # not run: error null, note why
                    cud["note"] = "not supported by cuDNN: a made-up reason"
                    for op in ("fwd", "bwd"):
                        for k in ("us_median", "us_min", "us_p90", "host_us_median", "gbps_rank",
                                  "gbps_total", "pct_floor_a", "pct_floor_b"):
                            cud[op][k] = None
                sbn_rows.append(cud)
                torch_rows.append(syn_row("torch_bn", s, si, d, di, l, li, 1, B_TORCH))
                if not (s[0] == "S1" and d == "fp32" and l == "NHWC"):  # a path absent for one combo
                    torch_rows.append(syn_row("torch_syncbn", s, si, d, di, l, li, 1, B_TORCH))
    sbn = {"tool": "sbn-bench", "library_version": "0.1.0", "commit": "synthetic", "date": "2000-01-01T00:00:00Z",
           "mode": "gpu", "path": "coop", "floors": "made-up floors, synthetic", "device": {"name": "Synthetic GPU (made-up numbers)", "arch": "sm_90"},
           "driver_version": 13000, "runtime_version": 13000, "copy_bandwidth": {"gbps": B_SBN},
           "ranks": [1, 2, 4], "iters": 50, "warmup": 5, "rows": sbn_rows,
           "latency": [syn_lat(p, s, W) for p in ("coop", "nccl") for W in (1, 2, 3, 4) for s in ("tiny", "empty")]}
    tl = [syn_lat(p, s, 1) for p in ("torch_bn", "torch_syncbn") for s in ("tiny", "empty")]
    tl[1]["error"] = "RuntimeError: empty"  # torch_bn empty: rejected
    tl[1]["note"] = "PyTorch rejected the empty op: reported, not a failure"
    torch = {"tool": "torch_baseline", "commit": "synthetic", "date": "2000-01-01T00:00:00Z", "mode": "gpu",
             "torch_version": "0.0-synthetic", "device": {"name": "Synthetic GPU (made-up numbers)"},
             "copy_bandwidth": {"gbps": B_TORCH}, "ranks": [1], "rows": torch_rows, "latency": tl}
    cpu = {"tool": "sbn-bench", "mode": "cpu", "rows": [{"shape": "S1", "us_fwd": 1.0}]}
    files = []
    for name, obj in (("sbn.json", sbn), ("torch.json", torch), ("cpu.json", cpu)):
        p = os.path.join(tmp, name)
        with open(p, "w", encoding="utf-8") as f:
            json.dump(obj, f)
        files.append(p)
    return files


def md_tables(text):
    """{section title: [ {header: cell} ]} for every '## title' followed by a table."""
    out, title, header = {}, None, None
    for line in text.splitlines():
        if line.startswith("## "):
            title, header = line[3:].strip(), None
            out[title] = []
        elif line.startswith("|") and title is not None:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif set(line.replace("|", "").strip()) <= {"-"}:
                continue
            else:
                out[title].append(dict(zip(header, cells)))
    return out


def find(table, **kv):
    return [r for r in table if all(r.get(k) == v for k, v in kv.items())]


def section(tables, prefix):
    hits = [k for k in tables if k.startswith(prefix)]
    return tables[hits[0]] if hits else []


def png_ok(path):
    try:
        with open(path, "rb") as f:
            head = f.read(33)
    except OSError:
        return False
    if len(head) < 33 or head[:8] != PNG_SIG or head[12:16] != b"IHDR":
        return False
    w, h = struct.unpack(">II", head[16:24])
    return w > 0 and h > 0 and os.path.getsize(path) > 1000


def f2(v):
    return f"{v:.2f}"


def fus(v):
    """results.md's us format: 1 decimal from 10 us, 2 from 1 us, 3 below."""
    return f"{v:.1f}" if v >= 10 else (f"{v:.2f}" if v >= 1 else f"{v:.3f}")


def fpct(v):
    """results.md's % format: no decimal from 10%, 1 from 1%, 2 below."""
    return f"{v:.0f}%" if v >= 10 else (f"{v:.1f}%" if v >= 1 else f"{v:.2f}%")


def test_plot(tmp, with_plot=True):
    """plot.py on the synthetic files: results.md's every table against numbers computed
    here, and with_plot the charts (without matplotlib, --md-only: the tables alone, so
    that a machine without it, CI's, still checks them)."""
    files = synthetic_files(tmp)
    out = os.path.join(tmp, "out")
    r = run([sys.executable, PLOT, *files, "--out", out] + ([] if with_plot else ["--md-only"]))
    if not check(r.returncode == 0, f"plot.py on the synthetic JSON: exit 0 {r.stderr[-2000:]}"):
        return
    check("mode 'cpu'" in r.stderr, "plot.py skips a CPU-mode file and says so")
    pngs = ["shape_S1.png", "shape_S10.png", "scaling_fp32_NCHW.png", "scaling_fp32_NHWC.png",
            "scaling_bf16_NCHW.png", "scaling_bf16_NHWC.png", "latency.png", "summary.png"]
    for p in pngs if with_plot else []:
        check(png_ok(os.path.join(out, p)), f"{p} is a valid PNG (signature, IHDR, size)")
    listed = set(os.path.basename(l) for l in r.stdout.split())
    check((set(pngs) if with_plot else set()) | {"results.md"} <= listed, "plot.py lists what it wrote")
    with open(os.path.join(out, "results.md"), encoding="utf-8") as f:
        md = f.read()
    t = md_tables(md)
    fwd, bwd = section(t, "Forward"), section(t, "Backward")
    head = section(t, "Headline")
    check(len(fwd) == 8 and len(bwd) == 8 and len(head) == 2, "results.md: forward/backward 8 rows, headline 2")
    # per combination: t_path / t_coop and coop's % of floor, computed here
    for tab, op in ((fwd, "fwd"), (bwd, "bwd")):
        for si, s in enumerate(SYN_SHAPES):
            for di, d in enumerate(SYN_DTYPES):
                for li, l in enumerate(SYN_LAYOUTS):
                    rows = find(tab, shape=s[0], dtype=d, layout=l)
                    if not check(len(rows) == 1, f"results.md {op} row {s[0]} {d} {l}"):
                        continue
                    row = rows[0]
                    tc = syn_us("coop", si, di, li, op)
                    for p, col in (("nccl", "nccl/coop"), ("cudnn", "cuDNN/coop"),
                                   ("torch_bn", "torch_bn/coop"), ("torch_syncbn", "torch_syncbn/coop")):
                        missing = ((p == "cudnn" and s[0] == "S10" and d == "bf16" and l == "NCHW")
                                   or (p == "torch_syncbn" and s[0] == "S1" and d == "fp32" and l == "NHWC")
                                   or (p == "nccl" and (s[0], d, l, 1) == FAILED_NCCL))
                        want = "-" if missing else f2(syn_us(p, si, di, li, op) / tc)
                        check(row.get(col) == want, f"{op} {s[0]} {d} {l} {col} = {want} (got {row.get(col)})")
                    floorless = (s[0], d, l, 1) == FLOORLESS_COOP
                    fp = "nccl" if floorless else "coop"  # whose floors the table shows
                    fa = syn_floor(fp, si, di, li, op, 1, "a")
                    fb = syn_floor(fp, si, di, li, op, 1, "b")
                    want = ("-", "-") if floorless else (fpct(fa / tc * 100), fpct(fb / tc * 100))
                    check((row.get("coop %floor(a)"), row.get("coop %floor(b)")) == want,
                          f"{op} {s[0]} {d} {l} coop % of floor (a), (b) = {want}")
                    check(row.get("floor (a) us") == fus(fa) and row.get("floor (b) us") == fus(fb),
                          f"{op} {s[0]} {d} {l} floors (a), (b) in us: the JSON's ({fp} row)")
                    check(row.get("coop us") == fus(tc), f"{op} {s[0]} {d} {l} coop us")
    cud = find(fwd, shape="S10", dtype="bf16", layout="NCHW")
    check(cud and cud[0].get("cuDNN us") == "n/a", "a cuDNN row that did not run (note, null times): 'n/a'")
    fl = find(bwd, shape="S10", dtype="fp32", layout="NHWC")
    check(fl and fl[0].get("nccl us") == "failed", "a failed nccl row: 'failed'")
    bad = section(t, "Correctness")
    check(find(bad, path="cudnn", shape="S10", dtype="bf16") and find(bad, path="nccl", shape="S10", W="1")
          and not find(bad, path="coop"), "Correctness lists the failed and the not-run rows only")
    miss = find(fwd, shape="S1", dtype="fp32", layout="NHWC")
    check(miss and miss[0].get("torch_syncbn us") == "-", "a path absent for a combination: '-'")
    # headline: geometric means over the 4 combinations
    for si, s in enumerate(SYN_SHAPES):
        rows = find(head, shape=s[0])
        if not check(len(rows) == 1, f"headline row {s[0]}"):
            continue
        combos = [(di, li) for di in range(2) for li in range(2)]
        for p, name in (("nccl", "nccl"), ("torch_syncbn", "torch_syncbn"), ("cudnn", "cuDNN")):
            for op in ("fwd", "bwd"):
                logs = []
                for di, li in combos:
                    d, l = SYN_DTYPES[di], SYN_LAYOUTS[li]
                    if p == "cudnn" and s[0] == "S10" and d == "bf16" and l == "NCHW":
                        continue
                    if p == "torch_syncbn" and s[0] == "S1" and d == "fp32" and l == "NHWC":
                        continue
                    if p == "nccl" and (s[0], d, l, 1) == FAILED_NCCL:
                        continue
                    logs.append(math.log(syn_us(p, si, di, li, op) / syn_us("coop", si, di, li, op)))
                want = f2(math.exp(sum(logs) / len(logs)))
                got = rows[0].get(f"{name}/coop {op}")
                check(got == want, f"headline {s[0]} {name}/coop {op} = {want} (got {got})")
        logs = []
        for di, li in combos:
            if (s[0], SYN_DTYPES[di], SYN_LAYOUTS[li], 1) == FLOORLESS_COOP:
                continue
            fa = syn_floor("coop", si, di, li, "fwd", 1, "a")
            logs.append(math.log(fa / syn_us("coop", si, di, li, "fwd") * 100))
        want = fpct(math.exp(sum(logs) / len(logs)))
        check(rows[0].get("coop %floor(a) fwd") == want, f"headline {s[0]} coop %floor(a) fwd = {want}")
        check(rows[0].get("where") == s[5].replace("|", "/"), f"headline {s[0]} where")
    # against W
    wt = section(t, "coop and nccl-path against W")
    rr = find(wt, shape="S1", dtype="bf16", layout="NHWC", path="nccl/coop")
    want = f"{f2(syn_us('nccl', 0, 1, 1, 'fwd', 4) / syn_us('coop', 0, 1, 1, 'fwd', 4))} / " \
           f"{f2(syn_us('nccl', 0, 1, 1, 'bwd', 4) / syn_us('coop', 0, 1, 1, 'bwd', 4))}"
    check(rr and rr[0].get("W=4") == want, f"against W: S1 bf16 NHWC nccl/coop at W=4 = {want}")
    rr = find(wt, shape="S10", dtype="fp32", layout="NCHW", path="coop")
    want = f"{fus(syn_us('coop', 1, 0, 0, 'fwd', 2))} / {fus(syn_us('coop', 1, 0, 0, 'bwd', 2))}"
    check(rr and rr[0].get("W=2") == want, f"against W: S10 fp32 NCHW coop at W=2 = {want}")
    # latency
    lt = section(t, "Latency")
    rr = find(lt, path="coop", W="3")
    check(rr and rr[0].get("tiny fwd") == fus(6.0 + 3.0) and rr[0].get("empty bwd") == fus(5.0 + 3.0 + 2.0),
          "latency: coop W=3 tiny fwd, empty bwd")
    rr = find(lt, path="torch_bn", W="1")
    check(rr and rr[0].get("empty fwd") == "n/a" and rr[0].get("tiny fwd") == fus(30.0),
          "latency: torch_bn W=1, the rejected empty op says n/a")
    check("Synthetic GPU" in md and "copy bandwidth B = 3000.0 GB/s" in md, "results.md names the sources")
    check("Floors (`sbn.json`): made-up floors, synthetic" in md, "results.md quotes the JSON's floors text")
    if not with_plot:
        return

    # --md-only, and a file with only torch rows (no coop: no ratios, no crash)
    out2 = os.path.join(tmp, "out2")
    r = run([sys.executable, PLOT, files[1], "--out", out2])
    check(r.returncode == 0 and os.path.exists(os.path.join(out2, "results.md"))
          and png_ok(os.path.join(out2, "shape_S1.png")) and png_ok(os.path.join(out2, "latency.png")),
          f"plot.py with torch rows only: exit 0, results.md, shape and latency charts {r.stderr[-1500:]}")
    r = run([sys.executable, PLOT, files[2], "--out", os.path.join(tmp, "out3")])
    check(r.returncode == 1 and "no usable rows" in r.stderr, "plot.py with only a CPU-mode file: exit 1")


def test_md_cut_short(tmp):
    """A run cut short (complete: false) or failed (ok: false) says so in results.md's
    Correctness, and on stderr (it read as a clean run of fewer rows); a complete one does
    not. --md-only: no matplotlib needed."""
    sbn = json.load(open(synthetic_files(tmp)[0], encoding="utf-8"))
    for name, extra, want in (("whole", {"complete": True, "ok": True}, None),
                              ("cut", {"complete": False, "ok": False}, "the run was cut short")):
        d = dict(sbn, rows=sbn["rows"][:5], **extra)
        path = os.path.join(tmp, f"cut_{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(d, f)
        out = os.path.join(tmp, f"out_cut_{name}")
        r = run([sys.executable, PLOT, path, "--md-only", "--out", out])
        md = open(os.path.join(out, "results.md"), encoding="utf-8").read() if r.returncode == 0 else ""
        if want:
            check(want in md and "reported a failure" in md and "cut short" in r.stderr,
                  f"plot.py on a cut-short run says so in results.md and on stderr {r.stderr[-500:]}")
        else:
            check(r.returncode == 0 and "cut short" not in md and "reported a failure" not in md,
                  f"plot.py on a complete run: no such words {r.stderr[-500:]}")


def test_md_inference(tmp):
    """sbn-bench's inference table (schema 4) in results.md: its own section (us, x copy,
    t/copy, cuDNN/coop as the JSON gives them), and its checks in Correctness: a wrong
    inference value and a failed inference row count and are listed (results.md said '0
    wrong' of a run whose only wrong values were there). --md-only: no matplotlib needed."""
    sbn = json.load(open(synthetic_files(tmp)[0], encoding="utf-8"))

    def inf(path, shape, dtype, layout, us, wrong=0, error=None, **k):
        r = {"path": path, "shape": shape, "dtype": dtype, "layout": layout, "ranks": 1,
             "us_median": us, "x_copy": k.get("x_copy"), "t_over_copy": k.get("t_over_copy"),
             "t_over_coop": k.get("t_over_coop"), "checked": 100, "wrong": wrong, "error": error,
             "note": ""}
        return r
    rows = [inf("coop", "S1", "fp32", "NCHW", 10.0, x_copy=1.25, t_over_copy=1.1),
            inf("cudnn", "S1", "fp32", "NCHW", 12.0, t_over_coop=1.2),
            inf("coop", "S10", "fp32", "NCHW", 5.0, wrong=3, x_copy=2.5, t_over_copy=1.5),
            inf("coop", "S10", "bf16", "NHWC", None, error="made-up failure")]
    counts = {}
    for name, extra in (("without", {}), ("with", {"inference": rows, "inference_target": 1.1})):
        path = os.path.join(tmp, f"inf_{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dict(sbn, **extra), f)
        out = os.path.join(tmp, f"out_inf_{name}")
        r = run([sys.executable, PLOT, path, "--md-only", "--out", out])
        if not check(r.returncode == 0, f"plot.py --md-only, inference {name}: exit 0 {r.stderr[-500:]}"):
            return
        md = open(os.path.join(out, "results.md"), encoding="utf-8").read()
        m = re.search(r"`inf_%s.json`: (\d+) rows, (\d+) values checked, (\d+) wrong, (\d+) rows with an error"
                      % name, md)
        if not check(m is not None, f"results.md, inference {name}: the Correctness line"):
            return
        counts[name] = [int(g) for g in m.groups()]
    check([w - o for w, o in zip(counts["with"], counts["without"])] == [4, 400, 3, 1],
          f"Correctness counts the inference rows: +4 rows, +400 checked, +3 wrong, +1 error "
          f"({counts['without']} -> {counts['with']})")
    t = md_tables(md)
    it = section(t, "Inference")
    want = [("coop", "S1", "fp32", "NCHW", "10.0", "1.25", "1.10", "-"),
            ("cuDNN", "S1", "fp32", "NCHW", "12.0", "-", "-", "1.20"),
            ("coop", "S10", "fp32", "NCHW", "5.00", "2.50", "1.50", "-"),
            ("coop", "S10", "bf16", "NHWC", "failed", "-", "-", "-")]
    got = [(r.get("path"), r.get("shape"), r.get("dtype"), r.get("layout"), r.get("us"),
            r.get("x copy"), r.get("t/copy"), r.get("cuDNN/coop")) for r in it]
    check(got == want, f"results.md's Inference table: {got}")
    check("the target: <= 1.1" in md, "results.md's Inference title gives the target")
    bad = section(t, "Correctness")
    check(find(bad, path="coop (inference)", shape="S10", dtype="fp32", wrong="3")
          and find(bad, path="coop (inference)", shape="S10", dtype="bf16")
          and not find(bad, path="coop (inference)", shape="S1"),
          "Correctness lists the wrong and the failed inference rows, not the good ones")
    w = find(bad, path="coop (inference)", shape="S10", dtype="fp32")
    check(w and w[0].get("error / note") == "3 wrong",
          f"Correctness says a timed row with wrong values is wrong, not 'not run' ({w})")


def test_plot_without_matplotlib(tmp):
    fake = os.path.join(tmp, "no_mpl")
    os.makedirs(os.path.join(fake, "matplotlib"), exist_ok=True)
    with open(os.path.join(fake, "matplotlib", "__init__.py"), "w", encoding="utf-8") as f:
        f.write("raise ImportError('matplotlib hidden by test_plot.py')\n")
    files = synthetic_files(tmp)
    r = run([sys.executable, PLOT, files[0], "--out", os.path.join(tmp, "out_nompl")],
            env={"PYTHONPATH": fake})
    check(r.returncode == EXIT_SKIP and "matplotlib is not installed" in r.stderr,
          "plot.py without matplotlib: exit 77 and says why")
    r = run([sys.executable, PLOT, files[0], "--md-only", "--out", os.path.join(tmp, "out_md")],
            env={"PYTHONPATH": fake})
    check(r.returncode == 0 and os.path.exists(os.path.join(tmp, "out_md", "results.md")),
          "plot.py --md-only without matplotlib: exit 0, results.md")


# ---- 5. plot.py --history: the index of the committed GPU runs ---------------------------------
RESULTS = os.path.join(HERE, "results")
HIST_BEGIN, HIST_END = "<!-- history:begin -->", "<!-- history:end -->"
RUN_DIR = r"^\d{4}-\d{2}-\d{2}-[a-z0-9]+-[0-9a-f]{7,40}$"


def runs_tsv(root):
    """runs.tsv read here, independently of plot_history.py: [(folder, bench, torch, ran)]."""
    out = []
    with open(os.path.join(root, "runs.tsv"), encoding="utf-8") as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                out.append(tuple(c.strip() for c in line.rstrip("\n").split("\t")))
    return out


def history_table(readme):
    """The rows ({header: cell}) of the table between the history markers of `readme`."""
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    b, e = text.find(HIST_BEGIN), text.find(HIST_END)
    if not 0 <= b < e:
        return None
    return md_tables("## history\n" + text[b:e]).get("history", [])


def raw_row(rows, path, shape, ranks=1):
    hit = None
    for r in rows:
        if (r.get("path"), r.get("shape"), r.get("dtype"), r.get("layout"), r.get("ranks")) == \
                (path, shape, "fp32", "NCHW", ranks):
            hit = r
    return hit


def raw_cells(root, folder, bench, torch):
    """The cells a run's row must hold, computed here from its JSON files read with json."""
    with open(os.path.join(root, folder, bench), encoding="utf-8") as f:
        b = json.load(f)
    t = None
    if torch != "-":
        with open(os.path.join(root, folder, torch), encoding="utf-8") as f:
            t = json.load(f)

    def fb(r):
        return r["fwd"]["us_median"], r["bwd"]["us_median"]

    def plus(r):
        if r is None:
            return "-"
        a, c = fb(r)
        return f"{fus(a)} + {fus(c)} = {fus(a + c)}"
    s5, s10 = raw_row(b["rows"], "coop", "S5"), raw_row(b["rows"], "coop", "S10")
    lat = {r["ranks"]: r for r in b["latency"] if r["path"] == "coop" and r["shape"] == "empty"}
    ge = cells = 0
    for r in b["rows"]:
        if r["path"] != "coop" or r["ranks"] != 1:
            continue
        cu = [x for x in b["rows"] if x["path"] == "cudnn" and x["ranks"] == 1 and
              (x["shape"], x["dtype"], x["layout"]) == (r["shape"], r["dtype"], r["layout"])]
        for op in ("fwd", "bwd"):
            if cu and cu[-1][op]["us_median"] is not None and r[op]["us_median"] is not None:
                cells += 1
                ge += cu[-1][op]["us_median"] >= r[op]["us_median"]
    commit = folder.split("-")[-1]
    date = b["date"][:10] + " " + b["date"][11:16] + "Z"
    return b["date"], {
        "date (bench JSON)": f"[{date}]({folder}/)",
        "device": b["device"]["name"],
        "commit": commit + (f" (bench: {b['commit']})" if b["commit"] != commit else ""),
        "S5 fwd / bwd": "{} / {}".format(*map(fus, fb(s5))),
        "S10 fwd + bwd": plus(s10),
        "empty op W = 1 fwd / bwd": "{} / {}".format(*map(fus, fb(lat[1]))),
        # at the largest W of the run's latency rows: its key and label are the table's
        # (check_history_table), which depend on every run's largest W
        "_empty_w": (max(lat), "{} / {}".format(*map(fus, fb(lat[max(lat)])))),
        "coop >= cuDNN (W = 1 cells)": f"{ge} of {cells}" if cells else "-",  # no cuDNN row: "-"
        "torch_bn S10 fwd + bwd": plus(raw_row(t["rows"], "torch_bn", "S10")) if t else "-",
        "syncbn_torch S10 fwd + bwd": plus(raw_row(t["rows"], "syncbn_torch", "S10")) if t else "-",
    }


def check_history_table(root, readme, what):
    """Every row of `readme`'s table is what the JSON files of `root` give (read here), one row
    per runs.tsv line and per run folder, in date order. Returns the table."""
    table = history_table(readme)
    if not check(table is not None, f"{what}: a table between the history markers"):
        return []
    runs = runs_tsv(root)
    folders = sorted(d for d in os.listdir(root) if re.match(RUN_DIR, d))
    check(sorted(r[0] for r in runs) == folders and len(table) == len(folders),
          f"{what}: one row per run folder ({len(folders)}), each in runs.tsv")
    want = sorted((raw_cells(root, f, b, t) + (f,) for f, b, t, _ in runs),
                  key=lambda x: (x[0], x[2].split("-")[-1]))
    # the empty op at the largest W of each run's latency rows (bench/results/README.md):
    # the column says "W = 8" when every run's largest is 8, else names each largest W
    # ("W = 1/8"), and then each cell says its own ("(W = 1)")
    ws = sorted({cells["_empty_w"][0] for _, cells, _ in want})
    label = "W = " + "/".join(str(w) for w in ws)
    for _, cells, _ in want:
        w, cell = cells.pop("_empty_w")
        cells[f"empty op {label} fwd / bwd"] = cell + (f" (W = {w})" if len(ws) > 1 else "")
    for (_, cells, folder), got in zip(want, table):
        bad = {k: (got.get(k), v) for k, v in cells.items() if got.get(k) != v}
        check(not bad, f"{what}: {folder}: the cells are the JSON's numbers"
                       + (f" (got, want: {bad})" if bad else ""))
    return table


def edit_json(path, fn):
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    fn(d)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(d, f)


def set_us(rows, path, shape, op, value, dtype="fp32", layout="NCHW", ranks=1):
    hits = [r for r in rows if (r["path"], r["shape"], r["dtype"], r["layout"], r["ranks"]) ==
            (path, shape, dtype, layout, ranks)]
    for r in hits:
        r[op]["us_median"] = value
        r["us_" + op] = value
    assert hits, (path, shape, op)


def test_history(tmp, with_plot):
    """plot.py --history: the committed README's table is what the committed JSON files give
    (--check, and each cell against the JSON read here); in a copy of two runs, a number
    changed in a JSON file changes that cell of the table and the chart's series, and
    --check catches the stale table until it is regenerated."""
    readme = os.path.join(RESULTS, "README.md")
    r = run([sys.executable, PLOT, "--history", RESULTS, "--out", RESULTS, "--check"])
    check(r.returncode == 0, "committed bench/results/README.md: plot.py --history --check passes "
                             f"(the table is what the files give) {r.stderr[-3000:]}")
    check_history_table(RESULTS, readme, "committed README.md")

    # a copy of two runs, then numbers changed in their JSON files
    root = os.path.join(tmp, "results")
    keep = {"2026-11-26-h200-1599faa", "2026-11-27-h200-b83448e"}
    os.makedirs(root)
    for d in keep:
        # copies writable whatever the source's modes (a read-only source tree: Nix, a
        # sandboxed build): the test edits and removes them
        shutil.copytree(os.path.join(RESULTS, d), os.path.join(root, d), copy_function=shutil.copyfile)
        for where, dirs, _ in os.walk(os.path.join(root, d)):
            for x in [where] + [os.path.join(where, y) for y in dirs]:
                os.chmod(x, os.stat(x).st_mode | stat.S_IWUSR)
    with open(os.path.join(root, "runs.tsv"), "w", encoding="utf-8") as f:
        f.write("# two runs copied by test_plot.py\n")
        for run_ in runs_tsv(RESULTS):
            if run_[0] in keep:
                f.write("\t".join(run_) + "\n")
    hreadme = os.path.join(root, "README.md")
    with open(hreadme, "w", encoding="utf-8") as f:
        f.write(f"# copied runs\n\ntext above\n\n{HIST_BEGIN}\nstale\n{HIST_END}\n\ntext below\n")
    hist = [sys.executable, PLOT, "--history", root, "--out", root]
    r = run(hist + ["--check"])
    check(r.returncode == 1 and "differs" in r.stderr, "--check on a stale table: exit 1 with a diff")
    r = run(hist + ["--md-only"])
    check(r.returncode == 0, f"plot.py --history --md-only: exit 0 {r.stderr[-2000:]}")
    with open(hreadme, encoding="utf-8") as f:
        text = f.read()
    check(text.startswith("# copied runs\n\ntext above\n\n" + HIST_BEGIN) and
          text.endswith(HIST_END + "\n\ntext below\n") and "stale" not in text,
          "the block between the markers is rewritten, the text around it kept")
    before = check_history_table(root, hreadme, "copy")
    check(run(hist + ["--check"]).returncode == 0, "--check after regenerating: exit 0")

    new = os.path.join(root, "2026-11-27-h200-b83448e")
    bq, tq = os.path.join(new, "bench-quick.json"), os.path.join(new, "torch.json")

    def change(d):
        set_us(d["rows"], "coop", "S5", "fwd", 123.456)
        set_us(d["rows"], "cudnn", "S10", "fwd", 1000.0)  # was faster than coop: now slower
        set_us(d["latency"], "coop", "empty", "bwd", 7.777)
        d["date"] = "2026-11-25T00:00:00Z"  # before the other run: the rows swap
    edit_json(bq, change)
    edit_json(tq, lambda d: set_us(d["rows"], "torch_bn", "S10", "fwd", 50.0))
    r = run(hist + ["--check"])
    check(r.returncode == 1 and "123.5" in r.stderr,
          "--check after a JSON number changed: exit 1, the diff shows the new number")
    r = run(hist + ["--md-only"])
    after = check_history_table(root, hreadme, "copy after the change")
    g1 = None
    if check(r.returncode == 0 and len(before) == 2 and len(after) == 2,
             "regenerated: two rows before and after"):
        old, upd, other = before[1], after[0], after[1]
        check(other == before[0], "the other run's row is unchanged (and now second: date order)")
        check(upd["S5 fwd / bwd"] == "123.5 / " + old["S5 fwd / bwd"].split(" / ")[1],
              f"S5 forward cell follows the JSON: {old['S5 fwd / bwd']} -> {upd['S5 fwd / bwd']}")
        g0, g1 = (int(x["coop >= cuDNN (W = 1 cells)"].split()[0]) for x in (old, upd))
        check(g1 == g0 + 1, f"coop >= cuDNN count follows the JSON: {g0} -> {g1}")
        check(upd["empty op W = 1 fwd / bwd"].endswith(" / 7.78"),
              f"empty op cell follows the JSON: {upd['empty op W = 1 fwd / bwd']}")
        check(upd["torch_bn S10 fwd + bwd"].startswith("50.0 + "),
              f"torch_bn S10 cell follows the torch JSON: {upd['torch_bn S10 fwd + bwd']}")
        same = [k for k in old if k not in ("date (bench JSON)", "S5 fwd / bwd", "empty op W = 1 fwd / bwd",
                                            "coop >= cuDNN (W = 1 cells)", "torch_bn S10 fwd + bwd")]
        check(all(upd[k] == old[k] for k in same), "the run's other cells are unchanged")
    # the chart's numbers: plot_history.series, which history.png draws
    sys.path.insert(0, HERE)
    import plot_history
    s = plot_history.series(plot_history.history(root))
    s5 = dict(s["S5 fp32 NCHW, W = 1, coop (us)"])
    check(s5["forward"][0] == 123.456 and s["labels"][0].endswith("b83448e"),
          "history.png's series: the changed S5 forward, first in date order")
    cells = dict(s["W = 1 cells where coop >= cuDNN"])
    check(g1 is not None and cells["coop >= cuDNN"][0] == g1,
          "history.png's series: the changed coop >= cuDNN count")

    # runs.tsv against the folders
    os.makedirs(os.path.join(root, "2026-11-28-h100-abcdef1"))
    r = run(hist + ["--md-only"])
    check(r.returncode == 1 and "2026-11-28-h100-abcdef1" in r.stderr,
          "a run folder without a runs.tsv line: exit 1 naming it")
    os.rmdir(os.path.join(root, "2026-11-28-h100-abcdef1"))
    os.remove(tq)
    r = run(hist + ["--md-only"])
    check(r.returncode == 1 and "torch.json: no such file" in r.stderr,
          "a runs.tsv line naming a missing file: exit 1 naming it")
    shutil.copyfile(os.path.join(RESULTS, "2026-11-27-h200-b83448e", "torch.json"), tq)
    shutil.copyfile(tq, bq)
    r = run(hist + ["--md-only"])
    check(r.returncode == 1 and "not a GPU-mode sbn-bench JSON" in r.stderr,
          "a torch_baseline JSON where the bench JSON goes: exit 1")
    if with_plot:
        shutil.copyfile(os.path.join(RESULTS, "2026-11-27-h200-b83448e", "bench-quick.json"), bq)
        r = run(hist)
        check(r.returncode == 0 and png_ok(os.path.join(root, "history.png")),
              f"plot.py --history: exit 0, history.png {r.stderr[-2000:]}")
        check(png_ok(os.path.join(RESULTS, "history.png")), "the committed bench/results/history.png is a PNG")


def history_only(tmp, with_plot):
    """--history-only: part 5; the picture too unless --no-plot (exit 77 without matplotlib,
    after the table's checks, which need none)."""
    has_mpl = importlib.util.find_spec("matplotlib") is not None
    test_history(tmp, with_plot and has_mpl)
    if failures:
        print(f"{len(failures)} failed")
        return 1
    if with_plot and not has_mpl:
        print("SKIP the history.png checks: matplotlib is not installed; "
              "python3 -m pip install -r bench/requirements-plot.txt (the table's checks passed)")
        return EXIT_SKIP
    print("all passed")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sbn-bench", help="sbn-bench binary to compare shapes with "
                                        "(default: build/default/bench/sbn-bench if it exists)")
    ap.add_argument("--no-plot", action="store_true", help="torch_baseline.py checks only (no matplotlib)")
    ap.add_argument("--history-only", action="store_true",
                    help="part 5 only: plot.py --history on bench/results (with --no-plot: the "
                         "table alone, no matplotlib)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (prints it)")
    args = ap.parse_args()
    exe = args.sbn_bench
    if not exe:
        guess = os.path.join(ROOT, "build", "default", "bench", "sbn-bench")
        exe = guess if os.access(guess, os.X_OK) else None
    elif not os.access(exe, os.X_OK):
        print(f"test_plot.py: --sbn-bench {exe}: not an executable", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="test_plot.")
    try:
        if args.history_only:
            return history_only(tmp, not args.no_plot)
        has_torch = test_baseline_shapes(exe, tmp)
        test_baseline_accuracy()
        test_md_cut_short(tmp)
        test_md_inference(tmp)
        sbn_js, sbn = sbn_bench_json(exe, tmp) if exe else (None, None)
        if sbn:
            test_sbn_bench_floors(sbn)
            test_sbn_bench_inference(sbn)
            test_baseline_floors(sbn_js, sbn, tmp)
        elif not exe:
            print("skip the floors checks: no sbn-bench binary (--sbn-bench PATH)")
        if has_torch:
            dry = test_baseline_dryrun(tmp, sbn_js, sbn)
            if dry and not args.no_plot:
                r = run([sys.executable, PLOT, dry, "--any-mode", "--out", os.path.join(tmp, "out_dry")])
                check(r.returncode == 0 and png_ok(os.path.join(tmp, "out_dry", "shape_S7.png")),
                      f"plot.py --any-mode on the dry-run JSON {r.stderr[-1500:]}")
        else:
            print("skip torch_baseline.py dry run: PyTorch is not installed here")
        if args.no_plot:
            pass
        else:
            try:
                import matplotlib  # noqa: F401
            except ImportError as e:
                test_plot(tmp, False)  # results.md's tables need no matplotlib
                test_plot_without_matplotlib(tmp)  # matplotlib's absence: here for real
                test_history(tmp, False)  # nor the history table
                if failures:
                    print(f"{len(failures)} failed")
                    return 1
                print(f"SKIP plot checks: matplotlib is not installed ({e}); "
                      "python3 -m pip install -r bench/requirements-plot.txt")
                return EXIT_SKIP
            test_plot(tmp)
            test_plot_without_matplotlib(tmp)
            test_history(tmp, True)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
