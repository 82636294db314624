// fusekit._fusekit: the Python face of the C++ API (nanobind). Thin on purpose: each function
// turns its array arguments into TensorViews without copying (DLPack or the buffer protocol, so
// NumPy arrays and torch CPU tensors alike), makes the operator's problem, plans it, runs it with
// the GIL released, and turns a refused call into a Python exception carrying the library's
// message. Nothing here validates what the C++ API validates; what it checks is what only Python
// can get wrong: an object that is not an array, a device other than the CPU, a dtype the
// library has no name for, a read-only array passed for an output.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "fusekit/adam_w.h"
#include "fusekit/add_lora.h"
#include "fusekit/apply_adam_w_quant.h"
#include "fusekit/embedding_bag_lazy_adam.h"
#include "fusekit/embedding_bag_lazy_adam_quant.h"
#include "fusekit/lazy_adam.h"
#include "fusekit/lazy_adam_quant.h"
#include "fusekit/memory.h"
#include "fusekit/status.h"
#include "fusekit/tensor.h"
#include "fusekit/threading.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace fusekit::python {
namespace {

// --- errors ------------------------------------------------------------------------------------

// fusekit.Error (a ValueError) and its subclass for "valid, but nothing here runs it"; created in
// the module init, raised with the library's message and its aclnn status code.
PyObject *g_error = nullptr;
PyObject *g_no_implementation = nullptr;

[[noreturn]] void raise_status(const Status &s) {
  PyObject *type = s.code() == StatusCode::kNoImplementation ? g_no_implementation
                   : s.code() == StatusCode::kRuntimeError   ? PyExc_RuntimeError
                                                             : g_error;
  PyObject *args = Py_BuildValue("(s)", s.message().c_str());
  PyObject *exc = PyObject_CallObject(type, args);
  Py_XDECREF(args);
  if (exc != nullptr) {
    PyObject *code = PyLong_FromLong(s.raw_code());
    PyObject_SetAttrString(exc, "code", code);
    Py_XDECREF(code);
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
  }
  throw nb::python_error();
}

[[noreturn]] void raise_value(const std::string &message) {
  raise_status(Status::Invalid(message));
}

// --- arrays ------------------------------------------------------------------------------------

using AnyArray = nb::ndarray<nb::ro>;

const char *dlpack_dtype_name(nb::dlpack::dtype t) {
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Float:
      return t.bits == 64   ? "float64"
             : t.bits == 32 ? "float32"
             : t.bits == 16 ? "float16"
                            : "float";
    case nb::dlpack::dtype_code::Bfloat:
      return "bfloat16";
    case nb::dlpack::dtype_code::Int:
      return t.bits == 8 ? "int8" : t.bits == 16 ? "int16" : t.bits == 32 ? "int32" : "int64";
    case nb::dlpack::dtype_code::UInt:
      return t.bits == 8 ? "uint8" : t.bits == 16 ? "uint16" : t.bits == 32 ? "uint32" : "uint64";
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    case nb::dlpack::dtype_code::Complex:
      return "complex";
    default:
      return "unknown";
  }
}

DType to_dtype(nb::dlpack::dtype t) {
  if (t.lanes != 1) return DType::kOther;
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Float:
      return t.bits == 32 ? DType::kFloat32 : t.bits == 16 ? DType::kFloat16 : DType::kOther;
    case nb::dlpack::dtype_code::Bfloat:
      return t.bits == 16 ? DType::kBFloat16 : DType::kOther;
    case nb::dlpack::dtype_code::Int:
      return t.bits == 32 ? DType::kInt32 : t.bits == 64 ? DType::kInt64 : DType::kOther;
    case nb::dlpack::dtype_code::UInt:
      return t.bits == 8 ? DType::kUInt8 : DType::kOther;
    default:
      return DType::kOther;
  }
}

const char *device_type_name(int32_t type) {
  switch (type) {
    case nb::device::cpu::value:
      return "cpu";
    case nb::device::cuda::value:
      return "cuda";
    case nb::device::cuda_host::value:
      return "cuda_host";
    case nb::device::cuda_managed::value:
      return "cuda_managed";
    case nb::device::rocm::value:
      return "rocm";
    case nb::device::metal::value:
      return "metal";
    default:
      return "a non-CPU device";
  }
}

// torch tensors are read through their own attributes (data_ptr, dtype, shape, stride): a
// DLPack export costs about 4 us a tensor, these about 0.5 us, and a step passes five tensors.
// torch's types are looked up once torch is imported (this module never imports it).
struct TorchTypes {
  bool ready = false;
  nb::object tensor, strided, float32, float16, bfloat16, int32, int64, uint8;
};

TorchTypes &torch_types() {
  static TorchTypes *t = new TorchTypes();  // never destroyed: outlives the interpreter's exit
  if (!t->ready) {
    PyObject *mods = PyImport_GetModuleDict();
    PyObject *torch = PyDict_GetItemString(mods, "torch");  // borrowed; null: not imported
    if (torch != nullptr && PyObject_HasAttrString(torch, "bfloat16")) {
      nb::handle tm(torch);
      t->tensor = tm.attr("Tensor");
      t->strided = tm.attr("strided");
      t->float32 = tm.attr("float32");
      t->float16 = tm.attr("float16");
      t->bfloat16 = tm.attr("bfloat16");
      t->int32 = tm.attr("int32");
      t->int64 = tm.attr("int64");
      t->uint8 = tm.attr("uint8");
      t->ready = true;
    }
  }
  return *t;
}

