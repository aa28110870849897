/* nccl_stub.h — what the stand-in libnccl.so.2 (nccl_stub.c) offers its test beyond NCCL's
 * own API: its record of the calls, the protocol violations it saw, and a reset that
 * re-reads its configuration from the environment.
 *
 * Environment (read at load and at each nccl_stub_reset):
 *   NCCL_STUB_POLLS=k        an operation on a nonblocking comm stays in progress for k
 *                            polls of ncclCommGetAsyncError (default 3; 0: done at once)
 *   NCCL_STUB_RETURN=success what a call returns while its operation is in progress:
 *                   |inprogress  ncclSuccess (default: NCCL 2.28.9's ncclCommSplit and
 *                            ncclCommWindowRegister) or ncclInProgress
 *   NCCL_STUB_HANG=fn[:n]    the n-th operation (default 1) of NCCL function fn stays in
 *                            progress forever: a peer that never comes ("init (split
 *                            child)": the init of a split's child)
 *   NCCL_STUB_PEER_MIN=k:v0,v1,...  a peer's values in the k-th int32 min ncclAllReduce
 *                            (from 1; the library's agreements): each result is the min
 *                            of this rank's value and the peer's (a rank that failed its
 *                            init, or whose config differs)
 * A violation is a call NCCL 2.28.9 refuses or that corrupts memory: a call on a comm
 * whose previous operation is still in progress (refused with ncclInvalidArgument and
 * "Attempt to use communicator before the previous operation returned ncclSuccess"),
 * ncclCommDestroy of such a comm, a use of a comm after its destroy or abort, and an
 * output slot that NCCL writes after the call returns placed on the caller's stack. */
#ifndef SYNCBN_TESTS_NCCL_STUB_H_
#define SYNCBN_TESTS_NCCL_STUB_H_

/* Forgets the record and the counters, re-reads the environment. Not while a call runs. */
void nccl_stub_reset(void);
/* The calls since the last reset, one line each ("fn cN ... -> result"), repeated polls
   folded into one line; violations start with "VIOLATION". An int32 min ncclAllReduce
   (the library's agreements) shows what this rank gave it: "ncclAllReduce cN int32 min
   [1,1,0,64,-64,...] -> result", what it gave, before a peer's (NCCL_STUB_PEER_MIN); an
   ncclAllGather the bytes each rank gives: "ncclAllGather cN 128 bytes -> result". Valid
   until the next call. */
const char* nccl_stub_log(void);
/* Whether the record holds `text`, read under its lock (while other threads call NCCL). */
int nccl_stub_log_has(const char* text);
/* Violations since the last reset. */
int nccl_stub_violations(void);
/* Comms made and not yet destroyed or aborted (since the library was loaded). */
int nccl_stub_live_comms(void);

#endif /* SYNCBN_TESTS_NCCL_STUB_H_ */
