// Evaluator of the chat-template interpreter: runs a parsed template
// against a context and returns the rendered text.
//
// Scoping follows Jinja: each for-loop iteration and each macro call gets a
// fresh scope (a `set` inside does not leak out; namespace() objects carry
// state across iterations), `if` blocks share their enclosing scope, and
// top-level `set` shadows context variables. Output and recursion are
// bounded (16 MiB, 64 nested macro calls, range() ≤ 100000, `max_steps`;
// chat_template.h's RenderLimits), as a server must be.
//
// Errors: raise_exception(msg) fails with INVALID_ARGUMENT whose message is
// exactly `msg` (IsRaisedException() tells it apart); other runtime errors
// (TypeError, undefined attribute of an undefined value, ...) carry
// "chat template L:C: " and Python's message; unimplemented features fail
// with UNIMPLEMENTED.
//
// Thread-safety: Evaluate only reads `body`; each call has its own state, so
// concurrent calls on one tree are safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/chat/ast.h"
#include "nlohmann/json.hpp"

namespace ballast::chat {

absl::StatusOr<std::string> Evaluate(const StmtList& body, const nlohmann::ordered_json& context,
                                     int64_t max_steps);

// Whether `status` came from the template's raise_exception().
bool IsRaisedException(const absl::Status& status);

namespace internal {
// The built-in globals: range, namespace, dict, raise_exception,
// strftime_now (globals.cc).
ValueDict MakeGlobals();
// The error raise_exception(message) returns.
absl::Status RaisedException(std::string message);
// `status` with "chat template L:C: " before its message, unless it is OK,
// raised by the template, or already located (globals.cc).
absl::Status LocateError(SourcePos pos, const absl::Status& status);
// The `loop` variable of iteration i over `items` (globals.cc); its
// changed() remembers its last arguments in `last_changed`.
Value MakeLoop(const ValueList& items, size_t i, std::shared_ptr<Value> last_changed);
}  // namespace internal

}  // namespace ballast::chat
