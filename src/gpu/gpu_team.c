/* gpu_team.c — GPU teams: device resources at init (no allocation inside ops), the
 * cooperative launches, error words, inference on device pointers.
 *
 * Resources of a team of W ranks, sized from the config's max_channels:
 *   per rank, on its device: the persistent state (epoch, barrier counter), the partials
 *   workspace, and the rank's mailbox (records [src][parity][chunk], written by every rank);
 *   per team: W + 1 error words in pinned, mapped host memory (the kernels write them, the
 *   host reads them without synchronizing; the last one is the host's abort).
 * Mailboxes live in device memory when every pair of distinct devices has peer access
 * (enabled here), otherwise all of them live in pinned, mapped host memory.
 */
#include "gpu/gpu.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#if SYNCBN_HAVE_CUDA

#include "gpu/gpu_internal.h"

int64_t sbn_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void sbn_nccl_abort_all(struct sbn_gpu_team* gt) {
#if SYNCBN_HAVE_NCCL
  if (gt->nccl == NULL || atomic_load(&gt->nccl_dead)) return;
  if (gt->err) gt->err[gt->nranks] = sbnAborted;
  if (gt->nccl_lock_ok) pthread_rwlock_wrlock(&gt->nccl_lock);
  if (!atomic_exchange(&gt->nccl_dead, 1))
    for (int q = 0; q < gt->nranks; q++)
      if (gt->nccl[q]) {
        ncclCommAbort(gt->nccl[q]);
        gt->nccl[q] = NULL;
      }
  if (gt->nccl_lock_ok) pthread_rwlock_unlock(&gt->nccl_lock);
#else
  (void)gt;
#endif
}

sbnResult_t sbn_cuda_fail(cudaError_t e, const char* what) {
  (void)cudaGetLastError(); /* clear a non-sticky error so later calls start clean */
  /* kernels built for other GPUs (CMAKE_CUDA_ARCHITECTURES), or PTX newer than the driver */
  const int no_image = e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidKernelImage ||
                       e == cudaErrorInvalidPtx || e == cudaErrorUnsupportedPtxVersion ||
                       e == cudaErrorJitCompilerNotFound;
  return sbn_fail(NULL, e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || no_image
                            ? sbnUnsupported
                            : sbnCudaError,
                  "%s: %s (%s)%s", what, cudaGetErrorName(e), cudaGetErrorString(e),
                  no_image ? "; syncbn's kernels were not built for this GPU or driver: rebuild "
                             "with CMAKE_CUDA_ARCHITECTURES naming its architecture (README)"
                           : "");
}

int sbn_gpu_rank_device(const sbn_team_t* team, int rank) {
  return team->gpu->ranks[rank].device;
}

/* Occupancy of every cooperative kernel on the current device; the onchip kernels get
   as many shared-memory batches per thread as one block per SM can have. */
sbnResult_t sbn_gpu_query_device(gpu_rank_t* g, int dev) {
  sbnResult_t r = sbnSuccess;
  int coop = 0, optin = 0;
  CU(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev), "cudaDeviceGetAttribute");
  if (!coop)
    return sbn_fail(NULL, sbnUnsupported, "device %d does not support cooperative launches", dev);
  CU(cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  CU(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
     "cudaDeviceGetAttribute");
  for (int k = 0; k < 2; k++)
    for (int d = 0; d < 3; d++)
      for (int t = 0; t < 2; t++)
        for (int v = 0; v < 2; v++)
          for (int var = 0; var < SBN_VAR_COUNT; var++) {
            int* occ = &g->occ[k][d][t][v][var];
            const void* fn = sbn_coop_kernel_ptr(k, d, t, v, var);
            *occ = 0;
            if (fn == NULL || (var == SBN_VAR_LEGACY && v)) continue; /* not built / the same */
            size_t dyn = 0;
            if (var == SBN_VAR_ONCHIP) {
              struct cudaFuncAttributes fa;
              CU(cudaFuncGetAttributes(&fa, fn), "cudaFuncGetAttributes");
              const int64_t per = sbn_hold_bytes(k, 1);
              int64_t slots = ((int64_t)optin - (int64_t)fa.sharedSizeBytes) / per;
              if (slots < 0) slots = 0;
              g->hold_slots[k][d][t] = (int)slots;
              dyn = (size_t)(slots * per);
              CU(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn),
                 "cudaFuncSetAttribute");
            }
            CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(occ, fn, SBN_GPU_THREADS, dyn),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
            if (*occ < 1)
              return sbn_fail(NULL, sbnUnsupported,
                              "device %d cannot hold a block of the cooperative kernel", dev);
            /* ranks sharing a GPU never run onchip (plan_round): occ_min is theirs */
            if (var != SBN_VAR_ONCHIP && (g->occ_min == 0 || *occ < g->occ_min)) g->occ_min = *occ;
            if (*occ > g->occ_max) g->occ_max = *occ;
          }
  /* Load every other kernel a team may launch now (the host path's stages, inference):
     a build without machine code for this GPU is compiled from PTX by the driver at load,
     and lazy loading loads a kernel at its first launch. Either belongs in init, not in
     an op whose peers wait for this rank under the comm's timeout. */
  for (int k = 0; k < 2; k++)
    for (int d = 0; d < 3; d++)
      for (int t = 0; t < 2; t++)
        for (int v = 0; v < 2; v++) {
          struct cudaFuncAttributes fa;
          for (int st = 0; st < SBN_HOST_STAGES; st++)
            CU(cudaFuncGetAttributes(&fa, sbn_host_kernel_ptr(st, k, d, t, v)), "cudaFuncGetAttributes");
          if (k == 0) CU(cudaFuncGetAttributes(&fa, sbn_infer_kernel_ptr(d, t, v)), "cudaFuncGetAttributes");
        }
out:
  return r;
}

