// Gemm: the CUDA backend's matrix products through cuBLASLt.
//
//   y[M][N] = x[M][K] * w[N][K]^T
//
// x and w in the activation type (BF16 or FP16), FP32 accumulation, y in the
// activation type or FP32 (logits). Weights keep Hugging Face's [out, in]
// row-major layout. Decode-sized products (a few rows) use the skinny
// kernel of kernels.h instead. Each shape's descriptors and heuristic algorithm are
// built once and cached, so a step issues no host-side planning and the
// calls can be captured in CUDA graphs. A caller-provided workspace keeps
// cuBLASLt from allocating.
//
// FP8 weights (E4M3, one scale per output channel; RunFp8): products of up
// to skinny_fp8_max_m rows (UsesSkinnyFp8Weights) run the skinny kernel on x as it is
// (W8A16, kernels.h: the CUDA-core one up to skinny_max_m rows, the
// tensor-core one past it), as do the fused skinny runs below given a
// w_scale; larger ones round x to E4M3 per row (one scale per token) into
// the Gemm's own scratch, then run the skinny FP8 kernel (up to
// skinny_max_m rows), the tensor-core one's W8A8 form (up to
// skinny_mma_max_m) or cuBLASLt's FP8 GEMM with both scale vectors
// (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F); all accumulate in FP32.
//
// Tuning (tune_candidates > 0): the first uncaptured product of a shape
// (not warming: SetWarming)
// times cuBLASLt's first tune_candidates heuristic algorithms on the call's
// own operands (one untimed and three timed runs each, then a wait for the
// stream, per candidate) and keeps the fastest. Only products of up to
// 2,048 rows are timed, bucketed by the decode graphs' row buckets
// (engine/graph_buckets.h: powers of two to 256, then multiples of 64), so
// every graph runs the algorithm timed for its own rows; larger ones
// (prefill) are not timed, since the winners timed back to back ran 23%
// slower in a server's 8,192-token prefill steps, and take their bucket's
// heuristic pick (below). A bucket is
// timed once, at the first row count seen, and every other row count of
// the bucket takes the bucket's winner when cuBLASLt's heuristic lists it
// for that count (else the heuristic's first). The heuristic's first can be
// far off between powers of two: an 8B's gate/up product of 448 rows took
// 270 us with it and 158 us with the timed winner on an H200
// (docs/benchmarks.md, "cuBLASLt's picks between powers of two"). A
// product first met under graph capture runs the heuristic's first, and a
// graph captured then keeps it for its life; the next uncaptured call
// times the bucket. A shape for which the heuristic lists one algorithm
// (on cuBLASLt 13.0, FP8 with per-row scale vectors) is not timed.
//
// One algorithm per row bucket (no tuning, or more than 2,048 rows; not
// in batch-invariant mode): a row count between buckets runs the
// algorithm cuBLASLt's heuristic picks for its bucket's row count (if it
// runs the count within the workspace; else the count's own pick), so the
// row counts of a server's eager steps, which change every step, run the
// kernels of their buckets (up to 8,192 rows: 9 powers of two, then 124
// multiples of 64), mostly those the decode graphs already run. cuBLASLt
// sets a kernel's attributes (cuKernelSetAttribute) at its first launch,
// and on an H200 (2026-12-02) that call waited for the work queued on the
// device: with the head's
// product at each step's own row count (the prompts it finished, plus its
// decodes), nearly every 8K-token prefill step met a new kernel there and
// its launch blocked for the whole step (180-380 ms), so the node
// collected the step before it a step late (docs/benchmarks.md, "The
// prefill launch that waited for the device").
//
// Batch-invariant mode (the engine's deterministic mode): a row's product
// does not depend on how many other rows share the call. Every row count
// runs the one cuBLASLt algorithm chosen for kInvariantRefRows rows, with
// no workspace and one K split, so each output element is reduced by one
// thread block in one order; the skinny kernels are off. Slower for
// decode (no GEMV) and for shapes far from the reference.
//
// Thread-safety: thread-compatible (one step thread drives it).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/kernels.h"

