// KvFileEnv: the file operations the SSD KV tier needs, behind an
// interface (as leveldb's Env) so tests inject faults — a flipped byte, a
// truncated file, a full disk — without real failures.
//
// WriteAtomic writes to a temporary name in the same directory and renames
// it into place, so a reader (or a node restarted after a crash) sees the
// whole file or none of it; temporaries end in kTempSuffix and are deleted
// by whoever rebuilds the index.
//
// Thread-safety: implementations are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ballast::transfer {

inline constexpr char kTempSuffix[] = ".tmp";

class KvFileEnv {
 public:
  virtual ~KvFileEnv() = default;
  // Creates `dir` (and parents) if missing.
  virtual absl::Status CreateDir(const std::string& dir) = 0;
  // Writes the concatenated `pieces` to `path` atomically (see above).
  // RESOURCE_EXHAUSTED when the disk is full (nothing is left behind).
  virtual absl::Status WriteAtomic(const std::string& path,
                                   absl::Span<const std::string_view> pieces) = 0;
  // WriteAtomic for page-aligned pieces: each piece's data starts on a
  // page, every piece but the last is a whole number of pages, and the
  // last one's buffer may be read up to its size rounded up to a page
  // (KvChunk payloads are). Envs with direct I/O write them past the page
  // cache; the default is WriteAtomic.
  virtual absl::Status WriteAtomicAligned(const std::string& path,
                                          absl::Span<const std::string_view> pieces) {
    return WriteAtomic(path, pieces);
  }
  // Reads exactly `n` bytes at `offset`; DATA_LOSS if the file is shorter.
  virtual absl::Status Read(const std::string& path, uint64_t offset, void* dst, size_t n) = 0;
  virtual absl::StatusOr<uint64_t> FileSize(const std::string& path) = 0;
  virtual absl::Status Remove(const std::string& path) = 0;
  // Names (not paths) of the regular files in `dir`.
  virtual absl::StatusOr<std::vector<std::string>> List(const std::string& dir) = 0;
  // How reads are done, for logs.
  virtual std::string Describe() const { return "pread"; }
  // Reads and writes done with direct I/O so far (0 where there is none).
  virtual int64_t direct_reads() const { return 0; }
  virtual int64_t direct_writes() const { return 0; }
};

// The real file system: pread/pwrite, temporary + rename.
std::unique_ptr<KvFileEnv> NewPosixKvFileEnv();

// The SSD tier's default (kv_file_env_uring.cc): the Posix env, but reads
// of page-aligned ranges into page-aligned buffers, and WriteAtomicAligned,
// go through io_uring with O_DIRECT, up to 16 requests of 1 MiB in flight,
// bypassing the page cache (the DRAM tier is the cache, with a budget).
// Falls back to pread/pwrite where the kernel refuses io_uring or the file
// system O_DIRECT.
std::unique_ptr<KvFileEnv> NewDirectKvFileEnv();

}  // namespace ballast::transfer
