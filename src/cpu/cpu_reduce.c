/* cpu_reduce.c — a rank's per-channel partial statistics and gradient sums, and the
 * element loaders.
 *
 * Each channel's elements are visited in (n, spatial) order whatever the layout, in
 * chunks of SBN_CHUNK: a chunk is reduced sequentially (Welford of x minus the chunk's
 * first element / plain sums), chunks are combined as a binary tree (a binary counter of
 * merged levels, like pairwise summation), so rounding error grows with log(count) and
 * NCHW and NHWC give the same bits. Channels
 * are processed in blocks of SBN_CBLOCK so that NHWC rows are read contiguously and the
 * trees stay small enough for the stack; NCHW rows go SBN_ROWS channels at a time.
 */

#include "bn_dtype.h"
#include "bn_math.h"
#include "cpu.h"

#define SBN_CHUNK 32
#define SBN_CBLOCK 64
#define SBN_LEVELS 48 /* 2^48 chunks, 2^53 elements of a channel on a rank: more than any
                         addressable tensor holds */
#define SBN_RUN 256   /* elements converted to fp32 at a time */
#define SBN_ROWS 8    /* NCHW: channel rows reduced side by side, element by element, so the
                         core has 8 independent Welford chains (each channel's order is
                         unchanged, so NCHW still equals NHWC bitwise) */

void sbn_cpu_load(sbnDataType_t dt, const void* base, int64_t start, int64_t count, float* out) {
  switch (dt) {
#define SBN_DT_LOAD_(value, bytes, name, tag, bits)                    \
  case value:                                                          \
    for (int64_t i = 0; i < count; i++) out[i] = sbn_##tag##_get(base, start + i); \
    break;
    SBN_DTYPES(SBN_DT_LOAD_)
#undef SBN_DT_LOAD_
  }
}

void sbn_cpu_store(sbnDataType_t dt, void* base, int64_t start, int64_t count, const float* in) {
  switch (dt) {
#define SBN_DT_STORE_(value, bytes, name, tag, bits)                  \
  case value:                                                         \
    for (int64_t i = 0; i < count; i++) sbn_##tag##_put(base, start + i, in[i]); \
    break;
    SBN_DTYPES(SBN_DT_STORE_)
#undef SBN_DT_STORE_
  }
}

/* ---- forward: Welford chunks in a merge tree ---------------------------------------- */

/* A full level's partial without its count, which is SBN_CHUNK * 2^level: 12 bytes a
   level, so that the 64 trees of sbn_cpu_local_stats take no more of the calling thread's
   stack than the plain Welford levels did (~47 KB in all; a 64 KB thread stack holds it). */
typedef struct {
  float mean_hi, mean_lo, m2;
} level_t;

typedef struct {
  sbn_welford_t chunk;  /* the chunk being filled, of x - shift */
  float shift;          /* the chunk's first element, then its mean at counts 2, 4, 8, 16 */
  uint64_t chunks;      /* completed chunks so far: its bits are the occupied levels */
  level_t level[SBN_LEVELS];
} welford_tree_t;

static sbn_partial_t level_get(const welford_tree_t* t, int l) {
  sbn_partial_t p = {ldexpf((float)SBN_CHUNK, l), t->level[l].mean_hi, t->level[l].mean_lo, t->level[l].m2};
  return p;
}

/* An empty tree. Its levels are left as they are: level l is read only when bit l of
   `chunks` is set, after a carry wrote it (zeroing all 48 cost a call on a small tensor
   more than its arithmetic: 4.7 KB for 8 channels). */
static void welford_tree_start(welford_tree_t* t) {
  t->chunk = sbn_welford_empty();
  t->shift = 0.0f;
  t->chunks = 0;
}

/* One element. Each chunk is shifted by its own first element, as each GPU thread's run
   is: one shift for the channel (its first element) let an outlier there put
   u |mean - shift| into the whole mean, 6e-4 for 2^24 elements of 1e4 + N(0, 1) after a
   first element of 1000; now it weighs only in its chunk's share, and only until the
   chunk's count doubles (sbn_recentre). */
static void welford_tree_push(welford_tree_t* t, float v) {
  if (t->chunk.count == 0.0f) t->shift = v;
  sbn_welford_push(&t->chunk, v - t->shift);
  if (t->chunk.count < (float)SBN_CHUNK) {
    /* the shift re-centred on the chunk's mean at counts 2, 4, 8, 16 (as each GPU thread's
       run whenever its count doubles): an outlier first is the shift of a few elements only */
    if (sbn_count_doubled(t->chunk.count - 1.0f, t->chunk.count))
      sbn_recentre(&t->shift, &t->chunk.mean);
    return;
  }
  sbn_partial_t w = sbn_partial_from_shifted(t->chunk, t->shift);
  int l = 0;
  for (uint64_t i = t->chunks; i & 1; i >>= 1, l++) w = sbn_partial_merge(level_get(t, l), w);
  t->level[l].mean_hi = w.mean_hi;
  t->level[l].mean_lo = w.mean_lo;
  t->level[l].m2 = w.m2;
  t->chunks++;
  t->chunk = sbn_welford_empty();
}

