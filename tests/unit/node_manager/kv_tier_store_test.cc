#include "node_manager/kv_tier_store.h"

#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ballast::node_manager {
namespace {

using transfer::KvChunk;
using transfer::KvChunkKey;
namespace fs = std::filesystem;

constexpr int kChunk = 16;
constexpr int kBlockTokens = 4;
constexpr uint64_t kBlockBytes = 64;
constexpr uint64_t kFp = 0x1234;

// The chunks an engine would export for `tokens`, with a payload that is a
// function of (tenant, position, layer), so a wrong chunk shows.
std::vector<std::unique_ptr<KvChunk>> MakeChunks(const std::string& tenant,
                                                 const std::vector<int>& tokens,
                                                 uint64_t fp = kFp) {
  std::vector<std::unique_ptr<KvChunk>> out;
  KvChunkKey parent = transfer::RootKey(tenant, fp);
  const int n = static_cast<int>(tokens.size());
  for (int start = 0; start < n; start += kChunk) {
    const int len = std::min(kChunk, n - start);
    transfer::KvChunkMeta m;
    m.key = transfer::NextKey(parent, absl::MakeConstSpan(tokens).subspan(start, len));
    m.parent = parent;
    m.tenant = tenant;
    m.model_fingerprint = fp;
    m.first_token = start;
    m.num_tokens = len;
    m.num_layers = 2;
    m.blocks_per_layer = (len + kBlockTokens - 1) / kBlockTokens;
    m.block_bytes = kBlockBytes;
    auto c = KvChunk::Allocate(m);
    for (uint64_t i = 0; i < m.payload_bytes(); ++i) {
      c->payload[i] = static_cast<uint8_t>(start * 7 + i + tenant.size());
    }
    c->Seal();
    parent = m.key;
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<int> Tokens(int n, int seed = 0) {
  std::vector<int> t(n);
  std::iota(t.begin(), t.end(), seed);
  return t;
}

// Stores `tokens` as the session's chunks, as an engine's export does.
void Export(KvTierStore* store, const std::string& session, const std::vector<int>& tokens,
            const std::string& tenant = "", int priority = 0) {
  std::vector<KvChunkKey> keys;
  for (auto& c : MakeChunks(tenant, tokens)) {
    keys.push_back(c->meta.key);
    if (!store->Contains(c->meta.key)) store->Put(std::move(c), priority);
  }
  store->SetSession(session, keys, priority);
}

// Fails every write as a full disk would.
class FullDiskEnv : public transfer::KvFileEnv {
 public:
  FullDiskEnv() : real_(transfer::NewPosixKvFileEnv()) {}
  absl::Status CreateDir(const std::string& d) override { return real_->CreateDir(d); }
  absl::Status WriteAtomic(const std::string&, absl::Span<const std::string_view>) override {
    return absl::ResourceExhaustedError("No space left on device");
  }
  absl::Status Read(const std::string& p, uint64_t o, void* d, size_t n) override {
    return real_->Read(p, o, d, n);
  }
  absl::StatusOr<uint64_t> FileSize(const std::string& p) override { return real_->FileSize(p); }
  absl::Status Remove(const std::string& p) override { return real_->Remove(p); }
  absl::StatusOr<std::vector<std::string>> List(const std::string& d) override {
    return real_->List(d);
  }

 private:
  std::unique_ptr<transfer::KvFileEnv> real_;
};

class KvTierStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("kvtier_", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<KvTierStore> Make(int64_t dram, bool ssd,
                                    std::shared_ptr<transfer::KvFileEnv> env = nullptr) {
    KvTierOptions o;
    o.dram_bytes = dram;
    o.chunk_tokens = kChunk;
    if (ssd) {
      o.ssd_dir = dir_.string();
      o.ssd_bytes = 1 << 20;
    }
    o.env = std::move(env);
    auto s = KvTierStore::Create(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }
  std::vector<fs::path> Files() const {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path());
    return out;
  }

  fs::path dir_;
};

// The lease holds exactly the KV of tokens[0, lease.tokens): its chunks are
// those an export of that prefix makes (a shorter partial chunk than the
// prompt's own is a valid, shorter lease).
void ExpectSameBytes(const engine::KvPrefixLease& lease, const std::vector<int>& tokens,
                     const std::string& tenant = "") {
  ASSERT_LE(lease.tokens, static_cast<int>(tokens.size()));
  auto want = MakeChunks(tenant, std::vector<int>(tokens.begin(), tokens.begin() + lease.tokens));
  ASSERT_EQ(lease.chunks.size(), want.size());
  ASSERT_LE(lease.chunks.size(), want.size());
  for (size_t i = 0; i < lease.chunks.size(); ++i) {
    const auto& m = lease.chunks[i]->meta;
    ASSERT_EQ(m.key, want[i]->meta.key);
    ASSERT_EQ(
        0, std::memcmp(lease.chunks[i]->payload.get(), want[i]->payload.get(), m.payload_bytes()));
  }
}

TEST_F(KvTierStoreTest, AcquireFindsFullAndPartialChunksFromDram) {
  auto store = Make(1 << 20, false);
  const std::vector<int> history = Tokens(40);  // chunks of 16, 16, 8
  Export(store.get(), "s", history);
  std::vector<int> next = history;
  next.insert(next.end(), {900, 901, 902});
  auto lease = store->Acquire("", kFp, next, static_cast<int>(next.size()) - 1);
  ASSERT_NE(lease, nullptr);
  EXPECT_EQ(lease->tokens, 40);
  EXPECT_EQ(lease->source, engine::KvSource::kHostDram);
  ASSERT_EQ(lease->chunks.size(), 3u);
  ExpectSameBytes(*lease, history);
  // A prompt that diverges inside the second chunk gets only the first.
  std::vector<int> other = history;
  other[20] = 777;
  lease = store->Acquire("", kFp, other, 39);
  ASSERT_NE(lease, nullptr);
  EXPECT_EQ(lease->tokens, 16);
  // Another model's fingerprint finds nothing.
  EXPECT_EQ(store->Acquire("", kFp + 1, next, 42), nullptr);
}

TEST_F(KvTierStoreTest, TenantsShareNothingEvenForTheSamePrefix) {
  auto store = Make(1 << 20, false);
  const std::vector<int> t = Tokens(32);
  Export(store.get(), "a", t, "tenant-a");
  EXPECT_EQ(store->Acquire("tenant-b", kFp, t, 32), nullptr);
  Export(store.get(), "b", t, "tenant-b");
  EXPECT_EQ(store->stats().chunks, 4);  // two copies, one per tenant
  auto lease = store->Acquire("tenant-b", kFp, t, 32);
  ASSERT_NE(lease, nullptr);
  for (const auto& c : lease->chunks) EXPECT_EQ(c->meta.tenant, "tenant-b");
}

TEST_F(KvTierStoreTest, SharedPrefixIsStoredOnceAndFreedWithItsLastSession) {
  auto store = Make(1 << 20, false);
  std::vector<int> a = Tokens(32), b = Tokens(32);
  a.push_back(1000);
  b.push_back(2000);
  Export(store.get(), "a", a);
  Export(store.get(), "b", b);
  EXPECT_EQ(store->stats().chunks, 4);  // 2 shared full chunks + 2 partial tails
  store->DropSession("a");
  EXPECT_EQ(store->stats().chunks, 3);
  store->DropSession("b");
  EXPECT_EQ(store->stats().chunks, 0);
  EXPECT_EQ(store->stats().dram_bytes, 0);
}

TEST_F(KvTierStoreTest, ANewTurnReplacesTheSupersededPartialChunk) {
  auto store = Make(1 << 20, false);
  Export(store.get(), "s", Tokens(20));  // 16 + 4
  Export(store.get(), "s", Tokens(30));  // 16 + 14: the 4-token tail is gone
  EXPECT_EQ(store->stats().chunks, 2);
}

TEST_F(KvTierStoreTest, DramEvictsLowestPriorityThenLeastRecentAndDropsWithoutSsd) {
  const int64_t one = 2 * 4 * kBlockBytes;  // a 16-token chunk: 2 layers x 4 blocks
  auto store = Make(2 * one, false);
  Export(store.get(), "high", Tokens(16, 0), "", /*priority=*/5);
  Export(store.get(), "old", Tokens(16, 100));
  Export(store.get(), "new", Tokens(16, 200));
  EXPECT_EQ(store->stats().dram_bytes, 2 * one);
  EXPECT_EQ(store->stats().dropped_chunks, 1);
  EXPECT_NE(store->Acquire("", kFp, Tokens(16, 0), 16), nullptr);
  EXPECT_EQ(store->Acquire("", kFp, Tokens(16, 100), 16), nullptr);
  EXPECT_NE(store->Acquire("", kFp, Tokens(16, 200), 16), nullptr);
}

TEST_F(KvTierStoreTest, SsdHoldsEveryChunkAndARestartedStoreServesThem) {
  const std::vector<int> t = Tokens(40);
  {
    auto store = Make(0, true);  // no DRAM budget: the SSD is the only copy
    Export(store.get(), "s", t);
    store->Flush();
    EXPECT_EQ(store->stats().dram_bytes, 0);
    EXPECT_EQ(Files().size(), 3u);
  }
  // A torn write from the crash, and a file that is not ours.
  std::ofstream(dir_ / "0123.kv.tmp") << "partial";
  std::ofstream(dir_ / "README") << "operator notes";
  auto store = Make(1 << 20, true);
  EXPECT_FALSE(fs::exists(dir_ / "0123.kv.tmp"));
  EXPECT_TRUE(fs::exists(dir_ / "README"));
  auto lease = store->Acquire("", kFp, t, 40);
  ASSERT_NE(lease, nullptr);
  EXPECT_EQ(lease->tokens, 40);
  EXPECT_EQ(lease->source, engine::KvSource::kSsd);
  ExpectSameBytes(*lease, t);
  // Promoted: the next read comes from DRAM.
  EXPECT_EQ(store->Acquire("", kFp, t, 40)->source, engine::KvSource::kHostDram);
}

TEST_F(KvTierStoreTest, AFlippedByteOnSsdEndsTheLeaseThereAndIsCounted) {
  const std::vector<int> t = Tokens(48);
  {
    auto store = Make(0, true);
    Export(store.get(), "s", t);
    store->Flush();
  }
  // Corrupt the second chunk's payload.
  const KvChunkKey second = MakeChunks("", t)[1]->meta.key;
  const fs::path victim = dir_ / absl::StrCat(second.Hex(), ".kv");
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(victim) - 10));
    f.put('\x5a');
  }
  auto store = Make(0, true);
  auto lease = store->Acquire("", kFp, t, 48);
  ASSERT_NE(lease, nullptr);
  EXPECT_EQ(lease->tokens, 16);
  EXPECT_EQ(store->stats().checksum_failures, 1);
  store->Flush();
  EXPECT_FALSE(fs::exists(victim));
}

