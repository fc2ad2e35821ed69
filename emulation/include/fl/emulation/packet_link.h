// One direction of a packet-level emulated link, in virtual time: the scheduler of the packet backend
// (docs/testbed.md, "Packet-level links"). It holds no clock and no socket: the caller offers IP packets
// with the time they arrived and asks which ones leave by a time, so that the same code runs under the TUN
// devices' event loop and in unit tests on a virtual clock.
//
// A packet's way through one direction, as Mahimahi's mm-link + mm-delay + mm-loss chain it:
//   1. the bottleneck queue: drop-tail, bounded in bytes (LinkDirection::EffectiveQueueLimit) and, when
//      queue_limit_packets > 0, in packets; a packet that does not fit is dropped on arrival;
//   2. the bottleneck: a fixed rate (a packet of B bytes takes B*8/rate to serialise, back to back) or a
//      Mahimahi trace (each line a 1500-byte delivery opportunity at that ms, the trace repeating with its
//      period; an opportunity carries whole packets while their bytes fit in 1500, and is lost if the queue
//      is empty at its time);
//   3. loss, drawn as the packet leaves the bottleneck (it used its transmission opportunity, as a frame
//      lost on the air does): Bernoulli(loss), then the Gilbert-Elliott chain (stepped once per packet);
//   4. one-way delay delay_ms + uniform(-jitter_ms, +jitter_ms), clamped at 0; unless `reorder`, a packet
//      never leaves before the one ahead of it (its time is raised to its predecessor's).
// An unlimited direction (no rate, no trace) skips 1-2. Every draw comes from one RNG seeded by `seed`: the
// same offers at the same times give the same deliveries.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "fl/emulation/link_profile.h"

namespace fl::emulation {

struct Packet {
  std::vector<uint8_t> bytes;  // one IP packet
  int64_t arrival_ns = 0;      // when it was offered
};

struct PacketLinkStats {
  uint64_t offered = 0;
  uint64_t offered_bytes = 0;
  uint64_t dropped_queue = 0;  // drop-tail: did not fit the queue
  uint64_t lost = 0;           // lost by the loss models (Bernoulli or Gilbert-Elliott)
  uint64_t lost_burst = 0;     // of `lost`, lost by the Gilbert-Elliott chain
  uint64_t delivered = 0;
  uint64_t delivered_bytes = 0;
  // Trace opportunities that found the queue empty, counted in one step when the next packet reaches the queue
  // (the ones after the last packet are not counted until another arrives).
  uint64_t opportunities_unused = 0;
  uint64_t max_queue_bytes = 0;  // high-water mark of the bottleneck queue
  // The emulator's own fidelity: how late packets left against their time (Deliver called after it, e.g. the event
  // loop's wake-up or the CPU it had). 0 on a virtual clock that calls Deliver at NextEventNs.
  int64_t max_late_ns = 0;
  uint64_t late_over_1ms = 0;  // packets that left more than 1 ms after their time
};

enum class OfferResult { kQueued, kDroppedQueue };

class PacketLink {
 public:
  // Validates the direction for the packet backend (ranges of delay, jitter, loss, burst_loss, queue; the
  // error names the field, the value and what is allowed; `field` prefixes the names, e.g. "uplink") and
  // starts the link's clock at start_ns (a trace's first period begins there).
  static absl::StatusOr<PacketLink> Create(const LinkDirection& direction, uint64_t seed, int64_t start_ns,
                                           std::string_view field = "");

  // A packet arrives at the link at now_ns (non-decreasing across calls, as are Deliver's).
  OfferResult Offer(int64_t now_ns, std::vector<uint8_t> packet);
  // Appends to `out`, in order, every packet whose time to leave the link is <= now_ns; advances the
  // bottleneck to now_ns (lost packets are counted, not returned).
  void Deliver(int64_t now_ns, std::vector<Packet>* out);
  // The earliest time at which Deliver would return a packet or the bottleneck would move one on; INT64_MAX
  // when the link holds nothing.
  int64_t NextEventNs() const;

  const PacketLinkStats& stats() const { return stats_; }
  uint64_t queued_bytes() const { return queued_bytes_; }
  size_t queued_packets() const { return queue_.size(); }

 private:
  struct InFlight {
    int64_t leave_ns;
    uint64_t sequence;  // ties leave in arrival order
    Packet packet;
  };
  // The heap's order: the earliest time to leave on top.
  static bool Later(const InFlight& a, const InFlight& b) {
    return a.leave_ns != b.leave_ns ? a.leave_ns > b.leave_ns : a.sequence > b.sequence;
  }

  PacketLink() = default;
  bool Bottlenecked() const;
  // Moves packets from the queue through the bottleneck up to now_ns.
  void RunBottleneck(int64_t now_ns);
  // When the queue's head leaves the bottleneck (the queue is not empty).
  int64_t HeadDepartureNs() const;
  // Loss and delay for a packet that left the bottleneck at t_ns.
  void Depart(Packet p, int64_t t_ns);
  double Uniform();
  // Trace opportunities are numbered 0, 1, ... from start_ns across the repeats.
  int64_t OpportunityNs(uint64_t index) const;
  uint64_t FirstOpportunityAtOrAfter(int64_t t_ns) const;

  LinkDirection d_;
  int64_t start_ns_ = 0;
  uint64_t queue_limit_bytes_ = 0;
  double ns_per_byte_ = 0;  // fixed rate: serialisation time of one byte
  std::mt19937_64 rng_;
  bool burst_bad_ = false;
  std::deque<Packet> queue_;  // waiting for the bottleneck (the head is being serialised)
  uint64_t queued_bytes_ = 0;
  int64_t busy_until_ns_ = 0;  // fixed rate: the bottleneck is serialising until then
  // Fixed rate: the current busy period (packets back to back) began at busy_start_ns_ and has serialised
  // busy_bytes_ so far; times are rounded from the period's total, so that rounding never accumulates per packet.
  int64_t busy_start_ns_ = 0;
  uint64_t busy_bytes_ = 0;
  uint64_t next_opportunity_ = 0;    // trace: the first opportunity not yet used or skipped
  std::vector<InFlight> in_flight_;  // left the bottleneck, delayed: a heap by time to leave
  uint64_t sequence_ = 0;
  int64_t last_departure_ns_ = std::numeric_limits<int64_t>::min();
  PacketLinkStats stats_;
};

}  // namespace fl::emulation
