/* test_nccl_missing.c — a CUDA + NCCL build of libsyncbn on a machine where NCCL cannot be
 * loaded: the program starts (no NEEDED libnccl), and sbnCommInitNccl returns
 * sbnUnsupported, writes no comm, and says what was searched (here SBN_NCCL_LIBRARY, set
 * to a file that does not exist, which replaces the default search). The comm passed is
 * never looked at: NCCL is loaded before the comm is used. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "harness.h"

#define MISSING "/nonexistent/syncbn-test/libnccl.so.2"

static void test_init_nccl_without_nccl(void) {
  static char fake_nccl_storage[64]; /* not an NCCL comm: must not be used */
  struct ncclComm* fake = (struct ncclComm*)(void*)fake_nccl_storage;
  for (int attempt = 0; attempt < 2; attempt++) { /* loaded once: the same answer again */
    sbnComm_t comm = (sbnComm_t)(void*)fake_nccl_storage;
    ASSERT_RES(sbnCommInitNccl(&comm, fake, NULL), sbnUnsupported);
    ASSERT_TRUE(comm == (sbnComm_t)(void*)fake_nccl_storage); /* not written */
    const char* why = sbnGetLastError(NULL);
    printf("  %s\n", why);
    ASSERT_TRUE(strstr(why, MISSING) != NULL);
    ASSERT_TRUE(strstr(why, "SBN_NCCL_LIBRARY") != NULL);
  }
}

int main(void) {
  setenv("SBN_NCCL_LIBRARY", MISSING, 1);
  SBN_RUN(test_init_nccl_without_nccl);
  return sbn_test_exit();
}
