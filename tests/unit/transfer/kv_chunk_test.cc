#include "transfer/kv_chunk.h"

#include "gtest/gtest.h"

namespace ballast::transfer {
namespace {

KvChunkMeta Meta() {
  KvChunkMeta m;
  m.parent = RootKey("acme", 42);
  const int tokens[] = {1, 2, 3, 4, 5};
  m.key = NextKey(m.parent, tokens);
  m.tenant = "acme";
  m.model_fingerprint = 42;
  m.first_token = 0;
  m.num_tokens = 5;
  m.num_layers = 3;
  m.blocks_per_layer = 2;
  m.block_bytes = 32;
  return m;
}

std::string Serialize(const KvChunk& c) {
  return EncodeHeader(c.meta) +
         std::string(reinterpret_cast<const char*>(c.payload.get()), c.meta.payload_bytes());
}

TEST(KvChunkKey, ChainsTenantModelAndEveryToken) {
  const int a[] = {1, 2, 3}, b[] = {1, 2, 4};
  EXPECT_EQ(NextKey(RootKey("t", 1), a), NextKey(RootKey("t", 1), a));
  EXPECT_NE(NextKey(RootKey("t", 1), a), NextKey(RootKey("t", 1), b));
  EXPECT_NE(NextKey(RootKey("t", 1), a), NextKey(RootKey("u", 1), a));
  EXPECT_NE(NextKey(RootKey("t", 1), a), NextKey(RootKey("t", 2), a));
  // The tenant's length is hashed in: ("ab", fp) and ("a", fp') differ.
  EXPECT_NE(RootKey("ab", 0), RootKey("a", 0x62));
  EXPECT_EQ(RootKey("t", 1).Hex().size(), 32u);
}

TEST(KvChunk, RoundTripsAndDetectsCorruptionAndTruncation) {
  auto c = KvChunk::Allocate(Meta());
  for (uint64_t i = 0; i < c->meta.payload_bytes(); ++i) c->payload[i] = static_cast<uint8_t>(i);
  c->Seal();
  ASSERT_TRUE(c->VerifyPayload().ok());
  const std::string bytes = Serialize(*c);
  auto back = DecodeChunk(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)->meta.key, c->meta.key);
  EXPECT_EQ((*back)->meta.tenant, "acme");
  EXPECT_EQ((*back)->meta.num_tokens, 5u);

  std::string flipped = bytes;
  flipped[flipped.size() - 3] ^= 0x10;  // payload
  EXPECT_EQ(DecodeChunk(flipped).status().code(), absl::StatusCode::kDataLoss);
  std::string bad_header = bytes;
  bad_header[20] ^= 0x01;  // inside the key
  EXPECT_EQ(DecodeChunk(bad_header).status().code(), absl::StatusCode::kDataLoss);
  auto truncated = DecodeChunk(std::string_view(bytes).substr(0, bytes.size() - 1));
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos);
  EXPECT_EQ(DecodeChunk("BLKV").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeChunk("not a chunk at all, but long enough to hold a fixed header......")
                .status()
                .code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace ballast::transfer
