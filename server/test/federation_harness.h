// Test harness of the server's end-to-end tests (federation_test, tasks_test): a real engine, gRPC service
// and records database on loopback, real fl-client sessions with the SyntheticTrainer, and a raw fl.v1 client
// for what a well-behaved session never sends.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "fl/client/session.h"
#include "fl/client/synthetic_trainer.h"
#include "fl/core/checksum.h"
#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_store.h"
#include "fl/instrumentation/server_metrics.h"
#include "fl/proto/chunk_reader.h"
#include "fl/proto/convert.h"
#include "fl/server/checkpoint.h"
#include "fl/server/round_engine.h"
#include "fl/server/service.h"
#include "fl/rpc/grpc_server.h"
#include "fl/testing/prometheus_server.h"
#include "fl/v1/federation.grpc.pb.h"

namespace fl::server::test_harness {

using instrumentation::RecordStore;

constexpr uint64_t kParams = 5000;

inline EngineConfig SmallConfig(const std::string& checkpoint_dir) {
  EngineConfig c;
  c.experiment_name = "test";
  c.num_rounds = 2;
  c.fit = {1.0, 3, 3};
  c.round_deadline_ms = 20000;
  c.evaluate_deadline_ms = 20000;
  c.heartbeat_interval_ms = 200;
  c.train.set_local_epochs(1);
  c.train.set_batch_size(8);
  c.train.set_learning_rate(0.1);
  c.train.set_optimizer("sgd");
  c.checkpoint_dir = checkpoint_dir;
  c.keep_checkpoints = 10;
  return c;
}

// A server (engine + gRPC service + records) on a free loopback port.
class TestServer {
 public:
  // `tls`: serve mutual TLS instead of plaintext (tls_test).
  TestServer(EngineConfig config, const std::string& db, RoundEngine::StartPoint start = {},
             instrumentation::ServerMetrics* metrics = nullptr, const std::optional<rpc::ServerTls>& tls = std::nullopt,
             const pki::RevocationWatcher* revocation = nullptr) {
    records_ = *RecordStore::Open(db);
    engine_ = std::make_unique<RoundEngine>(std::move(config), records_.get(), std::move(start));
    engine_->SetMetrics(metrics);
    EXPECT_TRUE(engine_->Start().ok());
    service_ = std::make_unique<FederationService>(engine_.get(), revocation);
    auto running = rpc::StartGrpcServer(service_.get(), "127.0.0.1:0", tls);
    EXPECT_TRUE(running.ok()) << running.status();
    server_ = std::move(running->server);
    port_ = running->port;
  }
  ~TestServer() { Stop(); }

  std::string address() const { return fl::StrCat("127.0.0.1:", port_); }
  RoundEngine& engine() { return *engine_; }
  EngineResult Wait() { return engine_->Wait(); }
  void Stop() {
    if (server_ == nullptr) return;
    engine_->Post(ShutdownEvent{"test over"});
    engine_->Wait();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    engine_->Stop();
    server_.reset();
    (void)records_->Close();
  }

 private:
  std::unique_ptr<RecordStore> records_;
  std::unique_ptr<RoundEngine> engine_;
  std::unique_ptr<FederationService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

struct RunningClient {
  std::unique_ptr<client::SyntheticTrainer> trainer;
  std::unique_ptr<client::FederatedClient> session;
  std::thread thread;
  absl::Status result;
  ~RunningClient() {
    if (thread.joinable()) {
      session->Stop();
      thread.join();
    }
  }
};

// The header of an fp32 delta of the synthetic model (kParams values) for `task`: what a well-behaved client
// sends, for tests to change the one field they are about. payload_bytes is the fp32 payload's size.
inline fl::v1::UpdateHeader DeltaHeader(const std::string& client_id, const std::string& token,
                                        const fl::v1::Task& task, uint64_t num_examples) {
  fl::v1::UpdateHeader h;
  h.set_client_id(client_id);
  h.set_session_token(token);
  h.set_task_id(task.task_id());
  h.set_round(task.round());
  h.set_base_model_version(task.model_version());
  h.set_model_fingerprint(client::SyntheticTrainer(kParams, 10, 1).spec().fingerprint());
  h.set_kind(fl::v1::UPDATE_KIND_DELTA);
  h.set_num_examples(num_examples);
  h.set_codec("fp32");
  h.set_payload_bytes((*core::MakeCodec("fp32"))->EncodedSize(kParams));
  return h;
}

// A start point whose model is the SyntheticTrainer's for `seed`: the experiment's model is fixed from the
// start, so tests do not depend on which client happens to join first.
inline RoundEngine::StartPoint InitialModel(uint64_t seed) {
  client::SyntheticTrainer trainer(kParams, 1, seed);
  Checkpoint ckpt;
  ckpt.spec = trainer.spec();
  ckpt.model_name = trainer.model_name();
  ckpt.values.resize(kParams);
  EXPECT_TRUE(trainer.GetParameters(ckpt.values).ok());
  RoundEngine::StartPoint start;
  start.checkpoint = std::move(ckpt);
  return start;
}

// `task` is what the client's SyntheticTrainer reports (and evaluates as, see SyntheticTrainer::Evaluate).
inline std::unique_ptr<RunningClient> StartClient(const std::string& address, const std::string& name, uint64_t seed,
                                                  const std::string& link = "ethernet", int64_t clock_skew_ns = 0,
                                                  uint32_t train_ms = 0, const std::string& task = "classification",
                                                  const std::optional<client::ClientTls>& tls = std::nullopt) {
  auto c = std::make_unique<RunningClient>();
  c->trainer = std::make_unique<client::SyntheticTrainer>(kParams, 100 + seed, seed, train_ms, task);
  client::ClientOptions o;
  o.server_address = address;
  o.client_name = name;
  o.device.set_device_class("test");
  o.link.set_kind(*proto::ParseLinkKind(link));
  o.give_up_after_ms = 20000;
  o.initial_backoff_ms = 50;
  o.max_backoff_ms = 500;
  o.clock_skew_ns = clock_skew_ns;
  o.tls = tls;
  c->session = std::make_unique<client::FederatedClient>(o, c->trainer.get());
  RunningClient* raw = c.get();
  c->thread = std::thread([raw] { raw->result = raw->session->Run(); });
  return c;
}

inline void StopClient(RunningClient& c) {
  c.session->Stop();
  if (c.thread.joinable()) c.thread.join();
}

// A raw fl.v1 client for the tests that must send what a well-behaved FederatedClient never would.
class RawClient {
 public:
  // `credentials`: TLS ones for a raw client of a TLS server (tls_test).
  explicit RawClient(const std::string& address,
                     std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials())
      : stub_(fl::v1::Federation::NewStub(grpc::CreateChannel(address, std::move(credentials)))) {}

