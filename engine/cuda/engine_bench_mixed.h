// `ballast bench-engine --mixed`: chunked-prefill steps mixed with decodes
// (issue 18, item 3). For each decode batch B and chunk length C: a step
// of B decode tokens plus one C-token chunk at positions [C, 2C) of a
// fresh sequence (its first C tokens prefilled once, untimed), against
// the B decodes alone (CUDA graphs, as served) and the chunk alone. The
// chunk's marginal time in the mixed step (mixed - decodes alone) against
// its time alone says whether mixing keeps the prefill's speed.
// Internal to engine/cuda/engine_bench.cc; CUDA builds only.
//
// Thread-safety: one call at a time per executor.
#pragma once

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_executor.h"
#include "engine/gpu_bench.h"
#include "nlohmann/json.hpp"

namespace ballast::engine {

// KV blocks (per layer) the mixed runs need beyond the decode batches:
// one sequence of 2 x the longest chunk.
int64_t MixedChunkBlocks(const GpuEngineBenchOptions& o);

// JSON: [{batch, chunk, mixed_ms, decode_ms, chunk_ms, marginal_ms,
// chunk_tokens_per_s_mixed, chunk_tokens_per_s_alone, chunk_speed_kept}],
// chunk_speed_kept = chunk_ms / marginal_ms (1: the chunk costs no more
// mixed in than alone; null with the rate when marginal_ms <= 0). Each
// figure is the mean of o.steps steps after o.warmup untimed ones. REQUIRES: kv has room for the
// largest batch at o.context + 1 tokens plus MixedChunkBlocks.
absl::StatusOr<nlohmann::json> MeasureMixed(const GpuEngineBenchOptions& o, const ModelConfig& c,
                                            KvCache* kv, cuda::CudaExecutor* e);

}  // namespace ballast::engine
