// instrumentation_bench: what the server's instrumentation costs per round (docs/performance.md,
// "Instrumentation overhead").
//
// Per round and client the server (1) writes one client_rounds row, (2) observes five phase histograms and
// two byte counters and an update counter, and (3) handles about one clock ping per heartbeat; per round it
// writes one rounds row and observes the round and aggregation histograms. Each benchmark below does exactly
// that work for K clients through the real RecordStore (SQLite file, WAL, its writer thread; Flush() waits
// for the commit so the writer's time is counted too) and the real prometheus-cpp registry behind
// ServerMetrics (served on a loopback port, as fl-server does).
//
// The reference is the quickstart's own round: with --quickstart_db=PATH (a records database of a quickstart
// run, as bench/instrumentation_overhead.sh makes in the same invocation) the table at the end states each
// benchmark's time per round as a share of the median committed round's duration there. The target is < 1%.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fl/core/clock.h"
#include "fl/core/clock_sync.h"
#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/instrumentation/record_store.h"
#include "fl/instrumentation/records.h"
#include "fl/instrumentation/server_metrics.h"

namespace {

using fl::instrumentation::ClientRoundRecord;
using fl::instrumentation::RecordStore;
using fl::instrumentation::RoundRecord;

constexpr int kHeartbeatsPerRound = 16;  // the quickstart's ~15 s rounds at the default 1 s heartbeat

std::string ScratchDb() {
  static int counter = 0;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fl::StrCat("fl_instr_bench_", getpid(), "_", counter++);
  std::filesystem::create_directories(dir);
  return (dir / "records.db").string();
}

ClientRoundRecord ClientRow(const std::string& experiment, int64_t round, int k) {
  ClientRoundRecord r;
  r.experiment_id = experiment;
  r.round = round;
  r.attempt = 1;
  r.client_id = fl::StrCat("client-", k);
  r.dispatched_unix_ms = fl::UnixMs();
  r.num_examples = 15000;
  r.num_steps = 469;
  r.downlink_ms = 12.5;
  r.train_ms = 14000.0 + k;
  r.eval_ms = 900.0;
  r.uplink_ms = 10.1;
  r.uplink_server_ms = 8.2;
  r.idle_ms = 1.0;
  r.downlink_bytes = 1'700'000;
  r.uplink_bytes = 1'700'000;
  r.codec = "fp32";
  r.train_loss = 0.4;
  r.clock_offset_ms = 0.01;
  r.clock_rtt_ms = 0.2;
  r.downlink_start_unix_ms = 1.7e12;
  r.train_start_unix_ms = 1.7e12 + 13;
  r.uplink_start_unix_ms = 1.7e12 + 14013;
  r.uplink_end_unix_ms = 1.7e12 + 14023;
  r.uplink_server_start_unix_ms = 1.7e12 + 14014;
  return r;
}

struct Store {
  std::string path;
  std::unique_ptr<RecordStore> store;
  std::string experiment = "bench";
};

Store OpenStore(benchmark::State& state) {
  Store s;
  s.path = ScratchDb();
  auto store = RecordStore::Open(s.path);
  if (!store.ok()) {
    state.SkipWithError(std::string(fl::ToStd(store.status().message())).c_str());
    return s;
  }
  s.store = std::move(*store);
  fl::instrumentation::ExperimentRecord exp;
  exp.id = s.experiment;
  exp.name = "bench";
  exp.started_unix_ms = fl::UnixMs();
  exp.software_version = "bench";
  (void)s.store->Enqueue(exp);
  for (int k = 0; k < 64; ++k) {
    fl::instrumentation::ClientRecord c;
    c.experiment_id = s.experiment;
    c.client_id = fl::StrCat("client-", k);
    c.joined_unix_ms = fl::UnixMs();
    (void)s.store->Enqueue(c);
  }
  (void)s.store->Flush();
  return s;
}

// (1) records: one round's rows for K clients, enqueued from the "engine thread" and committed by the writer.
void BM_RoundRecords(benchmark::State& state) {
  const int k_clients = static_cast<int>(state.range(0));
  Store s = OpenStore(state);
  if (s.store == nullptr) return;
  int64_t round = 0;
  for (auto _ : state) {
    ++round;
    RoundRecord r;
    r.experiment_id = s.experiment;
    r.round = round;
    r.attempt = 1;
    r.status = fl::instrumentation::RoundStatus::kCommitted;
    r.started_unix_ms = fl::UnixMs();
    r.ended_unix_ms = r.started_unix_ms + 15000;
    r.duration_ms = 15000;
    r.aggregation_ms = 3;
    r.num_selected = k_clients;
    r.num_accepted = k_clients;
    r.model_version = round;
    if (absl::Status st = s.store->Enqueue(r); !st.ok()) state.SkipWithError("enqueue failed");
    for (int k = 0; k < k_clients; ++k) {
      if (absl::Status st = s.store->Enqueue(ClientRow(s.experiment, round, k)); !st.ok()) {
        state.SkipWithError("enqueue failed");
      }
    }
    if (absl::Status st = s.store->Flush(); !st.ok()) state.SkipWithError("flush failed");
  }
  (void)s.store->Close();
  std::filesystem::remove_all(std::filesystem::path(s.path).parent_path());
  state.SetLabel("one round's rows, committed");
}

// (2) Prometheus: one round's observations for K clients.
void BM_RoundMetrics(benchmark::State& state) {
  const int k_clients = static_cast<int>(state.range(0));
  auto metrics = fl::instrumentation::ServerMetrics::Start("127.0.0.1:0", "bench");
  if (!metrics.ok()) {
    state.SkipWithError(std::string(fl::ToStd(metrics.status().message())).c_str());
    return;
  }
  std::vector<std::string> clients;
  for (int k = 0; k < k_clients; ++k) clients.push_back(fl::StrCat("client-", k));
  std::vector<ClientRoundRecord> rows;
  for (int k = 0; k < k_clients; ++k) rows.push_back(ClientRow("bench", 1, k));
  uint64_t round = 0;
  for (auto _ : state) {
    ++round;
    for (int k = 0; k < k_clients; ++k) {
      for (const char* phase : {"downlink", "train", "eval", "idle", "uplink"}) {
        (*metrics)->ObservePhase(phase, "ethernet", "x86_64", clients[k], 1.5);
      }
      (*metrics)->AddBytes("down", "ethernet", 1'700'000);
      (*metrics)->AddBytes("up", "ethernet", 1'700'000);
      (*metrics)->CountUpdate("ok", "");
    }
    (*metrics)->ObserveRound(15.0);
    (*metrics)->ObserveAggregation(0.003);
    (*metrics)->SetCurrentRound(round);
    (*metrics)->CountStraggler(rows);
    (*metrics)->SetTrainLoss(0.4);
  }
  state.SetLabel("one round's observations");
}

// (3) clock sync: a round's worth of ping/pong samples for K clients (the four-timestamp arithmetic and the
// min-rtt window), plus one estimate per client at the update.
void BM_RoundClockSync(benchmark::State& state) {
  const int k_clients = static_cast<int>(state.range(0));
  std::vector<fl::core::ClockOffsetEstimator> estimators(k_clients);
  int64_t t = 1'000'000'000;
  for (auto _ : state) {
    for (auto& e : estimators) {
      for (int h = 0; h < kHeartbeatsPerRound; ++h) {
        t += 1'000'000;
        benchmark::DoNotOptimize(e.Add(t, t + 250'000'000 + 40'000, t + 250'000'000 + 60'000, t + 100'000));
      }
      benchmark::DoNotOptimize(e.Estimate());
    }
  }
  state.SetLabel("one round's clock exchanges");
}

BENCHMARK(BM_RoundRecords)->Arg(4)->Arg(10)->Arg(50)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_RoundMetrics)->Arg(4)->Arg(10)->Arg(50)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RoundClockSync)->Arg(4)->Arg(10)->Arg(50)->Unit(benchmark::kMicrosecond);

// Collects each benchmark's time per iteration (= per round) for the share table.
class ShareReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    benchmark::ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred || run.run_type != Run::RT_Iteration) continue;
      per_round_us[run.benchmark_name()] = run.GetAdjustedRealTime() * 1.0;  // in the benchmark's unit (us)
    }
  }
  std::map<std::string, double> per_round_us;
};

