#include "engine/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/utf8.h"

namespace ballast::tokenizer {
namespace {

// Unicode White_Space, as Oniguruma's \s (PCRE2's adds U+180E).
constexpr std::string_view kWhiteSpace =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// Per-thread match state shared by every Regex.
struct ThreadState {
  ThreadState() {
    match_data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (jit_stack != nullptr) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~ThreadState() {
    pcre2_match_data_free(match_data);
    pcre2_match_context_free(context);
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  }
  pcre2_match_data* match_data;
  pcre2_match_context* context;
  pcre2_jit_stack* jit_stack;
};

ThreadState& State() {
  thread_local ThreadState state;
  return state;
}

}  // namespace

std::string Regex::Translate(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : absl::StrCat("[", Sv(kWhiteSpace), "]");
      } else if (e == 'S' && !in_class) {
        out += absl::StrCat("[^", Sv(kWhiteSpace), "]");
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      const size_t end = p.find(":]", i + 2);  // POSIX class [:alpha:]
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  const std::string translated = Translate(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(error, msg, sizeof(msg));
    return absl::InvalidArgumentError(absl::StrCat(
        "regex \"", Sv(pattern), "\" does not compile: ", reinterpret_cast<const char*>(msg),
        " (offset ", offset, ")"));
  }
  const bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<Regex>(new Regex(code, jit));
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::Literal(std::string_view text) {
  std::string p = "\\Q";
  size_t start = 0;
  // \Q..\E quotes everything except a literal "\E".
  for (size_t e; (e = text.find("\\E", start)) != std::string_view::npos; start = e + 2) {
    absl::StrAppend(&p, Sv(text.substr(start, e - start)), "\\E\\\\E\\Q");
  }
  absl::StrAppend(&p, Sv(text.substr(start)), "\\E");
  return Compile(p);
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::ForEachMatch(std::string_view s, absl::FunctionRef<void(size_t, size_t)> fn) const {
  auto* code = static_cast<pcre2_code*>(code_);
  ThreadState& st = State();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t off = 0;
  while (off <= s.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, s.size(), off, 0, st.match_data, st.context)
                  : PCRE2_ERROR_JIT_BADOPTION;
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      // No JIT, or its stack ran out: the interpreter (heap frames) instead.
      rc = pcre2_match(code, subject, s.size(), off, PCRE2_NO_UTF_CHECK, st.match_data, st.context);
    }
    if (rc < 0) return;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.match_data);
    const size_t start = ov[0], end = ov[1];
    if (end <= start) {
      if (start >= s.size()) return;
      off = start + std::max(1, Utf8SequenceLength(static_cast<unsigned char>(s[start])));
      continue;
    }
    fn(start, end);
    off = end;
  }
}

}  // namespace ballast::tokenizer