namespace ballast::engine::cuda {

// What Create builds. Each field's default and cost:
struct GemmOptions {
  // cuBLASLt workspace, allocated by Create (32 MiB suffices on H100).
  size_t workspace_bytes = 32u << 20;
  // Products with at most this many rows use the CUDA-core skinny kernel
  // (LaunchSkinnyGemm) instead of cuBLASLt; 0 = never.
  int skinny_max_m = kSkinnyGemmDefaultMaxM;
  // FP8 products (RunFp8, E4M3 weights) with at most this many rows read x
  // as it is on the skinny kernel (W8A16; at most kSkinnyFp8WeightsMaxM);
  // larger ones quantize x to E4M3 first (W8A8). 0 = always quantize.
  int skinny_fp8_max_m = kSkinnyFp8WeightsMaxM;
  // FP8 products of more rows than skinny_max_m and at most this many run
  // the tensor-core skinny kernel (LaunchSkinnyMma: W8A16 up to
  // skinny_fp8_max_m rows, W8A8 past it) instead of the CUDA-core kernel
  // or cuBLASLt's FP8 GEMM; at most kSkinnyMmaMaxM, 0 = never. Measured on
  // an H100 (8B shape): 17-23% faster steps at 4-8 rows, 8% at 16.
  int skinny_mma_max_m = kSkinnyMmaMaxM;
  // Products of 2-byte weights take it too (same rows). Default off:
  // cuBLASLt's products were 4-20% faster steps at 3-16 rows (H100, 8B).
  bool skinny_mma_2byte = false;
  // The largest x RunFp8 quantizes for cuBLASLt (rows x k bytes + rows
  // floats of scratch, allocated by Create); 0: no FP8 products.
  int fp8_rows = 0;
  int fp8_max_k = 0;
  // Batch-invariant mode, described at the top of this file (the skinny
  // kernel and tuning are then off).
  bool batch_invariant = false;
  // Tuning, described at the top of this file; 0 (default) keeps the
  // heuristic's first. Costs each shape bucket's first call
  // tune_candidates x 4 products and as many waits for the stream.
  int tune_candidates = 0;
};

class Gemm {
 public:
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(const GemmOptions& options);
  // The row count whose algorithm every product uses in batch-invariant mode.
  static constexpr int kInvariantRefRows = 128;
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  absl::Status Run(const void* x, const void* w, void* y, int m, int n, int k, ActType type,
                   bool out_f32, cudaStream_t stream);
  // Whether Run takes the skinny kernel for m rows of depth k (decode-sized
  // products; never in batch-invariant mode).
  bool UsesSkinny(int m, int k) const;
  // Whether RunFp8 and the skinny runs take E4M3 weights with x unquantized
  // for m rows (up to skinny_fp8_max_m, never in batch-invariant mode), and which of the
  // two applies to weights with (E4M3) or without scales.
  bool UsesSkinnyFp8Weights(int m, int k) const;
  bool UsesSkinnyFor(const float* w_scale, int m, int k) const;
  // Whether a product of m rows (2-byte weights with skinny_mma_2byte, or
  // E4M3 ones whose x is taken as it is) runs the tensor-core skinny
  // kernel (skinny_mma_max_m).
  bool UsesSkinnyMma(const float* w_scale, int m, int k) const;
  // Whether RunSkinnySiluMul takes m rows without a folded norm: the
  // CUDA-core kernel's (UsesSkinnyFor) or the tensor-core one's.
  bool UsesSkinnySiluMul(const float* w_scale, int m, int k) const;
  // y[m][inter] = silu(x w_gate^T) * (x w_up^T) for an MLP's w_gate_up
  // ([2 * inter][k], gate rows first) in one launch: LaunchSkinnyGemmSiluMul.
  // REQUIRES: UsesSkinnySiluMul(w_scale, m, k); with norm_in,
  // UsesSkinnyFor(w_scale, m, k).
  // norm_in: the product after a folded RMSNorm (kernels.h, SkinnyNormIn).
  // w_scale (here and below): E4M3 weights' row scales, null for weights
  // in the activation type.
  absl::Status RunSkinnySiluMul(const void* x, const void* w_gate_up, void* y, int m, int inter,
                                int k, ActType type, cudaStream_t stream,
                                const SkinnyNormIn* norm_in = nullptr,
                                const float* w_scale = nullptr);
  // The products around a folded RMSNorm (kernels.h): the one before it,
  // which writes `out` and no y, and a plain one after it.
  // REQUIRES: UsesSkinnyFor(w_scale, m, k) and SkinnyNormSupports(m, the
  // norm's width).
  absl::Status RunSkinnyNormOut(const void* x, const void* w, int m, int n, int k,
                                const SkinnyNormOut& out, ActType type, cudaStream_t stream,
                                const float* w_scale = nullptr);
  // The qkv product with RoPE and the KV write in its epilogue
  // (LaunchSkinnyGemmRopeKv; norm_in as RunSkinnySiluMul's).
  absl::Status RunSkinnyRopeKv(const void* x, const void* w, int m, int k,
                               const SkinnyNormIn* norm_in, const SkinnyRope& rope, ActType type,
                               cudaStream_t stream, const float* w_scale = nullptr);
  absl::Status RunSkinnyNormIn(const void* x, const void* w, void* y, int m, int n, int k,
                               const SkinnyNormIn& in, ActType type, cudaStream_t stream,
                               const float* w_scale = nullptr);
  // y[m][n] = (x_scale[m] * e4m3(x / x_scale)[m][k]) (w_scale[n] *
  // e4m3(w)[n][k])^T, y in the activation type; where
  // UsesSkinnyFp8Weights(m, k), x (w_scale[n] e4m3(w)[n][k])^T instead.
  // Needs m <= fp8_rows and k <= fp8_max_k.
  absl::Status RunFp8(const void* x, const void* w, const float* w_scale, void* y, int m, int n,
                      int k, ActType type, cudaStream_t stream);
  // The same product with x already in fp8_input() (rows of k bytes and
  // their scales, written by the kernel that produced x: Fp8Rows).
  absl::Status RunFp8Quantized(const void* w, const float* w_scale, void* y, int m, int n, int k,
                               ActType type, cudaStream_t stream);
  // Warming (CudaExecutor's warm-up at activation, whose point is each
  // kernel's first launch): products run untimed, as under capture, so
  // their bucket is timed at its next call after, on that call's operands
  // (the warm-up runs on zeros, which time unlike data); and a cuBLASLt
  // product is skipped when this Gemm already launched its algorithm for
  // its shape while warming, at another row count.
  void SetWarming(bool warming) { warming_ = warming; }
  // cuBLASLt products launched while warming, not skipped (tests).
  int warm_launches() const { return static_cast<int>(warmed_.size()); }
  // Plans made after warming, not while it, whose algorithm was not launched
  // for their shape while warming: each may be a kernel whose first launch
  // in the process (and its wait for the device's queued work) falls on a
  // step. 0 until something was warmed (tests).
  int unwarmed_plans() const { return unwarmed_plans_; }
  // Shape buckets timed so far (tests, benchmarks).
  int tuned_buckets() const { return static_cast<int>(tuned_.size()); }
  // Where RunFp8 puts x rounded to E4M3 ([m][k] bytes, [m] scales) and
  // RunFp8Quantized reads it; valid until the next FP8 product is queued.
  Fp8Rows fp8_input() const;
  // Scratch bytes Create allocates for FP8 products of these limits.
  static size_t Fp8ScratchBytes(int fp8_rows, int fp8_max_k);

