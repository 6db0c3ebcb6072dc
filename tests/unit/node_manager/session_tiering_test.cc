// Session KV tiering end to end on one node (CPU backend): a session's next
// turn continues from DRAM, SSD, a restarted node's SSD, or an Advise
// prefetch, always with the output a cold recompute gives.
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "node_manager/node_manager.h"
#include "tests/unit/engine/test_util.h"
#include "tests/unit/node_manager/test_util.h"

namespace ballast::node_manager {
namespace {

namespace fs = std::filesystem;
using engine::GenerationResult;
using engine::KvSource;
using testing::Done;

struct Turn {
  std::vector<int> prompt_tokens;  // this turn's, as the node tokenized it
  GenerationResult result;
};

Turn RunTurn(NodeManager* node, const v1::NodeGenerateRequest& req) {
  Done d;
  auto a = node->Submit(req, &d);
  EXPECT_TRUE(a.ok()) << a.status();
  if (!a.ok()) return {};
  EXPECT_TRUE(d.AwaitDone(absl::Seconds(60)));
  EXPECT_TRUE(d.result.ok()) << d.result.status();
  return {a->turn_tokens, d.result.ok() ? *d.result : GenerationResult{}};
}

v1::NodeGenerateRequest Request(const std::string& session, const std::string& prompt,
                                const std::vector<int>& history, const std::string& tenant = "") {
  v1::NodeGenerateRequest r;
  r.set_request_id(absl::StrCat(session, "-", history.size()));
  r.set_model("a");
  r.set_session_id(session);
  r.set_tenant(tenant);
  r.set_prompt(prompt);
  for (int t : history) r.add_history_tokens(t);
  r.mutable_sampling()->set_max_tokens(20);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

class SessionTieringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = engine::testing::WriteTinyModel(dir_, "a", {});
    ssd_ = dir_.sub("ssd");
  }

  std::unique_ptr<NodeManager> MakeNode(int64_t dram_bytes, bool ssd) {
    NodeOptions n;
    n.devices = {DeviceOptions{"cpu:0", 64ll << 20}};
    n.kv_tiers.dram_bytes = dram_bytes;
    n.kv_tiers.chunk_tokens = 16;
    if (ssd) {
      n.kv_tiers.ssd_dir = ssd_;
      n.kv_tiers.ssd_bytes = 1ll << 30;
    }
    auto node = NodeManager::Create(n);
    EXPECT_TRUE(node.ok()) << node.status();
    EXPECT_TRUE((*node)->LoadModel("a", path_, "auto", "").ok());
    return std::move(*node);
  }

  // Turn 1 of `session`; returns the history turn 2 sends.
  std::vector<int> FirstTurn(NodeManager* node, const std::string& session,
                             const std::string& tenant = "") {
    Turn t = RunTurn(node, Request(session, "the first question", {}, tenant));
    std::vector<int> history = t.prompt_tokens;
    history.insert(history.end(), t.result.output_tokens.begin(), t.result.output_tokens.end());
    return history;
  }

  // Drops the session's device copy only (the tiers keep theirs).
  static void DropDeviceCopy(NodeManager* node, const std::string& session,
                             const std::string& tenant = "") {
    auto engine = node->devices()[0]->Find("a");
    const std::string key = NodeManager::SessionKey(tenant, session);
    engine->DropSession(key);
    ASSERT_TRUE(
        testing::WaitFor([&] { return engine->CachedSessionTokens(key) == 0; }, absl::Seconds(10)));
  }

  // Turn 2's output computed from scratch (a node with no tiers, a session
  // it never saw).
  std::vector<int> Reference(const std::vector<int>& history) {
    NodeOptions n;
    n.devices = {DeviceOptions{"cpu:0", 64ll << 20}};
    auto node = std::move(*NodeManager::Create(n));
    EXPECT_TRUE(node->LoadModel("a", path_, "auto", "").ok());
    Turn t = RunTurn(node.get(), Request("cold", "and a second one", history));
    EXPECT_EQ(t.result.kv_source, KvSource::kRecomputed);
    node->Shutdown();
    return t.result.output_tokens;
  }

