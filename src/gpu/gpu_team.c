/* gpu_team.c — GPU teams: device resources at init (no allocation inside ops), error
 * words, the host path's watchdog, abort, split, and the tables of the in-process teams
 * (virtual ranks on one GPU; one rank per GPU). Launches are gpu_launch.c's; the clock,
 * CUDA failures and the host's abort (stop words, NCCL comms) gpu_util.c's.
 *
 * Resources of a team of W ranks, sized from the config's max_channels:
 *   per rank, on its device: the persistent state (epoch, barrier counter), the partials
 *   workspace, and the rank's mailbox (records [src][parity][chunk], written by every rank);
 *   per team: W + 1 error words in pinned, mapped host memory (the kernels write them when
 *   they fail, the host reads them without synchronizing; the last one is the host's
 *   abort, which reaches the kernels through each rank's stop word: sbn_gpu_stop_ranks).
 * Mailboxes live in device memory when every pair of distinct devices has peer access
 * (enabled here), otherwise all of them live in pinned, mapped host memory.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/cuda_reason.h"
#include "gpu/gpu_internal.h"

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
  for (int e = 0; e < SBN_EPI_KINDS; e++)
    for (int k = 0; k < SBN_OP_KINDS; k++)
      for (int d = 0; d < SBN_DTYPE_COUNT; d++)
        for (int t = 0; t < 2; t++)
          for (int v = 0; v < 2; v++)
            for (int var = 0; var < SBN_VAR_COUNT; var++) {
              int* occ = &g->occ[e][k][d][t][v][var];
              const void* fn = sbn_coop_kernel_ptr(k, d, t, v, var, e);
              *occ = 0;
              if (fn == NULL) continue; /* not built */
              size_t dyn = 0;
              if (var == SBN_VAR_ONCHIP) {
                struct cudaFuncAttributes fa;
                CU(cudaFuncGetAttributes(&fa, fn), "cudaFuncGetAttributes");
                const int64_t per = sbn_hold_bytes(k, 1);
                int64_t slots = ((int64_t)optin - (int64_t)fa.sharedSizeBytes) / per;
                if (slots < 0) slots = 0;
                g->hold_slots[e][k][d][t] = (int)slots;
                dyn = (size_t)(slots * per);
                CU(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn),
                   "cudaFuncSetAttribute");
              }
              CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(occ, fn, SBN_GPU_THREADS, dyn),
                 "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
              if (*occ < 1)
                return sbn_fail(NULL, sbnUnsupported,
                                "device %d cannot hold a block of the cooperative kernel", dev);
              /* ranks sharing a GPU run stream only (plan_round): occ_min is theirs, the
                 lowest of every kind's, so that a rank's G does not hang on its own op's
                 epilogue, which the host path plans from the round's (the same bits) */
              if (var == SBN_VAR_STREAM && (g->occ_min == 0 || *occ < g->occ_min))
                g->occ_min = *occ;
              /* (the small kernels use no workspace: not sized by them) */
              if (!SBN_VAR_IS_SMALL(var) && *occ > g->occ_max) g->occ_max = *occ;
            }
  /* Load every other kernel a team may launch now (the host path's stages, inference):
     a build without machine code for this GPU is compiled from PTX by the driver at load,
     and lazy loading loads a kernel at its first launch. Either belongs in init, not in
     an op whose peers wait for this rank under the comm's timeout. */
  for (int e = 0; e < SBN_EPI_KINDS; e++)
    for (int k = 0; k < SBN_OP_KINDS; k++)
      for (int d = 0; d < SBN_DTYPE_COUNT; d++)
        for (int t = 0; t < 2; t++)
          for (int v = 0; v < 2; v++) {
            struct cudaFuncAttributes fa;
            for (int st = 0; st < SBN_HOST_STAGES; st++) {
              const void* fn = sbn_host_kernel_ptr(st, k, d, t, v, e);
              if (fn == NULL && st == SBN_HOST_SMALL_STATS) continue; /* not built: never planned */
              CU(cudaFuncGetAttributes(&fa, fn), "cudaFuncGetAttributes");
            }
            if (k == 0 && t == 0 && e < 2) /* inference's kernels (SBN_INFER_*; the scalar flat one
                                              is not built) */
              for (int ik = 0; ik < SBN_INFER_KINDS; ik++) {
                const void* fn = sbn_infer_kernel_ptr(d, ik, v, e);
                if (fn != NULL) CU(cudaFuncGetAttributes(&fa, fn), "cudaFuncGetAttributes");
              }
          }
