// Every snippet of tests/data/chat/features.json (one Jinja feature each:
// whitespace control, literals, operators, filters, tests, statements,
// errors) renders byte-identically to transformers' Jinja environment
// (tests/data/chat/golden/features.json, made by make_golden.py). Cases
// marked "expect_unsupported" are known limitations: they must fail with
// UNIMPLEMENTED, never render differently.
#include "engine/chat/chat_template.h"
#include "gtest/gtest.h"
#include "tests/unit/chat/golden_util.h"

namespace ballast::chat {
namespace {

using testing::DataPath;
using testing::ReadJson;

absl::StatusOr<std::string> RenderCase(const nlohmann::ordered_json& c) {
  auto tpl = ChatTemplate::Create(c["template"].get<std::string>());
  if (!tpl.ok()) return tpl.status();
  return (*tpl)->Render(c.value("context", nlohmann::ordered_json::object()));
}

TEST(ChatFeatures, EverySnippetMatchesJinja) {
  const auto cases = ReadJson(DataPath("features.json"));
  const auto golden = ReadJson(DataPath("golden/features.json"));
  ASSERT_EQ(cases.size(), golden["results"].size()) << "regenerate golden/features.json";
  int identical = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const auto& g = golden["results"][i];
    ASSERT_EQ(c["name"], g["name"]);
    std::string why;
    if (c.value("expect_unsupported", false)) {
      // A known limitation: a clear UNIMPLEMENTED error instead of Jinja's render.
      const auto got = RenderCase(c);
      EXPECT_EQ(got.status().code(), absl::StatusCode::kUnimplemented) << c["name"];
      identical += got.status().code() == absl::StatusCode::kUnimplemented;
      continue;
    }
    if (testing::MatchesGolden(RenderCase(c), g, &why)) {
      ++identical;
    } else {
      ADD_FAILURE() << c["name"].get<std::string>() << " (" << c["template"].dump() << "): " << why;
    }
  }
  std::cout << "chat features: " << identical << "/" << cases.size()
            << " match Jinja (or fail as unsupported where marked)\n";
}

}  // namespace
}  // namespace ballast::chat
