"""syncbn.torch's C++ operators (python/syncbn/csrc/torch_ops.cpp, built and loaded by
syncbn._native): what is loaded, its schemas, its cache, and what happens when it cannot
be built.

- with SYNCBN_TORCH_NATIVE=1 (how CI runs it) the operators' CPU, CUDA and Autograd
  kernels are the C++ ones (the dispatcher says where each was registered), with the
  Python fake kernels; their schemas are the Python operators' (_ops._SCHEMAS, and the
  fused operators' _fused.SCHEMAS), character for character: the two kinds are one
  interface;
- the cache: a second build request returns the same file without compiling; another
  variant (defines) is another file;
- a compiler that fails: SYNCBN_TORCH_NATIVE=1 raises ImportError naming the log, which
  has the compiler's output; auto warns (RuntimeWarning, saying why) and trains with the
  Python operators, equal to nn.BatchNorm2d; an unknown SYNCBN_TORCH_NATIVE is refused;
- two processes that import together with an empty cache: both load, one of them
  builds (the lock; builds.txt has one line);
- a cached library that does not load is built again, with a warning;
- a comm made before the operators were loaded is in their table (a layer runs on it);
- a destroy that returns sbnTimeout (the handle released all the same) takes the comm out
  of their table.

The subprocess tests run `python -c` with this process's environment (PYTHONPATH,
SYNCBN_LIBRARY) and a cache of their own; those of the cache's files and lock build with a
stand-in compiler that copies this process's library (copying_cxx), those of the build's
failures with compilers that fail.
"""

import os
import pathlib
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest
import unittest.mock

import torch

import syncbn
import syncbn.torch  # noqa: F401 (loads the operators)
from syncbn import _fused, _native, _ops

SCHEMAS = {**_ops._SCHEMAS, **_fused.SCHEMAS}  # the plain operators and the fused ones


def run_python(code, **env):
    e = dict(os.environ)
    e.update({k: str(v) for k, v in env.items()})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                          timeout=600)


TRAIN_ONE_STEP = """
    import warnings
    warnings.simplefilter("always")
    import torch, syncbn, syncbn.torch as sbt
    from syncbn import _ops
    comm = syncbn.cpu_team(1)[0]
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5, dtype=torch.float64).float()
    m, bn = sbt.SyncBatchNorm(3, comm=comm), torch.nn.BatchNorm2d(3)
    torch.testing.assert_close(m(x), bn(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.running_var, bn.running_var, rtol=1e-6, atol=1e-6)
    print("native" if _ops.NATIVE is not None else "python")
"""


