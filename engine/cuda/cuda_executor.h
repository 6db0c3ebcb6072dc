// CudaExecutor: the GPU backend of the Executor interface (one model on one
// device). Per step: embedding, then per layer fused residual+RMSNorm, one
// QKV GEMM (cuBLASLt), fused bias+RoPE+paged KV append, paged attention
// (prefill chunks and decode tokens in one launch), O GEMM, residual+RMSNorm,
// one gate/up GEMM, SiLU-and-multiply, down GEMM; then the final norm over
// the rows that need logits, the LM head, and (ForwardSample) sampling on
// the GPU so only token ids cross to the host.
//
// Decode-only steps are replayed from CUDA graphs captured per (batch
// bucket, block-table bucket): the batch is padded to its bucket
// (engine/graph_buckets.h: a power of two up to 256 tokens, then a
// multiple of 64) with tokens at position -1 that touch nothing.
//
// KV blocks come from the KvCache's allocator, which must hand out device
// memory (a HostBlockPool over cudaMalloc'd storage, or a KvArena over a
// CudaPagePool); the kernels map block ids to addresses with the
// allocator's affine rule (BlockAddressing).
//
// Thread-safety: one thread at a time (see Executor).
#pragma once

#include <atomic>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/device_weights.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/kernels.h"
#include "engine/cuda/sm_partition.h"
#include "engine/cuda/step_done_waiter.h"
#include "engine/executor.h"
#include "engine/gpu_backend.h"
#include "engine/graph_buckets.h"
#include "engine/kv_cache.h"

namespace ballast::engine::cuda {

using CudaExecutorOptions = GpuExecutorOptions;

class CudaExecutor final : public Executor {
 public:
  // `kv` must outlive the executor; its dtype must be the activation type
  // (BF16, FP16 for FP16 checkpoints) or FP8-E4M3.
  static absl::StatusOr<std::unique_ptr<CudaExecutor>> Create(const ModelConfig& config,
                                                              const std::string& model_dir,
                                                              KvCache* kv,
                                                              const CudaExecutorOptions& options);
  ~CudaExecutor() override;

  absl::Status Forward(absl::Span<const SequenceChunk> batch, std::vector<float>* logits) override;
  bool samples_on_device() const override { return true; }
  absl::Status ForwardSample(absl::Span<const SequenceChunk> batch,
                             absl::Span<const DeviceSampling> sampling, std::vector<int>* tokens,
                             std::vector<TokenLogprobs>* logprobs) override;
  // The step's tokens come back through pinned memory and an event: Finish
  // waits for this executor's step alone. Two steps may be started (the
  // second staged in the other pinned mirror, queued behind the first on
  // the stream); ahead chunks' tokens are copied on the device from the
  // first step's sampled tokens, which stay in meta_ until the next
  // sampling.
  absl::Status StartForwardSample(absl::Span<const SequenceChunk> batch,
                                  absl::Span<const DeviceSampling> sampling,
                                  bool want_logprobs) override;
  absl::Status FinishForwardSample(std::vector<int>* tokens,
                                   std::vector<TokenLogprobs>* logprobs) override;
  int max_started_steps() const override { return 2; }
  const ModelConfig& config() const override { return config_; }
  int64_t weight_bytes() const override { return weights_->bytes(); }
  int64_t workspace_bytes() const override { return workspace_bytes_; }
  absl::StatusOr<std::shared_ptr<const HostWeights>> KeepHostWeights() override;
  // Return when done (cuda_kv_copy.cc). Exports (CopyKvToHost) run on a
  // stream of their own, beside any started step (Executor::CopyKvToHost's
  // contract), after stream_'s work when none is started; imports on
  // stream_, ordered after its steps.
  absl::Status CopyKvToHost(absl::Span<const KvBlockCopy> copies) override;
  absl::Status CopyKvFromHost(absl::Span<const KvBlockCopy> copies) override;
  // On stream_, through the staged copies' span buffers; returns once done.
  absl::Status MoveKvBlocks(absl::Span<const KvBlockMove> moves) override;
  // On a copy stream, after the steps already queued; the next step's
  // layer l waits (on the device) for layer l's copies only.
  absl::Status StartKvLoad(LayerKvCopies load) override;
  absl::Status WaitKvLoad() override;

