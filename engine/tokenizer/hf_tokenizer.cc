#include "engine/tokenizer/hf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/utf8.h"

namespace ballast::tokenizer {
namespace {

// Reads and parses `dir`/`name`; null JSON when absent and not required.
absl::StatusOr<nlohmann::json> ReadJson(const std::string& dir, const char* name, bool required) {
  const std::string path = (std::filesystem::path(dir) / name).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!required && !std::filesystem::exists(path)) return nlohmann::json();
    return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  }
  std::stringstream buf;
  buf << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buf.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return j;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

}  // namespace

DecodeStream::DecodeStream(const HfTokenizer* tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer),
      skip_special_(skip_special_tokens),
      state_(tokenizer->decoder_->NewState()) {}

void DecodeStream::Push(int id, std::string* bytes) {
  if (skip_special_ && tokenizer_->IsSpecial(id)) return;
  const std::string* token = tokenizer_->IdToToken(id);
  if (token != nullptr) state_->Push(*token, bytes);  // unknown ids decode to nothing
}

void DecodeStream::Finish(std::string* bytes) { state_->Finish(bytes); }

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::Load(const std::string& dir) {
  auto tok = ReadJson(dir, "tokenizer.json", true);
  if (!tok.ok()) return tok.status();
  auto config = ReadJson(dir, "tokenizer_config.json", false);
  if (!config.ok()) return config.status();
  auto generation = ReadJson(dir, "generation_config.json", false);
  if (!generation.ok()) return generation.status();
  auto model_config = ReadJson(dir, "config.json", false);
  if (!model_config.ok()) return model_config.status();
  auto t = FromJson(*tok, *config, *generation, *model_config, dir);
  if (!t.ok()) return t.status();
  const std::string jinja = (std::filesystem::path(dir) / "chat_template.jinja").string();
  if ((*t)->settings_.chat_template.empty() && std::filesystem::exists(jinja)) {
    (*t)->settings_.chat_template = ReadText(jinja);
  }
  return t;
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(
    const nlohmann::json& tokenizer_json, const nlohmann::json& tokenizer_config,
    const nlohmann::json& generation_config, const nlohmann::json& model_config,
    const std::string& dir) {
  const auto origin = [&](const char* name) {
    return (std::filesystem::path(dir) / name).string();
  };
  std::unique_ptr<HfTokenizer> t(new HfTokenizer());
  auto st = t->Init(JsonField(tokenizer_json, "", origin("tokenizer.json")),
                    JsonField(tokenizer_config, "", origin("tokenizer_config.json")),
                    JsonField(generation_config, "", origin("generation_config.json")),
                    JsonField(model_config, "", origin("config.json")));
  if (!st.ok()) return st;
  if (auto st2 = t->ResolveSpecials(dir); !st2.ok()) return st2;
  return t;
}

absl::Status HfTokenizer::Init(const JsonField& tok, const JsonField& config,
                               const JsonField& generation, const JsonField& model_config) {
  if (auto st = tok.ExpectObject(); !st.ok()) return st;
  const JsonField model = tok["model"];
  if (auto st = model.ExpectObject(); !st.ok()) return st;
  auto type = model.OptionalString("type");
  if (!type.ok()) return type.status();
  if (type->value_or("BPE") != "BPE") {
    return absl::UnimplementedError(absl::StrCat(tok.origin(), ": model.type: \"", **type,
                                                 "\" models are not supported (only BPE)"));
  }
  auto normalizer = Normalizer::FromJson(tok["normalizer"]);
  if (!normalizer.ok()) return normalizer.status();
  normalizer_ = std::move(*normalizer);
  auto pre = PreTokenizer::FromJson(tok["pre_tokenizer"]);
  if (!pre.ok()) return pre.status();
  pre_tokenizer_ = std::move(*pre);
  auto bpe = Bpe::FromJson(model);
  if (!bpe.ok()) return bpe.status();
  model_ = std::move(*bpe);
  auto decoder = Decoder::FromJson(tok["decoder"]);
  if (!decoder.ok()) return decoder.status();
  decoder_ = std::move(*decoder);
  auto added = AddedVocabulary::FromJson(tok["added_tokens"], *model_, normalizer_.get());
  if (!added.ok()) return added.status();
  added_ = std::move(*added);
  auto around = ParsePostProcessor(tok["post_processor"]);
  if (!around.ok()) return around.status();
  around_ = std::move(*around);
  auto settings = ParseCheckpointSettings(config, generation, model_config);
  if (!settings.ok()) return settings.status();
  settings_ = std::move(*settings);
  vocab_size_ = std::max(model_->max_id(), added_.max_id()) + 1;
  return absl::OkStatus();
}

absl::Status HfTokenizer::ResolveSpecials(const std::string& dir) {
  const std::string config = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  for (const AddedToken& t : added_.tokens()) {
    const std::string* s = IdToToken(t.id);
    if (s != nullptr && added_.IsSpecialContent(*s)) skip_ids_.insert(t.id);
  }
  for (const std::string& s : settings_.special_tokens) {
    if (auto id = TokenToId(s)) skip_ids_.insert(*id);
  }
  std::optional<int> eos;
  if (settings_.eos_token) {
    eos = TokenToId(*settings_.eos_token);
    if (!eos) {
      return absl::InvalidArgumentError(absl::StrCat(config, ": eos_token: \"",
                                                     *settings_.eos_token,
                                                     "\" is not in tokenizer.json's vocabulary"));
    }
    eos_ids_.push_back(*eos);
  }
  for (int id : settings_.eos_token_ids) {
    if (std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end()) eos_ids_.push_back(id);
  }
  if (settings_.bos_token) {
    auto bos = TokenToId(*settings_.bos_token);
    if (!bos) {
      return absl::InvalidArgumentError(absl::StrCat(config, ": bos_token: \"",
                                                     *settings_.bos_token,
                                                     "\" is not in tokenizer.json's vocabulary"));
    }
    bos_id_ = *bos;
  } else if (settings_.bos_token_id) {
    bos_id_ = *settings_.bos_token_id;
  }
  // transformers' Llama/Gemma-style rule: add_bos_token / add_eos_token, when
  // given, decide whether the post-processor's template carries BOS / EOS.
  auto adjust = [](std::vector<int>* ids, std::optional<bool> want, std::optional<int> id,
                   bool front) {
    if (!want || !id) return;
    const bool has = !ids->empty() && (front ? ids->front() : ids->back()) == *id;
    if (*want && !has) ids->insert(front ? ids->begin() : ids->end(), *id);
    if (!*want && has) ids->erase(front ? ids->begin() : ids->end() - 1);
  };
  adjust(&around_.prefix, settings_.add_bos_token,
         bos_id_ >= 0 ? std::optional<int>(bos_id_) : std::nullopt, true);
  adjust(&around_.suffix, settings_.add_eos_token, eos, false);
  return absl::OkStatus();
}

std::optional<int> HfTokenizer::TokenToId(std::string_view token) const {
  if (auto id = added_.IdOf(token)) return id;
  return model_->TokenToId(token);
}

const std::string* HfTokenizer::IdToToken(int id) const {
  if (const AddedToken* t = added_.Find(id)) return &t->form;
  return model_->IdToToken(id);
}

std::vector<int> HfTokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  std::string repaired;
  if (!IsValidUtf8(text)) {
    repaired = SanitizeUtf8(text);
    text = repaired;
  }
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 4);
  if (options.add_special_tokens) ids = around_.prefix;
  std::vector<AddedVocabulary::Segment> segments;
  if (added_.HasTokens(false)) {
    added_.Split(text, false, options.parse_special, &segments);
  } else {
    segments.push_back({-1, 0, text.size()});
  }
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
    } else {
      EncodeText(text.substr(seg.start, seg.end - seg.start), seg.start == 0, options, &ids);
    }
  }
  if (options.add_special_tokens) {
    ids.insert(ids.end(), around_.suffix.begin(), around_.suffix.end());
  }
  return ids;
}

