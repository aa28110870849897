/* test_gpu_cmp.c — the GPU tests' comparisons (gpu_cmp.h) on host data, no GPU needed: an
 * output the GPU never wrote (still the fixture's poison) is reported as NEVER WRITTEN
 * before any value comparison, and only then; values that legitimately hold the poison
 * pattern (the CPU team's value has the same bits) are not. Runs in every CUDA build. */
#define _POSIX_C_SOURCE 200809L
#define GPU_CMP_WHO "GPU"
/* gpu_cmp.h's other comparisons are not needed here */
#pragma GCC diagnostic ignored "-Wunused-function"
#include "gpu_cmp.h"

/* Runs cmp(...) and takes back the failure it is expected to record; returns its result and
   the number of failures it recorded. */
#define EXPECTED_FAILURES(call, result, failures)                      \
  do {                                                                 \
    int before_ = sbn_test_failures_, cur_ = sbn_test_cur_failed_;     \
    result = (call);                                                   \
    failures = sbn_test_failures_ - before_;                           \
    sbn_test_failures_ = before_;                                      \
    sbn_test_cur_failed_ = cur_;                                       \
  } while (0)

static void test_poison_reported_as_unwritten(void) {
  float cpu[64], gpu[64];
  for (int i = 0; i < 64; i++) cpu[i] = gpu[i] = 0.25f * (float)(i - 20);
  memset(&gpu[40], GPU_POISON, 8 * sizeof(float)); /* 40..47 never written */
  int ok = 1, failures = 0;
  fprintf(stderr, "expected below: y rank 1 never written, items 40..47\n");
  EXPECTED_FAILURES(cmp_f32("y", 1, gpu, cpu, 64, NULL, GC_OUT_ATOL, GC_OUT_RTOL), ok, failures);
  ASSERT_TRUE(!ok);
  ASSERT_EQ_INT(failures, 1); /* one diagnosis: never written, not also "out of tolerance" */
  /* written but wrong: a value diagnosis, not "never written" */
  memcpy(gpu, cpu, sizeof gpu);
  gpu[7] += 1.0f;
  ASSERT_EQ_INT(sbn_unwritten(gpu, cpu, 64, sizeof(float), GPU_POISON).count, 0);
  EXPECTED_FAILURES(cmp_f32("y", 1, gpu, cpu, 64, NULL, GC_OUT_ATOL, GC_OUT_RTOL), ok, failures);
  ASSERT_TRUE(!ok);
  ASSERT_EQ_INT(failures, 1);
}

static void test_poison_pattern_as_a_value(void) {
  /* bf16: the CPU team's value 0xffff (a NaN) at [3], the GPU's the same: written */
  uint16_t cpu[8] = {1, 2, 3, 0xffff, 5, 6, 7, 8}, gpu[8];
  memcpy(gpu, cpu, sizeof gpu);
  sbn_unwritten_t u = sbn_unwritten(gpu, cpu, 8, sizeof(uint16_t), GPU_POISON);
  ASSERT_EQ_INT(u.count, 0);
  gpu[5] = 0xffff; /* [5]: poison where the CPU has 6 */
  u = sbn_unwritten(gpu, cpu, 8, sizeof(uint16_t), GPU_POISON);
  ASSERT_EQ_INT(u.count, 1);
  ASSERT_EQ_INT(u.first, 5);
  int ok = 1, failures = 0;
  fprintf(stderr, "expected below: dx (bf16) rank 0 never written, item 5\n");
  EXPECTED_FAILURES(cmp_out("dx", 0, sbnBFloat16, gpu, cpu, 8), ok, failures);
  ASSERT_TRUE(!ok);
  ASSERT_EQ_INT(failures, 1);
}

static void test_runs_counted(void) {
  unsigned char out[10];
  memset(out, 1, sizeof out);
  out[2] = out[3] = out[7] = GPU_POISON;
  sbn_unwritten_t u = sbn_unwritten(out, NULL, 10, 1, GPU_POISON);
  ASSERT_EQ_INT(u.count, 3);
  ASSERT_EQ_INT(u.ranges, 2);
  ASSERT_EQ_INT(u.first, 2);
  ASSERT_EQ_INT(u.last, 7);
}

int main(void) {
  SBN_RUN(test_poison_reported_as_unwritten);
  SBN_RUN(test_poison_pattern_as_a_value);
  SBN_RUN(test_runs_counted);
  return sbn_test_exit();
}
