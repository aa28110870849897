"""syncbn.torch's fused batch norm + activation (+ residual) on CPU teams (ranks as
threads), against float64 PyTorch act(batch_norm(x) + z) of the team's whole batch and its
autograd: the layer (SyncBatchNorm(activation=, slope=, inplace=), forward(x, residual)),
its operators (syncbn::batch_norm_act_train / _backward / _infer: opcheck, torch.compile,
compiled autograd; their mutants without the fake or the Autograd kernel fail), the refusals, and convert_fused (what it fuses gives the original model's results; what it
must not fuse is left alone).

Tolerances (test_torch.py's, bench/notes/tolerances.md): fp32 y, dx, dz within 3e-5
relative + 3e-5 absolute, dweight/dbias (sums over the ranks) 1e-4; fp16/bf16 within one
rounding of the output and the input (2e-3, 1.6e-2) relative and absolute, their
parameter gradients (fp32 sums of up to 60 products of dtype-rounded terms) 4x that. The
in-place backward adds the bound of tolerances.md ("The in-place backward"), doubled, per
element: e_i = (|v_i| u + |v_i - bias| 2^-23) / |weight| (v = bn(x) + z before the
activation, u the dtype's unit roundoff) gives dweight within sum |g| e and dx within
|weight| invstd (e_i |mean(g x_hat)| + |x_hat_i| mean(|g| e)), g = dy act'(y).
"""

import contextlib
import copy
import functools
from collections import OrderedDict
import gc
import io
import os
import pickle
import sys
import threading
import unittest
import warnings
import weakref

import numpy as np  # noqa: F401 (torch's CPU ops need it at import in some builds)
import torch
import torch.nn as nn
import torch.nn.functional as F

import syncbn
import syncbn.torch as sbt
from rank_threads import (TeamOfOne, converted_matches, legacy_checkpoint, legacy_state_dict_hooks, run_ranks,
                          team_of_two_matches)
from syncbn import _fused, _ops
from test_torch_ops import (act_ref, compiled_autograd_matches_eager, compiled_autograd_on,
                            compiled_autograd_supported, mutant_ops, needs_vmap_rules)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import torch_fused_memory  # noqa: E402 (bench/: the memory report's CPU measure)

TOL = {torch.float32: (3e-5, 3e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
PTOL = {torch.float32: (1e-4, 1e-4), torch.float16: (8e-3, 8e-3), torch.bfloat16: (6.4e-2, 6.4e-2)}
UNIT = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def inplace_bound(V, Y, G, W, B, invstd, xhat, activation, slope, dtype, Z=None):
    """The in-place backward's first-order error bound (tolerances.md), doubled: per
    element for dx, per channel for dweight (all float64, whole batch). Z: the residual
    (V = batch_norm(x) + Z), which the recovery subtracts: two fp32 roundings more
    (tolerances.md, "The in-place backward with a residual")."""
    shape = [1, -1] + [1] * (V.dim() - 2)
    dims = [0] + list(range(2, V.dim()))
    ones = [1, V.shape[1]] + [1] * (V.dim() - 2)
    w = W.abs().view(shape) if W is not None else torch.ones(ones, dtype=V.dtype)
    b = B.view(shape) if B is not None else torch.zeros(ones, dtype=V.dtype)
    if Z is None:
        e = (V.abs() * UNIT[dtype] + (V - b).abs() * 2.0 ** -23) / w
    else:
        e = (V.abs() * (UNIT[dtype] + 2.0 ** -24) + (V - Z).abs() * 2.0 ** -24 + (V - Z - b).abs() * 2.0 ** -23) / w
    g = G if activation == "identity" else torch.where(Y > 0, G, G * (0.0 if activation == "relu" else slope))
    dweight = (g.abs() * e).sum(dims)
    m = V.numel() / V.shape[1]
    mean_gx = (g * xhat).sum(dims).abs().view(shape) / m
    mean_ge = (g.abs() * e).sum(dims).view(shape) / m
    dx = w * invstd.view(shape) * (e * mean_gx + xhat.abs() * mean_ge)
    return 2 * dx, 2 * dweight


def assert_within(test, got, want, rtol, atol, extra=0.0, msg=""):
    """got within atol + rtol |want| + extra of want, element by element, of want's shape; a
    NaN in got is off unless want has a NaN there (err <= lim is False for NaN, where
    err > lim was False too: an all-NaN output passed)."""
    test.assertEqual(tuple(got.shape), tuple(want.shape), f"{msg}: shape")
    if want.numel() == 0:
        return
    got, want = got.detach(), want.detach()
    err = (got.double() - want).abs()
    lim = atol + rtol * want.abs() + extra
    bad = ~(err <= lim) & ~(got.isnan() & want.isnan())
    test.assertFalse(bool(bad.any()), f"{msg}: {int(bad.sum())} elements off, max excess "
                                      f"{float((err - lim).nan_to_num(nan=float('inf')).max()):.3g}")


class TestAssertWithin(unittest.TestCase):
    def test_nan_and_shape_are_off(self):
        """The tests' value check: a NaN where the reference has a number, an inf, or another
        shape fails it; a NaN where the reference has one, and values within the bound,
        pass (err > lim let an all-NaN output pass)."""
        want = torch.tensor([1.0, 2.0, float("nan")], dtype=torch.float64)
        assert_within(self, torch.tensor([1.0, 2.0 + 1e-7, float("nan")]), want, 1e-5, 1e-5, msg="close")
        for got in (torch.tensor([float("nan"), 2.0, float("nan")]), torch.tensor([1.0, float("inf"), 0.0]),
                    torch.tensor([1.0, 2.0]), torch.tensor([[1.0, 2.0, float("nan")]])):
            with self.assertRaises(AssertionError, msg=str(got)):
                assert_within(self, got, want, 1e-5, 1e-5, msg="off")


class TestFusedLayer(unittest.TestCase):
    def _case(self, ns, c, hw, dtype=torch.float32, channels_last=False, activation="relu", slope=0.01,
              residual=True, inplace=False, affine=True, momentum=0.1, steps=2, seed=0, bias=True):
        """Trains `steps` steps on a team of len(ns) ranks and checks y, dx, dz, dweight,
        dbias and the running statistics against float64 PyTorch over the whole batch;
        then eval against the formula with the running statistics. bias=False: the
        reference's bias 0, not trained."""
        torch.manual_seed(seed)
        W = len(ns)
        comms = syncbn.cpu_team(W, timeout_ms=60000)
        ref = nn.BatchNorm2d(c, momentum=momentum, affine=affine).double()
        if affine:
            with torch.no_grad():
                ref.weight.uniform_(0.5, 1.5)
                ref.bias.uniform_(-0.5, 0.5) if bias else ref.bias.zero_()
            ref.bias.requires_grad_(bias)
        layers = [sbt.SyncBatchNorm(c, momentum=momentum, affine=affine, comm=comms[r], activation=activation,
                                    slope=slope, inplace=inplace, bias=bias) for r in range(W)]
        for m in layers:
            m.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ref.state_dict().items()
                               if bias or k != "bias"})
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        rtol, atol = TOL[dtype]
        prtol, patol = PTOL[dtype]
        try:
            for step in range(steps):
                xs = [(torch.randn(n, c, *hw, dtype=torch.float64) + 1.0) for n in ns]
                zs = [torch.randn(n, c, *hw, dtype=torch.float64) for n in ns]
                gs = [torch.randn(n, c, *hw, dtype=torch.float64) for n in ns]
                xin = [x.to(dtype).contiguous(memory_format=fmt).requires_grad_() for x in xs]
                zin = [z.to(dtype).contiguous(memory_format=fmt).requires_grad_() for z in zs]
                ys = [None] * W
                for m in layers:
                    m.zero_grad()

                def rank(r):
                    y = layers[r](xin[r], zin[r] if residual else None)
                    ys[r] = y
                    (y.to(torch.float64) * gs[r]).sum().backward()

                self.assertEqual(run_ranks(W, rank), [None] * W)
                X = torch.cat([x.detach().double() for x in xin]).requires_grad_()
                Z = torch.cat([z.detach().double() for z in zin]).requires_grad_()
                G = torch.cat([g.to(dtype).double() for g in gs])
                ref.zero_grad()
                Vn = ref(X)
                V = Vn + Z if residual else Vn
                Y = act_ref(V, activation, slope)
                (Y * G).sum().backward()
                ex = exw = 0.0
                if inplace:
                    dims = [0] + list(range(2, X.dim()))
                    mean = X.detach().mean(dims)
                    invstd = (X.detach().var(dims, unbiased=False) + ref.eps).rsqrt()
                    xhat = (X.detach() - mean.view(1, -1, 1, 1)) * invstd.view(1, -1, 1, 1)
                    ex, exw = inplace_bound(V.detach(), Y.detach(), G, ref.weight.detach() if affine else None,
                                            ref.bias.detach() if affine else None, invstd, xhat, activation, slope,
                                            dtype, Z.detach() if residual else None)
                o = 0
                for r, n in enumerate(ns):
                    sl = slice(o, o + n)
                    assert_within(self, ys[r], Y[sl].detach(), rtol, atol, msg=f"y rank {r} step {step}")
                    extra = ex[sl] if inplace else 0.0
                    assert_within(self, xin[r].grad, X.grad[sl], rtol, atol, extra, msg=f"dx rank {r} step {step}")
                    if residual:
                        assert_within(self, zin[r].grad, Z.grad[sl], rtol, atol, msg=f"dz rank {r}")
                    else:
                        self.assertIsNone(zin[r].grad)
                    if channels_last and n > 0:
                        self.assertTrue(ys[r].is_contiguous(memory_format=torch.channels_last))
                    o += n
                for r in range(W):
                    torch.testing.assert_close(layers[r].running_mean.double(), ref.running_mean, rtol=3e-5,
                                               atol=3e-5)
                    torch.testing.assert_close(layers[r].running_var.double(), ref.running_var, rtol=3e-5,
                                               atol=3e-5)
                    self.assertEqual(int(layers[r].num_batches_tracked), int(ref.num_batches_tracked))
                if affine:
                    gw = sum(m.weight.grad.double() for m in layers)
                    assert_within(self, gw, ref.weight.grad, prtol, patol, exw, msg="dweight")
                if affine and bias:
                    gb = sum(m.bias.grad.double() for m in layers)
                    assert_within(self, gb, ref.bias.grad, prtol, patol, msg="dbias")
            # eval: the same formula with the running statistics (rank 0 alone)
            for m in layers:
                m.eval()
            ref.eval()
            x = (torch.randn(2, c, *hw, dtype=torch.float64) + 1.0).to(dtype).contiguous(memory_format=fmt)
            z = torch.randn(2, c, *hw, dtype=torch.float64).to(dtype).contiguous(memory_format=fmt)
            xe, ze = x.clone().requires_grad_(), z.clone().requires_grad_()
            ye = layers[0](xe, ze if residual else None)
            g = torch.randn(ye.shape, dtype=torch.float64)
            (ye.double() * g).sum().backward()
            Xe, Ze = x.double().requires_grad_(), z.double().requires_grad_()
            Ve = ref(Xe) + (Ze if residual else 0)
            Ye = act_ref(Ve, activation, slope)
            (Ye * g.to(dtype).double()).sum().backward()
            assert_within(self, ye, Ye.detach(), rtol, atol, msg="eval y")
            assert_within(self, xe.grad, Xe.grad, rtol, atol, msg="eval dx")
            if residual:
                assert_within(self, ze.grad, Ze.grad, rtol, atol, msg="eval dz")
        finally:
            for cm in comms:
                cm.destroy()

    def test_relu_residual_fp32(self):
        self._case([2, 3], 5, (3, 4), seed=1)

    def test_relu_residual_uneven_and_empty_ranks(self):
        self._case([2, 0, 3], 4, (3, 3), seed=2)

    def test_leaky_residual_channels_last_momentum_none(self):
        self._case([1, 3], 6, (2, 5), channels_last=True, activation="leaky_relu", slope=0.2, momentum=None,
                   steps=3, seed=3)

    def test_identity_residual_no_affine(self):
        self._case([2, 2], 3, (4, 4), activation="identity", affine=False, seed=4)

    def test_relu_without_residual_team_of_one(self):
        self._case([4], 3, (3, 3), residual=False, seed=5)

    def test_fp16_relu_residual(self):
        self._case([2, 3], 4, (3, 3), dtype=torch.float16, seed=6)

    def test_bf16_leaky_channels_last(self):
        self._case([3, 2], 4, (3, 3), dtype=torch.bfloat16, channels_last=True, activation="leaky_relu",
                   slope=0.1, seed=7)

    def test_inplace_leaky_fp32(self):
        self._case([3, 2], 5, (3, 4), activation="leaky_relu", slope=0.01, residual=False, inplace=True, seed=8)

    def test_inplace_identity_channels_last(self):
        self._case([2, 2], 4, (3, 3), channels_last=True, activation="identity", residual=False, inplace=True,
                   seed=9)

    def test_inplace_fp16_bf16(self):
        self._case([2, 3], 4, (3, 3), dtype=torch.float16, activation="leaky_relu", slope=0.2, residual=False,
                   inplace=True, seed=10)
        self._case([2, 3], 4, (3, 3), dtype=torch.bfloat16, channels_last=True, activation="leaky_relu",
                   slope=0.2, residual=False, inplace=True, seed=11)

    def test_inplace_half_warns_small_weights(self):
        """In place in fp16 or bf16, a channel whose |weight| is below 16 u |bias| (u the
        dtype's unit roundoff) has its weight's gradient 0 (below u |bias|) or off by more
        than ~6 %: the layer's first eager training call in that dtype warns, naming how many
        channels (once per layer and dtype; not in float32, not where the weights are far
        from it). Why: bf16's channel of weight 3e-4 (below u |bias| = 0.0039) gets a
        gradient of exactly 0."""
        comm = syncbn.cpu_team(1)[0]
        cases = ((torch.bfloat16, [1.0, 2e-3, 0.5, 3e-4], 2), (torch.float16, [1.0, 2e-3, 0.5, 3e-4], 2),
                 (torch.float16, [1.0, 0.5, 0.8, 0.7], 0), (torch.float32, [1.0, 2e-3, 0.5, 3e-4], 0))
        for dtype, weight, warned in cases:
            layer = sbt.SyncBatchNorm(4, comm=comm, activation="leaky_relu", slope=0.1, inplace=True)
            with torch.no_grad():
                layer.weight.copy_(torch.tensor(weight))
                layer.bias.copy_(torch.tensor([0.1, 1.0, 0.2, 1.0]))
            x = torch.randn(4, 4, 3, 3).to(dtype)
            for call in range(2):
                with warnings.catch_warnings(record=True) as got:
                    warnings.simplefilter("always")
                    layer(x).float().sum().backward()
                said = [str(w.message) for w in got if issubclass(w.category, RuntimeWarning)
                        and "in place in" in str(w.message)]
                if warned and call == 0:
                    self.assertEqual(len(said), 1, (dtype, said))
                    self.assertIn(f"{warned} of 4 channels", said[0])
                else:
                    self.assertEqual(said, [], (dtype, call))
            if dtype == torch.bfloat16:
                self.assertEqual(float(layer.weight.grad[3]), 0.0)

    def test_bias_false(self):
        """bias=False: a weight and no bias, with a residual, and in place (whose backward
        recovers x from y with a bias of 0)."""
        self._case([2, 3], 4, (3, 3), seed=13, bias=False)
        self._case([3, 2], 4, (3, 3), activation="leaky_relu", slope=0.1, residual=False, inplace=True, seed=14,
                   bias=False)

    def test_inplace_no_affine(self):
        self._case([2, 2], 3, (4, 4), activation="leaky_relu", residual=False, inplace=True, affine=False, seed=12)

    def test_inplace_with_residual(self):
        """In place with a residual (sbnBackwardInPlaceEx: x from y and the residual): fp32,
        fp16 and bf16, both memory formats, uneven and empty ranks, identity and leaky
        ReLU, affine or not, within the bound with the residual's roundings."""
        self._case([2, 3], 4, (3, 3), activation="leaky_relu", slope=0.01, inplace=True, seed=15)
        self._case([3, 0, 1], 4, (3, 3), channels_last=True, activation="identity", inplace=True, seed=16)
        self._case([2, 2], 4, (3, 3), dtype=torch.float16, activation="leaky_relu", slope=0.2, inplace=True,
                   seed=17)
        self._case([2, 3], 4, (3, 3), dtype=torch.bfloat16, channels_last=True, activation="leaky_relu",
                   slope=0.1, inplace=True, seed=18)
        self._case([2, 2], 3, (4, 4), activation="leaky_relu", inplace=True, affine=False, seed=19)


