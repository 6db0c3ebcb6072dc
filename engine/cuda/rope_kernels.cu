// QKV bias + q/k head norms (Qwen3) + rotary embedding + paged KV append,
// fused: one read of the QKV GEMM output, q written for attention, k and v
// written into their blocks.
#include "engine/cuda/common.cuh"

namespace ballast::engine::cuda {
namespace {

// Inverse RMS of each q and k head of one token's row into inv_rms[head]
// (one warp per head), as HF's Qwen3RMSNorm computes it in float32.
template <typename T>
__device__ void HeadInvRms(const T* row, const T* bias, int heads, int D, float eps,
                           float* inv_rms) {
  const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int h = threadIdx.x >> 5; h < heads; h += warps) {
    float ss = 0.0f;
    for (int i = lane; i < D; i += 32) {
      const float x = ToF(row[h * D + i]) + (bias != nullptr ? ToF(bias[h * D + i]) : 0.0f);
      ss += x * x;
    }
    ss = WarpSum(ss);
    if (lane == 0) inv_rms[h] = rsqrtf(ss / static_cast<float>(D) + eps);
  }
}

// The token one block of either kernel below works on (t = blockIdx.x).
template <typename T>
struct RopeToken {
  int pos, seq;
  const T* row;  // its QKV output, (num_heads + 2 * Hkv) heads of D
};

// The prologue both kernels share: token t's position, sequence and QKV
// row into *tok, one sincos per frequency (shared by every head of the
// token) into sin_s/cos_s and, when `norm`, each q and k head's inverse RMS
// into inv_rms_s, then a block barrier. False (nothing written, no
// barrier) for a padding token (pos < 0), which the whole block skips.
template <typename T>
__device__ __forceinline__ bool RopePrologue(const T* __restrict__ qkv, const T* __restrict__ bias,
                                             bool norm, float eps,
                                             const float* __restrict__ inv_freq,
                                             const TokenMap& tokens, int num_heads,
                                             const PagedKv& kv, float* sin_s, float* cos_s,
                                             float* inv_rms_s, RopeToken<T>* tok) {
  const int t = blockIdx.x;
  const int pos = tokens.pos[t];
  if (pos < 0) return false;
  const int seq = tokens.seq[t];
  const int D = kv.head_dim, half = D / 2, Hkv = kv.num_kv_heads;
  const int width = (num_heads + 2 * Hkv) * D;
  const T* row = qkv + static_cast<size_t>(t) * width;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    sincosf(static_cast<float>(pos) * inv_freq[i], &sin_s[i], &cos_s[i]);
  }
  if (norm) HeadInvRms(row, bias, num_heads + Hkv, D, eps, inv_rms_s);
  __syncthreads();
  *tok = RopeToken<T>{pos, seq, row};
  return true;
}

template <typename T, typename KvT>
__global__ void RopeKvWriteKernel(const T* __restrict__ qkv, const T* __restrict__ bias,
                                  const T* __restrict__ q_norm, const T* __restrict__ k_norm,
                                  float eps, const float* __restrict__ inv_freq, TokenMap tokens,
                                  int num_heads, PagedKv kv, T* __restrict__ q_out) {
  AllowNextGrid();
  WaitPriorGrid();
  __shared__ float cos_s[128], sin_s[128];  // head_dim <= 256
  extern __shared__ float inv_rms_s[];      // [num_heads + Hkv] when normalising
  const bool norm = q_norm != nullptr;
  RopeToken<T> tok;
  if (!RopePrologue(qkv, bias, norm, eps, inv_freq, tokens, num_heads, kv, sin_s, cos_s, inv_rms_s,
                    &tok)) {
    return;
  }
  const int t = blockIdx.x, pos = tok.pos, seq = tok.seq;
  const int D = kv.head_dim, half = D / 2, Hkv = kv.num_kv_heads;
  const T* row = tok.row;
  auto in = [&](int i) { return ToF(row[i]) + (bias != nullptr ? ToF(bias[i]) : 0.0f); };
  // Rotated pairs (i, i + D/2) of q heads then k heads.
  const int pairs = (num_heads + Hkv) * half;
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int head = j / half, i = j % half;
    const int base = head * D;
    float x1 = in(base + i), x2 = in(base + i + half);
    if (norm) {
      const T* w = head < num_heads ? q_norm : k_norm;
      const float inv = inv_rms_s[head];
      x1 = ToF(w[i]) * (x1 * inv);
      x2 = ToF(w[i + half]) * (x2 * inv);
    }
    const float s = sin_s[i], c = cos_s[i];
    const float o1 = x1 * c - x2 * s, o2 = x2 * c + x1 * s;
    if (head < num_heads) {
      T* q = q_out + (static_cast<size_t>(t) * num_heads + head) * D;
      q[i] = FromF<T>(o1);
      q[i + half] = FromF<T>(o2);
    } else {
      KvT* k = reinterpret_cast<KvT*>(KvSlot(kv, seq, pos, head - num_heads, false, sizeof(KvT)));
      const float inv = 1.0f / kv.k_scale;
      k[i] = FromF<KvT>(o1 * inv);
      k[i + half] = FromF<KvT>(o2 * inv);
    }
  }
  const int vbase = (num_heads + Hkv) * D;
  const float vinv = 1.0f / kv.v_scale;
  for (int j = threadIdx.x; j < Hkv * D; j += blockDim.x) {
    const int h = j / D, i = j % D;
    KvT* v = reinterpret_cast<KvT*>(KvSlot(kv, seq, pos, h, true, sizeof(KvT)));
    v[i] = FromF<KvT>(in(vbase + j) * vinv);
  }
}

