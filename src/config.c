/* config.c — sbnConfig_t checks, defaults and the SBN_TIMEOUT_MS override. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>

#include "internal.h"

#define SBN_MAX_CHANNELS_LIMIT (1 << 20)
/* an op's signature holds C in SBN_SIG_C_BITS bits (kernels/bn_op.h) */
_Static_assert(SBN_MAX_CHANNELS_LIMIT < (1 << SBN_SIG_C_BITS), "C must fit the op signature");
/* Longer timeouts mean "forever" and are clamped to ~100 years, so that deadlines in
   nanoseconds (CPU: CLOCK_MONOTONIC; GPU: %globaltimer) cannot overflow. */
#define SBN_MAX_TIMEOUT_MS ((int64_t)100 * 365 * 24 * 3600 * 1000)

int sbn_env_int(const char* v, long long lo, long long hi, long long* out) {
  if (v == NULL || v[0] < '0' || v[0] > '9') return 0;
  char* end = NULL;
  errno = 0;
  const long long x = strtoll(v, &end, 10);
  if (errno != 0 || *end != '\0' || x < lo || x > hi) return 0;
  *out = x;
  return 1;
}

sbnResult_t sbn_config_resolve(const char* fn, const sbnConfig_t* in, sbn_cfg_t* out) {
  sbn_cfg_t cfg = {SBN_DEFAULT_TIMEOUT_MS, SBN_DEFAULT_MAX_CHANNELS};
  if (in != NULL) {
    if (in->size != sizeof(sbnConfig_t) || in->magic != SBN_CONFIG_MAGIC ||
        in->version != SBN_CONFIG_VERSION)
      return sbn_fail(NULL, sbnInvalidArgument,
                      "%s: config was not initialized with SBN_CONFIG_INITIALIZER "
                      "(size %zu, magic 0x%x, version %u)",
                      fn, in->size, in->magic, in->version);
    if (in->timeout_ms <= 0)
      return sbn_fail(NULL, sbnInvalidArgument, "%s: config.timeout_ms must be > 0, got %lld", fn,
                      (long long)in->timeout_ms);
    if (in->max_channels < 1 || in->max_channels > SBN_MAX_CHANNELS_LIMIT)
      return sbn_fail(NULL, sbnInvalidArgument,
                      "%s: config.max_channels must be in [1, %d], got %lld", fn,
                      SBN_MAX_CHANNELS_LIMIT, (long long)in->max_channels);
    cfg.timeout_ms = in->timeout_ms;
    cfg.max_channels = in->max_channels;
  }
  const char* env = getenv("SBN_TIMEOUT_MS");
  if (env != NULL && env[0] != '\0') { /* empty: as unset, as the other SBN_ variables */
    long long v = 0;
    if (!sbn_env_int(env, 1, LLONG_MAX, &v))
      return sbn_fail(
          NULL, sbnInvalidArgument,
          "%s: SBN_TIMEOUT_MS='%s' is not a positive integer (milliseconds; digits only)", fn, env);
    cfg.timeout_ms = v;
    sbn_log(SBN_LOG_INFO, "timeout %lld ms from SBN_TIMEOUT_MS", v);
  }
  if (cfg.timeout_ms > SBN_MAX_TIMEOUT_MS) cfg.timeout_ms = SBN_MAX_TIMEOUT_MS;
  *out = cfg;
  return sbnSuccess;
}
