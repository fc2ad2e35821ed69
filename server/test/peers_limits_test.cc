// One hostile peer must not grow the server's records or memory without bound, nor hold every place, through the
// real gRPC service (issue 27, "Hostile clients"): forged Leaves are refused UNAUTHENTICATED with the reason, and
// a flood of them writes a bounded number of security_events rows plus summaries that count the rest; Joins under
// other names spend the join rate before the name check; clients that joined and never had a task are forgotten
// past a bound (memory and row); and a full server gives a newcomer from another address its share of places.
#include <chrono>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/client/socket_binding.h"
#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/pki/pki.h"
#include "fl/testing/scratch_dir.h"
#include "federation_harness.h"
#include "test_pki.h"

namespace fl::server {
namespace {

using namespace test_harness;  // NOLINT: the harness is this file's vocabulary
using instrumentation::RecordReader;
using instrumentation::SecurityEventRecord;
using instrumentation::SecurityRefusal;
using ::testing::HasSubstr;

fl::v1::JoinRequest JoinOf(const std::string& name) {
  fl::v1::JoinRequest req;
  req.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
  req.set_client_name(name);
  *req.mutable_model_spec() = proto::ToProto(client::SyntheticTrainer(kParams, 10, 1).spec(), "raw");
  req.set_num_train_examples(1000);
  return req;
}

grpc::Status Join(fl::v1::Federation::Stub& stub, const std::string& name, fl::v1::JoinResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ctx.set_wait_for_ready(true);
  return stub.Join(&ctx, JoinOf(name), resp);
}

grpc::Status Leave(fl::v1::Federation::Stub& stub, const std::string& id, const std::string& token,
                   fl::v1::LeaveResponse* resp) {
  fl::v1::LeaveRequest req;
  req.set_client_id(id);
  req.set_session_token(token);
  req.set_reason("test");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ctx.set_wait_for_ready(true);
  return stub.Leave(&ctx, req, resp);
}

std::unique_ptr<fl::v1::Federation::Stub> Stub(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials()) {
  return fl::v1::Federation::NewStub(grpc::CreateChannel(address, std::move(credentials)));
}

// A plaintext stub whose connections come from `source` (another loopback address, so that the server sees
// another peer), through fl-client's own socket binding.
std::unique_ptr<fl::v1::Federation::Stub> StubFrom(const std::string& address, const std::string& source) {
  grpc::ChannelArguments args;
  client::ApplySocketBinding(client::SocketBinding{"", source}, &args);
  return fl::v1::Federation::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

// The experiment's records, read after the server stopped (every record is written by then).
std::unique_ptr<RecordReader> StopAndRead(TestServer& server, const std::string& db) {
  server.Stop();
  auto reader = RecordReader::Open(db);
  EXPECT_TRUE(reader.ok()) << reader.status();
  return reader.ok() ? std::move(*reader) : nullptr;
}

// The number of refusals a summary row stands for ("summary: N more ..."); 0 for a row of one refusal.
uint64_t SummarizedCount(const SecurityEventRecord& e) {
  std::smatch m;
  if (!std::regex_search(e.detail, m, std::regex("^summary: ([0-9]+) more "))) return 0;
  return std::stoull(m[1]);
}

TEST(PeersLimitsTest, AForgedLeaveIsUnauthenticatedWithTheReason) {
  fl::testing::ScratchDir dir("fl_peers");
  const std::string db = dir.File("records.db");
  TestServer server(SmallConfig(""), db, InitialModel(1));
  auto stub = Stub(server.address());
  fl::v1::JoinResponse joined;
  ASSERT_TRUE(Join(*stub, "alice", &joined).ok());

  fl::v1::LeaveResponse left;
  grpc::Status s = Leave(*stub, "alice", "not-the-token", &left);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("client id 'alice' or its session token is not known"));
  EXPECT_EQ(proto::ErrorFromGrpcStatus(s).code(), fl::v1::ERROR_CODE_UNKNOWN_CLIENT);
  EXPECT_FALSE(left.acknowledged());
  // The real token still works: the forged Leave changed nothing.
  s = Leave(*stub, "alice", joined.session_token(), &left);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(left.acknowledged());

  auto reader = StopAndRead(server, db);
  ASSERT_NE(reader, nullptr);
  const auto events = *reader->ListSecurityEvents(server.engine().config().experiment_id);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].reason, SecurityRefusal::kBadToken);
  EXPECT_THAT(events[0].detail, HasSubstr("Leave: client id 'alice' or its session token is not known"));
}

