// Calibration: what an emulated link actually delivers, measured through the backend that emulates it.
//
// A measurement server on 127.0.0.1 stands where fl-server would; a client (in the link's namespace for the
// kernel backend) reaches it through the link and measures
//   - the round trip: small (64-byte) ping-pong messages on an idle link, median over `pings`;
//   - the throughput each way: a bulk transfer for `bulk_seconds`, measured at the receiver from its first
//     to its last byte (TCP goodput; a link rate carries 1448/1500 of it as payload, see link_profile.h).
// On the packet backend (real end-to-end TCP across TUN devices, packet_network.h) the round trip and the
// throughput are measured on the profile without its loss (TCP under loss is the third check), and two checks
// against physics follow:
//   - loss: `loss_packets` small UDP datagrams each way, paced below the link's rate, counted at the receiver
//     (the link's own counters say how many of the missing ones the queue dropped rather than the loss model);
//   - TCP under random loss: an uplink transfer with Reno through the profile's delay and `mathis_loss`
//     Bernoulli loss, against Mathis et al.'s bound MSS/RTT * 1.22/sqrt(p), where that model holds (the bound
//     well below the link's rate, an RTT of a few ms at least; otherwise the link or timers set the pace).
#pragma once

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/emulation/link_profile.h"

namespace fl::emulation {

enum class Backend { kUserspace, kKernel, kPacket };
absl::StatusOr<Backend> ParseBackend(std::string_view name);  // "userspace" | "kernel" | "packet"
// "both" (userspace and kernel, as before the packet backend), "all", or one backend's name.
absl::StatusOr<std::vector<Backend>> ParseBackends(std::string_view name);
std::string BackendName(Backend b);

struct CalibrationOptions {
  Backend backend = Backend::kUserspace;
  double bulk_seconds = 2.5;  // per direction
  int pings = 100;
  int ping_gap_ms = 2;
  uint64_t seed = 1;
  // Packet backend only.
  int64_t loss_packets = 100'000;  // UDP datagrams per direction for the loss check; 0 = skip it
  double mathis_loss = 0.01;       // random loss for the TCP-under-loss check; 0 = skip it
  double mathis_seconds = 15;      // its transfer
};

struct LossMeasurement {
  double configured = 0;  // the stationary loss of the profile's loss models
  uint64_t sent = 0;      // datagrams
  uint64_t received = 0;
  uint64_t queue_drops = 0;  // the link's drop-tail counter over the same datagrams
  uint64_t link_lost = 0;    // the link's loss-model counter
  double pace_pps = 0;
  // Lost on the way, not counting what the queue dropped (those the pacing did not prevent).
  double Measured() const;
  // Within 20% (relative) of the configured loss; with no configured loss, nothing lost.
  bool WithinTarget() const;
};

struct MathisMeasurement {
  double loss = 0;           // the random loss applied to the uplink
  double rtt_ms = 0;         // the measured idle round trip the bound uses
  double link_bps = 0;       // the uplink's nominal rate (0 = unlimited)
  double bound_bps = 0;      // MSS*8/RTT * 1.22/sqrt(p), MSS = 1448
  double measured_bps = 0;   // the receiver's goodput
  uint64_t retransmits = 0;  // the sender's TCP retransmissions (TCP_INFO)
  std::string congestion_control;
  // Where Mathis's model describes the transfer: the bound at most half the link's rate, RTT >= 5 ms.
  bool ModelHolds() const;
  double Error() const { return bound_bps > 0 ? measured_bps / bound_bps - 1.0 : 0.0; }
  bool WithinTarget() const { return ModelHolds() && std::abs(Error()) <= 0.30; }
};

struct DirectionMeasurement {
  double nominal_bps = 0;   // 0 = unlimited
  double measured_bps = 0;  // receiver goodput
  uint64_t bytes = 0;       // received in the measured window
  double seconds = 0;       // the window
  // Packet backend with a trace: the capacity the trace offered while the transfer ran (the link's delivery
  // opportunities, used and unused, times 1,500 bytes over the time between the link's counters before and
  // after it). A transfer of a few seconds sees a few seconds of a trace whose rate moves over seconds, so its
  // goodput is compared with this, not the trace's long-run mean. 0 = not measured (fixed rate: the rate).
  double window_capacity_bps = 0;
  double Reference() const { return window_capacity_bps > 0 ? window_capacity_bps : nominal_bps; }
  // measured / reference - 1 (0 when unlimited).
  double RateError() const { return Reference() > 0 ? measured_bps / Reference() - 1.0 : 0.0; }
};

struct CalibrationResult {
  std::string profile;
  std::string source;
  Backend backend = Backend::kUserspace;
  bool netem = false;  // kernel backend: delay from netem (else from the userspace delay line)
  DirectionMeasurement uplink;
  DirectionMeasurement downlink;
  double nominal_rtt_ms = 0;
  double rtt_median_ms = 0;
  double rtt_p10_ms = 0;
  double rtt_p90_ms = 0;
  int pings = 0;
  // Packet backend only.
  bool has_loss = false;
  LossMeasurement loss_up;
  LossMeasurement loss_down;
  bool has_mathis = false;
  MathisMeasurement mathis;

  // The targets: within 10% of each shaped rate, within 2 ms of the round-trip delay.
  bool RateWithinTarget() const;
  bool RttWithinTarget() const;
};

absl::StatusOr<CalibrationResult> Calibrate(const LinkProfile& profile, const CalibrationOptions& options);

// A Markdown table (header + one row per result), as in docs/testbed.md.
std::string CalibrationTable(const std::vector<CalibrationResult>& results);
// The packet backend's loss and TCP-under-loss checks as a second table (results without them are left out;
// empty when none has them).
std::string PhysicsTable(const std::vector<CalibrationResult>& results);
// Writes the results beside the profile: <dir>/<stem>.calibration.yaml, keeping entries of other backends
// already in the file. Returns the path written.
absl::StatusOr<std::filesystem::path> WriteCalibrationYaml(const std::filesystem::path& profile_path,
                                                           const std::vector<CalibrationResult>& results);

}  // namespace fl::emulation
