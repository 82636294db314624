// fusekit fuzzing: the support every libFuzzer target shares, compiled once (the static
// library fusekit_fuzz_common of fuzz/CMakeLists.txt); fuzz_common.h declares it and
// docs/fuzzing.md describes it.
#include "fuzz_common.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fusekit/float16.h"
#include "fusekit/threading.h"

namespace fz {

// ---------------------------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------------------------

[[noreturn]] __attribute__((format(printf, 1, 2))) void violated(const char *fmt, ...) {
  std::fprintf(stderr, "\n==fusekit-fuzz== INVARIANT VIOLATED: ");
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "\n==fusekit-fuzz== aclGetRecentErrMsg(): \"%s\"\n", aclGetRecentErrMsg());
  std::fflush(stderr);
  __builtin_trap();
}

// Known findings that a campaign may step around until they are fixed: FUSEKIT_FUZZ_AVOID is a
// comma-separated list of names (docs/fuzzing.md lists them); each target then stops generating
// the inputs that reach that finding. Empty by default: every finding is reported.
bool avoid(const char *known) {
  static const std::string list = [] {
    const char *e = std::getenv("FUSEKIT_FUZZ_AVOID");
    return "," + std::string(e != nullptr ? e : "") + ",";
  }();
  return list.find("," + std::string(known) + ",") != std::string::npos;
}

// ---------------------------------------------------------------------------------------------
// The input
// ---------------------------------------------------------------------------------------------

uint64_t Input::read(const char *a, const char *b, int i, int bytes) {
  uint64_t v = 0;
  if (out_ != nullptr) {
    const std::string k = key(a, b, i);
    const auto it = values_->find(k);
    if (it != values_->end()) {
      v = it->second;
      used_.insert(k);
    }
    if (bytes < 8) v &= (uint64_t{1} << (8 * bytes)) - 1;
    for (int j = 0; j < bytes; ++j) out_->push_back(static_cast<uint8_t>(v >> (8 * j)));
    return v;
  }
  for (int j = 0; j < bytes; ++j, ++pos_) {
    if (pos_ < size_) v |= static_cast<uint64_t>(data_[pos_]) << (8 * j);
  }
  return v;
}

std::vector<std::string> Input::unused() const {
  std::vector<std::string> r;
  for (const auto &[k, v] : *values_) {
    if (!used_.count(k)) r.push_back(k);
  }
  return r;
}

std::string Input::key(const char *a, const char *b, int i) {
  std::string k = a;
  if (b != nullptr) k += std::string(".") + b;
  if (i >= 0) k += "[" + std::to_string(i) + "]";
  return k;
}

// ---------------------------------------------------------------------------------------------
// The tables of special values
// ---------------------------------------------------------------------------------------------

// Sizes (codes kDimSpecial and up).
constexpr int64_t kDims[] = {0,
                             1,
                             2,
                             3,
                             7,
                             8,
                             15,
                             16,
                             17,
                             31,
                             32,
                             33,
                             64,
                             127,
                             255,
                             256,
                             257,
                             1000,
                             4096,
                             65535,
                             65536,
                             65537,
                             int64_t{1} << 20,
                             int64_t{1} << 24,
                             kP31 - 1,
                             kP31,
                             kP32 - 1,
                             kP32,
                             kP32 + 1,
                             int64_t{1} << 40,
                             int64_t{1} << 53,
                             int64_t{1} << 62,
                             kI64Max - 1,
                             kI64Max,
                             -1,
                             -2,
                             -256,
                             kI64Min + 5,
                             kI64Min,
                             kNomPlus1,
                             kNomMinus1,
                             kNomTimes2,
                             kRaw};
constexpr int kNumDims = sizeof(kDims) / sizeof(kDims[0]);

// Per-dimension strides (kStridePerDimension). kNomPlus1 here: the contiguous stride + 1;
// kNomTimes2: twice it; kRaw: the contiguous stride.
constexpr int64_t kSmallStrides[] = {kRaw, 0,  1,  2,  3,  4,         5,         8,
                                     16,   64, -1, -2, -8, kNomPlus1, kNomTimes2};

// dtypes and formats: values outside aclDataType's and aclFormat's range ([-32, 31]) would be
// undefined behaviour in C++ before the library saw them, so the tables stay inside it.
constexpr int32_t kDtypes[] = {ACL_FLOAT,  ACL_FLOAT16, ACL_INT8,   ACL_INT32,        ACL_UINT8,
                               ACL_INT16,  ACL_UINT16,  ACL_UINT32, ACL_INT64,        ACL_UINT64,
                               ACL_DOUBLE, ACL_BOOL,    ACL_BF16,   ACL_DT_UNDEFINED, 5,
                               13,         31,          -32};

constexpr int32_t kFormats[] = {ACL_FORMAT_NCHW,
                                ACL_FORMAT_NHWC,
                                ACL_FORMAT_ND,
                                ACL_FORMAT_NC1HWC0,
                                ACL_FORMAT_FRACTAL_Z,
                                ACL_FORMAT_FRACTAL_NZ,
                                ACL_FORMAT_UNDEFINED,
                                30,
                                -32};

const double kDoubles[] = {std::numeric_limits<double>::quiet_NaN(),
                           -std::numeric_limits<double>::quiet_NaN(),
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           0.0,
                           -0.0,
                           1.0,
                           -1.0,
                           0.5,
                           1.0 - 1e-9,
                           1.0 - 1e-7,
                           1.0 + 1e-7,
                           0.9999999,
                           1e-45,
                           -1e-45,
                           1.4e-45,
                           1e-46,
                           1e-38,
                           1e-39,
                           1e-60,
                           5e-324,
                           3.4028234663852886e38,
                           3.5e38,
                           1e300,
                           -1e300,
                           -0.5,
                           1e-8,
                           1e20,
                           65504.0,
                           2.0};
constexpr int kNumDoubles = sizeof(kDoubles) / sizeof(kDoubles[0]);

// Integer attributes (layerIdx, yOffset, blockSize, ...): codes below 192 keep the nominal value.
constexpr int64_t kInts[] = {0,        1,       -1,      -2,        2,          255,
                             256,      257,     128,     512,       kP31,       kP32,
                             kP31 - 1, kI64Max, kI64Min, kNomPlus1, kNomMinus1, kRaw};