// x[0..8) = row[i..i+8) (+ bias[i..i+8)), as RopeKvWriteKernel's in().
template <typename T>
__device__ __forceinline__ void LoadBiased8(const T* __restrict__ row, const T* __restrict__ bias,
                                            int i, float x[8]) {
  Load8(row + i, x);
  if (bias == nullptr) return;
  float b[8];
  Load8(bias + i, b);
#pragma unroll
  for (int j = 0; j < 8; ++j) x[j] += b[j];
}

// RopeKvWriteVecKernel's V part: token `tok`'s V heads (+ bias) into their
// KV blocks, divided by kv.v_scale, 8 elements a thread.
template <typename T, typename KvT>
__device__ __forceinline__ void WriteVVec(const RopeToken<T>& tok, const T* __restrict__ bias,
                                          int num_heads, const PagedKv& kv) {
  const int D = kv.head_dim, Hkv = kv.num_kv_heads;
  const int vbase = (num_heads + Hkv) * D;
  const float vinv = 1.0f / kv.v_scale;
  for (int j = threadIdx.x * 8; j < Hkv * D; j += blockDim.x * 8) {
    float v[8];
    LoadBiased8(tok.row, bias, vbase + j, v);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] *= vinv;
    KvT* dst = reinterpret_cast<KvT*>(KvSlot(kv, tok.seq, tok.pos, j / D, true, sizeof(KvT)));
    Store8(dst + j % D, v);
  }
}

// The same arithmetic with 8 rotation pairs per thread and 16-byte loads
// and stores (8-byte for FP8 KV): element for element the results of
// RopeKvWriteKernel. Needs D % 16 == 0 and every pointer 16-byte aligned
// (VecAligned below); each head's half is then a whole number of vectors.
template <typename T, typename KvT>
__global__ void RopeKvWriteVecKernel(const T* __restrict__ qkv, const T* __restrict__ bias,
                                     const T* __restrict__ q_norm, const T* __restrict__ k_norm,
                                     float eps, const float* __restrict__ inv_freq, TokenMap tokens,
                                     int num_heads, PagedKv kv, T* __restrict__ q_out) {
  AllowNextGrid();
  WaitPriorGrid();
  __shared__ float cos_s[128], sin_s[128];
  extern __shared__ float inv_rms_s[];
  const bool norm = q_norm != nullptr;
  RopeToken<T> tok;
  if (!RopePrologue(qkv, bias, norm, eps, inv_freq, tokens, num_heads, kv, sin_s, cos_s, inv_rms_s,
                    &tok)) {
    return;
  }
  const int t = blockIdx.x, pos = tok.pos, seq = tok.seq;
  const int D = kv.head_dim, half = D / 2, Hkv = kv.num_kv_heads;
  const T* row = tok.row;
  auto load = [&](int i, float x[8]) { LoadBiased8(row, bias, i, x); };
  const int groups = half / 8;  // vectors of pairs per head
  for (int g = threadIdx.x; g < (num_heads + Hkv) * groups; g += blockDim.x) {
    const int head = g / groups, i = (g % groups) * 8, base = head * D;
    float x1[8], x2[8], o1[8], o2[8];
    load(base + i, x1);
    load(base + i + half, x2);
    if (norm) {
      const T* w = head < num_heads ? q_norm : k_norm;
      const float inv = inv_rms_s[head];
      float w1[8], w2[8];
      Load8(w + i, w1);
      Load8(w + i + half, w2);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        x1[j] = w1[j] * (x1[j] * inv);
        x2[j] = w2[j] * (x2[j] * inv);
      }
    }
    const float scale = head < num_heads ? 1.0f : 1.0f / kv.k_scale;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float s = sin_s[i + j], c = cos_s[i + j];
      o1[j] = (x1[j] * c - x2[j] * s) * scale;
      o2[j] = (x2[j] * c + x1[j] * s) * scale;
    }
    if (head < num_heads) {
      T* q = q_out + (static_cast<size_t>(t) * num_heads + head) * D;
      Store8(q + i, o1);
      Store8(q + i + half, o2);
    } else {
      KvT* k = reinterpret_cast<KvT*>(KvSlot(kv, seq, pos, head - num_heads, false, sizeof(KvT)));
      Store8(k + i, o1);
      Store8(k + i + half, o2);
    }
  }
  WriteVVec<T, KvT>(tok, bias, num_heads, kv);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether RopeKvWriteVecKernel's 16-byte accesses are all aligned: every
