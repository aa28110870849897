/* gpu_util.c — what every file of the GPU backends shares, below the teams: the host's
 * clock for deadlines, a CUDA failure as an sbnResult_t, the host's abort reaching a
 * team's kernels (the stop words) and its NCCL comms, and the list of memory NCCL may
 * still write (sbn_gpu_park). It uses the core and nccl_api.c
 * only: gpu_team.c, gpu_launch.c, gpu_infer.c, nccl_team.c and nccl_wait.c depend on it,
 * and it on none of them (scripts/import-graph.py). */
#include "gpu/gpu_internal.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* Memory NCCL may still write after a call that did not settle (the slot of a comm or a
   window handle, sbn_nccl_settle's rule): never freed, a pointer or a few per timeout,
   but kept reachable from this list, so that a leak checker (LeakSanitizer, valgrind)
   run on the caller's program does not report it as lost. The node is malloc'd (a
   failure leaves the memory unreachable: leaked, as without the list). */
typedef struct parked {
  struct parked* next;
  void* p;
} parked_t;
static parked_t* parked;
static pthread_mutex_t parked_mu = PTHREAD_MUTEX_INITIALIZER;

void sbn_gpu_park(void* p) {
  if (p == NULL) return;
  parked_t* node = malloc(sizeof *node);
  if (node == NULL) return;
  node->p = p;
  pthread_mutex_lock(&parked_mu);
  node->next = parked;
  parked = node;
  pthread_mutex_unlock(&parked_mu);
}

