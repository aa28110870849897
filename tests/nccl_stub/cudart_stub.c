/* cudart_stub.c — a stand-in CUDA runtime for running libsyncbn's GPU host code on a
 * machine without a GPU (test_nccl_stub): exactly the runtime calls that libsyncbn, the
 * NCCL stand-in and the test make, and the entry points nvcc's generated code calls at
 * load time to register kernels/coop.cu's fat binary.
 *
 * What it models: CUDA_STUB_DEVICES devices (default 2) that support cooperative
 * launches; device memory is host memory (malloc, poisoned) remembered with its device, so
 * cudaPointerGetAttributes tells device, pinned host and unknown memory apart and copies
 * are memcpy; every stream and event is complete, but for the holds below; a kernel launch
 * does nothing and succeeds. Nothing here computes a kernel's result: the tests that use
 * it check the host's protocol (NCCL calls, waits, results), never values.
 *
 * One thing about kernels is kept: a cooperative launch (the kernels that write their
 * peers' memory) counts as running on its device until a cudaDeviceSynchronize there. A
 * cudaFree of one device's memory while another device may run such a kernel is a
 * violation (cudart_stub_violations): that kernel may write the freed memory through
 * peer access, and a real cudaFree does not wait for another device's kernels. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cudart_stub.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
  char* p;
  size_t bytes;
  enum cudaMemoryType type;
  int device;
} alloc_t;
static alloc_t* allocs;
static size_t nallocs, cap_allocs;
static _Thread_local int current_device;
static unsigned devices_set; /* the devices cudaSetDevice made current, from any thread */

#define STUB_MAX_DEVICES 8
static int in_flight[STUB_MAX_DEVICES]; /* cooperative launches not yet synchronized */
static int violations;
static char last_violation[256];
static unsigned last_coop_grid; /* blocks of the last cooperative launch */
static unsigned last_grid;      /* blocks of the last cudaLaunchKernel */
static const void* launched[CUDA_STUB_LAUNCH_LOG]; /* the kernels launched since the reset */
static int nlaunched;
static int capturing;           /* every stream says it is capturing a graph */
static int foreign_capture;     /* another thread captures a graph in global mode */
static void* capturing_stream;  /* this one stream says it is capturing a graph */
/* this thread's capture mode (cudaThreadExchangeStreamCaptureMode) */
static _Thread_local enum cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;
/* Holds on a stream: work queued ahead (a test's, cudart_stub_hold_stream) or a collective
   that waits for a peer (cudart_stub_collective while collectives_stuck). An event recorded
   on a stream is not done until every hold that stream had at its record is let go; one
   recorded before a hold is not held by it. */
#define STUB_MAX_HOLDS 32
typedef struct {
  cudaStream_t s;
  int on;
  int collective; /* a stuck collective's (let go with cudart_stub_set_collectives_stuck(0)) */
  unsigned gen;   /* a hold's number, never reused: an event held by an old hold of a slot is
                     not held by the slot's new one */
} hold_t;
static hold_t holds[STUB_MAX_HOLDS];
static unsigned next_gen = 1;
static int collectives_stuck; /* a collective issued from here never completes */
typedef struct {
  unsigned held[STUB_MAX_HOLDS]; /* the gen of each hold slot at the last record (0: none) */
} stub_event_t;
static int occupancy_fails;     /* cudaOccupancyMaxActiveBlocksPerMultiprocessor fails */
static int new_streams_pending; /* streams made from here never finish their work */
static int next_streams_pending; /* ... the next this many streams made */
static int coop_launch_fails;   /* a cooperative cudaLaunchKernelExC fails (nothing queued) */
static int pointer_query_fails; /* cudaPointerGetAttributes fails */
static int set_device_fail_dev = -1, set_device_fail_nth;    /* the nth cudaSetDevice(dev) fails */
static int peer_enabled[STUB_MAX_DEVICES][STUB_MAX_DEVICES]; /* [from][to] */
#define STUB_MAX_PENDING_STREAMS 16
static void* pending_streams[STUB_MAX_PENDING_STREAMS];
static int npending_streams;
static void (*sync_hook)(void*); /* cudart_stub_on_sync's, until it is called */
static cudart_stub_launch_t launch_log[CUDA_STUB_LAUNCH_LOG]; /* the launches' configurations */
static size_t keep_args; /* bytes of the argument block kept per launch */
static cudart_stub_step_t steps[CUDA_STUB_STEP_LOG];
static int nsteps;
static size_t nstreams, nevents; /* live */
static int no_peer_access;       /* cudaDeviceCanAccessPeer says no */
static int coop_fail_nth;        /* the nth cooperative launch from here fails (0: none) */
static void* sync_arg;
static int devices_busy; /* a kernel that never ends runs on every device */
static int aborts_held;  /* the NCCL stand-in's ncclCommAbort waits (cudart_stub_abort_gate) */
static pthread_cond_t busy_cv = PTHREAD_COND_INITIALIZER; /* devices_busy went off */

