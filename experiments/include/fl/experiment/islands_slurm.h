// Islands on Slurm (docs/cluster.md "Islands on Slurm", issue 31 item 2): one allocation, the coordinator as a
// step on the job's first node and each island as a step on node i mod N, every step running this same launcher
// (`fl-islands-run --step coordinator|island-<i> --advertise node`) so that ports are picked, and processes
// started, on the node that runs them; each process advertises its node's address (Slurm's NodeAddr), never a
// loopback address while its peers run on other nodes. The batch script comes from the Slurm launcher library
// (slurm_launcher.h); the islands' summaries are gathered into the same result as a local run.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/experiment/islands_addresses.h"
#include "fl/experiment/islands_experiment.h"
#include "fl/experiment/slurm_launcher.h"

namespace fl::experiment {

struct IslandsJobPaths {
  std::string fl_islands_run;  // the binary every step runs (absolute; every node must see it)
  std::string fl_island;       // absolute
  std::string fl_coordinator;  // absolute
  std::string manifest;        // absolute
  std::string out_dir;         // absolute, shared by the nodes
};

// The job's nodes: launcher.nodes, or one per island (at most the partition's) when 0.
uint32_t IslandsJobNodes(const IslandsExperimentConfig& config, uint32_t partition_nodes);

// Where each process runs when the job holds `nodes` (name, address) in this order: the coordinator on the first,
// island i on node i mod N.
std::vector<ProcessPlacement> PlaceIslands(const IslandsExperimentConfig& config,
                                           const std::vector<std::pair<std::string, std::string>>& nodes);

// The batch job of an islands manifest on `nodes` nodes (mode diloco: the coordinator tells every island its
// peers; the static rings of data-parallel and onebit-adam need every endpoint before any island starts).
absl::StatusOr<slurm::BatchJob> IslandsJob(const IslandsExperimentConfig& config, const IslandsJobPaths& paths,
                                           uint32_t nodes);

// Runs the manifest through Slurm: checks Slurm and the partition, places the processes on the partition's
// first nodes and refuses a loopback address across nodes (naming the process, its address and node), makes the
// run's CA (the coordinator's certificate naming every node it may run on), writes <out>/islands.sbatch, submits
// it with sbatch --wait (the job's exit status is the run's; `interrupted` cancels it), and gathers the islands'
// summaries. Errors name the step that failed and its log.
absl::StatusOr<IslandsExperimentResult> RunIslandsOnSlurm(const IslandsExperimentConfig& config,
                                                          const IslandsJobPaths& paths,
                                                          const std::atomic<bool>* interrupted = nullptr);

// The batch script RunIslandsOnSlurm would submit, without Slurm (render): the job's nodes are launcher.nodes,
// or one per island.
absl::StatusOr<std::string> RenderIslandsBatchScript(const IslandsExperimentConfig& config,
                                                     const IslandsJobPaths& paths);

}  // namespace fl::experiment
