#!/usr/bin/env python3
"""targets.py - issue 13's performance targets and issue 51's fused ones, row by row, from one
GPU run's files.

    python3 bench/targets.py [--summary] FILE...

FILE: the run's JSON files, each known by what it holds: sbn-bench --json (bench.json,
bench-stream-s10.json, fused-*.json, ...), torch_baseline.py --json (torch.json),
torch_fused_memory.py --json (fused-memory.json). Give the main bench file first: a cell that
several files hold is judged once, from the first of them.

The targets (bench/notes/targets.md says where each stands):

  floor      a coop row of S1-S9 (every W): forward <= 1.15 x its floor, backward <= 1.25 x;
             floor (b) (each tensor crosses HBM once) where the op's inputs fit on chip, else
             floor (a) (the inputs read twice). The floors are the row's own (bench/floors.c,
             at the run's copy bandwidth B). S10 is judged by its latency target instead: its
             floor (8 KiB at B) is a few nanoseconds, below any kernel launch.
  cudnn      W = 1: t_cudnn / t_coop >= 1.3 where the inputs fit on chip, >= 1.0 elsewhere
  nccl       the same W: t_nccl / t_coop >= 3 on S10, >= 1.4 where the inputs fit, >= 1.05
             elsewhere
  pytorch    W = 1: t(nn.SyncBatchNorm's op sequence, torch_baseline's torch_syncbn) / t_coop
             >= 4 on S10, >= 1.8 where the inputs fit, >= 1.15 elsewhere
  s10        S10 at W = 1: forward + backward <= 10 us
  exchange   the latency rows: t(W) - t(1) <= 2 us per op for W = 2..8, the same kernel at
             both W (auto's W = 1 kernel may differ from its W > 1 one: such a pair is not
             judged, and a run with SBN_KERNEL=stream gives the pair)
  inference  the library's inference rows: x_copy (t over a copy of x at B) <= the file's
             inference_target (1.1)
  fused      issue 51: t_split / t_coop of a fused op's forward (split: the plain op and a
             separate activation kernel) >= 1.3 on S1-S9
  memory     issue 51: a model with in-place fused layers, its activation memory over the
             unfused model's <= 0.6
  wrong      every row of every file: no wrong value, no failure

"Fits on chip": the op's inputs on the one GPU (forward x, backward x and dy; all W ranks'
x, as the floors count it) are at most the L2's bytes (the file's device.l2_bytes: 50 MiB on
an H100, 60 MiB on an H200). The L2 is the on-chip store the second read of a two-pass kernel
can hit; the onchip kernel's registers and shared memory hold less (~41 MB). A file without
l2_bytes leaves these cells unjudged. The backward's inputs are x and dy, as the issue's
opening has it ("keep a rank's x (backward: x and dy) on chip"): its second pass needs both,
so its floor (b), each read once, is out of reach where the two do not fit together. Where x
alone fits and x and dy do not (on the H200: S1, S4, S6 bf16; S3, S7 fp32), the backward is
judged by floor (a) and the bounds for inputs that do not fit; the forward of the same
shape by floor (b) and the bounds for inputs that fit.

Which files count: a target of the library as users run it (floor, cudnn, nccl, pytorch,
s10, inference) reads the sbn-bench files of the plain op (epilogue none) run without
SBN_KERNEL or SBN_ALGO; exchange reads every sbn-bench file's latency rows (labelled with the
SBN_KERNEL they ran under); fused the files with split rows. SBN_INFER is not in the JSON: a
file run under it is taken as plain. Rows that failed or had wrong values are no comparison.

--summary prints the last table alone: per target, met by N of M and the worst row. A
report: exit 0 whatever it finds, 2 on a file it cannot read or does not know. No torch.
"""

import json
import sys

from torch_targets import median_us, valid  # beside this file (no torch in it)

FLOOR = {"fwd": 1.15, "bwd": 1.25}
CUDNN = {"S10": 1.3, "fit": 1.3, "else": 1.0}  # S10 fits on chip
NCCL = {"S10": 3.0, "fit": 1.4, "else": 1.05}
TORCH = {"S10": 4.0, "fit": 1.8, "else": 1.15}
S10_US = 10.0
EXCH_US, EXCH_MAX_W = 2.0, 8
INFER_DEFAULT = 1.1
FUSED = 1.3
MEMORY = 0.6
OPS = ("fwd", "bwd")
TARGETS = ("floor", "cudnn", "nccl", "pytorch", "s10", "exchange", "inference", "fused", "memory",
           "wrong")


