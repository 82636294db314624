// fusekit internal: what the CPU runs of the 8-bit optimizers (ApplyAdamWQuant, LazyAdamQuant) do
// with their two maps before any kernel runs: read them once into local copies (strides gathered)
// and check them (256 finite floats, ascending), then bring the search tables (common/
// quant_search.h) and a kernel's derived tables up to date in a per-thread cache.
//
// The search tables are a pure function of a map's 256 floats (their bits) and cost about 15 us
// per map to build. A thread keeps, per operator, the last tables it built for an m map and a v
// map with the maps they were built from: a run whose maps have the same bits (memcmp of the
// 1 KiB copies) uses them as they are, whichever plan it is.
#ifndef FUSEKIT_COMMON_QUANT_RUN_TABLES_H_
#define FUSEKIT_COMMON_QUANT_RUN_TABLES_H_

#include <cstddef>

#include "common/quant_search.h"
#include "fusekit/quant_map.h"  // kQuantMapSize
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fusekit {

// Tables a kernel derives from the two maps' search tables (the VBMI kernels' register tables),
// written to `out` (kQuantVbmiTablesBytes).
using QuantPrepareFn = void (*)(const QuantMapTables &m, const QuantMapTables &v, void *out);

// The search tables of one m map and one v map, and what a kernel derived from them.
struct QuantTableCache {
  alignas(64) unsigned char search[2][kQuantSearchBytes];  // [0]: m (for_m), [1]: v; q comes first
  alignas(64) unsigned char prepared[kQuantVbmiTablesBytes];
  QuantMapTables tables[2];
  bool valid[2] = {false, false};
  QuantPrepareFn prepared_by = nullptr;  // the function whose tables `prepared` holds
};

// Whose cache: each operator keeps its own, so that alternating operators on one thread (whose
// kernels derive different tables) do not rebuild each other's.
enum class QuantCacheUser { kApplyAdamWQuant, kLazyAdamQuant };

// This thread's cache for `user`, or null if it could not be allocated (the run then constructs
// one in its workspace: sizeof(QuantTableCache) bytes, 64-aligned).
QuantTableCache *quant_thread_cache(QuantCacheUser user);

// Plan time: a map's view (named as the aclnn call names it) is float32 [256], any stride.
Status check_quant_map_view(const char *op, const TensorView &q, const char *name);

// Plan time: the state format is one of QuantStateFormat's that the operator takes (kFp8Ue3m5
// where takes_ue3m5), and its maps are what it needs: two float32 [256] views for kDynamicMap, two
// empty views (0 elements) for the FP8 formats, which have no map. *guard_lost_v becomes the guard
// the kernels run (asked for, or an FP8 format's).
Status check_quant_state(const char *op, QuantStateFormat format, bool guard_asked,
                         const TensorView &qmap_m, const TensorView &qmap_v, bool *guard_lost_v,
                         bool takes_ue3m5 = false);

// Phase two's first step: both maps read into maps[0] (qmapM) and maps[1] (qmapV) and checked;
// the refusal names `op`, the map, the index and the values ("...; nothing was modified").
Status read_quant_maps(const char *op, const TensorView &qmap_m, const TensorView &qmap_v,
                       float maps[2][kQuantMapSize]);

// Brings `cache` up to date with `maps` (the search tables of each map whose bits changed, then
// prepare's tables when the search tables or the function changed; prepare may be null). Returns
// whether anything was built.
bool refresh_quant_tables(QuantTableCache *cache, const float maps[2][kQuantMapSize],
                          QuantPrepareFn prepare);

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_QUANT_RUN_TABLES_H_
