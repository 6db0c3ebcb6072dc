// StateStore on etcd (state_store.h's OpenEtcdStateStore). Keys under the
// prefix P (ids and names escaped: '%' and '/' as %25 and %2F):
//   P/models/<name>            JSON: a registration, or {"registered": false}
//   P/session-meta/<id>        JSON: model, tenant, chat, node, lost,
//                              last use, and the next turn's index
//   P/session-turns/<id>/<n>   turn n (12 digits): 4-byte LE token-bytes
//                              length, the tokens, then the messages
// A session's history is its turns in [first_turn, next_turn) (the meta
// says which). A turn is one key, so appending costs the turn, not the
// history. Writing a session whole (or rewriting it) writes the history
// in pieces of at most kPieceBytes from index next_turn on (all but the
// first in transactions of their own, outside [first, next) until the
// last one commits), then, in one transaction, deletes the turns below
// and writes the first piece and the meta that makes them the history:
// a history past etcd's 1.5 MiB request limit is stored, and a rewrite
// cut short leaves the old one. (etcd refuses a put inside a range the
// same transaction deletes, hence the order.) A turn past kPieceBytes is
// appended the same way, less the delete. Every write transaction
// compares the fence key's value with this scheduler's id, so a deposed
// leader's writes fail FAILED_PRECONDITION. A write whose outcome is
// unknown (a timeout) is read back: if the session's meta holds what was
// written, it committed (else a retry would append the turn twice).
// Session metas this store read or wrote
// are kept in memory with their revision, so a turn is one round trip (a
// transaction that also checks the meta is still at that revision; a
// refused one drops the entry, and the next call reads etcd again).
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "global_scheduler/etcd_client.h"
#include "global_scheduler/state_codec.h"
#include "global_scheduler/state_store.h"
#include "nlohmann/json.hpp"

namespace ballast::global_scheduler {
namespace {

using etcdserverpb::TxnRequest;
using Json = nlohmann::json;

std::string Escape(const std::string& s) {
  return absl::StrReplaceAll(s, {{"%", "%25"}, {"/", "%2F"}});
}
std::string Unescape(const std::string& s) {
  return absl::StrReplaceAll(s, {{"%2F", "/"}, {"%25", "%"}});
}
std::string TurnIndex(int64_t n) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%012lld", static_cast<long long>(n));
  return buf;
}

// A session's meta record.
struct Meta {
  StoredSession s;                        // without tokens and messages
  int64_t first_turn = 0, next_turn = 0;  // the history is turns [first, next)
  int64_t mod_revision = 0;               // of the key as read (0: absent)
};

std::string MetaJson(const StoredSession& s, int64_t first_turn, int64_t next_turn) {
  Json j = {{"model", s.model},
            {"tenant", s.tenant},
            {"chat", s.chat},
            {"node", s.node_id},
            {"lost", !s.lost                           ? ""
                     : *s.lost == LostReason::kExpired ? "expired"
                                                       : "forgotten"},
            {"last_used_us", absl::ToUnixMicros(s.last_used)},
            {"first_turn", first_turn},
            {"next_turn", next_turn}};
  return j.dump();
}
std::string MetaJson(const Meta& m) { return MetaJson(m.s, m.first_turn, m.next_turn); }

std::string TurnValue(const std::vector<int>& tokens, const std::vector<v1::ChatMessage>& msgs) {
  const std::string t = EncodeTokens(tokens);
  std::string out(4, '\0');
  for (int b = 0; b < 4; ++b) out[b] = static_cast<char>((t.size() >> (8 * b)) & 0xff);
  return out + t + EncodeMessages(msgs);
}

// A history's or a turn's pieces: the tokens in slices, then the messages in groups,
// each piece at most about kPieceBytes (etcd refuses requests over 1.5 MiB).
constexpr size_t kPieceBytes = 512 << 10;
std::vector<std::string> Pieces(const std::vector<int>& tokens,
                                const std::vector<v1::ChatMessage>& msgs) {
  std::vector<std::string> out;
  constexpr size_t kTokens = kPieceBytes / 4;
  for (size_t i = 0; i < tokens.size(); i += kTokens) {
    const auto end =
        tokens.begin() + static_cast<std::ptrdiff_t>(std::min(tokens.size(), i + kTokens));
    out.push_back(TurnValue({tokens.begin() + static_cast<std::ptrdiff_t>(i), end}, {}));
  }
  std::vector<v1::ChatMessage> group;
  size_t bytes = 0;
  for (const auto& m : msgs) {
    if (!group.empty() && bytes + m.ByteSizeLong() > kPieceBytes) {
      out.push_back(TurnValue({}, group));
      group.clear();
      bytes = 0;
    }
    group.push_back(m);
    bytes += m.ByteSizeLong();
  }
  if (!group.empty() || out.empty()) out.push_back(TurnValue({}, group));
  return out;
}

class EtcdStateStore final : public StateStore {
 public:
  EtcdStateStore(std::shared_ptr<EtcdClient> client, EtcdStateOptions o)
      : client_(std::move(client)), o_(std::move(o)) {}

