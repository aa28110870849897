"""The checks of a converted model against its float64 original that the Python tests
share: test_torch_models.py (torchvision's, timm's and segmentation_models_pytorch's
models on CPU teams) and test_torch_gpu.py (torchvision's on a GPU). Their tolerances and
why: test_torch_models.py's docstring. Imported from the tests' own folder (a test run as
a script has it on sys.path)."""

import copy

import torch

import syncbn.torch as sbt
from rank_threads import randomize_bn, run_ranks

_BN = torch.nn.modules.batchnorm._BatchNorm


def prepared(model, seed=1):
    """model with its batch norms' weights of both signs, biases and running statistics
    off their defaults (randomize_bn), its dropout off (p = 0: the ranks and the reference
    must drop the same nothing), in training mode."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, _BN):
            randomize_bn(m, g)
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):  # Dropout, Dropout2d, ...
            m.p = 0.0
    return model.train()


def _swap(model, old, new):
    """model with every module of class `old` (exactly) replaced by new()."""
    for m in list(model.modules()):
        for name, child in list(m.named_children()):
            if type(child) is old:
                setattr(m, name, new())
    return model


def leaky(model, slope=0.01):
    """A copy of model with every nn.ReLU an nn.LeakyReLU(slope, inplace=True): the function
    convert_fused(relu_as_leaky=slope) gives the ReLU model (step_matches's reference for
    convert_leaky_in_place)."""
    return _swap(copy.deepcopy(model), torch.nn.ReLU, lambda: torch.nn.LeakyReLU(slope, inplace=True))


def convert_leaky_in_place(m, comm=None, slope=0.01):
    """step_matches's convert for a leaky(model) reference: m (a copy of the leaky model)
    back to its nn.ReLUs, then convert_fused(inplace=True, relu_as_leaky=slope)."""
    m = _swap(m, torch.nn.LeakyReLU, lambda: torch.nn.ReLU(inplace=True))
    return sbt.convert_fused(m, comm=comm, inplace=True, relu_as_leaky=slope)


class Outputs(torch.nn.Module):
    """A segmentation model's output dict as one tensor (its heads' maps along channels)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return torch.cat(list(self.model(x).values()), 1)


def step_matches(test, model, x, comms, convert=sbt.convert_fused):
    """One training step of convert(a copy of model, comm=c) for each comm of `comms` (a
    CPU team's ranks as threads, the batch split in order: 3 and 1 of 4 images at two
    ranks; or [None]: the layers' own team, a GPU's) against the float64 original on the
    whole batch, on x's device: outputs, the input's and every parameter's gradient
    (summed over the ranks, as DDP's), the running statistics; then eval, and the trained
    model reverted: its state bitwise the team's, its eval outputs the team's."""
    ranks = len(comms)
    parts = [(0, x.shape[0])] if ranks == 1 else [(0, 3), (3, x.shape[0])]
    twins = [convert(copy.deepcopy(model), comm=c) for c in comms]
    ref = copy.deepcopy(model).double()
    fp32 = copy.deepcopy(model)  # PyTorch's own fp32 model: the outputs' yardstick

    def outputs_atol(y_ref):
        """max(1e-4, 4 x fp32's own distance from y_ref on x) (its forward runs here)"""
        with torch.no_grad():
            return max(1e-4, 4 * (fp32(x).double() - y_ref).abs().max().item())

    xd = x.double().requires_grad_()
    y_ref = ref(xd)
    atol = outputs_atol(y_ref)
    g = torch.randn(y_ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7)).to(x.device)
    (y_ref * g).sum().backward()
    ys, dxs = [None] * ranks, [None] * ranks

    def rank(r):
        a, b = parts[r]
        xr = x[a:b].clone().requires_grad_()
        y = twins[r](xr)
        (y.double() * g[a:b]).sum().backward()
        ys[r], dxs[r] = y, xr.grad

    if ranks == 1:
        rank(0)  # (on this thread: a GPU's team is the thread's process group's, or its own)
    else:
        test.assertEqual(run_ranks(ranks, rank), [None] * ranks)
    torch.testing.assert_close(torch.cat(ys).double(), y_ref.detach(), rtol=1e-4, atol=atol)

    def within(name, got, want, scale):
        if want.norm() <= 1e-9 * scale:  # exactly 0 (float64 rounding)
            test.assertLessEqual(got.norm().item(), 1e-4 * scale, name)
            return
        err = ((got - want).norm() / want.norm()).item()
        test.assertLessEqual(err, 0.2, f"{name}: relative error {err:.2e}")

    scale = max(p.grad.norm().item() for p in ref.parameters() if p.grad is not None)
    within("dx", torch.cat(dxs).double(), xd.grad, xd.grad.norm().item())
    named = [dict(t.named_parameters()) for t in twins]
    for n, q in ref.named_parameters():
        if q.grad is None:  # a part of the model the output does not use
            test.assertEqual([t[n].grad for t in named], [None] * ranks, n)
            continue
        within(n, sum(t[n].grad for t in named).double(), q.grad, scale)
    # the running statistics, by name; fp32's own (its forward above ran in training)
    # are their yardstick
    want, own = dict(ref.named_buffers()), dict(fp32.named_buffers())
    for t in twins:
        for n, b in t.named_buffers():
            if not b.is_floating_point():
                test.assertTrue(torch.equal(b, want[n]), n)
                continue
            batol = max(1e-5, 4 * (own[n].double() - want[n]).abs().max().item())
            torch.testing.assert_close(b.double(), want[n], rtol=1e-4, atol=batol, msg=n)
    twins[0].eval()
    ref.eval()
    fp32.eval()
    # the team's running statistics in PyTorch's model: checked above, they widen
    # the yardstick by their own error only
    fp32.load_state_dict(twins[0].state_dict())
    with torch.no_grad():
        y_ref = ref(x.double())
        atol = outputs_atol(y_ref)
        y_eval = twins[0](x)
        torch.testing.assert_close(y_eval.double(), y_ref, rtol=1e-4, atol=atol, msg="eval")
    # the trained model reverted: its state bitwise the team's, and PyTorch's batch
    # norm on it gives the team's eval outputs (two fp32 models: eval's tolerance)
    reverted = sbt.revert_sync_batchnorm(copy.deepcopy(twins[0]))
    for k, v in twins[0].state_dict().items():
        test.assertTrue(torch.equal(reverted.state_dict()[k], v), k)
    with torch.no_grad():
        torch.testing.assert_close(reverted.eval()(x), y_eval, rtol=1e-4, atol=atol, msg="reverted")
