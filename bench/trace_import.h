// `ballast trace import`: converts public production LLM traces into the
// JSONL trace format of trace.h, so that `ballast bench` replays them.
//
// Formats (columns found by name in the header row, in any order, matched
// case-insensitively; other columns are ignored):
//  * azure: the Azure LLM inference traces (2023 and 2024 releases), CSV
//    with TIMESTAMP (a UTC datetime, `2023-11-16 18:15:46.6805900`: any
//    number of fractional digits, an optional `T` separator and an optional
//    `Z` or `+hh:mm` offset), ContextTokens and GeneratedTokens. Each input
//    file is one service (e.g. the code and the conversation files): the
//    i-th --input goes to the i-th model.
//  * burstgpt: BurstGPT's CSV with Timestamp (seconds, a number), Model
//    (ChatGPT, GPT-4, ...), Request tokens, Response tokens, Total tokens
//    (not read) and Log Type (Conversation log / API log; read only with
//    `by_log_type`). A service is a Model value, or with `by_log_type` a
//    (Model, Log Type) pair named "ChatGPT (API log)". Rows with Response
//    tokens 0 are BurstGPT's failed requests: they are skipped and counted.
//    Several files are read as parts of one trace.
//  * mooncake: Mooncake's JSONL, one object per line with timestamp
//    (milliseconds), input_length, output_length and hash_ids (an array of
//    integers, each naming one 512-token block of the prompt; optional).
//    Each input file is one service, mapped like azure's. The prompt is
//    written as text so that requests sharing hash_ids share prompt
//    prefixes: block i of the prompt is SynthesizePrompt(B, hash_ids[i])
//    with B = 512 x length_scale (at least 1), the blocks concatenated, text
//    of the request's own (unshared) salt appended if they fall short, and
//    the whole cut to the (scaled) input length. That text has one byte per
//    token, so its length in bytes equals the trace's token count only for
//    the byte tokenizer; a real tokenizer gets other counts, but requests
//    with common hash_ids still share a common prompt prefix. A line
//    without hash_ids gets a prompt length only (the replayer's prompt,
//    shared with no other request).
// CSV is RFC 4180 (csv.h): quoted fields (holding commas, doubled quotes,
// line breaks), LF or CRLF line ends, a UTF-8 byte order mark skipped; blank
// lines are skipped, in JSONL too.
//
// Mapping: services go onto `models` in order of first appearance among the
// imported requests (burstgpt) or in --input order (azure, mooncake); more
// services than models is an error naming both counts. Arrivals: a request
// at trace time t (seconds after the earliest timestamp of all inputs,
// BurstGPT's failed rows included) is kept if start_s <= t < start_s +
// duration_s, and arrives at (t - start_s) x time_scale. Lengths are
// multiplied by length_scale and rounded, each at least 1 (a zero-token
// output becomes 1). Requests carry no per-request SLO (the model's
// applies), are sorted by arrival (ties in input order) and are named r0,
// r1, ... in that order. Every row is held in memory (some 60 bytes, plus
// Mooncake's hash_ids) until the window is applied: inputs need not be
// sorted.
//
// Errors name the file and line, and the column (CSV) or field (JSONL):
// a missing header column, a short row, a non-numeric or negative length, an
// unparseable timestamp, bad JSON, a wrong type.
//
// Thread-safety: pure functions of their arguments (they read the input
// files); safe to call concurrently.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bench/trace.h"

namespace ballast::bench {

enum class ImportFormat { kAzure, kBurstGpt, kMooncake };

// "azure" | "burstgpt" | "mooncake".
absl::StatusOr<ImportFormat> ParseImportFormat(absl::string_view name);
const char* ImportFormatName(ImportFormat f);

struct ImportOptions {
  ImportFormat format = ImportFormat::kAzure;
  std::vector<std::string> inputs;  // at least one file
  std::vector<std::string> models;  // the catalogue models services map onto
  double start_s = 0;               // window start, seconds after the first timestamp
  double duration_s = std::numeric_limits<double>::infinity();  // window length (> 0)
  double length_scale = 1.0;  // multiplies prompt and output lengths (> 0)
  double time_scale = 1.0;    // multiplies arrival offsets (> 0; 0.5: twice the rate)
  bool by_log_type = false;   // burstgpt: a service per (Model, Log Type)
};

struct ImportResult {
  std::vector<TraceRecord> records;
  int64_t rows = 0;            // data rows / lines read, all inputs
  int64_t failed = 0;          // burstgpt rows with Response tokens 0 (skipped)
  int64_t outside_window = 0;  // rows before start_s or at/after the window's end
  int64_t outputs_raised = 0;  // kept requests whose output was 0 tokens, sent as 1
  double trace_span_s = 0;     // last - first timestamp, all rows
  // (service, model) in mapping order; azure and mooncake name a service by
  // its input file.
  std::vector<std::pair<std::string, std::string>> mapping;
};

absl::StatusOr<ImportResult> ImportTrace(const ImportOptions& o);

// One line: requests written to `out`, rows skipped and why, the window,
// the scales if not 1, the model mapping.
std::string FormatImportSummary(const ImportOptions& o, const ImportResult& r,
                                const std::string& out);

// The text prompt of a Mooncake request (see above): `tokens` bytes made of
// `block_tokens`-byte blocks derived from `hash_ids`, then from `tail_salt`.
std::string BlockPrompt(const std::vector<int64_t>& hash_ids, int tokens, int block_tokens,
                        uint64_t tail_salt);

}  // namespace ballast::bench