static sbn_partial_t welford_tree_result(const welford_tree_t* t) {
  sbn_partial_t acc = sbn_partial_from_shifted(t->chunk, t->shift);
  int l = 0;
  for (uint64_t i = t->chunks; i; i >>= 1, l++)
    if (i & 1) acc = sbn_partial_merge(level_get(t, l), acc);
  return acc;
}

void sbn_cpu_local_stats(const sbnTensorDesc_t* d, const void* x, float* out) {
  welford_tree_t tree[SBN_CBLOCK];
  float buf[SBN_ROWS][SBN_RUN];
  const int64_t n = d->n, c = d->c, sp = d->spatial;
  for (int64_t c0 = 0; c0 < c; c0 += SBN_CBLOCK) {
    int64_t cb = c - c0 < SBN_CBLOCK ? c - c0 : SBN_CBLOCK;
    for (int64_t j = 0; j < cb; j++) welford_tree_start(&tree[j]);
    for (int64_t ni = 0; ni < n; ni++) {
      if (d->layout == sbnLayoutNCHW) {
        for (int64_t j0 = 0; j0 < cb; j0 += SBN_ROWS) {
          int64_t rows = cb - j0 < SBN_ROWS ? cb - j0 : SBN_ROWS;
          for (int64_t s0 = 0; s0 < sp; s0 += SBN_RUN) {
            int64_t len = sp - s0 < SBN_RUN ? sp - s0 : SBN_RUN;
            for (int64_t g = 0; g < rows; g++)
              sbn_cpu_load(d->dtype, x, (ni * c + c0 + j0 + g) * sp + s0, len, buf[g]);
            for (int64_t i = 0; i < len; i++)
              for (int64_t g = 0; g < rows; g++)
                welford_tree_push(&tree[j0 + g], buf[g][i]);
          }
        }
      } else {
        for (int64_t si = 0; si < sp; si++) {
          sbn_cpu_load(d->dtype, x, (ni * sp + si) * c + c0, cb, buf[0]);
          for (int64_t j = 0; j < cb; j++) welford_tree_push(&tree[j], buf[0][j]);
        }
      }
    }
    for (int64_t j = 0; j < cb; j++) {
      sbn_partial_t p = welford_tree_result(&tree[j]);
      out[3 * (c0 + j)] = p.mean_hi;
      out[3 * (c0 + j) + 1] = p.mean_lo;
      out[3 * (c0 + j) + 2] = p.m2;
    }
  }
}

/* ---- backward: the two sums, chunked the same way ------------------------------------ */

typedef struct {
  sbn_bwd_sums_t chunk;
  int fill;
  uint64_t chunks;
  sbn_bwd_sums_t level[SBN_LEVELS];
} sums_tree_t;

/* An empty tree (its levels as welford_tree_start's). */
static void sums_tree_start(sums_tree_t* t) {
  t->chunk.sum_dy = t->chunk.sum_dy_xmu = 0.0f;
  t->fill = 0;
  t->chunks = 0;
}

/* The full chunk into the levels; the chunk starts again empty. */
static void sums_tree_carry(sums_tree_t* t) {
  sbn_bwd_sums_t w = t->chunk;
  int l = 0;
  for (uint64_t i = t->chunks; i & 1; i >>= 1, l++) w = sbn_bwd_sums_merge(t->level[l], w);
  t->level[l] = w;
  t->chunks++;
  t->fill = 0;
  t->chunk.sum_dy = t->chunk.sum_dy_xmu = 0.0f;
}

static void sums_tree_push(sums_tree_t* t, float dy, float xmu) {
  t->chunk.sum_dy += dy;
  t->chunk.sum_dy_xmu += dy * xmu;
  if (++t->fill == SBN_CHUNK) sums_tree_carry(t);
}

/* sums_tree_push of len elements of one channel in turn, the same additions in the same
   order (the same bits), with the chunk's sums in locals: pushed one by one through
   memory, each element waited for the previous one's store (~3 ns an element). */
static void sums_tree_push_run(sums_tree_t* t, const float* dy, const float* xmu, int64_t len) {
  float s = t->chunk.sum_dy, sx = t->chunk.sum_dy_xmu;
  int fill = t->fill;
  for (int64_t i = 0; i < len; i++) {
    s += dy[i];
    sx += dy[i] * xmu[i];
    if (++fill == SBN_CHUNK) {
      t->chunk.sum_dy = s;
      t->chunk.sum_dy_xmu = sx;
      sums_tree_carry(t);
      s = sx = 0.0f;
      fill = 0;
    }
  }
  t->chunk.sum_dy = s;
  t->chunk.sum_dy_xmu = sx;
  t->fill = fill;
}

