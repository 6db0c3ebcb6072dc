// The tokens a Generate stream message carries, whichever way they came:
// none (a final), one (`token`) or a batch (`tokens`, for a caller that
// set token_batches). For GenerateResponse and NodeGenerateResponse alike.
// Thread-safety: pure functions.
#pragma once

#include "ballast/v1/inference.pb.h"

namespace ballast {

// Calls `f(const v1::Token&)` for each token of `r`, in order; returns how
// many there were.
template <class Response, class F>
int ForEachToken(const Response& r, F&& f) {
  if (r.has_token()) {
    f(r.token());
    return 1;
  }
  for (const v1::Token& t : r.tokens().tokens()) f(t);
  return r.tokens().tokens_size();
}

}  // namespace ballast
