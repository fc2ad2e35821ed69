#include "round_work.h"

#include <cstring>
#include <string>

#include "fl/client/synthetic_trainer.h"
#include "fl/core/aggregator.h"
#include "fl/core/checksum.h"
#include "fl/core/codec.h"
#include "fl/core/server_optimizer.h"
#include "fl/core/str_cat.h"
#include "fl/core/tensor_spec.h"

namespace fl::bench {
namespace {

constexpr uint64_t kExamplesPerClient = 600;  // the update's FedAvg weight (any positive count)

// Writes every page of `bytes`, so that the first round does not pay for the page faults of memory that the
// product would have reused from its previous round.
void Touch(std::vector<uint8_t>& bytes) { std::memset(bytes.data(), 0, bytes.size()); }

std::span<float> Body(std::vector<uint8_t>& payload) {
  return {reinterpret_cast<float*>(payload.data() + core::kCodecHeaderBytes),
          (payload.size() - core::kCodecHeaderBytes) / sizeof(float)};
}

struct Client {
  std::unique_ptr<client::SyntheticTrainer> trainer;
  std::vector<uint8_t> download;  // header + body; the body is the client's copy of the global model
  std::vector<uint8_t> upload;
  core::TransferChecksum download_sum;
  std::atomic<uint64_t> upload_digest{0};  // what the client's trailer would carry
  uint64_t round = 0;
};

struct Server {
  std::vector<uint8_t> upload;
  core::TransferChecksum sum;
};

}  // namespace

struct NecessaryWork::State {
  uint64_t num_params = 0;
  std::shared_ptr<const core::ModelSpec> spec;
  std::unique_ptr<core::Codec> fp32;
  std::vector<float> global;
  std::vector<uint8_t> published;  // the global model as fl-server publishes it (fp32, body checksum)
  uint64_t published_digest = 0;   // its XXH3, sent in the download's trailer
  std::unique_ptr<core::Aggregator> aggregator;
  std::unique_ptr<core::ServerOptimizer> optimizer;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::unique_ptr<Server>> uploads;
  uint64_t round = 1;

