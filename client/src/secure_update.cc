// fl-client's secure round and masked upload (secure_update.h).
#include "fl/client/secure_update.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/privacy/mechanisms.h"
#include "fl/secagg/quantize.h"

namespace fl::client {
namespace {

// Coordinates masked per step: the floats of a step are copied out of the payload first (they are read as floats
// and the same bytes written as words), 64 KiB at a time, so that the model is never copied whole.
constexpr size_t kMaskStep = 16384;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

secagg::QuantizationSpec SpecOf(const v1::SecAggQuantization& q) {
  return secagg::QuantizationSpec{.range = q.range(), .scale = q.scale(), .max_weight = q.max_weight()};
}

}  // namespace

uint32_t SecAggWeight(const v1::SecAggQuantization& quantization, uint64_t num_examples) {
  if (quantization.max_weight() <= 1) return 1;
  return static_cast<uint32_t>(std::clamp<uint64_t>(num_examples, 1, quantization.max_weight()));
}

absl::StatusOr<v1::SecAggPublicKeys> SecureUpdate::Start(const std::string& task_id, const v1::SecAggSetup& setup,
                                                         uint64_t model_dimension, secagg::RandomSource random) {
  fl::MutexLock lock(mu_);
  if (round_ != nullptr && state_ != State::kUploaded) {
    spdlog::warn("secagg: round {} of task {} abandoned: task {} opens round {}", round_id_, task_id_, task_id,
                 setup.round());
  }
  round_.reset();
  held_start_.reset();
  weight_ = 0;
  keys_seconds_ = shares_seconds_ = masking_start_seconds_ = 0;
  abandoned_ = absl::OkStatus();
  task_id_ = task_id;
  round_id_ = setup.round();
  quantization_ = setup.quantization();
  state_ = State::kAdvertised;
  absl::Status refused;
  if (setup.dimension() != model_dimension) {
    refused = absl::InvalidArgumentError(fl::StrCat("secagg setup of round ", setup.round(), " has dimension ",
                                                    setup.dimension(), " but this client's model has ", model_dimension,
                                                    " values: the server's secure round is wrong"));
  } else {
    v1::SecAggPublicKeys keys;
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<std::unique_ptr<secagg::ClientRound>> started =
        secagg::ClientRound::Start(setup, std::move(random), &keys);
    keys_seconds_ = SecondsSince(t0);
    if (started.ok()) {
      round_ = *std::move(started);
      cv_.NotifyAll();
      return keys;
    }
    refused = started.status();
  }
  AbandonLocked(absl::Status(refused.code(),
                             fl::StrCat("secagg round ", setup.round(), " refused at its setup: ", refused.message())));
  return abandoned_;
}

bool SecureUpdate::Accepts(uint64_t round, std::string_view what) const {
  if (round_ == nullptr || state_ == State::kAbandoned || state_ == State::kDropped) {
    spdlog::warn("secagg: {} for round {} while no secure round is open: ignored", what, round);
    return false;
  }
  if (round != round_id_) {
    spdlog::warn("secagg: {} for round {} while round {} is open: ignored", what, round, round_id_);
    return false;
  }
  return true;
}

void SecureUpdate::AbandonLocked(absl::Status why) {
  spdlog::warn("secagg: task {}: round {} abandoned: {}", task_id_, round_id_, why.message());
  abandoned_ = std::move(why);
  state_ = State::kAbandoned;
  round_.reset();
  held_start_.reset();
  cv_.NotifyAll();
}

std::optional<v1::SecAggShares> SecureUpdate::OnNeighbourKeys(const v1::SecAggNeighbourKeys& keys) {
  fl::MutexLock lock(mu_);
  if (!Accepts(keys.round(), "neighbour keys")) return std::nullopt;
  v1::SecAggShares shares;
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status s = round_->OnNeighbourKeys(keys, &shares);
  shares_seconds_ = SecondsSince(t0);
  if (!s.ok()) {
    AbandonLocked(absl::Status(s.code(), fl::StrCat("the neighbour keys were refused: ", s.message())));
    return std::nullopt;
  }
  state_ = State::kShared;
  if (options_.drop_after_shares) {
    // The test hook: these shares still go up (the caller sends them), then nothing more of this round.
    spdlog::info("secagg: task {}: round {}: dropping after the shares (--secagg-drop-after-shares)", task_id_,
                 round_id_);
    state_ = State::kDropped;
    round_.reset();
    cv_.NotifyAll();
  }
  return shares;
}

void SecureUpdate::ApplyStartLocked() {
  if (!held_start_.has_value() || weight_ == 0 || state_ != State::kShared) return;
  const v1::SecAggMaskingStart start = *std::move(held_start_);
  held_start_.reset();
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status s = round_->OnMaskingStart(start, weight_);
  masking_start_seconds_ = SecondsSince(t0);
  if (!s.ok()) {
    AbandonLocked(absl::Status(s.code(), fl::StrCat("the masking start was refused: ", s.message())));
    return;
  }
  state_ = State::kMasking;
  cv_.NotifyAll();
}

void SecureUpdate::OnMaskingStart(const v1::SecAggMaskingStart& start) {
  fl::MutexLock lock(mu_);
  if (!Accepts(start.round(), "masking start")) return;
  if (state_ != State::kShared || held_start_.has_value()) {
    AbandonLocked(absl::FailedPreconditionError(
        fl::StrCat("a masking start for round ", start.round(),
                   state_ == State::kAdvertised ? " before its neighbour keys" : " that came twice")));
    return;
  }
  held_start_ = start;
  ApplyStartLocked();
}

std::optional<v1::SecAggUnmaskResponse> SecureUpdate::OnUnmaskRequest(const v1::SecAggUnmaskRequest& request) {
  fl::MutexLock lock(mu_);
  if (!Accepts(request.round(), "unmask request")) return std::nullopt;
  v1::SecAggUnmaskResponse response;
  if (absl::Status s = round_->OnUnmaskRequest(request, &response); !s.ok()) {
    AbandonLocked(absl::Status(s.code(), fl::StrCat("the unmask request was refused: ", s.message())));
    return std::nullopt;
  }
  // Answered once: the round is over for this client (the library refuses a second request anyway).
  round_.reset();
  state_ = State::kNone;
  return response;
}

void SecureUpdate::Abandon(std::string_view task_id, std::string_view why) {
  fl::MutexLock lock(mu_);
  if (round_ == nullptr || (!task_id.empty() && task_id != task_id_)) return;
  AbandonLocked(absl::CancelledError(std::string(why)));
}

void SecureUpdate::Wake() {
  fl::MutexLock lock(mu_);  // taken so that a worker between its check and its wait does not miss the wake-up
  cv_.NotifyAll();
}

SecureUpdate::Waited SecureUpdate::AwaitMaskingStart(const std::string& task_id, uint32_t weight,
                                                     const std::atomic<bool>& interrupted,
                                                     std::chrono::steady_clock::time_point deadline) {
  fl::MutexLock lock(mu_);
  if (task_id != task_id_) {
    return {Outcome::kAbandoned,
            absl::FailedPreconditionError(fl::StrCat(
                "task ", task_id, " has Task.secagg but its secure round is not open (",
                task_id_.empty() ? std::string("none was") : fl::StrCat("task ", task_id_, "'s replaced it"), ")"))};
  }
  if (state_ == State::kAdvertised || state_ == State::kShared) {
    weight_ = weight;
    ApplyStartLocked();
  }
  // A later task's Task.secagg replaces the round (the server moved on): that, too, ends this wait.
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return interrupted.load() || task_id_ != task_id || (state_ != State::kAdvertised && state_ != State::kShared);
  };
  worker_waiting_ = true;
  const bool done = cv_.WaitUntil(mu_, deadline, settled);
  worker_waiting_ = false;
  if (task_id_ != task_id) {
    return {Outcome::kAbandoned, absl::FailedPreconditionError(fl::StrCat(
                                     "task ", task_id, "'s secure round was replaced by task ", task_id_, "'s"))};
  }
  switch (state_) {
    case State::kMasking: return {Outcome::kReady, absl::OkStatus()};
    case State::kAbandoned: return {Outcome::kAbandoned, abandoned_};
    case State::kDropped: return {Outcome::kDropped, absl::OkStatus()};
    default: break;
  }
  if (interrupted.load()) return {Outcome::kInterrupted, absl::CancelledError("the task was cancelled")};
  if (!done) {
    AbandonLocked(absl::DeadlineExceededError(
        fl::StrCat("secagg round ", round_id_, ": no masking start before the task's deadline")));
    return {Outcome::kDeadline, abandoned_};
  }
  return {Outcome::kAbandoned, absl::FailedPreconditionError("the secure round ended before the masked upload")};
}