@unittest.skipUnless(_native.mode() == "1", "SYNCBN_TORCH_NATIVE is not 1: the C++ operators are optional here")
class TestLoaded(unittest.TestCase):
    def test_kernels_are_the_cpp_ones(self):
        self.assertIsNotNone(_ops.NATIVE)
        for name in SCHEMAS:
            dump = torch._C._dispatch_dump(f"syncbn::{name}")
            for key in ("CPU", "CUDA", "Autograd[alias]"):
                line = next((ln for ln in dump.splitlines() if ln.startswith(key + ":")), "")
                self.assertIn("csrc/torch_ops.cpp", line, f"{name} {key}:\n{dump}")
            self.assertTrue(any(ln.startswith("Meta:") for ln in dump.splitlines()), dump)  # the fake kernel

    def test_schemas_are_the_python_operators(self):
        for name, schema in SCHEMAS.items():
            op = getattr(torch.ops.syncbn, name).default
            self.assertEqual(str(op._schema), str(torch._C.parse_schema(f"syncbn::{name}{schema}")))

    def test_cache_name_follows_the_cpp_runtime(self):
        """Machines that share a cache but not a C++ runtime (libstdc++) build files of their
        own: the runtime this process loaded is in the file's name, and another is another
        name."""
        self.assertIn("libstdc++", _native._runtime_id())
        here = _native.library_path()
        self.assertEqual(_native.built_library(), here)
        saved = _native._runtime_id
        try:
            _native._runtime_id = lambda: "/elsewhere/libstdc++.so.6:1:2"
            self.assertNotEqual(_native.library_path(), here)
        finally:
            _native._runtime_id = saved

    def test_cache_is_reused(self):
        path = _native.built_library()
        self.assertEqual(str(path), _ops.NATIVE.path)
        mtime = path.stat().st_mtime_ns
        self.assertEqual(_native.built_library(), path)
        self.assertEqual(path.stat().st_mtime_ns, mtime)  # not built again
        self.assertNotIn("-DX", _native.command(_native.SOURCE, "h", "o"))
        self.assertIn("-DX", _native.command(_native.SOURCE, "h", "o", ["-DX"]))
        umask = os.umask(0)
        os.umask(umask)
        self.assertEqual(stat.S_IMODE(path.stat().st_mode), 0o755 & ~umask)  # others may load a shared cache

    def test_without_python_headers(self):
        """Built without Python's headers (-USBN_TORCH_PYTHON, as where they are not
        installed): a failed call raises RuntimeError with SyncBNError's text, which the
        layer's eager calls turn into SyncBNError (_ops._library_error); one value per
        channel, ValueError, as nn.BatchNorm's."""
        ns = "syncbn_nopython"
        native = _native.Native(_native.built_library([f"-DSBN_TORCH_NS={ns}", "-USBN_TORCH_PYTHON"]))
        self.assertTrue(native.path)
        op = getattr(torch.ops, ns).batch_norm_train.default
        with self.assertRaises(RuntimeError) as cm:
            op(torch.randn(4, 3), None, None, None, None, None, 1e-5, 0.1, 10 ** 9)
        self.assertNotIsInstance(cm.exception, syncbn.SyncBNError)
        self.assertEqual(str(cm.exception).splitlines()[0],
                         "syncbn.Comm: no live comm has id 1000000000: it was destroyed [sbnInvalidUsage]")
        err = _ops._library_error(cm.exception)
        self.assertIsInstance(err, syncbn.SyncBNError)
        self.assertEqual((err.name, err.detail), ("sbnInvalidUsage", "no live comm has id 1000000000: it was destroyed"))
        # one value per channel: a ValueError there too (as nn.BatchNorm's), with the text
        comm = syncbn.cpu_team(1)[0]
        try:
            native.comm_put(comm)
            with self.assertRaises(ValueError) as cm:
                op(torch.randn(1, 3), None, None, None, None, None, 1e-5, 0.1, comm.id)
            self.assertNotIsInstance(cm.exception, syncbn.SyncBNError)
            self.assertRegex(str(cm.exception).splitlines()[0], r"^syncbn\.batch_norm_train \(sbnForwardTrain\): "
                                                                 r"Expected more than 1 value per channel .*"
                                                                 r"\[sbnInvalidArgument\]$")
        finally:
            comm.destroy()

    def test_comm_handed_over_twice_stays_live(self):
        """A comm handed over to the operators a second time (the first import's hand-over of
        the comms alive by then, beside the comm's own) keeps its one owner: before, the
        second replaced the first, whose release destroyed the live comm under the layer."""
        comm = syncbn.cpu_team(1)[0]
        _ops.NATIVE.comm_put(comm)
        x = torch.randn(4, 3, 5)
        torch.testing.assert_close(syncbn.torch.SyncBatchNorm(3, comm=comm)(x), torch.nn.BatchNorm1d(3)(x),
                                   rtol=1e-5, atol=1e-5)
        self.assertEqual(_ops.NATIVE.comm_live(comm.id), 1)
        comm.destroy()
        self.assertEqual(_ops.NATIVE.comm_live(comm.id), 0)

    def test_destroy_that_times_out_leaves_the_table(self):
        """sbnCommDestroy's sbnTimeout (a GPU team's devices did not finish: the handle is
        released all the same) takes the comm out of the operators' table, as a success does,
        and the layer's next call says it was destroyed. A CPU team's destroy never times out,
        so the library's destroy is wrapped (the operators' binding) to return sbnTimeout after
        destroying. Before, the entry stayed with the released handle for the next call."""
        r = run_python("""
            import ctypes, torch, syncbn, syncbn.torch as sbt
            from syncbn import _capi, _native, _ops
            assert _ops.NATIVE is not None
            lib = _capi.lib
            so = ctypes.CDLL(_ops.NATIVE.path)  # the loaded operators: rebind their library calls
            so.sbn_torch_bind.restype = ctypes.c_int
            so.sbn_torch_bind.argtypes = [ctypes.c_void_p] * len(_native.BOUND_CALLS)

            @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
            def destroy_timed_out(h):
                assert lib.sbnCommDestroy(h) == 0
                return 7  # sbnTimeout

            so.sbn_torch_bind(*(ctypes.cast(destroy_timed_out if name == "sbnCommDestroy" else getattr(lib, name),
                                            ctypes.c_void_p) for name in _native.BOUND_CALLS))
            comm = syncbn.cpu_team(1)[0]
            layer = sbt.SyncBatchNorm(3, comm=comm)
            layer(torch.randn(4, 3, 5))
            print("live", _ops.NATIVE.comm_live(comm.id))
            try:
                comm.destroy()
                print("destroyed")
            except syncbn.SyncBNError as e:
                print("raised", e.name)
            live = _ops.NATIVE.comm_live(comm.id)
            print("live", live)
            if live == 0:  # else the next call would take the released handle
                try:
                    layer(torch.randn(4, 3, 5))
                    print("ran")
                except RuntimeError as e:
                    print("then", "destroyed" in str(e))
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["live", "1", "raised", "sbnTimeout", "live", "0", "then", "True"])

    def test_exit_while_an_op_waits(self):
        """The process exits while a daemon thread's operator call waits for a peer that
        never calls: exit status 0. Before, the operators' table of comms was destroyed at
        exit, destroying the comm under the waiting call, whose thread then ended inside a
        noexcept frame while Python finalized: std::terminate, status 134."""
        r = run_python("""
            import threading, time, torch, syncbn, syncbn.torch as sbt
            from syncbn import _ops
            assert _ops.NATIVE is not None
            comms = syncbn.cpu_team(2, timeout_ms=20000)
            layer = sbt.SyncBatchNorm(3, comm=comms[0])
            threading.Thread(target=lambda: layer(torch.randn(4, 3, 5)), daemon=True).start()
            time.sleep(0.5)
            print("exiting", flush=True)
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["exiting"])


