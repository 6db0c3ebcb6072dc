// The GPU engine benchmarks (`ballast bench-engine`, `ballast
// bench-activation`) as seen from code that must build without CUDA. They
// are white-box measurements of the CUDA backend, so they live beside it
// (engine/cuda/engine_bench.cc, engine/cuda/activation_bench.cc) but in
// their own library, ballast_engine_bench, which only the `ballast` binary
// links: nothing that serves carries them. The implementation is chosen at
// build time in engine/CMakeLists.txt; without CUDA,
// engine/gpu_bench_stub.cc answers UNIMPLEMENTED. No #ifdef anywhere.
//
// Thread-safety: each call is self-contained (its own executor, pools and
// streams); run one at a time per device, since they time the device.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gpu_backend.h"
#include "engine/weights.h"

namespace ballast::engine {

// `ballast bench-engine`: decode and prefill speed of the CUDA executor on
// one model, against the HBM roofline and cuBLAS's own GEMM rate.
struct GpuEngineBenchOptions {
  std::string model_dir;
  int device = 0;
  std::vector<int> batches = {1, 16, 64, 256};
  int context = 1024;  // tokens of KV each decoding sequence attends to
  // > 0: the decoding sequences' contexts differ, as a server's do: each is
  // drawn log-normal with mean `context` and this sigma (seed 1, the same
  // draws for every batch size), clamped to [1, 4 x context] (so the mean
  // falls as sigma grows; each decode entry reports its mean_context). The
  // mixed and interference runs keep equal contexts. 0: all equal.
  double context_sigma = 0;
  // How the decoding sequences' KV blocks are allocated: false (default),
  // each sequence's blocks in one run; true, one block of each sequence in
  // turn until all are covered, as a server's sequences grow together (a
  // sequence's consecutive blocks then lie a whole batch of blocks apart).
  bool interleave_kv = false;
  int prefill_tokens = 2048;  // prompt tokens of the prefill measurement
  // The prefill's tokens as this many prompts (lengths differing by at most
  // one), each its own sequence, in one step: a server's step of many short
  // prompts rather than one long one. 1: one prompt.
  int prefill_prompts = 1;
  int steps = 32;  // timed decode steps per batch size
  int warmup = 4;  // untimed steps first (graph capture happens here)
  int prefill_runs = 3;
  int block_tokens = 16;
  std::string kv_dtype = "auto";
  // Linear-layer weights: "none" or "fp8" (ModelEngineOptions::quantization).
  std::string quantization = "none";
  bool cuda_graphs = true;
  // HBM bandwidth of the roofline; 0 = the datasheet figure of the device
  // (H100 SXM 3.35 TB/s, H100 PCIe 2.0, H200 4.8), else the measured
  // device-to-device copy rate.
  double hbm_bytes_per_s = 0;
  bool gemm_peak = true;      // also time an 8192^3 cuBLASLt GEMM
  int skinny_gemm_max_m = 2;  // see GpuExecutorOptions
  // GpuExecutorOptions::skinny_fp8_max_m
  int skinny_fp8_max_m = kFp8UnroundedInputMaxTokens;
  int skinny_mma_max_m = kSkinnyMmaDefaultMaxM;  // GpuExecutorOptions::skinny_mma_max_m
  bool skinny_mma_2byte = false;                 // GpuExecutorOptions::skinny_mma_2byte
  bool fold_norms = true;                        // GpuExecutorOptions::fold_norms
  bool fold_rope = true;                         // GpuExecutorOptions::fold_rope
  int gemm_tune_candidates = 0;                  // GpuExecutorOptions::gemm_tune_candidates
  bool deterministic = false;                    // GpuExecutorOptions::deterministic
  // "static": one cudaMalloc'd block pool; "arena": the elastic KV slab
  // arena over CUDA VMM pages (64 MiB slabs), as elastic nodes use.
  std::string kv_pool = "static";
  // > 0: after the prefill run, a second executor of the same model (its
  // own weights) steps without pause on another thread while this one's
  // work is timed again, at the default and then at the greatest stream
  // priority (Executor::SetUrgent): what priority streams buy a device's
  // urgent model. Foreground "prefill": the second decodes this batch, the
  // prefill is timed; "decode": the second prefills prefill_tokens over
  // and over, a batch-1 decode step is timed. Needs prefill_tokens.
  int interference_batch = 0;
  // > 1: after the decode runs, this many copies of the model (each its own
  // weights and streams, one host thread each) decode every batch size at
  // once: the device's aggregate tokens/s for N resident models, the
  // figure the serving path is held to. Costs N - 1 more weight copies.
  int concurrent_models = 0;
  std::string interference_foreground = "prefill";
  // Not empty: after the decode runs, per decode batch and chunk length C,
  // a step of the batch's decodes plus one C-token prefill chunk against
  // the decodes alone and the chunk alone (engine/cuda/engine_bench_mixed.h):
  // whether chunked prefill mixed with decodes keeps its speed.
  std::vector<int> mixed_chunks;
  // > 0: the interference runs split the device's SMs (CUDA green
  // contexts): the foreground gets the first interference_sms (rounded up
  // to the partition granule), the background the rest. Costs one more
  // weight copy (the foreground's own executor). Default 0: both share
  // every SM.
  int interference_sms = 0;
};
// Results as JSON (see engine/cuda/engine_bench.cc for the fields).
absl::StatusOr<std::string> RunGpuEngineBench(const GpuEngineBenchOptions& options);

// `ballast bench-activation`: how long activating a model from its pinned
// host copy takes (weight pages mapped from a VMM pool, chunked copies on
// `copy_streams` streams, executor set up) against the PCIe bound (weight
// bytes / the measured pinned host-to-device copy rate). The weights are
// random (only shapes matter); `config_json` gives the shapes.
struct GpuActivationBenchOptions {
  std::string config_path;  // a config.json
  int device = 0;
  int runs = 3;
  int copy_streams = 4;
  // Linear-layer weights: "none" or "fp8" (the host copy is then the E4M3
  // image with its scales, about 0.57x the bytes for an 8B Llama).
  std::string quantization = "none";
  // VMM page (physical handle) size the weights are mapped in. Default
  // 64 MiB: measured on H100, mapping 15 GiB in 2 MiB pages costs ~200 ms
  // (one cuMemMap per page), in 64 MiB pages a few ms.
  size_t page_bytes = 64u << 20;
  // The executor's max_seqs (GpuExecutorOptions::max_seqs; its step budget
  // is then at least as many tokens). Default 0: 256 rows.
  int max_seqs = 0;
  // The executor's step budget in tokens (GpuExecutorOptions::
  // max_batch_tokens: sizes its activations and FP8 scratch). Default 0:
  // max(256, max_seqs).
  int max_batch_tokens = 0;
  // GpuExecutorOptions::warm_products. Default on, as a node activates.
  bool warm_products = true;
};
absl::StatusOr<std::string> RunGpuActivationBench(const GpuActivationBenchOptions& options);

}  // namespace ballast::engine
