// The maps' check and the per-thread search tables of the 8-bit optimizers' CPU runs
// (common/quant_run_tables.h).
#include "common/quant_run_tables.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "common/str_cat.h"

namespace fusekit {
namespace {

Status check_map(const char *op, const float *q, const char *name) {
  for (int i = 0; i < kQuantMapSize; ++i) {
    const float x = q[i];
    if (!std::isfinite(x)) {
      return Status::Invalid(
          str_cat(op, ": ", name, "[", i, "] = ", x, " is not finite; nothing was modified"));
    }
    if (i > 0 && x < q[i - 1]) {
      return Status::Invalid(str_cat(op, ": ", name, "[", i, "] = ", x, " is less than ", name, "[",
                                     i - 1, "] = ", q[i - 1],
                                     "; the map must be ascending; nothing was modified"));
    }
  }
  return Status::Ok();
}

void read_map(const TensorView &q, float *out) {
  const float *p = q.as<const float>();
  const int64_t s = q.strides[0];
  if (s == 1) {
    std::memcpy(out, p, kQuantMapSize * sizeof(float));
  } else {
    for (int i = 0; i < kQuantMapSize; ++i) out[i] = p[i * s];
  }
}

template <QuantCacheUser kUser>
QuantTableCache *cache_of() {
  thread_local std::unique_ptr<QuantTableCache> cache;
  thread_local bool tried = false;
  if (!tried) {
    tried = true;
    cache.reset(new (std::nothrow) QuantTableCache);
  }
  return cache.get();
}

}  // namespace

QuantTableCache *quant_thread_cache(QuantCacheUser user) {
  return user == QuantCacheUser::kApplyAdamWQuant ? cache_of<QuantCacheUser::kApplyAdamWQuant>()
                                                  : cache_of<QuantCacheUser::kLazyAdamQuant>();
}

Status read_quant_maps(const char *op, const TensorView &qmap_m, const TensorView &qmap_v,
                       float maps[2][kQuantMapSize]) {
  read_map(qmap_m, maps[0]);
  read_map(qmap_v, maps[1]);
  FUSEKIT_RETURN_IF_ERROR(check_map(op, maps[0], "qmapM"));
  return check_map(op, maps[1], "qmapV");
}

bool refresh_quant_tables(QuantTableCache *cache, const float maps[2][kQuantMapSize],
                          QuantPrepareFn prepare) {
  bool built = false;
  for (int r = 0; r < 2; ++r) {
    if (cache->valid[r] &&
        std::memcmp(cache->search[r], maps[r], kQuantMapSize * sizeof(float)) == 0) {
      continue;
    }
    build_quant_search(maps[r], 1, r == 0, cache->search[r], &cache->tables[r]);
    cache->valid[r] = true;
    cache->prepared_by = nullptr;
    built = true;
  }
  if (prepare != nullptr && cache->prepared_by != prepare) {
    prepare(cache->tables[0], cache->tables[1], cache->prepared);
    cache->prepared_by = prepare;
    built = true;
  }
  return built;
}

Status check_quant_map_view(const char *op, const TensorView &q, const char *name) {
  if (q.dtype != DType::kFloat32 || q.ndim != 1 || q.shape[0] != kQuantMapSize) {
    return Status::Invalid(str_cat(op, ": ", name, " must be float32 [256], got ",
                                   dtype_name(q.dtype), " ", q.shape_string()));
  }
  return Status::Ok();
}

Status check_quant_state(const char *op, QuantStateFormat format, bool guard_asked,
                         const TensorView &qmap_m, const TensorView &qmap_v, bool *guard_lost_v,
                         bool takes_ue3m5) {
  switch (format) {
    case QuantStateFormat::kDynamicMap:
      FUSEKIT_RETURN_IF_ERROR(check_quant_map_view(op, qmap_m, "qmapM"));
      FUSEKIT_RETURN_IF_ERROR(check_quant_map_view(op, qmap_v, "qmapV"));
      *guard_lost_v = guard_asked;
      return Status::Ok();
    case QuantStateFormat::kFp8Ue3m5:
      if (!takes_ue3m5) {
        return Status::Invalid(str_cat(
            op, ": state_format = 2 (fp8_ue3m5) is ApplyAdamWQuant's (dense layers); ", op,
            " takes 0 (dynamic_map) or 1 (fp8): an embedding row's moments span more decades "
            "than UE3M5's range (docs/fp8_state.md)"));
      }
      [[fallthrough]];
    case QuantStateFormat::kFp8:
      for (const auto &[q, name] : {std::pair{&qmap_m, "qmapM"}, std::pair{&qmap_v, "qmapV"}}) {
        if (q->numel() != 0) {
          return Status::Invalid(str_cat(op, ": ", name, " is ", dtype_name(q->dtype), " ",
                                         q->shape_string(), " but the ",
                                         quant_state_format_name(format),
                                         " state format has no map; pass an empty tensor (0 "
                                         "elements)"));
        }
      }
      *guard_lost_v = true;
      return Status::Ok();
  }
  return Status::Invalid(str_cat(op, ": state_format = ", static_cast<int>(format),
                                 " is not a state format (0: dynamic_map, 1: fp8",
                                 takes_ue3m5 ? ", 2: fp8_ue3m5)" : ")"));
}

const char *quant_state_format_name(QuantStateFormat f) {
  switch (f) {
    case QuantStateFormat::kDynamicMap:
      return "dynamic_map";
    case QuantStateFormat::kFp8:
      return "fp8";
    case QuantStateFormat::kFp8Ue3m5:
      return "fp8_ue3m5";
  }
  return "unknown";
}

}  // namespace fusekit
