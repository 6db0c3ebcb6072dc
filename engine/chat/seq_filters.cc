// Jinja's sequence filters: first, last, list, items, join, reverse, sort,
// unique, min, max, sum, map, select/reject, selectattr/rejectattr, attr,
// dictsort, batch.
#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "engine/chat/builtins.h"
#include "engine/chat/filters_internal.h"
#include "engine/chat/operators.h"
#include "engine/chat/unicode.h"

namespace ballast::chat::internal {
namespace {

#define BIND(name, ...)                           \
  ArgBinder b(name, args, kwargs, {__VA_ARGS__}); \
  if (!b.status().ok()) return b.status()

// Jinja's make_attrgetter: "a.b.0" looks up each part with getitem.
absl::StatusOr<Value> GetPath(const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return GetItem(item, attribute);
  Value v = item;
  for (absl::string_view part : absl::StrSplit(attribute.AsString(), '.')) {
    Value key = Value::String(std::string(part));
    if (!part.empty() &&
        std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      key = Value::Int(std::stoll(std::string(part)));
    }
    auto next = GetItem(v, key);
    if (!next.ok()) return next.status();
    v = std::move(*next);
  }
  return v;
}

// The sort key of Jinja's filters: lower-cased strings unless case_sensitive.
Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(unicode::Lower(v.AsString()));
  return v;
}

// Keys for sorting/aggregating `items` by an optional attribute. A string
// the list holds many times is lower-cased once, and its keys share one
// string (compared without a scan): [s] * 1000 | sort would otherwise copy
// and compare s thousands of times.
absl::StatusOr<ValueList> Keys(const ValueList& items, const Value& attribute,
                               bool case_sensitive) {
  ValueList keys;
  keys.reserve(items.size());
  absl::flat_hash_map<const std::string*, Value> lowered;
  for (const Value& item : items) {
    Value k = item;
    if (!attribute.is_undefined() && !attribute.is_none()) {
      auto got = GetPath(item, attribute);
      if (!got.ok()) return got.status();
      k = std::move(*got);
    }
    if (!case_sensitive && k.is_string()) {
      auto [it, fresh] = lowered.try_emplace(&k.AsString());
      if (fresh) it->second = SortKey(k, case_sensitive);
      keys.push_back(it->second);
    } else {
      keys.push_back(std::move(k));
    }
  }
  return keys;
}

// A hash consistent with Equals for unique's hashable keys (numbers by
// value, so 1, 1.0 and True agree; strings by content, each shared string
// hashed once; a tuple by its items' kinds and scalars, one level deep).
class KeyHasher {
 public:
  size_t operator()(const Value& v) {
    if (v.kind() != Value::Kind::kTuple) return Scalar(v);
    size_t h = absl::HashOf(v.AsList().size());
    for (const Value& item : v.AsList()) h = absl::HashOf(h, Scalar(item));
    return h;
  }

 private:
  // A container (a tuple's item) hashes by its kind alone.
  size_t Scalar(const Value& v) {
    if (v.is_number()) return absl::HashOf(v.AsDouble() == 0 ? 0.0 : v.AsDouble());
    if (v.is_string()) {
      auto [it, fresh] = strings_.try_emplace(&v.AsString());
      if (fresh) it->second = absl::HashOf(std::string_view(v.AsString()));
      return it->second;
    }
    if (v.is_object()) return absl::HashOf(&v.AsObject());
    if (v.is_callable()) return absl::HashOf(&v.AsCallable());
    return static_cast<size_t>(v.kind());  // none, undefined, containers
  }

  absl::flat_hash_map<const std::string*, size_t> strings_;
};

// Stable sort of `items` by `keys`; Python's TypeError for unorderable keys.
absl::Status SortBy(ValueList* items, const ValueList& keys, bool reverse) {
  std::vector<size_t> order(items->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  absl::Status status;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    auto c = Compare(keys[x], keys[y]);
    if (!c.ok()) {
      status = c.status();
      return false;
    }
    return reverse ? *c > 0 : *c < 0;
  });
  if (!status.ok()) return status;
  ValueList sorted;
  sorted.reserve(items->size());
  for (size_t i : order) sorted.push_back((*items)[i]);
  *items = std::move(sorted);
  return absl::OkStatus();
}

