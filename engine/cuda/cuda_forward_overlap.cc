// CudaExecutor's overlapped decode steps (GpuExecutorOptions::
// overlap_min_rows; NanoFlow-style nano-batches within one step).
//
// A large decode step spends its time in two kinds of kernels that wait on
// different limits: the products are bound by the tensor cores, attention
// by HBM (on an H200 at 1,000 sequences: 20.4 ms of products, 12.5 ms of
// attention, one after the other; docs/benchmarks.md). An overlapped step
// splits its rows into two halves A and B and interleaves their layers on
// stream_ so that, while one half's attention runs on a second stream, the
// other half's products run on stream_:
//
//   stream_: In(A,0) In(B,0) Out(A,0) | In(A,l) Out(B,l-1) In(B,l) Out(A,l) | ... Out(B,L-1)
//   side:           Attn(A,0) Attn(B,0)         Attn(A,l)          Attn(B,l)
//
// In(h,l) is half h's input norm, QKV product and RoPE + KV write of layer
// l; Attn(h,l) its attention, after In(h,l) (event in_done_[h]); Out(h,l)
// its O product, post-attention norm and MLP, after Attn(h,l) (event
// attn_done_[h]). Attn(A,l) runs beside Out(B,l-1) and In(B,l), Attn(B,l)
// beside Out(A,l) and In(A,l+1). Each half reads and writes only its own
// rows of the activations, and its sequences' KV, so the two streams touch
// disjoint memory; a half's attention order and plan are its own
// (PlanHalves), over its rows as a launch of their own. The weights are
// read once per half, and with overlap_gemm_sms the products aim at part
// of the SMs (cuBLASLt's SM count target) so that attention's blocks find
// the rest free.
//
// Not for eager steps (prefill chunks), streamed layers (remapping), a
// lease's KV still loading, or deterministic mode (a row's products would
// depend on which half it fell in); Shape decides (OverlapSplit).
#include <algorithm>
#include <cmath>

#include "absl/cleanup/cleanup.h"
#include "engine/cuda/cuda_executor.h"
#include "engine/graph_buckets.h"

