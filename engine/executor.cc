#include "engine/executor.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ballast::engine {

absl::StatusOr<StepDoneSignal> ParseStepDoneSignal(const std::string& name) {
  if (name == "thread") return StepDoneSignal::kThread;
  if (name == "spinning_thread") return StepDoneSignal::kSpinningThread;
  if (name == "host_function") return StepDoneSignal::kHostFunction;
  if (name == "poll") return StepDoneSignal::kWorkerPoll;
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", name, "\" is unknown (expected thread, spinning_thread, host_function or poll)"));
}

absl::Status Executor::CopyKvToHost(absl::Span<const KvBlockCopy> copies) {
  for (const KvBlockCopy& c : copies) std::memcpy(c.host, c.block, c.bytes);
  return absl::OkStatus();
}

absl::Status Executor::CopyKvFromHost(absl::Span<const KvBlockCopy> copies) {
  for (const KvBlockCopy& c : copies) std::memcpy(c.block, c.host, c.bytes);
  return absl::OkStatus();
}

absl::Status Executor::MoveKvBlocks(absl::Span<const KvBlockMove> moves) {
  for (const KvBlockMove& m : moves) std::memcpy(m.to, m.from, m.bytes);
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
  if (static_cast<int>(started_.size()) >= max_started_steps()) {
    return absl::FailedPreconditionError("as many sampled steps started as the backend allows");
  }
  // Ahead chunks take their token from the previous step's rows.
  std::vector<SequenceChunk> chunks(batch.begin(), batch.end());
  std::vector<int> resolved(batch.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int row = chunks[i].from_row;
    if (row < 0) continue;
    if (row >= static_cast<int>(last_started_tokens_.size()) || chunks[i].tokens.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", i, " takes row ", row, " of a step that sampled ",
                       last_started_tokens_.size(), " rows (an ahead chunk is one token)"));
    }
    resolved[i] = last_started_tokens_[row];
    chunks[i].tokens = absl::MakeConstSpan(&resolved[i], 1);
    chunks[i].from_row = -1;
  }
  Started s;
  s.status = ForwardSample(chunks, sampling, &s.tokens, &s.logprobs);
  if (!s.status.ok()) return s.status;
  last_started_tokens_ = s.tokens;
  started_.push_back(std::move(s));
  return absl::OkStatus();
}

absl::Status Executor::FinishForwardSample(std::vector<int>* tokens,
                                           std::vector<TokenLogprobs>* logprobs) {
  if (started_.empty()) return absl::FailedPreconditionError("no sampled step was started");
  Started s = std::move(started_.front());
  started_.erase(started_.begin());
  *tokens = std::move(s.tokens);
  if (logprobs != nullptr) *logprobs = std::move(s.logprobs);
  return s.status;
}

}  // namespace ballast::engine