int64_t sbn_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t sbn_deadline_in(int64_t timeout_ms) {
  return sbn_mono_ns() + timeout_ms * 1000000;
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

sbnResult_t sbn_gpu_check_tensors(sbnComm_t comm, const char* who, const sbn_tensor_arg_t* ts,
                                  size_t n, int dev, const char* dev_whose, int strict) {
  for (size_t i = 0; i < n; i++) {
    if (ts[i].p == NULL) continue;
    struct cudaPointerAttributes at;
    memset(&at, 0, sizeof at);
    const cudaError_t e = cudaPointerGetAttributes(&at, ts[i].p);
    if (e != cudaSuccess) { /* the runtime's failure (CUDA 11 and later answer for host memory) */
      (void)cudaGetLastError();
      if (!strict) continue;
      return sbn_fail(comm, sbnCudaError, "%s: cudaPointerGetAttributes(%s): %s", who, ts[i].name,
                      cudaGetErrorString(e));
    }
    if (strict && at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
      return sbn_fail(comm, sbnInvalidArgument,
                      "%s: %s (%p) is not device memory: the op's tensors live on device %d "
                      "(%s); nothing was run",
                      who, ts[i].name, ts[i].p, dev, dev_whose);
    if (at.type == cudaMemoryTypeDevice && at.device != dev)
      return sbn_fail(comm, sbnInvalidArgument,
                      "%s: %s is memory of device %d, but the op runs on device %d (%s): every "
                      "tensor must be on that device; nothing was run",
                      who, ts[i].name, at.device, dev, dev_whose);
  }
  return sbnSuccess;
}

int64_t sbn_gpu_stop_deadline(struct sbn_gpu_team* gt) {
  int64_t d = 0;
  const int64_t mine = sbn_deadline_in(gt->timeout_ms);
  return atomic_compare_exchange_strong(&gt->stop_deadline, &d, mine) ? mine : d;
}

static void nap_20us(void) {
  struct timespec ts = {0, 20000};
  nanosleep(&ts, NULL);
}

sbnResult_t sbn_gpu_init_settle(const struct sbn_gpu_team* gt, cudaStream_t s, int device,
                                int64_t deadline, const _Atomic int* stop) {
  cudaError_t e;
  while ((e = cudaStreamQuery(s)) == cudaErrorNotReady && sbn_mono_ns() < deadline &&
         (stop == NULL || atomic_load(stop) == 0))
    nap_20us();
  if (e == cudaSuccess) return sbnSuccess;
  if (e != cudaErrorNotReady) return sbn_cuda_fail(e, "cudaStreamQuery (the init's zeroing)");
  if (stop != NULL && atomic_load(stop) != 0)
    return sbn_fail(NULL, sbnAborted, "the team's init (its zeroing) was ended by an abort");
  return sbn_fail(NULL, sbnTimeout,
                  "the team's init: device %d did not zero the team's memory within timeout_ms "
                  "(%lld ms): its SMs are held by kernels that do not end (a collective waiting "
                  "for a dead peer, a hung kernel of the program's); no comm was made",
                  device, (long long)gt->timeout_ms);
}

/* The kernels read no host memory on their success path (coop_exchange.cuh,
   "failures"): the host's abort reaches them through each rank's stop word in device
   memory, a 4-byte copy from the abort word (pinned host memory, set first) on the rank's
   own non-blocking stream. A copy engine runs it beside a kernel that fills every SM.
   It is waited for, so that a kernel that starts after this returns (one queued behind
   a stuck collective, a graph replayed after sbnCommAbort) sees it at its start; the
   wait is bounded by the comm's timeout, once for the team's life: the copy is queued
   once (the word, once set, never returns to 0), and every later call (another thread's
   abort, the destroy, sbn_nccl_abort_all) waits for it until the first call's deadline
   (stop_deadline), so that an abort of a device whose copies do not finish returns
   within one timeout, not one per wait. Where a copy cannot be made (a context in an
   error state), a waiting kernel's watcher still reads the abort word itself. Called
   from any thread, also one capturing a graph: relaxed about captures. */
void sbn_gpu_stop_ranks(struct sbn_gpu_team* gt) {
  if (gt->err == NULL) return;
  /* an atomic store: aborts of the team's threads (a host-path op's failure, the
     watchdog, sbnCommAbort) may run at once and store the same word */
  __atomic_store_n(&gt->err[gt->nranks], (int)sbnAborted, __ATOMIC_SEQ_CST);
  if (gt->ranks == NULL) return;
  const int64_t deadline = sbn_gpu_stop_deadline(gt);
  int prev = 0;
  cudaGetDevice(&prev);
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  int unsent = 0;
  for (int q = 0; q < gt->nranks; q++) {
    gpu_rank_t* g = &gt->ranks[q];
    if (!g->present || g->state == NULL) continue; /* nothing of this rank runs here */
    int none = 0; /* queued, or being queued, by an earlier call: not again */
    if (!atomic_compare_exchange_strong(&g->stop_sent, &none, 1)) continue;
    if (g->stop_stream == NULL || cudaSetDevice(g->device) != cudaSuccess ||
        cudaMemcpyAsync(&g->state->stop, (const void*)&gt->err[gt->nranks], sizeof(uint32_t),
                        cudaMemcpyHostToDevice, g->stop_stream) != cudaSuccess) {
      (void)cudaGetLastError();
      atomic_store(&g->stop_sent, 0); /* a later call tries again */
      unsent = 1;
    } else {
      atomic_store(&g->stop_sent, 2);
    }
  }
  for (int q = 0; q < gt->nranks; q++) {
    gpu_rank_t* g = &gt->ranks[q];
    if (!g->present || g->state == NULL) continue;
    while (atomic_load(&g->stop_sent) == 1 && sbn_mono_ns() < deadline) nap_20us();
    if (atomic_load(&g->stop_sent) != 2) {
      unsent = 1;
      continue;
    }
    if (cudaSetDevice(g->device) != cudaSuccess) continue;
    cudaError_t e;
    while ((e = cudaStreamQuery(g->stop_stream)) == cudaErrorNotReady && sbn_mono_ns() < deadline)
      nap_20us();
    if (e != cudaSuccess) unsent = 1;
  }
  (void)cudaGetLastError();
  if (unsent) {
    /* a waiting cooperative kernel still sees the abort word (its watcher, within a
       millisecond); an APPLY queued behind a collective about to be aborted reads only
       its stop word, and may run on the records it has (later ops are refused anyway) */
    sbn_log(SBN_LOG_WARN, "GPU team: the abort could not reach every rank's stop word (a "
                          "CUDA error or a copy that did not finish within the timeout); "
                          "kernels already queued may still run");
  }
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaSetDevice(prev);
}

int sbn_gpu_present_device(const struct sbn_gpu_team* gt) {
  for (int q = 0; gt->ranks != NULL && q < gt->nranks; q++)
    if (gt->ranks[q].present) return gt->ranks[q].device;
  return -1;
}

void sbn_gpu_thread_enter(int device) {
  if (device >= 0 && cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
}

int sbn_gpu_thread_start(pthread_t* th, void* (*fn)(void*), void* arg) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  const int made = pthread_create(th, NULL, fn, arg) == 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return made;
}

#if SYNCBN_HAVE_NCCL
/* ---- ncclCommAbort within a deadline ------------------------------------------------- */
/* ncclCommAbort frees the comm's device memory, which waits for the whole device: behind a
   kernel of the program's that never ends (another library's collective waiting for a dead
   peer), for ever. So the library aborts comms on a thread of its own (every signal
   blocked), which the caller waits for until a deadline; past it the thread goes on alone.
   A team's abort (sbn_nccl_abort_all) waits until the abort's deadline
   (sbn_gpu_stop_deadline: the first abort's time plus timeout_ms, once for the team's
   life), and the team's release waits for such threads before it frees anything NCCL may
   still touch in them (sbn_nccl_aborts_wait). A failed init's comms are aborted the same
   way (sbn_nccl_abort_comms), given timeout_ms from their abort (a split's child stuck in
   its init, the team's abort's deadline: that abort follows). */
typedef struct {
  ncclComm_t comms[SBN_GPU_MAX_RANKS];
  int n;
  int device;          /* made current first (-1: none): NCCL's abort restores the thread's device
                          at its end, CUDA's default device 0 on a new thread, whose context that
                          would make */
  int done, abandoned; /* under abort_mu */
  struct sbn_gpu_team* gt; /* whose aborts_running counts this thread, or NULL */
} aborter_t;
static pthread_mutex_t abort_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t abort_cv; /* CLOCK_MONOTONIC; every abort thread's end */
static pthread_once_t abort_once = PTHREAD_ONCE_INIT;
static int abort_cv_ok;

static void abort_cv_init(void) {
  abort_cv_ok = sbn_cond_init_monotonic(&abort_cv);
}

static void* aborter_main(void* arg) {
  aborter_t* a = arg;
  sbn_gpu_thread_enter(a->device); /* (relaxed about captures, as its caller was) */
  for (int i = 0; i < a->n; i++)
    if (a->comms[i] != NULL) sbn_nccl.CommAbort(a->comms[i]);
  pthread_mutex_lock(&abort_mu);
  a->done = 1;
  /* gt is not touched after the unlock: its release may free it */
  if (a->gt != NULL) a->gt->aborts_running--;
  const int abandoned = a->abandoned;
  pthread_cond_broadcast(&abort_cv);
  pthread_mutex_unlock(&abort_mu);
  if (abandoned) free(a);
  return NULL;
}

/* ncclCommAbort of comms[0..n-1] (n <= SBN_GPU_MAX_RANKS) on a thread on `device`, waited
   for until the deadline; gt (or NULL) counts the thread until it returns. */
static void abort_within(struct sbn_gpu_team* gt, const ncclComm_t* comms, int n, int device,
                         int64_t deadline) {
  if (n == 0) return;
  pthread_once(&abort_once, abort_cv_init);
  aborter_t* a = abort_cv_ok ? calloc(1, sizeof *a) : NULL;
  pthread_t th;
  int made = a != NULL;
  if (made) {
    memcpy(a->comms, comms, (size_t)n * sizeof *comms);
    a->n = n, a->gt = gt, a->device = device;
    pthread_mutex_lock(&abort_mu);
    if (gt != NULL) gt->aborts_running++;
    pthread_mutex_unlock(&abort_mu);
    made = sbn_gpu_thread_start(&th, aborter_main, a);
    if (!made) {
      pthread_mutex_lock(&abort_mu);
      if (gt != NULL) gt->aborts_running--;
      pthread_cond_broadcast(&abort_cv);
      pthread_mutex_unlock(&abort_mu);
      free(a);
    }
  }
  if (!made) { /* no thread: on this one, unbounded, as before */
    for (int i = 0; i < n; i++)
      if (comms[i] != NULL) sbn_nccl.CommAbort(comms[i]);
    return;
  }
  pthread_mutex_lock(&abort_mu);
  while (!a->done && sbn_mono_ns() < deadline) {
    const struct timespec until = {(time_t)(deadline / 1000000000), (long)(deadline % 1000000000)};
    pthread_cond_timedwait(&abort_cv, &abort_mu, &until);
  }
  const int done = a->done;
  if (!done) a->abandoned = 1;
  pthread_mutex_unlock(&abort_mu);
  if (done) {
    pthread_join(th, NULL);
    free(a);
  } else {
    pthread_detach(th);
    /* (also in a release whose abort came long after the first: it then waits for the
       thread itself, sbn_nccl_aborts_wait) */
    sbn_log(SBN_LOG_WARN,
            "ncclCommAbort has not returned by its deadline (a kernel that never ends holds "
            "the device?); it goes on in a thread of the library");
  }
}

void sbn_nccl_abort_comms(struct sbn_gpu_team* gt, const ncclComm_t* comms, int n, int device,
                          int64_t deadline_ns) {
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    device = -1;
  }
  for (int i = 0; i < n; i += SBN_GPU_MAX_RANKS)
    abort_within(gt, comms + i, n - i < SBN_GPU_MAX_RANKS ? n - i : SBN_GPU_MAX_RANKS, device,
                 deadline_ns);
}

void sbn_nccl_aborts_wait(struct sbn_gpu_team* gt) {
  pthread_once(&abort_once, abort_cv_init);
  pthread_mutex_lock(&abort_mu);
  while (gt->aborts_running > 0) pthread_cond_wait(&abort_cv, &abort_mu);
  pthread_mutex_unlock(&abort_mu);
}
#endif

void sbn_nccl_abort_all(struct sbn_gpu_team* gt) {
#if SYNCBN_HAVE_NCCL
  if (gt->nccl == NULL || atomic_load(&gt->nccl_dead)) return;
  sbn_gpu_stop_ranks(gt); /* first: the APPLYs queued behind the collective write nothing */
  /* The comms are taken out under the write lock (no call is using them then, and none
     uses them after: nccl_dead) and aborted after it: an ncclCommAbort that blocks (it
     frees device memory, which can wait behind a stuck kernel) then holds up this caller
     only, not every later op and sbnCommAbort waiting for the lock. */
  ncclComm_t dead[SBN_GPU_MAX_RANKS];
  int ndead = 0;
  if (gt->nccl_lock_ok) pthread_rwlock_wrlock(&gt->nccl_lock);
  if (!atomic_exchange(&gt->nccl_dead, 1))
    for (int q = 0; q < gt->nranks; q++)
      if (gt->nccl[q]) { /* this process's comms: at most SBN_GPU_MAX_RANKS (one per GPU) */
        if (ndead < SBN_GPU_MAX_RANKS) dead[ndead++] = gt->nccl[q];
        else sbn_nccl.CommAbort(gt->nccl[q]);
        gt->nccl[q] = NULL;
      }
  if (gt->nccl_lock_ok) pthread_rwlock_unlock(&gt->nccl_lock);
  if (ndead > 0)
    abort_within(gt, dead, ndead, sbn_gpu_present_device(gt), sbn_gpu_stop_deadline(gt));
#else
  (void)gt;
#endif
}

/* ---- the host path's ops in flight (sbn_watch_t) --------------------------------------- */
sbnResult_t sbn_watch_grow(sbn_watch_t* w, int to) {
  sbn_watch_slot_t* more = w->slot == NULL ? calloc((size_t)to, sizeof *more)
                                           : realloc(w->slot, (size_t)to * sizeof *more);
  if (more == NULL)
    return sbn_fail(NULL, sbnSystemError, "out of host memory (the host path's watch)");
  w->slot = more;
  while (w->n < to) {
    sbn_watch_slot_t* sl = &w->slot[w->n];
    *sl = (sbn_watch_slot_t){0};
    if (cudaEventCreateWithFlags(&sl->start, cudaEventDisableTiming) != cudaSuccess) break;
    if (cudaEventCreateWithFlags(&sl->done, cudaEventDisableTiming) != cudaSuccess) {
      cudaEventDestroy(sl->start);
      break;
    }
    w->n++;
  }
  (void)cudaGetLastError();
  if (w->n == to) return sbnSuccess;
  return sbn_fail(NULL, sbnCudaError, "cudaEventCreate failed (the host path's watch)");
}

/* A free slot of w, else one whose op has ended (freed here), else -1 (w->mu held). */
static int watch_free_slot(sbn_watch_t* w) {
  for (int i = 0; i < w->n; i++)
    if (w->slot[i].state == SBN_WATCH_FREE) return i;
  int found = -1;
  for (int i = 0; i < w->n; i++)
    if (w->slot[i].state == SBN_WATCH_ARMED &&
        cudaEventQuery(w->slot[i].done) != cudaErrorNotReady) {
      w->slot[i].state = SBN_WATCH_FREE; /* (a failure shows in the error words) */
      if (found < 0) found = i;
    }
  (void)cudaGetLastError();
  return found;
}

sbnResult_t sbn_watch_take(struct sbn_gpu_team* gt, gpu_rank_t* g, const _Atomic int* stop,
                           int* slot, cudaEvent_t ev[2]) {
  sbn_watch_t* w = &g->watch;
  const int64_t deadline = sbn_deadline_in(gt->timeout_ms);
  /* its queries relaxed about another thread's graph capture (the watchdog's are) */
  const enum cudaStreamCaptureMode mode = sbn_capture_relaxed();
  sbnResult_t r = sbnSuccess;
  pthread_mutex_lock(&w->mu);
  int i = watch_free_slot(w);
  if (i < 0 && w->n < SBN_WATCH_MAX) {
    const int n0 = w->n;
    r = sbn_watch_grow(w, w->n * 2 < SBN_WATCH_MAX ? w->n * 2 : SBN_WATCH_MAX);
    if (w->n > n0) r = sbnSuccess, i = n0; /* (those it made will do) */
  }
  /* SBN_WATCH_MAX ops in flight: as CUDA's own launch queue does when full, wait for one
     to end (bounded: a stuck one is the watchdog's, whose abort ends this wait) */
  while (r == sbnSuccess && i < 0) {
    pthread_mutex_unlock(&w->mu);
    if (atomic_load(&gt->nccl_dead) || atomic_load(stop) != sbnSuccess)
      r = sbn_fail(NULL, sbnAborted, "the team's NCCL comms were aborted");
    else if (sbn_mono_ns() >= deadline)
      r = sbn_fail(
          NULL, sbnTimeout,
          "rank %d has %d host-path ops in flight, and none ended within timeout_ms (%lld ms)",
          (int)(g - gt->ranks), SBN_WATCH_MAX, (long long)gt->timeout_ms);
    else {
      struct timespec ts = {0, 1000000}; /* 1 ms */
      nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&w->mu);
    if (r == sbnSuccess) i = watch_free_slot(w);
  }
  if (i >= 0) {
    w->slot[i].state = SBN_WATCH_TAKEN;
    w->slot[i].started_ns = 0;
    *slot = i;
    ev[0] = w->slot[i].start; /* (the array may move when another op's take grows it) */
    ev[1] = w->slot[i].done;
  }
  pthread_mutex_unlock(&w->mu);
  sbn_capture_restore(mode);
  return r;
}

void sbn_watch_put(gpu_rank_t* g, int slot, int armed) {
  pthread_mutex_lock(&g->watch.mu);
  g->watch.slot[slot].state = armed ? SBN_WATCH_ARMED : SBN_WATCH_FREE;
  pthread_mutex_unlock(&g->watch.mu);
}
