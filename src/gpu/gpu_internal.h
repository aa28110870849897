/* gpu_internal.h — what the GPU backend's files share: the device resources of a team
 * (gpu_team.c), its transport, the launches (gpu_launch.c), NCCL teams (nccl_team.c), what
 * all of them share below (gpu_util.c) and the kernels' entry points. Only included in
 * builds with CUDA. */
#ifndef SYNCBN_GPU_INTERNAL_H_
#define SYNCBN_GPU_INTERNAL_H_

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#if SYNCBN_HAVE_NCCL
#include "gpu/nccl_api.h" /* NCCL's types; its functions through sbn_nccl */
#else
#define SBN_NCCL_DEVICE_API 0
#endif

#include "coop_args.h"
#include "coop_plan.h"
#include "gpu/gpu.h"

/* kernels/coop.cu: the kernels' addresses are declared in coop_args.h */
#if SBN_NCCL_DEVICE_API
/* Ranks of comm's load/store-accessible team; team_lsa is sbn_nccl.TeamLsa. */
int sbn_nccl_lsa_size(void* comm, void (*team_lsa)(void)) SBN_INTERNAL;
cudaError_t sbn_gpu_notify_launch(const void* win, int64_t fail_off, int rank, int nranks,
                                  int code, cudaStream_t stream) SBN_INTERNAL;
#endif

/* How a team's ranks exchange their records: sbnCommGetTransport's names. Chosen once,
   at init (gpu_team.c, nccl_team.c). Every transport but nccl-host has an in-kernel path
   (the cooperative kernel reads and writes the mailboxes); how an op runs, its
   algorithm (SBN_ALGO_*), is chosen per call among those the transport allows. */
typedef enum {
  SBN_TR_VIRTUAL = 0,     /* "virtual": every rank on one device, one launch for all */
  SBN_TR_PEER = 1,        /* "peer": a rank per GPU, mailboxes in device memory (P2P) */
  SBN_TR_PEER_HOST = 2,   /* "peer-pinned-host": mailboxes in pinned, mapped host memory */
  SBN_TR_NCCL_WINDOW = 3, /* "nccl-lsa": a process per rank, mailboxes in an NCCL window */
  SBN_TR_NCCL_COLL = 4    /* "nccl-host": a process per rank, NCCL collectives only */
} sbn_transport_t;

/* How a GPU team's op runs, chosen per call by the environment variable SBN_ALGO:
   "coop" (default: one cooperative kernel) or "nccl" (the host-driven path: stats,
   collective, apply, as PyTorch does); a transport without an in-kernel path takes the
   host path. */
enum { SBN_ALGO_COOP = 0, SBN_ALGO_HOST = 1 };

/* The host path's ops of one rank in flight (NCCL comms), which the watchdog times
   (host_watchdog): a slot per op, its `start` event recorded on the op's stream before its
   first kernel and its `done` event after its APPLY. An op is timed from when the watchdog
   first finds its start done (the work queued ahead of it on its stream has finished: a
   long queue is not a stuck peer), and every op in flight is watched (a stuck collective
   is found while the host goes on issuing ops behind it, or on other streams). */
enum { SBN_WATCH_FREE = 0, SBN_WATCH_TAKEN = 1, SBN_WATCH_ARMED = 2 };
enum {
  SBN_WATCH_FIRST = 4, /* slots made at the init */
  SBN_WATCH_MAX = 1024 /* at most (more ops in flight: the launch waits for one to end) */
};
typedef struct {
  cudaEvent_t start, done;
  int64_t started_ns; /* CLOCK_MONOTONIC ns the watchdog first found `start` done (0: not yet) */
  int state;          /* SBN_WATCH_FREE; _TAKEN: its launch under way (the launching thread's,
                         never queried); _ARMED: both recorded, an op in flight */
} sbn_watch_slot_t;
typedef struct {
  pthread_mutex_t mu; /* the slots, their states and started_ns */
  int mu_ok;
  sbn_watch_slot_t* slot;
  int n; /* slots made (each with both events) */
} sbn_watch_t;