  absl::StatusOr<StoredCatalogue> LoadCatalogue() override {
    auto kvs = client_->Range(o_.prefix + "/models/", true);
    if (!kvs.ok()) return kvs.status();
    StoredCatalogue out;
    for (const auto& kv : *kvs) {
      const std::string name = Unescape(kv.key().substr(o_.prefix.size() + 8));
      Json j = Json::parse(kv.value(), nullptr, false);
      if (j.is_discarded() || !j.is_object()) return Damaged(kv.key(), "not a JSON object");
      if (!j.value("registered", false)) {
        out.unregistered.push_back(name);
        continue;
      }
      ModelSpec m;
      m.name = name;
      m.path = j.value("path", "");
      m.kv_dtype = j.value("kv_dtype", "auto");
      m.quantization = j.value("quantization", "none");
      m.ttft_ms = j.value("ttft_ms", 0u);
      m.tpot_ms = j.value("tpot_ms", 0u);
      m.replicas = j.value("replicas", 1);
      m.kv_floor_bytes = j.value("kv_floor_bytes", int64_t{0});
      m.kv_limit_bytes = j.value("kv_limit_bytes", int64_t{0});
      out.registered.push_back(std::move(m));
    }
    return out;
  }

  absl::StatusOr<std::vector<StoredSession>> LoadSessions() override {
    absl::MutexLock lock(&mu_);
    auto metas = client_->Range(o_.prefix + "/session-meta/", true);
    if (!metas.ok()) return metas.status();
    // Every turn in one paged read, in key order: by session, then index.
    auto turns = client_->Range(o_.prefix + "/session-turns/", true);
    if (!turns.ok()) return turns.status();
    absl::flat_hash_map<std::string, std::vector<const mvccpb::KeyValue*>> by_id;
    const size_t base = o_.prefix.size() + 15;  // "/session-turns/"
    for (const auto& t : *turns) {
      const size_t slash = t.key().rfind('/');
      if (slash == std::string::npos || slash < base) return Damaged(t.key(), "not a turn key");
      by_id[t.key().substr(base, slash - base)].push_back(&t);
    }
    std::vector<StoredSession> out;
    for (const auto& kv : *metas) {
      auto m = ParseMeta(kv);
      if (!m.ok()) return m.status();
      metas_[m->s.id] = *m;
      for (const mvccpb::KeyValue* t : by_id[Escape(m->s.id)]) {
        const int64_t index = std::strtoll(t->key().c_str() + t->key().rfind('/') + 1, nullptr, 10);
        if (index < m->first_turn || index >= m->next_turn)
          continue;  // not (or no longer) its history
        if (auto st = DecodeTurn(t->key(), m->s.id, t->value(), &m->s); !st.ok()) return st;
      }
      out.push_back(std::move(m->s));
    }
    return out;
  }

  absl::Status PutRegistered(const ModelSpec& s) override {
    Json j = {{"registered", true},
              {"path", s.path},
              {"kv_dtype", s.kv_dtype},
              {"quantization", s.quantization},
              {"ttft_ms", s.ttft_ms},
              {"tpot_ms", s.tpot_ms},
              {"replicas", s.replicas},
              {"kv_floor_bytes", s.kv_floor_bytes},
              {"kv_limit_bytes", s.kv_limit_bytes}};
    absl::MutexLock lock(&mu_);  // writes are serialized (state_store.h)
    TxnRequest txn = Fenced();
    Put(&txn, ModelKey(s.name), j.dump());
    return Commit(txn, absl::StrCat("record model ", s.name));
  }

