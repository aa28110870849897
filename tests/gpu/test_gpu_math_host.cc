// test_gpu_math's kernels built by the host C++ compiler: each launch runs as host loops
// over the same grid (see test_gpu_math.cu). No GPU, no CUDA runtime; CUDA's fp16/bf16
// headers only.
#include "test_gpu_math.cu"
