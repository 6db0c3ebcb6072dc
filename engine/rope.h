// Rotary position embedding frequencies shared by the backends. Pure.
#pragma once

#include <vector>

#include "engine/model_config.h"

namespace ballast::engine {

// Inverse RoPE frequencies [head_dim / 2], as transformers computes them
// (float32), including Llama-3 frequency scaling when configured.
std::vector<float> RopeInverseFrequencies(const ModelConfig& config);

}  // namespace ballast::engine
