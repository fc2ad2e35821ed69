// The clock a control plane reads: injected, so that deadline, straggler, retry and eviction logic can be driven
// by a test without sleeping.
//
// Every duration and deadline of the round engine and the islands coordinator is measured on NowNs()
// (monotonic); UnixMs() is only for timestamps that people read in the records. SystemClock reads the machine's
// clocks; ManualClock moves only when a test advances it (both of its readings move together).
#pragma once

#include <atomic>
#include <cstdint>

namespace fl::rpc {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic nanoseconds (the epoch is arbitrary; only differences mean something).
  virtual int64_t NowNs() const = 0;
  // Wall-clock milliseconds since the Unix epoch.
  virtual int64_t UnixMs() const = 0;
  // Wall-clock nanoseconds since the Unix epoch (the anchor of the server's timeline).
  virtual int64_t UnixNs() const = 0;
  // Whether waiting on the machine's steady clock until NowNs() reaches a deadline is meaningful. A manual
  // clock does not advance by itself: an event loop on it never sleeps towards a deadline, it waits for events
  // (ManualClock::Advance posts nothing; the test runs the loop after advancing, see EventLoop::RunUntilIdle).
  virtual bool IsReal() const = 0;
};

// The machine's clocks (steady_clock and system_clock).
class SystemClock final : public Clock {
 public:
  int64_t NowNs() const override;
  int64_t UnixMs() const override;
  int64_t UnixNs() const override;
  bool IsReal() const override { return true; }
  // The process-wide instance (stateless).
  static const Clock* Get();
};

// A clock that only moves when told to. Thread-safe.
class ManualClock final : public Clock {
 public:
  // Starts at an arbitrary but realistic wall time so that records written under it look sane.
  explicit ManualClock(int64_t start_ns = 1'000'000'000, int64_t unix_start_ms = 1'767'225'600'000)
      : now_ns_(start_ns), unix_offset_ns_(unix_start_ms * 1'000'000 - start_ns) {}
  int64_t NowNs() const override { return now_ns_.load(); }
  int64_t UnixMs() const override { return UnixNs() / 1'000'000; }
  int64_t UnixNs() const override { return now_ns_.load() + unix_offset_ns_; }
  bool IsReal() const override { return false; }

  void AdvanceNs(int64_t ns) { now_ns_ += ns; }
  void AdvanceMs(int64_t ms) { AdvanceNs(ms * 1'000'000); }
  void AdvanceS(double s) { AdvanceNs(static_cast<int64_t>(s * 1e9)); }

 private:
  std::atomic<int64_t> now_ns_;
  const int64_t unix_offset_ns_;
};

}  // namespace fl::rpc
