#include "engine/dtype.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ballast::engine {

const char* SafetensorsName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kFP8E4M3:
      return "F8_E4M3";
  }
  return "?";
}

absl::StatusOr<DType> DTypeFromSafetensors(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "F8_E4M3") return DType::kFP8E4M3;
  return absl::InvalidArgumentError(absl::StrCat("unsupported dtype \"", std::string(name),
                                                 "\" (supported: F32, BF16, F16, F8_E4M3)"));
}

const char* ConfigName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "fp16";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
  }
  return "?";
}

absl::StatusOr<DType> DTypeFromConfig(std::string_view name) {
  if (name == "f32" || name == "float32" || name == "fp32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "fp16" || name == "f16" || name == "float16") return DType::kF16;
  if (name == "fp8" || name == "fp8_e4m3" || name == "float8_e4m3fn") return DType::kFP8E4M3;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", std::string(name),
                                                 "\" (expected f32, bf16, fp16 or fp8_e4m3)"));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // subnormal or zero
  } else if (exp == 31) {
    v = mant ? std::nanf("") : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t FloatToHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {
    // Subnormal half (or zero): value = mant * 2^-24, round to nearest even.
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // 2^24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped bits.
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float Fp8E4M3ToFloat(uint8_t v) {
  const uint32_t sign = v >> 7, exp = (v >> 3) & 0xfu, mant = v & 0x7u;
  float r;
  if (exp == 0xf && mant == 0x7) {
    r = std::nanf("");
  } else if (exp == 0) {
    r = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant * 2^-6 / 8
  } else {
    r = std::ldexp(static_cast<float>(mant | 0x8u), static_cast<int>(exp) - 10);
  }
  return sign ? -r : r;
}

uint8_t FloatToFp8E4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate (E4M3FN has no infinity)
  // Quantum of a's binade: 2^(e-3) for normals (e >= -6), 2^-9 below.
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int exp = std::max(e - 1, -6);
  const float q = std::ldexp(1.0f, exp - 3);
  const float r = std::nearbyint(a / q) * q;  // round to nearest even
  if (r == 0.0f) return sign;
  int re;
  std::frexp(r, &re);
  const int rexp = re - 1;
  if (rexp < -6) return sign | static_cast<uint8_t>(r / std::ldexp(1.0f, -9));  // subnormal
  const uint8_t mant = static_cast<uint8_t>(r / std::ldexp(1.0f, rexp - 3)) & 0x7u;
  return sign | static_cast<uint8_t>((rexp + 7) << 3) | mant;
}

void ToFloat(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = BF16ToFloat(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(s[i]);
      return;
    }
    case DType::kFP8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = Fp8E4M3ToFloat(s[i]);
      return;
    }
  }
}

void FromFloat(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = FloatToBF16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = FloatToHalf(src[i]);
      return;
    }
    case DType::kFP8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = FloatToFp8E4M3(src[i]);
      return;
    }
  }
}

}  // namespace ballast::engine
