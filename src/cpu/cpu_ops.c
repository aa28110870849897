/* cpu_ops.c — forward, backward and inference of the CPU team.
 *
 * Forward:  step 0: this rank's (mean, M2) per channel; step 1: the ONE exchange;
 *           step 2: merge every rank's partial in RANK ORDER (same bits on every rank),
 *           finalize; step 3: only now write y, saved and running stats.
 * Backward: the same shape with (sum dy, sum dy*(x - mean)).
 * Nothing is written before the exchange succeeded and M was checked, so a failed op
 * (timeout, mismatch, M == 1) leaves every output untouched.
 */
#include "bn_math.h"
#include "cpu.h"

#define SBN_RUN 256 /* elements converted to fp32 at a time */

/* Forward / inference coefficients of one channel: y = (x - mean) * scale + bias. */
typedef struct {
  float mean;
  float mean_lo; /* the mean is mean + mean_lo (0 in inference) */
  float scale;   /* weight * invstd */
  float bias;
} fwd_coef_t;

/* The walk of a rank's elements: its desc, with the layout that gives the longest runs
   where the two layouts are the same memory: spatial 1 ((N, C, 1) is (N, 1, C)) walks as
   NHWC, rows of C (NCHW's rows would be single elements: BatchNorm1d on (N, C) took 5-8x
   the time), and C 1 as NCHW, rows of spatial. Each channel's elements are reduced in
   (n, spatial) order in both layouts (cpu_reduce.c), so the bits are the same; the op's
   signature keeps the caller's layout. */
static sbnTensorDesc_t walk_of(const sbnTensorDesc_t* d) {
  sbnTensorDesc_t w = *d;
  if (w.spatial == 1) w.layout = sbnLayoutNHWC;
  else if (w.c == 1) w.layout = sbnLayoutNCHW;
  return w;
}

/* The runs of an elementwise pass over channels [c0, c0 + cl): NCHW along a channel's
   row (n * cl rows of `spatial` elements), NHWC across the channels of a position
   (n * spatial rows of cl). Rows and their width: */
static void runs_of(const sbnTensorDesc_t* d, int64_t cl, int64_t* rows, int64_t* width) {
  const int nhwc = d->layout == sbnLayoutNHWC;
  *rows = nhwc ? d->n * d->spatial : d->n * cl;
  *width = nhwc ? cl : d->spatial;
}

/* The first element of the run at offset w0 of row r, and (*j) its channel counted from
   c0 (NHWC: the run's element i has channel *j + i). */
static int64_t run_at(const sbnTensorDesc_t* d, int64_t c0, int64_t cl, int64_t r, int64_t w0, int64_t* j) {
  if (d->layout == sbnLayoutNHWC) {
    *j = w0;
    return r * d->c + c0 + w0;
  }
  *j = r % cl;
  return ((r / cl) * d->c + c0 + *j) * d->spatial + w0;
}

/* The forward's elementwise pass over channels [c0, c0 + cl): y = act(y(x) + z) with kf
   (z NULL: none). Coefficient arrays are indexed from c0. y may alias x or z. */
static void elementwise_forward(const sbnTensorDesc_t* d, const void* x, const void* z, void* y, int act,
                                float slope, int64_t c0, int64_t cl, const fwd_coef_t* kf) {
  float xb[SBN_RUN], zb[SBN_RUN];
  const int nhwc = d->layout == sbnLayoutNHWC;
  int64_t rows, width, j;
  runs_of(d, cl, &rows, &width);
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t w0 = 0; w0 < width; w0 += SBN_RUN) {
      const int64_t len = width - w0 < SBN_RUN ? width - w0 : SBN_RUN;
      const int64_t at = run_at(d, c0, cl, r, w0, &j);
      sbn_cpu_load(d->dtype, x, at, len, xb);
      if (z != NULL) sbn_cpu_load(d->dtype, z, at, len, zb);
      for (int64_t i = 0; i < len; i++) {
        const fwd_coef_t* k = &kf[nhwc ? j + i : j];
        float v = sbn_forward_y(xb[i], k->mean, k->mean_lo, k->scale, k->bias);
        if (z != NULL) v += zb[i];
        xb[i] = sbn_act(act, slope, v);
      }
      sbn_cpu_store(d->dtype, y, at, len, xb);
    }
  }
}

/* The backward's elementwise pass over every channel: dx = dx(x - mean, g) with kb (dx
   NULL: none), dz = g (dz NULL: none). dx and dz may alias dy. */