def saved_storages(fn):
    """The storages (data_ptr) autograd saves while fn() runs, and fn's result."""
    ptrs = []

    def pack(t):
        ptrs.append(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return set(ptrs), out


class TestWithoutActivation(TeamOfOne):
    def test_activate_false(self):
        """forward(x, residual, activate=False) of a layer with an activation (and of an
        in-place one, which then keeps its input as a plain layer does) is batch_norm(x) +
        residual, without the activation: float64 nn.BatchNorm2d of the same state the
        reference (outputs, input and parameter gradients, running statistics; training and
        eval); a BatchNormXd with an activation (the reverted layer) likewise."""
        torch.manual_seed(21)
        x, z = torch.randn(3, 4, 3, 3), torch.randn(3, 4, 3, 3)
        layers = [sbt.SyncBatchNorm(4, activation="leaky_relu", slope=0.2, comm=self.comm),
                  sbt.SyncBatchNorm(4, activation="relu", comm=self.comm),
                  sbt.SyncBatchNorm(4, activation="leaky_relu", slope=0.2, inplace=True, comm=self.comm),
                  sbt.BatchNormXd(4, activation="relu")]
        for layer in layers:
            randomize_bn(layer)
            ref = nn.BatchNorm2d(4).double()
            ref.load_state_dict(layer.state_dict())
            for training in (True, False):
                layer.train(training)
                ref.train(training)
                for res in (None, z):  # (the in-place layer too: it is not in place then)
                    msg = f"{layer!r}, training {training}, residual {res is not None}"
                    xs, xd = x.clone().requires_grad_(), x.double().requires_grad_()
                    y = layer(xs, res, activate=False)
                    want = ref(xd) + (0 if res is None else res.double())
                    assert_within(self, y, want, *TOL[torch.float32], msg=msg)
                    g = torch.randn(y.shape, dtype=torch.float64)
                    (y.double() * g).sum().backward()
                    (want * g).sum().backward()
                    assert_within(self, xs.grad, xd.grad, *TOL[torch.float32], msg=f"dx, {msg}")
                    for p, q in ((layer.weight, ref.weight), (layer.bias, ref.bias)):
                        assert_within(self, p.grad, q.grad, *PTOL[torch.float32], msg=f"dparam, {msg}")
                        p.grad, q.grad = None, None
                    for name in ("running_mean", "running_var"):
                        assert_within(self, getattr(layer, name), getattr(ref, name), *TOL[torch.float32],
                                      msg=f"{name}, {msg}")
                y = layer(x)  # and the layer's own activation still, after it
                want = act_ref(ref(x.double()), layer.activation, layer.slope)
                assert_within(self, y, want, *TOL[torch.float32], msg=f"with its activation, {msg}")


class TestSavedTensors(TeamOfOne):
    def test_inplace_saves_the_output_not_the_input(self):
        """inplace=True: autograd keeps y, never x (the memory saving); without it, x and
        (for the mask) y. Through the layer eagerly and through the operator."""
        for through_op in (False, True):
            x = (torch.randn(4, 3, 5, 5) + 1).requires_grad_()
            m = sbt.SyncBatchNorm(3, comm=self.comm, activation="leaky_relu", inplace=True)
            if through_op:
                fn = lambda: _fused.batch_norm_act_train(x, None, m.weight, m.bias, None, None, None, 1e-5, 0.1,  # noqa
                                                         self.comm.id, syncbn.LEAKY_RELU, 0.01, True)[0]
            else:
                fn = lambda: m(x)  # noqa: E731
            saved, y = saved_storages(fn)
            xp, yp = x.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()
            self.assertNotIn(xp, saved, f"in-place saved x (through_op={through_op})")
            self.assertIn(yp, saved)
            y.sum().backward()
            self.assertIsNotNone(x.grad)
        m = sbt.SyncBatchNorm(3, comm=self.comm, activation="leaky_relu")
        x = (torch.randn(4, 3, 5, 5) + 1).requires_grad_()
        saved, y = saved_storages(lambda: m(x))
        self.assertTrue({x.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()} <= saved)

    def test_inplace_with_residual_saves_the_output_and_the_residual(self):
        """inplace=True with a residual: autograd keeps y and the residual, never x; the
        residual's gradient is dy * act'(y), through the layer and through the operator. A
        residual changed in place before the backward is autograd's error, not a wrong
        gradient."""
        for through_op in (False, True):
            x = (torch.randn(4, 3, 5, 5) + 1).requires_grad_()
            z = torch.randn(4, 3, 5, 5).requires_grad_()
            m = sbt.SyncBatchNorm(3, comm=self.comm, activation="leaky_relu", inplace=True)
            if through_op:
                fn = lambda: _fused.batch_norm_act_train(x, z, m.weight, m.bias, None, None, None, 1e-5, 0.1,  # noqa
                                                         self.comm.id, syncbn.LEAKY_RELU, 0.01, True)[0]
            else:
                fn = lambda: m(x, z)  # noqa: E731
            saved, y = saved_storages(fn)
            self.assertNotIn(x.untyped_storage().data_ptr(), saved, f"saved x (through_op={through_op})")
            self.assertIn(y.untyped_storage().data_ptr(), saved)
            self.assertIn(z.untyped_storage().data_ptr(), saved)
            g = torch.randn_like(y)
            y.backward(g)
            torch.testing.assert_close(z.grad, torch.where(y > 0, g, 0.01 * g))
            self.assertIsNotNone(x.grad)
        m = sbt.SyncBatchNorm(3, comm=self.comm, activation="leaky_relu", inplace=True)
        x = (torch.randn(4, 3, 5) + 1).requires_grad_()
        z = torch.randn(4, 3, 5)
        y = m(x, z)
        z.add_(1)
        with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
            y.sum().backward()

    def test_modified_output_is_caught(self):
        """An in-place op on the saved output before the backward: autograd's error, not
        a wrong gradient."""
        m = sbt.SyncBatchNorm(3, comm=self.comm, activation="leaky_relu", inplace=True)
        x = (torch.randn(4, 3, 5) + 1).requires_grad_()
        y = m(x)
        y.mul_(2)
        with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
            y.sum().backward()

    def test_create_graph_leaves_the_incoming_gradient_alone(self):
        """An evaluated identity layer with a residual passes the incoming gradient through
        as the residual's: autograd.grad(create_graph=True) must not give the caller's
        grad_outputs a history (a leaf stays a leaf, and one that requires grad stays
        differentiable)."""
        m = sbt.SyncBatchNorm(3, comm=self.comm).eval()
        for dy_requires_grad in (False, True):
            with self.subTest(dy_requires_grad=dy_requires_grad):
                x = torch.randn(4, 3, 5, 6, requires_grad=True)
                z = torch.randn(4, 3, 5, 6, requires_grad=True)
                dy = torch.randn(4, 3, 5, 6, requires_grad=dy_requires_grad)
                gx, gz = torch.autograd.grad(m(x, z), (x, z), dy, create_graph=True)
                torch.testing.assert_close(gz, dy.detach(), rtol=0, atol=0)
                self.assertTrue(dy.is_leaf)
                self.assertIsNone(dy.grad_fn)
                self.assertEqual(dy.requires_grad, dy_requires_grad)
                if dy_requires_grad:
                    (dy * 2).sum().backward()
                    torch.testing.assert_close(dy.grad, torch.full_like(dy, 2.0), rtol=0, atol=0)


def pre_activation(x, z, w, b, eps=1e-5):
    """v = batch_norm(x) + z in float64 with the batch's statistics (w, b None: 1, 0)."""
    v = F.batch_norm(x.double(), None, None, None if w is None else w.double(), None if b is None else b.double(),
                     True, 0.1, eps)
    return v if z is None else v + z.double()


def poison_sure_signs(y, v, margin=1e-3):
    """Writes over the saved output y, where the sign of v (the forward's pre-activation
    value, float64) is sure by far (|v| > margin: the library's band is ~1e-6 here), a
    value of the other sign (-sign(v)), without autograd seeing it (y.data: no version
    bump). A backward that takes the activation's mask from y then gets it wrong there;
    one that takes it from x (no_residual) reads y only in the band: unchanged. Returns
    the share of y overwritten."""
    sure = v.abs() > margin
    y.data.copy_(torch.where(sure, -v.sign(), y.detach().double()).to(y.dtype))
    return float(sure.double().mean())


class TestMaskFromX(TeamOfOne):
    """A fused ReLU / leaky ReLU layer whose forward had no residual passes no_residual to
    sbnBackwardEx (the mask from x; its bias with it), and one with a residual does not:
    with the saved output's sign flipped wherever the mask from x is sure, the gradients
    of the forward without a residual are bitwise those of the untouched output, and those
    of the forward with one change (the mask from y). Then float64 PyTorch's gradients with
    biases far from 0 (a mask from x without the bias, or a wrong one, is wrong on many
    elements). Through the layer and the operator, on the operators syncbn.torch runs
    (C++ or Python: CI runs this file on both)."""

    def _grads(self, through, act, slope, x, z, w, b, g, poison):
        """x's, z's, the weight's and the bias's gradients (None where absent) of
        sum(g * y) for y the fused forward of (x, z, w, b); the saved y poisoned first
        where `poison` (poison_sure_signs); and the share poisoned."""
        x = x.detach().clone().requires_grad_()
        z = None if z is None else z.detach().clone().requires_grad_()
        w = None if w is None else w.detach().clone().requires_grad_()
        b = None if b is None else b.detach().clone().requires_grad_()
        if through == "layer":
            m = sbt.SyncBatchNorm(x.shape[1], comm=self.comm, activation=act, slope=slope, affine=w is not None,
                                  bias=b is not None or w is None)
            with torch.no_grad():
                if w is not None:
                    m.weight.copy_(w)
                if b is not None:
                    m.bias.copy_(b)
            y = m(x, z)
            w, b = m.weight, m.bias
        else:
            y = _fused.batch_norm_act_train(x, z, w, b, None, None, None, 1e-5, 0.1, self.comm.id,
                                            _fused.ACTIVATIONS[act], slope, False)[0]
        with torch.no_grad():
            share = poison_sure_signs(y, pre_activation(x, z, w, b)) if poison else 0.0
        (y.double() * g).sum().backward()
        return [None if t is None else t.grad for t in (x, z, w, b)], share

    def _inputs(self, cl, affine, bias, residual, seed):
        torch.manual_seed(seed)
        fmt = torch.channels_last if cl else torch.contiguous_format
        x = (torch.randn(4, 5, 3, 4) + 1).contiguous(memory_format=fmt)
        z = torch.randn(4, 5, 3, 4).contiguous(memory_format=fmt) if residual else None
        w = torch.rand(5) + 0.5 if affine else None
        b = torch.rand(5) - 0.5 if affine and bias else None
        return x, z, w, b, torch.randn(4, 5, 3, 4, dtype=torch.float64)

    def test_mask_from_x_without_a_residual(self):
        """No residual: the poisoned output changes no gradient (bitwise), with a bias,
        with a weight and no bias (bias=False: 0), without affine, both layouts."""
        for through in ("layer", "op"):
            for act, slope in (("relu", 0.0), ("leaky_relu", 0.1)):
                for affine, bias in ((True, True), (True, False), (False, False)):
                    for cl in (False, True):
                        msg = f"{through} {act} affine {affine} bias {bias} channels_last {cl}"
                        x, z, w, b, g = self._inputs(cl, affine, bias, False, 31)
                        want, _ = self._grads(through, act, slope, x, z, w, b, g, poison=False)
                        got, share = self._grads(through, act, slope, x, z, w, b, g, poison=True)
                        self.assertGreater(share, 0.99, msg)  # (the band: ~1e-6 here)
                        for i, (a, e) in enumerate(zip(got, want)):
                            if e is None:
                                self.assertIsNone(a, f"{msg}: gradient {i}")
                            else:
                                self.assertTrue(torch.equal(a, e), f"{msg}: gradient {i} differs")

    def test_mask_from_y_with_a_residual(self):
        """A residual: no no_residual, the mask from y: the poisoned output changes dx
        and dz (the control: the poison reaches the backward's y)."""
        for through in ("layer", "op"):
            for act, slope in (("relu", 0.0), ("leaky_relu", 0.1)):
                x, z, w, b, g = self._inputs(False, True, True, True, 32)
                want, _ = self._grads(through, act, slope, x, z, w, b, g, poison=False)
                got, share = self._grads(through, act, slope, x, z, w, b, g, poison=True)
                self.assertGreater(share, 0.99)
                for i in (0, 1):
                    self.assertFalse(torch.equal(got[i], want[i]), f"{through} {act}: gradient {i} unchanged")

    def test_backward_operator_passes_no_residual(self):
        """syncbn::batch_norm_act_backward's no_residual reaches the library: on the
        poisoned output, False (the default) gives the mask from y's gradients (changed),
        True the untouched output's (bitwise); the bias given (None with a weight: 0)."""
        for act, slope in ((syncbn.RELU, 0.0), (syncbn.LEAKY_RELU, 0.1)):
            for bias in (True, False):
                x, _, w, b, _ = self._inputs(False, True, bias, False, 33)
                y, stats = _fused.batch_norm_act_train(x, None, w, b, None, None, None, 1e-5, 0.1, self.comm.id,
                                                       act, slope, False)
                dy = torch.randn_like(y)

                def bwd(out, *no_residual):
                    return _fused.batch_norm_act_backward(dy, x, out, w, b, stats, 1e-5, self.comm.id, act, slope,
                                                          True, False, True, *no_residual)

                want = bwd(y)
                poisoned = y.clone()
                self.assertGreater(poison_sure_signs(poisoned, pre_activation(x, None, w, b)), 0.99)
                msg = f"activation {act} bias {bias}"
                for got in (bwd(poisoned, True), bwd(y, True)):
                    self.assertTrue(torch.equal(got[0], want[0]), f"{msg}: dx")
                    self.assertTrue(torch.equal(got[2], want[2]), f"{msg}: dweight, dbias")
                for got in (bwd(poisoned), bwd(poisoned, False)):
                    self.assertFalse(torch.equal(got[0], want[0]), f"{msg}: dx (the mask from y)")

    def test_gradients_with_biases_far_from_zero(self):
        """Against float64 PyTorch act(batch_norm(x) + z) (test_torch.py's tolerances) with
        biases of +-1 to 2 and data off 0 (3 + N(0, 0.1)): the mask from x sums the bias in
        (without it, or with another, a share of the elements takes the other branch);
        with a residual, the mask from y and dz as before."""
        c = 4
        for act, slope in (("relu", 0.0), ("leaky_relu", 0.1)):
            for residual in (False, True):
                for bias in (True, False):
                    msg = f"{act} residual {residual} bias {bias}"
                    torch.manual_seed(34)
                    x = (3 + 0.1 * torch.randn(6, c, 5, 5, dtype=torch.float64)).float()
                    z = torch.randn(6, c, 5, 5) if residual else None
                    w = torch.tensor([0.7, 1.3, 1.0, 0.9])
                    b = torch.tensor([2.0, -2.0, 1.5, -1.0]) if bias else None
                    g = torch.randn(6, c, 5, 5, dtype=torch.float64)
                    for through in ("layer", "op"):
                        got, _ = self._grads(through, act, slope, x, z, w, b, g, poison=False)
                        X, W = x.double().requires_grad_(), w.double().requires_grad_()
                        Z = None if z is None else z.double().requires_grad_()
                        B = None if b is None else b.double().requires_grad_()
                        Y = act_ref(pre_activation(X, Z, W, B), act, slope)
                        (Y * g).sum().backward()
                        for i, (a, e, tol) in enumerate(zip(got, (X, Z, W, B), (TOL, TOL, PTOL, PTOL))):
                            if e is None:
                                continue
                            self.assertIsNotNone(a, f"{through} {msg}: gradient {i}")
                            assert_within(self, a, e.grad, *tol[torch.float32], msg=f"{through} {msg}: gradient {i}")


class TestMemoryMeasure(TeamOfOne):
    """bench/torch_fused_memory.py's CPU measure of a training step's activation memory:
    the peak of the CPU allocator's running total in torch.profiler's allocation records,
    over what was allocated before."""

    def test_peak_of_a_running_total(self):
        recs = [(3, -100, 50), (1, 100, 100), (2, 50, 150), (5, -250, 0), (4, 200, 250)]
        self.assertEqual(torch_fused_memory.peak_of(recs), 250)  # in time order, not list order
        self.assertEqual(torch_fused_memory.peak_of([(t, b, tot + 1000) for t, b, tot in recs]), 250)
        self.assertEqual(torch_fused_memory.peak_of([(1, -8, 992), (2, 4, 996)]), 0)
        self.assertEqual(torch_fused_memory.peak_of([]), 0)

    @unittest.skipIf(torch.cuda.is_available(), "a CUDA device is here: --device cuda measures")
    def test_cuda_without_a_device_skips(self):
        """--device cuda where PyTorch sees no CUDA device: exit 77 (a skip, as the other
        bench scripts'), with a line that says why, not a traceback from torch.cuda."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = torch_fused_memory.main(["--device", "cuda"])
        self.assertEqual(rc, 77)
        self.assertIn("torch_fused_memory: SKIP: no CUDA device", out.getvalue())

    def test_peak_where(self):
        """The node around the peak, the innermost of nested ones, and what was held when it
        began; a peak outside every node: no node, and what was held just before it."""
        nodes = [(10, 20, "A"), (30, 40, "B"), (32, 38, "C")]
        recs = [(5, 100, 1100), (12, 50, 1150), (15, -50, 1100), (31, 200, 1300), (33, 300, 1600),
                (34, 0, 1600), (36, -300, 1300), (45, -300, 1000)]
        self.assertEqual(torch_fused_memory.peak_where(recs[::-1], nodes), (600, "C", 300))
        recs = [(5, 100, 1100), (6, 700, 1800), (12, 50, 1150), (33, 300, 1600)]
        self.assertEqual(torch_fused_memory.peak_where(recs, nodes), (800, None, 100))
        self.assertEqual(torch_fused_memory.peak_where([], nodes), (0, None, 0))

    def test_peak_node_of_a_step(self):
        """On the small stack in place, the peak of a profiled step falls in an autograd node
        of the backward (a convolution's, as the report finds at its size), peak_of's peak of
        the same records (one step: two steps may free across threads in another order), and
        the node began with less than the peak."""
        x = torch.randn(1, 3, 32, 32)
        torch.manual_seed(0)
        model = sbt.convert_fused(torch_fused_memory.deeplab_like(8), comm=self.comm, inplace=True).train()
        records, nodes = torch_fused_memory.profiled_step(model, x, "cpu")
        peak, node, held = torch_fused_memory.peak_where(records, nodes)
        self.assertEqual(node, "ConvolutionBackward0")
        self.assertEqual(peak, torch_fused_memory.peak_of(records))
        self.assertLess(0, held)
        self.assertLess(held, peak)

    def test_records_see_known_allocations(self):
        """1 MiB and 2 MiB held together, then 0.5 MiB after the first is freed: a peak of
        3 MiB (and at most the allocator's rounding above it)."""
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            a = torch.empty(1 << 20, dtype=torch.uint8)
            b = torch.empty(2 << 20, dtype=torch.uint8)
            del a
            c = torch.empty(1 << 19, dtype=torch.uint8)
            del b, c
        peak = torch_fused_memory.peak_of(torch_fused_memory.allocation_records(prof))
        self.assertGreaterEqual(peak, 3 << 20)
        self.assertLess(peak, (3 << 20) + (64 << 10))

    def test_in_place_lowers_the_step_peak(self):
        """The stack of the report, small: the in-place layers keep y, not x, so both the
        saved bytes and the step's peak fall, and the peak holds at least the saved bytes.
        With relu_as_leaky the blocks' layers go in place too (those with the residual where
        the block has no downsample): the saved bytes fall by exactly those layers' x (y is
        the next convolution's input, or the next block's, kept anyway, and the residual
        the block's input, which its first convolution keeps), and the peak falls."""
        x = torch.randn(1, 3, 32, 32)
        got, models = {}, {}
        for kind, kw in (("fused", {}), ("in place", {"inplace": True}),
                         ("leaky in place", {"inplace": True, "relu_as_leaky": 0.01})):
            torch.manual_seed(0)
            model = sbt.convert_fused(torch_fused_memory.deeplab_like(8), comm=self.comm, **kw).train()
            got[kind] = (torch_fused_memory.cpu_step_bytes(model, x), torch_fused_memory.saved_bytes(model, x))
            models[kind] = model
        (peak0, saved0), (peak1, saved1), (peak2, saved2) = got["fused"], got["in place"], got["leaky in place"]
        self.assertLess(saved1, saved0)
        self.assertLess(peak1, peak0)
        self.assertGreaterEqual(peak0, saved0)
        self.assertGreaterEqual(peak1, saved1)
        # the layers relu_as_leaky put in place, and the bytes of their inputs
        was = {n for n, m in models["in place"].named_modules() if isinstance(m, sbt.SyncBatchNorm) and m.inplace}
        new = [m for n, m in models["leaky in place"].named_modules()
               if isinstance(m, sbt.SyncBatchNorm) and m.inplace and n not in was]
        # the two BasicBlocks' bn1, the Bottleneck's bn1 and bn2, and the last layer (it takes
        # the residual) of the blocks without a downsample, the first BasicBlock's bn2 and the
        # Bottleneck's bn3: their residual is the block's input, which conv1 keeps anyway
        self.assertEqual(len(new), 6)
        x_bytes = []
        hooks = [m.register_forward_pre_hook(lambda m, a: x_bytes.append(a[0].nbytes)) for m in new]
        with torch.no_grad():
            copy.deepcopy(models["leaky in place"])(x)
        for h in hooks:
            h.remove()
        self.assertEqual(len(x_bytes), len(new))
        self.assertEqual(saved1 - saved2, sum(x_bytes))
        self.assertLess(peak2, peak1)
        self.assertGreaterEqual(peak2, saved2)


class TestRefusals(TeamOfOne):
    def test_inplace_relu_refused_at_construction(self):
        with self.assertRaisesRegex(ValueError, "ReLU is not invertible"):
            sbt.SyncBatchNorm(3, activation="relu", inplace=True)
        with self.assertRaisesRegex(ValueError, "slope 0"):
            sbt.SyncBatchNorm(3, activation="leaky_relu", slope=0.0, inplace=True)
        with self.assertRaisesRegex(ValueError, "activation 'gelu'"):
            sbt.SyncBatchNorm(3, activation="gelu")
        with self.assertRaisesRegex(ValueError, "slope -1"):
            sbt.SyncBatchNorm(3, activation="leaky_relu", slope=-1)

    def test_arguments_of_another_type_named(self):
        """The layer's activation, slope and inplace, and the C ops' activation and slope,
        each refused by name where it is not what it says: float() would take the string
        "0.1" and True as slopes, and bool() "no" as inplace=True."""
        for kw, err in (({"slope": "0.1"}, "slope must be a real number, got str"),
                        ({"slope": True}, "slope must be a real number, got bool"),
                        ({"slope": None}, "slope must be a real number, got NoneType"),
                        ({"inplace": "no"}, "inplace must be True or False, got 'no'"),
                        ({"inplace": None}, "inplace must be True or False, got None"),
                        ({"inplace": 2}, "inplace must be True or False, got 2")):
            with self.assertRaisesRegex(TypeError, "syncbn.torch.SyncBatchNorm: " + err):
                sbt.SyncBatchNorm(3, activation="leaky_relu", **kw)
        for s in (torch.tensor([0.1, 0.2]), 10**400):  # no single float: named too
            with self.assertRaisesRegex(ValueError, "syncbn.torch.SyncBatchNorm: slope must be one real number"):
                sbt.SyncBatchNorm(3, activation="leaky_relu", slope=s)
        # convert_fused's inplace: judged by name before anything changes (the model's batch
        # norm stays itself); a falsy or truthy flag of another type is refused, not read
        seq = nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3), nn.LeakyReLU(0.1), nn.Conv2d(3, 3, 1))
        for bad in (None, "no", 0.0):
            with self.assertRaisesRegex(TypeError, "syncbn.torch.convert_fused: inplace must be True or False"):
                sbt.convert_fused(seq, comm=self.comm, inplace=bad)
            self.assertIs(type(seq[1]), nn.BatchNorm2d)
        with self.assertRaisesRegex(ValueError, r"activation \['relu'\]: one of"):
            sbt.SyncBatchNorm(3, activation=["relu"])
        # what is a slope: any real number, NumPy's and a 0-d tensor too; 0 and 1 for inplace
        import numpy as np

        for s in (np.float32(0.5), torch.tensor(0.5), 1):
            self.assertEqual(sbt.SyncBatchNorm(3, activation="leaky_relu", slope=s).slope, float(s))
        for flag in (1, np.True_, torch.tensor(True)):
            self.assertIs(sbt.SyncBatchNorm(3, activation="leaky_relu", inplace=flag).inplace, True)
        for flag, want in ((np.False_, False), (np.True_, True), (0, False)):
            conv = sbt.convert_fused(copy.deepcopy(seq), comm=self.comm, inplace=flag)
            self.assertEqual(fused_layers(conv), [("1", "leaky_relu", want)])
        d = syncbn.desc(syncbn.FLOAT32, syncbn.NCHW, 2, 3, 4)
        x = np.random.default_rng(0).standard_normal((2, 3, 4), dtype=np.float32)
        y, m, s = np.zeros_like(x), np.zeros(3, np.float32), np.zeros(3, np.float32)
        for kw, err in (({"activation": syncbn.LEAKY_RELU, "slope": None}, "slope must be a real number, got NoneType"),
                        ({"activation": syncbn.LEAKY_RELU, "slope": "0.1"}, "slope must be a real number, got str"),
                        ({"activation": True}, "activation must be IDENTITY, RELU or LEAKY_RELU, got a bool")):
            with self.assertRaisesRegex(TypeError, "syncbn: " + err):
                self.comm.forward_train(d, x, y, save_mean=m, save_invstd=s, **kw)
            self.assertFalse(y.any() or m.any() or s.any())  # nothing written

    def test_inplace_set_as_an_attribute(self):
        """``if hasattr(m, "inplace"): m.inplace = False``, which code written for PyTorch's
        modules runs over a model to turn in-place ops off (YOLOv5's advice for tracing,
        Grad-CAM and Opacus helpers), switches a fused layer's in-place mode as
        set_activation does, its activation and slope kept; the backward then saves x again
        and gives the same gradients. ReLU in place is refused as at construction, the layer
        unchanged; inplace_abn's layers keep their activation_param."""
        torch.manual_seed(31)
        seq = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.LeakyReLU(0.2), nn.Conv2d(4, 4, 1),
                            nn.BatchNorm2d(4), nn.ReLU())
        model = sbt.convert_fused(seq, comm=self.comm, inplace=True)
        self.assertEqual(fused_layers(model), [("1", "leaky_relu", True), ("4", "relu", False)])
        slope = model[1].slope
        x = torch.randn(2, 3, 5, 5)
        model(x).square().sum().backward()
        want = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        for m in model.modules():
            if hasattr(m, "inplace"):
                m.inplace = False
        self.assertEqual(fused_layers(model), [("1", "leaky_relu", False), ("4", "relu", False)])
        self.assertEqual(model[1].slope, slope)
        model(x).square().sum().backward()
        for g, w in zip((p.grad for p in model.parameters()), want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        model[1].inplace = True
        self.assertEqual(fused_layers(model), [("1", "leaky_relu", True), ("4", "relu", False)])
        with self.assertRaisesRegex(ValueError, "ReLU is not invertible"):
            model[4].inplace = True
        self.assertEqual(fused_layers(model), [("1", "leaky_relu", True), ("4", "relu", False)])
        with self.assertRaisesRegex(TypeError, "inplace must be True or False, got 'no'"):
            model[1].inplace = "no"
        abn = sbt.InPlaceABNSync(4, activation="leaky_relu", activation_param=0.3, comm=self.comm)
        self.assertTrue(abn.inplace)
        abn.inplace = False
        self.assertEqual((abn.activation, abn.activation_param, abn.inplace), ("leaky_relu", 0.3, False))
        elu = sbt.ABNSync(4, activation="elu", activation_param=0.5, comm=self.comm)
        elu.inplace = False
        with self.assertRaisesRegex(ValueError, "not elu"):
            elu.inplace = True
        self.assertEqual((elu.activation, elu.activation_param, elu.inplace), ("elu", 0.5, False))

    def test_slope_judged_as_the_float32_the_library_takes(self):
        """A slope that is 0 as a float32 is ReLU for the in-place mode (refused at
        construction, not by the library at the first backward); one beyond float32's
        range is not finite there. The layer's check and the operators' (either kind)."""
        with self.assertRaisesRegex(ValueError, "slope 0"):
            sbt.SyncBatchNorm(3, activation="leaky_relu", slope=1e-320, inplace=True)
        with self.assertRaisesRegex(ValueError, r"slope 1e\+39: .* finite and >= 0 \(as a float32\)"):
            sbt.SyncBatchNorm(3, activation="leaky_relu", slope=1e39)
        x = torch.randn(2, 3, 4)
        with self.assertRaisesRegex(ValueError, "slope 0"):
            _fused.batch_norm_act_train(x, None, None, None, None, None, None, 1e-5, 0.1, self.comm.id,
                                        syncbn.LEAKY_RELU, 1e-320, True)
        with self.assertRaisesRegex(ValueError, r"slope 1e\+39"):
            _fused.batch_norm_act_infer(x, None, torch.zeros(3), torch.ones(3), None, None, 1e-5,
                                        syncbn.LEAKY_RELU, 1e39)
        # a subnormal float32 (> 0, but 1 / slope overflows): the in-place backward's NaN. Where
        # the process flushes subnormals to 0 (code built with -ffast-math sets the CPU's FTZ
        # mode when it loads: PyTorch 2.4's inductor CPU kernels, after a torch.compile), the
        # float32 of 1e-39 is 0, and so is the library's slope: ReLU, refused as such
        import ctypes

        sub = ("slope 1e-39: below float32's smallest normal number" if ctypes.c_float(1e-39).value != 0.0
               else "slope 0")
        with self.assertRaisesRegex(ValueError, sub):
            sbt.SyncBatchNorm(3, activation="leaky_relu", slope=1e-39, inplace=True)
        with self.assertRaisesRegex(ValueError, sub):
            _fused.batch_norm_act_train(x, None, None, None, None, None, None, 1e-5, 0.1, self.comm.id,
                                        syncbn.LEAKY_RELU, 1e-39, True)
        sbt.SyncBatchNorm(3, comm=self.comm, activation="leaky_relu", slope=1e-39)(x)  # x-based: runs
        m = sbt.SyncBatchNorm(3, comm=self.comm, activation="leaky_relu", slope=1e-30, inplace=True)
        m(torch.randn(2, 3, 4) + 1).sum().backward()  # 1e-30 is a float32 > 0: invertible, runs

    def test_backward_residual_refusals(self):
        """The backward operator takes a residual for the in-place backward only (input
        None): with the input it is refused, as are one of another shape and one with
        no_residual True (the C++ and Python kernels alike, the fake one too); ReLU in place
        is refused with or without one."""
        x = torch.randn(2, 3, 4)
        st = torch.zeros(2, 3)
        with self.assertRaisesRegex(RuntimeError, "a residual is read by the in-place backward only"):
            _fused.batch_norm_act_backward(x, x, x, None, None, st, 1e-5, self.comm.id, syncbn.LEAKY_RELU, 0.01,
                                           True, False, False, False, x)
        with self.assertRaisesRegex(RuntimeError, r"residual has shape \(2, 3, 5\) and the out \(2, 3, 4\)"):
            _fused.batch_norm_act_backward(x, None, x, None, None, st, 1e-5, self.comm.id, syncbn.LEAKY_RELU, 0.01,
                                           True, False, False, False, torch.randn(2, 3, 5))
        with self.assertRaisesRegex(RuntimeError, "no_residual is True and a residual is given"):
            _fused.batch_norm_act_backward(x, None, x, None, None, st, 1e-5, self.comm.id, syncbn.LEAKY_RELU, 0.01,
                                           True, False, False, True, x)
        for z in (None, x):
            with self.assertRaisesRegex(ValueError, "ReLU is not invertible"):
                _fused.batch_norm_act_backward(x, None, x, None, None, st, 1e-5, self.comm.id, syncbn.RELU, 0.01,
                                               True, False, False, False, z)

    def test_residual_refused_alike_in_eval_without_running_stats(self):
        """Eval without running statistics is PyTorch's batch norm, but its residual is
        refused as the operators refuse it (here, a broadcast shape)."""
        m = sbt.SyncBatchNorm(3, comm=self.comm, activation="relu", track_running_stats=False)
        x = torch.randn(2, 3, 4, 4)
        for mode in (m.train, m.eval):
            mode()
            with self.assertRaisesRegex(RuntimeError, r"residual has shape \(1, 3, 1, 1\)"):
                m(x, torch.randn(1, 3, 1, 1))

    def test_bad_residual_named(self):
        m = sbt.SyncBatchNorm(3, comm=self.comm, activation="relu")
        x = torch.randn(2, 3, 4, 4)
        before = m.running_mean.clone()
        for z, err, pattern in (
                (torch.randn(2, 3, 4, 5), RuntimeError, r"residual has shape \(2, 3, 4, 5\) and the input"),
                (torch.randn(2, 3, 4, 4, dtype=torch.float16), TypeError, "residual is torch.float16"),
                (torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last), RuntimeError,
                 r"residual's memory format \(channels_last\) differs"),
                (torch.randn(2, 3, 4, 8)[..., ::2], RuntimeError, "residual's memory format .strided")):
            for training in (True, False):
                m.train(training)
                with self.subTest(z=tuple(z.shape), dtype=z.dtype, training=training):
                    with self.assertRaisesRegex(err, pattern):
                        m(x, z)
        with self.assertRaisesRegex(RuntimeError, r"memory format \(contiguous\) differs"):
            m.train()
            m(x.contiguous(memory_format=torch.channels_last), torch.randn(2, 3, 4, 4))
        torch.testing.assert_close(m.running_mean, before, rtol=0, atol=0)  # a refused call wrote nothing

    def test_residual_on_meta_device_named(self):
        m = sbt.SyncBatchNorm(3, comm=self.comm)
        with self.assertRaisesRegex(RuntimeError, "residual is on meta"):
            m(torch.randn(2, 3, 4), torch.empty(2, 3, 4, device="meta"))


