// QKV bias + rotary embedding + paged KV append, fused: one read of the QKV
// GEMM output, q written for attention, k and v written into their blocks.
#include "engine/cuda/common.cuh"

namespace ballast::engine::cuda {
namespace {

template <typename T, typename KvT>
__global__ void RopeKvWriteKernel(const T* __restrict__ qkv, const T* __restrict__ bias,
                                  const float* __restrict__ inv_freq, TokenMap tokens,
                                  int num_heads, PagedKv kv, T* __restrict__ q_out) {
  __shared__ float cos_s[128], sin_s[128];  // head_dim <= 256
  const int t = blockIdx.x;
  const int pos = tokens.pos[t];
  if (pos < 0) return;
  const int seq = tokens.seq[t];
  const int D = kv.head_dim, half = D / 2, Hkv = kv.num_kv_heads;
  // One sincos per frequency, shared by every head of the token.
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    sincosf(static_cast<float>(pos) * inv_freq[i], &sin_s[i], &cos_s[i]);
  }
  __syncthreads();
  const int width = (num_heads + 2 * Hkv) * D;
  const T* row = qkv + static_cast<size_t>(t) * width;
  auto in = [&](int i) { return ToF(row[i]) + (bias != nullptr ? ToF(bias[i]) : 0.0f); };
  // Rotated pairs (i, i + D/2) of q heads then k heads.
  const int pairs = (num_heads + Hkv) * half;
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int head = j / half, i = j % half;
    const int base = head * D;
    const float x1 = in(base + i), x2 = in(base + i + half);
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

}  // namespace

cudaError_t LaunchRopeKvWrite(const void* qkv, const void* bias, const float* inv_freq,
                              TokenMap tokens, int num_heads, PagedKv kv, void* q_out, ActType type,
                              cudaStream_t stream) {
  if (tokens.num_tokens == 0) return cudaSuccess;
  const int threads = 256;
  BALLAST_DISPATCH_ACT(type, T, {
    const T* in = static_cast<const T*>(qkv);
    const T* b = static_cast<const T*>(bias);
    T* q = static_cast<T*>(q_out);
    switch (kv.dtype) {
      case KvType::kFP8E4M3:
        RopeKvWriteKernel<T, __nv_fp8_e4m3>
            <<<tokens.num_tokens, threads, 0, stream>>>(in, b, inv_freq, tokens, num_heads, kv, q);
        break;
      case KvType::kBF16:
        RopeKvWriteKernel<T, __nv_bfloat16>
            <<<tokens.num_tokens, threads, 0, stream>>>(in, b, inv_freq, tokens, num_heads, kv, q);
        break;
      case KvType::kF16:
        RopeKvWriteKernel<T, __half>
            <<<tokens.num_tokens, threads, 0, stream>>>(in, b, inv_freq, tokens, num_heads, kv, q);
        break;
    }
  });
  return cudaGetLastError();
}

}  // namespace ballast::engine::cuda
