/* group.c — sbnGroupStart/End: queue validated ops per thread, check every team is
 * complete, then run them: the splits, the rounds of the teams whose ops are issued
 * asynchronously (GPU teams), and each local rank's queue on a thread of its own for the
 * teams whose ops block until the team meets (CPU teams), their rounds one after the
 * other in queue order; and one op run at once
 * (sbn_op_run: an op outside a group, each op of such a queue). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "front.h"
#include "internal.h"

typedef struct {
  int depth;
  sbnResult_t failed; /* first failure of a call inside the group */
  char failed_detail[512]; /* its sbnGetLastError text, for sbnGroupEnd's (cut to fit) */
  sbn_op_t* ops;
  size_t n, cap;
} sbn_group_t;

static _Thread_local sbn_group_t group;
static _Thread_local char thread_tag; /* its address names the calling thread (comm->user) */

int sbn_group_active(void) { return group.depth > 0; }

sbnResult_t sbn_comm_claim(sbnComm_t comm, const char* fn, int* claimed) {
  uintptr_t me = (uintptr_t)&thread_tag, cur = 0;
  *claimed = 0;
  if (atomic_compare_exchange_strong(&comm->user, &cur, me)) {
    *claimed = 1;
    return sbnSuccess;
  }
  if (cur == me) return sbnSuccess; /* held by this thread's open group */
  return sbn_fail(comm, sbnInvalidUsage,
                  "%s: rank %d's comm is in use by another thread (a call on it, or ops queued "
                  "in that thread's open group); a comm's calls must not overlap: nothing was done",
                  fn, comm->rank);
}

void sbn_comm_unclaim(sbnComm_t comm) { atomic_store(&comm->user, (uintptr_t)0); }

sbnResult_t sbn_call_finish(const sbn_op_t* op, sbnResult_t r, int claimed,
                            sbnResult_t (*run)(const sbn_op_t* op)) {
  if (sbn_group_active()) {
    if (r == sbnSuccess) r = sbn_group_enqueue(op);
    else sbn_group_mark_failed(r, op->comm);
    if (r != sbnSuccess && claimed) sbn_comm_unclaim(op->comm);
    return r;
  }
  if (r == sbnSuccess) r = run(op);
  if (claimed) sbn_comm_unclaim(op->comm);
  return r;
}

/* Frees the queue and gives back the comms it held. */
static void group_reset(void) {
  const uintptr_t me = (uintptr_t)&thread_tag;
  for (size_t i = 0; i < group.n; i++) group.ops[i].comm->pending = 0;
  for (size_t i = 0; i < group.n; i++) {
    uintptr_t mine = me; /* the CAS writes what it found here */
    atomic_compare_exchange_strong(&group.ops[i].comm->user, &mine, (uintptr_t)0);
  }
  free(group.ops);
  memset(&group, 0, sizeof group);
}

/* A thread that exits with a group open: its queue is freed and its comms given back
   (they would stay claimed, and the queue leak). */
static pthread_key_t exit_key;
enum { KEY_NONE, KEY_MADE, KEY_GONE };
static atomic_int exit_key_state; /* KEY_*; made under exit_key_mu */
static pthread_mutex_t exit_key_mu = PTHREAD_MUTEX_INITIALIZER;
static void group_thread_exit(void* unused) {
  (void)unused;
  group_reset();
}
/* The key, made at the first group that needs it and tried again at the next one where
   pthread_key_create failed (the process's keys may have been freed since): KEY_MADE, or
   KEY_NONE (it could not be made), or KEY_GONE (the library is being unloaded). */
static int exit_key_get(void) {
  int s = atomic_load(&exit_key_state);
  if (s != KEY_NONE) return s;
  pthread_mutex_lock(&exit_key_mu);
  if (atomic_load(&exit_key_state) == KEY_NONE && pthread_key_create(&exit_key, group_thread_exit) == 0)
    atomic_store(&exit_key_state, KEY_MADE);
  s = atomic_load(&exit_key_state);
  pthread_mutex_unlock(&exit_key_mu);
  return s;
}
/* The library unloaded (dlclose) or the process exiting: no thread may call a destructor
   that is gone, and no later group uses the deleted key (the queues of threads with a
   group still open are then left, and a group made after this runs without the key: a
   thread of a process that is exiting). */
