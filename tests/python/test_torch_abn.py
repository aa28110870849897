"""syncbn.torch's layers for inplace_abn's (mapillary's InPlace-ABN: ABN, InPlaceABN,
InPlaceABNSync) on CPU teams: convert_sync_batchnorm makes them ABNSync / InPlaceABNSync
layers, which give the original's outputs, gradients and running statistics (float64
originals as the reference), keep its state_dict keys and attributes, synchronize over
the team (W = 2 ranks as threads against the original on the whole batch), keep only the
output for autograd where the original is in place, and revert to the original classes.

The original classes are inplace_abn's where the package can be imported (it builds a C++
extension: pip install inplace-abn), else standins/inplace_abn, a stand-in written from
the package's rules in PyTorch's ops with its gradients derived by hand (see its
docstring), so that CI runs without the package.

Tolerances (test_torch_fused.py's converted-model checks): fp32 outputs and buffers within
1e-4 relative and absolute of float64, parameter gradients (sums over 100 positions)
within 1e-3 relative + 1e-4. The in-place backward recovers x_hat from y: within
(|v| 2^-24 + |v - bias| 2^-23) / (|weight| + eps) per element (bench/notes/tolerances.md,
"The in-place backward"), below 1e-6 here (|weight| >= 0.5, |v| < 10), but for the channel
of weight 0, whose bias is 0 too (a zero-initialized layer: y = x_hat eps, recovered to
2^-24 relative).
"""

import copy
import os
import pickle
import sys
import unittest

import numpy as np  # noqa: F401 (torch's CPU ops need it at import in some builds)
import torch
import torch.nn as nn

try:
    import inplace_abn  # the package itself, where installed
    STANDIN = False
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "standins"))
    import inplace_abn
    STANDIN = True

import syncbn
import syncbn.torch as sbt
from rank_threads import Group, TeamOfOne, converted_matches, randomize_bn, team_of_two_matches

C = 6


def abn_model():
    """1x1 convolutions, each followed by one of inplace_abn's layers: every class and
    activation, a cumulative average (momentum None), affine=False, no running statistics."""
    layers = [
        inplace_abn.ABN(C, activation="relu"),
        inplace_abn.ABN(C, activation="elu", activation_param=0.5),
        inplace_abn.InPlaceABN(C),  # leaky_relu 0.01
        inplace_abn.InPlaceABNSync(C, activation="identity"),
        inplace_abn.InPlaceABNSync(C, activation="leaky_relu", activation_param=0.2, momentum=None),
        inplace_abn.InPlaceABN(C, activation="elu", activation_param=1.0),
        inplace_abn.ABN(C, affine=False, activation="leaky_relu", activation_param=0.1),
        inplace_abn.InPlaceABN(C, track_running_stats=False, activation="identity"),
    ]
    mods = [nn.Conv2d(3, C, 1, bias=False)]  # (a bias before a batch norm has gradient 0: float32's is noise)
    for i, m in enumerate(layers):
        mods += [m] if i == len(layers) - 1 else [m, nn.Conv2d(C, C, 1, bias=False)]
    return nn.Sequential(*mods)


