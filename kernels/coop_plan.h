/* coop_plan.h — how one rank's op is cut into work for the cooperative kernels
 * (kernels/coop.cu): the kernel variants, units and slices, which 16-byte vectors
 * ("positions") each thread reads, how many of them fit on chip, and the plan of a launch
 * (variant, width, blocks). Plain C, shared by the kernels (nvcc), the host
 * (src/gpu/gpu_launch.c plans every round with sbn_plan_round) and the CPU tests
 * (test_coop_emu: the bounds below against an enumeration; the emulated launches planned
 * as the library plans them).
 *
 * Units. A rank's work is cut into units = (channel group, slice of its rows), row =
 * n*spatial + s. "Tile" layouts (NHWC, and NCHW with spatial == 1, the same addresses)
 * group 32 channels (one mailbox chunk); "plane" layouts (NCHW, spatial > 1, and NHWC of
 * one channel, the same addresses: sbn_tile_layout) one channel. When there are fewer groups than blocks, each group is cut into P = G/groups
 * slices. Unit u = group + slice * groups; block b owns the contiguous units
 * [ceil(U*b/G), ceil(U*(b+1)/G)) (sbn_unit_begin), so that a block's k plane units lie in
 * at most ceil(k/32) + 1 chunks, one gather each (coop_exchange.cuh: finish_coefs),
 * and publishes the chunks whose first channel's slice-0 unit it owns (sbn_pub_chunks).
 *
 * Positions (the stream and onchip variants). VEC = 16 / element size (4 fp32, 8
 * fp16/bf16), or 1 in the scalar kernels (tensors not 16-byte aligned, or NHWC with C not
 * a multiple of VEC). A position is one VEC-wide vector of x (backward: of x and of dy at
 * the same offset):
 *   tile:  thread (warp w, lane l) reads the vector column vc = l % (32/VEC) of its group
 *          (channels group*32 + vc*VEC ...) in rows r0 + w*VEC + l/(32/VEC) + k*8*VEC;
 *   plane: the unit's elements are its slice's piece of each plane (n, c); the aligned
 *          vectors overlapping those pieces, piece after piece, are the unit's list, and
 *          thread t reads entries t, t + 256, t + 512, ...; a vector that sticks out of its
 *          piece (odd spatial sizes) is read element by element, only its piece's part.
 * A thread's positions are taken in batches of SBN_BATCH(kind) (all loads of a batch in
 * flight before the first use). The onchip variant keeps every batch of the block's units
 * on chip between stage 1 and stage 5: the first SBN_HOLD_REG_BATCHES() of a thread in
 * registers, the others in dynamic shared memory (hold_slots batches per thread). The
 * stream variant reads them again in stage 5. Both compute the same arithmetic in the
 * same order: for the same G they give the same bits. (Onchip: every load of the
 * block is issued, into registers or with cp.async into shared memory, before stage 1
 * computes anything.)
 */
#ifndef SYNCBN_COOP_PLAN_H_
#define SYNCBN_COOP_PLAN_H_

#include <stdint.h>

#include "bn_dtype.h" /* sbn_dtype_size */
#include "coop_args.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Kernel variants of the cooperative kernel (the data path of stages 1 and 5). */
enum {
  SBN_VAR_STREAM = 0, /* 16-byte loads in batches; x (and dy) read again in stage 5 */
  SBN_VAR_ONCHIP = 1, /* 16-byte loads; x (and dy) held on chip from stage 1 to stage 5 */
  SBN_VAR_UNIT = 2,   /* a team of one whose units are whole channels: stream's stages 1 and
                         5 of one unit after the other, its channel finished in between, with
                         no exchange (coop_unit.cuh) */
  SBN_VAR_SMALL = 3,  /* a team of one's op of at most SBN_SMALL_ROWS rows (tile layout): a
                         block per 32-channel chunk, every value loaded once into registers,
                         no workspace (coop_small.cuh) */
  SBN_VAR_SMALL_TEAM = 4 /* the small variant for a team of two or more ranks (SBN_KERNEL=small
                            only: sbn_small_team_applies): each chunk's record published and
                            every rank's gathered; kernels of their own, so that a team of
                            one's keep their code and registers (coop_small.cuh) */
};
#define SBN_VAR_COUNT 5
/* Whether a variant is the small kernel's, for a team of one or of more. */
#define SBN_VAR_IS_SMALL(v) ((v) == SBN_VAR_SMALL || (v) == SBN_VAR_SMALL_TEAM)
/* (The first kernel, "legacy": 32-bit loads and a Welford step per element, was removed on
   2026-11-26 after the H200 runs: it lost to stream on every row but S10 at W = 8, where
   stream's loss was the start-of-kernel host read that is gone since; README, Kernels.) */

/* What the caller asked for (SBN_KERNEL at the call). */
enum {
  SBN_KERNEL_AUTO = 0,
  SBN_KERNEL_ONCHIP = 1,
  SBN_KERNEL_STREAM = 2,
  SBN_KERNEL_UNIT = 3,
  SBN_KERNEL_SMALL = 4
};

/* The small variant's most rows (N x H x W of the rank): a thread holds at most
   SBN_SMALL_ROWS / 8 values of x (and of dy) in registers (coop_small.cuh). */
#define SBN_SMALL_ROWS 64

