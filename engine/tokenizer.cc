#include "engine/tokenizer.h"

#include <filesystem>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace ballast::engine {
namespace {

// The default decode stream: each token's bytes, alone.
class BytesStream final : public TokenDecodeStream {
 public:
  BytesStream(const Tokenizer* tokenizer, bool skip_special)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  void Push(int id, std::string* bytes) override {
    if (skip_special_ && tokenizer_->IsSpecial(id)) return;
    *bytes += tokenizer_->TokenBytes(id);
  }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
};

class HfStream final : public TokenDecodeStream {
 public:
  explicit HfStream(std::unique_ptr<tokenizer::DecodeStream> s) : s_(std::move(s)) {}
  void Push(int id, std::string* bytes) override { s_->Push(id, bytes); }
  void Finish(std::string* bytes) override { s_->Finish(bytes); }

 private:
  std::unique_ptr<tokenizer::DecodeStream> s_;
};

// A checkpoint's tokenizer.json behind the engine's interface.
class HfCheckpointTokenizer final : public Tokenizer {
 public:
  explicit HfCheckpointTokenizer(std::unique_ptr<tokenizer::HfTokenizer> t)
      : t_(std::move(t)), eos_(t_->eos_ids().begin(), t_->eos_ids().end()) {}

  using Tokenizer::Encode;
  std::vector<int> Encode(std::string_view text, const EncodeOptions& options) const override {
    return t_->Encode(text, options);
  }
  std::string TokenBytes(int id) const override {
    auto s = t_->NewDecodeStream(false);
    std::string bytes;
    s->Push(id, &bytes);
    s->Finish(&bytes);
    return bytes;
  }
  int bos_id() const override { return t_->bos_id(); }
  int eos_id() const override { return t_->eos_ids().empty() ? -1 : t_->eos_ids().front(); }
  std::vector<int> eos_ids() const override { return t_->eos_ids(); }
  bool IsEos(int id) const override { return eos_.contains(id); }
  bool IsSpecial(int id) const override { return t_->IsSpecial(id); }
  bool add_bos() const override {
    return t_->bos_id() >= 0 && !t_->special_prefix().empty() &&
           t_->special_prefix().front() == t_->bos_id();
  }
  int vocab_size() const override { return t_->vocab_size(); }
  std::unique_ptr<TokenDecodeStream> NewDecodeStream(bool skip_special_tokens) const override {
    return std::make_unique<HfStream>(t_->NewDecodeStream(skip_special_tokens));
  }
  GenerationDefaults generation_defaults() const override { return t_->generation_defaults(); }
  std::string chat_template() const override { return t_->chat_template(); }

 private:
  std::unique_ptr<tokenizer::HfTokenizer> t_;
  absl::flat_hash_set<int> eos_;
};

}  // namespace

std::unique_ptr<TokenDecodeStream> Tokenizer::NewDecodeStream(bool skip_special_tokens) const {
  return std::make_unique<BytesStream>(this, skip_special_tokens);
}

std::string Tokenizer::Decode(const std::vector<int>& ids, bool skip_special_tokens) const {
  StreamDecoder d(this, skip_special_tokens);
  std::string text;
  for (int id : ids) text += d.Push(id);
  return text + d.Flush();
}

std::vector<int> ByteTokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int> ids;
  ids.reserve(text.size() + 1);
  if (options.add_special_tokens) ids.push_back(kBos);
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

std::string ByteTokenizer::TokenBytes(int id) const {
  if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
  return {};
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadCheckpointTokenizer(const std::string& dir,
                                                                   int vocab_size) {
  const std::filesystem::path path(dir);
  const std::string config = (path / "config.json").string();
  if (std::filesystem::exists(path / "tokenizer.json")) {
    auto t = tokenizer::HfTokenizer::Load(dir);
    if (!t.ok()) return t.status();
    if ((*t)->vocab_size() > vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat((path / "tokenizer.json").string(), " has token ids up to ",
                       (*t)->vocab_size() - 1, " but ", config, " says vocab_size ", vocab_size,
                       ": the tokenizer does not belong to this model"));
    }
    return std::make_unique<HfCheckpointTokenizer>(std::move(*t));
  }
  if (std::filesystem::exists(path / "tokenizer.model")) {
    return absl::UnimplementedError(absl::StrCat(
        (path / "tokenizer.model").string(),
        ": SentencePiece tokenizer.model files are not supported; give the checkpoint its "
        "Hugging Face tokenizer.json (transformers' save_pretrained writes one)"));
  }
  if (vocab_size < ByteTokenizer::kMinVocab) {
    return absl::InvalidArgumentError(absl::StrCat(config, ": vocab_size ", vocab_size, " < ",
                                                   ByteTokenizer::kMinVocab,
                                                   " needed by the byte tokenizer"));
  }
  return std::make_unique<ByteTokenizer>();
}

std::string StreamDecoder::Push(int id) {
  std::string bytes;
  stream_->Push(id, &bytes);
  return utf8_.Push(bytes);
}

std::string StreamDecoder::Flush() {
  std::string bytes;
  stream_->Finish(&bytes);
  std::string out = utf8_.Push(bytes);
  return out + utf8_.Finish();
}

}  // namespace ballast::engine
