"""A stand-in for mmcv's ConvModule (mmcv/cnn/bricks/conv_module.py, read at
open-mmlab/mmcv a8073c74b, 2026-01), written from its rules for what the tests build:

- the constructor (in_channels, out_channels, kernel_size, stride=1, padding=0,
  dilation=1, groups=1, bias="auto", conv_cfg=None, norm_cfg=None,
  act_cfg={"type": "ReLU"}, inplace=True, with_spectral_norm=False,
  padding_mode="zeros", order=("conv", "norm", "act"), efficient_conv_bn_eval=False):
  a 2-D convolution `conv` (a bias where "auto" and no norm), padding 0 and a
  `padding_layer` (nn.ReflectionPad2d) for padding_mode "reflect" (with_explicit_padding),
  the norm of norm_cfg's type ("BN": nn.BatchNorm2d, "SyncBN": nn.SyncBatchNorm,
  "MMSyncBN": mmcv.ops.SyncBatchNorm, the stand-in; other keys its arguments) as child
  "bn" (norm_name; the norm's channels the convolution's output's where the norm comes
  after it, else its input's), the activation of act_cfg's type as `activate`
  ("ReLU", "LeakyReLU" with inplace=`inplace` unless act_cfg says; "GELU"); the
  attributes with_norm, with_activation, with_explicit_padding, order, norm_name,
  efficient_conv_bn_eval_forward, and the convolution's (in_channels, ...); then
  init_weights();
- init_weights(): the convolution's weight from Kaiming's normal rule (fan out, the
  activation's gain: leaky ReLU's of its slope, else ReLU's), its bias 0, where the
  convolution has no init_weights of its own; the norm's weight 1 and bias 0;
- `norm`: the norm child, or None;
- forward(x, activate=True, norm=True): the three layers in `order`: the convolution
  (after padding_layer where with_explicit_padding), the norm where `norm` and
  with_norm, the activation where `activate` and with_activation; where the convolution
  is followed by the norm, `norm` is given, the norm is in eval and
  efficient_conv_bn_eval_forward is set, the convolution's forward for that call is
  that function of (the norm, the convolution, x), the norm folded into the
  convolution's weight and bias, and the norm is skipped;
- turn_on_efficient_conv_bn_eval(on=True): sets efficient_conv_bn_eval_forward where on
  and the norm is a batch norm with running statistics, else None."""

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from ...ops import SyncBatchNorm as MMSyncBN


def efficient_conv_bn_eval_forward(bn, conv, x):
    """conv of x with eval-mode batch norm bn folded in: each output channel's weight
    scaled by weight / sqrt(running_var + eps), its bias bn's bias plus that scale times
    (conv's bias - running_mean)."""
    scale = (bn.weight if bn.weight is not None else torch.ones_like(bn.running_var)) \
        * (bn.running_var + bn.eps).rsqrt()
    shift = bn.bias if bn.bias is not None else torch.zeros_like(bn.running_var)
    conv_bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_var)
    weight = conv.weight * scale.reshape(-1, *([1] * (conv.weight.dim() - 1)))
    return conv._conv_forward(x, weight, shift + scale * (conv_bias - bn.running_mean))


_NORMS = {"BN": nn.BatchNorm2d, "SyncBN": nn.SyncBatchNorm, "MMSyncBN": MMSyncBN}
_ACTS = {"ReLU": nn.ReLU, "LeakyReLU": nn.LeakyReLU, "GELU": nn.GELU}


class ConvModule(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias="auto", conv_cfg=None, norm_cfg=None, act_cfg={"type": "ReLU"},
                 inplace=True, with_spectral_norm=False, padding_mode="zeros", order=("conv", "norm", "act"),
                 efficient_conv_bn_eval=False):
        super().__init__()
        if not (isinstance(order, tuple) and len(order) == 3 and set(order) == {"conv", "norm", "act"}):
            raise AssertionError(f"order {order!r}")
        self.conv_cfg, self.norm_cfg, self.act_cfg = conv_cfg, norm_cfg, act_cfg
        self.inplace = inplace
        self.with_spectral_norm = with_spectral_norm
        self.with_explicit_padding = padding_mode not in ("zeros", "circular")
        self.order = order
        self.with_norm = norm_cfg is not None
        self.with_activation = act_cfg is not None
        self.with_bias = (not self.with_norm) if bias == "auto" else bias
        if self.with_explicit_padding:
            self.padding_layer = nn.ReflectionPad2d(padding)
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                              padding=0 if self.with_explicit_padding else padding, dilation=dilation, groups=groups,
                              bias=self.with_bias)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = self.conv.kernel_size, self.conv.stride, padding
        self.dilation, self.groups = self.conv.dilation, self.conv.groups
        if self.with_norm:
            cfg = dict(norm_cfg)
            channels = out_channels if order.index("norm") > order.index("conv") else in_channels
            self.norm_name = "bn"
            self.add_module(self.norm_name, _NORMS[cfg.pop("type")](channels, **cfg))
        else:
            self.norm_name = None
        self.turn_on_efficient_conv_bn_eval(efficient_conv_bn_eval)
        if self.with_activation:
            cfg = dict(act_cfg)
            kind = cfg.pop("type")
            if kind != "GELU":
                cfg.setdefault("inplace", inplace)
            self.activate = _ACTS[kind](**cfg)
        self.init_weights()

    def init_weights(self):
        if not hasattr(self.conv, "init_weights"):
            leaky = self.with_activation and self.act_cfg["type"] == "LeakyReLU"
            a = self.act_cfg.get("negative_slope", 0.01) if leaky else 0
            nn.init.kaiming_normal_(self.conv.weight, a=a, mode="fan_out",
                                    nonlinearity="leaky_relu" if leaky else "relu")
            if self.conv.bias is not None:
                nn.init.constant_(self.conv.bias, 0)
        if self.with_norm:
            if getattr(self.norm, "weight", None) is not None:
                nn.init.constant_(self.norm.weight, 1)
            if getattr(self.norm, "bias", None) is not None:
                nn.init.constant_(self.norm.bias, 0)

    @property
    def norm(self):
        return getattr(self, self.norm_name) if self.norm_name else None

    def turn_on_efficient_conv_bn_eval(self, efficient_conv_bn_eval=True):
        on = (efficient_conv_bn_eval and isinstance(self.norm, _BatchNorm)
              and self.norm.track_running_stats)
        self.efficient_conv_bn_eval_forward = efficient_conv_bn_eval_forward if on else None

    def forward(self, x, activate=True, norm=True):
        i = 0
        while i < 3:
            layer = self.order[i]
            if layer == "conv":
                if self.with_explicit_padding:
                    x = self.padding_layer(x)
                folded = (i < 2 and self.order[i + 1] == "norm" and norm and self.with_norm
                          and not self.norm.training and self.efficient_conv_bn_eval_forward is not None)
                if folded:
                    fold = self.efficient_conv_bn_eval_forward
                    self.conv.forward = lambda t: fold(self.norm, self.conv, t)
                    x = self.conv(x)
                    del self.conv.forward
                    i += 1  # the norm is in the convolution
                else:
                    x = self.conv(x)
            elif layer == "norm" and norm and self.with_norm:
                x = self.norm(x)
            elif layer == "act" and activate and self.with_activation:
                x = self.activate(x)
            i += 1
        return x
