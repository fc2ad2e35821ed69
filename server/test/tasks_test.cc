// End-to-end tests of what the server does with learning tasks and with the model's layout: the experiment's
// task is fixed by its first client and recorded, each task's evaluation figures reach the records and
// Prometheus (classification: accuracy; regression: MAE; next-token: perplexity and token accuracy), bad
// results are refused with a recorded reason, a client of another task or model is refused naming what
// differs, and integer tensors (BatchNorm's num_batches_tracked) are never averaged by any strategy.
// Real gRPC on loopback, real FederatedClient sessions with the SyntheticTrainer, raw fl.v1 clients.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/core/task.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/instrumentation/record_store.h"
#include "fl/instrumentation/server_metrics.h"
#include "fl/server/strategy.h"
#include "fl/testing/scratch_dir.h"
#include "federation_harness.h"

namespace fl::server {
namespace {

using namespace test_harness;  // NOLINT: the harness is this file's vocabulary
using instrumentation::RecordReader;

double Sql(RecordReader& reader, const std::string& sql) {
  auto text = reader.QueryText(sql);
  EXPECT_TRUE(text.ok()) << text.status() << " " << sql;
  return text.ok() && !text->empty() ? std::stod(*text) : std::nan("");
}

std::string Where(const std::string& experiment_id, int64_t round) {
  return fl::StrCat(" WHERE experiment_id = '", experiment_id, "' AND round = ", round);
}

// Runs two rounds with two clients of `task`, each evaluated, with Prometheus metrics; returns the records
// path, the experiment id, the last /metrics text (checked by promtool) and the server's console output.
struct TaskRun {
  std::string db;
  std::string experiment_id;
  std::string metrics_text;
  std::string console;
};

TaskRun RunTask(fl::testing::ScratchDir& dir, const std::string& task) {
  auto metrics = instrumentation::ServerMetrics::Start("127.0.0.1:0");
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  EngineConfig config = SmallConfig("");
  config.fit = {1.0, 2, 2};
  TaskRun run{dir.File("records.db"), "", "", ""};
  ::testing::internal::CaptureStdout();  // the round table fl-server prints
  TestServer server(config, run.db, InitialModel(1), metrics->get());
  auto a = StartClient(server.address(), "a", 1, "wifi", 0, 0, task);
  auto b = StartClient(server.address(), "b", 2, "5g", 0, 0, task);
  const EngineResult result = server.Wait();
  run.console = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(result.status_name(), "finished") << result.reason;
  a->thread.join();
  b->thread.join();
  EXPECT_TRUE(a->result.ok()) << a->result;
  run.metrics_text = HttpGet((*metrics)->port(), "/metrics");
  server.Stop();
  run.experiment_id = result.experiment_id;
  const std::string file = dir.File("metrics.txt");
  std::ofstream(file) << run.metrics_text;
  const int rc = std::system(("promtool check metrics < " + file + " > " + dir.File("lint.txt") + " 2>&1").c_str());
  std::ifstream lint(dir.File("lint.txt"));
  EXPECT_EQ(rc, 0) << std::string(std::istreambuf_iterator<char>(lint), {});
  return run;
}

// The value of an unlabelled gauge in a /metrics text; NaN when the series is absent.
double Gauge(const std::string& text, const std::string& name) {
  const std::string key = "\n" + name + " ";
  const size_t at = text.find(key);
  if (at == std::string::npos) return std::nan("");
  return std::stod(text.substr(at + key.size()));
}

TEST(TasksTest, RegressionRecordsTheWeightedMaeAndNoAccuracy) {
  fl::testing::ScratchDir dir("fl_tasks");
  const TaskRun run = RunTask(dir, "regression");
  auto reader = *RecordReader::Open(run.db);
  EXPECT_EQ(reader->GetExperiment(run.experiment_id)->task, "regression");
  auto rounds = *reader->ListRounds(run.experiment_id);
  ASSERT_EQ(rounds.size(), 2u);
  for (const auto& r : rounds) {
    SCOPED_TRACE(::testing::Message() << "round " << r.round);
    ASSERT_TRUE(r.eval_mae.has_value());
    EXPECT_FALSE(r.eval_accuracy.has_value());  // regression has no accuracy: NULL, not 0
    EXPECT_FALSE(r.eval_perplexity.has_value());
    // The round's MAE is the example-weighted mean of the clients' MAEs.
    const std::string where = Where(run.experiment_id, r.round);
    EXPECT_NEAR(*r.eval_mae,
                Sql(*reader, "SELECT sum(mae * num_examples) / sum(num_examples) FROM evaluations" + where), 1e-12);
    EXPECT_NEAR(*r.eval_loss,
                Sql(*reader, "SELECT sum(loss * num_examples) / sum(num_examples) FROM evaluations" + where), 1e-12);
    EXPECT_GT(*r.eval_mae, 0.0);
    EXPECT_EQ(Sql(*reader, "SELECT count(*) FROM evaluations" + where +
                               " AND mae IS NOT NULL AND accuracy IS NULL AND reject_reason IS NULL"),
              2);
  }
  EXPECT_NEAR(Gauge(run.metrics_text, "fl_eval_mae"), *rounds.back().eval_mae, 1e-6) << run.metrics_text;
  // The console table's metric column is the task's.
  EXPECT_NE(run.console.find("test_loss   test_mae round_time_s"), std::string::npos) << run.console;
  EXPECT_EQ(run.console.find("test_acc"), std::string::npos) << run.console;
  EXPECT_TRUE(std::isnan(Gauge(run.metrics_text, "fl_eval_accuracy"))) << run.metrics_text;
  EXPECT_TRUE(std::isnan(Gauge(run.metrics_text, "fl_eval_perplexity")));
}

TEST(TasksTest, NextTokenRecordsPerplexityAndTokenAccuracy) {
  fl::testing::ScratchDir dir("fl_tasks");
  const TaskRun run = RunTask(dir, "next-token");
  auto reader = *RecordReader::Open(run.db);
  EXPECT_EQ(reader->GetExperiment(run.experiment_id)->task, "next-token");
  auto rounds = *reader->ListRounds(run.experiment_id);
  ASSERT_EQ(rounds.size(), 2u);
  for (const auto& r : rounds) {
    SCOPED_TRACE(::testing::Message() << "round " << r.round);
    ASSERT_TRUE(r.eval_perplexity.has_value() && r.eval_loss.has_value() && r.eval_accuracy.has_value());
    EXPECT_FALSE(r.eval_mae.has_value());
    const std::string where = Where(run.experiment_id, r.round);
    // Perplexity is exp of the example-weighted mean token cross-entropy, not a mean of perplexities.
    const double mean_loss =
        Sql(*reader, "SELECT sum(loss * num_examples) / sum(num_examples) FROM evaluations" + where);
    EXPECT_NEAR(*r.eval_loss, mean_loss, 1e-12);
    EXPECT_NEAR(*r.eval_perplexity, std::exp(mean_loss), 1e-12);
    EXPECT_GE(*r.eval_perplexity, 1.0);
    EXPECT_NEAR(*r.eval_accuracy,
                Sql(*reader, "SELECT sum(accuracy * num_examples) / sum(num_examples) FROM evaluations" + where),
                1e-12);
  }
  EXPECT_NEAR(Gauge(run.metrics_text, "fl_eval_perplexity"), *rounds.back().eval_perplexity, 1e-6) << run.metrics_text;
  EXPECT_NEAR(Gauge(run.metrics_text, "fl_eval_accuracy"), *rounds.back().eval_accuracy, 1e-6);
  EXPECT_NE(run.console.find("test_loss   test_ppl round_time_s"), std::string::npos) << run.console;
  char ppl[32];
  std::snprintf(ppl, sizeof(ppl), "%.4f", *rounds.back().eval_perplexity);
  EXPECT_NE(run.console.find(ppl), std::string::npos) << run.console;
  EXPECT_TRUE(std::isnan(Gauge(run.metrics_text, "fl_eval_mae")));
}

TEST(TasksTest, ClassificationIsTheDefaultTaskAndRecordsAccuracyOnly) {
  fl::testing::ScratchDir dir("fl_tasks");
  const TaskRun run = RunTask(dir, "classification");
  auto reader = *RecordReader::Open(run.db);
  EXPECT_EQ(reader->GetExperiment(run.experiment_id)->task, "classification");
  auto rounds = reader->ListRounds(run.experiment_id);
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->size(), 2u);
  for (const auto& r : *rounds) {
    EXPECT_TRUE(r.eval_accuracy.has_value());
    EXPECT_FALSE(r.eval_mae.has_value() || r.eval_perplexity.has_value());
  }
  EXPECT_FALSE(std::isnan(Gauge(run.metrics_text, "fl_eval_accuracy")));
  EXPECT_NE(run.console.find("test_loss   test_acc round_time_s"), std::string::npos) << run.console;
}

TEST(TasksTest, AClientOfAnotherTaskIsRefusedNamingBothTasks) {
  fl::testing::ScratchDir dir("fl_tasks");
  TestServer server(SmallConfig(""), dir.File("records.db"), InitialModel(1));
  client::SyntheticTrainer same(kParams, 10, 1);
  RawClient raw(server.address());
  fl::v1::JoinResponse resp;
  ASSERT_TRUE(raw.Join("first", same.spec(), &resp, "regression").ok());
  // A rejoin with the same task is fine; another task, or none (= classification), is refused.
  ASSERT_TRUE(raw.Join("second", same.spec(), &resp, "regression").ok());
  for (const std::string task : {"classification", ""}) {
    const grpc::Status status = raw.Join("third", same.spec(), &resp, task);
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    const fl::v1::ErrorDetail detail = proto::ErrorFromGrpcStatus(status);
    EXPECT_EQ(detail.code(), fl::v1::ERROR_CODE_ADMISSION_REFUSED);
    EXPECT_EQ(detail.field(), "task");
    EXPECT_NE(detail.message().find("'third' trains for task 'classification'"), std::string::npos) << detail.message();
    EXPECT_NE(detail.message().find("this experiment's task is 'regression'"), std::string::npos) << detail.message();
    EXPECT_FALSE(detail.hint().empty());
  }
  // An unknown task is malformed, naming the value and the valid ones.
  const grpc::Status unknown = raw.Join("fourth", same.spec(), &resp, "segmentation");
  ASSERT_FALSE(unknown.ok());
  const fl::v1::ErrorDetail detail = proto::ErrorFromGrpcStatus(unknown);
  EXPECT_EQ(detail.code(), fl::v1::ERROR_CODE_MALFORMED);
  EXPECT_NE(detail.message().find("'segmentation'"), std::string::npos) << detail.message();
  EXPECT_NE(detail.message().find("next-token"), std::string::npos) << detail.message();
  const std::string id = server.engine().config().experiment_id;
  server.Stop();
  auto reader = *RecordReader::Open(dir.File("records.db"));
  EXPECT_EQ(reader->GetExperiment(id)->task, "regression");
  EXPECT_EQ(reader->ListClients(id)->size(), 2u);  // the refused ones left no client row
}

TEST(TasksTest, AResumedExperimentKeepsTheTaskOfItsCheckpoint) {
  fl::testing::ScratchDir dir("fl_tasks");
  const std::string db = dir.File("records.db");
  {
    auto store = *instrumentation::RecordStore::Open(db);
    instrumentation::ExperimentRecord exp;
    exp.id = "exp-resumed";
    exp.name = "resumed";
    exp.task = "next-token";
    exp.software_version = "test";
    ASSERT_TRUE(store->Enqueue(exp).ok());
    ASSERT_TRUE(store->Close().ok());
  }
  RoundEngine::StartPoint start = InitialModel(1);
  start.checkpoint->experiment_id = "exp-resumed";
  start.checkpoint->round = 1;
  start.checkpoint->task = "next-token";
  start.checkpoint->optimizer.optimizer = "fedavg";
  start.resume = true;
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  TestServer server(config, db, std::move(start));
  client::SyntheticTrainer same(kParams, 10, 1);
  RawClient raw(server.address());
  fl::v1::JoinResponse resp;
  const grpc::Status refused = raw.Join("lm-less", same.spec(), &resp, "classification");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(proto::ErrorFromGrpcStatus(refused).message().find("this experiment's task is 'next-token'"),
            std::string::npos);
  EXPECT_TRUE(raw.Join("lm", same.spec(), &resp, "next-token").ok());
}

TEST(TasksTest, AJoinWithAnotherModelNamesTheFirstDifferingTensor) {
  fl::testing::ScratchDir dir("fl_tasks");
  TestServer server(SmallConfig(""), dir.File("records.db"), InitialModel(1));
  RawClient raw(server.address());
  // The synthetic model is one tensor 'layers.0.weight' [5000]; this one has it as [5001] and one more.
  auto other = *core::ModelSpec::Create(
      {{"layers.0.weight", {5001}, core::DType::kFloat32, 0}, {"head.bias", {3}, core::DType::kFloat32, 0}});
  fl::v1::JoinResponse resp;
  const grpc::Status status = raw.Join("intruder", other, &resp);
  ASSERT_FALSE(status.ok());
  const fl::v1::ErrorDetail detail = proto::ErrorFromGrpcStatus(status);
  EXPECT_EQ(detail.code(), fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH);
  EXPECT_NE(detail.message().find("client 'intruder' trains a model that differs from this experiment's: tensor #0 "
                                  "'layers.0.weight' has shape [5001] in the client's model but [5000] in this "
                                  "experiment's model (first of 2 differences)"),
            std::string::npos)
      << detail.message();
  EXPECT_NE(detail.message().find(other.FingerprintHex()), std::string::npos) << detail.message();
}

TEST(TasksTest, WhileWaitingForTheInitialModelAJoinIsComparedWithTheFirstClientsModel) {
  fl::testing::ScratchDir dir("fl_tasks");
  TestServer server(SmallConfig(""), dir.File("records.db"));  // no initial model: the first client's
  RawClient raw(server.address());
  auto first = *core::ModelSpec::Create(
      {{"bn.weight", {4}, core::DType::kFloat32, 0}, {"bn.num_batches_tracked", {}, core::DType::kInt64, 0}});
  auto retyped = *core::ModelSpec::Create(
      {{"bn.weight", {4}, core::DType::kFloat32, 0}, {"bn.num_batches_tracked", {}, core::DType::kFloat32, 0}});
  fl::v1::JoinResponse resp;
  ASSERT_TRUE(raw.Join("first", first, &resp).ok());
  EXPECT_TRUE(resp.initial_model_requested());
  const grpc::Status status = raw.Join("second", retyped, &resp);
  ASSERT_FALSE(status.ok());
  const fl::v1::ErrorDetail detail = proto::ErrorFromGrpcStatus(status);
  EXPECT_EQ(detail.code(), fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH);
  EXPECT_NE(detail.message().find("differs from the first client's: tensor #1 'bn.num_batches_tracked' has dtype "
                                  "float32 in the client's model but int64 in the first client's model"),
            std::string::npos)
      << detail.message();
}

// An evaluation result the task cannot use is refused and recorded with why; the round's figures come from
// the good client alone.
struct BadResult {
  std::string task;
  std::string name;
  double loss = 0.5;
  double accuracy = 0.5;
  std::optional<double> mae = 0.25;
  std::string reason;  // part of the recorded reject_reason
};

void PrintTo(const BadResult& bad, std::ostream* os) { *os << bad.task << " " << bad.name; }

class BadEvaluationTest : public ::testing::TestWithParam<BadResult> {};

TEST_P(BadEvaluationTest, IsRefusedWithARecordedReason) {
  const BadResult& bad = GetParam();
  fl::testing::ScratchDir dir("fl_tasks");
  EngineConfig config = SmallConfig("");
  config.fit = {1.0, 1, 2};
  config.num_rounds = 1;
  config.round_deadline_ms = 1000;  // the raw client never trains: its task is dropped at the deadline
  config.heartbeat_interval_ms = 2000;
  TestServer server(config, dir.File("records.db"), InitialModel(1));
  auto good = StartClient(server.address(), "good", 1, "ethernet", 0, 0, bad.task);
  RawClient raw(server.address());
  auto session = raw.Connect("raw", nullptr, bad.task);
  ASSERT_NE(session, nullptr);
  fl::v1::ServerMessage msg;
  bool answered = false;
  while (session->stream->Read(&msg)) {
    if (!msg.has_task() || msg.task().kind() != fl::v1::TASK_KIND_EVALUATE) continue;
    fl::v1::ClientMessage m;
    fl::v1::EvaluationResult* r = m.mutable_evaluation();
    r->set_task_id(msg.task().task_id());
    r->set_round(msg.task().round());
    r->set_num_examples(50);
    r->set_loss(bad.loss);
    r->set_accuracy(bad.accuracy);
    if (bad.mae.has_value()) (*r->mutable_metrics())["mae"] = *bad.mae;
    ASSERT_TRUE(session->stream->Write(m));
    answered = true;
  }
  EXPECT_TRUE(answered);
  const EngineResult result = server.Wait();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  good->thread.join();
  server.Stop();
  auto reader = *RecordReader::Open(dir.File("records.db"));
  auto evaluations = *reader->ListEvaluations(result.experiment_id, 1);
  ASSERT_EQ(evaluations.size(), 2u);
  const auto& raw_row = evaluations[0].client_id == "raw" ? evaluations[0] : evaluations[1];
  const auto& good_row = evaluations[0].client_id == "raw" ? evaluations[1] : evaluations[0];
  EXPECT_NE(raw_row.reject_reason.find(bad.reason), std::string::npos) << raw_row.reject_reason;
  EXPECT_NE(raw_row.reject_reason.find(fl::StrCat("task '", bad.task, "'")), std::string::npos)
      << raw_row.reject_reason;
  EXPECT_FALSE(raw_row.loss.has_value() || raw_row.accuracy.has_value() || raw_row.mae.has_value());
  EXPECT_EQ(good_row.reject_reason, "");
  auto rounds = *reader->ListRounds(result.experiment_id);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].eval_num_examples, good_row.num_examples);
  EXPECT_EQ(rounds[0].eval_loss, good_row.loss);
}

