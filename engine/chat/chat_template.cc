#include "engine/chat/chat_template.h"

#include <fstream>
#include <sstream>

#include "engine/chat/evaluator.h"
#include "engine/chat/lexer.h"
#include "engine/chat/parser.h"

namespace ballast::chat {

struct ParsedTemplate {
  StmtList body;
};

namespace {

// The special tokens transformers (5.x) puts in the template context: its
// special_tokens_map, i.e. the named tokens set in the config and the names
// of "extra_special_tokens" (Gemma 3's boi_token, ...); not the unnamed
// additional_special_tokens. A value is a string or an AddedToken object
// {"content": ...}. (A default a tokenizer class adds itself, such as
// Gemma's mask_token, is not in the config and so not here.)
constexpr const char* kSpecialTokenKeys[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                             "pad_token", "cls_token", "mask_token"};

std::optional<std::string> TokenText(const nlohmann::ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

nlohmann::ordered_json SpecialTokens(const nlohmann::ordered_json& config) {
  nlohmann::ordered_json tokens = nlohmann::ordered_json::object();
  for (const char* key : kSpecialTokenKeys) {
    if (!config.contains(key)) continue;
    if (auto text = TokenText(config[key])) tokens[key] = *text;
  }
  if (config.contains("extra_special_tokens") && config["extra_special_tokens"].is_object()) {
    for (const auto& [name, token] : config["extra_special_tokens"].items()) {
      if (auto text = TokenText(token)) tokens[name] = *text;
    }
  }
  return tokens;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(Cat("cannot open ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, nlohmann::ordered_json special_tokens,
                           std::unique_ptr<ParsedTemplate> parsed)
    : source_(std::move(source)),
      special_tokens_(std::move(special_tokens)),
      parsed_(std::move(parsed)) {}

ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Create(
    std::string source, nlohmann::ordered_json special_tokens) {
  auto tokens = Tokenize(source);
  if (!tokens.ok()) return tokens.status();
  auto body = Parse(std::move(*tokens));
  if (!body.ok()) return body.status();
  auto parsed = std::make_unique<ParsedTemplate>();
  parsed->body = std::move(*body);
  return std::unique_ptr<ChatTemplate>(
      new ChatTemplate(std::move(source), std::move(special_tokens), std::move(parsed)));
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromTokenizerConfig(
    const nlohmann::ordered_json& config, std::optional<std::string> template_override) {
  if (!config.is_object()) return absl::InvalidArgumentError("tokenizer config is not an object");
  std::string source;
  if (template_override) {
    source = std::move(*template_override);
  } else if (config.contains("chat_template") && config["chat_template"].is_string()) {
    source = config["chat_template"].get<std::string>();
  } else if (config.contains("chat_template") && config["chat_template"].is_array()) {
    for (const auto& t : config["chat_template"]) {
      if (t.value("name", "") == "default" && t.contains("template") && t["template"].is_string()) {
        source = t["template"].get<std::string>();
      }
    }
    if (source.empty()) {
      return absl::NotFoundError("tokenizer config has named chat templates but no 'default'");
    }
  } else {
    return absl::NotFoundError("tokenizer config has no chat_template");
  }
  return Create(std::move(source), SpecialTokens(config));
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Load(const std::string& dir) {
  auto text = ReadFile(dir + "/tokenizer_config.json");
  if (!text.ok()) return text.status();
  auto config = nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) {
    return absl::InvalidArgumentError(Cat(dir, "/tokenizer_config.json is not JSON"));
  }
  std::optional<std::string> override_source;
  if (auto jinja = ReadFile(dir + "/chat_template.jinja"); jinja.ok()) {
    override_source = std::move(*jinja);
  }
  return FromTokenizerConfig(config, std::move(override_source));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& context,
                                                 const RenderLimits& limits) const {
  return Evaluate(parsed_->body, context, limits.max_steps);
}

nlohmann::ordered_json ChatTemplate::MakeContext(const ChatRequest& request) const {
  nlohmann::ordered_json context = special_tokens_;
  context["messages"] = request.messages;
  context["tools"] = request.tools;
  context["documents"] = request.documents;
  context["add_generation_prompt"] = request.add_generation_prompt;
  for (const auto& [k, v] : request.kwargs.items()) context[k] = v;
  return context;
}

absl::StatusOr<std::string> ChatTemplate::Apply(const ChatRequest& request,
                                                const RenderLimits& limits) const {
  return Render(MakeContext(request), limits);
}

bool IsTemplateException(const absl::Status& status) { return IsRaisedException(status); }

}  // namespace ballast::chat