void HfTokenizer::EncodeText(std::string_view raw, bool at_origin, const EncodeOptions& options,
                             std::vector<int>* ids) const {
  std::string text(raw);
  if (normalizer_) normalizer_->Normalize(&text);
  if (!added_.HasTokens(true)) {
    EncodeNormalized(std::move(text), at_origin, ids);
    return;
  }
  std::vector<AddedVocabulary::Segment> segments;
  added_.Split(text, true, options.parse_special, &segments);
  for (const auto& seg : segments) {
    if (seg.id >= 0) {
      ids->push_back(seg.id);
    } else {
      EncodeNormalized(text.substr(seg.start, seg.end - seg.start), at_origin && seg.start == 0,
                       ids);
    }
  }
}

void HfTokenizer::EncodeNormalized(std::string text, bool at_origin, std::vector<int>* ids) const {
  if (text.empty()) return;
  if (!pre_tokenizer_) {
    model_->Tokenize(text, ids);
    return;
  }
  std::vector<Piece> pieces;
  pieces.push_back({std::move(text), at_origin});
  pre_tokenizer_->PreTokenize(&pieces);
  for (const Piece& p : pieces) model_->Tokenize(p.text, ids);
}

std::string HfTokenizer::Decode(const std::vector<int>& ids, bool skip_special_tokens) const {
  DecodeStream stream(this, skip_special_tokens);
  std::string bytes;
  for (int id : ids) stream.Push(id, &bytes);
  stream.Finish(&bytes);
  return IsValidUtf8(bytes) ? bytes : SanitizeUtf8(bytes);
}

}  // namespace ballast::tokenizer
