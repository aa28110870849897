/* team.c — the core's part of teams and comms: creation and release around a backend's
 * attach and detach, the abort state, the split of in-process teams and the rendezvous
 * of a split driven one thread per rank. Backend-neutral: a team's backend is reached
 * only through its table (team->ops).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

sbnResult_t sbn_comm_check(sbnComm_t comm, const char* fn) {
  if (comm == NULL) return sbn_fail(NULL, sbnInvalidArgument, "%s: comm is NULL", fn);
  /* A best-effort check against a pointer that was never a comm: a destroyed comm's
     memory is freed, and using it is undefined (include/syncbn.h, sbnCommDestroy). */
  if (comm->magic != SBN_COMM_MAGIC)
    return sbn_fail(NULL, sbnInvalidArgument, "%s: comm is not a valid sbnComm_t", fn);
  return sbnSuccess;
}

void sbn_team_poll(sbn_team_t* t) {
  if (t->ops->poll == NULL) return;
  sbnResult_t e = t->ops->poll(t);
  if (e != sbnSuccess) sbn_team_abort(t, e);
}

sbnResult_t sbn_comm_check_alive(sbnComm_t comm) {
  sbn_team_t* t = comm->team;
  sbn_team_poll(t);
  int reason = atomic_load_explicit(&t->abort_reason, memory_order_acquire);
  if (reason == sbnSuccess) return sbnSuccess;
  const int gone = sbn_team_departed(t);
  if (gone >= 0)
    return sbn_fail(comm, sbnAborted,
                    "rank %d of the team was destroyed (sbnCommDestroy) before this call on "
                    "rank %d; the team is aborted: no op of it can complete, destroy the comm",
                    gone, comm->rank);
  return sbn_fail(comm, sbnAborted, "the team was aborted earlier (%s); destroy the comm",
                  sbnGetResultName((sbnResult_t)reason));
}

int sbn_team_departed(const sbn_team_t* t) {
  /* departed is stored before the abort it causes (sbn_comm_release), so a reader that
     saw that abort sees the rank; the other teams record a destroyed rank without an
     abort, so their aborts are never its */
  if (!t->ops->threaded) return -1;
  if (atomic_load_explicit(&t->abort_reason, memory_order_acquire) != sbnAborted) return -1;
  return atomic_load_explicit(&t->departed, memory_order_acquire);
}

/* The abort with split_mu held: a thread-per-rank split's last rank decides under it
   whether the split is made (sbn_split_rendezvous). */
static void team_abort_locked(sbn_team_t* team, sbnResult_t reason) {
  int expected = sbnSuccess;
  if (atomic_compare_exchange_strong(&team->abort_reason, &expected, (int)reason))
    sbn_log(SBN_LOG_INFO, "team %p aborted: %s", (void*)team, sbnGetResultName(reason));
  pthread_cond_broadcast(&team->split_cv); /* wake ranks waiting in a thread-per-rank split */
}

void sbn_team_abort(sbn_team_t* team, sbnResult_t reason) {
  pthread_mutex_lock(&team->split_mu);
  team_abort_locked(team, reason);
  pthread_mutex_unlock(&team->split_mu);
}

void sbn_team_abort_waiting(sbn_team_t* team) {
  atomic_fetch_add(&team->aborting, 1); /* before the abort the waiters see */
  sbn_team_abort(team, sbnAborted);
  if (team->ops->abort != NULL) team->ops->abort(team); /* waiting work returns */
  atomic_fetch_sub(&team->aborting, 1);
}

int sbn_cond_init_monotonic(pthread_cond_t* cv) {
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca) != 0) return 0;
  const int ok =
      pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(cv, &ca) == 0;
  pthread_condattr_destroy(&ca);
  return ok;
}

