// Executor: the model-executor interface every backend implements (cpu/
// now, cuda/ later). One call runs one forward step over a flat batch of
// sequence chunks: prefill chunks and single decode tokens mixed. Attention
// reads and writes KV only through each sequence's block table, so the
// backend never changes when the allocator does.
//
// Thread-safety: an Executor is driven by one thread at a time. A step may
// be split (StartForwardSample / FinishForwardSample) so that several
// models' steps run on one device at once, each executor on its own stream.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kv_cache.h"
#include "engine/model_config.h"
#include "engine/sampler.h"
#include "memory/remap_plan.h"

namespace ballast::engine {

enum class LogitsMode {
  kNone,  // no logits (a prefill chunk that does not end the prompt)
  kLast,  // logits of the chunk's last token
  kAll,   // logits of every token of the chunk (tests, scoring)
};

struct SequenceChunk {
  // Block table with capacity for start_pos + tokens.size() positions; KV of
  // positions [0, start_pos) already written by earlier steps.
  const SequenceKv* kv = nullptr;
  int start_pos = 0;
  absl::Span<const int> tokens;
  LogitsMode logits = LogitsMode::kLast;
  // Ahead steps (StartForwardSample while the previous step runs): >= 0
  // makes the chunk one token whose id is the token the previous started
  // step sampled for its row `from_row`, read where that step left it (on
  // the device for GPUs); tokens[0] is then a placeholder, not read. -1:
  // the ids are in `tokens`.
  int from_row = -1;
};

// How to draw one token on the device: the request's sampling options, its
// seed, how many tokens it has drawn so far (the counter-based generator
// makes each draw reproducible from (seed, counter)), and its penalty
// entries (engine/sampler.h; empty unless options.has_penalties()).
struct DeviceSampling {
  SamplingOptions options;
  uint64_t seed = 0;
  uint64_t counter = 0;
  absl::Span<const PenaltyEntry> penalties;
};

// One KV block's bytes moving between the cache (`block`: the allocator's
// address, device memory on GPUs) and host memory (`host`).
struct KvBlockCopy {
  uint8_t* block = nullptr;
  uint8_t* host = nullptr;
  size_t bytes = 0;
};

// One KV block's bytes moving to another block of the same cache (KV
// compaction, engine/kv_relocation.h): both are allocator addresses.
struct KvBlockMove {
  const uint8_t* from = nullptr;
  uint8_t* to = nullptr;
  size_t bytes = 0;
};

// Block copies grouped by the layer whose KV they hold: layers[l] are layer
// l's copies (may be empty). A layer-wise load (Executor::StartKvLoad)
// finishes them in layer order.
struct LayerKvCopies {
  std::vector<std::vector<KvBlockCopy>> layers;
  bool empty() const {
    for (const auto& l : layers) {
      if (!l.empty()) return false;
    }
    return true;
  }
};

// A model's weights kept in host memory while it is not resident (the
// CPU backend's float32 tensors, the CUDA backend's device image in pinned
// memory), so the next activation copies them instead of reading and
// converting the checkpoint. Immutable; shared by reference.
class HostWeights {
 public:
  virtual ~HostWeights() = default;
  virtual int64_t bytes() const = 0;  // host memory held
};

// Where one decoder layer's weights lie in the executor's weight image
// (the pages ModelEngineOptions::weight_pages maps), for remapping.
struct LayerExtent {
  size_t offset = 0;
  size_t bytes = 0;
};

struct LayerStreamingStats {
  int64_t streamed_bytes = 0;  // copied into slots so far
  double stall_seconds = 0;    // compute waited for a copy (not hidden)
};

// How a GPU executor signals the end of a step's device work to whoever
// asked (the device worker, with several models' steps in flight). On an
// H200 with six 130M models under load (docs/benchmarks.md, "The end of a
// step"), the spinning thread gave 137-141k tokens/s against 125-130k for
// the other two.
enum class StepDoneSignal {
  // A thread of the executor's own, asleep on an event recorded after the
  // step (cudaEventBlockingSync; StepDoneWaiter). One thread per model
  // that asks; no hold on the stream; woken no sooner than a host function.
  kThread,
  // The same thread, waiting on an event without cudaEventBlockingSync:
  // the driver spins (cudaDeviceScheduleAuto, while the process has fewer
  // contexts than cores), so the end is seen at once, at the cost of a
  // busy core per model while several models' steps are in flight. The
  // default.
  kSpinningThread,
  // A host function queued on the step's stream (cudaLaunchHostFunc). It
  // holds the stream's next work (an ahead step) until it has run on the
  // driver's single callback thread.
  kHostFunction,
  // No signal: the device worker polls its models' step events itself
  // (ModelEngine::StepDeviceEnded): one busy core per device while several
  // models' steps are in flight, however many models, and no cross-thread
  // wake-up. Measured slower than the spinning thread (six 130M models on
  // an H200: 125-126k tokens/s against 134k in the same lease), so only
  // for hosts short of cores.
  kWorkerPoll,
};

// "thread", "spinning_thread", "host_function", "poll".
absl::StatusOr<StepDoneSignal> ParseStepDoneSignal(const std::string& name);

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs the step. `logits` receives, in chunk order, one row of
  // vocab_size floats per requested token.
  virtual absl::Status Forward(absl::Span<const SequenceChunk> batch,
                               std::vector<float>* logits) = 0;
  // Backends that sample on the device (so logits never cross to the host)
  // return true and implement ForwardSample.
  virtual bool samples_on_device() const { return false; }
  // Runs the step and draws one token per requested logits row (`sampling`
  // has one entry per row, in chunk order) into `tokens`, following
  // engine/sampler.h's rule. `logprobs` (may be null) gets one entry per
  // row; rows whose options.top_logprobs >= 0 are filled, others left empty.
  virtual absl::Status ForwardSample(absl::Span<const SequenceChunk> batch,
                                     absl::Span<const DeviceSampling> sampling,
                                     std::vector<int>* tokens,
                                     std::vector<TokenLogprobs>* logprobs) {
    return absl::UnimplementedError("this backend samples on the host");
  }
  // ForwardSample in two halves, so the host can do other work (another
  // model's step on the same device) while this step runs: Start queues
  // the step and returns; Finish waits for it and reads its tokens (as
  // ForwardSample's `tokens` and `logprobs`). `want_logprobs`: some row
  // has options.top_logprobs >= 0. REQUIRES: at most one step started and
  // not finished; Finish only after a Start that returned OK; the chunks'
  // block tables and KV stay untouched until Finish returns (the device
  // may still write them). The default runs ForwardSample in Start.
  // With max_started_steps() == 2 a second Start may follow before the
  // first's Finish (an ahead step: its chunks may take tokens from the
  // first's rows, SequenceChunk::from_row); Finish then ends the oldest.
  virtual absl::Status StartForwardSample(absl::Span<const SequenceChunk> batch,
                                          absl::Span<const DeviceSampling> sampling,
                                          bool want_logprobs);
  virtual absl::Status FinishForwardSample(std::vector<int>* tokens,
                                           std::vector<TokenLogprobs>* logprobs);
  // How many sampled steps may be started and not finished at once: 1, or
  // 2 where the backend can queue a step behind a running one (its inputs
  // staged apart, its tokens taken from the first's on the device). The
  // default halves (which compute in Start) support 2: a backend using
  // them opts in.
  virtual int max_started_steps() const { return 1; }
  // Copies KV blocks to host memory (session export to the lower tiers)
  // or from it (a lease's chunks into a sequence's blocks); returns when
  // the copies are done. The default is memcpy (KV in host memory); GPU
  // backends copy on their own stream. CopyKvToHost REQUIRES: every write
  // to the blocks has completed as the host sees it (a finished step, a
  // synchronous copy) and no started step writes them, so the copy need not
  // wait for one (a GPU backend copies beside an ahead step queued on the
  // model's stream). ModelEngine exports only sequences that no step in
  // flight computes for (Retire).
  virtual absl::Status CopyKvToHost(absl::Span<const KvBlockCopy> copies);
  virtual absl::Status CopyKvFromHost(absl::Span<const KvBlockCopy> copies);
  // Copies KV blocks to other blocks of the cache (compaction); returns
  // when the copies are done. REQUIRES: no step in flight and no load
  // pending (the blocks are neither read nor written meanwhile); the
  // blocks of a move do not overlap. The default is memcpy.
  virtual absl::Status MoveKvBlocks(absl::Span<const KvBlockMove> moves);
  // Layer-wise loading of KV from host memory (a lease's chunks, before
  // the step that extends the sequence): starts the copies and returns.
  // The next Forward/ForwardSample waits, before layer l touches the KV
  // cache, for layer l's copies only, so early layers compute while later
  // ones load. The host bytes must stay valid until WaitKvLoad returns or a
  // forward has run. REQUIRES: no earlier load still pending (WaitKvLoad or
  // a forward consumed it). The default copies everything before returning.
  virtual absl::Status StartKvLoad(LayerKvCopies load);
  // Blocks until the started load is done: after a failed forward (its
  // blocks are about to be freed) or to load synchronously. Its status.
  virtual absl::Status WaitKvLoad() { return absl::OkStatus(); }
  // Parameter remapping (Mirage; memory/remap_plan.h). Backends that
  // support it return one extent per decoder layer; empty: unsupported.
  virtual std::vector<LayerExtent> LayerExtents() const { return {}; }
  // From the next forward on, streams plan.streamed through plan.slots
  // slots from the host copy (streamed layer k in slot k % slots, slot s
  // being streamed[s]'s own memory); the empty plan streams nothing.
  // REQUIRES: no step in flight; every layer outside plan.Lent() resident
  // in its home (RestoreLayers first for layers a previous plan lent).
  // Outputs are bit-identical with any plan: the same kernels read the same
  // bytes from another address.
  virtual absl::Status SetLayerStreaming(const memory::StreamingPlan& plan) {
    return absl::UnimplementedError("this backend does not stream weight layers");
  }
  // Copies `layers` from the host copy back into their homes (their pages
  // were just mapped again). REQUIRES: no step in flight.
  virtual absl::Status RestoreLayers(absl::Span<const int> layers) {
    return absl::UnimplementedError("this backend does not stream weight layers");
  }
  // Times one layer's copy from the host copy (T_T of Mirage §5.4).
  virtual absl::StatusOr<double> MeasureLayerTransferSeconds() {
    return absl::UnimplementedError("this backend does not stream weight layers");
  }
  virtual LayerStreamingStats streaming_stats() const { return {}; }
  // From the next step on, runs steps at the device's greatest stream
  // priority (true) or the default one (false), so that urgent work is
  // scheduled ahead of other models' steps sharing the device. Ordered
  // after the steps already queued. REQUIRES: no step in flight. Backends
  // with no stream priorities ignore it.
  virtual absl::Status SetUrgent(bool urgent) { return absl::OkStatus(); }
  // Calls `done` once the device work of the step StartForwardSample began
  // has ended, on any thread (on CUDA a waiting thread of the executor's,
  // or the driver's callback thread: StepDoneSignal): it must not block or
  // call the executor. At once if no device step is pending (backends
  // that compute in FinishForwardSample).
  virtual void NotifyWhenStepDone(std::function<void()> done) { done(); }
  // Whether the device work of every started step has ended, without
  // waiting (true where steps compute in Start or Finish).
  virtual bool StartedStepsEnded() const { return true; }
  // The same for the oldest started step alone.
  virtual bool OldestStartedStepEnded() const { return true; }
  virtual const ModelConfig& config() const = 0;
  // Bytes of weights this executor holds (checkpoint dtype on the CPU, the
  // device copy on GPUs).
  virtual int64_t weight_bytes() const = 0;
  // Device memory the executor allocated besides weights and KV
  // (activations, GEMM workspace, step metadata). 0 on the CPU.
  virtual int64_t workspace_bytes() const { return 0; }
  // The weights in host memory, for a later activation of the same model
  // with the same backend (ModelEngineOptions::host_weights). May copy
  // (CUDA: device to pinned host memory); the executor stays usable.
  virtual absl::StatusOr<std::shared_ptr<const HostWeights>> KeepHostWeights() = 0;

 private:
  // The default StartForwardSample's results, oldest first, until
  // FinishForwardSample; the last started step's tokens (from_row reads
  // them, finished or not).
  struct Started {
    absl::Status status;
    std::vector<int> tokens;
    std::vector<TokenLogprobs> logprobs;
  };
  std::vector<Started> started_;
  std::vector<int> last_started_tokens_;
};

}  // namespace ballast::engine
