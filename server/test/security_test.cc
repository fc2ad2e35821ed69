// Identity, revocation and abuse limits of the federation service over real mutual TLS (certificates from
// fl::pki, gRPC's TLS on loopback): a client acts only for itself, a revoked certificate is refused at its next
// call and its session closed, joins and streams are bounded per peer and per identity, streams have deadlines;
// every refusal is a security_events row with the peer's address and a fl_security_refusals_total count.
#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/instrumentation/record_reader.h"
#include "fl/instrumentation/server_metrics.h"
#include "fl/pki/pki.h"
#include "fl/pki/revocation_watcher.h"
#include "fl/testing/scratch_dir.h"
#include "federation_harness.h"
#include "test_pki.h"

namespace fl::server {
namespace {

using namespace test_harness;  // NOLINT: the harness is this file's vocabulary
using instrumentation::SecurityEventRecord;
using instrumentation::SecurityRefusal;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// The value of fl_security_refusals_total for `reason` in a Prometheus text exposition; -1 when absent.
double Refusals(const std::string& exposition, std::string_view reason) {
  std::istringstream lines(exposition);
  const std::string label = fl::StrCat("reason=\"", reason, "\"");
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("fl_security_refusals_total{", 0) == 0 && line.find(label) != std::string::npos) {
      return std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return -1;
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(pki::Issue(ca_, pki::Kind::kIsland, "isle", {}).ok());
    config_ = SmallConfig(dir_.File("ckpt"));
    config_.fit = {1.0, 3, 3};  // no round starts with fewer than three clients: the tests own the timing
  }

  rpc::ServerTls ServerTls() const { return pki_.ServerTls(); }
  std::shared_ptr<grpc::ChannelCredentials> Credentials(const std::string& name,
                                                        pki::Kind kind = pki::Kind::kClient) const {
    return pki_.Credentials(name, kind);
  }
  std::unique_ptr<TestServer> Serve(const pki::RevocationWatcher* revocation = nullptr) {
    return std::make_unique<TestServer>(config_, db_, InitialModel(1), metrics_.get(), ServerTls(), revocation);
  }
  // The security events of the experiment, read after the server stopped (every record is written by then).
  std::vector<SecurityEventRecord> Events(TestServer& server) {
    const std::string id = server.engine().config().experiment_id;
    server.Stop();
    auto reader = instrumentation::RecordReader::Open(db_);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return {};
    auto rows = (*reader)->ListSecurityEvents(id);
    EXPECT_TRUE(rows.ok()) << rows.status();
    return rows.ok() ? *rows : std::vector<SecurityEventRecord>{};
  }
  static int Count(const std::vector<SecurityEventRecord>& events, SecurityRefusal reason) {
    int n = 0;
    for (const auto& e : events) n += e.reason == reason ? 1 : 0;
    return n;
  }