typedef struct {
  int present; /* the rank lives in this process (NCCL teams: only `local`) */
  int device;
  int share; /* ranks of this team on this device */
  int sms;
  /* blocks per SM of every cooperative kernel: [epi][kind][dtype][tile][vec][variant] (0:
     not built; epi: SBN_EPI_*, the plain kernels and the epilogue's), the onchip ones with
     their dynamic shared memory */
  int occ[SBN_EPI_KINDS][SBN_OP_KINDS][SBN_DTYPE_COUNT][2][2][SBN_VAR_COUNT];
  int occ_min; /* the lowest of the stream ones of every kind (ranks sharing a GPU: their
                  G whatever their op's epilogue) */
  int occ_max; /* the highest of them all but the small kernels' (the workspace is sized
                  by it; they use none) */
  int hold_slots[SBN_EPI_KINDS][SBN_OP_KINDS][SBN_DTYPE_COUNT][2]; /* onchip: shared-memory batches
                                                          per thread [epi][kind][dtype][tile] */
  sbn_rank_state_t* state;
  float* part;
  sbn_mail_rec_t* mail; /* NCCL teams: this rank's part of the window */
  sbn_mail_rec_t* send; /* host path: this rank's records [chunk] */
  sbn_mail_rec_t* recv; /* host path: every rank's records [src][chunk] */
  cudaEvent_t ev;
  cudaStream_t stop_stream;    /* non-blocking: the abort's copy into state->stop runs here,
                                  beside the rank's kernels (sbn_gpu_stop_ranks); before it,
                                  the init's zeroing of the rank's memory */
  _Atomic int stop_sent;       /* ... that copy: 0 not queued, 1 being queued, 2 queued (once
                                  for the team's life: the word, once set, never returns to 0) */
  sbn_watch_t watch;           /* host path with NCCL: the ops in flight, for the watchdog */
  /* an op of this rank was launched under a CUDA graph capture: from then on its ops carry
     no call number (gpu_launch.c: gpu_sig; its replays do not pass through the host, so
     its count cannot follow them) */
  _Atomic int graphed;
} gpu_rank_t;

