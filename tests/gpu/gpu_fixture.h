/* gpu_fixture.h — the device side of the GPU team tests (test_gpu_team.c, test_nccl_team.c):
 * CUDA calls that fail the current test, the skip line without a device (gpu_skip.h), and
 * a team's device tensors mirroring a host team_t (team_util.h): allocated on each rank's
 * device, inputs and state uploaded, outputs poisoned, each rank's op on them, the outputs
 * downloaded into the mirror, the check that a refused op wrote nothing, freed. The
 * comparisons of the downloaded outputs are gpu_cmp.h's.
 *
 * Header-only, like team_util.h: harness.h's failure counters are static (one set per
 * test executable), and a failed CUDA call in here must fail the test that made it.
 * Includers define _POSIX_C_SOURCE 200809L first (clock_gettime, nanosleep).
 */
#ifndef SYNCBN_TESTS_GPU_FIXTURE_H_
#define SYNCBN_TESTS_GPU_FIXTURE_H_

#include <cuda_runtime_api.h>
#include <time.h>

#include "gpu_skip.h" /* gpu_skip_no_device, gpu_count_devices: the skip line and its reason */
#include "team_util.h"

/* ---- CUDA checks: a failed CUDA call fails the current test (it does not abort) ------ */
static inline int cuda_ok_(cudaError_t e, const char* expr, const char* file, int line) {
  if (e == cudaSuccess) return 1;
  fprintf(stderr, "%s:%d: FAILED: %s: %s (%s)\n", file, line, expr, cudaGetErrorName(e),
          cudaGetErrorString(e));
  sbn_test_failures_++;
  sbn_test_cur_failed_++;
  return 0;
}
/* CUDA_OK: an expression (1 = success) for helpers; CUDA_CHECK: returns on failure. */
#define CUDA_OK(call) cuda_ok_((call), #call, __FILE__, __LINE__)
#define CUDA_CHECK(call)        \
  do {                          \
    if (!CUDA_OK(call)) return; \
  } while (0)

static inline double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}
static inline void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- comms ------------------------------------------------------------------------ */
static inline sbnConfig_t config_ms(int64_t timeout_ms) {
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  cfg.timeout_ms = timeout_ms;
  return cfg;
}
/* A virtual team of W ranks on device dev; fails the test when refused. */
static inline int init_virtual(sbnComm_t* comms, int W, int dev, int64_t timeout_ms) {
  sbnConfig_t cfg = config_ms(timeout_ms);
  sbnResult_t r = sbnCommInitVirtual(comms, W, dev, &cfg);
  if (r != sbnSuccess) {
    SBN_FAIL_("sbnCommInitVirtual(%d ranks, device %d): %s (%s)", W, dev, sbnGetResultName(r),
              sbnGetLastError(NULL));
    return 0;
  }
  return 1;
}

/* ---- devices and streams ---------------------------------------------------------- */
/* The device the helpers below make current again after working on a rank's device: 0
   in a process that drives every GPU (test_gpu_team.c); a process that is one rank of an
   NCCL team sets its own GPU. */
static int g_home_device;

/* Non-blocking streams, one per rank, each on its rank's device. */
static inline void make_streams(cudaStream_t* st, int W, const int* dev) {
  for (int r = 0; r < W; r++) {
    st[r] = NULL;
    if (!CUDA_OK(cudaSetDevice(dev[r]))) return;
    if (!CUDA_OK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking))) return;
  }
  CUDA_OK(cudaSetDevice(g_home_device));
}
static inline void destroy_streams(cudaStream_t* st, int W) {
  for (int r = 0; r < W; r++)
    if (st[r]) cudaStreamDestroy(st[r]), st[r] = NULL;
}

/* Polls `s` until its work is done, calling sbnCommGetAsyncError(comm) meanwhile when comm
   is not NULL (as a user would: the host path's watchdog also runs when the host polls).
   No limit: the library's own bounds (the kernels' timeout, the watchdog) end the work,
   and a hang is CTest's (or the launcher's) timeout, not an assertion on the clock.
   Returns the ms since t0; *err: the stream's status. */