# ---- the files -------------------------------------------------------------------------------
def kind_of(top):
    """'bench', 'torch', 'memory' or None."""
    if not isinstance(top, dict) or not isinstance(top.get("rows"), list):
        return None
    if top.get("tool") == "sbn-bench":
        return "bench"
    if top.get("tool") == "torch_baseline":
        return "torch"
    if isinstance(top.get("meta"), dict) and all(isinstance(r, dict) and "model" in r
                                                 for r in top["rows"]):
        return "memory"
    return None


def load(path):
    with open(path, encoding="utf-8") as f:
        top = json.load(f)
    kind = kind_of(top)
    if kind is None:
        raise ValueError(f"{path}: not an sbn-bench, torch_baseline or torch_fused_memory JSON file")
    return {"path": path, "kind": kind, "top": top}


def plain(f):
    """An sbn-bench file of the plain op as users run it (no epilogue, no SBN_KERNEL/SBN_ALGO)."""
    t = f["top"]
    return (f["kind"] == "bench" and t.get("mode") == "gpu" and t.get("epilogue") in (None, "none")
            and t.get("sbn_kernel_env") is None and t.get("sbn_algo_env") is None)


def l2_of(f):
    dev = f["top"].get("device")
    v = dev.get("l2_bytes") if isinstance(dev, dict) else None
    return v if isinstance(v, (int, float)) and v > 0 else None


# ---- rows --------------------------------------------------------------------------------------
def cell(r):
    return (r.get("shape"), r.get("dtype"), r.get("layout"))


def name(r, op=None, w=True):
    s = "%s %s %s" % cell(r)
    if w and r.get("ranks") is not None:
        s += " W%s" % r.get("ranks")
    return s + (" " + op if op else "")


def fits(r, op, l2):
    """Whether the op's inputs (forward x, backward x and dy, all W ranks') fit in the L2."""
    b = r.get("bytes_x_total")
    if l2 is None or not isinstance(b, (int, float)):
        return None
    return b * (1 if op == "fwd" else 2) <= l2


def size_class(r, op, l2):
    """'S10', 'fit', 'else', or None when the fit is unknown."""
    if r.get("shape") == "S10":
        return "S10"
    f = fits(r, op, l2)
    return None if f is None else ("fit" if f else "else")


class Verdicts:
    def __init__(self):
        self.v = {t: [] for t in TARGETS}
        self.notes = {t: [] for t in TARGETS}
        self.seen = set()

    def once(self, *key):
        """True the first time a key is seen: a cell several files hold is judged once."""
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def at_most(self, target, label, q, bound, text, src):
        self.v[target].append({"label": label, "q": q, "bound": bound, "met": q <= bound,
                               "margin": q / bound if bound else float("inf"), "text": text,
                               "rule": f"<= {bound:g}", "src": src})

    def flag(self, target, label, met, text, src):
        """A verdict with no number: q 0 met, 1 missed."""
        self.v[target].append({"label": label, "q": 0 if met else 1, "bound": 0, "met": met,
                               "margin": 0 if met else 1, "text": text, "rule": "== 0", "src": src})

    def at_least(self, target, label, q, bound, text, src):
        self.v[target].append({"label": label, "q": q, "bound": bound, "met": q >= bound,
                               "margin": bound / q if q else float("inf"), "text": text,
                               "rule": f">= {bound:g}", "src": src})


def judge_floor(files, out):
    for f in filter(plain, files):
        l2 = l2_of(f)
        for r in f["top"]["rows"]:
            if r.get("path") != "coop" or r.get("shape") == "S10" or not valid(r):
                continue
            for op in OPS:
                t, fit = median_us(r, op), fits(r, op, l2)
                if t is None or not out.once("floor", cell(r), r.get("ranks"), op):
                    continue
                if fit is None:
                    out.notes["floor"].append(f"{name(r, op)}: no l2_bytes in {f['path']}")
                    continue
                which = "b" if fit else "a"
                fl = r[op].get(f"floor_{which}_us")
                if not isinstance(fl, (int, float)) or fl <= 0:
                    out.notes["floor"].append(f"{name(r, op)}: no floor (no B?) in {f['path']}")
                    continue
                out.at_most("floor", name(r, op), t / fl, FLOOR[op],
                            f"t {t:.1f} us, floor ({which}) {fl:.2f} us"
                            f" ({'fits' if fit else 'does not fit'} on chip)", f["path"])