#ifndef SBN_BATCH_FWD /* a tuning variant may set it (bench/notes/experiments.md, E20) */
#define SBN_BATCH_FWD 4           /* positions per batch: forward, 4 loads of x */
#endif
#ifndef SBN_BATCH_BWD /* a tuning variant may set it (bench/notes/experiments.md, E20) */
#define SBN_BATCH_BWD 2           /* backward: 2 of x and 2 of dy */
#endif
/* onchip: a thread's first batches, held in registers (fewer for fp16/bf16 plane units,
   whose two passes over 32 unpacked values per batch need the room) */
#define SBN_HOLD_REG_BATCHES(dtype, tile) (sbn_dtype_size(dtype) < 4 && !(tile) ? 3 : 6)
/* (stream: stage 1 loads with L2 evict_last, kept for stage 5, which loads with
   evict_first. A knob for evict_normal in both, SBN_STREAM_L2_HINTS=0, was measured on an
   H100 (bench/results/2026-11-26-h100-1be20b9, call 1), S1 and S4-S9 at W = 1: 1.01-1.09x
   the time on 39 of 48 cells, 0.97-1.00 on 9 (bench/notes/experiments.md, E24), and
   removed.) */
#ifndef SBN_STREAM_BLOCKS_PER_SM /* a tuning variant may set it (bench/notes/experiments.md, E20) */
#define SBN_STREAM_BLOCKS_PER_SM 2 /* __launch_bounds__ of the stream (and host-path) kernels:
                                      at most 128 registers */
#endif
/* A team of one merges each chunk of its units itself, from the slices' partials after
   the rank barrier, where a chunk has at most this many slices (coop_kernel.cuh, `local`),
   instead of one block publishing the chunk's record and the others waiting for it. Up
   to 8 (before 2026-11-30) every warp loaded one partial a lane; up to 64, at most 8 in
   two batches of 4 (publish_chunk), which takes the H200's W = 1 NHWC ops of 16 and 33
   slices (S2, S3, S7, S9 at G = 264) off the mailbox (bench/notes/exchange.md). */
#ifndef SBN_LOCAL_SLICES /* a tuning variant may set it (bench/notes/exchange.md) */
#define SBN_LOCAL_SLICES 64
#endif
/* A team of one that merges a chunk itself asks L2 for the chunk's parameters (forward:
   weight, bias; backward: weight, saved mean and invstd) before it loads the partials,
   so that stage 4 finds them there, not in DRAM: it has no wait to hide their loads
   behind (coop_exchange.cuh: publish_chunk; bench/notes/exchange.md). 0: no request. */
#ifndef SBN_PREFETCH_PARAMS /* a tuning variant may set it */
#define SBN_PREFETCH_PARAMS 1
#endif
#define SBN_ONCHIP_BLOCKS_PER_SM 1 /* of the onchip kernels: the whole register file and
                                      shared memory of an SM hold one block's data;
                                      scripts/check-sass.sh checks both */
#define SBN_ELEMS_PER_BLOCK 8192  /* stream/onchip: elements per block below which a launch
                                     uses fewer blocks than the device holds */
#define SBN_GPU_PART_FLOATS 4     /* floats per (slice, channel) partial: forward (count,
                                     mean_hi, mean_lo, m2), backward (sum_dy hi, lo,
                                     sum_dy_xmu hi, lo) */

static SBN_ARGS_HD int sbn_batch(int kind) { return kind == SBN_OP_FORWARD ? SBN_BATCH_FWD : SBN_BATCH_BWD; }
/* Bytes of one held position: x (forward), x and dy (backward). */
static SBN_ARGS_HD int sbn_pos_bytes(int kind) { return kind == SBN_OP_FORWARD ? 16 : 32; }
/* Dynamic shared memory of an onchip block holding `slots` batches per thread. */
static SBN_ARGS_HD int64_t sbn_hold_bytes(int kind, int slots) {
  return (int64_t)slots * sbn_batch(kind) * SBN_GPU_THREADS * sbn_pos_bytes(kind);
}
/* Elements per 16-byte vector of a dtype (sbnFloat32: 4, fp16/bf16: 8). */
static SBN_ARGS_HD int sbn_vec_of(int dtype) {
  const int size = sbn_dtype_size(dtype);
  return size > 0 ? 16 / size : 1;
}

/* One rank's work. */
typedef struct {
  int64_t n, c, sp;
  int64_t rows; /* n * sp */
  int tile;     /* tile units (32 channels) or plane units (one channel) */
  int vec;      /* elements per position (1: scalar kernels) */
  int ngroups;  /* channel groups: tile ceil(c / 32), plane c */
  int P;        /* slices per group */
  int units;    /* ngroups * P */
  int nchunks;  /* mailbox records of the op: ceil(c / 32) */
} sbn_geo_t;

static SBN_ARGS_HD sbn_geo_t sbn_geo_make(int64_t n, int64_t c, int64_t sp, int tile, int vec,
                                          int G) {
  sbn_geo_t g;
  g.n = n;
  g.c = c;
  g.sp = sp;
  g.rows = n * sp;
  g.tile = tile;
  g.vec = vec;
  g.nchunks = (int)((c + SBN_GPU_CHUNK - 1) / SBN_GPU_CHUNK);
  g.ngroups = tile ? g.nchunks : (int)c;
  g.P = G > g.ngroups ? G / g.ngroups : 1;
  g.units = g.ngroups * g.P;
  return g;
}

