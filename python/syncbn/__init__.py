"""syncbn: synchronized batch normalization across ranks (the C library libsyncbn).

This module is the C API's thin wrapper, importable without PyTorch (``syncbn.torch``
has the PyTorch layer): teams (``cpu_team``; ``nccl_team`` from an ``nccl_unique_id``,
one process per GPU), and the three operations on raw
data pointers, exactly as include/syncbn.h defines them. Every failure raises
``SyncBNError`` carrying the sbnResult_t (``.code``, ``.name``: "sbnTimeout", ...) and the
library's detail (sbnGetLastError).

Buffers: None (NULL), an object with ``__array_interface__`` (NumPy; host memory),
``__cuda_array_interface__`` (device memory) or ``data_ptr()`` (a torch.Tensor), or an int
(a raw address). Before calling C the wrapper checks everything it can see of an array or
a tensor against the descriptor: its element count (n * c * spatial for x, y, dy, dx; c
for the per-channel vectors; 1 for num_batches_tracked), its dtype (the descriptor's for
x, y, dy, dx; float32 for the per-channel vectors; int64 for num_batches_tracked), that it
is dense (C-contiguous; a torch tensor in NHWC may also be channels_last), that outputs are
writable, and host against device memory (a CPU team takes host memory, GPU and NCCL
teams device memory). It raises ValueError or TypeError naming the argument, and nothing
is written. A raw int address is the caller's responsibility: nothing about it can be
checked but its range, and a buffer smaller than the descriptor says is undefined
behaviour, as in C. An array interface must give its memory as an (address, read-only)
pair, and a NumPy scalar is no buffer (its interface is a temporary copy). A call the
wrapper refuses still counts as a call the library refuses at its arguments, so ranks
refused alike stay in step.

Example (a CPU team of 2 ranks as threads)::

    import threading, numpy as np, syncbn
    comms = syncbn.cpu_team(2)
    x = [np.random.rand(4, 3, 5).astype(np.float32) for _ in comms]
    ...  # each rank's thread calls comms[r].forward_train(desc, x[r], y[r], ...)
"""

import contextlib
import ctypes
import itertools
import math
import operator
import sys
import threading
import weakref

from . import _capi
from ._capi import Config, Params, TensorDesc, error_string, library_path, result_name

__all__ = [
    "__version__",
    "Comm",
    "Config",
    "Params",
    "SyncBNError",
    "SyncBNValueError",
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
    "IDENTITY",
    "RELU",
    "LEAKY_RELU",
]

FLOAT32, FLOAT16, BFLOAT16 = 0, 1, 2  # sbnDataType_t
NCHW, NHWC = 0, 1  # sbnLayout_t
GRAD_LOCAL, GRAD_GLOBAL = 0, 1  # sbnGradMode_t
IDENTITY, RELU, LEAKY_RELU = 0, 1, 2  # sbnActivation_t (the fused ops' epilogue)


class SyncBNError(RuntimeError):
    """A call of libsyncbn returned something other than sbnSuccess: ``.code`` (the
    sbnResult_t), ``.name`` ("sbnTimeout", ...), ``.detail`` (sbnGetLastError's text). The
    message says what failed first, then the result's name: "sbnForwardTrain: rank 0
    waited 300000 ms for rank 1 ... [sbnTimeout]"; the code's generic text only where the
    library gave no detail; a detail that names the call itself first ("sbnCommDestroy:
    ...", the library's own messages) is not named twice."""

    def __init__(self, code, what, detail=""):
        self.code = int(code)
        self.name = result_name(code)
        self.what = what
        self.detail = detail
        text = detail if detail.startswith(f"{what}: ") else f"{what}: {detail or error_string(code)}"
        super().__init__(f"{text} [{self.name}]")

    def __reduce__(self):
        # pickled (multiprocessing hands a worker's exception back; copy.copy): made again
        # from its own arguments, where BaseException's would pass the message alone
        return (type(self), (self.code, self.what, self.detail), self.__dict__)


class SyncBNValueError(SyncBNError, ValueError):
    """A SyncBNError that nn.BatchNorm raises as ValueError: the team's batch has one value
    per channel in training ("Expected more than 1 value per channel when training")."""


_VALUE_ERRORS = ("Expected more than 1 value per channel",)