std::string py_str(nb::handle h) {
  nb::object s = nb::steal(PyObject_Str(h.ptr()));
  const char *c = s.is_valid() ? PyUnicode_AsUTF8(s.ptr()) : nullptr;
  if (c == nullptr) {
    PyErr_Clear();
    return "?";
  }
  return c;
}

bool is_torch_tensor(nb::handle obj) {
  const TorchTypes &t = torch_types();
  return t.ready && PyObject_TypeCheck(obj.ptr(), (PyTypeObject *)t.tensor.ptr());
}

// Strides of dimensions that are never stepped over (size 0 or 1, or any dimension of an empty
// array) mean nothing, and producers report anything there (NumPy and nanobind 0 for an empty
// array, torch whatever the view had): they get the row-major value, so that layout checks see
// the layout that matters.
void normalize_strides(TensorView *v) {
  int64_t numel = 1;
  for (int i = 0; i < v->ndim; ++i) numel *= v->shape[i];
  int64_t natural = 1;
  for (int i = v->ndim - 1; i >= 0; --i) {
    if (numel == 0 || v->shape[i] <= 1) v->strides[i] = natural;
    natural = v->strides[i] * (v->shape[i] > 0 ? v->shape[i] : 1);
  }
}

TensorView torch_view_of(nb::handle obj, const char *fn, const char *name) {
  const TorchTypes &t = torch_types();
  if (!nb::cast<bool>(obj.attr("is_cpu"))) {
    raise_value(std::string(fn) + ": " + name + " is on " + py_str(obj.attr("device")) +
                "; fusekit runs on CPU tensors (move it with .cpu(), or keep this step on the "
                "device's own optimizer)");
  }
  if (!obj.attr("layout").is(t.strided)) {
    raise_value(std::string(fn) + ": " + name + " has layout " + py_str(obj.attr("layout")) +
                "; fusekit takes dense (strided) tensors");
  }
  nb::object dt = obj.attr("dtype");
  DType d = dt.is(t.float32)    ? DType::kFloat32
            : dt.is(t.float16)  ? DType::kFloat16
            : dt.is(t.bfloat16) ? DType::kBFloat16
            : dt.is(t.int32)    ? DType::kInt32
            : dt.is(t.int64)    ? DType::kInt64
            : dt.is(t.uint8)    ? DType::kUInt8
                                : DType::kOther;
  if (d == DType::kOther) {
    raise_value(std::string(fn) + ": " + name + " has dtype " + py_str(dt) +
                ", which fusekit does not take (float32, float16, bfloat16, int32, int64, uint8)");
  }
  nb::object shape = obj.attr("shape"), strides = obj.attr("stride")();
  const Py_ssize_t nd = PyTuple_Size(shape.ptr());
  if (nd < 0 || nd > TensorView::kMaxDims || PyTuple_Size(strides.ptr()) != nd) {
    raise_value(std::string(fn) + ": " + name + " has " + std::to_string(nd) +
                " dimensions (at most 8)");
  }
  TensorView v;
  v.dtype = d;
  v.ndim = static_cast<int>(nd);
  for (Py_ssize_t i = 0; i < nd; ++i) {
    v.shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
    v.strides[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides.ptr(), i));
  }
  v.data = reinterpret_cast<void *>(nb::cast<uintptr_t>(obj.attr("data_ptr")()));
  v.device = Device::kCpu;
  normalize_strides(&v);
  return v;
}

// One array argument, imported without a copy, as a TensorView. `writable`: the operator writes it.
TensorView view_of(nb::handle obj, const char *fn, const char *name, bool writable) {
  if (obj.is_none()) raise_value(std::string(fn) + ": " + name + " is None");
  if (is_torch_tensor(obj)) return torch_view_of(obj, fn, name);
  AnyArray a;
  if (!nb::try_cast<AnyArray>(obj, a, /*convert=*/false)) {
    raise_value(std::string(fn) + ": " + name +
                " must be an array (DLPack or the buffer protocol: "
                "a NumPy array, a torch CPU tensor), got " +
                nb::inst_name(obj).c_str());
  }
  if (a.device_type() != nb::device::cpu::value &&
      a.device_type() != nb::device::cuda_host::value) {
    raise_value(std::string(fn) + ": " + name + " is on " + device_type_name(a.device_type()) +
                "; fusekit runs on CPU tensors (move it with .cpu(), or keep this step on the "
                "device's own optimizer)");
  }
  if (writable && a.is_valid()) {
    // nb::ro accepts read-only arrays; an operator must not write one.
    nb::ndarray<> w;
    if (!nb::try_cast<nb::ndarray<>>(obj, w, false)) {
      raise_value(std::string(fn) + ": " + name + " is read-only, but the operator writes it");
    }
  }
  const DType dt = to_dtype(a.dtype());
  if (dt == DType::kOther) {
    raise_value(std::string(fn) + ": " + name + " has dtype " + dlpack_dtype_name(a.dtype()) +
                ", which fusekit does not take (float32, float16, bfloat16, int32, int64, uint8)");
  }
  if (a.ndim() > static_cast<size_t>(TensorView::kMaxDims)) {
    raise_value(std::string(fn) + ": " + name + " has " + std::to_string(a.ndim()) +
                " dimensions (at most 8)");
  }
  TensorView v;
  v.data = const_cast<void *>(a.data());
  v.dtype = dt;
  v.ndim = static_cast<int>(a.ndim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = static_cast<int64_t>(a.shape(static_cast<size_t>(i)));
    v.strides[i] = a.stride(static_cast<size_t>(i));
  }
  v.device = Device::kCpu;
  normalize_strides(&v);
  return v;
}

