// Command-line definition of `ballast simulate` and `ballast simulate
// sweep` (the simulator, sim/simulator.h). SimCli registers them on `app`;
// after parsing, RunParsed runs whichever was chosen.
//
//   ballast simulate --config configs/sim/prism-58.yaml --trace t.jsonl --out DIR
//       [--policy NAME] [--gpus N] [--rate-scale 1,2] [--slo-scale 1] [--no-plots]
//     writes what `ballast bench` writes: result.json (runs, each with a
//     "simulation" section), requests-<scale>.csv and the PNG plots.
//   ballast simulate sweep --config ... --trace ... --out DIR --gpus 4,8,16
//       [--policy a,b] [--target 0.99] [--slo-scale 1,2,5]
//     runs every policy variant at every GPU count, judges each run at every
//     SLO scale, and reports, per policy and SLO scale, the fewest GPUs whose
//     TTFT attainment, TPOT attainment, and both, reach the target, with the
//     ratio to the first policy's (the cost saving, Prism's Figure 9(b)):
//     sweep.json, sweep.csv, sweep.md and sweep.png (at the first scale).
//   ballast simulate steps --calibration configs/sim/calibration-h200.json
//       --steps steps.csv [--shape llama-8b] [--kv-dtype-bytes 1] [--out pred.csv]
//     the engine model against steps a real node ran (scripts/step-log.py
//     turns its per-step log into steps.csv): measured and predicted sums
//     by kind of step (sim/step_replay.h).
#pragma once

#include <memory>

#include "CLI/CLI.hpp"

namespace ballast::server {

class SimCli {
 public:
  explicit SimCli(CLI::App* app);
  ~SimCli();
  bool RunParsed(int* rc);
  struct State;  // the parsed flags (sim_cli.cc)

 private:
  std::unique_ptr<State> s_;
};

}  // namespace ballast::server
