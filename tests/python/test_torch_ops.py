"""syncbn's PyTorch operators (syncbn._ops: syncbn::batch_norm_train, batch_norm_backward,
batch_norm_infer) and the layer under torch.compile, on CPU teams; the binding's refusals.

- torch.library.opcheck on every operator: fp32/fp16/bf16, contiguous and channels_last,
  with and without affine and running statistics (its schema, autograd-registration,
  fake-tensor and AOT-dispatch tests compare the real kernels with the fake ones and
  with autograd);
- torch.compile(model, fullgraph=True) of a converted model trains 3 steps like eager:
  losses within 2e-6 relative (the same kernels on the same data: the compiled graph
  differs only in how PyTorch's own conv/linear/SGD are fused, a few fp32 roundings of
  values of order 1), parameters and running statistics within 1e-5; torch._dynamo.explain
  reports one graph and 0 graph breaks;
- the mutants: the same operators registered without the fake kernel, or without the
  Autograd kernel, in namespaces of their own; the compile test must fail on each, and
  opcheck (no fake kernel) or the gradient check through the operator (no Autograd
  kernel) too, while both pass on syncbn's own (so these tests can fail);
- torch.compile(dynamic=True): batches of three new sizes run one graph (a fake kernel
  that reads the batch size as an int, the mutant, compiles three);
- compiled autograd over an eager forward: eager's gradients, the backward operator in
  its graph (mutants: the C++ nodes without compiled_args, a Python backward calling its
  kernel); a model's copy on another comm is a graph of its own, on that comm;
- each argument, called directly: every refusal of the plain operators' checks (and the
  fused ones' that test_torch_fused leaves out), with its message and nothing written;
  eps in every call that reads it; a gradient to an input that alone requires grad;
  autograd.grad to some inputs; the backward operator without a weight (its fake
  kernel's shapes); the numbers in the messages as Python's repr writes them;
- refusals: a tensor argument on another device than the input, a comm that is not a
  syncbn.Comm, one value per channel (ValueError, as nn.BatchNorm), a destroyed peer
  (at once, naming it), the error text (the specific message first).
"""

import contextlib
import copy
import gc
import itertools
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import warnings

# inductor's own cache of compiled graphs, fresh: a cache left by an earlier version of
# these operators (another schema) is keyed by their names and would be taken as valid
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="syncbn-inductor-"))

import numpy as np  # noqa: F401 (torch's CPU ops need it at import in some builds)
import torch
import torch.nn.functional as F

import syncbn
import syncbn.torch as sbt
from rank_threads import TeamOfOne
from syncbn import _native, _ops

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def small_model():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8, momentum=None), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))


def train_args(comm, dtype, channels_last, affine, running, requires_grad=True):
    torch.manual_seed(0)
    x = torch.randn(3, 4, 5, 5) + 2.0
    x = x.to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(requires_grad)
    w = (torch.rand(4) + 0.5).requires_grad_(requires_grad) if affine else None
    b = torch.rand(4).requires_grad_(requires_grad) if affine else None
    rm, rv = (torch.zeros(4), torch.ones(4)) if running else (None, None)
    nbt = torch.zeros((), dtype=torch.int64) if running else None
    return x, w, b, rm, rv, nbt


# the vmap tests' condition: the operators have vmap rules only where PyTorch has
# torch.library.register_vmap
needs_vmap_rules = unittest.skipUnless(
    hasattr(torch.library, "register_vmap"),
    f"PyTorch {torch.__version__}: no torch.library.register_vmap (2.4 has none), so no vmap rules (docs/PYTHON.md)")


