/* op.c — the core's part of ops: their signature, description and names, for every
 * layer's messages and checks. */
#include <stdio.h>

#include "internal.h"

uint32_t sbn_op_signature(const sbn_op_t* op) {
  const sbnTensorDesc_t* d = &op->desc;
  const uint32_t sig = sbn_op_sig_of(op->kind, d->dtype, d->layout, d->n, d->c, d->spatial);
  return sbn_sig_with_call(sbn_sig_with_act(sig, op->act), op->call);
}

const char* sbn_sig_describe(uint32_t sig, char* buf, size_t n) {
  static const char* const acts[] = {"", " + ReLU", " + leaky ReLU", " + ?"};
  snprintf(buf, n, "%s %s %s C=%lld%s", sbn_sig_kind(sig) == SBN_OP_FORWARD ? "forward" : "backward",
           sbn_dtype_name(sbn_sig_dtype(sig)),
           sbn_sig_layouts(sig) == 0 ? "any layout" : sbn_sig_layout(sig) == sbnLayoutNHWC ? "NHWC" : "NCHW",
           (long long)sbn_sig_c(sig), acts[sbn_sig_act(sig)]);
  return buf;
}

const char* sbn_sig_mismatch(int ra, uint32_t a, int rb, uint32_t b, char* buf, size_t n) {
  char da[64], db[64];
  if (ra > rb) { /* the lower rank first: every rank words it alike */
    const int rt = ra; const uint32_t t = a;
    ra = rb, a = b, rb = rt, b = t;
  }
  const unsigned ca = (unsigned)sbn_sig_call(a), cb = (unsigned)sbn_sig_call(b);
  const int apart = sbn_sig_calls_apart(sbn_sig_call_bit(a) | sbn_sig_call_bit(b));
  if (apart && sbn_sig_same_but_call(a, b))
    snprintf(buf, n,
             "ranks out of step: rank %d is at its call %u and rank %d at its call %u (mod %u) "
             "of the same op, %s. A call refused on some ranks only does that: its peers "
             "wait in it, and the refused rank's next call met that op. Every later op of "
             "the team fails alike; abort the team (sbnCommAbort) and destroy it",
             ra, ca, rb, cb, SBN_SIG_CALLS, sbn_sig_describe(a, da, sizeof da));
  else if (apart)
    snprintf(buf, n,
             "op mismatch: rank %d runs %s at its call %u, rank %d runs %s at its call %u "
             "(mod %u): the ranks are out of step, as after a call refused on some ranks "
             "only; every later op of the team fails alike: abort the team (sbnCommAbort) and "
             "destroy it",
             ra, sbn_sig_describe(a, da, sizeof da), ca, rb, sbn_sig_describe(b, db, sizeof db), cb,
             SBN_SIG_CALLS);
  else
    snprintf(buf, n, "op mismatch: rank %d runs %s, rank %d runs %s", ra, sbn_sig_describe(a, da, sizeof da),
             rb, sbn_sig_describe(b, db, sizeof db));
  return buf;
}

const char* sbn_op_name(sbn_op_kind_t k) {
  return k == SBN_OP_FORWARD ? "sbnForwardTrain" : "sbnBackward";
}