// --- workspace ---------------------------------------------------------------------------------

// One workspace per calling thread, grown to the largest a call has needed and kept: an optimizer
// step allocates nothing after its first call.
struct Workspace {
  void *data = nullptr;
  size_t size = 0;
  ~Workspace() { free_host(data); }
  void *get(size_t n) {
    if (n <= size) return data;
    void *p = allocate_host(n, /*huge_pages=*/true);
    if (p == nullptr)
      raise_status(Status::Runtime("fusekit: cannot allocate a workspace of " + std::to_string(n) +
                                   " bytes"));
    free_host(data);
    data = p;
    size = n;
    return data;
  }
};

void *workspace(size_t n) {
  if (n == 0) return nullptr;
  static thread_local Workspace ws;
  return ws.get(n);
}

const char *implementation_name(const std::optional<std::string> &s) {
  return s && !s->empty() ? s->c_str() : nullptr;
}

// --- the operators ----------------------------------------------------------------------------
//
// Each operator is described once, below (its tensors in the order of its C++ Tensors struct, the
// ones it writes, its attributes, how its per-run scalars are made from step and lr); from that
// description come its plan class (fusekit.LazyAdamPlan, ...: planned once, run any number of
// times on new arrays of the same layout) and its one-call function (plan and run once).

// Each tensor and attribute has its Python name (the keyword of the fusekit function) and, where
// the C++ checks call it otherwise, its aclnn name (inputM, weightDecay, ...): a refused call's
// message is rewritten to the Python names (python_names below).
struct TensorArg {
  const char *name;
  bool written;
  const char *aclnn = nullptr;  // null: the C++ messages use `name`
  bool optional = false;        // None is allowed: an empty TensorView (AddLora's weight_a)
};
template <class Options>
struct FloatAttr {
  const char *name;
  double Options::*field;
  const char *aclnn = nullptr;
};
template <class Options>
struct IntAttr {
  const char *name;
  int64_t Options::*field;
  const char *aclnn = nullptr;
  // For an option that is not an int64_t (an enum): sets it from the value, or returns the rule
  // the value breaks (the message then names the attribute and the value); field is then null.
  const char *(*set)(Options &, int64_t) = nullptr;
};

template <class Op>
struct Binding;  // one per operator

// The 8-bit optimizers' state format and lost-v guard (docs/fp8_state.md), shared by their
// bindings: state_format 0 (the dynamic maps), 1 (fp8) or 2 (fp8_ue3m5, which the operator's plan
// refuses unless it is ApplyAdamWQuant's); guard_lost_v 0 or 1.
template <class Options>
const char *set_state_format(Options &o, int64_t value) {
  if (value < 0 || value > 2) return "must be 0 (dynamic_map), 1 (fp8) or 2 (fp8_ue3m5)";
  o.state_format = static_cast<QuantStateFormat>(value);
  return nullptr;
}
template <class Options>
const char *set_guard_lost_v(Options &o, int64_t value) {
  if (value != 0 && value != 1) return "must be 0 (off) or 1 (on)";
  o.guard_lost_v = value == 1;
  return nullptr;
}

// The embedding-bag optimizers' pooling, shared by their bindings: mode 0 (sum) or 1 (mean).
template <class Options>
const char *set_pooling(Options &o, int64_t value) {
  if (value != 0 && value != 1) return "must be 0 (sum) or 1 (mean)";
  o.pooling = value == 1 ? PoolingMode::kMean : PoolingMode::kSum;
  return nullptr;
}

template <>
struct Binding<LazyAdam> {
  using Problem = LazyAdamProblem;
  using Tensors = LazyAdamTensors;
  using Options = LazyAdamOptions;
  using Stats = LazyAdamStats;
  static constexpr const char *kName = "lazy_adam";
  static constexpr TensorArg kTensors[] = {{"grad", false, "gradient"},
                                           {"indices", false},
                                           {"m", true, "inputM"},
                                           {"v", true, "inputV"},
                                           {"var", true, "inputVar"}};
  static constexpr FloatAttr<Options> kFloats[] = {{"beta1", &Options::beta1},
                                                   {"beta2", &Options::beta2},
                                                   {"eps", &Options::epsilon, "epsilon"}};
  static constexpr std::span<const IntAttr<Options>> kInts = {};
  static Tensors tensors(const TensorView *v) { return {v[0], v[1], v[2], v[3], v[4]}; }
  static Status run(const LazyAdam &plan, const Tensors &t, int64_t /*step*/, double lr, void *ws,
                    size_t bytes, Stats *stats) {
    LazyAdamScalars s;
    s.lr = static_cast<float>(lr);
    return plan.run(t, s, ws, bytes, stats);
  }
};

