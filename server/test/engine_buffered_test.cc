// Buffered asynchronous aggregation (FedBuff) on an injected ManualClock, driven event by event (StartManual +
// RunUntilIdle): which clients train, the staleness of each update and its weight, refusals above
// --max-staleness, the exact aggregate of known deltas, the step count, deadlines, the end. Records go to a real
// SQLite database and are read back; the global model is read from the steps' checkpoints.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/codec.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/server/checkpoint.h"
#include "fl/server/staleness.h"
#include "manual_engine.h"

namespace fl::server {
namespace {

using instrumentation::ClientOutcome;
using instrumentation::ClientRoundRecord;
using test_harness::kParams;
using test_harness::TestClient;
using test_harness::TrainTasks;

TEST(StalenessWeightTest, PolyAndConstantWeights) {
  auto sqrt_weight = ParseStalenessWeight("poly:a=0.5");
  ASSERT_TRUE(sqrt_weight.ok()) << sqrt_weight.status();
  EXPECT_DOUBLE_EQ((*sqrt_weight)(0), 1.0);
  EXPECT_DOUBLE_EQ((*sqrt_weight)(3), 0.5);  // 1/sqrt(1+3)
  auto linear = ParseStalenessWeight("poly:a=1");
  ASSERT_TRUE(linear.ok());
  EXPECT_DOUBLE_EQ((*linear)(4), 0.2);
  auto constant = ParseStalenessWeight("constant");
  ASSERT_TRUE(constant.ok());
  EXPECT_DOUBLE_EQ((*constant)(100), 1.0);
  EXPECT_EQ(constant->ToString(), "constant");
  EXPECT_EQ(sqrt_weight->ToString(), "poly:a=0.5");
  for (const char* bad : {"poly:a=-1", "poly:a=x", "hinge", "poly:b=2", ""}) {
    auto w = ParseStalenessWeight(bad);
    ASSERT_FALSE(w.ok()) << bad;
    EXPECT_NE(std::string(w.status().message()).find("use \"constant\""), std::string::npos) << w.status();
  }
}

EngineConfig BufferedConfig() {
  EngineConfig c = test_harness::SmallConfig("");
  c.aggregation = "buffered";
  c.fit = {1.0, 1, 4};
  c.buffer_size = 2;
  c.concurrency = 3;
  c.max_staleness = 1;
  c.staleness_weight = "poly:a=0.5";
  c.num_rounds = 3;
  c.evaluate_every = 0;
  c.round_deadline_ms = 10'000;
  c.heartbeat_interval_ms = 60'000;
  c.print_table = false;
  return c;
}

TEST(BufferedConfigTest, CombinationsThatCannotWorkAreRefusedSayingWhatWould) {
  EXPECT_TRUE(BufferedConfig().Validate().ok()) << BufferedConfig().Validate();
  auto refused = [](EngineConfig c, std::string_view why, std::string_view fix) {
    absl::Status s = c.Validate();
    ASSERT_FALSE(s.ok()) << why;
    EXPECT_NE(std::string(s.message()).find(why), std::string::npos) << s;
    EXPECT_NE(std::string(s.message()).find(fix), std::string::npos) << s;
  };
  EngineConfig median = BufferedConfig();
  median.aggregator = "median";
  refused(median, "robust aggregator 'median'", "--strategy fedavg");
  EngineConfig trimmed = BufferedConfig();
  trimmed.aggregator = "trimmed_mean:0.2";
  refused(trimmed, "synchronous cohort", "--aggregation=synchronous");
  EngineConfig too_big = BufferedConfig();
  too_big.buffer_size = 4;  // concurrency 3
  refused(too_big, "--buffer-size=4 is larger than --concurrency=3", "use --buffer-size <= 3");
  EngineConfig population = BufferedConfig();
  population.fit = {1.0, 1, 2};
  population.buffer_size = 3;
  refused(population, "larger than --min-available-clients=2", "raise --min-available-clients");
  EngineConfig stale = BufferedConfig();
  stale.max_staleness = 0;
  refused(stale, "--max-staleness=0", "--max-staleness >= 1");
  EngineConfig idle = BufferedConfig();
  idle.concurrency = 0;
  refused(idle, "--concurrency=0", "e.g. --concurrency=10");
  EngineConfig unknown = BufferedConfig();
  unknown.aggregation = "async";
  refused(unknown, "--aggregation=async", "buffered");
  EngineConfig weight = BufferedConfig();
  weight.staleness_weight = "poly:a=-2";
  refused(weight, "--staleness-weight=poly:a=-2", "poly:a=0.5");
  // Synchronous experiments do not look at the buffered settings.
  EngineConfig sync = BufferedConfig();
  sync.aggregation = "synchronous";
  sync.max_staleness = 0;
  sync.aggregator = "median";
  EXPECT_TRUE(sync.Validate().ok()) << sync.Validate();
}

class EngineBufferedTest : public test_harness::ManualEngineTest {
 protected:
  EngineBufferedTest() : ManualEngineTest("fl_engine_buffered") {}

