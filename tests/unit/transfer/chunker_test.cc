#include "transfer/chunker.h"

#include "gtest/gtest.h"
#include "transfer/checksum.h"

namespace ballast::transfer {
namespace {

TEST(Crc32c, KnownVectors) {
  // RFC 3720 B.4 test vectors.
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros), 0x8A9136AAu);
  std::string ones(32, '\xff');
  EXPECT_EQ(Crc32c(ones), 0x62A8AB43u);
}

TEST(Chunker, RoundTrip) {
  std::string data(10000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 7);
  auto chunks = SplitIntoChunks(data.data(), data.size(), 4096);
  ASSERT_EQ(chunks.size(), 3u);
  Reassembler r(data.size());
  for (const auto& c : chunks) ASSERT_TRUE(r.Add(c.offset, c.data, c.crc32c).ok());
  std::string out;
  ASSERT_TRUE(r.Take(&out).ok());
  EXPECT_EQ(out, data);
}

TEST(Chunker, DetectsCorruptionReorderAndShortTransfer) {
  std::string data(100, 'x');
  auto chunks = SplitIntoChunks(data.data(), data.size(), 40);
  {
    Reassembler r(data.size());
    std::string bad = chunks[0].data;
    bad[3] ^= 1;
    auto st = r.Add(0, bad, chunks[0].crc32c);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(st.message().find("checksum"), std::string::npos);
  }
  {
    Reassembler r(data.size());
    EXPECT_EQ(r.Add(chunks[1].offset, chunks[1].data, chunks[1].crc32c).code(),
              absl::StatusCode::kDataLoss);
  }
  {
    Reassembler r(data.size());
    ASSERT_TRUE(r.Add(0, chunks[0].data, chunks[0].crc32c).ok());
    std::string out;
    EXPECT_EQ(r.Take(&out).code(), absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace ballast::transfer