class TestOps(TeamOfOne):
    def _args(self, dtype, cl, affine, running, residual, requires_grad=True):
        torch.manual_seed(0)
        fmt = torch.channels_last if cl else torch.contiguous_format
        x = (torch.randn(3, 4, 5, 5) + 1).to(dtype).contiguous(memory_format=fmt).requires_grad_(requires_grad)
        z = torch.randn(3, 4, 5, 5).to(dtype).contiguous(memory_format=fmt).requires_grad_(requires_grad) \
            if residual else None
        w = (torch.rand(4) + 0.5).requires_grad_(requires_grad) if affine else None
        b = (torch.rand(4) - 0.5).requires_grad_(requires_grad) if affine else None
        rm, rv = (torch.zeros(4), torch.ones(4)) if running else (None, None)
        nbt = torch.zeros((), dtype=torch.int64) if running else None
        return x, z, w, b, rm, rv, nbt

    def _cases(self):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for cl in (False, True):
                for affine in (False, True):
                    yield dtype, cl, affine

    def test_opcheck_train(self):
        for dtype, cl, affine in self._cases():
            for act, residual, inplace in ((syncbn.RELU, True, False), (syncbn.LEAKY_RELU, False, True),
                                           (syncbn.IDENTITY, True, False), (syncbn.LEAKY_RELU, True, True)):
                with self.subTest(dtype=dtype, cl=cl, affine=affine, act=act, inplace=inplace):
                    args = self._args(dtype, cl, affine, affine, residual)
                    momentum = None if affine and cl else 0.1
                    torch.library.opcheck(_fused.batch_norm_act_train,
                                          (*args, 1e-5, momentum, self.comm.id, act, 0.1, inplace))

    def test_opcheck_backward(self):
        """With a residual (no_residual by default), in place, without a residual
        (no_residual True: the mask from x, the bias read), and in place with a residual
        (the residual passed: sbnBackwardInPlaceEx)."""
        for dtype, cl, affine in self._cases():
            for inplace, residual, more in ((False, True, ()), (True, False, ()), (False, False, (True,)),
                                            (True, True, (False, "z"))):
                with self.subTest(dtype=dtype, cl=cl, affine=affine, inplace=inplace, residual=residual):
                    x, z, w, b, _, _, _ = self._args(dtype, cl, affine, False, residual, requires_grad=False)
                    y, stats = _fused.batch_norm_act_train(x, z, w, b, None, None, None, 1e-5, 0.1, self.comm.id,
                                                           syncbn.LEAKY_RELU, 0.1, inplace)
                    dy = torch.randn_like(y)
                    more = tuple(z if m == "z" else m for m in more)  # in place with a residual: the residual
                    torch.library.opcheck(_fused.batch_norm_act_backward,
                                          (dy, None if inplace else x, y, w, b, stats, 1e-5, self.comm.id,
                                           syncbn.LEAKY_RELU, 0.1, True, residual, affine, *more))

    def test_opcheck_infer(self):
        for dtype, cl, affine in self._cases():
            with self.subTest(dtype=dtype, cl=cl, affine=affine):
                x, z, w, b, _, _, _ = self._args(dtype, cl, affine, False, True)
                rm, rv = torch.randn(4), torch.rand(4) + 0.5
                torch.library.opcheck(_fused.batch_norm_act_infer, (x, z, rm, rv, w, b, 1e-5, syncbn.RELU, 0.01))


def fused_mutant_ops(ns, drop, comm, *more_comms):
    """(keep, train, backward, infer): the fused operators in namespace ns without `drop`
    (test_torch_ops.MUTANT_DEFINES' keys; the Python ones: "fake" or "autograd"), of the
    kind syncbn.torch runs on: test_torch_ops's C++ mutant library (built with the plain
    and the fused operators) or Python ones."""
    keep, *_ = mutant_ops(ns, drop, comm, *more_comms)
    if _ops.NATIVE is None:
        return (keep, *_fused.register(keep, drop=(drop,)))
    return (keep, *_fused.native_ops(ns, keep[1], fake=drop != "fake"))


def fused_gradients_match(test, comm, train):
    """x, residual, weight and bias gradients of sum(g * train(...).out), ReLU, against
    float64 autograd of relu(batch_norm(x) + z) (fp32: 1e-4, as the plain operators')."""
    torch.manual_seed(0)
    x = (torch.randn(3, 4, 5, 5) + 1).requires_grad_()
    z = torch.randn(3, 4, 5, 5).requires_grad_()
    w = (torch.rand(4) + 0.5).requires_grad_()
    b = (torch.rand(4) - 0.5).requires_grad_()
    g = torch.randn(3, 4, 5, 5)
    y, _ = train(x, z, w, b, None, None, None, 1e-5, 0.1, comm.id, syncbn.RELU, 0.0, False)
    (y * g).sum().backward()
    X, Z, W, B = (t.detach().double().requires_grad_() for t in (x, z, w, b))
    Y = F.relu(F.batch_norm(X, None, None, W, B, True, 0.1, 1e-5) + Z)
    (Y * g.double()).sum().backward()
    for got, want, name in ((x.grad, X.grad, "x"), (z.grad, Z.grad, "residual"), (w.grad, W.grad, "weight"),
                            (b.grad, B.grad, "bias")):
        test.assertIsNotNone(got, name)
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4, msg=name)


class TestMutants(TeamOfOne):
    """Each registration of the fused operators matters (on the kind syncbn.torch runs:
    C++ or Python): without the fake kernel opcheck and torch.compile fail, without the
    Autograd kernel the gradients are missing. (That the C++ ones are what is loaded:
    test_native.py.)"""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.nofake = fused_mutant_ops("syncbn_mutant_nofake", "fake", cls.comm)
        cls.noautograd = fused_mutant_ops("syncbn_mutant_noautograd", "autograd", cls.comm)

    def _train_args(self):
        torch.manual_seed(0)
        x = (torch.randn(3, 4, 5, 5) + 1).requires_grad_()
        z = torch.randn(3, 4, 5, 5).requires_grad_()
        w, b = (torch.rand(4) + 0.5).requires_grad_(), torch.rand(4).requires_grad_()
        return (x, z, w, b, torch.zeros(4), torch.ones(4), torch.zeros((), dtype=torch.int64), 1e-5, 0.1,
                self.comm.id, syncbn.RELU, 0.0, False)

    def test_the_real_operators_pass(self):
        """The control: what fails on the mutants passes on syncbn's operators."""
        fused_gradients_match(self, self.comm, _fused.batch_norm_act_train)
        torch.library.opcheck(_fused.batch_norm_act_train, self._train_args())
        torch._dynamo.reset()
        f = torch.compile(lambda *a: _fused.batch_norm_act_train(*a)[0], fullgraph=True)
        f(*self._train_args()).sum().backward()

    def test_without_fake_kernel(self):
        _, train, _, _ = self.nofake
        with self.assertRaisesRegex(Exception, "test_faketensor"):  # opcheck names the failed test
            torch.library.opcheck(train, self._train_args())
        torch._dynamo.reset()
        with self.assertRaisesRegex(Exception, "(?i)fake|meta"):  # dynamo: no fake/meta kernel
            torch.compile(lambda *a: train(*a)[0], fullgraph=True)(*self._train_args())

    def test_without_autograd_kernel(self):
        _, train, _, _ = self.noautograd
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with self.assertRaisesRegex(Exception, "does not require grad|unexpectedly None"):
                fused_gradients_match(self, self.comm, train)  # no grad_fn, or None gradients


# ---- models: torchvision's blocks as torchvision writes them (torchvision is not needed) --
def conv3x3(i, o, stride=1):
    return nn.Conv2d(i, o, 3, stride, 1, bias=False)


class BasicBlock(nn.Module):
    expansion: int = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        out = self.relu(out)

        return out


class Bottleneck(nn.Module):
    expansion: int = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)

        out = self.conv3(out)
        out = self.bn3(out)

        if self.downsample is not None:
            identity = self.downsample(x)

        out += identity
        out = self.relu(out)

        return out


class PreActBlock(BasicBlock):
    """BasicBlock's children, another forward (bn after the add): not to be fused."""

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.conv2(out) + x
        return self.relu(self.bn2(out))


class Tap(nn.Module):
    """A module whose forward uses its batch norm's output twice (through the ReLU, and
    as it is): conv, bn, relu children, but no Sequential and no known block."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()

    def forward(self, x):
        y = self.bn(self.conv(x))
        return self.relu(y) + y


class Calls(nn.Module):
    """A wrapper that calls the module it holds (torch's checkpoint_wrapper, FSDP's)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


class Checkpointed(nn.Module):
    """A module run under activation checkpointing (torch.utils.checkpoint: its forward
    again in the backward, its activations not kept), reentrant or not."""

    def __init__(self, module, reentrant):
        super().__init__()
        self.module, self.reentrant = module, reentrant

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.module, x, use_reentrant=self.reentrant)


def replica(module):
    """A replica of module as torch.nn.parallel.replicate makes one for nn.DataParallel (on
    one device: the same parameters and buffers): each module's
    _replicate_for_data_parallel, its children replicas."""
    out = module._replicate_for_data_parallel()
    out._parameters = dict(module._parameters)
    out._buffers = dict(module._buffers)
    out._modules = {k: None if c is None else replica(c) for k, c in module._modules.items()}
    return out


class Uncopyable(nn.Module):
    """A module that deepcopy and pickle refuse (it holds a lock)."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()

    def forward(self, x):
        return x


def ds(i, o, stride):
    return nn.Sequential(nn.Conv2d(i, o, 1, stride, bias=False), nn.BatchNorm2d(o))


class ResNet(nn.Module):
    """torchvision's ResNet, small: its children and its forward as torchvision writes them."""

    def __init__(self, num_classes=3):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = nn.Sequential(BasicBlock(8, 8))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, 2, ds(8, 16, 2)))
        self.layer3 = nn.Sequential(BasicBlock(16, 16))
        self.layer4 = nn.Sequential(Bottleneck(16, 4))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, num_classes)

    def _forward_impl(self, x):
        # See note [TorchScript super()]
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)

        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)

        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)

        return x

    def forward(self, x):
        return self._forward_impl(x)


class IntermediateLayerGetter(nn.ModuleDict):
    """torchvision's backbone wrapper (models/_utils.py): a model's children up to the last
    one returned, run in order, those in return_layers given out in a dict."""

    def __init__(self, model, return_layers):
        layers = OrderedDict()
        left = dict(return_layers)
        for name, module in model.named_children():
            layers[name] = module
            left.pop(name, None)
            if not left:
                break
        super().__init__(layers)
        self.return_layers = dict(return_layers)

    def forward(self, x):
        out = OrderedDict()
        for name, module in self.items():
            x = module(x)
            if name in self.return_layers:
                out_name = self.return_layers[name]
                out[out_name] = x
        return out


def resnet_like():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        BasicBlock(8, 8), BasicBlock(8, 16, 2, ds(8, 16, 2)),
        Bottleneck(16, 4), Bottleneck(16, 8, 1, ds(16, 32, 1)),
        nn.Conv2d(32, 8, 1), nn.BatchNorm2d(8), nn.LeakyReLU(0.1), nn.Dropout(0.0),
        nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.Dropout(0.0), nn.ReLU(),  # ReLU not right after: left
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))


def randomize_bn(model):
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.3, 0.3)


def layer_nodes(gm):
    """The batch norm layers a torch.fx traced module calls, in the graph's order, as
    (target, form, number of arguments): form "module" for a call_module node, "call" for
    a call of the layer (call_method __call__ on a get_attr of it), which _fx_leaf records
    for a layer that does more than a batch norm of its input."""
    def norm(target):
        return isinstance(gm.get_submodule(target), nn.modules.batchnorm._BatchNorm)

    out = []
    for n in gm.graph.nodes:
        if n.op == "call_module" and norm(n.target):
            out.append((n.target, "module", len(n.args)))
        elif (n.op == "call_method" and n.target == "__call__" and n.args[0].op == "get_attr"
              and norm(n.args[0].target)):
            out.append((n.args[0].target, "call", len(n.args) - 1))
    return out


def fused_layers(model):
    return [(n, m.activation, m.inplace) for n, m in model.named_modules()
            if isinstance(m, sbt.SyncBatchNorm) and (m.activation != "identity" or m.inplace)]