/* A switch of the stand-in, set and read under its lock (the library's threads read them). */
static void set_switch(int* sw, int on) {
  pthread_mutex_lock(&mu);
  *sw = on;
  pthread_mutex_unlock(&mu);
}
static int get_switch(const int* sw) {
  pthread_mutex_lock(&mu);
  const int on = *sw;
  pthread_mutex_unlock(&mu);
  return on;
}
/* A call that waits while *flag (devices_busy, aborts_held): until it is switched off, or
   for CUDA_STUB_BUSY_MAX_MS at most, then a violation (a library waiting without a bound). */
static void wait_while(const int* flag, const char* call, const char* why) {
  pthread_mutex_lock(&mu);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += CUDA_STUB_BUSY_MAX_MS / 1000;
  int late = 0;
  while (*flag && !late) late = pthread_cond_timedwait(&busy_cv, &mu, &until) != 0;
  if (late && *flag) {
    violations++;
    snprintf(last_violation, sizeof last_violation, "%s waited %d ms %s", call,
             CUDA_STUB_BUSY_MAX_MS, why);
  }
  pthread_mutex_unlock(&mu);
}
/* A call that waits for the device (cudaDeviceSynchronize; cudaFree and cudaFreeHost,
   which synchronize it in CUDA) while devices_busy. */
void cudart_stub_wait_while_busy(const char* call) {
  wait_while(&devices_busy, call, "on a busy device (a kernel that never ends)");
}
void cudart_stub_abort_gate(void) {
  wait_while(&aborts_held, "ncclCommAbort", "held (cudart_stub_hold_aborts)");
  cudart_stub_wait_while_busy("ncclCommAbort");
}
/* Sets a flag that wait_while waits on, waking its waiters when it goes off. */
static void set_wait_flag(int* flag, int on) {
  pthread_mutex_lock(&mu);
  *flag = on;
  if (!on) pthread_cond_broadcast(&busy_cv);
  pthread_mutex_unlock(&mu);
}
void cudart_stub_hold_aborts(int on) {
  set_wait_flag(&aborts_held, on);
}
void cudart_stub_set_devices_busy(int on) {
  set_wait_flag(&devices_busy, on);
}
void cudart_stub_set_capturing(int on) {
  set_switch(&capturing, on);
}
void cudart_stub_set_capturing_stream(cudaStream_t s) {
  pthread_mutex_lock(&mu);
  capturing_stream = (void*)s;
  pthread_mutex_unlock(&mu);
}
void cudart_stub_set_foreign_capture(int on) {
  set_switch(&foreign_capture, on);
}
/* CUDA's rule while another thread captures a graph in global mode: a "potentially
   unsafe" call (an allocation or free, a synchronization, a stream or event query) from a
   thread in global mode fails (cudaErrorStreamCaptureUnsupported) and invalidates
   that capture. Such a call counts as a violation here. */
