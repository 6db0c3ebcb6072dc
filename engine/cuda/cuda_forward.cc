// CudaExecutor's forward pass (cuda_executor.h): the kernels one step
// queues on the executor's stream, layer by layer, and the linear layers'
// choice of product (skinny, cuBLASLt, FP8). Kept apart from the
// executor's lifecycle, graphs and sampling in cuda_executor.cc.
#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "engine/cuda/cuda_executor.h"
#include "engine/graph_buckets.h"
#include "engine/weights.h"
#include "spdlog/spdlog.h"

namespace ballast::engine::cuda {

// The CPU reference leaves FP8 layers' inputs unrounded where the W8A16
// products take them (GpuExecutorOptions::skinny_fp8_max_m's default).
static_assert(kFp8UnroundedInputMaxTokens <= kSkinnyFp8WeightsMaxM, "engine/weights.h");
static_assert(kSkinnyMmaDefaultMaxM <= kSkinnyMmaMaxM, "engine/gpu_backend.h");

absl::Status CudaExecutor::Linear(const void* x, const void* w, const float* w_scale, void* y,
                                  int m, int n, int k, bool x_in_fp8) {
  if (w_scale != nullptr && x_in_fp8) {
    return gemm_->RunFp8Quantized(w, w_scale, y, m, n, k, act_, stream_);
  }
  if (w_scale != nullptr) return gemm_->RunFp8(x, w, w_scale, y, m, n, k, act_, stream_);
  return gemm_->Run(x, w, y, m, n, k, act_, false, stream_);
}

absl::Status CudaExecutor::WarmProducts() {
  const int H = config_.hidden_size, Q = config_.q_dim(), I = config_.intermediate_size;
  const size_t a = ActSize(act_);
  // Zeros in, so no product meets a NaN; the outputs are scratch. The
  // layer products' inputs hold max_batch_tokens rows, the LM head's
  // max_rows_.
  const size_t T = static_cast<size_t>(options_.max_batch_tokens);
  const size_t R = static_cast<size_t>(max_rows_);
  const std::tuple<DeviceBuffer*, int, size_t> inputs[] = {
      {&x_, H, T}, {&attn_, Q, T}, {&act_buf_, I, T}, {&x_sel_, H, R}};
  for (auto [buf, cols, rows] : inputs) {
    BALLAST_CUDA_RETURN(cudaMemsetAsync(buf->get(), 0, rows * cols * a, stream_), "warm-up inputs");
  }
  gemm_->SetWarming(true);  // untimed; each algorithm once per shape
  absl::Status st = WarmBuckets(weights_->layer(0));
  gemm_->SetWarming(false);
  if (!st.ok()) {  // an optimization: the steps report what is really wrong
    spdlog::warn("warming the products at activation stopped: {}", st.ToString());
  }
  return absl::OkStatus();
}

absl::Status CudaExecutor::WarmBuckets(const DeviceLayer& L) {
  const ModelConfig& c = config_;
  const int H = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(), I = c.intermediate_size;
  const int T = options_.max_batch_tokens;
  // Every bucket up to max_batch_tokens, and max_rows_ and max_batch_tokens
  // themselves where they are not buckets (graph steps are clamped to
  // max_rows_). Eager steps (prefill chunks) of more rows than max_rows_
  // run their layer products at their bucket's algorithm too; only the
  // LM head, which runs on sampled rows, stops at max_rows_.
  for (int m = 1;;) {
    // The layer products as Enqueue and Mlp run them (gate/up unfused).
    if (auto s = Linear(x_.get(), L.qkv, L.qkv_scale, qkv_.get(), m, Q + 2 * KV, H); !s.ok())
      return s;
    if (auto s = Linear(attn_.get(), L.o, L.o_scale, o_.get(), m, H, Q); !s.ok()) return s;
    if (auto s = Linear(x_.get(), L.gate_up, L.gate_up_scale, gate_up_.get(), m, 2 * I, H); !s.ok())
      return s;
    if (auto s = Linear(act_buf_.get(), L.down, L.down_scale, o_.get(), m, H, I); !s.ok()) return s;
    if (m <= max_rows_) {
      if (auto s = gemm_->Run(x_sel_.get(), weights_->lm_head(), logits_.get(), m, c.vocab_size, H,
                              act_, true, stream_);
          !s.ok())
        return s;
    }
    if (m == T) return absl::OkStatus();
    const int next = GraphBucketTokens(m + 1);
    m = m < max_rows_ ? std::min(next, max_rows_) : std::min(next, T);
  }
}

bool CudaExecutor::FoldsNorms(int T) const {
  const ModelConfig& c = config_;
  const int H = c.hidden_size;
  const DeviceLayer& L = weights_->layer(0);  // E4M3 or not, every layer alike
  // E4M3 weights fold at one row only: on an H100 (8B shape) the folded
  // W8A16 step took 3.63 ms against 3.77 unfolded at one row, but 4.22
  // against 4.11 at two (docs/benchmarks.md, session 66).
  if (L.qkv_scale != nullptr && T > 1) return false;
  return options_.fold_norms && SkinnyNormSupports(T, H) &&
         gemm_->UsesSkinnyFor(L.qkv_scale, T, H) && gemm_->UsesSkinnyFor(L.o_scale, T, c.q_dim()) &&
         gemm_->UsesSkinnyFor(L.down_scale, T, c.intermediate_size);
}

bool CudaExecutor::FoldsNextInputNorm(int l) const {
  const int next = l + 1;
  if (next >= config_.num_hidden_layers) return false;  // the final norm runs on its own
  return stream_index_.empty() || stream_index_[static_cast<size_t>(next)] < 0;
}

SkinnyNormOut CudaExecutor::NormOut(const void* bias, const void* gamma) const {
  return {resid_.get<float>(), bias, gamma, x_.get(), norm_ss_.get<float>()};
}

SkinnyNormIn CudaExecutor::NormIn(int T) const {
  const int H = config_.hidden_size;
  return {norm_ss_.get<float>(), SkinnyNormBlocks(T, H), H,
          static_cast<float>(config_.rms_norm_eps)};
}

absl::Status CudaExecutor::Mlp(const DeviceLayer& L, int T, const Fp8Rows& fp8_in, bool fold_in,
                               const void* next_norm) {
  const int H = config_.hidden_size, I = config_.intermediate_size;
  const bool fused = fp8_in.q != nullptr;
  if (gemm_->UsesSkinnySiluMul(L.gate_up_scale, T, H)) {  // true wherever fold_in is
    // Decode-sized (E4M3 weights: W8A16): the product and the SiLU in one launch.
    const SkinnyNormIn in = NormIn(T);
    if (auto s = gemm_->RunSkinnySiluMul(x_.get(), L.gate_up, act_buf_.get(), T, I, H, act_,
                                         stream_, fold_in ? &in : nullptr, L.gate_up_scale);
        !s.ok())
      return s;
  } else {
    if (auto s = Linear(x_.get(), L.gate_up, L.gate_up_scale, gate_up_.get(), T, 2 * I, H, fused);
        !s.ok())
      return s;
    BALLAST_CUDA_RETURN(LaunchSiluMul(gate_up_.get(), T, I, act_buf_.get(), act_, stream_, fp8_in),
                        "silu");
  }
  // The down projection's output feeds the next layer's input norm.
  if (next_norm != nullptr) {
    return gemm_->RunSkinnyNormOut(act_buf_.get(), L.down, T, H, I, NormOut(nullptr, next_norm),
                                   act_, stream_, L.down_scale);
  }
  return Linear(act_buf_.get(), L.down, L.down_scale, o_.get(), T, H, I, fused);
}

PagedKv CudaExecutor::StepKv(const StepShape& sh) const {
  const KvLayout& lay = kv_->layout();
  const memory::BlockAddressing addr = kv_->allocator()->addressing();
  PagedKv kv;
  kv.max_blocks = sh.max_blocks;
  kv.base = addr.base;
  kv.slab_shift = addr.slab_shift;
  kv.slab_bytes = addr.slab_bytes;
  kv.block_bytes = addr.block_bytes;
  kv.block_tokens = lay.block_tokens;
  kv.num_kv_heads = lay.num_kv_heads;
  kv.head_dim = lay.head_dim;
  kv.dtype = kv_type_;
  kv.k_scale = lay.k_scale;
  kv.v_scale = lay.v_scale;
  return kv;
}

absl::Status CudaExecutor::Layers(const StepShape& sh, PagedKv kv) {
  const int T = sh.tokens;
  const bool fold = FoldsNorms(T);
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    auto streamed = StreamBefore(l);  // remapping: maybe its slot's tensors
    if (!streamed.ok()) return streamed.status();
    const DeviceLayer& L = **streamed;
    if (load_pending_) {  // layer l's KV from a lease: its copies must be done
      BALLAST_CUDA_RETURN(cudaStreamWaitEvent(stream_, layer_loaded_[l], 0), "layer KV load");
    }
    // FP8 layers past two rows: the norms and SiLU also write their output
    // in E4M3 for the product that follows (no quantization launch of its
    // own). One or two rows take x as it is (W8A16).
    const Fp8Rows fp8_in =
        L.qkv_scale != nullptr && !gemm_->UsesSkinnyFp8Weights(T, config_.hidden_size)
            ? gemm_->fp8_input()
            : Fp8Rows{};
    // Folded: the previous down projection normed x_ (FoldsNextInputNorm).
    const bool input_folded = fold && l > 0 && FoldsNextInputNorm(l - 1);
    // And RoPE with the KV write in the qkv product (no Qwen3 head norms).
    const PagedKv layer_kv = LayerKv(sh, kv, l);
    const bool rope_folded =
        fold && options_.fold_rope && L.q_norm == nullptr &&
        SkinnyRopeSupports(T, config_.hidden_size, config_.num_attention_heads, layer_kv);
    const SkinnyRope rope{inv_freq_.get<float>(),     StepTokens(T), layer_kv, q_.get(), L.qkv_bias,
                          config_.num_attention_heads};
    if (auto s = QkvProjection(L, l, T, input_folded, fp8_in, rope_folded ? &rope : nullptr);
        !s.ok())
      return s;
    if (auto s = Attend(sh, layer_kv, L, !rope_folded); !s.ok()) return s;
    if (auto s = OutputProjection(L, T, fold, fp8_in); !s.ok()) return s;
    const void* next_norm =
        fold && FoldsNextInputNorm(l) ? weights_->layer(l + 1).input_norm : nullptr;
    if (auto s = Mlp(L, T, fp8_in, fold, next_norm); !s.ok()) return s;
    if (auto s = StreamAfter(l); !s.ok()) return s;
  }
  return StreamJoin();
}

