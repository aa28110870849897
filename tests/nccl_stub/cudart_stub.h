/* cudart_stub.h — what the stand-in CUDA runtime (cudart_stub.c) offers its tests beyond
 * CUDA's own API. */
#ifndef SYNCBN_TESTS_CUDART_STUB_H_
#define SYNCBN_TESTS_CUDART_STUB_H_

#include <stddef.h>

/* The live device allocations (cudaMalloc) of exactly `bytes` bytes, in no particular
   order: up to `max` of them into out[], their device into dev[] (may be NULL). Returns
   how many there are. */
size_t cudart_stub_find(size_t bytes, void** out, int* dev, size_t max);

#endif /* SYNCBN_TESTS_CUDART_STUB_H_ */
