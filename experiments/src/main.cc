// fl-experiment: run an experiment from its manifest, replay a recorded one, calibrate link profiles.
//
//   fl-experiment run MANIFEST [--db PATH] [--out DIR] [--launcher local|slurm]
//   fl-experiment render --launcher slurm MANIFEST [--out DIR] [--db PATH]   (the batch script, submits nothing)
//   fl-experiment render --launcher kubernetes MANIFEST [--out DIR] [--image I] [--namespace N] [--storage Q]
//                        [--pki-dir D]   (the objects as YAML files in DIR for kubectl apply -f DIR)
//   fl-experiment step prepare|server|clients MANIFEST ...   (a Slurm job's node-local agent, docs/cluster.md)
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
#include <fstream>
#include <optional>
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
#include "fl/experiment/k8s_render.h"
#include "fl/experiment/manifest.h"
#include "fl/experiment/runner.h"
#include "fl/experiment/slurm_launcher.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/report/analysis.h"
#include "fl/report/experiment_data.h"
#include "fl/report/progress.h"
#include "fl/report/tables.h"
#if FL_WITH_ISLANDS
#include <yaml-cpp/yaml.h>

#include "fl/experiment/islands_experiment.h"
#include "fl/experiment/islands_slurm.h"
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

// `launcher` "" = the manifest's launcher.kind; slurm runs (or with `render` prints the batch script of) the islands
// through fl-islands-run's steps (islands_slurm.h, docs/cluster.md "Islands on Slurm").
int RunIslands(const std::string& manifest_path, const std::string& out_dir, const std::string& bin_dir,
               const std::string& launcher = "", bool render = false) {
  absl::StatusOr<fl::experiment::IslandsExperimentConfig> config = fl::experiment::LoadIslandsExperiment(manifest_path);
  if (!config.ok()) return Fail(config.status());
  if (!launcher.empty()) config->launcher.kind = launcher;
  if (config->launcher.kind != "local" && config->launcher.kind != "slurm") {
    return Fail(absl::InvalidArgumentError(fl::StrCat("islands run locally or on Slurm, not on launcher ",
                                                      config->launcher.kind, " (", manifest_path, ")")));
  }
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
  if (config->launcher.kind == "slurm") {
    auto absolute = [](const std::string& p) { return fs::absolute(p).lexically_normal().string(); };
    // fl-islands-run is beside fl-experiment (build tree and install alike): every step runs it on its node.
    const fl::experiment::IslandsJobPaths resolved{.fl_islands_run = absolute((dir / "fl-islands-run").string()),
                                                   .fl_island = absolute(paths.fl_island),
                                                   .fl_coordinator = absolute(paths.fl_coordinator),
                                                   .manifest = absolute(manifest_path),
                                                   .out_dir = absolute(paths.out_dir)};
    if (render) {
      absl::StatusOr<std::string> script = fl::experiment::RenderIslandsBatchScript(*config, resolved);
      if (!script.ok()) return Fail(script.status());
      std::printf("%s", script->c_str());
      return 0;
    }
    absl::StatusOr<fl::experiment::IslandsExperimentResult> r =
        fl::experiment::RunIslandsOnSlurm(*config, resolved, &g_interrupted);
    if (!r.ok()) return Fail(r.status(), r.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1);
    std::printf("%s\nrecords: %s/records.db; logs and per-sync metrics: %s\n", r->ToJson().c_str(),
                paths.out_dir.c_str(), paths.out_dir.c_str());
    return r->hashes_equal ? 0 : 1;
  }
  if (render) {
    return Fail(absl::InvalidArgumentError(fl::StrCat(
        "render needs a cluster launcher for islands: --launcher slurm, or launcher.kind slurm in ", manifest_path)));
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

// The paths a Slurm job's steps use, absolute (they run elsewhere, in another working directory).
absl::StatusOr<fl::experiment::slurm::ExperimentJobPaths> SlurmPaths(const fl::experiment::Manifest& m,
                                                                     const fs::path& out_dir, const std::string& db,
                                                                     const std::string& bin_dir,
                                                                     const std::string& profiles_dir) {
  fl::experiment::slurm::ExperimentJobPaths p;
  std::error_code ec;
  // The steps run this fl-experiment, which finds fl-server and fl-client as this one does (beside it, or in the
  // build tree); with --bin-dir (an installed tree, or rendering for another machine), fl-experiment is there too.
  if (bin_dir.empty()) {
    p.fl_experiment = SelfDir() / "fl-experiment";
  } else {
    p.bin_dir = fs::absolute(bin_dir, ec).lexically_normal();
    p.fl_experiment = p.bin_dir / "fl-experiment";
  }
  p.manifest = fs::absolute(m.path, ec).lexically_normal();
  p.out_dir = fs::absolute(out_dir, ec).lexically_normal();
  p.db_path = fs::absolute(db, ec).lexically_normal().string();
  if (!profiles_dir.empty()) p.profiles_dir = fs::absolute(profiles_dir, ec).lexically_normal();
  return p;
}

// The newest modification time of the run's logs (the steps' last words): the end of the last step.
std::optional<fs::file_time_type> LastLogWrite(const fs::path& out_dir) {
  std::optional<fs::file_time_type> last;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(out_dir, ec)) {
    if (e.path().extension() != ".log") continue;
    const fs::file_time_type t = e.last_write_time(ec);
    if (!ec && (!last.has_value() || t > *last)) last = t;
  }
  return last;
}

// fl-experiment run --launcher slurm: checks the cluster and the job's shape, writes the batch script to
// <out>/slurm-job.sh, submits it with sbatch --wait (Ctrl-C cancels the job), then reports as a local run does.
// `resume_id`: the job continues that experiment (fl-experiment run --resume) instead of starting one.
int RunOnSlurm(const fl::experiment::Manifest& m, const fs::path& out_dir, const std::string& db,
               const std::string& bin_dir, const std::string& profiles_dir, const std::string& resume_id = "") {
  namespace slurm = fl::experiment::slurm;
  if (absl::Status s = slurm::CheckSlurm(); !s.ok()) return Fail(s);
  absl::StatusOr<slurm::ExperimentJobPaths> paths = SlurmPaths(m, out_dir, db, bin_dir, profiles_dir);
  if (!paths.ok()) return Fail(paths.status());
  paths->resume_id = resume_id;
  absl::StatusOr<slurm::BatchJob> job = slurm::ExperimentJob(m, *paths);
  if (!job.ok()) return Fail(job.status());
  absl::StatusOr<std::vector<slurm::PartitionInfo>> partitions = slurm::Partitions();
  if (!partitions.ok()) return Fail(partitions.status());
  if (absl::Status s = slurm::CheckJobFits(*job, *partitions); !s.ok()) {
    return Fail(absl::InvalidArgumentError(fl::StrCat(m.path, ": ", fl::ToStd(s.message()))));
  }
  std::error_code ec;
  fs::create_directories(paths->out_dir, ec);
  const fs::path script = paths->out_dir / "slurm-job.sh";
  {
    std::ofstream f(script);
    f << slurm::RenderBatchScript(*job);
    if (!f) return Fail(absl::FailedPreconditionError(fl::StrCat("cannot write ", script.string())), 1);
  }
  const auto submitted_at = fs::file_time_type::clock::now();
  absl::StatusOr<slurm::JobOutcome> r = slurm::SubmitAndWait(script, &g_interrupted, [&](const std::string& id) {
    std::printf("submitted Slurm job %s (%s); its output: %s/slurm-%s.out\n", id.c_str(), script.c_str(),
                paths->out_dir.c_str(), id.c_str());
    std::fflush(stdout);
  });
  if (!r.ok()) return Fail(r.status(), 1);
  const auto returned_at = fs::file_time_type::clock::now();
  const std::string id = resume_id.empty() ? fl::StrCat(m.name, "-slurm-", r->job_id) : resume_id;
  // What the job's steps said when they failed (the batch script and the agents write "fl-experiment step ...").
  std::string failures;
  {
    std::ifstream out(paths->out_dir / fl::StrCat("slurm-", r->job_id, ".out"));
    for (std::string line; std::getline(out, line);) {
      if (line.starts_with("fl-experiment: step ") || line.starts_with("fl-experiment step "))
        failures += "\n  " + line;
    }
  }
  std::string status = "failed", reason;
  if (absl::StatusOr<std::unique_ptr<fl::instrumentation::RecordReader>> reader =
          fl::instrumentation::RecordReader::Open(paths->db_path);
      reader.ok()) {
    if (absl::StatusOr<fl::instrumentation::ExperimentRecord> e = (*reader)->GetExperiment(id); e.ok()) {
      status = std::string(fl::instrumentation::ExperimentStatusName(e->status));
      reason = e->status_reason;
      std::printf("%s", Summary(paths->db_path, id).c_str());
    }
  }
  if (status == "running") {
    // fl-server was killed before it could record how the experiment ended (a node lost, SIGKILL).
    status = "failed";
    reason = "the server step ended without recording the outcome; the committed rounds are intact";
  }
  if (r->exit_code != 0 && status == "finished") status = "failed";
  // The launcher's own overhead: submission to the server step's start (it writes server.host first), and the
  // last step's last log line to sbatch returning.
  std::string overhead;
  std::error_code e1, e2;
  const fs::file_time_type started = fs::last_write_time(paths->out_dir / "server.host", e1);
  const std::optional<fs::file_time_type> last_log = LastLogWrite(paths->out_dir);
  if (!e1 && last_log.has_value()) {
    overhead = fl::StrCat(
        "; launcher: sbatch answered in ", r->submit_s, " s, first step started ",
        std::chrono::duration<double>(started - submitted_at).count(), " s after submission, sbatch returned ",
        std::chrono::duration<double>(returned_at - *last_log).count(), " s after the last step's log");
  }
  std::printf("experiment %s %s (Slurm job %s, exit %d%s)%s%s%s\nrecords: %s; logs: %s\n", id.c_str(), status.c_str(),
              r->job_id.c_str(), r->exit_code, r->cancelled ? ", cancelled" : "", reason.empty() ? "" : ": ",
              reason.c_str(), failures.empty() ? "" : fl::StrCat("\nfailed steps:", failures).c_str(),
              paths->db_path.c_str(), paths->out_dir.c_str());
  std::printf("%s\n", overhead.empty() ? "" : overhead.substr(2).c_str());
  return status == "finished" && r->exit_code == 0 ? 0 : 1;
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
  bool resume = false;
  run->add_flag("--resume", resume,
                "Continue the newest experiment of this manifest in the records (--out's records.db, or --db) after "
                "its last committed round: fl-server --resume from its checkpoints, its CA, clients started afresh "
                "(after a node or step failed mid-run; refused for a finished experiment)");
  run->add_flag("--no-records", no_records,
                "No records database or checkpoints (only to measure what instrumentation costs; no report)");
  std::string launcher;
  run->add_option("--launcher", launcher,
                  "local (this machine) or slurm (sbatch --wait: one allocation, docs/cluster.md); default: the "
                  "manifest's launcher.kind")
      ->check(CLI::IsMember({"local", "slurm"}));

  CLI::App* render = app.add_subcommand("render", "Print what a cluster needs to run the experiment, submit nothing");
  render->add_option("manifest", manifest_path, "Experiment manifest (YAML)")->required();
  std::string render_launcher;
  render->add_option("--launcher", render_launcher,
                     "slurm (the batch script) or kubernetes (the objects, docs/cluster.md); default: the manifest's "
                     "launcher.kind");
  render->add_option("--out", out_dir,
                     "slurm: the output folder the job writes to (default: out/<name>, made absolute); kubernetes: "
                     "where the YAML files (and a throwaway CA, pki/) go (default: out/<name>-k8s)");
  fl::experiment::K8sRenderOptions k8s;
  render->add_option("--image", k8s.image, "kubernetes: the container image (default: launcher.image)");
  render->add_option("--namespace", k8s.k8s_namespace, "kubernetes: the namespace (default: launcher.namespace)");
  render->add_option("--storage", k8s.storage, "kubernetes: the records volume's size (default: launcher.storage)");
  render->add_option("--pki-dir", k8s.pki_dir,
                     "kubernetes: the certificates for the Secrets, an fl-provision directory (default: "
                     "security.pki_dir, else a throwaway CA made in <out>/pki)");
  render->add_option("--db", db_path, "Records database (default: <out>/records.db)");
  render->add_option("--profiles-dir", run_profiles_dir, "Folder with links/ and devices/ profiles");

  // The node-local agent of a Slurm job (slurm_launcher.h): not for people, the batch script runs it.
  std::string step_part, step_group, step_id;
  CLI::App* step = app.add_subcommand("step", "A Slurm job step's agent (run by the batch script; docs/cluster.md)");
  step->add_option("part", step_part, "prepare, server or clients")
      ->required()
      ->check(CLI::IsMember({"prepare", "server", "clients"}));
  step->add_option("manifest", manifest_path, "Experiment manifest (YAML)")->required();
  step->add_option("--out", out_dir, "The run's output folder (shared by the nodes)")->required();
  step->add_option("--db", db_path, "Records database")->required();
  step->add_option("--experiment-id", step_id, "The run's experiment id")->required();
  step->add_option("--group", step_group, "clients: the client group this step runs");
  step->add_option("--profiles-dir", run_profiles_dir, "Folder with links/ and devices/ profiles");
  bool step_resume = false;
  step->add_flag("--resume", step_resume, "The job continues experiment --experiment-id (fl-experiment run --resume)");
  step->group("");  // hidden from --help

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
  if (*render) {
#if FL_WITH_ISLANDS
    if (IsIslandsManifest(manifest_path)) return RunIslands(manifest_path, out_dir, bin_dir, render_launcher, true);
#endif
    absl::StatusOr<fl::experiment::Manifest> m =
        fl::experiment::LoadManifest(manifest_path, fl::experiment::ManifestOptions{run_profiles_dir});
    if (!m.ok()) return Fail(m.status());
    const std::string kind = render_launcher.empty() ? m->launcher.kind : render_launcher;
    if (kind == "kubernetes") {
      absl::StatusOr<fs::path> default_k8s = fl::experiment::ExperimentOutputDir("out", m->name, "-k8s");
      if (out_dir.empty() && !default_k8s.ok()) return Fail(default_k8s.status());
      k8s.out_dir = out_dir.empty() ? *default_k8s : fs::path(out_dir);
      k8s.software_version = FL_VERSION;
      absl::StatusOr<fl::experiment::K8sRendering> objects = fl::experiment::RenderKubernetes(*m, k8s);
      if (!objects.ok()) return Fail(objects.status());
      if (absl::Status s = fl::experiment::WriteKubernetes(*objects, k8s.out_dir); !s.ok()) return Fail(s, 1);
      for (const auto& file : objects->files) std::printf("wrote %s\n", (k8s.out_dir / file.first).c_str());
      std::printf(
          "certificates: %s\napply with: kubectl apply --server-side -f %s (docs/cluster.md \"Kubernetes, "
          "rendered\")\n",
          objects->pki_source.empty() ? "none (security.mode insecure)" : objects->pki_source.c_str(),
          k8s.out_dir.c_str());
      return 0;
    }
    if (kind != "slurm") {
      return Fail(absl::InvalidArgumentError(
          fl::StrCat("render needs a cluster launcher: --launcher slurm or kubernetes, or launcher.kind in ", m->path,
                     " (it is ", kind, ")")));
    }
    absl::StatusOr<fs::path> default_out = fl::experiment::ExperimentOutputDir("out", m->name);
    if (out_dir.empty() && !default_out.ok()) return Fail(default_out.status());
    const fs::path out = out_dir.empty() ? *default_out : fs::path(out_dir);
    absl::StatusOr<fl::experiment::slurm::ExperimentJobPaths> paths =
        SlurmPaths(*m, out, db_path.empty() ? (out / "records.db").string() : db_path, bin_dir, run_profiles_dir);
    if (!paths.ok()) return Fail(paths.status());
    absl::StatusOr<fl::experiment::slurm::BatchJob> job = fl::experiment::slurm::ExperimentJob(*m, *paths);
    if (!job.ok()) return Fail(job.status());
    std::printf("%s", fl::experiment::slurm::RenderBatchScript(*job).c_str());
    return 0;
  }
  if (*step) {
    absl::StatusOr<fl::experiment::Manifest> m =
        fl::experiment::LoadManifest(manifest_path, fl::experiment::ManifestOptions{run_profiles_dir});
    if (!m.ok()) return Fail(m.status());
    fl::experiment::RunOptions o;
    o.out_dir = out_dir;
    o.db_path = db_path;
    o.experiment_id = step_id;
    o.resume = step_resume;
    FindBinaries(bin_dir, &o);
    o.interrupted = &g_interrupted;
    o.software_version = FL_VERSION;
    return fl::experiment::slurm::RunStep(step_part, *m, step_group, o);
  }
  if (*run) {
#if FL_WITH_ISLANDS
    if (IsIslandsManifest(manifest_path)) return RunIslands(manifest_path, out_dir, bin_dir, launcher);
#endif
    absl::StatusOr<fl::experiment::Manifest> m =
        fl::experiment::LoadManifest(manifest_path, fl::experiment::ManifestOptions{run_profiles_dir});
    if (!m.ok()) return Fail(m.status());
    fl::experiment::RunOptions o;
    absl::StatusOr<fs::path> default_out = fl::experiment::ExperimentOutputDir("out", m->name);
    if (out_dir.empty() && !default_out.ok()) return Fail(default_out.status());
    o.out_dir = out_dir.empty() ? *default_out : fs::path(out_dir);
    o.db_path = db_path.empty() ? (o.out_dir / "records.db").string() : db_path;
    const std::string kind = launcher.empty() ? m->launcher.kind : launcher;
    if (resume) {
      if (no_records) return Fail(absl::InvalidArgumentError("--resume needs the records: drop --no-records"));
      absl::StatusOr<std::string> id = fl::experiment::ExperimentToResume(o.db_path, m->name);
      if (!id.ok()) return Fail(id.status());
      o.experiment_id = *id;
      o.resume = true;
      std::printf("resuming experiment %s from %s\n", id->c_str(), o.db_path.c_str());
      std::fflush(stdout);
    }
    if (kind == "slurm") return RunOnSlurm(*m, o.out_dir, o.db_path, bin_dir, run_profiles_dir, o.experiment_id);
    if (kind != "local") {
      return Fail(absl::InvalidArgumentError(fl::StrCat(m->path, ": launcher.kind ", kind,
                                                        " is rendered, not run: fl-experiment render --launcher ", kind,
                                                        ", or run with --launcher local")));
    }
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
