/* op.c — the core's part of ops: their signature, description and names, for every
 * layer's messages and checks. */
#include <stdio.h>

#include "internal.h"

uint32_t sbn_op_signature(const sbn_op_t* op) {
  const sbnTensorDesc_t* d = &op->desc;
  return sbn_sig_with_act(sbn_op_sig_of(op->kind, d->dtype, d->layout, d->n, d->c, d->spatial), op->act);
}

const char* sbn_sig_describe(uint32_t sig, char* buf, size_t n) {
  static const char* const acts[] = {"", " + ReLU", " + leaky ReLU", " + ?"};
  snprintf(buf, n, "%s %s %s C=%lld%s", sbn_sig_kind(sig) == SBN_OP_FORWARD ? "forward" : "backward",
           sbn_dtype_name(sbn_sig_dtype(sig)),
           sbn_sig_layouts(sig) == 0 ? "any layout" : sbn_sig_layout(sig) == sbnLayoutNHWC ? "NHWC" : "NCHW",
           (long long)sbn_sig_c(sig), acts[sbn_sig_act(sig)]);
  return buf;
}

const char* sbn_op_name(sbn_op_kind_t k) {
  return k == SBN_OP_FORWARD ? "sbnForwardTrain" : "sbnBackward";
}
