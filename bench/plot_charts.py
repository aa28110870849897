"""plot_charts.py - plot.py's PNG charts: per shape, against W, latency, summary. matplotlib
is passed in (plt) by plot.py's main, which imports it."""

import os
import re

from plot_data import (COLORS, DTYPE_ORDER, LABELS, LAYOUT_ORDER, OP_NAMES, OPS, REF, SHORT,
                       combos, floor_row, fmt_us, geomean, order_index, ratio, us_of)

# ---- charts ------------------------------------------------------------------------------------
def safe_name(s):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(s))


def finish_figure(plt, fig, data, handles, labels, ncol, name):
    """A legend centred under the axes and a device/B line under it, the axes laid out above
    them; then the figure is written to `name` (a PNG) and closed. Returns `name`."""
    bottom = legend_and_footer(fig, data, handles, labels, ncol)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(name, dpi=110)
    plt.close(fig)
    return name


def legend_and_footer(fig, data, handles, labels, ncol):
    """finish_figure's legend and footer; returns the fraction of the figure's height they
    take (the bottom of tight_layout's rect)."""
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
    return finish_figure(plt, fig, data, [handles[k] for k in order],
                         [LABELS.get(k, k) for k in order], 2 if len(lys) == 1 else 4,
                         os.path.join(out, f"shape_{safe_name(sid)}.png"))


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
        names.append(finish_figure(plt, fig, data, list(handles.values()), list(handles.keys()),
                                   max(2, int(fig.get_size_inches()[0] // 2.3)),
                                   os.path.join(out, f"scaling_{safe_name(d)}_{safe_name(l)}.png")))
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
    return finish_figure(plt, fig, data, list(handles.values()), list(handles.keys()), 4,
                         os.path.join(out, "latency.png"))


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
    return finish_figure(plt, fig, data, list(handles.values()), list(handles.keys()), 3,
                         os.path.join(out, "summary.png"))

