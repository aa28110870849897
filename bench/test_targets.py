#!/usr/bin/env python3
"""Tests of bench/targets.py (issue 13's and 51's targets) on files made here: each target's
comparison at its boundary, the on-chip fit (the backward's inputs are x and dy), which files
count, a cell judged once, the exchange only between rows of the same kernel, and the exit
codes. No torch.

    python3 bench/test_targets.py [TARGETS_PY]

TARGETS_PY: the script to test (a mutant's path; by default the one beside this file).
"""

import importlib.util
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(HERE, "targets.py")
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
_spec = importlib.util.spec_from_file_location("targets_under_test", SCRIPT)
tg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tg)

L2 = 100  # bytes: the device's L2 in these files


def op(us, fa=None, fb=None):
    return {"us_median": us, "floor_a_us": fa, "floor_b_us": fb}


def brow(path, shape="S2", fwd=10.0, bwd=20.0, ranks=1, dtype="fp32", layout="NCHW", bytes_x=40,
         fa=(1.0, 1.0), fb=(1.0, 1.0), kernel="stream", wrong=0, error=None, epilogue=None):
    r = {"path": path, "shape": shape, "dtype": dtype, "layout": layout, "ranks": ranks,
         "bytes_x_total": bytes_x, "kernel": {"fwd": kernel, "bwd": kernel},
         "fwd": op(fwd, fa[0], fb[0]), "bwd": op(bwd, fa[1], fb[1]), "wrong": wrong, "error": error}
    if epilogue:
        r["epilogue"] = epilogue
    return r


def bench(rows, latency=(), inference=(), env=None, epilogue="none", l2=L2, algo=None, mode="gpu"):
    return {"tool": "sbn-bench", "mode": mode, "epilogue": epilogue, "sbn_kernel_env": env,
            "sbn_algo_env": algo, "device": {"l2_bytes": l2}, "complete": True,
            "inference_target": 1.1, "rows": list(rows), "latency": list(latency),
            "inference": list(inference)}


def files(*tops):
    return [{"path": f"f{i}.json", "kind": tg.kind_of(t), "top": t} for i, t in enumerate(tops)]


def judged(tops, target):
    return tg.judge(files(*tops)).v[target]


def one(tops, target, label):
    v = [x for x in judged(tops, target) if x["label"] == label]
    assert len(v) == 1, (label, [x["label"] for x in judged(tops, target)])
    return v[0]


