// FaultyStateStore: a StateStore that forwards to a real one until told to
// fail, then fails every write UNAVAILABLE (as a dead disk would), so tests
// can check that a failed write changes nothing and is reported.
// Thread-safety: as the wrapped store; the switch is atomic.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "global_scheduler/state_store.h"

namespace ballast::global_scheduler::testing {

class FaultyStateStore : public StateStore {
 public:
  explicit FaultyStateStore(std::unique_ptr<StateStore> real) : real_(std::move(real)) {}
  void FailWrites(bool fail) { fail_.store(fail); }
  int writes() const { return writes_.load(); }

  absl::StatusOr<StoredCatalogue> LoadCatalogue() override { return real_->LoadCatalogue(); }
  absl::StatusOr<std::vector<StoredSession>> LoadSessions() override {
    return real_->LoadSessions();
  }
  absl::Status PutRegistered(const ModelSpec& spec) override {
    return Write([&] { return real_->PutRegistered(spec); });
  }
  absl::Status PutUnregistered(const std::string& name) override {
    return Write([&] { return real_->PutUnregistered(name); });
  }
  absl::Status PutSession(const StoredSession& s) override {
    return Write([&] { return real_->PutSession(s); });
  }
  absl::Status AppendTurn(const SessionTurnRecord& t) override {
    return Write([&] { return real_->AppendTurn(t); });
  }
  absl::Status SetAffinity(const std::string& id, const std::string& node) override {
    return Write([&] { return real_->SetAffinity(id, node); });
  }
  absl::Status ForgetNode(const std::string& node) override {
    return Write([&] { return real_->ForgetNode(node); });
  }
  absl::Status EraseSession(const std::string& id) override {
    return Write([&] { return real_->EraseSession(id); });
  }
  std::string Describe() const override { return real_->Describe(); }

 private:
  template <typename F>
  absl::Status Write(F f) {
    ++writes_;
    if (fail_.load()) return absl::UnavailableError(Describe() + ": injected write failure");
    return f();
  }
  std::unique_ptr<StateStore> real_;
  std::atomic<bool> fail_{false};
  std::atomic<int> writes_{0};
};

}  // namespace ballast::global_scheduler::testing