class TestConvert(TeamOfOne):
    def _matches(self, model, x, converted, steps=2):
        """converted (a convert_fused copy of model, on self.comm) gives the float64
        original's outputs, gradients and buffers, training and eval."""
        converted_matches(self, model, x, converted, steps)

    def test_is_an_nn_syncbatchnorm_and_reverts(self):
        """Every layer is an nn.SyncBatchNorm, as frameworks look for one (detectron2's norm
        parameter groups, mmengine's revert_sync_batchnorm). revert_sync_batchnorm gives
        the original model on PyTorch's batch norm: the same module names and classes
        (torchvision's blocks, nn.ReLU / nn.LeakyReLU where they were, nn.BatchNorm2d for the
        batch norms, all plain); no syncbn operator in its exported graph, its parameters
        the same tensors; eval equal to the converted model's, training equal to the float64
        original's with each batch's own statistics. A layer reverted alone, outside what
        convert_fused made, keeps its activation as an epilogue. An evaluated converted
        model exports to ONNX as it is (PyTorch's batch norm in the export:
        nn.SyncBatchNorm's path). Like the converters, the revert changes the module's
        containers in place (a copy is reverted here)."""
        torch.manual_seed(5)
        model = resnet_like()
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        layers = [m for m in conv.modules() if isinstance(m, sbt.SyncBatchNorm)]
        self.assertTrue(layers and all(isinstance(m, nn.SyncBatchNorm) for m in layers))
        x = torch.randn(2, 3, 8, 8)
        conv(x).sum().backward()  # trains once: running statistics moved
        back = sbt.revert_sync_batchnorm(copy.deepcopy(conv))
        self.assertFalse(any(isinstance(m, sbt.SyncBatchNorm) for m in back.modules()))
        self.assertEqual(list(back.state_dict().keys()), list(model.state_dict().keys()))
        bns = [m for m in back.modules() if isinstance(m, nn.BatchNorm2d)]
        self.assertEqual(len(bns), len(layers))
        for (n, a), (n2, b) in zip(model.named_modules(), back.named_modules()):
            self.assertEqual(n, n2)
            self.assertIs(type(b), type(a), n)  # nn.BatchNorm2d too, not a BatchNormXd
            self.assertEqual(b.training, a.training, n)
        self.assertEqual(back[9].negative_slope, 0.1)
        for k, v in conv.state_dict().items():
            self.assertTrue(torch.equal(back.state_dict()[k], v), k)
        one = sbt.revert_sync_batchnorm(layers[0])  # a layer itself: its tensors, shared
        self.assertTrue(one.weight is layers[0].weight and one.running_mean is layers[0].running_mean)
        self.assertEqual(one.activation, "relu")  # no FusedActivation next to it: the epilogue stays
        twice = sbt.revert_sync_batchnorm(nn.Sequential(layers[1], nn.Conv2d(8, 8, 1), layers[1]))
        self.assertIs(twice[0], twice[2])  # one layer in two places: one batch norm
        back.eval()
        conv.eval()
        torch.testing.assert_close(back(x), conv(x), rtol=1e-5, atol=1e-5)
        graph = str(torch.export.export(back, (x,)).graph)
        self.assertNotIn("syncbn", graph)
        self.assertIn("batch_norm", graph)
        # training mode: each batch's own statistics (not synchronized), as the original
        back.train()
        ref = copy.deepcopy(model).double().train()
        ref.load_state_dict({k: v.double() if v.is_floating_point() else v for k, v in back.state_dict().items()})
        torch.testing.assert_close(back(x).double(), ref(x.double()), rtol=1e-4, atol=1e-4)
        # the evaluated converted model to ONNX (PyTorch's TorchScript-based exporter): its
        # operators convert (without the onnx package the export then stops for want of it)
        import io
        try:
            torch.onnx.export(conv, (x,), io.BytesIO(), dynamo=False)
        except Exception as e:  # noqa: BLE001: only the missing package is expected
            self.assertIn("onnx is not installed", str(e))

    def test_resnet_like_fused_and_equal(self):
        torch.manual_seed(0)
        model = resnet_like()
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        self.assertEqual(list(conv.state_dict().keys()), list(model.state_dict().keys()))
        self.assertIsInstance(conv[3], sbt.FusedBasicBlock)
        self.assertIsInstance(conv[4], sbt.FusedBasicBlock)
        self.assertIsInstance(conv[5], sbt.FusedBottleneck)
        self.assertIsInstance(conv[6], sbt.FusedBottleneck)
        self.assertIs(conv[4].block_type, BasicBlock)
        self.assertEqual(conv[4].stride, 2)
        # the block class's attributes, as on the block (torchvision's ResNet reads
        # block.expansion; a fused block had none: AttributeError)
        self.assertEqual((conv[3].expansion, conv[5].expansion), (1, 4))
        with self.assertRaises(AttributeError):
            conv[3].not_an_attribute
        self.assertIsInstance(conv[2], nn.Identity)
        self.assertIsInstance(conv[9], nn.Identity)
        self.assertIsInstance(conv[14], nn.ReLU)  # not right after its batch norm: kept
        acts = dict((n, a) for n, a, _ in fused_layers(conv))
        self.assertEqual(acts, {"1": "relu", "3.bn1": "relu", "3.bn2": "relu", "4.bn1": "relu", "4.bn2": "relu",
                                "5.bn1": "relu", "5.bn2": "relu", "5.bn3": "relu", "6.bn1": "relu",
                                "6.bn2": "relu", "6.bn3": "relu", "8": "leaky_relu"})
        self.assertEqual(conv[8].slope, 0.1)
        self._matches(model, torch.randn(4, 3, 8, 8), conv)

    def test_activation_checkpointing(self):
        """torch.utils.checkpoint (reentrant and not) around layers converted plainly, fused
        and fused in place (the segment starting at an in-place layer, which writes over the
        segment's input): the float64 original's outputs, gradients (the input's too) and
        buffers, the running statistics updated again by the backward's recomputation as the
        original's; on a team of two the recomputation's collective forward runs in each
        rank's backward (no wait for a peer that does not come)."""
        for reentrant in (False, True):
            torch.manual_seed(11)
            model = nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1),
                Checkpointed(nn.Sequential(nn.BatchNorm2d(8), nn.LeakyReLU(0.1, inplace=True), nn.Conv2d(8, 8, 1),
                                           nn.BatchNorm2d(8), nn.ReLU(inplace=True), BasicBlock(8, 8)), reentrant),
                nn.Conv2d(8, 4, 1))
            randomize_bn(model)
            x = torch.randn(4, 3, 8, 8)
            for how, convert in (("plain", lambda m: sbt.convert_sync_batchnorm(m, comm=self.comm)),
                                 ("fused", lambda m: sbt.convert_fused(m, comm=self.comm)),
                                 ("in place", lambda m: sbt.convert_fused(m, comm=self.comm, inplace=True))):
                with self.subTest(reentrant=reentrant, how=how):
                    conv = convert(copy.deepcopy(model))
                    self.assertEqual(len(fused_layers(conv)), 0 if how == "plain" else 4)
                    if how == "in place":
                        self.assertTrue(conv[1].module[0].inplace)
                    converted_matches(self, model, x, conv, input_grad=True)
                    self.assertEqual(int(conv[1].module[0].num_batches_tracked), 4)  # 2 steps, 2 forwards each
            team_of_two_matches(self, model, lambda m, c: sbt.convert_fused(m, comm=c, inplace=True), x, 4)

    def test_hooks_registered_after_conversion(self):
        """A hook registered on a fused batch norm after convert_fused sees what it sees on
        the original: the batch norm's output before the activation (a Sequential's pairs,
        ReLU and leaky ReLU, in place or not; a block's batch norms, the last one before the
        residual add; a ConvModule's norm is TestConvModule's), and one that writes into it
        in place (a shift: it does not commute with the activation, as a scaling would)
        trains as on the original: the layer runs its batch norm alone while such a hook is
        there, and what comes after it the activation. A global forward hook alike. Before,
        the hooks saw the activated output (its minimum 0 after a ReLU) and the shifted
        models differed. Against the float64 original with the same hooks."""
        names = ["1", "3.bn1", "3.bn2", "5.bn3", "8"]  # ReLU pair, block, block's last, bottleneck's, leaky pair

        def hooked(model, seen):
            def hook_for(name):
                def hook(module, inputs, output):
                    seen.setdefault(name, output.detach().double().clone())
                    output.sub_(0.2)  # (in place, as a pruning mask is written)
                return hook
            return [model.get_submodule(n).register_forward_hook(hook_for(n)) for n in names]

        for inplace in (False, True):
            torch.manual_seed(3)
            model = resnet_like()
            randomize_bn(model)
            conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm, inplace=inplace)
            self.assertEqual(conv[8].inplace, inplace)
            seen_ref, seen = {}, {}
            hooked(model, seen_ref)
            handles = hooked(conv, seen)
            x = torch.randn(4, 3, 8, 8)
            self._matches(model, x, conv)  # outputs, gradients, buffers, training and eval
            for n in names:
                self.assertLess(float(seen[n].min()), 0.0, n)  # before the activation
                torch.testing.assert_close(seen[n], seen_ref[n], rtol=1e-4, atol=1e-4, msg=n)
            for h in handles:
                h.remove()
            layer = conv.get_submodule("3.bn2")
            self.assertFalse(sbt._unfused_now(layer))  # fused again
            # a global forward hook (it sees every module's output)
            got = []
            handle = torch.nn.modules.module.register_module_forward_hook(
                lambda m, i, o: got.append(float(o.min())) if m is layer else None)
            try:
                self.assertTrue(sbt._unfused_now(layer))
                conv.train()
                out = conv(x)
            finally:
                handle.remove()
            self.assertLess(got[0], 0.0)  # the block's last batch norm, before the add and the ReLU
            self.assertTrue(bool(torch.isfinite(out).all()))

    def test_hooks_after_conversion_edge_cases(self):
        """What follows a fused batch norm reads the layer's own choice (its last call ran
        the batch norm alone or not), not the hooks again: a hook that removes itself (the
        "grab the features once" kind) on a ReLU pair and a leaky one; a block's batch norm
        inside a one-child wrapper put there (as checkpoint_wrapper), the hook on the layer
        inside; a torch.fx trace of the model (the FusedActivation a node that asks at run
        time) with a hook registered after tracing, and one traced with a hook removed after
        it (the graph keeps the hook's ops and the choice it was traced with). Each against
        the float64 original, the same hooks on it (a shift of the output: the leaky ReLU
        applied twice, or not at all, would show). Before, the first and the last lost or
        doubled the activation, and the wrapped block lost it."""
        def shift(module, inputs, output):
            return output - 0.2

        torch.manual_seed(4)
        model = resnet_like().eval()
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm).eval()
        ref = copy.deepcopy(model).double()
        x = torch.randn(2, 3, 8, 8)

        def close(got, want, what):
            torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4, msg=what)

        # a hook that removes itself, on each model, once
        for name in ("1", "8"):
            for m in (conv, ref):
                handle = [None]

                def once(module, inputs, output, handle=handle):
                    handle[0].remove()
                    return output - 0.2
                handle[0] = m.get_submodule(name).register_forward_hook(once)
            close(conv(x), ref(x.double()), f"one-shot hook on {name}")
            close(conv(x), ref(x.double()), f"after the one-shot hook on {name}")
        # a block's batch norm wrapped, the hook on the layer inside
        wrapped = copy.deepcopy(conv)
        wrapped[3].bn1 = Calls(wrapped[3].bn1)
        wrapped[3].bn1.module.register_forward_hook(shift)
        ref_hooked = copy.deepcopy(ref)
        ref_hooked[3].bn1.register_forward_hook(shift)
        close(wrapped(x), ref_hooked(x.double()), "wrapped block layer")
        # torch.fx: a hook registered after tracing; a traced hook removed after tracing
        traced = torch.fx.symbolic_trace(conv)
        handle = conv[8].register_forward_hook(shift)
        ref_hooked = copy.deepcopy(ref)
        ref_hooked[8].register_forward_hook(shift)
        close(traced(x), ref_hooked(x.double()), "fx, hook registered after tracing")
        traced_hooked = torch.fx.symbolic_trace(conv)
        handle.remove()
        close(traced_hooked(x), ref_hooked(x.double()), "fx, traced with the hook, removed after")
        close(traced(x), ref(x.double()), "fx, the hook removed")

    def test_loads_a_batchnorm_checkpoint(self):
        torch.manual_seed(1)
        model = resnet_like()
        randomize_bn(model)
        conv = sbt.convert_fused(resnet_like(), comm=self.comm)
        conv.load_state_dict(model.state_dict())
        self._matches(model, torch.randn(2, 3, 8, 8), conv, steps=1)

    def test_inplace_conversion(self):
        """inplace=True: the leaky ReLU layer becomes in-place, the ReLU ones cannot."""
        torch.manual_seed(2)
        model = resnet_like()
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm, inplace=True)
        self.assertEqual([n for n, _, ip in fused_layers(conv) if ip], ["8"])
        self._matches(model, torch.randn(4, 3, 8, 8), conv)
        # an evaluated model's conversion: every module keeps its mode, the identity
        # (FusedActivation) in a fused activation's place too
        model.eval()
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm, inplace=True)
        self.assertEqual([n for n, m in conv.named_modules() if m.training], [])
        self.assertIn(sbt.FusedActivation, {type(m) for m in conv.modules()})
        seq = sbt.convert_fused(nn.Sequential(nn.BatchNorm1d(3), nn.LeakyReLU(), nn.Dropout(0.0, inplace=True)),
                                comm=self.comm, inplace=True)
        # an in-place module after nn.LeakyReLU() would write over the output the fused
        # layer keeps (nn.LeakyReLU() keeps its input): left alone, and it trains
        self.assertEqual(fused_layers(seq), [])
        self.assertIsInstance(seq[1], nn.LeakyReLU)
        seq = sbt.convert_fused(nn.Sequential(nn.BatchNorm1d(3), nn.LeakyReLU(), nn.Dropout(0.5, inplace=True)),
                                comm=self.comm)
        self.assertEqual(fused_layers(seq), [])
        seq(torch.randn(4, 3, 5).requires_grad_()).sum().backward()
        # the in-place module in the next Sequential (the converter sees it there too)
        nested = nn.Sequential(nn.Sequential(nn.Conv1d(3, 3, 1), nn.BatchNorm1d(3), nn.LeakyReLU(0.1)),
                               nn.Sequential(nn.Sequential(nn.Hardtanh(-5, 5, inplace=True)), nn.Conv1d(3, 3, 1)))
        nested = sbt.convert_fused(nested, comm=self.comm)
        self.assertEqual(fused_layers(nested), [])
        nested(torch.randn(4, 3, 5)).sum().backward()
        # nn.LeakyReLU(inplace=True) keeps its output, as the fused layer does: fused
        seq = sbt.convert_fused(nn.Sequential(nn.BatchNorm1d(3), nn.LeakyReLU(inplace=True), nn.Dropout(0.0)),
                                comm=self.comm, inplace=True)
        self.assertEqual(fused_layers(seq), [("0", "leaky_relu", True)])
        # ... but not in place before a pass-through that writes its input
        seq = sbt.convert_fused(nn.Sequential(nn.BatchNorm1d(3), nn.LeakyReLU(inplace=True),
                                              nn.Dropout(0.0, inplace=True), nn.Conv1d(3, 3, 1)),
                                comm=self.comm, inplace=True)
        self.assertEqual(fused_layers(seq), [("0", "leaky_relu", False)])

    def test_leaky_relu_before_what_the_converter_cannot_see(self):
        """nn.LeakyReLU() (it keeps its input) fused only where the module after the pair is
        known and does not write its input: a pair that ends a Sequential run by a module's
        own code (`out += x` after it), or is followed through a pass-through (nn.Flatten)
        by an in-place module, stays as it is, and the converted model trains as the
        original does (the fused layer would keep its output, which the in-place op
        changes: autograd's "modified by an inplace operation"). A ReLU there keeps its
        output in the original too: fused."""

        class Head(nn.Module):
            def __init__(self, act):
                super().__init__()
                self.seq = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), act)

            def forward(self, x):
                out = self.seq(x)
                out += x
                return out

        flat = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.LeakyReLU(0.2), nn.Flatten(),
                             nn.Dropout(0.5, inplace=True))
        for inplace in (False, True):
            for model in (Head(nn.LeakyReLU(0.1)), copy.deepcopy(flat)):
                conv = sbt.convert_fused(model, comm=self.comm, inplace=inplace)
                self.assertEqual(fused_layers(conv), [])
                conv(torch.randn(2, 4, 5, 5, requires_grad=True)).sum().backward()
            conv = sbt.convert_fused(Head(nn.ReLU()), comm=self.comm, inplace=inplace)
            self.assertEqual(fused_layers(conv), [("seq.1", "relu", False)])
        # known and not writing, behind a pass-through: fused, also where the pair ends a
        # nested Sequential and the module after it is the outer one's next but one
        seq = sbt.convert_fused(nn.Sequential(nn.BatchNorm2d(4), nn.LeakyReLU(0.2), nn.Identity(),
                                              nn.Sequential(nn.Conv2d(4, 4, 1))), comm=self.comm, inplace=True)
        self.assertEqual(fused_layers(seq), [("0", "leaky_relu", True)])
        seq = sbt.convert_fused(nn.Sequential(nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.LeakyReLU(0.1)),
                                              nn.Dropout(0.1), nn.Conv2d(4, 4, 1)), comm=self.comm, inplace=True)
        self.assertEqual(fused_layers(seq), [("0.1", "leaky_relu", True)])
        # before a torchvision block the converter fuses (its first convolution reads the input)
        seq = sbt.convert_fused(nn.Sequential(nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.LeakyReLU(0.1)),
                                              BasicBlock(4, 4)), comm=self.comm)
        self.assertEqual([n for n, _, _ in fused_layers(seq)], ["0.1", "1.bn1", "1.bn2"])

        # a module of another class may write its input, or return a view that the next
        # one writes: not fused before it
        class AddOne(nn.Module):
            def forward(self, x):
                return x.add_(1)

        class View(nn.Module):
            def forward(self, x):
                return x.view(x.shape[0], -1)

        for tail in ((AddOne(),), (View(), nn.Dropout(0.5, inplace=True))):
            seq = sbt.convert_fused(nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.LeakyReLU(0.1), *tail),
                                    comm=self.comm)
            self.assertEqual(fused_layers(seq), [])
            seq(torch.randn(2, 4, 5, 5, requires_grad=True)).sum().backward()

        # nor before a known class whose forward a subclass rewrote, or one with a hook (each
        # writes its input here: the original trains, a fused pair's backward would raise)
        class PreAddConv(nn.Conv2d):
            def forward(self, x):
                return super().forward(x.add_(1))

        hooked = nn.Conv2d(4, 4, 1)
        hooked.register_forward_pre_hook(lambda m, args: (args[0].add_(1),))
        hooked_seq = nn.Sequential(nn.Conv2d(4, 4, 1))
        hooked_seq.register_forward_pre_hook(lambda m, args: (args[0].add_(1),))
        # nor at the end of a Sequential with a forward hook (it runs before what comes after
        # the Sequential, and may write the pair's output), though a conv follows outside
        hooked_end = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.LeakyReLU(0.1))
        hooked_end.register_forward_hook(lambda m, args, out: out.mul_(2))
        for inplace in (False, True):
            seq = sbt.convert_fused(nn.Sequential(copy.deepcopy(hooked_end), nn.Conv2d(4, 4, 1)), comm=self.comm,
                                    inplace=inplace)
            self.assertEqual(fused_layers(seq), [])
            seq(torch.randn(2, 4, 5, 5, requires_grad=True)).sum().backward()
        # a pair inside such a Sequential but not at its end: the module after it is known
        inner = nn.Sequential(nn.BatchNorm2d(4), nn.LeakyReLU(0.1), nn.Conv2d(4, 4, 1))
        inner.register_forward_hook(lambda m, args, out: out.mul_(2))
        seq = sbt.convert_fused(nn.Sequential(inner, nn.Conv2d(4, 4, 1)), comm=self.comm)
        self.assertEqual(fused_layers(seq), [("0.0", "leaky_relu", False)])
        seq(torch.randn(2, 4, 5, 5, requires_grad=True)).sum().backward()

        for tail in (PreAddConv(4, 4, 1), hooked, hooked_seq):
            seq = sbt.convert_fused(nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.LeakyReLU(0.1), tail),
                                    comm=self.comm, inplace=True)
            self.assertEqual(fused_layers(seq), [], type(tail).__name__)
            seq(torch.randn(2, 4, 5, 5, requires_grad=True)).sum().backward()

        # before syncbn's own layers, in place or not (an in-place layer keeps its output
        # for autograd and never writes its input): fused, nested or flat alike
        flat = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.LeakyReLU(0.2), nn.BatchNorm2d(4),
                             nn.LeakyReLU(0.1), nn.Conv2d(4, 4, 1))
        nested = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.LeakyReLU(0.2),
                               nn.Sequential(nn.BatchNorm2d(4), nn.LeakyReLU(0.1), nn.Conv2d(4, 4, 1)))
        for model, names in ((flat, ["1", "3"]), (nested, ["1", "3.0"])):
            conv = sbt.convert_fused(model, comm=self.comm, inplace=True)
            self.assertEqual(fused_layers(conv), [(n, "leaky_relu", True) for n in names])
            x = torch.randn(2, 4, 5, 5, requires_grad=True)
            conv(x).sum().backward()
            self.assertEqual(x._version, 0)

    def test_relu_as_leaky(self):
        """relu_as_leaky=SLOPE, an opt-in that changes the model (inplace_abn's networks):
        every ReLU the converter fuses becomes a leaky ReLU of that slope, a block's all of
        them; with inplace=True each such layer goes in place, a block's last (it takes the
        residual) where the block has no downsample. The converted model is the float64 model with those ReLUs replaced
        by nn.LeakyReLU(SLOPE) by hand (training steps, gradients, buffers, eval), not the
        ReLU one, and reverts to it; the ReLU it does not fuse stays one; a slope that is
        not a real number >= FLT_MIN is refused before the model is touched. A block whose
        layers were given different activations after it cannot revert to one relu module:
        refused before anything changes; one leaky ReLU for all of them reverts to it."""
        torch.manual_seed(5)
        model = resnet_like()
        randomize_bn(model)
        by_hand = copy.deepcopy(model)
        by_hand[2] = nn.LeakyReLU(0.2, inplace=True)
        for i in (3, 4, 5, 6):
            by_hand[i].relu = nn.LeakyReLU(0.2, inplace=True)
        x = torch.randn(4, 3, 8, 8)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm, inplace=True, relu_as_leaky=0.2)
        # a block's last layer (it takes the residual) in place where the block has no
        # downsample (3, 5): its residual is the block's input
        ip = {"1": True, "3.bn1": True, "3.bn2": True, "4.bn1": True, "4.bn2": False, "5.bn1": True,
              "5.bn2": True, "5.bn3": True, "6.bn1": True, "6.bn2": True, "6.bn3": False, "8": True}
        self.assertEqual(fused_layers(conv), [(n, "leaky_relu", v) for n, v in ip.items()])
        self.assertEqual({n: m.slope for n, m in conv.named_modules() if getattr(m, "activation", "") == "leaky_relu"},
                         {n: 0.1 if n == "8" else 0.2 for n in ip})  # layer 8 was nn.LeakyReLU(0.1)
        self.assertIsInstance(conv[14], nn.ReLU)
        with torch.no_grad():  # another function than the ReLU model's (on copies: buffers stay)
            self.assertGreater((copy.deepcopy(conv)(x) - copy.deepcopy(model)(x)).abs().max().item(), 1e-3)
        self._matches(by_hand, x, conv)
        # without inplace: the same activations, none in place
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm, relu_as_leaky=0.2)
        self.assertEqual(fused_layers(conv), [(n, "leaky_relu", False) for n in ip])
        self._matches(by_hand, x, conv, steps=1)
        # reverted: the model trained, with nn.LeakyReLU(0.2) where the ReLUs were
        rev = sbt.revert_sync_batchnorm(sbt.convert_fused(copy.deepcopy(model), comm=self.comm, inplace=True,
                                                          relu_as_leaky=0.2))
        self.assertEqual([(n, type(m).__name__, getattr(m, "negative_slope", None), getattr(m, "inplace", None))
                          for n, m in rev.named_modules() if isinstance(m, (nn.ReLU, nn.LeakyReLU))],
                         [("2", "LeakyReLU", 0.2, True), ("3.relu", "LeakyReLU", 0.2, True),
                          ("4.relu", "LeakyReLU", 0.2, True), ("5.relu", "LeakyReLU", 0.2, True),
                          ("6.relu", "LeakyReLU", 0.2, True), ("9", "LeakyReLU", 0.1, False), ("14", "ReLU", None, False)])
        self.assertEqual(fused_layers(rev), [])
        def kind(m):
            return "bn" if isinstance(m, nn.modules.batchnorm._BatchNorm) else type(m)
        self.assertEqual([kind(m) for m in rev.modules()], [kind(m) for m in by_hand.modules()])
        self._matches(by_hand, x, rev, steps=1)
        for bad in (0, 0.0, -0.1, float("nan"), float("inf"), 1e-40, 10 ** 400, True, "0.1", torch.tensor(0.1)):
            fresh = resnet_like()
            with self.assertRaisesRegex(ValueError, "relu_as_leaky"):
                sbt.convert_fused(fresh, comm=self.comm, relu_as_leaky=bad)
            self.assertIsInstance(fresh[1], nn.BatchNorm2d)  # untouched
            self.assertIsInstance(fresh[3].bn1, nn.BatchNorm2d)
        for good in (np.float32(0.25), np.int64(1), 2):
            conv = sbt.convert_fused(resnet_like(), comm=self.comm, relu_as_leaky=good)
            self.assertEqual(conv[3].bn1.slope, float(np.float32(good)))
            self.assertIs(type(conv[3].bn1.slope), float)
        # a block's layers given different activations after the conversion
        for acts in ((("relu",), ("leaky_relu", 0.2)), (("leaky_relu", 0.3), ("leaky_relu", 0.2)),
                     (("identity",), ("identity",))):
            conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm, relu_as_leaky=0.2)
            conv[3].bn1.set_activation(*acts[0])
            conv[3].bn2.set_activation(*acts[1])
            with self.assertRaisesRegex(ValueError, "batch norms of a FusedBasicBlock apply .*one relu module"):
                sbt.revert_sync_batchnorm(conv)
            self.assertIsInstance(conv[1], sbt.SyncBatchNorm)  # untouched
            self.assertIsInstance(conv[3], sbt.FusedBasicBlock)
        # untouched also where a fused pair comes first (its revert would change it)
        conv = sbt.convert_fused(nn.Sequential(nn.Sequential(nn.BatchNorm2d(8), nn.ReLU()), BasicBlock(8, 8)),
                                 comm=self.comm)
        conv[1].bn1.set_activation("identity")
        with self.assertRaisesRegex(ValueError, "one relu module"):
            sbt.revert_sync_batchnorm(conv)
        self.assertIsInstance(conv[0][1], sbt.FusedActivation)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)  # ReLU, then one leaky ReLU for all
        for bn in ("bn1", "bn2"):
            getattr(conv[3], bn).set_activation("leaky_relu", 0.3)
        rev = sbt.revert_sync_batchnorm(conv)
        self.assertEqual((type(rev[3].relu), rev[3].relu.negative_slope, rev[4].relu), (nn.LeakyReLU, 0.3, rev[4].relu))
        self.assertIs(type(rev[4].relu), nn.ReLU)

    def test_zero_weight_stays_out_of_place(self):
        """With inplace=True, a layer the converter would put in place but one of whose
        weight's channels is below the in-place backward's threshold (1e-5: a weight of 0
        gets no gradient in place, so a weight initialized to 0 would stay 0, as
        torchvision's zero_init_residual and timm's zero_init_last make a block's last batch
        norm) keeps its input, and one RuntimeWarning names every such layer; a weight at
        the threshold goes in place. The zero weights then train: their gradient is the
        float64 model's (nonzero), the model's steps as its own."""
        torch.manual_seed(6)
        model = resnet_like()
        randomize_bn(model)
        with torch.no_grad():
            model[3].bn2.weight.zero_()  # zero_init_residual's BasicBlock (no downsample)
            model[5].bn3.weight.zero_()  # ... and Bottleneck
            model[3].bn1.weight[2] = 0.0  # one channel of a layer without the residual
            model[1].weight[0] = -5e-6  # a Sequential's pair, below the threshold in magnitude
            model[5].bn1.weight[1] = 1e-5  # at the threshold: recovered, in place
        by_hand = copy.deepcopy(model)
        by_hand[2] = nn.LeakyReLU(0.2, inplace=True)
        for i in (3, 4, 5, 6):
            by_hand[i].relu = nn.LeakyReLU(0.2, inplace=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm, inplace=True, relu_as_leaky=0.2)
        msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        self.assertEqual(len(msgs), 1, msgs)
        self.assertIn("4 fused layer(s) keep their input", msgs[0])
        self.assertIn(": 1, 3.bn1, 3.bn2, 5.bn3. ", msgs[0])
        ip = {"1": False, "3.bn1": False, "3.bn2": False, "4.bn1": True, "4.bn2": False, "5.bn1": True,
              "5.bn2": True, "5.bn3": False, "6.bn1": True, "6.bn2": True, "6.bn3": False, "8": True}
        self.assertEqual(fused_layers(conv), [(n, "leaky_relu", v) for n, v in ip.items()])
        self._matches(by_hand, x=torch.randn(4, 3, 8, 8), converted=conv, steps=1)
        for layer in (conv[3].bn2, conv[5].bn3):  # (a layer in place would have 0)
            self.assertGreater(layer.weight.grad.abs().max().item(), 1e-2)
        # no such layer: no warning
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sbt.convert_fused(resnet_like(), comm=self.comm, inplace=True, relu_as_leaky=0.2)
        self.assertEqual([w for w in caught if issubclass(w.category, RuntimeWarning)], [])

    def test_blocks_keep_modes_and_take_any_input(self):
        """A fused block keeps each child's training mode (a frozen batch norm in eval stays
        so), and takes the inputs torchvision's `out += identity` takes: another memory
        format than its convolutions' output, a strided view, autocast's dtype."""
        torch.manual_seed(4)
        block = BasicBlock(4, 4)
        randomize_bn(block)
        block.bn1.eval().requires_grad_(False)  # frozen, as fine-tuning does
        model = nn.Sequential(block)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        self.assertIsInstance(conv[0], sbt.FusedBasicBlock)
        self.assertEqual([n for n, m in conv.named_modules() if not m.training], ["0.bn1"])
        self._matches(model, torch.randn(2, 4, 5, 5), conv)  # bn1's running statistics unchanged

        for cl_model, x in ((True, torch.randn(2, 4, 5, 5)),  # channels_last convolutions, contiguous input
                            (False, torch.randn(2, 4, 5, 5).transpose(2, 3))):  # a strided view
            model = nn.Sequential(BasicBlock(4, 4), Bottleneck(4, 1))
            randomize_bn(model)
            if cl_model:
                model = model.to(memory_format=torch.channels_last)
            conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
            self._matches(model, x, conv, steps=1)

        # an identity that broadcasts to the block's output (a downsample that pools to 1x1):
        # the fused layer takes it expanded, and its gradient is summed back, as `+=` does
        model = nn.Sequential(BasicBlock(4, 4, downsample=nn.AdaptiveAvgPool2d(1)))
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        self.assertIsInstance(conv[0], sbt.FusedBasicBlock)
        self._matches(model, torch.randn(2, 4, 5, 5), conv, steps=1)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        x = torch.randn(2, 4, 5, 5, requires_grad=True)
        X = x.detach().double().requires_grad_()
        g = torch.randn(2, 4, 5, 5, dtype=torch.float64)
        (conv(x).double() * g).sum().backward()
        (copy.deepcopy(model).double()(X) * g).sum().backward()
        torch.testing.assert_close(x.grad.double(), X.grad, rtol=1e-3, atol=1e-4)
        with self.assertRaisesRegex(RuntimeError, "expand"):  # what += refuses, refused
            sbt.convert_fused(nn.Sequential(BasicBlock(4, 4, downsample=nn.Conv2d(4, 4, 2, stride=2))),
                              comm=self.comm)(torch.randn(2, 4, 5, 5))

        model = nn.Sequential(BasicBlock(4, 4))
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        x = torch.randn(2, 4, 5, 5)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 convolutions, an fp32 block input
            y, Y = conv(x), model(x)
        self.assertEqual(y.dtype, Y.dtype)
        # the residual rounded to bf16 before the add, not after: within two bf16 roundings
        torch.testing.assert_close(y.float(), Y.float(), rtol=2e-2, atol=2e-2)

    def test_global_hook_fuses_nothing(self):
        handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
        try:
            with self.assertWarnsRegex(RuntimeWarning, "global module hook"):
                conv = sbt.convert_fused(resnet_like(), comm=self.comm)
        finally:
            handle.remove()
        self.assertEqual(fused_layers(conv), [])
        self.assertFalse(any(isinstance(m, sbt.FusedBasicBlock) for m in conv.modules()))

    def test_left_alone(self):
        """What fusing would change is not fused: a batch norm used elsewhere (twice in the
        model, a hook on it), the activation not right after, an unknown block with
        torchvision's children, a Sequential subclass with its own forward."""
        torch.manual_seed(3)
        tap = Tap()
        randomize_bn(tap)
        c = sbt.convert_fused(copy.deepcopy(tap), comm=self.comm)
        self.assertEqual(fused_layers(c), [])
        self._matches(tap, torch.randn(2, 3, 5, 5), c, steps=1)

        # one layer in two places (convert_sync_batchnorm, as PyTorch's, would make an
        # nn.BatchNorm2d in two places two layers sharing parameters: then fusable)
        shared = sbt.SyncBatchNorm(4, comm=self.comm)
        twice = nn.Sequential(nn.Conv2d(3, 4, 1), shared, nn.ReLU(), nn.Conv2d(4, 4, 1), shared)
        self.assertEqual(fused_layers(sbt.convert_fused(twice, comm=self.comm)), [])

        # a slope the library does not take (negative: PyTorch's LeakyReLU takes it)
        neg = nn.Sequential(nn.BatchNorm2d(4), nn.LeakyReLU(-0.5))
        randomize_bn(neg)
        c = sbt.convert_fused(copy.deepcopy(neg), comm=self.comm)
        self.assertEqual(fused_layers(c), [])
        self._matches(neg, torch.randn(2, 4, 5, 5), c, steps=1)

        hooked = nn.Sequential(nn.BatchNorm2d(4), nn.ReLU())
        seen = []
        hooked[0].register_forward_hook(lambda m, i, o: seen.append(o))
        self.assertEqual(fused_layers(sbt.convert_fused(hooked, comm=self.comm)), [])

        pre = nn.Sequential(PreActBlock(4, 4))
        randomize_bn(pre)
        c = sbt.convert_fused(copy.deepcopy(pre), comm=self.comm)
        self.assertIsInstance(c[0], PreActBlock)
        self.assertEqual(fused_layers(c), [])
        self._matches(pre, torch.randn(2, 4, 5, 5), c, steps=1)

        class Skip(nn.Sequential):
            def forward(self, x):
                y = self[0](x)
                return self[1](y) + y

        sk = Skip(nn.BatchNorm2d(4), nn.ReLU())
        randomize_bn(sk)
        c = sbt.convert_fused(copy.deepcopy(sk), comm=self.comm)
        self.assertEqual(fused_layers(c), [])
        self._matches(sk, torch.randn(2, 4, 5, 5), c, steps=1)

        # subclasses of nn.ReLU / nn.LeakyReLU with their own forward (a clamp, a scaled
        # leaky ReLU) are other functions: kept, not fused as the plain activation
        class ReLU1(nn.ReLU):
            def forward(self, x):
                return x.clamp(0.0, 1.0)

        class Leaky2(nn.LeakyReLU):
            def forward(self, x):
                return 2.0 * super().forward(x)

        for act in (ReLU1(), Leaky2(0.1, inplace=True)):  # (a plain leaky ReLU is fused in place)
            sub = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), act)
            randomize_bn(sub)
            c = sbt.convert_fused(copy.deepcopy(sub), comm=self.comm)
            self.assertEqual(fused_layers(c), [], type(act).__name__)
            self.assertIs(type(c[2]), type(act))
            self._matches(sub, torch.randn(2, 3, 5, 5), c, steps=1)

        class Scaled(BasicBlock):  # torchvision's forward, a parameter of its own (a fused block would drop it)
            def __init__(self, *args):
                super().__init__(*args)
                self.gamma = nn.Parameter(torch.ones(1))

        sc = nn.Sequential(Scaled(4, 4))
        c = sbt.convert_fused(copy.deepcopy(sc), comm=self.comm)
        self.assertIs(type(c[0]), Scaled)
        self.assertEqual(fused_layers(c), [])
        self.assertEqual(list(c.state_dict().keys()), list(sc.state_dict().keys()))

        wrapped = nn.Sequential(BasicBlock(4, 4))  # a forward set on the block (bound to it, as a
        wrapped[0].forward = functools.partial(BasicBlock.forward, wrapped[0])  # checkpointing wrapper's)
        randomize_bn(wrapped)
        c = sbt.convert_fused(copy.deepcopy(wrapped), comm=self.comm)
        self.assertIs(type(c[0]), BasicBlock)
        self.assertEqual(fused_layers(c), [])
        self._matches(wrapped, torch.randn(2, 4, 5, 5), c, steps=1)

    def test_block_at_the_top(self):
        torch.manual_seed(4)
        blk = Bottleneck(16, 4)
        randomize_bn(blk)
        c = sbt.convert_fused(copy.deepcopy(blk), comm=self.comm)
        self.assertIsInstance(c, sbt.FusedBottleneck)
        self._matches(blk, torch.randn(2, 16, 5, 5), c)
        self.assertIs(type(sbt.revert_sync_batchnorm(c)), Bottleneck)

    def test_reverted_model_folds_its_batch_norms(self):
        """torch.nn.utils.fuse_conv_bn_eval (folding an evaluated batch norm into the
        convolution before it, as deployment does) of the reverted model's (conv, bn)
        pairs, each bn then made an identity: the model's eval outputs. The reverted batch
        norms are plain (their activations are modules of their own again); a revert that
        kept the fused activations in the batch norms would lose them in the fold."""
        torch.manual_seed(7)
        model = resnet_like()
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        x = torch.randn(2, 3, 8, 8)
        conv(x)  # trains once: running statistics moved
        back = sbt.revert_sync_batchnorm(conv).eval()
        want = back(x)
        pairs = 0  # every batch norm here follows its convolution among its siblings
        for parent in list(back.modules()):
            kids = list(parent.named_children())
            for (cn, c), (bn_name, bn) in zip(kids, kids[1:]):
                if isinstance(c, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d):
                    setattr(parent, cn, torch.nn.utils.fuse_conv_bn_eval(c, bn))
                    setattr(parent, bn_name, nn.Identity())
                    pairs += 1
        self.assertEqual(pairs, 15)
        torch.testing.assert_close(back(x), want, rtol=1e-5, atol=1e-5)

    def test_reverted_model_takes_torch_tools(self):
        """A reverted layer is the torch.nn batch norm class it was converted from
        (nn.BatchNorm1d / 2d / 3d), so PyTorch's tools that look for those classes take the
        reverted model as they take the original: torch.ao.quantization.fuse_modules folds
        conv + bn (+ relu), TorchScript scripts it, each equal to the reverted model, and
        prepare_fx folds every batch norm. A layer
        converted from nn.SyncBatchNorm, made as syncbn's, or keeping an activation becomes
        a BatchNormXd."""
        torch.manual_seed(13)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 1),
                              nn.BatchNorm2d(4))
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        self.assertEqual(fused_layers(conv), [("1", "relu", False)])
        x = torch.randn(2, 3, 8, 8)
        conv(x)  # trains once: running statistics moved
        back = sbt.revert_sync_batchnorm(conv).eval()
        self.assertEqual([type(m) for m in back], [type(m) for m in model])
        with torch.no_grad():
            want = back(x)
            fused = torch.ao.quantization.fuse_modules(back, [["0", "1", "2"], ["3", "4"]], inplace=False)
            self.assertEqual([type(m) for m in fused][1:], [nn.Identity, nn.Identity, nn.Conv2d, nn.Identity])
            torch.testing.assert_close(fused(x), want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(torch.jit.script(back)(x), want, rtol=0, atol=0)
        from torch.ao.quantization import get_default_qconfig_mapping
        from torch.ao.quantization.quantize_fx import prepare_fx
        prepared = prepare_fx(copy.deepcopy(back), get_default_qconfig_mapping(), (x,))
        self.assertFalse([m for m in prepared.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)])
        others = nn.Sequential(nn.BatchNorm1d(4), nn.BatchNorm3d(4), nn.SyncBatchNorm(4),
                               sbt.BatchNormXd(4), sbt.SyncBatchNorm(4), nn.BatchNorm2d(4, affine=False),
                               nn.BatchNorm2d(4, track_running_stats=False))
        conv = sbt.convert_sync_batchnorm(copy.deepcopy(others), comm=self.comm)
        conv[0].set_activation("relu")  # keeps its activation: an epilogue in PyTorch's ops
        back = sbt.revert_sync_batchnorm(conv)
        self.assertEqual([type(m) for m in back], [sbt.BatchNormXd, nn.BatchNorm3d] + [sbt.BatchNormXd] * 3
                         + [nn.BatchNorm2d] * 2)
        self.assertEqual(back[0].activation, "relu")
        self.assertEqual([(m.affine, m.track_running_stats) for m in back][5:], [(False, True), (True, False)])
        if sbt._BIAS_KW:  # a batch norm without a bias: one where PyTorch takes bias=False
            back = sbt.revert_sync_batchnorm(sbt.convert_sync_batchnorm(nn.BatchNorm2d(4, bias=False),
                                                                       comm=self.comm))
            self.assertIs(type(back), nn.BatchNorm2d)
            self.assertIsNone(back.bias)

    def test_a_frameworks_conversion_keeps_the_function(self):
        """A framework's conversion that puts another module in a fused batch norm's place
        (it is an nn.SyncBatchNorm): PyTorch's convert_sync_batchnorm (Lightning's
        sync_batchnorm=True), a plain batch norm of the same tensors (mmengine's
        revert_sync_batchnorm, which its Runner runs when not distributed; timm's and
        detectron2's freezes alike), mmcv's fuse_conv_bn (in eval: the batch norm folded
        into the convolution before it, an nn.Identity in its place), a wrapper that calls
        the layer (torch's checkpoint_wrapper, FSDP's), two of them, and a copy of the layer
        in its place. The converted model then computes the original's function under the
        same conversion (its fused ReLUs made leaky alike with relu_as_leaky, where applying
        one twice shows): a Sequential pair's FusedActivation applies the activation after
        the new module, a fused block its add and activation, and neither applies it a
        second time after a wrapper of the fused layer or a copy of it.
        revert_sync_batchnorm afterwards gives the original's modules (the activation
        modules back, no FusedActivation), its function too."""
        def torch_sync(model):
            return nn.SyncBatchNorm.convert_sync_batchnorm(model)

        def replaced(model, new):  # every batch norm below model, in its parent's place
            for parent in list(model.modules()):
                for name, child in list(parent._modules.items()):
                    if isinstance(child, nn.modules.batchnorm._BatchNorm):
                        parent._modules[name] = new(child)
            return model

        def plain(model):
            def new(bn):
                out = nn.BatchNorm2d(bn.num_features, bn.eps, bn.momentum).train(bn.training)
                out.load_state_dict(bn.state_dict())
                return out
            return replaced(model, new)

        def wrapped(model):
            return replaced(model, Calls)

        def wrapped_twice(model):  # (FSDP's wrapper around checkpoint_wrapper's)
            return replaced(model, lambda bn: Calls(Calls(bn)))

        def copied(model):  # a copy of each batch norm in its place (a pickled layer put back)
            return replaced(model, copy.deepcopy)

        def folded(model):  # mmcv's fuse_conv_bn's walk: a batch norm after a convolution among siblings
            for parent in list(model.modules()):
                last = None
                for name, child in list(parent._modules.items()):
                    if isinstance(child, nn.modules.batchnorm._BatchNorm) and last is not None:
                        parent._modules[last] = torch.nn.utils.fuse_conv_bn_eval(parent._modules[last], child)
                        parent._modules[name] = nn.Identity()
                        last = None
                    elif isinstance(child, nn.Conv2d):
                        last = name
            return model

        def kinds(model):
            return [(n, type(m), getattr(m, "negative_slope", None)) for n, m in model.named_modules()]

        x = torch.randn(4, 3, 8, 8)
        for slope in (None, 0.05):
            torch.manual_seed(21)
            model = resnet_like()
            randomize_bn(model)
            conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm, relu_as_leaky=slope)
            if slope is not None:  # the function convert_fused made: the fused ReLUs leaky
                model[2] = nn.LeakyReLU(slope, inplace=True)
                for m in model.modules():
                    if isinstance(m, (BasicBlock, Bottleneck)):
                        m.relu = nn.LeakyReLU(slope, inplace=True)
            for how in (torch_sync, plain, wrapped, wrapped_twice, copied):
                with self.subTest(slope=slope, conversion=how.__name__):
                    got = how(copy.deepcopy(conv))
                    self.assertEqual(any(isinstance(m, sbt.SyncBatchNorm) for m in got.modules()),
                                     how in (wrapped, wrapped_twice, copied))
                    converted_matches(self, how(copy.deepcopy(model)), x, got, input_grad=True)
                    want = how(copy.deepcopy(model))
                    back = sbt.revert_sync_batchnorm(how(copy.deepcopy(conv)))
                    self.assertEqual(kinds(back), kinds(want))
                    converted_matches(self, want, x, back, steps=1, input_grad=True)
            with self.subTest(slope=slope, conversion="folded"):
                want = folded(copy.deepcopy(model).double().eval())
                got = folded(copy.deepcopy(conv).eval())
                self.assertFalse(any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in got.modules()))
                torch.testing.assert_close(got(x).double(), want(x.double()), rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(torch.fx.symbolic_trace(got)(x), got(x), rtol=0, atol=0)
                back = sbt.revert_sync_batchnorm(got)
                self.assertNotIn(sbt.FusedActivation, {type(m) for m in back.modules()})
                torch.testing.assert_close(back(x).double(), want(x.double()), rtol=1e-4, atol=1e-4)

    def test_fused_modules_copy_pickle_and_free(self):
        """Where a fused module looks for its layer (the module that holds it there, and
        the layer) is the copy's own in a deepcopy and in a pickled and loaded model: a
        framework's conversion of the copy keeps the copy's function and leaves the
        original fused. And it holds no reference cycle: a model dropped is freed at once
        (with the garbage collector off), its memory with it."""
        def plain(model):  # mmengine's revert_sync_batchnorm: a torch batch norm in each place
            for parent in list(model.modules()):
                for name, child in list(parent._modules.items()):
                    if isinstance(child, sbt.SyncBatchNorm):
                        out = nn.BatchNorm2d(child.num_features).train(child.training)
                        out.load_state_dict(child.state_dict())
                        parent._modules[name] = out
            return model

        torch.manual_seed(22)
        model = resnet_like()
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm, relu_as_leaky=0.05)
        model[2] = nn.LeakyReLU(0.05, inplace=True)
        for m in model.modules():
            if isinstance(m, (BasicBlock, Bottleneck)):
                m.relu = nn.LeakyReLU(0.05, inplace=True)
        x = torch.randn(4, 3, 8, 8)
        for how in ("deepcopy", "pickle"):
            with self.subTest(how=how):
                twin = copy.deepcopy(conv) if how == "deepcopy" else pickle.loads(pickle.dumps(conv))
                converted_matches(self, model, x, plain(twin), steps=1, input_grad=True)
                self.assertEqual(len(fused_layers(conv)), 12)
                converted_matches(self, model, x, copy.deepcopy(conv), steps=1, input_grad=True)
        # a model rebuilt from the modules, the one they were fused in dropped: its pairs
        # as they were (the batch norm applies the activation, once)
        rebuilt = nn.Sequential(*copy.deepcopy(conv))
        converted_matches(self, model, x, rebuilt, steps=1, input_grad=True)
        # a copy of a part copies that part only: not the rest of the Sequential its pairs
        # were fused in (here a module that no copy takes)
        conv.append(Uncopyable())
        part = copy.deepcopy(conv[:3])
        converted_matches(self, model[:3], x, part, steps=1, input_grad=True)
        gc.collect()
        gc.disable()
        try:
            dropped = sbt.convert_fused(resnet_like(), comm=self.comm)
            dropped(x).sum().backward()
            refs = [weakref.ref(dropped), weakref.ref(dropped[3]), weakref.ref(dropped[1].weight)]
            del dropped
            self.assertEqual([r() for r in refs], [None] * 3)
        finally:
            gc.enable()

    def test_renumbered_sequential_keeps_the_function(self):
        """A Sequential's children renumbered after convert_fused (insert, del; wrappers or a
        copy of the layer put in the batch norm's place, then renumbered): each pair's batch norm applies the
        activation once, as before (a leaky ReLU, which twice would show), under a
        framework's conversion afterwards too, and revert_sync_batchnorm gives the
        original's modules (torch.nn batch norms)."""
        torch.manual_seed(23)
        model = nn.Sequential(nn.Identity(), nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.LeakyReLU(0.1, inplace=True),
                              nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.ReLU())
        randomize_bn(model)
        x = torch.randn(2, 3, 6, 6)
        def edited(m, edit):
            if edit == "wrap twice, then insert":  # wrappers in the batch norm's place, renumbered
                m[2] = Calls(Calls(m[2]))
                m.insert(0, nn.Identity())
            if edit == "copy, then del":  # a copy of the batch norm in its place, renumbered
                m[2] = copy.deepcopy(m[2])
                del m[0]
            if edit in ("insert", "both"):
                m.insert(0, nn.Identity())
            if edit in ("del", "both"):
                del m[0]
            return m

        for edit in ("insert", "del", "both", "wrap twice, then insert", "copy, then del"):
            with self.subTest(edit=edit):
                conv = edited(sbt.convert_fused(copy.deepcopy(model), comm=self.comm), edit)
                want = edited(copy.deepcopy(model), edit)
                back = sbt.revert_sync_batchnorm(copy.deepcopy(conv))
                frozen = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(conv))
                converted_matches(self, want, x, conv, steps=1, input_grad=True)
                # an nn.DataParallel replica (made as torch.nn.parallel.replicate makes
                # them, on one device) asks the module it was made from
                torch.testing.assert_close(replica(conv)(x), conv(x), rtol=0, atol=0)
                self.assertEqual([type(m) for m in back], [type(m) for m in want])
                converted_matches(self, want, x, back, steps=1, input_grad=True)
                converted_matches(self, nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(want)), x, frozen,
                                  steps=1, input_grad=True)
        # a layer of syncbn's with another activation in the batch norm's place: not the
        # layer; the pair's activation follows it
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        conv[2] = copy.deepcopy(conv[2]).set_activation("leaky_relu", 0.2)
        want = copy.deepcopy(model)
        want[2] = nn.Sequential(want[2], nn.LeakyReLU(0.2))
        converted_matches(self, want, x, conv, steps=1, input_grad=True)

    def test_resnet_stem_and_layer_getter(self):
        """A torchvision ResNet's stem (bn1 then relu, in its own forward) is fused as a
        Sequential's pair is, and so is a pair among the children of an
        IntermediateLayerGetter (the backbone of torchvision's segmentation and detection
        models): both run their children one after another, recognized by their forward's
        code. The getter gives out the outputs its return_layers name: a batch norm given
        out is not fused (its caller would see the activation), nor is an nn.LeakyReLU()
        given out (its caller may write over the output the fused layer keeps). Each against
        the float64 original, training and eval; revert_sync_batchnorm gives the ReLU back."""
        torch.manual_seed(14)
        model = ResNet()
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        self.assertEqual(fused_layers(conv)[0], ("bn1", "relu", False))
        self.assertIsInstance(conv.relu, sbt.FusedActivation)
        self.assertEqual(len(fused_layers(conv)), 1 + 2 + 2 + 2 + 3)  # the stem, then each block's
        x = torch.randn(2, 3, 32, 32)
        self._matches(model, x, conv)
        back = sbt.revert_sync_batchnorm(conv)
        self.assertEqual([type(m) for m in back.modules()], [type(m) for m in model.modules()])

        def outputs_match(model, conv, x):
            ref = copy.deepcopy(model).double()
            for mode in ("train", "eval"):
                getattr(conv, mode)()
                getattr(ref, mode)()
                y, Y = conv(x), ref(x.double())
                self.assertEqual(list(y), list(Y))
                for k in Y:
                    torch.testing.assert_close(y[k].double(), Y[k], rtol=1e-4, atol=1e-4, msg=f"{mode} {k}")

        getter = IntermediateLayerGetter(copy.deepcopy(model), {"layer1": "aux", "layer3": "out"})
        self.assertEqual(list(getter), ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3"])
        conv = sbt.convert_fused(copy.deepcopy(getter), comm=self.comm)
        self.assertEqual(fused_layers(conv)[0], ("bn1", "relu", False))
        outputs_match(getter, conv, x)
        seen = IntermediateLayerGetter(copy.deepcopy(model), {"bn1": "stem", "layer3": "out"})
        conv = sbt.convert_fused(copy.deepcopy(seen), comm=self.comm)
        self.assertIs(type(conv.relu), nn.ReLU)  # bn1's output is given out: left alone
        self.assertEqual(conv.bn1.activation, "identity")
        outputs_match(seen, conv, x)
        # an nn.LeakyReLU() pair's output given out, itself or through a pass-through
        # (nn.Identity), or at the end of a child given out: left alone; else fused
        head = nn.Sequential(OrderedDict(conv=nn.Conv2d(3, 4, 3), bn=nn.BatchNorm2d(4), act=nn.LeakyReLU(0.1),
                                         idn=nn.Identity(), proj=nn.Conv2d(4, 4, 1)))
        nested = nn.Sequential(OrderedDict(stem=nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4),
                                                              nn.LeakyReLU(0.1)), proj=nn.Conv2d(4, 4, 1)))
        for model, given, fused in (
                (head, {"proj": "out"}, [("bn", "leaky_relu", False)]),
                (head, {"act": "feat", "proj": "out"}, []),
                (head, {"idn": "feat", "proj": "out"}, []),
                (nested, {"proj": "out"}, [("stem.1", "leaky_relu", False)]),
                (nested, {"stem": "feat", "proj": "out"}, [])):
            randomize_bn(model)
            getter = IntermediateLayerGetter(copy.deepcopy(model), given)
            conv = sbt.convert_fused(copy.deepcopy(getter), comm=self.comm)
            self.assertEqual(fused_layers(conv), fused, given)
            outputs_match(getter, conv, x)

    def test_revert_of_older_fusings_and_hooked_blocks(self):
        """A model fused before FusedActivation existed (an nn.Identity in the activation's
        place: pickled models) reverts to the activation as a module too; a hook on a fused
        block stays on the reverted block; an identity with a hook is left, its batch norm
        keeping the activation (the hook sees what it saw)."""
        torch.manual_seed(10)
        model = resnet_like()
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        conv[2] = nn.Identity()  # the stem's ReLU fused, as an older convert_fused left it
        conv[9] = nn.Identity()  # the leaky ReLU's
        seen = []
        conv[3].register_forward_hook(lambda m, inp, out: seen.append(out.shape))
        x = torch.randn(2, 3, 8, 8)
        conv.eval()
        want = conv(x)
        back = sbt.revert_sync_batchnorm(conv)
        self.assertIs(type(back[2]), nn.ReLU)
        self.assertIs(type(back[9]), nn.LeakyReLU)
        self.assertEqual(back[9].negative_slope, 0.1)
        self.assertFalse([m for m in back.modules() if isinstance(m, sbt.BatchNormXd)])  # all plain nn.BatchNorm2d
        self.assertIs(type(back[3]), BasicBlock)
        seen.clear()
        torch.testing.assert_close(back(x), want, rtol=1e-5, atol=1e-5)
        self.assertEqual(seen, [torch.Size([2, 8, 8, 8])])
        hooked = sbt.convert_fused(nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.ReLU()), comm=self.comm)
        hooked[2].register_forward_hook(lambda m, inp, out: None)
        back = sbt.revert_sync_batchnorm(hooked)
        self.assertIs(type(back[2]), sbt.FusedActivation)
        self.assertEqual(back[1].activation, "relu")
        # the identity that stays (a hook on it, or its layer's activation changed since it
        # was fused) applies nothing itself after the revert: the activation once, by the
        # reverted layer (a leaky one, which twice would show)
        original = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.LeakyReLU(0.1, inplace=True))
        randomize_bn(original)
        for change in ("hook", "set_activation"):
            with self.subTest(change=change):
                fused = sbt.convert_fused(copy.deepcopy(original), comm=self.comm).eval()
                want = copy.deepcopy(original).double().eval()
                if change == "hook":
                    fused[2].register_forward_hook(lambda m, inp, out: None)
                else:
                    fused[1].set_activation("leaky_relu", 0.2)
                    want[2] = nn.LeakyReLU(0.2)
                back = sbt.revert_sync_batchnorm(fused)
                self.assertIs(type(back[2]), sbt.FusedActivation)
                self.assertIs(type(back[1]), sbt.BatchNormXd)
                x = torch.randn(2, 3, 5, 5)
                torch.testing.assert_close(back(x).double(), want(x.double()), rtol=1e-5, atol=1e-5)


    def test_revert_of_many_leaky_blocks(self):
        """revert_sync_batchnorm of a deep stack converted with relu_as_leaky: every block
        back to its class, its relu an nn.LeakyReLU of the slope, the function (eval) and
        the state_dict keys the converted model's. The revert makes a LeakyReLU for each
        block and walks into it; a walk that forgot the fused blocks it replaced (a memo by
        id that did not keep them alive) gave such a LeakyReLU the id of a freed block and
        put a reverted block in its place (seen with 9 blocks: 2 of them)."""
        torch.manual_seed(11)
        model = nn.Sequential(*[nn.Sequential(*[BasicBlock(8, 8) for _ in range(3)]) for _ in range(3)])
        randomize_bn(model)
        keys = list(model.state_dict())
        for round_ in range(3):  # the ids of freed objects come back in some rounds, not all
            conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm, relu_as_leaky=0.01).eval()
            x = torch.randn(2, 8, 6, 6)
            with torch.no_grad():
                want = conv(x)
            back = sbt.revert_sync_batchnorm(conv).eval()
            blocks = [m for m in back.modules() if isinstance(m, (BasicBlock, sbt.FusedBasicBlock))]
            self.assertEqual([(type(b), type(b.relu), getattr(b.relu, "negative_slope", None)) for b in blocks],
                             [(BasicBlock, nn.LeakyReLU, 0.01)] * 9, f"round {round_}")
            self.assertEqual(list(back.state_dict()), keys)
            with torch.no_grad():
                torch.testing.assert_close(back(x), want, rtol=1e-5, atol=1e-5)

    def test_revert_keeps_hook_handles(self):
        """A hook registered on a fused block before the revert stays on the block it
        reverts to, and its handle removes it there (the block takes the hook dicts
        themselves: a copy left the handle removing from the fused block's); a full
        backward hook stays one (it was dropped: its flag was not carried over)."""
        conv = sbt.convert_fused(nn.Sequential(BasicBlock(4, 4)), comm=self.comm)
        calls = []
        h = conv[0].register_forward_hook(lambda m, inp, out: calls.append("fwd"))
        hp = conv[0].register_forward_pre_hook(lambda m, inp: calls.append("pre"))
        back = sbt.revert_sync_batchnorm(conv)
        self.assertIs(type(back[0]), BasicBlock)
        x = torch.randn(2, 4, 5, 5)
        back(x)
        self.assertEqual(calls, ["pre", "fwd"])
        h.remove()
        back(x)
        self.assertEqual(calls, ["pre", "fwd", "pre"])
        hp.remove()
        back(x)
        self.assertEqual(calls, ["pre", "fwd", "pre"])
        self.assertTrue(sbt._no_hooks(back[0]))
        conv = sbt.convert_fused(nn.Sequential(BasicBlock(4, 4)), comm=self.comm)
        grads = []
        conv[0].register_full_backward_hook(lambda m, gin, gout: grads.append(gout[0].shape))
        back = sbt.revert_sync_batchnorm(conv)
        back(x.requires_grad_()).sum().backward()
        self.assertEqual(grads, [x.shape])

    def test_block_relu_hooked_after_conversion(self):
        """A hook registered on a fused block's ReLU after convert_fused (an activation clip,
        a feature extractor's) runs as on the original block, each time the block applies
        its ReLU, and sees what it saw there: the block then runs torchvision's way, each
        batch norm alone (the last one's residual added after it) and the ReLU module on
        its output. Before, the ReLU child was never called, its hook never ran and the
        clipped model differed. Against the float64 original with the same hooks, a
        BasicBlock (its ReLU twice) and a Bottleneck (three times); with the hooks removed
        the block is fused again; a global forward hook sees the ReLU's calls too."""
        torch.manual_seed(4)
        model = resnet_like()
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        self.assertIsInstance(conv[3], sbt.FusedBasicBlock)
        self.assertIsInstance(conv[5], sbt.FusedBottleneck)

        def clipped(m, calls):
            def pre(module, inputs):
                calls.append(float(inputs[0].min()))  # the ReLU's input: the batch norm's (+ residual)

            def hook(module, inputs, output):
                return output.clamp(max=0.5)
            return [h for n in ("3.relu", "5.relu") for h in (m.get_submodule(n).register_forward_pre_hook(pre),
                                                               m.get_submodule(n).register_forward_hook(hook))]

        calls_ref, calls = [], []
        clipped(model, calls_ref)
        handles = clipped(conv, calls)
        x = torch.randn(4, 3, 8, 8)
        converted_matches(self, model, x, conv, input_grad=True)
        self.assertEqual(len(calls), len(calls_ref))
        self.assertEqual(len(calls), 3 * (2 + 3))  # two training steps and eval, 2 + 3 ReLU calls each
        self.assertLess(min(calls), 0.0)  # (before the ReLU)
        for h in handles:
            h.remove()
        self.assertIsNone(conv[3]._hooked_relu())  # fused again
        seen = []
        relu = conv[3].relu
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda m, i, o: seen.append(m) if m is relu else None)
        try:
            self.assertIs(conv[3]._hooked_relu(), relu)
            conv(x)
        finally:
            handle.remove()
        self.assertEqual(len(seen), 2)
        # a batch norm inside a wrapper put in its place applies its ReLU itself: the hook
        # then runs at none of the block's ReLUs (not at the others only)
        calls = []
        conv[5]._modules["bn2"] = Calls(conv[5].bn2)
        clipped(conv, calls)
        self.assertIsNotNone(conv[3]._hooked_relu())
        self.assertIsNone(conv[5]._hooked_relu())
        conv(x)
        self.assertEqual(len(calls), 2)  # the BasicBlock's two

    def test_blocks_whose_class_or_hooks_fusing_would_drop(self):
        """What a fused block would not keep stops or follows the fusing, as for batch
        norms: a torchvision block of a class that defines a method of nn.Module's protocol
        (a train() that keeps its first batch norm frozen in eval, a state_dict loader of
        its own) is left alone, its batch norms converted, and trains as the original; a
        block with a state_dict or load_state_dict hook is fused and keeps the hook: a
        checkpoint with the hook's old key names loads into the converted model as into the
        original, and the hook's extra key is in its state_dict (a ConvModule's:
        TestConvModule's test_state_dict_hooks_kept); an
        nn.Sequential subclass whose __iter__ skips children (Sequential.forward runs
        what it gives) is not fused. Before, the first two were fused and lost them (bn1
        trained; the checkpoint loaded nothing), and the Sequential's skipped ReLU ran in
        its batch norm."""

        class FrozenFirst(BasicBlock):
            def train(self, mode=True):
                super().train(mode)
                self.bn1.eval()
                return self

        class LegacyKeys(BasicBlock):
            def _load_from_state_dict(self, state_dict, prefix, *args):
                for k in [k for k in state_dict if k.startswith(prefix + "norm1.")]:
                    state_dict[prefix + "bn1." + k[len(prefix + "norm1."):]] = state_dict.pop(k)
                super()._load_from_state_dict(state_dict, prefix, *args)

        torch.manual_seed(6)
        model = nn.Sequential(nn.Conv2d(3, 4, 1), FrozenFirst(4, 4), LegacyKeys(4, 4)).train()
        self.assertFalse(model[1].bn1.training)
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        self.assertEqual([type(m) for m in conv], [nn.Conv2d, FrozenFirst, LegacyKeys])
        # what Python puts in a class's namespace is no method of the protocol (3.14 puts an
        # annotated class body's __annotate_func__ there, a function: torchvision's blocks
        # annotate expansion)
        annotated = type("Annotated", (BasicBlock,), {"__annotate_func__": lambda format: {"expansion": int},
                                                      "__annotations_cache__": {}})
        as_on_314 = sbt._MODULE_PROTOCOL | {"__annotate_func__", "__annotations_cache__"}  # (nn.Module's too there)
        self.assertEqual(sbt._protocol_overrides(annotated(4, 4), as_on_314), [])
        self.assertEqual(sbt._protocol_overrides(FrozenFirst(4, 4), as_on_314), ["train"])
        self.assertIsInstance(sbt.convert_fused(nn.Sequential(annotated(4, 4)), comm=self.comm)[0],
                              sbt.FusedBasicBlock)
        self.assertIsInstance(conv[1].bn1, sbt.SyncBatchNorm)
        conv.eval().train()
        self.assertFalse(conv[1].bn1.training)
        converted_matches(self, model, torch.randn(4, 3, 6, 6), conv, input_grad=True)

        old = legacy_checkpoint(conv[2], "bn1")
        conv[2].load_state_dict(old)  # (the class's own loader: the block left alone)
        self.assertTrue(torch.equal(conv[2].bn1.weight, old["norm1.weight"]))
        fused = sbt.convert_fused(nn.Sequential(legacy_state_dict_hooks(BasicBlock(4, 4), "bn1")), comm=self.comm)[0]
        self.assertIsInstance(fused, sbt.FusedBasicBlock)
        self.assertIn("tag", fused.state_dict())
        old = legacy_checkpoint(fused, "bn1")
        fused.load_state_dict(old)
        self.assertTrue(torch.equal(fused.bn1.weight, old["norm1.weight"]))

        class Switchable(nn.Sequential):
            def __init__(self, *mods, off=()):
                super().__init__(*mods)
                self.off = set(off)

            def __iter__(self):
                return (m for i, m in enumerate(self._modules.values()) if i not in self.off)

        model = Switchable(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1), off={2})
        randomize_bn(model)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        self.assertIs(type(conv[2]), nn.ReLU)
        converted_matches(self, model, torch.randn(4, 3, 5, 5), conv, input_grad=True)

    def test_reverted_epilogues_convert_back(self):
        """revert_sync_batchnorm then convert_sync_batchnorm gives back each layer's
        activation (a BatchNormXd's epilogue is a syncbn layer's, the same function);
        a BatchNormXd whose leaky slope syncbn does not take is refused, naming it, before
        any layer changes."""
        torch.manual_seed(12)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), sbt.SyncBatchNorm(4, comm=self.comm, activation="relu"),
                              nn.Conv2d(4, 4, 1), sbt.SyncBatchNorm(4, comm=self.comm, activation="leaky_relu",
                                                                    slope=0.2),
                              nn.Conv2d(4, 4, 1), sbt.SyncBatchNorm(4, comm=self.comm)).eval()
        randomize_bn(model)
        x = torch.randn(2, 3, 8, 8)
        with torch.no_grad():
            want = model(x)
        back = sbt.revert_sync_batchnorm(model)
        self.assertEqual([(m.activation, m.slope) for m in back if isinstance(m, sbt.BatchNormXd)],
                         [("relu", 0.01), ("leaky_relu", 0.2), ("identity", 0.01)])
        again = sbt.convert_sync_batchnorm(back, comm=self.comm)
        self.assertEqual([(type(m), m.activation, m.slope) for m in again if isinstance(m, nn.SyncBatchNorm)],
                         [(sbt.SyncBatchNorm, "relu", 0.01), (sbt.SyncBatchNorm, "leaky_relu", 0.2),
                          (sbt.SyncBatchNorm, "identity", 0.01)])
        with torch.no_grad():
            torch.testing.assert_close(again(x), want, rtol=0, atol=0)
        bad = nn.Sequential(nn.BatchNorm2d(3), sbt.BatchNormXd(3, activation="leaky_relu", slope=-1.0),
                            sbt.BatchNormXd(3, activation="relu", slope=-1.0))  # a ReLU's slope is not used
        with self.assertRaisesRegex(ValueError, r"layer '1' applies a leaky ReLU of slope -1.0.*nothing was converted"):
            sbt.convert_sync_batchnorm(bad, comm=self.comm)
        self.assertEqual([type(m) for m in bad], [nn.BatchNorm2d, sbt.BatchNormXd, sbt.BatchNormXd])
        del bad[1]
        self.assertEqual(sbt.convert_sync_batchnorm(bad, comm=self.comm)[1].activation, "relu")


