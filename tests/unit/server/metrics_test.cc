// Metrics label cardinality: only models a source knows get their own
// `model` label value; every other name counts under "unknown".
#include "server/metrics.h"

#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace ballast::server {
namespace {

std::string Scrape(const Metrics& m) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, m.registry()->Collect());
  return out.str();
}

TEST(Metrics, UnknownModelsShareOneLabelValue) {
  Metrics m;
  m.AddModelSource([](const std::string& name) { return name == "real"; });
  m.SchedulerRequest({.model = "real", .status = "OK", .ttft_s = 0.1, .tpot_s = 0.01, .tokens = 3});
  const size_t before = Scrape(m).size();
  for (int i = 0; i < 50; ++i) {
    m.SchedulerRequest({.model = absl::StrCat("junk-", i),
                        .status = "NOT_FOUND",
                        .ttft_s = -1,
                        .tpot_s = -1,
                        .tokens = 0});
    m.NodeRequest({.model = absl::StrCat("junk-", i),
                   .status = "NOT_FOUND",
                   .ttft_s = -1,
                   .tpot_s = -1,
                   .tokens = 0});
  }
  const std::string text = Scrape(m);
  EXPECT_EQ(text.find("junk-"), std::string::npos);
  EXPECT_NE(text.find("model=\"real\""), std::string::npos);
  EXPECT_NE(text.find("model=\"unknown\""), std::string::npos);
  // Two new series (scheduler and node requests_total for "unknown").
  EXPECT_LT(text.size(), before + 600) << text;
}

TEST(Metrics, TenantsGetLabelsOnlyWhenKnown) {
  Metrics m;
  m.SetTenantSource([](const std::string& t) { return t == "acme"; });
  EXPECT_EQ(m.TenantLabel(""), "default");
  EXPECT_EQ(m.TenantLabel("acme"), "acme");
  EXPECT_EQ(m.TenantLabel("invented-1"), "other");
  for (int i = 0; i < 20; ++i) {
    m.SchedulerRequest({.model = "m", .status = "OK", .tenant = absl::StrCat("junk-", i)});
  }
  m.SchedulerRequest({.model = "m", .status = "RESOURCE_EXHAUSTED", .tenant = "acme"});
  const std::string text = Scrape(m);
  EXPECT_EQ(text.find("junk-"), std::string::npos);
  EXPECT_NE(text.find("ballast_scheduler_tenant_requests_total{status=\"OK\",tenant=\"other\"} 20"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tenant=\"acme\""), std::string::npos);
}

TEST(Metrics, ModelLabelAsksEverySource) {
  Metrics m;
  EXPECT_EQ(m.ModelLabel("a"), "unknown");
  m.AddModelSource([](const std::string& name) { return name == "a"; });
  m.AddModelSource([](const std::string& name) { return name == "b"; });
  EXPECT_EQ(m.ModelLabel("a"), "a");
  EXPECT_EQ(m.ModelLabel("b"), "b");
  EXPECT_EQ(m.ModelLabel("c"), "unknown");
}

// The per-step host time histogram: each scrape of the gauges adds what a
// device's cumulative histogram grew by, into the same buckets.
TEST(Metrics, StepHostTimeIsObservedFromTheDevicesCumulativeHistogram) {
  Metrics m;
  DeviceGauges g;
  g.device = "cuda:0";
  g.step_host.Add(30e-6);  // (25, 50] us
  g.step_host.Add(30e-6);
  g.step_host.Add(3e-3);  // (2, 5] ms
  m.SetDevice(g);
  m.SetDevice(g);          // no growth: nothing observed twice
  g.step_host.Add(80e-3);  // beyond the last bound
  m.SetDevice(g);
  const std::string text = Scrape(m);
  auto has = [&](const std::string& line) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  };
  has("ballast_node_step_host_seconds_count{device=\"cuda:0\"} 4");
  has("ballast_node_step_host_seconds_bucket{device=\"cuda:0\",le=\"2.5e-05\"} 0");
  has("ballast_node_step_host_seconds_bucket{device=\"cuda:0\",le=\"5e-05\"} 2");
  has("ballast_node_step_host_seconds_bucket{device=\"cuda:0\",le=\"0.005\"} 3");
  has("ballast_node_step_host_seconds_bucket{device=\"cuda:0\",le=\"0.05\"} 3");
  has("ballast_node_step_host_seconds_bucket{device=\"cuda:0\",le=\"+Inf\"} 4");
}

