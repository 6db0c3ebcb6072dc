// The simulator's engine model: how long one engine step takes on a GPU,
// fitted from `ballast bench-engine` measurements taken on the GPU host
// (configs/sim/calibration-<card>.json, made by
// deploy/gpu-host/sim-calibrate.sh and scripts/sim-calibration.py).
//
// A step runs B decode tokens (their KV spans C tokens in total) and P
// prefill tokens (chunks whose attention spans A query x key pairs in
// total). Its time is linear in eleven features of the model's shape:
//
//   t = k0                                  per-step host cost
//     + k1 * layers                         kernel launches per layer
//     + k2 * weight bytes read              weight streaming (HBM)
//     + k3 * C * KV bytes per token         decode attention's KV reads
//     + k4 * B * layers                     per-sequence attention work
//     + k5 * 2 * dense params * B           decode GEMM FLOPs
//     + k6 * 2 * (layer params * P + LM head params * L)   prefill GEMM FLOPs
//     + k7 * 4 * layers * q heads * head dim * A    prefill attention FLOPs
//     + k8 * C * KV elements per token if the KV is FP8   dequantisation
//     + k9 * 2 * (layer params * max(0, B + P - R)
//                 + LM head params * max(0, B + L - R))  GEMM FLOPs past the ridge
//     + k10 * layers if the step is launched eagerly   eager kernel launches
//
// (dense params = layer params + LM head params. The LM head multiplies
// only the sampled rows: every decode, and the last token of each prompt
// that a chunk completes (L), so a step of many short prompts costs its
// layers' FLOPs plus one head row per prompt; counting the head on every
// prompt token overstated a 1B's prefill by 21% and an 8B's by 7%, and the
// shared coefficient split the difference. In k9's feature a decode-only
// step's B is its CUDA graph's padded rows, engine/graph_buckets.h's
// GraphBucketTokens(B): the engine modelled is the CUDA one with graphs,
// as calibrated; its cap of the rows at max_batch_tokens is not applied.)
// k8: what turning each FP8 K and V element back into a 16-bit type costs
// beyond its bytes. It was large while FP8 caches ran on CUDA cores (an 8B
// step at batch 128 on the H200: 14.1 ms with FP8 KV, 12.4 ms with BF16);
// on tensor cores (2026-12-01) it fits to 0. Zero when the calibration has
// no FP8-KV step.
//
// k9: a step's GEMMs read every weight once whatever the batch (k2), and
// up to about R tokens (the card's ridge) that read is what bounds them;
// past it they are bound by compute, and each further token costs its
// FLOPs at the card's GEMM rate. Without it the model is 13% low for an
// 8B's 1,024-sequence step on the H200 (docs/benchmarks.md, "Large
// batches in the engine model").
//
// k10: a decode-only step replays its bucket's CUDA graph, while a step
// with prefill chunks launches its kernels one by one. Without it the
// model was 4-12% low for chunks of 100-500 tokens (measured on the H200,
// docs/benchmarks.md, session 55: an 8B's 248-token chunk beside 8
// decodes took 8.98 ms, predicted 7.86), and fitting those points moved a
// 1B's batch-1 decode from +19% to +25%; with k10 (13 us a layer on the
// H200) the 8B chunks come within 7%, the 1B ones within 12%, and the
// rest stays where it was.
//
// The coefficients k0..k10 (seconds per unit) are one per card, fitted by
// non-negative least squares on the relative error over every recorded
// step of every calibrated shape, so a shape never measured (a 70B) is
// predicted from the same physical rates. R is fitted with them: the fit
// tries R = 32, 64, ..., 512 tokens below the largest decode-only step
// measured, and keeps the one whose least squares leave the smallest error.
// R = 0 and k9 = 0 when no R helps or none can be tried. Activation (weights copied from
// pinned host memory) takes weight bytes / the measured host-to-device
// rate x the measured activation overhead ratio.
//
// Thread-safety: EngineModel is immutable after Fit; share it freely.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ballast::sim {

