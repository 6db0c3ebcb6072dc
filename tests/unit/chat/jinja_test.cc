// Unit tests of the chat-template interpreter: expressions, whitespace
// control under HF's trim_blocks/lstrip_blocks, scoping, errors with
// positions for unsupported constructs, the HF context, and concurrent
// renders. (features_test.cc checks many more snippets against real Jinja.)
#include <thread>

#include "engine/chat/chat_template.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ballast::chat {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

std::string R(const std::string& source, const Json& context = Json::object()) {
  auto tpl = ChatTemplate::Create(source);
  if (!tpl.ok()) return "CREATE ERROR: " + tpl.status().ToString();
  auto out = (*tpl)->Render(context);
  if (!out.ok()) return "RENDER ERROR: " + out.status().ToString();
  return *out;
}

absl::Status CreateError(const std::string& source) {
  auto tpl = ChatTemplate::Create(source);
  return tpl.ok() ? absl::OkStatus() : tpl.status();
}

absl::Status RenderError(const std::string& source, const Json& context = Json::object(),
                         const RenderLimits& limits = {}) {
  auto tpl = ChatTemplate::Create(source);
  if (!tpl.ok()) return tpl.status();
  auto out = (*tpl)->Render(context, limits);
  return out.ok() ? absl::OkStatus() : out.status();
}

// The limit tests render with 1,000,000 steps, a quarter of the default, so
// that templates run to the budget finish sooner in sanitizer builds.
constexpr RenderLimits kTestLimits{.max_steps = 1'000'000};

absl::Status LimitedError(const std::string& source, const Json& context = Json::object()) {
  return RenderError(source, context, kTestLimits);
}

std::string LimitedR(const std::string& source, const Json& context = Json::object()) {
  auto tpl = ChatTemplate::Create(source);
  if (!tpl.ok()) return "CREATE ERROR: " + tpl.status().ToString();
  auto out = (*tpl)->Render(context, kTestLimits);
  if (!out.ok()) return "RENDER ERROR: " + out.status().ToString();
  return *out;
}

// A float (or other non-int) where a filter or method wants an int never
// throws (the chat fuzzer found indent(99.99) ending the process): indent
// raises Python's TypeError; the others truncate the float.
TEST(ChatExpressions, NonIntArgumentsGiveAnErrorOrTruncate) {
  const absl::Status indent = RenderError("{{ 'a\nb' | indent(2.5) }}");
  EXPECT_EQ(indent.code(), absl::StatusCode::kInvalidArgument) << indent;
  EXPECT_THAT(std::string(indent.message()),
              HasSubstr("can't multiply sequence by non-int of type 'float'"));
  EXPECT_EQ(R("{{ 'a\nb' | indent(2) }}"), "a\n  b");
  EXPECT_EQ(R("{{ 'abc' | center(5.9) }}"), R("{{ 'abc' | center(5) }}"));
  EXPECT_EQ(R("{{ 'a,b,c'.split(',', 1.5) | length }}"), "2");
  EXPECT_EQ(R("{{ 'aaa'.replace('a', 'b', 1.5) }}"), "baa");
  EXPECT_EQ(R("{{ [1, 2, 3] | batch(2.5) | list | length }}"),
            R("{{ [1, 2, 3] | batch(2) | list | length }}"));
}

TEST(ChatExpressions, LiteralsPrintAsPython) {
  EXPECT_EQ(R("{{ none }}|{{ true }}|{{ 1.0 }}|{{ 1e-05 }}|{{ 10**16 * 1.0 }}"),
            "None|True|1.0|1e-05|1e+16");
  EXPECT_EQ(R("{{ [1, 'a', none] }}|{{ {'k': (1,)} }}"), "[1, 'a', None]|{'k': (1,)}");
  EXPECT_EQ(R("{{ \"it's\" }}|{{ [\"it's\"] }}"), "it's|[\"it's\"]");
  // Quotes, backslashes, controls, DEL, a format character and an emoji
  // between plain runs, as Python's repr() and json.dumps write them.
  const Json ctx = {
      {"xs", {"a'b", "c\"d", "e'f\"g", "t\tb\\ \x01 \x7f \u00e9 \u200b \U0001F600 z"}}};
  EXPECT_EQ(R("{{ xs }}", ctx),
            "[\"a'b\", 'c\"d', 'e\\'f\"g', 't\\tb\\\\ \\x01 \\x7f \u00e9 \\u200b \U0001F600 z']");
  EXPECT_EQ(
      R("{{ xs | tojson }}", ctx),
      "[\"a'b\", \"c\\\"d\", \"e'f\\\"g\", \"t\\tb\\\\ \\u0001 \x7f \u00e9 \u200b \U0001F600 z\"]");
}

