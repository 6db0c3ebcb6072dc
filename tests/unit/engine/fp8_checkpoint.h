// Test helper: rewrites a synthetic checkpoint as a pre-quantized FP8 one
// (as vLLM's fp8 or compressed-tensors write them), for the CPU and GPU
// FP8 tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "engine/dtype.h"
#include "engine/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ballast::engine::testing {

// Rewrites the checkpoint in `from` as an FP8 one in `to`: every linear
// weight as E4M3 bytes with "<name>_scale" (one F32 per row, shape
// [rows, 1], or one for the tensor, shape []), config.json with
// `quantization_config` added. Returns the per-row scales by tensor.
inline std::map<std::string, std::vector<float>> WriteFp8Checkpoint(
    const std::string& from, const std::string& to, bool per_channel,
    const std::string& quant_config) {
  std::filesystem::create_directories(to);
  auto file = SafetensorsFile::Open(from + "/model.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  std::vector<OwnedTensor> out;
  std::map<std::string, std::vector<float>> all_scales;
  for (const auto& [name, v] : (*file)->tensors()) {
    const bool linear = v.shape.size() == 2 && name.find("_proj.weight") != std::string::npos;
    if (!linear) {
      out.push_back({name, v.dtype, v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes)});
      continue;
    }
    const int rows = static_cast<int>(v.shape[0]), cols = static_cast<int>(v.shape[1]);
    std::vector<float> w(static_cast<size_t>(v.numel()));
    ToFloat(v.dtype, v.data, w.data(), w.size());
    float tensor_max = 0;
    for (float x : w) tensor_max = std::max(tensor_max, std::abs(x));
    std::vector<float> scales(static_cast<size_t>(rows), tensor_max / 448.0f);
    OwnedTensor q{name, DType::kFP8E4M3, v.shape, std::vector<uint8_t>(w.size())};
    for (int r = 0; r < rows; ++r) {
      if (per_channel) {
        float amax = 0;
        for (int i = 0; i < cols; ++i) amax = std::max(amax, std::abs(w[r * cols + i]));
        scales[r] = amax > 0 ? amax / 448.0f : 1.0f;
      }
      for (int i = 0; i < cols; ++i)
        q.bytes[r * cols + i] = FloatToFp8E4M3(w[r * cols + i] / scales[r]);
    }
    std::vector<int64_t> scale_shape =
        per_channel ? std::vector<int64_t>{rows, 1} : std::vector<int64_t>{};
    const size_t n = per_channel ? scales.size() : 1;
    OwnedTensor sc{name + "_scale", DType::kF32, scale_shape, std::vector<uint8_t>(n * 4)};
    std::memcpy(sc.bytes.data(), scales.data(), n * 4);
    out.push_back(std::move(q));
    out.push_back(std::move(sc));
    all_scales[name] = scales;
  }
  EXPECT_TRUE(WriteSafetensors(to + "/model.safetensors", out).ok());
  std::ifstream in(from + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["quantization_config"] = nlohmann::json::parse(quant_config);
  std::ofstream(to + "/config.json") << cfg.dump();
  return all_scales;
}

inline constexpr char kCompressedChannel[] = R"({"quant_method": "compressed-tensors",
  "format": "float-quantized", "config_groups": {"group_0": {"targets": ["Linear"],
  "weights": {"type": "float", "num_bits": 8, "strategy": "channel"},
  "input_activations": {"type": "float", "num_bits": 8, "strategy": "token", "dynamic": true}}}})";

}  // namespace ballast::engine::testing
