"""The Python package's C API wrapper (python/syncbn) against a float64 NumPy reference.

Run against the installed package (.ci/run python: a fresh virtual environment, `pip
install .`), or from a source tree with PYTHONPATH=python and SYNCBN_LIBRARY=<build>/src/
libsyncbn.so (then the package-metadata check is skipped, and says so).

What is under test is the binding (structs, argument order, pointers, errors, threads),
not the arithmetic, which the C tests hold to much tighter bounds: a swapped or dropped
argument gives errors of order 1, far above the tolerances here. Tolerances: fp32
outputs within 2e-5 (relative) + 2e-5 (absolute) of the float64 values: the library's
fp32 results are within a few ulp (6e-8 relative each) of the exact ones for these
small, well-conditioned inputs (N(0,1) + 3, 10-50 values per channel); fp16 y within
2e-3 (relative) + 2e-3 (absolute): one fp16 rounding of the output (2^-11 = 4.9e-4
relative) plus the input's own.
"""

import copy
import importlib.metadata
import importlib.util
import os
import pathlib
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

import numpy as np

import syncbn
from rank_threads import destroy_result

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_ranks(comms, fn):
    """fn(r) on a thread per rank (the CPU team's ranks are threads); the exceptions by rank."""
    errs = [None] * len(comms)

    def body(r):
        try:
            fn(r)
        except Exception as e:  # noqa: BLE001 (reported per rank)
            errs[r] = e

    ts = [threading.Thread(target=body, args=(r,)) for r in range(len(comms))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errs


def _header_program_output(cc, src):
    """The stdout of the C program src, compiled with cc against the tree's include/syncbn.h."""
    with tempfile.TemporaryDirectory() as d:
        c = pathlib.Path(d) / "prog.c"
        c.write_text(src)
        exe = pathlib.Path(d) / "prog"
        subprocess.run([cc, "-I", str(ROOT / "include"), str(c), "-o", str(exe)], check=True)
        return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


def to_nc(x, layout):
    """(n, c, spatial) view of a rank's tensor in either layout, as float64."""
    x = np.asarray(x, dtype=np.float64)
    return x if layout == syncbn.NCHW else np.transpose(x, (0, 2, 1))


class TestCapi(unittest.TestCase):
    def test_version_defined_once(self):
        h = (ROOT / "include" / "syncbn.h").read_text()
        parts = [re.search(rf"#define SBN_VERSION_{p} (\d+)", h).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
        header = ".".join(parts)
        self.assertEqual(syncbn.__version__, header)
        self.assertEqual(syncbn.library_version(), header)
        if os.environ.get("SYNCBN_LIBRARY"):
            print("test_version_defined_once: source tree (SYNCBN_LIBRARY): package metadata not checked")
        else:
            self.assertEqual(importlib.metadata.version("syncbn"), header)

    def test_struct_layout_matches_header(self):
        cc = shutil.which(os.environ.get("CC", "cc"))
        self.assertIsNotNone(cc, "a C compiler is needed to read the header's struct sizes")
        src = (
            '#include <stddef.h>\n#include <stdio.h>\n#include "syncbn.h"\n'
            "int main(void) { printf(\"%zu %zu %zu %zu %zu %zu %zu %zu\\n\", sizeof(sbnTensorDesc_t),"
            " offsetof(sbnTensorDesc_t, n), sizeof(sbnConfig_t), offsetof(sbnConfig_t, timeout_ms),"
            " sizeof(sbnParams_t), offsetof(sbnParams_t, grad_mode), sizeof(sbnEpilogue_t),"
            " offsetof(sbnEpilogue_t, slope)); return 0; }\n"
        )
        got = [int(v) for v in _header_program_output(cc, src).split()]
        import ctypes

        from syncbn._capi import Epilogue

        want = [ctypes.sizeof(syncbn.TensorDesc), syncbn.TensorDesc.n.offset, ctypes.sizeof(syncbn.Config),
                syncbn.Config.timeout_ms.offset, ctypes.sizeof(syncbn.Params), syncbn.Params.grad_mode.offset,
                ctypes.sizeof(Epilogue), Epilogue.slope.offset]
        self.assertEqual(got, want)

    def test_constants_match_header(self):
        # The package's copies of syncbn.h's constants (syncbn._capi, syncbn, syncbn.torch),
        # each against what the C compiler reads in the header: a copy that drifts (the
        # in-place weight threshold, an enum value) would pass everything else unnoticed.
        cc = shutil.which(os.environ.get("CC", "cc"))
        self.assertIsNotNone(cc, "a C compiler is needed to read the header's constants")
        from syncbn import _capi

        ints = {
            "SBN_CONFIG_MAGIC": _capi.SBN_CONFIG_MAGIC, "SBN_CONFIG_VERSION": _capi.SBN_CONFIG_VERSION,
            "SBN_DEFAULT_TIMEOUT_MS": _capi.SBN_DEFAULT_TIMEOUT_MS,
            "SBN_DEFAULT_MAX_CHANNELS": _capi.SBN_DEFAULT_MAX_CHANNELS,
            "SBN_MAX_CPU_TEAM_RANKS": _capi.SBN_MAX_CPU_TEAM_RANKS, "sbnInvalidUsage": syncbn._INVALID_USAGE,
            "sbnFloat32": syncbn.FLOAT32, "sbnFloat16": syncbn.FLOAT16, "sbnBFloat16": syncbn.BFLOAT16,
            "sbnLayoutNCHW": syncbn.NCHW, "sbnLayoutNHWC": syncbn.NHWC,
            "sbnGradLocal": syncbn.GRAD_LOCAL, "sbnGradGlobal": syncbn.GRAD_GLOBAL,
            "sbnActivationIdentity": syncbn.IDENTITY, "sbnActivationRelu": syncbn.RELU,
            "sbnActivationLeakyRelu": syncbn.LEAKY_RELU,
        }
        floats = {}
        if importlib.util.find_spec("torch") is None:
            print("test_constants_match_header: no torch: syncbn.torch's SBN_RECOVER_MIN_WEIGHT not checked")
        else:
            import syncbn.torch as st

            floats["SBN_RECOVER_MIN_WEIGHT"] = st._RECOVER_MIN_WEIGHT
        body = "".join(f'  printf("{k} %lld\\n", (long long)({k}));\n' for k in ints)
        body += "".join(f'  printf("{k} %.9g\\n", (double)({k}));\n' for k in floats)
        src = f'#include <stdio.h>\n#include "syncbn.h"\nint main(void) {{\n{body}  return 0;\n}}\n'
        header = dict(line.split() for line in _header_program_output(cc, src).splitlines())
        for k, v in ints.items():
            self.assertEqual(int(header[k]), v, k)
        for k, v in floats.items():  # the header's float, as C reads it, within its own rounding
            self.assertAlmostEqual(float(header[k]), v, delta=abs(v) * 2.0 ** -23, msg=k)

    def _team_case(self, layout, dtype, ns, c, sp, momentum, seed):
        rng = np.random.default_rng(seed)
        W = len(ns)
        npdt = np.float32 if dtype == syncbn.FLOAT32 else np.float16
        shape = (lambda n: (n, c, sp)) if layout == syncbn.NCHW else (lambda n: (n, sp, c))
        x = [(rng.standard_normal(shape(n)) + 3.0).astype(npdt) for n in ns]
        dy = [rng.standard_normal(shape(n)).astype(npdt) for n in ns]
        y = [np.full(shape(n), np.nan, npdt) for n in ns]
        dx = [np.full(shape(n), np.nan, npdt) for n in ns]
        w = (rng.random(c) + 0.5).astype(np.float32)
        b = (rng.random(c) - 0.5).astype(np.float32)
        rm = [np.zeros(c, np.float32) for _ in ns]
        rv = [np.ones(c, np.float32) for _ in ns]
        nbt = [np.zeros(1, np.int64) for _ in ns]
        smean = [np.zeros(c, np.float32) for _ in ns]
        sinv = [np.zeros(c, np.float32) for _ in ns]
        dw = [np.zeros(c, np.float32) for _ in ns]
        db = [np.zeros(c, np.float32) for _ in ns]
        comms = syncbn.cpu_team(W, timeout_ms=60000)
        try:
            def fwd(r):
                comms[r].forward_train(syncbn.desc(dtype, layout, ns[r], c, sp), x[r], y[r], smean[r], sinv[r],
                                       weight=w, bias=b, running_mean=rm[r], running_var=rv[r],
                                       num_batches_tracked=nbt[r], momentum=momentum)

            def bwd(r):
                comms[r].backward(syncbn.desc(dtype, layout, ns[r], c, sp), x[r], dy[r], dx[r], smean[r], sinv[r],
                                  weight=w, dweight=dw[r], dbias=db[r])

            self.assertEqual(run_ranks(comms, fwd), [None] * W)
            self.assertEqual(run_ranks(comms, bwd), [None] * W)
        finally:
            for cm in comms:
                cm.destroy()
        # the float64 reference: nn.BatchNorm of the concatenated batch
        X = np.concatenate([to_nc(v, layout) for v in x], axis=0)  # (N, c, sp)
        DY = np.concatenate([to_nc(v, layout) for v in dy], axis=0)
        M = X.shape[0] * sp
        mean = X.mean(axis=(0, 2))
        var = X.var(axis=(0, 2))
        invstd = 1.0 / np.sqrt(var + 1e-5)
        xhat = (X - mean[None, :, None]) * invstd[None, :, None]
        Y = xhat * w[None, :, None] + b[None, :, None]
        f = 1.0 if momentum is None else momentum  # None: cumulative, the first call's factor is 1/1
        rm_ref = (1 - f) * 0.0 + f * mean
        rv_ref = (1 - f) * 1.0 + f * var * M / (M - 1)
        sdy = DY.sum(axis=(0, 2))
        sdyx = (DY * xhat).sum(axis=(0, 2))
        DX = (w * invstd)[None, :, None] * (DY - sdy[None, :, None] / M - xhat * sdyx[None, :, None] / M)
        tol = dict(rtol=2e-5, atol=2e-5) if dtype == syncbn.FLOAT32 else dict(rtol=2e-3, atol=2e-3)
        o = 0
        for r, n in enumerate(ns):
            np.testing.assert_allclose(to_nc(y[r], layout), Y[o:o + n], **tol)
            np.testing.assert_allclose(to_nc(dx[r], layout), DX[o:o + n], **tol)
            np.testing.assert_allclose(smean[r], mean, rtol=2e-5, atol=2e-5)
            np.testing.assert_allclose(sinv[r], invstd, rtol=2e-5, atol=2e-5)
            np.testing.assert_allclose(rm[r], rm_ref, rtol=2e-5, atol=2e-5)
            np.testing.assert_allclose(rv[r], rv_ref, rtol=2e-5, atol=2e-5)
            self.assertEqual(int(nbt[r][0]), 1)
            # local gradients (PyTorch + DDP): this rank's sums only
            xh_r = xhat[o:o + n]
            np.testing.assert_allclose(dw[r], (DY[o:o + n] * xh_r).sum(axis=(0, 2)), rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(db[r], DY[o:o + n].sum(axis=(0, 2)), rtol=1e-4, atol=1e-4)
            o += n

    def test_team_fp32_nchw_uneven(self):
        self._team_case(syncbn.NCHW, syncbn.FLOAT32, [2, 0, 3], 5, 7, 0.1, 1)

    def test_team_fp32_nhwc_momentum_none(self):
        self._team_case(syncbn.NHWC, syncbn.FLOAT32, [1, 4], 40, 3, None, 2)

    def test_team_fp16_nchw(self):
        self._team_case(syncbn.NCHW, syncbn.FLOAT16, [3, 2], 4, 9, 0.1, 3)

    def test_error_names_and_detail(self):
        comms = syncbn.cpu_team(1)
        try:
            with self.assertRaises(syncbn.SyncBNError) as cm:
                comms[0].forward_train(syncbn.desc(syncbn.FLOAT32, syncbn.NCHW, 2, 0, 3), None, None, None, None)
            self.assertEqual(cm.exception.name, "sbnInvalidArgument")
            self.assertIn("c >= 1", cm.exception.detail)
            # the library's detail names the call first: the text does not name it twice
            self.assertEqual(str(cm.exception), cm.exception.detail + " [sbnInvalidArgument]")
            self.assertTrue(str(cm.exception).startswith("sbnForwardTrain: need n >= 0"))
            # pickled (multiprocessing hands a worker's exception back) and copied, it is
            # the same error: BaseException's own reduction lost 'what' and failed to load
            for e in (cm.exception, syncbn.SyncBNValueError(1, "w", "Expected more than 1 value per channel")):
                for again in (pickle.loads(pickle.dumps(e)), copy.copy(e)):
                    self.assertIs(type(again), type(e))
                    self.assertEqual((str(again), again.code, again.name, again.detail),
                                     (str(e), e.code, e.name, e.detail))
        finally:
            comms[0].destroy()
        with self.assertRaises(syncbn.SyncBNError):
            comms[0].rank  # destroyed
        with self.assertRaises(ValueError):
            syncbn.cpu_team(0)

    def test_nccl_team_arguments(self):
        """sbnCommInitNcclRank's arguments are checked before NCCL is touched."""
        for nranks, rank in ((2, 2), (0, 0), (3, -1)):
            with self.assertRaises(syncbn.SyncBNError) as cm:
                syncbn.nccl_team(bytes(128), nranks, rank)
            self.assertEqual(cm.exception.name, "sbnInvalidArgument")
        for n in (127, 129):
            with self.assertRaises(ValueError):
                syncbn.nccl_team(bytes(n), 1, 0)  # not an id

    def test_integers_checked_before_c(self):
        """Integers for the C structs and calls are refused, naming the argument, where
        ctypes would wrap or cut them without a word (timeout_ms=2**64 + 5 was a 5 ms
        timeout, 1.7 was 1, max_channels=2**64 + 3 was 3, desc n=2**64 + 2 was 2, dtype
        2**32 was FLOAT32); an int, a NumPy integer and an integral float pass."""
        F32, NCHW = syncbn.FLOAT32, syncbn.NCHW
        for call, exc, msg in ((lambda: syncbn.cpu_team(1, timeout_ms=2 ** 64 + 5), ValueError, "timeout_ms = 1844"),
                               (lambda: syncbn.cpu_team(1, timeout_ms=1.7), ValueError, "timeout_ms must be an integer"),
                               (lambda: syncbn.cpu_team(1, timeout_ms=float("nan")), ValueError, "timeout_ms must"),
                               (lambda: syncbn.cpu_team(1, timeout_ms="10"), TypeError, "timeout_ms must be an integer"),
                               (lambda: syncbn.cpu_team(1, max_channels=2 ** 64 + 3), ValueError, "max_channels = "),
                               (lambda: syncbn.cpu_team(1.5), ValueError, "nranks must be an integer"),
                               (lambda: syncbn.nccl_team(bytes(128), 2 ** 32 + 1, 0), ValueError, "nranks = "),
                               (lambda: syncbn.desc(F32, NCHW, 2 ** 64 + 2, 3, 1), ValueError, "n = "),
                               (lambda: syncbn.desc(2 ** 32, NCHW, 2, 3, 1), ValueError, "dtype = "),
                               (lambda: syncbn.desc(F32, NCHW, 2, 3.5, 1), ValueError, "c must be an integer"),
                               (lambda: syncbn.desc(F32, NCHW, 2, 3, None), TypeError, "spatial must be"),
                               # a bool is an int to Python, not a number of ms or ranks
                               (lambda: syncbn.cpu_team(True), TypeError, "nranks must be an integer, got bool"),
                               (lambda: syncbn.cpu_team(1, timeout_ms=True), TypeError, "timeout_ms must be an"),
                               (lambda: syncbn.cpu_team(1, max_channels=True), TypeError, "max_channels must be")):
            with self.assertRaisesRegex(exc, "syncbn: " + msg):
                call()
        # eps and momentum: real numbers (float() took the string "1e-5" and True)
        d1 = syncbn.desc(F32, NCHW, 2, 3, 1)
        a = np.zeros((2, 3), np.float32)
        for kw, msg in (({"eps": "1e-5"}, "eps must be a real number"), ({"momentum": True}, "momentum must be")):
            with self.assertRaisesRegex(TypeError, "syncbn: " + msg):
                syncbn.cpu_team(1)[0].forward_train(d1, a, a.copy(), np.zeros(3, np.float32),
                                                    np.zeros(3, np.float32), **kw)
        with self.assertRaisesRegex(TypeError, "syncbn: eps must be a real number"):
            syncbn.forward_inference(d1, a, a.copy(), np.zeros(3, np.float32), np.ones(3, np.float32), eps="1e-5")
        self.assertEqual(syncbn.result_name(2 ** 40), syncbn.result_name(-1))  # not sbnSuccess (wrapped)
        self.assertNotEqual(syncbn.result_name(2 ** 40), "sbnSuccess")
        with self.assertRaisesRegex(TypeError, "unique_id must be the bytes"):
            syncbn.nccl_team(128, 1, 0)
        with self.assertRaisesRegex(ValueError, "syncbn: n = 1e\\+300 does not fit"):
            syncbn.desc(F32, NCHW, 1e300, 3, 1)
        d = syncbn.desc(np.int32(F32), NCHW, np.int64(2), np.float32(3.0), 2 ** 40)
        self.assertEqual((d.dtype, d.n, d.c, d.spatial), (F32, 2, 3, 2 ** 40))
        comms = syncbn.cpu_team(np.int64(1), timeout_ms=1e4, max_channels=np.uint16(8))
        try:
            self.assertEqual(comms[0].max_channels, 8)
        finally:
            comms[0].destroy()

    def test_nccl_unique_id_is_whole(self):
        """All 128 bytes of the id (a ctypes char array would stop at its first zero byte),
        or sbnUnsupported where this build or machine has no NCCL."""
        try:
            uid = syncbn.nccl_unique_id()
        except syncbn.SyncBNError as e:
            self.assertEqual(e.name, "sbnUnsupported")
            print(f"test_nccl_unique_id_is_whole: no NCCL here ({e.detail})")
            return
        self.assertEqual(len(uid), 128)
        self.assertNotEqual(uid, bytes(128))

    def test_destroy_while_a_call_enters(self):
        """destroy() from another thread while this thread's call has taken the comm's
        handle but is not yet inside the library is refused (sbnInvalidUsage), as the
        library refuses it once the call is inside: the call then runs on a live comm, where
        it ran on a destroyed one. The comm is destroyed after."""
        comm = syncbn.cpu_team(1)[0]
        real = syncbn._capi.lib.sbnCommRank
        seen = []

        def entering(h, out):  # the call, between taking the handle and the library
            t = threading.Thread(target=lambda: seen.append(destroy_result(comm)))
            t.start()
            t.join()
            return real(h, out)

        syncbn._capi.lib.sbnCommRank = entering
        try:
            self.assertEqual(comm.rank, 0)
        finally:
            syncbn._capi.lib.sbnCommRank = real
        self.assertEqual(seen, ["sbnInvalidUsage"])
        self.assertEqual(comm.rank, 0)  # live
        comm.destroy()
        with self.assertRaises(syncbn.SyncBNError):
            comm.rank

    def test_with_block_keeps_its_exception(self):
        """`with comm:` whose block raised while another thread's call holds the comm: the
        destroy is refused, the block's exception goes on (with the refusal as a note,
        Python 3.11+) and the comm stays live; a block that did not raise gets the
        refusal itself."""
        comm = syncbn.cpu_team(1)[0]
        real = syncbn._capi.lib.sbnCommRank
        inside, release = threading.Event(), threading.Event()

        def held(h, out):  # another thread's call, holding the comm until released
            inside.set()
            release.wait(30)
            return real(h, out)

        syncbn._capi.lib.sbnCommRank = held
        t = threading.Thread(target=lambda: comm.rank)
        t.start()
        try:
            self.assertTrue(inside.wait(30))
            with self.assertRaises(KeyError) as cm:
                with comm:
                    raise KeyError("the block's")
            self.assertEqual(cm.exception.args, ("the block's",))
            if hasattr(cm.exception, "add_note"):
                self.assertIn("sbnInvalidUsage", " ".join(cm.exception.__notes__))
            with self.assertRaises(syncbn.SyncBNError) as cm2:
                with comm:
                    pass
            self.assertEqual(cm2.exception.name, "sbnInvalidUsage")
        finally:
            release.set()
            t.join()
            syncbn._capi.lib.sbnCommRank = real
        self.assertEqual(comm.rank, 0)  # live after both refusals
        with comm:
            pass
        with self.assertRaises(syncbn.SyncBNError):
            comm.rank

    def test_missing_rank_times_out(self):
        """One rank never calls: the other's call raises sbnTimeout (no hang)."""
        comms = syncbn.cpu_team(2, timeout_ms=300)
        try:
            x = np.ones((2, 3, 4), np.float32)
            y = np.zeros_like(x)
            sm, si = np.zeros(3, np.float32), np.zeros(3, np.float32)
            with self.assertRaises(syncbn.SyncBNError) as cm:
                comms[0].forward_train(syncbn.desc(syncbn.FLOAT32, syncbn.NCHW, 2, 3, 4), x, y, sm, si)
            self.assertEqual(cm.exception.name, "sbnTimeout")
            self.assertTrue(np.all(y == 0))  # nothing written
        finally:
            for c in comms:
                c.destroy()

    def test_readme_example(self):
        """The README's Python example, as written, runs and computes the team's mean."""
        text = (ROOT / "README.md").read_text()
        block = re.search(r"The C API's thin wrapper alone, .*?```python\n(.*?)```", text, re.S)
        self.assertIsNotNone(block, "README: no ```python block of the thin wrapper")
        env = {}
        exec(compile(block.group(1), "README.md", "exec"), env)  # noqa: S102 (our own README)
        x, m, comms = env["x"], env["m"], env["comms"]
        want = np.concatenate([v.astype(np.float64) for v in x]).mean(axis=(0, 2))
        for r in range(len(comms)):
            np.testing.assert_allclose(m[r], want, rtol=2e-5, atol=2e-5)
            self.assertTrue(np.all(np.isfinite(env["y"][r])))
        for c in comms:
            c.destroy()

    def test_wrong_library_is_an_import_error(self):
        """SYNCBN_LIBRARY naming a library that is not libsyncbn (here the C math library),
        or a file that does not load: ImportError (what an `except ImportError` guard takes),
        saying which. Before, the first gave AttributeError naming a missing symbol, and the
        second said "not found" of a file that exists."""
        import ctypes.util

        libm = ctypes.util.find_library("m")
        with tempfile.NamedTemporaryFile(suffix=".so") as junk:
            junk.write(b"not a library")
            junk.flush()
            for lib, says in ((libm, "is not libsyncbn"), (junk.name, "no libsyncbn.so found that loads")):
                env = dict(os.environ, SYNCBN_LIBRARY=lib)
                r = subprocess.run([sys.executable, "-c", "import syncbn"], env=env, capture_output=True,
                                   text=True, timeout=300)
                self.assertNotEqual(r.returncode, 0, lib)
                last = r.stderr.strip().splitlines()[-1]
                self.assertTrue(last.startswith("ImportError: syncbn: "), last)
                self.assertIn(says, last)
                self.assertIn(lib if lib == junk.name else "sbnGetErrorString", last)

    def test_python_md_signatures(self):
        """PYTHON.md's signatures of the three operations (their order differs from C's, so
        the text is what a caller writes from) are the wrapper's: the same parameters in
        the same order, each default the value its name gives in syncbn. A parameter added,
        moved, renamed or given another default without the text fails it (the descriptor
        was `d` in the code and `desc` in the text: desc= raised TypeError)."""
        import inspect

        text = (ROOT / "docs" / "PYTHON.md").read_text()
        block = re.search(r"```python\n *(Comm\.forward_train\(.*?)```", text, re.S)
        self.assertIsNotNone(block, "PYTHON.md: no ```python block of the operations' signatures")
        calls = re.findall(r"^ *([\w.]+)\((.*?)\)$", block.group(1), re.S | re.M)
        self.assertEqual([c[0] for c in calls], ["Comm.forward_train", "Comm.backward", "forward_inference"])
        fns = {"Comm.forward_train": syncbn.Comm.forward_train, "Comm.backward": syncbn.Comm.backward,
               "forward_inference": syncbn.forward_inference}
        for name, args in calls:
            doc = []
            for a in " ".join(args.split()).split(", "):
                key, _, default = a.partition("=")
                doc.append((key, eval(default, vars(syncbn)) if default else inspect.Parameter.empty))  # noqa: S307
            params = [p for p in inspect.signature(fns[name]).parameters.values() if p.name != "self"]
            got = [(p.name, p.default) for p in params]
            self.assertEqual(doc, got, name)  # the names too: a caller may pass any of them by keyword

    def test_buffers_checked_before_c(self):
        """What the wrapper can see of an array or tensor is checked against the
        descriptor before C: an undersized array (which crashed the interpreter), a wrong
        dtype (float64 under FLOAT32 ran), a non-contiguous or read-only output, device
        memory for a CPU team; each raises naming the argument, and nothing is written.
        A raw int address passes unchecked (the caller's responsibility)."""
        d = syncbn.desc(syncbn.FLOAT32, syncbn.NCHW, 2, 3, 4)
        comms = syncbn.cpu_team(1)
        c = comms[0]
        x = np.ones((2, 3, 4), np.float32) + np.arange(4, dtype=np.float32)
        y = np.full((2, 3, 4), -7.0, np.float32)
        sm, si = np.zeros(3, np.float32), np.zeros(3, np.float32)
        readonly = np.zeros((2, 3, 4), np.float32)
        readonly.setflags(write=False)
        cases = [
            ("x has 12 elements", ValueError, dict(x=np.ones((1, 3, 4), np.float32))),
            ("y has 23 elements", ValueError, dict(y=np.zeros(23, np.float32))),
            ("x has dtype '<f8'", TypeError, dict(x=x.astype(np.float64))),
            ("save_mean has 2 elements", ValueError, dict(save_mean=np.zeros(2, np.float32))),
            ("weight has dtype '<f2'", TypeError, dict(weight=np.ones(3, np.float16))),
            ("num_batches_tracked has dtype '<i4'", TypeError, dict(num_batches_tracked=np.zeros(1, np.int32))),
            ("x is not C-contiguous", ValueError, dict(x=np.ones((2, 4, 3), np.float32).transpose(0, 2, 1))),
            ("y is read-only", ValueError, dict(y=readonly)),
            ("y is not C-contiguous", ValueError, dict(y=np.broadcast_to(np.float32(0), (2, 3, 4)))),
            ("x is not a pointer", TypeError, dict(x="x")),
        ]
        try:
            for text, exc, over in cases:
                with self.subTest(text):
                    args = dict(x=x, y=y, save_mean=sm, save_invstd=si)
                    args.update(over)
                    with self.assertRaisesRegex(exc, text):
                        c.forward_train(d, args.pop("x"), args.pop("y"), args.pop("save_mean"),
                                        args.pop("save_invstd"), **args)
                    self.assertTrue(np.all(y == -7.0))  # nothing written
                    self.assertTrue(np.all(sm == 0))
            # a raw address is taken as it is
            c.forward_train(d, x.ctypes.data, y.ctypes.data, sm.ctypes.data, si.ctypes.data)
            np.testing.assert_allclose(sm, x.astype(np.float64).mean(axis=(0, 2)), rtol=2e-5, atol=2e-5)
            with self.assertRaisesRegex(TypeError, "must be a syncbn.TensorDesc"):
                c.forward_train((2, 3, 4), x, y, sm, si)
            with self.assertRaisesRegex(ValueError, "dx has 4 elements"):
                c.backward(d, x, x, np.zeros(4, np.float32), sm, si)
            with self.assertRaisesRegex(ValueError, "y has 3 elements"):
                syncbn.forward_inference(d, x, np.zeros(3, np.float32), sm, si)
        finally:
            c.destroy()

    def test_array_interfaces_that_are_no_buffers(self):
        """What the wrapper cannot take as a buffer of the argument's own is refused,
        naming the argument, and nothing is written: an array interface whose 'data' is a
        buffer object (Pillow's float images: its first byte was taken as the address, a
        segfault), None, missing or no pair; a NumPy scalar (its interface is a temporary
        copy: a weight was read from freed memory, a num_batches_tracked written there);
        an extent negative or not an int; strides for another number of dimensions; an
        int that is no address (ctypes wrapped -1 and 2**64 without a word). A NumPy
        integer as a stream is its value."""
        d = syncbn.desc(syncbn.FLOAT32, syncbn.NCHW, 2, 1, 3)  # c = 1: a scalar has a channel vector's size
        comms = syncbn.cpu_team(1)
        c = comms[0]
        x = np.arange(6, dtype=np.float32).reshape(2, 1, 3)
        y = np.full((2, 1, 3), -7.0, np.float32)
        sm, si = np.zeros(1, np.float32), np.zeros(1, np.float32)

        class Iface:  # an object that shows an array interface, as Pillow's images do
            def __init__(self, **kw):
                self.__array_interface__ = dict(dict(shape=(2, 1, 3), typestr="<f4", version=3), **kw)

        cases = [
            ("x's __array_interface__ has 'data' of bytes, not an \\(address, read-only\\) pair",
             TypeError, dict(x=Iface(data=x.tobytes()))),
            ("x's __array_interface__ has no 'data'", TypeError, dict(x=Iface(data=None))),
            ("x's __array_interface__ has no 'data'", TypeError, dict(x=Iface())),
            ("x's __array_interface__ has 'data' of tuple", TypeError, dict(x=Iface(data=(x.ctypes.data,)))),
            ("y's __array_interface__ gives its address as str", TypeError, dict(y=Iface(data=("1", False)))),
            ("weight is a NumPy scalar \\(float32\\)", TypeError, dict(weight=np.float32(2.0))),
            ("num_batches_tracked is a NumPy scalar", TypeError,
             dict(num_batches_tracked=np.int64(0), running_mean=np.zeros(1, np.float32),
                  running_var=np.ones(1, np.float32))),
            ("x's __array_interface__ has a negative extent", ValueError,
             dict(x=Iface(shape=(-2, 1, -3), data=(x.ctypes.data, True)))),
            ("x's __array_interface__ has a shape of other than ints", TypeError,
             dict(x=Iface(shape=(2.0, 1, 3), data=(x.ctypes.data, True)))),
            ("x's __array_interface__ has 1 strides for 3 dimensions", ValueError,
             dict(x=Iface(strides=(4,), data=(x.ctypes.data, True)))),
            ("x is -1, not an address", ValueError, dict(x=-1)),
            ("y is 18446744073709551616, not an address", ValueError, dict(y=2 ** 64)),
        ]
        try:
            for text, exc, over in cases:
                with self.subTest(text):
                    args = dict(x=x, y=y, save_mean=sm, save_invstd=si)
                    args.update(over)
                    with self.assertRaisesRegex(exc, "^syncbn: " + text):
                        c.forward_train(d, args.pop("x"), args.pop("y"), args.pop("save_mean"),
                                        args.pop("save_invstd"), **args)
                    self.assertTrue(np.all(y == -7.0) and np.all(sm == 0))  # nothing written
            self.assertEqual(syncbn._raw(np.int64(12345)), 12345)  # a stream kept as a NumPy integer
            self.assertEqual(syncbn._raw(np.uint64(2 ** 63)), 2 ** 63)
            # the same arrays through a well-formed interface and a NumPy integer stream: they run
            c.forward_train(d, Iface(data=(x.ctypes.data, True)), y, sm, si, weight=np.full(1, 2.0, np.float32),
                            bias=np.zeros(1, np.float32), stream=np.int64(0))
            xd = x.astype(np.float64)
            np.testing.assert_allclose(sm, [xd.mean()], rtol=2e-5, atol=2e-5)
            np.testing.assert_allclose(y, 2 * (xd - xd.mean()) / np.sqrt(xd.var() + 1e-5), rtol=2e-5, atol=2e-5)
        finally:
            c.destroy()

    def test_inference_checks_arrays_beside_addresses(self):
        """forward_inference with x and y given as int addresses checks the arrays given
        beside them (a float64 running_var ran, read as float32: errors of ~1e3; a
        running_var of 1 element for 3 channels read past its end), in the memory the
        first array says; with every buffer an address, nothing is checked."""
        rng = np.random.default_rng(5)
        d = syncbn.desc(syncbn.FLOAT32, syncbn.NCHW, 2, 3, 4)
        x = rng.standard_normal((2, 3, 4)).astype(np.float32)
        y = np.full_like(x, -7.0)
        rm = rng.standard_normal(3).astype(np.float32)
        rv = (rng.random(3) + 0.5).astype(np.float32)
        with self.assertRaisesRegex(TypeError, "^syncbn: running_var has dtype '<f8'"):
            syncbn.forward_inference(d, x.ctypes.data, y.ctypes.data, rm, rv.astype(np.float64))
        with self.assertRaisesRegex(ValueError, "^syncbn: running_var has 1 elements; the descriptor needs 3"):
            syncbn.forward_inference(d, x.ctypes.data, y.ctypes.data, rm, rv[:1])
        with self.assertRaisesRegex(ValueError, "^syncbn: weight has 2 elements"):
            syncbn.forward_inference(d, x.ctypes.data, y.ctypes.data, rm.ctypes.data, rv.ctypes.data,
                                     weight=np.ones(2, np.float32))
        with self.assertRaisesRegex(TypeError, "^syncbn: weight is a NumPy scalar"):  # every other an address
            syncbn.forward_inference(syncbn.desc(syncbn.FLOAT32, syncbn.NCHW, 2, 1, 12), x.ctypes.data,
                                     y.ctypes.data, rm.ctypes.data, rv.ctypes.data, weight=np.float32(3.0),
                                     bias=rm.ctypes.data)
        self.assertTrue(np.all(y == -7.0))  # nothing written
        syncbn.forward_inference(d, x.ctypes.data, y.ctypes.data, rm, rv)
        ref = (x.astype(np.float64) - rm[None, :, None]) / np.sqrt(rv[None, :, None].astype(np.float64) + 1e-5)
        np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5)
        y[:] = -7.0
        syncbn.forward_inference(d, x.ctypes.data, y.ctypes.data, rm.ctypes.data, rv.ctypes.data)
        np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5)

    def test_refused_by_the_wrapper_counts_as_a_call(self):
        """A call the wrapper refuses counts as one the library refuses (API.md: every
        forward and backward call counts, refused or not): a team of two whose rank 0 is
        refused by the wrapper (a read-only y) and rank 1 by the library (save_mean is
        running_mean) stays in step, and its next calls run, forward and backward (they
        failed for good: "ranks out of step"); refused alike by the wrapper, too."""
        comms = syncbn.cpu_team(2, timeout_ms=20000)
        d = syncbn.desc(syncbn.FLOAT32, syncbn.NCHW, 2, 3, 4)
        rng = np.random.default_rng(6)
        xs = [rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in comms]
        ys = [np.zeros((2, 3, 4), np.float32) for _ in comms]
        sms = [np.zeros(3, np.float32) for _ in comms]
        sis = [np.zeros(3, np.float32) for _ in comms]
        rms = [np.zeros(3, np.float32) for _ in comms]
        rvs = [np.ones(3, np.float32) for _ in comms]
        readonly = np.zeros((2, 3, 4), np.float32)
        readonly.setflags(write=False)

        def refused(r):
            if r == 0:
                comms[0].forward_train(d, xs[0], readonly, sms[0], sis[0])
            else:
                comms[1].forward_train(d, xs[1], ys[1], rms[1], sis[1], running_mean=rms[1], running_var=rvs[1])

        def refused_backward(r):  # dx read-only on rank 0, a dweight of 2 elements on rank 1
            comms[r].backward(d, xs[r], xs[r], readonly if r == 0 else ys[r], sms[r], sis[r],
                              dweight=None if r == 0 else np.zeros(2, np.float32))

        def refused_oddly(r):  # what an odd argument raises (not a TypeError), on rank 0
            if r == 0:
                odd = type("Odd", (), {"__array_interface__": [1, 2]})()
                comms[0].forward_train(d, xs[0], ys[0], sms[0], sis[0], weight=odd, bias=odd)
            else:
                comms[1].forward_train(d, xs[1], ys[1], sms[1], sms[1])  # save_invstd is save_mean

        def valid(r):
            comms[r].forward_train(d, xs[r], ys[r], sms[r], sis[r])
            comms[r].backward(d, xs[r], xs[r], np.zeros_like(xs[r]), sms[r], sis[r])

        try:
            errs = run_ranks(comms, refused)
            self.assertIsInstance(errs[0], ValueError)
            self.assertIsInstance(errs[1], syncbn.SyncBNError)
            self.assertEqual(run_ranks(comms, valid), [None, None])
            errs = run_ranks(comms, refused_backward)
            self.assertTrue(all(isinstance(e, ValueError) for e in errs), errs)
            self.assertEqual(run_ranks(comms, valid), [None, None])
            errs = run_ranks(comms, refused_oddly)
            self.assertIsInstance(errs[0], AttributeError)
            self.assertIsInstance(errs[1], syncbn.SyncBNError)
            self.assertEqual(run_ranks(comms, valid), [None, None])
            xall = np.concatenate(xs).astype(np.float64)
            for r in range(2):
                np.testing.assert_allclose(sms[r], xall.mean(axis=(0, 2)), rtol=2e-5, atol=2e-5)
        finally:
            for c in comms:
                c.destroy()

    def test_tensors_checked_before_c(self):
        """The same for torch tensors (when torch is installed): dtype, size, density
        (channels_last is dense for NHWC), meta tensors, and CUDA-array-interface objects
        (device memory) refused by a CPU team."""
        try:
            import torch
        except ImportError:
            print("test_tensors_checked_before_c: no torch here; the NumPy checks ran in test_buffers_checked_before_c")
            return
        comms = syncbn.cpu_team(1)
        c = comms[0]
        sm, si = torch.zeros(3), torch.zeros(3)
        x = torch.randn(2, 3, 2, 2)
        y = torch.full_like(x, -7.0)
        try:
            nchw = syncbn.desc(syncbn.FLOAT32, syncbn.NCHW, 2, 3, 4)
            nhwc = syncbn.desc(syncbn.FLOAT32, syncbn.NHWC, 2, 3, 4)
            with self.assertRaisesRegex(TypeError, "x is a torch.float64 tensor"):
                c.forward_train(nchw, x.double(), torch.empty_like(x), sm, si)
            with self.assertRaisesRegex(ValueError, "y has 8 elements"):
                c.forward_train(nchw, x, torch.empty(8), sm, si)
            cl = x.contiguous(memory_format=torch.channels_last)
            with self.assertRaisesRegex(ValueError, "x is not contiguous"):
                c.forward_train(nchw, cl, torch.empty_like(x), sm, si)
            with self.assertRaisesRegex(ValueError, "weight is a meta tensor"):
                c.forward_train(nchw, x, y, sm, si, weight=torch.empty(3, device="meta"))

            class DeviceArray:  # what CuPy/Numba arrays show: device memory
                __cuda_array_interface__ = {"shape": (2, 3, 4), "typestr": "<f4", "data": (1 << 40, False),
                                            "version": 3, "strides": None}

            with self.assertRaisesRegex(ValueError, "x is device memory; this call takes host memory"):
                c.forward_train(nchw, DeviceArray(), y, sm, si)
            self.assertTrue(torch.all(y == -7.0) and torch.all(sm == 0))  # every refusal wrote nothing
            c.forward_train(nhwc, cl, torch.empty_like(cl), sm, si)  # dense as NHWC: runs
            torch.testing.assert_close(sm, x.mean((0, 2, 3)), rtol=2e-5, atol=2e-5)
        finally:
            c.destroy()

    def test_fused_ops_against_pytorch_float64(self):
        """sbnForwardTrainEx / sbnBackwardEx through the wrapper on a team of two CPU ranks
        (uneven batches), against float64 PyTorch act(batch_norm(x) + z) over the whole
        batch and its autograd: y, dx, dz (z's gradient), dweight and dbias (GRAD_GLOBAL);
        ReLU and leaky ReLU; then, for leaky ReLU, the in-place backward with the residual
        (x None and z: sbnBackwardInPlaceEx, x recovered from y and z), and a forward
        without z and the in-place backward (x None, recovered from y). fp32: 1e-4
        (tests/test_fused.c's tolerances; the in-place bound is ~1e-6 here)."""
        try:
            import torch
        except ImportError:
            self.skipTest("no torch: the reference is PyTorch's")
        F = torch.nn.functional
        rng = np.random.default_rng(7)
        ns, c, sp = (3, 2), 4, 5
        for act, slope in ((syncbn.RELU, 0.01), (syncbn.LEAKY_RELU, 0.1)):
            x = [(rng.standard_normal((n, c, sp)) + 1.0).astype(np.float32) for n in ns]
            z = [rng.standard_normal((n, c, sp)).astype(np.float32) for n in ns]
            dy = [rng.standard_normal((n, c, sp)).astype(np.float32) for n in ns]
            w, b = (rng.random(c) + 0.5).astype(np.float32), (rng.random(c) - 0.5).astype(np.float32)
            y, y2, dx, dz, dx2, dx3, dz3 = ([np.empty_like(v) for v in x] for _ in range(7))
            sm, si = [np.empty(c, np.float32) for _ in ns], [np.empty(c, np.float32) for _ in ns]
            dw, db = [np.empty(c, np.float32) for _ in ns], [np.empty(c, np.float32) for _ in ns]
            comms = syncbn.cpu_team(2)
            ds = [syncbn.desc(syncbn.FLOAT32, syncbn.NCHW, n, c, sp) for n in ns]
            errors = []

            def on_ranks(fn):
                def rank(r):
                    try:
                        fn(r)
                    except Exception as e:  # noqa: BLE001
                        errors.append(e)
                ts = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
                [t.start() for t in ts]
                [t.join() for t in ts]
                self.assertEqual(errors, [])

            try:
                on_ranks(lambda r: comms[r].forward_train(ds[r], x[r], y[r], sm[r], si[r], w, b, z=z[r],
                                                          activation=act, slope=slope))
                on_ranks(lambda r: comms[r].backward(ds[r], x[r], dy[r], dx[r], sm[r], si[r], w, dw[r], db[r],
                                                     grad_mode=syncbn.GRAD_GLOBAL, y=y[r], dz=dz[r],
                                                     activation=act, slope=slope))
                if act == syncbn.LEAKY_RELU:  # the in-place backward with z: x from y and z
                    on_ranks(lambda r: comms[r].backward(ds[r], None, dy[r], dx3[r], sm[r], si[r], w, y=y[r],
                                                         z=z[r], dz=dz3[r], bias=b, activation=act, slope=slope))
                if act == syncbn.LEAKY_RELU:  # the in-place backward (a forward without z): x from y
                    on_ranks(lambda r: comms[r].forward_train(ds[r], x[r], y2[r], sm[r], si[r], w, b,
                                                              activation=act, slope=slope))
                    on_ranks(lambda r: comms[r].backward(ds[r], None, dy[r], dx2[r], sm[r], si[r], w, y=y2[r],
                                                         bias=b, activation=act, slope=slope))
            finally:
                for cm in comms:
                    cm.destroy()
            X, Z = (torch.tensor(np.concatenate(v), dtype=torch.float64, requires_grad=True) for v in (x, z))
            W, B = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (w, b))
            V = F.batch_norm(X, None, None, W, B, training=True, eps=1e-5) + Z
            Y = F.relu(V) if act == syncbn.RELU else F.leaky_relu(V, slope)
            Y.backward(torch.tensor(np.concatenate(dy), dtype=torch.float64))
            close = dict(rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(np.concatenate(y), Y.detach().numpy(), **close)
            np.testing.assert_allclose(np.concatenate(dx), X.grad.numpy(), **close)
            np.testing.assert_allclose(np.concatenate(dz), Z.grad.numpy(), **close)
            for r in (0, 1):
                np.testing.assert_allclose(dw[r], W.grad.numpy(), **close)
                np.testing.assert_allclose(db[r], B.grad.numpy(), **close)
            if act == syncbn.LEAKY_RELU:
                np.testing.assert_allclose(np.concatenate(dx3), X.grad.numpy(), **close)
                np.testing.assert_allclose(np.concatenate(dz3), Z.grad.numpy(), **close)
                X.grad = None
                Y2 = F.leaky_relu(F.batch_norm(X, None, None, W, B, training=True, eps=1e-5), slope)
                Y2.backward(torch.tensor(np.concatenate(dy), dtype=torch.float64))
                np.testing.assert_allclose(np.concatenate(dx2), X.grad.numpy(), **close)

    def test_inference(self):
        rng = np.random.default_rng(4)
        x = rng.standard_normal((3, 6, 10)).astype(np.float32)
        y = np.zeros_like(x)
        rm = rng.standard_normal(6).astype(np.float32)
        rv = (rng.random(6) + 0.5).astype(np.float32)
        w = (rng.random(6) + 0.5).astype(np.float32)
        b = rng.standard_normal(6).astype(np.float32)
        syncbn.forward_inference(syncbn.desc(syncbn.FLOAT32, syncbn.NCHW, 3, 6, 10), x, y, rm, rv, weight=w, bias=b)
        ref = (x.astype(np.float64) - rm[None, :, None]) / np.sqrt(rv[None, :, None].astype(np.float64) + 1e-5)
        ref = ref * w[None, :, None] + b[None, :, None]
        np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5)


if __name__ == "__main__":
    unittest.main(verbosity=2)
