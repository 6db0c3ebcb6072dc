// Device-side helpers shared by the kernels: element conversions and
// 8-wide vector loads and stores, warp and block reductions, and the launch
// helper for programmatic dependent launch. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "engine/cuda/kernels.h"

namespace ballast::engine::cuda {

// Programmatic dependent launch (Hopper, sm_90+). The forward pass's
// kernels are launched by LaunchKernel, which lets each one start while
// the kernel before it in the stream is still running; inside a CUDA graph
// the captured edge keeps that. Every such kernel must, in every block:
//   - call AllowNextGrid() (any time: from then on the next kernel's blocks
//     may be placed on free SMs, where they wait in WaitPriorGrid);
//   - call WaitPriorGrid() before it reads anything an earlier kernel of
//     the step wrote, writes anything, or exits. It returns once the
//     previous kernel has finished and its writes are visible; since that
//     kernel waited for its own predecessor, the whole stream before it is
//     done too. Without exit-after-wait this chain would break.
// Before the wait a kernel may only read what no kernel of the step writes
// (weights), e.g. to prefetch them (PrefetchL2): the FP8 skinny GEMV does.
// The BF16 one did too, and lost 0.1 ms a batch-1 step to it on an H200;
// it now only waits (gemv_kernels.cu).
// Remapping's streamed layers are written during the step, by copies on
// another stream: that is safe only because StreamBefore's event wait
// (cuda_layer_stream.cc) comes before the layer's first launch, a full
// dependency that PDL does not relax. Keep it there.
// With BALLAST_CUDA_PDL=0 (CMake option BALLAST_CUDA_PDL=OFF) launches are
// ordinary stream-ordered ones and the waits return at once. The device
// calls compile to nothing below sm_90; build OFF for such GPUs.
#ifndef BALLAST_CUDA_PDL
#define BALLAST_CUDA_PDL 1
#endif
constexpr bool kProgrammaticLaunch = BALLAST_CUDA_PDL != 0;

__device__ __forceinline__ void WaitPriorGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void AllowNextGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
// Prefetches the 128-byte line holding p into L2 (no register written).
__device__ __forceinline__ void PrefetchL2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// kernel<<<grid, block, smem, stream>>>(args...), allowed to overlap the
// previous kernel in the stream (see above). Returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = kProgrammaticLaunch ? 1 : 0;
  config.attrs = attr;
  config.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  const cudaError_t last = cudaGetLastError();  // cleared, as after <<<>>>
  return e != cudaSuccess ? e : last;
}

// Raises `kernel`'s dynamic shared memory limit to `bytes` on the current
// device, once per device and `done` (a static of the launching template,
// so one flag word per kernel), not at every launch, which saves a driver
// call (cuKernelSetAttribute) per launch. That driver call may also wait
// for the work queued on the device: cuBLASLt's calls of it did (gemm.h,
// "One algorithm per row bucket"); these, measured per launch, did not.
// Racing first calls both set the same value. Devices past 63 set it at
// every launch.
template <typename... Params>
cudaError_t SetMaxDynamicSmemOnce(void (*kernel)(Params...), int bytes,
                                  std::atomic<uint64_t>* done) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (done->load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) done->fetch_or(bit, std::memory_order_acq_rel);
  return e;
}

__device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToF(__half x) { return __half2float(x); }
__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(__nv_fp8_e4m3 x) { return static_cast<float>(x); }