out:
  return r;
}

/* sbn_gpu_stop_ranks in the release: its wait for the stop words is bounded by the team's
   stop deadline, so the destroy waits that out (sbn_gpu_release_budget); an
   sbn_nccl_abort_all after it finds them sent and does not wait again. */
static void stop_ranks_in_release(struct sbn_gpu_team* gt) {
  sbn_gpu_release_budget(gt, sbn_gpu_stop_deadline(gt));
  sbn_gpu_stop_ranks(gt);
  sbn_gpu_release_budget(gt, sbn_mono_ns());
}

void sbn_gpu_team_free(struct sbn_gpu_team* gt, int aborted,
                       void (*release)(struct sbn_gpu_team* gt, int aborted)) {
  if (gt == NULL) return;
  const enum cudaStreamCaptureMode mode = sbn_capture_relaxed();
  /* an aborted team's kernels may still wait for peers that will never come */
  if (aborted) stop_ranks_in_release(gt);
  int prev = 0;
  cudaGetDevice(&prev);
  if (gt->watchdog_ok) {
    atomic_store(&gt->watchdog_stop, 1);
    pthread_join(gt->watchdog, NULL);
  }
#if SYNCBN_HAVE_NCCL
  if (gt->nccl != NULL) {
    /* a collective still waiting for a peer would never finish: abort instead of destroy */
    const int stuck = sbn_gpu_host_pending(gt);
    if (sbn_gpu_abort_comms_now(gt, aborted, stuck)) {
      stop_ranks_in_release(gt);
      sbn_nccl_abort_all(gt);
    }
    aborted |= stuck;
  }
  /* an abort's ncclCommAbort still running (on its thread: sbnCommAbort's, an op's, the
     watchdog's, the one above) unmaps the window and frees memory of the comm's */
  sbn_nccl_aborts_wait(gt);
#endif
  if (release != NULL) release(gt, aborted); /* NCCL team: window, comm */
#if SYNCBN_HAVE_NCCL
  if (gt->nccl != NULL && !atomic_load(&gt->nccl_dead)) {
    /* finalize every comm in one group (one thread for several ranks), then destroy */
    const int64_t deadline = sbn_deadline_in(gt->timeout_ms);
    sbn_gpu_release_budget(gt, deadline);
    ncclResult_t nr = sbn_nccl.GroupStart();
    for (int q = 0; q < gt->nranks && nr == ncclSuccess; q++)
      if (gt->nccl[q]) nr = sbn_nccl.CommFinalize(gt->nccl[q]);
    ncclResult_t ne = sbn_nccl.GroupEnd();
    if (nr == ncclSuccess) nr = ne;
    nr = sbn_nccl_settle(nr, gt->nccl, gt->nranks, deadline, NULL); /* every comm of the group */
    sbn_gpu_release_budget(gt, sbn_mono_ns());
    if (nr != ncclSuccess) {
      stop_ranks_in_release(gt);
      sbn_nccl_abort_all(gt);
      sbn_nccl_aborts_wait(gt); /* (its thread writes gt when it ends) */
    } else {
      for (int q = 0; q < gt->nranks; q++)
        if (gt->nccl[q]) sbn_nccl.CommDestroy(gt->nccl[q]);
    }
  }
  free(gt->nccl);
  gt->nccl = NULL;
#endif
  if (gt->nccl_lock_ok) pthread_rwlock_destroy(&gt->nccl_lock);
  /* Every device first, then any memory: a rank's kernel still in flight writes its peers'
     mailboxes and stop words on their devices (peer access), and a cudaFree on one device
     does not wait for another device's kernels. */
  for (int q = 0; gt->ranks && q < gt->nranks; q++)
    if (gt->ranks[q].present && cudaSetDevice(gt->ranks[q].device) == cudaSuccess)
      cudaDeviceSynchronize();
  for (int q = 0; gt->ranks && q < gt->nranks; q++) {
    gpu_rank_t* g = &gt->ranks[q];
    if (!g->present || cudaSetDevice(g->device) != cudaSuccess) continue;
    if (g->ev) cudaEventDestroy(g->ev);
    for (int i = 0; i < g->watch.n; i++) {
      cudaEventDestroy(g->watch.slot[i].start);
      cudaEventDestroy(g->watch.slot[i].done);
    }
    if (g->stop_stream) cudaStreamDestroy(g->stop_stream);
    cudaFree(g->state);
    cudaFree(g->part);
    cudaFree(g->send);
    cudaFree(g->recv);
    if (gt->local >= 0)
      ; /* NCCL team: the window's memory (released above) */
    else if (sbn_mail_on_host(gt))
      cudaFreeHost(g->mail);
    else
      cudaFree(g->mail);
  }
  /* (each only where it was made: on a thread with no current device, cudaFree(NULL) would
     make device 0's context) */
  if (gt->aux) cudaStreamDestroy(gt->aux);
  if (gt->dscratch) cudaFree(gt->dscratch);
  if (gt->hscratch) cudaFreeHost(gt->hscratch);
  if (gt->err) cudaFreeHost((void*)gt->err);
  int now = prev; /* back to prev only where it moved: no context made for the restore */
  if (cudaGetDevice(&now) == cudaSuccess && now != prev) cudaSetDevice(prev);
  (void)cudaGetLastError();
  sbn_capture_restore(mode);
  for (int q = 0; gt->ranks && q < gt->nranks; q++) {
    free(gt->ranks[q].watch.slot);
    if (gt->ranks[q].watch.mu_ok) pthread_mutex_destroy(&gt->ranks[q].watch.mu);
  }
  free(gt->ranks);
  free(gt);
}