absl::Status CudaExecutor::QkvProjection(const DeviceLayer& L, int l, int T, bool folded,
                                         const Fp8Rows& fp8_in, const SkinnyRope* rope) {
  const ModelConfig& c = config_;
  const int H = c.hidden_size, N = c.q_dim() + 2 * c.kv_dim();
  if (!folded) {
    BALLAST_CUDA_RETURN(
        LaunchAddRmsNorm(resid_.get<float>(), l == 0 ? nullptr : o_.get(), nullptr, L.input_norm,
                         static_cast<float>(c.rms_norm_eps), T, H, x_.get(), act_, stream_, fp8_in),
        "input norm");
  }
  const SkinnyNormIn in = NormIn(T);
  if (rope != nullptr) {
    return gemm_->RunSkinnyRopeKv(x_.get(), L.qkv, T, H, folded ? &in : nullptr, *rope, act_,
                                  stream_, L.qkv_scale);
  }
  if (folded) {
    return gemm_->RunSkinnyNormIn(x_.get(), L.qkv, qkv_.get(), T, N, H, in, act_, stream_,
                                  L.qkv_scale);
  }
  return Linear(x_.get(), L.qkv, L.qkv_scale, qkv_.get(), T, N, H, fp8_in.q != nullptr);
}

TokenMap CudaExecutor::StepTokens(int T) const {
  const int Tmax = options_.max_batch_tokens;
  const int* tok = meta_.get<int>();
  return TokenMap{tok + Tmax, tok + 2 * Tmax, T};
}

