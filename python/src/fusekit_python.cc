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
#include <string>
#include <vector>

#include "fusekit/adam_w.h"
#include "fusekit/add_lora.h"
#include "fusekit/apply_adam_w_quant.h"
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

void check(const Status &s) {
  if (!s.ok()) raise_status(s);
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

// --- the operators -----------------------------------------------------------------------------

// The seam every function below goes through: make the problem, plan it, and run the plan once on
// the same tensors with the GIL released. `run(plan, workspace, bytes, &stats)` calls the plan's
// run() with the operator's scalars; the workspace (per calling thread) is taken before the GIL is
// released, since growing it may raise.
template <class Problem, class Plan, class Stats, class Tensors, class Options, class Run>
Stats plan_and_run(const Tensors &t, const Options &o, Run &&run) {
  Problem problem;
  Plan plan;
  check(Problem::make(t, o, &problem));
  check(Plan::plan(problem, o, &plan));
  size_t bytes = 0;
  if constexpr (requires { plan.workspace_size(); }) bytes = plan.workspace_size();
  void *ws = workspace(bytes);
  Stats stats;
  Status s;
  {
    nb::gil_scoped_release release;
    s = run(plan, ws, bytes, &stats);
  }
  check(s);
  return stats;
}

LazyAdamStats lazy_adam(nb::handle gradient, nb::handle indices, nb::handle m, nb::handle v,
                        nb::handle var, double lr, double beta1, double beta2, double epsilon,
                        int num_threads, const std::optional<std::string> &implementation) {
  constexpr const char *fn = "fusekit.lazy_adam";
  const LazyAdamTensors t{view_of(gradient, fn, "gradient", false),
                          view_of(indices, fn, "indices", false), view_of(m, fn, "m", true),
                          view_of(v, fn, "v", true), view_of(var, fn, "var", true)};
  LazyAdamOptions o;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.epsilon = epsilon;
  o.num_threads = num_threads;
  o.implementation = implementation_name(implementation);
  return plan_and_run<LazyAdamProblem, LazyAdam, LazyAdamStats>(
      t, o, [&](const LazyAdam &plan, void *ws, size_t bytes, LazyAdamStats *stats) {
        return plan.run(t, {.lr = static_cast<float>(lr), .lr_tensor = {}}, ws, bytes, stats);
      });
}

LazyAdamQuantStats lazy_adam_quant(nb::handle gradient, nb::handle indices, nb::handle m,
                                   nb::handle v, nb::handle var, nb::handle qmap_m,
                                   nb::handle qmap_v, nb::handle absmax_m, nb::handle absmax_v,
                                   double lr, double beta1, double beta2, double epsilon,
                                   int num_threads,
                                   const std::optional<std::string> &implementation) {
  constexpr const char *fn = "fusekit.lazy_adam_quant";
  const LazyAdamQuantTensors t{view_of(gradient, fn, "gradient", false),
                               view_of(indices, fn, "indices", false),
                               view_of(m, fn, "m", true),
                               view_of(v, fn, "v", true),
                               view_of(var, fn, "var", true),
                               view_of(qmap_m, fn, "qmap_m", false),
                               view_of(qmap_v, fn, "qmap_v", false),
                               view_of(absmax_m, fn, "absmax_m", true),
                               view_of(absmax_v, fn, "absmax_v", true)};
  LazyAdamQuantOptions o;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.epsilon = epsilon;
  o.num_threads = num_threads;
  o.implementation = implementation_name(implementation);
  return plan_and_run<LazyAdamQuantProblem, LazyAdamQuant, LazyAdamQuantStats>(
      t, o, [&](const LazyAdamQuant &plan, void *ws, size_t bytes, LazyAdamQuantStats *stats) {
        return plan.run(t, {.lr = static_cast<float>(lr), .lr_tensor = {}}, ws, bytes, stats);
      });
}

AdamWStats adam_w(nb::handle var, nb::handle grad, nb::handle m, nb::handle v, int64_t step,
                  double lr, double beta1, double beta2, double weight_decay, double eps,
                  double gnorm_scale, int num_threads,
                  const std::optional<std::string> &implementation) {
  constexpr const char *fn = "fusekit.adam_w";
  const AdamWTensors t{view_of(var, fn, "var", true), view_of(grad, fn, "grad", false),
                       view_of(m, fn, "m", true), view_of(v, fn, "v", true)};
  AdamWOptions o;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.weight_decay = weight_decay;
  o.eps = eps;
  o.gnorm_scale = gnorm_scale;
  o.num_threads = num_threads;
  o.implementation = implementation_name(implementation);
  return plan_and_run<AdamWProblem, AdamW, AdamWStats>(
      t, o, [&](const AdamW &plan, void *, size_t, AdamWStats *stats) {  // no workspace
        return plan.run(t, {.step = step, .lr = static_cast<float>(lr), .step_tensor = {}, .lr_tensor = {}}, stats);
      });
}

ApplyAdamWQuantStats apply_adam_w_quant(nb::handle var, nb::handle grad, nb::handle m, nb::handle v,
                                        nb::handle qmap_m, nb::handle qmap_v, nb::handle absmax_m,
                                        nb::handle absmax_v, int64_t step, double lr, double beta1,
                                        double beta2, double weight_decay, double eps,
                                        double gnorm_scale, int64_t block_size, int num_threads,
                                        const std::optional<std::string> &implementation) {
  constexpr const char *fn = "fusekit.apply_adam_w_quant";
  const ApplyAdamWQuantTensors t{view_of(var, fn, "var", true),
                                 view_of(grad, fn, "grad", false),
                                 view_of(m, fn, "m", true),
                                 view_of(v, fn, "v", true),
                                 view_of(qmap_m, fn, "qmap_m", false),
                                 view_of(qmap_v, fn, "qmap_v", false),
                                 view_of(absmax_m, fn, "absmax_m", true),
                                 view_of(absmax_v, fn, "absmax_v", true)};
  ApplyAdamWQuantOptions o;
  o.beta1 = beta1;
  o.beta2 = beta2;
  o.weight_decay = weight_decay;
  o.eps = eps;
  o.gnorm_scale = gnorm_scale;
  o.block_size = block_size;
  o.num_threads = num_threads;
  o.implementation = implementation_name(implementation);
  return plan_and_run<ApplyAdamWQuantProblem, ApplyAdamWQuant, ApplyAdamWQuantStats>(
      t, o, [&](const ApplyAdamWQuant &plan, void *ws, size_t bytes, ApplyAdamWQuantStats *stats) {
        return plan.run(t, {.step = step, .lr = static_cast<float>(lr), .step_tensor = {}, .lr_tensor = {}}, ws, bytes, stats);
      });
}

AddLoraStats add_lora(nb::handle out, nb::handle y, nb::handle x, nb::handle weight_b,
                      nb::handle indices, nb::handle weight_a, int64_t layer_idx, double scale,
                      int64_t y_offset, int64_t y_slice_size, int num_threads,
                      const std::optional<std::string> &implementation) {
  constexpr const char *fn = "fusekit.add_lora";
  AddLoraTensors t{view_of(y, fn, "y", false),
                   view_of(x, fn, "x", false),
                   view_of(weight_b, fn, "weight_b", false),
                   view_of(indices, fn, "indices", false),
                   weight_a.is_none() ? TensorView{} : view_of(weight_a, fn, "weight_a", false),
                   view_of(out, fn, "out", true)};
  // The operator takes int32 indices (CANN's type); torch and vLLM hold them as int64. Those are
  // narrowed into a per-thread scratch copy of B elements, refusing a value int32 cannot hold
  // (narrowing it would wrap it into a valid adapter).
  if (t.indices.dtype != DType::kInt32 && t.indices.dtype != DType::kInt64) {
    raise_value(std::string(fn) + ": indices has dtype " + dtype_name(t.indices.dtype) +
                "; int32 or int64 is required");
  }
  static thread_local std::vector<int32_t> narrowed;
  if (t.indices.dtype == DType::kInt64 && t.indices.ndim == 1) {
    const int64_t n = t.indices.shape[0], stride = t.indices.strides[0];
    const auto *src = static_cast<const int64_t *>(t.indices.data);
    narrowed.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t value = src[i * stride];
      if (value < INT32_MIN || value > INT32_MAX) {
        raise_status(Status::ShapeMismatch(std::string(fn) + ": indices[" + std::to_string(i) +
                                           "] = " + std::to_string(value) +
                                           " is not an adapter slot (outside int32)"));
      }
      narrowed[static_cast<size_t>(i)] = static_cast<int32_t>(value);
    }
    t.indices = TensorView::contiguous(narrowed.data(), DType::kInt32, {n});
  }
  AddLoraOptions o;
  o.layer_idx = layer_idx;
  o.scale = scale;
  o.y_offset = y_offset;
  o.y_slice_size = y_slice_size;
  o.num_threads = num_threads;
  o.implementation = implementation_name(implementation);
  return plan_and_run<AddLoraProblem, AddLora, AddLoraStats>(
      t, o, [&](const AddLora &plan, void *ws, size_t bytes, AddLoraStats *stats) {
        return plan.run(t, ws, bytes, stats);
      });
}

