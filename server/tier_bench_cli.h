// `ballast bench-tiers`: TTFT of a session's next turn by where its KV is —
// resident on the device, in the node's DRAM tier, on its SSD tier, on a
// peer node's tiers (over gRPC on loopback), or recomputed — each with and
// without an Advise prefetch before the turn (issue 16's benchmark). Runs
// in one process: two NodeManagers (the serving node and the peer) on the
// chosen backend, the peer served by a real NodeService. Kept out of
// main.cc.
#pragma once

#include <memory>

#include "CLI/CLI.hpp"

namespace ballast::server {

class TierBenchCli {
 public:
  explicit TierBenchCli(CLI::App* app);
  ~TierBenchCli();
  // Returns true and sets *rc if bench-tiers was parsed.
  bool RunParsed(int* rc);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ballast::server
