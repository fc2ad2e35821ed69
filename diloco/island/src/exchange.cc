#include "fl/diloco/island/exchange.h"

#include <chrono>
#include <utility>

#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/diloco/island/onebit_membership.h"
#include "fl/pki/pki.h"

namespace fl::diloco {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Exchanger::Exchanger(ExchangeConfig config, CoordinatorClient* client)
    : config_(std::move(config)), client_(client), thread_([this] { ThreadMain(); }) {}

Exchanger::~Exchanger() {
  {
    fl::MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

absl::Status Exchanger::Start(SyncKey key, std::vector<float> values) {
  fl::MutexLock lock(mu_);
  if (busy_) {
    return absl::FailedPreconditionError(
        fl::StrCat("exchange of sync (", key.step, ", ", key.fragment, ") started while another is in flight"));
  }
  busy_ = true;
  result_.reset();
  job_.emplace(key, std::move(values));
  cv_.NotifyAll();
  return absl::OkStatus();
}

bool Exchanger::in_flight() const {
  fl::MutexLock lock(mu_);
  return busy_;
}

ExchangeOutcome Exchanger::Wait() {
  const auto start = std::chrono::steady_clock::now();
  fl::MutexLock lock(mu_);
  if (!busy_) {
    ExchangeOutcome none;
    none.error = absl::FailedPreconditionError("Exchanger::Wait with no exchange in flight");
    return none;
  }
  cv_.Wait(mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return result_.has_value(); });
  ExchangeOutcome out = std::move(*result_);
  result_.reset();
  busy_ = false;
  out.wait_seconds = SecondsSince(start);
  return out;
}

void Exchanger::ThreadMain() {
  for (;;) {
    std::pair<SyncKey, std::vector<float>> job;
    {
      fl::MutexLock lock(mu_);
      cv_.Wait(mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || job_.has_value(); });
      if (stop_) return;
      job = std::move(*job_);
      job_.reset();
    }
    ExchangeOutcome out = RunExchange(job.first, std::move(job.second));
    {
      fl::MutexLock lock(mu_);
      result_ = std::move(out);
    }
    cv_.NotifyAll();
  }
}

absl::StatusOr<RingCurve> LoadRingCurve(const std::string& curve_dir, const std::vector<RingMember>& members,
                                        size_t self_index) {
  // Public keys are read for exactly this ring's members: the ring admits no key of an island outside it.
  auto file = [&](const std::string& id, const char* suffix) { return fl::StrCat(curve_dir, "/", id, suffix); };
  RingCurve curve;
  absl::StatusOr<std::string> secret = pki::ReadCurveKeyFile(file(members[self_index].id, ".curve.key"));
  if (!secret.ok()) return secret.status();
  curve.secret_key = *std::move(secret);
  for (const RingMember& m : members) {
    absl::StatusOr<std::string> pub = pki::ReadCurveKeyFile(file(m.id, ".curve.pub"));
    if (!pub.ok()) {
      return absl::Status(
          pub.status().code(),
          fl::StrCat("ring member '", m.id, "' has no usable CurveZMQ public key: ", pub.status().message(),
                     "; every island needs the .curve.pub of every other "
                     "(copy the provisioned islands/ folder's *.curve.pub to each island)"));
    }
    curve.public_keys.push_back(*std::move(pub));
  }
  return curve;
}

absl::Status Exchanger::EnsureRing(const std::vector<RingMember>& members, size_t self_index) {
  const uint64_t fingerprint = RingFingerprint(members);
  if (ring_ != nullptr && fingerprint == ring_fingerprint_) return absl::OkStatus();
  ring_.reset();  // releases the bound endpoint before the new ring binds it again
  RingOptions options;
  options.members = members;
  options.self = self_index;
  options.codec = config_.codec;
  options.error_feedback = config_.error_feedback;
  options.connections_per_peer = config_.connections_per_peer;
  options.timeout = config_.timeout;
  options.linger = absl::Milliseconds(500);
  options.sync_mode = config_.sync_mode;
  // Behind an emulated WAN link the others dial the link's front (our advertised endpoint); we bind behind it.
  if (!config_.bind_endpoint.empty() && config_.bind_endpoint != members[self_index].endpoint) {
    options.bind_endpoint = config_.bind_endpoint;
  }
  if (!config_.curve_dir.empty()) {
    absl::StatusOr<RingCurve> curve = LoadRingCurve(config_.curve_dir, members, self_index);
    if (!curve.ok()) return curve.status();
    options.curve = *std::move(curve);
  }
  absl::StatusOr<std::unique_ptr<RingAllReduce>> ring = RingAllReduce::Create(options);
  if (!ring.ok()) return ring.status();
  ring_ = std::move(*ring);
  ring_fingerprint_ = fingerprint;
  return absl::OkStatus();
}

absl::Status Exchanger::SetCodec(const std::string& codec_spec) {
  fl::MutexLock lock(mu_);
  if (busy_ || job_.has_value()) {
    return absl::FailedPreconditionError(
        fl::StrCat("cannot switch the ring to ", codec_spec, " while an exchange is in flight"));
  }
  if (ring_ != nullptr) {
    if (absl::Status s = ring_->SetCodec(codec_spec); !s.ok()) return s;
  } else if (absl::StatusOr<std::unique_ptr<core::Codec>> codec = core::MakeCodec(codec_spec); !codec.ok()) {
    return absl::InvalidArgumentError(
        fl::StrCat("ring codec '", codec_spec, "': ", fl::ToStd(codec.status().message())));
  }
  config_.codec = codec_spec;
  return absl::OkStatus();
}

void Exchanger::ResetRing() {
  fl::MutexLock lock(mu_);
  ring_.reset();
  ring_fingerprint_ = 0;
  window_.reset();
}

ExchangeOutcome Exchanger::RunExchange(SyncKey key, std::vector<float> values) {
  const auto start = std::chrono::steady_clock::now();
  ExchangeOutcome out;
  out.key = key;
  auto finish = [&](ExchangeOutcome::Kind kind) {
    out.kind = kind;
    out.total_seconds = SecondsSince(start);
    return std::move(out);
  };
  for (;;) {
    ++out.attempts;
    SyncPlan plan;
    uint64_t exchange_id = 0;
    if (window_.has_value()) {
      // A window's exchange: its ring is fixed; a failure ends the window (reported by the caller).
      plan = *window_;
      exchange_id = (plan.epoch << kWindowExchangeBits) + ++window_exchanges_;
    } else if (client_ == nullptr) {
      plan.key = key;
      plan.epoch = ++static_exchange_id_;
      plan.members = config_.static_peers;
      plan.self_index = config_.static_peers.size();
      for (size_t i = 0; i < plan.members.size(); ++i) {
        if (plan.members[i].id == config_.self_id) plan.self_index = i;
      }
    } else {
      absl::StatusOr<SyncPlan> begun = client_->BeginSync(key);
      if (!begun.ok()) {
        out.error = begun.status();
        return finish(IsRejoinNeeded(begun.status()) ? ExchangeOutcome::Kind::kRejoin : ExchangeOutcome::Kind::kFailed);
      }
      plan = std::move(*begun);
    }
    if (exchange_id == 0) exchange_id = plan.exchange_id();
    // The ring members BIND their endpoint: this leader binds its own configured endpoint whatever address
    // the others know it by.
    absl::Status s = EnsureRing(plan.members, plan.self_index);
    ExchangeStats stats;
    // Out of place: the ring writes the mean straight into `result` (no commit copy of the whole fragment)
    // and never writes `values`, which a retry reuses as they are.
    std::vector<float> result;
    if (s.ok()) {
      result.resize(values.size());
      s = ring_->AllReduce(exchange_id, key.fragment, std::span<const float>(values), std::span<float>(result),
                           ReduceOp::kMean, &stats);
    }
    out.bytes_sent += stats.bytes_sent;
    out.bytes_received += stats.bytes_received;
    out.exchange_seconds += stats.seconds;
    if (s.ok()) {
      out.values = std::move(result);
      out.ring_size = plan.members.size();
      out.plan = std::move(plan);
      return finish(ExchangeOutcome::Kind::kAveraged);
    }
    if (client_ == nullptr) {
      out.error = s;
      return finish(ExchangeOutcome::Kind::kFailed);
    }
    // A ring that failed may hold half a message from a dead peer: build a fresh one for the next epoch.
    ring_.reset();
    ring_fingerprint_ = 0;
    if (window_.has_value()) {
      out.error = s;
      return finish(ExchangeOutcome::Kind::kFailed);
    }
    SyncStats failed_stats;
    failed_stats.exchange_seconds = stats.seconds;
    failed_stats.bytes_sent = stats.bytes_sent;
    failed_stats.bytes_received = stats.bytes_received;
    absl::StatusOr<Verdict> verdict =
        client_->ReportSyncFailed(plan, s, VanishedMemberFromError(s, plan), failed_stats);
    if (!verdict.ok()) {
      out.error = verdict.status();
      return finish(IsRejoinNeeded(verdict.status()) ? ExchangeOutcome::Kind::kRejoin : ExchangeOutcome::Kind::kFailed);
    }
    if (verdict->kind == VerdictKind::kRepair) {
      out.source = verdict->source;
      return finish(ExchangeOutcome::Kind::kRepair);
    }
    // kRetry: a new epoch (without the vanished island); `values` is untouched by the failed exchange.
  }
}

absl::StatusOr<Verdict> Exchanger::Commit(const ExchangeOutcome& outcome, uint64_t state_hash, const SyncStats& stats) {
  if (client_ == nullptr) {
    Verdict v;
    v.kind = VerdictKind::kCommit;
    v.majority_hash = state_hash;
    return v;
  }
  if (!outcome.plan.has_value()) return absl::FailedPreconditionError("Commit without a successful exchange");
  return client_->ReportSyncDone(*outcome.plan, state_hash, stats);
}

absl::StatusOr<SyncPlan> Exchanger::BeginWindow(SyncKey key) {
  if (client_ == nullptr) return absl::FailedPreconditionError("membership windows need a coordinator");
  if (in_flight()) {
    return absl::FailedPreconditionError(
        fl::StrCat("window (", key.step, ", ", key.fragment, ") begun while an exchange is in flight"));
  }
  window_.reset();
  absl::StatusOr<SyncPlan> plan = client_->BeginSync(key);
  if (!plan.ok()) return plan.status();
  if (absl::Status s = EnsureRing(plan->members, plan->self_index); !s.ok()) return s;
  window_ = *plan;
  window_exchanges_ = 0;
  return plan;
}

absl::Status Exchanger::FoldResiduals(OneBitAdam& adam, ExchangeStats* stats) {
  if (!window_.has_value() || ring_ == nullptr) {
    return absl::FailedPreconditionError("FoldResiduals outside a membership window with a ring");
  }
  const uint64_t id = (window_->epoch << kWindowExchangeBits) + ++window_exchanges_;
  absl::Status s = FoldResidualsIntoMomentum(*ring_, id, adam, stats);
  if (!s.ok()) {
    ring_.reset();  // as after any failed exchange: it may hold half a message
    ring_fingerprint_ = 0;
  }
  return s;
}

void Exchanger::DropResiduals() {
  if (ring_ == nullptr) return;
  ring_->ResetResidual(kOneBitGradientKey);
  ring_->ResetResidual(kOneBitMomentumKey);
}

std::vector<float> Exchanger::MomentumResidual() const {
  if (ring_ == nullptr) return {};
  std::span<const float> r = ring_->Residual(kOneBitMomentumKey);
  return std::vector<float>(r.begin(), r.end());
}

absl::StatusOr<Verdict> Exchanger::ReportWindowDone(uint64_t state_hash, const SyncStats& stats) {
  if (!window_.has_value()) return absl::FailedPreconditionError("ReportWindowDone outside a membership window");
  const SyncPlan plan = *std::exchange(window_, std::nullopt);
  return client_->ReportSyncDone(plan, state_hash, stats);
}

absl::StatusOr<Verdict> Exchanger::ReportWindowFailed(const absl::Status& error, const SyncStats& stats) {
  if (!window_.has_value()) return absl::FailedPreconditionError("ReportWindowFailed outside a membership window");
  const SyncPlan plan = *std::exchange(window_, std::nullopt);
  return client_->ReportSyncFailed(plan, error, VanishedMemberFromError(error, plan), stats);
}

}  // namespace fl::diloco
