/* test_group_stacks.c — the threads sbnGroupEnd starts for a CPU team's ranks take
 * SBN_GROUP_THREAD_STACK (1 MiB) of address space each, not the default stack (RLIMIT_STACK's,
 * 8 MiB on most systems).
 *
 * Under an address-space limit of 200 MB (set here with setrlimit, as `ulimit -v`), a group
 * of 128 ranks runs a forward and a backward: its 127 threads hold ~130 MB of stack where the
 * default would have taken 1 GB (8 MiB each; 254 MB where the stack is unlimited: glibc's
 * 2 MiB) and failed the group (sbnSystemError, "could not create a thread"). Skipped (77)
 * where the hard limit is already below 200 MB. The results are checked against the float64 statistics of the team's batch. Not
 * under the sanitizers (their shadow memory does not fit such a limit): exit 77.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "harness.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif

enum { W = 128, N = 1, C = 4, SP = 8 };

static void test_group_of_128_under_200mb(void) {
  struct rlimit rl = {200u << 20, 200u << 20};
  ASSERT_TRUE(setrlimit(RLIMIT_AS, &rl) == 0);
  static sbnComm_t comms[W];
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  cfg.max_channels = C;
  ASSERT_OK(sbnCommInitCpu(comms, W, &cfg));
  static float x[W][N * C * SP], y[W][N * C * SP], dy[W][N * C * SP], dx[W][N * C * SP];
  static float mean[W][C], invstd[W][C], dw[W][C], db[W][C];
  static float weight[C] = {1, 1, 1, 1}, bias[C];
  for (int r = 0; r < W; r++)
    for (int i = 0; i < N * C * SP; i++) {
      x[r][i] = (float)((i * 5 + r * 3) % 13) - 6.0f;
      dy[r][i] = (float)((i + r) % 5) - 2.0f;
    }
  const sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, N, C, SP};
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < W; r++)
    ASSERT_OK(sbnForwardTrain(comms[r], &d, x[r], y[r], weight, bias, NULL, NULL, NULL, mean[r], invstd[r],
                              NULL, NULL));
  sbnResult_t res = sbnGroupEnd();
  if (res != sbnSuccess) fprintf(stderr, "  sbnGroupEnd: %s\n", sbnGetLastError(NULL));
  ASSERT_OK(res);
  ASSERT_OK(sbnGroupStart());
  for (int r = 0; r < W; r++)
    ASSERT_OK(sbnBackward(comms[r], &d, x[r], dy[r], dx[r], weight, mean[r], invstd[r], dw[r], db[r], NULL,
                          NULL));
  ASSERT_OK(sbnGroupEnd());
  /* the team's statistics in float64: every rank has them (sums of 1024 small values) */
  for (int c = 0; c < C; c++) {
    double s = 0, q = 0;
    for (int r = 0; r < W; r++)
      for (int i = 0; i < SP; i++) s += x[r][c * SP + i];
    const double m = s / (W * SP);
    for (int r = 0; r < W; r++)
      for (int i = 0; i < SP; i++) q += (x[r][c * SP + i] - m) * (x[r][c * SP + i] - m);
    const double inv = 1.0 / sqrt(q / (W * SP) + 1e-5);
    for (int r = 0; r < W; r++) {
      EXPECT_TRUE(fabs(mean[r][c] - m) <= 1e-5 + 1e-5 * fabs(m));
      EXPECT_TRUE(fabs(invstd[r][c] - inv) <= 1e-5 * inv);
    }
  }
  for (int r = 0; r < W; r++) ASSERT_OK(sbnCommDestroy(comms[r]));
}

int main(void) {
#ifdef SANITIZED
  const int sanitized = 1;
#else
  const int sanitized = 0;
#endif
  if (sanitized) {
    printf("SKIP: under a sanitizer (its shadow memory does not fit a 200 MB address space)\n");
    return 77;
  }
  struct rlimit now;
  if (getrlimit(RLIMIT_AS, &now) == 0 && now.rlim_max != RLIM_INFINITY && now.rlim_max < (200u << 20)) {
    printf("SKIP: the address space's hard limit is below the test's 200 MB\n");
    return 77;
  }
  SBN_RUN(test_group_of_128_under_200mb);
  return sbn_test_exit();
}
