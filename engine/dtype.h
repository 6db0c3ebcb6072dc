// Element types of weights and KV caches, and scalar conversions between
// them and float. Header-only; all functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ballast::engine {

// kFP8E4M3 (OCP E4M3FN: no infinities, max 448) is for KV caches only;
// weights are F32, BF16 or F16.
enum class DType { kF32, kBF16, kF16, kFP8E4M3 };

// Bytes per element.
inline size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kFP8E4M3:
      return 1;
    default:
      return 2;
  }
}

// Safetensors spelling: "F32", "BF16", "F16", "F8_E4M3".
const char* SafetensorsName(DType t);
absl::StatusOr<DType> DTypeFromSafetensors(std::string_view name);
// Config spelling: "f32", "bf16", "fp16", "fp8_e4m3" (also accepts "fp8", "float32", "bfloat16",
// "float16" as written by HF's torch_dtype).
const char* ConfigName(DType t);
absl::StatusOr<DType> DTypeFromConfig(std::string_view name);

inline float BF16ToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t FloatToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
// E4M3FN: round to nearest even, saturating at +-448; NaN stays NaN.
float Fp8E4M3ToFloat(uint8_t v);
uint8_t FloatToFp8E4M3(float f);

// Converts `n` elements of type `t` at `src` to float.
void ToFloat(DType t, const void* src, float* dst, size_t n);
// Converts `n` floats to type `t` at `dst`.
void FromFloat(DType t, const float* src, void* dst, size_t n);

}  // namespace ballast::engine
