"""The activation memory of a training step of a DeepLab-like stack: unfused
(syncbn.torch.SyncBatchNorm + nn.ReLU / nn.LeakyReLU), converted by
syncbn.torch.convert_fused, converted in place (convert_fused(inplace=True)), and
converted in place with the blocks' ReLUs made leaky ReLUs (relu_as_leaky=0.01, an
opt-in that changes the model as inplace_abn's networks are built; beside it the unfused
model with nn.LeakyReLU(0.01, inplace=True) in its blocks, which keeps what the ReLU one
keeps).

The stack: a stem of conv-BN-LeakyReLU layers, torchvision-style residual blocks
(BasicBlock, Bottleneck: ReLU, fused with their residual add), and an ASPP-like head of
dilated conv-BN-LeakyReLU layers (LeakyReLU, slope 0.01, as inplace_abn's models: the
in-place backward needs an invertible activation, so ReLU layers stay as they are).

Activation memory = what a training step needs beyond the parameters, gradients and
optimizer state: the peak of the memory allocated over forward + backward + optimizer
step, minus the memory allocated before it (after a first step made the gradients and
the optimizer state).
- CUDA (--device cuda): torch.cuda.max_memory_allocated; a team of one GPU (an NCCL team
  of one rank).
- CPU (the default): the CPU allocator's running total, from the allocation records of
  torch.profiler (profile_memory=True) over the same step. The tensors are the same as
  on a GPU, and so are the ratios (2026-11-28, this stack at 8 x 3 x 256 x 256 fp32: the
  H200's in-place ratio 0.612, CPU 0.611); only the convolutions' transients are other
  kernels'.
The `saved` column: the bytes of the tensors autograd saves for the backward
(torch.autograd.graph.saved_tensors_hooks), each storage counted once, parameters left
out: the part that in-place removes; the peak adds the gradients and transients of the
backward step that is running at the time (on this stack: a convolution's backward in
the head, where every saved tensor is still held). The last column names that step: the
autograd node running at the peak (on CPU of the measured step, from the same records;
on CUDA of one more step, profiled, from the caching allocator's records), and the peak split into what was
held when the node began and what the node itself added (its gradients, a convolution's
workspace).

`--model deeplabv3_resnet50` / `smp_unet_resnet34`: a package's own model in place of the
stack (torchvision's, segmentation_models_pytorch's), whose activations are nn.ReLU in place,
as real segmentation models are built: the rows unfused, fused, fused in-place, the unfused
model with its ReLUs made nn.LeakyReLU(0.01, inplace=True), and fused in place with
relu_as_leaky=0.01 (the same function).

Prints a table and the run's device, torch version, commit and date; --json PATH writes
them. `python bench/torch_fused_memory.py` takes a few seconds on CPU (CI runs it);
on a GPU: `python bench/torch_fused_memory.py --device cuda --batch 8 --size 256`.
A fused row that fails (its error) says so in its line instead of failing the run.
Exit status 0; 77 (skipped, and says why) for --device cuda where PyTorch sees no CUDA
device; 2 for a usage error.
"""

import argparse
import datetime
import json
import os
import sys

# the CPU measure runs torch.profiler: without this, its kineto library prints a line at
# each start and stop, and an error line where there is no GPU (set before torch loads)
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import syncbn  # noqa: E402
import syncbn.torch as sbt  # noqa: E402
from torch_baseline_util import git_commit  # beside this file (no torch in it)

EXIT_SKIP = 77  # CTest's SKIP_RETURN_CODE, as the other bench scripts'


