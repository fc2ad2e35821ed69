// Link profiles: what an emulated network link does to each direction of a client's traffic, as data.
//
// A profile file (experiments/profiles/links/<name>.yaml) looks like
//
//   name: wifi
//   description: 802.11ac, one room from the access point
//   uplink:            # client -> server
//     rate: 100mbit    # bits/s; units bit, kbit, mbit, gbit (SI, as tc writes them); absent = unlimited
//     delay_ms: 3      # one-way delay
//     jitter_ms: 2     # each chunk's delay is delay +- jitter (uniform), never reordering bytes
//     loss: 0.001      # random loss, fraction of packets; applied by netem or the packet backend
//     burst_loss: {p_good_to_bad: 0.001, p_bad_to_good: 0.3, loss_good: 0, loss_bad: 0.5}  # packet backend
//     queue_limit: 256kib   # bytes waiting for the bottleneck; units b, kb, kib, mb, mib
//     queue_limit_packets: 100  # drop-tail by packets as well (packet backend)
//     reorder: false   # whether jitter may reorder packets (packet backend)
//     trace: traces/x.trace # Mahimahi delivery trace (replaces rate), relative to the profile's folder
//     rate_process: {interval_ms: 1000, duration_s: 120, lag1_autocorrelation: 0.6,
//                    quantiles_mbit: [...], source: "...", seed: 1}   # a fitted process (rate_process.h)
//   downlink: { ... }  # server -> client
//
// `rate`, `trace` and `rate_process` are mutually exclusive. A rate process is turned into a generated trace
// when the profile is read (has_trace, trace.path naming the process and its seed), so a backend only ever
// sees a fixed rate or a trace.
//
// Validation is strict: an unknown key, a wrong type or an out-of-range value is an error that names the
// file, the field path, the line and what is allowed. The manifest loader embeds inline profiles through
// ParseLinkProfile with its own file name and field path.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/statusor.h"

namespace fl::emulation {

// Every 1500-byte IP packet of a TCP stream carries 1448 bytes of payload (20 IP + 20 TCP + 12 timestamp
// option bytes of headers). Rates are link rates, as for tc and Mahimahi; the userspace shaper charges
// this overhead so that both backends deliver the same goodput for the same profile.
inline constexpr double kMtuBytes = 1500.0;
inline constexpr double kMssBytes = 1448.0;

// A Mahimahi trace: one line per 1500-byte delivery opportunity, in ms since the start; the trace repeats
// with a period of its last timestamp.
struct MahimahiTrace {
  std::string path;
  std::vector<uint64_t> opportunities_ms;  // non-decreasing
  uint64_t period_ms = 0;                  // the last timestamp (> 0)

  // The average link rate the trace offers, in bits/s.
  double MeanRateBps() const;
  bool operator==(const MahimahiTrace&) const = default;
};

// Bursty loss: a two-state Gilbert-Elliott chain, stepped once per packet (good -> bad with p_good_to_bad,
// bad -> good with p_bad_to_good), each state losing packets at its own rate. Only the packet backend
// applies it (docs/testbed.md).
struct BurstLoss {
  double p_good_to_bad = 0;  // 0 = no bursty loss
  double p_bad_to_good = 1;
  double loss_good = 0;
  double loss_bad = 1;

  bool Enabled() const { return p_good_to_bad > 0; }
  // The long-run fraction of packets lost: pi_bad * loss_bad + pi_good * loss_good.
  double StationaryLoss() const {
    if (!Enabled()) return loss_good;
    const double pi_bad = p_good_to_bad / (p_good_to_bad + p_bad_to_good);
    return pi_bad * loss_bad + (1 - pi_bad) * loss_good;
  }
  // Mean number of consecutive packets spent in the bad state (1 / p_bad_to_good).
  double MeanBadRunPackets() const { return p_bad_to_good > 0 ? 1.0 / p_bad_to_good : 0.0; }
  bool operator==(const BurstLoss&) const = default;
};

// A fitted rate process (rate_process.h fits and generates it): per-interval rates whose marginal distribution
// is the piecewise-linear quantile function through `quantiles_mbit` (at the evenly spaced probabilities
// 0, 1/(n-1), ..., 1) and whose lag-1 autocorrelation is `lag1_autocorrelation` (a Gaussian AR(1) mapped
// through that quantile function). A profile stores the figures, never the measured trace.
struct RateProcess {
  uint64_t interval_ms = 1000;         // each rate holds for one interval
  uint64_t duration_s = 120;           // the generated trace's loop period
  double lag1_autocorrelation = 0;     // of the per-interval rates, in (-1, 1)
  std::vector<double> quantiles_mbit;  // >= 2 values, non-decreasing, >= 0, the last > 0
  std::string source;                  // what it was fitted from (free text)
  uint64_t seed = 1;                   // the generator's seed: the same seed gives the same trace
  bool operator==(const RateProcess&) const = default;
};

// One direction of a link.
struct LinkDirection {
  double rate_bps = 0;               // link rate; 0 = unlimited (no shaping)
  double delay_ms = 0;               // one-way propagation delay
  double jitter_ms = 0;              // uniform +- around delay_ms, clamped at 0
  double loss = 0;                   // random (Bernoulli) packet loss in [0, 1); netem or the packet backend
  BurstLoss burst_loss;              // bursty loss on top of `loss`; the packet backend only
  uint64_t queue_limit_bytes = 0;    // 0 = default (see EffectiveQueueLimit)
  uint64_t queue_limit_packets = 0;  // drop-tail by packets as well (0 = bytes only); the packet backend only
  bool reorder = false;              // jitter may reorder packets (packet backend; default: never)
  bool has_trace = false;
  MahimahiTrace trace;  // when has_trace, replaces rate_bps
  // When the trace was generated from a rate process (written back as the process, not the trace).
  bool has_rate_process = false;
  RateProcess rate_process;