  void StartEngine(EngineConfig config) {
    config.checkpoint_dir = dir_.File("ckpt");
    ManualEngineTest::StartEngine(std::move(config));
  }

  TestClient Connect(const std::string& name, fl::v1::LinkKind link = fl::v1::LINK_KIND_ETHERNET) {
    return ManualEngineTest::Connect(name, link);
  }

  static std::vector<std::string> Cancels(const TestClient& c) {
    std::vector<std::string> ids;
    for (const auto& m : c.channel->sent()) {
      if (m.has_cancel()) ids.push_back(m.cancel().task_id());
    }
    return ids;
  }
  // The client's task still waiting for its update (the last one sent, unless it was answered).
  std::optional<fl::v1::Task> OpenTask(const TestClient& c) const {
    std::vector<fl::v1::Task> tasks = TrainTasks(c);
    if (tasks.empty() || answered_.contains(tasks.back().task_id())) return std::nullopt;
    return tasks.back();
  }

  // Uploads a delta of `value` everywhere with `examples` examples for the client's open task.
  fl::v1::UploadUpdateResponse Upload(const TestClient& c, float value, uint64_t examples) {
    std::optional<fl::v1::Task> task = OpenTask(c);
    EXPECT_TRUE(task.has_value()) << c.id << " has no open task";
    if (!task.has_value()) return {};
    // In the codec the task named (link-aware compression), fp32 unless a policy says otherwise.
    const std::string codec_name = task->uplink_codec().empty() ? "fp32" : task->uplink_codec();
    auto codec = core::MakeCodec(codec_name);
    EXPECT_TRUE(codec.ok()) << codec_name;
    fl::v1::UpdateHeader header = test_harness::DeltaHeader(c.id, c.token, *task, examples);
    header.set_codec(codec_name);
    header.set_payload_bytes((*codec)->EncodedSize(kParams));
    EXPECT_FALSE(StartUpload(header).has_value()) << "refused at the header";
    std::vector<uint8_t> payload;
    EXPECT_TRUE((*codec)->Encode(std::vector<float>(kParams, value), &payload).ok());
    const fl::v1::UploadUpdateResponse verdict = FinishUpload(header, std::move(payload), clock_.NowNs());
    answered_.insert(task->task_id());
    return verdict;
  }

  size_t TasksOut(const std::vector<TestClient*>& clients) const {
    size_t n = 0;
    for (const TestClient* c : clients) n += OpenTask(*c).has_value() ? 1 : 0;
    return n;
  }

  std::map<std::string, ClientRoundRecord> Rows(int64_t step) { return RowsOfRound(step); }
  std::vector<float> ModelOfStep(uint64_t step) {
    auto ckpt = LoadCheckpoint(CheckpointPath(dir_.File("ckpt"), step));
    EXPECT_TRUE(ckpt.ok()) << ckpt.status();
    return ckpt.ok() ? ckpt->values : std::vector<float>{};
  }

