// HfTokenizer against Hugging Face `tokenizers` 0.23.2 / transformers 5.17.0
// goldens (tests/data/tokenizers/golden/, make_golden.py) on every corpus
// entry: ids (plain, with special tokens, with special-token parsing off),
// decode with and without skip_special_tokens, streaming decode, and the
// corpus' decode cases. One test per tokenizer: the three real ones (with
// their tokenizer_config.json: transformers' skip set) and the corpus'
// variants (tokenizer.json alone: tokenizers' skip set).
#include <iostream>

#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "tests/unit/tokenizer/golden_util.h"

namespace ballast::tokenizer {
namespace {

using nlohmann::json;
using testing::Corpus;

std::vector<std::string> AllTokenizers() {
  std::vector<std::string> names = Corpus()["tokenizers"].get<std::vector<std::string>>();
  for (const auto& [name, spec] : Corpus()["variants"].items()) names.push_back(name);
  return names;
}

bool IsBase(const std::string& name) {
  for (const auto& n : Corpus()["tokenizers"]) {
    if (n == name) return true;
  }
  return false;
}

std::unique_ptr<HfTokenizer> LoadByName(const std::string& name) {
  if (IsBase(name)) {
    auto t = HfTokenizer::Load(testing::TokenizerDir(name));
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }
  const json& spec = Corpus()["variants"][name];
  const std::string dir = testing::TokenizerDir(spec["base"].get<std::string>());
  json tj = testing::ApplyVariant(testing::ReadJson(dir + "/tokenizer.json"), spec);
  auto t = HfTokenizer::FromJson(tj, json(), json(), json(), dir);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<int> Ids(const json& r, const char* key, const std::vector<int>& dflt) {
  return r.contains(key) ? r[key].get<std::vector<int>>() : dflt;
}
std::string Str(const json& r, const char* key, const std::string& dflt) {
  return r.contains(key) ? r[key].get<std::string>() : dflt;
}

std::string StreamDecode(const HfTokenizer& tok, const std::vector<int>& ids, bool skip) {
  auto stream = tok.NewDecodeStream(skip);
  Utf8Sanitizer utf8;
  std::string text, bytes;
  for (int id : ids) {
    bytes.clear();
    stream->Push(id, &bytes);
    text += utf8.Push(bytes);
  }
  bytes.clear();
  stream->Finish(&bytes);
  text += utf8.Push(bytes);
  return text + utf8.Finish();
}

class HfGolden : public ::testing::TestWithParam<std::string> {};

// Checks decode (whole and streamed) of `ids` against a golden record.
void CheckDecode(const HfTokenizer& tok, const std::vector<int>& ids, const json& r,
                 const std::string& dflt_decode, bool base) {
  const std::string decode = Str(r, "decode", dflt_decode);
  const std::string skip = Str(r, "decode_skip", decode);
  // The real tokenizers use transformers' skip set (tokenizer_config.json).
  const std::string want_skip = base ? Str(r, "tf_decode_skip", skip) : skip;
  EXPECT_EQ(tok.Decode(ids, false), decode);
  if (base) {
    EXPECT_EQ(tok.Decode(ids, false), Str(r, "tf_decode", decode));
  }
  EXPECT_EQ(tok.Decode(ids, true), want_skip);
  EXPECT_EQ(StreamDecode(tok, ids, false), decode);
  EXPECT_EQ(StreamDecode(tok, ids, true), want_skip);
}

TEST_P(HfGolden, MatchesHuggingFace) {
  const std::string name = GetParam();
  const bool base = IsBase(name);
  const json golden = testing::ReadJson(testing::DataDir() + "/golden/" + name + ".json");
  ASSERT_TRUE(golden.is_object());
  std::unique_ptr<HfTokenizer> tok = LoadByName(name);
  ASSERT_NE(tok, nullptr);
  const auto prefix = golden["special_prefix"].get<std::vector<int>>();
  const auto suffix = golden["special_suffix"].get<std::vector<int>>();
  EXPECT_EQ(tok->special_prefix(), prefix);
  EXPECT_EQ(tok->special_suffix(), suffix);
  int identical = 0, round_trips = 0, entries = 0;
  for (const json& e : Corpus()["entries"]) {
    const std::string entry = e["name"];
    SCOPED_TRACE(name + "/" + entry);
    const json& r = golden["entries"][entry];
    const std::string input = testing::EntryBytes(e);
    const std::vector<int> want = r["ids"].get<std::vector<int>>();
    std::vector<int> wrapped = prefix;
    wrapped.insert(wrapped.end(), want.begin(), want.end());
    wrapped.insert(wrapped.end(), suffix.begin(), suffix.end());
    const std::vector<int> got = tok->Encode(input);
    EXPECT_EQ(got, want);
    EXPECT_EQ(tok->Encode(input, {.add_special_tokens = true}), Ids(r, "ids_special", wrapped));
    if (base) {
      EXPECT_EQ(tok->Encode(input, {.add_special_tokens = true}),
                Ids(r, "tf_ids_special", wrapped));
    }
    EXPECT_EQ(tok->Encode(input, {.parse_special = false}), Ids(r, "ids_split_special", want));
    const std::string text = SanitizeUtf8(input);
    CheckDecode(*tok, want, r, text, base);
    ++entries;
    identical += got == want;
    round_trips += tok->Decode(got, false) == text;
  }
  for (const json& c : Corpus()["decode_cases"]) {
    const std::string cname = c["name"];
    SCOPED_TRACE(name + "/decode_case/" + cname);
    const json& r = golden["decode_cases"][cname];
    ASSERT_TRUE(r.contains("ids")) << r.dump();
    CheckDecode(*tok, r["ids"].get<std::vector<int>>(), r, "", base);
  }
  std::cout << name << ": " << identical << "/" << entries << " entries give identical ids; "
            << round_trips << " round-trip decode(encode(x)) == x\n";
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, HfGolden, ::testing::ValuesIn(AllTokenizers()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (ch == '-') ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace ballast::tokenizer
