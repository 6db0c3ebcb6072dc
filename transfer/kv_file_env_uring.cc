// The SSD tier's file env: reads and aligned atomic writes with io_uring
// and O_DIRECT (no page-cache copy, many requests in flight per file),
// everything else as the Posix env. A read or write falls back to
// pread/pwrite where the kernel refuses io_uring (seccomp, old kernels),
// the file system refuses O_DIRECT (tmpfs), or the request is not
// page-aligned (offset and buffer; an unaligned read tail goes through the
// page cache). A direct write writes whole pages and then truncates the
// file to its exact size.
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"
#include "transfer/kv_file_env.h"

namespace ballast::transfer {
namespace {

constexpr size_t kAlign = 4096;      // O_DIRECT offset, length and buffer alignment
constexpr size_t kPiece = 1u << 20;  // one read request
constexpr unsigned kDepth = 16;      // requests in flight per read

// An io_uring instance; one Read uses one at a time.
struct Ring {
  io_uring ring{};
  bool live = false;  // io_uring_queue_init succeeded
  ~Ring() {
    if (live) io_uring_queue_exit(&ring);
  }
};

// One Direct call (UringKvFileEnv::Direct): the pieces still to do, the
// ring's slots in flight and the first error.
class DirectIo {
 public:
  DirectIo(Ring* r, int fd, const std::string& path, uint64_t offset, void* dst, size_t n,
           bool write)
      : r_(r),
        fd_(fd),
        path_(path),
        offset_(offset),
        n_(n),
        write_(write),
        op_(write ? "write" : "read"),
        base_(static_cast<uint8_t*>(dst)),
        inflight_(kDepth) {
    for (size_t at = 0; at < n; at += kPiece) todo_.push_back({at, std::min(kPiece, n - at)});
    for (unsigned i = 0; i < kDepth; ++i) free_slots_.push_back(kDepth - 1 - i);
  }

  // Runs every piece to completion (or the first error); see Direct.
  absl::Status Run(bool* broken) {
    while (true) {
      PrepareRequests();
      if (queued_ + submitted_ == 0) break;
      if (queued_ > 0 && !Submit()) break;
      if (!Reap()) {
        *broken = true;  // completions left unreaped
        return st_;
      }
    }
    if (queued_ > 0) *broken = true;  // prepared requests left in the ring
    if (st_.ok() && next_ < todo_.size()) {
      st_ = absl::InternalError(absl::StrCat(op_, " incomplete"));
    }
    return st_;
  }

 private:
  struct Piece {
    uint64_t at;  // relative to offset
    size_t left;
  };

  // Keeps the first error.
  void Fail(absl::Status why) {
    if (st_.ok()) st_ = std::move(why);
  }

  // Prepares a request per free slot (and free SQE) while pieces remain.
  void PrepareRequests() {
    while (st_.ok() && next_ < todo_.size() && !free_slots_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&r_->ring);
      if (sqe == nullptr) break;
      const unsigned slot = free_slots_.back();
      free_slots_.pop_back();
      inflight_[slot] = todo_[next_++];
      const Piece& p = inflight_[slot];
      if (write_) {
        io_uring_prep_write(sqe, fd_, base_ + p.at, static_cast<unsigned>(p.left), offset_ + p.at);
      } else {
        io_uring_prep_read(sqe, fd_, base_ + p.at, static_cast<unsigned>(p.left), offset_ + p.at);
      }
      io_uring_sqe_set_data64(sqe, slot);
      ++queued_;
    }
  }

  // Submits the prepared requests; false when nothing is in the kernel to
  // wait for (no progress can be made).
  bool Submit() {
    const int got = io_uring_submit(&r_->ring);
    if (got > 0) {
      queued_ -= static_cast<unsigned>(got);
      submitted_ += static_cast<unsigned>(got);
    } else if (got != -EINTR && got != -EAGAIN && got != -EBUSY) {
      Fail(absl::UnavailableError(absl::StrCat("io_uring submit: ", std::strerror(-got))));
    }
    if (submitted_ == 0) {  // nothing to wait for: cannot make progress
      if (st_.ok()) Fail(absl::UnavailableError("io_uring accepted no request"));
      return false;
    }
    return true;
  }

