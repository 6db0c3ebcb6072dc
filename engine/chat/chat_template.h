// A model's chat template (the Jinja `chat_template` of its
// tokenizer_config.json), rendered in C++ byte-identically to Hugging Face
// transformers' tokenizer.apply_chat_template(messages, tokenize=False, ...).
//
// ChatTemplate parses the template once (Create / FromTokenizerConfig /
// Load) and renders it any number of times. Render takes the full Jinja
// context; Apply builds the context transformers passes (messages, tools,
// documents, add_generation_prompt, the tokenizer's special tokens, extra
// keyword arguments such as enable_thinking) and renders it.
//
// The rendered prompt already holds the special tokens the template writes
// (e.g. <|begin_of_text|>): tokenize it without adding BOS again, as
// transformers does (add_special_tokens=False).
//
// Errors: Create fails with INVALID_ARGUMENT for a syntax error and
// UNIMPLEMENTED for a Jinja construct this interpreter lacks, naming it and
// its line:column. Render fails with INVALID_ARGUMENT when the template
// calls raise_exception(msg) (message exactly `msg`; IsTemplateException()
// is true) or hits a runtime error. A render's work is bounded whatever the
// template: RESOURCE_EXHAUSTED past 16 MiB of text (from the whole render or
// one tojson) or RenderLimits::max_steps, OUT_OF_RANGE for strings over
// 16 MiB or lists over 1,048,576 items, and ranges over 100,000 items are
// refused as Jinja's sandbox does. 16 MiB is four times the largest request
// gRPC accepts by default; a million-token prompt is about 4 MiB.
//
// Thread-safety: immutable after creation; Render/Apply may run
// concurrently from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ballast::chat {

// What a chat request gives a template, in transformers' terms.
struct ChatRequest {
  // [{role, content, ...}]; content may be a string or a list of parts; any
  // other message fields (tool_calls, reasoning_content, ...) pass through.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  bool add_generation_prompt = false;
  // JSON tool schemas; null means no tools (the template sees none).
  nlohmann::ordered_json tools = nullptr;
  nlohmann::ordered_json documents = nullptr;
  // Extra template keyword arguments (e.g. {"enable_thinking": false});
  // they override everything else, as **kwargs do in transformers.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

// The work one render may do.
struct RenderLimits {
  // Steps: a statement or an expression is one, a loop iteration 16, and
  // work in proportion to size (a value made or read whole, printed text)
  // one more per 16 items or 64 bytes (evaluator.cc says which). Default
  // 4,000,000: Qwen3's template takes about 125 steps a message, so a
  // conversation of 30,000 messages fits (0.2 s for 8,000); the worst
  // template, a per-character filter such as wordcount on every byte, holds
  // a core about 2 s in a release build. Fuzzers lower it, since sanitizer
  // and coverage builds run some thirty times slower.
  int64_t max_steps = 4'000'000;
};

struct ParsedTemplate;  // the syntax tree (chat_template.cc)

class ChatTemplate {
 public:
  // `special_tokens`: name → token text (bos_token, eos_token, ...), made
  // template variables by Apply.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Create(
      std::string source, nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());
  // From a parsed tokenizer_config.json: its chat_template (a string, or a
  // list of {name, template} of which "default" is taken) and its special
  // tokens. `template_override`, when given, replaces the config's template
  // (transformers' chat_template.jinja file).
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromTokenizerConfig(
      const nlohmann::ordered_json& config,
      std::optional<std::string> template_override = std::nullopt);
  // From a tokenizer directory: tokenizer_config.json, and chat_template.jinja
  // when present (it takes precedence, as in transformers).
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Load(const std::string& dir);

  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // Renders with exactly `context` as the template's variables (plus the
  // globals raise_exception, strftime_now, range, namespace, dict).
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context,
                                     const RenderLimits& limits = {}) const;
  // The context transformers' apply_chat_template passes for `request`.
  nlohmann::ordered_json MakeContext(const ChatRequest& request) const;
  // Render(MakeContext(request)).
  absl::StatusOr<std::string> Apply(const ChatRequest& request,
                                    const RenderLimits& limits = {}) const;

  const std::string& source() const { return source_; }
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  ChatTemplate(std::string source, nlohmann::ordered_json special_tokens,
               std::unique_ptr<ParsedTemplate> parsed);

  std::string source_;
  nlohmann::ordered_json special_tokens_;
  std::unique_ptr<ParsedTemplate> parsed_;
};

// Whether `status` is the template's own raise_exception() (a request the
// model's template refuses, e.g. roles that do not alternate).
bool IsTemplateException(const absl::Status& status);

}  // namespace ballast::chat
