// Lexer of the chat-template interpreter: Jinja source → tokens.
//
// Applies Jinja's source rules as Hugging Face's environment configures them
// (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
//  * newlines (\r\n, \r, \n) become \n and one trailing newline is dropped;
//  * `{%-`/`{{-`/`{#-` strip all whitespace before the tag, `-%}`/`-}}`/`-#}`
//    all whitespace after it;
//  * trim_blocks: the first newline after `%}` or `#}` is removed (not after
//    `}}`; `+%}` keeps it);
//  * lstrip_blocks: whitespace between a line start and `{%`/`{#` is removed
//    (not before `{{`; `{%+` keeps it);
//  * `{% raw %}...{% endraw %}` is text; comments are dropped.
// Positions are 1-based line:column in the normalized source.
//
// Thread-safety: Tokenize is a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ballast::chat {

struct SourcePos {
  int line = 1;
  int column = 1;
};

struct Token {
  enum class Type : uint8_t {
    kText,        // template text (value)
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,        // identifier or keyword (value)
    kString,      // string literal, unescaped (value)
    kInt,         // integer literal (int_value)
    kFloat,       // float literal (float_value)
    kOperator,    // + - * / // % ** ~ ( ) [ ] { } == != < <= > >= = . : | , ; (value)
    kEnd,         // end of the template
  };
  Type type = Type::kEnd;
  std::string value;
  int64_t int_value = 0;
  double float_value = 0;
  SourcePos pos;
};

// "line:column" for error messages.
std::string FormatPos(SourcePos pos);

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source);

}  // namespace ballast::chat