static int capture_forbids(const char* call) {
  /* (thread-local and relaxed threads are not bound by another thread's capture) */
  if (!get_switch(&foreign_capture) || thread_mode != cudaStreamCaptureModeGlobal) return 0;
  pthread_mutex_lock(&mu);
  violations++;
  snprintf(last_violation, sizeof last_violation,
           "%s in global capture mode while another thread captures a graph (global mode)", call);
  pthread_mutex_unlock(&mu);
  return 1;
}
/* (mu held) A hold on s (collective: a stuck collective's); 0 when every slot is taken. */
static int hold_add(cudaStream_t s, int collective) {
  for (int i = 0; i < STUB_MAX_HOLDS; i++)
    if (!holds[i].on) {
      holds[i] = (hold_t){s, 1, collective, next_gen++};
      return 1;
    }
  violations++;
  snprintf(last_violation, sizeof last_violation, "more than %d stream holds", STUB_MAX_HOLDS);
  return 0;
}
void cudart_stub_hold_stream(cudaStream_t s) {
  pthread_mutex_lock(&mu);
  (void)hold_add(s, 0);
  pthread_mutex_unlock(&mu);
}
void cudart_stub_release_stream(cudaStream_t s) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < STUB_MAX_HOLDS; i++)
    if (holds[i].on && !holds[i].collective && holds[i].s == s) holds[i].on = 0;
  pthread_mutex_unlock(&mu);
}
void cudart_stub_set_collectives_stuck(int on) {
  pthread_mutex_lock(&mu);
  collectives_stuck = on;
  for (int i = 0; !on && i < STUB_MAX_HOLDS; i++)
    if (holds[i].collective) holds[i].on = 0;
  pthread_mutex_unlock(&mu);
}
void cudart_stub_collective(cudaStream_t s) {
  pthread_mutex_lock(&mu);
  int held = 0; /* (one stuck collective holds all behind it) */
  for (int i = 0; i < STUB_MAX_HOLDS; i++)
    held |= holds[i].on && holds[i].collective && holds[i].s == s;
  if (collectives_stuck && !held) (void)hold_add(s, 1);
  pthread_mutex_unlock(&mu);
}
void cudart_stub_set_occupancy_fails(int on) {
  set_switch(&occupancy_fails, on);
}
void cudart_stub_set_coop_launch_fails(int on) {
  set_switch(&coop_launch_fails, on);
}
void cudart_stub_set_pointer_query_fails(int on) {
  set_switch(&pointer_query_fails, on);
}
void cudart_stub_fail_set_device(int device, int nth) {
  pthread_mutex_lock(&mu);
  set_device_fail_dev = device;
  set_device_fail_nth = nth;
  pthread_mutex_unlock(&mu);
}
int cudart_stub_peer_enabled(int from, int to) {
  pthread_mutex_lock(&mu);
  const int on = from >= 0 && from < STUB_MAX_DEVICES && to >= 0 && to < STUB_MAX_DEVICES &&
                 peer_enabled[from][to];
  pthread_mutex_unlock(&mu);
  return on;
}

unsigned cudart_stub_last_coop_grid(void) {
  pthread_mutex_lock(&mu);
  const unsigned g = last_coop_grid;
  pthread_mutex_unlock(&mu);
  return g;
}

unsigned cudart_stub_last_grid(void) {
  pthread_mutex_lock(&mu);
  const unsigned g = last_grid;
  pthread_mutex_unlock(&mu);
  return g;
}

static void log_step(char what, cudaStream_t s, cudaEvent_t e, int launch);
static void log_launch(const void* fn, unsigned grid, unsigned block, size_t dyn, int coop,
                       cudaStream_t s, void** args) {
  pthread_mutex_lock(&mu);
  if (nlaunched < CUDA_STUB_LAUNCH_LOG) {
    cudart_stub_launch_t* l = &launch_log[nlaunched];
    launched[nlaunched] = fn;
    l->fn = fn, l->grid = grid, l->block = block, l->dyn = dyn, l->cooperative = coop;
    l->device = current_device, l->stream = s;
    memset(l->args, 0, sizeof l->args);
    if (keep_args > 0 && args != NULL && args[0] != NULL) memcpy(l->args, args[0], keep_args);
  }
  log_step('L', s, NULL, nlaunched);
  nlaunched++;
  pthread_mutex_unlock(&mu);
}
int cudart_stub_launches(const void** fns, int max) {
  pthread_mutex_lock(&mu);
  const int n = nlaunched;
  for (int i = 0; fns != NULL && i < n && i < max && i < CUDA_STUB_LAUNCH_LOG; i++) fns[i] = launched[i];
  pthread_mutex_unlock(&mu);
  return n;
}