  fl::testing::ScratchDir dir_{"fl_security"};
  test_pki::TestPki pki_{dir_.File("pki"), {"alice", "mallory", "carol"}};
  std::string ca_ = pki_.dir();
  const pki::Paths& paths_ = pki_.paths();
  std::string db_ = dir_.File("records.db");
  EngineConfig config_;
  std::unique_ptr<instrumentation::ServerMetrics> metrics_ = *instrumentation::ServerMetrics::Start("127.0.0.1:0", "t");
};

TEST_F(SecurityTest, CallsActingForAnotherClientAreRefusedRecordedAndCounted) {
  auto server = Serve();
  RawClient alice(server->address(), Credentials("alice"));
  auto session = alice.Connect("alice");
  ASSERT_NE(session, nullptr);
  const fl::v1::JoinResponse& joined = session->joined;

  // mallory holds a valid certificate of its own and alice's id and token (as if it had read them off the wire).
  auto stub = fl::v1::Federation::NewStub(grpc::CreateChannel(server->address(), Credentials("mallory")));
  auto expect_denied = [](const grpc::Status& s, const std::string& what) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << what << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("the client certificate is for \"mallory\"")) << what;
    EXPECT_THAT(s.error_message(), HasSubstr("acts for client \"alice\"")) << what;
  };
  {
    fl::v1::DownloadModelRequest req;
    req.set_client_id(joined.client_id());
    req.set_session_token(joined.session_token());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = stub->DownloadModel(&ctx, req);
    fl::v1::ModelChunk chunk;
    EXPECT_FALSE(reader->Read(&chunk));
    expect_denied(reader->Finish(), "download");
  }
  {
    RawClient as_mallory(server->address(), Credentials("mallory"));
    fl::v1::Task task;
    task.set_task_id("t-1");
    task.set_round(1);
    grpc::Status status;
    as_mallory.Upload(DeltaHeader(joined.client_id(), joined.session_token(), task, 10),
                      std::vector<uint8_t>(kParams * 4), std::nullopt, &status);
    expect_denied(status, "upload");
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    RawClient as_mallory(server->address(), Credentials("mallory"));
    auto stream = as_mallory.OpenSession(&ctx, joined);
    fl::v1::ServerMessage m;
    while (stream->Read(&m)) {
    }
    expect_denied(stream->Finish(), "session");
  }
  {
    fl::v1::LeaveRequest req;
    req.set_client_id(joined.client_id());
    req.set_session_token(joined.session_token());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    fl::v1::LeaveResponse resp;
    expect_denied(stub->Leave(&ctx, req, &resp), "leave");
  }
  // alice's own session is untouched by all that: the server still answers it (a ping) on its stream.
  fl::v1::ServerMessage first;
  EXPECT_TRUE(session->stream->Read(&first));

  // The counts are the engine's: it may still be taking the last refusal's event when the call has its answer.
  for (int i = 0; i < 500 && Refusals(HttpGet(metrics_->port(), "/metrics"), "wrong_identity") < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string metrics = HttpGet(metrics_->port(), "/metrics");
  EXPECT_EQ(Refusals(metrics, "wrong_identity"), 4) << metrics;
  EXPECT_EQ(Refusals(metrics, "revoked_certificate"), 0) << metrics;
  session->ctx.TryCancel();
  const std::vector<SecurityEventRecord> events = Events(*server);
  ASSERT_EQ(Count(events, SecurityRefusal::kWrongIdentity), 4);
  for (const auto& e : events) {
    if (e.reason != SecurityRefusal::kWrongIdentity) continue;
    EXPECT_THAT(e.peer, StartsWith("ipv4:127.0.0.1:"));
    EXPECT_EQ(e.identity, "mallory");
    EXPECT_EQ(e.claimed, "alice");
    EXPECT_THAT(e.detail, HasSubstr("acts for client \"alice\""));
  }
}

TEST_F(SecurityTest, IslandCertificateCannotJoinAsAClient) {
  auto server = Serve();
  RawClient isle(server->address(), Credentials("isle", pki::Kind::kIsland));
  fl::v1::JoinResponse resp;
  const grpc::Status s = isle.Join("isle", client::SyntheticTrainer(kParams, 10, 1).spec(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("is an island's (fl-island://), not a client's"));
  EXPECT_EQ(Count(Events(*server), SecurityRefusal::kWrongIdentity), 1);
}

TEST_F(SecurityTest, RevokedCertificateIsRefusedAtItsNextCallAndItsSessionClosed) {
  RoundEngine* engine = nullptr;
  // A period long enough never to fire during the test: the test reloads when it wants (ReloadIfChanged).
  auto watcher = pki::RevocationWatcher::Start(
      {paths_.Crl(), paths_.CaCert(), 3'600'000},
      [&engine](const std::set<std::string>& serials) { engine->Post(CertificatesRevokedEvent{serials}); });
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  auto server = Serve(watcher->get());
  engine = &server->engine();

  RawClient alice(server->address(), Credentials("alice"));
  auto session = alice.Connect("alice");
  ASSERT_NE(session, nullptr);
  RawClient carol(server->address(), Credentials("carol"));
  auto carol_session = carol.Connect("carol");
  ASSERT_NE(carol_session, nullptr);
  fl::v1::ServerMessage m;
  ASSERT_TRUE(session->stream->Read(&m));  // the session is open

  ASSERT_TRUE(pki::Revoke(ca_, "alice").ok());
  EXPECT_TRUE((*watcher)->ReloadIfChanged());
  while (session->stream->Read(&m)) {
  }
  const grpc::Status closed = session->stream->Finish();
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::PERMISSION_DENIED) << closed.error_message();
  EXPECT_THAT(closed.error_message(), HasSubstr("was revoked"));

  // Its next call, on the same connection, is refused with the reason.
  fl::v1::JoinResponse resp;
  const grpc::Status rejoin = alice.Join("alice", client::SyntheticTrainer(kParams, 10, 1).spec(), &resp);
  EXPECT_EQ(rejoin.error_code(), grpc::StatusCode::PERMISSION_DENIED) << rejoin.error_message();
  EXPECT_THAT(rejoin.error_message(), HasSubstr("is revoked"));
  EXPECT_EQ(proto::ErrorFromGrpcStatus(rejoin).code(), fl::v1::ERROR_CODE_ADMISSION_REFUSED);

  // carol is not affected.
  ASSERT_TRUE(carol_session->stream->Read(&m));
  EXPECT_FALSE((*watcher)->ReloadIfChanged());  // nothing changed since
  carol_session->ctx.TryCancel();
  const std::vector<SecurityEventRecord> events = Events(*server);
  EXPECT_EQ(Count(events, SecurityRefusal::kRevokedCertificate), 2);  // the session closed, the Join refused
  for (const auto& e : events) {
    EXPECT_EQ(e.identity, "alice");
    EXPECT_THAT(e.peer, StartsWith("ipv4:127.0.0.1:"));
  }
}