constexpr int kNumInts = sizeof(kInts) / sizeof(kInts[0]);

// The code (>= `first`) that selects `value` in `table`.
template <size_t N>
uint8_t code_of(const int64_t (&table)[N], int64_t value, uint8_t first) {
  for (size_t i = 0; i < N; ++i) {
    if (table[i] == value) return static_cast<uint8_t>(first + i);
  }
  std::fprintf(stderr, "code_of: %lld is in no table\n", static_cast<long long>(value));
  std::abort();
}

uint8_t dim_code(int64_t v) {
  return code_of(kDims, v, kDimSpecial);
}

uint8_t offset_code(int64_t v) {
  return code_of(kOffsets, v, 192);
}

uint8_t int_code(int64_t v) {
  return code_of(kInts, v, kAttrSpecial);
}

uint8_t double_code(double v) {
  for (int i = 0; i < kNumDoubles; ++i) {
    if (std::bit_cast<uint64_t>(kDoubles[i]) == std::bit_cast<uint64_t>(v))
      return static_cast<uint8_t>(kAttrSpecial + i);
  }
  std::abort();
}

uint8_t dtype_code(int32_t v) {
  for (size_t i = 0; i < sizeof(kDtypes) / sizeof(kDtypes[0]); ++i) {
    if (kDtypes[i] == v) return static_cast<uint8_t>(kDtypeSpecial + i);
  }
  std::abort();
}

uint8_t format_code(int32_t v) {
  for (size_t i = 0; i < sizeof(kFormats) / sizeof(kFormats[0]); ++i) {
    if (kFormats[i] == v) return static_cast<uint8_t>(kFormatSpecial + i);
  }
  std::abort();
}

int64_t special(int64_t t, int64_t nominal, Input &in, const char *a, const char *b, int i) {
  if (t == kNomPlus1) return wrap_add(nominal, 1);
  if (t == kNomMinus1) return wrap_add(nominal, -1);
  if (t == kNomTimes2) return wrap_mul(nominal, 2);
  if (t == kRaw) return static_cast<int64_t>(in.u64(a, b, i));
  return t;
}

int64_t decode_dim(Input &in, const char *t, int i, int64_t nominal) {
  const uint8_t c = in.u8(t, "dim", i);
  if (c < kDimSpecial) return nominal;
  return special(kDims[(c - kDimSpecial) % kNumDims], nominal, in, t, "dimraw", i);
}

double decode_double(Input &in, const char *name, double nominal) {
  const uint8_t c = in.u8(name);
  if (c < kAttrSpecial) return nominal;
  const int k = (c - kAttrSpecial) % (kNumDoubles + 2);
  if (k == kNumDoubles) return std::bit_cast<double>(in.u64(name, "raw"));
  if (k == kNumDoubles + 1) return nominal * (1.0 + 1e-7);
  return kDoubles[k];
}

int64_t decode_int(Input &in, const char *name, int64_t nominal) {
  const uint8_t c = in.u8(name);
  if (c < kAttrSpecial) return nominal;
  return special(kInts[(c - kAttrSpecial) % kNumInts], nominal, in, name, "raw", -1);
}

// ---------------------------------------------------------------------------------------------
// Element types, tensor descriptions
// ---------------------------------------------------------------------------------------------

fusekit::DType lib_dtype(int32_t acl) {
  switch (acl) {
    case ACL_FLOAT:
      return fusekit::DType::kFloat32;
    case ACL_FLOAT16:
      return fusekit::DType::kFloat16;
    case ACL_BF16:
      return fusekit::DType::kBFloat16;
    case ACL_INT32:
      return fusekit::DType::kInt32;
    case ACL_INT64:
      return fusekit::DType::kInt64;
    case ACL_UINT8:
      return fusekit::DType::kUInt8;
    default:
      return fusekit::DType::kOther;
  }
}

size_t lib_esize(int32_t acl) {
  const size_t s = fusekit::dtype_size(lib_dtype(acl));
  return s == 0 ? 1 : s;
}

size_t real_esize(int32_t acl) {
  if (acl < ACL_DT_UNDEFINED || acl > ACL_BF16) return 1;  // not an aclDataType value
  return std::max<size_t>(1, aclDataTypeSize(static_cast<aclDataType>(acl)));
}

float load_float(const uint8_t *p, int32_t acl) {
  if (acl == ACL_FLOAT) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  if (acl == ACL_FLOAT16) return fusekit::half_bits_to_float(h);
  if (acl == ACL_BF16) return fusekit::bf16_bits_to_float(h);
  return std::numeric_limits<float>::quiet_NaN();
}

void contiguous_strides(const int64_t *dims, int rank, int64_t *strides) {
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; --i) {
    strides[i] = s;
    s = wrap_mul(s, dims[i] > 0 ? dims[i] : 1);
  }
}

