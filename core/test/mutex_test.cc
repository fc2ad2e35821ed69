// fl::Mutex, fl::RecursiveMutex and fl::CondVar behave as the std types they wrap; the annotations themselves are
// checked by the clang-tsa preset (tools_thread_safety_rejects_unlocked_access).
#include "fl/core/mutex.h"

#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace fl {
namespace {

class Counter {
 public:
  void Add(int n) {
    for (int i = 0; i < n; ++i) {
      MutexLock lock(mu_);
      ++value_;
    }
  }
  int value() {
    MutexLock lock(mu_);
    return value_;
  }

 private:
  Mutex mu_;
  int value_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(MutexTest, MutexLockExcludesOtherThreads) {
  Counter counter;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&] { counter.Add(10000); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter.value(), 40000);
}

TEST(MutexTest, TryLockFailsWhileHeldElsewhere) {
  Mutex mu;
  MutexLock lock(mu);
  bool taken = true;
  std::thread([&] {
    if (mu.TryLock()) {
      mu.Unlock();
    } else {
      taken = false;
    }
  }).join();
  EXPECT_FALSE(taken);
}

// Re-entered through a call, as a gRPC callback run inline re-enters service.cc's locks (the analysis does not
// model re-entry: locking twice in one function is refused by it).
int TakeAgain(RecursiveMutex& mu, int& guarded) {
  RecursiveMutexLock inner(mu);  // would deadlock on a Mutex
  return ++guarded;
}

TEST(MutexTest, RecursiveMutexIsTakenAgainOnTheThreadThatHoldsIt) {
  RecursiveMutex mu;
  int guarded = 0;
  RecursiveMutexLock outer(mu);
  EXPECT_EQ(TakeAgain(mu, guarded), 1);
}

class Flag {
 public:
  void Set() {
    {
      MutexLock lock(mu_);
      set_ = true;
    }
    cv_.NotifyAll();
  }
  void WaitSet() {
    MutexLock lock(mu_);
    cv_.Wait(mu_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return set_; });
  }
  bool WaitSetFor(std::chrono::milliseconds timeout) {
    MutexLock lock(mu_);
    return cv_.WaitFor(mu_, timeout, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return set_; });
  }
  bool WaitSetUntil(std::chrono::steady_clock::time_point deadline) {
    MutexLock lock(mu_);
    return cv_.WaitUntil(mu_, deadline, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return set_; });
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool set_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(CondVarTest, WaitReturnsOnceAnotherThreadSetsTheCondition) {
  Flag flag;
  std::thread setter([&] { flag.Set(); });
  flag.WaitSet();
  setter.join();
  EXPECT_TRUE(flag.WaitSetFor(std::chrono::milliseconds(0)));
}

TEST(CondVarTest, TimedWaitsAreFalseWhenTheConditionNeverHolds) {
  Flag flag;
  EXPECT_FALSE(flag.WaitSetFor(std::chrono::milliseconds(1)));
  EXPECT_FALSE(flag.WaitSetUntil(std::chrono::steady_clock::now() + std::chrono::milliseconds(1)));
}

TEST(CondVarTest, TimedWaitsAreTrueAtOnceWhenTheConditionHolds) {
  Flag flag;
  flag.Set();
  EXPECT_TRUE(flag.WaitSetFor(std::chrono::hours(1)));
  EXPECT_TRUE(flag.WaitSetUntil(std::chrono::steady_clock::now() + std::chrono::hours(1)));
}

}  // namespace
}  // namespace fl
