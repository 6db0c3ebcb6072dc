#include "transfer/kv_file_env.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace ballast::transfer {
namespace {

absl::Status Errno(const char* what, const std::string& path, int err) {
  const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (err == ENOENT) return absl::NotFoundError(msg);
  return absl::InternalError(msg);
}

class PosixKvFileEnv final : public KvFileEnv {
 public:
  absl::Status CreateDir(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("create directory ", dir, ": ", ec.message()));
    return absl::OkStatus();
  }

  absl::Status WriteAtomic(const std::string& path,
                           absl::Span<const std::string_view> pieces) override {
    const std::string tmp = absl::StrCat(path, kTempSuffix);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Errno("create", tmp, errno);
    absl::Status st = WriteAll(fd, tmp, pieces);
    if (::close(fd) != 0 && st.ok()) st = Errno("close", tmp, errno);
    if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = Errno("rename", tmp, errno);
    if (!st.ok()) ::unlink(tmp.c_str());
    return st;
  }

  absl::Status Read(const std::string& path, uint64_t offset, void* dst, size_t n) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open", path, errno);
    auto* p = static_cast<uint8_t*>(dst);
    size_t done = 0;
    absl::Status st;
    while (done < n) {
      const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        st = Errno("read", path, errno);
        break;
      }
      if (r == 0) {
        st = absl::DataLossError(absl::StrCat(path, ": truncated (", offset + done,
                                              " bytes, expected ", offset + n, ")"));
        break;
      }
      done += static_cast<size_t>(r);
    }
    ::close(fd);
    return st;
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    std::error_code ec;
    const auto n = std::filesystem::file_size(path, ec);
    if (ec) return absl::NotFoundError(absl::StrCat("stat ", path, ": ", ec.message()));
    return static_cast<uint64_t>(n);
  }

  absl::Status Remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Errno("remove", path, errno);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.is_regular_file()) out.push_back(e.path().filename().string());
    }
    if (ec) return absl::InternalError(absl::StrCat("list ", dir, ": ", ec.message()));
    return out;
  }

 private:
  static absl::Status WriteAll(int fd, const std::string& path,
                               absl::Span<const std::string_view> pieces) {
    for (std::string_view piece : pieces) {
      while (!piece.empty()) {
        const ssize_t w = ::write(fd, piece.data(), piece.size());
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return Errno("write", path, errno);
        piece.remove_prefix(static_cast<size_t>(w));
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<KvFileEnv> NewPosixKvFileEnv() { return std::make_unique<PosixKvFileEnv>(); }

}  // namespace ballast::transfer
