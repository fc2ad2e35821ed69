#include "fl/instrumentation/records.h"

#include "fl/core/str_cat.h"

namespace fl::instrumentation {
namespace {

template <typename Enum, typename NameFn>
absl::StatusOr<Enum> ParseEnum(std::string_view name, std::initializer_list<Enum> values, NameFn name_of,
                               std::string_view what) {
  std::string expected;
  for (Enum v : values) {
    if (name_of(v) == name) return v;
    expected = expected.empty() ? std::string(name_of(v)) : fl::StrCat(expected, ", ", name_of(v));
  }
  return absl::InvalidArgumentError(fl::StrCat("unknown ", what, " '", name, "'; expected one of ", expected));
}

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace

std::string_view ExperimentStatusName(ExperimentStatus status) {
  switch (status) {
    case ExperimentStatus::kRunning: return "running";
    case ExperimentStatus::kFinished: return "finished";
    case ExperimentStatus::kFailed: return "failed";
    case ExperimentStatus::kAborted: return "aborted";
  }
  return "unknown";
}

std::string_view RoundStatusName(RoundStatus status) {
  switch (status) {
    case RoundStatus::kCommitted: return "committed";
    case RoundStatus::kFailed: return "failed";
    case RoundStatus::kAborted: return "aborted";
  }
  return "unknown";
}

std::string_view ClientOutcomeName(ClientOutcome outcome) {
  switch (outcome) {
    case ClientOutcome::kOk: return "ok";
    case ClientOutcome::kLate: return "late";
    case ClientOutcome::kDropped: return "dropped";
    case ClientOutcome::kRejected: return "rejected";
    case ClientOutcome::kCancelled: return "cancelled";
    case ClientOutcome::kFolded: return "folded";
  }
  return "unknown";
}

std::string_view ClientEventKindName(ClientEventKind kind) {
  switch (kind) {
    case ClientEventKind::kReportRefused: return "report_refused";
    case ClientEventKind::kUploadRevoked: return "upload_revoked";
    case ClientEventKind::kInitialModelReasked: return "initial_model_reasked";
    case ClientEventKind::kSessionClosed: return "session_closed";
  }
  return "unknown";
}

absl::StatusOr<ClientEventKind> ParseClientEventKind(std::string_view name) {
  return ParseEnum(name,
                   {ClientEventKind::kReportRefused, ClientEventKind::kUploadRevoked,
                    ClientEventKind::kInitialModelReasked, ClientEventKind::kSessionClosed},
                   ClientEventKindName, "client event kind");
}

std::string_view SecurityRefusalName(SecurityRefusal r) {
  switch (r) {
    case SecurityRefusal::kNameMismatch: return "name_mismatch";
    case SecurityRefusal::kWrongIdentity: return "wrong_identity";
    case SecurityRefusal::kRevokedCertificate: return "revoked_certificate";
    case SecurityRefusal::kBadToken: return "bad_token";
    case SecurityRefusal::kJoinRate: return "join_rate";
    case SecurityRefusal::kSessionLimit: return "session_limit";
    case SecurityRefusal::kUploadLimit: return "upload_limit";
    case SecurityRefusal::kStreamDeadline: return "stream_deadline";
    case SecurityRefusal::kSecAgg: return "secagg";
  }
  return "unknown";
}

absl::StatusOr<SecurityRefusal> ParseSecurityRefusal(std::string_view name) {
  return ParseEnum(
      name,
      {SecurityRefusal::kNameMismatch, SecurityRefusal::kWrongIdentity, SecurityRefusal::kRevokedCertificate,
       SecurityRefusal::kBadToken, SecurityRefusal::kJoinRate, SecurityRefusal::kSessionLimit,
       SecurityRefusal::kUploadLimit, SecurityRefusal::kStreamDeadline, SecurityRefusal::kSecAgg},
      SecurityRefusalName, "security refusal");
}

std::string_view SecAggStageName(SecAggStage s) {
  switch (s) {
    case SecAggStage::kAdvertiseKeys: return "advertise_keys";
    case SecAggStage::kShareKeys: return "share_keys";
    case SecAggStage::kMaskedUpload: return "masked_upload";
    case SecAggStage::kUnmask: return "unmask";
  }
  return "unknown";
}

absl::StatusOr<SecAggStage> ParseSecAggStage(std::string_view name) {
  return ParseEnum(
      name, {SecAggStage::kAdvertiseKeys, SecAggStage::kShareKeys, SecAggStage::kMaskedUpload, SecAggStage::kUnmask},
      SecAggStageName, "secure-aggregation stage");
}

std::string_view SecAggStageOutcomeName(SecAggStageOutcome o) {
  switch (o) {
    case SecAggStageOutcome::kOk: return "ok";
    case SecAggStageOutcome::kDropped: return "dropped";
    case SecAggStageOutcome::kRefused: return "refused";
  }
  return "unknown";
}

absl::StatusOr<SecAggStageOutcome> ParseSecAggStageOutcome(std::string_view name) {
  return ParseEnum(name, {SecAggStageOutcome::kOk, SecAggStageOutcome::kDropped, SecAggStageOutcome::kRefused},
                   SecAggStageOutcomeName, "secure-aggregation stage outcome");
}

std::string BoundText(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  constexpr std::string_view kEllipsis = "...";
  // A bound too small for the ellipsis keeps what fits without it: the bound is never exceeded.
  const std::string_view tail = max_bytes >= kEllipsis.size() ? kEllipsis : std::string_view();
  size_t cut = max_bytes - tail.size();
  // Back up over UTF-8 continuation bytes (10xxxxxx) so that no character is split.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return fl::StrCat(text.substr(0, cut), tail);
}

std::string BoundClientEventReason(std::string_view reason) { return BoundText(reason, kMaxClientEventReasonBytes); }

absl::StatusOr<ExperimentStatus> ParseExperimentStatus(std::string_view name) {
  return ParseEnum(
      name,
      {ExperimentStatus::kRunning, ExperimentStatus::kFinished, ExperimentStatus::kFailed, ExperimentStatus::kAborted},
      ExperimentStatusName, "experiment status");
}

absl::StatusOr<RoundStatus> ParseRoundStatus(std::string_view name) {
  return ParseEnum(name, {RoundStatus::kCommitted, RoundStatus::kFailed, RoundStatus::kAborted}, RoundStatusName,
                   "round status");
}

absl::StatusOr<ClientOutcome> ParseClientOutcome(std::string_view name) {
  return ParseEnum(name,
                   {ClientOutcome::kOk, ClientOutcome::kLate, ClientOutcome::kDropped, ClientOutcome::kRejected,
                    ClientOutcome::kCancelled, ClientOutcome::kFolded},
                   ClientOutcomeName, "client outcome");
}

std::string DescribeRecord(const Record& record) {
  return std::visit(
      Overloaded{
          [](const ExperimentRecord& r) { return fl::StrCat("experiment (id ", r.id, ")"); },
          [](const ExperimentStatusUpdate& r) {
            return fl::StrCat("experiment status update (id ", r.experiment_id, " -> ", ExperimentStatusName(r.status),
                              ")");
          },
          [](const ClientRecord& r) {
            return fl::StrCat("client (experiment ", r.experiment_id, ", client ", r.client_id, ")");
          },
          [](const ClientForgottenRecord& r) {
            return fl::StrCat("forgotten client (experiment ", r.experiment_id, ", client ", r.client_id, ")");
          },
          [](const ClientLeftRecord& r) {
            return fl::StrCat("client left (experiment ", r.experiment_id, ", client ", r.client_id, ")");
          },
          [](const RoundRecord& r) {
            return fl::StrCat("round (experiment ", r.experiment_id, ", round ", r.round, ", attempt ", r.attempt, ", ",
                              RoundStatusName(r.status), ")");
          },
          [](const RoundEvaluationUpdate& r) {
            return fl::StrCat("round evaluation (experiment ", r.experiment_id, ", round ", r.round, ", attempt ",
                              r.attempt, ")");
          },
          [](const ClientRoundUplinkUpdate& r) {
            return fl::StrCat("client round uplink (experiment ", r.experiment_id, ", round ", r.round, ", attempt ",
                              r.attempt, ", client ", r.client_id, ")");
          },
          [](const ClientRoundRecord& r) {
            return fl::StrCat("client round (experiment ", r.experiment_id, ", round ", r.round, ", attempt ",
                              r.attempt, ", client ", r.client_id, ")");
          },
          [](const EvaluationRecord& r) {
            return fl::StrCat("evaluation (experiment ", r.experiment_id, ", round ", r.round, ", attempt ", r.attempt,
                              ", client ", r.client_id, ")");
          },
          [](const CheckpointRecord& r) {
            return fl::StrCat("checkpoint (experiment ", r.experiment_id, ", round ", r.round, ")");
          },
          [](const ExperimentTaskUpdate& r) {
            return fl::StrCat("experiment task update (id ", r.experiment_id, " -> ", r.task, ")");
          },
          [](const RoundCommitRecord& r) {
            return fl::StrCat("commit of round ", r.round.round, " (experiment ", r.round.experiment_id, ", attempt ",
                              r.round.attempt, ": round row, ", r.client_rounds.size(), " client rows",
                              r.checkpoint.has_value() ? ", checkpoint row" : "",
                              r.folded_rows.empty()
                                  ? std::string()
                                  : fl::StrCat(", ", r.folded_rows.size(), " folded rows of earlier rounds"),
                              ")");
          },
          [](const EvaluationCommitRecord& r) {
            return fl::StrCat("evaluation of round ", r.round, " (experiment ", r.experiment_id, ", attempt ",
                              r.attempt, ": ", r.evaluations.size(), " client results",
                              r.figures.has_value() ? ", round figures)" : ")");
          },
          [](const RoundsSupersededUpdate& r) {
            return fl::StrCat("rounds superseded (experiment ", r.experiment_id, ", committed rounds after ",
                              r.after_round, ")");
          },
          [](const ClientEventRecord& r) {
            return fl::StrCat("client event (experiment ", r.experiment_id, ", client ", r.client_id, ", ",
                              ClientEventKindName(r.kind),
                              r.round.has_value() ? fl::StrCat(", round ", *r.round) : std::string(), ")");
          },
          [](const SecurityEventRecord& r) {
            return fl::StrCat("security event (experiment ", r.experiment_id, ", ", SecurityRefusalName(r.reason),
                              ", peer ", r.peer, ")");
          },
          [](const SecAggStageRecord& r) {
            return fl::StrCat("secure-aggregation stage (experiment ", r.experiment_id, ", round ", r.round,
                              ", attempt ", r.attempt, ", client ", r.client_id, ", ", SecAggStageName(r.stage), ", ",
                              SecAggStageOutcomeName(r.outcome), ")");
          },
      },
      record);
}

}  // namespace fl::instrumentation
