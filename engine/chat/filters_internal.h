// Internal declarations shared by filters.cc and seq_filters.cc: the filter
// function type and the sequence filters' entry points.
//
// Thread-safety: pure functions.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat/builtins.h"
#include "engine/chat/value.h"

namespace ballast::chat::internal {

using FilterFn = absl::StatusOr<Value> (*)(const Value& input, const ValueList& args,
                                           const Kwargs& kwargs);

// Sequence filters (seq_filters.cc); nullptr when `name` is not one of them.
FilterFn FindSequenceFilter(std::string_view name);

}  // namespace ballast::chat::internal
