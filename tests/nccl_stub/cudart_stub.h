/* cudart_stub.h — what the stand-in CUDA runtime (cudart_stub.c) offers its tests beyond
 * CUDA's own API. */
#ifndef SYNCBN_TESTS_CUDART_STUB_H_
#define SYNCBN_TESTS_CUDART_STUB_H_

#include <cuda_runtime_api.h>
#include <stddef.h>

/* The live device allocations (cudaMalloc) of exactly `bytes` bytes, in no particular
   order: up to `max` of them into out[], their device into dev[] (may be NULL). Returns
   how many there are. */
size_t cudart_stub_find(size_t bytes, void** out, int* dev, size_t max);

/* Every stand-in device has CUDA_STUB_SMS SMs, and every kernel CUDA_STUB_BLOCKS_PER_SM
   blocks per SM. */
#define CUDA_STUB_SMS 4
#define CUDA_STUB_BLOCKS_PER_SM 2
/* The grid (blocks) of the last cooperative launch, on any device (0: none yet). */
unsigned cudart_stub_last_coop_grid(void);
/* The grid (blocks) of the last cudaLaunchKernel, on any device (0: none since the last
   reset). */
unsigned cudart_stub_last_grid(void);
/* Cooperative launches on `device` since its last cudaDeviceSynchronize. */
int cudart_stub_in_flight(int device);
/* Violations since the last reset (a cudaFree of memory that another device's kernel may
   still write), and the last one's description ("" if none). */
int cudart_stub_violations(void);
const char* cudart_stub_last_violation(void);
/* From here every stream says it is capturing a graph (cudaStreamIsCapturing) when `on`;
   nothing else of a capture is modelled. */
void cudart_stub_set_capturing(int on);
/* From here stream s (not NULL) says it is capturing a graph, the others not (unless
   cudart_stub_set_capturing); NULL: none. */
void cudart_stub_set_capturing_stream(cudaStream_t s);
/* From here (while `on`) another thread captures a graph in global mode: a thread in
   global mode (cudaThreadExchangeStreamCaptureMode, modelled per thread) that allocates,
   frees, synchronizes or queries a stream or an event gets
   cudaErrorStreamCaptureUnsupported, and the stand-in counts a violation. */
void cudart_stub_set_foreign_capture(int on);
/* Stream s is held from here, as behind work queued ahead that has not finished: an event
   recorded on it while held is not done (cudaEventQuery: cudaErrorNotReady) until
   cudart_stub_release_stream(s); one recorded before is not held. */
void cudart_stub_hold_stream(cudaStream_t s);
void cudart_stub_release_stream(cudaStream_t s);
/* From here (while `on`) a collective issued on a stream never completes, as one that
   waits for a peer that does not come: the NCCL stand-in's ncclAllGather calls
   cudart_stub_collective(stream), which holds that stream (as cudart_stub_hold_stream)
   until collectives_stuck is switched off. */
void cudart_stub_set_collectives_stuck(int on);
void cudart_stub_collective(cudaStream_t s);
/* From here (while `on`) the streams made never finish their work: cudaStreamQuery says
   cudaErrorNotReady for them, as for a stream behind a collective that waits for a peer
   (the first 16 such streams; those made after them finish as before; cudaStreamSynchronize
   does not wait for them). */
void cudart_stub_set_new_streams_pending(int on);
/* The next n streams made never finish their work, as cudart_stub_set_new_streams_pending's
   (the streams after them finish; 0 cancels what is left of n). */
void cudart_stub_pend_next_streams(int n);
/* The devices cudaSetDevice made current since the last reset, from any thread (bit d:
   device d). On CUDA, that call makes the device's primary context, ~0.5 GB of its
   memory: a library that makes device 0 current in a process whose work is on device 1
   costs device 0 that memory. */
unsigned cudart_stub_devices_set(void);
/* What a call that waits for the device does while cudart_stub_set_devices_busy is on:
   waits until it is switched off, or CUDA_STUB_BUSY_MAX_MS, then a violation naming
   `call` (cudaDeviceSynchronize, cudaFree, cudaFreeHost; the NCCL stand-in's
   ncclCommAbort, which frees the comm's device memory: cudart_stub_abort_gate). */
void cudart_stub_wait_while_busy(const char* call);
/* The NCCL stand-in's ncclCommAbort's wait: while cudart_stub_hold_aborts is on (a
   violation past CUDA_STUB_BUSY_MAX_MS), then as cudart_stub_wait_while_busy. */
void cudart_stub_abort_gate(void);
/* From here (while `on`) ncclCommAbort waits, the devices otherwise idle: an abort stuck
   alone (switched off from another thread). */
