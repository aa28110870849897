/* gpu_launch.c — how a GPU team's ops run: the checks at the call (prepare) and before a
 * round runs (check), the plan of a round (kernel variant, blocks per rank), the
 * argument block, and the launches: one cooperative kernel per op, or the host-driven
 * path (stats, collective, apply). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_internal.h"

/* ---- at the call ----------------------------------------------------------------------- */

/* Every non-NULL tensor is device (or managed) memory of the rank's device:
   sbnInvalidArgument naming the first that is not (one cudaPointerGetAttributes each). */
static sbnResult_t check_pointers(const sbn_op_t* op) {
  const struct sbn_gpu_team* gt = sbn_gpu(op->comm->team);
  const int fwd = op->kind == SBN_OP_FORWARD;
  const sbn_tensor_arg_t ts[] = {{op->x, "x"},
                                 {op->out, fwd ? "y" : "dx"},
                                 {fwd ? NULL : op->dy, "dy"},
                                 {op->z, "z"},
                                 {op->y, "y"},
                                 {op->dz, "dz"},
                                 {op->weight, "weight"},
                                 {op->bias, "bias"},
                                 {op->running_mean, "running_mean"},
                                 {op->running_var, "running_var"},
                                 {op->num_batches_tracked, "num_batches_tracked"},
                                 {op->save_mean, "save_mean"},
                                 {op->save_invstd, "save_invstd"},
                                 {op->dweight, "dweight"},
                                 {op->dbias, "dbias"}};
  return sbn_gpu_check_tensors(op->comm, sbn_op_fn(op), ts, sizeof ts / sizeof ts[0],
                               gt->ranks[op->comm->rank].device, "this rank's device", 1);
}

/* SBN_ALGO_COOP or SBN_ALGO_HOST, or -1 (an unknown value; the detail is recorded). */
static int algo_from_env(sbnComm_t comm) {
  const char* v = getenv("SBN_ALGO");
  if (v == NULL || v[0] == '\0' || strcmp(v, "coop") == 0) return SBN_ALGO_COOP;
  if (strcmp(v, "nccl") == 0) return SBN_ALGO_HOST;
  sbn_fail(comm, sbnInvalidArgument, "SBN_ALGO='%s': expected 'coop' (the default) or 'nccl'", v);
  return -1;
}

/* The cooperative kernel's variant the call asks for, from SBN_KERNEL: "auto" (default),
   "onchip", "stream", "unit", "small" (SBN_KERNEL_* of kernels/coop_plan.h), or -1 (an
   unknown value, or "legacy", the first kernel, removed: the detail is recorded). */
static int kernel_from_env(sbnComm_t comm) {
  static const char* const names[] = {"auto", "onchip", "stream", "unit", "small"}; /* SBN_KERNEL_* */
  const char* v = getenv("SBN_KERNEL");
  if (v == NULL || v[0] == '\0') return SBN_KERNEL_AUTO;
  for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
    if (strcmp(v, names[i]) == 0) return i;
  const char* why = strcmp(v, "legacy") == 0 ? "the first kernel was removed in 0.1.0 (it lost "
                                               "to 'stream' on every row of the GPU runs); "
                                             : "";
  sbn_fail(comm, sbnInvalidArgument,
           "SBN_KERNEL='%s': %sexpected 'auto' (the default), 'onchip', 'stream', 'unit' or 'small'",
           v, why);
  return -1;
}

/* SBN_SM_MARGIN: the SMs that a GPU team's grid leaves free (sbn_gpu_usable_sms), or -1
   (unset: the default, which depends on the team), or -2 (not an integer in [0, 4096]:
   the detail is recorded). */
static int sm_margin_from_env(sbnComm_t comm) {
  const char* v = getenv("SBN_SM_MARGIN");
  if (v == NULL || v[0] == '\0') return -1;
  long long m = 0;
  if (!sbn_env_int(v, 0, 4096, &m)) {
    sbn_fail(comm, sbnInvalidArgument,
             "SBN_SM_MARGIN='%s': expected a number of SMs in [0, 4096], digits only (0: none; "
             "unset or empty: %d for a team that spans GPUs, else none)",
             v, SBN_DEFAULT_SM_MARGIN);
    return -2;
  }
  return (int)m;
}

sbnResult_t sbn_gpu_prepare(sbn_op_t* op, int in_group) {
  const sbn_team_t* team = op->comm->team;
  sbnResult_t r = check_pointers(op);
  if (r != sbnSuccess) return r;
  op->algo = algo_from_env(op->comm);
  if (op->algo < 0) return sbnInvalidArgument;
  if (!sbn_transport_in_kernel(sbn_gpu(team)->transport)) op->algo = SBN_ALGO_HOST; /* "nccl-host" */
  op->kernel = kernel_from_env(op->comm);
  if (op->kernel < 0) return sbnInvalidArgument;
  op->sm_margin = sm_margin_from_env(op->comm);
  if (op->sm_margin < -1) return sbnInvalidArgument;
  if (!in_group && sbn_gpu(team)->transport == SBN_TR_VIRTUAL && team->nranks > 1)
    return sbn_fail(op->comm, sbnInvalidUsage,
                    "%s: a virtual team of %d ranks runs each op as ONE launch for all its ranks: "
                    "call the op for every rank between sbnGroupStart and sbnGroupEnd",
                    sbn_op_fn(op), team->nranks);
  return sbnSuccess;
}

/* ---- before a round runs ----------------------------------------------------------------- */

