/* comm.c — the public communicator calls: init, split, rank/count, async error, abort,
 * transport, kernel, destroy. Teams are made by the core (team.c) around a backend's
 * table; everything else goes through that table. */
#include <string.h>

#include "cpu/cpu.h"
#include "front.h"
#include "gpu/gpu.h"
#include "internal.h"

SBN_API sbnResult_t sbnCommInitCpu(sbnComm_t* comms, int nranks, const sbnConfig_t* config) {
  if (comms == NULL) return sbn_fail(NULL, sbnInvalidArgument, "sbnCommInitCpu: comms is NULL");
  if (nranks < 1 || nranks > SBN_MAX_CPU_TEAM_RANKS)
    return sbn_fail(NULL, sbnInvalidArgument, "sbnCommInitCpu: nranks must be in [1, %d], got %d",
                    SBN_MAX_CPU_TEAM_RANKS, nranks);
  sbn_cfg_t cfg;
  sbnResult_t r = sbn_config_resolve("sbnCommInitCpu", config, &cfg);
  if (r != sbnSuccess) return r;
  if (nranks > 256)
    sbn_log(SBN_LOG_WARN,
            "sbnCommInitCpu: a CPU team of %d ranks: an op's time grows about quadratically "
            "with the ranks (each reads every rank's records; %d threads share the cores), "
            "seconds per op from about 1000 ranks (syncbn.h)",
            nranks, nranks);
  return sbn_team_create(&sbn_cpu_team_ops, nranks, 0, nranks, &cfg, NULL, comms);
}

/* A GPU team wider than the kernels' parameter block (syncbn.h: sbnUnsupported), refused
   before the team is made: its per-rank allocations would come first (seconds and GBs
   for 10^7 ranks, sbnSystemError where they fail) */
static sbnResult_t gpu_team_width(const char* who, int nranks) {
  if (nranks <= SBN_MAX_GPU_TEAM_RANKS) return sbnSuccess;
  return sbn_fail(NULL, sbnUnsupported, "%s: GPU teams have at most %d ranks, got %d", who,
                  SBN_MAX_GPU_TEAM_RANKS, nranks);
}

