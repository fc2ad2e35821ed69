#include "fl/diloco/coord/state_transfer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "coordinator_wire.h"
#include "fl/core/checksum.h"
#include "fl/core/mutex.h"
#include "fl/core/str_cat.h"
#include "fl/instrumentation/island_records.h"
#include "fl/proto/convert.h"
#include "fl/rpc/grpc_server.h"
#include "fl/v1/islands.grpc.pb.h"

namespace fl::diloco {
namespace {

using instrumentation::HashHex;

}  // namespace

uint64_t PlainStateHash(std::span<const float> params, std::span<const float> optimizer_state) {
  std::vector<uint8_t> bytes((params.size() + optimizer_state.size()) * sizeof(float));
  if (!params.empty()) std::memcpy(bytes.data(), params.data(), params.size_bytes());
  if (!optimizer_state.empty()) {
    std::memcpy(bytes.data() + params.size_bytes(), optimizer_state.data(), optimizer_state.size_bytes());
  }
  return core::Checksum64(bytes);
}

// Synchronous service: a fetch may wait for its snapshot to be published, and transfers are rare (late
// joins, repairs), so a blocked thread of gRPC's pool is the simple and cheap choice here.
class StateService final : public fl::v1::IslandState::Service {
 public:
  explicit StateService(size_t keep) : keep_(std::max<size_t>(keep, 1)) {}

  void Publish(StateSnapshot snapshot) {
    auto shared = std::make_shared<const StateSnapshot>(std::move(snapshot));
    fl::MutexLock lock(mu_);
    snapshots_.push_back(std::move(shared));
    while (snapshots_.size() > keep_) snapshots_.pop_front();
    cv_.NotifyAll();
  }

  void Stop() {
    fl::MutexLock lock(mu_);
    stopping_ = true;
    cv_.NotifyAll();
  }

  uint64_t served() const {
    fl::MutexLock lock(mu_);
    return served_;
  }

  size_t waiting() const {
    fl::MutexLock lock(mu_);
    return waiting_;
  }

  grpc::Status FetchState(grpc::ServerContext* ctx, const fl::v1::FetchStateRequest* request,
                          grpc::ServerWriter<fl::v1::StateChunk>* writer) override {
    // Behind mutual TLS only islands copy the state: a client certificate of the same CA (fl-client://) is no
    // island's. Plaintext (--insecure) has nothing to check.
    if (std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
        auth != nullptr && auth->IsPeerAuthenticated()) {
      bool island = false;
      for (const grpc::string_ref& v : auth->FindPropertyValues("x509_subject_alternative_name")) {
        island = island || std::string_view(v.data(), v.size()).starts_with("fl-island://");
      }
      if (!island) {
        return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                            "the island state is served to islands only: present an island certificate "
                            "(fl-provision add-island, fl-island://<name>)");
      }
    }
    std::shared_ptr<const StateSnapshot> snapshot;
    {
      fl::MutexLock lock(mu_);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(request->wait_ms());
      auto find = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        for (const auto& s : snapshots_) {
          if (s->state_hash == request->expected_hash()) snapshot = s;
        }
        return snapshot != nullptr || stopping_ || ctx->IsCancelled();
      };
      if (!find()) {
        ++waiting_;
        while (!find() && std::chrono::steady_clock::now() < deadline) {
          cv_.WaitUntil(mu_, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(100)));
        }
        --waiting_;
      }
      if (snapshot == nullptr) {
        std::string held;
        for (const auto& s : snapshots_) {
          held += fl::StrCat(held.empty() ? "" : ", ", HashHex(s->state_hash), " (step ", s->key.step, ", fragment ",
                             s->key.fragment, ")");
        }
        return proto::ToGrpcStatus(
            grpc::StatusCode::NOT_FOUND,
            proto::MakeError(
                fl::v1::ERROR_CODE_WRONG_ROUND,
                fl::StrCat("no snapshot with state hash ", HashHex(request->expected_hash()), " within ",
                           request->wait_ms(), " ms; this island holds ", held.empty() ? std::string("none") : held),
                "expected_hash", "ask the coordinator for the current source (Rejoin)"));
      }
    }
    const uint32_t chunk =
        std::clamp<uint32_t>(request->max_chunk_bytes() == 0 ? proto::kDefaultChunkBytes : request->max_chunk_bytes(),
                             1024, proto::kMaxChunkBytes);
    fl::v1::StateChunk out;
    fl::v1::StateHeader* h = out.mutable_header();
    *h->mutable_key() = ToProto(snapshot->key);
    h->set_state_hash(snapshot->state_hash);
    h->set_image_bytes(snapshot->image.size());
    if (!writer->Write(out)) return grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away");
    for (size_t offset = 0; offset < snapshot->image.size(); offset += chunk) {
      const size_t n = std::min<size_t>(chunk, snapshot->image.size() - offset);
      out.Clear();
      out.set_data(snapshot->image.data() + offset, n);
      if (!writer->Write(out)) return grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away");
    }
    out.Clear();
    out.mutable_trailer()->set_image_checksum(core::Checksum64(snapshot->image));
    if (!writer->Write(out)) return grpc::Status(grpc::StatusCode::CANCELLED, "the reader went away");
    fl::MutexLock lock(mu_);
    ++served_;
    return grpc::Status::OK;
  }

 private:
  const size_t keep_;
  mutable fl::Mutex mu_;
  fl::CondVar cv_;
  std::deque<std::shared_ptr<const StateSnapshot>> snapshots_ ABSL_GUARDED_BY(mu_);  // oldest first
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t served_ ABSL_GUARDED_BY(mu_) = 0;
  size_t waiting_ ABSL_GUARDED_BY(mu_) = 0;  // fetches waiting for their snapshot to be published
};

