/* nccl_team.c — NCCL teams (sbnCommInitNccl): one rank per process, from the caller's NCCL
 * communicator.
 *
 * At init the team makes its own duplicate of the caller's comm (ncclCommSplit, nonblocking,
 * so every wait is bounded by the team's timeout) and agrees, with an ncclAllReduce (min)
 * of a few ints (readiness, the transport's preconditions, max_channels, the record's size),
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
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_internal.h"

#if SYNCBN_HAVE_NCCL

static sbnResult_t nccl_fail(ncclComm_t comm, ncclResult_t nr, const char* what) {
  if (nr == ncclInProgress)
    return sbn_fail(NULL, sbnTimeout,
                    "%s did not complete within the timeout: some rank of the NCCL comm has not "
                    "made the same call",
                    what);
  return sbn_fail(NULL, sbnNcclError, "%s: %s (%s)", what, sbn_nccl.GetErrorString(nr),
                  sbn_nccl.GetLastError(comm));
}

/* One comm that no team holds (a failed init's) aborted as sbn_nccl_abort_comms does, on
   `device` (-1: this thread's), waited for up to timeout_ms from now. */
static void abort_alone(ncclComm_t c, int device, int64_t timeout_ms) {
  sbn_nccl_abort_comms(NULL, &c, 1, device, sbn_deadline_in(timeout_ms));
}

/* The rank and size of `nccl`, once it is ready: a caller's nonblocking comm may still be
   finishing its own init or last call (bounded by the deadline; a split's child is ready:
   nccl_split_settled waited for its init). */
static sbnResult_t nccl_query(ncclComm_t nccl, int* nranks, int* rank, int64_t deadline) {
  ncclResult_t nr = sbn_nccl_settle(ncclSuccess, &nccl, 1, deadline, NULL);
  if (nr == ncclSuccess) nr = sbn_nccl_settle(sbn_nccl.CommCount(nccl, nranks), &nccl, 1, deadline, NULL);
  if (nr == ncclSuccess)
    nr = sbn_nccl_settle(sbn_nccl.CommUserRank(nccl, rank), &nccl, 1, deadline, NULL);
  if (nr != ncclSuccess) return nccl_fail(nccl, nr, "ncclCommCount/UserRank");
  return sbnSuccess;
}

/* ncclCommSplit of parent into a nonblocking child, waited for (nccl_wait.c): the parent,
   then the child. *child: the new comm, ready, or NULL (color NCCL_SPLIT_NOCOLOR).
   sbnTimeout when the parent's split did not finish by the deadline (a rank of the parent
   has not made the call): the parent is left to the caller to abort. Any other failure
   aborts the child (sbn_nccl_abort_comms: waited for up to timeout_ms more; a child stuck
   in its init, when parent_gt is the team split, until that team's abort's deadline, as
   its caller aborts that team next). NCCL writes the child into *slot when the parent's
   part is done, even after a timeout, so the slot is the caller's, on the heap:
   *unsettled = 1 where NCCL may still write it (until the parent is aborted), else 0 and
   *slot NULL again. Nothing here fails before the parent's call: a rank that failed there
   would leave its peers waiting in theirs. `what` names the call in the detail. */