/* Block b of G owns units [sbn_unit_begin(g, b, G), sbn_unit_begin(g, b + 1, G)) =
   [ceil(U*b/G), ceil(U*(b+1)/G)): at most ceil(U/G) of them, the same count as a round
   robin deal, but contiguous; block 0 owns unit 0 (channel 0's slice 0: a solo op's
   block 0 writes num_batches_tracked, coop_kernel.cuh). 32-bit arithmetic (a 64-bit
   division is ~100 instructions of every kernel: check-sass.sh): U <= max(C, G), C <=
   2^20 (config.c) and G <= SBN_MAX_RANK_BLOCKS = 2^11 (sbn_plan_blocks), so U*G + G <
   2^32. */
#define SBN_MAX_RANK_BLOCKS 2048
static SBN_ARGS_HD int sbn_unit_begin(const sbn_geo_t* g, int b, int G) {
  return (int)(((uint32_t)g->units * (uint32_t)b + (uint32_t)G - 1u) / (uint32_t)G);
}
/* The block that owns unit u: ceil(U*b/G) <= u < ceil(U*(b+1)/G) iff U*b <= u*G < U*(b+1). */
static SBN_ARGS_HD int sbn_unit_owner(const sbn_geo_t* g, int u, int G) {
  return (int)((int64_t)u * G / g->units);
}
/* The mailbox chunk of unit u's channels (tile units: its group; plane units: the chunk
   of its channel), whose gather its stage 4 needs (coop_exchange.cuh: finish_coefs). */
static SBN_ARGS_HD int sbn_unit_chunk(const sbn_geo_t* g, int u) {
  return u % g->ngroups / (g->tile ? 1 : SBN_GPU_CHUNK);
}
/* The chunks [*j0, *j1) published by the block that owns units [u0, u1): those whose
   first channel's slice-0 unit (unit j of tile units, unit 32*j of plane units) it owns.
   Every chunk has one publisher; with tile units of one slice (unit = chunk) it is the
   owner of all of the chunk's units (the solo ops, coop_kernel.cuh). */
static SBN_ARGS_HD void sbn_pub_chunks(const sbn_geo_t* g, int u0, int u1, int* j0, int* j1) {
  const int sh = g->tile ? 0 : 5; /* log2 of a chunk's units in slice 0 (SBN_GPU_CHUNK = 32:
                                     coop.cu asserts it) */
  int end = (u1 + (1 << sh) - 1) >> sh;
  if (end > g->nchunks) end = g->nchunks;
  const int first = (u0 + (1 << sh) - 1) >> sh;
  *j0 = first < end ? first : end;
  *j1 = end;
}

/* Rows [*r0, *r1) of slice p: cut at multiples of vec, so that with spatial % vec == 0
   every plane piece starts on a 16-byte boundary. */
static SBN_ARGS_HD int64_t sbn_slice_start(const sbn_geo_t* g, int p) {
  if (p >= g->P) return g->rows;
  const int64_t r = g->rows * p / g->P;
  return r - r % g->vec;
}
static SBN_ARGS_HD void sbn_geo_slice(const sbn_geo_t* g, int p, int64_t* r0, int64_t* r1) {
  *r0 = sbn_slice_start(g, p);
  *r1 = sbn_slice_start(g, p + 1);
}

/* Tile units: rows one block step covers, and the positions thread (w, lane) of a unit
   with rows [r0, r1) reads (0 for a thread whose vector column lies past C). */
static SBN_ARGS_HD int sbn_tile_step(const sbn_geo_t* g) { return (SBN_GPU_THREADS / 32) * g->vec; }
static SBN_ARGS_HD int64_t sbn_tile_positions(const sbn_geo_t* g, int grp, int64_t r0, int64_t r1,
                                              int w, int lane) {
  const int vpg = SBN_GPU_CHUNK / g->vec;
  const int64_t c0 = (int64_t)grp * SBN_GPU_CHUNK + (int64_t)(lane % vpg) * g->vec;
  const int64_t to = (int64_t)w * g->vec + lane / vpg;
  if (c0 >= g->c || r1 - r0 <= to) return 0;
  const int64_t bs = sbn_tile_step(g);
  return (r1 - r0 - to + bs - 1) / bs;
}

/* Plane units: the vectors of channel c's piece of plane nn within rows [r0, r1), as
   [first, end) in units of vec elements (element index = vector index * vec), and the
   piece's elements [*e0, *e1). Returns 0 when the plane has no rows in the slice. */
static SBN_ARGS_HD int sbn_plane_piece(const sbn_geo_t* g, int64_t c, int64_t nn, int64_t r0,
                                       int64_t r1, int64_t* e0, int64_t* e1, int64_t* first,
                                       int64_t* end) {
  const int64_t p0 = nn * g->sp;
  const int64_t lo = r0 > p0 ? r0 - p0 : 0;
  const int64_t hi = r1 - p0 < g->sp ? r1 - p0 : g->sp;
  if (hi <= lo) return 0;
  const int64_t base = (nn * g->c + c) * g->sp;
  *e0 = base + lo;
  *e1 = base + hi;
  *first = *e0 / g->vec;
  *end = (*e1 + g->vec - 1) / g->vec;
  return 1;
}
/* All vectors of a plane unit (channel c, rows [r0, r1)). */
static SBN_ARGS_HD int64_t sbn_plane_vectors(const sbn_geo_t* g, int64_t c, int64_t r0, int64_t r1) {
  int64_t v = 0, e0, e1, f, e;
  if (r1 <= r0) return 0;
  for (int64_t nn = r0 / g->sp; nn * g->sp < r1; nn++)
    if (sbn_plane_piece(g, c, nn, r0, r1, &e0, &e1, &f, &e)) v += e - f;
  return v;
}

