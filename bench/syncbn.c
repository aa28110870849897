/* syncbn.c — the library's paths: the CPU team (CPU mode), and on virtual GPU teams the
 * cooperative kernel (coop) and the host-driven path (nccl, SBN_ALGO=nccl); with
 * --epilogue their fused ops (sbnForwardTrainEx / sbnBackwardEx, the in-place epilogues'
 * sbnBackwardInPlaceEx), and the split path: the plain coop op and act.cu's activation
 * kernel. Every call of a row goes through team_call: one group for the whole team. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "paths.h"

/* Records the first failure in err (empty until then); later ones are dropped. */
static void note_failure(char* err, size_t cap, const char* call, int rank, sbnResult_t res,
                         const char* detail) {
  if (err[0]) return;
  const size_t k = strlen(call); /* a detail that names the call already: once */
  if (strncmp(detail, call, k) == 0 && detail[k] == ':') detail += k + 1 + (detail[k + 1] == ' ');
  if (rank >= 0)
    snprintf(err, cap, "rank %d %s: %s: %s", rank, call, sbnGetResultName(res), detail);
  else
    snprintf(err, cap, "%s: %s: %s", call, sbnGetResultName(res), detail);
}

/* The ReLU rows' backward takes the activation's mask from x (sbnEpilogue_t.no_residual:
   their forward has no z), as a layer without a residual asks for it; SBN_BENCH_MASK=y at
   the run: from y (the A/B of bench/notes/fused-epilogue.md, "The mask from x"). */
static int mask_from_x(void) {
  const char* v = getenv("SBN_BENCH_MASK");
  return !(v != NULL && strcmp(v, "y") == 0);
}

/* Runs one forward (fwd != 0) or backward over the whole team as one group (b holds host
   pointers for the CPU team, device pointers for a GPU team; GPU ops are only queued on
   `stream`). Returns the wall time of the calls in us, or -1 with err set. */
static double team_call(sbnComm_t* comms, bench_team_bufs_t* b, int fwd, const sbnParams_t* p,
                        sbnStream_t stream, char* err, size_t cap) {
  const sbnTensorDesc_t* d = &b->desc;
  int failed = 0;
  double t0 = now_us();
  sbnResult_t res = sbnGroupStart();
  if (res != sbnSuccess) {
    note_failure(err, cap, "sbnGroupStart", -1, res, sbnGetLastError(NULL));
    return -1;
  }
  /* the fused ops: ReLU, and add-relu's z and dz; the in-place ones' leaky ReLU, and their
     backward from y (and z), x not given */
  const int inplace = epi_inplace(b->epilogue);
  sbnEpilogue_t epi = SBN_EPILOGUE_INITIALIZER;
  epi.activation = inplace ? sbnActivationLeakyRelu : sbnActivationRelu;
  epi.slope = BENCH_LEAKY_SLOPE;
  epi.no_residual = b->epilogue == BENCH_EPI_RELU && mask_from_x();
  const int ex = b->epilogue != BENCH_EPI_NONE;
  for (int r = 0; r < b->W; r++) {
    void* z = b->z ? b->z[r] : NULL;
    void* dz = epi_has_z(b->epilogue) ? b->dz[r] : NULL;
    const char* fn; /* the call made, for its failure */
    if (fwd && ex) {
      fn = "sbnForwardTrainEx";
      res = sbnForwardTrainEx(comms[r], d, b->x[r], z, b->y[r], b->weight, b->bias, b->rm[r],
                              b->rv[r], &b->nbt[r], b->save_mean[r], b->save_invstd[r], p, &epi,
                              stream);
    } else if (fwd) {
      fn = "sbnForwardTrain";
      res = sbnForwardTrain(comms[r], d, b->x[r], b->y[r], b->weight, b->bias, b->rm[r], b->rv[r],
                            &b->nbt[r], b->save_mean[r], b->save_invstd[r], p, stream);
    } else if (inplace && z) {
      fn = "sbnBackwardInPlaceEx";
      res = sbnBackwardInPlaceEx(comms[r], d, b->y[r], z, b->dy[r], b->dx[r], dz, b->weight,
                                 b->bias, b->save_mean[r], b->save_invstd[r], b->dweight[r],
                                 b->dbias[r], p, &epi, stream);
    } else if (ex) { /* the in-place backward without z: x NULL */
      fn = "sbnBackwardEx";
      res = sbnBackwardEx(comms[r], d, inplace ? NULL : b->x[r], b->y[r], b->dy[r], b->dx[r], dz,
                          b->weight, b->bias, b->save_mean[r], b->save_invstd[r], b->dweight[r],
                          b->dbias[r], p, &epi, stream);
    } else {
      fn = "sbnBackward";
      res = sbnBackward(comms[r], d, b->x[r], b->dy[r], b->dx[r], b->weight, b->save_mean[r],
                        b->save_invstd[r], b->dweight[r], b->dbias[r], p, stream);
    }
    if (res != sbnSuccess) {
      note_failure(err, cap, fn, r, res, sbnGetLastError(comms[r]));
      failed = 1;
    }
  }
  res = sbnGroupEnd();
  double t = now_us() - t0;
  if (res != sbnSuccess) {
    const char* detail = sbnGetLastError(NULL);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", detail);
    for (int r = 0; !buf[0] && r < b->W; r++)
      snprintf(buf, sizeof buf, "%s", sbnGetLastError(comms[r]));
    note_failure(err, cap, "sbnGroupEnd", -1, res, buf);
    failed = 1;
  }
  return failed ? -1 : t;
}

