"""torch_baseline_ops.py - the five ops of torch.nn.SyncBatchNorm that torch_baseline.py's
torch_syncbn path calls: PyTorch's own (CUDA), or float32 CPU emulations for --device cpu.
torch is passed in, not imported here."""

class CudaOps:
    """The five CUDA ops of torch.nn.SyncBatchNorm, called as PyTorch calls them."""

    def __init__(self, torch):
        self.batch_norm_stats = torch.batch_norm_stats
        self.batch_norm_gather_stats_with_counts = torch.batch_norm_gather_stats_with_counts
        self.batch_norm_elemt = torch.batch_norm_elemt
        self.batch_norm_backward_reduce = torch.batch_norm_backward_reduce
        self.batch_norm_backward_elemt = torch.batch_norm_backward_elemt


class EmulatedOps:
    """--device cpu only: float32 CPU stand-ins for the five CUDA-only ops, with the same
    arguments and results (PyTorch registers them for CUDA alone). For testing the script's
    plumbing; nothing here is timed as a baseline."""

    def __init__(self, torch):
        self.t = torch

    def _dims(self, x):
        return [d for d in range(x.dim()) if d != 1]

    def _bc(self, v, x):
        return v.view([1, -1] + [1] * (x.dim() - 2))

    def batch_norm_stats(self, x, eps):
        xf = x.float()
        mean = xf.mean(dim=self._dims(x))
        var = xf.var(dim=self._dims(x), unbiased=False)
        return mean, self.t.rsqrt(var + eps)

    def batch_norm_gather_stats_with_counts(self, x, mean_all, invstd_all, rm, rv, momentum, eps,
                                            counts):
        cnt = counts.float().view(-1, 1)
        total = cnt.sum()
        mean = (mean_all * cnt).sum(0) / total
        var_i = 1.0 / (invstd_all * invstd_all) - eps
        var = ((var_i + (mean_all - mean) ** 2) * cnt).sum(0) / total
        if rm is not None:
            rm.mul_(1 - momentum).add_(mean * momentum)
            rv.mul_(1 - momentum).add_(var * total / (total - 1) * momentum)
        return mean, self.t.rsqrt(var + eps)

    def batch_norm_elemt(self, x, w, b, mean, invstd, eps):
        y = (x.float() - self._bc(mean, x)) * self._bc(invstd * w, x) + self._bc(b, x)
        out = self.t.empty_like(x)
        out.copy_(y)
        return out

    def batch_norm_backward_reduce(self, dy, x, mean, invstd, w, ig, wg, bg):
        dyf = dy.float()
        sum_dy = dyf.sum(dim=self._dims(x))
        sum_dy_xmu = (dyf * (x.float() - self._bc(mean, x))).sum(dim=self._dims(x))
        return sum_dy, sum_dy_xmu, sum_dy_xmu * invstd if wg else None, sum_dy if bg else None

    def batch_norm_backward_elemt(self, dy, x, mean, invstd, w, sum_dy, sum_dy_xmu, count):
        total = count.float().sum()
        xmu = x.float() - self._bc(mean, x)
        dx = (dy.float() - self._bc(sum_dy / total, x)
              - xmu * self._bc(invstd * invstd * sum_dy_xmu / total, x)) * self._bc(invstd * w, x)
        out = self.t.empty_like(dy)
        out.copy_(dx)
        return out