struct sbn_gpu_team {
  int nranks;
  int nchunks_max;
  sbn_transport_t transport;
  volatile int* err; /* nranks + 1 words, pinned + mapped; also the device pointer (UVA).
                        Host threads read and write them with __atomic builtins only: the
                        team's threads may abort at once */
  gpu_rank_t* ranks; /* [nranks]; NCCL teams: only ranks[local] is present */
  int64_t timeout_ms;
#if SYNCBN_HAVE_NCCL
  ncclComm_t* nccl; /* host path: a comm per rank (ncclCommInitAll; NCCL teams: the team's
                       own duplicate at [local]), or NULL */
  ncclComm_t* split_slot; /* NCCL teams: the slot NCCL writes each sbnCommSplit's child
                             into, made at the init (nccl_team.c: a split allocates nothing
                             before its collective), freed at the release */
  int split_unsettled;    /* ... a split did not settle: NCCL may still write the slot
                             until the comm is aborted (no split uses it again; its child,
                             where a late peer let NCCL make it, aborted at the release) */
#endif
  char nccl_why[320];    /* why there is no NCCL comm (NCCL teams: why "nccl-host") */
  _Atomic int nccl_dead; /* the NCCL comms were aborted (timeout) */
  int aborts_running;    /* threads still aborting the team's comms (sbn_nccl_abort_all's, a
                            failed host-path init's: sbn_nccl_abort_comms; under gpu_util.c's
                            abort lock; sbn_nccl_aborts_wait) */
  int init_failed;       /* NCCL teams: the init failed, its peers maybe inside a collective
                            with this rank: the release aborts the comm (nccl_release), on
                            the release thread (ncclCommAbort frees device memory) */
  /* The end of the abort's waits (CLOCK_MONOTONIC ns; 0: no abort yet): the first abort's
     time plus timeout_ms, for every wait of every later abort and of the destroy
     (sbn_gpu_stop_deadline), so that a copy that does not land costs one timeout in all */
  _Atomic int64_t stop_deadline;
  void* releaser;            /* the destroy's release record while a release thread frees the team
                                (sbn_gpu_team_release), else NULL */
  _Atomic int host_captured; /* a host-path op was launched under a graph capture: its
                                replays are not watched, so a collective may be pending */
  _Atomic int host_stuck; /* a collective's wait (a host-path op's, a split's) was ended by
                             the team's abort before NCCL finished it: it may still wait */
  /* The NCCL comms are nonblocking: an issue sequence (group of collectives, until NCCL
     has taken it) holds nccl_lock for reading, bounded by the timeout; aborting takes it
     for writing, so no comm is freed under a call. */
  pthread_rwlock_t nccl_lock;
  int nccl_lock_ok;
  pthread_t watchdog; /* polls the host path's launches (host_watchdog) while the team lives */
  int watchdog_ok;
  _Atomic int watchdog_stop;
  /* NCCL teams (nccl_team.c) */
  int local;  /* the rank in this process; -1 for the other teams */
  void* win_buf;    /* ncclMemAlloc: this rank's part of the window (NULL: none) */
  size_t win_bytes; /* sbn_window_bytes */
  void* win;        /* ncclWindow_t, registered (NULL: none) */
  void* win_slot;   /* the heap slot NCCL writes the window's handle into (window_alloc,
                       before the agreement on it; NULL again once read, never freed after
                       a registration that did not finish (sbn_gpu_park), freed at the
                       release if unused) */
  cudaStream_t aux; /* init collectives, abort notification */
  _Atomic int abort_notified; /* ... that notification queued (nccl_abort: once) */
  int* dscratch;    /* init agreement (nccl_team.c): SBN_AGREE_MAX ints of device memory, */
  int* hscratch;    /* and as many of pinned host memory */
};

static inline struct sbn_gpu_team* sbn_gpu(const sbn_team_t* t) {
  return (struct sbn_gpu_team*)t->impl;
}
static inline int sbn_mail_on_host(const struct sbn_gpu_team* gt) {
  return gt->transport == SBN_TR_PEER_HOST;
}
/* Whether the cooperative kernel can exchange through the transport (all but nccl-host). */
static inline int sbn_transport_in_kernel(sbn_transport_t tr) { return tr != SBN_TR_NCCL_COLL; }
static inline int sbn_aligned16(const void* p) { return ((uintptr_t)p & 15u) == 0; }

/* Which kernels a launch of the round's ops takes (SBN_EPI_*): kernels/coop_args.h's rule
   (sbn_epi_of), as sbn_args_epilogue applies it to the arguments fill_args makes of them. */
static inline int sbn_gpu_round_epi(const sbn_op_t* const* ops, int nops) {
  int rec = 0, act = 0;
  for (int i = 0; i < nops; i++) {
    const sbn_op_t* o = ops[i];
    const int recover = o->kind == SBN_OP_BACKWARD && o->x == NULL && o->y != NULL;
    rec |= recover && o->desc.n > 0;
    act |= sbn_op_uses_epilogue(o);
  }
  return sbn_epi_of(rec, act);
}

/* Relaxed about other threads' CUDA graph captures until sbn_capture_restore: while a
   thread captures in global mode (PyTorch's default), CUDA refuses the "potentially
   unsafe" calls of every thread not in relaxed mode (allocations and frees,
   synchronizations, stream and event queries) and invalidates that capture. The abort and
   the destroy make such calls, from whatever thread calls them. */
static inline enum cudaStreamCaptureMode sbn_capture_relaxed(void) {
  enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&m);
  return m;
}
static inline void sbn_capture_restore(enum cudaStreamCaptureMode m) {
  cudaThreadExchangeStreamCaptureMode(&m);
}