/* The kernel rank 0's latest op ran (sbnCommGetKernel), into row->kernel[fwd]. */
static void note_kernel(bench_row_t* row, sbnComm_t comm, int fwd) {
  const char* k = NULL;
  if (sbnCommGetKernel(comm, &k) != sbnSuccess || k == NULL) k = "?";
  snprintf(row->kernel[fwd], sizeof row->kernel[fwd], "%s", k);
}

/* A team's calls as a timed op (bench_op_fn). */
typedef struct {
  sbnComm_t* comms;
  bench_team_bufs_t* bufs; /* host pointers (CPU team) or device pointers (GPU team) */
  const sbnParams_t* params;
  sbnStream_t stream;
} bench_team_ctx_t;

static double team_op(void* ctx, int fwd, char* err, size_t cap) {
  bench_team_ctx_t* t = ctx;
  return team_call(t->comms, t->bufs, fwd, t->params, t->stream, err, cap);
}

/* A CPU-mode row's host buffers: W ranks of the row's tensor (with the epilogue's tensors),
   filled from the shape's id, and the samples of its timed calls ([o->iters]). The samples,
   or NULL with the row's error set and nothing left allocated. */
static double* cpu_row_bufs(bench_row_t* row, const bench_opts_t* o, int W, int epilogue,
                            bench_team_bufs_t* b) {
  const sbnTensorDesc_t d = row_desc(row);
  if (bufs_alloc(b, W, &d) != 0 || bufs_alloc_epilogue(b, epilogue) != 0) {
    snprintf(row->error, sizeof row->error,
             "out of memory for %d ranks of (%" PRId64 ", %" PRId64 ", %" PRId64 ")", W, d.n, d.c,
             d.spatial);
    return NULL;
  }
  double* times = malloc((size_t)o->iters * sizeof(double));
  if (!times || bufs_init(b, row->shape->id) != 0) {
    free(times);
    snprintf(row->error, sizeof row->error, "out of memory");
    bufs_free(b);
    return NULL;
  }
  return times;
}

void syncbn_cpu_row(bench_row_t* row, sbnComm_t* comms, const bench_opts_t* o,
                    bench_layout_keep_t* keep) {
  bench_team_bufs_t b;
  double* times = cpu_row_bufs(row, o, o->ranks, o->epilogue, &b);
  if (!times) return;
  const sbnParams_t params = SBN_PARAMS_DEFAULT;
  bench_team_ctx_t ctx = {comms, &b, &params, NULL};
  for (int fwd = 1; fwd >= 0; fwd--) {
    if (time_wall(team_op, &ctx, fwd, o, times, row->error, sizeof row->error) != 0) goto out;
    note_kernel(row, comms[0], fwd);
    row_set_times(row, fwd, times, times, o->iters);
  }
  check_row(row, &b, o->warmup + o->iters, o->check_channels, keep, params.grad_mode,
            &kCheckLibrary);
out:
  free(times);
  bufs_free(&b);
}

/* sbnForwardInference of rank 0's buffers as a timed op (bench_op_fn; no team, no group):
   host pointers (CPU mode) or device pointers on `stream`. */
