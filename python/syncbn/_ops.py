"""syncbn's operators in PyTorch's dispatcher (namespace ``syncbn``): what syncbn.torch's
layer calls, and what torch.compile, CUDA graphs, autocast and torch.library.opcheck see.

    syncbn::batch_norm_train(Tensor input, Tensor? weight, Tensor? bias,
        Tensor(a!)? running_mean, Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked,
        float eps, float? momentum, int comm) -> (Tensor out, Tensor stats)
    syncbn::batch_norm_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor stats,
        float eps, int comm, bool input_grad, bool weight_grad)
        -> (Tensor grad_input, Tensor grad_weight_bias)
    syncbn::batch_norm_infer(Tensor input, Tensor running_mean, Tensor running_var,
        Tensor? weight, Tensor? bias, float eps) -> Tensor

``comm`` is a ``syncbn.Comm``'s ``id`` (an int: operators take no Python objects); the
running statistics are updated in place by the library's forward (momentum None: the
cumulative average through num_batches_tracked). ``stats`` is (2, C) float32: the batch
mean and 1/sqrt(var + eps) of the team's batch. ``out`` has the input's memory format
(contiguous, or channels_last); an input that is neither is copied to contiguous first.
The backward's grad_weight_bias is (2, C) float32, the weight's and the bias's gradients
(this rank's sums: DDP adds them up); it returns empty (0-element) tensors for what it was
not asked for.

Each operator has a CPU and a CUDA kernel (the same Python function: it checks its
arguments, allocates, and calls the C library through ctypes, on the current CUDA stream
as the dispatcher's thread sees it), a fake kernel (the same checks and allocations, no
call: torch.compile's shape inference), and an Autograd kernel (an autograd.Function whose
backward calls batch_norm_backward, or torch ops for the inference). Registered with
torch.library's low-level API: the per-call cost is the dispatcher's, ~2 us less than
torch.library.custom_op's wrappers (bench/notes/torch-binding.md), and an operator that
mutates its inputs may have an Autograd kernel (custom_op refuses autograd for those).
"""

import ctypes
import functools
import re
import warnings

import torch
from torch.autograd import forward_ad as _fwad
from torch._subclasses.fake_tensor import is_fake as _is_fake

from . import (FLOAT16, FLOAT32, BFLOAT16, GRAD_LOCAL, NCHW, NHWC, Comm, SyncBNError, SyncBNValueError, TensorDesc,
               _VALUE_ERRORS, _capi, _native, _raise)

NS = "syncbn"
_DTYPES = {torch.float32: FLOAT32, torch.float16: FLOAT16, torch.bfloat16: BFLOAT16}
_LIB = _capi.lib
_fwd_c, _bwd_c, _inf_c = _LIB.sbnForwardTrain, _LIB.sbnBackward, _LIB.sbnForwardInference
_byref = ctypes.byref


def _stream(x):
    """The current CUDA stream of x's device as the dispatcher keeps it (the stream
    PyTorch's own kernels run on, also under CUDA graph capture), as an int, no Stream
    object; None (no stream) for a CPU tensor."""
    if not x.is_cuda:
        return None
    return _cuda_raw_stream(x.device.index if x.device.index is not None else torch.cuda.current_device())


try:
    _cuda_raw_stream = torch._C._cuda_getCurrentRawStream  # what inductor's generated code calls
except AttributeError:  # a build without CUDA: no CUDA tensors either
    def _cuda_raw_stream(index):
        return torch.cuda.current_stream(index).cuda_stream


# ---- argument checks: the same in the real kernels and the fake ones ----------------------
def _same_device(x, name, t, who):
    if t is not None and t.device != x.device:
        raise RuntimeError(f"syncbn.{who}: {name} is on {t.device} and the input on {x.device}: "
                           "every tensor argument must be on the input's device")


def _per_channel(x, name, t, who):
    if t is not None:
        _same_device(x, name, t, who)
        if t.dim() != 1 or t.shape[0] != x.shape[1]:
            raise RuntimeError(f"syncbn.{who}: {name} has shape {tuple(t.shape)}; the input has "
                               f"{x.shape[1]} channels, so it must be ({x.shape[1]},)")
        if not t.is_floating_point():
            raise TypeError(f"syncbn.{who}: {name} is {t.dtype}; it must be floating point")


def _vectors(x, who, names, tensors):
    """Checks the per-channel tensors (None: absent): on x's device, of shape (C,),
    floating point; the detail from _per_channel when one is not."""
    dev, shape = x.device, (x.shape[1],)
    for name, t in zip(names, tensors):
        if t is not None and (t.shape != shape or t.device != dev or not t.is_floating_point()):
            _per_channel(x, name, t, who)


def _check_input(x, who):
    if x.dim() >= 2 and x.dtype in _DTYPES:
        return
    if x.dim() < 2:
        raise ValueError(f"syncbn.{who}: expected at least 2D input (got {x.dim()}D input)")
    if x.dtype not in _DTYPES:
        raise TypeError(f"syncbn.{who}: input dtype {x.dtype}; libsyncbn takes float32, float16 and bfloat16")


_CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def _channels_last(x):
    """The channels-last memory format of x's rank (None: only 4D and 5D tensors have one)."""
    return _CHANNELS_LAST.get(x.dim())


