// Reading and writing Hugging Face safetensors files.
//
// SafetensorsFile memory-maps one file read-only and validates its header:
// every tensor's dtype, shape and byte range. Errors name the file and the
// tensor. The object is immutable after Open and safe to share across
// threads; views stay valid while the object lives.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/dtype.h"

namespace ballast::engine {

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const TensorView* Find(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
};

// A tensor to write: bytes already in `dtype`.
struct OwnedTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Writes `tensors` as one safetensors file (header padded to 8 bytes).
absl::Status WriteSafetensors(const std::string& path, const std::vector<OwnedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace ballast::engine
