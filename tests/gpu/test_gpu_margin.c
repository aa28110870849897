/* test_gpu_margin.c — SBN_SM_MARGIN on one GPU: a cooperative grid that leaves SMs free
 * runs beside a kernel that holds those SMs and waits; one that fills the GPU cannot.
 *
 * Why: a team whose ranks are on several GPUs waits in its kernel for its peers, and so
 * does an NCCL collective (DDP's all-reduce on another stream). A cooperative grid starts
 * only when all its blocks fit, so if syncbn's grid needs every SM, GPU 0 running the
 * all-reduce first and GPU 1 running syncbn first wait for each other until the timeout.
 * Such teams leave SBN_SM_MARGIN SMs free (docs/USAGE.md, "Beside NCCL collectives").
 * The deadlock itself needs two GPUs; what one GPU can show is the mechanism, with the
 * margin set explicitly (a set margin applies to every team, a team of one too):
 *   - sm_blocker.cu holds K SMs (one block of 640 threads, as NCCL's, and all of the SM's
 *     shared memory per SM) and spins until a flag is set, for at most HOLD_MS;
 *   - once all K blocks are resident, a team of one runs a training forward whose grid
 *     wants every SM (HW large enough that sbn_plan_blocks is capped by occupancy), on
 *     another stream, followed on that stream by a kernel that sets the flag (the test's
 *     two kernels are loaded before: sm_blocker_load).
 * With SBN_SM_MARGIN=K the op runs on the other SMs, the flag is set, and every block of
 * the blocker sees it (released). With SBN_SM_MARGIN=0 (the control: it shows that the
 * blocker really takes the room the op needs, so the test can fail) the op cannot start
 * until the blocker gives up: every block's hold expires (timed out), and the op then runs.
 * In both cases y, save_mean and save_invstd match the double reference (gpu_cmp.h's
 * tolerances).
 *
 * The margin case runs twice, before and after the control: the first is the team's first
 * op, whose kernels were loaded at init (gpu_team.c queries every kernel's attributes), so
 * no module load runs beside the blocker; if only the first fails, that is where to look.
 * The op must run the stream kernel (sbnCommGetKernel), whose grid the plan caps at
 * occupancy x SMs: the shape asks for 2048 blocks (SBN_MAX_RANK_BLOCKS), more than any
 * GPU of up to 256 SMs at 8 blocks per SM holds.
 *
 * The same blocker stands for a kernel that never ends (a collective waiting for a dead
 * peer) in test_destroy_beside_a_held_device: one block held for DESTROY_HOLD_MS, the last
 * destroy of a team of one with a timeout of DESTROY_TIMEOUT_MS returns sbnTimeout after
 * that, naming the device, while the blocker still holds (it is released by the
 * host after the destroy returned, and must end released, not timed out); a new team on
 * the device then runs. (The destroy waited in cudaDeviceSynchronize until the blocker's
 * hold expired, then returned sbnSuccess.) test_init_beside_a_held_device holds it the same
 * way while a team is made: the init returns sbnSuccess within a second, the blocker still
 * holding (it waited for the whole device, until the hold expired).
 *
 * CUDA_LAUNCH_BLOCKING (the blocker's launch would return only when its hold expires),
 * SBN_ALGO, SBN_TIMEOUT_MS and SBN_SM_MARGIN are cleared at the start, SBN_KERNEL set to
 * stream.
 * Exits 77 (skipped) without a device, or on a GPU of fewer than 4*K SMs.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv, nanosleep, clock_gettime */
#include <cuda_runtime_api.h>

#include "gpu_fixture.h"
/* gpu_cmp.h: its tolerances (GC_OUT_*, GC_STAT_*, justified there); not its comparisons */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "gpu_cmp.h"
#pragma GCC diagnostic pop
#include "sm_blocker.h"

#define K_SMS 16       /* SMs the blocker holds, and the margin */
_Static_assert(K_SMS <= SM_BLOCKER_MAX_BLOCKS, "the blocker marks at most SM_BLOCKER_MAX_BLOCKS blocks");
#define HOLD_MS 3000   /* the blocker's longest hold */
#define ARRIVE_MS 10000
#define DESTROY_TIMEOUT_MS 300 /* test_destroy_beside_a_held_device's team */
#define DESTROY_HOLD_MS 8000   /* its blocker's hold: well past the destroy's 300 ms */

