"""plot_history.py - plot.py --history: the index of the GPU runs kept under bench/results.

A run is a folder <date>-<device>-<commit>/ of the results directory; the directory's runs.tsv
names, per folder, its main sbn-bench JSON (the suite's `sbn-bench --gpu on --quick`), its
torch_baseline JSON (or -) and what ran, in words. Every number of the index is read from
those JSON files with plot_data.load (the reader of plot.py's other outputs), never typed:

  S5 fp32 NCHW W = 1, coop          forward / backward median us
  S10 fp32 NCHW W = 1, coop         forward + backward median us (and their sum)
  the empty op (latency rows), coop forward / backward median us at W = 1 and at the
                                    largest W of the file's latency rows
  coop >= cuDNN                     how many W = 1 cells (shape x dtype x layout x op with a coop
                                    and a cuDNN time) have t_cudnn >= t_coop, of how many
  S10 in PyTorch (torch JSON)       torch_bn and syncbn_torch S10 fp32 NCHW forward + backward

Runs are ordered by their bench JSON's date, then commit. The table is written between the
markers MARK_BEGIN and MARK_END of <out>/README.md (the rest of the file is left as it is;
a missing file or block is added), and history.png draws the same numbers against the runs
(matplotlib; plot.py passes it in). No matplotlib is imported here."""

import os
import re

from plot_data import fmt_us, load

MARK_BEGIN = "<!-- history:begin -->"
MARK_END = "<!-- history:end -->"
RUNS_FILE = "runs.tsv"
RUN_DIR_RE = re.compile(r"^(\d{4}-\d{2}-\d{2})-([a-z0-9]+)-([0-9a-f]{7,40})$")
LAT_SHAPE = "empty"
CHART = "history.png"


class HistoryError(Exception):
    """A results directory that cannot be indexed (plot.py: exit 1)."""


