// NameThisThread: gives the calling thread a name that `top -H`, `ps -L`,
// /proc/PID/task/*/comm and debuggers show, so an operator (and
// deploy/gpu-host/sim-validate.sh's CPU breakdown) can tell the daemon's
// threads apart: step threads, delivery, routing, admission, I/O.
//
// Thread-safety: affects only the calling thread.
#pragma once

#include <cstddef>
#include <string_view>

namespace ballast::transfer {

// Linux keeps at most 15 bytes of a thread's name; longer names are cut.
inline constexpr size_t kMaxThreadName = 15;

// Names the calling thread `name` (cut to kMaxThreadName bytes). A failure
// (not Linux) is ignored: names only help reading.
void NameThisThread(std::string_view name);

}  // namespace ballast::transfer
