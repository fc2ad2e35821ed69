// The fixture of the round engine's event-level tests (engine_clock, engine_overcommit, engine_buffered,
// engine_codecs): a RoundEngine on an injected ManualClock, driven event by event on the test's thread
// (StartManual + RunUntilIdle), its records in a real SQLite database, and clients whose session is a
// RecordingChannel that keeps what the engine sent. No gRPC: uploads are posted as the reactor would post them.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/instrumentation/record_reader.h"
#include "fl/rpc/clock.h"
#include "fl/server/checkpoint.h"
#include "fl/testing/scratch_dir.h"
#include "federation_harness.h"

namespace fl::server::test_harness {

// The server's side of a session as the engine sees it: what it sent, and whether (and how) it closed it.
class RecordingChannel final : public SessionChannel {
 public:
  void Send(fl::v1::ServerMessage message) override {
    std::lock_guard lock(mu_);
    sent_.push_back(std::move(message));
  }
  void Close(const grpc::Status& status) override {
    std::lock_guard lock(mu_);
    if (!closed_.has_value()) closed_ = status;
  }
  std::optional<grpc::Status> closed() const {
    std::lock_guard lock(mu_);
    return closed_;
  }
  std::vector<fl::v1::ServerMessage> sent() const {
    std::lock_guard lock(mu_);
    return sent_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<fl::v1::ServerMessage> sent_;
  std::optional<grpc::Status> closed_;
};

struct TestClient {
  std::string id;
  std::string token;
  bool asked_for_initial_model = false;
  std::shared_ptr<RecordingChannel> channel;
};

// The last task the engine sent the client, if any.
inline std::optional<fl::v1::Task> LastTask(const TestClient& c) {
  std::optional<fl::v1::Task> task;
  for (const auto& m : c.channel->sent()) {
    if (m.has_task()) task = m.task();
  }
  return task;
}

// Every train task the engine sent the client, in order.
inline std::vector<fl::v1::Task> TrainTasks(const TestClient& c) {
  std::vector<fl::v1::Task> tasks;
  for (const auto& m : c.channel->sent()) {
    if (m.has_task() && m.task().kind() == fl::v1::TASK_KIND_TRAIN) tasks.push_back(m.task());
  }
  return tasks;
}

// The last CancelTask the engine sent the client, if any.
inline std::optional<fl::v1::CancelTask> LastCancel(const TestClient& c) {
  std::optional<fl::v1::CancelTask> cancel;
  for (const auto& m : c.channel->sent()) {
    if (m.has_cancel()) cancel = m.cancel();
  }
  return cancel;
}

class ManualEngineTest : public ::testing::Test {
 protected:
  explicit ManualEngineTest(const char* scratch_prefix) : dir_(scratch_prefix) {}

  // initial_ keeps the start point's model values (InitialModel(1) unless given); `metrics`, when given, gets the
  // engine's live metrics.
  void StartEngine(EngineConfig config, RoundEngine::StartPoint start = InitialModel(1),
                   instrumentation::ServerMetrics* metrics = nullptr) {
    if (start.checkpoint.has_value()) initial_ = start.checkpoint->values;
    records_ = *instrumentation::RecordStore::Open(dir_.File("records.db"));
    engine_ = std::make_unique<RoundEngine>(std::move(config), records_.get(), std::move(start), &clock_);
    engine_->SetMetrics(metrics);
    ASSERT_TRUE(engine_->StartManual().ok());
  }

  void TearDown() override {
    if (engine_ != nullptr) {
      engine_->Post(ShutdownEvent{"test over"});
      engine_->RunUntilIdle();
    }
    if (records_ != nullptr) (void)records_->Close();
  }

  void Run() { engine_->RunUntilIdle(); }
  void Advance(int64_t ms) {
    clock_.AdvanceMs(ms);
    Run();
  }

  // Joins as `name` with the synthetic model of kParams parameters, 100 training and 10 test examples, and the
  // link kind when one is given; the Join must be accepted.
  TestClient Join(const std::string& name, fl::v1::LinkKind link = fl::v1::LINK_KIND_UNSPECIFIED) {
    fl::v1::JoinRequest req;
    req.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
    req.set_client_name(name);
    // What fl-client of this release declares (secure aggregation and client-side privacy).
    req.add_capabilities("secagg-v1");
    req.add_capabilities("client-privacy-v1");
    if (link != fl::v1::LINK_KIND_UNSPECIFIED) req.mutable_link()->set_kind(link);
    req.set_num_train_examples(100);
    req.set_num_test_examples(10);
    *req.mutable_model_spec() = proto::ToProto(client::SyntheticTrainer(kParams, 10, 1).spec(), "synthetic");
    TestClient c;
    std::optional<grpc::Status> status;
    engine_->Post(JoinEvent{req, "test",
                            [&](const grpc::Status& s, const fl::v1::JoinResponse& r) {
                              status = s;
                              c.id = r.client_id();
                              c.token = r.session_token();
                              c.asked_for_initial_model = r.initial_model_requested();
                            },
                            ""});
    Run();
    EXPECT_TRUE(status.has_value() && status->ok()) << (status ? status->error_message() : "no answer");
    return c;
  }

