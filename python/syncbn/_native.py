"""syncbn's operators in C++ (csrc/torch_ops.cpp): built on first use against the running
PyTorch, cached, and loaded into PyTorch's dispatcher. Internal: syncbn._ops uses them
when ``load()`` succeeds, and its Python kernels otherwise.

Why built here and not by ``pip install``: a C++ operator is compiled against one
PyTorch's headers and C++ ABI, and the PyTorch a user runs is only known at run time (a
build with pip's build isolation would download a PyTorch of its own). So the first
``import syncbn.torch`` with a new PyTorch (or a new syncbn) compiles one file, about 15 s
on 2 cores, into the cache, ``$SYNCBN_CACHE_DIR``, else ``$XDG_CACHE_HOME/syncbn``, else
``~/.cache/syncbn`` (``builds.txt`` there lists each build); later imports load it in
milliseconds. Processes that start together
(one per GPU) wait for one build (a file lock), not one each.

``SYNCBN_TORCH_NATIVE``: ``auto`` (the default: the C++ operators where they build, else
the Python ones with a RuntimeWarning that says why), ``1`` (the C++ operators or an
ImportError that says why), ``0`` (the Python operators).

The library itself is not linked into the operators: they get the functions of the
libsyncbn that ``syncbn`` loaded (``sbn_torch_bind``), and the live comms by id
(``comm_put`` / ``comm_drop``, called by ``syncbn.Comm``).
"""

import contextlib
import ctypes
import hashlib
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings

import torch

from . import _capi

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / "csrc" / "torch_ops.cpp"
BUILD_TIMEOUT_S = 900


def mode():
    """SYNCBN_TORCH_NATIVE: "auto", "1" or "0" (anything else is refused, naming it)."""
    m = os.environ.get("SYNCBN_TORCH_NATIVE", "auto").strip().lower() or "auto"
    if m not in ("auto", "0", "1"):
        raise ImportError(f"syncbn: SYNCBN_TORCH_NATIVE={m!r}: expected auto, 1 or 0")
    return m


def _header_dir():
    """The directory of syncbn.h: the installed package's copy, or the source tree's."""
    for d in (HERE / "include", HERE.parent.parent / "include"):
        if (d / "syncbn.h").is_file():
            return d
    return None


def cache_dir():
    env = os.environ.get("SYNCBN_CACHE_DIR")
    if env:
        return pathlib.Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache") / "syncbn"


def _torch_include_dirs():
    """([include dirs], lib dir) of the running PyTorch: what torch.utils.cpp_extension's
    include_paths() and library_paths() give a CPU extension (not imported: it logs about
    CUDA_HOME at import)."""
    root = pathlib.Path(torch.__file__).resolve().parent
    inc = root / "include"
    return [str(inc), str(inc / "torch" / "csrc" / "api" / "include")], str(root / "lib")


def _compiler():
    """The C++ compiler's command ($CXX may carry arguments: "ccache g++")."""
    return shlex.split(os.environ.get("CXX", "c++")) or ["c++"]


def _python_include():
    """Python's C headers (SyncBNError raised from C++), or None where not installed."""
    d = sysconfig.get_paths().get("include")
    return d if d and os.path.isfile(os.path.join(d, "Python.h")) else None


def _header_has(incs, relpath, text):
    """Whether PyTorch's header incs[0]/relpath exists and contains `text`."""
    f = pathlib.Path(incs[0]) / relpath
    return f.is_file() and text in f.read_text(errors="replace")


def features():
    """The -D flags this PyTorch and Python allow: SBN_TORCH_NATIVE_HANDLE (c10::Stream's
    native_handle(), else the CUDA stream through libc10_cuda's CUDAStream::stream),
    SBN_TORCH_COMPILED_AUTOGRAD (Node's const compiled_args and compiled autograd's
    PyCompilerInterface, PyTorch 2.7 and later: the nodes support compiled autograd; where
    the build fails with it, load() builds without it) and
    SBN_TORCH_PYTHON (failed calls raise syncbn.SyncBNError, else a RuntimeError with its
    text)."""
    flags = []
    incs, _ = _torch_include_dirs()
    if _header_has(incs, "c10/core/Stream.h", "native_handle()"):
        flags.append("-DSBN_TORCH_NATIVE_HANDLE")
    compiled_args = "virtual void compiled_args(CompiledNodeArgs& args) const"
    interface = ("struct TORCH_API PyCompilerInterface", "bool is_traceable", "struct PackedArgs")
    if (all(_header_has(incs, "torch/csrc/dynamo/compiled_autograd.h", t) for t in interface)
            and any(_header_has(incs, f"torch/csrc/autograd/{h}", compiled_args) for h in ("node.h", "function.h"))):
        flags.append("-DSBN_TORCH_COMPILED_AUTOGRAD")
    if _python_include() is not None:
        flags.append("-DSBN_TORCH_PYTHON")
    return flags


