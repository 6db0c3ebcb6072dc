// Token sampling on the GPU, one block per row, by engine/sampler.h's rule.
// Log-probabilities come first, from the raw logits (log-sum-exp, then the
// top alternatives by repeated block argmax); then the row's penalties are
// applied in place (the raw values kept in the entries' scratch); greedy is
// an argmax; other modes find the top-k, min-p and top-p cut-offs by
// bisection on the scaled logit (no sort), then draw by an ordered prefix
// scan over token ids.
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

using Reduce = cub::BlockReduce<ArgMax, kThreads>;
using FReduce = cub::BlockReduce<float, kThreads>;
using IReduce = cub::BlockReduce<int, kThreads>;
using Scan = cub::BlockScan<float, kThreads>;

// The block's shared scratch. The helpers below end with a barrier, so the
// next one may reuse `tmp` and the broadcast slots at once.
struct Shared {
  union {
    Reduce::TempStorage argmax;
    FReduce::TempStorage fsum;
    IReduce::TempStorage isum;
    Scan::TempStorage scan;
  } tmp;
  float fcast;
  int icast;
  int winner;
};

// Block-wide reductions; every thread gets the result.
__device__ ArgMax BlockArgMax(ArgMax local, Shared& sh) {
  const ArgMax r = Reduce(sh.tmp.argmax).Reduce(local, ArgMaxOp());
  if (threadIdx.x == 0) {
    sh.fcast = r.v;
    sh.icast = r.i;
  }
  __syncthreads();
  const ArgMax out{sh.fcast, sh.icast};
  __syncthreads();
  return out;
}
__device__ float BlockSumF(float v, Shared& sh) {
  v = FReduce(sh.tmp.fsum).Sum(v);
  if (threadIdx.x == 0) sh.fcast = v;
  __syncthreads();
  const float out = sh.fcast;
  __syncthreads();
  return out;
}
__device__ int BlockSumI(int v, Shared& sh) {
  v = IReduce(sh.tmp.isum).Sum(v);
  if (threadIdx.x == 0) sh.icast = v;
  __syncthreads();
  const int out = sh.icast;
  __syncthreads();
  return out;
}

// The largest logit, lowest id on ties.
__device__ ArgMax RowArgMax(const float* x, int vocab, Shared& sh) {
  ArgMax best{-INFINITY, vocab};
  for (int i = threadIdx.x; i < vocab; i += kThreads) best = ArgMaxOp()(best, ArgMax{x[i], i});
  return BlockArgMax(best, sh);
}

// log_softmax statistics of the raw row: returns the log-sum-exp, and
// (thread 0) writes the `n` most likely tokens to *out, each pass taking
// the best token after the previous pick in (value desc, id asc) order.
__device__ float RawLogprobs(const float* x, int vocab, int n, SampleLogprobs* out, Shared& sh) {
  const float mx = RowArgMax(x, vocab, sh).v;
  float s = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += kThreads) s += expf(x[i] - mx);
  const float lse = mx + logf(BlockSumF(s, sh));
  ArgMax prev{INFINITY, -1};
  for (int k = 0; k < n; ++k) {
    ArgMax best{-INFINITY, vocab};
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float v = x[i];
      if (v < prev.v || (v == prev.v && i > prev.i)) best = ArgMaxOp()(best, ArgMax{v, i});
    }
    prev = BlockArgMax(best, sh);
    if (threadIdx.x == 0) {
      out->ids[k] = prev.i;
      out->logprobs[k] = prev.v - lse;
    }
  }
  if (threadIdx.x == 0) out->count = n;
  return lse;
}

// Rule 1 of engine/sampler.h with the CPU's roundings (no contraction into
// fused multiply-adds), so greedy picks match the CPU reference exactly.
__device__ float Penalised(float l, const SamplePenalty& e, const SampleParams& p) {
  const float r = p.repetition_penalty;
  if (r != 1.0f && (e.in_prompt != 0 || e.output_count > 0)) {
    l = l > 0.0f ? __fdiv_rn(l, r) : __fmul_rn(l, r);
  }
  if (e.output_count > 0) {
    const float pen = __fmul_rn(p.frequency_penalty, static_cast<float>(e.output_count));
    l = __fsub_rn(l, __fadd_rn(pen, p.presence_penalty));
  }
  return l;
}

// Penalises the row in place; each entry keeps its token's raw logit.
__device__ void ApplyRowPenalties(float* x, int vocab, const SampleParams& p, SamplePenalty* pen) {
  for (int j = threadIdx.x; j < p.penalty_count; j += kThreads) {
    SamplePenalty& e = pen[p.penalty_begin + j];
    if (e.token < 0 || e.token >= vocab) continue;
    e.raw = x[e.token];
    x[e.token] = Penalised(e.raw, e, p);
  }
  __syncthreads();
}