def _copy_format(x):
    """The memory format of a dense copy of x (not dense itself): channels_last(_3d) where
    x's strides have its order, as PyTorch's suggest_memory_format (and so nn.BatchNorm2d's
    output for a cropped channels_last tensor) decides it, else contiguous."""
    fmt = _channels_last(x)
    if fmt is None or x.stride(1) == 0:
        return torch.contiguous_format
    low = 0
    for d in (1, 3, 2, 0) if x.dim() == 4 else (1, 4, 3, 2, 0):
        size, stride = x.size(d), x.stride(d)
        # an empty dim, strides out of order, or N's stride equal to C's (ambiguous): contiguous
        if size == 0 or stride < low or (d == 0 and low == x.stride(1)):
            return torch.contiguous_format
        low = stride * size if size > 1 else stride
    return fmt


def _read_format(x):
    """(the memory format the library reads x in, whether x is already dense in it):
    contiguous (NCHW) if x is; channels_last(_3d) (NHWC) if x is; else _copy_format's,
    of a copy (a crop of a channels_last tensor stays channels_last). A tensor that is both
    (an empty batch, 1x1 planes, one channel) is NCHW: the library matches such a rank's
    layout to its peers' (its bytes are the same either way)."""
    if x.is_contiguous():
        return torch.contiguous_format, True
    fmt = _channels_last(x)
    if fmt is not None and x.is_contiguous(memory_format=fmt):
        return fmt, True
    return _copy_format(x), False


def _dense(x):
    """(x as the library reads it, layout): x itself or its dense copy (_read_format)."""
    fmt, dense = _read_format(x)
    return x if dense else x.contiguous(memory_format=fmt), NCHW if fmt is torch.contiguous_format else NHWC


_TRAIN_VECTORS = ("weight", "bias", "running_mean", "running_var")


def _check_train(x, weight, bias, running_mean, running_var, nbt):
    _check_input(x, "batch_norm_train")
    _check_train_args(x, weight, bias, running_mean, running_var, nbt, "batch_norm_train")


def _check_train_args(x, weight, bias, running_mean, running_var, nbt, who):
    """The training forward's parameter and buffer checks (the plain and the fused
    operator's), after the input's."""
    _vectors(x, who, _TRAIN_VECTORS, (weight, bias, running_mean, running_var))
    if (running_mean is None) != (running_var is None):
        raise RuntimeError(f"syncbn.{who}: running_mean and running_var come together (both or neither)")
    if weight is None and bias is not None:
        raise RuntimeError(f"syncbn.{who}: a bias without a weight (the library takes both or neither)")
    if nbt is not None:
        _same_device(x, "num_batches_tracked", nbt, who)
        if nbt.numel() != 1 or nbt.dtype != torch.int64:
            raise RuntimeError(f"syncbn.{who}: num_batches_tracked must be one int64 (got {nbt.dtype}, "
                               f"{nbt.numel()} elements)")


def _comm(comm_id, x, who):
    c = Comm.from_id(comm_id)
    if x.device.type != ("cpu" if c.host else "cuda"):
        raise RuntimeError(f"syncbn.{who}: the input is on {x.device}, and the team ({c.transport}) takes "
                           + ("CPU tensors" if c.host else "CUDA tensors"))
    return c


def _call_comm(c, fn, what, *args):
    """fn(c's handle, *args) by Comm._call as an operator's call (counted as c's call in
    flight: a destroy() from another thread meanwhile is done when the call returns, where
    it could free the comm between reading the handle and the library's call; SyncBNError
    naming `what` where it fails), one at a time where c's calls are serialized."""
    with c._serial:
        c._call(fn, what, *args, op=True)


# ---- the C call's small structs, made once per distinct value ------------------------------
_descs = {}
_params = {}


def _desc(x, layout):
    s = x.shape
    sp = 1
    for e in s[2:]:
        sp *= e
    # a spatial extent of 0: no elements on this rank, which still takes part (n = 0)
    key = (_DTYPES[x.dtype], layout, s[0], s[1], sp) if sp else (_DTYPES[x.dtype], layout, 0, s[1], 1)
    d = _descs.get(key)
    if d is None:
        if len(_descs) > 4096:
            _descs.clear()
        d = _descs[key] = _byref(TensorDesc(*key))
    return d


def _param(eps, momentum):
    key = (eps, momentum)
    p = _params.get(key)
    if p is None:
        if momentum is not None and momentum < 0.0:  # the library reads it as None's cumulative average
            raise ValueError(f"syncbn: momentum must be >= 0 (None: the cumulative average), got {float(momentum)!r}")
        if len(_params) > 256:
            _params.clear()
        p = _params[key] = _byref(_capi.Params(eps, -1.0 if momentum is None else momentum, GRAD_LOCAL))
    return p


def _f32(t):
    """t as the library reads it (float32, contiguous), or None."""
    if t is None or (t.dtype == torch.float32 and t.is_contiguous()):
        return t
    return t.detach().to(torch.float32).contiguous()


def _f32_bias(weight, bias):
    """The bias as the library reads it: _f32(bias), or zeros where a weight comes without
    a bias (a layer made with bias=False, as nn.BatchNorm*d takes it: the library takes
    both or neither)."""
    if weight is not None and bias is None:
        return torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device)
    return _f32(bias)


def _ptr(t):
    return None if t is None else t.data_ptr()


