/* ops.c — the public op entry points: argument checks (before anything is written or
 * queued), the backend's own checks (its table's prepare), then either queueing in the
 * open group or running at once (both group.c's: ops.c uses group.c, never the reverse). */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "front.h"
#include "gpu/gpu.h"
#include "internal.h"

/* Largest per-rank element count accepted: keeps every index computation in int64 and
   every count exact in the merge tree. */
#define SBN_MAX_NUMEL ((int64_t)1 << 48)

static sbnResult_t check_desc(sbnComm_t comm, const char* fn, const sbnTensorDesc_t* d) {
  if (d == NULL) return sbn_fail(comm, sbnInvalidArgument, "%s: desc is NULL", fn);
  if (!sbn_dtype_valid((int)d->dtype))
    return sbn_fail(comm, sbnInvalidArgument, "%s: unknown dtype %d", fn, (int)d->dtype);
  if (d->layout != sbnLayoutNCHW && d->layout != sbnLayoutNHWC)
    return sbn_fail(comm, sbnInvalidArgument, "%s: unknown layout %d", fn, (int)d->layout);
  if (d->n < 0 || d->c < 1 || d->spatial < 1)
    return sbn_fail(comm, sbnInvalidArgument,
                    "%s: need n >= 0, c >= 1, spatial >= 1; got n=%lld c=%lld spatial=%lld", fn,
                    (long long)d->n, (long long)d->c, (long long)d->spatial);
  if (d->c > SBN_MAX_NUMEL || d->spatial > SBN_MAX_NUMEL / d->c ||
      (d->n > 0 && d->n > SBN_MAX_NUMEL / (d->c * d->spatial)))
    return sbn_fail(comm, sbnInvalidArgument, "%s: n*c*spatial exceeds 2^48 elements", fn);
  return sbnSuccess;
}

static sbnResult_t check_params(sbnComm_t comm, const char* fn, const sbnParams_t* p) {
  if (!(p->eps >= 0.0f) || isinf(p->eps))
    return sbn_fail(comm, sbnInvalidArgument, "%s: eps must be finite and >= 0, got %g", fn,
                    (double)p->eps);
  if (isnan(p->momentum) || isinf(p->momentum))
    return sbn_fail(comm, sbnInvalidArgument, "%s: momentum must be finite, got %g", fn,
                    (double)p->momentum);
  if (p->grad_mode != sbnGradLocal && p->grad_mode != sbnGradGlobal)
    return sbn_fail(comm, sbnInvalidArgument, "%s: unknown grad_mode %d", fn, (int)p->grad_mode);
  return sbnSuccess;
}

/* The entry point's name, for messages. */
static const char* op_fn(const sbn_op_t* op, int ex) {
  if (!ex) return sbn_op_name(op->kind);
  if (op->kind == SBN_OP_FORWARD) return "sbnForwardTrainEx";
  return ex == 2 ? "sbnBackwardInPlaceEx" : "sbnBackwardEx";
}

/* The first sbnEpilogue_t's size (size, activation, slope): a caller built against that
   header passes it, and the fields added since are 0 for it. */
#define SBN_EPILOGUE_FIRST_SIZE (offsetof(sbnEpilogue_t, slope) + sizeof(float))
_Static_assert(SBN_EPILOGUE_FIRST_SIZE == 16 && sizeof(sbnEpilogue_t) == 24,
               "sbnEpilogue_t: fields are only ever added at its end, without padding");

/* The epilogue's activation, slope and no_residual (NULL: SBN_EPILOGUE_INITIALIZER's); z:
   the op's residual (a forward's; NULL in a backward), which no_residual = 1 refuses. */