__attribute__((destructor)) static void delete_exit_key(void) {
  pthread_mutex_lock(&exit_key_mu);
  if (atomic_load(&exit_key_state) == KEY_MADE) pthread_key_delete(exit_key);
  atomic_store(&exit_key_state, KEY_GONE);
  pthread_mutex_unlock(&exit_key_mu);
}

void sbn_group_mark_failed(sbnResult_t r, sbnComm_t comm) {
  if (group.failed != sbnSuccess) return;
  group.failed = r;
  /* the call's own detail, where sbn_note put it (a comm that failed its check: the thread's slot) */
  snprintf(group.failed_detail, sizeof group.failed_detail, "%s",
           sbn_error_text(sbn_comm_valid(comm) ? comm : NULL));
}

sbnResult_t sbn_group_enqueue(const sbn_op_t* op) {
  if (group.n == group.cap) {
    size_t cap = group.cap ? 2 * group.cap : 16;
    sbn_op_t* ops = realloc(group.ops, cap * sizeof *ops);
    if (ops == NULL) {
      sbnResult_t r = sbn_fail(op->comm, sbnSystemError, "out of host memory (group queue)");
      sbn_group_mark_failed(r, op->comm); /* after the detail is recorded: it carries it */
      return r;
    }
    if (group.cap == 0) { /* the thread's first queue: free it should the thread exit */
      const int key = exit_key_get();
      if (key == KEY_NONE || (key == KEY_MADE && pthread_setspecific(exit_key, &group) != 0)) {
        /* without the key a thread that exits with its group open would keep its comms
           claimed for ever (every later call on them refused) and leak its queue */
        free(ops);
        sbnResult_t r = sbn_fail(op->comm, sbnSystemError,
                                 "no thread-specific key for the group's queue (pthread_key_create "
                                 "failed: the process's PTHREAD_KEYS_MAX keys in use?); nothing was "
                                 "queued");
        sbn_group_mark_failed(r, op->comm);
        return r;
      }
    }
    group.ops = ops;
    group.cap = cap;
  }
  group.ops[group.n++] = *op;
  if (op->kind != SBN_OP_SPLIT && sbn_team_all_local(op->comm->team))
    op->comm->pending++; /* counted when the group runs */
  return sbnSuccess;
}

int sbn_group_has_comm(sbnComm_t comm) {
  for (size_t i = 0; i < group.n; i++)
    if (group.ops[i].comm == comm) return 1;
  return 0;
}

SBN_API sbnResult_t sbnGroupStart(void) {
  group.depth++;
  return sbnSuccess;
}

/* ---- running ops ---------------------------------------------------------------------- */

/* One op now: an op called outside a group (ops.c), each op of a threaded team's queue. */
sbnResult_t sbn_op_run(const sbn_op_t* op) {
  sbnResult_t r = sbn_comm_check_alive(op->comm);
  if (r != sbnSuccess) return r;
  const sbn_team_ops_t* ops = op->comm->team->ops;
  if (ops->check != NULL) {
    r = ops->check(&op, 1);
    if (r != sbnSuccess) sbn_note(op->comm, sbn_error_text(NULL)); /* the op's comm too */
  }
  int failed = 0;
  if (r == sbnSuccess) r = ops->run(&op, 1, &failed);
  return r;
}

/* ---- running a complete group --------------------------------------------------------- */

/* The ops of one rank, in queue order (indices into group.ops). */
typedef struct {
  const sbn_op_t* ops;
  size_t* idx;
  size_t n;
  sbnResult_t result;
  size_t failed_at; /* queue index of the first failure */
  char detail[512]; /* its comm's sbnGetLastError text then */
  pthread_t thread;
  int started;
} rank_queue_t;

