// What a chat template's render costs: the evaluator's step budget
// (RenderLimits::max_steps in chat_template.h) and the size checks every
// value it makes passes.
//
// The steps of a render: a statement or an expression is one, a loop
// iteration 16, and work in proportion to size one more per 16 items or
// 64 bytes (SizeSteps): scanning 64 bytes a character at a time
// (wordcount, title, a repr's escapes) costs about what a statement does.
// The evaluator counts as work a value made (a new string, list or dict),
// printed text, and a value read whole: a filter's input (but the length,
// first or last of a list, and default), a string test's or comparison's
// operands, a built-in call's arguments (not a macro's), a loop's iterable
// (copied), the string or list whose method is called, a string indexed or
// sliced (by code point) and a dict or object searched for a key. Reading
// a variable, an attribute or a list item costs nothing more: a loop that
// asks messages|length or messages[i] on each of N messages stays linear.
//
// Thread-safety: WorkBudget belongs to one render (not thread-safe); the
// functions are pure.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/chat/value.h"

namespace ballast::chat {

// The steps of one loop iteration (a scope and a loop object of 13
// attributes).
inline constexpr int64_t kLoopIterationSteps = 16;

// The steps `v` costs to make or to read whole: one per 16 items of a list,
// tuple, dict or object, and one per 64 bytes of a string, counting the
// strings a list or dict holds ([s] * 1000 is cheap to make, but a built-in
// that reads each item reads s a thousand times).
int64_t SizeSteps(const Value& v);
// The steps of `bytes` of printed text.
int64_t TextSteps(uint64_t bytes);

// Whether filter `name` does work independent of its input's size on
// `input` (default; a list's length, first and last; a dict's length).
bool ConstantTimeFilter(std::string_view name, const Value& input);
// Whether test `name` reads its input and arguments whole (lower, upper,
// the comparisons, in, sameas).
bool ScanningTest(std::string_view name);
// Whether filter (is_filter) or test `name` reads a container's text (its
// repr) and returns a number: wordcount, and the lower/upper tests. The
// evaluator makes that text and counts it.
bool ReadsText(bool is_filter, std::string_view name);

// `v`, or OUT_OF_RANGE: OverflowError for a string over kMaxStringBytes
// (built-ins check what they build, and this catches the rest: a
// container's text that Str() or Repr() cut at the cap), RecursionError for
// a value nested deeper than kMaxValueDepth.
absl::StatusOr<Value> CheckSize(Value v);

// The steps one render has left.
class WorkBudget {
 public:
  explicit WorkBudget(int64_t max_steps) : max_steps_(max_steps) {}
  // Counts n steps: RESOURCE_EXHAUSTED naming the budget once past it.
  absl::Status Charge(int64_t n);

 private:
  const int64_t max_steps_;
  int64_t steps_ = 0;
};

}  // namespace ballast::chat
