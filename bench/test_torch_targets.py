#!/usr/bin/env python3
"""Tests of bench/torch_targets.py on rows made here: each target's comparison at its
boundary (a bound met exactly is met, a hair above is missed; the op sequence must be beaten
strictly), cells without a comparison row, the epilogue kept apart, the slow-host mark, and
the command's exit codes. No torch."""

import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_targets as tt  # noqa: E402


def row(path, fwd, bwd, hf=None, hb=None, shape="S2", dtype="fp32", layout="NCHW", epilogue="none", ref=None):
    r = {"path": path, "shape": shape, "dtype": dtype, "layout": layout, "epilogue": epilogue, "ranks": 1,
         "error": None, "fwd": {"us_median": fwd, "host_us_median": hf},
         "bwd": {"us_median": bwd, "host_us_median": hb}}
    if ref is not None:
        r["host_ref_us"] = ref
    return r


def coop_of(*rows):
    return {tt.cell_key(r): r for r in rows}


def verdict(v, path, op, key=("S2", "fp32", "NCHW", "none")):
    return next(x for x in v if x["path"] == path and x["op"] == op and x["key"] == key)


class Targets(unittest.TestCase):
    def test_gpu_bound_at_its_edge(self):
        c = row("coop", 10.0, 20.0)
        bound_f, bound_b = 1.1 * 10.0 + 2.0, 1.1 * 20.0 + 2.0
        v = tt.judge([row("syncbn_torch", bound_f, bound_b + 1e-6)], coop_of(c))
        self.assertIs(verdict(v, "syncbn_torch", "fwd")["gpu"], True)
        self.assertIs(verdict(v, "syncbn_torch", "bwd")["gpu"], False)
        self.assertAlmostEqual(verdict(v, "syncbn_torch", "fwd")["bound_us"], bound_f)

    def test_sequence_must_be_beaten(self):
        rows = [row("syncbn_torch_op", 30.0, 40.0), row("torch_syncbn", 30.0, 40.5)]
        v = tt.judge(rows, {})
        self.assertIs(verdict(v, "syncbn_torch_op", "fwd")["seq"], False)  # equal is not faster
        self.assertIs(verdict(v, "syncbn_torch_op", "bwd")["seq"], True)
        self.assertIsNone(verdict(v, "syncbn_torch_op", "fwd")["gpu"])  # no coop row

    def test_host_against_the_module(self):
        rows = [row("syncbn_torch", 1, 1, hf=20.0, hb=50.0), row("torch_bn_module", 1, 1, hf=20.0, hb=49.0)]
        v = tt.judge(rows, {})
        self.assertIs(verdict(v, "syncbn_torch", "fwd")["host"], True)  # equal is met
        self.assertIs(verdict(v, "syncbn_torch", "bwd")["host"], False)
        self.assertEqual(tt.counts(v, "syncbn_torch", "bwd"), {"gpu": (0, 0), "seq": (0, 0), "host": (0, 1)})

    def test_cells_kept_apart(self):
        # a coop row of the plain op is not the fused op's, nor another dtype's
        coop = coop_of(row("coop", 10.0, 10.0), row("coop", 100.0, 100.0, epilogue="relu"),
                       row("coop", 50.0, 50.0, dtype="bf16"))
        rows = [row("syncbn_torch", 20.0, 20.0, epilogue="relu"), row("syncbn_torch", 20.0, 20.0)]
        v = tt.judge(rows, coop)
        self.assertIs(verdict(v, "syncbn_torch", "fwd", ("S2", "fp32", "NCHW", "relu"))["gpu"], True)
        self.assertIs(verdict(v, "syncbn_torch", "fwd")["gpu"], False)

    def test_failed_rows_and_other_paths_left_out(self):
        bad = row("syncbn_torch", 1.0, 1.0)
        bad["error"] = "RuntimeError: x"
        wrong = dict(row("syncbn_torch_op", 1.0, 1.0), wrong=3)
        v = tt.judge([bad, wrong, row("torch_bn", 1.0, 1.0)], {})
        self.assertEqual(v, [])
        # nor is a wrong comparison row: the op sequence's here
        seq = dict(row("torch_syncbn", 50.0, 50.0), wrong=1)
        v = tt.judge([row("syncbn_torch", 60.0, 60.0), seq], {})
        self.assertIsNone(verdict(v, "syncbn_torch", "fwd")["seq"])

    def test_no_time_is_no_verdict(self):
        # a median of 0 (or none) is no measurement: neither met nor missed
        c = row("coop", 10.0, 10.0)
        v = tt.judge([row("syncbn_torch", 0.0, None), row("torch_syncbn", 30.0, 30.0)], coop_of(c))
        for op in ("fwd", "bwd"):
            self.assertIsNone(verdict(v, "syncbn_torch", op)["gpu"])
            self.assertIsNone(verdict(v, "syncbn_torch", op)["seq"])

    def test_slow_host_marked(self):
        rows = [row("syncbn_torch", 1, 1, ref=4.0), row("syncbn_torch", 1, 1, shape="S10", ref=6.5)]
        v = tt.judge(rows, {}, slow_factor=1.5, median_ref=4.0)
        self.assertFalse(verdict(v, "syncbn_torch", "fwd")["slow"])
        self.assertTrue(verdict(v, "syncbn_torch", "fwd", ("S10", "fp32", "NCHW", "none"))["slow"])

    def test_command(self):
        with tempfile.TemporaryDirectory() as d:
            tj, bj = os.path.join(d, "torch.json"), os.path.join(d, "bench.json")
            with open(tj, "w") as f:
                json.dump({"tool": "torch_baseline", "rows": [row("syncbn_torch", 12.0, 40.0, 20, 90, ref=4.0),
                                                               row("torch_bn_module", 9.0, 45.0, 30, 95, ref=4.1),
                                                               row("torch_syncbn", 200.0, 35.0, ref=3.9),
                                                               row("syncbn_torch", 12.0, 9.0, 20, 90,
                                                                   shape="S10", ref=6.5)],
                           "host_ref": {"median_us": 4.0, "slow_factor": 1.5}}, f)
            with open(bj, "w") as f:
                # the C op is the coop row: not the nccl path's, nor a row of W ranks
                json.dump({"tool": "sbn-bench", "rows": [row("coop", 11.0, 9.0), row("nccl", 100.0, 100.0),
                                                         dict(row("coop", 100.0, 100.0), ranks=8),
                                                         dict(row("coop", 1.0, 1.0, shape="S10"), wrong=2)]}, f)
            out = io.StringIO()
            with redirect_stdout(out):
                self.assertEqual(tt.main([tj, bj]), 0)
            text = out.getvalue()
            # S10's coop row had wrong values: no bound there
            self.assertIn("# syncbn_torch fwd: gpu 1 of 1, seq 1 of 1, host 1 of 1", text)
            self.assertIn("# syncbn_torch bwd: gpu 0 of 1, seq 0 of 1, host 1 of 1", text)
            # the row's marks: gpu (40 > 1.1 x 9 + 2) and seq (40 >= 35) missed, host met
            self.assertRegex(text, r"syncbn_torch +S2 +fp32 NCHW none +bwd \| +40.0 +9.0 +11.9 MISS \| "
                                   r"+35.0 MISS \| +90.0 +95.0 +ok")
            slow = [ln for ln in text.splitlines() if ln.endswith("slow host")]
            self.assertEqual(len(slow), 2, text)  # S10's fwd and bwd lines
            self.assertTrue(all(" S10 " in ln for ln in slow), slow)
            self.assertIn("# 1 row(s) ran on a slowed host", text)
            with redirect_stdout(io.StringIO()):
                self.assertEqual(tt.main([tj, tj]), 2)  # not an sbn-bench file
                self.assertEqual(tt.main([tj, os.path.join(d, "missing.json")]), 2)


if __name__ == "__main__":
    unittest.main()
