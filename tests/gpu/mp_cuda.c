/* mp_cuda.c — see mp_cuda.h. */
#include "mp_cuda.h"

#include <stdio.h>
#include <string.h>

#include "gpu_skip.h"
#include "mp_launch.h"

typedef struct {
  int count;
  char msg[240];
} probe_t;

/* Runs in the child: the only place this process family touches CUDA before mp_run. */
static int probe_main(void* out, size_t size, void* ctx) {
  (void)ctx;
  if (size != sizeof(probe_t)) return 1;
  probe_t* p = (probe_t*)out;
  /* the reason as every GPU test gives it (gpu_skip.h): asked here, where libcuda.so.1
     would be loaded, not in the parent */
  p->count = gpu_count_devices(p->msg, sizeof p->msg);
  return 0;
}

int mp_probe_devices(char* why, size_t why_size) {
  probe_t p;
  memset(&p, 0, sizeof p);
  int rc = mp_call_in_child(probe_main, NULL, &p, sizeof p, 60.0);
  if (rc != 0) {
    if (why && why_size)
      snprintf(why, why_size, "the CUDA probe process failed (%s %d)",
               rc < 0 ? "crashed or hung:" : "exit", rc);
    return 0;
  }
  if (p.count <= 0 && why && why_size) {
    p.msg[sizeof p.msg - 1] = '\0';
    snprintf(why, why_size, "%s", p.msg);
  }
  return p.count > 0 ? p.count : 0;
}

int mp_probe_device_count(void) {
  return mp_probe_devices(NULL, 0);
}
