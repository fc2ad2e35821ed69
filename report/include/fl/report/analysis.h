// The figures of an fl-report: per-round summaries, the straggler of each round, the per-link-kind summary
// and the straggler ranking, computed from an ExperimentData. Definitions (also in docs/report.md):
//
// - Accepted client round: a client_rounds row with outcome 'ok'. Means, maxima and link figures use the
//   accepted rows of committed rounds only (late/rejected/dropped updates did not shape the model).
// - Uplink time: the client's view (first byte sent -> server ack) when reported, else the server's view.
// - Placement on the server's timeline: with schema v3 a phase starts at its recorded *_start_unix_ms; a
//   phase without one (older databases) starts where the previous one ended, the first at dispatched_unix_ms,
//   in the order downlink, train, eval, idle, uplink (idle, the client's decode/encode/queueing time, is drawn
//   only in that fallback, where it is otherwise invisible). An uplink the client never reported (the update
//   that closed the last round) is placed by the server's view (uplink_server_start_unix_ms).
// - Arrival of an update: when the server received its last byte (uplink_server_start + uplink_server_ms,
//   v3), else the end of the placed uplink.
// - Straggler of a round: the accepted client whose update arrived last; it set the round's time. Ties go to
//   the row the server wrote last.
// - Dominant phase of the straggler: among downlink, train, eval and uplink, the phase where it exceeds the
//   round's median (over accepted clients) by the most; if it exceeds no median (one client, or a straggler
//   by a hair), its longest phase.
// - Group: the clients of one link kind and device class (clients.link_kind x clients.device_class). At fleet
//   scale a row per client is unreadable; the group table says which kind of client straggles, and by what.
// - Uplink share of a link kind: the sum of its accepted clients' uplink times over the sum of the durations
//   of the rounds they took part in (= mean uplink / mean round time over those client rounds).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fl/report/experiment_data.h"

namespace fl::report {

enum class Phase { kDownlink = 0, kTrain = 1, kEval = 2, kIdle = 3, kUplink = 4 };
inline constexpr std::array<Phase, 5> kAllPhases = {Phase::kDownlink, Phase::kTrain, Phase::kEval, Phase::kIdle,
                                                    Phase::kUplink};
// The phases a straggler is blamed on (idle is the client's own overhead between them).
inline constexpr std::array<Phase, 4> kStragglerPhases = {Phase::kDownlink, Phase::kTrain, Phase::kEval,
                                                          Phase::kUplink};
std::string_view PhaseName(Phase phase);  // "downlink", "train", "eval", "idle", "uplink"

// The duration of `phase` in a client row (uplink: ClientRoundRow::uplink()).
std::optional<double> PhaseMs(const ClientRoundRow& row, Phase phase);

struct Span {
  double start_unix_ms = 0;
  double end_unix_ms = 0;
};

// One client round's phases on the server's timeline.
struct PlacedPhases {
  std::array<std::optional<Span>, 5> spans;  // indexed by Phase
  std::optional<double> arrival_unix_ms;     // the update's last byte at the server (see above)
  bool from_recorded_starts = false;         // at least one phase came from a v3 start column
};
PlacedPhases PlaceOnServerTimeline(const ClientRoundRow& row);

struct Stat {
  int64_t n = 0;
  double mean = 0;
  double max = 0;
};

struct Straggler {
  std::string client_id;
  Phase dominant_phase = Phase::kTrain;
  double excess_ms = 0;  // how far the dominant phase exceeds the round's median for it (0 when none does)
  std::optional<double> arrival_unix_ms;
};

struct RoundSummary {
  const RoundAttempt* attempt = nullptr;
  Stat downlink_ms;  // over accepted clients with the figure
  Stat train_ms;
  Stat uplink_ms;
  std::optional<Straggler> straggler;  // none when no update was accepted
};

struct LinkSummary {
  std::string link_kind;
  int64_t num_clients = 0;
  int64_t num_client_rounds = 0;                       // accepted client rounds of committed rounds
  std::array<std::optional<double>, 5> mean_phase_ms;  // indexed by Phase; nullopt when never measured
  std::optional<double> mean_round_ms;                 // mean duration of the rounds behind those client rounds
  std::optional<double> uplink_share;                  // in [0, 1]
  std::optional<double> mean_downlink_bytes;
  std::optional<double> mean_uplink_bytes;
  // Federated evaluation (the `evaluations` table: the global model evaluated by the clients after a commit),
  // mean time per evaluation of this link kind's clients. Separate from eval_ms in client_rounds, which is a
  // local evaluation inside the training task.
  std::optional<double> mean_federated_eval_ms;
  std::optional<double> uplink_vs_ethernet;  // mean uplink / ethernet's mean uplink, when ethernet is present
  std::optional<double> uplink_vs_wifi;
  std::optional<double> downlink_vs_ethernet;
};

struct StragglerRank {
  std::string client_id;
  int64_t rounds_accepted = 0;  // committed rounds the client's update was accepted in
  int64_t times_straggler = 0;
  double share = 0;                   // times_straggler / committed rounds that have a straggler
  std::array<int64_t, 5> by_phase{};  // indexed by Phase (idle stays 0)
  std::optional<Phase> top_phase;     // the phase it straggled by most often (ties: pipeline order)
};

// One link kind x device class (accepted updates of committed rounds, and the rounds' stragglers).
struct GroupSummary {
  std::string link_kind;
  std::string device_class;  // "unknown" when the database has none
  int64_t num_clients = 0;   // with an accepted update in a committed round
  int64_t num_client_rounds = 0;
  std::array<Stat, 5> phase_ms;       // indexed by Phase, over the accepted client rounds
  int64_t times_straggler = 0;        // committed rounds whose straggler was one of the group's clients
  double straggler_share = 0;         // times_straggler / committed rounds that have a straggler
  std::array<int64_t, 5> by_phase{};  // the stragglers' dominant phases, indexed by Phase
  std::optional<Phase> top_phase;     // the most frequent of them (ties: pipeline order)
  std::string top_straggler;          // the group's client most often the straggler ("" when none was)
  int64_t top_straggler_times = 0;
};

struct Analysis {
  std::vector<RoundSummary> rounds;       // every attempt, by (round, attempt)
  std::vector<LinkSummary> links;         // ethernet, wifi, 5g, other, then the rest by name
  std::vector<GroupSummary> groups;       // by link kind as `links`, then device class
  std::vector<StragglerRank> stragglers;  // most often first, then by client label
  int64_t committed_rounds = 0;
  int64_t rounds_with_straggler = 0;
};

// `data` must outlive the result (RoundSummary points into it).
Analysis Analyze(const ExperimentData& data);

}  // namespace fl::report
