// `ballast bench-remap`: parameter remapping (Mirage) against preemption
// with recompute, on one device in one process (issue 17's benchmark). A
// burst of long requests on one model exhausts the KV the device budget
// leaves; the same burst runs with node.memory.remap off (the ladder goes
// to preemption) and on, on a fresh device each time. Reports concurrent
// sequences (peak and mean), throughput, TBT p50/p99, preemptions, the
// layers lent and the bytes streamed, and checks that both modes produced
// the same tokens. With --idle-model, a second model is resident and idle
// during the burst (its layers are lent first). Kept out of main.cc.
#pragma once

#include <memory>

#include "CLI/CLI.hpp"

namespace ballast::server {

class RemapBenchCli {
 public:
  explicit RemapBenchCli(CLI::App* app);
  ~RemapBenchCli();
  // Returns true and sets *rc if bench-remap was parsed.
  bool RunParsed(int* rc);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ballast::server