def randomize(model, seed=3):
    """Weights of both signs (0.5 to 1.5 in size), channel 0's weight and bias 0 (a
    zero-initialized layer: inplace_abn's scale is then eps, and the weight's gradient is
    taken with sign +1), biases in [-0.5, 0.5], running statistics off their defaults."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if not type(m).__name__.endswith("ABN") and not type(m).__name__.endswith("ABNSync"):
            continue
        randomize_bn(m, g)
        if m.weight is not None:
            with torch.no_grad():
                m.weight[0] = 0.0
                m.bias[0] = 0.0
    return model


def abn_layers(model):
    return [m for m in model.modules() if isinstance(m, sbt.SyncBatchNorm)]


def converted_twin(model, comm):
    return sbt.convert_sync_batchnorm(copy.deepcopy(model), comm=comm)


class TestConvert(TeamOfOne):
    def test_converted_gives_the_original(self):
        """Every layer becomes its syncbn class (ABN: ABNSync; InPlaceABN, InPlaceABNSync:
        InPlaceABNSync), in place where the original is and the activation invertible; the
        model gives the original's results (a weight at 0 gets its gradient, of sign +1)."""
        torch.manual_seed(7)
        model = randomize(abn_model())
        conv = converted_twin(model, self.comm)
        layers = abn_layers(conv)
        self.assertEqual([type(m) for m in layers], [sbt.ABNSync, sbt.ABNSync] + [sbt.InPlaceABNSync] * 4
                         + [sbt.ABNSync, sbt.InPlaceABNSync])
        self.assertEqual([(m.activation, m.activation_param, m.inplace) for m in layers],
                         [("relu", 0.01, False), ("elu", 0.5, False), ("leaky_relu", 0.01, True),
                          ("identity", 0.01, True), ("leaky_relu", 0.2, True), ("elu", 1.0, False),
                          ("leaky_relu", 0.1, False), ("identity", 0.01, True)])
        self.assertEqual(list(conv.state_dict().keys()), list(model.state_dict().keys()))
        conv.load_state_dict(model.state_dict())  # strict: the original's checkpoint loads
        converted_matches(self, model, torch.randn(4, 3, 5, 5), conv, input_grad=True)
        for m in layers:
            if isinstance(m, sbt.InPlaceABNSync) and m.affine:
                self.assertNotEqual(m.weight.grad[0].item(), 0.0)  # the zero weight's gradient

    def test_zero_weight_gradient_sign(self):
        """InPlaceABNSync's weight gradient is dweight (of the scale |weight| + eps) times
        +1 at weight 0 and where weight > 0, -1 where weight < 0, as inplace_abn's: a
        zero-initialized weight moves (abs' gradient at 0 is 0: it would stay at 0)."""
        torch.manual_seed(2)
        x = torch.randn(5, 3, 4, 4)
        g = torch.randn(5, 3, 4, 4)
        for w0 in (0.0, 0.7, -0.7):
            layer = sbt.InPlaceABNSync(3, activation="identity", comm=self.comm)
            with torch.no_grad():
                layer.weight.fill_(w0)
            (layer(x) * g).sum().backward()
            xhat = (x - x.mean((0, 2, 3), keepdim=True)) / torch.sqrt(x.var((0, 2, 3), unbiased=False,
                                                                             keepdim=True) + 1e-5)
            want = (g * xhat).sum((0, 2, 3)) * (-1.0 if w0 < 0 else 1.0)
            torch.testing.assert_close(layer.weight.grad, want, rtol=1e-4, atol=1e-4, msg=f"weight {w0}")

    def test_team_of_two(self):
        """Two ranks (threads, batches of 3 and 1) with the converted model each: each rank's
        outputs are the original's on the whole batch (the team's statistics), the sums of
        the ranks' parameter gradients (DDP's) the original's, and every rank's running
        statistics the original's."""
        torch.manual_seed(9)
        team_of_two_matches(self, randomize(abn_model()), converted_twin, torch.randn(4, 3, 5, 5), C)

    def test_gradient_at_zero(self):
        """Where the pre-activation is exactly 0 (a constant channel, bias 0), the gradient
        through the activation is PyTorch's: the leaky ReLU's slope, ELU's alpha (F.elu),
        not the 1 that the package's in-place layers take there (PYTHON.md says so)."""
        x = torch.randn(4, 2, 3, 3)
        x[:, 0] = 2.5  # channel 0 constant: x_hat 0, y 0
        g = torch.randn(4, 2, 3, 3)
        for act, param in (("leaky_relu", 0.1), ("elu", 0.5), ("identity", 0.01)):
            layer = sbt.InPlaceABNSync(2, activation=act, activation_param=param, comm=self.comm)
            with torch.no_grad():
                layer.bias.zero_()
            (layer(x) * g).sum().backward()
            factor = 1.0 if act == "identity" else param
            torch.testing.assert_close(layer.bias.grad[0], factor * g[:, 0].sum(), rtol=1e-5, atol=1e-5, msg=act)

    def test_in_place_keeps_the_output_only(self):
        """An InPlaceABNSync in place (identity, leaky ReLU) has autograd keep its output,
        not its input, as inplace_abn; one of ELU keeps the input."""
        x = torch.randn(4, 3, 5, 5, requires_grad=True)
        for act, saved in (("leaky_relu", False), ("identity", False), ("elu", True)):
            layer = sbt.InPlaceABNSync(3, activation=act, comm=self.comm)
            ptrs = []

            def pack(t):
                ptrs.append(t.untyped_storage().data_ptr())
                return t

            h = x * 1.0  # the layer's input: a tensor of its own
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y = layer(h)
            self.assertEqual(h.untyped_storage().data_ptr() in ptrs, saved, act)
            if not saved:
                self.assertIn(y.untyped_storage().data_ptr(), ptrs, act)

    def test_reverted_gives_the_classes_back(self):
        """revert_sync_batchnorm gives back inplace_abn's classes, their attributes and the
        trained tensors (the same ones); an InPlaceABNSync's group is the converted layer's
        process group (the converter's: the original's is not kept, and a layer converted
        from one whose group cannot be copied, as a process group, deep-copies and pickles);
        the reverted model computes what the converted one does (eval)."""
        torch.manual_seed(4)
        model = randomize(abn_model())
        conv = converted_twin(model, self.comm)
        with self.assertRaises(TypeError):
            copy.deepcopy(Group())
        model[7].group = Group()  # an InPlaceABNSync's own group, which cannot be copied
        again = sbt.convert_sync_batchnorm(nn.Sequential(model[7]), comm=self.comm)
        model[7].group = None
        copy.deepcopy(again)
        pickle.dumps(again)
        self.assertIsNone(again[0].process_group)
        x = torch.randn(4, 3, 5, 5)
        conv(x).sum().backward()
        conv[7].set_group("the group")  # the process group the reverted layer takes as its group
        back = sbt.revert_sync_batchnorm(conv)
        for (n, a), (_, b) in zip(model.named_modules(), back.named_modules()):
            self.assertIs(type(b), type(a), n)
            for k in ("num_features", "eps", "momentum", "affine", "track_running_stats", "activation",
                      "activation_param"):
                self.assertEqual(getattr(b, k, None), getattr(a, k, None), (n, k))
        self.assertEqual(back[7].group, "the group")
        back[7].group = None  # (the package's forward would synchronize over it)
        self.assertEqual(list(back.state_dict().keys()), list(model.state_dict().keys()))
        back.eval()
        conv = converted_twin(back, self.comm).eval()
        torch.testing.assert_close(back(x), conv(x), rtol=1e-4, atol=1e-4)

    def test_identity_after_is_left(self):
        """A converted layer followed by an nn.Identity in a Sequential reverts with the
        identity as it was (the revert puts a fused layer's activation into such an identity:
        not an inplace_abn layer's, which applies its own); the round trip is the original
        function."""
        for act, param in (("leaky_relu", 0.2), ("elu", 1.0), ("relu", 0.01)):
            model = randomize(nn.Sequential(inplace_abn.ABN(3, activation=act, activation_param=param),
                                            nn.Identity(), inplace_abn.InPlaceABN(3, activation_param=0.3),
                                            nn.Identity())).eval()
            back = sbt.revert_sync_batchnorm(converted_twin(model, self.comm))
            self.assertEqual([type(m) for m in back], [type(m) for m in model], act)
            x = torch.randn(2, 3, 4, 4)
            torch.testing.assert_close(back(x), model(x), rtol=1e-6, atol=1e-6, msg=act)

    def test_made_as_syncbn_reverts(self):
        """Layers made as syncbn's revert to PyTorch's batch norm where one computes them
        (an ABNSync: a BatchNormXd with its activation, or with an nn.ELU after it), and an
        InPlaceABNSync to inplace_abn's InPlaceABN; without inplace_abn importable, the
        InPlaceABNSync is refused, nothing reverted."""
        model = nn.Sequential(sbt.ABNSync(3, activation="leaky_relu", activation_param=0.3),
                              sbt.ABNSync(3, activation="elu", activation_param=0.5),
                              sbt.InPlaceABNSync(3))
        randomize(model)
        x = torch.randn(4, 3, 2, 2)
        want = copy.deepcopy(model).eval()(x)
        back = sbt.revert_sync_batchnorm(copy.deepcopy(model))
        self.assertEqual([type(m) for m in back], [sbt.BatchNormXd, sbt.BatchNormActXd, inplace_abn.InPlaceABN])
        self.assertEqual((back[0].activation, back[0].slope), ("leaky_relu", 0.3))
        self.assertEqual((type(back[1].act), back[1].act.alpha), (nn.ELU, 0.5))
        self.assertEqual((back[2].activation, back[2].activation_param), ("leaky_relu", 0.01))
        torch.testing.assert_close(back.eval()(x), want, rtol=1e-5, atol=1e-5)
        relu = nn.Sequential(nn.Identity(), sbt.InPlaceABNSync(3, activation="relu"))
        with self.assertRaisesRegex(ValueError, r"'1' \(InPlaceABNSync\) applies a ReLU, which inplace_abn's "
                                                r"InPlaceABN .* refuses"):
            sbt.revert_sync_batchnorm(relu)
        self.assertIs(type(relu[1]), sbt.InPlaceABNSync)
        saved = sys.modules.get("inplace_abn")
        sys.modules["inplace_abn"] = None  # import inplace_abn raises ImportError
        try:
            kept = copy.deepcopy(model)
            with self.assertRaisesRegex(ValueError, r"'2' \(InPlaceABNSync\) scales by \|weight\| \+ eps"):
                sbt.revert_sync_batchnorm(kept)
            self.assertEqual([type(m) for m in kept], [sbt.ABNSync, sbt.ABNSync, sbt.InPlaceABNSync])
        finally:
            sys.modules["inplace_abn"] = saved