int cudart_stub_launch_at(int i, cudart_stub_launch_t* out) {
  pthread_mutex_lock(&mu);
  const int ok = i >= 0 && i < nlaunched && i < CUDA_STUB_LAUNCH_LOG;
  if (ok) *out = launch_log[i];
  pthread_mutex_unlock(&mu);
  return ok;
}
void cudart_stub_keep_args(size_t bytes) {
  pthread_mutex_lock(&mu);
  keep_args = bytes < CUDA_STUB_ARGS_BYTES ? bytes : CUDA_STUB_ARGS_BYTES;
  pthread_mutex_unlock(&mu);
}
/* (mu held) */
static void log_step(char what, cudaStream_t s, cudaEvent_t e, int launch) {
  if (nsteps < CUDA_STUB_STEP_LOG) steps[nsteps] = (cudart_stub_step_t){what, s, e, launch};
  nsteps++;
}
int cudart_stub_steps(cudart_stub_step_t* out, int max) {
  pthread_mutex_lock(&mu);
  const int n = nsteps;
  for (int i = 0; out != NULL && i < n && i < max && i < CUDA_STUB_STEP_LOG; i++) out[i] = steps[i];
  pthread_mutex_unlock(&mu);
  return n;
}
size_t cudart_stub_live(void) {
  pthread_mutex_lock(&mu);
  const size_t n = nallocs + nstreams + nevents;
  pthread_mutex_unlock(&mu);
  return n;
}
size_t cudart_stub_size_of(const void* p) {
  size_t bytes = 0;
  pthread_mutex_lock(&mu);
  for (size_t i = 0; i < nallocs; i++)
    if (allocs[i].p == p) bytes = allocs[i].bytes;
  pthread_mutex_unlock(&mu);
  return bytes;
}
void cudart_stub_set_no_peer_access(int off) {
  set_switch(&no_peer_access, off);
}
void cudart_stub_fail_coop_launch_nth(int nth) {
  pthread_mutex_lock(&mu);
  coop_fail_nth = nth;
  pthread_mutex_unlock(&mu);
}

int cudart_stub_in_flight(int device) {
  pthread_mutex_lock(&mu);
  const int n = device >= 0 && device < STUB_MAX_DEVICES ? in_flight[device] : 0;
  pthread_mutex_unlock(&mu);
  return n;
}
int cudart_stub_violations(void) {
  pthread_mutex_lock(&mu);
  const int n = violations;
  pthread_mutex_unlock(&mu);
  return n;
}
const char* cudart_stub_last_violation(void) {
  return last_violation;
}
void cudart_stub_reset(void) {
  pthread_mutex_lock(&mu);
  memset(in_flight, 0, sizeof in_flight);
  capturing = 0;
  capturing_stream = NULL;
  foreign_capture = 0;
  thread_mode = cudaStreamCaptureModeGlobal;
  memset(holds, 0, sizeof holds);
  collectives_stuck = 0;
  occupancy_fails = 0;
  coop_launch_fails = 0;
  pointer_query_fails = 0;
  set_device_fail_dev = -1;
  memset(peer_enabled, 0, sizeof peer_enabled);
  violations = 0;
  last_violation[0] = '\0';
  nlaunched = 0;
  last_grid = 0;
  nsteps = 0;
  keep_args = 0;
  no_peer_access = 0;
  coop_fail_nth = 0;
  sync_hook = NULL;
  sync_arg = NULL;
  new_streams_pending = 0;
  next_streams_pending = 0;
  devices_set = 0;
  npending_streams = 0;
  devices_busy = 0;
  aborts_held = 0;
  pthread_cond_broadcast(&busy_cv);
  pthread_mutex_unlock(&mu);
}

void cudart_stub_set_new_streams_pending(int on) {
  set_switch(&new_streams_pending, on);
}
void cudart_stub_pend_next_streams(int n) {
  set_switch(&next_streams_pending, n);
}
unsigned cudart_stub_devices_set(void) {
  pthread_mutex_lock(&mu);
  const unsigned m = devices_set;
  pthread_mutex_unlock(&mu);
  return m;
}