def vmap_checks(test, comm, train, infer):
    """torch.func.vmap of the operators (their vmap rules): training refused with a
    NotImplementedError that says why, nothing written (PyTorch's own refusal, without the
    rule, is a RuntimeError naming no layer); inference in one call, the instances as more
    batch: bitwise the calls one instance at a time, and without PyTorch's warning of its
    per-instance fallback ("There is a performance drop")."""
    x, w, b, rm, rv, nbt = train_args(comm, torch.float32, False, True, True, requires_grad=False)
    xs = torch.stack([x, x * 2.0 + 1.0, x - 3.0])
    before = [t.clone() for t in (rm, rv, nbt)]
    err = None
    try:
        torch.func.vmap(lambda t: train(t, w, b, rm, rv, nbt, 1e-5, 0.1, comm.id)[0])(xs)
    except Exception as e:  # noqa: BLE001: which exception is what is tested
        err = e
    test.assertIsInstance(err, NotImplementedError)
    test.assertIn("in training under torch.func.vmap: not supported", str(err))
    for t, t0 in zip((rm, rv, nbt), before):
        test.assertTrue(torch.equal(t, t0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = torch.func.vmap(lambda t: infer(t, rm, rv, w, b, 1e-5))(xs)
    test.assertTrue(torch.equal(y, torch.stack([infer(t, rm, rv, w, b, 1e-5) for t in xs])))


# the C++ mutants' defines, by what they drop (beside the namespace's)
MUTANT_DEFINES = {
    "fake": [],  # built whole; its fake kernels are not registered
    "autograd": ["-DSBN_TORCH_NO_AUTOGRAD"],  # no Autograd kernels
    "compiled_args": ["-USBN_TORCH_COMPILED_AUTOGRAD"],  # nodes without compiled autograd
    "key": ["-DSBN_TORCH_MUT_KEY"],  # compiled autograd's key without constants, `need`, slots kept
}


def mutant_ops(ns, drop, comm, *more_comms):
    """(keep, train, backward, infer): the operators in namespace ns without `drop`
    (MUTANT_DEFINES' keys; the Python ones: "fake" or "autograd"), of the kind
    syncbn.torch runs on: the C++ operators built again into ns, with comm (and
    more_comms) in their table of comms; or the Python ones. `keep` must be kept while
    they are used."""
    if _ops.NATIVE is None:
        lib = torch.library.Library(ns, "DEF")
        return (lib, *_ops._register(lib, drop=(drop,)))
    native = _native.Native(_native.built_library([f"-DSBN_TORCH_NS={ns}"] + MUTANT_DEFINES[drop]))
    for c in (comm, *more_comms):
        native.comm_put(c)
    lib = torch.library.Library(ns, "FRAGMENT")
    return ((native, lib), *_ops._native_ops(ns, lib, fake=drop != "fake"))


def op_gradients_match(test, comm, train):
    """x, weight and bias gradients of sum(g * train(...).out) against float64 autograd
    of the same batch norm, within 1e-4 (fp32: sums of 75 products of order 1)."""
    x, w, b, rm, rv, nbt = train_args(comm, torch.float32, False, True, True)
    g = torch.randn(x.shape)
    y, _ = train(x, w, b, rm, rv, nbt, 1e-5, 0.1, comm.id)
    (y * g).sum().backward()
    X, W, B = (t.detach().double().requires_grad_() for t in (x, w, b))
    Y = torch.nn.functional.batch_norm(X, None, None, W, B, True, 0.1, 1e-5)
    (Y * g.double()).sum().backward()
    for got, want, name in ((x.grad, X.grad, "x"), (w.grad, W.grad, "weight"), (b.grad, B.grad, "bias")):
        test.assertIsNotNone(got, name)
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4, msg=name)


def compile_matches_eager(test, comm, train_op=None, steps=3):
    """Trains a converted model eagerly and compiled (fullgraph) for `steps` SGD steps on
    the same batches; asserts the losses, parameters and buffers agree. With train_op,
    the compiled layers call that operator (a mutant's) instead of syncbn's."""
    torch.manual_seed(3)
    base = small_model()
    eager = sbt.convert_sync_batchnorm(copy.deepcopy(base), comm=comm)
    model = sbt.convert_sync_batchnorm(copy.deepcopy(base), comm=comm)
    saved = sbt._TRAIN
    if train_op is not None:
        sbt._TRAIN = train_op
    try:
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
        opt_c = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(steps):
            x = torch.randn(4, 3, 8, 8)
            le = eager(x).square().mean()
            lc = compiled(x).square().mean()
            le.backward()
            lc.backward()
            test.assertTrue(torch.isfinite(lc))
            torch.testing.assert_close(lc, le, rtol=2e-6, atol=2e-6, msg=f"step {step}")
            opt_e.step()
            opt_c.step()
            opt_e.zero_grad()
            opt_c.zero_grad()
    finally:
        sbt._TRAIN = saved
        torch._dynamo.reset()
    for (n, a), (_, b) in zip(eager.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=n)
    for (n, a), (_, b) in zip(eager.named_buffers(), model.named_buffers()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=n)


class TestOpcheck(TeamOfOne):
    def _cases(self):
        for dtype in DTYPES:
            for cl in (False, True):
                for affine in (False, True):
                    for running in (False, True):
                        yield dtype, cl, affine, running

    def test_train(self):
        for dtype, cl, affine, running in self._cases():
            with self.subTest(dtype=dtype, channels_last=cl, affine=affine, running=running):
                args = train_args(self.comm, dtype, cl, affine, running)
                momentum = None if running and cl else 0.1  # None: the cumulative average
                torch.library.opcheck(_ops.batch_norm_train, (*args, 1e-5, momentum, self.comm.id))

    def test_backward(self):
        for dtype, cl, affine, _ in self._cases():
            for input_grad in (False, True):
                with self.subTest(dtype=dtype, channels_last=cl, affine=affine, input_grad=input_grad):
                    x, w, b, rm, rv, nbt = train_args(self.comm, dtype, cl, affine, False, requires_grad=False)
                    _, stats = _ops.batch_norm_train(x, w, b, rm, rv, nbt, 1e-5, 0.1, self.comm.id)
                    dy = torch.randn_like(x)
                    torch.library.opcheck(_ops.batch_norm_backward,
                                          (dy, x, w, stats, 1e-5, self.comm.id, input_grad, affine))

    def test_infer(self):
        for dtype, cl, affine, _ in self._cases():
            with self.subTest(dtype=dtype, channels_last=cl, affine=affine):
                x, w, b, _, _, _ = train_args(self.comm, dtype, cl, affine, False)
                rm, rv = torch.randn(4), torch.rand(4) + 0.5
                torch.library.opcheck(_ops.batch_norm_infer, (x, rm, rv, w, b, 1e-5))

    def test_operators_are_pt2_compliant(self):
        """Every operator, plain and fused, carries pt2_compliant_tag (what opcheck's tests
        vouch for; torch.compile trusts the tag), on both kinds of operators."""
        from syncbn import _fused

        for name in (*_ops._SCHEMAS, *_fused.SCHEMAS):
            with self.subTest(name):
                self.assertIn(torch.Tag.pt2_compliant_tag, getattr(torch.ops.syncbn, name).default.tags)

    def test_layouts_and_values(self):
        """The operators' outputs (through the layer, eager and by the operator) equal a
        float64 batch norm: y and stats within 3e-5, in the input's memory format."""
        for cl in (False, True):
            x, w, b, rm, rv, nbt = train_args(self.comm, torch.float32, cl, True, True, requires_grad=False)
            y, stats = _ops.batch_norm_train(x, w, b, rm, rv, nbt, 1e-5, 0.1, self.comm.id)
            X = x.double()
            mean = X.mean((0, 2, 3))
            var = X.var((0, 2, 3), unbiased=False)
            ref = (X - mean.view(1, -1, 1, 1)) / (var.view(1, -1, 1, 1) + 1e-5).sqrt() * w.double().view(
                1, -1, 1, 1) + b.double().view(1, -1, 1, 1)
            torch.testing.assert_close(y.double(), ref, rtol=3e-5, atol=3e-5)
            torch.testing.assert_close(stats[0].double(), mean, rtol=3e-5, atol=3e-5)
            torch.testing.assert_close(stats[1].double(), (var + 1e-5).rsqrt(), rtol=3e-5, atol=3e-5)
            self.assertEqual(y.stride(), x.stride())
            self.assertEqual(int(nbt), 1)


class TestCompile(TeamOfOne):
    def test_fullgraph_trains_like_eager(self):
        compile_matches_eager(self, self.comm)

    def test_explain_no_graph_breaks(self):
        model = sbt.convert_sync_batchnorm(small_model(), comm=self.comm)
        torch._dynamo.reset()
        ex = torch._dynamo.explain(model)(torch.randn(4, 3, 8, 8))
        self.assertEqual(ex.graph_break_count, 0, ex.break_reasons)
        self.assertEqual(ex.graph_count, 1)
        model.eval()  # inference: PyTorch's batch norm in the graph (test_torch_fused's TestExport)
        torch._dynamo.reset()
        ex = torch._dynamo.explain(model)(torch.randn(4, 3, 8, 8))
        self.assertEqual(ex.graph_break_count, 0, ex.break_reasons)
        torch._dynamo.reset()

    def test_compiled_graph_calls_the_operators(self):
        """The compiled forward and backward run syncbn's operators (one each per layer),
        not a Python function traced through."""
        from torch._dynamo.backends.common import aot_autograd

        graphs = {"fw": [], "bw": []}

        def recorder(kind):
            def compiler(gm, example_inputs):
                graphs[kind].append(gm.code)
                return gm  # run as traced (aot_eager)
            return compiler

        backend = aot_autograd(fw_compiler=recorder("fw"), bw_compiler=recorder("bw"))
        model = sbt.convert_sync_batchnorm(small_model(), comm=self.comm)
        torch._dynamo.reset()
        torch.compile(model, backend=backend, fullgraph=True)(torch.randn(4, 3, 8, 8)).sum().backward()
        fw, bw = "".join(graphs["fw"]), "".join(graphs["bw"])
        self.assertEqual(fw.count("syncbn.batch_norm_train"), 3)
        self.assertEqual(bw.count("syncbn.batch_norm_backward"), 3)
        torch._dynamo.reset()


def compiled_autograd_supported():
    """Whether this PyTorch has compiled autograd and syncbn's autograd supports it (the
    C++ nodes: PyTorch 2.7 and later, _native.features())."""
    from torch._dynamo import compiled_autograd
    if not hasattr(compiled_autograd, "_enable"):
        return False
    return _ops.NATIVE is None or "-DSBN_TORCH_COMPILED_AUTOGRAD" in _native.features()


@contextlib.contextmanager
def compiled_autograd_on(codes):
    """Compiled autograd (torch._dynamo.compiled_autograd) over the block, its cache empty
    at entry and dropped at exit: each backward graph traced, then compiled by
    aot_autograd as traced, its code appended to `codes`."""
    from torch._dynamo import compiled_autograd
    from torch._dynamo.backends.common import aot_autograd

    def record(gm, example_inputs):
        codes.append(gm.code)
        return gm

    torch._dynamo.reset()
    try:
        with compiled_autograd._enable(torch.compile(backend=aot_autograd(fw_compiler=record), fullgraph=True)):
            yield
    finally:
        torch._dynamo.reset()


def compiled_backward(loss):
    """loss.backward() under compiled autograd (compiled_autograd_on); returns the codes of
    the graphs it compiled and how many backward graphs were captured."""
    from torch._dynamo.utils import counters

    codes = []
    before = counters["compiled_autograd"]["captures"]
    with compiled_autograd_on(codes):
        loss.backward()
    return "".join(codes), counters["compiled_autograd"]["captures"] - before


def compiled_autograd_matches_eager(test, model, inputs, backward_op, calls):
    """model(*inputs)'s gradients by compiled autograd over an eager forward against
    eager autograd's of the same forward: equal within 1e-6 relative (the same operator
    calls on the same tensors; aot_autograd may decompose PyTorch's own backward ops);
    the compiled graph calls `backward_op` `calls` times."""
    loss = model(*inputs).square().mean()
    leaves = [p for p in model.parameters()] + [t for t in inputs if t.requires_grad]
    want = torch.autograd.grad(loss, leaves, retain_graph=True)
    code, captures = compiled_backward(loss)
    test.assertGreaterEqual(captures, 1)
    test.assertEqual(code.count(backward_op), calls, code)
    for i, (t, w) in enumerate(zip(leaves, want)):
        test.assertIsNotNone(t.grad, i)
        torch.testing.assert_close(t.grad, w, rtol=1e-6, atol=1e-7, msg=f"gradient {i}")


@unittest.skipUnless(compiled_autograd_supported(), f"PyTorch {torch.__version__}: no compiled autograd for "
                     "syncbn's C++ nodes (PyTorch 2.7 and later)")
class TestCompiledAutograd(TeamOfOne):
    """Compiled autograd over an eager forward: the backward graph is traced and
    compiled; it calls syncbn's backward operator once per layer and gives eager's
    gradients. The mutants: nodes without compiled_args (the C++ operators built without
    SBN_TORCH_COMPILED_AUTOGRAD) or a Python backward that calls the kernel where dynamo
    traces it (an opaque function) fail."""

    def test_training_layers(self):
        torch.manual_seed(4)
        model = sbt.convert_sync_batchnorm(small_model(), comm=self.comm)
        x = torch.randn(4, 3, 8, 8, requires_grad=True)
        compiled_autograd_matches_eager(self, model, (x,), "syncbn.batch_norm_backward", 3)

    def test_affine_off_and_no_running_statistics(self):
        torch.manual_seed(5)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 1), torch.nn.BatchNorm2d(6, affine=False),
                                    torch.nn.BatchNorm2d(6, track_running_stats=False))
        model = sbt.convert_sync_batchnorm(model, comm=self.comm)
        x = torch.randn(2, 3, 5, 5, requires_grad=True)
        compiled_autograd_matches_eager(self, model, (x,), "syncbn.batch_norm_backward", 2)

    def test_evaluated_layers(self):
        """eval: batch_norm_infer's gradients (torch ops, no syncbn operator)."""
        torch.manual_seed(6)
        model = sbt.convert_sync_batchnorm(small_model(), comm=self.comm)
        model(torch.randn(4, 3, 8, 8))  # running statistics of their own
        model.eval()
        x = torch.randn(4, 3, 8, 8, requires_grad=True)
        compiled_autograd_matches_eager(self, model, (x,), "syncbn.batch_norm_backward", 0)

    def test_each_layer_on_its_own_comm(self):
        """Two backwards under one compiled autograd context, of the same model on two
        comms: the first on comm a, then, a destroyed, the copy on comm b. The comm is part
        of each node's key (a constant of the compiled graph), so the second backward is a
        graph of its own, on b, with eager's gradients; a graph reused from the first would
        call the backward operator with a's id ("no live comm"). Plain and fused layers."""
        torch.manual_seed(7)
        base = small_model()
        x = torch.randn(4, 3, 8, 8)
        for convert in (sbt.convert_sync_batchnorm, sbt.convert_fused):
            with self.subTest(convert=convert.__name__):
                a, b = syncbn.cpu_team(1)[0], syncbn.cpu_team(1)[0]
                try:
                    ma, mb = convert(copy.deepcopy(base), comm=a), convert(copy.deepcopy(base), comm=b)
                    want = torch.autograd.grad(mb(x).square().mean(), list(mb.parameters()))
                    codes = []
                    with compiled_autograd_on(codes):
                        ma(x).square().mean().backward()
                        a.destroy()
                        mb(x).square().mean().backward()
                    self.assertEqual(len(codes), 2)
                    for i, (p, w) in enumerate(zip(mb.parameters(), want)):
                        torch.testing.assert_close(p.grad, w, rtol=1e-6, atol=1e-7, msg=f"gradient {i}")
                finally:
                    a.destroy()  # (again: a no-op)
                    b.destroy()

    def _op_backward(self, train):
        x, w, b, rm, rv, nbt = train_args(self.comm, torch.float32, False, True, True)
        y, _ = train(x, w, b, rm, rv, nbt, 1e-5, 0.1, self.comm.id)
        code, _ = compiled_backward((y * y).sum())
        return code, (x.grad, w.grad, b.grad)

    def test_mutant_without_compiled_args(self):
        code, grads = self._op_backward(_ops.batch_norm_train)  # the control
        self.assertEqual(code.count("syncbn.batch_norm_backward"), 1)
        self.assertTrue(all(g is not None for g in grads))
        if _ops.NATIVE is None:
            fn = _ops._train_function(_ops._train_kernel, _ops._backward_kernel, below=False)  # no traced_backward

            def train(*args):
                return fn.apply(*args)

            expected = "(?i)callable|trace|unsupported"
            keep = None
        else:
            keep, train, _, _ = mutant_ops("syncbn_mutant_nocompiledargs", "compiled_args", self.comm)
            expected = "compiled_args not implemented"
        with self.assertRaisesRegex(Exception, expected):
            self._op_backward(train)
        del keep


def dynamic_compile_graphs(test, comm, train_op=None):
    """A converted conv-BN-ReLU-conv-BN model compiled with dynamic=True (fullgraph,
    aot_eager: dynamo's guards and the fake kernels are what is tested) on
    batches of three shapes (N, H, W all new each time, none 0 or 1 and H != W, so that
    PyTorch's own 0/1 and duck-sizing specializations stay out): losses within 2e-6 and
    gradients within 1e-5 of eager's (as compile_matches_eager: the same kernels, PyTorch's
    own ops fused otherwise), and how many graphs dynamo compiled. With train_op, the
    compiled layers call that operator."""
    from torch._dynamo.utils import counters

    torch.manual_seed(8)
    base = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8))
    eager = sbt.convert_sync_batchnorm(copy.deepcopy(base), comm=comm)
    model = sbt.convert_sync_batchnorm(copy.deepcopy(base), comm=comm)
    saved = sbt._TRAIN
    if train_op is not None:
        sbt._TRAIN = train_op
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled = torch.compile(model, backend="aot_eager", dynamic=True, fullgraph=True)
        for shape in ((2, 3, 8, 10), (3, 3, 10, 12), (5, 3, 7, 13)):
            x = torch.randn(*shape)
            le, lc = eager(x).square().mean(), compiled(x).square().mean()
            le.backward()
            lc.backward()
            torch.testing.assert_close(lc, le, rtol=2e-6, atol=2e-6, msg=str(shape))
            for (n, a), (_, b) in zip(eager.named_parameters(), model.named_parameters()):
                torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-5, msg=f"{shape} {n}")
                a.grad = b.grad = None
        return counters["stats"]["unique_graphs"]
    finally:
        sbt._TRAIN = saved
        torch._dynamo.reset()


