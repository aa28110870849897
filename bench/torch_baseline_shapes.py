"""torch_baseline_shapes.py - torch_baseline.py's shape list: bench/shapes.tsv (sbn-bench's
--shapes format) read as sbn-bench reads it, and its --scale arithmetic. No torch."""

# ---- shapes (no torch needed) -------------------------------------------------------------
class ShapeError(ValueError):
    pass


def parse_shapes(text, source="shapes"):
    """Parses a shape table as sbn-bench's parse_shapes does: one 'id N C H W [where...]'
    per line, fields separated by blanks, '#' (after leading blanks) starts a comment line,
    N, C, H, W integers >= 1, 'where' = the rest of the line without trailing blanks."""
    shapes = []
    for lineno, line in enumerate(text.split("\n"), 1):
        s = line.lstrip(" \t\r")
        if not s or s.startswith("#"):
            continue
        parts = s.split(None, 5)
        try:
            if len(parts) < 5:
                raise ValueError
            sid = parts[0][:31]
            n, c, h, w = (int(v) for v in parts[1:5])
            if min(n, c, h, w) < 1:
                raise ValueError
        except ValueError:
            raise ShapeError(f"{source}:{lineno}: expected 'id N C H W [where]' with N, C, H, W >= 1")
        where = parts[5].rstrip("\r ") if len(parts) > 5 else ""
        shapes.append({"id": sid, "n": n, "c": c, "h": h, "w": w, "where": where})
    return shapes


def scaled_spatial(h, w, scale):
    """sbn-bench: spatial = H*W / scale (C integer division), kept >= 1."""
    return max(1, (h * w) // scale)


def load_shapes(path, scale, only=None):
    """The shapes of `path` (sbn-bench's --shapes format) with 'spatial' after --scale,
    filtered by the comma list `only` (exact ids, case-insensitive) when given."""
    with open(path, encoding="utf-8") as f:
        shapes = parse_shapes(f.read(), path)
    if only is not None:
        tokens = [t.strip() for t in only.split(",") if t.strip()]
        wanted = {t.lower() for t in tokens}
        known = {s["id"].lower() for s in shapes}
        unknown = [t for t in tokens if t.lower() not in known]
        ids = ", ".join(s["id"] for s in shapes)
        if not wanted:  # sbn-bench's rule: empty items skipped, an empty list refused
            raise ShapeError(f"--only '{only}' names no shape (its shapes: {ids})")
        if unknown:  # a typo must not drop rows unseen
            raise ShapeError(f"--only '{only}': {', '.join(unknown)} is no shape of {path} (its shapes: {ids})")
        shapes = [s for s in shapes if s["id"].lower() in wanted]
    for s in shapes:
        s["spatial"] = scaled_spatial(s["h"], s["w"], scale)
    return shapes