  grpc::Status Join(const std::string& name, const core::ModelSpec& spec, fl::v1::JoinResponse* resp,
                    const std::string& task = "") {
    fl::v1::JoinRequest req;
    req.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
    req.set_client_name(name);
    req.set_task(task);
    *req.mutable_model_spec() = proto::ToProto(spec, "raw");
    // An update's weight is bounded by what its client declares here (client_reports_test).
    req.set_num_train_examples(1000);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.set_wait_for_ready(true);
    return stub_->Join(&ctx, req, resp);
  }

  fl::v1::UploadUpdateResponse Upload(fl::v1::UpdateHeader header, std::vector<uint8_t> payload,
                                      std::optional<uint64_t> checksum = std::nullopt, grpc::Status* status = nullptr) {
    header.set_payload_bytes(header.payload_bytes() != 0 ? header.payload_bytes() : payload.size());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    fl::v1::UploadUpdateResponse resp;
    auto writer = stub_->UploadUpdate(&ctx, &resp);
    if (proto::WriteWholeUpload(*writer, header, payload, checksum.value_or(core::TransferChecksum64(payload)))) {
      writer->WritesDone();
    }
    grpc::Status s = writer->Finish();
    if (status != nullptr) *status = s;
    return resp;
  }

  std::unique_ptr<grpc::ClientReaderWriter<fl::v1::ClientMessage, fl::v1::ServerMessage>> OpenSession(
      grpc::ClientContext* ctx, const fl::v1::JoinResponse& joined) {
    auto stream = stub_->Session(ctx);
    fl::v1::ClientMessage hello;
    hello.mutable_hello()->set_client_id(joined.client_id());
    hello.mutable_hello()->set_session_token(joined.session_token());
    stream->Write(hello);
    return stream;
  }

  // Joins as `name` with the synthetic model of the experiment and opens the session stream.
  struct Session {
    fl::v1::JoinResponse joined;
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReaderWriter<fl::v1::ClientMessage, fl::v1::ServerMessage>> stream;
  };
  // `spec` replaces the synthetic model, `task` is sent at Join ("" = classification).
  std::unique_ptr<Session> Connect(const std::string& name, const core::ModelSpec* spec = nullptr,
                                   const std::string& task = "") {
    auto s = std::make_unique<Session>();
    client::SyntheticTrainer same(kParams, 10, 1);
    grpc::Status status = Join(name, spec != nullptr ? *spec : same.spec(), &s->joined, task);
    EXPECT_TRUE(status.ok()) << status.error_message();
    if (!status.ok()) return nullptr;
    s->stream = OpenSession(&s->ctx, s->joined);
    return s;
  }

 private:
  std::unique_ptr<fl::v1::Federation::Stub> stub_;
};

// A plain HTTP GET on loopback, as Prometheus scrapes.
inline std::string HttpGet(int port, const std::string& path) {
  absl::StatusOr<fl::testing::HttpResponse> r = fl::testing::HttpGetLoopback(port, path);
  return r.ok() && r->status == 200 ? r->body : "";
}

}  // namespace fl::server::test_harness