SBN_API sbnResult_t sbnCommInitAll(sbnComm_t* comms, int ndev, const int* devlist,
                                   const sbnConfig_t* config) {
  if (comms == NULL || devlist == NULL || ndev < 1)
    return sbn_fail(NULL, sbnInvalidArgument,
                    "sbnCommInitAll: comms and devlist must be non-NULL and ndev >= 1");
  sbnResult_t r = gpu_team_width("sbnCommInitAll", ndev);
  if (r != sbnSuccess) return r;
  for (int i = 0; i < ndev; i++)
    if (devlist[i] < 0)
      return sbn_fail(NULL, sbnInvalidArgument, "sbnCommInitAll: devlist[%d] = %d is negative", i,
                      devlist[i]);
  sbn_cfg_t cfg;
  r = sbn_config_resolve("sbnCommInitAll", config, &cfg);
  if (r != sbnSuccess) return r;
  sbn_team_init_t init = {devlist, NULL, 0, NULL};
  r = sbn_team_create(&sbn_gpu_peer_team_ops, ndev, 0, ndev, &cfg, &init, comms);
  if (r != sbnSuccess)
    return sbn_fail(NULL, r, "sbnCommInitAll: %s", sbn_error_text(NULL));
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommInitVirtual(sbnComm_t* comms, int nranks, int device,
                                       const sbnConfig_t* config) {
  if (comms == NULL || nranks < 1 || device < 0)
    return sbn_fail(NULL, sbnInvalidArgument,
                    "sbnCommInitVirtual: comms must be non-NULL, nranks >= 1, device >= 0");
  sbnResult_t r = gpu_team_width("sbnCommInitVirtual", nranks);
  if (r != sbnSuccess) return r;
  sbn_cfg_t cfg;
  r = sbn_config_resolve("sbnCommInitVirtual", config, &cfg);
  if (r != sbnSuccess) return r;
  sbn_team_init_t init = {&device, NULL, 0, NULL};
  r = sbn_team_create(&sbn_gpu_virtual_team_ops, nranks, 0, nranks, &cfg, &init, comms);
  if (r != sbnSuccess)
    return sbn_fail(NULL, r, "sbnCommInitVirtual: %s", sbn_error_text(NULL));
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommInitNccl(sbnComm_t* comm, struct ncclComm* nccl,
                                    const sbnConfig_t* config) {
  if (comm == NULL || nccl == NULL)
    return sbn_fail(NULL, sbnInvalidArgument, "sbnCommInitNccl: comm and nccl must be non-NULL");
  sbn_cfg_t cfg;
  sbnResult_t r = sbn_config_resolve("sbnCommInitNccl", config, &cfg);
  if (r != sbnSuccess) return r;
  r = sbn_nccl_team_create(nccl, &cfg, comm);
  if (r != sbnSuccess) return sbn_fail(NULL, r, "sbnCommInitNccl: %s", sbn_error_text(NULL));
  return sbnSuccess;
}

SBN_API sbnResult_t sbnGetNcclUniqueId(sbnNcclUniqueId_t* id) {
  if (id == NULL) return sbn_fail(NULL, sbnInvalidArgument, "sbnGetNcclUniqueId: id is NULL");
  sbnNcclUniqueId_t made;
  const sbnResult_t r = sbn_nccl_unique_id(made.internal);
  if (r != sbnSuccess) return sbn_fail(NULL, r, "sbnGetNcclUniqueId: %s", sbn_error_text(NULL));
  *id = made; /* a rejected call writes nothing */
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommInitNcclRank(sbnComm_t* comm, const sbnNcclUniqueId_t* id, int nranks,
                                        int rank, const sbnConfig_t* config) {
  if (comm == NULL || id == NULL)
    return sbn_fail(NULL, sbnInvalidArgument, "sbnCommInitNcclRank: comm and id must be non-NULL");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return sbn_fail(NULL, sbnInvalidArgument,
                    "sbnCommInitNcclRank: need nranks >= 1 and 0 <= rank < nranks; got rank %d of %d",
                    rank, nranks);
  sbn_cfg_t cfg;
  sbnResult_t r = sbn_config_resolve("sbnCommInitNcclRank", config, &cfg);
  if (r != sbnSuccess) return r;
  r = sbn_nccl_team_create_rank(id->internal, nranks, rank, &cfg, comm);
  if (r != sbnSuccess) return sbn_fail(NULL, r, "sbnCommInitNcclRank: %s", sbn_error_text(NULL));
  return sbnSuccess;
}

/* ---- split ------------------------------------------------------------------------ */

/* The split's arguments and the team's state (comm checked and claimed: a comm another
   thread holds is refused for that first, as an op is). */
static sbnResult_t split_check(sbnComm_t comm, int color, sbnComm_t* newcomm) {
  if (newcomm == NULL) return sbn_fail(comm, sbnInvalidArgument, "sbnCommSplit: newcomm is NULL");
  if (color < SBN_SPLIT_NOCOLOR)
    return sbn_fail(comm, sbnInvalidArgument,
                    "sbnCommSplit: color must be >= 0 or SBN_SPLIT_NOCOLOR, got %d", color);
  /* as its ops (gpu_launch.c): one thread's call could only wait out the timeout */
  if (!sbn_group_active() && comm->team->ops == &sbn_gpu_virtual_team_ops && comm->team->nranks > 1)
    return sbn_fail(
        comm, sbnInvalidUsage,
        "sbnCommSplit: a virtual team of %d ranks is split only inside a group: call it "
        "for every rank between sbnGroupStart and sbnGroupEnd; nothing was done",
        comm->team->nranks);
  return sbn_comm_check_alive(comm);
}

/* A split outside a group: now (in a group, sbnGroupEnd runs it: group.c). */
static sbnResult_t run_split(const sbn_op_t* op) {
  sbn_team_t* t = op->comm->team;
  if (t->nlocal > 1) return sbn_split_rendezvous(op->comm, op->color, op->key, op->newcomm);
  int color = op->color, key = op->key;
  sbnResult_t r = t->ops->split(t, &color, &key, op->newcomm); /* the one local rank (NCCL teams) */
  if (r != sbnSuccess) sbn_note(op->comm, sbn_error_text(NULL));
  return r;
}

SBN_API sbnResult_t sbnCommSplit(sbnComm_t comm, int color, int key, sbnComm_t* newcomm) {
  const int cancel = sbn_nocancel_begin(); /* no cancellation point while the comm is claimed */
  int claimed = 0;
  sbnResult_t r = sbn_comm_check(comm, "sbnCommSplit");
  if (r == sbnSuccess) r = sbn_comm_claim(comm, "sbnCommSplit", &claimed);
  if (r == sbnSuccess) r = split_check(comm, color, newcomm);
  sbn_op_t op;
  memset(&op, 0, sizeof op);
  op.kind = SBN_OP_SPLIT;
  op.comm = comm;
  op.color = color;
  op.key = key;
  op.newcomm = newcomm;
  r = sbn_call_finish(&op, r, claimed, run_split);
  sbn_nocancel_end(cancel);
  return r;
}

/* ---- queries, abort, destroy --------------------------------------------------------- */

SBN_API sbnResult_t sbnCommRank(sbnComm_t comm, int* rank) {
  sbnResult_t r = sbn_comm_check(comm, "sbnCommRank");
  if (r != sbnSuccess) return r;
  if (rank == NULL) return sbn_fail(comm, sbnInvalidArgument, "sbnCommRank: rank is NULL");
  *rank = comm->rank;
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommCount(sbnComm_t comm, int* count) {
  sbnResult_t r = sbn_comm_check(comm, "sbnCommCount");
  if (r != sbnSuccess) return r;
  if (count == NULL) return sbn_fail(comm, sbnInvalidArgument, "sbnCommCount: count is NULL");
  *count = comm->team->nranks;
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommGetAsyncError(sbnComm_t comm, sbnResult_t* async_error) {
  sbnResult_t r = sbn_comm_check(comm, "sbnCommGetAsyncError");
  if (r != sbnSuccess) return r;
  if (async_error == NULL)
    return sbn_fail(comm, sbnInvalidArgument, "sbnCommGetAsyncError: async_error is NULL");
  sbn_team_t* t = comm->team;
  sbn_team_poll(t);
  *async_error = (sbnResult_t)atomic_load_explicit(&t->abort_reason, memory_order_acquire);
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommAbort(sbnComm_t comm) {
  sbnResult_t r = sbn_comm_check(comm, "sbnCommAbort");
  if (r != sbnSuccess) return r;
  /* it waits (a GPU team's stop words, bounded): a cancellation there would leave the
     team's count of aborts in progress, which its destroy waits for, and NCCL's lock held */
  const int cancel = sbn_nocancel_begin();
  sbn_team_abort_waiting(comm->team);
  sbn_nocancel_end(cancel);
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommGetTransport(sbnComm_t comm, const char** transport) {
  sbnResult_t r = sbn_comm_check(comm, "sbnCommGetTransport");
  if (r != sbnSuccess) return r;
  if (transport == NULL)
    return sbn_fail(comm, sbnInvalidArgument, "sbnCommGetTransport: transport is NULL");
  *transport = comm->team->ops->transport(comm->team);
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommGetKernel(sbnComm_t comm, const char** kernel) {
  sbnResult_t r = sbn_comm_check(comm, "sbnCommGetKernel");
  if (r != sbnSuccess) return r;
  if (kernel == NULL) return sbn_fail(comm, sbnInvalidArgument, "sbnCommGetKernel: kernel is NULL");
  const char* k = atomic_load(&comm->kernel);
  *kernel = k != NULL ? k : "none";
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommDestroy(sbnComm_t comm) {
  if (comm == NULL) return sbnSuccess;
  sbnResult_t r = sbn_comm_check(comm, "sbnCommDestroy");
  if (r != sbnSuccess) return r;
  if (sbn_group_has_comm(comm)) { /* a failed call of the group: sbnGroupEnd runs nothing */
    r = sbn_fail(comm, sbnInvalidUsage,
                 "sbnCommDestroy: the comm has ops queued in the open group; end the group first "
                 "(it runs nothing now: a call in it failed)");
    sbn_group_mark_failed(r, comm);
    return r;
  }
  const int cancel = sbn_nocancel_begin();
  int claimed = 0; /* kept: the comm is freed */
  r = sbn_comm_claim(comm, "sbnCommDestroy", &claimed);
  if (r == sbnSuccess) r = sbn_comm_release(comm); /* sbnTimeout: see sbn_gpu_team_release */
  sbn_nocancel_end(cancel);
  return r;
}