def _raise(code, what, comm=None):
    detail = _capi.lib.sbnGetLastError(comm)
    detail = detail.decode() if detail else ""
    cls = SyncBNValueError if detail.startswith(_VALUE_ERRORS) else SyncBNError
    raise cls(code, what, detail)


def _check(code, what, comm=None):
    if code != 0:
        _raise(code, what, comm)


_INVALID_USAGE = 2  # sbnInvalidUsage


def library_version():
    """The loaded library's version, "major.minor.patch" (sbnGetVersion)."""
    v = ctypes.c_int()
    _check(_capi.lib.sbnGetVersion(ctypes.byref(v)), "sbnGetVersion")
    return f"{v.value // 10000}.{v.value // 100 % 100}.{v.value % 100}"


__version__ = library_version()


# ---- buffers: what the wrapper can check before C ----------------------------------------
# typestr (NumPy / CUDA array interface) accepted for each dtype; bfloat16 has no NumPy
# dtype: 2-byte raw ('<V2', ml_dtypes) or uint16 bits ('<u2')
_TYPESTRS = {
    FLOAT32: ("<f4", "=f4"),
    FLOAT16: ("<f2", "=f2"),
    BFLOAT16: ("<V2", "|V2", "<u2", "=u2"),
    "f32": ("<f4", "=f4"),
    "i64": ("<i8", "=i8"),
}
_DTYPE_NAMES = {FLOAT32: "float32", FLOAT16: "float16", BFLOAT16: "bfloat16", "f32": "float32", "i64": "int64"}
_TORCH_DTYPES = {}  # filled at the first tensor: {FLOAT32: torch.float32, ...}


def _torch_dtypes():
    if not _TORCH_DTYPES:
        import torch

        _TORCH_DTYPES.update({FLOAT32: torch.float32, FLOAT16: torch.float16, BFLOAT16: torch.bfloat16,
                              "f32": torch.float32, "i64": torch.int64})
    return _TORCH_DTYPES


def _dense_c(shape, strides, itemsize):
    """Whether (shape, strides in bytes) is C-contiguous (strides None: it is)."""
    if strides is None:
        return True
    want = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != want:
            return False
        want *= n
    return True