  absl::Status Publish() {
    if (absl::Status s = fp32->Encode(global, &published); !s.ok()) return s;
    published_digest = core::TransferChecksum64(published);
    return absl::OkStatus();
  }
};

NecessaryWork::NecessaryWork(std::unique_ptr<State> state) : s_(std::move(state)) {}
NecessaryWork::~NecessaryWork() = default;

absl::StatusOr<std::unique_ptr<NecessaryWork>> NecessaryWork::Create(int clients, uint64_t num_params) {
  if (clients < 1 || num_params < 1) {
    return absl::InvalidArgumentError(
        fl::StrCat("round work needs at least one client and one parameter; got ", clients, " and ", num_params));
  }
  auto s = std::make_unique<State>();
  s->num_params = num_params;
  auto codec = core::MakeCodec(core::CodecKind::kFp32);
  if (!codec.ok()) return codec.status();
  s->fp32 = std::move(*codec);
  // The server's model: the synthetic trainer's spec and initial values, as fl-server adopts them from a client.
  client::SyntheticTrainer first(num_params, kExamplesPerClient, /*seed=*/1);
  s->spec = std::make_shared<const core::ModelSpec>(first.spec());
  s->global.resize(num_params);
  if (absl::Status st = first.GetParameters(s->global); !st.ok()) return st;
  auto aggregator = core::MakeAggregator("mean", s->spec);
  if (!aggregator.ok()) return aggregator.status();
  s->aggregator = std::move(*aggregator);
  auto optimizer = core::MakeServerOptimizer("fedavg", num_params);
  if (!optimizer.ok()) return optimizer.status();
  s->optimizer = std::move(*optimizer);
  if (absl::Status st = s->Publish(); !st.ok()) return st;

  const size_t bytes = s->published.size();
  for (int i = 0; i < clients; ++i) {
    auto c = std::make_unique<Client>();
    c->trainer = std::make_unique<client::SyntheticTrainer>(num_params, kExamplesPerClient, /*seed=*/1);
    c->download.resize(bytes);
    c->upload.resize(bytes);
    Touch(c->download);
    Touch(c->upload);
    s->clients.push_back(std::move(c));
  }
  for (int i = 0; i < clients; ++i) {
    auto u = std::make_unique<Server>();
    u->upload.resize(bytes);
    Touch(u->upload);
    s->uploads.push_back(std::move(u));
  }
  // The aggregator's accumulators, allocated by its first update: one round's worth outside the clock.
  std::vector<uint8_t> zero(bytes);
  std::memcpy(zero.data(), s->published.data(), core::kCodecHeaderBytes);
  if (absl::Status st = core::SealFp32Payload(zero); !st.ok()) return st;
  if (absl::Status st = s->aggregator->AddEncoded(*s->fp32, zero, 1.0, s->spec->fingerprint(), "warm-up"); !st.ok()) {
    return st;
  }
  s->aggregator->Reset();
  return std::unique_ptr<NecessaryWork>(new NecessaryWork(std::move(s)));
}

uint64_t NecessaryWork::payload_bytes() const { return s_->published.size(); }

std::span<const uint8_t> NecessaryWork::ServerDownload() const { return s_->published; }

std::span<uint8_t> NecessaryWork::ClientDownloadBuffer(int i) {
  Client& c = *s_->clients[static_cast<size_t>(i)];
  c.download_sum.Reset();
  return c.download;
}

void NecessaryWork::ClientReceived(int i, std::span<const uint8_t> bytes) {
  s_->clients[static_cast<size_t>(i)]->download_sum.Update(bytes);
}

absl::StatusOr<std::span<const uint8_t>> NecessaryWork::ClientUpload(int i) {
  Client& c = *s_->clients[static_cast<size_t>(i)];
  const std::string who = fl::StrCat("client ", i);
  // The download: its transfer checksum (the trailer's), its header, its values.
  if (c.download_sum.Digest() != s_->published_digest) {
    return absl::DataLossError(fl::StrCat(who, ": the download's XXH3 does not match the published model's"));
  }
  auto header = core::PeekPayloadHeader(std::span(c.download).first(core::kCodecHeaderBytes), c.download.size());
  if (!header.ok()) return header.status();
  const std::span<float> global = Body(c.download);
  if (absl::Status s = core::CheckFinite(global, "the downloaded model", s_->spec.get()); !s.ok()) return s;
  // Training: the synthetic trainer's pass, as fl-client runs it.
  training::TrainOptions options;
  options.seed = ++c.round * 7919 + static_cast<uint64_t>(i);
  auto trained = c.trainer->Train(global, options);
  if (!trained.ok()) return trained.status();
  // The update, computed into the payload's body and sealed there (session.cc's fp32 path).
  const std::span<float> body = Body(c.upload);
  if (absl::Status s = c.trainer->GetParameters(body); !s.ok()) return s;
  for (size_t k = 0; k < body.size(); ++k) body[k] = global[k] - body[k];
  if (absl::Status s = core::SealFp32Payload(c.upload, {.body_checksum = false}); !s.ok()) return s;
  c.upload_digest.store(core::TransferChecksum64(c.upload), std::memory_order_release);
  return std::span<const uint8_t>(c.upload);
}

std::span<uint8_t> NecessaryWork::ServerUploadBuffer(int i) {
  Server& u = *s_->uploads[static_cast<size_t>(i)];
  u.sum.Reset();
  return u.upload;
}

void NecessaryWork::ServerReceived(int i, std::span<const uint8_t> bytes) {
  s_->uploads[static_cast<size_t>(i)]->sum.Update(bytes);
}

absl::Status NecessaryWork::ServerUploadDone(int i) {
  Server& u = *s_->uploads[static_cast<size_t>(i)];
  const std::string who = fl::StrCat("client ", i);
  // The client computed its digest before its first byte was sent, so it is there by now.
  if (u.sum.Digest() != s_->clients[static_cast<size_t>(i)]->upload_digest.load(std::memory_order_acquire)) {
    return absl::DataLossError(fl::StrCat(who, ": the upload's XXH3 does not match the client's"));
  }
  return s_->aggregator->AddEncoded(*s_->fp32, u.upload, static_cast<double>(kExamplesPerClient),
                                    s_->spec->fingerprint(), who, {.transfer_verified = true});
}

absl::Status NecessaryWork::ServerFinish() {
  // engine_rounds.cc: StepGlobalModel, then PublishPayload.
  auto pseudo_grad = s_->aggregator->Finish();
  if (!pseudo_grad.ok()) return pseudo_grad.status();
  if (absl::Status s = s_->optimizer->Step(s_->global, *pseudo_grad); !s.ok()) return s;
  s_->aggregator->Reset();
  ++s_->round;
  return s_->Publish();
}

}  // namespace fl::bench