int sbn_gpu_host_pending(struct sbn_gpu_team* gt) {
  /* a replay may be waiting (unknown), or a collective left unfinished at an abort */
  int pending = atomic_load(&gt->host_captured) || atomic_load(&gt->host_stuck);
  for (int q = 0; gt->ranks != NULL && q < gt->nranks && !pending; q++) {
    sbn_watch_t* w = &gt->ranks[q].watch;
    if (!gt->ranks[q].present || !w->mu_ok) continue;
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->n && !pending; i++)
      pending = w->slot[i].state == SBN_WATCH_ARMED &&
                cudaEventQuery(w->slot[i].done) == cudaErrorNotReady;
    pthread_mutex_unlock(&w->mu);
  }
  (void)cudaGetLastError();
  return pending;
}

/* ---- the destroy's bound: sbn_gpu_team_free on a thread of its own ------------------- */
/* Its waits for the devices (cudaDeviceSynchronize, and cudaFree, which synchronizes its
   device) end when every kernel on them has, the program's own included: a kernel that
   never ends (a collective of another library waiting for a dead peer) would keep the
   destroy for ever. So the release runs on a thread that the destroy waits for up to its
   deadline; past it, the destroy returns sbnTimeout and the thread goes on alone, freeing
   the team when the devices finish. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC */
  int done;          /* the team is freed */
  int abandoned;     /* the destroy returned first: the thread frees this record */
  int64_t deadline;  /* the destroy waits until then (sbn_gpu_release_budget) */
  int64_t timeout_ns;
  struct sbn_gpu_team* gt;
  int aborted;
  void (*release)(struct sbn_gpu_team* gt, int aborted);
} releaser_t;

static _Atomic int releases_left; /* abandoned releases still running */

int sbn_gpu_releases_pending(void) {
  return atomic_load(&releases_left);
}

void sbn_gpu_release_budget(struct sbn_gpu_team* gt, int64_t from_ns) {
  releaser_t* rl = gt->releaser;
  if (rl == NULL) return;
  const int64_t now = sbn_mono_ns();
  if (from_ns < now) from_ns = now; /* a deadline passed (an abort's, long ago): no wait left */
  pthread_mutex_lock(&rl->mu);
  rl->deadline = from_ns + rl->timeout_ns;
  pthread_cond_signal(&rl->cv); /* the destroy waits until the new deadline */
  pthread_mutex_unlock(&rl->mu);
}

static void releaser_free(releaser_t* rl) {
  pthread_cond_destroy(&rl->cv);
  pthread_mutex_destroy(&rl->mu);
  free(rl);
}

