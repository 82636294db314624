// fusekit: element types.
#ifndef FUSEKIT_DTYPE_H_
#define FUSEKIT_DTYPE_H_

#include <cstddef>
#include <cstdint>

namespace fusekit {

enum class DType : int32_t { kFloat32, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kOther };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kUInt8:
      return 1;
    default:
      return 0;
  }
}

constexpr const char *dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kUInt8:
      return "uint8";
    default:
      return "unsupported";
  }
}

// Storage types for the 16-bit floats: plain bit patterns (convert with fusekit/float16.h).
struct float16_t {
  uint16_t bits;
};
struct bfloat16_t {
  uint16_t bits;
};

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType dtype_of<float16_t>() {
  return DType::kFloat16;
}
template <>
constexpr DType dtype_of<bfloat16_t>() {
  return DType::kBFloat16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kInt64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::kUInt8;
}

}  // namespace fusekit

#endif  // FUSEKIT_DTYPE_H_
