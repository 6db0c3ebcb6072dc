// `ballast trace import`'s parsers on small fixtures written from the
// documented columns of each format: arrivals, lengths, model mapping in
// order of first appearance, the window and the scales, BurstGPT's failed
// rows, Mooncake's shared prefixes, CSV quoting and CRLF, and errors that
// name the file, the line and the column or field.
#include "bench/trace_import.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ballast::bench {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TraceImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("trace_import_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  static ImportOptions Options(ImportFormat f, std::vector<std::string> inputs,
                               std::vector<std::string> models = {"a", "b", "c"}) {
    ImportOptions o;
    o.format = f;
    o.inputs = std::move(inputs);
    o.models = std::move(models);
    return o;
  }
  // The import's error message (the test fails if it succeeds).
  static std::string Error(const ImportOptions& o) {
    auto r = ImportTrace(o);
    EXPECT_FALSE(r.ok());
    return r.ok() ? "" : std::string(r.status().message());
  }

  fs::path dir_;
};

const char kAzureHeader[] = "TIMESTAMP,ContextTokens,GeneratedTokens\n";

TEST_F(TraceImportTest, AzureArrivalsLengthsAndOrder) {
  // Out of order on purpose: the output is sorted by arrival.
  const std::string f = Write("code.csv", absl::StrCat(kAzureHeader,
                                                       "2023-11-16 18:15:46.6805900,374,44\n"
                                                       "2023-11-16 18:15:50.0000000,100,0\n"
                                                       "2023-11-16 18:15:47.1805900,20,3\n"));
  auto r = ImportTrace(Options(ImportFormat::kAzure, {f}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->records.size(), 3u);
  const auto& t = r->records;
  EXPECT_EQ(t[0].id, "r0");
  EXPECT_EQ(t[1].id, "r1");
  EXPECT_EQ(t[2].id, "r2");
  EXPECT_DOUBLE_EQ(t[0].arrival_s, 0.0);
  EXPECT_NEAR(t[1].arrival_s, 0.5, 1e-9);
  EXPECT_NEAR(t[2].arrival_s, 3.31941, 1e-9);
  EXPECT_EQ(t[0].prompt_tokens, 374);
  EXPECT_EQ(t[0].output_tokens, 44);
  EXPECT_EQ(t[1].prompt_tokens, 20);
  EXPECT_EQ(t[1].output_tokens, 3);
  EXPECT_EQ(t[2].prompt_tokens, 100);
  EXPECT_EQ(t[2].output_tokens, 1);  // 0 generated tokens: sent as 1
  for (const auto& x : t) {
    EXPECT_EQ(x.model, "a");
    EXPECT_TRUE(x.prompt.empty());  // the replayer synthesises prompt_tokens
    EXPECT_EQ(x.ttft_ms, 0u);
    EXPECT_EQ(x.tpot_ms, 0u);
  }
  EXPECT_EQ(r->rows, 3);
  EXPECT_EQ(r->outputs_raised, 1);
  EXPECT_NEAR(r->trace_span_s, 3.31941, 1e-9);
  ASSERT_EQ(r->mapping.size(), 1u);
  EXPECT_EQ(r->mapping[0], std::make_pair(f, std::string("a")));
}

TEST_F(TraceImportTest, AzureFilesAreServicesInInputOrderOnOneClock) {
  // The 2024 release's offsets, columns in another order, other case, and an
  // extra column.
  const std::string code =
      Write("code.csv", absl::StrCat(kAzureHeader, "2024-05-10 00:00:01.5+00:00,10,2\n"));
  const std::string conv = Write("conv.csv",
                                 "generatedtokens,Extra,ContextTokens, TIMESTAMP \n"
                                 "5,x,7,2024-05-10T00:00:00Z\n"
                                 "6,y,8,2024-05-10 00:00:02\n");
  auto r = ImportTrace(Options(ImportFormat::kAzure, {code, conv}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->records.size(), 3u);
  EXPECT_EQ(r->records[0].model, "b");
  EXPECT_DOUBLE_EQ(r->records[0].arrival_s, 0);
  EXPECT_EQ(r->records[0].prompt_tokens, 7);
  EXPECT_EQ(r->records[0].output_tokens, 5);
  EXPECT_EQ(r->records[1].model, "a");
  EXPECT_DOUBLE_EQ(r->records[1].arrival_s, 1.5);
  EXPECT_EQ(r->records[2].model, "b");
  EXPECT_DOUBLE_EQ(r->records[2].arrival_s, 2);
  ASSERT_EQ(r->mapping.size(), 2u);
  EXPECT_EQ(r->mapping[0].first, code);
  EXPECT_EQ(r->mapping[0].second, "a");
  EXPECT_EQ(r->mapping[1].first, conv);
  EXPECT_EQ(r->mapping[1].second, "b");

  const std::string e = Error(Options(ImportFormat::kAzure, {code, conv}, {"only"}));
  EXPECT_THAT(e, HasSubstr("2 input files (one service each) but --models names 1 model (only)"));
}

const char kBurstHeader[] =
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n";

TEST_F(TraceImportTest, BurstGptMapsModelsInOrderOfFirstAppearanceAndSkipsFailures) {
  const std::string f = Write("burst.csv", absl::StrCat(kBurstHeader,
                                                        "5,GPT-4,100,20,120,Conversation log\n"
                                                        "6,ChatGPT,50,0,50,Conversation log\n"
                                                        "7.5,ChatGPT,30,9,39,API log\n"
                                                        "9,GPT-4,10,1,11,API log\n"));
  auto r = ImportTrace(Options(ImportFormat::kBurstGpt, {f}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->records.size(), 3u);
  EXPECT_EQ(r->records[0].model, "a");  // GPT-4 appears first
  EXPECT_DOUBLE_EQ(r->records[0].arrival_s, 0);
  EXPECT_EQ(r->records[0].prompt_tokens, 100);
  EXPECT_EQ(r->records[0].output_tokens, 20);
  EXPECT_EQ(r->records[1].model, "b");
  EXPECT_DOUBLE_EQ(r->records[1].arrival_s, 2.5);
  EXPECT_EQ(r->records[1].prompt_tokens, 30);
  EXPECT_EQ(r->records[1].output_tokens, 9);
  EXPECT_EQ(r->records[2].model, "a");
  EXPECT_DOUBLE_EQ(r->records[2].arrival_s, 4);
  EXPECT_EQ(r->rows, 4);
  EXPECT_EQ(r->failed, 1);
  EXPECT_EQ(r->outside_window, 0);
  ASSERT_EQ(r->mapping.size(), 2u);
  EXPECT_EQ(r->mapping[0], std::make_pair(std::string("GPT-4"), std::string("a")));
  EXPECT_EQ(r->mapping[1], std::make_pair(std::string("ChatGPT"), std::string("b")));

  auto o = Options(ImportFormat::kBurstGpt, {f});
  EXPECT_THAT(FormatImportSummary(o, *r, "out.jsonl"),
              HasSubstr("imported 3 requests into out.jsonl from 1 burstgpt file (4 rows); "
                        "skipped 1 failed (Response tokens 0), 0 outside the window; "));
  EXPECT_THAT(FormatImportSummary(o, *r, "out.jsonl"),
              HasSubstr("; models: GPT-4 -> a, ChatGPT -> b"));

  o.by_log_type = true;
  auto typed = ImportTrace(o);
  ASSERT_TRUE(typed.ok()) << typed.status();
  ASSERT_EQ(typed->mapping.size(), 3u);
  EXPECT_EQ(typed->mapping[0].first, "GPT-4 (Conversation log)");
  EXPECT_EQ(typed->mapping[1].first, "ChatGPT (API log)");
  EXPECT_EQ(typed->mapping[2].first, "GPT-4 (API log)");
  EXPECT_EQ(typed->records[2].model, "c");

  o.models = {"x", "y"};
  EXPECT_THAT(Error(o), HasSubstr("the trace has 3 services (GPT-4 (Conversation log), ChatGPT "
                                  "(API log), GPT-4 (API log)) but --models names 2 (x,y)"));
}

TEST_F(TraceImportTest, BurstGptPartsShareOneClock) {
  const std::string one = Write("1.csv", absl::StrCat(kBurstHeader, "100,ChatGPT,4,4,8,API log\n"));
  const std::string two = Write("2.csv", absl::StrCat(kBurstHeader, "130,GPT-4,4,4,8,API log\n"));
  auto r = ImportTrace(Options(ImportFormat::kBurstGpt, {one, two}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->records.size(), 2u);
  EXPECT_EQ(r->records[1].model, "b");
  EXPECT_DOUBLE_EQ(r->records[1].arrival_s, 30);
}

TEST_F(TraceImportTest, WindowRebasesArrivalsAndScalesApply) {
  std::string csv = kBurstHeader;
  for (int t = 0; t < 6; ++t) absl::StrAppend(&csv, 10 + t, ",ChatGPT,", 100 * (t + 1), ",7,0,x\n");
  const std::string f = Write("w.csv", csv);
  auto o = Options(ImportFormat::kBurstGpt, {f});
  o.start_s = 1;
  o.duration_s = 3;  // trace seconds 1, 2, 3 (11, 12, 13)
  auto r = ImportTrace(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->records.size(), 3u);
  EXPECT_DOUBLE_EQ(r->records[0].arrival_s, 0);
  EXPECT_DOUBLE_EQ(r->records[1].arrival_s, 1);
  EXPECT_DOUBLE_EQ(r->records[2].arrival_s, 2);
  EXPECT_EQ(r->records[0].prompt_tokens, 200);
  EXPECT_EQ(r->records[2].prompt_tokens, 400);
  EXPECT_EQ(r->outside_window, 3);
  EXPECT_DOUBLE_EQ(r->trace_span_s, 5);
  EXPECT_THAT(FormatImportSummary(o, *r, "o"), HasSubstr("window [1, 4) s of a 5 s trace"));

  o.time_scale = 0.5;
  o.length_scale = 0.1;
  r = ImportTrace(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->records.size(), 3u);
  EXPECT_DOUBLE_EQ(r->records[1].arrival_s, 0.5);
  EXPECT_DOUBLE_EQ(r->records[2].arrival_s, 1.0);
  EXPECT_EQ(r->records[0].prompt_tokens, 20);
  EXPECT_EQ(r->records[0].output_tokens, 1);  // 0.7 rounds to 1
  EXPECT_EQ(r->records[2].prompt_tokens, 40);
  o.length_scale = 0.001;
  r = ImportTrace(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->records[0].prompt_tokens, 1);  // never below 1
  EXPECT_EQ(r->records[0].output_tokens, 1);

  // A window past the end keeps nothing; services outside it take no model.
  o.start_s = 100;
  r = ImportTrace(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->records.empty());
  EXPECT_TRUE(r->mapping.empty());
  EXPECT_EQ(r->outside_window, 6);
}

TEST_F(TraceImportTest, MooncakeSharedHashIdsSharePromptPrefixes) {
  const std::string f =
      Write("mc.jsonl", R"({"timestamp": 0, "input_length": 1200, "output_length": 10, )"
                        R"("hash_ids": [0, 1, 2]})"
                        "\n"
                        R"({"timestamp": 1500, "input_length": 1100, "output_length": 0, )"
                        R"("hash_ids": [0, 1, 5]})"
                        "\n\n"
                        R"({"timestamp": 27, "input_length": 300, "output_length": 4, )"
                        R"("hash_ids": [7]})"
                        "\n"
                        R"({"timestamp": 2000, "input_length": 50, "output_length": 4})"
                        "\n");
  auto r = ImportTrace(Options(ImportFormat::kMooncake, {f}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->records.size(), 4u);
  const auto& a = r->records[0];  // t = 0
  const auto& c = r->records[1];  // t = 27 ms
  const auto& b = r->records[2];  // t = 1500 ms
  EXPECT_DOUBLE_EQ(c.arrival_s, 0.027);
  EXPECT_DOUBLE_EQ(b.arrival_s, 1.5);
  EXPECT_EQ(b.output_tokens, 1);
  ASSERT_EQ(a.prompt.size(), 1200u);
  ASSERT_EQ(b.prompt.size(), 1100u);
  ASSERT_EQ(c.prompt.size(), 300u);
  EXPECT_EQ(a.prompt_tokens, 1200);
  // Blocks 0 and 1 (1024 tokens) are shared; block 2 vs 5 is not.
  EXPECT_EQ(a.prompt.substr(0, 1024), b.prompt.substr(0, 1024));
  EXPECT_NE(a.prompt.substr(1024, 76), b.prompt.substr(1024, 76));
  EXPECT_EQ(a.prompt.substr(0, 512), SynthesizePrompt(512, 0));
  EXPECT_EQ(a.prompt.substr(512, 512), SynthesizePrompt(512, 1));
  EXPECT_EQ(c.prompt, SynthesizePrompt(512, 7).substr(0, 300));
  EXPECT_NE(a.prompt.substr(0, 300), c.prompt);
  // No hash_ids: a length; the replayer synthesises an unshared prompt.
  EXPECT_TRUE(r->records[3].prompt.empty());
  EXPECT_EQ(r->records[3].prompt_tokens, 50);
  EXPECT_EQ(r->rows, 4);
  for (const auto& x : r->records) EXPECT_EQ(x.model, "a");

  // Scaled, the blocks scale too: the sharing stays proportional.
  auto o = Options(ImportFormat::kMooncake, {f});
  o.length_scale = 0.5;
  r = ImportTrace(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->records[0].prompt.size(), 600u);
  ASSERT_EQ(r->records[2].prompt.size(), 550u);
  EXPECT_EQ(r->records[0].prompt.substr(0, 512), r->records[2].prompt.substr(0, 512));
  EXPECT_EQ(r->records[0].prompt.substr(0, 256), SynthesizePrompt(256, 0));
  EXPECT_NE(r->records[0].prompt.substr(512, 38), r->records[2].prompt.substr(512, 38));
}

TEST_F(TraceImportTest, BlockPromptPadsWithItsOwnTail) {
  EXPECT_EQ(BlockPrompt({3}, 10, 4, 99), SynthesizePrompt(4, 3) + SynthesizePrompt(6, 99));
  EXPECT_EQ(BlockPrompt({3, 4}, 6, 4, 99),
            SynthesizePrompt(4, 3) + SynthesizePrompt(4, 4).substr(0, 2));
  EXPECT_EQ(BlockPrompt({}, 5, 4, 99), SynthesizePrompt(5, 99));
}

TEST_F(TraceImportTest, CsvQuotedFieldsCrlfAndByteOrderMark) {
  const std::string f =
      Write("q.csv",
            "\xEF\xBB\xBF"
            "Timestamp,\"Model\",Request tokens,Response tokens,Total tokens,Log Type\r\n"
            "1,\"GPT-4\",\"12\",3,15,\"API \"\"beta\"\", log\"\r\n"
            "\r\n"
            "2,ChatGPT,4,5,9,\"two\r\nlines\"\r\n"
            "3,\"Chat,GPT\",6,7,13,API log\r\n");
  auto o = Options(ImportFormat::kBurstGpt, {f});
  o.by_log_type = true;
  auto r = ImportTrace(o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->records.size(), 3u);
  EXPECT_EQ(r->records[0].prompt_tokens, 12);
  EXPECT_EQ(r->records[0].output_tokens, 3);
  EXPECT_EQ(r->rows, 3);
  ASSERT_EQ(r->mapping.size(), 3u);
  EXPECT_EQ(r->mapping[0].first, "GPT-4 (API \"beta\", log)");
  EXPECT_EQ(r->mapping[1].first, "ChatGPT (two\nlines)");
  EXPECT_EQ(r->mapping[2].first, "Chat,GPT (API log)");

  // Lines are physical lines: after a two-line field and a blank line, the
  // next row is on line 5.
  const std::string g = Write("q2.csv",
                              "Timestamp,Model,Request tokens,Response tokens\r\n"
                              "1,\"a\r\nb\",4,5\r\n"
                              "\r\n"
                              "2,m,x,5\r\n");
  EXPECT_THAT(Error(Options(ImportFormat::kBurstGpt, {g})),
              HasSubstr(g + ":5: column \"Request tokens\": expected a non-negative integer, got "
                            "\"x\""));
}

TEST_F(TraceImportTest, CsvErrorsNameFileLineAndColumn) {
  auto azure = [&](const std::string& body) {
    return Error(Options(ImportFormat::kAzure, {Write("e.csv", body)}));
  };
  const std::string e = (dir_ / "e.csv").string();
  EXPECT_THAT(azure("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,1\n"),
              HasSubstr(e + ":1: missing column \"GeneratedTokens\" (the header row is "
                            "\"TIMESTAMP,ContextTokens\")"));
  EXPECT_THAT(azure("\n2023-11-16 18:15:46,1,2\n"),
              HasSubstr(e + ":2: missing column \"TIMESTAMP\""));
  EXPECT_THAT(azure(""), HasSubstr(e + ": empty file; expected a header row with columns "
                                       "TIMESTAMP, ContextTokens, GeneratedTokens"));
  EXPECT_THAT(
      azure(absl::StrCat(kAzureHeader, "2023-11-16 18:15:46,1,2\n2023-11-16 18:15:47,abc,2\n")),
      HasSubstr(e + ":3: column \"ContextTokens\": expected a non-negative integer, got "
                    "\"abc\""));
  EXPECT_THAT(azure(absl::StrCat(kAzureHeader, "2023-11-16 18:15:46,1,-4\n")),
              HasSubstr(e + ":2: column \"GeneratedTokens\": negative length -4"));
  EXPECT_THAT(azure(absl::StrCat(kAzureHeader, "2023-11-16 18:15:46,1.5,4\n")),
              HasSubstr(e + ":2: column \"ContextTokens\": expected a non-negative integer"));
  EXPECT_THAT(azure(absl::StrCat(kAzureHeader, "16/11/2023 18:15,1,4\n")),
              HasSubstr(e + ":2: column \"TIMESTAMP\": expected a datetime such as "
                            "\"2023-11-16 18:15:46.6805900\", got \"16/11/2023 18:15\""));
  EXPECT_THAT(azure(absl::StrCat(kAzureHeader, "infinite-future,1,4\n")),
              HasSubstr(e + ":2: column \"TIMESTAMP\": expected a datetime"));
  EXPECT_THAT(azure(absl::StrCat(kAzureHeader, "2023-11-16 18:15:46,1\n")),
              HasSubstr(e + ":2: column \"GeneratedTokens\": missing (the row has 2 fields)"));
  EXPECT_THAT(azure(absl::StrCat(kAzureHeader, "2023-11-16 18:15:46,\"1,4\n\n")),
              HasSubstr(e + ":2: field 2: unterminated quoted field"));
  EXPECT_THAT(azure(absl::StrCat(kAzureHeader, "2023-11-16 18:15:46,\"1\"x,4\n")),
              HasSubstr(e + ":2: field 2: unexpected text after a closing quote"));
  EXPECT_THAT(azure(absl::StrCat(kAzureHeader, "2023-11-16 18:15:46,1\"2,4\n")),
              HasSubstr(e + ":2: field 2: a quote inside an unquoted field"));

  const std::string b = Write("b.csv", absl::StrCat(kBurstHeader, "soon,ChatGPT,1,2,3,API log\n"));
  EXPECT_THAT(
      Error(Options(ImportFormat::kBurstGpt, {b})),
      HasSubstr(b + ":2: column \"Timestamp\": expected a number of seconds, got \"soon\""));
  const std::string m = Write("m.csv", absl::StrCat(kBurstHeader, "1,,1,2,3,API log\n"));
  EXPECT_THAT(Error(Options(ImportFormat::kBurstGpt, {m})),
              HasSubstr(m + ":2: column \"Model\": empty"));

  EXPECT_THAT(Error(Options(ImportFormat::kAzure, {(dir_ / "nope.csv").string()})),
              HasSubstr("cannot open trace input " + (dir_ / "nope.csv").string()));
}

TEST_F(TraceImportTest, JsonlErrorsNameFileLineAndField) {
  const std::string ok = R"({"timestamp": 0, "input_length": 3, "output_length": 2})";
  auto mooncake = [&](const std::string& second) {
    return Error(Options(ImportFormat::kMooncake, {Write("m.jsonl", ok + "\n" + second + "\n")}));
  };
  const std::string m = (dir_ / "m.jsonl").string();
  EXPECT_THAT(mooncake("{not json"), HasSubstr(m + ":2: malformed JSON: "));
  EXPECT_THAT(mooncake("[1, 2]"), HasSubstr(m + ":2: expected a JSON object, got array"));
  EXPECT_THAT(mooncake(R"({"input_length": 3, "output_length": 2})"),
              HasSubstr(m + ":2: field \"timestamp\": missing"));
  EXPECT_THAT(mooncake(R"({"timestamp": "noon", "input_length": 3, "output_length": 2})"),
              HasSubstr(m + ":2: field \"timestamp\": expected a number, got string \"noon\""));
  EXPECT_THAT(mooncake(R"({"timestamp": 1, "input_length": "3", "output_length": 2})"),
              HasSubstr(m + ":2: field \"input_length\": expected a non-negative integer, got "
                            "string \"3\""));
  EXPECT_THAT(mooncake(R"({"timestamp": 1, "input_length": 3, "output_length": -2})"),
              HasSubstr(m + ":2: field \"output_length\": negative length -2"));
  EXPECT_THAT(mooncake(R"({"timestamp": 1, "input_length": 3.5, "output_length": 2})"),
              HasSubstr(m + ":2: field \"input_length\": expected a non-negative integer"));
  EXPECT_THAT(mooncake(R"({"timestamp": 1, "input_length": 3, "output_length": 2, "hash_ids": 4})"),
              HasSubstr(m + ":2: field \"hash_ids\": expected an array of integers, got number 4"));
  EXPECT_THAT(
      mooncake(R"({"timestamp": 1, "input_length": 3, "output_length": 2, "hash_ids": [1, "x"]})"),
      HasSubstr(m + ":2: field \"hash_ids\"[1]: expected an integer, got \"x\""));
}

TEST_F(TraceImportTest, OptionErrors) {
  const std::string f = Write("a.csv", absl::StrCat(kAzureHeader, "2023-11-16 18:15:46,1,2\n"));
  auto o = Options(ImportFormat::kAzure, {f});
  o.time_scale = 0;
  EXPECT_THAT(Error(o), HasSubstr("--time-scale: expected a number > 0, got 0"));
  o = Options(ImportFormat::kAzure, {f});
  o.length_scale = -1;
  EXPECT_THAT(Error(o), HasSubstr("--length-scale: expected a number > 0, got -1"));
  o = Options(ImportFormat::kAzure, {f});
  o.duration_s = 0;
  EXPECT_THAT(Error(o), HasSubstr("--duration: expected seconds > 0, got 0"));
  o = Options(ImportFormat::kAzure, {f});
  o.start_s = -5;
  EXPECT_THAT(Error(o), HasSubstr("--start: expected seconds >= 0, got -5"));
  o = Options(ImportFormat::kAzure, {f}, {});
  EXPECT_THAT(Error(o), HasSubstr("--models: no model given"));
  o = Options(ImportFormat::kAzure, {});
  EXPECT_THAT(Error(o), HasSubstr("--input: no trace file given"));
  o = Options(ImportFormat::kAzure, {f});
  o.by_log_type = true;
  EXPECT_THAT(Error(o), HasSubstr("--by-log-type applies to burstgpt traces only"));
  EXPECT_EQ(ParseImportFormat("sharegpt").status().message(),
            "--format: expected azure, burstgpt or mooncake, got \"sharegpt\"");
  EXPECT_EQ(ParseImportFormat("").status().message(),
            "--format: missing (azure, burstgpt or mooncake)");
  EXPECT_EQ(*ParseImportFormat("mooncake"), ImportFormat::kMooncake);
}

TEST_F(TraceImportTest, OutputReadsBackAsATrace) {
  const std::string f =
      Write("mc.jsonl", R"({"timestamp": 5, "input_length": 700, "output_length": 3, )"
                        R"("hash_ids": [1, 2]})"
                        "\n"
                        R"({"timestamp": 9, "input_length": 20, "output_length": 3, )"
                        R"("hash_ids": [1]})"
                        "\n");
  auto r = ImportTrace(Options(ImportFormat::kMooncake, {f}));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string out = (dir_ / "out.jsonl").string();
  ASSERT_TRUE(WriteTrace(out, r->records).ok());
  auto back = ReadTrace(out);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].prompt, r->records[0].prompt);
  EXPECT_EQ((*back)[1].prompt, SynthesizePrompt(512, 1).substr(0, 20));
  EXPECT_DOUBLE_EQ((*back)[1].arrival_s, 0.004);
}

}  // namespace
}  // namespace ballast::bench
