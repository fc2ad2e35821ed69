// A real Prometheus (Debian's package, on loopback, generated config) scrapes a live short experiment: fl-server
// and three fl-clients on different link kinds, every one of them serving /metrics. The tests then ask
// Prometheus what a person would ask it: did it reach every target, do the figures match the run, and does every
// panel of every Grafana dashboard answer with data once its template variables are filled in.
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "dashboards.h"
#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/testing/prometheus_server.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace fl::dashboards {
namespace {

using fl::testing::PrometheusServer;
using fl::testing::Subprocess;
using nlohmann::json;

constexpr int kRounds = 6;

struct ClientSpec {
  std::string name, link_kind, device_class, model;
};

// Different training times, so that one client is the usual straggler and the straggler panels have a story.
const std::vector<ClientSpec>& Clients() {
  static const std::vector<ClientSpec> kClients = {
      {"c-eth", "ethernet", "x86", "synthetic:20000:150"},
      {"c-wifi", "wifi", "rpi5", "synthetic:20000:250"},
      {"c-5g", "5g", "rpi4", "synthetic:20000:400"},
  };
  return kClients;
}

std::string Addr(int port) { return "127.0.0.1:" + std::to_string(port); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

double UnixNow() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// The value of a one-sample instant vector entry: ["<unix time>", "<value>"].
double Value(const json& sample) { return std::stod(sample["value"][1].get<std::string>()); }

// Prometheus, then fl-server and the clients (each with --metrics-addr and --metrics-linger-s, so that their
// final figures stay up to be scraped). Ready() once the experiment finished and every target was scraped after.
class LiveRun {
 public:
  LiveRun() : dir_("fl_live_prom") {}
  ~LiveRun() {
    for (auto& c : clients_) c->Kill(SIGTERM);
    if (server_ != nullptr) server_->Kill(SIGTERM);
    for (auto& c : clients_) c->Wait(std::chrono::seconds(15));
    if (server_ != nullptr) server_->Wait(std::chrono::seconds(15));
  }

  // Empty on success, else what went wrong with the logs.
  std::string Start() {
    const int grpc_port = fl::testing::FreeLoopbackPort();
    const int server_metrics = fl::testing::FreeLoopbackPort();
    std::vector<std::string> client_targets;
    std::vector<int> client_ports;
    for (size_t i = 0; i < Clients().size(); ++i) {
      client_ports.push_back(fl::testing::FreeLoopbackPort());
      client_targets.push_back(Addr(client_ports.back()));
    }
    auto prom = PrometheusServer::Start({{"fl-server", {Addr(server_metrics)}, {}}, {"fl-client", client_targets, {}}});
    if (!prom.ok()) return std::string(fl::ToStd(prom.status().message()));
    prom_ = std::move(*prom);
    // Prometheus hands new targets to its scrapers a few seconds after it starts: the run must not be over by then.
    if (absl::Status s = prom_->WaitUntilScraping(1 + Clients().size(), std::chrono::seconds(60)); !s.ok()) {
      return std::string(fl::ToStd(s.message()));
    }

    const std::string db = dir_.File("records.db");
    server_ = std::make_unique<Subprocess>(std::vector<std::string>{FL_SERVER_BIN,
                                                                    "--listen",
                                                                    Addr(grpc_port),
                                                                    "--db",
                                                                    db,
                                                                    "--rounds",
                                                                    std::to_string(kRounds),
                                                                    "--min-fit-clients",
                                                                    "3",
                                                                    "--min-available-clients",
                                                                    "3",
                                                                    "--evaluate-every",
                                                                    "2",
                                                                    "--round-deadline-ms",
                                                                    "30000",
                                                                    "--heartbeat-interval-ms",
                                                                    "300",
                                                                    "--metrics-addr",
                                                                    Addr(server_metrics),
                                                                    "--metrics-linger-s",
                                                                    "120",
                                                                    "--log-level",
                                                                    "warn",
                                                                    "--insecure"},
                                           dir_.File("server.log"));
    for (size_t i = 0; i < Clients().size(); ++i) {
      const ClientSpec& c = Clients()[i];
      std::vector<std::string> argv{FL_CLIENT_BIN,
                                    "--server",
                                    Addr(grpc_port),
                                    "--name",
                                    c.name,
                                    "--model",
                                    c.model,
                                    "--link-kind",
                                    c.link_kind,
                                    "--device-class",
                                    c.device_class,
                                    "--metrics-addr",
                                    client_targets[i],
                                    "--metrics-linger-s",
                                    "120",
                                    "--give-up-after-s",
                                    "60",
                                    "--log-level",
                                    "warn"};
      argv.push_back("--insecure");  // the dashboards' test; TLS has its own (server_tls_process_test)
      clients_.push_back(std::make_unique<Subprocess>(argv, dir_.File(c.name + ".log")));
    }
    // The run is over when the records say so; fl-server then lingers with its final figures on /metrics.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(180);
    while (!Finished(db)) {
      if (!server_->running()) return "fl-server exited before the experiment finished:\n" + Logs();
      if (std::chrono::steady_clock::now() > give_up) return "the experiment did not finish in 180 s:\n" + Logs();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // Wait for one scrape of every target that began after the end: then Prometheus holds the final values.
    const double finished_at = UnixNow();
    const size_t targets = 1 + Clients().size();
    auto scraped = prom_->QueryUntil(
        "count(timestamp(up) > " + std::to_string(finished_at) + ")",
        [&](const json& d) { return d["result"].size() == 1 && Value(d["result"][0]) == static_cast<double>(targets); },
        std::chrono::seconds(30));
    if (!scraped.ok()) return std::string(fl::ToStd(scraped.status().message()));
    if ((*scraped)["result"].size() != 1 || Value((*scraped)["result"][0]) != static_cast<double>(targets)) {
      return "Prometheus did not scrape every target after the run ended: " + scraped->dump() + "\n" + Logs();
    }
    auto round = prom_->Query("fl_current_round");
    if (!round.ok() || (*round)["result"].size() != 1) return "no fl_current_round series: " + Logs();
    experiment_ = (*round)["result"][0]["metric"].value("experiment", "");
    return "";
  }

  PrometheusServer& prom() { return *prom_; }
  const std::string& experiment() const { return experiment_; }

  // Query that must succeed; its result array.
  json Result(const std::string& promql) {
    auto data = prom_->Query(promql);
    EXPECT_TRUE(data.ok()) << promql << ": " << data.status();
    return data.ok() ? (*data)["result"] : json::array();
  }

  std::string Logs() const {
    std::string out = "--- fl-server\n" + ReadFile(dir_.File("server.log"));
    for (const auto& c : Clients()) out += "--- " + c.name + "\n" + ReadFile(dir_.File(c.name + ".log"));
    if (prom_ != nullptr) out += "--- prometheus (tail)\n" + prom_->LogTail(1500);
    return out;
  }

 private:
  static bool Finished(const std::string& db) {
    auto reader = instrumentation::RecordReader::Open(db);
    if (!reader.ok()) return false;
    auto n = (*reader)->QueryInt("SELECT count(*) FROM experiments WHERE status = 'finished'");
    return n.ok() && *n == 1;
  }

  fl::testing::ScratchDir dir_;
  std::unique_ptr<PrometheusServer> prom_;
  std::unique_ptr<Subprocess> server_;
  std::vector<std::unique_ptr<Subprocess>> clients_;
  std::string experiment_;
};

// Series of `result` keyed by the value of `label`.
std::map<std::string, double> ByLabel(const json& result, const std::string& label) {
  std::map<std::string, double> out;
  for (const auto& s : result) out[s["metric"].value(label, "")] = Value(s);
  return out;
}

TEST(LivePrometheusTest, ScrapesALiveExperimentAndAnswersWithItsFigures) {
  LiveRun run;
  const std::string error = run.Start();
  ASSERT_EQ(error, "");
  const std::string x = run.experiment();
  ASSERT_FALSE(x.empty()) << "fl-server's metrics carry no experiment label";
  const std::string sel = "experiment=\"" + x + "\"";

  // Every target is up: the server and the three clients.
  const json up = run.Result("up");
  ASSERT_EQ(up.size(), 1 + Clients().size()) << up.dump();
  std::map<std::string, int> per_job;
  for (const auto& s : up) {
    EXPECT_EQ(Value(s), 1.0) << s.dump();
    ++per_job[s["metric"].value("job", "")];
  }
  EXPECT_EQ(per_job["fl-server"], 1);
  EXPECT_EQ(per_job["fl-client"], static_cast<int>(Clients().size()));

  // The server's view: the round counter reached the number of rounds; one train-phase series per link kind,
  // each with one observation per round; one straggler per round; every update accepted.
  const json round = run.Result("fl_current_round{" + sel + "}");
  ASSERT_EQ(round.size(), 1u);
  EXPECT_EQ(Value(round[0]), kRounds);
  const auto train = ByLabel(
      run.Result("sum by (link_kind) (fl_client_phase_seconds_count{" + sel + ", phase=\"train\"})"), "link_kind");
  std::map<std::string, double> expected_train;
  for (const auto& c : Clients()) expected_train[c.link_kind] = kRounds;
  EXPECT_EQ(train, expected_train);
  const json rounds_observed = run.Result("fl_round_seconds_count{" + sel + "}");
  ASSERT_EQ(rounds_observed.size(), 1u);
  EXPECT_EQ(Value(rounds_observed[0]), kRounds);
  const json stragglers = run.Result("sum(fl_round_straggler_total{" + sel + "})");
  ASSERT_EQ(stragglers.size(), 1u);
  EXPECT_EQ(Value(stragglers[0]), kRounds);
  const auto outcomes = ByLabel(run.Result("sum by (outcome) (fl_updates_total{" + sel + "})"), "outcome");
  EXPECT_EQ(outcomes,
            (std::map<std::string, double>{{"dropped", 0}, {"late", 0}, {"ok", 3.0 * kRounds}, {"rejected", 0}}));
  EXPECT_EQ(run.Result("fl_eval_loss{" + sel + "}").size(), 1u) << "the evaluation rounds set no test loss";

  // The clients' own view, with their constant labels.
  const json completed = run.Result("fl_client_rounds_completed_total{" + sel + "}");
  ASSERT_EQ(completed.size(), Clients().size()) << completed.dump();
  for (const auto& c : Clients()) {
    const std::string csel =
        sel + ", client=\"" + c.name + "\", link_kind=\"" + c.link_kind + "\", device_class=\"" + c.device_class + "\"";
    const json done = run.Result("fl_client_rounds_completed_total{" + csel + "}");
    ASSERT_EQ(done.size(), 1u) << c.name << " has no rounds-completed series with its labels: " << completed.dump();
    EXPECT_EQ(Value(done[0]), kRounds) << c.name;
    const json trained = run.Result("fl_client_local_phase_seconds_count{" + csel + ", phase=\"train\"}");
    ASSERT_EQ(trained.size(), 1u) << c.name;
    EXPECT_EQ(Value(trained[0]), kRounds) << c.name;
    const json version = run.Result("fl_client_model_version{" + csel + "}");
    ASSERT_EQ(version.size(), 1u) << c.name;
    EXPECT_EQ(Value(version[0]), kRounds) << c.name << " did not download the final model for the last evaluation";
    const json reconnects = run.Result("fl_client_reconnects_total{" + csel + "}");
    ASSERT_EQ(reconnects.size(), 1u) << c.name;
    EXPECT_EQ(Value(reconnects[0]), 0) << c.name;
  }
  // The bytes each client says it uploaded are the bytes the server says it received on that link kind.
  const auto server_up =
      ByLabel(run.Result("sum by (link_kind) (fl_bytes_total{" + sel + ", direction=\"up\"})"), "link_kind");
  const auto client_up = ByLabel(
      run.Result("sum by (link_kind) (fl_client_local_bytes_total{" + sel + ", direction=\"up\"})"), "link_kind");
  EXPECT_EQ(server_up.size(), Clients().size());
  EXPECT_EQ(server_up, client_up);
  for (const auto& [kind, bytes] : server_up) EXPECT_GT(bytes, 0) << kind;
  // One experiment label across the server and every client.
  const json experiments = run.Result("count by (experiment) ({__name__=~\"fl_.+\"})");
  ASSERT_EQ(experiments.size(), 1u) << experiments.dump();
  EXPECT_EQ(experiments[0]["metric"].value("experiment", ""), x);
}

// Label values of a template variable's label_values(<selector>, <label>), asked of Prometheus' API.
std::vector<std::string> VariableValues(PrometheusServer& prom, const json& var,
                                        const std::map<std::string, std::string>& values) {
  LabelValuesQuery q;
  EXPECT_TRUE(ParseLabelValues(var.value("definition", ""), &q)) << var.dump();
  const std::string selector = Substitute(q.selector, values);
  auto data = prom.Api("/api/v1/label/" + q.label + "/values?match%5B%5D=" + fl::testing::UrlEncode(selector));
  EXPECT_TRUE(data.ok()) << selector << ": " << data.status();
  std::vector<std::string> out;
  if (data.ok()) {
    for (const auto& v : *data) out.push_back(v.get<std::string>());
  }
  return out;
}

// Fills the dashboard's variables in order (each may depend on the ones before), the way Grafana does:
// `mode` "all" picks All (the variable's allValue), "first" the first value Prometheus offers, "each" a
// multi-value selection of all of them.
std::map<std::string, std::string> FillVariables(PrometheusServer& prom, const Dashboard& d, const std::string& mode) {
  std::map<std::string, std::string> values;
  for (const auto& var : d.json["templating"]["list"]) {
    const std::string name = var.value("name", "");
    const std::vector<std::string> options = VariableValues(prom, var, values);
    EXPECT_FALSE(options.empty()) << d.file << " $" << name << " offers no value (" << var.value("definition", "")
                                  << " with " << json(values).dump() << ")";
    if (options.empty()) continue;
    if (!var.value("multi", false) || mode == "first") {
      values[name] = options.front();
    } else if (mode == "all") {
      values[name] = var.value("allValue", MultiValueRegex(options));
    } else {
      values[name] = MultiValueRegex(options);
    }
  }
  return values;
}

TEST(LivePrometheusTest, EveryDashboardPanelQueryReturnsData) {
  LiveRun run;
  const std::string error = run.Start();
  ASSERT_EQ(error, "");
  const auto dashboards = LoadDashboards();
  ASSERT_EQ(dashboards.size(), 3u);
  int evaluated = 0;
  for (const Dashboard& d : dashboards) {
    for (const std::string mode : {"all", "first", "each"}) {
      const auto values = FillVariables(run.prom(), d, mode);
      EXPECT_EQ(values.at("experiment"), run.experiment()) << d.file;
      for (const PanelQuery& q : PanelQueries(d)) {
        const std::string promql = Substitute(q.expr, values);
        ASSERT_EQ(promql.find('$'), std::string::npos) << q.where << ": unsubstituted variable in " << promql;
        auto data = run.prom().Query(promql);
        ASSERT_TRUE(data.ok()) << q.where << " (" << mode << "): " << data.status() << "\n" << promql;
        EXPECT_FALSE((*data)["result"].empty())
            << q.where << " (variables: " << mode << ", " << json(values).dump() << ") returns no data:\n"
            << promql;
        ++evaluated;
      }
    }
  }
  // Every target of every panel, three times over.
  size_t targets = 0;
  for (const Dashboard& d : dashboards) targets += PanelQueries(d).size();
  EXPECT_EQ(evaluated, static_cast<int>(3 * targets));
  EXPECT_GE(targets, 25u);
}

}  // namespace
}  // namespace fl::dashboards
