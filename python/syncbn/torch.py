"""syncbn.torch: a drop-in for torch.nn.SyncBatchNorm on syncbn's teams.

``SyncBatchNorm`` has the constructor, parameters, buffers and ``state_dict`` keys of
``torch.nn.SyncBatchNorm`` (it is one, a subclass, so that code which looks for
``nn.SyncBatchNorm`` or ``_BatchNorm`` layers finds it; ``bias=False`` included), and its
semantics: training normalizes with the
statistics of the whole team's batch (momentum None: cumulative average through
``num_batches_tracked``), eval with the running statistics (the library's inference),
``track_running_stats=False`` with the team's statistics in training and this rank's own
in eval (as nn.SyncBatchNorm); fp32, fp16 and bf16 inputs, contiguous or channels_last;
parameters and running statistics in float32 (others are converted for
the call, the running statistics written back). Gradients come from ``sbnBackward``
through an ``autograd.Function``; ``dweight``/``dbias`` are this rank's contributions
(PyTorch + DDP: DDP sums them).

The team: ``comm=`` (a ``syncbn.Comm``: a CPU team's rank for CPU tensors, the path CI
tests), set at construction, by ``convert_sync_batchnorm(..., comm=)`` or
``module.comm = ...``; otherwise, for CUDA tensors in an initialized ``torch.distributed``,
the team of the layer's ``process_group`` (the world by default) on the tensor's GPU:
made at its first use and cached while the group lives (``team_for``): rank 0 of the
group makes an NCCL unique id (``sbnGetNcclUniqueId``), the group broadcasts it
(``broadcast_object_list``), and every rank calls ``sbnCommInitNcclRank``, where the
library makes the NCCL comm itself, nonblocking, bounded by the team's timeout
(tests/python/test_torch_gpu.py, scripts/gpu-suite.sh's ``pytorch`` step, on a GPU). A
missing rank raises ``syncbn.SyncBNError`` named ``sbnTimeout`` after the team's timeout,
in an op or in the team's creation; the group's broadcast before it waits as PyTorch's
collectives do (its process group's timeout). Without ``comm=`` and without a process
group, where nn.SyncBatchNorm runs PyTorch's batch norm on the rank's batch alone: a team
of one on the tensor's device (``_own_team``).
"""

import copy
import functools
import inspect
import numbers
from collections import OrderedDict
import threading
import warnings
import weakref

import torch
import torch.autograd.forward_ad as _fwad
import torch.distributed as _dist
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

import syncbn as _sbn
from syncbn import _capi, _fused, _ops

__all__ = ["SyncBatchNorm", "SyncBatchNormAct", "ABNSync", "InPlaceABNSync", "convert_sync_batchnorm", "convert_fused",
           "revert_sync_batchnorm", "BatchNormXd", "BatchNormActXd", "FusedBasicBlock", "FusedBottleneck",
           "FusedActivation", "team_for"]

_TRAIN = _ops.batch_norm_train
_INFER = _ops.batch_norm_infer
_TRAIN_ACT = _fused.batch_norm_act_train
_INFER_ACT = _fused.batch_norm_act_infer
_train_eager, _infer_eager = _ops.train_eager, _ops.infer_eager
_train_act_eager, _infer_act_eager = _fused.train_eager, _fused.infer_eager
# nn.BatchNorm*d's keyword-only bias= (PyTorch 2.15); before it, the layer makes bias=False
# itself
_BIAS_KW = "bias" in inspect.signature(torch.nn.SyncBatchNorm.__init__).parameters
_Tensor = torch.Tensor
_DTYPES = frozenset((torch.float32, torch.float16, torch.bfloat16))
_compiling = torch.compiler.is_compiling
_INF = float("inf")
_F32_INF = 2.0**128 - 2.0**103  # the least value that is inf as a float32 (FLT_MAX rounds up past it)
_F32_ZERO = 2.0**-150  # the largest value that is 0 as a float32 (half the least subnormal: ties to even)
_jit_tracing = torch.jit.is_tracing


def _graphed(plain):
    """Whether an evaluated layer records PyTorch's batch norm rather than syncbn's
    inference operator: wherever its input is not a plain eager tensor (`plain`, _plain:
    torch.compile, torch.export strict or not (AOTInductor, ExecuTorch, TensorRT and
    torch.onnx's dynamo exporter start there), fake, meta or functional tensors, dispatch
    and function modes), and under a TorchScript trace (torch.jit.trace, torch.onnx's
    TorchScript-based exporter), whose tensors are plain. The same on every PyTorch: no
    export flag is needed (PyTorch 2.4 has no torch.compiler.is_exporting; a non-strict
    export's tensors are fake in every version). Not asked: torch.onnx.is_in_onnx_export,
    which imports modules at each call (1.1-1.6 us of an eval call's ~7 on CPU). And
    under forward-mode AD (torch.func's jvp and jacfwd, whose tensors look plain, and
    torch.autograd.forward_ad's dual levels), where PyTorch's batch norm has the rule
    syncbn's operators lack; with the Python operators also under torch.func's grad, vjp
    and jacrev, whose autograd.Function those transforms cannot run (vmap keeps the
    operators, as grad keeps the C++ ones: their rules are the operators')."""
    return (not plain or _jit_tracing() or _fwad._current_level >= 0
            or (_functorch_level() is not None and _under(_BEYOND)))


_functorch_level = getattr(getattr(torch._C, "_functorch", None), "maybe_current_level", lambda: None)
try:
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters as _interpreters
    _TT = torch._C._functorch.TransformType
    # the transforms whose rule the operators lack: jvp; with the Python operators, grad too
    _BEYOND = frozenset((_TT.Jvp,) if _ops.NATIVE is not None else (_TT.Jvp, _TT.Grad))
    _GRAD = frozenset((_TT.Grad,))  # grad, vjp, jacrev
    _FUNCTIONALIZE = frozenset((_TT.Functionalize,))
except (ImportError, AttributeError):  # a PyTorch without them: the operators refuse jvp
    _interpreters, _BEYOND, _GRAD, _FUNCTIONALIZE = (lambda: ()), frozenset(), frozenset(), frozenset()


_FUNCTIONALIZE_TRAINING = (
    "syncbn.torch.SyncBatchNorm in training under torch.func.functionalize: its operator writes the running "
    "statistics in place, and functionalize takes no custom operator that writes its inputs (PyTorch's rule); "
    "nothing was written. torch.compile and torch.export functionalize it (auto_functionalized); an evaluated "
    "layer runs under functionalize")
_PY_OPS_GRAD = ("syncbn.torch.SyncBatchNorm in training under torch.func's grad, vjp or jacrev: the Python "
                "operators (SYNCBN_TORCH_NATIVE=0, or the fallback where the C++ ones did not build) take none of "
                "them; the C++ operators take them all (first derivatives: the training backward is not "
                "differentiable); an evaluated layer takes them all")


def _under(kinds):
    """Whether a torch.func transform of one of `kinds` (TransformType) is active (asked
    only under some transform)."""
    return any(i.key() in kinds for i in _interpreters())


_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 1)  # unknown: take the operator
_function_modes = getattr(torch._C, "_len_torch_function_stack", lambda: 1)


def _layer_call(node):
    """Whether a torch.fx node is a call of a layer that _fx_leaf recorded as one
    (call_method __call__ or forward on a get_attr)."""
    return (node.op == "call_method" and node.target in ("__call__", "forward") and len(node.args) > 0
            and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "get_attr")


def _fx_leaf(module, input, residual, kwargs=None, norm_only=True):
    """Under torch.fx symbolic tracing (an input that is a torch.fx.Proxy: symbolic_trace,
    torchvision's create_feature_extractor, torch.ao's prepare_fx): the layer recorded as
    ONE call_module node, as the tracer records torch.nn's own batch norms (its leaf
    modules), so that the layer's Python (its checks, the team it finds, train or eval)
    runs when the traced module runs, and the traced module holds the layer (its
    parameters and buffers), with the keyword arguments `kwargs` (SyncBatchNorm's
    activate=False). None when not tracing.

    A batch norm whose call is more than a batch norm of its input (an activation, a
    residual added: norm_only False) is ONE call of the layer instead (call_method
    __call__ on it: its hooks run, as a call_module node's): a graph rewrite that takes a
    call_module node of a batch norm class for a batch norm of its first argument would
    lose what it adds: mmengine's efficient_conv_bn_eval folds such a node into the
    convolution before it in eval (the activation lost), and calls it with that argument
    alone in training (a residual lost). A layer whose input is such a call's output (or a
    hooked layer's) is a call too: that rewrite looks its input's node up as a module
    (KeyError for a call's target, "__call__"), where a call_module node's input is one."""
    proxy = input if isinstance(input, torch.fx.Proxy) else residual
    if not isinstance(proxy, torch.fx.Proxy):
        return None
    if isinstance(input, torch.fx.Proxy) and _layer_call(input.node):
        norm_only = False
    tracer = proxy.tracer
    path = tracer.path_of_module(module)
    if not path:
        raise TypeError(f"torch.fx: syncbn.torch.{type(module).__name__} cannot be the traced module itself (the "
                        "tracer records it as a call of one of the traced module's layers): trace a module that "
                        "holds it")
    args = (input,) if residual is None else (input, residual)
    # with hooks (its own or global): they ran around this forward as the tracer called the
    # layer, traced into the graph, and must not run again when the node runs (as a
    # call_module node's or __call__'s would): a call of its forward
    hooked = not _no_hooks(module) or _global_hooks()
    if hooked or not norm_only:
        layer = tracer.create_proxy("get_attr", path, (), {})
        return tracer.create_proxy("call_method", "forward" if hooked else "__call__", (layer, *args), kwargs or {})
    return tracer.create_proxy("call_module", path, args, kwargs or {})


def _plain(x):
    """Whether the layer may call the operators' kernels directly: a plain CPU or CUDA
    tensor, outside torch.compile and outside any dispatch or function mode (make_fx,
    FlopCounterMode, a device context, ...), which must see the operator."""
    return (type(x) is _Tensor and (x.is_cpu or x.is_cuda) and not _compiling() and not _dispatch_modes()
            and not _function_modes())


# ---- teams from torch.distributed process groups (CUDA tensors) ------------------------
# group -> {device index: syncbn.Comm}; held weakly by the group: once torch.distributed has
# dropped a group (destroy_process_group) and no layer names it, its teams are destroyed
_TEAMS = weakref.WeakKeyDictionary()
_TEAMS_LOCK = threading.Lock()  # one creation at a time: a team is made collectively
_GROUP_TEAM_CHANNELS = 4096  # the least max_channels of a process group's team (the library's default)


def _group_of(process_group):
    """The process group a layer's process_group names: itself, or for None the default
    group as it is now (a ProcessGroup; another one after destroy_process_group and
    init_process_group)."""
    return process_group if process_group is not None else _dist.group.WORLD


def _dynamo_wraps_groups():
    """Whether torch.compile's Dynamo wraps a ProcessGroup in a ProcessGroupVariable
    (PyTorch 2.4): it guards every read of a group by identity and folds `is` under those
    guards, and id() of one is a graph break. Later ones take a group as a script object:
    they guard the ids id() is given, and fold `is` once as they trace, unguarded."""
    try:
        from torch._dynamo.variables import distributed
    except Exception:  # noqa: BLE001 (no Dynamo: no torch.compile to serve)
        return False
    return hasattr(distributed, "ProcessGroupVariable")


# Whether the layer's team is of the group it now names, compared as torch.compile guards
# it (a graph traced again for another group; where it is not guarded, a graph that found
# a new team would look for it again at every call, or run on the old one)
if _dynamo_wraps_groups():
    def _same_group(a, b):
        return a is b
else:
    def _same_group(a, b):
        return id(a) == id(b)


def _drop_destroyed_groups():
    """Drops the teams of the groups torch.distributed no longer knows (destroyed while
    something still holds the group): they were made of its ranks, and are destroyed once
    no layer's autograd node holds them. _TEAMS_LOCK held."""
    for group in list(_TEAMS.keys()):
        try:
            _dist.get_process_group_ranks(group)
        except (KeyError, ValueError, RuntimeError):
            del _TEAMS[group]


def _outside_group(group):
    """Whether this process has no rank in the process group (None: the default group):
    torch's rank there is -1."""
    return _dist.get_rank(group if group is not None else _dist.group.WORLD) < 0


def team_for(process_group, device, timeout_ms=None, max_channels=None):
    """The syncbn team of (process_group, device): one rank per process of the group,
    made collectively at the first call and cached. CUDA devices only. ``max_channels``:
    the widest layer it must take; a cached team narrower than that is replaced by a new
    one (made collectively: every rank asks at the same layer) of max(max_channels,
    4096) channels. ``timeout_ms`` applies to a team it makes (a cached team keeps its
    own). A ValueError in a process outside the group."""
    if not _dist_ready():
        raise RuntimeError(
            "syncbn.torch.SyncBatchNorm: no team (comm=None) and torch.distributed is not initialized: "
            "pass comm= (a syncbn.Comm, e.g. a rank of syncbn.cpu_team(W)) or initialize a process group")
    if device.type != "cuda":  # a ValueError, as nn.SyncBatchNorm's for such an input under a process group
        raise ValueError(f"syncbn.torch: teams from a process group take CUDA tensors (here {device}): syncbn "
                         f"synchronizes no CPU tensors across processes (nn.SyncBatchNorm neither); a CPU "
                         f"team's ranks are the threads of one process (comm=, a rank of syncbn.cpu_team), "
                         f"which a rank of another process cannot join")
    group = _group_of(process_group)
    if _outside_group(group):
        raise ValueError(f"syncbn.torch.team_for: this process (global rank {_dist.get_rank()}) is not in the "
                         f"process group: it has no rank in the group's team (a SyncBatchNorm of that group "
                         f"runs batch norm on its own batch there, as nn.SyncBatchNorm does)")
    channels = max(_GROUP_TEAM_CHANNELS, int(max_channels or 0))
    with _TEAMS_LOCK:
        team = _TEAMS.get(group, {}).get(device.index)
        if team is not None and (max_channels is None or team.max_channels >= max_channels):
            return team
        _drop_destroyed_groups()
        rank, size = _dist.get_rank(group), _dist.get_world_size(group)
        box = [None]
        if rank == 0:  # a failure here reaches every rank, not only rank 0
            try:
                box = [_sbn.nccl_unique_id()]
            except _sbn.SyncBNError as e:
                box = [("error", str(e))]
        # an NCCL group broadcasts through this rank's GPU (not cuda:0 unless set); gloo
        # through the host, as torch picks for it
        dev = {"device": device} if _dist.get_backend(group) == "nccl" else {}
        _dist.broadcast_object_list(box, src=_dist.get_global_rank(group, 0), group=group, **dev)
        if isinstance(box[0], tuple):
            raise RuntimeError(f"syncbn.torch: rank 0 of the group could not make the team's NCCL id: {box[0][1]}")
        with torch.cuda.device(device):
            team = _sbn.nccl_team(box[0], size, rank, timeout_ms=timeout_ms, max_channels=channels)
        _TEAMS.setdefault(group, {})[device.index] = team
        return team


_DIST_AVAILABLE = _dist.is_available()


def _default_group():
    """The default process group, or None where torch.distributed has none (nn.SyncBatchNorm
    syncs only where is_initialized()). The group is read for torch.compile, which guards
    it (a graph is traced again once it is destroyed or made again), and whether there is
    one asked of is_initialized(), which it folds to a constant without a guard (alone, a
    graph traced with a group would run on after destroy_process_group, on the destroyed
    group's team): PyTorch 2.4's Dynamo answers `WORLD is not None` True for a WORLD of
    None."""
    if not _DIST_AVAILABLE:
        return None
    world = _dist.group.WORLD
    return world if _dist.is_initialized() else None


def _dist_ready():
    """Whether torch.distributed has a process group (nn.SyncBatchNorm's test for syncing)."""
    return _default_group() is not None


# Teams of one: where nn.SyncBatchNorm, with no process group, runs PyTorch's batch norm on
# the rank's own batch, the layer runs the same function (its epilogue, in place where
# asked, included) on a team of one on the input's device. A comm takes one thread's call
# at a time, and threads training models at once would collide on a shared one: each thread
# has its own (_OWN_LOCAL), made at its first use; when the thread ends they go to a pool
# that later threads take from (nn.DataParallel starts a thread per device at every
# forward: no new NCCL comm per step).
_OWN_LOCAL = threading.local()
_OWN_POOL = {}  # device key -> [syncbn.Comm]: the teams of threads that ended
_OWN_POOL_LOCK = threading.Lock()  # (not _TEAMS_LOCK, held through a group team's collective creation)


class _ThreadTeams(dict):
    """A thread's teams of one, by device key; into _OWN_POOL when the thread ends."""

    def __del__(self):
        try:
            with _OWN_POOL_LOCK:
                for key, team in self.items():
                    _OWN_POOL.setdefault(key, []).append(team)
        except Exception:  # interpreter shutdown: the teams go with the process
            pass


