// Secure aggregation inside the round engine (server/src/engine_secagg.h, docs/privacy.md) on an injected
// ManualClock. The clients' side is the real SecAgg+ client (fl::secagg::ClientRound) answering what the engine
// sent on each session: the engine runs the four stages, commits the dequantised mean of the survivors' updates
// (within the quantisation bound of the plain mean), drops clients that miss a stage, fails an attempt that
// cannot be unmasked with the global model untouched, and refuses (and records) messages out of place.
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/secagg/client_round.h"
#include "fl/secagg/quantize.h"
#include "fl/server/checkpoint.h"
#include "manual_engine.h"

namespace fl::server {
namespace {

using test_harness::kParams;
using test_harness::LastTask;
using test_harness::TestClient;

// One simulated fl-client's secure round: the library's client answering the engine's messages.
struct SecureClient {
  TestClient client;
  std::unique_ptr<secagg::ClientRound> round;
  size_t seen = 0;  // messages of the channel already handled
  float value = 0;  // every coordinate of its delta
};

class EngineSecAggTest : public test_harness::ManualEngineTest {
 protected:
  EngineSecAggTest() : ManualEngineTest("fl_engine_secagg") {}

  // `clients` selected each round, a round committing with at least `min_updates` of them (default: all).
  EngineConfig Config(uint32_t clients, uint32_t min_updates = 0) {
    EngineConfig c = test_harness::SmallConfig(dir_.File("ckpt"));
    c.num_rounds = 1;
    c.fit = {1.0, min_updates == 0 ? clients : min_updates, clients};
    c.evaluate_every = 0;
    c.round_deadline_ms = 60'000;
    c.heartbeat_interval_ms = 600'000;
    c.print_table = false;
    c.secure_aggregation = "secagg+";
    c.secagg_stage_deadline_ms = 2'000;
    c.secagg_range = 1.0;
    c.secagg_scale = 65536;
    c.max_round_attempts = 3;
    return c;
  }

  void Send(const TestClient& c, fl::v1::ClientMessage m) {
    engine_->Post(SessionMessageEvent{c.channel, std::move(m), clock_.NowNs()});
    Run();
  }

  // The secure task's setup: the client answers with its keys at once.
  void AdvertiseKeys(SecureClient& s, uint64_t seed) {
    const fl::v1::Task task = *LastTask(s.client);
    ASSERT_TRUE(task.has_secagg()) << "the train task carries no SecAggSetup";
    EXPECT_EQ(task.uplink_codec(), "secagg-z32");
    fl::v1::ClientMessage m;
    auto r =
        secagg::ClientRound::Start(task.secagg(), secagg::RandomSource::SeededForTests(seed), m.mutable_secagg_keys());
    ASSERT_TRUE(r.ok()) << r.status();
    s.round = *std::move(r);
    Send(s.client, std::move(m));
  }

  // The messages of `kind` the engine sent the client since the last look.
  std::vector<fl::v1::ServerMessage> NewMessages(SecureClient& s) {
    std::vector<fl::v1::ServerMessage> sent = s.client.channel->sent();
    std::vector<fl::v1::ServerMessage> out(sent.begin() + static_cast<std::ptrdiff_t>(s.seen), sent.end());
    s.seen = sent.size();
    return out;
  }

  // Answers every secure-stage message waiting for the client: neighbour keys -> shares; unmask request -> shares.
  // Masking start is kept (returned true) for the upload.
  std::optional<fl::v1::SecAggMaskingStart> Answer(SecureClient& s) {
    std::optional<fl::v1::SecAggMaskingStart> start;
    for (const fl::v1::ServerMessage& m : NewMessages(s)) {
      if (m.has_secagg_neighbour_keys()) {
        fl::v1::ClientMessage out;
        EXPECT_TRUE(s.round->OnNeighbourKeys(m.secagg_neighbour_keys(), out.mutable_secagg_shares()).ok());
        Send(s.client, std::move(out));
      } else if (m.has_secagg_unmask_request()) {
        fl::v1::ClientMessage out;
        EXPECT_TRUE(s.round->OnUnmaskRequest(m.secagg_unmask_request(), out.mutable_secagg_unmask()).ok());
        Send(s.client, std::move(out));
      } else if (m.has_secagg_masking_start()) {
        start = m.secagg_masking_start();
      }
    }
    return start;
  }