// A Llama-family decoder's shape (config.json's fields) and dtypes.
struct ModelShape {
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int intermediate = 0, vocab = 0;
  bool tied_embeddings = false;
  int weight_dtype_bytes = 2;  // 2: BF16/FP16, 1: FP8
  int kv_dtype_bytes = 2;      // 2: BF16/FP16, 1: FP8 E4M3

  // Parameters a step multiplies by: every layer's projections and the LM
  // head (the embedding table is gathered, not multiplied).
  double dense_params() const;
  // The layers' projections alone, and the LM head (vocab x hidden): the
  // head multiplies only the rows that are sampled.
  double layer_params() const;
  double lm_head_params() const;
  // Bytes a decode step reads: the dense parameters in the weight dtype.
  double weight_bytes_read() const;
  // Bytes resident on the device: dense parameters plus an untied
  // embedding table, plus norms.
  int64_t weight_bytes() const;
  // KV bytes one token adds over all layers (K and V).
  int64_t kv_bytes_per_token() const;
};

// One GPU's part of `shape` under tensor parallelism over `tp` GPUs
// (Megatron-style, as vLLM and SGLang shard a Llama): attention heads, the
// MLP's intermediate width and the vocabulary (LM head and embedding) are
// split `tp` ways; KV heads too while there are at least `tp` of them,
// else each GPU keeps one (replicated). Norms stay whole. tp = 1 returns
// `shape`. REQUIRES: heads % tp == 0.
ModelShape TensorParallelPart(const ModelShape& shape, int tp);

// What of an engine's buffers grows with the node's context and the GPU
// (EngineWorkspaceBytes): max_context 0 (the default) leaves it out.
struct WorkspaceContext {
  int max_context = 0;    // node.engine.max_context
  int block_tokens = 16;  // node.engine.block_tokens
  int num_sms = 132;      // the GPU's SMs (H100 and H200 SXM: 132)
};

// The device memory an engine of `shape` allocates beside its weights and
// KV, as the CUDA executor does (engine/cuda/cuda_executor.cc): a step's
// activations for max_batch_tokens rows, the logits of the sampled rows
// (max_seqs, rounded up to a graph bucket), the 32 MiB cuBLASLt workspace
// and two 16 MiB KV staging buffers; with `ctx.max_context`, also its
// attention workspace (engine::MaxPagedAttentionWorkspaceBytes) and its
// step metadata's block tables (a row per layer and sampled row, of
// max_context / block_tokens entries; their small per-token header is
// not counted). About 416 MiB for llama-8b at 2,048 tokens and 128
// sequences, 437 with a context of 4,096 on 132 SMs (the daemon logged
// 437.4 before its attention plans took the kernel's own 3 resident
// blocks an SM, which need about 4 MiB less). FP8 weights' scratch is
// not counted.
int64_t EngineWorkspaceBytes(const ModelShape& shape, int max_batch_tokens, int max_seqs,
                             const WorkspaceContext& ctx = {});

// A shape by name: llama-1b, llama-3b, llama-8b, qwen-14b, qwen-32b,
// llama-70b (BF16 weights and KV; callers set the dtypes).
absl::StatusOr<ModelShape> NamedShape(const std::string& name);

// What one engine step computes.
inline constexpr int kFeatures = 11;
// The index of k9, the GEMM FLOPs past the ridge (R's own coefficient).
inline constexpr int kRidgeFeature = 9;

struct StepWork {
  int decode_tokens = 0;         // B
  double decode_context = 0;     // C: KV tokens the decodes attend over
  int prefill_tokens = 0;        // P
  double prefill_attention = 0;  // A: query x key pairs of the prefill chunks
  int prefill_logits = 0;        // L: prefill chunks that end their prompt (one sampled row each)
};

