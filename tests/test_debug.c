/* test_debug.c — the library prints nothing unless SBN_DEBUG is set. CTest runs this
 * program three times (tests/CMakeLists.txt): without SBN_DEBUG its output must not
 * contain "syncbn"; with SBN_DEBUG=WARN it must show the failure's detail; with
 * SBN_DEBUG=INFO also what the library does. The program itself prints only when a
 * result is not the expected one, so any "syncbn" line comes from the library.
 */
#include <stdio.h>

#include "syncbn.h"

int main(void) {
  sbnComm_t comm = NULL;
  sbnResult_t r = sbnCommInitCpu(NULL, 1, NULL); /* fails: logged at WARN */
  if (r != sbnInvalidArgument) {
    fprintf(stderr, "FAILED: sbnCommInitCpu(NULL) returned %s\n", sbnGetResultName(r));
    return 1;
  }
  r = sbnCommInitCpu(&comm, 1, NULL); /* succeeds: logged at INFO */
  if (r != sbnSuccess) {
    fprintf(stderr, "FAILED: sbnCommInitCpu returned %s\n", sbnGetResultName(r));
    return 1;
  }
  sbnCommDestroy(comm);
  /* a team whose ops cost seconds (syncbn.h: SBN_MAX_CPU_TEAM_RANKS): warned at WARN */
  static sbnComm_t wide[257];
  r = sbnCommInitCpu(wide, 257, NULL);
  if (r != sbnSuccess) {
    fprintf(stderr, "FAILED: sbnCommInitCpu of 257 ranks returned %s\n", sbnGetResultName(r));
    return 1;
  }
  for (int i = 0; i < 257; i++) sbnCommDestroy(wide[i]);
  return 0;
}
