// fl-experiment: run an experiment from its manifest, replay a recorded one, calibrate link profiles.
//
//   fl-experiment run MANIFEST [--db PATH] [--out DIR]
//   fl-experiment replay DB [EXPERIMENT] [--out DIR]
//   fl-experiment calibrate PROFILE... [--backend userspace|kernel|packet|both|all] [--write]
//   fl-experiment validate MANIFEST
// Exit status: 0 the experiment finished; 1 it failed or was aborted; 2 bad input (manifest, arguments).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "fl/config/yaml_fields.h"
#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/emulation/calibrate.h"
#include "fl/emulation/link_profile.h"
#include "fl/experiment/manifest.h"
#include "fl/experiment/runner.h"
#include "fl/report/analysis.h"
#include "fl/report/experiment_data.h"
#include "fl/report/progress.h"
#include "fl/report/tables.h"
#if FL_WITH_ISLANDS
#include <yaml-cpp/yaml.h>

#include "fl/experiment/islands_experiment.h"
#endif

namespace {

namespace fs = std::filesystem;

std::atomic<bool> g_interrupted{false};

void OnSignal(int) { g_interrupted.store(true); }

fs::path SelfDir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::current_path() : self.parent_path();
}

// fl-server and fl-client sit beside fl-experiment in an installed tree (or in --bin-dir), and in server/ and
// client/ of the build tree (fl-experiment is in experiments/).
void FindBinaries(const std::string& bin_dir, fl::experiment::RunOptions* o) {
  const fs::path dir = bin_dir.empty() ? SelfDir() : fs::path(bin_dir);
  o->server_bin = dir / "fl-server";
  o->client_bin = dir / "fl-client";
  if (bin_dir.empty() && !(fs::exists(o->server_bin) && fs::exists(o->client_bin))) {
    o->server_bin = dir.parent_path() / "server" / "fl-server";
    o->client_bin = dir.parent_path() / "client" / "fl-client";
  }
}

int Fail(const absl::Status& s, int code = 2) {
  std::fprintf(stderr, "fl-experiment: %s\n", std::string(fl::ToStd(s.message())).c_str());
  return code;
}

std::string Summary(const std::string& db, const std::string& id) {
  absl::StatusOr<fl::report::ExperimentData> data = fl::report::LoadExperiment(db, id);
  if (!data.ok()) return fl::StrCat("(no report: ", fl::ToStd(data.status().message()), ")\n");
  const fl::report::Analysis analysis = fl::report::Analyze(*data);
  std::string out = fl::report::ExperimentHeaderText(*data, analysis) + "\n";
  for (const fl::report::Table& t : fl::report::AllTables(*data, analysis)) out += fl::report::RenderText(t) + "\n";
  return out;
}

#if FL_WITH_ISLANDS
// An islands manifest (experiments/diloco/, docs/diloco.md) has a top-level `islands` count; a federation
// manifest has `clients`.
// Read through config's strict loader (a regular file, bounded, nesting and duplicate keys checked), never
// YAML::LoadFile: a FIFO would block it forever, a deep `[[[[` could overflow its stack.
bool IsIslandsManifest(const std::string& path) {
  absl::StatusOr<YAML::Node> root = fl::config::LoadYamlFile(path, "manifest");
  if (!root.ok()) return false;  // LoadManifest reports the same error, naming the file
  try {
    return root->IsMap() && (*root)["islands"].IsDefined();
  } catch (const YAML::Exception&) {
    return false;
  }
}

int RunIslands(const std::string& manifest_path, const std::string& out_dir, const std::string& bin_dir) {
  absl::StatusOr<fl::experiment::IslandsExperimentConfig> config = fl::experiment::LoadIslandsExperiment(manifest_path);
  if (!config.ok()) return Fail(config.status());
  fl::experiment::LaunchPaths paths;
  const fs::path dir = bin_dir.empty() ? SelfDir() : fs::path(bin_dir);
  paths.fl_island = (dir / "fl-island").string();
  paths.fl_coordinator = (dir / "fl-coordinator").string();
  if (bin_dir.empty() && !fs::exists(paths.fl_island)) {  // the build tree
    paths.fl_island = (dir.parent_path() / "diloco" / "island" / "fl-island").string();
    paths.fl_coordinator = (dir.parent_path() / "diloco" / "coord" / "fl-coordinator").string();
  }
  if (out_dir.empty()) {
    absl::StatusOr<fs::path> default_out = fl::experiment::ExperimentOutputDir("out", config->name);
    if (!default_out.ok()) return Fail(default_out.status());
    paths.out_dir = default_out->string();
  } else {
    paths.out_dir = out_dir;
  }
  absl::StatusOr<fl::experiment::IslandsExperimentResult> r = fl::experiment::RunIslandsExperiment(*config, paths);
  if (!r.ok()) return Fail(r.status(), 1);
  std::printf("%s\nrecords: %s/records.db; logs and per-sync metrics: %s\n", r->ToJson().c_str(), paths.out_dir.c_str(),
              paths.out_dir.c_str());
  return r->hashes_equal ? 0 : 1;
}
#endif

