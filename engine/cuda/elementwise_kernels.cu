// Embedding gather, fused residual-add + RMSNorm, SiLU-and-multiply, row
// gather and weight conversion.
#include "engine/cuda/common.cuh"

namespace ballast::engine::cuda {
namespace {

template <typename S, typename D>
__global__ void ConvertKernel(const S* __restrict__ src, D* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = FromF<D>(ToF(src[i]));
  }
}

template <typename T>
__global__ void EmbeddingKernel(const T* __restrict__ table, const int* __restrict__ tokens,
                                int hidden, float* __restrict__ resid) {
  AllowNextGrid();
  WaitPriorGrid();
  const int t = blockIdx.x;
  const T* row = table + static_cast<size_t>(tokens[t]) * hidden;
  float* out = resid + static_cast<size_t>(t) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = ToF(row[i]);
}

// One block per row. The row is re-read from L1/L2 for the second pass; rows
// are at most a few tens of KB.
template <typename T>
__global__ void AddRmsNormKernel(float* __restrict__ resid, const T* __restrict__ delta,
                                 const T* __restrict__ bias, const T* __restrict__ weight,
                                 float eps, int hidden, T* __restrict__ out,
                                 __nv_fp8_e4m3* __restrict__ q, float* __restrict__ q_scale) {
  AllowNextGrid();
  WaitPriorGrid();
  __shared__ float scratch[32];
  const size_t base = static_cast<size_t>(blockIdx.x) * hidden;
  float* r = resid + base;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float x = r[i];
    if (delta != nullptr) {
      x += ToF(delta[base + i]);
      if (bias != nullptr) x += ToF(bias[i]);
      r[i] = x;
    }
    ss += x * x;
  }
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(hidden) + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    out[base + i] = FromF<T>(ToF(weight[i]) * (r[i] * inv));
  }
  // Each thread reads back only what it wrote; the block max syncs.
  if (q != nullptr) QuantizeRowInBlock(out + base, hidden, q + base, q_scale + blockIdx.x, scratch);
}

// AddRmsNormKernel with the row held in registers between the passes:
// each thread owns up to kNormVectors 4-wide vectors (float4 loads of resid,
// 8-byte loads of the 2-byte types), so resid is read once. The FP8
// rounding works from the registers with QuantizeRowInBlock's arithmetic on
// the values as stored in `out`. Needs hidden % 4 == 0, hidden <= 4 *
// kNormVectors * blockDim.x and aligned pointers (NormVecAligned).
constexpr int kNormVectors = 4;

template <typename T>
__device__ __forceinline__ void Load4(const T* p, float v[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = ToF(e[j]);
}

template <typename T>
__global__ void __launch_bounds__(1024)
    AddRmsNormVecKernel(float* __restrict__ resid, const T* __restrict__ delta,
                        const T* __restrict__ bias, const T* __restrict__ weight, float eps,
                        int hidden, T* __restrict__ out, __nv_fp8_e4m3* __restrict__ q,
                        float* __restrict__ q_scale) {
  AllowNextGrid();
  WaitPriorGrid();
  __shared__ float scratch[32];
  const size_t base = static_cast<size_t>(blockIdx.x) * hidden;
  const int vectors = hidden / 4;
  float x[kNormVectors][4];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormVectors; ++k) {
    const int v = threadIdx.x + k * blockDim.x;
    if (v >= vectors) continue;
    float4* r = reinterpret_cast<float4*>(resid + base) + v;
    float4 f = *r;
    if (delta != nullptr) {
      float d[4];
      Load4(delta + base + 4 * v, d);
      f.x += d[0], f.y += d[1], f.z += d[2], f.w += d[3];
      if (bias != nullptr) {
        Load4(bias + 4 * v, d);
        f.x += d[0], f.y += d[1], f.z += d[2], f.w += d[3];
      }
      *r = f;
    }
    x[k][0] = f.x, x[k][1] = f.y, x[k][2] = f.z, x[k][3] = f.w;
    ss += f.x * f.x + f.y * f.y + f.z * f.z + f.w * f.w;
  }
  ss = BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(hidden) + eps);
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormVectors; ++k) {
    const int v = threadIdx.x + k * blockDim.x;
    if (v >= vectors) continue;
    float w[4];
    Load4(weight + 4 * v, w);
    uint2 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      e[j] = FromF<T>(w[j] * (x[k][j] * inv));
      x[k][j] = ToF(e[j]);  // as stored: what the FP8 rounding reads
      amax = fmaxf(amax, fabsf(x[k][j]));
    }
    *reinterpret_cast<uint2*>(out + base + 4 * v) = raw;
  }
  if (q == nullptr) return;
  amax = BlockMax(amax, scratch);
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
#pragma unroll
  for (int k = 0; k < kNormVectors; ++k) {
    const int v = threadIdx.x + k * blockDim.x;
    if (v >= vectors) continue;
    uint32_t raw;
    __nv_fp8_e4m3* e = reinterpret_cast<__nv_fp8_e4m3*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) e[j] = FromF<__nv_fp8_e4m3>(x[k][j] / scale);
    *reinterpret_cast<uint32_t*>(q + base + 4 * v) = raw;
  }
  if (threadIdx.x == 0) q_scale[blockIdx.x] = scale;
}

