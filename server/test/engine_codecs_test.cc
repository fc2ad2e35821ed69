// Link-aware compression (--uplink-codec-policy): the engine on a ManualClock naming a codec per client at
// dispatch by link kind and by measured uplink rate, accepting each client's update in its own codec, refusing one
// in another codec, and recording the codec of each update. The policy's parsing: core/test/codec_policy_test.cc.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/codec.h"
#include "fl/instrumentation/record_reader.h"
#include "manual_engine.h"

namespace fl::server {
namespace {

using instrumentation::ClientOutcome;
using instrumentation::RecordReader;
using test_harness::InitialModel;
using test_harness::kParams;

TEST(EngineCodecPolicy, EngineConfigValidateRefusesABadPolicy) {
  EngineConfig c = test_harness::SmallConfig("");
  c.uplink_codec_policy = "by-link:lte=int4";
  absl::Status s = c.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--uplink-codec-policy 'by-link:lte=int4': unknown link kind 'lte'"), std::string::npos)
      << s.message();
}

using test_harness::LastTask;
using test_harness::TestClient;

class EngineCodecPolicyTest : public test_harness::ManualEngineTest {
 protected:
  EngineCodecPolicyTest() : ManualEngineTest("fl_engine_codec_policy") {}

  static EngineConfig Config(const std::string& policy) {
    EngineConfig c = test_harness::SmallConfig("");
    c.num_rounds = 2;
    c.fit = {1.0, 3, 3};
    c.evaluate_every = 0;
    c.round_deadline_ms = 10'000;
    c.heartbeat_interval_ms = 60'000;
    c.print_table = false;
    c.uplink_codec_policy = policy;
    return c;
  }

  // Uploads a small delta encoded with `codec`; the upload takes `upload_ms` on the server's clock.
  fl::v1::UploadUpdateResponse Upload(const TestClient& c, const std::string& codec, int64_t upload_ms = 0) {
    const fl::v1::Task task = *LastTask(c);
    fl::v1::UpdateHeader h = test_harness::DeltaHeader(c.id, c.token, task, 10);
    auto enc = core::MakeCodec(codec);
    EXPECT_TRUE(enc.ok());
    h.set_codec(codec);
    h.set_payload_bytes((*enc)->EncodedSize(kParams));
    const int64_t first = clock_.NowNs();
    if (auto refusal = StartUpload(h); refusal.has_value()) return *refusal;
    clock_.AdvanceMs(upload_ms);
    std::vector<uint8_t> payload;
    EXPECT_TRUE((*enc)->Encode(std::vector<float>(kParams, 0.001f), &payload).ok());
    return FinishUpload(h, std::move(payload), first);
  }

