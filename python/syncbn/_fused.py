"""syncbn's fused operators in PyTorch's dispatcher: batch norm + activation (+ residual)
in one op, y = act(batch_norm(x) + z), over the library's sbnForwardTrainEx,
sbnBackwardEx and sbnForwardInferenceEx (every team: CPU teams, and GPU teams' kernels
with the epilogue).

    syncbn::batch_norm_act_train(Tensor input, Tensor? residual, Tensor? weight,
        Tensor? bias, Tensor(a!)? running_mean, Tensor(b!)? running_var,
        Tensor(c!)? num_batches_tracked, float eps, float? momentum, int comm,
        int activation, float slope, bool inplace) -> (Tensor out, Tensor stats)
    syncbn::batch_norm_act_backward(Tensor grad_out, Tensor? input, Tensor? out,
        Tensor? weight, Tensor? bias, Tensor stats, float eps, int comm, int activation,
        float slope, bool input_grad, bool residual_grad, bool weight_grad,
        bool no_residual=False, Tensor? residual=None)
        -> (Tensor grad_input, Tensor grad_residual, Tensor grad_weight_bias)
    syncbn::batch_norm_act_infer(Tensor input, Tensor? residual, Tensor running_mean,
        Tensor running_var, Tensor? weight, Tensor? bias, float eps, int activation,
        float slope) -> Tensor

``activation``: 0 identity, 1 ReLU, 2 leaky ReLU with negative slope ``slope`` (syncbn's
IDENTITY, RELU, LEAKY_RELU). The conventions are the plain operators' (syncbn._ops):
``comm`` a Comm's id, stats (2, C) float32 (mean, invstd), grad_weight_bias (2, C) float32,
empty tensors for the gradients not asked for, out in the input's memory format. The
residual must have the input's shape, dtype, device and memory format (the library reads
both in one layout); anything else is refused with an error naming it.

``no_residual`` (the backward op) is sbnEpilogue_t's: the caller's promise that the forward
that made ``out`` had no residual and that ``weight`` and ``bias`` are that forward's own
(the library cannot check it). A ReLU or leaky ReLU backward given the input then takes
the activation's mask from the input (the sign of the forward's batch_norm(x), y read only
where that sign is in doubt): the same gradients, fewer bytes read. The bias is then read
(a weight without a bias: 0, as in the forward), so a wrong one gives wrong gradients. The
Autograd kernels pass it for a forward without a residual (ReLU, leaky ReLU, not in
place), and keep the bias for it.

``inplace`` (the train op) asks for the in-place backward: its Autograd kernel saves
``out`` (not the input), and the backward recovers x - mean from out, weight and bias
(inplace_abn's rule; accuracy: bench/notes/tolerances.md). That needs an invertible
activation (identity, or leaky ReLU with slope > 0): ReLU and a slope of 0 are refused
with an error naming them. With a residual it saves the residual too, and the backward
recovers x - mean from out and the residual (sbnBackwardInPlaceEx): a residual block's
input, which its first convolution keeps anyway, so nothing is kept for x. The backward
op takes input None for it, and ``residual`` the forward's residual (only then: with the
input it is refused). The forward never writes over its input: out is a new tensor (the memory saved is
what autograd keeps, not the forward's transient one).

Their kernels and autograd come in the plain operators' two kinds, with the same checks
and messages: C++ (csrc/torch_ops.cpp, built and loaded by syncbn._native, with the fake
kernels below registered on them) when the plain ones are C++, else the Python ones here
(ctypes), registered into the same ``syncbn`` namespace.
"""

import ctypes
import math

import torch

from . import IDENTITY, LEAKY_RELU, NCHW, NHWC, RELU, _capi, _ops, _raise
from ._ops import (_buffers, _bump, _call_comm, _check_infer_args, _check_input, _check_train_args, _comm,
                   _dense, _desc, _f32, _f32_bias, _infer_grads, _like_x, _param, _ptr, _read_format,
                   _same_device, _stream, _vectors, _write_back)