static int has_nccl(const struct sbn_gpu_team* gt) {
#if SYNCBN_HAVE_NCCL
  return gt->nccl != NULL;
#else
  (void)gt;
  return 0;
#endif
}

/* Every rank of the team, all on one device: the host path can run them without NCCL. */
static int one_device_round(const sbn_op_t* const* ops, int nops) {
  const struct sbn_gpu_team* gt = sbn_gpu(ops[0]->comm->team);
  if (nops != gt->nranks) return 0;
  for (int i = 1; i < nops; i++)
    if (gt->ranks[ops[i]->comm->rank].device != gt->ranks[ops[0]->comm->rank].device) return 0;
  return 1;
}

/* A team with a rank per GPU in this process (sbnCommInitAll). */
static int peer_team(const struct sbn_gpu_team* gt) {
  return gt->transport == SBN_TR_PEER || gt->transport == SBN_TR_PEER_HOST;
}

/* A team whose ranks are on more than one GPU: an NCCL team of several processes, or an
   in-process team on more than one device. Its ranks wait in-kernel for each other, so
   its grids leave SBN_DEFAULT_SM_MARGIN SMs free by default. An "nccl-host" team waits in
   NCCL's collective, not in a kernel, but plans with the same SMs all the same: the grid
   sets the reduction tree, and a team's bits must not depend on which transport its init
   found (nccl-lsa on one run, nccl-host on another). */
static int spans_gpus(const struct sbn_gpu_team* gt) {
  if (gt->local >= 0) return gt->nranks > 1;
  for (int q = 1; q < gt->nranks; q++)
    if (gt->ranks[q].device != gt->ranks[0].device) return 1;
  return 0;
}

int sbn_gpu_stop_words(const struct sbn_gpu_team* gt, int dev, uint32_t** stop) {
  int n = 0;
  for (int q = 0; q < gt->nranks && n < SBN_GPU_MAX_RANKS; q++) {
    const gpu_rank_t* g = &gt->ranks[q];
    if (g->present && g->state != NULL &&
        (g->device == dev || gt->transport == SBN_TR_VIRTUAL || gt->transport == SBN_TR_PEER))
      stop[n++] = &g->state->stop;
  }
  return n;
}

int sbn_gpu_usable_sms(int sms, int spans, int margin) {
  if (margin < 0) margin = spans ? SBN_DEFAULT_SM_MARGIN : 0;
  if (margin == 0) return sms;
  const int floor = (sms + 1) / 2; /* never less than half the GPU */
  return sms - margin < floor ? floor : sms - margin;
}

/* The op of a round whose layout the round runs in: the first whose layout matters (a
   rank whose layout is immaterial, sbn_sig_layouts 0, takes its peers'), else ops[0].
   Its signature is the round's (fill_args), its layout the plan's (plan_round). */
static const sbn_op_t* round_ref(const sbn_op_t* const* ops, int nops) {
  for (int i = 0; i < nops; i++)
    if (sbn_sig_layouts(sbn_op_signature(ops[i])) != 0) return ops[i];
  return ops[0];
}

/* Whether the stream is capturing a CUDA graph (a failed query counts as capturing: no
   call number is compared then). */
static int stream_capturing(cudaStream_t s) {
  enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &cs) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1;
  }
  return cs != cudaStreamCaptureStatusNone;
}

/* Whether a team's ops carry their call numbers (kernels/bn_op.h): not a virtual team's
   (one launch runs every rank, so its ranks cannot be out of step; an op refused outside
   a group on one rank leaves its groups in step), nor a team of one's. */
static int numbered_team(const struct sbn_gpu_team* gt) {
  return gt->transport != SBN_TR_VIRTUAL && gt->nranks > 1;
}

/* Whether op's rank has launched an op under a CUDA graph capture (gpu_rank_t.graphed). */
static int rank_graphed(const sbn_op_t* op) {
  return atomic_load_explicit(&sbn_gpu(op->comm->team)->ranks[op->comm->rank].graphed, memory_order_relaxed);
}

/* Marks the ranks of the ops as graphed (gpu_rank_t.graphed). */
static void mark_graphed(const sbn_op_t* const* ops, int nops) {
  for (int i = 0; i < nops; i++)
    atomic_store_explicit(&sbn_gpu(ops[i]->comm->team)->ranks[ops[i]->comm->rank].graphed, 1,
                          memory_order_relaxed);
}

/* An op's signature as a GPU team compares it: with the rank's call number, or unnumbered
   where none is compared (numbered_team) or can be: a rank that captured an op into a
   CUDA graph (its count counts the capture, not the replays, whose kernels keep the
   capture's arguments; a peer that runs the same steps eagerly, or captured at another
   time, counts otherwise), from its first capture on. */
static uint32_t gpu_sig(const sbn_op_t* op) {
  const uint32_t sig = sbn_op_signature(op);
  return !numbered_team(sbn_gpu(op->comm->team)) || rank_graphed(op) ? sbn_sig_unnumbered(sig) : sig;
}

/* Whether s is the legacy default stream: NULL or its explicit handle, cudaStreamLegacy. */
static int legacy_stream(sbnStream_t s) {
  return s == NULL || (cudaStream_t)s == cudaStreamLegacy;
}

