#include "fl/experiment/islands_slurm.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <spdlog/spdlog.h>

#include "fl/core/str_cat.h"
#include "fl/sys/process.h"

namespace fl::experiment {
namespace {

namespace fs = std::filesystem;

// The partition the job goes to: the manifest's, else the cluster's default. Errors name it and the ones there are.
absl::StatusOr<slurm::PartitionInfo> FindPartition(const std::string& wanted,
                                                   const std::vector<slurm::PartitionInfo>& partitions) {
  std::string names;
  for (const slurm::PartitionInfo& p : partitions) {
    if (wanted.empty() ? p.is_default : p.name == wanted) return p;
    names += fl::StrCat(names.empty() ? "" : ", ", p.name);
  }
  if (wanted.empty()) {
    return absl::InvalidArgumentError(
        fl::StrCat("the cluster has no default partition; set launcher.partition to one of: ", names));
  }
  return absl::InvalidArgumentError(
      fl::StrCat("launcher.partition '", wanted, "' does not exist on this cluster; its partitions: ", names));
}

// The partition's node names in Slurm's order (sinfo -N).
absl::StatusOr<std::vector<std::string>> PartitionNodes(const std::string& partition) {
  absl::StatusOr<std::string> out = fl::sys::RunCommand({"sinfo", "-h", "-N", "-p", partition, "-o", "%N"});
  if (!out.ok()) return out.status();
  std::vector<std::string> nodes;
  std::istringstream in(*out);
  for (std::string n; in >> n;) {
    if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
  }
  if (nodes.empty()) return absl::FailedPreconditionError(fl::StrCat("partition ", partition, " has no nodes (sinfo)"));
  return nodes;
}

// The lines a failed job's output has about what failed (the steps' and the launcher's own messages).
std::string FailureLines(const fs::path& output) {
  std::ifstream in(output);
  std::string lines;
  for (std::string line; std::getline(in, line);) {
    if (line.find("fl-experiment:") != std::string::npos || line.find("fl-islands-run") != std::string::npos) {
      lines += fl::StrCat(lines.empty() ? "" : "; ", line);
    }
  }
  return lines;
}

}  // namespace

uint32_t IslandsJobNodes(const IslandsExperimentConfig& c, uint32_t partition_nodes) {
  if (c.launcher.nodes > 0) return c.launcher.nodes;
  return std::max<uint32_t>(1, std::min(c.islands, partition_nodes));
}

std::vector<ProcessPlacement> PlaceIslands(const IslandsExperimentConfig& c,
                                           const std::vector<std::pair<std::string, std::string>>& nodes) {
  std::vector<ProcessPlacement> placements;
  if (nodes.empty()) return placements;
  placements.push_back({"coordinator", nodes[0].first, nodes[0].second});
  for (uint32_t i = 0; i < c.islands; ++i) {
    const auto& [node, host] = nodes[i % nodes.size()];
    placements.push_back({fl::StrCat("island-", i), node, host});
  }
  return placements;
}

absl::StatusOr<slurm::BatchJob> IslandsJob(const IslandsExperimentConfig& c, const IslandsJobPaths& paths,
                                           uint32_t nodes) {
  if (c.mode != "diloco") {
    return absl::InvalidArgumentError(
        fl::StrCat(c.source, ": mode ", c.mode,
                   " runs a static ring whose every endpoint each island must know before any starts; on Slurm use "
                   "mode diloco (the coordinator tells each island its peers), or launcher.kind local"));
  }
  if (nodes == 0) return absl::InvalidArgumentError("an islands job needs at least one node");
  for (const std::string* p : {&paths.fl_islands_run, &paths.manifest, &paths.out_dir}) {
    if (!fs::path(*p).is_absolute()) {
      return absl::InvalidArgumentError(
          fl::StrCat("'", *p, "' is relative: every node of the job must find it, so give an absolute path"));
    }
  }
  slurm::BatchJob job;
  job.job_name = fl::StrCat("fl-islands-", c.name);
  job.partition = c.launcher.partition;
  job.time = c.launcher.time;
  job.nodes = nodes;
  job.sbatch_args = c.launcher.sbatch_args;
  job.output = fs::path(paths.out_dir) / "slurm-%j.out";
  job.comment = fl::StrCat("fl-islands-run: islands manifest ", paths.manifest,
                           " on Slurm (docs/cluster.md \"Islands on Slurm\"); submit with sbatch");
  // Every step runs this launcher for its part on its node, advertising the node's address (Slurm's NodeAddr).
  auto step = [&](const std::string& part, int node) {
    slurm::Step s;
    s.name = part;
    s.tasks = 1;
    s.nodes = 1;
    s.relative = node;
    s.argv = {paths.fl_islands_run,
              "--manifest",
              paths.manifest,
              "--out",
              paths.out_dir,
              "--step",
              part,
              "--advertise",
              "node",
              "--fl-island",
              paths.fl_island,
              "--fl-coordinator",
              paths.fl_coordinator};
    return s;
  };
  job.steps.push_back(step("coordinator", 0));
  for (uint32_t i = 0; i < c.islands; ++i) {
    job.steps.push_back(step(fl::StrCat("island-", i), static_cast<int>(i % nodes)));
  }
  return job;
}

absl::StatusOr<std::string> RenderIslandsBatchScript(const IslandsExperimentConfig& c, const IslandsJobPaths& paths) {
  absl::StatusOr<slurm::BatchJob> job = IslandsJob(c, paths, c.launcher.nodes > 0 ? c.launcher.nodes : c.islands);
  if (!job.ok()) return job.status();
  return slurm::RenderBatchScript(*job);
}

absl::StatusOr<IslandsExperimentResult> RunIslandsOnSlurm(const IslandsExperimentConfig& c,
                                                          const IslandsJobPaths& paths,
                                                          const std::atomic<bool>* interrupted) {
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  if (absl::Status s = slurm::CheckSlurm(); !s.ok()) return s;
  absl::StatusOr<std::vector<slurm::PartitionInfo>> partitions = slurm::Partitions();
  if (!partitions.ok()) return partitions.status();
  absl::StatusOr<slurm::PartitionInfo> partition = FindPartition(c.launcher.partition, *partitions);
  if (!partition.ok()) return partition.status();
  absl::StatusOr<std::vector<std::string>> node_names = PartitionNodes(partition->name);
  if (!node_names.ok()) return node_names.status();

  // Each process advertises its node's address: the partition's first nodes are where the job is expected to
  // land, and every node's address goes into the coordinator's certificate (it may land on any of them).
  const uint32_t nodes = IslandsJobNodes(c, partition->nodes);
  std::vector<std::pair<std::string, std::string>> addresses;
  std::vector<std::string> all_hosts;
  for (const std::string& n : *node_names) {
    absl::StatusOr<std::string> address = slurm::NodeAddress(n);
    if (!address.ok()) return address.status();
    addresses.emplace_back(n, *address);
    all_hosts.push_back(*address);
  }
  addresses.resize(std::min<size_t>(addresses.size(), nodes));
  if (absl::Status s = CheckPeersCanReach(PlaceIslands(c, addresses)); !s.ok()) return s;

  absl::StatusOr<slurm::BatchJob> job = IslandsJob(c, paths, nodes);
  if (!job.ok()) return job.status();
  if (absl::Status s = slurm::CheckJobFits(*job, *partitions); !s.ok()) return s;

  std::error_code ec;
  fs::create_directories(paths.out_dir, ec);
  const fs::path out(paths.out_dir);
  // What a previous run left would be read as this run's: the coordinator's address above all.
  for (const char* stale : {"coordinator.address", "coordinator.port", "result.json"}) fs::remove(out / stale, ec);
  for (uint32_t i = 0; i < c.islands; ++i) {
    for (uint32_t r = 0; r < c.ranks_per_island; ++r)
      fs::remove(out / fl::StrCat("island-", i, "-rank", r, ".json"), ec);
  }
  if (c.security == "tls") {
    if (absl::Status s = ProvisionIslandsPki(c, paths.out_dir, all_hosts); !s.ok()) return s;
  }
  const fs::path script = out / "islands.sbatch";
  {
    std::ofstream f(script);
    f << slurm::RenderBatchScript(*job);
    if (!f) return absl::InternalError(fl::StrCat("cannot write ", script.string()));
  }
  absl::StatusOr<slurm::JobOutcome> outcome = slurm::SubmitAndWait(script, interrupted);
  if (!outcome.ok()) return outcome.status();
  // The launcher's own cost beside the run's: sbatch's answer, and the whole job from submission to its end.
  spdlog::info("islands job {}: sbatch answered in {:.2f} s; the job ended {:.2f} s after submission (exit {})",
               outcome->job_id, outcome->submit_s, outcome->total_s, outcome->exit_code);
  if (outcome->cancelled) {
    return absl::CancelledError(fl::StrCat("the islands job ", outcome->job_id, " was cancelled"));
  }
  if (outcome->exit_code != 0) {
    std::string output = job->output.string();
    if (const size_t j = output.find("%j"); j != std::string::npos) output.replace(j, 2, outcome->job_id);
    const std::string why = FailureLines(output);
    return absl::InternalError(fl::StrCat("the islands job ", outcome->job_id, " exited with ", outcome->exit_code,
                                          why.empty() ? "" : fl::StrCat(": ", why), "; see ", output,
                                          " and the logs in ", paths.out_dir));
  }
  return GatherIslandsResult(c, paths.out_dir);
}

}  // namespace fl::experiment
