// `ballast trace ...` (generate traces, print their statistics) and
// `ballast bench ...` (replay a trace against a running scheduler; compare
// configurations by starting `ballast serve` under each on the same trace).
#pragma once

#include <string>
#include <vector>

#include "bench/generators.h"

namespace ballast::server {

struct BenchFlags {
  std::string trace;
  std::string target = "127.0.0.1:50051";
  std::vector<double> rate_scales = {1.0};
  double slo_scale = 1.0;
  double duration_s = 0;
  std::string out = "bench-out";
  int max_inflight = 512;
  bool plots = true;
  std::vector<std::string> configs;  // compare only
};

// Writes the trace to `out` and prints its statistics.
int RunTraceGenerate(const std::vector<bench::TraceRecord>& trace, const std::string& out);
int RunTraceStats(const std::string& path);
int RunBench(const BenchFlags& f);
int RunBenchCompare(const BenchFlags& f);

}  // namespace ballast::server