# ---- syncbn::batch_norm_train ------------------------------------------------------------
def _train_alloc(x):
    return torch.empty_like(x), x.new_empty((2, x.shape[1]), dtype=torch.float32)


def _train_kernel(x, weight, bias, running_mean, running_var, nbt, eps, momentum, comm):
    _check_train(x, weight, bias, running_mean, running_var, nbt)
    c = _comm(comm, x, "batch_norm_train")
    x, layout = _dense(x)
    y, stats = _train_alloc(x)
    rm, rv, nb = _buffers(running_mean, running_var, nbt)
    sp = stats.data_ptr()
    w32, b32 = _f32(weight), _f32_bias(weight, bias)  # converted copies live until the call is done
    _call_comm(c, _fwd_c, "syncbn.batch_norm_train (sbnForwardTrain)", _desc(x, layout), x.data_ptr(),
               y.data_ptr(), _ptr(w32), _ptr(b32), _ptr(rm), _ptr(rv), _ptr(nb), sp, sp + 4 * stats.stride(0),
               _param(eps, momentum), _stream(x))
    _write_back(running_mean, rm, running_var, rv, nbt, nb)
    return y, stats


def _buffers(running_mean, running_var, nbt):
    """The running statistics as float32 and contiguous and num_batches_tracked contiguous,
    as the library writes them (converted copies where they are not)."""
    nb = nbt.contiguous() if nbt is not None and not nbt.is_contiguous() else nbt
    return _f32(running_mean), _f32(running_var), nb


def _write_back(running_mean, rm, running_var, rv, nbt, nb):
    """The converted copies of _buffers written back, each on its own."""
    if rm is not running_mean:
        running_mean.copy_(rm)
    if rv is not running_var:
        running_var.copy_(rv)
    if nb is not nbt:
        nbt.copy_(nb)


def _train_fake(x, weight, bias, running_mean, running_var, nbt, eps, momentum, comm):
    _check_train(x, weight, bias, running_mean, running_var, nbt)
    x, layout = _dense(x)
    return _train_alloc(x)


# ---- syncbn::batch_norm_backward ---------------------------------------------------------
def _check_backward(dy, x, weight, stats):
    who = "batch_norm_backward"
    _check_input(x, who)
    _same_device(x, "grad_out", dy, who)
    _same_device(x, "stats", stats, who)
    _vectors(x, who, ("weight",), (weight,))
    if dy.shape != x.shape or dy.dtype != x.dtype:
        raise RuntimeError(f"syncbn.{who}: grad_out is {dy.dtype} {tuple(dy.shape)}; the input is "
                           f"{x.dtype} {tuple(x.shape)}")
    if stats.shape != (2, x.shape[1]) or stats.dtype != torch.float32:
        raise RuntimeError(f"syncbn.{who}: stats must be float32 (2, {x.shape[1]}) (the forward's), got "
                           f"{stats.dtype} {tuple(stats.shape)}")


def _backward_alloc(x, weight, input_grad, weight_grad):
    dx = torch.empty_like(x) if input_grad else x.new_empty((0,))
    dwb = x.new_empty((2, x.shape[1]) if weight_grad and weight is not None else (0,), dtype=torch.float32)
    return dx, dwb


def _like_x(dy, layout, x):
    return dy.contiguous(memory_format=_channels_last(x)) if layout == NHWC else dy.contiguous()


def _backward_kernel(dy, x, weight, stats, eps, comm, input_grad, weight_grad):
    _check_backward(dy, x, weight, stats)
    c = _comm(comm, x, "batch_norm_backward")
    x, layout = _dense(x)
    dy = _like_x(dy, layout, x)
    dx, dwb = _backward_alloc(x, weight, input_grad, weight_grad)
    st = stats if stats.is_contiguous() else stats.contiguous()
    sp = st.data_ptr()
    w32 = _f32(weight)
    if weight_grad and weight is not None:
        dwp = dwb.data_ptr()
        dbp = dwp + 4 * dwb.stride(0)  # a plain int, also under jit.trace (x.shape[1] is a tensor there)
    else:
        dwp = dbp = None
    _call_comm(c, _bwd_c, "syncbn.batch_norm_backward (sbnBackward)", _desc(x, layout), x.data_ptr(),
               dy.data_ptr(), dx.data_ptr() if input_grad else None, _ptr(w32), sp, sp + 4 * st.stride(0), dwp,
               dbp, _param(eps, 0.1), _stream(x))
    return dx, dwb


def _backward_fake(dy, x, weight, stats, eps, comm, input_grad, weight_grad):
    _check_backward(dy, x, weight, stats)
    x, layout = _dense(x)
    return _backward_alloc(x, weight, input_grad, weight_grad)


# ---- syncbn::batch_norm_infer ------------------------------------------------------------
_INFER_VECTORS = ("running_mean", "running_var", "weight", "bias")


def _check_infer(x, running_mean, running_var, weight, bias):
    _check_input(x, "batch_norm_infer")
    _check_infer_args(x, running_mean, running_var, weight, bias, "batch_norm_infer")


def _check_infer_args(x, running_mean, running_var, weight, bias, who):
    """The eval forward's statistics and parameter checks (the plain and the fused
    operator's), after the input's."""
    _vectors(x, who, _INFER_VECTORS, (running_mean, running_var, weight, bias))
    if weight is None and bias is not None:
        raise RuntimeError(f"syncbn.{who}: a bias without a weight (the library takes both or neither)")