void cudart_stub_hold_aborts(int on);
/* From here (while `on`) every device runs a kernel that never ends (a collective waiting
   for a dead peer): cudaDeviceSynchronize, cudaFree and cudaFreeHost (which synchronize
   the device in CUDA) wait until it is switched off, from another thread, or for
   CUDA_STUB_BUSY_MAX_MS at most, then return as usual and count a violation (a wait with no
   bound). Streams and events are not affected. */
#define CUDA_STUB_BUSY_MAX_MS 10000
void cudart_stub_set_devices_busy(int on);
/* From here cudaOccupancyMaxActiveBlocksPerMultiprocessor fails
   (cudaErrorInvalidDeviceFunction) when `on`, as for a kernel the device cannot run. */
void cudart_stub_set_occupancy_fails(int on);
/* From here (while `on`) a cooperative cudaLaunchKernelExC fails
   (cudaErrorCooperativeLaunchTooLarge) with nothing queued; cudaPointerGetAttributes fails
   (cudaErrorInitializationError). */
void cudart_stub_set_coop_launch_fails(int on);
void cudart_stub_set_pointer_query_fails(int on);
/* The nth cudaSetDevice(device) from here fails (cudaErrorDevicesUnavailable), once. */
void cudart_stub_fail_set_device(int device, int nth);
/* Whether cudaDeviceEnablePeerAccess(to) was called on device `from` since the reset. */
int cudart_stub_peer_enabled(int from, int to);
/* From here the next cudaDeviceSynchronize on a device with a cooperative launch in flight
   calls fn(arg) before it returns, once: what those kernels did as they ended (a kernel
   that waited for a missing peer writes its failure word at its deadline). NULL: none. */
void cudart_stub_on_sync(void (*fn)(void*), void* arg);
/* The kernels launched (cudaLaunchKernel, cudaLaunchKernelExC) since the last reset, in
   launch order: up to `max` of them into fns[] (may be NULL). Returns how many there were
   (at most CUDA_STUB_LAUNCH_LOG are kept). */
#define CUDA_STUB_LAUNCH_LOG 64
int cudart_stub_launches(const void** fns, int max);
/* The launches since the last reset, in launch order (the first CUDA_STUB_LAUNCH_LOG):
   each one's kernel, grid and block (x only: the library launches 1-D), dynamic shared
   memory, whether it was cooperative, its device and stream, and the first bytes of its
   first parameter (the argument block) as it was at the launch: as many as
   cudart_stub_keep_args said (0, the default: none; at most CUDA_STUB_ARGS_BYTES). Returns
   whether launch i was logged. */
#define CUDA_STUB_ARGS_BYTES 8192
typedef struct {
  const void* fn;
  unsigned grid, block;
  size_t dyn;
  int cooperative;
  int device;
  cudaStream_t stream;
  unsigned char args[CUDA_STUB_ARGS_BYTES];
} cudart_stub_launch_t;
int cudart_stub_launch_at(int i, cudart_stub_launch_t* out);
void cudart_stub_keep_args(size_t bytes);
/* The stream steps since the last reset, in the order they were issued: a launch ('L',
   its index in the launch log), an event recorded on a stream ('R'), a stream made to wait
   for an event ('W'), a cudaMemsetAsync ('M'), a cudaStreamQuery that found the stream's
   work done ('Q'). Returns how many there were (at most CUDA_STUB_STEP_LOG are kept). */
#define CUDA_STUB_STEP_LOG 64
typedef struct {
  char what;
  cudaStream_t stream;
  cudaEvent_t event;
  int launch;
} cudart_stub_step_t;
int cudart_stub_steps(cudart_stub_step_t* out, int max);
/* What the runtime holds for the process: live allocations (device and pinned host),
   streams and events. */
size_t cudart_stub_live(void);
/* The bytes of the live allocation (device or pinned host) that begins at p; 0 if none. */
size_t cudart_stub_size_of(const void* p);
/* From here cudaDeviceCanAccessPeer says no for every pair while `off` (as on GPUs
   without P2P: the library puts the mailboxes in pinned host memory). */
void cudart_stub_set_no_peer_access(int off);
/* The nth cooperative cudaLaunchKernelExC from here fails (cudaErrorCooperativeLaunchTooLarge,
   nothing queued), once; 0: none. */
void cudart_stub_fail_coop_launch_nth(int nth);
/* New memory (cudaMalloc, cudaHostAlloc) is filled with CUDA_STUB_POISON bytes, as real
   memory is not zeroed: what the library reads before it writes is garbage. */
#define CUDA_STUB_POISON 0xA5
/* Forgets the kernels in flight, the capturing, the pending events, the failing occupancy
   query, launch, pointer query and cudaSetDevice, the peer access enabled, the violations,
   the launches, cudart_stub_on_sync's call, the pending streams, the steps, the kept
   argument bytes, the peer access refused, the nth launch to fail and the busy devices. */
void cudart_stub_reset(void);

#endif /* SYNCBN_TESTS_CUDART_STUB_H_ */
