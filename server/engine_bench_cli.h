// `ballast bench-engine`: the CUDA executor's decode and prefill speed on a
// checkpoint against the HBM roofline and cuBLAS's GEMM rate, optionally
// side by side with Hugging Face transformers' figures on the same weights
// (tests/bench/hf_engine_bench.py writes them). Kept out of main.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace ballast::server {

class EngineBenchCli {
 public:
  explicit EngineBenchCli(CLI::App* app);
  ~EngineBenchCli();
  // Returns true and sets *rc if bench-engine was parsed.
  bool RunParsed(int* rc);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Parses "1,16,64" into *out; false (after printing an error naming
// `flag`) if an entry is not a positive integer. Empty text: no entries.
bool ParsePositiveInts(const std::string& flag, const std::string& text, std::vector<int>* out);

}  // namespace ballast::server