void cudart_stub_on_sync(void (*fn)(void*), void* arg) {
  pthread_mutex_lock(&mu);
  sync_hook = fn;
  sync_arg = arg;
  pthread_mutex_unlock(&mu);
}

/* CUDA_STUB_DEVICES as the process started, read once: the library's threads (the host
   path's watchdog calls cudaSetDevice) must not call getenv while a test's main thread
   calls setenv or unsetenv, which move the environment under them (glibc: a SEGV in
   getenv, seen once under AddressSanitizer) */
static pthread_once_t devices_once = PTHREAD_ONCE_INIT;
static int ndevices;
static void devices_read(void) {
  const char* v = getenv("CUDA_STUB_DEVICES");
  const int n = v != NULL ? atoi(v) : 2;
  ndevices = n < 0 ? 0 : n;
}
__attribute__((constructor)) static void devices_at_load(void) { pthread_once(&devices_once, devices_read); }
static int device_count(void) {
  pthread_once(&devices_once, devices_read);
  return ndevices;
}

static cudaError_t remember(void** out, size_t bytes, enum cudaMemoryType type) {
  if (out == NULL) return cudaErrorInvalidValue;
  void* p = malloc(bytes ? bytes : 1);
  if (p == NULL) return cudaErrorMemoryAllocation;
  memset(p, CUDA_STUB_POISON, bytes ? bytes : 1); /* not zeroed, as real memory is not */
  pthread_mutex_lock(&mu);
  if (nallocs == cap_allocs) {
    size_t cap = cap_allocs ? 2 * cap_allocs : 64;
    alloc_t* a = realloc(allocs, cap * sizeof *a);
    if (a == NULL) {
      pthread_mutex_unlock(&mu);
      free(p);
      return cudaErrorMemoryAllocation;
    }
    allocs = a;
    cap_allocs = cap;
  }
  allocs[nallocs++] = (alloc_t){p, bytes, type, current_device};
  pthread_mutex_unlock(&mu);
  *out = p;
  return cudaSuccess;
}

static cudaError_t forget(void* p, enum cudaMemoryType type) {
  if (p == NULL) return cudaSuccess;
  pthread_mutex_lock(&mu);
  for (size_t i = 0; i < nallocs; i++)
    if (allocs[i].p == p && allocs[i].type == type) {
      for (int d = 0; type == cudaMemoryTypeDevice && d < STUB_MAX_DEVICES; d++)
        if (d != allocs[i].device && in_flight[d] > 0) {
          violations++;
          snprintf(last_violation, sizeof last_violation,
                   "cudaFree of device %d's memory while device %d may still run a "
                   "cooperative kernel (no cudaDeviceSynchronize there since its launch)",
                   allocs[i].device, d);
          break;
        }
      allocs[i] = allocs[--nallocs];
      pthread_mutex_unlock(&mu);
      free(p);
      return cudaSuccess;
    }
  pthread_mutex_unlock(&mu);
  return cudaErrorInvalidValue;
}

size_t cudart_stub_find(size_t bytes, void** out, int* dev, size_t max) {
  size_t n = 0;
  pthread_mutex_lock(&mu);
  for (size_t i = 0; i < nallocs; i++)
    if (allocs[i].type == cudaMemoryTypeDevice && allocs[i].bytes == bytes) {
      if (n < max) {
        out[n] = allocs[i].p;
        if (dev != NULL) dev[n] = allocs[i].device;
      }
      n++;
    }
  pthread_mutex_unlock(&mu);
  return n;
}