_LIB = _capi.lib
_fwdx_c, _bwdx_c, _infx_c = _LIB.sbnForwardTrainEx, _LIB.sbnBackwardEx, _LIB.sbnForwardInferenceEx
_bwdip_c = _LIB.sbnBackwardInPlaceEx
_byref = ctypes.byref

ACTIVATIONS = {"identity": IDENTITY, "relu": RELU, "leaky_relu": LEAKY_RELU}
_ACT_NAMES = {v: k for k, v in ACTIVATIONS.items()}

_epilogues = {}


def _epi(activation, slope, no_residual=False):
    key = (activation, slope, no_residual)
    e = _epilogues.get(key)
    if e is None:
        if len(_epilogues) > 256:
            _epilogues.clear()
        e = _epilogues[key] = _byref(_capi.Epilogue.make(activation, slope, no_residual))
    return e


# ---- argument checks: the same in the real kernels and the fake ones ----------------------
_FLT_MIN = 1.1754943508222875e-38  # float32's smallest normal number


def slope32(slope):
    """The slope as the library takes it, a float32 (1e39 is inf there, 1e-320 is 0)."""
    return ctypes.c_float(slope).value if math.isfinite(slope) else slope


def takes_slope(slope):
    """Whether the library takes the slope: finite and >= 0 as a float32."""
    s = slope32(slope)
    return math.isfinite(s) and s >= 0


def check_activation(activation, slope, inplace, who):
    """Refuses an unknown activation, a negative or non-finite slope, and what the
    in-place backward cannot do (ReLU, slope 0 or below FLT_MIN), naming it
    (ValueError)."""
    if activation not in _ACT_NAMES:
        raise ValueError(f"{who}: activation {activation!r}: 0 (identity), 1 (relu) or 2 (leaky_relu)")
    if not takes_slope(slope):
        raise ValueError(f"{who}: slope {slope}: leaky ReLU's negative slope must be finite and >= 0 (as a float32)")
    if inplace:
        if activation == RELU:
            raise ValueError(f"{who}: the in-place mode cannot take ReLU: ReLU is not invertible (its output "
                             "loses x where it is 0, and the in-place backward recovers x from the output); "
                             "use leaky_relu with a slope > 0, or inplace=False")
        if activation == LEAKY_RELU and slope32(slope) == 0:
            raise ValueError(f"{who}: the in-place mode cannot take leaky_relu with slope 0 (that is ReLU: not "
                             "invertible); use a slope > 0, or inplace=False")
        if activation == LEAKY_RELU and slope32(slope) < _FLT_MIN:
            raise ValueError(f"{who}: the in-place mode cannot take leaky_relu with slope {slope}: below float32's "
                             "smallest normal number (slope * v loses x's bits, and the in-place backward's "
                             "1 / slope overflows below ~2.9e-39); use a larger slope, or inplace=False")


def residual_like(z, x):
    """z as the fused ops take it as x's residual, where `x += z` takes it (a fused
    block's identity): x's shape (expanded where it broadcasts to it, as from a downsample
    that pools to 1x1: autograd sums the gradient back; what does not broadcast raises, as
    += does), x's dtype (autocast's fp32 block input against a bf16 conv output: rounded
    once more), and dense in the layout the library reads x in (z itself where it is
    already)."""
    if z.shape != x.shape:
        z = z.expand_as(x)
    if z.dtype != x.dtype:
        z = z.to(x.dtype)
    fmt = _read_format(x)[0]
    return z if z.is_contiguous(memory_format=fmt) else z.contiguous(memory_format=fmt)


# under torch.fx symbolic tracing (a fused block traced through): one call_function node,
# the conversion decided when the traced module runs
torch.fx.wrap("residual_like")


def _format_name(t):
    fmt, dense = _read_format(t)
    if not dense:
        return f"strided {tuple(t.stride())} (neither contiguous nor channels_last)"
    return "contiguous" if fmt is torch.contiguous_format else "channels_last"