sbnResult_t sbn_gpu_check(const sbn_op_t* const* ops, int nops) {
  const sbn_op_t* o0 = ops[0];
  const sbn_team_t* team = o0->comm->team;
  const struct sbn_gpu_team* gt = sbn_gpu(team);
  const int whole_team = nops == team->nranks;
  const sbn_op_t* ref = round_ref(ops, nops); /* the layout that matters, if any */
  /* the call numbers as the kernels would compare them: of every rank given one, one */
  const uint32_t rs = gpu_sig(ref);
  const sbn_op_t* numbered = NULL; /* the last op before o with a call number (all alike) */
  int64_t m = 0;
  for (int i = 0; i < nops; i++) {
    const sbn_op_t* o = ops[i];
    const uint32_t sig = gpu_sig(o);
    const sbn_op_t* other = o; /* the op o differs from, if any */
    if (sbn_sig_call_bit(sig) != 0u) {
      if (numbered != NULL && sbn_sig_call_bit(gpu_sig(numbered)) != sbn_sig_call_bit(sig)) other = numbered;
      numbered = o;
    }
    if (!sbn_sig_same_but_call(sig, rs) || (sbn_sig_layouts(sig) | sbn_sig_layouts(rs)) == 3) other = ref;
    if (other != o) {
      const uint32_t os = gpu_sig(other);
      char why[480];
      return sbn_fail(NULL, sbnInvalidUsage, "%s; nothing was run",
                      sbn_sig_mismatch(other->comm->rank, os, o->comm->rank, sig, why, sizeof why));
    }
    if (o->algo != o0->algo)
      return sbn_fail(NULL, sbnInvalidUsage,
                      "rank %d's op runs SBN_ALGO=%s, rank %d's %s: the ranks of a "
                      "team must run the same path; nothing was run",
                      o0->comm->rank, o0->algo == SBN_ALGO_HOST ? "nccl" : "coop", o->comm->rank,
                      o->algo == SBN_ALGO_HOST ? "nccl" : "coop");
    m += o->desc.n * o->desc.spatial;
    /* one launch runs the round's ranks with one kernel: the in-place backward's (x
       recovered from y) or the x-based one (an empty rank reads nothing: it may pass
       either; sbn_gpu_round_epi) */
    for (int j = 0; j < i && o->kind == SBN_OP_BACKWARD && o->desc.n > 0; j++)
      if (ops[j]->desc.n > 0 && (ops[j]->x == NULL) != (o->x == NULL))
        return sbn_fail(NULL, sbnInvalidUsage,
                        "rank %d runs the in-place backward (x NULL: x recovered from y), rank %d the "
                        "x-based one: the ranks of a team must pass the same choice; nothing was run",
                        (o->x == NULL ? o : ops[j])->comm->rank, (o->x == NULL ? ops[j] : o)->comm->rank);
  }
  /* ranks of a peer team that share a GPU are separate launches that must run at the same
     time: on one stream (or the legacy default stream, by either of its handles, which
     every blocking stream waits for and which waits for them) the second waits for the
     first, which waits for the second until the timeout */
  if (peer_team(gt) && o0->algo == SBN_ALGO_COOP)
    for (int i = 0; i < nops; i++)
      for (int j = i + 1; j < nops; j++) {
        const sbn_op_t *a = ops[i], *b = ops[j];
        if (gt->ranks[a->comm->rank].device != gt->ranks[b->comm->rank].device)
          continue;
        if (legacy_stream(a->stream) || legacy_stream(b->stream) || a->stream == b->stream)
          return sbn_fail(NULL, sbnInvalidUsage,
                          "ranks %d and %d share device %d and must run at the same time: give "
                          "each its own stream (not the legacy default stream, NULL or "
                          "cudaStreamLegacy); nothing was run",
                          a->comm->rank, b->comm->rank, gt->ranks[a->comm->rank].device);
      }
  /* a group's ops run now, or all at a graph's replay: a rank whose stream captures beside
     one whose stream does not would wait, run now, for a peer that runs at the replay
     (capture every rank's stream, joined by events, or put the ranks on one stream) */
  const int cap0 = nops > 1 ? stream_capturing((cudaStream_t)o0->stream) : 0;
  for (int i = 1; i < nops; i++)
    if (stream_capturing((cudaStream_t)ops[i]->stream) != cap0) {
      const int cap = cap0 ? o0->comm->rank : ops[i]->comm->rank;
      return sbn_fail(NULL, sbnInvalidUsage,
                      "rank %d's stream captures a CUDA graph and rank %d's does not: the ranks of "
                      "a group run together, now or at the graph's replay (capture every rank's "
                      "stream); nothing was run",
                      cap, cap == o0->comm->rank ? ops[i]->comm->rank : o0->comm->rank);
    }
  /* the host path without NCCL comms runs a team's ranks together, on one device */
  if (o0->algo == SBN_ALGO_HOST && peer_team(gt) && team->nranks > 1 && !has_nccl(gt) &&
      !(whole_team && one_device_round(ops, nops)))
    return sbn_fail(NULL, sbnInvalidUsage,
                    "SBN_ALGO=nccl: this team has no NCCL comm (%s), so its host path runs "
                    "only with every rank in one sbnGroupStart/sbnGroupEnd and all ranks on "
                    "one device; nothing was run",
                    gt->nccl_why);
  if (whole_team && o0->kind == SBN_OP_FORWARD && m == 1)
    return sbn_fail(NULL, sbnInvalidArgument,
                    "Expected more than 1 value per channel when training (the team's batch "
                    "has 1 element per channel); nothing was run");
  return sbnSuccess;
}

/* The plans of a round (kernels/coop_plan.h: sbn_plan_round), pl[i] for ops[i]: the
   kernel variant and width, G blocks per rank, the unit shape; one plan for a virtual
   team's launch, each other rank its own. Both paths use them, so the host path reduces
   in the same order as the cooperative kernel (the same bits). A failure's detail goes to
   the calling thread's slot. */
