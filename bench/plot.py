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
                            latency, correctness

Ratios are t_path / t_coop on median times of the same shape, dtype, layout and W (> 1:
coop is faster), as sbn-bench prints them. The floors are read from each row (floor_a_us,
floor_b_us: sbn-bench defines them once, bench/floors.c, and torch_baseline.py takes them
from sbn-bench's JSON), never recomputed here; a row without them has none. % of floor =
floor / median time x 100 (pct_floor_a/b, or from the row's own floor and time).
Fields may be missing or null (a path that did not run, a failed row, an older file): such
cells say "-", and charts leave them out. Files whose mode is not "gpu" (sbn-bench's CPU
mode, torch_baseline's --device cpu dry run) are skipped unless --any-mode is given.

matplotlib is needed for the charts (pip install -r bench/requirements-plot.txt); without
it plot.py exits 77 and says so. --md-only writes results.md alone and needs no matplotlib.

Exit status: 0 written, 1 no usable rows or a file that cannot be read, 2 usage error,
77 matplotlib missing.
"""

import argparse
import json
import math
import os
import re
import sys

EXIT_SKIP = 77
PATH_ORDER = ["coop", "nccl", "cudnn", "torch_bn", "torch_syncbn"]
PATH_ALIASES = {"nccl-path": "nccl", "nccl_path": "nccl", "cuDNN": "cudnn", "torch": "torch_bn"}
LABELS = {
    "coop": "coop (syncbn, one kernel)",
    "nccl": "nccl-path (syncbn host-driven)",
    "cudnn": "cuDNN (no sync)",
    "torch_bn": "PyTorch F.batch_norm (no sync)",
    "torch_syncbn": "PyTorch SyncBN ops (1-rank NCCL)",
}
SHORT = {"coop": "coop", "nccl": "nccl", "cudnn": "cuDNN", "torch_bn": "torch_bn",
         "torch_syncbn": "torch_syncbn"}
COLORS = {"coop": "#1f77b4", "nccl": "#ff7f0e", "cudnn": "#2ca02c", "torch_bn": "#9467bd",
          "torch_syncbn": "#d62728"}
DTYPE_ORDER = ["fp32", "bf16", "fp16"]
LAYOUT_ORDER = ["NCHW", "NHWC"]
OPS = ("fwd", "bwd")
OP_NAMES = {"fwd": "forward", "bwd": "backward"}
REF = "coop"


def warn(msg):
    print(f"plot.py: {msg}", file=sys.stderr)


# ---- reading ---------------------------------------------------------------------------------
def fnum(v):
    """A finite float or None."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def natural_key(s):
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", str(s))]


def order_index(value, order):
    return (order.index(value), "") if value in order else (len(order), str(value))


class Data:
    def __init__(self):
        self.rows = {}      # (path, shape, dtype, layout, ranks) -> row
        self.latency = {}   # (path, shape, dtype, layout, ranks) -> row
        self.sources = []   # per file: summary dict

    def paths(self, rows=None):
        found = {r["path"] for r in (rows if rows is not None else self.rows.values())}
        return sorted(found, key=lambda p: order_index(p, PATH_ORDER))

    def shapes(self):
        seen = {}
        for r in self.rows.values():
            seen.setdefault(r["shape"], r)
        return sorted(seen, key=natural_key)

    def shape_info(self, sid):
        for r in self.rows.values():
            if r["shape"] == sid:
                return r
        return {}

    def get(self, path, shape, dtype, layout, ranks=1):
        return self.rows.get((path, shape, dtype, layout, ranks))


def norm_path(p, top):
    if not p:
        tp = top.get("path")
        p = tp if isinstance(tp, str) else REF
    return PATH_ALIASES.get(p, p)


def norm_op(o):
    """fwd/bwd object: every number a float or None (missing, null, not a number)."""
    o = o if isinstance(o, dict) else {}
    return {k: fnum(o.get(k)) for k in ("us_median", "us_min", "us_p90", "host_us_median",
                                        "gbps_rank", "gbps_total", "floor_a_us", "floor_b_us",
                                        "pct_floor_a", "pct_floor_b")}


def norm_row(r, top, src_idx):
    if not isinstance(r, dict):
        return None
    try:
        ranks = int(r.get("ranks", 1) if r.get("ranks") is not None else 1)
    except (TypeError, ValueError):
        ranks = 1
    row = {
        "path": norm_path(r.get("path"), top),
        "shape": str(r.get("shape", "?")),
        "where": r.get("where") or "",
        "n": r.get("n"), "c": r.get("c"), "h": r.get("h"), "w": r.get("w"),
        "spatial": r.get("spatial"),
        "dtype": str(r.get("dtype", "?")),
        "layout": str(r.get("layout", "?")),
        "ranks": ranks,
        "bytes_x_total": fnum(r.get("bytes_x_total")),
        "error": r.get("error") or None,
        "note": r.get("note") or None,
        "wrong": r.get("wrong") or 0,
        "checked": r.get("checked") or 0,
        "src": src_idx,
    }
    for op in OPS:
        o = norm_op(r.get(op))
        if row["error"]:
            for k in ("us_median", "us_min", "us_p90", "host_us_median", "gbps_rank",
                      "gbps_total", "pct_floor_a", "pct_floor_b"):
                o[k] = None
        us = o["us_median"]
        if us and o["pct_floor_a"] is None and o["floor_a_us"]:
            o["pct_floor_a"] = o["floor_a_us"] / us * 100.0
        if us and o["pct_floor_b"] is None and o["floor_b_us"]:
            o["pct_floor_b"] = o["floor_b_us"] / us * 100.0
        row[op] = o
    return row


def latency_list(top):
    lat = top.get("latency")
    if isinstance(lat, dict):  # tolerate {"rows": [...]} or {"W": ...} shapes of the section
        for k in ("rows", "entries", "latency"):
            if isinstance(lat.get(k), list):
                return lat[k]
        return []
    return lat if isinstance(lat, list) else []


def load(files, any_mode):
    data = Data()
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                top = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"plot.py: cannot read {path}: {e}")
        if not isinstance(top, dict) or not isinstance(top.get("rows"), list):
            raise SystemExit(f"plot.py: {path}: not a sbn-bench/torch_baseline JSON (no 'rows' list)")
        mode = top.get("mode")
        if mode != "gpu" and not any_mode:
            warn(f"{path}: mode {mode!r}, not 'gpu': skipped (--any-mode to plot it anyway)")
            continue
        dev = top.get("device")
        dev_name = dev.get("name") if isinstance(dev, dict) else (dev if isinstance(dev, str) else None)
        cb = top.get("copy_bandwidth")
        B = fnum(cb.get("gbps")) if isinstance(cb, dict) else None
        idx = len(data.sources)
        src = {"file": path, "tool": top.get("tool", "?"), "mode": mode, "device": dev_name,
               "date": top.get("date"), "commit": top.get("commit"), "B": B,
               "versions": {k: top.get(k) for k in ("library_version", "torch_version",
                                                    "cuda_version", "cudnn_version",
                                                    "nccl_version", "driver", "driver_version",
                                                    "runtime_version") if top.get(k) is not None},
               "floors": top.get("floors") if isinstance(top.get("floors"), str) else None,
               "rows": 0, "checked": 0, "wrong": 0, "errors": 0}
        data.sources.append(src)
        for dest, items in ((data.rows, top["rows"]), (data.latency, latency_list(top))):
            for r in items:
                row = norm_row(r, top, idx)
                if row is None:
                    continue
                key = (row["path"], row["shape"], row["dtype"], row["layout"], row["ranks"])
                if key in dest:
                    warn(f"{path}: {' '.join(map(str, key))} also in "
                         f"{data.sources[dest[key]['src']]['file']}: the later one is used")
                dest[key] = row
                src["rows"] += 1
                src["checked"] += int(row["checked"] or 0)
                src["wrong"] += int(row["wrong"] or 0)
                src["errors"] += row["error"] is not None
    devices = {s["device"] for s in data.sources if s["device"]}
    if len(devices) > 1:
        warn(f"the files come from different devices: {sorted(devices)}")
    return data


# ---- numbers -----------------------------------------------------------------------------------
def us_of(row, op):
    return None if row is None or row["error"] else row[op]["us_median"]


def ratio(t_path, t_ref):
    if t_path is None or t_ref is None or t_ref <= 0:
        return None
    return t_path / t_ref


def geomean(values):
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def fmt_us(v):
    if v is None:
        return "-"
    return f"{v:.1f}" if v >= 10 else (f"{v:.2f}" if v >= 1 else f"{v:.3f}")


def fmt_ratio(v):
    return "-" if v is None else f"{v:.2f}"


def fmt_pct(v):
    if v is None:
        return "-"
    return f"{v:.0f}%" if v >= 10 else (f"{v:.1f}%" if v >= 1 else f"{v:.2f}%")


def combos(data, shape, ranks=1):
    found = {(r["dtype"], r["layout"]) for r in data.rows.values()
             if r["shape"] == shape and r["ranks"] == ranks}
    return sorted(found, key=lambda dl: (order_index(dl[0], DTYPE_ORDER), order_index(dl[1], LAYOUT_ORDER)))


def floor_row(data, shape, dtype, layout, ranks=1):
    """The row whose floors are drawn: coop's, else the first path's that has them."""
    for p in [REF] + data.paths():
        r = data.get(p, shape, dtype, layout, ranks)
        if r and r["fwd"]["floor_a_us"] is not None:
            return r
    return None


# ---- markdown -----------------------------------------------------------------------------------
def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |")
    return out


def write_markdown(data, path):
    others = [p for p in data.paths() if p != REF]
    have_ref = any(r["path"] == REF for r in data.rows.values())
    L = ["# syncbn benchmark results", ""]
    L.append("Sources:")
    L.append("")
    for s in data.sources:
        b = f"{s['B']:.1f} GB/s" if s["B"] else "-"
        vers = ", ".join(f"{k} {v}" for k, v in s["versions"].items())
        L.append(f"- `{os.path.basename(s['file'])}`: {s['tool']}, device {s['device'] or '-'}, "
                 f"{s['date'] or '-'}, commit {s['commit'] or '-'}, copy bandwidth B = {b}"
                 + (f"; {vers}" if vers else ""))
    bs = [s["B"] for s in data.sources if s["B"]]
    if len(bs) > 1 and max(bs) > 1.05 * min(bs):
        L.append("")
        L.append(f"Note: the files measured different copy bandwidths ({', '.join(f'{b:.0f}' for b in bs)} "
                 "GB/s); each row's floors use its own file's B.")
    L.append("")
    L.append(f"Ratios are t_path / t_{REF} on median times at W = 1 (> 1: {REF} is faster). "
             "% of floor = floor / median time x 100 (100% = at the copy-bandwidth limit); the "
             "floors are each row's own, as its JSON gives them.")
    for text in sorted({s["floors"] for s in data.sources if s["floors"]}):
        files = ", ".join(f"`{os.path.basename(s['file'])}`" for s in data.sources
                          if s["floors"] == text)
        L.append("")
        L.append(f"Floors ({files}): {text}")
    L.append("")

    # headline per shape
    L.append("## Headline per shape (W = 1, geometric mean over dtype x layout)")
    L.append("")
    header = ["shape", "where"]
    for p in others:
        header += [f"{SHORT.get(p, p)}/{REF} fwd", f"{SHORT.get(p, p)}/{REF} bwd"]
    header += [f"{REF} %floor(a) fwd", f"{REF} %floor(a) bwd", f"{REF} %floor(b) fwd",
               f"{REF} %floor(b) bwd"]
    body = []
    for sid in data.shapes():
        info = data.shape_info(sid)
        cells = [sid, info.get("where", "")]
        cl = combos(data, sid)
        for p in others:
            for op in OPS:
                cells.append(fmt_ratio(geomean(
                    ratio(us_of(data.get(p, sid, d, l), op), us_of(data.get(REF, sid, d, l), op))
                    for d, l in cl)))
        for key in ("pct_floor_a", "pct_floor_b"):
            for op in OPS:
                vals = []
                for d, l in cl:
                    r = data.get(REF, sid, d, l)
                    if r and not r["error"]:
                        vals.append(r[op][key])
                cells.append(fmt_pct(geomean(vals)))
        body.append(cells)
    L += md_table(header, body)
    if not have_ref:
        L.append("")
        L.append(f"(no {REF} rows in these files: no ratios)")
    L.append("")

    # per op, per shape x dtype x layout
    for op in OPS:
        L.append(f"## {OP_NAMES[op].capitalize()}, W = 1 (median us)")
        L.append("")
        header = ["shape", "dtype", "layout"] + [f"{SHORT.get(p, p)} us" for p in data.paths()]
        header += ["floor (a) us", "floor (b) us"]
        header += [f"{SHORT.get(p, p)}/{REF}" for p in others]
        header += [f"{REF} %floor(a)", f"{REF} %floor(b)"]
        body = []
        for sid in data.shapes():
            for d, l in combos(data, sid):
                cells = [sid, d, l]
                for p in data.paths():
                    r = data.get(p, sid, d, l)
                    if r is None:
                        cells.append("-")
                    elif r["error"]:
                        cells.append("failed")
                    elif r[op]["us_median"] is None:
                        cells.append("n/a")  # did not run; its note says why
                    else:
                        cells.append(fmt_us(r[op]["us_median"]))
                fr = floor_row(data, sid, d, l)
                cells.append(fmt_us(fr[op]["floor_a_us"]) if fr else "-")
                cells.append(fmt_us(fr[op]["floor_b_us"]) if fr else "-")
                ref_us = us_of(data.get(REF, sid, d, l), op)
                for p in others:
                    cells.append(fmt_ratio(ratio(us_of(data.get(p, sid, d, l), op), ref_us)))
                rr = data.get(REF, sid, d, l)
                ok = rr is not None and not rr["error"]
                cells.append(fmt_pct(rr[op]["pct_floor_a"]) if ok else "-")
                cells.append(fmt_pct(rr[op]["pct_floor_b"]) if ok else "-")
                body.append(cells)
        L += md_table(header, body)
        L.append("")

    # coop vs nccl against W
    wlist = sorted({r["ranks"] for r in data.rows.values() if r["path"] in (REF, "nccl")})
    if len(wlist) > 1:
        L.append(f"## {REF} and nccl-path against W (median us, forward / backward; all W ranks on one GPU)")
        L.append("")
        header = ["shape", "dtype", "layout", "path"] + [f"W={w}" for w in wlist]
        body = []
        for sid in data.shapes():
            for d, l in combos(data, sid):
                for p in (REF, "nccl"):
                    if not any(data.get(p, sid, d, l, w) for w in wlist):
                        continue
                    cells = [sid, d, l, SHORT.get(p, p)]
                    for w in wlist:
                        r = data.get(p, sid, d, l, w)
                        cells.append(f"{fmt_us(us_of(r, 'fwd'))} / {fmt_us(us_of(r, 'bwd'))}")
                    body.append(cells)
                if any(data.get("nccl", sid, d, l, w) for w in wlist):
                    cells = [sid, d, l, f"nccl/{REF}"]
                    for w in wlist:
                        rn, rc = data.get("nccl", sid, d, l, w), data.get(REF, sid, d, l, w)
                        cells.append(f"{fmt_ratio(ratio(us_of(rn, 'fwd'), us_of(rc, 'fwd')))} / "
                                     f"{fmt_ratio(ratio(us_of(rn, 'bwd'), us_of(rc, 'bwd')))}")
                    body.append(cells)
        L += md_table(header, body)
        L.append("")

    # latency
    if data.latency:
        L.append("## Latency (median us; tiny = N=4, C=512, 1x1 fp32 NCHW; empty = n=0)")
        L.append("")
        lat_shapes = sorted({r["shape"] for r in data.latency.values()},
                            key=lambda s: order_index(s, ["tiny", "empty"]))
        header = ["path", "W"]
        for s in lat_shapes:
            header += [f"{s} fwd", f"{s} bwd"]
        body = []
        for p in data.paths(data.latency.values()):
            for w in sorted({r["ranks"] for r in data.latency.values() if r["path"] == p}):
                cells = [SHORT.get(p, p), str(w)]
                for s in lat_shapes:
                    r = next((x for x in data.latency.values()
                              if x["path"] == p and x["ranks"] == w and x["shape"] == s), None)
                    for op in OPS:
                        cells.append("n/a" if r is not None and r["error"] else fmt_us(us_of(r, op)))
                body.append(cells)
        L += md_table(header, body)
        L.append("")

    # correctness
    L.append("## Correctness")
    L.append("")
    for s in data.sources:
        L.append(f"- `{os.path.basename(s['file'])}`: {s['rows']} rows, {s['checked']} values "
                 f"checked, {s['wrong']} wrong, {s['errors']} rows with an error (latency rows included)")
    bad = [r for r in list(data.rows.values()) + list(data.latency.values())
           if r["error"] or (r["wrong"] or 0) > 0 or r["fwd"]["us_median"] is None]
    if bad:
        L.append("")
        L.append("Rows with a wrong value, an error, or no timing:")
        L.append("")
        L += md_table(["path", "shape", "dtype", "layout", "W", "wrong", "error / note"],
                      [[r["path"], r["shape"], r["dtype"], r["layout"], r["ranks"], r["wrong"],
                        ("error: " + r["error"] if r["error"] else "not run")
                        + (f" ({r['note']})" if r["note"] else "")] for r in bad])
    L.append("")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(L))


# ---- charts ------------------------------------------------------------------------------------
def safe_name(s):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(s))


