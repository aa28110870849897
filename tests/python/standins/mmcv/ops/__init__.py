"""mmcv.ops (stand-in): SyncBatchNorm only."""
from .sync_bn import SyncBatchNorm

__all__ = ["SyncBatchNorm"]