template <typename T>
__device__ __forceinline__ T FromF(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromF<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ float FromF<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 FromF<__nv_fp8_e4m3>(float x) {
  return __nv_fp8_e4m3(x);  // round to nearest even, saturating (satfinite)
}

// Loads 8 consecutive elements (16-byte aligned for 2-byte types, 8-byte
// aligned for FP8) as floats.
template <typename T>
__device__ __forceinline__ void Load8(const T* p, float out[8]) {
  static_assert(sizeof(T) == 2, "2-byte types");
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = ToF(e[i]);
}
template <>
__device__ __forceinline__ void Load8<__nv_fp8_e4m3>(const __nv_fp8_e4m3* p, float out[8]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const __nv_fp8_e4m3* e = reinterpret_cast<const __nv_fp8_e4m3*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = ToF(e[i]);
}

// 16 consecutive E4M3 values (a 16-byte load's) as floats.
__device__ __forceinline__ void Fp8x16ToFloat(const uint4& raw, float out[16]) {
  const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[i], __NV_E4M3)));
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Stores 8 floats as consecutive elements of T (16-byte aligned for
// 2-byte types, 8-byte aligned for FP8), each rounded as FromF<T>.
template <typename T>
__device__ __forceinline__ void Store8(T* p, const float v[8]) {
  static_assert(sizeof(T) == 2, "2-byte types");
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = FromF<T>(v[i]);
  *reinterpret_cast<uint4*>(p) = raw;
}
template <>
__device__ __forceinline__ void Store8<__nv_fp8_e4m3>(__nv_fp8_e4m3* p, const float v[8]) {
  uint2 raw;
  __nv_fp8_e4m3* e = reinterpret_cast<__nv_fp8_e4m3*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = FromF<__nv_fp8_e4m3>(v[i]);
  *reinterpret_cast<uint2*>(p) = raw;
}

// silu(a) * u, as the MLP's SiLU kernels and the fused skinny gate/up
// product compute it (one formula, so their outputs agree bit for bit).
__device__ __forceinline__ float SiluTimes(float a, float u) { return a / (1.0f + __expf(-a)) * u; }

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats.
// blockDim.x must be a multiple of 32.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return WarpSum(v);
}
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return WarpMax(v);
}

// Rounds one row of n values (already in their stored type T) to E4M3 with
// one scale, as QuantizeRowsKernel and the host's RoundRowsToFp8 do:
// scale = max|row| / 448 (1 for a zero row), q[i] = e4m3(row[i] / scale).
// Called by every thread of the block; `scratch` holds 32 floats. Shared
// by the standalone quantization and the kernels that produce a layer's
// input (RMSNorm, SiLU-and-multiply), so all round alike.
template <typename T>
__device__ __forceinline__ void QuantizeRowInBlock(const T* row, int n, __nv_fp8_e4m3* q,
                                                   float* scale_out, float* scratch) {
  float amax = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) amax = fmaxf(amax, fabsf(ToF(row[i])));
  amax = BlockMax(amax, scratch);
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    q[i] = FromF<__nv_fp8_e4m3>(ToF(row[i]) / scale);
  if (threadIdx.x == 0) *scale_out = scale;
}

// Address of element 0 of (position pos, kv head h) of sequence row `seq`,
// in the K (value = false) or V half of the block holding pos.
__device__ __forceinline__ uint8_t* KvSlot(const PagedKv& kv, int seq, int pos, int h, bool value,
                                           size_t esz) {
  const unsigned id = static_cast<unsigned>(
      kv.block_ids[static_cast<size_t>(seq) * kv.max_blocks + pos / kv.block_tokens]);
  const unsigned mask = (1u << kv.slab_shift) - 1u;
  uint8_t* block = kv.base + static_cast<size_t>(id >> kv.slab_shift) * kv.slab_bytes +
                   static_cast<size_t>(id & mask) * kv.block_bytes;
  const size_t row = static_cast<size_t>(kv.num_kv_heads) * kv.head_dim * esz;
  return block + (value ? kv.block_tokens * row : 0) + (pos % kv.block_tokens) * row +
         static_cast<size_t>(h) * kv.head_dim * esz;
}

// Switch-based dispatch from the runtime activation type to a template.
#define BALLAST_DISPATCH_ACT(type, T, ...) \
  switch (type) {                          \
    case ActType::kBF16: {                 \
      using T = __nv_bfloat16;             \
      __VA_ARGS__;                         \
    } break;                               \
    case ActType::kF16: {                  \
      using T = __half;                    \
      __VA_ARGS__;                         \
    } break;                               \
  }

}  // namespace ballast::engine::cuda