static sbnResult_t read_epilogue(sbnComm_t comm, const char* fn, const sbnEpilogue_t* e, const void* z,
                                 int* act, float* slope, int* no_residual) {
  *act = sbnActivationIdentity;
  *slope = 0.01f;
  *no_residual = 0;
  if (e == NULL) return sbnSuccess;
  if (e->size != SBN_EPILOGUE_FIRST_SIZE && e->size < sizeof(sbnEpilogue_t))
    return sbn_fail(comm, sbnInvalidArgument,
                    "%s: epilogue->size is %zu, neither %zu (the first sbnEpilogue_t) nor at least "
                    "sizeof(sbnEpilogue_t) = %zu (SBN_EPILOGUE_INITIALIZER fills it)", fn, e->size,
                    (size_t)SBN_EPILOGUE_FIRST_SIZE, sizeof(sbnEpilogue_t));
  if (e->size > SBN_EPILOGUE_MAX_SIZE)
    return sbn_fail(comm, sbnInvalidArgument,
                    "%s: epilogue->size is %zu, more than any sbnEpilogue_t's (%d bytes at most: "
                    "SBN_EPILOGUE_INITIALIZER fills it)", fn, e->size, SBN_EPILOGUE_MAX_SIZE);
  /* A caller built against a later header, whose sbnEpilogue_t has fields this library
     does not know: they are off (0, their default) or the caller asks for what this
     library cannot do, which it refuses rather than ignore. */
  for (size_t i = sizeof(sbnEpilogue_t); i < e->size; i++)
    if (((const unsigned char*)e)[i] != 0)
      return sbn_fail(comm, sbnUnsupported,
                      "%s: epilogue->size is %zu and byte %zu is not 0: a field this library "
                      "(sbnEpilogue_t of %zu bytes) does not know is set", fn, e->size, i,
                      sizeof(sbnEpilogue_t));
  if (e->activation != sbnActivationIdentity && e->activation != sbnActivationRelu &&
      e->activation != sbnActivationLeakyRelu)
    return sbn_fail(comm, sbnInvalidArgument, "%s: unknown activation %d", fn, (int)e->activation);
  if (e->activation == sbnActivationLeakyRelu && !(e->slope >= 0.0f && !isinf(e->slope)))
    return sbn_fail(comm, sbnInvalidArgument,
                    "%s: leaky ReLU's slope must be finite and >= 0, got %g", fn, (double)e->slope);
  if (e->size >= sizeof(sbnEpilogue_t)) {
    if (e->no_residual != 0 && e->no_residual != 1)
      return sbn_fail(comm, sbnInvalidArgument, "%s: epilogue->no_residual must be 0 or 1, got %d", fn,
                      e->no_residual);
    if (e->reserved != 0)
      return sbn_fail(comm, sbnInvalidArgument, "%s: epilogue->reserved must be 0, got %d", fn, e->reserved);
    if (e->no_residual && z != NULL)
      return sbn_fail(comm, sbnInvalidArgument,
                      "%s: epilogue->no_residual is 1 and z is given (no_residual says there is no z)", fn);
    *no_residual = e->no_residual;
  }
  *act = (int)e->activation;
  *slope = e->slope;
  return sbnSuccess;
}

/* A buffer of an op, for the aliasing rules: its name, address and bytes (0: none on this
   rank: NULL, or a tensor of n == 0, whose pointers no rank checks). */
typedef struct {
  const char* name;
  const void* p;
  size_t bytes;
} span_t;

/* The whole-buffer aliases the API allows: the first is written, the second read (or
   written too, for dx and dz), each the same memory as the other, start and size. */
static const char* const kAliases[][2] = {
    {"y", "x"}, {"y", "z"},                  /* the forward in place (and inference) */
    {"dx", "dy"}, {"dx", "x"}, {"dx", "y"}, /* the backward's dx over any tensor it reads */
    {"dz", "dy"}, {"dz", "x"}, {"dz", "y"}};

static int alias_allowed(const span_t* out, const span_t* other) {
  if (out->p != other->p || out->bytes != other->bytes) return 0;
  for (size_t i = 0; i < sizeof kAliases / sizeof kAliases[0]; i++)
    if (strcmp(out->name, kAliases[i][0]) == 0 && strcmp(other->name, kAliases[i][1]) == 0) return 1;
  return 0;
}

/* Every buffer the op writes (outs, in the order given) shares no byte with the op's other
   buffers (ins, and the outs before it) but for the aliases above: a written buffer over
   one the op reads later would give wrong results, over another output one would be lost;
   a partial overlap is refused even between buffers that may be the same memory (the
   library reads and writes in runs, in no order the caller can count on). `what` names
   the op in the message ("forward", "backward"). */
