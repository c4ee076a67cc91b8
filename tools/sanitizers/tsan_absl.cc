// ThreadSanitizer support for Debian's Abseil, linked into every binary of
// a --config=tsan build (.bazelrc: --custom_malloc points here, the one way
// to add a library to every cc_binary and cc_test without editing them).
//
// Why: absl::Mutex, CondVar, Notification, BlockingCounter and Barrier
// synchronize with atomics and futexes inside libabsl_synchronization.so,
// which Debian does not build with -fsanitize=thread. TSan then sees
// neither the locks nor what they order, and reports every access guarded
// by an absl::Mutex as a race. Abseil built with TSan annotates itself
// (ABSL_TSAN_MUTEX_* in mutex.cc); this file adds the same annotations
// from outside: it defines the public entry points, which take precedence
// over the shared library's (ELF interposition, also for the library's own
// calls, e.g. Notification locking its Mutex), tells TSan what each does,
// and forwards to the real one (dlsym RTLD_NEXT).
//
// The annotations follow mutex.cc: __tsan_mutex_pre/post_lock and
// pre/post_unlock, so that accesses inside the library (a waiter's
// Condition evaluated by the unlocking thread) are ignored, as they are in
// an instrumented Abseil. Await and CondVar::Wait release the mutex and take
// it back. Notification, BlockingCounter and Barrier get release/acquire
// pairs on their own address.
//
// Built only under --define=downpour_tsan=1 (BUILD): it refers to the TSan
// runtime.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/barrier.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

