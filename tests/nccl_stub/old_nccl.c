/* old_nccl.c — a libnccl.so.2 of an NCCL older than syncbn needs (2.17: no ncclCommSplit and
 * the rest of syncbn's table), put first on the loader's path by test_nccl_load: the loader
 * must pass it over for the next candidate. */
int ncclGetVersion(int* version);
int ncclGetVersion(int* version) {
  *version = 21700;
  return 0;
}