  absl::Status PutUnregistered(const std::string& name) override {
    absl::MutexLock lock(&mu_);
    TxnRequest txn = Fenced();
    Put(&txn, ModelKey(name), Json{{"registered", false}}.dump());
    return Commit(txn, absl::StrCat("record the unregistration of model ", name));
  }

  absl::Status PutSession(const StoredSession& s) override {
    absl::MutexLock lock(&mu_);
    auto m = ReadMeta(s.id);
    if (!m.ok()) return m.status();
    return Rewrite(s, s.tokens, s.messages, m->value_or(Meta{}),
                   absl::StrCat("record session ", s.id));
  }

  absl::Status AppendTurn(const SessionTurnRecord& t) override {
    absl::MutexLock lock(&mu_);
    auto m = ReadMeta(t.id);
    if (!m.ok()) return m.status();
    if (!m->has_value()) {
      return absl::NotFoundError(
          absl::StrCat("state store ", Describe(), ": session ", t.id, " is not stored"));
    }
    Meta meta = **m;
    meta.s.node_id = t.node_id;
    meta.s.last_used = t.last_used;
    meta.s.lost.reset();  // a turn clears it
    const std::string what = absl::StrCat("record a turn of session ", t.id);
    if (t.rewrite) return Rewrite(meta.s, t.tokens, t.messages, meta, what);
    // One key, unless the turn is past a piece: then its pieces from
    // next_turn + 1 on first (outside the history), and the first with the
    // meta that takes them all in.
    const std::vector<std::string> pieces = Pieces(t.tokens, t.messages);
    if (auto st = WriteOutside(t.id, meta.next_turn, pieces, what); !st.ok()) return st;
    TxnRequest txn = Fenced();
    Unchanged(&txn, meta);
    Put(&txn, TurnsPrefix(t.id) + TurnIndex(meta.next_turn), pieces[0]);
    meta.next_turn += static_cast<int64_t>(pieces.size());
    return CommitMeta(&txn, meta, what);
  }

  absl::Status SetAffinity(const std::string& id, const std::string& node_id) override {
    absl::MutexLock lock(&mu_);
    auto m = ReadMeta(id);
    if (!m.ok()) return m.status();
    if (!m->has_value()) return absl::OkStatus();
    Meta meta = **m;
    meta.s.node_id = node_id;
    TxnRequest txn = Fenced();
    Unchanged(&txn, meta);
    return CommitMeta(&txn, meta, absl::StrCat("record the affinity of session ", id));
  }

  absl::Status ForgetNode(const std::string& node_id) override {
    absl::MutexLock lock(&mu_);
    auto metas = client_->Range(o_.prefix + "/session-meta/", true);
    if (!metas.ok()) return metas.status();
    TxnRequest txn = Fenced();
    const auto flush = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
      if (txn.success_size() == 0) return absl::OkStatus();
      absl::Status st = Commit(txn, absl::StrCat("forget node ", node_id));
      txn = Fenced();
      return st;
    };
    for (const auto& kv : *metas) {
      auto m = ParseMeta(kv);
      if (!m.ok()) return m.status();
      if (m->s.node_id != node_id) continue;
      metas_.erase(m->s.id);  // read again when next needed
      m->s.node_id.clear();
      Put(&txn, kv.key(), MetaJson(*m));
      if (txn.success_size() >= 100) {  // etcd's default limit is 128 operations
        if (auto st = flush(); !st.ok()) return st;
      }
    }
    return flush();
  }

  absl::Status EraseSession(const std::string& id) override {
    absl::MutexLock lock(&mu_);
    metas_.erase(id);
    TxnRequest txn = Fenced();
    auto* del = txn.add_success()->mutable_request_delete_range();
    del->set_key(MetaKey(id));
    auto* turns = txn.add_success()->mutable_request_delete_range();
    turns->set_key(TurnsPrefix(id));
    turns->set_range_end(EtcdClient::PrefixEnd(TurnsPrefix(id)));
    return Commit(txn, absl::StrCat("erase session ", id));
  }

  std::string Describe() const override {
    return absl::StrCat("etcd:", client_->endpoints(), o_.prefix);
  }