/* ---- devices ------------------------------------------------------------------------ */
cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_count();
  return *count > 0 ? cudaSuccess : cudaErrorNoDevice;
}
cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}
/* the versions the library's reason for no usable device names (src/gpu/cuda_reason.h) */
cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
  pthread_mutex_lock(&mu);
  const int fail = device == set_device_fail_dev && --set_device_fail_nth == 0;
  if (fail) set_device_fail_dev = -1;
  if (!fail) devices_set |= 1u << device;
  pthread_mutex_unlock(&mu);
  if (fail) return cudaErrorDevicesUnavailable;
  current_device = device;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrCooperativeLaunch:
      *value = 1;
      break;
    case cudaDevAttrMultiProcessorCount:
      *value = CUDA_STUB_SMS;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = 227 * 1024;
      break;
    default:
      *value = 0;
      break;
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  *can = device != peer && !get_switch(&no_peer_access);
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  (void)flags;
  pthread_mutex_lock(&mu);
  if (current_device >= 0 && current_device < STUB_MAX_DEVICES && peer >= 0 &&
      peer < STUB_MAX_DEVICES)
    peer_enabled[current_device][peer] = 1;
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
  if (capture_forbids("cudaDeviceSynchronize")) return cudaErrorStreamCaptureUnsupported;
  cudart_stub_wait_while_busy("cudaDeviceSynchronize");
  void (*fn)(void*) = NULL;
  void* arg = NULL;
  pthread_mutex_lock(&mu);
  if (current_device >= 0 && current_device < STUB_MAX_DEVICES) {
    if (in_flight[current_device] > 0 && sync_hook != NULL) { /* its kernels end now */
      fn = sync_hook;
      arg = sync_arg;
      sync_hook = NULL;
    }
    in_flight[current_device] = 0;
  }
  pthread_mutex_unlock(&mu);
  if (fn != NULL) fn(arg);
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  return cudaSuccess;
}
const char* cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess ? "cudaSuccess" : "cudaError (stand-in)";
}
const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "error (CUDA stand-in)";
}

/* ---- memory ------------------------------------------------------------------------- */
cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (capture_forbids("cudaMalloc")) return cudaErrorStreamCaptureUnsupported;
  return remember(p, bytes, cudaMemoryTypeDevice);
}
cudaError_t cudaFree(void* p) {
  if (capture_forbids("cudaFree")) return cudaErrorStreamCaptureUnsupported;
  if (p != NULL) cudart_stub_wait_while_busy("cudaFree");
  return forget(p, cudaMemoryTypeDevice);
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int flags) {
  if (capture_forbids("cudaHostAlloc")) return cudaErrorStreamCaptureUnsupported;
  (void)flags;
  return remember(p, bytes, cudaMemoryTypeHost);
}
cudaError_t cudaFreeHost(void* p) {
  if (capture_forbids("cudaFreeHost")) return cudaErrorStreamCaptureUnsupported;
  if (p != NULL) cudart_stub_wait_while_busy("cudaFreeHost");
  return forget(p, cudaMemoryTypeHost);
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* at, const void* ptr) {
  memset(at, 0, sizeof *at);
  if (get_switch(&pointer_query_fails)) return cudaErrorInitializationError;
  at->type = cudaMemoryTypeUnregistered;
  at->device = -1;
  const char* c = ptr;
  pthread_mutex_lock(&mu);
  for (size_t i = 0; i < nallocs; i++)
    if (c >= allocs[i].p && c < allocs[i].p + (allocs[i].bytes ? allocs[i].bytes : 1)) {
      at->type = allocs[i].type;
      at->device = allocs[i].device;
      at->devicePointer = (void*)ptr;
      at->hostPointer = allocs[i].type == cudaMemoryTypeHost ? (void*)ptr : NULL;
      break;
    }
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}
/* A copy engine moves aligned 4-byte words whole: such copies are relaxed atomic word by
   word, so that two threads' copies of one word (the abort's copy of the abort word into a
   rank's stop word, sbn_gpu_stop_ranks, made by two aborting threads at once) are not a
   data race of the stand-in's own under ThreadSanitizer, where the hardware has none. */
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind) {
  if (capture_forbids("cudaMemcpy")) return cudaErrorStreamCaptureUnsupported;
  (void)kind;
  if (((uintptr_t)dst | (uintptr_t)src | bytes) % sizeof(uint32_t) == 0 &&
      ((const char*)src + bytes <= (char*)dst || (char*)dst + bytes <= (const char*)src)) {
    for (size_t i = 0; i < bytes / sizeof(uint32_t); i++)
      __atomic_store_n((uint32_t*)dst + i, __atomic_load_n((const uint32_t*)src + i, __ATOMIC_RELAXED),
                       __ATOMIC_RELAXED);
  } else if (bytes) {
    memmove(dst, src, bytes);
  }
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  (void)stream;
  return cudaMemcpy(dst, src, bytes, kind);
}
/* A memset on `stream` (NULL: the legacy default stream, cudaMemset's), done at once, as
   every stand-in copy (a pending stream still says so); its stream in the steps. */