// The raw logit of `token` after ApplyRowPenalties (entries ascend by token).
__device__ float RawLogit(const float* x, int token, const SampleParams& p,
                          const SamplePenalty* pen) {
  int lo = p.penalty_begin, hi = p.penalty_begin + p.penalty_count;
  const int end = hi;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (pen[mid].token < token)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < end && pen[lo].token == token ? pen[lo].raw : x[token];
}

// Sum over the block of exp(z - mx) for the logits with z = x / T >= tau.
__device__ float KeptMass(const float* x, int vocab, float inv_t, float mx, float tau, Shared& sh) {
  float m = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float z = x[i] * inv_t;
    if (z >= tau) m += expf(z - mx);
  }
  return BlockSumF(m, sh);
}

// Top-k cut-off: the largest tau with count(z >= tau) >= k (all: mx - kRange).
__device__ float TopKCut(const float* x, int vocab, float inv_t, float mx, int k, Shared& sh) {
  float lo = mx - kRange;
  if (k <= 0 || k >= vocab) return lo;
  float hi = mx;
  for (int it = 0; it < kBisectSteps; ++it) {
    const float mid = 0.5f * (lo + hi);
    int cnt = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) cnt += x[i] * inv_t >= mid;
    if (BlockSumI(cnt, sh) >= k)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// Draws u in (0, total] and finds the token by an ordered scan over the
// kept logits: thread tid owns ids [tid * per, (tid + 1) * per). Rounding
// past the end keeps `fallback`.
__device__ int DrawKept(const float* x, int vocab, float inv_t, float mx, float tau, float total,
                        const SampleParams& p, int fallback, Shared& sh) {
  const int tid = threadIdx.x;
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
  if (tid == 0) sh.winner = fallback;
  __syncthreads();
  float before = 0.0f;
  Scan(sh.tmp.scan).ExclusiveSum(local, before);
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
    sh.winner = pick;  // at most one thread's range holds u
  }
  __syncthreads();
  const int out = sh.winner;
  __syncthreads();
  return out;
}

// Rules 2-6 on the (penalised) row; every thread gets the token.
__device__ int Draw(const float* x, int vocab, const SampleParams& p, Shared& sh) {
  const ArgMax best = RowArgMax(x, vocab, sh);
  if (p.temperature <= 0.0f) return best.i;
  const float inv_t = 1.0f / p.temperature;
  const float mx = best.v * inv_t;  // z = x / T; the max z
  float tau = TopKCut(x, vocab, inv_t, mx, p.top_k, sh);
  // Min-p: p >= min_p * p_max, i.e. z >= mx + ln(min_p).
  if (p.min_p > 0.0f) tau = fmaxf(tau, mx + logf(p.min_p));
  float total = KeptMass(x, vocab, inv_t, mx, tau, sh);
  // Top-p cut-off: the largest tau_p >= tau whose kept mass reaches top_p.
  if (p.top_p > 0.0f && p.top_p < 1.0f) {
    float lo = tau, hi = mx;
    const float want = p.top_p * total;
    for (int it = 0; it < kBisectSteps; ++it) {
      const float mid = 0.5f * (lo + hi);
      if (KeptMass(x, vocab, inv_t, mx, mid, sh) >= want)
        lo = mid;
      else
        hi = mid;
    }
    tau = lo;
    total = KeptMass(x, vocab, inv_t, mx, tau, sh);
  }
  return DrawKept(x, vocab, inv_t, mx, tau, total, p, best.i, sh);
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(float* logits, int vocab, const SampleParams* params, SamplePenalty* penalties,
                 int* tokens, SampleLogprobs* logprobs) {
  __shared__ Shared sh;
  AllowNextGrid();
  WaitPriorGrid();
  float* x = logits + static_cast<size_t>(blockIdx.x) * vocab;
  const SampleParams p = params[blockIdx.x];  // uniform over the block
  const bool want_logprobs = p.top_logprobs >= 0;
  float lse = 0.0f;
  if (want_logprobs) {
    const int n = min(min(p.top_logprobs, kSampleMaxTop), vocab);
    lse = RawLogprobs(x, vocab, n, &logprobs[blockIdx.x], sh);
  }
  if (p.penalty_count > 0) ApplyRowPenalties(x, vocab, p, penalties);
  const int chosen = Draw(x, vocab, p, sh);
  if (threadIdx.x == 0) {
    tokens[blockIdx.x] = chosen;
    if (want_logprobs) logprobs[blockIdx.x].chosen = RawLogit(x, chosen, p, penalties) - lse;
  }
}

}  // namespace

cudaError_t LaunchSample(float* logits, int n, int vocab, const SampleParams* params,
                         SamplePenalty* penalties, int* tokens, SampleLogprobs* logprobs,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return LaunchKernel(SampleKernel, n, kThreads, 0, stream, logits, vocab, params, penalties,
                      tokens, logprobs);
}

}  // namespace ballast::engine::cuda
