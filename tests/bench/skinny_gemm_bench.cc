// Decode-sized GEMMs on the GPU host (issue 18, item 1): the four products
// of one Llama-3-8B layer (qkv 6144x4096, o 4096x4096, gate/up 28672x4096,
// down 4096x14336; BF16) at M = 1..32 rows, through cuBLASLt, the
// skinny kernel (M <= 8) and the tensor-core skinny kernel (M <= 16). Four layers' weights (1.7 GB,
// far past L2) are walked in turn, so every product streams its weights from HBM, as in a step.
// Prints the time per layer and the weight bytes per second. Usage: skinny_gemm_bench [iterations]
// (default 50)
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "engine/cuda/gemm.h"
#include "engine/cuda/kernels.h"

namespace cuda = ballast::engine::cuda;
using ballast::engine::cuda::ActType;

namespace {

struct Shape {
  const char* name;
  int n, k;
};
constexpr Shape kLayer[] = {
    {"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
constexpr int kLayers = 4;

void Must(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void Must(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// BF16 bits of small pseudo-random values (an LCG: no data-dependent
// clock boost from zeros, and cheap for 218M elements).
std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  uint32_t s = seed;
  for (auto& e : v) {
    s = s * 1664525u + 1013904223u;
    // magnitudes in [2^-7, 2^-6), random sign and mantissa
    e = static_cast<uint16_t>(((s >> 16) & 0x807Fu) | 0x3C00u);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 50;
  std::vector<void*> weights;  // [layer][shape]
  size_t layer_bytes = 0;
  for (const Shape& s : kLayer) layer_bytes += static_cast<size_t>(s.n) * s.k * 2;
  for (int l = 0; l < kLayers; ++l) {
    for (const Shape& s : kLayer) {
      const auto host = RandomBf16(static_cast<size_t>(s.n) * s.k, 7 + l);
      void* d = nullptr;
      Must(cudaMalloc(&d, host.size() * 2), "weights");
      Must(cudaMemcpy(d, host.data(), host.size() * 2, cudaMemcpyHostToDevice), "weights");
      weights.push_back(d);
    }
  }
  const int max_k = 14336, max_n = 28672, rows = 32;
  const auto xh = RandomBf16(static_cast<size_t>(rows) * max_k, 3);
  void *x = nullptr, *y = nullptr;
  Must(cudaMalloc(&x, xh.size() * 2), "x");
  Must(cudaMemcpy(x, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice), "x");
  Must(cudaMalloc(&y, static_cast<size_t>(rows) * max_n * 2), "y");
  cudaStream_t st;
  Must(cudaStreamCreate(&st), "stream");
  cuda::GemmOptions lt_opts;
  lt_opts.skinny_max_m = 0;
  lt_opts.skinny_mma_max_m = 0;
  auto lt = cuda::Gemm::Create(lt_opts);
  Must(lt.status(), "cuBLASLt");
  cuda::GemmOptions core_opts;
  core_opts.skinny_max_m = cuda::kSkinnyGemmMaxM;
  core_opts.skinny_mma_max_m = 0;
  auto core = cuda::Gemm::Create(core_opts);
  Must(core.status(), "skinny");
  cuda::GemmOptions mma_opts;
  mma_opts.skinny_max_m = 0;
  mma_opts.skinny_mma_max_m = cuda::kSkinnyMmaMaxM;
  mma_opts.skinny_mma_2byte = true;
  auto mma = cuda::Gemm::Create(mma_opts);
  Must(mma.status(), "tensor-core skinny");

  using Product = std::function<void(const void* w, int m, int n, int k)>;
  struct Method {
    std::string name;
    int max_m;
    Product run;
  };
  const std::vector<Method> methods = {
      {"cublaslt", 1 << 30,
       [&](const void* w, int m, int n, int k) {
         Must((*lt)->Run(x, w, y, m, n, k, ActType::kBF16, false, st), "cuBLASLt");
       }},
      {"skinny", cuda::kSkinnyGemmMaxM,
       [&](const void* w, int m, int n, int k) {
         Must((*core)->Run(x, w, y, m, n, k, ActType::kBF16, false, st), "skinny");
       }},
      {"mma", cuda::kSkinnyMmaMaxM,
       [&](const void* w, int m, int n, int k) {
         Must((*mma)->Run(x, w, y, m, n, k, ActType::kBF16, false, st), "tensor-core skinny");
       }},
  };
  cudaEvent_t a, b;
  Must(cudaEventCreate(&a), "event");
  Must(cudaEventCreate(&b), "event");
  std::printf("%4s %-10s %10s %9s   per product (us): qkv o gate_up down\n", "m", "method",
              "layer_us", "TB/s");
  for (const int m : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32}) {
    for (const Method& me : methods) {
      if (m > me.max_m) continue;
      auto pass = [&](int shape) {  // every layer's product of one shape (shape -1: all)
        for (int l = 0; l < kLayers; ++l) {
          for (int s = 0; s < 4; ++s) {
            if (shape < 0 || shape == s) me.run(weights[l * 4 + s], m, kLayer[s].n, kLayer[s].k);
          }
        }
      };
      for (int w = 0; w < 3; ++w) pass(-1);
      Must(cudaEventRecord(a, st), "record");
      for (int i = 0; i < iters; ++i) pass(-1);
      Must(cudaEventRecord(b, st), "record");
      Must(cudaEventSynchronize(b), "sync");
      float ms = 0;
      Must(cudaEventElapsedTime(&ms, a, b), "elapsed");
      const double layer_us = 1000.0 * ms / (iters * kLayers);
      std::printf("%4d %-10s %10.1f %9.3f  ", m, me.name.c_str(), layer_us,
                  layer_bytes / (layer_us * 1e-6) / 1e12);
      for (int s = 0; s < 4; ++s) {
        Must(cudaEventRecord(a, st), "record");
        for (int i = 0; i < iters; ++i) pass(s);
        Must(cudaEventRecord(b, st), "record");
        Must(cudaEventSynchronize(b), "sync");
        Must(cudaEventElapsedTime(&ms, a, b), "elapsed");
        std::printf(" %7.1f", 1000.0 * ms / (iters * kLayers));
      }
      std::printf("\n");
    }
  }
  return 0;
}