template <>
struct Binding<LazyAdamQuant> {
  using Problem = LazyAdamQuantProblem;
  using Tensors = LazyAdamQuantTensors;
  using Options = LazyAdamQuantOptions;
  using Stats = LazyAdamQuantStats;
  static constexpr const char *kName = "lazy_adam_quant";
  static constexpr TensorArg kTensors[] = {
      {"grad", false, "gradient"},  {"indices", false},
      {"m", true, "inputM"},        {"v", true, "inputV"},
      {"var", true, "inputVar"},    {"qmap_m", false, "qmapM"},
      {"qmap_v", false, "qmapV"},   {"absmax_m", true, "absmaxM"},
      {"absmax_v", true, "absmaxV"}};
  static constexpr FloatAttr<Options> kFloats[] = {{"beta1", &Options::beta1},
                                                   {"beta2", &Options::beta2},
                                                   {"eps", &Options::epsilon, "epsilon"}};
  static constexpr IntAttr<Options> kInts[] = {
      {"state_format", nullptr, nullptr, &set_state_format<Options>},
      {"guard_lost_v", nullptr, nullptr, &set_guard_lost_v<Options>}};
  static Tensors tensors(const TensorView *v) {
    return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]};
  }
  static Status run(const LazyAdamQuant &plan, const Tensors &t, int64_t /*step*/, double lr,
                    void *ws, size_t bytes, Stats *stats) {
    LazyAdamQuantScalars s;
    s.lr = static_cast<float>(lr);
    return plan.run(t, s, ws, bytes, stats);
  }
};

template <>
struct Binding<EmbeddingBagLazyAdam> {
  using Problem = EmbeddingBagLazyAdamProblem;
  using Tensors = EmbeddingBagLazyAdamTensors;
  using Options = EmbeddingBagLazyAdamOptions;
  using Stats = EmbeddingBagLazyAdamStats;
  static constexpr const char *kName = "embedding_bag_lazy_adam";
  static constexpr TensorArg kTensors[] = {{"grad_output", false},
                                           {"indices", false},
                                           {"offsets", false},
                                           {"per_sample_weights", false, nullptr, true},
                                           {"m", true},
                                           {"v", true},
                                           {"var", true}};
  static constexpr FloatAttr<Options> kFloats[] = {{"beta1", &Options::beta1},
                                                   {"beta2", &Options::beta2},
                                                   {"eps", &Options::epsilon, "epsilon"}};
  // mode: 0 sum, 1 mean (the pooling of the forward).
  static constexpr IntAttr<Options> kInts[] = {{"mode", nullptr, "pooling", &set_pooling<Options>}};
  static Tensors tensors(const TensorView *v) { return {v[0], v[1], v[2], v[3], v[4], v[5], v[6]}; }
  static Status run(const EmbeddingBagLazyAdam &plan, const Tensors &t, int64_t /*step*/, double lr,
                    void *ws, size_t bytes, Stats *stats) {
    EmbeddingBagLazyAdamScalars s;
    s.lr = static_cast<float>(lr);
    return plan.run(t, s, ws, bytes, stats);
  }
};

template <>
struct Binding<EmbeddingBagLazyAdamQuant> {
  using Problem = EmbeddingBagLazyAdamQuantProblem;
  using Tensors = EmbeddingBagLazyAdamQuantTensors;
  using Options = EmbeddingBagLazyAdamQuantOptions;
  using Stats = EmbeddingBagLazyAdamQuantStats;
  static constexpr const char *kName = "embedding_bag_lazy_adam_quant";
  static constexpr TensorArg kTensors[] = {{"grad_output", false},
                                           {"indices", false},
                                           {"offsets", false},
                                           {"per_sample_weights", false, nullptr, true},
                                           {"m", true},
                                           {"v", true},
                                           {"var", true},
                                           {"qmap_m", false, "qmapM"},
                                           {"qmap_v", false, "qmapV"},
                                           {"absmax_m", true},
                                           {"absmax_v", true}};
  static constexpr FloatAttr<Options> kFloats[] = {{"beta1", &Options::beta1},
                                                   {"beta2", &Options::beta2},
                                                   {"eps", &Options::epsilon, "epsilon"}};
  static constexpr IntAttr<Options> kInts[] = {
      {"mode", nullptr, "pooling", &set_pooling<Options>},
      {"state_format", nullptr, nullptr, &set_state_format<Options>},
      {"guard_lost_v", nullptr, nullptr, &set_guard_lost_v<Options>}};
  static Tensors tensors(const TensorView *v) {
    return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10]};
  }
  static Status run(const EmbeddingBagLazyAdamQuant &plan, const Tensors &t, int64_t /*step*/,
                    double lr, void *ws, size_t bytes, Stats *stats) {
    EmbeddingBagLazyAdamQuantScalars s;
    s.lr = static_cast<float>(lr);
    return plan.run(t, s, ws, bytes, stats);
  }
};

