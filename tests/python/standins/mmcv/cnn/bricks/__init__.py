"""mmcv.cnn.bricks (stand-in): ConvModule only."""
from .conv_module import ConvModule

__all__ = ["ConvModule"]
