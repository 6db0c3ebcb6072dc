#include "engine/cuda/engine_bench_device.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "engine/cuda/bench_kernels.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/engine_bench_util.h"
#include "engine/cuda/gemm.h"

namespace ballast::engine::bench_internal {
namespace {

// Milliseconds `iters` calls of `launch` take on `stream`, timed by
// events (the launches are queued between them; nothing waits between
// calls).
absl::StatusOr<float> EventMs(cudaStream_t stream, int iters,
                              const std::function<absl::Status()>& launch) {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  absl::Status st = cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess
                        ? absl::OkStatus()
                        : absl::InternalError("cudaEventCreate failed");
  if (st.ok()) cudaEventRecord(e0, stream);
  for (int i = 0; i < iters && st.ok(); ++i) st = launch();
  float ms = 0;
  if (st.ok()) {
    cudaEventRecord(e1, stream);
    if (cudaEventSynchronize(e1) != cudaSuccess) st = absl::InternalError("event wait failed");
    if (st.ok() && cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) {
      st = absl::InternalError("cudaEventElapsedTime failed");
    }
  }
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  if (!st.ok()) return st;
  return ms;
}

// cuBLASLt's BF16 rate on an 8192^3 product, its algorithm timed as the
// engine's (tune_candidates). Zeros, or uniform values in [-1, 1): the
// tensor cores draw less power on zeros, so the clocks and the rate are
// higher than on data.
absl::StatusOr<double> GemmPeakTflops(int tune_candidates, bool random_data) {
  constexpr int n = 8192;
  cuda::DeviceBuffer a, b, c;
  const size_t bytes = static_cast<size_t>(n) * n * 2;
  std::vector<uint16_t> host;
  if (random_data) {
    host.resize(static_cast<size_t>(n) * n);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (uint16_t& v : host) {  // xorshift64; BF16 of 1 + [0, 1) less 1.5, doubled
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      const uint32_t bits = 0x3F800000u | static_cast<uint32_t>(x >> 41);
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      f = 2 * (f - 1.5f);
      uint32_t fb;
      std::memcpy(&fb, &f, sizeof(fb));
      v = static_cast<uint16_t>(fb >> 16);
    }
  }
  for (auto* buf : {&a, &b, &c}) {
    if (auto s = buf->Allocate(bytes, "gemm peak"); !s.ok()) return s;
    if (random_data && buf != &c) {
      BALLAST_CUDA_RETURN(cudaMemcpy(buf->get(), host.data(), bytes, cudaMemcpyHostToDevice),
                          "gemm peak operands");
    } else {
      BALLAST_CUDA_RETURN(cudaMemset(buf->get(), 0, bytes), "memset");
    }
  }
  cuda::GemmOptions go;
  go.skinny_max_m = 0;
  go.tune_candidates = tune_candidates;
  auto g = cuda::Gemm::Create(go);
  if (!g.ok()) return g.status();
  cudaStream_t st;
  BALLAST_CUDA_RETURN(cudaStreamCreate(&st), "stream");
  for (int i = 0; i < 3; ++i) {
    if (auto s = (*g)->Run(a.get(), b.get(), c.get(), n, n, n, cuda::ActType::kBF16, false, st);
        !s.ok())
      return s;
  }
  constexpr int kIters = 20;
  auto ms = EventMs(st, kIters, [&] {
    return (*g)->Run(a.get(), b.get(), c.get(), n, n, n, cuda::ActType::kBF16, false, st);
  });
  cudaStreamDestroy(st);
  if (!ms.ok()) return ms.status();
  return 2.0 * n * n * static_cast<double>(n) * kIters / (*ms * 1e-3) / 1e12;
}

// Device-to-device copy of 2 GiB: bytes read + written per second.
absl::StatusOr<double> CopyBandwidth() {
  constexpr size_t kBytes = 2ull << 30;
  cuda::DeviceBuffer a, b;
  if (auto s = a.Allocate(kBytes, "copy bandwidth"); !s.ok()) return s;
  if (auto s = b.Allocate(kBytes, "copy bandwidth"); !s.ok()) return s;
  BALLAST_CUDA_RETURN(cudaMemcpy(b.get(), a.get(), kBytes, cudaMemcpyDeviceToDevice), "copy");
  const auto t0 = Clock::now();
  constexpr int kIters = 5;
  for (int i = 0; i < kIters; ++i) {
    BALLAST_CUDA_RETURN(cudaMemcpy(b.get(), a.get(), kBytes, cudaMemcpyDeviceToDevice), "copy");
  }
  BALLAST_CUDA_RETURN(cudaDeviceSynchronize(), "copy");
  return 2.0 * kBytes * kIters / Seconds(t0, Clock::now());
}

// Reads of 4 GiB by a read-only kernel (bench_kernels.h), 4 blocks per
// SM: bytes read per second, the rate a decode step's reads can reach
// (the copy above also writes, and HBM turning between the two costs).
absl::StatusOr<double> ReadBandwidth(int sms) {
  constexpr size_t kBytes = 4ull << 30;
  const int blocks = 4 * sms;
  cuda::DeviceBuffer a, out;
  if (auto s = a.Allocate(kBytes, "read bandwidth"); !s.ok()) return s;
  if (auto s = out.Allocate(blocks * sizeof(uint32_t), "read bandwidth"); !s.ok()) return s;
  BALLAST_CUDA_RETURN(cudaMemset(a.get(), 1, kBytes), "memset");
  const auto* in = static_cast<const uint4*>(a.get());
  auto* o = static_cast<uint32_t*>(out.get());
  BALLAST_CUDA_RETURN(cuda::LaunchReadAll(in, kBytes / 16, o, blocks, nullptr), "read");
  constexpr int kIters = 10;
  auto ms = EventMs(nullptr, kIters, [&]() -> absl::Status {
    BALLAST_CUDA_RETURN(cuda::LaunchReadAll(in, kBytes / 16, o, blocks, nullptr), "read");
    return absl::OkStatus();
  });
  if (!ms.ok()) return ms.status();
  return static_cast<double>(kBytes) * kIters / (*ms * 1e-3);
}

double DatasheetBandwidth(const std::string& name) {
  if (name.find("H200") != std::string::npos) return 4.8e12;
  if (name.find("H100") != std::string::npos) {
    return name.find("PCIe") != std::string::npos ? 2.0e12 : 3.35e12;
  }
  return 0;
}

}  // namespace

absl::StatusOr<double> DescribeDevice(const GpuEngineBenchOptions& o, nlohmann::json* out) {
  BALLAST_CUDA_RETURN(cudaSetDevice(o.device), "cudaSetDevice");
  cudaDeviceProp prop;
  BALLAST_CUDA_RETURN(cudaGetDeviceProperties(&prop, o.device), "device query");
  (*out)["device"] = prop.name;
  auto copy_bw = CopyBandwidth();
  if (!copy_bw.ok()) return copy_bw.status();
  (*out)["copy_bytes_per_s"] = *copy_bw;
  auto read_bw = ReadBandwidth(prop.multiProcessorCount);
  if (!read_bw.ok()) return read_bw.status();
  (*out)["read_bytes_per_s"] = *read_bw;
  double hbm = o.hbm_bytes_per_s > 0 ? o.hbm_bytes_per_s : DatasheetBandwidth(prop.name);
  if (hbm <= 0) hbm = *copy_bw;
  (*out)["hbm_bytes_per_s"] = hbm;
  return hbm;
}

absl::Status AddGemmPeaks(const GpuEngineBenchOptions& o, nlohmann::json* out) {
  const int tune = o.deterministic ? 0 : o.gemm_tune_candidates;
  (*out)["gemm_tune_candidates"] = tune;
  if (!o.gemm_peak) return absl::OkStatus();
  auto peak = GemmPeakTflops(tune, false);
  if (!peak.ok()) return peak.status();
  (*out)["gemm_peak_tflops"] = *peak;
  auto on_data = GemmPeakTflops(tune, true);
  if (!on_data.ok()) return on_data.status();
  (*out)["gemm_peak_random_tflops"] = *on_data;
  return absl::OkStatus();
}

}  // namespace ballast::engine::bench_internal