static sbnResult_t nccl_split_settled(ncclComm_t parent, int color, int key, int64_t deadline,
                                      int64_t timeout_ms, struct sbn_gpu_team* parent_gt,
                                      const _Atomic int* stop, const char* what, ncclComm_t* slot,
                                      ncclComm_t* child, int* unsettled) {
  *child = NULL;
  *unsettled = 0;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  *slot = NULL;
  ncclResult_t nr =
      sbn_nccl_settle(sbn_nccl.CommSplit(parent, color, key, slot, &cfg), &parent, 1, deadline, stop);
  if (nr == ncclInProgress) {
    *unsettled = 1;
    return nccl_fail(parent, nr, what);
  }
  ncclComm_t c = *slot; /* the parent is done: NCCL no longer writes the slot */
  *slot = NULL;
  if (nr == ncclSuccess && c == NULL && color != NCCL_SPLIT_NOCOLOR)
    return sbn_fail(NULL, sbnNcclError, "%s: NCCL returned no comm for colour %d", what, color);
  if (nr == ncclSuccess) nr = sbn_nccl_settle(ncclSuccess, &c, 1, deadline, stop); /* its init */
  if (nr != ncclSuccess) {
    const sbnResult_t failed = nccl_fail(parent, nr, what); /* before the abort's own text */
    /* on the parent's device, current here (callers), within timeout_ms; a team's split
       whose child is stuck (a timeout, the team's abort) aborts that team next
       (nccl_split): within the same deadline, the team's abort's */
    const int64_t until = parent_gt != NULL && nr == ncclInProgress
                              ? sbn_gpu_stop_deadline(parent_gt)
                              : sbn_deadline_in(timeout_ms);
    if (c != NULL) sbn_nccl_abort_comms(NULL, &c, 1, -1, until);
    return failed;
  }
  *child = c;
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

/* Element-wise min over the team of v[0..n-1], n <= SBN_AGREE_MAX (bounded by the timeout,
   and ended by *stop where given: a split's parent team aborted). */
#define SBN_AGREE_MAX 8
static sbnResult_t agree_min(struct sbn_gpu_team* gt, ncclComm_t comm, int* v, int n,
                             const _Atomic int* stop) {
  sbnResult_t r = sbnSuccess;
  const int64_t deadline = sbn_deadline_in(gt->timeout_ms);
  for (int i = 0; i < n; i++) gt->hscratch[i] = v[i];
  CU(cudaMemcpyAsync(gt->dscratch, gt->hscratch, (size_t)n * sizeof(int), cudaMemcpyHostToDevice,
                     gt->aux),
     "cudaMemcpyAsync");
  ncclResult_t nr = sbn_nccl_settle(
      sbn_nccl.AllReduce(gt->dscratch, gt->dscratch, (size_t)n, ncclInt32, ncclMin, comm, gt->aux),
      &comm, 1, deadline, stop);
  if (nr != ncclSuccess) return nccl_fail(comm, nr, "ncclAllReduce (agreement)");
  CU(cudaMemcpyAsync(gt->hscratch, gt->dscratch, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost,
                     gt->aux),
     "cudaMemcpyAsync");
  for (;;) { /* a peer that never comes: the collective does not finish */
    cudaError_t e = cudaStreamQuery(gt->aux);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) CU(e, "cudaStreamQuery");
    if (stop != NULL && atomic_load(stop) != 0)
      return sbn_fail(NULL, sbnAborted, "the team's agreement was ended by an abort");
    if (sbn_mono_ns() > deadline)
      return sbn_fail(NULL, sbnTimeout,
                      "the team's ranks did not all arrive within %lld ms",
                      (long long)gt->timeout_ms);
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  for (int i = 0; i < n; i++) v[i] = gt->hscratch[i];
out:
  return r;
}

/* Why this rank cannot use the in-kernel transport (NULL: it can). */
static const char* lsa_obstacle(ncclComm_t comm, int nranks, char* buf, size_t n) {
#if SBN_NCCL_DEVICE_API
  int ver = 0;
  sbn_nccl.GetVersion(&ver);
  if (ver < NCCL_VERSION(2, 28, 0)) {
    snprintf(buf, n, "the NCCL library is %d.%d.%d, the device API needs 2.28", ver / 10000,
             ver / 100 % 100, ver % 100);
    return buf;
  }
  if (sbn_nccl.TeamLsa == NULL || sbn_nccl.MemAlloc == NULL || sbn_nccl.MemFree == NULL ||
      sbn_nccl.CommWindowRegister == NULL || sbn_nccl.CommWindowDeregister == NULL) {
    snprintf(buf, n, "the NCCL library lacks the device API's host functions");
    return buf;
  }
  const int lsa = sbn_nccl_lsa_size(comm, sbn_nccl.TeamLsa);
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

/* Allocates and zeroes this rank's part of the window, and the slot its registration
   writes the handle into: 1, or 0 with the reason in why. Everything the registration
   needs is made here, before the agreement that every rank has its part: a rank that
   failed after it would skip the collective registration its peers make. The zeroing's
   wait ends at the timeout, or at *stop where given. */
static int window_alloc(struct sbn_gpu_team* gt, char* why, size_t n, const _Atomic int* stop) {
#if SBN_NCCL_DEVICE_API
  gt->win_slot = calloc(1, sizeof(ncclWindow_t));
  if (gt->win_slot == NULL) {
    snprintf(why, n, "out of host memory (window handle)");
    return 0;
  }
  gt->win_bytes = (size_t)sbn_window_bytes(gt->nranks, gt->nchunks_max);
  ncclResult_t nr = sbn_nccl.MemAlloc(&gt->win_buf, gt->win_bytes);
  if (nr != ncclSuccess) {
    gt->win_buf = NULL;
    snprintf(why, n, "ncclMemAlloc(%zu): %s", gt->win_bytes, sbn_nccl.GetErrorString(nr));
    return 0;
  }
  /* zeroed before registering: the peers write into it only after every rank's
     registration and the agreement after it (on the team's stream, waited for within the
     timeout: not behind the device's other work) */
  if (cudaMemsetAsync(gt->win_buf, 0, gt->win_bytes, gt->aux) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(why, n, "cudaMemsetAsync of the window failed");
    return 0;
  }
  const int me = gt->local;
  if (sbn_gpu_init_settle(gt, gt->aux, gt->ranks[me].device, sbn_deadline_in(gt->timeout_ms),
                          stop) != sbnSuccess) {
    snprintf(why, n, "%s", sbn_error_text(NULL));
    return 0;
  }
  return 1;
#else
  (void)gt, (void)stop;
  snprintf(why, n, "no NCCL device API in this build");
  return 0;
#endif
}

/* Registers the window (collective: every rank calls it once every rank allocated).
   1: a symmetric window; 0: NCCL registered it but not as a window the kernel can address
   (the reason in why); -1: the registration did not finish within the timeout (fatal:
   the comm is no longer usable for other calls). NCCL's thread writes the handle when the
   registration is done, which may be after a timeout, when gt is gone: it goes to a slot
   of its own on the heap (gt->win_slot, made by window_alloc: nothing here fails before
   the collective call), never freed after a timeout (sbn_gpu_park). *stop, where given,
   ends the wait as the timeout does (a split's parent team aborted). */
static int window_register(struct sbn_gpu_team* gt, ncclComm_t comm, char* why, size_t n,
                           const _Atomic int* stop) {
#if SBN_NCCL_DEVICE_API
  ncclWindow_t* slot = gt->win_slot;
  ncclResult_t nr = sbn_nccl_settle(
      sbn_nccl.CommWindowRegister(comm, gt->win_buf, gt->win_bytes, slot, NCCL_WIN_COLL_SYMMETRIC),
      &comm, 1, sbn_deadline_in(gt->timeout_ms), stop);
  gt->win_slot = NULL;
  if (nr == ncclInProgress) { /* NCCL may still write the slot: never freed */
    sbn_gpu_park(slot);
    return -1;
  }
  gt->win = *slot;
  free(slot);
  if (nr != ncclSuccess || gt->win == NULL) {
    snprintf(why, n, "ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC): %s (%s)",
             sbn_nccl.GetErrorString(nr), sbn_nccl.GetLastError(comm));
    return 0;
  }
  /* Without symmetric-memory support (no P2P between the node's GPUs, NCCL_CUMEM_ENABLE=0,
     NCCL_WIN_ENABLE=0) NCCL still succeeds, with a handle that is a host-side record:
     the kernel would fault reading it. A usable window handle is device memory. */
  struct cudaPointerAttributes at;
  memset(&at, 0, sizeof at);
  if (cudaPointerGetAttributes(&at, gt->win) != cudaSuccess) (void)cudaGetLastError();
  if (at.type != cudaMemoryTypeDevice) {
    snprintf(why, n,
             "NCCL registered the buffer but not as a symmetric window (no symmetric-memory "
             "support on this communicator: P2P between the GPUs, NCCL_CUMEM_ENABLE, "
             "NCCL_WIN_ENABLE)");
    return 0;
  }
  return 1;
#else
  (void)gt, (void)comm, (void)stop;
  snprintf(why, n, "no NCCL device API in this build");
  return 0;
#endif
}

static void nccl_release(struct sbn_gpu_team* gt, int aborted);

/* The team's GPU part: the team's own NCCL comm (a duplicate of init->nccl, or init->nccl
   itself when init->adopt: then taken, init->nccl = NULL), device state, the watchdog, and
   the transport agreed by every rank. Collective, bounded by the timeout. On failure
   team->impl stays NULL (an adopted comm is released). A failure of this rank alone comes
   before the first agreement (the peers time out in it) or is agreed on, so that every
   rank fails together; left: a collective that ends here and not on the peers (a
   registration's or an agreement's timeout, a CUDA error of an agreement's copies), whose
   peers time out at their next collective. */
static sbnResult_t nccl_attach(sbn_team_t* team, sbn_team_init_t* init) {
  const int w = team->nranks, me = team->first_local;
  const int adopt = init->adopt;
  struct ncclComm* nccl = init->nccl;
  /* a split's parent team's abort word, or NULL: ends the waits for the ranks below */
  const _Atomic int* stop = init->stop;
  if (adopt) init->nccl = NULL;
  sbnResult_t r = sbnSuccess;
  int prev = 0, dev = -1;
  /* a bad value is reported on every rank after the first agreement (the others would
     wait for this rank in a collective) */
  const int mode = transport_from_env();
  const int64_t deadline = sbn_deadline_in(team->cfg.timeout_ms);
  ncclResult_t nr = sbn_nccl_settle(sbn_nccl.CommCuDevice(nccl, &dev), &nccl, 1, deadline, NULL);
  if (nr != ncclSuccess) {
    const sbnResult_t failed = nccl_fail(nccl, nr, "ncclCommCuDevice");
    if (adopt) abort_alone(nccl, -1, team->cfg.timeout_ms);
    return failed;
  }
  cudaGetDevice(&prev);
  struct sbn_gpu_team* gt = calloc(1, sizeof *gt);
  if (gt == NULL) {
    if (adopt) abort_alone(nccl, dev, team->cfg.timeout_ms);
    return sbn_fail(NULL, sbnSystemError, "out of host memory (NCCL team)");
  }
  gt->nranks = w;
  gt->local = me;
  gt->transport = SBN_TR_NCCL_COLL;
  gt->timeout_ms = team->cfg.timeout_ms;
  gt->nchunks_max = (int)((team->cfg.max_channels + SBN_GPU_CHUNK - 1) / SBN_GPU_CHUNK);
  gt->ranks = calloc((size_t)w, sizeof *gt->ranks);
  gt->nccl = calloc((size_t)w, sizeof *gt->nccl);
  if (gt->ranks == NULL || gt->nccl == NULL) {
    if (adopt) abort_alone(nccl, dev, team->cfg.timeout_ms);
    r = sbn_fail(NULL, sbnSystemError, "out of host memory (NCCL team of %d ranks)", w);
    goto out;
  }
  if (adopt) gt->nccl[me] = nccl; /* a split made for this team (settled by nccl_split) */
  CU(cudaSetDevice(dev), "cudaSetDevice (the NCCL comm's device)");
  if (!adopt) {
    /* the team's own comm: aborting it on a timeout leaves the caller's intact. NCCL
       takes the split's blocking mode from the parent: with a blocking parent this call
       waits for every rank (as NCCL's own init does); with a nonblocking one it returns
       at once. Either way the child is nonblocking and may still be initialising. */
    ncclComm_t child = NULL;
    /* its own slot: the team's (split_slot, below) comes after, with the rank's own
       resources; a failure here, before any collective, leaves the peers to time out in
       this split, as a rank that never calls does */
    ncclComm_t* slot = calloc(1, sizeof *slot);
    if (slot == NULL) {
      r = sbn_fail(NULL, sbnSystemError, "out of host memory (ncclCommSplit's slot)");
      goto out;
    }
    int unsettled = 0;
    r = nccl_split_settled(nccl, 0, me, deadline, team->cfg.timeout_ms, NULL, NULL,
                           "ncclCommSplit (the team's own comm)", slot, &child, &unsettled);
    /* unsettled: NCCL may still write it (the parent is the caller's, never aborted here) */
    if (!unsettled)
      free(slot);
    else
      sbn_gpu_park(slot);
    if (r != sbnSuccess) goto out;
    gt->nccl[me] = child;
  }
  ncclComm_t comm = gt->nccl[me];
  gpu_rank_t* g = &gt->ranks[me];
  g->device = dev;
  g->share = 1;
  /* what the agreement needs first; a failure here leaves the peers to time out */
  CU(cudaStreamCreateWithFlags(&gt->aux, cudaStreamNonBlocking), "cudaStreamCreate");
  CU(cudaMalloc((void**)&gt->dscratch, SBN_AGREE_MAX * sizeof(int)), "cudaMalloc");
  CU(cudaHostAlloc((void**)&gt->hscratch, SBN_AGREE_MAX * sizeof(int), cudaHostAllocPortable),
     "cudaHostAlloc");
  /* this rank's own resources: a failure is agreed on, so every rank fails at once */
  sbnResult_t mine = mode < 0 ? sbnInvalidArgument : sbn_gpu_query_device(g, dev);
  if (mine == sbnSuccess) {
    cudaError_t e = cudaHostAlloc((void**)&gt->err, (size_t)(w + 1) * sizeof(int),
                                  cudaHostAllocPortable | cudaHostAllocMapped);
    if (e != cudaSuccess) {
      gt->err = NULL;
      mine = sbn_cuda_fail(e, "cudaHostAlloc (error words)");
    } else {
      memset((void*)gt->err, 0, (size_t)(w + 1) * sizeof(int));
    }
  }
  /* The slot NCCL writes the child of every sbnCommSplit of the team into (nccl_split),
     made here so that its failure is agreed on: a split allocates nothing before the
     parent's ncclCommSplit, where a rank that failed alone would leave its peers waiting
     until their timeout aborted their team (this rank keeping its own). */
  if (mine == sbnSuccess) {
    gt->split_slot = calloc(1, sizeof *gt->split_slot);
    if (gt->split_slot == NULL)
      mine = sbn_fail(NULL, sbnSystemError, "out of host memory (the splits' slot)");
  }
  if (mine == sbnSuccess) mine = sbn_gpu_rank_alloc(gt, g, team->cfg.max_channels, 0);
  if (mine == sbnSuccess)
    mine = sbn_gpu_init_settle(gt, g->stop_stream, dev, sbn_deadline_in(gt->timeout_ms),
                               stop); /* the zeroing */
  /* The host path's watchdog (its collectives, also SBN_ALGO=nccl calls), here so that a
     failure to start it is agreed on too: after the last agreement nothing may fail on
     one rank alone (its peers would keep a team that can only time out). It watches
     launched ops only (no slot is armed until the first op) and the failure path stops
     it before anything is released (sbn_gpu_team_free). */
  if (mine == sbnSuccess) mine = sbn_gpu_watchdog_start(gt);
  char mine_why[256];
  snprintf(mine_why, sizeof mine_why, "%s", mine == sbnSuccess ? "" : sbn_error_text(NULL));

  /* agreement 1: every rank ready, the same max_channels, the transport's preconditions */
  char why[256];
  const char* obstacle = mode == 2 ? "SBN_NCCL_TRANSPORT=host" : lsa_obstacle(comm, w, why, sizeof why);
  const int mc = team->cfg.max_channels > 0x7fffffff ? 0x7fffffff : (int)team->cfg.max_channels;
  /* the mailbox record's size stands for the exchange's layout: processes running builds
     of syncbn that exchange different records (the backward's record grew from 3 to 4
     floats per channel) must refuse to team up, not exchange garbage */
  const int rec = (int)sizeof(sbn_mail_rec_t);
  int v[7] = {mine == sbnSuccess, obstacle == NULL, mode == 1 ? -1 : 0, mc, -mc, rec, -rec};
  r = agree_min(gt, comm, v, 7, stop);
  /* an agreement that failed after this rank's own failure (its stream behind a zeroing
     that never finished, say): this rank's cause */
  if (r != sbnSuccess && mine != sbnSuccess) r = sbn_fail(NULL, mine, "%s", mine_why);
  if (r != sbnSuccess) goto out;
  if (!v[0]) {
    r = mine != sbnSuccess
            ? sbn_fail(NULL, mine, "%s", mine_why)
            : sbn_fail(NULL, sbnInvalidUsage,
                       "another rank of the team failed its init (its own "
                       "error says why); no comm was made");
    goto out;
  }
  if (v[3] != -v[4]) {
    r = sbn_fail(NULL, sbnInvalidArgument,
                 "the ranks' max_channels differ (from %d to %d): every rank "
                 "of a team must pass the same config",
                 v[3], -v[4]);
    goto out;
  }
  if (v[5] != -v[6]) {
    r = sbn_fail(NULL, sbnInvalidUsage,
                 "the ranks' syncbn builds exchange different records (%d to %d bytes per "
                 "chunk): every process of a team must run the same syncbn version",
                 v[5], -v[6]);
    goto out;
  }
  const int require = v[2] < 0;
  if (v[1]) {
    /* agreement 2: every rank has its part; then all register (collective) */
    int ok = window_alloc(gt, why, sizeof why, stop);
    const int mine_ok = ok;
    r = agree_min(gt, comm, &ok, 1, stop);
    if (r != sbnSuccess && !mine_ok && gt->win_buf != NULL) /* this rank's cause: its zeroing */
      r = sbn_fail(NULL, r, "%s", why);
    if (r != sbnSuccess) goto out;
    if (ok) {
      ok = window_register(gt, comm, why, sizeof why, stop);
      if (ok < 0) {
        r = sbn_fail(NULL, sbnTimeout,
                     "ncclCommWindowRegister did not finish within %lld ms",
                     (long long)gt->timeout_ms);
        goto out;
      }
      int reg = ok; /* agreement 3: a usable window on every rank */
      r = agree_min(gt, comm, &reg, 1, stop);
      if (r != sbnSuccess) goto out;
      if (reg) gt->transport = SBN_TR_NCCL_WINDOW;
      if (!reg) obstacle = ok ? "the symmetric window is not usable on another rank" : why;
    } else {
      obstacle = mine_ok ? "another rank could not allocate or zero its window part" : why;
    }
  } else if (obstacle == NULL) {
    obstacle = "another rank cannot use the in-kernel transport (see its SBN_DEBUG=INFO)";
  }
  const int lsa = gt->transport == SBN_TR_NCCL_WINDOW;
  if (!lsa && require) {
    r = sbn_fail(NULL, sbnUnsupported,
                 "SBN_NCCL_TRANSPORT=lsa, but the in-kernel transport is not "
                 "possible: %s",
                 obstacle);
    goto out;
  }
  if (lsa) g->mail = (sbn_mail_rec_t*)gt->win_buf;
  snprintf(gt->nccl_why, sizeof gt->nccl_why, "%s", lsa ? "" : obstacle);
  /* nothing below fails: every rank has the team (sbn_team_create made the comms before) */
out:
  cudaSetDevice(prev);
  if (r != sbnSuccess) {
    /* the peers may be inside a collective with this rank: the comm is aborted, not
       finalized, by the release (nccl_release), on its thread: ncclCommAbort frees device
       memory, which waits for the whole device */
    gt->init_failed = 1;
    sbn_gpu_init_undo(gt, nccl_release);
    return r;
  }
  team->impl = gt;
  if (gt->transport == SBN_TR_NCCL_WINDOW)
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

/* The NCCL team's part of sbn_gpu_team_free: releases the window and the team's comm
   (finalized and destroyed, or aborted when the team was, or when a kernel reported a
   failure by the time the device is idle: its peers may never make the collective calls). */
static void nccl_release(struct sbn_gpu_team* gt, int aborted) {
  const int me = gt->local;
  ncclComm_t comm = gt->nccl != NULL ? gt->nccl[me] : NULL;
  const int dead = atomic_exchange(&gt->nccl_dead, 1);
  if (me >= 0 && gt->ranks != NULL && gt->ranks[me].present) {
    cudaSetDevice(gt->ranks[me].device);
    cudaDeviceSynchronize(); /* this rank's kernels are done (bounded by their deadlines) */
    (void)cudaGetLastError();
  }
  /* a failure a kernel reported that no call read (sbnCommGetAsyncError, an op), or that a
     kernel still waiting for a missing peer at the destroy reported as it ended: the team
     counts as aborted, as reading it would have made it, and the collective teardown below
     (the window's deregistration, ncclCommFinalize) would wait the timeout out for the
     peer that failed */
  aborted |= sbn_gpu_err_words(gt) != sbnSuccess || gt->init_failed;
  if (comm != NULL && !dead) {
    const int64_t deadline = sbn_deadline_in(gt->timeout_ms);
    sbn_gpu_release_budget(gt, deadline); /* the collective teardown is bounded */
    ncclResult_t nr = ncclSuccess;
    /* an aborted team's peers may never make the collective calls below */
    if (!aborted && gt->win != NULL) {
#if SBN_NCCL_DEVICE_API
      nr = sbn_nccl_settle(sbn_nccl.CommWindowDeregister(comm, (ncclWindow_t)gt->win), &comm, 1,
                           deadline, NULL);
#endif
    }
    if (!aborted && nr == ncclSuccess)
      nr = sbn_nccl_settle(sbn_nccl.CommFinalize(comm), &comm, 1, deadline, NULL);
    sbn_gpu_release_budget(gt, sbn_mono_ns());
    if (!aborted && nr == ncclSuccess)
      sbn_nccl.CommDestroy(comm);
    else
      sbn_nccl.CommAbort(comm);
  }
  if (gt->nccl != NULL) gt->nccl[me] = NULL;
  if (gt->split_slot != NULL) { /* the comm is aborted now: NCCL no longer writes the slot */
    /* a split that did not settle: its child, where a late peer let NCCL make it */
    if (gt->split_unsettled && *gt->split_slot != NULL) sbn_nccl.CommAbort(*gt->split_slot);
    free(gt->split_slot);
    gt->split_slot = NULL;
  }
  gt->win = NULL;
  free(gt->win_slot); /* made for a registration that never ran (NULL once it did) */
  gt->win_slot = NULL;
#if SBN_NCCL_DEVICE_API
  if (gt->win_buf != NULL) sbn_nccl.MemFree(gt->win_buf);
#endif
  gt->win_buf = NULL;
  if (gt->ranks != NULL) gt->ranks[me].mail = NULL;
}

/* The table's detach: sbn_gpu_detach's, with the window and the comm released. */
static sbnResult_t nccl_detach(sbn_team_t* team) {
  const sbnResult_t r = sbn_gpu_team_release(
      sbn_gpu(team), atomic_load(&team->abort_reason) != sbnSuccess, nccl_release);
  team->impl = NULL;
  return r;
}

/* The table's abort (sbnCommAbort, a failed launch): this process's kernels
   (sbn_gpu_abort), then the other processes' kernels, then the comm (an "nccl-lsa" team's
   only where a host-path collective is pending: see the end). */
static void nccl_abort(sbn_team_t* team) {
  struct sbn_gpu_team* gt = sbn_gpu(team);
  const enum cudaStreamCaptureMode mode = sbn_capture_relaxed();
  sbn_gpu_abort(team);
  int prev = 0;
  cudaGetDevice(&prev);
  /* The notification goes through the window, which the comm's abort unmaps: not once the
     comm was aborted (a host-path failure, the watchdog), and under the read lock, so
     that no abort runs until it has landed (bounded: it queues behind nothing but a
     kernel that sees the abort word). */
  if (gt->nccl_lock_ok) pthread_rwlock_rdlock(&gt->nccl_lock);
#if SBN_NCCL_DEVICE_API
  /* the other processes' kernels waiting for this rank return now; once (a failure word,
     once written, stays: a later abort's would change nothing, and would queue behind a
     notification that did not land) */
  if (gt->transport == SBN_TR_NCCL_WINDOW && gt->win != NULL && !atomic_load(&gt->nccl_dead) &&
      cudaSetDevice(gt->ranks[gt->local].device) == cudaSuccess &&
      !atomic_exchange(&gt->abort_notified, 1))
    sbn_gpu_notify_launch(gt->win, sbn_window_fail_off(gt->nranks, gt->nchunks_max), gt->local,
                          gt->nranks, sbnAborted, gt->aux);
#endif
  /* the abort's deadline, which sbn_gpu_abort's wait for the stop words began: one
     timeout for both waits, not one each */
  const int64_t deadline = sbn_gpu_stop_deadline(gt);
  while (gt->aux != NULL && cudaStreamQuery(gt->aux) == cudaErrorNotReady &&
         sbn_mono_ns() < deadline) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  (void)cudaGetLastError();
  if (gt->nccl_lock_ok) pthread_rwlock_unlock(&gt->nccl_lock);
  cudaSetDevice(prev);
  /* A collective of the host path (nccl-host, or an SBN_ALGO=nccl call) returns; an
     "nccl-lsa" team's comm only for such a collective, else when the team is released,
     after its device is idle (nccl_release): its kernels, which may still be running
     (they end once they see the stop word), write through the window */
  if (sbn_gpu_abort_comms_now(gt, 1, sbn_gpu_host_pending(gt))) sbn_nccl_abort_all(gt);
  sbn_capture_restore(mode);
}

static sbnResult_t nccl_create(struct ncclComm* nccl, int adopt, const _Atomic int* stop,
                               const sbn_cfg_t* cfg, sbnComm_t* out);

/* sbnCommSplit: ncclCommSplit of the team's comm (collective over the team's processes),
   and a team made of the child, which it adopts. color[0], key[0]: this process's rank.
   Nothing fails on this rank alone before the parent's ncclCommSplit, where the peers
   would wait until their timeout and abort their team (the slot is the team's, made at
   its init), but the refusal of a team already aborted, which its callers refuse first. */
static sbnResult_t nccl_split(sbn_team_t* team, const int* color, const int* key,
                              sbnComm_t* result) {
  struct sbn_gpu_team* gt = sbn_gpu(team);
  pthread_rwlock_rdlock(&gt->nccl_lock); /* the comm is not aborted under the call */
  ncclComm_t parent = gt->nccl[gt->local];
  if (parent == NULL || atomic_load(&gt->nccl_dead)) {
    pthread_rwlock_unlock(&gt->nccl_lock);
    return sbn_fail(NULL, sbnAborted, "sbnCommSplit: the team's NCCL comm was aborted");
  }
  /* NCCL may write an unsettled split's slot until the comm is aborted, so no later split
     may use it; that split aborted the team before it returned (below), so the peers have
     lost this rank's team already, and a split refused here costs them nothing more */
  if (gt->split_unsettled) {
    pthread_rwlock_unlock(&gt->nccl_lock);
    return sbn_fail(NULL, sbnAborted,
                    "sbnCommSplit: an earlier sbnCommSplit of the team did not finish (the team "
                    "was aborted then)");
  }
  ncclComm_t child = NULL;
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(gt->ranks[gt->local].device);
  sbnResult_t r =
      nccl_split_settled(parent, color[0] == SBN_SPLIT_NOCOLOR ? NCCL_SPLIT_NOCOLOR : color[0],
                         key[0], sbn_deadline_in(gt->timeout_ms), gt->timeout_ms, gt,
                         &team->abort_reason, "sbnCommSplit: ncclCommSplit", gt->split_slot, &child,
                         &gt->split_unsettled); /* unsettled: the team is aborted below */
  cudaSetDevice(prev);
  pthread_rwlock_unlock(&gt->nccl_lock);
  const int reason = atomic_load(&team->abort_reason);
  if (r != sbnSuccess && reason != sbnSuccess) /* sbnCommAbort (or a failure) ended the wait */
    r = sbn_fail(NULL, sbnAborted,
                 "sbnCommSplit: the team was aborted (%s) while ncclCommSplit waited for its ranks",
                 sbnGetResultName((sbnResult_t)reason));
  /* the parent's ranks no longer agree on their calls (a timeout), or the team's abort
     ended the wait: the team's abort (its notification first), which aborts the comm now
     where no kernel writes through a window (nccl-host; a pending collective), else at the
     release, once the device is idle: the split's collective, which may still wait, goes
     with it (an abort would unmap the window under a kernel still running) */
  if (r == sbnTimeout) sbn_team_abort(team, sbnTimeout);
  if (r == sbnTimeout || r == sbnAborted) nccl_abort(team);
  if (r != sbnSuccess) return r;
  if (child == NULL) { /* SBN_SPLIT_NOCOLOR */
    result[0] = NULL;
    return sbnSuccess;
  }
  /* the new team's init, whose waits (its agreements, the window's registration) end when
     this team is aborted, as the split's did */
  r = nccl_create(child, 1, &team->abort_reason, &team->cfg, &result[0]);
  if (r == sbnSuccess) return sbnSuccess;
  const int after = atomic_load(&team->abort_reason);
  if (after != sbnSuccess)
    return sbn_fail(NULL, sbnAborted,
                    "sbnCommSplit: the team was aborted (%s) while the new team's init waited for "
                    "its ranks; no comm was made",
                    sbnGetResultName((sbnResult_t)after));
  return sbn_fail(NULL, r, "sbnCommSplit: %s", sbn_error_text(NULL));
}

static const sbn_team_ops_t nccl_team_ops =
    SBN_GPU_TEAM_OPS("NCCL", nccl_attach, nccl_detach, nccl_abort, nccl_split);

/* This process's rank of a team made from `nccl` (adopt: the team takes it as its own;
   otherwise it makes its own duplicate). stop: a split's parent team's abort word, which
   ends the init's waits for its ranks (its agreements, the window's registration), or
   NULL. */
static sbnResult_t nccl_create(struct ncclComm* nccl, int adopt, const _Atomic int* stop,
                               const sbn_cfg_t* cfg, sbnComm_t* out) {
  int nranks = 0, rank = 0;
  sbnResult_t r = nccl_query(nccl, &nranks, &rank, sbn_deadline_in(cfg->timeout_ms));
  if (r == sbnSuccess && (nranks < 1 || rank < 0 || rank >= nranks))
    r = sbn_fail(NULL, sbnInvalidArgument, "the NCCL comm says rank %d of %d", rank, nranks);
  if (r == sbnSuccess) {
    sbn_team_init_t init = {NULL, nccl, adopt, stop};
    r = sbn_team_create(&nccl_team_ops, nranks, rank, 1, cfg, &init, out);
    nccl = init.nccl; /* NULL once attach took it */
  }
  /* an adopted comm the team did not take: local, unlike ncclCommDestroy (it is ready:
     nccl_query or the split waited for it), on its own device where NCCL says which */
  if (r != sbnSuccess && adopt && nccl != NULL) {
    int dev = -1;
    if (sbn_nccl.CommCuDevice(nccl, &dev) != ncclSuccess) dev = -1;
    abort_alone(nccl, dev, cfg->timeout_ms);
  }
  return r;
}

sbnResult_t sbn_nccl_team_create(struct ncclComm* nccl, const sbn_cfg_t* cfg, sbnComm_t* comm) {
  const char* why = NULL;
  if (sbn_nccl_load(&why) != sbnSuccess) return sbn_fail(NULL, sbnUnsupported, "%s", why);
  return nccl_create(nccl, 0, NULL, cfg, comm);
}

_Static_assert(sizeof(ncclUniqueId) == SBN_NCCL_UNIQUE_ID_BYTES, "sbnNcclUniqueId_t is ncclUniqueId");

sbnResult_t sbn_nccl_unique_id(char* out) {
  const char* why = NULL;
  if (sbn_nccl_load(&why) != sbnSuccess) return sbn_fail(NULL, sbnUnsupported, "%s", why);
  ncclUniqueId id;
  const ncclResult_t nr = sbn_nccl.GetUniqueId(&id);
  if (nr != ncclSuccess) return nccl_fail(NULL, nr, "ncclGetUniqueId");
  memcpy(out, &id, sizeof id);
  return sbnSuccess;
}

/* The comm of this rank made from the id, nonblocking so that its init is waited for with
   the deadline (a rank that never calls leaves it in progress: aborted, sbnTimeout), then
   adopted by the team (no duplicate: nccl_create with adopt). */
sbnResult_t sbn_nccl_team_create_rank(const char* id, int nranks, int rank, const sbn_cfg_t* cfg,
                                      sbnComm_t* comm) {
  const char* why = NULL;
  if (sbn_nccl_load(&why) != sbnSuccess) return sbn_fail(NULL, sbnUnsupported, "%s", why);
  ncclUniqueId uid;
  memcpy(&uid, id, sizeof uid);
  ncclConfig_t nc = NCCL_CONFIG_INITIALIZER;
  nc.blocking = 0;
  ncclComm_t c = NULL;
  const int64_t deadline = sbn_deadline_in(cfg->timeout_ms);
  ncclResult_t nr = sbn_nccl.CommInitRankConfig(&c, nranks, uid, rank, &nc);
  if (c == NULL) return nccl_fail(NULL, nr == ncclSuccess ? ncclInternalError : nr, "ncclCommInitRankConfig");
  nr = sbn_nccl_settle(nr, &c, 1, deadline, NULL);
  if (nr != ncclSuccess) {
    const sbnResult_t r = nccl_fail(c, nr, "ncclCommInitRankConfig");
    /* local: the peers that came time out alike. NCCL made it on this thread's device */
    abort_alone(c, -1, cfg->timeout_ms);
    return r;
  }
  return nccl_create(c, 1, NULL, cfg, comm);
}

#endif /* SYNCBN_HAVE_NCCL; without NCCL the front's entry points are nccl_none.c's */
