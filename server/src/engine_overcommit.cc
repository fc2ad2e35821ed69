// Stragglers in synchronous rounds (docs/round-engine.md, "Over-commitment and deadline policies"):
//   - over-commitment: a round selects ceil(F * K) clients, commits with the first K accepted updates and cancels
//     the other tasks (the cancel reaches the client, which stops training between batches and uploads nothing);
//     their client_rounds rows say 'cancelled';
//   - deadline policies: a round commits at its deadline with at least min_fit_clients updates (as it always did);
//     an update that arrives after its round committed is either dropped (recorded 'late', the default) or, with
//     --deadline-policy fold, validated, kept, and folded into the next committed round's aggregate with the
//     weight n_k * (1 + tau)^-a (a = --late-discount, tau = model versions between the update's base and the model
//     it is applied to); its row becomes 'folded' with the round that took it.
// The shared engine files call these through one-line hooks (StartRound, Advance, CloseRound, HandleUploadStart,
// AcceptUpdate).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/core/tensor_spec.h"
#include "fl/server/round_engine.h"

#include "engine_internal.h"

namespace fl::server {

using namespace engine_internal;  // NOLINT: the engine's own helpers
using instrumentation::ClientOutcome;

RoundEngine::Core::Stragglers& RoundEngine::Core::StragglerState() {
  if (stragglers_ == nullptr) stragglers_ = std::make_unique<Stragglers>();
  return *stragglers_;
}

uint32_t RoundEngine::Core::OvercommitSize(uint32_t k, uint32_t available) {
  Stragglers& s = StragglerState();
  s.target = {round_ + 1, attempt_, 0};
  if (config_.overcommit <= 1.0) return k;
  // The epsilon keeps 1.3 x 10 (13.000000000000002 in binary) at 13.
  const double by_factor = std::ceil(config_.overcommit * static_cast<double>(k) - 1e-9);
  const auto wanted = static_cast<uint32_t>(std::min<double>(available, by_factor));
  if (wanted <= k) return k;  // every available client is selected anyway: nothing to cancel
  s.target.k = k;
  return wanted;
}

bool RoundEngine::Core::CommitTargetReached() const {
  if (stragglers_ == nullptr || current_ == nullptr || current_->evaluation) return false;
  const Stragglers::Target& t = stragglers_->target;
  return t.k > 0 && t.round == current_->round && t.attempt == current_->attempt && current_->accepted >= t.k;
}

void RoundEngine::Core::CancelSurplusTasks() {
  if (!CommitTargetReached()) return;
  RoundState& r = *current_;
  const std::string reason = fl::StrCat("round ", r.round, " committed with its first ", stragglers_->target.k,
                                        " updates (over-commitment, --overcommit ", config_.overcommit, ")");
  uint32_t cancelled = 0;
  for (const std::string& id : r.task_ids) {
    TaskInfo& task = *tasks_.at(id);
    if (task.closed) continue;
    task.closed = true;
    task.outcome = ClientOutcome::kCancelled;
    task.closed_why = reason;
    ++cancelled;
    instrumentation::ClientRoundRecord rec = TaskRow(task);
    rec.outcome = ClientOutcome::kCancelled;
    if (ClientInfo* c = clients_.Find(task.client_id); c != nullptr) {
      ClientInfo& client = *c;
      if (client.open_task == task.id) client.open_task.clear();
      if (client.session != nullptr) {
        fl::v1::ServerMessage cancel;
        cancel.set_seq(++client.server_seq);
        cancel.mutable_cancel()->set_task_id(task.id);
        cancel.mutable_cancel()->set_reason(reason);
        client.session->Send(std::move(cancel));
      }
      Notify([&](EngineObserver& o) { o.OnUpdateOutcome(ClientOutcome::kCancelled, "", rec, client.join); });
    }
    r.client_rows.push_back(std::move(rec));
  }
  if (cancelled > 0) spdlog::info("{}: {} task(s) cancelled", reason, cancelled);
}

bool RoundEngine::Core::LateUploadAdmitted(const TaskInfo& task) const {
  return config_.folds_late_updates() && stragglers_ != nullptr && task.closed &&
         stragglers_->foldable.contains(task.id);
}

std::optional<fl::v1::UploadUpdateResponse> RoundEngine::Core::FoldLateUpdate(
    UploadDoneEvent& e, TaskInfo& task, const instrumentation::ClientRoundRecord& rec) {
  if (task.outcome == ClientOutcome::kCancelled) {
    // An upload already under way when over-commitment cancelled its task: the row stays 'cancelled'.
    return Verdict(task.id, fl::v1::UPDATE_OUTCOME_LATE,
                   proto::MakeError(fl::v1::ERROR_CODE_LATE,
                                    fl::StrCat("task '", task.id, "' was cancelled: round ", task.round,
                                               " committed with the updates that came first (over-commitment)")));
  }
  if (!LateUploadAdmitted(task)) return std::nullopt;
  auto f = stragglers_->foldable.find(task.id);
  const uint64_t base = f->second.base_model_version;
  stragglers_->foldable.erase(f);  // one update per task
  const fl::v1::UpdateHeader& h = e.header;
  const std::string source = fl::StrCat("late update from client '", task.client_id, "' for round ", task.round);
  // Refused late updates keep the 'late' row their round's commit wrote; the verdict and the log say why.
  auto refuse = [&](fl::v1::ErrorCode code, std::string_view why) {
    spdlog::warn("{} not folded: {}", source, why);
    return Rejected(task.id, code, fl::StrCat("late update not folded into a later round: ", why));
  };
  if (h.kind() != fl::v1::UPDATE_KIND_DELTA) {
    return refuse(fl::v1::ERROR_CODE_MALFORMED,
                  "only a delta (pseudo-gradient) can be folded: a full model's difference to the model it was "
                  "trained from cannot be formed once the global model moved on");
  }
  if (h.num_examples() == 0) return refuse(fl::v1::ERROR_CODE_MALFORMED, "it covers 0 examples");
  if (h.model_fingerprint() != model_.spec()->fingerprint()) {
    return refuse(fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH, "it is for another model");
  }
  if (ClientInfo* c = clients_.Find(task.client_id); c != nullptr) {
    if (std::string w = PhaseWindowProblem(*c, h.timings(), task.dispatched_ns, e.done_server_ns); !w.empty()) {
      return refuse(fl::v1::ERROR_CODE_MALFORMED, fl::StrCat("update refused: ", w));
    }
  }
  // The codec the header named, which its upload's admission checked against the one the task asked for.
  auto codec = core::MakeCodec(h.codec());
  if (!codec.ok()) return refuse(fl::v1::ERROR_CODE_UNSUPPORTED_CODEC, fl::ToStd(codec.status().message()));
  std::vector<float> values(model_.spec()->num_elements());
  absl::Status s = (*codec)->Decode(e.payload, values, kVerifiedUpload);
  if (s.ok()) s = core::CheckFinite(values, source, model_.spec().get());
  if (!s.ok()) {
    const bool checksum = s.code() == absl::StatusCode::kDataLoss;
    return refuse(checksum ? fl::v1::ERROR_CODE_CHECKSUM_MISMATCH : fl::v1::ERROR_CODE_NON_FINITE,
                  fl::ToStd(s.message()));
  }
  task.outcome = ClientOutcome::kFolded;  // its row is replaced at the commit that takes it
  Stragglers::PendingFold fold;
  fold.task_id = task.id;
  fold.values = std::move(values);
  fold.examples = static_cast<double>(h.num_examples());
  fold.fingerprint = h.model_fingerprint();
  fold.base_model_version = base;
  fold.row = rec;
  stragglers_->pending.push_back(std::move(fold));
  spdlog::info("{}: kept, to be folded into the next committed round (model version {} -> {} so far)", source, base,
               model_.version());
  return Verdict(task.id, fl::v1::UPDATE_OUTCOME_ACCEPTED);
}

std::vector<instrumentation::ClientRoundRecord> RoundEngine::Core::FoldPendingInto(RoundState& r) {
  std::vector<instrumentation::ClientRoundRecord> rows;
  if (stragglers_ == nullptr) return rows;
  for (Stragglers::PendingFold& p : stragglers_->pending) {
    // tau: model versions between the one the update was trained from and the one this aggregate is applied to.
    const uint64_t tau = model_.version() > p.base_model_version ? model_.version() - p.base_model_version : 0;
    const double discount = std::pow(1.0 + static_cast<double>(tau), -config_.late_discount);
    // The aggregator's errors say "update from <sender>".
    const std::string sender = fl::StrCat("client '", p.row.client_id, "' for round ", p.row.round,
                                          " (late, folded into round ", r.round, ", staleness ", tau, ")");
    const std::string source = fl::StrCat("late update from ", sender);
    if (absl::Status s = r.aggregator->Add(p.values, p.examples * discount, p.fingerprint, sender); !s.ok()) {
      // A weight below the aggregator's least (a very old update, a steep discount) or a value out of range:
      // the row stays 'late'.
      spdlog::warn("{} not folded: {}", source, fl::ToStd(s.message()));
      continue;
    }
    instrumentation::ClientRoundRecord row = std::move(p.row);
    row.outcome = ClientOutcome::kFolded;
    row.base_model_version = static_cast<int64_t>(p.base_model_version);
    row.staleness = static_cast<int64_t>(tau);
    row.staleness_weight = discount;
    row.folded_into_round = static_cast<int64_t>(r.round);
    if (ClientInfo* c = clients_.Find(row.client_id); c != nullptr) {
      Notify([&](EngineObserver& o) { o.OnUpdateOutcome(ClientOutcome::kFolded, "", row, c->join); });
    }
    rows.push_back(std::move(row));
  }
  stragglers_->pending.clear();
  if (!rows.empty()) spdlog::info("round {}: {} late update(s) folded in", r.round, rows.size());
  return rows;
}

void RoundEngine::Core::NoteFoldableTasks(const RoundState& r) {
  if (!config_.folds_late_updates()) return;
  Stragglers& s = StragglerState();
  // A task the engine forgot (rounds long past) cannot upload any more.
  std::erase_if(s.foldable, [&](const auto& f) { return !tasks_.contains(f.first); });
  for (const std::string& id : r.task_ids) {
    const TaskInfo& t = *tasks_.at(id);
    if (t.kind != fl::v1::TASK_KIND_TRAIN || t.answered || !t.outcome.has_value()) continue;
    if (*t.outcome != ClientOutcome::kLate && *t.outcome != ClientOutcome::kDropped) continue;
    // Called after the commit's version bump: the task was given the version before it.
    s.foldable[id] = {model_.version() - 1};
  }
}

}  // namespace fl::server
