#include "fl/secagg/events.h"

#include <array>

#include "absl/strings/cord.h"
#include "fl/core/str_cat.h"

namespace fl::secagg {
namespace {

constexpr char kPayloadUrl[] = "type.fl/secagg.SecurityEventKind";

constexpr std::array kKinds = {
    SecurityEventKind::kNotInRound,
    SecurityEventKind::kWrongRound,
    SecurityEventKind::kDuplicate,
    SecurityEventKind::kWrongLength,
    SecurityEventKind::kAuthenticationFailed,
    SecurityEventKind::kBadKey,
    SecurityEventKind::kProtocolViolation,
    SecurityEventKind::kThresholdAboveNeighbours,
    SecurityEventKind::kTooFewSurvivors,
    SecurityEventKind::kIncompleteUpload,
    SecurityEventKind::kPopulationBeyondRange,
    SecurityEventKind::kInvalidInput,
};

}  // namespace

std::string_view SecurityEventKindName(SecurityEventKind kind) {
  switch (kind) {
    case SecurityEventKind::kNotInRound: return "secagg_not_in_round";
    case SecurityEventKind::kWrongRound: return "secagg_wrong_round";
    case SecurityEventKind::kDuplicate: return "secagg_duplicate";
    case SecurityEventKind::kWrongLength: return "secagg_wrong_length";
    case SecurityEventKind::kAuthenticationFailed: return "secagg_authentication_failed";
    case SecurityEventKind::kBadKey: return "secagg_bad_key";
    case SecurityEventKind::kProtocolViolation: return "secagg_protocol_violation";
    case SecurityEventKind::kThresholdAboveNeighbours: return "secagg_threshold_above_neighbours";
    case SecurityEventKind::kTooFewSurvivors: return "secagg_too_few_survivors";
    case SecurityEventKind::kIncompleteUpload: return "secagg_incomplete_upload";
    case SecurityEventKind::kPopulationBeyondRange: return "secagg_population_beyond_range";
    case SecurityEventKind::kInvalidInput: return "secagg_invalid_input";
  }
  return "secagg_unknown";
}

absl::Status Refusal(SecurityEventKind kind, absl::StatusCode code, std::string_view message) {
  absl::Status status(code, absl::string_view(message.data(), message.size()));
  const std::string_view name = SecurityEventKindName(kind);
  status.SetPayload(kPayloadUrl, absl::Cord(absl::string_view(name.data(), name.size())));
  return status;
}

std::optional<SecurityEventKind> SecurityEventOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kPayloadUrl);
  if (!payload.has_value()) return std::nullopt;
  const std::string name(*payload);
  for (SecurityEventKind kind : kKinds) {
    if (SecurityEventKindName(kind) == name) return kind;
  }
  return std::nullopt;
}

}  // namespace fl::secagg