  engine::testing::TempDir dir_;
  std::string path_, ssd_;
};

TEST_F(SessionTieringTest, ANextTurnContinuesFromDramWithTheRecomputedOutput) {
  auto node = MakeNode(64 << 20, false);
  const std::vector<int> history = FirstTurn(node.get(), "s");
  DropDeviceCopy(node.get(), "s");
  Turn t = RunTurn(node.get(), Request("s", "and a second one", history));
  EXPECT_EQ(t.result.kv_source, KvSource::kHostDram);
  EXPECT_EQ(t.result.cached_tokens, static_cast<int>(history.size()) - 1);
  EXPECT_EQ(t.result.output_tokens, Reference(history));
  node->Shutdown();
}

// Symphony's layer-wise priority: the device gives back a kept session's
// later layers first and keeps the first ones; the next turn computes with
// those at once and loads only the shed layers from DRAM.
TEST_F(SessionTieringTest, LaterLayersAreShedFirstAndTheNextTurnLoadsOnlyThose) {
  auto node = MakeNode(64 << 20, false);
  const std::vector<int> history = FirstTurn(node.get(), "s");
  DeviceWorker* device = node->devices()[0];
  auto engine = device->Find("a");
  auto used_blocks = [&] {
    return engine->stats().kv_blocks_total - engine->stats().kv_blocks_free;
  };
  const int64_t before = used_blocks();  // the kept session's
  const int layers = engine->config().num_hidden_layers;
  ASSERT_GE(layers, 2);
  ASSERT_GT(before, 0);
  auto freed = device->ShedKv(1);  // one byte: the session's last layer
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_GT(*freed, 0);
  EXPECT_EQ(used_blocks(), before - before / layers);
  EXPECT_EQ(engine->stats().cached_sessions, 1);  // the first layers stayed
  EXPECT_EQ(engine->CachedSessionTokens(NodeManager::SessionKey("", "s")),
            0);  // not whole: the node reads the tiers
  Turn t = RunTurn(node.get(), Request("s", "and a second one", history));
  EXPECT_EQ(t.result.kv_source, KvSource::kHostDram);
  EXPECT_EQ(t.result.cached_tokens, static_cast<int>(history.size()) - 1);
  EXPECT_EQ(t.result.output_tokens, Reference(history));
  // Only the shed layer came from DRAM: one layer's blocks of the history.
  const int64_t history_blocks = (static_cast<int64_t>(history.size()) - 1 + 15) / 16;  // of 16
  EXPECT_EQ(t.result.kv_loaded_bytes,
            history_blocks * static_cast<int64_t>(engine->kv_block_bytes()));
  node->Shutdown();
}

// Memory wanted by a model of another block size is taken as whole sessions:
// shedding later layers frees blocks in slabs it cannot use.
TEST_F(SessionTieringTest, AnotherBlockSizeTakesWholeSessions) {
  auto node = MakeNode(64 << 20, false);
  engine::SyntheticModelSpec spec;
  spec.kv_heads = 4;  // other KV blocks than a's
  ASSERT_TRUE(
      node->LoadModel("b", engine::testing::WriteTinyModel(dir_, "b", spec), "auto", "").ok());
  DeviceWorker* device = node->devices()[0];
  auto reclaim = [&] {
    int64_t freed = -1;
    EXPECT_TRUE(device
                    ->RunOnStepThread([&] {
                      freed = device->ReclaimFor("b", 1, std::numeric_limits<uint64_t>::max());
                      return absl::OkStatus();
                    })
                    .ok());
    return freed;
  };
  // Nothing to give yet (a keeps no session): counted as answered at once.
  // (Between steps, as here, nothing is in flight either way.)
  EXPECT_EQ(reclaim(), 0);
  EXPECT_EQ(device->Usage().kv_reclaims.nothing, 1);
  EXPECT_EQ(device->Usage().kv_reclaims.asked, 0);
  FirstTurn(node.get(), "s");
  auto a = device->Find("a");
  auto b = device->Find("b");
  ASSERT_NE(a->kv_block_bytes(), b->kv_block_bytes());
  ASSERT_TRUE(testing::WaitFor([&] { return a->stats().cached_sessions == 1; }, absl::Seconds(10)));
  EXPECT_GT(reclaim(), 0);
  EXPECT_EQ(device->Usage().kv_reclaims.asked, 1);
  EXPECT_EQ(device->Usage().kv_reclaims.nothing, 1);
  EXPECT_EQ(a->stats().cached_sessions, 0) << "a's session kept its first layers for b";
  EXPECT_EQ(a->stats().kv_blocks_free, a->stats().kv_blocks_total);
  node->Shutdown();
}

// With only its first layers on the device and no lease for the rest (the
// user edited the history inside the first chunk), the turn recomputes.
TEST_F(SessionTieringTest, FirstLayersWithoutALeaseAreRecomputed) {
  auto node = MakeNode(64 << 20, false);
  std::vector<int> history = FirstTurn(node.get(), "s");
  ASSERT_GT(history.size(), 8u);
  auto freed = node->devices()[0]->ShedKv(1);
  ASSERT_TRUE(freed.ok()) << freed.status();
  ASSERT_GT(*freed, 0);
  history[6] = history[6] == 5 ? 6 : 5;  // the tiers' chunks no longer match
  Turn t = RunTurn(node.get(), Request("s", "and a second one", history));
  EXPECT_EQ(t.result.kv_source, KvSource::kRecomputed);
  EXPECT_EQ(t.result.output_tokens, Reference(history));
  node->Shutdown();
}

TEST_F(SessionTieringTest, ARestartedNodeContinuesFromItsSsdDirectory) {
  std::vector<int> history;
  {
    auto node = MakeNode(0, true);
    history = FirstTurn(node.get(), "s");
    node->kv_tiers()->Flush();
    node->Shutdown();
  }
  auto node = MakeNode(64 << 20, true);  // same ssd_dir, new process state
  Turn t = RunTurn(node.get(), Request("s", "and a second one", history));
  EXPECT_EQ(t.result.kv_source, KvSource::kSsd);
  EXPECT_EQ(t.result.cached_tokens, static_cast<int>(history.size()) - 1);
  EXPECT_EQ(t.result.output_tokens, Reference(history));
  node->Shutdown();
}

TEST_F(SessionTieringTest, ACorruptSsdChunkIsRecomputedWithTheSameOutput) {
  std::vector<int> history;
  {
    auto node = MakeNode(0, true);
    history = FirstTurn(node.get(), "s");
    node->kv_tiers()->Flush();
    node->Shutdown();
  }
  for (const auto& f : fs::directory_iterator(ssd_)) {  // flip one payload byte in every file
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(-1, std::ios::end);
    const char c = static_cast<char>(io.get());
    io.seekp(-1, std::ios::end);
    io.put(static_cast<char>(c ^ 0x40));
  }
  auto node = MakeNode(64 << 20, true);
  Turn t = RunTurn(node.get(), Request("s", "and a second one", history));
  EXPECT_EQ(t.result.kv_source, KvSource::kRecomputed);
  EXPECT_EQ(t.result.output_tokens, Reference(history));
  EXPECT_GE(node->kv_tiers()->stats().checksum_failures, 1);
  node->Shutdown();
}

TEST_F(SessionTieringTest, AdviseMovesTheKvOnTheDeviceAndInvalidateDropsIt) {
  auto node = MakeNode(64 << 20, false);
  const std::vector<int> history = FirstTurn(node.get(), "s");
  DropDeviceCopy(node.get(), "s");
  v1::PrefetchKvRequest p;
  p.set_session_id("s");
  p.set_model("a");
  for (int t : history) p.add_tokens(t);
  p.set_ttl_ms(60000);
  // Advise, then Invalidate: the device copy goes, the DRAM copy stays.
  auto r = node->PrefetchKv(p);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->source, KvSource::kHostDram);
  EXPECT_EQ(r->tokens, static_cast<int>(history.size()) - 1);
  auto engine = node->devices()[0]->Find("a");
  EXPECT_EQ(engine->CachedSessionTokens(NodeManager::SessionKey("", "s")), r->tokens);
  EXPECT_TRUE(*node->DropPrefetch("s", "a"));
  EXPECT_EQ(engine->CachedSessionTokens(NodeManager::SessionKey("", "s")), 0);
  EXPECT_FALSE(*node->DropPrefetch("s", "a"));  // nothing left to drop
  // Advise again: the next turn finds its KV on the device.
  ASSERT_TRUE(node->PrefetchKv(p).ok());
  Turn t = RunTurn(node.get(), Request("s", "and a second one", history));
  EXPECT_EQ(t.result.kv_source, KvSource::kDevice);
  EXPECT_GE(t.result.prefetch_lead_ms, 0);
  EXPECT_EQ(t.result.output_tokens, Reference(history));
  const auto outcomes = engine->stats().prefetches;
  EXPECT_EQ(outcomes.used, 1);
  EXPECT_EQ(outcomes.invalidated, 1);
  // A prefetch nobody uses is released after its ttl.
  DropDeviceCopy(node.get(), "s");
  p.set_ttl_ms(1);
  ASSERT_TRUE(node->PrefetchKv(p).ok());
  absl::SleepFor(absl::Milliseconds(20));
  RunTurn(node.get(), Request("other", "wake the engine", {}));
  EXPECT_EQ(engine->CachedSessionTokens(NodeManager::SessionKey("", "s")), 0);
  EXPECT_EQ(engine->stats().prefetches.expired, 1);
  node->Shutdown();
}

