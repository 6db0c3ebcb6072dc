// `ballast chat`: an interactive terminal client. Each line read is a user
// message of one multi-turn chat session (GenerateRequest.messages with a
// session id): the server keeps the conversation and renders it with the
// model's chat template; the reply streams to the output as it is
// generated. "/reset" starts a new conversation, "/exit" or end of input
// ends it (the session is ended on the server either way).
//
// Thread-safety: RunChat runs on the calling thread.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

namespace ballast::server {

struct ChatFlags {
  std::string target = "127.0.0.1:50051";
  std::string model;
  // System prompt sent with the first message of each conversation; empty:
  // none.
  std::string system;
  // Most tokens per reply; 0: until the context window is full.
  int max_tokens = 512;
  float temperature = 0.7f;
  float top_p = 0.95f;
  int top_k = 0;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::optional<uint64_t> seed;
  bool ignore_eos = false;
  bool stats = false;  // usage and timings of each reply to `err`
};

// Reads user messages from `in` until end of input or "/exit"; replies go
// to `out`, prompts ("> ", when `interactive`), statistics and errors to
// `err`. Returns 0, or the exit code of the first failed turn (2; 3 when
// the server is unreachable).
int RunChat(const ChatFlags& flags, std::istream& in, std::ostream& out, std::ostream& err,
            bool interactive);

}  // namespace ballast::server
