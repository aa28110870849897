// syncbn's operators in PyTorch's dispatcher, in C++: the same operators, schemas, checks,
// messages and autograd as the Python kernels of python/syncbn/_ops.py (the plain three)
// and _fused.py (batch norm + activation + residual: the three _act_ ones), at a C++
// kernel's host cost (bench/notes/torch-binding.md). Built on first use by
// python/syncbn/_native.py against the running PyTorch's headers and loaded with
// torch.ops.load_library; _ops.py registers the fake kernels (Python) on these operators.
//
// libsyncbn itself is not linked: _native.py hands over the functions of the library that
// the package already loaded (ctypes), and the live comms by id (sbn_torch_comm_put /
// _drop), through the extern "C" functions at the end.
#ifdef SBN_TORCH_PYTHON
// failed library calls raise syncbn.SyncBNError itself (a Python exception carried
// through the dispatcher and the autograd engine as PyTorch carries its own)
#include <Python.h>
#pragma GCC visibility push(default)
#include <torch/csrc/Exceptions.h>
#pragma GCC visibility pop
#endif
#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <dlfcn.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>
#ifdef SBN_TORCH_COMPILED_AUTOGRAD
#include <torch/csrc/dynamo/compiled_autograd.h>
#endif
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cfloat>
#include <cmath>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>

#include "syncbn.h"

// The operators' namespace: syncbn; another for the mutants of tests/python/test_torch_ops.py,
// which also build without the Autograd kernels (SBN_TORCH_NO_AUTOGRAD).
#ifndef SBN_TORCH_NS
#define SBN_TORCH_NS syncbn
#endif
#define SBN_STR2(x) #x
#define SBN_STR(x) SBN_STR2(x)
#define SBN_OP(name) SBN_STR(SBN_TORCH_NS) "::" name
#define SBN_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define SBN_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

namespace {

using at::Tensor;
using std::optional;
using torch::autograd::variable_list;

// ---- what _native.py hands over -----------------------------------------------------
struct Api {
  decltype(&sbnForwardTrain) forward_train = nullptr;
  decltype(&sbnBackward) backward = nullptr;
  decltype(&sbnForwardInference) forward_inference = nullptr;
  decltype(&sbnGetLastError) last_error = nullptr;
  decltype(&sbnGetErrorString) error_string = nullptr;
  decltype(&sbnGetResultName) result_name = nullptr;
  decltype(&sbnCommDestroy) comm_destroy = nullptr;
  decltype(&sbnForwardTrainEx) forward_train_ex = nullptr;
  decltype(&sbnBackwardEx) backward_ex = nullptr;
  decltype(&sbnForwardInferenceEx) forward_inference_ex = nullptr;
  decltype(&sbnBackwardInPlaceEx) backward_inplace_ex = nullptr;
};
Api api;

// A live comm, owned here once syncbn.Comm has handed it over: destroyed (sbnCommDestroy)
// when Python has dropped it AND no operator call is using it, whichever comes last, so
// that a comm collected or destroyed by another thread is never freed under a call (and
// one Python collected stays while an autograd node will call it: CommPin).
struct CommOwner {
  sbnComm_t handle;
  ~CommOwner() {
    if (handle != nullptr) api.comm_destroy(handle);
  }
};

struct CommEntry {
  std::shared_ptr<CommOwner> owner;  // each call holds a copy while it runs
  bool host;                         // a CPU team: its ops take host memory
  std::string transport;
  int pins = 0;            // autograd nodes that will call it (CommPin)
  bool collected = false;  // Python collected its syncbn.Comm while pinned
  bool destroying = false;  // destroy_entry runs the library's destroy: no call may take it
  // a team of one that threads share (sbn_torch_comm_serial): its calls one at a time
  std::shared_ptr<std::mutex> serial;
};
// Made once and never destroyed: at the process's exit the table's destructor would destroy
// every comm, waking an operator call still waiting in another thread while Python
// finalizes (its thread then ends inside a noexcept frame: std::terminate); the comms are
// left to the exit, as the Python operators leave theirs.
std::mutex& comms_mutex = *new std::mutex;
std::unordered_map<int64_t, CommEntry>& comms = *new std::unordered_map<int64_t, CommEntry>;

// Destroys the comm of entry `id` (in the table; `lock` holds comms_mutex) now if no
// operator call is using it: sbnCommDestroy's result; else -1: the entry leaves the table
// (calls from now on say it was destroyed) and the last such call's release destroys it.
// While the library's destroy runs (the lock released) the entry stays in the table,
// marked destroying: no call can take it, and pins still count. Done (or sbnTimeout, the
// handle released all the same), the entry leaves; refused (sbnInvalidUsage: a call on
// the comm from another thread, outside these operators, still runs), it stays as it
// was. (A refused destroy at a pin's release, or at the last call's release
// (~CommOwner), has no one to tell: the comm then stays, unused.)
int destroy_entry(std::unique_lock<std::mutex>& lock, int64_t id) {
  auto it = comms.find(id);
  std::shared_ptr<CommOwner> owner = it->second.owner;
  if (owner.use_count() > 2) {  // the table's, this one, and a call's
    comms.erase(it);
    return -1;
  }
  it->second.destroying = true;
  sbnComm_t h = owner->handle;
  lock.unlock();
  const int r = static_cast<int>(api.comm_destroy(h));
  lock.lock();
  it = comms.find(id);  // still there: a destroying entry leaves only here
  // sbnTimeout: the team's devices did not finish in time, and the handle is released all
  // the same (the library frees the team later): the entry leaves as for a success
  if (r == sbnSuccess || r == sbnTimeout) {
    owner->handle = nullptr;
    if (it != comms.end()) comms.erase(it);
  } else if (it != comms.end()) {
    it->second.destroying = false;
  }
  return r;
}

// An autograd node's hold on the comm its backward calls, as nn.SyncBatchNorm's backward
// holds its process group: a comm whose syncbn.Comm Python collects while a node that will
// call it lives (a layer deleted between its forward and the backward) stays live, by its
// id, until the last such node is gone (sbn_torch_comm_drop, collected). An explicit
// destroy() still destroys it at once: the backward then raises.
class CommPin {
 public:
  explicit CommPin(int64_t id) : id_(id) {
    std::lock_guard<std::mutex> lock(comms_mutex);
    auto it = comms.find(id);
    if (it != comms.end()) {
      ++it->second.pins;
      pinned_ = true;
    }
  }
  CommPin(const CommPin&) = delete;
  CommPin& operator=(const CommPin&) = delete;
  ~CommPin() {
    if (!pinned_) return;
    std::unique_lock<std::mutex> lock(comms_mutex);
    auto it = comms.find(id_);  // gone: destroyed explicitly meanwhile
    if (it == comms.end() || --it->second.pins > 0 || !it->second.collected || it->second.destroying) return;
    destroy_entry(lock, id_);  // a node's release has no one to tell of a failure
  }

 private:
  int64_t id_;
  bool pinned_ = false;
};

// ---- text as the Python kernels write it --------------------------------------------
std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kLong: return "torch.int64";
    case at::kInt: return "torch.int32";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    case at::kComplexHalf: return "torch.complex32";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    default: {
      std::string s = c10::toString(t);
      for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      return "torch." + s;
    }
  }
}

std::string shape_str(at::IntArrayRef s) {  // a Python tuple: (3,), (2, 3)
  std::ostringstream o;
  o << "(";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  if (s.size() == 1) o << ",";
  o << ")";
  return o.str();
}

[[noreturn]] void fail(const std::string& msg) { TORCH_CHECK(false, msg); }
[[noreturn]] void fail_type(const std::string& msg) { TORCH_CHECK_TYPE(false, msg); }
[[noreturn]] void fail_value(const std::string& msg) { TORCH_CHECK_VALUE(false, msg); }

// A failed library call (or a comm that is not live): syncbn.SyncBNError(code, what,
// detail), or SyncBNValueError for the one-value-per-channel case (a ValueError, as
// nn.BatchNorm raises it). Without Python's headers at build time: a RuntimeError
// (ValueError) with SyncBNError's text, "<what>: <detail> [<result name>]".
[[noreturn]] void fail_library(sbnResult_t r, const std::string& what, const std::string& detail) {
  const bool value = detail.rfind("Expected more than 1 value per channel", 0) == 0;
#ifdef SBN_TORCH_PYTHON
  if (Py_IsInitialized()) {
    pybind11::gil_scoped_acquire gil;
    PyObject* mod = PyImport_ImportModule("syncbn");
    PyObject* cls = mod ? PyObject_GetAttrString(mod, value ? "SyncBNValueError" : "SyncBNError") : nullptr;
    PyObject* exc = cls ? PyObject_CallFunction(cls, "iss", static_cast<int>(r), what.c_str(), detail.c_str())
                        : nullptr;
    if (exc != nullptr) PyErr_SetObject(cls, exc);
    Py_XDECREF(exc);
    Py_XDECREF(cls);
    Py_XDECREF(mod);
    if (PyErr_Occurred()) {  // SyncBNError, or what failed in making it, kept for any thread
      python_error err;
      err.persist();
      throw std::move(err);
    }
  }
#endif
  const std::string msg = what + ": " + (detail.empty() ? api.error_string(r) : detail) + " [" + api.result_name(r) + "]";
  if (value) fail_value(msg);
  fail(msg);
}

[[noreturn]] void fail_call(sbnResult_t r, const char* what, sbnComm_t comm) {
  fail_library(r, what, api.last_error(comm));
}

// Forward-mode AD (jvp, dual tensors): no formula; refused, as PyTorch's own operators
// without one refuse, rather than giving zero tangents.
void no_forward_ad(const char* who, std::initializer_list<const optional<Tensor>*> ts) {
  for (const optional<Tensor>* t : ts)
    if (t->has_value() && (*t)->defined() && (*t)->_fw_grad(/*level=*/0).defined())
      fail(std::string("syncbn.") + who + ": forward-mode AD (jvp, dual tensors) is not implemented");
}