absl::StatusOr<MaskReport> SecureUpdate::MaskInPlace(const std::string& task_id, std::span<uint8_t> payload,
                                                     const DistributedNoise& noise, privacy::NoiseRng& rng) {
  fl::MutexLock lock(mu_);
  if (task_id != task_id_ || state_ != State::kMasking || round_ == nullptr) {
    return absl::FailedPreconditionError(
        fl::StrCat("task ", task_id, ": the secure round is not at its masking stage: nothing to mask with"));
  }
  const uint64_t n = round_->dimension();
  if (payload.size() != SecAggPayloadBytes(n)) {
    return absl::InternalError(fl::StrCat("secagg payload of ", payload.size(), " bytes for ", n, " values; expected ",
                                          SecAggPayloadBytes(n)));
  }
  const secagg::QuantizationSpec spec = SpecOf(quantization_);
  const uint32_t weight = round_->weight();
  const float range = static_cast<float>(spec.range);
  uint64_t clipped_here = 0;
  // Two's complement words over the payload's bytes: each step's floats are copied out first, then the words
  // written over them.
  auto* words_base = reinterpret_cast<uint32_t*>(payload.data());
  std::vector<float> step(std::min<uint64_t>(n, kMaskStep));
  for (uint64_t off = 0; off < n; off += kMaskStep) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kMaskStep, n - off));
    std::memcpy(step.data(), payload.data() + off * sizeof(float), len * sizeof(float));
    const std::span<const float> values(step.data(), len);
    const std::span<uint32_t> words(words_base + off, len);
    absl::Status s;
    if (noise.central_noise_steps > 0) {
      // Distributed DP: the quantised, weighted words, plus this client's integer noise share, then masked.
      for (size_t i = 0; i < len && s.ok(); ++i) {
        const float x = values[i];
        if (!std::isfinite(x)) {
          s = absl::InvalidArgumentError(
              fl::StrCat("update coordinate ", off + i, " is ", x, "; secure aggregation takes finite values"));
        }
        clipped_here += (x > range || x < -range) ? 1 : 0;
        words[i] = static_cast<uint32_t>(secagg::Quantize(spec, x)) * weight;
      }
      if (s.ok()) {
        s = privacy::AddDiscreteGaussianShare(words, noise.central_noise_steps,
                                              static_cast<int64_t>(noise.expected_clients), rng);
      }
      if (s.ok()) s = round_->MaskQuantizedChunk(off, words);
    } else {
      s = round_->MaskChunk(off, values, words);
    }
    if (!s.ok()) {
      AbandonLocked(absl::Status(s.code(), fl::StrCat("masking the update: ", s.message())));
      return abandoned_;
    }
  }
  v1::SecAggMaskedChunk weight_chunk;
  if (absl::Status s = round_->MaskWeight(&weight_chunk); !s.ok() || weight_chunk.words().size() != 4) {
    AbandonLocked(absl::InternalError(fl::StrCat("masking the weight: ", s.message())));
    return abandoned_;
  }
  std::memcpy(payload.data() + n * sizeof(uint32_t), weight_chunk.words().data(), sizeof(uint32_t));
  if constexpr (std::endian::native == std::endian::big) {
    // The library's words are in host order; the wire's are little-endian.
    for (uint64_t i = 0; i <= n; ++i) {
      uint32_t w;
      std::memcpy(&w, payload.data() + i * 4, 4);
      w = __builtin_bswap32(w);
      std::memcpy(payload.data() + i * 4, &w, 4);
    }
  }
  state_ = State::kUploaded;
  return MaskReport{.clipped_values = round_->clipped_values() + clipped_here,
                    .weight = weight,
                    .mask_partners = round_->mask_partners(),
                    .keys_seconds = keys_seconds_,
                    .shares_seconds = shares_seconds_,
                    .masking_start_seconds = masking_start_seconds_};
}

bool SecureUpdate::worker_waiting() const {
  fl::MutexLock lock(mu_);
  return worker_waiting_;
}

bool SecureUpdate::open() const {
  fl::MutexLock lock(mu_);
  return round_ != nullptr && state_ != State::kAbandoned && state_ != State::kDropped;
}

}  // namespace fl::client