static sbn_bwd_sums_t sums_tree_result(const sums_tree_t* t) {
  sbn_bwd_sums_t acc = t->chunk;
  int l = 0;
  for (uint64_t i = t->chunks; i; i >>= 1, l++)
    if (i & 1) acc = sbn_bwd_sums_merge(t->level[l], acc);
  return acc;
}

void sbn_cpu_bwd_run(const sbnTensorDesc_t* d, const sbn_cpu_bwd_src_t* s, int64_t at, int64_t len,
                     int64_t ch, int nhwc, float* g, float* xmu) {
  float yb[SBN_RUN];
  sbn_cpu_load(d->dtype, s->dy, at, len, g);
  if (s->x != NULL) {
    sbn_cpu_load(d->dtype, s->x, at, len, xmu);
    for (int64_t i = 0; i < len; i++) xmu[i] = xmu[i] - s->mean[nhwc ? ch + i : ch];
  }
  if (s->xmask) { /* the mask from x - mean; y's element where it is not sure */
    const float floor = sbn_xmask_floor(sbn_dtype_least(d->dtype));
    for (int64_t i = 0; i < len; i++) {
      const int64_t c = nhwc ? ch + i : ch;
      const int sign = sbn_xmask_sign(xmu[i], sbn_scale(s->weight ? s->weight[c] : 1.0f, s->invstd[c]),
                                      s->bias ? s->bias[c] : 0.0f, s->mean[c], floor);
      if (sign != 0) {
        g[i] = sbn_act_grad_sign(s->act, s->slope, sign, g[i]);
      } else {
        float yv;
        sbn_cpu_load(d->dtype, s->y, at + i, 1, &yv);
        g[i] = sbn_act_grad(s->act, s->slope, yv, g[i]);
      }
    }
    return;
  }
  if (s->y != NULL) sbn_cpu_load(d->dtype, s->y, at, len, yb);
  if (s->y != NULL && s->act != SBN_ACT_IDENTITY)
    for (int64_t i = 0; i < len; i++) g[i] = sbn_act_grad(s->act, s->slope, yb[i], g[i]);
  if (s->x == NULL) {
    const float inv_slope = sbn_inv_slope(s->act, s->slope);
    float zb[SBN_RUN];
    if (s->z != NULL) sbn_cpu_load(d->dtype, s->z, at, len, zb);
    for (int64_t i = 0; i < len; i++) {
      const int64_t c = nhwc ? ch + i : ch;
      xmu[i] = sbn_xmu_from_y(s->act, inv_slope, yb[i], s->z != NULL ? zb[i] : 0.0f, s->bias ? s->bias[c] : 0.0f,
                              s->rcp[c]);
    }
  }
}

void sbn_cpu_local_grad_sums(const sbnTensorDesc_t* d, const sbn_cpu_bwd_src_t* s, float* out) {
  sums_tree_t tree[SBN_CBLOCK];
  float xb[SBN_RUN], gb[SBN_RUN];
  const int64_t n = d->n, c = d->c, sp = d->spatial;
  for (int64_t c0 = 0; c0 < c; c0 += SBN_CBLOCK) {
    int64_t cb = c - c0 < SBN_CBLOCK ? c - c0 : SBN_CBLOCK;
    for (int64_t j = 0; j < cb; j++) sums_tree_start(&tree[j]);
    for (int64_t ni = 0; ni < n; ni++) {
      if (d->layout == sbnLayoutNCHW) {
        for (int64_t j = 0; j < cb; j++) {
          int64_t row = (ni * c + c0 + j) * sp;
          for (int64_t s0 = 0; s0 < sp; s0 += SBN_RUN) {
            int64_t len = sp - s0 < SBN_RUN ? sp - s0 : SBN_RUN;
            sbn_cpu_bwd_run(d, s, row + s0, len, c0 + j, 0, gb, xb);
            sums_tree_push_run(&tree[j], gb, xb, len);
          }
        }
      } else {
        for (int64_t si = 0; si < sp; si++) {
          int64_t row = (ni * sp + si) * c + c0;
          sbn_cpu_bwd_run(d, s, row, cb, c0, 1, gb, xb);
          for (int64_t j = 0; j < cb; j++) sums_tree_push(&tree[j], gb[j], xb[j]);
        }
      }
    }
    for (int64_t j = 0; j < cb; j++) {
      sbn_bwd_sums_t r = sums_tree_result(&tree[j]);
      out[2 * (c0 + j)] = r.sum_dy;
      out[2 * (c0 + j) + 1] = r.sum_dy_xmu;
    }
  }
}