static sbnResult_t check_aliases(sbnComm_t comm, const char* fn, const char* what, const span_t* outs, int nout,
                                 const span_t* ins, int nin) {
  for (int o = 0; o < nout; o++) {
    const span_t* a = &outs[o];
    if (a->p == NULL || a->bytes == 0) continue;
    const uintptr_t a0 = (uintptr_t)a->p;
    for (int k = 0; k < o + nin; k++) {
      const int is_out = k < o;
      const span_t* b = is_out ? &outs[k] : &ins[k - o];
      if (b->p == NULL || b->bytes == 0) continue;
      const uintptr_t b0 = (uintptr_t)b->p;
      if (!(a0 < b0 + b->bytes && b0 < a0 + a->bytes) || alias_allowed(a, b)) continue;
      if (a0 != b0)
        return sbn_fail(comm, sbnInvalidArgument,
                        "%s: %s and %s overlap: %s starts %llu bytes into %s (buffers the op writes may "
                        "be the same memory as another only where the API allows it, and then whole)",
                        fn, a->name, b->name, a0 > b0 ? a->name : b->name,
                        (unsigned long long)(a0 > b0 ? a0 - b0 : b0 - a0), a0 > b0 ? b->name : a->name);
      /* (of different sizes: a per-channel array at a tensor's address) */
      const char* same = a->bytes == b->bytes ? "are the same memory" : "start at the same address";
      return sbn_fail(comm, sbnInvalidArgument,
                      is_out
                          ? "%s: %s and %s %s: one would be lost"
                          : "%s: %s and %s %s: the %s reads the second after it writes the first",
                      fn, a->name, b->name, same, what);
    }
  }
  return sbnSuccess;
}

/* The bytes of a rank's tensor per desc (0 with n == 0), and of a per-channel array. */
static size_t tensor_bytes(const sbnTensorDesc_t* d) {
  return (size_t)(d->n * d->c * d->spatial) * (size_t)sbn_dtype_size((int)d->dtype);
}
static size_t chan_bytes(const sbnTensorDesc_t* d) { return (size_t)d->c * sizeof(float); }

