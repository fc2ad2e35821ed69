// Secure aggregation inside a synchronous round (loop-owned, server/src only; docs/privacy.md "Secure aggregation in
// the rounds"): one SecureRound per round attempt wraps the SecAgg+ library's server side (fl::secagg::ServerRound)
// with what the library leaves to its caller: the round's client ids (strings) mapped to the library's numbers,
// the clock (each stage's deadline), who has gone (a task closed, a session ended), and what is recorded of each
// client's part in each stage (time from the server's message to the answer, bytes each way).
//
// The stages, as the round engine runs them (SyncRounds, engine_schedule_sync.cc):
//   advertise keys   the train task carries SecAggSetup; each client answers with its public keys at once, while it
//                    downloads and trains; closed when every participant still in the round answered, or at
//                    --secagg-stage-deadline-ms from the round's start
//   share keys       the neighbours' keys go down; closed like the first, --secagg-stage-deadline-ms after it opened
//   masked upload    the shares addressed to each client go down; each uploads its masked update with
//                    UploadUpdate (codec "secagg-z32") when its training is done; closed when the round closes (every
//                    task answered, its deadline, or over-commitment's K updates)
//   unmask           the survivors are asked for the shares that remove the masks; closed when every survivor
//                    answered, or --secagg-stage-deadline-ms after it opened (engine state kUnmasking)
// Clients that miss a key stage are dropped from the round (their tasks are closed and cancelled); a stage that
// leaves too few clients to reconstruct someone's secret fails the attempt, and the global model is untouched.
// The server never holds an update in the clear: a completed upload's words go into ONE running sum (the receive
// buffer is the upload slot's, reused), and a half-received upload never reaches the sum (an upload is added only
// once it has fully arrived and passed its checksum), so a client that stops mid-upload is merely dropped.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/secagg/server_round.h"
#include "fl/server/engine_config.h"
#include "fl/v1/federation.pb.h"

namespace fl::server::engine {

// The upload codec name of a masked update: (dimension + 1) uint32 words, little-endian, no codec header.
inline constexpr std::string_view kSecAggUploadCodec = "secagg-z32";
// What a client must declare at Join (JoinRequest.capabilities) to take part in secure rounds.
inline constexpr std::string_view kSecAggCapability = "secagg-v1";

// What one stage of one client looked like from the server.
struct SecureStageView {
  int64_t sent_ns = 0;      // the server's message of the stage (0: never sent)
  int64_t answered_ns = 0;  // the client's accepted answer (0: none)
  bool refused = false;     // a message of its for this stage was refused
  std::string detail;       // why dropped or refused
};

class SecureRound {
 public:
  // A message the engine sends on a client's session.
  struct Outgoing {
    std::string client_id;
    fl::v1::ServerMessage message;  // seq left for the engine
  };
  // What moving the round on produced: messages to send, clients dropped by a stage (the engine closes their tasks),
  // and a failure that ends the attempt.
  struct Progress {
    std::vector<Outgoing> send;
    std::vector<std::pair<std::string, std::string>> dropped;  // client id, why
    std::optional<std::string> failure;
  };

  // The round's participants (its selected clients). Refused: a population beyond the quantisation range, a
  // threshold outside (k/2, k], fewer than two clients.
  static absl::StatusOr<std::unique_ptr<SecureRound>> Create(const EngineConfig& config, uint64_t round,
                                                             const std::vector<std::string>& participants,
                                                             uint64_t dimension, int64_t now_ns);
  // The most clients one secure round may take at these settings (the selection is capped at it).
  static uint64_t MaxParticipants(const EngineConfig& config);

  // Task.secagg of a participant (its task is dispatched at the round's start: stage 1's message).
  absl::Status SetupFor(const std::string& client, fl::v1::SecAggSetup* setup);

  // A client's message of a key or unmask stage (ClientMessage.secagg_keys/secagg_shares/secagg_unmask). A refusal
  // is the library's status (fl::secagg::SecurityEventOf tells its kind): the engine records it as a security event.
  absl::Status OnMessage(const std::string& client, const fl::v1::ClientMessage& message, int64_t now_ns);
  // Whether `client` may upload its masked update now (the masked-upload stage is open and it is still in).
  absl::Status UploadAdmitted(const std::string& client) const;
  // A fully received masked update: (dimension + 1) little-endian words added to the running sum.
  absl::Status OnMaskedUpload(const std::string& client, std::span<const uint8_t> payload, int64_t now_ns);
  // The client's task closed without an update (its session ended, it failed, it was cancelled): a key stage need
  // not wait for it.
  void Gone(const std::string& client);
  // The server itself stalled `stall_ns` (engine_stalls.cc): the open stage's deadline moves on by that.
  void MoveOn(int64_t stall_ns) { stage_opened_ns_ += stall_ns; }

  // Closes a key stage that is complete (every participant still in answered) or past its deadline, and the
  // unmask stage the same way; opens the next. Called after every engine event.
  Progress Advance(int64_t now_ns);
  // The round closed (its tasks answered, its deadline, or over-commitment's target): closes the masked upload and
  // opens the unmask stage.
  Progress CloseMaskedUpload(int64_t now_ns);
  // The unmask stage closed with every secret reconstructed: the weighted mean of the survivors' updates.
  absl::StatusOr<secagg::AggregateResult> Result() const { return round_->Result(); }

  bool done() const { return round_->stage() == secagg::Stage::kDone; }
  // The deadline of the open key or unmask stage (0: none open, the masked upload runs to the round's deadline).
  int64_t stage_deadline_ns() const;
  uint64_t survivors() const { return survivors_; }
  uint64_t dropped() const { return participants_.size() - survivors_; }
  size_t participants() const { return participants_.size(); }
  uint32_t neighbourhood_size() const { return round_->graph().neighbourhood_size; }
  uint32_t threshold() const { return round_->graph().threshold; }
  // What a client did in each stage, and the bytes of each (the library's count of the serialized messages).
  const std::array<SecureStageView, 4>* ViewOf(const std::string& client) const;
  std::array<secagg::StageBytes, 4> BytesOf(const std::string& client) const;
  const std::vector<std::string>& participant_ids() const { return participants_; }

 private:
  SecureRound() = default;
  std::optional<uint64_t> NumberOf(const std::string& client) const;
  // Closes the open key stage (advertise or share) and sends the next stage's messages.
  void CloseKeyStage(int64_t now_ns, Progress& progress);
  void FinishUnmask(int64_t now_ns, Progress& progress);
  // Every participant still in the library's round has answered the open stage (or is gone).
  bool StageComplete() const;
  void Drop(secagg::Stage stage, Progress& progress, std::string_view why);
  void Failed(Progress& progress);

  int64_t stage_ns_ = 0;  // --secagg-stage-deadline-ms
  uint64_t round_number_ = 0;
  uint64_t dimension_ = 0;
  std::unique_ptr<secagg::ServerRound> round_;
  std::vector<std::string> participants_;    // index i is the library's client i + 1
  std::map<std::string, uint64_t> numbers_;  // client id -> library number
  std::vector<std::array<SecureStageView, 4>> views_;
  std::vector<bool> gone_;
  int64_t stage_opened_ns_ = 0;
  uint64_t survivors_ = 0;
};

}  // namespace fl::server::engine
