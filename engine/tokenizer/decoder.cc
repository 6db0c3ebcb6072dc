#include "engine/tokenizer/decoder.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/tokenizer/pre_tokenizer.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/utf8.h"

namespace ballast::tokenizer {
namespace {

// Tokens joined by single spaces (no decoder in tokenizer.json).
class JoinWithSpaces final : public DecoderStage {
 public:
  void Push(Chunk c, std::vector<Chunk>* out) override {
    if (c.index != last_ && last_ >= 0)
      c.text.insert(c.text.begin(), ' ');  // not insert(0, " "): GCC 12 -Wrestrict
    last_ = c.index;
    c.index = 0;
    out->push_back(std::move(c));
  }

 private:
  int last_ = -1;
};

class Replace final : public DecoderStage {
 public:
  Replace(std::string literal, std::shared_ptr<const Regex> regex, std::string content)
      : literal_(std::move(literal)), regex_(std::move(regex)), content_(std::move(content)) {}
  void Push(Chunk c, std::vector<Chunk>* out) override {
    if (!regex_) {
      if (!literal_.empty()) c.text = absl::StrReplaceAll(c.text, {{literal_, content_}});
    } else {
      std::string r;
      size_t last = 0;
      regex_->ForEachMatch(c.text, [&](size_t start, size_t end) {
        r.append(c.text, last, start - last);
        r += content_;
        last = end;
      });
      r.append(c.text, last, std::string::npos);
      c.text = std::move(r);
    }
    out->push_back(std::move(c));
  }

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;
  std::string content_;
};

// Byte-level characters back to bytes; the output is one token (index 0).
class ByteLevel final : public DecoderStage {
 public:
  void Push(Chunk c, std::vector<Chunk>* out) override {
    std::string bytes;
    bytes.reserve(c.text.size());
    size_t pos = 0;
    bool mapped = true;
    while (pos < c.text.size()) {
      const int b = ByteLevelByte(NextCodePoint(c.text, &pos));
      if (b < 0) {
        mapped = false;  // a character outside the byte alphabet: keep the raw text
        break;
      }
      bytes.push_back(static_cast<char>(b));
    }
    out->push_back({mapped ? std::move(bytes) : std::move(c.text), 0});
  }
};

class Metaspace final : public DecoderStage {
 public:
  Metaspace(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void Push(Chunk c, std::vector<Chunk>* out) override {
    c.text = absl::StrReplaceAll(c.text, {{replacement_, c.index == 0 && strip_first_ ? "" : " "}});
    out->push_back(std::move(c));
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class Fuse final : public DecoderStage {
 public:
  void Push(Chunk c, std::vector<Chunk>* out) override {
    c.index = 0;
    out->push_back(std::move(c));
  }
};

// <0xNN> tokens to bytes; see the file comment for runs.
class ByteFallback final : public DecoderStage {
 public:
  void Push(Chunk c, std::vector<Chunk>* out) override {
    const int byte = ByteOf(c.text);
    if (byte >= 0) {
      run_.push_back(static_cast<char>(byte));
      if (invalid_) {
        Emit(std::string(kReplacementChar), out);
      } else if (!IsValidUtf8Prefix(run_)) {
        invalid_ = true;  // the whole run becomes U+FFFD, byte by byte
        for (size_t i = 0; i < run_.size(); ++i) Emit(std::string(kReplacementChar), out);
      }
      return;
    }
    EndRun(out);
    if (c.index != last_in_) {
      Emit(std::move(c.text), out);
    } else {
      out->push_back({std::move(c.text), next_ - 1});  // more of the same token
    }
    last_in_ = c.index;
  }
  void Finish(std::vector<Chunk>* out) override { EndRun(out); }

 private:
  static int ByteOf(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    auto hex = [](char ch) {
      if (ch >= '0' && ch <= '9') return ch - '0';
      if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
      if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
      return -1;
    };
    const int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
  void Emit(std::string text, std::vector<Chunk>* out) {
    out->push_back({std::move(text), next_++});
  }
  void EndRun(std::vector<Chunk>* out) {
    if (!run_.empty() && !invalid_) {
      if (IsValidUtf8(run_)) {
        Emit(run_, out);
      } else {
        for (size_t i = 0; i < run_.size(); ++i) Emit(std::string(kReplacementChar), out);
      }
    }
    if (!run_.empty()) last_in_ = -1;
    run_.clear();
    invalid_ = false;
  }

  std::string run_;
  bool invalid_ = false;
  int next_ = 0;
  int last_in_ = -1;
};

// Strips up to `start` leading and `stop` trailing `content` characters of
// every token.
class Strip final : public DecoderStage {
 public:
  Strip(std::string content, int start, int stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void Push(Chunk c, std::vector<Chunk>* out) override {
    if (c.index != index_) {
      EndToken(out);
      index_ = c.index;
      start_left_ = start_;
    }
    size_t cut = 0;
    while (start_left_ > 0 && c.text.compare(cut, content_.size(), content_) == 0) {
      cut += content_.size();
      --start_left_;
    }
    if (cut < c.text.size()) start_left_ = 0;
    std::string text = c.text.substr(cut);
    if (stop_ > 0) {
      text = held_ + text;
      size_t end = text.size();
      while (end >= content_.size() &&
             text.compare(end - content_.size(), content_.size(), content_) == 0) {
        end -= content_.size();
      }
      held_ = text.substr(end);
      text.resize(end);
    }
    if (!text.empty()) out->push_back({std::move(text), index_});
  }
  void Finish(std::vector<Chunk>* out) override { EndToken(out); }

 private:
  void EndToken(std::vector<Chunk>* out) {
    const size_t n = held_.size() / content_.size();
    const size_t keep = n > static_cast<size_t>(stop_) ? n - stop_ : 0;
    if (keep > 0) out->push_back({held_.substr(0, keep * content_.size()), index_});
    held_.clear();
  }
  std::string content_;
  int start_, stop_;
  int index_ = -1;
  int start_left_ = 0;
  std::string held_;
};

absl::StatusOr<std::pair<std::string, std::shared_ptr<const Regex>>> ReplacePattern(
    const JsonField& pattern) {
  if (pattern.Has("String")) {
    auto lit = pattern.String("String");
    if (!lit.ok()) return lit.status();
    return std::make_pair(*lit, std::shared_ptr<const Regex>());
  }
  auto re = pattern.String("Regex");
  if (!re.ok()) return pattern.Error("expected {\"String\": ...} or {\"Regex\": ...}");
  auto compiled = Regex::Compile(*re);
  if (!compiled.ok()) return pattern["Regex"].Error(compiled.status().message());
  return std::make_pair(std::string(), std::shared_ptr<const Regex>(std::move(*compiled)));
}

absl::StatusOr<std::function<std::unique_ptr<DecoderStage>()>> MetaspaceFactory(
    const JsonField& j) {
  auto replacement = j.Char("replacement");
  if (!replacement.ok()) return replacement.status();
  std::string r;
  AppendUtf8(*replacement, &r);
  bool strip_first = true;  // prepend_scheme always/first, or legacy add_prefix_space
  if (j.Has("prepend_scheme")) {
    auto scheme = j.String("prepend_scheme");
    if (!scheme.ok()) return scheme.status();
    strip_first = *scheme != "never";
  } else {
    auto legacy = j.Bool("add_prefix_space", true);
    if (!legacy.ok()) return legacy.status();
    strip_first = *legacy;
  }
  return [r, strip_first]() -> std::unique_ptr<DecoderStage> {
    return std::make_unique<Metaspace>(r, strip_first);
  };
}

absl::StatusOr<std::function<std::unique_ptr<DecoderStage>()>> StripFactory(const JsonField& j) {
  auto content = j.Char("content");
  auto start = j.Int("start", 0);
  auto stop = j.Int("stop", 0);
  for (const absl::Status& st : {content.status(), start.status(), stop.status()}) {
    if (!st.ok()) return st;
  }
  std::string c;
  AppendUtf8(*content, &c);
  const int a = static_cast<int>(*start), b = static_cast<int>(*stop);
  return [c, a, b]() -> std::unique_ptr<DecoderStage> { return std::make_unique<Strip>(c, a, b); };
}

}  // namespace

void DecoderState::Push(std::string_view token, std::string* out) {
  std::vector<Chunk> chunks;
  chunks.push_back({std::string(token), next_index_++});
  for (auto& stage : stages_) {
    std::vector<Chunk> next;
    for (auto& c : chunks) stage->Push(std::move(c), &next);
    chunks = std::move(next);
  }
  for (const Chunk& c : chunks) out->append(c.text);
}

void DecoderState::Finish(std::string* out) {
  std::vector<Chunk> chunks;
  for (auto& stage : stages_) {
    std::vector<Chunk> next;
    for (auto& c : chunks) stage->Push(std::move(c), &next);
    stage->Finish(&next);
    chunks = std::move(next);
  }
  for (const Chunk& c : chunks) out->append(c.text);
}

absl::Status Decoder::Add(const JsonField& j, std::vector<StageFactory>* out) {
  if (auto st = j.ExpectObject(); !st.ok()) return st;
  auto type = j.String("type");
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    const JsonField list = j["decoders"];
    if (auto st = list.ExpectArray(); !st.ok()) return st;
    for (size_t i = 0; i < list.value().size(); ++i) {
      if (auto st = Add(list.at(i), out); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  if (*type == "ByteLevel") {
    out->push_back([] { return std::make_unique<ByteLevel>(); });
  } else if (*type == "Fuse") {
    out->push_back([] { return std::make_unique<Fuse>(); });
  } else if (*type == "ByteFallback") {
    out->push_back([] { return std::make_unique<ByteFallback>(); });
  } else if (*type == "Replace") {
    auto pattern = ReplacePattern(j["pattern"]);
    if (!pattern.ok()) return pattern.status();
    auto content = j.String("content");
    if (!content.ok()) return content.status();
    out->push_back(
        [p = *pattern, c = *content] { return std::make_unique<Replace>(p.first, p.second, c); });
  } else if (*type == "Metaspace") {
    auto factory = MetaspaceFactory(j);
    if (!factory.ok()) return factory.status();
    out->push_back(std::move(*factory));
  } else if (*type == "Strip") {
    auto factory = StripFactory(j);
    if (!factory.ok()) return factory.status();
    out->push_back(std::move(*factory));
  } else {
    return absl::UnimplementedError(absl::StrCat(j.origin(), ": ", j.path(), ".type: decoder \"",
                                                 *type, "\" is not supported"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::FromJson(const JsonField& j) {
  auto d = std::make_unique<Decoder>();
  if (j.is_null()) {
    d->factories_.push_back([] { return std::make_unique<JoinWithSpaces>(); });
    return d;
  }
  if (auto st = Add(j, &d->factories_); !st.ok()) return st;
  return d;
}

std::unique_ptr<DecoderState> Decoder::NewState() const {
  std::vector<std::unique_ptr<DecoderStage>> stages;
  stages.reserve(factories_.size());
  for (const auto& f : factories_) stages.push_back(f());
  return std::make_unique<DecoderState>(std::move(stages));
}

}  // namespace ballast::tokenizer
