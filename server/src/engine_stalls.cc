// The server's own stalls (docs/round-engine.md, "When the server itself stalls"). When fl-server is stopped
// (SIGSTOP/SIGCONT), its VM paused, its memory swapped out or one step of its own takes seconds, nothing of it
// runs: the clients' heartbeats and uploads wait in the sockets, and when it resumes its timers fire at once, late.
// Judged then, every client looks silent and every task late (issue 27: a 20 s pause closed every session for "no
// heartbeat for four intervals", a 12 s pause failed the open round with every task dropped). The clients were not
// at fault, so the engine notes how long it did not run and moves every deadline and liveness mark on by that
// before it judges anyone; what arrived meanwhile is then read and handled as if the pause had not happened.
//
// How a stall is seen: a watchdog timer wakes the loop every half threshold, so that a healthy engine never goes
// longer than that without running. Every judgement (each event, the heartbeat and upload checks, Advance) first
// calls CatchUpAfterStall(now), which measures the time since the engine last ran; above the threshold it is a
// stall, and its whole length is credited (an idle half-threshold at most of it was not: the clients get that
// much more, never less).
#include <algorithm>
#include <cstdint>
#include <string>

#include <spdlog/spdlog.h>

#include "fl/core/str_cat.h"
#include "fl/server/round_engine.h"
#include "engine_internal.h"
#include "engine_schedule.h"

namespace fl::server {

using namespace engine_internal;  // NOLINT: the engine's own helpers

void RoundEngine::Core::ArmStallWatchdog() {
  if (stall_threshold_ns_ <= 0) return;
  stall_timer_ = loop_.After(stall_threshold_ns_ / 2, [this] {
    stall_timer_ = 0;
    if (state_ == EngineState::kFinished) return;
    CatchUpAfterStall(NowNs());
    ArmStallWatchdog();
  });
}

void RoundEngine::Core::CatchUpAfterStall(int64_t now) {
  if (stall_threshold_ns_ <= 0) return;
  const int64_t stall = now - loop_alive_ns_;
  loop_alive_ns_ = std::max(loop_alive_ns_, now);
  if (stall <= stall_threshold_ns_ || state_ == EngineState::kFinished) return;
  MoveDeadlinesOn(stall, now);
}

void RoundEngine::Core::MoveDeadlinesOn(int64_t stall, int64_t now) {
  spdlog::warn(
      "the engine did not run for {:.1f} s (fl-server was stopped or paused, or one of its own steps took that "
      "long; stall threshold {} ms): heartbeat, round, task and upload deadlines move on by that, so that no "
      "client is blamed for the server's stall",
      static_cast<double>(stall) / 1e9, stall_threshold_ns_ / kMsToNs);
  // Liveness: what a client said before the stall counts as said that much later (never later than now). A
  // uniform shift keeps the registry's places in order of when each client was last heard.
  for (auto& [id, c] : clients_.all()) c->last_seen_ns = std::min(now, c->last_seen_ns + stall);
  // Every open task's deadline (a round's, an evaluation's, a buffered task's own) and the round's.
  for (auto& [id, t] : tasks_) {
    if (!t->closed) t->deadline_ns += stall;
  }
  if (current_ != nullptr) {
    current_->deadline_ns += stall;
    ArmAt(deadline_timer_, current_->deadline_ns);
  }
  schedule_->AfterStall(stall);
  // Uploads holding a slot: the stall is neither a silence of theirs nor time at a low rate.
  uploads_.MoveOn(stall);
  if (state_ == EngineState::kWaitingForModel && !initial_model_client_.empty()) {
    initial_model_asked_ns_ += stall;
    ArmAt(initial_model_timer_, initial_model_asked_ns_ + int64_t{config_.initial_model_deadline_ms} * kMsToNs);
  }
  if (drain_deadline_ns_ != 0) {
    drain_deadline_ns_ += stall;
    ArmAt(drain_timer_, drain_deadline_ns_);
  }
}

}  // namespace fl::server