// The running statistics are buffers the op reads (and in training writes), never
// differentiable: one that requires grad (a running mean computed from parameters, as in
// functional_call; torch.func.grad taken to it) is refused, as nn.BatchNorm's
// native_batch_norm refuses it, where its gradient was silently dropped (None or zeros).
void no_stats_grad(const char* who, const optional<Tensor>& rm, const optional<Tensor>& rv) {
  if (!at::GradMode::is_enabled()) return;
  const char* name = rm.has_value() && rm->defined() && rm->requires_grad()   ? "running_mean"
                     : rv.has_value() && rv->defined() && rv->requires_grad() ? "running_var"
                                                                              : nullptr;
  if (name != nullptr)
    fail(std::string("syncbn.") + who + " is not differentiable with respect to argument '" + name +
         "' (as nn.BatchNorm's native_batch_norm is not): this input cannot have requires_grad True");
}

// ---- argument checks (_ops.py's, with its messages) -----------------------------------
bool supported(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

void same_device(const Tensor& x, const char* name, const optional<Tensor>& t, const char* who) {
  if (t.has_value() && t->device() != x.device())
    fail(std::string("syncbn.") + who + ": " + name + " is on " + t->device().str() + " and the input on " +
         x.device().str() + ": every tensor argument must be on the input's device");
}

void per_channel(const Tensor& x, const char* name, const optional<Tensor>& t, const char* who) {
  if (!t.has_value()) return;
  same_device(x, name, t, who);
  const int64_t c = x.size(1);
  if (t->dim() != 1 || t->size(0) != c)
    fail(std::string("syncbn.") + who + ": " + name + " has shape " + shape_str(t->sizes()) +
         "; the input has " + std::to_string(c) + " channels, so it must be (" + std::to_string(c) + ",)");
  if (!t->is_floating_point())
    fail_type(std::string("syncbn.") + who + ": " + name + " is " + dtype_name(t->scalar_type()) +
              "; it must be floating point");
}

void check_input(const Tensor& x, const char* who) {
  if (x.dim() < 2)
    fail_value(std::string("syncbn.") + who + ": expected at least 2D input (got " + std::to_string(x.dim()) +
               "D input)");
  if (!supported(x.scalar_type()))
    fail_type(std::string("syncbn.") + who + ": input dtype " + dtype_name(x.scalar_type()) +
              "; libsyncbn takes float32, float16 and bfloat16");
}

// The training forward's parameter and buffer checks (the plain and the fused operator's),
// after the input's.
void check_train_args(const Tensor& x, const optional<Tensor>& weight, const optional<Tensor>& bias,
                      const optional<Tensor>& rm, const optional<Tensor>& rv, const optional<Tensor>& nbt,
                      const char* who) {
  per_channel(x, "weight", weight, who);
  per_channel(x, "bias", bias, who);
  per_channel(x, "running_mean", rm, who);
  per_channel(x, "running_var", rv, who);
  if (rm.has_value() != rv.has_value())
    fail(std::string("syncbn.") + who + ": running_mean and running_var come together (both or neither)");
  if (!weight.has_value() && bias.has_value())
    fail(std::string("syncbn.") + who + ": a bias without a weight (the library takes both or neither)");
  if (nbt.has_value()) {
    same_device(x, "num_batches_tracked", nbt, who);
    if (nbt->numel() != 1 || nbt->scalar_type() != at::kLong)
      fail(std::string("syncbn.") + who + ": num_batches_tracked must be one int64 (got " +
           dtype_name(nbt->scalar_type()) + ", " + std::to_string(nbt->numel()) + " elements)");
  }
}

void check_train(const Tensor& x, const optional<Tensor>& weight, const optional<Tensor>& bias,
                 const optional<Tensor>& rm, const optional<Tensor>& rv, const optional<Tensor>& nbt) {
  check_input(x, "batch_norm_train");
  check_train_args(x, weight, bias, rm, rv, nbt, "batch_norm_train");
}

// The live comm `id`, held (e.owner) for the caller's call.
CommEntry find_comm(int64_t id, const Tensor& x, const char* who) {
  CommEntry e;
  {
    std::lock_guard<std::mutex> lock(comms_mutex);
    auto it = comms.find(id);
    if (it != comms.end() && !it->second.destroying) e = it->second;
  }
  if (e.owner == nullptr)
    fail_library(sbnInvalidUsage, "syncbn.Comm", "no live comm has id " + std::to_string(id) + ": it was destroyed");
  if (x.device().is_cpu() != e.host || !(x.device().is_cpu() || x.device().is_cuda()))
    fail(std::string("syncbn.") + who + ": the input is on " + x.device().str() + ", and the team (" + e.transport +
         ") takes " + (e.host ? "CPU tensors" : "CUDA tensors"));
  return e;
}

// Runs `call(handle)`, the library's call on comm entry c, one at a time with the other
// threads' where c is serialized; a failure raised (fail_library: it takes the GIL) once the
// lock is let go, with the comm's last error read under it.
template <class Call>
void call_comm(const CommEntry& c, const char* what, Call&& call) {
  sbnResult_t r;
  std::string detail;
  {
    std::unique_lock<std::mutex> hold;
    if (c.serial) hold = std::unique_lock<std::mutex>(*c.serial);
    r = call(c.owner->handle);
    if (r != sbnSuccess) detail = api.last_error(c.owner->handle);
  }
  if (r != sbnSuccess) fail_library(r, what, detail);
}

// ---- the C call's arguments ------------------------------------------------------------
optional<at::MemoryFormat> channels_last(const Tensor& x) {
  if (x.dim() == 4) return at::MemoryFormat::ChannelsLast;
  if (x.dim() == 5) return at::MemoryFormat::ChannelsLast3d;
  return std::nullopt;
}

// The memory format the library reads x in, and whether x is dense in it already:
// contiguous (NCHW) if x is, channels_last(_3d) (NHWC) if x is, else the format PyTorch
// suggests for a copy of x (a crop of a channels_last tensor stays channels_last; _ops.py's
// _read_format). A tensor that is both (an empty batch, 1x1 planes, one channel) is NCHW:
// the library matches such a rank's layout to its peers' (the same bytes).
std::pair<at::MemoryFormat, bool> read_format(const Tensor& x) {
  if (x.is_contiguous()) return {at::MemoryFormat::Contiguous, true};
  auto fmt = channels_last(x);
  if (fmt && x.is_contiguous(*fmt)) return {*fmt, true};
  return {fmt && x.suggest_memory_format() == *fmt ? *fmt : at::MemoryFormat::Contiguous, false};
}

// x as the library reads it (read_format: x itself or its dense copy), and its layout.
std::pair<Tensor, sbnLayout_t> dense(const Tensor& x) {
  const auto [fmt, is_dense] = read_format(x);
  return {is_dense ? x : x.contiguous(fmt), fmt == at::MemoryFormat::Contiguous ? sbnLayoutNCHW : sbnLayoutNHWC};
}

sbnTensorDesc_t desc(const Tensor& x, sbnLayout_t layout) {
  sbnDataType_t dt = x.scalar_type() == at::kFloat ? sbnFloat32 : x.scalar_type() == at::kHalf ? sbnFloat16
                                                                                                  : sbnBFloat16;
  int64_t sp = 1;
  for (int64_t d = 2; d < x.dim(); ++d) sp *= x.size(d);
  // a spatial extent of 0: no elements on this rank, which still takes part (n = 0)
  if (sp == 0) return {dt, layout, 0, x.size(1), 1};
  return {dt, layout, x.size(0), x.size(1), sp};
}

optional<Tensor> f32(const optional<Tensor>& t) {  // float32 and contiguous, as the library reads it
  if (!t.has_value() || (t->scalar_type() == at::kFloat && t->is_contiguous())) return t;
  return t->detach().to(at::kFloat).contiguous();
}

// The bias as the library reads it: f32(bias), or zeros where a weight comes without a
// bias (a layer made with bias=False, as nn.BatchNorm*d takes it: the library takes both
// or neither).
optional<Tensor> f32_bias(const optional<Tensor>& weight, const optional<Tensor>& bias) {
  if (weight.has_value() && !bias.has_value()) return at::zeros({weight->size(0)}, weight->options().dtype(at::kFloat));
  return f32(bias);
}

template <typename T>
T* ptr(const optional<Tensor>& t) {
  return t.has_value() ? static_cast<T*>(t->data_ptr()) : nullptr;
}

#ifndef SBN_TORCH_NATIVE_HANDLE
// A PyTorch whose c10::Stream has no native_handle(): c10::cuda::CUDAStream::stream() of
// libc10_cuda (loaded with PyTorch's CUDA), on the c10::Stream that a CUDAStream wraps
// (its one member).
using CudaStreamFn = void* (*)(const c10::Stream*);
CudaStreamFn cuda_stream_fn() {
  void* lib = dlopen("libc10_cuda.so", RTLD_NOW | RTLD_NOLOAD);
  return lib ? reinterpret_cast<CudaStreamFn>(dlsym(lib, "_ZNK3c104cuda10CUDAStream6streamEv")) : nullptr;
}
#endif

// The current stream of x's device as the dispatcher keeps it (PyTorch's kernels run on
// it, also under CUDA graph capture); none for host tensors.
sbnStream_t stream_of(const Tensor& x) {
  if (!x.is_cuda()) return nullptr;
  const c10::Stream s = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(x.device());
#ifdef SBN_TORCH_NATIVE_HANDLE
  return static_cast<sbnStream_t>(s.native_handle());
#else
  static const CudaStreamFn fn = cuda_stream_fn();
  TORCH_CHECK(fn != nullptr, "syncbn: c10::cuda::CUDAStream::stream not found in libc10_cuda.so");
  return static_cast<sbnStream_t>(fn(&s));
#endif
}

sbnParams_t params(double eps, double momentum) {
  sbnParams_t p;
  p.eps = static_cast<float>(eps);
  p.momentum = static_cast<float>(momentum);
  p.grad_mode = sbnGradLocal;
  return p;
}

// ---- syncbn::batch_norm_train ----------------------------------------------------------
// What a training forward (plain or fused) hands the library: the input as it reads it,
// the outputs, the parameters and buffers as float32 and contiguous (converted copies,
// alive until the call is done), the descriptor and the parameters.
struct TrainCall {
  Tensor x, y, stats;
  optional<Tensor> rm, rv, nb, w32, b32;
  sbnTensorDesc_t d;
  sbnParams_t p;
  float* mean() const { return stats.data_ptr<float>(); }
  float* invstd() const { return stats.data_ptr<float>() + x.size(1); }
};

std::string py_float(double v);  // below

// A training forward around `call` (the C call, which raises on failure): the buffers it
// wrote through converted copies are written back, each on its own. A negative momentum
// is refused: the library reads it as None's cumulative average.
template <typename Call>
std::tuple<Tensor, Tensor> run_train(const Tensor& input, const optional<Tensor>& weight,
                                     const optional<Tensor>& bias, const optional<Tensor>& running_mean,
                                     const optional<Tensor>& running_var, const optional<Tensor>& nbt, double eps,
                                     optional<double> momentum, Call&& call) {
  if (momentum.has_value() && *momentum < 0.0)
    fail_value("syncbn: momentum must be >= 0 (None: the cumulative average), got " + py_float(*momentum));
  TrainCall t;
  sbnLayout_t layout;
  std::tie(t.x, layout) = dense(input);
  t.y = at::empty_like(t.x);
  t.stats = at::empty({2, t.x.size(1)}, t.x.options().dtype(at::kFloat));
  t.rm = f32(running_mean);
  t.rv = f32(running_var);
  t.nb = nbt;
  if (nbt.has_value() && !nbt->is_contiguous()) t.nb = nbt->contiguous();
  t.w32 = f32(weight);
  t.b32 = f32_bias(weight, bias);
  t.d = desc(t.x, layout);
  t.p = params(eps, momentum.has_value() ? *momentum : -1.0);
  call(t);
  if (t.rm.has_value() && !t.rm->is_same(*running_mean)) running_mean->copy_(*t.rm);
  if (t.rv.has_value() && !t.rv->is_same(*running_var)) running_var->copy_(*t.rv);
  if (t.nb.has_value() && !t.nb->is_same(*nbt)) nbt->copy_(*t.nb);
  return {t.y, t.stats};
}

std::tuple<Tensor, Tensor> train_kernel(const Tensor& input, const optional<Tensor>& weight,
                                        const optional<Tensor>& bias, const optional<Tensor>& running_mean,
                                        const optional<Tensor>& running_var, const optional<Tensor>& nbt,
                                        double eps, optional<double> momentum, int64_t comm) {
  check_train(input, weight, bias, running_mean, running_var, nbt);
  const CommEntry c = find_comm(comm, input, "batch_norm_train");
  return run_train(input, weight, bias, running_mean, running_var, nbt, eps, momentum, [&](const TrainCall& t) {
    call_comm(c, "syncbn.batch_norm_train (sbnForwardTrain)", [&](sbnComm_t h) {
      return api.forward_train(h, &t.d, t.x.data_ptr(), t.y.data_ptr(), ptr<const float>(t.w32),
                               ptr<const float>(t.b32), ptr<float>(t.rm), ptr<float>(t.rv), ptr<int64_t>(t.nb),
                               t.mean(), t.invstd(), &t.p, stream_of(t.x));
    });
  });
}

// ---- syncbn::batch_norm_backward -------------------------------------------------------
void check_backward(const Tensor& dy, const Tensor& x, const optional<Tensor>& weight, const Tensor& stats) {
  const char* who = "batch_norm_backward";
  check_input(x, who);
  same_device(x, "grad_out", dy, who);
  same_device(x, "stats", stats, who);
  per_channel(x, "weight", weight, who);
  if (dy.sizes() != x.sizes() || dy.scalar_type() != x.scalar_type())
    fail(std::string("syncbn.") + who + ": grad_out is " + dtype_name(dy.scalar_type()) + " " +
         shape_str(dy.sizes()) + "; the input is " + dtype_name(x.scalar_type()) + " " + shape_str(x.sizes()));
  if (stats.dim() != 2 || stats.size(0) != 2 || stats.size(1) != x.size(1) || stats.scalar_type() != at::kFloat)
    fail(std::string("syncbn.") + who + ": stats must be float32 (2, " + std::to_string(x.size(1)) +
         ") (the forward's), got " + dtype_name(stats.scalar_type()) + " " + shape_str(stats.sizes()));
}

std::tuple<Tensor, Tensor> backward_kernel(const Tensor& grad_out, const Tensor& input,
                                           const optional<Tensor>& weight, const Tensor& stats, double eps,
                                           int64_t comm, bool input_grad, bool weight_grad) {
  check_backward(grad_out, input, weight, stats);
  const CommEntry c = find_comm(comm, input, "batch_norm_backward");
  auto [x, layout] = dense(input);
  Tensor dy = layout == sbnLayoutNHWC ? grad_out.contiguous(*channels_last(x)) : grad_out.contiguous();
  Tensor dx = input_grad ? at::empty_like(x) : x.new_empty({0});
  const bool dwb_wanted = weight_grad && weight.has_value();
  Tensor dwb = dwb_wanted ? x.new_empty({2, x.size(1)}, x.options().dtype(at::kFloat))
                          : x.new_empty({0}, x.options().dtype(at::kFloat));
  Tensor st = stats.contiguous();
  optional<Tensor> w32 = f32(weight);
  const sbnTensorDesc_t d = desc(x, layout);
  const sbnParams_t p = params(eps, 0.1);
  const float* sp = st.data_ptr<float>();
  float* dwp = dwb_wanted ? dwb.data_ptr<float>() : nullptr;
  call_comm(c, "syncbn.batch_norm_backward (sbnBackward)", [&](sbnComm_t h) {
    return api.backward(h, &d, x.data_ptr(), dy.data_ptr(), input_grad ? dx.data_ptr() : nullptr,
                        ptr<const float>(w32), sp, sp + x.size(1), dwp, dwp ? dwp + x.size(1) : nullptr, &p,
                        stream_of(x));
  });
  return {dx, dwb};
}

// ---- syncbn::batch_norm_infer ----------------------------------------------------------
// The eval forward's statistics and parameter checks (the plain and the fused operator's),
// after the input's.
void check_infer_args(const Tensor& x, const Tensor& rm, const Tensor& rv, const optional<Tensor>& weight,
                      const optional<Tensor>& bias, const char* who) {
  per_channel(x, "running_mean", rm, who);
  per_channel(x, "running_var", rv, who);
  per_channel(x, "weight", weight, who);
  per_channel(x, "bias", bias, who);
  if (!weight.has_value() && bias.has_value())
    fail(std::string("syncbn.") + who + ": a bias without a weight (the library takes both or neither)");
}

// What an eval forward (plain or fused) hands the library, as TrainCall.
struct InferCall {
  Tensor x, y;
  optional<Tensor> w32, b32, rm32, rv32;
  sbnTensorDesc_t d;
};

template <typename Call>
Tensor run_infer(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                 const optional<Tensor>& weight, const optional<Tensor>& bias, Call&& call) {
  InferCall t;
  sbnLayout_t layout;
  std::tie(t.x, layout) = dense(input);
  t.y = at::empty_like(t.x);
  t.w32 = f32(weight);
  t.b32 = f32_bias(weight, bias);
  t.rm32 = f32(running_mean);
  t.rv32 = f32(running_var);
  t.d = desc(t.x, layout);
  call(t);
  return t.y;
}

Tensor infer_kernel(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                    const optional<Tensor>& weight, const optional<Tensor>& bias, double eps) {
  check_input(input, "batch_norm_infer");
  check_infer_args(input, running_mean, running_var, weight, bias, "batch_norm_infer");
  return run_infer(input, running_mean, running_var, weight, bias, [&](const InferCall& t) {
    sbnResult_t r = api.forward_inference(&t.d, t.x.data_ptr(), t.y.data_ptr(), ptr<const float>(t.w32),
                                          ptr<const float>(t.b32), ptr<const float>(t.rm32),
                                          ptr<const float>(t.rv32), static_cast<float>(eps), stream_of(t.x));
    if (r != sbnSuccess) fail_call(r, "syncbn.batch_norm_infer (sbnForwardInference)", nullptr);
  });
}

// ---- the fused operators (_fused.py's, with its checks and messages) -------------------
// y = act(batch_norm(x) + z): sbnForwardTrainEx, sbnBackwardEx, sbnForwardInferenceEx.

// A float as Python's repr writes it ("0.01", "-0.5", "1e-05", "nan", "inf").
std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);  // shortest digits
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e), sign;
  const int exp = std::stoi(sci.substr(e + 1));
  if (digits[0] == '-') {
    sign = "-";
    digits.erase(0, 1);
  }
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int nd = static_cast<int>(digits.size());
  if (exp < -4 || exp >= 16) {  // Python's repr: d[.ddd]e[+-]XX
    std::string m = digits.substr(0, 1) + (nd > 1 ? "." + digits.substr(1) : "");
    char ex[16];
    std::snprintf(ex, sizeof ex, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    return sign + m + ex;
  }
  if (exp < 0) return sign + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  if (nd <= exp + 1) return sign + digits + std::string(static_cast<size_t>(exp + 1 - nd), '0') + ".0";
  return sign + digits.substr(0, static_cast<size_t>(exp + 1)) + "." + digits.substr(static_cast<size_t>(exp + 1));
}

