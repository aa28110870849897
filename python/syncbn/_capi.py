"""The C API of libsyncbn (include/syncbn.h) through ctypes: the library, its structs and
its functions' prototypes. Internal: syncbn/__init__.py is the package's interface.

No compiled Python module: the library is loaded by path, so one build works with any
Python >= 3.9 (and any PyTorch, for syncbn.torch). ctypes releases the GIL for every
call, which the CPU team needs: its ranks are threads that wait for each other inside
the calls.
"""

import ctypes
import ctypes.util
import math
import numbers
import operator
import os
import pathlib

c_int64_p = ctypes.POINTER(ctypes.c_int64)
c_float_p = ctypes.POINTER(ctypes.c_float)

# Mirrors of syncbn.h (tests/python/test_capi.py: test_constants_match_header).
SBN_CONFIG_MAGIC = 0x5B4E4366
SBN_CONFIG_VERSION = 1
SBN_DEFAULT_TIMEOUT_MS = 300000
SBN_DEFAULT_MAX_CHANNELS = 4096
SBN_MAX_CPU_TEAM_RANKS = 4096


class TensorDesc(ctypes.Structure):
    """sbnTensorDesc_t: dtype (0 fp32, 1 fp16, 2 bf16), layout (0 NCHW, 1 NHWC), n, c,
    spatial (the product of the spatial extents; 1 for (N, C))."""

    _fields_ = [
        ("dtype", ctypes.c_int),
        ("layout", ctypes.c_int),
        ("n", ctypes.c_int64),
        ("c", ctypes.c_int64),
        ("spatial", ctypes.c_int64),
    ]


_INT_RANGE = {32: (-(2 ** 31), 2 ** 31 - 1), 64: (-(2 ** 63), 2 ** 63 - 1)}


def c_int(value, name, bits=64):
    """value as the C integer of `bits` bits a struct field or an argument takes: an int
    (or an integral float, 1e4) within that type's range, else a TypeError or ValueError
    naming it (ctypes would wrap 2**64 + 5 to 5 and cut 1.7 to 1 without a word)."""
    given = value
    if isinstance(value, bool):  # an int to Python, but timeout_ms=True is no number of ms
        raise TypeError(f"syncbn: {name} must be an integer, got bool")
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):  # float, np.float32
        if not math.isfinite(value) or value != math.floor(value):
            raise ValueError(f"syncbn: {name} must be an integer, got {given!r}")
        value = int(value)
    else:
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(f"syncbn: {name} must be an integer, got {type(value).__name__}") from None
    lo, hi = _INT_RANGE[bits]
    if not lo <= value <= hi:
        raise ValueError(f"syncbn: {name} = {given!r} does not fit the C library's {bits}-bit integer")
    return value


def c_float(value, name):
    """value as a C float argument: a real number (an int, a float, NumPy's, a 0-d tensor:
    anything with __float__ but a bool), else a TypeError naming it (float() would take
    the string "0.1" and True)."""
    if isinstance(value, (bool, str, bytes)) or not hasattr(type(value), "__float__"):
        raise TypeError(f"syncbn: {name} must be a real number, got {type(value).__name__}")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):  # a tensor of 2 values, an int past float's range
        raise ValueError(f"syncbn: {name} must be one real number within float's range, got {value!r}") from None