/* ---- gpu_util.c: below the teams, shared by every GPU file -------------------------- */
/* CLOCK_MONOTONIC in nanoseconds: the host's deadlines. */
SBN_INTERNAL int64_t sbn_mono_ns(void);
/* The deadline timeout_ms from now, on sbn_mono_ns's clock (no overflow: config.c clamps
   timeout_ms to ~100 years). */
SBN_INTERNAL int64_t sbn_deadline_in(int64_t timeout_ms);
/* Keeps p (memory NCCL may still write: never freed) reachable for leak checkers. */
SBN_INTERNAL void sbn_gpu_park(void* p);
/* Records a CUDA failure (sbnUnsupported without a device, driver or kernel image for
   the device, else sbnCudaError). */
SBN_INTERNAL sbnResult_t sbn_cuda_fail(cudaError_t e, const char* what);
/* The host's abort reaches the kernels: err[nranks] = sbnAborted, then every present
   rank's stop word (device memory) through its stop_stream, waited for (bounded); where
   that fails, it says so at SBN_DEBUG=WARN. */
SBN_INTERNAL void sbn_gpu_stop_ranks(struct sbn_gpu_team* gt);
/* A thread of the library that may outlive the call that starts it (a release's, an
   abort's): every signal blocked in it, so that none of the program's is delivered there.
   1 if it was made. */
SBN_INTERNAL int sbn_gpu_thread_start(pthread_t* th, void* (*fn)(void*), void* arg);
/* The first present rank's device, -1 where no rank is present. */
SBN_INTERNAL int sbn_gpu_present_device(const struct sbn_gpu_team* gt);
/* A library thread's first step: `device` current (-1: none made current), and relaxed
   about graph captures (its queries and frees must not invalidate a graph another thread
   captures). CUDA's default device on a new thread is 0: a call that needs a context
   there, cudaSetDevice(0) included, makes device 0's primary context (~0.5 GB) in a
   process whose team is on another GPU. */
SBN_INTERNAL void sbn_gpu_thread_enter(int device);
/* The team's abort deadline (stop_deadline), set by the first call: now + timeout_ms. */
SBN_INTERNAL int64_t sbn_gpu_stop_deadline(struct sbn_gpu_team* gt);
/* The init's wait for its own work on device `device` (the zeroing of the team's memory,
   queued on stream s): until deadline (CLOCK_MONOTONIC ns) at most, never for the
   device's other work, as cudaDeviceSynchronize would (a kernel of the program's that
   never ends); *stop, where given, ends it as the timeout does (a split's parent team
   aborted). sbnSuccess; a CUDA failure; sbnTimeout or sbnAborted, the detail on the
   thread. */
SBN_INTERNAL sbnResult_t sbn_gpu_init_settle(const struct sbn_gpu_team* gt, cudaStream_t s,
                                             int device, int64_t deadline, const _Atomic int* stop);
/* One tensor argument of an op: its pointer (NULL: not given) and its name in messages. */
typedef struct {
  const void* p;
  const char* name;
} sbn_tensor_arg_t;
/* sbnSuccess when each given tensor of ts[n] is memory of device dev, else the first
   failure, recorded for comm (NULL: the thread) as "who: name ..." (one
   cudaPointerGetAttributes each; a failed query's error is cleared). Another device's
   memory: sbnInvalidArgument, the message saying whose device dev is (dev_whose). strict
   (the training ops) also refuses host memory (sbnInvalidArgument) and a failed query
   (sbnCudaError); without it both pass (the inference kernel reads a mapped pointer). */
SBN_INTERNAL sbnResult_t sbn_gpu_check_tensors(sbnComm_t comm, const char* who,
                                               const sbn_tensor_arg_t* ts, size_t n, int dev,
                                               const char* dev_whose, int strict);