class TestLibraryErrorText(unittest.TestCase):
    def test_library_error_parsed(self):
        """SyncBNError from its text, also with C++'s stack trace after it
        (TORCH_SHOW_CPP_STACKTRACES=1); anything else is left as it is."""
        text = "syncbn.batch_norm_train (sbnForwardTrain): rank 0 waited 200 ms for rank 1 [sbnTimeout]"
        for tail in ("", "\nException raised from fail at torch_ops.cpp:92 (most recent call first):\nframe #0: x"):
            err = _ops._library_error(RuntimeError(text + tail))
            self.assertIsInstance(err, syncbn.SyncBNError)
            self.assertNotIsInstance(err, ValueError)
            self.assertEqual((err.name, err.detail, str(err)), ("sbnTimeout", "rank 0 waited 200 ms for rank 1", text))
        v = _ops._library_error(ValueError("syncbn.batch_norm_train (sbnForwardTrain): Expected more than 1 value "
                                           "per channel when training [sbnInvalidArgument]"))
        self.assertIsInstance(v, syncbn.SyncBNValueError)
        other = TypeError("syncbn.batch_norm_train: input dtype torch.float64; libsyncbn takes float32")
        self.assertIs(_ops._library_error(other), other)


class TestBuildFailure(unittest.TestCase):
    """A compiler that fails (CXX=false), with an empty cache."""

    def setUp(self):
        # why this machine and PyTorch cannot build the operators even with a compiler
        # (an older PyTorch): then that is the reason given, and nothing is compiled
        with unittest.mock.patch.dict(os.environ, CXX="false"):
            self.why = _native._why_not()
        self.reason = self.why or "the C++ operators did not compile (exit 1)"

    def test_required_raises_with_the_log(self):
        with tempfile.TemporaryDirectory() as cache:
            r = run_python("import syncbn.torch", SYNCBN_TORCH_NATIVE=1, CXX="false", SYNCBN_CACHE_DIR=cache)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("ImportError: syncbn: SYNCBN_TORCH_NATIVE=1, and the C++ operators are not available: "
                          + self.reason, r.stderr)
            if self.why is not None:
                return
            logs = list(pathlib.Path(cache).glob("*.log"))
            # and once more without compiled autograd, where it was asked for (_native.load)
            tries = 2 if "-DSBN_TORCH_COMPILED_AUTOGRAD" in _native.features() else 1
            self.assertEqual(len(logs), tries, r.stderr)
            for log in logs:
                self.assertTrue(log.read_text().startswith("false -O2 -std=c++20"))
            self.assertEqual(list(pathlib.Path(cache).glob("*.so")), [])  # nothing half-built left

    def test_failed_build_not_tried_again(self):
        """A second import with the cache of a failed build compiles nothing: it falls back
        at once, saying the failure is an earlier build's and how to build again. Before,
        every import compiled again (twice where compiled autograd is asked for), and the
        processes that waited for a build each compiled in turn."""
        if self.why is not None:
            self.skipTest(f"nothing is compiled here: {self.why}")
        with tempfile.TemporaryDirectory() as d:
            calls = pathlib.Path(d) / "calls"
            cxx = pathlib.Path(d) / "cxx"
            cxx.write_text(f'#!/bin/sh\necho x >> "{calls}"\nexit 1\n')
            cxx.chmod(0o755)
            cache = pathlib.Path(d) / "cache"
            counts, errs = [], []
            for _ in range(2):
                r = run_python(TRAIN_ONE_STEP, SYNCBN_TORCH_NATIVE="auto", CXX=str(cxx), SYNCBN_CACHE_DIR=cache)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout.split(), ["python"])
                counts.append(len(calls.read_text().splitlines()))
                errs.append(r.stderr)
            tries = 2 if "-DSBN_TORCH_COMPILED_AUTOGRAD" in _native.features() else 1
            self.assertEqual(counts, [tries, tries])  # none by the second import
            self.assertIn("the C++ operators did not compile (exit 1)", errs[1])
            self.assertIn("an earlier build's failure: delete", errs[1])
            for marker in cache.glob("*.failed"):  # deleted: the next import compiles again
                marker.unlink()
            run_python(TRAIN_ONE_STEP, SYNCBN_TORCH_NATIVE="auto", CXX=str(cxx), SYNCBN_CACHE_DIR=cache)
            self.assertEqual(len(calls.read_text().splitlines()), 2 * tries)
            # a compiler killed by a signal (out of memory) marks nothing: tried again
            cxx.write_text(f'#!/bin/sh\necho x >> "{calls}"\nkill -9 $$\n')
            cache = pathlib.Path(d) / "cache-killed"
            for _ in range(2):
                r = run_python(TRAIN_ONE_STEP, SYNCBN_TORCH_NATIVE="auto", CXX=str(cxx), SYNCBN_CACHE_DIR=cache)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertNotIn("an earlier build's failure", r.stderr)
            self.assertEqual(len(calls.read_text().splitlines()), 4 * tries)
            self.assertEqual(list(cache.glob("*.failed")), [])

    def test_auto_warns_and_trains_with_the_python_operators(self):
        with tempfile.TemporaryDirectory() as cache:
            r = run_python(TRAIN_ONE_STEP, SYNCBN_TORCH_NATIVE="auto", CXX="false", SYNCBN_CACHE_DIR=cache)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.split(), ["python"])
            self.assertIn("RuntimeWarning: syncbn.torch: the C++ operators are not available (" + self.reason, r.stderr)

    def test_off_is_silent(self):
        r = run_python(TRAIN_ONE_STEP, SYNCBN_TORCH_NATIVE=0)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["python"])
        self.assertNotIn("Warning", r.stderr)

    def test_unknown_mode_refused(self):
        r = run_python("import syncbn.torch", SYNCBN_TORCH_NATIVE="yes")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("SYNCBN_TORCH_NATIVE='yes': expected auto, 1 or 0", r.stderr)