void sbn_gpu_team_free(struct sbn_gpu_team* gt, int aborted) {
  if (gt == NULL) return;
  /* an aborted team's kernels may still wait for peers that will never come */
  if (aborted && gt->err) gt->err[gt->nranks] = sbnAborted;
  int prev = 0;
  cudaGetDevice(&prev);
  if (gt->watchdog_ok) {
    atomic_store(&gt->watchdog_stop, 1);
    pthread_join(gt->watchdog, NULL);
  }
#if SYNCBN_HAVE_NCCL
  if (gt->nccl != NULL) {
    /* a collective still waiting for a peer would never finish: abort instead of destroy */
    int stuck = aborted;
    for (int q = 0; q < gt->nranks && !stuck; q++)
      if (gt->ranks[q].present && atomic_load(&gt->ranks[q].launched_ns) != 0 &&
          cudaEventQuery(gt->ranks[q].ev_done) == cudaErrorNotReady)
        stuck = 1;
    (void)cudaGetLastError();
    if (stuck) sbn_nccl_abort_all(gt);
    aborted |= stuck;
  }
#endif
  if (gt->local >= 0) sbn_gpu_nccl_release(gt, aborted); /* NCCL team: window, comm */
#if SYNCBN_HAVE_NCCL
  if (gt->nccl != NULL && !atomic_load(&gt->nccl_dead)) {
    /* finalize every comm in one group (one thread for several ranks), then destroy */
    const int64_t deadline = sbn_mono_ns() + gt->timeout_ms * 1000000;
    ncclResult_t nr = ncclGroupStart();
    for (int q = 0; q < gt->nranks && nr == ncclSuccess; q++)
      if (gt->nccl[q]) nr = ncclCommFinalize(gt->nccl[q]);
    ncclResult_t ne = ncclGroupEnd();
    if (nr == ncclSuccess) nr = ne;
    if (nr == ncclInProgress) { /* every comm, not just the first to finish */
      nr = ncclSuccess;
      for (int q = 0; q < gt->nranks; q++) {
        if (!gt->nccl[q]) continue;
        ncclResult_t nq = sbn_nccl_settle(gt->nccl[q], ncclInProgress, deadline);
        if (nq != ncclSuccess && nr == ncclSuccess) nr = nq;
      }
    }
    if (nr != ncclSuccess) {
      sbn_nccl_abort_all(gt);
    } else {
      for (int q = 0; q < gt->nranks; q++)
        if (gt->nccl[q]) ncclCommDestroy(gt->nccl[q]);
    }
  }
  free(gt->nccl);
  gt->nccl = NULL;
#endif
  if (gt->nccl_lock_ok) pthread_rwlock_destroy(&gt->nccl_lock);
  for (int q = 0; gt->ranks && q < gt->nranks; q++) {
    gpu_rank_t* g = &gt->ranks[q];
    if (!g->present || cudaSetDevice(g->device) != cudaSuccess) continue;
    cudaDeviceSynchronize(); /* kernels of this team may still be in flight */
    if (g->ev) cudaEventDestroy(g->ev);
    if (g->ev_done) cudaEventDestroy(g->ev_done);
    cudaFree(g->state);
    cudaFree(g->part);
    cudaFree(g->send);
    cudaFree(g->recv);
    if (gt->local >= 0)
      ; /* NCCL team: the window's memory (released above) */
    else if (gt->mail_on_host)
      cudaFreeHost(g->mail);
    else
      cudaFree(g->mail);
  }
  if (gt->aux) cudaStreamDestroy(gt->aux);
  cudaFree(gt->dscratch);
  cudaFreeHost(gt->hscratch);
  if (gt->err) cudaFreeHost((void*)gt->err);
  cudaSetDevice(prev);
  (void)cudaGetLastError();
  free(gt->ranks);
  free(gt);
}

void sbn_gpu_team_detach(sbn_team_t* team) {
  sbn_gpu_team_free(team->gpu, atomic_load(&team->abort_reason) != sbnSuccess);
  team->gpu = NULL;
}

/* Peer access between every pair of distinct devices: 1 (enabled), 0 (some pair lacks it). */
static int enable_peers(const gpu_rank_t* ranks, int w) {
  for (int a = 0; a < w; a++)
    for (int b = 0; b < w; b++) {
      int da = ranks[a].device, db = ranks[b].device, ok = 0;
      if (da == db) continue;
      if (cudaDeviceCanAccessPeer(&ok, da, db) != cudaSuccess || !ok) {
        (void)cudaGetLastError();
        return 0;
      }
    }
  for (int a = 0; a < w; a++)
    for (int b = 0; b < w; b++) {
      int da = ranks[a].device, db = ranks[b].device;
      if (da == db || cudaSetDevice(da) != cudaSuccess) continue;
      cudaError_t e = cudaDeviceEnablePeerAccess(db, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();
        return 0;
      }
      (void)cudaGetLastError();
    }
  return 1;
}

/* The host path's NCCL comms for a team with one rank per GPU (NCCL refuses two ranks on
   one GPU). Their absence is not an error of the team (the coop path does not need
   them): a host-path op that needs them says why. */
static sbnResult_t nccl_attach(const sbn_team_t* team, struct sbn_gpu_team* gt) {
  const int w = gt->nranks;
  if (team->kind != SBN_COMM_GPU_PEER) {
    snprintf(gt->nccl_why, sizeof gt->nccl_why, "a virtual team has no NCCL comm");
    return sbnSuccess;
  }
  for (int a = 0; a < w; a++)
    for (int b = a + 1; b < w; b++)
      if (gt->ranks[a].device == gt->ranks[b].device) {
        snprintf(gt->nccl_why, sizeof gt->nccl_why,
                 "ranks %d and %d share device %d, and NCCL refuses two ranks on one GPU", a, b,
                 gt->ranks[a].device);
        return sbnSuccess;
      }
#if SYNCBN_HAVE_NCCL
  int devs[SBN_GPU_MAX_RANKS];
  for (int q = 0; q < w; q++) devs[q] = gt->ranks[q].device;
  gt->nccl = calloc((size_t)w, sizeof *gt->nccl);
  if (gt->nccl == NULL) return sbn_fail(NULL, sbnSystemError, "out of host memory (GPU team)");
  /* ncclCommInitAll's comms, but nonblocking: a collective waiting for a peer never blocks
     the host, so the watchdog can always abort it */
  ncclUniqueId id;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  const int64_t deadline = sbn_mono_ns() + gt->timeout_ms * 1000000;
  int prev = 0;
  cudaGetDevice(&prev);
  ncclResult_t nr = ncclGetUniqueId(&id);
  if (nr == ncclSuccess) {
    nr = ncclGroupStart();
    for (int q = 0; q < w && nr == ncclSuccess; q++)
      nr = cudaSetDevice(devs[q]) == cudaSuccess
               ? ncclCommInitRankConfig(&gt->nccl[q], w, id, q, &cfg)
               : ncclUnhandledCudaError;
    ncclResult_t ne = ncclGroupEnd();
    if (nr == ncclSuccess) nr = ne;
    for (int q = 0; q < w && (nr == ncclSuccess || nr == ncclInProgress); q++)
      if (gt->nccl[q]) nr = sbn_nccl_settle(gt->nccl[q], ncclInProgress, deadline);
  }
  cudaSetDevice(prev);
  if (nr != ncclSuccess) {
    snprintf(gt->nccl_why, sizeof gt->nccl_why,
             "NCCL comm init (ncclCommInitRankConfig x %d) failed: %s (%s)", w,
             nr == ncclInProgress ? "timed out" : ncclGetErrorString(nr), ncclGetLastError(NULL));
    for (int q = 0; q < w; q++)
      if (gt->nccl[q]) ncclCommAbort(gt->nccl[q]);
    free(gt->nccl);
    gt->nccl = NULL;
    sbn_log(SBN_LOG_WARN, "GPU team: %s; its SBN_ALGO=nccl ops will fail", gt->nccl_why);
  } else {
    return sbn_gpu_watchdog_start(gt);
  }
#else
  snprintf(gt->nccl_why, sizeof gt->nccl_why, "this build of syncbn has no NCCL (SYNCBN_NCCL)");
#endif
  return sbnSuccess;
}

