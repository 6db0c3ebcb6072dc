// A checkpoint's fingerprint: the XXH3-64 of its config.json and every
// byte of its *.safetensors files (in name order). KV chunk keys include it
// (engine::KvFingerprint), so the KV of one model is never reused by
// another, including a fine-tune with the same shapes. Reading every weight
// byte costs about one pass over the checkpoint, so NodeManager computes
// it once per checkpoint and keeps it while the files' signature (names,
// sizes, modification times) is unchanged.
//
// Thread-safety: pure functions (they read files).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ballast::node_manager {

absl::StatusOr<uint64_t> ModelFingerprint(const std::string& dir);
// Names, sizes and modification times of the files ModelFingerprint reads.
absl::StatusOr<std::string> ModelFileSignature(const std::string& dir);

}  // namespace ballast::node_manager
