#include "engine/tokenizer/bpe.h"

#include <algorithm>
#include <cstdio>

#include "absl/base/thread_annotations.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/tokenizer/utf8.h"

namespace ballast::tokenizer {
namespace {

constexpr size_t kCacheMaxWordBytes = 256;  // tokenizers' MAX_LENGTH
constexpr size_t kCacheShards = 16;
constexpr size_t kCacheEntriesPerShard = 10000 / kCacheShards;

uint64_t PairKey(int a, int b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// An entry of the merge queue: merge the symbol at `pos` with its next one.
struct QueuedMerge {
  uint32_t rank;
  uint32_t pos;
  uint32_t new_id;
};

// Min-heap order: lowest rank first, then leftmost.
bool Later(const QueuedMerge& a, const QueuedMerge& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

}  // namespace

// Words already tokenized; a full shard is cleared (results never change).
struct Bpe::Cache {
  struct Shard {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<int>> map ABSL_GUARDED_BY(mu);
  };
  Shard shards[kCacheShards];

  Shard& For(std::string_view word) { return shards[absl::HashOf(word) % kCacheShards]; }
};

Bpe::Bpe() : cache_(std::make_unique<Cache>()) {
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
}
Bpe::~Bpe() = default;

absl::StatusOr<std::unique_ptr<Bpe>> Bpe::FromJson(const JsonField& model) {
  std::unique_ptr<Bpe> bpe(new Bpe());
  if (model["dropout"].value().is_number() && model["dropout"].value().get<double>() != 0.0) {
    return absl::UnimplementedError(
        absl::StrCat(model.origin(), ": ", model.path(), ".dropout: BPE dropout is not supported"));
  }
  auto unk = model.OptionalString("unk_token");
  auto prefix = model.OptionalString("continuing_subword_prefix");
  auto suffix = model.OptionalString("end_of_word_suffix");
  auto fuse = model.Bool("fuse_unk", false);
  auto fallback = model.Bool("byte_fallback", false);
  auto ignore = model.Bool("ignore_merges", false);
  for (const absl::Status& st : {unk.status(), prefix.status(), suffix.status(), fuse.status(),
                                 fallback.status(), ignore.status()}) {
    if (!st.ok()) return st;
  }
  bpe->unk_token_ = *unk;
  bpe->prefix_ = *prefix;
  bpe->suffix_ = *suffix;
  bpe->fuse_unk_ = *fuse;
  bpe->byte_fallback_ = *fallback;
  bpe->ignore_merges_ = *ignore;
  if (auto st = bpe->LoadVocab(model["vocab"]); !st.ok()) return st;
  if (auto st = bpe->LoadMerges(model["merges"]); !st.ok()) return st;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    if (auto id = bpe->TokenToId(name)) bpe->byte_ids_[b] = *id;
  }
  return bpe;
}

absl::Status Bpe::LoadVocab(const JsonField& vocab) {
  if (auto st = vocab.ExpectObject(); !st.ok()) return st;
  vocab_.reserve(vocab.value().size());
  int max_id = -1;
  // Ids index a table as long as the largest: real vocabularies number
  // their tokens densely (from 0, a few gaps at most), so an id far past
  // the entry count is refused rather than sizing gigabytes (a fuzzed file
  // asked for 2 GB).
  const int64_t id_limit = 4 * static_cast<int64_t>(vocab.value().size()) + 65536;
  for (const auto& [token, id] : vocab.value().items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      return vocab[token].Error("expected a non-negative integer id");
    }
    if (id.get<int64_t>() > id_limit) {
      return vocab[token].Error(absl::StrCat("id ", id.get<int64_t>(), " is far past the ",
                                             vocab.value().size(),
                                             " entries (ids must number the tokens densely)"));
    }
    const int i = id.get<int>();
    vocab_[token] = i;
    max_id = std::max(max_id, i);
  }
  vocab_r_.assign(max_id + 1, std::string());
  has_id_.assign(max_id + 1, false);
  for (const auto& [token, id] : vocab_) {
    vocab_r_[id] = token;
    has_id_[id] = true;
  }
  return absl::OkStatus();
}

absl::Status Bpe::LoadMerges(const JsonField& merges) {
  if (merges.is_null()) return absl::OkStatus();
  if (auto st = merges.ExpectArray(); !st.ok()) return st;
  const size_t prefix_len = prefix_ ? prefix_->size() : 0;
  merges_.reserve(merges.value().size());
  std::string a, b;
  for (size_t i = 0; i < merges.value().size(); ++i) {
    const nlohmann::json& m = merges.value()[i];
    if (m.is_string()) {  // legacy "a b": exactly one space
      const std::string& line = m.get_ref<const std::string&>();
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) {
        return merges.at(i).Error("expected \"a b\" (two tokens separated by one space)");
      }
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return merges.at(i).Error("expected \"a b\" or [\"a\", \"b\"]");
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b);
    if (ia == vocab_.end() || ib == vocab_.end() || b.size() < prefix_len) {
      return merges.at(i).Error(
          absl::StrCat("token \"", ia == vocab_.end() ? a : b, "\" is not in model.vocab"));
    }
    const std::string merged = a + b.substr(prefix_len);
    const auto in = vocab_.find(merged);
    if (in == vocab_.end()) {
      return merges.at(i).Error(
          absl::StrCat("merged token \"", merged, "\" is not in model.vocab"));
    }
    // A repeated pair keeps its last rank, as in tokenizers (a map built in order).
    merges_[PairKey(ia->second, ib->second)] = {static_cast<uint32_t>(i),
                                                static_cast<uint32_t>(in->second)};
  }
  return absl::OkStatus();
}

