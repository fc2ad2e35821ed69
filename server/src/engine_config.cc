// EngineConfig's checks and its recorded form (engine_config.h).
#include "fl/server/engine_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <unistd.h>

#include "absl/strings/numbers.h"
#include "fl/core/codec.h"
#include "fl/core/codec_policy.h"
#include "fl/core/log_format.h"
#include "fl/core/server_optimizer.h"
#include "fl/core/str_cat.h"
#include "fl/core/tensor_spec.h"
#include "fl/proto/convert.h"
#include "fl/secagg/quantize.h"
#include "fl/server/settings.h"
#include "fl/server/staleness.h"

namespace fl::server {

absl::StatusOr<core::NormClip> EngineConfig::UpdateNormClip() const {
  // The weighted mean is streamed: it cannot know the round's median norm before adding an update.
  const bool streamed = aggregator == "mean" || aggregator == "fedavg";
  if (clip_update_norm.empty()) {
    core::NormClip clip;
    if (!streamed) clip.mode = core::NormClip::Mode::kMedian;
    return clip;
  }
  auto clip = core::NormClip::Parse(clip_update_norm);
  if (!clip.ok()) {
    return absl::InvalidArgumentError(
        fl::StrCat("--clip-update-norm=", clip_update_norm, ": ", fl::ToStd(clip.status().message())));
  }
  if (clip->mode == core::NormClip::Mode::kMedian && streamed) {
    return absl::InvalidArgumentError(fl::StrCat(
        "--clip-update-norm=median needs a strategy that keeps every update (fedmedian, fedtrimmedavg): the "
        "weighted mean of --strategy fedavg & co. is streamed; give a fixed bound, e.g. --clip-update-norm=10"));
  }
  return clip;
}

absl::Status EngineConfig::Validate() const {
  auto bad = [](std::string_view flag, auto value, std::string_view allowed) {
    return absl::InvalidArgumentError(fl::StrCat("--", flag, "=", value, " is invalid: ", allowed));
  };
  // The mode checks first: they say why a combination cannot work, which a bound alone would not.
  if (absl::Status s = ValidateBuffered(); !s.ok()) return s;
  if (absl::Status s = ValidateStragglers(); !s.ok()) return s;
  if (absl::Status s = ValidatePrivacy(); !s.ok()) return s;
  if (absl::Status s = ValidateSecureAggregation(); !s.ok()) return s;
  // Every setting's own bounds and choices, from its declaration (settings.cc).
  if (absl::Status s = CheckSettingBounds(*this); !s.ok()) return s;
  // Checks across settings.
  if (fit.min_available < fit.min_clients) {
    return bad("min-available-clients", fit.min_available, "must be at least --min-fit-clients");
  }
  // An honest session sends a heartbeat and a pong per interval, plus task reports: leave it room for four.
  const uint32_t min_session_rate = (4000 + heartbeat_interval_ms - 1) / heartbeat_interval_ms;
  if (session_max_messages_per_s < min_session_rate) {
    return bad("session-max-messages-per-s", session_max_messages_per_s,
               fl::StrCat("must be at least ", min_session_rate, " with --heartbeat-interval-ms=",
                          heartbeat_interval_ms, " (four messages per heartbeat interval)"));
  }
  if (stall_threshold_ms.has_value() && *stall_threshold_ms != 0 && *stall_threshold_ms < 100) {
    return bad("stall-threshold-ms", *stall_threshold_ms, "must be at least 100 (0: off)");
  }
  if (train.local_epochs() == 0 && train.local_steps() == 0) {
    return bad("local-epochs", 0, "set --local-epochs or --local-steps to at least 1");
  }
  for (const std::string* codec : {&uplink_codec, &downlink_codec}) {
    if (auto c = core::MakeCodec(*codec); !c.ok()) {
      return absl::InvalidArgumentError(fl::StrCat("codec '", *codec, "': ", fl::ToStd(c.status().message())));
    }
  }
  if (auto p = core::ParseCodecPolicy(uplink_codec_policy, uplink_codec); !p.ok()) return p.status();
  auto spec = core::ModelSpec::Create({{"probe", {1}, core::DType::kFloat32, 0}});
  auto shared = std::make_shared<const core::ModelSpec>(*spec);
  if (auto a = core::MakeAggregator(aggregator, shared); !a.ok()) {
    return absl::InvalidArgumentError(fl::StrCat("--aggregator=", aggregator, ": ", fl::ToStd(a.status().message())));
  }
  if (auto clip = UpdateNormClip(); !clip.ok()) return clip.status();
  if (auto o = core::MakeServerOptimizer(optimizer, 1); !o.ok()) {
    return absl::InvalidArgumentError(fl::StrCat("--strategy=", optimizer, ": ", fl::ToStd(o.status().message())));
  }
  return absl::OkStatus();
}

uint32_t DefaultMaxSessions() {
  // A quarter of physical memory at the budget of a session (measured in docs/performance.md, "Fleets"), within
  // [1000, 1,000,000]: a Pi with 4 GiB takes 16,384 sessions, this 23 GiB machine about 95,000.
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  const uint64_t memory = pages > 0 && page_size > 0 ? uint64_t(pages) * uint64_t(page_size) : uint64_t{4} << 30;
  return static_cast<uint32_t>(std::clamp<uint64_t>(memory / 4 / EngineConfig::kSessionBudgetBytes, 1000, 1'000'000));
}

absl::Status EngineConfig::ValidateBuffered() const {
  if (aggregation == "synchronous") return absl::OkStatus();
  if (aggregation != "buffered") {
    return absl::InvalidArgumentError(fl::StrCat("--aggregation=", aggregation,
                                                 " is invalid: use synchronous (rounds; the default) or buffered "
                                                 "(FedBuff: asynchronous training, an aggregation step every "
                                                 "--buffer-size updates)"));
  }
  if (!aggregates_by_mean()) {
    return absl::InvalidArgumentError(fl::StrCat(
        "--aggregation=buffered cannot use the robust aggregator '", aggregator,
        "' (--strategy fedmedian / fedtrimmedavg): it compares the updates of one synchronous cohort, while a "
        "buffered step mixes updates trained from different model versions with staleness weights. Use "
        "--strategy fedavg, fedavgm, fedadam, fedyogi, fedadagrad or nesterov with --aggregation=buffered, or "
        "--aggregation=synchronous for a robust aggregator"));
  }
  if (concurrency == 0) {
    return absl::InvalidArgumentError(
        "--concurrency=0 is invalid with --aggregation=buffered: no client would ever train; give the number of "
        "clients training at once (at least --buffer-size), e.g. --concurrency=10");
  }
  if (buffer_size == 0) {
    return absl::InvalidArgumentError(
        "--buffer-size=0 is invalid: an aggregation step needs at least one update, e.g. --buffer-size=5");
  }
  if (buffer_size > concurrency) {
    return absl::InvalidArgumentError(fl::StrCat(
        "--buffer-size=", buffer_size, " is larger than --concurrency=", concurrency, ": at most ", concurrency,
        " updates are in flight and a client waits for the step its update is in, so "
        "the buffer could never fill; use --buffer-size <= ",
        concurrency, " or raise --concurrency"));
  }
  if (buffer_size > fit.min_available) {
    return absl::InvalidArgumentError(fl::StrCat(
        "--buffer-size=", buffer_size, " is larger than --min-available-clients=", fit.min_available,
        " (the population the experiment waits for): each client has at most one update in a step, so the buffer "
        "could never fill with that many clients; use --buffer-size <= ",
        fit.min_available, " or raise --min-available-clients"));
  }
  if (max_staleness == 0) {
    return absl::InvalidArgumentError(
        "--max-staleness=0 is invalid with --aggregation=buffered: every update trained while another step was "
        "applied would be refused, which undoes the asynchrony; use --max-staleness >= 1 (e.g. 10), or "
        "--aggregation=synchronous for rounds");
  }
  if (auto w = ParseStalenessWeight(staleness_weight); !w.ok()) return w.status();
  return absl::OkStatus();
}

absl::Status EngineConfig::ValidateStragglers() const {
  if (!std::isfinite(overcommit) || overcommit < 1.0) {
    return absl::InvalidArgumentError(
        fl::StrCat("--overcommit=", overcommit,
                   ": over-commitment selects ceil(F x K) clients to commit with the first K updates, so F must be a "
                   "finite number >= 1 (1 = off; e.g. 1.3 selects 13 clients for a round of 10)"));
  }
  if (deadline_policy != "drop" && deadline_policy != "fold") {
    return absl::InvalidArgumentError(fl::StrCat(
        "--deadline-policy=", deadline_policy,
        " is not known; use drop (an update after its round's commit is recorded late, not aggregated) or fold (it "
        "is folded into the next round's aggregate, discounted by --late-discount)"));
  }
  if (!std::isfinite(late_discount) || late_discount < 0) {
    return absl::InvalidArgumentError(
        fl::StrCat("--late-discount=", late_discount,
                   ": a folded update's weight is n_k x (1 + tau)^-a, so a must be a finite number >= 0 (0 = no "
                   "discount, 1 = halve the weight of an update one round late)"));
  }
  if (buffered()) {
    if (overcommit > 1.0) {
      return absl::InvalidArgumentError(fl::StrCat(
          "--overcommit=", overcommit,
          " applies to synchronous rounds; buffered aggregation has no round to over-commit: it keeps --concurrency "
          "clients training and applies every --buffer-size updates. Raise --concurrency above --buffer-size for "
          "the same effect, or drop --overcommit"));
    }
    if (folds_late_updates()) {
      return absl::InvalidArgumentError(
          "--deadline-policy=fold applies to synchronous rounds; buffered aggregation already applies every update "
          "with its staleness weight (--staleness-weight, --max-staleness): use --deadline-policy=drop with it");
    }
  }
  if (folds_late_updates()) {
    if (!aggregates_by_mean()) {
      return absl::InvalidArgumentError(fl::StrCat(
          "--deadline-policy=fold needs the weighted mean (--strategy fedavg, fedprox, fedavgm, fedadam, fedyogi, "
          "fedadagrad or nesterov): a late update is folded in with a discounted weight, and the aggregator '",
          aggregator,
          "' (fedmedian, fedtrimmedavg) ignores weights, so the discount would mean nothing and a stale update "
          "would count as much as a fresh one; use --deadline-policy=drop with it"));
    }
  }
  return absl::OkStatus();
}

bool EngineConfig::aggregates_by_mean() const {
  const std::string kind = aggregator.substr(0, aggregator.find(':'));
  return kind == "mean" || kind == "fedavg";
}

absl::Status EngineConfig::ValidatePrivacy() const {
  if (!dp_on()) {
    if (dp_target_epsilon > 0) {
      return absl::InvalidArgumentError(fl::StrCat(
          "--dp-target-epsilon=", dp_target_epsilon,
          " without --dp-noise-multiplier gives no privacy: nothing is clipped or noised, so no epsilon is spent or "
          "bounded; set --dp-noise-multiplier (e.g. 1.0) and --dp-population, or drop --dp-target-epsilon"));
    }
    return absl::OkStatus();
  }
  if (!std::isfinite(dp_clip_norm) || dp_clip_norm <= 0) {
    return absl::InvalidArgumentError(fl::StrCat("--dp-clip-norm=", dp_clip_norm,
                                                 " gives no privacy: updates must be clipped to a finite L2 norm C > "
                                                 "0 for the noise to hide any one of them; e.g. --dp-clip-norm=1"));
  }
  if (dp_mode != "central" && dp_mode != "local" && dp_mode != "distributed") {
    return absl::InvalidArgumentError(
        fl::StrCat("--dp-mode=", dp_mode, " is not known; use central (the default), local or distributed"));
  }
  // Local DP accounts each client's own releases (q = 1): the population does not enter.
  if (dp_population == 0 && dp_mode != "local") {
    return absl::InvalidArgumentError(
        "--dp-noise-multiplier needs --dp-population: the number of clients the rounds sample from, so that the "
        "accountant knows the sampling rate q = clients per round / population (e.g. --dp-population=1000)");
  }
  if (!(dp_delta > 0 && dp_delta < 1)) {
    return absl::InvalidArgumentError(fl::StrCat(
        "--dp-delta=", dp_delta, " must lie in (0, 1); use one well below 1/population, e.g. --dp-delta=1e-5"));
  }
  if (buffered()) {
    return absl::InvalidArgumentError(
        "--dp-noise-multiplier with --aggregation=buffered is not supported: the accountant composes one sampled "
        "round at a time, and a buffered step's updates come from overlapping, staleness-weighted cohorts; use "
        "--aggregation=synchronous with differential privacy");
  }
  if (!aggregates_by_mean()) {
    return absl::InvalidArgumentError(fl::StrCat(
        "--dp-noise-multiplier needs the mean of the updates (--strategy fedavg, fedprox, fedavgm, fedadam, fedyogi, "
        "fedadagrad or nesterov): the noise N(0, (sigma C/m)^2) bounds what one clipped update adds to a mean; the "
        "aggregator '",
        aggregator, "' (fedmedian, fedtrimmedavg) has another sensitivity"));
  }
  if (folds_late_updates()) {
    return absl::InvalidArgumentError(
        "--dp-noise-multiplier with --deadline-policy=fold is not supported: a folded late update would count in "
        "a round it was not sampled for; use --deadline-policy=drop");
  }
  if (!clip_update_norm.empty() && clip_update_norm != "off") {
    return absl::InvalidArgumentError(fl::StrCat(
        "--clip-update-norm=", clip_update_norm,
        " with --dp-noise-multiplier: differential privacy clips every update to --dp-clip-norm itself; drop "
        "--clip-update-norm"));
  }
  if (dp_clipping != "fixed" && dp_clipping != "adaptive") {
    return absl::InvalidArgumentError(
        fl::StrCat("--dp-clipping=", dp_clipping, " is not known; use fixed or adaptive"));
  }
  if (dp_clipping == "adaptive" && !(dp_clipped_count_stddev > dp_noise_multiplier / 2)) {
    return absl::InvalidArgumentError(
        fl::StrCat("--dp-clipping=adaptive needs --dp-clipped-count-stddev above --dp-noise-multiplier / 2 (",
                   dp_noise_multiplier / 2, "): part of the noise goes to the count of updates at or below C, and at ",
                   dp_clipped_count_stddev,
                   " none would be left for the update (Andrew et al. 2021 suggest about clients per round / 20)"));
  }
  return ValidatePrivacyMode();
}

absl::Status EngineConfig::ValidatePrivacyMode() const {
  auto refuse = [](std::string what) { return absl::InvalidArgumentError(std::move(what)); };
  if (dp_clipping == "adaptive" && (secagg_on() || dp_mode != "central")) {
    return refuse(fl::StrCat(
        "--dp-clipping=adaptive with ",
        secagg_on() ? "--secure-aggregation=secagg+" : fl::StrCat("--dp-mode=", dp_mode),
        " is not supported: adaptive clipping needs the number of updates at or below C, which only a server that "
        "clips every update itself can count; the clients clip here, so use --dp-clipping=fixed"));
  }
  if (secagg_on() && secagg_max_weight != 1) {
    return refuse(
        fl::StrCat("--dp-noise-multiplier with --secure-aggregation=secagg+ needs uniform weights "
                   "(--secagg-max-weight=1, not ",
                   secagg_max_weight,
                   "): the noise bounds what one clipped update adds to a mean in which every client counts "
                   "once; a client weighted by its examples could claim more"));
  }
  if (dp_mode != "distributed") return absl::OkStatus();
  if (!secagg_on()) {
    return refuse(
        "--dp-mode=distributed needs --secure-aggregation=secagg+: each client adds only a share of the noise, which "
        "hides its update only inside the masked sum; without secure aggregation use --dp-mode=central or local");
  }
  // The smallest round that can commit has the largest share per client (σ·C·scale/√n steps).
  const double n = std::max<double>(1, fit.min_clients);
  const double share_steps = dp_noise_multiplier * dp_clip_norm * secagg_scale / std::sqrt(n);
  if (share_steps > kMaxDistributedShareSteps) {
    return refuse(fl::StrCat("--dp-mode=distributed: each of --min-fit-clients=", fit.min_clients,
                             " clients would add discrete Gaussian noise of std ", share_steps,
                             " quantisation steps (sigma x C x --secagg-scale / sqrt(clients)), above the sampler's "
                             "2^20; lower --secagg-scale=",
                             secagg_scale, " or raise --min-fit-clients"));
  }
  // A coordinate of a clipped update is at most C; its share of noise must fit in the quantisation range too, or
  // the sum could wrap: 8 standard deviations leave a chance below 1e-15 per coordinate.
  const double needed = dp_clip_norm + 8 * share_steps / secagg_scale;
  if (secagg_range < needed) {
    return refuse(
        fl::StrCat("--dp-mode=distributed: --secagg-range=", secagg_range,
                   " leaves no room for the noise: a coordinate of an update clipped to --dp-clip-norm=", dp_clip_norm,
                   " plus 8 standard deviations of a client's noise share (", share_steps / secagg_scale,
                   " at --min-fit-clients=", fit.min_clients, ") needs --secagg-range of at least ", needed,
                   "; raise --secagg-range or lower --dp-clip-norm"));
  }
  return absl::OkStatus();
}

absl::Status EngineConfig::ValidateSecureAggregation() const {
  if (!secagg_on()) return absl::OkStatus();
  auto refuse = [](std::string what) { return absl::InvalidArgumentError(std::move(what)); };
  if (buffered()) {
    return refuse(
        "--secure-aggregation=secagg+ with --aggregation=buffered is not supported: a buffered step mixes updates of "
        "different model versions with staleness weights, which a sum of masked vectors cannot apply; use "
        "--aggregation=synchronous");
  }
  if (!aggregates_by_mean()) {
    return refuse(fl::StrCat("--secure-aggregation=secagg+ needs the mean of the updates: the aggregator '", aggregator,
                             "' (fedmedian, fedtrimmedavg) needs every update on its own, which secure aggregation "
                             "exists to hide; use --strategy fedavg (or fedprox, fedavgm, fedadam, fedyogi, "
                             "fedadagrad, nesterov)"));
  }
  if (folds_late_updates()) {
    return refuse(
        "--secure-aggregation=secagg+ with --deadline-policy=fold is not supported: a late masked update cannot be "
        "unmasked once its round's unmask stage is over; use --deadline-policy=drop");
  }
  if (!clip_update_norm.empty() && clip_update_norm != "off") {
    return refuse(fl::StrCat("--clip-update-norm=", clip_update_norm,
                             " with --secure-aggregation=secagg+: the server cannot see an update's norm; bound "
                             "updates with --secagg-range (each value is clipped to it) or with differential "
                             "privacy's client-side clipping (--dp-clip-norm)"));
  }
  if (uplink_codec_policy.size() > 0 && uplink_codec_policy != "fixed") {
    return refuse(fl::StrCat("--uplink-codec-policy=", uplink_codec_policy,
                             " with --secure-aggregation=secagg+: masked updates travel as 4-byte words in Z_2^32 "
                             "whatever the link; drop --uplink-codec-policy"));
  }
  secagg::QuantizationSpec spec{secagg_range, secagg_scale, secagg_max_weight};
  if (absl::Status s = secagg::ValidateQuantization(spec); !s.ok()) {
    return refuse(fl::StrCat("--secagg-range=", secagg_range, " --secagg-scale=", secagg_scale,
                             " --secagg-max-weight=", secagg_max_weight, ": ", fl::ToStd(s.message())));
  }
  // The most clients a round may mask together (the round's selection is capped at it, SyncRounds::StartRound): the
  // fewest a round commits with must fit, or no round could ever commit.
  if (const uint64_t most = secagg::MaxPopulation(spec); fit.min_clients > most) {
    return refuse(fl::StrCat("--secure-aggregation=secagg+: a round needs --min-fit-clients=", fit.min_clients,
                             " updates, but the quantised sum holds at most ", most, " at --secagg-range=",
                             secagg_range, " --secagg-scale=", secagg_scale, " --secagg-max-weight=", secagg_max_weight,
                             " without wrapping; lower the scale, the range or the weight cap"));
  }
  if (secagg_threshold != 0 && secagg_threshold < 2) {
    return refuse(fl::StrCat("--secagg-threshold=", secagg_threshold,
                             " must be 0 (the default, floor(k / 2) + 1) or at least 2: one share would reveal a "
                             "secret"));
  }
  return absl::OkStatus();
}

// RecordedConfigJson comes from the table of settings (settings.cc).

}  // namespace fl::server
