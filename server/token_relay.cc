#include "server/token_relay.h"

#include <algorithm>
#include <utility>

namespace ballast::server {

void TokenRelay::Add(const v1::NodeGenerateResponse& message) {
  if (message.has_token()) tokens_.push_back(message.token());
  for (const v1::Token& t : message.tokens().tokens()) tokens_.push_back(t);
}

bool TokenRelay::Next(v1::GenerateResponse* out) {
  if (tokens_.empty()) return false;
  out->Clear();
  const size_t n = batches_ ? std::min(tokens_.size(), kMaxTokens) : 1;
  if (n == 1) {
    *out->mutable_token() = std::move(tokens_.front());
  } else {
    auto* batch = out->mutable_tokens()->mutable_tokens();
    batch->Reserve(static_cast<int>(n));
    for (size_t i = 0; i < n; ++i) *batch->Add() = std::move(tokens_[i]);
  }
  tokens_.erase(tokens_.begin(), tokens_.begin() + static_cast<std::ptrdiff_t>(n));
  return true;
}

}  // namespace ballast::server