sbnResult_t sbn_gpu_rank_alloc(struct sbn_gpu_team* gt, gpu_rank_t* g, int64_t max_channels,
                               int mail) {
  sbnResult_t r = sbnSuccess;
  const int w = gt->nranks;
  /* partial entries of a launch: at most max(G*32, C+32) (kernels/coop_plan.h: P*C) */
  size_t gmax = (size_t)g->occ_max * (size_t)g->sms;
  size_t entries = gmax * SBN_GPU_CHUNK > (size_t)max_channels + SBN_GPU_CHUNK
                       ? gmax * SBN_GPU_CHUNK
                       : (size_t)max_channels + SBN_GPU_CHUNK;
  size_t part_bytes = SBN_GPU_PART_FLOATS * entries * sizeof(float);
  size_t mail_bytes = (size_t)w * 2 * (size_t)gt->nchunks_max * sizeof(sbn_mail_rec_t);
  g->present = 1;
  CU(cudaMalloc((void**)&g->state, sizeof(sbn_rank_state_t)), "cudaMalloc (rank state)");
  CU(cudaMemset(g->state, 0, sizeof(sbn_rank_state_t)), "cudaMemset");
  CU(cudaMalloc((void**)&g->part, part_bytes), "cudaMalloc (workspace)");
  if (mail && gt->mail_on_host) {
    CU(cudaHostAlloc((void**)&g->mail, mail_bytes, cudaHostAllocPortable | cudaHostAllocMapped),
       "cudaHostAlloc (mailbox)");
    memset(g->mail, 0, mail_bytes);
  } else if (mail) {
    CU(cudaMalloc((void**)&g->mail, mail_bytes), "cudaMalloc (mailbox)");
    CU(cudaMemset(g->mail, 0, mail_bytes), "cudaMemset");
  }
  CU(cudaEventCreateWithFlags(&g->ev, cudaEventDisableTiming), "cudaEventCreate");
  CU(cudaEventCreateWithFlags(&g->ev_done, cudaEventDisableTiming), "cudaEventCreate");
  const size_t nrec = (size_t)gt->nchunks_max;
  CU(cudaMalloc((void**)&g->send, nrec * sizeof(sbn_mail_rec_t)), "cudaMalloc (host path)");
  CU(cudaMalloc((void**)&g->recv, (size_t)w * nrec * sizeof(sbn_mail_rec_t)),
     "cudaMalloc (host path)");
out:
  return r;
}

sbnResult_t sbn_gpu_team_attach(sbn_team_t* team, const int* devices) {
  const int w = team->nranks;
  sbnResult_t r = sbnSuccess;
  int prev = 0, ndev = 0;
  if (w > SBN_GPU_MAX_RANKS)
    return sbn_fail(NULL, sbnUnsupported, "GPU teams have at most %d ranks, got %d",
                    SBN_GPU_MAX_RANKS, w);
  cudaError_t e0 = cudaGetDeviceCount(&ndev);
  if (e0 != cudaSuccess || ndev == 0) {
    (void)cudaGetLastError();
    return sbn_fail(NULL, sbnUnsupported, "no usable CUDA device (%s)",
                    e0 != cudaSuccess ? cudaGetErrorString(e0) : "device count is 0");
  }
  for (int q = 0; q < w; q++) {
    int d = team->kind == SBN_COMM_GPU_VIRTUAL ? devices[0] : devices[q];
    if (d < 0 || d >= ndev)
      return sbn_fail(NULL, sbnInvalidArgument, "device %d does not exist (%d CUDA devices)", d,
                      ndev);
  }
  cudaGetDevice(&prev);
  struct sbn_gpu_team* gt = calloc(1, sizeof *gt);
  if (gt == NULL) return sbn_fail(NULL, sbnSystemError, "out of host memory (GPU team)");
  gt->nranks = w;
  gt->local = -1;
  gt->nchunks_max = (int)((team->cfg.max_channels + SBN_GPU_CHUNK - 1) / SBN_GPU_CHUNK);
  gt->ranks = calloc((size_t)w, sizeof *gt->ranks);
  if (gt->ranks == NULL) {
    r = sbn_fail(NULL, sbnSystemError, "out of host memory (GPU team)");
    goto out;
  }
  for (int q = 0; q < w; q++)
    gt->ranks[q].device = team->kind == SBN_COMM_GPU_VIRTUAL ? devices[0] : devices[q];
  for (int q = 0; q < w; q++) {
    gpu_rank_t* g = &gt->ranks[q];
    for (int o = 0; o < w; o++) g->share += gt->ranks[o].device == g->device;
    if (team->kind == SBN_COMM_GPU_VIRTUAL) g->share = 1; /* one launch holds every rank */
    CU(cudaSetDevice(g->device), "cudaSetDevice");
    r = sbn_gpu_query_device(g, g->device);
    if (r != sbnSuccess) goto out;
  }
  gt->mail_on_host = !enable_peers(gt->ranks, w);

  CU(cudaHostAlloc((void**)&gt->err, (size_t)(w + 1) * sizeof(int),
                   cudaHostAllocPortable | cudaHostAllocMapped),
     "cudaHostAlloc (error words)");
  memset((void*)gt->err, 0, (size_t)(w + 1) * sizeof(int));

  for (int q = 0; q < w; q++) {
    CU(cudaSetDevice(gt->ranks[q].device), "cudaSetDevice");
    r = sbn_gpu_rank_alloc(gt, &gt->ranks[q], team->cfg.max_channels, 1);
    if (r != sbnSuccess) goto out;
  }
  gt->timeout_ms = team->cfg.timeout_ms;
  r = nccl_attach(team, gt);
  if (r != sbnSuccess) goto out;
  for (int q = 0; q < w; q++) {
    CU(cudaSetDevice(gt->ranks[q].device), "cudaSetDevice");
    CU(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); /* the memsets are done */
  }
out:
  cudaSetDevice(prev);
  if (r != sbnSuccess) {
    sbn_gpu_team_free(gt, 0);
    return r;
  }
  team->gpu = gt;
  sbn_log(SBN_LOG_INFO, "GPU %s team %p of %d ranks on device %d%s, mailboxes in %s memory",
          team->kind == SBN_COMM_GPU_VIRTUAL ? "virtual" : "peer", (void*)team, w,
          gt->ranks[0].device, w > 1 && team->kind == SBN_COMM_GPU_PEER ? ",..." : "",
          gt->mail_on_host ? "pinned host" : "device");
  return sbnSuccess;
}

/* The host path's watchdog (NCCL comms only; the kernels' own waits are bounded
   in-kernel): a rank whose last op has not completed timeout_ms after its launch waits in
   a collective for a peer that does not come. The team's NCCL comms are aborted (the
   collective returns) and the rank's error word says sbnTimeout. It runs when the host
   polls: sbnCommGetAsyncError, and every op of the team. */
