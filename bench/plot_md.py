"""plot_md.py - plot.py's results.md: the tables of the numbers in the rows (headline ratios,
forward and backward per shape x dtype x layout, coop vs nccl-path per W, latency,
inference, correctness over every table's rows). No matplotlib."""

import os

from plot_data import (DTYPE_ORDER, LAYOUT_ORDER, OP_NAMES, OPS, PATH_ORDER, REF, SHORT, combos,
                       floor_row, fmt_pct, fmt_ratio, fmt_us, geomean, natural_key, order_index,
                       ratio, us_of)

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

    # inference (sbn-bench's inference table)
    if data.inference:
        target = f"; the target: <= {data.inference_target:g}" if data.inference_target else ""
        L.append("## Inference (W = 1; x copy = median / (2|x| / B); t/copy = median / a copy of x "
                 f"timed in the same row; cuDNN/coop = median / the coop row's{target})")
        L.append("")
        rows = sorted(data.inference.values(),
                      key=lambda r: (natural_key(r["shape"]), order_index(r["dtype"], DTYPE_ORDER),
                                     order_index(r["layout"], LAYOUT_ORDER),
                                     order_index(r["path"], PATH_ORDER)))
        L += md_table(["path", "shape", "dtype", "layout", "us", "x copy", "t/copy", "cuDNN/coop"],
                      [[SHORT.get(r["path"], r["path"]), r["shape"], r["dtype"], r["layout"],
                        "failed" if r["error"] else fmt_us(r["us_median"]), fmt_ratio(r["x_copy"]),
                        fmt_ratio(r["t_over_copy"]), fmt_ratio(r["t_over_coop"])] for r in rows])
        L.append("")

    # correctness
    L.append("## Correctness")
    L.append("")
    for s in data.sources:
        L.append(f"- `{os.path.basename(s['file'])}`: {s['rows']} rows, {s['checked']} values "
                 f"checked, {s['wrong']} wrong, {s['errors']} rows with an error (latency and inference rows included)"
                 + ("; **the run was cut short** (complete: false): only the rows it reached"
                    if s.get("cut_short") else "")
                 + ("; **the run reported a failure** (ok: false)" if s.get("not_ok") else ""))
    bad = [r for r in list(data.rows.values()) + list(data.latency.values())
           if r["error"] or (r["wrong"] or 0) > 0 or r["fwd"]["us_median"] is None]
    bad += [dict(r, path=r["path"] + " (inference)") for r in data.inference.values()
            if r["error"] or (r["wrong"] or 0) > 0 or r["us_median"] is None]
    if bad:
        L.append("")
        L.append("Rows with a wrong value, an error, or no timing:")
        L.append("")
        L += md_table(["path", "shape", "dtype", "layout", "W", "wrong", "error / note"],
                      [[r["path"], r["shape"], r["dtype"], r["layout"], r["ranks"], r["wrong"],
                        ("error: " + r["error"] if r["error"]
                         else f"{r['wrong']} wrong" if (r["wrong"] or 0) > 0 else "not run")
                        + (f" ({r['note']})" if r["note"] else "")] for r in bad])
    L.append("")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(L))