// The attention pairs of a prefill chunk of `tokens` tokens after `before`
// tokens already in the KV (causal): tokens * (before + (tokens + 1) / 2).
double PrefillAttentionPairs(int tokens, int before);

// One recorded measurement.
struct CalibrationPoint {
  std::string shape_name;
  ModelShape shape;
  StepWork work;
  double seconds = 0;
};

// Where a session's KV comes from when a turn (or an Advise) brings it
// onto the device from below it.
enum class KvTier { kDram, kSsd, kPeer };

// Rates at which a session's KV reaches the device from each tier: its
// bytes over the time the load adds to the turn's TTFT (tier read and
// checksum, then the layer-wise copy, the part not hidden behind the
// step). A calibration file's optional "kv_tiers" object sets them
// ("dram_load_bytes_per_s", "ssd_load_bytes_per_s",
// "peer_load_bytes_per_s", "source"). The defaults are issue 16's
// `ballast bench-tiers` run (docs/benchmarks.md, "Session KV tiers": one
// H100 host, 2026-11-26, Llama-3-8B shape, a 2,049-token history =
// 268,566,528 bytes of BF16 KV, layer-wise loads, medians of 5 runs), TTFT
// less the resident TTFT:
//   DRAM (pinned):                     15.43 - 7.87 =   7.56 ms: 35.5 GB/s
//   SSD (io_uring, O_DIRECT, the
//     host's virtio disk; NVMe would
//     be several times faster):       292.65 - 7.87 = 284.78 ms: 0.943 GB/s
//   peer (loopback gRPC, after the
//     pinned receive; 3 runs):         222.8 - 7.85 = 214.95 ms: 1.25 GB/s
struct KvLinkRates {
  double dram_bytes_per_s = 35.5e9;
  double ssd_bytes_per_s = 0.943e9;
  double peer_bytes_per_s = 1.25e9;
};

// `copies` copies of one model, each stepping the same decode batch at
// once on its own host thread and stream (`ballast bench-engine
// --concurrent-models`): how far concurrent small steps overlap on the
// device, which one model at a time does not show.
struct ConcurrentPoint {
  std::string shape_name;
  ModelShape shape;
  int copies = 0;            // >= 2
  StepWork work;             // each copy's step
  double seconds = 0;        // one copy's step time, all stepping at once
  double alone_seconds = 0;  // one copy's step time alone, same run
};

struct Calibration {
  std::string device;             // the card's name as CUDA reports it
  std::string date;               // when it was measured
  std::string command;            // what produced it
  int64_t memory_bytes = 0;       // the card's memory
  double h2d_bytes_per_s = 0;     // pinned host-to-device copy rate
  double activation_ratio = 1.0;  // activation time / the copy bound
  KvLinkRates kv_rates;           // "kv_tiers" (defaults above when absent)
  std::string kv_rates_source;    // "kv_tiers.source": where they were measured
  std::vector<CalibrationPoint> points;
  std::vector<ConcurrentPoint> concurrent;  // "concurrent" (optional)
};

// Reads configs/sim/calibration-<card>.json. Errors name the file and the
// field.
absl::StatusOr<Calibration> ReadCalibration(const std::string& path);
absl::StatusOr<Calibration> ParseCalibration(const std::string& json, const std::string& origin);

class EngineModel {
 public:
  // Fits k0..k10 and R to `calibration`'s points. INVALID_ARGUMENT if there
  // are too few points to identify them (fewer than kFeatures, or no
  // prefill point).
  static absl::StatusOr<EngineModel> Fit(const Calibration& calibration);
  // A model with given coefficients and ridge R in tokens (tests,
  // hand-computed clusters).
  EngineModel(std::array<double, kFeatures> k, double h2d_bytes_per_s, double activation_ratio,
              KvLinkRates kv_rates = {}, double overlap_per_layer_s = 0, double ridge_tokens = 0,
              double stream_share = 0);

