"""torch_baseline_floors.py - the bytes and floors of torch_baseline.py's rows, read from an
sbn-bench --json file (sbn-bench defines them: bench/floors.c), never computed here. No torch."""

import json

# ---- bytes and floors, read from sbn-bench's JSON --------------------------------------------
class FloorsError(ValueError):
    pass


def floor_key(shape, dtype, layout, n, c, spatial, epilogue="none"):
    """A row's key: its shape, dtype, layout, size and epilogue (sbn-bench --epilogue's rows
    move the fused op's bytes; a JSON from before the epilogue has none)."""
    return (str(shape).lower(), dtype, layout, n, c, spatial, epilogue or "none")


def load_floors(path):
    """{floor_key: {"fwd": {...}, "bwd": {...}}} from an sbn-bench --json file (rows and
    latency, any mode): the bytes and floors of its rows of ranks 1 (a row of W ranks moves W
    ranks' bytes), and its "bytes" and "floors" texts. Rows without floor bytes (a JSON from
    before schema 2) are left out."""
    try:
        with open(path, encoding="utf-8") as f:
            top = json.load(f)
    except (OSError, ValueError) as e:
        raise FloorsError(f"--floors-from {path}: cannot read: {e}")
    if not isinstance(top, dict) or top.get("tool") != "sbn-bench" or \
            not isinstance(top.get("rows"), list):
        raise FloorsError(f"--floors-from {path}: not an sbn-bench --json file")
    table, tol_used = {}, {}
    for r in top["rows"] + (top.get("latency") or []):
        if not isinstance(r, dict) or r.get("ranks") != 1:
            continue
        if r.get("path") in ("coop", "cpu"):  # the library's accuracy on the same shape
            tol_used[floor_key(r.get("shape"), r.get("dtype"), r.get("layout"), r.get("n"),
                               r.get("c"), r.get("spatial"), r.get("epilogue"))] = r.get("tol_used")
        ops = {op: r.get(op) for op in ("fwd", "bwd")}
        if not all(isinstance(o, dict) and o.get("floor_a_bytes") is not None for o in ops.values()):
            continue
        key = floor_key(r.get("shape"), r.get("dtype"), r.get("layout"), r.get("n"), r.get("c"),
                        r.get("spatial"), r.get("epilogue"))
        table[key] = {op: {k: o.get(k) for k in ("bytes_rank", "bytes_total", "floor_a_bytes",
                                                  "floor_b_bytes")} for op, o in ops.items()}
    return {"file": path, "rows": table, "tol_used": tol_used, "bytes": top.get("bytes"),
            "floors": top.get("floors")}


def op_derived(ref, us, B):
    """One op's bytes, GB/s, floors (a)/(b) in us and % of floor, from ref: the sbn-bench
    row's fwd or bwd bytes and floor bytes (None: unknown, every value None)."""
    def div(a, b):
        return a / b if a is not None and b else None

    ref = ref or {}
    us = us if us is not None and us > 0 else None
    fa = div(ref.get("floor_a_bytes"), B * 1e3 if B else None)  # B in GB/s = 1e3 bytes/us
    fb = div(ref.get("floor_b_bytes"), B * 1e3 if B else None)
    return {
        "bytes_rank": ref.get("bytes_rank"),
        "bytes_total": ref.get("bytes_total"),
        "gbps_rank": div(ref.get("bytes_rank"), us * 1e3 if us else None),
        "gbps_total": div(ref.get("bytes_total"), us * 1e3 if us else None),
        "floor_a_bytes": ref.get("floor_a_bytes"),
        "floor_b_bytes": ref.get("floor_b_bytes"),
        "floor_a_us": fa,
        "floor_b_us": fb,
        "pct_floor_a": div(fa, us) * 100.0 if div(fa, us) is not None else None,
        "pct_floor_b": div(fb, us) * 100.0 if div(fb, us) is not None else None,
    }
