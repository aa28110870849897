/* result.c — result names and messages (generated from SBN_RESULT_LIST). The lowest layer:
 * it uses no other file of the library (sbnGetVersion, which records a detail, is diag.c's). */
#include "internal.h"

static const char* const kResultText[sbnNumResults] = {
#define SBN_RESULT_TEXT_(name, value, text) [value] = text,
    SBN_RESULT_LIST(SBN_RESULT_TEXT_)
#undef SBN_RESULT_TEXT_
};

static const char* const kResultName[sbnNumResults] = {
#define SBN_RESULT_NAME_(name, value, text) [value] = #name,
    SBN_RESULT_LIST(SBN_RESULT_NAME_)
#undef SBN_RESULT_NAME_
};

SBN_API const char* sbnGetErrorString(sbnResult_t r) {
  if ((int)r < 0 || r >= sbnNumResults) return "unknown result code (not an sbnResult_t)";
  return kResultText[r];
}

SBN_API const char* sbnGetResultName(sbnResult_t r) {
  if ((int)r < 0 || r >= sbnNumResults) return "sbnUnknownResult";
  return kResultName[r];
}
