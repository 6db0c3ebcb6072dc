// libFuzzer target: a safetensors file (engine/safetensors.h) of any bytes.
// Open validates the header and every tensor's byte range; a file it accepts
// has every tensor inside the mapping, which this reads end to end (ASan
// catches a range the validation let through).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("fuzz.safetensors", 0);
  if (fd < 0) return 0;
  if (write(fd, data, size) != static_cast<ssize_t>(size)) {
    close(fd);
    return 0;
  }
  auto file = ballast::engine::SafetensorsFile::Open("/proc/self/fd/" + std::to_string(fd));
  if (file.ok()) {
    uint64_t sum = 0;
    for (const auto& [name, t] : (*file)->tensors()) {
      for (size_t i = 0; i < t.nbytes; ++i) sum += t.data[i];
      sum += static_cast<uint64_t>(t.numel());
    }
    volatile uint64_t sink = sum;
    (void)sink;
  }
  close(fd);
  return 0;
}