@unittest.skipUnless("-DSBN_TORCH_COMPILED_AUTOGRAD" in _native.features(),
                     f"PyTorch {torch.__version__}: the operators are built without compiled autograd anyway")
class TestCompiledAutogradBuildFailure(unittest.TestCase):
    def test_built_without_it_and_warned(self):
        """A PyTorch whose compiled-autograd headers the nodes do not compile against (a
        compiler that fails while SBN_TORCH_COMPILED_AUTOGRAD is defined): the C++
        operators are built without it, with a warning that says so, and train."""
        with tempfile.TemporaryDirectory() as d:
            cxx = pathlib.Path(d) / "cxx"
            cxx.write_text('#!/bin/sh\n'
                           'case " $* " in *" -USBN_TORCH_COMPILED_AUTOGRAD "*) ;;\n'
                           '  *" -DSBN_TORCH_COMPILED_AUTOGRAD "*) echo "no compiled autograd here" >&2; exit 1;;\n'
                           'esac\n'
                           'exec c++ "$@"\n')
            cxx.chmod(0o755)
            r = run_python(TRAIN_ONE_STEP, SYNCBN_TORCH_NATIVE=1, CXX=str(cxx), SYNCBN_CACHE_DIR=pathlib.Path(d) / "c")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.split(), ["native"])
            self.assertIn("RuntimeWarning: syncbn.torch: the C++ operators are built without compiled autograd "
                          "support", r.stderr)


