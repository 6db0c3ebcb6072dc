// Pieces of the tokenizer.json implementation on small hand-written
// tokenizers (no files needed): errors name the file and the key, BPE merge
// order, unk handling, decoder position rules, regex translation, UTF-8.
#include <filesystem>
#include <fstream>

#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/utf8.h"
#include "gtest/gtest.h"

namespace ballast::tokenizer {
namespace {

using nlohmann::json;

// A tiny character-level BPE tokenizer.json.
json Tiny() {
  return json::parse(R"({
    "version": "1.0", "added_tokens": [
      {"id": 0, "content": "<s>", "special": true, "normalized": false,
       "lstrip": false, "rstrip": false, "single_word": false}],
    "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
    "model": {"type": "BPE", "unk_token": null, "byte_fallback": false, "fuse_unk": false,
      "vocab": {"<s>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "bc": 5, "abc": 6, "<unk>": 7},
      "merges": ["b c", "a b", "a bc"]}})");
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> Build(const json& t, const json& config = json()) {
  return HfTokenizer::FromJson(t, config, json(), json(), "/ckpt");
}

// The error Build gives after `patch` (a JSON pointer and a value).
std::string ErrorAfter(const std::string& pointer, const json& value) {
  json t = Tiny();
  t[json::json_pointer(pointer)] = value;
  auto r = Build(t);
  return r.ok() ? "ok" : std::string(r.status().message());
}

TEST(HfTokenizerErrors, NameTheFileAndTheKey) {
  EXPECT_EQ(ErrorAfter("/pre_tokenizer", json::parse(R"({"type": "Split",
              "pattern": {"String": " "}, "behavior": "Foo", "invert": false})")),
            "/ckpt/tokenizer.json: pre_tokenizer.behavior: unknown behavior \"Foo\" (expected "
            "Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
  EXPECT_EQ(ErrorAfter("/pre_tokenizer", json::parse(R"({"type": "Sequence", "pretokenizers":
              [{"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}]})"))
                .rfind("/ckpt/tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex: regex "
                       "\"(unclosed\" does not compile",
                       0),
            0u);
  EXPECT_EQ(ErrorAfter("/model/merges/1", "a  b"),
            "/ckpt/tokenizer.json: model.merges[1]: expected \"a b\" (two tokens separated by "
            "one space)");
  EXPECT_EQ(ErrorAfter("/model/merges/0", json::array({"b", "zz"})),
            "/ckpt/tokenizer.json: model.merges[0]: token \"zz\" is not in model.vocab");
  EXPECT_EQ(ErrorAfter("/model/vocab/a", "one"),
            "/ckpt/tokenizer.json: model.vocab.a: expected a non-negative integer id");
  // An id far past the entry count would size a table of that many
  // tokens (a fuzzed file asked for 2 GB): refused.
  EXPECT_EQ(ErrorAfter("/model/vocab/a", 1 << 29)
                .rfind("/ckpt/tokenizer.json: model.vocab.a: id 536870912 is far past the ", 0),
            0u);
  EXPECT_EQ(ErrorAfter("/decoder", json::parse(R"({"type": "Strip", "content": "ab"})")),
            "/ckpt/tokenizer.json: decoder.content: expected a single character");
  EXPECT_EQ(ErrorAfter("/added_tokens/0/special", "yes"),
            "/ckpt/tokenizer.json: added_tokens[0].special: expected true or false");
  EXPECT_EQ(ErrorAfter("/model/vocab", json::array()),
            "/ckpt/tokenizer.json: model.vocab: expected an object");
  json t = Tiny();
  t["normalizer"] = {{"type", "Precompiled"}};
  EXPECT_EQ(Build(t).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Build(t).status().message(),
            "/ckpt/tokenizer.json: normalizer.type: normalizer \"Precompiled\" is not supported");
  t = Tiny();
  t["model"]["type"] = "Unigram";
  EXPECT_EQ(Build(t).status().code(), absl::StatusCode::kUnimplemented);
  auto config = Build(Tiny(), {{"eos_token", "</s>"}});
  EXPECT_EQ(config.status().message(),
            "/ckpt/tokenizer_config.json: eos_token: \"</s>\" is not in tokenizer.json's "
            "vocabulary");
  auto bad = Build(Tiny(), {{"bos_token", 7}});
  EXPECT_EQ(bad.status().message(),
            "/ckpt/tokenizer_config.json: bos_token: expected a token string, {\"content\": ...} "
            "or null");
}

TEST(HfTokenizerErrors, LoadNamesUnreadableAndInvalidFiles) {
  EXPECT_EQ(HfTokenizer::Load("/nonexistent").status().code(), absl::StatusCode::kNotFound);
  const std::string dir = ::testing::TempDir() + "/tok_invalid";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << "{not json";
  EXPECT_EQ(HfTokenizer::Load(dir).status().message(), dir + "/tokenizer.json: not valid JSON");
}

TEST(Bpe, LowestRankFirstThenLeftmost) {
  auto t = Build(Tiny());
  ASSERT_TRUE(t.ok()) << t.status();
  // "b c" (rank 0) beats "a b" (rank 1); then "a bc" (rank 2).
  EXPECT_EQ((*t)->Encode("abc"), std::vector<int>({6}));
  EXPECT_EQ((*t)->Encode("abab"), std::vector<int>({4, 4}));
  EXPECT_EQ((*t)->Encode("<s>ab"), std::vector<int>({0, 4}));
  // Unknown characters without unk_token are dropped (as in tokenizers), so
  // their neighbours can merge.
  EXPECT_EQ((*t)->Encode("axb"), std::vector<int>({4}));
  json u = Tiny();
  u["model"]["unk_token"] = "<unk>";
  u["model"]["fuse_unk"] = true;
  EXPECT_EQ((*Build(u))->Encode("axyb"), std::vector<int>({1, 7, 2}));
  u["model"]["fuse_unk"] = false;
  EXPECT_EQ((*Build(u))->Encode("axyb"), std::vector<int>({1, 7, 7, 2}));
  // Without a decoder, tokens are joined with spaces.
  EXPECT_EQ((*t)->Decode({4, 3}, false), "ab c");
}

TEST(Decoder, StripAfterFuseStripsTheWholeText) {
  json t = Tiny();
  t["model"]["vocab"]["_"] = 8;
  t["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "_"}, "content": " "}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 1}]})");
  auto tok = Build(t);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<int> ids = {8, 8, 1, 8, 2, 8};  // "  a b "
  EXPECT_EQ((*tok)->Decode(ids, false), " a b");
  std::string streamed;
  auto s = (*tok)->NewDecodeStream(false);
  for (int id : ids) s->Push(id, &streamed);
  s->Finish(&streamed);
  EXPECT_EQ(streamed, " a b");
}

TEST(Regex, WhiteSpaceIsUnicodeWhiteSpace) {
  auto re = Regex::Compile(R"(\s+|[^\s]+)");
  ASSERT_TRUE(re.ok());
  std::vector<std::string> parts;
  const std::string s = "a\u180e b\u3000c";  // U+180E is not White_Space
  (*re)->ForEachMatch(s, [&](size_t a, size_t b) { parts.push_back(s.substr(a, b - a)); });
  EXPECT_EQ(parts, std::vector<std::string>({"a\u180e", " ", "b", "\u3000", "c"}));
  EXPECT_EQ(Regex::Translate(R"([^\s\p{L}])"),
            R"([^\t\n\x0B\f\r\x20\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029})"
            R"(\x{202F}\x{205F}\x{3000}\p{L}])");
  auto lit = Regex::Literal("a.b\\E(");
  ASSERT_TRUE(lit.ok());
  int n = 0;
  (*lit)->ForEachMatch("xa.b\\E(y a_b", [&](size_t, size_t) { ++n; });
  EXPECT_EQ(n, 1);
}

TEST(Utf8, ReplacesMaximalSubparts) {
  EXPECT_EQ(SanitizeUtf8("a\xE4\xBD"
                         "b\xFF\xED\xA0\x80"),
            "a\uFFFD"
            "b\uFFFD\uFFFD\uFFFD\uFFFD");
  Utf8Sanitizer s;
  EXPECT_EQ(s.Push("\xE4"), "");
  EXPECT_EQ(s.Push("\xBD"), "");
  EXPECT_EQ(s.Push("\xA0!"), "\u4F60!");
  EXPECT_EQ(s.Push("\xF0\x9F"), "");
  EXPECT_EQ(s.Finish(), "\uFFFD");
  EXPECT_TRUE(IsValidUtf8Prefix("a\xE4\xBD"));
  EXPECT_FALSE(IsValidUtf8Prefix("a\xE4\x41"));
}

}  // namespace
}  // namespace ballast::tokenizer