class TestDynamicShapes(TeamOfOne):
    """torch.compile(dynamic=True): batches of new sizes (multi-scale training) run the one
    compiled graph: the fake kernels keep the sizes symbolic. The mutant: a fake kernel
    that reads the batch size as a Python int recompiles for each."""

    def test_one_graph_for_every_shape(self):
        self.assertEqual(dynamic_compile_graphs(self, self.comm), 1)

    def test_mutant_specializing_fake_kernel(self):
        def fake(x, *args):
            int(x.shape[0])  # a guard on the batch size: the graph holds for this size only
            return _ops._train_fake(x, *args)

        ns = "syncbn_mutant_specializing"
        lib = torch.library.Library(ns, "DEF")
        train = _ops._define(lib, {"batch_norm_train": _ops._SCHEMAS["batch_norm_train"],
                                   "batch_norm_backward": _ops._SCHEMAS["batch_norm_backward"]},
                             dict(_ops._KERNELS, batch_norm_train=(_ops._train_kernel, fake)),
                             lambda t, b: {n: k for n, k in _ops._autograd_kernels(t, b, None).items()
                                           if n != "batch_norm_infer"})[0]
        self.assertEqual(dynamic_compile_graphs(self, self.comm, train_op=train), 3)


class TestMutants(TeamOfOne):
    """Each registration matters: without it, opcheck and the compile test fail."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.nofake = mutant_ops("syncbn_mutant_nofake", "fake", cls.comm)
        cls.noautograd = mutant_ops("syncbn_mutant_noautograd", "autograd", cls.comm)

    def _opcheck_fails(self, train):
        args = train_args(self.comm, torch.float32, False, True, True)
        with self.assertRaisesRegex(Exception, "test_faketensor"):  # opcheck names the failed test
            torch.library.opcheck(train, (*args, 1e-5, 0.1, self.comm.id))

    def test_the_real_operators_pass(self):
        """The control: what fails on the mutants passes on syncbn's operators."""
        op_gradients_match(self, self.comm, _ops.batch_norm_train)
        args = train_args(self.comm, torch.float32, False, True, True)
        torch.library.opcheck(_ops.batch_norm_train, (*args, 1e-5, 0.1, self.comm.id))

    @needs_vmap_rules
    def test_vmap_rules(self):
        """The control of test_without_vmap_rules: syncbn's operators pass vmap_checks."""
        vmap_checks(self, self.comm, _ops.batch_norm_train, _ops.batch_norm_infer)

    @needs_vmap_rules
    def test_without_vmap_rules(self):
        """The mutants' namespaces have no vmap rules (syncbn's are registered by
        _ops.register_vmap for its own namespace only): vmap_checks fails on them."""
        _, train, _, infer = self.nofake
        with self.assertRaises(AssertionError):
            vmap_checks(self, self.comm, train, infer)

    def test_without_fake_kernel(self):
        _, train, _, _ = self.nofake
        self._opcheck_fails(train)
        with self.assertRaisesRegex(Exception, "(?i)fake|meta"):  # dynamo: no fake/meta kernel
            compile_matches_eager(self, self.comm, train_op=train, steps=1)

    def test_without_autograd_kernel(self):
        """No Autograd kernel: the op's output has no gradient to x, weight, bias
        (PyTorch only warns), so the gradient check and the compiled training fail.
        opcheck's autograd-registration test cannot see this (it finds only autograd
        registered at a backend key), which is why the gradient check exists."""
        _, train, _, _ = self.noautograd

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with self.assertRaisesRegex(Exception, "does not require grad|weight|x|bias"):
                op_gradients_match(self, self.comm, train)  # no grad_fn, or None gradients
            # the compiled losses part from eager's (torch 2.15), or its graph has no
            # gradient at all (torch 2.4)
            with self.assertRaisesRegex(Exception, r"^step \d$|does not require grad"):
                compile_matches_eager(self, self.comm, train_op=train, steps=3)


class TestParameters(unittest.TestCase):
    """Parameters and running statistics that are not contiguous float32 (model.half(),
    bf16 models, strided views): converted for the call, written back, against float64
    nn.BatchNorm2d. Tolerances: fp16/bf16 parameters hold their values exactly in the
    float32 the library reads, so y differs from float64 only by the input and output
    roundings (fp16 2e-3, bf16 1.6e-2, as test_torch.py); fp32 3e-5."""

    def setUp(self):
        self.comm = syncbn.cpu_team(1)[0]

    def tearDown(self):
        self.comm.destroy()

    def _against_reference(self, m, x, tol):
        ref = torch.nn.BatchNorm2d(m.num_features).double()
        with torch.no_grad():
            ref.weight.copy_(m.weight.double())
            ref.bias.copy_(m.bias.double())
            ref.running_mean.copy_(m.running_mean.double())
            ref.running_var.copy_(m.running_var.double())
        y = m(x)
        Y = ref(x.double())
        torch.testing.assert_close(y.double(), Y, rtol=tol, atol=tol)
        torch.testing.assert_close(m.running_mean.double(), ref.running_mean, rtol=tol, atol=tol)
        torch.testing.assert_close(m.running_var.double(), ref.running_var, rtol=tol, atol=tol)
        self.assertEqual(int(m.num_batches_tracked), 1)
        m.eval()
        ref.eval()
        torch.testing.assert_close(m(x).double(), ref(x.double()), rtol=tol, atol=tol)

    def test_half_and_bfloat16_models(self):
        for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)):
            with self.subTest(dtype=dtype):
                torch.manual_seed(1)
                m = sbt.SyncBatchNorm(6, comm=self.comm)
                with torch.no_grad():
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-1, 1)
                m = m.to(dtype)
                x = (torch.randn(4, 6, 3, 3) + 2).to(dtype)
                self._against_reference(m, x, tol)
                y = m.train()(x.requires_grad_())
                y.float().sum().backward()
                self.assertEqual(m.weight.grad.dtype, dtype)

    def test_mixed_dtypes_in_eval_without_statistics(self):
        """A layer without running statistics (track_running_stats=False: eval normalizes
        with the batch, PyTorch's op) whose parameters are of another float dtype than the
        input's (model.half() fed fp32, fp16 parameters with a bf16 input): eval gives what
        training gives, as documented (PyTorch's op refused the mix: "mixed dtype (CPU)"),
        against float64 within the input's rounding (fp32 3e-5; bf16 1.6e-2)."""
        torch.manual_seed(3)
        for pdt, xdt, tol in ((torch.float16, torch.float32, 3e-5), (torch.bfloat16, torch.float32, 3e-5),
                              (torch.float16, torch.bfloat16, 1.6e-2), (torch.float64, torch.float32, 3e-5)):
            for fused in (False, True):
                with self.subTest(params=pdt, input=xdt, fused=fused):
                    kw = {"activation": "relu"} if fused else {}
                    m = sbt.SyncBatchNorm(5, track_running_stats=False, comm=self.comm, **kw)
                    with torch.no_grad():
                        m.weight.uniform_(0.5, 1.5)
                        m.bias.uniform_(-1, 1)
                    m = m.to(pdt)
                    x = (torch.randn(3, 5, 4, 4) * 2 + 1).to(xdt)
                    X = x.double()
                    ref = torch.nn.functional.batch_norm(X, None, None, m.weight.double(), m.bias.double(),
                                                         True, 0.0, m.eps)
                    ref = ref.relu() if fused else ref
                    y_train = m.train()(x)
                    y_eval = m.eval()(x)
                    self.assertEqual(y_eval.dtype, xdt)
                    torch.testing.assert_close(y_train.double(), ref, rtol=tol, atol=tol)
                    torch.testing.assert_close(y_eval.double(), ref, rtol=tol, atol=tol)

    def test_strided_parameters_and_statistics(self):
        """Views with a stride of 2 (each converted on its own: running_var alone strided
        was not written back)."""
        torch.manual_seed(2)
        for which in ("running_var", "running_mean", "weight", "all"):
            with self.subTest(strided=which):
                m = sbt.SyncBatchNorm(6, comm=self.comm)
                for name in ("weight", "bias", "running_mean", "running_var"):
                    if which not in (name, "all"):
                        continue
                    base = torch.empty(12)
                    view = base[::2]
                    view.copy_(getattr(m, name).detach() + torch.rand(6) * 0.5)
                    setattr(m, name, torch.nn.Parameter(view) if name in ("weight", "bias") else view)
                self._against_reference(m, torch.randn(4, 6, 3, 3) + 1, 3e-5)

    def test_integer_statistics_refused(self):
        m = sbt.SyncBatchNorm(3, comm=self.comm)
        m.running_var = torch.ones(3, dtype=torch.int64)
        with self.assertRaisesRegex(TypeError, "running_var is torch.int64"):
            m(torch.randn(2, 3, 4))
        self.assertEqual(int(m.num_batches_tracked), 0)

    def test_empty_spatial_extent(self):
        """(2, 3, 0, 4): no elements; the rank takes part with none, the output is empty,
        the call is counted (nn.BatchNorm2d does the same)."""
        m = sbt.SyncBatchNorm(3, comm=self.comm)
        y = m(torch.randn(2, 3, 0, 4))
        self.assertEqual(tuple(y.shape), (2, 3, 0, 4))
        self.assertEqual(int(m.num_batches_tracked), 1)

    def test_traced_and_meta_calls_see_the_operator(self):
        """make_fx in real mode and a meta-device layer go through the operator (its
        kernels or its fake kernel), never the eager shortcut."""
        from torch.fx.experimental.proxy_tensor import make_fx

        m = sbt.SyncBatchNorm(3, comm=self.comm)
        gm = make_fx(lambda x: m(x), tracing_mode="real")(torch.randn(2, 3, 4) + 1)
        self.assertIn("syncbn.batch_norm_train", gm.code)
        x = torch.randn(2, 3, 4) + 1
        torch.testing.assert_close(gm(x), m(x), rtol=0, atol=0)  # bn's statistics: the same batch
        with torch.device("meta"):
            mm = sbt.SyncBatchNorm(3, comm=self.comm)
            y = mm(torch.empty(2, 3, 4))
        self.assertEqual((y.device.type, tuple(y.shape)), ("meta", (2, 3, 4)))


    def test_jit_trace_in_training(self):
        """torch.jit.trace of a training layer (plain and fused): the traced module, run on
        another batch size, gives the eager layer's y, dx, dweight, dbias and running
        statistics bitwise (the same operator, on the same inputs). Under a trace x.shape[1]
        is a tensor: the Python operators computed a pointer from it, which ctypes refused
        (fixed: the statistics' stride)."""
        import warnings

        torch.manual_seed(5)
        for kw in ({}, {"activation": "relu"}):
            m = sbt.SyncBatchNorm(4, comm=self.comm, **kw).train()
            ref = sbt.SyncBatchNorm(4, comm=self.comm, **kw).train()
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.jit.trace is deprecated; TracerWarnings
                traced = torch.jit.trace(m, torch.randn(2, 4, 5, 5), check_trace=False)
            ref.load_state_dict(m.state_dict())
            kinds = {n.kind() for n in traced.inlined_graph.nodes()}
            self.assertTrue({k for k in kinds if k.startswith("syncbn::")} or "prim::PythonOp" in kinds, kinds)
            x = (torch.randn(3, 4, 5, 5) + 1).requires_grad_()
            xr = x.detach().clone().requires_grad_()
            y, yr = traced(x), ref(xr)
            g = torch.randn_like(y)
            y.backward(g)
            yr.backward(g)
            for a, b in ((y, yr), (x.grad, xr.grad), (m.weight.grad, ref.weight.grad), (m.bias.grad, ref.bias.grad),
                         (m.running_mean, ref.running_mean), (m.running_var, ref.running_var),
                         (m.num_batches_tracked, ref.num_batches_tracked)):
                torch.testing.assert_close(a, b, rtol=0, atol=0, msg=str(kw))