static cudaError_t memset_on(void* p, int value, size_t bytes, cudaStream_t stream) {
  pthread_mutex_lock(&mu);
  log_step('M', stream, NULL, -1);
  pthread_mutex_unlock(&mu);
  if (bytes) memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  return memset_on(p, value, bytes, NULL);
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  return memset_on(p, value, bytes, stream);
}

/* ---- streams and events: always complete ---------------------------------------------- */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  (void)flags;
  *s = malloc(1);
  if (*s == NULL) return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&mu);
  nstreams++;
  if ((new_streams_pending || next_streams_pending > 0) &&
      npending_streams < STUB_MAX_PENDING_STREAMS) {
    pending_streams[npending_streams++] = *s;
    if (next_streams_pending > 0) next_streams_pending--;
  }
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}
/* Whether s is one of cudart_stub_set_new_streams_pending's (mu held); removed with drop. */
static int stream_pending(cudaStream_t s, int drop) {
  for (int i = 0; i < npending_streams; i++)
    if (pending_streams[i] == (void*)s) {
      if (drop) pending_streams[i] = pending_streams[--npending_streams];
      return 1;
    }
  return 0;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  pthread_mutex_lock(&mu);
  (void)stream_pending(s, 1);
  if (s != NULL) nstreams--;
  pthread_mutex_unlock(&mu);
  free(s);
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (capture_forbids("cudaStreamQuery")) return cudaErrorStreamCaptureUnsupported;
  pthread_mutex_lock(&mu);
  const int pending = stream_pending(s, 0);
  if (!pending) log_step('Q', s, NULL, -1);
  pthread_mutex_unlock(&mu);
  return pending ? cudaErrorNotReady : cudaSuccess;
}
/* The stand-in's kernels do nothing: a stream has nothing to wait for (a cooperative
   kernel still counts as running until a cudaDeviceSynchronize on its device). */
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (capture_forbids("cudaStreamSynchronize")) return cudaErrorStreamCaptureUnsupported;
  (void)s;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  (void)flags;
  pthread_mutex_lock(&mu);
  log_step('W', s, e, -1);
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus* status) {
  pthread_mutex_lock(&mu);
  const int on = capturing || (s != NULL && (void*)s == capturing_stream);
  pthread_mutex_unlock(&mu);
  *status = on ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  const enum cudaStreamCaptureMode old = thread_mode;
  thread_mode = *mode;
  *mode = old;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  (void)flags;
  *e = calloc(1, sizeof(stub_event_t));
  if (*e == NULL) return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&mu);
  nevents++;
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  pthread_mutex_lock(&mu);
  if (e != NULL) nevents--;
  pthread_mutex_unlock(&mu);
  free(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  pthread_mutex_lock(&mu);
  log_step('R', s, e, -1);
  stub_event_t* ev = (stub_event_t*)e;
  for (int i = 0; i < STUB_MAX_HOLDS; i++)
    ev->held[i] = holds[i].on && holds[i].s == s ? holds[i].gen : 0;
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (capture_forbids("cudaEventQuery")) return cudaErrorStreamCaptureUnsupported;
  const stub_event_t* ev = (const stub_event_t*)e;
  int held = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < STUB_MAX_HOLDS; i++)
    held |= ev->held[i] != 0 && holds[i].on && holds[i].gen == ev->held[i];
  pthread_mutex_unlock(&mu);
  return held ? cudaErrorNotReady : cudaSuccess;
}