TEST(PeersLimitsTest, AFloodOfForgedLeavesWritesBoundedRowsAndSummariesCountingTheRest) {
  fl::testing::ScratchDir dir("fl_peers");
  const std::string db = dir.File("records.db");
  TestServer server(SmallConfig(""), db, InitialModel(1));
  auto stub = Stub(server.address());
  constexpr int kForged = 600;
  int unauthenticated = 0;
  for (int i = 0; i < kForged; ++i) {
    fl::v1::LeaveResponse left;
    unauthenticated +=
        Leave(*stub, fl::StrCat("ghost", i), "forged", &left).error_code() == grpc::StatusCode::UNAUTHENTICATED ? 1 : 0;
  }
  EXPECT_EQ(unauthenticated, kForged);  // every one is still refused and told why

  auto reader = StopAndRead(server, db);
  ASSERT_NE(reader, nullptr);
  const auto events = *reader->ListSecurityEvents(server.engine().config().experiment_id);
  uint64_t one_by_one = 0, summarized = 0, summaries = 0;
  for (const auto& e : events) {
    EXPECT_EQ(e.reason, SecurityRefusal::kBadToken);
    const uint64_t n = SummarizedCount(e);
    if (n == 0) {
      ++one_by_one;
    } else {
      ++summaries;
      summarized += n;
      EXPECT_THAT(e.detail, HasSubstr("bad_token refusal(s) of 127.0.0.1"));
      EXPECT_THAT(e.detail, HasSubstr("were not recorded one by one"));
    }
  }
  // Every refusal is accounted for, in far fewer rows than refusals (600 rows before).
  EXPECT_EQ(one_by_one + summarized, static_cast<uint64_t>(kForged));
  EXPECT_GE(summaries, 1u);
  EXPECT_GE(one_by_one, 64u);  // the burst an address may always write
  EXPECT_LT(events.size(), static_cast<size_t>(kForged) / 3) << one_by_one << " rows, " << summaries << " summaries";
}

TEST(PeersLimitsTest, JoinsUnderOtherNamesWithOneCertificateSpendTheJoinRateBeforeTheNameCheck) {
  fl::testing::ScratchDir dir("fl_peers");
  const std::string db = dir.File("records.db");
  test_pki::TestPki pki(dir.File("pki"), {"alice"});
  EngineConfig config = SmallConfig("");
  config.join_per_s_per_identity = 0.001;  // bursts of five, then one token per 1000 s
  TestServer server(config, db, InitialModel(1), nullptr, pki.ServerTls());
  auto stub = Stub(server.address(), pki.Credentials("alice"));
  constexpr int kJoins = 60;
  int denied = 0, limited = 0;
  for (int i = 0; i < kJoins; ++i) {
    fl::v1::JoinResponse resp;
    const grpc::Status s = Join(*stub, fl::StrCat("not-alice-", i), &resp);
    denied += s.error_code() == grpc::StatusCode::PERMISSION_DENIED ? 1 : 0;
    limited += s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? 1 : 0;
  }
  // The five tokens of the burst reach the name check; every other Join is refused by the rate first.
  EXPECT_EQ(denied, 5);
  EXPECT_EQ(limited, kJoins - 5);
  auto reader = StopAndRead(server, db);
  ASSERT_NE(reader, nullptr);
  int name_mismatch = 0;
  const auto events = reader->ListSecurityEvents(server.engine().config().experiment_id);
  ASSERT_TRUE(events.ok()) << events.status();
  for (const auto& e : *events) {
    name_mismatch += e.reason == SecurityRefusal::kNameMismatch ? 1 : 0;
  }
  EXPECT_EQ(name_mismatch, 5);  // was one per Join
}