template <>
struct Binding<AdamW> {
  using Problem = AdamWProblem;
  using Tensors = AdamWTensors;
  using Options = AdamWOptions;
  using Stats = AdamWStats;
  static constexpr const char *kName = "adam_w";
  static constexpr TensorArg kTensors[] = {
      {"var", true}, {"grad", false}, {"m", true}, {"v", true}};
  static constexpr FloatAttr<Options> kFloats[] = {
      {"beta1", &Options::beta1},
      {"beta2", &Options::beta2},
      {"weight_decay", &Options::weight_decay, "weightDecay"},
      {"eps", &Options::eps},
      {"gnorm_scale", &Options::gnorm_scale, "gnormScale"}};
  // decay_before_update: 0 (the default) applies the decoupled decay after the Adam update
  // (CANN's and bitsandbytes' order), 1 before it (torch.optim.AdamW's order).
  static const char *set_decay_order(Options &o, int64_t value) {
    if (value != 0 && value != 1) {
      return "must be 0 (the decay after the update, CANN's order) or 1 (before it, "
             "torch.optim.AdamW's order)";
    }
    o.decay_order = value == 1 ? WeightDecayOrder::kBeforeUpdate : WeightDecayOrder::kAfterUpdate;
    return nullptr;
  }
  static constexpr IntAttr<Options> kInts[] = {
      {"decay_before_update", nullptr, nullptr, &set_decay_order}};
  static Tensors tensors(const TensorView *v) { return {v[0], v[1], v[2], v[3]}; }
  static Status run(const AdamW &plan, const Tensors &t, int64_t step, double lr, void * /*ws*/,
                    size_t /*bytes*/, Stats *stats) {
    AdamWScalars s;
    s.step = step;
    s.lr = static_cast<float>(lr);
    return plan.run(t, s, stats);
  }
};

template <>
struct Binding<ApplyAdamWQuant> {
  using Problem = ApplyAdamWQuantProblem;
  using Tensors = ApplyAdamWQuantTensors;
  using Options = ApplyAdamWQuantOptions;
  using Stats = ApplyAdamWQuantStats;
  static constexpr const char *kName = "apply_adam_w_quant";
  static constexpr TensorArg kTensors[] = {{"var", true, "varRef"},
                                           {"grad", false},
                                           {"m", true, "mRef"},
                                           {"v", true, "vRef"},
                                           {"qmap_m", false, "qmapM"},
                                           {"qmap_v", false, "qmapV"},
                                           {"absmax_m", true, "absmaxMRef"},
                                           {"absmax_v", true, "absmaxVRef"}};
  static constexpr FloatAttr<Options> kFloats[] = {
      {"beta1", &Options::beta1},
      {"beta2", &Options::beta2},
      {"weight_decay", &Options::weight_decay, "weightDecay"},
      {"eps", &Options::eps},
      {"gnorm_scale", &Options::gnorm_scale, "gnormScale"}};
  static constexpr IntAttr<Options> kInts[] = {
      {"block_size", &Options::block_size, "blockSize"},
      {"state_format", nullptr, nullptr, &set_state_format<Options>},
      {"guard_lost_v", nullptr, nullptr, &set_guard_lost_v<Options>}};
  static Tensors tensors(const TensorView *v) {
    return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
  }
  static Status run(const ApplyAdamWQuant &plan, const Tensors &t, int64_t step, double lr,
                    void *ws, size_t bytes, Stats *stats) {
    ApplyAdamWQuantScalars s;
    s.step = step;
    s.lr = static_cast<float>(lr);
    return plan.run(t, s, ws, bytes, stats);
  }
};

template <>
struct Binding<AddLora> {
  using Problem = AddLoraProblem;
  using Tensors = AddLoraTensors;
  using Options = AddLoraOptions;
  using Stats = AddLoraStats;
  static constexpr const char *kName = "add_lora";
  static constexpr TensorArg kTensors[] = {{"y", false},
                                           {"x", false},
                                           {"weight_b", false, "weightB"},
                                           {"indices", false},
                                           {"weight_a", false, "weightAOptional", true},
                                           {"out", true}};
  static constexpr FloatAttr<Options> kFloats[] = {{"scale", &Options::scale}};
  static constexpr IntAttr<Options> kInts[] = {
      {"layer_idx", &Options::layer_idx, "layerIdx"},
      {"y_offset", &Options::y_offset, "yOffset"},
      {"y_slice_size", &Options::y_slice_size, "ySliceSize"}};
  static Tensors tensors(const TensorView *v) { return {v[0], v[1], v[2], v[3], v[4], v[5]}; }
  static Status run(const AddLora &plan, const Tensors &t, int64_t /*step*/, double /*lr*/,
                    void *ws, size_t bytes, Stats *stats) {
    return plan.run(t, ws, bytes, stats);
  }
};

// The operator's tensors from a sequence of arrays (views, no copies; AddLora's int64 indices, as
// torch and vLLM hold them, are read as they are).
template <class Op>
typename Binding<Op>::Tensors tensors_of(nb::handle seq, const char *fn) {
  constexpr size_t n = std::size(Binding<Op>::kTensors);
  if (!PySequence_Check(seq.ptr()) || PySequence_Size(seq.ptr()) != static_cast<Py_ssize_t>(n)) {
    PyErr_Clear();
    std::string names;
    for (const TensorArg &a : Binding<Op>::kTensors)
      names += (names.empty() ? "" : ", ") + std::string(a.name);
    raise_value(std::string(fn) + ": tensors must be a sequence of " + std::to_string(n) + " (" +
                names + ")");
  }
  TensorView v[n];
  for (size_t i = 0; i < n; ++i) {
    const TensorArg &a = Binding<Op>::kTensors[i];
    nb::object item = nb::steal(PySequence_GetItem(seq.ptr(), static_cast<Py_ssize_t>(i)));
    if (!item.is_valid()) throw nb::python_error();
    if (a.optional && item.is_none()) continue;
    v[i] = view_of(item, fn, a.name, a.written);
  }
  typename Binding<Op>::Tensors t = Binding<Op>::tensors(v);
  return t;
}

