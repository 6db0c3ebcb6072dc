// Device kernels of `ballast bench-engine`'s device measurements
// (engine_bench_device.cc), behind plain host launchers as kernels.h's.
// Internal to the engine benchmark; CUDA builds only.
//
// Thread-safety: launchers are stateless; the caller orders work on streams.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace ballast::engine::cuda {

// Reads every 16-byte word of `in` once (n16 words, streaming loads, four in
// flight per thread) and writes one XOR of them per block to out[blockIdx]
// (so the reads cannot be left out): the device's read-only HBM rate, the
// bound of a decode step, which reads weights and KV and writes little.
// in: [n16] 16-byte words; out: [blocks].
cudaError_t LaunchReadAll(const uint4* in, size_t n16, uint32_t* out, int blocks,
                          cudaStream_t stream);

}  // namespace ballast::engine::cuda