const char* act_name(int64_t a) {
  return a == sbnActivationRelu ? "relu" : a == sbnActivationLeakyRelu ? "leaky_relu" : "identity";
}

// _fused.check_activation: an unknown activation, a slope that is negative or not finite,
// and what the in-place backward cannot take (ReLU, slope 0 or below FLT_MIN); ValueError.
void check_activation(int64_t activation, double slope, bool inplace, const std::string& who) {
  if (activation < sbnActivationIdentity || activation > sbnActivationLeakyRelu)
    fail_value(who + ": activation " + std::to_string(activation) + ": 0 (identity), 1 (relu) or 2 (leaky_relu)");
  // the library takes the slope as a float32: judged as that value (1e39 is not finite
  // there, 1e-320 is 0)
  const bool fits = std::isfinite(slope) && std::fabs(slope) <= static_cast<double>(FLT_MAX);
  const float slope32 = fits ? static_cast<float>(slope) : 0.0f;
  if (!fits || slope32 < 0)
    fail_value(who + ": slope " + py_float(slope) +
               ": leaky ReLU's negative slope must be finite and >= 0 (as a float32)");
  if (!inplace) return;
  if (activation == sbnActivationRelu)
    fail_value(who + ": the in-place mode cannot take ReLU: ReLU is not invertible (its output loses x where it "
                     "is 0, and the in-place backward recovers x from the output); use leaky_relu with a slope > 0, "
                     "or inplace=False");
  if (activation == sbnActivationLeakyRelu && slope32 == 0)
    fail_value(who + ": the in-place mode cannot take leaky_relu with slope 0 (that is ReLU: not invertible); use a "
                     "slope > 0, or inplace=False");
  if (activation == sbnActivationLeakyRelu && slope32 < FLT_MIN)
    fail_value(who + ": the in-place mode cannot take leaky_relu with slope " + py_float(slope) +
               ": below float32's smallest normal number (slope * v loses x's bits, and the in-place backward's "
               "1 / slope overflows below ~2.9e-39); use a larger slope, or inplace=False");
}