/* Whether a launch's units are tile units: NHWC, but for C = 1 (an NHWC tensor of one
   channel is its NCHW one: plane units whichever layout a rank names, so that its bits do
   not depend on the name, as a rank whose layout is immaterial may name either), and NCHW
   where every rank's spatial is 1 (sp1: NCHW of 1x1 planes is NHWC). */
static SBN_ARGS_HD int sbn_tile_layout(int nhwc, int64_t c, int sp1) { return (nhwc && c != 1) || sp1; }

/* Whether a shape can use the 16-byte kernels (besides 16-byte aligned tensors): tile
   units need whole vectors of channels; plane units need planes of whole vectors (then a
   thread steps through its unit in O(1) per position) or planes long enough that a
   thread's walk over their unaligned pieces stays short (odd sizes such as 97x97);
   small odd planes (7x7 with a large batch) take the scalar kernels instead. */
#define SBN_PLANE_VEC_MIN_SPATIAL 1024
static SBN_ARGS_HD int sbn_vec_shape_ok(int tile, int64_t c, int64_t sp, int dtype) {
  const int v = sbn_vec_of(dtype);
  return tile ? c % v == 0 : (sp % v == 0 || sp >= SBN_PLANE_VEC_MIN_SPATIAL);
}

/* Whether the onchip kernels take a shape the 16-byte kernels take: tile units, or plane
   units whose planes are whole vectors (spatial % vec == 0). The onchip kernels compile
   only that walk (coop_vec.cuh: WHOLE): the walk over odd planes' pieces, unrolled once
   per batch held in registers, was half of their machine code (check-sass.sh), and code
   size is time on small ops. Odd planes (97x97) take the stream kernels. */
static SBN_ARGS_HD int sbn_onchip_shape_ok(int tile, int64_t sp, int vec) {
  return tile || sp % vec == 0;
}

/* Whether the unit variant (coop_unit.cuh) serves a launch: one rank, and that rank the
   whole team (solo_team: a team of one, no exchange, on a transport whose kernels may
   leave the rank barrier out), on a GPU it does not share with other ranks' launches;
   the 16-byte plane kernels (NCHW with H*W > 1, aligned tensors); and units that are
   whole channels (P = G / C = 1, G < 2C: one slice per channel, so a channel's
   statistics are its unit's alone). The same G and units as the stream kernel's plan:
   the same bits. */
static SBN_ARGS_HD int sbn_unit_applies(int solo_team, int nranks, int shared, int tile, int vec,
                                        int64_t c, int G) {
  return solo_team && nranks == 1 && !shared && !tile && vec && (int64_t)G < 2 * c;
}

/* Whether auto takes the unit variant where it applies (sbn_unit_applies). Measured on an
   H200 at dd9256e (bench/notes/experiments.md, E32: plain ops, NCHW, W = 1, against stream
   in the same call): unit at 0.71-0.96x stream's time on 27 of 28 cells (S2-S5, S7-S9, fp32
   and bf16, forward and backward; S5 fp32 forward 136.9 -> 108.2 us), and 1.06x on one: the
   forward of S8 bf16, whose 97x97 planes are not whole 16-byte vectors (the walk over their
   pieces is instruction-bound, and unit adds its per-channel wait to it; S8 fp32, whose
   planes are not whole vectors either, gains 0.85x). So auto takes unit but for the forward
   of planes that are not whole vectors in a 16-bit dtype. The epilogue's kernels and the
   in-place backward's too (E40, not yet measured apart: the same stages with z, y or dz
   beside x, the same bits as stream's), so that a fused op never runs slower than its
   plain op on unit followed by an activation kernel (the reason sbn_small_auto gives for
   small). whole: every rank's planes are whole vectors (sbn_onchip_shape_ok). */
static SBN_ARGS_HD int sbn_unit_auto(int kind, int dtype, int whole, int epilogue) {
  (void)epilogue;
  return !(kind == SBN_OP_FORWARD && sbn_vec_of(dtype) == 8 && !whole);
}

/* Whether the small variant (coop_small.cuh) serves a launch: one rank, the whole team
   (solo_team, as the unit variant's), on a GPU it does not share; tile units (NHWC, or
   H*W = 1) of at most SBN_SMALL_ROWS rows. Any C and alignment (element loads): its G is
   its own, a block per 32-channel chunk up to the co-resident grid (sbn_small_blocks). */
static SBN_ARGS_HD int sbn_small_applies(int solo_team, int nranks, int shared, int tile, int64_t rows) {
  return solo_team && nranks == 1 && !shared && tile && rows <= SBN_SMALL_ROWS;
}
/* Whether the small variant may serve a team of two or more ranks (SBN_VAR_SMALL_TEAM,
   SBN_KERNEL=small only: sbn_plan_launch): not on the peer-pinned-host transport
   (small_team), on a GPU the launch does not share, tile units of at most SBN_SMALL_ROWS
   rows on every rank of the launch (rows_max); its blocks publish and gather each chunk's
   records (coop_small.cuh). A rank launched by itself is planned from its own rows: a team
   whose ranks plan differently (one of more rows runs stream) still exchanges the same
   records, 32-channel chunks in rank order (test_small_teams). Not measured on a GPU
   (bench/notes/exchange.md, "The small kernel for teams"). */