def _own_team(device, max_channels=None):
    """This thread's team of one on `device` (a syncbn.Comm): a CPU team of one for CPU
    tensors (and for meta tensors, whose kernels call no team), an NCCL team of one (no
    collective: its id is made here) for CUDA tensors; one at least max(max_channels, 4096)
    wide (a narrower one replaced)."""
    key = ("cuda", device.index) if device.type == "cuda" else "cpu"
    mine = getattr(_OWN_LOCAL, "teams", None)
    if mine is None:
        mine = _OWN_LOCAL.teams = _ThreadTeams()
    team = mine.get(key)
    if team is not None and (max_channels is None or team.max_channels >= max_channels):
        return team
    channels = max(_GROUP_TEAM_CHANNELS, int(max_channels or 0))
    with _OWN_POOL_LOCK:
        pool = _OWN_POOL.get(key, [])
        team = next((t for t in pool if t.max_channels >= channels), None)
        if team is not None:
            pool.remove(team)
    if team is None and key == "cpu":
        team = _sbn.cpu_team(1, max_channels=channels)[0]
    elif team is None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"syncbn.torch.SyncBatchNorm: no team (comm=None, torch.distributed not initialized) "
                               f"and a CUDA graph capture: the layer's team of one on {device} is made at its first "
                               f"training call, which cannot be captured; run one training step before capturing")
        try:
            with torch.cuda.device(device):
                team = _sbn.nccl_team(_sbn.nccl_unique_id(), 1, 0, max_channels=channels)
        except _sbn.SyncBNError as e:
            raise RuntimeError(f"syncbn.torch.SyncBatchNorm: no team (comm=None, torch.distributed not initialized): "
                               f"the layer's team of one on {device} needs NCCL, which failed: {e}; pass comm= or "
                               f"initialize a process group") from e
    # other threads may call it too: an autograd node's backward run by another thread, a
    # compiled graph's team, a team taken from the pool while an ended thread's graph lives
    team._serialize_calls()
    mine[key] = team  # (a narrower one it replaces stays alive while a layer's autograd node holds it)
    return team


_TRACED_TEAMS = {}  # id -> syncbn.Comm: every team of one a compiled graph holds by its id


def _own_team_id(device, max_channels=None):
    """The id of _own_team(device, max_channels), its team kept alive for the graphs that
    hold the id (a thread replaces a narrower team by a wider one, and drops it)."""
    team = _own_team(device, max_channels)
    _TRACED_TEAMS[team.id] = team
    return team.id


# torch.compile calls it while it traces and keeps the team's id as a constant of the graph
# (a new device: a new graph), so that a layer's first call needs no graph break (and the
# graph is not traced again: nothing of the layer is written). An int, not the Comm: the
# Dynamo of PyTorch 2.4 reads no attribute of an object that assume_constant_result gives.
# Threads that run one compiled graph at once share the team it traced.
_own_team_id_traced = getattr(torch.compiler, "assume_constant_result", lambda f: f)(_own_team_id)


def _check_comm(comm, who):
    if comm is not None and not isinstance(comm, _sbn.Comm):
        raise TypeError(f"{who}: comm must be a syncbn.Comm (a rank of syncbn.cpu_team or nccl_team) or None, "
                        f"got {type(comm).__name__}")
    return comm


class _OptionalBias:
    """bias=False on every PyTorch the package serves: nn.BatchNorm*d's keyword-only bias=
    where PyTorch has it (2.15), else a bias of None made here (after the base's __init__:
    _drop_bias)."""

    @staticmethod
    def _bias_kw(bias):
        return {"bias": bias} if _BIAS_KW else {}

    def _drop_bias(self, bias):
        if self.affine and not bias and not _BIAS_KW:
            self.register_parameter("bias", None)

    def reset_parameters(self):
        if _BIAS_KW or not self.affine or self.bias is not None:
            return super().reset_parameters()
        self.reset_running_stats()  # a PyTorch without bias= would zero a bias of None
        torch.nn.init.ones_(self.weight)

    def extra_repr(self):
        s = super().extra_repr()
        return s + ", bias=False" if not _BIAS_KW and self.affine and self.bias is None else s


class SyncBatchNorm(_OptionalBias, torch.nn.SyncBatchNorm):
    """torch.nn.SyncBatchNorm's interface on a syncbn team (see the module's docstring),
    with an optional fused epilogue: ``activation`` ("identity", "relu", "leaky_relu" with
    negative slope ``slope``) and ``forward(input, residual=None)`` compute
    act(batch_norm(input) + residual) in one op, in training (the team's statistics) and
    in eval (the running statistics: the same formula); ``forward(..., activate=False)``
    computes batch_norm(input) + residual, without the activation (and not in place).
    ``inplace=True``: autograd keeps only the output, not the input (the backward recovers
    the input from it, as inplace_abn): for identity or leaky_relu with slope > 0 (ReLU is
    not invertible: refused here, at construction). With a residual it keeps the residual
    too, and recovers the input from the output and the residual: nothing more where the
    residual is kept anyway (a residual block's input, which its first convolution keeps).
    The output is still a new tensor."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, device=None, dtype=None, comm=None, activation="identity", slope=0.01,
                 inplace=False, *, bias=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype,
                         **self._bias_kw(bias))
        self._drop_bias(bias)
        self.process_group = process_group
        self.comm = comm
        self.set_activation(activation, slope, inplace)

    convert_sync_batchnorm = None  # set below: the classmethod nn.SyncBatchNorm has
    _comm = None  # class defaults: layers pickled before these attributes existed
    _group_comm = None  # the team of _group_pg (process_group) on _group_device, found at the first training
    _group_device = None  # call (False: this process is not in the group)
    _group_pg = None
    _group_world = None  # the default group then (a group is not used past its world's end)
    _act = _sbn.IDENTITY  # the fused epilogue (set_activation); identity, no in-place: the plain layer
    _slope = 0.01
    _inplace = False
    _abs_weight = False  # InPlaceABNSync's scale |weight| + eps in place of the weight

    def set_activation(self, activation="identity", slope=0.01, inplace=False):
        """Sets the fused epilogue: activation "identity", "relu" or "leaky_relu" (negative
        slope `slope`), and the in-place mode; ValueError naming what is refused (ReLU or
        slope 0 in place: not invertible)."""
        who = "syncbn.torch.SyncBatchNorm"
        if not isinstance(activation, str) or activation not in _fused.ACTIVATIONS:
            raise ValueError(f"{who}: activation {activation!r}: one of \"identity\", \"relu\", \"leaky_relu\"")
        try:
            slope = _capi.c_float(slope, "slope")
        except (TypeError, ValueError) as e:
            raise type(e)(f"{who}: {str(e).removeprefix('syncbn: ')}") from None
        inplace = _flag(inplace, "inplace", who)
        _fused.check_activation(_fused.ACTIVATIONS[activation], slope, inplace, who)
        self._act, self._slope, self._inplace = _fused.ACTIVATIONS[activation], slope, inplace
        return self

    @property
    def activation(self):
        return {v: k for k, v in _fused.ACTIVATIONS.items()}[self._act]

    @property
    def slope(self):
        return self._slope

    @property
    def inplace(self):
        """The in-place mode. Setting it is set_activation with the activation and slope as
        they are (ValueError for ReLU in place): code written for PyTorch's modules turns
        in-place ops off with ``if hasattr(m, "inplace"): m.inplace = False``."""
        return self._inplace

    @inplace.setter
    def inplace(self, value):
        self._set_inplace(value)

    def _set_inplace(self, value):
        self.set_activation(self.activation, self._slope, value)

    def extra_repr(self):
        s = super().extra_repr()
        if self._act != _sbn.IDENTITY:
            s += f", activation={self.activation!r}"
            if self._act == _sbn.LEAKY_RELU:
                s += f", slope={self._slope}"
        if self._inplace:
            s += ", inplace=True"
        return s

    @torch.compiler.disable  # collective, once per (group, device): run eagerly, never traced
    def _find_group_team(self, device):
        """The team of process_group on device, kept with the group it is of (_group_of: a
        layer given another group, or whose default group was made again, finds that
        group's); False where this process is not in the group."""
        group = self.process_group
        if device.type == "cuda" and _outside_group(group):
            self._group_comm = False
        else:  # (a CPU tensor: team_for's ValueError, in the group or not, as nn.SyncBatchNorm's)
            self._group_comm = team_for(group, device, max_channels=self.num_features)
        self._group_device, self._group_pg, self._group_world = device, _group_of(group), _dist.group.WORLD
        return self._group_comm

    def _forget_group(self):
        """Forgets the team found for process_group (found again at the next training call
        that asks for one)."""
        self._group_comm = self._group_device = self._group_pg = self._group_world = None

    @torch.compiler.disable  # once after destroy_process_group: run eagerly
    def _let_go_of_group(self):
        """No process group now (destroyed): the layer lets go of the last one's team, and
        team_for of the teams of the groups destroyed (a compiled graph may hold a group, and
        so its teams, until the next team is made)."""
        self._forget_group()
        with _TEAMS_LOCK:
            _drop_destroyed_groups()

    def __getstate__(self):
        # the group's team is this process's, found for a group that may be gone by now (and
        # a ProcessGroup pickles not): a copy or a loaded layer finds its team again
        state = super().__getstate__()
        for k in ("_group_comm", "_group_device", "_group_pg", "_group_world"):
            state.pop(k, None)
        return state

    @property
    def comm(self):
        """The team's rank this layer runs on (a syncbn.Comm), or None: the team of
        process_group on the input's GPU (without a process group, a team of one on the
        input's device)."""
        return self._comm

    @comm.setter
    def comm(self, value):
        self._comm = _check_comm(value, "syncbn.torch.SyncBatchNorm")
        if "_group_comm" in self.__dict__:  # a team of the process group found before: not kept
            self._forget_group()

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"syncbn.torch.SyncBatchNorm: expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input, residual=None, *, activate=True, _alone=None):
        pair = self.__dict__.get(_PAIRED)
        if type(input) is not _Tensor or (residual is not None and type(residual) is not _Tensor):
            # (a plain tensor is no torch.fx.Proxy)
            kw = {} if activate is True else {"activate": activate}
            if pair is not None and activate and _unfused_now(self):
                kw["_alone"] = True  # (hooked: traced into the graph, which keeps this choice)
            traced = _fx_leaf(self, input, residual, kw or None, residual is None and self._act == _sbn.IDENTITY)
            if traced is not None:
                return traced
        # first, as nn.SyncBatchNorm's forward does: a subclass's (a 4D-only layer's) refuses
        # what it does not take
        self._check_input_dim(input)
        if pair is not None and activate:
            # a hook sees the output: the batch norm alone, the activation by what follows
            pair.alone = alone = _unfused_now(self) if _alone is None else bool(_alone)
            activate = not alone
        if activate:
            return self._run(input, residual, self._act, self._slope, self._inplace)
        return self._run(input, residual, _sbn.IDENTITY, self._slope, False)  # batch_norm(input) + residual

    def _run(self, input, residual, act, slope, inplace):
        """The layer's op on input with the epilogue act(. + residual) of slope `slope`, in
        place or not: forward's, with the layer's own epilogue or (activate=False) none."""
        if input.dim() < 2:
            raise ValueError(f"syncbn.torch.SyncBatchNorm: expected at least 2D input (got {input.dim()}D input)")
        c = input.shape[1]
        if c != self.num_features or c == 0:
            if c == 0:  # nn.SyncBatchNorm's ValueError, in training and eval
                raise ValueError("syncbn.torch.SyncBatchNorm: number of input channels should be non-zero")
            raise RuntimeError(f"syncbn.torch.SyncBatchNorm: {c} channels, "  # as F.batch_norm's for this
                               f"the layer has {self.num_features}")
        fused = residual is not None or act != _sbn.IDENTITY or inplace
        # each buffer and parameter read once: an nn.Module's __getattr__ is ~0.5-1 us
        w, b = self.weight, self.bias
        if self._abs_weight and w is not None:  # InPlaceABNSync: the scale |weight| + eps
            w = _abs_eps(w, self.eps)
        if w is None and b is not None:  # F.batch_norm takes it: a weight of ones (the library takes both)
            w = _ones_like(b)
        if not input.is_floating_point():  # (also where eval runs PyTorch's batch norm below)
            _check_dtype(input)
        if not self.training:
            if not 0.0 <= float(self.eps) < _F32_INF:  # F.batch_norm's ValueError for eps < 0; the library's
                _bad_eps(self.eps, "non-negative")  # rule (finite), as a ValueError too
            plain = _plain(input)  # (not under torch.compile)
            rm, rv = self.running_mean, self.running_var
            if (rm is None) != (rv is None):  # F.batch_norm's error (nn.SyncBatchNorm's eval)
                raise RuntimeError(f"syncbn.torch.SyncBatchNorm: {'running_var' if rv is None else 'running_mean'} "
                                   f"must be defined in evaluation mode")
            if rm is None or input.dtype == torch.float64 or _graphed(plain):
                # nn.SyncBatchNorm's rule: eval without running statistics normalizes with
                # this rank's own batch, no sync (PyTorch's op, as there); a float64 model
                # (model.double(): its running statistics float64 too), which the library does
                # not take, where the eval of nn.SyncBatchNorm runs; and an input that is not a
                # plain eager tensor, or a TorchScript trace (_graphed): torch.compile's graph
                # (inductor fuses PyTorch's batch norm with its neighbours, and folds it into
                # the convolution before it with freezing, which it cannot do across syncbn's
                # operator), an export's (ONNX's exporters, AOTInductor, ExecuTorch: the graph
                # runs where syncbn's operators are not), fake tensors, modes. The same formula
                # with PyTorch's ops.
                # The residual refused where the operators refuse it (a broadcast shape, ...)
                _fused._check_residual(input, residual, "torch.SyncBatchNorm")
                if input.dtype != torch.float64 and any(
                        t is not None and t.dtype != input.dtype for t in (w, b, rm, rv)):
                    # parameters or statistics of another float dtype (model.half() fed
                    # fp32): float32 for PyTorch's op, which refuses the mix ("mixed dtype
                    # (CPU)") and takes float32 ones with any input, as the library does
                    w, b, rm, rv = (None if t is None else t.float() for t in (w, b, rm, rv))
                if rm is None:
                    y = F.batch_norm(input, None, None, w, b, True, 0.0, self.eps)
                else:
                    y = F.batch_norm(input, rm, rv, w, b, False, 0.0, self.eps)
                return _epilogue(y, residual, act, slope) if fused else y
            _check_dtype(input)
            if not fused:
                if plain:
                    return _infer_eager(input, rm, rv, w, b, self.eps)
                return _INFER(input, rm, rv, w, b, self.eps)
            if plain and (residual is None or _plain(residual)):
                return _infer_act_eager(input, residual, rm, rv, w, b, self.eps, act, slope)
            return _INFER_ACT(input, residual, rm, rv, w, b, self.eps, act, slope)
        _check_dtype(input)
        if _functorch_level() is not None:
            if _ops.NATIVE is None and _under(_GRAD):
                raise RuntimeError(_PY_OPS_GRAD)  # (under jvp: the operator's forward-mode error)
            if _under(_FUNCTIONALIZE):  # (PyTorch's own error names an alias annotation)
                raise RuntimeError(_FUNCTIONALIZE_TRAINING)
        if not _F32_ZERO < float(self.eps) < _F32_INF:  # F.batch_norm's rule (> 0), and the library's (a float32)
            _bad_eps(self.eps, "positive during training")
        # a negative momentum: the library would read it as None's cumulative average; NaN
        # or infinite, the library refuses it
        if self.track_running_stats and self.momentum is not None and not 0.0 <= float(self.momentum) < _F32_INF:
            if self.momentum < 0.0:
                raise ValueError(f"syncbn.torch.SyncBatchNorm: momentum must be >= 0 (None: the cumulative average), "
                                 f"got {float(self.momentum)!r}")
            raise ValueError(f"syncbn.torch.SyncBatchNorm: momentum must be finite as a float32 (the library's), "
                             f"got {float(self.momentum)!r}")
        comm, cid, size = self._comm, None, 1
        world = _default_group() if comm is None else None
        if world is not None:
            comm = self._group_comm
            # once per group and device (later calls find it here), and again for another
            # process_group assigned since, or a default group made again (destroy_process_group,
            # init_process_group): nn.SyncBatchNorm reads the group at every call
            group = self.process_group
            if group is None:
                group = world
            # (and a group of a default group since destroyed: its team not used past it, as
            # nn.SyncBatchNorm's collectives on such a group raise)
            if (comm is None or self._group_device != input.device or not _same_group(self._group_pg, group)
                    or not _same_group(self._group_world, world)):
                comm = self._find_group_team(input.device)
            if comm is False:  # not in the group: nn.SyncBatchNorm runs batch norm on this rank's batch
                comm = None
        elif comm is None and self._group_pg is not None:
            # no process group now (destroyed): the layer lets go of the last one's team (an
            # evaluated layer, which asks for no team, at its next training call)
            self._let_go_of_group()
        elif comm is not None and comm.max_channels is not None and self.num_features > comm.max_channels:
            raise ValueError(f"syncbn.torch.SyncBatchNorm: {self.num_features} channels, and its team (comm=) takes "
                             f"at most {comm.max_channels}: make the team with max_channels >= {self.num_features} "
                             f"(syncbn.cpu_team(W, max_channels=...) or syncbn.nccl_team(..., max_channels=...))")
        if comm is None:  # no process group, or not in it: this thread's team of one, asked at every call
            if _compiling():
                # a team of a constant width: PyTorch 2.4's Dynamo makes num_features symbolic
                # once a frame is compiled again with another (a second model), and takes no
                # symbolic int in assume_constant_result ("SymNodeVariable() is not a
                # constant"); each comparison is a guard, the width the least power of two
                # times the default's that holds the layer
                width = _GROUP_TEAM_CHANNELS
                while self.num_features > width:
                    width *= 2
                cid = _own_team_id_traced(input.device, width)
            else:
                comm = _own_team(input.device, self.num_features)
        if comm is not None:
            cid, size = comm.id, comm._size
        if size == 1 and input.numel() == input.shape[1]:  # nn.BatchNorm's check, for a team of one
            # the type the library's check raises for a team (a SyncBNError and a ValueError)
            raise _sbn.SyncBNValueError(1, "syncbn.torch.SyncBatchNorm",  # sbnInvalidArgument
                                        f"Expected more than 1 value per channel when training, got input size "
                                        f"{input.size()}")
        momentum = self.momentum
        if self.track_running_stats:
            rm, rv, nbt = self.running_mean, self.running_var, self.num_batches_tracked
            if (rm is None) != (rv is None):  # nn.SyncBatchNorm's error
                raise ValueError("syncbn.torch.SyncBatchNorm: running_mean and running_var must either both be None "
                                 "or neither be None")
            if momentum is None and nbt is None:  # nn.BatchNorm's factor then: 0 (the statistics stay)
                momentum = 0.0
        else:
            rm = rv = nbt = None
            momentum = 0.0  # no running statistics to update (momentum None would ask for num_batches_tracked)
        # Plain tensors outside torch.compile and modes: the operator's kernels and autograd
        # without the dispatcher's two Python-kernel calls (~4 us a call); everything else
        # (torch.compile, export, FX, fake, functional or meta tensors, modes): the operator
        plain = _plain(input)
        if plain:
            _inference_refused(input, w, b, rm, rv, nbt, inplace, residual)
            if inplace and input.dtype in _HALF_U and input.dtype not in self.__dict__.get("_half_checked", ()):
                _warn_half_inplace(self, input.dtype, w, b)
        if not fused:
            if plain:
                return _train_eager(input, w, b, rm, rv, nbt, self.eps, momentum, cid)
            return _TRAIN(input, w, b, rm, rv, nbt, self.eps, momentum, cid)[0]
        if plain and (residual is None or _plain(residual)):
            return _train_act_eager(input, residual, w, b, rm, rv, nbt, self.eps, momentum, cid, act,
                                    slope, inplace)
        return _TRAIN_ACT(input, residual, w, b, rm, rv, nbt, self.eps, momentum, cid, act, slope,
                          inplace)[0]


# The child modules of a batch norm that applies them after itself, drop then act: timm's
# BatchNormAct2d (and its SyncBatchNormAct) layout, which SyncBatchNormAct keeps.
_ACT_CHILDREN = ("drop", "act")


class _Then:
    """A batch norm class whose forward(input) is its batch norm's, then self._then of that
    (what runs after the op: SyncBatchNormAct's drop and act, ABNSync's ELU); traced under
    torch.fx as one node, the whole layer."""

    def forward(self, input):
        if type(input) is not _Tensor:
            traced = _fx_leaf(self, input, None, norm_only=False)
            if traced is not None:
                return traced
        return self._then(super().forward(input))


class _DropAct(_Then):
    """A batch norm class's child modules ``drop`` then ``act``, applied after its forward
    (SyncBatchNormAct, BatchNormActXd)."""

    def _children(self, drop, act):
        self.drop = torch.nn.Identity() if drop is None else drop
        self.act = torch.nn.Identity() if act is None else act

    def _then(self, y):
        kids = self._modules  # a child of None (the original had none of that name): skipped
        drop, act = kids.get("drop"), kids.get("act")
        if drop is not None:
            y = drop(y)
        return y if act is None else act(y)


class SyncBatchNormAct(_DropAct, SyncBatchNorm):
    """A SyncBatchNorm followed by its child modules ``drop`` then ``act``:
    ``forward(input)`` = act(drop(batch_norm(input))). What convert_sync_batchnorm makes of
    a batch norm class with those children (timm's ``BatchNormAct2d`` and
    ``SyncBatchNormAct``, which apply them in that order): the children are the original's
    modules, so the function, the parameters (a PReLU's ``act.weight``) and the
    ``state_dict`` keys stay; ``revert_sync_batchnorm`` gives back the original class.
    ``convert_fused`` fuses an ``act`` that is ``nn.ReLU`` or ``nn.LeakyReLU(inplace=True)``
    (with ``drop`` an ``nn.Identity``) into the batch norm's epilogue, leaving a
    ``FusedActivation`` as ``act``. Any other act (SiLU, GELU, ...) runs as its module.
    A class is taken for such a layer by its children's names: one that applied them
    otherwise (before the batch norm, in eval only) would not be this function."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, device=None, dtype=None, comm=None, activation="identity", slope=0.01,
                 inplace=False, *, bias=True, drop=None, act=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, process_group, device, dtype,
                         comm, activation, slope, inplace, bias=bias)
        self._children(drop, act)


# inplace_abn's activations (ABN, InPlaceABN, InPlaceABNSync: its `activation` names);
# ELU runs after the layer, as its own op (the library's epilogues are the first three)
_ABN_ACTIVATIONS = ("identity", "relu", "leaky_relu", "elu")


class ABNSync(_Then, SyncBatchNorm):
    """inplace_abn's ``ABN`` (batch norm, then an activation) on a syncbn team, with its
    constructor, attributes and ``state_dict`` keys: ``forward(input)`` =
    act(batch_norm(input)), ``activation`` "identity", "relu", "leaky_relu" (negative slope
    ``activation_param``, fused into the op's epilogue) or "elu" (alpha
    ``activation_param``, applied after the op: ``F.elu``); ``group``: the process group
    (``process_group``). What convert_sync_batchnorm makes of an ``inplace_abn.ABN``;
    ``revert_sync_batchnorm`` gives that class back. A SyncBatchNorm otherwise (team,
    training and eval, dtypes)."""

    _abn_act = "identity"  # inplace_abn's activation name (set_activation)
    _param = 0.01  # its activation_param: the leaky ReLU's slope, or ELU's alpha
    _in_place = False  # whether set_activation's default is in place where invertible

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 activation="leaky_relu", activation_param=0.01, group=None, *, comm=None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, group, device, dtype, comm)
        self.set_activation(activation, activation_param)

    def set_activation(self, activation="leaky_relu", activation_param=0.01, inplace=None):
        """Sets inplace_abn's activation ("identity", "relu", "leaky_relu", "elu") and its
        parameter (a leaky ReLU's slope, finite and >= 0; ELU's alpha, finite; any value,
        unused, for identity and relu), and the
        in-place mode: None is the class's default (InPlaceABNSync: in place for identity
        and a leaky ReLU of slope > 0; ABNSync: never), True where the activation is
        invertible (identity, leaky_relu with slope > 0), else a ValueError naming it."""
        who = f"syncbn.torch.{type(self).__name__}"
        if not isinstance(activation, str) or activation not in _ABN_ACTIVATIONS:
            raise ValueError(f"{who}: activation {activation!r}: one of \"identity\", \"relu\", \"leaky_relu\", "
                             "\"elu\" (inplace_abn's)")
        param = activation_param  # kept as given where unused (identity, relu), as inplace_abn keeps it
        if activation in ("leaky_relu", "elu"):
            if isinstance(param, bool) or not isinstance(param, numbers.Real):
                raise TypeError(f"{who}: activation_param must be a real number for {activation}, got {param!r}")
            param = float(param)
        if inplace is not None:
            inplace = _flag(inplace, "inplace", who)
        if activation == "elu":
            if not abs(param) < _INF:
                raise ValueError(f"{who}: ELU's alpha (activation_param) must be finite, got {param!r}")
            if inplace:
                raise ValueError(f"{who}: the in-place mode takes identity or leaky_relu (slope > 0), not elu: "
                                 "its input is recovered from the output only through those")
            SyncBatchNorm.set_activation(self, "identity", 0.01, False)
        else:
            slope = param if activation == "leaky_relu" else 0.01
            if inplace is None:
                inplace = self._in_place and (activation == "identity" or (
                    activation == "leaky_relu" and _fused.takes_slope(slope)
                    and _fused.slope32(slope) >= _fused._FLT_MIN))
            SyncBatchNorm.set_activation(self, activation, slope, inplace)
        self._abn_act, self._param = activation, param
        return self

    def _set_inplace(self, value):
        self.set_activation(self._abn_act, self._param, value)

    @property
    def activation(self):
        """inplace_abn's attribute; set it (or activation_param) and the layer computes it."""
        return self._abn_act

    @activation.setter
    def activation(self, value):
        self.set_activation(value, self._param)

    @property
    def activation_param(self):
        return self._param

    @activation_param.setter
    def activation_param(self, value):
        self.set_activation(self._abn_act, value)

    @property
    def group(self):
        """inplace_abn's name of the process group (``process_group``)."""
        return self.process_group

    @group.setter
    def group(self, value):
        self.set_group(value)

    def set_group(self, group):
        """inplace_abn's ``set_group``: the process group the layer synchronizes with (its
        team is found again at the next training call; a layer given ``comm=`` runs on that
        team whatever its group, as a SyncBatchNorm's process_group)."""
        self.process_group = group
        self._forget_group()

    def _then(self, y):
        return F.elu(y, self._param) if self._abn_act == "elu" else y

    def extra_repr(self):
        s = (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
             f"activation={self._abn_act}")
        if self._abn_act in ("leaky_relu", "elu"):
            s += f"[{self._param}]"
        if self._inplace:
            s += ", inplace=True"
        return s