// row, head and half starts on a vector when D % 16 == 0 and the bases,
// slabs and blocks are 16-byte aligned (a null pointer is aligned).
bool VecAligned(const void* qkv, const void* bias, const QkNorm& norm, const PagedKv& kv,
                const void* q_out) {
  return kv.head_dim % 16 == 0 && Aligned16(qkv) && Aligned16(bias) && Aligned16(norm.q_weight) &&
         Aligned16(norm.k_weight) && Aligned16(kv.base) && kv.slab_bytes % 16 == 0 &&
         kv.block_bytes % 16 == 0 && Aligned16(q_out);
}

template <typename T, typename KvT>
cudaError_t Launch(const void* qkv, const void* bias, const QkNorm& norm, const float* inv_freq,
                   TokenMap tokens, int num_heads, const PagedKv& kv, void* q_out,
                   cudaStream_t stream) {
  const int threads = 256;
  const size_t smem = norm.q_weight != nullptr ? (num_heads + kv.num_kv_heads) * sizeof(float) : 0;
  auto kernel = VecAligned(qkv, bias, norm, kv, q_out) ? RopeKvWriteVecKernel<T, KvT>
                                                       : RopeKvWriteKernel<T, KvT>;
  return LaunchKernel(kernel, tokens.num_tokens, threads, smem, stream, static_cast<const T*>(qkv),
                      static_cast<const T*>(bias), static_cast<const T*>(norm.q_weight),
                      static_cast<const T*>(norm.k_weight), norm.eps, inv_freq, tokens, num_heads,
                      kv, static_cast<T*>(q_out));
}

}  // namespace

cudaError_t LaunchRopeKvWrite(const void* qkv, const void* bias, QkNorm norm, const float* inv_freq,
                              TokenMap tokens, int num_heads, PagedKv kv, void* q_out, ActType type,
                              cudaStream_t stream) {
  if (tokens.num_tokens == 0) return cudaSuccess;
  if (kv.head_dim > 256 || kv.head_dim % 2 != 0) return cudaErrorInvalidValue;
  if ((norm.q_weight == nullptr) != (norm.k_weight == nullptr)) return cudaErrorInvalidValue;
  BALLAST_DISPATCH_ACT(type, T, {
    switch (kv.dtype) {
      case KvType::kFP8E4M3:
        return Launch<T, __nv_fp8_e4m3>(qkv, bias, norm, inv_freq, tokens, num_heads, kv, q_out,
                                        stream);
      case KvType::kBF16:
        return Launch<T, __nv_bfloat16>(qkv, bias, norm, inv_freq, tokens, num_heads, kv, q_out,
                                        stream);
      case KvType::kF16:
        return Launch<T, __half>(qkv, bias, norm, inv_freq, tokens, num_heads, kv, q_out, stream);
    }
  });
  return cudaErrorInvalidValue;
}

}  // namespace ballast::engine::cuda