def conv_bn_act(i, o, k=3, stride=1, dilation=1, act_inplace=False):
    return nn.Sequential(nn.Conv2d(i, o, k, stride, dilation * (k // 2), dilation, bias=False), nn.BatchNorm2d(o),
                         nn.LeakyReLU(0.01, inplace=act_inplace))


class BasicBlock(nn.Module):
    """torchvision's BasicBlock: its children, and its forward as syncbn.torch's converter
    knows it (this bench measures memory; the converter's recognition of the blocks is
    tests/python/test_torch_fused.py's, against its own copy of torchvision's code)."""

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    forward = sbt._basic_block_forward


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (expansion 4): as BasicBlock."""

    def __init__(self, inplanes, planes, stride=1, downsample=None, dilation=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, dilation, dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    forward = sbt._bottleneck_forward


def deeplab_like(width=32, classes=8, act_inplace=False, leaky_blocks=False):
    """The stack; leaky_blocks: its blocks' ReLU module a LeakyReLU(0.01, inplace=True)."""
    w = width

    def cba(*args, **kw):
        return conv_bn_act(*args, act_inplace=act_inplace, **kw)

    down = nn.Sequential(nn.Conv2d(w, 2 * w, 1, 2, bias=False), nn.BatchNorm2d(2 * w))
    blocks = [BasicBlock(w, w), BasicBlock(w, 2 * w, 2, down), Bottleneck(2 * w, w // 2, dilation=2)]
    if leaky_blocks:
        for b in blocks:
            b.relu = nn.LeakyReLU(0.01, inplace=True)
    return nn.Sequential(
        cba(3, w, stride=2), cba(w, w), cba(w, w),
        *blocks,
        cba(2 * w, w, 1), cba(w, w, dilation=2), cba(w, w, dilation=4),
        cba(w, w, dilation=6), cba(w, w),
        nn.Conv2d(w, classes, 1))


class _Maps(nn.Module):
    """A segmentation model's output dict (torchvision's) as one tensor, its maps along
    channels."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return torch.cat(list(self.model(x).values()), 1)


def leaky_relus(model):
    """model with every nn.ReLU module an nn.LeakyReLU(0.01, inplace=True): unfused, the
    function that convert_fused(relu_as_leaky=0.01) gives it (a torchvision block's one
    relu module serves its three places, as there)."""
    for m in list(model.modules()):
        for name, child in list(m.named_children()):
            if type(child) is nn.ReLU:
                setattr(m, name, nn.LeakyReLU(0.01, inplace=True))
    return model


def real_model(name, classes=21):
    """A package's own model, made afresh: torchvision's deeplabv3_resnet50 (its maps as
    one tensor) or segmentation_models_pytorch's Unet on a resnet34 encoder. Their
    activations after batch norms are nn.ReLU, in place."""
    if name == "deeplabv3_resnet50":
        from torchvision.models import segmentation
        return _Maps(segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=classes))
    import segmentation_models_pytorch as smp
    return smp.Unet("resnet34", encoder_weights=None, classes=classes)


def saved_bytes(model, x):
    """The bytes autograd saves in model(x)'s forward (storages counted once, parameters
    left out), then runs its backward."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).float().square().mean()
    loss.backward()
    return sum(seen.values())


def training_step(model, x):
    """One SGD step's function; called once here, so that the gradients and the
    optimizer state exist before the step that is measured."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        model(x).float().square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    step()
    return step


def cuda_step_bytes(model, x):
    """Peak bytes of a training step beyond what is allocated before it (CUDA)."""
    step = training_step(model, x)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def peak_of(records):
    """The peak of a running total over its start: records are (time, bytes allocated
    (+) or freed (-), the total after it), in any order. The total before the first
    record is its total minus its bytes."""
    records = sorted(records)
    if not records:
        return 0
    base = records[0][2] - records[0][1]
    return max(max(total for _, _, total in records) - base, 0)


_NODE = "autograd::engine::evaluate_function: "


def _event_tree(prof):
    try:
        from torch._C._profiler import _EventType
        roots = prof.profiler.kineto_results.experimental_event_tree()
    except (ImportError, AttributeError) as e:
        raise RuntimeError(f"torch {torch.__version__}'s profiler does not give allocation records ({e})") from e
    todo = list(roots)
    while todo:
        n = todo.pop()
        todo.extend(n.children)
        yield _EventType, n


def allocation_records(prof, device="cpu"):
    """(time ns, bytes, running total) of every allocation and free on `device` (a device
    type: "cpu", "cuda") a torch.profiler.profile(profile_memory=True) recorded. The
    running total is the device allocator's count of what it allocated while memory
    profiling was on (on CPU, a free of memory allocated before is not in it: nothing that
    exists before the measured step is freed in it). Raises RuntimeError where this
    PyTorch's profiler does not give the records."""
    return [(n.start_time_ns, n.extra_fields.alloc_size, n.extra_fields.total_allocated)
            for t, n in _event_tree(prof) if n.tag == t.Allocation and n.extra_fields.device.type == device]


def node_intervals(prof):
    """(start ns, end ns, name) of every autograd node the engine ran in the profile (its
    `autograd::engine::evaluate_function` events: ConvolutionBackward0, the layers'
    nodes, ...)."""
    return [(n.start_time_ns, n.end_time_ns, n.name[len(_NODE):])
            for t, n in _event_tree(prof) if n.tag == t.TorchOp and n.name.startswith(_NODE)]


def peak_where(records, nodes):
    """Where the running total of `records` (as peak_of's) peaks: (the peak over the
    start, the name of the autograd node running then, what was held over the start when
    that node began). The node: the innermost of `nodes` (start, end, name) around the
    peak's record; None, with what was held just before the peak's record, when the peak
    is outside every node (the forward, the optimizer step). The node's own transient is
    the peak minus what it began with."""
    records = sorted(records)
    if not records:
        return 0, None, 0
    base = records[0][2] - records[0][1]
    i = max(range(len(records)), key=lambda k: (records[k][2], -k))  # the first record at the peak
    t, peak = records[i][0], records[i][2] - base
    around = [nd for nd in nodes if nd[0] <= t <= nd[1]]
    if not around:
        return max(peak, 0), None, records[i][2] - records[i][1] - base
    start, _, name = max(around)
    before = [r for r in records if r[0] < start]
    held = (before[-1][2] if before else base) - base
    return max(peak, 0), name, held


def profiled_step(model, x, device):
    """One training step under torch.profiler(profile_memory=True): its allocation
    records on `device` and the autograd nodes' intervals."""
    from torch.profiler import ProfilerActivity, profile
    step = training_step(model, x)
    if device == "cuda":
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
        if device == "cuda":
            torch.cuda.synchronize()
    records = allocation_records(prof, device)
    if not records:
        raise RuntimeError(f"torch {torch.__version__}'s profiler recorded no allocation on {device}")
    return records, node_intervals(prof)


def cpu_step_bytes(model, x):
    """Peak bytes of a training step beyond what is allocated before it (CPU): as
    cuda_step_bytes, from the profiler's allocation records."""
    return peak_of(profiled_step(model, x, "cpu")[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--size", type=int, default=64, help="input height and width")
    ap.add_argument("--width", type=int, default=32, help="the stack's base channel count")
    ap.add_argument("--model", default="stack", choices=("stack", "deeplabv3_resnet50", "smp_unet_resnet34"),
                    help="the DeepLab-like stack (the default), or a package's own model (torchvision's, "
                         "segmentation_models_pytorch's; installed beside PyTorch)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print(f"torch_fused_memory: SKIP: no CUDA device for PyTorch {torch.__version__} "
              f"(torch.cuda.is_available() is False; CUDA build: {torch.version.cuda})", flush=True)
        return EXIT_SKIP
    if dev.type == "cuda":
        torch.cuda.set_device(0)
        comm = syncbn.nccl_team(syncbn.nccl_unique_id(), 1, 0)
    else:
        comm = syncbn.cpu_team(1)[0]
    dtype = getattr(torch, a.dtype)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    x = torch.randn(a.batch, 3, a.size, a.size).to(dev, dtype).contiguous(memory_format=fmt)
    # the same weights in each (seeded); "unfused, in-place act": nn.LeakyReLU(inplace=True),
    # which keeps one tensor fewer than nn.LeakyReLU() (its output over its input)
    if a.model == "stack":
        make_model, unfused_leaky = (lambda: deeplab_like(a.width)), (lambda: deeplab_like(a.width, leaky_blocks=True))
    else:  # a package's model: its activations are nn.ReLU, in place (torchvision's, smp's)
        make_model, unfused_leaky = (lambda: real_model(a.model)), (lambda: leaky_relus(real_model(a.model)))
    variants = {"unfused": lambda: sbt.convert_sync_batchnorm(make_model(), comm=comm)}
    if a.model == "stack":  # its LeakyReLUs are not in place; this row's are
        variants["unfused, in-place act"] = lambda: sbt.convert_sync_batchnorm(deeplab_like(a.width, act_inplace=True),
                                                                               comm=comm)
    variants.update({
        "fused": lambda: sbt.convert_fused(make_model(), comm=comm),
        "fused in-place": lambda: sbt.convert_fused(make_model(), comm=comm, inplace=True),
        # the opt-in that changes the model (the ReLUs it fuses leaky: the stack's blocks'; a
        # package's model's, all of them), and the unfused model of the same function
        "unfused, leaky blocks" if a.model == "stack" else "unfused, leaky": lambda: sbt.convert_sync_batchnorm(
            unfused_leaky(), comm=comm),
        "fused in-place, leaky": lambda: sbt.convert_fused(make_model(), comm=comm, inplace=True, relu_as_leaky=0.01),
    })
    rows = []
    for name, make in variants.items():
        torch.manual_seed(0)
        model = make().to(dev, dtype).to(memory_format=fmt).train()
        n_fused = sum(isinstance(m, sbt.SyncBatchNorm) and m.activation != "identity" for m in model.modules())
        n_inplace = sum(isinstance(m, sbt.SyncBatchNorm) and m.inplace for m in model.modules())
        try:
            profiled = None
            if dev.type == "cuda":
                nbytes = cuda_step_bytes(model, x)
            else:  # the CPU measure is a profiled step already: its records say where, too
                profiled = profiled_step(model, x, "cpu")
                nbytes = peak_of(profiled[0])
            row = {"model": name, "fused_layers": n_fused, "inplace_layers": n_inplace, "bytes": nbytes,
                   "saved_bytes": saved_bytes(model, x)}
            try:  # where the peak is (on CUDA one more step, profiled: the allocator's records)
                peak, node, held = peak_where(*(profiled or profiled_step(model, x, dev.type)))
                row.update(peak_node=node, peak_node_held_bytes=held, profiled_bytes=peak)
            except RuntimeError as e:
                row.update(peak_node=None, peak_node_error=str(e))
            rows.append(row)
        except syncbn.SyncBNError as e:
            rows.append({"model": name, "fused_layers": n_fused, "inplace_layers": n_inplace, "bytes": None,
                         "saved_bytes": None, "error": e.name})
    ref, ref_saved = rows[0]["bytes"], rows[0]["saved_bytes"]
    meta = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "measure": "peak over a training step minus before: " +
            ("torch.cuda.max_memory_allocated" if dev.type == "cuda"
             else "the CPU allocator's running total in torch.profiler's allocation records"),
            "saved_measure": "bytes autograd saves (saved_tensors_hooks, storages once, parameters out)",
            "torch": torch.__version__, "syncbn": syncbn.__version__, "commit": git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "model": a.model, "input": [a.batch, 3, a.size, a.size],
            "width": a.width if a.model == "stack" else None, "dtype": a.dtype,
            "channels_last": a.channels_last}
    print("# " + ", ".join(f"{k} {v}" for k, v in meta.items()))
    print(f"{'model':<22} {'fused':>5} {'in-place':>8} {'activation MiB':>14} {'vs unfused':>10} "
          f"{'saved MiB':>10} {'vs unfused':>10}  peak in: node (MiB it began with + its own)")
    for r in rows:
        if r["bytes"] is None:
            print(f"{r['model']:<22} {r['fused_layers']:>5} {r['inplace_layers']:>8} {'refused: ' + r['error']:>25}")
            continue
        r["ratio"] = ratio = r["bytes"] / ref if ref else float("nan")
        r["saved_ratio"] = saved_ratio = r["saved_bytes"] / ref_saved if ref_saved else float("nan")
        if "peak_node_error" in r:
            where = "unknown: " + r["peak_node_error"]
        else:
            held, own = r["peak_node_held_bytes"] / 2**20, (r["profiled_bytes"] - r["peak_node_held_bytes"]) / 2**20
            where = f"{r['peak_node'] or 'outside the backward'} ({held:.2f} + {own:.2f})"
        print(f"{r['model']:<22} {r['fused_layers']:>5} {r['inplace_layers']:>8} {r['bytes'] / 2**20:>14.2f} "
              f"{ratio:>10.3f} {r['saved_bytes'] / 2**20:>10.2f} {saved_ratio:>10.3f}  {where}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    comm.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