def command(source, header_dir, out, defines=()):
    """The compiler's command line for the operators' library `out` (defines: -D flags,
    the test's mutants; the features() of this PyTorch and Python come first)."""
    incs, libdir = _torch_include_dirs()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    feats = features()
    py = [f"-I{_python_include()}", "-ltorch_python"] if "-DSBN_TORCH_PYTHON" in feats else []
    return ([*_compiler(), "-O2", "-std=c++20", "-shared", "-fPIC", "-fvisibility=hidden",
             f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *feats, *defines, *(f"-I{d}" for d in incs), f"-I{header_dir}",
             str(source), f"-L{libdir}", "-lc10", "-ltorch_cpu", *py, f"-Wl,-rpath,{libdir}", "-o", str(out)])


def _why_not():
    """Why this PyTorch or machine cannot build the operators, or None."""
    if _header_dir() is None:
        return "syncbn.h is not next to the package (an incomplete install)"
    if not SOURCE.is_file():
        return f"{SOURCE} is missing (an incomplete install)"
    cxx = _compiler()[0]
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx!r} not found; CXX names one)"
    incs, _ = _torch_include_dirs()
    if not (pathlib.Path(incs[0]) / "torch" / "library.h").is_file():
        return f"PyTorch {torch.__version__} ships no C++ headers"
    return None


_BUILT_HERE = set()  # what built_library compiled in this process


def _runtime_id():
    """The C++ runtime this process runs (libstdc++ as /proc/self/maps names it: path, size,
    mtime), so that machines sharing a cache but not a runtime build files of their own;
    '' where none is found."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libstdc++" in line:
                    path = line.split()[-1]
                    st = os.stat(path)
                    return f"{path}:{st.st_size}:{st.st_mtime_ns}"
    except (OSError, IndexError):
        pass
    return ""


def library_path(defines=()):
    """Where the operators' library for this PyTorch, Python, C++ runtime, compiler command
    and source (and defines) is in the cache (built or not)."""
    hdr = _header_dir()
    probe = command(SOURCE, hdr, "OUT", defines)
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), (hdr / "syncbn.h").read_bytes(), torch.__version__.encode(),
                 str(pathlib.Path(torch.__file__).parent).encode(), sys.version.encode(), " ".join(probe).encode(),
                 _runtime_id().encode()):
        h.update(part)
        h.update(b"\0")
    return cache_dir() / f"syncbn_torch_ops-{torch.__version__.replace('+', '_')}-{h.hexdigest()[:16]}.so"


def _stat_key(st):
    """A file's identity for the rebuild's checks: inode, mtime, size."""
    return f"{st.st_ino} {st.st_mtime_ns} {st.st_size}"


def built_library(defines=(), stale=None):
    """The path of the operators' library for this PyTorch and this source (and defines),
    built into the cache if it is not there yet (one build at a time: a lock file), or if
    the file there is still `stale` (the os.stat of a cached file that did not load: built
    again, unless another process has replaced it since). Raises RuntimeError naming the
    file with the compiler's output when the build fails."""
    import fcntl

    hdr = _header_dir()
    out = library_path(defines)
    d = out.parent
    d.mkdir(parents=True, exist_ok=True)

    def same(st):
        return stale is not None and _stat_key(st) == _stat_key(stale)

    # a build of this very file (source, PyTorch, compiler command) failed before: its
    # failure again at once, rather than a compile per import and per waiting process
    failed = out.with_name(out.name + ".failed")

    def failed_before():
        try:
            why = failed.read_text().strip()
        except OSError:
            return
        raise RuntimeError(f"{why} (an earlier build's failure: delete {failed} to build again)")

    if out.is_file() and not same(out.stat()):
        return out
    if stale is None:
        failed_before()
    with open(d / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same file
        if out.is_file() and not same(out.stat()):
            return out
        if stale is None:
            failed_before()
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=d)
        os.close(fd)
        try:
            cmd = command(SOURCE, hdr, tmp, defines)
            t0 = time.monotonic()
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            if r.returncode != 0:
                log = d / (out.stem + ".log")
                log.write_text(" ".join(cmd) + "\n\n" + r.stdout + r.stderr)
                why = f"the C++ operators did not compile (exit {r.returncode}); the compiler's output is in {log}"
                # not where the compiler was killed (a signal: memory, several ranks compiling
                # at once) or the disk was full: another try may well build
                if r.returncode > 0 and "No space left on device" not in r.stdout + r.stderr:
                    try:
                        failed.write_text(why + "\n")
                    except OSError:
                        pass
                raise RuntimeError(why)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o755 & ~umask)  # mkstemp's 0600 would keep other users of a shared cache out
            os.replace(tmp, out)  # whole or not at all: a reader never sees a partial file
            _BUILT_HERE.add(out)
            with open(d / "builds.txt", "a") as f:  # what was built, when, in how long
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')}  {out.name}  {time.monotonic() - t0:.1f} s  "
                        f"pid {os.getpid()}\n")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return out


