// StateStore on etcd (state_store.h's OpenEtcdStateStore). Keys under the
// prefix P (ids and names escaped: '%' and '/' as %25 and %2F):
//   P/models/<name>            JSON: a registration, or {"registered": false}
//   P/session-meta/<id>        JSON: model, tenant, chat, node, lost,
//                              last use, and the next turn's index
//   P/session-turns/<id>/<n>   turn n (8 digits): 4-byte LE token-bytes
//                              length, the tokens, then the messages
// A turn is one key, so appending costs the turn, not the history. Writing
// a session whole (or rewriting it) deletes its turns below the next index
// and writes that index, in one transaction (etcd refuses a put inside a
// range the same transaction deletes). Every write transaction compares
// the fence key's value with this scheduler's id, so a deposed leader's
// writes fail FAILED_PRECONDITION. Session metas this store read or wrote
// are kept in memory with their revision, so a turn is one round trip (a
// transaction that also checks the meta is still at that revision; a
// refused one drops the entry, and the next call reads etcd again).
#include <cstdio>
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
  std::snprintf(buf, sizeof(buf), "%08lld", static_cast<long long>(n));
  return buf;
}

// A session's meta record.
struct Meta {
  StoredSession s;  // without tokens and messages
  int64_t next_turn = 0;
  int64_t mod_revision = 0;  // of the key as read (0: absent)
};

std::string MetaJson(const StoredSession& s, int64_t next_turn) {
  Json j = {{"model", s.model},
            {"tenant", s.tenant},
            {"chat", s.chat},
            {"node", s.node_id},
            {"lost", !s.lost                           ? ""
                     : *s.lost == LostReason::kExpired ? "expired"
                                                       : "forgotten"},
            {"last_used_us", absl::ToUnixMicros(s.last_used)},
            {"next_turn", next_turn}};
  return j.dump();
}

std::string TurnValue(const std::vector<int>& tokens, const std::vector<v1::ChatMessage>& msgs) {
  const std::string t = EncodeTokens(tokens);
  std::string out(4, '\0');
  for (int b = 0; b < 4; ++b) out[b] = static_cast<char>((t.size() >> (8 * b)) & 0xff);
  return out + t + EncodeMessages(msgs);
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
    std::vector<StoredSession> out;
    for (const auto& kv : *metas) {
      auto m = ParseMeta(kv);
      if (!m.ok()) return m.status();
      metas_[m->s.id] = *m;
      auto turns = client_->Range(TurnsPrefix(m->s.id), true);
      if (!turns.ok()) return turns.status();
      for (const auto& t : *turns) {
        if (auto st = DecodeTurn(m->s.id, t.value(), &m->s); !st.ok()) return st;
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
    TxnRequest txn = Fenced();
    Put(&txn, ModelKey(s.name), j.dump());
    return Commit(txn, absl::StrCat("record model ", s.name));
  }

  absl::Status PutUnregistered(const std::string& name) override {
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
    TxnRequest txn = Fenced();
    Unchanged(&txn, meta);
    Put(&txn, TurnsPrefix(t.id) + TurnIndex(meta.next_turn), TurnValue(t.tokens, t.messages));
    Put(&txn, MetaKey(t.id), MetaJson(meta.s, meta.next_turn + 1));
    ++meta.next_turn;
    return CommitMeta(txn, meta, what);
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
    Put(&txn, MetaKey(id), MetaJson(meta.s, meta.next_turn));
    return CommitMeta(txn, meta, absl::StrCat("record the affinity of session ", id));
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
      Put(&txn, kv.key(), MetaJson(m->s, m->next_turn));
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
    c->set_target(etcdserverpb::Compare::VALUE);
    c->set_result(etcdserverpb::Compare::EQUAL);
    c->set_value(o_.fence_value);
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
    return absl::FailedPreconditionError(absl::StrCat(
        "state store ", Describe(), ": ", what, ": refused: this scheduler (", o_.fence_value,
        ") no longer holds ", o_.fence_key, ", or another writer changed the session"));
  }

  // Commits a transaction that writes `written`'s meta, and remembers it at
  // the new revision (forgets it if the commit failed). REQUIRES: mu_ held.
  absl::Status CommitMeta(const TxnRequest& txn, Meta written, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t revision = 0;
    absl::Status st = Commit(txn, what, &revision);
    if (st.ok()) {
      written.mod_revision = revision;
      metas_[written.s.id] = std::move(written);
    } else {
      metas_.erase(written.s.id);
    }
    return st;
  }

  // Writes a session whole: meta, and its turns replaced by one.
  // REQUIRES: mu_ held.
  absl::Status Rewrite(const StoredSession& s, const std::vector<int>& tokens,
                       const std::vector<v1::ChatMessage>& messages, const Meta& old,
                       const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    TxnRequest txn = Fenced();
    Meta cmp = old;
    cmp.s.id = s.id;
    Unchanged(&txn, cmp);  // mod_revision 0: the session must still be absent
    const std::string turn = TurnsPrefix(s.id) + TurnIndex(old.next_turn);
    auto* del = txn.add_success()->mutable_request_delete_range();
    del->set_key(TurnsPrefix(s.id));
    del->set_range_end(turn);  // every older turn, not the one written
    Put(&txn, turn, TurnValue(tokens, messages));
    Put(&txn, MetaKey(s.id), MetaJson(s, old.next_turn + 1));
    Meta written;
    written.s = s;
    written.s.tokens.clear();
    written.s.messages.clear();
    written.next_turn = old.next_turn + 1;
    return CommitMeta(txn, std::move(written), what);
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
    m.next_turn = j.value("next_turn", int64_t{0});
    m.mod_revision = kv.mod_revision();
    return m;
  }

  absl::Status DecodeTurn(const std::string& id, const std::string& v, StoredSession* s) const {
    if (v.size() < 4) return Damaged(TurnsPrefix(id), "a turn shorter than its header");
    size_t n = 0;
    for (int b = 0; b < 4; ++b) n |= size_t{static_cast<uint8_t>(v[b])} << (8 * b);
    if (4 + n > v.size()) return Damaged(TurnsPrefix(id), "a turn's tokens past its end");
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