static const sbnTensorDesc_t g_desc = {sbnFloat32, sbnLayoutNCHW, 64, 64, 64 * 64};
static sbnComm_t g_comm;
static float *g_hx, *g_hy;
static double *g_ry, *g_rmean, *g_rinvstd;
static void *g_dx, *g_dy, *g_dmean, *g_dinvstd;

/* What one run beside the blocker gave. */
typedef struct {
  int resident, released, timed_out;
  sbnResult_t r;
  double ms; /* from the op's call to the device being idle */
} outcome_t;

static size_t numel(void) { return (size_t)sbn_ref_numel(&g_desc); }

/* sm_blocker on `blocks` SMs for at most hold_ms, on a stream of its own (*sb), its state
   in mapped host memory (*st, zeroed); waits until every block is resident, ARRIVE_MS at
   most. Returns how many are (short of `blocks`: a failure, and the blocker let go), or -1
   where a CUDA call failed. *st and *sb, where made, are the caller's to free after a
   cudaDeviceSynchronize. */
static int blocker_start(int blocks, int hold_ms, sm_blocker_state_t** st, cudaStream_t* sb) {
  *st = NULL;
  if (!CUDA_OK(cudaHostAlloc((void**)st, sizeof **st, cudaHostAllocMapped))) return -1;
  memset(*st, 0, sizeof **st);
  if (!CUDA_OK(cudaStreamCreateWithFlags(sb, cudaStreamNonBlocking)) ||
      !CUDA_OK(sm_blocker_launch(*st, blocks, hold_ms, *sb)))
    return -1;
  const double t0 = now_ms();
  while (sm_blocker_count((*st)->arrived, blocks, 1u) < blocks && now_ms() - t0 < ARRIVE_MS)
    sleep_ms(1);
  const int resident = sm_blocker_count((*st)->arrived, blocks, 1u);
  if (resident != blocks) {
    SBN_FAIL_("%d of the blocker's %d blocks resident after %d ms", resident, blocks, ARRIVE_MS);
    (*st)->flag = 1u;
  }
  return resident;
}

/* The blocker on K_SMS SMs, then (once all its blocks are resident) the op with
   SBN_SM_MARGIN=margin and the release on another stream; the outputs checked. */
static void run_beside_blocker(const char* margin, outcome_t* out) {
  memset(out, 0, sizeof *out);
  out->r = sbnNumResults; /* not called */
  sm_blocker_state_t* st = NULL;
  cudaStream_t sb = NULL, so = NULL;
  double t0 = 0.0;
  float mean[64], invstd[64];
  const char* kernel = "?";
  if (!CUDA_OK(cudaStreamCreateWithFlags(&so, cudaStreamNonBlocking)) ||
      !CUDA_OK(cudaMemset(g_dy, GPU_POISON, numel() * sizeof(float))) ||
      !CUDA_OK(cudaDeviceSynchronize()))
    goto done;
  out->resident = blocker_start(K_SMS, HOLD_MS, &st, &sb);
  if (out->resident != K_SMS) goto done;
  setenv("SBN_SM_MARGIN", margin, 1);
  t0 = now_ms();
  out->r = sbnForwardTrain(g_comm, &g_desc, g_dx, g_dy, NULL, NULL, NULL, NULL, NULL,
                           (float*)g_dmean, (float*)g_dinvstd, NULL, so);
  unsetenv("SBN_SM_MARGIN");
  if (out->r != sbnSuccess) st->flag = 1u; /* nothing queued: let the blocker go */
  if (!CUDA_OK(sm_blocker_release(st, so))) st->flag = 1u;
  if (!CUDA_OK(cudaDeviceSynchronize())) goto done;
  out->ms = now_ms() - t0;
  out->released = sm_blocker_count(st->ended, K_SMS, 1u);
  out->timed_out = sm_blocker_count(st->ended, K_SMS, 2u);
  fprintf(stderr,
          "  SBN_SM_MARGIN=%s: op %s; the blocker's %d blocks: %d released, %d timed out; "
          "%.1f ms from the call to an idle device\n",
          margin, sbnGetResultName(out->r), K_SMS, out->released, out->timed_out, out->ms);
  if (out->r != sbnSuccess) {
    SBN_FAIL_("sbnForwardTrain: %s (%s)", sbnGetResultName(out->r), sbnGetLastError(g_comm));
    goto done;
  }
  sbnCommGetKernel(g_comm, &kernel);
  if (strcmp(kernel, "stream") != 0) {
    SBN_FAIL_("the op ran the '%s' kernel, not 'stream' (whose grid this test sizes)", kernel);
    goto done;
  }
  /* the outputs, whenever the op ran */
  if (!CUDA_OK(cudaMemcpy(g_hy, g_dy, numel() * sizeof(float), cudaMemcpyDeviceToHost)) ||
      !CUDA_OK(cudaMemcpy(mean, g_dmean, sizeof mean, cudaMemcpyDeviceToHost)) ||
      !CUDA_OK(cudaMemcpy(invstd, g_dinvstd, sizeof invstd, cudaMemcpyDeviceToHost)))
    goto done;
  if (!sbn_check_close_array_("save_mean", mean, g_rmean, 64, GC_STAT_ATOL, GC_STAT_RTOL,
                              __FILE__, __LINE__) ||
      !sbn_check_close_array_("save_invstd", invstd, g_rinvstd, 64, GC_STAT_ATOL, GC_STAT_RTOL,
                              __FILE__, __LINE__) ||
      !sbn_check_close_array_("y", g_hy, g_ry, numel(), GC_OUT_ATOL, GC_OUT_RTOL, __FILE__,
                              __LINE__)) {
    sbn_test_failures_++;
    sbn_test_cur_failed_++;
  }
done:
  cudaDeviceSynchronize(); /* the blocker may still read st: let it end first */
  if (so) cudaStreamDestroy(so);
  if (sb) cudaStreamDestroy(sb);
  if (st) cudaFreeHost(st);
}