/* ---- kernels: known to exist, launched as no-ops ---------------------------------------- */
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* fa, const void* fn) {
  (void)fn;
  memset(fa, 0, sizeof *fa);
  fa->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* fn, enum cudaFuncAttribute attr, int value) {
  (void)fn, (void)attr, (void)value;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* fn, int threads,
                                                          size_t dyn) {
  (void)fn, (void)threads, (void)dyn;
  if (get_switch(&occupancy_fails)) return cudaErrorInvalidDeviceFunction;
  *blocks = CUDA_STUB_BLOCKS_PER_SM;
  return cudaSuccess;
}
cudaError_t cudaLaunchKernel(const void* fn, dim3 grid, dim3 block, void** args, size_t dyn,
                             cudaStream_t s) {
  log_launch(fn, grid.x * grid.y * grid.z, block.x * block.y * block.z, dyn, 0, s, args);
  pthread_mutex_lock(&mu);
  last_grid = grid.x * grid.y * grid.z;
  pthread_mutex_unlock(&mu);
  return cudaSuccess;
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* cfg, const void* fn, void** args) {
  int coop = 0;
  for (unsigned i = 0; i < cfg->numAttrs; i++)
    coop |= cfg->attrs[i].id == cudaLaunchAttributeCooperative && cfg->attrs[i].val.cooperative;
  if (coop && get_switch(&coop_launch_fails))
    return cudaErrorCooperativeLaunchTooLarge; /* nothing queued, not logged */
  pthread_mutex_lock(&mu);
  const int fail_now = coop && coop_fail_nth > 0 && --coop_fail_nth == 0;
  pthread_mutex_unlock(&mu);
  if (fail_now) return cudaErrorCooperativeLaunchTooLarge; /* (cudart_stub_fail_coop_launch_nth) */
  log_launch(fn, cfg->gridDim.x * cfg->gridDim.y * cfg->gridDim.z,
             cfg->blockDim.x * cfg->blockDim.y * cfg->blockDim.z, cfg->dynamicSmemBytes, coop,
             cfg->stream, args);
  for (unsigned i = 0; i < cfg->numAttrs; i++)
    if (cfg->attrs[i].id == cudaLaunchAttributeCooperative && cfg->attrs[i].val.cooperative) {
      pthread_mutex_lock(&mu);
      if (current_device >= 0 && current_device < STUB_MAX_DEVICES) in_flight[current_device]++;
      last_coop_grid = cfg->gridDim.x * cfg->gridDim.y * cfg->gridDim.z;
      pthread_mutex_unlock(&mu);
    }
  return cudaSuccess;
}

/* ---- what nvcc's generated host code calls (crt/host_runtime.h, device_functions.h) ---- */
void** __cudaRegisterFatBinary(void* fat_cubin);
void __cudaRegisterFatBinaryEnd(void** handle);
void __cudaUnregisterFatBinary(void** handle);
char __cudaInitModule(void** handle);
void __cudaRegisterFunction(void** handle, const char* host_fn, char* device_fn, const char* name,
                            int thread_limit, uint3* tid, uint3* bid, dim3* block, dim3* grid,
                            int* warp_size);
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t dyn, cudaStream_t s);
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* dyn, void* s);
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* fn);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t dyn,
                               cudaStream_t s);

static void* fat_binary_handle;
void** __cudaRegisterFatBinary(void* fat_cubin) {
  (void)fat_cubin;
  return &fat_binary_handle;
}
void __cudaRegisterFatBinaryEnd(void** handle) {
  (void)handle;
}
void __cudaUnregisterFatBinary(void** handle) {
  (void)handle;
}
char __cudaInitModule(void** handle) {
  (void)handle;
  return 1;
}
void __cudaRegisterFunction(void** handle, const char* host_fn, char* device_fn, const char* name,
                            int thread_limit, uint3* tid, uint3* bid, dim3* block, dim3* grid,
                            int* warp_size) {
  (void)handle, (void)host_fn, (void)device_fn, (void)name, (void)thread_limit, (void)tid,
      (void)bid, (void)block, (void)grid, (void)warp_size;
}
unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t dyn, cudaStream_t s) {
  (void)grid, (void)block, (void)dyn, (void)s;
  return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* dyn, void* s) {
  *grid = (dim3){1, 1, 1};
  *block = (dim3){1, 1, 1};
  *dyn = 0;
  *(cudaStream_t*)s = NULL;
  return cudaSuccess;
}
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* fn) {
  *kernel = (cudaKernel_t)(uintptr_t)fn;
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t dyn,
                               cudaStream_t s) {
  (void)kernel, (void)grid, (void)block, (void)args, (void)dyn, (void)s;
  return cudaSuccess;
}
