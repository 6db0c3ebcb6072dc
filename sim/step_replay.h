// Recorded engine steps against the engine model: the steps a real node
// ran (its per-step log, turned into CSV by scripts/step-log.py), each
// with its work as sim::StepWork counts it and its measured time, and
// what the calibrated model predicts for each. `ballast simulate steps`
// prints the comparison by kind of step (decode-only by batch size, and
// steps with prefill), which says where a simulated run's TTFT or
// throughput departs from the daemon's.
//
// Thread-safety: plain functions over values; no shared state.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sim/engine_model.h"

namespace ballast::sim {

struct RecordedStep {
  StepWork work;
  double ms = -1;  // measured; < 0: not measured (the row is predicted only)
};

// Parses CSV with a header row naming at least decode_tokens,
// decode_context, prefill_tokens, prefill_attention and prefill_logits
// (any order, other columns ignored; blank lines skipped); an `ms` column
// is the measured time (< 0: not measured). Counts must be whole numbers
// in [0, 2^31), the others finite. Errors name `origin`, the line (of the
// file, blank ones counted) and the column.
absl::StatusOr<std::vector<RecordedStep>> ParseRecordedSteps(const std::string& csv,
                                                             const std::string& origin);

// The steps of one kind: decode-only with 1-32, 33-128, 129-512 or more
// decode rows, or with prefill tokens.
struct StepGroup {
  std::string name;
  int steps = 0;            // steps with a measured time
  double measured_ms = 0;   // their sum
  double predicted_ms = 0;  // the model's sum over the same steps
  double median_error = 0;  // of predicted / measured - 1, per step
};

// Groups the measured steps (in the order above; empty groups left out,
// then "all") with the model's prediction for `shape`.
std::vector<StepGroup> CompareSteps(const EngineModel& model, const ModelShape& shape,
                                    const std::vector<RecordedStep>& steps);

}  // namespace ballast::sim
