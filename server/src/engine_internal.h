// The round engine's private state and helpers, shared by its source files (round_engine.cc: lifecycle, the
// transition table, timers; engine_clients.cc: admission, sessions, clock sync; engine_uploads.cc: downloads,
// upload slots, validation of updates; engine_rounds.cc: rounds, evaluations, commits, checkpoints).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "fl/core/aggregator.h"
#include "fl/core/clock_sync.h"
#include "fl/core/str_cat.h"
#include "fl/core/task.h"
#include "fl/instrumentation/records.h"
#include "fl/proto/convert.h"
#include "fl/server/client_input.h"
#include "fl/server/events.h"
#include "engine_core.h"
#include "fl/server/staleness.h"

namespace fl::server {

using fl::v1::ErrorCode;

struct RoundEngine::Core::TaskInfo {
  std::string id;
  std::string client_id;
  fl::v1::TaskKind kind = fl::v1::TASK_KIND_UNSPECIFIED;
  uint64_t round = 0;
  uint32_t attempt = 1;
  int64_t dispatched_ns = 0;
  int64_t dispatched_unix_ms = 0;
  int64_t deadline_ns = 0;
  bool upload_started = false;           // its update's header arrived (the update may still be in transit)
  bool upload_in_flight = false;         // an upload for it was admitted (or waits for a slot) and has not ended
  bool answered = false;                 // an upload for it got its verdict: any further one is a duplicate
  int64_t downlink_server_start_ns = 0;  // the server's view of the task's model download (0: none seen)
  int64_t downlink_server_ns = 0;
  uint64_t downlink_server_bytes = 0;  // the model bytes the server sent for it (0: no download finished)
  bool closed = false;
  std::optional<instrumentation::ClientOutcome> outcome;  // once closed
  std::string uplink_codec;    // the codec its train task named (link-aware compression; empty: --uplink-codec)
  uint64_t model_version = 0;  // the global model version the task was given (its update's base_model_version)
  // Why it closed, so that an upload that comes after is told the real reason (ClosedTaskVerdict), not a deadline
  // that did not pass: "cancelled: round 3 committed with ...", "the client rejoined (it restarted)", ...
  std::string closed_why;
  bool closed_at_deadline = false;  // closed by its round's (or, buffered, its own) deadline
  std::string revoked_why;          // an upload of it lost its slot (RevokeSlowUploads): what the client was told
  bool secure = false;              // its round runs secure aggregation: its update is a masked one (engine_secagg.h)
};

struct RoundEngine::Core::RoundState {
  uint64_t round = 0;
  uint32_t attempt = 1;
  bool evaluation = false;
  int64_t started_ns = 0;
  int64_t started_unix_ms = 0;
  int64_t deadline_ns = 0;
  std::vector<std::string> task_ids;
  size_t first_open = 0;  // task_ids before this are closed (tasks never reopen): Advance() looks on from here
  std::unique_ptr<core::Aggregator> aggregator;
  double train_loss_sum = 0;
  double train_loss_weight = 0;
  uint32_t accepted = 0, late = 0, rejected = 0, dropped = 0;
  double eval_loss_sum = 0, eval_accuracy_sum = 0, eval_mae_sum = 0;
  uint64_t eval_examples = 0;
  uint32_t eval_clients = 0;
  std::vector<instrumentation::ClientRoundRecord> client_rows;  // written after the round's row
  // client id -> its rows in client_rows, for the rows up to indexed_rows (extended as it is looked up): an
  // uplink report finds its row without a walk over a round of 10,000 rows.
  std::unordered_map<std::string, std::vector<size_t>> rows_of_client;
  size_t indexed_rows = 0;
  std::vector<instrumentation::EvaluationRecord> evaluation_rows;  // written with the evaluation's figures
  std::optional<engine::RoundPrivacy> privacy;  // central differential privacy: what the committed round spent
  // Secure aggregation: the clients whose masked updates are in the unmasked sum, and those dropped on the way.
  std::optional<int64_t> secagg_survivors, secagg_dropped;
};

// Buffered aggregation (engine_buffered.cc): the open aggregation step, the train tasks out and the older model
// versions they were given. A client whose update (or refusal, or drop) has a row in the open step waits: it gets
// no train task before the step is applied, so it has one row per step (it may evaluate meanwhile).
struct RoundEngine::Core::BufferState {
  StalenessWeight weight;     // s(tau), parsed from config staleness_weight
  RoundState step;            // the open step: its aggregator is the buffer; task_ids are the tasks with a row in it
  bool step_open = false;     // step.started_* and step.aggregator are set
  std::set<std::string> out;  // train tasks dispatched and not closed yet
  std::map<std::string, uint64_t> base_version;                     // train task id -> the model version it was given
  std::map<std::string, std::pair<uint64_t, uint32_t>> applied_in;  // task id -> (step, attempt) of its row
  std::map<uint64_t, std::shared_ptr<const ModelPayload>> old_payloads;  // versions tasks out still download
  std::set<std::string> waiting;                                         // clients with a row in the open step
  bool started = false;         // --min-available-clients were connected once (later, whoever is connected trains)
  bool evaluation_due = false;  // the last applied step is evaluated once enough clients are idle
  uint64_t dispatches = 0;      // seeds the choice among idle clients
};

// Over-commitment and late folding (engine_overcommit.cc): the open round's commit target, the tasks of committed
// rounds whose late update may still be folded, and the late updates kept for the next commit.
struct RoundEngine::Core::Stragglers {
  struct Target {
    uint64_t round = 0;
    uint32_t attempt = 0;
    uint32_t k = 0;  // commit with the first k accepted updates; 0 = no over-commitment
  };
  Target target;
  struct Foldable {
    uint64_t base_model_version = 0;  // the model the task was given
  };
  std::map<std::string, Foldable> foldable;  // task id -> what its late update needs
  struct PendingFold {
    std::string task_id;
    std::vector<float> values;  // the decoded pseudo-gradient
    double examples = 0;        // n_k
    uint64_t fingerprint = 0;
    uint64_t base_model_version = 0;
    instrumentation::ClientRoundRecord row;  // the client's figures; outcome and v9 columns set at the fold
  };
  std::vector<PendingFold> pending;
};

namespace engine_internal {

inline constexpr int64_t kMsToNs = 1'000'000;

using engine::kVerifiedUpload;  // engine_model.h

inline std::string RandomHex(size_t bytes) {
  std::random_device rd;
  std::string out;
  static constexpr char kHex[] = "0123456789abcdef";
  // Four bytes of each draw (a draw is a system call: a join storm makes thousands of tokens).
  uint32_t bits = 0;
  for (size_t i = 0; i < bytes; ++i) {
    if (i % 4 == 0) bits = static_cast<uint32_t>(rd());
    const unsigned v = bits & 0xff;
    bits >>= 8;
    out.push_back(kHex[v >> 4]);
    out.push_back(kHex[v & 15]);
  }
  return out;
}

// Admissions logged one line each at info level before the log goes to one line per thousand.
inline constexpr uint64_t kJoinsLoggedAtInfo = 100;

inline bool ValidClientName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
  });
}

