// What the secure aggregation refuses, as a kind the caller can record (the engine's security events).
//
// Every refusal of the library is an absl::Status whose message names the offending value and what to do, and
// which carries its kind as a payload (SecurityEventOf), so that a caller that only forwards statuses can
// still record the right kind. ServerRound also keeps the list of what it refused (ServerRound::events()).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace fl::secagg {

enum class SecurityEventKind {
  kNotInRound,                // a message from (or about) a client that is not, or no longer, in the round
  kWrongRound,                // a message of another round
  kDuplicate,                 // a second message where one is allowed (keys, shares, a chunk, a response)
  kWrongLength,               // a key, share or masked chunk of the wrong size or offset
  kAuthenticationFailed,      // a share that does not decrypt under its (round, sender, receiver)
  kBadKey,                    // a public key that repeats another or gives no shared secret
  kProtocolViolation,         // asked to reveal both secrets of one client, or out of stage
  kThresholdAboveNeighbours,  // threshold t > neighbourhood size k (or t <= k/2)
  kTooFewSurvivors,           // not enough clients left to reconstruct a secret: the round fails
  kIncompleteUpload,          // a masked upload stopped part way: its words are in the sum, the round fails
  kPopulationBeyondRange,     // more clients than the quantisation range can sum without wrapping
  kInvalidInput,              // a value the quantiser cannot take (NaN, weight out of range)
};

std::string_view SecurityEventKindName(SecurityEventKind kind);

// One refusal: its kind, the client it concerns (0 when none) and the status's message.
struct SecurityEvent {
  SecurityEventKind kind;
  uint64_t client_id = 0;
  std::string detail;
};

// A status of `code` with `message` that carries `kind` (readable back with SecurityEventOf).
absl::Status Refusal(SecurityEventKind kind, absl::StatusCode code, std::string_view message);

// The kind a status of this library carries; nullopt for OK or a status without one.
std::optional<SecurityEventKind> SecurityEventOf(const absl::Status& status);

}  // namespace fl::secagg