  // Waits for completions and handles each; false if the wait failed.
  bool Reap() {
    // Reap at least one completion, then whatever else is ready.
    io_uring_cqe* cqe = nullptr;
    int w = io_uring_wait_cqe(&r_->ring, &cqe);
    while (w == -EINTR) w = io_uring_wait_cqe(&r_->ring, &cqe);
    if (w < 0) {
      Fail(absl::UnavailableError(absl::StrCat("io_uring wait: ", std::strerror(-w))));
      return false;
    }
    while (cqe != nullptr) {
      const auto slot = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      io_uring_cqe_seen(&r_->ring, cqe);
      --submitted_;
      Complete(slot, res);
      cqe = nullptr;
      if (io_uring_peek_cqe(&r_->ring, &cqe) != 0) cqe = nullptr;
    }
    return true;
  }

  // Handles the completion `res` of the request in `slot` and frees the slot.
  void Complete(unsigned slot, int res) {
    const Piece& p = inflight_[slot];
    if (res == -EINVAL || res == -EOPNOTSUPP) {
      Fail(absl::InvalidArgumentError(absl::StrCat("O_DIRECT ", op_, " refused")));
    } else if (res == -ENOSPC || res == -EDQUOT) {
      Fail(absl::ResourceExhaustedError(absl::StrCat("write ", path_, ": disk full")));
    } else if (res < 0) {
      Fail(absl::InternalError(absl::StrCat(op_, " ", path_, ": ", std::strerror(-res))));
    } else if (res == 0 && write_) {
      Fail(absl::InternalError(absl::StrCat("write ", path_, ": no progress")));
    } else if (res == 0) {
      Fail(absl::DataLossError(absl::StrCat(path_, ": truncated (", offset_ + p.at,
                                            " bytes, expected ", offset_ + n_, ")")));
    } else if (static_cast<size_t>(res) < p.left) {  // short: the rest again
      todo_.push_back({p.at + res, p.left - res});
    }
    free_slots_.push_back(slot);
  }

  Ring* const r_;
  const int fd_;
  const std::string& path_;
  const uint64_t offset_;
  const size_t n_;
  const bool write_;
  const char* const op_;
  uint8_t* const base_;
  std::vector<Piece> todo_;
  std::vector<Piece> inflight_;
  std::vector<unsigned> free_slots_;
  size_t next_ = 0;
  unsigned queued_ = 0, submitted_ = 0;  // prepared but not submitted; in the kernel
  absl::Status st_;
};

class UringKvFileEnv final : public KvFileEnv {
 public:
  UringKvFileEnv() : posix_(NewPosixKvFileEnv()) {}