// Progress lines (fl/report/progress.h) while the run lasts: the records database polled about once a second.
void FollowProgress(const fl::experiment::Manifest& manifest, fl::experiment::RunOptions& options,
                    std::unique_ptr<fl::report::ProgressFollower>& follower) {
  if (options.no_records || options.quiet) return;
  auto last = std::make_shared<std::chrono::steady_clock::time_point>();
  options.on_tick = [&follower, &options, &manifest, last](const std::string& experiment_id) {
    const auto now = std::chrono::steady_clock::now();
    if (now - *last < std::chrono::seconds(1)) return;
    *last = now;
    if (follower == nullptr) {
      follower = std::make_unique<fl::report::ProgressFollower>(options.db_path, experiment_id,
                                                                static_cast<int64_t>(manifest.settings.num_rounds));
    }
    for (const std::string& line : follower->Poll()) std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
}

int RunAndReport(const fl::experiment::Manifest& manifest, fl::experiment::RunOptions options) {
  options.interrupted = &g_interrupted;
  options.software_version = FL_VERSION;
  std::unique_ptr<fl::report::ProgressFollower> follower;
  FollowProgress(manifest, options, follower);
  absl::StatusOr<fl::experiment::RunResult> r = fl::experiment::RunExperiment(manifest, options);
  if (!r.ok()) return Fail(r.status(), 1);
  if (options.on_tick) {  // what the last second added (or all of a run shorter than a second)
    if (follower == nullptr) {
      follower = std::make_unique<fl::report::ProgressFollower>(options.db_path, r->experiment_id,
                                                                static_cast<int64_t>(manifest.settings.num_rounds));
    }
    for (const std::string& line : follower->Poll()) std::printf("%s\n", line.c_str());
  }
  if (!options.no_records) std::printf("%s", Summary(options.db_path, r->experiment_id).c_str());
  const std::string transport =
      r->security == "mtls" ? fl::StrCat("mutual TLS, certificates in ", r->pki_dir) : std::string("plaintext");
  std::printf("experiment %s %s (link emulation: %s; transport: %s)%s%s\nrecords: %s; logs: %s\n",
              r->experiment_id.c_str(), r->status.c_str(), r->backend.c_str(), transport.c_str(),
              r->reason.empty() ? "" : ": ", r->reason.c_str(), options.db_path.c_str(), options.out_dir.c_str());
  return r->status == "finished" ? 0 : 1;
}

fs::path ResolveProfile(const std::string& arg, const fs::path& profiles_dir) {
  if (arg.find('/') != std::string::npos || arg.ends_with(".yaml")) return arg;
  return profiles_dir / "links" / fl::StrCat(arg, ".yaml");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fl-experiment: run, replay and calibrate federated learning experiments (docs/manifests.md)"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  std::string bin_dir;
  app.add_option(
      "--bin-dir", bin_dir,
      "Where fl-server and fl-client (islands: fl-island, fl-coordinator) are (default: beside this binary)");

  std::string manifest_path, db_path, out_dir;
  CLI::App* run = app.add_subcommand("run", "Run an experiment on this machine from its manifest");
  run->add_option("manifest", manifest_path, "Experiment manifest (YAML)")->required();
  run->add_option("--db", db_path, "Records database (default: out/<name>/records.db)");
  run->add_option("--out", out_dir, "Logs and checkpoints (default: out/<name>)");
  bool no_records = false;
  std::string run_profiles_dir;
  run->add_option(
      "--profiles-dir", run_profiles_dir,
      "Folder with links/ and devices/ profiles (default: the profiles/ folder nearest above the manifest)");
  run->add_flag("--no-records", no_records,
                "No records database or checkpoints (only to measure what instrumentation costs; no report)");

  std::string replay_db, replay_id;
  CLI::App* replay = app.add_subcommand("replay", "Run a recorded experiment again and compare the outcomes");
  replay->add_option("db", replay_db, "Records database holding the experiment")->required();
  replay->add_option("experiment", replay_id, "Experiment id (default: the latest one with a manifest)");
  replay->add_option("--out", out_dir, "Logs and checkpoints of the replay (default: out/<name>-replay)");

  std::vector<std::string> profiles;
  std::string backend = "userspace";
  bool write = false;
  std::string profiles_dir = FL_DEFAULT_PROFILES_DIR;
  CLI::App* calibrate = app.add_subcommand("calibrate", "Measure what emulated links deliver against their profiles");
  calibrate->add_option("profiles", profiles, "Link profile names (experiments/profiles/links) or files")->required();
  calibrate->add_option("--backend", backend, "userspace, kernel, packet, both (userspace and kernel) or all")
      ->capture_default_str();
  calibrate->add_flag("--write", write, "Store the measurements beside each profile (<profile>.calibration.yaml)");
  calibrate->add_option("--profiles-dir", profiles_dir, "Folder with links/ and devices/")->capture_default_str();

  CLI::App* validate = app.add_subcommand("validate", "Check a manifest and print it with its profiles resolved");
  validate->add_option("manifest", manifest_path, "Experiment manifest (YAML)")->required();

  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  if (*validate) {
    absl::StatusOr<fl::experiment::Manifest> m = fl::experiment::LoadManifest(manifest_path);
    if (!m.ok()) return Fail(m.status());
    std::printf("%s\n", fl::experiment::ResolvedManifestJson(*m).c_str());
    return 0;
  }
  if (*run) {
#if FL_WITH_ISLANDS
    if (IsIslandsManifest(manifest_path)) return RunIslands(manifest_path, out_dir, bin_dir);
#endif
    absl::StatusOr<fl::experiment::Manifest> m =
        fl::experiment::LoadManifest(manifest_path, fl::experiment::ManifestOptions{run_profiles_dir});
    if (!m.ok()) return Fail(m.status());
    fl::experiment::RunOptions o;
    absl::StatusOr<fs::path> default_out = fl::experiment::ExperimentOutputDir("out", m->name);
    if (out_dir.empty() && !default_out.ok()) return Fail(default_out.status());
    o.out_dir = out_dir.empty() ? *default_out : fs::path(out_dir);
    o.db_path = db_path.empty() ? (o.out_dir / "records.db").string() : db_path;
    FindBinaries(bin_dir, &o);
    o.no_records = no_records;
    return RunAndReport(*m, o);
  }
  if (*replay) {
    absl::StatusOr<fl::experiment::RecordedManifest> rec = fl::experiment::ReadRecordedManifest(replay_db, replay_id);
    if (!rec.ok()) return Fail(rec.status());
    absl::StatusOr<fl::experiment::Manifest> m =
        fl::experiment::ManifestFromResolvedJson(rec->resolved_json, rec->manifest_yaml);
    if (!m.ok()) return Fail(m.status());
    if (rec->software_version != FL_VERSION) {
      spdlog::warn("experiment {} was recorded by version {}; this is {}", rec->experiment_id, rec->software_version,
                   FL_VERSION);
    }
    fl::experiment::RunOptions o;
    // The name comes from the records database: checked like a manifest's before it forms a path.
    absl::StatusOr<fs::path> default_out = fl::experiment::ExperimentOutputDir("out", m->name, "-replay");
    if (out_dir.empty() && !default_out.ok()) return Fail(default_out.status());
    o.out_dir = out_dir.empty() ? *default_out : fs::path(out_dir);
    o.db_path = replay_db;
    FindBinaries(bin_dir, &o);
    o.replay_of = rec->experiment_id;
    o.interrupted = &g_interrupted;
    o.software_version = FL_VERSION;
    absl::StatusOr<fl::experiment::RunResult> r = fl::experiment::RunExperiment(*m, o);
    if (!r.ok()) return Fail(r.status(), 1);
    absl::StatusOr<std::string> cmp =
        fl::experiment::CompareExperiments(replay_db, rec->experiment_id, r->experiment_id);
    std::printf("%s\n", cmp.ok() ? cmp->c_str() : std::string(fl::ToStd(cmp.status().message())).c_str());
    std::printf("replay %s %s%s%s\n", r->experiment_id.c_str(), r->status.c_str(), r->reason.empty() ? "" : ": ",
                r->reason.c_str());
    return r->status == "finished" ? 0 : 1;
  }
  // calibrate
  absl::StatusOr<std::vector<fl::emulation::Backend>> backends = fl::emulation::ParseBackends(backend);
  if (!backends.ok()) return Fail(backends.status());
  std::vector<fl::emulation::CalibrationResult> all;
  for (const std::string& p : profiles) {
    const fs::path file = ResolveProfile(p, profiles_dir);
    absl::StatusOr<fl::emulation::LinkProfile> profile = fl::emulation::LoadLinkProfile(file);
    if (!profile.ok()) return Fail(profile.status());
    std::vector<fl::emulation::CalibrationResult> mine;
    for (fl::emulation::Backend b : *backends) {
      if (g_interrupted.load()) return 1;
      fl::emulation::CalibrationOptions co;
      co.backend = b;
      absl::StatusOr<fl::emulation::CalibrationResult> r = fl::emulation::Calibrate(*profile, co);
      if (!r.ok()) return Fail(r.status(), 1);
      mine.push_back(*r);
    }
    if (write) {
      absl::StatusOr<fs::path> written = fl::emulation::WriteCalibrationYaml(file, mine);
      if (!written.ok()) return Fail(written.status(), 1);
      spdlog::info("wrote {}", written->string());
    }
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::printf("%s", fl::emulation::CalibrationTable(all).c_str());
  if (const std::string physics = fl::emulation::PhysicsTable(all); !physics.empty()) {
    std::printf("\n%s", physics.c_str());
  }
  return 0;
}