class InPlaceABNSync(ABNSync):
    """inplace_abn's ``InPlaceABNSync`` (and ``InPlaceABN``) on a syncbn team, with their
    constructor, attributes and ``state_dict`` keys: y = act(x_hat * (|weight| + eps) +
    bias), inplace_abn's scale (the weight's gradient is dweight's times -1 where weight <
    0, else +1, at 0 too), in place for identity and a leaky ReLU of slope > 0 (autograd
    keeps the output only: SyncBatchNorm's ``inplace=True``; the output is a new tensor,
    the input is not overwritten); "relu" and "elu" run not in place (ELU after the op).
    What convert_sync_batchnorm makes of an ``inplace_abn.InPlaceABN`` or
    ``InPlaceABNSync``; ``revert_sync_batchnorm`` gives that class back."""

    _abs_weight = True
    _in_place = True


def _flag(value, name, who):
    """value as a bool where it is one: a bool, an int 0 or 1, a NumPy bool or a 0-d bool
    tensor; else a TypeError naming it (bool() would take "no" as True and None as False)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    if getattr(value, "ndim", None) == 0 and str(getattr(value, "dtype", "")) in ("bool", "torch.bool"):
        return bool(value)
    raise TypeError(f"{who}: {name} must be True or False, got {value!r}")


def _ones_like(bias):
    """The weight of a layer whose weight was set to None while it kept its bias (F.batch_norm
    then scales by 1): ones, not a parameter (no gradient)."""
    return torch.ones(bias.shape, dtype=bias.dtype, device=bias.device)


def _abs_eps(weight, eps):
    """inplace_abn's scale |weight| + eps (InPlaceABN, InPlaceABNSync), with its gradient:
    -1 where weight < 0, else +1, at 0 too (inplace_abn's backward flips dweight's sign
    where weight < 0 only; abs' gradient is 0 at 0, which would keep a weight initialized to
    0 at 0)."""
    return torch.where(weight < 0, -weight, weight) + eps


def _inference_refused(x, weight, bias, rm, rv, nbt, inplace, residual=None):
    """PyTorch's refusals of inference tensors (made under torch.inference_mode()) outside
    inference mode, raised before the training call writes anything (the running
    statistics were updated, then autograd refused to save x): a buffer the call updates in
    place, and an input autograd would save (x; in the in-place mode, which saves its
    output instead and never writes x, the residual)."""
    if (inplace and residual is not None and residual.is_inference() and not torch.is_inference_mode_enabled()
            and torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))):
        raise RuntimeError("syncbn.torch.SyncBatchNorm: Inference tensors cannot be saved for backward: the "
                           "residual was made under torch.inference_mode() (inplace=True keeps it for the "
                           "backward); clone it, or call the layer under torch.no_grad() or inference mode")
    if not (x.is_inference() or (rm is not None and (rm.is_inference() or rv.is_inference()))
            or (nbt is not None and nbt.is_inference())) or torch.is_inference_mode_enabled():
        return
    for name, t in (("running_mean", rm), ("running_var", rv), ("num_batches_tracked", nbt)):
        if t is not None and t.is_inference():
            raise RuntimeError(f"syncbn.torch.SyncBatchNorm: Inplace update to inference tensor outside InferenceMode "
                               f"is not allowed: {name} was made under torch.inference_mode(); clone it, or train "
                               f"inside inference mode")
    if not inplace and torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (weight, bias)):
        raise RuntimeError("syncbn.torch.SyncBatchNorm: Inference tensors cannot be saved for backward: the input "
                           "was made under torch.inference_mode(); clone it, or call the layer under "
                           "torch.no_grad() or inference mode")


def _bad_eps(eps, rule):
    """Raises the ValueError of an eps that is not `rule` (F.batch_norm's words) or not finite."""
    if eps != eps or eps >= _F32_INF:
        raise ValueError(f"syncbn.torch.SyncBatchNorm: batch_norm eps must be finite as a float32 (the library's), "
                         f"but got {eps}")
    if 0.0 < eps <= _F32_ZERO:
        raise ValueError(f"syncbn.torch.SyncBatchNorm: batch_norm eps must be {rule}, but got {eps}, which is 0 as "
                         f"a float32 (the library's): at least 1.4e-45")
    raise ValueError(f"syncbn.torch.SyncBatchNorm: batch_norm eps must be {rule}, but got {eps}")


class _NotAFloatError(TypeError, NotImplementedError):
    """An integer, bool or complex input, which no batch norm takes: a TypeError, as the
    layer's other dtype refusals, and a NotImplementedError (a RuntimeError), as PyTorch's
    batch norm raises ('"batch_norm" not implemented for 'Long'')."""


def _check_dtype(x):
    if x.dtype not in _DTYPES:
        error = TypeError if x.is_floating_point() else _NotAFloatError
        raise error(f"syncbn.torch.SyncBatchNorm: {x.dtype} input; the layer takes float32, float16 and bfloat16 "
                    "(libsyncbn's dtypes)")


def _epilogue(y, residual, act, slope):
    """act(y + residual) with torch ops (eval without running statistics, of a float64
    model or under an export; BatchNormXd's)."""
    if residual is not None:
        y = y + residual
    if act == _sbn.RELU:
        return F.relu(y)
    if act == _sbn.LEAKY_RELU:
        return F.leaky_relu(y, slope)
    return y


def convert_sync_batchnorm(module, process_group=None, comm=None):
    """torch.nn.SyncBatchNorm.convert_sync_batchnorm's rule: every BatchNorm*D layer of
    module (recursively; nn.SyncBatchNorm's too) becomes a SyncBatchNorm with the same
    parameters, buffers, requires_grad and training mode, on process_group and team
    `comm`. A SyncBatchNorm of syncbn's own is moved to them in place (one layer used in
    two places stays one, and keeps its hooks and epilogue; a BatchNormXd's epilogue, what
    revert_sync_batchnorm left of a fused layer, is the new layer's). A batch norm used in two
    places becomes one SyncBatchNorm used in both (PyTorch's converter, which visits a
    module once, leaves the second place its unsynchronized batch norm). A batch norm with
    child modules `drop` and `act` that it applies after itself (timm's BatchNormAct2d)
    becomes a SyncBatchNormAct with those modules (PyTorch's converter drops them).
    inplace_abn's layers become ABNSync / InPlaceABNSync, and mmcv's SyncBatchNorm
    (MMSyncBN, no torch.nn batch norm, which PyTorch's converter passes by) a SyncBatchNorm;
    a subclass of those is left as it is, with a RuntimeWarning. A batch norm whose
    conversion would lose what it does (_conversion: child modules of its own, buffers, a
    train() of its class, ...) is refused (ValueError), before anything changes."""
    return _convert(module, process_group, comm)


def _listed(names):
    """The first three of names, joined, and how many more (a warning's list of layers)."""
    return f"{', '.join(names[:3])}{f' and {len(names) - 3} more' if len(names) > 3 else ''}"


def _convert(module, process_group, comm):
    """convert_sync_batchnorm (its warnings at the line that called it or convert_fused)."""
    _check_comm(comm, "syncbn.torch.convert_sync_batchnorm")  # before anything changes
    kinds = {}  # id -> what _conversion made of the layer (the module is alive: in module)
    inert = []  # the names of batch norms with drop / act children their forward never applies
    kept = {}  # what a package's class is called -> the layers of subclasses of it (left as they are)
    replicas = []  # the batch norms that synchronize DataParallelWithCallback's replicas
    # every module once by id (named_modules' own memo compares modules with ==, which a
    # class may define by value)
    for name, m in module.named_modules(remove_duplicate=False):
        if id(m) in kinds:
            continue
        if isinstance(m, _BatchNorm) and isinstance(m, torch.nn.modules.lazy.LazyModuleMixin):
            # (it becomes its cls_to_become at its first forward: one still lazy has not run)
            raise ValueError(f"syncbn.torch.convert_sync_batchnorm: the layer {name or 'given'!r} "
                             f"({type(m).__name__}) is lazy and not yet initialized: it learns its number of "
                             f"channels at its first forward; run one forward, then convert: nothing was converted")
        if isinstance(m, BatchNormXd) and not _fused.takes_slope(_xd_act(m)[1]):
            raise ValueError(f"syncbn.torch.convert_sync_batchnorm: the layer {name or 'given'!r} applies a leaky "
                             f"ReLU of slope {m.slope}, and syncbn's layers take a finite slope >= 0: nothing was converted")
        kinds[id(m)] = None
        if _abn_class(m) is not None:
            kinds[id(m)] = _abn_conversion(m, name)  # refused here, before anything changes
        elif what := _package_subclass(m):
            kept.setdefault(what, []).append(f"{name or 'given'!r} ({type(m).__name__})")
        elif _converts_as_bn(m) and not isinstance(m, SyncBatchNorm):
            kinds[id(m)] = _conversion(m, name)  # refused here, before anything changes
            if kinds[id(m)] == "plain" and any(m._modules.get(k) is not None for k in _ACT_CHILDREN):
                inert.append(repr(name or "given"))
            if hasattr(type(m), "__data_parallel_replicate__"):
                replicas.append(f"{name or 'given'!r} ({type(m).__name__})")
    if inert:
        warnings.warn(f"syncbn.torch.convert_sync_batchnorm: the layer(s) {_listed(inert)} hold 'drop' / 'act' "
                      "modules that their forward (torch.nn's) never applies, as PyTorch's converter leaves timm's "
                      "BatchNormAct2d (its activation dropped): converted as they run, without them; convert the "
                      "original model to keep them", RuntimeWarning, stacklevel=3)
    if replicas:
        warnings.warn(f"syncbn.torch.convert_sync_batchnorm: the layer(s) {_listed(replicas)} synchronize the "
                      "replicas of a DataParallelWithCallback in one process (their class's "
                      "__data_parallel_replicate__: Synchronized-BatchNorm-PyTorch's layers): converted, they "
                      "synchronize the ranks of their process group or comm (DistributedDataParallel's processes), "
                      "not nn.DataParallel's replicas, which then each normalize their own batch; train the "
                      "converted model under DistributedDataParallel",
                      RuntimeWarning, stacklevel=3)
    for what, names in kept.items():
        warnings.warn(f"syncbn.torch.convert_sync_batchnorm: the layer(s) {_listed(names)} are of subclasses of "
                      f"{what}, whose forward may differ from the package's: left as they are (they "
                      "run as before); convert such a layer by hand", RuntimeWarning, stacklevel=3)

    def swap(m):
        if isinstance(m, SyncBatchNorm):  # moved in place
            m.process_group = process_group
            m.comm = comm
            m._forget_group()  # the previous group's team
            return m
        if isinstance(kinds.get(id(m)), type):  # inplace_abn's layer: its syncbn class
            out = _take_state(kinds[id(m)](m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats,
                                           m.activation, m.activation_param, process_group, comm=comm), m)
            # (not its group, None in its place: the layer's is the converter's, and a
            # process group cannot be copied, which would make the layer impossible to
            # deepcopy or pickle)
            out._reverts_as = (type(m), {k: None if k == "group" else v for k, v in vars(m).items()
                                         if k not in _MODULE_KEYS})
            return out
        if _converts_as_bn(m):
            act = _xd_act(m)  # a BatchNormXd (what revert_sync_batchnorm makes) keeps its epilogue
            # drop and act: the walk moves m's children to out, as it does below any module
            kind = kinds[id(m)]
            acts = kind == "act"
            if kind == "relu":  # apex's fuse_relu: forward(input, z) = relu(bn(input) + z), as the layer's
                act = ("relu", 0.01)
            out = _take_state((SyncBatchNormAct if acts else SyncBatchNorm)(
                m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats, process_group, comm=comm,
                activation=act[0], slope=act[1], bias=not m.affine or m.bias is not None), m)
            out._reverts_to = type(m) if type(m) in _TORCH_BATCH_NORMS else None
            for k in _ACT_CHILDREN if acts else ():
                if m._modules.get(k) is None:  # none of that name: none in the layer either
                    out._modules[k] = None
            if acts and not isinstance(m, (BatchNormXd, torch.nn.SyncBatchNorm)):
                # the class it reverts to, made as it was (no constructor of it is known)
                out._reverts_as = (type(m), {k: v for k, v in vars(m).items() if k not in _MODULE_KEYS})
            return out
        return m

    return _swap_modules(module, swap, {})


# What a batch norm may hold and still be what its class's forward computes with it
_BN_STATE = frozenset(("weight", "bias", "running_mean", "running_var", "num_batches_tracked"))
# The methods of torch.nn.Module's protocol that a module's class of its own may define and
# still be replaced (a torchvision block fused, _fused_block; a batch norm converted): all
# but those that change nothing the replacement would lose (forward is compared apart)
_MODULE_KEEPS = frozenset({"__init__", "forward", "extra_repr", "_get_name", "__repr__", "__setstate__",
                           "__getstate__", "__dir__"})
_MODULE_PROTOCOL = frozenset(vars(torch.nn.Module)) - _MODULE_KEEPS
# The same for a batch norm class: nn.Module's and a batch norm's, which a SyncBatchNorm
# would not run, but the checks and resets it runs alike
_BN_PROTOCOL = _MODULE_PROTOCOL | (
    (frozenset(vars(torch.nn.modules.batchnorm._NormBase)) | frozenset(vars(_BatchNorm)))
    - _MODULE_KEEPS - {"_check_input_dim", "reset_parameters", "reset_running_stats"})


# What Python itself puts in a class's namespace (a class body's annotations: Python 3.14's
# __annotate_func__ is callable), never a method of the protocol
_CLASS_MACHINERY = frozenset({"__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__",
                              "__annotate__", "__annotate_func__", "__annotations_cache__", "__firstlineno__",
                              "__static_attributes__", "__classcell__"})


def _protocol_overrides(m, protocol):
    """The names in `protocol` (methods of torch.nn.Module's, a batch norm's) that m's class,
    or a class it derives from outside torch, defines: a fused or converted replacement
    runs its own, not those (a train() that keeps a frozen batch norm in eval, a state_dict
    loader of its own)."""
    own = []
    for cls in type(m).__mro__:
        if cls.__module__.startswith("torch."):
            break
        own += [k for k, v in vars(cls).items() if k in protocol and k not in own and k not in _CLASS_MACHINERY
                and (callable(v) or isinstance(v, (staticmethod, classmethod, property)))]
    return own


def _conversion(m, name):
    """What the converter makes of a batch norm m that is not syncbn's SyncBatchNorm: "act"
    (a SyncBatchNormAct: a class with its own forward whose child modules are drop and act,
    which it applies after itself: timm's BatchNormAct2d), "relu" (a SyncBatchNorm with a
    ReLU epilogue: apex's SyncBatchNorm with fuse_relu, whose forward(input, z) the layer's
    forward(input, residual) is) or "plain" (a SyncBatchNorm); a
    ValueError naming the layer (`name`) where the conversion would lose what the layer
    does: parameters or buffers beyond a batch norm's (a quantized batch norm's scale and
    zero_point), a forward set on the instance, methods of the module protocol its class
    defines (a train() that keeps a frozen batch norm in eval, a state_dict loader of its
    own), child modules other than drop and act that its own forward may apply, apex's
    channel_last, apex's groupbn (input (N, H, W, C)) and PyTorch-Encoding's activation in
    training only. A class with torch.nn's forward applies none of its children (PyTorch's
    converter leaves a timm BatchNormAct2d's drop and act so in the nn.SyncBatchNorm it
    makes): plain, the children unused as before."""
    pkg = "mmcv's " if _is_mmcv_sbn(type(m)) else ""
    who = f"syncbn.torch.convert_sync_batchnorm: the layer {name or 'given'!r} ({pkg}{type(m).__name__})"
    if isinstance(m, BatchNormXd):  # syncbn's own: its epilogue, and drop and act if it applies them
        return "act" if isinstance(m, BatchNormActXd) else "plain"
    if torch.nn.utils.parametrize.is_parametrized(m):
        raise ValueError(f"{who} has parametrized tensors (torch.nn.utils.parametrize), which a SyncBatchNorm would "
                         "not compute: nothing was converted; remove the parametrizations first")
    state = sorted(k for k in (*m._parameters, *m._buffers) if k not in _BN_STATE)
    if state:
        raise ValueError(f"{who} holds {', '.join(map(repr, state))} beside a batch norm's parameters and buffers, "
                         "which a SyncBatchNorm would not keep nor use: nothing was converted; convert such a layer "
                         "by hand")
    if "forward" in vars(m):
        raise ValueError(f"{who} has a forward set on the layer itself, which a SyncBatchNorm would not run: nothing "
                         "was converted")
    own = _protocol_overrides(m, _BN_PROTOCOL)
    if own:
        raise ValueError(f"{who} is of a class that defines {', '.join(map(repr, own))} of torch.nn.Module's own "
                         "methods, which a SyncBatchNorm would not (a train() that keeps the layer frozen in eval, "
                         "...): nothing was converted; convert such a layer by hand")
    kids = [k for k, c in m._modules.items() if c is not None]
    if _torch_forward(m) or _is_mmcv_sbn(type(m)):  # (mmcv's forward applies no child module either)
        return "plain"
    where = type(m).__module__.split(".")[0]
    if where == "apex" and (type(m).__module__.startswith("apex.contrib.groupbn") or
                            type(m).__name__ == "BatchNorm2d_NHWC"):
        # apex's groupbn: forward(x, z=None) on x of shape (N, H, W, C)
        raise ValueError(f"{who} takes its input as (N, H, W, C) (apex's groupbn), where a SyncBatchNorm takes its "
                         "channels in dim 1 (a channels_last tensor is (N, C, H, W) in shape): nothing was "
                         "converted; convert such a layer by hand, with its input permuted")
    if where == "apex" and not kids:
        # apex.parallel.SyncBatchNorm: forward(input, z=None), relu(bn(input) + z) with
        # fuse_relu (the residual and ReLU of syncbn's epilogue); channel_last: input (N, ..., C)
        if getattr(m, "channel_last", False):
            raise ValueError(f"{who} takes its channels last (channel_last=True: input (N, ..., C)), where a "
                             "SyncBatchNorm takes them in dim 1 (channels_last memory format is the same shape): "
                             "nothing was converted")
        return "relu" if getattr(m, "fuse_relu", False) else "plain"
    if where == "encoding" and not kids and getattr(m, "activation", "none") not in ("none", "identity", None):
        # PyTorch-Encoding's SyncBatchNorm: a leaky ReLU in training only
        raise ValueError(f"{who} applies {m.activation!r} in training only, which a SyncBatchNorm cannot: nothing "
                         "was converted")
    try:
        args = [p for p in list(inspect.signature(type(m).forward).parameters.values())[1:]
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):  # no signature to read
        args = [None, None]
    if len(args) > 1:  # a SyncBatchNorm's second argument is a residual, added before the epilogue
        raise ValueError(f"{who} has a forward of its own that takes more than the input "
                         f"({', '.join(p.name if p is not None else '?' for p in args)}), which a SyncBatchNorm would "
                         "take as a residual to add: nothing was converted; convert such a layer by hand")
    odd = [f"{k!r} ({vars(m)[k]!r})" for k in _ACT_CHILDREN if vars(m).get(k) is not None]
    if odd:
        raise ValueError(f"{who} has {', '.join(odd)} that is not a module, which its forward may use and a "
                         "SyncBatchNormAct would not: nothing was converted; convert such a layer by hand")
    extra = [k for k in kids if k not in _ACT_CHILDREN]
    if extra:
        raise ValueError(f"{who} is a batch norm with child modules of its own ({', '.join(map(repr, extra))}), "
                         "which its forward may apply and a SyncBatchNorm would not: nothing was converted. A batch "
                         "norm whose children are 'drop' and 'act', applied after it in that order (timm's "
                         "BatchNormAct2d), becomes a SyncBatchNormAct; convert any other such layer by hand")
    return "act" if kids else "plain"


# inplace_abn's layers (its package's classes themselves) and the syncbn class each becomes
_ABN_CLASSES = {"ABN": "ABNSync", "InPlaceABN": "InPlaceABNSync", "InPlaceABNSync": "InPlaceABNSync"}


def _is_abn(cls):
    """Whether cls is one of inplace_abn's layer classes (of the package inplace_abn)."""
    return cls.__module__.split(".")[0] == "inplace_abn" and cls.__name__ in _ABN_CLASSES


def _abn_class(m):
    """The syncbn class that m becomes where m is one of inplace_abn's layers (ABN,
    InPlaceABN, InPlaceABNSync, not a subclass), else None."""
    return globals()[_ABN_CLASSES[type(m).__name__]] if _is_abn(type(m)) else None


def _is_mmcv_sbn(cls):
    """Whether cls is mmcv's synchronized batch norm (mmcv.ops.SyncBatchNorm, registered as
    MMSyncBN) itself: an nn.Module with a batch norm's constructor, attributes and state,
    no torch.nn batch norm (found by its module and name, where it has been since mmcv 1.x:
    mmcv is not imported; were mmcv to move it, its layers would be left as they are)."""
    return cls.__module__ == "mmcv.ops.sync_bn" and cls.__name__ == "SyncBatchNorm"


def _converts_as_bn(m):
    """Whether the converters take m as a batch norm (_conversion's rules): a torch.nn
    batch norm (a _BatchNorm, syncbn's own included), or mmcv's SyncBatchNorm."""
    return isinstance(m, _BatchNorm) or _is_mmcv_sbn(type(m))


def _package_subclass(m):
    """What m's class is a subclass of, as a warning names it ("inplace_abn's layers",
    "mmcv's SyncBatchNorm"), where it is a subclass (defined elsewhere) of a package's
    layer that the converters take by the class itself and leave a subclass of as it is;
    else None."""
    for test, what in ((_is_abn, "inplace_abn's layers"), (_is_mmcv_sbn, "mmcv's SyncBatchNorm")):
        if not test(type(m)) and any(test(c) for c in type(m).__mro__[1:]):
            return what
    return None


def _abn_conversion(m, name):
    """The syncbn class (ABNSync, InPlaceABNSync) that inplace_abn's layer m becomes; a
    ValueError naming the layer where it would lose what m does (state beyond a batch
    norm's, child modules, a forward set on the instance, an activation or parameter that
    its syncbn class does not take)."""
    who = f"syncbn.torch.convert_sync_batchnorm: the layer {name or 'given'!r} (inplace_abn's {type(m).__name__})"
    state = sorted(k for k in (*m._parameters, *m._buffers) if k not in _BN_STATE)
    kids = [k for k, c in m._modules.items() if c is not None]
    if state or kids or "forward" in vars(m) or torch.nn.utils.parametrize.is_parametrized(m):
        what = (f"holds {', '.join(map(repr, state + kids))} beside a batch norm's parameters and buffers"
                if state or kids else "has a forward set on the layer itself, or parametrized tensors")
        raise ValueError(f"{who} {what}, which its syncbn class would not keep nor run: nothing was converted; "
                         "convert such a layer by hand")
    cls = _abn_class(m)
    try:
        cls(1, activation=m.activation, activation_param=m.activation_param)  # its checks, on a layer of one channel
    except (TypeError, ValueError) as e:
        raise ValueError(f"{who}: {e}: nothing was converted") from None
    return cls


def _inplace_abn():
    """The inplace_abn package, or None where it cannot be imported."""
    try:
        import inplace_abn
    except ImportError:
        return None
    return inplace_abn


def _abn_reverted(m):
    """What revert_sync_batchnorm makes of an ABNSync / InPlaceABNSync m: the inplace_abn
    class it was converted from, made as that layer was (_made_as), with m's activation and,
    for an InPlaceABNSync, m's process group as its group; one made as syncbn's: an ABNSync
    a BatchNormXd (its epilogue) or, for ELU, a BatchNormActXd with an nn.ELU; an
    InPlaceABNSync inplace_abn's InPlaceABN (revert_sync_batchnorm has refused it where
    inplace_abn cannot be imported). m's tensors, training mode and hooks."""
    was = getattr(m, "_reverts_as", None)
    if was is not None:
        out = _made_as(was, m, ("activation", "activation_param"))
        if "group" in vars(out):  # an InPlaceABNSync's: the layer's process group
            out.group = m.process_group
        return _take_state(out, m)
    if isinstance(m, InPlaceABNSync):
        return _take_state(_inplace_abn().InPlaceABN(m.num_features, m.eps, m.momentum, m.affine,
                                                     m.track_running_stats, m.activation, m.activation_param), m)
    no_bias = m.affine and m.bias is None
    if m.activation == "elu":
        return _take_state(BatchNormActXd(m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats,
                                          bias=not no_bias, act=torch.nn.ELU(m.activation_param)), m)
    return _take_state(BatchNormXd(m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats,
                                   activation=m.activation, slope=m.slope, bias=not no_bias), m)


def _xd_act(m):
    """(activation, slope) of the SyncBatchNorm a batch norm m becomes: a BatchNormXd's own
    epilogue (the slope only where it is a leaky ReLU's), else none."""
    if isinstance(m, BatchNormXd) and m.activation != "identity":
        return m.activation, (m.slope if m.activation == "leaky_relu" else 0.01)
    return "identity", 0.01


def _swap_modules(module, swap, done):
    """module with swap(m) in place of each module m below it and itself, in every place it
    holds (named_children gives a module used twice in one container once), one module
    swapped once (done: id -> (the module, what it became); the module kept alive, so that
    no module made during the walk takes a visited one's id)."""
    if id(module) in done:
        return done[id(module)][1]
    out = swap(module)
    done[id(module)] = (module, out)
    for name, child in [(n, c) for n, c in module._modules.items() if c is not None]:
        out.add_module(name, _swap_modules(child, swap, done))
    return out


def _take_hooks(out, m):
    """out with m's hooks: the dicts themselves (a handle that registered a hook on m
    removes it from out), and whether its backward hooks are full ones. A hook PyTorch
    keeps with a weak reference to its module (register_load_state_dict_pre_hook's
    _WrappedHook) is pointed at out: it got m, and once m was collected, load_state_dict
    raised "You are trying to call the hook of a dead Module!"."""
    for name, value in vars(m).items():
        if "hooks" in name and isinstance(value, dict):
            out.__dict__[name] = value
            for hook in value.values():
                ref = getattr(hook, "module", None)
                if getattr(hook, "with_module", False) and isinstance(ref, weakref.ref) and ref() is m:
                    hook.module = weakref.ref(out)
        elif name == "_is_full_backward_hook":
            out.__dict__[name] = value


def _take_state(out, m):
    """out with m's parameters (the same tensors), buffers, training mode, qconfig and hooks
    (_take_hooks; PyTorch's converter drops them, and a feature or distillation hook then
    stopped seeing the layer without a word)."""
    _take_hooks(out, m)
    if m.affine:
        with torch.no_grad():
            out.weight = m.weight
            out.bias = m.bias
    out.running_mean = m.running_mean
    out.running_var = m.running_var
    out.num_batches_tracked = m.num_batches_tracked
    out.training = m.training
    if hasattr(m, "qconfig"):
        out.qconfig = m.qconfig
    return out


# The classes revert_sync_batchnorm gives back a layer converted from (their constructors
# are known); any other batch norm (nn.SyncBatchNorm, a subclass, a layer made as syncbn's)
# reverts to a BatchNormXd.
_TORCH_BATCH_NORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)