/* The margin leaves the blocker's SMs free: the op runs beside it and releases it. */
static void test_margin_runs_beside(void) {
  outcome_t o;
  char k[16];
  snprintf(k, sizeof k, "%d", K_SMS);
  run_beside_blocker(k, &o);
  CHECK_();
  ASSERT_EQ_INT(o.released, K_SMS);
  ASSERT_EQ_INT(o.timed_out, 0);
}

/* The control: a grid that wants every SM waits for the blocker to give up. */
static void test_full_grid_waits(void) {
  outcome_t o;
  run_beside_blocker("0", &o);
  CHECK_();
  ASSERT_EQ_INT(o.released, 0);
  ASSERT_EQ_INT(o.timed_out, K_SMS);
}

/* What the destroy and init tests beside a held device check once the blocker is gone: it
   held the device all through the library's call (still_held) and ended at the host's
   flag, not at its hold (released); the team's forward (f) and destroy (d) succeeded, and
   y, copied back (y_ok), is the reference's. */
static void after_the_blocker(int still_held, int released, sbnResult_t f, sbnResult_t d,
                              int y_ok) {
  ASSERT_EQ_INT(still_held, 1);
  ASSERT_EQ_INT(released, 1);
  ASSERT_OK(f);
  ASSERT_OK(d);
  ASSERT_TRUE(y_ok);
  if (!sbn_check_close_array_("y", g_hy, g_ry, numel(), GC_OUT_ATOL, GC_OUT_RTOL, __FILE__,
                              __LINE__)) {
    sbn_test_failures_++;
    sbn_test_cur_failed_++;
  }
}

/* The last destroy of a team on a device that a kernel holds: bounded (sbnTimeout after
   timeout_ms, the device named), the blocker still holding; then released by the host,
   and a new team on the device runs an op. */