// SiLU-and-multiply of one row per block, then the row rounded to E4M3.
template <typename T>
__global__ void SiluMulFp8Kernel(const T* __restrict__ gate_up, int inter, T* __restrict__ out,
                                 __nv_fp8_e4m3* __restrict__ q, float* __restrict__ q_scale) {
  AllowNextGrid();
  WaitPriorGrid();
  __shared__ float scratch[32];
  const size_t t = blockIdx.x;
  const T* g = gate_up + t * 2 * inter;
  T* o = out + t * inter;
  for (int i = threadIdx.x; i < inter; i += blockDim.x) {
    const float a = ToF(g[i]);
    o[i] = FromF<T>(SiluTimes(a, ToF(g[inter + i])));
  }
  QuantizeRowInBlock(o, inter, q + t * inter, q_scale + t, scratch);
}

// 8 elements per thread with 16-byte loads and stores (inter % 8 == 0).
template <typename T>
__global__ void SiluMulVecKernel(const T* __restrict__ gate_up, int inter, T* __restrict__ out) {
  AllowNextGrid();
  WaitPriorGrid();
  const size_t t = blockIdx.y;
  const T* g = gate_up + t * 2 * inter;
  for (int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8; i < inter;
       i += gridDim.x * blockDim.x * 8) {
    float a[8], u[8], r[8];
    Load8(g + i, a);
    Load8(g + inter + i, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) r[j] = SiluTimes(a[j], u[j]);
    Store8(out + t * inter + i, r);
  }
}

template <typename T>
__global__ void SiluMulKernel(const T* __restrict__ gate_up, int inter, T* __restrict__ out) {
  AllowNextGrid();
  WaitPriorGrid();
  const size_t t = blockIdx.y;
  const T* g = gate_up + t * 2 * inter;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < inter; i += gridDim.x * blockDim.x) {
    const float a = ToF(g[i]);
    out[t * inter + i] = FromF<T>(SiluTimes(a, ToF(g[inter + i])));
  }
}

__global__ void GatherRowsKernel(const uint8_t* __restrict__ in, const int* __restrict__ rows,
                                 size_t row_bytes, uint8_t* __restrict__ out) {
  AllowNextGrid();
  WaitPriorGrid();
  const uint8_t* src = in + static_cast<size_t>(rows[blockIdx.x]) * row_bytes;
  uint8_t* dst = out + static_cast<size_t>(blockIdx.x) * row_bytes;
  for (size_t i = threadIdx.x; i < row_bytes; i += blockDim.x) dst[i] = src[i];
}

__global__ void ResolveTokensKernel(int* __restrict__ tokens, const int* __restrict__ from_row,
                                    const int* __restrict__ sampled, int n) {
  AllowNextGrid();
  WaitPriorGrid();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t < n && from_row[t] >= 0) tokens[t] = sampled[from_row[t]];
}

int RowThreads(int hidden) {
  int t = 128;
  while (t < 1024 && t < hidden / 4) t *= 2;
  return t;
}

bool AlignedTo(const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

// AddRmsNormVecKernel's block size for a row of `hidden` (about two
// vectors per thread), or 0 where it does not apply: hidden % 4 != 0, rows
// too wide for the registers, or a pointer off its access width (null
// pointers are aligned).
int NormVecThreads(const float* resid, const void* delta, const void* bias, const void* weight,
                   int hidden, const void* out, const Fp8Rows& fp8) {
  if (hidden % 4 != 0 || hidden > 4 * kNormVectors * 1024) return 0;
  if (!AlignedTo(resid, 16) || !AlignedTo(delta, 8) || !AlignedTo(bias, 8) ||
      !AlignedTo(weight, 8) || !AlignedTo(out, 8) || !AlignedTo(fp8.q, 4)) {
    return 0;
  }
  const int vectors = hidden / 4;
  int threads = std::max(32, ((vectors + 1) / 2 + 31) / 32 * 32);
  threads = std::min(threads, 1024);
  return vectors <= threads * kNormVectors ? threads : 0;
}

}  // namespace

