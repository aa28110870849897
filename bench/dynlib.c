/* dynlib.c — dlopen and dlsym for the libraries sbn-bench loads at run time (cuDNN, NCCL):
 * it links neither, so it runs where they are absent and says so. */
#include <dlfcn.h>
#include <string.h>

#include "paths.h"

void* lib_open(const char* const names[2], char* from, size_t fcap, char* why, size_t wcap) {
  why[0] = '\0';
  for (int i = 0; i < 2; i++) {
    if (!names[i][0] || (i == 1 && strcmp(names[1], names[0]) == 0)) continue;
    void* h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) {
      snprintf(from, fcap, "%s", names[i]);
      why[0] = '\0';
      return h;
    }
    const char* e = dlerror();
    size_t len = strlen(why);
    if (len + 3 < wcap)
      snprintf(why + len, wcap - len, "%s%s", len ? "; " : "", e ? e : "dlopen failed");
  }
  return NULL;
}

/* dlsym into a function pointer `fn` of fn_size bytes (POSIX: the object pointer dlsym
   returns converts to the function's pointer). 0, or -1 with why set. */
int lib_sym(void* lib, const char* name, void* fn, size_t fn_size, char* why, size_t wcap) {
  (void)dlerror();
  void* p = dlsym(lib, name);
  if (!p || fn_size != sizeof p) {
    const char* e = dlerror();
    snprintf(why, wcap, "dlsym(%s): %s", name, e ? e : "not found");
    return -1;
  }
  memcpy(fn, &p, sizeof p);
  return 0;
}
