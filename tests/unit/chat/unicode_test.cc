// The chat interpreter's substring search (unicode::Find, ReverseFind,
// which use memmem for linear time) against std::string_view's find and
// rfind, exhaustively over short strings of a two-letter alphabet (where
// partial matches overlap the most), and the methods built on them
// (split, rsplit, count, replace, find, rfind, `in`) against Python's
// results.
#include "engine/chat/unicode.h"

#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/chat_template.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ballast::chat {
namespace {

// Every string of length 0..max_len over {a, b}.
std::vector<std::string> AllStrings(int max_len) {
  std::vector<std::string> out = {""};
  for (size_t begin = 0, len = 0; len < static_cast<size_t>(max_len); ++len) {
    const size_t end = out.size();
    for (size_t i = begin; i < end; ++i) {
      out.push_back(out[i] + "a");
      out.push_back(out[i] + "b");
    }
    begin = end;
  }
  return out;
}

TEST(ChatUnicode, FindMatchesStdFindOnEveryShortString) {
  const auto hays = AllStrings(7), needles = AllStrings(4);
  int found = 0;
  for (const std::string& h : hays) {
    for (const std::string& n : needles) {
      for (size_t from = 0; from <= h.size() + 1; ++from) {
        ASSERT_EQ(unicode::Find(h, n, from), std::string_view(h).find(n, from))
            << "'" << n << "' in '" << h << "' from " << from;
      }
      const size_t r = unicode::ReverseFind(h, n);
      ASSERT_EQ(r, std::string_view(h).rfind(n)) << "'" << n << "' in '" << h << "'";
      found += r != std::string_view::npos;
    }
  }
  EXPECT_GT(found, 1000);  // the cases are not all misses
}

TEST(ChatUnicode, StringMethodsKeepPythonsResults) {
  // Results as Python 3 gives them.
  const std::string src =
      "{{ 'abaababa'.split('aba') }}|{{ 'abaababa'.rsplit('aba', 1) }}|"
      "{{ 'aaaa'.rsplit('aa') }}|{{ 'aaaa'.split('aa') }}|{{ 'abababa'.count('aba') }}|"
      "{{ 'abababa'.replace('aba', 'x') }}|{{ 'abababa'.find('bab') }}|"
      "{{ 'abababa'.rfind('aba') }}|{{ 'abababa'.rfind('c') }}|{{ 'bab' in 'abababa' }}|"
      "{{ '' in '' }}|{{ 'a,b,,c'.rsplit(',', 2) }}";
  auto tpl = ChatTemplate::Create(src);
  ASSERT_TRUE(tpl.ok()) << tpl.status();
  auto out = (*tpl)->Render(nlohmann::ordered_json::object());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out,
            "['', '', 'ba']|['abaab', '']|['', '', '']|['', '', '']|2|xbx|1|4|-1|True|True|"
            "['a,b', '', 'c']");
}

}  // namespace
}  // namespace ballast::chat
