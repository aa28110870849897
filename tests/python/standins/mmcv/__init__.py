"""A stand-in for the parts of OpenMMLab's mmcv that test_torch_mmcv.py needs: its
synchronized batch norm, mmcv.ops.SyncBatchNorm (ops/sync_bn.py), and its convolution +
norm + activation brick, mmcv.cnn.ConvModule (cnn/bricks/conv_module.py). mmcv's ops are a
CUDA build with no CPU kernel for that layer, and mmcv.cnn needs mmengine, so the tests run
against these stand-ins."""