static sbnResult_t check_op(const sbn_op_t* op, int ex) {
  sbnComm_t comm = op->comm;
  const char* fn = op->fn; /* (submit's, set first) */
  sbnResult_t r = check_desc(comm, fn, &op->desc);
  if (r != sbnSuccess) return r;
  r = check_params(comm, fn, &op->params);
  if (r != sbnSuccess) return r;
  const sbnTensorDesc_t* d = &op->desc;
  if (d->c > comm->team->cfg.max_channels)
    return sbn_fail(comm, sbnInvalidArgument,
                    "%s: c=%lld exceeds the comm's max_channels=%lld (sbnConfig_t.max_channels)",
                    fn, (long long)d->c, (long long)comm->team->cfg.max_channels);
  int has_data = d->n > 0;
  const size_t tensor = tensor_bytes(d), chan = chan_bytes(d);
  if (op->kind == SBN_OP_FORWARD) {
    if (has_data && (op->x == NULL || op->out == NULL))
      return sbn_fail(comm, sbnInvalidArgument, "%s: x and y must be non-NULL when n > 0", fn);
    if ((op->weight == NULL) != (op->bias == NULL))
      return sbn_fail(comm, sbnInvalidArgument,
                      "%s: weight and bias must both be set (affine) or both NULL", fn);
    if ((op->running_mean == NULL) != (op->running_var == NULL))
      return sbn_fail(comm, sbnInvalidArgument,
                      "%s: running_mean and running_var must both be set or both NULL", fn);
    if (op->params.momentum < 0.0f && op->num_batches_tracked == NULL)
      return sbn_fail(comm, sbnInvalidArgument,
                      "%s: momentum < 0 (cumulative average) needs num_batches_tracked", fn);
    if (op->save_mean == NULL || op->save_invstd == NULL)
      return sbn_fail(comm, sbnInvalidArgument, "%s: save_mean and save_invstd are required",
                      fn);
    if (d->n * d->spatial == 1 && comm->team->nranks == 1)
      return sbn_fail(comm, sbnInvalidArgument,
                      "Expected more than 1 value per channel when training, got input of "
                      "n=1, spatial=1");
    const span_t outs[6] = {{"y", op->out, tensor}, {"save_mean", op->save_mean, chan},
                            {"save_invstd", op->save_invstd, chan}, {"running_mean", op->running_mean, chan},
                            {"running_var", op->running_var, chan},
                            {"num_batches_tracked", op->num_batches_tracked, sizeof(int64_t)}};
    const span_t ins[4] = {{"x", op->x, tensor}, {"z", op->z, tensor}, {"weight", op->weight, chan},
                           {"bias", op->bias, chan}};
    r = check_aliases(comm, fn, "forward", outs, 6, ins, 4);
    if (r != sbnSuccess) return r;
  } else {
    const int recover = op->x == NULL && op->y != NULL; /* the in-place backward */
    if (has_data && (op->dy == NULL || (op->x == NULL && !recover)))
      return sbn_fail(comm, sbnInvalidArgument,
                      ex == 2 ? "%s: y and dy must be non-NULL when n > 0"
                      : ex    ? "%s: dy, and x or y (the in-place backward), must be non-NULL when n > 0"
                              : "%s: x and dy must be non-NULL when n > 0", fn);
    if (op->save_mean == NULL || op->save_invstd == NULL)
      return sbn_fail(comm, sbnInvalidArgument, "%s: save_mean and save_invstd are required",
                      fn);
    /* x given as y's memory: after a forward that wrote y over x, x is gone, and dx and
       dweight would take y for it (dz and dbias need dy and y alone: asked alone, they
       are right) */
    if (has_data && op->x != NULL && op->x == op->y && (op->out != NULL || op->dweight != NULL))
      return sbn_fail(comm, sbnInvalidArgument,
                      "%s: x and y are the same memory: a forward that wrote y over x left no x for dx "
                      "and dweight; pass x NULL (the in-place backward recovers x from y: identity or "
                      "leaky ReLU; with a residual, sbnBackwardInPlaceEx), or keep x", fn);
    /* dx and dz are written while dy, x and y are read (the aliases above excepted), and
       dweight and dbias before the per-channel inputs are read for the last time (the dx
       coefficients read weight and save_*, the in-place backward bias) */
    const span_t outs[4] = {{"dz", op->dz, tensor}, {"dx", op->out, tensor}, {"dweight", op->dweight, chan},
                            {"dbias", op->dbias, chan}};
    const span_t ins[8] = {{"x", op->x, tensor}, {"y", op->y, tensor}, {"dy", op->dy, tensor},
                           {"z", op->z, tensor}, {"weight", op->weight, chan}, {"bias", op->bias, chan},
                           {"save_mean", op->save_mean, chan}, {"save_invstd", op->save_invstd, chan}};
    r = check_aliases(comm, fn, "backward", outs, 4, ins, 8);
    if (r != sbnSuccess) return r;
    if (op->bias != NULL && op->weight == NULL)
      return sbn_fail(comm, sbnInvalidArgument,
                      "%s: a bias without a weight (affine takes both; NULL both for affine=False)", fn);
    if (has_data && op->act != sbnActivationIdentity && op->y == NULL)
      return sbn_fail(comm, sbnInvalidArgument,
                      "%s: y (the forward's output) is required for the activation's gradient", fn);
    if (recover && has_data) {
      /* leaky ReLU's slope below FLT_MIN: 0 is ReLU; a subnormal one loses x's bits in
         slope * v, and 1 / slope overflows below ~2.9e-39 */
      if (op->act == sbnActivationRelu ||
          (op->act == sbnActivationLeakyRelu && !(op->slope >= FLT_MIN))) {
        char what[64] = "ReLU";
        if (op->act == sbnActivationLeakyRelu)
          snprintf(what, sizeof what, "leaky ReLU with slope %g", (double)op->slope);
        return sbn_fail(comm, sbnInvalidArgument,
                        "%s: the in-place backward (x NULL) recovers x from y, which needs an invertible "
                        "activation (identity, or leaky ReLU with a slope >= FLT_MIN): %s is not", fn, what);
      }
      if (op->dz != NULL && op->z == NULL)
        return sbn_fail(comm, sbnInvalidArgument,
                        ex == 2 ? "%s: dz is the residual's gradient, and z is NULL: pass the forward's z"
                                : "%s: the in-place backward (x NULL) recovers x from y, which a residual z "
                                  "(dz non-NULL) makes impossible without z: pass z (sbnBackwardInPlaceEx) or x",
                        fn);
      /* z over y (or a part of it): a forward that wrote y over z (allowed) left no z, and
         the recovery would take y for it */
      if (op->z != NULL && (uintptr_t)op->z < (uintptr_t)op->y + tensor &&
          (uintptr_t)op->y < (uintptr_t)op->z + tensor)
        return sbn_fail(comm, sbnInvalidArgument,
                        "%s: z and y %s: a forward that wrote y over z left no z for the recovery; keep z "
                        "(the forward may write y over x instead)",
                        fn, op->z == op->y ? "are the same memory" : "overlap");
      if ((op->weight == NULL) != (op->bias == NULL))
        return sbn_fail(comm, sbnInvalidArgument,
                        "%s: the in-place backward reads weight and bias: both set (affine) or "
                        "both NULL", fn);
    }
  }
  if (sbn_op_uses_epilogue(op) && !comm->team->ops->epilogue)
    return sbn_fail(comm, sbnUnsupported,
                    "%s: the activation, the residual and the in-place backward run on CPU teams "
                    "in this version (this team: %s)", fn, comm->team->ops->name);
  return sbnSuccess;
}