/* The threaded teams' rounds, one at a time in queue order (for_each_round): a rank's op
   starts when the rounds before its own are done, so it reads what any op queued before
   it wrote, of its team or another; after a round in which an op failed, no later round
   starts. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int go;          /* 0 wait, 1 run, -1 cancelled (a thread could not be created) */
  size_t turn;     /* the round that runs now */
  int left;        /* its ops not done yet */
  int stopped;     /* an op of round `turn` failed: no later round runs */
  size_t* ordinal; /* [group.n]: each threaded op's round */
  int* width;      /* [rounds]: the ranks of each round */
  size_t nrounds;
} start_gate_t;

typedef struct {
  rank_queue_t* q;
  start_gate_t* gate;
} worker_arg_t;

/* Waits for op i's round; 0 where a round before it failed (the op is not run). */
static int round_begin(start_gate_t* g, size_t i) {
  pthread_mutex_lock(&g->mu);
  while (g->turn < g->ordinal[i] && !g->stopped) pthread_cond_wait(&g->cv, &g->mu);
  const int run = g->turn == g->ordinal[i];
  pthread_mutex_unlock(&g->mu);
  return run;
}

static void round_end(start_gate_t* g, int failed) {
  pthread_mutex_lock(&g->mu);
  if (failed) g->stopped = 1;
  if (--g->left == 0 && !g->stopped && ++g->turn < g->nrounds) g->left = g->width[g->turn];
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* A rank's ops in queue order, each in its round's turn, up to the first round in which
   an op failed: a later op may read what the failed one did not write (a backward its
   forward's save_mean, a layer the last one's y, of its team or another). Every op of a
   round runs once its turn has come, so no peer is left waiting: the failures of a
   running op are its team's alike (the exchange: a mismatch, a team of one element, an
   abort), but for a timeout's boundary, where a rank may complete the op its peer timed
   out of. */
static void run_queue(rank_queue_t* q, start_gate_t* g) {
  q->result = sbnSuccess;
  for (size_t i = 0; i < q->n; i++) {
    const sbn_op_t* op = &q->ops[q->idx[i]];
    if (!round_begin(g, q->idx[i])) return;
    sbnResult_t r = sbn_op_run(op);
    if (r != sbnSuccess) {
      q->result = r;
      q->failed_at = q->idx[i];
      snprintf(q->detail, sizeof q->detail, "%s", sbn_error_text(op->comm));
    }
    round_end(g, r != sbnSuccess);
    if (r != sbnSuccess) return;
  }
}

static void* worker_main(void* p) {
  worker_arg_t* a = p;
  pthread_mutex_lock(&a->gate->mu);
  while (a->gate->go == 0) pthread_cond_wait(&a->gate->cv, &a->gate->mu);
  int go = a->gate->go;
  pthread_mutex_unlock(&a->gate->mu);
  if (go > 0) run_queue(a->q, a->gate);
  return NULL;
}

/* Checks that every team touched by the group has all its ranks with the same number of
   ops and of splits; fills `teams` (distinct, in first-appearance order). */
static sbnResult_t check_complete(sbn_team_t** teams, size_t* nteams) {
  size_t nt = 0;
  for (size_t i = 0; i < group.n; i++) {
    sbn_team_t* t = group.ops[i].comm->team;
    size_t j = 0;
    while (j < nt && teams[j] != t) j++;
    if (j == nt) teams[nt++] = t;
  }
  *nteams = nt;
  for (size_t j = 0; j < nt; j++) {
    sbn_team_t* t = teams[j];
    const int nl = t->nlocal; /* NCCL teams: the one rank in this process */
    size_t* cnt = calloc((size_t)nl * 2, sizeof *cnt);
    if (cnt == NULL) return sbn_fail(NULL, sbnSystemError, "out of host memory (group)");
    sbnComm_t named = NULL; /* the team's first comm in the queue, to name it */
    for (size_t i = 0; i < group.n; i++) {
      const sbn_op_t* op = &group.ops[i];
      if (op->comm->team != t) continue;
      cnt[op->comm->local * 2 + (op->kind == SBN_OP_SPLIT)]++;
      if (named == NULL) named = op->comm;
    }
    for (int r = 1; r < nl; r++) {
      for (int s = 0; s < 2; s++) {
        if (cnt[r * 2 + s] != cnt[s]) {
          size_t a = cnt[s], b = cnt[r * 2 + s];
          free(cnt);
          return sbn_fail(NULL, sbnInvalidUsage,
                          "sbnGroupEnd: incomplete team of %d ranks (that of comm %p, rank %d): "
                          "rank 0 has %zu %s, rank %d has %zu; every rank must be in the group; "
                          "nothing was run",
                          t->nranks, (void*)named, named->rank, a, s ? "splits" : "ops", r, b);
        }
      }
    }
    free(cnt);
  }
  return sbnSuccess;
}