TensorSpec decode_tensor(Input &in, const char *name, const Nominal &nom, int index) {
  TensorSpec s;
  s.name = name;
  const uint8_t mode = in.u8(name, "mode");
  if (mode >= kModeNullData) {
    s.null_data = true;
  } else if (mode >= kModeNullTensor) {
    s.present = false;
    return s;
  }
  const uint8_t dt = in.u8(name, "dtype");
  s.dtype = dt < kDtypeSpecial
                ? nom.dtype
                : kDtypes[(dt - kDtypeSpecial) % (sizeof(kDtypes) / sizeof(kDtypes[0]))];
  const uint8_t fm = in.u8(name, "format");
  s.format = fm < kFormatSpecial
                 ? static_cast<int32_t>(ACL_FORMAT_ND)
                 : kFormats[(fm - kFormatSpecial) % (sizeof(kFormats) / sizeof(kFormats[0]))];
  const uint8_t rk = in.u8(name, "rank");
  s.rank = rk < kRankSpecial ? nom.rank : (rk - kRankSpecial) % kMaxRank;
  for (int i = 0; i < s.rank; ++i) {
    s.dims[i] = decode_dim(in, name, i, i < nom.rank ? nom.dims[i] : 1);
  }
  contiguous_strides(s.dims, s.rank, s.strides);
  const uint8_t sm = in.u8(name, "stride");
  if (sm >= kStrideExplicit) {
    s.explicit_strides = true;
    const int d = s.rank > 0 ? in.u8(name, "sdim") % s.rank : 0;
    switch ((sm - kStrideExplicit) / 16) {
      case 0:
        break;
      case 1: {  // padded rows
        const int64_t pad = 1 + in.u8(name, "pad") % 64;
        if (s.rank >= 2) {
          int64_t pitch = wrap_add(std::max<int64_t>(s.dims[s.rank - 1], 1), pad);
          for (int i = s.rank - 2; i >= 0; --i) {
            s.strides[i] = pitch;
            pitch = wrap_mul(pitch, s.dims[i] > 0 ? s.dims[i] : 1);
          }
        }
        break;
      }
      case 2:
        if (s.rank > 0) s.strides[d] = 0;
        break;
      case 3:
        if (s.rank > 0) s.strides[d] = s.strides[d] == 0 ? -1 : wrap_mul(s.strides[d], -1);
        break;
      case 4:
        if (s.rank > 0) s.strides[d] = s.strides[d] > 0 ? s.strides[d] - 1 : 0;
        break;
      case 5: {
        // huge < 128: dimension sdim gets kHugeStrides[huge]; 128 and up: every dimension of size
        // 1 gets kShortDimStrides[huge] (valid: nothing steps by it; issue #31's finding).
        static constexpr int64_t kShortDimStrides[] = {
            (int64_t{1} << 62) - 1, int64_t{1} << 61, (int64_t{1} << 61) + 1,
            int64_t{1} << 62,       kI64Max,          int64_t{1} << 40};
        const uint8_t h = in.u8(name, "huge");
        if (h >= 128) {
          for (int i = 0; i < s.rank; ++i) {
            if (s.dims[i] == 1) s.strides[i] = kShortDimStrides[h % 6];
          }
        } else if (s.rank > 0) {
          s.strides[d] = kHugeStrides[h % (sizeof(kHugeStrides) / sizeof(kHugeStrides[0]))];
        }
        break;
      }
      case 6:  // the last two dimensions column-major
        if (s.rank >= 2) {
          s.strides[s.rank - 2] = 1;
          s.strides[s.rank - 1] = std::max<int64_t>(s.dims[s.rank - 2], 1);
        }
        break;
      default: {
        int64_t contiguous[kMaxRank];
        contiguous_strides(s.dims, s.rank, contiguous);
        for (int i = 0; i < s.rank; ++i) {
          const int64_t t = kSmallStrides[in.u8(name, "sval", i) %
                                          (sizeof(kSmallStrides) / sizeof(kSmallStrides[0]))];
          s.strides[i] = t == kRaw         ? contiguous[i]
                         : t == kNomPlus1  ? wrap_add(contiguous[i], 1)
                         : t == kNomTimes2 ? wrap_mul(contiguous[i], 2)
                                           : t;
        }
        break;
      }
    }
  }
  const uint8_t oc = in.u8(name, "offset");
  if (oc >= 192) {
    s.offset = special(kOffsets[(oc - 192) % kNumOffsets], 0, in, name, "offraw", -1);
  } else if (oc >= 128) {
    s.offset = oc - 128;
  }
  const uint8_t ma = in.u8(name, "misalign");
  s.misalign = ma < 240 ? 0 : (ma - 240) % 8;
  if (index > 0) {
    const uint8_t al = in.u8(name, "alias");
    if (al >= 224) s.alias = (al - 224) % index;
  }
  s.storage = in.u8(name, "storage");
  s.fill = in.u8(name, "fill");
  s.slack = in.u8(name, "slack");
  return s;
}

// ---------------------------------------------------------------------------------------------
// Buffers with guard bytes, contents
// ---------------------------------------------------------------------------------------------

Buffer::Buffer(size_t n) : size(n), mem(new uint8_t[n + 2 * kGuard]) {
  std::memset(mem.get(), kGuardByte, n + 2 * kGuard);
}

bool Buffer::guards_intact() const {
  for (size_t i = 0; i < kGuard; ++i) {
    if (mem[i] != kGuardByte || mem[kGuard + size + i] != kGuardByte) return false;
  }
  return true;
}

const float kFloatSpecials[] = {std::numeric_limits<float>::quiet_NaN(),
                                -std::numeric_limits<float>::quiet_NaN(),
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                0.0f,
                                -0.0f,
                                1e-45f,
                                -1e-45f,
                                1.17549435e-38f,
                                3.4028235e38f,
                                -3.4028235e38f,
                                1e20f,
                                -1e20f,
                                65504.0f,
                                65520.0f,
                                1.01171875f,
                                2e19f};
constexpr int kNumFloatSpecials = sizeof(kFloatSpecials) / sizeof(kFloatSpecials[0]);

void store_float(uint8_t *p, int32_t acl, float f) {
  if (acl == ACL_FLOAT) {
    std::memcpy(p, &f, 4);
  } else if (acl == ACL_FLOAT16 || acl == ACL_BF16) {
    const uint16_t h =
        acl == ACL_FLOAT16 ? fusekit::float_to_half_bits(f) : fusekit::float_to_bf16_bits(f);
    std::memcpy(p, &h, 2);
  }
}

void store_int(uint8_t *p, int32_t acl, int64_t v) {
  const size_t n = real_esize(acl);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
}

float gen_float(uint8_t mode, Rng &r) {
  switch (mode % 8) {
    case 0:
      return r.uniform(-2.0f, 2.0f);
    case 1:
      return r.uniform(1.0f, 2.0f);
    case 2:
      return r.below(8) == 0 ? kFloatSpecials[r.below(kNumFloatSpecials)] : r.uniform(-2, 2);
    case 3:
      return 0.0f;
    case 4:
      return std::bit_cast<float>(static_cast<uint32_t>(r.next()));
    case 5:
      return (r.below(2) ? 1.0f : -1.0f) *
             std::ldexp(r.uniform(1, 2), 60 + static_cast<int>(r.below(68)));
    case 6:
      return std::ldexp(r.uniform(-1, 1), -120 - static_cast<int>(r.below(30)));
    default:
      return r.uniform(-2.0f, 2.0f);  // mode 7 adds one NaN afterwards
  }
}

