/* nccl.c — the NCCL loader: libnccl.so.2 loaded at run time for its version, for the header
 * and the JSON (the nccl path's own NCCL calls are the library's, through libsyncbn). */
#include <string.h>

#include "paths.h"
#include "sbn_bench_build.h" /* generated: SBN_BENCH_NCCL_LIBRARY */

void nccl_load(bench_lib_info_t* info) {
  memset(info, 0, sizeof *info);
  info->version = -1;
  /* the soname first: libsyncbn may have loaded its NCCL already, and that is the one */
  static const char* const names[2] = {"libnccl.so.2", SBN_BENCH_NCCL_LIBRARY};
  /* the library stays loaded until exit */
  void* lib = lib_open(names, info->from, sizeof info->from, info->why, sizeof info->why);
  if (!lib) return;
  info->loaded = 1;
  /* ncclResult_t ncclGetVersion(int*): ncclResult_t is an enum, returned as an int */
  int (*get_version)(int*) = NULL;
  if (lib_sym(lib, "ncclGetVersion", &get_version, sizeof get_version, info->why,
              sizeof info->why) != 0)
    return;
  int v = 0;
  int rc = get_version(&v);
  if (rc == 0)
    info->version = v;
  else
    snprintf(info->why, sizeof info->why, "ncclGetVersion returned %d", rc);
}
