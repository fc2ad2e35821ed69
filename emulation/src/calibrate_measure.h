// Internal to fl::emulation's calibration: the TCP measurements through a link (calibrate.cc), which the packet
// backend's checks (calibrate_packet.cc) run inside its namespace around its own counters.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "fl/emulation/calibrate.h"
#include "fl/emulation/link_profile.h"

namespace fl::emulation {

// The idle round trip through `link_addr`: `options.pings` 64-byte ping-pongs; median, p10, p90 into `result`.
absl::Status MeasureRtt(const std::string& link_addr, const CalibrationOptions& options, CalibrationResult* result);

// Bulk transfers of `seconds` through `link_addr` to / from the measurement server. The uplink's `retransmits`
// (optional) gets the sender's TCP retransmission count.
absl::Status MeasureUplink(const std::string& link_addr, double nominal_bps, double seconds, DirectionMeasurement* d,
                           uint64_t* retransmits = nullptr);
absl::Status MeasureDownlink(const std::string& link_addr, double nominal_bps, double seconds, DirectionMeasurement* d);

// d->measured_bps from its bytes and seconds; an error when the transfer delivered nothing measurable.
absl::Status Goodput(DirectionMeasurement* d);

// The packet backend's three checks (capacity and RTT on a lossless copy, UDP loss, Reno against Mathis) against
// the measurement server on `port` of every host address (calibrate_packet.cc).
absl::Status CalibratePacket(const LinkProfile& profile, const CalibrationOptions& options, int port,
                             CalibrationResult* result);

}  // namespace fl::emulation