static sbnResult_t plan_round(const sbn_op_t* const* ops, int nops, sbn_plan_t* pl) {
  const sbn_op_t* o0 = ops[0];
  const sbn_team_t* team = o0->comm->team;
  const struct sbn_gpu_team* gt = sbn_gpu(team);
  const gpu_rank_t* g0 = &gt->ranks[o0->comm->rank];
  const int kind = o0->kind, dt = o0->desc.dtype, epi = sbn_gpu_round_epi(ops, nops);
  const sbn_plan_op_t op = {kind, dt, round_ref(ops, nops)->desc.layout == sbnLayoutNHWC, o0->desc.c,
                            o0->algo == SBN_ALGO_HOST, o0->kernel,
                            team->nranks == 1 && gt->transport != SBN_TR_PEER_HOST,
                            epi != SBN_EPI_NONE,
                            team->nranks > 1 && gt->transport != SBN_TR_PEER_HOST};
  sbn_plan_rank_t ranks[SBN_GPU_MAX_RANKS];
  for (int i = 0; i < nops; i++) {
    const sbn_op_t* o = ops[i];
    ranks[i].n = o->desc.n;
    ranks[i].sp = o->desc.spatial;
    ranks[i].aligned = sbn_aligned16(o->x) && sbn_aligned16(o->dy) && sbn_aligned16(o->out) &&
                       sbn_aligned16(o->z) && sbn_aligned16(o->y) && sbn_aligned16(o->dz);
  }
  sbn_plan_dev_t dev;
  dev.sms = sbn_gpu_usable_sms(g0->sms, spans_gpus(gt), o0->sm_margin);
  dev.ranks_here = gt->transport == SBN_TR_VIRTUAL ? nops : g0->share;
  dev.shared = peer_team(gt) && g0->share > 1;
  memcpy(dev.occ, g0->occ[epi][kind][dt], sizeof dev.occ);
  dev.occ_min = g0->occ_min;
  memcpy(dev.hold_slots, g0->hold_slots[epi][kind][dt], sizeof dev.hold_slots);
  int64_t detail = 0;
  switch (sbn_plan_round(&op, ranks, nops, gt->transport == SBN_TR_VIRTUAL, &dev, pl, &detail)) {
    case SBN_PLAN_OK: return sbnSuccess;
    case SBN_PLAN_ONCHIP_SHARED:
      return sbn_fail(NULL, sbnUnsupported,
                      "SBN_KERNEL=onchip: ranks sharing a GPU run the stream kernel; nothing "
                      "was run");
    case SBN_PLAN_ONCHIP_SHAPE:
      return sbn_fail(NULL, sbnUnsupported,
                      "SBN_KERNEL=onchip: the onchip kernel needs x, dy, y/dx (and z, y, dz) 16-byte "
                      "aligned and a shape of whole 16-byte vectors (NHWC: C a multiple of the "
                      "vector width; NCHW: H*W a multiple of it); nothing was run");
    case SBN_PLAN_NO_BLOCKS:
      return sbn_fail(NULL, sbnUnsupported,
                      "%d ranks on device %d: more than its %" PRId64 " co-resident blocks",
                      dev.ranks_here, g0->device, detail);
    default:
      return sbn_fail(NULL, sbnUnsupported,
                      "SBN_KERNEL=onchip: the tensor does not fit on chip (%" PRId64
                      " batches per thread, %d held with %d blocks per rank); nothing was run",
                      detail, SBN_HOLD_REG_BATCHES(dt, pl->tile) + pl->hold_slots, pl->G);
  }
}

/* sbnCommGetKernel's name of a plan. */
static const char* plan_kernel_name(const sbn_plan_t* pl) {
  if (pl->variant == SBN_VAR_ONCHIP) return "onchip";
  if (pl->variant == SBN_VAR_UNIT) return "unit";
  if (SBN_VAR_IS_SMALL(pl->variant)) return "small"; /* a team of one's or a team's */
  return pl->vec ? "stream" : "stream-scalar";
}

/* checked: the round holds an op of every rank of the team, which sbn_gpu_check compared
   (no kernel of the round can find an op mismatch) */
