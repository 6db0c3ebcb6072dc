// CSV reading for `ballast trace import` (trace_import.h): RFC 4180 records
// one at a time — comma-separated fields; a quoted field may hold commas,
// doubled quotes and line breaks; LF or CRLF line ends; a UTF-8 byte order
// mark is skipped, and so are blank lines — a header row whose columns are
// found by name, and data rows read through those columns with errors that
// name the file, the line and the column:
//
//   <file>:<line>: field 2: unterminated quoted field
//   <file>:<line>: missing column "GeneratedTokens" (the header row is "...")
//   <file>:<line>: column "ContextTokens": expected a non-negative integer, ...
//
// Line numbers are physical lines (1-based): a record is numbered by the
// line it starts on.
//
// Thread-compatible: one reader per stream; a CsvRow refers to the columns
// and fields it was made from, which must outlive it.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ballast::bench {

class CsvReader {
 public:
  // `file` names the input in errors.
  CsvReader(std::istream* in, std::string file) : in_(in), file_(std::move(file)) {}
  // Reads the next record into *fields; false at the end of the input.
  absl::StatusOr<bool> Next(std::vector<std::string>* fields);
  // The line on which the last record read starts.
  int64_t line() const { return start_; }
  const std::string& file() const { return file_; }

 private:
  bool GetLine(std::string* s);
  absl::Status Bad(size_t field, absl::string_view what) const;

  std::istream* in_;
  std::string file_;
  int64_t lineno_ = 0, start_ = 0;
};

// The columns a reader needs, and where the header row put them.
struct CsvColumns {
  std::vector<std::string> names;
  std::vector<size_t> index;
};

// Reads the header row (the first non-blank record) and finds each of
// `names` in it, trimmed and in any case; other columns are ignored.
absl::StatusOr<CsvColumns> ReadCsvHeader(CsvReader* csv, std::vector<std::string> names);

// A data row read through its columns (k indexes CsvColumns::names).
class CsvRow {
 public:
  CsvRow(const CsvColumns& c, const std::vector<std::string>& fields, const std::string& file,
         int64_t line)
      : c_(c), f_(fields), file_(file), line_(line) {}

  // An error naming the first column the row is too short to have.
  absl::Status CheckWidth() const;
  absl::string_view Text(size_t k) const { return f_[c_.index[k]]; }
  // Column k through `parse` (a function of absl::string_view returning a
  // StatusOr); its error is prefixed with the file, line and column.
  template <typename F>
  auto Parse(size_t k, F parse) const -> decltype(parse(absl::string_view())) {
    auto v = parse(Text(k));
    if (!v.ok()) return Bad(k, v.status().message());
    return v;
  }
  // "<file>:<line>: column \"<name>\": <what>".
  absl::Status Bad(size_t k, absl::string_view what) const;

 private:
  const CsvColumns& c_;
  const std::vector<std::string>& f_;
  const std::string& file_;
  int64_t line_;
};

}  // namespace ballast::bench