  double StepSeconds(const ModelShape& shape, const StepWork& work) const;
  // The part of StepSeconds that steps of several models on their own
  // streams overlap: the per-step constant k0 (launch and host latency).
  // The rest, per-layer kernels included, keeps the GPU busy and adds up
  // (sim_device.h says why).
  double LatencySeconds(const ModelShape& shape) const;
  // Of a decode step's time alone, the part beyond LatencySeconds that
  // other models' decode steps overlap when they step at the same time:
  // overlap_per_layer_s x layers (launch gaps and kernels too small to
  // fill the GPU, about 60 us a layer on the H200). Fitted from the
  // calibration's concurrent points with stream_share (n copies at once
  // take l + n (t - l) a step, t the step alone, l = OverlappedSeconds
  // with share 1): the pair with the least squared relative error on a
  // grid. 0 without concurrent points (then only k0 overlaps).
  double OverlapSeconds(const ModelShape& shape) const;
  double overlap_per_layer_s() const { return overlap_per_layer_s_; }
  double stream_share() const { return stream_share_; }
  // The part of a step that streams HBM: its weight and decode-KV reads
  // (the k2 and k3 terms).
  double StreamSeconds(const ModelShape& shape, const StepWork& work) const;
  // Of a step of `step_s` seconds (StepSeconds, or a TP step's time), the
  // part that other models' steps at the same time overlap, with `share`
  // of OverlapSeconds realised (0 for a step with prefill chunks):
  // k0 + share x OverlapSeconds, but no more than step_s less the part of
  // its HBM reads that steps at the same time cannot hide, stream_share x
  // StreamSeconds (they share the bandwidth), and not less than k0.
  // stream_share is fitted with the per-layer overlap from the concurrent
  // points (0, no bound, without them or when none is held by it; 0 too
  // for a model built with coefficients unless given). On the H200
  // (2026-12-01) the bound is what fits the concurrent points at the
  // engine's own overlap (share 1): four 1B copies at batch 1 took 2.69 ms
  // a step together and 1.07 ms alone, where the per-layer overlap fitted
  // without the bound predicted 1.64 ms. At the node's realised shares
  // (rolling 0.4, lockstep 0-0.5) it does not bind for 1B-8B decode
  // steps. A TP step's step_s includes its all-reduces while
  // StreamSeconds is one part's reads: the all-reduce time counts as
  // hideable (not measured).
  double OverlappedSeconds(const ModelShape& shape, const StepWork& work, double share,
                           double step_s) const;
  // Time to prefill `tokens` tokens alone (arbitration's cost estimate).
  double PrefillSeconds(const ModelShape& shape, int tokens) const;
  // Time to copy a model's weights from pinned host memory and set it up.
  double ActivationSeconds(const ModelShape& shape) const;
  // Time a load of `bytes` of session KV from `tier` adds before the
  // turn's step (KvLinkRates).
  double KvLoadSeconds(KvTier tier, int64_t bytes) const;
  const KvLinkRates& kv_rates() const { return kv_rates_; }
  // The pinned host-to-device copy rate (remapping's layer copies).
  double h2d_bytes_per_s() const { return h2d_bytes_per_s_; }
  const std::array<double, kFeatures>& coefficients() const { return k_; }
  // R: the tokens a step's GEMMs take before compute, not the weights'
  // read, bounds them (k9's feature).
  double ridge_tokens() const { return ridge_tokens_; }

 private:
  std::array<double, kFeatures> k_;
  double h2d_bytes_per_s_, activation_ratio_;
  double overlap_per_layer_s_;
  double stream_share_;  // of StreamSeconds, what concurrent steps cannot hide
  double ridge_tokens_;
  KvLinkRates kv_rates_;
};

// The features of a step (the k0..k10 multipliers above), R =
// `ridge_tokens`.
std::array<double, kFeatures> StepFeatures(const ModelShape& shape, const StepWork& work,
                                           double ridge_tokens);

}  // namespace ballast::sim