static void fill_args(sbn_coop_args_t* a, const sbn_op_t* const* ops, int nops,
                      const sbn_plan_t* pl, int checked) {
  const sbn_op_t* o0 = ops[0];
  const sbn_team_t* team = o0->comm->team;
  const struct sbn_gpu_team* gt = sbn_gpu(team);
  const int host = o0->algo == SBN_ALGO_HOST;
  memset(a, 0, sizeof *a);
  for (int i = 0; i < nops; i++) {
    const sbn_op_t* o = ops[i];
    const gpu_rank_t* g = &gt->ranks[o->comm->rank];
    sbn_coop_rank_t* R = &a->r[i];
    R->x = o->x;
    R->dy = o->dy;
    R->out = o->out;
    R->weight = o->weight;
    R->bias = o->bias;
    R->running_mean = o->running_mean;
    R->running_var = o->running_var;
    R->nbt = o->num_batches_tracked;
    R->save_mean_in = o->save_mean;
    R->save_mean = o->save_mean;
    R->save_invstd = o->save_invstd;
    R->dweight = o->dweight;
    R->dbias = o->dbias;
    R->n = o->desc.n;
    R->spatial = o->desc.spatial;
    R->state = g->state;
    R->part = g->part;
    R->mail = host ? g->recv : g->mail;
    R->send = g->send;
    R->rank = o->comm->rank;
    R->eps = o->params.eps;
    R->momentum = o->params.momentum;
    R->grad_global = o->params.grad_mode == sbnGradGlobal;
    R->z = o->z;
    R->y = o->y;
    R->dz = o->dz;
    R->dz_early = o->dz != NULL && checked && sbn_plan_dz_early(pl, host); /* coop_args.h */
    R->act = o->act;
    R->slope = o->slope;
    R->recover = o->kind == SBN_OP_BACKWARD && o->x == NULL && o->y != NULL;
    R->xmask = o->kind == SBN_OP_BACKWARD && sbn_xmask_applies(o->no_residual, o->act, o->x, o->y, o->dz);
    if (R->recover) R->x = o->y; /* the in-place backward reads y in x's place */
  }
  if (gt->local < 0) /* NCCL teams: the window (below), or the collective */
    for (int q = 0; q < gt->nranks; q++) a->mail[q] = host ? gt->ranks[q].send : gt->ranks[q].mail;
  if (gt->transport == SBN_TR_NCCL_WINDOW) {
    a->win = gt->win;
    a->fail_off = sbn_window_fail_off(gt->nranks, gt->nchunks_max);
    a->fail = (uint32_t*)((char*)gt->win_buf + a->fail_off);
  }
  a->err = gt->err;
  a->nstop = sbn_gpu_stop_words(gt, gt->ranks[o0->comm->rank].device, a->stop);
  /* the error words at a kernel's start only where they are how a failure arrives:
     another GPU without peer access */
  a->host_words_at_start = gt->transport == SBN_TR_PEER_HOST;
  a->host_poll_ns = gt->transport == SBN_TR_PEER_HOST ? SBN_HOST_POLL_NS : SBN_HOST_POLL_FALLBACK_NS;
  a->c = o0->desc.c;
  a->timeout_ns = team->cfg.timeout_ms * 1000000; /* no overflow: clamped in config.c */
  /* the call number, but for a virtual team's launch (one for every rank), a team of one's
     and a rank's that was launched under a graph capture (gpu_sig: the launch functions
     mark the ranks first, from the stream they launch on) */
  a->sig = gpu_sig(round_ref(ops, nops));
  a->nranks = gt->nranks;
  a->nlaunch = nops;
  a->G = pl->G;
  a->nchunks_max = gt->nchunks_max;
  a->hold_slots = pl->hold_slots;
}

/* What ran each rank's op (sbnCommGetKernel), once it has been launched. */
static void note_kernel(const sbn_op_t* const* ops, int nops, const sbn_plan_t* pl) {
  for (int i = 0; i < nops; i++)
    atomic_store(&ops[i]->comm->kernel,
                 ops[0]->algo == SBN_ALGO_HOST ? "host" : plan_kernel_name(pl));
}

/* One launch of `fn` (cooperative or not) with the argument block. */
static cudaError_t launch(const void* fn, unsigned grid, int cooperative, size_t dyn,
                          sbn_coop_args_t* a, cudaStream_t stream) {
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute attr;
  void* args[1] = {a};
  memset(&cfg, 0, sizeof cfg);
  memset(&attr, 0, sizeof attr);
  cfg.gridDim.x = grid;
  cfg.gridDim.y = cfg.gridDim.z = 1;
  cfg.blockDim.x = SBN_GPU_THREADS;
  cfg.blockDim.y = cfg.blockDim.z = 1;
  cfg.stream = stream;
  cfg.dynamicSmemBytes = dyn;
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = cooperative ? 1 : 0;
  return cudaLaunchKernelExC(&cfg, fn, args);
}

/* The host path's statistics of the ranks in `a` (per of them, one plan): STATS and
   PUBLISH (nch blocks per rank), or, where the plan is small, small's statistics kernel
   alone (coop_plan.h: sbn_host_stats_stage), each rank's records into its `send`. */
static cudaError_t host_stats(sbn_coop_args_t* a, int kind, int dt, const sbn_plan_t* pl, unsigned per,
                              unsigned nch, cudaStream_t s) {
  const int epi = sbn_args_epilogue(a);
  cudaError_t e = launch(sbn_host_kernel_ptr(sbn_host_stats_stage(pl), kind, dt, pl->tile, pl->vec, epi),
                         per * (unsigned)pl->G, 0, 0, a, s);
  if (e == cudaSuccess && sbn_host_publishes(pl))
    e = launch(sbn_host_kernel_ptr(SBN_HOST_PUBLISH, kind, dt, pl->tile, pl->vec, epi), per * nch, 0, 0, a, s);
  return e;
}

/* The ranks of one device, issued together (a virtual team; the host path of ranks
   sharing a GPU), with their plans pl[i]: everything runs on the first op's stream, after
   the work queued on the others' streams, and their streams wait for it. The cooperative
   kernel is one launch (all of a virtual team's ranks, or one rank). The host path's
   stages are one launch for a virtual team's ranks (one plan), one per rank otherwise
   (each rank's own plan: tile and width may differ, so may the kernels). *launched: set
   once a kernel of the op is queued. */