def _check_residual(x, z, who, base="input"):
    """z against x, named `base` in the messages (the input; the in-place backward's out)."""
    if z is None:
        return
    _same_device(x, "residual", z, who)
    if z.shape != x.shape:
        raise RuntimeError(f"syncbn.{who}: the residual has shape {tuple(z.shape)} and the {base} "
                           f"{tuple(x.shape)}: they must be equal")
    if z.dtype != x.dtype:
        raise TypeError(f"syncbn.{who}: the residual is {z.dtype} and the {base} {x.dtype}: they must be equal")
    fmt = _read_format(x)[0]
    if not z.is_contiguous(memory_format=fmt):
        read = "contiguous" if fmt is torch.contiguous_format else "channels_last"
        raise RuntimeError(f"syncbn.{who}: the residual's memory format ({_format_name(z)}) differs from the "
                           f"{base}'s ({read}, as the library reads it): the residual must be {read} too")


def _check_train(x, z, weight, bias, running_mean, running_var, nbt, activation, slope, inplace):
    who = "batch_norm_act_train"
    _check_input(x, who)
    check_activation(activation, slope, inplace, f"syncbn.{who}")
    _check_residual(x, z, who)
    _check_train_args(x, weight, bias, running_mean, running_var, nbt, who)


# ---- syncbn::batch_norm_act_train --------------------------------------------------------
def _train_alloc(x):
    return torch.empty_like(x), x.new_empty((2, x.shape[1]), dtype=torch.float32)


def _train_kernel(x, z, weight, bias, running_mean, running_var, nbt, eps, momentum, comm, activation, slope,
                  inplace):
    _check_train(x, z, weight, bias, running_mean, running_var, nbt, activation, slope, inplace)
    c = _comm(comm, x, "batch_norm_act_train")
    x, layout = _dense(x)
    y, stats = _train_alloc(x)
    rm, rv, nb = _buffers(running_mean, running_var, nbt)
    sp = stats.data_ptr()
    w32, b32 = _f32(weight), _f32_bias(weight, bias)
    _call_comm(c, _fwdx_c, "syncbn.batch_norm_act_train (sbnForwardTrainEx)", _desc(x, layout), x.data_ptr(),
               _ptr(z), y.data_ptr(), _ptr(w32), _ptr(b32), _ptr(rm), _ptr(rv), _ptr(nb), sp,
               sp + 4 * stats.stride(0), _param(eps, momentum), _epi(activation, slope), _stream(x))
    _write_back(running_mean, rm, running_var, rv, nbt, nb)
    return y, stats


def _train_fake(x, z, weight, bias, running_mean, running_var, nbt, eps, momentum, comm, activation, slope,
                inplace):
    _check_train(x, z, weight, bias, running_mean, running_var, nbt, activation, slope, inplace)
    x, _ = _dense(x)
    return _train_alloc(x)


# ---- syncbn::batch_norm_act_backward -----------------------------------------------------
def _check_backward(dy, x, out, weight, bias, stats, activation, slope, residual=None, no_residual=False):
    who = "batch_norm_act_backward"
    base = x if x is not None else out
    if base is None:
        raise RuntimeError(f"syncbn.{who}: input and out are both None (the in-place backward takes out)")
    _check_input(base, who)
    check_activation(activation, slope, x is None, f"syncbn.{who}")
    if residual is not None and x is not None:
        raise RuntimeError(f"syncbn.{who}: a residual is read by the in-place backward only (input None: x "
                           "recovered from out and the residual); with the input, pass residual None")
    if residual is not None and no_residual:
        raise RuntimeError(f"syncbn.{who}: no_residual is True and a residual is given (no_residual says the "
                           "forward had none)")
    _check_residual(base, residual, who, "out")
    if out is None and activation != IDENTITY:
        raise RuntimeError(f"syncbn.{who}: out is None: {_ACT_NAMES[activation]}'s gradient needs the "
                           "forward's output")
    _same_device(base, "grad_out", dy, who)
    _same_device(base, "stats", stats, who)
    _vectors(base, who, ("weight", "bias"), (weight, bias))
    for name, t in (("grad_out", dy), ("out", out)):
        if t is not None and (t.shape != base.shape or t.dtype != base.dtype):
            raise RuntimeError(f"syncbn.{who}: {name} is {t.dtype} {tuple(t.shape)}; the "
                               f"{'input' if x is not None else 'out'} is {base.dtype} {tuple(base.shape)}")
    if out is not None:
        _same_device(base, "out", out, who)
    if stats.shape != (2, base.shape[1]) or stats.dtype != torch.float32:
        raise RuntimeError(f"syncbn.{who}: stats must be float32 (2, {base.shape[1]}) (the forward's), got "
                           f"{stats.dtype} {tuple(stats.shape)}")


