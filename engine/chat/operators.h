// Python's operators on interpreter values: + - * / // % ** unary -/+,
// `in`, indexing and slicing (by code point for strings).
//
// Errors read like Python's TypeError/ZeroDivisionError messages; an
// operand that is undefined fails with its UndefinedError message, as
// Jinja's Undefined does. Integers are 64-bit: an overflow is an error,
// never a wrapped result.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat/value.h"

namespace ballast::chat {

// `op` is one of + - * / // % **.
absl::StatusOr<Value> BinaryOp(std::string_view op, const Value& a, const Value& b);
// `op` is - or +.
absl::StatusOr<Value> UnaryOp(std::string_view op, const Value& a);
// Python's printf-style `fmt % args`: %s %r %d %i %x %X %o %f %F %e %E %g %G
// %% with flags, width and precision; mapping keys (%(name)s) and '*' are
// UNIMPLEMENTED. `allow_unused`: no conversion may leave the one argument
// unused (Python's rule for a list/dict right operand).
absl::StatusOr<std::string> PercentFormat(std::string_view fmt, const ValueList& args,
                                          bool allow_unused = false);
// Python's `item in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);
// container[index] for a list, tuple or str with an int index; nullopt when
// out of range.
std::optional<Value> IndexSequence(const Value& container, int64_t index);
// container[start:stop:step] for a list, tuple or str; absent bounds are
// undefined or none values.
absl::StatusOr<Value> Slice(const Value& container, const Value& start, const Value& stop,
                            const Value& step);
// The items of an iterable as Python's iter() yields them: list/tuple
// items, a dict's keys, a string's characters, nothing for undefined.
absl::StatusOr<ValueList> Iterate(const Value& v);
// Python's len(): code points for strings, 0 for undefined.
absl::StatusOr<int64_t> Length(const Value& v);

}  // namespace ballast::chat