/* Aborts the team's NCCL comms once (a collective stuck on a missing peer returns); first
   the host's abort word, so that kernels queued behind the collective write nothing. Not
   with nccl_lock held. ncclCommAbort runs on a thread of the library, waited for until
   the abort's deadline (sbn_gpu_stop_deadline): it frees device memory, which waits for
   the whole device. */
SBN_INTERNAL void sbn_nccl_abort_all(struct sbn_gpu_team* gt);
/* Waits (no bound: the release's thread) until every thread of sbn_nccl_abort_all's for
   the team has returned from ncclCommAbort (which unmaps an NCCL team's window). */
SBN_INTERNAL void sbn_nccl_aborts_wait(struct sbn_gpu_team* gt);

/* ---- gpu_team.c: resources, error words, the tables' other entries ------------------ */
/* Starts the watchdog thread of a team with NCCL comms (and its lock); safe before the
   team's first launch (it watches launches only), so an NCCL team starts it before its
   agreements. On failure sbn_gpu_team_free releases what it made. */
SBN_INTERNAL sbnResult_t sbn_gpu_watchdog_start(struct sbn_gpu_team* gt);
/* Occupancy of every kernel on device dev (current), into g; loads every kernel. */
SBN_INTERNAL sbnResult_t sbn_gpu_query_device(gpu_rank_t* g, int dev);
/* A rank's device state (state, workspace, host-path records for a team of nranks,
   events) on its device (current); its mailbox too when `mail` (device or pinned host
   memory per the transport). Zeroed on the rank's stop_stream: the init waits for it
   (sbn_gpu_init_settle) before the team is used. */
SBN_INTERNAL sbnResult_t sbn_gpu_rank_alloc(struct sbn_gpu_team* gt, gpu_rank_t* g,
                                            int64_t max_channels, int mail);
/* 1 when a host-path op of some rank (its APPLY after an ncclAllGather) was launched and
   has not completed, or was ever captured in a graph (a replay is not watched): a
   collective that may wait for a peer that does not come. */
SBN_INTERNAL int sbn_gpu_host_pending(struct sbn_gpu_team* gt);
/* ---- gpu_util.c: the host path's ops in flight (sbn_watch_t; host_watchdog reads them) */
/* More slots of w, `to` in all (w->mu held, or the init's; the rank's device current): an
   sbn_fail's result where it fails (no host memory; an event not made), the slots made so
   far kept. */
SBN_INTERNAL sbnResult_t sbn_watch_grow(sbn_watch_t* w, int to);
/* A free watch slot of rank g for a host-path op about to launch (current device: g's),
   into *slot and its events into ev[0] (start) and ev[1] (done), SBN_WATCH_TAKEN: a free
   one, else one whose op has ended, else a new one (up to SBN_WATCH_MAX; at the most, it
   waits for an op to end until timeout_ms, the team's abort (*stop) or its comms' abort).
   Nothing is launched before it. */
SBN_INTERNAL sbnResult_t sbn_watch_take(struct sbn_gpu_team* gt, gpu_rank_t* g,
                                        const _Atomic int* stop, int* slot, cudaEvent_t ev[2]);
/* The taken slot's op is launched, both events recorded (`armed`: the watchdog watches it
   from now, and times it from its start), or it was not (the slot is free again). */
SBN_INTERNAL void sbn_watch_put(gpu_rank_t* g, int slot, int armed);
/* Whether an aborted (`aborted`) team's NCCL comms are aborted now, before its devices are
   idle: where a host-path collective is pending (`pending`, sbn_gpu_host_pending: it
   could wait forever), or where no kernel writes through memory the comm maps. An
   "nccl-lsa" team's kernels write their peers' mailboxes and failure words through the
   window, which the comm's abort unmaps: otherwise its comm is aborted at the release,
   after the device sync. */
static inline int sbn_gpu_abort_comms_now(const struct sbn_gpu_team* gt, int aborted, int pending) {
  return pending || (aborted && gt->transport != SBN_TR_NCCL_WINDOW);
}
/* Frees a team's GPU part (waits for its devices to be idle). release (NULL: none) is
   the kind of team's own part (NCCL teams: the window and the team's comm), called once
   the watchdog has stopped and a stuck collective was aborted, before the devices' memory
   is freed. */
