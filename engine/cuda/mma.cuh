// Warp-level tensor-core helpers shared by the attention kernels: ldmatrix,
// movmatrix, E4M3 pairs to FP16, mma.sync m16n8k16 (BF16/FP16 in, FP32 accumulate), packing and
// ex2, with the register layouts the PTX ISA defines. Included by .cu files only; every function
// acts on the calling lane's registers (no shared state).
#pragma once

#include <type_traits>

#include "engine/cuda/common.cuh"

namespace ballast::engine::cuda {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Four 8x8 b16 matrices; lanes 8i..8i+7 give matrix i's row addresses and
// each lane gets (row lane / 4, columns 2 (lane % 4), +1) of every matrix,
// or of its transpose with `.trans`. Volatile: the same address is read
// again after other threads rewrite the buffer.
__device__ __forceinline__ void Ldsm4(uint32_t addr, uint32_t r[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void Ldsm4T(uint32_t addr, uint32_t r[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Two 8x8 b16 matrices (lanes 0-15 give the row addresses), as Ldsm4.
__device__ __forceinline__ void Ldsm2(uint32_t addr, uint32_t r[2]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}
__device__ __forceinline__ void Ldsm2T(uint32_t addr, uint32_t r[2]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}

// Two E4M3 values (the low 16 bits of x, the lower byte first) as a packed
// pair of halves, exactly (every E4M3 value is an FP16 value): one
// cvt.rn.f16x2.e4m3x2 on sm_89 and later.
__device__ __forceinline__ uint32_t Fp8x2ToHalf2(uint32_t x) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// d[4] += a (16x16, row-major fragment) * b (16x8, column-major fragment).
// Fragments (g = lane / 4, t = lane % 4): a = {(g, 2t), (g + 8, 2t),
// (g, 2t + 8), (g + 8, 2t + 8)} pairs; b = {(2t, g), (2t + 8, g)} pairs
// (k, n); d = {(g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)}.
template <typename T>
__device__ __forceinline__ void Mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// The transpose of an 8x8 b16 matrix held in fragment layout (each lane:
// row lane / 4, columns 2 (lane % 4), +1): turns an MMA's accumulator
// (packed) into the B fragment of the next MMA. Whole warp.
__device__ __forceinline__ uint32_t Movt(uint32_t a) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(a));
  return r;
}

// Two floats as a packed pair of T, `lo` in the low half (the lower column).
template <typename T>
__device__ __forceinline__ uint32_t Pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&v);
  }
  return r;
}

// The two halves of a packed pair of T as floats (Pack2's inverse).
template <typename T>
__device__ __forceinline__ float2 Unpack2(uint32_t v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&v));
  }
}

__device__ __forceinline__ float Exp2(float x) {  // ex2.approx(-inf) = +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace ballast::engine::cuda
