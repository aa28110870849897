"""syncbn.torch's conversion of mmcv's synchronized batch norm (mmcv.ops.SyncBatchNorm,
OpenMMLab's "MMSyncBN": an nn.Module, no torch.nn batch norm, which PyTorch's converter
passes by) on CPU teams: convert_sync_batchnorm makes each a SyncBatchNorm with the same
parameters (the same tensors), buffers, state_dict keys and function (float64 originals
as the reference), synchronized over the team as nn.SyncBatchNorm is (W = 2 ranks as
threads, batches of 3 and 1, against the original on the whole batch); convert_fused
fuses it with the ReLU after it; revert_sync_batchnorm makes it a BatchNormXd (as it does
an nn.SyncBatchNorm, and as mmengine's revert does); a subclass is left with a warning.

mmcv's ops are a CUDA build with no CPU kernel for this layer: the original is
standins/mmcv, a stand-in written from mmcv's rules for one process (see its docstring).

Tolerances (test_torch_fused.py's converted-model checks, rank_threads.converted_matches):
fp32 outputs and buffers within 1e-4 relative and absolute of float64, parameter
gradients (sums over 100 positions) within 1e-3 relative + 1e-4.
"""

import copy
import os
import pickle
import sys
import unittest
import warnings

import numpy as np  # noqa: F401 (torch's CPU ops need it at import in some builds)
import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "standins"))
from mmcv.ops import SyncBatchNorm as MMSyncBN  # noqa: E402 (the stand-in, first on the path)

import syncbn.torch as sbt  # noqa: E402
from rank_threads import Group, TeamOfOne, converted_matches, randomize_bn, team_of_two_matches  # noqa: E402

C = 5


def mm_model():
    """1x1 convolutions, each followed by an MMSyncBN of the settings mmcv trains with (it
    cannot with affine=False or track_running_stats=False: TestSettingsMmcvCannotTrain): the
    defaults, a cumulative average (momentum None), eps 1e-3 and stats_mode "N"."""
    layers = [MMSyncBN(C), MMSyncBN(C, momentum=None), MMSyncBN(C, eps=1e-3, stats_mode="N")]
    mods = [nn.Conv2d(3, C, 1, bias=False)]
    for i, m in enumerate(layers):
        mods += [m] if i == len(layers) - 1 else [m, nn.Conv2d(C, C, 1, bias=False)]
    return nn.Sequential(*mods)