std::string format_name(const Tensor& t) {
  const auto [fmt, is_dense] = read_format(t);
  if (!is_dense) return "strided " + shape_str(t.strides()) + " (neither contiguous nor channels_last)";
  return fmt == at::MemoryFormat::Contiguous ? "contiguous" : "channels_last";
}

// z against x, named `base` in the messages (the input; the in-place backward's out).
void check_residual(const Tensor& x, const optional<Tensor>& z, const char* who, const char* base = "input") {
  if (!z.has_value()) return;
  same_device(x, "residual", z, who);
  const std::string b(base);
  if (z->sizes() != x.sizes())
    fail(std::string("syncbn.") + who + ": the residual has shape " + shape_str(z->sizes()) + " and the " + b + " " +
         shape_str(x.sizes()) + ": they must be equal");
  if (z->scalar_type() != x.scalar_type())
    fail_type(std::string("syncbn.") + who + ": the residual is " + dtype_name(z->scalar_type()) + " and the " + b +
              " " + dtype_name(x.scalar_type()) + ": they must be equal");
  const at::MemoryFormat fmt = read_format(x).first;
  if (!z->is_contiguous(fmt)) {
    const std::string read = fmt == at::MemoryFormat::Contiguous ? "contiguous" : "channels_last";
    fail(std::string("syncbn.") + who + ": the residual's memory format (" + format_name(*z) + ") differs from the " +
         b + "'s (" + read + ", as the library reads it): the residual must be " + read + " too");
  }
}

// no_residual: sbnBackwardEx's promise that the forward had no z and that the weight and
// bias given are its own (the mask from x; _fused.py's docstring)
sbnEpilogue_t epilogue(int64_t activation, double slope, bool no_residual = false) {
  sbnEpilogue_t e = SBN_EPILOGUE_INITIALIZER;
  e.activation = static_cast<sbnActivation_t>(activation);
  e.slope = static_cast<float>(slope);
  e.no_residual = no_residual ? 1 : 0;
  return e;
}

// ---- syncbn::batch_norm_act_train ------------------------------------------------------
std::tuple<Tensor, Tensor> act_train_kernel(const Tensor& input, const optional<Tensor>& residual,
                                            const optional<Tensor>& weight, const optional<Tensor>& bias,
                                            const optional<Tensor>& running_mean,
                                            const optional<Tensor>& running_var, const optional<Tensor>& nbt,
                                            double eps, optional<double> momentum, int64_t comm, int64_t activation,
                                            double slope, bool inplace) {
  const char* who = "batch_norm_act_train";
  check_input(input, who);
  check_activation(activation, slope, inplace, std::string("syncbn.") + who);
  check_residual(input, residual, who);
  check_train_args(input, weight, bias, running_mean, running_var, nbt, who);
  const CommEntry c = find_comm(comm, input, who);
  const sbnEpilogue_t e = epilogue(activation, slope);
  return run_train(input, weight, bias, running_mean, running_var, nbt, eps, momentum, [&](const TrainCall& t) {
    call_comm(c, "syncbn.batch_norm_act_train (sbnForwardTrainEx)", [&](sbnComm_t h) {
      return api.forward_train_ex(h, &t.d, t.x.data_ptr(), ptr<const void>(residual), t.y.data_ptr(),
                                  ptr<const float>(t.w32), ptr<const float>(t.b32), ptr<float>(t.rm),
                                  ptr<float>(t.rv), ptr<int64_t>(t.nb), t.mean(), t.invstd(), &t.p, &e,
                                  stream_of(t.x));
    });
  });
}

// ---- syncbn::batch_norm_act_backward ---------------------------------------------------
void check_act_backward(const Tensor& dy, const optional<Tensor>& x, const optional<Tensor>& out,
                        const optional<Tensor>& weight, const optional<Tensor>& bias, const Tensor& stats,
                        int64_t activation, double slope, const optional<Tensor>& residual, bool no_residual) {
  const char* who = "batch_norm_act_backward";
  if (!x.has_value() && !out.has_value())
    fail(std::string("syncbn.") + who + ": input and out are both None (the in-place backward takes out)");
  const Tensor& base = x.has_value() ? *x : *out;
  check_input(base, who);
  check_activation(activation, slope, !x.has_value(), std::string("syncbn.") + who);
  if (residual.has_value() && x.has_value())
    fail(std::string("syncbn.") + who + ": a residual is read by the in-place backward only (input None: x "
         "recovered from out and the residual); with the input, pass residual None");
  if (residual.has_value() && no_residual)
    fail(std::string("syncbn.") + who + ": no_residual is True and a residual is given (no_residual says the "
         "forward had none)");
  check_residual(base, residual, who, "out");
  if (!out.has_value() && activation != sbnActivationIdentity)
    fail(std::string("syncbn.") + who + ": out is None: " + act_name(activation) +
         "'s gradient needs the forward's output");
  same_device(base, "grad_out", dy, who);
  same_device(base, "stats", stats, who);
  per_channel(base, "weight", weight, who);
  per_channel(base, "bias", bias, who);
  const char* base_name = x.has_value() ? "input" : "out";
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"grad_out", &dy},
                         std::pair<const char*, const Tensor*>{"out", out.has_value() ? &*out : nullptr}})
    if (t != nullptr && (t->sizes() != base.sizes() || t->scalar_type() != base.scalar_type()))
      fail(std::string("syncbn.") + who + ": " + name + " is " + dtype_name(t->scalar_type()) + " " +
           shape_str(t->sizes()) + "; the " + base_name + " is " + dtype_name(base.scalar_type()) + " " +
           shape_str(base.sizes()));
  if (out.has_value()) same_device(base, "out", out, who);
  if (stats.dim() != 2 || stats.size(0) != 2 || stats.size(1) != base.size(1) || stats.scalar_type() != at::kFloat)
    fail(std::string("syncbn.") + who + ": stats must be float32 (2, " + std::to_string(base.size(1)) +
         ") (the forward's), got " + dtype_name(stats.scalar_type()) + " " + shape_str(stats.sizes()));
}

Tensor like_x(const Tensor& t, sbnLayout_t layout, const Tensor& x) {
  return layout == sbnLayoutNHWC ? t.contiguous(*channels_last(x)) : t.contiguous();
}

