// PrefillCostModel: a model's prefill time as a function of prompt tokens,
// fitted from the device's measured steps, for arbitration's TTFT
// estimates (Prism §6.2 and FineServe §6.3 both need a per-model cost).
//
// Model: ms(tokens) = a + b * tokens, by ordinary least squares over the
// last `window` steps that computed prefill tokens (a step that also
// carried decodes counts whole: that is the time the queue waits). Until
// it has 4 samples spanning at least two token counts it uses the prior
// b = prior_ms_per_token, a = 0; the fit is clamped to b >= 0 and a >= 0.
//
// The first `warmup_steps` steps recorded are left out: a model's first
// step pays one-time costs. On the H200 (docs/benchmarks.md, issue 20,
// session 59) a model's 8-token warm-up prompt took 119-215 ms for the
// first model of a process (its launch loads the kernels) and 131-162 ms
// for others whose collection waited behind their next step's first graph
// instantiation, against 2-3 ms for the rest; one such sample among a
// few pulled the slope below zero, and the clamped fit predicted 50-77 ms
// for any prompt until the window had forgotten it, 64 prefill steps later.
//
// Thread-safety: not thread-safe; the device's step thread owns it.
#pragma once

#include <deque>
#include <utility>

namespace ballast::node_manager {

class PrefillCostModel {
 public:
  explicit PrefillCostModel(double prior_ms_per_token = 0.05, int window = 64, int warmup_steps = 1)
      : prior_(prior_ms_per_token), window_(window), warmup_left_(warmup_steps) {}

  void Record(int tokens, double ms);
  // Estimated milliseconds to prefill `tokens` tokens.
  double PredictMs(int tokens) const;
  double intercept_ms() const { return a_; }
  double ms_per_token() const { return b_; }
  int samples() const { return static_cast<int>(samples_.size()); }

 private:
  void Fit();
  const double prior_;
  const int window_;
  int warmup_left_;  // steps still to leave out
  std::deque<std::pair<int, double>> samples_;
  double a_ = 0, b_ = prior_;
};

}  // namespace ballast::node_manager
