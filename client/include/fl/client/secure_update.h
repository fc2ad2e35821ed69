// fl-client's side of secure aggregation (SecAgg+, issue 29): the secure round of the current train task, driven
// by two threads of a session, and the masked upload it ends with.
//
//   reader thread (the session stream)            worker thread (RunTask)
//   Task.secagg          -> Start -> keys up
//   secagg_neighbour_keys -> OnNeighbourKeys -> shares up
//   secagg_masking_start -> OnMaskingStart (held)  training ... AwaitMaskingStart(weight): applies the held
//                                                   start with the weight (or waits for it), then MaskInPlace:
//                                                   the payload of codec "secagg-z32", masked where it lies
//   secagg_unmask_request -> OnUnmaskRequest -> shares of the survivors / the dropped up
//
// The masking start needs the weight (the examples trained on, capped by the round's max_weight), which only the
// training gives: whichever of the two comes last applies it. A message for another round, or while no secure
// round is open, is ignored with a warning (the server records its own refusals); a refusal of the library
// (secagg::ClientRound) abandons the round: the client sends nothing more in it and the server counts it as
// dropped. One mutex guards the round; the worker's wait is woken by the masking start, an abandonment, or Wake()
// (the session's cancel and end).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/mutex.h"
#include "fl/privacy/noise_rng.h"
#include "fl/secagg/client_round.h"
#include "fl/secagg/crypto.h"
#include "fl/v1/secagg.pb.h"

namespace fl::client {

// The upload codec of a masked update: (dimension + 1) uint32 little-endian words, no codec header.
inline constexpr char kSecAggCodec[] = "secagg-z32";

// The bytes of a masked update of `dimension` model coordinates (the weight coordinate last).
inline uint64_t SecAggPayloadBytes(uint64_t dimension) { return (dimension + 1) * sizeof(uint32_t); }

// The weight a client gives its update: 1 when the round averages uniformly (max_weight 1), else its examples
// capped at max_weight (at least 1: a weight of 0 is refused by the round, and a client without examples sends a
// zero delta anyway).
uint32_t SecAggWeight(const v1::SecAggQuantization& quantization, uint64_t num_examples);

// Distributed DP's share (Task.privacy.central_noise_steps > 0 with secure aggregation): integer discrete Gaussian
// noise of central_noise_steps / sqrt(expected_clients) added to every quantised coordinate before masking.
struct DistributedNoise {
  double central_noise_steps = 0;  // 0: none
  uint64_t expected_clients = 0;
};

struct MaskReport {
  uint64_t clipped_values = 0;  // coordinates outside the quantisation range, clipped to it
  uint32_t weight = 0;
  size_t mask_partners = 0;
  // This client's own time in the stages' work (its part of each stage's latency, beside the link's): making the
  // keys, making and encrypting the shares, opening the shares of the masking start.
  double keys_seconds = 0;
  double shares_seconds = 0;
  double masking_start_seconds = 0;
};

class SecureUpdate {
 public:
  struct Options {
    // Test hook (fl-client --secagg-drop-after-shares): abandon every secure round right after the shares were
    // produced, as a client that drops after sharing keys (no masked upload, no unmask answer).
    bool drop_after_shares = false;
  };
  SecureUpdate() : SecureUpdate(Options{}) {}
  explicit SecureUpdate(Options options) : options_(options) {}
  SecureUpdate(const SecureUpdate&) = delete;
  SecureUpdate& operator=(const SecureUpdate&) = delete;

  // ---- The reader thread. ----
  // Task.secagg of train task `task_id` arrived: opens its secure round (abandoning one still open) and returns
  // the public keys to send at once. A setup the library refuses, or one whose dimension is not the model's, is
  // an error: the round is then abandoned with it (AwaitMaskingStart reports it to the task).
  absl::StatusOr<v1::SecAggPublicKeys> Start(const std::string& task_id, const v1::SecAggSetup& setup,
                                             uint64_t model_dimension, secagg::RandomSource random);
  // The shares to send; nullopt when the message was ignored or refused (logged).
  std::optional<v1::SecAggShares> OnNeighbourKeys(const v1::SecAggNeighbourKeys& keys);
  // Held until the training gives the weight, or applied now when it already has.
  void OnMaskingStart(const v1::SecAggMaskingStart& start);
  // The answer to send; nullopt when ignored or refused. Answered once; the round is then over.
  std::optional<v1::SecAggUnmaskResponse> OnUnmaskRequest(const v1::SecAggUnmaskRequest& request);
  // The task was cancelled or the session ended: the round of `task_id` (any round when empty) is abandoned.
  void Abandon(std::string_view task_id, std::string_view why);
  // Wakes a worker waiting in AwaitMaskingStart so that it looks at its `interrupted` flag again.
  void Wake();

  // ---- The worker thread. ----
  enum class Outcome {
    kReady,        // the masking start is applied: mask and upload
    kAbandoned,    // refused, never opened, or replaced: `why` says by what (report it as the task's failure)
    kDropped,      // the drop-after-shares test hook: upload nothing, report nothing
    kInterrupted,  // `interrupted` was set (cancelled task, ended session, stop)
    kDeadline,     // the masking start did not come before `deadline`
  };
  struct Waited {
    Outcome outcome = Outcome::kAbandoned;
    absl::Status why;
  };
  // After training: gives the weight and waits until the masking start of `task_id`'s round is applied, the
  // round is abandoned, `interrupted` is set (then Wake()) or `deadline` passes.
  Waited AwaitMaskingStart(const std::string& task_id, uint32_t weight, const std::atomic<bool>& interrupted,
                           std::chrono::steady_clock::time_point deadline);
  // Masks the update where it lies: `payload` holds SecAggPayloadBytes(dimension) bytes, its first dimension * 4
  // the delta as floats (already clipped and noised: Task.privacy); they become the masked words, little-endian,
  // the masked weight last. With `noise`, the delta is quantised and weighted here, the noise share added, then
  // masked. A refusal (a non-finite value, a round no longer masking) abandons the round.
  absl::StatusOr<MaskReport> MaskInPlace(const std::string& task_id, std::span<uint8_t> payload,
                                         const DistributedNoise& noise, privacy::NoiseRng& rng);

  // Whether a worker is blocked in AwaitMaskingStart now (tests wait for it instead of sleeping).
  bool worker_waiting() const;
  // Whether a secure round is open (not abandoned, not over).
  bool open() const;

 private:
  enum class State { kNone, kAdvertised, kShared, kMasking, kUploaded, kAbandoned, kDropped };
  // Checks that a message of `round` belongs to the open round; logs and returns false otherwise.
  bool Accepts(uint64_t round, std::string_view what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AbandonLocked(absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the held masking start once the weight is known.
  void ApplyStartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable fl::Mutex mu_;
  fl::CondVar cv_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kNone;
  std::string task_id_ ABSL_GUARDED_BY(mu_);
  uint64_t round_id_ ABSL_GUARDED_BY(mu_) = 0;
  v1::SecAggQuantization quantization_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<secagg::ClientRound> round_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::SecAggMaskingStart> held_start_ ABSL_GUARDED_BY(mu_);
  uint32_t weight_ ABSL_GUARDED_BY(mu_) = 0;      // 0: the training has not given it yet
  double keys_seconds_ ABSL_GUARDED_BY(mu_) = 0;  // MaskReport's stage times
  double shares_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double masking_start_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status abandoned_ ABSL_GUARDED_BY(mu_);
  bool worker_waiting_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace fl::client