/* Common tail of both ops: check, then queue in the open group or run now. A failed
   check inside a group also makes sbnGroupEnd run nothing. */
static sbnResult_t submit(sbn_op_t* op, const sbnTensorDesc_t* desc, const sbnParams_t* params,
                          int ex, const sbnEpilogue_t* epilogue) {
  static const sbnParams_t defaults = SBN_PARAMS_DEFAULT;
  op->fn = op_fn(op, ex); /* the name in every message below, and the backends' */
  const int in_group = sbn_group_active();
  /* no cancellation point between the claim and its release (front.h) */
  const int cancel = sbn_nocancel_begin();
  sbnResult_t r = sbn_comm_check(op->comm, op->fn);
  int claimed = 0;
  if (r == sbnSuccess) r = sbn_comm_claim(op->comm, op->fn, &claimed);
  /* the call number (internal.h: sbnComm.calls): a call counts at once, refused below or
     not, but in a group of a team whose ranks all live here, where the ops it queued count
     when the group runs (group.c) */
  if (r == sbnSuccess) {
    sbnComm_t c = op->comm;
    if (in_group && sbn_team_all_local(c->team)) {
      op->call = c->calls + c->pending;
    } else {
      op->call = c->calls;
      c->calls = (c->calls + 1u) % SBN_SIG_CALLS;
    }
  }
  if (r == sbnSuccess && desc == NULL)
    r = sbn_fail(op->comm, sbnInvalidArgument, "%s: desc is NULL", op->fn);
  if (r == sbnSuccess)
    r = read_epilogue(op->comm, op->fn, epilogue, op->z, &op->act, &op->slope, &op->no_residual);
  if (r == sbnSuccess) {
    op->desc = *desc;
    op->params = params ? *params : defaults;
    r = check_op(op, ex);
  }
  if (r == sbnSuccess) r = sbn_comm_check_alive(op->comm);
  const sbn_team_ops_t* ops = r == sbnSuccess ? op->comm->team->ops : NULL;
  if (r == sbnSuccess && ops->prepare != NULL) r = ops->prepare(op, in_group);
  r = sbn_call_finish(op, r, claimed, sbn_op_run);
  sbn_nocancel_end(cancel);
  return r;
}

/* The two forwards and the two backwards: one op each, `ex` naming the entry point in
   messages (the plain ops pass no z, y, dz or epilogue). */
