#include "fl/emulation/shaper.h"

#include <algorithm>
#include <cmath>

namespace fl::emulation {
namespace {
constexpr double kPayloadPerWire = kMssBytes / kMtuBytes;
constexpr int64_t kNsPerMs = 1'000'000;
}  // namespace

DirectionShaper::DirectionShaper(const LinkDirection& config, uint64_t seed, int64_t start_ns)
    : config_(config), rng_(seed), start_ns_(start_ns), last_ns_(start_ns), last_release_ns_(start_ns) {
  burst_ = BurstBytes(config_.rate_bps);
  tokens_ = burst_;
}

double DirectionShaper::BurstBytes(double rate_bps) { return std::max(4.0 * kMtuBytes, rate_bps / 8.0 * 1e-3); }

void DirectionShaper::Enqueue(int64_t now_ns, uint64_t bytes) {
  // Bring the bottleneck up to the arrival first: tokens accrued (and trace opportunities wasted) while
  // the queue was empty must not be credited to bytes that were not there yet.
  Advance(now_ns);
  enqueued_ += bytes;
  Advance(now_ns);
}

void DirectionShaper::Advance(int64_t now_ns) {
  if (config_.has_trace) {
    ShapeTrace(now_ns);
  } else if (config_.rate_bps > 0) {
    ShapeTokenBucket(now_ns);
  } else if (shaped_ < enqueued_) {
    shaped_ = enqueued_;
    Depart(now_ns);
  }
  while (!marks_.empty() && marks_.front().release_ns <= now_ns) {
    released_ = marks_.front().end;
    marks_.pop_front();
  }
}

void DirectionShaper::ShapeTokenBucket(int64_t now_ns) {
  const uint64_t q = queued();
  if (now_ns > last_ns_) {
    // While bytes wait (they were all there since the last update: Enqueue advances before adding), the
    // link has been busy sending them the whole time, so a late wake-up must not forfeit that time: the
    // cap covers the backlog. Only an idle link's credit is limited to the burst.
    const double cap = burst_ + static_cast<double>(q) / kPayloadPerWire;
    tokens_ = std::min(cap, tokens_ + static_cast<double>(now_ns - last_ns_) * config_.rate_bps / 8e9);
    last_ns_ = now_ns;
  }
  if (q == 0) return;
  const auto affordable = static_cast<uint64_t>(std::floor(tokens_ * kPayloadPerWire));
  const uint64_t grant = std::min(q, affordable);
  if (grant == 0) return;
  tokens_ -= static_cast<double>(grant) / kPayloadPerWire;
  shaped_ += grant;
  Depart(now_ns);
}

int64_t DirectionShaper::OpportunityNs(uint64_t index) const {
  const auto& opp = config_.trace.opportunities_ms;
  const uint64_t n = opp.size();
  const uint64_t cycle = index / n;
  return start_ns_ + static_cast<int64_t>(cycle * config_.trace.period_ms + opp[index % n]) * kNsPerMs;
}

void DirectionShaper::SkipIdleOpportunities(int64_t now_ns) {
  // Opportunities before now passed with nothing to send: Mahimahi wastes them, and so do we.
  if (OpportunityNs(next_opportunity_) >= now_ns) return;
  const auto& opp = config_.trace.opportunities_ms;
  const int64_t period_ns = static_cast<int64_t>(config_.trace.period_ms) * kNsPerMs;
  const int64_t since = now_ns - start_ns_;
  const uint64_t cycle = static_cast<uint64_t>(since / period_ns);
  const int64_t offset_ms_ns = since - static_cast<int64_t>(cycle) * period_ns;
  // First opportunity in this cycle at or after now.
  const auto it = std::lower_bound(opp.begin(), opp.end(), offset_ms_ns,
                                   [](uint64_t ms, int64_t ns) { return static_cast<int64_t>(ms) * kNsPerMs < ns; });
  const uint64_t index = cycle * opp.size() + static_cast<uint64_t>(it - opp.begin());
  next_opportunity_ = std::max(next_opportunity_, index);
}

void DirectionShaper::ShapeTrace(int64_t now_ns) {
  if (queued() == 0) {
    SkipIdleOpportunities(now_ns);
    return;
  }
  while (queued() > 0) {
    const int64_t at = OpportunityNs(next_opportunity_);
    if (at > now_ns) return;
    shaped_ += std::min<uint64_t>(queued(), static_cast<uint64_t>(kMssBytes));
    ++next_opportunity_;
    Depart(at);
  }
  SkipIdleOpportunities(now_ns);
}

void DirectionShaper::Depart(int64_t at_ns) {
  if (!config_.HasDelay()) {
    released_ = shaped_;
    return;
  }
  double delay_ms = config_.delay_ms;
  if (config_.jitter_ms > 0) {
    std::uniform_real_distribution<double> jitter(-config_.jitter_ms, config_.jitter_ms);
    delay_ms = std::max(0.0, delay_ms + jitter(rng_));
  }
  const int64_t release = std::max(last_release_ns_, at_ns + static_cast<int64_t>(std::llround(delay_ms * 1e6)));
  last_release_ns_ = release;
  if (!marks_.empty() && marks_.back().release_ns == release) {
    marks_.back().end = shaped_;
  } else {
    marks_.push_back(Mark{release, shaped_});
  }
}

int64_t DirectionShaper::NextEventNs() const {
  int64_t next = marks_.empty() ? kNever : marks_.front().release_ns;
  const uint64_t q = queued();
  if (q == 0) return next;
  if (config_.has_trace) {
    next = std::min(next, OpportunityNs(next_opportunity_));
  } else if (config_.rate_bps > 0) {
    // Wake when a useful amount is affordable: half the bucket (at least one packet), or all that waits.
    const double granule = std::max(kMssBytes, burst_ * 0.5 * kPayloadPerWire);
    const double want_wire = std::min(static_cast<double>(q), granule) / kPayloadPerWire;
    const double missing = want_wire - tokens_;
    const int64_t at =
        missing <= 0 ? last_ns_ : last_ns_ + static_cast<int64_t>(std::ceil(missing * 8e9 / config_.rate_bps));
    next = std::min(next, at);
  } else {
    next = std::min(next, last_ns_);
  }
  return next;
}

}  // namespace fl::emulation
