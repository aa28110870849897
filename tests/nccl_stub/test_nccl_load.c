/* test_nccl_load.c — how libsyncbn finds NCCL (src/gpu/nccl_api.c), on the library's objects
 * without a GPU: a failed load is not remembered (a later call, after the program made NCCL
 * loadable, succeeds), and a candidate that opens but is too old (an NCCL 2.17
 * libnccl.so.2 first on LD_LIBRARY_PATH, set by CTest) is passed over for the next one, the
 * NCCL CMake found at build time. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "gpu/nccl_api.h"
#include "harness.h"

static void test_failure_not_kept(void) {
  const char* why = NULL;
  setenv("SBN_NCCL_LIBRARY", "/nonexistent/syncbn-test/libnccl.so.2", 1);
  ASSERT_RES(sbn_nccl_load(&why), sbnUnsupported);
  printf("  with a missing SBN_NCCL_LIBRARY: %s\n", why);
  ASSERT_TRUE(strstr(why, "/nonexistent/syncbn-test/libnccl.so.2") != NULL);
  unsetenv("SBN_NCCL_LIBRARY");
  /* the default search now: the old NCCL first (LD_LIBRARY_PATH), then the build's */
  ASSERT_OK(sbn_nccl_load(&why));
  int version = 0;
  ASSERT_TRUE(sbn_nccl.GetVersion(&version) == ncclSuccess);
  printf("  loaded NCCL %d (the build's, not the 2.17 first on the path)\n", version);
  ASSERT_TRUE(version >= 21800);
  ASSERT_TRUE(sbn_nccl.CommSplit != NULL);
  ASSERT_OK(sbn_nccl_load(&why)); /* kept */
}

int main(void) {
  SBN_RUN(test_failure_not_kept);
  return sbn_test_exit();
}
