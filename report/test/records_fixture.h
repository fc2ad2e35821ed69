// Test support for fl-report: writes experiments into a real records database through the real
// RecordStore (the same write path fl-server uses), with figures the test chooses.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_store.h"
#include "fl/instrumentation/records.h"
#include "fl/instrumentation/sqlite.h"

namespace fl::report::testing {

namespace ins = fl::instrumentation;

// Fields have default initializers so that designated initializers may leave any of them out.
struct Phases {
  std::optional<double> downlink_ms = std::nullopt, train_ms = std::nullopt, eval_ms = std::nullopt,
                        uplink_ms = std::nullopt, uplink_server_ms = std::nullopt, idle_ms = std::nullopt;
  std::optional<int64_t> downlink_bytes = std::nullopt, uplink_bytes = std::nullopt;
  // Schema v3: phase starts on the server's timeline.
  std::optional<double> downlink_start = std::nullopt, train_start = std::nullopt, eval_start = std::nullopt,
                        uplink_start = std::nullopt, uplink_end = std::nullopt, uplink_server_start = std::nullopt;
};

class RecordsFixture {
 public:
  explicit RecordsFixture(std::string path) : path_(std::move(path)) {
    auto store = ins::RecordStore::Open(path_);
    EXPECT_TRUE(store.ok()) << store.status();
    if (store.ok()) store_ = std::move(*store);
  }

  const std::string& path() const { return path_; }

  void Experiment(const std::string& id, int64_t started_unix_ms, const std::string& name = "test") {
    ins::ExperimentRecord e;
    e.id = id;
    e.name = name;
    e.started_unix_ms = started_unix_ms;
    e.software_version = "test";
    Put(std::move(e));
  }

  void Client(const std::string& experiment, const std::string& id, const std::string& link_kind,
              const std::string& device_class = "cpu") {
    ins::ClientRecord c;
    c.experiment_id = experiment;
    c.client_id = id;
    c.client_name = id;
    c.link_kind = link_kind;
    c.device_class = device_class;
    c.joined_unix_ms = 1;
    Put(std::move(c));
  }

  // A round attempt that started at `started_unix_ms` and lasted `duration_ms`.
  void Round(const std::string& experiment, int64_t round, int64_t started_unix_ms, double duration_ms,
             ins::RoundStatus status = ins::RoundStatus::kCommitted, int64_t attempt = 0,
             std::optional<double> aggregation_ms = 1.5) {
    Put(RoundRow(experiment, round, started_unix_ms, duration_ms, status, attempt, aggregation_ms));
  }

  static ins::RoundRecord RoundRow(const std::string& experiment, int64_t round, int64_t started_unix_ms,
                                   double duration_ms, ins::RoundStatus status, int64_t attempt,
                                   std::optional<double> aggregation_ms) {
    ins::RoundRecord r;
    r.experiment_id = experiment;
    r.round = round;
    r.attempt = attempt;
    r.status = status;
    if (status != ins::RoundStatus::kCommitted) r.failure_reason = "test";
    r.started_unix_ms = started_unix_ms;
    r.ended_unix_ms = started_unix_ms + static_cast<int64_t>(duration_ms);
    r.duration_ms = duration_ms;
    r.aggregation_ms = aggregation_ms;
    if (status == ins::RoundStatus::kCommitted) r.model_version = round;
    r.num_selected = 3;
    r.num_accepted = 3;
    return r;
  }

  void ClientRound(const std::string& experiment, int64_t round, const std::string& client, int64_t dispatched_unix_ms,
                   const Phases& p, ins::ClientOutcome outcome = ins::ClientOutcome::kOk, int64_t attempt = 0) {
    ins::ClientRoundRecord c;
    c.experiment_id = experiment;
    c.round = round;
    c.attempt = attempt;
    c.client_id = client;
    c.outcome = outcome;
    if (outcome == ins::ClientOutcome::kRejected) c.reject_reason = "test";
    c.dispatched_unix_ms = dispatched_unix_ms;
    c.downlink_ms = p.downlink_ms;
    c.train_ms = p.train_ms;
    c.eval_ms = p.eval_ms;
    c.uplink_ms = p.uplink_ms;
    c.uplink_server_ms = p.uplink_server_ms;
    c.idle_ms = p.idle_ms;
    c.downlink_bytes = p.downlink_bytes;
    c.uplink_bytes = p.uplink_bytes;
    c.codec = "fp32";
    c.downlink_start_unix_ms = p.downlink_start;
    c.train_start_unix_ms = p.train_start;
    c.eval_start_unix_ms = p.eval_start;
    c.uplink_start_unix_ms = p.uplink_start;
    c.uplink_end_unix_ms = p.uplink_end;
    c.uplink_server_start_unix_ms = p.uplink_server_start;
    Put(std::move(c));
  }

  // A client's evaluation of the global model after round `round` (the round's row must exist).
  void Evaluation(const std::string& experiment, int64_t round, const std::string& client, double eval_ms,
                  int64_t attempt = 0) {
    ins::EvaluationRecord e;
    e.experiment_id = experiment;
    e.round = round;
    e.attempt = attempt;
    e.client_id = client;
    e.num_examples = 100;
    e.loss = 0.5;
    e.accuracy = 0.8;
    e.eval_ms = eval_ms;
    Put(std::move(e));
  }

