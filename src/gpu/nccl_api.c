/* nccl_api.c — loads NCCL at its first use and fills the table every NCCL call goes
 * through (nccl_api.h says why). */
#if SYNCBN_HAVE_NCCL

#include "gpu/nccl_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sbn_nccl_api_t sbn_nccl;

/* Loaded once: a success is kept for the process; a failure is not (a later call tries
   again: the program may have loaded NCCL since, e.g. a framework after sbnCommInitAll). */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded; /* under load_lock, or read with acquire after it was set */
static _Thread_local char load_why[1024];

/* dlsym of "nccl<name>" into *fn (POSIX: the object pointer converts to a function's). */
static int load_symbol(void* lib, const char* name, void* fn, size_t fn_size) {
  char full[64];
  snprintf(full, sizeof full, "nccl%s", name);
  void* p = dlsym(lib, full);
  if (p == NULL || fn_size != sizeof p) return 0;
  memcpy(fn, &p, sizeof p);
  return 1;
}

/* Every required symbol of lib into *api: NULL, or the first one missing. */
static const char* fill(void* lib, sbn_nccl_api_t* api) {
  memset(api, 0, sizeof *api);
#define SBN_NCCL_REQUIRE_(name) \
  if (!load_symbol(lib, #name, &api->name, sizeof api->name)) return "nccl" #name;
  SBN_NCCL_CORE_FUNCTIONS(SBN_NCCL_REQUIRE_)
#undef SBN_NCCL_REQUIRE_
  /* an older NCCL lacks these: its teams take the host path */
#define SBN_NCCL_OPTIONAL_(name) load_symbol(lib, #name, &api->name, sizeof api->name);
  SBN_NCCL_DEVICE_FUNCTIONS(SBN_NCCL_OPTIONAL_)
#undef SBN_NCCL_OPTIONAL_
  load_symbol(lib, "TeamLsa", &api->TeamLsa, sizeof api->TeamLsa);
  return NULL;
}

/* Tries each candidate in turn: one that does not open, or lacks a required symbol (an
   NCCL older than 2.18 first on the loader's path), is passed over for the next. Under
   load_lock. */
static sbnResult_t load(void) {
  const char* env = getenv("SBN_NCCL_LIBRARY");
  const char* names[2] = {NULL, NULL};
  if (env != NULL && env[0] != '\0') {
    names[0] = env;
  } else {
    names[0] = "libnccl.so.2";        /* the NCCL the program already loaded is this one */
    names[1] = SBN_NCCL_LIBRARY_PATH; /* src/CMakeLists.txt: the one found at build time */
  }
  char tried[768] = "";
  for (int i = 0; i < 2 && names[i] != NULL; i++) {
    const size_t len = strlen(tried);
    void* lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
      const char* e = dlerror();
      snprintf(tried + len, sizeof tried - len, "%s%s", len ? "; " : "", e != NULL ? e : names[i]);
      continue;
    }
    sbn_nccl_api_t api;
    const char* missing = fill(lib, &api);
    if (missing != NULL) {
      snprintf(tried + len, sizeof tried - len,
               "%s%s lacks %s (syncbn needs NCCL 2.18 or newer)", len ? "; " : "", names[i],
               missing);
      dlclose(lib);
      continue;
    }
    sbn_nccl = api;
    __atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
    int version = 0;
    api.GetVersion(&version);
    sbn_log(SBN_LOG_INFO, "NCCL %d.%d.%d loaded from %s", version / 10000, version / 100 % 100,
            version % 100, names[i]); /* the library stays loaded until exit */
    return sbnSuccess;
  }
  snprintf(load_why, sizeof load_why,
           "NCCL could not be loaded (%s%s): install NCCL 2.18 or newer where the loader finds "
           "libnccl.so.2, or set SBN_NCCL_LIBRARY to its path",
           env != NULL && env[0] != '\0' ? "SBN_NCCL_LIBRARY: " : "", tried);
  return sbnUnsupported;
}

sbnResult_t sbn_nccl_load(const char** why) {
  *why = "";
  if (__atomic_load_n(&loaded, __ATOMIC_ACQUIRE)) return sbnSuccess;
  pthread_mutex_lock(&load_lock);
  sbnResult_t r = __atomic_load_n(&loaded, __ATOMIC_ACQUIRE) ? sbnSuccess : load();
  pthread_mutex_unlock(&load_lock);
  *why = load_why;
  return r;
}

#endif