def _infer_kernel(x, running_mean, running_var, weight, bias, eps):
    _check_infer(x, running_mean, running_var, weight, bias)
    x, layout = _dense(x)
    y = torch.empty_like(x)
    # converted copies, alive until the call is done
    w32, b32, rm32, rv32 = _f32(weight), _f32_bias(weight, bias), _f32(running_mean), _f32(running_var)
    r = _inf_c(_desc(x, layout), x.data_ptr(), y.data_ptr(), _ptr(w32), _ptr(b32), _ptr(rm32), _ptr(rv32),
               ctypes.c_float(eps), _stream(x))
    if r != 0:
        _raise(r, "syncbn.batch_norm_infer (sbnForwardInference)")
    return y


def _infer_fake(x, running_mean, running_var, weight, bias, eps):
    _check_infer(x, running_mean, running_var, weight, bias)
    x, layout = _dense(x)
    return torch.empty_like(x)


# ---- autograd ----------------------------------------------------------------------------
def _bump(rm, rv, nbt):
    """Version counters of the tensors the library wrote in place (autograd's check that
    a tensor saved for a backward was not modified since); inference tensors have none."""
    if rm is not None:
        _increment_version((rm, rv) if nbt is None else (rm, rv, nbt))
    elif nbt is not None:
        _increment_version((nbt,))


try:  # one call for a tuple (torch >= 2.5); older: one per tensor, as increment_version did
    _increment_version = torch._C._increment_version
    _increment_version((torch.zeros(1), torch.zeros(1)))
except (AttributeError, TypeError, RuntimeError):
    def _increment_version(ts):
        for t in ts:
            torch.autograd.graph.increment_version(t)


def _save(ctx, *tensors):
    """ctx.save_for_backward of the tensors that are not None, and where they stand
    (ctx.kept, a bit per slot): _saved gives the slots back. No None is saved: compiled
    autograd under saved_tensors_hooks drops a saved None and shifts the tensors after it."""
    ctx.save_for_backward(*(t for t in tensors if t is not None))
    ctx.kept = sum(1 << i for i, t in enumerate(tensors) if t is not None)


def _saved(ctx, n):
    """The n slots that _save saved, None where it had None."""
    it = iter(ctx.saved_tensors)
    return tuple(next(it) if ctx.kept >> i & 1 else None for i in range(n))


def _compiled_key(ctx):
    """The autograd.Functions' _compiled_autograd_key: PyTorch's (the function's id) and
    which saved slots hold a tensor. Compiled autograd's cache key does not tell a None
    from a tensor under saved_tensors_hooks, so without it a fused in-place layer's
    (None, out, ...) would be taken for a leaky one's (x, out, ..., None, ...)."""
    return (ctx._autograd_function_id, ctx.kept)


# Whether a tensor is one of autograd.grad(is_grads_batched=True)'s (the legacy vmap's
# batched tensors, which have no storage: a kernel cannot take their addresses).
_legacy_batched = getattr(torch._C._functorch, "is_legacy_batchedtensor", lambda t: False)
_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)


def _traced(kernel, op, dy):
    """What a backward calls with the incoming gradient dy: the kernel, or the operator `op`
    where dynamo traces the backward (compiled autograd over an eager forward: a kernel is
    opaque to it, the operator has a fake kernel) or where dy is batched
    (autograd.grad(is_grads_batched=True), torch.autograd.functional.jacobian(vectorize=True);
    torch.func.vmap over autograd.grad, whose dy is a functorch wrapper: the dispatcher runs
    the operator once per gradient; a kernel would take the address of a tensor that has no
    storage). is_compiling() first: dynamo cannot trace the two functorch checks."""
    return op if op is not None and (torch.compiler.is_compiling() or _legacy_batched(dy) or _wrapped(dy)) else kernel


_NOT_TWICE = ("syncbn.torch.SyncBatchNorm's backward is not differentiable (no double backward through it: "
              "a second derivative of a training layer, through create_graph=True or nested torch.func "
              "transforms)")


class _NotTwice(torch.autograd.Function):
    """A create_graph backward's gradients, unchanged (shallow aliases), on a node whose
    edges are what the backward was computed from (its incoming gradient, x or the saved
    output, the weight: the C++ nodes' edges), so that a second derivative taken to any of
    those (torch.autograd.grad's inputs=, a Hessian) reaches it and raises."""

    @staticmethod
    def forward(ctx, n, *tensors):
        return tuple(None if t is None else t.detach() for t in tensors[:n])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(_NOT_TWICE)


def _anchor(ctx, *tensors):
    """What a backward computed its gradients from, besides the incoming gradient (its
    saved tensors as it unpacked them: x or the saved output, the weight), for
    _once_differentiable's node; kept on ctx until the backward returns."""
    ctx.anchors = tensors


