#include "engine/executor.h"

#include <cstring>

namespace ballast::engine {

absl::Status Executor::CopyKvToHost(absl::Span<const KvBlockCopy> copies) {
  for (const KvBlockCopy& c : copies) std::memcpy(c.host, c.block, c.bytes);
  return absl::OkStatus();
}

absl::Status Executor::CopyKvFromHost(absl::Span<const KvBlockCopy> copies) {
  for (const KvBlockCopy& c : copies) std::memcpy(c.block, c.host, c.bytes);
  return absl::OkStatus();
}

absl::Status Executor::StartKvLoad(LayerKvCopies load) {
  for (const auto& layer : load.layers) {
    if (auto st = CopyKvFromHost(layer); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace ballast::engine