TEST_F(SecurityTest, JoinFloodOfOneIdentityIsRateLimited) {
  config_.join_per_s_per_identity = 1;  // bursts of five
  auto server = Serve();
  RawClient alice(server->address(), Credentials("alice"));
  const core::ModelSpec spec = client::SyntheticTrainer(kParams, 10, 1).spec();
  int admitted = 0, limited = 0;
  std::string message;
  for (int i = 0; i < 30; ++i) {
    fl::v1::JoinResponse resp;
    const grpc::Status s = alice.Join("alice", spec, &resp);
    if (s.ok()) ++admitted;
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++limited;
      message = s.error_message();
      EXPECT_EQ(proto::ErrorFromGrpcStatus(s).code(), fl::v1::ERROR_CODE_RATE_LIMITED);
    }
  }
  EXPECT_GE(admitted, 5);  // the burst
  EXPECT_GE(limited, 1);
  EXPECT_EQ(admitted + limited, 30);
  EXPECT_THAT(message, HasSubstr("--join-per-s-per-identity"));
  // Another identity from the same address is not held back by alice's flood.
  RawClient carol(server->address(), Credentials("carol"));
  fl::v1::JoinResponse resp;
  EXPECT_TRUE(carol.Join("carol", spec, &resp).ok());
  EXPECT_EQ(Count(Events(*server), SecurityRefusal::kJoinRate), limited);
}

TEST_F(SecurityTest, JoinFloodFromOneAddressIsRateLimitedInPlaintextToo) {
  config_.join_per_s_per_peer = 2;  // bursts of five
  TestServer server(config_, db_, InitialModel(1));
  RawClient raw(server.address());
  const core::ModelSpec spec = client::SyntheticTrainer(kParams, 10, 1).spec();
  int limited = 0;
  std::string message;
  for (int i = 0; i < 30; ++i) {
    fl::v1::JoinResponse resp;
    const grpc::Status s = raw.Join(fl::StrCat("c", i), spec, &resp);
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++limited;
      message = s.error_message();
    }
  }
  EXPECT_GE(limited, 1);
  EXPECT_LE(limited, 25);  // the burst got in
  EXPECT_THAT(message, HasSubstr("from 127.0.0.1"));
  EXPECT_THAT(message, HasSubstr("--join-per-s-per-peer"));
  const std::vector<SecurityEventRecord> events = Events(server);
  EXPECT_EQ(Count(events, SecurityRefusal::kJoinRate), limited);
  for (const auto& e : events) EXPECT_EQ(e.identity, "");  // plaintext: no identity, only the address
}

