#include "fl/experiment/slurm_launcher.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "fl/core/str_cat.h"
#include "fl/experiment/islands_addresses.h"
#include "fl/sys/process.h"

namespace fl::experiment::slurm {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

fl::sys::SpawnOptions Command(std::vector<std::string> argv) {
  fl::sys::SpawnOptions o;
  o.argv = std::move(argv);
  return o;
}

// `v` as one bash word: as it is when it holds only characters bash leaves alone, else single-quoted.
std::string Quote(const std::string& v) {
  const bool plain = !v.empty() && std::all_of(v.begin(), v.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("_-./:=,+@%").find(c) != std::string_view::npos;
  });
  if (plain) return v;
  std::string out = "'";
  for (char c : v) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// An argument that is a reference to one of the script's variables ("$OUT/x", "${ID}") is double-quoted so that
// the shell expands it; anything else is quoted literally.
std::string Word(const std::string& v) {
  if (v.find('$') != std::string::npos && v.find_first_of("\"`\\'") == std::string::npos) {
    std::string out = "\"";
    out += v;
    out += '"';
    return out;
  }
  return Quote(v);
}

std::string Join(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) {
    if (!out.empty()) out += ' ';
    out += Word(a);
  }
  return out;
}

std::optional<std::string> Env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

uint32_t CeilDiv(uint32_t a, uint32_t b) { return b == 0 ? 1 : (a + b - 1) / b; }

}  // namespace

uint32_t TotalTasks(const BatchJob& job) {
  uint32_t n = 0;
  for (const Step& s : job.steps) n += s.tasks;
  return n;
}