def randomize(model, seed=5):
    """Every MMSyncBN's tensors off their defaults (rank_threads.randomize_bn)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, MMSyncBN):
            randomize_bn(m, g)
    return model


def bns(model):
    return [m for m in model.modules() if isinstance(m, (MMSyncBN, nn.SyncBatchNorm, sbt.BatchNormXd))]


class TestConvert(TeamOfOne):
    def test_converted_gives_the_original(self):
        """Every MMSyncBN becomes a SyncBatchNorm on the converter's team and process group
        (not the layer's group), with its parameters (the same tensors), buffers, settings
        and state_dict keys; the model gives the original's outputs, gradients and running
        statistics (training and eval)."""
        torch.manual_seed(7)
        model = randomize(mm_model())
        model[1].group = Group()  # its own group, which cannot be copied: not the converted layer's
        twin = copy.deepcopy(mm_model())  # (the converter changes the model it is given)
        twin.load_state_dict(model.state_dict())
        conv = sbt.convert_sync_batchnorm(model, comm=self.comm)
        self.assertIs(conv, model)
        layers = bns(conv)
        self.assertEqual([type(m) for m in layers], [sbt.SyncBatchNorm] * 3)
        self.assertEqual([(m.eps, m.momentum, m.affine, m.track_running_stats, m.process_group, m.comm)
                          for m in layers],
                         [(1e-5, 0.1, True, True, None, self.comm), (1e-5, None, True, True, None, self.comm),
                          (1e-3, 0.1, True, True, None, self.comm)])
        pickle.dumps(copy.deepcopy(conv[1]))
        self.assertEqual(list(conv.state_dict().keys()), list(twin.state_dict().keys()))
        for (n, a), (_, b) in zip(conv.state_dict().items(), twin.state_dict().items()):
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=n)
        conv.load_state_dict(twin.state_dict())  # strict: the original's checkpoint loads
        converted_matches(self, twin, torch.randn(4, 3, 5, 5), conv, input_grad=True)

    def test_parameters_are_the_same_tensors(self):
        """The converted layer holds the original's parameters and buffers themselves (an
        optimizer made before the conversion still trains them), and its hooks."""
        m = randomize(nn.Sequential(MMSyncBN(C)))
        tensors = [m[0].weight, m[0].bias, m[0].running_mean, m[0].running_var, m[0].num_batches_tracked]
        seen = []
        m[0].register_forward_hook(lambda mod, i, o: seen.append(type(mod)))
        conv = sbt.convert_sync_batchnorm(m, comm=self.comm)
        for t, k in zip(tensors, ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")):
            self.assertIs(getattr(conv[0], k), t, k)
        conv(torch.randn(3, C, 2, 2))
        self.assertEqual(seen, [sbt.SyncBatchNorm])

    def test_evaluated_layer_converts_evaluated(self):
        """An MMSyncBN in eval converts to a layer in eval, normalizing with the running
        statistics as the original does."""
        m = randomize(nn.Sequential(MMSyncBN(C))).eval()
        x = torch.randn(3, C, 2, 2)
        want = copy.deepcopy(m).double()(x.double())
        conv = sbt.convert_sync_batchnorm(m, comm=self.comm)
        self.assertFalse(conv[0].training)
        torch.testing.assert_close(conv(x).double(), want, rtol=1e-5, atol=1e-5)

    def test_team_of_two(self):
        """Two ranks (threads, batches of 3 and 1) with the converted model each: each rank's
        outputs are the original's on the whole batch (the team's statistics, each position
        weighted alike, as nn.SyncBatchNorm's), the sums of the ranks' parameter gradients
        (DDP's, to within its average) the original's, and every rank's running statistics
        the original's."""
        torch.manual_seed(9)
        team_of_two_matches(self, randomize(mm_model()),
                            lambda m, comm: sbt.convert_sync_batchnorm(m, comm=comm), torch.randn(4, 3, 5, 5), C)

    def test_fused_with_the_relu_after_it(self):
        """convert_fused gives an MMSyncBN followed by an nn.ReLU in a Sequential the ReLU as
        its epilogue (a FusedActivation in the ReLU's place), the original's function."""
        torch.manual_seed(3)
        model = randomize(nn.Sequential(nn.Conv2d(3, C, 1, bias=False), MMSyncBN(C), nn.ReLU(),
                                        nn.Conv2d(C, C, 1, bias=False), MMSyncBN(C)))
        conv = sbt.convert_fused(copy.deepcopy(model), comm=self.comm)
        self.assertEqual([type(m) for m in conv], [nn.Conv2d, sbt.SyncBatchNorm, sbt.FusedActivation, nn.Conv2d,
                                                   sbt.SyncBatchNorm])
        self.assertEqual((conv[1].activation, conv[4].activation), ("relu", "identity"))
        converted_matches(self, model, torch.randn(4, 3, 5, 5), conv, input_grad=True)

    def test_reverted_is_pytorchs_batch_norm(self):
        """revert_sync_batchnorm makes a converted MMSyncBN a BatchNormXd (PyTorch's batch
        norm, as for a converted nn.SyncBatchNorm) with the same tensors, computing what the
        original does in eval; converting it again gives the converted layer's results."""
        torch.manual_seed(4)
        model = randomize(mm_model())
        original = copy.deepcopy(model)
        conv = sbt.convert_sync_batchnorm(model, comm=self.comm)
        back = sbt.revert_sync_batchnorm(conv)
        self.assertEqual([type(m) for m in bns(back)], [sbt.BatchNormXd] * 3)
        for a, b in zip(bns(back), bns(original)):
            self.assertEqual((a.eps, a.momentum, a.affine, a.track_running_stats),
                             (b.eps, b.momentum, b.affine, b.track_running_stats))
        self.assertIs(back[1].weight, conv[1].weight)
        self.assertEqual(list(back.state_dict().keys()), list(original.state_dict().keys()))
        x = torch.randn(4, 3, 5, 5)
        torch.testing.assert_close(back.eval()(x), original.eval()(x), rtol=1e-5, atol=1e-5)
        again = sbt.convert_sync_batchnorm(copy.deepcopy(back), comm=self.comm).train()
        torch.testing.assert_close(again(x), original.train()(x), rtol=1e-4, atol=1e-4)


class TestSettingsMmcvCannotTrain(TeamOfOne):
    def test_converted_they_train_as_pytorchs(self):
        """mmcv's layer cannot train with affine=False or track_running_stats=False (its
        compiled ops take no None: a TypeError; eval without running statistics too);
        converted, such a layer computes PyTorch's batch norm of the same settings (float64
        nn.BatchNorm2d as the reference), training and eval."""
        x = torch.randn(4, C, 3, 3)
        for kw in ({"affine": False}, {"track_running_stats": False}):
            layer = MMSyncBN(C, **kw)
            with self.assertRaisesRegex(TypeError, "incompatible function arguments"):
                layer(x)
            conv = sbt.convert_sync_batchnorm(nn.Sequential(layer), comm=self.comm)
            self.assertIs(type(conv[0]), sbt.SyncBatchNorm)
            ref = nn.Sequential(nn.BatchNorm2d(C, **kw))
            ref.load_state_dict(conv.state_dict())
            converted_matches(self, ref, x, conv, input_grad=True)


class TestRefused(TeamOfOne):
    def test_what_it_would_lose_is_refused(self):
        """An MMSyncBN with state of its own, or a forward set on it, is refused with a
        ValueError naming it (mmcv's class), before anything changes."""
        model = nn.Sequential(MMSyncBN(3), MMSyncBN(3))
        model[1].register_buffer("extra", torch.zeros(3))
        with self.assertRaisesRegex(ValueError, r"layer '1' \(mmcv's SyncBatchNorm\) holds 'extra'.*nothing was "
                                                r"converted"):
            sbt.convert_sync_batchnorm(model, comm=self.comm)
        self.assertEqual([type(m) for m in model], [MMSyncBN, MMSyncBN])
        model = nn.Sequential(MMSyncBN(3))
        model[0].forward = lambda x: x
        with self.assertRaisesRegex(ValueError, r"'0' \(mmcv's SyncBatchNorm\) has a forward set on the layer"):
            sbt.convert_sync_batchnorm(model, comm=self.comm)
        self.assertIs(type(model[0]), MMSyncBN)

    def test_subclass_left_with_a_warning(self):
        """A subclass of mmcv's SyncBatchNorm (its forward may differ) is left as it is, and
        the converter says so in a RuntimeWarning naming it; mmcv's class beside it
        converts."""
        class MySyncBN(MMSyncBN):
            pass

        model = nn.Sequential(MySyncBN(3), MMSyncBN(3))
        with self.assertWarnsRegex(RuntimeWarning, r"'0' \(MySyncBN\) are of subclasses of mmcv's SyncBatchNorm"):
            sbt.convert_sync_batchnorm(model, comm=self.comm)
        self.assertEqual([type(m) for m in model], [MySyncBN, sbt.SyncBatchNorm])

    def test_subclasses_of_two_packages(self):
        """Subclasses of inplace_abn's layers and of mmcv's in one model: a RuntimeWarning
        for each package, naming its layers."""
        import inplace_abn  # (the stand-in beside mmcv's: standins is first on the path)

        class MyABN(inplace_abn.ABN):
            pass

        class MySyncBN(MMSyncBN):
            pass

        model = nn.Sequential(MyABN(3), MySyncBN(3), MySyncBN(3))
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            sbt.convert_sync_batchnorm(model, comm=self.comm)
        said = sorted(str(w.message) for w in ws if w.category is RuntimeWarning)
        self.assertEqual(len(said), 2, said)
        self.assertRegex(said[0], r"'0' \(MyABN\) are of subclasses of inplace_abn's layers")
        self.assertRegex(said[1], r"'1' \(MySyncBN\), '2' \(MySyncBN\) are of subclasses of mmcv's SyncBatchNorm")
        self.assertEqual([type(m) for m in model], [MyABN, MySyncBN, MySyncBN])


if __name__ == "__main__":
    unittest.main(verbosity=2)
