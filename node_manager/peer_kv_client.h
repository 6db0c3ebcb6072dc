// Peer KV transfer over gRPC (node.proto's FetchKv), both ends: the client
// that fetches a prompt's chunks from another node's tiers, and the
// framing the serving node writes them with. A chunk travels serialized
// (transfer/kv_chunk.h: self-describing header + payload) in pieces of at
// most kPeerPieceBytes, each with a CRC-32C; the receiver reassembles them
// in order (transfer::Reassembler) and verifies the chunk's own checksums,
// so a damaged transfer is dropped (and the KV recomputed), never used.
// The transport sits behind KvPeerFetcher, so an RDMA one can replace it.
//
// Thread-safety: PeerKvClient is thread-safe (one channel per peer).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ballast/v1/node.grpc.pb.h"
#include "grpcpp/security/credentials.h"
#include "node_manager/kv_tier_store.h"

namespace ballast::node_manager {

inline constexpr size_t kPeerPieceBytes = 1 << 20;

// Writes `chunk` as the pieces of reply chunk `index`; stops at the first
// `write` that returns false (the peer went away) and returns false.
bool WriteChunkPieces(const transfer::KvChunk& chunk, uint32_t index,
                      const std::function<bool(const v1::KvChunk&)>& write);

class PeerKvClient final : public KvPeerFetcher {
 public:
  // `timeout`: the whole fetch's deadline (a hung peer costs the turn at
  // most this; 2K tokens of an 8B model took ~0.7 s on loopback).
  // `credentials`: of the connections to peers (null: plaintext).
  explicit PeerKvClient(absl::Duration timeout = absl::Seconds(3),
                        std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr)
      : timeout_(timeout),
        credentials_(credentials ? std::move(credentials) : grpc::InsecureChannelCredentials()) {}
  absl::StatusOr<std::vector<std::unique_ptr<transfer::KvChunk>>> Fetch(
      const std::string& peer, const std::string& tenant, uint64_t kv_fingerprint,
      absl::Span<const int> tokens, int first_token, int max_tokens,
      const ChunkAlloc& alloc) override;

 private:
  v1::Node::Stub* StubFor(const std::string& peer) ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration timeout_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<v1::Node::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::node_manager