std::string RenderBatchScript(const BatchJob& job) {
  std::ostringstream o;
  o << "#!/bin/bash\n";
  o << "#SBATCH --job-name=" << Quote(job.job_name) << "\n";
  if (!job.partition.empty()) o << "#SBATCH --partition=" << job.partition << "\n";
  if (!job.time.empty()) o << "#SBATCH --time=" << job.time << "\n";
  o << "#SBATCH --nodes=" << job.nodes << "\n";
  o << "#SBATCH --ntasks=" << TotalTasks(job) << "\n";
  if (!job.output.empty()) o << "#SBATCH --output=" << job.output.string() << "\n";
  for (const std::string& a : job.sbatch_args) o << "#SBATCH " << a << "\n";
  if (!job.comment.empty()) {
    std::istringstream lines(job.comment);
    for (std::string l; std::getline(lines, l);) o << "# " << l << "\n";
  }
  o << "set -u\n";
  for (const auto& [name, value] : job.variables) o << name << "=" << Word(value) << "\n";
  for (const std::vector<std::string>& cmd : job.prologue) {
    o << Join(cmd) << " || { echo \"fl-experiment: the job's preparation failed: "
      << (cmd.size() > 2 ? cmd[1] + " " + cmd[2] : cmd[0]) << " (exit $?)\" >&2; exit 2; }\n";
  }
  // Every step in the background, remembered by srun's pid; `wait -n -p` (bash 5.1) says which one ended.
  o << "declare -A STEP=()\n";
  std::string main_step;
  for (const Step& s : job.steps) {
    o << "srun --overlap --job-name=" << Quote(s.name) << " --ntasks=" << s.tasks;
    // Without a count srun spreads a step over every node of the job and warns when it has fewer tasks.
    if (s.nodes > 0) {
      o << " --nodes=" << s.nodes;
    } else {
      o << " --nodes=1-" << std::max<uint32_t>(1, std::min(s.tasks, job.nodes));
    }
    if (s.tasks_per_node > 0) o << " --ntasks-per-node=" << s.tasks_per_node;
    if (s.relative >= 0) o << " --relative=" << s.relative;
    o << " " << Join(s.argv) << " &\n";
    o << "STEP[$!]=" << Quote(s.name) << "\n";
    if (s.main) main_step = s.name;
  }
  o << "MAIN=" << Quote(main_step) << "\n";
  o << R"(status=0
failed=""
while ((${#STEP[@]} > 0)); do
  pid=""
  wait -n -p pid "${!STEP[@]}"
  rc=$?
  [[ -n "$pid" ]] || break
  name="${STEP[$pid]}"
  unset "STEP[$pid]"
  if [[ "$name" == "$MAIN" ]]; then
    [[ -n "$failed" ]] || status=$rc
    if ((rc != 0)) && [[ -z "$failed" ]]; then
      # The main step failed (fl-server, or its step refused to start): the others would wait for it.
      failed="$name"
      echo "fl-experiment: step $name failed (exit $rc); stopping the others" >&2
      ((${#STEP[@]} == 0)) || scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null
    fi
  elif ((rc != 0)) && [[ -z "$failed" ]]; then
    failed="$name"
    status=1
    echo "fl-experiment: step $name failed (exit $rc); stopping the others" >&2
    # SIGTERM to every step's tasks, nothing harder (srun itself, signalled, would SIGKILL its step): fl-server
    # records the experiment aborted, the agents stop their clients and links.
    ((${#STEP[@]} == 0)) || scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null
  fi
done
exit "$status"
)";
  return o.str();
}

absl::Status CheckSlurm() {
  const std::optional<std::string> conf = Env("SLURM_CONF");
  const std::string conf_text = conf.has_value() ? fl::StrCat("SLURM_CONF is ", *conf)
                                                 : std::string("SLURM_CONF is unset (/etc/slurm/slurm.conf)");
  for (const char* tool : {"sbatch", "sinfo", "srun", "scancel", "scontrol"}) {
    absl::StatusOr<fl::sys::CommandOutput> r = fl::sys::Capture(Command({tool, "--version"}));
    if (!r.ok()) {
      return absl::FailedPreconditionError(fl::StrCat(
          "no Slurm on this machine: ", tool,
          " is not installed (or not on PATH); install Slurm's client (Debian: deploy/install-deps.sh --slurm), or "
          "for a local test cluster run tools/local-slurm.sh start"));
    }
    if (!r->exit.success()) {
      return absl::FailedPreconditionError(fl::StrCat("Slurm's ", tool, " does not work here (", r->exit.Describe(),
                                                      ": ", Trim(r->err), "); ", conf_text,
                                                      ": point it at the cluster's slurm.conf"));
    }
  }
  absl::StatusOr<fl::sys::CommandOutput> r = fl::sys::Capture(Command({"sinfo", "-h", "-o", "%P"}));
  if (!r.ok() || !r->exit.success()) {
    return absl::FailedPreconditionError(fl::StrCat(
        "the Slurm controller does not answer (sinfo: ", r.ok() ? Trim(r->err) : fl::ToStd(r.status().message()), "); ",
        conf_text, ": check that slurmctld runs there, or start a local one (tools/local-slurm.sh start)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<PartitionInfo>> Partitions() {
  // One line per partition and node configuration: name (with * for the default), nodes, CPUs per node.
  absl::StatusOr<std::string> out = fl::sys::RunCommand({"sinfo", "-h", "-o", "%P %D %c"});
  if (!out.ok()) return out.status();
  std::vector<PartitionInfo> parts;
  std::istringstream in(*out);
  for (std::string name, nodes, cpus; in >> name >> nodes >> cpus;) {
    PartitionInfo p;
    p.is_default = name.ends_with('*');
    if (p.is_default) name.pop_back();
    p.name = name;
    cpus.erase(std::remove(cpus.begin(), cpus.end(), '+'), cpus.end());
    if (!absl::SimpleAtoi(nodes, &p.nodes) || !absl::SimpleAtoi(cpus, &p.cpus_per_node)) continue;
    auto same = std::find_if(parts.begin(), parts.end(), [&](const PartitionInfo& q) { return q.name == p.name; });
    if (same == parts.end()) {
      parts.push_back(p);
    } else {
      same->nodes += p.nodes;
      same->cpus_per_node = std::min(same->cpus_per_node, p.cpus_per_node);
    }
  }
  return parts;
}

absl::Status CheckJobFits(const BatchJob& job, const std::vector<PartitionInfo>& partitions) {
  auto part = std::find_if(partitions.begin(), partitions.end(), [&](const PartitionInfo& p) {
    return job.partition.empty() ? p.is_default : p.name == job.partition;
  });
  if (part == partitions.end()) {
    std::string names;
    for (const PartitionInfo& p : partitions)
      names += (names.empty() ? "" : ", ") + p.name + (p.is_default ? " (default)" : "");
    return absl::InvalidArgumentError(
        job.partition.empty()
            ? fl::StrCat("the cluster has no default partition; set launcher.partition to one of: ", names)
            : fl::StrCat("launcher.partition \"", job.partition, "\" does not exist on this cluster; it has: ", names));
  }
  if (job.nodes > part->nodes) {
    return absl::InvalidArgumentError(fl::StrCat("the job asks for ", job.nodes,
                                                 " nodes (launcher.nodes) but partition ", part->name, " has ",
                                                 part->nodes, "; lower launcher.nodes"));
  }
  for (const Step& s : job.steps) {
    const uint32_t per_node = s.tasks_per_node > 0 ? s.tasks_per_node : part->cpus_per_node;
    if (CeilDiv(s.tasks, per_node) > job.nodes) {
      return absl::InvalidArgumentError(
          fl::StrCat("step ", s.name, " runs ", s.tasks, " processes, at most ", per_node, " per node",
                     s.tasks_per_node > 0 ? " (processes_per_node)"
                                          : fl::StrCat(" (the CPUs of partition ", part->name, "'s nodes)"),
                     ": it needs ", CeilDiv(s.tasks, per_node), " nodes, more than the allocation's ", job.nodes,
                     "; raise launcher.nodes or processes_per_node"));
    }
  }
  const uint64_t cpus = uint64_t{job.nodes} * part->cpus_per_node;
  if (TotalTasks(job) > cpus) {
    return absl::InvalidArgumentError(fl::StrCat("the job runs ", TotalTasks(job),
                                                 " processes (the server and every client process, one CPU each) but ",
                                                 job.nodes, " nodes of partition ", part->name, " hold ", cpus,
                                                 " CPUs; raise launcher.nodes, or use virtual clients"));
  }
  return absl::OkStatus();
}

absl::StatusOr<JobOutcome> SubmitAndWait(const fs::path& script, const std::atomic<bool>* interrupted,
                                         const std::function<void(const std::string&)>& on_submitted) {
  const fs::path id_file = fs::path(script).concat(".sbatch-out");
  const fs::path err_file = fs::path(script).concat(".sbatch-err");
  std::error_code ec;
  fs::remove(id_file, ec);
  fs::remove(err_file, ec);
  const auto t0 = Clock::now();
  absl::StatusOr<fl::sys::Child> sbatch = fl::sys::Child::Spawn([&] {
    fl::sys::SpawnOptions so = Command({"sbatch", "--parsable", "--wait", script.string()});
    so.stdout_to = fl::sys::Stdio::File(id_file.string(), false);
    so.stderr_to = fl::sys::Stdio::File(err_file.string(), false);
    return so;
  }());
  if (!sbatch.ok()) return sbatch.status();
  JobOutcome r;
  bool cancel_sent = false;
  while (true) {
    if (std::optional<fl::sys::ExitStatus> e = sbatch->Poll(); e.has_value()) {
      r.total_s = std::chrono::duration<double>(Clock::now() - t0).count();
      r.exit_code = e->code;
      break;
    }
    if (r.job_id.empty()) {
      std::ifstream in(id_file);
      std::string line;
      if (std::getline(in, line) && !line.empty() && in.good()) {
        r.job_id = line.substr(0, line.find(';'));  // "<id>[;<cluster>]"
        r.submit_s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (on_submitted) on_submitted(r.job_id);
      }
    }
    if (!cancel_sent && !r.job_id.empty() && interrupted != nullptr && interrupted->load()) {
      cancel_sent = true;
      r.cancelled = true;
      if (absl::Status s = Cancel(r.job_id); !s.ok()) spdlog::warn("{}", fl::ToStd(s.message()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (r.job_id.empty()) {
    std::ifstream in(err_file);
    std::stringstream err;
    err << in.rdbuf();
    return absl::FailedPreconditionError(fl::StrCat("sbatch refused the job (exit ", r.exit_code,
                                                    "): ", Trim(err.str()), " (script ", script.string(), ")"));
  }
  return r;
}

absl::Status Cancel(const std::string& job_id) {
  absl::StatusOr<std::string> out = fl::sys::RunCommand({"scancel", job_id});
  return out.ok() ? absl::OkStatus() : out.status();
}

absl::StatusOr<StepRank> StepRankFromEnv() {
  StepRank r;
  const std::optional<std::string> procid = Env("SLURM_PROCID");
  if (!procid.has_value()) {
    return absl::InvalidArgumentError(
        "SLURM_PROCID is not set: a step agent runs as a task of a Slurm job step (srun), from the batch script "
        "that fl-experiment render --launcher slurm writes");
  }
  if (!absl::SimpleAtoi(*procid, &r.procid)) {
    return absl::InvalidArgumentError(fl::StrCat("SLURM_PROCID \"", *procid, "\" is not a number"));
  }
  auto number = [](const char* name, uint32_t* out) {
    if (std::optional<std::string> v = Env(name); v.has_value()) (void)absl::SimpleAtoi(*v, out);
  };
  number("SLURM_NTASKS", &r.ntasks);
  number("SLURM_STEP_NUM_TASKS", &r.ntasks);
  number("SLURM_LOCALID", &r.localid);
  number("SLURM_NODEID", &r.nodeid);
  r.node = Env("SLURMD_NODENAME").value_or("");
  return r;
}

absl::StatusOr<std::string> NodeAddress(const std::string& node) {
  if (node.empty()) {
    return absl::FailedPreconditionError("SLURMD_NODENAME is not set: cannot tell which node this step runs on");
  }
  absl::StatusOr<std::string> out = fl::sys::RunCommand({"scontrol", "show", "node", node});
  if (!out.ok()) {
    return absl::FailedPreconditionError(
        fl::StrCat("cannot ask Slurm for node ", node, "'s address: ", fl::ToStd(out.status().message())));
  }
  std::istringstream in(*out);
  for (std::string word; in >> word;) {
    if (word.starts_with("NodeAddr=")) return word.substr(9);
  }
  return absl::FailedPreconditionError(fl::StrCat("scontrol show node ", node, " gives no NodeAddr"));
}

// ---- experiments ----

absl::StatusOr<std::vector<GroupProcesses>> ClientGroupProcesses(const Manifest& m) {
  absl::StatusOr<std::string> backend = ResolveBackend(m);
  if (!backend.ok()) return backend.status();
  // The grouping only (which clients share a process): devices as duty-cycle, which does not change it.
  std::vector<DeviceEmulation> devices(m.clients.size());
  std::vector<GroupProcesses> out;
  uint32_t i = 0;
  for (const ClientProcess& c : PlanClientProcesses(m, *backend, devices)) {
    if (out.empty() || out.back().group != c.group->name)
      out.push_back({.group = c.group->name, .first = i, .count = 0});
    ++out.back().count;
    ++i;
  }
  return out;
}

absl::StatusOr<BatchJob> ExperimentJob(const Manifest& m, const ExperimentJobPaths& p) {
  if (m.emulation.backend == "packet") {
    return absl::InvalidArgumentError(
        fl::StrCat(m.path,
                   ": emulation.backend packet cannot run on Slurm: its clients reach fl-server through TUN devices on "
                   "the server's own machine; use backend userspace or kernel (links shaped on each client's node)"));
  }
  absl::StatusOr<std::vector<GroupProcesses>> groups = ClientGroupProcesses(m);
  if (!groups.ok()) return groups.status();
  BatchJob job;
  job.job_name = fl::StrCat("fl-", m.name);
  job.partition = m.launcher.partition;
  job.time = m.launcher.time;
  job.sbatch_args = m.launcher.sbatch_args;
  job.output = p.out_dir / "slurm-%j.out";
  job.comment =
      fl::StrCat("Experiment ", m.name, " (", m.path,
                 ") on Slurm, written by fl-experiment render --launcher slurm (docs/cluster.md).\n"
                 "Submit with: sbatch --wait <this file>. The output folder must be on a file system every node sees.");
  job.variables = {{"FL_EXPERIMENT", p.fl_experiment.string()},
                   {"MANIFEST", p.manifest.string()},
                   {"OUT", p.out_dir.string()},
                   {"DB", p.db_path},
                   {"ID", p.resume_id.empty() ? fl::StrCat("${FL_EXPERIMENT_ID:-", m.name, "-slurm-${SLURM_JOB_ID}}")
                                              : p.resume_id}};
  std::vector<std::string> common = {"--out", "$OUT", "--db", "$DB", "--experiment-id", "$ID"};
  if (!p.resume_id.empty()) common.push_back("--resume");
  if (!p.bin_dir.empty()) common.insert(common.end(), {"--bin-dir", p.bin_dir.string()});
  if (!p.profiles_dir.empty()) common.insert(common.end(), {"--profiles-dir", p.profiles_dir.string()});
  auto agent = [&](const std::string& part) {
    std::vector<std::string> argv = {"$FL_EXPERIMENT", "step", part, "$MANIFEST"};
    argv.insert(argv.end(), common.begin(), common.end());
    return argv;
  };
  job.prologue.push_back(agent("prepare"));
  job.steps.push_back({.name = "server",
                       .tasks = 1,
                       .nodes = 1,
                       .tasks_per_node = 0,
                       .relative = 0,
                       .argv = agent("server"),
                       .main = true});
  uint32_t nodes_needed = 1;
  for (const GroupProcesses& g : *groups) {
    const ClientGroup& group =
        *std::find_if(m.clients.begin(), m.clients.end(), [&](const ClientGroup& c) { return c.name == g.group; });
    Step s{.name = fl::StrCat("clients-", g.group),
           .tasks = g.count,
           .nodes = 0,
           .tasks_per_node = group.processes_per_node,
           .relative = -1,
           .argv = agent("clients"),
           .main = false};
    s.argv.insert(s.argv.end(), {"--group", g.group});
    if (s.tasks_per_node > 0) {
      s.nodes = CeilDiv(s.tasks, s.tasks_per_node);
      nodes_needed = std::max(nodes_needed, s.nodes);
    }
    job.steps.push_back(std::move(s));
  }
  job.nodes = m.launcher.nodes > 0 ? m.launcher.nodes : nodes_needed;
  // A one-process group (virtual clients, or count 1) goes to a node of its own choosing, round robin after the
  // server's: srun would put every such step on the first node with room, all of them beside the server.
  uint32_t next = 1;
  for (Step& s : job.steps) {
    if (s.main || s.tasks != 1 || s.tasks_per_node > 0) continue;
    s.nodes = 1;
    s.relative = static_cast<int>(next++ % job.nodes);
  }
  for (const Step& s : job.steps) {
    if (s.nodes > job.nodes) {
      return absl::InvalidArgumentError(fl::StrCat(m.path, ": clients group ", s.name.substr(8), " runs ", s.tasks,
                                                   " processes at processes_per_node ", s.tasks_per_node, ": ", s.nodes,
                                                   " nodes, more than launcher.nodes ", job.nodes,
                                                   "; raise launcher.nodes or processes_per_node"));
    }
  }
  return job;
}

absl::StatusOr<std::string> ReachableNodeAddress(const std::string& who) {
  const char* node = std::getenv("SLURMD_NODENAME");
  absl::StatusOr<std::string> address = NodeAddress(node == nullptr ? "" : node);
  if (!address.ok()) return address.status();
  const char* job_nodes = std::getenv("SLURM_JOB_NUM_NODES");
  if (job_nodes != nullptr && std::atoi(job_nodes) > 1 && IsLoopbackHost(*address)) {
    return absl::InvalidArgumentError(fl::StrCat(
        who, " on node ", node, " advertises ", *address, ", a loopback address (its NodeAddr), but the job spans ",
        job_nodes, " nodes whose processes would dial themselves; give ", node,
        " an address they reach (the node's NodeAddr in slurm.conf), or run the job on one node"));
  }
  return address;
}

int RunStep(const std::string& part, const Manifest& m, const std::string& group, RunOptions o) {
  auto fail = [&](std::string_view what) {
    std::fprintf(stderr, "fl-experiment step %s%s%s: %s\n", part.c_str(), group.empty() ? "" : " ", group.c_str(),
                 std::string(what).c_str());
    return 1;
  };
  const fs::path host_file = o.out_dir / "server.host";
  const fs::path port_file = o.out_dir / "server.port";
  std::error_code ec;
  if (part == "prepare") {
    o.part = RunOptions::Part::kPrepare;
    fs::remove(host_file, ec);
    absl::StatusOr<RunResult> r = RunExperiment(m, o);
    if (!r.ok()) return fail(fl::ToStd(r.status().message()));
    return 0;
  }
  absl::StatusOr<StepRank> rank = StepRankFromEnv();
  if (!rank.ok()) return fail(fl::ToStd(rank.status().message()));
  if (part == "server") {
    o.part = RunOptions::Part::kServer;
    // fl-server's address for the client steps on the other nodes: never a loopback one across nodes.
    absl::StatusOr<std::string> addr = ReachableNodeAddress("the server step");
    if (!addr.ok()) return fail(fl::ToStd(addr.status().message()));
    {
      std::ofstream out(host_file);
      out << *addr << "\n";
      if (!out) return fail(fl::StrCat("cannot write ", host_file.string()));
    }
    absl::StatusOr<RunResult> r = RunExperiment(m, o);
    if (!r.ok()) return fail(fl::ToStd(r.status().message()));
    std::printf("experiment %s %s%s%s\n", r->experiment_id.c_str(), r->status.c_str(), r->reason.empty() ? "" : ": ",
                r->reason.c_str());
    return r->status == "finished" ? 0 : 1;
  }
  if (part != "clients") return fail("the part is prepare, server or clients");
  absl::StatusOr<std::vector<GroupProcesses>> groups = ClientGroupProcesses(m);
  if (!groups.ok()) return fail(fl::ToStd(groups.status().message()));
  auto g = std::find_if(groups->begin(), groups->end(), [&](const GroupProcesses& x) { return x.group == group; });
  if (g == groups->end()) return fail(fl::StrCat("the manifest has no client group \"", group, "\""));
  if (rank->procid >= g->count) {
    return fail(fl::StrCat("task ", rank->procid, " of a step for group ", group, " that runs ", g->count,
                           " processes: the step has more tasks than the group has processes"));
  }
  o.part = RunOptions::Part::kClients;
  o.processes = {g->first + rank->procid};
  // The server's step writes where it runs, then fl-server its port; both were removed by the prologue.
  const auto end = Clock::now() + std::chrono::seconds(120);
  std::string host;
  int port = 0;
  while (true) {
    std::ifstream h(host_file), pf(port_file);
    if (h >> host && pf >> port && port > 0) break;
    if (Clock::now() > end) {
      return fail(fl::StrCat("the server step did not write ", host_file.string(), " and ", port_file.string(),
                             " within 120 s (is the output folder shared by every node? see the server step's "
                             "server.log)"));
    }
    if (o.interrupted != nullptr && o.interrupted->load()) return fail("cancelled before the server listened");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  o.server_addr = fl::StrCat(host, ":", port);
  o.quiet = true;
  absl::StatusOr<RunResult> r = RunExperiment(m, o);
  if (!r.ok()) return fail(fl::ToStd(r.status().message()));
  if (r->status != "finished") return fail(fl::StrCat("on node ", rank->node, ": ", r->reason));
  return 0;
}

}  // namespace fl::experiment::slurm