static void host_watchdog(struct sbn_gpu_team* gt) {
#if SYNCBN_HAVE_NCCL
  if (gt->nccl == NULL || atomic_load(&gt->nccl_dead)) return;
  const int64_t now = sbn_mono_ns();
  for (int q = 0; q < gt->nranks; q++) {
    gpu_rank_t* g = &gt->ranks[q];
    int64_t t0 = atomic_load(&g->launched_ns);
    if (t0 == 0) continue;
    cudaError_t e = cudaEventQuery(g->ev_done);
    if (e == cudaErrorNotReady) {
      /* the event may be a newer launch's than t0 (another thread's op since): only the
         launch t0 belongs to can time out */
      if (atomic_load(&g->launched_ns) != t0) continue;
      if (now - t0 > gt->timeout_ms * 1000000) {
        if (gt->err[q] == 0) gt->err[q] = sbnTimeout;
        sbn_nccl_abort_all(gt); /* sets the abort word first: queued APPLYs write nothing */
        return;
      }
    } else {
      (void)cudaGetLastError();
      /* done (a failure shows at the next launch); keep a newer launch's time */
      atomic_compare_exchange_strong(&g->launched_ns, &t0, 0);
    }
  }
#else
  (void)gt;
#endif
}

static void* watchdog_main(void* arg) {
  struct sbn_gpu_team* gt = arg;
  /* on one of the team's devices (a query on the default device 0 would make a context
     there in every process), and relaxed about captures: a query from here must not
     invalidate a CUDA graph another thread is capturing */
  for (int q = 0; q < gt->nranks; q++)
    if (gt->ranks[q].present) {
      cudaSetDevice(gt->ranks[q].device);
      break;
    }
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  (void)cudaGetLastError();
  while (!atomic_load(&gt->watchdog_stop)) {
    host_watchdog(gt);
    struct timespec ts = {0, 20 * 1000000L}; /* 20 ms: far below any sensible timeout */
    nanosleep(&ts, NULL);
  }
  return NULL;
}

sbnResult_t sbn_gpu_watchdog_start(struct sbn_gpu_team* gt) {
  if (pthread_rwlock_init(&gt->nccl_lock, NULL) != 0)
    return sbn_fail(NULL, sbnSystemError, "pthread_rwlock_init failed");
  gt->nccl_lock_ok = 1;
  if (pthread_create(&gt->watchdog, NULL, watchdog_main, gt) != 0)
    return sbn_fail(NULL, sbnSystemError, "could not start the host path's watchdog thread");
  gt->watchdog_ok = 1;
  return sbnSuccess;
}

sbnResult_t sbn_gpu_poll_error(const sbn_team_t* team) {
  struct sbn_gpu_team* gt = team->gpu;
  /* the watchdog thread aborts stuck collectives; polling only reads the error words, so it
     never blocks (and never queries events from a thread that may be capturing) */
  if (!gt->watchdog_ok) host_watchdog(gt);
  sbnResult_t worst = sbnSuccess;
  for (int q = 0; q <= gt->nranks; q++) {
    int v = gt->err[q];
    /* the cause (timeout, mismatch, count of 1) before the ranks it aborted */
    if (v != 0 && (worst == sbnSuccess || worst == sbnAborted)) worst = (sbnResult_t)v;
  }
  return worst;
}

sbnResult_t sbn_gpu_check_pointers(const sbn_op_t* op) {
  const struct sbn_gpu_team* gt = op->comm->team->gpu;
  const int dev = gt->ranks[op->comm->rank].device;
  const int fwd = op->kind == SBN_OP_FORWARD;
  const struct {
    const void* p;
    const char* name;
  } ps[] = {{op->x, "x"},
            {op->out, fwd ? "y" : "dx"},
            {fwd ? NULL : op->dy, "dy"},
            {op->weight, "weight"},
            {op->bias, "bias"},
            {op->running_mean, "running_mean"},
            {op->running_var, "running_var"},
            {op->num_batches_tracked, "num_batches_tracked"},
            {op->save_mean, "save_mean"},
            {op->save_invstd, "save_invstd"},
            {op->dweight, "dweight"},
            {op->dbias, "dbias"}};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
    if (ps[i].p == NULL) continue;
    struct cudaPointerAttributes at;
    memset(&at, 0, sizeof at);
    if (cudaPointerGetAttributes(&at, ps[i].p) != cudaSuccess) (void)cudaGetLastError();
    if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
      return sbn_fail(op->comm, sbnInvalidArgument,
                      "%s: %s (%p) is not device memory: a GPU team's tensors live on the "
                      "rank's device (%d)",
                      fwd ? "sbnForwardTrain" : "sbnBackward", ps[i].name, ps[i].p, dev);
    if (at.type == cudaMemoryTypeDevice && at.device != dev)
      return sbn_fail(op->comm, sbnInvalidArgument,
                      "%s: %s is memory of device %d, but this rank's device is %d",
                      fwd ? "sbnForwardTrain" : "sbnBackward", ps[i].name, at.device, dev);
  }
  return sbnSuccess;
}

const char* sbn_gpu_transport(const sbn_team_t* team) {
  const struct sbn_gpu_team* gt = team->gpu;
  switch (team->kind) {
    case SBN_COMM_GPU_VIRTUAL: return "virtual";
    case SBN_COMM_GPU_PEER: return gt->mail_on_host ? "peer-pinned-host" : "peer";
    case SBN_COMM_GPU_NCCL: return gt->lsa ? "nccl-lsa" : "nccl-host";
    default: return "cpu";
  }
}

int sbn_gpu_host_only(const sbn_team_t* team) {
  return team->kind == SBN_COMM_GPU_NCCL && !team->gpu->lsa;
}

void sbn_gpu_abort(sbn_team_t* team) {
  team->gpu->err[team->nranks] = sbnAborted;
  if (team->gpu->local >= 0) sbn_gpu_nccl_abort(team->gpu); /* the other processes */
}

/* ---- launches ------------------------------------------------------------------------- */

static uint32_t coop_sig(const sbn_op_t* op) {
  return (uint32_t)(op->kind == SBN_OP_FORWARD ? 0 : 1) << 28 | (uint32_t)op->desc.dtype << 26 |
         (uint32_t)op->desc.layout << 25 | (uint32_t)op->desc.c;
}

static int has_nccl(const struct sbn_gpu_team* gt) {
#if SYNCBN_HAVE_NCCL
  return gt->nccl != NULL;
#else
  (void)gt;
  return 0;
#endif
}

/* Every rank of the team, all on one device: the host path can run them without NCCL. */
static int one_device_round(const sbn_op_t* const* ops, int nops) {
  const struct sbn_gpu_team* gt = ops[0]->comm->team->gpu;
  if (nops != gt->nranks) return 0;
  for (int i = 1; i < nops; i++)
    if (gt->ranks[ops[i]->comm->rank].device != gt->ranks[ops[0]->comm->rank].device) return 0;
  return 1;
}