inline fl::v1::UploadUpdateResponse Verdict(const std::string& task_id, fl::v1::UpdateOutcome outcome,
                                            fl::v1::ErrorDetail error = {}) {
  fl::v1::UploadUpdateResponse r;
  r.set_task_id(task_id);
  r.set_outcome(outcome);
  if (error.code() != fl::v1::ERROR_CODE_UNSPECIFIED) *r.mutable_error() = std::move(error);
  return r;
}

inline fl::v1::UploadUpdateResponse Rejected(const std::string& task_id, ErrorCode code, std::string message,
                                             std::string hint = "") {
  return Verdict(task_id, fl::v1::UPDATE_OUTCOME_REJECTED,
                 proto::MakeError(code, std::move(message), "", std::move(hint)));
}

inline std::optional<double> PhaseMs(const google::protobuf::RepeatedPtrField<fl::v1::PhaseTiming>& timings,
                                     fl::v1::Phase phase) {
  std::optional<double> total;
  for (const auto& t : timings) {
    if (t.phase() == phase) total = total.value_or(0) + static_cast<double>(t.duration_ns()) / 1e6;
  }
  return total;
}

inline uint64_t PhaseBytes(const google::protobuf::RepeatedPtrField<fl::v1::PhaseTiming>& timings,
                           fl::v1::Phase phase) {
  uint64_t total = 0;
  for (const auto& t : timings) {
    if (t.phase() == phase) total += t.bytes();
  }
  return total;
}

inline const char* ReasonName(ErrorCode code) {
  switch (code) {
    case fl::v1::ERROR_CODE_MALFORMED: return "malformed";
    case fl::v1::ERROR_CODE_UNKNOWN_CLIENT: return "unknown_client";
    case fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH: return "fingerprint_mismatch";
    case fl::v1::ERROR_CODE_NON_FINITE: return "non_finite";
    case fl::v1::ERROR_CODE_LATE: return "late";
    case fl::v1::ERROR_CODE_WRONG_ROUND: return "wrong_round";
    case fl::v1::ERROR_CODE_CHECKSUM_MISMATCH: return "checksum_mismatch";
    case fl::v1::ERROR_CODE_TOO_LARGE: return "too_large";
    case fl::v1::ERROR_CODE_UNSUPPORTED_CODEC: return "unsupported_codec";
    default: return "other";
  }
}

// Why an evaluation result cannot count, for the experiment's task; "" when it can. Every task's loss is a
// mean cross-entropy or squared error (finite, >= 0); accuracies are fractions; regression must report its
// MAE (metrics["mae"], finite, >= 0).
inline std::string EvaluationProblem(core::Task task, const fl::v1::EvaluationResult& r) {
  if (r.num_examples() == 0) return "the result covers 0 examples";
  if (!std::isfinite(r.loss()) || r.loss() < 0) {
    return fl::StrCat("its loss ", r.loss(), " is not a finite value >= 0");
  }
  if (task == core::Task::kRegression) {
    auto mae = r.metrics().find("mae");
    if (mae == r.metrics().end()) return "a regression result must report its MAE (metrics[\"mae\"])";
    if (!std::isfinite(mae->second) || mae->second < 0) {
      return fl::StrCat("its MAE ", mae->second, " is not a finite value >= 0");
    }
  } else if (!std::isfinite(r.accuracy()) || r.accuracy() < 0 || r.accuracy() > 1) {
    return fl::StrCat("its accuracy ", r.accuracy(), " is not in [0, 1]");
  }
  return "";
}

// The longest a client can have spent on a task so far by the server's clock, plus slack: no phase it
// reports for the task can be longer.
inline int64_t PhaseBoundNs(int64_t dispatched_ns, int64_t now_ns) {
  return std::max<int64_t>(0, now_ns - dispatched_ns) + InputLimits::kTimingSlackNs;
}

}  // namespace engine_internal
}  // namespace fl::server
