#include "engine/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ballast::engine {

absl::Status CheckpointIndex::Open(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") paths.push_back(e.path().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  if (paths.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no *.safetensors files"));
  std::sort(paths.begin(), paths.end());
  for (const auto& p : paths) {
    auto f = SafetensorsFile::Open(p);
    if (!f.ok()) return f.status();
    for (const auto& [name, view] : (*f)->tensors()) index_[name] = {f->get(), &view};
    files_.push_back(std::move(*f));
  }
  return absl::OkStatus();
}

absl::StatusOr<const TensorView*> CheckpointIndex::Get(const std::string& name, int rows,
                                                       int cols) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor \"", name, "\" is missing from the checkpoint"));
  }
  const auto& [file, view] = it->second;
  const std::vector<int64_t> want =
      rows == 0 ? std::vector<int64_t>{cols} : std::vector<int64_t>{rows, cols};
  if (view->shape != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        file->path(), ": tensor \"", name, "\" has shape [", absl::StrJoin(view->shape, ", "),
        "], config.json implies [", absl::StrJoin(want, ", "), "]"));
  }
  return view;
}

absl::StatusOr<std::vector<float>> CheckpointIndex::Fp8RowScales(const std::string& weight_name,
                                                                 int rows) const {
  const std::string name = weight_name + "_scale";
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat(FileOf(weight_name), ": FP8 tensor \"", weight_name,
                                            "\" has no scale \"", name, "\""));
  }
  const auto& [file, view] = it->second;
  const int64_t n = view->numel();
  const bool per_row = n == rows && (view->shape == std::vector<int64_t>{rows} ||
                                     view->shape == std::vector<int64_t>{rows, 1});
  if ((n != 1 && !per_row) ||
      (view->dtype != DType::kF32 && view->dtype != DType::kBF16 && view->dtype != DType::kF16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        file->path(), ": scale \"", name, "\" must be one F32/BF16/F16 value or one per row (",
        rows, "); it is ", SafetensorsName(view->dtype), " [", absl::StrJoin(view->shape, ", "),
        "] (block-wise scales are not supported)"));
  }
  std::vector<float> scales(static_cast<size_t>(n));
  ToFloat(view->dtype, view->data, scales.data(), scales.size());
  for (float v : scales) {
    if (!(v > 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(file->path(), ": scale \"", name, "\" holds ", v, "; scales must be > 0"));
    }
  }
  if (n == 1) scales.assign(static_cast<size_t>(rows), scales[0]);
  return scales;
}

std::string CheckpointIndex::FileOf(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? "" : it->second.first->path();
}

int64_t CheckpointIndex::TotalBytes() const {
  int64_t total = 0;
  for (const auto& [name, where] : index_) total += static_cast<int64_t>(where.second->nbytes);
  return total;
}

}  // namespace ballast::engine
