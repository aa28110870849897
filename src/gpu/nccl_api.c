/* nccl_api.c — loads NCCL at its first use and fills the table every NCCL call goes
 * through (nccl_api.h says why). */
#if SYNCBN_HAVE_NCCL

#include "gpu/nccl_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sbn_nccl_api_t sbn_nccl;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static sbnResult_t load_result;
static char load_why[1024];

/* dlsym of "nccl<name>" into *fn (POSIX: the object pointer converts to a function's). */
static int load_symbol(void* lib, const char* name, void* fn, size_t fn_size) {
  char full[64];
  snprintf(full, sizeof full, "nccl%s", name);
  void* p = dlsym(lib, full);
  if (p == NULL || fn_size != sizeof p) return 0;
  memcpy(fn, &p, sizeof p);
  return 1;
}

static void load(void) {
  const char* env = getenv("SBN_NCCL_LIBRARY");
  const char* names[2] = {NULL, NULL};
  if (env != NULL && env[0] != '\0') {
    names[0] = env;
  } else {
    names[0] = "libnccl.so.2";        /* the NCCL the program already loaded is this one */
    names[1] = SBN_NCCL_LIBRARY_PATH; /* src/CMakeLists.txt: the one found at build time */
  }
  char tried[768] = "";
  void* lib = NULL;
  const char* from = NULL;
  for (int i = 0; i < 2 && names[i] != NULL && lib == NULL; i++) {
    lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (lib != NULL) {
      from = names[i];
    } else {
      const char* e = dlerror();
      size_t len = strlen(tried);
      snprintf(tried + len, sizeof tried - len, "%s%s", len ? "; " : "", e != NULL ? e : names[i]);
    }
  }
  if (lib == NULL) {
    load_result = sbnUnsupported;
    snprintf(load_why, sizeof load_why,
             "NCCL could not be loaded (%s%s): install NCCL where the loader finds "
             "libnccl.so.2, or set SBN_NCCL_LIBRARY to its path",
             env != NULL && env[0] != '\0' ? "SBN_NCCL_LIBRARY: " : "", tried);
    return;
  }
  sbn_nccl_api_t api;
  memset(&api, 0, sizeof api);
#define SBN_NCCL_REQUIRE_(name)                                                              \
  if (!load_symbol(lib, #name, &api.name, sizeof api.name)) {                                \
    load_result = sbnUnsupported;                                                            \
    snprintf(load_why, sizeof load_why,                                                      \
             "the NCCL loaded from %s lacks nccl" #name ": syncbn needs NCCL 2.18 or newer", \
             from);                                                                          \
    dlclose(lib);                                                                            \
    return;                                                                                  \
  }
  SBN_NCCL_CORE_FUNCTIONS(SBN_NCCL_REQUIRE_)
#undef SBN_NCCL_REQUIRE_
  /* an older NCCL lacks these: its teams take the host path */
#define SBN_NCCL_OPTIONAL_(name) load_symbol(lib, #name, &api.name, sizeof api.name);
  SBN_NCCL_DEVICE_FUNCTIONS(SBN_NCCL_OPTIONAL_)
#undef SBN_NCCL_OPTIONAL_
  load_symbol(lib, "TeamLsa", &api.TeamLsa, sizeof api.TeamLsa);
  sbn_nccl = api;
  load_result = sbnSuccess;
  int version = 0;
  api.GetVersion(&version);
  sbn_log(SBN_LOG_INFO, "NCCL %d.%d.%d loaded from %s", version / 10000, version / 100 % 100,
          version % 100, from); /* the library stays loaded until exit */
}

sbnResult_t sbn_nccl_load(const char** why) {
  pthread_once(&load_once, load);
  *why = load_why;
  return load_result;
}

#endif