# ---- the runs ------------------------------------------------------------------------------------
def read_runs(root):
    """runs.tsv of `root` checked against the run folders there: a list of
    {folder, bench, torch, ran} (bench and torch: paths relative to the folder; torch None)."""
    path = os.path.join(root, RUNS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise HistoryError(f"cannot read {path}: {e}")
    runs, seen = [], set()
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 4 or not all(c.strip() for c in cols):
            raise HistoryError(f"{path}:{n}: want 4 tab-separated fields (folder, bench JSON, "
                               f"torch JSON or -, what ran), got {len(cols)}")
        folder, bench, torch, ran = (c.strip() for c in cols)
        if not RUN_DIR_RE.match(folder):
            raise HistoryError(f"{path}:{n}: {folder!r} is not a <date>-<device>-<commit> folder name")
        if folder in seen:
            raise HistoryError(f"{path}:{n}: {folder} named twice")
        seen.add(folder)
        for rel in (bench, torch):
            if rel != "-" and not os.path.isfile(os.path.join(root, folder, rel)):
                raise HistoryError(f"{path}:{n}: {folder}/{rel}: no such file")
        runs.append({"folder": folder, "bench": bench, "torch": None if torch == "-" else torch,
                     "ran": ran})
    folders = sorted(d for d in os.listdir(root)
                     if RUN_DIR_RE.match(d) and os.path.isdir(os.path.join(root, d)))
    missing = [d for d in folders if d not in seen]
    if missing:
        raise HistoryError(f"{path}: no line for the run folder(s) {', '.join(missing)}")
    if not runs:
        raise HistoryError(f"{path}: no runs")
    return runs


def us(row, op):
    return None if row is None or row["error"] else row[op]["us_median"]


def headline(root, run):
    """The headline numbers of one run, read from its JSON files."""
    folder = os.path.join(root, run["folder"])
    bench_file = os.path.join(folder, run["bench"])
    files = [bench_file] + ([os.path.join(folder, run["torch"])] if run["torch"] else [])
    data = load(files, False)
    src = data.sources[0] if data.sources and data.sources[0]["file"] == bench_file else None
    if src is None or src["tool"] != "sbn-bench":
        raise HistoryError(f"{bench_file}: not a GPU-mode sbn-bench JSON")
    tsrc = None
    if run["torch"]:
        tsrc = data.sources[-1] if len(data.sources) == 2 else None
        if tsrc is None or tsrc["tool"] != "torch_baseline":
            raise HistoryError(f"{files[1]}: not a GPU-mode torch_baseline JSON")
    m = RUN_DIR_RE.match(run["folder"])
    h = dict(run)
    h["date"] = src["date"] or m.group(1)
    h["device"] = src["device"] or m.group(2)
    h["commit"] = m.group(3)
    h["bench_commit"] = src["commit"]
    s5 = data.get("coop", "S5", "fp32", "NCHW")
    s10 = data.get("coop", "S10", "fp32", "NCHW")
    h["s5_fwd"], h["s5_bwd"] = us(s5, "fwd"), us(s5, "bwd")
    h["s10_fwd"], h["s10_bwd"] = us(s10, "fwd"), us(s10, "bwd")
    lat = {r["ranks"]: r for r in data.latency.values()
           if r["path"] == "coop" and r["shape"] == LAT_SHAPE}
    wmax = max(lat) if lat else None
    h["empty_w"] = wmax
    for w, key in ((1, "empty1"), (wmax, "emptyw")):
        r = lat.get(w)
        h[key + "_fwd"], h[key + "_bwd"] = us(r, "fwd"), us(r, "bwd")
    ge, cells = 0, 0
    for r in data.rows.values():
        if r["path"] != "coop" or r["ranks"] != 1:
            continue
        cu = data.get("cudnn", r["shape"], r["dtype"], r["layout"], 1)
        for op in ("fwd", "bwd"):
            tc, tn = us(r, op), us(cu, op)
            if tc is None or tn is None:
                continue
            cells += 1
            ge += tn >= tc
    h["ge_cudnn"], h["cells"] = ge, cells
    for p in ("torch_bn", "syncbn_torch"):
        r = data.get(p, "S10", "fp32", "NCHW") if tsrc else None
        h[p + "_fwd"], h[p + "_bwd"] = us(r, "fwd"), us(r, "bwd")
    return h


def history(root):
    """Every run's headline, in date/commit order."""
    hs = [headline(root, r) for r in read_runs(root)]
    hs.sort(key=lambda h: (h["date"], h["commit"]))
    return hs


# ---- the table -----------------------------------------------------------------------------------
def pair(a, b, sep=" / "):
    return "-" if a is None and b is None else f"{fmt_us(a)}{sep}{fmt_us(b)}"


def fwd_plus_bwd(a, b):
    if a is None or b is None:
        return pair(a, b, " + ")
    return f"{fmt_us(a)} + {fmt_us(b)} = {fmt_us(a + b)}"


def table_rows(hs):
    wmaxes = sorted({h["empty_w"] for h in hs if h["empty_w"]})
    wlabel = empty_w_label(hs)
    header = ["date (bench JSON)", "device", "commit", "what ran", "bench JSON; torch JSON",
              "S5 fwd / bwd", "S10 fwd + bwd", "empty op W = 1 fwd / bwd",
              f"empty op {wlabel} fwd / bwd", "coop >= cuDNN (W = 1 cells)",
              "torch_bn S10 fwd + bwd", "syncbn_torch S10 fwd + bwd"]
    body = []
    for h in hs:
        commit = h["commit"]
        if h["bench_commit"] and h["bench_commit"] != h["commit"]:
            commit += f" (bench: {h['bench_commit']})"
        files = f"[`{h['bench']}`]({h['folder']}/{h['bench']})"
        files += f"; [`{h['torch']}`]({h['folder']}/{h['torch']})" if h["torch"] else "; -"
        date = h["date"].replace("T", " ")
        date = re.sub(r":\d\dZ$", "Z", date)  # minutes are enough to order the runs
        wcell = pair(h["emptyw_fwd"], h["emptyw_bwd"])
        if h["empty_w"] and len(wmaxes) > 1:
            wcell += f" (W = {h['empty_w']})"
        body.append([f"[{date}]({h['folder']}/)", h["device"], commit, h["ran"], files,
                     pair(h["s5_fwd"], h["s5_bwd"]), fwd_plus_bwd(h["s10_fwd"], h["s10_bwd"]),
                     pair(h["empty1_fwd"], h["empty1_bwd"]), wcell,
                     f"{h['ge_cudnn']} of {h['cells']}" if h["cells"] else "-",
                     fwd_plus_bwd(h["torch_bn_fwd"], h["torch_bn_bwd"]),
                     fwd_plus_bwd(h["syncbn_torch_fwd"], h["syncbn_torch_bwd"])])
    return header, body


def table_markdown(hs):
    header, body = table_rows(hs)
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in body:
        out.append("| " + " | ".join(str(c).replace("|", "/") for c in r) + " |")
    return out


def block(hs):
    """The generated block, markers included."""
    lines = [MARK_BEGIN,
             "<!-- generated by `python3 bench/plot.py --history bench/results --out bench/results` "
             "from the JSON files named in each row; do not edit by hand -->", ""]
    lines += table_markdown(hs)
    lines += ["", MARK_END]
    return "\n".join(lines)


def readme_with_block(text, blk):
    """`text` (a README's contents, or None) with its history block replaced by `blk`."""
    if text is None:
        return "# GPU runs\n\n" + blk + "\n"
    b, e = text.find(MARK_BEGIN), text.find(MARK_END)
    if b < 0 and e < 0:
        return text.rstrip("\n") + "\n\n" + blk + "\n"
    if b < 0 or e < b:
        raise HistoryError(f"the README's markers are out of order or one is missing "
                           f"({MARK_BEGIN} ... {MARK_END})")
    return text[:b] + blk + text[e + len(MARK_END):]


def committed_block(text):
    """The block between (and including) the markers of `text`, or None."""
    if text is None:
        return None
    b, e = text.find(MARK_BEGIN), text.find(MARK_END)
    return text[b:e + len(MARK_END)] if 0 <= b < e else None


def read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def write_readme(hs, out):
    path = os.path.join(out, "README.md")
    new = readme_with_block(read_text(path), block(hs))
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
    return path


def check_readme(hs, out):
    """'' when <out>/README.md's block is what the files give, else a message."""
    path = os.path.join(out, "README.md")
    have = committed_block(read_text(path))
    want = block(hs)
    if have == want:
        return ""
    if have is None:
        return f"{path}: no {MARK_BEGIN} ... {MARK_END} block"
    import difflib
    diff = difflib.unified_diff(have.splitlines(), want.splitlines(), "README.md (committed)",
                                "generated from the JSON files", lineterm="", n=0)
    return f"{path}: the table differs from what the JSON files give:\n" + "\n".join(diff)


# ---- the chart -----------------------------------------------------------------------------------
def empty_w_label(hs):
    """'W = 8' when every run's latency rows end at W = 8 (else the W's, or 'W = max')."""
    ws = sorted({h["empty_w"] for h in hs if h["empty_w"]})
    return "W = " + "/".join(str(w) for w in ws) if ws else "W = max"


def series(hs):
    """What history.png draws: x labels, and per panel a list of (label, values), values in
    run order (None: not in the run's files)."""
    labels = [f"{h['date'][:10]}\n{short_device(h['device'])}\n{h['commit']}" for h in hs]

    def col(key):
        return [h[key] for h in hs]
    s10_sum = [a + b if a is not None and b is not None else None
               for a, b in zip(col("s10_fwd"), col("s10_bwd"))]
    wl = empty_w_label(hs)
    return {
        "labels": labels,
        "devices": [h["device"] for h in hs],
        "S5 fp32 NCHW, W = 1, coop (us)": [("forward", col("s5_fwd")), ("backward", col("s5_bwd"))],
        "S10 fp32 NCHW, W = 1, coop (us)": [
            ("forward + backward", s10_sum), ("forward", col("s10_fwd")),
            ("backward", col("s10_bwd"))],
        "the empty op (latency rows), coop (us)": [
            ("W = 1 forward", col("empty1_fwd")), ("W = 1 backward", col("empty1_bwd")),
            (f"{wl} forward", col("emptyw_fwd")), (f"{wl} backward", col("emptyw_bwd"))],
        "W = 1 cells where coop >= cuDNN": [("coop >= cuDNN", col("ge_cudnn")),
                                            ("cells", col("cells"))],
    }


def short_device(name):
    m = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]*)\b", name or "")
    return m.group(1) if m else (name or "-")