static void elementwise_backward(const sbnTensorDesc_t* d, const sbn_cpu_bwd_src_t* src, void* dx, void* dz,
                                 const sbn_bwd_coef_t* kb) {
  float xb[SBN_RUN], gb[SBN_RUN];
  const int nhwc = d->layout == sbnLayoutNHWC;
  int64_t rows, width, ch;
  runs_of(d, d->c, &rows, &width);
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t w0 = 0; w0 < width; w0 += SBN_RUN) {
      const int64_t len = width - w0 < SBN_RUN ? width - w0 : SBN_RUN;
      const int64_t at = run_at(d, 0, d->c, r, w0, &ch);
      sbn_cpu_bwd_run(d, src, at, len, ch, nhwc, gb, xb);
      if (dz != NULL) sbn_cpu_store(d->dtype, dz, at, len, gb);
      if (dx != NULL) {
        for (int64_t i = 0; i < len; i++) xb[i] = sbn_backward_dx_xmu(kb[nhwc ? ch + i : ch], xb[i], gb[i]);
        sbn_cpu_store(d->dtype, dx, at, len, xb);
      }
    }
  }
}

static int64_t team_count(const sbn_cpu_peers_t* peers, int w) {
  int64_t m = 0;
  for (int q = 0; q < w; q++) m += sbn_cpu_peer_count(peers, q);
  return m;
}

/* step 0 + step 1 of both ops: this rank's partials (zeros for an empty rank), then the
   exchange. On success *peers describes every rank's records. d: op's walk (walk_of);
   src: the backward's. */
static sbnResult_t partials_and_exchange(const sbn_op_t* op, const sbnTensorDesc_t* d,
                                         const sbn_cpu_bwd_src_t* src, sbn_cpu_peers_t* peers) {
  sbnComm_t comm = op->comm;
  float* local = sbn_cpu_rank(comm)->local;
  int floats = op->kind == SBN_OP_FORWARD ? 3 : 2;
  if (d->n == 0) {
    for (int64_t i = 0; i < floats * d->c; i++) local[i] = 0.0f;
  } else if (op->kind == SBN_OP_FORWARD) {
    sbn_cpu_local_stats(d, op->x, local);
  } else {
    sbn_cpu_local_grad_sums(d, src, local);
  }
  return sbn_cpu_exchange(comm, sbn_op_signature(op), floats, d->n * d->spatial, local, peers);
}

sbnResult_t sbn_cpu_forward(const sbn_op_t* op) {
  sbnComm_t comm = op->comm;
  atomic_store(&comm->kernel, "cpu");
  const sbnTensorDesc_t walk = walk_of(&op->desc);
  const sbnTensorDesc_t* d = &walk;
  const int64_t c = d->c;
  const int w = comm->team->nranks;
  sbn_cpu_rank_t* me = sbn_cpu_rank(comm);
  sbn_cpu_peers_t peers;

  sbnResult_t r = partials_and_exchange(op, d, NULL, &peers);
  if (r != sbnSuccess) return r;
  int64_t m = team_count(&peers, w);
  if (m == 1)
    return sbn_fail(comm, sbnInvalidArgument,
                    "Expected more than 1 value per channel when training (the team's batch "
                    "has 1 element per channel)");

  /* step 2: merge in rank order, finalize. stats: c fwd_coef_t + c invstd (5c floats);
     local (the partials, already published) is reused for the unbiased variance. */
  fwd_coef_t* k = (fwd_coef_t*)(void*)me->stats;
  float* invstd = me->stats + 4 * c;
  float* var_unbiased = me->local;
  for (int64_t ci = 0; ci < c; ci++) {
    sbn_partial_t g = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int q = 0; q < w; q++) {
      const float* e = sbn_cpu_peer_values(&peers, q, ci);
      sbn_partial_t p = {(float)sbn_cpu_peer_count(&peers, q), e[0], e[1], e[2]};
      g = sbn_partial_merge(g, p);
    }
    sbn_stats_t s = sbn_stats_finalize(g, m, op->params.eps);
    k[ci].mean = s.mean;
    k[ci].mean_lo = s.mean_lo;
    k[ci].scale = sbn_scale(op->weight ? op->weight[ci] : 1.0f, s.invstd);
    k[ci].bias = op->bias ? op->bias[ci] : 0.0f;
    invstd[ci] = s.invstd;
    var_unbiased[ci] = s.var_unbiased;
  }

  /* step 3: outputs */
  if (d->n > 0) elementwise_forward(d, op->x, op->z, op->out, op->act, op->slope, 0, c, k);
  for (int64_t ci = 0; ci < c; ci++) {
    op->save_mean[ci] = k[ci].mean;
    op->save_invstd[ci] = invstd[ci];
  }
  if (op->running_mean != NULL && m > 0) {
    int64_t nbt = op->num_batches_tracked ? *op->num_batches_tracked : 0;
    float f = sbn_momentum_factor(op->params.momentum, nbt);
    for (int64_t ci = 0; ci < c; ci++) {
      op->running_mean[ci] = sbn_running_update(op->running_mean[ci], k[ci].mean, f);
      op->running_var[ci] = sbn_running_update(op->running_var[ci], var_unbiased[ci], f);
    }
  }
  if (op->num_batches_tracked != NULL) *op->num_batches_tracked = sbn_nbt_next(*op->num_batches_tracked);
  return sbnSuccess;
}

