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

/* Tries each candidate in turn: SBN_NCCL_LIBRARY alone where it is set; else the NCCL the
   program has already loaded (libnccl.so.2 with RTLD_NOLOAD: a framework's, which syncbn
   must share), then the one CMake found at build time (whose headers syncbn was compiled
   with: the device API's inline code reads that NCCL's structures), then whatever
   libnccl.so.2 the loader finds. One that does not open, or lacks a required symbol (an
   NCCL older than 2.18), is passed over for the next. Under load_lock. */
static sbnResult_t load(void) {
  const char* env = getenv("SBN_NCCL_LIBRARY");
  struct {
    const char* name;
    int flags;
  } cands[3];
  int n = 0;
  if (env != NULL && env[0] != '\0') {
    cands[n].name = env, cands[n++].flags = RTLD_NOW | RTLD_LOCAL;
  } else {
    cands[n].name = "libnccl.so.2", cands[n++].flags = RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD;
    cands[n].name = SBN_NCCL_LIBRARY_PATH, cands[n++].flags = RTLD_NOW | RTLD_LOCAL;
    cands[n].name = "libnccl.so.2", cands[n++].flags = RTLD_NOW | RTLD_LOCAL;
  }
  char tried[768] = "";
  for (int i = 0; i < n; i++) {
    const size_t len = strlen(tried);
    void* lib = dlopen(cands[i].name, cands[i].flags);
    if (lib == NULL) {
      const char* e = dlerror();
      if (!(cands[i].flags & RTLD_NOLOAD)) /* not loaded yet: no failure */
        snprintf(tried + len, sizeof tried - len, "%s%s", len ? "; " : "",
                 e != NULL ? e : cands[i].name);
      continue;
    }
    sbn_nccl_api_t api;
    const char* missing = fill(lib, &api);
    if (missing != NULL) {
      snprintf(tried + len, sizeof tried - len,
               "%s%s%s lacks %s (syncbn needs NCCL 2.18 or newer)", len ? "; " : "",
               cands[i].name, (cands[i].flags & RTLD_NOLOAD) ? " (loaded by the program)" : "",
               missing);
      dlclose(lib);
      continue;
    }
    sbn_nccl = api;
    __atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
    int version = 0;
    api.GetVersion(&version);
    sbn_log(SBN_LOG_INFO, "NCCL %d.%d.%d loaded from %s%s", version / 10000, version / 100 % 100,
            version % 100, cands[i].name,
            (cands[i].flags & RTLD_NOLOAD) ? " (already loaded by the program)"
                                           : ""); /* the library stays loaded until exit */
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
