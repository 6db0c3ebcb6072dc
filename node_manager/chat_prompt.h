// ChatPrompts: turns a chat turn (GenerateRequest.messages) into the prompt
// tokens of a model, with the model's own chat template.
//
// Rule: the whole conversation (the session's earlier messages, assistant
// replies included, then this turn's) is rendered with the template of the
// model's checkpoint directory (tokenizer_config.json's chat_template, or
// chat_template.jinja; engine/chat/chat_template.h) with
// add_generation_prompt, and tokenized without adding special tokens
// (the template writes them), exactly as transformers'
// apply_chat_template(..., tokenize=True) does. The result replaces the
// session's token history; the engine reuses the KV of the longest common
// prefix with what the session cached (KvManager::TakePrefix), so a turn
// costs only its new tokens when the template renders earlier turns the
// same way again.
//
// Templates are parsed once per directory and cached (failures too, so a
// broken template is not re-parsed per request); Invalidate drops the
// entry when a model (re)loads from the directory.
//
// Thread-safety: thread-safe.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ballast/v1/inference.pb.h"
#include "engine/chat/chat_template.h"
#include "engine/tokenizer.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace ballast::node_manager {

using ChatMessages = google::protobuf::RepeatedPtrField<v1::ChatMessage>;

class ChatPrompts {
 public:
  // The prompt tokens of a chat turn of `model` (its checkpoint in `dir`).
  // FAILED_PRECONDITION when the checkpoint has no usable chat template
  // (the reason names the file); INVALID_ARGUMENT for an empty message list
  // or role, or when the template refuses the conversation (its
  // raise_exception message).
  absl::StatusOr<std::vector<int>> Render(const std::string& model, const std::string& dir,
                                          const engine::Tokenizer& tokenizer,
                                          const ChatMessages& history, const ChatMessages& turn);
  // Forgets the cached template of `dir`.
  void Invalidate(const std::string& dir);

 private:
  using Entry = absl::StatusOr<std::shared_ptr<const chat::ChatTemplate>>;
  Entry Get(const std::string& dir);

  absl::Mutex mu_;
  std::map<std::string, Entry> templates_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::node_manager
