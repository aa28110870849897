/* cudnn.c — the cuDNN path (W = 1: one GPU, no sync, the speed a user gives up nothing to):
 * cudnnBatchNormalizationForwardTrainingEx / BackwardEx, bnOps CUDNN_BATCHNORM_OPS_BN (with
 * --epilogue relu / add-relu: _BN_ACTIVATION / _BN_ADD_ACTIVATION with a ReLU, which cuDNN
 * documents for NHWC fp16 in SPATIAL_PERSISTENT; other rows say what it refused), each mode
 * cuDNN takes (CUDNN_BATCHNORM_SPATIAL_PERSISTENT, CUDNN_BATCHNORM_SPATIAL) timed, the
 * faster kept.
 * libcudnn.so.9 is loaded with dlopen at run time (the build only needs cudnn.h, found by
 * CMake: SBN_BENCH_HAVE_CUDNN_H), so sbn-bench runs where cuDNN is absent and the row says
 * why; a combination cuDNN does not support is a row that says so, not a failure. Workspace
 * and reserve space are allocated once, outside the timing. */
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "paths.h"
#include "sbn_bench_build.h" /* generated: SBN_BENCH_CUDNN_LIBRARY */

#ifndef SBN_BENCH_HAVE_CUDNN_H
#define SBN_BENCH_HAVE_CUDNN_H 0
#endif
#if SBN_BENCH_HAVE_CUDNN_H
#include <cudnn.h> /* types only: every cuDNN function is resolved with dlsym */
#endif

/* cuDNN: every function through a pointer from dlsym; the types come from cudnn.h when the
   build found it (SBN_BENCH_HAVE_CUDNN_H), else only the version is read. */
struct bench_cudnn {
  bench_lib_info_t* info; /* the caller's: what was loaded; why non-empty: the rows do not run */
#if SBN_BENCH_HAVE_CUDNN_H
  int handle_tried;
  cudnnHandle_t handle; /* created at the first cuDNN row, on the bench stream */
  const char* (*GetErrorString)(cudnnStatus_t);
  void (*GetLastErrorString)(char*, size_t); /* NULL before cuDNN 9 */
  cudnnStatus_t (*Create)(cudnnHandle_t*);
  cudnnStatus_t (*Destroy)(cudnnHandle_t);
  cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
  cudnnStatus_t (*CreateTensorDescriptor)(cudnnTensorDescriptor_t*);
  cudnnStatus_t (*DestroyTensorDescriptor)(cudnnTensorDescriptor_t);
  cudnnStatus_t (*SetTensor4dDescriptor)(cudnnTensorDescriptor_t, cudnnTensorFormat_t,
                                         cudnnDataType_t, int, int, int, int);
  cudnnStatus_t (*DeriveBNTensorDescriptor)(cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                            cudnnBatchNormMode_t);
  /* --epilogue: the ReLU of CUDNN_BATCHNORM_OPS_BN_ACTIVATION / _ADD_ACTIVATION */
  cudnnStatus_t (*CreateActivationDescriptor)(cudnnActivationDescriptor_t*);
  cudnnStatus_t (*SetActivationDescriptor)(cudnnActivationDescriptor_t, cudnnActivationMode_t,
                                           cudnnNanPropagation_t, double);
  cudnnStatus_t (*DestroyActivationDescriptor)(cudnnActivationDescriptor_t);
  cudnnStatus_t (*GetFwdWorkspaceSize)(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t,
                                       const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                       const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                       const cudnnActivationDescriptor_t, size_t*);
  cudnnStatus_t (*GetBwdWorkspaceSize)(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t,
                                       const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                       const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                       const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                       const cudnnActivationDescriptor_t, size_t*);
  cudnnStatus_t (*GetReserveSize)(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t,
                                  const cudnnActivationDescriptor_t, const cudnnTensorDescriptor_t,
                                  size_t*);
  cudnnStatus_t (*ForwardTrainingEx)(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t,
                                     const void*, const void*, const cudnnTensorDescriptor_t,
                                     const void*, const cudnnTensorDescriptor_t, const void*,
                                     const cudnnTensorDescriptor_t, void*,
                                     const cudnnTensorDescriptor_t, const void*, const void*,
                                     double, void*, void*, double, void*, void*,
                                     cudnnActivationDescriptor_t, void*, size_t, void*, size_t);
  cudnnStatus_t (*BackwardEx)(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t, const void*,
                              const void*, const void*, const void*, const cudnnTensorDescriptor_t,
                              const void*, const cudnnTensorDescriptor_t, const void*,
                              const cudnnTensorDescriptor_t, const void*,
                              const cudnnTensorDescriptor_t, void*, const cudnnTensorDescriptor_t,
                              void*, const cudnnTensorDescriptor_t, const void*, const void*, void*,
                              void*, double, const void*, const void*, cudnnActivationDescriptor_t,
                              void*, size_t, void*, size_t);
  /* the inference table; NULL where the library lacks it (its rows are then skipped) */
  cudnnStatus_t (*ForwardInference)(cudnnHandle_t, cudnnBatchNormMode_t, const void*, const void*,
                                    const cudnnTensorDescriptor_t, const void*,
                                    const cudnnTensorDescriptor_t, void*,
                                    const cudnnTensorDescriptor_t, const void*, const void*,
                                    const void*, const void*, double);
#endif
};