// The step thread's cumulative time by activity, the device's steps by how
// they began, its KV reclaims by result and its drains by cause become
// counters that grow by what they grew.
TEST(Metrics, StepThreadTimeAndStepStartsAreCountedByKind) {
  Metrics m;
  DeviceGauges g;
  g.device = "cuda:0";
  g.step_thread.begin_s = 0.25;
  g.step_thread.idle_s = 2;
  g.step_starts.alone = 3;
  g.step_starts.ahead = 10;
  g.kv_reclaims.nothing = 4;
  g.step_drains.lender = 5;
  m.SetDevice(g);
  m.SetDevice(g);  // no growth: nothing counted twice
  g.step_thread.begin_s = 0.75;
  g.step_thread.finish_s = 0.5;
  g.step_starts.ahead = 25;
  g.step_starts.late = 2;
  g.kv_reclaims.asked = 1;
  g.kv_reclaims.nothing = 9;
  g.step_drains.lender = 7;
  g.step_drains.shed = 3;
  g.step_drains.remap = 1;
  m.SetDevice(g);
  const std::string text = Scrape(m);
  auto has = [&](const std::string& line) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  };
  has("ballast_node_step_thread_seconds_total{activity=\"begin\",device=\"cuda:0\"} 0.75");
  has("ballast_node_step_thread_seconds_total{activity=\"finish\",device=\"cuda:0\"} 0.5");
  has("ballast_node_step_thread_seconds_total{activity=\"idle\",device=\"cuda:0\"} 2");
  has("ballast_node_steps_total{device=\"cuda:0\",start=\"alone\"} 3");
  has("ballast_node_steps_total{device=\"cuda:0\",start=\"ahead\"} 25");
  has("ballast_node_steps_total{device=\"cuda:0\",start=\"late\"} 2");
  has("ballast_node_kv_reclaims_total{device=\"cuda:0\",result=\"asked\"} 1");
  has("ballast_node_kv_reclaims_total{device=\"cuda:0\",result=\"nothing\"} 9");
  has("ballast_node_step_drains_total{cause=\"lender\",device=\"cuda:0\"} 7");
  has("ballast_node_step_drains_total{cause=\"shed\",device=\"cuda:0\"} 3");
  has("ballast_node_step_drains_total{cause=\"remap\",device=\"cuda:0\"} 1");
  EXPECT_EQ(text.find("cause=\"reclaim\""), std::string::npos);  // never grew
}

// The device's arbitration: decisions, refusals and urgent steps count by
// what they grew (an engine restart's lower totals count nothing); the
// requests the last decision expects late are a gauge.
TEST(Metrics, ArbitrationIsCountedPerDevice) {
  Metrics m;
  DeviceGauges g;
  g.device = "cuda:0";
  g.arbitration.decisions = 10;
  g.arbitration.rejected = 1;
  g.arbitration.expected_late = 4;
  g.arbitration.urgent_steps = 6;
  m.SetDevice(g);
  m.SetDevice(g);  // no growth: nothing counted twice
  g.arbitration.decisions = 25;
  g.arbitration.expected_late = 2;
  g.arbitration.urgent_steps = 9;
  m.SetDevice(g);
  const std::string text = Scrape(m);
  auto has = [&](const std::string& line) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  };
  has("ballast_node_arbitration_decisions_total{device=\"cuda:0\"} 25");
  has("ballast_node_arbitration_rejected_total{device=\"cuda:0\"} 1");
  has("ballast_node_arbitration_expected_late{device=\"cuda:0\"} 2");
  has("ballast_node_urgent_steps_total{device=\"cuda:0\"} 9");
}

// SLO attainment: each finished request is met or missed against its own
// targets; a failure misses; a cancelled request and a one-token TPOT are
// not judged.
TEST(Metrics, SloAttainmentJudgesEachRequestAgainstItsTargets) {
  Metrics m;
  m.AddModelSource([](const std::string&) { return true; });
  auto req = [](const char* status, double ttft, double tpot) {
    return RequestOutcome{.model = "a",
                          .status = status,
                          .ttft_s = ttft,
                          .tpot_s = tpot,
                          .tokens = 4,
                          .slo_ttft_s = 1.0,
                          .slo_tpot_s = 0.1};
  };
  m.SchedulerRequest(req("OK", 0.5, 0.05));         // ttft met, tpot met
  m.SchedulerRequest(req("OK", 2.0, 0.2));          // both missed
  m.SchedulerRequest(req("OK", 0.5, -1));           // ttft met, tpot not judged
  m.SchedulerRequest(req("UNAVAILABLE", -1, -1));   // both missed
  m.SchedulerRequest(req("CANCELLED", 0.1, 0.01));  // not judged
  m.SchedulerRequest({.model = "a", .status = "OK", .ttft_s = 9, .tpot_s = 9});  // no SLO
  const std::string text = Scrape(m);
  auto count = [&](const char* slo, const char* result) {
    const std::string key =
        absl::StrCat("ballast_scheduler_slo_requests_total{model=\"a\",result=\"", result,
                     "\",slo=\"", slo, "\"} ");
    const size_t at = text.find(key);
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + key.size()));
  };
  EXPECT_EQ(count("ttft", "met"), 2) << text;
  EXPECT_EQ(count("ttft", "missed"), 2);
  EXPECT_EQ(count("tpot", "met"), 1);
  EXPECT_EQ(count("tpot", "missed"), 2);
}