SBN_INTERNAL void sbn_gpu_team_free(struct sbn_gpu_team* gt, int aborted,
                                    void (*release)(struct sbn_gpu_team* gt, int aborted));
/* The destroy's sbn_gpu_team_free: run on a thread of its own (signals blocked), which the
   call waits for until the release's budget runs out: timeout_ms from the call, moved by
   sbn_gpu_release_budget around the release's own bounded steps. sbnSuccess when it
   finished; else sbnTimeout (the detail on the thread, naming the devices): the thread
   goes on alone and frees the team when the devices finish (a kernel that never ends
   keeps it for ever). Without a thread (pthread_create failed), sbn_gpu_team_free on this
   one. */
SBN_INTERNAL sbnResult_t sbn_gpu_team_release(struct sbn_gpu_team* gt, int aborted,
                                              void (*release)(struct sbn_gpu_team* gt,
                                                              int aborted));
/* A failed init's release of what it made (gt->timeout_ms set): sbn_gpu_team_release's,
   bounded as a destroy is (freeing device memory waits for the whole device), with the
   init's own failure kept on the thread where the release ran out of time. */
SBN_INTERNAL void sbn_gpu_init_undo(struct sbn_gpu_team* gt,
                                    void (*release)(struct sbn_gpu_team* gt, int aborted));
/* The destroy waits for the release until from_ns + timeout_ms (CLOCK_MONOTONIC ns):
   called before a step of the release that a deadline of its own bounds (from_ns: that
   deadline), and after it (from_ns: now), so that each step gets its bound and each wait
   for the devices timeout_ms. Nothing outside a release thread (gt->releaser NULL). */
SBN_INTERNAL void sbn_gpu_release_budget(struct sbn_gpu_team* gt, int64_t from_ns);
/* The releases that outlived their destroy and are still running (tests). */
SBN_INTERNAL int sbn_gpu_releases_pending(void);
/* Table entries shared by every GPU team. detach and abort are the in-process teams';
   an NCCL team's own (nccl_team.c) call them and do its part. */
SBN_INTERNAL sbnResult_t sbn_gpu_detach(sbn_team_t* team);
SBN_INTERNAL sbnResult_t sbn_gpu_poll(const sbn_team_t* team);
/* The failure the team's error words hold (kernels', or a peer's pushed through the
   window; the cause before the sbnAborted of the ranks it aborted), sbnSuccess if none:
   sbn_gpu_poll's, without its watchdog. */
SBN_INTERNAL sbnResult_t sbn_gpu_err_words(const struct sbn_gpu_team* gt);
/* The host's abort reaches this process's kernels (sbn_gpu_stop_ranks). */
SBN_INTERNAL void sbn_gpu_abort(sbn_team_t* team);
SBN_INTERNAL const char* sbn_gpu_transport(const sbn_team_t* team);

/* ---- gpu_launch.c: the ops ---------------------------------------------------------- */
/* The SMs a rank's grid may fill on a device of `sms` SMs: all but `margin`
   (SBN_SM_MARGIN), never fewer than half the device. Unset (margin -1), a team whose
   ranks wait in-kernel for other GPUs (`spans`) leaves SBN_DEFAULT_SM_MARGIN free, so
   that a kernel that blocks on another GPU, such as an NCCL collective of DDP on another
   stream, finds room beside a grid that waits for the peers (docs/USAGE.md, "Beside NCCL
   collectives"); any other team fills the device. Set, every team leaves that many free
   (the host path plans with it too: the same G, the same bits as the cooperative
   kernel). */
