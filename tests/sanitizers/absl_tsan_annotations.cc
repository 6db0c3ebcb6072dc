// ThreadSanitizer annotations for Debian's (uninstrumented) Abseil
// synchronization library. Linked into every executable of a
// BALLAST_SANITIZE=thread build only (CMakeLists.txt).
//
// Debian's libabsl_synchronization is compiled without -fsanitize=thread, so
// absl::Mutex's lock words and futex waits are invisible to TSan: every
// ABSL_GUARDED_BY field touched by two threads would be reported as a race.
// Abseil's own TSan annotations (ABSL_TSAN_MUTEX_*) are compiled into the
// library only when the library itself is built with TSan. This file
// interposes the public lock/unlock entry points (the executable's definition
// wins over the shared library's, also for calls from libgrpc/libgpr and for
// the library's internal calls, which all go through the PLT), adds the same
// __tsan_mutex_* annotations Abseil uses, and forwards to the real function
// found with dlsym(RTLD_NEXT).
//
// Some of these functions call others of them (AwaitWithTimeout calls
// AwaitWithDeadline; Notification locks its own mutex): only the outermost
// call on a thread is annotated, so every lock or unlock is annotated exactly
// once. Conditions are evaluated inside the real calls, i.e. inside a lock or
// unlock operation, where TSan ignores the accesses (Abseil's own annotations
// pretend the mutex is held there). Mutex destruction is annotated only when
// this executable's own code destroys the mutex: the libraries free their
// objects (and the mutexes in them) after dropping reference counts in
// uninstrumented code, which TSan would report as the destruction racing
// with the last lock.
//
// absl::Status: the last reference to a status payload is dropped in the
// library (Status::UnrefNonInlined, an uninstrumented atomic decrement), so
// its delete is run with TSan ignoring the thread, as if the library were
// instrumented.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#define BALLAST_STR2(x) #x
#define BALLAST_STR(x) BALLAST_STR2(x)

namespace {

// "_ZN4absl<len><inline namespace>" + rest: the Itanium mangling of a member
// of absl::<inline namespace>::.
template <typename Fn>
Fn Real(const char* nested, const char* rest) {
  const char* ns = BALLAST_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name =
      std::string("_Z") + nested + "4absl" + std::to_string(std::strlen(ns)) + ns + rest;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "absl_tsan_annotations: %s not found\n", name.c_str());
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

// Abseil's lock word: kMuWriter is set while the mutex is held exclusively.
constexpr intptr_t kMuWriter = 0x0008;
static_assert(sizeof(absl::Mutex) == sizeof(std::atomic<intptr_t>));

// Flags for a mutex the caller holds (Await, CondVar::Wait release and
// reacquire it in whichever mode it is held).
unsigned HeldMode(const absl::Mutex* mu) {
  const auto* word = reinterpret_cast<const std::atomic<intptr_t>*>(mu);
  return (word->load(std::memory_order_relaxed) & kMuWriter) ? 0u : __tsan_mutex_read_lock;
}

extern "C" char __executable_start;  // the executable's code, from GNU ld
extern "C" char etext;
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();

#define BALLAST_CALLER __builtin_return_address(0)

bool FromThisExecutable(const void* pc) { return pc >= &__executable_start && pc < &etext; }

// Depth of interposed calls on this thread; only the outermost call
// annotates.
thread_local int depth = 0;
class Outermost {
 public:
  Outermost() : outer_(depth++ == 0) {}
  ~Outermost() { --depth; }
  explicit operator bool() const { return outer_; }

