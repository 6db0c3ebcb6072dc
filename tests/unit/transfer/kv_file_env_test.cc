// The SSD tier's direct-I/O env (NewDirectKvFileEnv): the same bytes as
// pread for aligned, unaligned and tail reads; DATA_LOSS for a short file;
// and, where the kernel allows io_uring and the file system O_DIRECT, the
// aligned reads really are direct; aligned atomic writes give the exact
// bytes and size (direct there too), and unaligned ones fall back.
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "transfer/kv_file_env.h"

namespace ballast::transfer {
namespace {

struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
std::unique_ptr<uint8_t, AlignedFree> PageBuffer(size_t n) {
  return std::unique_ptr<uint8_t, AlignedFree>(
      static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096)));
}

class KvFileEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           (std::string("ballast_kv_file_env_") +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    ASSERT_TRUE(env_->CreateDir(dir_.string()).ok());
    std::mt19937 rng(7);
    data_.resize((3u << 20) + 4096 + 100);  // more than 3 pieces, an unaligned tail
    for (char& c : data_) c = static_cast<char>(rng());
    path_ = (dir_ / "f.kv").string();
    const std::string_view pieces[] = {std::string_view(data_).substr(0, 5000),
                                       std::string_view(data_).substr(5000)};
    ASSERT_TRUE(env_->WriteAtomic(path_, pieces).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Both the kernel (io_uring) and the file system (O_DIRECT) allow direct reads.
  bool DirectPossible() const {
    io_uring ring;
    if (io_uring_queue_init(2, &ring, 0) < 0) return false;
    io_uring_queue_exit(&ring);
    const int fd = ::open(path_.c_str(), O_RDONLY | O_DIRECT);
    if (fd < 0) return false;
    ::close(fd);
    return true;
  }

  std::unique_ptr<KvFileEnv> env_ = NewDirectKvFileEnv();
  std::filesystem::path dir_;
  std::string data_, path_;
};

TEST_F(KvFileEnvTest, AlignedReadWithTailIsExactAndDirect) {
  const size_t n = data_.size() - 4096;
  auto buf = PageBuffer(n);
  ASSERT_TRUE(env_->Read(path_, 4096, buf.get(), n).ok());
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(buf.get()), n),
            std::string_view(data_).substr(4096));
  if (DirectPossible()) {
    EXPECT_EQ(env_->direct_reads(), 1) << env_->Describe();
  } else {
    GTEST_LOG_(INFO) << "no io_uring or O_DIRECT here: " << env_->Describe();
  }
}

TEST_F(KvFileEnvTest, UnalignedReadsMatchTheFile) {
  auto buf = PageBuffer(data_.size());
  // An unaligned offset, then an unaligned buffer: both through the page cache.
  ASSERT_TRUE(env_->Read(path_, 1, buf.get(), 10000).ok());
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(buf.get()), 10000),
            std::string_view(data_).substr(1, 10000));
  ASSERT_TRUE(env_->Read(path_, 0, buf.get() + 1, 8192).ok());
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(buf.get()) + 1, 8192),
            std::string_view(data_).substr(0, 8192));
  EXPECT_EQ(env_->direct_reads(), 0);
}

TEST_F(KvFileEnvTest, ShortFileIsDataLossAndMissingIsNotFound) {
  ASSERT_EQ(::truncate(path_.c_str(), 2u << 20), 0);
  auto buf = PageBuffer(data_.size());
  const absl::Status st = env_->Read(path_, 0, buf.get(), 3u << 20);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_EQ(env_->Read((dir_ / "none.kv").string(), 0, buf.get(), 4096).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(KvFileEnvTest, AlignedWriteIsExactToTheByteAndDirect) {
  // A header page and a payload of 3 MiB and 100 bytes in a page-rounded
  // buffer (as the SSD tier writes them).
  const size_t n = data_.size() - 4096;
  auto header = PageBuffer(4096);
  auto payload = PageBuffer(n);
  std::memcpy(header.get(), data_.data(), 4096);
  std::memcpy(payload.get(), data_.data() + 4096, n);
  std::memset(payload.get() + n, 0x5a, (n + 4095) / 4096 * 4096 - n);  // must not reach the file
  const std::string out = (dir_ / "w.kv").string();
  const std::string_view pieces[] = {
      std::string_view(reinterpret_cast<const char*>(header.get()), 4096),
      std::string_view(reinterpret_cast<const char*>(payload.get()), n)};
  ASSERT_TRUE(env_->WriteAtomicAligned(out, pieces).ok()) << env_->Describe();
  auto size = env_->FileSize(out);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, data_.size());
  std::string back(data_.size(), '\0');
  ASSERT_TRUE(NewPosixKvFileEnv()->Read(out, 0, back.data(), back.size()).ok());
  EXPECT_TRUE(back == data_) << "the file's bytes differ from what was written";
  EXPECT_FALSE(std::filesystem::exists(out + kTempSuffix));
  if (DirectPossible()) {
    EXPECT_EQ(env_->direct_writes(), 1) << env_->Describe();
  } else {
    GTEST_LOG_(INFO) << "no io_uring or O_DIRECT here: " << env_->Describe();
  }
  // Not page-aligned: the same bytes through the page cache.
  const std::string_view odd[] = {std::string_view(data_).substr(1, 5000)};
  ASSERT_TRUE(env_->WriteAtomicAligned(out, odd).ok());
  std::string small(5000, '\0');
  ASSERT_TRUE(env_->Read(out, 0, small.data(), small.size()).ok());
  EXPECT_EQ(small, data_.substr(1, 5000));
  EXPECT_LE(env_->direct_writes(), 1);
}

}  // namespace
}  // namespace ballast::transfer