struct StateServer::Impl {
  std::unique_ptr<StateService> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

StateServer::StateServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<StateServer>> StateServer::Start(const std::string& listen_address, size_t keep,
                                                                const std::optional<rpc::ServerTls>& tls) {
  auto impl = std::make_unique<Impl>();
  impl->service = std::make_unique<StateService>(keep);
  auto running = rpc::StartGrpcServer(impl->service.get(), listen_address, tls);
  if (!running.ok() && running.status().code() == absl::StatusCode::kInvalidArgument) return running.status();
  if (!running.ok()) {
    return absl::UnavailableError(fl::StrCat("state server: cannot listen on ", listen_address,
                                             ": the address is invalid or the port is in use"));
  }
  impl->server = std::move(running->server);
  impl->port = running->port;
  return std::unique_ptr<StateServer>(new StateServer(std::move(impl)));
}

StateServer::~StateServer() {
  impl_->service->Stop();
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  impl_->server->Wait();
}

void StateServer::Publish(StateSnapshot snapshot) { impl_->service->Publish(std::move(snapshot)); }
int StateServer::port() const { return impl_->port; }
std::string StateServer::endpoint() const { return fl::StrCat("127.0.0.1:", impl_->port); }
uint64_t StateServer::transfers_served() const { return impl_->service->served(); }
size_t StateServer::fetches_waiting() const { return impl_->service->waiting(); }

absl::StatusOr<StateSnapshot> FetchState(const std::string& endpoint, uint64_t expected_hash,
                                         const FetchOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds = rpc::ChannelCredentials(options.tls);
  if (!creds.ok()) return creds.status();
  if (options.tls.has_value()) {
    if (options.peer_island.empty()) {
      return absl::InvalidArgumentError(
          "FetchOptions.peer_island is empty: with TLS the source island's name is "
          "what its certificate is checked against");
    }
    // The name checked is the island's URI SAN, fl-island://<name>. gRPC splits the name it checks as host:port;
    // in brackets the whole URI is the host, and (holding ':') it is compared with the certificate's
    // subjectAltNames exactly, as an IP address would be. Only an island's certificate carries it.
    args.SetSslTargetNameOverride(fl::StrCat("[fl-island://", options.peer_island, "]"));
  }
  auto channel = grpc::CreateCustomChannel(endpoint, *creds, args);
  auto stub = fl::v1::IslandState::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(options.timeout));
  fl::v1::FetchStateRequest request;
  request.set_expected_hash(expected_hash);
  request.set_wait_ms(static_cast<uint32_t>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(options.wait_for_snapshot), 0, int64_t{24} * 3600 * 1000)));
  request.set_max_chunk_bytes(options.max_chunk_bytes);
  auto reader = stub->FetchState(&ctx, request);
  const std::string what = fl::StrCat("fetching state ", HashHex(expected_hash), " from ", endpoint);
  StateSnapshot snapshot;
  fl::v1::StateChunk chunk;
  bool have_header = false;
  bool have_trailer = false;
  uint64_t announced = 0;
  uint64_t checksum = 0;
  absl::Status protocol_error;
  while (reader->Read(&chunk)) {
    if (have_trailer) {
      protocol_error = absl::DataLossError(fl::StrCat(what, ": data after the trailer"));
      break;
    }
    if (chunk.has_header()) {
      if (have_header) {
        protocol_error = absl::DataLossError(fl::StrCat(what, ": a second header"));
        break;
      }
      have_header = true;
      snapshot.key = FromProto(chunk.header().key());
      snapshot.state_hash = chunk.header().state_hash();
      announced = chunk.header().image_bytes();
      snapshot.image.reserve(announced);
    } else if (chunk.part_case() == fl::v1::StateChunk::kData) {
      if (!have_header || snapshot.image.size() + chunk.data().size() > announced) {
        protocol_error = absl::DataLossError(
            fl::StrCat(what, ": data before the header or beyond the ", announced, " announced bytes"));
        break;
      }
      snapshot.image.insert(snapshot.image.end(), chunk.data().begin(), chunk.data().end());
    } else if (chunk.has_trailer()) {
      have_trailer = true;
      checksum = chunk.trailer().image_checksum();
    }
  }
  if (!protocol_error.ok()) {
    ctx.TryCancel();
    (void)reader->Finish();
    return protocol_error;
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) {
    const fl::v1::ErrorDetail detail = proto::ErrorFromGrpcStatus(status);
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        fl::StrCat(what, ": ", detail.message().empty() ? status.error_message() : detail.message()));
  }
  if (!have_header || !have_trailer || snapshot.image.size() != announced) {
    return absl::DataLossError(fl::StrCat(what, ": the transfer ended after ", snapshot.image.size(), " of ", announced,
                                          " bytes", have_trailer ? "" : " without a trailer"));
  }
  if (core::Checksum64(snapshot.image) != checksum) {
    return absl::DataLossError(
        fl::StrCat(what, ": the image's checksum does not match its bytes (damaged in transit)"));
  }
  if (snapshot.state_hash != expected_hash) {
    return absl::FailedPreconditionError(
        fl::StrCat(what, ": the peer sent the snapshot of state ", HashHex(snapshot.state_hash), " instead"));
  }
  uint64_t recomputed = 0;
  if (options.verify) {
    absl::StatusOr<uint64_t> h = options.verify(snapshot.image);
    if (!h.ok()) {
      return absl::Status(h.status().code(),
                          fl::StrCat(what, ": the image does not load: ", fl::ToStd(h.status().message())));
    }
    recomputed = *h;
  } else {
    recomputed = core::Checksum64(snapshot.image);
  }
  if (recomputed != expected_hash) {
    return absl::FailedPreconditionError(fl::StrCat(what, ": the received state hashes to ", HashHex(recomputed),
                                                    ", not the committed ", HashHex(expected_hash),
                                                    "; do not train on it (Rejoin to get another source)"));
  }
  return snapshot;
}

}  // namespace fl::diloco
