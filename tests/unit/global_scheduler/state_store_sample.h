// One sample of scheduler state written through any StateStore, and the
// checks that a store opened afterwards (what a restart reads) holds it
// exactly: odd token values, a NUL byte and non-ASCII in messages, an id
// with '/' and '%', a lost reason, an erased session, affinities set and
// forgotten, and the Admin's registrations and unregistrations (the latest
// word on a name wins). Shared by the SQLite and etcd store tests.
#pragma once

#include <string>
#include <vector>

#include "global_scheduler/state_store.h"
#include "gtest/gtest.h"

namespace ballast::global_scheduler::testing {

inline v1::ChatMessage Msg(const std::string& role, const std::string& content) {
  v1::ChatMessage m;
  m.set_role(role);
  m.set_content(content);
  return m;
}

inline StoredSession SampleSessionA() {
  return {"a/with%slash",
          "m",
          "acme",
          true,
          "node-1",
          {0, -1, 2147483647, -2147483647 - 1, 42},
          {Msg("user", "héllo"), Msg("assistant", std::string("nul\0byte", 8))},
          std::nullopt,
          absl::FromUnixMicros(1234567)};
}

inline void WriteSample(StateStore* store) {
  const StoredSession b{
      "b", "m2", "", false, "", {}, {}, LostReason::kExpired, absl::FromUnixSeconds(9)};
  ASSERT_TRUE(store->PutSession(SampleSessionA()).ok());
  ASSERT_TRUE(store->PutSession(b).ok());
  ASSERT_TRUE(
      store
          ->PutSession(
              {"c", "m", "", false, "node-1", {7}, {}, LostReason::kForgotten, absl::UnixEpoch()})
          .ok());
  ASSERT_TRUE(store->EraseSession("c").ok());
  ASSERT_TRUE(store->SetAffinity("b", "node-2").ok());
  ASSERT_TRUE(store->SetAffinity("nobody", "node-2").ok());  // no-op
  ASSERT_TRUE(store->ForgetNode("node-1").ok());
  ASSERT_TRUE(
      store->PutRegistered({"tuned", "/models/tuned", "bf16", "fp8", 300, 40, 2, 1 << 20, 1 << 30})
          .ok());
  ASSERT_TRUE(store->PutUnregistered("old").ok());
  ASSERT_TRUE(store->PutRegistered({"old", "/models/old"}).ok());  // back again
  ASSERT_TRUE(store->PutUnregistered("gone").ok());
}

inline void ExpectSample(StateStore* store) {
  const StoredSession a = SampleSessionA();
  auto sessions = *store->LoadSessions();
  ASSERT_EQ(sessions.size(), 2u);
  EXPECT_EQ(sessions[0].id, a.id);
  EXPECT_EQ(sessions[0].tenant, "acme");
  EXPECT_TRUE(sessions[0].chat);
  EXPECT_EQ(sessions[0].node_id, "");  // ForgetNode
  EXPECT_EQ(sessions[0].tokens, a.tokens);
  ASSERT_EQ(sessions[0].messages.size(), 2u);
  EXPECT_EQ(sessions[0].messages[0].content(), "héllo");
  EXPECT_EQ(sessions[0].messages[1].content(), a.messages[1].content());
  EXPECT_FALSE(sessions[0].lost.has_value());
  EXPECT_EQ(sessions[0].last_used, a.last_used);
  EXPECT_EQ(sessions[1].node_id, "node-2");
  EXPECT_EQ(sessions[1].lost, LostReason::kExpired);
  auto catalogue = *store->LoadCatalogue();
  ASSERT_EQ(catalogue.registered.size(), 2u);
  EXPECT_EQ(catalogue.registered[0].name, "old");
  EXPECT_EQ(catalogue.registered[0].quantization, "none");
  const ModelSpec& t = catalogue.registered[1];
  EXPECT_EQ(t.path, "/models/tuned");
  EXPECT_EQ(t.kv_dtype, "bf16");
  EXPECT_EQ(t.quantization, "fp8");
  EXPECT_EQ(t.ttft_ms, 300u);
  EXPECT_EQ(t.tpot_ms, 40u);
  EXPECT_EQ(t.replicas, 2);
  EXPECT_EQ(t.kv_floor_bytes, 1 << 20);
  EXPECT_EQ(t.kv_limit_bytes, 1 << 30);
  EXPECT_EQ(catalogue.unregistered, std::vector<std::string>{"gone"});
}

}  // namespace ballast::global_scheduler::testing
