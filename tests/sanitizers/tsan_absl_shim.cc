// ThreadSanitizer builds only (SANDBOX_BROKER_SANITIZE=thread).
//
// Debian's Abseil is not built with -fsanitize=thread, so TSan cannot see
// absl::Mutex, absl::CondVar or absl::Notification synchronise anything:
// every access guarded by one would be reported as a race. This file
// interposes their public entry points (the executable's definitions win
// over libabsl_synchronization.so's, which is linked without -Bsymbolic),
// calls the real function via dlsym(RTLD_NEXT) and tells TSan about the
// happens-before edge: release before giving a lock up, acquire after
// getting it. That is the same happens-before model TSan applies to the
// mutexes it intercepts itself. gRPC's grpc_core::Mutex wraps absl::Mutex, so
// gRPC's own locking becomes visible too.

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace {

template <typename Fn>
Fn Real(const char* mangled) {
  void* p = dlsym(RTLD_NEXT, mangled);
  if (p == nullptr) {
    std::fprintf(stderr, "tsan_absl_shim: %s not found\n", mangled);
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

}  // namespace

#define SB_REAL(type, mangled) static const auto real = Real<type>(mangled)

namespace {

// Set while this thread is inside Notification::Notify. Notify stores
// "notified" and only then unlocks its mutex (through the Mutex::Unlock
// below: libabsl calls it through the PLT). A waiter that sees "notified"
// on WaitForNotification's lock-free fast path may return and free the
// Notification at once, so an annotation in that Unlock would be a
// synchronisation operation on freed (or reused) memory. TSan does not
// report those; they can corrupt its own metadata for the address instead
// (the likely cause of a SEGV seen once in CI inside
// __tsan::MetaMap::GetBlock, freeing a later allocation at such an
// address). Notify's own release, made
// before the real Notify, is the edge the waiter acquires; the inner
// unlock needs none.
thread_local int in_notify = 0;

// A mutex's release, unless this thread is inside Notify. (Acquires are
// always reported: Notify locks before it stores "notified", while no
// waiter can have returned, and a waiter's Condition that Notify's unlock
// evaluates belongs to a waiter still blocked in the slow path.)
void Releasing(void* mu) {
  if (in_notify == 0) __tsan_release(mu);
}

}  // namespace

namespace {

// Abseil evaluates a waiter's Condition while it holds the mutex, inside the
// library (in the waiter's thread or in the thread unlocking). Wrapping the
// Condition tells TSan the evaluation is inside the critical section.
struct AnnotatedCondition {
  const absl::Condition* cond;
  void* mu;
  static bool Eval(AnnotatedCondition* self) {
    __tsan_acquire(self->mu);
    const bool r = self->cond->Eval();
    __tsan_release(self->mu);
    return r;
  }
};

}  // namespace

// A Condition that evaluates `c` with the annotations above; `storage` must
// outlive the call it is passed to.
#define SB_COND(c, storage) \
  storage{&(c), this};      \
  const absl::Condition annotated(&AnnotatedCondition::Eval, &storage)

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  SB_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}
void Mutex::ReaderLock() {
  SB_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}
bool Mutex::TryLock() {
  SB_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  const bool got = real(this);
  if (got) __tsan_acquire(this);
  return got;
}
bool Mutex::ReaderTryLock() {
  SB_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool got = real(this);
  if (got) __tsan_acquire(this);
  return got;
}
void Mutex::Unlock() {
  SB_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  Releasing(this);
  real(this);
}
void Mutex::ReaderUnlock() {
  SB_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Releasing(this);
  real(this);
}
void Mutex::LockWhen(const Condition& c) {
  SB_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  AnnotatedCondition SB_COND(c, storage);
  real(this, annotated);
  __tsan_acquire(this);
}
void Mutex::ReaderLockWhen(const Condition& c) {
  SB_REAL(void (*)(Mutex*, const Condition&),
          "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  AnnotatedCondition SB_COND(c, storage);
  real(this, annotated);
  __tsan_acquire(this);
}
bool Mutex::LockWhenWithTimeout(const Condition& c, absl::Duration d) {
  SB_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
          "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AnnotatedCondition SB_COND(c, storage);
  const bool r = real(this, annotated, d);
  __tsan_acquire(this);
  return r;
}
bool Mutex::LockWhenWithDeadline(const Condition& c, absl::Time t) {
  SB_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
          "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AnnotatedCondition SB_COND(c, storage);
  const bool r = real(this, annotated, t);
  __tsan_acquire(this);
  return r;
}
bool Mutex::ReaderLockWhenWithTimeout(const Condition& c, absl::Duration d) {
  SB_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
          "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AnnotatedCondition SB_COND(c, storage);
  const bool r = real(this, annotated, d);
  __tsan_acquire(this);
  return r;
}
bool Mutex::ReaderLockWhenWithDeadline(const Condition& c, absl::Time t) {
  SB_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
          "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AnnotatedCondition SB_COND(c, storage);
  const bool r = real(this, annotated, t);
  __tsan_acquire(this);
  return r;
}
void Mutex::Await(const Condition& c) {
  SB_REAL(void (*)(Mutex*, const Condition&), "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  AnnotatedCondition SB_COND(c, storage);
  Releasing(this);
  real(this, annotated);
  __tsan_acquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& c, absl::Duration d) {
  SB_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
          "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AnnotatedCondition SB_COND(c, storage);
  Releasing(this);
  const bool r = real(this, annotated, d);
  __tsan_acquire(this);
  return r;
}
bool Mutex::AwaitWithDeadline(const Condition& c, absl::Time t) {
  SB_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
          "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AnnotatedCondition SB_COND(c, storage);
  Releasing(this);
  const bool r = real(this, annotated, t);
  __tsan_acquire(this);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  SB_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Releasing(mu);
  real(this, mu);
  __tsan_acquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration d) {
  SB_REAL(bool (*)(CondVar*, Mutex*, absl::Duration),
          "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Releasing(mu);
  const bool r = real(this, mu, d);
  __tsan_acquire(mu);
  return r;
}
bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time t) {
  SB_REAL(bool (*)(CondVar*, Mutex*, absl::Time),
          "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Releasing(mu);
  const bool r = real(this, mu, t);
  __tsan_acquire(mu);
  return r;
}

void Notification::Notify() {
  SB_REAL(void (*)(Notification*), "_ZN4absl7debian312Notification6NotifyEv");
  __tsan_release(this);
  ++in_notify;
  real(this);
  --in_notify;
}
void Notification::WaitForNotification() const {
  SB_REAL(void (*)(const Notification*), "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}
bool Notification::WaitForNotificationWithTimeout(absl::Duration d) const {
  SB_REAL(bool (*)(const Notification*, absl::Duration),
          "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool r = real(this, d);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}
bool Notification::WaitForNotificationWithDeadline(absl::Time t) const {
  SB_REAL(bool (*)(const Notification*, absl::Time),
          "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool r = real(this, t);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

ABSL_NAMESPACE_END
}  // namespace absl