/* Makes team t's splits of the group, round by round (round i: the i-th split of each of
   its local ranks). A failure's detail is the thread's (sbnGroupEnd puts it on every
   queued comm). */
static sbnResult_t split_team(sbn_team_t* t) {
  int w = t->nlocal;
  int* color = malloc((size_t)w * sizeof *color);
  int* key = malloc((size_t)w * sizeof *key);
  sbnComm_t* res = malloc((size_t)w * sizeof *res);
  sbn_op_t** round = malloc((size_t)w * sizeof *round);
  size_t* next = calloc((size_t)w, sizeof *next); /* per rank: where to look for its next split */
  sbnResult_t r = sbnSuccess;
  if (!color || !key || !res || !round || !next)
    r = sbn_fail(NULL, sbnSystemError, "out of host memory (split)");
  while (r == sbnSuccess) {
    int found = 0;
    for (int q = 0; q < w; q++) {
      round[q] = NULL;
      for (size_t i = next[q]; i < group.n; i++) {
        sbn_op_t* op = &group.ops[i];
        if (op->kind == SBN_OP_SPLIT && op->comm->team == t && op->comm->local == q) {
          round[q] = op;
          next[q] = i + 1;
          break;
        }
      }
      if (round[q] == NULL) break;
      color[q] = round[q]->color;
      key[q] = round[q]->key;
      found++;
    }
    if (found < w) break; /* counts are equal per rank (checked), so no split is left */
    sbn_team_poll(t);     /* a failure a GPU team's kernel reported since the call aborts it */
    const int reason = atomic_load(&t->abort_reason);
    if (reason != sbnSuccess)
      r = sbn_fail(NULL, sbnAborted,
                   "sbnGroupEnd: split on an aborted team (that of comm %p, rank %d; %s): it "
                   "and the splits of the teams called after it were not made",
                   (void*)round[0]->comm, round[0]->comm->rank,
                   sbnGetResultName((sbnResult_t)reason));
    else
      r = t->ops->split(t, color, key, res); /* NCCL teams: collective with the other processes */
    for (int q = 0; r == sbnSuccess && q < w; q++) *round[q]->newcomm = res[q];
  }
  free(color);
  free(key);
  free(res);
  free(round);
  free(next);
  return r;
}

/* Runs the group's splits one team at a time, in the order of each team's first split in
   the queue (not of its first call of any kind: where the ops stand in the queue does not
   change the order in which an NCCL team's processes reach their collective splits). */
static sbnResult_t run_splits(void) {
  for (size_t i = 0; i < group.n; i++) {
    if (group.ops[i].kind != SBN_OP_SPLIT) continue;
    sbn_team_t* t = group.ops[i].comm->team;
    size_t k = 0;
    while (k < i && !(group.ops[k].kind == SBN_OP_SPLIT && group.ops[k].comm->team == t)) k++;
    if (k < i) continue; /* made with the team's first split */
    const sbnResult_t r = split_team(t);
    if (r != sbnSuccess) return r;
  }
  return sbnSuccess;
}