def device_segments(devices):
    """The runs' indexes split where the device changes: [[0], [1, 2, 3], [4]]."""
    segs = []
    for i, d in enumerate(devices):
        if segs and devices[segs[-1][-1]] == d:
            segs[-1].append(i)
        else:
            segs.append([i])
    return segs


SHADES = ["#ffffff", "#e8eefa", "#faf0e0", "#eaf6ea", "#f6e8f4"]


def plot_history(plt, hs, out):
    s = series(hs)
    labels = s["labels"]
    xs = list(range(len(labels)))
    panels = [k for k in s if k not in ("labels", "devices")]
    devices = list(dict.fromkeys(s["devices"]))  # in order of first appearance
    shade = {d: SHADES[i % len(SHADES)] for i, d in enumerate(devices)}
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8.0, 1.45 * len(xs) + 3.5), 13.0),
                             sharex=True, squeeze=False)
    styles = ["-o", "--s", ":^", "-.D"]
    for ax, name in zip((a[0] for a in axes), panels):
        for x, d in zip(xs, s["devices"]):
            if shade[d] != "#ffffff":
                ax.axvspan(x - 0.5, x + 0.5, color=shade[d], zorder=0, linewidth=0)
        if name.startswith("W = 1 cells"):
            ge, cells = s[name][0][1], s[name][1][1]
            pts = [(x, g, c) for x, g, c in zip(xs, ge, cells) if c]
            ax.bar([x for x, _, _ in pts], [c for _, _, c in pts], 0.6, color="#cccccc",
                   label="W = 1 cells with both times", zorder=2)
            ax.bar([x for x, _, _ in pts], [g for _, g, _ in pts], 0.6, color="#2ca02c",
                   label="coop >= cuDNN", zorder=3)
            for x, g, c in pts:
                ax.text(x, g, f"{g} of {c}", ha="center", va="bottom", fontsize=8, zorder=4)
            ax.set_ylabel("cells", fontsize=8)
        else:
            for k, ((lab, vals), st) in enumerate(zip(s[name], styles)):
                color = f"C{k}"
                # a line joins consecutive runs of one device only: no line across devices
                for seg in device_segments(s["devices"]):
                    pts = [(x, vals[x]) for x in seg if vals[x] is not None]
                    if pts:
                        ax.plot([x for x, _ in pts], [v for _, v in pts], st, color=color,
                                label=lab, markersize=4, zorder=3)
                        lab = None
            ax.set_ylabel("median us (lower is better)", fontsize=8)
            ax.set_ylim(bottom=0)
        ax.set_xlim(-0.5, len(xs) - 0.5)
        ax.set_title(name, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    last = axes[-1][0]
    last.set_xticks(xs)
    last.set_xticklabels(labels, fontsize=7)
    note = "; ".join(f"{d}: {'no shade' if shade[d] == '#ffffff' else 'shaded'}"
                     if len(devices) == 2 else f"{d}: {shade[d]}" for d in devices)
    fig.suptitle("syncbn GPU runs: the headline numbers of each run's main bench JSON "
                 "(bench/results/runs.tsv), in date order", fontsize=11)
    fig.text(0.01, 0.005, f"devices ({note}); times of different devices are not comparable",
             fontsize=7, color="#555555", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.015, 1, 1))
    name = os.path.join(out, CHART)
    fig.savefig(name, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return name