  // The masked update of the client (every coordinate s.value), uploaded as fl-client does.
  fl::v1::UploadUpdateResponse UploadMasked(SecureClient& s, const fl::v1::SecAggMaskingStart& start) {
    EXPECT_TRUE(s.round->OnMaskingStart(start, 1).ok());
    std::vector<float> delta(kParams, s.value);
    std::vector<uint32_t> words(kParams + 1);
    EXPECT_TRUE(s.round->MaskChunk(0, delta, std::span<uint32_t>(words.data(), kParams)).ok());
    fl::v1::SecAggMaskedChunk weight;
    EXPECT_TRUE(s.round->MaskWeight(&weight).ok());
    std::memcpy(&words[kParams], weight.words().data(), sizeof(uint32_t));
    std::vector<uint8_t> payload(words.size() * sizeof(uint32_t));
    std::memcpy(payload.data(), words.data(), payload.size());  // little-endian host (x86-64, arm64)
    const fl::v1::Task task = *LastTask(s.client);
    fl::v1::UpdateHeader h = test_harness::DeltaHeader(s.client.id, s.client.token, task, 50);
    h.set_codec("secagg-z32");
    h.set_payload_bytes(payload.size());
    const int64_t first = clock_.NowNs();
    if (auto refused = StartUpload(h); refused.has_value()) return *refused;
    return FinishUpload(h, std::move(payload), first);
  }

  std::vector<SecureClient> ConnectAll(uint32_t n) {
    std::vector<SecureClient> out(n);
    for (uint32_t i = 0; i < n; ++i) {
      out[i].client = Connect(fl::StrCat("c", i));
      out[i].value = 0.01f * static_cast<float>(i + 1);
    }
    return out;
  }
};

TEST_F(EngineSecAggTest, FourStagesCommitTheMeanOfTheMaskedUpdatesWithinTheQuantisationBound) {
  StartEngine(Config(3));
  std::vector<SecureClient> clients = ConnectAll(3);
  for (size_t i = 0; i < clients.size(); ++i) AdvertiseKeys(clients[i], 100 + i);
  // Stage 1 closed when the last keys arrived (no deadline waited for): the neighbour keys went out.
  for (SecureClient& s : clients) Answer(s);
  std::vector<fl::v1::SecAggMaskingStart> starts;
  for (SecureClient& s : clients) {
    std::optional<fl::v1::SecAggMaskingStart> start = Answer(s);
    ASSERT_TRUE(start.has_value()) << s.client.id << " got no SecAggMaskingStart";
    starts.push_back(*start);
  }
  for (size_t i = 0; i < clients.size(); ++i) {
    fl::v1::UploadUpdateResponse verdict = UploadMasked(clients[i], starts[i]);
    EXPECT_EQ(verdict.outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED) << verdict.error().message();
  }
  EXPECT_EQ(engine_->state(), EngineState::kUnmasking);
  for (SecureClient& s : clients) Answer(s);
  EXPECT_NE(engine_->state(), EngineState::kUnmasking);

  // The plain mean is (0.01 + 0.02 + 0.03) / 3 = 0.02 in every coordinate; the quantised one is within 1/(2 scale).
  const std::vector<double> move = MoveIn(1);
  ASSERT_EQ(move.size(), kParams);
  const double bound = secagg::AggregateErrorBound({1.0, 65536, 1}) + 1e-6;  // + the float32 rounding
  for (size_t i = 0; i < kParams; ++i) ASSERT_NEAR(move[i], 0.02, bound) << "coordinate " << i;

  auto reader = Reader();
  auto rounds = reader->ListRounds(ExperimentId());
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].status, instrumentation::RoundStatus::kCommitted);
  EXPECT_EQ((*rounds)[0].secagg_survivors, 3);
  EXPECT_EQ((*rounds)[0].secagg_dropped, 0);
  // Every client took part in every stage, each answer recorded with its time and bytes.
  auto stages = reader->ListSecAggStages(ExperimentId());
  ASSERT_TRUE(stages.ok()) << stages.status();
  EXPECT_EQ(stages->size(), 12u);
  for (const instrumentation::SecAggStageRecord& row : *stages) {
    EXPECT_EQ(row.outcome, instrumentation::SecAggStageOutcome::kOk) << row.client_id;
    EXPECT_TRUE(row.duration_ms.has_value());
    EXPECT_GT(row.bytes_up, 0) << instrumentation::SecAggStageName(row.stage);
    if (row.stage == instrumentation::SecAggStage::kMaskedUpload) {
      EXPECT_EQ(row.bytes_up, static_cast<int64_t>((kParams + 1) * 4));
    }
  }
}