// --- memory ------------------------------------------------------------------------------------

// A NumPy uint8 array of `nbytes` on fusekit's host memory (2 MiB-aligned and advised for huge
// pages when huge_pages and nbytes >= 2 MiB), freed when the last view of it goes.
nb::ndarray<nb::numpy, uint8_t> empty_host(size_t nbytes, bool huge_pages) {
  void *p = allocate_host(nbytes == 0 ? 1 : nbytes, huge_pages);
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

  mod.def("lazy_adam", &python::lazy_adam, "gradient"_a, "indices"_a, "m"_a, "v"_a, "var"_a, "lr"_a,
          "beta1"_a, "beta2"_a, "epsilon"_a, "num_threads"_a, "implementation"_a.none());
  mod.def("lazy_adam_quant", &python::lazy_adam_quant, "gradient"_a, "indices"_a, "m"_a, "v"_a,
          "var"_a, "qmap_m"_a, "qmap_v"_a, "absmax_m"_a, "absmax_v"_a, "lr"_a, "beta1"_a, "beta2"_a,
          "epsilon"_a, "num_threads"_a, "implementation"_a.none());
  mod.def("adam_w", &python::adam_w, "var"_a, "grad"_a, "m"_a, "v"_a, "step"_a, "lr"_a, "beta1"_a,
          "beta2"_a, "weight_decay"_a, "eps"_a, "gnorm_scale"_a, "num_threads"_a,
          "implementation"_a.none());
  mod.def("apply_adam_w_quant", &python::apply_adam_w_quant, "var"_a, "grad"_a, "m"_a, "v"_a,
          "qmap_m"_a, "qmap_v"_a, "absmax_m"_a, "absmax_v"_a, "step"_a, "lr"_a, "beta1"_a,
          "beta2"_a, "weight_decay"_a, "eps"_a, "gnorm_scale"_a, "block_size"_a, "num_threads"_a,
          "implementation"_a.none());
  mod.def("add_lora", &python::add_lora, "out"_a, "y"_a, "x"_a, "weight_b"_a, "indices"_a,
          "weight_a"_a.none(), "layer_idx"_a, "scale"_a, "y_offset"_a, "y_slice_size"_a,
          "num_threads"_a, "implementation"_a.none());

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
    raise_value("fusekit.implementations: no operator is named \"" + op +
                "\" (lazy_adam, lazy_adam_quant, adam_w, apply_adam_w_quant, add_lora)");
  });
  mod.def("set_num_threads", &set_num_threads, "n"_a);
  mod.def("get_num_threads", &num_threads);
  mod.def("empty_host", &empty_host, "nbytes"_a, "huge_pages"_a);
  mod.def(
      "huge_page_backed_bytes",
      [](uintptr_t address, size_t nbytes) {
        return huge_page_backed_bytes(reinterpret_cast<const void *>(address), nbytes);
      },
      "address"_a, "nbytes"_a);
  mod.attr("HUGE_PAGE_BYTES") = kHugePageBytes;
}