#if SBN_BENCH_HAVE_CUDNN_H && defined(__GNUC__)
/* Each pointer has exactly the type of the function cudnn.h declares. */
#define BENCH_CUDNN_SAME_TYPE(field, fn)                                                     \
  _Static_assert(                                                                            \
      __builtin_types_compatible_p(__typeof__(((bench_cudnn_t*)0)->field), __typeof__(&fn)), \
      #fn ": the pointer type differs from cudnn.h")
BENCH_CUDNN_SAME_TYPE(GetErrorString, cudnnGetErrorString);
BENCH_CUDNN_SAME_TYPE(GetLastErrorString, cudnnGetLastErrorString);
BENCH_CUDNN_SAME_TYPE(Create, cudnnCreate);
BENCH_CUDNN_SAME_TYPE(Destroy, cudnnDestroy);
BENCH_CUDNN_SAME_TYPE(SetStream, cudnnSetStream);
BENCH_CUDNN_SAME_TYPE(CreateTensorDescriptor, cudnnCreateTensorDescriptor);
BENCH_CUDNN_SAME_TYPE(DestroyTensorDescriptor, cudnnDestroyTensorDescriptor);
BENCH_CUDNN_SAME_TYPE(SetTensor4dDescriptor, cudnnSetTensor4dDescriptor);
BENCH_CUDNN_SAME_TYPE(DeriveBNTensorDescriptor, cudnnDeriveBNTensorDescriptor);
BENCH_CUDNN_SAME_TYPE(CreateActivationDescriptor, cudnnCreateActivationDescriptor);
BENCH_CUDNN_SAME_TYPE(SetActivationDescriptor, cudnnSetActivationDescriptor);
BENCH_CUDNN_SAME_TYPE(DestroyActivationDescriptor, cudnnDestroyActivationDescriptor);
BENCH_CUDNN_SAME_TYPE(GetFwdWorkspaceSize,
                      cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize);
BENCH_CUDNN_SAME_TYPE(GetBwdWorkspaceSize, cudnnGetBatchNormalizationBackwardExWorkspaceSize);
BENCH_CUDNN_SAME_TYPE(GetReserveSize, cudnnGetBatchNormalizationTrainingExReserveSpaceSize);
BENCH_CUDNN_SAME_TYPE(ForwardTrainingEx, cudnnBatchNormalizationForwardTrainingEx);
BENCH_CUDNN_SAME_TYPE(BackwardEx, cudnnBatchNormalizationBackwardEx);
BENCH_CUDNN_SAME_TYPE(ForwardInference, cudnnBatchNormalizationForwardInference);
#undef BENCH_CUDNN_SAME_TYPE
#endif

/* One per process: cuDNN is loaded once. */
static bench_cudnn_t the_cudnn;

bench_cudnn_t* cudnn_load(bench_lib_info_t* info) {
  bench_cudnn_t* c = &the_cudnn;
  memset(c, 0, sizeof *c);
  memset(info, 0, sizeof *info);
  c->info = info;
  info->version = -1;
  /* the library next to the cudnn.h the bench was compiled with (e.g. the wheel's that
     PyTorch uses) first, then whatever the loader finds as libcudnn.so.9 */
  static const char* const names[2] = {SBN_BENCH_CUDNN_LIBRARY, "libcudnn.so.9"};
  /* the library stays loaded until exit: its own teardown may run at exit */
  void* lib = lib_open(names, info->from, sizeof info->from, info->why, sizeof info->why);
  if (!lib) return c;
  info->loaded = 1;
  size_t (*get_version)(void) = NULL;
  char why[400] = "";
  if (lib_sym(lib, "cudnnGetVersion", &get_version, sizeof get_version, why, sizeof why) == 0)
    info->version = (long long)get_version();
#if SBN_BENCH_HAVE_CUDNN_H
  struct {
    const char* name;
    void* fn;
    size_t size;
    int optional;
  } syms[] = {
#define BENCH_SYM(field, name, optional) {name, &c->field, sizeof c->field, optional}
      BENCH_SYM(GetErrorString, "cudnnGetErrorString", 0),
      BENCH_SYM(GetLastErrorString, "cudnnGetLastErrorString", 1),
      BENCH_SYM(Create, "cudnnCreate", 0),
      BENCH_SYM(Destroy, "cudnnDestroy", 0),
      BENCH_SYM(SetStream, "cudnnSetStream", 0),
      BENCH_SYM(CreateTensorDescriptor, "cudnnCreateTensorDescriptor", 0),
      BENCH_SYM(DestroyTensorDescriptor, "cudnnDestroyTensorDescriptor", 0),
      BENCH_SYM(SetTensor4dDescriptor, "cudnnSetTensor4dDescriptor", 0),
      BENCH_SYM(DeriveBNTensorDescriptor, "cudnnDeriveBNTensorDescriptor", 0),
      BENCH_SYM(CreateActivationDescriptor, "cudnnCreateActivationDescriptor", 0),
      BENCH_SYM(SetActivationDescriptor, "cudnnSetActivationDescriptor", 0),
      BENCH_SYM(DestroyActivationDescriptor, "cudnnDestroyActivationDescriptor", 0),
      BENCH_SYM(GetFwdWorkspaceSize, "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize", 0),
      BENCH_SYM(GetBwdWorkspaceSize, "cudnnGetBatchNormalizationBackwardExWorkspaceSize", 0),
      BENCH_SYM(GetReserveSize, "cudnnGetBatchNormalizationTrainingExReserveSpaceSize", 0),
      BENCH_SYM(ForwardTrainingEx, "cudnnBatchNormalizationForwardTrainingEx", 0),
      BENCH_SYM(BackwardEx, "cudnnBatchNormalizationBackwardEx", 0),
      BENCH_SYM(ForwardInference, "cudnnBatchNormalizationForwardInference", 1),
#undef BENCH_SYM
  };
  for (size_t i = 0; i < sizeof syms / sizeof *syms; i++)
    if (lib_sym(lib, syms[i].name, syms[i].fn, syms[i].size, why, sizeof why) != 0 &&
        !syms[i].optional) {
      snprintf(info->why, sizeof info->why, "%s", why);
      return c;
    }
#else
  snprintf(info->why, sizeof info->why,
           "sbn-bench was built without cudnn.h (CMake did not find it: set SYNCBN_CUDNN_ROOT "
           "to a directory with include/cudnn.h)");
#endif
  return c;
}

void cudnn_unload(bench_cudnn_t* c) {
#if SBN_BENCH_HAVE_CUDNN_H
  if (c->handle) c->Destroy(c->handle);
  c->handle = NULL;
#else
  (void)c;
#endif
}

#if SBN_BENCH_HAVE_CUDNN_H
/* "CUDNN_STATUS_NOT_SUPPORTED (3000): <cuDNN's last error message>" */
static void cudnn_status_text(const bench_cudnn_t* c, cudnnStatus_t st, char* buf, size_t cap) {
  char last[200] = "";
  if (c->GetLastErrorString) c->GetLastErrorString(last, sizeof last);
  last[sizeof last - 1] = '\0';
  const char* name = c->GetErrorString(st);
  snprintf(buf, cap, "%s (%d)%s%s", name ? name : "?", (int)st, last[0] ? ": " : "", last);
}

/* 1 when cuDNN is usable: loaded, resolved, and a handle exists on the bench stream (made at
   the first call); 0 with c->info->why set. */
static int cudnn_ready(bench_cudnn_t* c, const bench_gpu_t* g) {
  if (c->info->why[0]) return 0;
  if (!c->handle_tried) {
    c->handle_tried = 1;
    char text[300];
    cudnnStatus_t st = c->Create(&c->handle);
    if (st != CUDNN_STATUS_SUCCESS) {
      c->handle = NULL;
      cudnn_status_text(c, st, text, sizeof text);
      snprintf(c->info->why, sizeof c->info->why, "cudnnCreate: %s", text);
      return 0;
    }
    st = c->SetStream(c->handle, g->stream);
    if (st != CUDNN_STATUS_SUCCESS) {
      cudnn_status_text(c, st, text, sizeof text);
      snprintf(c->info->why, sizeof c->info->why, "cudnnSetStream: %s", text);
      c->Destroy(c->handle);
      c->handle = NULL;
      return 0;
    }
  }
  return c->handle != NULL;
}

typedef struct {
  bench_cudnn_t* cu;
  cudnnBatchNormMode_t mode;
  cudnnTensorDescriptor_t xd, bnd; /* x, y, dy, dx (z, dz): xd; weight, bias, statistics: bnd */
  /* --epilogue: CUDNN_BATCHNORM_OPS_BN_ACTIVATION (relu) or _ADD_ACTIVATION (add-relu: z in
     the forward, dz out of the backward), with act a ReLU; CUDNN_BATCHNORM_OPS_BN and NULL
     without */
  cudnnBatchNormOps_t ops;
  cudnnActivationDescriptor_t act;
  cudnnTensorDescriptor_t zd; /* xd with add-relu, else NULL */
  bench_team_bufs_t* dev;          /* one rank */
  double eps, momentum;
  void* ws;
  size_t ws_bytes;
  void* reserve;
  size_t reserve_bytes;
  cudnnStatus_t status; /* of the last call */
} bench_cudnn_ctx_t;

/* One cudnnBatchNormalizationForwardTrainingEx or BackwardEx, queued on the bench stream. */
static cudnnStatus_t cudnn_call(bench_cudnn_ctx_t* k, int fwd) {
  const float one = 1.0f, zero = 0.0f;
  const bench_team_bufs_t* b = k->dev;
  const bench_cudnn_t* cu = k->cu;
  void* z = k->zd ? b->z[0] : NULL;
  void* dz = k->zd ? b->dz[0] : NULL;
  if (fwd)
    return cu->ForwardTrainingEx(cu->handle, k->mode, k->ops, &one, &zero, k->xd, b->x[0], k->zd, z,
                                 k->xd, b->y[0], k->bnd, b->weight, b->bias, k->momentum, b->rm[0],
                                 b->rv[0], k->eps, b->save_mean[0], b->save_invstd[0], k->act, k->ws,
                                 k->ws_bytes, k->reserve, k->reserve_bytes);
  /* alpha/beta for dx, then for dweight/dbias: overwrite both; y (the forward's output) is
     read with an activation (BN_ACTIVATION takes its mask from y; BN_ADD_ACTIVATION from the
     forward's reserve space, which is kept), and is a valid tensor without */
  return cu->BackwardEx(cu->handle, k->mode, k->ops, &one, &zero, &one, &zero, k->xd, b->x[0],
                        k->xd, b->y[0], k->xd, b->dy[0], k->zd, dz, k->xd, b->dx[0], k->bnd,
                        b->weight, b->bias, b->dweight[0], b->dbias[0], k->eps, b->save_mean[0],
                        b->save_invstd[0], k->act, k->ws, k->ws_bytes, k->reserve,
                        k->reserve_bytes);
}

static double cudnn_op(void* ctx, int fwd, char* err, size_t cap) {
  bench_cudnn_ctx_t* k = ctx;
  double t0 = now_us();
  k->status = cudnn_call(k, fwd);
  double t = now_us() - t0;
  if (k->status != CUDNN_STATUS_SUCCESS) {
    char text[300];
    cudnn_status_text(k->cu, k->status, text, sizeof text);
    snprintf(err, cap, "%s: %s",
             fwd ? "cudnnBatchNormalizationForwardTrainingEx" : "cudnnBatchNormalizationBackwardEx",
             text);
    return -1;
  }
  return t;
}

static int cudnn_not_supported(cudnnStatus_t st) {
  return CUDNN_STATUS_CATEGORY((int)st) == CUDNN_STATUS_NOT_SUPPORTED;
}

/* Workspace (forward and backward share one) and reserve space for k->mode, allocated here,
   outside the timing. Returns the first cuDNN status that is not a success, or
   CUDNN_STATUS_SUCCESS; -1 (as a status) after a CUDA allocation failure, with err set. */
static int cudnn_prepare(bench_cudnn_ctx_t* k, char* err, size_t cap) {
  const bench_cudnn_t* cu = k->cu;
  size_t ws_f = 0, ws_b = 0, res = 0;
  cudnnStatus_t st = cu->GetFwdWorkspaceSize(cu->handle, k->mode, k->ops, k->xd, k->zd, k->xd,
                                             k->bnd, k->act, &ws_f);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cu->GetBwdWorkspaceSize(cu->handle, k->mode, k->ops, k->xd, k->xd, k->xd, k->zd, k->xd,
                                 k->bnd, k->act, &ws_b);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cu->GetReserveSize(cu->handle, k->mode, k->ops, k->act, k->xd, &res);
  if (st != CUDNN_STATUS_SUCCESS) return (int)st;
  if (k->ws) cudaFree(k->ws);
  if (k->reserve) cudaFree(k->reserve);
  k->ws = k->reserve = NULL;
  k->ws_bytes = ws_f > ws_b ? ws_f : ws_b;
  /* every op gets a workspace: with NULL and 0, cudnnBatchNormalizationForwardTrainingEx
     documents that it acts as the plain cudnnBatchNormalizationForwardTraining (for the fused
     ops: no z, no activation, a wrong row instead of a refused one), and its fast NHWC
     kernel needs a workspace that is not NULL (the plain op's too: a slower cuDNN row) */
  if (k->ws_bytes < 256) k->ws_bytes = 256;
  k->reserve_bytes = res;
  if (k->ws_bytes) GPU_TRY(cudaMalloc(&k->ws, k->ws_bytes), "cudaMalloc (cuDNN workspace)");
  if (k->reserve_bytes)
    GPU_TRY(cudaMalloc(&k->reserve, k->reserve_bytes), "cudaMalloc (cuDNN reserve space)");
  return (int)CUDNN_STATUS_SUCCESS;
fail:
  return -1;
}

/* A row's tensor as cuDNN's 4-d descriptor takes it: its data type, and the shape's own H
   and W where spatial is H*W (--scale 1), else (spatial, 1) (batch norm does not care how
   the spatial extent is split). 0, the row skipped and its note saying why, where the
   tensor does not fit int strides. */
static int cudnn_geometry(bench_row_t* row, sbnTensorDesc_t* d, cudnnDataType_t* dt, int* h,
                          int* w) {
  *d = row_desc(row);
  if (d->n * d->c * d->spatial > INT_MAX || d->c > INT_MAX || d->n > INT_MAX ||
      d->spatial > INT_MAX) {
    row->skipped = 1;
    snprintf(row->note, sizeof row->note,
             "not run: %" PRId64 " elements do not fit a cuDNN 4-d descriptor (int strides)",
             d->n * d->c * d->spatial);
    return 0;
  }
  *dt = d->dtype == sbnFloat32    ? CUDNN_DATA_FLOAT
        : d->dtype == sbnBFloat16 ? CUDNN_DATA_BFLOAT16
                                  : CUDNN_DATA_HALF;
  *h = (int)d->spatial;
  *w = 1;
  if (row->shape->h * row->shape->w == d->spatial) {
    *h = (int)row->shape->h;
    *w = (int)row->shape->w;
  }
  return 1;
}
#endif /* SBN_BENCH_HAVE_CUDNN_H */

/* The start of a cuDNN row: 1 when it may run; 0 after saying why not (an earlier CUDA
   failure: an error; cuDNN not loaded, or not usable here: a skipped row). */
static int cudnn_row_may_run(bench_row_t* row, bench_gpu_t* g, bench_cudnn_t* cu) {
  if (g->dead[0]) {
    snprintf(row->error, sizeof row->error, "not run: %s", g->dead);
    return 0;
  }
#if SBN_BENCH_HAVE_CUDNN_H
  if (cudnn_ready(cu, g)) return 1;
#endif
  row->skipped = 1;
  snprintf(row->note, sizeof row->note, "cuDNN not available: %.370s", cu->info->why);
  return 0;
}

/* One cuDNN row (W = 1: one GPU, no sync) on rank 0's inputs of host_all: its own device
   buffers, descriptors, workspace; the timed forward and backward of each mode cuDNN
   takes (SPATIAL_PERSISTENT, SPATIAL), the faster kept; then the check run in that mode.
   A combination cuDNN does not support, or cuDNN not loadable, makes a skipped row (note
   says why), not a failure. */
void cudnn_row(bench_row_t* row, bench_gpu_t* g, const bench_opts_t* o,
               const bench_team_bufs_t* host_all, bench_cudnn_t* cu) {
  if (!cudnn_row_may_run(row, g, cu)) return;
#if !SBN_BENCH_HAVE_CUDNN_H
  (void)o;
  (void)host_all;
#else
  char* err = row->error;
  const size_t cap = sizeof row->error;
  sbnTensorDesc_t d;
  cudnnDataType_t dt;
  int h, w;
  if (!cudnn_geometry(row, &d, &dt, &h, &w)) return;
  static const char* const kOpsNames[3] = {"CUDNN_BATCHNORM_OPS_BN",
                                           "CUDNN_BATCHNORM_OPS_BN_ACTIVATION (ReLU)",
                                           "CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION (ReLU)"};
  static const char* const kModeNames[2] = {"CUDNN_BATCHNORM_SPATIAL_PERSISTENT",
                                            "CUDNN_BATCHNORM_SPATIAL"};
  static const cudnnBatchNormMode_t kModes[2] = {CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
                                                 CUDNN_BATCHNORM_SPATIAL};
  bench_team_bufs_t host = *host_all; /* rank 0 only */
  host.W = 1;
  bench_team_bufs_t dev;
  memset(&dev, 0, sizeof dev);
  bench_cudnn_ctx_t k;
  memset(&k, 0, sizeof k);
  k.cu = cu;
  k.dev = &dev;
  const sbnParams_t params = SBN_PARAMS_DEFAULT;
  k.eps = (double)params.eps;
  k.momentum = (double)params.momentum;
  char text[300], refused[360] = "";
  double* samples = malloc((size_t)o->iters * 2 * sizeof(double));
  if (!samples) {
    snprintf(err, cap, "out of host memory");
    goto out;
  }
  if (gpu_bufs_alloc(&dev, 1, &d, err, cap) != 0 ||
      gpu_bufs_alloc_epilogue(&dev, host.epilogue, err, cap) != 0)
    goto out;
  bufs_reset_state(&host);
  if (gpu_upload(&dev, &host, 1, g->stream, err, cap) != 0) goto out;

  cudnnStatus_t st = cu->CreateTensorDescriptor(&k.xd);
  if (st == CUDNN_STATUS_SUCCESS) st = cu->CreateTensorDescriptor(&k.bnd);
  if (st != CUDNN_STATUS_SUCCESS) {
    cudnn_status_text(cu, st, text, sizeof text);
    snprintf(err, cap, "cudnnCreateTensorDescriptor: %s", text);
    goto out;
  }
  st = cu->SetTensor4dDescriptor(k.xd,
                                 d.layout == sbnLayoutNHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                 dt, (int)d.n, (int)d.c, h, w);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cu->DeriveBNTensorDescriptor(k.bnd, k.xd, CUDNN_BATCHNORM_SPATIAL);
  if (st != CUDNN_STATUS_SUCCESS) {
    cudnn_status_text(cu, st, text, sizeof text);
    if (cudnn_not_supported(st)) {
      row->skipped = 1;
      snprintf(row->note, sizeof row->note, "not supported by cuDNN: tensor descriptor: %s", text);
    } else {
      snprintf(err, cap, "cudnnSetTensor4dDescriptor / cudnnDeriveBNTensorDescriptor: %s", text);
    }
    goto out;
  }
  k.ops = CUDNN_BATCHNORM_OPS_BN;
  if (host.epilogue != BENCH_EPI_NONE) { /* y = relu(bn(x) [+ z]): cuDNN's fused ops */
    k.ops = host.epilogue == BENCH_EPI_ADD_RELU ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                                                : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
    k.zd = host.epilogue == BENCH_EPI_ADD_RELU ? k.xd : NULL;
    st = cu->CreateActivationDescriptor(&k.act);
    if (st == CUDNN_STATUS_SUCCESS)
      st = cu->SetActivationDescriptor(k.act, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0);
    if (st != CUDNN_STATUS_SUCCESS) {
      cudnn_status_text(cu, st, text, sizeof text);
      snprintf(err, cap, "cudnnCreateActivationDescriptor / cudnnSetActivationDescriptor: %s", text);
      goto out;
    }
  }

  /* The mode: cuDNN's documentation says SPATIAL_PERSISTENT "may be faster" than SPATIAL,
     not that it is, so each mode cuDNN takes is timed (one untimed forward + backward,
     counted as warm-up, tells whether it takes it) and the row keeps the one whose forward
     + backward medians are the lower, as a user would pick for training; the note gives
     both. A refusal (not supported, or a bad parameter for this shape) is named in the
     note where the other mode runs. */
  int chosen = -1, timed = 0;
  double best = 0.0, sum_us[2] = {0.0, 0.0};
  for (int m = 0; m < 2; m++) {
    k.mode = kModes[m];
    int pst = cudnn_prepare(&k, err, cap);
    if (pst < 0) goto out; /* CUDA allocation failure */
    st = (cudnnStatus_t)pst;
    if (st == CUDNN_STATUS_SUCCESS) st = cudnn_call(&k, 1);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnn_call(&k, 0);
    if (st == CUDNN_STATUS_SUCCESS) {
      GPU_TRY(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize (cuDNN probe)");
      bench_times_t mt[2] = {row->t[0], row->t[1]};
      for (int fwd = 1; fwd >= 0; fwd--) {
        double *ev_us = samples, *host_us = samples + o->iters;
        if (gpu_time_op(g, cudnn_op, &k, fwd, o, ev_us, host_us, err, cap) != 0) goto out;
        times_set(&mt[fwd], ev_us, host_us, o->iters);
      }
      sum_us[m] = mt[0].med + mt[1].med;
      timed++;
      if (chosen < 0 || sum_us[m] < best) {
        chosen = m;
        best = sum_us[m];
        row->t[0] = mt[0];
        row->t[1] = mt[1];
      }
      continue;
    }
    cudnn_status_text(cu, st, text, sizeof text);
    size_t len = strlen(refused);
    if (len + 2 < sizeof refused)
      snprintf(refused + len, sizeof refused - len, "%s%s: %s", len ? "; " : "", kModeNames[m],
               text);
    const int cat = CUDNN_STATUS_CATEGORY((int)st);
    /* the fused ops' documented case (NHWC fp16): a bad parameter there is this bench's
       mistake, an error; elsewhere their support is narrow and cuDNN may refuse it as a bad
       parameter rather than as unsupported: a skipped row, as NOT_SUPPORTED is */
    const int fused = k.ops != CUDNN_BATCHNORM_OPS_BN;
    const int documented = fused && d.dtype == sbnFloat16 && d.layout == sbnLayoutNHWC;
    const int bad_param = cat == CUDNN_STATUS_BAD_PARAM && !documented;
    /* a refusal of one mode where the other may run (PERSISTENT first; SPATIAL after
       PERSISTENT ran: cuDNN documents the fused ops in PERSISTENT, and may refuse them in
       SPATIAL as a bad parameter, the documented case too) is noted; anything else is an
       error */
    const int refusal = cat == CUDNN_STATUS_NOT_SUPPORTED || bad_param ||
                        (chosen >= 0 && cat == CUDNN_STATUS_BAD_PARAM);
    const int other_mode = m == 0 || chosen >= 0;
    const int fused_refused = fused && bad_param;
    if (!(refusal && other_mode) && !fused_refused && !cudnn_not_supported(st)) {
      snprintf(err, cap, "cuDNN %s", refused);
      goto out;
    }
  }
  if (chosen < 0) {
    row->skipped = 1;
    snprintf(row->note, sizeof row->note, "not supported by cuDNN: %s: %s", kOpsNames[(int)k.ops],
             refused);
    goto out;
  }
  {
    char ver[32];
    format_cudnn_version(cu->info->version, ver, sizeof ver);
    snprintf(row->note, sizeof row->note,
             "cuDNN %s, %s, %s, one GPU, no sync; checked at 10x the library's tolerance, "
             "running stats not compared",
             ver, kModeNames[chosen], kOpsNames[(int)k.ops]);
    if (timed == 2) {
      char both[160];
      snprintf(both, sizeof both,
               "modes timed (forward + backward medians): %s %.1f us, %s %.1f us", kModeNames[0],
               sum_us[0], kModeNames[1], sum_us[1]);
      row_note_append(row, both);
    } else if (refused[0]) {
      row_note_append(row, "refused: ");
      size_t len = strlen(row->note);
      snprintf(row->note + len, sizeof row->note - len, "%s", refused);
    }
  }
  for (int fwd = 0; fwd < 2; fwd++) snprintf(row->kernel[fwd], sizeof row->kernel[fwd], "cudnn");
  if (chosen != 1) { /* the check run in the chosen mode (SPATIAL was prepared last) */
    k.mode = kModes[chosen];
    int pst = cudnn_prepare(&k, err, cap);
    if (pst < 0) goto out;
    if (pst != (int)CUDNN_STATUS_SUCCESS) {
      cudnn_status_text(cu, (cudnnStatus_t)pst, text, sizeof text);
      snprintf(err, cap, "cuDNN %s taken once, then refused: %s", kModeNames[chosen], text);
      goto out;
    }
  }

  /* The check run, as for the library's rows. */
  bufs_reset_state(&host);
  if (gpu_upload(&dev, &host, 0, g->stream, err, cap) != 0 ||
      gpu_poison(&dev, g->stream, err, cap) != 0)
    goto out;
  if (cudnn_op(&k, 1, err, cap) < 0 || cudnn_op(&k, 0, err, cap) < 0) goto out;
  GPU_TRY(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize (check run)");
  if (gpu_download(&host, &dev, g->stream, err, cap) != 0) goto out;
  check_row(row, &host, 1, o->check_channels, NULL, sbnGradGlobal, &kCheckCudnn);
  goto out;
fail:
out:
  if (k.xd) cu->DestroyTensorDescriptor(k.xd);
  if (k.bnd) cu->DestroyTensorDescriptor(k.bnd);
  if (k.act) cu->DestroyActivationDescriptor(k.act);
  if (k.ws) cudaFree(k.ws);
  if (k.reserve) cudaFree(k.reserve);
  if (err[0]) gpu_recover(g);
  gpu_bufs_free(&dev);
  free(samples);
#endif
}

#if SBN_BENCH_HAVE_CUDNN_H
/* cudnnBatchNormalizationForwardInference of one rank's device buffers. */
typedef struct {
  bench_cudnn_t* cu;
  cudnnTensorDescriptor_t xd, bnd;
  const bench_team_bufs_t* dev; /* one rank */
  double eps;
} bench_cudnn_infer_ctx_t;

static cudnnStatus_t cudnn_infer_call(const bench_cudnn_infer_ctx_t* k) {
  const float one = 1.0f, zero = 0.0f;
  const bench_team_bufs_t* b = k->dev;
  return k->cu->ForwardInference(k->cu->handle, CUDNN_BATCHNORM_SPATIAL, &one, &zero, k->xd, b->x[0], k->xd,
                                 b->y[0], k->bnd, b->weight, b->bias, b->rm[0], b->rv[0], k->eps);
}

static double cudnn_infer_op(void* ctx, int fwd, char* err, size_t cap) {
  (void)fwd;
  const bench_cudnn_infer_ctx_t* k = ctx;
  const double t0 = now_us();
  const cudnnStatus_t st = cudnn_infer_call(k);
  const double t = now_us() - t0;
  if (st != CUDNN_STATUS_SUCCESS) {
    char text[300];
    cudnn_status_text(k->cu, st, text, sizeof text);
    snprintf(err, cap, "cudnnBatchNormalizationForwardInference: %s", text);
    return -1;
  }
  return t;
}
#endif

/* One cuDNN inference row (W = 1): its own device buffers and descriptors; one untimed call
   (counted as warm-up) tells whether cuDNN takes the combination (a refusal: a skipped row);
   the timed calls, then the check run, as the coop inference row. */
void cudnn_infer_row(bench_row_t* row, bench_gpu_t* g, const bench_opts_t* o,
                     const bench_team_bufs_t* host_all, bench_cudnn_t* cu) {
  if (!cudnn_row_may_run(row, g, cu)) return;
#if !SBN_BENCH_HAVE_CUDNN_H
  (void)o;
  (void)host_all;
#else
  char* err = row->error;
  const size_t cap = sizeof row->error;
  if (!cu->ForwardInference) {
    row->skipped = 1;
    snprintf(row->note, sizeof row->note,
             "cuDNN not available: %.200s has no cudnnBatchNormalizationForwardInference", cu->info->from);
    return;
  }
  sbnTensorDesc_t d;
  cudnnDataType_t dt;
  int h, w;
  if (!cudnn_geometry(row, &d, &dt, &h, &w)) return;
  /* rank 0's host buffers of this input set, whose running statistics and y this row
     overwrites: its inference rows run after all its main rows (main.c) */
  bench_team_bufs_t host = *host_all;
  host.W = 1;
  bench_team_bufs_t dev;
  memset(&dev, 0, sizeof dev);
  bench_cudnn_infer_ctx_t k;
  memset(&k, 0, sizeof k);
  k.cu = cu;
  k.dev = &dev;
  const sbnParams_t params = SBN_PARAMS_DEFAULT;
  k.eps = (double)params.eps;
  char text[300];
  double* samples = malloc((size_t)o->iters * 2 * sizeof(double));
  if (!samples) {
    snprintf(err, cap, "out of host memory");
    goto out;
  }
  if (gpu_infer_setup(&dev, &host, &d, g->stream, err, cap) != 0) goto out;
  cudnnStatus_t st = cu->CreateTensorDescriptor(&k.xd);
  if (st == CUDNN_STATUS_SUCCESS) st = cu->CreateTensorDescriptor(&k.bnd);
  if (st != CUDNN_STATUS_SUCCESS) {
    cudnn_status_text(cu, st, text, sizeof text);
    snprintf(err, cap, "cudnnCreateTensorDescriptor: %s", text);
    goto out;
  }
  st = cu->SetTensor4dDescriptor(k.xd, d.layout == sbnLayoutNHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                 dt, (int)d.n, (int)d.c, h, w);
  if (st == CUDNN_STATUS_SUCCESS) st = cu->DeriveBNTensorDescriptor(k.bnd, k.xd, CUDNN_BATCHNORM_SPATIAL);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnn_infer_call(&k); /* the probe */
  if (st == CUDNN_STATUS_SUCCESS)
    GPU_TRY(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize (cuDNN probe)");
  if (st != CUDNN_STATUS_SUCCESS) {
    cudnn_status_text(cu, st, text, sizeof text);
    /* a refusal is a skipped row, as for the training rows: not supported, or a bad
       parameter outside fp32 NCHW (the case every cuDNN documents: a bad parameter there is
       this bench's mistake, an error) */
    const int basic = d.dtype == sbnFloat32 && d.layout == sbnLayoutNCHW;
    if (cudnn_not_supported(st) || (CUDNN_STATUS_CATEGORY((int)st) == CUDNN_STATUS_BAD_PARAM && !basic)) {
      row->skipped = 1;
      snprintf(row->note, sizeof row->note,
               "not supported by cuDNN: cudnnBatchNormalizationForwardInference, "
               "CUDNN_BATCHNORM_SPATIAL: %s",
               text);
    } else {
      snprintf(err, cap, "cuDNN inference (descriptors or the first call): %s", text);
    }
    goto out;
  }
  {
    char ver[32];
    format_cudnn_version(cu->info->version, ver, sizeof ver);
    snprintf(row->note, sizeof row->note,
             "cuDNN %s, cudnnBatchNormalizationForwardInference, CUDNN_BATCHNORM_SPATIAL; checked at "
             "10x the library's tolerance",
             ver);
  }
  double *ev_us = samples, *host_us = samples + o->iters;
  if (gpu_time_op(g, cudnn_infer_op, &k, 1, o, ev_us, host_us, err, cap) != 0) goto out;
  snprintf(row->kernel[1], sizeof row->kernel[1], "cudnn");
  row_set_times(row, 1, ev_us, host_us, o->iters);
  if (gpu_poison(&dev, g->stream, err, cap) != 0 || cudnn_infer_op(&k, 1, err, cap) < 0 ||
      gpu_download_infer(&host, &dev, g->stream, err, cap) != 0)
    goto out;
  check_inference(row, &host, o->check_channels, &kCheckCudnn);
  goto out;
fail:
out:
  if (k.xd) cu->DestroyTensorDescriptor(k.xd);
  if (k.bnd) cu->DestroyTensorDescriptor(k.bnd);
  if (err[0]) gpu_recover(g);
  gpu_bufs_free(&dev);
  free(samples);
#endif
}
