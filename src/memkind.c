/* memkind.c — whether a pointer is host or device memory (CUDA builds ask the runtime;
 * other builds only have host memory). */
#include "internal.h"

#ifdef SYNCBN_HAVE_CUDA
#include <cuda_runtime_api.h>

sbn_mem_kind_t sbn_pointer_kind(const void* p) {
  struct cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError(); /* no driver / no GPU: it is host memory */
    return SBN_MEM_HOST;
  }
  return (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged)
             ? SBN_MEM_DEVICE
             : SBN_MEM_HOST;
}
#else
sbn_mem_kind_t sbn_pointer_kind(const void* p) {
  (void)p;
  return SBN_MEM_HOST;
}
#endif