def copying_cxx(folder, arrivals=0):
    """A stand-in compiler (a script in `folder`) for the tests of the cache, which are
    about its files and lock, not about compiling: it writes the library this process
    built with the real compiler (the same source, PyTorch and flags) where -o says, so
    that a build takes no compile's ~30 s of a core. Its path goes into CXX, and so into
    the cached file's name (library_path). With `arrivals`, it first waits (up to 5
    minutes) until that many files arrived-* are in `folder` (each process about to
    import syncbn.torch writes one), then 2 s more, and writes how many there were into
    `folder`/arrivals."""
    built = _native.built_library()
    cxx = pathlib.Path(folder) / "cxx"
    cxx.write_text('#!/bin/sh\n'
                   f'n=0; while [ $(ls "{folder}" | grep -c "^arrived-") -lt {arrivals} ] && [ $n -lt 3000 ]; do\n'
                   '  sleep 0.1; n=$((n + 1))\n'
                   'done\n'
                   f'[ {arrivals} -eq 0 ] || {{ sleep 2; ls "{folder}" | grep -c "^arrived-" > "{folder}/arrivals"; }}\n'
                   'while [ $# -gt 1 ]; do\n'
                   f'  [ "$1" = -o ] && exec cp "{built}" "$2"\n'
                   '  shift\n'
                   'done\n'
                   'exit 1\n')
    cxx.chmod(0o755)
    return cxx


@unittest.skipUnless(_native.mode() == "1", "SYNCBN_TORCH_NATIVE is not 1: the C++ operators are optional here")
class TestBuildTogether(unittest.TestCase):
    def test_two_processes_one_build(self):
        """Two processes with an empty cache import at once (as one process per GPU
        does): both load the operators and train; the cache holds one library. The
        build (a stand-in compiler) lasts until both processes are about to import
        syncbn.torch, and 2 s more, so that one waits at the lock while the other builds."""
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as d:
            cxx = copying_cxx(d, arrivals=2)
            e = dict(os.environ, SYNCBN_TORCH_NATIVE="1", SYNCBN_CACHE_DIR=cache, CXX=str(cxx))
            arrive = f"import os, torch, syncbn\nopen(os.path.join({d!r}, f'arrived-{{os.getpid()}}'), 'w').close()\n"
            code = arrive + textwrap.dedent(TRAIN_ONE_STEP)
            procs = [subprocess.Popen([sys.executable, "-c", code], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
            outs = [p.communicate(timeout=900) for p in procs]
            for p, (out, err) in zip(procs, outs):
                self.assertEqual(p.returncode, 0, err)
                self.assertEqual(out.split(), ["native"])
            self.assertEqual(len(list(pathlib.Path(cache).glob("*.so"))), 1)
            builds = (pathlib.Path(cache) / "builds.txt").read_text().splitlines()
            self.assertEqual(len(builds), 1, builds)  # one compiled, the other waited and loaded it
            self.assertEqual((pathlib.Path(d) / "arrivals").read_text().split(), ["2"])  # both there during it


@unittest.skipUnless(_native.mode() == "1", "SYNCBN_TORCH_NATIVE is not 1: the C++ operators are optional here")
class TestCachedFileThatDoesNotLoad(unittest.TestCase):
    def test_built_again(self):
        """A cached library that does not load (another machine's build in a shared cache,
        a damaged file: here the file's bytes are not a library) is built again, with a
        warning that names it, and the operators load and train; it was kept, and the
        failure blamed on compiled autograd. (The build: a stand-in compiler that writes
        this process's library.)"""
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as d:
            cxx = copying_cxx(d)
            with unittest.mock.patch.dict(os.environ, CXX=str(cxx)):
                name = _native.library_path().name  # the name the child computes: the same PyTorch, source, CXX
            bad = pathlib.Path(cache) / name
            bad.write_bytes(b"not a shared library\n" * 64)
            r = run_python(TRAIN_ONE_STEP, SYNCBN_TORCH_NATIVE=1, SYNCBN_CACHE_DIR=cache, CXX=cxx)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.split(), ["native"])
            self.assertIn(f"RuntimeWarning: syncbn.torch: the cached C++ operators {bad} did not load", r.stderr)
            self.assertNotIn("without compiled autograd", r.stderr)
            self.assertNotEqual(bad.read_bytes()[:4], b"not ")
            self.assertEqual(bad.read_bytes()[:4], b"\x7fELF")
            builds = (pathlib.Path(cache) / "builds.txt").read_text().splitlines()
            self.assertEqual(len(builds), 1, builds)

    def test_not_built_again_where_a_build_does_not_mend_it(self):
        """A file that a build does not make loadable (here a compiler that writes bytes
        that are not a library): the process that built it falls back; the next one builds
        it again once, fails, and leaves a marker; the one after falls back at once, with
        no build."""
        with tempfile.TemporaryDirectory() as d:
            cxx = pathlib.Path(d) / "cxx"
            cxx.write_text('#!/bin/sh\n'
                           'while [ $# -gt 1 ]; do [ "$1" = -o ] && { echo "not a library" > "$2"; exit 0; }; shift; done\n'
                           'exit 1\n')
            cxx.chmod(0o755)
            cache = pathlib.Path(d) / "c"
            builds = []
            for _ in range(3):
                r = run_python(TRAIN_ONE_STEP, SYNCBN_TORCH_NATIVE="auto", CXX=str(cxx), SYNCBN_CACHE_DIR=cache)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout.split(), ["python"])  # the fallback, each time
                builds.append(len((cache / "builds.txt").read_text().splitlines()))
            self.assertGreater(builds[1], builds[0])  # built again once
            self.assertEqual(builds[2], builds[1])  # then not
            self.assertTrue(list(cache.glob("*.so.noload")))