static sbnResult_t forward_train(int ex, sbnComm_t comm, const sbnTensorDesc_t* desc, const void* x,
                                 const void* z, void* y, const float* weight, const float* bias,
                                 float* running_mean, float* running_var, int64_t* num_batches_tracked,
                                 float* save_mean, float* save_invstd, const sbnParams_t* params,
                                 const sbnEpilogue_t* epilogue, sbnStream_t stream) {
  sbn_op_t op; /* CPU teams ignore the stream: they run on the calling thread(s) */
  memset(&op, 0, sizeof op);
  op.kind = SBN_OP_FORWARD;
  op.stream = stream;
  op.comm = comm;
  op.x = x;
  op.z = z;
  op.out = y;
  op.weight = weight;
  op.bias = bias;
  op.running_mean = running_mean;
  op.running_var = running_var;
  op.num_batches_tracked = num_batches_tracked;
  op.save_mean = save_mean;
  op.save_invstd = save_invstd;
  return submit(&op, desc, params, ex, epilogue);
}

static sbnResult_t backward(int ex, sbnComm_t comm, const sbnTensorDesc_t* desc, const void* x, const void* z,
                            const void* y, const void* dy, void* dx, void* dz, const float* weight, const float* bias,
                            const float* save_mean, const float* save_invstd, float* dweight, float* dbias,
                            const sbnParams_t* params, const sbnEpilogue_t* epilogue, sbnStream_t stream) {
  sbn_op_t op;
  memset(&op, 0, sizeof op);
  op.kind = SBN_OP_BACKWARD;
  op.stream = stream;
  op.comm = comm;
  op.x = x;
  op.z = z; /* sbnBackwardInPlaceEx's: the forward's residual, which the recovery subtracts */
  op.y = y;
  op.dy = dy;
  op.out = dx;
  op.dz = dz;
  op.weight = weight;
  op.bias = bias; /* read by the in-place backward only */
  op.save_mean = (float*)(uintptr_t)save_mean; /* read-only in backward */
  op.save_invstd = (float*)(uintptr_t)save_invstd;
  op.dweight = dweight;
  op.dbias = dbias;
  return submit(&op, desc, params, ex, epilogue);
}

SBN_API sbnResult_t sbnForwardTrain(sbnComm_t comm, const sbnTensorDesc_t* desc, const void* x,
                                    void* y, const float* weight, const float* bias,
                                    float* running_mean, float* running_var,
                                    int64_t* num_batches_tracked, float* save_mean,
                                    float* save_invstd, const sbnParams_t* params,
                                    sbnStream_t stream) {
  return forward_train(0, comm, desc, x, NULL, y, weight, bias, running_mean, running_var, num_batches_tracked,
                       save_mean, save_invstd, params, NULL, stream);
}

SBN_API sbnResult_t sbnForwardTrainEx(sbnComm_t comm, const sbnTensorDesc_t* desc, const void* x,
                                      const void* z, void* y, const float* weight,
                                      const float* bias, float* running_mean, float* running_var,
                                      int64_t* num_batches_tracked, float* save_mean,
                                      float* save_invstd, const sbnParams_t* params,
                                      const sbnEpilogue_t* epilogue, sbnStream_t stream) {
  return forward_train(1, comm, desc, x, z, y, weight, bias, running_mean, running_var, num_batches_tracked,
                       save_mean, save_invstd, params, epilogue, stream);
}

SBN_API sbnResult_t sbnBackward(sbnComm_t comm, const sbnTensorDesc_t* desc, const void* x,
                                const void* dy, void* dx, const float* weight,
                                const float* save_mean, const float* save_invstd, float* dweight,
                                float* dbias, const sbnParams_t* params, sbnStream_t stream) {
  return backward(0, comm, desc, x, NULL, NULL, dy, dx, NULL, weight, NULL, save_mean, save_invstd, dweight,
                  dbias, params, NULL, stream);
}

SBN_API sbnResult_t sbnBackwardEx(sbnComm_t comm, const sbnTensorDesc_t* desc, const void* x,
                                  const void* y, const void* dy, void* dx, void* dz,
                                  const float* weight, const float* bias, const float* save_mean,
                                  const float* save_invstd, float* dweight, float* dbias,
                                  const sbnParams_t* params, const sbnEpilogue_t* epilogue,
                                  sbnStream_t stream) {
  return backward(1, comm, desc, x, NULL, y, dy, dx, dz, weight, bias, save_mean, save_invstd, dweight, dbias,
                  params, epilogue, stream);
}