  // Opens the client's session stream.
  void Open(TestClient& c) {
    c.channel = std::make_shared<RecordingChannel>();
    fl::v1::SessionHello hello;
    hello.set_client_id(c.id);
    hello.set_session_token(c.token);
    engine_->Post(SessionOpenEvent{hello, c.channel, "test"});
    Run();
  }

  TestClient Connect(const std::string& name, fl::v1::LinkKind link = fl::v1::LINK_KIND_UNSPECIFIED) {
    TestClient c = Join(name, link);
    Open(c);
    return c;
  }

  // Posts an upload's header as the reactor does; returns the refusal if the engine refused it at the header
  // (nullopt: admitted, a slot is held).
  std::optional<fl::v1::UploadUpdateResponse> StartUpload(const fl::v1::UpdateHeader& header,
                                                          std::shared_ptr<UploadHandle> handle = nullptr) {
    std::optional<fl::v1::UploadUpdateResponse> refusal;
    bool answered = false;
    engine_->Post(UploadStartEvent{header, clock_.NowNs(),
                                   [&](std::optional<fl::v1::UploadUpdateResponse> r, std::vector<uint8_t>) {
                                     answered = true;
                                     refusal = std::move(r);
                                   },
                                   std::move(handle), "test"});
    Run();
    EXPECT_TRUE(answered) << "the engine did not answer the upload's header";
    return refusal;
  }

  // Ends an admitted upload with `payload` (its transfer verified, as the reactor guarantees); the verdict.
  fl::v1::UploadUpdateResponse FinishUpload(const fl::v1::UpdateHeader& header, std::vector<uint8_t> payload,
                                            int64_t first_byte_ns) {
    UploadDoneEvent done;
    done.header = header;
    done.payload = std::move(payload);
    done.first_byte_server_ns = first_byte_ns;
    done.done_server_ns = clock_.NowNs();
    fl::v1::UploadUpdateResponse verdict;
    done.reply = [&](const fl::v1::UploadUpdateResponse& r) { verdict = r; };
    engine_->Post(std::move(done));
    Run();
    return verdict;
  }

  // A delta of `value` in every coordinate, fp32-encoded.
  static std::vector<uint8_t> Fp32Delta(float value) {
    std::vector<uint8_t> payload;
    EXPECT_TRUE((*core::MakeCodec("fp32"))->Encode(std::vector<float>(kParams, value), &payload).ok());
    return payload;
  }

  std::unique_ptr<instrumentation::RecordReader> Reader() {
    EXPECT_TRUE(records_->Flush().ok());
    return *instrumentation::RecordReader::Open(dir_.File("records.db"));
  }
  std::string ExperimentId() { return engine_->config().experiment_id; }
  // The client_rounds rows of `round` (or buffered step), by client id.
  std::map<std::string, instrumentation::ClientRoundRecord> RowsOfRound(int64_t round) {
    std::map<std::string, instrumentation::ClientRoundRecord> rows;
    auto listed = Reader()->ListClientRounds(ExperimentId(), round);
    EXPECT_TRUE(listed.ok()) << listed.status();
    if (!listed.ok()) return rows;
    for (instrumentation::ClientRoundRecord& r : *listed) rows[r.client_id] = std::move(r);
    return rows;
  }

  // The global model's move in `round`: the checkpoint (in dir_/ckpt) of the round before minus this round's,
  // coordinate by coordinate; empty (with a failure) when either is missing.
  std::vector<double> MoveIn(uint64_t round) {
    auto before = LoadCheckpoint(CheckpointPath(dir_.File("ckpt"), round - 1));
    auto after = LoadCheckpoint(CheckpointPath(dir_.File("ckpt"), round));
    EXPECT_TRUE(before.ok()) << before.status();
    EXPECT_TRUE(after.ok()) << after.status();
    std::vector<double> move;
    if (!before.ok() || !after.ok()) return move;
    for (size_t i = 0; i < before->values.size() && i < after->values.size(); ++i) {
      move.push_back(double{before->values[i]} - double{after->values[i]});
    }
    return move;
  }

  fl::testing::ScratchDir dir_;
  rpc::ManualClock clock_;
  std::unique_ptr<instrumentation::RecordStore> records_;
  std::unique_ptr<RoundEngine> engine_;
  std::vector<float> initial_;
};

}  // namespace fl::server::test_harness
