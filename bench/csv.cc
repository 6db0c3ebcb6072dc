#include "bench/csv.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"

namespace ballast::bench {
namespace {

// "<file>:<line>: <what>".
absl::Status At(const std::string& file, int64_t line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ":", line, ": ", what));
}

}  // namespace

bool CsvReader::GetLine(std::string* s) {
  if (!std::getline(*in_, *s)) return false;
  if (++lineno_ == 1 && absl::StartsWith(*s, "\xEF\xBB\xBF")) s->erase(0, 3);
  if (!s->empty() && s->back() == '\r') s->pop_back();
  return true;
}

absl::Status CsvReader::Bad(size_t field, absl::string_view what) const {
  return At(file_, lineno_, absl::StrCat("field ", field, ": ", what));
}

absl::StatusOr<bool> CsvReader::Next(std::vector<std::string>* fields) {
  std::string line;
  do {
    if (!GetLine(&line)) return false;
  } while (absl::StripAsciiWhitespace(line).empty());
  start_ = lineno_;
  fields->assign(1, "");
  bool quoted = false, closed = false;  // inside a quoted field; just after one
  for (size_t i = 0;;) {
    if (i == line.size()) {
      if (!quoted) return true;
      // A line break inside a quoted field.
      if (!GetLine(&line)) {
        return At(file_, start_,
                  absl::StrCat("field ", fields->size(), ": unterminated quoted field"));
      }
      fields->back() += '\n';
      i = 0;
      continue;
    }
    const char c = line[i++];
    std::string& f = fields->back();
    if (quoted) {
      if (c != '"') {
        f += c;
      } else if (i < line.size() && line[i] == '"') {
        f += '"';
        ++i;
      } else {
        quoted = false;
        closed = true;
      }
    } else if (c == ',') {
      fields->emplace_back();
      closed = false;
    } else if (closed) {
      return Bad(fields->size(), "unexpected text after a closing quote");
    } else if (c == '"') {
      if (!f.empty()) return Bad(fields->size(), "a quote inside an unquoted field");
      quoted = true;
    } else {
      f += c;
    }
  }
}

absl::StatusOr<CsvColumns> ReadCsvHeader(CsvReader* csv, std::vector<std::string> names) {
  std::vector<std::string> header;
  auto more = csv->Next(&header);
  if (!more.ok()) return more.status();
  if (!*more) {
    return absl::InvalidArgumentError(absl::StrCat(csv->file(),
                                                   ": empty file; expected a header row with "
                                                   "columns ",
                                                   absl::StrJoin(names, ", ")));
  }
  CsvColumns c{std::move(names), {}};
  for (const std::string& name : c.names) {
    const auto it = std::find_if(header.begin(), header.end(), [&](const std::string& h) {
      return absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(h), name);
    });
    if (it == header.end()) {
      std::string seen = absl::StrJoin(header, ",");
      if (seen.size() > 120) seen = seen.substr(0, 120) + "...";
      return At(csv->file(), csv->line(),
                absl::StrCat("missing column \"", name, "\" (the header row is \"", seen, "\")"));
    }
    c.index.push_back(static_cast<size_t>(it - header.begin()));
  }
  return c;
}

absl::Status CsvRow::CheckWidth() const {
  for (size_t k = 0; k < c_.index.size(); ++k) {
    if (c_.index[k] >= f_.size()) {
      return Bad(k, absl::StrCat("missing (the row has ", f_.size(), " fields)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CsvRow::Bad(size_t k, absl::string_view what) const {
  return At(file_, line_, absl::StrCat("column \"", c_.names[k], "\": ", what));
}

}  // namespace ballast::bench