void fill_buffer(uint8_t *p, size_t bytes, int32_t acl, Fill kind, uint8_t mode, int64_t bound,
                 Rng &r) {
  const size_t es = real_esize(acl);
  const size_t count = bytes / es;
  const bool is_float = acl == ACL_FLOAT || acl == ACL_FLOAT16 || acl == ACL_BF16;
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(r.next());
  if (kind == Fill::kRandom ||
      (!is_float && kind != Fill::kIndex && kind != Fill::kStep && kind != Fill::kCodes)) {
    return;
  }
  const int64_t b = bound > 0 ? bound : 1;
  switch (kind) {
    case Fill::kFloat:
    case Fill::kAbsmax:
    case Fill::kLr: {
      for (size_t i = 0; i < count; ++i) {
        float f = gen_float(mode, r);
        if (kind == Fill::kAbsmax) {
          const int m = mode % 6;
          f = m == 0   ? r.uniform(0.0f, 2.0f)
              : m == 1 ? 0.0f
              : m == 2 ? kFloatSpecials[r.below(kNumFloatSpecials)]
              : m == 3 ? 3e38f
              : m == 4 ? std::bit_cast<float>(static_cast<uint32_t>(r.next()))
                       : -r.uniform(0.0f, 2.0f);
        } else if (kind == Fill::kLr) {
          const int m = mode % 8;
          f = m == 0   ? 1e-3f
              : m == 1 ? std::numeric_limits<float>::quiet_NaN()
              : m == 2 ? 0.0f
              : m == 3 ? -1e-3f
              : m == 4 ? 1e30f
              : m == 5 ? std::numeric_limits<float>::infinity()
              : m == 6 ? kFloatSpecials[r.below(kNumFloatSpecials)]
                       : std::bit_cast<float>(static_cast<uint32_t>(r.next()));
        }
        store_float(p + i * es, acl, f);
      }
      if (kind == Fill::kFloat && mode % 8 == 7 && count > 0) {
        store_float(p + r.below(count) * es, acl, std::numeric_limits<float>::quiet_NaN());
      }
      break;
    }
    case Fill::kIndex: {
      static const int64_t kIdx[] = {-1,        0,         1,    kI64Min,  kI64Max,
                                     INT32_MIN, INT32_MAX, kP32, kP32 + 1, -kP32};
      const int64_t same = static_cast<int64_t>(r.below(b));
      for (size_t i = 0; i < count; ++i) {
        int64_t v = static_cast<int64_t>(r.below(b));
        switch (mode % 10) {
          case 9:  // padding but one (no row repeats: the padding stays in the kernels' walk)
            v = i == count / 2 ? v : -1 - static_cast<int64_t>(r.below(4));
            break;
          case 1:
            v = static_cast<int64_t>((count - 1 - i) % b);
            break;
          case 2:
            if (r.below(4) == 0) v = -1 - static_cast<int64_t>(r.below(4));
            break;
          case 4:
            v = same;
            break;
          case 5: {
            const int k = static_cast<int>(r.below(14));
            v = k < 10    ? kIdx[k]
                : k == 10 ? wrap_add(bound, -1)
                : k == 11 ? bound
                : k == 12 ? wrap_add(bound, 1)
                          : 0;
            break;
          }
          case 6:
            v = static_cast<int64_t>(r.next());
            break;
          case 7:
            v = static_cast<int64_t>(i * static_cast<size_t>(b) / std::max<size_t>(count, 1));
            break;
          case 8:
            if (r.below(4) == 0) v = bound;
            break;
          default:
            break;
        }
        store_int(p + i * es, acl, v);
      }
      if (mode % 10 == 3 && count > 0) {  // one index past the bound (R or W)
        const int64_t top = acl == ACL_INT64 ? kI64Max : INT32_MAX;
        const int64_t bad[] = {bound, wrap_add(bound, 1), wrap_add(bound, 1000), top};
        store_int(p + r.below(count) * es, acl, bad[r.below(4)]);
      }
      break;
    }
    case Fill::kCodes: {
      for (size_t i = 0; i < count; ++i) {
        const int m = mode % 4;
        store_int(p + i * es, acl,
                  m == 0   ? static_cast<int64_t>(r.below(256))
                  : m == 1 ? 0
                  : m == 2 ? 255
                           : 127 + static_cast<int64_t>(r.below(2)));
      }
      break;
    }
    case Fill::kStep: {
      static const int64_t kSteps[] = {
          -1, (int64_t{1} << 62) - 1, int64_t{1} << 62, kI64Max, kI64Min, kP31, kP32, 1000000};
      for (size_t i = 0; i < count; ++i) {
        const int m = mode % 4;
        store_int(p + i * es, acl,
                  m == 0   ? static_cast<int64_t>(r.below(100))
                  : m == 1 ? 0
                  : m == 2 ? kSteps[r.below(8)]
                           : static_cast<int64_t>(r.next()));
      }
      break;
    }
    case Fill::kQmapSigned:
    case Fill::kQmapUnsigned: {
      const bool sgn = kind == Fill::kQmapSigned;
      const int m = mode % 9;
      for (size_t i = 0; i < count; ++i) {
        float f =
            sgn ? -1.0f + 2.0f * static_cast<float>(i) / 255.0f : static_cast<float>(i) / 255.0f;
        if (m == 2) f = 0.0f;
        if (m == 6) f = gen_float(4, r);
        if (m == 8) f = -f;
        store_float(p + i * es, acl, f);
      }
      if (count >= 2) {
        const size_t k = r.below(std::min<size_t>(count, 256) - 1);
        if (m == 3) {  // one pair out of order
          std::vector<uint8_t> t(p + k * es, p + (k + 1) * es);
          std::memmove(p + k * es, p + (k + 1) * es, es);
          std::memcpy(p + (k + 1) * es, t.data(), es);
        } else if (m == 4) {
          store_float(p + k * es, acl, std::numeric_limits<float>::quiet_NaN());
        } else if (m == 5) {
          store_float(p + (std::min<size_t>(count, 256) - 1) * es, acl,
                      std::numeric_limits<float>::infinity());
        } else if (m == 7 && sgn && count >= 129) {  // 0.0 then -0.0: equal, so still ascending
          store_float(p + 127 * es, acl, 0.0f);
          store_float(p + 128 * es, acl, -0.0f);
        }
      }
      break;
    }
    default:
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Statuses, the world of one input
// ---------------------------------------------------------------------------------------------

bool documented_status(int st) {
  return st == 0 || st == 161001 || st == 161002 || st == 361001 || st == 561000 || st == 561002 ||
         st == 561003;
}

const std::string &poison_message() {
  static const std::string m = [] {
    (void)aclrtSetDevice(-4242);
    return std::string(aclGetRecentErrMsg());
  }();
  return m;
}

void poison() {
  (void)poison_message();
  (void)aclrtSetDevice(-4242);
}

void check_status(int st, const char *call) {
  FZ_CHECK(documented_status(st), "%s returned %d, not a documented status", call, st);
  if (st != 0) {
    const char *m = aclGetRecentErrMsg();
    FZ_CHECK(m != nullptr && m[0] != '\0', "%s returned %d with an empty message", call, st);
    FZ_CHECK(poison_message() != m, "%s returned %d but recorded no message of its own", call, st);
  }
}

Outcome g_outcome;

bool same_float(const uint8_t *a, const uint8_t *b, int32_t acl) {
  const size_t n = real_esize(acl);
  if (std::memcmp(a, b, n) == 0) return true;
  const bool is_float = acl == ACL_FLOAT || acl == ACL_FLOAT16 || acl == ACL_BF16;
  return is_float && std::isnan(load_float(a, acl)) && std::isnan(load_float(b, acl));
}

aclTensor *World::add(const TensorSpec &s, Fill kind, int64_t bound) {
  Created c;
  c.spec = s;
  c.kind = kind;
  if (!s.present) {
    tensors_.push_back(c);
    return nullptr;
  }
  const int rank = std::min(s.rank, kMaxRank);
  c.esize = lib_esize(s.dtype);
  bool bad = s.rank > 8 || s.offset < 0;
  bool empty = false;
  __int128 lo = 0, hi = 0, numel = 1;
  for (int i = 0; i < rank; ++i) {
    if (s.dims[i] < 0) bad = true;
    if (s.dims[i] == 0) empty = true;
    if (s.dims[i] > 0) {
      // Saturated at 2^100 (each step stays below 2^127): far past anything a buffer holds.
      constexpr __int128 kSat = static_cast<__int128>(1) << 100;
      const __int128 span = static_cast<__int128>(s.dims[i] - 1) * s.strides[i];
      (span < 0 ? lo : hi) += span;
      lo = std::max(lo, -kSat);
      hi = std::min(hi, kSat);
      numel = sat_mul(numel, s.dims[i]);
    }
  }
  c.nonempty = !empty && !bad;
  c.numel = empty ? 0 : numel;
  c.lo = lo + s.offset;
  c.hi = hi + s.offset;
  const __int128 es = static_cast<__int128>(c.esize);
  const __int128 need =
      s.misalign + (empty ? std::max<__int128>(s.offset, 0) * es : (c.hi + 1) * es);
  const size_t own = !bad && need >= 0 && need <= static_cast<__int128>(kCap)
                         ? static_cast<size_t>(need) + (s.slack >= 192 ? s.slack - 191 : 0)
                         : kSmall + static_cast<size_t>(s.misalign);
  // Where the data lives.
  uint8_t *data = nullptr;
  __int128 avail = 0;  // elements from the data pointer to the end of the buffer
  if (s.null_data) {
    avail = c.nonempty && c.hi + 1 <= (static_cast<__int128>(1) << 40) ? c.hi + 1 : 1;
  } else {
    if (s.alias >= 0 && s.alias < static_cast<int>(tensors_.size()) && tensors_[s.alias].buf >= 0) {
      c.buf = tensors_[s.alias].buf;
    } else {
      c.buf = static_cast<int>(buffers_.size());
      buffers_.push_back(std::make_unique<Buffer>(own));
      Rng r{rng_.next() ^ (static_cast<uint64_t>(tensors_.size()) << 32)};
      Buffer &b = *buffers_.back();
      const size_t skip = std::min<size_t>(s.misalign, b.size);
      for (size_t i = 0; i < skip; ++i) b.payload()[i] = static_cast<uint8_t>(r.next());
      fill_buffer(b.payload() + skip, b.size - skip, s.dtype, kind, s.fill, bound, r);
    }
    Buffer &b = *buffers_[c.buf];
    c.data_off = std::min<size_t>(s.misalign, b.size);
    data = b.payload() + c.data_off;
    avail = static_cast<__int128>((b.size - c.data_off) / c.esize);
  }
  const bool fits = c.nonempty && c.lo >= 0 && c.hi < avail;
  // The storage description (never larger than the buffer).
  int64_t sdims[9] = {static_cast<int64_t>(avail), 1, 1, 1, 1, 1, 1, 1, 1};
  uint64_t snum = 1;
  const int64_t *sptr = sdims;
  if (s.storage >= kStorageNineDims) {
    snum = 9;
  } else if (s.storage >= kStorageNegative) {
    sdims[0] = -1;
  } else if (s.storage >= kStorageZero) {
    sdims[0] = 0;
  } else if (s.storage >= kStorageTwoD) {
    sdims[0] = static_cast<int64_t>(avail / 2);
    sdims[1] = 2;
    snum = 2;
  } else if (s.storage >= kStorageNone) {
    if (fits || empty) {
      sptr = nullptr;
      snum = 0;
    }
  } else if (s.storage >= kStorageTight) {
    if (fits) sdims[0] = static_cast<int64_t>(c.hi + 1);
  }
  c.storage_given = sptr != nullptr;
  __int128 storage_elems = 1;
  bool storage_negative = false;
  for (uint64_t i = 0; i < snum && sptr != nullptr; ++i) {
    if (sdims[i] < 0) storage_negative = true;
    storage_elems = sdims[i] < 0 ? -1 : sat_mul(storage_elems, sdims[i]);
  }
  c.t = aclCreateTensor(s.dims, static_cast<uint64_t>(s.rank), static_cast<aclDataType>(s.dtype),
                        s.explicit_strides ? s.strides : nullptr, s.offset,
                        static_cast<aclFormat>(s.format), sptr, snum, data);
  if (c.t == nullptr) {
    const char *m = aclGetRecentErrMsg();
    FZ_CHECK(m != nullptr && m[0] != '\0', "aclCreateTensor(%s) refused without a message", s.name);
  } else {
    c.created = true;
    FZ_CHECK(s.rank <= 8 && snum <= 8, "aclCreateTensor(%s) accepted %d dims, %d storage dims",
             s.name, s.rank, static_cast<int>(snum));
    FZ_CHECK(!bad, "aclCreateTensor(%s) accepted a negative size or offset", s.name);
    FZ_CHECK(!(c.storage_given && storage_negative),
             "aclCreateTensor(%s) accepted a negative storage size", s.name);
    if (c.storage_given && c.nonempty) {
      FZ_CHECK(c.lo >= 0 && c.hi < storage_elems,
               "aclCreateTensor(%s) accepted a view reaching elements [%lld, %lld] of a storage "
               "of %lld elements",
               s.name, static_cast<long long>(c.lo), static_cast<long long>(c.hi),
               static_cast<long long>(storage_elems));
    }
    // The harness's own promise: what the library may touch lies in the buffer.
    FZ_CHECK(!c.nonempty || s.null_data || fits, "harness: %s is outside its buffer", s.name);
  }
  if (std::getenv("FUSEKIT_FUZZ_DEBUG") != nullptr) debug_print(c);
  tensors_.push_back(c);
  return c.t;
}

void World::debug_print(const Created &c) const {
  const TensorSpec &s = c.spec;
  std::fprintf(stderr, "[fuzz] %-10s %s dtype %d format %d dims [", s.name,
               c.t != nullptr ? "created" : "REFUSED", s.dtype, s.format);
  for (int i = 0; i < s.rank; ++i)
    std::fprintf(stderr, "%s%lld", i ? ", " : "", (long long)s.dims[i]);
  std::fprintf(stderr, "] strides%s [", s.explicit_strides ? "" : " (contiguous)");
  for (int i = 0; i < s.rank; ++i) {
    std::fprintf(stderr, "%s%lld", i ? ", " : "", (long long)s.strides[i]);
  }
  std::fprintf(stderr, "] offset %lld misalign %d buffer %d (%zu bytes) null_data %d: %s\n",
               (long long)s.offset, s.misalign, c.buf,
               c.buf >= 0 ? buffers_[c.buf]->size : size_t{0}, s.null_data,
               c.t != nullptr ? "" : aclGetRecentErrMsg());
  if (c.buf >= 0 && c.t != nullptr) {
    const Buffer &b = *buffers_[c.buf];
    std::fprintf(stderr, "           data:");
    const size_t es = real_esize(s.dtype);
    for (size_t k = 0; k < 24 && c.data_off + (k + 1) * es <= b.size; ++k) {
      const uint8_t *p = b.mem.get() + kGuard + c.data_off + k * es;
      if (s.dtype == ACL_INT32 || s.dtype == ACL_INT64) {
        int64_t v = 0;
        std::memcpy(&v, p, es);
        if (es == 4) v = static_cast<int32_t>(v);
        std::fprintf(stderr, " %lld", (long long)v);
      } else {
        std::fprintf(stderr, " %g", load_float(p, s.dtype));
      }
    }
    std::fprintf(stderr, "\n");
  }
}

__int128 World::work() const {
  __int128 w = 0;
  for (const Created &c : tensors_) w += c.created ? c.numel : 0;
  return w;
}

void World::destroy_tensors() {
  for (Created &c : tensors_) {
    if (c.t != nullptr) {
      const int st = aclDestroyTensor(c.t);
      FZ_CHECK(st == 0, "aclDestroyTensor(%s) returned %d", c.spec.name, st);
      c.t = nullptr;
    }
  }
}

void World::snapshot() {
  snap_.clear();
  for (auto &b : buffers_) snap_.emplace_back(b->mem.get(), b->mem.get() + b->total());
  allowed_.assign(buffers_.size(), {});
  for (size_t i = 0; i < buffers_.size(); ++i) allowed_[i].assign(buffers_[i]->size, 0);
}

std::vector<std::vector<uint8_t>> World::state() const {
  std::vector<std::vector<uint8_t>> r;
  for (auto &b : buffers_) r.emplace_back(b->mem.get(), b->mem.get() + b->total());
  return r;
}

void World::expect_state(const std::vector<std::vector<uint8_t>> &st, const char *when) const {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    FZ_CHECK(std::memcmp(buffers_[i]->mem.get(), st[i].data(), st[i].size()) == 0,
             "%s: buffer %zu (%s) changed", when, i, owner(i));
  }
}

void World::expect_unchanged(const char *when) const {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const Buffer &b = *buffers_[i];
    if (std::memcmp(b.mem.get(), snap_[i].data(), b.total()) != 0) {
      size_t k = 0;
      while (b.mem[k] == snap_[i][k]) ++k;
      violated("%s: byte %lld of buffer %zu (%s) changed: 0x%02x -> 0x%02x", when,
               static_cast<long long>(k) - static_cast<long long>(kGuard), i, owner(i), snap_[i][k],
               b.mem[k]);
    }
  }
}

