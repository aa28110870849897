/* diag.c — error detail per comm / per thread, SBN_DEBUG logging (the only output), and
 * sbnGetVersion (its refusal records a detail). Uses result.c's names, never the reverse. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_level = SBN_LOG_NONE;

static void log_init(void) {
  const char* v = getenv("SBN_DEBUG");
  if (v == NULL) return;
  if (strcasecmp(v, "WARN") == 0) log_level = SBN_LOG_WARN;
  else if (strcasecmp(v, "INFO") == 0) log_level = SBN_LOG_INFO;
}

int sbn_log_level(void) {
  pthread_once(&log_once, log_init);
  return log_level;
}

static void vlog(int level, const char* fmt, va_list ap) {
  if (sbn_log_level() < level) return;
  char line[640];
  vsnprintf(line, sizeof line, fmt, ap);
  fprintf(stderr, "syncbn %s: %s\n", level == SBN_LOG_WARN ? "WARN" : "INFO", line);
}

void sbn_log(int level, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(level, fmt, ap);
  va_end(ap);
}

/* The calling thread's detail for failures without a comm; the buffer sbnGetLastError
   copies into (so the returned text cannot change under the caller until its next
   sbnGetLastError), and the one sbn_error_text copies into for the library's own reads
   (which must not change the caller's). */
static _Thread_local char thread_error[512];
static _Thread_local char thread_copy[512];
static _Thread_local char thread_internal[512];

void sbn_note(sbnComm_t comm, const char* msg) {
  char copy[512]; /* msg may be the buffer sbn_error_text returned */
  snprintf(copy, sizeof copy, "%s", msg);
  if (sbn_comm_valid(comm)) {
    pthread_mutex_lock(&comm->err_mu);
    memcpy(comm->last_error, copy, sizeof copy);
    pthread_mutex_unlock(&comm->err_mu);
  } else {
    memcpy(thread_error, copy, sizeof copy);
  }
}

sbnResult_t sbn_fail(sbnComm_t comm, sbnResult_t r, const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  sbn_note(comm, msg);
  sbn_log(SBN_LOG_WARN, "%s: %s", sbnGetResultName(r), msg);
  return r;
}

static const char* error_into(sbnComm_t comm, char out[512]) {
  if (comm == NULL) {
    memcpy(out, thread_error, sizeof thread_error);
  } else if (comm->magic != SBN_COMM_MAGIC) {
    snprintf(out, sizeof thread_error, "not a valid sbnComm_t");
  } else {
    pthread_mutex_lock(&comm->err_mu);
    memcpy(out, comm->last_error, sizeof thread_error);
    pthread_mutex_unlock(&comm->err_mu);
  }
  return out;
}

SBN_API const char* sbnGetLastError(sbnComm_t comm) { return error_into(comm, thread_copy); }

const char* sbn_error_text(sbnComm_t comm) { return error_into(comm, thread_internal); }

SBN_API sbnResult_t sbnGetVersion(int* version) {
  if (version == NULL) return sbn_fail(NULL, sbnInvalidArgument, "sbnGetVersion: version is NULL");
  *version = SBN_VERSION_CODE;
  return sbnSuccess;
}
