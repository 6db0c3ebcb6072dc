// Command-line definitions of `ballast trace ...` and `ballast bench ...`
// (kept out of main.cc). AddBenchCommands registers the subcommands on
// `app`; after parsing, RunParsed runs whichever was chosen.
#pragma once

#include <memory>

#include "CLI/CLI.hpp"

namespace ballast::server {

class BenchCli {
 public:
  explicit BenchCli(CLI::App* app);
  ~BenchCli();
  // Returns true and sets *rc if one of these subcommands was parsed.
  bool RunParsed(int* rc);

 private:
  struct State;
  // RunParsed for the trace generators (arrivals, bursty, chat, agents,
  // sharegpt): true and *rc if one was parsed.
  bool RunTraceParsed(int* rc);
  // RunParsed for `bench` (plain or compare): its exit code.
  int RunBenchParsed();
  std::unique_ptr<State> s_;
};

}  // namespace ballast::server