 private:
  std::string ModelKey(const std::string& name) const {
    return absl::StrCat(o_.prefix, "/models/", Escape(name));
  }
  std::string MetaKey(const std::string& id) const {
    return absl::StrCat(o_.prefix, "/session-meta/", Escape(id));
  }
  std::string TurnsPrefix(const std::string& id) const {
    return absl::StrCat(o_.prefix, "/session-turns/", Escape(id), "/");
  }
  absl::Status Damaged(const std::string& key, const std::string& why) const {
    return absl::DataLossError(absl::StrCat("state store ", Describe(), ": ", key, ": ", why));
  }

  // A transaction that commits only while this scheduler holds the fence.
  TxnRequest Fenced() const {
    TxnRequest txn;
    if (o_.fence_key.empty()) return txn;
    auto* c = txn.add_compare();
    c->set_key(o_.fence_key);
    c->set_target(etcdserverpb::Compare::CREATE);
    c->set_result(etcdserverpb::Compare::EQUAL);
    c->set_create_revision(o_.fence_revision);
    return txn;
  }
  // ... and only if the session's meta is as read.
  void Unchanged(TxnRequest* txn, const Meta& m) const {
    auto* c = txn->add_compare();
    c->set_key(MetaKey(m.s.id));
    c->set_target(etcdserverpb::Compare::MOD);
    c->set_result(etcdserverpb::Compare::EQUAL);
    c->set_mod_revision(m.mod_revision);
  }
  static void Put(TxnRequest* txn, const std::string& key, std::string value) {
    auto* p = txn->add_success()->mutable_request_put();
    p->set_key(key);
    p->set_value(std::move(value));
  }
  // revision: where the committed transaction's revision goes (the new
  // mod_revision of every key it wrote); may be null.
  absl::Status Commit(const TxnRequest& txn, const std::string& what,
                      int64_t* revision = nullptr) const {
    auto r = client_->Txn(txn);
    if (!r.ok()) {
      return absl::Status(r.status().code(), absl::StrCat("state store ", Describe(), ": ", what,
                                                          ": ", r.status().message()));
    }
    if (revision != nullptr) *revision = r->header().revision();
    if (r->succeeded()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("state store ", Describe(), ": ", what, ": refused: ", WhyRefused()));
  }
  // Which compare refused a transaction: the fence, or the session record.
  std::string WhyRefused() const {
    if (!o_.fence_key.empty()) {
      auto held = client_->Range(o_.fence_key, false);
      if (held.ok() && (held->empty() || (*held)[0].create_revision() != o_.fence_revision)) {
        return absl::StrCat("this scheduler (", o_.fence_id, ") no longer holds ", o_.fence_key);
      }
    }
    return "the session's record changed elsewhere (it is read again next time)";
  }

  // Adds the put of `written`'s meta to *txn, commits it, and remembers the
  // meta at the new revision (forgets it if refused). An outcome unknown
  // (the call failed, e.g. a timeout) is read back: the meta as written
  // means it committed. REQUIRES: mu_ held.
  absl::Status CommitMeta(TxnRequest* txn, Meta written, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string value = MetaJson(written);
    Put(txn, MetaKey(written.s.id), value);
    int64_t revision = 0;
    absl::Status st = Commit(*txn, what, &revision);
    metas_.erase(written.s.id);
    if (!st.ok() && !absl::IsFailedPrecondition(st)) {
      auto back = client_->Range(MetaKey(written.s.id), false);
      if (back.ok() && !back->empty() && (*back)[0].value() == value) {
        revision = (*back)[0].mod_revision();
        st = absl::OkStatus();
      }
    }
    if (st.ok()) {
      written.mod_revision = revision;
      metas_[written.s.id] = std::move(written);
    }
    return st;
  }

