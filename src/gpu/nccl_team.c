/* nccl_team.c — NCCL teams (sbnCommInitNccl): one rank per process, from the caller's NCCL
 * communicator.
 *
 * At init the team makes its own duplicate of the caller's comm (ncclCommSplit, nonblocking,
 * so every wait is bounded by the team's timeout) and agrees, with a 2-int ncclAllReduce,
 * on a transport that every rank can use:
 *   "nccl-lsa"  every rank is in one load/store-accessible (NVLink) domain and NCCL has the
 *               device API (>= 2.28): each rank's mailbox is its part of an NCCL symmetric
 *               window (ncclMemAlloc + ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC)),
 *               and the cooperative kernel pushes its records into the peers' parts through
 *               ncclGetPeerPointer: ONE kernel per op, as for in-process teams;
 *   "nccl-host" otherwise, or with SBN_NCCL_TRANSPORT=host: the host-driven path (stats,
 *               publish, ncclAllGather of the records, apply), the same bits.
 * NCCL's own device-side waits (ncclLsaBarrierSession, ncclLLA2ASession) spin without a
 * bound, so the kernel keeps its own epoch records and deadline; NCCL provides the memory,
 * its mapping into every peer, and the addressing.
 *
 * Failures cross processes through the window: a rank whose kernel fails writes its
 * failure word in every rank's part (kernels/coop.cu: push_failure), and the peers' waits
 * return sbnAborted at once; sbnCommAbort launches a one-thread kernel that does the same.
 * The host path has the watchdog of gpu_team.c (ncclCommAbort of the team's own comm).
 */
#include "gpu/gpu.h"

#include <stdlib.h>
#include <string.h>

#if SYNCBN_HAVE_CUDA && SYNCBN_HAVE_NCCL

#include "gpu/gpu_internal.h"

ncclResult_t sbn_nccl_settle(ncclComm_t comm, ncclResult_t r, int64_t deadline_ns) {
  while (r == ncclInProgress) {
    if (sbn_mono_ns() > deadline_ns) return ncclInProgress;
    struct timespec ts = {0, 100000}; /* 100 us */
    nanosleep(&ts, NULL);
    ncclResult_t async = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(comm, &async);
    r = q != ncclSuccess ? q : async;
  }
  return r;
}

static sbnResult_t nccl_fail(ncclComm_t comm, ncclResult_t nr, const char* what) {
  if (nr == ncclInProgress)
    return sbn_fail(NULL, sbnTimeout,
                    "%s did not complete within the timeout: some rank of the NCCL comm has not "
                    "made the same call",
                    what);
  return sbn_fail(NULL, sbnNcclError, "%s: %s (%s)", what, ncclGetErrorString(nr),
                  ncclGetLastError(comm));
}

void sbn_gpu_nccl_discard(struct ncclComm* nccl) {
  if (nccl != NULL) ncclCommAbort(nccl); /* local and immediate, unlike ncclCommDestroy */
}

sbnResult_t sbn_gpu_nccl_query(struct ncclComm* nccl, int* nranks, int* rank) {
  ncclResult_t nr = ncclCommCount(nccl, nranks);
  if (nr == ncclSuccess) nr = ncclCommUserRank(nccl, rank);
  if (nr != ncclSuccess)
    return sbn_fail(NULL, sbnNcclError, "sbnCommInitNccl: ncclCommCount/UserRank: %s",
                    ncclGetErrorString(nr));
  return sbnSuccess;
}

/* SBN_NCCL_TRANSPORT: 0 auto, 1 lsa (required), 2 host; -1 unknown (detail recorded). */
static int transport_from_env(void) {
  const char* v = getenv("SBN_NCCL_TRANSPORT");
  if (v == NULL || v[0] == '\0' || strcmp(v, "auto") == 0) return 0;
  if (strcmp(v, "lsa") == 0) return 1;
  if (strcmp(v, "host") == 0) return 2;
  sbn_fail(NULL, sbnInvalidArgument,
           "SBN_NCCL_TRANSPORT='%s': expected 'auto' (the default), 'lsa' or 'host'", v);
  return -1;
}