static sbnResult_t launch_one_device(const sbn_op_t* const* ops, int nops, const sbn_plan_t* pl,
                                     int checked, int* launched) {
  static _Thread_local sbn_coop_args_t a; /* 3.6 KB: not on the stack */
  const sbn_op_t* o0 = ops[0];
  struct sbn_gpu_team* gt = sbn_gpu(o0->comm->team);
  const gpu_rank_t* g0 = &gt->ranks[o0->comm->rank];
  const int kind = o0->kind;
  const int dt = o0->desc.dtype;
  sbnResult_t r = sbnSuccess;
  cudaStream_t s0 = (cudaStream_t)o0->stream;
  int joined = 0;
  int was[SBN_GPU_MAX_RANKS], marked = 0; /* the ranks' graphed marks before this launch */
  for (int i = 1; i < nops; i++) {
    cudaStream_t si = (cudaStream_t)ops[i]->stream;
    if (si == s0) continue;
    cudaEvent_t ev = gt->ranks[ops[i]->comm->rank].ev;
    CU(cudaEventRecord(ev, si), "cudaEventRecord");
    CU(cudaStreamWaitEvent(s0, ev, 0), "cudaStreamWaitEvent");
    joined = 1;
  }
  /* every kernel of the round goes on s0: its capture marks every rank of it (fill_args);
     a capture that queues none of them captured nothing, and leaves the marks as they were
     (out:) */
  if (numbered_team(gt) && stream_capturing(s0)) {
    for (int i = 0; i < nops; i++) was[i] = rank_graphed(ops[i]);
    mark_graphed(ops, nops);
    marked = 1;
  }
  if (o0->algo == SBN_ALGO_COOP) {
    const size_t dyn =
        pl[0].variant == SBN_VAR_ONCHIP ? (size_t)sbn_hold_bytes(kind, pl[0].hold_slots) : 0;
    fill_args(&a, ops, nops, &pl[0], checked);
    CU(launch(sbn_coop_kernel_ptr(kind, dt, pl[0].tile, pl[0].vec, pl[0].variant, sbn_args_epilogue(&a)),
              (unsigned)(nops * pl[0].G), 1, dyn, &a, s0),
       "cooperative launch (cudaLaunchKernelExC)");
    *launched = 1;
  } else {
    const unsigned nch = (unsigned)((o0->desc.c + SBN_GPU_CHUNK - 1) / SBN_GPU_CHUNK);
    const int per = gt->transport == SBN_TR_VIRTUAL ? nops : 1; /* ranks per launch */
    for (int i = 0; i < nops; i += per) {
      fill_args(&a, &ops[i], per, &pl[i], checked);
      CU(host_stats(&a, kind, dt, &pl[i], (unsigned)per, nch, s0), "host path: statistics kernel launch");
      *launched = 1;
    }
    if (gt->nranks > 1) { /* in place of ncclAllGather: NCCL cannot have 2 ranks on a GPU */
      fill_args(&a, ops, nops, &pl[0], checked);
      CU(launch(sbn_host_kernel_ptr(SBN_HOST_GATHER, kind, dt, pl[0].tile, pl[0].vec, sbn_args_epilogue(&a)),
                (unsigned)nops * (unsigned)gt->nranks, 0, 0, &a, s0),
         "host path: gather kernel launch");
    }
    for (int i = 0; i < nops; i += per) {
      fill_args(&a, &ops[i], per, &pl[i], checked);
      if (gt->nranks == 1) a.r[0].mail = a.r[0].send; /* a team of one: its own records */
      CU(launch(sbn_host_kernel_ptr(SBN_HOST_APPLY, kind, dt, pl[i].tile, pl[i].vec, sbn_args_epilogue(&a)),
                (unsigned)(per * pl[i].G), 0, 0, &a, s0),
         "host path: apply kernel launch");
    }
  }
  note_kernel(ops, nops, &pl[0]);
  if (joined) {
    CU(cudaEventRecord(g0->ev, s0), "cudaEventRecord");
    for (int i = 1; i < nops; i++) {
      cudaStream_t si = (cudaStream_t)ops[i]->stream;
      if (si != s0) CU(cudaStreamWaitEvent(si, g0->ev, 0), "cudaStreamWaitEvent");
    }
  }
out:
  for (int i = 0; marked && !*launched && i < nops; i++)
    if (!was[i])
      atomic_store_explicit(&gt->ranks[ops[i]->comm->rank].graphed, 0, memory_order_relaxed);
  return r;
}

/* The host path with NCCL (one rank per GPU; an NCCL team's one rank): per rank STATS and
   PUBLISH (small's plan: small's statistics kernel, host_stats) on its stream,
   ncclAllGather of the records (one NCCL group for the ranks issued here), per rank APPLY. Each rank has its own plan (G, tile), as its cooperative
   launch would: the same bits as the coop path, and a G within the rank's own device's
   workspace. The records are of max_channels, so ranks running different ops (thread
   mode) still make collectives of one size, and APPLY reports the mismatch. The comms
   are nonblocking: the group is issued under the read lock and waited for, bounded by
   the timeout; any failure once the group has started aborts the team's comms. *launched:
   a kernel of the op was queued (launch_ops: none, and no rank waits where the round holds
   the whole team). */
