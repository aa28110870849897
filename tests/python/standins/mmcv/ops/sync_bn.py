"""A stand-in for mmcv's SyncBatchNorm (registered as "MMSyncBN"; mmcv/ops/sync_bn.py, read
at open-mmlab/mmcv a8073c74b, 2026-01), in PyTorch's ops, written from its rules for one
process (the tests' model: mmcv's own kernels are CUDA only):

- the constructor (num_features, eps=1e-5, momentum=0.1, affine=True,
  track_running_stats=True, group=None, stats_mode="default"), its attributes (group,
  group_size, stats_mode) and state (weight, bias, running_mean, running_var,
  num_batches_tracked: a batch norm's names), the weight initialized uniform in [0, 1);
- its forward: at least 2-D input; the factor of the running statistics is the momentum,
  or 1 / num_batches_tracked with momentum None (counted in training with running
  statistics); in eval with running statistics, F.batch_norm with them; else (training,
  or eval without running statistics) its function SyncBatchNormFunction, whose compiled
  ops take tensors only: a TypeError without weight and bias (affine=False) or running
  statistics (track_running_stats=False), so that mmcv's layer cannot train with either;
  with them, the batch's statistics: x_hat = (x - mean) / sqrt(var + eps), var biased,
  over (N, spatial), y = x_hat weight + bias; the running mean takes the mean and the
  running variance the variance times count / (count - 1), count = N spatial group_size;
  nothing moves where the team's batch is empty.
  The backward is autograd's of that forward, which for one process is mmcv's
  (grad_weight = sum(dy x_hat), grad_bias = sum(dy), dx = weight / std (dy - (x_hat
  grad_weight + grad_bias) / count)).

mmcv with several processes (group_size > 1), not modelled here, averages each rank's
statistics with equal weights (stats_mode "default") or weighted by each rank's N ("N"),
and the parameter gradients over the group; PYTHON.md says where that differs from a
synchronized batch norm. mmcv asserts a half or float input; the stand-in also takes
float64 (the tests' reference)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn import Module, Parameter


class SyncBatchNorm(Module):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, group=None,
                 stats_mode="default"):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        # (mmcv asks torch.distributed, which must be initialized; the stand-in runs one
        # process without it)
        self.group = dist.group.WORLD if group is None and dist.is_initialized() else group
        self.group_size = dist.get_world_size(group) if dist.is_initialized() else 1
        if stats_mode not in ("default", "N"):
            raise AssertionError(f'"stats_mode" only accepts "default" and "N", got "{stats_mode}"')
        self.stats_mode = stats_mode
        if affine:
            self.weight = Parameter(torch.empty(num_features))
            self.bias = Parameter(torch.empty(num_features))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features))
            self.register_buffer("running_var", torch.ones(num_features))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean.zero_()
            self.running_var.fill_(1)
            self.num_batches_tracked.zero_()

    def reset_parameters(self):
        self.reset_running_stats()
        if self.affine:
            with torch.no_grad():
                self.weight.uniform_()
                self.bias.zero_()

    def forward(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input, got {input.dim()}D input")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked += 1
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        if not (self.training or not self.track_running_stats):
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, False, factor,
                                self.eps)
        if self.weight is None or self.running_mean is None:  # (as its compiled ops, given None)
            raise TypeError("sync_bn_forward_output(): incompatible function arguments")
        if self.group_size > 1:
            raise NotImplementedError("the stand-in of mmcv's SyncBatchNorm runs one process")
        x = input.flatten(2)  # (N, C, spatial)
        n, c, spatial = x.shape
        if n > 0:
            mean = x.mean((0, 2))
            var = (x - mean[:, None]).square().mean((0, 2))
        else:  # mmcv leaves them zeros
            mean = var = x.new_zeros(c)
        std = torch.sqrt(var + self.eps)
        y = (x - mean[:, None]) / std[:, None]
        y = y * self.weight[:, None] + self.bias[:, None]
        if n > 0:
            count = n * spatial * self.group_size
            unbiased = var * count / (count - 1) if count > 1 else var
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(factor * mean.detach())
                self.running_var.mul_(1 - factor).add_(factor * unbiased.detach())
        return y.reshape(input.shape)