std::tuple<Tensor, Tensor, Tensor> act_backward_kernel(const Tensor& grad_out, const optional<Tensor>& input,
                                                       const optional<Tensor>& out, const optional<Tensor>& weight,
                                                       const optional<Tensor>& bias, const Tensor& stats, double eps,
                                                       int64_t comm, int64_t activation, double slope,
                                                       bool input_grad, bool residual_grad, bool weight_grad,
                                                       bool no_residual, const optional<Tensor>& residual) {
  check_act_backward(grad_out, input, out, weight, bias, stats, activation, slope, residual, no_residual);
  optional<Tensor> x, y;
  sbnLayout_t layout;
  Tensor base;
  if (input.has_value()) {
    std::tie(base, layout) = dense(*input);
    x = base;
  } else {
    std::tie(base, layout) = dense(*out);
  }
  const CommEntry c = find_comm(comm, base, "batch_norm_act_backward");
  const Tensor dy = like_x(grad_out, layout, base);
  if (out.has_value()) y = input.has_value() ? like_x(*out, layout, base) : base;
  Tensor dx = input_grad ? at::empty_like(base) : base.new_empty({0});
  Tensor dz = residual_grad ? at::empty_like(base) : base.new_empty({0});
  const bool dwb_wanted = weight_grad && weight.has_value();
  Tensor dwb = dwb_wanted ? base.new_empty({2, base.size(1)}, base.options().dtype(at::kFloat))
                          : base.new_empty({0}, base.options().dtype(at::kFloat));
  Tensor st = stats.contiguous();
  optional<Tensor> w32 = f32(weight);
  // the bias: read by the in-place backward (x from out) and by the mask from x
  // (no_residual: the sign of the forward's batch_norm(x)); a weight without one: 0
  optional<Tensor> b32 = !input.has_value() || no_residual ? f32_bias(weight, bias) : std::nullopt;
  const sbnTensorDesc_t d = desc(base, layout);
  const sbnParams_t p = params(eps, 0.1);
  const sbnEpilogue_t e = epilogue(activation, slope, no_residual);
  const float* sp = st.data_ptr<float>();
  float* dwp = dwb_wanted ? dwb.data_ptr<float>() : nullptr;
  // the in-place backward of a forward with a residual takes (y, z) where sbnBackwardEx
  // takes (x, y): the same arguments after them
  const bool inplace_z = residual.has_value();
  const auto fn = inplace_z ? api.backward_inplace_ex : api.backward_ex;
  const void* a0 = inplace_z ? ptr<const void>(y) : ptr<const void>(x);
  const void* a1 = inplace_z ? residual->data_ptr() : ptr<const void>(y);
  call_comm(c, inplace_z ? "syncbn.batch_norm_act_backward (sbnBackwardInPlaceEx)"
                         : "syncbn.batch_norm_act_backward (sbnBackwardEx)",
            [&](sbnComm_t h) {
              return fn(h, &d, a0, a1, dy.data_ptr(), input_grad ? dx.data_ptr() : nullptr,
                        residual_grad ? dz.data_ptr() : nullptr, ptr<const float>(w32), ptr<const float>(b32), sp,
                        sp + base.size(1), dwp, dwp ? dwp + base.size(1) : nullptr, &p, &e, stream_of(base));
            });
  return {dx, dz, dwb};
}

// ---- syncbn::batch_norm_act_infer ------------------------------------------------------
Tensor act_infer_kernel(const Tensor& input, const optional<Tensor>& residual, const Tensor& running_mean,
                        const Tensor& running_var, const optional<Tensor>& weight, const optional<Tensor>& bias,
                        double eps, int64_t activation, double slope) {
  const char* who = "batch_norm_act_infer";
  check_input(input, who);
  check_activation(activation, slope, false, std::string("syncbn.") + who);
  check_residual(input, residual, who);
  check_infer_args(input, running_mean, running_var, weight, bias, who);
  const sbnEpilogue_t e = epilogue(activation, slope);
  return run_infer(input, running_mean, running_var, weight, bias, [&](const InferCall& t) {
    sbnResult_t r = api.forward_inference_ex(&t.d, t.x.data_ptr(), ptr<const void>(residual), t.y.data_ptr(),
                                             ptr<const float>(t.w32), ptr<const float>(t.b32),
                                             ptr<const float>(t.rm32), ptr<const float>(t.rv32),
                                             static_cast<float>(eps), &e, stream_of(t.x));
    if (r != sbnSuccess) fail_call(r, "syncbn.batch_norm_act_infer (sbnForwardInferenceEx)", nullptr);
  });
}

// ---- autograd --------------------------------------------------------------------------
// The operators below autograd go through the dispatcher (not the kernels above), so
// that torch.compile's fake tensors and functionalization see them.
auto& train_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow(SBN_OP("batch_norm_train"), "")
                       .typed<std::tuple<Tensor, Tensor>(const Tensor&, const optional<Tensor>&,
                                                         const optional<Tensor>&, const optional<Tensor>&,
                                                         const optional<Tensor>&, const optional<Tensor>&, double,
                                                         optional<double>, int64_t)>();
  return op;
}
auto& backward_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow(SBN_OP("batch_norm_backward"), "")
                       .typed<std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const optional<Tensor>&,
                                                         const Tensor&, double, int64_t, bool, bool)>();
  return op;
}
auto& act_train_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow(SBN_OP("batch_norm_act_train"), "")
                       .typed<std::tuple<Tensor, Tensor>(
                           const Tensor&, const optional<Tensor>&, const optional<Tensor>&, const optional<Tensor>&,
                           const optional<Tensor>&, const optional<Tensor>&, const optional<Tensor>&, double,
                           optional<double>, int64_t, int64_t, double, bool)>();
  return op;
}
auto& act_backward_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow(SBN_OP("batch_norm_act_backward"), "")
                       .typed<std::tuple<Tensor, Tensor, Tensor>(
                           const Tensor&, const optional<Tensor>&, const optional<Tensor>&, const optional<Tensor>&,
                           const optional<Tensor>&, const Tensor&, double, int64_t, int64_t, double, bool, bool,
                           bool, bool, const optional<Tensor>&)>();
  return op;
}
auto& act_infer_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow(SBN_OP("batch_norm_act_infer"), "")
                       .typed<Tensor(const Tensor&, const optional<Tensor>&, const Tensor&, const Tensor&,
                                     const optional<Tensor>&, const optional<Tensor>&, double, int64_t, double)>();
  return op;
}
auto& infer_op() {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow(SBN_OP("batch_norm_infer"), "")
                       .typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const optional<Tensor>&,
                                     const optional<Tensor>&, double)>();
  return op;
}

// The autograd nodes, written as PyTorch's generated ones are (a Node subclass, its next
// edges, its saved variables), not with torch::autograd::Function: that one's node costs
// ~1.3 us more per backward (its name is demangled on every call, and gradients are
// materialized for every output; bench/notes/torch-binding.md).
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using NodePtr = decltype(torch::autograd::Edge::function);  // std::shared_ptr or c10::intrusive_ptr

template <typename T, typename... Args>
NodePtr new_node(Args&&... args) {
  if constexpr (std::is_same_v<NodePtr, c10::intrusive_ptr<Node>>) {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  } else {
    return NodePtr(new T(std::forward<Args>(args)...));
  }
}

// What a node keeps besides its saved tensors (each node uses some of these).
struct NodeConsts {
  double eps = 0.0, slope = 0.0;
  int64_t comm = 0, activation = 0;
  bool has_bias = false;
  bool no_residual = false;  // TrainActBackward: the forward had no residual (the mask from x)
};

// The four nodes' common part. A node keeps K saved tensors (saved_; Self::kOutput[i]:
// saved_[i] is the node's own output) and its constants (k); its gradients are
// Self::run(grads, need, saved tensors, constants), a function of these alone (need[i]:
// the gradient of input i is asked for). apply runs it eagerly. Compiled autograd
// (torch._dynamo.compiled_autograd, where PyTorch has its C++ interface of 2.7 and later:
// SBN_TORCH_COMPILED_AUTOGRAD, _native.py's features()) gets the same function as the
// node's call in its graph (bound once per process, under the namespace's name), keyed on
// the constants, `need` and the slots kept; compiling the graph traces it on fake tensors, so the compiled
// backward calls the operators that eager calls (syncbn::batch_norm_backward, ...), with
// the same arguments.
template <class Self, size_t K>
struct SyncBNNode : public Node {
  std::array<SavedVariable, K> saved_;
  std::array<bool, K> kept_{};  // which slots hold a tensor (save)
  NodeConsts k;
  std::unique_ptr<CommPin> pin_;  // the comm k.comm, for the nodes whose backward calls one

  // Slot i keeps t (an undefined t: nothing).
  void save(size_t i, const Tensor& t) {
    saved_[i] = SavedVariable(t, Self::kOutput[i]);
    kept_[i] = t.defined();
  }

  std::string name() const override { return Self::kName; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (SavedVariable& v : saved_) v.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::array<Tensor, K> saved;
    for (size_t i = 0; i < K; ++i) saved[i] = Self::kOutput[i] ? saved_[i].unpack(getptr()) : saved_[i].unpack();
    return Self::run(grads, needs(), saved, k);
  }

#ifdef SBN_TORCH_COMPILED_AUTOGRAD
  // The key: the saved tensors (each a graph input) and what the graph is specialized on:
  // the constants, which gradients are asked for and which slots hold a tensor (a
  // tensor under saved_tensors_hooks adds nothing to the key, so without kept_ an
  // in-place layer's slots would be taken for a leaky one's). SBN_TORCH_MUT_KEY
  // (test_torch_ops.py's mutant) leaves those out.
  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    for (size_t i = 0; i < K; ++i) args.collect(saved_[i], Self::kOutput[i]);
#ifndef SBN_TORCH_MUT_KEY
    for (bool kept : kept_) args.collect(kept);
    args.collect(k.eps);
    args.collect(k.slope);
    args.collect(k.comm);
    args.collect(k.activation);
    args.collect(k.has_bias);
    args.collect(k.no_residual);
    args.collect(needs());
#endif
  }
  variable_list apply_with_saved(const variable_list& grads,
                                 torch::dynamo::autograd::SwapSavedVariables& swap) override {
    namespace ca = torch::dynamo::autograd;
    struct Restore {  // the tensors swapped so far back, also when a call throws
      std::array<SavedVariable, K>& saved;
      ca::SwapSavedVariables& swap;
      size_t swapped = 0;
      ~Restore() {
        for (size_t i = 0; i < swapped; ++i) swap.after(saved[i]);
      }
    } restore{saved_, swap};
    for (; restore.swapped < K; ++restore.swapped)
      swap.before(saved_[restore.swapped]);  // the graph's proxies in place of the tensors
    ca::PackedArgs args;
    args.pack(needs());
    for (const SavedVariable& v : saved_) {
      const Tensor t = v.unpack();
      args.pack(t.defined() ? optional<Tensor>(t) : std::nullopt);
    }
    args.pack(k.eps);
    args.pack(k.slope);
    args.pack(k.comm);
    args.pack(k.activation);
    args.pack(k.has_bias);
    args.pack(k.no_residual);
    const auto& py = ca::getPyCompilerInterface();
    static std::once_flag bound;
    static std::string fn_name;
    std::call_once(bound, [&] {
      std::vector<at::TypePtr> schema{ca::IValuePacker<std::vector<bool>>::packed_type()};
      for (size_t i = 0; i < K; ++i) schema.push_back(ca::IValuePacker<optional<Tensor>>::packed_type());
      for (const at::TypePtr& t : std::initializer_list<at::TypePtr>{
               at::FloatType::get(), at::FloatType::get(), at::IntType::get(), at::IntType::get(), at::BoolType::get(),
               at::BoolType::get()})
        schema.push_back(t);  // eps, slope, comm, activation, has_bias, no_residual
      fn_name = py->bind_function(swap.get_py_compiler(), SBN_STR(SBN_TORCH_NS) "_" + std::string(Self::kName),
                                  &run_packed, schema, /*is_custom_function=*/false, /*is_traceable=*/true);
    });
    const at::IValue outputs =
        ca::IValuePacker<std::vector<optional<torch::autograd::InputMetadata>>>::pack(
            ca::get_input_metadata(next_edges()));
    return py->call_function(swap.get_py_compiler(), "apply_functional", fn_name, grads, args.vec(), outputs);
  }
