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

import threading

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

import syncbn as _sbn
from syncbn import _ops

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm", "team_for"]

_TRAIN = _ops.batch_norm_train
_INFER = _ops.batch_norm_infer
_train_eager, _infer_eager = _ops.train_eager, _ops.infer_eager
_Tensor = torch.Tensor
_compiling = torch.compiler.is_compiling
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 1)  # unknown: take the operator
_function_modes = getattr(torch._C, "_len_torch_function_stack", lambda: 1)


def _plain(x):
    """Whether the layer may call the operators' kernels directly: a plain CPU or CUDA
    tensor, outside torch.compile and outside any dispatch or function mode (make_fx,
    FlopCounterMode, a device context, ...), which must see the operator."""
    return (type(x) is _Tensor and (x.is_cpu or x.is_cuda) and not _compiling() and not _dispatch_modes()
            and not _function_modes())


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


def _check_comm(comm, who):
    if comm is not None and not isinstance(comm, _sbn.Comm):
        raise TypeError(f"{who}: comm must be a syncbn.Comm (a rank of syncbn.cpu_team or nccl_team) or None, "
                        f"got {type(comm).__name__}")
    return comm


class SyncBatchNorm(_BatchNorm):
    """torch.nn.SyncBatchNorm's interface on a syncbn team (see the module's docstring)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, device=None, dtype=None, comm=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group
        self.comm = comm

    convert_sync_batchnorm = None  # set below: the classmethod nn.SyncBatchNorm has
    _comm = None  # class defaults: layers pickled before these attributes existed
    _group_comm = None  # the process group's team on _group_device, found at the first training call
    _group_device = None

    @torch.compiler.disable  # collective, once per (group, device): run eagerly, never traced
    def _find_group_team(self, device):
        self._group_comm = team_for(self.process_group, device)
        self._group_device = device
        return self._group_comm

    @property
    def comm(self):
        """The team's rank this layer runs on (a syncbn.Comm), or None: the team of
        process_group on the input's GPU."""
        return self._comm

    @comm.setter
    def comm(self, value):
        self._comm = _check_comm(value, "syncbn.torch.SyncBatchNorm")

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        if input.dim() < 2:
            raise ValueError(f"syncbn.torch.SyncBatchNorm: expected at least 2D input (got {input.dim()}D input)")
        if input.shape[1] != self.num_features:
            raise ValueError(f"syncbn.torch.SyncBatchNorm: {input.shape[1]} channels, "
                             f"the layer has {self.num_features}")
        if not self.training:
            if self.running_mean is None:
                # nn.SyncBatchNorm's rule: eval without running statistics normalizes with
                # this rank's own batch, no sync (PyTorch's op, as there)
                return F.batch_norm(input, None, None, self.weight, self.bias, True, 0.0, self.eps)
            if _plain(input):
                return _infer_eager(input, self.running_mean, self.running_var, self.weight, self.bias, self.eps)
            return _INFER(input, self.running_mean, self.running_var, self.weight, self.bias, self.eps)
        comm = self._comm
        if comm is None:
            comm = self._group_comm
            if comm is None or self._group_device != input.device:  # once: later calls find it here
                comm = self._find_group_team(input.device)
        if comm._size == 1 and input.numel() == input.shape[1]:  # nn.BatchNorm's check, for a team of one
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {input.size()}")
        momentum = self.momentum
        if self.track_running_stats:
            rm, rv, nbt = self.running_mean, self.running_var, self.num_batches_tracked
        else:
            rm = rv = nbt = None
            momentum = 0.0  # no running statistics to update (momentum None would ask for num_batches_tracked)
        # Plain tensors outside torch.compile and modes: the operator's kernels and autograd
        # without the dispatcher's two Python-kernel calls (~4 us a call); everything else
        # (torch.compile, export, FX, fake, functional or meta tensors, modes): the operator
        if _plain(input):
            return _train_eager(input, self.weight, self.bias, rm, rv, nbt, self.eps, momentum, comm.id)
        return _TRAIN(input, self.weight, self.bias, rm, rv, nbt, self.eps, momentum, comm.id)[0]


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
