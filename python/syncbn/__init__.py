"""syncbn: synchronized batch normalization across ranks (the C library libsyncbn).

This module is the C API's thin wrapper, importable without PyTorch (``syncbn.torch``
has the PyTorch layer): teams (``cpu_team``; ``nccl_team`` from an ``nccl_unique_id``,
one process per GPU), and the three operations on raw
data pointers, exactly as include/syncbn.h defines them. Every failure raises
``SyncBNError`` carrying the sbnResult_t (``.code``, ``.name``: "sbnTimeout", ...) and the
library's detail (sbnGetLastError).

Pointers: an int (an address), None (NULL), or an object with ``__array_interface__``
(NumPy; host memory), ``__cuda_array_interface__`` or ``data_ptr()`` (a torch.Tensor).
The wrapper checks no shapes: like the C API, the caller passes tensors that match the
descriptor.

Example (a CPU team of 2 ranks as threads)::

    import threading, numpy as np, syncbn
    comms = syncbn.cpu_team(2)
    x = [np.random.rand(4, 3, 5).astype(np.float32) for _ in comms]
    ...  # each rank's thread calls comms[r].forward_train(desc, x[r], y[r], ...)
"""

import ctypes
import math

from . import _capi
from ._capi import Config, Params, TensorDesc, error_string, library_path, result_name

__all__ = [
    "__version__",
    "Comm",
    "Config",
    "Params",
    "SyncBNError",
    "TensorDesc",
    "cpu_team",
    "nccl_team",
    "nccl_unique_id",
    "desc",
    "forward_inference",
    "library_path",
    "library_version",
    "result_name",
    "error_string",
    "FLOAT32",
    "FLOAT16",
    "BFLOAT16",
    "NCHW",
    "NHWC",
    "GRAD_LOCAL",
    "GRAD_GLOBAL",
]

FLOAT32, FLOAT16, BFLOAT16 = 0, 1, 2  # sbnDataType_t
NCHW, NHWC = 0, 1  # sbnLayout_t
GRAD_LOCAL, GRAD_GLOBAL = 0, 1  # sbnGradMode_t


class SyncBNError(RuntimeError):
    """A call of libsyncbn returned something other than sbnSuccess."""

    def __init__(self, code, what, detail=""):
        self.code = int(code)
        self.name = result_name(code)
        self.detail = detail
        msg = f"{what}: {self.name} ({error_string(code)})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


def _check(code, what, comm=None):
    if code != 0:
        detail = _capi.lib.sbnGetLastError(comm)
        raise SyncBNError(code, what, detail.decode() if detail else "")


def library_version():
    """The loaded library's version, "major.minor.patch" (sbnGetVersion)."""
    v = ctypes.c_int()
    _check(_capi.lib.sbnGetVersion(ctypes.byref(v)), "sbnGetVersion")
    return f"{v.value // 10000}.{v.value // 100 % 100}.{v.value % 100}"


__version__ = library_version()


def _ptr(obj):
    """The address behind obj (see the module's docstring), or None for NULL."""
    if obj is None:
        return None
    if isinstance(obj, int):
        return obj
    # data_ptr() first: a torch.Tensor that requires grad raises (RuntimeError, not
    # AttributeError) from __cuda_array_interface__, and inside an autograd.Function the
    # inputs still require grad
    data_ptr = getattr(obj, "data_ptr", None)
    if callable(data_ptr):
        return data_ptr()
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return cai["data"][0]
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        return ai["data"][0]
    raise TypeError(f"syncbn: not a pointer, an array or a tensor: {type(obj).__name__}")


def desc(dtype, layout, n, c, spatial=1):
    """A TensorDesc: dtype FLOAT32/FLOAT16/BFLOAT16, layout NCHW/NHWC, this rank's batch n
    (0 allowed), channels c, spatial = the product of the spatial extents."""
    return TensorDesc(int(dtype), int(layout), int(n), int(c), int(spatial))


def _params(eps, momentum, grad_mode):
    return Params(float(eps), -1.0 if momentum is None else float(momentum), int(grad_mode))


