"""syncbn.torch: a drop-in for torch.nn.SyncBatchNorm on syncbn's teams.

``SyncBatchNorm`` has the constructor, parameters, buffers and ``state_dict`` keys of
``torch.nn.SyncBatchNorm`` (it is a ``torch.nn.modules.batchnorm._BatchNorm``, as that
one is), and its semantics: training normalizes with the statistics of the whole team's
batch (momentum None: cumulative average through ``num_batches_tracked``), eval with the
running statistics (the library's inference), ``track_running_stats=False`` with the
team's statistics in training and this rank's own in eval (as nn.SyncBatchNorm); fp32, fp16 and bf16 inputs, contiguous or
channels_last; parameters and running statistics in float32 (others are converted for
the call, the running statistics written back). Gradients come from ``sbnBackward``
through an ``autograd.Function``; ``dweight``/``dbias`` are this rank's contributions
(PyTorch + DDP: DDP sums them).

The team: ``comm=`` (a ``syncbn.Comm``: a CPU team's rank for CPU tensors, the path CI
tests), set at construction, by ``convert_sync_batchnorm(..., comm=)`` or
``module.comm = ...``; otherwise, for CUDA tensors in an initialized ``torch.distributed``,
the team of the layer's ``process_group`` (the world by default) on the tensor's GPU:
made at its first use and cached (``team_for``): rank 0 of the group makes an NCCL
unique id (``sbnGetNcclUniqueId``), the group broadcasts it (``broadcast_object_list``),
and every rank calls ``sbnCommInitNcclRank``, where the library makes the NCCL comm
itself, nonblocking, bounded by the team's timeout. Not run on a GPU yet
(tests/python/test_torch_gpu.py, scripts/gpu-suite.sh's ``pytorch`` step). A missing
rank raises ``syncbn.SyncBNError`` named ``sbnTimeout`` after the team's timeout, in an
op or in the team's creation; the group's broadcast before it waits as PyTorch's
collectives do (its process group's timeout).
"""

import math
import threading

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

import syncbn as _sbn

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm", "team_for"]

_DTYPES = {torch.float32: _sbn.FLOAT32, torch.float16: _sbn.FLOAT16, torch.bfloat16: _sbn.BFLOAT16}


def _layout(x):
    """(x as the library reads it, layout): NCHW for a contiguous tensor, NHWC for a
    channels_last (3d) one, otherwise a contiguous copy."""
    if x.is_contiguous():
        return x, _sbn.NCHW
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return x, _sbn.NHWC
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return x, _sbn.NHWC
    return x.contiguous(), _sbn.NCHW


def _desc(x, layout):
    if x.dtype not in _DTYPES:
        raise TypeError(f"syncbn.torch: input dtype {x.dtype} (libsyncbn takes float32, float16, bfloat16)")
    spatial = math.prod(x.shape[2:]) if x.dim() > 2 else 1
    return _sbn.desc(_DTYPES[x.dtype], layout, x.shape[0], x.shape[1], spatial)


def _f32(t):
    return None if t is None else t.detach().to(torch.float32).contiguous()


def _stream(x):
    return torch.cuda.current_stream(x.device).cuda_stream if x.is_cuda else None


def _like(x, layout):
    fmt = torch.contiguous_format
    if layout == _sbn.NHWC:
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    return torch.empty_like(x, memory_format=fmt)


def _reduce_dims(x):
    return [0] + list(range(2, x.dim()))


class _Train(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, nbt, eps, momentum, comm):
        x, layout = _layout(x)
        d = _desc(x, layout)
        c = x.shape[1]
        w32, b32 = _f32(weight), _f32(bias)
        rm32 = rv32 = None
        if running_mean is not None:
            rm32 = running_mean if running_mean.dtype == torch.float32 and running_mean.is_contiguous() else _f32(running_mean)
            rv32 = running_var if running_var.dtype == torch.float32 and running_var.is_contiguous() else _f32(running_var)
        y = _like(x, layout)
        save_mean = torch.empty(c, dtype=torch.float32, device=x.device)
        save_invstd = torch.empty(c, dtype=torch.float32, device=x.device)
        comm.forward_train(d, x, y, save_mean, save_invstd, weight=w32, bias=b32, running_mean=rm32,
                           running_var=rv32, num_batches_tracked=nbt, eps=eps, momentum=momentum,
                           stream=_stream(x))
        if rm32 is not None and rm32 is not running_mean:
            running_mean.copy_(rm32)
            running_var.copy_(rv32)
        ctx.save_for_backward(x, w32, save_mean, save_invstd)
        ctx.layout, ctx.eps, ctx.comm = layout, eps, comm
        ctx.wdtype = None if weight is None else weight.dtype
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable  # the C backward is not differentiable again
    def backward(ctx, dy):
        x, w32, save_mean, save_invstd = ctx.saved_tensors
        layout = ctx.layout
        if layout == _sbn.NHWC:
            fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
            dy = dy.contiguous(memory_format=fmt)
        else:
            dy = dy.contiguous()
        d = _desc(x, layout)
        c = x.shape[1]
        dx = _like(x, layout) if ctx.needs_input_grad[0] else None
        want_w = w32 is not None and (ctx.needs_input_grad[1] or ctx.needs_input_grad[2])
        dw = torch.empty(c, dtype=torch.float32, device=x.device) if want_w else None
        db = torch.empty(c, dtype=torch.float32, device=x.device) if want_w else None
        ctx.comm.backward(d, x, dy, dx, save_mean, save_invstd, weight=w32, dweight=dw, dbias=db,
                          eps=ctx.eps, stream=_stream(x))
        gw = dw.to(ctx.wdtype) if want_w and ctx.needs_input_grad[1] else None
        gb = db.to(ctx.wdtype) if want_w and ctx.needs_input_grad[2] else None
        return dx, gw, gb, None, None, None, None, None, None