def own_batch_norm(m, x):
    """F.batch_norm with batch norm m's tensors and settings: the forward of the classes
    below that write their own (as detectron2's, apex's and PyTorch-Encoding's do)."""
    return F.batch_norm(x, m.running_mean, m.running_var, m.weight, m.bias, m.training, m.momentum, m.eps)


class BatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d layout (timm.layers.norm_act, whose forward is
    torch.nn.BatchNorm2d's then self.drop then self.act): a BatchNorm2d subclass with the
    child modules drop and act, applied after it in that order."""

    def __init__(self, num_features, act, drop=None, **kw):
        super().__init__(num_features, **kw)
        self.drop = nn.Identity() if drop is None else drop
        self.act = act
        self.kept = "an attribute of its own"

    def forward(self, x):
        return self.act(self.drop(super().forward(x)))


class BatchNormProj(nn.BatchNorm2d):
    """A batch norm with a child its forward applies that is not timm's drop / act."""

    def __init__(self, num_features):
        super().__init__(num_features)
        self.proj = nn.Conv2d(num_features, num_features, 1)

    def forward(self, x):
        return self.proj(super().forward(x))


class BatchNormScaled(nn.BatchNorm2d):
    """A batch norm with a buffer of its own, which its forward uses."""

    def __init__(self, num_features):
        super().__init__(num_features)
        self.register_buffer("scale", torch.full((num_features,), 2.0))

    def forward(self, x):
        return super().forward(x) * self.scale.view(1, -1, 1, 1)


class BatchNormMasked(nn.BatchNorm1d):
    """A batch norm whose forward takes a second tensor (a mask), not a residual."""

    def forward(self, x, mask):
        return super().forward(x) * mask


class BatchNormDropOnly(nn.BatchNorm2d):
    """timm's layout with a drop child and no act (a plain attribute of None)."""

    def __init__(self, num_features):
        super().__init__(num_features)
        self.drop = nn.Identity()
        self.act = None

    def forward(self, x):
        x = self.drop(super().forward(x))
        return x if self.act is None else self.act(x)


class BatchNormDropRate(nn.BatchNorm2d):
    """An act child and a drop that is a rate, not a module (its forward applies dropout)."""

    def __init__(self, num_features):
        super().__init__(num_features)
        self.drop = 0.5
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(F.dropout(super().forward(x), self.drop, self.training))


class BatchNormEqual(nn.BatchNorm1d):
    """Equal by value (named_modules' memo would take two such layers for one)."""

    def __eq__(self, other):
        return type(other) is type(self) and other.num_features == self.num_features

    def __hash__(self):
        return hash(self.num_features)


class BatchNormNamed(nn.BatchNorm1d):
    """Methods of its own that are not the module protocol's (object's dunders)."""

    def __str__(self):
        return "named"

    def __eq__(self, other):
        return self is other

    __hash__ = nn.BatchNorm1d.__hash__


class FrozenBatchNorm(nn.BatchNorm2d):
    """A batch norm that stays in eval (a detector's frozen backbone): its own train()."""

    def train(self, mode=True):
        return super().train(False)


class NaiveSyncBatchNorm(nn.BatchNorm1d):
    """detectron2's layout: its own forward, synchronized batch norm (here: a team of one,
    so the batch's own statistics), no children."""

    def forward(self, x):
        return own_batch_norm(self, x)


class SynchronizedBatchNorm2d(nn.modules.batchnorm._BatchNorm):
    """Synchronized-BatchNorm-PyTorch's layout (vacancy's, vendored by many repositories):
    its own forward, which synchronizes the replicas of a DataParallelWithCallback, which
    calls the layer's __data_parallel_replicate__ (here: the batch's own statistics)."""

    def forward(self, input):
        return own_batch_norm(self, input)

    def __data_parallel_replicate__(self, ctx, copy_id):
        pass


class ApexSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """apex.parallel.SyncBatchNorm's interface: forward(input, z=None), relu(bn(input) + z)
    with fuse_relu, channels in the last dim with channel_last."""

    def __init__(self, num_features, channel_last=False, fuse_relu=False):
        super().__init__(num_features)
        self.channel_last, self.fuse_relu = channel_last, fuse_relu

    def forward(self, input, z=None):
        y = own_batch_norm(self, input)
        return F.relu(y + z) if self.fuse_relu else y


ApexSyncBatchNorm.__module__ = "apex.parallel.optimized_sync_batchnorm"


class BatchNorm2d_NHWC(nn.modules.batchnorm._BatchNorm):
    """apex's groupbn layer's interface: forward(x, z=None) on x of shape (N, H, W, C),
    relu(bn(x) + z) with fuse_relu."""

    def __init__(self, num_features, fuse_relu=False):
        super().__init__(num_features)
        self.fuse_relu = fuse_relu

    def forward(self, x, z=None):
        y = own_batch_norm(self, x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return F.relu(y + z) if z is not None else y


BatchNorm2d_NHWC.__module__ = "apex.contrib.groupbn.batch_norm"


class EncodingSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """PyTorch-Encoding's SyncBatchNorm interface: activation "none" or "leaky_relu" (applied
    in training only)."""

    def __init__(self, num_features, activation="none"):
        super().__init__(num_features)
        self.activation = activation

    def forward(self, input):
        y = own_batch_norm(self, input)
        return F.leaky_relu(y, 0.01) if self.training and self.activation == "leaky_relu" else y


EncodingSyncBatchNorm.__module__ = "encoding.nn.syncbn"


def bn_act_model():
    """Conv + BatchNormAct pairs: the acts convert_fused fuses (ReLU in place or not, a
    leaky ReLU in place) and those it leaves (SiLU, a PReLU with parameters, a leaky ReLU
    not in place: it keeps its input where the fused layer keeps its output)."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), BatchNormAct(8, nn.ReLU(inplace=True)),
        nn.Conv2d(8, 8, 1), BatchNormAct(8, nn.SiLU()),
        nn.Conv2d(8, 8, 1), BatchNormAct(8, nn.LeakyReLU(0.1, inplace=True)),
        nn.Conv2d(8, 8, 1), BatchNormAct(8, nn.PReLU(8)),
        nn.Conv2d(8, 8, 1), BatchNormAct(8, nn.LeakyReLU(0.2), momentum=None),
        nn.Conv2d(8, 8, 1), BatchNormAct(8, nn.ReLU()),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))


class TestBatchNormAct(TeamOfOne):
    """Batch norms that apply child modules after themselves (timm's BatchNormAct2d: drop,
    then act; timm's models use it throughout, and segmentation_models_pytorch's timm
    encoders). The converters made them plain SyncBatchNorms, which dropped the activation
    without a word (as PyTorch's converter does); now they become SyncBatchNormAct layers,
    which keep the children (the same modules: the same function and state_dict keys), and
    a batch norm with any other child is refused before anything changes."""

    ACTS = [nn.ReLU, nn.SiLU, nn.LeakyReLU, nn.PReLU, nn.LeakyReLU, nn.ReLU]
    _matches = TestConvert._matches

    def _model(self):
        torch.manual_seed(11)
        model = bn_act_model()
        randomize_bn(model)
        return model, torch.randn(2, 3, 6, 6)

    def test_converted_keeps_the_activations(self):
        model, x = self._model()
        conv = sbt.convert_sync_batchnorm(copy.deepcopy(model), comm=self.comm)
        layers = [m for m in conv.modules() if isinstance(m, sbt.SyncBatchNorm)]
        self.assertEqual([type(m) for m in layers], [sbt.SyncBatchNormAct] * 6)
        self.assertEqual([type(m.act) for m in layers], self.ACTS)
        self.assertFalse(fused_layers(conv))  # the activations run as their modules
        self.assertEqual(list(conv.state_dict().keys()), list(model.state_dict().keys()))  # act.weight too
        conv.load_state_dict(model.state_dict())  # strict: the original's checkpoint loads
        self._matches(model, x, conv)

    def test_fused_and_reverted(self):
        """convert_fused fuses the ReLUs and the leaky ReLU in place (FusedActivation in the
        act slot), not the others; the model is the original's, training and eval.
        revert_sync_batchnorm gives back the original class, its attributes and its act
        modules (the same PReLU), with the trained tensors."""
        model, x = self._model()
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        self.assertEqual(fused_layers(conv), [("1", "relu", False), ("5", "leaky_relu", False),
                                              ("11", "relu", False)])
        self.assertEqual([type(m.act) for m in conv.modules() if isinstance(m, sbt.SyncBatchNormAct)],
                         [sbt.FusedActivation, nn.SiLU, sbt.FusedActivation, nn.PReLU, nn.LeakyReLU,
                          sbt.FusedActivation])
        self.assertEqual(list(conv.state_dict().keys()), list(model.state_dict().keys()))
        self._matches(model, x, conv)
        prelu = conv[7].act
        back = sbt.revert_sync_batchnorm(copy.deepcopy(conv))
        back_prelu_is_copy = back[7].act is not prelu  # (a deepcopy)
        self.assertTrue(back_prelu_is_copy)
        for (n, a), (n2, b) in zip(model.named_modules(), back.named_modules()):
            self.assertEqual(n, n2)
            self.assertIs(type(b), type(a), n)
        self.assertEqual([b.act.inplace for b in back if isinstance(b, BatchNormAct) and hasattr(b.act, "inplace")],
                         [True, False, True, False, False])
        self.assertEqual(back[1].kept, "an attribute of its own")
        self.assertEqual(back[9].momentum, None)
        self.assertEqual(list(back.state_dict().keys()), list(model.state_dict().keys()))
        for k, v in conv.state_dict().items():
            self.assertTrue(torch.equal(back.state_dict()[k], v), k)
        with torch.no_grad():
            torch.testing.assert_close(back(x), conv(x), rtol=3e-5, atol=3e-5)  # eval: the same formula
        # the reverted model converts again, to the same layers
        again = sbt.convert_fused(back, comm=self.comm)
        self.assertEqual(fused_layers(again), fused_layers(conv))
        # relu_as_leaky: the fused ReLUs become leaky ReLUs, reverted as nn.LeakyReLU
        leaky = sbt.revert_sync_batchnorm(sbt.convert_fused(copy.deepcopy(model), comm=self.comm,
                                                            relu_as_leaky=0.05))
        self.assertEqual([(type(b.act), getattr(b.act, "negative_slope", None)) for b in leaky
                          if isinstance(b, BatchNormAct)],
                         [(nn.LeakyReLU, 0.05), (nn.SiLU, None), (nn.LeakyReLU, 0.1), (nn.PReLU, None),
                          (nn.LeakyReLU, 0.2), (nn.LeakyReLU, 0.05)])

    def test_in_place(self):
        """convert_fused(inplace=True): the layers that took a leaky ReLU go in place (autograd
        keeps their output); the results are the original's."""
        model, x = self._model()
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm, inplace=True, relu_as_leaky=0.01)
        self.assertEqual(fused_layers(conv), [("1", "leaky_relu", True), ("5", "leaky_relu", True),
                                              ("11", "leaky_relu", True)])
        for i in (1, 11):
            model[i].act = nn.LeakyReLU(0.01, inplace=True)
        self._matches(model, x, conv)

    def test_children_of_none_and_equal_layers(self):
        """A layer of timm's layout with a drop child and act None (a plain attribute): a
        SyncBatchNormAct without an act, reverted to its class with act None again (the
        same module tree), each giving the original's output. Two layers equal by value
        (named_modules would visit one): both converted."""
        torch.manual_seed(16)
        x = torch.randn(3, 4, 5, 5)
        model = nn.Sequential(BatchNormDropOnly(4))
        want = copy.deepcopy(model).double()(x.double())
        conv = sbt.convert_sync_batchnorm(copy.deepcopy(model), comm=self.comm)
        self.assertIs(type(conv[0]), sbt.SyncBatchNormAct)
        self.assertIsNone(conv[0].act)
        torch.testing.assert_close(conv(x).double(), want, rtol=1e-4, atol=1e-4)
        back = sbt.revert_sync_batchnorm(conv)
        self.assertIs(type(back[0]), BatchNormDropOnly)
        self.assertIsNone(back[0].act)
        self.assertEqual([n for n, _ in back.named_modules()], [n for n, _ in model.named_modules()])
        back.train()
        torch.testing.assert_close(back(x).double(), want, rtol=1e-4, atol=1e-4)
        pair = nn.Sequential(BatchNormEqual(4), BatchNormEqual(4))
        self.assertEqual(len(list(pair.modules())), 2)  # the memo's count: one of the two
        conv = sbt.convert_sync_batchnorm(pair, comm=self.comm)
        self.assertEqual([type(m) for m in conv], [sbt.SyncBatchNorm] * 2)

    def test_own_layers_and_their_epilogue(self):
        """A SyncBatchNormAct made as syncbn's, with an activation of its own (its epilogue
        runs before drop and act): reverted to a BatchNormActXd with that epilogue and the
        children, which converts back to the same layer; each gives the float64 formula
        act(drop(relu(bn(x))))."""
        torch.manual_seed(12)
        layer = sbt.SyncBatchNormAct(4, comm=self.comm, activation="relu", act=nn.Tanh())
        x = torch.randn(3, 4, 5)
        want = torch.tanh(F.relu(F.batch_norm(x.double(), None, None, training=True, eps=1e-5)))
        torch.testing.assert_close(layer(x).double(), want, rtol=1e-4, atol=1e-4)
        # an identity after it in a Sequential does not take its activation: that runs
        # before the layer's own act, not after it
        back = sbt.revert_sync_batchnorm(nn.Sequential(layer, nn.Identity()))
        self.assertIs(type(back[1]), nn.Identity)
        torch.testing.assert_close(back(x).double(), want, rtol=1e-4, atol=1e-4)
        self.assertIs(type(back[0]), sbt.BatchNormActXd)
        self.assertEqual((back[0].activation, type(back[0].act)), ("relu", nn.Tanh))
        torch.testing.assert_close(back[0](x).double(), want, rtol=1e-4, atol=1e-4)
        again = sbt.convert_sync_batchnorm(back, comm=self.comm)
        self.assertIs(type(again[0]), sbt.SyncBatchNormAct)
        self.assertEqual((again[0].activation, type(again[0].act)), ("relu", nn.Tanh))
        torch.testing.assert_close(again[0](x).double(), want, rtol=1e-4, atol=1e-4)

    def test_traced(self):
        """torch.fx: one node per layer (a call of it: its act inside), not the act twice."""
        model, x = self._model()
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        gm = torch.fx.symbolic_trace(conv)
        calls = [n.target for n in gm.graph.nodes if n.op == "call_module"]
        self.assertFalse([t for t in calls if t.endswith(".act") or t.endswith(".drop")], calls)
        a, b = copy.deepcopy(conv), copy.deepcopy(gm)
        torch.testing.assert_close(b(x), a(x), rtol=0, atol=0)

    def test_fused_with_hooks_and_twice(self):
        """A SyncBatchNormAct with hooks, or used twice, is fused too: its output,
        act(drop(bn(x))), is the same either way (a hook on it sees the activation's output,
        as on the original); one whose act has a hook is not (the hook sees act's input)."""
        torch.manual_seed(15)
        a, b = BatchNormAct(4, nn.ReLU(inplace=True)), BatchNormAct(4, nn.ReLU())
        seen = []
        a.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
        b.act.register_forward_hook(lambda m, i, o: None)
        model = nn.Sequential(a, nn.Conv2d(4, 4, 1), a, b)
        randomize_bn(model)
        x = torch.randn(2, 4, 5, 5)
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        self.assertEqual(fused_layers(conv), [("0", "relu", False)])
        self.assertIs(type(conv[3].act), nn.ReLU)
        seen.clear()
        self._matches(model, x, conv, steps=1)
        self.assertTrue(seen and all(float(o.min()) >= 0 for o in seen))  # the ReLU's output

    def test_what_is_refused(self):
        """A batch norm whose conversion would lose what it does: a ValueError naming the
        layer and what it would lose, and the model unchanged (either converter). A child its
        forward applies other than drop and act (timm's SplitBatchNorm2d's aux_bn); a buffer
        beside a batch norm's (a quantized batch norm's scale and zero_point); a train() of
        its class (a batch norm kept frozen); a forward set on the layer; apex's channel_last,
        apex's groupbn (its input (N, H, W, C)) and PyTorch-Encoding's activation in training
        only."""
        torch.manual_seed(13)
        scaled = BatchNormScaled(4)
        patched = nn.BatchNorm2d(4)
        patched.forward = lambda x: x * 2
        param = nn.BatchNorm2d(4)
        torch.nn.utils.parametrize.register_parametrization(param, "weight", nn.Softplus())
        cases = [(BatchNormDropRate(4), r"'drop' \(0.5\) that is not a module"), (BatchNormProj(4), r"\('proj'\)"), (scaled, r"holds 'scale'"), (FrozenBatchNorm(4), r"'train'"),
                 (patched, "a forward set on the layer itself"), (BatchNormMasked(4), r"\(x, mask\).*as a residual"),
                 (param, "parametrized"),
                 (ApexSyncBatchNorm(4, channel_last=True), r"channel_last=True"),
                 (BatchNorm2d_NHWC(4), r"\(N, H, W, C\) \(apex's groupbn\)"),
                 (BatchNorm2d_NHWC(4, fuse_relu=True), r"\(N, H, W, C\)"),
                 (EncodingSyncBatchNorm(4, activation="leaky_relu"), r"'leaky_relu' in training only")]
        for layer, why in cases:
            model = nn.Sequential(nn.BatchNorm2d(4), nn.Sequential(layer))
            for conv in (sbt.convert_sync_batchnorm, sbt.convert_fused):
                with self.assertRaisesRegex(ValueError, rf"layer '1.0' \({type(layer).__name__}\).*{why}.*nothing "
                                                        r"was converted"):
                    conv(model, comm=self.comm)
                self.assertIs(type(model[0]), nn.BatchNorm2d)
                self.assertIs(model[1][0], layer)

    def test_what_converts_as_it_runs(self):
        """Converted, with the function kept: a class of its own forward and no children
        (detectron2's NaiveSyncBatchNorm, whose forward is synchronized batch norm); a batch
        norm with torch.nn's forward and drop and act children it never applies (what
        PyTorch's converter makes of timm's BatchNormAct2d): a plain layer, the children
        unused still; apex's SyncBatchNorm with fuse_relu: forward(x, z) = relu(bn(x) + z),
        the layer's epilogue; PyTorch-Encoding's without an activation; Synchronized-
        BatchNorm-PyTorch's, with a RuntimeWarning (it synchronized nn.DataParallel's
        replicas). Each against float64 PyTorch."""
        torch.manual_seed(14)
        x, z = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
        want = F.batch_norm(x.double(), None, None, training=True, eps=1e-5)
        inert = nn.SyncBatchNorm(4)
        inert.drop, inert.act = nn.Identity(), nn.ReLU()
        # said with a RuntimeWarning (the activation PyTorch's converter dropped), and
        # still inert after a revert and a conversion again (a BatchNormXd holding them)
        with self.assertWarnsRegex(RuntimeWarning, r"'0' hold 'drop' / 'act' modules that their forward") as cm:
            once = sbt.convert_sync_batchnorm(nn.Sequential(copy.deepcopy(inert)), comm=self.comm)
        self.assertEqual(cm.filename, __file__)  # said at the caller's line
        with self.assertWarnsRegex(RuntimeWarning, "never applies") as cm:
            sbt.convert_fused(nn.Sequential(copy.deepcopy(inert)), comm=self.comm)
        self.assertEqual(cm.filename, __file__)
        with self.assertWarnsRegex(RuntimeWarning, "never applies"):
            again = sbt.convert_sync_batchnorm(sbt.revert_sync_batchnorm(once), comm=self.comm)
        for conv in (once, again):
            self.assertIs(type(conv[0]), sbt.SyncBatchNorm)
            torch.testing.assert_close(conv(x).double(), want, rtol=1e-4, atol=1e-4)
        for layer, call, ref in [(NaiveSyncBatchNorm(4), (x,), want),
                                 (BatchNormNamed(4), (x,), want),
                                 (ApexSyncBatchNorm(4, fuse_relu=True), (x, z), F.relu(want + z.double())),
                                 (ApexSyncBatchNorm(4), (x,), want),
                                 (EncodingSyncBatchNorm(4, activation="none"), (x,), want)]:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # converted without a word
                conv = sbt.convert_sync_batchnorm(nn.Sequential(layer), comm=self.comm)[0]
            self.assertIs(type(conv), sbt.SyncBatchNorm, type(layer).__name__)
            torch.testing.assert_close(conv(*call).double(), ref, rtol=1e-4, atol=1e-4, msg=type(layer).__name__)
        self.assertEqual(list(conv.state_dict().keys()), list(layer.state_dict().keys()))
        # a layer that synchronizes nn.DataParallel's replicas: said, as the converted one
        # synchronizes a process group's ranks instead
        with self.assertWarnsRegex(RuntimeWarning, r"'0' \(SynchronizedBatchNorm2d\) synchronize the replicas of a "
                                                   r"DataParallelWithCallback.*DistributedDataParallel") as cm:
            conv = sbt.convert_sync_batchnorm(nn.Sequential(SynchronizedBatchNorm2d(4)), comm=self.comm)[0]
        self.assertEqual(cm.filename, __file__)
        self.assertIs(type(conv), sbt.SyncBatchNorm)
        torch.testing.assert_close(conv(x).double(), want, rtol=1e-4, atol=1e-4)


class TestFX(TeamOfOne):
    """torch.fx symbolic tracing (symbolic_trace, torchvision's create_feature_extractor,
    torch.ao's prepare_fx) of a converted model: each syncbn layer is one node, a
    call_module node as torch.nn's batch norms are (the tracer's leaf modules) where it
    computes a batch norm, a call of the layer where it adds a residual or applies an
    activation; so the traced module holds the layers and runs their Python (train or
    eval, the team) when it runs; a fused block is traced through, its residual's
    conversion one call_function node. The traced module gives the model's outputs and
    gradients bitwise, train and eval."""

    def _traces(self, model, x):
        gm = torch.fx.symbolic_trace(model)
        layers = layer_nodes(gm)
        self.assertEqual(len(layers), 15)
        for target, form, nargs in layers:
            norm_only = nargs == 1 and getattr(gm.get_submodule(target), "activation", "identity") == "identity"
            self.assertEqual(form, "module" if norm_only else "call", target)
        self.assertEqual(sum(p.numel() for p in gm.parameters()), sum(p.numel() for p in model.parameters()))
        a, b = copy.deepcopy(model), copy.deepcopy(gm)
        for mode in ("train", "eval"):
            getattr(a, mode)()
            getattr(b, mode)()
            ya, yb = a(x), b(x)
            self.assertTrue(torch.equal(ya, yb), mode)
        a.train()
        b.train()
        a(x).square().sum().backward()
        b(x).square().sum().backward()
        # by name: the traced module holds its submodules in the order the graph uses them
        grads, bufs = {n: p.grad for n, p in b.named_parameters()}, dict(b.named_buffers())
        self.assertEqual(sorted(grads), sorted(n for n, _ in a.named_parameters()))
        for n, p in a.named_parameters():
            self.assertTrue(torch.equal(p.grad, grads[n]), n)
        for n, p in a.named_buffers():
            self.assertTrue(torch.equal(p, bufs[n]), n)
        return gm

    def test_converted_fused_and_reverted(self):
        torch.manual_seed(8)
        model = resnet_like()
        randomize_bn(model)
        x = torch.randn(2, 3, 8, 8)
        self._traces(sbt.convert_sync_batchnorm(copy.deepcopy(model), comm=self.comm), x)
        gm = self._traces(sbt.convert_fused(copy.deepcopy(model), comm=self.comm), x)
        self.assertIn(_fused.residual_like, [n.target for n in gm.graph.nodes if n.op == "call_function"])
        self._traces(sbt.revert_sync_batchnorm(sbt.convert_fused(copy.deepcopy(model), comm=self.comm)), x)

    def test_hooked_layers_and_the_root(self):
        """A layer with a forward hook: the hook runs once in the traced module, as in the
        model (the tracer ran it as it called the layer, so the layer's node is a call of
        its forward, without hooks). The layer itself as the traced module: a TypeError."""
        torch.manual_seed(9)
        model = sbt.convert_fused(resnet_like(), comm=self.comm)
        model[1].register_forward_hook(lambda m, inp, out: out * 2)
        model[6].bn3.register_forward_pre_hook(lambda m, args: (args[0] * 0.5, *args[1:]))
        x = torch.randn(2, 3, 8, 8)
        gm = torch.fx.symbolic_trace(model)
        a, b = copy.deepcopy(model), copy.deepcopy(gm)
        for mode in ("train", "eval"):
            getattr(a, mode)()
            getattr(b, mode)()
            self.assertTrue(torch.equal(a(x), b(x)), mode)
        with self.assertRaisesRegex(TypeError, "cannot be the traced module itself"):
            torch.fx.symbolic_trace(sbt.SyncBatchNorm(4, comm=self.comm))

    def test_mutant_traced_through(self):
        """Without the layer's call_module node (its forward traced like any module's), the
        trace fails on the layer's checks of its input: what this class's tests catch."""
        model = sbt.convert_sync_batchnorm(resnet_like(), comm=self.comm)
        real = sbt._fx_leaf
        sbt._fx_leaf = lambda *args, **kwargs: None
        try:
            with self.assertRaises(torch.fx.proxy.TraceError):
                torch.fx.symbolic_trace(model)
        finally:
            sbt._fx_leaf = real


@contextlib.contextmanager
def graph_unseen():
    """The mutant of TestExport's tests: an evaluated layer that never sees PyTorch make a
    graph (sbt._graphed always False), so it records syncbn's inference operator."""
    real = sbt._graphed
    sbt._graphed = lambda plain: False
    try:
        yield
    finally:
        sbt._graphed = real


class TestExport(TeamOfOne):
    """An evaluated model exported for where syncbn is not (torch.export, strict or not: the
    start of AOTInductor, ExecuTorch and TensorRT; a TorchScript trace; ONNX, both
    exporters, where onnx is installed, as in CI): its graph holds
    PyTorch's batch norm (and the fused layers' add and activation), no syncbn operator, as
    nn.SyncBatchNorm's evaluated model does, and gives the model's outputs within fp32
    rounding: the same formula, (x - mean) * weight / sqrt(var + eps) + bias, in another
    order of operations (a few ulp of values of order 10: 2e-5). A model in training mode
    exports its collective, syncbn's operator."""

    def _model(self, fused):
        torch.manual_seed(10)
        model = resnet_like()
        randomize_bn(model)
        conv = sbt.convert_fused if fused else sbt.convert_sync_batchnorm
        return conv(model, comm=self.comm)

    def _exports_without_syncbn(self, model, x):
        model.eval()
        want = model(x)
        for strict in (False, True):
            ep = torch.export.export(model, (x,), strict=strict)
            ops = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
            self.assertEqual({o for o in ops if "syncbn" in o}, set(), f"strict={strict}")
            # aten.batch_norm (PyTorch 2.15), or its decomposition (2.4:
            # _native_batch_norm_legit_no_training)
            self.assertTrue([o for o in ops if o.startswith("aten.") and "batch_norm" in o], (strict, ops))
            torch.testing.assert_close(ep.module()(x), want, rtol=2e-5, atol=2e-5, msg=f"strict={strict}")
        traced = torch.jit.trace(model, x, check_trace=False)
        kinds = {n.kind() for n in traced.inlined_graph.nodes()}
        self.assertEqual({k for k in kinds if k.startswith("syncbn::")}, set())
        self.assertIn("aten::batch_norm", kinds)
        torch.testing.assert_close(traced(x), want, rtol=2e-5, atol=2e-5)

    def _onnx_without_syncbn(self, model, x):
        """torch.onnx.export, both exporters (TorchScript-based: a trace; dynamo: torch.export):
        a checked ONNX model of standard operators, none of syncbn's domain."""
        import io

        import onnx

        model.eval()
        for dynamo in (False, True):
            if dynamo:
                proto = torch.onnx.export(model, (x,), dynamo=True).model_proto
            else:
                buf = io.BytesIO()
                torch.onnx.export(model, (x,), buf, dynamo=False)
                proto = onnx.load_from_string(buf.getvalue())
            onnx.checker.check_model(proto)
            self.assertEqual({n.domain for n in proto.graph.node} - {"", "ai.onnx"}, set(), f"dynamo={dynamo}")
            self.assertIn("Conv", {n.op_type for n in proto.graph.node}, f"dynamo={dynamo}")

    def test_onnx(self):
        try:
            import onnx  # noqa: F401
            import onnxscript  # noqa: F401 (the dynamo exporter's)
        except ImportError:
            self.skipTest("onnx and onnxscript are not installed (CI's python step installs them)")
        for fused in (False, True):
            with self.subTest(fused=fused):
                self._onnx_without_syncbn(self._model(fused), torch.randn(2, 3, 8, 8))
        # the mutant that does not see the export: the exporters fail on syncbn's operator
        with graph_unseen(), self.assertRaises(Exception):  # noqa: B017: the exporters' own errors
            self._onnx_without_syncbn(self._model(True), torch.randn(2, 3, 8, 8))

    def test_eval_exports_pytorch_batch_norm(self):
        x = torch.randn(2, 3, 8, 8)
        for fused in (False, True):
            with self.subTest(fused=fused):
                self._exports_without_syncbn(self._model(fused), x)

    def _compiled_eval_ops(self, model, x):
        """The operators of the graph torch.compile (fullgraph) makes of the evaluated model,
        and its output against eager's (fp32 rounding, as above)."""
        ops = set()

        def backend(gm, example_inputs):
            ops.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
            return gm

        model.eval()
        torch._dynamo.reset()
        try:
            with torch.no_grad():
                y = torch.compile(model, backend=backend, fullgraph=True)(x)
                torch.testing.assert_close(y, model(x), rtol=2e-5, atol=2e-5)
        finally:
            torch._dynamo.reset()
        return ops

    def test_compiled_eval_is_pytorch_batch_norm(self):
        """torch.compile of an evaluated model: PyTorch's batch norm in the graph, as
        nn.SyncBatchNorm's (inductor then fuses it with its neighbours, and with freezing
        folds it into the convolution before it: it could do neither across syncbn's
        operator); the mutant that does not see the compile keeps syncbn's operator."""
        x = torch.randn(2, 3, 8, 8)
        for fused in (False, True):
            ops = self._compiled_eval_ops(self._model(fused), x)
            self.assertFalse([o for o in ops if "syncbn" in o], ops)
            self.assertTrue([o for o in ops if "batch_norm" in o], ops)
        with graph_unseen():
            ops = self._compiled_eval_ops(self._model(True), x)
        self.assertTrue([o for o in ops if "syncbn" in o], ops)

    def test_train_exports_the_collective(self):
        model = self._model(True).train()
        graph = str(torch.export.export(model, (torch.randn(2, 3, 8, 8),)).graph)
        self.assertIn("syncbn.batch_norm_act_train", graph)

    def test_mutant_export_unseen(self):
        """Without seeing PyTorch make a graph (sbt._graphed): the graphs hold syncbn's
        inference operators, and the test above fails (test_onnx has its own mutant)."""
        with graph_unseen(), self.assertRaises(AssertionError):
            self._exports_without_syncbn(self._model(True), torch.randn(2, 3, 8, 8))


class TestForwardAD(TeamOfOne):
    """torch.func.jvp and jacfwd of an evaluated layer (plain, and fused with a residual):
    nn.BatchNorm2d's (then the same activation) tangents, within fp32 rounding (the layer
    runs PyTorch's batch norm under them: syncbn's operators have no forward-mode rule, and
    refused it); in training, still refused (a RuntimeError), nothing written."""

    def test_jvp_eval_as_nn(self):
        torch.manual_seed(5)
        m = sbt.SyncBatchNorm(4, comm=self.comm)
        ref = nn.BatchNorm2d(4)
        with torch.no_grad():
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-1, 1)
        ref.load_state_dict(m.state_dict())
        m.eval(), ref.eval()
        x, z, tx, tz = (torch.randn(2, 4, 3, 5) for _ in range(4))
        y, t = torch.func.jvp(m, (x,), (tx,))
        y_ref, t_ref = torch.func.jvp(ref, (x,), (tx,))
        torch.testing.assert_close(y, y_ref, rtol=3e-5, atol=3e-5)
        torch.testing.assert_close(t, t_ref, rtol=3e-5, atol=3e-5)
        jac = torch.func.jacfwd(m)(x[:1, :, :1, :2])
        torch.testing.assert_close(jac, torch.func.jacfwd(ref)(x[:1, :, :1, :2]), rtol=3e-5, atol=3e-5)
        m.set_activation("leaky_relu", 0.1)

        def ref_fused(a, b):
            return F.leaky_relu(ref(a) + b, 0.1)

        y, t = torch.func.jvp(m, (x, z), (tx, tz))
        y_ref, t_ref = torch.func.jvp(ref_fused, (x, z), (tx, tz))
        torch.testing.assert_close(y, y_ref, rtol=3e-5, atol=3e-5)
        torch.testing.assert_close(t, t_ref, rtol=3e-5, atol=3e-5)
        import torch.autograd.forward_ad as fwad  # dual tensors outside torch.func: the same
        with fwad.dual_level():
            t = fwad.unpack_dual(m(fwad.make_dual(x, tx), fwad.make_dual(z, tz))).tangent
        torch.testing.assert_close(t, t_ref, rtol=3e-5, atol=3e-5)
        m.train()
        state = copy.deepcopy(m.state_dict())
        with self.assertRaises(RuntimeError):
            torch.func.jvp(m, (x, z), (tx, tz))
        for k, v in m.state_dict().items():
            self.assertTrue(torch.equal(v, state[k]), k)


@needs_vmap_rules
class TestVmap(TeamOfOne):
    """torch.func.vmap of a layer (the operators' vmap rules, _ops.register_vmap): in eval,
    plain and fused, bitwise the layer applied to each instance, without PyTorch's
    per-instance fallback warning; an ensemble's batched parameters
    (stack_module_state + functional_call) too; per-sample gradients (vmap of grad): with
    the C++ operators theirs, bitwise; with the Python ones (whose autograd.Function takes
    no grad transform) PyTorch's batch norm, as under jvp. In training: NotImplementedError
    saying why, nothing written."""

    def _layer(self, k=0):
        torch.manual_seed(11 + k)
        m = sbt.SyncBatchNorm(4, comm=self.comm)
        with torch.no_grad():
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-1, 1)
        return m

    def test_eval(self):
        m = self._layer().eval()
        x, z = torch.randn(3, 2, 4, 5), torch.randn(3, 2, 4, 5)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            self.assertTrue(torch.equal(torch.func.vmap(m)(x), torch.stack([m(t) for t in x])))
            m.set_activation("leaky_relu", 0.2)
            self.assertTrue(torch.equal(torch.func.vmap(m)(x, z), torch.stack([m(a, b) for a, b in zip(x, z)])))
            self.assertTrue(torch.equal(torch.func.vmap(m, in_dims=(0, None))(x, z[0]),
                                        torch.stack([m(a, z[0]) for a in x])))
            # instances along another dimension, of strided storage (channels_last of the stack)
            cl = x.contiguous(memory_format=torch.channels_last).transpose(0, 1)
            self.assertTrue(torch.equal(torch.func.vmap(m, in_dims=(1, 1))(cl, z.transpose(0, 1)),
                                        torch.stack([m(a, b) for a, b in zip(x, z)])))
            # channels_last instances, one of x and z unbatched (its expansion is copied when
            # merged: it must come back in the other's format)
            xl = torch.empty(3, 2, 5, 6, 4).permute(0, 1, 4, 2, 3).copy_(torch.randn(3, 2, 4, 5, 6))
            zl = torch.randn(2, 4, 5, 6).contiguous(memory_format=torch.channels_last)
            self.assertTrue(xl[0].is_contiguous(memory_format=torch.channels_last))
            self.assertTrue(torch.equal(torch.func.vmap(m, in_dims=(0, None))(xl, zl),
                                        torch.stack([m(t, zl) for t in xl])))
            self.assertTrue(torch.equal(torch.func.vmap(m, in_dims=(None, 0))(zl, xl),
                                        torch.stack([m(zl, t) for t in xl])))
        # an instance's x and z in different formats: refused, as the layer refuses it
        with self.assertRaisesRegex(RuntimeError, "memory format"):
            torch.func.vmap(m, in_dims=(0, None))(xl.contiguous(), zl)
        # no instance, the weight batched (an ensemble of none): an empty stack, as F.batch_norm's
        y = torch.func.vmap(lambda w: _ops.batch_norm_infer(x[0], m.running_mean, m.running_var, w, m.bias,
                                                            1e-5))(torch.ones(0, 4))
        self.assertEqual(y.shape, (0, *x[0].shape))

    def test_ensemble(self):
        ms = [self._layer(k).eval() for k in range(3)]
        ms[1].set_activation("relu")
        params, bufs = torch.func.stack_module_state(ms)
        x = torch.randn(3, 2, 4, 5)
        for base in (ms[0], ms[1]):
            for shared in (False, True):  # a minibatch per model, or one for all of them
                y = torch.func.vmap(lambda p, b, t: torch.func.functional_call(base, (p, b), (t,)),
                                    in_dims=(0, 0, None if shared else 0))(params, bufs, x[0] if shared else x)
                want = []
                for mm, t in zip(ms, x):
                    one = copy.deepcopy(base)
                    one.load_state_dict(mm.state_dict())
                    want.append(one(x[0] if shared else t))
                self.assertTrue(torch.equal(y, torch.stack(want)), (base.activation, shared))
        # in training, with one shared minibatch: refused, saying why
        train = self._layer()
        params, bufs = torch.func.stack_module_state([train, self._layer(1)])
        with self.assertRaisesRegex(NotImplementedError, "in training under torch.func.vmap: not supported"):
            torch.func.vmap(lambda p, b, t: torch.func.functional_call(train, (p, b), (t,)),
                            in_dims=(0, 0, None))(params, bufs, x[0])

    def test_per_sample_gradients(self):
        m = self._layer().eval()
        x = torch.randn(3, 4, 5)

        def loss(t):
            return m(t.unsqueeze(0)).square().sum()

        want = torch.stack([torch.autograd.grad(loss(t), t)[0] for t in x.clone().requires_grad_().unbind()])
        got = torch.func.vmap(torch.func.grad(loss))(x)
        if _ops.NATIVE is not None:
            self.assertTrue(torch.equal(got, want))
        else:  # PyTorch's batch norm against the operator's backward: fp32 roundings apart
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

    def test_training_refused(self):
        for act in ("identity", "relu"):
            m = self._layer()
            m.set_activation(act)
            state = copy.deepcopy(m.state_dict())
            with self.assertRaisesRegex(NotImplementedError, "in training under torch.func.vmap: not supported"):
                torch.func.vmap(m)(torch.randn(3, 2, 4, 5))
            for k, v in m.state_dict().items():
                self.assertTrue(torch.equal(v, state[k]), k)