def _once_differentiable(fn):
    """torch.autograd.function.once_differentiable with the layer's words, as the C++
    operators' nodes say them: under create_graph, where the incoming gradient or what the
    C++ nodes look at requires grad (ctx.twice, set by the forward: x or the weight; the
    in-place layer's saved output, always), the gradients get a node that raises when
    they are differentiated, instead of a second derivative that leaves this backward
    out. The node's edges are the incoming gradients and what the backward gave _anchor
    (the saved tensors are not unpacked twice: non-reentrant checkpointing refuses that);
    where none of those requires grad, fresh leaves (PyTorch's once_differentiable)."""

    @functools.wraps(fn)
    def wrapper(ctx, *grads):
        try:
            with torch.no_grad():
                outputs = fn(ctx, *grads)
        finally:
            anchors = getattr(ctx, "anchors", ())
            ctx.anchors = ()  # not kept with the graph (the in-place layer's saved output: a cycle)
        if not torch.is_grad_enabled():
            return outputs
        if not (ctx.twice or any(isinstance(g, torch.Tensor) and g.requires_grad for g in grads)):
            return outputs
        edges = [t for t in grads + tuple(anchors) if isinstance(t, torch.Tensor) and t.requires_grad]
        if edges:
            return _NotTwice.apply(len(outputs), *outputs, *edges)
        err = torch._C._functions.DelayedError(_NOT_TWICE.encode(), len(outputs))
        return err(*[None if t is None else t.detach().requires_grad_() for t in outputs])

    return wrapper


def _not_twice(outputs, inputs):
    """The backward operators' gradients where the op's inputs require grad (called with
    create_graph=True, or under torch.func's grad transforms): on _NotTwice's node, whose
    edges are those inputs, as the C++ operators' Autograd kernels give them
    (once_differentiable); a second derivative raises there."""
    if not torch.is_grad_enabled():
        return outputs
    edges = [t for t in inputs if t is not None and t.requires_grad]
    if not edges:
        return outputs
    return _NotTwice.apply(len(outputs), *outputs, *edges)


def _twice(x, weight):
    """Whether a create_graph backward's gradients get _once_differentiable's node, as far as
    the forward's tensors say (the C++ nodes' condition): x or the weight requires grad."""
    return x.requires_grad or (weight is not None and weight.requires_grad)


def _refusals(who, rm, rv, *ts):
    """What the autograd kernels refuse before the call (so that nothing is written), as the
    C++ operators' no_stats_grad and no_forward_ad do: a running statistic that requires
    grad, with grad mode on (never differentiable: nn.BatchNorm's native_batch_norm refuses
    it; its gradient was silently None); a dual tensor among ts (forward-mode AD has no
    formula here: PyTorch's generic NotImplementedError came after the forward had run and
    written the running statistics). Not in the autograd.Functions' forward: grad mode is
    off there, and the forward would have run before their jvp."""
    if torch.is_grad_enabled() and ((rm is not None and rm.requires_grad) or (rv is not None and rv.requires_grad)):
        name = "running_mean" if rm is not None and rm.requires_grad else "running_var"
        raise RuntimeError(f"syncbn.{who} is not differentiable with respect to argument '{name}' (as "
                           "nn.BatchNorm's native_batch_norm is not): this input cannot have requires_grad True")
    if _fwad._current_level >= 0 and any(t is not None and _fwad.unpack_dual(t).tangent is not None for t in ts):
        raise RuntimeError(f"syncbn.{who}: forward-mode AD (jvp, dual tensors) is not implemented")


def _forward_call(fn, below, args):
    """fn(*args): dispatched past autograd when `below` (the operators, called from their
    Autograd kernel), else as it is (the kernels, from the layer's eager calls)."""
    if below:
        with torch._C._AutoDispatchBelowAutograd():
            return fn(*args)
    return fn(*args)


def _weight_grads(dwb, weight, need_w, need_b):
    """dweight and dbias from the backward's (2, C) float32 dwb (None: not computed), in
    the weight's dtype, each where it is needed (else None)."""
    if dwb is None:
        return None, None
    if weight.dtype != torch.float32:
        dwb = dwb.to(weight.dtype)
    return dwb[0] if need_w else None, dwb[1] if need_b else None


def _kept_comm(comm, x):
    """The Comm of id `comm`, for an autograd node to keep while its backward may call it
    (Comm._end): none for a node of fake tensors (torch.compile's tracing, whose graph keeps
    them: a team it kept would outlive its process group, and no backward of it runs)."""
    return Comm._by_id.get(comm) if type(x) is torch.Tensor or not _is_fake(x) else None  # (is_fake: ~2 us)


def _train_function(train, backward, below, traced_backward=None):
    """The autograd.Function of batch_norm_train over `train` and `backward` (the
    operators, inside the Autograd kernel: `below` dispatches past autograd; or their
    kernels, for the layer's eager calls, with the backward operator `traced_backward`
    where dynamo traces the backward: _traced)."""

    class TrainFn(torch.autograd.Function):
        _compiled_autograd_key = staticmethod(_compiled_key)

        @staticmethod
        def forward(ctx, x, weight, bias, running_mean, running_var, nbt, eps, momentum, comm):
            y, stats = _forward_call(train, below, (x, weight, bias, running_mean, running_var, nbt, eps, momentum,
                                                    comm))
            _save(ctx, x, weight, stats)
            ctx.eps, ctx.comm = eps, comm
            ctx.comm_kept = _kept_comm(comm, x)
            ctx.twice = _twice(x, weight)
            ctx.mark_non_differentiable(stats)
            return y, stats

        @staticmethod
        @_once_differentiable  # the library's backward is not differentiable
        def backward(ctx, dy, _dstats):
            x, weight, stats = _saved(ctx, 3)
            _anchor(ctx, x, weight)
            need = ctx.needs_input_grad
            want_w = weight is not None and (need[1] or need[2])
            dx, dwb = _traced(backward, traced_backward, dy)(dy, x, weight, stats, ctx.eps, ctx.comm, need[0],
                                                             want_w)
            dw, db = _weight_grads(dwb if want_w else None, weight, need[1], need[2])
            return dx if need[0] else None, dw, db, None, None, None, None, None, None

    return TrainFn