TEST_F(EngineSecAggTest, AClientThatDropsAfterSharingKeysIsUnmaskedOutOfTheSum) {
  StartEngine(Config(4, 3));
  std::vector<SecureClient> clients = ConnectAll(4);
  for (size_t i = 0; i < clients.size(); ++i) AdvertiseKeys(clients[i], 200 + i);
  for (SecureClient& s : clients) Answer(s);
  std::vector<std::optional<fl::v1::SecAggMaskingStart>> starts;
  for (SecureClient& s : clients) starts.push_back(Answer(s));
  // c3 shared its keys, then never uploads: the round closes at its deadline with three masked updates.
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(starts[i].has_value());
    EXPECT_EQ(UploadMasked(clients[i], *starts[i]).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  }
  Advance(60'000);
  ASSERT_EQ(engine_->state(), EngineState::kUnmasking);
  for (size_t i = 0; i < 3; ++i) Answer(clients[i]);
  // Its pairwise masks were removed with its mask key, rebuilt from the survivors' shares: the mean is the three's.
  const std::vector<double> move = MoveIn(1);
  ASSERT_EQ(move.size(), kParams);
  const double bound = secagg::AggregateErrorBound({1.0, 65536, 1}) + 1e-6;
  for (size_t i = 0; i < kParams; ++i) ASSERT_NEAR(move[i], 0.02, bound) << "coordinate " << i;
  auto rounds = Reader()->ListRounds(ExperimentId());
  ASSERT_TRUE(rounds.ok());
  ASSERT_EQ(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].secagg_survivors, 3);
  EXPECT_EQ((*rounds)[0].secagg_dropped, 1);
  EXPECT_EQ(RowsOfRound(1).at(clients[3].client.id).outcome, instrumentation::ClientOutcome::kDropped);
}