# The library's calls the C++ operators make, in sbn_torch_bind's order (csrc/torch_ops.cpp)
BOUND_CALLS = ("sbnForwardTrain", "sbnBackward", "sbnForwardInference", "sbnGetLastError", "sbnGetErrorString",
               "sbnGetResultName", "sbnCommDestroy", "sbnForwardTrainEx", "sbnBackwardEx", "sbnForwardInferenceEx",
               "sbnBackwardInPlaceEx")


class Native:
    """The loaded C++ operators: `path`, and the comm registry's two functions."""

    def __init__(self, path):
        torch.ops.load_library(str(path))
        so = ctypes.CDLL(str(path))  # the same loaded object: its extern "C" functions
        p = ctypes.c_void_p
        so.sbn_torch_bind.restype = ctypes.c_int
        so.sbn_torch_bind.argtypes = [p] * len(BOUND_CALLS)
        so.sbn_torch_bind(*(ctypes.cast(getattr(_capi.lib, name), p) for name in BOUND_CALLS))
        so.sbn_torch_comm_put.restype = None
        so.sbn_torch_comm_put.argtypes = [ctypes.c_int64, p, ctypes.c_int, ctypes.c_char_p]
        so.sbn_torch_comm_drop.restype = ctypes.c_int
        so.sbn_torch_comm_drop.argtypes = [ctypes.c_int64, ctypes.c_int]
        so.sbn_torch_comm_live.restype = ctypes.c_int
        so.sbn_torch_comm_live.argtypes = [ctypes.c_int64]
        so.sbn_torch_comm_serial.restype = ctypes.c_int
        so.sbn_torch_comm_serial.argtypes = [ctypes.c_int64]
        self.comm_serial = so.sbn_torch_comm_serial
        self.path = str(path)
        self._put, self._drop, self.comm_live = so.sbn_torch_comm_put, so.sbn_torch_comm_drop, so.sbn_torch_comm_live

    def comm_put(self, comm):
        """Hands the live comm over: the operators destroy it from now on (comm_drop); a
        comm whose calls are serialized (Comm._serialize_calls) is so here too."""
        self._put(comm.id, comm._h.value, int(comm.host), comm._transport.encode())
        if not isinstance(comm._serial, contextlib.nullcontext):
            self.comm_serial(comm.id)

    def comm_drop(self, comm_id, collected=False):
        """Takes comm_id out of the table and destroys it, at once (sbnCommDestroy's result)
        or, when an operator call is using it, when that call returns (-1); -2 when it was
        never handed over (the caller destroys it). collected (Python collected the Comm):
        while an autograd node that will call it lives, it stays live (comm_live(comm_id)
        is 1) until the last such node is gone, and this returns -3."""
        return self._drop(comm_id, int(collected))


def _built_and_loaded(defines=()):
    """Native of built_library(defines); a cached file that does not load (damaged; built
    on a machine whose C++ runtime this one lacks) is built again once, with a warning that
    says why. A file this process built is not; nor one that a build did not mend: its
    marker `<file>.noload` (the file's inode, mtime and size) says so to later processes,
    which then fall back at once instead of building again."""
    path = built_library(defines)
    st = path.stat()
    try:
        return Native(path)
    except OSError as e:
        marker = path.with_name(path.name + ".noload")
        try:
            unmendable = marker.read_text().split("\n")[0] == _stat_key(st)
        except OSError:
            unmendable = False
        if path in _BUILT_HERE or unmendable:  # another build would not load either
            raise
        rebuilt = built_library(defines, stale=st)
        try:
            native = Native(rebuilt)
        except OSError as e2:
            try:
                marker.write_text(f"{_stat_key(rebuilt.stat())}\n{e2}\n")
            except OSError:
                pass
            raise
        warnings.warn(f"syncbn.torch: the cached C++ operators {path} did not load ({e}); built again",
                      RuntimeWarning, stacklevel=4)
        return native


def load():
    """(Native, None) when the C++ operators are loaded; (None, why) when not, per mode()."""
    m = mode()
    if m == "0":
        return None, "SYNCBN_TORCH_NATIVE=0"
    why = _why_not()
    if why is None:
        try:
            return _built_and_loaded(), None
        except (OSError, RuntimeError, subprocess.SubprocessError) as e:
            why = str(e)
        if "-DSBN_TORCH_COMPILED_AUTOGRAD" in features():
            # compiled autograd's C++ interface is PyTorch's internal one: where this
            # PyTorch's differs from what the nodes use, the operators without it
            try:
                native = _built_and_loaded(["-USBN_TORCH_COMPILED_AUTOGRAD"])
            except (OSError, RuntimeError, subprocess.SubprocessError):
                pass
            else:
                warnings.warn(f"syncbn.torch: the C++ operators are built without compiled autograd support "
                              f"(torch._dynamo.compiled_autograd), which did not build or load with PyTorch "
                              f"{torch.__version__}: {why}", RuntimeWarning, stacklevel=3)
                return native, None
    if m == "1":
        raise ImportError(f"syncbn: SYNCBN_TORCH_NATIVE=1, and the C++ operators are not available: {why}")
    return None, why
