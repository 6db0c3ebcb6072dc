// libFuzzer target: trace JSONL (bench/trace.h), what `ballast bench` and
// `trace stats` read. Parsing must return a status naming the line; a trace
// that parses is summarized and written back as JSON lines.
#include <cstddef>
#include <cstdint>
#include <string>

#include "bench/generators.h"
#include "bench/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto trace = ballast::bench::ParseTrace(std::string(reinterpret_cast<const char*>(data), size),
                                          "fuzz.jsonl");
  if (!trace.ok()) return 0;
  (void)ballast::bench::FormatStats(ballast::bench::ComputeStats(*trace));
  for (const auto& r : *trace) (void)ballast::bench::ToJsonLine(r);
  return 0;
}