class TestLayer(TeamOfOne):
    def test_constructor_and_attributes(self):
        """inplace_abn's constructor (positional order, defaults: leaky_relu 0.01) and
        attributes; in place by default where invertible (InPlaceABNSync); the group is the
        process group."""
        m = sbt.InPlaceABNSync(4, 1e-3, 0.2, True, True, "leaky_relu", 0.05)
        self.assertEqual((m.eps, m.momentum, m.activation, m.activation_param, m.slope, m.inplace, m.group),
                         (1e-3, 0.2, "leaky_relu", 0.05, 0.05, True, None))
        self.assertEqual(repr(m), "InPlaceABNSync(4, eps=0.001, momentum=0.2, affine=True, "
                                  "activation=leaky_relu[0.05], inplace=True)")
        d = sbt.ABNSync(4)
        self.assertEqual((d.activation, d.activation_param, d.inplace), ("leaky_relu", 0.01, False))
        self.assertIsInstance(d, nn.SyncBatchNorm)
        self.assertEqual(list(m.state_dict().keys()), list(inplace_abn.InPlaceABNSync(4).state_dict().keys()))
        self.assertFalse(sbt.InPlaceABNSync(4, activation="relu").inplace)
        self.assertFalse(sbt.InPlaceABNSync(4, activation="leaky_relu", activation_param=0.0).inplace)
        self.assertTrue(sbt.ABNSync(4, activation="identity").set_activation("identity", inplace=True).inplace)
        m.activation = "identity"  # inplace_abn's attributes, assigned: the layer computes them
        self.assertEqual((m.activation, m.activation_param, m.inplace), ("identity", 0.05, True))
        m.activation, m.activation_param = "elu", 0.5
        self.assertEqual((m.activation, m.activation_param, m.inplace, m._act), ("elu", 0.5, False, syncbn.IDENTITY))
        x = torch.randn(3, 4, 2, 2)
        want = nn.functional.elu(nn.functional.batch_norm(x, None, None, m.weight.abs() + 1e-3, m.bias, True,
                                                          0.0, 1e-3), 0.5)
        torch.testing.assert_close(m.train()(x), want, rtol=1e-5, atol=1e-5)
        m.activation = "leaky_relu"
        self.assertEqual((m.activation, m.activation_param, m.inplace), ("leaky_relu", 0.5, True))
        self.assertIsNone(sbt.ABNSync(4, activation="relu", activation_param=None).activation_param)  # unused
        group = object()
        m.set_group(group)
        self.assertIs(m.process_group, group)
        m.group = None
        self.assertIsNone(m.process_group)

    def test_refusals(self):
        """What the layer cannot compute is refused, naming it; the converter refuses such a
        layer, and one with state of its own, before anything changes."""
        with self.assertRaisesRegex(ValueError, "activation 'gelu'"):
            sbt.InPlaceABNSync(4, activation="gelu")
        with self.assertRaisesRegex(ValueError, "not elu"):
            sbt.InPlaceABNSync(4, activation="elu").set_activation("elu", 1.0, inplace=True)
        with self.assertRaisesRegex(ValueError, "not invertible|relu"):
            sbt.InPlaceABNSync(4).set_activation("relu", inplace=True)
        with self.assertRaisesRegex(ValueError, "slope"):
            sbt.InPlaceABNSync(4, activation_param=-0.1)
        with self.assertRaisesRegex(ValueError, "alpha"):
            sbt.ABNSync(4, activation="elu", activation_param=float("inf"))
        with self.assertRaises(TypeError):
            sbt.ABNSync(4, activation_param="0.1")
        model = nn.Sequential(inplace_abn.InPlaceABN(3), inplace_abn.ABN(3, activation_param=-0.5))
        with self.assertRaisesRegex(ValueError, r"layer '1' \(inplace_abn's ABN\).*slope.*nothing was converted"):
            sbt.convert_sync_batchnorm(model, comm=self.comm)
        self.assertEqual([type(m) for m in model], [inplace_abn.InPlaceABN, inplace_abn.ABN])
        model = nn.Sequential(inplace_abn.ABN(3), inplace_abn.InPlaceABNSync(3))
        model[1].register_buffer("extra", torch.zeros(3))
        with self.assertRaisesRegex(ValueError, r"'1' \(inplace_abn's InPlaceABNSync\) holds 'extra'"):
            sbt.convert_sync_batchnorm(model, comm=self.comm)
        self.assertEqual([type(m) for m in model], [inplace_abn.ABN, inplace_abn.InPlaceABNSync])

    def test_subclass_left_with_a_warning(self):
        """A subclass of inplace_abn's layers (its forward may differ) is left as it is, and
        the converter says so in a RuntimeWarning naming it; the package's classes beside it
        convert."""
        class MyABN(inplace_abn.InPlaceABNSync):
            pass

        model = nn.Sequential(MyABN(3), inplace_abn.InPlaceABNSync(3))
        with self.assertWarnsRegex(RuntimeWarning, r"'0' \(MyABN\) are of subclasses of inplace_abn's layers"):
            sbt.convert_sync_batchnorm(model, comm=self.comm)
        self.assertEqual([type(m) for m in model], [MyABN, sbt.InPlaceABNSync])

    def test_fx_and_compile(self):
        """torch.fx records each layer as one node (its activation inside); torch.compile
        (aot_eager) gives the eager model's results and gradients."""
        torch.manual_seed(1)
        model = randomize(abn_model())
        conv = converted_twin(model, self.comm)
        traced = torch.fx.symbolic_trace(conv)
        # each module one node: a call_module node, or (a layer with an activation) a call
        # of the layer on a get_attr of it
        calls = [n.target if n.op == "call_module" else n.args[0].target for n in traced.graph.nodes
                 if n.op == "call_module" or (n.op == "call_method" and n.target == "__call__")]
        self.assertEqual(calls, [str(i) for i in range(len(conv))])
        x = torch.randn(4, 3, 5, 5)
        twin = copy.deepcopy(conv)
        torch.testing.assert_close(traced(x), twin(x), rtol=0, atol=0)
        compiled = torch.compile(copy.deepcopy(conv), backend="aot_eager")
        eager = copy.deepcopy(conv)
        g = torch.randn(4, C, 5, 5)
        y1, y2 = compiled(x), eager(x)
        torch.testing.assert_close(y1, y2, rtol=1e-6, atol=1e-6)
        (y1 * g).sum().backward()
        (y2 * g).sum().backward()
        for (n, p), (_, q) in zip(compiled.named_parameters(), eager.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=n)


if __name__ == "__main__":
    print(f"inplace_abn: {'the stand-in (tests/python/standins)' if STANDIN else inplace_abn.__file__}")
    unittest.main(verbosity=2)