static SBN_ARGS_HD int sbn_small_team_applies(int small_team, int shared, int tile, int64_t rows_max) {
  return small_team && !shared && tile && rows_max <= SBN_SMALL_ROWS;
}
/* Whether auto takes the small variant where it applies (sbn_small_applies). Measured on
   an H200 at dd9256e (bench/notes/experiments.md, E33: plain ops, W = 1, against stream in
   the same call): small at 0.51-0.75x stream's time on every cell, forward and backward
   (S10 fp32 and bf16, NCHW and NHWC; the latency rows; S10 fp32 NCHW forward 12.2 -> 6.7
   us, backward 9.1 -> 6.1), every cell inside E33's rule (at most 0.9x). Its epilogue's
   kernels too (an activation, z, dz: the same structure with one more element load per
   value in the same round trip; not measured apart), so that a fused op never runs slower
   than its plain op followed by the activation; the in-place backward's small kernel is
   not built (occupancy 0: stream). The host path runs small's statistics and the stream
   apply on the same plan (sbn_host_stats_stage): the same bits on both paths. */
static SBN_ARGS_HD int sbn_small_auto(int kind, int dtype, int epilogue) {
  (void)kind, (void)dtype, (void)epilogue;
  return 1;
}
static SBN_ARGS_HD int64_t sbn_small_blocks(int64_t c, int64_t gmax) {
  int64_t G = (c + SBN_GPU_CHUNK - 1) / SBN_GPU_CHUNK;
  if (G > gmax) G = gmax;
  return G < 1 ? 1 : G;
}

/* The stream variant asks L2 for nothing ahead of its loads. Until 2026-11-26 it did
   (SBN_PREFETCH_AHEAD = 2 block batches: a bulk prefetch per plane piece, each thread's
   lines for tile units); on the H100 asking one batch ahead was 4-5 % faster (median)
   than two, four 3-17 % slower, and none 5 % (forward) and 9 % (backward) faster than
   two, up to 18 % (bench/results/2026-11-26-h100-ad98116, bench/notes/experiments.md, E20-E21;
   what it was: git show 613a6e9:kernels/coop_vec.cuh, Walker::prefetch). */

/* An upper bound of the positions any thread reads in any one unit (the on-chip fit). */
static SBN_ARGS_HD int64_t sbn_unit_positions_bound(const sbn_geo_t* g) {
  const int64_t srows = (g->rows + g->P - 1) / g->P + g->vec; /* a slice, its rounding included */
  if (g->tile) return (srows + sbn_tile_step(g) - 1) / sbn_tile_step(g);
  const int64_t pieces = srows / g->sp + 2;
  const int64_t vecs = srows / g->vec + 2 * pieces; /* each piece adds at most 2 part-vectors */
  return (vecs + SBN_GPU_THREADS - 1) / SBN_GPU_THREADS;
}
/* An upper bound of the batches any thread of any block reads over all its units. */
static SBN_ARGS_HD int64_t sbn_thread_batches_bound(const sbn_geo_t* g, int kind, int G) {
  const int64_t per_unit = (sbn_unit_positions_bound(g) + sbn_batch(kind) - 1) / sbn_batch(kind);
  const int64_t units_per_block = (g->units + G - 1) / G;
  return units_per_block * per_unit;
}
/* Whether the onchip variant with `hold_slots` shared-memory batches per thread can hold
   this rank's whole tensor(s) with G blocks. */
static SBN_ARGS_HD int sbn_onchip_fits(const sbn_geo_t* g, int kind, int dtype, int G,
                                       int hold_slots) {
  if (g->vec == 1) return 0; /* the onchip kernels are the 16-byte ones */
  if (!sbn_onchip_shape_ok(g->tile, g->sp, g->vec)) return 0;
  return sbn_thread_batches_bound(g, kind, G) <=
         (int64_t)SBN_HOLD_REG_BATCHES(dtype, g->tile) + hold_slots;
}

/* Blocks per rank for the stream and onchip variants: at least one per 32-channel chunk,
   one per SBN_ELEMS_PER_BLOCK elements, at most gmax (the co-resident grid). */
static SBN_ARGS_HD int64_t sbn_plan_blocks(int64_t numel, int64_t c, int64_t gmax) {
  int64_t G = (numel + SBN_ELEMS_PER_BLOCK - 1) / SBN_ELEMS_PER_BLOCK;
  const int64_t nchunks = (c + SBN_GPU_CHUNK - 1) / SBN_GPU_CHUNK;
  if (G < nchunks) G = nchunks;
  if (G > gmax) G = gmax;
  if (G > SBN_MAX_RANK_BLOCKS) G = SBN_MAX_RANK_BLOCKS; /* sbn_unit_begin's 32 bits */
  return G < 1 ? 1 : G;
}

/* ---- the plan of a launch --------------------------------------------------------------
   Host code (src/gpu/gpu_launch.c plans every launch with it; the emulator's tests plan
   theirs with it too, so that what they compare is what the library launches). */