TEST(ChatExpressions, ArithmeticFollowsPython) {
  EXPECT_EQ(R("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 3 }} {{ 1 + 2 * 3 }}"),
            "3 -4 2 3.5 8 7");
  EXPECT_EQ(R("{{ 'ab' * 2 }} {{ [1] + [2] }} {{ 'a' ~ 1 ~ none }}"), "abab [1, 2] a1None");
  EXPECT_EQ(R("{{ 1 == 1.0 }} {{ 1 == true }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}"),
            "True True True False");
}

TEST(ChatExpressions, FiltersBindTighterThanOperators) {
  EXPECT_EQ(R("{{ xs|length - 1 }}", {{"xs", {1, 2, 3}}}), "2");
  EXPECT_EQ(R("{{ not xs|length }}", {{"xs", Json::array()}}), "True");
  // Unary minus binds tighter still: -xs|length is (-xs)|length, an error as in Jinja.
  EXPECT_THAT(std::string(RenderError("{{ -xs|length }}", {{"xs", {1}}}).message()),
              HasSubstr("bad operand type for unary -: 'list'"));
}

TEST(ChatExpressions, SubscriptsSlicesAndMethods) {
  const Json ctx = {{"s", "héllo"}, {"xs", {1, 2, 3, 4}}, {"m", {{"role", "user"}}}};
  EXPECT_EQ(R("{{ xs[::-1] }} {{ xs[1:3] }} {{ xs[-1] }} {{ s[1] }} {{ s[::-1] }}", ctx),
            "[4, 3, 2, 1] [2, 3] 4 é olléh");
  EXPECT_EQ(R("{{ m.role }} {{ m['role'] }} {{ m.get('x', 'd') }} [{{ m.missing }}]", ctx),
            "user user d []");
  EXPECT_EQ(R("{{ 'a</think>b'.split('</think>')[-1] }} {{ '\\n x \\n'.strip('\\n') }}"), "b  x ");
  EXPECT_EQ(R("{{ 'abc'.startswith('a') and 'abc'.endswith(('x', 'c')) }}"), "True");
}

TEST(ChatExpressions, TestsAndUndefined) {
  const Json ctx = {{"n", nullptr}, {"s", "x"}, {"d", Json::object()}};
  EXPECT_EQ(R("{{ n is none }} {{ u is defined }} {{ s is string }} {{ d is mapping }}", ctx),
            "True False True True");
  EXPECT_EQ(R("{{ s is not none and u is undefined }}", ctx), "True");
  EXPECT_EQ(R("[{{ u }}][{{ u|default('dflt') }}][{{ u|length }}]"), "[][dflt][0]");
  // An attribute of an undefined value is an error, as in Jinja.
  EXPECT_THAT(std::string(RenderError("{{ u.x }}").message()), HasSubstr("'u' is undefined"));
}

TEST(ChatExpressions, TojsonIsPythonJsonDumps) {
  const Json ctx = {{"d", {{"b", "é\n"}, {"a", {1, 2.5, nullptr, true}}}}};
  EXPECT_EQ(R("{{ d|tojson }}", ctx), "{\"b\": \"é\\n\", \"a\": [1, 2.5, null, true]}");
  EXPECT_EQ(R("{{ d.a|tojson(indent=2) }}", ctx), "[\n  1,\n  2.5,\n  null,\n  true\n]");
  EXPECT_EQ(R("{{ d|tojson(separators=(',', ':'), sort_keys=true) }}", ctx),
            "{\"a\":[1,2.5,null,true],\"b\":\"é\\n\"}");
}