def _numpy_scalar(obj):
    """Whether obj is a NumPy scalar (np.float32(2.0), np.int64(0)): NumPy is imported
    wherever one exists."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.generic)


def _address(obj, what):
    """An int (or a NumPy integer scalar) as an address, checked to be one (ctypes would
    wrap -1 or 2**64 + a without a word)."""
    a = operator.index(obj)
    if not 0 <= a < 2 ** 64:
        raise ValueError(f"syncbn: {what} is {a}, not an address (0 <= address < 2**64)")
    return a


def _iface_data(iface, what, name):
    """The (address, read-only) pair of an array interface's 'data': a buffer object,
    None (the object's own buffer) or anything else there is refused, naming the argument
    (its first byte was taken as the address: Pillow's images segfaulted)."""
    data = iface.get("data")
    if not (isinstance(data, tuple) and len(data) == 2) or isinstance(data[0], bool):
        got = "no 'data'" if data is None else f"'data' of {type(data).__name__}"
        raise TypeError(f"syncbn: {what}'s {name} has {got}, not an (address, read-only) pair; "
                        f"pass numpy.asarray({what}) (an array whose memory is its own)")
    try:
        return _address(data[0], what), bool(data[1])
    except TypeError:
        raise TypeError(f"syncbn: {what}'s {name} gives its address as {type(data[0]).__name__}, "
                        "not an int") from None


def _buf(obj, what, count, kind, host, out=False, nhwc=False):
    """The address of buffer `what` after checking it holds `count` elements of `kind`
    (a dtype code, "f32" or "i64"), densely, in host (True) or device (False) memory, and
    is writable when `out`; None for None, an int as it is (unchecked but its range)."""
    if obj is None:
        return None
    if isinstance(obj, int) and not isinstance(obj, bool):
        return _address(obj, what) or None
    if _numpy_scalar(obj):
        raise TypeError(f"syncbn: {what} is a NumPy scalar ({type(obj).__name__}): its array interface is "
                        "a temporary copy (a value read there is lost with it, one written never reaches "
                        f"the scalar); pass an array (numpy.full(n, v)), or int({what}) for an address")
    data_ptr = getattr(obj, "data_ptr", None)
    if callable(data_ptr) and hasattr(obj, "is_contiguous"):  # a torch.Tensor
        dt = _torch_dtypes()[kind]
        if obj.dtype != dt:
            raise TypeError(f"syncbn: {what} is a {obj.dtype} tensor; it must be {dt}")
        if obj.numel() != count:
            raise ValueError(f"syncbn: {what} has {obj.numel()} elements; the descriptor needs {count}")
        dense = obj.is_contiguous()
        if not dense and nhwc and obj.dim() in (4, 5):
            import torch

            fmt = torch.channels_last if obj.dim() == 4 else torch.channels_last_3d
            dense = obj.is_contiguous(memory_format=fmt)
        if not dense:
            raise ValueError(f"syncbn: {what} is not contiguous" + (" (nor channels_last)" if nhwc else ""))
        if obj.device.type == "meta":
            raise ValueError(f"syncbn: {what} is a meta tensor (it has no data)")
        if obj.device.type != ("cpu" if host else "cuda"):
            raise ValueError(f"syncbn: {what} is on {obj.device}; this call takes "
                             + ("host memory (a CPU team)" if host else "device memory (a GPU or NCCL team)"))
        return data_ptr() or None
    cai = getattr(obj, "__cuda_array_interface__", None)
    ai = None if cai is not None else getattr(obj, "__array_interface__", None)
    iface = cai if cai is not None else ai
    if iface is None:
        raise TypeError(f"syncbn: {what} is not a pointer, an array or a tensor: {type(obj).__name__}")
    if (cai is not None) == host:
        raise ValueError(f"syncbn: {what} is " + ("device" if cai is not None else "host") + " memory; this call takes "
                         + ("host memory (a CPU team)" if host else "device memory (a GPU or NCCL team)"))
    name = "__cuda_array_interface__" if cai is not None else "__array_interface__"
    typestr = iface.get("typestr", "")
    if typestr not in _TYPESTRS[kind]:
        raise TypeError(f"syncbn: {what} has dtype {typestr!r}; it must be {_DTYPE_NAMES[kind]} "
                        f"({' or '.join(repr(t) for t in _TYPESTRS[kind])})")
    try:
        shape = tuple(operator.index(e) for e in iface.get("shape", ()))
    except TypeError:
        raise TypeError(f"syncbn: {what}'s {name} has a shape of other than ints: {iface.get('shape')!r}") from None
    if any(e < 0 for e in shape):
        raise ValueError(f"syncbn: {what}'s {name} has a negative extent: {shape}")
    n = 1
    for e in shape:
        n *= e
    if n != count:
        raise ValueError(f"syncbn: {what} has {n} elements; the descriptor needs {count}")
    strides = iface.get("strides")
    if strides is not None and len(tuple(strides)) != len(shape):
        raise ValueError(f"syncbn: {what}'s {name} has {len(tuple(strides))} strides for {len(shape)} "
                         "dimensions")
    if not _dense_c(shape, strides, int(typestr[2:])):
        raise ValueError(f"syncbn: {what} is not C-contiguous")
    addr, readonly = _iface_data(iface, what, name)
    if out and readonly:
        raise ValueError(f"syncbn: {what} is read-only; it is written")
    return addr or None


def _sane(d):
    return d.n >= 0 and d.c >= 1 and d.spatial >= 1 and d.dtype in (FLOAT32, FLOAT16, BFLOAT16)


# Each call's buffers in the C argument order: (name, size, written); size "x": n * c *
# spatial elements of the descriptor's dtype, "c": c float32, "1": one int64
_FWD_BUFS = (("x", "x", False), ("y", "x", True), ("weight", "c", False), ("bias", "c", False),
             ("running_mean", "c", True), ("running_var", "c", True), ("num_batches_tracked", "1", True),
             ("save_mean", "c", True), ("save_invstd", "c", True))
_BWD_BUFS = (("x", "x", False), ("dy", "x", False), ("dx", "x", True), ("weight", "c", False),
             ("save_mean", "c", False), ("save_invstd", "c", False), ("dweight", "c", True), ("dbias", "c", True))
_INF_BUFS = (("x", "x", False), ("y", "x", True), ("weight", "c", False), ("bias", "c", False),
             ("running_mean", "c", False), ("running_var", "c", False))
# the fused ops' (sbnForwardTrainEx, sbnBackwardEx, sbnForwardInferenceEx)
_FWDX_BUFS = (_FWD_BUFS[0], ("z", "x", False)) + _FWD_BUFS[1:]
_BWDX_BUFS = (("x", "x", False), ("y", "x", False), ("dy", "x", False), ("dx", "x", True), ("dz", "x", True),
              ("weight", "c", False), ("bias", "c", False), ("save_mean", "c", False), ("save_invstd", "c", False),
              ("dweight", "c", True), ("dbias", "c", True))
_INFX_BUFS = (_INF_BUFS[0], ("z", "x", False)) + _INF_BUFS[1:]
_BWDIP_BUFS = (("y", "x", False), ("z", "x", False)) + _BWDX_BUFS[2:]  # sbnBackwardInPlaceEx


def _epilogue(activation, slope):
    """The sbnEpilogue_t of the fused ops."""
    return _capi.Epilogue.make(activation, slope)


def _bufs(d, host, spec, objs):
    """The addresses of objs, the buffers `spec` describes, each checked against the
    descriptor d (_buf) in host (True) or device (False) memory; unchecked where nothing
    can be checked: host None (unknown), or a descriptor the library rejects (and then
    writes nothing)."""
    if not isinstance(d, TensorDesc):
        raise TypeError(f"syncbn: desc must be a syncbn.TensorDesc (syncbn.desc(...)), got {type(d).__name__}")
    if host is None or not _sane(d):
        return [_raw(o, name, buffer=True) for (name, _, _), o in zip(spec, objs)]
    sizes = {"x": (d.n * d.c * d.spatial, d.dtype), "c": (d.c, "f32"), "1": (1, "i64")}
    nhwc = d.layout == NHWC
    return [_buf(o, name, *sizes[size], host, out, nhwc) for (name, size, out), o in zip(spec, objs)]


def desc(dtype, layout, n, c, spatial=1):
    """A TensorDesc: dtype FLOAT32/FLOAT16/BFLOAT16, layout NCHW/NHWC, this rank's batch n
    (0 allowed), channels c, spatial = the product of the spatial extents."""
    ci = _capi.c_int
    return TensorDesc(ci(dtype, "dtype", 32), ci(layout, "layout", 32), ci(n, "n"), ci(c, "c"),
                      ci(spatial, "spatial"))


def _params(eps, momentum, grad_mode):
    return Params(_capi.c_float(eps, "eps"), -1.0 if momentum is None else _capi.c_float(momentum, "momentum"),
                  _capi.c_int(grad_mode, "grad_mode", 32))


class Comm:
    """One rank of a team (sbnComm_t). Destroyed by destroy(), at the end of a with
    block, or when collected. The ranks of a team made in this process (cpu_team) keep
    each other alive: a rank is collected only with all of its team, so a peer never
    vanishes under a rank that still calls. Destroying one rank of a CPU team explicitly
    aborts its team: the others' calls raise at once (sbnAborted), naming that rank.

    ``id``: a small int naming this rank in this process (syncbn.torch's operators take
    it; ``Comm.from_id``). ``max_channels``: the most channels its ops take (the team's
    ``max_channels``, given to cpu_team / nccl_team; None where not known)."""

    max_channels = None
    _ids = itertools.count(1)
    _by_id = weakref.WeakValueDictionary()
    _native = None  # syncbn._native's loaded C++ operators: they own each live comm, by id
    _native_lock = threading.RLock()  # handing comms over vs loading the operators (re-entered by __del__)
    # what syncbn.torch's Python operators hold around their call on this comm: nothing, or
    # for a comm they may get from several threads at once (_serialize_calls), a lock
    _serial = contextlib.nullcontext()

    def _serialize_calls(self):
        """syncbn.torch's operators take this comm's calls one at a time, each waiting for
        the one that runs (where the C library would refuse a second thread's call with
        sbnInvalidUsage): for a team of one that syncbn.torch made, which threads share
        (an autograd node's backward run by another thread, a compiled graph's team).
        A team of more ranks is never serialized: a call waiting there for its peers
        would hold up every other."""
        if self._size != 1:
            raise ValueError("syncbn: only a team of one's calls can be serialized")
        with Comm._native_lock:
            if not isinstance(self._serial, contextlib.nullcontext):
                return
            self._serial = threading.Lock()
            if Comm._native is not None:
                Comm._native.comm_serial(self.id)

    def __init__(self, handle):
        self._h = ctypes.c_void_p(handle)
        # this object's calls between taking the handle and the library's return: destroy()
        # from another thread meanwhile is refused (the library refuses it only once the
        # call is inside), so no call hands the library a destroyed comm
        self._calls = 0
        self._calls_lock = threading.Lock()
        self._team = None  # the list of the team's Comms in this process (cpu_team)
        self.id = next(Comm._ids)
        t = ctypes.c_char_p()
        _check(_capi.lib.sbnCommGetTransport(self._h, ctypes.byref(t)), "sbnCommGetTransport", self._h)
        self._transport = t.value.decode()
        self.host = self._transport == "cpu"  # its ops take host memory (a CPU team)
        n = ctypes.c_int()
        _check(_capi.lib.sbnCommCount(self._h, ctypes.byref(n)), "sbnCommCount", self._h)
        self._size = n.value
        # known by id and handed over to the C++ operators at once, under the lock that the
        # first import of syncbn.torch holds while it hands over the comms known by then:
        # each comm is handed over once, whole
        with Comm._native_lock:
            Comm._by_id[self.id] = self
            if Comm._native is not None:
                Comm._native.comm_put(self)

    @staticmethod
    def from_id(comm_id):
        """The live Comm whose ``id`` is comm_id; SyncBNError (sbnInvalidUsage) if it was
        destroyed or collected, or never existed."""
        c = Comm._by_id.get(comm_id)
        if c is None or not c._h.value:
            raise SyncBNError(2, "syncbn.Comm", f"no live comm has id {comm_id}: it was destroyed")
        return c

    @property
    def handle(self):
        return self._h.value

    def _live(self):
        if not self._h.value:
            raise SyncBNError(2, "syncbn.Comm", "the comm was destroyed")
        return self._h

    # syncbn.torch's Python operators' calls in flight (of _calls), and the handle a
    # destroy() made while only such calls were in flight left to the last of them
    _op_calls = 0
    _deferred = None

    def _enter(self, op=False):
        """The live handle for one call, counted in flight until _leave(op); op: a call of
        syncbn.torch's operators, during which a destroy() returns at once and the last
        such call destroys the comm as it returns (_leave), as the C++ operators do."""
        with self._calls_lock:
            h = self._live()
            self._calls += 1
            self._op_calls += op
            return h

    def _leave(self, op=False):
        with self._calls_lock:
            self._calls -= 1
            self._op_calls -= op
            last = self._deferred if self._calls == 0 else None  # (only op calls were left then)
            if last is not None:
                self._deferred = None
        if last is not None:
            with Comm._native_lock:
                self._release(last)

    @contextlib.contextmanager
    def _counted(self, fn):
        """Around the checks the wrapper makes before op fn: a call they refuse (any
        exception: a TypeError or ValueError naming the argument, or what an odd object
        raised) still counts as the library counts a call it refuses at its
        arguments (API.md: a rank's forward and backward calls count, refused or not, so
        that ranks refused alike stay in step): fn is called with a NULL descriptor,
        which the library refuses, writing nothing (the comm's last error then says
        "desc is NULL"; what is raised is the wrapper's error). A rank refused here
        while its peer was refused by the library left the team out of step for good."""
        try:
            yield
        except Exception:
            try:
                h = self._enter()
            except SyncBNError:  # destroyed: the library counts nothing either
                h = None
            if h is not None:
                try:
                    fn(h, *([None] * (len(fn.argtypes) - 1)))
                finally:
                    self._leave()
            raise

    def _call(self, fn, what, *args, op=False):
        """fn(handle, *args), a call in flight meanwhile (op: syncbn.torch's operators',
        _enter); SyncBNError where it fails."""
        h = self._enter(op)
        try:
            _check(fn(h, *args), what, h)
        finally:
            self._leave(op)

    @property
    def rank(self):
        r = ctypes.c_int()
        self._call(_capi.lib.sbnCommRank, "sbnCommRank", ctypes.byref(r))
        return r.value

    @property
    def size(self):
        self._live()
        return self._size

    @property
    def transport(self):
        self._live()
        return self._transport

    def async_error(self):
        """sbnCommGetAsyncError: 0 or the sbnResult_t that stopped the team."""
        r = ctypes.c_int()
        self._call(_capi.lib.sbnCommGetAsyncError, "sbnCommGetAsyncError", ctypes.byref(r))
        return r.value

    def abort(self):
        self._call(_capi.lib.sbnCommAbort, "sbnCommAbort")

    def destroy(self):
        self._end(collected=False)

    def _end(self, collected):
        """destroy(); collected (by Python: __del__), the C++ operators keep the comm while
        an autograd node that will call it lives (a layer deleted before its backward), as
        the Python operators' nodes keep this object."""
        with Comm._native_lock:  # one destroy at a time: the handle taken, destroyed, or put back if refused
            with self._calls_lock:
                if not self._h.value:
                    return
                if self._calls and self._calls == self._op_calls:  # syncbn.torch's operators' only
                    self._deferred, self._h = self._h, ctypes.c_void_p()  # the last of them destroys it
                    return
                if self._calls:  # another thread's call has the handle (not yet inside the library)
                    raise SyncBNError(_INVALID_USAGE, "sbnCommDestroy",
                                      "sbnCommDestroy: the comm is in use by another thread's call; nothing "
                                      "was done")
                h, self._h = self._h, ctypes.c_void_p()
            r = self._release(h, collected)
            if r > 0:  # the refusal's detail is on the comm (live), another failure's on the thread
                _check(r, "sbnCommDestroy", self._h if r == _INVALID_USAGE else None)

    def _release(self, h, collected=False):
        """Destroys handle h, taken from this Comm (Comm._native_lock held): sbnCommDestroy's
        result, or the C++ operators' (they own a comm handed to them: destroyed now, or
        after their call using it); refused (sbnInvalidUsage: another thread's call on it
        runs), the Comm has it back, as it was."""
        r = -2 if Comm._native is None else Comm._native.comm_drop(self.id, collected)
        if r == -2:
            r = _capi.lib.sbnCommDestroy(h)
        if r == _INVALID_USAGE:
            self._h = h
        return r

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

    def __exit__(self, exc_type, exc, tb):
        """Destroys the comm. Where the block raised and the destroy fails, the block's
        exception goes on, the destroy's error added to it as a note (Python 3.11+): refused
        (another thread's call on the comm runs), the comm stays live; sbnTimeout (a GPU
        team's devices did not finish in time), it is destroyed all the same."""
        try:
            self.destroy()
        except SyncBNError as e:
            if exc is None:
                raise
            if hasattr(exc, "add_note"):
                exc.add_note(f"syncbn.Comm: leaving the with block, destroy() failed: {e}")

    def __del__(self):
        try:
            self._end(collected=True)
        except Exception:  # noqa: BLE001 (interpreter shutdown: nothing to report to)
            pass

    def __repr__(self):
        if not self._h.value:
            return f"<syncbn.Comm id={self.id} destroyed>"
        return f"<syncbn.Comm id={self.id} rank {self.rank} of {self._size}, {self._transport}>"

    def forward_train(self, desc, x, y, save_mean, save_invstd, weight=None, bias=None,
                      running_mean=None, running_var=None, num_batches_tracked=None,
                      eps=1e-5, momentum=0.1, grad_mode=GRAD_LOCAL, stream=None, z=None,
                      activation=IDENTITY, slope=0.01):
        """sbnForwardTrain on this rank (momentum None: cumulative average, which needs
        num_batches_tracked). Blocks until the team's exchange is done (CPU teams). With a
        residual z or an activation (RELU, LEAKY_RELU with slope): sbnForwardTrainEx,
        y = act(bn(x) + z)."""
        with self._counted(_capi.lib.sbnForwardTrain):  # a forward, plain or fused
            plain = z is None and bool(activation == IDENTITY)
            fn = _capi.lib.sbnForwardTrain if plain else _capi.lib.sbnForwardTrainEx
            p = _params(eps, momentum, grad_mode)
            if plain:
                ptrs = _bufs(desc, self.host, _FWD_BUFS, (x, y, weight, bias, running_mean, running_var,
                                                       num_batches_tracked, save_mean, save_invstd))
                tail = (ctypes.byref(p), _raw(stream))
            else:
                ptrs = _bufs(desc, self.host, _FWDX_BUFS, (x, z, y, weight, bias, running_mean, running_var,
                                                        num_batches_tracked, save_mean, save_invstd))
                tail = (ctypes.byref(p), ctypes.byref(_epilogue(activation, slope)), _raw(stream))
        self._call(fn, "sbnForwardTrain" if plain else "sbnForwardTrainEx", ctypes.byref(desc), *ptrs, *tail)

    def backward(self, desc, x, dy, dx, save_mean, save_invstd, weight=None, dweight=None,
                 dbias=None, eps=1e-5, grad_mode=GRAD_LOCAL, stream=None, y=None, dz=None, bias=None,
                 activation=IDENTITY, slope=0.01, z=None):
        """sbnBackward on this rank (dx None: no input gradient; dweight/dbias None: skip).
        After a fused forward: y (its output: the activation's mask), dz (the residual's
        gradient), and x None for the in-place backward (x recovered from y, weight and
        bias): sbnBackwardEx; with z, the forward's residual, x recovered from y and z:
        sbnBackwardInPlaceEx (x must be None then)."""
        with self._counted(_capi.lib.sbnBackward):  # a backward, plain or fused
            if z is not None and x is not None:
                raise ValueError("syncbn: z (the forward's residual) is read by the in-place backward only: "
                                 "pass x None")
            plain = y is None and dz is None and z is None and bool(activation == IDENTITY)
            p = _params(eps, 0.1, grad_mode)
            if plain:
                fn, name = _capi.lib.sbnBackward, "sbnBackward"
                ptrs = _bufs(desc, self.host, _BWD_BUFS, (x, dy, dx, weight, save_mean, save_invstd, dweight, dbias))
                tail = (ctypes.byref(p), _raw(stream))
            elif z is not None:
                fn, name = _capi.lib.sbnBackwardInPlaceEx, "sbnBackwardInPlaceEx"
                ptrs = _bufs(desc, self.host, _BWDIP_BUFS, (y, z, dy, dx, dz, weight, bias, save_mean, save_invstd,
                                                         dweight, dbias))
                tail = (ctypes.byref(p), ctypes.byref(_epilogue(activation, slope)), _raw(stream))
            else:
                fn, name = _capi.lib.sbnBackwardEx, "sbnBackwardEx"
                ptrs = _bufs(desc, self.host, _BWDX_BUFS, (x, y, dy, dx, dz, weight, bias, save_mean, save_invstd,
                                                        dweight, dbias))
                tail = (ctypes.byref(p), ctypes.byref(_epilogue(activation, slope)), _raw(stream))
        self._call(fn, name, ctypes.byref(desc), *ptrs, *tail)


def _raw(obj, what="stream", buffer=False):
    """The address behind obj without checks but its range (a stream, or buffers of a
    descriptor the library rejects anyway, or of an inference whose every buffer is an
    address); None for NULL. A NumPy integer scalar is a stream's address (its array
    interface a temporary copy's); as a buffer, a NumPy scalar is refused (as _buf)."""
    if obj is None:
        return None
    if buffer and _numpy_scalar(obj):
        _buf(obj, what, 1, "f32", True)  # raises: a NumPy scalar is no buffer
    if (isinstance(obj, int) and not isinstance(obj, bool)) or (_numpy_scalar(obj) and hasattr(obj, "__index__")):
        return _address(obj, what) or None
    data_ptr = getattr(obj, "data_ptr", None)
    if callable(data_ptr):
        return data_ptr()
    for name in ("__cuda_array_interface__", "__array_interface__"):
        iface = getattr(obj, name, None)
        if iface is not None:
            return _iface_data(iface, what, name)[0]
    if hasattr(obj, "cuda_stream"):  # a torch.cuda.Stream
        return obj.cuda_stream
    raise TypeError(f"syncbn: not a pointer, an array or a tensor: {type(obj).__name__}")

def _no_comm():
    return None


def cpu_team(nranks, timeout_ms=None, max_channels=None):
    """sbnCommInitCpu: a team of nranks ranks that are host threads (rank r calls
    through comms[r] from its own thread), data in host memory."""
    nranks = _capi.c_int(nranks, "nranks", 32)
    if not 1 <= nranks <= _capi.SBN_MAX_CPU_TEAM_RANKS:
        raise ValueError(f"syncbn.cpu_team: nranks {nranks} outside 1..{_capi.SBN_MAX_CPU_TEAM_RANKS}")
    handles = (ctypes.c_void_p * nranks)()
    cfg = Config.make(timeout_ms, max_channels)
    _check(_capi.lib.sbnCommInitCpu(handles, nranks, ctypes.byref(cfg)), "sbnCommInitCpu")
    comms = [Comm(h) for h in handles]
    for c in comms:  # the ranks keep each other alive (a reference cycle: collected together)
        c._team = comms
        c.max_channels = cfg.max_channels
    return comms


def nccl_unique_id():
    """sbnGetNcclUniqueId: 128 bytes for nccl_team (made on one rank, sent to the others)."""
    uid = _capi.NcclUniqueId()
    _check(_capi.lib.sbnGetNcclUniqueId(ctypes.byref(uid)), "sbnGetNcclUniqueId")
    return bytes(uid)  # all 128 bytes (uid.internal would stop at the first zero byte)


def nccl_team(unique_id, nranks, rank, timeout_ms=None, max_channels=None):
    """sbnCommInitNcclRank: this process's rank of a team of nranks processes, one per
    GPU (the calling thread's current CUDA device), from the id every rank got from the
    same nccl_unique_id(). A rank that never calls: sbnTimeout on the others, no hang."""
    if isinstance(unique_id, int):  # bytes(128) is 128 zero bytes, not an id
        raise TypeError("syncbn.nccl_team: unique_id must be the bytes nccl_unique_id() gave, got an int")
    raw = bytes(unique_id)
    if len(raw) != ctypes.sizeof(_capi.NcclUniqueId):
        raise ValueError(f"syncbn.nccl_team: an NCCL unique id is {ctypes.sizeof(_capi.NcclUniqueId)} bytes, "
                         f"got {len(raw)}")
    uid = _capi.NcclUniqueId.from_buffer_copy(raw)
    h = ctypes.c_void_p()
    cfg = Config.make(timeout_ms, max_channels)
    _check(_capi.lib.sbnCommInitNcclRank(ctypes.byref(h), ctypes.byref(uid), _capi.c_int(nranks, "nranks", 32),
                                         _capi.c_int(rank, "rank", 32),
                                         ctypes.byref(cfg)), "sbnCommInitNcclRank")
    c = Comm(h.value)
    c.max_channels = cfg.max_channels
    return c


def _is_host(obj, what="x"):
    """Whether the buffer obj is host memory (None when it cannot tell: an int, None)."""
    if obj is None or isinstance(obj, int) or _numpy_scalar(obj):
        return None
    if hasattr(obj, "is_cuda") and callable(getattr(obj, "data_ptr", None)):
        return not obj.is_cuda
    if getattr(obj, "__cuda_array_interface__", None) is not None:
        return False
    if getattr(obj, "__array_interface__", None) is not None:
        return True
    raise TypeError(f"syncbn: {what} is not a pointer, an array or a tensor: {type(obj).__name__}")


def forward_inference(desc, x, y, running_mean, running_var, weight=None, bias=None, eps=1e-5,
                      stream=None, z=None, activation=IDENTITY, slope=0.01):
    """sbnForwardInference: y = (x - running_mean) / sqrt(running_var + eps) * weight + bias,
    all pointers host memory or all device memory of one GPU (x decides which: y, z, the
    running statistics, the weight or the bias where x is an int address, so that the
    arrays among them are checked). With z or an activation: sbnForwardInferenceEx, y =
    act(that + z) (host or device memory)."""
    eps = _capi.c_float(eps, "eps")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"syncbn.forward_inference: eps {eps}")
    host = None
    for what, o in (("x", x), ("y", y), ("z", z), ("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        host = _is_host(o, what)
        if host is not None:
            break
    if z is None and activation == IDENTITY:
        ptrs = _bufs(desc, host, _INF_BUFS, (x, y, weight, bias, running_mean, running_var))
        _check(
            _capi.lib.sbnForwardInference(ctypes.byref(desc), *ptrs, ctypes.c_float(eps), _raw(stream)),
            "sbnForwardInference")
        return
    ptrs = _bufs(desc, host, _INFX_BUFS, (x, z, y, weight, bias, running_mean, running_var))
    e = _epilogue(activation, slope)
    _check(_capi.lib.sbnForwardInferenceEx(ctypes.byref(desc), *ptrs, ctypes.c_float(eps), ctypes.byref(e),
                                           _raw(stream)), "sbnForwardInferenceEx")