def raises_syncbn_error():
    """Whether the loaded operators raise syncbn.SyncBNError themselves (called directly,
    in the backward): the Python ones, and the C++ ones built with Python's headers."""
    return _ops.NATIVE is None or "-DSBN_TORCH_PYTHON" in _native.features()


def _eval_reference(seed):
    """A float64 nn.BatchNorm2d(3) in eval with drawn running statistics and parameters,
    and an input x0 and a residual z0 (2, 3, 4, 5), from torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    ref = torch.nn.BatchNorm2d(3).double().eval()
    with torch.no_grad():
        ref.running_mean.uniform_(-1, 1)
        ref.running_var.uniform_(0.5, 2)
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    return ref, torch.randn(2, 3, 4, 5, dtype=torch.float64), torch.randn(2, 3, 4, 5, dtype=torch.float64)


def _load_float(m, ref):
    """ref's state (float64) into the layer m, as float32."""
    m.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ref.state_dict().items()})


class TestAutogradAndLifetimes(unittest.TestCase):
    """What the C++ operators must do as the Python ones do (both kinds run these)."""

    def setUp(self):
        self.comm = syncbn.cpu_team(1)[0]

    def tearDown(self):
        self.comm.destroy()

    def test_no_double_backward(self):
        """create_graph=True: the gradients exist and carry a node that refuses to be
        differentiated (once_differentiable), never a second derivative that silently
        leaves the batch norm out, whichever input the second derivative is taken to. The
        message names the layer on both kinds of operators, plain and fused, also where
        only x (not the incoming gradient) requires grad."""
        for kw in ({}, {"activation": "relu"}):
            m = sbt.SyncBatchNorm(3, comm=self.comm, **kw)
            x = torch.randn(4, 3, requires_grad=True)
            # the incoming gradient 3 y^2 (requires grad), then a constant (does not)
            for incoming, outer in (("3y^2", lambda y: (y ** 3).sum()),
                                    ("constant", lambda y: (y * torch.arange(3.0)).sum())):
                with self.subTest(**kw, incoming=incoming):
                    gx, = torch.autograd.grad(outer(m(x)), x, create_graph=True)
                    self.assertTrue(gx.requires_grad)
                    # also a second derivative taken to x or to the weight alone (a gradient
                    # penalty's; torch.autograd.functional.hessian's), which gave None or
                    # zeros on the Python operators where their node hung on fresh leaves
                    for to in (x, m.weight):
                        with self.assertRaisesRegex(RuntimeError, "^syncbn.torch.SyncBatchNorm's backward is not "
                                                    "differentiable"):
                            torch.autograd.grad((gx ** 2).sum(), to, retain_graph=True, allow_unused=True)
                    with self.assertRaisesRegex(RuntimeError, "^syncbn.torch.SyncBatchNorm's backward is not "
                                                "differentiable"):
                        (gx ** 2).sum().backward()
            with self.subTest(**kw, hessian=True):
                with self.assertRaisesRegex(RuntimeError, "^syncbn.torch.SyncBatchNorm's backward is not "
                                            "differentiable"):
                    torch.autograd.functional.hessian(lambda v: (m(v) ** 3).sum(), x.detach())
            # the bias alone requiring grad (frozen weight, x without grad), a constant incoming
            # gradient: no second-order term to lose, so no node, on both kinds alike
            m.weight.requires_grad_(False)
            gb, = torch.autograd.grad(m(torch.randn(4, 3)).sum(), m.bias, create_graph=True)
            self.assertFalse(gb.requires_grad)
            m.weight.requires_grad_(True)
            # under non-reentrant checkpointing, which refuses a second unpack of a saved
            # tensor: the first backward with create_graph runs (it unpacks them once)
            from torch.utils.checkpoint import checkpoint
            y = checkpoint(lambda t: m(t * 2), x, use_reentrant=False)
            gx, = torch.autograd.grad((y ** 3).sum(), x, create_graph=True)
            with self.assertRaisesRegex(RuntimeError, "^syncbn.torch.SyncBatchNorm's backward is not differentiable"):
                (gx ** 2).sum().backward()

    def test_grads_batched(self):
        """autograd.grad(is_grads_batched=True) (torch.autograd.functional.jacobian's
        vectorize=True), and torch.func.vmap over autograd.grad: a training layer's
        gradients for a batch of incoming gradients equal one backward per incoming
        gradient, plain, fused with a residual, and in place (leaky ReLU, with a residual),
        on both kinds of operators (the Python ones took the batched gradient's address:
        'Cannot access data pointer of Tensor that doesn't have storage', under vmap too)."""
        torch.manual_seed(8)
        for kw in ({}, {"activation": "relu"}, {"activation": "leaky_relu", "slope": 0.1, "inplace": True}):
            for how in ("is_grads_batched", "vmap"):
                with self.subTest(how=how, **kw):
                    m = sbt.SyncBatchNorm(3, comm=self.comm, **kw)
                    x = torch.randn(4, 3, 2, 2, requires_grad=True)
                    z = torch.randn(4, 3, 2, 2, requires_grad=True)
                    y = m(x, z) if kw else m(x)
                    inputs = (x, z, m.weight) if kw else (x, m.weight)
                    v = torch.randn(5, *y.shape)
                    if how == "vmap":
                        got = torch.func.vmap(lambda u: torch.autograd.grad(y, inputs, u, retain_graph=True))(v)
                    else:
                        got = torch.autograd.grad(y, inputs, v, is_grads_batched=True, retain_graph=True)
                    for i in range(v.shape[0]):
                        want = torch.autograd.grad(y, inputs, v[i], retain_graph=True)
                        for g, w in zip(got, want):
                            torch.testing.assert_close(g[i], w, rtol=1e-6, atol=1e-6)

    def test_eval_double_backward(self):
        """An evaluated layer (no exchange: torch ops in its backward) is twice
        differentiable, as nn.BatchNorm2d in eval is (gradient penalties, MAML with a frozen
        batch norm): both kinds of operators, plain and fused, against float64 PyTorch."""
        ref, x0, z0 = _eval_reference(6)
        for kw in ({}, {"activation": "leaky_relu", "slope": 0.2}, {"activation": "relu", "residual": True},
                   {"residual": True}):  # identity with a residual: dz is the incoming gradient itself
            with self.subTest(**kw):
                kw = dict(kw)
                res = kw.pop("residual", False)
                m = sbt.SyncBatchNorm(3, comm=self.comm, **kw)
                _load_float(m, ref)
                m.eval()
                ref.zero_grad()
                out = []
                for layer, x, z in ((m, x0.float().requires_grad_(), z0.float().requires_grad_()),
                                    (None, x0.clone().requires_grad_(), z0.clone().requires_grad_())):
                    if layer is not None:
                        y = layer(x, z) if res else layer(x)
                    else:
                        y = ref(x) + z if res else ref(x)
                        act = kw.get("activation")
                        y = F.leaky_relu(y, 0.2) if act == "leaky_relu" else F.relu(y) if act == "relu" else y
                    gx, gz = torch.autograd.grad((y.double() ** 3).sum(), (x, z), create_graph=True,
                                                 allow_unused=True)
                    (gx.double() ** 2).sum().backward()
                    w = m.weight if layer is not None else ref.weight
                    out.append((gx.detach().double(), x.grad.double(), w.grad.double())
                               + ((gz.detach().double(), z.grad.double()) if res else ()))
                for got, want in zip(*out):
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

    def test_eval_gradients_require_grad_as_pytorch(self):
        """An evaluated layer's gradients under create_graph=True require grad exactly where
        float64 PyTorch's (nn.BatchNorm2d, then + z and the activation) do, and a second
        derivative from each reaches the same inputs with the same values: a gradient
        penalty on a frozen layer's weight gradient (x without grad, a constant incoming
        gradient) raised 'does not require grad' where PyTorch's reaches no input. Plain
        and fused, x with and without grad, a constant incoming gradient and one that
        requires grad; both kinds of operators."""
        ref, x0, z0 = _eval_reference(9)
        c = torch.randn(2, 3, 4, 5, dtype=torch.float64)
        checked = 0
        for kw in ({}, {"activation": "relu", "residual": True}, {"residual": True},
                   {"activation": "leaky_relu", "slope": 0.2}):
            kw = dict(kw)
            res = kw.pop("residual", False)
            act = kw.get("activation")
            m = sbt.SyncBatchNorm(3, comm=self.comm, **kw)
            _load_float(m, ref)
            m.eval()
            for x_grad, incoming in itertools.product((False, True), ("constant", "y^3")):
                with self.subTest(**kw, residual=res, x_grad=x_grad, incoming=incoming):
                    out = []
                    for layer in (m, None):
                        dt = torch.float32 if layer is not None else torch.float64
                        x = x0.to(dt).detach().clone().requires_grad_(x_grad)
                        z = z0.to(dt).detach().clone().requires_grad_(x_grad)
                        if layer is not None:
                            y = layer(x, z) if res else layer(x)
                            w, b = m.weight, m.bias
                        else:
                            y = ref(x) + z if res else ref(x)
                            y = F.leaky_relu(y, 0.2) if act == "leaky_relu" else F.relu(y) if act == "relu" else y
                            w, b = ref.weight, ref.bias
                        inputs = [w, b] + ([x] + ([z] if res else []) if x_grad else [])
                        loss = (y.double() * c).sum() if incoming == "constant" else (y.double() ** 3).sum()
                        grads = torch.autograd.grad(loss, inputs, create_graph=True)
                        seconds = []
                        for g in grads:
                            if not g.requires_grad:
                                seconds.append(None)
                                continue
                            d2 = torch.autograd.grad((g.double() ** 2).sum(), inputs, retain_graph=True,
                                                     allow_unused=True)
                            seconds.append([None if d is None else d.double() for d in d2])
                        out.append(([g.requires_grad for g in grads], seconds))
                    (got_req, got_d2), (want_req, want_d2) = out
                    self.assertEqual(got_req, want_req)
                    for got, want in zip(got_d2, want_d2):
                        if want is None:
                            continue
                        self.assertEqual([d is None for d in got], [d is None for d in want])
                        for gd, wd in zip(got, want):
                            if wd is not None:
                                torch.testing.assert_close(gd, wd, rtol=1e-4, atol=1e-4)
                                checked += 1
        self.assertGreater(checked, 20)

    def test_eval_second_derivatives_under_transforms(self):
        """An evaluated layer's second derivatives where the gradients are functorch's
        (jacrev of jacrev, grad of grad through functional_call: the C++ operators', or
        with the Python ones, whose autograd.Function takes no grad transform, PyTorch's
        batch norm) or batched (autograd.grad(is_grads_batched=True,
        create_graph=True), both kinds) equal float64 PyTorch's: a gradient made a fresh
        leaf there cut the outer level's graph (zeros) or had no batching rule (detach
        raised)."""
        torch.manual_seed(10)
        stats = dict(running_mean=torch.tensor([0.1, -0.2, 0.3]), running_var=torch.tensor([1.5, 0.7, 1.1]),
                     weight=torch.tensor([1.2, 0.8, -0.5]), bias=torch.tensor([0.1, -0.2, 0.3]))
        for kw in ({}, {"activation": "relu"}):
            with self.subTest(**kw):
                m = sbt.SyncBatchNorm(3, comm=self.comm, **kw).eval()
                ref = torch.nn.BatchNorm2d(3).double().eval()
                m.load_state_dict(dict(m.state_dict(), **stats))
                ref.load_state_dict(dict(ref.state_dict(), **{k: v.double() for k, v in stats.items()}))
                post = torch.relu if kw else (lambda t: t)
                x = torch.randn(2, 3, 1, 2)
                got = torch.func.jacrev(torch.func.jacrev(lambda v: (m(v) ** 3).sum()))(x)
                want = torch.func.jacrev(torch.func.jacrev(lambda v: (post(ref(v)) ** 3).sum()))(x.double())
                self.assertGreater(want.abs().max().item(), 1.0)
                torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
                c = torch.randn(2, 3, 1, 2)
                params = {k: v.detach() for k, v in m.named_parameters()}
                rparams = {k: v.detach() for k, v in ref.named_parameters()}
                got = torch.func.grad(lambda v: torch.func.grad(lambda p: (
                    torch.func.functional_call(m, p, (v,)) * c).sum())(params)["weight"].sum())(x)
                want = torch.func.grad(lambda v: torch.func.grad(lambda p: (
                    post(torch.func.functional_call(ref, p, (v,))) * c.double()).sum())(rparams)["weight"].sum())(
                    x.double())
                torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
                v = torch.randn(4, 2, 3, 1, 2)
                out = []
                for layer, dt, p in ((m, torch.float32, lambda t: t), (ref, torch.float64, post)):
                    xx = x.to(dt).requires_grad_()
                    gw, gx = torch.autograd.grad(p(layer(xx)), [layer.weight, xx], v.to(dt), is_grads_batched=True,
                                                 create_graph=True)
                    out.append((gw.detach().double(), gx.detach().double(),
                                torch.autograd.grad((gw ** 2).sum(), xx)[0].double()))
                for got, want in zip(*out):
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

    def test_func_grad_of_training_layer(self):
        """torch.func.grad of a training layer, plain and fused, to its input and to its
        parameters (functional_call) on the C++ operators equals float64 F.batch_norm's;
        the running statistics count each call once. A second derivative (grad of grad,
        to x or to the weight) raises the layer's error. Before, grad raised at first
        order, after the forward had updated the running statistics, and once it ran, the
        backward's detach() cut the outer level's history: a second derivative of 0. The
        Python operators take no grad transform and say so before anything is written."""
        torch.manual_seed(12)
        x, c = torch.randn(4, 3, 3, 2), torch.randn(4, 3, 3, 2)
        for act in ("identity", "relu", "leaky_relu"):
            m = sbt.SyncBatchNorm(3, comm=self.comm, activation=act, slope=0.1)
            with torch.no_grad():
                m.weight.copy_(torch.tensor([1.2, -0.7, 0.4]))
                m.bias.copy_(torch.tensor([0.1, 0.3, -0.2]))
            post = {"identity": lambda t: t, "relu": torch.relu, "leaky_relu": lambda t: F.leaky_relu(t, 0.1)}[act]
            params = {k: v.detach() for k, v in m.named_parameters()}
            rparams = {k: v.double() for k, v in params.items()}

            def ref(v, p, post=post):
                return post(F.batch_norm(v, None, None, p["weight"], p["bias"], True, 0.0, 1e-5))

            def loss_x(v, m=m):
                return (m(v) * c).pow(2).sum()

            def loss_p(p, m=m):
                return (torch.func.functional_call(m, p, (x,)) * c).pow(2).sum()

            if _ops.NATIVE is None:
                with self.assertRaisesRegex(RuntimeError, r"syncbn.torch.SyncBatchNorm in training under torch.func's "
                                                          r"grad, vjp or jacrev: the Python operators \(SYNCBN_TORCH_"
                                                          r"NATIVE=0"):
                    torch.func.grad(loss_x)(x)
                self.assertEqual(int(m.num_batches_tracked), 0)
                continue
            with self.subTest(activation=act):
                got = torch.func.grad(loss_x)(x)
                want = torch.func.grad(lambda v: (ref(v, rparams) * c.double()).pow(2).sum())(x.double())
                torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
                got = torch.func.grad(loss_p)(params)
                want = torch.func.grad(lambda p: (ref(x.double(), p) * c.double()).pow(2).sum())(rparams)
                for k in want:
                    torch.testing.assert_close(got[k].double(), want[k], rtol=1e-5,
                                               atol=1e-5 * want[k].abs().max().item())
                self.assertEqual(int(m.num_batches_tracked), 2)
                with self.assertRaisesRegex(RuntimeError, "^syncbn.torch.SyncBatchNorm's backward is not "
                                                          "differentiable"):
                    torch.func.grad(lambda v: torch.func.grad(loss_x)(v).pow(2).sum())(x)
                with self.assertRaisesRegex(RuntimeError, "^syncbn.torch.SyncBatchNorm's backward is not "
                                                          "differentiable"):
                    torch.func.grad(lambda p: torch.func.grad(
                        lambda v: (torch.func.functional_call(m, p, (v,)) * c).pow(3).sum())(x).pow(2).sum())(params)
        # the backward operator called with an incoming gradient that requires grad: the
        # gradients of the call without grad, on the node that raises when differentiated
        # (both kinds; it raised at the call before)
        xs, w = torch.randn(4, 3, 2), torch.tensor([1.2, -0.7, 0.4])
        _, stats = _ops.batch_norm_train(xs, w, torch.zeros(3), None, None, None, 1e-5, 0.1, self.comm.id)
        dy = torch.randn(4, 3, 2, requires_grad=True)
        dx, dwb = _ops.batch_norm_backward(dy, xs, w, stats, 1e-5, self.comm.id, True, True)
        with torch.no_grad():
            dx0, dwb0 = _ops.batch_norm_backward(dy, xs, w, stats, 1e-5, self.comm.id, True, True)
        self.assertTrue(torch.equal(dx, dx0) and torch.equal(dwb, dwb0))
        self.assertTrue(dx.requires_grad and dwb.requires_grad)
        with self.assertRaisesRegex(RuntimeError, "^syncbn.torch.SyncBatchNorm's backward is not differentiable"):
            dx.pow(2).sum().backward()
        m = sbt.SyncBatchNorm(3, comm=self.comm)
        # jvp is not grad: on both kinds the operator's own forward-mode error
        with self.assertRaisesRegex(RuntimeError, r"syncbn.batch_norm_train: forward-mode AD \(jvp, dual tensors\) "
                                                  r"is not implemented"):
            torch.func.jvp(m, (torch.randn(4, 3, 2),), (torch.randn(4, 3, 2),))

    def test_functionalize(self):
        """torch.func.functionalize: a training layer (plain, fused, without running
        statistics) raises the layer's error, which says why (its operator writes its inputs,
        which functionalize takes from no custom operator) and what does (torch.compile,
        torch.export), before anything is written; an evaluated layer runs, as eagerly."""
        x = torch.randn(4, 3, 5) * 2 + 1
        layers = (sbt.SyncBatchNorm(3, comm=self.comm), sbt.SyncBatchNorm(3, comm=self.comm, activation="relu"),
                  sbt.SyncBatchNorm(3, comm=self.comm, track_running_stats=False))
        for m in layers:
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
            before = {k: v.clone() for k, v in m.state_dict().items()}
            with self.assertRaisesRegex(RuntimeError, r"^syncbn.torch.SyncBatchNorm in training under "
                                                      r"torch.func.functionalize: .* nothing was written"):
                torch.func.functionalize(m)(x)
            for k, v in m.state_dict().items():
                self.assertTrue(torch.equal(v, before[k]), k)
            if m.track_running_stats:
                m(x)  # (running statistics of this batch)
                m.eval()
                torch.testing.assert_close(torch.func.functionalize(m)(x), m(x), rtol=0, atol=0)

    def test_no_forward_mode_ad(self):
        x, t = torch.randn(4, 3), torch.randn(4, 3)
        rm, rv = torch.zeros(3), torch.ones(3)
        with self.assertRaisesRegex(RuntimeError, "forward-mode AD|setup_context"):
            torch.func.jvp(lambda v: _ops.batch_norm_infer(v, rm, rv, None, None, 1e-5), (x,), (t,))
        with self.assertRaisesRegex(RuntimeError, "forward-mode AD|setup_context"):
            torch.func.jvp(lambda v: _ops.batch_norm_train(v, None, None, None, None, None, 1e-5, 0.1,
                                                           self.comm.id)[0], (x,), (t,))

    def test_dual_tensors_refused_before_anything_is_written(self):
        """A layer in training given dual tensors (torch.autograd.forward_ad) raises that
        forward-mode AD is not implemented, naming the operator, and writes nothing: the
        running statistics and num_batches_tracked stay. On the Python operators PyTorch's
        generic NotImplementedError ("You must implement the jvp function") came after the
        forward had run and updated them."""
        import torch.autograd.forward_ad as fwad

        for activation in ("identity", "relu"):
            m = sbt.SyncBatchNorm(3, comm=self.comm, activation=activation)
            state = copy.deepcopy(m.state_dict())
            with fwad.dual_level():
                with self.assertRaisesRegex(RuntimeError, r"syncbn\.batch_norm(_act)?_train: forward-mode AD "
                                                          r"\(jvp, dual tensors\) is not implemented"):
                    m(fwad.make_dual(torch.randn(4, 3), torch.randn(4, 3)))
            for k, v in m.state_dict().items():
                self.assertTrue(torch.equal(v, state[k]), k)

    def test_running_statistics_not_differentiable(self):
        """A running statistic that requires grad (computed from parameters: functional_call,
        meta-learning) is refused, in training and in eval, plain and fused, by the
        operators and by the layer's eager calls, as nn.BatchNorm's native_batch_norm refuses
        it; training writes nothing first. Before, its gradient was silently None (zeros
        under torch.func.grad). Under no_grad it is a plain input."""
        from syncbn import _fused

        x = torch.randn(4, 3)
        for name in ("running_mean", "running_var"):
            p = torch.zeros(3, requires_grad=True)
            rm, rv = (p + 0.5, torch.ones(3)) if name == "running_mean" else (torch.zeros(3), p + 1.0)
            rm0, rv0, nbt = rm.detach().clone(), rv.detach().clone(), torch.zeros((), dtype=torch.long)
            calls = {
                "batch_norm_infer": lambda: _ops.batch_norm_infer(x, rm, rv, None, None, 1e-5),
                "batch_norm_train": lambda: _ops.batch_norm_train(x, None, None, rm, rv, nbt, 1e-5, 0.1,
                                                                  self.comm.id),
                "batch_norm_act_infer": lambda: _fused.batch_norm_act_infer(x, None, rm, rv, None, None, 1e-5, 1,
                                                                            0.0),
                "batch_norm_act_train": lambda: _fused.batch_norm_act_train(x, None, None, None, rm, rv, nbt, 1e-5,
                                                                            0.1, self.comm.id, 1, 0.0, False),
            }
            for who, call in calls.items():
                with self.assertRaisesRegex(RuntimeError, f"syncbn.{who} is not differentiable with respect to "
                                                          f"argument '{name}'"):
                    call()
                self.assertTrue(torch.equal(rm.detach(), rm0) and torch.equal(rv.detach(), rv0))
                self.assertEqual(int(nbt), 0)
                with torch.no_grad():
                    out = call()
                self.assertFalse((out if isinstance(out, torch.Tensor) else out[0]).requires_grad)
                with torch.no_grad():
                    rm.copy_(rm0), rv.copy_(rv0), nbt.zero_()
            for activation in ("identity", "relu"):
                m = sbt.SyncBatchNorm(3, comm=self.comm, activation=activation)
                for training in (True, False):
                    m.train(training)
                    with self.assertRaisesRegex(RuntimeError, f"is not differentiable with respect to argument "
                                                              f"'{name}'"):
                        torch.func.functional_call(m, {name: p + (0.5 if name == "running_mean" else 1.0)}, (x,))
                    self.assertEqual(int(m.num_batches_tracked), 0)

    def test_jacrev_through_training_layer(self):
        """jacrev of a training layer (the rows of its vjp under vmap) on the C++ operators
        against nn.BatchNorm2d's in float64, plain and fused (relu: nn.BatchNorm2d then
        relu); their once_differentiable took the gradients' tensor_data(), which a
        batched tensor refuses ("accessing 'data' under vmap transform is not allowed").
        The Python operators take no torch.func transform but vmap (the layer says so)."""
        torch.manual_seed(8)
        x = torch.randn(2, 3, 2, 2)
        for activation in ("identity", "relu"):
            m = sbt.SyncBatchNorm(3, comm=self.comm, activation=activation, track_running_stats=False)
            ref = torch.nn.BatchNorm2d(3, track_running_stats=False).double()

            def f(v, ref=ref, act=activation):
                return torch.relu(ref(v)) if act == "relu" else ref(v)

            if _ops.NATIVE is None:
                with self.assertRaisesRegex(RuntimeError, "the Python operators .* take none of them; the C\\+\\+ "
                                                          "operators take them all"):
                    torch.func.jacrev(m)(x)
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # PyTorch's per-row fallback of the backward operators
                got = torch.func.jacrev(m)(x)
            torch.testing.assert_close(got.double(), torch.func.jacrev(f)(x.double()), rtol=1e-5, atol=1e-5)

    def test_momentum_none_without_running_statistics(self):
        """momentum=None with track_running_stats=False trains as nn.BatchNorm1d does (no
        running statistics: momentum plays no part)."""
        m = sbt.SyncBatchNorm(3, momentum=None, track_running_stats=False, comm=self.comm)
        ref = torch.nn.BatchNorm1d(3, momentum=None, track_running_stats=False)
        x = torch.randn(6, 3)
        torch.testing.assert_close(m(x), ref(x), rtol=1e-5, atol=1e-5)

    def test_complex_input_named_as_python_names_it(self):
        x = torch.randn(4, 3).to(torch.complex64)
        with self.assertRaisesRegex(TypeError, r"input dtype torch\.complex64;"):
            _ops.batch_norm_train(x, None, None, None, None, None, 1e-5, 0.1, self.comm.id)
        w = torch.ones(3, dtype=torch.complex128)
        with self.assertRaisesRegex(TypeError, r"weight is torch\.complex128; it must be floating point"):
            _ops.batch_norm_train(torch.randn(4, 3), w, None, None, None, None, 1e-5, 0.1, self.comm.id)

    def test_library_errors_are_syncbn_errors(self):
        """A destroyed comm, found in the backward and by a direct call: SyncBNError
        (sbnInvalidUsage), as the layer's forward raises it."""
        if not raises_syncbn_error():
            self.skipTest("C++ operators built without Python's headers: RuntimeError with SyncBNError's text")
        comm = syncbn.cpu_team(1)[0]
        m = sbt.SyncBatchNorm(3, comm=comm)
        y = m(torch.randn(4, 3, requires_grad=True))
        comm.destroy()
        with self.assertRaises(syncbn.SyncBNError) as cm:
            y.sum().backward()
        self.assertEqual(cm.exception.name, "sbnInvalidUsage")
        self.assertIn(f"no live comm has id {comm.id}", str(cm.exception))
        with self.assertRaises(syncbn.SyncBNError):
            _ops.batch_norm_train(torch.randn(4, 3), None, None, None, None, None, 1e-5, 0.1, comm.id)

    def test_team_collected_during_a_call(self):
        """A team whose Comms are collected while rank 0 waits inside its backward: rank
        0's comm is not freed under the call (it is destroyed when the call returns); rank
        0 learns that rank 1 was destroyed, and rank 1's own call that its comm was. Run
        in a process of its own (a freed comm read by the call would be memory misuse,
        caught by the error text or a crash)."""
        r = subprocess.run([sys.executable, "-c", TEAM_COLLECTED], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        outcome = dict(line.split(": ", 1) for line in r.stdout.splitlines() if line.startswith("rank"))
        for rank in ("rank 0", "rank 1"):
            self.assertIn(rank, outcome, r.stdout)
            self.assertRegex(outcome[rank], r"^(ok|SyncBNError: .*(destroyed|no live comm))", r.stdout)
        self.assertNotIn("not a valid sbnComm_t", r.stdout)
        self.assertNotIn("rank 0 of the team was destroyed", outcome["rank 0"])  # its own comm, under its call

    def test_comm_destroyed_during_its_call(self):
        """A comm destroyed while an operator call on it waits (rank 0 in its exchange)
        is gone at once for later calls and destroyed when the call returns; the call
        completes with its peer. The C++ operators' table and the Python operators
        (Comm._call with op=True) alike."""
        comms = syncbn.cpu_team(2, timeout_ms=20000)
        ids = [c.id for c in comms]
        xs = [torch.randn(3, 4, 5) for _ in ids]
        res = {}

        def rank0():
            try:
                _ops.batch_norm_train(xs[0], None, None, None, None, None, 1e-5, 0.1, ids[0])
                res[0] = "ok"
            except Exception as e:  # noqa: BLE001
                res[0] = repr(e)

        t = threading.Thread(target=rank0)
        t.start()
        time.sleep(0.3)  # rank 0 waits for rank 1 in its exchange
        comms[0].destroy()  # during rank 0's call
        with self.assertRaisesRegex(RuntimeError, "no live comm"):
            _ops.batch_norm_train(xs[0], None, None, None, None, None, 1e-5, 0.1, ids[0])
        _ops.batch_norm_train(xs[1], None, None, None, None, None, 1e-5, 0.1, ids[1])
        t.join()
        self.assertEqual(res[0], "ok")
        if _ops.NATIVE is not None:
            self.assertEqual(_ops.NATIVE.comm_live(ids[0]), 0)
        else:
            self.assertIsNone(comms[0]._deferred)
        # destroyed as the call returned: a CPU team's rank destroyed aborts the team
        self.assertEqual(syncbn._capi.result_name(comms[1].async_error()), "sbnAborted")
        comms[1].destroy()


TEAM_COLLECTED = """
import gc, threading, time, torch, syncbn, syncbn.torch as sbt
from syncbn import _ops
gc.disable()
comms = syncbn.cpu_team(2, timeout_ms=20000)
ids = [c.id for c in comms]
xs = [torch.randn(3, 4, 5, requires_grad=True) for _ in ids]
out = [None, None]
def fwd(r):
    out[r] = _ops.batch_norm_train(xs[r], None, None, None, None, None, 1e-5, 0.1, ids[r])
ts = [threading.Thread(target=fwd, args=(r,)) for r in (0, 1)]
[t.start() for t in ts]; [t.join() for t in ts]
del comms, ts
res = {}
def bwd(r):
    try:
        out[r][0].sum().backward()
        res[r] = "ok"
    except Exception as e:
        res[r] = f"{type(e).__name__}: {e}"
t0 = threading.Thread(target=bwd, args=(0,))
t0.start()
time.sleep(0.5)          # rank 0 is waiting for rank 1 inside its backward
gc.collect()             # collects the whole team (its Comms refer to each other)
bwd(1)
t0.join()
for r in (0, 1):
    print(f"rank {r}: {res[r]}")
"""


def act_ref(v, activation, slope):
    """float64 PyTorch's activation of a fused layer (None: identity)."""
    if activation == "relu":
        return F.relu(v)
    if activation == "leaky_relu":
        return F.leaky_relu(v, slope)
    return v


# each fused case: (layer keyword arguments, a residual)
FUSED = (({}, True), ({"activation": "relu"}, True), ({"activation": "leaky_relu", "slope": 0.2}, True))


class TestOperatorArguments(TeamOfOne):
    """What each argument of the operators does, called directly and through the layers,
    on both kinds of operators (C++ and Python; CI runs this file with each):

    - every refusal of the plain operators' argument checks (shape, pairing, dtype of
      each argument), and the fused operators' that test_torch_fused leaves out, with its
      message, and nothing written: the running statistics and num_batches_tracked as they
      were;
    - eps reaches every call that reads it: the training forward (whose statistics the
      backward reads: the library's backward takes invstd, not eps), the eval forward and
      its gradients, plain and fused, at eps 0.5 (where 1e-5 in place of it moves the
      normalising factor by 8 to 47 %), against float64 PyTorch within 1e-5 (outputs of
      order 1) and 1e-4 (gradients: sums of 20 products of order 1);
    - a gradient reaches an input that alone requires grad (bias, weight, the residual):
      training and eval, plain and fused;
    - autograd.grad to some of the inputs (the weight alone, or x alone, while the others
      require grad): the right values and no error (a gradient of the wrong shape for x
      raised);
    - the backward operator without a weight and weight_grad True: grad_weight_bias is
      empty, as its fake kernel says."""

    def _pair(self, kw, res, train, grad, eps=1e-5):
        """A layer of `kw` (with a residual: res) in training or eval, its weight, bias and
        running statistics drawn, on a fresh float64 batch, and float64 PyTorch's batch norm
        (+ residual, activation) beside it; the inputs named in `grad` ("x", "z", "weight",
        "bias") require grad. Returns (ours, theirs): the layer's output and the inputs by
        name, fp32 and float64."""
        X, Z = torch.randn(4, 3, 5, dtype=torch.float64), torch.randn(4, 3, 5, dtype=torch.float64)
        m = sbt.SyncBatchNorm(3, eps=eps, comm=self.comm, **kw).train(train)
        with torch.no_grad():
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.5, 0.5)
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.2, 0.6)
        rm, rv = m.running_mean.double(), m.running_var.double()
        ours = {"x": X.float(), "z": Z.float(), "weight": m.weight, "bias": m.bias}
        theirs = {"x": X, "z": Z, "weight": m.weight.detach().double(), "bias": m.bias.detach().double()}
        for name in ours:
            ours[name].requires_grad_(name in grad)  # (leaves: the fp32 copies, the layer's parameters)
            theirs[name] = theirs[name].clone().requires_grad_(name in grad)
        y = m(ours["x"], ours["z"]) if res else m(ours["x"])
        yr = F.batch_norm(theirs["x"], None if train else rm, None if train else rv, theirs["weight"],
                          theirs["bias"], train, 0.0, eps)
        yr = act_ref(yr + theirs["z"] if res else yr, kw.get("activation"), kw.get("slope", 0.01))
        return (y, ours), (yr, theirs)

    def _refused(self, cases, x, rm, rv, nbt):
        """Each of `cases` ((name, call, exception type, message pattern after "syncbn."))
        raises that exception with that message and writes nothing: x, rm (0.5), rv (2.0)
        and nbt (7) as they were (set again before each call, after a mutant's write)."""
        x0 = x.clone()
        for name, call, err, pattern in cases:
            with self.subTest(name):
                rm.fill_(0.5), rv.fill_(2.0), nbt.fill_(7)
                with self.assertRaisesRegex(err, r"^syncbn\." + pattern):
                    call()
                self.assertTrue(torch.equal(rm, torch.full((3,), 0.5)))
                self.assertTrue(torch.equal(rv, torch.full((3,), 2.0)))
                self.assertEqual(int(nbt), 7)
                self.assertTrue(torch.equal(x, x0))

    def test_argument_refusals_write_nothing(self):
        train, backward, infer = (torch.ops.syncbn.batch_norm_train.default,
                                  torch.ops.syncbn.batch_norm_backward.default,
                                  torch.ops.syncbn.batch_norm_infer.default)
        cid = self.comm.id
        x = torch.randn(4, 3, 5)
        one = torch.ones(3)
        rm, rv, nbt = torch.full((3,), 0.5), torch.full((3,), 2.0), torch.tensor(7)
        stats = torch.ones(2, 3)
        cases = (
            ("weight (3, 1)", lambda: train(x, one.view(3, 1), None, rm, rv, nbt, 1e-5, 0.1, cid),
             RuntimeError, r"batch_norm_train: weight has shape \(3, 1\); the input has 3 channels, so it must be "
                           r"\(3,\)$"),
            ("bias (1, 3)", lambda: train(x, one, one.view(1, 3), rm, rv, nbt, 1e-5, 0.1, cid),
             RuntimeError, r"batch_norm_train: bias has shape \(1, 3\);"),
            ("running_var (3, 1)", lambda: train(x, one, one, rm, rv.view(3, 1), nbt, 1e-5, 0.1, cid),
             RuntimeError, r"batch_norm_train: running_var has shape \(3, 1\);"),
            ("running_mean alone", lambda: train(x, one, one, rm, None, nbt, 1e-5, 0.1, cid),
             RuntimeError, r"batch_norm_train: running_mean and running_var come together \(both or neither\)$"),
            ("running_var alone", lambda: train(x, one, one, None, rv, nbt, 1e-5, 0.1, cid),
             RuntimeError, "batch_norm_train: running_mean and running_var come together"),
            ("bias without weight", lambda: train(x, None, one, rm, rv, nbt, 1e-5, 0.1, cid),
             RuntimeError, r"batch_norm_train: a bias without a weight \(the library takes both or neither\)$"),
            ("num_batches_tracked float", lambda: train(x, one, one, rm, rv, torch.tensor(7.0), 1e-5, 0.1, cid),
             RuntimeError, r"batch_norm_train: num_batches_tracked must be one int64 \(got torch.float32, 1 "
                           r"elements\)$"),
            ("num_batches_tracked int32", lambda: train(x, one, one, rm, rv, torch.tensor(7, dtype=torch.int32),
                                                        1e-5, 0.1, cid),
             RuntimeError, r"batch_norm_train: num_batches_tracked must be one int64 \(got torch.int32, 1 elements\)$"),
            ("num_batches_tracked two", lambda: train(x, one, one, rm, rv, torch.tensor([7, 7]), 1e-5, 0.1, cid),
             RuntimeError, r"batch_norm_train: num_batches_tracked must be one int64 \(got torch.int64, 2 elements\)$"),
            ("grad_out float64", lambda: backward(x.double(), x, one, stats, 1e-5, cid, True, True),
             RuntimeError, r"batch_norm_backward: grad_out is torch.float64 \(4, 3, 5\); the input is torch.float32 "
                           r"\(4, 3, 5\)$"),
            ("grad_out (4, 3, 4)", lambda: backward(x[..., :4], x, one, stats, 1e-5, cid, True, True),
             RuntimeError, r"batch_norm_backward: grad_out is torch.float32 \(4, 3, 4\)"),
            ("stats (3, 2)", lambda: backward(x, x, one, stats.t(), 1e-5, cid, True, True),
             RuntimeError, r"batch_norm_backward: stats must be float32 \(2, 3\) \(the forward's\), got "
                           r"torch.float32 \(3, 2\)$"),
            ("stats (2, 4)", lambda: backward(x, x, one, torch.ones(2, 4), 1e-5, cid, True, True),
             RuntimeError, r"batch_norm_backward: stats must be float32 \(2, 3\) \(the forward's\), got "
                           r"torch.float32 \(2, 4\)$"),
            ("stats float64", lambda: backward(x, x, one, stats.double(), 1e-5, cid, True, True),
             RuntimeError, r"batch_norm_backward: stats must be float32 \(2, 3\) \(the forward's\), got "
                           r"torch.float64 \(2, 3\)$"),
            ("backward weight (3, 1)", lambda: backward(x, x, one.view(3, 1), stats, 1e-5, cid, True, True),
             RuntimeError, r"batch_norm_backward: weight has shape \(3, 1\)"),
            ("infer running_mean (1, 3)", lambda: infer(x, rm.view(1, 3), rv, one, one, 1e-5),
             RuntimeError, r"batch_norm_infer: running_mean has shape \(1, 3\)"),
            ("infer bias without weight", lambda: infer(x, rm, rv, None, one, 1e-5),
             RuntimeError, r"batch_norm_infer: a bias without a weight \(the library takes both or neither\)$"),
        )
        self._refused(cases, x, rm, rv, nbt)
        # the same buffers taken: the checks refuse what is wrong only
        train(x, one, one, rm, rv, nbt, 1e-5, 0.1, cid)
        self.assertEqual(int(nbt), 8)

    def test_fused_argument_refusals_write_nothing(self):
        """The fused operators' checks that test_torch_fused's refusal tests leave out (the
        residual's dtype, an unknown activation, the backward's out and grad_out against
        its base, its stats), each with its message, nothing written."""
        ops, cid, relu = torch.ops.syncbn, self.comm.id, syncbn.RELU
        x = torch.randn(4, 3, 5)
        one, stats = torch.ones(3), torch.ones(2, 3)
        rm, rv, nbt = torch.full((3,), 0.5), torch.full((3,), 2.0), torch.tensor(7)
        cases = (
            ("residual float64", lambda: ops.batch_norm_act_train(x, x.double(), one, one, rm, rv, nbt, 1e-5, 0.1, cid,
                                                                  relu, 0.0, False),
             TypeError, r"batch_norm_act_train: the residual is torch.float64 and the input torch.float32: they must "
                        "be equal$"),
            ("activation 3", lambda: ops.batch_norm_act_train(x, None, one, one, rm, rv, nbt, 1e-5, 0.1, cid, 3, 0.0,
                                                              False),
             ValueError, r"batch_norm_act_train: activation 3: 0 \(identity\), 1 \(relu\) or 2 \(leaky_relu\)$"),
            ("infer residual float16", lambda: ops.batch_norm_act_infer(x, x.half(), rm, rv, one, one, 1e-5, relu, 0.0),
             TypeError, "batch_norm_act_infer: the residual is torch.float16 and the input torch.float32"),
            ("backward without input and out", lambda: ops.batch_norm_act_backward(
                x, None, None, one, one, stats, 1e-5, cid, relu, 0.0, True, False, True),
             RuntimeError, r"batch_norm_act_backward: input and out are both None \(the in-place backward takes "
                           r"out\)$"),
            ("backward relu without out", lambda: ops.batch_norm_act_backward(
                x, x, None, one, one, stats, 1e-5, cid, relu, 0.0, True, False, True),
             RuntimeError, "batch_norm_act_backward: out is None: relu's gradient needs the forward's output$"),
            ("backward out float64", lambda: ops.batch_norm_act_backward(
                x, x, x.double(), one, one, stats, 1e-5, cid, relu, 0.0, True, False, True),
             RuntimeError, r"batch_norm_act_backward: out is torch.float64 \(4, 3, 5\); the input is torch.float32 "
                           r"\(4, 3, 5\)$"),
            ("backward grad_out (4, 3, 4), in place", lambda: ops.batch_norm_act_backward(
                x[..., :4], None, x, one, one, stats, 1e-5, cid, syncbn.LEAKY_RELU, 0.1, True, False, True),
             RuntimeError, r"batch_norm_act_backward: grad_out is torch.float32 \(4, 3, 4\); the out is "
                           r"torch.float32 \(4, 3, 5\)$"),
            ("backward stats (2, 4)", lambda: ops.batch_norm_act_backward(
                x, x, x, one, one, torch.ones(2, 4), 1e-5, cid, relu, 0.0, True, False, True),
             RuntimeError, r"batch_norm_act_backward: stats must be float32 \(2, 3\) \(the forward's\), got "
                           r"torch.float32 \(2, 4\)$"),
        )
        self._refused(cases, x, rm, rv, nbt)

    def test_numbers_in_messages_as_python_writes_them(self):
        """A refused slope (and momentum) is named in the message as Python's repr writes
        it: the C++ operators format doubles themselves (py_float), so every branch of
        that is held to repr here: integral values ("-2.0"), the exponent's thresholds
        (1e-4 and 1e-5, 1e15 and 1e16), the shortest round-trip digits, values past
        float32's range, NaN and infinity. (A negative slope that is 0 as a float32 is
        taken, as the library reads it.)"""
        ops, cid, x = torch.ops.syncbn, self.comm.id, torch.randn(4, 3, 5)
        values = (-2.0, -1.0, -100.0, -0.1, -2.5, -1e-4, -1.5e-4, -1e-5, -1.25e-5, -123456.75, -1e15, -9.5e15,
                  -1e16, -1.5e16, -1e22, -1.0 / 3.0, -3.4e38, -1e39, -1e300, -float("inf"),
                  float("nan"), -0.0001234, -12345678901234567.0)
        for v in values:
            with self.subTest(v=v):
                with self.assertRaises(ValueError) as cm:
                    ops.batch_norm_act_train(x, None, None, None, None, None, None, 1e-5, 0.1, cid,
                                             syncbn.LEAKY_RELU, v, False)
                self.assertIn(f"slope {v!r}: leaky ReLU's negative slope must be finite and >= 0", str(cm.exception))
        for v in (-2.0, -1e-5, -1e16):
            with self.subTest(momentum=v):
                with self.assertRaisesRegex(ValueError, "^syncbn: momentum must be >= 0 \\(None: the cumulative "
                                                        f"average\\), got {re.escape(repr(v))}$"):
                    ops.batch_norm_train(x, None, None, None, None, None, 1e-5, v, cid)

    def test_eps_reaches_every_call(self):
        torch.manual_seed(31)
        G = torch.randn(4, 3, 5, dtype=torch.float64)
        for (kw, res), train in itertools.product((({}, False),) + FUSED, (True, False)):
            with self.subTest(**kw, residual=res, train=train):
                names = ("x", "weight", "bias") + (("z",) if res else ())
                (y, ours), (yr, theirs) = self._pair(kw, res, train, names, eps=0.5)
                torch.testing.assert_close(y.double(), yr, rtol=1e-5, atol=1e-5)
                (y.double() * G).sum().backward()
                (yr * G).sum().backward()
                for name in names:
                    torch.testing.assert_close(ours[name].grad.double(), theirs[name].grad, rtol=1e-4, atol=1e-4,
                                               msg=name)

    def test_gradient_to_one_input(self):
        torch.manual_seed(32)
        G = torch.randn(4, 3, 5, dtype=torch.float64)
        for (kw, res), train in itertools.product((({}, False),) + FUSED, (True, False)):
            for alone in ("weight", "bias") + (("z",) if res else ()):
                with self.subTest(**kw, residual=res, train=train, alone=alone):
                    (y, ours), (yr, theirs) = self._pair(kw, res, train, (alone,))
                    self.assertTrue(y.requires_grad)
                    (y.double() * G).sum().backward()
                    (yr * G).sum().backward()
                    self.assertIsNotNone(ours[alone].grad)
                    torch.testing.assert_close(ours[alone].grad.double(), theirs[alone].grad, rtol=1e-4, atol=1e-4)

    def test_gradient_of_some_inputs(self):
        torch.manual_seed(33)
        G = torch.randn(4, 3, 5, dtype=torch.float64)
        for (kw, res), train in itertools.product((({}, False),) + FUSED, (True, False)):
            for wanted in ("weight", "x"):
                with self.subTest(**kw, residual=res, train=train, wanted=wanted):
                    (y, ours), (yr, theirs) = self._pair(kw, res, train, ("x", "z", "weight", "bias"))
                    (got,) = torch.autograd.grad((y.double() * G).sum(), [ours[wanted]])
                    (want,) = torch.autograd.grad((yr * G).sum(), [theirs[wanted]])
                    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
                    self.assertTrue(all(ours[n].grad is None for n in ours))

    def test_backward_operator_without_weight(self):
        x = torch.randn(4, 3, 5)
        _, stats = torch.ops.syncbn.batch_norm_train(x, None, None, None, None, None, 1e-5, 0.1, self.comm.id)
        for input_grad in (False, True):
            with self.subTest(input_grad=input_grad):
                dx, dwb = torch.ops.syncbn.batch_norm_backward(x, x, None, stats, 1e-5, self.comm.id, input_grad,
                                                               True)
                with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
                    fdx, fdwb = torch.ops.syncbn.batch_norm_backward(
                        mode.from_tensor(x), mode.from_tensor(x), None, mode.from_tensor(stats), 1e-5,
                        self.comm.id, input_grad, True)
                self.assertEqual(tuple(dwb.shape), (0,))
                self.assertEqual((dx.shape, dwb.shape, dwb.dtype), (fdx.shape, fdwb.shape, fdwb.dtype))


