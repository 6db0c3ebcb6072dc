#include "engine/tokenizer/post_processor.h"

#include "absl/strings/str_cat.h"

namespace ballast::tokenizer {
namespace {

// "cls": ["[CLS]", 101] -> 101.
absl::StatusOr<int> PairId(const JsonField& j, std::string_view key) {
  const JsonField f = j[key];
  if (!f.value().is_array() || f.value().size() != 2 || !f.value()[1].is_number_integer()) {
    return f.Error("expected [token, id]");
  }
  return f.value()[1].get<int>();
}

absl::StatusOr<SpecialTokensAround> ParseTemplate(const JsonField& j) {
  SpecialTokensAround out;
  const JsonField single = j["single"];
  if (auto st = single.ExpectArray(); !st.ok()) return st;
  const JsonField specials = j["special_tokens"];
  bool seen_sequence = false;
  for (size_t i = 0; i < single.value().size(); ++i) {
    const JsonField item = single.at(i);
    if (item.Has("Sequence")) {
      seen_sequence = true;
      continue;
    }
    auto name = item["SpecialToken"].String("id");
    if (!name.ok()) return item.Error("expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    const JsonField ids = specials[*name]["ids"];
    if (!ids.value().is_array()) {
      return specials.Error(absl::StrCat("no ids for special token \"", *name, "\""));
    }
    for (size_t k = 0; k < ids.value().size(); ++k) {
      if (!ids.value()[k].is_number_integer()) return ids.at(k).Error("expected an integer id");
      (seen_sequence ? out.suffix : out.prefix).push_back(ids.value()[k].get<int>());
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<SpecialTokensAround> ParsePostProcessor(const JsonField& j) {
  if (j.is_null()) return SpecialTokensAround{};
  if (auto st = j.ExpectObject(); !st.ok()) return st;
  auto type = j.String("type");
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return SpecialTokensAround{};
  if (*type == "TemplateProcessing") return ParseTemplate(j);
  if (*type == "BertProcessing" || *type == "RobertaProcessing") {
    auto cls = PairId(j, "cls");
    if (!cls.ok()) return cls.status();
    auto sep = PairId(j, "sep");
    if (!sep.ok()) return sep.status();
    return SpecialTokensAround{{*cls}, {*sep}};
  }
  if (*type == "Sequence") {
    const JsonField list = j["processors"];
    if (auto st = list.ExpectArray(); !st.ok()) return st;
    SpecialTokensAround out;  // each processor wraps what the previous one produced
    for (size_t i = 0; i < list.value().size(); ++i) {
      auto p = ParsePostProcessor(list.at(i));
      if (!p.ok()) return p.status();
      out.prefix.insert(out.prefix.begin(), p->prefix.begin(), p->prefix.end());
      out.suffix.insert(out.suffix.end(), p->suffix.begin(), p->suffix.end());
    }
    return out;
  }
  return absl::UnimplementedError(absl::StrCat(
      j.origin(), ": ", j.path(), ".type: post-processor \"", *type, "\" is not supported"));
}

}  // namespace ballast::tokenizer