// Median duration of the committed rounds of the latest experiment in `db`.
double MedianRoundMs(const std::string& db) {
  auto reader = fl::instrumentation::RecordReader::Open(db);
  if (!reader.ok()) {
    std::fprintf(stderr, "--quickstart_db %s: %s\n", db.c_str(),
                 std::string(fl::ToStd(reader.status().message())).c_str());
    std::exit(2);
  }
  auto experiments = (*reader)->ListExperiments();
  if (!experiments.ok() || experiments->empty()) {
    std::fprintf(stderr, "--quickstart_db %s holds no experiment; run the quickstart first\n", db.c_str());
    std::exit(2);
  }
  auto rounds = (*reader)->ListRounds(experiments->back().id);
  std::vector<double> ms;
  if (rounds.ok()) {
    for (const RoundRecord& r : *rounds) {
      if (r.status == fl::instrumentation::RoundStatus::kCommitted) ms.push_back(r.duration_ms);
    }
  }
  if (ms.empty()) {
    std::fprintf(stderr, "--quickstart_db %s: its latest experiment has no committed round\n", db.c_str());
    std::exit(2);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string quickstart_db;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--quickstart_db=", 0) == 0) {
      quickstart_db = a.substr(16);
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  ShareReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  if (quickstart_db.empty()) return 0;

  const double round_ms = MedianRoundMs(quickstart_db);
  std::printf("\nReference: median quickstart round %.1f ms (%s)\n\n", round_ms, quickstart_db.c_str());
  std::printf("| clients | records us/round | metrics us/round | clock sync us/round | total | share of round |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|\n");
  for (int k : {4, 10, 50}) {
    auto get = [&](const std::string& name) {
      // BM_RoundRecords runs with UseRealTime(), which appends "/real_time" to its name.
      auto it = reporter.per_round_us.find(fl::StrCat(name, "/", k));
      if (it == reporter.per_round_us.end()) it = reporter.per_round_us.find(fl::StrCat(name, "/", k, "/real_time"));
      return it == reporter.per_round_us.end() ? 0.0 : it->second;
    };
    const double rec = get("BM_RoundRecords");
    const double met = get("BM_RoundMetrics");
    const double clk = get("BM_RoundClockSync");
    const double total = rec + met + clk;
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.4f%% |\n", k, rec, met, clk, total,
                100.0 * total / 1000.0 / round_ms);
  }
  return 0;
}