class Floor(unittest.TestCase):
    def test_bound_at_its_edge_and_the_fit(self):
        # x 60 of an L2 of 100: the forward's input fits (floor (b)), the backward's x and dy
        # (120) do not (floor (a))
        r = brow("coop", fwd=1.15 * 6.0, bwd=1.25 * 10.0, bytes_x=60, fa=(9.0, 10.0), fb=(6.0, 8.0))
        f = one([bench([r])], "floor", "S2 fp32 NCHW W1 fwd")
        self.assertTrue(f["met"])
        self.assertIn("floor (b)", f["text"])
        b = one([bench([r])], "floor", "S2 fp32 NCHW W1 bwd")
        self.assertTrue(b["met"], b)
        self.assertIn("floor (a)", b["text"])
        r2 = brow("coop", fwd=1.15 * 6.0 * 1.001, bwd=1.25 * 10.0 * 1.001, bytes_x=60,
                  fa=(9.0, 10.0), fb=(6.0, 8.0))
        self.assertFalse(one([bench([r2])], "floor", "S2 fp32 NCHW W1 fwd")["met"])
        self.assertFalse(one([bench([r2])], "floor", "S2 fp32 NCHW W1 bwd")["met"])

    def test_inputs_at_the_l2_fit(self):
        r = brow("coop", bytes_x=L2 // 2, fwd=2.0, bwd=2.0, fa=(1.0, 1.0), fb=(2.0, 2.0))
        self.assertIn("floor (b)", one([bench([r])], "floor", "S2 fp32 NCHW W1 bwd")["text"])
        r = brow("coop", bytes_x=L2 // 2 + 1, fwd=2.0, bwd=2.0, fa=(1.0, 1.0), fb=(2.0, 2.0))
        self.assertIn("floor (a)", one([bench([r])], "floor", "S2 fp32 NCHW W1 bwd")["text"])

    def test_s10_and_other_paths_are_not_judged(self):
        v = judged([bench([brow("coop", shape="S10"), brow("nccl"), brow("cudnn")])], "floor")
        self.assertEqual(v, [])

    def test_no_l2_no_verdict(self):
        for l2 in (None, 0):  # 0: the device's L2 not known, not an L2 nothing fits in
            out = tg.judge(files(bench([brow("coop")], l2=l2)))
            self.assertEqual(out.v["floor"], [])
            self.assertTrue(out.notes["floor"])

    def test_only_the_plain_op_as_users_run_it(self):
        r = brow("coop", fwd=100.0)
        self.assertEqual(judged([bench([r], env="stream")], "floor"), [])
        self.assertEqual(judged([bench([r], epilogue="relu")], "floor"), [])
        self.assertEqual(judged([bench([r], algo="nccl")], "floor"), [])
        self.assertEqual(judged([bench([r], mode="cpu")], "floor"), [])
        self.assertEqual(len(judged([bench([r])], "floor")), 2)

    def test_a_cell_is_judged_once_from_the_first_file(self):
        a = bench([brow("coop", fwd=1.0, bwd=1.0)])
        b = bench([brow("coop", fwd=100.0, bwd=100.0)])
        v = judged([a, b], "floor")
        self.assertEqual(len(v), 2)
        self.assertTrue(all(x["met"] and x["src"] == "f0.json" for x in v))

    def test_a_wrong_row_is_no_comparison(self):
        self.assertEqual(judged([bench([brow("coop", wrong=1)])], "floor"), [])

    def test_each_w_of_a_cell_judged(self):
        # the same cell at W = 1 and W = 8: each W its own verdicts (a miss at W = 8 counts)
        rows = [brow("coop", fwd=1.0, bwd=1.0), brow("coop", ranks=8, fwd=100.0, bwd=100.0, bytes_x=400)]
        v = {x["label"]: x["met"] for x in judged([bench(rows)], "floor")}
        self.assertEqual(v, {"S2 fp32 NCHW W1 fwd": True, "S2 fp32 NCHW W1 bwd": True,
                             "S2 fp32 NCHW W8 fwd": False, "S2 fp32 NCHW W8 bwd": False})

    def test_the_fit_counts_every_rank(self):
        # W = 8, one rank's x 10 of the L2's 100: the forward's inputs (80) fit, the backward's
        # x and dy of all ranks (160) do not, however small one rank's are
        r = dict(brow("coop", ranks=8, bytes_x=80, fa=(9.0, 10.0), fb=(6.0, 8.0)), bytes_x_rank=10)
        self.assertIn("floor (b)", one([bench([r])], "floor", "S2 fp32 NCHW W8 fwd")["text"])
        self.assertIn("floor (a)", one([bench([r])], "floor", "S2 fp32 NCHW W8 bwd")["text"])

    def test_a_zero_floor_is_no_verdict(self):
        out = tg.judge(files(bench([brow("coop", fb=(0.0, 0.0))])))
        self.assertEqual(out.v["floor"], [])
        self.assertEqual(len(out.notes["floor"]), 2)


class Ratios(unittest.TestCase):
    def test_cudnn_needs_more_where_the_inputs_fit(self):
        fit = [brow("coop", bytes_x=40), brow("cudnn", fwd=13.0, bwd=12.999, bytes_x=40)]
        self.assertTrue(one([bench(fit)], "cudnn", "S2 fp32 NCHW W1 fwd")["met"])  # 1.3
        self.assertFalse(one([bench(fit)], "cudnn", "S2 fp32 NCHW W1 bwd")["met"])  # 0.65
        # x 80: the forward's input fits (1.3), the backward's x and dy (160) do not (1.0)
        big = [brow("coop", bytes_x=80), brow("cudnn", fwd=12.99, bwd=20.0, bytes_x=80)]
        f, b = (one([bench(big)], "cudnn", "S2 fp32 NCHW W1 " + o) for o in ("fwd", "bwd"))
        self.assertEqual((f["bound"], f["met"]), (1.3, False))
        self.assertEqual((b["bound"], b["met"]), (1.0, True))
        big[1]["bwd"]["us_median"] = 19.99
        self.assertFalse(one([bench(big)], "cudnn", "S2 fp32 NCHW W1 bwd")["met"])

    def test_cudnn_only_at_w1(self):
        rows = [brow("coop", ranks=8), brow("cudnn")]
        self.assertEqual([x["label"] for x in judged([bench(rows)], "cudnn")], [])

    def test_nccl_at_the_same_w_and_s10(self):
        rows = [brow("coop", ranks=8, bytes_x=400), brow("nccl", ranks=8, fwd=10.5, bwd=20.0, bytes_x=400),
                brow("nccl", ranks=1, fwd=1000.0, bwd=1000.0, bytes_x=400),
                brow("coop", shape="S10", fwd=1.0, bwd=1.0), brow("nccl", shape="S10", fwd=3.0, bwd=2.99)]
        v = {x["label"]: x for x in judged([bench(rows)], "nccl")}
        self.assertTrue(v["S2 fp32 NCHW W8 fwd"]["met"])  # 1.05, W = 8's own row
        self.assertFalse(v["S2 fp32 NCHW W8 bwd"]["met"])
        self.assertTrue(v["S10 fp32 NCHW W1 fwd"]["met"])
        self.assertFalse(v["S10 fp32 NCHW W1 bwd"]["met"])
        self.assertEqual(v["S10 fp32 NCHW W1 fwd"]["bound"], 3.0)

    def test_pytorch_from_its_own_file(self):
        coop = bench([brow("coop", bytes_x=80), brow("coop", shape="S10", fwd=1.0, bwd=1.0)])
        # forward fits, backward does not; the fused layer's row first: not the plain op's
        seq = {"tool": "torch_baseline", "mode": "gpu", "rows": [
            brow("torch_syncbn", fwd=1.0, bwd=1.0, bytes_x=80, epilogue="relu"),
            brow("torch_syncbn", fwd=18.0, bwd=22.99, bytes_x=80),
            brow("torch_syncbn", shape="S10", fwd=4.0, bwd=3.99)]}
        v = {x["label"]: x for x in judged([coop, seq], "pytorch")}
        self.assertEqual(set(v), {"S2 fp32 NCHW fwd", "S2 fp32 NCHW bwd", "S10 fp32 NCHW fwd",
                                  "S10 fp32 NCHW bwd"})
        self.assertTrue(v["S2 fp32 NCHW fwd"]["met"])  # 1.8
        self.assertFalse(v["S2 fp32 NCHW bwd"]["met"])  # 1.1495 < 1.15
        self.assertEqual((v["S10 fp32 NCHW fwd"]["bound"], v["S10 fp32 NCHW fwd"]["met"]), (4.0, True))
        self.assertFalse(v["S10 fp32 NCHW bwd"]["met"])

    def test_pytorch_dry_run_is_no_baseline(self):
        coop = bench([brow("coop")])
        seq = {"tool": "torch_baseline", "mode": "cpu-dryrun", "rows": [brow("torch_syncbn", fwd=1e4)]}
        out = tg.judge(files(coop, seq))
        self.assertEqual(out.v["pytorch"], [])
        self.assertTrue(out.notes["pytorch"])

    def test_pytorch_where_the_inputs_fit_at_its_edge(self):
        coop = bench([brow("coop", bytes_x=40)])
        seq = {"tool": "torch_baseline", "mode": "gpu",
               "rows": [brow("torch_syncbn", fwd=17.99, bwd=18.0, bytes_x=40)]}
        v = {x["label"]: x for x in judged([coop, seq], "pytorch")}
        self.assertEqual((v["S2 fp32 NCHW fwd"]["bound"], v["S2 fp32 NCHW fwd"]["met"]), (1.8, False))
        self.assertEqual((v["S2 fp32 NCHW bwd"]["bound"], v["S2 fp32 NCHW bwd"]["met"]), (1.8, False))

    def test_pytorch_against_the_plain_coop_row_of_w1_from_the_first_file(self):
        # the C op's time is the coop row of ranks 1 of the first plain file: not a file run
        # under SBN_KERNEL (even given first), not the W = 8 row, not a later file's
        stream = bench([brow("coop", fwd=1.0, bwd=1.0)], env="stream")
        first = bench([brow("coop", ranks=8, fwd=1.0, bwd=1.0), brow("coop", fwd=10.0, bwd=10.0)])
        later = bench([brow("coop", fwd=100.0, bwd=100.0)])
        seq = {"tool": "torch_baseline", "mode": "gpu", "rows": [brow("torch_syncbn", fwd=20.0, bwd=20.0)]}
        v = judged([stream, first, later, seq], "pytorch")
        self.assertEqual([(x["q"], x["src"]) for x in v], [(2.0, "f3.json"), (2.0, "f3.json")])

    def test_pytorch_only_its_valid_op_sequence(self):
        # nn.SyncBatchNorm's op sequence (torch_syncbn) and a right row of it: not torch_bn, not
        # a row with wrong values, whichever comes first
        coop = bench([brow("coop", fwd=10.0, bwd=10.0)])
        seq = {"tool": "torch_baseline", "mode": "gpu", "rows": [
            brow("torch_bn", fwd=50.0, bwd=50.0), brow("torch_syncbn", fwd=60.0, bwd=60.0, wrong=4),
            brow("torch_syncbn", fwd=12.0, bwd=12.0)]}
        v = judged([coop, seq], "pytorch")
        self.assertEqual([(x["q"], x["met"]) for x in v], [(1.2, False), (1.2, False)])

    def test_wrong_library_rows_meet_nothing(self):
        # the coop rows (main table, S10, latency, fused) had wrong values: no verdict of any
        # target may rest on their times, however good
        rows = [brow("coop", fwd=1.0, bwd=1.0, wrong=3), brow("cudnn", fwd=50.0, bwd=50.0),
                brow("nccl", fwd=50.0, bwd=50.0), brow("coop", shape="S10", fwd=1.0, bwd=1.0, wrong=1)]
        lat = [brow("coop", shape="tiny", fwd=6.0, bwd=6.0),
               brow("coop", shape="tiny", ranks=8, fwd=6.5, bwd=6.5, wrong=2)]
        fused = bench([brow("coop", fwd=1.0, epilogue="relu", wrong=5), brow("split", fwd=50.0, epilogue="relu")],
                      epilogue="relu")
        seq = {"tool": "torch_baseline", "mode": "gpu", "rows": [brow("torch_syncbn", fwd=50.0, bwd=50.0),
                                                                brow("torch_syncbn", shape="S10", fwd=50.0, bwd=50.0)]}
        out = tg.judge(files(bench(rows, latency=lat), fused, seq))
        for target in ("floor", "cudnn", "nccl", "pytorch", "s10", "exchange", "fused"):
            self.assertEqual(out.v[target], [], target)
        self.assertEqual(sum(not x["met"] for x in out.v["wrong"]), 4)

    def test_cudnn_s10(self):
        rows = [brow("coop", shape="S10", fwd=1.0, bwd=1.0),
                brow("cudnn", shape="S10", fwd=1.3, bwd=1.29)]
        v = {x["label"]: x for x in judged([bench(rows)], "cudnn")}
        self.assertEqual((v["S10 fp32 NCHW W1 fwd"]["bound"], v["S10 fp32 NCHW W1 fwd"]["met"]), (1.3, True))
        self.assertFalse(v["S10 fp32 NCHW W1 bwd"]["met"])

    def test_a_failed_comparison_row_is_no_comparison(self):
        rows = [brow("coop"), brow("cudnn", error="refused"), brow("nccl", wrong=1)]
        self.assertEqual(judged([bench(rows)], "cudnn"), [])
        self.assertEqual(judged([bench(rows)], "nccl"), [])


class Latency(unittest.TestCase):
    def test_s10(self):
        ok = brow("coop", shape="S10", fwd=6.0, bwd=4.0)
        self.assertTrue(one([bench([ok])], "s10", "S10 fp32 NCHW W1")["met"])
        no = brow("coop", shape="S10", fwd=6.0, bwd=4.01)
        self.assertFalse(one([bench([no])], "s10", "S10 fp32 NCHW W1")["met"])

    def test_exchange_between_rows_of_one_kernel(self):
        lat = [brow("coop", shape="tiny", fwd=6.0, bwd=6.0, kernel="small"),
               brow("coop", shape="tiny", fwd=16.0, bwd=16.0, ranks=8, kernel="stream")]
        out = tg.judge(files(bench([], latency=lat)))
        self.assertEqual(out.v["exchange"], [])  # small at W = 1, stream at 8: no pair
        self.assertTrue(out.notes["exchange"])
        lat = [brow("coop", shape="tiny", fwd=12.0, bwd=9.0),
               brow("coop", shape="tiny", fwd=14.0, bwd=11.01, ranks=8),
               brow("coop", shape="tiny", fwd=99.0, bwd=99.0, ranks=9)]  # beyond W = 8
        v = {x["label"]: x for x in judged([bench([], latency=lat, env="stream")], "exchange")}
        self.assertEqual(set(v), {"tiny fp32 NCHW W8 fwd SBN_KERNEL=stream (stream)",
                                  "tiny fp32 NCHW W8 bwd SBN_KERNEL=stream (stream)"})
        self.assertTrue(v["tiny fp32 NCHW W8 fwd SBN_KERNEL=stream (stream)"]["met"])
        self.assertFalse(v["tiny fp32 NCHW W8 bwd SBN_KERNEL=stream (stream)"]["met"])

    def test_s10_at_w1_only(self):
        rows = [brow("coop", shape="S10", ranks=8, fwd=1.0, bwd=1.0), brow("coop", shape="S10", fwd=6.0, bwd=5.0)]
        v = judged([bench(rows)], "s10")
        self.assertEqual([(x["label"], x["met"]) for x in v], [("S10 fp32 NCHW W1", False)])

    def test_exchange_of_the_coop_path_of_the_plain_op(self):
        # the nccl path's latency rows are not the exchange's (its W = 1 team is another kind);
        # nor are a fused op's (--epilogue)
        lat = [brow("coop", shape="tiny", fwd=6.0, bwd=6.0), brow("coop", shape="tiny", fwd=9.0, bwd=9.0, ranks=8),
               brow("nccl", shape="tiny", fwd=1.0, bwd=1.0), brow("nccl", shape="tiny", fwd=90.0, bwd=90.0, ranks=8)]
        v = judged([bench([], latency=lat, env="stream")], "exchange")
        self.assertEqual(sorted((x["label"], x["q"], x["met"]) for x in v),
                         [("tiny fp32 NCHW W8 bwd SBN_KERNEL=stream (stream)", 3.0, False),
                          ("tiny fp32 NCHW W8 fwd SBN_KERNEL=stream (stream)", 3.0, False)])
        self.assertEqual(judged([bench([], latency=lat, env="stream", epilogue="relu")], "exchange"), [])

    def test_inference_of_the_plain_op_files(self):
        inf = lambda q: [{"path": "coop", "shape": "S5", "dtype": "fp32", "layout": "NCHW", "x_copy": q,
                          "us_median": 70.0, "floor_us": 63.6, "error": None, "wrong": 0}]
        v = judged([bench([], inference=inf(1.0), env="stream"), bench([], inference=inf(2.0))], "inference")
        self.assertEqual([(x["q"], x["met"], x["src"]) for x in v], [(2.0, False, "f1.json")])

    def test_inference(self):
        inf = [{"path": "cudnn", "shape": "S5", "dtype": "fp32", "layout": "NCHW", "x_copy": 9.0,
                "us_median": 70.0, "floor_us": 63.6, "error": None, "wrong": 0},
               {"path": "coop", "shape": "S5", "dtype": "fp32", "layout": "NCHW", "x_copy": 1.1,
                "us_median": 70.0, "floor_us": 63.6, "error": None, "wrong": 0},
               {"path": "coop", "shape": "S8", "dtype": "fp32", "layout": "NCHW", "x_copy": 1.1001,
                "us_median": 70.0, "floor_us": 63.6, "error": None, "wrong": 0}]
        v = {x["label"]: x["met"] for x in judged([bench([], inference=inf)], "inference")}
        self.assertEqual(v, {"S5 fp32 NCHW": True, "S8 fp32 NCHW": False})


class Fused(unittest.TestCase):
    def test_split_over_fused(self):
        rows = [brow("coop", epilogue="relu"), brow("split", fwd=13.0, epilogue="relu"),
                brow("coop", shape="S3", epilogue="relu"), brow("split", shape="S3", fwd=12.99, epilogue="relu")]
        v = {x["label"]: x["met"] for x in judged([bench(rows, epilogue="relu")], "fused")}
        self.assertEqual(v, {"S2 fp32 NCHW W1 fwd relu": True, "S3 fp32 NCHW W1 fwd relu": False})

    def test_split_rows_that_count(self):
        # S10 is no fused target; a wrong split row, or a file run under SBN_KERNEL, no comparison
        rows = [brow("coop", shape="S10", epilogue="relu"), brow("split", shape="S10", fwd=13.0, epilogue="relu"),
                brow("coop", epilogue="relu"), brow("split", fwd=13.0, epilogue="relu", wrong=1)]
        self.assertEqual(judged([bench(rows, epilogue="relu")], "fused"), [])
        ok = [brow("coop", epilogue="relu"), brow("split", fwd=13.0, epilogue="relu")]
        self.assertEqual(judged([bench(ok, epilogue="relu", env="stream")], "fused"), [])
        self.assertEqual(judged([bench(ok, epilogue="relu", algo="nccl")], "fused"), [])
        self.assertEqual(len(judged([bench(ok, epilogue="relu")], "fused")), 1)

    def test_memory(self):
        mem = {"meta": {}, "rows": [
            {"model": "unfused", "inplace_layers": 0, "ratio": 1.0, "bytes": 100},
            {"model": "fused in-place", "inplace_layers": 8, "ratio": 0.6, "bytes": 60},
            {"model": "fused in-place, leaky", "inplace_layers": 12, "ratio": 0.61, "bytes": 61}]}
        v = {x["label"]: x["met"] for x in judged([mem], "memory")}
        self.assertEqual(v, {"fused in-place": True, "fused in-place, leaky": False})
        # a model the library refused: a miss of both targets, not a row left out
        mem["rows"][1] = {"model": "fused in-place", "inplace_layers": 8, "bytes": None, "error": "sbnNotSupported"}
        v = {x["label"]: x["met"] for x in judged([mem], "memory")}
        self.assertEqual(v, {"fused in-place": False, "fused in-place, leaky": False})
        self.assertEqual([(x["label"], x["met"]) for x in judged([mem], "wrong")],
                         [("model fused in-place (rows)", False)])

    def test_wrong(self):
        top = bench([brow("coop"), brow("nccl", wrong=2), brow("cudnn", error="boom")])
        v = judged([top], "wrong")
        self.assertEqual(sorted((x["label"], x["met"]) for x in v),
                         [("cudnn S2 fp32 NCHW W1 (rows)", False), ("nccl S2 fp32 NCHW W1 (rows)", False)])
        self.assertTrue(all(x["met"] for x in judged([bench([brow("coop")])], "wrong")))
        lat = [brow("coop", shape="tiny", wrong=1)]
        inf = [{"path": "coop", "shape": "S5", "dtype": "fp32", "layout": "NCHW", "x_copy": 1.0,
                "error": "boom", "wrong": 0}]
        v = judged([bench([brow("coop")], latency=lat, inference=inf)], "wrong")
        self.assertEqual(sorted(x["label"] for x in v if not x["met"]),
                         ["coop S5 fp32 NCHW (inference)", "coop tiny fp32 NCHW W1 (latency)"])
        # torch_baseline's empty op that PyTorch rejects: reported there, not a failure
        rejected = brow("torch_syncbn", shape="empty", error="ValueError: ...")
        rejected["note"] = "PyTorch rejected the empty op: reported, not a failure"
        top = {"tool": "torch_baseline", "mode": "gpu", "rows": [brow("torch_syncbn")], "latency": [rejected]}
        self.assertEqual([(x["label"], x["met"]) for x in judged([top], "wrong")], [("1 rows", True)])
        rejected["wrong"] = 3  # the note excuses a rejection, not wrong values
        self.assertEqual([(x["label"], x["met"]) for x in judged([top], "wrong")],
                         [("torch_syncbn empty fp32 NCHW W1 (latency)", False)])


class Command(unittest.TestCase):
    def run_main(self, argv):
        buf = io.StringIO()
        with redirect_stdout(buf):
            rc = tg.main(argv)
        return rc, buf.getvalue()

    def test_exit_codes_and_summary(self):
        with tempfile.TemporaryDirectory() as d:
            good, bad = os.path.join(d, "bench.json"), os.path.join(d, "other.json")
            with open(good, "w") as f:
                json.dump(bench([brow("coop"), brow("cudnn", fwd=20.0, bwd=40.0)]), f)
            with open(bad, "w") as f:
                json.dump({"rows": []}, f)
            rc, text = self.run_main([good])
            self.assertEqual(rc, 0)
            self.assertIn("## floor", text)
            # each row: its mark, the measured quotient and the rule
            self.assertRegex(text, r"(?m)^  MISS S2 fp32 NCHW W1 fwd +10 <= 1.15 +t 10.0 us")
            self.assertRegex(text, r"(?m)^  ok   S2 fp32 NCHW W1 fwd +2 >= 1.3 +coop 10.0 us")
            self.assertIn("cudnn      met by 2 of 2", text)
            rc, text = self.run_main(["--summary", good])
            self.assertEqual(rc, 0)
            self.assertNotIn("## floor", text)
            self.assertIn("floor      met by 0 of 2", text)
            self.assertIn("wrong      1 file(s) with every row right; 0 row(s) wrong or failed", text)
            # the summary's worst row: the furthest from its bound, whichever way the rule goes
            two = os.path.join(d, "two.json")
            with open(two, "w") as f:
                json.dump(bench([brow("coop", fwd=2.0, bwd=2.0), brow("coop", shape="S5", fwd=3.0, bwd=3.0),
                                 brow("cudnn", fwd=1.8, bwd=1.8), brow("cudnn", shape="S5", fwd=1.5, bwd=1.5)]), f)
            rc, text = self.run_main(["--summary", two])
            self.assertIn("floor      met by 0 of 4; worst S5 fp32 NCHW W1 fwd: 3 (<= 1.15)", text)
            self.assertIn("cudnn      met by 0 of 4; worst S5 fp32 NCHW W1 fwd: 0.5 (>= 1.3)", text)
            part = os.path.join(d, "part.json")
            with open(part, "w") as f:
                json.dump(dict(bench([brow("coop")]), complete=False), f)
            rc, text = self.run_main(["--summary", part])
            self.assertIn("complete false", text)
            self.assertEqual(self.run_main([good, bad])[0], 2)
            self.assertEqual(self.run_main([os.path.join(d, "none.json")])[0], 2)
            self.assertEqual(self.run_main([])[0], 2)


if __name__ == "__main__":
    unittest.main()