/* What the plan reads of the op, the same on every rank (the signature). */
typedef struct {
  int kind, dtype;
  int nhwc;
  int64_t c;
  int host;   /* the host-driven path (SBN_ALGO=nccl): the stream stages as ordinary launches */
  int kernel; /* SBN_KERNEL_* asked for */
  int solo_team; /* the team is one rank, and not on the peer-pinned-host transport (whose
                    kernels read the error words at their start, made the rank's decision by
                    the rank barrier): the unit and small variants may serve it */
  int epilogue;  /* the round runs the kernels of an epilogue or of the in-place backward
                    (sbn_gpu_round_epi != SBN_EPI_NONE); 0: the plain op's (sbn_unit_auto
                    and sbn_small_auto take both alike) */
  int small_team; /* the team has two or more ranks and is not on the peer-pinned-host
                     transport: SBN_KERNEL=small may serve it (sbn_small_team_applies) */
} sbn_plan_op_t;

/* What it reads of one rank's op. */
typedef struct {
  int64_t n, sp;
  int aligned; /* x, dy and y/dx all 16-byte aligned */
} sbn_plan_rank_t;

/* What it reads of the device, for the op's kind and dtype. */
typedef struct {
  int sms;
  int ranks_here; /* ranks whose launches share the device's co-resident blocks */
  int shared;     /* ranks of a team launched separately share this GPU */
  int occ[2][2][SBN_VAR_COUNT]; /* blocks per SM of the kernels [tile][vec][variant]
                                   (0: not built) */
  int occ_min;                  /* the lowest of the stream kernels' */
  int hold_slots[2];            /* onchip: shared-memory batches per thread [tile] */
} sbn_plan_dev_t;

/* The plan of a launch: the kernel variant and width, G blocks per rank, the unit shape. */
typedef struct {
  int G, tile, vec, variant, hold_slots;
} sbn_plan_t;

/* Why a launch has no plan (the host words the message). */
enum {
  SBN_PLAN_OK = 0,
  SBN_PLAN_ONCHIP_SHARED, /* SBN_KERNEL=onchip on ranks that share a GPU */
  SBN_PLAN_ONCHIP_SHAPE,  /* SBN_KERNEL=onchip on tensors the onchip kernels cannot take:
                             not 16-byte aligned, or not whole vectors (sbn_vec_shape_ok,
                             sbn_onchip_shape_ok) */
  SBN_PLAN_NO_BLOCKS,     /* more ranks on the device than its co-resident blocks */
  SBN_PLAN_ONCHIP_NOFIT   /* SBN_KERNEL=onchip: the tensors do not fit on chip */
};

/* The plan of ONE launch running `nranks` ranks (a virtual team's round, or one rank):
   SBN_PLAN_OK and *pl, or why not, with *detail for the message: the device's co-resident
   blocks (SBN_PLAN_NO_BLOCKS), the batches per thread (SBN_PLAN_ONCHIP_NOFIT, *pl as
   tried). */
