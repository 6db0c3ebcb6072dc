// A clock the test moves by hand, for the scheduler's injected Clock.
// Thread-compatible: tests move it between calls, never during one.
#pragma once

#include "absl/time/time.h"
#include "global_scheduler/cluster_state.h"

namespace ballast::global_scheduler {

struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000);
  Clock fn() {
    return [this] { return now; };
  }
};

}  // namespace ballast::global_scheduler