def _backward_alloc(base, weight, input_grad, residual_grad, weight_grad):
    dx = torch.empty_like(base) if input_grad else base.new_empty((0,))
    dz = torch.empty_like(base) if residual_grad else base.new_empty((0,))
    dwb = base.new_empty((2, base.shape[1]) if weight_grad and weight is not None else (0,), dtype=torch.float32)
    return dx, dz, dwb


def _backward_kernel(dy, x, out, weight, bias, stats, eps, comm, activation, slope, input_grad, residual_grad,
                     weight_grad, no_residual=False, residual=None):
    _check_backward(dy, x, out, weight, bias, stats, activation, slope, residual, no_residual)
    if x is not None:
        x, layout = _dense(x)
        base = x
    else:
        out, layout = _dense(out)
        base = out
    c = _comm(comm, base, "batch_norm_act_backward")
    dy = _like_x(dy, layout, base)
    if out is not None:
        out = _like_x(out, layout, base)
    dx, dz, dwb = _backward_alloc(base, weight, input_grad, residual_grad, weight_grad)
    st = stats if stats.is_contiguous() else stats.contiguous()
    sp = st.data_ptr()
    w32 = _f32(weight)
    # the bias is read by the in-place backward (x from out) and by the mask from x
    # (no_residual: the sign of the forward's batch_norm(x)); a weight without one: 0
    b32 = _f32_bias(weight, bias) if x is None or no_residual else None
    if weight_grad and weight is not None:
        dwp = dwb.data_ptr()
        dbp = dwp + 4 * dwb.stride(0)  # a plain int, also under jit.trace (x.shape[1] is a tensor there)
    else:
        dwp = dbp = None
    # the in-place backward of a forward with a residual takes (out, residual) where
    # sbnBackwardEx takes (input, out): the same arguments after them
    if residual is not None:
        fn, name, lead = _bwdip_c, "sbnBackwardInPlaceEx", (_ptr(out), residual.data_ptr())
    else:
        fn, name, lead = _bwdx_c, "sbnBackwardEx", (_ptr(x), _ptr(out))
    _call_comm(c, fn, f"syncbn.batch_norm_act_backward ({name})", _desc(base, layout), *lead, dy.data_ptr(),
               dx.data_ptr() if input_grad else None, dz.data_ptr() if residual_grad else None, _ptr(w32), _ptr(b32),
               sp, sp + 4 * st.stride(0), dwp, dbp, _param(eps, 0.1), _epi(activation, slope, no_residual),
               _stream(base))
    return dx, dz, dwb


def _backward_fake(dy, x, out, weight, bias, stats, eps, comm, activation, slope, input_grad, residual_grad,
                   weight_grad, no_residual=False, residual=None):
    _check_backward(dy, x, out, weight, bias, stats, activation, slope, residual, no_residual)
    base, _ = _dense(x if x is not None else out)
    return _backward_alloc(base, weight, input_grad, residual_grad, weight_grad)


# ---- syncbn::batch_norm_act_infer --------------------------------------------------------
def _check_infer(x, z, running_mean, running_var, weight, bias, activation, slope):
    who = "batch_norm_act_infer"
    _check_input(x, who)
    check_activation(activation, slope, False, f"syncbn.{who}")
    _check_residual(x, z, who)
    _check_infer_args(x, running_mean, running_var, weight, bias, who)