  // Parameter remapping (cuda_layer_stream.cc): streamed layers are copied
  // from a pinned host image of the weights (the activation's host copy,
  // or one SaveToHost makes on first use) into their slots on a copy
  // stream; events order each copy after its slot's last reader and each
  // streamed layer after its copy. The step joins the copies it started
  // before it ends, so CUDA graphs capture them (slot addresses fixed; a
  // new plan drops the graphs).
  std::vector<LayerExtent> LayerExtents() const override;
  absl::Status SetLayerStreaming(const memory::StreamingPlan& plan) override;
  absl::Status RestoreLayers(absl::Span<const int> layers) override;
  absl::StatusOr<double> MeasureLayerTransferSeconds() override;
  LayerStreamingStats streaming_stats() const override;
  // Switches stream_ between streams_[0] (default priority) and streams_[1]
  // (the greatest), the new one waiting for the old one's queued work.
  absl::Status SetUrgent(bool urgent) override;
  // After the last started step: by step_waiter_'s thread
  // (options_.step_done thread or spinning_thread) or a host function
  // queued on stream_ (host_function, or if the waiter fails).
  void NotifyWhenStepDone(std::function<void()> done) override;
  bool StartedStepsEnded() const override;
  bool OldestStartedStepEnded() const override;

  // The activation type this model runs in (from its torch_dtype).
  static ActType ActivationType(const ModelConfig& config);
  // Steps replayed from graphs so far (for tests and benchmarks).
  int64_t graph_replays() const { return graph_replays_; }
  // The rows (the bucket, engine/graph_buckets.h) of the last step
  // replayed from a graph (for tests).
  int last_graph_rows() const { return last_graph_rows_; }
  // The split-KV attention plan of the last step staged (for tests).
  AttentionPlan last_attention_plan() const { return last_attention_plan_; }
  // The SMs its steps run on: the device's, or its SM partition's.
  int num_sms() const { return num_sms_; }
  // The split-KV attention kernel's resident blocks an SM, as its plans
  // assume (PagedAttentionBlocksPerSm).
  int attention_blocks_per_sm() const { return attention_blocks_per_sm_; }
  // cuBLASLt plans its steps made whose algorithm the warm-up at
  // activation did not launch (Gemm::unwarmed_plans; for tests).
  int unwarmed_gemm_plans() const { return gemm_->unwarmed_plans(); }

