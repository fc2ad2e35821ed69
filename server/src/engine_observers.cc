// Observers of the round engine: live Prometheus metrics and the console table. Neither decides anything; the
// engine tells them what happened (round_engine.h, EngineObserver).
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "fl/proto/convert.h"
#include "fl/server/round_engine.h"

namespace fl::server {
namespace {

class MetricsObserver final : public EngineObserver {
 public:
  explicit MetricsObserver(instrumentation::ServerMetrics* metrics) : metrics_(metrics) {}

  void OnConnectedClients(int64_t connected) override { metrics_->SetConnectedClients(connected); }

  void OnUpdateOutcome(instrumentation::ClientOutcome outcome, std::string_view reason,
                       const instrumentation::ClientRoundRecord& row, const fl::v1::JoinRequest& client) override {
    metrics_->CountUpdate(instrumentation::ClientOutcomeName(outcome), reason);
    if (outcome != instrumentation::ClientOutcome::kOk) return;
    // Phase histograms and bytes of accepted updates only: a refused report's numbers are not trusted.
    const std::string link = std::string(proto::LinkKindName(client.link().kind()));
    const std::string& device = client.device().device_class();
    auto phase = [&](std::string_view name, const std::optional<double>& ms) {
      if (ms.has_value()) metrics_->ObservePhase(name, link, device, row.client_id, *ms / 1000.0);
    };
    phase("downlink", row.downlink_ms);
    phase("train", row.train_ms);
    phase("eval", row.eval_ms);
    phase("idle", row.idle_ms);
    phase("uplink", row.uplink_server_ms);
    metrics_->AddBytes("down", link, static_cast<uint64_t>(row.downlink_bytes.value_or(0)));
    metrics_->AddBytes("up", link, static_cast<uint64_t>(row.uplink_bytes.value_or(0)));
  }

  void OnRoundCommitted(const CommittedRound& round) override {
    metrics_->ObserveRound(round.duration_ms / 1000.0);
    metrics_->ObserveAggregation(round.aggregation_ms / 1000.0);
    metrics_->SetCurrentRound(round.round);
    if (round.client_rows != nullptr) metrics_->CountStraggler(*round.client_rows);
    if (round.train_loss.has_value()) metrics_->SetTrainLoss(*round.train_loss);
    if (round.dp_epsilon.has_value()) metrics_->SetPrivacyEpsilon(*round.dp_epsilon);
  }

  void OnSecurityRefusal(instrumentation::SecurityRefusal reason) override { metrics_->CountSecurityRefusal(reason); }
  void OnEvaluationStored(uint64_t /*round*/, const instrumentation::ServerMetrics::Evaluation& figures) override {
    metrics_->SetEvaluation(figures);
  }

 private:
  instrumentation::ServerMetrics* metrics_;
};

// The per-round table a person watches in the terminal; the records database has everything else. Its metric
// column is the task's: accuracy, MAE or perplexity (the task is known: a round needs a client).
class ConsoleTable final : public EngineObserver {
 public:
  explicit ConsoleTable(bool steps) : steps_(steps) {}
  void OnRoundDone(const CommittedRound& round, core::Task task,
                   const std::optional<instrumentation::ServerMetrics::Evaluation>& eval) override {
    if (!printed_header_) {
      const char* metric = task == core::Task::kRegression  ? "test_mae"
                           : task == core::Task::kNextToken ? "test_ppl"
                                                            : "test_acc";
      std::printf("%6s %8s %11s %10s %10s %12s\n", steps_ ? "step" : "round", "clients", "train_loss", "test_loss",
                  metric, steps_ ? "step_time_s" : "round_time_s");
      printed_header_ = true;
    }
    std::optional<double> metric;
    if (eval.has_value()) {
      metric = task == core::Task::kRegression  ? eval->mae
               : task == core::Task::kNextToken ? eval->perplexity
                                                : eval->accuracy;
    }
    const std::string train_loss = round.train_loss ? absl::StrFormat("%.4f", *round.train_loss) : "-";
    const std::string test_loss = eval ? absl::StrFormat("%.4f", eval->loss) : "-";
    const std::string test_metric = metric ? absl::StrFormat("%.4f", *metric) : "-";
    std::printf("%6llu %8u %11s %10s %10s %12.2f\n", static_cast<unsigned long long>(round.round), round.accepted,
                train_loss.c_str(), test_loss.c_str(), test_metric.c_str(), round.duration_ms / 1000.0);
    std::fflush(stdout);
  }

 private:
  bool printed_header_ = false;
  bool steps_ = false;  // buffered aggregation: rows are aggregation steps
};

}  // namespace

std::unique_ptr<EngineObserver> MakeMetricsObserver(instrumentation::ServerMetrics* metrics) {
  return std::make_unique<MetricsObserver>(metrics);
}

std::unique_ptr<EngineObserver> MakeConsoleTable(bool steps) { return std::make_unique<ConsoleTable>(steps); }

}  // namespace fl::server
