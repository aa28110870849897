/* nccl_wait.c — the one rule for waiting on NCCL's nonblocking communicators.
 *
 * Every comm syncbn makes is nonblocking (ncclConfig_t.blocking = 0), so that no NCCL call
 * holds the host past the team's deadline. NCCL's contract for such a comm: a call may
 * return before its operation has finished, and the comm must not be used again until
 * ncclCommGetAsyncError on it reports something other than ncclInProgress (a call made
 * before that fails with ncclInvalidArgument, "Attempt to use communicator before the
 * previous operation returned ncclSuccess"). What a call returns does not say whether it
 * has finished: NCCL 2.28.9 returns ncclSuccess from ncclCommSplit and
 * ncclCommWindowRegister while they are still in progress, and a comm made by
 * ncclCommInitRankConfig or a split is itself in progress until its init is done.
 *
 * The rule, for every call on a comm (each comm of a group):
 *   - whatever the call returned, ncclSuccess included, poll ncclCommGetAsyncError on the
 *     comm until it is not ncclInProgress, bounded by the team's deadline and, where the
 *     call is a team's, by its abort (the wait holds the team's NCCL lock for reading,
 *     which sbnCommAbort's abort of the comms must take for writing: without it the abort
 *     waited out the wait, up to the timeout); past it the result is ncclInProgress and the
 *     caller aborts the comm (or, for the caller's own comm, leaves it to the caller);
 *   - a split: the parent, then the child once it is non-NULL. NCCL writes the child only
 *     when the parent's part is done, so a NULL child (no colour) is known only after the
 *     parent has settled;
 *   - an output that NCCL writes after the call returns (a split's child, a window handle,
 *     ncclCommInitRankConfig's comm) lives on the heap, never on the stack, and after a
 *     timeout NCCL may still write it: it is never freed (one pointer), but kept
 *     reachable for leak checkers (sbn_gpu_park).
 * Only a call that failed at once (an error other than ncclInProgress) started nothing,
 * and is not waited for. Comm-less calls (ncclGroupStart, ncclGetVersion, ncclMemAlloc)
 * and the calls that end a comm (ncclCommAbort, ncclCommDestroy after a settled
 * ncclCommFinalize) are not waited for: there is nothing left to poll. */
#include "gpu/gpu_internal.h"

#if SYNCBN_HAVE_NCCL

ncclResult_t sbn_nccl_settle(ncclResult_t r, const ncclComm_t* comms, int n, int64_t deadline_ns,
                             const _Atomic int* stop) {
  if (r != ncclSuccess && r != ncclInProgress) return r; /* refused: nothing started */
  ncclResult_t first_failure = ncclSuccess;
  for (int i = 0; i < n; i++) {
    if (comms[i] == NULL) continue;
    ncclResult_t s;
    for (;;) { /* polled once even past the deadline: a finished call is not a timeout */
      ncclResult_t async = ncclSuccess;
      ncclResult_t q = sbn_nccl.CommGetAsyncError(comms[i], &async);
      s = q != ncclSuccess ? q : async;
      if (s != ncclInProgress || sbn_mono_ns() > deadline_ns) break;
      if (stop != NULL && atomic_load(stop) != 0) break; /* aborted: the caller says so */
      struct timespec ts = {0, 100000}; /* 100 us */
      nanosleep(&ts, NULL);
    }
    if (first_failure == ncclSuccess) first_failure = s;
  }
  return first_failure;
}

#endif