# What a module's own state is beyond nn.Module's (its hooks included) and a batch norm's
# constructor arguments: what a layer converted from another class keeps to revert to it
_MODULE_KEYS = frozenset(vars(torch.nn.Module())) | {"_is_full_backward_hook", "qconfig", "num_features", "eps",
                                                    "momentum", "affine", "track_running_stats"}


def _made_as(was, m, names=()):
    """The layer that m was converted from, made as it was: was = m._reverts_as (its class
    and attributes; the constructor is not called), with m's batch norm constructor values
    and `names`, its parameters and buffers left for _take_state to take from m."""
    cls, attrs = was
    out = cls.__new__(cls)
    torch.nn.Module.__init__(out)
    out.__dict__.update(attrs)
    for name in ("num_features", "eps", "momentum", "affine", "track_running_stats", *names):
        setattr(out, name, getattr(m, name))
    for name in ("weight", "bias"):
        out.register_parameter(name, None)  # taken from m (_take_state)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        out.register_buffer(name, None)
    return out


def _reverted(m, act, slope):
    """The PyTorch batch norm that layer m reverts to: the torch.nn class it was converted
    from (nn.BatchNorm2d, ...), where it applies no activation and that class can be made
    without a bias where m has none; else a BatchNormXd with m's epilogue. A SyncBatchNormAct
    (its drop and act children go with it): the class it was converted from where it
    applies no activation of its own, made as that layer was (its attributes; the
    constructor is not called), else a BatchNormActXd. m's tensors, training mode and
    qconfig."""
    no_bias = m.affine and m.bias is None
    if isinstance(m, SyncBatchNormAct):
        was = getattr(m, "_reverts_as", None)
        if act != "identity" or was is None:
            return _take_state(BatchNormActXd(m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats,
                                              activation=act, slope=slope, bias=not no_bias), m)
        return _take_state(_made_as(was, m), m)
    cls = getattr(m, "_reverts_to", None)  # (None also for a layer pickled before it was kept)
    if act == "identity" and cls is not None and (_BIAS_KW or not no_bias):
        return _take_state(cls(m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats,
                               **({"bias": False} if no_bias else {})), m)
    return _take_state(BatchNormXd(m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats,
                                   activation=act, slope=slope, bias=not no_bias), m)