class TestRefusals(unittest.TestCase):
    def test_parameters_on_another_device(self):
        """A weight, bias, running statistic or num_batches_tracked on another device than
        the input (meta against CPU here) raises, as nn.BatchNorm2d does, and nothing is
        counted or written."""
        comm = syncbn.cpu_team(1)[0]
        try:
            for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
                with self.subTest(name=name):
                    m = sbt.SyncBatchNorm(4, comm=comm)
                    t = getattr(m, name)
                    meta = t.to("meta")
                    if name in ("weight", "bias"):
                        setattr(m, name, torch.nn.Parameter(meta))
                    else:
                        setattr(m, name, meta)
                    before = {k: v.clone() for k, v in m.state_dict().items() if v.device.type == "cpu"}
                    x = torch.randn(2, 4, 3) + 1
                    with self.assertRaisesRegex(RuntimeError, f"{name} is on meta"):
                        m(x)
                    for k, v in before.items():
                        self.assertTrue(torch.equal(m.state_dict()[k], v), k)
                    with self.assertRaisesRegex(RuntimeError, f"{name} is on meta"):
                        sbt._TRAIN(x, m.weight, m.bias, m.running_mean, m.running_var, m.num_batches_tracked,
                                   1e-5, 0.1, comm.id)
        finally:
            comm.destroy()

    def test_comm_of_the_wrong_type(self):
        with self.assertRaisesRegex(TypeError, "comm must be a syncbn.Comm"):
            sbt.SyncBatchNorm(3, comm=42)
        m = sbt.SyncBatchNorm(3)
        with self.assertRaisesRegex(TypeError, "comm must be a syncbn.Comm"):
            m.comm = "rank 0"
        with self.assertRaisesRegex(TypeError, "comm must be a syncbn.Comm"):
            sbt.convert_sync_batchnorm(torch.nn.BatchNorm2d(3), comm=object())

    def test_one_value_per_channel_is_a_value_error(self):
        """nn.BatchNorm2d's ValueError, for a team of one (checked before the call), for
        the operators called directly and for a team whose whole batch has one value per
        channel (the library's check): each a syncbn.SyncBNError too (PYTHON.md's exception
        table), with or without comm=."""
        comm = syncbn.cpu_team(1)[0]
        try:
            for m in (sbt.SyncBatchNorm(3, comm=comm), sbt.SyncBatchNorm(3)):
                with self.assertRaisesRegex(ValueError, "Expected more than 1 value per channel") as cm:
                    m(torch.randn(1, 3))
                self.assertIsInstance(cm.exception, syncbn.SyncBNError)
            with self.assertRaises(ValueError):
                torch.nn.BatchNorm1d(3)(torch.randn(1, 3))  # PyTorch's own, the same type
            # the operators called directly: the library's check, the same exception
            x1, ops = torch.randn(1, 3), torch.ops.syncbn
            for call in (lambda: ops.batch_norm_train(x1, None, None, None, None, None, 1e-5, 0.1, comm.id),
                         lambda: ops.batch_norm_act_train(x1, None, None, None, None, None, None, 1e-5, 0.1, comm.id,
                                                          syncbn.RELU, 0.0, False)):
                with self.assertRaisesRegex(ValueError, r"^syncbn\.batch_norm(_act)?_train \(sbnForwardTrain(Ex)?\): "
                                                        "Expected more than 1 value per channel") as cm:
                    call()
                self.assertIsInstance(cm.exception, syncbn.SyncBNError)
        finally:
            comm.destroy()
        comms = syncbn.cpu_team(2, timeout_ms=60000)
        errs = [None, None]
        layers = [sbt.SyncBatchNorm(3, comm=c) for c in comms]
        xs = [torch.randn(1, 3), torch.randn(0, 3)]

        def rank(r):
            try:
                layers[r](xs[r])
            except Exception as e:  # noqa: BLE001
                errs[r] = e

        ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for e in errs:
            self.assertIsInstance(e, ValueError)
            self.assertIsInstance(e, syncbn.SyncBNError)
            self.assertTrue(str(e).startswith("syncbn.batch_norm_train (sbnForwardTrain): Expected more"), str(e))
        self.assertEqual(int(layers[0].num_batches_tracked), 0)  # nothing counted
        for c in comms:
            c.destroy()

    def test_error_text_specific_first(self):
        comms = syncbn.cpu_team(2, timeout_ms=200)
        try:
            with self.assertRaises(syncbn.SyncBNError) as cm:
                sbt.SyncBatchNorm(3, comm=comms[0])(torch.randn(2, 3, 4))
            msg = str(cm.exception)
            self.assertTrue(msg.startswith("syncbn.batch_norm_train (sbnForwardTrain): rank 0 waited"), msg)
            self.assertTrue(msg.endswith("[sbnTimeout]"), msg)
            self.assertNotIn("sbnGetLastError", msg)
        finally:
            for c in comms:
                c.destroy()

    def test_team_keeps_its_ranks_alive(self):
        """A rank taken from a team keeps its peers alive (they are collected together)."""
        c0 = syncbn.cpu_team(2)[0]
        gc.collect()
        peer = c0._team[1]
        self.assertTrue(peer.handle)
        self.assertEqual(peer.rank, 1)
        c0.destroy()
        peer.destroy()

    def test_destroyed_peer_is_named_at_once(self):
        """A peer destroyed explicitly: the next op raises at once (not after the team's
        timeout of 60 s), naming the destroyed rank."""
        comms = syncbn.cpu_team(2, timeout_ms=60000)
        m = sbt.SyncBatchNorm(3, comm=comms[0])
        comms[1].destroy()
        t0 = time.monotonic()
        with self.assertRaises(syncbn.SyncBNError) as cm:
            m(torch.randn(2, 3, 4))
        self.assertLess(time.monotonic() - t0, 5.0)
        self.assertIn("rank 1", str(cm.exception))
        self.assertIn("destroyed", str(cm.exception))
        self.assertEqual(int(m.num_batches_tracked), 0)
        comms[0].destroy()

    def test_destroyed_comm_says_so(self):
        comm = syncbn.cpu_team(1)[0]
        m = sbt.SyncBatchNorm(3, comm=comm)
        comm.destroy()
        with self.assertRaisesRegex(syncbn.SyncBNError, "destroyed"):
            m(torch.randn(2, 3, 4))

    def test_cpu_team_takes_cpu_tensors_and_a_dead_id_is_refused(self):
        """A CPU team takes CPU tensors only (its ops read host memory). A destroyed comm's
        id: the operator called directly raises SyncBNError's text (a SyncBNError from the
        Python operators, a RuntimeError from the C++ ones; the layer raises SyncBNError
        from both)."""
        comm = syncbn.cpu_team(1)[0]
        try:
            x = torch.randn(2, 3, 4)
            self.assertTrue(comm.host)
            y, _ = _ops.batch_norm_train(x, None, None, None, None, None, 1e-5, 0.1, comm.id)
            self.assertEqual(tuple(y.shape), (2, 3, 4))
            with self.assertRaisesRegex(RuntimeError, r"^syncbn\.Comm: no live comm has id 1000000000: it was "
                                        r"destroyed \[sbnInvalidUsage\]$"):
                _ops.batch_norm_train(x, None, None, None, None, None, 1e-5, 0.1, 10 ** 9)
        finally:
            comm.destroy()


if __name__ == "__main__":
    unittest.main(verbosity=2)