void World::allow_element(int i, int64_t elem, size_t esize) {
  const Created &c = tensors_[i];
  if (c.buf < 0) return;
  const __int128 off = static_cast<__int128>(c.data_off) + static_cast<__int128>(elem) * esize;
  FZ_CHECK(off >= 0 && off + esize <= buffers_[c.buf]->size,
           "harness: element %lld of %s is outside its buffer", static_cast<long long>(elem),
           c.spec.name);
  std::fill_n(allowed_[c.buf].begin() + static_cast<size_t>(off), esize, 1);
}

void World::for_each_element(int i, const std::function<void(int64_t, int64_t)> &f) const {
  const Created &c = tensors_[i];
  if (!c.nonempty) return;
  FZ_CHECK(c.numel <= static_cast<__int128>(kCap) * 8 + 64,
           "%s was accepted with %lld elements over a buffer of at most %zu bytes", c.spec.name,
           static_cast<long long>(c.numel), kCap);
  const int rank = c.spec.rank;
  int64_t idx[8] = {};
  const int64_t n = static_cast<int64_t>(c.numel);
  for (int64_t k = 0; k < n; ++k) {
    int64_t e = c.spec.offset;
    for (int d = 0; d < rank; ++d) e += idx[d] * c.spec.strides[d];
    f(k, e);
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < c.spec.dims[d]) break;
      idx[d] = 0;
    }
  }
}

