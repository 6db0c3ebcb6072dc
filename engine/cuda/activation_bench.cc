// RunGpuActivationBench (engine/gpu_bench.h): how long activating a model
// from its pinned host copy takes, as a node does it (weight pages mapped
// from a CUDA VMM page pool, the image copied in 64 MiB chunks over
// `copy_streams` streams, the executor set up: cuBLASLt, workspace, step
// metadata), against the PCIe bound = weight bytes / the pinned
// host-to-device rate measured here with one 1 GiB cudaMemcpy.
//
// JSON: {device, model, weight_bytes, h2d_bytes_per_s, pcie_bound_ms,
// runs: [{map_ms, copy_ms, executor_ms, total_ms}], best_total_ms,
// ratio_to_bound, single_stream_copy_ms}
#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_executor.h"
#include "engine/cuda/cuda_status.h"
#include "engine/gpu_backend.h"
#include "engine/gpu_bench.h"
#include "memory/cuda/cuda_page_pool.h"
#include "nlohmann/json.hpp"

namespace ballast::engine {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Pinned host to device, one 1 GiB copy (best of 3).
absl::StatusOr<double> H2dBandwidth() {
  constexpr size_t kBytes = 1ull << 30;
  void* host = nullptr;
  BALLAST_CUDA_RETURN(cudaHostAlloc(&host, kBytes, cudaHostAllocDefault), "pinned buffer");
  std::memset(host, 1, kBytes);
  cuda::DeviceBuffer dev;
  absl::Status st = dev.Allocate(kBytes, "h2d bandwidth");
  double best = 0;
  for (int i = 0; st.ok() && i < 4; ++i) {
    const auto t0 = Clock::now();
    st = cuda::CudaStatus(cudaMemcpy(dev.get(), host, kBytes, cudaMemcpyHostToDevice), "h2d copy");
    const double s = Ms(t0, Clock::now()) / 1e3;
    if (i > 0) best = std::max(best, kBytes / s);  // the first warms up
  }
  cudaFreeHost(host);
  if (!st.ok()) return st;
  return best;
}

}  // namespace

absl::StatusOr<std::string> RunGpuActivationBench(const GpuActivationBenchOptions& o) {
  auto cfg = ModelConfig::Load(o.config_path);
  if (!cfg.ok()) return cfg.status();
  if (auto st = ApplyServingQuant(o.quantization, &*cfg); !st.ok()) return st;
  const ModelConfig& c = *cfg;
  BALLAST_CUDA_RETURN(cudaSetDevice(o.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  BALLAST_CUDA_RETURN(cudaGetDeviceProperties(&prop, o.device), "device query");
  const cuda::ActType act = cuda::CudaExecutor::ActivationType(c);
  const int64_t bytes = GpuWeightBytes(c);
  auto bw = H2dBandwidth();
  if (!bw.ok()) return bw.status();

  // The host copy: any bit pattern will do for timing (0x3c3c is a small
  // finite BF16/FP16 value).
  auto img = cuda::PinnedWeights::Allocate(static_cast<size_t>(bytes), act);
  if (!img.ok()) return img.status();
  (*img)->Fill(0x3c);
  std::shared_ptr<const HostWeights> host = *img;

  const size_t kPage = o.page_bytes;
  const size_t mapped = (static_cast<size_t>(bytes) + kPage - 1) / kPage * kPage;
  auto pool = memory::CudaPagePool::Create(o.device, kPage, static_cast<int64_t>(mapped));
  if (!pool.ok()) return pool.status();
  auto range = (*pool)->Reserve(mapped);
  if (!range.ok()) return range.status();

  // A small KV pool: activation does not size KV.
  KvLayout layout;
  layout.num_layers = c.num_hidden_layers;
  layout.num_kv_heads = c.num_key_value_heads;
  layout.head_dim = c.head_dim;
  layout.block_tokens = 16;
  layout.dtype = GpuAutoKvDType(c);
  auto blocks = CreateGpuBlockPool(o.device, layout.block_bytes(), 4 * c.num_hidden_layers);
  if (!blocks.ok()) return blocks.status();
  KvCache kv(layout, blocks->get());

  nlohmann::json runs = nlohmann::json::array();
  double best = 1e30;
  for (int r = 0; r < o.runs; ++r) {
    const auto t0 = Clock::now();
    if (auto st = (*pool)->Map(*range, mapped); !st.ok()) return st;
    const auto t1 = Clock::now();
    auto w = cuda::DeviceWeights::LoadFromHost(**img, c, act, o.copy_streams, {*range, mapped});
    if (!w.ok()) return w.status();
    const auto t2 = Clock::now();
    w->reset();
    // The whole executor, as ModelEngine activates it (the copy again,
    // then cuBLASLt, workspace and metadata).
    GpuExecutorOptions g;
    g.device = o.device;
    g.max_context = std::min(c.max_position_embeddings, 8192);
    g.weights_at = *range;
    g.weights_capacity = mapped;
    g.host_weights = host;
    g.copy_streams = o.copy_streams;
    g.max_seqs = o.max_seqs;
    g.max_batch_tokens =
        o.max_batch_tokens > 0 ? o.max_batch_tokens : std::max(g.max_batch_tokens, o.max_seqs);
    g.warm_products = o.warm_products;
    const auto t3 = Clock::now();
    auto ex = cuda::CudaExecutor::Create(c, "", &kv, g);
    if (!ex.ok()) return ex.status();
    BALLAST_CUDA_RETURN(cudaDeviceSynchronize(), "activation");
    const auto t4 = Clock::now();
    ex->reset();
    (*pool)->Unmap(*range, mapped);
    const double total = Ms(t0, t1) + Ms(t3, t4);
    best = std::min(best, total);
    runs.push_back({{"map_ms", Ms(t0, t1)},
                    {"copy_ms", Ms(t1, t2)},
                    {"executor_ms", Ms(t3, t4)},
                    {"total_ms", total}});
  }
  // One stream, for comparison.
  if (auto st = (*pool)->Map(*range, mapped); !st.ok()) return st;
  const auto s0 = Clock::now();
  auto w1 = cuda::DeviceWeights::LoadFromHost(**img, c, act, 1, {*range, mapped});
  if (!w1.ok()) return w1.status();
  const double single = Ms(s0, Clock::now());
  w1->reset();
  (*pool)->Unmap(*range, mapped);

  const double bound_ms = static_cast<double>(bytes) / *bw * 1e3;
  nlohmann::json j;
  j["device"] = prop.name;
  j["model"] = o.config_path;
  j["quantization"] = o.quantization;
  j["weight_bytes"] = bytes;
  j["h2d_bytes_per_s"] = *bw;
  j["pcie_bound_ms"] = bound_ms;
  j["copy_streams"] = o.copy_streams;
  j["page_bytes"] = o.page_bytes;
  j["max_seqs"] = o.max_seqs;
  j["max_batch_tokens"] = o.max_batch_tokens;
  j["warm_products"] = o.warm_products;
  j["runs"] = runs;
  j["best_total_ms"] = best;
  j["ratio_to_bound"] = best / bound_ms;
  j["single_stream_copy_ms"] = single;
  const memory::CudaDriverCalls calls = (*pool)->driver_calls();
  j["driver_calls"] = {{"create", calls.create}, {"map", calls.map}, {"unmap", calls.unmap}};
  return j.dump(2);
}

}  // namespace ballast::engine
