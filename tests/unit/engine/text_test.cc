// Tokenizer, streaming UTF-8 detokenization, stop strings and sampling.
#include <map>

#include "engine/generation.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "gtest/gtest.h"

namespace ballast::engine {
namespace {

std::string DecodeAll(const std::vector<int>& ids) {
  ByteTokenizer tok;
  StreamDecoder d(&tok);
  std::string out;
  for (int id : ids) out += d.Push(id);
  return out + d.Flush();
}

TEST(StreamDecoder, HoldsBackIncompleteCharacters) {
  ByteTokenizer tok;
  StreamDecoder d(&tok);
  const std::string euro = "\xE2\x82\xAC";  // €
  EXPECT_EQ(d.Push(0xE2), "");
  EXPECT_EQ(d.Push(0x82), "");
  EXPECT_EQ(d.Push(0xAC), euro);
  EXPECT_EQ(d.Push('a'), "a");
  EXPECT_EQ(d.Push(ByteTokenizer::kEos), "");  // special tokens decode to nothing
}

TEST(StreamDecoder, ReplacesInvalidBytes) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(DecodeAll({0xFF, 'a'}), fffd + "a");
  EXPECT_EQ(DecodeAll({0xE2, 'a'}), fffd + "a");                 // broken sequence
  EXPECT_EQ(DecodeAll({0xED, 0xA0, 0x80}), fffd + fffd + fffd);  // surrogate
  EXPECT_EQ(DecodeAll({0xE2, 0x82}), fffd);                      // truncated at the end
  ByteTokenizer tok;
  const std::string s = "héllo wörld";
  EXPECT_EQ(DecodeAll(tok.Encode(s)), s);
}

TEST(OutputText, StopStringsAreCutAndHeldBack) {
  ByteTokenizer tok;
  OutputText out(&tok, {"END", "\n\n"});
  std::string streamed;
  bool stopped = false;
  for (char c : std::string("abcEN")) {
    streamed += out.Add(static_cast<unsigned char>(c), &stopped);
    ASSERT_FALSE(stopped);
  }
  EXPECT_EQ(streamed, "abc");  // "EN" held back: it may start "END"
  streamed += out.Add('D', &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(streamed, "abc");
  EXPECT_EQ(out.released(), "abc");
}

TEST(OutputText, HeldBackTextIsReleasedWhenItDoesNotMatch) {
  ByteTokenizer tok;
  OutputText out(&tok, {"END"});
  bool stopped = false;
  std::string s = out.Add('E', &stopped);
  s += out.Add('x', &stopped);
  EXPECT_EQ(s, "Ex");
  s += out.Add('E', &stopped);
  s += out.Finish();
  EXPECT_EQ(s, "ExE");
  EXPECT_FALSE(stopped);
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  std::mt19937_64 rng(1);
  const float logits[] = {0.5f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(SampleToken(logits, 4, {}, rng), 1);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  std::mt19937_64 rng(1);
  const float logits[] = {0.5f, 1.0f, 3.0f, 2.9f};
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(SampleToken(logits, 4, {1.0f, 1.0f, 1}, rng), 2);
    EXPECT_EQ(SampleToken(logits, 4, {1.0f, 0.01f, 0}, rng), 2);
  }
}

TEST(Sampler, SeedsAreReproducibleAndTopKRestricts) {
  std::vector<float> logits(50, 0.0f);
  std::mt19937_64 a(42), b(42);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(SampleToken(logits.data(), 50, {1.0f, 1.0f, 0}, a),
              SampleToken(logits.data(), 50, {1.0f, 1.0f, 0}, b));
  }
  logits[7] = 1.0f;
  logits[9] = 1.0f;
  for (int i = 0; i < 100; ++i) {
    const int t = SampleToken(logits.data(), 50, {1.0f, 1.0f, 2}, a);
    EXPECT_TRUE(t == 7 || t == 9);
  }
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  // p = softmax([0, ln 3]) = [0.25, 0.75]; with top_p = 0.7 only token 1 stays.
  const float logits[] = {0.0f, std::log(3.0f)};
  std::mt19937_64 rng(3);
  int ones = 0;
  constexpr int kN = 20000;
  for (int i = 0; i < kN; ++i) ones += SampleToken(logits, 2, {1.0f, 1.0f, 0}, rng);
  EXPECT_NEAR(static_cast<double>(ones) / kN, 0.75, 0.015);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(SampleToken(logits, 2, {1.0f, 0.7f, 0}, rng), 1);
  // Temperature 0.5 squares the odds: 9:1.
  ones = 0;
  for (int i = 0; i < kN; ++i) ones += SampleToken(logits, 2, {0.5f, 1.0f, 0}, rng);
  EXPECT_NEAR(static_cast<double>(ones) / kN, 0.9, 0.01);
}

}  // namespace
}  // namespace ballast::engine