  absl::Status CreateDir(const std::string& dir) override { return posix_->CreateDir(dir); }
  absl::Status WriteAtomic(const std::string& path,
                           absl::Span<const std::string_view> pieces) override {
    return posix_->WriteAtomic(path, pieces);
  }
  absl::Status WriteAtomicAligned(const std::string& path,
                                  absl::Span<const std::string_view> pieces) override {
    uint64_t total = 0;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const bool last = i + 1 == pieces.size();
      if (reinterpret_cast<uintptr_t>(pieces[i].data()) % kAlign != 0 ||
          (!last && pieces[i].size() % kAlign != 0)) {
        return Buffered(path, pieces);
      }
      total += pieces[i].size();
    }
    const std::string tmp = absl::StrCat(path, kTempSuffix);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0) return Buffered(path, pieces);  // no O_DIRECT here, or its error message
    std::unique_ptr<Ring> ring = TakeRing();
    bool broken = false;
    absl::Status st = ring ? absl::OkStatus() : absl::UnavailableError("io_uring unavailable");
    uint64_t at = 0;
    for (size_t i = 0; st.ok() && i < pieces.size(); ++i) {
      const size_t whole = (pieces[i].size() + kAlign - 1) / kAlign * kAlign;
      st = Direct(ring.get(), fd, tmp, at, const_cast<char*>(pieces[i].data()), whole, &broken,
                  /*write=*/true);
      at += pieces[i].size();
    }
    if (st.ok() && ::ftruncate(fd, static_cast<off_t>(total)) != 0) {
      st = absl::InternalError(absl::StrCat("truncate ", tmp, ": ", std::strerror(errno)));
    }
    ::close(fd);
    if (ring && !broken) GiveRing(std::move(ring));
    if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
      st = absl::InternalError(absl::StrCat("rename ", tmp, ": ", std::strerror(errno)));
    }
    if (!st.ok()) ::unlink(tmp.c_str());
    if (absl::IsUnavailable(st) || absl::IsInvalidArgument(st)) return Buffered(path, pieces);
    if (st.ok()) direct_writes_.fetch_add(1);
    return st;
  }
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    return posix_->FileSize(path);
  }
  absl::Status Remove(const std::string& path) override { return posix_->Remove(path); }
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    return posix_->List(dir);
  }
  std::string Describe() const override {
    return absl::StrCat("io_uring + O_DIRECT (reads: ", direct_reads_.load(), " direct, ",
                        buffered_reads_.load(),
                        " through the page cache; writes: ", direct_writes_.load(), " direct, ",
                        buffered_writes_.load(), " buffered)");
  }
  int64_t direct_reads() const override { return direct_reads_.load(); }
  int64_t direct_writes() const override { return direct_writes_.load(); }

  absl::Status Read(const std::string& path, uint64_t offset, void* dst, size_t n) override {
    const size_t direct = n / kAlign * kAlign;
    if (direct == 0 || offset % kAlign != 0 || reinterpret_cast<uintptr_t>(dst) % kAlign != 0) {
      return Buffered(path, offset, dst, n);
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0 && errno == EINVAL) return Buffered(path, offset, dst, n);  // no O_DIRECT here
    if (fd < 0) return posix_->Read(path, offset, dst, n);                 // its error message
    std::unique_ptr<Ring> ring = TakeRing();
    bool broken = false;
    absl::Status st = ring ? Direct(ring.get(), fd, path, offset, dst, direct, &broken,
                                    /*write=*/false)
                           : absl::UnavailableError("io_uring unavailable");
    ::close(fd);
    if (ring && !broken) GiveRing(std::move(ring));  // a broken ring is torn down
    if (absl::IsUnavailable(st) || absl::IsInvalidArgument(st)) {
      return Buffered(path, offset, dst, n);  // refused by the kernel: the same bytes via pread
    }
    if (!st.ok()) return st;
    direct_reads_.fetch_add(1);
    if (direct < n) {
      return posix_->Read(path, offset + direct, static_cast<uint8_t*>(dst) + direct, n - direct);
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Buffered(const std::string& path, uint64_t offset, void* dst, size_t n) {
    buffered_reads_.fetch_add(1);
    return posix_->Read(path, offset, dst, n);
  }
  absl::Status Buffered(const std::string& path, absl::Span<const std::string_view> pieces) {
    buffered_writes_.fetch_add(1);
    return posix_->WriteAtomic(path, pieces);
  }

  // Reads (or writes) [offset, offset + n) (all aligned) with up to kDepth
  // requests of kPiece bytes in flight. UNAVAILABLE/INVALID_ARGUMENT: the
  // kernel refused (the caller falls back); DATA_LOSS: the file is shorter
  // (reads); RESOURCE_EXHAUSTED: the disk is full (writes). Every request
  // submitted has completed when it returns, also on errors; `*broken` is
  // set when the ring must not be reused (requests left unsubmitted in it,
  // or completions it could not reap).
  absl::Status Direct(Ring* r, int fd, const std::string& path, uint64_t offset, void* dst,
                      size_t n, bool* broken, bool write) {
    return DirectIo(r, fd, path, offset, dst, n, write).Run(broken);
  }

  std::unique_ptr<Ring> TakeRing() {
    {
      absl::MutexLock lock(&mu_);
      if (!rings_.empty()) {
        auto r = std::move(rings_.back());
        rings_.pop_back();
        return r;
      }
      if (uring_refused_) return nullptr;
    }
    auto r = std::make_unique<Ring>();
    if (const int e = io_uring_queue_init(kDepth, &r->ring, 0); e < 0) {
      absl::MutexLock lock(&mu_);
      if (!uring_refused_) {
        spdlog::warn("KV tier: io_uring unavailable ({}); SSD reads use pread", std::strerror(-e));
      }
      uring_refused_ = true;
      return nullptr;
    }
    r->live = true;
    return r;
  }

  void GiveRing(std::unique_ptr<Ring> r) {
    absl::MutexLock lock(&mu_);
    rings_.push_back(std::move(r));
  }

  std::unique_ptr<KvFileEnv> posix_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Ring>> rings_ ABSL_GUARDED_BY(mu_);  // idle
  bool uring_refused_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> direct_reads_{0}, buffered_reads_{0};
  std::atomic<int64_t> direct_writes_{0}, buffered_writes_{0};
};

}  // namespace

std::unique_ptr<KvFileEnv> NewDirectKvFileEnv() { return std::make_unique<UringKvFileEnv>(); }

}  // namespace ballast::transfer
