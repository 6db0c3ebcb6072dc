// `ballast serve` as a child of `ballast bench compare`: one config on its
// own loopback ports, waited on until its catalogue has settled, optionally
// warmed, and stopped (SIGTERM, then reaped) before the next run.
//
// Thread-compatible: one thread drives a ServeProcess. The signal handlers
// installed by ForwardStopSignals reach the child that is running at the
// time (one per process; `bench compare` runs one at a time).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ballast::server {

struct ServeStartOptions {
  // Models sent one short request each (max_tokens 1), all at once, once
  // the catalogue has settled; then it is waited on to settle again. A
  // steady state for the measured run: each model has been activated once
  // (weights read from disk, later kept as a host copy when evicted), as in
  // a daemon that has been serving for a while. Best effort: a model that
  // cannot be warmed in 120 s is warned about and measured cold. Default:
  // none.
  std::vector<std::string> warm_models;
  // How long the catalogue may take to settle (weights load from disk at
  // first), each time. Default 300 s.
  absl::Duration settle_timeout = absl::Seconds(300);
};

class ServeProcess {
 public:
  ServeProcess() = default;
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;
  ~ServeProcess() { Stop(); }

  // Starts `ballast serve --config config` (this very binary) with its
  // output in `log`, and returns once every configured model is settled:
  // a replica is READY, or it was idle-evicted for room (EVICTED: a
  // catalogue larger than the devices), and none is loading. A model that
  // FAILED for good ends the wait at once with its error. `*target` is the
  // scheduler's address.
  absl::Status Start(const std::string& config, const std::string& log,
                     const ServeStartOptions& options, std::string* target);
  // SIGTERM, then waits for the child to exit. No-op when none runs.
  void Stop();

 private:
  absl::Status WaitSettled(const std::string& target, size_t models, absl::Duration timeout);
  absl::Status Warm(const std::string& target, const std::vector<std::string>& models);

  std::string config_;
  std::string log_;
  pid_t pid_ = -1;
};

// SIGINT/SIGTERM stop the running child, then kill this process by the
// same signal. RestoreStopSignals puts the default handlers back.
void ForwardStopSignals();
void RestoreStopSignals();

}  // namespace ballast::server
