#include "engine/tokenizer/checkpoint_config.h"

#include <algorithm>
#include <utility>

namespace ballast::tokenizer {
namespace {

// A special token given as "text", {"content": "text", ...} or null.
absl::StatusOr<std::optional<std::string>> TokenText(const JsonField& f) {
  if (f.is_null()) return std::optional<std::string>();
  if (f.value().is_string()) return std::optional<std::string>(f.value().get<std::string>());
  if (f.value().is_object()) {
    auto content = f.String("content");
    if (!content.ok()) return content.status();
    return std::optional<std::string>(*content);
  }
  return f.Error("expected a token string, {\"content\": ...} or null");
}

// transformers' defaults for special tokens a config leaves out, by class.
std::vector<std::pair<std::string, std::string>> ClassDefaults(const std::string& cls) {
  if (cls == "GemmaTokenizer" || cls == "GemmaTokenizerFast") {
    return {{"unk_token", "<unk>"},
            {"bos_token", "<bos>"},
            {"eos_token", "<eos>"},
            {"pad_token", "<pad>"},
            {"mask_token", "<mask>"}};
  }
  if (cls == "LlamaTokenizer" || cls == "LlamaTokenizerFast") {
    return {{"unk_token", "<unk>"}, {"bos_token", "<s>"}, {"eos_token", "</s>"}};
  }
  return {};
}

absl::Status AddTokenList(const JsonField& f, std::vector<std::string>* out) {
  if (f.is_null()) return absl::OkStatus();
  const bool array = f.value().is_array();
  if (!array && !f.value().is_object()) return f.Error("expected a list or an object of tokens");
  size_t i = 0;
  for (auto it = f.value().begin(); it != f.value().end(); ++it, ++i) {
    JsonField item = array ? f.at(i) : f[it.key()];
    if (item.value().is_array()) {  // extra_special_tokens may map a name to a list
      if (auto st = AddTokenList(item, out); !st.ok()) return st;
      continue;
    }
    auto t = TokenText(item);
    if (!t.ok()) return t.status();
    if (t->has_value()) out->push_back(**t);
  }
  return absl::OkStatus();
}

absl::Status ParseTokenizerConfig(const JsonField& c, CheckpointSettings* s) {
  if (c.is_null()) return absl::OkStatus();
  if (auto st = c.ExpectObject(); !st.ok()) return st;
  auto cls = c.OptionalString("tokenizer_class");
  if (!cls.ok()) return cls.status();
  const auto defaults = ClassDefaults(cls->value_or(""));
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token", "mask_token",
                          "sep_token", "cls_token"}) {
    std::optional<std::string> text;
    if (c.value().contains(key)) {
      auto t = TokenText(c[key]);
      if (!t.ok()) return t.status();
      text = *t;
    } else {
      for (const auto& [k, v] : defaults) {
        if (k == key) text = v;
      }
    }
    if (!text) continue;
    s->special_tokens.push_back(*text);
    if (std::string_view(key) == "bos_token") s->bos_token = text;
    if (std::string_view(key) == "eos_token") s->eos_token = text;
  }
  for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
    if (auto st = AddTokenList(c[key], &s->special_tokens); !st.ok()) return st;
  }
  for (auto [key, field] : {std::pair{"add_bos_token", &s->add_bos_token},
                            std::pair{"add_eos_token", &s->add_eos_token}}) {
    if (!c.Has(key)) continue;
    auto v = c.Bool(key, false);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  const JsonField tmpl = c["chat_template"];
  if (tmpl.value().is_string()) {
    s->chat_template = tmpl.value().get<std::string>();
  } else if (tmpl.value()
                 .is_array()) {  // [{"name": ..., "template": ...}]: "default", else the first
    for (size_t i = 0; i < tmpl.value().size(); ++i) {
      auto t = tmpl.at(i).String("template");
      if (!t.ok()) return t.status();
      auto name = tmpl.at(i).OptionalString("name");
      if (!name.ok()) return name.status();
      if (i == 0 || name->value_or("") == "default") s->chat_template = *t;
    }
  } else if (!tmpl.is_null()) {
    return tmpl.Error("expected a string or a list of {name, template}");
  }
  return absl::OkStatus();
}

// eos_token_id / bos_token_id: an int or a list of ints.
absl::Status AddIds(const JsonField& f, std::vector<int>* out) {
  if (f.is_null()) return absl::OkStatus();
  if (f.value().is_number_integer()) {
    out->push_back(f.value().get<int>());
    return absl::OkStatus();
  }
  if (!f.value().is_array()) return f.Error("expected an integer or a list of integers");
  for (size_t i = 0; i < f.value().size(); ++i) {
    if (!f.value()[i].is_number_integer()) return f.at(i).Error("expected an integer");
    out->push_back(f.value()[i].get<int>());
  }
  return absl::OkStatus();
}

absl::Status ParseGenerationConfig(const JsonField& g, CheckpointSettings* s) {
  if (g.is_null()) return absl::OkStatus();
  if (auto st = g.ExpectObject(); !st.ok()) return st;
  for (auto [key, field] : {std::pair{"temperature", &s->generation.temperature},
                            std::pair{"top_p", &s->generation.top_p}}) {
    const JsonField f = g[key];
    if (f.is_null()) continue;
    if (!f.value().is_number()) return f.Error("expected a number");
    *field = f.value().get<double>();
  }
  if (g.Has("top_k")) {
    auto k = g.Int("top_k", 0);
    if (!k.ok()) return k.status();
    s->generation.top_k = static_cast<int>(*k);
  }
  if (g.Has("do_sample")) {
    auto d = g.Bool("do_sample", false);
    if (!d.ok()) return d.status();
    s->generation.do_sample = *d;
  }
  return AddIds(g["eos_token_id"], &s->eos_token_ids);
}

}  // namespace

absl::StatusOr<CheckpointSettings> ParseCheckpointSettings(const JsonField& tokenizer_config,
                                                           const JsonField& generation_config,
                                                           const JsonField& model_config) {
  CheckpointSettings s;
  if (auto st = ParseTokenizerConfig(tokenizer_config, &s); !st.ok()) return st;
  if (auto st = ParseGenerationConfig(generation_config, &s); !st.ok()) return st;
  if (!model_config.is_null()) {
    if (auto st = AddIds(model_config["eos_token_id"], &s.eos_token_ids); !st.ok()) return st;
  }
  std::vector<int> bos;
  for (const JsonField& f : {generation_config["bos_token_id"], model_config["bos_token_id"]}) {
    if (auto st = AddIds(f, &bos); !st.ok()) return st;
  }
  if (!bos.empty()) s.bos_token_id = bos[0];
  return s;
}

}  // namespace ballast::tokenizer