#define SBN_DEFAULT_SM_MARGIN 32
SBN_INTERNAL int sbn_gpu_usable_sms(int sms, int spans, int margin);
/* The stop words a failing kernel on device `dev` sets (coop_args.h: stop, nstop), into
   stop[0..SBN_GPU_MAX_RANKS); returns how many: every present rank of an in-process team
   on dev (on any device for virtual and peer teams), the rank itself in an NCCL team,
   whatever its rank number (an NCCL team may have more ranks than the array). */
SBN_INTERNAL int sbn_gpu_stop_words(const struct sbn_gpu_team* gt, int dev, uint32_t** stop);
/* At the call: device pointers of the rank's device, SBN_ALGO (forced to the host path
   where the transport has no in-kernel path), SBN_KERNEL; a virtual team of several
   ranks only in a group. */
SBN_INTERNAL sbnResult_t sbn_gpu_prepare(sbn_op_t* op, int in_group);
/* A round of n ops (every local rank, or one op outside a group) can run together: same
   op, same path, streams of ranks sharing a GPU, the host path's needs, a global count
   other than 1 for a forward of the whole team. Synchronous errors, nothing run. */
SBN_INTERNAL sbnResult_t sbn_gpu_check(const sbn_op_t* const* round, int n);
/* Issues a round: a virtual team's (and the host path's) as one launch sequence, a peer
   team's as one launch per rank. Asynchronous on the ops' streams. */
SBN_INTERNAL sbnResult_t sbn_gpu_run(const sbn_op_t* const* round, int n, int* failed);

/* The table of a kind of GPU team: they differ in name, attach and split, and NCCL teams
   in detach and abort (sbn_gpu_detach and sbn_gpu_abort, then their window, comm and the
   other processes). The GPU files reach an NCCL team's part through its table only. */
#define SBN_GPU_TEAM_OPS(label, attach_fn, detach_fn, abort_fn, split_fn)                    \
  {.name = label, .threaded = 0, .attach = attach_fn, .detach = detach_fn,                   \
   .prepare = sbn_gpu_prepare, .check = sbn_gpu_check, .run = sbn_gpu_run,                   \
   .poll = sbn_gpu_poll, .abort = abort_fn, .split = split_fn,                               \
   .transport = sbn_gpu_transport, .epilogue = 1}

#if SYNCBN_HAVE_NCCL
/* ---- nccl_wait.c ---------------------------------------------------------------------- */
/* The rule every NCCL call on a comm goes through (nccl_wait.c says why): r is what the
   call returned; unless it is an error other than ncclInProgress, waits until each
   non-NULL comms[0..n-1] is no longer in progress. The first failure, ncclInProgress when
   deadline_ns (CLOCK_MONOTONIC) passed first or *stop became non-zero (a team's
   abort_reason: sbnCommAbort ends the wait at once; NULL: no such word), or ncclSuccess. */
SBN_INTERNAL ncclResult_t sbn_nccl_settle(ncclResult_t r, const ncclComm_t* comms, int n,
                                          int64_t deadline_ns, const _Atomic int* stop);
/* ncclCommAbort of comms[0..n-1] (NULLs skipped), as sbn_nccl_abort_all's: on a
   thread of the library, on `device` (-1: the caller's current device, where NCCL made a
   comm of this thread), waited for until deadline_ns (CLOCK_MONOTONIC: a failed init's
   comms, timeout_ms from their abort), past which it goes on alone (their abort waits for
   the device, behind a kernel that never ends). gt (or NULL) counts the threads that its
   release waits for (sbn_nccl_aborts_wait). */
SBN_INTERNAL void sbn_nccl_abort_comms(struct sbn_gpu_team* gt, const ncclComm_t* comms, int n,
                                       int device, int64_t deadline_ns);
#endif

#define CU(call, what)                                \
  do {                                                \
    cudaError_t e_ = (call);                          \
    if (e_ != cudaSuccess) {                          \
      r = sbn_cuda_fail(e_, what);                    \
      goto out;                                       \
    }                                                 \
  } while (0)

#endif /* SYNCBN_GPU_INTERNAL_H_ */
