// The tokens the scheduler has read from a node's stream and not yet
// written to the client. SchedulerGenerateStream (scheduler_generate.cc)
// reads the node's messages while a write to the client is outstanding and
// keeps their tokens here; each write then takes what has gathered, so a
// client that asked for token batches catches up in few messages, and a
// node stream is not held to one message per client write.
//
// Thread-compatible: the stream's mutex guards it.
#pragma once

#include <cstddef>
#include <deque>

#include "ballast/v1/inference.pb.h"
#include "ballast/v1/node.pb.h"

namespace ballast::server {

class TokenRelay {
 public:
  // The most tokens held (the stream stops reading the node when full) and
  // the most one batched message carries.
  static constexpr size_t kMaxTokens = 256;

  // `batches`: the client asked for token batches (GenerateRequest
  // token_batches).
  explicit TokenRelay(bool batches) : batches_(batches) {}

  // Appends the tokens of a node message (`token` or `tokens`; none for
  // other messages).
  void Add(const v1::NodeGenerateResponse& message);
  // Moves the next client message's tokens into `out` (cleared first):
  // everything held, up to kMaxTokens, for a batching client (one token
  // alone as `token`, more as `tokens`), one token otherwise. False, and
  // `out` untouched, when nothing is held.
  bool Next(v1::GenerateResponse* out);
  void Clear() { tokens_.clear(); }

  bool empty() const { return tokens_.empty(); }
  bool full() const { return tokens_.size() >= kMaxTokens; }
  size_t size() const { return tokens_.size(); }

 private:
  const bool batches_;
  std::deque<v1::Token> tokens_;
};

}  // namespace ballast::server