/* Element-wise min over the team of v[0..1] (bounded by the timeout). */
static sbnResult_t agree_min(struct sbn_gpu_team* gt, ncclComm_t comm, int v[2]) {
  sbnResult_t r = sbnSuccess;
  const int64_t deadline = sbn_mono_ns() + gt->timeout_ms * 1000000;
  gt->hscratch[0] = v[0];
  gt->hscratch[1] = v[1];
  CU(cudaMemcpyAsync(gt->dscratch, gt->hscratch, 2 * sizeof(int), cudaMemcpyHostToDevice, gt->aux),
     "cudaMemcpyAsync");
  ncclResult_t nr = ncclAllReduce(gt->dscratch, gt->dscratch, 2, ncclInt32, ncclMin, comm, gt->aux);
  nr = sbn_nccl_settle(comm, nr, deadline);
  if (nr != ncclSuccess) return nccl_fail(comm, nr, "sbnCommInitNccl: ncclAllReduce (transport)");
  CU(cudaMemcpyAsync(gt->hscratch, gt->dscratch, 2 * sizeof(int), cudaMemcpyDeviceToHost, gt->aux),
     "cudaMemcpyAsync");
  for (;;) { /* a peer that never comes: the collective does not finish */
    cudaError_t e = cudaStreamQuery(gt->aux);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) CU(e, "cudaStreamQuery");
    if (sbn_mono_ns() > deadline)
      return sbn_fail(NULL, sbnTimeout,
                      "sbnCommInitNccl: the team's ranks did not all arrive within %lld ms",
                      (long long)gt->timeout_ms);
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  v[0] = gt->hscratch[0];
  v[1] = gt->hscratch[1];
out:
  return r;
}