 private:
  struct StepShape {
    int tokens = 0;       // T (padded in graph mode)
    int seqs = 0;         // block-table rows
    int max_blocks = 0;   // block-table stride
    int max_context = 0;  // longest context in the step (bucketed in graph mode)
    int rows = 0;         // logits rows (padded in graph mode)
    int real_rows = 0;    // logits rows of real tokens (the first ones)
    bool sample = false;
    bool graph = false;
    int prefill_tiles = 0;  // tensor-core prefill attention tiles
    int small_tokens = 0;   // tokens left to the split-KV attention kernel
    bool resolve = false;   // some token comes from the previous step's rows
    // The split-KV kernel's tokens: their contexts' sum and the longest
    // (WriteTokens), and its plan from them (PlanAttention).
    int64_t small_context = 0;
    int small_longest = 0;
    AttentionPlan attention;
  };
  CudaExecutor(const ModelConfig& config, KvCache* kv, const CudaExecutorOptions& options);
  absl::Status Init(const std::string& model_dir);
  // Stages the batch into pinned memory and copies it to the device, in
  // the steps below.
  absl::StatusOr<StepShape> Stage(absl::Span<const SequenceChunk> batch,
                                  absl::Span<const DeviceSampling> sampling, bool sample);
  // One chunk's KV capacity, context limit and token ids.
  absl::Status CheckChunk(size_t index, const SequenceChunk& chunk) const;
  // The step's shape after checking every chunk; graph steps are bucketed.
  absl::StatusOr<StepShape> Shape(absl::Span<const SequenceChunk> batch, size_t num_sampling,
                                  bool sample) const;
  // Host metadata: token ids, sequence, position and logit-row arrays,
  // prefill tiles (counted into *shape), graph padding.
  void WriteTokens(absl::Span<const SequenceChunk> batch, StepShape* shape);
  // Sampling rows' parameters, and their penalty entries flattened into
  // penalties_ (grown first when they do not fit) and uploaded.
  absl::Status WriteSampleParams(absl::Span<const DeviceSampling> sampling, const StepShape& shape);
  // Makes penalties_ hold `entries`; growing it drops the sampling graphs
  // (they captured its address).
  absl::Status ReservePenalties(size_t entries);
  // Copies the rows' log-probabilities back from a step's pinned mirror
  // `host` (after the step's event), for the rows marked in `wanted`.
  void ReadLogprobs(const uint8_t* host, const std::vector<bool>& wanted, int rows,
                    std::vector<TokenLogprobs>* logprobs) const;
  void WriteBlockTable(absl::Span<const SequenceChunk> batch, const StepShape& shape);
  // Copies the staged metadata to meta_ on stream_ (asynchronous).
  absl::Status Upload(const StepShape& shape);
  absl::Status Run(const StepShape& shape);
  // KV block copies through the staging buffer (cuda_kv_copy.cc).
  absl::Status InitKvStaging();
  // Bytes of the split-KV workspace for a full step; in deterministic mode
  // also chooses fixed_partition_tokens_.
  size_t AttentionWorkspaceBytes();
  absl::Status StagedKvCopy(absl::Span<const KvBlockCopy> copies, bool to_host);
  // StagedKvCopy's pieces, queued on `stream` (not waited for).
  absl::Status QueueKvPieces(absl::Span<const KvBlockCopy> copies, bool to_host,
                             cudaStream_t stream, const char* what);
  absl::Status ReserveLoadSpans(size_t spans);
  // The step's kernels on stream_: embedding, Layers, final norm, LM head
  // and sampling.
  absl::Status Enqueue(const StepShape& shape);
  // The step's KV addressing (block_ids unset: per layer).
  PagedKv StepKv(const StepShape& shape) const;
  // Enqueue's decoder layers, one after the other.
  absl::Status Layers(const StepShape& shape, PagedKv kv);
  // Layer l's parts: input norm (unless `folded` into the previous down
  // projection) and qkv product into qkv_; RoPE, the KV write and
  // attention into attn_; the o product and post-attention norm into x_
  // (one launch when `fold`).
  // rope: RoPE and the KV write in the product's epilogue (q to q_, k and
  // v into the cache, nothing to qkv_).
  absl::Status QkvProjection(const DeviceLayer& L, int l, int T, bool folded, const Fp8Rows& fp8_in,
                             const SkinnyRope* rope = nullptr);
  // rope: RoPE and the KV write too (else the qkv product did them).
  absl::Status Attend(const StepShape& shape, const PagedKv& kv, const DeviceLayer& L, bool rope);
  // The step's tokens (sequence and position of each) and layer l's KV.
  TokenMap StepTokens(int T) const;
  PagedKv LayerKv(const StepShape& shape, PagedKv kv, int l) const;
  absl::Status OutputProjection(const DeviceLayer& L, int T, bool fold, const Fp8Rows& fp8_in);
  // RMSNorms folded into the skinny products around them (kernels.h,
  // SkinnyNormOut; GpuExecutorOptions::fold_norms): whether a step of T
  // tokens folds them (every layer product skinny; E4M3 weights at one
  // token only),
  // and whether layer l's down projection also folds layer l + 1's input
  // norm (l + 1 exists and is not streamed: its norm weight stays put).
  bool FoldsNorms(int T) const;
  bool FoldsNextInputNorm(int l) const;
  // The folded norm's producer: resid_ += x w^T, x_ = gamma * resid_.
  SkinnyNormOut NormOut(const void* bias, const void* gamma) const;
  SkinnyNormIn NormIn(int T) const;
  // Layer L's MLP over x_ (post-attention norm output; fp8_in: its E4M3
  // rows for FP8 layers): gate_up, SiLU-and-multiply, down into o_.
  // fold_in: x_ is the folded post-attention norm's (gate/up scales it);
  // next_norm: down folds the next layer's input norm of this weight into
  // resid_ and x_ instead of writing o_ (null: it writes o_).
  absl::Status Mlp(const DeviceLayer& L, int T, const Fp8Rows& fp8_in, bool fold_in = false,
                   const void* next_norm = nullptr);
  // y[m][n] = x[m][k] w[n][k]^T on stream_: w in the activation type, or
  // E4M3 with per-row scales when w_scale is set (Gemm::RunFp8; with
  // x_in_fp8, x's E4M3 rows are already in the Gemm's fp8_input()).
  absl::Status Linear(const void* x, const void* w, const float* w_scale, void* y, int m, int n,
                      int k, bool x_in_fp8 = false);
  // GpuExecutorOptions::warm_products: one product of every shape a step
  // can run through cuBLASLt, at every row bucket (engine/graph_buckets.h)
  // up to max_batch_tokens (the LM head's up to max_rows_), and at
  // max_rows_ and max_batch_tokens, queued on stream_ (not waited for). A
  // failure is logged, not returned (an optimization; the steps report
  // what is wrong). REQUIRES: Init's buffers allocated; no layer streamed
  // yet.
  absl::Status WarmProducts();
  // WarmProducts' launches, with layer L's weights.
  absl::Status WarmBuckets(const DeviceLayer& L);
  // Remapping inside Enqueue (cuda_layer_stream.cc): the tensors layer l
  // computes with (its slot's when streamed), after ordering the step
  // after its copy; after layer l, the next copy into its slot; at the
  // end, the step waits for the copies it started.
  absl::StatusOr<const DeviceLayer*> StreamBefore(int l);
  absl::Status StreamAfter(int l);
  absl::Status StreamJoin();
  // Adds the last step's copy stall to stall_ns_ (events not yet complete
  // are skipped, never waited for). Step thread.
  void HarvestStall();
  absl::Status EnsureHostImage();
  void DropGraphs();