cudaError_t LaunchConvert(const void* src, SrcType src_type, void* dst, ActType dst_type, size_t n,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<size_t>((n + threads - 1) / threads, 65535));
  BALLAST_DISPATCH_ACT(dst_type, T, {
    T* d = static_cast<T*>(dst);
    switch (src_type) {
      case SrcType::kF32:
        ConvertKernel<<<blocks, threads, 0, stream>>>(static_cast<const float*>(src), d, n);
        break;
      case SrcType::kBF16:
        ConvertKernel<<<blocks, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src), d, n);
        break;
      case SrcType::kF16:
        ConvertKernel<<<blocks, threads, 0, stream>>>(static_cast<const __half*>(src), d, n);
        break;
    }
  });
  return cudaGetLastError();
}

cudaError_t LaunchEmbedding(const void* table, ActType type, const int* tokens, int num_tokens,
                            int hidden, float* resid, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  BALLAST_DISPATCH_ACT(type, T, {
    return LaunchKernel(EmbeddingKernel<T>, num_tokens, RowThreads(hidden), 0, stream,
                        static_cast<const T*>(table), tokens, hidden, resid);
  });
  return cudaErrorInvalidValue;
}

cudaError_t LaunchAddRmsNorm(float* resid, const void* delta, const void* bias, const void* weight,
                             float eps, int num_tokens, int hidden, void* out, ActType type,
                             cudaStream_t stream, Fp8Rows fp8) {
  if (num_tokens == 0) return cudaSuccess;
  const int vec = NormVecThreads(resid, delta, bias, weight, hidden, out, fp8);
  BALLAST_DISPATCH_ACT(type, T, {
    return LaunchKernel(vec > 0 ? AddRmsNormVecKernel<T> : AddRmsNormKernel<T>, num_tokens,
                        vec > 0 ? vec : RowThreads(hidden), 0, stream, resid,
                        static_cast<const T*>(delta), static_cast<const T*>(bias),
                        static_cast<const T*>(weight), eps, hidden, static_cast<T*>(out),
                        static_cast<__nv_fp8_e4m3*>(fp8.q), fp8.scale);
  });
  return cudaErrorInvalidValue;
}

cudaError_t LaunchGatherRows(const void* in, const int* rows, int n, size_t row_bytes, void* out,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return LaunchKernel(GatherRowsKernel, n, 256, 0, stream, static_cast<const uint8_t*>(in), rows,
                      row_bytes, static_cast<uint8_t*>(out));
}

cudaError_t LaunchResolveTokens(int* tokens, const int* from_row, const int* sampled, int n,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return LaunchKernel(ResolveTokensKernel, (n + 255) / 256, 256, 0, stream, tokens, from_row,
                      sampled, n);
}

cudaError_t LaunchSiluMul(const void* gate_up, int num_tokens, int inter, void* out, ActType type,
                          cudaStream_t stream, Fp8Rows fp8) {
  if (num_tokens == 0) return cudaSuccess;
  if (fp8.q != nullptr) {
    BALLAST_DISPATCH_ACT(type, T, {
      return LaunchKernel(SiluMulFp8Kernel<T>, num_tokens, RowThreads(inter), 0, stream,
                          static_cast<const T*>(gate_up), inter, static_cast<T*>(out),
                          static_cast<__nv_fp8_e4m3*>(fp8.q), fp8.scale);
    });
    return cudaErrorInvalidValue;
  }
  const int threads = 256;
  if (inter % 8 == 0) {
    const dim3 grid(std::min((inter / 8 + threads - 1) / threads, 64), num_tokens);
    BALLAST_DISPATCH_ACT(type, T, {
      return LaunchKernel(SiluMulVecKernel<T>, grid, threads, 0, stream,
                          static_cast<const T*>(gate_up), inter, static_cast<T*>(out));
    });
    return cudaErrorInvalidValue;
  }
  const dim3 grid(std::min((inter + threads - 1) / threads, 64), num_tokens);
  BALLAST_DISPATCH_ACT(type, T, {
    return LaunchKernel(SiluMulKernel<T>, grid, threads, 0, stream, static_cast<const T*>(gate_up),
                        inter, static_cast<T*>(out));
  });
  return cudaErrorInvalidValue;
}

}  // namespace ballast::engine::cuda