namespace ballast::engine::cuda {

int CudaExecutor::OverlapSplit(int tokens) const {
  if (options_.overlap_min_rows <= 0 || tokens < options_.overlap_min_rows ||
      options_.deterministic || stream_plan_.alpha > 0 || load_pending_ || tokens < 64) {
    return 0;
  }
  return ((tokens / 2 + 31) / 32) * 32;  // rows in multiples of 32 for the products
}

absl::Status CudaExecutor::WarmOverlapped(const DeviceLayer& L) {
  if (options_.overlap_gemm_sms <= 0 || options_.overlap_min_rows <= 0) return absl::OkStatus();
  const ModelConfig& c = config_;
  const int H = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim(), I = c.intermediate_size;
  gemm_->set_sm_target(options_.overlap_gemm_sms);
  absl::Cleanup whole_device = [this] { gemm_->set_sm_target(0); };
  // Every graph bucket an overlapped step can take, and both its halves.
  // (Shape's: buckets clamped to max_rows_.)
  for (int t = std::min(GraphBucketTokens(options_.overlap_min_rows), max_rows_);;
       t = std::min(GraphBucketTokens(t + 1), max_rows_)) {
    const int split = OverlapSplit(t);
    for (int m : {split, t - split}) {
      if (split == 0 || m <= 0) continue;
      if (auto s = Linear(x_.get(), L.qkv, L.qkv_scale, qkv_.get(), m, Q + 2 * KV, H); !s.ok())
        return s;
      if (auto s = Linear(attn_.get(), L.o, L.o_scale, o_.get(), m, H, Q); !s.ok()) return s;
      if (auto s = Linear(x_.get(), L.gate_up, L.gate_up_scale, gate_up_.get(), m, 2 * I, H);
          !s.ok())
        return s;
      if (auto s = Linear(act_buf_.get(), L.down, L.down_scale, o_.get(), m, H, I); !s.ok())
        return s;
    }
    if (t == max_rows_) break;
  }
  return absl::OkStatus();
}

void CudaExecutor::PlanHalves(StepShape* sh) {
  const int Tmax = options_.max_batch_tokens;
  int* tok = static_cast<int*>(host_meta_);
  const int* pos_small = tok + 4 * Tmax;
  int* order = tok + 6 * Tmax;
  for (int h = 0; h < 2; ++h) {
    const int r0 = h == 0 ? 0 : sh->split;
    const int n = h == 0 ? sh->split : sh->tokens - sh->split;
    int64_t total = 0;
    int longest = 0;
    for (int t = r0; t < r0 + n; ++t) {
      if (pos_small[t] < 0) continue;
      total += pos_small[t] + 1;
      longest = std::max(longest, pos_small[t] + 1);
    }
    // The half's order over its own rows (0 .. n-1), at its rows' place.
    WriteAttentionOrder(pos_small + r0, n, order + r0);
    (h == 0 ? sh->attention : sh->attention_b) = PlanAttention(
        n, sh->max_context, total, longest, side_partition_ ? side_partition_->sm_count() : 0);
  }
}

absl::Status CudaExecutor::HalfIn(int h, const Half& half, const DeviceLayer& L, int l, PagedKv kv,
                                  const StepShape& sh) {
  const ModelConfig& c = config_;
  const int H = c.hidden_size, Q = c.q_dim(), KV = c.kv_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const Fp8Rows fp8_in = L.qkv_scale != nullptr ? gemm_->fp8_input() : Fp8Rows{};
  BALLAST_CUDA_RETURN(LaunchAddRmsNorm(half.resid, l == 0 ? nullptr : half.o, nullptr, L.input_norm,
                                       eps, half.rows, H, half.x, act_, stream_, fp8_in),
                      "input norm");
  if (auto s = Linear(half.x, L.qkv, L.qkv_scale, half.qkv, half.rows, Q + 2 * KV, H,
                      fp8_in.q != nullptr);
      !s.ok()) {
    return s;
  }
  const int* table = reinterpret_cast<const int*>(meta_.get<uint8_t>() + table_offset_);
  kv.block_ids = table + static_cast<size_t>(l) * sh.seqs * sh.max_blocks;
  BALLAST_CUDA_RETURN(
      LaunchRopeKvWrite(half.qkv, L.qkv_bias, {L.q_norm, L.k_norm, eps}, inv_freq_.get<float>(),
                        half.tm, c.num_attention_heads, kv, half.q, act_, stream_),
      "rope/kv write");
  cudaStream_t side = side_stream();
  BALLAST_CUDA_RETURN(cudaEventRecord(in_done_[h], stream_), "overlap event");
  BALLAST_CUDA_RETURN(cudaStreamWaitEvent(side, in_done_[h], 0), "overlap wait");
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  BALLAST_CUDA_RETURN(LaunchPagedAttention(half.q, half.tm_small, c.num_attention_heads, kv, scale,
                                           half.plan, attn_ws_.get(), half.attn, act_, side),
                      "attention");
  BALLAST_CUDA_RETURN(cudaEventRecord(attn_done_[h], side), "overlap event");
  return absl::OkStatus();
}

absl::Status CudaExecutor::HalfOut(int h, const Half& half, const DeviceLayer& L) {
  const ModelConfig& c = config_;
  const int H = c.hidden_size, Q = c.q_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const Fp8Rows fp8_in = L.qkv_scale != nullptr ? gemm_->fp8_input() : Fp8Rows{};
  BALLAST_CUDA_RETURN(cudaStreamWaitEvent(stream_, attn_done_[h], 0), "overlap wait");
  if (auto s = Linear(half.attn, L.o, L.o_scale, half.o, half.rows, H, Q); !s.ok()) return s;
  BALLAST_CUDA_RETURN(LaunchAddRmsNorm(half.resid, half.o, L.o_bias, L.post_norm, eps, half.rows, H,
                                       half.x, act_, stream_, fp8_in),
                      "post-attention norm");
  return Mlp(L, half.rows, fp8_in, half.row0);
}

absl::Status CudaExecutor::OverlappedLayers(const StepShape& sh, PagedKv kv) {
  const ModelConfig& c = config_;
  const int Tmax = options_.max_batch_tokens, L = c.num_hidden_layers;
  const size_t H = c.hidden_size, Q = c.q_dim(), QKV = Q + 2 * c.kv_dim(), a = ActSize(act_);
  const int* tok = meta_.get<int>();
  Half half[2];
  for (int h = 0; h < 2; ++h) {
    Half& x = half[h];
    const int r0 = h == 0 ? 0 : sh.split;
    x.rows = h == 0 ? sh.split : sh.tokens - sh.split;
    x.row0 = static_cast<size_t>(r0);
    x.resid = resid_.get<float>() + x.row0 * H;
    x.x = x_.get<uint8_t>() + x.row0 * H * a;
    x.qkv = qkv_.get<uint8_t>() + x.row0 * QKV * a;
    x.q = q_.get<uint8_t>() + x.row0 * Q * a;
    x.attn = attn_.get<uint8_t>() + x.row0 * Q * a;
    x.o = o_.get<uint8_t>() + x.row0 * H * a;
    x.tm = TokenMap{tok + Tmax + r0, tok + 2 * Tmax + r0, x.rows};
    x.tm_small = TokenMap{tok + Tmax + r0, tok + 4 * Tmax + r0, x.rows, tok + 6 * Tmax + r0};
    x.plan = h == 0 ? sh.attention : sh.attention_b;
  }
  gemm_->set_sm_target(options_.overlap_gemm_sms);
  absl::Cleanup whole_device = [this] { gemm_->set_sm_target(0); };
  const DeviceWeights& w = *weights_;
  for (int h = 0; h < 2; ++h) {
    if (auto s = HalfIn(h, half[h], w.layer(0), 0, kv, sh); !s.ok()) return s;
  }
  if (auto s = HalfOut(0, half[0], w.layer(0)); !s.ok()) return s;
  for (int l = 1; l < L; ++l) {
    if (auto s = HalfIn(0, half[0], w.layer(l), l, kv, sh); !s.ok()) return s;
    if (auto s = HalfOut(1, half[1], w.layer(l - 1)); !s.ok()) return s;
    if (auto s = HalfIn(1, half[1], w.layer(l), l, kv, sh); !s.ok()) return s;
    if (auto s = HalfOut(0, half[0], w.layer(l)); !s.ok()) return s;
  }
  return HalfOut(1, half[1], w.layer(L - 1));
}

}  // namespace ballast::engine::cuda