class _Infer(torch.autograd.Function):
    """Eval: the library's inference (no team); its backward with torch ops (local)."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps):
        x, layout = _layout(x)
        d = _desc(x, layout)
        w32, b32, rm32, rv32 = _f32(weight), _f32(bias), _f32(running_mean), _f32(running_var)
        y = _like(x, layout)
        _sbn.forward_inference(d, x, y, rm32, rv32, weight=w32, bias=b32, eps=eps, stream=_stream(x))
        ctx.save_for_backward(x, w32, rm32, rv32)
        ctx.eps = eps
        ctx.wdtype = None if weight is None else weight.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w32, rm32, rv32 = ctx.saved_tensors
        shape = [1, -1] + [1] * (x.dim() - 2)
        scale = torch.rsqrt(rv32 + ctx.eps)
        g = dy.to(torch.float32)
        dx = None
        if ctx.needs_input_grad[0]:
            k = scale if w32 is None else scale * w32
            dx = (g * k.view(shape)).to(x.dtype)
        gw = gb = None
        dims = _reduce_dims(x)
        if w32 is not None and ctx.needs_input_grad[1]:
            xhat = (x.to(torch.float32) - rm32.view(shape)) * scale.view(shape)
            gw = (g * xhat).sum(dims).to(ctx.wdtype)
        if w32 is not None and ctx.needs_input_grad[2]:
            gb = g.sum(dims).to(ctx.wdtype)
        return dx, gw, gb, None, None, None


# ---- teams from torch.distributed process groups (CUDA tensors) ------------------------
_TEAMS = {}  # (group, device index) -> syncbn.Comm
_TEAMS_LOCK = threading.Lock()  # one creation at a time: a team is made collectively


def team_for(process_group, device, timeout_ms=None):
    """The syncbn team of (process_group, device): one rank per process of the group,
    made collectively at the first call and cached. CUDA devices only."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "syncbn.torch.SyncBatchNorm: no team (comm=None) and torch.distributed is not initialized: "
            "pass comm= (a syncbn.Comm, e.g. a rank of syncbn.cpu_team(W)) or initialize a process group")
    if device.type != "cuda":
        raise RuntimeError("syncbn.torch: teams from a process group take CUDA tensors; for CPU tensors pass comm=")
    group = process_group if process_group is not None else dist.group.WORLD
    key = (group, device.index)
    with _TEAMS_LOCK:
        team = _TEAMS.get(key)
        if team is not None:
            return team
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        box = [None]
        if rank == 0:  # a failure here reaches every rank, not only rank 0
            try:
                box = [_sbn.nccl_unique_id()]
            except _sbn.SyncBNError as e:
                box = [("error", str(e))]
        # an NCCL group broadcasts through this rank's GPU (not cuda:0 unless set); gloo
        # through the host, as torch picks for it
        dev = {"device": device} if dist.get_backend(group) == "nccl" else {}
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group, **dev)
        if isinstance(box[0], tuple):
            raise RuntimeError(f"syncbn.torch: rank 0 of the group could not make the team's NCCL id: {box[0][1]}")
        with torch.cuda.device(device):
            team = _sbn.nccl_team(box[0], size, rank, timeout_ms=timeout_ms)
        _TEAMS[key] = team
        return team


class SyncBatchNorm(_BatchNorm):
    """torch.nn.SyncBatchNorm's interface on a syncbn team (see the module's docstring)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, device=None, dtype=None, comm=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group
        self.comm = comm

    convert_sync_batchnorm = None  # set below: the classmethod nn.SyncBatchNorm has

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise ValueError(f"syncbn.torch.SyncBatchNorm: {input.shape[1]} channels, "
                             f"the layer has {self.num_features}")
        if not self.training:
            if self.running_mean is None and self.running_var is None:
                # nn.SyncBatchNorm's rule: eval without running statistics normalizes with
                # this rank's own batch, no sync (PyTorch's op, as there)
                return F.batch_norm(input, None, None, self.weight, self.bias, True, 0.0, self.eps)
            return _Infer.apply(input, self.weight, self.bias, self.running_mean, self.running_var, self.eps)
        comm = self.comm if self.comm is not None else team_for(self.process_group, input.device)
        track = self.training and self.track_running_stats
        rm = self.running_mean if track else None
        rv = self.running_var if track else None
        nbt = self.num_batches_tracked if track else None
        return _Train.apply(input, self.weight, self.bias, rm, rv, nbt, self.eps, self.momentum, comm)


def convert_sync_batchnorm(module, process_group=None, comm=None):
    """torch.nn.SyncBatchNorm.convert_sync_batchnorm's rule: every BatchNorm*D layer of
    module (recursively) becomes a SyncBatchNorm with the same parameters, buffers,
    requires_grad and training mode, on team `comm`."""
    out = module
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        out = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                            module.track_running_stats, process_group, comm=comm)
        if module.affine:
            with torch.no_grad():
                out.weight = module.weight
                out.bias = module.bias
        out.running_mean = module.running_mean
        out.running_var = module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.training = module.training
        if hasattr(module, "qconfig"):
            out.qconfig = module.qconfig
    for name, child in module.named_children():
        out.add_module(name, convert_sync_batchnorm(child, process_group, comm))
    del module
    return out


SyncBatchNorm.convert_sync_batchnorm = classmethod(
    lambda cls, module, process_group=None, comm=None: convert_sync_batchnorm(module, process_group, comm))