def judge_ratio(files, out, target, other, rule):
    for f in filter(plain, files):
        l2 = l2_of(f)
        rows = f["top"]["rows"]
        others = {(cell(r), r.get("ranks")): r for r in rows if r.get("path") == other and valid(r)}
        for r in rows:
            if r.get("path") != "coop" or not valid(r):
                continue
            if target == "cudnn" and r.get("ranks") != 1:
                continue
            o = others.get((cell(r), r.get("ranks")))  # (cudnn: 1, as the coop rows here)
            for op in OPS:
                t, to, c = median_us(r, op), median_us(o, op), size_class(r, op, l2)
                if t is None or to is None or c is None:
                    continue
                if not out.once(target, cell(r), r.get("ranks"), op):
                    continue
                out.at_least(target, name(r, op), to / t, rule[c],
                             f"coop {t:.1f} us, {other} {to:.1f} us ({c})", f["path"])


def judge_pytorch(files, out):
    coop = {}
    for f in filter(plain, files):
        for r in f["top"]["rows"]:
            if r.get("path") == "coop" and r.get("ranks") == 1 and valid(r):
                coop.setdefault(cell(r), (r, l2_of(f)))
    for f in (f for f in files if f["kind"] == "torch"):
        if f["top"].get("mode") != "gpu":  # --device cpu: a dry run, no baseline
            out.notes["pytorch"].append(f"{f['path']}: mode {f['top'].get('mode')!r}, not judged")
            continue
        for r in f["top"]["rows"]:
            if r.get("path") != "torch_syncbn" or r.get("epilogue") not in (None, "none") or \
                    r.get("ranks", 1) != 1 or not valid(r):
                continue
            c, l2 = coop.get(cell(r), (None, None))
            for op in OPS:
                t, ts = median_us(c, op), median_us(r, op)
                k = size_class(c, op, l2) if c else None
                if t is None or ts is None or k is None or not out.once("pytorch", cell(r), op):
                    continue
                out.at_least("pytorch", name(r, op, w=False), ts / t, TORCH[k],
                             f"coop {t:.1f} us, torch_syncbn {ts:.1f} us ({k})", f["path"])


def judge_s10(files, out):
    for f in filter(plain, files):
        for r in f["top"]["rows"]:
            if r.get("path") == "coop" and r.get("shape") == "S10" and r.get("ranks") == 1 and valid(r):
                tf, tb = median_us(r, "fwd"), median_us(r, "bwd")
                if tf is None or tb is None or not out.once("s10", cell(r)):
                    continue
                out.at_most("s10", name(r), tf + tb, S10_US, f"{tf:.1f} + {tb:.1f} us", f["path"])


def judge_exchange(files, out):
    for f in files:
        t = f["top"]
        if f["kind"] != "bench" or t.get("mode") != "gpu" or t.get("epilogue") not in (None, "none"):
            continue
        env = t.get("sbn_kernel_env")
        tag = f"SBN_KERNEL={env}" if env else "auto"
        lat = [r for r in t.get("latency") or [] if r.get("path") == "coop" and valid(r)]
        one = {cell(r): r for r in lat if r.get("ranks") == 1}
        unpaired = 0
        for r in lat:
            w = r.get("ranks")
            if not isinstance(w, int) or w < 2 or w > EXCH_MAX_W or cell(r) not in one:
                continue
            base = one[cell(r)]
            for op in OPS:
                t1, tw = median_us(base, op), median_us(r, op)
                k1, kw = (base.get("kernel") or {}).get(op), (r.get("kernel") or {}).get(op)
                if t1 is None or tw is None:
                    continue
                if k1 != kw:
                    unpaired += 1
                    continue
                if not out.once("exchange", tag, cell(r), w, op):
                    continue
                out.at_most("exchange", f"{name(r, op)} {tag} ({kw})", tw - t1, EXCH_US,
                            f"{tw:.2f} - {t1:.2f} us at W = 1", f["path"])
        if unpaired:
            out.notes["exchange"].append(
                f"{f['path']} ({tag}): {unpaired} latency cell(s) ran another kernel at W = 1 than "
                "at W, not judged")


def judge_inference(files, out):
    for f in filter(plain, files):
        bound = f["top"].get("inference_target") or INFER_DEFAULT
        for r in f["top"].get("inference") or []:
            q = r.get("x_copy")
            if r.get("path") != "coop" or not valid(r) or not isinstance(q, (int, float)):
                continue
            if out.once("inference", cell(r)):
                out.at_most("inference", name(r, w=False), q, bound,
                            f"t {r.get('us_median'):.1f} us, copy of x at B {r.get('floor_us'):.1f} us",
                            f["path"])