class TestCompile(TeamOfOne):
    def test_fullgraph_trains_like_eager(self):
        """A converted model (fused blocks and layers, in place with relu_as_leaky: the
        blocks' last layers without a downsample in place with their residual) trained 3
        SGD steps compiled (fullgraph) and eagerly: the same losses and parameters; 0 graph
        breaks; the graphs call the fused operators."""
        from torch._dynamo.backends.common import aot_autograd

        torch.manual_seed(5)
        base = resnet_like()
        randomize_bn(base)
        eager = sbt.convert_fused(copy.deepcopy(base), comm=self.comm, inplace=True, relu_as_leaky=0.2)
        model = sbt.convert_fused(copy.deepcopy(base), comm=self.comm, inplace=True, relu_as_leaky=0.2)
        self.assertTrue(model[3].bn2.inplace and model[5].bn3.inplace)  # with their residual
        torch._dynamo.reset()
        try:
            compiled = torch.compile(model, fullgraph=True)
            opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
            opt_c = torch.optim.SGD(model.parameters(), lr=0.05)
            for step in range(3):
                x = torch.randn(4, 3, 8, 8)
                le = eager(x).square().mean()
                lc = compiled(x).square().mean()
                le.backward()
                lc.backward()
                torch.testing.assert_close(lc, le, rtol=2e-5, atol=2e-6, msg=f"step {step}")
                for o in (opt_e, opt_c):
                    o.step()
                    o.zero_grad()
            for (n, a), (_, b) in zip(eager.named_parameters(), model.named_parameters()):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=n)
            for (n, a), (_, b) in zip(eager.named_buffers(), model.named_buffers()):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=n)
            torch._dynamo.reset()
            ex = torch._dynamo.explain(model)(torch.randn(4, 3, 8, 8))
            self.assertEqual(ex.graph_break_count, 0, ex.break_reasons)
            graphs = {"fw": [], "bw": []}

            def recorder(kind):
                def compiler(gm, example_inputs):
                    graphs[kind].append(gm.code)
                    return gm
                return compiler

            torch._dynamo.reset()
            backend = aot_autograd(fw_compiler=recorder("fw"), bw_compiler=recorder("bw"))
            torch.compile(model, backend=backend, fullgraph=True)(torch.randn(4, 3, 8, 8)).sum().backward()
            fw, bw = "".join(graphs["fw"]), "".join(graphs["bw"])
            self.assertEqual(fw.count("syncbn.batch_norm_act_train"), 12)
            self.assertEqual(bw.count("syncbn.batch_norm_act_backward"), 12)
            model.eval()
            torch._dynamo.reset()
            ex = torch._dynamo.explain(model)(torch.randn(4, 3, 8, 8))
            self.assertEqual(ex.graph_break_count, 0, ex.break_reasons)
        finally:
            torch._dynamo.reset()


