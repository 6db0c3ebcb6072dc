// libFuzzer target: the YAML config loader (server/config.h) on any bytes.
// It must return a status, never crash or hang.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  (void)ballast::server::ParseConfig(yaml, "fuzz.yaml");
  return 0;
}