/* Round i of a team is the i-th op (not a split) of each of its local ranks. */
typedef struct {
  sbn_team_t* team;
  const sbn_op_t** ops; /* [nlocal]: the team's next round */
  size_t* next;         /* [nlocal]: where each rank's next op is searched from */
  size_t first;         /* queue index of the next round's earliest op; group.n: none */
} round_cursor_t;

/* Finds the cursor's next round; first = group.n when the team has no round left. */
static void round_cursor_advance(round_cursor_t* c) {
  int w = c->team->nlocal;
  c->first = group.n;
  for (int q = 0; q < w; q++) {
    c->ops[q] = NULL;
    for (size_t i = c->next[q]; i < group.n; i++) {
      const sbn_op_t* op = &group.ops[i];
      if (op->kind != SBN_OP_SPLIT && op->comm->team == c->team && op->comm->local == q) {
        c->ops[q] = op;
        c->next[q] = i + 1;
        if (i < c->first) c->first = i;
        break;
      }
    }
    if (c->ops[q] == NULL) { /* op counts are equal per rank (checked): no round is left */
      c->first = group.n;
      return;
    }
  }
}

/* Calls fn on every round of the group's teams whose ops->threaded is `threaded`, in queue
   order: the round whose earliest op was queued first goes first, so ops of different
   teams keep the order they were called in (on one stream; a CPU team's op reading what
   another team's op queued before it writes). Stops at fn's first failure. */
typedef sbnResult_t (*round_fn)(const sbn_op_t* const* round, int w, void* ctx);
static sbnResult_t for_each_round(sbn_team_t* const* teams, size_t nt, int threaded, round_fn fn,
                                  void* ctx) {
  sbnResult_t r = sbnSuccess;
  size_t nc = 0;
  round_cursor_t* cur = calloc(nt ? nt : 1, sizeof *cur);
  if (cur == NULL) return sbn_fail(NULL, sbnSystemError, "out of host memory (group)");
  for (size_t j = 0; j < nt && r == sbnSuccess; j++) {
    if (teams[j]->ops->threaded != threaded) continue;
    round_cursor_t* c = &cur[nc++];
    c->team = teams[j];
    c->ops = malloc((size_t)teams[j]->nlocal * sizeof *c->ops);
    c->next = calloc((size_t)teams[j]->nlocal, sizeof *c->next);
    if (!c->ops || !c->next) r = sbn_fail(NULL, sbnSystemError, "out of host memory (group)");
    else round_cursor_advance(c);
  }
  while (r == sbnSuccess) {
    round_cursor_t* c = NULL;
    for (size_t j = 0; j < nc; j++)
      if (cur[j].first < group.n && (c == NULL || cur[j].first < c->first)) c = &cur[j];
    if (c == NULL) break;
    r = fn(c->ops, c->team->nlocal, ctx);
    round_cursor_advance(c);
  }
  for (size_t j = 0; j < nc; j++) {
    free(cur[j].ops);
    free(cur[j].next);
  }
  free(cur);
  return r;
}

static sbnResult_t check_round(const sbn_op_t* const* round, int w, void* unused) {
  (void)unused;
  const sbn_team_ops_t* ops = round[0]->comm->team->ops;
  return ops->check != NULL ? ops->check(round, w) : sbnSuccess;
}

static sbnResult_t run_round(const sbn_op_t* const* round, int w, void* unused) {
  (void)unused;
  int failed = 0;
  sbnResult_t r = sbn_comm_check_alive(round[0]->comm);
  if (r == sbnSuccess) r = round[0]->comm->team->ops->run(round, w, &failed);
  if (r != sbnSuccess) sbn_note(NULL, sbn_error_text(round[failed]->comm));
  return r;
}

/* The teams whose ops are issued asynchronously (GPU teams). run == 0: checks every round
   (before anything runs: all or nothing). run == 1: runs the rounds in queue order. The
   backend decides how a round is issued (a virtual team's as ONE cooperative launch). */
static sbnResult_t rounds(sbn_team_t* const* teams, size_t nt, int run) {
  sbnResult_t r = for_each_round(teams, nt, 0, run ? run_round : check_round, NULL);
  if (r != sbnSuccess) sbn_fail(NULL, r, "sbnGroupEnd: %s", sbn_error_text(NULL));
  return r;
}