SyncBatchNorm.convert_sync_batchnorm = classmethod(
    lambda cls, module, process_group=None, comm=None: convert_sync_batchnorm(module, process_group, comm))


class BatchNormXd(_OptionalBias, _BatchNorm):
    """PyTorch's batch norm of an input of any rank >= 2 (``F.batch_norm``, this rank's own
    statistics in training), with a fused layer's epilogue in PyTorch's ops:
    ``forward(input, residual=None)`` = act(batch_norm(input) + residual), ``activation``
    "identity", "relu" or "leaky_relu" (negative slope ``slope``), and ``forward(...,
    activate=False)`` = batch_norm(input) + residual, as syncbn's layer. What
    ``revert_sync_batchnorm`` makes of a syncbn layer."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                 dtype=None, activation="identity", slope=0.01, *, bias=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype,
                         **self._bias_kw(bias))
        self._drop_bias(bias)
        if activation not in _fused.ACTIVATIONS:
            raise ValueError(f"syncbn.torch.BatchNormXd: activation {activation!r}: one of \"identity\", \"relu\", "
                             "\"leaky_relu\"")
        self.activation = activation
        self.slope = float(slope)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input, residual=None, *, activate=True):
        traced = _fx_leaf(self, input, residual, None if activate is True else {"activate": activate},
                          residual is None and self.activation == "identity")
        if traced is not None:
            return traced
        act = _fused.ACTIVATIONS[self.activation] if activate else _sbn.IDENTITY
        return _epilogue(super().forward(input), residual, act, self.slope)

    def extra_repr(self):
        s = super().extra_repr()
        if self.activation != "identity":
            s += f", activation={self.activation!r}"
            if self.activation == "leaky_relu":
                s += f", slope={self.slope}"
        return s


class BatchNormActXd(_DropAct, BatchNormXd):
    """A BatchNormXd followed by its child modules ``drop`` then ``act``:
    ``forward(input)`` = act(drop(epilogue(batch_norm(input)))), in PyTorch's ops. What
    ``revert_sync_batchnorm`` makes of a SyncBatchNormAct that it cannot give back its
    original class (one made as syncbn's, converted from a BatchNormActXd or an
    ``nn.SyncBatchNorm`` subclass, or one that applies an activation of its own)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                 dtype=None, activation="identity", slope=0.01, *, bias=True, drop=None, act=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype, activation, slope,
                         bias=bias)
        self._children(drop, act)


def revert_sync_batchnorm(module):
    """The inverse of convert_sync_batchnorm and convert_fused: every syncbn SyncBatchNorm
    of module (recursively) becomes PyTorch's batch norm with the same parameters (shared),
    buffers and training mode: the torch.nn class the converter took it from
    (``nn.BatchNorm1d``, ``nn.BatchNorm2d``, ``nn.BatchNorm3d``), so that code looking for
    those classes (``torch.ao.quantization.fuse_modules``, ``prepare_fx``, freezing by type,
    TorchScript) finds them again, else a ``BatchNormXd`` (a layer made as syncbn's or
    converted from nn.SyncBatchNorm or another class, one that keeps an activation, or one
    without a bias on a PyTorch whose batch norms take no ``bias=``); a SyncBatchNormAct
    becomes the class it was converted from (timm's BatchNormAct2d), made as that layer
    was, or else a ``BatchNormActXd``; and what convert_fused fused is undone:
    a ``FusedBasicBlock`` / ``FusedBottleneck`` becomes the torchvision block it was and a
    ``FusedConvModule`` the mmcv ConvModule it was (their class, children, attributes and
    hooks), and a ``FusedActivation`` the activation module it replaced, their batch norms
    plain, so that the model is the original one on PyTorch's batch norm (code that folds a
    batch norm into the convolution before it, ``torch.nn.utils.fuse_conv_bn_eval``, then
    folds the batch norm alone, as in the original). A ReLU that
    ``convert_fused(relu_as_leaky=SLOPE)`` made a leaky ReLU comes back as
    ``nn.LeakyReLU(SLOPE)``, a block's ``relu`` module too: the function trained, not the
    original's (a fused block whose batch norms apply different activations cannot share its
    one ``relu`` module: a ValueError, before anything changes). So does a plain
    ``nn.Identity`` right after a layer with an activation in a
    Sequential (a model fused before FusedActivation existed): the activation goes there
    as a module, ``nn.ReLU()`` or ``nn.LeakyReLU(slope)``. Any other layer given an
    activation (``SyncBatchNorm(activation=...)``, ``set_activation``), and a layer whose
    identity has hooks, keeps it as a BatchNormXd epilogue, in PyTorch's ops. For a model
    without syncbn's operators: a training-mode export (an evaluated model exports as it
    is: its layers record PyTorch's batch norm under an export; TorchScript scripting takes
    neither a syncbn layer nor a BatchNormXd, whose forward calls super().forward, and takes
    a reverted model whose batch norms are all torch.nn's), folding batch norms
    into convolutions, inference without a team, or a framework's own conversions, which
    would drop the activation of a layer made with one (it is an nn.SyncBatchNorm; what
    convert_fused fused applies it after whatever took its place, and goes back to the
    original's modules here too). Training after it is unsynchronized. Like the
    converters, it changes module's containers in place. A layer used in two places
    becomes one batch norm used in both."""
    for name, m in module.named_modules():  # refused before anything changes
        if isinstance(m, _FusedBlock) and isinstance(getattr(m, "block_type", None), type):
            _block_relu(m)
        if isinstance(m, InPlaceABNSync) and getattr(m, "_reverts_as", None) is None:
            who = f"syncbn.torch.revert_sync_batchnorm: the layer {name or 'given'!r} (InPlaceABNSync)"
            if _inplace_abn() is None:
                raise ValueError(f"{who} scales by |weight| + eps, which no PyTorch batch norm does, and inplace_abn "
                                 "(whose InPlaceABN it would become) cannot be imported: nothing was reverted")
            if m.activation == "relu":
                raise ValueError(f"{who} applies a ReLU, which inplace_abn's InPlaceABN (what it would become) "
                                 "refuses at its forward: nothing was reverted")
    plain = set()  # ids of the layers whose activation is its own module again
    module = _unfuse(module, plain, {})

    def swap(m):
        if isinstance(m, ABNSync):
            return _abn_reverted(m)
        if not isinstance(m, SyncBatchNorm):
            return m
        act, slope = ("identity", 0.01) if id(m) in plain else (m.activation, m.slope)
        return _reverted(m, act, slope)

    return _swap_modules(module, swap, {})


def _block_relu(block):
    """The relu module of the torchvision block a fused block reverts to: its own, or for
    batch norms that all apply one leaky ReLU (convert_fused(relu_as_leaky=SLOPE), or
    set_activation after it) an nn.LeakyReLU of that slope, the function trained. Batch
    norms that apply different activations cannot share the block's one module: a
    ValueError."""
    relu = block._modules.get("relu")
    if block._sites is not None:  # what applies each activation: the layer there (or a copy), else the one fused
        bns = [site.layer if (mod := _locate(site, asker=block)[1]) is None else mod for site in block._sites.values()]
    else:
        bns = [b for _, name in block._convs if isinstance(b := block._modules.get(name), SyncBatchNorm)]
    acts = {(b.activation, b.slope if b.activation == "leaky_relu" else None) for b in bns}
    if not acts or acts == {("relu", None)}:
        return relu
    if len(acts) == 1 and type(relu) in (torch.nn.ReLU, torch.nn.LeakyReLU):
        (act, slope), = acts
        if act == "leaky_relu":
            if type(relu) is torch.nn.LeakyReLU and relu.negative_slope == slope:
                return relu
            return torch.nn.LeakyReLU(slope, inplace=relu.inplace).train(relu.training)
    raise ValueError(f"syncbn.torch.revert_sync_batchnorm: the batch norms of a {type(block).__name__} apply "
                     f"{', '.join(a if s is None else f'{a}({s})' for a, s in sorted(acts, key=str))}, but the "
                     f"{getattr(block.block_type, '__name__', 'block')} it reverts to applies its one relu module "
                     f"({relu!r}) after each: give them one activation, ReLU or one leaky ReLU (set_activation), "
                     "before reverting")


def _unfuse(m, plain, done):
    """m (and below it, in place) with convert_fused's blocks and ConvModules back to what
    they were and its FusedActivations back to the modules they replaced; the ids of the
    batch norms whose activation is then their own module again go into plain. done: id ->
    (the module, what it became), the module kept alive: the walk goes on into modules it
    makes (a block's new LeakyReLU), which must not take the id of a fused block it
    replaced."""
    if id(m) in done:
        return done[id(m)][1]
    out = m
    if isinstance(m, (_FusedBlock, FusedConvModule)) and isinstance(getattr(m, "block_type", None), type):
        out = m.block_type.__new__(m.block_type)
        torch.nn.Module.__init__(out)
        _take_block(out, m, hooks=True)  # hooks registered on the fused module: the original's
    if out is not m and isinstance(m, _FusedBlock):
        if "relu" in out._modules:
            out._modules["relu"] = _block_relu(m)  # the block's ReLU, or the leaky ReLU its layers apply
        for _, bn in m._convs:
            site = None if m._sites is None else m._sites.get(bn)
            mod = m._modules.get(bn) if site is None else _locate(site, asker=m)[1]  # (the layer, a copy, wrapped)
            if isinstance(mod, SyncBatchNorm):  # the block's relu module applies its activation
                plain.add(id(mod))
    done[id(m)] = (m, out)
    for name, child in list(out._modules.items()):
        if child is not None:
            out._modules[name] = _unfuse(child, plain, done)
    for name, slot in list(out._modules.items()):
        site = slot._site if isinstance(slot, FusedActivation) else None
        kind, mod = (None, None) if site is None else _locate(site, slot)
        if site is not None and _no_hooks(slot) and kind in (None, "inside"):
            # another module in its batch norm's place (a framework's conversion), or a
            # wrapper of it there: the activation it applies, as a module (the layer in
            # the wrapper reverted without it)
            layer = site.layer if mod is None else mod
            out._modules[name] = _act_module(slot, layer.activation, layer.slope).train(slot.training)
            if mod is not None:
                plain.add(id(mod))
    if out is not m and isinstance(m, FusedConvModule):  # its activate: what runs right after its norm
        norm, slot = out._modules.get(m.norm_name), out._modules.get("activate")
        _, act, slope, _ = m._norm_applies()
        mod = None if m._site is None else _locate(m._site, asker=m)[1]
        if isinstance(norm, SyncBatchNorm) and (mod is norm or m._site is None):  # the layer, or a copy, there
            _restore_act(norm, out, "activate", plain)
        elif isinstance(slot, FusedActivation) and _no_hooks(slot):
            # another norm in its place (mmengine's revert_sync_batchnorm, mmcv's
            # fuse_conv_bn), or a wrapper of its batch norm: the activation the fused
            # module applies after it, as a module (the layer in the wrapper reverted
            # without it)
            out._modules["activate"] = _act_module(slot, _fused._ACT_NAMES[act], slope).train(slot.training)
            if mod is not None:
                plain.add(id(mod))
    if isinstance(out, SyncBatchNormAct):
        drop = out._modules.get("drop")
        if drop is None or (type(drop) is torch.nn.Identity and _no_hooks(drop)):
            _restore_act(out, out, "act", plain)  # its act: what runs right after its epilogue
    order = _run_order(out)
    if order is not None:
        kids = order[0]
        for (_, bn), (name, slot) in zip(kids, kids[1:]):
            _restore_act(bn, out, name, plain)
    for slot in out._modules.values():
        if isinstance(slot, FusedActivation) and slot._site is not None and _runs_there(slot._site, slot):
            # one that stays (hooks on it, or its layer's activation changed since): the
            # identity, its layer reverted with the activation (a BatchNormXd epilogue)
            slot.__dict__["_site"] = None
    return out


def _restore_act(bn, parent, name, plain):
    """Puts the activation of layer bn back as a module in parent's child `name`, where
    that child runs right after bn: an identity without hooks, the FusedActivation that
    convert_fused left (the module it replaced) or a plain nn.Identity (the layer's
    activation as a new module: the same function); bn's id goes into plain. Nothing where
    bn applies no activation (or already gave it back), where the child is another module,
    or where bn's activation changed since it was fused; never for an ABNSync (inplace_abn's
    layers apply their activation themselves). A SyncBatchNormAct's activation runs
    before its drop and act: it goes back into its own act only (parent is bn)."""
    slot = parent._modules.get(name)
    if (not isinstance(bn, SyncBatchNorm) or isinstance(bn, ABNSync) or bn.activation == "identity"
            or id(bn) in plain
            or (isinstance(bn, SyncBatchNormAct) and parent is not bn)
            or not isinstance(slot, torch.nn.Identity) or not _no_hooks(slot)):
        return
    if isinstance(slot, FusedActivation):
        act = _replaced_back(slot, bn.activation, bn.slope)
        if act is None:
            return  # the layer's activation changed since: it keeps it
    elif type(slot) is torch.nn.Identity:
        # an identity right after a layer with an activation (a model fused before
        # FusedActivation existed, or by hand): the activation as a module there is the
        # same function
        act = torch.nn.ReLU() if bn.activation == "relu" else torch.nn.LeakyReLU(bn.slope)
    else:
        return
    parent._modules[name] = act.train(slot.training)
    plain.add(id(bn))


