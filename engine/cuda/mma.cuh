// Tensor-core matrix multiply-accumulate (mma.sync m16n8k16, BF16/FP16 in,
// FP32 accumulate) for the kernels that use it: prefill attention and the
// tensor-core skinny GEMM. Register layouts are the PTX ISA's. Included by
// .cu files only (sm_80+ device code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace ballast::engine::cuda {

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

}  // namespace ballast::engine::cuda