static sbnResult_t number_round(const sbn_op_t* const* round, int w, void* ctx) {
  start_gate_t* g = ctx;
  for (int q = 0; q < w; q++) g->ordinal[round[q] - group.ops] = g->nrounds;
  g->width[g->nrounds++] = w;
  return sbnSuccess;
}

/* A refusal of the whole group (nothing run): its detail, recorded for the thread
   (sbnGetLastError(NULL)), also on every comm queued in it, where a caller following
   sbnGetErrorString's "sbnGetLastError(comm) has the detail" looks (it read ""); with
   threaded_only, on the comms of the threaded teams (CPU teams) only: run_ops' refusal,
   when the other teams' ops and the splits have run. */
static void note_on_queued_comms(int threaded_only) {
  const char* detail = sbn_error_text(NULL);
  for (size_t i = 0; i < group.n; i++)
    if (!threaded_only || group.ops[i].comm->team->ops->threaded)
      sbn_note(group.ops[i].comm, detail);
}

/* Runs every (team, local rank) queue of the threaded teams (CPU teams) on its own
   thread, the first on the calling thread, the rounds one after the other. Where it cannot start
   them (memory, a thread), none of them is run and the detail is on their comms too (the
   other teams' ops and the group's splits have run before). */
static sbnResult_t run_ops(sbn_team_t* const* teams, size_t nt) {
  size_t nq = 0;
  for (size_t j = 0; j < nt; j++)
    if (teams[j]->ops->threaded) nq += (size_t)teams[j]->nlocal;
  if (nq == 0) return sbnSuccess;
  start_gate_t gate;
  memset(&gate, 0, sizeof gate);
  rank_queue_t* qs = calloc(nq, sizeof *qs);
  size_t* idx = malloc(group.n * sizeof *idx);
  worker_arg_t* args = calloc(nq, sizeof *args);
  gate.ordinal = malloc(group.n * sizeof *gate.ordinal);
  gate.width = malloc(group.n * sizeof *gate.width);
  sbnResult_t result = !qs || !idx || !args || !gate.ordinal || !gate.width
                           ? sbn_fail(NULL, sbnSystemError, "out of host memory (group)")
                           : for_each_round(teams, nt, 1, number_round, &gate);
  if (result != sbnSuccess) {
    note_on_queued_comms(1);
    free(qs);
    free(idx);
    free(args);
    free(gate.ordinal);
    free(gate.width);
    return result;
  }
  gate.left = gate.nrounds ? gate.width[0] : 0;
  /* lay the indices out queue by queue */
  size_t pos = 0, k = 0;
  for (size_t j = 0; j < nt; j++) {
    if (!teams[j]->ops->threaded) continue;
    for (int r = 0; r < teams[j]->nlocal; r++, k++) {
      qs[k].ops = group.ops;
      qs[k].idx = idx + pos;
      for (size_t i = 0; i < group.n; i++) {
        const sbn_op_t* op = &group.ops[i];
        if (op->kind != SBN_OP_SPLIT && op->comm->team == teams[j] && op->comm->local == r)
          idx[pos + qs[k].n++] = i;
      }
      pos += qs[k].n;
    }
  }
  pthread_mutex_init(&gate.mu, NULL);
  pthread_cond_init(&gate.cv, NULL);
  /* the rank threads' stacks: SBN_GROUP_THREAD_STACK (syncbn.h), not the default
     (RLIMIT_STACK's, 8 MiB on most systems), which every thread holds in address space: a
     group of 256 ranks took 2 GiB of it, and failed under ulimit -v where its buffers fit
     (a rank's op: under 64 KB of stack, its deepest frame sbn_cpu_local_stats' 46 KB) */
  pthread_attr_t attr;
  const int have_attr = pthread_attr_init(&attr) == 0;
  if (have_attr) (void)pthread_attr_setstacksize(&attr, SBN_GROUP_THREAD_STACK);
  for (size_t i = 1; i < nq; i++) {
    if (qs[i].n == 0) continue;
    args[i].q = &qs[i];
    args[i].gate = &gate;
    /* (the stack also holds the thread's static TLS: a host process with a huge one gets
       the default stack instead) */
    if (pthread_create(&qs[i].thread, have_attr ? &attr : NULL, worker_main, &args[i]) != 0 &&
        (!have_attr || pthread_create(&qs[i].thread, NULL, worker_main, &args[i]) != 0)) {
      result = sbn_fail(NULL, sbnSystemError,
                        "sbnGroupEnd: could not create a thread for rank work; no CPU team's op "
                        "was run");
      note_on_queued_comms(1);
      break;
    }
    qs[i].started = 1;
  }
  if (have_attr) pthread_attr_destroy(&attr);
  pthread_mutex_lock(&gate.mu);
  gate.go = result == sbnSuccess ? 1 : -1;
  pthread_cond_broadcast(&gate.cv);
  pthread_mutex_unlock(&gate.mu);
  if (result == sbnSuccess && nq > 0 && qs[0].n > 0) run_queue(&qs[0], &gate);
  for (size_t i = 1; i < nq; i++)
    if (qs[i].started) pthread_join(qs[i].thread, NULL);
  if (result == sbnSuccess) {
    /* the failure earliest in queue order, so the result does not depend on timing */
    size_t first = group.n, fq = 0;
    for (size_t i = 0; i < nq; i++) {
      if (qs[i].n && qs[i].result != sbnSuccess && qs[i].failed_at < first) {
        first = qs[i].failed_at;
        fq = i;
        result = qs[i].result;
      }
    }
    if (result != sbnSuccess)
      sbn_fail(NULL, result, "sbnGroupEnd: an op failed (%s): %s", sbnGetResultName(result),
               qs[fq].detail);
  }
  pthread_cond_destroy(&gate.cv);
  pthread_mutex_destroy(&gate.mu);
  free(qs);
  free(idx);
  free(args);
  free(gate.ordinal);
  free(gate.width);
  return result;
}

