// The round engine's global model (loop-owned, server/src only): the weights and their spec, the version clients
// train from, the server optimizer, the codecs (the download's, and the uplink decoders link-aware compression can
// name), the download payload, the server step and the checkpoint file. It knows nothing of rounds, clients or
// records: the core decides when to step and commit, records the checkpoint's row and ends the run on an error.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/aggregator.h"
#include "fl/core/codec.h"
#include "fl/core/codec_policy.h"
#include "fl/core/tensor_spec.h"
#include "fl/core/server_optimizer.h"
#include "fl/core/task.h"
#include "fl/instrumentation/records.h"
#include "fl/v1/checkpoint.pb.h"
#include "fl/server/events.h"

namespace fl::server::engine {

// How the engine decodes an upload's payload: the reactor (service.cc) checked the upload's XXH3-64 against its
// trailer before posting it, so the codec's body checksum is not computed again (and fl-client's uploads do not
// carry one: core::kCodecFlagNoBodyChecksum).
inline constexpr core::DecodeOptions kVerifiedUpload{.transfer_verified = true};

// Where a checkpoint goes and what it says about the run (EngineConfig checkpoint_dir, experiment_id).
struct CheckpointTarget {
  std::string dir;  // "" writes none
  std::string experiment_id;
  uint64_t round = 0;  // the last committed round, the file's name
  std::optional<core::Task> task;
  int64_t created_unix_ms = 0;
  // Differential privacy's ledger (engine_privacy.h), kept with the model (defaulted: a target without one needs
  // no initializer).
  std::optional<fl::v1::PrivacyLedger> privacy = std::nullopt;
};

class GlobalModel {
 public:
  // Empty until Configure: no codec, no model.
  GlobalModel() = default;
  GlobalModel(const GlobalModel&) = delete;
  GlobalModel& operator=(const GlobalModel&) = delete;
  GlobalModel(GlobalModel&&) = default;
  GlobalModel& operator=(GlobalModel&&) = default;

  // The codecs and optimizer named by a validated EngineConfig (uplink_codec, uplink_codec_policy,
  // downlink_codec, optimizer); an error names the setting that does not parse.
  absl::Status Configure(std::string_view uplink_codec, std::string_view uplink_codec_policy,
                         std::string_view downlink_codec, std::string optimizer);

  // The weights the run starts from (a client's upload, --initial-model or --resume's checkpoint), which the
  // download payload of `round` then carries; a fresh server optimizer for them. An error when the values do not
  // fit the spec, or the optimizer cannot be made for that size; the model is then left as it was.
  absl::Status Adopt(core::ModelSpec spec, std::string name, std::vector<float> values, uint64_t version,
                     uint64_t round);
  bool loaded() const { return spec_ != nullptr; }

  const std::shared_ptr<const core::ModelSpec>& spec() const { return spec_; }
  const std::string& name() const { return name_; }
  std::span<const float> values() const { return values_; }
  uint64_t version() const { return version_; }
  // The current version as clients download it; shared with the downloads that still stream it.
  const std::shared_ptr<const ModelPayload>& payload() const { return payload_; }
  core::ServerOptimizer& optimizer() { return *optimizer_; }

  // Link-aware compression (--uplink-codec-policy): the codec a client on `link_kind` measured at
  // `uplink_bytes_per_s` (none: not yet) is asked to send with, and the decoder of a codec a task named ("" or one the
  // policy cannot name: the fixed --uplink-codec).
  const std::string& UplinkCodecFor(std::string_view link_kind, std::optional<double> uplink_bytes_per_s) const;
  const core::Codec& UplinkCodecOf(std::string_view name) const;
  const core::CodecPolicy& codec_policy() const { return codec_policy_; }

  // An update of whole weights as the pseudo-gradient the aggregators take: decoded with `codec`, every value
  // checked finite (`source` names the sender in the error), then θ_global − θ_client, into `out` (resized).
  absl::Status PseudoGradientOfWeights(const core::Codec& codec, std::span<const uint8_t> payload,
                                       std::string_view source, std::vector<float>& out) const;

  // The server step from `aggregator`'s aggregate: the optimizer applies it, integer tensors (BatchNorm's
  // num_batches_tracked, ...) keep the previous values, and the result must be finite. `what` ("round 3",
  // "aggregation step 7") starts the clipping log line and the error. The version does not move: Commit does.
  // On an error the weights may be part-stepped; the caller ends the run (the last checkpoint is intact).
  // `perturb`, when given, changes the aggregate before the optimizer sees it (differential privacy's noise).
  using Perturb = std::function<absl::Status(std::span<float>)>;
  absl::Status Step(core::Aggregator& aggregator, std::string_view what, const Perturb& perturb = nullptr);
  // The same from an aggregate formed elsewhere (secure aggregation's unmasked mean), one value per parameter.
  absl::Status StepFrom(absl::StatusOr<std::vector<float>> pseudo_grad, std::string_view what,
                        const Perturb& perturb = nullptr);
  // The stepped weights become the next version, downloaded as that of `round`.
  void Commit(uint64_t round);
  // A commit that could not be stored: the version number goes back (the run ends; --resume loads the checkpoint).
  void UndoCommit() { --version_; }

  // The checkpoint file of the current version (temporary file, fsync, rename) and the row the caller records
  // with its commit; nullopt when `target.dir` is empty.
  absl::StatusOr<std::optional<instrumentation::CheckpointRecord>> WriteCheckpoint(
      const CheckpointTarget& target) const;

 private:
  void PublishPayload(uint64_t round);

  std::shared_ptr<const core::ModelSpec> spec_;
  std::string name_;
  std::vector<float> values_;
  uint64_t version_ = 0;
  std::string optimizer_spec_;
  std::unique_ptr<core::ServerOptimizer> optimizer_;
  std::unique_ptr<core::Codec> downlink_codec_;
  std::unique_ptr<core::Codec> uplink_codec_;  // the fixed --uplink-codec
  core::CodecPolicy codec_policy_;
  std::map<std::string, std::unique_ptr<core::Codec>, std::less<>> uplink_codecs_;  // every codec the policy names
  std::shared_ptr<const ModelPayload> payload_;
};

}  // namespace fl::server::engine