sbnResult_t sbn_gpu_check_round(const sbn_op_t* const* ops, int nops, int whole_team) {
  const sbn_op_t* o0 = ops[0];
  int64_t m = 0;
  for (int i = 0; i < nops; i++) {
    const sbn_op_t* o = ops[i];
    if (coop_sig(o) != coop_sig(o0))
      return sbn_fail(NULL, sbnInvalidUsage,
                      "sbnGroupEnd: op mismatch: rank %d runs %s (dtype %d, layout %d, C=%lld), "
                      "rank %d runs %s (dtype %d, layout %d, C=%lld); nothing was run",
                      o0->comm->rank, o0->kind == SBN_OP_FORWARD ? "forward" : "backward",
                      (int)o0->desc.dtype, (int)o0->desc.layout, (long long)o0->desc.c,
                      o->comm->rank, o->kind == SBN_OP_FORWARD ? "forward" : "backward",
                      (int)o->desc.dtype, (int)o->desc.layout, (long long)o->desc.c);
    if (o->algo != o0->algo)
      return sbn_fail(NULL, sbnInvalidUsage,
                      "sbnGroupEnd: rank %d's op runs SBN_ALGO=%s, rank %d's %s: the ranks of a "
                      "team must run the same path; nothing was run",
                      o0->comm->rank, o0->algo == SBN_ALGO_HOST ? "nccl" : "coop", o->comm->rank,
                      o->algo == SBN_ALGO_HOST ? "nccl" : "coop");
    m += o->desc.n * o->desc.spatial;
  }
  /* ranks of a peer team that share a GPU are separate launches that must run at the same
     time: on one stream (or the legacy NULL stream) the second waits for the first, which
     waits for the second until the timeout */
  const sbn_team_t* team = o0->comm->team;
  if (team->kind == SBN_COMM_GPU_PEER && o0->algo == SBN_ALGO_COOP)
    for (int i = 0; i < nops; i++)
      for (int j = i + 1; j < nops; j++) {
        const sbn_op_t *a = ops[i], *b = ops[j];
        if (team->gpu->ranks[a->comm->rank].device != team->gpu->ranks[b->comm->rank].device)
          continue;
        if (a->stream == NULL || b->stream == NULL || a->stream == b->stream)
          return sbn_fail(NULL, sbnInvalidUsage,
                          "sbnGroupEnd: ranks %d and %d share device %d and must run at the "
                          "same time: give each its own non-NULL stream; nothing was run",
                          a->comm->rank, b->comm->rank,
                          team->gpu->ranks[a->comm->rank].device);
      }
  /* the host path without NCCL comms runs a team's ranks together, on one device */
  if (o0->algo == SBN_ALGO_HOST && team->kind == SBN_COMM_GPU_PEER && team->nranks > 1 &&
      !has_nccl(team->gpu) && !(whole_team && one_device_round(ops, nops)))
    return sbn_fail(NULL, sbnInvalidUsage,
                    "SBN_ALGO=nccl: this team has no NCCL comm (%s), so its host path runs "
                    "only with every rank in one sbnGroupStart/sbnGroupEnd and all ranks on "
                    "one device; nothing was run",
                    team->gpu->nccl_why);
  if (whole_team && o0->kind == SBN_OP_FORWARD && m == 1)
    return sbn_fail(NULL, sbnInvalidArgument,
                    "Expected more than 1 value per channel when training (the team's batch "
                    "has 1 element per channel); nothing was run");
  return sbnSuccess;
}

/* The plan of a round: the kernel variant and width, G blocks per rank, the unit shape.
   Both paths use it, so the host path reduces in the same order as the cooperative
   kernel (the same bits). */
typedef struct {
  int G, tile, vec, variant, hold_slots;
} gpu_plan_t;

static int aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

static sbnResult_t plan_round(const sbn_op_t* const* ops, int nops, gpu_plan_t* pl) {
  const sbn_op_t* o0 = ops[0];
  const sbn_team_t* team = o0->comm->team;
  const struct sbn_gpu_team* gt = team->gpu;
  const gpu_rank_t* g0 = &gt->ranks[o0->comm->rank];
  const int kind = o0->kind == SBN_OP_FORWARD ? SBN_GPU_FWD : SBN_GPU_BWD;
  const int dt = o0->desc.dtype, V = sbn_vec_of(dt);
  int tile = o0->desc.layout == sbnLayoutNHWC;
  if (!tile) {
    tile = 1;
    for (int i = 0; i < nops; i++) tile &= ops[i]->desc.spatial == 1;
  }
  /* the 16-byte kernels: every tensor 16-byte aligned, and a shape they serve */
  int vec = 1;
  int64_t numel = 0;
  for (int i = 0; i < nops; i++) {
    const sbn_op_t* o = ops[i];
    vec &= aligned16(o->x) && aligned16(o->dy) && aligned16(o->out) &&
           sbn_vec_shape_ok(tile, o->desc.c, o->desc.spatial, dt);
    int64_t e = o->desc.n * o->desc.c * o->desc.spatial;
    if (e > numel) numel = e;
  }
  /* The host path runs the stream stages whatever SBN_KERNEL asks (it keeps the plan's G
     and width, so its bits are the coop kernel's). Ranks sharing a GPU are separate
     launches that must all be resident at once: they run stream, sized by the lowest
     occupancy of the non-onchip kernels, so that any mix (tile next to plane, forward
     next to a mismatched backward) fits side by side. */
  const int shared_gpu = team->kind == SBN_COMM_GPU_PEER && g0->share > 1;
  const int want = o0->algo == SBN_ALGO_HOST && o0->kernel == SBN_KERNEL_ONCHIP ? SBN_KERNEL_AUTO
                                                                                : o0->kernel;
  int var = want == SBN_KERNEL_LEGACY                           ? SBN_VAR_LEGACY
            : want == SBN_KERNEL_STREAM || !vec || shared_gpu ? SBN_VAR_STREAM
                                                                : SBN_VAR_ONCHIP;
  if (want == SBN_KERNEL_ONCHIP && var != SBN_VAR_ONCHIP)
    return sbn_fail(o0->comm, sbnUnsupported,
                    "SBN_KERNEL=onchip: %s; nothing was run",
                    shared_gpu ? "ranks sharing a GPU run the stream kernel"
                               : "the onchip kernel needs x, dy and y/dx 16-byte aligned and a "
                                 "shape of whole 16-byte vectors (NHWC: C a multiple of the "
                                 "vector width; NCHW: H*W a multiple of it, or at least 1024)");
  if (var == SBN_VAR_LEGACY) vec = 0;
  const int ranks_here = team->kind == SBN_COMM_GPU_VIRTUAL ? nops : g0->share;
  for (;;) {
    int occ = shared_gpu ? g0->occ_min : g0->occ[kind][dt][tile][vec][var];
    const int64_t gmax = (int64_t)occ * g0->sms / ranks_here;
    if (gmax < 1 && var == SBN_VAR_ONCHIP && want != SBN_KERNEL_ONCHIP) {
      var = SBN_VAR_STREAM; /* more ranks on the device than SMs: the stream kernel's 2 per SM */
      continue;
    }
    if (gmax < 1)
      return sbn_fail(o0->comm, sbnUnsupported,
                      "%d ranks on device %d: more than its %d co-resident blocks", ranks_here,
                      g0->device, occ * g0->sms);
    int64_t G;
    if (var == SBN_VAR_LEGACY) {
      G = (numel + SBN_LEGACY_ELEMS_PER_BLOCK - 1) / SBN_LEGACY_ELEMS_PER_BLOCK;
      G = G < 1 ? 1 : G > gmax ? gmax : G;
    } else {
      G = sbn_plan_blocks(numel, o0->desc.c, gmax);
    }
    pl->G = (int)G;
    pl->tile = tile;
    pl->vec = vec;
    pl->variant = var;
    pl->hold_slots = 0;
    if (var != SBN_VAR_ONCHIP) return sbnSuccess;
    pl->hold_slots = g0->hold_slots[kind][dt][tile];
    int fits = 1;
    int64_t need = 0;
    for (int i = 0; i < nops; i++) {
      const sbn_geo_t geo = sbn_geo_make(ops[i]->desc.n, ops[i]->desc.c, ops[i]->desc.spatial,
                                         tile, V, (int)G);
      fits &= sbn_onchip_fits(&geo, kind, dt, (int)G, pl->hold_slots);
      const int64_t b = sbn_thread_batches_bound(&geo, kind, (int)G);
      if (b > need) need = b;
    }
    if (fits) return sbnSuccess;
    if (want == SBN_KERNEL_ONCHIP)
      return sbn_fail(o0->comm, sbnUnsupported,
                      "SBN_KERNEL=onchip: the tensor does not fit on chip (%" PRId64
                      " batches per thread, %d held with %d blocks per rank); nothing was run",
                      need, SBN_HOLD_REG_BATCHES(dt, tile) + pl->hold_slots, (int)G);
    var = SBN_VAR_STREAM; /* auto: the stream kernel */
  }
}