  // The experiment's learning task (schema v6), as fl-server sets it when its first client joins.
  void Task(const std::string& experiment, const std::string& task) {
    Put(ins::ExperimentTaskUpdate{experiment, task});
  }

  // The global evaluation of a committed round attempt, as fl-server sets it after the round's evaluation.
  void RoundEvaluation(const std::string& experiment, int64_t round, double loss, std::optional<double> accuracy,
                       std::optional<double> mae, std::optional<double> perplexity, int64_t attempt = 0) {
    Put(ins::RoundEvaluationUpdate{experiment, round, attempt, loss, accuracy, 300, mae, perplexity});
  }

  // A client's evaluation with the figures of its task; `reject_reason` non-empty: refused by the server.
  void TaskEvaluation(const std::string& experiment, int64_t round, const std::string& client, double eval_ms,
                      std::optional<double> loss, std::optional<double> accuracy, std::optional<double> mae,
                      const std::string& reject_reason = "") {
    Put(ins::EvaluationRecord{experiment, round, 0, client, 100, loss, accuracy, eval_ms, mae, reject_reason});
  }

  // Something fl-server refused from or did to a client (schema v7); `round` < 0: none.
  void ClientEvent(const std::string& experiment, const std::string& client, ins::ClientEventKind kind, int64_t round,
                   const std::string& task_id, const std::string& reason, int64_t at_unix_ms) {
    Put(ins::ClientEventRecord{experiment, client, kind, round >= 0 ? std::optional<int64_t>(round) : std::nullopt,
                               task_id, reason, at_unix_ms});
  }

  // A call fl-server refused on the secure channel (schema v8).
  void SecurityEvent(const std::string& experiment, ins::SecurityRefusal reason, const std::string& peer,
                     const std::string& identity, const std::string& claimed, const std::string& detail,
                     int64_t at_unix_ms) {
    Put(ins::SecurityEventRecord{0, experiment, reason, peer, identity, claimed, detail, at_unix_ms});
  }

  // A committed secure-aggregation round (schema v11): Round()'s row with the clients in the unmasked sum and those
  // that dropped out of it.
  void SecureRound(const std::string& experiment, int64_t round, int64_t started_unix_ms, double duration_ms,
                   int64_t survivors, int64_t dropped) {
    ins::RoundRecord r =
        RoundRow(experiment, round, started_unix_ms, duration_ms, ins::RoundStatus::kCommitted, 0, 1.5);
    r.secagg_survivors = survivors;
    r.secagg_dropped = dropped;
    Put(std::move(r));
  }

  // One client's part in one stage of a secure round attempt (schema v11); the round's row must exist.
  void SecAggStage(const std::string& experiment, int64_t round, const std::string& client, ins::SecAggStage stage,
                   ins::SecAggStageOutcome outcome, std::optional<double> duration_ms, int64_t bytes_down,
                   int64_t bytes_up, const std::string& detail = "", int64_t attempt = 0) {
    Put(ins::SecAggStageRecord{experiment, round, attempt, client, stage, outcome, 1000.0, duration_ms, bytes_down,
                               bytes_up, detail});
  }

  // Everything enqueued is committed (the report reads it on its own connection).
  void Flush() {
    if (store_ != nullptr) {
      absl::Status s = store_->Flush();
      EXPECT_TRUE(s.ok()) << s;
    }
  }
  void Close() {
    if (store_ != nullptr) {
      absl::Status s = store_->Close();
      EXPECT_TRUE(s.ok()) << s;
      store_.reset();
    }
  }

  // Plain SQL on the file (after Flush): for what RecordStore does not write, e.g. to simulate a database
  // where a column is NULL.
  void Exec(const std::string& sql) {
    Flush();
    auto db = ins::sqlite::Database::Open(path_, SQLITE_OPEN_READWRITE);
    ASSERT_TRUE(db.ok()) << db.status();
    absl::Status s = db->Exec(sql);
    ASSERT_TRUE(s.ok()) << s << " in " << sql;
  }

  double QueryDouble(const std::string& sql) {
    Flush();
    auto db = ins::sqlite::Database::Open(path_, SQLITE_OPEN_READONLY);
    EXPECT_TRUE(db.ok()) << db.status();
    if (!db.ok()) return -1;
    auto st = db->Prepare(sql);
    EXPECT_TRUE(st.ok()) << st.status();
    if (!st.ok()) return -1;
    auto row = st->Step("test query");
    EXPECT_TRUE(row.ok() && *row) << sql;
    if (!row.ok() || !*row) return -1;
    return st->ColumnDouble(0);
  }
  std::string QueryText(const std::string& sql) {
    Flush();
    auto db = ins::sqlite::Database::Open(path_, SQLITE_OPEN_READONLY);
    if (!db.ok()) return "";
    auto text = db->QueryText(sql);
    EXPECT_TRUE(text.ok()) << text.status();
    return text.ok() ? *text : "";
  }

 private:
  void Put(ins::Record r) {
    if (store_ == nullptr) return;
    absl::Status s = store_->Enqueue(std::move(r));
    EXPECT_TRUE(s.ok()) << s;
  }

  std::string path_;
  std::unique_ptr<ins::RecordStore> store_;
};

}  // namespace fl::report::testing
