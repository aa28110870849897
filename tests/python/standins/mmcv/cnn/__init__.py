"""mmcv.cnn (stand-in): ConvModule only."""
from .bricks import ConvModule

__all__ = ["ConvModule"]