// The options: the attributes by name from `attrs` (a missing one keeps the C++ default; one
// pass over the dict, keys compared as UTF-8), the thread count and the implementation's name.
template <class Op>
typename Binding<Op>::Options options_of(const nb::dict &attrs, int num_threads,
                                         const char *implementation, const char *fn) {
  using B = Binding<Op>;
  typename B::Options o;
  PyObject *key = nullptr, *value = nullptr;
  Py_ssize_t pos = 0;
  while (PyDict_Next(attrs.ptr(), &pos, &key, &value)) {
    const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : nullptr;
    bool found = false;
    for (const auto &a : B::kFloats) {
      if (k != nullptr && std::strcmp(k, a.name) == 0) {
        o.*a.field = nb::cast<double>(nb::handle(value));
        found = true;
      }
    }
    for (const auto &a : B::kInts) {
      if (k != nullptr && std::strcmp(k, a.name) == 0) {
        const auto x = nb::cast<int64_t>(nb::handle(value));
        if (a.set == nullptr) {
          o.*a.field = x;
        } else if (const char *rule = a.set(o, x); rule != nullptr) {
          raise_value(std::string(fn) + ": " + a.name + " = " + std::to_string(x) + " " + rule);
        }
        found = true;
      }
    }
    if (!found) {
      std::string known;
      for (const auto &a : B::kFloats) known += (known.empty() ? "" : ", ") + std::string(a.name);
      for (const auto &a : B::kInts) known += (known.empty() ? "" : ", ") + std::string(a.name);
      raise_value(std::string(fn) + ": unknown attribute " + py_str(key) +
                  " (this operator takes " + known + ")");
    }
  }
  o.num_threads = num_threads;
  o.implementation = implementation;
  return o;
}

// "fusekit.lazy_adam", ...: the prefix of the Python face's messages.
template <class Op>
const char *function_name() {
  static const std::string name = std::string("fusekit.") + Binding<Op>::kName;
  return name.c_str();
}

// A refused call's message in the Python names: each word (a run of letters, digits and _) that is
// the aclnn name of one of the operator's tensors or attributes becomes its Python name
// ("LazyAdam: inputM has dtype float64" -> "LazyAdam: m has dtype float64").
template <class Op>
std::string python_names(const std::string &message) {
  using B = Binding<Op>;
  const auto python_name = [](std::string_view word) -> const char * {
    for (const TensorArg &a : B::kTensors)
      if (a.aclnn != nullptr && word == a.aclnn) return a.name;
    for (const auto &a : B::kFloats)
      if (a.aclnn != nullptr && word == a.aclnn) return a.name;
    for (const auto &a : B::kInts)
      if (a.aclnn != nullptr && word == a.aclnn) return a.name;
    return nullptr;
  };
  const auto is_word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  std::string out;
  out.reserve(message.size());
  for (size_t i = 0; i < message.size();) {
    if (!is_word(message[i])) {
      out += message[i++];
      continue;
    }
    size_t j = i;
    while (j < message.size() && is_word(message[j])) ++j;
    const std::string_view word(message.data() + i, j - i);
    const char *name = python_name(word);
    out += name != nullptr ? std::string_view(name) : word;
    i = j;
  }
  return out;
}

template <class Op>
void check_op(const Status &s) {
  if (!s.ok()) raise_status(Status(s.code(), python_names<Op>(s.message())));
}

// A plan, made once from the layouts of arrays, run any number of times on arrays of the same
// layouts (new data, new addresses) with the GIL released. The workspace is the calling thread's.
template <class Op>
class PyPlan {
 public:
  PyPlan(nb::handle tensors, const nb::dict &attrs, int num_threads,
         const std::optional<std::string> &implementation)
      : PyPlan(tensors_of<Op>(tensors, function_name<Op>()), attrs, num_threads,
               implementation_name(implementation)) {}
  PyPlan(const typename Binding<Op>::Tensors &t, const nb::dict &attrs, int num_threads,
         const char *implementation) {
    const auto o = options_of<Op>(attrs, num_threads, implementation, function_name<Op>());
    typename Binding<Op>::Problem problem;  // (the plan keeps its own copy)
    check_op<Op>(Binding<Op>::Problem::make(t, o, &problem));
    check_op<Op>(Op::plan(problem, o, &plan_));
  }

  typename Binding<Op>::Stats run(nb::handle tensors, int64_t step, double lr) const {
    return run_tensors(tensors_of<Op>(tensors, function_name<Op>()), step, lr);
  }
  typename Binding<Op>::Stats run_tensors(const typename Binding<Op>::Tensors &t, int64_t step,
                                          double lr) const {
    size_t bytes = 0;
    if constexpr (requires { plan_.workspace_size(t); }) {
      bytes = plan_.workspace_size(t);  // (the batch is bound per run: EmbeddingBagLazyAdam)
    } else if constexpr (requires { plan_.workspace_size(); }) {
      bytes = plan_.workspace_size();
    }
    void *ws = workspace(bytes);  // before the GIL goes: growing it may raise
    typename Binding<Op>::Stats stats;
    Status s;
    {
      nb::gil_scoped_release release;
      s = Binding<Op>::run(plan_, t, step, lr, ws, bytes, &stats);
    }
    check_op<Op>(s);
    return stats;
  }

