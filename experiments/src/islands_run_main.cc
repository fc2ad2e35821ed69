// fl-islands-run: runs one islands experiment manifest (experiments/diloco/*.yaml) on this machine, or through
// Slurm (--launcher slurm, docs/cluster.md "Islands on Slurm"), and prints its result as one JSON line (also
// written to <out>/result.json). Under Slurm every job step runs this same command for its part (--step).
#include <CLI/CLI.hpp>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "fl/core/str_cat.h"
#include "fl/experiment/islands_experiment.h"
#include "fl/experiment/islands_slurm.h"

namespace {

std::atomic<bool> g_interrupted{false};
void OnSignal(int) { g_interrupted = true; }

std::string Absolute(const std::string& path) {
  return path.empty() ? path : std::filesystem::absolute(path).lexically_normal().string();
}

}  // namespace

int main(int argc, char** argv) {
  std::string manifest;
  fl::experiment::LaunchPaths paths;
  paths.fl_island = std::string(FL_BIN_DIR) + "/diloco/island/fl-island";
  paths.fl_coordinator = std::string(FL_BIN_DIR) + "/diloco/coord/fl-coordinator";
  paths.out_dir = "out/islands";
  std::string launcher;
  bool render = false;
  CLI::App app{"fl-islands-run: run a DiLoCo / Streaming DiLoCo / data-parallel islands manifest"};
  app.add_option("--manifest", manifest, "experiments/diloco/<name>.yaml")->required();
  app.add_option("--out", paths.out_dir, "output directory (summaries, logs, records.db, result.json)")
      ->capture_default_str();
  app.add_option("--fl-island", paths.fl_island, "fl-island binary")->capture_default_str();
  app.add_option("--fl-coordinator", paths.fl_coordinator, "fl-coordinator binary (the islands coordinator)")
      ->capture_default_str();
  app.add_option("--launcher", launcher, "local (this machine) or slurm (default: the manifest's launcher.kind)")
      ->check(CLI::IsMember({"local", "slurm"}));
  app.add_flag("--render", render, "--launcher slurm: print the batch script instead of submitting it");
  app.add_option("--advertise", paths.advertise,
                 "the address every process binds and its peers dial (local runs: one of this machine's; \"node\": "
                 "the Slurm node's NodeAddr, what job steps use)")
      ->capture_default_str();
  app.add_option("--step", paths.step, "inside a Slurm job: run only this part (coordinator or island-<i>)");
  CLI11_PARSE(app, argc, argv);
  absl::StatusOr<fl::experiment::IslandsExperimentConfig> config = fl::experiment::LoadIslandsExperiment(manifest);
  if (!config.ok()) {
    std::cerr << "fl-islands-run: " << config.status().message() << "\n";
    return 2;
  }
  if (!launcher.empty()) config->launcher.kind = launcher;
  if (config->launcher.kind == "slurm" && paths.step.empty()) {
    // Ctrl-C or SIGTERM cancels the job (scancel) instead of leaving it running on the cluster.
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    std::error_code ec;
    const fl::experiment::IslandsJobPaths resolved{
        .fl_islands_run = std::filesystem::read_symlink("/proc/self/exe", ec).string(),
        .fl_island = Absolute(paths.fl_island),
        .fl_coordinator = Absolute(paths.fl_coordinator),
        .manifest = Absolute(manifest),
        .out_dir = Absolute(paths.out_dir)};
    if (render) {
      absl::StatusOr<std::string> script = fl::experiment::RenderIslandsBatchScript(*config, resolved);
      if (!script.ok()) {
        std::cerr << "fl-islands-run: " << script.status().message() << "\n";
        return 2;
      }
      std::cout << *script;
      return 0;
    }
    absl::StatusOr<fl::experiment::IslandsExperimentResult> result =
        fl::experiment::RunIslandsOnSlurm(*config, resolved, &g_interrupted);
    if (!result.ok()) {
      std::cerr << "fl-islands-run: " << result.status().message() << "\n";
      return result.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    std::cout << result->ToJson() << std::endl;
    return result->hashes_equal ? 0 : 1;
  }
  if (render) {
    std::cerr << "fl-islands-run: --render prints a Slurm batch script: add --launcher slurm\n";
    return 2;
  }
  if (paths.advertise == "node") {
    absl::StatusOr<std::string> address =
        fl::experiment::slurm::ReachableNodeAddress(paths.step.empty() ? "fl-islands-run" : paths.step);
    if (!address.ok()) {
      std::cerr << "fl-islands-run: " << address.status().message() << "\n";
      return 2;
    }
    paths.advertise = *address;
  }
  absl::StatusOr<fl::experiment::IslandsExperimentResult> result = fl::experiment::RunIslandsExperiment(*config, paths);
  if (!result.ok()) {
    std::cerr << "fl-islands-run" << (paths.step.empty() ? "" : " step " + paths.step) << ": "
              << result.status().message() << "\n";
    return result.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (!paths.step.empty()) {  // a part's result is whole only once gathered by the submitting launcher
    std::cout << "fl-islands-run step " << paths.step << ": done (advertised " << paths.advertise << ")" << std::endl;
    return 0;
  }
  std::cout << result->ToJson() << std::endl;
  return 0;
}
