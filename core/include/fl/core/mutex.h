// fl::Mutex, fl::MutexLock, fl::CondVar: std::mutex and std::condition_variable with the capability
// annotations that clang's -Wthread-safety reads (the clang-tsa preset; docs/architecture.md, "Checked
// concurrency").
//
// Why not std::mutex: libstdc++ does not annotate it, so `ABSL_GUARDED_BY(std_mutex)` is never checked.
// Why not absl::Mutex: Debian's libabsl is not built with ThreadSanitizer, so TSan would not see its lock and
// unlock (they happen inside the uninstrumented library) and would report every guarded access as a race.
// This wrapper locks through pthreads, which TSan intercepts, and costs nothing over std::mutex.
//
// Waiting with a condition: the predicate reads guarded fields, so it is a lambda annotated with the lock it
// runs under, `[&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; }`; the analysis checks its body as
// holding `mu_` and the call to Wait as holding it too.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace fl {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  // Tells the analysis that this mutex is held where it cannot see it (the same mutex reached by another name,
  // `stream->owner_->mu` for `mu`); checks nothing at run time.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Only where a gRPC callback can run again on the thread that holds the lock (server/src/service.cc says where
// and why); everywhere else a Mutex, whose second Lock on one thread is a bug.
class ABSL_LOCKABLE RecursiveMutex {
 public:
  RecursiveMutex() = default;
  RecursiveMutex(const RecursiveMutex&) = delete;
  RecursiveMutex& operator=(const RecursiveMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  std::recursive_mutex mu_;
};

// Holds a Mutex (or a RecursiveMutex) for its scope.
template <class M>
class ABSL_SCOPED_LOCKABLE BasicMutexLock {
 public:
  explicit BasicMutexLock(M& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_.Lock(); }
  ~BasicMutexLock() ABSL_UNLOCK_FUNCTION() { mu_.Unlock(); }
  BasicMutexLock(const BasicMutexLock&) = delete;
  BasicMutexLock& operator=(const BasicMutexLock&) = delete;

 private:
  M& mu_;
};
using MutexLock = BasicMutexLock<Mutex>;
using RecursiveMutexLock = BasicMutexLock<RecursiveMutex>;

// A condition variable waited on under an fl::Mutex. The waits release the mutex while blocked and hold it
// again when they return, as std::condition_variable does; to the analysis the mutex is held throughout.
class CondVar {
 public:
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

  // One wait, which may wake spuriously: callers loop on their condition, or use the predicate forms.
  void Wait(Mutex& mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();  // still locked: the caller's MutexLock unlocks it
  }

  // The body is not analysed: `ready` is annotated with the caller's own name for the mutex, which the
  // analysis cannot match with `mu` here. The caller's side is checked (it holds `mu`, and `ready` is checked
  // as running under it).
  template <class Predicate>
  void Wait(Mutex& mu, Predicate ready) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock, ready);
    lock.release();
  }

  // False when `timeout` passed first with `ready()` still false.
  template <class Rep, class Period, class Predicate>
  bool WaitFor(Mutex& mu, std::chrono::duration<Rep, Period> timeout, Predicate ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const bool result = cv_.wait_for(lock, timeout, ready);
    lock.release();
    return result;
  }

  // False when `deadline` passed first with `ready()` still false.
  template <class Clock, class Duration, class Predicate>
  bool WaitUntil(Mutex& mu, std::chrono::time_point<Clock, Duration> deadline, Predicate ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const bool result = cv_.wait_until(lock, deadline, ready);
    lock.release();
    return result;
  }

  // One timed wait, which may wake spuriously; false when it timed out.
  template <class Rep, class Period>
  bool WaitFor(Mutex& mu, std::chrono::duration<Rep, Period> timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const bool notified = cv_.wait_for(lock, timeout) == std::cv_status::no_timeout;
    lock.release();
    return notified;
  }
  template <class Clock, class Duration>
  bool WaitUntil(Mutex& mu, std::chrono::time_point<Clock, Duration> deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const bool notified = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return notified;
  }

 private:
  std::condition_variable cv_;
};

}  // namespace fl