#endif

 private:
  std::vector<bool> needs() const {
    std::vector<bool> need(num_outputs());
    for (size_t i = 0; i < need.size(); ++i) need[i] = task_should_compute_output(i);
    return need;
  }
#ifdef SBN_TORCH_COMPILED_AUTOGRAD
  // run over apply_with_saved's arguments, as the compiled graph calls it
  static variable_list run_packed(const variable_list& grads, const std::vector<at::IValue>& packed) {
    torch::dynamo::autograd::PackedArgs args(packed);
    const auto need = args.unpack<std::vector<bool>>();
    std::array<Tensor, K> saved;
    for (Tensor& t : saved) t = args.unpack<optional<Tensor>>().value_or(Tensor());
    NodeConsts c;
    c.eps = args.unpack<double>();
    c.slope = args.unpack<double>();
    c.comm = args.unpack<int64_t>();
    c.activation = args.unpack<int64_t>();
    c.has_bias = args.unpack<bool>();
    c.no_residual = args.unpack<bool>();
    return Self::run(grads, need, saved, c);
  }
#endif
};

// Whether the output gets an autograd node: grad mode on and any differentiable tensor
// argument requiring grad (a running statistic that does is refused: no_stats_grad).
bool any_requires_grad(std::initializer_list<const optional<Tensor>*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const optional<Tensor>* t : ts)
    if (t->has_value() && (*t)->requires_grad()) return true;
  return false;
}

// create_graph=True: the gradients computed here get an Error node, so that
// differentiating them raises (as autograd.Function's once_differentiable does) instead
// of giving a second derivative that leaves this backward out.
// inputs: what the backward computed its gradients from (the incoming gradient, x or the
// saved output, the weight; undefined ones allowed): where one requires grad, the node,
// whose edges they are, so that a second derivative taken to any of them reaches it.
void once_differentiable(variable_list& outputs, const variable_list& inputs) {
  if (!at::GradMode::is_enabled()) return;
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return;
  NodePtr err = new_node<torch::autograd::Error>(
      "syncbn.torch.SyncBatchNorm's backward is not differentiable (no double backward through it: "
      "a second derivative of a training layer, through create_graph=True or nested torch.func "
      "transforms)",
      torch::autograd::collect_next_edges(inputs));
  // The gradients are the backward operators' fresh outputs, each given the node as it is:
  // not through detach(), which under nested torch.func transforms runs at every level and
  // cut the outer levels' history (the backward operator's own node there: a second
  // derivative of 0 instead of this error). An output that is one of the inputs (none is
  // today) goes on an alias, so that a tensor the caller holds keeps its history (detach(),
  // not tensor_data(): under vmap a gradient is a batched tensor, whose tensor_data()
  // raises "accessing 'data' under vmap transform is not allowed").
  for (Tensor& t : outputs) {
    if (!t.defined()) continue;
    for (const Tensor& in : inputs)
      if (in.defined() && t.is_same(in)) {
        t = t.detach();
        break;
      }
    torch::autograd::set_history(t, err);
  }
}

// Gradients of batch_norm_train's out, to (input, weight, bias): sbnBackward.
// Saved: the input, the weight, stats.
struct TrainBackward : public SyncBNNode<TrainBackward, 3> {
  static constexpr const char* kName = "SyncBatchNormBackward";
  static constexpr std::array<bool, 3> kOutput{false, false, false};

  static variable_list run(const variable_list& grads, const std::vector<bool>& need,
                           const std::array<Tensor, 3>& saved, const NodeConsts& k) {
    const Tensor &x = saved[0], &weight = saved[1], &stats = saved[2];
    // the next edges: input (0), weight (1), bias (2)
    const bool need_x = need[0];
    const bool need_w = weight.defined() && need[1];
    const bool need_b = k.has_bias && need[2];
    const bool want_w = need_w || need_b;
    const optional<Tensor> w = weight.defined() ? optional<Tensor>(weight) : std::nullopt;
    at::AutoDispatchBelowADInplaceOrView below;  // also for the two views below: no autograd there
    const Tensor dy = grads[0].defined() ? grads[0] : at::zeros_like(x);  // out unused: its gradient is 0
    auto [dx, dwb] = backward_op().call(dy, x, w, stats, k.eps, k.comm, need_x, want_w);
    Tensor dw, db;
    if (want_w) {
      if (weight.scalar_type() != at::kFloat) dwb = dwb.to(weight.scalar_type());
      if (need_w) dw = dwb.select(0, 0);
      if (need_b) db = dwb.select(0, 1);
    }
    variable_list out{need_x ? dx : Tensor(), dw, db};
    once_differentiable(out, {dy, x, weight});
    return out;
  }
};

void bump(const optional<Tensor>& t) {
  if (t.has_value() && !t->is_inference()) torch::autograd::impl::bump_version(*t);
}

std::tuple<Tensor, Tensor> train_autograd(const Tensor& x, const optional<Tensor>& weight,
                                          const optional<Tensor>& bias, const optional<Tensor>& rm,
                                          const optional<Tensor>& rv, const optional<Tensor>& nbt, double eps,
                                          optional<double> momentum, int64_t comm) {
  const optional<Tensor> xo(x);
  const bool grad = any_requires_grad({&xo, &weight, &bias});
  no_forward_ad("batch_norm_train", {&xo, &weight, &bias});
  no_stats_grad("batch_norm_train", rm, rv);
  Tensor y, stats;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    std::tie(y, stats) = train_op().call(x, weight, bias, rm, rv, nbt, eps, momentum, comm);
  }
  if (grad) {  // stats: not differentiable (no history)
    NodePtr node = new_node<TrainBackward>();
    auto* n = static_cast<TrainBackward*>(node.get());
    n->set_next_edges(torch::autograd::collect_next_edges(x, weight, bias));
    n->save(0, x);
    n->save(1, weight.has_value() ? *weight : Tensor());
    n->save(2, stats);
    n->k.eps = eps;
    n->k.comm = comm;
    n->pin_ = std::make_unique<CommPin>(comm);
    n->k.has_bias = bias.has_value();
    torch::autograd::set_history(y, node);
  }
  // version counters of what the library wrote in place (autograd's check that a
  // tensor saved for a backward was not modified since)
  bump(rm);
  bump(rv);
  bump(nbt);
  return {y, stats};
}

std::tuple<Tensor, Tensor> backward_autograd(const Tensor& dy, const Tensor& x, const optional<Tensor>& weight,
                                             const Tensor& stats, double eps, int64_t comm, bool input_grad,
                                             bool weight_grad) {
  // Reached with inputs that require grad under torch.func's grad transforms (grad, vjp,
  // jacrev run the layer's backward with create_graph=True, at their level): the
  // gradients, with once_differentiable's node, as the node's eager backward gives them
  // under create_graph=True; a second derivative raises there.
  std::tuple<Tensor, Tensor> r;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    r = backward_op().call(dy, x, weight, stats, eps, comm, input_grad, weight_grad);
  }
  variable_list out{std::get<0>(r), std::get<1>(r)};
  once_differentiable(out, {dy, x, weight.has_value() ? *weight : Tensor()});
  return {out[0], out[1]};
}

// The eval batch norm's gradients, with torch ops, for g (float32): the gradient reaching
// the normalization; the running statistics are constants, so they are local. Each only
// when asked for.
struct InferGrads {
  Tensor dx, dw, db;
};
InferGrads infer_grads(const Tensor& g, const Tensor& x, const Tensor& rm, const Tensor& rv, const Tensor& w,
                       double eps, bool need_x, bool need_w, bool need_b) {
  std::vector<int64_t> shape(x.dim(), 1), dims{0};
  shape[1] = -1;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  const Tensor scale = (rv.to(at::kFloat) + eps).rsqrt();
  InferGrads r;
  if (need_x) {
    const Tensor k = w.defined() ? scale * w.to(at::kFloat) : scale;
    r.dx = (g * k.view(shape)).to(x.scalar_type());
  }
  if (need_w) {
    const Tensor xhat = (x.to(at::kFloat) - rm.to(at::kFloat).view(shape)) * scale.view(shape);
    r.dw = (g * xhat).sum(dims).to(w.scalar_type());
  }
  if (need_b) r.db = g.sum(dims).to(w.scalar_type());
  return r;
}