def legend_and_footer(fig, data, handles, labels, ncol):
    """A legend centred under the axes and a device/B line under it; returns the fraction of
    the figure's height they take (the bottom of tight_layout's rect)."""
    h_in = fig.get_size_inches()[1]
    foot = 0.22 / h_in
    devs = sorted({s["device"] for s in data.sources if s["device"]})
    bs = sorted({round(s["B"]) for s in data.sources if s["B"]})
    txt = f"device: {', '.join(devs) or '-'}; copy bandwidth B = {', '.join(str(b) for b in bs) or '-'} GB/s"
    fig.text(0.01, 0.06 / h_in, txt, fontsize=7, color="#555555", ha="left", va="bottom")
    if not handles:
        return foot + 0.05 / h_in
    ncol = max(1, min(ncol, len(handles)))
    nrows = (len(handles) + ncol - 1) // ncol
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8,
               bbox_to_anchor=(0.5, foot), frameon=True)
    return foot + (0.1 + 0.2 * nrows) / h_in


def plot_shape(plt, data, sid, out):
    cl = combos(data, sid)
    if not cl:
        return None
    dts = [d for d in sorted({d for d, _ in cl}, key=lambda d: order_index(d, DTYPE_ORDER))]
    lys = [l for l in sorted({l for _, l in cl}, key=lambda l: order_index(l, LAYOUT_ORDER))]
    paths = data.paths([r for r in data.rows.values() if r["shape"] == sid and r["ranks"] == 1])
    fig, axes = plt.subplots(len(dts), len(lys), figsize=(4.6 * len(lys) + 1.0, 3.4 * len(dts) + 1.2),
                             squeeze=False)
    width = 0.8 / max(len(paths), 1)
    handles = {}
    for i, d in enumerate(dts):
        for j, l in enumerate(lys):
            ax = axes[i][j]
            ax.set_title(f"{d} {l}", fontsize=10)
            top = 0.0
            for g, op in enumerate(OPS):
                for k, p in enumerate(paths):
                    x = g - 0.4 + width * (k + 0.5)
                    r = data.get(p, sid, d, l)
                    v = us_of(r, op)
                    if v is None:
                        if r is not None:
                            ax.text(x, 0, "failed" if r["error"] else "n/a", rotation=90, fontsize=6,
                                    ha="center", va="bottom", color=COLORS.get(p, "gray"))
                        continue
                    h = ax.bar(x, v, width * 0.92, color=COLORS.get(p, None), label=LABELS.get(p, p))
                    handles.setdefault(p, h)
                    ax.text(x, v, fmt_us(v), fontsize=6, ha="center", va="bottom", rotation=90)
                    top = max(top, v)
                fr = floor_row(data, sid, d, l)
                if fr:
                    for key, style, name in (("floor_a_us", "--", "floor (a)"), ("floor_b_us", ":", "floor (b)")):
                        fv = fr[op][key]
                        if fv is not None:
                            hl = ax.hlines(fv, g - 0.45, g + 0.45, colors="black", linestyles=style,
                                           linewidth=1.2, label=name)
                            handles.setdefault(name, hl)
                            top = max(top, fv)
            ax.set_xticks(range(len(OPS)))
            ax.set_xticklabels([OP_NAMES[o] for o in OPS])
            ax.set_ylim(0, top * 1.25 if top > 0 else 1)
            ax.set_ylabel("median us (lower is better)", fontsize=8)
            ax.grid(axis="y", alpha=0.3)
    info = data.shape_info(sid)
    dims = f"N={info.get('n')} C={info.get('c')} H x W={info.get('h')}x{info.get('w')}"
    if info.get("spatial") and info.get("h") and info.get("w") and info["spatial"] != info["h"] * info["w"]:
        dims += f" (scaled: spatial {info['spatial']})"
    fig.suptitle(f"{sid}: {dims}, W = 1\n{info.get('where', '')}", fontsize=11)
    order = [p for p in paths if p in handles] + [n for n in ("floor (a)", "floor (b)") if n in handles]
    bottom = legend_and_footer(fig, data, [handles[k] for k in order],
                               [LABELS.get(k, k) for k in order], 2 if len(lys) == 1 else 4)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    name = os.path.join(out, f"shape_{safe_name(sid)}.png")
    fig.savefig(name, dpi=110)
    plt.close(fig)
    return name