INSTANTIATE_TEST_SUITE_P(
    Tasks, BadEvaluationTest,
    ::testing::Values(BadResult{"classification", "AccuracyAboveOne", 0.5, 1.5, std::nullopt, "accuracy 1.5"},
                      BadResult{"classification", "NegativeLoss", -0.1, 0.5, std::nullopt, "loss -0.1"},
                      BadResult{"next-token", "NonFiniteLoss", std::numeric_limits<double>::infinity(), 0.5,
                                std::nullopt, "loss inf"},
                      BadResult{"regression", "NegativeMae", 0.5, 0, -1.0, "MAE -1"},
                      BadResult{"regression", "MissingMae", 0.5, 0, std::nullopt, "must report its MAE"}),
    [](const ::testing::TestParamInfo<BadResult>& param_info) { return param_info.param.name; });

// Integer tensors are client-local: two clients upload different counters, and whatever the strategy, the
// committed global keeps the previous counter while the float tensor moves as the strategy says.
class IntegerTensorTest : public ::testing::TestWithParam<std::string> {};

TEST_P(IntegerTensorTest, AreNeverAveraged) {
  fl::testing::ScratchDir dir("fl_tasks");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  ASSERT_TRUE(ResolveStrategy(GetParam(), &config).ok());
  config.fit = {1.0, 2, 2};
  config.num_rounds = 1;
  config.evaluate_every = 0;
  config.heartbeat_interval_ms = 2000;
  const core::ModelSpec spec = *core::ModelSpec::Create({{"bn.weight", {4}, core::DType::kFloat32, 0},
                                                         {"bn.num_batches_tracked", {}, core::DType::kInt64, 0},
                                                         {"fc.weight", {2}, core::DType::kFloat32, 0}});
  RoundEngine::StartPoint start;
  start.checkpoint.emplace();
  start.checkpoint->spec = spec;
  start.checkpoint->model_name = "bn-test";
  start.checkpoint->values = {0, 0, 0, 0, 5, 0, 0};
  TestServer server(config, dir.File("records.db"), std::move(start));

  struct Upload {
    std::string name;
    std::vector<float> weights;
    uint64_t examples;
  };
  const Upload uploads[] = {{"a", {1, 1, 1, 1, 100, 1, 1}, 10}, {"b", {3, 3, 3, 3, 7, 3, 3}, 30}};
  RawClient raw(server.address());
  std::vector<std::thread> threads;
  for (const Upload& u : uploads) {
    threads.emplace_back([&, u] {
      auto session = raw.Connect(u.name, &spec);
      ASSERT_NE(session, nullptr);
      fl::v1::ServerMessage msg;
      while (session->stream->Read(&msg)) {
        if (!msg.has_task() || msg.task().kind() != fl::v1::TASK_KIND_TRAIN) continue;
        fl::v1::UpdateHeader h;
        h.set_client_id(session->joined.client_id());
        h.set_session_token(session->joined.session_token());
        h.set_task_id(msg.task().task_id());
        h.set_round(msg.task().round());
        h.set_base_model_version(msg.task().model_version());
        h.set_model_fingerprint(spec.fingerprint());
        h.set_kind(fl::v1::UPDATE_KIND_WEIGHTS);
        h.set_num_examples(u.examples);
        h.set_codec("fp32");
        std::vector<uint8_t> payload;
        ASSERT_TRUE((*core::MakeCodec("fp32"))->Encode(u.weights, &payload).ok());
        const fl::v1::UploadUpdateResponse r = raw.Upload(h, payload);
        EXPECT_EQ(r.outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED) << r.error().message();
      }
    });
  }
  const EngineResult result = server.Wait();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  for (auto& t : threads) t.join();
  server.Stop();
  auto ckpt = LoadCheckpoint(CheckpointPath(dir.File("ckpt"), 1));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ(ckpt->values.size(), 7u);
  EXPECT_EQ(ckpt->values[4], 5.0f) << "the int64 counter must keep the previous global's value";
  for (size_t i : {0, 1, 2, 3, 5, 6}) {
    EXPECT_GT(ckpt->values[i], 0.0f) << "float element " << i << " must move towards the clients";
    // FedAvg with server lr 1: the example-weighted mean (10 x 1 + 30 x 3) / 40.
    if (GetParam() == "fedavg") {
      EXPECT_FLOAT_EQ(ckpt->values[i], 2.5f) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, IntegerTensorTest,
                         ::testing::Values("fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedmedian",
                                           "fedtrimmedavg:0.2", "nesterov"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string name = param_info.param;
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace fl::server
