// Session KV tiers in the simulator (sim_sessions.cc, sim_kv_tiers.h, the
// GPU's side in sim_device.h): next-turn TTFTs computed by hand for each
// place the KV can be (the GPU, DRAM, SSD, an Advise's prefetch, nowhere),
// capacity pressure demoting to SSD and then dropping, determinism and
// conservation on a chat trace, and config errors.
//
// The engine: every step takes kStep plus kPerToken per prefill token; a
// llama-1b token of KV is kBpt bytes, and DRAM loads a token a millisecond,
// SSD one every 10 ms.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "bench/generators.h"
#include "bench/report.h"
#include "sim/sim_kv_tiers.h"
#include "sim/simulator.h"
#include "tests/unit/sim/sim_test_util.h"

namespace ballast::sim {
namespace {

using testing::Find;
using testing::kStep;
using testing::Model;

constexpr double kPerToken = 1e-4;  // s per prefill token
const int64_t kBpt = NamedShape("llama-1b")->kv_bytes_per_token();

EngineModel TierEngine() {
  std::array<double, kFeatures> k{};
  k[0] = kStep;
  k[6] = kPerToken / (2 * NamedShape("llama-1b")->layer_params());
  KvLinkRates rates;
  rates.dram_bytes_per_s = static_cast<double>(kBpt) * 1000;  // a token per ms
  rates.ssd_bytes_per_s = static_cast<double>(kBpt) * 100;    // a token per 10 ms
  return EngineModel(k, 1e9, 1.0, rates);
}

// A llama-1b-shaped model without an LM head (a prompt's sampled row would
// cost the head's FLOPs on top), so that a prefill token costs exactly
// kPerToken.
SimModel TierModel(const std::string& name) {
  SimModel m = Model(name);
  m.shape.vocab = 0;
  return m;
}

// One GPU with room for `room` tokens of KV beside model a's weights, and
// tiers of `dram` and `ssd` tokens.
SimConfig TierGpu(int room, int64_t dram, int64_t ssd, const std::string& mode = "tiers") {
  SimConfig c;
  c.models = {TierModel("a")};
  c.cluster.gpu_memory_bytes = c.models[0].shape.weight_bytes() + room * kBpt;
  c.cluster.dram_bytes = dram * kBpt;
  c.cluster.ssd_bytes = ssd * kBpt;
  c.policy.min_kv_fraction = 0;
  c.policy.kv_pressure_free_fraction = 0;
  c.policy.session_kv = *ParseSessionKv(mode);
  return c;
}

bench::TraceRecord Turn(const std::string& id, const std::string& session, int prompt, int output,
                        const std::string& after = "", double delay = 0.1) {
  bench::TraceRecord r = testing::Req(id, "a", 0, prompt, output);
  r.session = session;
  r.after = after;
  r.delay_s = after.empty() ? 0 : delay;
  return r;
}

bench::TraceRecord Advisory(const std::string& id, const std::string& session,
                            const std::string& after, double delay, double expected) {
  bench::TraceRecord a = testing::Req(id, "a", 0, 0, 0);
  a.type = bench::TraceRecord::Type::kAdvise;
  a.session = session;
  a.after = after;
  a.delay_s = delay;
  a.expected_arrival_s = expected;
  return a;
}

// Session s: turn 1 (100 + 50 tokens: 150 of KV), then a 900-token
// request of no session that needs the GPU's room (1,000 tokens), so s's
// KV leaves the GPU (written through to DRAM at turn 1's end); then turn
// 2 (20 new tokens) 1 s after it. `extra` goes before turn 2.
std::vector<bench::TraceRecord> DramCase(std::vector<bench::TraceRecord> extra = {}) {
  std::vector<bench::TraceRecord> t = {Turn("t1", "s", 100, 50), Turn("f", "", 800, 100, "t1")};
  for (auto& r : extra) t.push_back(r);
  t.push_back(Turn("t2", "s", 20, 5, "f", 1.0));
  return t;
}

TEST(SessionTiersTest, NextTurnFromDramIsTheLoadPlusItsNewTokensByHand) {
  auto r = Simulate(TierGpu(1000, 1000, 0), TierEngine(), DramCase());
  ASSERT_TRUE(r.ok()) << r.status();
  // Turn 1: one prefill step (10 + 100 x 0.1 ms).
  EXPECT_NEAR(Find(*r, "t1").ttft_ms(), 20, 1e-6);
  const auto& t2 = Find(*r, "t2");
  // 150 history tokens from DRAM at a token per ms, then one step
  // prefilling only the 20 new tokens: 150 + 10 + 2 ms.
  EXPECT_NEAR(t2.ttft_ms(), 162, 1e-6);
  EXPECT_EQ(t2.kv_source, "host_dram");
  EXPECT_EQ(t2.prompt_tokens, 170);
  EXPECT_EQ(t2.cached_tokens, 150);
  EXPECT_NEAR(t2.kv_load_ms, 150, 1e-6);
  const SessionKvStats& s = r->stats.sessions;
  EXPECT_EQ(s.first_turns, 1);
  EXPECT_EQ(s.next_turns, 1);
  EXPECT_EQ(s.next_by_origin.at("host_dram"), 1);
  EXPECT_EQ(s.hbm_shed, 1);
  EXPECT_EQ(s.reused_tokens, 150);
  EXPECT_EQ(s.recomputed_tokens, 0);
  EXPECT_NEAR(s.ttft_ms.at("host_dram").p50, 162, 1e-6);
}

TEST(SessionTiersTest, WithoutTiersTheNextTurnRecomputesItsWholeContext) {
  for (const std::string mode : {"device", "recompute"}) {
    SCOPED_TRACE(mode);
    auto r = Simulate(TierGpu(1000, 1000, 0, mode), TierEngine(), DramCase());
    ASSERT_TRUE(r.ok()) << r.status();
    const auto& t2 = Find(*r, "t2");
    EXPECT_NEAR(t2.ttft_ms(), 10 + 170 * 0.1, 1e-6);  // history and new tokens
    EXPECT_EQ(t2.kv_source, "recomputed");
    EXPECT_EQ(r->stats.sessions.recomputed_tokens, 150);
  }
}

TEST(SessionTiersTest, KvLeftOnTheGpuPrefillsOnlyTheNewTokens) {
  // No other request: turn 1's KV stays on the GPU.
  for (const std::string mode : {"tiers", "device"}) {
    SCOPED_TRACE(mode);
    auto r = Simulate(TierGpu(1000, 1000, 0, mode), TierEngine(),
                      {Turn("t1", "s", 100, 50), Turn("t2", "s", 20, 5, "t1", 1.0)});
    ASSERT_TRUE(r.ok()) << r.status();
    // The GPU keeps 149 tokens (all but the last generated one, as the
    // engine): one step prefilling 1 + 20 tokens.
    EXPECT_NEAR(Find(*r, "t2").ttft_ms(), 10 + 21 * 0.1, 1e-6);
    EXPECT_EQ(Find(*r, "t2").kv_source, "device");
    EXPECT_EQ(Find(*r, "t2").cached_tokens, 149);
  }
  auto r = Simulate(TierGpu(1000, 1000, 0, "recompute"), TierEngine(),
                    {Turn("t1", "s", 100, 50), Turn("t2", "s", 20, 5, "t1", 1.0)});
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(Find(*r, "t2").ttft_ms(), 27, 1e-6);
}

TEST(SessionTiersTest, AdviseMovesTheKvOntoTheGpuAheadOfTheTurn) {
  // In time: the 150 ms load ends 350 ms before the turn.
  auto r = Simulate(TierGpu(1000, 1000, 0), TierEngine(),
                    DramCase({Advisory("a2", "s", "f", 0.5, 0.5)}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(Find(*r, "t2").ttft_ms(), 12, 1e-6);
  EXPECT_EQ(Find(*r, "t2").kv_source, "device");
  EXPECT_EQ(r->stats.sessions.next_by_origin.at("advised"), 1);
  EXPECT_EQ(r->stats.sessions.advise_prefetched.at("host_dram"), 1);
  // 50 ms before the turn: the turn waits out the last 100 ms of the load.
  r = Simulate(TierGpu(1000, 1000, 0), TierEngine(),
               DramCase({Advisory("a2", "s", "f", 0.95, 0.05)}));
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(Find(*r, "t2").ttft_ms(), 112, 1e-6);
  EXPECT_NEAR(Find(*r, "t2").kv_load_ms, 100, 1e-6);
}

TEST(SessionTiersTest, AnUnusedPrefetchExpiresAndAdvisoriesNeedTheirKv) {
  // a1 comes before any turn of s ended; a2's turn never comes.
  std::vector<bench::TraceRecord> t = {Advisory("a1", "s", "", 0, 1), Turn("t1", "s", 100, 50),
                                       Turn("f", "", 800, 100, "t1"),
                                       Advisory("a2", "s", "f", 0.1, 1)};
  auto r = Simulate(TierGpu(1000, 1000, 0), TierEngine(), t);
  ASSERT_TRUE(r.ok()) << r.status();
  const SessionKvStats& s = r->stats.sessions;
  EXPECT_EQ(s.advisories, 2);
  EXPECT_EQ(s.advise_no_kv, 1);
  EXPECT_EQ(s.advise_prefetched.at("host_dram"), 1);
  EXPECT_EQ(s.prefetch_expired, 1);
  EXPECT_EQ(r->stats.advisories_ignored, 0);
  r = Simulate(TierGpu(1000, 1000, 0, "recompute"), TierEngine(), t);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->stats.advisories_ignored, 2);
  EXPECT_EQ(r->stats.sessions.advisories, 0);
}

TEST(SessionTiersTest, TiersDemoteToSsdAndThenDropByTheNodesRules) {
  // DRAM for 2 units, SSD for 3; every copy is 1 unit (100 bytes).
  SimKvTiers t(200, 300);
  t.Put(1, 0, 10, 100, 0);
  t.Put(2, 0, 10, 100, 0);
  t.Put(3, 0, 10, 100, 0);  // DRAM over: 1 (least recent) demoted
  EXPECT_FALSE(t.Find(1, 0).in_dram);
  EXPECT_TRUE(t.Find(1, 0).on_ssd);
  t.Put(4, 0, 10, 100, 0);  // 2 demoted; SSD over: 1, SSD only, dropped
  EXPECT_EQ(t.Find(1, 0).tokens, 0);
  EXPECT_TRUE(t.Find(2, 0).on_ssd && !t.Find(2, 0).in_dram);
  const SimKvTiers::Held got = t.Read(2, 0);  // from SSD, promoted: 3 demoted
  EXPECT_TRUE(got.on_ssd && !got.in_dram);
  EXPECT_TRUE(t.Find(2, 0).in_dram);
  EXPECT_FALSE(t.Find(3, 0).in_dram);
  EXPECT_EQ(t.counters().demoted, 3);
  EXPECT_EQ(t.counters().ssd_evicted, 1);
  EXPECT_EQ(t.counters().dropped, 1);
  EXPECT_EQ(t.dram_used(), 200);
  EXPECT_EQ(t.ssd_used(), 300);
  // Priority before recency: 5 (priority 1) outlives 6, newer; the copy
  // being written (7) is never the victim, though its priority is lowest.
  t.Put(5, 0, 10, 100, 1);
  t.Put(6, 0, 10, 100, 0);
  t.Put(7, 0, 10, 100, -1);
  EXPECT_TRUE(t.Find(5, 0).in_dram);
  EXPECT_FALSE(t.Find(6, 0).in_dram);
  EXPECT_TRUE(t.Find(7, 0).in_dram);
  // A copy is of one model: another model's turn finds none, and its Put
  // replaces it.
  EXPECT_EQ(t.Find(7, 1).tokens, 0);
  EXPECT_EQ(t.Read(7, 1).tokens, 0);
  t.Put(7, 1, 20, 100, 0);
  EXPECT_EQ(t.Find(7, 0).tokens, 0);
  EXPECT_EQ(t.Find(7, 1).tokens, 20);
  // DRAM alone: the victim is dropped.
  SimKvTiers dram(100, 0);
  dram.Put(1, 0, 10, 100, 0);
  dram.Put(2, 0, 10, 100, 0);
  EXPECT_EQ(dram.Find(1, 0).tokens, 0);
  EXPECT_EQ(dram.counters().dropped, 1);
}

TEST(SessionTiersTest, CapacityPressureDemotesToSsdThenDrops) {
  // Room for 200 tokens on the GPU (one turn's 150), DRAM for 200, SSD for
  // 400. A1, B1, C1 leave A dropped, B on SSD, C in DRAM and on the GPU;
  // then C2 (GPU), B2 (SSD), A2 (recomputed), one after the other.
  std::vector<bench::TraceRecord> t = {
      Turn("A1", "A", 100, 50),     Turn("B1", "B", 100, 50, "A1"), Turn("C1", "C", 100, 50, "B1"),
      Turn("C2", "C", 20, 5, "C1"), Turn("B2", "B", 20, 5, "C2"),   Turn("A2", "A", 20, 5, "B2")};
  auto r = Simulate(TierGpu(200, 200, 400), TierEngine(), t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Find(*r, "C2").kv_source, "device");
  EXPECT_NEAR(Find(*r, "C2").ttft_ms(), 12.1, 1e-6);  // 149 kept: 21 tokens prefilled
  EXPECT_EQ(Find(*r, "B2").kv_source, "ssd");
  EXPECT_NEAR(Find(*r, "B2").ttft_ms(), 1500 + 12, 1e-6);  // 150 tokens at 10 ms each
  EXPECT_EQ(Find(*r, "A2").kv_source, "recomputed");
  EXPECT_NEAR(Find(*r, "A2").ttft_ms(), 27, 1e-6);
  // Then A2's end writes A (175 tokens): DRAM demotes B again, and the
  // SSD (C, B and A: 525 tokens) drops C, least recently used.
  const SessionKvStats& s = r->stats.sessions;
  EXPECT_EQ(s.dram_demoted, 4);  // A at B1, B at C1, C when B2 promoted B, B at A2's end
  EXPECT_EQ(s.ssd_evicted, 2);
  EXPECT_EQ(s.tier_dropped, 2);             // A at C1, C at A2's end
  EXPECT_EQ(s.hbm_shed, 4);                 // A, B, C, then B2's at A2
  EXPECT_EQ(s.recomputed_tokens, 150 + 1);  // A2's history, C2's last token
}

// Two nodes of one GPU, each with room for one of models a, b and c, idle
// after 0.5 s; the engine's peer link moves a token per 2 ms.
SimConfig TwoNodesThreeModels() {
  SimConfig c = TierGpu(1000, 1000, 0);
  c.cluster.nodes = 2;
  c.models = {TierModel("a"), TierModel("b"), TierModel("c")};
  c.policy.idle_evict_after_s = 0.5;
  return c;
}
EngineModel PeerEngine() {
  KvLinkRates rates = TierEngine().kv_rates();
  rates.peer_bytes_per_s = static_cast<double>(kBpt) * 500;
  return EngineModel(TierEngine().coefficients(), 1e9, 1.0, rates);
}

TEST(SessionTiersTest, ATurnOnAnotherNodeFetchesItsKvFromItsAffinityNode) {
  // Two nodes of one GPU, each with room for one of the three models. s's
  // first turn runs on a's GPU; c's request evicts a (the longest idle),
  // and s's second turn brings a back on the other node (b idle longer
  // than c), which fetches the 150 tokens from node 0's tiers.
  SimConfig c = TwoNodesThreeModels();
  const EngineModel engine = PeerEngine();
  std::vector<bench::TraceRecord> t = {Turn("t1", "s", 100, 50),
                                       testing::Req("rb", "b", 0.9, 10, 2),
                                       testing::Req("rc", "c", 1.0, 10, 2), Turn("t2", "s", 20, 5)};
  t[3].arrival_s = 6;
  auto r = Simulate(c, engine, t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Find(*r, "t2").status, "OK");
  EXPECT_EQ(Find(*r, "t2").kv_source, "peer");
  EXPECT_NEAR(Find(*r, "t2").kv_load_ms, 300, 1e-6);
  EXPECT_EQ(Find(*r, "t2").cached_tokens, 150);
  EXPECT_EQ(r->stats.sessions.loads.at("peer"), 1);
  EXPECT_EQ(r->stats.idle_evictions, 2);
}

TEST(SessionTiersTest, ATurnOnAnotherModelNeverReadsTheFirstModelsKv) {
  // Two nodes of one GPU, each with room for one of three models. s's turn
  // 1 runs on a (node 0), turn 2 on b (node 1; 175 tokens of b's KV there).
  // c evicts a (node 0), a evicts b (node 1), and s's turn 3 brings b back
  // on node 0, whose tiers hold s's KV of model a only: b's 175 tokens come
  // from node 1 (a token per 2 ms), none from node 0's DRAM.
  SimConfig c = TwoNodesThreeModels();
  const EngineModel engine = PeerEngine();
  std::vector<bench::TraceRecord> t = {Turn("t1", "s", 100, 50), Turn("t2", "s", 20, 5),
                                       testing::Req("rc", "c", 1.0, 10, 2),
                                       testing::Req("ra", "a", 3.0, 10, 2), Turn("t3", "s", 20, 5)};
  t[1].model = "b";
  t[1].arrival_s = 0.9;
  t[4].model = "b";
  t[4].arrival_s = 6;
  auto r = Simulate(c, engine, t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Find(*r, "t2").kv_source, "recomputed");
  const auto& t3 = Find(*r, "t3");
  ASSERT_EQ(t3.status, "OK");
  EXPECT_EQ(t3.kv_source, "peer");
  EXPECT_EQ(t3.cached_tokens, 175);
  EXPECT_NEAR(t3.kv_load_ms, 350, 1e-6);
  EXPECT_EQ(r->stats.sessions.loads.count("host_dram"), 0u);
  EXPECT_EQ(r->stats.sessions.loads.at("peer"), 1);
}

TEST(SessionTiersTest, WithoutSessionsTheOutcomesAreTheSameInEveryMode) {
  const std::vector<bench::TraceRecord> t = {Turn("r1", "", 100, 50), Turn("r2", "", 20, 5, "r1"),
                                             Turn("r3", "", 800, 100, "r2")};
  auto rec = Simulate(TierGpu(1000, 1000, 0, "recompute"), TierEngine(), t);
  ASSERT_TRUE(rec.ok()) << rec.status();
  for (const std::string mode : {"tiers", "device"}) {
    SCOPED_TRACE(mode);
    auto r = Simulate(TierGpu(1000, 1000, 0, mode), TierEngine(), t);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->replay.requests.size(), rec->replay.requests.size());
    for (size_t i = 0; i < r->replay.requests.size(); ++i) {
      const auto &x = r->replay.requests[i], &y = rec->replay.requests[i];
      EXPECT_EQ(x.status, "OK");
      EXPECT_EQ(x.kv_source, "") << x.id;
      EXPECT_EQ(y.kv_source, "") << y.id;
      EXPECT_EQ(x.cached_tokens, y.cached_tokens) << x.id;
      EXPECT_EQ(x.first_token_s, y.first_token_s) << x.id;
    }
  }
}

TEST(SessionTiersTest, ATensorParallelModelIsNeverPrefetchedAndLoadsItsPartFromDram) {
  // tp 2: its GPUs keep no session KV, so an Advise reads nothing; the turn
  // reads its lease from DRAM, each GPU its half (150 tokens: 75 ms).
  SimConfig c = TierGpu(1000, 1000, 0);
  c.cluster.gpus_per_node = 2;
  c.models[0].tp = 2;
  auto r = Simulate(c, TierEngine(), DramCase({Advisory("a2", "s", "f", 0.5, 0.5)}));
  ASSERT_TRUE(r.ok()) << r.status();
  const SessionKvStats& s = r->stats.sessions;
  EXPECT_EQ(s.advise_no_room, 1);
  EXPECT_EQ(s.loads.at("host_dram"), 1);
  EXPECT_EQ(Find(*r, "t2").kv_source, "host_dram");
  EXPECT_NEAR(Find(*r, "t2").kv_load_ms, 75, 1e-6);
}

TEST(SessionTiersTest, AnUnusedPrefetchDoesNotStretchTheRun) {
  // The prefetch expires at about 131 s; the last turn ends near 1 s.
  std::vector<bench::TraceRecord> t = {Turn("t1", "s", 100, 50), Turn("f", "", 800, 100, "t1"),
                                       Advisory("a2", "s", "f", 0.1, 100)};
  auto r = Simulate(TierGpu(1000, 1000, 0), TierEngine(), t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stats.sessions.advise_prefetched.at("host_dram"), 1);
  EXPECT_EQ(r->stats.sessions.prefetch_expired, 1);
  EXPECT_LT(r->stats.simulated_s, 5);
  auto again = Simulate(TierGpu(1000, 1000, 0), TierEngine(), t);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->stats.simulated_s, r->stats.simulated_s);
}

TEST(SessionTiersTest, AnAdvisoryNeverReleasedIsSkipped) {
  // t1 fails (it needs more KV than the GPU holds): a1 after it is never
  // released; a2 is acted on; a3 (no session) is ignored.
  std::vector<bench::TraceRecord> t = {Turn("t1", "s", 5000, 50), Advisory("a1", "s", "t1", 0, 1),
                                       Advisory("a2", "s", "", 0, 1), Advisory("a3", "", "", 0, 1)};
  for (const std::string mode : {"tiers", "device", "recompute"}) {
    SCOPED_TRACE(mode);
    auto r = Simulate(TierGpu(1000, 1000, 0, mode), TierEngine(), t);
    ASSERT_TRUE(r.ok()) << r.status();
    const int sent = mode == "recompute" ? 0 : 1;
    EXPECT_EQ(r->replay.advisories_sent, sent);
    EXPECT_EQ(r->replay.advisories_skipped, 3 - sent);
  }
}

// A chat trace on one small GPU: KV leaves the GPU, DRAM and SSD under
// pressure.
std::vector<bench::TraceRecord> ChatTrace() {
  bench::ChatParams p;
  p.models = {"a", "b"};
  p.duration_s = 600;
  p.session_rate = 0.5;
  p.lengths.prompt_mean = 400;
  p.lengths.output_mean = 100;
  return bench::GenerateChat(p);
}

SimConfig ChatGpu(const std::string& mode) {
  SimConfig c;
  c.models = {Model("a", "llama-1b"), Model("b", "llama-3b")};
  c.cluster.gpu_memory_bytes =
      c.models[0].shape.weight_bytes() + c.models[1].shape.weight_bytes() + (2LL << 30);
  c.cluster.dram_bytes = 2LL << 30;
  c.cluster.ssd_bytes = 8LL << 30;
  c.policy.session_kv = *ParseSessionKv(mode);
  return c;
}

EngineModel ChatEngine() {
  std::array<double, kFeatures> k = {1e-3,       2e-5,       1 / 3e12,   1 / 2e12, 1e-7,
                                     1 / 400e12, 1 / 600e12, 1 / 300e12, 0};
  return EngineModel(k, 50e9, 1.05);
}

void CheckChat(const std::string& mode, bool rolling);

TEST(SessionTiersTest, ChatTraceIsDeterministicAndEveryTurnIsAccountedFor) {
  for (const std::string mode : {"tiers", "device", "recompute"}) CheckChat(mode, true);
  CheckChat("tiers", false);
}

void CheckChat(const std::string& mode, bool rolling) {
  SCOPED_TRACE(mode + (rolling ? " rolling" : " lockstep"));
  const std::vector<bench::TraceRecord> trace = ChatTrace();
  int turns = 0;
  for (const auto& rec : trace) turns += rec.is_request();
  SimConfig c = ChatGpu(mode);
  c.policy.rolling_steps = rolling;
  auto a = Simulate(c, ChatEngine(), trace);
  auto b = Simulate(c, ChatEngine(), trace);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status();
  ASSERT_EQ(a->replay.requests.size(), b->replay.requests.size());
  for (size_t i = 0; i < a->replay.requests.size(); ++i) {
    const auto &x = a->replay.requests[i], &y = b->replay.requests[i];
    EXPECT_EQ(x.status, y.status);
    EXPECT_EQ(x.first_token_s, y.first_token_s);
    EXPECT_EQ(x.kv_source, y.kv_source);
  }
  EXPECT_EQ(ToJson(a->stats.sessions), ToJson(b->stats.sessions));
  const SessionKvStats& s = a->stats.sessions;
  EXPECT_EQ(s.turns, turns);
  EXPECT_EQ(s.first_turns + s.next_turns + s.failed + s.not_released, s.turns);
  int by_origin = 0;
  for (const auto& [origin, n] : s.next_by_origin) by_origin += n;
  EXPECT_EQ(by_origin, s.next_turns);
  EXPECT_GT(s.next_turns, s.turns / 2);
  EXPECT_TRUE(bench::Summarize(a->replay, 1.0, 1e9).accounting_ok);
  // The same from the outcomes: a first turn reused nothing, every later
  // completed turn names where its history's KV came from.
  std::map<std::string, int> sources;
  int64_t cached = 0;
  for (const auto& o : a->replay.requests) {
    if (o.session.empty() || o.status != "OK") continue;
    EXPECT_EQ(o.kv_source == "none", o.turn == 1) << o.id << " " << o.kv_source;
    EXPECT_LT(o.cached_tokens, o.prompt_tokens) << o.id;
    if (o.turn > 1) ++sources[o.kv_source];
    cached += o.cached_tokens;
  }
  EXPECT_EQ(cached, s.reused_tokens);
  int device = 0;
  for (const auto& [origin, n] : s.next_by_origin) {
    if (origin == "device" || origin == "advised") {
      device += n;
    } else {
      EXPECT_EQ(sources[origin], n) << origin;
    }
  }
  EXPECT_EQ(sources["device"], device);
  if (mode == "tiers") {
    EXPECT_GT(s.next_by_origin.count("device") + s.next_by_origin.count("advised"), 0u);
    EXPECT_GT(s.next_by_origin.count("host_dram") + s.next_by_origin.count("ssd"), 0u);
    EXPECT_GT(s.advise_prefetched.size(), 0u);
  } else if (mode == "recompute") {
    EXPECT_EQ(s.next_by_origin.at("recomputed"), s.next_turns);
  }
}

TEST(SessionTiersTest, ConfigErrorsNameTheKey) {
  const std::vector<bench::TraceRecord> t = {Turn("t1", "s", 10, 2)};
  SimConfig c = TierGpu(1000, -1, 10);
  auto r = Simulate(c, TierEngine(), t);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cluster.dram_gib"), std::string::npos) << r.status();
  c = TierGpu(1000, 10, -1);
  r = Simulate(c, TierEngine(), t);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cluster.ssd_gib"), std::string::npos) << r.status();
}

TEST(SessionTiersTest, CalibrationCarriesTheLoadRates) {
  const std::string base =
      R"({"memory_bytes": 1, "h2d_bytes_per_s": 1, "activation_ratio": 1,
          "shapes": {"s": {"layers": 1, "hidden": 8, "heads": 1, "kv_heads": 1,
                           "intermediate": 8, "vocab": 8}},
          "points": [{"shape": "s", "prefill_tokens": 8, "ms": 1}])";
  auto none = ParseCalibration(base + "}", "c.json");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->kv_rates.ssd_bytes_per_s, KvLinkRates{}.ssd_bytes_per_s);
  auto set = ParseCalibration(base + R"(, "kv_tiers": {"ssd_load_bytes_per_s": 7e9}})", "c.json");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->kv_rates.ssd_bytes_per_s, 7e9);
  EXPECT_EQ(set->kv_rates.dram_bytes_per_s, KvLinkRates{}.dram_bytes_per_s);
  auto bad = ParseCalibration(base + R"(, "kv_tiers": {"ssd_load_bytes_per_s": 0}})", "c.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("c.json: kv_tiers.ssd_load_bytes_per_s"), std::string::npos)
      << bad.status();
  // The committed calibrations record their hosts' bench-tiers figures:
  // the H100's from issue 16 (the defaults), the H200's from 2026-11-30.
  struct Want {
    const char* card;
    double dram, ssd, peer;
  };
  for (const Want& w :
       {Want{"h100", 35.5e9, 0.943e9, 1.25e9}, Want{"h200", 35.619e9, 1.596e9, 1.329e9}}) {
    SCOPED_TRACE(w.card);
    auto c = ReadCalibration(std::string(BALLAST_SOURCE_DIR) + "/configs/sim/calibration-" +
                             w.card + ".json");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->kv_rates.dram_bytes_per_s, w.dram);
    EXPECT_EQ(c->kv_rates.ssd_bytes_per_s, w.ssd);
    EXPECT_EQ(c->kv_rates.peer_bytes_per_s, w.peer);
    EXPECT_FALSE(c->kv_rates_source.empty());
  }
}

}  // namespace
}  // namespace ballast::sim