TEST_F(SessionTieringTest, TenantsNeverShareKvButSessionsOfOneTenantShareAPrefix) {
  auto node = MakeNode(64 << 20, false);
  const std::vector<int> history = FirstTurn(node.get(), "s", "acme");
  DropDeviceCopy(node.get(), "s", "acme");
  // Another tenant's session with the very same tokens recomputes.
  Turn other = RunTurn(node.get(), Request("t", "and a second one", history, "globex"));
  EXPECT_EQ(other.result.kv_source, KvSource::kRecomputed);
  // Another session of the same tenant reuses the shared prefix.
  Turn same = RunTurn(node.get(), Request("u", "and a second one", history, "acme"));
  EXPECT_EQ(same.result.kv_source, KvSource::kHostDram);
  EXPECT_EQ(same.result.output_tokens, other.result.output_tokens);
  node->Shutdown();
}

// Two tenants naming the same session id hold apart KV on the node, even
// though the scheduler would have refused the second tenant's turn.
TEST_F(SessionTieringTest, OneSessionIdOfTwoTenantsNeverSharesKv) {
  auto node = MakeNode(64 << 20, false);
  const std::vector<int> history = FirstTurn(node.get(), "s", "acme");
  auto engine = node->devices()[0]->Find("a");
  const std::string acme = NodeManager::SessionKey("acme", "s");
  const std::string globex = NodeManager::SessionKey("globex", "s");
  EXPECT_NE(acme, globex);
  EXPECT_NE(NodeManager::SessionKey("", "4:acme/s"), acme);  // ids cannot forge a tenant's key
  EXPECT_GT(engine->CachedSessionTokens(acme), 0);
  // globex sends acme's very history on the same id: nothing of acme's is used.
  Turn other = RunTurn(node.get(), Request("s", "and a second one", history, "globex"));
  EXPECT_EQ(other.result.kv_source, KvSource::kRecomputed);
  EXPECT_EQ(other.result.cached_tokens, 0);
  // acme's next turn still finds its own KV on the device.
  Turn own = RunTurn(node.get(), Request("s", "and a second one", history, "acme"));
  EXPECT_EQ(own.result.kv_source, KvSource::kDevice);
  EXPECT_EQ(own.result.output_tokens, other.result.output_tokens);
  // Dropping the id drops every tenant's copy.
  EXPECT_TRUE(node->DropSession("s"));
  EXPECT_TRUE(testing::WaitFor(
      [&] { return engine->CachedSessionTokens(acme) + engine->CachedSessionTokens(globex) == 0; },
      absl::Seconds(10)));
  EXPECT_FALSE(node->DropSession("s"));
  node->Shutdown();
}

TEST_F(SessionTieringTest, EndSessionDeletesEveryCopy) {
  auto node = MakeNode(64 << 20, true);
  FirstTurn(node.get(), "s");
  node->kv_tiers()->Flush();
  EXPECT_GT(node->kv_tiers()->stats().chunks, 0);
  node->DropSession("s");
  node->kv_tiers()->Flush();
  EXPECT_EQ(node->kv_tiers()->stats().chunks, 0);
  EXPECT_TRUE(fs::is_empty(ssd_));
  node->Shutdown();
}

}  // namespace
}  // namespace ballast::node_manager