sbnResult_t sbn_cpu_backward(const sbn_op_t* op) {
  sbnComm_t comm = op->comm;
  atomic_store(&comm->kernel, "cpu");
  const sbnTensorDesc_t walk = walk_of(&op->desc);
  const sbnTensorDesc_t* d = &walk;
  const int64_t c = d->c;
  const int w = comm->team->nranks;
  sbn_cpu_rank_t* me = sbn_cpu_rank(comm);
  sbn_cpu_peers_t peers;

  /* what the backward reads: x - mean from x, or from y (the in-place backward: x NULL;
     its per-channel factors go where the dx coefficients go after the sums) */
  sbn_cpu_bwd_src_t src = {op->x, op->act != SBN_ACT_IDENTITY || op->x == NULL ? op->y : NULL, op->dy,
                           op->save_mean, op->act, op->slope, op->bias, NULL,
                           sbn_xmask_applies(op->no_residual, op->act, op->x, op->y, op->dz),
                           op->weight, op->save_invstd, op->x == NULL ? op->z : NULL};
  float* rcp = me->stats + 4 * c; /* after the 4c floats of the dx coefficients */
  if (op->x == NULL && d->n > 0) {
    for (int64_t ci = 0; ci < c; ci++)
      rcp[ci] = sbn_recover_rcp(op->weight ? op->weight[ci] : 1.0f, op->bias ? op->bias[ci] : 0.0f,
                                sbn_dtype_unit(d->dtype), SBN_RECOVER_MIN_WEIGHT, op->save_invstd[ci]);
    src.rcp = rcp;
  }
  sbnResult_t r = partials_and_exchange(op, d, &src, &peers);
  if (r != sbnSuccess) return r;
  int64_t m = team_count(&peers, w);

  /* step 2: team sums in rank order; dweight/dbias (local or team); dx coefficients */
  sbn_bwd_coef_t* k = (sbn_bwd_coef_t*)(void*)me->stats; /* 4 floats per channel */
  for (int64_t ci = 0; ci < c; ci++) {
    sbn_bwd_sums_t g = {0.0f, 0.0f};
    for (int q = 0; q < w; q++) {
      const float* e = sbn_cpu_peer_values(&peers, q, ci);
      sbn_bwd_sums_t p = {e[0], e[1]};
      g = sbn_bwd_sums_merge(g, p);
    }
    sbn_bwd_sums_t mine = {me->local[2 * ci], me->local[2 * ci + 1]};
    sbn_bwd_sums_t grads = op->params.grad_mode == sbnGradGlobal ? g : mine;
    float invstd = op->save_invstd[ci];
    if (op->dweight != NULL) op->dweight[ci] = sbn_dweight(grads.sum_dy_xmu, invstd, m);
    if (op->dbias != NULL) op->dbias[ci] = grads.sum_dy;
    k[ci] = sbn_backward_coefficients(g.sum_dy, g.sum_dy_xmu, m, op->save_mean[ci], invstd,
                                      op->weight ? op->weight[ci] : 1.0f);
  }

  /* step 3: dx and dz */
  if (d->n > 0 && (op->out != NULL || op->dz != NULL)) elementwise_backward(d, &src, op->out, op->dz, k);
  return sbnSuccess;
}

void sbn_cpu_inference(const sbnTensorDesc_t* d, const void* x, const void* z, void* y,
                       const float* weight, const float* bias, const float* running_mean,
                       const float* running_var, float eps, int act, float slope) {
  if (d->n == 0) return;
  const sbnTensorDesc_t walk = walk_of(d);
  d = &walk;
  fwd_coef_t k[SBN_RUN]; /* coefficients for a block of channels: no allocation */
  for (int64_t c0 = 0; c0 < d->c; c0 += SBN_RUN) {
    int64_t cl = d->c - c0 < SBN_RUN ? d->c - c0 : SBN_RUN;
    for (int64_t j = 0; j < cl; j++) {
      int64_t ci = c0 + j;
      k[j].mean = running_mean[ci];
      k[j].mean_lo = 0.0f;
      k[j].scale = sbn_scale(weight ? weight[ci] : 1.0f, sbn_invstd(running_var[ci], eps));
      k[j].bias = bias ? bias[ci] : 0.0f;
    }
    elementwise_forward(d, x, z, y, act, slope, c0, cl, k);
  }
}
