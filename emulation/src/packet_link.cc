#include "fl/emulation/packet_link.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "fl/core/str_cat.h"

namespace fl::emulation {
namespace {

constexpr int64_t kNsPerMs = 1'000'000;
constexpr uint64_t kOpportunityBytes = 1500;  // one Mahimahi delivery opportunity
constexpr double kMaxDelayMs = 10'000;

std::string Field(std::string_view prefix, std::string_view name) {
  return prefix.empty() ? std::string(name) : StrCat(prefix, ".", name);
}

absl::Status Range(std::string_view prefix, std::string_view name, double v, double lo, double hi,
                   std::string_view allowed) {
  if (!std::isfinite(v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(StrCat(Field(prefix, name), ": ", v, " is out of range; allowed: ", allowed));
  }
  return absl::OkStatus();
}

absl::Status Validate(const LinkDirection& d, std::string_view f) {
  if (absl::Status s = Range(f, "rate", d.rate_bps, 0, 1e12, "0 (unlimited) to 1000gbit"); !s.ok()) return s;
  if (absl::Status s = Range(f, "delay_ms", d.delay_ms, 0, kMaxDelayMs, "0 to 10000 ms"); !s.ok()) return s;
  if (d.reorder) {
    if (absl::Status s = Range(f, "jitter_ms", d.jitter_ms, 0, kMaxDelayMs, "0 to 10000 ms"); !s.ok()) return s;
  } else if (absl::Status s = Range(f, "jitter_ms", d.jitter_ms, 0, d.delay_ms,
                                    "0 to delay_ms without reordering (reorder: true allows more)");
             !s.ok()) {
    return s;
  }
  if (!std::isfinite(d.loss) || d.loss < 0 || d.loss >= 1) {
    return absl::InvalidArgumentError(
        StrCat(Field(f, "loss"), ": ", d.loss, " is out of range; allowed: a fraction 0 <= loss < 1"));
  }
  const BurstLoss& b = d.burst_loss;
  const std::string bl = Field(f, "burst_loss");
  for (const auto& [name, v] : {std::pair<const char*, double>{"p_good_to_bad", b.p_good_to_bad},
                                {"p_bad_to_good", b.p_bad_to_good},
                                {"loss_good", b.loss_good},
                                {"loss_bad", b.loss_bad}}) {
    if (absl::Status s = Range(bl, name, v, 0, 1, "a probability in [0, 1]"); !s.ok()) return s;
  }
  if (b.Enabled() && b.p_bad_to_good <= 0) {
    return absl::InvalidArgumentError(StrCat(bl, ".p_bad_to_good: 0 with p_good_to_bad ", b.p_good_to_bad,
                                             " > 0 would lock the chain in the bad state; allowed: (0, 1]"));
  }
  if (d.has_trace) {
    if (d.trace.opportunities_ms.empty() || d.trace.period_ms == 0) {
      return absl::InvalidArgumentError(StrCat(Field(f, "trace"), ": ", d.trace.path,
                                               " has no delivery opportunity or a period of 0 ms; a Mahimahi trace "
                                               "needs at least one line and a last timestamp > 0"));
    }
    if (!std::is_sorted(d.trace.opportunities_ms.begin(), d.trace.opportunities_ms.end()) ||
        d.trace.opportunities_ms.back() > d.trace.period_ms) {
      return absl::InvalidArgumentError(StrCat(Field(f, "trace"), ": ", d.trace.path,
                                               " is not sorted or runs past its period ", d.trace.period_ms, " ms"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PacketLink> PacketLink::Create(const LinkDirection& direction, uint64_t seed, int64_t start_ns,
                                              std::string_view field) {
  if (absl::Status s = Validate(direction, field); !s.ok()) return s;
  PacketLink l;
  l.d_ = direction;
  l.start_ns_ = start_ns;
  l.rng_.seed(seed);
  l.busy_until_ns_ = start_ns;
  l.busy_start_ns_ = start_ns;
  l.queue_limit_bytes_ = direction.EffectiveQueueLimit();
  l.ns_per_byte_ = direction.has_trace || direction.rate_bps <= 0 ? 0.0 : 8e9 / direction.rate_bps;
  return l;
}

double PacketLink::Uniform() {
  // 53 random bits -> [0, 1): the same on every platform for a seed.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int64_t PacketLink::OpportunityNs(uint64_t index) const {
  const uint64_t n = d_.trace.opportunities_ms.size();
  const uint64_t cycle = index / n;
  const uint64_t i = index % n;
  return start_ns_ + static_cast<int64_t>(cycle * d_.trace.period_ms + d_.trace.opportunities_ms[i]) * kNsPerMs;
}

uint64_t PacketLink::FirstOpportunityAtOrAfter(int64_t t_ns) const {
  const uint64_t n = d_.trace.opportunities_ms.size();
  if (t_ns <= start_ns_) return 0;
  const int64_t period_ns = static_cast<int64_t>(d_.trace.period_ms) * kNsPerMs;
  // The cycle is taken so that within_ns is in (0, period]: a cycle's last line is at its period, the same instant
  // as the next cycle's start, and a packet arriving exactly then must still get that opportunity.
  const uint64_t cycle = static_cast<uint64_t>((t_ns - start_ns_ - 1) / period_ns);
  const int64_t within_ns = t_ns - start_ns_ - static_cast<int64_t>(cycle) * period_ns;
  const uint64_t min_ms = static_cast<uint64_t>((within_ns + kNsPerMs - 1) / kNsPerMs);
  const auto it = std::lower_bound(d_.trace.opportunities_ms.begin(), d_.trace.opportunities_ms.end(), min_ms);
  return cycle * n + static_cast<uint64_t>(it - d_.trace.opportunities_ms.begin());
}

bool PacketLink::Bottlenecked() const { return d_.has_trace || d_.rate_bps > 0; }

OfferResult PacketLink::Offer(int64_t now_ns, std::vector<uint8_t> packet) {
  RunBottleneck(now_ns);
  const uint64_t size = packet.size();
  ++stats_.offered;
  stats_.offered_bytes += size;
  if (!Bottlenecked()) {
    Depart(Packet{std::move(packet), now_ns}, now_ns);
    return OfferResult::kQueued;
  }
  if (queued_bytes_ + size > queue_limit_bytes_ ||
      (d_.queue_limit_packets > 0 && queue_.size() >= d_.queue_limit_packets)) {
    ++stats_.dropped_queue;
    return OfferResult::kDroppedQueue;
  }
  queue_.push_back(Packet{std::move(packet), now_ns});
  queued_bytes_ += size;
  stats_.max_queue_bytes = std::max(stats_.max_queue_bytes, queued_bytes_);
  return OfferResult::kQueued;
}

int64_t PacketLink::HeadDepartureNs() const {
  const Packet& head = queue_.front();
  if (!d_.has_trace) {
    // An idle link starts a new busy period at the packet's arrival; a busy one serialises it right after the last.
    const bool idle = head.arrival_ns >= busy_until_ns_;
    const int64_t start = idle ? head.arrival_ns : busy_start_ns_;
    const uint64_t bytes = (idle ? 0 : busy_bytes_) + head.bytes.size();
    return start + static_cast<int64_t>(std::llround(static_cast<double>(bytes) * ns_per_byte_));
  }
  return OpportunityNs(std::max(next_opportunity_, FirstOpportunityAtOrAfter(head.arrival_ns)));
}

void PacketLink::RunBottleneck(int64_t now_ns) {
  while (!queue_.empty()) {
    if (!d_.has_trace) {
      const int64_t done = HeadDepartureNs();
      if (done > now_ns) return;
      if (queue_.front().arrival_ns >= busy_until_ns_) {
        busy_start_ns_ = queue_.front().arrival_ns;
        busy_bytes_ = 0;
      }
      busy_bytes_ += queue_.front().bytes.size();
      busy_until_ns_ = done;
      Packet p = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= p.bytes.size();
      Depart(std::move(p), done);
      continue;
    }
    // Opportunities before the head arrived found the queue empty: skipped arithmetically, not one by one.
    const uint64_t first = FirstOpportunityAtOrAfter(queue_.front().arrival_ns);
    if (first > next_opportunity_) {
      stats_.opportunities_unused += first - next_opportunity_;
      next_opportunity_ = first;
    }
    const int64_t t = OpportunityNs(next_opportunity_);
    if (t > now_ns) return;
    // One opportunity carries whole packets that arrived by its time while their bytes fit in 1500; a larger
    // packet takes one alone.
    uint64_t budget = kOpportunityBytes;
    bool used = false;
    while (!queue_.empty() && queue_.front().arrival_ns <= t) {
      const uint64_t size = queue_.front().bytes.size();
      if (used && size > budget) break;
      budget -= std::min(budget, size);
      used = true;
      Packet p = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= size;
      Depart(std::move(p), t);
    }
    ++next_opportunity_;
  }
}

void PacketLink::Depart(Packet p, int64_t t_ns) {
  // Both draws happen for every packet, so that one model's setting does not shift the other's sequence.
  const bool random_loss = Uniform() < d_.loss;
  bool burst_loss = false;
  if (d_.burst_loss.Enabled()) {
    const double step = Uniform();
    burst_bad_ = burst_bad_ ? step >= d_.burst_loss.p_bad_to_good : step < d_.burst_loss.p_good_to_bad;
    burst_loss = Uniform() < (burst_bad_ ? d_.burst_loss.loss_bad : d_.burst_loss.loss_good);
  }
  if (random_loss || burst_loss) {
    ++stats_.lost;
    if (!random_loss) ++stats_.lost_burst;
    return;
  }
  double delay_ns = d_.delay_ms * 1e6;
  if (d_.jitter_ms > 0) delay_ns += (2 * Uniform() - 1) * d_.jitter_ms * 1e6;
  int64_t leave = t_ns + static_cast<int64_t>(std::llround(std::max(0.0, delay_ns)));
  if (!d_.reorder) leave = std::max(leave, last_departure_ns_);
  last_departure_ns_ = std::max(last_departure_ns_, leave);
  p.arrival_ns = leave;
  in_flight_.push_back(InFlight{leave, sequence_++, std::move(p)});
  std::push_heap(in_flight_.begin(), in_flight_.end(), Later);
}

void PacketLink::Deliver(int64_t now_ns, std::vector<Packet>* out) {
  RunBottleneck(now_ns);
  while (!in_flight_.empty() && in_flight_.front().leave_ns <= now_ns) {
    std::pop_heap(in_flight_.begin(), in_flight_.end(), Later);
    Packet p = std::move(in_flight_.back().packet);
    in_flight_.pop_back();
    ++stats_.delivered;
    stats_.delivered_bytes += p.bytes.size();
    const int64_t late = now_ns - p.arrival_ns;  // arrival_ns holds the time to leave once in flight
    stats_.max_late_ns = std::max(stats_.max_late_ns, late);
    if (late > 1'000'000) ++stats_.late_over_1ms;
    out->push_back(std::move(p));
  }
}

int64_t PacketLink::NextEventNs() const {
  int64_t next = std::numeric_limits<int64_t>::max();
  if (!in_flight_.empty()) next = in_flight_.front().leave_ns;
  if (!queue_.empty()) next = std::min(next, HeadDepartureNs());
  return next;
}

}  // namespace fl::emulation