def _act_module(slot, activation, slope):
    """The module that applies `activation` (a name) of slope `slope` for FusedActivation
    slot: the module slot replaced (or the leaky ReLU relu_as_leaky made of it,
    _replaced_back), else a new nn.ReLU, nn.LeakyReLU(slope) or nn.Identity
    (set_activation changed it since)."""
    back = _replaced_back(slot, activation, slope)
    if back is not None:
        return back
    if activation == "relu":
        return torch.nn.ReLU()
    return torch.nn.LeakyReLU(slope) if activation == "leaky_relu" else torch.nn.Identity()


def _replaced_back(slot, activation, slope):
    """What FusedActivation slot goes back to for a layer that applies `activation` (a name)
    of slope `slope`: the module it replaced where that is the function, a new
    nn.LeakyReLU(slope) (in place as the module was) where it replaced a ReLU that became
    that leaky ReLU (convert_fused(relu_as_leaky=SLOPE)); None where the layer's activation
    changed since."""
    act = slot.replaced
    was = _act_of(act)
    if was is not None and was[0] == "relu" and activation == "leaky_relu":
        return torch.nn.LeakyReLU(slope, inplace=act.inplace)
    if was is None or was[0] != activation or (was[0] == "leaky_relu" and was[1] != slope):
        return None
    return act


# ---- the converter of fusable patterns ---------------------------------------------------
# torchvision's ResNet blocks, recognized by their children and by their forward's code
# being exactly these (compiled by the same interpreter: the same bytecode, names and
# constants); anything else, even with the same children, is left alone.
def _basic_block_forward(self, x):
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


def _bottleneck_forward(self, x):
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


# torchvision's ResNet (its stem: conv1, bn1, relu, maxpool, then the layers) and
# IntermediateLayerGetter (a ModuleDict whose forward runs its children in order and gives
# out those named in return_layers: the backbones of torchvision's segmentation and
# detection models), recognized the same way: their children run one after another, so a
# batch norm and the ReLU after it there are a pair as in a Sequential.
def _resnet_forward(self, x):
    return self._forward_impl(x)


def _resnet_forward_impl(self, x):
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


def _layer_getter_forward(self, x):
    out = OrderedDict()
    for name, module in self.items():
        x = module(x)
        if name in self.return_layers:
            out_name = self.return_layers[name]
            out[out_name] = x
    return out


_RESNET_ORDER = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4", "avgpool")


def _same_code(f, g):
    a, b = getattr(f, "__code__", None), g.__code__
    return a is not None and all(getattr(a, k) == getattr(b, k) for k in (
        "co_code", "co_names", "co_varnames", "co_consts", "co_argcount", "co_kwonlyargcount", "co_freevars"))


def _global_output_hooks():
    """Whether a global module hook that sees a module's output or its gradient is
    registered (forward, backward, backward pre-hooks)."""
    mod = torch.nn.modules.module
    return bool(getattr(mod, "_global_forward_hooks", None) or getattr(mod, "_global_backward_hooks", None)
                or getattr(mod, "_global_backward_pre_hooks", None))


def _global_hooks():
    """Whether a global module hook is registered (it sees every module's input or output)."""
    return _global_output_hooks() or bool(getattr(torch.nn.modules.module, "_global_forward_pre_hooks", None))


def _output_hooks(m):
    """Whether module m has a hook of its own that sees its output or its gradient."""
    return bool(m._forward_hooks or m._backward_hooks or getattr(m, "_backward_pre_hooks", None))


def _no_hooks(m):
    return not (m._forward_pre_hooks or _output_hooks(m))


# A layer that convert_fused gave the activation of the module after it (a Sequential's
# pair, a block's batch norm, a ConvModule's norm) runs as the pair ran while a hook sees
# its output or its output's gradient: its forward and backward hooks, its own or global
# ones, registered after the conversion (a distillation's hook on the features before the
# ReLU, a pruning mask written into the output). It then computes the batch norm alone,
# and what runs after it (the FusedActivation, the block, the ConvModule) the activation,
# in PyTorch's ops (_unfused_now). Forward pre-hooks see its input only.
_PAIRED = "_paired"  # the layer's __dict__ key for its _Pair, set by convert_fused


class _Pair:
    """convert_fused's mark on a layer that it gave the activation of the module after it
    (_fuse_into, _fused_block). alone: whether the layer's last call ran its batch norm
    alone, which the FusedActivation after it reads, rather than asking the hooks again (a
    hook that removes itself, a traced graph's recorded choice). Copied with the layer
    (deepcopy, pickle), shared by its replicas (nn.DataParallel's shallow copies)."""

    def __init__(self):
        self.alone = False


def _unfused_now(layer):
    """Whether layer, fused by convert_fused with the module after it, runs its batch norm
    alone (a hook sees its output)."""
    return layer.__dict__.get(_PAIRED) is not None and (_output_hooks(layer) or _global_output_hooks())


class _Site:
    """Where convert_fused gave a batch norm an activation: the layer, owner's child `name`
    then. The layer is held (its activation is what to apply once another module has taken
    its place, and its parameters may be shared with that module); the owner weakly (a
    FusedActivation's owner is its parent, a block's or ConvModule's the module itself: a
    strong reference would be a cycle, and a model dropped would keep its memory until the
    garbage collector ran). A copy or pickle of a model takes the copy's own owner (the
    modules themselves go through deepcopy's memo and pickle's)."""

    def __init__(self, owner, name, layer):
        # _ASKER: the module that asks (a block, a ConvModule: its own child), no reference
        self._owner = owner if owner is None or owner is _ASKER else weakref.ref(owner)
        self.name = name
        self.layer = layer

    def owner(self, asker=None):
        ref = self._owner
        if ref is _ASKER:
            return asker
        return None if ref is None else ref()

    def __reduce__(self):  # pickle: the owner too (a part of a model pickled pickles it)
        return _Site, (self._owner if self._owner is _ASKER else self.owner(), self.name, self.layer)

    def __deepcopy__(self, memo):
        # the copy's owner where the owner is copied too (a copy of the model: in memo);
        # none where only a part of it is (a slice: the part's fused modules then trust
        # their layers, as where the owner is gone)
        owner = self._owner if self._owner is _ASKER else self.owner()
        if owner is not None and owner is not _ASKER:
            owner = memo.get(id(owner))
        return _Site(owner, self.name, copy.deepcopy(self.layer, memo))


class _Asker:
    """_Site's owner where it is the module that asks (pickled by name: one object)."""

    def __reduce__(self):
        return "_ASKER"


_ASKER = _Asker()
# A PyTorch whose torch.compile (dynamo) cannot call a weak reference (before 2.5; its
# non-strict torch.export also hands a module's forward proxies of its children): fused
# modules compiled or exported by it trust their layers, as before they kept them (eager
# follows them there too)
try:
    import torch._dynamo.variables as _dynamo_variables
    _OLD_DYNAMO = not hasattr(_dynamo_variables, "WeakRefVariable")
except Exception:  # noqa: BLE001 (a PyTorch without it: the old rule)
    _OLD_DYNAMO = True


def _applies_act(m, layer):
    """Whether m is a layer of syncbn's that applies the activation fused layer `layer`
    applies, itself (a copy of that layer put in its place)."""
    return (type(m) is SyncBatchNorm and m._act != _sbn.IDENTITY and m._act == layer._act
            and m.slope == layer.slope)


def _locate(site, slot=None, asker=None):
    """Where the batch norm that convert_fused gave an activation is now, against where it
    was fused (site, a _Site): (kind, module). kind "child": the owner's child at that
    place is the layer, or a layer of syncbn's that applies the same activation itself (a
    copy of it put there); "inside": such a layer inside what is there (a wrapper that calls it,
    torch's checkpoint_wrapper, FSDP's: chains of modules of one child); "unknown": the
    owner is gone (the module asking runs in another container now, the layer before it as
    before); None: another module took its place (a framework's conversion: mmengine's
    revert_sync_batchnorm, nn.SyncBatchNorm.convert_sync_batchnorm, timm's
    freeze_batch_norm_2d, mmcv's fuse_conv_bn), and the fused module applies the activation
    itself. module: that layer of syncbn's, or None. The place is owner's child site.name,
    or for a FusedActivation (slot) the child right before it (its container's indices
    may have moved: a Sequential's insert, del). The owner, not the module asking, is
    looked at: an nn.DataParallel replica (a copy of the module's attributes, its children
    replicas) asks the module it was made from, whose children its own are copies of.
    Compiled or exported by a PyTorch whose dynamo cannot call a weak reference
    (_OLD_DYNAMO): "unknown", the layer trusted, as before fused modules kept it."""
    if _OLD_DYNAMO and _compiling():
        return "unknown", None
    owner = site.owner(asker)
    if owner is None:
        return "unknown", None
    kids, layer = owner._modules, site.layer
    now = kids.get(site.name)
    if now is layer:  # (the common case: nothing moved)
        return "child", now
    if slot is not None:
        before = None
        for c in kids.values():
            # (a replica's FusedActivation is not among the owner's children: its site is)
            if c is slot or (isinstance(c, FusedActivation) and c._site is site):
                now = before
                break
            before = c
    if now is layer or _applies_act(now, layer):
        return "child", now
    m = now
    while isinstance(m, torch.nn.Module) and len(m._modules) == 1:
        m = next(iter(m._modules.values()))
        if m is layer or _applies_act(m, layer):
            return "inside", m
    return None, None


def _runs_there(site, slot=None, asker=None):
    """Whether the layer of site (or one of syncbn's that applies an activation) still runs
    where it was fused, or may (_locate)."""
    return _locate(site, slot, asker)[0] is not None


def _act_after(site, y, residual=None):
    """act(y + residual) for a batch norm that is no longer in place (_runs_there): the
    activation the fused layer applied (its own, as set_activation may have changed it),
    in PyTorch's ops, as the module it replaced computed it."""
    return _epilogue(y, residual, site.layer._act, site.layer.slope)


class FusedActivation(torch.nn.Identity):
    """What convert_fused leaves in place of an activation module that it fused into the
    batch norm before it (in an nn.Sequential, or a SyncBatchNormAct's act): the identity
    (that batch norm applies the activation; indices and state_dict keys stay), keeping the
    module it replaced (``replaced``: not a child, it has no state) for
    revert_sync_batchnorm to put back. Where a framework's conversion has put another
    module in that batch norm's place (mmengine's revert_sync_batchnorm,
    nn.SyncBatchNorm.convert_sync_batchnorm, timm's freeze_batch_norm_2d, mmcv's
    fuse_conv_bn), it applies the activation the batch norm applied (PyTorch's op), so
    that the model keeps its function."""

    _site = None  # (a module pickled before sites existed)

    def __init__(self, replaced, site=None):
        super().__init__()
        self.__dict__["replaced"] = replaced  # not registered: no child, no state_dict keys
        # a _Site: the batch norm that applies the activation and where (_locate); None
        # where that layer is the module running this one (a SyncBatchNormAct's act: it
        # goes where the layer goes) or the owner runs the activation itself (a
        # FusedConvModule's activate)
        self.__dict__["_site"] = site

    def forward(self, input):
        site = self._site
        if site is None:
            return input
        if type(input) is not _Tensor:
            # torch.fx: a node of its own, so that the traced module asks where it runs
            traced = _fx_leaf(self, input, None, norm_only=False)
            if traced is not None:
                return traced
        kind, mod = _locate(site, self)
        if kind is not None:
            pair = (site.layer if mod is None else mod).__dict__.get(_PAIRED)
            if pair is None or not pair.alone:  # (the layer's last call: its activation applied)
                return input
        return _act_after(site, input)  # (another module there, or the layer ran alone)

    def extra_repr(self):
        return f"{self.replaced!r} fused into the batch norm before it"


def _own_state(m):
    """Whether module m holds parameters or buffers itself, private attributes beyond
    nn.Module's (a subclass's state), or a forward set on it (mmengine's activation
    checkpointing wraps one there), which a fused replacement (_take_block: the children
    and public attributes, not a forward) would drop: such a module is not replaced."""
    return (bool(m._parameters or m._buffers) or "forward" in vars(m)
            or any(k.startswith("_") and k not in _MODULE_KEYS for k in vars(m)))  # (its others are public)


def _take_block(out, block, hooks=False):
    """out (a new module) with block's children, its public attributes (stride, downsample
    None, ...; not block_type, nor a forward set on block, which is bound to it) and its own
    training mode (each child keeps its mode: a frozen bn stays in eval); hooks: its hooks
    too (their dicts themselves: a handle that registered a hook on block removes it from
    out; and whether its backward hooks are full ones)."""
    for name, child in block._modules.items():
        if child is not None:
            out.add_module(name, child)
    skip = ("training", "block_type", "forward")
    for name, value in vars(block).items():
        if name not in block._modules and name not in skip and not name.startswith("_"):
            setattr(out, name, value)
    if hooks:
        _take_hooks(out, block)
    out.training = block.training


_MISSING = object()


class _TypeAttrs:
    """For a module that replaced another (block_type, its class): what that class gives
    that the replacement does not (a torchvision block's ``expansion``, a ConvModule's
    ``init_weights``): a method bound to this module, a property's value, a static or class
    method, a class attribute, as on the module it replaced."""

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)  # parameters, buffers, children
        except AttributeError:
            cls = self.__dict__.get("block_type")
            if name.startswith("__") or not isinstance(cls, type):
                raise
            attr = next((vars(k)[name] for k in cls.__mro__ if name in vars(k)), _MISSING)
            if attr is _MISSING:  # (the class's own, not its metaclass's: type.mro is no method of it)
                raise
        return attr.__get__(self, cls) if hasattr(type(attr), "__get__") else attr


class _FusedBlock(_TypeAttrs, torch.nn.Module):
    """A torchvision BasicBlock / Bottleneck after convert_fused: the same children (so the
    same parameters and state_dict keys) and attributes (its class's too: ``expansion``,
    _TypeAttrs), its batch norms fused: the
    activation into each, and the last one's residual add + ReLU into that one. Another
    module put in a batch norm's place (a framework's conversion) runs as torchvision's
    block runs it: that module, then (the add and) the activation the batch norm applied.
    While a hook would see its ``relu`` called (_hooked_relu), it runs torchvision's way:
    each batch norm alone, (the add,) then ``relu``."""

    _convs = ()
    _sites = None  # (a module pickled before sites existed)

    def __init__(self, block):
        super().__init__()
        _take_block(self, block, hooks=True)  # (its state_dict hooks: it has no other, _fused_block)
        self.block_type = type(block)  # what it was (a class: not part of the state_dict)
        # each batch norm's site (_locate): where another module takes its place (a
        # framework's conversion), the block applies the activation (and the add) itself
        self.__dict__["_sites"] = {bn: _Site(_ASKER, bn, self._modules.get(bn)) for _, bn in self._convs}

    def _norm(self, name, x, residual=None, relu=None):
        """Batch norm `name` on x, then the activation, after adding residual where given:
        the fused layer's one op, or (another module in its place, or the layer with a hook
        on its output, _unfused_now) that module, then the add and the activation the layer
        applied, in PyTorch's ops; relu: the block's ReLU module where it must run as a
        module (_hooked_relu), after the batch norm alone and the add."""
        bn = getattr(self, name)
        site = None if self._sites is None else self._sites.get(name)
        kind, mod = ("child", bn) if site is None else _locate(site, asker=self)
        if relu is not None:
            # as torchvision's block runs it: the batch norm alone (or the module in its
            # place), the add, then the ReLU module, whose hooks see its call
            y = bn(x) if kind is None else bn(x, activate=False)
            return relu(y if residual is None else y + residual)
        if kind is not None and not _unfused_now(bn if mod is None else mod):
            return bn(x) if residual is None else bn(x, residual)
        if site is None:  # (pickled before sites: the layer there is the block's)
            return _epilogue(bn(x), residual, bn._act, bn.slope)
        return _act_after(site, bn(x), residual)

    def _hooked_relu(self):
        """The block's relu child where a hook would see it called (one of its own, or a
        global module hook, registered after the conversion: a feature extractor's, an
        activation clip's) and it is the function the batch norms apply (a ReLU; not where
        relu_as_leaky made them leaky ReLUs, nor where another module took its place, which
        the block does not follow), and every batch norm can run without its activation: a
        layer of syncbn's or another module in its place, not one inside a wrapper there
        (checkpoint_wrapper's: it applies its ReLU), nor a block compiled where the
        layers cannot be followed (_locate: "unknown"); else None (the hook then runs at
        none of the block's ReLUs, not at some)."""
        relu = self._modules.get("relu")
        if type(relu) is not torch.nn.ReLU or (_no_hooks(relu) and not _global_hooks()):
            return None
        for _, name in self._convs:
            site = None if self._sites is None else self._sites.get(name)
            layer = self._modules.get(name) if site is None else site.layer
            if getattr(layer, "activation", None) != "relu":
                return None
            kind = "child" if site is None else _locate(site, asker=self)[0]
            if kind is not None and (kind != "child" or not isinstance(self._modules.get(name), SyncBatchNorm)):
                return None
        return relu

    def forward(self, x):
        out = x
        last = len(self._convs) - 1
        relu = self._hooked_relu()
        for i, (conv, bn) in enumerate(self._convs):
            out = getattr(self, conv)(out)
            if i < last:
                out = self._norm(bn, out, relu=relu)  # its ReLU fused
        identity = x if self.downsample is None else self.downsample(x)
        # torchvision's `out += identity` takes any strides and dtype, and an identity that
        # broadcasts to out's shape; the fused layer takes it as residual_like makes it
        identity = _fused.residual_like(identity, out)
        return self._norm(self._convs[last][1], out, identity, relu)  # ReLU(bn(out) + identity)