static sbnResult_t team_free(sbn_team_t* t) {
  if (t == NULL) return sbnSuccess;
  /* an sbnCommAbort whose waiter returned, and whose comm was destroyed, still running */
  while (atomic_load(&t->aborting) != 0) {
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  const sbnResult_t r = t->impl != NULL ? t->ops->detach(t) : sbnSuccess;
  pthread_mutex_destroy(&t->split_mu);
  pthread_cond_destroy(&t->split_cv);
  free(t->split_color);
  free(t->split_key);
  free(t->split_here);
  free(t->split_result);
  free(t);
  return r;
}

static void comm_free(sbnComm_t c) {
  if (c == NULL) return;
  c->magic = 0;
  pthread_mutex_destroy(&c->err_mu);
  free(c);
}

sbnResult_t sbn_team_create(const sbn_team_ops_t* ops, int nranks, int first_local, int nlocal,
                            const sbn_cfg_t* cfg, sbn_team_init_t* init, sbnComm_t* comms) {
  sbn_team_init_t none;
  memset(&none, 0, sizeof none);
  if (init == NULL) init = &none;
  const size_t nl = (size_t)nlocal;
  sbn_team_t* t = calloc(1, sizeof *t);
  sbnComm_t* made = calloc(nl, sizeof *made);
  int clock_ok = 1;
  if (t != NULL) {
    t->split_color = calloc(nl, sizeof(int));
    t->split_key = calloc(nl, sizeof(int));
    t->split_here = calloc(nl, 1);
    t->split_result = calloc(nl, sizeof(sbnComm_t));
    pthread_mutex_init(&t->split_mu, NULL);
    /* the split's wait measures its timeout on the monotonic clock, as the ops' waits do */
    clock_ok = sbn_cond_init_monotonic(&t->split_cv);
    if (!clock_ok) pthread_cond_init(&t->split_cv, NULL); /* for team_free's destroy */
  }
  if (t == NULL || made == NULL || !t->split_color || !t->split_key || !t->split_here ||
      !t->split_result || !clock_ok) {
    (void)team_free(t);
    free(made);
    if (!clock_ok)
      return sbn_fail(NULL, sbnSystemError,
                      "a team's condition variable on CLOCK_MONOTONIC could not be made");
    return sbn_fail(NULL, sbnSystemError, "out of host memory (team of %d ranks)", nranks);
  }
  t->ops = ops;
  t->nranks = nranks;
  t->first_local = first_local;
  t->nlocal = nlocal;
  t->cfg = *cfg;
  atomic_init(&t->abort_reason, sbnSuccess);
  atomic_init(&t->refs, nlocal);
  atomic_init(&t->departed, -1);
  /* The comms before the backend's attach, which is the last thing that can fail: an NCCL
     team's attach ends in agreements with the other processes (nccl_team.c), after which
     this rank failing alone would leave them a team that can only time out. */
  sbnResult_t r = sbnSuccess;
  for (size_t i = 0; i < nl; i++) {
    sbnComm_t c = calloc(1, sizeof *c);
    if (c == NULL) {
      r = sbn_fail(NULL, sbnSystemError, "out of host memory (comms)");
      break;
    }
    pthread_mutex_init(&c->err_mu, NULL);
    c->magic = SBN_COMM_MAGIC;
    c->team = t;
    c->rank = first_local + (int)i;
    c->local = (int)i;
    made[i] = c;
  }
  if (r == sbnSuccess) r = ops->attach(t, init); /* on failure t->impl stays NULL */
  if (r != sbnSuccess) {
    for (size_t i = 0; i < nl; i++) comm_free(made[i]);
    free(made);
    (void)team_free(t); /* no impl: nothing of a backend to wait for */
    return r;
  }
  memcpy(comms, made, nl * sizeof *made);
  free(made);
  sbn_log(SBN_LOG_INFO, "%s team %p of %d ranks (%d here), timeout %lld ms, max_channels %lld",
          ops->name, (void*)t, nranks, nlocal, (long long)cfg->timeout_ms,
          (long long)cfg->max_channels);
  return sbnSuccess;
}

/* A rank of a threaded team leaves while others of the team live: none of the team's ops
   can complete any more, so the team is aborted now and its peers' waits name the rank,
   instead of ending at the timeout. Its ops were synchronous, so it has none in flight;
   an op it finished saw every rank's records of that op, so a peer still finishing the
   same op finds them (wait_epoch reads the abort, then the epoch) and succeeds. The
   first departure names the team's abort; a team aborted already keeps its reason. */
static void team_depart(sbn_team_t* t, int rank) {
  if (atomic_load_explicit(&t->abort_reason, memory_order_acquire) != sbnSuccess) return;
  int none = -1;
  atomic_compare_exchange_strong(&t->departed, &none, rank);
  sbn_log(SBN_LOG_INFO, "%s team %p: rank %d destroyed while %d local ranks live; aborting it",
          t->ops->name, (void*)t, rank, atomic_load(&t->refs) - 1);
  sbn_team_abort_waiting(t);
}

sbnResult_t sbn_comm_release(sbnComm_t comm) {
  sbn_team_t* t = comm->team;
  const int rank = comm->rank;
  comm_free(comm);
  /* this rank's reference keeps t alive until the fetch_sub below */
  if (t->ops->threaded && atomic_load(&t->refs) > 1) team_depart(t, rank);
  if (!t->ops->threaded && t->nlocal > 1) {
    /* Not aborted (kernels may still finish an op it took part in), but a thread-per-rank
       split can no longer meet: its waiting ranks wake and fail (sbn_split_rendezvous).
       Under split_mu, so that no other rank's destroy frees t before the broadcast. */
    pthread_mutex_lock(&t->split_mu);
    int none = -1;
    atomic_compare_exchange_strong(&t->departed, &none, rank);
    const int last = atomic_fetch_sub(&t->refs, 1) == 1;
    pthread_cond_broadcast(&t->split_cv);
    pthread_mutex_unlock(&t->split_mu);
    return last ? team_free(t) : sbnSuccess;
  }
  return atomic_fetch_sub(&t->refs, 1) == 1 ? team_free(t) : sbnSuccess;
}

/* ---- split ------------------------------------------------------------------------ */

sbnResult_t sbn_split_in_process(sbn_team_t* parent, const int* color, const int* key,
                                 const int* rank_devices, sbnComm_t* result) {
  const int w = parent->nranks;
  int* order = malloc((size_t)w * sizeof *order);
  int* devs = malloc((size_t)w * sizeof *devs);
  char* done = calloc((size_t)w, 1);
  sbnComm_t* made = calloc((size_t)w, sizeof *made);
  sbnComm_t* sub = malloc((size_t)w * sizeof *sub);
  sbnResult_t r = sbnSuccess;
  if (!order || !devs || !done || !made || !sub)
    r = sbn_fail(NULL, sbnSystemError, "out of host memory (split)");
  int failed_color = -1;
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
    sbn_team_init_t init;
    memset(&init, 0, sizeof init);
    /* the parent's abort ends the new team's waits (a GPU team's zeroing; split by a group:
       a thread-per-rank split holds split_mu, which the abort waits for) */
    init.stop = &parent->abort_reason;
    if (rank_devices != NULL) {
      for (int i = 0; i < m; i++) devs[i] = rank_devices[order[i]];
      init.devices = devs;
    }
    r = sbn_team_create(parent->ops, m, 0, m, &parent->cfg, &init, sub);
    if (r == sbnSuccess)
      for (int i = 0; i < m; i++) made[order[i]] = sub[i];
    else
      failed_color = color[first];
  }
  if (r != sbnSuccess) {
    /* the release of the colours made may fail too (a destroy's sbnTimeout on a busy
       device) and say so in this thread's slot: the split's own failure is the one kept */
    char why[512];
    if (failed_color >= 0)
      snprintf(why, sizeof why, "sbnCommSplit: the new team of colour %d: %s", failed_color,
               sbn_error_text(NULL));
    else
      snprintf(why, sizeof why, "%s", sbn_error_text(NULL));
    for (int q = 0; made != NULL && q < w; q++)
      if (made[q] != NULL) (void)sbn_comm_release(made[q]);
    sbn_note(NULL, why);
  } else {
    memcpy(result, made, (size_t)w * sizeof *made);
  }
  free(order);
  free(devs);
  free(done);
  free(made);
  free(sub);
  return r;
}