TEST(ChatWhitespace, TrimAndLstripBlocksAsTransformers) {
  // trim_blocks: the newline after %} goes; lstrip_blocks: indentation before {% goes.
  EXPECT_EQ(R("{% if true %}\n  a\n  {% endif %}\nb"), "  a\nb");
  // Not for {{ }}: the indentation and the newline stay.
  EXPECT_EQ(R("  {{ 'a' }}\n  {{ 'b' }}\n"), "  a\n  b");
  // '-' strips all whitespace on its side, newlines included.
  EXPECT_EQ(R("a  \n\n  {%- if true -%}  \n\n  b{% endif %}"), "ab");
  EXPECT_EQ(R("a \n {{- 'x' -}} \n b"), "axb");
  // '+' keeps what lstrip_blocks / trim_blocks would remove.
  EXPECT_EQ(R("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(R("{% if true +%}\nb{% endif %}"), "\nb");
  // Comments trim like blocks.
  EXPECT_EQ(R("a\n  {# c #}\nb"), "a\nb");
  // One trailing newline of the template is dropped; \r\n reads as \n.
  EXPECT_EQ(R("x\n\n"), "x\n");
  EXPECT_EQ(R("a\r\n{% if true %}\r\nb{% endif %}"), "a\nb");
  // Python's whitespace: '-' also strips U+3000 and NBSP.
  EXPECT_EQ(R("a\xE3\x80\x80\xC2\xA0{%- if true %}b{% endif %}"), "ab");
}

TEST(ChatStatements, LoopVariablesAndScoping) {
  EXPECT_EQ(R("{% for x in 'abc' %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
              "{{ loop.revindex0 }},{% endfor %}"),
            "1TrueFalse32,2FalseFalse31,3FalseTrue30,");
  // A set inside a loop does not leak; a namespace carries state.
  EXPECT_EQ(R("{% set x = 1 %}{% set ns = namespace(n=0) %}{% for i in [1, 2] %}"
              "{% set x = 5 %}{% set ns.n = ns.n + i %}{% endfor %}{{ x }} {{ ns.n }}"),
            "1 3");
  EXPECT_EQ(R("{% for a, b in d.items() %}{{ a }}={{ b }};{% else %}none{% endfor %}",
              {{"d", {{"k", 1}, {"j", 2}}}}),
            "k=1;j=2;");
  EXPECT_EQ(R("{% for x in [] %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(R("{% for x in range(9) if x is odd %}{% if x > 5 %}{% break %}{% endif %}{{ x }}"
              "{% endfor %}"),
            "135");
}

TEST(ChatStatements, MacrosAndBlocks) {
  EXPECT_EQ(R("{% macro f(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ f(1) }}{{ f(2, b=3) }}"),
            "<1B><23>");
  EXPECT_EQ(R("{% set t %}x{{ 1 }}{% endset %}{{ t ~ t }}"), "x1x1");
  EXPECT_EQ(R("{% filter upper %}ab{% endfilter %}"), "AB");
}

TEST(ChatErrors, RaiseExceptionCarriesTheTemplateMessage) {
  const absl::Status st = RenderError("{{ raise_exception('Roles must alternate') }}");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "Roles must alternate");
  EXPECT_TRUE(IsTemplateException(st));
  EXPECT_FALSE(IsTemplateException(RenderError("{{ 'a' + 1 }}")));
}

TEST(ChatErrors, RuntimeErrorsNamePosition) {
  const absl::Status st = RenderError("line one\n  {{ 'a' + 1 }}");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("2:"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("can only concatenate str"));
}

TEST(ChatErrors, UnsupportedConstructsNameItAndItsPosition) {
  absl::Status st = CreateError("ok\n  {% include 'other.jinja' %}");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()), HasSubstr("2:6"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("include"));

  st = CreateError("{{ x|truncate(5) }}");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()), HasSubstr("1:6"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("filter 'truncate'"));

  st = CreateError("{% for x in xs recursive %}{% endfor %}");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()), HasSubstr("recursive"));

  st = CreateError("{% call m() %}{% endcall %}");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);

  st = RenderError("{{ 'a{}'.format(1) }}");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()), HasSubstr("1:"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("str method 'format'"));
}

