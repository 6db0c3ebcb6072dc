// CheckpointIndex: every tensor of a directory of *.safetensors files
// (sharded checkpoints included), memory-mapped, looked up by name with its
// shape checked against what config.json implies. Shared by the CPU weight
// loader (to float32) and the CUDA uploader (raw bytes to the device).
//
// Thread-safety: immutable after Open; views live as long as the index.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/safetensors.h"

namespace ballast::engine {

class CheckpointIndex {
 public:
  absl::Status Open(const std::string& dir);
  bool Has(const std::string& name) const { return index_.count(name) > 0; }
  // The tensor `name` with shape {rows, cols} ({cols} when rows == 0).
  // NOT_FOUND or INVALID_ARGUMENT naming the file and the tensor.
  absl::StatusOr<const TensorView*> Get(const std::string& name, int rows, int cols) const;
  // The row scales of FP8 (F8_E4M3) weight `weight_name` of `rows` rows:
  // its "..._scale" tensor ("x.weight" -> "x.weight_scale", as vLLM's fp8
  // and compressed-tensors write them), one value (per tensor, repeated)
  // or one per row (shape [rows] or [rows, 1]), stored as F32, BF16 or
  // F16, finite and > 0. Errors name the file and the tensor.
  absl::StatusOr<std::vector<float>> Fp8RowScales(const std::string& weight_name, int rows) const;
  // Bytes of every tensor in its stored dtype.
  int64_t TotalBytes() const;
  // The file holding `name` (for error messages); "" if absent.
  std::string FileOf(const std::string& name) const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<SafetensorsFile*, const TensorView*>> index_;
};

}  // namespace ballast::engine
