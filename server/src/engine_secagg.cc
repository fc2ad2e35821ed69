// SecureRound: the SecAgg+ stages of one round attempt on the engine's clock (engine_secagg.h).
#include "engine_secagg.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"
#include "fl/secagg/events.h"
#include "fl/secagg/quantize.h"

namespace fl::server::engine {

namespace {

constexpr int64_t kMsToNs = 1'000'000;

size_t StageIndex(secagg::Stage stage) { return static_cast<size_t>(stage); }

secagg::QuantizationSpec SpecOf(const EngineConfig& config) {
  return {config.secagg_range, config.secagg_scale, config.secagg_max_weight};
}

}  // namespace

uint64_t SecureRound::MaxParticipants(const EngineConfig& config) {
  return std::min<uint64_t>(secagg::MaxPopulation(SpecOf(config)), uint64_t{1} << 20);
}

absl::StatusOr<std::unique_ptr<SecureRound>> SecureRound::Create(const EngineConfig& config, uint64_t round,
                                                                 const std::vector<std::string>& participants,
                                                                 uint64_t dimension, int64_t now_ns) {
  secagg::ServerRoundConfig rc;
  rc.round = round;
  rc.dimension = dimension;
  rc.quantization = SpecOf(config);
  rc.graph.log_factor = config.secagg_log_factor;
  rc.graph.full_graph_max = config.secagg_full_graph_max;
  rc.graph.threshold = config.secagg_threshold;
  auto out = std::unique_ptr<SecureRound>(new SecureRound());
  for (size_t i = 0; i < participants.size(); ++i) {
    rc.participants.push_back(i + 1);
    out->numbers_[participants[i]] = i + 1;
  }
  absl::StatusOr<std::unique_ptr<secagg::ServerRound>> r =
      secagg::ServerRound::Create(std::move(rc), secagg::RandomSource::System());
  if (!r.ok()) return r.status();
  out->round_ = *std::move(r);
  out->participants_ = participants;
  out->views_.resize(participants.size());
  out->gone_.assign(participants.size(), false);
  out->round_number_ = round;
  out->dimension_ = dimension;
  out->stage_ns_ = int64_t{config.secagg_stage_deadline_ms} * kMsToNs;
  out->stage_opened_ns_ = now_ns;
  return out;
}

std::optional<uint64_t> SecureRound::NumberOf(const std::string& client) const {
  auto it = numbers_.find(client);
  if (it == numbers_.end()) return std::nullopt;
  return it->second;
}

absl::Status SecureRound::SetupFor(const std::string& client, fl::v1::SecAggSetup* setup) {
  std::optional<uint64_t> n = NumberOf(client);
  if (!n.has_value()) return absl::InternalError(fl::StrCat("client '", client, "' is not in the secure round"));
  views_[*n - 1][0].sent_ns = stage_opened_ns_;
  return round_->SetupFor(*n, setup);
}

absl::Status SecureRound::OnMessage(const std::string& client, const fl::v1::ClientMessage& message, int64_t now_ns) {
  std::optional<uint64_t> n = NumberOf(client);
  if (!n.has_value()) {
    return secagg::Refusal(secagg::SecurityEventKind::kNotInRound, absl::StatusCode::kPermissionDenied,
                           fl::StrCat("client '", client, "' sent a secure-aggregation message for round ",
                                      round_number_, ", which it is not in"));
  }
  // The library's messages name their sender; the session already says who it is, and the two must agree.
  auto claims = [&](uint64_t claimed) -> absl::Status {
    if (claimed == *n) return absl::OkStatus();
    return secagg::Refusal(secagg::SecurityEventKind::kNotInRound, absl::StatusCode::kPermissionDenied,
                           fl::StrCat("client '", client, "' (participant ", *n, " of round ", round_number_,
                                      ") sent a secure-aggregation message claiming to be participant ", claimed));
  };
  absl::Status s;
  secagg::Stage stage = secagg::Stage::kAdvertiseKeys;
  switch (message.kind_case()) {
    case fl::v1::ClientMessage::kSecaggKeys:
      s = claims(message.secagg_keys().client_id());
      if (s.ok()) s = round_->OnPublicKeys(message.secagg_keys());
      break;
    case fl::v1::ClientMessage::kSecaggShares:
      stage = secagg::Stage::kShareKeys;
      s = claims(message.secagg_shares().client_id());
      if (s.ok()) s = round_->OnShares(message.secagg_shares());
      break;
    case fl::v1::ClientMessage::kSecaggUnmask:
      stage = secagg::Stage::kUnmask;
      s = claims(message.secagg_unmask().client_id());
      if (s.ok()) s = round_->OnUnmaskResponse(message.secagg_unmask());
      break;
    default: return absl::InternalError("not a secure-aggregation message");
  }
  SecureStageView& view = views_[*n - 1][StageIndex(stage)];
  if (s.ok()) {
    view.answered_ns = now_ns;
  } else {
    view.refused = true;
    view.detail = fl::ToStd(s.message());
  }
  return s;
}

absl::Status SecureRound::UploadAdmitted(const std::string& client) const {
  std::optional<uint64_t> n = NumberOf(client);
  const std::vector<uint64_t> alive = round_->Alive();
  if (!n.has_value() || !std::binary_search(alive.begin(), alive.end(), *n)) {
    return secagg::Refusal(secagg::SecurityEventKind::kNotInRound, absl::StatusCode::kFailedPrecondition,
                           fl::StrCat("client '", client, "' is not, or no longer, in round ", round_number_,
                                      "'s secure aggregation (it missed a key stage)"));
  }
  if (round_->stage() != secagg::Stage::kMaskedUpload) {
    return secagg::Refusal(
        secagg::SecurityEventKind::kProtocolViolation, absl::StatusCode::kFailedPrecondition,
        fl::StrCat("a masked update of round ", round_number_, " arrived at stage ", secagg::StageName(round_->stage()),
                   "; upload only after ServerMessage.secagg_masking_start"));
  }
  return absl::OkStatus();
}

absl::Status SecureRound::OnMaskedUpload(const std::string& client, std::span<const uint8_t> payload, int64_t now_ns) {
  if (absl::Status s = UploadAdmitted(client); !s.ok()) return s;
  const uint64_t n = *NumberOf(client);
  const uint64_t words = dimension_ + 1;
  if (payload.size() != words * sizeof(uint32_t)) {
    return secagg::Refusal(secagg::SecurityEventKind::kWrongLength, absl::StatusCode::kInvalidArgument,
                           fl::StrCat("client '", client, "''s masked update is ", payload.size(), " bytes; round ",
                                      round_number_, "'s is ", words * sizeof(uint32_t), " (", words,
                                      " little-endian words: the model's ", dimension_, " and the weight)"));
  }
  // Words are copied a cache-sized piece at a time (the payload need not be aligned, and on a big-endian server
  // each word is byte-swapped): no buffer of the model's size beside the running sum.
  constexpr size_t kPiece = 16384;
  uint32_t piece[kPiece];
  for (uint64_t offset = 0; offset < words; offset += kPiece) {
    const size_t count = static_cast<size_t>(std::min<uint64_t>(kPiece, words - offset));
    const uint8_t* src = payload.data() + offset * sizeof(uint32_t);
    for (size_t i = 0; i < count; ++i) {
      piece[i] = uint32_t{src[4 * i]} | uint32_t{src[4 * i + 1]} << 8 | uint32_t{src[4 * i + 2]} << 16 |
                 uint32_t{src[4 * i + 3]} << 24;
    }
    if (absl::Status s = round_->OnMaskedWords(round_number_, n, offset, std::span<const uint32_t>(piece, count));
        !s.ok()) {
      // Only the first piece can be refused (a duplicate upload): a later one would leave words in the sum, which
      // CloseMaskedUpload turns into a failed round rather than a wrong one.
      views_[n - 1][2].refused = true;
      views_[n - 1][2].detail = fl::ToStd(s.message());
      return s;
    }
  }
  views_[n - 1][2].answered_ns = now_ns;
  return absl::OkStatus();
}

void SecureRound::Gone(const std::string& client) {
  if (std::optional<uint64_t> n = NumberOf(client); n.has_value()) gone_[*n - 1] = true;
}

int64_t SecureRound::stage_deadline_ns() const {
  switch (round_->stage()) {
    case secagg::Stage::kAdvertiseKeys:
    case secagg::Stage::kShareKeys:
    case secagg::Stage::kUnmask: return stage_opened_ns_ + stage_ns_;
    default: return 0;
  }
}

bool SecureRound::StageComplete() const {
  const size_t stage = StageIndex(round_->stage());
  for (uint64_t n : round_->Alive()) {
    if (views_[n - 1][stage].answered_ns == 0 && !gone_[n - 1]) return false;
  }
  return true;
}

void SecureRound::Drop(secagg::Stage stage, Progress& progress, std::string_view why) {
  for (uint64_t n : round_->DroppedAt(stage)) {
    SecureStageView& view = views_[n - 1][StageIndex(stage)];
    // A client that answered but lost too many neighbours is dropped with them (it could not be unmasked).
    const std::string reason = view.answered_ns != 0
                                   ? fl::StrCat("fewer than the threshold (", round_->graph().threshold,
                                                ") of its neighbours are left after ", secagg::StageName(stage))
                                   : std::string(why);
    if (view.detail.empty()) view.detail = reason;
    progress.dropped.emplace_back(participants_[n - 1],
                                  fl::StrCat("secure aggregation, round ", round_number_, ": ", reason));
  }
}

void SecureRound::Failed(Progress& progress) {
  progress.failure = round_->failure().empty() ? fl::StrCat("secure aggregation of round ", round_number_,
                                                            " failed (see the security events)")
                                               : round_->failure();
}

void SecureRound::CloseKeyStage(int64_t now_ns, Progress& progress) {
  const secagg::Stage stage = round_->stage();
  const bool advertise = stage == secagg::Stage::kAdvertiseKeys;
  absl::Status s = advertise ? round_->CloseAdvertiseKeys() : round_->CloseShareKeys();
  Drop(stage, progress,
       advertise ? "did not advertise its keys by --secagg-stage-deadline-ms" : "did not send its shares in time");
  if (!s.ok()) {
    Failed(progress);
    return;
  }
  for (uint64_t n : round_->Alive()) {
    Outgoing out{participants_[n - 1], {}};
    absl::Status m = advertise ? round_->NeighbourKeysFor(n, out.message.mutable_secagg_neighbour_keys())
                               : round_->MaskingStartFor(n, out.message.mutable_secagg_masking_start());
    if (!m.ok()) {
      progress.failure = fl::StrCat("secure aggregation: ", fl::ToStd(m.message()));
      return;
    }
    views_[n - 1][StageIndex(advertise ? secagg::Stage::kShareKeys : secagg::Stage::kMaskedUpload)].sent_ns = now_ns;
    progress.send.push_back(std::move(out));
  }
  stage_opened_ns_ = now_ns;
}

SecureRound::Progress SecureRound::Advance(int64_t now_ns) {
  Progress progress;
  for (;;) {
    const secagg::Stage stage = round_->stage();
    const bool key_stage = stage == secagg::Stage::kAdvertiseKeys || stage == secagg::Stage::kShareKeys;
    if (!key_stage && stage != secagg::Stage::kUnmask) break;
    if (!StageComplete() && now_ns < stage_deadline_ns()) break;
    if (key_stage) {
      CloseKeyStage(now_ns, progress);
    } else {
      FinishUnmask(now_ns, progress);
    }
    if (progress.failure.has_value()) break;
  }
  return progress;
}

SecureRound::Progress SecureRound::CloseMaskedUpload(int64_t now_ns) {
  Progress progress;
  if (round_->stage() != secagg::Stage::kMaskedUpload) {
    // A key stage still open when the round closed (every task ended early): nobody can upload any more.
    progress.failure = fl::StrCat("secure aggregation: round ", round_number_, " closed at stage ",
                                  secagg::StageName(round_->stage()), ", before any masked update could arrive");
    return progress;
  }
  absl::Status s = round_->CloseMaskedUpload();
  Drop(secagg::Stage::kMaskedUpload, progress, "no masked update by the round's close");
  if (!s.ok()) {
    Failed(progress);
    return progress;
  }
  const std::vector<uint64_t> alive = round_->Alive();
  survivors_ = alive.size();
  for (uint64_t n : alive) {
    Outgoing out{participants_[n - 1], {}};
    if (absl::Status m = round_->UnmaskRequestFor(n, out.message.mutable_secagg_unmask_request()); !m.ok()) {
      progress.failure = fl::StrCat("secure aggregation: ", fl::ToStd(m.message()));
      return progress;
    }
    views_[n - 1][StageIndex(secagg::Stage::kUnmask)].sent_ns = now_ns;
    progress.send.push_back(std::move(out));
  }
  stage_opened_ns_ = now_ns;
  return progress;
}

void SecureRound::FinishUnmask(int64_t /*now_ns*/, Progress& progress) {
  for (uint64_t n : round_->Alive()) {
    SecureStageView& view = views_[n - 1][StageIndex(secagg::Stage::kUnmask)];
    if (view.answered_ns == 0 && view.detail.empty()) view.detail = "no unmask answer by --secagg-stage-deadline-ms";
  }
  if (!round_->CloseUnmask().ok()) Failed(progress);
}

const std::array<SecureStageView, 4>* SecureRound::ViewOf(const std::string& client) const {
  std::optional<uint64_t> n = NumberOf(client);
  return n.has_value() ? &views_[*n - 1] : nullptr;
}

std::array<secagg::StageBytes, 4> SecureRound::BytesOf(const std::string& client) const {
  std::optional<uint64_t> n = NumberOf(client);
  return n.has_value() ? round_->BytesOf(*n) : std::array<secagg::StageBytes, 4>{};
}

}  // namespace fl::server::engine