void World::allow_all(int i) {
  const size_t es = tensors_[i].esize;
  for_each_element(i, [&](int64_t, int64_t e) { allow_element(i, e, es); });
}

void World::expect_only_allowed_writes(const char *when) const {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const Buffer &b = *buffers_[i];
    FZ_CHECK(b.guards_intact(), "%s: a guard byte of buffer %zu (%s) was overwritten", when, i,
             owner(i));
    for (size_t k = 0; k < b.size; ++k) {
      if (!allowed_[i][k] && b.mem[kGuard + k] != snap_[i][kGuard + k]) {
        violated("%s: byte %zu of buffer %zu (%s) changed outside the outputs: 0x%02x -> 0x%02x",
                 when, k, i, owner(i), snap_[i][kGuard + k], b.mem[kGuard + k]);
      }
    }
  }
}

std::vector<std::unique_ptr<Buffer>> World::copies() const {
  std::vector<std::unique_ptr<Buffer>> r;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    r.push_back(std::make_unique<Buffer>(buffers_[i]->size));
    std::memcpy(r.back()->mem.get(), snap_[i].data(), buffers_[i]->total());
  }
  return r;
}

fusekit::TensorView World::view(int i, std::vector<std::unique_ptr<Buffer>> &in) const {
  const Created &c = tensors_[i];
  fusekit::TensorView v;
  if (!c.created) return v;
  v.dtype = lib_dtype(c.spec.dtype);
  v.ndim = c.spec.rank;
  for (int d = 0; d < c.spec.rank; ++d) {
    v.shape[d] = c.spec.dims[d];
    v.strides[d] = c.spec.strides[d];
  }
  if (c.buf >= 0) {
    v.data = in[c.buf]->payload() + c.data_off + c.spec.offset * static_cast<int64_t>(c.esize);
  }
  return v;
}