std::optional<int> Bpe::TokenToId(std::string_view token) const {
  auto it = vocab_.find(Sv(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::IdToToken(int id) const {
  if (id < 0 || id >= static_cast<int>(vocab_r_.size()) || !has_id_[id]) return nullptr;
  return &vocab_r_[id];
}

const Bpe::Merge* Bpe::FindMerge(int a, int b) const {
  auto it = merges_.find(PairKey(a, b));
  return it == merges_.end() ? nullptr : &it->second;
}

void Bpe::Tokenize(std::string_view word, std::vector<int>* ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(Sv(word)); it != vocab_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (word.size() >= kCacheMaxWordBytes) {
    MergeWord(word, ids);
    return;
  }
  Cache::Shard& shard = cache_->For(word);
  {
    absl::MutexLock lock(&shard.mu);
    if (auto it = shard.map.find(Sv(word)); it != shard.map.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int> out;
  MergeWord(word, &out);
  ids->insert(ids->end(), out.begin(), out.end());
  absl::MutexLock lock(&shard.mu);
  if (shard.map.size() >= kCacheEntriesPerShard) shard.map.clear();
  shard.map.emplace(std::string(word), std::move(out));
}

void Bpe::MergeWord(std::string_view w, std::vector<int>* ids) const {
  thread_local std::vector<int> symbols;
  thread_local std::string key;
  symbols.clear();
  const std::optional<int> unk_opt = unk_token_ ? TokenToId(*unk_token_) : std::nullopt;
  // A plain int beside the flag: GCC 12 at -O3 warns (maybe-uninitialized)
  // on *optional here although every use is guarded.
  const bool has_unk = unk_opt.has_value();
  const int unk = unk_opt.value_or(-1);
  bool unk_pending = false;
  for (size_t i = 0; i < w.size();) {
    const size_t len = std::max(1, Utf8SequenceLength(static_cast<unsigned char>(w[i])));
    std::string_view s = w.substr(i, len);
    if ((prefix_ && i > 0) || (suffix_ && i + len >= w.size())) {
      key.clear();
      if (prefix_ && i > 0) key += *prefix_;
      key += s;
      if (suffix_ && i + len >= w.size()) key += *suffix_;
      s = key;
    }
    i += len;
    if (auto it = vocab_.find(Sv(s)); it != vocab_.end()) {
      if (unk_pending) symbols.push_back(unk);
      unk_pending = false;
      symbols.push_back(it->second);
      continue;
    }
    if (byte_fallback_ && std::all_of(s.begin(), s.end(), [&](char c) {
          return byte_ids_[static_cast<unsigned char>(c)] >= 0;
        })) {
      for (char c : s) symbols.push_back(byte_ids_[static_cast<unsigned char>(c)]);
      continue;  // a pending unk stays pending, as in tokenizers
    }
    if (!has_unk) continue;  // no unk token: the character is dropped
    if (unk_pending && !fuse_unk_) symbols.push_back(unk);
    unk_pending = true;
  }
  if (unk_pending) symbols.push_back(unk);
  ApplyMerges(&symbols);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
}

void Bpe::ApplyMerges(std::vector<int>* symbols) const {
  const int n = static_cast<int>(symbols->size());
  if (n < 2 || merges_.empty()) return;
  thread_local std::vector<int> prev, next;
  thread_local std::vector<QueuedMerge> heap;
  std::vector<int>& sym = *symbols;
  prev.resize(n);
  next.resize(n);
  heap.clear();
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
    if (i + 1 < n) {
      if (const Merge* m = FindMerge(sym[i], sym[i + 1])) {
        heap.push_back({m->rank, static_cast<uint32_t>(i), m->new_id});
      }
    }
  }
  std::make_heap(heap.begin(), heap.end(), Later);
  constexpr int kRemoved = -2;
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), Later);
    const QueuedMerge top = heap.back();
    heap.pop_back();
    const int pos = static_cast<int>(top.pos);
    if (sym[pos] == kRemoved || next[pos] == -1) continue;
    const int right = next[pos];
    const Merge* m = FindMerge(sym[pos], sym[right]);
    if (m == nullptr || m->new_id != top.new_id) continue;  // expired entry
    sym[pos] = static_cast<int>(top.new_id);
    sym[right] = kRemoved;
    next[pos] = next[right];
    if (next[right] != -1) prev[next[right]] = pos;
    if (prev[pos] >= 0) {
      if (const Merge* pm = FindMerge(sym[prev[pos]], sym[pos])) {
        heap.push_back({pm->rank, static_cast<uint32_t>(prev[pos]), pm->new_id});
        std::push_heap(heap.begin(), heap.end(), Later);
      }
    }
    if (next[pos] != -1) {
      if (const Merge* nm = FindMerge(sym[pos], sym[next[pos]])) {
        heap.push_back({nm->rank, top.pos, nm->new_id});
        std::push_heap(heap.begin(), heap.end(), Later);
      }
    }
  }
  sym.erase(std::remove(sym.begin(), sym.end(), kRemoved), sym.end());
}

}  // namespace ballast::tokenizer
