// fusekit internal: the exact nearest-code search of the 8-bit optimizers (ApplyAdamWQuant,
// LazyAdamQuant): the search tables of a 256-entry map and the scalar search. The SIMD searches
// over these tables are common/quant_codes_hwy-inl.h (every Highway target) and
// common/avx512/quant_codes_avx512vbmi.h (AVX-512 VBMI, in registers). Built by quant_map.cc.
#ifndef FUSEKIT_COMMON_QUANT_SEARCH_H_
#define FUSEKIT_COMMON_QUANT_SEARCH_H_

#include <cstddef>
#include <cstdint>

namespace fusekit {

// ---------------------------------------------------------------------------------------------
// Nearest-code search. For an ascending map q[0..255] with K distinct values u_0 < ... < u_{K-1}
// (u_k first found at index first[k]), the code of a normalized value x is the entry nearest to x
// with ties to the lower index, where "nearer" is decided in float32 between the two values that
// bracket x: the upper one u_{k+1} wins iff fl(u_{k+1} - x) < fl(x - u_k). That choice is monotone
// in x, so it is one threshold per pair: thr[k] is the smallest float for which u_{k+1} wins, and
//   code(x) = first[#{k : thr[k] <= x}]          (a NaN x is taken as 0)
// thr[K-1 .. 255] hold NaN, which no comparison passes. The optimized kernel uses a table over
// buckets of floats (key(x) >> 16, key: the float's bits made monotone, -0 taken as +0):
//  - packed (when no bucket holds two thresholds and the sign fix cannot act, as with the dynamic
//    and linspace maps): one 32-bit entry per bucket = code below | code above << 8 | the low 16
//    key bits of the bucket's threshold << 16 (0 when it has none); one lookup, one comparison;
//  - else lut[bucket] is the count at the bucket's lowest float and `refine_steps` comparisons
//    with the next thresholds finish it.
// ---------------------------------------------------------------------------------------------
inline constexpr int kLutBuckets = 1 << 16;

// How a CPU kernel that can use the 65,536-entry lookup tables (cpu_hwy) finds the nearest code.
// Not an option: "cpu_hwy" is kAuto; its variants "cpu_hwy_table" and "cpu_hwy_binary_search"
// (planned by name only, for tests and tuning runs) force one way.
enum class QuantSearch {
  kAuto,          // kTable for steps of kQuantTableMinElements elements or more (building the
                  // tables costs about 0.1 ms), else kBinarySearch
  kTable,         // a 65,536-entry table over the normalized value's float bits, then a comparison
  kBinarySearch,  // 8 branch-free steps over the 255 decision thresholds
};
inline constexpr int64_t kQuantTableMinElements = 65536;
inline bool quant_wants_table(QuantSearch search, int64_t elements) {
  return search == QuantSearch::kTable ||
         (search == QuantSearch::kAuto && elements >= kQuantTableMinElements);
}

struct QuantMapTables {
  const float *q = nullptr;          // the map, 256 floats
  const float *thr = nullptr;        // 256 floats (NaN from K - 1 on)
  const int32_t *first = nullptr;    // 256: the code of count c
  const uint32_t *packed = nullptr;  // kLutBuckets entries, or null
  const uint8_t *lut =
      nullptr;           // kLutBuckets + 4 bytes, or null (then, without packed: binary search)
  int distinct = 0;      // K
  int refine_steps = 0;  // comparisons after the table lookup
  bool identity_first = true;  // first[c] == c (no repeated values)
  bool sign_fix = false;       // the sign fix can change a code (signed m maps only)
};

// Bytes of one map's tables (aligned to 64), with or without the lookup table.
size_t quant_tables_bytes(bool with_lut);
// Bytes of the search part alone (q, thr, first), at the start of the tables.
inline constexpr size_t kQuantSearchBytes = 3072;
// Bytes of the lookup part alone (packed or count table), after the search part.
size_t quant_lut_bytes();
// Builds one map's tables in `mem` (quant_tables_bytes(with_lut) bytes, 64-aligned). `q` holds 256
// ascending finite floats; `q_stride` is in elements. `for_m`: the sign fix applies if the map
// holds negative values. The same as build_quant_search then, with_lut, build_quant_lut on
// mem + kQuantSearchBytes.
void build_quant_tables(const float *q, int64_t q_stride, bool for_m, bool with_lut, void *mem,
                        QuantMapTables *out);
// The search part (q, thr, first and the flags) in `mem` (kQuantSearchBytes, 64-aligned); no
// lookup table.
void build_quant_search(const float *q, int64_t q_stride, bool for_m, void *mem,
                        QuantMapTables *out);
// The lookup table of built search tables `t` in `mem` (quant_lut_bytes(), 64-aligned): sets
// t->packed or t->lut (and t->refine_steps).
void build_quant_lut(QuantMapTables *t, void *mem);

// The monotone key of a float: the order of keys is the order of the floats (-0 just below +0).
inline uint32_t float_key(uint32_t bits) {
  return bits ^ ((bits >> 31) != 0 ? 0xffffffffu : 0x80000000u);
}
inline uint32_t key_to_bits(uint32_t key) {
  return key ^ ((key >> 31) != 0 ? 0x80000000u : 0xffffffffu);
}

// The reference search (also used to build the table): #{k : thr[k] <= x} over K - 1 thresholds.
int quant_count_reference(const QuantMapTables &t, float x);
// The full code of x, sign fix included (for m tables with sign_fix).
uint8_t quant_code_reference(const QuantMapTables &t, float x);

// The register tables of the AVX-512 VBMI search (common/avx512/quant_codes_avx512vbmi.h,
// VbmiTables) for an m map and a v map: at most this many bytes, 64-aligned.
inline constexpr size_t kQuantVbmiTablesBytes = 12288;

// Null when this CPU (and its operating system) runs AVX-512 F, BW, DQ, VL and VBMI code, else
// why not.
const char *avx512vbmi_cpu_why_not();

// What a single-ISA AVX-512 VBMI source (src/<op>/<op>_avx512vbmi.cc) exports: its kernel and the
// function that builds its register tables once per run (kQuantVbmiTablesBytes); both null in a
// library built for another CPU. Run it only where avx512vbmi_why_not(kernel) is null.
template <class Fn>
struct QuantVbmiKernel {
  Fn run = nullptr;
  void (*prepare)(const QuantMapTables &m, const QuantMapTables &v, void *out) = nullptr;
};
template <class Fn>
const char *avx512vbmi_why_not(const QuantVbmiKernel<Fn> &k) {
  return k.run == nullptr ? "this library was built for another CPU" : avx512vbmi_cpu_why_not();
}

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_QUANT_SEARCH_H_
