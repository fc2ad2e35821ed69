// The event loop and its timers, driven by a ManualClock on the test's thread (RunUntilIdle) and, once, by the
// system clock on the loop's own thread.
#include "fl/rpc/event_loop.h"

#include <atomic>
#include <future>
#include <string>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "fl/rpc/clock.h"

namespace fl::rpc {
namespace {

struct Ping {
  int n = 0;
};
struct Note {
  std::string text;
};
using Event = std::variant<Ping, Note>;

class LoopTest : public ::testing::Test {
 protected:
  LoopTest()
      : loop_(
            &clock_,
            [this](Event& e) {
              if (auto* p = std::get_if<Ping>(&e)) log_.push_back("ping " + std::to_string(p->n));
              if (auto* n = std::get_if<Note>(&e)) log_.push_back("note " + n->text);
            },
            [this] { ++turns_after_; }) {}

  ManualClock clock_;
  std::vector<std::string> log_;
  int turns_after_ = 0;
  EventLoop<Event> loop_;
};

TEST_F(LoopTest, EventsAreHandledInPostOrderAndTheAfterTurnHookRuns) {
  loop_.Post(Ping{1});
  loop_.Post(Note{"a"});
  loop_.Post(Ping{2});
  EXPECT_EQ(loop_.RunUntilIdle(), 1u);
  EXPECT_EQ(log_, (std::vector<std::string>{"ping 1", "note a", "ping 2"}));
  EXPECT_EQ(turns_after_, 1);
  EXPECT_EQ(loop_.RunUntilIdle(), 0u) << "nothing queued, nothing due";
  EXPECT_EQ(turns_after_, 1);
}

TEST(EventLoopQueueTest, QueuedCountsEventsPostedAndNotYetHandledTheTurnsBatchIncluded) {
  ManualClock clock;
  EventLoop<int>* self = nullptr;
  std::vector<size_t> seen;  // queued() as each event is handled
  EventLoop<int> loop(&clock, [&](int&) { seen.push_back(self->queued()); });
  self = &loop;
  EXPECT_EQ(loop.queued(), 0u);
  for (int i = 0; i < 3; ++i) loop.Post(i);
  EXPECT_EQ(loop.queued(), 3u);
  loop.RunUntilIdle();
  // While the turn works through its batch, the events not yet handled still count: a late loop's backlog.
  EXPECT_EQ(seen, (std::vector<size_t>{3, 2, 1}));
  EXPECT_EQ(loop.queued(), 0u);
}

TEST_F(LoopTest, TimersFireOnlyWhenTheClockReachesThemInDeadlineOrder) {
  const int64_t t0 = clock_.NowNs();
  loop_.At(t0 + 300, [&] { log_.push_back("t300"); });
  loop_.At(t0 + 100, [&] { log_.push_back("t100"); });
  loop_.At(t0 + 100, [&] { log_.push_back("t100b"); });  // same deadline: in the order set
  EXPECT_EQ(loop_.RunUntilIdle(), 0u);
  EXPECT_TRUE(log_.empty());
  clock_.AdvanceNs(99);
  EXPECT_EQ(loop_.RunUntilIdle(), 0u);
  clock_.AdvanceNs(1);
  EXPECT_EQ(loop_.RunUntilIdle(), 1u);
  EXPECT_EQ(log_, (std::vector<std::string>{"t100", "t100b"}));
  clock_.AdvanceNs(1000);
  loop_.RunUntilIdle();
  EXPECT_EQ(log_.back(), "t300");
  EXPECT_EQ(loop_.timers(), 0u);
}

TEST_F(LoopTest, CancelledTimersNeverFireAndCancellingTwiceIsHarmless) {
  const TimerId id = loop_.After(50, [&] { log_.push_back("cancelled"); });
  loop_.After(60, [&] { log_.push_back("kept"); });
  EXPECT_TRUE(loop_.Cancel(id));
  EXPECT_FALSE(loop_.Cancel(id));
  clock_.AdvanceNs(100);
  loop_.RunUntilIdle();
  EXPECT_EQ(log_, (std::vector<std::string>{"kept"}));
  EXPECT_FALSE(loop_.Cancel(12345)) << "an id never issued";
}

TEST_F(LoopTest, ATimerSetByATimerRunsWhenDueAndAPeriodicTimerKeepsItsCadence) {
  int ticks = 0;
  std::function<void()> tick = [&] {
    ++ticks;
    loop_.After(10, tick);  // re-arms itself, as the round engine's heartbeat check does
  };
  loop_.After(10, tick);
  clock_.AdvanceNs(35);
  loop_.RunUntilIdle();
  EXPECT_EQ(ticks, 1) << "the re-armed timer is due at now+10, not before";
  for (int i = 0; i < 5; ++i) {
    clock_.AdvanceNs(10);
    loop_.RunUntilIdle();
  }
  EXPECT_EQ(ticks, 6);
}

TEST_F(LoopTest, EventsPostedFromAnotherThreadAreAllHandled) {
  std::thread poster([&] {
    for (int i = 0; i < 1000; ++i) loop_.Post(Ping{i});
  });
  poster.join();
  loop_.RunUntilIdle();
  ASSERT_EQ(log_.size(), 1000u);
  EXPECT_EQ(log_.front(), "ping 0");
  EXPECT_EQ(log_.back(), "ping 999");
}

TEST(EventLoopThreadTest, AStartedLoopOnTheSystemClockHandlesEventsAndFiresTimers) {
  std::promise<void> event_seen;
  std::promise<void> timer_fired;
  EventLoop<int>* self = nullptr;
  EventLoop<int> loop(SystemClock::Get(), [&](int& v) {
    if (v == 7) {
      event_seen.set_value();
      self->After(1'000'000, [&] { timer_fired.set_value(); });  // 1 ms
    }
  });
  self = &loop;
  loop.Start();
  loop.Post(7);
  EXPECT_EQ(event_seen.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(timer_fired.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  loop.Stop();
  loop.Stop();  // idempotent
}

TEST(EventLoopThreadTest, AStartedLoopOnAManualClockFiresATimerAfterTheClockMovesAndWake) {
  ManualClock clock;
  std::atomic<int> fired{0};
  std::promise<void> armed;
  std::promise<void> done;
  EventLoop<int>* self = nullptr;
  EventLoop<int> loop(&clock, [&](int&) {
    self->After(1'000'000'000, [&] {
      fired = 1;
      done.set_value();
    });
    armed.set_value();
  });
  self = &loop;
  loop.Start();
  loop.Post(0);
  ASSERT_EQ(armed.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto finished = done.get_future();
  EXPECT_EQ(finished.wait_for(std::chrono::milliseconds(20)), std::future_status::timeout)
      << "nothing is due until the manual clock moves";
  clock.AdvanceS(1.0);
  loop.Wake();
  EXPECT_EQ(finished.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(fired.load(), 1);
  loop.Stop();
}

TEST(ClockTest, ManualClockMovesBothReadingsTogetherAndOnlyWhenTold) {
  ManualClock clock;
  const int64_t mono = clock.NowNs();
  const int64_t wall = clock.UnixMs();
  EXPECT_EQ(clock.NowNs(), mono);
  clock.AdvanceMs(1500);
  EXPECT_EQ(clock.NowNs() - mono, 1'500'000'000);
  EXPECT_EQ(clock.UnixMs() - wall, 1500);
  EXPECT_FALSE(clock.IsReal());
  EXPECT_TRUE(SystemClock::Get()->IsReal());
  EXPECT_GT(SystemClock::Get()->UnixMs(), int64_t{1'600'000'000'000}) << "wall clock after 2020";
}

}  // namespace
}  // namespace fl::rpc