typedef struct {
  const bench_team_bufs_t* bufs;
  float eps;
  sbnStream_t stream;
  int device; /* the buffers are device memory (copy_op copies with cudaMemcpyAsync) */
} bench_infer_ctx_t;

static double infer_op(void* ctx, int fwd, char* err, size_t cap) {
  (void)fwd;
  const bench_infer_ctx_t* k = ctx;
  const bench_team_bufs_t* b = k->bufs;
  const double t0 = now_us();
  const sbnResult_t res = sbnForwardInference(&b->desc, b->x[0], b->y[0], b->weight, b->bias, b->rm[0],
                                              b->rv[0], k->eps, k->stream);
  const double t = now_us() - t0;
  if (res != sbnSuccess) {
    note_failure(err, cap, "sbnForwardInference", -1, res, sbnGetLastError(NULL));
    return -1;
  }
  return t;
}

/* A copy of x into y on the inference row's buffers, timed as infer_op is (bench_op_fn): the
   target's measure, "a copy of x", with its own launch (GPU: cudaMemcpyAsync on `stream`;
   CPU mode: memcpy). */
static double copy_op(void* ctx, int fwd, char* err, size_t cap) {
  (void)fwd;
  const bench_infer_ctx_t* k = ctx;
  const bench_team_bufs_t* b = k->bufs;
  const size_t bytes = tensor_bytes(&b->desc);
  const double t0 = now_us();
#if SBN_BENCH_HAVE_CUDA
  if (k->device) {
    if (!bytes) return now_us() - t0;
    const cudaError_t e =
        cudaMemcpyAsync(b->y[0], b->x[0], bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)k->stream);
    if (e != cudaSuccess) {
      snprintf(err, cap, "cudaMemcpyAsync (a copy of x into y): %s", cudaGetErrorString(e));
      return -1;
    }
    return now_us() - t0;
  }
#else
  (void)err;
  (void)cap;
#endif
  if (bytes) memcpy(b->y[0], b->x[0], bytes);
  return now_us() - t0;
}

void syncbn_cpu_infer_row(bench_row_t* row, const bench_opts_t* o) {
  const sbnTensorDesc_t d = row_desc(row);
  bench_team_bufs_t b;
  double* times = cpu_row_bufs(row, o, 1, BENCH_EPI_NONE, &b);
  if (!times) return;
  infer_stats_fill(b.rm[0], b.rv[0], d.c);
  const sbnParams_t params = SBN_PARAMS_DEFAULT;
  bench_infer_ctx_t ctx = {&b, params.eps, NULL, 0};
  if (time_wall(infer_op, &ctx, 1, o, times, row->error, sizeof row->error) != 0) goto out;
  snprintf(row->kernel[1], sizeof row->kernel[1], "cpu");
  row_set_times(row, 1, times, times, o->iters);
  if (time_wall(copy_op, &ctx, 1, o, times, row->error, sizeof row->error) != 0) goto out;
  row_set_times(row, 0, times, times, o->iters);
  /* the check call: y poisoned (all-ones bits, NaN in every dtype) so that a value it does
     not write cannot pass */
  memset(b.y[0], 0xff, tensor_bytes(&d));
  if (infer_op(&ctx, 1, row->error, sizeof row->error) < 0) goto out;
  check_inference(row, &b, o->check_channels, &kCheckLibrary);
out:
  free(times);
  bufs_free(&b);
}

#if SBN_BENCH_HAVE_CUDA
int syncbn_gpu_probe(char* why, size_t cap) {
  sbnComm_t c = NULL;
  sbnResult_t res = sbnCommInitVirtual(&c, 1, 0, NULL);
  if (res == sbnSuccess) {
    sbnCommDestroy(c);
    return 1;
  }
  snprintf(why, cap, "sbnCommInitVirtual(1 rank, device 0): %s: %s", sbnGetResultName(res),
           sbnGetLastError(NULL));
  return res == sbnUnsupported ? 0 : -1;
}

/* sbnCommGetAsyncError of every rank, after the stream was synchronized. */
static int gpu_async_check(sbnComm_t* comms, int W, char* err, size_t cap) {
  for (int r = 0; r < W; r++) {
    sbnResult_t async = sbnSuccess;
    sbnResult_t res = sbnCommGetAsyncError(comms[r], &async);
    if (res != sbnSuccess) {
      note_failure(err, cap, "sbnCommGetAsyncError", r, res, sbnGetLastError(comms[r]));
      return -1;
    }
    if (async != sbnSuccess) {
      note_failure(err, cap, "async error (sbnCommGetAsyncError)", r, async,
                   sbnGetLastError(comms[r]));
      return -1;
    }
  }
  return 0;
}