static sbnResult_t launch_host_nccl(const sbn_op_t* const* ops, int nops, int checked,
                                    int* launched) {
  sbnResult_t r = sbnSuccess;
#if SYNCBN_HAVE_NCCL
  struct sbn_gpu_team* gt = sbn_gpu(ops[0]->comm->team);
  const int kind = ops[0]->kind;
  const int dt = ops[0]->desc.dtype;
  const unsigned nch = (unsigned)((ops[0]->desc.c + SBN_GPU_CHUNK - 1) / SBN_GPU_CHUNK);
  static _Thread_local sbn_coop_args_t one; /* 3.6 KB: not on the stack */
  sbn_plan_t pl[SBN_GPU_MAX_RANKS];
  int locked = 0, started = 0;
  const _Atomic int* stop = &ops[0]->comm->team->abort_reason; /* sbnCommAbort's, a failure's */
  /* each op's watch slot (-1: none) and its events: start, done (host_watchdog) */
  int slot[SBN_GPU_MAX_RANKS];
  cudaEvent_t ev[SBN_GPU_MAX_RANKS][2];
  for (int i = 0; i < nops; i++) slot[i] = -1;
  for (int i = 0; i < nops; i++) {
    r = plan_round(&ops[i], 1, &pl[i]);
    if (r != sbnSuccess) return r;
  }
  /* the slots first, before anything is launched; none under a graph capture (a captured
     event cannot be queried, and a replay is not watched: see the APPLYs) */
  for (int i = 0; i < nops; i++) {
    gpu_rank_t* g = &gt->ranks[ops[i]->comm->rank];
    CU(cudaSetDevice(g->device), "cudaSetDevice");
    if (stream_capturing((cudaStream_t)ops[i]->stream)) continue;
    r = sbn_watch_take(gt, g, stop, &slot[i], ev[i]);
    if (r != sbnSuccess) goto out;
  }
  for (int i = 0; i < nops; i++) {
    const gpu_rank_t* g = &gt->ranks[ops[i]->comm->rank];
    cudaStream_t s = (cudaStream_t)ops[i]->stream;
    CU(cudaSetDevice(g->device), "cudaSetDevice"); /* first: the capture is asked of its stream */
    if (numbered_team(gt) && stream_capturing(s)) mark_graphed(&ops[i], 1); /* (fill_args) */
    fill_args(&one, &ops[i], 1, &pl[i], checked);
    /* the op begins here: what its stream runs before it is not the op's time */
    if (slot[i] >= 0) CU(cudaEventRecord(ev[i][0], s), "cudaEventRecord");
    CU(host_stats(&one, kind, dt, &pl[i], 1u, nch, s), "host path: statistics kernel launch");
    *launched = 1;
  }
  pthread_rwlock_rdlock(&gt->nccl_lock);
  locked = 1;
  if (atomic_load(&gt->nccl_dead) || atomic_load(stop) != sbnSuccess) {
    r = sbn_fail(NULL, sbnAborted, "the team's NCCL comms were aborted");
    goto out;
  }
  {
    const int64_t deadline = sbn_deadline_in(gt->timeout_ms);
    ncclComm_t comms[SBN_GPU_MAX_RANKS];
    for (int i = 0; i < nops; i++) comms[i] = gt->nccl[ops[i]->comm->rank];
    ncclResult_t nr = sbn_nccl.GroupStart();
    started = 1;
    for (int i = 0; i < nops && nr == ncclSuccess; i++) {
      const gpu_rank_t* g = &gt->ranks[ops[i]->comm->rank];
      nr = sbn_nccl.AllGather(g->send, g->recv, (size_t)gt->nchunks_max * sizeof(sbn_mail_rec_t),
                              ncclUint8, comms[i], (cudaStream_t)ops[i]->stream);
    }
    ncclResult_t ne = sbn_nccl.GroupEnd();
    if (nr == ncclSuccess) nr = ne;
    /* nonblocking comms: the group may still be being issued, on every comm; until the
       deadline or the team's abort (sbnCommAbort from another thread) */
    nr = sbn_nccl_settle(nr, comms, nops, deadline, stop);
    if (nr == ncclInProgress && atomic_load(stop) != sbnSuccess) {
      r = sbn_fail(NULL, sbnAborted,
                   "the team was aborted (%s) while its ncclAllGather of the records was issued",
                   sbnGetResultName((sbnResult_t)atomic_load(stop)));
      atomic_store(&gt->host_stuck, 1);
      goto out;
    }
    if (nr != ncclSuccess) {
      r = sbn_fail(
          NULL, nr == ncclInProgress ? sbnTimeout : sbnNcclError,
          "ncclAllGather of the records: %s (%s)",
          nr == ncclInProgress ? "not issued within the timeout" : sbn_nccl.GetErrorString(nr),
          sbn_nccl.GetLastError(gt->nccl[ops[0]->comm->rank]));
      goto out;
    }
  }
  pthread_rwlock_unlock(&gt->nccl_lock);
  locked = 0;
  for (int i = 0; i < nops; i++) {
    gpu_rank_t* g = &gt->ranks[ops[i]->comm->rank];
    cudaStream_t s = (cudaStream_t)ops[i]->stream;
    CU(cudaSetDevice(g->device), "cudaSetDevice");
    fill_args(&one, &ops[i], 1, &pl[i], checked);
    CU(launch(sbn_host_kernel_ptr(SBN_HOST_APPLY, kind, dt, pl[i].tile, pl[i].vec, sbn_args_epilogue(&one)),
              (unsigned)pl[i].G, 0, 0, &one, s),
       "host path: apply kernel launch");
    note_kernel(&ops[i], 1, &pl[i]);
    /* the watchdog times this op from its start; a graph capture's cannot be (a captured
       event cannot be queried, and a replay is not watched): the team then counts as
       pending for good */
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CU(cudaStreamIsCapturing(s, &cs), "cudaStreamIsCapturing");
    if (cs == cudaStreamCaptureStatusNone && slot[i] >= 0) {
      CU(cudaEventRecord(ev[i][1], s), "cudaEventRecord");
      sbn_watch_put(g, slot[i], 1);
      slot[i] = -1;
    } else {
      atomic_store(&gt->host_captured, 1);
    }
  }
out:
  if (locked) pthread_rwlock_unlock(&gt->nccl_lock);
  for (int i = 0; i < nops; i++) /* an op not launched whole: its slot free again */
    if (slot[i] >= 0) sbn_watch_put(&gt->ranks[ops[i]->comm->rank], slot[i], 0);
  /* collectives may be queued that wait for ranks which will not come: abort them; after
     an abort ended the wait, through the team's abort first (an NCCL team notifies the
     other processes through the window, which the comms' abort unmaps: sbnCommAbort's
     own notification may not have run yet), then the comms (an sbnCommInitAll team's) */
  if (r != sbnSuccess && started) {
    if (atomic_load(&gt->host_stuck)) {
      sbn_team_t* team = ops[0]->comm->team;
      if (team->ops->abort != NULL) team->ops->abort(team);
    }
    sbn_nccl_abort_all(gt);
  }
#else
  (void)ops, (void)nops, (void)checked, (void)launched;
#endif
  return r;
}