TEST(ChatErrors, SyntaxErrorsNamePosition) {
  absl::Status st = CreateError("{% if x %}\nno end");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("endif"));
  st = CreateError("{{ x |nosuchfilter }}");
  EXPECT_THAT(std::string(st.message()), HasSubstr("1:7: no filter named 'nosuchfilter'"));
  st = CreateError("a {{ (1 + }}");
  EXPECT_THAT(std::string(st.message()), HasSubstr("1:"));
  st = CreateError("{# never closed");
  EXPECT_THAT(std::string(st.message()), HasSubstr("comment"));
}

TEST(ChatErrors, HostileTemplatesAreBounded) {
  EXPECT_THAT(
      std::string(CreateError("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
                      .message()),
      HasSubstr("nested too deeply"));
  std::string deep;
  for (int i = 0; i < 500; ++i) deep += "{% if true %}";
  EXPECT_THAT(std::string(CreateError(deep).message()), HasSubstr("nested too deeply"));
  EXPECT_FALSE(RenderError("{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                           "{% set ns.s = ns.s + ns.s %}{% endfor %}")
                   .ok());
  EXPECT_FALSE(RenderError("{{ 'x' * 100000000000 }}").ok());
  EXPECT_FALSE(RenderError("{% for i in range(1000000) %}{% endfor %}").ok());
  EXPECT_FALSE(RenderError("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").ok());
}

// A namespace that holds itself (directly or through a list) prints its
// second visit as Python does, <Namespace {...}>, instead of recursing until
// the stack overflows (a fuzzer's find); a value nested deeper than the
// printer's limit prints "..." there.
TEST(ChatExpressions, RecursiveAndDeepValuesPrint) {
  EXPECT_EQ(R("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }}"),
            "<Namespace {'a': 1, 'me': <Namespace {...}>}>");
  EXPECT_EQ(R("{% set ns = namespace(a=1) %}{% set ns.l = [ns, 2] %}{{ ns.l }}"),
            "[<Namespace {'a': 1, 'l': [<Namespace {...}>, 2]}>, 2]");
  const std::string deep =
      R("{% set ns = namespace(x=0) %}{% for i in range(300) %}{% set ns.x = [ns.x] %}"
        "{% endfor %}{{ ns.x }}");
  EXPECT_EQ(deep, std::string(200, '[') + "..." + std::string(200, ']'));
  EXPECT_EQ(R("{% set ns = namespace(x=0) %}{% for i in range(3) %}{% set ns.x = [ns.x] %}"
              "{% endfor %}{{ ns.x }}"),
            "[[[0]]]");
  // Cycles through two namespaces, and through a loop's remembered value:
  // rendered, then freed (the sanitizer builds' leak check runs this).
  EXPECT_EQ(R("{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.b = b %}{{ a }}"),
            "<Namespace {'b': <Namespace {'a': <Namespace {...}>}>}>");
  EXPECT_EQ(R("{% for i in [1, 2] %}{{ loop.changed([loop]) }}{% endfor %}"), "TrueTrue");
  // A value that shares its parts, 2^40 values printed in full: cut after
  // 2^20 values, in a fraction of a second.
  const std::string shared =
      R("{% set ns = namespace(x=0) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}"
        "{% endfor %}{{ ns.x | length }}{{ ns.x }}");
  EXPECT_EQ(shared.substr(0, 1), "2");
  EXPECT_LT(shared.size(), size_t{64} << 20);
  EXPECT_NE(shared.find("..."), std::string::npos);
}

// A render's work is bounded whatever the template: nested loops over
// Jinja's largest ranges stop at the step budget, as does doubling a list
// (large values cost steps) or at the item cap, and a value that shares its parts compares with
// itself at once and stops tojson at its value cap; each is an error the caller sees.
TEST(ChatLimits, EveryRenderIsBounded) {
  const absl::Status loops = LimitedError(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_EQ(loops.code(), absl::StatusCode::kResourceExhausted) << loops;
  EXPECT_THAT(loops.message(), HasSubstr("1,000,000 steps"));
  EXPECT_THAT(loops.message(), HasSubstr("chat template 1:"));
  const absl::Status doubling = LimitedError(
      "{% set ns = namespace(x=[0]) %}{% for i in range(40) %}{% set ns.x = ns.x + ns.x %}"
      "{% endfor %}");
  // The step budget (large values cost steps) or the item cap stops it.
  EXPECT_TRUE(doubling.code() == absl::StatusCode::kResourceExhausted ||
              doubling.code() == absl::StatusCode::kOutOfRange)
      << doubling;
  const absl::Status concat = LimitedError("{{ ([0] * 600000) + ([0] * 600000) }}");
  EXPECT_EQ(concat.code(), absl::StatusCode::kOutOfRange) << concat;
  EXPECT_THAT(concat.message(), HasSubstr("1200000 items is over the limit of 1,048,576"));
  // Size caps wherever a value is built, overflow-safe.
  for (const char* big : {"{{ [0] * 2000000 }}", "{{ 'x' * 17000000 }}",
                          "{{ 'ab' * 4611686018427387904 }}", "{{ [0, 0] * 4611686018427387904 }}",
                          "{{ 'a' | center(99999999999) }}", "{{ 'a' | indent(99999999999) }}",
                          "{{ '%99999999999s' % 'a' }}", "{{ '%999999999999999999999999s' % 'a' }}",
                          "{% set s = 'x' * 5000000 %}{{ s | list | length }}",
                          "{% set s = ',' * 5000000 %}{{ s.split(',') | length }}",
                          "{% set s = 'x' * 9000000 %}{{ [s, s] | join }}",
                          "{% set s = 'x' * 9000000 %}{{ s.replace('x', 'yy') }}"}) {
    const absl::Status st = LimitedError(big);
    EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << big << ": " << st;
  }
  // A container's text and a JSON text stop at their caps instead of being
  // escaped in full (fuzzer finds that took seconds): over 16 MiB, a
  // container's text is refused wherever it would become a value, and the
  // rendered output is refused.
  for (const char* cut : {"{% set s = 'x' * 9000000 %}{{ [s, s] | string | length }}",
                          "{% set s = 'x' * 9000000 %}{{ [s, s] is lower }}",
                          "{% set s = 'x' * 9000000 %}{{ ('%r' % ([s, s],)) | length }}",
                          "{% set s = 'x' * 9000000 %}{{ [1, 2] | join([s, s]) | length }}"}) {
    const absl::Status st = LimitedError(cut);
    EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << cut << ": " << st;
    EXPECT_THAT(st.message(), HasSubstr("over the limit of 16 MiB")) << cut;
  }
  const absl::Status escaped = LimitedError("{{ ('\\n' * 9000000,) }}");
  EXPECT_EQ(escaped.code(), absl::StatusCode::kResourceExhausted) << escaped;
  EXPECT_THAT(escaped.message(), HasSubstr("16 MiB"));
  for (const char* json :
       {"{{ ('\\n' * 10000000) | tojson }}", "{% set s = 'x' * 9000000 %}{{ [s, s] | tojson }}"}) {
    const absl::Status st = LimitedError(json);
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << json << ": " << st;
    EXPECT_THAT(st.message(), HasSubstr("16 MiB")) << json;
  }
  // Operations on large values cost in proportion to their size: a
  // character-at-a-time filter over a 100 KB string in a loop stops at the
  // budget (it held a core for 4 s when a step was a KiB).
  const absl::Status scans = LimitedError(
      "{% set s = 'x' * 100000 %}{% for i in range(100000) %}{{ s | wordcount }}{% endfor %}");
  EXPECT_EQ(scans.code(), absl::StatusCode::kResourceExhausted) << scans;
  // So does a built-in that compares its argument each iteration, and a
  // string indexed from its end.
  for (const char* reads :
       {"{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{{ loop.changed(s) }}{% endfor %}",
        "{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{{ s[-1] }}{{ s[-2:] }}"
        "{% endfor %}"}) {
    const absl::Status st = LimitedError(reads);
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << reads << ": " << st;
  }
  // unique hashes its keys (42 s on range(100000) comparing each with every
  // key seen), and sort/unique lower-case a string held many times once.
  EXPECT_EQ(
      LimitedR("{{ range(100000) | unique | list | length }}|{{ [1, 1.0, true, 'a', 'A', (1, 'a'),"
               " (1, 'A'), none, none] | unique | list }}"),
      "100000|[1, 'a', (1, 'a'), (1, 'A'), None]");
  EXPECT_EQ(
      LimitedR(
          "{% set s = 'x' * 3000 %}{{ ([s, 'y', s] * 1000) | sort | unique | list | length }}"),
      "2");
  // A list counts the strings it holds: a built-in reading each item of
  // [s] * 1000 reads s a thousand times (4 s when only items counted).
  const absl::Status held =
      LimitedError("{% set s = 'x' * 1000000 %}{{ ([s] * 1000) | map('wordcount') | sum }}");
  EXPECT_EQ(held.code(), absl::StatusCode::kResourceExhausted) << held;
  // A container's text that a built-in reads without returning it counts,
  // and a %-format precision makes only that much of a repr.
  const std::string tower =
      "{% set ns = namespace(x=0) %}{% for i in range(24) %}{% set ns.x = [ns.x, ns.x] %}"
      "{% endfor %}";
  for (const char* text : {"{% for i in range(300) %}{{ ns.x | wordcount }}{% endfor %}",
                           "{% for i in range(300) %}{{ ns.x is lower }}{% endfor %}"}) {
    const absl::Status st = LimitedError(tower + text);
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << text << ": " << st;
  }
  EXPECT_EQ(LimitedR(tower + "{% for i in range(300) %}{{ '%.3s' % (ns.x,) }}{{ '%.2r' | "
                             "format('ab') }}{% endfor %}")
                .substr(0, 10),
            "[[['a[[['a");
  EXPECT_EQ(LimitedR("{{ '%.4s' % ([1, 2],) }}|{{ '%.3r' % 'xyz' }}|{{ '%.9s' % none }}"),
            "[1, |'xy|None");
  // One large integer cannot make a built-in loop for seconds: powers by
  // squaring, an empty sequence repeated, %-format widths, tojson's indent,
  // batch's fill; sum of lists appends in place; NaN is one key to unique.
  EXPECT_EQ(
      LimitedR("{{ 1 ** 3000000000 }}|{{ (-1) ** 3000000001 }}|{{ 0 ** 3000000000 }}|{{ 2 ** 62 }}|"
               "{{ 3 ** 39 }}|{{ ('' * 3000000000) | length }}|{{ ([] * 3000000000) | length }}"),
      "1|-1|0|4611686018427387904|4052555153018976267|0|0");
  EXPECT_FALSE(LimitedError("{{ 2 ** 64 }}").ok());
  EXPECT_EQ(
      LimitedR(
          "{{ '%5.2f' | format(1.5) }}|{{ '%.3s' | format('h\u00e9llo') }}|{{ '%.0s' % 'ab' }}"),
      " 1.50|h\u00e9l|");
  for (const char* wide : {"{{ '%.100000000f' | format(1.5) }}", "{{ '%1000000000d' % 1 }}",
                           "{{ [] | tojson(indent=100000000000000) }}",
                           "{{ ([1] | batch(50000000, 0) | first) | length }}"}) {
    const absl::Status st = LimitedError(wide);
    EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << wide << ": " << st;
  }
  EXPECT_EQ(LimitedR("{{ [[1], [2, 3]] | sum(start=[]) }}|{{ [1, 2.5] | sum }}"), "[1, 2, 3]|3.5");
  EXPECT_THAT(std::string(LimitedError("{{ ['a'] | sum(start='') }}").message()),
              HasSubstr("can't sum strings"));
  EXPECT_EQ(LimitedR("{% set n = 'nan' | float %}{{ ([n] * 3) | unique | list | length }}"), "1");
  // Values nest at most 512 deep, so comparing or freeing one never
  // overflows the stack (a 300,000-deep list did both).
  const absl::Status deep = LimitedError(
      "{% set ns = namespace(x=1) %}{% for i in range(2000) %}{% set ns.x = [[[ns.x]]] %}"
      "{% endfor %}");
  EXPECT_EQ(deep.code(), absl::StatusCode::kOutOfRange) << deep;
  EXPECT_THAT(deep.message(), HasSubstr("RecursionError: a value nested 513 deep"));
  EXPECT_EQ(LimitedR("{% set ns = namespace(x=1, y=1) %}{% for i in range(500) %}"
                     "{% set ns.x = [ns.x] %}{% set ns.y = [ns.y] %}{% endfor %}"
                     "{{ ns.x == ns.y }}|{{ ns.x < ns.y }}|{{ ns.x | tojson | length }}"),
            "True|False|1001");
  // A smaller budget (RenderLimits) stops sooner, naming itself.
  auto small = ChatTemplate::Create("{% for i in range(100) %}{{ i }}{% endfor %}");
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE((*small)->Render(Json::object()).ok());
  const auto limited = (*small)->Render(Json::object(), RenderLimits{.max_steps = 1'000});
  EXPECT_EQ(limited.status().code(), absl::StatusCode::kResourceExhausted) << limited.status();
  EXPECT_THAT(limited.status().message(), HasSubstr("more than 1,000 steps"));
  const absl::Status copies = LimitedError(
      "{% set x = [0] * 1000000 %}{% for i in range(100000) %}{% if x + [] %}{% endif %}"
      "{% endfor %}");
  EXPECT_EQ(copies.code(), absl::StatusCode::kResourceExhausted) << copies;
  const std::string shared =
      "{% set ns = namespace(x=0) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}"
      "{% endfor %}";
  EXPECT_EQ(LimitedR(shared + "{{ ns.x == ns.x }}|{{ [ns.x] == [ns.x] }}|{{ ns.x in [1, ns.x] }}"),
            "True|True|True");
  // Two such values built apart compare each pair of parts once.
  const std::string towers =
      "{% set ns = namespace(x=0, y=0, z=1) %}{% for i in range(40) %}"
      "{% set ns.x = [ns.x, ns.x] %}{% set ns.y = [ns.y, ns.y] %}{% set ns.z = [ns.z, ns.z] %}"
      "{% endfor %}";
  EXPECT_EQ(LimitedR(towers + "{{ ns.x == ns.y }}|{{ ns.x == ns.z }}|{{ ns.x < ns.z }}|"
                              "{{ ns.z in [ns.x, ns.y] }}"),
            "True|False|True|False");
  // A missing item's message shows a short repr of the key: a lookup with
  // such a value as the key is as cheap as any (it printed 2^20 values).
  EXPECT_EQ(LimitedR(shared + "{{ [1][ns.x] is defined }}|{{ {}[ns.x] is defined }}"),
            "False|False");
  const absl::Status missing = LimitedError("{% set s = 'x' * 1000 %}{{ {}[[s]].y }}");
  EXPECT_THAT(missing.message(), HasSubstr("has no element ['xxx")) << missing;
  EXPECT_THAT(missing.message(), HasSubstr("x...")) << missing;
  EXPECT_LT(missing.message().size(), 400u) << missing;
  const absl::Status json = LimitedError(shared + "{{ ns.x | tojson }}");
  EXPECT_EQ(json.code(), absl::StatusCode::kResourceExhausted) << json;
  EXPECT_THAT(json.message(), HasSubstr("tojson: more than 1,048,576 values"));
  // A long conversation stays far inside the budget, also where each
  // message asks messages|length and messages[i] (Qwen3's template does):
  // reading a variable costs nothing more, so 20,000 messages fit (a step
  // per 16 items read would take 50,000,000 steps).
  Json msgs = Json::array();
  for (int i = 0; i < 20000; ++i) msgs.push_back({{"role", "user"}, {"content", "hi"}});
  EXPECT_EQ(LimitedR("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}",
                     {{"messages", msgs}})
                .size(),
            size_t{20000 * 8});
  const std::string indexed = LimitedR(
      "{% for m in messages %}{% set i = (messages | length - 1) - loop.index0 %}"
      "{{ messages[i].content[0] }}{% endfor %}",
      {{"messages", msgs}});
  EXPECT_EQ(indexed, std::string(20000, 'h'));
  // The default budget (4,000,000 steps) fits a conversation of 20,000
  // messages through a real template's shape; Qwen3's (about 125 steps a
  // message) stopped at 8,000 under 1,000,000, as this does under it.
  std::string qwen_like;
  for (int i = 0; i < 2; ++i) {  // two passes, as Qwen3's template makes
    qwen_like +=
        "{% for m in messages %}{% set i = (messages | length - 1) - loop.index0 %}"
        "{% if m.role == 'user' and not (m.content.startswith('<x>') and "
        "m.content.endswith('</x>')) %}{% set c = m.content.split('</y>')[-1].lstrip('x') %}"
        "{% endif %}{% endfor %}";
  }
  EXPECT_TRUE(RenderError(qwen_like, {{"messages", msgs}}).ok())
      << RenderError(qwen_like, {{"messages", msgs}});
  EXPECT_EQ(LimitedError(qwen_like, {{"messages", msgs}}).code(),
            absl::StatusCode::kResourceExhausted);
  // Copying the list in each iteration is work, and stops at the budget.
  const absl::Status copied = LimitedError(
      "{% for m in messages %}{{ messages[::-1][0].role }}{% endfor %}", {{"messages", msgs}});
  EXPECT_EQ(copied.code(), absl::StatusCode::kResourceExhausted) << copied;
}

TEST(ChatContext, MakeContextLikeTransformers) {
  const Json config = {{"chat_template", "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"},
                       {"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
                       {"eos_token", "</s>"},
                       {"unk_token", nullptr}};
  auto tpl = ChatTemplate::FromTokenizerConfig(config);
  ASSERT_TRUE(tpl.ok()) << tpl.status();
  ChatRequest req;
  req.messages = Json::array({{{"role", "user"}, {"content", "hi"}}});
  req.kwargs = {{"enable_thinking", false}};
  const Json ctx = (*tpl)->MakeContext(req);
  EXPECT_EQ(ctx["bos_token"], "<s>");
  EXPECT_FALSE(ctx.contains("unk_token"));
  EXPECT_TRUE(ctx["tools"].is_null());
  EXPECT_EQ(ctx["add_generation_prompt"], false);
  EXPECT_EQ(ctx["enable_thinking"], false);
  auto out = (*tpl)->Apply(req);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "<s>hi</s>");
}

TEST(ChatContext, NamedTemplatesPickDefault) {
  const Json config = {
      {"chat_template",
       {{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}}}};
  auto tpl = ChatTemplate::FromTokenizerConfig(config);
  ASSERT_TRUE(tpl.ok());
  EXPECT_EQ(*(*tpl)->Render(Json::object()), "D");
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig(Json::object()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ChatConcurrency, RendersFromManyThreads) {
  auto tpl = ChatTemplate::Create(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
      "{{ m.content|upper }}{% endfor %}:{{ ns.n }}");
  ASSERT_TRUE(tpl.ok());
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        Json msgs = Json::array();
        for (int k = 0; k <= t; ++k) msgs.push_back({{"content", "x"}});
        auto out = (*tpl)->Render({{"messages", msgs}});
        if (out.ok() && *out == std::string(t + 1, 'X') + ":" + std::to_string(t + 1)) ++ok;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 8 * 200);
}

}  // namespace
}  // namespace ballast::chat
