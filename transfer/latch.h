// Latch: a countdown one thread waits on while others count it down, that
// ThreadSanitizer can see. absl::BlockingCounter counts with an atomic
// inside the uninstrumented Debian library, so TSan cannot see it order
// the counted work before Wait returns; this one counts under an
// absl::Mutex. Held by shared_ptr: the last to count down may still be
// unlocking it when the waiter wakes and returns.
//
// Thread-safety: CountDown from any thread; Wait from one.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ballast::transfer {

class Latch {
 public:
  static std::shared_ptr<Latch> Create(int64_t count) { return std::make_shared<Latch>(count); }
  explicit Latch(int64_t count) : left_(count) {}
  void CountDown() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    --left_;
  }
  // Until the count reaches zero.
  void Wait() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return left_ <= 0; };
    mu_.Await(absl::Condition(&done));
  }

 private:
  absl::Mutex mu_;
  int64_t left_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::transfer