static inline int sbn_plan_launch(const sbn_plan_op_t* op, const sbn_plan_rank_t* ranks,
                                  int nranks, const sbn_plan_dev_t* dev, sbn_plan_t* pl,
                                  int64_t* detail) {
  const int V = sbn_vec_of(op->dtype);
  int sp1 = 1;
  for (int i = 0; i < nranks; i++) sp1 &= ranks[i].sp == 1;
  const int tile = sbn_tile_layout(op->nhwc, op->c, sp1);
  /* the 16-byte kernels: every tensor 16-byte aligned, and a shape they serve */
  int vec = 1, whole = 1;
  int64_t numel = 0, rows_max = 0; /* the largest rank's elements, and rows (small) */
  for (int i = 0; i < nranks; i++) {
    vec &= ranks[i].aligned && sbn_vec_shape_ok(tile, op->c, ranks[i].sp, op->dtype);
    whole &= sbn_onchip_shape_ok(tile, ranks[i].sp, V);
    const int64_t rows = ranks[i].n * ranks[i].sp;
    if (rows > rows_max) rows_max = rows;
    if (rows * op->c > numel) numel = rows * op->c;
  }
  /* auto runs stream, or unit where sbn_unit_auto takes it, or small where sbn_small_auto
     takes it (below). Until 1be20b9 it ran onchip where the tensors fit; on the H100
     (bench/results/2026-11-26-h100-1be20b9) stream was faster on every row where auto had
     picked onchip (sbn-bench --quick, every row both ways: 0.79-0.98x the time forward,
     0.82-1.00x backward; S10, S2, S1 bf16 NHWC forward; bench/notes/experiments.md,
     E25): whatever fits on chip (at most ~41 MB of x) also fits in the L2 (50
     MB on an H100/H200), where stage 5's second read lands, and the stream kernels run 2
     blocks per SM with half the code.
     onchip runs when SBN_KERNEL=onchip asks for it. The host path runs the stream stages
     whatever SBN_KERNEL asks, cut as the cooperative kernel would be (the same G and
     width, so the same bits): under SBN_KERNEL=onchip onchip's plan where it has one,
     else stream's; where the cooperative kernel would run small, small's plan, whose
     statistics the host path computes with small's own kernel (sbn_host_stats_stage).
     Ranks sharing a GPU are separate launches that must all be resident at once: they run
     stream, sized by the lowest occupancy of the non-onchip kernels, so
     that any mix (tile next to plane, forward next to a mismatched backward) fits side by
     side. */
  if (op->host && op->kernel == SBN_KERNEL_ONCHIP) {
    sbn_plan_op_t coop = *op;
    coop.host = 0;
    if (sbn_plan_launch(&coop, ranks, nranks, dev, pl, detail) == SBN_PLAN_OK) {
      pl->variant = SBN_VAR_STREAM;
      pl->hold_slots = 0;
      return SBN_PLAN_OK;
    }
    coop.kernel = SBN_KERNEL_STREAM;
    return sbn_plan_launch(&coop, ranks, nranks, dev, pl, detail);
  }
  const int onchip = op->kernel == SBN_KERNEL_ONCHIP;
  if (onchip && (!vec || !whole || dev->shared))
    return dev->shared ? SBN_PLAN_ONCHIP_SHARED : SBN_PLAN_ONCHIP_SHAPE;
  const int var = onchip ? SBN_VAR_ONCHIP : SBN_VAR_STREAM;
  const int occ = dev->shared ? dev->occ_min : dev->occ[tile][vec][var];
  const int64_t gmax = (int64_t)occ * dev->sms / dev->ranks_here;
  if (gmax < 1) {
    *detail = (int64_t)occ * dev->sms;
    return SBN_PLAN_NO_BLOCKS;
  }
  const int64_t G = sbn_plan_blocks(numel, op->c, gmax);
  pl->G = (int)G;
  pl->tile = tile;
  pl->vec = vec;
  pl->variant = var;
  pl->hold_slots = onchip ? dev->hold_slots[tile] : 0;
  /* SBN_KERNEL=unit: the unit variant where it applies, with stream's G (the same slices,
     the same bits; its kernels hold as many blocks per SM: check-sass.sh), else stream;
     auto, and small where small does not apply (below: small applies to tile units, unit
     to plane units), the same where sbn_unit_auto takes it. The host path runs the stream
     stages on that plan. */
  const int unit = op->kernel == SBN_KERNEL_UNIT ||
                   ((op->kernel == SBN_KERNEL_AUTO || op->kernel == SBN_KERNEL_SMALL) &&
                    sbn_unit_auto(op->kind, op->dtype, whole, op->epilogue));
  if (unit && !op->host &&
      sbn_unit_applies(op->solo_team, nranks, dev->shared, tile, vec, op->c, pl->G) &&
      dev->occ[tile][vec][SBN_VAR_UNIT] >= occ)
    pl->variant = SBN_VAR_UNIT;
  /* auto and SBN_KERNEL=small: the small variant where it applies (a team of one), is
     built (occ 0 for the in-place backward's, which is not) and, under auto,
     sbn_small_auto takes it, with its own G; under SBN_KERNEL=small the team variant for a
     team of two or more (sbn_small_team_applies), with its own occupancy; else unit or
     stream as above. The host path plans the same: it runs small's statistics kernel, then
     the stream apply (sbn_host_stats_stage), small's bits. */
  const int small = op->kernel == SBN_KERNEL_SMALL ||
                    (op->kernel == SBN_KERNEL_AUTO && sbn_small_auto(op->kind, op->dtype, op->epilogue));
  const int small_team =
      op->kernel == SBN_KERNEL_SMALL && sbn_small_team_applies(op->small_team, dev->shared, tile, rows_max);
  const int small_var = small_team ? SBN_VAR_SMALL_TEAM : SBN_VAR_SMALL;
  const int small_here =
      small_team || sbn_small_applies(op->solo_team, nranks, dev->shared, tile, rows_max);
  /* (its own grid: at least a block per rank co-resident, else what auto runs) */
  const int64_t small_gmax = (int64_t)dev->occ[tile][vec][small_var] * dev->sms / dev->ranks_here;
  if (small && small_here && small_gmax >= 1) {
    pl->variant = small_var;
    pl->G = (int)sbn_small_blocks(op->c, small_gmax);
  }
  if (!onchip) return SBN_PLAN_OK;
  int fits = 1;
  *detail = 0;
  for (int i = 0; i < nranks; i++) {
    const sbn_geo_t geo = sbn_geo_make(ranks[i].n, op->c, ranks[i].sp, tile, V, (int)G);
    fits &= sbn_onchip_fits(&geo, op->kind, op->dtype, (int)G, pl->hold_slots);
    const int64_t b = sbn_thread_batches_bound(&geo, op->kind, (int)G);
    if (b > *detail) *detail = b;
  }
  return fits ? SBN_PLAN_OK : SBN_PLAN_ONCHIP_NOFIT;
}

/* The plans of a round's ranks on one device, plans[i] for ranks[i]. One launch for all
   of them (one_launch: a virtual team) has one plan. Otherwise every rank is planned from
   its own op alone, whichever path issues it: the cooperative path launches each rank by
   itself, and the host path, which issues a device's ranks together, must cut each rank
   into the same slices (G, width, unit shape) to reduce in the same order (its bits). */
static inline int sbn_plan_round(const sbn_plan_op_t* op, const sbn_plan_rank_t* ranks, int nranks,
                                 int one_launch, const sbn_plan_dev_t* dev, sbn_plan_t* plans,
                                 int64_t* detail) {
  if (one_launch) {
    const int st = sbn_plan_launch(op, ranks, nranks, dev, &plans[0], detail);
    for (int i = 1; st == SBN_PLAN_OK && i < nranks; i++) plans[i] = plans[0];
    return st;
  }
  for (int i = 0; i < nranks; i++) {
    const int st = sbn_plan_launch(op, &ranks[i], 1, dev, &plans[i], detail);
    if (st != SBN_PLAN_OK) return st;
  }
  return SBN_PLAN_OK;
}