/* Launches a virtual team's op of every rank as ONE cooperative launch (nops == nranks,
   in rank order), or one rank's op of a peer team (nops == 1), or the host path's ranks
   of this process together. first: the first launch of a round that holds the whole team
   (no rank of it can be waiting yet); planned: the op's plan where sbn_gpu_run made it
   (one op), else NULL. */
static sbnResult_t launch_ops(const sbn_op_t* const* ops, int nops, int checked, int first,
                              const sbn_plan_t* planned) {
  const sbn_op_t* o0 = ops[0];
  sbn_team_t* team = o0->comm->team;
  struct sbn_gpu_team* gt = sbn_gpu(team);
  const gpu_rank_t* g0 = &gt->ranks[o0->comm->rank];
  sbn_plan_t pl[SBN_GPU_MAX_RANKS];
  sbnResult_t r = sbnSuccess;
  int launched = 0; /* a kernel of the op queued (launch_one_device, launch_host_nccl) */

  int prev = 0;
  cudaGetDevice(&prev);
  if (o0->algo == SBN_ALGO_HOST && has_nccl(gt)) {
    /* InitAll (a rank per GPU) or NCCL team: own plans */
    r = launch_host_nccl(ops, nops, checked, &launched);
  } else if (o0->algo == SBN_ALGO_HOST && peer_team(gt) && gt->nranks > 1 &&
             !one_device_round(ops, nops)) {
    r = sbn_fail(NULL, sbnInvalidUsage, "SBN_ALGO=nccl: %s", gt->nccl_why); /* checked before */
  } else {
    if (planned != NULL)
      pl[0] = *planned;
    else
      r = plan_round(ops, nops, pl);
    if (r != sbnSuccess) goto out; /* nothing launched, device unchanged */
    if (prev != g0->device) CU(cudaSetDevice(g0->device), "cudaSetDevice");
    r = launch_one_device(ops, nops, pl, checked, &launched);
  }
out:
  cudaSetDevice(prev);
  if (r != sbnSuccess) {
    sbn_note(o0->comm, sbn_error_text(NULL));
    /* the team's other ranks may have launched already and would wait for this one until
       the timeout: abort the team (their kernels see the error word and return); and a
       kernel of this op that runs stops there. A virtual team's launch runs every rank,
       and before the first launch of a round that holds the whole team no rank runs:
       there, where none of the op's kernels was queued, nobody waits and the team goes
       on. */
    const int none_waits = (gt->transport == SBN_TR_VIRTUAL || first) && !launched;
    if (gt->nranks > 1 && !none_waits) {
      sbn_team_abort(team, r);
      team->ops->abort(team); /* its table's: an NCCL team's tells the other processes */
    }
  }
  return r;
}

sbnResult_t sbn_gpu_run(const sbn_op_t* const* ops, int n, int* failed) {
  const struct sbn_gpu_team* gt = sbn_gpu(ops[0]->comm->team);
  *failed = 0;
  /* a round of every rank: sbn_gpu_check compared their ops (fill_args) */
  const int checked = n == ops[0]->comm->team->nranks;
  /* the host-driven path takes the whole round too: one NCCL group, or one device; where
     the round holds the whole team, no rank waits before its first launch */
  if (gt->transport == SBN_TR_VIRTUAL || ops[0]->algo == SBN_ALGO_HOST)
    return launch_ops(ops, n, checked, checked && ops[0]->algo == SBN_ALGO_HOST, NULL);
  /* a peer team's ranks launch one by one: every rank's plan first, so that a refusal
     (SBN_KERNEL=onchip where one rank's tensors do not fit on its GPU, or on ranks that
     share a GPU) comes before any launch. Where the round holds the whole team, nothing
     ran and no peer waits for it: the team stays usable. Otherwise a rank of another call
     may have launched already and waits for this one: launch_ops aborts the team. A lone
     op (a team of one, or a rank's own call) plans as it launches: nothing before it. */
  sbn_plan_t pl[SBN_GPU_MAX_RANKS];
  for (int q = 0; q < n && n > 1; q++) {
    const sbnResult_t refused = plan_round(&ops[q], 1, &pl[q]);
    if (refused == sbnSuccess) continue;
    *failed = q;
    if (!checked) return launch_ops(&ops[q], 1, checked, 0, NULL);
    sbn_note(ops[q]->comm, sbn_error_text(NULL));
    return refused;
  }
  sbnResult_t r = sbnSuccess;
  for (int q = 0; q < n && r == sbnSuccess; q++) {
    *failed = q;
    r = launch_ops(&ops[q], 1, checked, checked && q == 0, n > 1 ? &pl[q] : NULL);
  }
  return r;
}