TEST_F(KvTierStoreTest, AFlippedByteInDramEndsTheLeaseThereAndIsCounted) {
  auto store = Make(1 << 20, false);
  const std::vector<int> t = Tokens(48);
  std::vector<KvChunkKey> keys;
  uint8_t* second_payload = nullptr;
  for (auto& c : MakeChunks("", t)) {
    keys.push_back(c->meta.key);
    if (keys.size() == 2) second_payload = c->payload.get();
    store->Put(std::move(c), 0);
  }
  store->SetSession("s", keys, 0);
  second_payload[100] ^= 0x01;  // memory going bad under the DRAM tier
  auto lease = store->Acquire("", kFp, t, 48);
  ASSERT_NE(lease, nullptr);
  EXPECT_EQ(lease->tokens, 16);
  EXPECT_EQ(store->stats().checksum_failures, 1);
  EXPECT_FALSE(store->Contains(keys[1]));  // the corrupt copy is gone
}

// A peer that is dead, or that answers with the wrong KV.
class FakePeer : public KvPeerFetcher {
 public:
  absl::StatusOr<std::vector<std::unique_ptr<KvChunk>>> Fetch(const std::string&,
                                                              const std::string& tenant, uint64_t,
                                                              absl::Span<const int> tokens,
                                                              int first_token, int,
                                                              const ChunkAlloc&) override {
    if (dead) return absl::UnavailableError("connection refused");
    std::vector<int> t(tokens.begin(), tokens.end());
    if (tamper) t[first_token] += 1;  // KV of other tokens
    std::vector<std::unique_ptr<KvChunk>> out;
    for (auto& c : MakeChunks(tenant, t)) {
      if (static_cast<int>(c->meta.first_token) >= first_token) out.push_back(std::move(c));
    }
    return out;
  }
  bool dead = false, tamper = false;
};