/* ---- the inference kernel's plane groups ------------------------------------------------ */
/* Positions (16-byte vectors, or elements in the scalar kernel) each thread of the inference
   kernels (kernels/infer.cuh) has in flight at once. */
#define SBN_INFER_BATCH 4

/* Threads per plane of the plane inference kernel (kernels/infer.cuh: the block's groups
   each walk a plane of sp elements in positions of vec elements, SBN_INFER_BATCH positions
   per thread and pass). Planes of fewer than 2048 elements: a warp. Larger ones: the
   smallest power of two in [32, SBN_GPU_THREADS] whose one pass holds the plane's P
   positions (its ends may be part-vectors), the block where none does. Until 2026-12-04
   the block took every plane of 2048 elements or more: a 64x64 plane in fp16/bf16 (512
   vectors) filled half of each thread's slots in its one pass (1024; fp32's 1024 vectors
   fill them all), and bf16 inference took 1.36-1.55x a copy of x on S2-S5 against fp32's
   1.11-1.19 (H200, dd9256e; bench/notes/experiments.md, E34, E35). Where one pass holds
   the plane, every position of a group's plane is in flight at once whichever group takes
   it; a smaller group leaves fewer slots empty, so a full grid has more in flight. */
static SBN_ARGS_HD int sbn_infer_group(int64_t sp, int vec) {
  if (sp < 2048) return 32;
  const int64_t P = (sp + vec - 1) / vec + (sp % vec != 0); /* at most one part-vector more */
  int g = 32;
  while (g < SBN_GPU_THREADS && (int64_t)SBN_INFER_BATCH * g < P) g *= 2;
  return g;
}

/* The inference kernel of a tensor (kernels/infer.cuh): SBN_INFER_TILE for tile layouts
   (NHWC, or spatial 1), SBN_INFER_FLAT for NCHW planes of at least SBN_INFER_FLAT_MIN
   elements in 16-byte vectors (vec: x, y and z 16-byte aligned), SBN_INFER_PLANE for the
   others. The flat kernel splits the tensor's vectors evenly over the grid's warps where
   the plane kernel gives each plane a group: the plane kernel's rounds of planes left its
   last one part-empty (8192 planes over 1056 groups on S5; 97x97 planes in 3 passes of 1024
   vectors, 77 % full), and fp32 inference took 1.16-1.25x a copy of x on S5, S8, S9 (H200,
   dd9256e; bench/notes/experiments.md, E34, E36). At least 2048 elements a plane, so that a
   lane's batch (4 steps of 32 vectors of at most 8 elements) reaches past at most one
   plane end (infer.cuh). plane_only: the plane kernel where flat would run (SBN_INFER=plane,
   the A/B of gpu_infer.c). */
enum { SBN_INFER_PLANE = 0, SBN_INFER_TILE = 1, SBN_INFER_FLAT = 2, SBN_INFER_KINDS = 3 };
#define SBN_INFER_FLAT_MIN 2048
static SBN_ARGS_HD int sbn_infer_kind(int nhwc, int64_t sp, int vec, int plane_only) {
  if (nhwc || sp == 1) return SBN_INFER_TILE;
  return vec && sp >= SBN_INFER_FLAT_MIN && !plane_only ? SBN_INFER_FLAT : SBN_INFER_PLANE;
}

/* The host path's statistics stage for a plan (coop_args.h: SBN_HOST_*): small's own
   (its sums in its order, written straight into the rank's record: no PUBLISH) where the
   plan is small, else the stream kernel's stage 1, which PUBLISH then merges. APPLY is the
   stream kernel's stage 5 either way. */
static SBN_ARGS_HD int sbn_host_stats_stage(const sbn_plan_t* pl) {
  return SBN_VAR_IS_SMALL(pl->variant) ? SBN_HOST_SMALL_STATS : SBN_HOST_STATS;
}
static SBN_ARGS_HD int sbn_host_publishes(const sbn_plan_t* pl) {
  return sbn_host_stats_stage(pl) == SBN_HOST_STATS; /* small's statistics write the records */
}
/* Whether a backward with dz may write it in its first pass (coop_args.h: dz_early;
   coop_vec.cuh: dz_first) on this plan: not on the host path's small plan, whose
   statistics kernel (small's) does not write dz; APPLY computes and writes it there. */
static SBN_ARGS_HD int sbn_plan_dz_early(const sbn_plan_t* pl, int host) {
  return !(host && SBN_VAR_IS_SMALL(pl->variant));
}

/* Bytes of the caller's tensors one rank's op moves through device memory, per variant
   (tests/test_coop_emu.c asserts them in the emulator; the bench reports them):
   forward reads x and writes y, backward reads x and dy and writes dx (when dx is
   requested); the stream and unit variants read x (and dy) a second time in stage 5,
   where there is one (unit: right after stage 1 of the same channel, from L2 where the
   channels in flight fit there: what HBM moves is then that of onchip); the small variant
   holds its values in registers: once, as onchip.
   bytes = the elements of one tensor * their size. */
static SBN_ARGS_HD int64_t sbn_variant_bytes(int variant, int kind, int64_t bytes, int write_out) {
  const int64_t inputs = kind == SBN_OP_FORWARD ? 1 : 2;
  const int once = variant == SBN_VAR_ONCHIP || SBN_VAR_IS_SMALL(variant);
  const int64_t reads = once || !write_out ? inputs : 2 * inputs;
  return (reads + (write_out ? 1 : 0)) * bytes;
}

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_COOP_PLAN_H_ */