const uint8_t *World::now_at(int i, int64_t e) const {
  const Created &c = tensors_[i];
  return buffers_[c.buf]->payload() + c.data_off + e * static_cast<int64_t>(c.esize);
}

const uint8_t *World::before_at(int i, int64_t e) const {
  const Created &c = tensors_[i];
  return before(c.buf) + c.data_off + e * static_cast<int64_t>(c.esize);
}

int64_t World::index_before(int i, int64_t e) const {
  const uint8_t *p = before_at(i, e);
  if (tensors_[i].spec.dtype == ACL_INT64) {
    int64_t v;
    std::memcpy(&v, p, 8);
    return v;
  }
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void World::expect_same_as(std::vector<std::unique_ptr<Buffer>> &ref,
                           const std::vector<std::pair<int, int64_t>> &elems,
                           const char *what) const {
  for (const auto &[i, e] : elems) {
    const Created &c = tensors_[i];
    const uint8_t *a = now_at(i, e);
    uint8_t *b = ref[c.buf]->payload() + c.data_off + e * static_cast<int64_t>(c.esize);
    if (!same_float(a, b, c.spec.dtype)) {
      violated("%s: %s element %lld is %.9g (0x%08x), the reference gives %.9g (0x%08x)", what,
               c.spec.name, static_cast<long long>(e), load_float(a, c.spec.dtype),
               bits_of(a, c.spec.dtype), load_float(b, c.spec.dtype), bits_of(b, c.spec.dtype));
    }
    std::memcpy(b, a, real_esize(c.spec.dtype));
  }
  for (size_t k = 0; k < buffers_.size(); ++k) {
    const Buffer &a = *buffers_[k];
    for (size_t j = 0; j < a.size; ++j) {
      if (a.mem[kGuard + j] != ref[k]->mem[kGuard + j]) {
        violated("%s: byte %zu of buffer %zu (%s) is 0x%02x, the reference run left 0x%02x", what,
                 j, k, owner(k), a.mem[kGuard + j], ref[k]->mem[kGuard + j]);
      }
    }
  }
}

uint32_t World::bits_of(const uint8_t *p, int32_t acl) {
  uint32_t v = 0;
  std::memcpy(&v, p, real_esize(acl) > 4 ? 4 : real_esize(acl));
  return v;
}

const char *World::owner(size_t buf) const {
  for (const Created &c : tensors_) {
    if (c.buf == static_cast<int>(buf)) return c.spec.name;
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// The two phases
// ---------------------------------------------------------------------------------------------

Phases decode_phases(Input &in) {
  Phases p;
  p.p1 = in.u8("p1");
  p.ws = in.u8("ws");
  p.stream = in.u8("stream");
  p.ex = in.u8("exmode");
  p.threads = in.u8("threads");
  p.seed = in.u32("seed");
  return p;
}

void apply_threads(const Phases &p) {
  fusekit::set_num_threads(p.threads < 192 ? 0 : 1 + p.threads % 3);
}

aclrtStream stream_for(uint8_t code) {
  static aclrtStream live = [] {
    aclrtStream s = nullptr;
    if (aclrtCreateStream(&s) != ACL_SUCCESS) std::abort();
    return s;
  }();
  static aclrtStream dead = [] {
    aclrtStream s = nullptr;
    if (aclrtCreateStream(&s) != ACL_SUCCESS || aclrtDestroyStream(s) != ACL_SUCCESS) std::abort();
    return s;
  }();
  static int garbage;
  if (code >= kStreamGarbage) return &garbage;
  if (code >= kStreamDestroyed) return dead;
  if (code >= kStreamLive) return live;
  return nullptr;
}

bool run_phases(World &w, const Phases &p, int st, uint64_t ws_size, aclOpExecutor *ex,
                const char *op, PhaseTwoFn phase_two, const std::function<void()> &mark) {
  g_outcome.phase1 = st;
  check_status(st, op);
  w.expect_unchanged("phase one");
  if (st != 0) {
    FZ_CHECK(ex == nullptr, "%sGetWorkspaceSize failed with %d but returned an executor", op, st);
    return false;
  }
  FZ_CHECK(ex != nullptr, "%sGetWorkspaceSize succeeded without an executor", op);
  // Phase two on views of more than 2^20 elements in all is not run (time), nor when asked not to.
  if (w.work() > (static_cast<__int128>(1) << 20) || p.ex >= kExDestroy) {
    int d = aclDestroyAclOpExecutor(ex);
    FZ_CHECK(d == 0, "aclDestroyAclOpExecutor returned %d", d);
    poison();
    d = aclDestroyAclOpExecutor(ex);
    FZ_CHECK(d == ACLNN_ERR_PARAM_INVALID, "a second aclDestroyAclOpExecutor returned %d", d);
    check_status(d, "aclDestroyAclOpExecutor");
    w.expect_unchanged("aclDestroyAclOpExecutor");
    return false;
  }
  aclrtStream stream = stream_for(p.stream);
  if (p.ex >= kExDestroyTensors) {
    w.destroy_tensors();
  } else if (p.ex >= kExNullFirst && p.ex < kExTwice) {
    poison();
    const int s0 = phase_two(nullptr, 0, nullptr, stream);
    FZ_CHECK(s0 == ACLNN_ERR_PARAM_NULLPTR, "%s(executor = null) returned %d", op, s0);
    check_status(s0, op);
    w.expect_unchanged("phase two with a null executor");
  }
  // The workspace, with guard bytes right after the size given (and a checked prefix when the
  // pointer is misaligned on purpose).
  FZ_CHECK(ws_size <= (uint64_t{1} << 32), "%s asked for a workspace of %llu bytes", op,
           static_cast<unsigned long long>(ws_size));
  uint64_t size = ws_size;
  bool expect_refusal = false;
  if (p.ws >= kWsShort && p.ws < kWsNull && ws_size > 0) {
    size = ws_size - 1;
    expect_refusal = true;
  }
  if (p.ws >= kWsLarger && p.ws < kWsMisaligned) size = ws_size + 100;
  const size_t mis = p.ws >= kWsMisaligned ? 1 + p.ws % 63 : 0;
  Buffer wsbuf(static_cast<size_t>(size) + mis);
  uint8_t *wsp = wsbuf.payload() + mis;
  std::memset(wsbuf.payload(), kGuardByte, mis);
  if (p.ws >= kWsNull && p.ws < kWsLarger && ws_size > 0) {
    wsp = nullptr;
    expect_refusal = true;
  }
  if (size == 0 && p.ws < kWsShort) wsp = nullptr;  // a null workspace is fine when none is asked
  if (p.stream >= kStreamDestroyed) expect_refusal = true;
  poison();
  const int s2 = phase_two(wsp, size, ex, stream);
  g_outcome.phase2 = s2;
  check_status(s2, op);
  FZ_CHECK(wsbuf.guards_intact() && std::all_of(wsbuf.payload(), wsbuf.payload() + mis,
                                                [](uint8_t b) { return b == kGuardByte; }),
           "%s wrote outside its workspace (%llu bytes asked, %llu given, pointer offset %d)", op,
           static_cast<unsigned long long>(ws_size), static_cast<unsigned long long>(size),
           static_cast<int>(mis));
  if (expect_refusal)
    FZ_CHECK(s2 != 0, "%s accepted a short or null workspace or a dead stream", op);
  if (s2 != 0) {
    w.expect_unchanged("a failed phase two");
    return false;
  }
  mark();
  w.expect_only_allowed_writes("phase two");
  if (p.ex >= kExTwice && p.ex < kExDestroyTensors) {
    const auto after_first = w.state();
    poison();
    const int s3 = phase_two(wsp, size, ex, stream);
    FZ_CHECK(s3 == ACLNN_ERR_PARAM_INVALID, "%s ran a consumed executor (%d)", op, s3);
    check_status(s3, op);
    w.expect_state(after_first, "phase two on a consumed executor");
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Seeds, rows
// ---------------------------------------------------------------------------------------------

Values with(const Values &base, const Values &extra) {
  Values v = base;
  for (const auto &[k, x] : extra) v[k] = x;
  return v;
}

void maybe_write_seeds(const std::vector<Seed> &seeds, DecodeFn decode, RunFn run) {
  const char *dir = std::getenv("FUSEKIT_FUZZ_WRITE_SEEDS");
  if (dir == nullptr || *dir == '\0') return;
  int bad = 0;
  std::vector<std::vector<uint8_t>> encoded;
  for (const Seed &s : seeds) {  // every file first: a reproducer that crashes stops the runs
    std::vector<uint8_t> bytes;
    Input rec(&s.values, &bytes);
    decode(rec);
    for (const std::string &k : rec.unused()) {
      std::fprintf(stderr, "seed %s: field %s is never read\n", s.name, k.c_str());
      ++bad;
    }
    const std::string path = std::string(dir) + "/" + s.name;
    FILE *f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      std::exit(1);
    }
    std::fclose(f);
    encoded.push_back(std::move(bytes));
  }
  for (size_t i = 0; i < seeds.size(); ++i) {
    const Seed &s = seeds[i];
    if (s.finding != nullptr && avoid(s.finding)) {
      std::fprintf(stderr, "seed %-28s reproduces finding %s: not run\n", s.name, s.finding);
      continue;
    }
    g_outcome = Outcome();
    run(encoded[i].data(), encoded[i].size());
    const Outcome o = g_outcome;
    const bool ok = s.expect == Expect::kAny ||
                    (s.expect == Expect::kPhaseOneFails && o.phase1 > 0) ||
                    (s.expect == Expect::kPhaseTwoFails && o.phase1 == 0 && o.phase2 > 0) ||
                    (s.expect == Expect::kSucceeds && o.phase1 == 0 && o.phase2 == 0);
    std::fprintf(stderr, "seed %-28s %3zu bytes  phase one %6d  phase two %6d  %s\n", s.name,
                 encoded[i].size(), o.phase1, o.phase2, ok ? "as expected" : "UNEXPECTED");
    if (!ok) {
      std::fprintf(stderr, "  last message: %s\n", aclGetRecentErrMsg());
      ++bad;
    }
  }
  std::exit(bad == 0 ? 0 : 1);
}

TouchedRows touched_rows(const World &w, int idx, int table) {
  TouchedRows r;
  const Created &ic = w.tensor(idx);
  const int64_t n = ic.spec.dims[0], rows = w.tensor(table).spec.dims[0];
  for (int64_t k = 0; k < n; ++k) {
    const int64_t row = w.index_before(idx, ic.spec.offset + k * ic.spec.strides[0]);
    if (row < 0 || row >= rows) continue;
    auto &occ = r.occurrences[row];
    if (occ.empty()) r.order.push_back(row);
    occ.push_back(k);
  }
  return r;
}

int64_t elem2(const World &w, int t, int64_t row, int64_t j) {
  const Created &c = w.tensor(t);
  return c.spec.offset + row * c.spec.strides[0] + j * c.spec.strides[1];
}

}  // namespace fz
