// libFuzzer target: aclCreateTensor / aclDestroyTensor (docs/fuzzing.md), and the tensors it
// accepts handed to every built operator's phase one.
//
// Invariants: a refusal (null) leaves a new non-empty message; an accepted tensor has at most 8
// dimensions and 8 storage dimensions, no negative size or offset, and, when storage is described,
// a view that lies inside it (checked exactly, in 128-bit arithmetic); aclCreateTensor writes no
// byte of tensorData; every operator's phase one given the tensor in every position returns a
// documented status, with a message when it fails, writes nothing, and returns no executor when
// it fails; aclDestroyTensor returns 0.
#include <cstring>
#include <vector>

#include "fuzz_common.h"
#if FUSEKIT_FUZZ_HAVE_LAZY_ADAM
#include "aclnnop/aclnn_lazy_adam.h"
#endif
#if FUSEKIT_FUZZ_HAVE_APPLY_ADAM_W_QUANT
#include "aclnnop/aclnn_apply_adam_w_quant.h"
#endif
#if FUSEKIT_FUZZ_HAVE_ADD_LORA
#include "aclnnop/aclnn_add_lora.h"
#endif
#if FUSEKIT_FUZZ_HAVE_LAZY_ADAM_QUANT
#include "aclnnop/aclnn_lazy_adam_quant.h"
#endif

