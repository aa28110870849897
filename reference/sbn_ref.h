/* sbn_ref.h — the double-precision reference: the specification of SyncBN in code,
 * written independently of the library (it shares no code with src/ or kernels/).
 *
 * A team's ranks r = 0..nranks-1 each hold a tensor descs[r] (same c, dtype, layout;
 * n may differ, may be 0). Statistics are over the concatenation of all ranks' batches.
 * Inputs are read with exact widening (fp16/bf16 -> double); outputs are double.
 * Per-channel arrays have length c. Element index i of a rank's tensor follows its
 * layout: NCHW i = (ni*c + ci)*spatial + si; NHWC i = (ni*spatial + si)*c + ci.
 */
#ifndef SYNCBN_REFERENCE_SBN_REF_H_
#define SYNCBN_REFERENCE_SBN_REF_H_

#include <stdint.h>

#include "syncbn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Value of element i of a tensor of type dt, exactly. */
double sbn_ref_load(const void* x, sbnDataType_t dt, int64_t i);
/* Round v to dt (nearest even) and store it at element i; fp32 stores (float)v. */
void sbn_ref_store(void* x, sbnDataType_t dt, int64_t i, double v);
/* Number of elements n*c*spatial of a descriptor. */
int64_t sbn_ref_numel(const sbnTensorDesc_t* d);
/* Index of (ni, ci, si) in a tensor of this descriptor's layout. */
int64_t sbn_ref_index(const sbnTensorDesc_t* d, int64_t ni, int64_t ci, int64_t si);

/* Training forward. mean, invstd (1/sqrt(var_biased+eps); 0 where M > 0 and var_biased
   and eps are both 0, as PyTorch's), var_unbiased: [c] outputs
   (var_unbiased is 0 when M < 2). *m = global count M. ys: NULL, or ys[r] = rank r's y
   (n*c*spatial doubles, rank r's layout), or ys[r] NULL to skip that rank. weight/bias
   NULL: affine=False. M == 0: mean 0, invstd 1/sqrt(eps). */
void sbn_ref_forward(int nranks, const sbnTensorDesc_t* descs, const void* const* xs,
                     const float* weight, const float* bias, double eps, double* mean,
                     double* invstd, double* var_unbiased, int64_t* m, double* const* ys);

/* Running-stat update for one call: rm/rv in/out (double), factor = momentum, or
   1/(nbt_before+1) if momentum < 0. Unchanged when m == 0. */
void sbn_ref_running(int64_t c, int64_t m, const double* mean, const double* var_unbiased,
                     double momentum, int64_t nbt_before, double* rm, double* rv);

/* Backward with the given saved statistics (pass the library's save_mean/save_invstd,
   widened, or the reference's own). dxs: NULL or per-rank outputs (NULL entries skip).
   dweight_local/dbias_local: NULL or per-rank [c] outputs (rank r's contribution).
   dweight_global/dbias_global: NULL or [c] team sums. weight NULL: affine=False. */
void sbn_ref_backward(int nranks, const sbnTensorDesc_t* descs, const void* const* xs,
                      const void* const* dys, const float* weight, const double* mean,
                      const double* invstd, double* const* dxs, double* const* dweight_local,
                      double* const* dbias_local, double* dweight_global,
                      double* dbias_global);

/* sbn_ref_backward after an activation: the gradient reaching the normalization is
   g = dy * act'(y) from the forward's output ys[r] (act: sbnActivation_t; ys NULL or
   identity: g = dy); dzs: NULL or per-rank outputs of g (the residual's gradient). */
void sbn_ref_backward_ex(int nranks, const sbnTensorDesc_t* descs, const void* const* xs,
                         const void* const* ys, const void* const* dys, int act, double slope,
                         const float* weight, const double* mean, const double* invstd,
                         double* const* dxs, double* const* dzs, double* const* dweight_local,
                         double* const* dbias_local, double* dweight_global, double* dbias_global);

/* The in-place backward (sbnBackwardInPlaceEx, and sbnBackwardEx with x NULL) as defined
   on the y it is given: x_hat = (act^-1(y) - z - bias) / weight (act identity or leaky
   ReLU, the invertible ones: any other act is taken as identity; zs NULL or zs[r] NULL:
   z = 0; bias NULL: 0; weight NULL: 1), 0 on a channel whose |weight| <
   max(SBN_RECOVER_MIN_WEIGHT, u |bias|) (u the dtype's unit roundoff) or whose weight *
   invstd is 0, then sbn_ref_backward_ex's formulas with x_hat for (x - mean) * invstd. ys
   must be given. */
void sbn_ref_backward_inplace(int nranks, const sbnTensorDesc_t* descs, const void* const* ys,
                              const void* const* zs, const void* const* dys, int act, double slope,
                              const float* weight, const float* bias, const double* invstd,
                              double* const* dxs, double* const* dzs, double* const* dweight_local,
                              double* const* dbias_local, double* dweight_global,
                              double* dbias_global);

/* The forward's epilogue on a normalized tensor y (double, in place): y = act(y + z)
   (z NULL: none; act: sbnActivation_t). */
void sbn_ref_epilogue(const sbnTensorDesc_t* d, const void* z, int act, double slope, double* y);

/* Eval-mode forward of one tensor into y (double, same layout). */
void sbn_ref_inference(const sbnTensorDesc_t* d, const void* x, const float* weight,
                       const float* bias, const float* running_mean, const float* running_var,
                       double eps, double* y);

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_REFERENCE_SBN_REF_H_ */
