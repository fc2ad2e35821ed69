#include "fl/experiment/islands_experiment.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include "fl/config/field_table.h"
#include "fl/config/yaml_fields.h"
#include "fl/core/codec.h"
#include "fl/core/fragment_plan.h"
#include "fl/core/server_optimizer.h"
#include "fl/core/str_cat.h"
#include "fl/emulation/link_profile.h"
#include "fl/emulation/shaping_relay.h"
#include "fl/pki/pki.h"
#include "fl/sys/process_group.h"

namespace fl::experiment {
namespace {

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string Num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The sync schedule, which fl-coordinator and every fl-island are both told: built in one place, each setting in
// one unit (the exchange timeout in ms for both; fl-island's --exchange-timeout-s is its older spelling).
std::vector<std::string> ScheduleArgs(const IslandsExperimentConfig& c) {
  return {"--inner-steps",
          std::to_string(c.inner_steps),
          "--fragments",
          std::to_string(c.fragments),
          "--fragment-strategy",
          c.fragment_strategy,
          "--overlap-steps",
          std::to_string(c.overlap_steps),
          "--mixing-alpha",
          Num(c.mixing_alpha),
          "--outer-optimizer",
          c.outer_optimizer,
          "--codec",
          c.codec,
          "--connections-per-peer",
          std::to_string(c.connections_per_peer),
          "--exchange-timeout-ms",
          std::to_string(c.exchange_timeout_ms)};
}

}  // namespace

absl::Status IslandsExperimentConfig::Validate() const {
  auto bad = [&](std::string_view field, const auto& value, std::string_view want) {
    return absl::InvalidArgumentError(fl::StrCat(source, ": ", field, " is '", value, "'; ", want));
  };
  if (name.empty()) return bad("name", name, "give the experiment a name");
  if (mode != "diloco" && mode != "data-parallel" && mode != "onebit-adam") {
    return bad("mode", mode, "use diloco, data-parallel or onebit-adam");
  }
  if (dp_transport != "gloo" && dp_transport != "ring") return bad("dp_transport", dp_transport, "use gloo or ring");
  if (islands < 1 || islands > 64) return bad("islands", islands, "use 1..64");
  if (ranks_per_island < 1 || ranks_per_island > 64) return bad("ranks_per_island", ranks_per_island, "use 1..64");
  if (inner_steps < 1 || fragments < 1 || inner_steps % fragments != 0) {
    return bad("outer.fragments", fragments, fl::StrCat("must divide outer.inner_steps (", inner_steps, ")"));
  }
  if (overlap_steps >= inner_steps / fragments) {
    return bad("outer.overlap_steps", overlap_steps, fl::StrCat("must be below H/P = ", inner_steps / fragments));
  }
  if (absl::StatusOr<std::unique_ptr<core::Codec>> codec_ok = core::MakeCodec(codec); !codec_ok.ok()) {
    return bad("exchange.codec", codec, fl::ToStd(codec_ok.status().message()));
  }
  if (auto outer = core::MakeServerOptimizer(outer_optimizer, 1); !outer.ok()) {
    return bad("outer.optimizer", outer_optimizer, fl::ToStd(outer.status().message()));
  }
  // 1-bit Adam (fl-island checks the same; here the manifest's field is named before anything starts).
  if (inner_optimizer != "adamw") {
    return bad("inner.optimizer", inner_optimizer,
               mode == "onebit-adam" ? "1-bit Adam is Adam with a frozen variance: use adamw"
                                     : "use adamw (the only inner optimizer built)");
  }
  if (mode == "onebit-adam") {
    if (onebit_warmup_steps > total_steps) {
      return bad("onebit.warmup_steps", onebit_warmup_steps,
                 fl::StrCat("the warm-up is longer than the run (inner.total_steps ", total_steps, "); use at most ",
                            total_steps, " (equal: plain data-parallel Adam)"));
    }
    if (auto sign1 = core::MakeCodec(fl::StrCat("sign1:", onebit_chunk)); !sign1.ok()) {
      return bad("onebit.chunk", onebit_chunk,
                 fl::StrCat("the sign1 codec cannot carry it (", fl::ToStd(sign1.status().message()),
                            "); use a positive multiple of 8 up to 1048576, e.g. 256"));
    }
  }
  if (mode == "diloco" && total_steps % inner_steps != 0) {
    return bad("inner.total_steps", total_steps,
               fl::StrCat("must be a multiple of outer.inner_steps (", inner_steps, ")"));
  }
  return absl::OkStatus();
}

namespace {

using Config = IslandsExperimentConfig;

// A key of the manifest's model: or inner: map handed to every fl-island as "<flag> <value>" (fl-island
// checks the value).
config::Field<Config> IslandFlag(std::string yaml, std::string flag) {
  return config::CustomField<Config>(
      std::move(yaml),
      [flag = std::move(flag)](const config::YamlMap& m, const std::string& key, Config& c) -> absl::Status {
        absl::StatusOr<std::optional<std::string>> v = m.String(key, "a value for fl-island " + flag);
        if (!v.ok()) return v.status();
        c.island_args.push_back(flag);
        c.island_args.push_back(**v);
        return absl::OkStatus();
      });
}

// Every field of an islands manifest (docs/diloco.md); the keys allowed in each map are this table's.
// `manifest_dir` is where a wan profile's name or relative path resolves.
config::FieldTable<Config> ManifestFields(const std::filesystem::path& manifest_dir) {
  return {
      config::StringField("name", &Config::name),
      config::StringField<Config>("description"),
      config::StringField("method", &Config::method),
      config::ChoiceField("mode", &Config::mode, {"diloco", "data-parallel", "onebit-adam"}),
      config::ChoiceField("dp_transport", &Config::dp_transport, {"gloo", "ring"}),
      config::IntField("islands", &Config::islands, 1, 64),
      config::IntField("ranks_per_island", &Config::ranks_per_island, 1, 64),
      config::IntField("threads_per_rank", &Config::threads_per_rank),
      IslandFlag("model.name", "--model"),
      IslandFlag("model.d_model", "--d-model"),
      IslandFlag("model.layers", "--layers"),
      IslandFlag("model.heads", "--heads"),
      IslandFlag("model.context", "--context"),
      IslandFlag("model.batch_size", "--batch-size"),
      IslandFlag("model.seed", "--seed"),
      IslandFlag("model.data_dir", "--data-dir"),
      IslandFlag("model.data", "--data"),
      IslandFlag("model.task", "--task"),
      IslandFlag("inner.lr", "--inner-lr"),
      IslandFlag("inner.weight_decay", "--weight-decay"),
      IslandFlag("inner.beta1", "--beta1"),
      IslandFlag("inner.beta2", "--beta2"),
      IslandFlag("inner.warmup_steps", "--warmup-steps"),
      IslandFlag("inner.eval_every", "--eval-every"),
      config::StringField("inner.optimizer", &Config::inner_optimizer),
      config::IntField("onebit.warmup_steps", &Config::onebit_warmup_steps),
      config::IntField("onebit.chunk", &Config::onebit_chunk),
      config::IntField("inner.total_steps", &Config::total_steps),
      config::IntField("outer.inner_steps", &Config::inner_steps, 1),
      config::IntField("outer.fragments", &Config::fragments, 1),
      config::StringField("outer.strategy", &Config::fragment_strategy)
          .Then([](const config::YamlMap& m, Config& c) -> absl::Status {
            absl::StatusOr<core::FragmentStrategy> strategy = core::ParseFragmentStrategy(c.fragment_strategy);
            if (!strategy.ok()) return m.Error(m.Node("strategy"), "strategy", fl::ToStd(strategy.status().message()));
            return absl::OkStatus();
          }),
      config::IntField("outer.overlap_steps", &Config::overlap_steps),
      config::NumberField("outer.mixing_alpha", &Config::mixing_alpha, {std::numeric_limits<double>::lowest(), 1})
          .Allowed("a number in [0, 1], or a negative one for the default (0 without overlap, 0.5 with)"),
      config::StringField("outer.optimizer", &Config::outer_optimizer),
      config::StringField("exchange.codec", &Config::codec),
      config::BoolField("exchange.error_feedback", &Config::error_feedback),
      config::IntField("exchange.connections_per_peer", &Config::connections_per_peer),
      config::IntField("exchange.timeout_ms", &Config::exchange_timeout_ms),
      config::ChoiceField("security", &Config::security, {"tls", "insecure"}),
      config::CustomField<Config>(
          "wan",
          [manifest_dir](const config::YamlMap& m, const std::string& key, Config& c) -> absl::Status {
            constexpr char kAllowed[] =
                "a link profile: a name in experiments/profiles/links/, or the path of a profile file";
            absl::StatusOr<std::optional<std::string>> name = m.String(key, kAllowed);
            if (!name.ok()) return name.status();
            std::filesystem::path file = **name;
            if ((*name)->find('/') == std::string::npos && !(*name)->ends_with(".yaml")) {
              file = manifest_dir / ".." / "profiles" / "links" / fl::StrCat(**name, ".yaml");
            } else if (file.is_relative()) {
              file = manifest_dir / file;
            }
            if (!std::filesystem::exists(file)) {
              return m.Error(m.Node(key), key, fl::StrCat("no link profile ", file.string()), kAllowed);
            }
            c.wan_link = file.lexically_normal().string();
            return absl::OkStatus();
          }),
  };
}

}  // namespace

absl::StatusOr<IslandsExperimentConfig> LoadIslandsExperiment(const std::string& path) {
  IslandsExperimentConfig c;
  c.source = path;
  absl::StatusOr<YAML::Node> root = config::LoadYamlFile(path, "islands manifest");
  if (!root.ok()) return root.status();
  const std::filesystem::path manifest_dir = std::filesystem::path(path).parent_path();
  if (absl::Status s = ManifestFields(manifest_dir).Read(config::YamlMap(*root, path, ""), c); !s.ok()) return s;
  if (!c.wan_link.empty() && c.mode == "data-parallel" && c.dp_transport == "gloo") {
    return absl::InvalidArgumentError(
        fl::StrCat(path,
                   ": wan shapes the ring between island leaders, but data-parallel with dp_transport gloo sends "
                   "everything through one Gloo group; use dp_transport: ring, or remove wan"));
  }
  if (c.method.empty()) c.method = c.name;
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  return c;
}

std::string IslandsExperimentResult::ToJson() const {
  nlohmann::json j;
  j["name"] = name;
  j["method"] = method;
  j["final_eval_loss"] = final_eval_loss;
  j["bytes_sent"] = bytes_sent;
  j["peak_sync_bytes"] = peak_sync_bytes;
  j["wall_s"] = wall_s;
  j["wait_s"] = wait_s;
  j["wait_share"] = wait_share;
  j["units"] = units;
  j["hashes_equal"] = hashes_equal;
  return j.dump();
}

absl::StatusOr<IslandsExperimentResult> RunIslandsExperiment(const IslandsExperimentConfig& c,
                                                             const LaunchPaths& paths) {
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(paths.out_dir, ec);
  auto out = [&](const std::string& name) { return (fs::path(paths.out_dir) / name).string(); };

  // Every child in its own process group with PDEATHSIG (fl::sys::ProcessGroup): a Ctrl-C or a crash of
  // the launcher stops them all, and the destructor stops whatever still runs on any early return.
  fl::sys::ProcessGroup procs;
  std::map<std::string, std::string> logs;  // child name -> its log
  const std::string kCoordinator = "coordinator";
  auto start = [&](const std::string& name, const std::vector<std::string>& argv, const std::string& log) {
    fs::remove(log, ec);  // ProcessGroup appends; a rerun into the same --out starts a fresh log
    logs[name] = log;
    absl::StatusOr<pid_t> pid = procs.Start(name, argv, log);
    return pid.ok() ? absl::OkStatus() : pid.status();
  };
  // Secure by default: a throwaway CA per run, made before any process starts (docs/security.md).
  std::vector<std::string> coordinator_security = {"--insecure"};
  std::function<std::vector<std::string>(uint32_t)> island_security = [](uint32_t) {
    return std::vector<std::string>{"--insecure"};
  };
  const pki::Paths pki_paths{out("pki")};
  if (c.security == "tls") {
    fs::remove_all(pki_paths.dir, ec);  // a rerun into the same --out gets a fresh CA
    pki::CaOptions ca;
    ca.common_name = fl::StrCat("fl-islands-run CA for ", c.name);
    if (absl::Status s = pki::CreateCa(pki_paths.dir, ca); !s.ok()) return s;
    pki::IssueOptions server;
    server.ip_addresses = {"127.0.0.1"};
    server.dns_names = {"localhost"};
    if (auto s = pki::Issue(pki_paths.dir, pki::Kind::kServer, "coordinator", server); !s.ok()) return s.status();
    for (uint32_t i = 0; i < c.islands; ++i) {
      if (auto s = pki::Issue(pki_paths.dir, pki::Kind::kIsland, fl::StrCat("island-", i), {}); !s.ok()) {
        return s.status();
      }
    }
    // The CA's revocation list too: revoking an island during the run (fl-provision revoke island-N --dir
    // <out>/pki) evicts it and refuses its calls, as in a provisioned deployment.
    coordinator_security = {"--tls-cert",      pki_paths.Cert(pki::Kind::kServer, "coordinator"),
                            "--tls-key",       pki_paths.Key(pki::Kind::kServer, "coordinator"),
                            "--tls-client-ca", pki_paths.CaCert(),
                            "--tls-crl",       pki_paths.Crl()};
    island_security = [&](uint32_t i) {
      const std::string id = fl::StrCat("island-", i);
      return std::vector<std::string>{"--tls-ca",   pki_paths.CaCert(),
                                      "--tls-cert", pki_paths.Cert(pki::Kind::kIsland, id),
                                      "--tls-key",  pki_paths.Key(pki::Kind::kIsland, id)};
    };
  }
  std::string coordinator;
  if (c.mode == "diloco") {
    const std::string port_file = out("coordinator.port");
    fs::remove(port_file, ec);
    std::vector<std::string> argv = {paths.fl_coordinator,
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--port-file",
                                     port_file,
                                     "--db",
                                     out("records.db"),
                                     "--experiment-name",
                                     c.name,
                                     "--outer-steps",
                                     std::to_string(c.total_steps / c.inner_steps),
                                     "--min-islands",
                                     std::to_string(c.islands)};
    const std::vector<std::string> schedule = ScheduleArgs(c);
    argv.insert(argv.end(), schedule.begin(), schedule.end());
    if (c.error_feedback) argv.push_back("--error-feedback");
    argv.insert(argv.end(), coordinator_security.begin(), coordinator_security.end());
    if (absl::Status s = start(kCoordinator, argv, out("coordinator.log")); !s.ok()) return s;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    int port = 0;
    while (port == 0 && std::chrono::steady_clock::now() < end) {
      std::ifstream in(port_file);
      if (in >> port) break;
      port = 0;
      // A coordinator that refused its options has exited: say so now, not after the minute's wait.
      if (std::optional<fl::sys::ChildExit> e = procs.WaitAny(std::chrono::milliseconds(50)); e.has_value()) {
        return absl::FailedPreconditionError(
            fl::StrCat("fl-coordinator exited with ", e->code, " before it listened; see ", out("coordinator.log")));
      }
    }
    if (port == 0) {
      return absl::UnavailableError(fl::StrCat("fl-coordinator did not start; see ", out("coordinator.log")));
    }
    coordinator = fl::StrCat("127.0.0.1:", port);
  }

  std::vector<std::string> peers;
  std::vector<int> data_ports;
  std::vector<std::string> advertised;  // what the other islands dial: the island itself, or its WAN relay
  std::vector<std::unique_ptr<fl::emulation::ShapingRelay>> wan_relays;
  std::optional<fl::emulation::LinkProfile> wan;
  if (!c.wan_link.empty()) {
    absl::StatusOr<fl::emulation::LinkProfile> profile = fl::emulation::LoadLinkProfile(c.wan_link);
    if (!profile.ok()) return profile.status();
    wan = *profile;
  }
  for (uint32_t i = 0; i < c.islands; ++i) {
    data_ports.push_back(FreePort());
    advertised.push_back(fl::StrCat("tcp://127.0.0.1:", data_ports.back()));
    if (wan.has_value()) {
      // Ring traffic into island i crosses its relay: the WAN's rate and delay apply to every hop.
      absl::StatusOr<std::unique_ptr<fl::emulation::ShapingRelay>> relay = fl::emulation::ShapingRelay::Start(
          {.listen_addr = "127.0.0.1:0",
           .target_addr = fl::StrCat("127.0.0.1:", data_ports.back()),
           .uplink = wan->uplink,
           .downlink = wan->downlink,
           .seed = 1000 + i,
           // Islands bind their ring endpoint at their first sync: a peer may dial through the relay
           // before that, and must see a slow connect (ZeroMQ retries), not a dropped connection.
           .connect_retry_ms = 60000,
           .name = fl::StrCat("wan-", i)});
      if (!relay.ok()) return relay.status();
      advertised.back() = fl::StrCat("tcp://", (*relay)->address());
      wan_relays.push_back(std::move(*relay));
    }
    peers.push_back(fl::StrCat("island-", i, "=", advertised.back()));
  }
  const int global_store = FreePort();
  size_t ranks_running = 0;
  for (uint32_t i = 0; i < c.islands; ++i) {
    const int island_store = FreePort();
    for (uint32_t r = 0; r < c.ranks_per_island; ++r) {
      const std::string id = fl::StrCat("island-", i);
      std::vector<std::string> argv = {
          paths.fl_island,
          "--island-id",
          id,
          "--shard",
          std::to_string(i),
          "--num-shards",
          std::to_string(c.islands),
          "--rank",
          std::to_string(r),
          "--ranks",
          std::to_string(c.ranks_per_island),
          "--threads",
          std::to_string(c.threads_per_rank),
          "--mode",
          c.mode,
          "--dp-transport",
          c.dp_transport,
          "--total-steps",
          std::to_string(c.total_steps),
          "--error-feedback",
          c.error_feedback ? "true" : "false",
          "--inner-optimizer",
          c.inner_optimizer,
          "--onebit-warmup-steps",
          std::to_string(c.onebit_warmup_steps),
          "--onebit-chunk",
          std::to_string(c.onebit_chunk),
          "--data-endpoint",
          fl::StrCat("tcp://127.0.0.1:", data_ports[i]),
          "--pg-store",
          fl::StrCat("127.0.0.1:", c.mode == "data-parallel" && c.dp_transport == "gloo" ? global_store : island_store),
          "--summary",
          out(fl::StrCat(id, "-rank", r, ".json")),
          "--metrics",
          out(fl::StrCat(id, ".jsonl"))};
      const std::vector<std::string> schedule = ScheduleArgs(c);
      argv.insert(argv.end(), schedule.begin(), schedule.end());
      if (wan.has_value()) {
        argv.push_back("--advertised-endpoint");
        argv.push_back(advertised[i]);
      }
      if (!coordinator.empty()) {
        argv.push_back("--coordinator");
        argv.push_back(coordinator);
      } else {
        for (const std::string& p : peers) {
          argv.push_back("--peer");
          argv.push_back(p);
        }
      }
      argv.insert(argv.end(), c.island_args.begin(), c.island_args.end());
      const std::vector<std::string> security = island_security(i);
      argv.insert(argv.end(), security.begin(), security.end());
      const std::string name = fl::StrCat(id, "-rank", r);
      if (absl::Status s = start(name, argv, out(name + ".log")); !s.ok()) return s;
      ++ranks_running;
    }
  }
  // Wait for every rank. The first one to fail, or a coordinator that dies under them, ends the experiment
  // at once (the others would only wait for their exchange timeout) and names the log to read.
  absl::Status failure;
  while (ranks_running > 0 && failure.ok()) {
    std::optional<fl::sys::ChildExit> e = procs.WaitAny(std::chrono::seconds(1));
    if (!e.has_value()) continue;
    if (e->name == kCoordinator) {
      if (e->code == 0) continue;  // done with its last outer step; the islands finish their evaluation
      failure = absl::InternalError(
          fl::StrCat("fl-coordinator exited with ", e->code, " while the islands were training; see ", logs[e->name]));
    } else {
      --ranks_running;
      if (e->code != 0) {
        failure = absl::InternalError(fl::StrCat("fl-island ", e->name, " exited with ", e->code,
                                                 e->signaled ? " (killed by a signal)" : "", "; see ", logs[e->name]));
      }
    }
  }
  // The coordinator first (SIGTERM: it closes its records), then whatever is left.
  procs.StopAll(kCoordinator, std::chrono::seconds(5));
  if (!failure.ok()) return failure;

  IslandsExperimentResult result;
  result.name = c.name;
  result.method = c.method;
  std::string first_hash;
  for (uint32_t i = 0; i < c.islands; ++i) {
    std::ifstream in(out(fl::StrCat("island-", i, "-rank0.json")));
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_object()) return absl::InternalError(fl::StrCat("no summary from island-", i, " in ", paths.out_dir));
    result.final_eval_loss += j["final_eval_loss"].get<double>() / c.islands;
    result.bytes_sent += j["bytes_sent"].get<uint64_t>();
    result.peak_sync_bytes = std::max(result.peak_sync_bytes, j["peak_sync_bytes"].get<uint64_t>());
    result.wall_s = std::max(result.wall_s, j["wall_s"].get<double>());
    result.wait_s += j["wait_s"].get<double>() / c.islands;
    result.units += j["units"].get<uint64_t>();
    const std::string hash = j["state_hash"].get<std::string>();
    if (i == 0) first_hash = hash;
    result.hashes_equal = result.hashes_equal && hash == first_hash;
  }
  result.wait_share = result.wall_s > 0 ? result.wait_s / result.wall_s : 0;
  std::ofstream(out("result.json")) << result.ToJson() << "\n";
  return result;
}

}  // namespace fl::experiment