class TestCommsBeforeLoad(unittest.TestCase):
    def test_comm_made_before_the_operators(self):
        """A comm made before syncbn.torch was imported is in the C++ operators' table."""
        r = run_python("""
            import torch, syncbn
            comm = syncbn.cpu_team(1)[0]          # before the operators are loaded
            import syncbn.torch as sbt
            from syncbn import _ops
            y = sbt.SyncBatchNorm(3, comm=comm)(torch.randn(4, 3, 5))
            print("native" if _ops.NATIVE is not None else "python", tuple(y.shape))
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("(4, 3, 5)", r.stdout)
        if _native.mode() == "1":
            self.assertIn("native", r.stdout)

    def test_comm_made_while_the_operators_load(self):
        """A team made by one thread while another imports syncbn.torch (which hands the
        comms alive by then over to the C++ operators) is handed over once: both ranks run.
        Its Comm's library calls are slowed down, so that the import's hand-over runs while
        the team is being made (where a comm was known by id before it was handed over, both
        handed it over, and the second hand-over destroyed it)."""
        r = run_python("""
            import threading, time, torch, syncbn
            from syncbn import _capi
            real = _capi.lib.sbnCommCount
            class Slow:
                argtypes = real.argtypes
                def __call__(self, *a):
                    time.sleep(1.0)
                    return real(*a)
            _capi.lib.sbnCommCount = Slow()
            box = {}
            t = threading.Thread(target=lambda: box.setdefault("comms", syncbn.cpu_team(2, timeout_ms=20000)))
            t.start()
            time.sleep(0.3)
            import syncbn.torch as sbt
            t.join()
            _capi.lib.sbnCommCount = real
            layers = [sbt.SyncBatchNorm(3, comm=c) for c in box["comms"]]
            out = {}
            ts = [threading.Thread(target=lambda r=r: out.setdefault(r, layers[r](torch.randn(4, 3, 5)).shape))
                  for r in range(2)]
            [x.start() for x in ts]
            [x.join() for x in ts]
            print(sorted(out), tuple(out.get(0, ())))
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "[0, 1] (4, 3, 5)", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
