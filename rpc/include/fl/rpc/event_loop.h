// The event loop every control plane runs on (fl-server's round engine, the islands coordinator): one thread
// owns all the state; other threads (gRPC reactors, signal handlers) only Post() events; timers run on the loop
// thread at deadlines read from an injected Clock.
//
// One loop turn: take every queued event and handle them in order, run the timers that are due, then call the
// owner's after-turn hook (where a state machine moves forward as far as the facts allow). With a SystemClock
// the thread sleeps until the next event or the earliest timer. With a ManualClock nothing is due until the
// test advances the clock; tests drive the loop on their own thread with RunUntilIdle(), which makes every
// deadline, retry and eviction deterministic and instant (no sleeps).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <unordered_map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "fl/core/mutex.h"
#include "fl/rpc/clock.h"

namespace fl::rpc {

using TimerId = uint64_t;

// Timers of one loop, ordered by deadline (ties in the order they were set). Not thread-safe: the loop's
// thread only.
class TimerQueue {
 public:
  TimerId At(int64_t when_ns, std::function<void()> fn);
  // False when `id` already ran or was cancelled (cancelling twice is harmless).
  bool Cancel(TimerId id);
  // The earliest deadline, or INT64_MAX when no timer is set.
  int64_t NextDueNs() const;
  // Runs every timer due at `now_ns`, earliest first; timers that a running timer sets run too when they are
  // due already. Returns how many ran.
  size_t RunDue(int64_t now_ns);
  size_t size() const { return timers_.size(); }

 private:
  std::map<std::pair<int64_t, TimerId>, std::function<void()>> timers_;
  std::unordered_map<TimerId, int64_t> due_;
  TimerId next_id_ = 1;
};

template <class Event>
class EventLoop {
 public:
  using Handler = std::function<void(Event&)>;
  // `handle` runs for each event, `after_turn` (may be null) after each turn that handled an event or ran a
  // timer; both on the loop thread.
  EventLoop(const Clock* clock, Handler handle, std::function<void()> after_turn = nullptr)
      : clock_(clock), handle_(std::move(handle)), after_turn_(std::move(after_turn)) {}
  ~EventLoop() { Stop(); }
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  const Clock& clock() const { return *clock_; }

  // Any thread; never blocks on the loop's work.
  void Post(Event event) {
    {
      fl::MutexLock lock(mu_);
      queue_.push_back(std::move(event));
      queued_.fetch_add(1, std::memory_order_relaxed);
    }
    cv_.NotifyAll();
  }
  // Any thread, lock-free: events posted and not yet handled (the backlog a late loop has). A load
  // signal for shedding new work (fl-server refuses Joins above --max-engine-queue); approximate by design.
  size_t queued() const { return queued_.load(std::memory_order_relaxed); }

  // Loop thread only (or before Start). A timer at or before now runs in the current or next turn.
  TimerId At(int64_t when_ns, std::function<void()> fn) { return timers_.At(when_ns, std::move(fn)); }
  TimerId After(int64_t delay_ns, std::function<void()> fn) { return At(clock_->NowNs() + delay_ns, std::move(fn)); }
  bool Cancel(TimerId id) { return timers_.Cancel(id); }
  size_t timers() const { return timers_.size(); }

  // Runs the loop on its own thread until Stop(); `first_turn` (may be null) runs on it first.
  void Start(std::function<void()> first_turn = nullptr) {
    thread_ = std::thread([this, first = std::move(first_turn)] {
      if (first) first();
      Run();
    });
  }
  // Ends the loop thread after its current turn; events still queued are not handled. Idempotent.
  void Stop() {
    {
      fl::MutexLock lock(mu_);
      stop_ = true;
    }
    cv_.NotifyAll();
    if (thread_.joinable()) thread_.join();
  }
  // With a ManualClock and a started loop: makes the loop look at its timers again (after the clock moved).
  void Wake() {
    {
      fl::MutexLock lock(mu_);
      woken_ = true;
    }
    cv_.NotifyAll();
  }

  // Test mode (the loop is not started): runs turns on the calling thread until no event is queued and no
  // timer is due at the clock's current time. Returns the number of turns that did something.
  size_t RunUntilIdle() {
    size_t turns = 0;
    while (Turn()) ++turns;
    return turns;
  }

 private:
  // One turn; false when there was nothing to do.
  bool Turn() {
    std::deque<Event> batch;
    {
      fl::MutexLock lock(mu_);
      batch.swap(queue_);
    }
    for (Event& e : batch) {
      handle_(e);
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    const size_t fired = timers_.RunDue(clock_->NowNs());
    if (batch.empty() && fired == 0) return false;
    if (after_turn_) after_turn_();
    return true;
  }

  void Run() {
    for (;;) {
      {
        fl::MutexLock lock(mu_);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stop_ || woken_; };
        const int64_t due = timers_.NextDueNs();
        const int64_t now = clock_->NowNs();
        if (!ready() && due > now) {
          if (due == INT64_MAX || !clock_->IsReal()) {
            cv_.Wait(mu_, ready);  // a manual clock's deadline comes only with a Wake() after it moved
          } else {
            cv_.WaitFor(mu_, std::chrono::nanoseconds(due - now), ready);
          }
        }
        if (stop_) break;
        woken_ = false;
      }
      Turn();
    }
  }

  const Clock* clock_;
  Handler handle_;
  std::function<void()> after_turn_;
  TimerQueue timers_;  // loop thread only

  fl::Mutex mu_;
  fl::CondVar cv_;
  std::deque<Event> queue_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> queued_{0};  // posted and not yet handled (the turn's batch included)
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace fl::rpc
