"""syncbn.torch on CPU teams (ranks as threads, each with its own replica of the layer or
model) against float64 PyTorch: nn.BatchNorm of the concatenated batch, and
nn.SyncBatchNorm.convert_sync_batchnorm's model in float64.

Tolerances: fp32 within 3e-5 relative + 3e-5 absolute of the float64 values (the
library's fp32 results are within a few ulp, 6e-8 each, of exact for these inputs: 10-60
values per channel, N(0, 1) + 3; a wrong binding gives errors of order 1); gradients
summed over ranks (DDP's sum) within 1e-4 (sums of up to 60 fp32 products; the
reference takes the incoming gradient as the layer got it, rounded to its dtype);
fp16/bf16 y within one rounding of the output and the input's own (fp16 2e-3, bf16
1.6e-2 relative, 2^-11 and 2^-8 with margin) plus the same absolute.
"""

import copy
import textwrap
import functools
import gc
import threading
import time
import unittest
import warnings

import numpy as np  # noqa: F401 (torch's CPU ops need it at import in some builds)
import torch

import syncbn
import syncbn.torch as sbt
from rank_threads import destroy_result, run_ranks


TOL = {torch.float32: (3e-5, 3e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _record(errors, f, barrier=None):
    """Runs f, appending what it raises to errors (a thread's failure, for the test's thread)
    and aborting `barrier`, so that the threads waiting there do not wait for it."""
    try:
        f()
    except Exception as e:  # noqa: BLE001 (the test asserts errors is empty)
        errors.append(e)
        if barrier is not None:
            barrier.abort()


class TestTorch(unittest.TestCase):
    def _train_case(self, ns, c, hw, dtype=torch.float32, channels_last=False, momentum=0.1, steps=2,
                    affine=True, seed=0, bias=True):
        torch.manual_seed(seed)
        W = len(ns)
        comms = syncbn.cpu_team(W, timeout_ms=60000)
        ref = torch.nn.BatchNorm2d(c, momentum=momentum, affine=affine).double()
        if affine:
            with torch.no_grad():
                ref.weight.uniform_(0.5, 1.5)
                ref.bias.uniform_(-0.5, 0.5)
                if not bias:  # bias=False: nn.BatchNorm2d's formula with a bias of 0 that is not trained
                    ref.bias.zero_()
            ref.bias.requires_grad_(bias)
        layers = [sbt.SyncBatchNorm(c, momentum=momentum, affine=affine, comm=comms[r], bias=bias) for r in range(W)]
        for m in layers:
            if affine and not bias:
                self.assertIsNone(m.bias)
            m.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ref.state_dict().items()
                               if bias or k != "bias"})
        try:
            for step in range(steps):
                xs = [(torch.randn(n, c, *hw, dtype=torch.float64) + 3.0) for n in ns]
                gs = [torch.randn(n, c, *hw, dtype=torch.float64) for n in ns]
                xin = [x.to(dtype) for x in xs]
                if channels_last:
                    xin = [x.contiguous(memory_format=torch.channels_last) for x in xin]
                xin = [x.requires_grad_() for x in xin]
                ys = [None] * W
                for m in layers:
                    m.zero_grad()

                def rank(r):
                    y = layers[r](xin[r])
                    ys[r] = y
                    (y.to(torch.float64) * gs[r]).sum().backward()

                self.assertEqual(run_ranks(W, rank), [None] * W)
                # the reference: the whole batch at once, in float64, from the same inputs
                X = torch.cat([x.detach().to(torch.float64) for x in xin]).requires_grad_()
                ref.zero_grad()
                Y = ref(X)
                # the gradient the layer received: gs rounded to its dtype (y's)
                (Y * torch.cat([g.to(dtype).double() for g in gs])).sum().backward()
                rtol, atol = TOL[dtype]
                o = 0
                for r, n in enumerate(ns):
                    torch.testing.assert_close(ys[r].to(torch.float64), Y[o:o + n].detach(), rtol=rtol, atol=atol)
                    torch.testing.assert_close(xin[r].grad.to(torch.float64), X.grad[o:o + n], rtol=rtol, atol=atol)
                    if channels_last and n > 0:
                        self.assertTrue(ys[r].is_contiguous(memory_format=torch.channels_last))
                    o += n
                for r in range(W):
                    torch.testing.assert_close(layers[r].running_mean.double(), ref.running_mean, rtol=3e-5, atol=3e-5)
                    torch.testing.assert_close(layers[r].running_var.double(), ref.running_var, rtol=3e-5, atol=3e-5)
                    self.assertEqual(int(layers[r].num_batches_tracked), int(ref.num_batches_tracked))
                if affine:  # local gradients; DDP sums them
                    gw = sum(m.weight.grad.double() for m in layers)
                    torch.testing.assert_close(gw, ref.weight.grad, rtol=1e-4, atol=1e-4)
                if affine and bias:
                    gb = sum(m.bias.grad.double() for m in layers)
                    torch.testing.assert_close(gb, ref.bias.grad, rtol=1e-4, atol=1e-4)
            # eval: the running statistics, each rank alone (the library's inference)
            for m in layers:
                m.eval()
            ref.eval()
            x = torch.randn(2, c, *hw, dtype=torch.float64) + 3.0
            xe = x.to(dtype).requires_grad_()
            ye = layers[0](xe)
            (ye.double() * x).sum().backward()
            Xe = x.to(dtype).to(torch.float64).requires_grad_()
            Ye = ref(Xe)
            (Ye * x.to(dtype).double()).sum().backward()
            rtol, atol = TOL[dtype]
            torch.testing.assert_close(ye.double(), Ye.detach(), rtol=rtol, atol=atol)
            torch.testing.assert_close(xe.grad.double(), Xe.grad, rtol=rtol, atol=atol)
        finally:
            for cm in comms:
                cm.destroy()

    def test_fp32_nchw_uneven_and_empty_ranks(self):
        self._train_case([2, 0, 3], 5, (3, 4), seed=1)

    def test_fp32_channels_last_momentum_none(self):
        self._train_case([1, 3], 6, (2, 5), channels_last=True, momentum=None, steps=3, seed=2)

    def test_fp32_no_affine(self):
        self._train_case([2, 2], 3, (4, 4), affine=False, seed=3)

    def test_fp16(self):
        self._train_case([2, 3], 4, (3, 3), dtype=torch.float16, seed=4)

    def test_bf16_channels_last(self):
        self._train_case([3, 2], 4, (3, 3), dtype=torch.bfloat16, channels_last=True, seed=5)

    def test_weight_set_to_none_keeps_the_bias(self):
        """`m.weight = None` on an affine layer that keeps its bias: F.batch_norm takes it (a
        weight of ones), and so does the layer, in training and eval, on its plain and fused
        operators; the bias's and the input's gradients against float64."""
        import torch.nn.functional as F

        comm = syncbn.cpu_team(1)[0]
        try:
            for kw, act in (({}, lambda v: v), ({"activation": "leaky_relu", "slope": 0.2},
                                                lambda v: F.leaky_relu(v, 0.2))):
                torch.manual_seed(6)
                m = sbt.SyncBatchNorm(3, comm=comm, **kw)
                with torch.no_grad():
                    m.bias.uniform_(-1, 1)
                m.weight = None
                x = torch.randn(4, 3, 5, requires_grad=True)
                X = x.detach().double().requires_grad_()
                B = m.bias.detach().double().requires_grad_()
                g = torch.randn(4, 3, 5, dtype=torch.float64)
                (m(x).double() * g).sum().backward()
                Y = act(F.batch_norm(X, None, None, None, B, training=True))
                (Y * g).sum().backward()
                torch.testing.assert_close(x.grad.double(), X.grad, rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(m.bias.grad.double(), B.grad, rtol=1e-4, atol=1e-4)
                m.eval()
                want = act(F.batch_norm(X.detach(), m.running_mean.double(), m.running_var.double(), None,
                                        B.detach(), training=False))
                torch.testing.assert_close(m(x.detach()).double(), want, rtol=1e-5, atol=1e-5)
        finally:
            comm.destroy()

    def test_lazy_batch_norm_refused_until_initialized(self):
        """An uninitialized LazyBatchNorm*d (its channels learnt at its first forward) is
        refused by the converters, naming it, before anything changes; once it ran, it
        converts as any batch norm."""
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.LazyBatchNorm2d())
        # (without parameters and buffers too: nothing uninitialized to see but the class)
        bare = torch.nn.Sequential(torch.nn.LazyBatchNorm2d(affine=False, track_running_stats=False))
        for convert in (sbt.convert_sync_batchnorm, sbt.convert_fused):
            for m, name in ((model, "1"), (bare, "0")):
                with self.assertRaisesRegex(ValueError, rf"the layer '{name}' \(LazyBatchNorm2d\) is lazy and not "
                                                        "yet initialized.*run one forward, then convert"):
                    convert(m)
                self.assertIs(type(m[-1]), torch.nn.LazyBatchNorm2d)
        model(torch.randn(2, 3, 4, 4))
        self.assertIsInstance(sbt.convert_sync_batchnorm(model)[1], sbt.SyncBatchNorm)

    def test_bias_false(self):
        """bias=False (nn.BatchNorm*d's keyword): a weight and no bias; the batch norm with a
        bias of 0, in training and eval, a bf16 NHWC batch and uneven ranks."""
        self._train_case([2, 0, 3], 4, (3, 3), bias=False, seed=8)
        self._train_case([1, 2], 5, (2, 3), dtype=torch.bfloat16, channels_last=True, bias=False, seed=9)
        # a PyTorch whose nn.BatchNorm*d has no bias= (before 2.15): the layer drops the bias itself
        saved, sbt._BIAS_KW = sbt._BIAS_KW, False
        try:
            m = sbt.SyncBatchNorm(3, bias=False)
            m.running_mean.fill_(2.0)
            m.reset_parameters()  # such a PyTorch's own would zero a bias of None
            self.assertIn("bias=False", repr(m))
        finally:
            sbt._BIAS_KW = saved
        self.assertIsNone(m.bias)
        self.assertTrue(torch.equal(m.running_mean, torch.zeros(3)))
        self.assertEqual(sorted(m.state_dict()), ["num_batches_tracked", "running_mean", "running_var", "weight"])
        # BatchNormXd (PyTorch's batch norm that revert_sync_batchnorm makes) takes bias= too,
        # with and without PyTorch's keyword, and equals nn.BatchNorm2d(bias=False) where it has it
        for kw in (True, False):
            saved, sbt._BIAS_KW = sbt._BIAS_KW, kw and saved
            try:
                xd = sbt.BatchNormXd(3, bias=False)
                self.assertIn("bias=False", repr(xd))
            finally:
                sbt._BIAS_KW = saved
            self.assertIsNone(xd.bias)
            self.assertEqual(sorted(xd.state_dict()), ["num_batches_tracked", "running_mean", "running_var", "weight"])
        if sbt._BIAS_KW:
            torch.manual_seed(3)
            bn = torch.nn.BatchNorm2d(3, bias=False)
            xd.load_state_dict(bn.state_dict())
            x = torch.randn(2, 3, 4, 4)
            torch.testing.assert_close(xd(x), bn(x), rtol=0, atol=0)
        # a layer with no channels: nn.SyncBatchNorm's ValueError, in training and eval (not
        # nn.BatchNorm's one-value check, nor the library's refusal)
        zero = sbt.SyncBatchNorm(0, comm=syncbn.cpu_team(1)[0])
        for train in (True, False):
            with self.assertRaisesRegex(ValueError, "SyncBatchNorm: number of input channels should be non-zero"):
                zero.train(train)(torch.randn(2, 0, 3, 3))
        with self.assertRaisesRegex(ValueError, "non-zero"):
            torch.nn.SyncBatchNorm(0)(torch.randn(2, 0, 3, 3))  # PyTorch's own

    def test_channels_last_empty_and_1x1_ranks(self):
        """Ranks of a channels_last model, one with an empty batch or 1x1 planes: such a
        tensor is contiguous and channels_last at once, and PyTorch strides it either way
        (a convolution of an empty batch gives contiguous strides, a ReLU of 1x1 planes
        too); the library matches such a rank's layout to its peers' (the same bytes).
        Float64 batch norm over all ranks' values; the same in a contiguous model."""
        torch.manual_seed(10)
        conv = torch.nn.Conv2d(4, 4, 1).to(memory_format=torch.channels_last)
        cl = torch.channels_last

        def conv_of(n, hw):  # a channels_last model's convolution, then what follows it
            with torch.no_grad():
                return conv((torch.randn(n, 4, hw, hw) + 2.0).to(memory_format=cl))

        cases = (
            (conv_of(3, 5), conv_of(0, 5)),  # an empty batch: contiguous strides
            (torch.relu(conv_of(3, 2)), torch.relu(conv_of(2, 1))),  # 1x1: contiguous strides
            (conv_of(3, 2), torch.randn(2, 4, 1, 1).contiguous(memory_format=cl)),  # a no-op on 1x1
            (torch.randn(3, 4, 2, 2), torch.randn(2, 4, 1, 1).to(memory_format=cl)),  # a contiguous model
            (torch.randn(3, 4, 2, 2), torch.randn(0, 4, 2, 2).to(memory_format=cl)),
        )
        for xs in cases:
            self.assertTrue(xs[1].is_contiguous() and xs[1].is_contiguous(memory_format=cl))
            comms = syncbn.cpu_team(2, timeout_ms=60000)
            try:
                layers = [sbt.SyncBatchNorm(4, comm=c) for c in comms]
                ys = [None, None]

                def rank(r):
                    ys[r] = layers[r](xs[r])

                self.assertEqual(run_ranks(2, rank), [None, None])
                vals = torch.cat([x.double().transpose(0, 1).reshape(4, -1) for x in xs], dim=1)  # (C, values)
                mean, var = vals.mean(1), vals.var(1, unbiased=False)
                for r in range(2):
                    want = (xs[r].double() - mean.view(1, 4, 1, 1)) / torch.sqrt(var.view(1, 4, 1, 1) + 1e-5)
                    torch.testing.assert_close(ys[r].double(), want, rtol=3e-5, atol=3e-5)
                    torch.testing.assert_close(layers[r].running_mean.double(), 0.1 * mean, rtol=3e-5, atol=3e-5)
            finally:
                for c in comms:
                    c.destroy()

    def test_cropped_channels_last_stays_channels_last(self):
        """A crop of a channels_last tensor (not dense) is read from a channels_last copy,
        as nn.BatchNorm2d keeps its format: its output is channels_last, and it runs with
        peers whose inputs are dense channels_last (it was an NCHW copy: "op mismatch").
        A channels_last residual is the fused layer's match for it."""
        torch.manual_seed(5)
        cl = torch.channels_last
        big = (torch.randn(3, 4, 7, 7, dtype=torch.float64) + 2).contiguous(memory_format=cl)
        xs = [big[..., :5, :5], (torch.randn(2, 4, 5, 5, dtype=torch.float64) - 1).contiguous(memory_format=cl)]
        self.assertFalse(xs[0].is_contiguous() or xs[0].is_contiguous(memory_format=cl))
        comms = syncbn.cpu_team(2, timeout_ms=60000)
        try:
            for kw in ({}, {"activation": "relu"}):
                layers = [sbt.SyncBatchNorm(4, comm=c, **kw) for c in comms]
                xin = [big.float()[..., :5, :5].requires_grad_(), xs[1].float().requires_grad_()]
                self.assertFalse(xin[0].is_contiguous(memory_format=cl))
                ys = [None, None]

                def rank(r):
                    z = torch.zeros_like(xin[r]).contiguous(memory_format=cl) if kw else None
                    ys[r] = layers[r](xin[r]) if z is None else layers[r](xin[r], z)
                    ys[r].sum().backward()

                self.assertEqual(run_ranks(2, rank), [None, None])
                X = torch.cat([x.float().double() for x in xs]).requires_grad_()
                Y = torch.nn.functional.batch_norm(X, None, None, training=True)
                if kw:
                    Y = torch.relu(Y)
                Y.sum().backward()
                self.assertTrue(ys[0].is_contiguous(memory_format=cl), kw)
                torch.testing.assert_close(torch.cat([y.double() for y in ys]).detach(), Y.detach(),
                                           rtol=3e-5, atol=3e-5)
                torch.testing.assert_close(torch.cat([x.grad.double() for x in xin]), X.grad, rtol=1e-4, atol=1e-4)
        finally:
            for c in comms:
                c.destroy()

    def test_wider_than_the_team(self):
        """A layer wider than its team's max_channels: a ValueError that names the team's
        max_channels, nothing written; a team made wide enough takes it."""
        comms = syncbn.cpu_team(1)
        try:
            self.assertEqual(comms[0].max_channels, 4096)
            m = sbt.SyncBatchNorm(4100, comm=comms[0])
            with self.assertRaisesRegex(ValueError, "4100 channels, and its team .comm=. takes at most 4096: make "
                                                    "the team with max_channels >= 4100"):
                m(torch.randn(3, 4100))
            self.assertEqual(int(m.num_batches_tracked), 0)
            self.assertTrue(torch.equal(m.running_mean, torch.zeros(4100)))
        finally:
            comms[0].destroy()
        comms = syncbn.cpu_team(1, max_channels=4100)
        try:
            x = torch.randn(3, 4100, dtype=torch.float64)
            y = sbt.SyncBatchNorm(4100, comm=comms[0])(x.float())
            ref = torch.nn.functional.batch_norm(x, None, None, training=True)
            torch.testing.assert_close(y.double(), ref, rtol=3e-5, atol=3e-5)
        finally:
            comms[0].destroy()

    def test_eps_zero_in_eval_and_momentum_zero_in_training(self):
        """What nn.BatchNorm2d takes at the edges of the refusals: eps 0 in eval (only a
        negative one is refused there), and momentum 0 in training (the running statistics
        stay, num_batches_tracked counts the batch)."""
        torch.manual_seed(21)
        comms = syncbn.cpu_team(1)
        try:
            x = torch.randn(4, 3, 2, 2)
            ref = torch.nn.BatchNorm2d(3, eps=0.0).double().eval()
            with torch.no_grad():
                ref.running_mean.uniform_(-0.5, 0.5)
                ref.running_var.uniform_(0.5, 1.5)
                ref.weight.uniform_(0.5, 1.5)
                ref.bias.uniform_(-0.5, 0.5)
            m = sbt.SyncBatchNorm(3, eps=0.0, comm=comms[0]).eval()
            m.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ref.state_dict().items()})
            torch.testing.assert_close(m(x).double(), ref(x.double()), rtol=1e-5, atol=1e-5)

            ref = torch.nn.BatchNorm2d(3, momentum=0.0).double()
            m = sbt.SyncBatchNorm(3, momentum=0.0, comm=comms[0])
            torch.testing.assert_close(m(x).double(), ref(x.double()), rtol=1e-5, atol=1e-5)
            self.assertTrue(torch.equal(m.running_mean, torch.zeros(3)))
            self.assertTrue(torch.equal(m.running_var, torch.ones(3)))
            self.assertEqual(int(m.num_batches_tracked), int(ref.num_batches_tracked))
            self.assertEqual(int(m.num_batches_tracked), 1)
        finally:
            for c in comms:
                c.destroy()

    def test_convert_and_revert_keep_settings(self):
        """convert_sync_batchnorm and revert_sync_batchnorm keep what PyTorch's converter
        keeps: eps, momentum (None too), the qconfig of eager-mode quantization-aware
        training; the reverted layer's eval output is the original's."""
        torch.manual_seed(22)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4, eps=0.1, momentum=None))
        with torch.no_grad():
            model[1].running_mean.uniform_(-0.5, 0.5)
            model[1].running_var.uniform_(0.5, 1.5)
        model[1].qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")
        conv = sbt.convert_sync_batchnorm(copy.deepcopy(model))
        self.assertIsInstance(conv[1], sbt.SyncBatchNorm)
        self.assertEqual((conv[1].eps, conv[1].momentum), (0.1, None))
        self.assertEqual(repr(conv[1].qconfig), repr(model[1].qconfig))  # (a copy's)
        back = sbt.revert_sync_batchnorm(copy.deepcopy(conv))
        self.assertIs(type(back[1]), torch.nn.BatchNorm2d)
        self.assertEqual((back[1].eps, back[1].momentum), (0.1, None))
        self.assertEqual(repr(back[1].qconfig), repr(model[1].qconfig))
        x = torch.randn(2, 3, 4, 4)
        torch.testing.assert_close(back.eval()(x), model.eval()(x), rtol=0, atol=0)

    def test_numpy_float32_eps_and_momentum(self):
        """eps and momentum given as NumPy float32s (read from a config, say) run as
        nn.BatchNorm2d runs them, with no warning: the layer's range checks compared them
        with float32's bound, which NumPy cast to a float32 with "overflow encountered in
        cast", a failure where warnings are errors (pytest's filterwarnings)."""
        import numpy as np

        torch.manual_seed(23)
        comms = syncbn.cpu_team(1)
        try:
            x = torch.randn(4, 3, 2, 2)
            kw = {"eps": np.float32(1e-3), "momentum": np.float32(0.25)}
            ref = torch.nn.BatchNorm2d(3, **kw)
            m = sbt.SyncBatchNorm(3, comm=comms[0], **kw)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                y, want = m(x), ref(x)
                torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(m.running_var, ref.running_var, rtol=1e-6, atol=1e-6)
                m.eval(), ref.eval()
                torch.testing.assert_close(m(x), ref(x), rtol=1e-5, atol=1e-5)
        finally:
            comms[0].destroy()

    def test_eps_and_momentum_refused(self):
        """eps <= 0 in training, < 0 in eval: F.batch_norm's ValueError; a negative momentum
        (the library would read it as None's cumulative average): a ValueError, from the
        layer and from the operator; NaN or infinite eps or momentum: a ValueError naming
        it. Nothing written."""
        comms = syncbn.cpu_team(1)
        try:
            for kw, msg in (({"eps": 0.0}, "batch_norm eps must be positive during training, but got 0.0"),
                            ({"momentum": -0.1}, r"momentum must be >= 0 \(None: the cumulative average\), "
                                                 "got -0.1")):
                m = sbt.SyncBatchNorm(3, comm=comms[0], **kw)
                with self.assertRaisesRegex(ValueError, msg):
                    m(torch.randn(4, 3, 2))
                self.assertEqual(int(m.num_batches_tracked), 0)
                self.assertTrue(torch.equal(m.running_mean, torch.zeros(3)))
            # NaN or infinite eps (training and eval) or momentum: ValueError (the library
            # refuses them; F.batch_norm would run); eps < 0 in eval: F.batch_norm's ValueError
            nan, inf = float("nan"), float("inf")
            # (finite as a float32, which the library takes: 1e39 is inf there, and so is the
            # least double that rounds up past float32's largest, 2^128 - 2^103)
            big = 2.0**128 - 2.0**103
            for kw, train, msg in (({"eps": nan}, True, "eps must be finite as a float32 .*, but got nan"),
                                   ({"eps": inf}, True, "eps must be finite as a float32 .*, but got inf"),
                                   ({"eps": 1e39}, True, r"eps must be finite as a float32 .*, but got 1e\+39"),
                                   ({"eps": big}, False, "eps must be finite as a float32 .*, but got 3.40"),
                                   ({"eps": nan}, False, "eps must be finite as a float32 .*, but got nan"),
                                   ({"eps": -1.0}, False, "batch_norm eps must be non-negative, but got -1.0"),
                                   ({"momentum": nan}, True, "momentum must be finite as a float32 .*, got nan"),
                                   ({"momentum": inf}, True, "momentum must be finite as a float32 .*, got inf"),
                                   ({"momentum": big}, True, "momentum must be finite as a float32 .*, got 3.40")):
                m = sbt.SyncBatchNorm(3, comm=comms[0], **kw).train(train)
                with self.assertRaisesRegex(ValueError, "syncbn.torch.SyncBatchNorm: .*" + msg):
                    m(torch.randn(4, 3, 2))
                self.assertEqual(int(m.num_batches_tracked), 0)
                self.assertTrue(torch.equal(m.running_mean, torch.zeros(3)))
            # float32's largest and the double just below the rounding point: finite there, taken
            import numpy as np

            for eps in (float(np.finfo(np.float32).max), np.nextafter(big, 0.0)):
                m = sbt.SyncBatchNorm(3, comm=comms[0], eps=eps)
                y = m(torch.randn(4, 3, 2))
                self.assertTrue(bool(torch.isfinite(y).all()))
                self.assertEqual(int(m.num_batches_tracked), 1)
            # an eps that is 0 as a float32 (at most 2^-150): refused in training (a constant
            # channel would be 0 * inf = NaN, where F.batch_norm's float64 eps gives 0); the
            # least float32 itself is taken, and gives the constant channel its bias
            for eps in (1e-50, 2.0**-150):
                m = sbt.SyncBatchNorm(3, comm=comms[0], eps=eps)
                with self.assertRaisesRegex(ValueError, "eps must be positive during training, but got .*, which is "
                                                        r"0 as a float32 \(the library's\): at least 1.4e-45"):
                    m(torch.randn(4, 3, 2))
                self.assertEqual(int(m.num_batches_tracked), 0)
            m = sbt.SyncBatchNorm(3, comm=comms[0], eps=2.0**-149)
            with torch.no_grad():
                m.bias.fill_(0.25)
            self.assertTrue(torch.equal(m(torch.ones(4, 3, 2)), torch.full((4, 3, 2), 0.25)))
            # a wrong number of channels: a RuntimeError, as F.batch_norm's, in training and eval
            for train in (True, False):
                with self.assertRaisesRegex(RuntimeError, "SyncBatchNorm: 4 channels, the layer has 3"):
                    sbt.SyncBatchNorm(3, comm=comms[0]).train(train)(torch.randn(2, 4, 5))
            # without running statistics the momentum is not used: nothing to refuse, as in nn
            m = sbt.SyncBatchNorm(3, comm=comms[0], momentum=-0.1, track_running_stats=False)
            x = torch.randn(4, 3, 2, dtype=torch.float64)
            want = torch.nn.functional.batch_norm(x, None, None, training=True)
            torch.testing.assert_close(m(x.float()).double(), want, rtol=3e-5, atol=3e-5)
            rm, rv, nbt = torch.zeros(3), torch.ones(3), torch.zeros((), dtype=torch.int64)
            with self.assertRaisesRegex(ValueError, "momentum must be >= 0"):
                torch.ops.syncbn.batch_norm_train(torch.randn(4, 3, 2), None, None, rm, rv, nbt, 1e-5, -0.5,
                                                  comms[0].id)
            self.assertEqual((int(nbt), rm.tolist()), (0, [0.0, 0.0, 0.0]))
        finally:
            comms[0].destroy()

    def test_inference_tensors_refused_before_anything_is_written(self):
        """Tensors made under torch.inference_mode() in a training call outside it:
        PyTorch's two RuntimeErrors (an input autograd must save; buffers updated in place),
        raised before the call writes anything (the running statistics were updated, then
        autograd refused to save x). Inside inference mode, or with nothing to save
        (no_grad), the call runs as nn's does; so does an in-place layer's (it saves its
        output, never writes its input), with grad enabled too: the gradients of a clone."""
        comms = syncbn.cpu_team(1)
        try:
            with torch.inference_mode():
                xi = torch.randn(4, 3, 5) + 2.0
                made_inside = sbt.SyncBatchNorm(3, comm=comms[0])
            fresh = sbt.SyncBatchNorm(3, comm=comms[0])
            relu_inplace = sbt.SyncBatchNorm(3, comm=comms[0], activation="leaky_relu", inplace=True)
            for m, x, grad, msg in ((fresh, xi, True, "Inference tensors cannot be saved for backward: the input"),
                                    (made_inside, torch.randn(4, 3, 5), True, "running_mean was made under"),
                                    (made_inside, torch.randn(4, 3, 5), False, "running_mean was made under")):
                with torch.set_grad_enabled(grad), self.assertRaisesRegex(RuntimeError, msg):
                    m(x)
                self.assertEqual(int(m.num_batches_tracked), 0)
                self.assertTrue(torch.equal(m.running_mean, torch.zeros(3)))
                self.assertTrue(torch.equal(m.running_var, torch.ones(3)))
            x0 = xi.clone()
            with torch.no_grad():  # nothing saved: the inference input is read, as by nn
                y = fresh(xi)
            ref = torch.nn.BatchNorm2d(3)
            with torch.no_grad():
                want = ref(xi.clone().unsqueeze(-1)).squeeze(-1)
            torch.testing.assert_close(y, want, rtol=3e-5, atol=3e-5)
            torch.testing.assert_close(fresh.running_mean, ref.running_mean, rtol=3e-5, atol=3e-5)
            self.assertTrue(torch.equal(xi, x0))
            with torch.inference_mode():  # inside inference mode: trains, as nn does
                made_inside(xi)
            self.assertEqual(int(made_inside.num_batches_tracked), 1)
            # in place: the inference input is read, never written nor saved
            twin = copy.deepcopy(relu_inplace)
            for grad in (False, True):
                with torch.set_grad_enabled(grad):
                    y, want = relu_inplace(xi), twin(xi.clone())
                self.assertTrue(torch.equal(y, want))
                self.assertTrue(torch.equal(xi, x0))
                if grad:
                    (y * want.detach()).sum().backward()
                    (want * want.detach()).sum().backward()
                    self.assertTrue(torch.equal(relu_inplace.weight.grad, twin.weight.grad))
                    self.assertTrue(torch.equal(relu_inplace.bias.grad, twin.bias.grad))
            self.assertEqual(int(relu_inplace.num_batches_tracked), 2)
        finally:
            comms[0].destroy()

    def test_shared_batch_norm_converts_once(self):
        """A batch norm used in three places (twice in one container, once in another) becomes ONE
        SyncBatchNorm used in all three, trained as the original (the same parameters, its
        running statistics moved three times). PyTorch's converter visits a module once
        (named_children) and leaves the second place its plain, unsynchronized batch norm."""
        comms = syncbn.cpu_team(1)
        try:
            torch.manual_seed(4)
            bn = torch.nn.BatchNorm2d(4)
            model = torch.nn.Sequential(torch.nn.Sequential(bn, torch.nn.Conv2d(4, 4, 1), bn), torch.nn.Sequential(bn))
            ref = copy.deepcopy(model).double()  # deepcopy keeps the sharing
            conv = sbt.convert_sync_batchnorm(model, comm=comms[0])
            self.assertIsInstance(conv[0][0], sbt.SyncBatchNorm)
            self.assertTrue(conv[0][0] is conv[0][2] is conv[1][0])
            x = torch.randn(2, 4, 3, 3)
            torch.testing.assert_close(conv(x).double(), ref(x.double()), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(conv[0][0].running_mean.double(), ref[0][0].running_mean, rtol=1e-5, atol=1e-6)
        finally:
            comms[0].destroy()

    def test_destroy_under_another_threads_call_is_refused(self):
        """destroy() of a comm that another thread holds (its open group has rank 0's op
        queued): SyncBNError (sbnInvalidUsage), and the comm stays as it was (live, in the
        C++ operators' table too); once that thread's group has ended, destroy() works.
        Before, the refused destroy dropped the handle (the comm leaked, and said it was
        destroyed)."""
        from syncbn import _capi

        d = syncbn.desc(syncbn.FLOAT32, syncbn.NCHW, 2, 3, 4)
        comms = syncbn.cpu_team(2, timeout_ms=20000)
        held, go, out = threading.Event(), threading.Event(), {}

        def holder():
            _capi.lib.sbnGroupStart()
            out["queued"] = comms[0].forward_train(d, torch.rand(2, 3, 4), torch.empty(2, 3, 4), torch.empty(3),
                                                   torch.empty(3))
            held.set()
            go.wait(60)
            out["end"] = _capi.lib.sbnGroupEnd()  # rank 1 missing: nothing runs (sbnInvalidUsage)

        t = threading.Thread(target=holder)
        t.start()
        try:
            self.assertTrue(held.wait(60))
            with self.assertRaises(syncbn.SyncBNError) as cm:
                comms[0].destroy()
            self.assertEqual(cm.exception.name, "sbnInvalidUsage")
            self.assertIn("in use by another thread", str(cm.exception))
            self.assertNotIn("destroyed", repr(comms[0]))
            if syncbn.Comm._native is not None:  # the C++ operators' table has it still
                self.assertTrue(syncbn.Comm._native.comm_live(comms[0].id))
        finally:
            go.set()
            t.join()
        self.assertEqual(out["end"], 2)
        for c in comms:
            c.destroy()
        self.assertIn("destroyed", repr(comms[0]))

    def test_convert_keeps_hooks(self):
        """A batch norm's hooks (forward, pre-forward, full backward, state_dict) move with it
        through convert_sync_batchnorm and back through revert_sync_batchnorm: they see the
        new layer and its output, and the handles given for the original remove them from
        it. Before, the converted layer had none (as PyTorch's converter leaves it), and a
        feature hook stopped firing without a word. A load_state_dict pre-hook (which
        PyTorch keeps with a weak reference to its module) gets the new layer, also once
        the original is collected."""
        comm = syncbn.cpu_team(1)[0]
        try:
            torch.manual_seed(9)
            model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))
            seen = []
            h = model[1].register_forward_hook(lambda m, inp, out: seen.append(("fwd", type(m), out.detach())))
            model[1].register_forward_pre_hook(lambda m, inp: seen.append(("pre", type(m), None)))
            model[1].register_full_backward_hook(lambda m, gin, gout: seen.append(("bwd", type(m), gout[0])))
            model[1]._register_state_dict_hook(lambda m, sd, prefix, local: sd.__setitem__(prefix + "seen", 1))
            load_hook = getattr(model[1], "register_load_state_dict_pre_hook", None)  # public from PyTorch 2.5
            if load_hook is None:
                load_hook = functools.partial(model[1]._register_load_state_dict_pre_hook, with_module=True)
            load_hook(lambda m, *args: seen.append(("load", type(m), None)))
            conv = sbt.convert_sync_batchnorm(model, comm=comm)
            del model  # the original batch norm collected: a hook kept with a weak reference to it must not die
            gc.collect()
            conv.load_state_dict({k: v for k, v in conv.state_dict().items() if not k.endswith("seen")})
            self.assertEqual(seen, [("load", sbt.SyncBatchNorm, None)])
            seen.clear()
            self.assertIsInstance(conv[1], sbt.SyncBatchNorm)
            x = torch.randn(2, 3, 3, 3, requires_grad=True)
            y = conv(x)
            y.sum().backward()
            self.assertEqual([(k, t) for k, t, _ in seen], [("pre", sbt.SyncBatchNorm), ("fwd", sbt.SyncBatchNorm),
                                                            ("bwd", sbt.SyncBatchNorm)])
            self.assertTrue(torch.equal(seen[1][2], y.detach()))
            torch.testing.assert_close(seen[2][2], torch.ones_like(y))
            self.assertIn("1.seen", conv.state_dict())
            h.remove()
            seen.clear()
            conv(x)
            self.assertEqual([k for k, _, _ in seen], ["pre"])
            back = sbt.revert_sync_batchnorm(conv)
            self.assertIs(type(back[1]), torch.nn.BatchNorm2d)
            seen.clear()
            back(x).sum().backward()
            self.assertEqual([(k, t) for k, t, _ in seen], [("pre", torch.nn.BatchNorm2d),
                                                            ("bwd", torch.nn.BatchNorm2d)])
            self.assertIn("1.seen", back.state_dict())
        finally:
            comm.destroy()

    def test_destroy_while_an_operator_call_enters(self):
        """The Python operators (the fallback; and every kernel of the fused layer's Python
        path): destroy() from another thread between an operator's taking the comm's handle
        and the library's call returns at once, the call runs on the live comm with the
        right values, and the comm is destroyed as the call returns (the C++ operators'
        rule, PYTHON.md). Before, the operators read the handle bare: the destroy went
        through and the call handed the library a freed comm; then the destroy was refused
        (sbnInvalidUsage), where PYTHON.md says it is done when the call returns."""
        from syncbn import _capi, _fused, _ops

        torch.manual_seed(11)
        x, dy, z = torch.randn(3, 2, 5), torch.randn(3, 2, 5), torch.randn(3, 2, 5)
        w, b = torch.rand(2) + 0.5, torch.rand(2)
        ref = torch.nn.functional.batch_norm(x.double(), None, None, w.double(), b.double(), True, 0.1, 1e-5)
        with syncbn.cpu_team(1)[0] as c:
            stats = _ops._train_kernel(x, w, b, None, None, None, 1e-5, 0.1, c.id)[1]
        relu, none = _fused.ACTIVATIONS["relu"], _fused.ACTIVATIONS["identity"]
        calls = [
            (_ops, "_fwd_c", lambda i: _ops._train_kernel(x, w, b, None, None, None, 1e-5, 0.1, i)[0]),
            (_ops, "_bwd_c", lambda i: _ops._backward_kernel(dy, x, w, stats, 1e-5, i, True, True)[0]),
            (_fused, "_fwdx_c", lambda i: _fused._train_kernel(x, z, w, b, None, None, None, 1e-5, 0.1, i,
                                                                relu, 0.0, False)[0]),
            (_fused, "_bwdx_c", lambda i: _fused._backward_kernel(dy, x, None, w, b, stats, 1e-5, i, none, 0.0,
                                                                   True, False, True)[0]),
        ]
        expected = [ref, None, torch.relu(ref + z.double()), None]
        for (module, name, call), want in zip(calls, expected):
            comm = syncbn.cpu_team(1)[0]
            real, seen = getattr(module, name), []

            def entering(h, *args, real=real, seen=seen, comm=comm):  # handle taken, library not yet called
                t = threading.Thread(target=lambda: seen.append(destroy_result(comm)))
                t.start()
                t.join()
                seen.append(repr(comm))
                return real(h, *args)

            destroys, lib_destroy = [], _capi.lib.sbnCommDestroy

            def counted_destroy(h, lib_destroy=lib_destroy, destroys=destroys):
                destroys.append(h)
                return lib_destroy(h)

            setattr(module, name, entering)
            _capi.lib.sbnCommDestroy = counted_destroy
            try:
                got = call(comm.id)
            finally:
                setattr(module, name, real)
                _capi.lib.sbnCommDestroy = lib_destroy
            self.assertEqual(seen, ["destroyed", f"<syncbn.Comm id={comm.id} destroyed>"], name)
            # destroyed once, as the call returned (by the C++ operators' table where they own it)
            if _ops.NATIVE is not None:
                self.assertEqual(_ops.NATIVE.comm_live(comm.id), 0, name)
            else:
                self.assertEqual(len(destroys), 1, name)
            if want is not None:
                torch.testing.assert_close(got.double(), want, rtol=3e-5, atol=3e-5)
            with self.assertRaisesRegex(syncbn.SyncBNError, "destroyed"):  # gone for later calls
                call(comm.id)
            self.assertIsNone(comm._deferred, name)  # destroyed by the call's return
            comm.destroy()  # a second destroy: nothing to do

    def test_momentum_none_without_num_batches_tracked(self):
        """momentum None with num_batches_tracked set to None (a checkpoint without it, a
        framework that drops it): nn.BatchNorm's factor is then 0, so the running statistics
        stay; the layer does the same, plain and fused, instead of asking for the counter."""
        comms = syncbn.cpu_team(1)
        try:
            for kw in ({}, {"activation": "relu"}):
                torch.manual_seed(3)
                ref = torch.nn.BatchNorm2d(3, momentum=None)
                m = sbt.SyncBatchNorm(3, comm=comms[0], momentum=None, **kw)
                for mod in (ref, m):
                    mod.num_batches_tracked = None
                    mod.running_mean.fill_(0.5)
                x = torch.randn(4, 3, 2, 2)
                y_ref = ref(x)
                y = m(x)
                if kw:
                    y_ref = torch.relu(y_ref)
                torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
                self.assertTrue(torch.equal(m.running_mean, ref.running_mean))
                self.assertTrue(torch.equal(m.running_var, ref.running_var))
                self.assertEqual(m.running_mean.tolist(), [0.5] * 3)
                self.assertIsNone(m.num_batches_tracked)
        finally:
            comms[0].destroy()

    def test_training_call_bumps_the_running_statistics_versions(self):
        """A training call writes the running statistics in place and says so to autograd
        (their version counters, as an in-place op's): a graph that saved them before (an
        evaluated call with grad enabled) raises at its backward instead of differentiating
        with the updated statistics, as nn.BatchNorm2d's silently does (docs/PYTHON.md,
        "Running statistics and the backward"). Plain and fused."""
        comms = syncbn.cpu_team(1)
        try:
            for kw in ({}, {"activation": "relu"}):
                torch.manual_seed(5)
                m = sbt.SyncBatchNorm(3, comm=comms[0], **kw)
                x = torch.randn(4, 3, 2, 2)
                before = (m.running_mean._version, m.running_var._version, m.num_batches_tracked._version)
                m(x)
                after = (m.running_mean._version, m.running_var._version, m.num_batches_tracked._version)
                self.assertEqual([a - b for a, b in zip(after, before)], [1, 1, 1], kw)
                m.eval()
                target = m(x.clone().requires_grad_())  # saves running_var for its backward
                m.train()
                m(x)
                with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
                    target.sum().backward()
                m.eval()
                target = m(x.clone().requires_grad_())
                target.sum().backward()  # nothing written since: it runs
        finally:
            comms[0].destroy()

    def test_reconversion_takes_the_new_team(self):
        """convert_sync_batchnorm of a converted model puts every layer on the new
        process_group and comm, as nn.SyncBatchNorm's converter does with its own layers:
        ours in place (the same layer, its epilogue kept), and trained on the new team."""
        comms = syncbn.cpu_team(1)
        try:
            model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
            first = sbt.convert_fused(model)
            bn = first[1]
            self.assertEqual((bn.activation, bn.comm), ("relu", None))
            again = sbt.convert_sync_batchnorm(first, process_group="group-B", comm=comms[0])
            self.assertIs(again[1], bn)
            with self.assertRaisesRegex(TypeError, "convert_sync_batchnorm: comm must be a syncbn.Comm"):
                sbt.convert_sync_batchnorm(again, process_group="group-C", comm="oops")
            self.assertEqual(bn.process_group, "group-B")  # a refused conversion changes nothing
            self.assertIs(bn.comm, comms[0])
            self.assertEqual(bn.process_group, "group-B")
            self.assertEqual(bn.activation, "relu")
            x = torch.randn(2, 4, 3, 3, dtype=torch.float64)
            y = bn(x.float())
            want = torch.relu(torch.nn.functional.batch_norm(x, None, None, training=True))
            torch.testing.assert_close(y.double(), want, rtol=3e-5, atol=3e-5)
        finally:
            comms[0].destroy()

    def test_one_running_statistic_refused(self):
        """A layer with one of running_mean and running_var set to None (as code that drops
        buffers may leave it) is refused as nn.SyncBatchNorm refuses it, before anything is
        written: in training a ValueError, in eval F.batch_norm's RuntimeError naming the
        missing one."""
        comms = syncbn.cpu_team(1)
        try:
            for missing in ("running_mean", "running_var"):
                other = "running_var" if missing == "running_mean" else "running_mean"
                m = sbt.SyncBatchNorm(3, comm=comms[0])
                setattr(m, missing, None)
                before = getattr(m, other).clone()
                with self.assertRaisesRegex(ValueError, "must either both be None or neither be None"):
                    m(torch.randn(4, 3, 5))
                self.assertTrue(torch.equal(getattr(m, other), before))
                self.assertEqual(int(m.num_batches_tracked), 0)
                with self.assertRaisesRegex(RuntimeError, f"{missing} must be defined in evaluation mode"):
                    m.eval()(torch.randn(4, 3, 5))
        finally:
            comms[0].destroy()

    def test_no_running_stats(self):
        """track_running_stats=False: no buffers; training normalizes with the team's batch,
        eval with this rank's own batch (nn.SyncBatchNorm's rule), as float64 nn.BatchNorm."""
        torch.manual_seed(7)
        comms = syncbn.cpu_team(2, timeout_ms=60000)
        try:
            layers = [sbt.SyncBatchNorm(4, track_running_stats=False, comm=c) for c in comms]
            self.assertIsNone(layers[0].running_mean)
            self.assertNotIn("running_mean", layers[0].state_dict())
            xs = [torch.randn(n, 4, 5) + 2 for n in (3, 1)]
            ys = [None, None]

            def rank(r):
                ys[r] = layers[r](xs[r])

            self.assertEqual(run_ranks(2, rank), [None, None])
            ref = torch.nn.BatchNorm1d(4, track_running_stats=False).double()
            Y = ref(torch.cat(xs).double())
            torch.testing.assert_close(torch.cat(ys).double(), Y, rtol=3e-5, atol=3e-5)
            for m in layers:
                m.eval()
            y0 = layers[0](xs[0])  # eval: rank 0 alone, no team call (rank 1 does not call)
            torch.testing.assert_close(y0.double(), ref(xs[0].double()), rtol=3e-5, atol=3e-5)
        finally:
            for c in comms:
                c.destroy()

    def test_pickle_and_classmethod(self):
        """torch.save of a whole layer drops its team (comm None after loading), and
        SyncBatchNorm.convert_sync_batchnorm exists as nn.SyncBatchNorm's does."""
        import io

        comms = syncbn.cpu_team(1)
        try:
            m = sbt.SyncBatchNorm(3, comm=comms[0])
            buf = io.BytesIO()
            torch.save(m, buf)
            buf.seek(0)
            m2 = torch.load(buf, weights_only=False)
            self.assertIsNone(m2.comm)
            self.assertIs(m.comm, comms[0])
            net = sbt.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm2d(3)), comm=comms[0])
            self.assertIsInstance(net[0], sbt.SyncBatchNorm)
            self.assertIs(net[0].comm, comms[0])
        finally:
            comms[0].destroy()

    def test_state_dict_round_trip(self):
        theirs = torch.nn.SyncBatchNorm(7)
        with torch.no_grad():
            theirs.running_mean.uniform_()
            theirs.weight.uniform_()
        theirs.num_batches_tracked += 5
        ours = sbt.SyncBatchNorm(7)
        ours.load_state_dict(theirs.state_dict())
        self.assertEqual(list(ours.state_dict().keys()), list(theirs.state_dict().keys()))
        back = torch.nn.SyncBatchNorm(7)
        back.load_state_dict(ours.state_dict())
        for k, v in theirs.state_dict().items():
            torch.testing.assert_close(back.state_dict()[k], v, rtol=0, atol=0)

    def test_convert_model_matches_pytorch_float64(self):
        torch.manual_seed(6)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8, momentum=None), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
        theirs = torch.nn.SyncBatchNorm.convert_sync_batchnorm(
            torch.nn.Sequential(*[m for m in __import__("copy").deepcopy(model)])).double()
        comms = syncbn.cpu_team(1)
        try:
            ours = sbt.convert_sync_batchnorm(__import__("copy").deepcopy(model), comm=comms[0])
            self.assertEqual(sum(isinstance(m, sbt.SyncBatchNorm) for m in ours.modules()), 3)
            x = torch.randn(4, 3, 6, 6)
            y_ours = ours(x)
            y_theirs = theirs(x.double())  # one process, no process group: plain batch norm
            torch.testing.assert_close(y_ours.double(), y_theirs, rtol=1e-4, atol=1e-4)
            y_ours.sum().backward()
            y_theirs.sum().backward()
            for (n, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
                torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-3, atol=1e-4, msg=n)
            for (n, b), (_, q) in zip(ours.named_buffers(), theirs.named_buffers()):
                torch.testing.assert_close(b.double() if b.is_floating_point() else b,
                                           q if q.is_floating_point() else q, rtol=1e-4, atol=1e-5, msg=n)
        finally:
            comms[0].destroy()

    def test_readme_example(self):
        """The README's PyTorch example, as written, runs; its model's layers are ours."""
        import pathlib
        import re

        text = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
        block = re.search(r"## Python quick start\n.*?```python\n(.*?)```", text, re.S)
        self.assertIsNotNone(block)
        self.assertIn("syncbn.torch", block.group(1))
        env = {}
        exec(compile(block.group(1), "README.md", "exec"), env)  # noqa: S102 (our own README)
        self.assertTrue(any(isinstance(m, sbt.SyncBatchNorm) for m in env["model"].modules()))
        self.assertIsNotNone(env["model"][1].weight.grad)
        if "compiled" in env:  # the compiled model trained the same layer once more
            self.assertEqual(int(env["model"][1].num_batches_tracked), 2)
        env["comm"].destroy()

    def test_deepcopy_shares_the_team(self):
        """copy.deepcopy of a layer (DDP, EMA models) shares its rank, never duplicates the
        handle (a duplicate would destroy the comm twice)."""
        import copy
        import gc

        comms = syncbn.cpu_team(1)
        m = sbt.SyncBatchNorm(3, comm=comms[0])
        m2 = copy.deepcopy(m)
        self.assertIs(m2.comm, comms[0])
        del m2
        gc.collect()
        y = m(torch.randn(2, 3, 4) + 1)  # the team still works
        self.assertEqual(tuple(y.shape), (2, 3, 4))
        comms[0].destroy()

    def test_backward_after_the_layer_is_collected(self):
        """A layer and its comm deleted between the forward and the backward (nn.SyncBatchNorm's
        backward keeps its process group): the backward runs, with the float64 reference's
        gradients, plain and fused; the comm is destroyed once the graph is gone, also where
        the backward never ran (the fused node keeps its output without a cycle). An explicit
        destroy() still ends the comm at once: the backward raises. A peer collected without
        its backward: the pinned rank's backward raises, never waits for it."""
        import gc
        import time
        import weakref

        from syncbn import Comm

        def alive(cid, ref):  # the Python object (kept by a Python node) or the C++ operators' entry
            return ref() is not None or bool(Comm._native is not None and Comm._native.comm_live(cid))

        x0 = torch.randn(4, 3, 5, dtype=torch.float64) + 1
        g = torch.randn(4, 3, 5, dtype=torch.float64)
        for kw in ({}, {"activation": "leaky_relu", "slope": 0.2}):
            with self.subTest(**kw):
                comm = syncbn.cpu_team(1)[0]
                cid, ref = comm.id, weakref.ref(comm)
                m = sbt.SyncBatchNorm(3, comm=comm, **kw)
                x = x0.float().requires_grad_()
                y = m(x)
                del m, comm
                gc.collect()
                self.assertTrue(alive(cid, ref), "the graph keeps the comm")
                (y.double() * g).sum().backward()
                X = x0.float().double().requires_grad_()
                Y = torch.nn.functional.batch_norm(X, None, None, training=True)
                if kw:
                    Y = torch.nn.functional.leaky_relu(Y, 0.2)
                (Y * g).sum().backward()
                torch.testing.assert_close(x.grad.double(), X.grad, rtol=1e-4, atol=1e-4)
                del y
                gc.collect()
                self.assertFalse(alive(cid, ref), "the comm outlives its graph")
        for kw in ({}, {"activation": "leaky_relu", "slope": 0.2}, {"activation": "relu"}):
            with self.subTest(**kw, backward=False):  # a graph dropped without its backward
                comm = syncbn.cpu_team(1)[0]
                cid, ref = comm.id, weakref.ref(comm)
                m = sbt.SyncBatchNorm(3, comm=comm, **kw)
                y = m(x0.float().requires_grad_())
                del m, comm
                gc.collect()
                self.assertTrue(alive(cid, ref), "the graph keeps the comm")
                del y  # (a node that saved its output as an input would keep itself, and the comm)
                gc.collect()
                self.assertFalse(alive(cid, ref), "the comm outlives its graph")
        for kw in ({}, {"activation": "relu"}):
            with self.subTest(**kw, backward=False, eval=True):  # no comm: what the node saved
                m = sbt.SyncBatchNorm(3, **kw).eval()
                y, w = m(x0.float().requires_grad_()), weakref.ref(m.weight)
                del m
                gc.collect()
                self.assertIsNotNone(w(), "the graph keeps the weight")
                del y
                gc.collect()
                self.assertIsNone(w(), "the weight outlives its graph")

        comm = syncbn.cpu_team(1)[0]
        y = sbt.SyncBatchNorm(3, comm=comm)(x0.float().requires_grad_())
        comm.destroy()
        with self.assertRaisesRegex(syncbn.SyncBNError, "destroyed"):
            y.sum().backward()

        comms = syncbn.cpu_team(2, timeout_ms=5000)
        layers = [sbt.SyncBatchNorm(3, comm=c) for c in comms]
        ys = [None, None]

        def fwd(r):
            ys[r] = layers[r](x0.float().requires_grad_())

        self.assertEqual(run_ranks(2, fwd), [None, None])
        y0 = ys[0]
        del layers, comms, ys, fwd
        gc.collect()  # rank 1 and its graph: gone (the C++ operators destroy it: rank 0 is aborted)
        t = time.monotonic()
        with self.assertRaises(syncbn.SyncBNError) as cm:
            y0.sum().backward()
        if Comm._native is not None:  # rank 1 destroyed: rank 0 aborted at once
            self.assertEqual(cm.exception.name, "sbnAborted")
            self.assertLess(time.monotonic() - t, 2.5)
        else:  # rank 1 kept by its team, which rank 0's node keeps: the timeout
            self.assertEqual(cm.exception.name, "sbnTimeout")
            self.assertLess(time.monotonic() - t, 30)

    def test_process_group_team_needs_cuda(self):
        import tempfile

        import torch.distributed as dist

        with tempfile.TemporaryDirectory() as d:
            dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
            try:
                # nn.SyncBatchNorm raises a ValueError there too
                # the message does not send a multi-process job to a CPU team (threads of one
                # process: each process would train alone)
                with self.assertRaisesRegex(ValueError, r"CUDA tensors \(here cpu\): syncbn synchronizes no CPU "
                                                        r"tensors across processes"):
                    sbt.SyncBatchNorm(3)(torch.randn(2, 3, 4))
                with self.assertRaises(ValueError):
                    torch.nn.SyncBatchNorm(3)(torch.randn(2, 3, 4))
            finally:
                dist.destroy_process_group()

    def test_process_group_reassigned(self):
        """The layer's team follows its process_group, which nn.SyncBatchNorm reads at every
        call: a group assigned after the first training call is looked up at the next one,
        eager and compiled (the groups' teams, CUDA-only, stood in for by CPU teams of one,
        one per group)."""
        import pickle
        import tempfile

        import torch.distributed as dist
        import torch.nn.functional as F

        teams, asked = {}, []

        def stand_in(group, device, timeout_ms=None, max_channels=None):
            asked.append(group)
            return teams.setdefault(group, syncbn.cpu_team(1)[0])

        real_team_for = sbt.team_for
        sbt.team_for = stand_in
        try:
            with tempfile.TemporaryDirectory() as d:
                dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
                try:
                    sub = dist.new_group([0])
                    for compiled in (False, True):
                        asked.clear()
                        m = sbt.SyncBatchNorm(3)
                        f = torch.compile(m, backend="eager") if compiled else m
                        x = torch.randn(4, 3, 5)
                        f(x)
                        f(x)
                        self.assertEqual(asked, [None], f"compiled {compiled}")  # once, then kept
                        self.assertIs(m._group_comm, teams[None])
                        m.process_group = sub
                        y = f(x)
                        self.assertEqual(asked, [None, sub], f"compiled {compiled}")
                        self.assertIs(m._group_comm, teams[sub])
                        torch.testing.assert_close(y, F.batch_norm(x, None, None, m.weight, m.bias, True),
                                                   rtol=3e-5, atol=3e-5)
                        m.process_group = None  # and back
                        # copies and pickles hold no team, nor the group it was found for (a
                        # ProcessGroup pickles not): they find their own at their first call
                        for c in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
                            self.assertIsNone(c._group_comm)
                            self.assertIsNone(c._group_pg)
                        f(x)
                        self.assertEqual(asked, [None, sub, None], f"compiled {compiled}")
                        self.assertIs(m._group_comm, teams[None])
                finally:
                    dist.destroy_process_group()
        finally:
            sbt.team_for = real_team_for
            for t in teams.values():
                t.destroy()

    def test_default_group_made_again(self):
        """destroy_process_group, then init_process_group: a layer of the default group
        (process_group None) takes the new group's team at its next training call, as
        nn.SyncBatchNorm syncs over the new group; without a process group between them it
        runs batch norm on its own batch and lets go of the old group's team (and of the
        group). A team that failed (aborted) is left so: the next group's team takes over.
        Each group's team is destroyed once the next one is made, or once the layer finds no
        process group. A layer given a group of a default group since made again raises as
        team_for does for it (a ValueError: not registered), where it ran on that group's
        team; a layer given comm= forgets its group's team. Eager and compiled (the graph's
        guards: the default group, which is_initialized() asks; no graph break once the team
        is found). The teams stood in for by CPU teams of one, kept in team_for's cache as
        team_for keeps them."""
        import tempfile
        import weakref

        import torch.distributed as dist
        import torch.nn.functional as F

        made, asked = [], []  # weak references to the teams made, in order; the calls

        def stand_in(group, device, timeout_ms=None, max_channels=None):
            group = sbt._group_of(group)
            asked.append(1)
            if sbt._outside_group(group):  # (a destroyed group: its ValueError)
                raise ValueError("stand-in team_for: not in the group")
            with sbt._TEAMS_LOCK:  # (the part of team_for that needs no GPU)
                team = sbt._TEAMS.get(group, {}).get(device.index)
                if team is None:
                    sbt._drop_destroyed_groups()
                    team = sbt._TEAMS.setdefault(group, {})[device.index] = syncbn.cpu_team(1)[0]
                    made.append(weakref.ref(team))
            return team

        real_team_for = sbt.team_for
        sbt.team_for = stand_in
        x = torch.randn(4, 3, 5)

        def right(y):
            torch.testing.assert_close(y, F.batch_norm(x, None, None, m.weight, m.bias, True), rtol=3e-5, atol=3e-5)

        try:
            for compiled in (False, True):
                made.clear()
                asked.clear()
                m = sbt.SyncBatchNorm(3)
                f = torch.compile(m, backend="eager") if compiled else m
                for world in range(3):  # (from the second to the third, no call between)
                    what = f"compiled {compiled}, world {world}"
                    with tempfile.TemporaryDirectory() as d:
                        dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
                        try:
                            group = weakref.ref(dist.group.WORLD)
                            right(f(x))
                            right(f(x))
                            self.assertEqual((len(made), len(asked)), (world + 1, world + 1), what)  # once a group
                            self.assertIs(sbt._TEAMS[group()][None], made[-1](), what)
                            self.assertIs(m._group_comm, made[-1](), what)
                            gc.collect()
                            self.assertEqual([t() is not None for t in made], [False] * world + [True], what)
                            if world == 0 and not compiled:  # comm= given: the group's team forgotten
                                c, n = sbt.SyncBatchNorm(3), len(asked)
                                c(x)
                                self.assertIs(c._group_comm, made[-1](), what)
                                c.comm = own = syncbn.cpu_team(1)[0]
                                self.assertIsNone(c._group_comm, what)
                                right(c(x))
                                del c, own, asked[n:]  # (the calls counted are m's)
                            if world == 0:  # a team that failed: the next group's team takes over
                                made[-1]().abort()
                                with self.assertRaisesRegex(syncbn.SyncBNError, "sbnAborted"):
                                    f(x)
                            if world == 1:  # a layer given a group of this default group
                                e, n = sbt.SyncBatchNorm(3, process_group=dist.new_group([0])), len(asked)
                                e(x)
                                self.assertEqual(len(made), 3, what)
                                del made[-1], asked[n:]  # (its team is no default group's)
                            if world == 2:  # its group's world ended: team_for's error, as for it
                                n = len(asked)
                                with self.assertRaisesRegex(ValueError, "not registered|not in the group"):
                                    e(x)
                                del e, asked[n:]
                            if compiled and world == 2:  # once the team is found: one graph
                                torch._dynamo.reset()
                                right(torch.compile(m, backend="eager", fullgraph=True)(x))
                        finally:
                            dist.destroy_process_group()
                    if world == 1:
                        continue
                    # no process group: its own batch, and nothing of the last group kept
                    right(f(x))
                    self.assertIsNone(m._group_comm, what)
                    self.assertIsNone(m._group_pg, what)
                    gc.collect()
                    self.assertIsNone(made[-1](), what)
                    if not compiled:  # (a compiled graph may hold the group it guards)
                        self.assertIsNone(group(), what)
        finally:
            sbt.team_for = real_team_for
            sbt._TEAMS.clear()
            torch._dynamo.reset()

    def test_process_group_teams_released(self):
        """team_for's teams are held by their group, weakly: a group destroyed and dropped
        takes its teams with it (destroyed once nothing holds them), and a group destroyed
        while something still holds it loses its teams at the next team that is made (its
        ranks' team is of no use to a later group). The teams stood in for by CPU teams of
        one (made for a GPU here without one: the lookup asks nothing of the device), the
        NCCL id by a failure (no team is made)."""
        import tempfile
        import weakref

        import torch.distributed as dist

        gpu = torch.device("cuda", 0)
        real_id = sbt._sbn.nccl_unique_id

        def no_id():
            raise syncbn.SyncBNError(4, "ncclGetUniqueId", "stand-in: no NCCL id")

        sbt._sbn.nccl_unique_id = no_id
        try:
            with tempfile.TemporaryDirectory() as d:
                dist.init_process_group("gloo", init_method=f"file://{d}/a", rank=0, world_size=1)
                held = dist.group.WORLD
                team = syncbn.cpu_team(1)[0]
                sbt._TEAMS[held] = {0: team}
                self.assertIs(sbt.team_for(None, gpu), team)  # found, not made
                kept = weakref.ref(team)
                del team
                dist.destroy_process_group()  # held here: its teams stay, for now
                gc.collect()
                self.assertIsNotNone(kept())
                dist.init_process_group("gloo", init_method=f"file://{d}/b", rank=0, world_size=1)
                try:
                    with self.assertRaisesRegex(RuntimeError, "could not make the team's NCCL id: .*stand-in"):
                        sbt.team_for(None, gpu)
                    self.assertNotIn(held, sbt._TEAMS)  # the destroyed group's, dropped
                    gc.collect()
                    self.assertIsNone(kept())  # and destroyed
                    team = syncbn.cpu_team(1)[0]
                    sbt._TEAMS[dist.group.WORLD] = {0: team}
                    self.assertIs(sbt.team_for(None, gpu), team)
                    kept = weakref.ref(team)
                    del team
                finally:
                    dist.destroy_process_group()  # and held by nothing: its teams go with it
                gc.collect()
                self.assertIsNone(kept())
                self.assertEqual(len(sbt._TEAMS), 0)
        finally:
            sbt._sbn.nccl_unique_id = real_id
            sbt._TEAMS.clear()

    def test_process_group_outside(self):
        """A process outside the layer's process group (world of two, the group rank 1's):
        for a GPU's tensor the layer takes no team of the group (it runs batch norm on its
        own batch on a team of one, as nn.SyncBatchNorm does there: world size -1, no sync;
        asked here without a GPU: the layer's lookup), and team_for says it is not in the
        group; a CPU tensor raises a ValueError, as nn.SyncBatchNorm's. Rank 1's team of
        the group is stood in for by a CPU team of one (the groups' teams are CUDA-only),
        which refuses a process outside the group as team_for does."""
        import subprocess
        import sys
        import tempfile

        child = textwrap.dedent("""
            import sys
            import torch
            import torch.distributed as dist
            import syncbn
            import syncbn.torch as sbt
            rank, store = int(sys.argv[1]), sys.argv[2]
            dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
            sub = dist.new_group([1])
            real_team_for, teams = sbt.team_for, {}
            def stand_in(group, device, timeout_ms=None, max_channels=None):
                if dist.get_rank(group if group is not None else dist.group.WORLD) < 0:
                    raise ValueError("stand-in team_for: not in the group")
                return teams.setdefault(group, syncbn.cpu_team(1)[0])
            sbt.team_for = stand_in
            torch.manual_seed(rank)
            x = torch.randn(4, 3, 5) * 2 + 1
            m, ref = sbt.SyncBatchNorm(3, process_group=sub), torch.nn.BatchNorm1d(3)
            if rank == 1:  # in the group: its team (a stand-in team of one: batch norm)
                for _ in range(2):
                    torch.testing.assert_close(m(x), ref(x), rtol=3e-5, atol=3e-5)
                for k in ("running_mean", "running_var", "num_batches_tracked"):
                    torch.testing.assert_close(getattr(m, k), getattr(ref, k), rtol=3e-5, atol=3e-5)
                print("rank 1 team", m._group_comm is teams[sub], flush=True)
            else:
                # a CPU tensor: a ValueError, as nn.SyncBatchNorm's (whatever the group)
                for layer in (m, torch.nn.SyncBatchNorm(3, process_group=sub)):
                    try:
                        layer(x)
                        print("rank 0", type(layer).__module__, "ran", flush=True)
                    except ValueError:
                        print("rank 0", type(layer).__module__, "ValueError", flush=True)
                # a GPU's tensor: no team (its team of one, nn.SyncBatchNorm's batch norm), asked
                # of the group without a device or a collective
                print("rank 0 outside", m._find_group_team(torch.device("cuda", 0)) is False, flush=True)
                try:
                    real_team_for(sub, torch.device("cuda", 0))
                except ValueError as e:
                    print("team_for:", "global rank 0) is not in the process group" in str(e), flush=True)
            dist.barrier()
            dist.destroy_process_group()
        """)
        with tempfile.TemporaryDirectory() as d:
            procs = [subprocess.Popen([sys.executable, "-c", child, str(r), f"{d}/store"], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True) for r in range(2)]
            outs = [p.communicate(timeout=300)[0] for p in procs]
        for r, (p, out) in enumerate(zip(procs, outs)):
            self.assertEqual(p.returncode, 0, f"rank {r}:\n{out}")
        self.assertIn("rank 0 syncbn.torch ValueError", outs[0])
        self.assertIn("rank 0 torch.nn.modules.batchnorm ValueError", outs[0])
        self.assertIn("rank 0 outside True", outs[0])
        self.assertIn("team_for: True", outs[0])
        self.assertIn("rank 1 team True", outs[1])

    def test_missing_rank_raises_timeout(self):
        comms = syncbn.cpu_team(2, timeout_ms=300)
        try:
            m = sbt.SyncBatchNorm(3, comm=comms[0])
            with self.assertRaises(syncbn.SyncBNError) as cm:
                m(torch.randn(2, 3, 4))
            self.assertEqual(cm.exception.name, "sbnTimeout")
        finally:
            for c in comms:
                c.destroy()

    def test_compiled_team_of_one_kept(self):
        """A compiled graph holds its team of one by id: a wider layer in the same graph
        replaces the thread's team, and the graph's first team must stay alive (under
        no_grad no autograd node holds it)."""
        import gc

        import torch.nn.functional as F

        errors = []

        def body():
            torch.manual_seed(3)
            wide = sbt._GROUP_TEAM_CHANNELS + 8
            m = torch.nn.Sequential(sbt.SyncBatchNorm(8), torch.nn.Conv2d(8, wide, 1), sbt.SyncBatchNorm(wide))
            f = torch.compile(m, backend="eager", fullgraph=True)
            for i in range(3):
                x = torch.randn(2, 8, 3, 3)
                with torch.no_grad():
                    y = f(x)
                    ref = F.batch_norm(m[1](F.batch_norm(x, None, None, training=True)), None, None, training=True)
                torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
                gc.collect()

        t = threading.Thread(target=lambda: _record(errors, body))
        t.start()
        t.join()
        self.assertEqual(errors, [])

    def test_compiled_models_of_other_widths(self):
        """Models whose layers have no team, compiled one after another in one process with
        other widths (wider than the default team too): PyTorch 2.4's Dynamo makes the
        layer's num_features symbolic at the second compile of a frame (Sequential.forward
        here), and the second model failed to compile there ("SymNodeVariable() is not a
        constant"). Each against float64."""
        import torch.nn.functional as F

        errors = []

        def body():  # a thread of its own: its own team of one, replaced by wider ones
            torch.manual_seed(9)
            for c in (8, 16, sbt._GROUP_TEAM_CHANNELS + 4, 24, sbt._GROUP_TEAM_CHANNELS + 100):
                m = torch.nn.Sequential(torch.nn.Conv2d(3, c, 1), sbt.SyncBatchNorm(c))
                f = torch.compile(m, backend="eager", fullgraph=True)
                x = torch.randn(2, 3, 3, 3)
                y = f(x)
                with torch.no_grad():
                    want = F.batch_norm(m[0](x).double(), None, None, training=True)
                torch.testing.assert_close(y.double(), want, rtol=1e-4, atol=1e-4, msg=f"{c} channels")
                y.sum().backward()

        t = threading.Thread(target=lambda: _record(errors, body))
        t.start()
        t.join()
        self.assertEqual(errors, [])

    def test_team_of_one_shared_by_threads(self):
        """A team of one that the layers made is shared by threads, as nn.SyncBatchNorm's
        local batch norm is: one thread's forwards while another runs their backwards (the
        autograd node calls the forward thread's team), and one compiled model (its graph
        holds the team it traced) trained from two threads at once. Each call waits for the
        one that runs, where the C library would refuse it (sbnInvalidUsage, "in use by
        another thread": 10 runs of 10 failed so without the calls serialized, 2-core
        x86, PyTorch 2.15). Gradients against float64."""
        import queue

        import torch.nn.functional as F

        def ref_grad(x, act):
            X = x.detach().double().requires_grad_()
            act(F.batch_norm(X, None, None, training=True)).sum().backward()
            return X.grad

        for act, layer in ((lambda v: v, sbt.SyncBatchNorm(16)),
                           (lambda v: F.leaky_relu(v, 0.1),
                            sbt.SyncBatchNorm(16, activation="leaky_relu", slope=0.1, inplace=True))):
            errors, q, n = [], queue.Queue(), 150

            def producer():
                try:
                    for _ in range(n):
                        x = torch.randn(8, 16, 32, 32, requires_grad=True)
                        q.put((x, layer(x)))
                finally:
                    q.put(None)

            def consumer():
                checked = 0
                while (item := q.get()) is not None:
                    x, y = item
                    y.sum().backward()
                    if checked < 3:  # a few against float64 (each costs more than the op)
                        torch.testing.assert_close(x.grad.double(), ref_grad(x, act), rtol=1e-3, atol=1e-4)
                        checked += 1

            ts = [threading.Thread(target=lambda f=f: _record(errors, f)) for f in (producer, consumer)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            self.assertEqual(errors, [])

        torch.manual_seed(5)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), sbt.SyncBatchNorm(16))
        f = torch.compile(model, backend="eager", fullgraph=True)
        f(torch.randn(8, 3, 34, 34)).sum().backward()  # traced here: the graph holds this thread's team
        errors = []

        def train():
            for _ in range(60):
                x = torch.randn(8, 3, 34, 34)
                y = f(x)
                ref = F.batch_norm(model[0](x).detach().double(), None, None, model[1].weight.double(),
                                   model[1].bias.double(), training=True)
                torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4)
                y.square().mean().backward()

        ts = [threading.Thread(target=lambda: _record(errors, train)) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])

    def test_no_process_group_runs_alone(self):
        """Without comm= and without a process group, nn.SyncBatchNorm runs PyTorch's batch
        norm on the rank's own batch (a script run without torchrun, a test, a notebook): the
        layer runs the same function on a team of one, the calling thread's (threads that
        train at once do not collide; the teams of threads that ended are taken again), and
        takes the process group's team while there is one."""
        import gc
        import tempfile

        import torch.distributed as dist
        import torch.nn.functional as F

        asked = []  # (thread, team) of every _own_team call
        own = sbt._own_team

        def spy(device, max_channels=None):
            team = own(device, max_channels)
            asked.append((threading.get_ident(), team))
            return team

        def model(seed):
            torch.manual_seed(seed)
            base = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, bias=False), torch.nn.BatchNorm2d(6),
                                       torch.nn.ReLU(), torch.nn.Conv2d(6, 4, 1), torch.nn.BatchNorm2d(4, momentum=None))
            with torch.no_grad():
                for m in base.modules():
                    if isinstance(m, torch.nn.BatchNorm2d):
                        m.weight.uniform_(0.5, 1.5)
                        m.bias.uniform_(-0.5, 0.5)
            return base

        def steps(base, n=2, barrier=None):
            """n steps of the converted model against float64 and nn.SyncBatchNorm's"""
            ref = copy.deepcopy(base).double()
            ours = sbt.convert_sync_batchnorm(copy.deepcopy(base))
            theirs = torch.nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(base))
            for step in range(n):
                x = torch.randn(3, 3, 7, 7, dtype=torch.float64) + 2.0
                outs = []
                for model in (ref, ours, theirs):
                    model.zero_grad()
                    if barrier is not None and model is ours:
                        barrier.wait()  # every thread's layers called at once
                    y = model(x.to(next(model.parameters()).dtype))
                    (y.double() ** 2).mean().backward()
                    outs.append(y.double())
                for y in outs[1:]:
                    torch.testing.assert_close(y, outs[0], rtol=3e-5, atol=3e-5)
                for model in (ours, theirs):
                    for (n_, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
                        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-4, atol=1e-4, msg=f"{step} {n_}")
                    for (n_, b), (_, q) in zip(model.named_buffers(), ref.named_buffers()):
                        torch.testing.assert_close(b.to(q.dtype), q, rtol=3e-5, atol=3e-5, msg=f"{step} {n_}")
            return ours

        sbt._own_team = spy
        try:
            ours = steps(model(11))
            teams = {t for _, t in asked}
            self.assertEqual(len(teams), 1)  # one team of one for the thread's layers
            team = teams.pop()
            self.assertEqual((team.rank, team.size), (0, 1))
            # threads that train at once: each its own team, none refused (a shared comm
            # takes one thread's call at a time); after them, a new thread takes a team of
            # the pool their teams went to
            asked.clear()
            errors, barrier = [], threading.Barrier(3)

            def train(seed):
                b = barrier
                _record(errors, lambda: steps(model(seed), barrier=b), b)

            threads = [threading.Thread(target=train, args=(s,)) for s in (1, 2, 3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(errors, [])
            by_thread = {}
            for ident, t in asked:
                by_thread.setdefault(ident, set()).add(t)
            self.assertEqual(len(by_thread), 3)
            self.assertTrue(all(len(v) == 1 for v in by_thread.values()))
            pooled = set().union(*by_thread.values())
            self.assertEqual(len(pooled), 3)
            self.assertNotIn(team, pooled)
            gc.collect()
            asked.clear()
            later = threading.Thread(target=train, args=(4,))
            barrier = threading.Barrier(1)
            later.start()
            later.join()
            self.assertEqual(errors, [])
            self.assertIn(asked[0][1], pooled)
        finally:
            sbt._own_team = own
        # a fused layer, compiled, in a thread of its own whose first call is the compiled
        # one (fullgraph: it finds the thread's team while it traces, and writes nothing of
        # the layer, so its second call runs the same graph)
        def compiled():
            f = torch.compile(sbt.SyncBatchNorm(3, activation="leaky_relu", slope=0.2), fullgraph=True)
            for i in range(2):
                x = torch.randn(2, 3, 5, 5)
                if i == 1 and hasattr(torch.compiler, "set_stance"):
                    with torch.compiler.set_stance("fail_on_recompile"):
                        y = f(x, x)
                else:
                    y = f(x, x)
                torch.testing.assert_close(y, F.leaky_relu(F.batch_norm(x, None, None, training=True) + x, 0.2),
                                           rtol=3e-5, atol=3e-5)

        errors.clear()
        for pool in (True, False):  # a team from the pool, then a team made there
            if not pool:
                sbt._OWN_POOL.clear()
            t = threading.Thread(target=lambda: _record(errors, compiled))
            t.start()
            t.join()
            self.assertEqual(errors, [], f"pool {pool}")
        # a wider layer: a team of its width in place of the thread's
        wide = sbt.SyncBatchNorm(team.max_channels + 1)
        wide(torch.randn(2, team.max_channels + 1))
        self.assertEqual(sbt._own_team(torch.device("cpu")).max_channels, team.max_channels + 1)
        # a process group now (its team stood in for: the group's teams take CUDA tensors):
        # the layer takes its team, and the team of one again once it is gone
        layer = ours[1]
        group_team = syncbn.cpu_team(1)[0]
        real_team_for = sbt.team_for
        sbt.team_for = lambda group, device, max_channels=None: group_team
        try:
            with tempfile.TemporaryDirectory() as d:
                dist.init_process_group("gloo", init_method=f"file://{d}/store", rank=0, world_size=1)
                try:
                    layer(torch.randn(2, 6, 3, 3))
                    self.assertIs(layer._group_comm, group_team)
                finally:
                    dist.destroy_process_group()
        finally:
            sbt.team_for = real_team_for
        group_team.destroy()  # a layer that kept taking it would raise
        x6 = torch.randn(2, 6, 3, 3)
        torch.testing.assert_close(layer(x6), F.batch_norm(x6, None, None, layer.weight, layer.bias, True),
                                   rtol=3e-5, atol=3e-5)

    def test_float64_training_refused_eval_runs(self):
        with self.assertRaisesRegex(TypeError, "syncbn.torch.SyncBatchNorm: torch.float64 input; the layer takes"):
            comms = syncbn.cpu_team(1)
            try:
                sbt.SyncBatchNorm(3, comm=comms[0])(torch.randn(2, 3, 4, dtype=torch.float64))
            finally:
                comms[0].destroy()
        # eval without running statistics is PyTorch's own batch norm (nn.SyncBatchNorm's
        # rule), float64 included
        m = sbt.SyncBatchNorm(3, track_running_stats=False).double().eval()
        x = torch.randn(2, 3, 4, dtype=torch.float64)
        torch.testing.assert_close(m(x), torch.nn.functional.batch_norm(x, None, None, training=True))
        # and so is the eval of a float64 model with running statistics (nn.SyncBatchNorm's
        # eval runs there), a fused layer's epilogue included; no team needed
        torch.manual_seed(3)
        ref = torch.nn.BatchNorm2d(3).double()
        with torch.no_grad():
            ref.running_mean.uniform_(-1, 1)
            ref.running_var.uniform_(0.5, 2)
            ref.weight.uniform_(0.5, 1.5)
            ref.bias.uniform_(-1, 1)
        m = sbt.convert_sync_batchnorm(copy.deepcopy(ref)).eval()
        ref.eval()
        x = torch.randn(2, 3, 4, 5, dtype=torch.float64)
        self.assertTrue(torch.equal(m(x), ref(x)))
        m.set_activation("leaky_relu", 0.2)
        self.assertTrue(torch.equal(m(x, x), torch.nn.functional.leaky_relu(ref(x) + x, 0.2)))

    def test_subclass_check_input_dim_runs(self):
        """forward asks self._check_input_dim first, as nn.SyncBatchNorm's does: a subclass
        that takes 4D input only refuses a 3D one with its own error, in training and eval,
        before anything is written (it ran: the method was never called)."""

        class Only4D(sbt.SyncBatchNorm):
            def _check_input_dim(self, input):
                if input.dim() != 4:
                    raise ValueError(f"expected 4D input (got {input.dim()}D input)")

        comm = syncbn.cpu_team(1)[0]
        try:
            m = Only4D(3, comm=comm)
            state = copy.deepcopy(m.state_dict())
            for training in (True, False):
                m.train(training)
                with self.assertRaisesRegex(ValueError, r"^expected 4D input \(got 3D input\)$"):
                    m(torch.randn(4, 3, 5))
                for k, v in m.state_dict().items():
                    self.assertTrue(torch.equal(v, state[k]), k)
            m.train()
            x = torch.randn(4, 3, 2, 2)
            torch.testing.assert_close(m(x), torch.nn.BatchNorm2d(3)(x), rtol=3e-5, atol=3e-5)
            # the layer's own check: PyTorch's ValueError for a 1D input
            with self.assertRaisesRegex(ValueError, r"expected at least 2D input \(got 1D input\)"):
                sbt.SyncBatchNorm(3, comm=comm)(torch.randn(3))
        finally:
            comm.destroy()

    def test_non_float_input_refused_as_pytorch(self):
        """An integer, bool or complex input: a RuntimeError, as nn.BatchNorm2d's
        '"batch_norm" not implemented for ...' (a NotImplementedError in PyTorch 2.15,
        a plain RuntimeError in 2.4: the layer's is both), and a TypeError, as the layer's
        other dtype refusals; in training and eval (also an eval that runs PyTorch's batch
        norm: without running statistics), nothing written."""
        comm = syncbn.cpu_team(1)[0]
        try:
            m = sbt.SyncBatchNorm(3, comm=comm)
            state = copy.deepcopy(m.state_dict())
            for dtype in (torch.int64, torch.uint8, torch.bool, torch.complex64):
                x = torch.zeros(4, 3, 2, dtype=dtype)
                for training in (True, False):
                    for layer in (m, sbt.SyncBatchNorm(3, comm=comm, track_running_stats=False)):
                        layer.train(training)
                        with self.assertRaisesRegex(RuntimeError, "not implemented for"):
                            torch.nn.BatchNorm1d(3).train(training)(x)
                        for cls in (NotImplementedError, RuntimeError, TypeError):
                            with self.assertRaisesRegex(cls, f"syncbn.torch.SyncBatchNorm: {dtype} input"):
                                layer(x)
            for k, v in m.state_dict().items():
                self.assertTrue(torch.equal(v, state[k]), k)
        finally:
            comm.destroy()

    def test_non_finite_input_as_pytorch(self):
        """A NaN in one channel and an infinity in another: nn.BatchNorm2d's running
        variance is NaN in both (its variance is), and so is the layer's (it stayed finite
        until 2026-11-29: the library clamped a NaN variance to 0); the running mean is not
        finite (PyTorch's is inf where an infinity is, the library's NaN: its mean is a
        compensated sum); y NaN in those channels; the third channel as nn's."""
        comm = syncbn.cpu_team(1)[0]
        try:
            torch.manual_seed(4)
            x = torch.randn(4, 3, 3, 3)
            x[1, 0, 2, 1] = float("nan")
            x[2, 1, 0, 0] = float("inf")
            ref = torch.nn.BatchNorm2d(3)
            m = sbt.SyncBatchNorm(3, comm=comm)
            y, want = m(x), ref(x)
            for t in (m.running_var[:2], ref.running_var[:2], y[:, :2]):
                self.assertTrue(torch.isnan(t).all(), t)
            self.assertFalse(torch.isfinite(m.running_mean[:2]).any())
            torch.testing.assert_close(y[:, 2], want[:, 2], rtol=3e-5, atol=3e-5)
            torch.testing.assert_close(m.running_mean[2], ref.running_mean[2])
            torch.testing.assert_close(m.running_var[2], ref.running_var[2])
        finally:
            comm.destroy()


if __name__ == "__main__":
    unittest.main(verbosity=2)
