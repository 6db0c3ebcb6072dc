#include "engine/rope.h"

#include <cmath>

namespace ballast::engine {

std::vector<float> RopeInverseFrequencies(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> f(half);
  for (int i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    f[i] = 1.0f / std::pow(static_cast<float>(c.rope_theta), exponent);
  }
  if (c.rope_scaling) {
    // Llama 3.1 rule (transformers' _compute_llama3_parameters): keep high
    // frequencies, divide low ones by `factor`, interpolate in between.
    const auto& r = *c.rope_scaling;
    const double old_len = r.original_max_position_embeddings;
    const double low_wavelen = old_len / r.low_freq_factor;
    const double high_wavelen = old_len / r.high_freq_factor;
    for (int i = 0; i < half; ++i) {
      const double wavelen = 2.0 * M_PI / f[i];
      const float scaled = static_cast<float>(f[i] / r.factor);
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        f[i] = scaled;
      } else {
        const double smooth =
            (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f[i] = static_cast<float>((1.0 - smooth) * scaled + smooth * f[i]);
      }
    }
  }
  return f;
}

}  // namespace ballast::engine