def plot_scaling(plt, data, out):
    names = []
    rows = [r for r in data.rows.values() if r["path"] in (REF, "nccl")]
    if not any(r["ranks"] > 1 for r in rows):
        return names
    dls = sorted({(r["dtype"], r["layout"]) for r in rows},
                 key=lambda dl: (order_index(dl[0], DTYPE_ORDER), order_index(dl[1], LAYOUT_ORDER)))
    for d, l in dls:
        shapes = [s for s in data.shapes()
                  if any(r["shape"] == s and r["dtype"] == d and r["layout"] == l for r in rows)]
        if not shapes:
            continue
        ncols = min(5, len(shapes))
        nrows = (len(shapes) + ncols - 1) // ncols
        fig, axes = plt.subplots(nrows, ncols, figsize=(max(3.4 * ncols, 7.0), 2.9 * nrows + 1.6),
                                 squeeze=False)
        handles = {}
        for idx, sid in enumerate(shapes):
            ax = axes[idx // ncols][idx % ncols]
            ax.set_title(sid, fontsize=10)
            ws_all = sorted({r["ranks"] for r in rows if r["shape"] == sid and r["dtype"] == d and r["layout"] == l})
            for p, pstyle in ((REF, "-"), ("nccl", "--")):
                for op, marker in (("fwd", "o"), ("bwd", "s")):
                    pts = [(w, us_of(data.get(p, sid, d, l, w), op)) for w in ws_all]
                    pts = [(w, v) for w, v in pts if v is not None]
                    if not pts:
                        continue
                    lab = f"{SHORT.get(p, p)} {OP_NAMES[op]}"
                    (h,) = ax.plot([w for w, _ in pts], [v for _, v in pts], pstyle, marker=marker,
                                   color=COLORS[p], alpha=1.0 if op == "fwd" else 0.6, label=lab,
                                   markersize=4)
                    handles.setdefault(lab, h)
            for op, style in (("fwd", (0, (4, 2))), ("bwd", (0, (1, 2)))):
                pts = []
                for w in ws_all:
                    r = data.get(REF, sid, d, l, w) or data.get("nccl", sid, d, l, w)
                    if r and r[op]["floor_a_us"] is not None:
                        pts.append((w, r[op]["floor_a_us"]))
                if pts:
                    lab = f"floor (a) {OP_NAMES[op]}"
                    (h,) = ax.plot([w for w, _ in pts], [v for _, v in pts], color="gray",
                                   linestyle=style, linewidth=1, label=lab)
                    handles.setdefault(lab, h)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ws_all)
            ax.set_xticklabels([str(w) for w in ws_all])
            ax.set_xlabel("W (ranks on one GPU)", fontsize=8)
            ax.set_ylabel("median us", fontsize=8)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        for idx in range(len(shapes), nrows * ncols):
            axes[idx // ncols][idx % ncols].axis("off")
        fig.suptitle(f"{REF} vs nccl-path against W: {d} {l} (every rank holds the full shape)", fontsize=11)
        bottom = legend_and_footer(fig, data, list(handles.values()), list(handles.keys()),
                                   max(2, int(fig.get_size_inches()[0] // 2.3)))
        fig.tight_layout(rect=(0, bottom, 1, 1))
        name = os.path.join(out, f"scaling_{safe_name(d)}_{safe_name(l)}.png")
        fig.savefig(name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names


def plot_latency(plt, data, out):
    if not data.latency:
        return None
    lat = list(data.latency.values())
    shapes = sorted({r["shape"] for r in lat}, key=lambda s: order_index(s, ["tiny", "empty"]))
    fig, axes = plt.subplots(1, len(shapes), figsize=(max(5.2 * len(shapes), 7.0), 5.0), squeeze=False)
    handles = {}
    vals = [v for r in lat for v in (us_of(r, "fwd"), us_of(r, "bwd")) if v is not None and v > 0]
    log_y = bool(vals) and max(vals) > 20 * min(vals)
    for i, s in enumerate(shapes):
        ax = axes[0][i]
        ws_all = sorted({r["ranks"] for r in lat if r["shape"] == s})
        for p in data.paths(lat):
            for op, style, marker in (("fwd", "-", "o"), ("bwd", "--", "s")):
                pts = sorted((r["ranks"], us_of(r, op)) for r in lat
                             if r["path"] == p and r["shape"] == s and us_of(r, op) is not None)
                if not pts:
                    continue
                lab = f"{SHORT.get(p, p)} {OP_NAMES[op]}"
                (h,) = ax.plot([w for w, _ in pts], [v for _, v in pts], linestyle=style if len(pts) > 1 else "none",
                               marker=marker, color=COLORS.get(p, None), label=lab, markersize=5)
                handles.setdefault(lab, h)
        desc = {"tiny": "tiny op: N=4, C=512, 1x1 per rank", "empty": "empty op: n=0 on every rank"}.get(s, s)
        ax.set_title(desc, fontsize=10)
        if ws_all:
            if max(ws_all) > 1:
                ax.set_xscale("log", base=2)
            ax.set_xticks(ws_all)
            ax.set_xticklabels([str(w) for w in ws_all])
        ax.set_xlabel("W (ranks on one GPU)", fontsize=8)
        ax.set_ylabel("median us per op" + (" (log scale)" if log_y else ""), fontsize=8)
        if log_y:
            ax.set_yscale("log")
        else:
            ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle("Latency: fp32 NCHW, C=512 (launches and the exchange)", fontsize=11)
    bottom = legend_and_footer(fig, data, list(handles.values()), list(handles.keys()), 4)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    name = os.path.join(out, "latency.png")
    fig.savefig(name, dpi=110)
    plt.close(fig)
    return name


def plot_summary(plt, data, out):
    others = [p for p in data.paths() if p != REF]
    shapes = [s for s in data.shapes() if any(data.get(REF, s, d, l) for d, l in combos(data, s))]
    if not shapes:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(max(9.0, 1.1 * len(shapes) + 4), 8.5), squeeze=False)
    xs = list(range(len(shapes)))
    handles = {}
    for j, op in enumerate(OPS):
        ax = axes[0][j]
        width = 0.8 / max(len(others), 1)
        series = {p: [geomean(ratio(us_of(data.get(p, s, d, l), op), us_of(data.get(REF, s, d, l), op))
                              for d, l in combos(data, s)) for s in shapes] for p in others}
        allv = [v for vals in series.values() for v in vals if v is not None]
        # a latency-bound shape can be 50x apart: log scale, bars from 1 (up: coop faster)
        log = bool(allv) and (max(allv) > 8 or min(allv) < 0.125)
        for k, p in enumerate(others):
            pos = [x - 0.4 + width * (k + 0.5) for x in xs]
            pv = [(x, v) for x, v in zip(pos, series[p]) if v is not None]
            h = ax.bar([x for x, _ in pv], [v - 1.0 if log else v for _, v in pv], width * 0.92,
                       bottom=1.0 if log else 0.0, color=COLORS.get(p), label=LABELS.get(p, p))
            handles.setdefault(LABELS.get(p, p), h)
        ax.axhline(1.0, color="black", linewidth=1)
        if log:
            ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels(shapes)
        ax.set_title(f"{OP_NAMES[op]}: t_path / t_{REF} (> 1: {REF} faster)"
                     + (", log scale" if log else ""), fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax2 = axes[1][j]
        for k, (key, name, col) in enumerate((("pct_floor_a", "floor (a)", "#1f77b4"),
                                              ("pct_floor_b", "floor (b)", "#aec7e8"))):
            vals = []
            for s in shapes:
                vs = [data.get(REF, s, d, l) for d, l in combos(data, s)]
                vals.append(geomean(r[op][key] for r in vs if r and not r["error"]))
            pos = [x - 0.2 + 0.4 * k for x in xs]
            h = ax2.bar([x for x, v in zip(pos, vals) if v is not None], [v for v in vals if v is not None],
                        0.38, color=col, label=f"{REF} % of {name}")
            handles.setdefault(f"{REF} % of {name}", h)
        ax2.axhline(100.0, color="black", linewidth=1)
        ax2.set_xticks(xs)
        ax2.set_xticklabels(shapes)
        ax2.set_title(f"{OP_NAMES[op]}: {REF} % of floor (100% = copy bandwidth)", fontsize=10)
        ax2.grid(axis="y", alpha=0.3)
    fig.suptitle("Per shape, W = 1, geometric mean over dtype x layout", fontsize=11)
    bottom = legend_and_footer(fig, data, list(handles.values()), list(handles.keys()), 3)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    name = os.path.join(out, "summary.png")
    fig.savefig(name, dpi=110)
    plt.close(fig)
    return name


def main(argv=None):
    ap = argparse.ArgumentParser(description="Charts (PNG) and results.md from sbn-bench / "
                                             "torch_baseline GPU JSON files.")
    ap.add_argument("json", nargs="+", help="JSON files (sbn-bench --json, torch_baseline.py --json)")
    ap.add_argument("--out", required=True, help="output directory (created if missing)")
    ap.add_argument("--md-only", action="store_true", help="write results.md alone (no matplotlib)")
    ap.add_argument("--any-mode", action="store_true",
                    help="also use files whose mode is not 'gpu' (dry runs; for testing)")
    args = ap.parse_args(argv)
    plt = None
    if not args.md_only:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt  # noqa: F811
        except ImportError as e:
            print(f"plot.py: SKIP: matplotlib is not installed ({e}); install it with "
                  "'python3 -m pip install -r bench/requirements-plot.txt', or pass --md-only "
                  "for results.md alone", file=sys.stderr)
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