static inline double wait_stream_done(cudaStream_t s, sbnComm_t comm, double t0, cudaError_t* err) {
  for (;;) {
    cudaError_t e = cudaStreamQuery(s);
    if (e != cudaErrorNotReady) {
      *err = e;
      return now_ms() - t0;
    }
    sbnResult_t a = sbnSuccess;
    if (comm) (void)sbnCommGetAsyncError(comm, &a);
    sleep_ms(1);
  }
}

static inline void* dev_alloc(int dev, size_t bytes) {
  void* p = NULL;
  if (bytes == 0) return NULL;
  if (!CUDA_OK(cudaSetDevice(dev))) return NULL;
  if (!CUDA_OK(cudaMalloc(&p, bytes))) p = NULL;
  CUDA_OK(cudaSetDevice(g_home_device));
  return p;
}
static inline void h2d(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  if (bytes && dst && src) CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
}
static inline void d2h(void* dst, const void* src, size_t bytes) {
  if (bytes && dst && src) CUDA_OK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
/* The poison byte of every output before an op (0xff: a NaN in fp32, fp16 and bf16);
   gpu_cmp.h reports an output still holding it as never written (tests/gpu/unwritten.h). */
#define GPU_POISON 0xff
static inline void dpoison(void* p, size_t bytes, cudaStream_t s) {
  if (bytes && p) CUDA_OK(cudaMemsetAsync(p, GPU_POISON, bytes, s));
}

/* ---- device tensors of some ranks of a host mirror team_t ----------------------------- */
enum { OUT_FWD = 1, OUT_BWD = 2 }; /* which outputs: the forward's, the backward's */

static inline size_t chan_bytes(const team_t* h) {
  return (size_t)h->d[0].c * sizeof(float);
}

/* Slot s holds team rank rk[s] (its desc h->d[rk[s]]) on device dev[s], op'd through
   comm[s] on stream st[s]: every rank of a GPU team (slot r = rank r), or the one rank of
   an NCCL team a process drives. */
typedef struct {
  int ns;
  int rk[MAXW];
  sbnComm_t comm[MAXW];
  int dev[MAXW];
  cudaStream_t st[MAXW]; /* slot s's stream (NULL: the legacy default stream) */
  int own_streams;       /* st[] were made by dteam_make_own; dteam_free destroys them */
  void *x[MAXW], *y[MAXW], *dy[MAXW], *dx[MAXW]; /* NULL when the rank is empty */
  float *w[MAXW], *b[MAXW];                      /* NULL for affine=False */
  float *rm[MAXW], *rv[MAXW];                    /* NULL without running stats */
  int64_t* nbt[MAXW];
  float *sm[MAXW], *si[MAXW], *dw[MAXW], *db[MAXW];
} dteam_t;

/* Waits for every slot's stream. */
static inline void dteam_sync(dteam_t* d) {
  for (int s = 0; s < d->ns; s++) {
    if (!CUDA_OK(cudaSetDevice(d->dev[s]))) return;
    CUDA_OK(cudaStreamSynchronize(d->st[s]));
  }
  CUDA_OK(cudaSetDevice(g_home_device));
}

/* Running stats and num_batches_tracked from the host mirror (h->rm, h->rv, h->nbt). */
static inline void dteam_upload_state(dteam_t* d, const team_t* h) {
  for (int s = 0; s < d->ns; s++) {
    int r = d->rk[s];
    if (!CUDA_OK(cudaSetDevice(d->dev[s]))) return;
    if (h->running) {
      h2d(d->rm[s], h->rm[r], chan_bytes(h), d->st[s]);
      h2d(d->rv[s], h->rv[r], chan_bytes(h), d->st[s]);
    }
    h2d(d->nbt[s], &h->nbt[r], sizeof(int64_t), d->st[s]);
    /* pageable source: the copy is staged before cudaMemcpyAsync returns, but keep it
       simple and make the host value's lifetime irrelevant */
    CUDA_OK(cudaStreamSynchronize(d->st[s]));
  }
  CUDA_OK(cudaSetDevice(g_home_device));
}
/* x and dy from the host mirror's pristine copies, on each slot's stream, not waited for
   (so a virtual launch on rank 0's stream must be ordered after them). */
static inline void dteam_upload_inputs(dteam_t* d, const team_t* h) {
  for (int s = 0; s < d->ns; s++) {
    if (!CUDA_OK(cudaSetDevice(d->dev[s]))) return;
    h2d(d->x[s], h->x0[d->rk[s]], team_bytes(h, d->rk[s]), d->st[s]);
    h2d(d->dy[s], h->dy0[d->rk[s]], team_bytes(h, d->rk[s]), d->st[s]);
  }
  CUDA_OK(cudaSetDevice(g_home_device));
}
/* Poison (0xff: NaN) in the outputs of `what`, on each slot's stream, not waited for. */
static inline void dteam_poison(dteam_t* d, const team_t* h, int what) {
  size_t cb = chan_bytes(h);
  for (int s = 0; s < d->ns; s++) {
    size_t tb = team_bytes(h, d->rk[s]);
    if (!CUDA_OK(cudaSetDevice(d->dev[s]))) return;
    if (what & OUT_FWD) {
      dpoison(d->y[s], tb, d->st[s]);
      dpoison(d->sm[s], cb, d->st[s]);
      dpoison(d->si[s], cb, d->st[s]);
    }
    if (what & OUT_BWD) {
      dpoison(d->dx[s], tb, d->st[s]);
      dpoison(d->dw[s], cb, d->st[s]);
      dpoison(d->db[s], cb, d->st[s]);
    }
  }
  CUDA_OK(cudaSetDevice(g_home_device));
}

/* Device copies of ns ranks of host team h (slot s: rank rk[s], or rank s when rk is
   NULL; on device dev[s], op'd through comms[s] on stream st[s], the legacy default
   stream when st is NULL): inputs, parameters and running state uploaded, every output
   poisoned, all of it finished. Callers follow it with CHECK_(). */
static inline void dteam_make_slots(dteam_t* d, const team_t* h, int ns, const int* rk,
                                    const sbnComm_t* comms, const int* dev,
                                    const cudaStream_t* st) {
  memset(d, 0, sizeof *d);
  d->ns = ns;
  size_t cb = chan_bytes(h);
  for (int s = 0; s < ns; s++) {
    d->rk[s] = rk ? rk[s] : s;
    d->comm[s] = comms[s];
    d->dev[s] = dev[s];
    d->st[s] = st ? st[s] : NULL;
    size_t tb = team_bytes(h, d->rk[s]);
    d->x[s] = dev_alloc(dev[s], tb);
    d->y[s] = dev_alloc(dev[s], tb);
    d->dy[s] = dev_alloc(dev[s], tb);
    d->dx[s] = dev_alloc(dev[s], tb);
    if (h->w) {
      d->w[s] = (float*)dev_alloc(dev[s], cb);
      d->b[s] = (float*)dev_alloc(dev[s], cb);
    }
    if (h->running) {
      d->rm[s] = (float*)dev_alloc(dev[s], cb);
      d->rv[s] = (float*)dev_alloc(dev[s], cb);
    }
    d->nbt[s] = (int64_t*)dev_alloc(dev[s], sizeof(int64_t));
    d->sm[s] = (float*)dev_alloc(dev[s], cb);
    d->si[s] = (float*)dev_alloc(dev[s], cb);
    d->dw[s] = (float*)dev_alloc(dev[s], cb);
    d->db[s] = (float*)dev_alloc(dev[s], cb);
  }
  CHECK_();
  for (int s = 0; s < ns; s++) {
    if (!CUDA_OK(cudaSetDevice(dev[s]))) return;
    if (h->w) {
      h2d(d->w[s], h->w, cb, d->st[s]);
      h2d(d->b[s], h->b, cb, d->st[s]);
    }
  }
  dteam_upload_state(d, h);
  dteam_upload_inputs(d, h);
  dteam_poison(d, h, OUT_FWD | OUT_BWD);
  dteam_sync(d);
}
/* Every rank of h (slot r = rank r, on dev[r], stream st[r] or the legacy stream). */
static inline void dteam_make(dteam_t* d, const team_t* h, const sbnComm_t* comms, const int* dev,
                              const cudaStream_t* st) {
  dteam_make_slots(d, h, h->W, NULL, comms, dev, st);
}
/* ns ranks of h all on device dev, each slot on a non-blocking stream of its own that
   dteam_free destroys. */
static inline void dteam_make_own(dteam_t* d, const team_t* h, int ns, const int* rk,
                                  const sbnComm_t* comms, int dev) {
  int devs[MAXW];
  cudaStream_t st[MAXW] = {0};
  for (int s = 0; s < ns; s++) devs[s] = dev;
  make_streams(st, ns, devs);
  dteam_make_slots(d, h, ns, rk, comms, devs, st);
  d->own_streams = 1;
}

static inline void dteam_free(dteam_t* d) {
  /* cudaFree synchronizes the device: nothing of the team is in flight afterwards */
  for (int s = 0; s < d->ns; s++) {
    if (d->own_streams && d->st[s]) cudaStreamSynchronize(d->st[s]);
    void* ptrs[] = {d->x[s],  d->y[s],   d->dy[s], d->dx[s], d->w[s],  d->b[s], d->rm[s],
                    d->rv[s], d->nbt[s], d->sm[s], d->si[s], d->dw[s], d->db[s]};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
      if (ptrs[i]) cudaFree(ptrs[i]);
    if (d->own_streams && d->st[s]) cudaStreamDestroy(d->st[s]);
  }
  memset(d, 0, sizeof *d);
}

/* Slot s's op on the device tensors (team_util.h's rank_call for GPU teams). */
static inline sbnResult_t gpu_call(dteam_t* d, const team_t* h, int s, int bwd, int opts,
                                   const sbnParams_t* p) {
  const sbnTensorDesc_t* desc = &h->d[d->rk[s]];
  if (!bwd) {
    void* y = (opts & OPT_INPLACE) ? d->x[s] : d->y[s];
    return sbnForwardTrain(d->comm[s], desc, d->x[s], y, d->w[s], d->b[s], d->rm[s], d->rv[s],
                           h->nbt_null ? NULL : d->nbt[s], d->sm[s], d->si[s], p, d->st[s]);
  }
  void* dx = (opts & OPT_DX_NULL) ? NULL : (opts & OPT_INPLACE) ? d->dy[s] : d->dx[s];
  int nodw = opts & OPT_NO_DWDB;
  return sbnBackward(d->comm[s], desc, d->x[s], d->dy[s], dx, d->w[s], d->sm[s], d->si[s],
                     nodw ? NULL : d->dw[s], nodw ? NULL : d->db[s], p, d->st[s]);
}

/* Every slot's op inside one group, from this thread. Always closes the group. */
static inline sbnResult_t gpu_group(dteam_t* d, const team_t* h, int bwd, int opts,
                                    const sbnParams_t* p) {
  sbnResult_t res = sbnGroupStart();
  if (res != sbnSuccess) return res;
  for (int s = 0; s < d->ns; s++) {
    sbnResult_t e = gpu_call(d, h, s, bwd, opts, p);
    if (e != sbnSuccess && res == sbnSuccess) res = e;
  }
  sbnResult_t e = sbnGroupEnd();
  return res != sbnSuccess ? res : e;
}

/* After slot s's ops of `what` (OUT_FWD, OUT_BWD) finished: copies its outputs into the
   host mirror's rank rk[s] (those opts wrote: in place, no dx, no dweight/dbias) and
   restores its in-place inputs on its stream (the caller waits for that). */
static inline void dteam_download(dteam_t* d, team_t* h, int s, int what, int opts) {
  size_t cb = chan_bytes(h);
  int r = d->rk[s];
  size_t tb = team_bytes(h, r);
  if (what & OUT_FWD) {
    d2h(h->y[r], (opts & OPT_INPLACE) ? d->x[s] : d->y[s], tb);
    if (opts & OPT_INPLACE) h2d(d->x[s], h->x0[r], tb, d->st[s]);
    d2h(h->smean[r], d->sm[s], cb);
    d2h(h->sinv[r], d->si[s], cb);
    if (h->running) {
      d2h(h->rm[r], d->rm[s], cb);
      d2h(h->rv[r], d->rv[s], cb);
    }
    if (!h->nbt_null) d2h(&h->nbt[r], d->nbt[s], sizeof(int64_t));
  }
  if (what & OUT_BWD) {
    if (!(opts & OPT_DX_NULL)) {
      d2h(h->dx[r], (opts & OPT_INPLACE) ? d->dy[s] : d->dx[s], tb);
      if (opts & OPT_INPLACE) h2d(d->dy[s], h->dy0[r], tb, d->st[s]);
    }
    if (!(opts & OPT_NO_DWDB)) {
      d2h(h->dw[r], d->dw[s], cb);
      d2h(h->db[r], d->db[s], cb);
    }
  }
}

static inline int all_ff(const void* p, size_t n) {
  const unsigned char* c = (const unsigned char*)p;
  for (size_t i = 0; i < n; i++)
    if (c[i] != GPU_POISON) return 0;
  return 1;
}
/* A refused or failed op must leave slot s's outputs as they were: poison (0xff) in the
   outputs of `what` (OUT_FWD: y, save stats; OUT_BWD: dx, dweight, dbias); running stats
   and num_batches_tracked as h has them. `after` names the op in the failure messages. */
static inline void dteam_check_untouched_of(const dteam_t* d, const team_t* h, int s, int what,
                                            const char* after) {
  int r = d->rk[s];
  size_t cb = chan_bytes(h), tb = team_bytes(h, r);
  unsigned char* buf = (unsigned char*)malloc(tb + cb + 16);
  struct {
    const char* name;
    const void* p;
    size_t n;
    int what;
  } outs[] = {
      {"y", d->y[s], tb, OUT_FWD},
      {"save_mean", d->sm[s], cb, OUT_FWD},
      {"save_invstd", d->si[s], cb, OUT_FWD},
      {"dx", d->dx[s], tb, OUT_BWD},
      {"dweight", d->dw[s], cb, OUT_BWD},
      {"dbias", d->db[s], cb, OUT_BWD},
  };
  for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
    if (!outs[i].p || !outs[i].n || !(outs[i].what & what)) continue;
    d2h(buf, outs[i].p, outs[i].n);
    if (!all_ff(buf, outs[i].n)) SBN_FAIL_("rank %d: %s was written by %s", r, outs[i].name, after);
  }
  /* (a backward leaves the running state and num_batches_tracked alone: the forward's,
     downloaded into h, must still be there) */
  if (h->running) {
    d2h(buf, d->rm[s], cb);
    if (memcmp(buf, h->rm[r], cb)) SBN_FAIL_("rank %d: running_mean was written by %s", r, after);
    d2h(buf, d->rv[s], cb);
    if (memcmp(buf, h->rv[r], cb)) SBN_FAIL_("rank %d: running_var was written by %s", r, after);
  }
  int64_t nbt = -1;
  d2h(&nbt, d->nbt[s], sizeof nbt);
  if (nbt != h->nbt[r])
    SBN_FAIL_("rank %d: num_batches_tracked %" PRId64 " after %s, was %" PRId64, r, nbt, after,
              h->nbt[r]);
  free(buf);
}
/* Every output of slot s (y, save_mean, save_invstd, dx, dweight, dbias) still poisoned,
   and the running state and num_batches_tracked as h has them. */
static inline void dteam_check_untouched(const dteam_t* d, const team_t* h, int s,
                                         const char* after) {
  dteam_check_untouched_of(d, h, s, OUT_FWD | OUT_BWD, after);
}

#endif /* SYNCBN_TESTS_GPU_FIXTURE_H_ */
