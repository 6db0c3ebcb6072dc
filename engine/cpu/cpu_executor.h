// CpuExecutor: the reference backend. Plain C++ with float32 arithmetic,
// single-threaded; every per-token computation (projections, attention over
// the cached prefix) is done the same way whatever the batch, so results do
// not depend on batching, chunking or the KV block size.
//
// Thread-safety: driven by one thread at a time (see Executor).
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/executor.h"
#include "engine/kv_cache.h"
#include "engine/layer_kv_loader.h"
#include "engine/rope.h"
#include "engine/weights.h"
#include "transfer/layer_streamer.h"

namespace ballast::engine {

// The CPU backend's host copy: the float32 tensors themselves, shared (no
// copy is made; eviction just keeps them).
class CpuHostWeights final : public HostWeights {
 public:
  explicit CpuHostWeights(std::shared_ptr<const ModelWeights> w);
  int64_t bytes() const override { return bytes_; }
  const std::shared_ptr<const ModelWeights>& weights() const { return weights_; }

 private:
  std::shared_ptr<const ModelWeights> weights_;
  int64_t bytes_ = 0;
};

class CpuExecutor final : public Executor {
 public:
  // `kv` must outlive the executor. `sample_in_step`: draw tokens in the
  // step as a GPU does (ForwardSample; each draw from (seed, counter), see
  // ForwardSample), so engine paths that need it (ahead steps) run without
  // a GPU. Default false: the engine samples on the host.
  static absl::StatusOr<std::unique_ptr<CpuExecutor>> Create(
      const ModelConfig& config, std::shared_ptr<const ModelWeights> weights, KvCache* kv,
      bool sample_in_step = false);

  absl::Status Forward(absl::Span<const SequenceChunk> batch, std::vector<float>* logits) override;
  bool samples_on_device() const override { return sample_in_step_; }
  // The default halves, two at a time, when sampling in the step.
  int max_started_steps() const override { return sample_in_step_ ? 2 : 1; }
  // Forward, then engine/sampler.h's SampleToken per row with a generator
  // seeded from (seed, counter) alone, so a draw does not depend on what
  // else is in the step (not the GPU's Philox stream: tokens match the
  // GPU's only for greedy requests).
  absl::Status ForwardSample(absl::Span<const SequenceChunk> batch,
                             absl::Span<const DeviceSampling> sampling, std::vector<int>* tokens,
                             std::vector<TokenLogprobs>* logprobs) override;
  // Layer-wise: a LayerKvLoader thread copies while Forward computes,
  // layer l waiting for layer l's blocks only.
  absl::Status StartKvLoad(LayerKvCopies load) override;
  absl::Status WaitKvLoad() override;
  // Remapping: the layers' extents are their shares of the checkpoint's
  // stored bytes in file order (embedding first), since the weight pages
  // only stand for the heap tensors in the budget. Streaming copies a
  // layer's tensors from the shared ModelWeights (the host copy) into a
  // slot's tensors on a LayerStreamer thread while earlier layers compute.
  std::vector<LayerExtent> LayerExtents() const override;
  absl::Status SetLayerStreaming(const memory::StreamingPlan& plan) override;
  absl::Status RestoreLayers(absl::Span<const int> layers) override;
  absl::StatusOr<double> MeasureLayerTransferSeconds() override;
  LayerStreamingStats streaming_stats() const override;
  const ModelConfig& config() const override { return config_; }
  int64_t weight_bytes() const override { return weights_->stored_bytes; }
  absl::StatusOr<std::shared_ptr<const HostWeights>> KeepHostWeights() override {
    return std::make_shared<const CpuHostWeights>(weights_);
  }

 private:
  CpuExecutor(const ModelConfig& config, std::shared_ptr<const ModelWeights> weights, KvCache* kv,
              bool sample_in_step);
  void ApplyRope(float* vec, int num_heads, int pos) const;
  // One decoder layer's halves, updating the residual stream x [T][hidden]
  // in place: the attention block (tokens at pos[t] of chunk owner[t];
  // writes their K/V) and the MLP block.
  void AttentionBlock(int l, const LayerWeights& L, absl::Span<const SequenceChunk> batch,
                      const std::vector<int>& pos, const std::vector<int>& owner,
                      std::vector<float>* x);
  void MlpBlock(const LayerWeights& L, int T, std::vector<float>* x);
  // Final norm and LM head for the rows each chunk asks for.
  void ComputeLogits(absl::Span<const SequenceChunk> batch, const std::vector<float>& x,
                     std::vector<float>* logits) const;

  ModelConfig config_;
  bool sample_in_step_ = false;
  std::shared_ptr<const ModelWeights> weights_;
  KvCache* kv_;
  std::vector<float> inv_freq_;            // [head_dim / 2], Llama-3 scaling applied
  std::unique_ptr<LayerKvLoader> loader_;  // made by the first StartKvLoad
  // Remapping: the slots' tensors and the streamer filling them (null: no
  // layer streamed). slot_bytes_ counts what the streamer copied.
  std::vector<LayerWeights> slots_;
  std::unique_ptr<transfer::LayerStreamer> streamer_;
  std::atomic<int64_t> slot_bytes_{0};
  LayerStreamingStats retired_;  // of streamers replaced
};

}  // namespace ballast::engine