PagedKv CudaExecutor::LayerKv(const StepShape& sh, PagedKv kv, int l) const {
  kv.block_ids = reinterpret_cast<const int*>(meta_.get<uint8_t>() + table_offset_) +
                 static_cast<size_t>(l) * sh.seqs * sh.max_blocks;
  return kv;
}

absl::Status CudaExecutor::Attend(const StepShape& sh, const PagedKv& kv, const DeviceLayer& L,
                                  bool rope) {
  const ModelConfig& c = config_;
  const int Tmax = options_.max_batch_tokens, T = sh.tokens;
  const int* tok = meta_.get<int>();
  const uint8_t* meta = meta_.get<uint8_t>();
  const TokenMap tm = StepTokens(T);
  // The split-KV kernel skips tokens that prefill tiles cover.
  const TokenMap tm_small{tm.seq, tok + 4 * Tmax, T, tok + 6 * Tmax,
                          reinterpret_cast<const AttentionStreamStart*>(meta + stream_offset_)};
  const auto* tiles = reinterpret_cast<const PrefillTile*>(meta + tiles_offset_);
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  if (rope) {
    BALLAST_CUDA_RETURN(
        LaunchRopeKvWrite(qkv_.get(), L.qkv_bias, {L.q_norm, L.k_norm, eps}, inv_freq_.get<float>(),
                          tm, c.num_attention_heads, kv, q_.get(), act_, stream_),
        "rope/kv write");
  }
  if (sh.small_tokens > 0 || sh.graph) {
    BALLAST_CUDA_RETURN(LaunchPagedAttention(q_.get(), tm_small, c.num_attention_heads, kv, scale,
                                             sh.attention, attn_ws_.get(), attn_.get(), act_,
                                             stream_, attn_counts_.get<unsigned>()),
                        "attention");
  }
  BALLAST_CUDA_RETURN(
      LaunchPrefillAttention(q_.get(), tiles, sh.prefill_tiles, c.num_attention_heads, kv, scale,
                             attn_.get(), act_, stream_),
      "prefill attention");
  return absl::OkStatus();
}