class FusedBasicBlock(_FusedBlock):
    _convs = (("conv1", "bn1"), ("conv2", "bn2"))


class FusedBottleneck(_FusedBlock):
    _convs = (("conv1", "bn1"), ("conv2", "bn2"), ("conv3", "bn3"))


_BLOCKS = ((_basic_block_forward, FusedBasicBlock), (_bottleneck_forward, FusedBottleneck))


# ---- mmcv's ConvModule -------------------------------------------------------------------
# OpenMMLab's convolution + norm + activation brick (mmcv.cnn.ConvModule; mmsegmentation's
# and mmdetection's heads and necks are built of it), found by its class's module and name,
# or a subclass that defines only its __init__. Its forward, read at open-mmlab/mmcv a8073c74b (2.x)
# and as 1.x and 2.0.1 had it, is written out below from its rules, not compared: with order
# ("conv", "norm", "act"), forward(x, activate=True, norm=True) pads where
# with_explicit_padding (padding_layer), runs conv, then the norm where `norm`, then
# activate where `activate`; in eval with `norm` and an efficient_conv_bn_eval_forward (2.1
# on; 2.0.1: fast_conv_bn_eval_forward; 1.x: none), conv runs with the norm folded into its
# weight and bias (conv.forward replaced by that function for the call) and the norm is
# skipped.
_CONV_MODULE = ("mmcv.cnn.bricks.conv_module", "ConvModule")


# What a subclass of ConvModule may define and still be fused: its __init__ and what Python
# gives every class
_CLASS_METADATA = _CLASS_MACHINERY | {"__init__"}


def _conv_module_class(m):
    """mmcv's ConvModule class where m is one, or of a subclass that defines nothing but its
    __init__ (a method, a forward, a train() of its own would not run on the fused module,
    and its methods' super() calls would fail there); else None."""
    mro = type(m).__mro__
    for i, cls in enumerate(mro):
        if (cls.__module__, cls.__qualname__) == _CONV_MODULE:
            return None if any(set(vars(sub)) - _CLASS_METADATA for sub in mro[:i]) else cls
    return None


class FusedConvModule(_TypeAttrs, torch.nn.Module):
    """An mmcv ``ConvModule`` (order conv, norm, act) after convert_fused: the same children
    (so the same parameters and state_dict keys; its ``activate`` a FusedActivation) and
    attributes, and ``norm`` (the batch norm), its batch norm applying the activation in
    its epilogue. ``forward(x, activate=True, norm=True)`` is the ConvModule's: conv then
    act(batch_norm) in one op; with ``activate=False`` the batch norm alone, with
    ``norm=False`` the activation alone (PyTorch's op), with neither the convolution alone;
    in eval with ``efficient_conv_bn_eval`` on, the convolution with the batch norm folded
    in (mmcv's function), then the activation. Methods and class attributes of mmcv's
    ConvModule class (``init_weights``, ``turn_on_efficient_conv_bn_eval``) work on it as
    on the ConvModule. torch.fx records it as one node. Another norm put in its batch
    norm's place (mmengine's revert_sync_batchnorm, mmcv's fuse_conv_bn) runs as the
    ConvModule's, the batch norm's activation after it."""

    _site = None  # (a module pickled before sites existed)

    def __init__(self, module):
        super().__init__()
        _take_block(self, module, hooks=True)  # (its state_dict hooks: it has no other, _fused_conv_module)
        self.block_type = type(module)  # what it was (a class: not part of the state_dict)
        # its batch norm's site (_locate): where another norm takes its place, the module
        # applies the activation the batch norm applied after that norm
        self.__dict__["_site"] = _Site(_ASKER, self.norm_name, self._modules[self.norm_name])

    @property
    def norm(self):
        return self._modules[self.norm_name]

    def forward(self, x, activate=True, norm=True):
        if type(x) is not _Tensor:
            # torch.fx: one node, as a batch norm is, so that a graph rewrite that folds a
            # convolution's batch norm into it (mmengine's efficient_conv_bn_eval) does not
            # take the batch norm inside, which applies the activation
            kw = {k: v for k, v in (("activate", activate), ("norm", norm)) if v is not True}
            traced = _fx_leaf(self, x, None, kw or None)
            if traced is not None:
                return traced
        kids = self._modules
        if self.with_explicit_padding:
            x = kids["padding_layer"](x)
        conv, bn = kids["conv"], kids[self.norm_name]
        fold = None
        if norm and not bn.training:  # (mmcv 2.0.1 named it fast_conv_bn_eval_forward)
            attrs = self.__dict__
            fold = attrs.get("efficient_conv_bn_eval_forward") or attrs.get("fast_conv_bn_eval_forward")
        if fold is not None:
            # mmcv's: conv's forward for this call is the convolution with the batch norm
            # folded into its weight and bias (conv's hooks see that), the norm skipped
            conv.forward = functools.partial(fold, bn, conv)
            try:
                x = conv(x)
            finally:
                del conv.forward
            norm = False
        else:
            x = conv(x)
        there, act, slope, layer = self._norm_applies()
        if there and not (norm and activate and _unfused_now(layer)):
            if norm:  # act(batch_norm(x)) in one op, or without act
                x = bn(x) if activate else bn(x, activate=False)
                return kids["activate"](x) if activate else x  # (the identity: its hooks run, as the activation's)
        elif norm:
            # another norm in its place (mmengine's revert_sync_batchnorm, which its Runner
            # runs when not distributed, puts a plain batch norm there; mmcv's fuse_conv_bn an
            # nn.Identity, the batch norm folded into conv): the norm, then the activation
            # the batch norm applied, as the ConvModule would; or the batch norm itself, a
            # hook seeing its output (_unfused_now: it runs alone)
            x = bn(x)
        return kids["activate"](_epilogue(x, None, act, slope)) if activate else x

    def _norm_applies(self):
        """(whether its batch norm, or a layer of syncbn's with an activation, runs in the
        norm's place (_locate), the activation applied there or to apply after the norm, its
        slope, that layer (the one inside a wrapper there) or the module there)."""
        site = self._site
        if site is not None:
            kind, mod = _locate(site, asker=self)
            layer = site.layer if mod is None else mod
            return kind is not None, layer._act, layer.slope, layer
        # pickled before sites: the norm's class tells, and what it applied was recorded
        bn = self._modules[self.norm_name]
        if isinstance(bn, SyncBatchNorm):
            return True, bn._act, bn.slope, bn
        act, slope = self.__dict__.get("_applied") or ("identity", 0.01)
        return False, _fused.ACTIVATIONS[act], slope, bn


def _fused_conv_module(m, uses, inplace=False, relu_as_leaky=None):
    """The FusedConvModule of an mmcv ConvModule m, or None: one without hooks, of order
    ("conv", "norm", "act"), whose norm is a fusable SyncBatchNorm (converted, used once)
    and whose activate an nn.ReLU or nn.LeakyReLU(inplace=True) (mmcv's default; an
    nn.LeakyReLU() keeps its input for the backward, the fused layer its output, and what
    runs after the module is its caller's code, unknown), each without hooks; in place as
    convert_fused's inplace says (an invertible activation)."""
    if _conv_module_class(m) is None or not _no_hooks(m) or _own_state(m):  # (used twice: its norm is too)
        return None
    kids, name = m._modules, getattr(m, "norm_name", None)
    if (getattr(m, "order", None) != ("conv", "norm", "act") or getattr(m, "with_norm", None) is not True
            or getattr(m, "with_activation", None) is not True or not isinstance(name, str)
            or not isinstance(kids.get("conv"), torch.nn.Module) or not _fusable_bn(kids.get(name), uses)):
        return None
    pad = getattr(m, "with_explicit_padding", None)
    if not (pad is False or (pad is True and isinstance(kids.get("padding_layer"), torch.nn.Module))):
        return None
    act_mod = kids.get("activate")
    was = _act_of(act_mod)
    if was is None or (was[0] == "leaky_relu" and not act_mod.inplace):
        return None
    fused = FusedConvModule(m)
    uses[id(fused)] = 1
    uses[id(_fuse_into(fused.norm, fused, "activate", was, relu_as_leaky, inplace))] = 1  # the walk goes on in it
    return fused


def _fused_replacement(m, uses, inplace, relu_as_leaky):
    """What convert_fused puts in m's place, a fused block or ConvModule, or None."""
    fused = _fused_block(m, uses, inplace, relu_as_leaky)
    return fused if fused is not None else _fused_conv_module(m, uses, inplace, relu_as_leaky)


def _fusable_bn(m, uses):
    """A layer the converter may give an epilogue: syncbn's SyncBatchNorm, plain (no
    epilogue yet), used once in the model, without hooks (a hook sees its output)."""
    return (type(m) is SyncBatchNorm and m._act == _sbn.IDENTITY and not m._inplace and uses[id(m)] == 1
            and _no_hooks(m))


def _act_of(m):
    """(activation, slope) of an nn.ReLU / nn.LeakyReLU module without hooks, else None."""
    if type(m) is torch.nn.ReLU and _no_hooks(m):
        return "relu", 0.01
    if type(m) is torch.nn.LeakyReLU and _no_hooks(m):
        slope = float(m.negative_slope)
        if _fused.takes_slope(slope):  # others (negative, ...) stay unfused
            return "leaky_relu", slope
    return None


def _fused_act(was, relu_as_leaky):
    """The (activation, slope) a fused layer takes for an activation module's was: a ReLU's
    is the leaky ReLU of convert_fused's relu_as_leaky where given."""
    return was if was[0] != "relu" or relu_as_leaky is None else ("leaky_relu", relu_as_leaky)


# The unit roundoff of the half dtypes, for the in-place backward's bound (syncbn.h:
# sbnBackwardEx): a channel of |weight| below max(1e-5, u |bias|) recovers no x in place,
# and one within _HALF_MARGIN times that recovers x_hat to worse than ~1 / _HALF_MARGIN (the
# output's rounding, u |bias|, divided by the weight).
_HALF_U = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
_HALF_MARGIN = 16


def _warn_half_inplace(layer, dtype, w, b):
    """Once per layer and half dtype (its first eager in-place training call in it): a
    RuntimeWarning where a channel's |weight| is below max(1e-5, _HALF_MARGIN u |bias|): in
    place its weight gets a gradient that is off by more than ~6 %, or 0. The check reads
    the weights at that call (one synchronization, once); later training may move them."""
    checked = layer.__dict__.get("_half_checked")
    layer.__dict__["_half_checked"] = (checked or frozenset()) | {dtype}
    if w is None:  # (no affine parameters: weight 1, bias 0)
        return
    bound = _RECOVER_MIN_WEIGHT if b is None else \
        (b.detach().float().abs() * (_HALF_MARGIN * _HALF_U[dtype])).clamp_min(_RECOVER_MIN_WEIGHT)
    low = w.detach().float().abs() < bound
    n = int(low.sum())
    if n:
        warnings.warn(f"syncbn.torch.SyncBatchNorm: in place in {str(dtype).replace('torch.', '')}: {n} of "
                      f"{low.numel()} channels have |weight| below max(1e-5, {_HALF_MARGIN} u |bias|) (u = "
                      f"{_HALF_U[dtype]:g}, the dtype's unit roundoff): the in-place backward recovers their input "
                      f"from the rounded output to worse than ~{100 // _HALF_MARGIN} % (below u |bias|, not at all: "
                      f"their weight's gradient is 0). Set inplace=False on this layer for training in this "
                      f"dtype (docs/PYTHON.md, \"inplace=True\")", RuntimeWarning, stacklevel=4)


# The in-place backward's weight threshold (syncbn.h: SBN_RECOVER_MIN_WEIGHT; test_capi.py
# holds the two equal): a channel of |weight| below it recovers no x from its output, and
# its weight gets a gradient of 0.
_RECOVER_MIN_WEIGHT = 1e-5


class _InPlace:
    """convert_fused's inplace (truthy as given), and the layers it left out of place though
    their activation is invertible (_inplace_ok): their weights, for its warning."""

    def __init__(self, on):
        self.on, self.kept = on, []

    def __bool__(self):
        return self.on


def _recovers(bn):
    """Whether every channel of layer bn has |weight| >= the in-place backward's threshold
    (or no weight: affine=False, weight 1), so that in place its weight gets gradients. A
    weight of 0 does not: one initialized to 0 (torchvision's zero_init_residual, timm's
    zero_init_last: a residual block's last batch norm) would stay 0 in place. A weight on
    the meta device (no values yet) is taken as recoverable."""
    w = getattr(bn, "weight", None)
    if not isinstance(w, torch.Tensor) or w.is_meta:
        return True
    return not bool((w.detach().abs() < _RECOVER_MIN_WEIGHT).any())


def _inplace_ok(inplace, act, slope, bn):
    """Whether layer bn, fused with this activation, goes in place under convert_fused's
    inplace: an invertible activation (leaky ReLU with a slope the in-place backward takes)
    and a weight it recovers x with (_recovers; a layer that fails only that is noted in
    inplace.kept, and keeps its input)."""
    if not (inplace and act == "leaky_relu" and _fused.slope32(slope) >= _fused._FLT_MIN):
        return False
    if not _recovers(bn):
        inplace.kept.append(bn)
        return False
    return True


def _fused_block(m, uses, inplace=False, relu_as_leaky=None):
    """The fused replacement of a torchvision BasicBlock / Bottleneck, or None; its ReLU a
    leaky ReLU of slope relu_as_leaky where given, and then, with inplace, its layers in
    place: those without the residual, and the last one (it takes the residual) where the
    block has no downsample: its residual is then the block's input, which the first
    convolution keeps anyway, so keeping it in place of x costs nothing (with a
    downsample, the residual is the downsample's output, which nothing else keeps: as
    large as x, and slower to recover from, so that layer keeps x; an input that
    residual_like converts, to the block's dtype or memory format, is a copy the size of
    x: no saving there, and no loss). A block whose class defines a method of
    torch.nn.Module's protocol (a train() that keeps a batch norm frozen in eval, a
    state_dict loader of its own) is left alone: the fused block would not run it."""
    if not _no_hooks(m) or uses[id(m)] != 1 or _own_state(m) or _protocol_overrides(m, _MODULE_PROTOCOL):
        return None
    for forward, cls in _BLOCKS:
        if not _same_code(type(m).forward, forward):
            continue
        names = [n for pair in cls._convs for n in pair]
        kids = m._modules
        if not all(isinstance(kids.get(n), torch.nn.Module) for n in names):
            return None
        if not all(_fusable_bn(kids[bn], uses) for _, bn in cls._convs):
            return None
        if type(kids.get("relu")) is not torch.nn.ReLU or not _no_hooks(kids["relu"]):
            return None
        down = getattr(m, "downsample", None)
        if down is not None and not isinstance(down, torch.nn.Module):
            return None
        fused = cls(m)
        act = _fused_act(("relu", 0.01), relu_as_leaky)
        last = len(cls._convs) - 1
        for i, (_, bn) in enumerate(cls._convs):
            # within the block, a layer's input is its convolution's output (used by nothing
            # else) and its output the next convolution's input (which does not write it);
            # the last layer's output is the block's, and its residual the block's input
            layer = getattr(fused, bn)
            layer.set_activation(*act, (i < last or down is None) and _inplace_ok(inplace, *act, layer))
            layer.__dict__[_PAIRED] = _Pair()
        return fused
    return None


def _runs_children_in_order(m):
    """An nn.Sequential (or a subclass) that keeps Sequential.forward, and the iteration over
    its children that forward runs (a subclass's __iter__ may skip some)."""
    return (isinstance(m, torch.nn.Sequential) and type(m).forward is torch.nn.Sequential.forward
            and type(m).__iter__ is torch.nn.Sequential.__iter__)


def _run_order(m):
    """How m's forward runs its children, where it runs them one after another, each on the
    previous one's output: (the (name, child) pairs in that order, the names of those whose
    output m also gives out to its caller, whether m's output is the last one's); None for
    any other module. An nn.Sequential that keeps Sequential.forward: every child, none
    given out, its output the last child's. A torchvision IntermediateLayerGetter: every
    child, those named in its return_layers given out (in a dict). A torchvision ResNet:
    its stem and layers (conv1 ... avgpool; then torch.flatten and fc)."""
    if _runs_children_in_order(m):
        return [(n, c) for n, c in m._modules.items() if c is not None], frozenset(), True
    if (isinstance(m, torch.nn.ModuleDict) and isinstance(getattr(m, "return_layers", None), dict)
            and _same_code(type(m).forward, _layer_getter_forward)):
        return ([(n, c) for n, c in m._modules.items() if c is not None],
                frozenset(k for k in m.return_layers if isinstance(k, str)), False)
    if (_same_code(type(m).forward, _resnet_forward)
            and _same_code(getattr(type(m), "_forward_impl", None), _resnet_forward_impl)):
        kids = [(n, m._modules.get(n)) for n in _RESNET_ORDER]
        if all(isinstance(c, torch.nn.Module) for _, c in kids):
            return kids, frozenset(), False
    return None