/* sbnCommGetKernel's name of a plan. */
static const char* plan_kernel_name(const gpu_plan_t* pl) {
  if (pl->variant == SBN_VAR_ONCHIP) return "onchip";
  if (pl->variant == SBN_VAR_LEGACY) return "legacy";
  return pl->vec ? "stream" : "stream-scalar";
}

static void fill_args(sbn_coop_args_t* a, const sbn_op_t* const* ops, int nops,
                      const gpu_plan_t* pl) {
  const sbn_op_t* o0 = ops[0];
  const sbn_team_t* team = o0->comm->team;
  const struct sbn_gpu_team* gt = team->gpu;
  const int host = o0->algo == SBN_ALGO_HOST;
  memset(a, 0, sizeof *a);
  for (int i = 0; i < nops; i++) {
    const sbn_op_t* o = ops[i];
    const gpu_rank_t* g = &gt->ranks[o->comm->rank];
    sbn_coop_rank_t* R = &a->r[i];
    R->x = o->x;
    R->dy = o->dy;
    R->out = o->out;
    R->weight = o->weight;
    R->bias = o->bias;
    R->running_mean = o->running_mean;
    R->running_var = o->running_var;
    R->nbt = o->num_batches_tracked;
    R->save_mean_in = o->save_mean;
    R->save_mean = o->save_mean;
    R->save_invstd = o->save_invstd;
    R->dweight = o->dweight;
    R->dbias = o->dbias;
    R->n = o->desc.n;
    R->spatial = o->desc.spatial;
    R->state = g->state;
    R->part = g->part;
    R->mail = host ? g->recv : g->mail;
    R->send = g->send;
    R->rank = o->comm->rank;
    R->eps = o->params.eps;
    R->momentum = o->params.momentum;
    R->grad_global = o->params.grad_mode == sbnGradGlobal;
  }
  if (gt->local < 0) /* NCCL teams: the window (below), or the collective */
    for (int q = 0; q < gt->nranks; q++) a->mail[q] = host ? gt->ranks[q].send : gt->ranks[q].mail;
  if (gt->lsa) {
    a->win = gt->win;
    a->fail_off = sbn_window_fail_off(gt->nranks, gt->nchunks_max);
    a->fail = (uint32_t*)((char*)gt->win_buf + a->fail_off);
  }
  a->err = gt->err;
  a->c = o0->desc.c;
  a->timeout_ns = team->cfg.timeout_ms * 1000000; /* no overflow: clamped in config.c */
  a->sig = coop_sig(o0);
  a->nranks = gt->nranks;
  a->nlaunch = nops;
  a->G = pl->G;
  a->nchunks_max = gt->nchunks_max;
  a->hold_slots = pl->hold_slots;
  for (int i = 0; i < nops; i++)
    atomic_store(&ops[i]->comm->kernel, host ? "host" : plan_kernel_name(pl));
}

/* One launch of `fn` (cooperative or not) with the argument block. */
static cudaError_t launch(const void* fn, unsigned grid, int cooperative, size_t dyn,
                          sbn_coop_args_t* a, cudaStream_t stream) {
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute attr;
  void* args[1] = {a};
  memset(&cfg, 0, sizeof cfg);
  memset(&attr, 0, sizeof attr);
  cfg.gridDim.x = grid;
  cfg.gridDim.y = cfg.gridDim.z = 1;
  cfg.blockDim.x = SBN_GPU_THREADS;
  cfg.blockDim.y = cfg.blockDim.z = 1;
  cfg.stream = stream;
  cfg.dynamicSmemBytes = dyn;
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = cooperative ? 1 : 0;
  return cudaLaunchKernelExC(&cfg, fn, args);
}

/* The ranks of one device, issued together (a virtual team; the host path of ranks
   sharing a GPU): everything runs on the first op's stream, after the work queued on the
   others' streams, and their streams wait for it. stage < 0: the cooperative kernel. */
static sbnResult_t launch_one_device(const sbn_op_t* const* ops, int nops, sbn_coop_args_t* a,
                                     const gpu_plan_t* pl) {
  const sbn_op_t* o0 = ops[0];
  struct sbn_gpu_team* gt = o0->comm->team->gpu;
  const gpu_rank_t* g0 = &gt->ranks[o0->comm->rank];
  const int kind = o0->kind == SBN_OP_FORWARD ? SBN_GPU_FWD : SBN_GPU_BWD;
  const int dt = o0->desc.dtype;
  const unsigned G = (unsigned)a->G, nl = (unsigned)nops;
  sbnResult_t r = sbnSuccess;
  cudaStream_t s0 = (cudaStream_t)o0->stream;
  int joined = 0;
  for (int i = 1; i < nops; i++) {
    cudaStream_t si = (cudaStream_t)ops[i]->stream;
    if (si == s0) continue;
    cudaEvent_t ev = gt->ranks[ops[i]->comm->rank].ev;
    CU(cudaEventRecord(ev, si), "cudaEventRecord");
    CU(cudaStreamWaitEvent(s0, ev, 0), "cudaStreamWaitEvent");
    joined = 1;
  }
  const int tile = pl->tile, vec = pl->vec;
  if (o0->algo == SBN_ALGO_COOP) {
    const size_t dyn =
        pl->variant == SBN_VAR_ONCHIP ? (size_t)sbn_hold_bytes(kind, pl->hold_slots) : 0;
    CU(launch(sbn_coop_kernel_ptr(kind, dt, tile, vec, pl->variant), nl * G, 1, dyn, a, s0),
       "cooperative launch (cudaLaunchKernelExC)");
  } else {
    const unsigned nch = (unsigned)((o0->desc.c + SBN_GPU_CHUNK - 1) / SBN_GPU_CHUNK);
    CU(launch(sbn_host_kernel_ptr(SBN_HOST_STATS, kind, dt, tile, vec), nl * G, 0, 0, a, s0),
       "host path: stats kernel launch");
    CU(launch(sbn_host_kernel_ptr(SBN_HOST_PUBLISH, kind, dt, tile, vec), nl * nch, 0, 0, a, s0),
       "host path: publish kernel launch");
    if (gt->nranks > 1) { /* in place of ncclAllGather: NCCL cannot have 2 ranks on a GPU */
      CU(launch(sbn_host_kernel_ptr(SBN_HOST_GATHER, kind, dt, tile, vec),
                nl * (unsigned)gt->nranks, 0, 0, a, s0),
         "host path: gather kernel launch");
    } else {
      a->r[0].mail = a->r[0].send; /* a team of one: its own records */
    }
    CU(launch(sbn_host_kernel_ptr(SBN_HOST_APPLY, kind, dt, tile, vec), nl * G, 0, 0, a, s0),
       "host path: apply kernel launch");
  }
  if (joined) {
    CU(cudaEventRecord(g0->ev, s0), "cudaEventRecord");
    for (int i = 1; i < nops; i++) {
      cudaStream_t si = (cudaStream_t)ops[i]->stream;
      if (si != s0) CU(cudaStreamWaitEvent(si, g0->ev, 0), "cudaStreamWaitEvent");
    }
  }
out:
  return r;
}