  ModelConfig config_;
  KvCache* kv_;
  CudaExecutorOptions options_;
  ActType act_ = ActType::kBF16;
  KvType kv_type_ = KvType::kBF16;
  int num_sms_ = 0;
  int attention_blocks_per_sm_ = 1;         // the split-KV kernel's, for its plans (Init)
  int attention_stream_blocks_per_sm_ = 0;  // the stream plan's kernel's (0: none; Init)
  bool prefill_kernel_ok_ = false;          // tensor-core prefill attention usable here
  int fixed_partition_tokens_ = 0;          // deterministic mode: the split-KV partition length
  int max_table_blocks_ = 0;                // ceil(max_context / block_tokens)
  // The split-KV attention's token order into `order` (cuda_step_meta.cc).
  static void WriteAttentionOrder(const int* pos_small, int tokens, int* order);
  // A stream plan's block starts into the staged metadata (its contexts
  // from the staged order); no-op for other plans.
  void WriteAttentionStream(const StepShape& shape);
  // The split-KV attention's plan for a staged step: the fixed one in
  // deterministic mode, else from its contexts (engine/attention_plan.h).
  AttentionPlan PlanAttention(const StepShape& shape) const;
  // The smallest power of two >= x (block-table buckets).
  static int NextPow2(int x) {
    int p = 1;
    while (p < x) p <<= 1;
    return p;
  }
  int max_rows_ = 0;  // sampled rows / sequences a step may have (max_seqs)
  // Grows on the step thread (penalty buffers); read by status threads.
  std::atomic<int64_t> workspace_bytes_{0};
  // options_.sm_partition > 0: the green context streams_ belong to.
  std::unique_ptr<SmPartition> partition_;
  // The stream the steps and their copies run on: one of streams_ (0:
  // default priority, 1: the device's greatest), chosen by SetUrgent.
  cudaStream_t stream_ = nullptr;
  cudaStream_t streams_[2] = {nullptr, nullptr};
  cudaEvent_t stream_switch_ = nullptr;  // orders a switched-to stream after the other
  std::unique_ptr<StepDoneWaiter>
      step_waiter_;  // options_.step_done != kHostFunction, made on first use
  // A started sampled step (StartForwardSample): its pinned mirror (its
  // staged inputs and its tokens' download), its end on stream_, its rows
  // and which rows asked for log-probabilities (empty: none). Two, used in
  // turn; `started_` of them are in flight, the oldest at `oldest_`.
  struct StartedStep {
    void* host = nullptr;
    cudaEvent_t done = nullptr;
    int rows = 0;
    std::vector<bool> top;
  };
  StartedStep slots_[2];
  int started_ = 0;
  int oldest_ = 0;
  // Rows of the last sampled step started: what an ahead chunk may take.
  int last_sampled_rows_ = 0;
  std::unique_ptr<DeviceWeights> weights_;
  std::unique_ptr<Gemm> gemm_;
  std::vector<float> inv_freq_host_;