def judge_fused(files, out):
    for f in files:
        t = f["top"]
        if f["kind"] != "bench" or t.get("sbn_kernel_env") is not None or t.get("sbn_algo_env") is not None:
            continue
        rows = t["rows"]
        coop = {(cell(r), r.get("ranks"), r.get("epilogue")): r for r in rows
                if r.get("path") == "coop" and valid(r)}
        for r in rows:
            if r.get("path") != "split" or not valid(r) or r.get("shape") == "S10":
                continue
            c = coop.get((cell(r), r.get("ranks"), r.get("epilogue")))
            ts, tc = median_us(r, "fwd"), median_us(c, "fwd")
            if ts is None or tc is None or not out.once("fused", cell(r), r.get("ranks"), r.get("epilogue")):
                continue
            out.at_least("fused", f"{name(r, 'fwd')} {r.get('epilogue')}", ts / tc, FUSED,
                         f"fused {tc:.1f} us, split {ts:.1f} us", f["path"])


def judge_memory(files, out):
    for f in (f for f in files if f["kind"] == "memory"):
        for r in f["top"]["rows"]:
            q = r.get("ratio")
            if (r.get("inplace_layers") or 0) > 0 and r.get("error"):
                out.flag("memory", str(r.get("model")), False, f"refused: {r.get('error')}", f["path"])
            elif (r.get("inplace_layers") or 0) > 0 and isinstance(q, (int, float)):
                out.at_most("memory", str(r.get("model")), q, MEMORY,
                            f"{r.get('bytes', 0) / 2**20:.1f} MiB of activation memory; q: over the unfused model's",
                            f["path"])


def judge_wrong(files, out):
    for f in files:
        t = f["top"]
        n = bad = 0
        for table in ("rows", "latency", "inference"):
            for r in t.get(table) or []:
                if not isinstance(r, dict):
                    continue
                if "not a failure" in (r.get("note") or "") and not r.get("wrong"):
                    continue  # torch_baseline's empty op that PyTorch rejects: reported only
                n += 1
                if valid(r):
                    continue
                bad += 1
                why = r.get("error") or f"{r.get('wrong')} wrong"
                label = (f"model {r.get('model')}" if "model" in r  # torch_fused_memory's
                         else f"{r.get('path')} {name(r)}")
                out.flag("wrong", f"{label} ({table})", False, str(why), f["path"])
        if n and not bad:
            out.flag("wrong", f"{n} rows", True, "every row right", f["path"])
        if t.get("complete") is False:
            out.notes["wrong"].append(f"{f['path']}: complete false (the run was cut short: "
                                      "its missing rows are judged nowhere)")


def judge(files):
    out = Verdicts()
    judge_floor(files, out)
    judge_ratio(files, out, "cudnn", "cudnn", CUDNN)
    judge_ratio(files, out, "nccl", "nccl", NCCL)
    judge_pytorch(files, out)
    judge_s10(files, out)
    judge_exchange(files, out)
    judge_inference(files, out)
    judge_fused(files, out)
    judge_memory(files, out)
    judge_wrong(files, out)
    return out


def counts(out, target):
    v = out.v[target]
    return sum(x["met"] for x in v), len(v)


def report(out, rows=True):
    for target in TARGETS if rows else ():
        v = out.v[target]
        print(f"## {target}")
        for x in v:
            print("  %-4s %-34s %9.4g %-8s %s  [%s]" % ("ok" if x["met"] else "MISS", x["label"], x["q"],
                                                     x["rule"], x["text"], x["src"]))
        for n in out.notes[target]:
            print(f"  note: {n}")
    print("## summary")
    for target in TARGETS:
        met, n = counts(out, target)
        if not n:
            print(f"  {target:<10} no row to judge")
            continue
        if target == "wrong":
            print(f"  {target:<10} {met} file(s) with every row right; {n - met} row(s) wrong or failed")
            continue
        worst = max(out.v[target], key=lambda x: x["margin"])
        print(f"  {target:<10} met by {met} of {n}; worst {worst['label']}: {worst['q']:.4g} "
              f"({worst['rule']})")
    for note in out.notes["wrong"]:  # a file cut short: what it lacks is judged nowhere
        print(f"  note: {note}")


def main(argv):
    summary = bool(argv) and argv[0] == "--summary"
    argv = argv[1:] if summary else argv
    if not argv or argv[0].startswith("-"):
        print("usage: " + __doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    try:
        files = [load(p) for p in argv]
    except (OSError, ValueError) as e:
        print(f"targets: {e}", file=sys.stderr)
        return 2
    report(judge(files), rows=not summary)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