TEST_F(EngineSecAggTest, AClientMissingTheKeyStageIsDroppedAndCancelledAtTheStageDeadline) {
  StartEngine(Config(4, 3));
  std::vector<SecureClient> clients = ConnectAll(4);
  for (size_t i = 0; i < 3; ++i) AdvertiseKeys(clients[i], 300 + i);
  // c3 never advertises: nothing goes out until the stage's deadline.
  for (SecureClient& s : clients) EXPECT_FALSE(Answer(s).has_value());
  Advance(2'001);
  std::optional<fl::v1::CancelTask> cancel = test_harness::LastCancel(clients[3].client);
  ASSERT_TRUE(cancel.has_value()) << "the client that missed the stage was not told";
  EXPECT_NE(cancel->reason().find("did not advertise its keys"), std::string::npos) << cancel->reason();
  for (size_t i = 0; i < 3; ++i) Answer(clients[i]);
  std::vector<fl::v1::SecAggMaskingStart> starts;
  for (size_t i = 0; i < 3; ++i) {
    auto start = Answer(clients[i]);
    ASSERT_TRUE(start.has_value());
    starts.push_back(*start);
  }
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(UploadMasked(clients[i], starts[i]).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  for (size_t i = 0; i < 3; ++i) Answer(clients[i]);
  const std::vector<double> move = MoveIn(1);
  ASSERT_EQ(move.size(), kParams);
  EXPECT_NEAR(move[0], 0.02, 1e-4);
}

TEST_F(EngineSecAggTest, TheServersOwnStallMovesTheKeyStageDeadlineOnAndDropsNobody) {
  EngineConfig config = Config(3);
  config.stall_threshold_ms = 1'000;
  StartEngine(config);
  std::vector<SecureClient> clients = ConnectAll(3);
  AdvertiseKeys(clients[0], 600);
  AdvertiseKeys(clients[1], 601);
  // fl-server paused 10 s, five times the stage's deadline; then c2's keys, sent during the pause, are read.
  clock_.AdvanceMs(10'000);
  Run();
  AdvertiseKeys(clients[2], 602);
  EXPECT_FALSE(test_harness::LastCancel(clients[2].client).has_value())
      << "dropped for the server's stall: " << test_harness::LastCancel(clients[2].client)->reason();
  for (SecureClient& s : clients) Answer(s);
  for (SecureClient& s : clients) EXPECT_TRUE(Answer(s).has_value()) << s.client.id << " got no masking start";
}

TEST_F(EngineSecAggTest, TooFewSurvivorsToUnmaskFailTheAttemptAndLeaveTheModelUntouched) {
  // The round would commit with one update, but its masks cannot all be removed.
  StartEngine(Config(3, 1));
  std::vector<SecureClient> clients = ConnectAll(3);
  for (size_t i = 0; i < clients.size(); ++i) AdvertiseKeys(clients[i], 400 + i);
  for (SecureClient& s : clients) Answer(s);
  std::vector<fl::v1::SecAggMaskingStart> starts;
  for (SecureClient& s : clients) starts.push_back(*Answer(s));
  // Three clients, full graph, threshold 2: with one survivor, nobody holds two shares of anyone's secrets.
  EXPECT_EQ(UploadMasked(clients[0], starts[0]).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Advance(60'000);
  auto reader = Reader();
  auto rounds = reader->ListRounds(ExperimentId());
  ASSERT_TRUE(rounds.ok());
  ASSERT_GE(rounds->size(), 1u);
  EXPECT_EQ((*rounds)[0].status, instrumentation::RoundStatus::kFailed);
  EXPECT_NE((*rounds)[0].failure_reason.find("threshold"), std::string::npos) << (*rounds)[0].failure_reason;
  EXPECT_NE((*rounds)[0].failure_reason.find("global model is untouched"), std::string::npos);
  EXPECT_FALSE(LoadCheckpoint(CheckpointPath(dir_.File("ckpt"), 1)).ok()) << "a failed secure round was committed";
  // The next attempt went out: new train tasks with a new setup.
  EXPECT_EQ(LastTask(clients[1].client)->secagg().round(), 1u);
  EXPECT_EQ(test_harness::TrainTasks(clients[1].client).size(), 2u);
}

TEST_F(EngineSecAggTest, OutOfPlaceMessagesAreRefusedAndRecordedAsSecurityEvents) {
  StartEngine(Config(3));
  std::vector<SecureClient> clients = ConnectAll(3);
  AdvertiseKeys(clients[0], 500);
  // The same keys again, keys claiming another participant, and a masked upload before the masking stage.
  fl::v1::ClientMessage again;
  auto r = secagg::ClientRound::Start(LastTask(clients[1].client)->secagg(), secagg::RandomSource::SeededForTests(501),
                                      again.mutable_secagg_keys());
  ASSERT_TRUE(r.ok());
  fl::v1::ClientMessage forged = again;
  forged.mutable_secagg_keys()->set_client_id(forged.secagg_keys().client_id() + 1);
  Send(clients[1].client, forged);
  Send(clients[1].client, again);
  Send(clients[1].client, again);

  const fl::v1::Task task = *LastTask(clients[2].client);
  fl::v1::UpdateHeader h = test_harness::DeltaHeader(clients[2].client.id, clients[2].client.token, task, 50);
  h.set_codec("secagg-z32");
  h.set_payload_bytes((kParams + 1) * 4);
  std::optional<fl::v1::UploadUpdateResponse> refused = StartUpload(h);
  ASSERT_TRUE(refused.has_value()) << "a masked upload before the masking stage was admitted";
  EXPECT_NE(refused->error().message().find("secagg_masking_start"), std::string::npos) << refused->error().message();

  auto events = Reader()->ListSecurityEvents(ExperimentId());
  ASSERT_TRUE(events.ok()) << events.status();
  int secagg = 0;
  for (const auto& e : *events) secagg += e.reason == instrumentation::SecurityRefusal::kSecAgg ? 1 : 0;
  EXPECT_EQ(secagg, 2) << "the forged and the duplicate keys";
}

TEST_F(EngineSecAggTest, AClientWithoutTheSecAggCapabilityIsRefusedAtJoinNamingIt) {
  StartEngine(Config(3));
  fl::v1::JoinRequest req;
  req.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
  req.set_client_name("old");
  req.set_num_train_examples(100);
  *req.mutable_model_spec() = proto::ToProto(client::SyntheticTrainer(kParams, 10, 1).spec(), "synthetic");
  std::optional<grpc::Status> status;
  engine_->Post(JoinEvent{req, "test", [&](const grpc::Status& s, const fl::v1::JoinResponse&) { status = s; }, ""});
  Run();
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status->error_message().find("'secagg-v1'"), std::string::npos) << status->error_message();
}

TEST_F(EngineSecAggTest, AggregatorsThatNeedEachUpdateAndBufferedStepsAreRefused) {
  EngineConfig c = Config(3);
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  c.aggregator = "fedmedian";
  absl::Status s = c.Validate();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("fedmedian"), absl::string_view::npos) << s;
  c.aggregator = "fedavg";
  c.aggregation = "buffered";
  s = c.Validate();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("buffered"), absl::string_view::npos) << s;
  c.aggregation = "synchronous";
  c.secagg_scale = 1 << 30;
  c.secagg_range = 100;
  s = c.Validate();
  EXPECT_FALSE(s.ok()) << "a quantisation range no client fits in was accepted";
}

}  // namespace
}  // namespace fl::server