absl::Status CudaExecutor::OutputProjection(const DeviceLayer& L, int T, bool fold,
                                            const Fp8Rows& fp8_in) {
  const int H = config_.hidden_size, Q = config_.q_dim();
  if (fold) {
    return gemm_->RunSkinnyNormOut(attn_.get(), L.o, T, H, Q, NormOut(L.o_bias, L.post_norm), act_,
                                   stream_, L.o_scale);
  }
  if (auto s = Linear(attn_.get(), L.o, L.o_scale, o_.get(), T, H, Q); !s.ok()) return s;
  BALLAST_CUDA_RETURN(LaunchAddRmsNorm(resid_.get<float>(), o_.get(), L.o_bias, L.post_norm,
                                       static_cast<float>(config_.rms_norm_eps), T, H, x_.get(),
                                       act_, stream_, fp8_in),
                      "post-attention norm");
  return absl::OkStatus();
}

absl::Status CudaExecutor::Enqueue(const StepShape& sh) {
  const ModelConfig& c = config_;
  const int Tmax = options_.max_batch_tokens;
  const int T = sh.tokens, H = c.hidden_size;
  int* tok = meta_.get<int>();
  const int* rows = tok + 3 * Tmax;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const DeviceWeights& w = *weights_;
  if (sh.resolve || sh.graph) {  // graphs serve steps with and without ahead tokens
    BALLAST_CUDA_RETURN(
        LaunchResolveTokens(tok, tok + 5 * Tmax,
                            reinterpret_cast<const int*>(meta_.get<uint8_t>() + out_offset_), T,
                            stream_),
        "ahead tokens");
  }
  BALLAST_CUDA_RETURN(LaunchEmbedding(w.embed(), act_, tok, T, H, resid_.get<float>(), stream_),
                      "embedding");
  if (auto s = Layers(sh, StepKv(sh)); !s.ok()) return s;
  BALLAST_CUDA_RETURN(LaunchAddRmsNorm(resid_.get<float>(), o_.get(), nullptr, w.final_norm(), eps,
                                       T, H, x_.get(), act_, stream_),
                      "final norm");
  BALLAST_CUDA_RETURN(
      LaunchGatherRows(x_.get(), rows, sh.rows, H * ActSize(act_), x_sel_.get(), stream_),
      "row gather");
  if (auto s = gemm_->Run(x_sel_.get(), w.lm_head(), logits_.get(), sh.rows, c.vocab_size, H, act_,
                          true, stream_);
      !s.ok()) {
    return s;
  }
  if (sh.sample) {
    auto* meta = meta_.get<uint8_t>();
    BALLAST_CUDA_RETURN(
        LaunchSample(logits_.get<float>(), sh.rows, c.vocab_size,
                     reinterpret_cast<const SampleParams*>(meta + params_offset_),
                     penalties_.get<SamplePenalty>(), reinterpret_cast<int*>(meta + out_offset_),
                     reinterpret_cast<SampleLogprobs*>(meta + logprobs_offset_), stream_),
        "sampling");
  }
  return absl::OkStatus();
}

}  // namespace ballast::engine::cuda