sbnResult_t sbn_split_rendezvous(sbnComm_t comm, int color, int key, sbnComm_t* newcomm) {
  sbn_team_t* t = comm->team;
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline); /* split_cv's clock (sbn_team_create) */
  deadline.tv_sec += (time_t)(t->cfg.timeout_ms / 1000);
  deadline.tv_nsec += (long)(t->cfg.timeout_ms % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) {
    deadline.tv_sec++;
    deadline.tv_nsec -= 1000000000L;
  }
  sbnResult_t r = sbnSuccess;
  int missing = -1; /* the first local rank that had not called when the wait ended */
  char failed[sizeof t->split_detail] = ""; /* the split was tried and failed: why */
  pthread_mutex_lock(&t->split_mu);
  uint64_t gen = t->split_gen;
  t->split_color[comm->local] = color;
  t->split_key[comm->local] = key;
  t->split_here[comm->local] = 1;
  /* The last rank makes the split unless the team was aborted: the abort's CAS and this
     check are both made under split_mu, so a split is made for every rank or for none (a
     rank whose wait ran out, or a peer's abort, either comes first and every rank fails,
     or comes after the split and every rank has its comm). */
  const int late = atomic_load(&t->abort_reason) != sbnSuccess; /* aborted before this call */
  if (++t->split_arrived == t->nlocal && !late) {
    t->split_status = t->ops->split(t, t->split_color, t->split_key, t->split_result);
    if (t->split_status != sbnSuccess) /* for every rank: the cause is in this thread's slot */
      snprintf(t->split_detail, sizeof t->split_detail, "%s", sbn_error_text(NULL));
    t->split_arrived = 0;
    memset(t->split_here, 0, (size_t)t->nlocal);
    t->split_gen++;
    pthread_cond_broadcast(&t->split_cv);
  }
  int why = sbnSuccess; /* the abort's reason */
  int lost = 0;         /* a rank was destroyed, before this call or during its wait */
  for (;;) {
    if (t->split_gen != gen) {
      r = t->split_status;
      if (r == sbnSuccess) *newcomm = t->split_result[comm->local];
      /* stable until this rank returns: the next round needs it to arrive */
      else snprintf(failed, sizeof failed, "%s", t->split_detail[0] ? t->split_detail : "(no detail)");
      break;
    }
    why = atomic_load(&t->abort_reason);
    if (why != sbnSuccess) {
      /* sbnTimeout, or sbnAborted whatever stopped the team (a peer's launch failure,
         sbnCommAbort...), as a check before the call gives (sbn_comm_check_alive) */
      r = why == sbnTimeout ? sbnTimeout : sbnAborted;
      for (int i = 0; r == sbnTimeout && i < t->nlocal && missing < 0; i++)
        if (!t->split_here[i]) missing = i; /* a timeout's cause (an abort has its own) */
      break;
    }
    /* a destroyed rank never calls (a team its destroy does not abort: sbn_comm_release) */
    if (!t->ops->threaded && atomic_load(&t->refs) < t->nlocal) {
      t->split_here[comm->local] = 0;
      t->split_arrived--;
      lost = 1;
      break;
    }
    if (pthread_cond_timedwait(&t->split_cv, &t->split_mu, &deadline) != 0 &&
        t->split_gen == gen)
      team_abort_locked(t, sbnTimeout); /* no split was made: none will be */
  }
  pthread_mutex_unlock(&t->split_mu);
  if (lost)
    return sbn_fail(comm, sbnInvalidUsage,
                    "sbnCommSplit: rank %d of the team was destroyed (sbnCommDestroy), so the "
                    "team's ranks cannot all call; no split was made",
                    atomic_load(&t->departed));
  if (r == sbnSuccess) return sbnSuccess;
  if (failed[0] != '\0') return sbn_fail(comm, r, "sbnCommSplit: no split was made: %s", failed);
  const int gone = sbn_team_departed(t);
  if (r == sbnAborted && gone >= 0)
    return sbn_fail(comm, r,
                    "sbnCommSplit: rank %d of the team was destroyed (sbnCommDestroy) while "
                    "rank %d waited for the team's other ranks; the team is aborted",
                    gone, comm->rank);
  if (late)
    return sbn_fail(comm, r,
                    "sbnCommSplit: rank %d called after the team was aborted (%s); no split "
                    "was made",
                    comm->rank, sbnGetResultName((sbnResult_t)why));
  if (missing >= 0)
    return sbn_fail(comm, r,
                    "sbnCommSplit: sbnTimeout: rank %d waited for rank %d, which had not "
                    "called sbnCommSplit within the team's timeout",
                    comm->rank, t->first_local + missing);
  return sbn_fail(comm, r,
                  "sbnCommSplit: the team was aborted (%s) while rank %d waited for the "
                  "team's other ranks; no split was made",
                  sbnGetResultName((sbnResult_t)why), comm->rank);
}