class Config(ctypes.Structure):
    """sbnConfig_t, filled as SBN_CONFIG_INITIALIZER fills it."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("timeout_ms", ctypes.c_int64),
        ("max_channels", ctypes.c_int64),
    ]

    @classmethod
    def make(cls, timeout_ms=None, max_channels=None):
        return cls(
            ctypes.sizeof(cls),
            SBN_CONFIG_MAGIC,
            SBN_CONFIG_VERSION,
            SBN_DEFAULT_TIMEOUT_MS if timeout_ms is None else c_int(timeout_ms, "timeout_ms"),
            SBN_DEFAULT_MAX_CHANNELS if max_channels is None else c_int(max_channels, "max_channels"),
        )


class NcclUniqueId(ctypes.Structure):
    """sbnNcclUniqueId_t (SBN_NCCL_UNIQUE_ID_BYTES = 128)."""

    _fields_ = [("internal", ctypes.c_char * 128)]


class Params(ctypes.Structure):
    """sbnParams_t: eps, momentum (< 0: cumulative average, PyTorch's momentum=None),
    grad_mode (0 local, 1 global)."""

    _fields_ = [("eps", ctypes.c_float), ("momentum", ctypes.c_float), ("grad_mode", ctypes.c_int)]


class Epilogue(ctypes.Structure):
    """sbnEpilogue_t: size (sizeof), activation (0 identity, 1 ReLU, 2 leaky ReLU), slope,
    no_residual (1: the backward may take the activation's mask from x), reserved (0)."""

    _fields_ = [("size", ctypes.c_size_t), ("activation", ctypes.c_int), ("slope", ctypes.c_float),
                ("no_residual", ctypes.c_int), ("reserved", ctypes.c_int)]

    @classmethod
    def make(cls, activation, slope, no_residual=False):
        if isinstance(activation, bool):  # an int to c_int, but True is no activation's name
            raise TypeError("syncbn: activation must be IDENTITY, RELU or LEAKY_RELU, got a bool")
        return cls(ctypes.sizeof(cls), c_int(activation, "activation", 32), c_float(slope, "slope"),
                   1 if no_residual else 0, 0)


def _candidates():
    env = os.environ.get("SYNCBN_LIBRARY")
    if env:
        return [pathlib.Path(env)]
    here = pathlib.Path(__file__).resolve().parent
    found = [here / "lib" / "libsyncbn.so"]
    system = ctypes.util.find_library("syncbn")
    if system:
        found.append(pathlib.Path(system))
    return found


def _load():
    tried = []
    for path in _candidates():
        if os.sep in str(path) and not path.exists():
            tried.append(f"{path} (not found)")
            continue
        try:
            return ctypes.CDLL(str(path)), str(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError(
        "syncbn: no libsyncbn.so found that loads (SYNCBN_LIBRARY names one explicitly); tried: "
        + "; ".join(tried)
    )


lib, library_path = _load()

_P = ctypes.c_void_p
_PROTOTYPES = {
    "sbnGetErrorString": (ctypes.c_char_p, [ctypes.c_int]),
    "sbnGetResultName": (ctypes.c_char_p, [ctypes.c_int]),
    "sbnGetLastError": (ctypes.c_char_p, [_P]),
    "sbnGetVersion": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int)]),
    "sbnCommInitCpu": (ctypes.c_int, [ctypes.POINTER(_P), ctypes.c_int, ctypes.POINTER(Config)]),
    "sbnCommInitNccl": (ctypes.c_int, [ctypes.POINTER(_P), _P, ctypes.POINTER(Config)]),
    "sbnGetNcclUniqueId": (ctypes.c_int, [ctypes.POINTER(NcclUniqueId)]),
    "sbnCommInitNcclRank": (
        ctypes.c_int,
        [ctypes.POINTER(_P), ctypes.POINTER(NcclUniqueId), ctypes.c_int, ctypes.c_int, ctypes.POINTER(Config)],
    ),
    "sbnCommRank": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_int)]),
    "sbnCommCount": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_int)]),
    "sbnCommGetAsyncError": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_int)]),
    "sbnCommAbort": (ctypes.c_int, [_P]),
    "sbnCommDestroy": (ctypes.c_int, [_P]),
    "sbnCommGetTransport": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_char_p)]),
    "sbnForwardTrain": (
        ctypes.c_int,
        [_P, ctypes.POINTER(TensorDesc), _P, _P, _P, _P, _P, _P, _P, _P, _P,
         ctypes.POINTER(Params), _P],
    ),
    "sbnBackward": (
        ctypes.c_int,
        [_P, ctypes.POINTER(TensorDesc), _P, _P, _P, _P, _P, _P, _P, _P,
         ctypes.POINTER(Params), _P],
    ),
    "sbnForwardInference": (
        ctypes.c_int,
        [ctypes.POINTER(TensorDesc), _P, _P, _P, _P, _P, _P, ctypes.c_float, _P],
    ),
    "sbnForwardTrainEx": (
        ctypes.c_int,
        [_P, ctypes.POINTER(TensorDesc), _P, _P, _P, _P, _P, _P, _P, _P, _P, _P,
         ctypes.POINTER(Params), ctypes.POINTER(Epilogue), _P],
    ),
    "sbnBackwardEx": (
        ctypes.c_int,
        [_P, ctypes.POINTER(TensorDesc), _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P,
         ctypes.POINTER(Params), ctypes.POINTER(Epilogue), _P],
    ),
    "sbnForwardInferenceEx": (
        ctypes.c_int,
        [ctypes.POINTER(TensorDesc), _P, _P, _P, _P, _P, _P, _P, ctypes.c_float, ctypes.POINTER(Epilogue), _P],
    ),
    "sbnBackwardInPlaceEx": (
        ctypes.c_int,
        [_P, ctypes.POINTER(TensorDesc), _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P,
         ctypes.POINTER(Params), ctypes.POINTER(Epilogue), _P],
    ),
}
for _name, (_res, _args) in _PROTOTYPES.items():
    try:
        _f = getattr(lib, _name)
    except AttributeError:  # an ImportError, as for a library not found: `except ImportError` guards take it
        raise ImportError(f"syncbn: {library_path} is not libsyncbn, or one older than this package: it has no "
                          f"{_name} (SYNCBN_LIBRARY: {os.environ.get('SYNCBN_LIBRARY') or 'not set'})") from None
    _f.restype = _res
    _f.argtypes = _args


def _result_code(code):
    """code as sbnResult_t's C int; -1 (no result's: the library's unknown one) outside
    its range, which ctypes would wrap (2**40 to 0, sbnSuccess)."""
    code = int(code)
    return code if -2 ** 31 <= code < 2 ** 31 else -1


def result_name(code):
    """sbnGetResultName: "sbnSuccess", "sbnTimeout", ..."""
    return lib.sbnGetResultName(_result_code(code)).decode()


def error_string(code):
    """sbnGetErrorString: the result's message."""
    return lib.sbnGetErrorString(_result_code(code)).decode()
