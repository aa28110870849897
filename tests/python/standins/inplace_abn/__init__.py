"""A stand-in for mapillary's inplace_abn package (1.x) in PyTorch's ops, for
test_torch_abn.py where the package itself is not installed (it builds a C++ extension):
its three layer classes with the package's constructor, attributes and buffers, and the
functions they compute, written from its documented rules:

- ABN: act(batch_norm(x)) (F.batch_norm, then the activation);
- InPlaceABN, InPlaceABNSync (without torch.distributed: as InPlaceABN): y = act(x_hat *
  (|weight| + eps) + bias), x_hat over the batch (training) or with the running statistics
  (eval); the running variance updated with the unbiased variance; the backward from the
  output y alone, dweight = sum(dy' x_hat) negated where weight < 0 (dy' the gradient
  before the activation), dbias = sum(dy'), dx = (dy' - mean(dy') - x_hat mean(dy'
  x_hat)) (|weight| + eps) / sqrt(var + eps) in training, dy' (|weight| + eps) / sqrt(var +
  eps) in eval. The gradients are derived here, not taken from autograd of the forward.

Activations: "identity", "leaky_relu" (slope activation_param), "elu" (alpha
activation_param); ABN also "relu" (InPlaceABN refuses it at its forward, as the package).
test_torch_abn.py runs against the real package instead where it can be imported.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["ABN", "InPlaceABN", "InPlaceABNSync"]


def _shape(c, x):
    return (1, c) + (1,) * (x.dim() - 2)


def _act_grad(y, dy, activation, param):
    """The gradient before the activation, from its output y."""
    if activation == "leaky_relu":
        return torch.where(y >= 0, dy, dy * param)
    if activation == "elu":
        return torch.where(y >= 0, dy, dy * (y + param))
    return dy


class _InPlaceABNFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps, activation, param):
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        if training:
            mean = x.mean(dims)
            var = ((x - mean.view(_shape(c, x))) ** 2).mean(dims)
            count = x.numel() // c
            if running_mean is not None:
                running_mean.mul_(1 - momentum).add_(momentum * mean)
                running_var.mul_(1 - momentum).add_(momentum * var * count / (count - 1))
        else:
            mean, var = running_mean, running_var
        scale = (weight.abs() + eps) if weight is not None else torch.ones_like(mean)
        shift = bias if bias is not None else torch.zeros_like(mean)
        xhat = (x - mean.view(_shape(c, x))) / torch.sqrt(var + eps).view(_shape(c, x))
        y = xhat * scale.view(_shape(c, x)) + shift.view(_shape(c, x))
        if activation == "leaky_relu":
            y = F.leaky_relu(y, param)
        elif activation == "elu":
            y = F.elu(y, param)
        ctx.training, ctx.eps, ctx.activation, ctx.param = training, eps, activation, param
        ctx.save_for_backward(y, var, weight, bias, scale, shift)
        return y

    @staticmethod
    def backward(ctx, dy_act):
        y, var, weight, bias, scale, shift = ctx.saved_tensors
        c = y.shape[1]
        dims = [0] + list(range(2, y.dim()))
        v = _shape(c, y)
        dy = _act_grad(y, dy_act, ctx.activation, ctx.param)
        # the output before the activation, then x_hat, recovered from y
        if ctx.activation == "leaky_relu":
            pre = torch.where(y >= 0, y, y / ctx.param)
        elif ctx.activation == "elu":
            pre = torch.where(y >= 0, y, torch.log1p(y / ctx.param))
        else:
            pre = y
        xhat = (pre - shift.view(v)) / scale.view(v)
        sum_dy = dy.sum(dims)
        sum_xhat_dy = (xhat * dy).sum(dims)
        mult = (scale / torch.sqrt(var + ctx.eps)).view(v)
        if ctx.training:
            count = y.numel() // c
            dx = (dy - (sum_dy / count).view(v) - xhat * (sum_xhat_dy / count).view(v)) * mult
        else:
            dx = dy * mult
        dweight = None if weight is None else torch.where(weight < 0, -sum_xhat_dy, sum_xhat_dy)
        dbias = None if bias is None else sum_dy
        return dx, dweight, dbias, None, None, None, None, None, None, None


class ABN(nn.Module):
    """inplace_abn.ABN's constructor, attributes and buffers."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 activation="leaky_relu", activation_param=0.01):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.activation, self.activation_param = activation, activation_param
        if affine:
            self.weight = nn.Parameter(torch.ones(num_features))
            self.bias = nn.Parameter(torch.zeros(num_features))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_features))
            self.register_buffer("running_var", torch.ones(num_features))
            self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))
        else:
            self.register_parameter("running_mean", None)
            self.register_parameter("running_var", None)
            self.register_parameter("num_batches_tracked", None)

    def _momentum_training(self):
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked += 1
            if self.momentum is None:
                momentum = 1.0 / float(self.num_batches_tracked)
        training = self.training or (self.running_mean is None and self.running_var is None)
        return momentum, training

    def _running(self):
        keep = not self.training or self.track_running_stats
        return (self.running_mean, self.running_var) if keep else (None, None)

    def forward(self, x):
        momentum, training = self._momentum_training()
        rm, rv = self._running()
        y = F.batch_norm(x, rm, rv, self.weight, self.bias, training, momentum, self.eps)
        if self.activation == "relu":
            return F.relu(y)
        if self.activation == "leaky_relu":
            return F.leaky_relu(y, self.activation_param)
        if self.activation == "elu":
            return F.elu(y, self.activation_param)
        return y


class InPlaceABN(ABN):
    def forward(self, x):
        if self.activation not in ("identity", "leaky_relu", "elu"):
            raise ValueError(f"Unknown activation function {self.activation}")
        momentum, training = self._momentum_training()
        rm, rv = self._running()
        return _InPlaceABNFn.apply(x, self.weight, self.bias, rm, rv, training, momentum, self.eps,
                                   self.activation, self.activation_param)


class InPlaceABNSync(InPlaceABN):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 activation="leaky_relu", activation_param=0.01, group=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, activation, activation_param)
        self.group = group

    def set_group(self, group):
        self.group = group