TEST(PeersLimitsTest, ClientsThatJoinedAndNeverHadATaskAreForgottenPastTheBound) {
  fl::testing::ScratchDir dir("fl_peers");
  const std::string db = dir.File("records.db");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  config.num_rounds = 1;
  config.max_idle_newcomers = 5;
  TestServer server(config, db, InitialModel(1));
  auto stub = Stub(server.address());
  // 30 names that join and leave, never trained: before, each kept its ClientInfo and clients row for good.
  for (int i = 0; i < 30; ++i) {
    fl::v1::JoinResponse joined;
    ASSERT_TRUE(Join(*stub, fl::StrCat("drive-by-", i), &joined).ok());
    fl::v1::LeaveResponse left;
    ASSERT_TRUE(Leave(*stub, joined.client_id(), joined.session_token(), &left).ok());
  }
  // A forgotten name joins again as a new client.
  fl::v1::JoinResponse again;
  EXPECT_TRUE(Join(*stub, "drive-by-0", &again).ok());
  // The honest clients' experiment is untouched: they train, and keep their rows.
  std::vector<std::unique_ptr<RunningClient>> honest;
  for (int i = 0; i < 3; ++i) honest.push_back(StartClient(server.address(), fl::StrCat("honest", i), i + 1));
  const EngineResult result = server.Wait();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  for (auto& c : honest) c->thread.join();

  auto reader = StopAndRead(server, db);
  ASSERT_NE(reader, nullptr);
  std::set<std::string> drive_bys, honest_rows;
  const auto clients = reader->ListClients(result.experiment_id);
  ASSERT_TRUE(clients.ok()) << clients.status();
  for (const auto& c : *clients) {
    (c.client_id.rfind("honest", 0) == 0 ? honest_rows : drive_bys).insert(c.client_id);
  }
  EXPECT_EQ(honest_rows, (std::set<std::string>{"honest0", "honest1", "honest2"}));
  // At most the bound of idle ones, plus the one that joined again and holds its place (31 rows before).
  EXPECT_LE(drive_bys.size(), 6u);
  EXPECT_TRUE(drive_bys.count("drive-by-0")) << "the name that joined again has its row again";
  EXPECT_TRUE(drive_bys.count("drive-by-29")) << "the newest idle ones are kept";
  EXPECT_FALSE(drive_bys.count("drive-by-1")) << "the oldest idle ones are forgotten";
  EXPECT_EQ(reader->ListRounds(result.experiment_id)->size(), 1u);
}

TEST(PeersLimitsTest, AFullServerGivesANewcomerFromAnotherAddressItsShare) {
  fl::testing::ScratchDir dir("fl_peers");
  const std::string db = dir.File("records.db");
  EngineConfig config = SmallConfig("");
  config.max_sessions = 8;
  config.fit = {1.0, 20, 20};            // no round starts: nobody's place is taken by a task
  config.heartbeat_interval_ms = 60000;  // admitted places are kept for the whole test
  TestServer server(config, db, InitialModel(1));
  auto hog = Stub(server.address());  // 127.0.0.1
  for (int i = 0; i < 8; ++i) {
    fl::v1::JoinResponse resp;
    ASSERT_TRUE(Join(*hog, fl::StrCat("hog-", i), &resp).ok()) << i;
  }
  fl::v1::JoinResponse resp;
  grpc::Status s = Join(*hog, "hog-8", &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("8 of them from 127.0.0.1"));

  // An honest newcomer from another address: refused every time before, whatever it waited.
  auto newcomer = StubFrom(server.address(), "127.0.0.2");
  s = Join(*newcomer, "newcomer", &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(server.engine().PlacesHeld(), 8u);
  // The hog re-joining all its names keeps only what is left: seven places; the one that yielded is refused.
  int kept = 0, refused = 0;
  for (int i = 0; i < 8; ++i) {
    s = Join(*hog, fl::StrCat("hog-", i), &resp);
    kept += s.ok() ? 1 : 0;
    refused += s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? 1 : 0;
  }
  EXPECT_EQ(kept, 7);
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(server.engine().PlacesHeld(), 8u);

  auto reader = StopAndRead(server, db);
  ASSERT_NE(reader, nullptr);
  int yielded = 0;
  const auto events = reader->ListClientEvents(server.engine().config().experiment_id);
  ASSERT_TRUE(events.ok()) << events.status();
  for (const auto& e : *events) {
    if (e.reason.find("yields its place to client 'newcomer' from 127.0.0.2") != std::string::npos) ++yielded;
  }
  EXPECT_EQ(yielded, 1);
}

TEST(PeersLimitsTest, OneAddressMayHoldEveryPlaceWhileNobodyElseAsks) {
  // Virtual clients (fl-client --instances, fleet_load): thousands of sessions from one address are legitimate;
  // fairness only applies when another address asks for a place.
  fl::testing::ScratchDir dir("fl_peers");
  EngineConfig config = SmallConfig("");
  config.max_sessions = 40;
  config.fit = {1.0, 100, 100};
  config.heartbeat_interval_ms = 60000;
  TestServer server(config, dir.File("records.db"), InitialModel(1));
  auto one = Stub(server.address());
  for (int i = 0; i < 40; ++i) {
    fl::v1::JoinResponse resp;
    ASSERT_TRUE(Join(*one, fl::StrCat("virtual-", i), &resp).ok()) << i;
  }
  EXPECT_EQ(server.engine().PlacesHeld(), 40u);
  // Its own further Join finds no share to take from anyone: refused, nobody disconnected.
  fl::v1::JoinResponse resp;
  EXPECT_EQ(Join(*one, "virtual-40", &resp).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(server.engine().PlacesHeld(), 40u);
}

}  // namespace
}  // namespace fl::server