namespace {

constexpr size_t kBytes = 4096;

struct Case {
  int rank = 0;
  bool null_dims = false;
  int64_t dims[11] = {};
  bool has_strides = false;
  int64_t strides[11] = {};
  int64_t offset = 0;
  int32_t dtype = 0, format = 0;
  int snum = 0;
  bool null_storage = false;
  uint8_t scode[11] = {};
  int64_t sdims[11] = {};
  uint8_t data = 0;
  uint8_t use = 0;
};

void decode_into(fz::Input &in, Case *c) {
  c->rank = in.u8("rank") % 11;
  c->null_dims = in.u8("nulldims") >= 240;
  for (int i = 0; i < c->rank; ++i) {
    c->dims[i] = fz::decode_dim(in, "t", i, in.u8("nom", nullptr, i) % 9);
  }
  c->has_strides = in.u8("strides") >= 128;
  int64_t contiguous[11];
  fz::contiguous_strides(c->dims, c->rank, contiguous);
  for (int i = 0; c->has_strides && i < c->rank; ++i) {
    const uint8_t s = in.u8("s", nullptr, i);
    c->strides[i] =
        s < 128   ? contiguous[i]
        : s < 192 ? static_cast<int64_t>(s) - 160
                  : fz::kHugeStrides[s % (sizeof(fz::kHugeStrides) / sizeof(fz::kHugeStrides[0]))];
  }
  const uint8_t oc = in.u8("offset");
  if (oc >= 192) {
    c->offset =
        fz::special(fz::kOffsets[(oc - 192) % fz::kNumOffsets], 0, in, "offraw", nullptr, -1);
  } else if (oc >= 128) {
    c->offset = oc - 128;
  }
  c->dtype = static_cast<int32_t>(in.u8("dtype") % 64) - 32;
  c->format = static_cast<int32_t>(in.u8("format") % 64) - 32;
  c->snum = in.u8("snum") % 11;
  c->null_storage = in.u8("snull") >= 240;
  for (int i = 0; i < c->snum; ++i) {
    c->scode[i] = in.u8("sdim", nullptr, i);
    if (c->scode[i] >= fz::kDimSpecial) c->sdims[i] = fz::decode_dim(in, "storage", i, 1);
  }
  c->data = in.u8("data");
  c->use = in.u8("use");
}
void decode_only(fz::Input &in) {
  Case c;
  decode_into(in, &c);
}

void run_one(const uint8_t *bytes, size_t size) {
  fz::Input in(bytes, size);
  Case c;
  decode_into(in, &c);
  fz::g_outcome = fz::Outcome();
  fz::Buffer buf(kBytes + 8);
  fz::Rng rng{c.offset ^ static_cast<uint64_t>(c.rank)};
  for (size_t i = 0; i < buf.size; ++i) buf.payload()[i] = static_cast<uint8_t>(rng.next());
  const std::vector<uint8_t> before(buf.mem.get(), buf.mem.get() + buf.total());
  uint8_t *data = c.data < 224   ? buf.payload()
                  : c.data < 240 ? nullptr
                                 : buf.payload() + (c.data - 240) % 8;
  const size_t esize = fz::lib_esize(c.dtype);
  const int64_t avail = data == nullptr ? 1 << 20 : static_cast<int64_t>((kBytes) / esize);
  // Storage dimensions: codes below 192 describe the buffer (the first) and 1 (the others).
  for (int i = 0; i < c.snum; ++i) {
    if (c.scode[i] < fz::kDimSpecial) c.sdims[i] = i == 0 ? avail : 1;
  }
  const int64_t *sptr = c.null_storage ? nullptr : c.sdims;
  fz::poison();
  aclTensor *t = aclCreateTensor(
      c.null_dims ? nullptr : c.dims, static_cast<uint64_t>(c.rank),
      static_cast<aclDataType>(c.dtype), c.has_strides ? c.strides : nullptr, c.offset,
      static_cast<aclFormat>(c.format), sptr, static_cast<uint64_t>(c.snum), data);
  FZ_CHECK(std::memcmp(before.data(), buf.mem.get(), buf.total()) == 0,
           "aclCreateTensor wrote into tensorData");
  if (t == nullptr) {
    fz::check_status(ACLNN_ERR_PARAM_INVALID, "aclCreateTensor (refused)");
    return;
  }
  // What was accepted.
  FZ_CHECK(c.rank <= 8 && c.snum <= 8, "aclCreateTensor accepted %d dims and %d storage dims",
           c.rank, c.snum);
  FZ_CHECK(c.rank == 0 || !c.null_dims, "aclCreateTensor accepted null viewDims with %d dims",
           c.rank);
  FZ_CHECK(c.offset >= 0, "aclCreateTensor accepted offset %lld", static_cast<long long>(c.offset));
  int64_t strides[11];
  if (c.has_strides) {
    std::copy(c.strides, c.strides + 11, strides);
  } else {
    fz::contiguous_strides(c.dims, c.rank, strides);
  }
  __int128 lo = c.offset, hi = c.offset;
  bool empty = false;
  for (int i = 0; i < c.rank; ++i) {
    FZ_CHECK(c.dims[i] >= 0, "aclCreateTensor accepted size %lld",
             static_cast<long long>(c.dims[i]));
    if (c.dims[i] == 0) empty = true;
    const __int128 span = static_cast<__int128>(c.dims[i] > 0 ? c.dims[i] - 1 : 0) * strides[i];
    (span < 0 ? lo : hi) += span;
    lo = std::max(lo, -(static_cast<__int128>(1) << 100));  // saturated: no 128-bit overflow
    hi = std::min(hi, static_cast<__int128>(1) << 100);
  }
  if (sptr != nullptr && c.snum > 0) {
    __int128 elems = 1;
    for (int i = 0; i < c.snum; ++i) {
      FZ_CHECK(c.sdims[i] >= 0, "aclCreateTensor accepted storage size %lld",
               static_cast<long long>(c.sdims[i]));
      elems = c.sdims[i] < 0 ? -1 : fz::sat_mul(elems, c.sdims[i]);
    }
    FZ_CHECK(empty || (lo >= 0 && hi < elems),
             "aclCreateTensor accepted a view reaching elements [%lld, %lld] of a storage of %lld",
             static_cast<long long>(lo), static_cast<long long>(hi), static_cast<long long>(elems));
  }
  // The tensor in every position of each operator's phase one (it is not run).
  auto phase_one = [&](int st, aclOpExecutor *ex, const char *op) {
    fz::check_status(st, op);
    FZ_CHECK(std::memcmp(before.data(), buf.mem.get(), buf.total()) == 0, "%s wrote", op);
    if (st != 0) {
      FZ_CHECK(ex == nullptr, "%s failed but returned an executor", op);
    } else {
      FZ_CHECK(ex != nullptr && aclDestroyAclOpExecutor(ex) == 0, "%s: executor", op);
    }
  };
  uint64_t ws = 0;
  aclOpExecutor *ex = nullptr;
  (void)ws;
  (void)ex;
#if FUSEKIT_FUZZ_HAVE_LAZY_ADAM
  if (c.use & 1) {
    ex = nullptr;
    fz::poison();
    phase_one(aclnnLazyAdamGetWorkspaceSize(t, t, t, t, t, t, 0.9, 0.999, 1e-7, &ws, &ex), ex,
              "aclnnLazyAdamGetWorkspaceSize");
  }
#endif
#if FUSEKIT_FUZZ_HAVE_APPLY_ADAM_W_QUANT
  if (c.use & 2) {
    ex = nullptr;
    fz::poison();
    phase_one(aclnnApplyAdamWQuantGetWorkspaceSize(t, t, t, t, t, t, t, t, t, 1e-3, 0.9, 0.999, 0.0,
                                                   1e-8, 1.0, nullptr, 256, &ws, &ex),
              ex, "aclnnApplyAdamWQuantGetWorkspaceSize");
  }
#endif
#if FUSEKIT_FUZZ_HAVE_ADD_LORA
  if (c.use & 4) {
    ex = nullptr;
    fz::poison();
    phase_one(aclnnAddLoraGetWorkspaceSize(t, t, t, t, (c.use & 8) ? t : nullptr, 0, 1.0, 0, -1, t,
                                           &ws, &ex),
              ex, "aclnnAddLoraGetWorkspaceSize");
  }
#endif
#if FUSEKIT_FUZZ_HAVE_LAZY_ADAM_QUANT
  if (c.use & 16) {
    ex = nullptr;
    fz::poison();
    phase_one(aclnnLazyAdamQuantGetWorkspaceSize(t, t, t, t, t, t, t, t, t, t, 0.9, 0.999, 1e-8,
                                                 &ws, &ex),
              ex, "aclnnLazyAdamQuantGetWorkspaceSize");
  }
#endif
  const int d = aclDestroyTensor(t);
  FZ_CHECK(d == 0, "aclDestroyTensor returned %d", d);
}

std::vector<fz::Seed> seeds() {
  using fz::Expect;
  return {
      {"scalar", Expect::kAny, {{"dtype", 32 + ACL_FLOAT}, {"format", 32 + ACL_FORMAT_ND}}},
      {"matrix_3x4",
       Expect::kAny,
       {{"rank", 2},
        {"nom[0]", 3},
        {"nom[1]", 4},
        {"dtype", 32 + ACL_FLOAT},
        {"format", 34},
        {"use", 23}}},
      {"strided_f16",
       Expect::kAny,
       {{"rank", 2},
        {"nom[0]", 5},
        {"nom[1]", 3},
        {"strides", 200},
        {"s[0]", 168},
        {"s[1]", 161},
        {"dtype", 32 + ACL_FLOAT16},
        {"format", 34},
        {"snum", 1},
        {"use", 31}}},
      {"nine_dims", Expect::kAny, {{"rank", 9}, {"dtype", 32}, {"format", 34}}},
      {"null_dims", Expect::kAny, {{"rank", 2}, {"nulldims", 250}, {"dtype", 32}}},
      {"negative_size",
       Expect::kAny,
       {{"rank", 1}, {"t.dim[0]", fz::dim_code(-1)}, {"dtype", 32}, {"snum", 1}}},
      {"huge_size",
       Expect::kAny,
       {{"rank", 2},
        {"t.dim[0]", fz::dim_code(fz::kI64Max)},
        {"nom[1]", 2},
        {"dtype", 32},
        {"snum", 1},
        {"use", 23}}},
      {"offset_max",
       Expect::kAny,
       {{"rank", 1},
        {"nom[0]", 1},
        {"offset", fz::offset_code(fz::kI64Max)},
        {"dtype", 32},
        {"snum", 1}}},
      {"offset_bytes_overflow",
       Expect::kAny,
       {{"rank", 1},
        {"nom[0]", 0},
        {"offset", fz::offset_code(fz::kI64Max / 4 + 1)},
        {"dtype", 32},
        {"snum", 1},
        {"use", 23}}},
      {"negative_stride",
       Expect::kAny,
       {{"rank", 2},
        {"nom[0]", 3},
        {"nom[1]", 3},
        {"strides", 200},
        {"s[0]", 157},
        {"dtype", 32},
        {"snum", 1}}},
      {"zero_stride_broadcast",
       Expect::kAny,
       {{"rank", 2},
        {"t.dim[0]", fz::dim_code(fz::kP32)},
        {"nom[1]", 4},
        {"strides", 200},
        {"s[0]", 160},
        {"s[1]", 161},
        {"dtype", 32},
        {"snum", 1},
        {"use", 23}}},
      {"huge_stride",
       Expect::kAny,
       {{"rank", 2},
        {"nom[0]", 3},
        {"nom[1]", 3},
        {"strides", 200},
        {"s[0]", 250},
        {"dtype", 32},
        {"snum", 1}}},
      {"storage_negative",
       Expect::kAny,
       {{"rank", 1},
        {"nom[0]", 0},
        {"dtype", 32},
        {"snum", 2},
        {"sdim[1]", fz::kDimSpecial},
        {"storage.dim[1]", fz::dim_code(-1)}}},
      {"storage_null_count_2",
       Expect::kAny,
       {{"rank", 1}, {"nom[0]", 4}, {"dtype", 32}, {"snum", 2}, {"snull", 250}}},
      {"null_data",
       Expect::kAny,
       {{"rank", 1}, {"nom[0]", 4}, {"dtype", 32}, {"snum", 1}, {"data", 230}, {"use", 23}}},
      {"misaligned_data",
       Expect::kAny,
       {{"rank", 1},
        {"nom[0]", 4},
        {"dtype", 32 + ACL_INT64},
        {"snum", 1},
        {"data", 243},
        {"use", 23}}},
      {"unknown_dtype_format",
       Expect::kAny,
       {{"rank", 1},
        {"nom[0]", 4},
        {"dtype", 32 + 13},
        {"format", 32 + 29},
        {"snum", 1},
        {"use", 31}}},
  };
}

}  // namespace

FZ_FUZZ_TARGET(seeds, decode_only, run_one)
