// The token buckets of the CUDA engine's graph-replayed decode steps
// (engine/cuda/cuda_step_meta.cc): a decode-only step of T tokens runs as
// a captured graph of GraphBucketTokens(T) rows, the extra rows tokens at
// position -1 that read and write no KV. One graph serves every T in its
// bucket, so few graphs are captured.
//
// Up to kGraphPow2Tokens the buckets are powers of two: there a step's
// GEMMs are bound by reading the weights, which padded rows do not add to
// (docs/benchmarks.md, "Large batches in the engine model": the H200's
// ridge is about 192 tokens). Past it each padded row costs its FLOPs, so
// the buckets are multiples of kGraphTokenStep (at most 64 rows, 12% of a
// 513-token step, where a power of two would pad it to 1,024).
//
// Header-only and pure: the simulator's engine model applies the same
// padding (sim/engine_model.cc) and the unit tests check it without a GPU.
#pragma once

namespace ballast::engine {

inline constexpr int kGraphPow2Tokens = 256;
inline constexpr int kGraphTokenStep = 64;

// The rows a graph-replayed decode step of `tokens` tokens (>= 1) runs.
constexpr int GraphBucketTokens(int tokens) {
  if (tokens <= kGraphPow2Tokens) {
    int p = 1;
    while (p < tokens) p <<= 1;
    return p;
  }
  return (tokens + kGraphTokenStep - 1) / kGraphTokenStep * kGraphTokenStep;
}

}  // namespace ballast::engine
