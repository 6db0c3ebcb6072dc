#include "engine/executor.h"

#include <cstring>
#include <utility>

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

absl::Status Executor::StartForwardSample(absl::Span<const SequenceChunk> batch,
                                          absl::Span<const DeviceSampling> sampling,
                                          bool /*want_logprobs*/) {
  started_tokens_.clear();
  started_logprobs_.clear();
  return ForwardSample(batch, sampling, &started_tokens_, &started_logprobs_);
}

absl::Status Executor::FinishForwardSample(std::vector<int>* tokens,
                                           std::vector<TokenLogprobs>* logprobs) {
  *tokens = std::move(started_tokens_);
  if (logprobs != nullptr) *logprobs = std::move(started_logprobs_);
  started_tokens_.clear();
  started_logprobs_.clear();
  return absl::OkStatus();
}

}  // namespace ballast::engine