def _infer_kernel(x, z, running_mean, running_var, weight, bias, eps, activation, slope):
    _check_infer(x, z, running_mean, running_var, weight, bias, activation, slope)
    x, layout = _dense(x)
    y = torch.empty_like(x)
    w32, b32, rm32, rv32 = _f32(weight), _f32_bias(weight, bias), _f32(running_mean), _f32(running_var)
    r = _infx_c(_desc(x, layout), x.data_ptr(), _ptr(z), y.data_ptr(), _ptr(w32), _ptr(b32), _ptr(rm32),
                _ptr(rv32), ctypes.c_float(eps), _epi(activation, slope), _stream(x))
    if r != 0:
        _raise(r, "syncbn.batch_norm_act_infer (sbnForwardInferenceEx)")
    return y


def _infer_fake(x, z, running_mean, running_var, weight, bias, eps, activation, slope):
    _check_infer(x, z, running_mean, running_var, weight, bias, activation, slope)
    x, _ = _dense(x)
    return torch.empty_like(x)


# ---- autograd ----------------------------------------------------------------------------
def act_grad(g, out, activation, slope):
    """g * act'(out), PyTorch's rules and ops: ReLU's threshold_backward of the result (0
    where out <= 0; NaN passes), leaky ReLU's leaky_relu_backward (slope where out <= 0).
    Differentiable as PyTorch's relu(batch_norm(x) + z) is under create_graph: to g, and to
    out with zeros (a second derivative reaches what out was computed from, the weight and
    the bias included, as PyTorch's does, where a mask left them out of the graph)."""
    if activation == RELU:
        return torch.ops.aten.threshold_backward(g, out.to(g.dtype), 0)
    if activation == LEAKY_RELU:
        # self_is_result False: the same rule (slope where out <= 0), without the in-place
        # form's refusal of a negative slope
        return torch.ops.aten.leaky_relu_backward(g, out.to(g.dtype), slope, False)
    return g


def _train_function(train, backward, below, traced_backward=None):
    """The autograd.Function of batch_norm_act_train over `train` and `backward` (the
    operators, dispatched past autograd when `below`; or their kernels, eagerly, as
    _ops._train_function with `traced_backward`). It saves
    the input and (for an activation) out; in-place: out, and the residual where there is
    one (x comes back from them).
    A ReLU or leaky ReLU forward without a residual (not in place) also saves the bias,
    and its backward passes no_residual (the mask from x, which reads the bias)."""

    class TrainActFn(torch.autograd.Function):
        _compiled_autograd_key = staticmethod(_ops._compiled_key)

        @staticmethod
        def forward(ctx, x, z, weight, bias, running_mean, running_var, nbt, eps, momentum, comm, activation,
                    slope, inplace):
            args = (x, z, weight, bias, running_mean, running_var, nbt, eps, momentum, comm, activation, slope,
                    inplace)
            y, stats = _ops._forward_call(train, below, args)
            # the mask from x: a forward without a residual, of its own weight and bias
            ctx.no_residual = not inplace and activation != IDENTITY and z is None
            if inplace:  # x comes back from out (and the residual: sbnBackwardInPlaceEx)
                _ops._save(ctx, None, y, weight, bias, stats, z)
            elif activation == IDENTITY:  # no mask: out is not needed
                _ops._save(ctx, x, None, weight, None, stats, None)
            else:
                _ops._save(ctx, x, y, weight, bias if ctx.no_residual else None, stats, None)
            ctx.eps, ctx.comm, ctx.activation, ctx.slope = eps, comm, activation, slope
            ctx.comm_kept = _ops._kept_comm(comm, x)
            ctx.twice = inplace or _ops._twice(x, weight)  # in place: the C++ node looks at out, which always does
            ctx.mark_non_differentiable(stats)
            return y, stats

        @staticmethod
        @_ops._once_differentiable
        def backward(ctx, dy, _dstats):
            x, y, weight, bias, stats, z = _ops._saved(ctx, 6)
            _ops._anchor(ctx, x if x is not None else y, weight)
            need = ctx.needs_input_grad
            want_w = weight is not None and (need[2] or need[3])
            dx, dz, dwb = _ops._traced(backward, traced_backward, dy)(dy, x, y, weight, bias, stats, ctx.eps,
                                                                      ctx.comm, ctx.activation, ctx.slope, need[0],
                                                                      need[1], want_w, ctx.no_residual, z)
            dw, db = _ops._weight_grads(dwb if want_w else None, weight, need[2], need[3])
            return (dx if need[0] else None, dz if need[1] else None, dw, db) + (None,) * 9

    return TrainActFn