/* The split path's calls (--epilogue, --paths split): the plain ops over the team and
   act.cu's kernel per rank on the stream: forward, the plain op then y = relu(y + z);
   backward, g = relu'(y) dy into dz first, then the plain backward with g for dy. The
   wall time of the calls in us, or -1 with err set. */
static double split_call(sbnComm_t* comms, bench_team_bufs_t* b, int fwd, const sbnParams_t* p,
                         sbnStream_t stream, char* err, size_t cap) {
  const sbnTensorDesc_t* d = &b->desc;
  const int64_t numel = d->n * d->c * d->spatial;
  bench_team_bufs_t plain = *b; /* the plain ops: no epilogue */
  plain.epilogue = BENCH_EPI_NONE;
  plain.z = NULL;
  plain.dz = NULL;
  double t0 = now_us();
  if (!fwd) {
    for (int r = 0; r < b->W; r++) {
      cudaError_t e = bench_act_backward((int)d->dtype, b->y[r], b->dy[r], b->dz[r], numel, (cudaStream_t)stream);
      if (e != cudaSuccess) {
        cuda_note(err, cap, "the split path's activation backward kernel", e);
        return -1;
      }
    }
    plain.dy = b->dz;
  }
  if (team_call(comms, &plain, fwd, p, stream, err, cap) < 0) return -1;
  if (fwd)
    for (int r = 0; r < b->W; r++) {
      cudaError_t e = bench_act_forward((int)d->dtype, b->y[r], b->z ? b->z[r] : NULL, numel, (cudaStream_t)stream);
      if (e != cudaSuccess) {
        cuda_note(err, cap, "the split path's activation forward kernel", e);
        return -1;
      }
    }
  return now_us() - t0;
}

static double split_op(void* ctx, int fwd, char* err, size_t cap) {
  bench_team_ctx_t* t = ctx;
  return split_call(t->comms, t->bufs, fwd, t->params, t->stream, err, cap);
}

static const char* const kNoteSplit =
    "split: the plain coop op, then the activation kernel of bench/act.cu (forward relu(y + z) in "
    "place; backward relu'(y) dy into dz, then the plain backward on it)";

static const char* const kNoteNcclVirtual =
    "nccl-path on a virtual team: stats kernel, publish kernel, gather kernel in place of "
    "ncclAllGather, apply kernel (NCCL refuses two ranks on one GPU)";
static const char* const kNoteNcclVirtual1 =
    "nccl-path at W = 1 on an sbnCommInitAll team of one GPU: stats kernel, publish kernel "
    "(where coop runs small: small's statistics kernel for both), ncclAllGather over the team's "
    "1-rank NCCL comm (as PyTorch with one rank), apply kernel";

/* SBN_ALGO for the library's calls of a row (the library reads it at every call). */
static int set_algo(int path, char* err, size_t cap) {
  if (setenv("SBN_ALGO", path == BENCH_PATH_NCCL ? "nccl" : "coop", 1) != 0) {
    snprintf(err, cap, "setenv(SBN_ALGO): %s", strerror(errno));
    return -1;
  }
  return 0;
}

/* One row of a library path (coop or nccl) on the device buffers `dev` of row->W ranks: a
   virtual team of its own, SBN_ALGO set for its calls, the timed forward and backward, then
   the check run (host: the inputs of ranks 0..W-1; the outputs are copied back there).
   dig_out: where to leave this row's digests (the coop row); dig_ref: the digests to compare
   with bitwise (the nccl row). */