/* The device a release thread makes current first: where the team has memory (a present
   rank's device; an NCCL team's, or an in-process team's first rank's, where only its
   error words or agreement's scratch were made), -1 where it has none. Not device 0 by
   default: cudaSetDevice makes a device's primary context, and the release restores the
   device that was current at its start. */
static int release_device(const struct sbn_gpu_team* gt) {
  const int present = sbn_gpu_present_device(gt);
  if (present >= 0 || gt->ranks == NULL) return present;
  if (gt->aux == NULL && gt->dscratch == NULL && gt->hscratch == NULL && gt->err == NULL) return -1;
  return gt->ranks[gt->local >= 0 ? gt->local : 0].device;
}

static void* releaser_main(void* arg) {
  releaser_t* rl = arg;
  sbn_gpu_thread_enter(release_device(rl->gt));
  sbn_gpu_team_free(rl->gt, rl->aborted, rl->release);
  pthread_mutex_lock(&rl->mu);
  rl->done = 1;
  const int abandoned = rl->abandoned;
  pthread_cond_signal(&rl->cv);
  pthread_mutex_unlock(&rl->mu);
  if (abandoned) {
    releaser_free(rl);
    atomic_fetch_sub(&releases_left, 1);
  }
  return NULL;
}

/* "device 0" or "devices 0, 1" (the present ranks' devices, each once) into buf; returns
   how many. */
