// Token sampling on the GPU: one block per row. Greedy is an argmax; other
// modes find the top-k and top-p cut-offs by bisection on the scaled logit
// (no sort), then draw by an ordered prefix scan over token ids.
#include <curand_kernel.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "engine/cuda/common.cuh"

namespace ballast::engine::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kBisectSteps = 48;
constexpr float kRange = 80.0f;  // exp(-80) ~ 2e-35: below this a token has no mass

struct ArgMax {
  float v;
  int i;
};
struct ArgMaxOp {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    if (a.v > b.v || (a.v == b.v && a.i < b.i)) return a;
    return b;
  }
};

// Sum over the block of exp(z - mx) for the logits with z = x / T >= tau;
// every thread gets the result. `tmp` and `bcast` are the caller's shared
// scratch (reused: the caller must not hold values in them).
template <typename Reduce>
__device__ float KeptMass(const float* x, int vocab, float inv_t, float mx, float tau,
                          typename Reduce::TempStorage& tmp, float& bcast) {
  float m = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float z = x[i] * inv_t;
    if (z >= tau) m += expf(z - mx);
  }
  m = Reduce(tmp).Sum(m);
  if (threadIdx.x == 0) bcast = m;
  __syncthreads();
  const float total = bcast;
  __syncthreads();
  return total;
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(const float* __restrict__ logits, int vocab, const SampleParams* params,
                 int* tokens) {
  using Reduce = cub::BlockReduce<ArgMax, kThreads>;
  using FReduce = cub::BlockReduce<float, kThreads>;
  using IReduce = cub::BlockReduce<int, kThreads>;
  using Scan = cub::BlockScan<float, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage argmax;
    typename FReduce::TempStorage fsum;
    typename IReduce::TempStorage isum;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ float bcast;
  __shared__ int winner;

  const float* x = logits + static_cast<size_t>(blockIdx.x) * vocab;
  const SampleParams p = params[blockIdx.x];
  const int tid = threadIdx.x;

  ArgMax best{-INFINITY, vocab};
  for (int i = tid; i < vocab; i += kThreads) best = ArgMaxOp()(best, ArgMax{x[i], i});
  best = Reduce(tmp.argmax).Reduce(best, ArgMaxOp());
  if (tid == 0) {
    winner = best.i;
    bcast = best.v;
  }
  __syncthreads();
  if (p.temperature <= 0.0f) {
    if (tid == 0) tokens[blockIdx.x] = winner;
    return;
  }
  const float inv_t = 1.0f / p.temperature;
  const float mx = bcast * inv_t;  // z = x / T; the max z
  __syncthreads();

  // Top-k cut-off: the largest tau with count(z >= tau) >= k.
  float tau = mx - kRange;
  if (p.top_k > 0 && p.top_k < vocab) {
    float lo = mx - kRange, hi = mx;
    for (int it = 0; it < kBisectSteps; ++it) {
      const float mid = 0.5f * (lo + hi);
      int cnt = 0;
      for (int i = tid; i < vocab; i += kThreads) cnt += x[i] * inv_t >= mid;
      cnt = IReduce(tmp.isum).Sum(cnt);
      if (tid == 0) bcast = cnt >= p.top_k ? 1.0f : 0.0f;
      __syncthreads();
      if (bcast > 0.0f)
        lo = mid;
      else
        hi = mid;
      __syncthreads();
    }
    tau = lo;
  }
  // Mass of the top-k set.
  float total = KeptMass<FReduce>(x, vocab, inv_t, mx, tau, tmp.fsum, bcast);
  // Top-p cut-off: the largest tau_p >= tau whose kept mass reaches top_p.
  if (p.top_p > 0.0f && p.top_p < 1.0f) {
    float lo = tau, hi = mx;
    const float want = p.top_p * total;
    for (int it = 0; it < kBisectSteps; ++it) {
      const float mid = 0.5f * (lo + hi);
      if (KeptMass<FReduce>(x, vocab, inv_t, mx, mid, tmp.fsum, bcast) >= want)
        lo = mid;
      else
        hi = mid;
    }
    tau = lo;
    total = KeptMass<FReduce>(x, vocab, inv_t, mx, tau, tmp.fsum, bcast);
  }
  // Draw u in (0, total] and find the token by an ordered scan: thread tid
  // owns ids [tid * per, (tid + 1) * per).
  curandStatePhilox4_32_10_t rng;
  curand_init(p.seed, p.counter, 0, &rng);
  const float u = curand_uniform(&rng) * total;
  const int per = (vocab + kThreads - 1) / kThreads;
  const int lo_id = min(tid * per, vocab), hi_id = min(lo_id + per, vocab);
  float local = 0.0f;
  for (int i = lo_id; i < hi_id; ++i) {
    const float z = x[i] * inv_t;
    if (z >= tau) local += expf(z - mx);
  }
  float before = 0.0f;
  Scan(tmp.scan).ExclusiveSum(local, before);
  if (local > 0.0f && before < u && u <= before + local) {
    float run = before;
    int pick = -1;
    for (int i = lo_id; i < hi_id; ++i) {
      const float z = x[i] * inv_t;
      if (z < tau) continue;
      run += expf(z - mx);
      pick = i;
      if (run >= u) break;
    }
    winner = pick;  // at most one thread's range holds u
  }
  __syncthreads();
  if (tid == 0) tokens[blockIdx.x] = winner;  // rounding past the end: keep the argmax
}

}  // namespace

cudaError_t LaunchSample(const float* logits, int n, int vocab, const SampleParams* params,
                         int* tokens, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SampleKernel<<<n, kThreads, 0, stream>>>(logits, vocab, params, tokens);
  return cudaGetLastError();
}

}  // namespace ballast::engine::cuda