  // Writes pieces[1..] at turns first + 1, ... in transactions of their
  // own: outside the history until a meta that takes them in commits (a
  // write cut short leaves keys past next_turn that the next write of
  // those indices replaces). REQUIRES: mu_ held.
  absl::Status WriteOutside(const std::string& id, int64_t first,
                            const std::vector<std::string>& pieces, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t i = 1; i < pieces.size(); ++i) {
      TxnRequest txn = Fenced();
      Put(&txn, TurnsPrefix(id) + TurnIndex(first + static_cast<int64_t>(i)), pieces[i]);
      if (auto st = Commit(txn, what); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  // Writes a session whole: meta, and its history replaced by new pieces
  // (see the header). REQUIRES: mu_ held.
  absl::Status Rewrite(const StoredSession& s, const std::vector<int>& tokens,
                       const std::vector<v1::ChatMessage>& messages, const Meta& old,
                       const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::vector<std::string> pieces = Pieces(tokens, messages);
    const int64_t first = old.next_turn;
    if (auto st = WriteOutside(s.id, first, pieces, what); !st.ok()) return st;
    TxnRequest txn = Fenced();
    Meta cmp = old;
    cmp.s.id = s.id;
    Unchanged(&txn, cmp);  // mod_revision 0: the session must still be absent
    const std::string turn = TurnsPrefix(s.id) + TurnIndex(first);
    auto* del = txn.add_success()->mutable_request_delete_range();
    del->set_key(TurnsPrefix(s.id));
    del->set_range_end(turn);  // every older turn, not the ones written
    Put(&txn, turn, pieces[0]);
    Meta written;
    written.s = s;
    written.s.tokens.clear();
    written.s.messages.clear();
    written.first_turn = first;
    written.next_turn = first + static_cast<int64_t>(pieces.size());
    return CommitMeta(&txn, std::move(written), what);
  }

  // The stored meta of a session (remembered, or read), or nullopt.
  // REQUIRES: mu_ held.
  absl::StatusOr<std::optional<Meta>> ReadMeta(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (auto it = metas_.find(id); it != metas_.end()) return std::optional<Meta>(it->second);
    auto kvs = client_->Range(MetaKey(id), false);
    if (!kvs.ok()) return kvs.status();
    if (kvs->empty()) return std::optional<Meta>();
    auto m = ParseMeta((*kvs)[0]);
    if (!m.ok()) return m.status();
    return std::optional<Meta>(std::move(*m));
  }

  absl::StatusOr<Meta> ParseMeta(const mvccpb::KeyValue& kv) const {
    Json j = Json::parse(kv.value(), nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Damaged(kv.key(), "not a JSON object");
    Meta m;
    const std::string base = o_.prefix + "/session-meta/";
    m.s.id = Unescape(kv.key().substr(base.size()));
    m.s.model = j.value("model", "");
    m.s.tenant = j.value("tenant", "");
    m.s.chat = j.value("chat", false);
    m.s.node_id = j.value("node", "");
    const std::string lost = j.value("lost", "");
    if (lost == "expired") m.s.lost = LostReason::kExpired;
    if (lost == "forgotten") m.s.lost = LostReason::kForgotten;
    m.s.last_used = absl::FromUnixMicros(j.value("last_used_us", int64_t{0}));
    m.first_turn = j.value("first_turn", int64_t{0});
    m.next_turn = j.value("next_turn", int64_t{0});
    m.mod_revision = kv.mod_revision();
    return m;
  }

  absl::Status DecodeTurn(const std::string& key, const std::string& id, const std::string& v,
                          StoredSession* s) const {
    if (v.size() < 4) return Damaged(key, "a turn shorter than its header");
    size_t n = 0;
    for (int b = 0; b < 4; ++b) n |= size_t{static_cast<uint8_t>(v[b])} << (8 * b);
    if (4 + n > v.size()) return Damaged(key, "a turn's tokens past its end");
    if (auto st = DecodeTokens(Describe(), id, v.substr(4, n), &s->tokens); !st.ok()) return st;
    return DecodeMessages(Describe(), id, v.substr(4 + n), &s->messages);
  }

  const std::shared_ptr<EtcdClient> client_;
  const EtcdStateOptions o_;
  // Serializes read-modify-write of session metas (etcd checks the rest).
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Meta> metas_ ABSL_GUARDED_BY(mu_);  // see the header
};

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> OpenEtcdStateStore(std::shared_ptr<EtcdClient> client,
                                                               const EtcdStateOptions& options) {
  if (options.prefix.empty() || options.prefix.back() == '/' || options.prefix[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("etcd state prefix \"", options.prefix,
                                                   "\": expected /name, with no trailing slash"));
  }
  // Reachable now, not at the first write.
  if (auto probe = client->Range(options.prefix + "/models/", true); !probe.ok()) {
    return probe.status();
  }
  return std::make_unique<EtcdStateStore>(std::move(client), options);
}

}  // namespace ballast::global_scheduler