absl::StatusOr<Value> FilterFirst(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("first");
  auto items = Iterate(in);
  if (!items.ok()) return items.status();
  if (items->empty()) return Value::Undefined("No first item, sequence was empty.");
  return items->front();
}

absl::StatusOr<Value> FilterLast(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("last");
  auto items = Iterate(in);
  if (!items.ok()) return items.status();
  if (items->empty()) return Value::Undefined("No last item, sequence was empty.");
  return items->back();
}

absl::StatusOr<Value> FilterList(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("list");
  auto items = Iterate(in);
  if (!items.ok()) return items.status();
  return Value::List(std::move(*items));
}

absl::StatusOr<Value> FilterItems(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("items");
  if (in.is_undefined()) return Value::List({});
  if (!in.is_dict()) return TypeErrorStatus("Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [k, v] : in.AsDict().items) out.push_back(Value::Tuple({k, v}));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> FilterJoin(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("join", "d", "attribute");
  auto items = Iterate(in);
  if (!items.ok()) return items.status();
  absl::StatusOr<std::string> sep_text = b.Has(0) ? TextOf(b.Get(0)) : std::string();
  if (!sep_text.ok()) return sep_text.status();
  const std::string& sep = *sep_text;
  std::string out;
  for (size_t i = 0; i < items->size(); ++i) {
    Value v = (*items)[i];
    if (b.Has(1) && !b.Get(1).is_none()) {
      auto got = GetPath(v, b.Get(1));
      if (!got.ok()) return got.status();
      v = std::move(*got);
    }
    if (i > 0) out += sep;
    out += v.Str();
    if (auto st = CheckStringBytes(out.size()); !st.ok()) return st;
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterReverse(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("reverse");
  if (in.is_string()) return Slice(in, Value(), Value(), Value::Int(-1));
  auto items = Iterate(in);
  if (!items.ok()) return items.status();
  std::reverse(items->begin(), items->end());
  return Value::List(std::move(*items));
}

absl::StatusOr<Value> FilterSort(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("sort", "reverse", "case_sensitive", "attribute");
  auto items = Iterate(in);
  if (!items.ok()) return items.status();
  auto keys = Keys(*items, b.Get(2), b.Get(1).Truthy());
  if (!keys.ok()) return keys.status();
  if (auto st = SortBy(&*items, *keys, b.Get(0).Truthy()); !st.ok()) return st;
  return Value::List(std::move(*items));
}

absl::StatusOr<Value> FilterDictsort(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("dictsort", "case_sensitive", "by", "reverse");
  if (!in.is_dict()) return TypeErrorStatus("dictsort needs a mapping");
  const std::string by = b.Has(1) ? b.Get(1).Str() : "key";
  if (by != "key" && by != "value") {
    return absl::InvalidArgumentError(
        "FilterArgumentError: You can only sort by either 'key' or 'value'");
  }
  ValueList items, keys;
  for (const auto& [k, v] : in.AsDict().items) {
    items.push_back(Value::Tuple({k, v}));
    keys.push_back(SortKey(by == "key" ? k : v, b.Get(0).Truthy()));
  }
  if (auto st = SortBy(&items, keys, b.Get(2).Truthy()); !st.ok()) return st;
  return Value::List(std::move(items));
}

absl::StatusOr<Value> FilterUnique(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("unique", "case_sensitive", "attribute");
  auto items = Iterate(in);
  if (!items.ok()) return items.status();
  auto keys = Keys(*items, b.Get(1), b.Get(0).Truthy());
  if (!keys.ok()) return keys.status();
  // Seen keys by hash: linear in the items, where comparing each with every
  // key seen took 42 s on range(100000).
  ValueList out;
  KeyHasher hash;
  absl::flat_hash_map<size_t, ValueList> seen;
  for (size_t i = 0; i < items->size(); ++i) {
    const Value& k = (*keys)[i];
    if (k.kind() == Value::Kind::kList || k.is_dict()) {
      return TypeErrorStatus(Cat("unhashable type: '", k.TypeName(), "'"));
    }
    ValueList& bucket = seen[hash(k)];
    // NaN: one float object in Python's set, however often the list holds it.
    const bool nan = k.is_float() && std::isnan(k.AsDouble());
    const bool dup = std::any_of(bucket.begin(), bucket.end(), [&](const Value& s) {
      return nan ? s.is_float() && std::isnan(s.AsDouble()) : Equals(s, k);
    });
    if (dup) continue;
    bucket.push_back(k);
    out.push_back((*items)[i]);
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> MinMax(const Value& in, const ValueList& args, const Kwargs& kwargs,
                             bool want_max) {
  BIND(want_max ? "max" : "min", "case_sensitive", "attribute");
  auto items = Iterate(in);
  if (!items.ok()) return items.status();
  if (items->empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  auto keys = Keys(*items, b.Get(1), b.Get(0).Truthy());
  if (!keys.ok()) return keys.status();
  size_t best = 0;
  for (size_t i = 1; i < items->size(); ++i) {
    auto c = Compare((*keys)[i], (*keys)[best]);
    if (!c.ok()) return c.status();
    if (want_max ? *c > 0 : *c < 0) best = i;
  }
  return (*items)[best];
}

absl::StatusOr<Value> FilterMin(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  return MinMax(in, args, kwargs, false);
}
absl::StatusOr<Value> FilterMax(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  return MinMax(in, args, kwargs, true);
}

// sum(items, start=[...]): lists appended in place, linear in the result
// (adding each to a growing copy was quadratic).
absl::StatusOr<Value> SumLists(const Value& start, const ValueList& items, const Value& attribute) {
  ValueList total = start.AsList();
  for (const Value& item : items) {
    Value v = item;
    if (!attribute.is_undefined() && !attribute.is_none()) {
      auto got = GetPath(item, attribute);
      if (!got.ok()) return got.status();
      v = std::move(*got);
    }
    if (v.kind() != Value::Kind::kList) return BinaryOp("+", Value::List({}), v);  // its TypeError
    if (auto st = CheckListItems(total.size() + v.AsList().size()); !st.ok()) return st;
    total.insert(total.end(), v.AsList().begin(), v.AsList().end());
  }
  return Value::List(std::move(total));
}

absl::StatusOr<Value> FilterSum(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("sum", "attribute", "start");
  auto items = Iterate(in);
  if (!items.ok()) return items.status();
  Value total = b.Has(1) ? b.Get(1) : Value::Int(0);
  if (total.is_string()) {  // Python's sum() refuses strings
    return TypeErrorStatus("sum() can't sum strings [use ''.join(seq) instead]");
  }
  if (total.kind() == Value::Kind::kList) return SumLists(total, *items, b.Get(0));
  for (const Value& item : *items) {
    Value v = item;
    if (b.Has(0) && !b.Get(0).is_none()) {
      auto got = GetPath(item, b.Get(0));
      if (!got.ok()) return got.status();
      v = std::move(*got);
    }
    auto next = BinaryOp("+", total, v);
    if (!next.ok()) return next.status();
    total = std::move(*next);
  }
  return total;
}

absl::StatusOr<Value> FilterAttr(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("attr", "name");
  if (in.is_dict()) {  // Python getattr: a dict's keys are not attributes
    auto m = GetAttr(Value::Dict({}), b.Get(0).Str());
    if (m.ok() && m->is_callable()) return GetAttr(in, b.Get(0).Str());
    return Value::Undefined(Cat("'dict object' has no attribute '", b.Get(0).Str(), "'"));
  }
  return GetAttr(in, b.Get(0).Str());
}

absl::StatusOr<Value> FilterMap(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  if (!in.Truthy()) return Value::List({});  // Jinja: `if value:` before iterating
  auto items = Iterate(in);
  if (!items.ok()) return items.status();
  ValueList out;
  if (args.empty()) {  // map(attribute='x', default=...)
    BIND("map", "attribute", "default");
    for (const Value& item : *items) {
      auto got = GetPath(item, b.Get(0));
      if (!got.ok()) return got.status();
      out.push_back(got->is_undefined() && b.Has(1) ? b.Get(1) : *got);
    }
    return Value::List(std::move(out));
  }
  if (!args[0].is_string()) return TypeErrorStatus("map needs a filter name or attribute=");
  const ValueList rest(args.begin() + 1, args.end());
  for (const Value& item : *items) {
    auto v = ApplyFilter(args[0].AsString(), item, rest, kwargs);
    if (!v.ok()) return v.status();
    out.push_back(std::move(*v));
  }
  return Value::List(std::move(out));
}

// select/reject (by_attr=false) and selectattr/rejectattr (by_attr=true).
absl::StatusOr<Value> SelectOrReject(const Value& in, const ValueList& args, bool by_attr,
                                     bool select) {
  if (!in.Truthy()) return Value::List({});  // Jinja: `if value:` before iterating
  auto items = Iterate(in);
  if (!items.ok()) return items.status();
  size_t next = 0;
  Value attribute;
  if (by_attr) {
    if (args.empty()) return TypeErrorStatus("selectattr/rejectattr need an attribute");
    attribute = args[next++];
  }
  std::string test;
  if (next < args.size()) {
    if (!args[next].is_string()) return TypeErrorStatus("the test name must be a str");
    test = args[next++].AsString();
    if (!IsKnownTest(test)) return absl::InvalidArgumentError("no test named '" + test + "'");
  }
  const ValueList test_args(args.begin() + next, args.end());
  ValueList out;
  for (const Value& item : *items) {
    Value v = item;
    if (by_attr) {
      auto got = GetPath(item, attribute);
      if (!got.ok()) return got.status();
      v = std::move(*got);
    }
    bool pass = v.Truthy();
    if (!test.empty()) {
      auto r = ApplyTest(test, v, test_args);
      if (!r.ok()) return r.status();
      pass = *r;
    }
    if (pass == select) out.push_back(item);
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> FilterSelect(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  return SelectOrReject(in, args, false, true);
}
absl::StatusOr<Value> FilterReject(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  return SelectOrReject(in, args, false, false);
}
absl::StatusOr<Value> FilterSelectattr(const Value& in, const ValueList& args,
                                       const Kwargs& kwargs) {
  return SelectOrReject(in, args, true, true);
}
absl::StatusOr<Value> FilterRejectattr(const Value& in, const ValueList& args,
                                       const Kwargs& kwargs) {
  return SelectOrReject(in, args, true, false);
}

absl::StatusOr<Value> FilterBatch(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("batch", "linecount", "fill_with");
  auto items = Iterate(in);
  if (!items.ok()) return items.status();
  const int64_t n = b.Get(0).is_number() ? b.Get(0).AsInt() : 0;
  if (n <= 0) return absl::InvalidArgumentError("ValueError: batch size must be positive");
  // The fill makes the last batch n items long.
  if (b.Has(1) && !b.Get(1).is_none()) {
    if (auto st = CheckListItems(n); !st.ok()) return st;
  }
  ValueList out, batch;
  for (const Value& item : *items) {
    batch.push_back(item);
    if (static_cast<int64_t>(batch.size()) == n)
      out.push_back(Value::List(std::exchange(batch, {})));
  }
  if (!batch.empty()) {
    if (b.Has(1) && !b.Get(1).is_none()) {
      while (static_cast<int64_t>(batch.size()) < n) batch.push_back(b.Get(1));
    }
    out.push_back(Value::List(std::move(batch)));
  }
  return Value::List(std::move(out));
}

#undef BIND

struct Entry {
  std::string_view name;
  FilterFn fn;
};

constexpr Entry kSequenceFilters[] = {
    {"first", FilterFirst},
    {"last", FilterLast},
    {"list", FilterList},
    {"items", FilterItems},
    {"join", FilterJoin},
    {"reverse", FilterReverse},
    {"sort", FilterSort},
    {"dictsort", FilterDictsort},
    {"unique", FilterUnique},
    {"min", FilterMin},
    {"max", FilterMax},
    {"sum", FilterSum},
    {"attr", FilterAttr},
    {"map", FilterMap},
    {"select", FilterSelect},
    {"reject", FilterReject},
    {"selectattr", FilterSelectattr},
    {"rejectattr", FilterRejectattr},
    {"batch", FilterBatch},
};

}  // namespace

FilterFn FindSequenceFilter(std::string_view name) {
  for (const auto& f : kSequenceFilters) {
    if (f.name == name) return f.fn;
  }
  return nullptr;
}

}  // namespace ballast::chat::internal
