// Experiments on Slurm (docs/cluster.md "Experiments on Slurm", issue 31): one allocation, the server as a job
// step on its first node, each client group as a step whose tasks each run a node-local agent (`fl-experiment
// step clients`) that starts that task's fl-client process with the runner's own code (RunOptions::Part), so
// that links and devices are applied on the node that runs each client and names, shards and flags are those
// of a local run.
//
// The generic half (a batch script from steps, submitting and waiting, cancelling, a step's rank) is what the
// islands launcher builds on; the experiment half turns a manifest into those steps.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/experiment/manifest.h"
#include "fl/experiment/runner.h"

namespace fl::experiment::slurm {

// One job step: `srun` with these tasks running `argv` (each task the same command; it finds its own part from
// SLURM_PROCID, StepRankFromEnv).
struct Step {
  std::string name;             // srun --job-name; named in the job's output when the step fails
  uint32_t tasks = 1;           // srun --ntasks
  uint32_t nodes = 0;           // srun --nodes; 0 = as srun places the tasks
  uint32_t tasks_per_node = 0;  // srun --ntasks-per-node; 0 = no limit
  int relative = -1;            // srun --relative (the allocation's node index); -1 = any
  std::vector<std::string> argv;
  // The job ends with this step: when it exits, the others are given a moment and the job's exit status is its.
  bool main = false;
};

struct BatchJob {
  std::string job_name;
  std::string partition;  // "" = the cluster's default
  std::string time;       // "" = the partition's default
  uint32_t nodes = 1;
  std::vector<std::string> sbatch_args;  // further #SBATCH lines
  std::filesystem::path output;          // #SBATCH --output (may hold %j)
  std::string comment;                   // a comment at the top (what wrote it, how to run it)
  // Shell variable assignments before anything runs (NAME=value, value quoted by the renderer; a value may
  // refer to ${SLURM_JOB_ID}).
  std::vector<std::pair<std::string, std::string>> variables;
  // Run on the batch host before any step (each a command; a failure ends the job with exit 2).
  std::vector<std::vector<std::string>> prologue;
  std::vector<Step> steps;
};

// The total of the steps' tasks: the job's --ntasks.
uint32_t TotalTasks(const BatchJob& job);

// The batch script: #SBATCH lines, the prologue, every step as `srun ... &`, then a loop that waits for them: a
// step that fails (non-zero exit) is named on stderr ("fl-experiment: step NAME failed (exit N)") and the other
// steps' tasks are sent SIGTERM (scancel --signal=TERM: fl-server records the experiment aborted); the main
// step's exit status is the job's, or 1 when another step failed. Arguments are quoted for bash where they need
// it; `$VAR` references to the variables are left to the shell only in values given as variables.
std::string RenderBatchScript(const BatchJob& job);

// sbatch and sinfo are installed and the controller answers (sinfo). A FailedPrecondition saying what is missing
// (sbatch not on PATH: install Slurm's client, deploy/install-deps.sh --slurm; sinfo's own error, with SLURM_CONF).
absl::Status CheckSlurm();

struct PartitionInfo {
  std::string name;
  uint32_t nodes = 0;
  uint32_t cpus_per_node = 0;  // the smallest node's
  bool is_default = false;
};
absl::StatusOr<std::vector<PartitionInfo>> Partitions();

// The job's shape against the cluster, before submission: the partition exists (else naming it and the ones
// there are), the job's nodes are at most the partition's, each step's tasks fit the job's nodes at its
// tasks_per_node, and all tasks fit the nodes' CPUs. An InvalidArgument naming the step or the partition.
absl::Status CheckJobFits(const BatchJob& job, const std::vector<PartitionInfo>& partitions);

struct JobOutcome {
  std::string job_id;
  int exit_code = 0;       // sbatch --wait's: the batch script's
  bool cancelled = false;  // `interrupted` was set and the job was cancelled (scancel)
  double submit_s = 0;     // wall time from calling sbatch until it printed the job id
  double total_s = 0;      // until sbatch --wait returned
};

// Submits `script` with sbatch --parsable --wait and waits; while it waits, `interrupted` set cancels the job
// (scancel), so that Ctrl-C on the caller stops every step. `on_submitted` (may be empty) gets the job id.
absl::StatusOr<JobOutcome> SubmitAndWait(const std::filesystem::path& script, const std::atomic<bool>* interrupted,
                                         const std::function<void(const std::string&)>& on_submitted = {});

// scancel JOB.
absl::Status Cancel(const std::string& job_id);

// A task's place in its step, from the environment srun gives it.
struct StepRank {
  uint32_t procid = 0;   // SLURM_PROCID: the task's rank in its step
  uint32_t ntasks = 1;   // SLURM_NTASKS / SLURM_STEP_NUM_TASKS
  uint32_t localid = 0;  // SLURM_LOCALID: its rank on its node
  uint32_t nodeid = 0;   // SLURM_NODEID: its node's index in the step
  std::string node;      // SLURMD_NODENAME
};
// An InvalidArgument when SLURM_PROCID is missing (not run by srun) or not a number.
absl::StatusOr<StepRank> StepRankFromEnv();

// The address this node is reached at by the job's other nodes: Slurm's NodeAddr of SLURMD_NODENAME (scontrol
// show node), which is what slurmctld itself dials; a FailedPrecondition naming the node when it cannot tell.
// Never a loopback address unless the node's NodeAddr is one (every node on one host).
absl::StatusOr<std::string> NodeAddress(const std::string& node);

// This step's node's address for the job's other nodes to dial (NodeAddress of SLURMD_NODENAME), refused, naming
// `who` (e.g. "the server step", "island-1") and the node, when it is a loopback address while the job spans
// several nodes (SLURM_JOB_NUM_NODES > 1): the processes there would dial themselves.
absl::StatusOr<std::string> ReachableNodeAddress(const std::string& who);

// ---- experiments ----

struct ExperimentJobPaths {
  std::filesystem::path fl_experiment;  // the binary the steps run (absolute; every node must see it)
  std::filesystem::path manifest;       // absolute
  std::filesystem::path out_dir;        // absolute, shared by the nodes
  std::string db_path;                  // absolute
  std::filesystem::path bin_dir;        // fl-server, fl-client (absolute); "" = where fl-experiment finds them
  std::filesystem::path profiles_dir;   // "" = the manifest's default
  std::string resume_id;                // "" = a new experiment; else the job continues it (run --resume)
};

// The batch job of `manifest` (launcher.partition/time/nodes/sbatch_args; a step per client group with
// processes_per_node): prologue `fl-experiment step prepare`, the server step on node 0, the client steps.
// The experiment id is <name>-slurm-$SLURM_JOB_ID unless FL_EXPERIMENT_ID is set when the job runs; with
// paths.resume_id it is that experiment's, and every step runs with --resume. Errors for
// a manifest that cannot run on Slurm (emulation.backend packet: its clients must share the server's machine).
absl::StatusOr<BatchJob> ExperimentJob(const Manifest& manifest, const ExperimentJobPaths& paths);

// How many fl-client processes each client group runs as (PlanClientProcesses' grouping), and the index of each
// group's first process, in manifest order.
struct GroupProcesses {
  std::string group;
  uint32_t first = 0;
  uint32_t count = 0;
};
absl::StatusOr<std::vector<GroupProcesses>> ClientGroupProcesses(const Manifest& manifest);

// The node-local agent, `fl-experiment step server|clients|prepare` (main.cc), with RunOptions filled in by the
// caller (out_dir, db_path, binaries, experiment_id, interrupted). `group` names the client group for
// "clients". Returns the exit status to use and prints what failed.
// The server step writes <out>/server.host (NodeAddress) before fl-server starts; a clients step waits for it
// and fl-server's <out>/server.port (the prologue removed both), then runs its task's process.
int RunStep(const std::string& part, const Manifest& manifest, const std::string& group, RunOptions options);

}  // namespace fl::experiment::slurm