TEST_F(SecurityTest, SecondSessionAndSecondUploadOfOneIdentityAreRefused) {
  config_.max_sessions_per_identity = 1;
  config_.max_uploads_per_identity = 1;
  auto server = Serve();
  RawClient alice(server->address(), Credentials("alice"));
  auto session = alice.Connect("alice");
  ASSERT_NE(session, nullptr);
  fl::v1::ServerMessage m;
  ASSERT_TRUE(session->stream->Read(&m));
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto second = alice.OpenSession(&ctx, session->joined);
    while (second->Read(&m)) {
    }
    const grpc::Status s = second->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("--max-sessions-per-identity"));
  }
  // An upload that sent nothing yet holds alice's only upload slot; a second one is refused at once.
  auto stub = fl::v1::Federation::NewStub(grpc::CreateChannel(server->address(), Credentials("alice")));
  grpc::ClientContext held_ctx;
  fl::v1::UploadUpdateResponse held_resp;
  auto held = stub->UploadUpdate(&held_ctx, &held_resp);
  {
    grpc::Status s;
    fl::v1::Task task;
    task.set_task_id("t");
    // The first upload's stream may still be opening on the server: retry briefly until it holds the slot.
    for (int i = 0; i < 100; ++i) {
      RawClient again(server->address(), Credentials("alice"));
      again.Upload(DeltaHeader("alice", session->joined.session_token(), task, 10), std::vector<uint8_t>(16),
                   std::nullopt, &s);
      if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("--max-uploads-per-identity"));
  }
  held_ctx.TryCancel();
  (void)held->Finish();
  session->ctx.TryCancel();
  const std::vector<SecurityEventRecord> events = Events(*server);
  EXPECT_EQ(Count(events, SecurityRefusal::kSessionLimit), 1);
  EXPECT_EQ(Count(events, SecurityRefusal::kUploadLimit), 1);
}

TEST_F(SecurityTest, UploadThatNeverSendsItsHeaderIsCutOffAtTheDeadline) {
  config_.upload_message_timeout_ms = 300;
  auto server = Serve();
  auto stub = fl::v1::Federation::NewStub(grpc::CreateChannel(server->address(), Credentials("alice")));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  fl::v1::UploadUpdateResponse resp;
  auto writer = stub->UploadUpdate(&ctx, &resp);
  const grpc::Status s = writer->Finish();  // sends nothing; waits for the server's end
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("no upload header within 300 ms"));
  EXPECT_THAT(s.error_message(), HasSubstr("--upload-message-timeout-ms"));
  EXPECT_EQ(Count(Events(*server), SecurityRefusal::kStreamDeadline), 1);
}

TEST_F(SecurityTest, DownloadNobodyReadsIsCancelledAtTheDeadline) {
  config_.download_message_timeout_ms = 300;
  // A model far larger than the HTTP/2 flow-control windows, so that a client that does not read stalls the
  // server's writes.
  constexpr uint64_t kBig = 16u << 20;
  RoundEngine::StartPoint start;
  Checkpoint ckpt;
  const core::ModelSpec big = *core::ModelSpec::Create({core::TensorSpec{"w", {int64_t{kBig}}}});
  ckpt.spec = big;
  ckpt.model_name = "big";
  ckpt.values.assign(kBig, 0.5f);
  start.checkpoint = std::move(ckpt);
  TestServer server(config_, db_, std::move(start), metrics_.get(), ServerTls());

  RawClient alice(server.address(), Credentials("alice"));
  fl::v1::JoinResponse joined;
  ASSERT_TRUE(alice.Join("alice", big, &joined).ok());
  auto stub = fl::v1::Federation::NewStub(grpc::CreateChannel(server.address(), Credentials("alice")));
  fl::v1::DownloadModelRequest req;
  req.set_client_id(joined.client_id());
  req.set_session_token(joined.session_token());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->DownloadModel(&ctx, req);
  // Never reads; the server cancels the call once a chunk waits longer than the deadline.
  for (int i = 0; i < 600 && Refusals(HttpGet(metrics_->port(), "/metrics"), "stream_deadline") < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Refusals(HttpGet(metrics_->port(), "/metrics"), "stream_deadline"), 1);
  ctx.TryCancel();
  (void)reader->Finish();
  const std::vector<SecurityEventRecord> events = Events(server);
  ASSERT_EQ(Count(events, SecurityRefusal::kStreamDeadline), 1);
  EXPECT_THAT(events.back().detail, HasSubstr("--download-message-timeout-ms"));
  EXPECT_EQ(events.back().identity, "alice");
}

}  // namespace
}  // namespace fl::server
