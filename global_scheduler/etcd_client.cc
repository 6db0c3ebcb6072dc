#include "global_scheduler/etcd_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "transfer/thread_name.h"

namespace ballast::global_scheduler {

absl::StatusOr<std::shared_ptr<EtcdClient>> EtcdClient::Create(const std::string& endpoints,
                                                               absl::Duration timeout) {
  if (endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoints");
  std::shared_ptr<EtcdClient> c(new EtcdClient());
  c->endpoints_ = endpoints;
  c->timeout_ = timeout;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A silently dead connection fails in seconds (a standby's watch would
  // otherwise wait on it for ever), and a page of session turns may exceed
  // gRPC's 4 MiB default.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetMaxReceiveMessageSize(-1);
  c->channel_ = grpc::CreateCustomChannel(endpoints, grpc::InsecureChannelCredentials(), args);
  c->kv_ = etcdserverpb::KV::NewStub(c->channel_);
  c->lease_ = etcdserverpb::Lease::NewStub(c->channel_);
  c->watch_ = etcdserverpb::Watch::NewStub(c->channel_);
  return c;
}

std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

absl::Status EtcdClient::Error(const grpc::Status& st, const std::string& call) const {
  return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                      absl::StrCat("etcd ", endpoints_, ": ", call, ": ", st.error_message()));
}

absl::StatusOr<std::vector<mvccpb::KeyValue>> EtcdClient::Range(const std::string& key,
                                                                bool prefix_range) const {
  std::vector<mvccpb::KeyValue> out;
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  if (prefix_range) req.set_range_end(PrefixEnd(key));
  // Keys come in ascending order unsorted: asking etcd to sort makes it read
  // the whole rest of the range for every page.
  req.set_limit(1000);
  for (;;) {  // pages of 1000 keys
    etcdserverpb::RangeResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    if (grpc::Status st = kv_->Range(&ctx, req, &resp); !st.ok()) {
      return Error(st, absl::StrCat("range ", key));
    }
    for (auto& kv : *resp.mutable_kvs()) out.push_back(std::move(kv));
    if (!resp.more() || !prefix_range || resp.kvs_size() == 0) return out;
    req.set_key(out.back().key() + std::string(1, '\0'));  // after the last one read
    req.set_revision(resp.header().revision());            // the same snapshot
  }
}

absl::StatusOr<etcdserverpb::TxnResponse> EtcdClient::Txn(
    const etcdserverpb::TxnRequest& req) const {
  etcdserverpb::TxnResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  if (grpc::Status st = kv_->Txn(&ctx, req, &resp); !st.ok()) return Error(st, "txn");
  return resp;
}

absl::StatusOr<int64_t> EtcdClient::LeaseGrant(int64_t ttl_s) const {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  etcdserverpb::LeaseGrantResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  if (grpc::Status st = lease_->LeaseGrant(&ctx, req, &resp); !st.ok()) {
    return Error(st, "lease grant");
  }
  if (!resp.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("etcd ", endpoints_, ": lease grant: ", resp.error()));
  }
  return resp.id();
}

absl::Status EtcdClient::LeaseRevoke(int64_t id) const {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(id);
  etcdserverpb::LeaseRevokeResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  if (grpc::Status st = lease_->LeaseRevoke(&ctx, req, &resp); !st.ok()) {
    return Error(st, "lease revoke");
  }
  return absl::OkStatus();
}

LeaderElection::LeaderElection(std::shared_ptr<EtcdClient> client, LeaderElectionOptions options)
    : client_(std::move(client)), options_(std::move(options)) {}

LeaderElection::~LeaderElection() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (keepalive_.joinable()) keepalive_.join();
}

absl::StatusOr<bool> LeaderElection::TryAcquire(int64_t* watch_from) {
  etcdserverpb::TxnRequest txn;
  auto* cmp = txn.add_compare();
  cmp->set_key(options_.key);
  cmp->set_target(etcdserverpb::Compare::CREATE);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_create_revision(0);  // the key does not exist
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(options_.key);
  put->set_value(options_.id);
  put->set_lease(lease_);
  txn.add_failure()->mutable_request_range()->set_key(options_.key);
  auto resp = client_->Txn(txn);
  if (!resp.ok()) return resp.status();
  if (resp->succeeded()) {
    won_revision_ = resp->header().revision();  // the key's create_revision
    return true;
  }
  const auto& kvs = resp->responses(0).response_range().kvs();
  if (!kvs.empty()) {
    spdlog::info("etcd {}: {} leads; standing by", options_.key, kvs[0].value());
  }
  *watch_from = resp->header().revision() + 1;
  return false;
}

absl::Status LeaderElection::WaitForDelete(int64_t from) {
  grpc::ClientContext ctx;
  // Only from a member that has a leader (a partitioned one would never
  // report the delete), and for a bounded time: the caller then tries again.
  ctx.AddMetadata("hasleader", "true");
  const absl::Time deadline =
      absl::Now() + absl::Seconds(std::max<int64_t>(10, 3 * options_.ttl_s));
  ctx.set_deadline(absl::ToChronoTime(deadline));
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return absl::CancelledError("campaign cancelled");
    watching_ = &ctx;  // Cancel() ends the blocking read
  }
  auto stream = client_->watch()->Watch(&ctx);
  etcdserverpb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key(options_.key);
  create->set_start_revision(from);
  create->add_filters(etcdserverpb::WatchCreateRequest::NOPUT);
  absl::Status result = absl::UnavailableError(
      absl::StrCat("etcd ", client_->endpoints(), ": watch of ", options_.key, " ended"));
  if (stream->Write(req)) {
    etcdserverpb::WatchResponse resp;
    while (stream->Read(&resp)) {
      if (resp.canceled()) break;
      if (resp.events_size() > 0) {  // the key was deleted
        result = absl::OkStatus();
        break;
      }
    }
  }
  // A watch that ran its time is not an error: the caller looks again.
  if (!result.ok() && absl::Now() >= deadline) result = absl::OkStatus();
  ctx.TryCancel();
  stream->Finish().IgnoreError();
  absl::MutexLock lock(&mu_);
  watching_ = nullptr;
  if (cancelled_) return absl::CancelledError("campaign cancelled");
  return result;
}