def _infer_function(infer, below):
    """The autograd.Function of batch_norm_infer over `infer` (as _train_function); its
    backward with torch ops (the running statistics are constants: a local gradient)."""

    class InferFn(torch.autograd.Function):
        _compiled_autograd_key = staticmethod(_compiled_key)

        @staticmethod
        def forward(ctx, x, running_mean, running_var, weight, bias, eps):
            y = _forward_call(infer, below, (x, running_mean, running_var, weight, bias, eps))
            _save(ctx, x, running_mean, running_var, weight)
            ctx.eps = eps
            return y

        @staticmethod
        def backward(ctx, dy):
            x, rm, rv, w = _saved(ctx, 4)
            need = ctx.needs_input_grad
            dx, gw, gb = _infer_grads(dy.float(), x, rm, rv, w, ctx.eps, need[0], w is not None and need[3],
                                      w is not None and need[4])
            dx, gw, gb = _grads_require_grad((dx, gw, gb), dy, x, w)
            return dx, None, None, gw, gb, None

    return InferFn


def _grads_require_grad(grads, *sources):
    """An evaluated layer's gradients (its backward: torch ops, differentiable) where the
    backward builds a graph (create_graph=True) from a source that requires grad: each
    requires grad, as nn.BatchNorm's do (the outputs of its double backward's node, whose
    inputs are the incoming gradient, x and the weight). One computed from none of those
    (the weight's and the bias's gradients of a constant incoming gradient, x without
    grad) is then a fresh leaf, an alias: a second derivative taken from it reaches no
    input, as PyTorch's ('appears to not have been used in the graph'), where it raised
    that it 'does not require grad' (a gradient penalty on a frozen layer's weights).
    Where no source requires grad, as they are (PyTorch's do not require grad either).
    Under a torch.func transform, or with batched gradients (is_grads_batched), as they
    are too: requires_grad sees one level only there, and a fresh leaf would cut an outer
    level's graph (jacrev of jacrev gave zeros), or has no batching rule (detach)."""
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in sources):
        return grads
    if _transforms() or any(t is not None and (_legacy_batched(t) or _wrapped(t)) for t in grads + sources):
        return grads
    return tuple(t if t is None or t.requires_grad else t.detach().requires_grad_() for t in grads)


def _infer_grads(g, x, rm, rv, w, eps, need_x, need_w, need_b):
    """The eval batch norm's gradients (dx, dweight, dbias), with torch ops, for g (float32):
    the gradient reaching the normalization; the running statistics are constants, so they
    are local. Each only when asked for (else None). The plain and the fused operator's."""
    shape = [1, -1] + [1] * (x.dim() - 2)
    dims = [0] + list(range(2, x.dim()))
    scale = torch.rsqrt(rv.float() + eps)
    dx = gw = gb = None
    if need_x:
        k = scale if w is None else scale * w.float()
        dx = (g * k.view(shape)).to(x.dtype)
    if need_w:
        xhat = (x.float() - rm.float().view(shape)) * scale.view(shape)
        gw = (g * xhat).sum(dims).to(w.dtype)
    if need_b:
        gb = g.sum(dims).to(w.dtype)
    return dx, gw, gb


def _autograd_kernels(train, backward, infer):
    """The Autograd kernels of the operators `train`, `backward`, `infer` (one
    namespace's): autograd.Functions that dispatch past autograd to them."""
    train_fn = _train_function(train, backward, below=True)
    infer_fn = _infer_function(infer, below=True)

    def train_autograd(x, weight, bias, running_mean, running_var, nbt, eps, momentum, comm):
        _refusals("batch_norm_train", running_mean, running_var, x, weight, bias)
        out = train_fn.apply(x, weight, bias, running_mean, running_var, nbt, eps, momentum, comm)
        _bump(running_mean, running_var, nbt)
        return out

    def backward_autograd(dy, x, weight, stats, eps, comm, input_grad, weight_grad):
        with torch._C._AutoDispatchBelowAutograd():
            out = backward(dy, x, weight, stats, eps, comm, input_grad, weight_grad)
        return _not_twice(out, (dy, x, weight))

    def infer_autograd(x, running_mean, running_var, weight, bias, eps):
        _refusals("batch_norm_infer", running_mean, running_var, x, weight, bias)
        return infer_fn.apply(x, running_mean, running_var, weight, bias, eps)

    return {"batch_norm_train": train_autograd, "batch_norm_backward": backward_autograd,
            "batch_norm_infer": infer_autograd}


# Whether a torch.func transform is active (vmap, grad, ...: any argument may be its
# tensor, x or only the parameters, as an ensemble's vmap over stacked parameters with one
# shared input): the Python operators' eager calls then take the operator, whose vmap rule
# and autograd the transforms know (autograd.Function.apply of the kernels has no vmap
# rule); the C++ operators' eager calls enter the dispatcher anyway. ~35 ns.
_transforms = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)