SBN_API sbnResult_t sbnBackwardInPlaceEx(sbnComm_t comm, const sbnTensorDesc_t* desc, const void* y,
                                         const void* z, const void* dy, void* dx, void* dz,
                                         const float* weight, const float* bias, const float* save_mean,
                                         const float* save_invstd, float* dweight, float* dbias,
                                         const sbnParams_t* params, const sbnEpilogue_t* epilogue,
                                         sbnStream_t stream) {
  return backward(2, comm, desc, NULL, z, y, dy, dx, dz, weight, bias, save_mean, save_invstd, dweight, dbias,
                  params, epilogue, stream);
}

static sbnResult_t inference(const char* fn, const sbnTensorDesc_t* desc, const void* x, const void* z,
                             void* y, const float* weight, const float* bias, const float* running_mean,
                             const float* running_var, float eps, const sbnEpilogue_t* epilogue,
                             sbnStream_t stream) {
  sbnResult_t r = check_desc(NULL, fn, desc);
  if (r != sbnSuccess) return r;
  int act, no_residual;
  float slope;
  r = read_epilogue(NULL, fn, epilogue, z, &act, &slope, &no_residual);
  if (r != sbnSuccess) return r;
  if (desc->n > 0 && (x == NULL || y == NULL))
    return sbn_fail(NULL, sbnInvalidArgument, "%s: x and y must be non-NULL when n > 0", fn);
  if (running_mean == NULL || running_var == NULL)
    return sbn_fail(NULL, sbnInvalidArgument, "%s: running_mean and running_var are required", fn);
  if ((weight == NULL) != (bias == NULL))
    return sbn_fail(NULL, sbnInvalidArgument,
                    "%s: weight and bias must both be set (affine) or both NULL", fn);
  if (!(eps >= 0.0f) || isinf(eps))
    return sbn_fail(NULL, sbnInvalidArgument, "%s: eps must be finite and >= 0, got %g", fn,
                    (double)eps);
  const size_t tensor = tensor_bytes(desc), chan = chan_bytes(desc);
  const span_t outs[1] = {{"y", y, tensor}};
  const span_t ins[6] = {{"x", x, tensor}, {"z", z, tensor}, {"weight", weight, chan}, {"bias", bias, chan},
                         {"running_mean", running_mean, chan}, {"running_var", running_var, chan}};
  r = check_aliases(NULL, fn, "inference", outs, 1, ins, 6);
  if (r != sbnSuccess) return r;
  const void* ptrs[] = {x, y, weight, bias, running_mean, running_var, z};
  int kinds[2] = {0, 0};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
    if (ptrs[i] != NULL) kinds[sbn_pointer_kind(ptrs[i])]++;
  if (kinds[SBN_MEM_HOST] && kinds[SBN_MEM_DEVICE])
    return sbn_fail(NULL, sbnInvalidArgument,
                    "%s: pointers mix host and device memory; pass all host or all device", fn);
  if (kinds[SBN_MEM_DEVICE]) {
    return sbn_gpu_inference(desc, x, z, y, weight, bias, running_mean, running_var, eps, act, slope, stream);
  }
  sbn_cpu_inference(desc, x, z, y, weight, bias, running_mean, running_var, eps, act, slope);
  return sbnSuccess;
}

SBN_API sbnResult_t sbnForwardInference(const sbnTensorDesc_t* desc, const void* x, void* y,
                                        const float* weight, const float* bias,
                                        const float* running_mean, const float* running_var,
                                        float eps, sbnStream_t stream) {
  return inference("sbnForwardInference", desc, x, NULL, y, weight, bias, running_mean, running_var, eps,
                   NULL, stream);
}

SBN_API sbnResult_t sbnForwardInferenceEx(const sbnTensorDesc_t* desc, const void* x, const void* z,
                                          void* y, const float* weight, const float* bias,
                                          const float* running_mean, const float* running_var,
                                          float eps, const sbnEpilogue_t* epilogue, sbnStream_t stream) {
  return inference("sbnForwardInferenceEx", desc, x, z, y, weight, bias, running_mean, running_var, eps,
                   epilogue, stream);
}