void LeaderElection::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (watching_ != nullptr) watching_->TryCancel();
}

absl::Status LeaderElection::Campaign(std::function<void(const absl::Status&)> on_lost) {
  // Any way out but winning gives the lease back (else it lives its TTL).
  const auto give_up = [this](absl::Status st) {
    if (lease_ != 0) client_->LeaseRevoke(lease_).IgnoreError();
    lease_ = 0;
    return st;
  };
  // etcd unreachable or electing: wait (from 100 ms, doubling to 2 s) and
  // try again; only Cancel, or an error that is not transient, ends it.
  absl::Duration backoff = absl::Milliseconds(100);
  const auto transient = [](const absl::Status& st) {
    return absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st);
  };
  for (;;) {
    if (Cancelled(absl::ZeroDuration())) return give_up(absl::CancelledError("campaign cancelled"));
    absl::Status st;
    auto lease = client_->LeaseGrant(options_.ttl_s);
    if (lease.ok()) {
      lease_ = *lease;
      int64_t from = 0;
      auto won = TryAcquire(&from);
      if (won.ok() && *won) {
        if (!Cancelled(absl::ZeroDuration())) break;
        return give_up(absl::CancelledError("campaign cancelled"));
      }
      // The next try takes a fresh lease: this one, not kept alive while
      // waiting, may expire.
      st = won.ok() ? WaitForDelete(from) : won.status();
      give_up(absl::OkStatus()).IgnoreError();
      if (won.ok() && st.ok()) {
        backoff = absl::Milliseconds(100);
        continue;
      }
    } else {
      st = lease.status();
    }
    if (!transient(st)) return give_up(st);
    spdlog::warn("etcd {}: campaign: {}; trying again", options_.key, std::string(st.message()));
    if (Cancelled(backoff)) return give_up(absl::CancelledError("campaign cancelled"));
    backoff = std::min(2 * backoff, absl::Seconds(2));
  }
  spdlog::info("etcd {}: {} is the leader (lease {:x}, {} s)", options_.key, options_.id, lease_,
               options_.ttl_s);
  keepalive_ = std::thread([this, on_lost = std::move(on_lost)] {
    transfer::NameThisThread("etcd-keepalive");
    KeepAlive(on_lost);
  });
  return absl::OkStatus();
}

bool LeaderElection::Cancelled(absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  if (wait > absl::ZeroDuration()) {
    mu_.AwaitWithTimeout(absl::Condition(&cancelled_), wait);
  }
  return cancelled_;
}

void LeaderElection::KeepAlive(std::function<void(const absl::Status&)> on_lost) {
  // Renewals every TTL/4, each bounded by TTL/4. Leadership counts as lost
  // once the last renewal etcd confirmed was *sent* 3/4 of a TTL ago: etcd
  // cannot expire the lease before a full TTL after that send, so this
  // leader stops before a standby can win.
  const absl::Duration ttl = absl::Seconds(options_.ttl_s);
  absl::Time confirmed_sent = absl::Now();
  absl::Status lost;
  while (!stop_.WaitForNotificationWithTimeout(ttl / 4)) {
    const absl::Time sent = absl::Now();
    grpc::ClientContext ctx;
    ctx.AddMetadata("hasleader", "true");
    ctx.set_deadline(absl::ToChronoTime(sent + std::min(client_->timeout(), ttl / 4)));
    auto stream = client_->lease()->LeaseKeepAlive(&ctx);
    etcdserverpb::LeaseKeepAliveRequest req;
    req.set_id(lease_);
    etcdserverpb::LeaseKeepAliveResponse resp;
    const bool ok = stream->Write(req) && stream->Read(&resp);
    stream->WritesDone();
    ctx.TryCancel();
    stream->Finish().IgnoreError();
    if (ok && resp.ttl() > 0) {
      confirmed_sent = sent;
      continue;
    }
    if (ok) {  // etcd answered: the lease is gone
      lost = absl::AbortedError(absl::StrCat("etcd ", client_->endpoints(), ": lease of ",
                                             options_.key, " expired: leadership lost"));
      break;
    }
    if (absl::Now() - confirmed_sent >= ttl * 3 / 4) {
      lost = absl::UnavailableError(
          absl::StrCat("etcd ", client_->endpoints(), ": no lease renewal confirmed for ",
                       absl::FormatDuration(absl::Now() - confirmed_sent), " of a ", options_.ttl_s,
                       " s lease: leadership of ", options_.key, " lost"));
      break;
    }
  }
  if (!lost.ok() && on_lost) on_lost(lost);
}

absl::Status LeaderElection::Resign() {
  if (lease_ == 0) return absl::OkStatus();
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (keepalive_.joinable()) keepalive_.join();
  const absl::Status st = client_->LeaseRevoke(lease_);
  lease_ = 0;
  return st;
}

}  // namespace ballast::global_scheduler