// An evaluated layer's gradients where the backward builds a graph (create_graph) from a
// source that requires grad: each requires grad, as nn.BatchNorm's do; one computed from
// none of those is a fresh leaf, an alias (_ops.py's _grads_require_grad says why).
// Under a torch.func transform or with batched gradients (is_grads_batched), as they are:
// requires_grad sees one level only there, and a fresh leaf would cut an outer level's
// graph (jacrev of jacrev gave zeros), or has no batching rule (detach).
void grads_require_grad(variable_list& grads, std::initializer_list<const Tensor*> sources) {
  if (!at::GradMode::is_enabled()) return;
  bool any = false;
  for (const Tensor* t : sources) any = any || (t->defined() && t->requires_grad());
  if (!any) return;
  if (c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode)) return;
  const c10::DispatchKeySet wrapped({c10::DispatchKey::Batched, c10::DispatchKey::FuncTorchBatched,
                                     c10::DispatchKey::FuncTorchGradWrapper});
  for (const Tensor* t : sources)
    if (t->defined() && t->key_set().has_any(wrapped)) return;
  for (const Tensor& t : grads)
    if (t.defined() && t.key_set().has_any(wrapped)) return;
  for (Tensor& t : grads)
    if (t.defined() && !t.requires_grad()) t = t.detach().requires_grad_(true);
}

// Gradients of batch_norm_infer to (input, weight, bias): infer_grads.
// Saved: the input, the running mean and variance, the weight.
struct InferBackward : public SyncBNNode<InferBackward, 4> {
  static constexpr const char* kName = "SyncBatchNormInferBackward";
  static constexpr std::array<bool, 4> kOutput{false, false, false, false};

  static variable_list run(const variable_list& grads, const std::vector<bool>& need,
                           const std::array<Tensor, 4>& saved, const NodeConsts& k) {
    const Tensor &x = saved[0], &rm = saved[1], &rv = saved[2], &w = saved[3];
    const Tensor g = grads[0].defined() ? grads[0].to(at::kFloat) : at::zeros_like(x, at::kFloat);  // out unused
    const InferGrads r =
        infer_grads(g, x, rm, rv, w, k.eps, need[0], w.defined() && need[1], k.has_bias && need[2]);
    variable_list out{r.dx, r.dw, r.db};  // torch ops: differentiable (create_graph), as nn.BatchNorm2d's
    grads_require_grad(out, {&grads[0], &x, &w});
    return out;
  }
};

Tensor infer_autograd(const Tensor& x, const Tensor& rm, const Tensor& rv, const optional<Tensor>& weight,
                      const optional<Tensor>& bias, double eps) {
  const optional<Tensor> xo(x), rmo(rm), rvo(rv);
  const bool grad = any_requires_grad({&xo, &weight, &bias});
  no_forward_ad("batch_norm_infer", {&xo, &weight, &bias});
  no_stats_grad("batch_norm_infer", rmo, rvo);
  Tensor y;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    y = infer_op().call(x, rm, rv, weight, bias, eps);
  }
  if (grad) {
    NodePtr node = new_node<InferBackward>();
    auto* n = static_cast<InferBackward*>(node.get());
    n->set_next_edges(torch::autograd::collect_next_edges(x, weight, bias));
    n->save(0, x);
    n->save(1, rm);
    n->save(2, rv);
    n->save(3, weight.has_value() ? *weight : Tensor());
    n->k.eps = eps;
    n->k.has_bias = bias.has_value();
    torch::autograd::set_history(y, node);
  }
  return y;
}

// ---- the fused operators' autograd --------------------------------------------------------
optional<Tensor> opt(const Tensor& t) { return t.defined() ? optional<Tensor>(t) : std::nullopt; }

// Gradients of batch_norm_act_train's out, to (input, residual, weight, bias):
// sbnBackwardEx. It keeps the input and (for an activation) out; in place: out and the
// bias (the input comes back from them), and the residual where the forward had one
// (sbnBackwardInPlaceEx: x from out and the residual). A ReLU or leaky ReLU forward
// without a residual (not in place) keeps the bias too, and its backward passes
// no_residual (the mask from x, which reads the bias).
// Saved: the input, out (the node's output), the weight, the bias, stats, the residual.
struct TrainActBackward : public SyncBNNode<TrainActBackward, 6> {
  static constexpr const char* kName = "SyncBatchNormActBackward";
  static constexpr std::array<bool, 6> kOutput{false, true, false, false, false, false};

  static variable_list run(const variable_list& grads, const std::vector<bool>& need,
                           const std::array<Tensor, 6>& saved, const NodeConsts& k) {
    const Tensor &x = saved[0], &y = saved[1], &weight = saved[2], &bias = saved[3], &stats = saved[4],
                 &z = saved[5];
    // the next edges: input (0), residual (1), weight (2), bias (3)
    const bool need_x = need[0];
    const bool need_z = need[1];
    const bool need_w = weight.defined() && need[2];
    const bool need_b = k.has_bias && need[3];
    const bool want_w = need_w || need_b;
    at::AutoDispatchBelowADInplaceOrView below;
    const Tensor& shape_of = x.defined() ? x : y;
    const Tensor dy = grads[0].defined() ? grads[0] : at::zeros_like(shape_of);  // out unused: its gradient is 0
    auto [dx, dz, dwb] = act_backward_op().call(dy, opt(x), opt(y), opt(weight), opt(bias), stats, k.eps, k.comm,
                                                k.activation, k.slope, need_x, need_z, want_w, k.no_residual,
                                                opt(z));
    Tensor dw, db;
    if (want_w) {
      if (weight.scalar_type() != at::kFloat) dwb = dwb.to(weight.scalar_type());
      if (need_w) dw = dwb.select(0, 0);
      if (need_b) db = dwb.select(0, 1);
    }
    variable_list out{need_x ? dx : Tensor(), need_z ? dz : Tensor(), dw, db};
    once_differentiable(out, {dy, shape_of, weight});
    return out;
  }
};

std::tuple<Tensor, Tensor> act_train_autograd(const Tensor& x, const optional<Tensor>& z,
                                              const optional<Tensor>& weight, const optional<Tensor>& bias,
                                              const optional<Tensor>& rm, const optional<Tensor>& rv,
                                              const optional<Tensor>& nbt, double eps, optional<double> momentum,
                                              int64_t comm, int64_t activation, double slope, bool inplace) {
  const optional<Tensor> xo(x);
  const bool grad = any_requires_grad({&xo, &z, &weight, &bias});
  no_forward_ad("batch_norm_act_train", {&xo, &z, &weight, &bias});
  no_stats_grad("batch_norm_act_train", rm, rv);
  Tensor y, stats;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    std::tie(y, stats) =
        act_train_op().call(x, z, weight, bias, rm, rv, nbt, eps, momentum, comm, activation, slope, inplace);
  }
  if (grad) {  // stats: not differentiable (no history)
    NodePtr node = new_node<TrainActBackward>();
    auto* n = static_cast<TrainActBackward*>(node.get());
    n->set_next_edges(torch::autograd::collect_next_edges(x, z, weight, bias));
    torch::autograd::set_history(y, node);
    // the mask from x: a forward without a residual, of its own weight and bias
    const bool no_residual = !inplace && activation != sbnActivationIdentity && !z.has_value();
    if (!inplace) n->save(0, x);
    if (inplace || activation != sbnActivationIdentity) n->save(1, y);  // out: after set_history
    n->save(2, weight.has_value() ? *weight : Tensor());
    if (inplace || no_residual) n->save(3, bias.has_value() ? *bias : Tensor());
    n->save(4, stats);
    n->save(5, inplace && z.has_value() ? *z : Tensor());  // x comes back from out and z
    n->k.eps = eps;
    n->k.slope = slope;
    n->k.comm = comm;
    n->pin_ = std::make_unique<CommPin>(comm);
    n->k.activation = activation;
    n->k.has_bias = bias.has_value();
    n->k.no_residual = no_residual;
  }
  bump(rm);
  bump(rv);
  bump(nbt);
  return {y, stats};
}

std::tuple<Tensor, Tensor, Tensor> act_backward_autograd(const Tensor& dy, const optional<Tensor>& x,
                                                         const optional<Tensor>& out, const optional<Tensor>& weight,
                                                         const optional<Tensor>& bias, const Tensor& stats, double eps,
                                                         int64_t comm, int64_t activation, double slope,
                                                         bool input_grad, bool residual_grad, bool weight_grad,
                                                         bool no_residual, const optional<Tensor>& residual) {
  // as backward_autograd
  std::tuple<Tensor, Tensor, Tensor> r;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    r = act_backward_op().call(dy, x, out, weight, bias, stats, eps, comm, activation, slope, input_grad,
                               residual_grad, weight_grad, no_residual, residual);
  }
  const auto val = [](const optional<Tensor>& t) { return t.has_value() ? *t : Tensor(); };
  variable_list grads{std::get<0>(r), std::get<1>(r), std::get<2>(r)};
  once_differentiable(grads, {dy, x.has_value() ? *x : val(out), val(weight)});
  return {grads[0], grads[1], grads[2]};
}

// g * act'(out), PyTorch's rules and ops (_fused.act_grad): ReLU 0 where out <= 0 (NaN
// passes), leaky ReLU slope where out <= 0; differentiable as PyTorch's (to out: zeros).
Tensor act_grad(const Tensor& g, const Tensor& out, int64_t activation, double slope) {
  if (activation == sbnActivationRelu) return at::threshold_backward(g, out.to(g.scalar_type()), 0);
  if (activation == sbnActivationLeakyRelu)
    return at::leaky_relu_backward(g, out.to(g.scalar_type()), slope, /*self_is_result=*/false);
  return g;
}

// Gradients of batch_norm_act_infer to (input, residual, weight, bias): infer_grads of
// the activation's gradient, which is also the residual's.
// Saved: the input, out (the node's output), the running mean and variance, the weight.
struct InferActBackward : public SyncBNNode<InferActBackward, 5> {
  static constexpr const char* kName = "SyncBatchNormActInferBackward";
  static constexpr std::array<bool, 5> kOutput{false, true, false, false, false};

