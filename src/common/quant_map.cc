// The 8-bit optimizers' maps (ApplyAdamWQuant, LazyAdamQuant): the dynamic quantization maps, the
// exact nearest-code search tables (common/quant_search.h), and the CPU check of the AVX-512 VBMI
// search.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/quant_search.h"
#include "fusekit/quant_map.h"

namespace fusekit {

std::array<float, kQuantMapSize> create_dynamic_map(bool is_signed, int max_exponent_bits) {
  const int e = std::clamp(max_exponent_bits, 1, 7);
  constexpr int kNonSignBits = 7;  // 8 bits, one of them the sign (or, unsigned, one more split)
  std::vector<double> data;
  auto add_decade = [&](double scale, int fractions) {
    // The midpoints of `fractions` equal steps over [0.1, 1], scaled into the decade.
    for (int k = 0; k < fractions; ++k) {
      const double lo = 0.1 + 0.9 * k / fractions, hi = 0.1 + 0.9 * (k + 1) / fractions;
      data.push_back(scale * ((lo + hi) / 2.0));
      if (is_signed) data.push_back(-scale * ((lo + hi) / 2.0));
    }
  };
  for (int i = 0; i < e; ++i) {
    const int fractions =
        is_signed ? (1 << (i + kNonSignBits - e)) : (1 << (i + kNonSignBits - e + 1));
    add_decade(std::pow(10.0, -(e - 1) + i), fractions);
  }
  const int additional = (1 << (kNonSignBits - e)) - 1;
  if (additional > 0) add_decade(1.0, additional);
  data.push_back(0.0);
  data.push_back(1.0);
  while (data.size() < static_cast<size_t>(kQuantMapSize)) data.push_back(0.0);
  data.resize(kQuantMapSize);
  std::sort(data.begin(), data.end());
  std::array<float, kQuantMapSize> out;
  for (int i = 0; i < kQuantMapSize; ++i)
    out[static_cast<size_t>(i)] = static_cast<float>(data[static_cast<size_t>(i)]);
  return out;
}

namespace {

constexpr size_t kQOffset = 0, kThrOffset = 1024, kFirstOffset = 2048, kLutOffset = 3072;
static_assert(kLutOffset == kQuantSearchBytes);

// True when the upper of two bracketing values is strictly nearer to x (float32 distances).
inline bool upper_wins(float lo, float hi, float x) {
  const float d_hi = hi - x;
  const float d_lo = x - lo;
  return d_hi < d_lo;
}

// The smallest float x in (lo, hi] for which hi wins, found over the floats' monotone keys.
float threshold_between(float lo, float hi) {
  uint32_t a = float_key(std::bit_cast<uint32_t>(lo));  // lo never wins: loses here
  uint32_t b = float_key(std::bit_cast<uint32_t>(hi));  // hi wins at hi
  while (b - a > 1) {
    const uint32_t mid = a + (b - a) / 2;
    if (upper_wins(lo, hi, std::bit_cast<float>(key_to_bits(mid))))
      b = mid;
    else
      a = mid;
  }
  return std::bit_cast<float>(key_to_bits(b));
}

}  // namespace

size_t quant_tables_bytes(bool with_lut) {
  return with_lut ? kLutOffset + quant_lut_bytes() : kLutOffset;
}

size_t quant_lut_bytes() {
  return (kLutBuckets * sizeof(uint32_t) + 64 + 63) / 64 * 64;
}

int quant_count_reference(const QuantMapTables &t, float x) {
  if (std::isnan(x)) x = 0.0f;
  int lo = 0, hi = t.distinct - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (t.thr[mid] <= x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

uint8_t quant_code_reference(const QuantMapTables &t, float x) {
  if (std::isnan(x)) x = 0.0f;
  int code = t.first[quant_count_reference(t, x)];
  if (t.sign_fix && x * t.q[code] < 0.0f)
    code = std::clamp(code + (x > 0.0f ? 1 : -1), 0, kQuantMapSize - 1);
  return static_cast<uint8_t>(code);
}

void build_quant_tables(const float *q_in, int64_t q_stride, bool for_m, bool with_lut, void *mem,
                        QuantMapTables *out) {
  build_quant_search(q_in, q_stride, for_m, mem, out);
  if (with_lut) build_quant_lut(out, static_cast<char *>(mem) + kLutOffset);
}

void build_quant_search(const float *q_in, int64_t q_stride, bool for_m, void *mem,
                        QuantMapTables *out) {
  auto *base = static_cast<char *>(mem);
  auto *q = reinterpret_cast<float *>(base + kQOffset);
  auto *thr = reinterpret_cast<float *>(base + kThrOffset);
  auto *first = reinterpret_cast<int32_t *>(base + kFirstOffset);
  if (q != q_in || q_stride != 1) {
    for (int i = 0; i < kQuantMapSize; ++i) q[i] = q_in[i * q_stride];
  }

  // Distinct values (float equality: -0 and +0 are one value), their first indices, thresholds.
  int k = 0;
  first[0] = 0;
  for (int i = 1; i < kQuantMapSize; ++i) {
    if (q[i] != q[first[k]]) {
      thr[k] = threshold_between(q[first[k]], q[i]);
      first[++k] = i;
    }
  }
  const int distinct = k + 1;
  for (int i = distinct - 1; i < kQuantMapSize; ++i)
    thr[i] = std::numeric_limits<float>::quiet_NaN();
  for (int i = distinct; i < kQuantMapSize; ++i) first[i] = first[distinct - 1];

  QuantMapTables t;
  t.q = q;
  t.thr = thr;
  t.first = first;
  t.distinct = distinct;
  t.identity_first = distinct == kQuantMapSize;
  t.sign_fix = false;
  if (for_m && q[0] < 0.0f) {
    // The code is monotone in x, so the fix can act only if the smallest positive (negative) float
    // already lands on a negative (positive) entry.
    const float tiny = std::numeric_limits<float>::denorm_min();
    const float q_pos = q[first[quant_count_reference(t, tiny)]];
    const float q_neg = q[first[quant_count_reference(t, -tiny)]];
    t.sign_fix = q_pos < 0.0f || q_neg > 0.0f;
  }
  *out = t;
}

void build_quant_lut(QuantMapTables *out, void *mem) {
  QuantMapTables &t = *out;
  const float *thr = t.thr;
  const int32_t *first = t.first;
  const int distinct = t.distinct;
  auto *base = static_cast<char *>(mem);
  t.packed = nullptr;
  t.lut = nullptr;
  t.refine_steps = 0;
  // Thresholds per bucket (a threshold of -0 would sit in the negative bucket 0x7fff; x is never
  // -0 there, so it belongs with +0 in bucket 0x8000, low bits 0).
  auto bucket_key = [](float f) {
    const uint32_t key = float_key(std::bit_cast<uint32_t>(f));
    return key == 0x7fffffffu ? 0x80000000u : key;
  };
  bool packable = !t.sign_fix;
  for (int c = 1; packable && c < distinct - 1; ++c) {
    packable = (bucket_key(thr[c]) >> 16) != (bucket_key(thr[c - 1]) >> 16);
  }
  if (packable) {
    auto *packed = reinterpret_cast<uint32_t *>(base);
    int c = 0;
    for (uint32_t b = 0; b < static_cast<uint32_t>(kLutBuckets); ++b) {
      // c: the count below this bucket; a threshold inside it moves the code at its low bits.
      const uint32_t below = static_cast<uint32_t>(first[c]);
      if (c < distinct - 1 && (bucket_key(thr[c]) >> 16) == b) {
        const uint32_t low = bucket_key(thr[c]) & 0xffffu;
        packed[b] = below | static_cast<uint32_t>(first[c + 1]) << 8 | low << 16;
        ++c;
      } else {
        packed[b] = below | below << 8;
      }
    }
    t.packed = packed;
  } else {
    auto *lut = reinterpret_cast<uint8_t *>(base);
    int c = 0, widest = 0;
    for (uint32_t b = 0; b < static_cast<uint32_t>(kLutBuckets); ++b) {
      const float x = std::bit_cast<float>(key_to_bits(b << 16));
      while (c < distinct - 1 && x >= thr[c]) ++c;
      lut[b] = static_cast<uint8_t>(c);
      if (b > 0) widest = std::max(widest, c - lut[b - 1]);
    }
    // The last bucket holds +Inf and NaNs only; past it, padding for 4-byte gathers.
    std::memset(lut + kLutBuckets, 0, 64);
    t.lut = lut;
    t.refine_steps = widest;
  }
}

const char *avx512vbmi_cpu_why_not() {
#if defined(__x86_64__) || defined(__i386__)
  // libgcc's and compiler-rt's checks include the operating system's support of the AVX-512 state.
  static const char *const why = []() -> const char * {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx512vl")) {
      return "the CPU lacks AVX-512 (F, BW, DQ and VL)";
    }
    if (!__builtin_cpu_supports("avx512vbmi")) return "the CPU lacks AVX-512 VBMI";
    return nullptr;
  }();
  return why;
#else
  return "not an x86 CPU";
#endif
}

}  // namespace fusekit