def _infer_function(infer, below):
    """The autograd.Function of batch_norm_act_infer; its backward with torch ops (the
    running statistics are constants)."""

    class InferActFn(torch.autograd.Function):
        _compiled_autograd_key = staticmethod(_ops._compiled_key)

        @staticmethod
        def forward(ctx, x, z, running_mean, running_var, weight, bias, eps, activation, slope):
            args = (x, z, running_mean, running_var, weight, bias, eps, activation, slope)
            y = _ops._forward_call(infer, below, args)
            _ops._save(ctx, x, y if activation != IDENTITY else None, running_mean, running_var, weight)
            ctx.eps, ctx.activation, ctx.slope = eps, activation, slope
            return y

        @staticmethod
        def backward(ctx, dy):
            x, y, rm, rv, w = _ops._saved(ctx, 5)
            need = ctx.needs_input_grad
            g = act_grad(dy.float(), y, ctx.activation, ctx.slope)
            dx, gw, gb = _infer_grads(g, x, rm, rv, w, ctx.eps, need[0], w is not None and need[4],
                                      w is not None and need[5])
            dz = g.to(x.dtype) if need[1] else None
            # as PyTorch's relu(batch_norm(x) + z): the activation's gradient g (the
            # residual's) is computed from dy and out (threshold_backward's inputs); the
            # batch norm's from g, x and the weight
            dz, = _ops._grads_require_grad((dz,), dy, y)
            dx, gw, gb = _ops._grads_require_grad((dx, gw, gb), dy, y, x, w)
            return dx, dz, None, None, gw, gb, None, None, None

    return InferActFn


def _autograd_kernels(train, backward, infer):
    train_fn = _train_function(train, backward, below=True)
    infer_fn = _infer_function(infer, below=True)

    def train_autograd(x, z, weight, bias, running_mean, running_var, nbt, eps, momentum, comm, activation, slope,
                       inplace):
        _ops._refusals("batch_norm_act_train", running_mean, running_var, x, z, weight, bias)
        out = train_fn.apply(x, z, weight, bias, running_mean, running_var, nbt, eps, momentum, comm, activation,
                             slope, inplace)
        _bump(running_mean, running_var, nbt)
        return out

    def backward_autograd(dy, x, out, weight, bias, stats, eps, comm, activation, slope, input_grad, residual_grad,
                          weight_grad, no_residual=False, residual=None):
        with torch._C._AutoDispatchBelowAutograd():
            grads = backward(dy, x, out, weight, bias, stats, eps, comm, activation, slope, input_grad,
                             residual_grad, weight_grad, no_residual, residual)
        return _ops._not_twice(grads, (dy, x if x is not None else out, weight))

    def infer_autograd(x, z, running_mean, running_var, weight, bias, eps, activation, slope):
        _ops._refusals("batch_norm_act_infer", running_mean, running_var, x, z, weight, bias)
        return infer_fn.apply(x, z, running_mean, running_var, weight, bias, eps, activation, slope)

    return {"batch_norm_act_train": train_autograd, "batch_norm_act_backward": backward_autograd,
            "batch_norm_act_infer": infer_autograd}


# ---- registration ------------------------------------------------------------------------
SCHEMAS = {
    "batch_norm_act_train": "(Tensor input, Tensor? residual, Tensor? weight, Tensor? bias, "
                            "Tensor(a!)? running_mean, Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked, "
                            "float eps, float? momentum, int comm, int activation, float slope, bool inplace) "
                            "-> (Tensor out, Tensor stats)",
    "batch_norm_act_backward": "(Tensor grad_out, Tensor? input, Tensor? out, Tensor? weight, Tensor? bias, "
                               "Tensor stats, float eps, int comm, int activation, float slope, bool input_grad, "
                               "bool residual_grad, bool weight_grad, bool no_residual=False, Tensor? residual=None) "
                               "-> (Tensor grad_input, Tensor grad_residual, Tensor grad_weight_bias)",
    "batch_norm_act_infer": "(Tensor input, Tensor? residual, Tensor running_mean, Tensor running_var, "
                            "Tensor? weight, Tensor? bias, float eps, int activation, float slope) -> Tensor",
}
KERNELS = {
    "batch_norm_act_train": (_train_kernel, _train_fake),
    "batch_norm_act_backward": (_backward_kernel, _backward_fake),
    "batch_norm_act_infer": (_infer_kernel, _infer_fake),
}