@unittest.skipUnless(compiled_autograd_supported(), f"PyTorch {torch.__version__}: no compiled autograd for "
                     "syncbn's C++ nodes (PyTorch 2.7 and later)")
class TestCompiledAutograd(TeamOfOne):
    """Compiled autograd over an eager forward of converted blocks (residual + ReLU, ReLU,
    in place, evaluated): eager's gradients, one fused backward operator call per layer
    (test_torch_ops.py's TestCompiledAutograd has the mutants)."""

    def _model(self, inplace, relu_as_leaky=None):
        torch.manual_seed(7)
        base = resnet_like()
        randomize_bn(base)
        return sbt.convert_fused(base, comm=self.comm, inplace=inplace, relu_as_leaky=relu_as_leaky)

    def test_fused_blocks(self):
        """Not in place, in place, and in place with relu_as_leaky (the blocks' last layers
        without a downsample in place with their residual: the node keeps it)."""
        for inplace, leaky in ((False, None), (True, None), (True, 0.2)):
            with self.subTest(inplace=inplace, leaky=leaky):
                x = torch.randn(4, 3, 8, 8, requires_grad=True)
                compiled_autograd_matches_eager(self, self._model(inplace, leaky), (x,),
                                                "syncbn.batch_norm_act_backward", 12)

    def test_evaluated_fused_blocks(self):
        model = self._model(False)
        model.eval()
        x = torch.randn(4, 3, 8, 8, requires_grad=True)
        compiled_autograd_matches_eager(self, model, (x,), "syncbn.batch_norm_act_backward", 0)

    # Calls of the fused operators that differ from the one before in one thing each (what
    # compiled autograd's cache key must tell apart): train (activation, slope, residual,
    # in place, hooks) or eval (eps), the team, which gradients are asked for. "hooks":
    # the forward under saved_tensors_hooks, whose saved tensors add nothing to the key
    # (the in-place call's slots (-, out, w, b, stats) against the leaky one's (x, out, w,
    # -, stats)); without a bias, a residual that requires no grad (the same slots and
    # edges as the call without one before it: only no_residual, the mask from x, differs).
    KEY_CALLS = (
        dict(act=syncbn.RELU, slope=0.0),
        dict(act=syncbn.LEAKY_RELU, slope=0.1),
        dict(act=syncbn.LEAKY_RELU, slope=0.3),
        dict(act=syncbn.LEAKY_RELU, slope=0.3, hooks=True),
        dict(act=syncbn.LEAKY_RELU, slope=0.3, hooks=True, inplace=True),
        dict(act=syncbn.IDENTITY, slope=0.0, residual=True),
        dict(act=syncbn.RELU, slope=0.0, residual=True),
        dict(act=syncbn.RELU, slope=0.0, residual=True, other_team=True),
        dict(act=syncbn.RELU, slope=0.0, residual=True, x_grad=False),
        dict(act=syncbn.RELU, slope=0.0, no_bias=True),
        dict(act=syncbn.RELU, slope=0.0, residual=True, z_grad=False, no_bias=True),
        dict(act=syncbn.LEAKY_RELU, slope=0.2, residual=True, eval_eps=1e-5),
        dict(act=syncbn.LEAKY_RELU, slope=0.2, residual=True, eval_eps=0.5),
    )

    def _key_calls_match_eager(self, train, infer, other_comm):
        """KEY_CALLS' backwards in one compiled-autograd context (its cache kept between
        them) against eager autograd's gradients of the same calls (within 1e-6, as
        compiled_autograd_matches_eager)."""
        calls = []
        for i, c in enumerate(self.KEY_CALLS):
            torch.manual_seed(20 + i)
            x = (torch.randn(3, 4, 5, 5) + 1).requires_grad_(c.get("x_grad", True))
            z = torch.randn(3, 4, 5, 5).requires_grad_(c.get("z_grad", True)) if c.get("residual") else None
            w, b = (torch.rand(4) + 0.5).requires_grad_(), (torch.rand(4) - 0.5).requires_grad_()
            if c.get("no_bias"):
                b = None
            comm = other_comm if c.get("other_team") else self.comm
            hooks = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t) if c.get("hooks") else None
            with hooks or contextlib.nullcontext():
                if "eval_eps" in c:
                    rm, rv = torch.randn(4), torch.rand(4) + 0.5
                    y = infer(x, z, rm, rv, w, b, c["eval_eps"], c["act"], c["slope"])
                else:
                    y = train(x, z, w, b, None, None, None, 1e-5, 0.1, comm.id, c["act"], c["slope"],
                              c.get("inplace", False))[0]
            loss = (y * torch.randn(3, 4, 5, 5)).sum()
            leaves = [t for t in (x, z, w, b) if t is not None and t.requires_grad]
            calls.append((c, loss, leaves, torch.autograd.grad(loss, leaves, retain_graph=True)))
        with compiled_autograd_on([]):
            for c, loss, leaves, want in calls:
                loss.backward()
                for j, (t, w) in enumerate(zip(leaves, want)):
                    torch.testing.assert_close(t.grad, w, rtol=1e-6, atol=1e-7, msg=f"{c}: gradient {j}")

    def test_cache_key_tells_calls_apart(self):
        """Each of KEY_CALLS gives its own gradients, none a graph cached for another. The
        mutant: the C++ nodes' key without the constants, the gradients asked for and the
        slots kept (SBN_TORCH_MUT_KEY) takes the ReLU call's graph for leaky ReLU's."""
        other = syncbn.cpu_team(1)[0]
        self._key_calls_match_eager(_fused.batch_norm_act_train, _fused.batch_norm_act_infer, other)
        if _ops.NATIVE is None:
            return  # the mutant is of the C++ nodes
        keep, train, _, infer = fused_mutant_ops("syncbn_mutant_key", "key", self.comm, other)
        with self.assertRaisesRegex(AssertionError, "gradient"):
            self._key_calls_match_eager(train, infer, other)
        del keep


if __name__ == "__main__":
    unittest.main(verbosity=2)