  static variable_list run(const variable_list& grads, const std::vector<bool>& need,
                           const std::array<Tensor, 5>& saved, const NodeConsts& k) {
    const Tensor &x = saved[0], &y = saved[1], &rm = saved[2], &rv = saved[3], &w = saved[4];
    const Tensor g0 = grads[0].defined() ? grads[0].to(at::kFloat) : at::zeros_like(x, at::kFloat);  // out unused
    const Tensor g = act_grad(g0, y, k.activation, k.slope);
    // the next edges: input (0), residual (1), weight (2), bias (3)
    const InferGrads r =
        infer_grads(g, x, rm, rv, w, k.eps, need[0], w.defined() && need[2], k.has_bias && need[3]);
    Tensor dz;
    if (need[1]) dz = g.to(x.scalar_type());
    // as PyTorch's relu(batch_norm(x) + z): g (the residual's gradient) is computed from
    // the incoming gradient and out; the batch norm's from g, x and the weight
    variable_list gz{dz}, out{r.dx, r.dw, r.db};  // torch ops: differentiable, as InferBackward's
    grads_require_grad(gz, {&grads[0], &y});
    grads_require_grad(out, {&grads[0], &y, &x, &w});
    return {out[0], gz[0], out[1], out[2]};
  }
};

Tensor act_infer_autograd(const Tensor& x, const optional<Tensor>& z, const Tensor& rm, const Tensor& rv,
                          const optional<Tensor>& weight, const optional<Tensor>& bias, double eps,
                          int64_t activation, double slope) {
  const optional<Tensor> xo(x), rmo(rm), rvo(rv);
  const bool grad = any_requires_grad({&xo, &z, &weight, &bias});
  no_forward_ad("batch_norm_act_infer", {&xo, &z, &weight, &bias});
  no_stats_grad("batch_norm_act_infer", rmo, rvo);
  Tensor y;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    y = act_infer_op().call(x, z, rm, rv, weight, bias, eps, activation, slope);
  }
  if (grad) {
    NodePtr node = new_node<InferActBackward>();
    auto* n = static_cast<InferActBackward*>(node.get());
    n->set_next_edges(torch::autograd::collect_next_edges(x, z, weight, bias));
    torch::autograd::set_history(y, node);
    n->save(0, x);
    if (activation != sbnActivationIdentity) n->save(1, y);  // out: after set_history
    n->save(2, rm);
    n->save(3, rv);
    n->save(4, weight.has_value() ? *weight : Tensor());
    n->k.eps = eps;
    n->k.slope = slope;
    n->k.activation = activation;
    n->k.has_bias = bias.has_value();
  }
  return y;
}

}  // namespace

// The schemas: _ops.py's _SCHEMAS (test_torch_ops.py compares them).
SBN_LIBRARY(SBN_TORCH_NS, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  m.def(
      "batch_norm_train(Tensor input, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
      "Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked, float eps, float? momentum, "
      "int comm) -> (Tensor out, Tensor stats)",
      tags);
  m.def(
      "batch_norm_backward(Tensor grad_out, Tensor input, Tensor? weight, Tensor stats, float eps, int comm, "
      "bool input_grad, bool weight_grad) -> (Tensor grad_input, Tensor grad_weight_bias)",
      tags);
  m.def(
      "batch_norm_infer(Tensor input, Tensor running_mean, Tensor running_var, Tensor? weight, Tensor? bias, "
      "float eps) -> Tensor",
      tags);
  // the fused operators: _fused.py's SCHEMAS
  m.def(
      "batch_norm_act_train(Tensor input, Tensor? residual, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
      "Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked, float eps, float? momentum, int comm, "
      "int activation, float slope, bool inplace) -> (Tensor out, Tensor stats)",
      tags);
  m.def(
      "batch_norm_act_backward(Tensor grad_out, Tensor? input, Tensor? out, Tensor? weight, Tensor? bias, "
      "Tensor stats, float eps, int comm, int activation, float slope, bool input_grad, bool residual_grad, "
      "bool weight_grad, bool no_residual=False, Tensor? residual=None) -> (Tensor grad_input, Tensor grad_residual, "
      "Tensor grad_weight_bias)",
      tags);
  m.def(
      "batch_norm_act_infer(Tensor input, Tensor? residual, Tensor running_mean, Tensor running_var, "
      "Tensor? weight, Tensor? bias, float eps, int activation, float slope) -> Tensor",
      tags);
}

SBN_LIBRARY_IMPL(SBN_TORCH_NS, CPU, m) {
  m.impl("batch_norm_train", &train_kernel);
  m.impl("batch_norm_backward", &backward_kernel);
  m.impl("batch_norm_infer", &infer_kernel);
  m.impl("batch_norm_act_train", &act_train_kernel);
  m.impl("batch_norm_act_backward", &act_backward_kernel);
  m.impl("batch_norm_act_infer", &act_infer_kernel);
}

SBN_LIBRARY_IMPL(SBN_TORCH_NS, CUDA, m) {
  m.impl("batch_norm_train", &train_kernel);
  m.impl("batch_norm_backward", &backward_kernel);
  m.impl("batch_norm_infer", &infer_kernel);
  m.impl("batch_norm_act_train", &act_train_kernel);
  m.impl("batch_norm_act_backward", &act_backward_kernel);
  m.impl("batch_norm_act_infer", &act_infer_kernel);
}

#ifndef SBN_TORCH_NO_AUTOGRAD
SBN_LIBRARY_IMPL(SBN_TORCH_NS, Autograd, m) {
  m.impl("batch_norm_train", &train_autograd);
  m.impl("batch_norm_backward", &backward_autograd);
  m.impl("batch_norm_infer", &infer_autograd);
  m.impl("batch_norm_act_train", &act_train_autograd);
  m.impl("batch_norm_act_backward", &act_backward_autograd);
  m.impl("batch_norm_act_infer", &act_infer_autograd);
}
#endif

// ---- what _native.py calls through ctypes ------------------------------------------------
extern "C" {
__attribute__((visibility("default"))) int sbn_torch_bind(void* forward_train, void* backward,
                                                          void* forward_inference, void* last_error,
                                                          void* error_string, void* result_name,
                                                          void* comm_destroy, void* forward_train_ex,
                                                          void* backward_ex, void* forward_inference_ex,
                                                          void* backward_inplace_ex) {
  api.comm_destroy = reinterpret_cast<decltype(&sbnCommDestroy)>(comm_destroy);
  api.forward_train = reinterpret_cast<decltype(&sbnForwardTrain)>(forward_train);
  api.backward = reinterpret_cast<decltype(&sbnBackward)>(backward);
  api.forward_inference = reinterpret_cast<decltype(&sbnForwardInference)>(forward_inference);
  api.last_error = reinterpret_cast<decltype(&sbnGetLastError)>(last_error);
  api.error_string = reinterpret_cast<decltype(&sbnGetErrorString)>(error_string);
  api.result_name = reinterpret_cast<decltype(&sbnGetResultName)>(result_name);
  api.forward_train_ex = reinterpret_cast<decltype(&sbnForwardTrainEx)>(forward_train_ex);
  api.backward_ex = reinterpret_cast<decltype(&sbnBackwardEx)>(backward_ex);
  api.forward_inference_ex = reinterpret_cast<decltype(&sbnForwardInferenceEx)>(forward_inference_ex);
  api.backward_inplace_ex = reinterpret_cast<decltype(&sbnBackwardInPlaceEx)>(backward_inplace_ex);
  return SBN_VERSION_CODE;
}

// syncbn.Comm hands over a live comm: from now on it is destroyed here (sbn_torch_comm_drop).
__attribute__((visibility("default"))) void sbn_torch_comm_put(int64_t id, void* handle, int host,
                                                               const char* transport) {
  std::lock_guard<std::mutex> lock(comms_mutex);
  // handed over already: kept (a second owner would destroy the live comm as it replaced it)
  if (comms.count(id) != 0) return;
  auto owner = std::make_shared<CommOwner>();
  owner->handle = static_cast<sbnComm_t>(handle);
  comms.emplace(id, CommEntry{std::move(owner), host != 0, transport});
}

// syncbn.Comm's destroy: the comm leaves the table (calls from now on say it was
// destroyed) and is destroyed now if no call is using it: returns sbnCommDestroy's result
// (sbnInvalidUsage: refused, the comm in the table as it was: destroy_entry);
// else when the last such call returns: -1. -2: not in the table (the caller destroys it).
// collected (Python collected the syncbn.Comm): while an autograd node that will call the
// comm lives (CommPin), it stays, and the last such node destroys it: -3.
__attribute__((visibility("default"))) int sbn_torch_comm_drop(int64_t id, int collected) {
  std::unique_lock<std::mutex> lock(comms_mutex);
  auto it = comms.find(id);
  if (it == comms.end()) return -2;
  if (it->second.destroying) return -1;  // another thread's destroy of it runs
  if (collected && it->second.pins > 0) {
    it->second.collected = true;
    return -3;
  }
  return destroy_entry(lock, id);
}

// syncbn.Comm._serialize_calls: the operators' calls on comm `id` one at a time from now
// on (a team of one that threads share); 0 when it is not in the table.
__attribute__((visibility("default"))) int sbn_torch_comm_serial(int64_t id) {
  std::lock_guard<std::mutex> lock(comms_mutex);
  auto it = comms.find(id);
  if (it == comms.end()) return 0;
  if (!it->second.serial) it->second.serial = std::make_shared<std::mutex>();
  return 1;
}

// Whether the comm `id` is in the table (live): tests see that a collected comm lives
// while a node pins it, and not after.
__attribute__((visibility("default"))) int sbn_torch_comm_live(int64_t id) {
  std::lock_guard<std::mutex> lock(comms_mutex);
  return comms.count(id) ? 1 : 0;
}
}