def register(lib, drop=(), kernels=None):
    """Defines the fused operators in lib's namespace with their CPU and CUDA kernels,
    fake kernels and Autograd kernels; `drop` ("fake", "autograd") leaves those out, and
    `kernels` replaces some kernels (the tests' mutants, in namespaces of their own).
    Returns the operators (train, backward, infer)."""
    return _ops._define(lib, SCHEMAS, dict(KERNELS, **(kernels or {})), _autograd_kernels, drop)


def native_ops(ns, lib, fake=True):
    """The C++ fused operators of namespace ns (train, backward, infer; csrc/torch_ops.cpp),
    with the fake kernels registered on them through lib unless not `fake` (a test's
    mutant)."""
    if fake:
        for name, (_, fake_kernel) in KERNELS.items():
            torch.library.register_fake(f"{ns}::{name}", fake_kernel, lib=lib)
    n = getattr(torch.ops, ns)
    return n.batch_norm_act_train.default, n.batch_norm_act_backward.default, n.batch_norm_act_infer.default


# the operators, in the namespace of the plain ones: the C++ ones with the C++ plain
# operators (their fake kernels registered into the FRAGMENT library), else Python ones
if _ops.NATIVE is not None:
    batch_norm_act_train, batch_norm_act_backward, batch_norm_act_infer = native_ops(_ops.NS, _ops._lib)
    _train_native = _ops._native_eager(batch_norm_act_train)
    infer_eager = _ops._native_eager(batch_norm_act_infer)

    def train_eager(x, z, weight, bias, running_mean, running_var, nbt, eps, momentum, comm, activation, slope,
                    inplace):
        """batch_norm_act_train's out (the layer's eager calls on plain tensors)."""
        return _train_native(x, z, weight, bias, running_mean, running_var, nbt, eps, momentum, comm, activation,
                             slope, inplace)[0]
else:
    batch_norm_act_train, batch_norm_act_backward, batch_norm_act_infer = register(_ops._lib)
    _TrainEager = _train_function(_train_kernel, _backward_kernel, below=False, traced_backward=batch_norm_act_backward)
    _InferEager = _infer_function(_infer_kernel, below=False)

    def train_eager(x, z, weight, bias, running_mean, running_var, nbt, eps, momentum, comm, activation, slope,
                    inplace):
        """batch_norm_act_train's out by its kernels without the dispatcher (the layer's
        eager calls on plain tensors: the same kernels and autograd; a torch.func
        transform's tensors take the operator, as _ops.train_eager)."""
        if _ops._transforms():
            return batch_norm_act_train(x, z, weight, bias, running_mean, running_var, nbt, eps, momentum, comm,
                                        activation, slope, inplace)[0]
        _ops._refusals("batch_norm_act_train", running_mean, running_var, x, z, weight, bias)
        y = _TrainEager.apply(x, z, weight, bias, running_mean, running_var, nbt, eps, momentum, comm, activation,
                              slope, inplace)[0]
        _bump(running_mean, running_var, nbt)
        return y

    def infer_eager(x, z, running_mean, running_var, weight, bias, eps, activation, slope):
        if _ops._transforms():
            return batch_norm_act_infer(x, z, running_mean, running_var, weight, bias, eps, activation, slope)
        _ops._refusals("batch_norm_act_infer", running_mean, running_var, x, z, weight, bias)
        return _InferEager.apply(x, z, running_mean, running_var, weight, bias, eps, activation, slope)


_ops.register_vmap(_ops._lib, batch_norm_act_train, batch_norm_act_infer, (0, 1))