// Activation times by weight source, queue times, evictions by model.
TEST(Metrics, ActivationsQueueTimesAndEvictionsAreRecordedPerModel) {
  Metrics m;
  m.AddModelSource([](const std::string& name) { return name == "a"; });
  m.Activation("a", "host_copy", 0.3);
  m.Activation("a", "disk", 2.0);
  m.NodeRequest({.model = "a", .status = "OK", .tokens = 1, .queue_s = 0.02});
  m.NodeRequest({.model = "a", .status = "UNAVAILABLE"});  // never admitted: no queue time
  m.Eviction(m.ModelLabel("a"));
  const std::string text = Scrape(m);
  for (const char* series :
       {"ballast_node_activation_seconds_count{model=\"a\",source=\"host_copy\"} 1",
        "ballast_node_activation_seconds_count{model=\"a\",source=\"disk\"} 1",
        "ballast_node_queue_seconds_count{model=\"a\"} 1",
        "ballast_node_evictions_total{model=\"a\"} 1"}) {
    EXPECT_NE(text.find(series), std::string::npos) << series << "\n" << text;
  }
}

// Memory by model: weights, KV and workspace per resident model and device; a model
// that leaves the device loses its series (no stale gauges).
TEST(Metrics, ModelMemoryFollowsTheResidentModels) {
  Metrics m;
  m.AddModelSource([](const std::string& name) { return name == "a" || name == "b"; });
  DeviceGauges g;
  g.device = "cuda:0";
  g.model_memory = {{"a", 1000, 64, 300}, {"b", 2000, 0, 500}};
  m.SetDevice(g);
  std::string text = Scrape(m);
  for (const char* line :
       {R"(ballast_node_model_memory_bytes{device="cuda:0",kind="weights",model="a"} 1000)",
        R"(ballast_node_model_memory_bytes{device="cuda:0",kind="kv",model="a"} 64)",
        R"(ballast_node_model_memory_bytes{device="cuda:0",kind="workspace",model="a"} 300)",
        R"(ballast_node_model_memory_bytes{device="cuda:0",kind="weights",model="b"} 2000)"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
  g.model_memory = {{"b", 2000, 128, 500}};  // "a" was evicted
  m.SetDevice(g);
  text = Scrape(m);
  EXPECT_EQ(text.find(R"(model="a")"), std::string::npos) << text;
  EXPECT_NE(
      text.find(R"(ballast_node_model_memory_bytes{device="cuda:0",kind="kv",model="b"} 128)"),
      std::string::npos)
      << text;
}

// Preemptions per model and cause: the device's cumulative counts become
// counter increments; a count that fell (a reloaded model starts again at
// 0) is a new start, from which only growth counts.
TEST(Metrics, ModelPreemptionsAreCountedByCause) {
  Metrics m;
  m.AddModelSource([](const std::string& name) { return name == "a"; });
  DeviceGauges g;
  g.device = "cuda:0";
  g.model_preemptions = {{"a", 3, 1, 2}};
  m.SetDevice(g);
  m.SetDevice(g);  // no growth: nothing counted twice
  g.model_preemptions = {{"a", 5, 1, 4}};
  m.SetDevice(g);
  g.model_preemptions = {{"a", 1, 0, 0}};  // reloaded: counts from 0 again
  m.SetDevice(g);
  g.model_preemptions = {{"a", 2, 0, 0}};
  m.SetDevice(g);
  const std::string text = Scrape(m);
  for (const char* line :
       {R"(ballast_node_model_preemptions_total{cause="growth",device="cuda:0",model="a"} 6)",
        R"(ballast_node_model_preemptions_total{cause="kv",device="cuda:0",model="a"} 1)",
        R"(ballast_node_model_preemptions_total{cause="weights",device="cuda:0",model="a"} 4)"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
}

// The leadership gauge: no series until a scheduler sets it (a node
// exports none), then one unlabelled series that follows the last call.
TEST(Metrics, LeaderGaugeFollowsTheElection) {
  Metrics m;
  EXPECT_EQ(Scrape(m).find("\nballast_scheduler_leader "), std::string::npos) << Scrape(m);
  m.SetLeader(false);  // a standby, campaigning
  std::string text = Scrape(m);
  EXPECT_NE(text.find("\nballast_scheduler_leader 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE ballast_scheduler_leader gauge"), std::string::npos) << text;
  m.SetLeader(true);  // won
  text = Scrape(m);
  EXPECT_NE(text.find("\nballast_scheduler_leader 1\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("\nballast_scheduler_leader 0\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace ballast::server
