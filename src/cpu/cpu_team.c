/* cpu_team.c — the CPU team's table: its state (the mailbox every rank reads, each rank's
 * epoch and workspaces), its ops run on the calling thread, its split. */
#include <stdlib.h>

#include "cpu.h"

static sbnResult_t cpu_detach(sbn_team_t* team) {
  sbn_cpu_team_t* ct = sbn_cpu_team(team);
  for (int q = 0; ct->ranks != NULL && q < team->nranks; q++) {
    free(ct->ranks[q].local);
    free(ct->ranks[q].stats);
  }
  free(ct->ranks);
  free(ct->mail);
  free(ct);
  team->impl = NULL;
  return sbnSuccess;
}

static sbnResult_t cpu_attach(sbn_team_t* team, sbn_team_init_t* init) {
  (void)init;
  const size_t w = (size_t)team->nranks, mc = (size_t)team->cfg.max_channels;
  sbn_cpu_team_t* ct = calloc(1, sizeof *ct);
  if (ct == NULL) return sbn_fail(NULL, sbnSystemError, "out of host memory (CPU team)");
  team->impl = ct;
  ct->nchunks_max = sbn_mail_chunks(team->cfg.max_channels);
  /* zeroed: epoch 0 is no op's */
  ct->mail = calloc(w * 2 * (size_t)ct->nchunks_max, sizeof *ct->mail);
  ct->ranks = calloc(w, sizeof *ct->ranks);
  int ok = ct->mail != NULL && ct->ranks != NULL;
  for (size_t q = 0; ok && q < w; q++) {
    ct->ranks[q].local = calloc(SBN_CPU_PART_FLOATS * mc, sizeof(float));
    ct->ranks[q].stats = calloc(SBN_CPU_STATS_FLOATS * mc, sizeof(float));
    ok = ct->ranks[q].local != NULL && ct->ranks[q].stats != NULL;
  }
  if (!ok) {
    (void)cpu_detach(team);
    return sbn_fail(NULL, sbnSystemError, "out of host memory (team of %d, max_channels %zu)",
                    team->nranks, mc);
  }
  return sbnSuccess;
}

static sbnResult_t cpu_run(const sbn_op_t* const* round, int n, int* failed) {
  (void)n; /* threaded: one op, on its rank's thread; its failures are on its comm */
  const sbn_op_t* op = round[0];
  *failed = 0;
  return op->kind == SBN_OP_FORWARD ? sbn_cpu_forward(op) : sbn_cpu_backward(op);
}

static sbnResult_t cpu_split(sbn_team_t* team, const int* color, const int* key,
                             sbnComm_t* result) {
  return sbn_split_in_process(team, color, key, NULL, result);
}

static const char* cpu_transport(const sbn_team_t* team) {
  (void)team;
  return "cpu";
}

const sbn_team_ops_t sbn_cpu_team_ops = {
    .name = "CPU",
    .threaded = 1,
    .epilogue = 1,
    .attach = cpu_attach,
    .detach = cpu_detach,
    .prepare = NULL,
    .check = NULL,
    .run = cpu_run,
    .poll = NULL,
    .abort = NULL,
    .split = cpu_split,
    .transport = cpu_transport,
};