  // Activations, sized for max_batch_tokens rows.
  DeviceBuffer inv_freq_, resid_, x_, qkv_, q_, attn_, o_, gate_up_, act_buf_, x_sel_, logits_,
      attn_ws_;
  // [kSkinnyNormMaxM][SkinnyNormBlocks(., hidden)] FP32: a folded norm's
  // per-block sums of squares, from its producer to its consumer.
  DeviceBuffer norm_ss_;
  // [max_batch_tokens][heads] unsigned, zero between attention launches:
  // the split-KV partitions' arrivals (LaunchPagedAttention's merge_counts).
  DeviceBuffer attn_counts_;
  // Step metadata: tokens, seq, pos, rows, pos_small, from_row, order
  // (int32 x max_batch_tokens each; pos_small is pos with -1 for tokens in
  // prefill tiles; from_row the previous step's row an ahead token takes,
  // or -1; order the split-KV attention's token order, TokenMap::order),
  // sampling params, prefill tiles, output tokens, sampling
  // log-probabilities, then the block table.
  DeviceBuffer meta_;
  // Session KV copies (cuda_kv_copy.cc): two of each (pieces alternate, so
  // the host prepares one while the device works on the other): a device
  // staging buffer, the piece's spans in pinned host memory and on the
  // device, and an event marking the end of the buffer's last use.
  DeviceBuffer kv_staging_[2], kv_spans_[2];
  BlockSpan* host_spans_[2] = {nullptr, nullptr};
  cudaEvent_t kv_done_[2] = {nullptr, nullptr};
  // Exports (CopyKvToHost) run on a stream of their own, so they need not
  // wait for steps queued on stream_; with no step started they start
  // after stream_'s work (export_after_).
  cudaStream_t export_stream_ = nullptr;
  cudaEvent_t export_after_ = nullptr;
  // Layer-wise lease loads (cuda_kv_copy.cc): a copy stream, one event per
  // layer recorded after that layer's copies (the step's layer l waits for
  // layer_loaded_[l]; the last one marks the whole load), an event on
  // stream_ the load starts after, and the load's spans in pinned host and
  // device memory (grown on demand, between loads).
  cudaStream_t load_stream_ = nullptr;
  std::vector<cudaEvent_t> layer_loaded_;
  cudaEvent_t load_after_ = nullptr;
  BlockSpan* load_host_spans_ = nullptr;
  DeviceBuffer load_spans_;
  size_t load_span_capacity_ = 0;
  bool load_pending_ = false;  // started, not yet waited for by a step
  bool load_started_ = false;  // any load since Init
  // Pinned mirror of meta_ the next step stages into: slots_[i].host.
  void* host_meta_ = nullptr;
  size_t meta_bytes_ = 0;
  size_t table_offset_ = 0, params_offset_ = 0, tiles_offset_ = 0, out_offset_ = 0;
  size_t stream_offset_ = 0;  // [num_sms_ x attention_blocks_per_sm_] AttentionStreamStart
  // Sampling log-probabilities (SampleLogprobs x max_batch_tokens), after
  // the output tokens.
  size_t logprobs_offset_ = 0;
  // The step's penalty entries (SamplePenalty), SampleParams holding each
  // row's offset and count; grown on demand outside graph capture, and
  // its pinned mirror.
  DeviceBuffer penalties_;
  void* host_penalties_ = nullptr;
  size_t penalty_capacity_ = 0;  // entries

  // Remapping: the plan, layer -> streamed index k (-1: resident), each
  // streamed layer's tensors at its slot, the host image, the copy stream,
  // one event per streamed layer (copy done) and per slot (reader done).
  memory::StreamingPlan stream_plan_;
  std::vector<int> stream_index_;
  std::vector<DeviceLayer> slot_layers_;
  // Set once on the step thread (std::atomic_store); KeepHostWeights reads
  // it from another (std::atomic_load).
  std::shared_ptr<const PinnedWeights> host_image_;
  cudaStream_t weight_stream_ = nullptr;
  std::vector<cudaEvent_t> weight_loaded_, slot_free_;
  std::atomic<int64_t> streamed_bytes_{0};
  // The copy stall, timed on the device: per streamed layer k >= slots,
  // `reached_[set][k]` when the compute stream reaches the layer (before it
  // waits) and `copied_[set][k]` when its copy ends; the stall is the part
  // of the copy after the compute got there. `reached_[set][m]` is the
  // step-end join (StreamJoin), which waits for the homes' reloads
  // (`copied_[set][s]`, s < slots): the latest of those past it is stall
  // too. Set 0 is recorded by steps run directly, set 1 by graph replays
  // (captured as external event records: CUDA refuses a plain record of an
  // event a graph records). HarvestStall reads back `stall_set_`'s events
  // once the step has finished (-1: none). Step thread only, except
  // stall_ns_.
  std::vector<cudaEvent_t> reached_[2], copied_[2];
  int stall_set_ = -1;
  std::atomic<int64_t> stall_ns_{0};

  // (tokens, max_blocks, sample, the attention plan's partition length,
  // count, workspace rows and stream blocks) -> instantiated graph
  using GraphKey = std::tuple<int, int, bool, int, int, int, int>;
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  int64_t graph_replays_ = 0;
  int last_graph_rows_ = 0;
  AttentionPlan last_attention_plan_;
};

}  // namespace ballast::engine::cuda
