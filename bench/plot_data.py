"""plot_data.py - plot.py's input: the JSON files of sbn-bench and torch_baseline.py read and
normalised into one table of rows (Data, load), the names and orders of paths, dtypes and
layouts, and the numbers the markdown and the charts take from the rows (times, ratios,
geometric means, their formats). No matplotlib."""

import json
import math
import re
import sys

PATH_ORDER = ["coop", "nccl", "cudnn", "torch_bn", "torch_bn_module", "torch_syncbn", "syncbn_torch", "syncbn_torch_op"]
PATH_ALIASES = {"nccl-path": "nccl", "nccl_path": "nccl", "cuDNN": "cudnn", "torch": "torch_bn"}
LABELS = {
    "coop": "coop (syncbn, one kernel)",
    "nccl": "nccl-path (syncbn host-driven)",
    "cudnn": "cuDNN (no sync)",
    "torch_bn": "PyTorch F.batch_norm (no sync)",
    "torch_bn_module": "PyTorch nn.BatchNorm2d (no sync)",
    "torch_syncbn": "PyTorch SyncBN ops (1-rank NCCL)",
    "syncbn_torch": "syncbn.torch.SyncBatchNorm (1-rank team)",
    "syncbn_torch_op": "syncbn.torch's operators, no autograd (1-rank team)",
}
SHORT = {"coop": "coop", "nccl": "nccl", "cudnn": "cuDNN", "torch_bn": "torch_bn", "torch_bn_module": "bn_module",
         "torch_syncbn": "torch_syncbn", "syncbn_torch": "syncbn_torch", "syncbn_torch_op": "sbn_torch_op"}
COLORS = {"coop": "#1f77b4", "nccl": "#ff7f0e", "cudnn": "#2ca02c", "torch_bn": "#9467bd", "torch_bn_module": "#e377c2",
          "torch_syncbn": "#d62728", "syncbn_torch": "#8c564b", "syncbn_torch_op": "#bcbd22"}
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
        self.inference = {}  # (path, shape, dtype, layout) -> row (sbn-bench's schema 4)
        self.inference_target = None
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


def norm_infer_row(r, top, src_idx):
    """An inference row (sbn-bench's schema 4): the call's times and ratios, its check."""
    if not isinstance(r, dict):
        return None
    row = {"path": norm_path(r.get("path"), top), "shape": str(r.get("shape", "?")),
           "dtype": str(r.get("dtype", "?")), "layout": str(r.get("layout", "?")), "ranks": 1,
           "error": r.get("error") or None, "note": r.get("note") or None,
           "wrong": r.get("wrong") or 0, "checked": r.get("checked") or 0, "src": src_idx}
    for k in ("us_median", "floor_us", "x_copy", "copy_us_median", "t_over_copy", "t_over_coop"):
        row[k] = None if row["error"] else fnum(r.get(k))
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
               "rows": 0, "checked": 0, "wrong": 0, "errors": 0,
               # a run cut short (sbn-bench writes complete: false until its last row) or
               # one that reported a failure (ok: false): said beside its rows
               "cut_short": top.get("complete") is False, "not_ok": top.get("ok") is False}
        if src["cut_short"]:
            warn(f"{path}: the run was cut short (complete: false): its rows are those it reached")
        data.sources.append(src)

        def take(dest, row, key, what=""):
            """Keeps row under key in dest (the later file's where two have it) and counts
            it and its checks in its source's totals."""
            if key in dest:
                warn(f"{path}: {what}{' '.join(map(str, key))} also in "
                     f"{data.sources[dest[key]['src']]['file']}: the later one is used")
            dest[key] = row
            src["rows"] += 1
            src["checked"] += int(row["checked"] or 0)
            src["wrong"] += int(row["wrong"] or 0)
            src["errors"] += row["error"] is not None

        for dest, items in ((data.rows, top["rows"]), (data.latency, latency_list(top))):
            for r in items:
                row = norm_row(r, top, idx)
                if row is not None:
                    take(dest, row, (row["path"], row["shape"], row["dtype"], row["layout"], row["ranks"]))
        # the inference table: its rows' checks count as the others' (a wrong value there
        # is a wrong value of the run)
        inf = top.get("inference")
        for r in inf if isinstance(inf, list) else []:
            row = norm_infer_row(r, top, idx)
            if row is not None:
                take(data.inference, row, (row["path"], row["shape"], row["dtype"], row["layout"]), "inference ")
        target = fnum(top.get("inference_target"))
        if target is not None:
            data.inference_target = target
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

