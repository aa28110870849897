"""Helpers of the Python tests that run CPU teams (their ranks are threads): imported from
the tests' own folder (a test run as a script has it on sys.path)."""

import copy
import threading
import unittest

import syncbn


def run_ranks(n, fn):
    """fn(r) for r < n, each on a thread of its own; the exception of each rank, or None."""
    errs = [None] * n

    def body(r):
        try:
            fn(r)
        except Exception as e:  # noqa: BLE001 (reported per rank)
            errs[r] = e

    ts = [threading.Thread(target=body, args=(r,)) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errs


def destroy_result(comm):
    """comm.destroy()'s outcome: "destroyed", or the name of the SyncBNError it raised (the
    tests of a destroy from another thread while a call has the comm)."""
    try:
        comm.destroy()
    except syncbn.SyncBNError as e:
        return e.name
    return "destroyed"


class TeamOfOne(unittest.TestCase):
    """A CPU team of one rank for the class's tests (self.comm)."""

    @classmethod
    def setUpClass(cls):
        cls.comm = syncbn.cpu_team(1)[0]

    @classmethod
    def tearDownClass(cls):
        cls.comm.destroy()


def converted_matches(test, model, x, converted, steps=2, input_grad=False):
    """converted (a converted copy of model, on a team of one) gives the float64 original's
    outputs, gradients (the input's too with input_grad) and buffers, training and eval:
    fp32 outputs and buffers within 1e-4 of float64, parameter gradients (sums over the
    batch's positions) within 1e-3 relative + 1e-4."""
    import torch  # (this module is imported without PyTorch too)

    ref = copy.deepcopy(model).double()
    for step in range(steps):
        xs = x.clone().requires_grad_(input_grad)
        Xs = x.double().requires_grad_(input_grad)
        y, Y = converted(xs), ref(Xs)
        torch.testing.assert_close(y.double(), Y, rtol=1e-4, atol=1e-4, msg=f"step {step}")
        g = torch.randn(y.shape, dtype=torch.float64)
        (y.double() * g).sum().backward()
        (Y * g).sum().backward()
        if input_grad:
            torch.testing.assert_close(xs.grad.double(), Xs.grad, rtol=1e-4, atol=1e-4, msg=f"dx, step {step}")
    for (n, p), (_, q) in zip(converted.named_parameters(), ref.named_parameters()):
        if q.grad is None:  # frozen
            test.assertIsNone(p.grad, n)
            continue
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-3, atol=1e-4, msg=n)
    for (n, b), (_, q) in zip(converted.named_buffers(), ref.named_buffers()):
        torch.testing.assert_close(b.double() if b.is_floating_point() else b, q, rtol=1e-4, atol=1e-5, msg=n)
    converted.eval()
    ref.eval()
    torch.testing.assert_close(converted(x).double(), ref(x.double()), rtol=1e-4, atol=1e-4, msg="eval")


def team_of_two_matches(test, model, convert, x, out_channels):
    """Two ranks (threads, batches of 3 and 1 of x's 4) each run convert(a copy of model,
    its comm) (a converter's copy of the model on a CPU team of two): each rank's outputs
    are the float64 model's on the whole batch (the team's statistics), the sums of the
    ranks' parameter gradients (DDP's, to within its average) the original's, and every
    rank's running statistics the original's; converted_matches' tolerances."""
    import torch

    comms = syncbn.cpu_team(2, timeout_ms=60000)
    try:
        twins = [convert(copy.deepcopy(model), comms[r]) for r in range(2)]
        g = torch.randn((x.shape[0], out_channels) + tuple(x.shape[2:]), dtype=torch.float64)
        parts, ys = [(0, 3), (3, 4)], [None, None]

        def rank(r):
            a, b = parts[r]
            y = twins[r](x[a:b])
            (y.double() * g[a:b]).sum().backward()
            ys[r] = y

        test.assertEqual(run_ranks(2, rank), [None, None])
        ref = copy.deepcopy(model).double()
        Y = ref(x.double())
        (Y * g).sum().backward()
        torch.testing.assert_close(torch.cat(ys).double(), Y, rtol=1e-4, atol=1e-4)
        for (n, p0), (_, p1), (_, q) in zip(twins[0].named_parameters(), twins[1].named_parameters(),
                                            ref.named_parameters()):
            torch.testing.assert_close((p0.grad + p1.grad).double(), q.grad, rtol=1e-3, atol=1e-4, msg=n)
        for twin in twins:
            for (n, b), (_, q) in zip(twin.named_buffers(), ref.named_buffers()):
                torch.testing.assert_close(b.double() if b.is_floating_point() else b, q, rtol=1e-4, atol=1e-5,
                                           msg=n)
    finally:
        for c in comms:
            c.destroy()


class Group:
    """A process group's stand-in: as a ProcessGroup, it cannot be copied or pickled."""

    def __reduce__(self):
        raise TypeError("cannot pickle 'Group' object")


def legacy_state_dict_hooks(m, name):
    """m with a load_state_dict pre-hook that renames the keys of an older checkpoint's
    "norm1." to "<name>." (its child's), and a state_dict hook that adds a key "tag": hooks
    a converter must keep."""
    import torch

    def pre(module, state_dict, prefix, *args):
        for k in [k for k in state_dict if k.startswith(prefix + "norm1.")]:
            state_dict[prefix + name + "." + k[len(prefix + "norm1."):]] = state_dict.pop(k)
    m._register_load_state_dict_pre_hook(pre, with_module=True)  # (the public name: PyTorch 2.5 on)
    m._register_state_dict_hook(lambda mod, sd, prefix, local: sd.__setitem__(prefix + "tag", torch.ones(1)))
    return m


def legacy_checkpoint(m, name):
    """m's state_dict, each value + 1, with its child `name`'s keys as an older checkpoint
    named them ("norm1."), without legacy_state_dict_hooks' "tag": what those hooks (or a
    loader of the class's own) load back into `name`."""
    return {k.replace(name + ".", "norm1."): v + 1.0 for k, v in m.state_dict().items() if k != "tag"}


def randomize_bn(m, g):
    """Batch norm m's weight of both signs (0.5 to 1.5 in size), bias in [-0.5, 0.5] and
    running statistics off their defaults (mean in [-0.2, 0.2], variance in [0.5, 2]),
    those it has, drawn from the generator g."""
    import torch

    c = m.num_features
    with torch.no_grad():
        if m.weight is not None:
            m.weight.copy_(torch.tensor([1.0, -1.0] * c)[:c] * (0.5 + torch.rand(c, generator=g)))
            m.bias.uniform_(-0.5, 0.5, generator=g)
        if m.running_mean is not None:
            m.running_mean.uniform_(-0.2, 0.2, generator=g)
            m.running_var.uniform_(0.5, 2.0, generator=g)