SBN_API sbnResult_t sbnGroupEnd(void) {
  if (group.depth == 0)
    return sbn_fail(NULL, sbnInvalidUsage, "sbnGroupEnd without a matching sbnGroupStart");
  if (--group.depth > 0) return sbnSuccess;
  const int cancel = sbn_nocancel_begin();
  sbnResult_t r;
  if (group.failed != sbnSuccess) {
    r = sbn_fail(NULL, sbnInvalidUsage,
                 "sbnGroupEnd: a call in this group failed (%s: %s); nothing was run",
                 sbnGetResultName(group.failed), group.failed_detail);
    note_on_queued_comms(0);
    group_reset();
    sbn_nocancel_end(cancel);
    return r;
  }
  sbn_team_t** teams = calloc(group.n ? group.n : 1, sizeof *teams);
  size_t nt = 0;
  if (teams == NULL) {
    r = sbn_fail(NULL, sbnSystemError, "out of host memory (group)");
    note_on_queued_comms(0); /* nothing was run */
  } else {
    r = check_complete(teams, &nt);
    if (r == sbnSuccess) r = rounds(teams, nt, 0);
    if (r != sbnSuccess) note_on_queued_comms(0); /* nothing was run */
    if (r == sbnSuccess) {
      r = run_splits();
      if (r != sbnSuccess) note_on_queued_comms(0); /* no op was run */
    }
    if (r == sbnSuccess) r = rounds(teams, nt, 1);
    if (r == sbnSuccess) { /* the queued ops count now (internal.h: sbnComm.calls) */
      for (size_t i = 0; i < group.n; i++) {
        sbnComm_t c = group.ops[i].comm;
        c->calls = (c->calls + c->pending) % SBN_SIG_CALLS;
        c->pending = 0;
      }
      r = run_ops(teams, nt);
    }
  }
  free(teams);
  group_reset();
  sbn_nocancel_end(cancel);
  return r;
}