/* The host path with NCCL (one rank per GPU; an NCCL team's one rank): per rank STATS and
   PUBLISH on its stream, ncclAllGather of the records (one NCCL group for the ranks
   issued here), per rank APPLY. Each rank has its own plan (G, tile), as its cooperative
   launch would: the same bits as the coop path, and a G within the rank's own device's
   workspace. The records are of max_channels, so ranks running different ops (thread
   mode) still make collectives of one size, and APPLY reports the mismatch. The comms
   are nonblocking: the group is issued under the read lock and waited for, bounded by
   the timeout; any failure once the group has started aborts the team's comms. */
static sbnResult_t launch_host_nccl(const sbn_op_t* const* ops, int nops) {
  sbnResult_t r = sbnSuccess;
#if SYNCBN_HAVE_NCCL
  struct sbn_gpu_team* gt = ops[0]->comm->team->gpu;
  const int kind = ops[0]->kind == SBN_OP_FORWARD ? SBN_GPU_FWD : SBN_GPU_BWD;
  const int dt = ops[0]->desc.dtype;
  const unsigned nch = (unsigned)((ops[0]->desc.c + SBN_GPU_CHUNK - 1) / SBN_GPU_CHUNK);
  static _Thread_local sbn_coop_args_t one; /* 2.7 KB: not on the stack */
  gpu_plan_t pl[SBN_GPU_MAX_RANKS];
  int locked = 0, started = 0;
  for (int i = 0; i < nops; i++) {
    r = plan_round(&ops[i], 1, &pl[i]);
    if (r != sbnSuccess) return r;
  }
  for (int i = 0; i < nops; i++) {
    const gpu_rank_t* g = &gt->ranks[ops[i]->comm->rank];
    cudaStream_t s = (cudaStream_t)ops[i]->stream;
    fill_args(&one, &ops[i], 1, &pl[i]);
    CU(cudaSetDevice(g->device), "cudaSetDevice");
    CU(launch(sbn_host_kernel_ptr(SBN_HOST_STATS, kind, dt, pl[i].tile, pl[i].vec),
              (unsigned)pl[i].G, 0, 0, &one, s),
       "host path: stats kernel launch");
    CU(launch(sbn_host_kernel_ptr(SBN_HOST_PUBLISH, kind, dt, pl[i].tile, pl[i].vec), nch, 0, 0,
              &one, s),
       "host path: publish kernel launch");
  }
  pthread_rwlock_rdlock(&gt->nccl_lock);
  locked = 1;
  if (atomic_load(&gt->nccl_dead)) {
    r = sbn_fail(NULL, sbnAborted, "the team's NCCL comms were aborted");
    goto out;
  }
  {
    const int64_t deadline = sbn_mono_ns() + gt->timeout_ms * 1000000;
    ncclResult_t nr = ncclGroupStart();
    started = 1;
    for (int i = 0; i < nops && nr == ncclSuccess; i++) {
      const int q = ops[i]->comm->rank;
      const gpu_rank_t* g = &gt->ranks[q];
      nr = ncclAllGather(g->send, g->recv, (size_t)gt->nchunks_max * sizeof(sbn_mail_rec_t),
                         ncclUint8, gt->nccl[q], (cudaStream_t)ops[i]->stream);
    }
    ncclResult_t ne = ncclGroupEnd();
    if (nr == ncclSuccess) nr = ne;
    /* nonblocking comms: the group may still be being issued, on every comm */
    if (nr == ncclInProgress) {
      nr = ncclSuccess;
      for (int i = 0; i < nops; i++) {
        ncclResult_t nq = sbn_nccl_settle(gt->nccl[ops[i]->comm->rank], ncclInProgress, deadline);
        if (nq != ncclSuccess && nr == ncclSuccess) nr = nq;
      }
    }
    if (nr != ncclSuccess) {
      r = sbn_fail(NULL, nr == ncclInProgress ? sbnTimeout : sbnNcclError,
                   "ncclAllGather of the records: %s (%s)",
                   nr == ncclInProgress ? "not issued within the timeout"
                                        : ncclGetErrorString(nr),
                   ncclGetLastError(gt->nccl[ops[0]->comm->rank]));
      goto out;
    }
  }
  pthread_rwlock_unlock(&gt->nccl_lock);
  locked = 0;
  for (int i = 0; i < nops; i++) {
    gpu_rank_t* g = &gt->ranks[ops[i]->comm->rank];
    cudaStream_t s = (cudaStream_t)ops[i]->stream;
    fill_args(&one, &ops[i], 1, &pl[i]);
    CU(cudaSetDevice(g->device), "cudaSetDevice");
    CU(launch(sbn_host_kernel_ptr(SBN_HOST_APPLY, kind, dt, pl[i].tile, pl[i].vec),
              (unsigned)pl[i].G, 0, 0, &one, s),
       "host path: apply kernel launch");
    /* the watchdog times this launch (not a graph capture: a captured event cannot be
       queried, and a replay is not watched) */
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CU(cudaStreamIsCapturing(s, &cs), "cudaStreamIsCapturing");
    if (cs == cudaStreamCaptureStatusNone) {
      atomic_store(&g->launched_ns, 0);
      CU(cudaEventRecord(g->ev_done, s), "cudaEventRecord");
      atomic_store(&g->launched_ns, sbn_mono_ns());
    }
  }
out:
  if (locked) pthread_rwlock_unlock(&gt->nccl_lock);
  /* collectives may be queued that wait for ranks which will not come: abort them */
  if (r != sbnSuccess && started) sbn_nccl_abort_all(gt);
#else
  (void)ops, (void)nops;
#endif
  return r;
}