TEST_F(KvTierStoreTest, PeerChunksAreUsedOnlyWhenTheyAreExactlyThePromptsKv) {
  auto store = Make(1 << 20, false);
  const std::vector<int> t = Tokens(48);
  FakePeer peer;
  auto lease = store->Acquire("", kFp, t, 48, "peer:1", &peer);
  ASSERT_NE(lease, nullptr);
  EXPECT_EQ(lease->source, engine::KvSource::kPeer);
  EXPECT_EQ(lease->tokens, 48);
  ExpectSameBytes(*lease, t);
  EXPECT_GT(store->stats().peer_bytes, 0);
  // Kept here now: the next lookup is local.
  EXPECT_EQ(store->Acquire("", kFp, t, 48)->source, engine::KvSource::kHostDram);

  const std::vector<int> u = Tokens(48, 500);
  peer.dead = true;
  EXPECT_EQ(store->Acquire("", kFp, u, 48, "peer:1", &peer), nullptr);
  peer.dead = false;
  peer.tamper = true;
  EXPECT_EQ(store->Acquire("", kFp, u, 48, "peer:1", &peer), nullptr);
}

TEST_F(KvTierStoreTest, TruncatedFilesAreDiscardedAtRestart) {
  const std::vector<int> t = Tokens(32);
  {
    auto store = Make(0, true);
    Export(store.get(), "s", t);
    store->Flush();
  }
  const fs::path first = dir_ / absl::StrCat(MakeChunks("", t)[0]->meta.key.Hex(), ".kv");
  fs::resize_file(first, fs::file_size(first) / 2);
  auto store = Make(0, true);
  EXPECT_FALSE(fs::exists(first));
  EXPECT_EQ(store->stats().chunks, 1);
  EXPECT_EQ(store->Acquire("", kFp, t, 32), nullptr);  // the first chunk is gone
}