# modules that may return what they are given, or a view of it (nn.Identity, the
# FusedActivation among them; dropout in eval or with p = 0): what runs after them may
# write over a fused pair's output through them
_PASS_THROUGH = (torch.nn.Identity, torch.nn.Flatten, torch.nn.Unflatten, torch.nn.modules.dropout._DropoutNd)
# modules known to give a new tensor and not to write their input (unless `inplace=True`,
# asked first): the only ones after which an nn.LeakyReLU() pair is fused
_READS_ONLY = (torch.nn.modules.conv._ConvNd, torch.nn.Linear, torch.nn.Bilinear,
               torch.nn.modules.pooling._MaxPoolNd, torch.nn.modules.pooling._AvgPoolNd,
               torch.nn.modules.pooling._AdaptiveMaxPoolNd, torch.nn.modules.pooling._AdaptiveAvgPoolNd,
               torch.nn.modules.pooling._LPPoolNd, torch.nn.Upsample, torch.nn.modules.batchnorm._NormBase,
               torch.nn.GroupNorm, torch.nn.LayerNorm, torch.nn.ReLU, torch.nn.ReLU6, torch.nn.LeakyReLU,
               torch.nn.ELU, torch.nn.SELU, torch.nn.CELU, torch.nn.GELU, torch.nn.SiLU, torch.nn.Mish,
               torch.nn.Hardswish, torch.nn.Hardsigmoid, torch.nn.Hardtanh, torch.nn.Sigmoid, torch.nn.Tanh,
               torch.nn.PReLU, torch.nn.Softmax, torch.nn.LogSoftmax)


def _in_run_order(ms):
    """The modules of ms in the order they run: a Sequential's children (nested ones too)
    in its place, but for one with hooks (they see its input)."""
    for m in ms:
        if _runs_children_in_order(m) and _no_hooks(m):
            yield from _in_run_order([c for c in m._modules.values() if c is not None])
        else:
            yield m


# In the modules after a pair (_next_writes' rest): the caller of a module that gives the
# output it reached out (an IntermediateLayerGetter's return_layers), where what runs is
# not known.
_GIVEN_OUT = object()


def _next_writes(rest):
    """What the first module after a batch norm + activation pair does with the pair's
    output: rest, the modules known to run after the pair (those after it in its Sequential,
    then those after that Sequential in the Sequentials around it); pass-through modules
    (_PASS_THROUGH) skipped. True: it writes over its input (`inplace=True`); False: it is
    one of _READS_ONLY running torch.nn's forward, or syncbn's SyncBatchNorm or a fused block
    (neither writes its input; an in-place SyncBatchNorm keeps its output for autograd), or
    a FusedConvModule whose padding layer or (without one) convolution is one of those;
    None: not known (another module, or a subclass with its own forward, which may write
    its input or return a view of it; a module with hooks; or the pair ends what the
    converter can see, or only pass-throughs follow it there)."""
    for m in _in_run_order(rest):
        if m is _GIVEN_OUT:  # the caller has it (through pass-throughs): not known
            return None
        if not _no_hooks(m):  # a hook sees its input, and may write it
            return None
        if isinstance(m, (SyncBatchNorm, _FusedBlock)):  # syncbn's: `inplace` says what autograd
            return False  # keeps, and the input is never written
        if isinstance(m, FusedConvModule):  # (its `inplace` is the ConvModule's activation's) its
            kids = m._modules  # input goes to its padding layer or its convolution, and no further
            return _next_writes((kids["padding_layer"] if m.with_explicit_padding else kids["conv"],))
        if getattr(m, "inplace", False):
            return True
        if not _torch_forward(m):  # a subclass's own forward may do anything
            return None
        if isinstance(m, _PASS_THROUGH):
            continue
        return False if isinstance(m, _READS_ONLY) else None
    return None


def _torch_forward(m):
    """Whether m runs torch.nn's own forward (not one a subclass wrote)."""
    return getattr(type(m).forward, "__module__", "").startswith("torch.nn.")


def _fuse(module, uses, inplace, relu_as_leaky, after=()):
    """Fuses in module and below; after: the modules known to run after module, in order
    (the rest of the Sequentials around it; () where none is known)."""
    kids = [(name, child) for name, child in module._modules.items() if child is not None]
    for i, (name, child) in enumerate(kids):  # the blocks first: what runs after a child is final
        block = _fused_replacement(child, uses, inplace, relu_as_leaky)
        if block is not None:
            setattr(module, name, block)
            kids[i] = (name, block)
    order = _run_order(module)
    if order is None:
        for _, child in kids:
            _fuse(child, uses, inplace, relu_as_leaky)
        return
    seq, given_out, last_is_output = order
    seen = {id(c) for _, c in seq}
    for _, child in kids:  # children the order leaves out (a ResNet's fc): nothing known after them
        if id(child) not in seen:
            _fuse(child, uses, inplace, relu_as_leaky)
    tail = after if last_is_output else ()

    def runs_after(i):
        """The modules that get the output of seq[i - 1], in order, up to the first one
        whose output goes out to the caller too (then _GIVEN_OUT), else with tail."""
        rest = []
        for name, m in seq[i:]:
            rest.append(m)
            if name in given_out:
                return tuple(rest) + (_GIVEN_OUT,)
        return tuple(rest) + tail

    for i, (name, child) in enumerate(seq):
        # what runs after a child's last module: its own forward hooks first (they see, and
        # may write, its output), and the caller where its output is given out, so nothing
        # known where it has any or is
        known = _no_hooks(child) and name not in given_out
        _fuse(child, uses, inplace, relu_as_leaky, runs_after(i + 1) if known else ())
    for i in range(len(seq) - 1):
        (bn_name, bn), (act_name, act_mod) = seq[i], seq[i + 1]
        was = _act_of(act_mod)
        if was is None or not _fusable_bn(bn, uses) or bn_name in given_out:  # given out: seen
            continue
        # the fused layer's backward keeps its output, as nn.ReLU and
        # nn.LeakyReLU(inplace=True) do; nn.LeakyReLU() keeps its input, so what runs
        # after it may write over the output: such a pair is fused only where the module
        # after it is known and does not (the model's own code after a Sequential, or a
        # caller's y.mul_(2), may)
        writes = None if act_name in given_out else _next_writes(runs_after(i + 2))
        if was[0] == "leaky_relu" and not act_mod.inplace and writes is not False:
            continue
        # in place: an invertible activation, and no module after it known to write over
        # the output autograd keeps
        seq[i + 1] = (act_name, _fuse_into(bn, module, act_name, was, relu_as_leaky, inplace if not writes else False,
                                           bn_name))


def _fuse_into(bn, parent, name, was, relu_as_leaky, inplace, bn_name=None):
    """Layer bn takes the activation `was` (_act_of) of parent's child `name`, which runs
    right after it (a ReLU as convert_fused's relu_as_leaky says), in place where `inplace`
    and the activation is invertible; a FusedActivation takes the child's place and is
    returned. bn_name: bn's name in parent, where the FusedActivation is to apply the
    activation itself when another module takes bn's place there (a Sequential's pair)."""
    act_mod = parent._modules[name]
    act = _fused_act(was, relu_as_leaky)
    bn.set_activation(act[0], act[1], _inplace_ok(inplace, *act, bn))
    if bn is not parent:  # (a SyncBatchNormAct's own act: its output is act(...) either way)
        bn.__dict__[_PAIRED] = _Pair()
    site = None if bn_name is None else _Site(parent, bn_name, bn)
    parent._modules[name] = FusedActivation(act_mod, site).train(act_mod.training)
    return parent._modules[name]


def _leaky_slope(slope):
    """convert_fused's relu_as_leaky as a float, or a ValueError: a real number (not a bool)
    that is finite and at least float32's smallest normal number as a float32 (below it the
    in-place backward loses x, and the function is ReLU's within rounding)."""
    try:
        s = float(slope) if isinstance(slope, numbers.Real) and not isinstance(slope, bool) else None
    except OverflowError:  # an int beyond float's range
        s = None
    if s is None or not _fused.takes_slope(s) or _fused.slope32(s) < _fused._FLT_MIN:
        raise ValueError("syncbn.torch.convert_fused: relu_as_leaky is the leaky ReLU's slope, a finite real "
                         f"number of at least {_fused._FLT_MIN:g} (float32's smallest normal; None keeps ReLU), "
                         f"not {slope!r}")
    return s


def convert_fused(module, process_group=None, comm=None, inplace=False, relu_as_leaky=None):
    """convert_sync_batchnorm, then fuses the patterns whose results it cannot change:

    - in an ``nn.Sequential`` (one that runs its children in order), a batch norm followed
      at once by ``nn.ReLU`` or ``nn.LeakyReLU``: the batch norm takes the activation, and
      a ``FusedActivation`` (an ``nn.Identity`` keeping the module it replaced, which
      revert_sync_batchnorm puts back) takes the activation's place (indices and
      state_dict keys stay);
    - a torchvision ``BasicBlock`` / ``Bottleneck`` (its children, and a forward with
      exactly torchvision's code): replaced by a ``FusedBasicBlock`` / ``FusedBottleneck``
      with the same children, whose batch norms take the ReLU, the last one also the
      residual add (ReLU(bn(out) + identity) in one op);
    - the same pairs among the children of the modules whose forward (torchvision's code,
      exactly) runs them one after another as a Sequential does: a torchvision ``ResNet``'s
      stem (``bn1``, ``relu``) and an ``IntermediateLayerGetter`` (the backbone of
      torchvision's segmentation and detection models), but for a batch norm whose output
      the getter gives out (``return_layers``) and an ``nn.LeakyReLU()`` whose output it
      gives out (itself, through a pass-through, or at the end of a child);
    - a SyncBatchNormAct (timm's BatchNormAct2d converted) whose ``drop`` is an
      ``nn.Identity`` and whose ``act`` is ``nn.ReLU`` or ``nn.LeakyReLU(inplace=True)``:
      the layer takes the activation, a ``FusedActivation`` the act's place;
    - an mmcv ``ConvModule`` (mmsegmentation's and mmdetection's conv + norm + act brick,
      recognized by its class, or a subclass that defines only its ``__init__``) of order
      conv, norm, act, whose activation is ``nn.ReLU`` or ``nn.LeakyReLU(inplace=True)`` (mmcv's
      default), without hooks: replaced by a ``FusedConvModule`` with the same children
      and attributes, whose batch norm takes the activation (a ``FusedActivation`` in
      ``activate``'s place) and whose ``forward(x, activate=True, norm=True)`` is the
      ConvModule's for every argument (its ``efficient_conv_bn_eval`` too).

    Left alone: a batch norm used more than once in the model or with hooks (its output is
    seen elsewhere), an activation not right after the batch norm, another activation
    class or a slope the library does not take (negative), an ``nn.LeakyReLU()`` followed
    by anything but a module known not to write its input (convolutions, linear layers,
    pooling, upsampling, normalizations, activations not in place, the fused blocks, each
    running torch.nn's own forward or syncbn's, without hooks, a FusedConvModule whose
    convolution is one of those (without a padding layer); looked for past
    ``nn.Identity``, ``nn.Flatten``, ``nn.Unflatten`` and dropout, which may pass their
    input on, and into the Sequentials around the pair): an in-place module, a module of
    another class or a subclass with its own ``forward``, a module with hooks,
    or nothing the converter can see (the pair ends the Sequentials around it: the model's
    own code after them, or the caller, may write over the output in place); the fused
    layer keeps its output for the backward, as nn.ReLU and nn.LeakyReLU(inplace=True) do,
    where nn.LeakyReLU() keeps its input; blocks of any other code; a ConvModule of
    another order, with hooks or an activation of another class; a block or ConvModule
    with parameters, buffers or private attributes of its own (a subclass's) or a forward
    set on it; a ConvModule subclass that defines more than its __init__; everything
    while a global module hook is registered
    (with a RuntimeWarning). ``inplace=True``: the fused leaky ReLU layers (slope > 0) not
    followed by a module that writes its input (``inplace=True``) become in-place (autograd keeps their output only,
    and a block's last layer its residual: the block's input, kept anyway); ReLU layers cannot (not invertible) and
    stay as they are, and so does a layer one of whose weight's channels is below 1e-5 in magnitude (a weight
    initialized to 0, as zero_init_residual does: in place it would get no gradient and stay 0), with a
    RuntimeWarning that names such layers. That check is of the weights at conversion, in float32's bound: a
    channel that training drives below the bound later gets no gradient from then on, and in fp16 / bf16
    (autocast) the bound is max(1e-5, u * |bias|), u the dtype's unit roundoff, with the recovery less accurate
    as |weight| nears it (docs/PYTHON.md, "inplace=True"): keep inplace=False for such training.

    Each fused module keeps the layer it fused and where it was: where another module
    takes that place later (a framework's conversion: mmengine's revert_sync_batchnorm,
    nn.SyncBatchNorm.convert_sync_batchnorm, timm's and detectron2's freezes, mmcv's
    fuse_conv_bn), the FusedActivation, the block or the ConvModule applies the activation
    (and a block the add) after it, in PyTorch's ops; a wrapper there that calls the layer
    is not another module.

    What it cannot see: code that calls a Sequential's children one by one itself (a
    feature extractor that keeps the output of each index) would read the fused batch
    norm's output with the activation applied; convert such a model with
    ``convert_sync_batchnorm``. Nor a FusedActivation replaced, deleted or moved away
    after it (the batch norm still applies the activation): edit first, or
    revert_sync_batchnorm, edit, and convert again. A hook registered later on a fused
    batch norm (forward or backward, its own or global) is followed: while it is there
    the layer runs its batch norm alone (_unfused_now), and the hook sees the output before
    the activation, as on the original.

    ``relu_as_leaky=SLOPE`` (a real number >= float32's smallest normal, 1.18e-38; None,
    the default, changes nothing): every ReLU it fuses becomes a leaky ReLU of that slope, a torchvision block's all of them (its one
    ``relu`` module serves each). This CHANGES THE MODEL, as inplace_abn's networks are
    built (leaky ReLU, slope 0.01), so it is the caller's choice: the parameters and
    buffers load as before, but the function is another, and a model trained with ReLU
    gives other outputs. With ``inplace=True`` those layers go in place too, a block's
    last one (it takes the residual) where the block has no downsample (the residual is
    then the block's input, which its first convolution keeps anyway): a ReLU network
    then keeps about half the activations it kept (bench/notes/fused-epilogue.md). revert_sync_batchnorm puts
    ``nn.LeakyReLU(SLOPE)`` where the ReLU was (a block's ``relu`` too): the function
    trained. ReLUs it does not fuse stay ReLUs: one not right after a batch norm, and those
    of the pairs and blocks it leaves alone (above: hooks, a batch norm used twice, ...)."""
    inplace = _InPlace(_flag(inplace, "inplace", "syncbn.torch.convert_fused"))  # before anything changes
    if relu_as_leaky is not None:
        relu_as_leaky = _leaky_slope(relu_as_leaky)
    # hooked modules (the batch norms keep their hooks through the conversion): a hook
    # sees the output, so such a layer keeps it to itself
    hooked = [name for name, m in module.named_modules(remove_duplicate=False) if not _no_hooks(m)]
    module = _convert(module, process_group, comm)
    if _global_hooks():
        warnings.warn("syncbn.torch.convert_fused: a global module hook is registered "
                      "(torch.nn.modules.module.register_module_forward_hook, ...): it sees every batch "
                      "norm's output, which fusing would change, so nothing is fused", RuntimeWarning, stacklevel=2)
        return module
    uses = {}
    for _, m in module.named_modules(remove_duplicate=False):
        uses[id(m)] = uses.get(id(m), 0) + 1
    for name in hooked:
        uses[id(module.get_submodule(name))] = 2  # as if used twice: left alone
    block = _fused_replacement(module, uses, inplace, relu_as_leaky)
    if block is not None:
        module = block
    _fuse(module, uses, inplace, relu_as_leaky)
    for m in module.modules():
        _fuse_own_act(m, inplace, relu_as_leaky)
    if inplace.kept:
        kept = {id(m) for m in inplace.kept}
        names = [n or "(the module itself)" for n, m in module.named_modules() if id(m) in kept]
        warnings.warn(f"syncbn.torch.convert_fused: {len(names)} fused layer(s) keep their input (not in place) "
                      f"though inplace=True: a channel of their weight is below {_RECOVER_MIN_WEIGHT:g} in "
                      "magnitude (initialized to 0, as zero_init_residual does), which the in-place backward "
                      "gives no gradient, so the weight would stay there: " + ", ".join(names) + ". Convert "
                      "after loading the weights, or call such a layer's set_activation(..., inplace=True) once "
                      "they are loaded", RuntimeWarning, stacklevel=2)
    return module


def _fuse_own_act(m, inplace, relu_as_leaky):
    """A SyncBatchNormAct m without an epilogue yet, whose drop is an nn.Identity and whose
    act an nn.ReLU or nn.LeakyReLU(inplace=True), both without hooks: the layer takes the
    activation, a FusedActivation the act's place. Its output, act(drop(bn(x))), is the
    same either way, so hooks on the layer and a layer used twice do not matter. An
    nn.LeakyReLU() (which keeps its input for the backward, where the fused layer keeps its
    output) is left alone: what runs after the layer is its caller's code, unknown."""
    if not (type(m) is SyncBatchNormAct and m._act == _sbn.IDENTITY and not m._inplace):
        return
    drop, act_mod = m._modules.get("drop"), m._modules.get("act")
    if not (drop is None or (type(drop) is torch.nn.Identity and _no_hooks(drop))):
        return
    was = _act_of(act_mod)
    if was is not None and (was[0] != "leaky_relu" or act_mod.inplace):
        _fuse_into(m, m, "act", was, relu_as_leaky, inplace)
