// Calibration: what an emulated link actually delivers, measured through the backend that emulates it.
//
// A measurement server on 127.0.0.1 stands where fl-server would; a client (in the link's namespace for the
// kernel backend) reaches it through the link and measures
//   - the round trip: small (64-byte) ping-pong messages on an idle link, median over `pings`;
//   - the throughput each way: a bulk transfer for `bulk_seconds`, measured at the receiver from its first
//     to its last byte (TCP goodput; a link rate carries 1448/1500 of it as payload, see link_profile.h).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/emulation/link_profile.h"

namespace fl::emulation {

enum class Backend { kUserspace, kKernel };
absl::StatusOr<Backend> ParseBackend(std::string_view name);  // "userspace" | "kernel"
std::string BackendName(Backend b);

struct CalibrationOptions {
  Backend backend = Backend::kUserspace;
  double bulk_seconds = 2.5;  // per direction
  int pings = 100;
  int ping_gap_ms = 2;
  uint64_t seed = 1;
};

struct DirectionMeasurement {
  double nominal_bps = 0;   // 0 = unlimited
  double measured_bps = 0;  // receiver goodput
  uint64_t bytes = 0;       // received in the measured window
  double seconds = 0;       // the window
  // measured / nominal - 1 (0 when unlimited).
  double RateError() const { return nominal_bps > 0 ? measured_bps / nominal_bps - 1.0 : 0.0; }
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

  // The targets: within 10% of each shaped rate, within 2 ms of the round-trip delay.
  bool RateWithinTarget() const;
  bool RttWithinTarget() const;
};

absl::StatusOr<CalibrationResult> Calibrate(const LinkProfile& profile, const CalibrationOptions& options);

// A Markdown table (header + one row per result), as in docs/testbed.md.
std::string CalibrationTable(const std::vector<CalibrationResult>& results);
// Writes the results beside the profile: <dir>/<stem>.calibration.yaml, keeping entries of other backends
// already in the file. Returns the path written.
absl::StatusOr<std::filesystem::path> WriteCalibrationYaml(const std::filesystem::path& profile_path,
                                                           const std::vector<CalibrationResult>& results);

}  // namespace fl::emulation