  // The rate the direction offers on average (the trace's mean when there is one); 0 = unlimited.
  double NominalRateBps() const;
  bool Unlimited() const { return !has_trace && rate_bps <= 0; }
  bool HasDelay() const { return delay_ms > 0 || jitter_ms > 0; }
  // Bytes that may wait for the bottleneck: the configured limit, else 100 ms at the nominal rate
  // (at least 64 KiB), else 4 MiB when unlimited.
  uint64_t EffectiveQueueLimit() const;
  bool operator==(const LinkDirection&) const = default;
};

struct LinkProfile {
  std::string name;
  std::string description;
  std::string source;      // file it came from (or the manifest's context)
  LinkDirection uplink;    // client -> server
  LinkDirection downlink;  // server -> client

  // Nominal round-trip delay: uplink + downlink one-way delays.
  double NominalRttMs() const { return uplink.delay_ms + downlink.delay_ms; }
  bool operator==(const LinkProfile&) const = default;
};

// Where a YAML node came from, for error messages and relative trace paths.
struct YamlContext {
  std::string file;                // shown in errors ("experiments/x.yaml")
  std::string field_path;          // prefix of the node's field path, e.g. "clients[2].link"; may be empty
  std::filesystem::path base_dir;  // relative trace paths resolve against this
};

// "100mbit", "2.5gbit", "800kbit", "1000bit", "1000" (bits/s) -> bits/s. Rejects negatives, zero,
// unknown units (with the list of allowed ones), and "mbps"-style units, which tc reads as bytes/s.
absl::StatusOr<double> ParseRate(std::string_view text);
// "262144", "256kib", "1mib", "64kb", "1500b" -> bytes.
absl::StatusOr<uint64_t> ParseByteSize(std::string_view text);
// Formats bits/s as tc would write it ("100mbit", "2.5gbit", "800kbit").
std::string FormatRate(double bps);

// The largest trace file read, and (kMaxTraceBytes / 2, lines of "0\n") the most delivery opportunities a
// generated trace may hold. Mahimahi's published cellular traces are 0.1-2 MB; 32 MiB holds a 1 Gbit/s link
// (83,000 lines a second) for about 50 s, and the trace repeats. Each line becomes 8 bytes in memory, so a
// trace costs at most 4 times its size (lines of "0\n").
inline constexpr uint64_t kMaxTraceBytes = uint64_t{32} << 20;

// Reads a trace: a regular file (fl::sys::OpenUserFile: a FIFO, /dev/zero or a directory is refused before
// anything is read) of at most kMaxTraceBytes. Errors name the trace file (and line); callers reading it for a
// profile or manifest add which file and field named it.
absl::StatusOr<MahimahiTrace> LoadMahimahiTrace(const std::filesystem::path& path);

// Parses a profile node (a map with name/description/uplink/downlink).
absl::StatusOr<LinkProfile> ParseLinkProfile(const YAML::Node& node, const YamlContext& context);
// Reads and parses a profile file; `name` defaults to the file's stem.
absl::StatusOr<LinkProfile> LoadLinkProfile(const std::filesystem::path& path);

// The profile as YAML (trace paths absolute), e.g. to store the resolved profile with an experiment.
std::string LinkProfileToYaml(const LinkProfile& profile);

}  // namespace fl::emulation
