#include "engine/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/unicode.h"
#include "engine/tokenizer/utf8.h"

namespace ballast::tokenizer {
namespace {

char32_t LastCodePoint(std::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return NextCodePoint(s, &start);
}

// Start of the whitespace run that ends s (s.size() if none).
size_t TrailingSpaceStart(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t pos = start;
    if (!IsWhitespace(NextCodePoint(s, &pos))) break;
    end = start;
  }
  return end;
}

// Length of the whitespace run that starts s.
size_t LeadingSpaceLength(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!IsWhitespace(NextCodePoint(s, &next))) break;
    pos = next;
  }
  return pos;
}

absl::StatusOr<AddedToken> ParseToken(const JsonField& j) {
  if (auto st = j.ExpectObject(); !st.ok()) return st;
  AddedToken t;
  auto content = j.String("content");
  if (!content.ok()) return content.status();
  t.content = *content;
  if (!j["id"].value().is_number_integer()) return j["id"].Error("expected an integer id");
  auto special = j.Bool("special", false);
  if (!special.ok()) return special.status();
  t.special = *special;
  // tokenizers' AddedToken defaults: normalized = !special.
  for (auto [key, field, dflt] :
       {std::tuple{"single_word", &t.single_word, false}, std::tuple{"lstrip", &t.lstrip, false},
        std::tuple{"rstrip", &t.rstrip, false},
        std::tuple{"normalized", &t.normalized, !t.special}}) {
    auto v = j.Bool(key, dflt);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  return t;
}

}  // namespace

void AddedVocabulary::Trie::Add(std::string_view pattern, int token) {
  int node = 0;
  for (unsigned char c : pattern) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | c;
    auto it = edges.find(key);
    if (it == edges.end()) it = edges.emplace(key, nodes++).first;
    node = it->second;
  }
  first_byte[static_cast<unsigned char>(pattern[0])] = true;
  terminal[node] = token;
}

int AddedVocabulary::Trie::LongestAt(std::string_view s, size_t i, size_t* end) const {
  if (!first_byte[static_cast<unsigned char>(s[i])]) return -1;
  int node = 0, found = -1;
  for (size_t k = i; k < s.size(); ++k) {
    auto it = edges.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(s[k]));
    if (it == edges.end()) break;
    node = it->second;
    if (auto t = terminal.find(node); t != terminal.end()) {
      found = t->second;
      *end = k + 1;
    }
  }
  return found;
}

absl::StatusOr<AddedVocabulary> AddedVocabulary::FromJson(const JsonField& added_tokens,
                                                          const Bpe& model,
                                                          const Normalizer* normalizer) {
  AddedVocabulary v;
  if (added_tokens.is_null()) return v;
  if (auto st = added_tokens.ExpectArray(); !st.ok()) return st;
  int next_id = model.vocab_entries();  // tokenizers: new ids start at the vocabulary's size
  for (size_t i = 0; i < added_tokens.value().size(); ++i) {
    auto t = ParseToken(added_tokens.at(i));
    if (!t.ok()) return t.status();
    if (t->content.empty()) continue;
    if (auto it = v.by_content_.find(t->content); it != v.by_content_.end()) {
      t->id = v.tokens_[it->second].id;
    } else if (auto id = model.TokenToId(t->content)) {
      t->id = *id;
    } else {
      t->id = next_id++;
    }
    t->form = t->content;
    if (t->normalized && normalizer != nullptr) normalizer->Normalize(&t->form);
    if (t->special) v.special_.insert(t->content);
    v.by_content_[t->content] = static_cast<int>(v.tokens_.size());
    v.by_id_[t->id] = static_cast<int>(v.tokens_.size());
    v.max_id_ = std::max(v.max_id_, t->id);
    v.tokens_.push_back(std::move(*t));
  }
  for (const auto& [id, index] : v.by_id_) {
    const AddedToken& t = v.tokens_[index];
    if (t.form.empty()) continue;
    (t.normalized ? v.normalized_ : v.raw_).Add(t.form, index);
  }
  return v;
}

const AddedToken* AddedVocabulary::Find(int id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int> AddedVocabulary::IdOf(std::string_view content) const {
  auto it = by_content_.find(Sv(content));
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

void AddedVocabulary::Split(std::string_view s, bool normalized_pass, bool parse_special,
                            std::vector<Segment>* out) const {
  const Trie& trie = normalized_pass ? normalized_ : raw_;
  size_t start_offset = 0;
  for (size_t i = 0; i < s.size();) {
    size_t stop = 0;
    const int index = trie.LongestAt(s, i, &stop);
    if (index < 0) {
      ++i;
      continue;
    }
    size_t start = i;
    i = stop;  // the next search starts after this match, used or not
    const AddedToken& t = tokens_[index];
    if (!parse_special && t.special) continue;
    if (t.single_word) {
      const bool word_before = start > 0 && IsWordChar(LastCodePoint(s.substr(0, start)));
      size_t after = stop;
      const bool word_after = stop < s.size() && IsWordChar(NextCodePoint(s, &after));
      if (word_before || word_after) continue;
    }
    if (t.lstrip) start = std::max(TrailingSpaceStart(s.substr(0, start)), start_offset);
    if (t.rstrip) stop += LeadingSpaceLength(s.substr(stop));
    if (start_offset < start) out->push_back({-1, start_offset, start});
    out->push_back({t.id, start, stop});
    start_offset = stop;
  }
  if (start_offset < s.size()) out->push_back({-1, start_offset, s.size()});
}

}  // namespace ballast::tokenizer