static void test_destroy_beside_a_held_device(void) {
  sbnComm_t c = NULL, again = NULL;
  sm_blocker_state_t* st = NULL;
  cudaStream_t sb = NULL;
  char why[512] = "";
  sbnResult_t r = sbnNumResults, f = sbnNumResults, d = sbnNumResults;
  double waited = 0.0;
  int still_held = -1, released = -1, y_ok = 0;
  if (!init_virtual(&c, 1, 0, DESTROY_TIMEOUT_MS)) return;
  if (blocker_start(1, DESTROY_HOLD_MS, &st, &sb) != 1) {
    sbnCommDestroy(c);
    goto done;
  }
  const double t0 = now_ms();
  r = sbnCommDestroy(c);
  waited = now_ms() - t0;
  snprintf(why, sizeof why, "%s", sbnGetLastError(NULL));
  still_held = sm_blocker_count(st->ended, 1, 0u);
  st->flag = 1u; /* the kernel ends: the library's thread frees the team */
  if (!CUDA_OK(cudaDeviceSynchronize())) goto done;
  released = sm_blocker_count(st->ended, 1, 1u);
  fprintf(stderr, "  the destroy beside a held device: %s after %.1f ms (timeout %d ms): %s\n",
          sbnGetResultName(r), waited, DESTROY_TIMEOUT_MS, why);
  /* the device after it: a new team's op, checked against the reference */
  if (!init_virtual(&again, 1, 0, 60000)) goto done;
  f = sbnForwardTrain(again, &g_desc, g_dx, g_dy, NULL, NULL, NULL, NULL, NULL, (float*)g_dmean,
                      (float*)g_dinvstd, NULL, NULL);
  y_ok = CUDA_OK(cudaDeviceSynchronize()) &&
         CUDA_OK(cudaMemcpy(g_hy, g_dy, numel() * sizeof(float), cudaMemcpyDeviceToHost));
  d = sbnCommDestroy(again);
done:
  cudaDeviceSynchronize();
  if (sb) cudaStreamDestroy(sb);
  if (st) cudaFreeHost(st);
  CHECK_();
  ASSERT_RES(r, sbnTimeout);
  if (waited < DESTROY_TIMEOUT_MS || waited > DESTROY_TIMEOUT_MS + 1000)
    SBN_FAIL_("the destroy returned after %.1f ms (expected %d up to %d)", waited,
              DESTROY_TIMEOUT_MS, DESTROY_TIMEOUT_MS + 1000);
  if (strstr(why, "sbnCommDestroy: device 0 did not finish its work within timeout_ms") == NULL)
    SBN_FAIL_("sbnGetLastError(NULL) says '%s'", why);
  after_the_blocker(still_held, released, f, d, y_ok);
}

/* A team's init beside a kernel that holds the device (one block, for DESTROY_HOLD_MS):
   the init waits for its own work only (the zeroing of the team's memory, on its own
   stream), so it returns sbnSuccess while the blocker still holds; once the host releases
   the blocker, the team's op runs. (The init synchronized the whole device: it returned
   sbnSuccess only when the blocker's hold expired, DESTROY_HOLD_MS later.) The library's
   kernels were loaded by the earlier teams of this process: no module load runs here. */
static void test_init_beside_a_held_device(void) {
  sbnComm_t c = NULL;
  sm_blocker_state_t* st = NULL;
  cudaStream_t sb = NULL;
  sbnResult_t r = sbnNumResults, f = sbnNumResults, d = sbnNumResults;
  double took = 0.0;
  int still_held = -1, released = -1, y_ok = 0;
  char why[512] = "";
  /* y poisoned: it holds the earlier tests' right answer otherwise */
  if (!CUDA_OK(cudaMemset(g_dy, GPU_POISON, numel() * sizeof(float))) ||
      !CUDA_OK(cudaDeviceSynchronize()))
    goto done;
  if (blocker_start(1, DESTROY_HOLD_MS, &st, &sb) != 1) goto done;
  const sbnConfig_t cfg = config_ms(DESTROY_TIMEOUT_MS);
  const double t0 = now_ms();
  r = sbnCommInitVirtual(&c, 1, 0, &cfg);
  took = now_ms() - t0;
  snprintf(why, sizeof why, "%s", sbnGetLastError(NULL));
  still_held = sm_blocker_count(st->ended, 1, 0u);
  st->flag = 1u; /* the blocker ends */
  if (!CUDA_OK(cudaDeviceSynchronize())) goto done;
  released = sm_blocker_count(st->ended, 1, 1u);
  fprintf(stderr, "  the init beside a held device: %s after %.1f ms (timeout %d ms)%s%s\n",
          sbnGetResultName(r), took, DESTROY_TIMEOUT_MS, r == sbnSuccess ? "" : ": ",
          r == sbnSuccess ? "" : why);
  if (r != sbnSuccess) goto done;
  f = sbnForwardTrain(c, &g_desc, g_dx, g_dy, NULL, NULL, NULL, NULL, NULL, (float*)g_dmean,
                      (float*)g_dinvstd, NULL, NULL);
  y_ok = CUDA_OK(cudaDeviceSynchronize()) &&
         CUDA_OK(cudaMemcpy(g_hy, g_dy, numel() * sizeof(float), cudaMemcpyDeviceToHost));
  d = sbnCommDestroy(c);
  c = NULL;
done:
  cudaDeviceSynchronize();
  if (c) sbnCommDestroy(c);
  if (sb) cudaStreamDestroy(sb);
  if (st) cudaFreeHost(st);
  CHECK_();
  ASSERT_OK(r);
  if (took > 1000.0) SBN_FAIL_("the init took %.1f ms beside the held device", took);
  after_the_blocker(still_held, released, f, d, y_ok);
}

