// Recorded steps against the engine model (sim/step_replay.h): the CSV
// parser takes its columns in any order and names the file, line and
// column of a bad value; the comparison groups steps by kind and sums the
// model's predictions, computed here by hand from known coefficients.
#include "sim/step_replay.h"

#include <gtest/gtest.h>

#include <string>

namespace ballast::sim {
namespace {

TEST(StepReplay, ParsesColumnsInAnyOrderAndNamesBadValues) {
  auto steps = ParseRecordedSteps(
      "ms,prefill_logits,prefill_attention,prefill_tokens,decode_context,decode_tokens,extra\n"
      "12.5,0,0,0,2000,10,x\n"
      "30,2,5000,100,0,0,y\n",
      "s.csv");
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ((*steps)[0].work.decode_tokens, 10);
  EXPECT_EQ((*steps)[0].work.decode_context, 2000);
  EXPECT_EQ((*steps)[0].ms, 12.5);
  EXPECT_EQ((*steps)[1].work.prefill_tokens, 100);
  EXPECT_EQ((*steps)[1].work.prefill_attention, 5000);
  EXPECT_EQ((*steps)[1].work.prefill_logits, 2);

  auto no_ms = ParseRecordedSteps(
      "decode_tokens,decode_context,prefill_tokens,prefill_attention,prefill_logits\n1,5,0,0,0\n",
      "p.csv");
  ASSERT_TRUE(no_ms.ok()) << no_ms.status();
  EXPECT_LT((*no_ms)[0].ms, 0);  // predicted only

  auto missing = ParseRecordedSteps("decode_tokens,ms\n1,2\n", "m.csv");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("decode_context"), std::string::npos);
  // Blank lines and CRLF endings: skipped, but counted in the line named.
  auto bad = ParseRecordedSteps(
      "decode_tokens,decode_context,prefill_tokens,prefill_attention,prefill_logits,ms\r\n"
      "\r\n"
      "1,5,0,0,0,3\r\n"
      "\n"
      "1,five,0,0,0,3\r\n",
      "b.csv");
  ASSERT_FALSE(bad.ok());
  const std::string msg(bad.status().message());
  EXPECT_NE(msg.find("b.csv line 5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("decode_context"), std::string::npos) << msg;
  const std::string header =
      "decode_tokens, decode_context, prefill_tokens, prefill_attention, prefill_logits, ms\n";
  EXPECT_TRUE(ParseRecordedSteps(header + "1, 5, 0, 0, 0, 3\n", "spaces.csv").ok());
  for (const char* row : {"-1,0,0,0,0,1",          // a negative count
                          "1.5,0,0,0,0,1",         // a fraction of a row
                          "1e12,0,0,0,0,1",        // past int
                          "3000000000,0,0,0,0,1",  // past int
                          "1,nan,0,0,0,1",         // not finite
                          "1,5,0,inf,0,1",         // not finite
                          "1,5,0,0,0,nan"}) {      // measured, not finite
    auto r = ParseRecordedSteps(header + row + "\n", "r.csv");
    ASSERT_FALSE(r.ok()) << row;
    EXPECT_NE(std::string(r.status().message()).find("r.csv line 2"), std::string::npos) << row;
  }
  auto twice = ParseRecordedSteps(
      "ms,decode_tokens,decode_context,prefill_tokens,prefill_attention,prefill_logits,ms\n",
      "t.csv");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(std::string(twice.status().message()).find("twice"), std::string::npos);
}

TEST(StepReplay, GroupsStepsAndSumsThePredictions) {
  // k0 = 1 ms per step and k4 = 1 us per decode row and layer: a step of
  // B decodes on a 16-layer shape takes 1 ms + 16 B us; a prefill step
  // (no decode rows, k6.. zero) 1 ms.
  std::array<double, kFeatures> k{};
  k[0] = 1e-3;
  k[4] = 1e-6;
  const EngineModel model(k, 50e9, 1.0);
  const ModelShape shape = *NamedShape("llama-1b");  // 16 layers
  std::vector<RecordedStep> steps = {
      {{10, 1000, 0, 0, 0}, 1.16},   // decode 1-32: predicted 1.16 ms
      {{10, 1000, 0, 0, 0}, 2.32},   // measured twice the prediction
      {{100, 10000, 0, 0, 0}, 2.6},  // decode 33-128: 2.6 ms
      {{0, 0, 64, 2080, 1}, 2.0},    // with prefill: 1 ms
      {{600, 60000, 0, 0, 0}, -1},   // not measured: left out
  };
  auto groups = CompareSteps(model, shape, steps);
  ASSERT_EQ(groups.size(), 4u);  // 1-32, 33-128, with prefill, all
  EXPECT_EQ(groups[0].name, "decode 1-32");
  EXPECT_EQ(groups[0].steps, 2);
  EXPECT_NEAR(groups[0].median_error, (0 - 0.5) / 2, 1e-9);  // errors 0 and -0.5: their mean
  EXPECT_NEAR(groups[0].measured_ms, 3.48, 1e-9);
  EXPECT_NEAR(groups[0].predicted_ms, 2.32, 1e-9);
  EXPECT_EQ(groups[1].name, "decode 33-128");
  EXPECT_NEAR(groups[1].predicted_ms, 2.6, 1e-9);
  EXPECT_NEAR(groups[1].median_error, 0, 1e-9);
  EXPECT_EQ(groups[2].name, "with prefill");
  EXPECT_NEAR(groups[2].predicted_ms, 1.0, 1e-9);
  EXPECT_NEAR(groups[2].median_error, -0.5, 1e-9);
  EXPECT_EQ(groups[3].name, "all");
  EXPECT_EQ(groups[3].steps, 4);
  EXPECT_NEAR(groups[3].measured_ms, 3.48 + 2.6 + 2.0, 1e-9);
  EXPECT_NEAR(groups[3].predicted_ms, 2.32 + 2.6 + 1.0, 1e-9);
}

}  // namespace
}  // namespace ballast::sim
