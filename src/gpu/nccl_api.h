/* nccl_api.h — NCCL as libsyncbn calls it: loaded with dlopen at its first use
 * (sbn_nccl_load: an NCCL team, sbnCommInitAll's NCCL comms), every call through one table
 * of function pointers (sbn_nccl), so that neither libsyncbn.so nor a program linking
 * libsyncbn.a needs libnccl.so.2 (208 MB) to start. Only in builds with NCCL's headers. */
#ifndef SYNCBN_GPU_NCCL_API_H_
#define SYNCBN_GPU_NCCL_API_H_

#include <nccl.h>

#include "internal.h"

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#define SBN_NCCL_DEVICE_API 1 /* symmetric windows, ncclGetPeerPointer (kernels/coop.cu) */
#else
#define SBN_NCCL_DEVICE_API 0
#endif

/* The functions libsyncbn calls, by their name without "nccl": every NCCL that has
   ncclCommSplit (2.18) has them. */
#define SBN_NCCL_CORE_FUNCTIONS(X)                                                                 \
  X(GetVersion)                                                                                    \
  X(GetErrorString) X(GetLastError) X(GetUniqueId) X(CommInitRankConfig) X(GroupStart) X(GroupEnd) \
      X(CommGetAsyncError) X(CommCount) X(CommUserRank) X(CommCuDevice) X(CommSplit)               \
          X(CommFinalize) X(CommDestroy) X(CommAbort) X(AllReduce) X(AllGather)
/* The nccl-lsa transport's (NCCL >= 2.28): NULL in an older NCCL, whose teams take the
   host path (nccl_team.c reads the version first). */
#if SBN_NCCL_DEVICE_API
#define SBN_NCCL_DEVICE_FUNCTIONS(X) \
  X(MemAlloc) X(MemFree) X(CommWindowRegister) X(CommWindowDeregister)
#else
#define SBN_NCCL_DEVICE_FUNCTIONS(X)
#endif

/* Each member has the type of its function in nccl.h (no symbol is referenced). */
#define SBN_NCCL_MEMBER_(name) __typeof__(&nccl##name) name;
typedef struct {
  SBN_NCCL_CORE_FUNCTIONS(SBN_NCCL_MEMBER_)
  SBN_NCCL_DEVICE_FUNCTIONS(SBN_NCCL_MEMBER_)
  /* ncclTeamLsa(ncclComm_t), declared in a C++ header (nccl_device/core.h): called by
     kernels/coop.cu (sbn_nccl_lsa_size), which casts it to its type; NULL before 2.28 */
  void (*TeamLsa)(void);
} sbn_nccl_api_t;
#undef SBN_NCCL_MEMBER_

/* Filled by the first successful sbn_nccl_load, unchanged afterwards. Every NCCL comm
   libsyncbn holds was made after that load, so whoever uses a comm sees it filled. */
SBN_INTERNAL extern sbn_nccl_api_t sbn_nccl;

/* Loads NCCL once per process: SBN_NCCL_LIBRARY when set (then only it), else the soname
   libnccl.so.2 where the program already loaded it, then the library CMake found at build
   time, then libnccl.so.2 as the loader finds it; a candidate that does not open or lacks a
   required symbol is passed over for the next. sbnSuccess (kept: later calls return at once), or
   sbnUnsupported with *why (the calling thread's text) saying what was searched and why
   each failed, not kept: the next call tries again. Records nothing (a team without NCCL
   comms is no failure). Thread-safe. */
SBN_INTERNAL sbnResult_t sbn_nccl_load(const char** why);

#endif /* SYNCBN_GPU_NCCL_API_H_ */