/* Why this rank cannot use the in-kernel transport (NULL: it can). */
static const char* lsa_obstacle(ncclComm_t comm, int nranks, char* buf, size_t n) {
#if SBN_NCCL_DEVICE_API
  int ver = 0;
  ncclGetVersion(&ver);
  if (ver < NCCL_VERSION(2, 28, 0)) {
    snprintf(buf, n, "the NCCL library is %d.%d.%d, the device API needs 2.28", ver / 10000,
             ver / 100 % 100, ver % 100);
    return buf;
  }
  const int lsa = sbn_nccl_lsa_size(comm);
  if (lsa != nranks) {
    snprintf(buf, n,
             "the team spans several NVLink (load/store) domains: %d of its %d ranks share "
             "this rank's; GIN (GPU-initiated networking) is not used by this version",
             lsa, nranks);
    return buf;
  }
  return NULL;
#else
  (void)comm, (void)nranks;
  snprintf(buf, n, "syncbn was built with NCCL %d.%d.%d headers, without the device API (2.28)",
           NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  return buf;
#endif
}

/* Allocates, zeroes and registers this rank's part of the window: 1 on success, 0 (with
   the reason in why) otherwise. Collective (ncclCommWindowRegister). */
static int window_open(struct sbn_gpu_team* gt, ncclComm_t comm, char* why, size_t n) {
#if SBN_NCCL_DEVICE_API
  gt->win_bytes = (size_t)sbn_window_bytes(gt->nranks, gt->nchunks_max);
  ncclResult_t nr = ncclMemAlloc(&gt->win_buf, gt->win_bytes);
  if (nr != ncclSuccess) {
    gt->win_buf = NULL;
    snprintf(why, n, "ncclMemAlloc(%zu): %s", gt->win_bytes, ncclGetErrorString(nr));
    return 0;
  }
  /* zero before registering: the peers write into it only after every rank's
     registration (collective) and the agreement after it */
  if (cudaMemset(gt->win_buf, 0, gt->win_bytes) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(why, n, "cudaMemset of the window failed");
    return 0;
  }
  ncclWindow_t w = NULL;
  nr = ncclCommWindowRegister(comm, gt->win_buf, gt->win_bytes, &w, NCCL_WIN_COLL_SYMMETRIC);
  nr = sbn_nccl_settle(comm, nr, sbn_mono_ns() + gt->timeout_ms * 1000000);
  if (nr != ncclSuccess || w == NULL) {
    snprintf(why, n, "ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC): %s (%s)",
             nr == ncclInProgress ? "timed out" : ncclGetErrorString(nr), ncclGetLastError(comm));
    return 0;
  }
  gt->win = w;
  return 1;
#else
  (void)gt, (void)comm;
  snprintf(why, n, "no NCCL device API in this build");
  return 0;
#endif
}

sbnResult_t sbn_gpu_team_attach_nccl(sbn_team_t* team, struct ncclComm* nccl, int adopt) {
  const int w = team->nranks, me = team->local_rank;
  sbnResult_t r = sbnSuccess;
  int prev = 0, dev = -1;
  const int mode = transport_from_env();
  if (mode < 0) {
    if (adopt) ncclCommAbort(nccl);
    return sbnInvalidArgument;
  }
  ncclResult_t nr = ncclCommCuDevice(nccl, &dev);
  if (nr != ncclSuccess) {
    if (adopt) ncclCommAbort(nccl);
    return sbn_fail(NULL, sbnNcclError, "ncclCommCuDevice: %s", ncclGetErrorString(nr));
  }
  cudaGetDevice(&prev);
  struct sbn_gpu_team* gt = calloc(1, sizeof *gt);
  if (gt == NULL) {
    if (adopt) ncclCommAbort(nccl);
    return sbn_fail(NULL, sbnSystemError, "out of host memory (NCCL team)");
  }
  gt->nranks = w;
  gt->local = me;
  gt->timeout_ms = team->cfg.timeout_ms;
  gt->nchunks_max = (int)((team->cfg.max_channels + SBN_GPU_CHUNK - 1) / SBN_GPU_CHUNK);
  gt->ranks = calloc((size_t)w, sizeof *gt->ranks);
  gt->nccl = calloc((size_t)w, sizeof *gt->nccl);
  if (gt->ranks == NULL || gt->nccl == NULL) {
    if (adopt) ncclCommAbort(nccl);
    r = sbn_fail(NULL, sbnSystemError, "out of host memory (NCCL team of %d ranks)", w);
    goto out;
  }
  if (adopt) gt->nccl[me] = nccl; /* a split made for this team (nonblocking already) */
  const int64_t deadline = sbn_mono_ns() + gt->timeout_ms * 1000000;
  CU(cudaSetDevice(dev), "cudaSetDevice (the NCCL comm's device)");
  if (!adopt) {
    /* the team's own comm: aborting it on a timeout leaves the caller's intact */
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t own = NULL;
    nr = ncclCommSplit(nccl, 0, me, &own, &cfg);
    if (nr == ncclInProgress && own != NULL) nr = sbn_nccl_settle(own, nr, deadline);
    if (nr != ncclSuccess) {
      if (own != NULL) ncclCommAbort(own);
      r = nccl_fail(nccl, nr, "sbnCommInitNccl: ncclCommSplit (the team's own comm)");
      goto out;
    }
    gt->nccl[me] = own;
  }
  ncclComm_t comm = gt->nccl[me];
  gpu_rank_t* g = &gt->ranks[me];
  g->device = dev;
  g->share = 1;
  r = sbn_gpu_query_device(g, dev);
  if (r != sbnSuccess) goto out;
  CU(cudaHostAlloc((void**)&gt->err, (size_t)(w + 1) * sizeof(int),
                   cudaHostAllocPortable | cudaHostAllocMapped),
     "cudaHostAlloc (error words)");
  memset((void*)gt->err, 0, (size_t)(w + 1) * sizeof(int));
  r = sbn_gpu_rank_alloc(gt, g, team->cfg.max_channels, 0);
  if (r != sbnSuccess) goto out;
  CU(cudaStreamCreateWithFlags(&gt->aux, cudaStreamNonBlocking), "cudaStreamCreate");
  CU(cudaMalloc((void**)&gt->dscratch, 2 * sizeof(int)), "cudaMalloc");
  CU(cudaHostAlloc((void**)&gt->hscratch, 2 * sizeof(int), cudaHostAllocPortable),
     "cudaHostAlloc");
  CU(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  /* the transport, agreed: every rank must make the same (collective) calls */
  char why[256];
  const char* obstacle = mode == 2 ? "SBN_NCCL_TRANSPORT=host" : lsa_obstacle(comm, w, why, sizeof why);
  int v[2] = {obstacle == NULL, mode == 1 ? -1 : 0}; /* min: all can; -max: one requires */
  r = agree_min(gt, comm, v);
  if (r != sbnSuccess) goto out;
  const int require = v[1] < 0;
  if (v[0]) {
    int ok[2] = {window_open(gt, comm, why, sizeof why), 0};
    r = agree_min(gt, comm, ok);
    if (r != sbnSuccess) goto out;
    gt->lsa = ok[0];
    if (!gt->lsa)
      obstacle = gt->win != NULL ? "the symmetric window failed on another rank" : why;
  } else if (obstacle == NULL) {
    obstacle = "another rank cannot use the in-kernel transport (see its SBN_DEBUG=INFO)";
  }
  if (!gt->lsa && require) {
    r = sbn_fail(NULL, sbnUnsupported,
                 "sbnCommInitNccl: SBN_NCCL_TRANSPORT=lsa, but the in-kernel transport is not "
                 "possible: %s",
                 obstacle);
    goto out;
  }
  if (gt->lsa) g->mail = (sbn_mail_rec_t*)gt->win_buf;
  snprintf(gt->nccl_why, sizeof gt->nccl_why, "%s", gt->lsa ? "" : obstacle);
  r = sbn_gpu_watchdog_start(gt); /* the host path's collectives, also SBN_ALGO=nccl calls */
out:
  cudaSetDevice(prev);
  if (r != sbnSuccess) {
    /* the peers may be inside a collective with this rank: abort, do not destroy */
    if (gt->nccl != NULL && gt->nccl[me] != NULL) {
      ncclCommAbort(gt->nccl[me]);
      gt->nccl[me] = NULL;
    }
    atomic_store(&gt->nccl_dead, 1);
    sbn_gpu_team_free(gt, 0);
    return r;
  }
  team->gpu = gt;
  if (gt->lsa)
    sbn_log(SBN_LOG_INFO,
            "NCCL team %p: rank %d of %d on device %d, transport nccl-lsa (one cooperative "
            "kernel per op, NCCL symmetric window of %zu bytes)",
            (void*)team, me, w, dev, gt->win_bytes);
  else
    sbn_log(SBN_LOG_INFO,
            "NCCL team %p: rank %d of %d on device %d, transport nccl-host (host-driven "
            "path: stats kernel, ncclAllGather, apply kernel) because %s",
            (void*)team, me, w, dev, gt->nccl_why);
  return sbnSuccess;
}

void sbn_gpu_nccl_release(struct sbn_gpu_team* gt, int aborted) {
  const int me = gt->local;
  ncclComm_t comm = gt->nccl != NULL ? gt->nccl[me] : NULL;
  const int dead = atomic_exchange(&gt->nccl_dead, 1);
  if (me >= 0 && gt->ranks != NULL && gt->ranks[me].present) {
    cudaSetDevice(gt->ranks[me].device);
    cudaDeviceSynchronize(); /* this rank's kernels are done (bounded by their deadlines) */
    (void)cudaGetLastError();
  }
  if (comm != NULL && !dead) {
    const int64_t deadline = sbn_mono_ns() + gt->timeout_ms * 1000000;
    ncclResult_t nr = ncclSuccess;
    /* an aborted team's peers may never make the collective calls below */
    if (!aborted && gt->win != NULL) {
#if SBN_NCCL_DEVICE_API
      nr = sbn_nccl_settle(comm, ncclCommWindowDeregister(comm, (ncclWindow_t)gt->win), deadline);
#endif
    }
    if (!aborted && nr == ncclSuccess) nr = sbn_nccl_settle(comm, ncclCommFinalize(comm), deadline);
    if (!aborted && nr == ncclSuccess)
      ncclCommDestroy(comm);
    else
      ncclCommAbort(comm);
  }
  if (gt->nccl != NULL) gt->nccl[me] = NULL;
  gt->win = NULL;
#if SBN_NCCL_DEVICE_API
  if (gt->win_buf != NULL) ncclMemFree(gt->win_buf);
#endif
  gt->win_buf = NULL;
  if (gt->ranks != NULL) gt->ranks[me].mail = NULL;
}

void sbn_gpu_nccl_abort(struct sbn_gpu_team* gt) {
  int prev = 0;
  cudaGetDevice(&prev);
#if SBN_NCCL_DEVICE_API
  /* the other processes' kernels waiting for this rank return now */
  if (gt->lsa && gt->win != NULL && cudaSetDevice(gt->ranks[gt->local].device) == cudaSuccess)
    sbn_gpu_notify_launch(gt->win, sbn_window_fail_off(gt->nranks, gt->nchunks_max), gt->local,
                          gt->nranks, sbnAborted, gt->aux);
#endif
  (void)cudaGetLastError();
  cudaSetDevice(prev);
  /* a collective of the host path waiting for a peer returns */
  if (!gt->lsa) sbn_nccl_abort_all(gt);
}

sbnResult_t sbn_gpu_nccl_split(sbnComm_t comm, int color, int key, sbnComm_t* newcomm) {
  struct sbn_gpu_team* gt = comm->team->gpu;
  pthread_rwlock_rdlock(&gt->nccl_lock); /* the comm is not aborted under the call */
  ncclComm_t parent = gt->nccl[gt->local];
  if (parent == NULL || atomic_load(&gt->nccl_dead)) {
    pthread_rwlock_unlock(&gt->nccl_lock);
    return sbn_fail(comm, sbnAborted, "sbnCommSplit: the team's NCCL comm was aborted");
  }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t child = NULL;
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(gt->ranks[gt->local].device);
  ncclResult_t nr =
      ncclCommSplit(parent, color == SBN_SPLIT_NOCOLOR ? NCCL_SPLIT_NOCOLOR : color, key, &child, &cfg);
  nr = sbn_nccl_settle(child != NULL ? child : parent, nr,
                       sbn_mono_ns() + gt->timeout_ms * 1000000);
  cudaSetDevice(prev);
  if (nr != ncclSuccess) {
    if (child != NULL) ncclCommAbort(child);
    sbnResult_t r = nccl_fail(parent, nr, "sbnCommSplit: ncclCommSplit");
    pthread_rwlock_unlock(&gt->nccl_lock);
    if (r == sbnTimeout) { /* the parent's ranks no longer agree on their calls */
      sbn_team_abort(comm->team, sbnTimeout);
      sbn_nccl_abort_all(gt);
    }
    return sbn_fail(comm, r, "%s", sbnGetLastError(NULL));
  }
  pthread_rwlock_unlock(&gt->nccl_lock);
  if (child == NULL) { /* SBN_SPLIT_NOCOLOR */
    *newcomm = NULL;
    return sbnSuccess;
  }
  sbnResult_t r = sbn_comm_create_nccl(child, 1, &comm->team->cfg, newcomm);
  if (r != sbnSuccess) return sbn_fail(comm, r, "sbnCommSplit: %s", sbnGetLastError(NULL));
  return sbnSuccess;
}

#else /* no CUDA or no NCCL in this build */

static sbnResult_t no_nccl(void) {
  return sbn_fail(NULL, sbnUnsupported,
                  "this build of syncbn has no NCCL (SYNCBN_NCCL=OFF, or no CUDA/NCCL at "
                  "configure time; SYNCBN_NCCL_ROOT points CMake at an NCCL)");
}
void sbn_gpu_nccl_discard(struct ncclComm* nccl) { (void)nccl; }
sbnResult_t sbn_gpu_nccl_query(struct ncclComm* nccl, int* nranks, int* rank) {
  (void)nccl, (void)nranks, (void)rank;
  return no_nccl();
}
sbnResult_t sbn_gpu_team_attach_nccl(sbn_team_t* team, struct ncclComm* nccl, int adopt) {
  (void)team, (void)nccl, (void)adopt;
  return no_nccl();
}
sbnResult_t sbn_gpu_nccl_split(sbnComm_t comm, int color, int key, sbnComm_t* newcomm) {
  (void)comm, (void)color, (void)key, (void)newcomm;
  return no_nccl();
}
#if SYNCBN_HAVE_CUDA
#include "gpu/gpu_internal.h"
void sbn_gpu_nccl_release(struct sbn_gpu_team* gt, int aborted) { (void)gt, (void)aborted; }
void sbn_gpu_nccl_abort(struct sbn_gpu_team* gt) { (void)gt; }
#endif

#endif
