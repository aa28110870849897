/* mp_launch.h — a small multi-process launcher for tests and examples: W child processes,
 * rank 0 makes a blob (an ncclUniqueId) and hands it to the others, every child runs the
 * same function, the parent waits (bounded), kills what hangs and aggregates exit codes.
 *
 *   - The parent only forks, relays output and waits. It must not have initialized CUDA or
 *     NCCL before calling mp_run (a CUDA context does not survive fork); to learn the device
 *     count, use mp_probe_devices() (tests/gpu/mp_cuda.h), which asks in a child.
 *   - Pipes are made by the parent before any fork: one blob pipe per rank 1..W-1 (rank 0
 *     writes, rank r reads) and one output pipe per rank. If make_blob fails in rank 0,
 *     rank 0 closes its write ends without writing: ranks 1..W-1 see EOF and exit with
 *     MP_EXIT_NO_BLOB instead of waiting forever.
 *   - Every child's stdout and stderr go through its output pipe; the parent writes them to
 *     its own stderr line by line, each line prefixed "[rank r] " (one write per line, so
 *     lines of different ranks never mix).
 *   - The children are in a process group of their own (rank 0's pid). When timeout_s
 *     passes, the parent names the ranks still running and kills the whole group with
 *     SIGKILL (grandchildren included). On Linux a child also dies with the parent
 *     (PR_SET_PDEATHSIG), so a killed test leaves no orphans.
 *
 * Aggregate: every rank exited 0 -> 0; every rank exited 77 (MP_SKIP) -> 77; anything
 * else (a mix, another code, a signal, a hang, a launcher error) -> 1, with each rank's
 * status printed.
 *
 * Plain C11 + POSIX; no CUDA. Not thread-safe (forks; call it from one thread).
 */
#ifndef SYNCBN_TESTS_MP_LAUNCH_H_
#define SYNCBN_TESTS_MP_LAUNCH_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MP_SKIP 77           /* a child's "skipped" (CTest's SKIP_RETURN_CODE) */
#define MP_EXIT_NO_BLOB 120  /* rank > 0: the blob did not arrive (rank 0 failed or died) */
#define MP_EXIT_LAUNCHER 121 /* the launcher's own setup failed inside a child */
#define MP_MAX_RANKS 256

/* Runs in rank 0 only: fills blob[0..size) and returns 0, or returns non-zero (rank 0
   then exits with that code, 1 if it is not in 1..255, and the other ranks exit with
   MP_EXIT_NO_BLOB). May be NULL: the blob is zero-filled. */
typedef int (*mp_make_blob_fn)(void* blob, size_t size, void* ctx);
/* Runs in every child with the blob rank 0 made; its return value is the child's exit
   code (values outside 0..255 become 1). stdio is flushed before the child exits. */
typedef int (*mp_child_fn)(int rank, int W, const void* blob, void* ctx);

typedef enum {
  MP_RANK_NOT_STARTED = 0, /* fork failed before this rank */
  MP_RANK_EXITED = 1,      /* code = exit status */
  MP_RANK_SIGNALED = 2,    /* code = the signal that ended it */
  MP_RANK_HUNG = 3,        /* still running at the timeout; killed with SIGKILL */
  MP_RANK_LOST = 4,        /* could not be reaped even after SIGKILL (stuck in the kernel) */
  MP_RANK_STOPPED = 5      /* killed with SIGKILL fail_fast_s after another rank failed */
} mp_state_t;

typedef struct {
  mp_state_t state;
  int code;
  long pid;
} mp_rank_status_t;

/* Forks W children (1 <= W <= MP_MAX_RANKS) as described above and waits for them at
   most timeout_s seconds (<= 0: no limit). ctx is passed to make_blob and child (each
   child has its own copy of the parent's memory). Returns 0, 77 or 1. */
int mp_run(int W, size_t blob_size, mp_make_blob_fn make_blob, mp_child_fn child, void* ctx,
           double timeout_s);
/* The same; status (W entries, or NULL) receives each rank's fate. */
int mp_run_ex(int W, size_t blob_size, mp_make_blob_fn make_blob, mp_child_fn child, void* ctx,
              double timeout_s, mp_rank_status_t* status);

/* Options of mp_run_opts. */
typedef struct {
  double timeout_s;   /* <= 0: no limit */
  double fail_fast_s; /* < 0: off. Otherwise, once a rank has failed (exit status other than 0
                         and 77, or a signal), the ranks still running get this many seconds
                         to end on their own, then are killed (MP_RANK_STOPPED): peers of a
                         dead rank usually wait in a collective until their own timeout. */
} mp_opts_t;
/* mp_run_ex with options (opts NULL: no timeout, no fail-fast). */
int mp_run_opts(int W, size_t blob_size, mp_make_blob_fn make_blob, mp_child_fn child, void* ctx,
                const mp_opts_t* opts, mp_rank_status_t* status);

/* One child process computes `size` bytes for the parent: fn(buf, size, ctx) runs in the
   child, which sends buf back through a pipe and exits with fn's return value. Returns
   that exit code (0..255) with out[0..size) filled, or -1 (out untouched) when the child
   died from a signal, sent fewer bytes, or ran past timeout_s (then it is killed). The
   child writes to the parent's stdout/stderr directly. Used to ask CUDA questions without
   creating a CUDA context in the parent. */
int mp_call_in_child(int (*fn)(void* out, size_t size, void* ctx), void* ctx, void* out,
                     size_t size, double timeout_s);

/* Seconds on CLOCK_MONOTONIC (for callers that time a run). */
double mp_now_s(void);

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_TESTS_MP_LAUNCH_H_ */