  std::map<std::string, std::string> RecordedCodecs(uint64_t round) {
    std::map<std::string, std::string> codecs;
    for (const auto& [client, row] : RowsOfRound(static_cast<int64_t>(round))) {
      EXPECT_EQ(row.outcome, ClientOutcome::kOk) << client << ": " << row.reject_reason;
      codecs[client] = row.codec;
    }
    return codecs;
  }
};

TEST_F(EngineCodecPolicyTest, ClientsOfDifferentLinkKindsGetTheirCodecsAndTheRowsRecordThem) {
  StartEngine(Config("by-link:5g=int4,wifi=int8,ethernet=fp32,default=fp32"));
  TestClient a = Connect("a-5g", fl::v1::LINK_KIND_5G);
  TestClient b = Connect("b-wifi", fl::v1::LINK_KIND_WIFI);
  TestClient c = Connect("c-eth", fl::v1::LINK_KIND_ETHERNET);
  ASSERT_EQ(engine_->state(), EngineState::kCollecting);
  EXPECT_EQ(LastTask(a)->uplink_codec(), "int4");
  EXPECT_EQ(LastTask(b)->uplink_codec(), "int8");
  EXPECT_EQ(LastTask(c)->uplink_codec(), "fp32");

  // An update in another codec than its task named is refused at its header and changes nothing.
  fl::v1::UploadUpdateResponse wrong = Upload(a, "fp32");
  EXPECT_EQ(wrong.outcome(), fl::v1::UPDATE_OUTCOME_REJECTED);
  EXPECT_EQ(wrong.error().code(), fl::v1::ERROR_CODE_UNSUPPORTED_CODEC);
  EXPECT_NE(wrong.error().message().find("update uses codec 'fp32' but the task asked for 'int4'"), std::string::npos)
      << wrong.error().message();
}

TEST_F(EngineCodecPolicyTest, EachUpdateIsDecodedWithItsOwnCodecAndRecordedWithIt) {
  StartEngine(Config("by-link:5g=int4,wifi=int8,ethernet=fp32,default=fp32"));
  TestClient a = Connect("a-5g", fl::v1::LINK_KIND_5G);
  TestClient b = Connect("b-wifi", fl::v1::LINK_KIND_WIFI);
  TestClient c = Connect("c-eth", fl::v1::LINK_KIND_ETHERNET);
  EXPECT_EQ(Upload(a, "int4").outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(b, "int8").outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(c, "fp32").outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(RecordedCodecs(1),
            (std::map<std::string, std::string>{{"a-5g", "int4"}, {"b-wifi", "int8"}, {"c-eth", "fp32"}}));
  // Round 2 went out with the same codecs (the link kinds did not change).
  EXPECT_EQ(LastTask(a)->round(), 2u);
  EXPECT_EQ(LastTask(a)->uplink_codec(), "int4");
  EXPECT_EQ(LastTask(c)->uplink_codec(), "fp32");
}

TEST_F(EngineCodecPolicyTest, ByRateUsesTheDefaultFirstThenTheRateMeasuredFromTheLastUpload) {
  // fp32 of 5000 values is 20,032 bytes: 20 ms on the server's clock is ~1 MB/s, 2 ms ~10 MB/s, 200 ms ~100 kB/s.
  StartEngine(Config("by-rate:0=int4,500000=int8,5000000=fp32,default=fp32"));
  TestClient a = Connect("a", fl::v1::LINK_KIND_5G);
  TestClient b = Connect("b", fl::v1::LINK_KIND_5G);
  TestClient c = Connect("c", fl::v1::LINK_KIND_5G);
  for (const TestClient* t : {&a, &b, &c}) EXPECT_EQ(LastTask(*t)->uplink_codec(), "fp32") << t->id;
  EXPECT_EQ(Upload(a, "fp32", 200).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(b, "fp32", 20).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(c, "fp32", 2).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(LastTask(a)->round(), 2u);
  EXPECT_EQ(LastTask(a)->uplink_codec(), "int4");
  EXPECT_EQ(LastTask(b)->uplink_codec(), "int8");
  EXPECT_EQ(LastTask(c)->uplink_codec(), "fp32");
  EXPECT_EQ(Upload(a, "int4").outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(b, "int8").outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Upload(c, "fp32").outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(RecordedCodecs(2), (std::map<std::string, std::string>{{"a", "int4"}, {"b", "int8"}, {"c", "fp32"}}));
}

TEST_F(EngineCodecPolicyTest, WithoutAPolicyEveryTaskNamesTheServersUplinkCodec) {
  EngineConfig config = Config("");
  config.uplink_codec = "int8";
  StartEngine(config);
  TestClient a = Connect("a", fl::v1::LINK_KIND_5G);
  TestClient b = Connect("b", fl::v1::LINK_KIND_WIFI);
  TestClient c = Connect("c", fl::v1::LINK_KIND_ETHERNET);
  for (const TestClient* t : {&a, &b, &c}) EXPECT_EQ(LastTask(*t)->uplink_codec(), "int8") << t->id;
}

// End to end over real gRPC sessions: real FederatedClients on 5G, WiFi and Ethernet encode with the codec their
// task names (error feedback included), every update is accepted, and each row records its client's codec.
TEST(EngineCodecPolicyEndToEnd, RealClientsUploadInTheirLinksCodecs) {
  fl::testing::ScratchDir dir("fl_engine_codecs_e2e");
  EngineConfig config = test_harness::SmallConfig("");
  config.fit = {1.0, 3, 3};
  config.num_rounds = 2;
  config.print_table = false;
  config.uplink_codec_policy = "by-link:5g=int4,wifi=int8,ethernet=fp32";
  const std::string db = dir.File("records.db");
  std::string experiment_id;
  {
    test_harness::TestServer server(config, db, InitialModel(1));
    auto a = test_harness::StartClient(server.address(), "cell", 1, "5g");
    auto b = test_harness::StartClient(server.address(), "wlan", 2, "wifi");
    auto c = test_harness::StartClient(server.address(), "wire", 3, "ethernet");
    const EngineResult result = server.Wait();
    EXPECT_EQ(result.status_name(), "finished") << result.reason;
    experiment_id = result.experiment_id;
    for (auto* client : {a.get(), b.get(), c.get()}) {
      client->thread.join();
      EXPECT_TRUE(client->result.ok()) << client->result;
    }
    server.Stop();
  }
  auto reader = RecordReader::Open(db);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto clients = (*reader)->ListClients(experiment_id);
  ASSERT_TRUE(clients.ok()) << clients.status();
  std::map<std::string, std::string> name_of;
  for (const auto& client : *clients) name_of[client.client_id] = client.client_name;
  for (int64_t round = 1; round <= 2; ++round) {
    auto rows = (*reader)->ListClientRounds(experiment_id, round);
    ASSERT_TRUE(rows.ok()) << rows.status();
    std::map<std::string, std::string> codecs;
    for (const auto& row : *rows) {
      EXPECT_EQ(row.outcome, ClientOutcome::kOk) << row.client_id << ": " << row.reject_reason;
      codecs[name_of[row.client_id]] = row.codec;
    }
    EXPECT_EQ(codecs, (std::map<std::string, std::string>{{"cell", "int4"}, {"wlan", "int8"}, {"wire", "fp32"}}))
        << "round " << round;
  }
}

}  // namespace
}  // namespace fl::server