class Comm:
    """One rank of a team (sbnComm_t). Destroyed by destroy(), at the end of a with
    block, or when collected."""

    def __init__(self, handle):
        self._h = ctypes.c_void_p(handle)

    @property
    def handle(self):
        return self._h.value

    def _live(self):
        if not self._h.value:
            raise SyncBNError(2, "syncbn.Comm", "the comm was destroyed")
        return self._h

    @property
    def rank(self):
        r = ctypes.c_int()
        _check(_capi.lib.sbnCommRank(self._live(), ctypes.byref(r)), "sbnCommRank", self._h)
        return r.value

    @property
    def size(self):
        r = ctypes.c_int()
        _check(_capi.lib.sbnCommCount(self._live(), ctypes.byref(r)), "sbnCommCount", self._h)
        return r.value

    @property
    def transport(self):
        t = ctypes.c_char_p()
        _check(_capi.lib.sbnCommGetTransport(self._live(), ctypes.byref(t)), "sbnCommGetTransport", self._h)
        return t.value.decode()

    def async_error(self):
        """sbnCommGetAsyncError: 0 or the sbnResult_t that stopped the team."""
        r = ctypes.c_int()
        _check(_capi.lib.sbnCommGetAsyncError(self._live(), ctypes.byref(r)), "sbnCommGetAsyncError", self._h)
        return r.value

    def abort(self):
        _check(_capi.lib.sbnCommAbort(self._live()), "sbnCommAbort", self._h)

    def destroy(self):
        if self._h.value:
            h, self._h = self._h, ctypes.c_void_p()
            _check(_capi.lib.sbnCommDestroy(h), "sbnCommDestroy")

    def __copy__(self):
        return self  # a rank of a team is one resource: copies of a layer share it

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        # pickled (torch.save of a whole model): a team's rank lives in this process, so it
        # loads as None (a layer then takes its process group's team, or comm= again)
        return (_no_comm, ())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __del__(self):
        try:
            self.destroy()
        except Exception:  # noqa: BLE001 (interpreter shutdown: nothing to report to)
            pass

    def forward_train(self, d, x, y, save_mean, save_invstd, weight=None, bias=None,
                      running_mean=None, running_var=None, num_batches_tracked=None,
                      eps=1e-5, momentum=0.1, grad_mode=GRAD_LOCAL, stream=None):
        """sbnForwardTrain on this rank (momentum None: cumulative average, which needs
        num_batches_tracked). Blocks until the team's exchange is done (CPU teams)."""
        p = _params(eps, momentum, grad_mode)
        _check(
            _capi.lib.sbnForwardTrain(
                self._live(), ctypes.byref(d), _ptr(x), _ptr(y), _ptr(weight), _ptr(bias),
                _ptr(running_mean), _ptr(running_var), _ptr(num_batches_tracked),
                _ptr(save_mean), _ptr(save_invstd), ctypes.byref(p), _ptr(stream)),
            "sbnForwardTrain", self._h)

    def backward(self, d, x, dy, dx, save_mean, save_invstd, weight=None, dweight=None,
                 dbias=None, eps=1e-5, grad_mode=GRAD_LOCAL, stream=None):
        """sbnBackward on this rank (dx None: no input gradient; dweight/dbias None: skip)."""
        p = _params(eps, 0.1, grad_mode)
        _check(
            _capi.lib.sbnBackward(
                self._live(), ctypes.byref(d), _ptr(x), _ptr(dy), _ptr(dx), _ptr(weight),
                _ptr(save_mean), _ptr(save_invstd), _ptr(dweight), _ptr(dbias),
                ctypes.byref(p), _ptr(stream)),
            "sbnBackward", self._h)


def _no_comm():
    return None


def cpu_team(nranks, timeout_ms=None, max_channels=None):
    """sbnCommInitCpu: a team of nranks ranks that are host threads (rank r calls
    through comms[r] from its own thread), data in host memory."""
    if not 1 <= int(nranks) <= _capi.SBN_MAX_CPU_TEAM_RANKS:
        raise ValueError(f"syncbn.cpu_team: nranks {nranks} outside 1..{_capi.SBN_MAX_CPU_TEAM_RANKS}")
    handles = (ctypes.c_void_p * int(nranks))()
    cfg = Config.make(timeout_ms, max_channels)
    _check(_capi.lib.sbnCommInitCpu(handles, int(nranks), ctypes.byref(cfg)), "sbnCommInitCpu")
    return [Comm(h) for h in handles]


def nccl_unique_id():
    """sbnGetNcclUniqueId: 128 bytes for nccl_team (made on one rank, sent to the others)."""
    uid = _capi.NcclUniqueId()
    _check(_capi.lib.sbnGetNcclUniqueId(ctypes.byref(uid)), "sbnGetNcclUniqueId")
    return bytes(uid)  # all 128 bytes (uid.internal would stop at the first zero byte)


def nccl_team(unique_id, nranks, rank, timeout_ms=None, max_channels=None):
    """sbnCommInitNcclRank: this process's rank of a team of nranks processes, one per
    GPU (the calling thread's current CUDA device), from the id every rank got from the
    same nccl_unique_id(). A rank that never calls: sbnTimeout on the others, no hang."""
    raw = bytes(unique_id)
    if len(raw) != ctypes.sizeof(_capi.NcclUniqueId):
        raise ValueError(f"syncbn.nccl_team: an NCCL unique id is {ctypes.sizeof(_capi.NcclUniqueId)} bytes, "
                         f"got {len(raw)}")
    uid = _capi.NcclUniqueId.from_buffer_copy(raw)
    h = ctypes.c_void_p()
    cfg = Config.make(timeout_ms, max_channels)
    _check(_capi.lib.sbnCommInitNcclRank(ctypes.byref(h), ctypes.byref(uid), int(nranks), int(rank),
                                         ctypes.byref(cfg)), "sbnCommInitNcclRank")
    return Comm(h.value)


def forward_inference(d, x, y, running_mean, running_var, weight=None, bias=None, eps=1e-5,
                      stream=None):
    """sbnForwardInference: y = (x - running_mean) / sqrt(running_var + eps) * weight + bias,
    all pointers host memory or all device memory of one GPU."""
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"syncbn.forward_inference: eps {eps}")
    _check(
        _capi.lib.sbnForwardInference(
            ctypes.byref(d), _ptr(x), _ptr(y), _ptr(weight), _ptr(bias), _ptr(running_mean),
            _ptr(running_var), ctypes.c_float(eps), _ptr(stream)),
        "sbnForwardInference")
