/* comm.c — communicators: init, split, rank/count, async error, abort, destroy. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/gpu.h"
#include "internal.h"

sbnResult_t sbn_comm_check(sbnComm_t comm) {
  if (comm == NULL) return sbn_fail(NULL, sbnInvalidArgument, "comm is NULL");
  if (comm->magic != SBN_COMM_MAGIC)
    return sbn_fail(NULL, sbnInvalidArgument, "comm is not a valid sbnComm_t (destroyed?)");
  return sbnSuccess;
}

/* A GPU team's kernels report failures in error words; the first one seen aborts the team
   on the host too, so later calls return sbnAborted without launching. */
static void poll_gpu(sbn_team_t* t) {
  if (t->gpu == NULL) return;
  sbnResult_t e = sbn_gpu_poll_error(t);
  if (e != sbnSuccess) sbn_team_abort(t, e);
}

sbnResult_t sbn_comm_check_alive(sbnComm_t comm) {
  poll_gpu(comm->team);
  int reason = atomic_load_explicit(&comm->team->abort_reason, memory_order_acquire);
  if (reason != sbnSuccess)
    return sbn_fail(comm, sbnAborted, "the team was aborted earlier (%s); destroy the comm",
                    sbnGetResultName((sbnResult_t)reason));
  return sbnSuccess;
}

void sbn_team_abort(sbn_team_t* team, sbnResult_t reason) {
  int expected = sbnSuccess;
  if (atomic_compare_exchange_strong(&team->abort_reason, &expected, (int)reason))
    sbn_log(SBN_LOG_INFO, "team %p aborted: %s", (void*)team, sbnGetResultName(reason));
  /* wake ranks waiting in a thread-per-rank split */
  pthread_mutex_lock(&team->split_mu);
  pthread_cond_broadcast(&team->split_cv);
  pthread_mutex_unlock(&team->split_mu);
}

static void team_free(sbn_team_t* t) {
  if (t == NULL) return;
  if (t->gpu != NULL) sbn_gpu_team_detach(t);
  pthread_mutex_destroy(&t->split_mu);
  pthread_cond_destroy(&t->split_cv);
  free(t->mail);
  free(t->payload_store);
  free(t->split_color);
  free(t->split_key);
  free(t->split_result);
  free(t);
}

static void comm_free(sbnComm_t c) {
  if (c == NULL) return;
  c->magic = 0;
  pthread_mutex_destroy(&c->err_mu);
  free(c->ws_local);
  free(c->ws_stats);
  free(c);
}

/* Creates a team of `nranks` and its comms, all or nothing. GPU teams: devices[] as for
   sbn_gpu_team_attach. NCCL teams: only rank `local_rank` lives here (comms[0] is its
   comm), from `nccl` (adopt: as sbn_gpu_team_attach_nccl). */