static int setup(void) {
  const size_t n = numel();
  g_hx = (float*)malloc(n * sizeof(float));
  g_hy = (float*)malloc(n * sizeof(float));
  g_ry = (double*)malloc(n * sizeof(double));
  g_rmean = dvec(64);
  g_rinvstd = dvec(64);
  double* var = dvec(64);
  if (!g_hx || !g_hy || !g_ry || !g_rmean || !g_rinvstd || !var) return 0;
  sbn_rng_t rng = {20261129u};
  for (int64_t ni = 0; ni < g_desc.n; ni++)
    for (int64_t ci = 0; ci < g_desc.c; ci++)
      for (int64_t si = 0; si < g_desc.spatial; si++)
        g_hx[sbn_ref_index(&g_desc, ni, ci, si)] =
            (float)(0.25 * (double)(ci % 9) - 1.0 + (0.5 + 0.03 * (double)ci) * sbn_rng_normal(&rng));
  const void* xs[1] = {g_hx};
  double* ys[1] = {g_ry};
  int64_t m = 0;
  sbn_ref_forward(1, &g_desc, xs, NULL, NULL, 1e-5, g_rmean, g_rinvstd, var, &m, ys);
  free(var);
  if (!CUDA_OK(cudaMalloc(&g_dx, n * sizeof(float))) || !CUDA_OK(cudaMalloc(&g_dy, n * sizeof(float))) ||
      !CUDA_OK(cudaMalloc(&g_dmean, 64 * sizeof(float))) ||
      !CUDA_OK(cudaMalloc(&g_dinvstd, 64 * sizeof(float))) ||
      !CUDA_OK(cudaMemcpy(g_dx, g_hx, n * sizeof(float), cudaMemcpyHostToDevice)))
    return 0;
  return init_virtual(&g_comm, 1, 0, 60000);
}

int main(void) {
  unsetenv("CUDA_LAUNCH_BLOCKING"); /* before the first CUDA call, which reads it */
  unsetenv("SBN_TIMEOUT_MS");
  unsetenv("SBN_SM_MARGIN");
  setenv("SBN_KERNEL", "stream", 1); /* the kernel whose grid this test sizes (auto runs unit
                                        where its G < 2C: on a GPU of fewer than 64 usable SMs) */
  unsetenv("SBN_ALGO"); /* the cooperative kernel */
  char why[320];
  if (gpu_count_devices(why, sizeof why) == 0) return gpu_skip_no_device("test_gpu_margin", why);
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    fprintf(stderr, "test_gpu_margin: FAILED: cudaGetDeviceProperties(0)\n");
    return 1;
  }
  if (prop.multiProcessorCount < 4 * K_SMS) {
    printf("test_gpu_margin: SKIPPED: device 0 (%s) has %d SMs; the test holds %d and needs "
           "at least %d\n", prop.name, prop.multiProcessorCount, K_SMS, 4 * K_SMS);
    return SBN_TEST_SKIP;
  }
  fprintf(stderr, "test_gpu_margin: device 0: %s, %d SMs; the blocker holds %d for at most %d ms\n",
          prop.name, prop.multiProcessorCount, K_SMS, HOLD_MS);
  if (!CUDA_OK(sm_blocker_load()) || !setup()) {
    fprintf(stderr, "test_gpu_margin: FAILED: setup\n");
    return 1;
  }
  SBN_RUN(test_margin_runs_beside);
  SBN_RUN(test_full_grid_waits);
  SBN_RUN(test_margin_runs_beside);
  SBN_RUN(test_destroy_beside_a_held_device);
  SBN_RUN(test_init_beside_a_held_device);
  sbnCommDestroy(g_comm);
  cudaFree(g_dx);
  cudaFree(g_dy);
  cudaFree(g_dmean);
  cudaFree(g_dinvstd);
  free(g_hx);
  free(g_hy);
  free(g_ry);
  free(g_rmean);
  free(g_rinvstd);
  return sbn_test_exit();
}
