// `ballast trace ...` (generate or import traces, print their statistics) and
// `ballast bench ...` (replay a trace against a running scheduler; compare
// configurations by starting `ballast serve` under each on the same trace).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "bench/generators.h"
#include "bench/report.h"
#include "bench/trace_import.h"

namespace ballast::server {

struct BenchFlags {
  std::string trace;
  std::string target = "127.0.0.1:50051";
  std::vector<double> rate_scales = {1.0};
  // {LO, HI}: instead of the rate_scales grid, search each config's highest
  // rate scale with >= 99% TTFT attainment in [LO, HI] (bench/scale_search.h),
  // `search_runs` runs at most per config. Empty: the grid.
  std::vector<double> search;
  int search_runs = 6;
  double slo_scale = 1.0;
  double duration_s = 0;
  std::string out = "bench-out";
  int max_inflight = 512;
  // A run whose client lag (send - scheduled arrival) p99 exceeds this is
  // flagged invalid in result.json and compare.md.
  double max_client_lag_ms = bench::kDefaultMaxClientLagMs;
  bool plots = true;
  std::vector<std::string> configs;  // compare only
  // compare only: before each run, one request to every model of the trace
  // (ServeStartOptions::warm_models), for the steady state of a daemon that
  // has served a while rather than its first minute. Default off.
  bool warmup = false;
};

// Writes `text` to `path` through a temporary file and a rename: a reader
// (or a kill) never sees half a file. A failure is a warning on stderr.
void WriteFileAtomic(const std::filesystem::path& path, const std::string& text);

// Writes the trace to `out` and prints its statistics.
int RunTraceGenerate(const std::vector<bench::TraceRecord>& trace, const std::string& out);
// Imports a production trace (bench/trace_import.h), writes it to `out` and
// prints a one-line summary; a bad input or flag is an error (exit 2).
int RunTraceImport(const bench::ImportOptions& o, const std::string& out);
// `models`: the catalogue; its models without requests count as idle.
int RunTraceStats(const std::string& path, const std::vector<std::string>& models = {});
int RunBench(const BenchFlags& f);
// Writes each config's result-<scale>.json, requests-<scale>.csv and
// result.json (runs so far) and compare.md/.json after every rate scale, so
// a stopped comparison leaves complete files; stdout is line-buffered. Its
// `ballast serve` children die with it (PR_SET_PDEATHSIG, and SIGINT/SIGTERM
// are forwarded to them).
int RunBenchCompare(const BenchFlags& f);

}  // namespace ballast::server
