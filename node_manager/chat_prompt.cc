#include "node_manager/chat_prompt.h"

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace ballast::node_manager {

ChatPrompts::Entry ChatPrompts::Get(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  auto it = templates_.find(dir);
  if (it != templates_.end()) return it->second;
  Entry entry = absl::InternalError("unset");
  auto t = chat::ChatTemplate::Load(dir);
  if (t.ok()) {
    entry = std::shared_ptr<const chat::ChatTemplate>(std::move(*t));
  } else {
    const std::string file = (std::filesystem::path(dir) / "tokenizer_config.json").string();
    entry = absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint has no usable chat template (", file, "'s chat_template or ",
        "chat_template.jinja): ", t.status().message(), "; send a prompt instead of messages"));
  }
  templates_.emplace(dir, entry);
  return entry;
}

void ChatPrompts::Invalidate(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  templates_.erase(dir);
}

absl::StatusOr<std::vector<int>> ChatPrompts::Render(const std::string& model,
                                                     const std::string& dir,
                                                     const engine::Tokenizer& tokenizer,
                                                     const ChatMessages& history,
                                                     const ChatMessages& turn) {
  if (turn.empty()) return absl::InvalidArgumentError("messages is empty");
  chat::ChatRequest request;
  request.add_generation_prompt = true;
  int index = 0;
  for (const ChatMessages* list : {&history, &turn}) {
    for (const v1::ChatMessage& m : *list) {
      if (m.role().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("messages[", index, "].role is empty (system, user, assistant, ...)"));
      }
      request.messages.push_back({{"role", m.role()}, {"content", m.content()}});
      ++index;
    }
  }
  auto t = Get(dir);
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat("model ", model, ": ", t.status().message()));
  }
  auto text = (*t)->Apply(request);
  if (!text.ok()) {
    if (chat::IsTemplateException(text.status())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", model, "'s chat template refused the conversation: ", text.status().message()));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", model, ": rendering its chat template failed: ", text.status().message()));
  }
  return tokenizer.Encode(*text, {.add_special_tokens = false});
}

}  // namespace ballast::node_manager
