// Device kernels of the CUDA backend, behind plain host launch functions.
//
// Conventions (FlashInfer-style): every launcher takes its buffers as raw
// device pointers with shapes in comments, plain structs by value, and a
// stream; it returns the launch's cudaError_t and never synchronises.
// Activations and weights are BF16 or FP16 (`ActType`); the residual stream
// is FP32. KV is paged (see PagedKv) in the activation type or FP8-E4M3.
// The forward pass's kernels are launched with programmatic dependent
// launch (common.cuh): each may start while the previous kernel in its
// stream finishes, and waits for its writes before touching activations.
// This header is included from .cc and .cu files: no spdlog/fmt, no Abseil.
//
// Thread-safety: launchers are stateless; the caller orders work on streams.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "engine/attention_plan.h"

namespace ballast::engine::cuda {

enum class ActType { kBF16, kF16 };
enum class KvType { kBF16, kF16, kFP8E4M3 };
// Element types a weight can arrive in from a checkpoint.
enum class SrcType { kF32, kBF16, kF16 };

inline size_t ActSize(ActType) { return 2; }
inline size_t KvSize(KvType t) { return t == KvType::kFP8E4M3 ? 1 : 2; }

// One layer's paged KV cache as the kernels see it. A block holds
// `block_tokens` positions of one layer: K as [block_tokens][num_kv_heads]
// [head_dim], then V of the same shape (engine/kv_cache.h). Block ids map
// to addresses by the allocator's affine rule (memory::BlockAddressing):
//   base + (id >> slab_shift) * slab_bytes + (id & (2^slab_shift - 1)) * block_bytes
struct PagedKv {
  const int* block_ids = nullptr;  // [num_seqs][max_blocks] block ids, this layer
  int max_blocks = 0;              // row stride of block_ids
  unsigned char* base = nullptr;
  int slab_shift = 31;
  size_t slab_bytes = 0;
  size_t block_bytes = 0;
  int block_tokens = 16;
  int num_kv_heads = 0;
  int head_dim = 0;  // one of BALLAST_ATTENTION_HEAD_DIMS
  KvType dtype = KvType::kBF16;
  float k_scale = 1.0f;  // FP8 only: stored = x / scale
  float v_scale = 1.0f;
};

// The flat batch of one step: token i belongs to sequence seq[i] (a row of
// the block table) at position pos[i]; pos[i] < 0 marks a padding token
// (CUDA-graph buckets) that reads and writes nothing.
struct TokenMap {
  const int* seq = nullptr;  // [num_tokens]
  const int* pos = nullptr;  // [num_tokens]
  int num_tokens = 0;
  // [num_tokens], LaunchPagedAttention only: the order its blocks take the
  // tokens in, a permutation (the executor's: longest context first, so a
  // long sequence does not start last and run alone). Null: 0, 1, ...
  // Any order gives the same output bit for bit, if the plan's split tokens
  // come first (AttentionPlan::workspace_rows); not with a stream plan,
  // whose cuts between blocks follow the order.
  const int* order = nullptr;
  // [plan.streamed_ctas], 16-byte aligned, LaunchPagedAttention with a
  // stream plan only: each block's start (WriteAttentionStreamStarts over
  // the tokens' contexts in `order`).
  const AttentionStreamStart* stream = nullptr;
};

// dst[n] = src[n] converted to `dst_type`.
cudaError_t LaunchConvert(const void* src, SrcType src_type, void* dst, ActType dst_type, size_t n,
                          cudaStream_t stream);

// resid[t][:] = float(table[tokens[t]][:]); tokens [T], table [vocab][hidden].
cudaError_t LaunchEmbedding(const void* table, ActType type, const int* tokens, int num_tokens,
                            int hidden, float* resid, cudaStream_t stream);

// Where a kernel that produces a layer's input also writes it rounded to
// E4M3, one scale per row, exactly as LaunchQuantizeRowsFp8 would from its
// output (the next product's FP8 input, with no launch of its own): q
// [rows][cols] bytes, scale [rows]. Null q: not written.
struct Fp8Rows {
  void* q = nullptr;
  float* scale = nullptr;
};

// Fused residual add and RMSNorm, per row t of [T][hidden]:
//   if delta: resid[t] += float(delta[t]) (+ float(bias) if bias)
//   out[t] = weight * (resid[t] / sqrt(mean(resid[t]^2) + eps))
// and, when fp8.q is set, out[t] rounded to E4M3 there.
cudaError_t LaunchAddRmsNorm(float* resid, const void* delta, const void* bias, const void* weight,
                             float eps, int num_tokens, int hidden, void* out, ActType type,
                             cudaStream_t stream, Fp8Rows fp8 = {});

// out[i][:] = in[rows[i]][:] for i < n; rows of `row_bytes` bytes.
cudaError_t LaunchGatherRows(const void* in, const int* rows, int n, size_t row_bytes, void* out,
                             cudaStream_t stream);

// Ahead steps: tokens[t] = sampled[from_row[t]] where from_row[t] >= 0, for
// t < n (sampled: the previous step's token per sampling row).
cudaError_t LaunchResolveTokens(int* tokens, const int* from_row, const int* sampled, int n,
                                cudaStream_t stream);

// out[t][i] = silu(gate_up[t][i]) * gate_up[t][I + i]; gate_up [T][2I], out [T][I];
// and, when fp8.q is set, out[t] rounded to E4M3 there.
cudaError_t LaunchSiluMul(const void* gate_up, int num_tokens, int inter, void* out, ActType type,
                          cudaStream_t stream, Fp8Rows fp8 = {});

// Qwen3's q_norm / k_norm: RMSNorm over each head of q and of k with
// weights [D] (activation type) and `eps`. Null weights: no norm.
struct QkNorm {
  const void* q_weight = nullptr;
  const void* k_weight = nullptr;
  float eps = 1e-6f;
};

// qkv [T][(H + 2 Hkv) * D]: adds the bias (if any), normalises q and k
// heads (if `norm` has weights), applies RoPE (HF rotate_half, angle =
// pos * inv_freq[i], inv_freq [D/2], D <= 256) to q and k, writes q to
// q_out [T][H][D] and k, v into the paged cache at (seq, pos).
cudaError_t LaunchRopeKvWrite(const void* qkv, const void* bias, QkNorm norm, const float* inv_freq,
                              TokenMap tokens, int num_heads, PagedKv kv, void* q_out, ActType type,
                              cudaStream_t stream);

// Head sizes the attention kernels are compiled for (one template
// instance each; add a value here to serve another). Any GQA group
// (num_heads a multiple of num_kv_heads) works with each.
#define BALLAST_ATTENTION_HEAD_DIMS(X) X(8) X(16) X(32) X(64) X(80) X(96) X(128) X(256)
bool PagedAttentionSupports(int head_dim);

// Causal paged attention for a flat batch mixing prefill chunks and decode
// tokens: query t (of head h) attends to positions [0, pos[t]] of sequence
// seq[t], through kv head h / (num_heads / num_kv_heads). Long contexts are
// split into partitions that run in parallel and are merged (flash-decoding)
// as `plan` says (engine/attention_plan.h; its split tokens first in
// tokens.order). q [T][H][D], out [T][H][D]; workspace of
// PagedAttentionWorkspaceBytes(plan, ...). Head sizes that are multiples of
// 16 up to 128 run on tensor cores, KV in the activation type or FP8 (FP16
// MMAs; P in two parts, so its error is about FP32's, with an absolute
// floor of about 2^-25 from FP16's subnormals when the KV is FP8); other
// head sizes on CUDA cores (FP32 throughout). A stream plan
// (plan.streamed_ctas > 0) needs the tensor-core kernel, tokens.stream and
// merge_counts. merge_counts: [T][H]
// unsigned, zero before the first launch (each launch leaves them zero),
// with which a split token's last partition to finish merges the
// partitions in the attention launch itself; null: a second launch merges
// them. Either gives the same bits.
cudaError_t LaunchPagedAttention(const void* q, TokenMap tokens, int num_heads, PagedKv kv,
                                 float scale, const AttentionPlan& plan, void* workspace, void* out,
                                 ActType type, cudaStream_t stream,
                                 unsigned* merge_counts = nullptr);

// Blocks of the stream plan's kernel for this head size and these types
// that one SM keeps resident (AttentionWork::stream_blocks_per_sm): at
// most PagedAttentionBlocksPerSm's figure; 0 where LaunchPagedAttention
// runs no stream plans (the CUDA-core kernel's head sizes).
cudaError_t PagedAttentionStreamBlocksPerSm(int head_dim, KvType kv, ActType type, int* blocks);

// Blocks of LaunchPagedAttention's kernel for these heads and types that
// one SM of the current device keeps resident (the occupancy API): the
// plan's blocks_per_sm (PlanPagedAttention). 3 for Llama-3-8B's BF16 KV on
// an H100 or H200 (the tensor-core kernel's shared memory).
cudaError_t PagedAttentionBlocksPerSm(int num_heads, int num_kv_heads, int head_dim, KvType kv,
                                      ActType type, int* blocks);

// Prefill attention on tensor cores for chunks of many tokens: each tile is
// up to 128 consecutive tokens of one chunk (flat token indices
// [first_token, first_token + n), positions [pos0, pos0 + n) of block-table
// row seq), each attending causally to positions [0, its own]. Head sizes
// 64, 80, 96, 128 and 256 (PrefillAttentionSupports; others use
// LaunchPagedAttention); q, out as in LaunchPagedAttention. mma.sync
// (sm_80+); at most 65,535 tiles a launch.
struct PrefillTile {
  int first_token = 0;
  int n = 0;
  int seq = 0;
  int pos0 = 0;
};
constexpr int kPrefillTileTokens = 128;
bool PrefillAttentionSupports(int head_dim);
cudaError_t LaunchPrefillAttention(const void* q, const PrefillTile* tiles, int num_tiles,
                                   int num_heads, PagedKv kv, float scale, void* out, ActType type,
                                   cudaStream_t stream);

// y[m][n] = x[m][k] w[n][k]^T for decode-sized m (<= kSkinnyGemmMaxM),
// k % 8 == 0, 16-byte aligned rows; FP32 accumulation, y in the activation
// type or FP32. Streams w once at close to full bandwidth, where cuBLASLt's
// general kernels fall short for a handful of rows.
constexpr int kSkinnyGemmMaxM = 8;
// Default row limit for using it: measured on H100 (8B shapes), it beats
// cuBLASLt at 1 row (6.70 vs 7.17 ms/step) and loses from 4 rows on.
constexpr int kSkinnyGemmDefaultMaxM = 2;
bool SkinnyGemmSupports(int m, int k);
// RMSNorms folded into the skinny products around them (decode steps of at
// most kSkinnyNormMaxM rows; 2-byte or E4M3 weights): no norm launch between
// the o projection and gate/up, nor between down and the next layer's qkv.
// The producer (LaunchSkinnyGemmNormOut, n = hidden) adds each output,
// rounded to the activation type, and the bias to the FP32 residual row r,
// writes xg = gamma * r in the activation type and each block's sum of r^2
// per row; the consumer (LaunchSkinnyGemm or LaunchSkinnyGemmSiluMul with a
// SkinnyNormIn) sums those in a fixed order and scales its dot products by
// 1 / rms = rsqrt(sum / hidden + eps) before rounding. The residual is
// bit for bit the unfolded one; the normed product differs from
// LaunchAddRmsNorm + product only in where its input is rounded.
constexpr int kSkinnyNormMaxM = 2;
struct SkinnyNormOut {
  float* resid = nullptr;       // [m][n] FP32 residual stream, updated
  const void* bias = nullptr;   // [n] added with the product, or null
  const void* gamma = nullptr;  // [n] the norm's weight
  void* xg = nullptr;           // [m][n] gamma * r, the consumer's x
  float* sumsq = nullptr;       // [m][SkinnyNormBlocks(m, n)]
};
struct SkinnyNormIn {
  const float* sumsq = nullptr;  // a producer's, complete when the consumer waits for it
  int blocks = 0;                // SkinnyNormBlocks(m, hidden)
  int hidden = 0;                // the producer's n
  float eps = 0.0f;
};
bool SkinnyNormSupports(int m, int n);
// The producer's blocks, each writing one sum of squares per row.
int SkinnyNormBlocks(int m, int n);
// E4M3 weights with bf16/fp16 activations (W8A16): with w_scale set, w
// [n][k] is E4M3 with one FP32 scale per row (w_scale [n]), each product
// x · (w_scale[r] w[r]) with x unquantized, FP32 sums scaled per warp
// before they are added. Built for SkinnyGemmFp8WeightsSupports: up to
// kSkinnyFp8WeightsMaxM rows (the folded epilogues up to kSkinnyNormMaxM;
// more rows take LaunchSkinnyGemmFp8 or cuBLASLt on quantized x),
// k % 16 == 0, y in the activation type. Every launch below takes it.
constexpr int kSkinnyFp8WeightsMaxM = 4;
bool SkinnyGemmFp8WeightsSupports(int m, int k);
cudaError_t LaunchSkinnyGemm(const void* x, const void* w, void* y, int m, int n, int k,
                             ActType type, bool out_f32, cudaStream_t stream,
                             const SkinnyNormIn* norm_in = nullptr, const float* w_scale = nullptr);
// An MLP's gate/up product and its SiLU in one launch, for decode-sized m
// as LaunchSkinnyGemm: y[m][inter] = silu(x w_gate^T) * (x w_up^T), w_gate_up
// [2 * inter][k] with the gate rows first, y in the activation type. Bit for
// bit the result of LaunchSkinnyGemm into [m][2 * inter] followed by
// LaunchSiluMul.
cudaError_t LaunchSkinnyGemmSiluMul(const void* x, const void* w_gate_up, void* y, int m, int inter,
                                    int k, ActType type, cudaStream_t stream,
                                    const SkinnyNormIn* norm_in = nullptr,
                                    const float* w_scale = nullptr);
// The producer: x[m][k] w[n][k]^T into `out` (nothing else written).
cudaError_t LaunchSkinnyGemmNormOut(const void* x, const void* w, int m, int n, int k,
                                    const SkinnyNormOut& out, ActType type, cudaStream_t stream,
                                    const float* w_scale = nullptr);

// The qkv product of a decode step with LaunchRopeKvWrite in its epilogue
// (no Qwen3 head norms): q to q_out [m][num_heads][D], k and v into the
// paged cache, bit for bit the product rounded to the activation type and
// then LaunchRopeKvWrite (with the norm folded in when norm_in is set, as
// LaunchSkinnyGemm). w [(num_heads + 2 Hkv) D][k] as DeviceLayer::qkv.
// Needs SkinnyRopeSupports; tokens.num_tokens == m.
struct SkinnyRope {
  const float* inv_freq = nullptr;  // [D/2] as LaunchRopeKvWrite's
  TokenMap tokens;                  // the m tokens' sequences and positions
  PagedKv kv;                       // this layer's cache (block_ids set)
  void* q_out = nullptr;
  const void* bias = nullptr;  // [(num_heads + 2 Hkv) D] or null
  int num_heads = 0;
};
bool SkinnyRopeSupports(int m, int k, int num_heads, const PagedKv& kv);
cudaError_t LaunchSkinnyGemmRopeKv(const void* x, const void* w, int m, int k,
                                   const SkinnyNormIn* norm_in, const SkinnyRope& rope,
                                   ActType type, cudaStream_t stream,
                                   const float* w_scale = nullptr);

// FP8 (E4M3) weights, one FP32 scale per row (output channel).
// Per row r of src [rows][cols]: scales[r] = max|row| / 448 (1 when the row
// is zero), dst[r][i] = e4m3(src[r][i] / scales[r]) rounded to nearest
// even, saturating. dst [rows][cols] bytes, scales [rows]. Used for weights
// at load and for activations before an FP8 GEMM (one scale per token).
cudaError_t LaunchQuantizeRowsFp8(const void* src, SrcType src_type, int rows, int cols, void* dst,
                                  float* scales, cudaStream_t stream);
// y[m][n] = (xq[m][k] w[n][k]^T) * x_scale[m] * w_scale[n] over E4M3 xq
// (LaunchQuantizeRowsFp8 of x) and w, FP32 sums: the FP8 GEMM for
// decode-sized m (<= kSkinnyGemmMaxM), as LaunchSkinnyGemm; k % 16 == 0,
// 16-byte aligned rows; xq [m][k] and w [n][k] bytes, w_scale [n]; y in
// the activation type or FP32.
bool SkinnyGemmFp8Supports(int m, int k);
cudaError_t LaunchSkinnyGemmFp8(const void* xq, const float* x_scale, const void* w,
                                const float* w_scale, void* y, int m, int n, int k, ActType type,
                                bool out_f32, cudaStream_t stream);

// The skinny product on tensor cores (skinny_mma_kernels.cu), for decode
// steps of up to kSkinnyMmaMaxM rows past the CUDA-core kernel's: the rows
// of x are mma.sync's B columns, so the arithmetic no longer grows with
// the rows and the weight stream stays the bound. k % kSkinnyMmaKMultiple
// == 0, 16-byte aligned rows; FP32 sums, added in a fixed order (warps,
// then K chunks) that does not depend on m.
//   LaunchSkinnyMma: 2-byte w (w_scale null), y in the activation type or
//     FP32; or E4M3 w with row scales and x as it is (W8A16), y in the
//     activation type.
//   LaunchSkinnyMmaSiluMul: as LaunchSkinnyGemmSiluMul (w_gate_up [2 inter]
//     [k], gate rows first; the same rounding and SiluTimes), 2-byte or
//     E4M3 (W8A16) weights.
//   LaunchSkinnyMmaFp8: E4M3 xq and w, y = sum * x_scale[m] * w_scale[n]
//     (W8A8, as LaunchSkinnyGemmFp8).
constexpr int kSkinnyMmaMaxM = 16;
constexpr int kSkinnyMmaKMultiple = 128;
bool SkinnyMmaSupports(int m, int k);
cudaError_t LaunchSkinnyMma(const void* x, const void* w, void* y, int m, int n, int k,
                            ActType type, bool out_f32, cudaStream_t stream,
                            const float* w_scale = nullptr);
cudaError_t LaunchSkinnyMmaSiluMul(const void* x, const void* w_gate_up, void* y, int m, int inter,
                                   int k, ActType type, cudaStream_t stream,
                                   const float* w_scale = nullptr);
cudaError_t LaunchSkinnyMmaFp8(const void* xq, const float* x_scale, const void* w,
                               const float* w_scale, void* y, int m, int n, int k, ActType type,
                               cudaStream_t stream);

// Sampling, one row per request, by engine/sampler.h's rule (the CPU
// sampler is the reference): log-probabilities of the raw logits (rows
// with top_logprobs >= 0), then the row's penalties applied in place, then
// greedy when temperature <= 0 (lowest id on ties); otherwise logits /
// temperature, top-k (k <= 0: all), min-p (0: off), top-p (<= 0 or >= 1:
// all), one draw from Philox(seed, counter). Kept sets are found by
// threshold bisection, so ties at the threshold are all kept.
struct SampleParams {
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int top_logprobs = -1;  // -1: none; else alternatives wanted (<= kSampleMaxTop)
  int penalty_begin = 0;  // this row's entries: penalties[begin, begin + count)
  int penalty_count = 0;
  unsigned long long seed = 0;
  unsigned long long counter = 0;  // tokens drawn so far by this request
};
// One token a row's penalties touch (engine/sampler.h's PenaltyEntry);
// a row's entries ascend by token. `raw` is the kernel's scratch: the
// logit before the penalty.
struct SamplePenalty {
  int token = 0;
  int output_count = 0;
  int in_prompt = 0;
  float raw = 0.0f;
};
constexpr int kSampleMaxTop = 20;  // engine/sampler.h's kMaxTopLogprobs
// Log-probabilities (log_softmax of the raw logits) of one row: the chosen
// token's, and the `count` most likely tokens' (descending, ties lower id).
struct SampleLogprobs {
  float chosen = 0.0f;
  int count = 0;
  int ids[kSampleMaxTop] = {};
  float logprobs[kSampleMaxTop] = {};
};
// logits [n][vocab] fp32, penalised in place; params [n]; penalties
// [sum of the rows' counts]; tokens [n]; logprobs [n] (rows without
// log-probabilities are left alone). All device memory.
cudaError_t LaunchSample(float* logits, int n, int vocab, const SampleParams* params,
                         SamplePenalty* penalties, int* tokens, SampleLogprobs* logprobs,
                         cudaStream_t stream);

// One KV block's bytes and where they sit in a contiguous staging buffer
// (session KV moving between device blocks and host chunks).
struct BlockSpan {
  unsigned char* block = nullptr;  // device address of the block's bytes
  unsigned long long offset = 0;   // in the staging buffer
  unsigned long long bytes = 0;
};
// One block's bytes to another block (KV compaction).
struct BlockMove {
  const unsigned char* from = nullptr;
  unsigned char* to = nullptr;
  unsigned long long bytes = 0;
};
// moves [n] in device memory; one thread block per move; none overlap.
cudaError_t LaunchBlockMove(const BlockMove* moves, int n, cudaStream_t stream);
// gather == false: staging -> blocks (scatter); true: blocks -> staging.
// spans [n] in device memory; one thread block per span.
cudaError_t LaunchBlockCopy(unsigned char* staging, const BlockSpan* spans, int n, bool gather,
                            cudaStream_t stream);

}  // namespace ballast::engine::cuda