static sbnResult_t team_create(sbn_comm_kind_t kind, int nranks, const sbn_cfg_t* cfg,
                               const int* devices, int local_rank, struct ncclComm* nccl,
                               int adopt, sbnComm_t* comms) {
  size_t w = (size_t)nranks, mc = (size_t)cfg->max_channels;
  const size_t nlocal = kind == SBN_COMM_GPU_NCCL ? 1 : w;
  sbn_team_t* t = calloc(1, sizeof *t);
  if (t == NULL) {
    if (adopt) sbn_gpu_nccl_discard(nccl);
    return sbn_fail(NULL, sbnSystemError, "out of host memory (team)");
  }
  t->kind = kind;
  t->nranks = nranks;
  t->local_rank = kind == SBN_COMM_GPU_NCCL ? local_rank : -1;
  t->cfg = *cfg;
  atomic_init(&t->abort_reason, sbnSuccess);
  atomic_init(&t->refs, (int)nlocal);
  pthread_mutex_init(&t->split_mu, NULL);
  pthread_cond_init(&t->split_cv, NULL);
  if (kind == SBN_COMM_CPU) { /* the CPU team's exchange */
    t->mail = calloc(w * 2, sizeof *t->mail);
    t->payload_store = calloc(w * 2 * SBN_PAYLOAD_FLOATS * mc, sizeof(float));
  }
  t->split_color = calloc(nlocal, sizeof(int));
  t->split_key = calloc(nlocal, sizeof(int));
  t->split_result = calloc(nlocal, sizeof(sbnComm_t));
  if ((kind == SBN_COMM_CPU && (!t->mail || !t->payload_store)) || !t->split_color ||
      !t->split_key || !t->split_result) {
    team_free(t);
    if (adopt) sbn_gpu_nccl_discard(nccl);
    return sbn_fail(NULL, sbnSystemError, "out of host memory (team of %d, max_channels %zu)",
                    nranks, mc);
  }
  for (size_t i = 0; kind == SBN_COMM_CPU && i < w * 2; i++) {
    atomic_init(&t->mail[i].epoch, 0);
    t->mail[i].payload = t->payload_store + i * SBN_PAYLOAD_FLOATS * mc;
  }
  if (kind != SBN_COMM_CPU) {
    sbnResult_t r = kind == SBN_COMM_GPU_NCCL ? sbn_gpu_team_attach_nccl(t, nccl, adopt)
                                              : sbn_gpu_team_attach(t, devices);
    if (r != sbnSuccess) {
      team_free(t);
      return r;
    }
  }
  w = nlocal; /* the comms made here */
  sbnComm_t* made = calloc(w, sizeof *made);
  if (made == NULL) {
    team_free(t);
    return sbn_fail(NULL, sbnSystemError, "out of host memory (comms)");
  }
  for (size_t r = 0; r < w; r++) {
    sbnComm_t c = calloc(1, sizeof *c);
    if (c != NULL) {
      c->ws_local = calloc(SBN_PAYLOAD_FLOATS * mc, sizeof(float));
      c->ws_stats = calloc(SBN_WS_STATS_FLOATS * mc, sizeof(float));
      pthread_mutex_init(&c->err_mu, NULL);
    }
    if (c == NULL || c->ws_local == NULL || c->ws_stats == NULL) {
      comm_free(c);
      for (size_t q = 0; q < r; q++) comm_free(made[q]);
      free(made);
      team_free(t);
      return sbn_fail(NULL, sbnSystemError, "out of host memory (rank workspace)");
    }
    c->magic = SBN_COMM_MAGIC;
    c->team = t;
    c->rank = kind == SBN_COMM_GPU_NCCL ? local_rank : (int)r;
    made[r] = c;
  }
  memcpy(comms, made, w * sizeof *made);
  free(made);
  if (kind == SBN_COMM_CPU)
    sbn_log(SBN_LOG_INFO, "CPU team %p of %d ranks, timeout %lld ms, max_channels %lld",
            (void*)t, nranks, (long long)cfg->timeout_ms, (long long)cfg->max_channels);
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommInitCpu(sbnComm_t* comms, int nranks, const sbnConfig_t* config) {
  if (comms == NULL) return sbn_fail(NULL, sbnInvalidArgument, "sbnCommInitCpu: comms is NULL");
  if (nranks < 1 || nranks > 4096)
    return sbn_fail(NULL, sbnInvalidArgument, "sbnCommInitCpu: nranks must be in [1, 4096], got %d",
                    nranks);
  sbn_cfg_t cfg;
  sbnResult_t r = sbn_config_resolve(config, &cfg);
  if (r != sbnSuccess) return r;
  return team_create(SBN_COMM_CPU, nranks, &cfg, NULL, -1, NULL, 0, comms);
}

SBN_API sbnResult_t sbnCommInitAll(sbnComm_t* comms, int ndev, const int* devlist,
                                   const sbnConfig_t* config) {
  if (comms == NULL || devlist == NULL || ndev < 1)
    return sbn_fail(NULL, sbnInvalidArgument,
                    "sbnCommInitAll: comms and devlist must be non-NULL and ndev >= 1");
  for (int i = 0; i < ndev; i++)
    if (devlist[i] < 0)
      return sbn_fail(NULL, sbnInvalidArgument, "sbnCommInitAll: devlist[%d] = %d is negative", i,
                      devlist[i]);
  sbn_cfg_t cfg;
  sbnResult_t r = sbn_config_resolve(config, &cfg);
  if (r != sbnSuccess) return r;
  r = team_create(SBN_COMM_GPU_PEER, ndev, &cfg, devlist, -1, NULL, 0, comms);
  if (r != sbnSuccess)
    return sbn_fail(NULL, r, "sbnCommInitAll: %s", sbnGetLastError(NULL));
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommInitVirtual(sbnComm_t* comms, int nranks, int device,
                                       const sbnConfig_t* config) {
  if (comms == NULL || nranks < 1 || device < 0)
    return sbn_fail(NULL, sbnInvalidArgument,
                    "sbnCommInitVirtual: comms must be non-NULL, nranks >= 1, device >= 0");
  sbn_cfg_t cfg;
  sbnResult_t r = sbn_config_resolve(config, &cfg);
  if (r != sbnSuccess) return r;
  r = team_create(SBN_COMM_GPU_VIRTUAL, nranks, &cfg, &device, -1, NULL, 0, comms);
  if (r != sbnSuccess)
    return sbn_fail(NULL, r, "sbnCommInitVirtual: %s", sbnGetLastError(NULL));
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommInitNccl(sbnComm_t* comm, struct ncclComm* nccl,
                                    const sbnConfig_t* config) {
  if (comm == NULL || nccl == NULL)
    return sbn_fail(NULL, sbnInvalidArgument, "sbnCommInitNccl: comm and nccl must be non-NULL");
  sbn_cfg_t cfg;
  sbnResult_t r = sbn_config_resolve(config, &cfg);
  if (r != sbnSuccess) return r;
  r = sbn_comm_create_nccl(nccl, 0, &cfg, comm);
  if (r != sbnSuccess) return sbn_fail(NULL, r, "sbnCommInitNccl: %s", sbnGetLastError(NULL));
  return sbnSuccess;
}

sbnResult_t sbn_comm_create_nccl(struct ncclComm* nccl, int adopt, const sbn_cfg_t* cfg,
                                 sbnComm_t* out) {
  int nranks = 0, rank = 0;
  sbnResult_t r = sbn_gpu_nccl_query(nccl, &nranks, &rank);
  if (r == sbnSuccess && (nranks < 1 || rank < 0 || rank >= nranks))
    r = sbn_fail(NULL, sbnInvalidArgument, "the NCCL comm says rank %d of %d", rank, nranks);
  if (r != sbnSuccess) {
    if (adopt) sbn_gpu_nccl_discard(nccl);
    return r;
  }
  return team_create(SBN_COMM_GPU_NCCL, nranks, cfg, NULL, rank, nccl, adopt, out);
}

/* ---- split ------------------------------------------------------------------------ */

sbnResult_t sbn_split_build(sbn_team_t* parent, const int* color, const int* key,
                            sbnComm_t* result) {
  int w = parent->nranks;
  int* order = malloc((size_t)w * sizeof *order);
  char* done = calloc((size_t)w, 1);
  sbnComm_t* made = calloc((size_t)w, sizeof *made);
  if (!order || !done || !made) {
    free(order);
    free(done);
    free(made);
    return sbn_fail(NULL, sbnSystemError, "out of host memory (split)");
  }
  sbnResult_t r = sbnSuccess;
  for (int first = 0; first < w && r == sbnSuccess; first++) {
    if (done[first] || color[first] < 0) continue;
    /* members of this color, insertion-sorted by (key, parent rank) */
    int m = 0;
    for (int q = first; q < w; q++) {
      if (color[q] != color[first]) continue;
      done[q] = 1;
      int i = m++;
      while (i > 0 && key[order[i - 1]] > key[q]) {
        order[i] = order[i - 1];
        i--;
      }
      order[i] = q;
    }
    sbnComm_t* sub = malloc((size_t)m * sizeof *sub);
    if (sub == NULL) {
      r = sbn_fail(NULL, sbnSystemError, "out of host memory (split)");
      break;
    }
    int* devs = NULL;
    if (parent->kind != SBN_COMM_CPU) {
      devs = malloc((size_t)m * sizeof *devs);
      if (devs == NULL) {
        free(sub);
        r = sbn_fail(NULL, sbnSystemError, "out of host memory (split)");
        break;
      }
      for (int i = 0; i < m; i++) devs[i] = sbn_gpu_rank_device(parent, order[i]);
    }
    r = team_create(parent->kind, m, &parent->cfg, devs, -1, NULL, 0, sub);
    free(devs);
    if (r == sbnSuccess)
      for (int i = 0; i < m; i++) made[order[i]] = sub[i];
    free(sub);
  }
  if (r != sbnSuccess) {
    for (int q = 0; q < w; q++)
      if (made[q] != NULL) sbnCommDestroy(made[q]);
  } else {
    memcpy(result, made, (size_t)w * sizeof *made);
  }
  free(order);
  free(done);
  free(made);
  return r;
}

static sbnResult_t split_check(sbnComm_t comm, int color, sbnComm_t* newcomm) {
  sbnResult_t r = sbn_comm_check(comm);
  if (r != sbnSuccess) return r;
  if (newcomm == NULL) return sbn_fail(comm, sbnInvalidArgument, "sbnCommSplit: newcomm is NULL");
  if (color < SBN_SPLIT_NOCOLOR)
    return sbn_fail(comm, sbnInvalidArgument,
                    "sbnCommSplit: color must be >= 0 or SBN_SPLIT_NOCOLOR, got %d", color);
  return sbn_comm_check_alive(comm);
}

/* Thread-per-rank split: the last rank to arrive builds every sub-team. */
static sbnResult_t split_rendezvous(sbnComm_t comm, int color, int key, sbnComm_t* newcomm) {
  sbn_team_t* t = comm->team;
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += (time_t)(t->cfg.timeout_ms / 1000);
  deadline.tv_nsec += (long)(t->cfg.timeout_ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000L;
  }
  sbnResult_t r;
  pthread_mutex_lock(&t->split_mu);
  uint64_t gen = t->split_gen;
  t->split_color[comm->rank] = color;
  t->split_key[comm->rank] = key;
  if (++t->split_arrived == t->nranks) {
    t->split_status = sbn_split_build(t, t->split_color, t->split_key, t->split_result);
    t->split_arrived = 0;
    t->split_gen++;
    pthread_cond_broadcast(&t->split_cv);
  }
  for (;;) {
    if (t->split_gen != gen) {
      r = t->split_status;
      if (r == sbnSuccess) *newcomm = t->split_result[comm->rank];
      break;
    }
    int reason = atomic_load(&t->abort_reason);
    if (reason != sbnSuccess) {
      r = (sbnResult_t)reason;
      break;
    }
    if (pthread_cond_timedwait(&t->split_cv, &t->split_mu, &deadline) != 0 &&
        t->split_gen == gen) {
      pthread_mutex_unlock(&t->split_mu);
      sbn_team_abort(t, sbnTimeout);
      pthread_mutex_lock(&t->split_mu);
    }
  }
  pthread_mutex_unlock(&t->split_mu);
  if (r != sbnSuccess)
    return sbn_fail(comm, r, "sbnCommSplit: %s while waiting for the team's other ranks",
                    sbnGetResultName(r));
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommSplit(sbnComm_t comm, int color, int key, sbnComm_t* newcomm) {
  sbnResult_t r = split_check(comm, color, newcomm);
  if (r != sbnSuccess) {
    if (sbn_group_active()) sbn_group_mark_failed(r);
    return r;
  }
  if (sbn_group_active()) { /* NCCL teams too: run at sbnGroupEnd (group.c) */
    sbn_op_t op;
    memset(&op, 0, sizeof op);
    op.kind = SBN_OP_SPLIT;
    op.comm = comm;
    op.color = color;
    op.key = key;
    op.newcomm = newcomm;
    return sbn_group_enqueue(&op);
  }
  if (comm->team->kind == SBN_COMM_GPU_NCCL) return sbn_gpu_nccl_split(comm, color, key, newcomm);
  return split_rendezvous(comm, color, key, newcomm);
}

/* ---- queries, abort, destroy --------------------------------------------------------- */

SBN_API sbnResult_t sbnCommRank(sbnComm_t comm, int* rank) {
  sbnResult_t r = sbn_comm_check(comm);
  if (r != sbnSuccess) return r;
  if (rank == NULL) return sbn_fail(comm, sbnInvalidArgument, "sbnCommRank: rank is NULL");
  *rank = comm->rank;
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommCount(sbnComm_t comm, int* count) {
  sbnResult_t r = sbn_comm_check(comm);
  if (r != sbnSuccess) return r;
  if (count == NULL) return sbn_fail(comm, sbnInvalidArgument, "sbnCommCount: count is NULL");
  *count = comm->team->nranks;
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommGetAsyncError(sbnComm_t comm, sbnResult_t* async_error) {
  sbnResult_t r = sbn_comm_check(comm);
  if (r != sbnSuccess) return r;
  if (async_error == NULL)
    return sbn_fail(comm, sbnInvalidArgument, "sbnCommGetAsyncError: async_error is NULL");
  poll_gpu(comm->team);
  *async_error = (sbnResult_t)atomic_load_explicit(&comm->team->abort_reason, memory_order_acquire);
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommAbort(sbnComm_t comm) {
  sbnResult_t r = sbn_comm_check(comm);
  if (r != sbnSuccess) return r;
  sbn_team_abort(comm->team, sbnAborted);
  if (comm->team->gpu != NULL) sbn_gpu_abort(comm->team); /* waiting kernels return */
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommGetTransport(sbnComm_t comm, const char** transport) {
  sbnResult_t r = sbn_comm_check(comm);
  if (r != sbnSuccess) return r;
  if (transport == NULL)
    return sbn_fail(comm, sbnInvalidArgument, "sbnCommGetTransport: transport is NULL");
  *transport = comm->team->kind == SBN_COMM_CPU ? "cpu" : sbn_gpu_transport(comm->team);
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommGetKernel(sbnComm_t comm, const char** kernel) {
  sbnResult_t r = sbn_comm_check(comm);
  if (r != sbnSuccess) return r;
  if (kernel == NULL) return sbn_fail(comm, sbnInvalidArgument, "sbnCommGetKernel: kernel is NULL");
  const char* k = atomic_load(&comm->kernel);
  *kernel = k != NULL ? k : "none";
  return sbnSuccess;
}

SBN_API sbnResult_t sbnCommDestroy(sbnComm_t comm) {
  if (comm == NULL) return sbnSuccess;
  sbnResult_t r = sbn_comm_check(comm);
  if (r != sbnSuccess) return r;
  if (sbn_group_has_comm(comm))
    return sbn_fail(comm, sbnInvalidUsage,
                    "sbnCommDestroy: the comm has ops queued in the open group; end the group first");
  sbn_team_t* t = comm->team;
  comm_free(comm);
  if (atomic_fetch_sub(&t->refs, 1) == 1) team_free(t);
  return sbnSuccess;
}