static void gpu_run_path(bench_row_t* row, bench_gpu_t* g, const bench_opts_t* o,
                         bench_team_bufs_t* host, bench_team_bufs_t* dev, double* samples,
                         int64_t max_c, bench_digest_t* dig_out, const bench_digest_t* dig_ref) {
  char* err = row->error;
  const size_t cap = sizeof row->error;
  const int W = row->W;
  sbnComm_t comms[SBN_MAX_GPU_TEAM_RANKS];
  int ncomms = 0;
  memset(comms, 0, sizeof comms);
  if (row->path == BENCH_PATH_NCCL)
    snprintf(row->note, sizeof row->note, "%s", W > 1 ? kNoteNcclVirtual : kNoteNcclVirtual1);
  if (row->path == BENCH_PATH_SPLIT) snprintf(row->note, sizeof row->note, "%s", kNoteSplit);
  const bench_op_fn op = row->path == BENCH_PATH_SPLIT ? split_op : team_op;
  if (g->dead[0]) {
    snprintf(err, cap, "not run: %s", g->dead);
    return;
  }
  if (set_algo(row->path, err, cap) != 0) return;
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  if (max_c > cfg.max_channels) cfg.max_channels = max_c;
  cfg.timeout_ms = BENCH_GPU_TIMEOUT_MS;
  /* the nccl path at W = 1: a team of one GPU made by sbnCommInitAll has an NCCL comm,
     so the row includes a real (1-rank) ncclAllGather, as PyTorch's SyncBatchNorm does */
  const int initall = row->path == BENCH_PATH_NCCL && W == 1;
  sbnResult_t res = initall ? sbnCommInitAll(comms, 1, &g->info.index, &cfg)
                            : sbnCommInitVirtual(comms, W, g->info.index, &cfg);
  if (res != sbnSuccess) {
    note_failure(err, cap, initall ? "sbnCommInitAll" : "sbnCommInitVirtual", -1, res,
                 sbnGetLastError(NULL));
    goto out;
  }
  ncomms = W;
  bufs_reset_state(host);
  if (gpu_upload(dev, host, 0, g->stream, err, cap) != 0) goto out;

  sbnParams_t params = SBN_PARAMS_DEFAULT;
  params.grad_mode = sbnGradGlobal;
  bench_team_ctx_t ctx = {comms, dev, &params, g->stream};
  for (int fwd = 1; fwd >= 0; fwd--) {
    double *ev_us = samples, *host_us = samples + o->iters;
    if (gpu_time_op(g, op, &ctx, fwd, o, ev_us, host_us, err, cap) != 0 ||
        gpu_async_check(comms, W, err, cap) != 0)
      goto out;
    row_set_times(row, fwd, ev_us, host_us, o->iters);
    note_kernel(row, comms[0], fwd);
  }

  /* The check run: running stats (0, 1), poisoned outputs, the inputs as uploaded (a path
     that wrote into them fails the check); one forward and one backward; everything copied
     back and checked on the host. */
  bufs_reset_state(host);
  if (gpu_upload(dev, host, 0, g->stream, err, cap) != 0 ||
      gpu_poison(dev, g->stream, err, cap) != 0)
    goto out;
  if (op(&ctx, 1, err, cap) < 0 || op(&ctx, 0, err, cap) < 0) goto out;
  GPU_TRY(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize (check run)");
  if (gpu_async_check(comms, W, err, cap) != 0) goto out;
  if (gpu_download(host, dev, g->stream, err, cap) != 0) goto out;
  /* the nccl row: every output bitwise the coop row's (which the reference checked), or, when
     they differ or coop has no result, the reference check as well */
  const int64_t wrong_before = row->wrong;
  if (dig_ref && dig_ref->valid && dig_ref->W == W) {
    digest_compare(row, dig_ref, host);
    if (row->wrong == wrong_before) {
      row_note_append(row, "checked: every output bitwise the coop row's");
      /* the same bits: the coop row's distance to the reference (tol_used) is this row's */
      row->worst = dig_ref->worst;
      snprintf(row->worst_what, sizeof row->worst_what, "%s", dig_ref->worst_what);
    } else
      check_row(row, host, 1, o->check_channels, NULL, sbnGradGlobal, &kCheckLibrary);
  } else {
    if (dig_ref) row_note_append(row, "not compared bitwise with coop (the coop row has no result)");
    check_row(row, host, 1, o->check_channels, NULL, sbnGradGlobal, &kCheckLibrary);
  }
  if (dig_out && !row->error[0] && row->wrong == 0) { /* a coop row whose check passed: an
       nccl row with its bits is right; else the nccl row is checked on its own */
    digest_team(dig_out, host);
    dig_out->worst = row->worst;
    snprintf(dig_out->worst_what, sizeof dig_out->worst_what, "%s", row->worst_what);
  }
  goto out;
fail:
out:
  if (err[0]) gpu_recover(g);
  for (int r = 0; r < ncomms; r++) sbnCommDestroy(comms[r]);
}

void syncbn_gpu_rows(bench_row_t* const rows[BENCH_GPU_PATHS], bench_gpu_t* g, const bench_opts_t* o,
                     const bench_team_bufs_t* host_all, int64_t max_c) {
  const bench_row_t* r0 = NULL;
  for (int p = 0; p < BENCH_GPU_PATHS && !r0; p++) r0 = rows[p];
  if (!r0) return;
  const int W = r0->W;
  const sbnTensorDesc_t d = row_desc(r0);
  bench_team_bufs_t host = *host_all; /* a view of the first W ranks */
  host.W = W;
  bench_team_bufs_t dev;
  memset(&dev, 0, sizeof dev);
  bench_digest_t dig;
  memset(&dig, 0, sizeof dig);
  char err[384] = "";
  double* samples = malloc((size_t)o->iters * 2 * sizeof(double));
  if (g->dead[0])
    snprintf(err, sizeof err, "not run: %s", g->dead);
  else if (!samples)
    snprintf(err, sizeof err, "out of host memory");
  else if (gpu_bufs_alloc(&dev, W, &d, err, sizeof err) != 0 ||
           gpu_bufs_alloc_epilogue(&dev, host.epilogue, err, sizeof err) != 0 ||
           gpu_upload(&dev, &host, 1, g->stream, err, sizeof err) != 0)
    gpu_recover(g);
  for (int p = 0; p < BENCH_GPU_PATHS; p++) {
    if (!rows[p] || p == BENCH_PATH_CUDNN) continue;
    if (err[0])
      snprintf(rows[p]->error, sizeof rows[p]->error, "%s", err);
    else
      gpu_run_path(rows[p], g, o, &host, &dev, samples, max_c,
                   p == BENCH_PATH_COOP && rows[BENCH_PATH_NCCL] ? &dig : NULL,
                   p == BENCH_PATH_NCCL && rows[BENCH_PATH_COOP] ? &dig : NULL);
  }
  gpu_bufs_free(&dev);
  free(samples);
}
void syncbn_gpu_infer_row(bench_row_t* row, bench_gpu_t* g, const bench_opts_t* o,
                          const bench_team_bufs_t* host_all) {
  char* err = row->error;
  const size_t cap = sizeof row->error;
  const sbnTensorDesc_t d = row_desc(row);
  /* rank 0's host buffers of this input set, whose running statistics and y this row
     overwrites: its inference rows run after all its main rows (main.c) */
  bench_team_bufs_t host = *host_all;
  host.W = 1;
  bench_team_bufs_t dev;
  memset(&dev, 0, sizeof dev);
  double* samples = NULL;
  if (g->dead[0]) {
    snprintf(err, cap, "not run: %s", g->dead);
    return;
  }
  samples = malloc((size_t)o->iters * 2 * sizeof(double));
  if (!samples) {
    snprintf(err, cap, "out of host memory");
    goto out;
  }
  if (gpu_infer_setup(&dev, &host, &d, g->stream, err, cap) != 0) goto out;
  const sbnParams_t params = SBN_PARAMS_DEFAULT;
  bench_infer_ctx_t ctx = {&dev, params.eps, g->stream, 1};
  double *ev_us = samples, *host_us = samples + o->iters;
  if (gpu_time_op(g, infer_op, &ctx, 1, o, ev_us, host_us, err, cap) != 0) goto out;
  row_set_times(row, 1, ev_us, host_us, o->iters);
  snprintf(row->kernel[1], sizeof row->kernel[1], "infer");
  if (gpu_time_op(g, copy_op, &ctx, 1, o, ev_us, host_us, err, cap) != 0) goto out;
  row_set_times(row, 0, ev_us, host_us, o->iters);
  /* the check run: y poisoned, one call, y and the running statistics (read only: not
     uploaded again, so a write into them by any call shows) copied back */
  if (gpu_poison(&dev, g->stream, err, cap) != 0 || infer_op(&ctx, 1, err, cap) < 0 ||
      gpu_download_infer(&host, &dev, g->stream, err, cap) != 0)
    goto out;
  check_inference(row, &host, o->check_channels, &kCheckLibrary);
out:
  if (err[0]) gpu_recover(g);
  gpu_bufs_free(&dev);
  free(samples);
}
#endif /* SBN_BENCH_HAVE_CUDA */