  std::set<std::string> answered_;  // tasks whose update was uploaded
};

TEST_F(EngineBufferedTest, ConcurrencyClientsTrainAndEachReturnedUpdateIsReplacedByANewTask) {
  StartEngine(BufferedConfig());
  TestClient a = Connect("a"), b = Connect("b"), c = Connect("c");
  std::vector<TestClient*> all{&a, &b, &c};
  EXPECT_EQ(TasksOut(all), 0u) << "nothing goes out before --min-available-clients=4 are connected";
  EXPECT_EQ(engine_->state(), EngineState::kWaitingForClients);
  TestClient d = Connect("d");
  all.push_back(&d);
  EXPECT_EQ(engine_->state(), EngineState::kBuffering);
  ASSERT_EQ(TasksOut(all), 3u) << "--concurrency=3";
  TestClient* waiting = *std::find_if(all.begin(), all.end(), [&](TestClient* x) { return !OpenTask(*x).has_value(); });
  std::vector<TestClient*> busy;
  for (TestClient* x : all) {
    if (x != waiting) busy.push_back(x);
  }
  for (TestClient* x : busy) EXPECT_EQ(OpenTask(*x)->model_version(), 0u) << "trained from the initial model";

  // The first update is buffered; its client waits for the step, and the idle client takes the free place.
  EXPECT_EQ(Upload(*busy[0], 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(TasksOut(all), 3u);
  ASSERT_TRUE(OpenTask(*waiting).has_value());
  EXPECT_EQ(OpenTask(*waiting)->model_version(), 0u);
  EXPECT_FALSE(OpenTask(*busy[0]).has_value()) << "a client with an update in the open step gets no task";
  EXPECT_TRUE(Reader()->ListRounds(engine_->config().experiment_id)->empty()) << "1 of --buffer-size=2";

  // The second fills the buffer: step 1 is applied, and both clients train again, on version 1 (one of them: three
  // are out again).
  EXPECT_EQ(Upload(*busy[1], 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  auto rounds = *Reader()->ListRounds(engine_->config().experiment_id);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].round, 1);
  EXPECT_EQ(rounds[0].num_accepted, 2);
  EXPECT_EQ(rounds[0].model_version, 1);
  EXPECT_EQ(TasksOut(all), 3u);
  const int on_v1 = (OpenTask(*busy[0]) && OpenTask(*busy[0])->model_version() == 1) +
                    (OpenTask(*busy[1]) && OpenTask(*busy[1])->model_version() == 1);
  EXPECT_EQ(on_v1, 1);
}

TEST_F(EngineBufferedTest, StalenessWeightsTheAggregateAndUpdatesAboveMaxStalenessAreRefused) {
  StartEngine(BufferedConfig());
  TestClient a = Connect("a"), b = Connect("b"), c = Connect("c"), d = Connect("d");
  std::vector<TestClient*> all{&a, &b, &c, &d};
  std::vector<TestClient*> v0;
  for (TestClient* x : all) {
    if (OpenTask(*x)) v0.push_back(x);
  }
  ASSERT_EQ(v0.size(), 3u);
  TestClient* fourth = *std::find_if(all.begin(), all.end(), [&](TestClient* x) { return !OpenTask(*x).has_value(); });
  // Step 1: two fresh updates (tau 0, weight 1): the weighted mean of 0.1 x 10 and 0.4 x 30 examples = 0.325.
  ASSERT_EQ(Upload(*v0[0], 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(Upload(*v0[1], 0.4f, 30).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  std::vector<float> step1 = ModelOfStep(1);
  ASSERT_EQ(step1.size(), kParams);
  for (size_t i : {size_t{0}, size_t{kParams / 2}, size_t{kParams - 1}}) {
    EXPECT_NEAR(step1[i], initial_[i] - 0.325f, 1e-6) << "fedavg: global - mean(delta), element " << i;
  }
  auto rows1 = Rows(1);
  ASSERT_EQ(rows1.size(), 2u);
  for (const auto& [id, row] : rows1) {
    EXPECT_EQ(row.outcome, ClientOutcome::kOk);
    EXPECT_EQ(row.base_model_version, 0);
    EXPECT_EQ(row.staleness, 0);
    EXPECT_DOUBLE_EQ(row.staleness_weight.value_or(-1), 1.0);
  }

  // v0[2] and the fourth client still train from version 0: tau = 1 now. One of v0[0], v0[1] trains from version 1.
  TestClient* fresh = OpenTask(*v0[0]) ? v0[0] : v0[1];
  ASSERT_TRUE(OpenTask(*fresh).has_value());
  ASSERT_EQ(OpenTask(*fresh)->model_version(), 1u);
  ASSERT_EQ(OpenTask(*v0[2])->model_version(), 0u);
  // Step 2: a stale update (tau 1: weight 10/sqrt(2)) and a fresh one (weight 20): mean of 0.3 and 0.6.
  ASSERT_EQ(Upload(*v0[2], 0.3f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(Upload(*fresh, 0.6f, 20).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  const double w_stale = 10.0 / std::sqrt(2.0), w_fresh = 20.0;
  const double mean2 = (w_stale * 0.3 + w_fresh * 0.6) / (w_stale + w_fresh);
  std::vector<float> step2 = ModelOfStep(2);
  ASSERT_EQ(step2.size(), kParams);
  for (size_t i : {size_t{0}, size_t{kParams - 1}}) EXPECT_NEAR(step2[i], step1[i] - mean2, 1e-6) << i;
  auto rows2 = Rows(2);
  ASSERT_EQ(rows2.size(), 2u);
  EXPECT_EQ(rows2[v0[2]->id].staleness, 1);
  EXPECT_EQ(rows2[v0[2]->id].base_model_version, 0);
  EXPECT_NEAR(rows2[v0[2]->id].staleness_weight.value_or(-1), 1 / std::sqrt(2.0), 1e-12);
  EXPECT_EQ(rows2[fresh->id].staleness, 0);
  EXPECT_EQ(rows2[fresh->id].base_model_version, 1);

  // The fourth client was given version 0 before step 1: now 2 versions behind, above --max-staleness=1.
  ASSERT_EQ(OpenTask(*fourth)->model_version(), 0u);
  fl::v1::UploadUpdateResponse refused = Upload(*fourth, 0.2f, 10);
  EXPECT_EQ(refused.outcome(), fl::v1::UPDATE_OUTCOME_REJECTED);
  EXPECT_NE(refused.error().message().find("stale: the update was trained from model version 0, 2 versions behind"),
            std::string::npos)
      << refused.error().message();
  EXPECT_FALSE(OpenTask(*fourth).has_value()) << "a refused client waits for the step its refusal is recorded in";
  // Step 3 (the last) takes the next two updates; the refusal is one of its rows.
  std::vector<TestClient*> out;
  for (TestClient* x : all) {
    if (OpenTask(*x)) out.push_back(x);
  }
  ASSERT_EQ(out.size(), 3u) << "three train again: --concurrency=3, the refused client waits";
  ASSERT_EQ(Upload(*out[0], 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(Upload(*out[1], 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  auto rows3 = Rows(3);
  ASSERT_EQ(rows3.size(), 4u);
  EXPECT_EQ(rows3[fourth->id].outcome, ClientOutcome::kRejected);
  EXPECT_EQ(rows3[fourth->id].staleness, 2);
  EXPECT_FALSE(rows3[fourth->id].staleness_weight.has_value()) << "refused: no weight applied";
  EXPECT_NE(rows3[fourth->id].reject_reason.find("--max-staleness=1"), std::string::npos);
  // The task still out at the last step is cancelled: the client is told, and the row says so.
  EXPECT_EQ(rows3[out[2]->id].outcome, ClientOutcome::kCancelled);
  EXPECT_EQ(Cancels(*out[2]).size(), 1u);
  auto rounds = *Reader()->ListRounds(engine_->config().experiment_id);
  ASSERT_EQ(rounds.size(), 3u) << "--rounds=3 aggregation steps";
  EXPECT_EQ(rounds[2].num_accepted, 2);
  EXPECT_EQ(rounds[2].num_rejected, 1);
  EXPECT_EQ(rounds[2].num_selected, 4);
  EXPECT_EQ(rounds[2].model_version, 3);
  Advance(2'000);  // the grace for the last uplink reports (the test's clients send none)
  EXPECT_EQ(engine_->state(), EngineState::kFinished);
  auto experiment = Reader()->GetExperiment(engine_->config().experiment_id);
  ASSERT_TRUE(experiment.ok());
  EXPECT_EQ(experiment->aggregation, "buffered");
  EXPECT_EQ(experiment->status, instrumentation::ExperimentStatus::kFinished);
}

TEST_F(EngineBufferedTest, ATaskPastItsDeadlineIsDroppedAndItsPlaceGoesToAnotherClient) {
  EngineConfig config = BufferedConfig();
  config.concurrency = 2;
  StartEngine(config);
  TestClient a = Connect("a"), b = Connect("b"), c = Connect("c"), d = Connect("d");
  std::vector<TestClient*> all{&a, &b, &c, &d};
  std::vector<TestClient*> first;
  for (TestClient* x : all) {
    if (OpenTask(*x)) first.push_back(x);
  }
  ASSERT_EQ(first.size(), 2u);
  Advance(4'000);
  ASSERT_EQ(Upload(*first[0], 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(TasksOut(all), 2u);
  Advance(6'000 - 1);
  EXPECT_TRUE(OpenTask(*first[1]).has_value());
  std::set<std::string> before;
  for (TestClient* x : all) {
    if (OpenTask(*x)) before.insert(OpenTask(*x)->task_id());
  }
  const std::string dropped = OpenTask(*first[1])->task_id();
  Advance(1);                 // first[1]'s deadline (10 s after its dispatch)
  answered_.insert(dropped);  // closed by the engine: never answered
  // Its slot goes to the one client neither training nor waiting for the step.
  size_t new_tasks = 0;
  for (TestClient* x : all) {
    if (OpenTask(*x) && !before.contains(OpenTask(*x)->task_id())) ++new_tasks;
  }
  EXPECT_EQ(new_tasks, 1u);
  EXPECT_EQ(TasksOut(all), 2u);
  EXPECT_FALSE(OpenTask(*first[1]).has_value()) << "the dropped client waits for the step its drop is recorded in";
  // The drop is a row of the open step: it appears with step 1's commit.
  TestClient* third = nullptr;
  for (TestClient* x : all) {
    if (x != first[0] && x != first[1] && OpenTask(*x)) third = x;
  }
  ASSERT_NE(third, nullptr);
  ASSERT_EQ(Upload(*third, 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  auto rows1 = Rows(1);
  ASSERT_EQ(rows1.size(), 3u);
  EXPECT_EQ(rows1[first[1]->id].outcome, ClientOutcome::kDropped);
  EXPECT_FALSE(rows1[first[1]->id].staleness.has_value());
  auto rounds = *Reader()->ListRounds(engine_->config().experiment_id);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].num_dropped, 1);
  EXPECT_EQ(rounds[0].num_accepted, 2);
}

TEST_F(EngineBufferedTest, AnEvaluationWaitsForIdleClientsAndTheNextStepWaitsForTheEvaluation) {
  EngineConfig config = BufferedConfig();
  config.evaluate_every = 1;
  config.fraction_evaluate = 1.0;  // every connected client: all four must be free of train tasks
  StartEngine(config);
  TestClient a = Connect("a"), b = Connect("b"), c = Connect("c"), d = Connect("d");
  std::vector<TestClient*> all{&a, &b, &c, &d};
  std::vector<TestClient*> first;
  for (TestClient* x : all) {
    if (OpenTask(*x)) first.push_back(x);
  }
  ASSERT_EQ(first.size(), 3u);
  TestClient* fourth = *std::find_if(all.begin(), all.end(), [&](TestClient* x) { return !OpenTask(*x).has_value(); });
  ASSERT_EQ(Upload(*first[0], 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);  // fourth takes the place
  ASSERT_EQ(Upload(*first[1], 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);  // step 1 applied
  ASSERT_EQ(Reader()->ListRounds(engine_->config().experiment_id)->size(), 1u);
  // Step 1 is due for evaluation: no train task goes out while first[2] and the fourth still train.
  EXPECT_EQ(engine_->state(), EngineState::kWaitingForClients);
  EXPECT_EQ(TasksOut(all), 2u);
  // Their updates are buffered (the buffer is full) but not applied before the evaluation.
  ASSERT_EQ(Upload(*first[2], 0.2f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(engine_->state(), EngineState::kWaitingForClients);
  ASSERT_EQ(Upload(*fourth, 0.2f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  EXPECT_EQ(Reader()->ListRounds(engine_->config().experiment_id)->size(), 1u);
  ASSERT_EQ(engine_->state(), EngineState::kEvaluating) << "all four idle: the evaluation of step 1 goes out";
  for (TestClient* x : all) {
    std::optional<fl::v1::Task> eval;
    for (const auto& m : x->channel->sent()) {
      if (m.has_task() && m.task().kind() == fl::v1::TASK_KIND_EVALUATE) eval = m.task();
    }
    ASSERT_TRUE(eval.has_value()) << x->id;
    EXPECT_EQ(eval->round(), 1u);
    EXPECT_EQ(eval->model_version(), 1u) << "the evaluated version";
    fl::v1::ClientMessage m;
    m.mutable_evaluation()->set_task_id(eval->task_id());
    m.mutable_evaluation()->set_num_examples(10);
    m.mutable_evaluation()->set_loss(0.5);
    m.mutable_evaluation()->set_accuracy(0.75);
    engine_->Post(SessionMessageEvent{x->channel, std::move(m), clock_.NowNs()});
    Run();
  }
  // Stored; then step 2 is applied with the two updates trained from version 0 (staleness 1).
  auto rounds = *Reader()->ListRounds(engine_->config().experiment_id);
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_DOUBLE_EQ(rounds[0].eval_accuracy.value_or(-1), 0.75);
  auto rows2 = Rows(2);
  ASSERT_EQ(rows2.size(), 2u);
  for (const auto& [id, row] : rows2) EXPECT_EQ(row.staleness, 1) << id;
  EXPECT_EQ(engine_->state(), EngineState::kEvaluating) << "step 2 is evaluated in turn: every client is idle";
}

TEST_F(EngineBufferedTest, LinkAwareCodecsApplyToBufferedTasks) {
  EngineConfig config = BufferedConfig();
  config.uplink_codec_policy = "by-link:5g=int4,wifi=int8,ethernet=fp32,default=fp32";
  config.concurrency = 4;
  StartEngine(config);
  TestClient a = Connect("a", fl::v1::LINK_KIND_5G), b = Connect("b", fl::v1::LINK_KIND_WIFI);
  TestClient c = Connect("c", fl::v1::LINK_KIND_ETHERNET), d = Connect("d", fl::v1::LINK_KIND_ETHERNET);
  ASSERT_TRUE(OpenTask(a).has_value() && OpenTask(b).has_value());
  EXPECT_EQ(OpenTask(a)->uplink_codec(), "int4");
  EXPECT_EQ(OpenTask(b)->uplink_codec(), "int8");
  EXPECT_EQ(OpenTask(c)->uplink_codec(), "fp32");
  // Each update in its own codec is decoded with it: 0.5 is exact in int4 and int8 blockwise (one scale per block).
  ASSERT_EQ(Upload(a, 0.5f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(Upload(b, 0.5f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  auto rows = Rows(1);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows["a"].codec, "int4");
  EXPECT_EQ(rows["b"].codec, "int8");
  std::vector<float> step1 = ModelOfStep(1);
  ASSERT_EQ(step1.size(), kParams);
  EXPECT_NEAR(step1[0], initial_[0] - 0.5f, 1e-6);
}

// Every connected client waits for the open step and no task is out: nothing could fill the buffer. With an update
// in it the step is applied as it is; with none the attempt fails (like a round's) and the tasks go out again.
TEST_F(EngineBufferedTest, AStepNobodyCanFillIsAppliedAsItIsOrFailsWithoutUpdates) {
  EngineConfig config = BufferedConfig();
  config.fit = {1.0, 1, 2};
  config.concurrency = 2;
  config.buffer_size = 2;
  config.num_rounds = 2;
  StartEngine(config);
  TestClient a = Connect("a"), b = Connect("b");
  ASSERT_TRUE(OpenTask(a).has_value() && OpenTask(b).has_value());
  ASSERT_EQ(Upload(a, 0.25f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  const std::string b_task = OpenTask(b)->task_id();
  Advance(10'000);  // b's deadline: dropped; a and b both wait for step 1, nothing is out
  answered_.insert(b_task);
  auto rounds = *Reader()->ListRounds(engine_->config().experiment_id);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, instrumentation::RoundStatus::kCommitted);
  EXPECT_EQ(rounds[0].num_accepted, 1) << "applied with 1 of --buffer-size=2";
  EXPECT_EQ(rounds[0].num_dropped, 1);
  EXPECT_NEAR(ModelOfStep(1)[0], initial_[0] - 0.25f, 1e-6);
  // Step 2: both tasks expire.
  ASSERT_TRUE(OpenTask(a).has_value() && OpenTask(b).has_value());
  const std::string a2 = OpenTask(a)->task_id(), b2 = OpenTask(b)->task_id();
  Advance(10'000);
  answered_.insert(a2);
  answered_.insert(b2);
  rounds = *Reader()->ListRounds(engine_->config().experiment_id);
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds[1].round, 2);
  EXPECT_EQ(rounds[1].attempt, 1);
  EXPECT_EQ(rounds[1].status, instrumentation::RoundStatus::kFailed);
  EXPECT_NE(rounds[1].failure_reason.find("no update in the buffer"), std::string::npos) << rounds[1].failure_reason;
  // Attempt 2 of step 2 went out to both at once.
  ASSERT_TRUE(OpenTask(a).has_value() && OpenTask(b).has_value());
  EXPECT_EQ(OpenTask(a)->task_id().rfind("s2.2-", 0), 0u) << OpenTask(a)->task_id();
  EXPECT_EQ(engine_->state(), EngineState::kBuffering);
}

TEST_F(EngineBufferedTest, AShutdownRecordsTheOpenStepAsAbortedAndCancelsTheTasksOut) {
  StartEngine(BufferedConfig());
  TestClient a = Connect("a"), b = Connect("b"), c = Connect("c"), d = Connect("d");
  std::vector<TestClient*> all{&a, &b, &c, &d};
  TestClient* first = *std::find_if(all.begin(), all.end(), [&](TestClient* x) { return OpenTask(*x).has_value(); });
  ASSERT_EQ(Upload(*first, 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  engine_->Post(ShutdownEvent{"operator stop"});
  Run();
  EXPECT_EQ(engine_->state(), EngineState::kFinished);
  size_t cancelled = 0;
  for (TestClient* x : all) cancelled += Cancels(*x).size();
  EXPECT_EQ(cancelled, 3u);
  auto rounds = *Reader()->ListRounds(engine_->config().experiment_id);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, instrumentation::RoundStatus::kAborted);
  EXPECT_EQ(rounds[0].failure_reason, "operator stop");
  EXPECT_EQ(Rows(1).size(), 1u);
}

}  // namespace
}  // namespace fl::server
