#include "fl/experiment/islands_experiment.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <thread>

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
#include "fl/experiment/islands_addresses.h"
#include "fl/pki/pki.h"
#include "fl/sys/process_group.h"

namespace fl::experiment {
namespace {

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
    if (onebit_window_steps > 0 && total_steps % onebit_window_steps != 0) {
      return bad("onebit.window_steps", onebit_window_steps,
                 fl::StrCat("the run (inner.total_steps ", total_steps,
                            ") must be whole membership windows; use a divisor of it, or 0 for the static ring"));
    }
  } else if (onebit_window_steps > 0) {
    return bad("onebit.window_steps", onebit_window_steps, "membership windows are for mode onebit-adam; remove it");
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

// launcher: where the islands run (docs/cluster.md "Islands on Slurm").
config::FieldTable<Config::Launcher> LauncherFields() {
  using L = Config::Launcher;
  auto chars = [](const std::string& v, std::string_view extra) {
    return std::all_of(v.begin(), v.end(), [&](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || extra.find(ch) != std::string_view::npos;
    });
  };
  return {
      config::ChoiceField("kind", &L::kind, {"local", "slurm"}),
      config::StringField("partition", &L::partition).Then([chars](const config::YamlMap& m, L& l) -> absl::Status {
        if (chars(l.partition, "_.-")) return absl::OkStatus();
        return m.Error(m.Node("partition"), "partition", fl::StrCat("partition name \"", l.partition, "\""),
                       "a Slurm partition name: letters, digits, '_', '.', '-' (sinfo lists them)");
      }),
      config::StringField("time", &L::time).Then([chars](const config::YamlMap& m, L& l) -> absl::Status {
        if (chars(l.time, ":-")) return absl::OkStatus();
        return m.Error(m.Node("time"), "time", fl::StrCat("\"", l.time, "\" is not a Slurm time limit"),
                       "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (sbatch --time)");
      }),
      config::IntField("nodes", &L::nodes, 0, 64),
      config::CustomField<L>(
          "sbatch_args",
          [](const config::YamlMap& m, const std::string& key, L& l) -> absl::Status {
            const YAML::Node n = m.Node(key);
            const std::string allowed = "a list of sbatch options, each one string starting with '-' (\"--qos=x\")";
            if (!n.IsSequence()) return m.Error(n, key, "expected a list", allowed);
            for (const YAML::Node& item : n) {
              const std::string a = item.IsScalar() ? item.Scalar() : std::string();
              if (a.empty() || a[0] != '-' || a.find_first_of("\n\r") != std::string::npos) {
                return m.Error(item, key, fl::StrCat("\"", a, "\" is not one sbatch option"), allowed);
              }
              // The launcher writes these itself: a second value would contradict them.
              for (const std::string_view own : {"--nodes", "-N", "--partition", "-p", "--time", "-t", "--output", "-o",
                                                 "--job-name", "-J", "--ntasks", "-n", "--wait", "-W"}) {
                if (a == own || (a.starts_with(own) && (a[own.size()] == '=' || own.size() == 2))) {
                  return m.Error(item, key, fl::StrCat("\"", a, "\": the launcher writes ", own, " itself"),
                                 "other sbatch options; give nodes, partition and time as launcher keys");
                }
              }
              l.sbatch_args.push_back(a);
            }
            return absl::OkStatus();
          })
          .Allowed("a list of sbatch options"),
  };
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
      config::IntField("onebit.window_steps", &Config::onebit_window_steps),
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
      config::SectionField("launcher", &Config::launcher, LauncherFields()),
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

absl::Status ProvisionIslandsPki(const IslandsExperimentConfig& c, const std::string& out_dir,
                                 const std::vector<std::string>& coordinator_hosts) {
  const pki::Paths pki_paths{(std::filesystem::path(out_dir) / "pki").string()};
  std::error_code ec;
  std::filesystem::remove_all(pki_paths.dir, ec);  // a rerun into the same --out gets a fresh CA
  pki::CaOptions ca;
  ca.common_name = pki::FitCommonName(fl::StrCat("fl-islands-run CA for ", c.name));
  if (absl::Status s = pki::CreateCa(pki_paths.dir, ca); !s.ok()) return s;
  pki::IssueOptions server;
  // The islands dial the coordinator at the host it advertises: the certificate names it (and loopback).
  server.ip_addresses = {"127.0.0.1"};
  server.dns_names = {"localhost"};
  for (const std::string& h : coordinator_hosts) {
    std::vector<std::string>& names = IsIpv4Literal(h) ? server.ip_addresses : server.dns_names;
    if (std::find(names.begin(), names.end(), h) == names.end()) names.push_back(h);
  }
  if (auto s = pki::Issue(pki_paths.dir, pki::Kind::kServer, "coordinator", server); !s.ok()) return s.status();
  for (uint32_t i = 0; i < c.islands; ++i) {
    if (auto s = pki::Issue(pki_paths.dir, pki::Kind::kIsland, fl::StrCat("island-", i), {}); !s.ok()) {
      return s.status();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<IslandsExperimentResult> RunIslandsExperiment(const IslandsExperimentConfig& c,
                                                             const LaunchPaths& paths) {
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  // Every process binds and advertises one host here (all run on this machine); FreePortOn also refuses a
  // host that is not this machine's.
  const std::string host = paths.advertise;
  if (absl::Status s = CheckAdvertisableHost("the coordinator and every island", host); !s.ok()) return s;
  absl::StatusOr<int> probe = FreePortOn(host);
  if (!probe.ok()) return probe.status();
  auto port_on_host = [&]() { return FreePortOn(host).value_or(0); };
  // One step of a batch job runs one part (LaunchPaths::step); the local launcher runs them all.
  const bool all = paths.step.empty();
  const bool coordinator_step = paths.step == "coordinator";
  std::optional<uint32_t> island_step;
  if (!all && !coordinator_step) {
    uint32_t i = 0;
    const std::string_view index = std::string_view(paths.step).substr(std::min<size_t>(7, paths.step.size()));
    const auto [end, err] = std::from_chars(index.data(), index.data() + index.size(), i);
    if (!paths.step.starts_with("island-") || index.empty() || err != std::errc() ||
        end != index.data() + index.size() || i >= c.islands) {
      return absl::InvalidArgumentError(
          fl::StrCat("step '", paths.step, "': use coordinator or island-<i> with i in 0..", c.islands - 1));
    }
    island_step = i;
  }
  if (!all && c.mode != "diloco") {
    return absl::InvalidArgumentError(
        fl::StrCat(c.source, ": mode ", c.mode,
                   " runs a static ring whose every endpoint each island must know "
                   "before any starts, which one step per node cannot; across nodes use mode diloco (the "
                   "coordinator tells each island its peers)"));
  }
  auto runs_island = [&](uint32_t i) { return all || island_step == i; };
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
    if (all) {
      if (absl::Status s = ProvisionIslandsPki(c, paths.out_dir, {host}); !s.ok()) return s;
    } else if (!fs::exists(pki_paths.CaCert())) {
      return absl::FailedPreconditionError(fl::StrCat("step ", paths.step, ": no CA at ", pki_paths.CaCert(),
                                                      "; the submitting launcher makes it before the job starts"));
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
  const std::string address_file = out("coordinator.address");
  if (island_step.has_value()) {
    // The coordinator runs in another step, maybe on another node: it says where in the shared output folder.
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (coordinator.empty() && std::chrono::steady_clock::now() < end) {
      std::ifstream in(address_file);
      if (!(in >> coordinator)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (coordinator.empty()) {
      return absl::UnavailableError(fl::StrCat("step ", paths.step, ": the coordinator step wrote no ", address_file,
                                               " within 120 s; see ", out("coordinator.log")));
    }
  } else if (c.UsesCoordinator()) {
    const std::string port_file = out("coordinator.port");
    fs::remove(port_file, ec);
    std::vector<std::string> argv = {paths.fl_coordinator,
                                     "--listen",
                                     fl::StrCat(host, ":0"),
                                     "--port-file",
                                     port_file,
                                     "--db",
                                     out("records.db"),
                                     "--experiment-name",
                                     c.name,
                                     "--min-islands",
                                     std::to_string(c.islands)};
    // 1-bit Adam: one sync is a membership window of K steps, one fragment, no overlap; the codec is the
    // warm-up's (docs/diloco.md, "Churn in 1-bit Adam").
    IslandsExperimentConfig windows = c;
    if (c.mode == "onebit-adam") {
      windows.inner_steps = c.onebit_window_steps;
      windows.fragments = 1;
      windows.overlap_steps = 0;
      argv.insert(argv.end(), {"--sync-mode", "onebit-adam"});
    }
    argv.insert(argv.end(), {"--outer-steps", std::to_string(c.total_steps / windows.inner_steps)});
    const std::vector<std::string> schedule = ScheduleArgs(windows);
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
    coordinator = fl::StrCat(host, ":", port);
    if (coordinator_step) {  // written whole, then renamed: a reader never sees half an address
      std::ofstream(address_file + ".tmp") << coordinator << "\n";
      fs::rename(address_file + ".tmp", address_file, ec);
    }
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
    if (!runs_island(i)) {  // another step's: its peers learn its endpoint from the coordinator
      data_ports.push_back(0);
      advertised.emplace_back();
      continue;
    }
    data_ports.push_back(port_on_host());
    advertised.push_back(fl::StrCat("tcp://", host, ":", data_ports.back()));
    if (wan.has_value()) {
      // Ring traffic into island i crosses its relay: the WAN's rate and delay apply to every hop.
      absl::StatusOr<std::unique_ptr<fl::emulation::ShapingRelay>> relay = fl::emulation::ShapingRelay::Start(
          {.listen_addr = fl::StrCat(host, ":0"),
           .target_addr = fl::StrCat(host, ":", data_ports.back()),
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
  // The c10d stores stay on loopback: every rank runs on this machine.
  const int global_store = FreePortOn("127.0.0.1").value_or(0);
  size_t ranks_running = 0;
  for (uint32_t i = 0; i < c.islands; ++i) {
    if (!runs_island(i)) continue;
    const int island_store = FreePortOn("127.0.0.1").value_or(0);
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
          fl::StrCat("tcp://", host, ":", data_ports[i]),
          "--state-endpoint",
          fl::StrCat(host, ":0"),
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
  bool coordinator_running = coordinator_step;  // the coordinator's step waits for it alone
  while ((ranks_running > 0 || coordinator_running) && failure.ok()) {
    std::optional<fl::sys::ChildExit> e = procs.WaitAny(std::chrono::seconds(1));
    if (!e.has_value()) continue;
    if (e->name == kCoordinator) {
      coordinator_running = false;
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
  if (!all) {  // one step's part is done; whoever submitted the job gathers the islands' summaries
    IslandsExperimentResult part;
    part.name = c.name;
    part.method = c.method;
    return part;
  }
  return GatherIslandsResult(c, paths.out_dir);
}

absl::StatusOr<IslandsExperimentResult> GatherIslandsResult(const IslandsExperimentConfig& c,
                                                            const std::string& out_dir) {
  auto out = [&](const std::string& name) { return (std::filesystem::path(out_dir) / name).string(); };
  IslandsExperimentResult result;
  result.name = c.name;
  result.method = c.method;
  std::string first_hash;
  for (uint32_t i = 0; i < c.islands; ++i) {
    std::ifstream in(out(fl::StrCat("island-", i, "-rank0.json")));
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_object()) return absl::InternalError(fl::StrCat("no summary from island-", i, " in ", out_dir));
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