 private:
  const bool outer_;
};

// A lock operation: `real` returns with `mu` held (whatever it returns).
template <typename F>
auto Locking(void* mu, unsigned flags, F real) {
  Outermost o;
  if (o) __tsan_mutex_pre_lock(mu, flags);
  auto r = real();
  if (o) __tsan_mutex_post_lock(mu, flags, 0);
  return r;
}

// A try-lock operation: `real` returns whether it took `mu`.
template <typename F>
bool TryLocking(void* mu, unsigned flags, F real) {
  Outermost o;
  flags |= __tsan_mutex_try_lock;
  if (o) __tsan_mutex_pre_lock(mu, flags);
  const bool locked = real();
  if (o) __tsan_mutex_post_lock(mu, flags | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  return locked;
}

template <typename F>
void Unlocking(void* mu, unsigned flags, F real) {
  Outermost o;
  if (o) __tsan_mutex_pre_unlock(mu, flags);
  real();
  if (o) __tsan_mutex_post_unlock(mu, flags);
}

// Await / CondVar::Wait: `mu` is held on entry, released while waiting and
// held again on return: an unlock, then a lock operation spanning the wait.
template <typename F>
auto Waiting(const absl::Mutex* mu, F real) {
  Outermost o;
  void* m = const_cast<absl::Mutex*>(mu);
  const unsigned mode = o ? HeldMode(mu) : 0;
  if (o) {
    __tsan_mutex_pre_unlock(m, mode);
    __tsan_mutex_post_unlock(m, mode);
    __tsan_mutex_pre_lock(m, mode);
  }
  auto r = real();
  if (o) __tsan_mutex_post_lock(m, mode, 0);
  return r;
}

// Notification::notified_yet_ (its address is what HasBeenNotified(), an
// inline and so instrumented acquire load, reads).
static_assert(sizeof(absl::Notification) == 2 * sizeof(absl::Mutex));
const void* NotifiedFlag(const absl::Notification* n) {
  return reinterpret_cast<const char*>(n) + sizeof(absl::Mutex);
}

}  // namespace

// The definitions lock and unlock on behalf of their callers.
#if defined(__clang__)
#define BALLAST_NO_TSA __attribute__((no_thread_safety_analysis))
#else
#define BALLAST_NO_TSA
#endif

namespace absl {
ABSL_NAMESPACE_BEGIN

using V = void (*)(Mutex*);
using B = bool (*)(Mutex*);
using VC = void (*)(Mutex*, const Condition&);
using BCD = bool (*)(Mutex*, const Condition&, Duration);
using BCT = bool (*)(Mutex*, const Condition&, Time);
constexpr unsigned kRead = __tsan_mutex_read_lock;

BALLAST_NO_TSA Mutex::~Mutex() {
  static const auto real = Real<V>("N", "5MutexD2Ev");
  if (FromThisExecutable(BALLAST_CALLER)) __tsan_mutex_destroy(this, 0);
  real(this);
}

BALLAST_NO_TSA void Mutex::Lock() {
  static const auto real = Real<V>("N", "5Mutex4LockEv");
  Locking(this, 0, [&] { return (real(this), 0); });
}

BALLAST_NO_TSA void Mutex::ReaderLock() {
  static const auto real = Real<V>("N", "5Mutex10ReaderLockEv");
  Locking(this, kRead, [&] { return (real(this), 0); });
}

BALLAST_NO_TSA bool Mutex::TryLock() {
  static const auto real = Real<B>("N", "5Mutex7TryLockEv");
  return TryLocking(this, 0, [&] { return real(this); });
}

BALLAST_NO_TSA bool Mutex::ReaderTryLock() {
  static const auto real = Real<B>("N", "5Mutex13ReaderTryLockEv");
  return TryLocking(this, kRead, [&] { return real(this); });
}

BALLAST_NO_TSA void Mutex::Unlock() {
  static const auto real = Real<V>("N", "5Mutex6UnlockEv");
  Unlocking(this, 0, [&] { real(this); });
}

BALLAST_NO_TSA void Mutex::ReaderUnlock() {
  static const auto real = Real<V>("N", "5Mutex12ReaderUnlockEv");
  Unlocking(this, kRead, [&] { real(this); });
}

BALLAST_NO_TSA void Mutex::LockWhen(const Condition& cond) {
  static const auto real = Real<VC>("N", "5Mutex8LockWhenERKNS0_9ConditionE");
  Locking(this, 0, [&] { return (real(this, cond), 0); });
}

BALLAST_NO_TSA void Mutex::ReaderLockWhen(const Condition& cond) {
  static const auto real = Real<VC>("N", "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locking(this, kRead, [&] { return (real(this, cond), 0); });
}

BALLAST_NO_TSA bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const auto real =
      Real<BCD>("N", "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, 0, [&] { return real(this, cond, timeout); });
}

BALLAST_NO_TSA bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const auto real =
      Real<BCT>("N", "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, 0, [&] { return real(this, cond, deadline); });
}

BALLAST_NO_TSA bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const auto real =
      Real<BCD>("N", "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, kRead, [&] { return real(this, cond, timeout); });
}

BALLAST_NO_TSA bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const auto real =
      Real<BCT>("N", "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, kRead, [&] { return real(this, cond, deadline); });
}

BALLAST_NO_TSA void Mutex::Await(const Condition& cond) {
  static const auto real = Real<VC>("N", "5Mutex5AwaitERKNS0_9ConditionE");
  Waiting(this, [&] { return (real(this, cond), 0); });
}

BALLAST_NO_TSA bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static const auto real =
      Real<BCD>("N", "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Waiting(this, [&] { return real(this, cond, timeout); });
}

BALLAST_NO_TSA bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static const auto real = Real<BCT>("N", "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Waiting(this, [&] { return real(this, cond, deadline); });
}

BALLAST_NO_TSA void CondVar::Wait(Mutex* mu) {
  static const auto real = Real<void (*)(CondVar*, Mutex*)>("N", "7CondVar4WaitEPNS0_5MutexE");
  Waiting(mu, [&] { return (real(this, mu), 0); });
}

BALLAST_NO_TSA bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, Duration)>(
      "N", "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Waiting(mu, [&] { return real(this, mu, timeout); });
}

BALLAST_NO_TSA bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, Time)>(
      "N", "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Waiting(mu, [&] { return real(this, mu, deadline); });
}

// Notification: Notify() stores the flag in uninstrumented code and the
// waits may return on an uninstrumented fast path, so the flag's
// release/acquire is annotated explicitly (HasBeenNotified() is inline and
// already an instrumented acquire load of the same address). The mutex
// operations inside are nested calls, not annotated.
void Notification::Notify() {
  static const auto real = Real<void (*)(Notification*)>("N", "12Notification6NotifyEv");
  Outermost o;
  if (o) __tsan_release(const_cast<void*>(NotifiedFlag(this)));
  real(this);
}

void Notification::WaitForNotification() const {
  static const auto real =
      Real<void (*)(const Notification*)>("NK", "12Notification19WaitForNotificationEv");
  Outermost o;
  real(this);
  if (o) __tsan_acquire(const_cast<void*>(NotifiedFlag(this)));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static const auto real = Real<bool (*)(const Notification*, Duration)>(
      "NK", "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  Outermost o;
  const bool r = real(this, timeout);
  if (o && r) __tsan_acquire(const_cast<void*>(NotifiedFlag(this)));
  return r;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static const auto real = Real<bool (*)(const Notification*, Time)>(
      "NK", "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  Outermost o;
  const bool r = real(this, deadline);
  if (o && r) __tsan_acquire(const_cast<void*>(NotifiedFlag(this)));
  return r;
}

void Status::UnrefNonInlined(uintptr_t rep) {
  static const auto real = Real<void (*)(uintptr_t)>("N", "6Status15UnrefNonInlinedEm");
  __tsan_ignore_thread_begin();
  real(rep);
  __tsan_ignore_thread_end();
}

ABSL_NAMESPACE_END
}  // namespace absl