  const char *implementation() const { return plan_.implementation(); }

 private:
  Op plan_;
};

// One call: plan, run once.
template <class Op>
typename Binding<Op>::Stats run_once(nb::handle tensors, const nb::dict &attrs, int num_threads,
                                     const std::optional<std::string> &implementation, int64_t step,
                                     double lr) {
  const auto t = tensors_of<Op>(tensors, function_name<Op>());  // once for plan and run
  return PyPlan<Op>(t, attrs, num_threads, implementation_name(implementation))
      .run_tensors(t, step, lr);
}

template <class Op>
void bind_operator(nb::module_ &mod, const char *class_name) {
  nb::class_<PyPlan<Op>>(mod, class_name)
      .def(nb::init<nb::handle, const nb::dict &, int, const std::optional<std::string> &>(),
           "tensors"_a, "attrs"_a, "num_threads"_a = 0, "implementation"_a.none() = nb::none())
      .def("run", &PyPlan<Op>::run, "tensors"_a, "step"_a = 0, "lr"_a = 0.0)
      .def_prop_ro("implementation", &PyPlan<Op>::implementation);
  mod.def(Binding<Op>::kName, &run_once<Op>, "tensors"_a, "attrs"_a, "num_threads"_a,
          "implementation"_a.none(), "step"_a, "lr"_a);
}

// --- memory ------------------------------------------------------------------------------------

// A NumPy uint8 array of `nbytes` on fusekit's host memory (2 MiB-aligned and advised for huge
// pages when hugepages and nbytes >= 2 MiB), freed when the last view of it goes.
nb::ndarray<nb::numpy, uint8_t> empty_host(size_t nbytes, bool hugepages) {
  void *p = allocate_host(nbytes == 0 ? 1 : nbytes, hugepages);
  if (p == nullptr) {
    raise_status(Status::Runtime("fusekit.empty_host: cannot allocate " + std::to_string(nbytes) +
                                 " bytes"));
  }
  nb::capsule owner(p, [](void *q) noexcept { free_host(q); });
  const size_t shape[1] = {nbytes};
  return nb::ndarray<nb::numpy, uint8_t>(p, 1, shape, owner);
}

template <class Stats>
std::string repr_of(const char *name, std::initializer_list<std::pair<const char *, int64_t>> f) {
  std::string s = std::string(name) + "(";
  bool first = true;
  for (const auto &[k, v] : f) {
    s += (first ? "" : ", ") + std::string(k) + "=" + std::to_string(v);
    first = false;
  }
  return s + ")";
}

}  // namespace
}  // namespace fusekit::python