 private:
  struct Plan;
  using Key = std::tuple<int, int, int, int, bool, bool>;
  Gemm() = default;
  // INTERNAL unless an FP8 product of m rows and depth k fits the scratch.
  absl::Status CheckFp8Shape(int m, int k) const;
  // Rows the tensor-core skinny kernel takes: past skinny_max_m, up to
  // skinny_mma_max_m (either weight type).
  bool MmaRows(int m, int k) const;
  // fp8: E4M3 operands with per-row (w_scale) and per-token (x_scale)
  // scale vectors, set on the descriptor before the heuristic runs.
  absl::StatusOr<Plan*> GetPlan(int m, int n, int k, ActType type, bool out_f32, bool fp8,
                                const float* w_scale = nullptr, const float* x_scale = nullptr);
  // Sets p->algo: cuBLASLt's heuristic; the heuristic's pick for m's row
  // bucket (building and caching the bucket's plan), if it runs m rows;
  // or (batch-invariant) the algorithm
  // chosen for kInvariantRefRows rows of the same shape, checked for m rows
  // (and against the workspace: at some row counts it asks for a few bytes,
  // e.g. 4 for [512 x 512] x [768 x 512]^T on an H200, with one K split
  // and no reduction still set).
  absl::Status ChooseAlgo(Plan* p, int m, int n, int k, ActType type, bool out_f32, bool fp8,
                          const float* w_scale, const float* x_scale);
  // OK if p->algo runs p's shape within the workspace; else why not
  // (cuBLASLt's check, or the workspace it wants).
  absl::Status CheckRuns(const Plan& p) const;
  // p's entry in warmed_: its shape (row count 0) and algorithm.
  static std::pair<Key, std::array<uint64_t, 8>> WarmKey(const Plan& p);
  absl::Status SetScalePointers(Plan* p, const float* w_scale, const float* x_scale);
  // One product with p's descriptors and `algo`.
  // Returns cuBLASLt's status (cublasStatus_t).
  int Matmul(const Plan& p, const void* algo, const void* w, const void* x, void* y,
             cudaStream_t stream) const;
  // Times p->candidates on these operands and keeps the fastest in p->algo
  // and tuned_; a no-op while `stream` is capturing (tried again later).
  absl::Status Tune(Plan* p, const void* w, const void* x, void* y, cudaStream_t stream);
  // The product of p, tuned first when p's bucket awaits it.
  absl::Status Launch(Plan* p, const void* w, const void* x, void* y, cudaStream_t stream,
                      const char* what);

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int skinny_max_m_ = 0;
  int skinny_fp8_max_m_ = 0;
  int skinny_mma_max_m_ = 0;
  bool skinny_mma_2byte_ = false;
  bool batch_invariant_ = false;
  int tune_candidates_ = 0;
  bool warming_ = false;
  int unwarmed_plans_ = 0;
  // While warming: the shapes (m = 0) and algorithms launched.
  std::set<std::pair<Key, std::array<uint64_t, 8>>> warmed_;
  void* tune_events_[2] = {nullptr, nullptr};  // cudaEvent_t, made at the first tuning
  DeviceBuffer fp8_x_;  // [fp8_rows_][fp8_max_k_] E4M3, then [fp8_rows_] float scales
  int fp8_rows_ = 0;
  int fp8_max_k_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  // Per bucket key (m = the row bucket, graph_buckets.h): the winning algorithm
  // (cublasLtMatmulAlgo_t's 64 bytes).
  std::map<Key, std::array<uint64_t, 8>> tuned_;
};

}  // namespace ballast::engine::cuda
