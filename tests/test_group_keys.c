/* test_group_keys.c — a group when the process has no thread-specific key left.
 *
 * A thread's first group queue is registered under a pthread key, so that a thread that
 * exits with its group open frees the queue and gives its comms back (API.md, "Threads").
 * Where the process has used up its PTHREAD_KEYS_MAX keys before syncbn's first group,
 * pthread_key_create fails: the queue was then made anyway, and a thread that exited with
 * its group open kept its comms claimed for ever (every later sbnCommDestroy refused:
 * "in use by another thread") and leaked its queue. Now the op is refused at the call
 * (sbnSystemError, naming the key; nothing queued), so sbnGroupEnd fails and every comm
 * is still the caller's: it can run the op outside a group and destroy the comms; once
 * keys are free again, the next group makes the library's key and runs. Its own process:
 * the library's key, once made, is kept.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <string.h>

#include "harness.h"

enum { N = 2, C = 3, SP = 4 };

static void test_no_key_left(void) {
  /* every key the process can have, taken before syncbn's first group (given back after
     the refusal: the library's key stays unmade, the sanitizers' runtimes keep theirs) */
  static pthread_key_t keys[1 << 16];
  int taken = 0;
  while (taken < (int)(sizeof keys / sizeof keys[0]) && pthread_key_create(&keys[taken], NULL) == 0) taken++;
  ASSERT_TRUE(taken > 0 && taken < (int)(sizeof keys / sizeof keys[0]));
  sbnComm_t comm;
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  ASSERT_OK(sbnCommInitCpu(&comm, 1, &cfg));
  static float x[N * C * SP], y[N * C * SP], mean[C], invstd[C];
  for (int i = 0; i < N * C * SP; i++) x[i] = (float)(i % 7);
  const sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, N, C, SP};
  ASSERT_OK(sbnGroupStart());
  ASSERT_RES(sbnForwardTrain(comm, &d, x, y, NULL, NULL, NULL, NULL, NULL, mean, invstd, NULL, NULL),
             sbnSystemError);
  EXPECT_TRUE(strstr(sbnGetLastError(comm), "pthread_key_create") != NULL);
  for (int i = 0; i < taken; i++) pthread_key_delete(keys[i]);
  ASSERT_RES(sbnGroupEnd(), sbnInvalidUsage); /* a call of the group failed */
  /* nothing was queued or claimed: the comm is the caller's */
  ASSERT_OK(sbnForwardTrain(comm, &d, x, y, NULL, NULL, NULL, NULL, NULL, mean, invstd, NULL, NULL));
  /* the keys given back, the next group makes its key and runs (one failure does not take
     groups away from the process for good) */
  ASSERT_OK(sbnGroupStart());
  ASSERT_OK(sbnForwardTrain(comm, &d, x, y, NULL, NULL, NULL, NULL, NULL, mean, invstd, NULL, NULL));
  ASSERT_OK(sbnGroupEnd());
  ASSERT_OK(sbnCommDestroy(comm));
}

int main(void) {
  SBN_RUN(test_no_key_left);
  return sbn_test_exit();
}
