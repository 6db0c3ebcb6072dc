// Built-ins of the chat-template interpreter: Jinja's filters and tests,
// attribute and item access (Jinja's sandboxed getattr/getitem), the
// methods of str/dict/list that templates call, and tojson.
//
// The behaviour is Jinja 3.1's with Hugging Face's overrides: `tojson` is
// json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False) with those keyword arguments accepted; the environment is
// immutable (list.append, dict.update, ... are refused as unsafe).
//
// Thread-safety: pure functions over immutable values (a namespace may be
// read, never written, here).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/chat/value.h"

namespace ballast::chat {

// --- filters (filters.cc, seq_filters.cc)
// Filters implemented here.
bool IsKnownFilter(std::string_view name);
// Filters Jinja has that are not implemented (they fail as UNIMPLEMENTED).
bool IsJinjaFilter(std::string_view name);
absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& input, const ValueList& args,
                                  const Kwargs& kwargs);

// --- tests (jinja_tests.cc)
bool IsKnownTest(std::string_view name);
absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& input, const ValueList& args);

// --- attribute access and methods (methods.cc)
// `obj.name`: a method of str/dict/list first, then the key/attribute;
// undefined when missing. An error only when obj is undefined.
absl::StatusOr<Value> GetAttr(const Value& obj, std::string_view name);
// `obj[key]`: the item first, then (for a str key) the method; undefined
// when missing.
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);

// --- JSON (json.cc)
struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // nullopt: one line
  std::string item_separator = ", ";  // ", " one line; "," with indent
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// Python's json.dumps.
absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options);

// Binds positional and keyword arguments to named parameters, as a Python
// signature would: Get(i) is the i-th parameter or undefined when absent.
class ArgBinder {
 public:
  ArgBinder(std::string_view function, const ValueList& args, const Kwargs& kwargs,
            std::initializer_list<std::string_view> params);
  const absl::Status& status() const { return status_; }
  const Value& Get(size_t i) const { return values_[i]; }
  bool Has(size_t i) const { return !values_[i].is_undefined(); }

 private:
  std::vector<Value> values_;
  absl::Status status_;
};

// "TypeError: <message>" as an INVALID_ARGUMENT status.
absl::Status TypeErrorStatus(std::string_view message);

// The most one value may hold, so that a template cannot make the server
// allocate gigabytes ('x' * 10**10, doubling a list, a huge center()
// width): strings of kMaxStringBytes (16 MiB, value.h) and lists of
// 1,048,576 items (about 32 MiB of values). Past them, OUT_OF_RANGE
// "OverflowError: ..." naming the cap.
inline constexpr uint64_t kMaxListItems = uint64_t{1} << 20;
absl::Status CheckStringBytes(uint64_t bytes);
absl::Status CheckListItems(uint64_t items);

// v.Str() (v.Repr() with `repr`) for a filter or test to work on:
// OverflowError past kMaxStringBytes, where Str() and Repr() cut the text.
absl::StatusOr<std::string> TextOf(const Value& v, bool repr = false);

}  // namespace ballast::chat