static int name_devices(const struct sbn_gpu_team* gt, char* buf, size_t cap) {
  int seen[SBN_MAX_GPU_TEAM_RANKS], n = 0;
  for (int q = 0; gt->ranks != NULL && q < gt->nranks && n < SBN_MAX_GPU_TEAM_RANKS; q++) {
    int again = !gt->ranks[q].present;
    for (int i = 0; i < n && !again; i++) again = seen[i] == gt->ranks[q].device;
    if (!again) seen[n++] = gt->ranks[q].device;
  }
  size_t len = (size_t)snprintf(buf, cap, "%s", n > 1 ? "devices " : "device ");
  for (int i = 0; i < n && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%d", i > 0 ? ", " : "", seen[i]);
  return n;
}

sbnResult_t sbn_gpu_team_release(struct sbn_gpu_team* gt, int aborted,
                                 void (*release)(struct sbn_gpu_team* gt, int aborted)) {
  if (gt == NULL) return sbnSuccess;
  const int64_t t0 = sbn_mono_ns();
  /* the message's parts now: past the deadline the thread may be freeing gt */
  char devices[96];
  const int ndevices = name_devices(gt, devices, sizeof devices);
  const long long timeout_ms = (long long)gt->timeout_ms;
  releaser_t* rl = calloc(1, sizeof *rl);
  int made = rl != NULL && sbn_cond_init_monotonic(&rl->cv);
  if (made && pthread_mutex_init(&rl->mu, NULL) != 0) {
    pthread_cond_destroy(&rl->cv);
    made = 0;
  }
  if (!made) free(rl);
  pthread_t th;
  if (made) {
    rl->gt = gt, rl->aborted = aborted, rl->release = release;
    rl->timeout_ns = gt->timeout_ms * 1000000;
    rl->deadline = t0 + rl->timeout_ns; /* the first wait for the devices */
    gt->releaser = rl;
    made = sbn_gpu_thread_start(&th, releaser_main, rl);
    if (!made) {
      gt->releaser = NULL;
      releaser_free(rl);
    }
  }
  if (!made) { /* no thread (out of resources): on this one, unbounded, as before */
    sbn_gpu_team_free(gt, aborted, release);
    return sbnSuccess;
  }
  pthread_mutex_lock(&rl->mu);
  while (!rl->done) {
    const int64_t deadline = rl->deadline; /* moved by the release (under rl->mu) */
    if (sbn_mono_ns() >= deadline) break;
    const struct timespec until = {(time_t)(deadline / 1000000000), (long)(deadline % 1000000000)};
    pthread_cond_timedwait(&rl->cv, &rl->mu, &until);
  }
  const int done = rl->done;
  if (!done) {
    rl->abandoned = 1;
    atomic_fetch_add(&releases_left, 1);
  }
  pthread_mutex_unlock(&rl->mu);
  if (done) {
    pthread_join(th, NULL);
    releaser_free(rl);
    return sbnSuccess;
  }
  pthread_detach(th);
  return sbn_fail(NULL, sbnTimeout,
                  "sbnCommDestroy: %s did not finish %s work within timeout_ms (%lld ms): a "
                  "kernel still running (a collective waiting for a dead peer, a hung kernel "
                  "of the program's). The handle is released; the team's device memory, "
                  "streams, events and NCCL comm are freed by a thread of the library once "
                  "that work ends",
                  devices, ndevices > 1 ? "their" : "its", timeout_ms);
}

void sbn_gpu_init_undo(struct sbn_gpu_team* gt,
                       void (*release)(struct sbn_gpu_team* gt, int aborted)) {
  char why[512]; /* the init's failure, which the release's own sbnTimeout would replace */
  snprintf(why, sizeof why, "%s", sbn_error_text(NULL));
  if (sbn_gpu_team_release(gt, 0, release) != sbnSuccess) sbn_note(NULL, why);
}

sbnResult_t sbn_gpu_detach(sbn_team_t* team) {
  const sbnResult_t r =
      sbn_gpu_team_release(sbn_gpu(team), atomic_load(&team->abort_reason) != sbnSuccess, NULL);
  team->impl = NULL;
  return r;
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
      if (da == db) continue;
      if (cudaSetDevice(da) != cudaSuccess) { /* no access enabled from da: not peer */
        (void)cudaGetLastError();
        return 0;
      }
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
static sbnResult_t nccl_attach(struct sbn_gpu_team* gt) {
  const int w = gt->nranks;
  if (gt->transport == SBN_TR_VIRTUAL) {
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
  const char* load_why = NULL;
  if (sbn_nccl_load(&load_why) != sbnSuccess) {
    snprintf(gt->nccl_why, sizeof gt->nccl_why, "%s", load_why);
    sbn_log(SBN_LOG_WARN, "GPU team: %s; its SBN_ALGO=nccl ops will fail", gt->nccl_why);
    return sbnSuccess;
  }
  int devs[SBN_GPU_MAX_RANKS];
  for (int q = 0; q < w; q++) devs[q] = gt->ranks[q].device;
  gt->nccl = calloc((size_t)w, sizeof *gt->nccl);
  if (gt->nccl == NULL) return sbn_fail(NULL, sbnSystemError, "out of host memory (GPU team)");
  /* ncclCommInitAll's comms, but nonblocking: a collective waiting for a peer never blocks
     the host, so the watchdog can always abort it */
  ncclUniqueId id;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  const int64_t deadline = sbn_deadline_in(gt->timeout_ms);
  int prev = 0;
  cudaGetDevice(&prev);
  ncclResult_t nr = sbn_nccl.GetUniqueId(&id);
  if (nr == ncclSuccess) {
    /* NCCL writes the comms into gt->nccl (heap) */
    nr = sbn_nccl.GroupStart();
    for (int q = 0; q < w && nr == ncclSuccess; q++)
      nr = cudaSetDevice(devs[q]) == cudaSuccess
               ? sbn_nccl.CommInitRankConfig(&gt->nccl[q], w, id, q, &cfg)
               : ncclUnhandledCudaError;
    ncclResult_t ne = sbn_nccl.GroupEnd();
    if (nr == ncclSuccess) nr = ne;
    nr = sbn_nccl_settle(nr, gt->nccl, w, deadline, NULL); /* every comm of the group */
  }
  cudaSetDevice(prev);
  if (nr != ncclSuccess) {
    snprintf(gt->nccl_why, sizeof gt->nccl_why,
             "NCCL comm init (ncclCommInitRankConfig x %d) failed: %s (%s)", w,
             nr == ncclInProgress ? "timed out" : sbn_nccl.GetErrorString(nr),
             sbn_nccl.GetLastError(NULL));
    /* (on a thread: the abort waits for the devices) */
    sbn_nccl_abort_comms(gt, gt->nccl, w, devs[0], sbn_deadline_in(gt->timeout_ms));
    /* after a timeout NCCL may still write a comm it had not written yet: never freed */
    if (nr != ncclInProgress)
      free(gt->nccl);
    else
      sbn_gpu_park(gt->nccl);
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
  /* The zeroing runs on the rank's own non-blocking stream, which the init waits for
     (sbn_gpu_init_settle): on the legacy default stream it would queue behind the
     program's work on blocking streams, and a wait for the whole device would wait for a
     kernel of the program's that never ends. */
  CU(cudaStreamCreateWithFlags(&g->stop_stream, cudaStreamNonBlocking), "cudaStreamCreate");
  CU(cudaMalloc((void**)&g->state, sizeof(sbn_rank_state_t)), "cudaMalloc (rank state)");
  CU(cudaMemsetAsync(g->state, 0, sizeof(sbn_rank_state_t), g->stop_stream), "cudaMemsetAsync");
  CU(cudaMalloc((void**)&g->part, part_bytes), "cudaMalloc (workspace)");
  if (mail && sbn_mail_on_host(gt)) {
    CU(cudaHostAlloc((void**)&g->mail, mail_bytes, cudaHostAllocPortable | cudaHostAllocMapped),
       "cudaHostAlloc (mailbox)");
    memset(g->mail, 0, mail_bytes);
  } else if (mail) {
    CU(cudaMalloc((void**)&g->mail, mail_bytes), "cudaMalloc (mailbox)");
    CU(cudaMemsetAsync(g->mail, 0, mail_bytes, g->stop_stream), "cudaMemsetAsync");
  }
  CU(cudaEventCreateWithFlags(&g->ev, cudaEventDisableTiming), "cudaEventCreate");
  if (pthread_mutex_init(&g->watch.mu, NULL) != 0) {
    r = sbn_fail(NULL, sbnSystemError, "pthread_mutex_init failed");
    goto out;
  }
  g->watch.mu_ok = 1;
  r = sbn_watch_grow(&g->watch, SBN_WATCH_FIRST);
  if (r != sbnSuccess) goto out;
  const size_t nrec = (size_t)gt->nchunks_max;
  CU(cudaMalloc((void**)&g->send, nrec * sizeof(sbn_mail_rec_t)), "cudaMalloc (host path)");
  CU(cudaMalloc((void**)&g->recv, (size_t)w * nrec * sizeof(sbn_mail_rec_t)),
     "cudaMalloc (host path)");
out:
  return r;
}

/* An in-process team: rank q on devices[q], or every rank on devices[0] (virt: one launch
   for all of them). stop: a split's parent team's abort word, which ends the wait for the
   zeroing (NULL: none). On failure team->impl stays NULL. */
static sbnResult_t gpu_attach(sbn_team_t* team, const int* devices, int virt,
                              const _Atomic int* stop) {
  const int w = team->nranks;
  sbnResult_t r = sbnSuccess;
  int prev = 0, ndev = 0;
  if (w > SBN_GPU_MAX_RANKS)
    return sbn_fail(NULL, sbnUnsupported, "GPU teams have at most %d ranks, got %d",
                    SBN_GPU_MAX_RANKS, w);
  cudaError_t e0 = cudaGetDeviceCount(&ndev);
  if (e0 != cudaSuccess || ndev <= 0) {
    char why[320];
    (void)cudaGetLastError();
    sbn_cuda_no_device_reason(e0, ndev, why, sizeof why); /* no driver, an old one, none seen */
    return sbn_fail(NULL, sbnUnsupported, "no usable CUDA device: %s", why);
  }
  for (int q = 0; q < w; q++) {
    int d = virt ? devices[0] : devices[q];
    if (d < 0 || d >= ndev)
      return sbn_fail(NULL, sbnInvalidArgument, "device %d does not exist (%d CUDA devices)", d,
                      ndev);
  }
  cudaGetDevice(&prev);
  struct sbn_gpu_team* gt = calloc(1, sizeof *gt);
  if (gt == NULL) return sbn_fail(NULL, sbnSystemError, "out of host memory (GPU team)");
  gt->nranks = w;
  gt->local = -1;
  gt->transport = SBN_TR_VIRTUAL;
  gt->timeout_ms = team->cfg.timeout_ms;
  gt->nchunks_max = (int)((team->cfg.max_channels + SBN_GPU_CHUNK - 1) / SBN_GPU_CHUNK);
  gt->ranks = calloc((size_t)w, sizeof *gt->ranks);
  if (gt->ranks == NULL) {
    r = sbn_fail(NULL, sbnSystemError, "out of host memory (GPU team)");
    goto out;
  }
  for (int q = 0; q < w; q++)
    gt->ranks[q].device = virt ? devices[0] : devices[q];
  for (int q = 0; q < w; q++) {
    gpu_rank_t* g = &gt->ranks[q];
    for (int o = 0; o < w; o++) g->share += gt->ranks[o].device == g->device;
    if (virt) g->share = 1; /* one launch holds every rank */
    CU(cudaSetDevice(g->device), "cudaSetDevice");
    r = sbn_gpu_query_device(g, g->device);
    if (r != sbnSuccess) goto out;
  }
  if (!virt) gt->transport = enable_peers(gt->ranks, w) ? SBN_TR_PEER : SBN_TR_PEER_HOST;

  CU(cudaHostAlloc((void**)&gt->err, (size_t)(w + 1) * sizeof(int),
                   cudaHostAllocPortable | cudaHostAllocMapped),
     "cudaHostAlloc (error words)");
  memset((void*)gt->err, 0, (size_t)(w + 1) * sizeof(int));

  for (int q = 0; q < w; q++) {
    CU(cudaSetDevice(gt->ranks[q].device), "cudaSetDevice");
    r = sbn_gpu_rank_alloc(gt, &gt->ranks[q], team->cfg.max_channels, 1);
    if (r != sbnSuccess) goto out;
  }
  r = nccl_attach(gt);
  if (r != sbnSuccess) goto out;
  const int64_t deadline = sbn_deadline_in(gt->timeout_ms); /* the zeroing, all ranks */
  for (int q = 0; q < w; q++) {
    CU(cudaSetDevice(gt->ranks[q].device), "cudaSetDevice");
    r = sbn_gpu_init_settle(gt, gt->ranks[q].stop_stream, gt->ranks[q].device, deadline, stop);
    if (r != sbnSuccess) goto out;
  }
out:
  cudaSetDevice(prev);
  if (r != sbnSuccess) {
    sbn_gpu_init_undo(gt, NULL);
    return r;
  }
  team->impl = gt;
  sbn_log(SBN_LOG_INFO, "GPU %s team %p of %d ranks on device %d%s, mailboxes in %s memory",
          virt ? "virtual" : "peer", (void*)team, w, gt->ranks[0].device,
          w > 1 && !virt ? ",..." : "", sbn_mail_on_host(gt) ? "pinned host" : "device");
  return sbnSuccess;
}

/* The host path's watchdog (NCCL comms only; the kernels' own waits are bounded
   in-kernel): an op of a rank that began (its start event done) and has not completed
   timeout_ms after the watchdog first found it begun waits in a collective for a peer that
   does not come. The team's NCCL comms are aborted (the collective returns) and the rank's
   error word says sbnTimeout. Every op in flight is watched (sbn_watch_t); one whose start
   is not done waits behind other work on its stream, which is not timed. It runs in the
   team's watchdog thread every 20 ms (watchdog_main), or when the host polls where the
   team has no such thread (a team whose thread could not start is not made: this is for
   a team without NCCL comms, which has nothing to watch). */
static void host_watchdog(struct sbn_gpu_team* gt) {
#if SYNCBN_HAVE_NCCL
  if (gt->nccl == NULL || atomic_load(&gt->nccl_dead)) return;
  const int64_t now = sbn_mono_ns();
  for (int q = 0; q < gt->nranks; q++) {
    sbn_watch_t* w = &gt->ranks[q].watch;
    if (!gt->ranks[q].present || !w->mu_ok) continue;
    int stuck = 0;
    pthread_mutex_lock(&w->mu);
    for (int i = 0; i < w->n && !stuck; i++) {
      sbn_watch_slot_t* sl = &w->slot[i];
      if (sl->state != SBN_WATCH_ARMED) continue;
      if (cudaEventQuery(sl->done) != cudaErrorNotReady) {
        sl->state = SBN_WATCH_FREE; /* done (a failure shows at the next launch) */
      } else if (sl->started_ns == 0) {
        if (cudaEventQuery(sl->start) == cudaSuccess) sl->started_ns = now;
      } else if (now - sl->started_ns > gt->timeout_ms * 1000000) {
        stuck = 1;
      }
    }
    (void)cudaGetLastError();
    pthread_mutex_unlock(&w->mu);
    if (stuck) {
      /* the rank's first cause stays (one its kernel, or another thread, wrote) */
      int none = 0;
      __atomic_compare_exchange_n(&gt->err[q], &none, (int)sbnTimeout, 0, __ATOMIC_SEQ_CST,
                                  __ATOMIC_SEQ_CST);
      sbn_nccl_abort_all(gt); /* sets the abort word first: queued APPLYs write nothing */
      return;
    }
  }
#else
  (void)gt;
#endif
}

static void* watchdog_main(void* arg) {
  struct sbn_gpu_team* gt = arg;
  /* on one of the team's devices (a query on the default device 0 would make a context
     there in every process), and relaxed about captures */
  sbn_gpu_thread_enter(sbn_gpu_present_device(gt));
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

sbnResult_t sbn_gpu_err_words(const struct sbn_gpu_team* gt) {
  sbnResult_t worst = sbnSuccess;
  if (gt->err == NULL) return worst; /* (a team whose attach failed before making them) */
  for (int q = 0; q <= gt->nranks; q++) {
    int v = __atomic_load_n(&gt->err[q], __ATOMIC_SEQ_CST);
    /* the cause (timeout, mismatch, count of 1) before the ranks it aborted */
    if (v != 0 && (worst == sbnSuccess || worst == sbnAborted)) worst = (sbnResult_t)v;
  }
  return worst;
}

sbnResult_t sbn_gpu_poll(const sbn_team_t* team) {
  struct sbn_gpu_team* gt = sbn_gpu(team);
  /* the watchdog thread aborts stuck collectives; polling only reads the error words, so it
     never blocks (and never queries events from a thread that may be capturing). Where
     the team has no such thread (above), the watchdog runs here, and an abort it makes
     waits (bounded by the timeout) for its copies into the stop words. */
  if (!gt->watchdog_ok) host_watchdog(gt);
  return sbn_gpu_err_words(gt);
}

const char* sbn_gpu_transport(const sbn_team_t* team) {
  static const char* const names[] = {"virtual", "peer", "peer-pinned-host", "nccl-lsa",
                                      "nccl-host"}; /* sbn_transport_t */
  return names[sbn_gpu(team)->transport];
}

void sbn_gpu_abort(sbn_team_t* team) { sbn_gpu_stop_ranks(sbn_gpu(team)); }

/* A split of an in-process team: sub-teams of the same table on the members' devices. */
static sbnResult_t gpu_split(sbn_team_t* team, const int* color, const int* key,
                             sbnComm_t* result) {
  const struct sbn_gpu_team* gt = sbn_gpu(team);
  int devs[SBN_GPU_MAX_RANKS];
  for (int q = 0; q < gt->nranks; q++) devs[q] = gt->ranks[q].device;
  return sbn_split_in_process(team, color, key, devs, result);
}

static sbnResult_t virtual_attach(sbn_team_t* team, sbn_team_init_t* init) {
  return gpu_attach(team, init->devices, 1, init->stop);
}
static sbnResult_t peer_attach(sbn_team_t* team, sbn_team_init_t* init) {
  return gpu_attach(team, init->devices, 0, init->stop);
}

const sbn_team_ops_t sbn_gpu_virtual_team_ops = SBN_GPU_TEAM_OPS(
    "GPU virtual", virtual_attach, sbn_gpu_detach, sbn_gpu_abort, gpu_split);
/* sbnCommInitAll teams' abort: the kernels (sbn_gpu_abort), then the team's NCCL comms at
   once, so that a host-path collective waiting for a rank returns (the cooperative kernels
   never use those comms: aborting them under a running kernel is safe). */
static void peer_abort(sbn_team_t* team) {
  const enum cudaStreamCaptureMode mode = sbn_capture_relaxed();
  sbn_gpu_abort(team);
  sbn_nccl_abort_all(sbn_gpu(team));
  sbn_capture_restore(mode);
}
const sbn_team_ops_t sbn_gpu_peer_team_ops =
    SBN_GPU_TEAM_OPS("GPU peer", peer_attach, sbn_gpu_detach, peer_abort, gpu_split);