sbnResult_t sbn_gpu_launch(const sbn_op_t* const* ops, int nops) {
  const sbn_op_t* o0 = ops[0];
  sbn_team_t* team = o0->comm->team;
  struct sbn_gpu_team* gt = team->gpu;
  const gpu_rank_t* g0 = &gt->ranks[o0->comm->rank];
  static _Thread_local sbn_coop_args_t a; /* 2.7 KB: not on the stack */
  gpu_plan_t pl;
  sbnResult_t r = sbnSuccess;

  int prev = 0;
  cudaGetDevice(&prev);
  if (o0->algo == SBN_ALGO_HOST && has_nccl(gt)) {
    r = launch_host_nccl(ops, nops); /* InitAll (a rank per GPU) or NCCL team: own plans */
  } else if (o0->algo == SBN_ALGO_HOST && team->kind == SBN_COMM_GPU_PEER && gt->nranks > 1 &&
             !one_device_round(ops, nops)) {
    r = sbn_fail(NULL, sbnInvalidUsage, "SBN_ALGO=nccl: %s", gt->nccl_why); /* checked before */
  } else {
    r = plan_round(ops, nops, &pl);
    if (r != sbnSuccess) {
      /* nothing launched, device unchanged; where the ranks launch separately the others
         may have launched already and would wait for this one: abort the team */
      if (team->kind != SBN_COMM_GPU_VIRTUAL && gt->nranks > 1) {
        sbn_team_abort(team, r);
        sbn_gpu_abort(team);
      }
      return r;
    }
    fill_args(&a, ops, nops, &pl);
    if (prev != g0->device) CU(cudaSetDevice(g0->device), "cudaSetDevice");
    r = launch_one_device(ops, nops, &a, &pl);
  }
out:
  cudaSetDevice(prev);
  if (r != sbnSuccess) {
    sbn_fail(o0->comm, r, "%s", sbnGetLastError(NULL));
    /* the team's other ranks may have launched already and would wait for this one until
       the timeout: abort the team (their kernels see the error word and return) */
    if (gt->nranks > 1) {
      sbn_team_abort(team, r);
      sbn_gpu_abort(team);
    }
  }
  return r;
}

/* The inference kernel (kernels/coop.cu): 16-byte vectors when x and y are 16-byte
   aligned (and, tile layouts, C a multiple of the vector width); at most 8 blocks per SM,
   each thread four positions at a time. */
static cudaError_t inference_launch(const sbnTensorDesc_t* d, const void* x, void* y,
                                    const float* weight, const float* bias, const float* rm,
                                    const float* rv, float eps, cudaStream_t stream) {
  const int64_t numel = d->n * d->c * d->spatial;
  if (numel == 0) return cudaSuccess;
  int dev = 0, sms = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  const int tile = d->layout == sbnLayoutNHWC || d->spatial == 1;
  const int V = sbn_vec_of(d->dtype);
  const int vec = aligned16(x) && aligned16(y) && (!tile || d->c % V == 0);
  sbn_infer_args_t a;
  memset(&a, 0, sizeof a);
  a.x = x, a.y = y, a.weight = weight, a.bias = bias, a.rm = rm, a.rv = rv, a.eps = eps;
  a.group = sbn_infer_group(d->spatial);
  a.n = d->n, a.c = d->c, a.sp = d->spatial;
  const int64_t per_block = tile ? (int64_t)SBN_GPU_THREADS * 4 * (vec ? V : 1)
                                 : (int64_t)(SBN_GPU_THREADS / a.group) * d->spatial;
  int64_t blocks = (numel + per_block - 1) / per_block;
  if (blocks > (int64_t)sms * 8) blocks = (int64_t)sms * 8;
  if (blocks < 1) blocks = 1;
  void* args[] = {(void*)&a};
  const dim3 grid = {(unsigned)blocks, 1, 1}, block = {SBN_GPU_THREADS, 1, 1};
  /* cudaLaunchKernel returns this launch's error, not an earlier one of the caller's */
  return cudaLaunchKernel(sbn_infer_kernel_ptr((int)d->dtype, tile, vec), grid, block, args, 0,
                          stream);
}

sbnResult_t sbn_gpu_inference(const sbnTensorDesc_t* d, const void* x, void* y,
                              const float* weight, const float* bias, const float* running_mean,
                              const float* running_var, float eps, sbnStream_t stream) {
  sbnResult_t r = sbnSuccess;
  struct cudaPointerAttributes at;
  int prev = 0, dev;
  cudaGetDevice(&prev);
  dev = prev;
  memset(&at, 0, sizeof at);
  if (cudaPointerGetAttributes(&at, running_mean) == cudaSuccess && at.type == cudaMemoryTypeDevice)
    dev = at.device;
  (void)cudaGetLastError();
  if (dev != prev) CU(cudaSetDevice(dev), "cudaSetDevice");
  CU(inference_launch(d, x, y, weight, bias, running_mean, running_var, eps,
                      (cudaStream_t)stream),
     "sbnForwardInference kernel launch");
out:
  if (dev != prev) cudaSetDevice(prev);
  return r;
}

#else /* !SYNCBN_HAVE_CUDA */

static sbnResult_t no_cuda(void) {
  return sbn_fail(NULL, sbnUnsupported, "this build of syncbn has no CUDA (SYNCBN_CUDA=OFF or "
                                        "no nvcc at configure time)");
}
sbnResult_t sbn_gpu_team_attach(sbn_team_t* team, const int* devices) {
  (void)team, (void)devices;
  return no_cuda();
}
void sbn_gpu_team_detach(sbn_team_t* team) { (void)team; }
int sbn_gpu_rank_device(const sbn_team_t* team, int rank) {
  (void)team, (void)rank;
  return 0;
}
sbnResult_t sbn_gpu_poll_error(const sbn_team_t* team) {
  (void)team;
  return sbnSuccess;
}
void sbn_gpu_abort(sbn_team_t* team) { (void)team; }
const char* sbn_gpu_transport(const sbn_team_t* team) {
  (void)team;
  return "cpu";
}
sbnResult_t sbn_gpu_check_pointers(const sbn_op_t* op) {
  (void)op;
  return no_cuda();
}
int sbn_gpu_host_only(const sbn_team_t* team) {
  (void)team;
  return 0;
}
sbnResult_t sbn_gpu_check_round(const sbn_op_t* const* ops, int nops, int whole_team) {
  (void)ops, (void)nops, (void)whole_team;
  return no_cuda();
}
sbnResult_t sbn_gpu_launch(const sbn_op_t* const* ops, int nops) {
  (void)ops, (void)nops;
  return no_cuda();
}
sbnResult_t sbn_gpu_inference(const sbnTensorDesc_t* d, const void* x, void* y,
                              const float* weight, const float* bias, const float* running_mean,
                              const float* running_var, float eps, sbnStream_t stream) {
  (void)d, (void)x, (void)y, (void)weight, (void)bias, (void)running_mean, (void)running_var;
  (void)eps, (void)stream;
  return no_cuda();
}

#endif
