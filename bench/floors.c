/* floors.c — the floors, defined once: the bytes one BatchNorm op must move (its lower
 * bounds at the copy bandwidth B), and the effective bytes behind GB/s. The table, the JSON
 * (every row carries them) and bench/plot.py, bench/torch_baseline.py (which read them from
 * the JSON) all come from op_derived. */
#include <math.h>

#include "bench.h"

/* Multiples of |x| (the bytes of ALL W ranks' x: they share the GPU), [0] backward, [1]
   forward. Floor (a): every input read twice (the statistics pass, then the normalize pass)
   and the output written once: forward x, x, y; backward x and dy twice, dx. Floor (b): each
   tensor once (inputs held on chip between the passes): forward x, y; backward x, dy, dx.
   --epilogue (bench.h: BENCH_EPI_*), the fused op's: relu, the plain op's (fwd (a) x, x, y
   (b) x, y; bwd (a) x and dy twice, dx, (b) x, dy, dx: the activation's mask comes from x,
   the forward having had no z, sbnEpilogue_t.no_residual, and y is read only where x leaves
   its sign in doubt, a few elements in a hundred thousand: bench/notes/fused-epilogue.md,
   "The mask from x"; until 2026-12-05 y read twice (a), once (b), 7|x| and 4|x|);
   add-relu adds z read (fwd) and dz written (bwd) to the plain op's, and its backward reads
   y (a dz says there was a z: no mask from x). The in-place epilogues move the bytes of
   relu and add-relu: their backward reads y where those read x (leaky-inplace: y, dy, dx;
   add-leaky-inplace: y, z and dy, dx and dz). The split path and cuDNN's rows are held to
   the same floors: the work is the same, whatever the kernels. */
static const double kFloorA[BENCH_EPI_COUNT][2] = {
    {5.0, 3.0}, {5.0, 3.0}, {8.0, 4.0}, {5.0, 3.0}, {8.0, 4.0}};
static const double kFloorB[BENCH_EPI_COUNT][2] = {
    {3.0, 2.0}, {3.0, 2.0}, {5.0, 3.0}, {3.0, 2.0}, {5.0, 3.0}};

const char* const kFloorFormula =
    "floor / median time x 100, B = copy bandwidth of this run; |x| = bytes of ALL W ranks' x: "
    "fwd (a) 3|x|/B (x read twice, y written), (b) 2|x|/B (each tensor once); bwd (a) "
    "5|x|/B (x and dy read twice, dx written), (b) 3|x|/B; --epilogue relu: the same (the "
    "mask from x: y not needed); add-relu: fwd +|x| (z), bwd +|x| (dz) and y read twice (a), "
    "once (b); leaky-inplace, add-leaky-inplace: relu's, add-relu's (y read in x's place)";
const char* const kBytesFormula =
    "GB/s/rk = a rank's bytes / median time, the bytes of floor (b): fwd 2*numel*es (read x, "
    "write y), bwd 3*numel*es (read x and dy, write dx); --epilogue: the fused op's (relu: the "
    "same, the mask from x; add-relu: fwd 3*, bwd 5*: z read, y read, dz written; the in-place "
    "ones: relu's, add-relu's); numel = N*C*spatial, es = element size; GB/s all = W x "
    "GB/s/rk (GPU mode: all W ranks share the one GPU)";

double row_x_bytes(const bench_row_t* r) {
  return (double)(r->shape->n * r->shape->c * r->spatial) * (double)dtype_size(r->dtype);
}

bench_op_derived_t op_derived(const bench_row_t* r, int fwd, double B) {
  bench_op_derived_t o;
  const double x_rank = row_x_bytes(r), x_all = x_rank * r->W;
  const double us = row_timed(r) ? r->t[fwd].med : NAN;
  const int e = r->epilogue;
  o.bytes_rank = kFloorB[e][fwd] * x_rank;
  o.bytes_total = kFloorB[e][fwd] * x_all;
  o.gbps_rank = o.bytes_rank / (us * 1e3); /* 1 GB/s = 1e3 bytes/us */
  o.gbps_total = o.bytes_total / (us * 1e3);
  o.floor_a_bytes = kFloorA[e][fwd] * x_all;
  o.floor_b_bytes = kFloorB[e][fwd] * x_all;
  o.floor_a_us = o.floor_a_bytes / (B * 1e3);
  o.floor_b_us = o.floor_b_bytes / (B * 1e3);
  o.pct_a = o.floor_a_us / us * 100.0;
  o.pct_b = o.floor_b_us / us * 100.0;
  return o;
}

/* The inference table: y = (x - running_mean) / sqrt(running_var + eps) * weight + bias
   reads x and writes y once, W = 1: 2|x|, what a device-to-device copy of x moves, so the
   floor is the copy's time at B and t / floor is "x a copy of x" (target <= 1.1). */
const char* const kInferFormula =
    "bytes = 2|x| (read x, write y; W = 1), floor = 2|x|/B us (a device-to-device copy of x at "
    "the copy bandwidth B of this run), x copy = median time / floor (target <= 1.1); copy = the "
    "median time of a copy of x into y, timed as the call (GPU: cudaMemcpyAsync, CPU: memcpy), "
    "t/copy = median time / copy";

bench_infer_derived_t infer_derived(const bench_row_t* r, double B) {
  bench_infer_derived_t o;
  const double us = row_timed(r) ? r->t[1].med : NAN;
  o.bytes = 2.0 * row_x_bytes(r);
  o.gbps = o.bytes / (us * 1e3);
  o.floor_us = o.bytes / (B * 1e3);
  o.ratio = us / o.floor_us;
  /* the copy timed beside the call: a library row's own, a cudnn row's coop row's */
  const bench_row_t* c = r->path == BENCH_PATH_CUDNN ? r->coop : r;
  o.copy_us = row_timed(r) && row_timed(c) && c->t[0].med > 0 ? c->t[0].med : NAN;
  o.t_over_copy = us / o.copy_us;
  return o;
}
