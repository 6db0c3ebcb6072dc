// Display names of v1::ModelState ("READY" for MODEL_STATE_READY): the one
// mapping from the proto lifecycle enum to text, for logs, the CLI and
// metrics labels. No code compares these strings; they are output only.
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "ballast/v1/inference.pb.h"

namespace ballast {

constexpr std::string_view ModelStateLabel(v1::ModelState s) {
  switch (s) {
    case v1::MODEL_STATE_REGISTERED:
      return "REGISTERED";
    case v1::MODEL_STATE_LOADING:
      return "LOADING";
    case v1::MODEL_STATE_READY:
      return "READY";
    case v1::MODEL_STATE_DRAINING:
      return "DRAINING";
    case v1::MODEL_STATE_EVICTED:
      return "EVICTED";
    case v1::MODEL_STATE_FAILED:
      return "FAILED";
    default:
      return "UNSPECIFIED";
  }
}

}  // namespace ballast
