"""torch_baseline_bench.py - torch_baseline.py's measurement on one device: the copy bandwidth,
the process group, the inputs, the timed calls of both paths (F.batch_norm, SyncBatchNorm's op
sequence) and the check against a float64 reference. The one module that uses torch:
torch_baseline.py's main imports it (a missing torch: exit 77) and passes it in."""

import math
import os
import platform
import sys
import tempfile
import time

from torch_baseline_ops import CudaOps, EmulatedOps
from torch_baseline_util import (COPY_REPS, EPS, HOST_REF_CALLS, MAX_WRONG_PRINTED, MOMENTUM, TOL_F32,
                                 TOL_BF16, TOL_F16, copy_us, cuda_driver_version, fnv1a, median, num, nvidia_driver,
                                 times_stats, torch_own_bound)

# ---- the benchmark (torch imported only here) ------------------------------------------------
class Bench:
    def __init__(self, args, torch):
        self.args = args
        self.torch = torch
        import torch.nn.functional as F
        import torch.distributed as dist
        self.F = F
        self.dist = dist
        self.cuda = args.device == "cuda"
        self.dev = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        self.pg = None
        self.pg_error = None
        self.store_dir = None
        self.flush = None
        self.flush_bytes = 0
        self.B = None
        self.copy = {}

    # -- environment ---------------------------------------------------------------------
    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def setup(self):
        torch = self.torch
        if self.cuda:
            torch.cuda.set_device(self.dev)
            p = torch.cuda.get_device_properties(self.dev)
            l2 = int(getattr(p, "L2_cache_size", 0) or 0)
            self.flush_bytes = ((2 * l2 + (1 << 20) - 1) >> 20) << 20 if l2 > 0 else 64 << 20
            self.flush = torch.empty(self.flush_bytes, dtype=torch.uint8, device=self.dev)
        else:
            self.flush_bytes = 0
        self.measure_copy()
        self.init_process_group()

    def init_process_group(self):
        dist = self.dist
        backend = "nccl" if self.cuda else "gloo"
        try:
            if dist.is_initialized():
                self.pg = dist.group.WORLD
                return
            self.store_dir = tempfile.mkdtemp(prefix="torch_baseline.")
            store = dist.FileStore(os.path.join(self.store_dir, "store"), 1)
            kw = {"backend": backend, "store": store, "rank": 0, "world_size": 1}
            if self.cuda:
                kw["device_id"] = self.dev  # eager NCCL init where supported (PyTorch >= 2.3)
            try:
                dist.init_process_group(**kw)
            except TypeError:
                kw.pop("device_id", None)
                dist.init_process_group(**kw)
            self.pg = dist.group.WORLD
        except Exception as e:  # noqa: BLE001 - reported in every torch_syncbn row
            self.pg_error = f"init_process_group({backend}, 1 rank): {type(e).__name__}: {e}"

    def teardown(self):
        try:
            if self.pg is not None and self.dist.is_initialized():
                self.dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
        if self.store_dir:
            for name in os.listdir(self.store_dir):
                try:
                    os.unlink(os.path.join(self.store_dir, name))
                except OSError:
                    pass
            try:
                os.rmdir(self.store_dir)
            except OSError:
                pass

    def measure_copy(self):
        """B = 2 * bytes / median time of a device-to-device copy (sbn-bench's method)."""
        torch = self.torch
        if self.cuda:
            free, _ = torch.cuda.mem_get_info(self.dev)
            nbytes = (1 << 30) if free >= (4 << 30) else (256 << 20)
        else:
            nbytes = 64 << 20
        src = torch.full((nbytes,), 0x3C, dtype=torch.uint8, device=self.dev)
        dst = torch.zeros_like(src)
        t = copy_us(torch, dst, src, COPY_REPS, 3)
        del src, dst
        self.B = 2.0 * nbytes / (t * 1e3)
        self.copy = {"gbps": num(self.B), "bytes": nbytes, "us_median": num(t), "reps": COPY_REPS,
                     "formula": "B = 2*bytes/time (" + ("device-to-device copy_ of uint8 tensors, "
                                "cudaMemcpyAsync" if self.cuda else "DRY RUN: host memory copy_")
                                + ": every byte read and written)"}

    def device_info(self):
        torch = self.torch
        if not self.cuda:
            return {"index": -1, "name": f"CPU ({platform.machine()}), dry run: not a GPU",
                    "arch": None, "pci": None, "sm_count": None, "l2_bytes": None,
                    "memory_bytes": None}
        p = torch.cuda.get_device_properties(self.dev)
        pci = "?"
        if hasattr(p, "pci_bus_id"):
            pci = "%04X:%02X:%02X.0" % (getattr(p, "pci_domain_id", 0), p.pci_bus_id,
                                        getattr(p, "pci_device_id", 0))
        return {"index": self.dev.index, "name": p.name, "arch": f"sm_{p.major}{p.minor}",
                "pci": pci, "sm_count": p.multi_processor_count,
                "l2_bytes": int(getattr(p, "L2_cache_size", 0) or 0) or None,
                "memory_bytes": p.total_memory}

    def versions(self):
        torch = self.torch
        v = {"torch_version": torch.__version__, "cuda_version": torch.version.cuda,
             "cudnn_version": None, "nccl_version": None, "driver_version": None,
             "driver": None, "runtime_version": None}
        try:
            if torch.backends.cudnn.is_available():
                v["cudnn_version"] = torch.backends.cudnn.version()
        except Exception:  # noqa: BLE001
            pass
        try:
            nv = torch.cuda.nccl.version()  # (2, 27, 3), or an int in old PyTorch
            if isinstance(nv, tuple):  # NCCL_VERSION_CODE as sbn-bench's ncclGetVersion: 22703
                v["nccl_version"] = nv[0] * 10000 + nv[1] * 100 + nv[2]
                v["nccl_version_string"] = ".".join(str(p) for p in nv)
            else:
                v["nccl_version"] = int(nv)
        except Exception:  # noqa: BLE001
            pass
        if torch.version.cuda:
            try:
                major, minor = (int(p) for p in torch.version.cuda.split(".")[:2])
                v["runtime_version"] = major * 1000 + minor * 10  # cudaRuntimeGetVersion's form
            except ValueError:
                pass
        if self.cuda:
            v["driver_version"] = cuda_driver_version()
            v["driver"] = nvidia_driver()
        return v

    # -- timing -------------------------------------------------------------------------
    def host_ref(self):
        """The host reference: the median host time (us) of HOST_REF_CALLS calls of torch.add
        on 1-element tensors of the device, out= a third (a dispatch and, on CUDA, a launch;
        nothing waits). What it reads moves with the host's speed alone: the rows' host
        columns are read against it."""
        torch = self.torch
        if getattr(self, "_ref_t", None) is None:
            self._ref_t = [torch.ones(1, device=self.dev) for _ in range(3)]
        a, b, c = self._ref_t
        t = []
        for _ in range(HOST_REF_CALLS):
            t0 = time.perf_counter()
            torch.add(a, b, out=c)
            t.append((time.perf_counter() - t0) * 1e6)
        self.sync()
        return median(t)

    def time_op(self, fn):
        """warmup + iters calls of fn, each after the L2 flush; CUDA events around the call of
        the timed ones only. Returns (GPU us list, host us list)."""
        torch = self.torch
        a = self.args
        ev = []
        if self.cuda:
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(a.iters)]
        host, wall = [], []
        out = None
        for it in range(a.warmup + a.iters):
            j = it - a.warmup
            if self.flush is not None:
                self.flush.fill_(it & 0xFF)
            if j >= 0 and self.cuda:
                ev[j][0].record()
            t0 = time.perf_counter()
            out = fn()
            t1 = time.perf_counter()
            if j >= 0:
                host.append((t1 - t0) * 1e6)
                if self.cuda:
                    ev[j][1].record()
                else:
                    wall.append((t1 - t0) * 1e6)
            del out
        self.sync()
        gpu = [s.elapsed_time(e) * 1e3 for s, e in ev] if self.cuda else wall
        return gpu, host

    # -- syncbn.torch (the syncbn_torch path) -------------------------------------------------
    def syncbn_comm(self):
        """(syncbn.torch, the team): this process group's team (CUDA; a 1-rank CPU team with
        --device cpu), made once, for the syncbn_torch and syncbn_torch_op paths."""
        try:
            import syncbn
            import syncbn.torch as sbt
        except ImportError as e:
            raise RuntimeError(f"syncbn_torch: syncbn is not importable ({e}): PYTHONPATH=<tree>/python "
                               "and SYNCBN_LIBRARY=<build>/src/libsyncbn.so, or pip install .") from e
        if getattr(self, "_sbn_comm", None) is None:
            if self.cuda:
                if self.pg is None:
                    raise RuntimeError(self.pg_error or "no process group")
                self._sbn_comm = sbt.team_for(self.pg, self.dev)
            else:
                self._sbn_comm = syncbn.cpu_team(1)[0]
        return sbt, self._sbn_comm

    def syncbn_layer(self, weight, bias, activation="identity"):
        """syncbn.torch.SyncBatchNorm(C, activation=) on syncbn_comm()'s team, momentum and
        eps as the other paths, its weight and bias copied from these."""
        sbt, comm = self.syncbn_comm()
        layer = sbt.SyncBatchNorm(weight.numel(), eps=EPS, momentum=MOMENTUM, comm=comm,
                                  activation=activation).to(self.dev)
        with self.torch.no_grad():
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
        return layer

    def time_autograd(self, fwd, params, dy):
        """time_op of fwd, then of torch.autograd.grad of one more fwd()'s output to params
        (its graph kept for every call): (forward, backward) as time_op's lists."""
        tf = self.time_op(fwd)
        y = fwd()
        tb = self.time_op(lambda: self.torch.autograd.grad(y, params, dy, retain_graph=True))
        return tf, tb

    def time_direct(self, fwd, bwd):
        """time_op of fwd, then of bwd(*outputs) on one more fwd()'s outputs, kept for every
        call (ops called directly, no autograd): (forward, backward) as time_op's lists."""
        tf = self.time_op(fwd)
        saved = fwd()
        tb = self.time_op(lambda: bwd(*saved))
        return tf, tb

    # -- the autograd engine's part: layers in a chain ------------------------------------------
    def time_chain(self, inputs, path, depth):
        """Times `depth` batch-norm layers of `path` (torch_bn or syncbn_torch, the paths
        that go through autograd) applied one after the other, each with its own weight,
        bias and running statistics and the previous one's output as input, as in a model:
        the forward of all of them, and ONE torch.autograd.grad over all of them (to x and
        every weight and bias). Returns (forward, backward) as time_op's (GPU us list, host
        us list). A model's backward pays the engine's fixed cost (starting the graph task,
        handing it to the device's thread, waiting for it) once per step, the nodes' own cost
        once per layer: two depths in one run separate the two."""
        torch, F = self.torch, self.F
        x, dy, weight, bias, _ = inputs
        c = x.shape[1]
        xg = x.detach().requires_grad_(True)
        params = [xg]
        if path == "syncbn_torch":
            layers = [self.syncbn_layer(weight, bias) for _ in range(depth)]
            for layer in layers:
                params += [layer.weight, layer.bias]

            def fwd():
                y = xg
                for layer in layers:
                    y = layer(y)
                return y
        elif path == "torch_bn":
            sets = []
            for _ in range(depth):
                w = weight.clone().requires_grad_(True)
                b = bias.clone().requires_grad_(True)
                sets.append((w, b, torch.zeros(c, dtype=torch.float32, device=self.dev),
                             torch.ones(c, dtype=torch.float32, device=self.dev)))
                params += [w, b]

            def fwd():
                y = xg
                for w, b, rm, rv in sets:
                    y = F.batch_norm(y, rm, rv, w, b, True, MOMENTUM, EPS)
                return y
        else:
            raise ValueError(f"time_chain: {path} does not go through autograd")
        return self.time_autograd(fwd, params, dy)

    # -- the SyncBatchNorm op sequence --------------------------------------------------------
    def ops(self):
        return CudaOps(self.torch) if self.cuda else EmulatedOps(self.torch)

    def sync_forward(self, ops, x, weight, bias, running_mean, running_var):
        """torch.nn.modules._functions.SyncBatchNorm.forward, world_size 1, this process group."""
        torch, dist = self.torch, self.dist
        world_size = 1
        pg = self.pg
        inp = x
        if not (inp.is_contiguous(memory_format=torch.channels_last)
                or inp.is_contiguous(memory_format=torch.channels_last_3d)):
            inp = inp.contiguous()
        if weight is not None:
            weight = weight.contiguous()
        num_channels = inp.shape[1]
        if inp.numel() > 0:
            mean, invstd = ops.batch_norm_stats(inp, EPS)
            count = torch.full((1,), inp.numel() // inp.size(1), dtype=mean.dtype,
                               device=mean.device)
            combined = torch.cat([mean, invstd, count], dim=0)
        else:
            combined = torch.zeros(2 * num_channels + 1, dtype=inp.dtype, device=inp.device)
        if pg is not None and self._backend_name() != "gloo":
            combined_size = combined.numel()
            combined_flat = torch.empty(1, combined_size * world_size, dtype=combined.dtype,
                                        device=combined.device)
            gather = getattr(dist, "all_gather_into_tensor", None) or dist.all_gather_single
            gather(combined_flat, combined, pg, async_op=False)
            combined = torch.reshape(combined_flat, (world_size, combined_size))
        else:
            combined_list = [torch.empty_like(combined) for _ in range(world_size)]
            dist.all_gather(combined_list, combined, pg, async_op=False)
            combined = torch.stack(combined_list, dim=0)
        mean_all, invstd_all, count_all = torch.split(combined, num_channels, dim=1)
        # outside CUDA graph capture PyTorch drops the empty ranks (a host synchronization)
        mask = count_all.squeeze(-1) >= 1
        count_all = count_all[mask]
        mean_all = mean_all[mask]
        invstd_all = invstd_all[mask]
        counts = count_all.view(-1)
        if running_mean is not None and counts.dtype != running_mean.dtype:
            counts = counts.to(running_mean.dtype)
        mean, invstd = ops.batch_norm_gather_stats_with_counts(
            inp, mean_all, invstd_all, running_mean, running_var, MOMENTUM, EPS, counts)
        count_i32 = count_all.to(torch.int32)
        if inp.numel() > 0:
            y = ops.batch_norm_elemt(inp, weight, bias, mean, invstd, EPS)
        else:
            y = torch.empty_like(inp)
        return y, mean, invstd, count_i32

    def sync_backward(self, ops, dy, x, weight, mean, invstd, count_i32):
        """torch.nn.modules._functions.SyncBatchNorm.backward (input, weight and bias grads)."""
        torch, dist = self.torch, self.dist
        if not (dy.is_contiguous(memory_format=torch.channels_last)
                or dy.is_contiguous(memory_format=torch.channels_last_3d)):
            dy = dy.contiguous()
        if x.numel() > 0:
            sum_dy, sum_dy_xmu, grad_weight, grad_bias = ops.batch_norm_backward_reduce(
                dy, x, mean, invstd, weight, True, True, True)
            num_channels = sum_dy.shape[0]
            combined = torch.cat([sum_dy, sum_dy_xmu], dim=0)
            dist.all_reduce(combined, dist.ReduceOp.SUM, self.pg, async_op=False)
            sum_dy, sum_dy_xmu = torch.split(combined, num_channels)
            if weight is not None and weight.dtype != mean.dtype:
                weight = weight.to(mean.dtype)
            dx = ops.batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu,
                                               count_i32)
            return dx, grad_weight, grad_bias
        combined = torch.zeros(2 * x.shape[1], dtype=x.dtype, device=x.device)
        dist.all_reduce(combined, dist.ReduceOp.SUM, self.pg, async_op=False)
        return None, None, None

    def _backend_name(self):
        pg = self.pg
        try:
            return pg._get_backend_name()
        except Exception:  # noqa: BLE001
            return self.dist.get_backend(pg)

    # -- rows ---------------------------------------------------------------------------
    def make_inputs(self, shape, dtype, layout, spatial):
        """x = offset_c + scale_c * N(0,1), dy = N(0,1); weight in [0.5, 1.5), bias in
        [-0.5, 0.5); like sbn-bench's inputs (same distributions, not the same numbers)."""
        torch = self.torch
        n, c = shape["n"], shape["c"]
        dims = (n, c, shape["h"], shape["w"]) if spatial == shape["h"] * shape["w"] else (n, c, spatial, 1)
        g = torch.Generator(device="cpu")
        g.manual_seed(fnv1a(shape["id"]) & 0x7FFFFFFFFFFFFFFF)
        u = torch.rand(4, c, generator=g, dtype=torch.float64)
        offset = (u[0] * 6.0 - 3.0).float()
        scale = (0.5 + u[1] * 1.5).float()
        weight = (0.5 + u[2]).float().to(self.dev)
        bias = (u[3] - 0.5).float().to(self.dev)
        gd = torch.Generator(device=self.dev)
        gd.manual_seed(fnv1a(shape["id"] + dtype + layout) & 0x7FFFFFFFFFFFFFFF)
        mf = torch.channels_last if layout == "NHWC" else torch.contiguous_format
        td = self.tdtype[dtype]
        x32 = torch.randn(dims, generator=gd, device=self.dev, dtype=torch.float32)
        x32.mul_(scale.to(self.dev).view(1, c, 1, 1)).add_(offset.to(self.dev).view(1, c, 1, 1))
        x = x32.to(td).contiguous(memory_format=mf)
        del x32
        dy = torch.randn(dims, generator=gd, device=self.dev, dtype=torch.float32)
        dy = dy.to(td).contiguous(memory_format=mf)
        z = None
        if self.args.epilogue == "add-relu":  # the residual: N(0,1), x's dtype and memory format
            z = torch.randn(dims, generator=gd, device=self.dev, dtype=torch.float32)
            z = z.to(td).contiguous(memory_format=mf)
        return x, dy, weight, bias, z

    def run_row(self, row, shape, dtype, layout, path, inputs, check=True):
        """Times and checks one row. --epilogue relu / add-relu: y = relu(bn(x) [+ z]) and
        the backward to (x, weight, bias[, z]): syncbn_torch's fused layer
        (SyncBatchNorm(activation="relu"), forward(x, z)); for PyTorch, what a torchvision
        block runs after its batch norm: `out += identity` then ReLU(inplace=True) (torch_bn
        through autograd; torch_syncbn's op sequence followed by add_ / relu_, and in the
        backward ReLU's threshold_backward of the output before the sequence's backward,
        whose input gradient is also z's)."""
        torch, F = self.torch, self.F
        x, dy, weight, bias, z = inputs
        epi = self.args.epilogue != "none"
        c = shape["c"]
        row["_host_ref"] = self.host_ref()
        rm = torch.zeros(c, dtype=torch.float32, device=self.dev)
        rv = torch.ones(c, dtype=torch.float32, device=self.dev)
        zg = z.detach().requires_grad_(True) if z is not None else None

        def epilogue(y):  # what a torchvision block runs after its batch norm
            if zg is not None:
                y += zg
            return F.relu(y, inplace=True) if epi else y

        if path == "syncbn_torch":
            layer = self.syncbn_layer(weight, bias, "relu" if epi else "identity")
            layer.running_mean, layer.running_var = rm, rv
            layer.num_batches_tracked.zero_()
            xg = x.detach().requires_grad_(True)
            params = (xg, layer.weight, layer.bias) + ((zg,) if zg is not None else ())

            def fwd():
                return layer(xg, zg) if zg is not None else layer(xg)
        elif path == "torch_bn":
            w = weight.clone().requires_grad_(True)
            b = bias.clone().requires_grad_(True)
            xg = x.detach().requires_grad_(True)
            params = (xg, w, b) + ((zg,) if zg is not None else ())

            def fwd():
                return epilogue(F.batch_norm(xg, rm, rv, w, b, True, MOMENTUM, EPS))
        elif path == "torch_bn_module":
            bn = torch.nn.BatchNorm2d(c, eps=EPS, momentum=MOMENTUM).to(self.dev)
            with torch.no_grad():
                bn.weight.copy_(weight)
                bn.bias.copy_(bias)
            bn.running_mean, bn.running_var = rm, rv
            xg = x.detach().requires_grad_(True)
            params = (xg, bn.weight, bn.bias) + ((zg,) if zg is not None else ())

            def fwd():
                return epilogue(bn(xg))
        elif path == "syncbn_torch_op":
            # syncbn.torch's registered operators called directly, as torch_syncbn calls
            # PyTorch's op sequence: no module, no autograd node, no engine; their outputs
            # (y and the saved statistics; dx, dweight and dbias) are what the layer's are
            from syncbn import _fused, _ops
            cid = self.syncbn_comm()[1].id
            act = _fused.ACTIVATIONS["relu" if epi else "identity"]
            nbt = torch.zeros((), dtype=torch.long, device=self.dev)

            def op_fwd():
                if epi:
                    return _fused.batch_norm_act_train(x, z, weight, bias, rm, rv, nbt, EPS, MOMENTUM, cid,
                                                       act, 0.01, False)
                return _ops.batch_norm_train(x, weight, bias, rm, rv, nbt, EPS, MOMENTUM, cid)

            def op_bwd(y, stats):
                if epi:
                    # no_residual where the forward had no z, as the layer passes it (the mask from x)
                    dx, dz, dwb = _fused.batch_norm_act_backward(dy, x, y, weight, bias, stats, EPS, cid, act,
                                                                 0.01, True, z is not None, True,
                                                                 no_residual=z is None)
                    return dx, dz, dwb
                dx, dwb = _ops.batch_norm_backward(dy, x, weight, stats, EPS, cid, True, True)
                return dx, None, dwb

            tf, tb = self.time_direct(op_fwd, op_bwd)
            if check:
                rm.zero_()
                rv.fill_(1.0)
                y, stats = op_fwd()
                dx, dz, dwb = op_bwd(y, stats)
                self.sync()
                got = {"y": y, "dx": dx, "dweight": dwb[0], "dbias": dwb[1], "running_mean": rm,
                       "running_var": rv}
                if z is not None:
                    got["dz"] = dz
        if path in ("syncbn_torch", "torch_bn", "torch_bn_module"):
            tf, tb = self.time_autograd(fwd, params, dy)
            if check:
                rm.zero_()
                rv.fill_(1.0)
                y = fwd()
                grads = torch.autograd.grad(y, params, dy)
                self.sync()
                got = {"y": y.detach(), "dx": grads[0], "dweight": grads[1], "dbias": grads[2],
                       "running_mean": rm, "running_var": rv}
                if zg is not None:
                    got["dz"] = grads[3]
        elif path == "torch_syncbn":
            if self.pg is None:
                raise RuntimeError(self.pg_error or "no process group")
            ops = self.ops()

            def sync_fwd():
                y, mean, invstd, cnt = self.sync_forward(ops, x, weight, bias, rm, rv)
                if z is not None:
                    y.add_(z)
                if epi:
                    y.relu_()
                return y, mean, invstd, cnt

            def sync_bwd(y, mean, invstd, cnt):
                g = torch.ops.aten.threshold_backward(dy, y, 0) if epi else dy  # ReLU's, of its output
                return self.sync_backward(ops, g, x, weight, mean, invstd, cnt), g

            tf, tb = self.time_direct(sync_fwd, sync_bwd)
            if check:
                rm.zero_()
                rv.fill_(1.0)
                y, mean, invstd, cnt = sync_fwd()
                (dx, dw, db), g = sync_bwd(y, mean, invstd, cnt)
                self.sync()
                got = {"y": y, "dx": dx, "dweight": dw, "dbias": db, "running_mean": rm,
                       "running_var": rv, "save_mean": mean, "save_invstd": invstd}
                if z is not None:
                    got["dz"] = g
        for key, (gpu, host) in (("fwd", tf), ("bwd", tb)):
            med, mn, p90 = times_stats(gpu)
            row["_t"][key] = {"us_median": med, "us_min": mn, "us_p90": p90,
                              "host_us_median": median(host)}
        if check and x.numel() > 0:
            self.check(row, x, dy, weight, bias, got, dtype, layout, z)

    def check(self, row, x, dy, weight, bias, got, dtype, layout, z=None):
        """Compares `got` with a float64 reference on the CPU on up to --check-channels
        channels spread over C (first and last included). --epilogue: y = relu(bn(x) [+ z]),
        the backward's mask from the row's own y (as sbn-bench's check), dz = relu'(y) dy."""
        torch = self.torch
        C = x.shape[1]
        kmax = self.args.check_channels
        k = C if kmax <= 0 or kmax >= C else kmax
        chs = [0] if k == 1 else [j * (C - 1) // (k - 1) for j in range(k)]
        idx = torch.tensor(chs, dtype=torch.long, device=x.device)

        def sample(t):  # (N, k, S) float64 on the CPU
            return t.detach().index_select(1, idx).to("cpu", torch.float64).reshape(t.shape[0], k, -1)

        def chan(t):
            return t.detach().index_select(0, idx).to("cpu", torch.float64)

        xs, dys = sample(x), sample(dy)
        w, b = chan(weight), chan(bias)
        M = xs.shape[0] * xs.shape[2]
        mean = xs.mean(dim=(0, 2))
        xmu = xs - mean.view(1, k, 1)
        var = (xmu * xmu).mean(dim=(0, 2))
        invstd = 1.0 / torch.sqrt(var + EPS)
        y_ref = xmu * (invstd * w).view(1, k, 1) + b.view(1, k, 1)
        if self.args.epilogue != "none":
            if z is not None:
                y_ref = y_ref + sample(z)
            y_ref = y_ref.clamp_min(0.0)
            if got.get("y") is not None:  # g = relu'(y) dy, the mask from the row's own y
                dys = torch.where(sample(got["y"]) > 0, dys, torch.zeros_like(dys))
        sum_dy = dys.sum(dim=(0, 2))
        sum_dy_xmu = (dys * xmu).sum(dim=(0, 2))
        dx_ref = (w * invstd).view(1, k, 1) * (
            dys - (sum_dy / M).view(1, k, 1)
            - xmu * (invstd * invstd * sum_dy_xmu / M).view(1, k, 1))
        # sum |term| of the gradient sums: PyTorch's own rounding bound (torch_own_bound)
        abs_sums = {"dweight": (dys * xmu).abs().sum(dim=(0, 2)) * invstd,
                    "dbias": dys.abs().sum(dim=(0, 2))}
        refs = {"y": y_ref, "dx": dx_ref, "dweight": sum_dy_xmu * invstd, "dbias": sum_dy,
                "running_mean": MOMENTUM * mean,
                "running_var": (1 - MOMENTUM) + MOMENTUM * var * M / (M - 1),
                "save_mean": mean, "save_invstd": invstd}
        if z is not None:
            refs["dz"] = dys
        tol_out = {"fp32": TOL_F32, "fp16": TOL_F16, "bf16": TOL_BF16}[dtype]
        for name, ref in refs.items():
            if name not in got:
                continue
            g = got[name]
            if g is None:
                row["_wrong"] += ref.numel()
                row["_checked"] += ref.numel()
                self.note_worst(row, math.inf, f"{name} missing")
                continue
            elem = name in ("y", "dx", "dz")
            gv = sample(g) if elem else chan(g)
            tol = tol_out if elem else TOL_F32
            err = (gv - ref).abs()
            lim = tol + tol * ref.abs()
            ok = err <= lim
            own = torch_own_bound(name, dtype, layout)
            if own is not None:  # beyond our tolerance, within PyTorch's own rounding
                theirs = (~ok) & (err <= own * abs_sums[name])
                row["_beyond"] += int(theirs.sum())
                ok = ok | theirs
            bad = int((~ok).sum())
            row["_checked"] += ref.numel()
            row["_wrong"] += bad
            used = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err / lim)
            flat = int(torch.argmax(used).item())
            worst = float(used.flatten()[flat])
            def at(pos):
                if elem:  # packed (N, k, S): sample n, channel chs[j], spatial s
                    S = ref.shape[2]
                    return f"{name} c{chs[(pos // S) % k]} n{pos // (k * S)} s{pos % S}"
                return f"{name} c{chs[pos]}"

            self.note_worst(row, worst, at(flat))
            if bad:
                for pos in torch.nonzero(~ok.flatten()).flatten()[:MAX_WRONG_PRINTED].tolist():
                    if row["_printed"] >= MAX_WRONG_PRINTED:
                        break
                    row["_printed"] += 1
                    print(f"# WRONG {row['_label']}: {at(pos)}: got {float(gv.flatten()[pos]):.9g} "
                          f"ref {float(ref.flatten()[pos]):.9g} (|diff| "
                          f"{float(err.flatten()[pos]):.3g} > tol {float(lim.flatten()[pos]):.3g})",
                          file=sys.stderr)

    @staticmethod
    def note_worst(row, used, what):
        if used > row["_worst"] or row["_worst_what"] == "":
            row["_worst"] = used
            row["_worst_what"] = what