def train_eager(x, weight, bias, running_mean, running_var, nbt, eps, momentum, comm):
    """batch_norm_train's output `out` by the Python kernels without the dispatcher (the
    layer's eager calls on plain tensors: the same kernels and autograd, ~8 us less host
    time); the C++ operators' own below."""
    if _transforms():
        return batch_norm_train(x, weight, bias, running_mean, running_var, nbt, eps, momentum, comm)[0]
    _refusals("batch_norm_train", running_mean, running_var, x, weight, bias)
    y = _TrainEager.apply(x, weight, bias, running_mean, running_var, nbt, eps, momentum, comm)[0]
    _bump(running_mean, running_var, nbt)
    return y


def infer_eager(x, running_mean, running_var, weight, bias, eps):
    """batch_norm_infer by its kernel without the dispatcher (as train_eager)."""
    if _transforms():
        return batch_norm_infer(x, running_mean, running_var, weight, bias, eps)
    _refusals("batch_norm_infer", running_mean, running_var, x, weight, bias)
    return _InferEager.apply(x, running_mean, running_var, weight, bias, eps)


# ---- registration ------------------------------------------------------------------------
_SCHEMAS = {
    "batch_norm_train": "(Tensor input, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
                        "Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked, float eps, float? momentum, "
                        "int comm) -> (Tensor out, Tensor stats)",
    "batch_norm_backward": "(Tensor grad_out, Tensor input, Tensor? weight, Tensor stats, float eps, int comm, "
                           "bool input_grad, bool weight_grad) -> (Tensor grad_input, Tensor grad_weight_bias)",
    "batch_norm_infer": "(Tensor input, Tensor running_mean, Tensor running_var, Tensor? weight, Tensor? bias, "
                        "float eps) -> Tensor",
}
_KERNELS = {  # each operator's kernel (CPU and CUDA) and fake kernel
    "batch_norm_train": (_train_kernel, _train_fake),
    "batch_norm_backward": (_backward_kernel, _backward_fake),
    "batch_norm_infer": (_infer_kernel, _infer_fake),
}


def _define(lib, schemas, kernels, autograd_kernels, drop=()):
    """Defines the operators of `schemas` (name -> schema) in lib's namespace, pt2-compliant,
    each with its kernel (CPU and CUDA) and fake kernel from `kernels` (name -> (kernel,
    fake)), then the Autograd kernels autograd_kernels(*ops) gives; `drop` ("fake",
    "autograd") leaves those out (the tests' mutants, in namespaces of their own). Returns
    the operators' default overloads in the order of `schemas`. The plain operators' and
    the fused ones' (_fused.py) registration."""
    for name, schema in schemas.items():
        lib.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
        kernel, fake = kernels[name]
        lib.impl(name, kernel, "CPU")
        lib.impl(name, kernel, "CUDA")
        if "fake" not in drop:
            torch.library.register_fake(f"{lib.ns}::{name}", fake, lib=lib)
    ns = getattr(torch.ops, lib.ns)
    ops = tuple(getattr(ns, name).default for name in schemas)
    if "autograd" not in drop:
        for name, kernel in autograd_kernels(*ops).items():
            lib.impl(name, kernel, "Autograd")
    return ops


def _register(lib, drop=()):
    """The plain operators in lib's namespace (_define); the operators (train, backward,
    infer)."""
    return _define(lib, _SCHEMAS, _KERNELS, _autograd_kernels, drop)


_VMAP_TRAIN = ("syncbn.torch.SyncBatchNorm in training under torch.func.vmap: not supported (each call's "
               "batch statistics are one collective over the layer's team, which vmap's instances cannot "
               "each have); vmap the layer in eval, or call it once per instance")


def _vmap_refused(op):
    """The vmap rule of a training operator: a NotImplementedError that says why
    (functorch's own, "Batching rule not implemented for syncbn::...", named no layer)."""
    def rule(info, in_dims, *args):
        raise NotImplementedError(f"{op._name}: {_VMAP_TRAIN}")
    return rule


def _vmap_infer(op, per_element):
    """The vmap rule of an inference operator (a per-element formula with per-channel
    tensors): where only the per-element tensors (positions `per_element`: x, and the
    fused operator's z) are batched and an instance's are in one memory format (as the
    operator takes them), one call with the instances as more batch (the instance
    dimension merged into N; a merge that copies gives both tensors x's format); else one
    call per instance, the outputs stacked (what the operator refuses for an instance, it
    refuses there)."""
    def one(t, d, k):
        return t.select(d, k) if d is not None else t

    def rule(info, in_dims, *args):
        B, a = info.batch_size, list(args)
        pe = [i for i in per_element if a[i] is not None]
        merge = all(d is None for i, d in enumerate(in_dims) if i not in per_element)
        if merge and len(pe) > 1 and B > 0:
            fmts = {_read_format(one(a[i], in_dims[i], 0))[0] for i in pe}
            merge = len(fmts) == 1
        if not merge:
            if B == 0:  # no instance: nothing to call, an empty stack of x's instances' shape
                x, d = a[pe[0]], in_dims[pe[0]]
                shape = x.shape if d is None else x.shape[:d % x.dim()] + x.shape[d % x.dim() + 1:]
                return x.new_empty((0, *shape)), 0
            return torch.stack([op(*[one(t, d, k) for t, d in zip(args, in_dims)]) for k in range(B)]), 0
        n = None
        for i in pe:
            t = a[i].movedim(in_dims[i], 0) if in_dims[i] is not None else a[i].expand(B, *a[i].shape)
            n = t.shape[1]
            a[i] = t.flatten(0, 1)  # a copy where it cannot be a view: contiguous then
        fmt = _read_format(a[pe[0]])[0]
        for i in pe[1:]:
            if not a[i].is_contiguous(memory_format=fmt):
                a[i] = a[i].contiguous(memory_format=fmt)
        return op(*a).unflatten(0, (B, n)), 0
    return rule


