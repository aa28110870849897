"""A stand-in for the part of OpenMMLab's mmcv that test_torch_mmcv.py needs: its
synchronized batch norm, mmcv.ops.SyncBatchNorm (ops/sync_bn.py). mmcv's ops are a CUDA
build with no CPU kernel for this layer, so the tests run against this stand-in."""
