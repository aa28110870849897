/* test_nccl_load.c — how libsyncbn finds NCCL (src/gpu/nccl_api.c), on the library's objects
 * without a GPU. One scenario per process (a load that succeeded is kept), named by argv[1]:
 * - (none): a failed load is not remembered (a later call, after the program made NCCL
 *   loadable, succeeds), an NCCL 2.17 (SBN_NCCL_LIBRARY=libnccl.so.2, which the loader finds
 *   first on LD_LIBRARY_PATH, set by CTest) is refused for the function it lacks, and is not
 *   taken by the default search either: the NCCL CMake found at build time is; a success
 *   is kept (SBN_NCCL_LIBRARY is not read again);
 * - loader: a usable NCCL first on LD_LIBRARY_PATH (the stand-in, tests/nccl_stub) that the
 *   program has not loaded is not taken either: the build's NCCL is, whose headers syncbn
 *   was compiled with;
 * - preloaded: the NCCL the program has already loaded (the stand-in, opened by this test
 *   first) is the one syncbn takes, not the build's: the process shares one NCCL. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include "gpu/nccl_api.h"
#include "harness.h"

/* The file that defines fn, resolved (symlinks followed) into out; 0 where unknown. */
static int file_of(const void* fn, char out[PATH_MAX]) {
  Dl_info info;
  return dladdr(fn, &info) && info.dli_fname != NULL && realpath(info.dli_fname, out) != NULL;
}

/* Whether the table's NCCL is the file at path (symlinks followed). */
static int loaded_from(const char* path) {
  char a[PATH_MAX], b[PATH_MAX];
  void* fn;
  memcpy(&fn, &sbn_nccl.GetVersion, sizeof fn);
  if (!file_of(fn, a) || realpath(path, b) == NULL) return 0;
  printf("  NCCL loaded from %s\n", a);
  return strcmp(a, b) == 0;
}

static void test_failure_not_kept(void) {
  const char* why = NULL;
  setenv("SBN_NCCL_LIBRARY", "/nonexistent/syncbn-test/libnccl.so.2", 1);
  ASSERT_RES(sbn_nccl_load(&why), sbnUnsupported);
  printf("  with a missing SBN_NCCL_LIBRARY: %s\n", why);
  ASSERT_TRUE(strstr(why, "/nonexistent/syncbn-test/libnccl.so.2") != NULL);
  /* one that opens but lacks syncbn's functions (old_nccl.c: ncclGetVersion alone) */
  setenv("SBN_NCCL_LIBRARY", "libnccl.so.2", 1);
  ASSERT_RES(sbn_nccl_load(&why), sbnUnsupported);
  printf("  with SBN_NCCL_LIBRARY an NCCL 2.17: %s\n", why);
  ASSERT_TRUE(strstr(why, "lacks ncclGetErrorString") != NULL);
  unsetenv("SBN_NCCL_LIBRARY");
  /* the default search now: nothing loaded yet, so the build's NCCL before the old one on
     the path */
  ASSERT_OK(sbn_nccl_load(&why));
  int version = 0;
  ASSERT_TRUE(sbn_nccl.GetVersion(&version) == ncclSuccess);
  printf("  loaded NCCL %d (the build's, not the 2.17 first on the path)\n", version);
  ASSERT_TRUE(version >= 21800);
  ASSERT_TRUE(sbn_nccl.CommSplit != NULL);
  ASSERT_TRUE(loaded_from(SBN_NCCL_LIBRARY_PATH));
  setenv("SBN_NCCL_LIBRARY", "/nonexistent/syncbn-test/libnccl.so.2", 1);
  ASSERT_OK(sbn_nccl_load(&why)); /* kept: nothing is searched again */
  unsetenv("SBN_NCCL_LIBRARY");
  ASSERT_TRUE(loaded_from(SBN_NCCL_LIBRARY_PATH));
}

static void test_build_before_loader(void) {
  const char* why = NULL;
  ASSERT_OK(sbn_nccl_load(&why));
  ASSERT_TRUE(loaded_from(SBN_NCCL_LIBRARY_PATH));
}

static void test_program_first(void) {
  void* mine = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL); /* the stand-in: LD_LIBRARY_PATH */
  ASSERT_TRUE(mine != NULL);
  char path[PATH_MAX];
  void* fn = dlsym(mine, "ncclGetVersion");
  ASSERT_TRUE(fn != NULL && file_of(fn, path));
  char build[PATH_MAX];
  ASSERT_TRUE(realpath(SBN_NCCL_LIBRARY_PATH, build) != NULL);
  ASSERT_TRUE(strcmp(path, build) != 0); /* the scenario: two NCCLs to choose from */
  const char* why = NULL;
  ASSERT_OK(sbn_nccl_load(&why));
  ASSERT_TRUE(loaded_from(path));
}

int main(int argc, char** argv) {
  const char* scenario = argc > 1 ? argv[1] : "";
  if (strcmp(scenario, "") == 0) {
    SBN_RUN(test_failure_not_kept);
  } else if (strcmp(scenario, "loader") == 0) {
    SBN_RUN(test_build_before_loader);
  } else if (strcmp(scenario, "preloaded") == 0) {
    SBN_RUN(test_program_first);
  } else {
    fprintf(stderr, "test_nccl_load: unknown scenario '%s' (loader, preloaded or none)\n", scenario);
    return 2;
  }
  return sbn_test_exit();
}