TEST_F(KvTierStoreTest, AFullDiskKeepsChunksInDramAndCountsTheFailures) {
  auto store = Make(1 << 20, true, std::make_shared<FullDiskEnv>());
  const std::vector<int> t = Tokens(32);
  Export(store.get(), "s", t);
  store->Flush();
  EXPECT_EQ(store->stats().ssd_write_errors, 2);
  EXPECT_EQ(store->stats().ssd_bytes, 0);
  auto lease = store->Acquire("", kFp, t, 32);
  ASSERT_NE(lease, nullptr);
  EXPECT_EQ(lease->tokens, 32);
}

TEST_F(KvTierStoreTest, EndSessionDeletesEveryCopy) {
  auto store = Make(1 << 20, true);
  Export(store.get(), "s", Tokens(40));
  store->Flush();
  EXPECT_EQ(Files().size(), 3u);
  store->DropSession("s");
  store->Flush();
  EXPECT_TRUE(Files().empty());
  EXPECT_EQ(store->stats().ssd_bytes, 0);
  EXPECT_EQ(store->stats().dram_bytes, 0);
}

TEST_F(KvTierStoreTest, TheIndexStaysConsistentUnderConcurrentTurns) {
  auto store = Make(64 * 1024, true);
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&store, w] {
      for (int turn = 1; turn <= 20; ++turn) {
        const std::string session = absl::StrCat("s", w % 2);  // two sessions, two writers
        const std::vector<int> t = Tokens(8 * turn, w % 2);
        Export(store.get(), session, t);
        auto lease = store->Acquire("", kFp, t, static_cast<int>(t.size()));
        if (lease) ExpectSameBytes(*lease, t);
      }
    });
  }
  for (auto& t : threads) t.join();
  store->DropSession("s0");
  store->DropSession("s1");
  store->Flush();
  const KvTierStats s = store->stats();
  EXPECT_EQ(s.chunks, 0);
  EXPECT_EQ(s.dram_bytes, 0);
  EXPECT_EQ(s.ssd_bytes, 0);
  EXPECT_TRUE(Files().empty());
}

}  // namespace
}  // namespace ballast::node_manager