NB_MODULE(_fusekit, mod) {
  using namespace fusekit;
  using namespace fusekit::python;
  mod.doc() = "fusekit's C++ operators (see the fusekit package for the documented functions)";
  mod.attr("__version__") = FUSEKIT_VERSION;

  nb::object value_error = nb::borrow(PyExc_ValueError);
  nb::object not_impl = nb::borrow(PyExc_NotImplementedError);
  g_error = PyErr_NewExceptionWithDoc(
      "fusekit.Error",
      "A call fusekit refused: the message names the argument and the values; `code` is the "
      "aclnn status code (161001 null pointer, 161002 invalid argument, 561002 shape relation).",
      PyExc_ValueError, nullptr);
  mod.attr("Error") = nb::handle(g_error);
  nb::object bases = nb::make_tuple(nb::handle(g_error), not_impl);
  g_no_implementation = PyErr_NewExceptionWithDoc(
      "fusekit.NoImplementationError",
      "A valid call that no implementation built into this fusekit serves on this machine "
      "(code 561003).",
      bases.ptr(), nullptr);
  mod.attr("NoImplementationError") = nb::handle(g_no_implementation);

  nb::class_<LazyAdamStats>(mod, "LazyAdamStats")
      .def_ro("rows_updated", &LazyAdamStats::rows_updated)
      .def_ro("rows_skipped_nonfinite", &LazyAdamStats::rows_skipped_nonfinite)
      .def_ro("indices_padding", &LazyAdamStats::indices_padding)
      .def("__repr__", [](const LazyAdamStats &s) {
        return repr_of<LazyAdamStats>("LazyAdamStats",
                                      {{"rows_updated", s.rows_updated},
                                       {"rows_skipped_nonfinite", s.rows_skipped_nonfinite},
                                       {"indices_padding", s.indices_padding}});
      });
  nb::class_<LazyAdamQuantStats>(mod, "LazyAdamQuantStats")
      .def_ro("rows_updated", &LazyAdamQuantStats::rows_updated)
      .def_ro("rows_skipped_nonfinite", &LazyAdamQuantStats::rows_skipped_nonfinite)
      .def_ro("indices_padding", &LazyAdamQuantStats::indices_padding)
      .def("__repr__", [](const LazyAdamQuantStats &s) {
        return repr_of<LazyAdamQuantStats>("LazyAdamQuantStats",
                                           {{"rows_updated", s.rows_updated},
                                            {"rows_skipped_nonfinite", s.rows_skipped_nonfinite},
                                            {"indices_padding", s.indices_padding}});
      });
  nb::class_<EmbeddingBagLazyAdamStats>(mod, "EmbeddingBagLazyAdamStats")
      .def_ro("rows_updated", &EmbeddingBagLazyAdamStats::rows_updated)
      .def_ro("rows_skipped_nonfinite", &EmbeddingBagLazyAdamStats::rows_skipped_nonfinite)
      .def("__repr__", [](const EmbeddingBagLazyAdamStats &s) {
        return repr_of<EmbeddingBagLazyAdamStats>(
            "EmbeddingBagLazyAdamStats", {{"rows_updated", s.rows_updated},
                                          {"rows_skipped_nonfinite", s.rows_skipped_nonfinite}});
      });
  nb::class_<AdamWStats>(mod, "AdamWStats")
      .def_ro("elements_skipped_nonfinite", &AdamWStats::elements_skipped_nonfinite)
      .def("__repr__", [](const AdamWStats &s) {
        return repr_of<AdamWStats>("AdamWStats",
                                   {{"elements_skipped_nonfinite", s.elements_skipped_nonfinite}});
      });
  nb::class_<ApplyAdamWQuantStats>(mod, "ApplyAdamWQuantStats")
      .def_ro("blocks_updated", &ApplyAdamWQuantStats::blocks_updated)
      .def_ro("blocks_skipped_nonfinite", &ApplyAdamWQuantStats::blocks_skipped_nonfinite)
      .def("__repr__", [](const ApplyAdamWQuantStats &s) {
        return repr_of<ApplyAdamWQuantStats>(
            "ApplyAdamWQuantStats", {{"blocks_updated", s.blocks_updated},
                                     {"blocks_skipped_nonfinite", s.blocks_skipped_nonfinite}});
      });
  nb::class_<AddLoraStats>(mod, "AddLoraStats")
      .def_ro("rows_with_adapter", &AddLoraStats::rows_with_adapter)
      .def_ro("rows_without_adapter", &AddLoraStats::rows_without_adapter)
      .def_ro("prefill_groups", &AddLoraStats::prefill_groups)
      .def_ro("decode_groups", &AddLoraStats::decode_groups)
      .def("__repr__", [](const AddLoraStats &s) {
        return repr_of<AddLoraStats>("AddLoraStats",
                                     {{"rows_with_adapter", s.rows_with_adapter},
                                      {"rows_without_adapter", s.rows_without_adapter},
                                      {"prefill_groups", s.prefill_groups},
                                      {"decode_groups", s.decode_groups}});
      });

  bind_operator<LazyAdam>(mod, "LazyAdamPlan");
  bind_operator<LazyAdamQuant>(mod, "LazyAdamQuantPlan");
  bind_operator<AdamW>(mod, "AdamWPlan");
  bind_operator<ApplyAdamWQuant>(mod, "ApplyAdamWQuantPlan");
  bind_operator<AddLora>(mod, "AddLoraPlan");
  bind_operator<EmbeddingBagLazyAdam>(mod, "EmbeddingBagLazyAdamPlan");
  bind_operator<EmbeddingBagLazyAdamQuant>(mod, "EmbeddingBagLazyAdamQuantPlan");

  mod.def(
      "create_dynamic_map",
      [](bool is_signed, int max_exponent_bits) {
        const auto map = create_dynamic_map(is_signed, max_exponent_bits);
        auto *data = new float[kQuantMapSize];
        std::memcpy(data, map.data(), sizeof(float) * kQuantMapSize);
        nb::capsule owner(data, [](void *p) noexcept { delete[] static_cast<float *>(p); });
        const size_t shape[1] = {static_cast<size_t>(kQuantMapSize)};
        return nb::ndarray<nb::numpy, float>(data, 1, shape, owner);
      },
      "signed"_a, "max_exponent_bits"_a);

  mod.def("implementations", [](const std::string &op) -> std::vector<std::string> {
    if (op == "lazy_adam") return LazyAdam::implementations();
    if (op == "lazy_adam_quant") return LazyAdamQuant::implementations();
    if (op == "adam_w") return AdamW::implementations();
    if (op == "apply_adam_w_quant") return ApplyAdamWQuant::implementations();
    if (op == "add_lora") return AddLora::implementations();
    if (op == "embedding_bag_lazy_adam") return EmbeddingBagLazyAdam::implementations();
    if (op == "embedding_bag_lazy_adam_quant") return EmbeddingBagLazyAdamQuant::implementations();
    raise_value("fusekit.implementations: no operator is named \"" + op +
                "\" (lazy_adam, lazy_adam_quant, adam_w, apply_adam_w_quant, add_lora, "
                "embedding_bag_lazy_adam, embedding_bag_lazy_adam_quant)");
  });
  mod.def("set_num_threads", &set_num_threads, "n"_a);
  mod.def("get_num_threads", &num_threads);
  mod.def("empty_host", &empty_host, "nbytes"_a, "hugepages"_a);
  mod.def(
      "huge_page_backed_bytes",
      [](uintptr_t address, size_t nbytes) {
        return huge_page_backed_bytes(reinterpret_cast<const void *>(address), nbytes);
      },
      "address"_a, "nbytes"_a);
  mod.def(
      "advise_huge_pages_in_place",
      [](uintptr_t address, size_t nbytes) {
        nb::gil_scoped_release release;  // collapsing copies the pages: it takes a while
        return advise_huge_pages_in_place(reinterpret_cast<void *>(address), nbytes);
      },
      "address"_a, "nbytes"_a);
  mod.attr("HUGE_PAGE_BYTES") = kHugePageBytes;
}