def register_vmap(lib, train, infer, per_element):
    """vmap rules for the training operator `train` (refused, saying why) and the
    inference one `infer` (_vmap_infer), registered through lib (where PyTorch has
    torch.library.register_vmap)."""
    if hasattr(torch.library, "register_vmap"):
        torch.library.register_vmap(train, _vmap_refused(train), lib=lib)
        torch.library.register_vmap(infer, _vmap_infer(infer, per_element), lib=lib)


def _library_error(e):
    """The SyncBNError (SyncBNValueError) that the C++ operators' error e stands for: its
    text is SyncBNError's, "<what>: <detail> [<result name>]"; e itself when it is not a
    failed library call (an argument check's TypeError, ...)."""
    m = _LIBRARY_ERROR.match(str(e))
    if m is None or m.group(3) not in _RESULT_CODES:
        return e
    what, detail, name = m.groups()
    cls = SyncBNValueError if detail.startswith(_VALUE_ERRORS) else SyncBNError
    return cls(_RESULT_CODES[name], what, detail)


# what, detail, result name; then the end, or C++'s stack trace (TORCH_SHOW_CPP_STACKTRACES=1)
_LIBRARY_ERROR = re.compile(r"(syncbn\.[A-Za-z_]+(?: \(sbn[A-Za-z]+\))?): (.*?) \[(sbn[A-Za-z]+)\](?:$|\n)", re.S)
_RESULT_CODES = {n: code for code in range(1, 64) if (n := _capi.result_name(code)).startswith("sbn")}


def _native_eager(op):
    """The layer's eager call of a C++ operator: its C++ entry point without
    OpOverload's Python __call__, and a failed library call raised as SyncBNError (as the
    Python kernels raise it)."""
    call = op._op

    def eager(*args):
        try:
            return call(*args)
        except (RuntimeError, ValueError) as e:
            raise _library_error(e) from None

    return eager


def _native_ops(ns, lib, fake=True):
    """The C++ operators of namespace ns (train, backward, infer), with the fake kernels
    registered on them through lib unless not `fake` (a test's mutant)."""
    if fake:
        for name, (_, fake_kernel) in _KERNELS.items():
            torch.library.register_fake(f"{ns}::{name}", fake_kernel, lib=lib)
    n = getattr(torch.ops, ns)
    return n.batch_norm_train.default, n.batch_norm_backward.default, n.batch_norm_infer.default


NATIVE, NATIVE_WHY = _native.load()  # the C++ operators, or why not (then the Python ones)
if NATIVE is not None:
    with Comm._native_lock:
        Comm._native = NATIVE  # comms made from now on are handed over to the operators ...
        for _c in list(Comm._by_id.values()):  # ... and those alive already
            if _c._h.value:
                NATIVE.comm_put(_c)
    _lib = torch.library.Library(NS, "FRAGMENT")
    batch_norm_train, batch_norm_backward, batch_norm_infer = _native_ops(NS, _lib)
    _train_native = _native_eager(batch_norm_train)
    infer_eager = _native_eager(batch_norm_infer)

    def train_eager(x, weight, bias, running_mean, running_var, nbt, eps, momentum, comm):
        """batch_norm_train's output `out` (the layer's eager calls)."""
        return _train_native(x, weight, bias, running_mean, running_var, nbt, eps, momentum, comm)[0]
else:
    if NATIVE_WHY != "SYNCBN_TORCH_NATIVE=0":
        warnings.warn(f"syncbn.torch: the C++ operators are not available ({NATIVE_WHY}); using the Python "
                      "ones: the same results, with ~12-15 us more host time per forward and ~45 us per backward "
                      "(SYNCBN_TORCH_NATIVE=0 silences this)", RuntimeWarning, stacklevel=2)
    _lib = torch.library.Library(NS, "DEF")
    batch_norm_train, batch_norm_backward, batch_norm_infer = _register(_lib)
    _TrainEager = _train_function(_train_kernel, _backward_kernel, below=False, traced_backward=batch_norm_backward)
    _InferEager = _infer_function(_infer_kernel, below=False)
register_vmap(_lib, batch_norm_train, batch_norm_infer, (0,))

# the fused operators (batch norm + activation + residual; syncbn._fused): Python kernels
# with either kind of plain operators, in the same namespace
# (it imports this module's helpers and registers them into _lib; imported first, it finds
# this module whole: hence the names below are looked up there when asked for)
from . import _fused  # noqa: E402,F401


def __getattr__(name):
    if name in ("batch_norm_act_train", "batch_norm_act_backward", "batch_norm_act_infer"):
        return getattr(_fused, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["batch_norm_train", "batch_norm_backward", "batch_norm_infer", "batch_norm_act_train",
           "batch_norm_act_backward", "batch_norm_act_infer", "SyncBNError"]