// The shared library's definition of `mangled` (the next one after ours).
template <typename F>
F Real(const char* mangled) {
  void* f = dlsym(RTLD_NEXT, mangled);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl: %s not found: %s\n", mangled, dlerror());
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

// Some entry points call others through the library's PLT, i.e. through
// ours (WaitWithTimeout calls WaitWithDeadline; Notification locks its
// Mutex): only the outermost call is annotated. A nested call is always
// paired inside the outer one (a lock with its unlock), so skipping both
// keeps TSan's view consistent.
thread_local int depth = 0;

struct Outer {
  Outer() : outer(depth++ == 0) {}
  ~Outer() { --depth; }
  const bool outer;
};

// Declares `real` (the library's function) and forwards to it at once when
// this call is nested in another of ours.
#define REAL(type, mangled, ...)                \
  static const auto real = Real<type>(mangled); \
  Outer scope;                                  \
  if (!scope.outer) return real(__VA_ARGS__)

constexpr unsigned kRead = __tsan_mutex_read_lock;
constexpr unsigned kTry = __tsan_mutex_try_lock;
constexpr unsigned kTryFailed = __tsan_mutex_try_lock_failed;

// The mutex is held (in mode `flags`) before and after a call that releases
// and re-acquires it (Await, CondVar::Wait).
template <typename Call>
auto Reacquiring(void* mu, unsigned flags, Call call) {
  __tsan_mutex_pre_unlock(mu, flags);
  auto result = call();
  __tsan_mutex_post_unlock(mu, flags);
  __tsan_mutex_pre_lock(mu, flags);
  __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

}  // namespace

namespace absl {
inline namespace debian3 {

// --- Mutex ---
// (No ~Mutex: TSan drops the state of a heap mutex when its memory is freed,
// and annotating the destruction of mutexes inside gRPC's objects, which
// gRPC frees from its own threads, reports races TSan cannot order.)

void Mutex::Lock() {
  REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv", this);
  __tsan_mutex_pre_lock(this, 0);
  real(this);
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::ReaderLock() {
  REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv", this);
  __tsan_mutex_pre_lock(this, kRead);
  real(this);
  __tsan_mutex_post_lock(this, kRead, 0);
}

bool Mutex::TryLock() {
  REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv", this);
  __tsan_mutex_pre_lock(this, kTry);
  const bool ok = real(this);
  __tsan_mutex_post_lock(this, kTry | (ok ? 0 : kTryFailed), 0);
  return ok;
}

bool Mutex::ReaderTryLock() {
  REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv", this);
  __tsan_mutex_pre_lock(this, kRead | kTry);
  const bool ok = real(this);
  __tsan_mutex_post_lock(this, kRead | kTry | (ok ? 0 : kTryFailed), 0);
  return ok;
}

void Mutex::Unlock() {
  REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv", this);
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

void Mutex::ReaderUnlock() {
  REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv", this);
  __tsan_mutex_pre_unlock(this, kRead);
  real(this);
  __tsan_mutex_post_unlock(this, kRead);
}

void Mutex::LockWhen(const Condition& cond) {
  REAL(void (*)(Mutex*, const Condition&),
       "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE", this, cond);
  __tsan_mutex_pre_lock(this, 0);
  real(this, cond);
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  REAL(void (*)(Mutex*, const Condition&),
       "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE", this, cond);
  __tsan_mutex_pre_lock(this, kRead);
  real(this, cond);
  __tsan_mutex_post_lock(this, kRead, 0);
}

// The *WithTimeout / *WithDeadline forms hold the mutex on return whatever
// they return.
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  REAL(bool (*)(Mutex*, const Condition&, Duration),
       "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_"
       "8DurationE",
       this, cond, timeout);
  __tsan_mutex_pre_lock(this, 0);
  const bool ok = real(this, cond, timeout);
  __tsan_mutex_post_lock(this, 0, 0);
  return ok;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  REAL(bool (*)(Mutex*, const Condition&, Time),
       "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_"
       "4TimeE",
       this, cond, deadline);
  __tsan_mutex_pre_lock(this, 0);
  const bool ok = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, 0, 0);
  return ok;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  REAL(bool (*)(Mutex*, const Condition&, Duration),
       "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_"
       "8DurationE",
       this, cond, timeout);
  __tsan_mutex_pre_lock(this, kRead);
  const bool ok = real(this, cond, timeout);
  __tsan_mutex_post_lock(this, kRead, 0);
  return ok;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  REAL(
      bool (*)(Mutex*, const Condition&, Time),
      "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_"
      "4TimeE",
      this, cond, deadline);
  __tsan_mutex_pre_lock(this, kRead);
  const bool ok = real(this, cond, deadline);
  __tsan_mutex_post_lock(this, kRead, 0);
  return ok;
}

// Await* are called holding the mutex (in the code here, always as a
// writer) and release it while they wait.
void Mutex::Await(const Condition& cond) {
  REAL(void (*)(Mutex*, const Condition&),
       "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE", this, cond);
  Reacquiring(this, 0, [&] {
    real(this, cond);
    return 0;
  });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  REAL(bool (*)(Mutex*, const Condition&, Duration),
       "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_"
       "8DurationE",
       this, cond, timeout);
  return Reacquiring(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  REAL(bool (*)(Mutex*, const Condition&, Time),
       "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_"
       "4TimeE",
       this, cond, deadline);
  return Reacquiring(this, 0, [&] { return real(this, cond, deadline); });
}

// --- CondVar ---

void CondVar::Wait(Mutex* mu) {
  REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE",
       this, mu);
  Reacquiring(mu, 0, [&] {
    real(this, mu);
    return 0;
  });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  REAL(bool (*)(CondVar*, Mutex*, Duration),
       "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE",
       this, mu, timeout);
  return Reacquiring(mu, 0, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  REAL(bool (*)(CondVar*, Mutex*, Time),
       "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE",
       this, mu, deadline);
  return Reacquiring(mu, 0, [&] { return real(this, mu, deadline); });
}

// --- Notification, BlockingCounter, Barrier ---
// (Notification::HasBeenNotified is inline: a caller that polls it instead
// of waiting gets no acquire. Nothing here relies on the data a notifier
// wrote before Notify() after only polling.)

void Notification::Notify() {
  REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv",
       this);
  __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  REAL(void (*)(const Notification*),
       "_ZNK4absl7debian312Notification19WaitForNotificationEv", this);
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  REAL(bool (*)(const Notification*, Duration),
       "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_"
       "8DurationE",
       this, timeout);
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  REAL(bool (*)(const Notification*, Time),
       "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_"
       "4TimeE",
       this, deadline);
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool BlockingCounter::DecrementCount() {
  REAL(bool (*)(BlockingCounter*),
       "_ZN4absl7debian315BlockingCounter14DecrementCountEv", this);
  __tsan_release(this);
  return real(this);
}

void BlockingCounter::Wait() {
  REAL(void (*)(BlockingCounter*), "_ZN4absl7debian315BlockingCounter4WaitEv",
       this);
  real(this);
  __tsan_acquire(this);
}

bool Barrier::Block() {
  REAL(bool (*)(Barrier*), "_ZN4absl7debian37Barrier5BlockEv", this);
  __tsan_release(this);
  const bool last = real(this);
  __tsan_acquire(this);
  return last;
}

}  // namespace debian3
}  // namespace absl
