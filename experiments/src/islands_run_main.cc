// fl-islands-run: runs one islands experiment manifest (experiments/diloco/*.yaml) on this machine and
// prints its result as one JSON line (also written to <out>/result.json).
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>

#include "fl/experiment/islands_experiment.h"

int main(int argc, char** argv) {
  std::string manifest;
  fl::experiment::LaunchPaths paths;
  paths.fl_island = std::string(FL_BIN_DIR) + "/diloco/island/fl-island";
  paths.fl_coordinator = std::string(FL_BIN_DIR) + "/diloco/coord/fl-coordinator";
  paths.out_dir = "out/islands";
  CLI::App app{"fl-islands-run: run a DiLoCo / Streaming DiLoCo / data-parallel islands manifest"};
  app.add_option("--manifest", manifest, "experiments/diloco/<name>.yaml")->required();
  app.add_option("--out", paths.out_dir, "output directory (summaries, logs, records.db, result.json)")
      ->capture_default_str();
  app.add_option("--fl-island", paths.fl_island, "fl-island binary")->capture_default_str();
  app.add_option("--fl-coordinator", paths.fl_coordinator, "fl-coordinator binary (the islands coordinator)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  absl::StatusOr<fl::experiment::IslandsExperimentConfig> config = fl::experiment::LoadIslandsExperiment(manifest);
  if (!config.ok()) {
    std::cerr << "fl-islands-run: " << config.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<fl::experiment::IslandsExperimentResult> result = fl::experiment::RunIslandsExperiment(*config, paths);
  if (!result.ok()) {
    std::cerr << "fl-islands-run: " << result.status().message() << "\n";
    return 1;
  }
  std::cout << result->ToJson() << std::endl;
  return 0;
}
