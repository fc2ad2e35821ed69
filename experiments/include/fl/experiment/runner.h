// fl-experiment run / replay: one experiment on this machine, from its manifest.
//
// Starts fl-server, one link emulator per emulated client (userspace shaping relay, or a network namespace
// with kernel shaping when root), and every fl-client (slowed to its device profile), waits for the server to
// finish, and stops everything on every path (a client or the server crashing, Ctrl-C, a failure here).
// The federation runs mutual TLS unless the manifest says `security: {mode: insecure}`: with certificates from
// `security.pki_dir`, or from a throwaway CA made for the run in <out_dir>/pki (fl::pki).
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fl/experiment/manifest.h"

namespace fl::experiment {

struct RunOptions {
  std::string db_path;               // records database (created if missing)
  std::filesystem::path out_dir;     // logs and checkpoints of this run
  std::filesystem::path server_bin;  // fl-server
  std::filesystem::path client_bin;  // fl-client
  std::string experiment_id;         // "" = generated
  std::string replay_of;             // experiment id this run replays, recorded with the manifest
  std::string software_version;
  const std::atomic<bool>* interrupted = nullptr;  // set by the SIGINT/SIGTERM handler
  bool quiet = false;                              // no progress lines
  // Called from the wait loop (about every 100 ms while fl-server runs) with the experiment's id: fl-experiment
  // prints its progress lines from the records database there (fl/report/progress.h).
  std::function<void(const std::string& experiment_id)> on_tick;
  // No records database and no checkpoints: only for measuring what instrumentation costs
  // (bench/instrumentation_overhead.sh). The outcome then comes from fl-server's exit status alone.
  bool no_records = false;
  // Which part of the run this process does (default: all of it). A launcher that runs the server and the client
  // groups as separate steps on other nodes (slurm_launcher.h) runs each part where it belongs, with this code,
  // so that links, devices, names, shards and flags are those of a local run:
  //   kPrepare  the checks, the output folder, the run's CA (<out_dir>/pki) and the manifest record; returns
  //             with status "prepared" (once per run, before the others start)
  //   kServer   fl-server only, listening on every address of this node (the CA and the record exist);
  //             waits for it like a whole run and reads the outcome from the records
  //   kClients  the client processes `processes` (indices into PlanClientProcesses' order) with their links and
  //             devices, dialling `server_addr`; ends when they have all exited: status "finished", or "failed"
  //             naming the client that failed
  enum class Part { kAll, kPrepare, kServer, kClients };
  Part part = Part::kAll;
  std::string server_addr;          // kClients: host:port of fl-server
  std::vector<uint32_t> processes;  // kClients
  // Continue experiment `experiment_id` (ExperimentToResume) after its last committed round instead of starting
  // one: fl-server --resume with the same records database and <out_dir>/checkpoints, the run's CA as it was in
  // <out_dir>/pki, no new manifest record; the clients start afresh (a node or step that failed mid-run,
  // docs/cluster.md). Errors, before anything starts, for an experiment that is not in the records or finished.
  bool resume = false;
};

// How a client process emulates its device (docs/manifests.md "Device emulation", issue 30 item 3).
struct DeviceEmulation {
  std::string process;  // RunResult: the fl-client process (a client, or <group>-instances); "" in a plan
  std::string mode;     // "host" (no slowdown), "duty-cycle" (fl-client --slowdown), "cpu-quota" (a cgroup quota)
  double slowdown = 1;  // the device's factor, SlowdownFor
  double cores = 0;     // cpu-quota: the process's quota in cores (DeviceQuotaCores)
  std::string why;      // duty-cycle where emulation.devices is auto or cpu-quota: why not a quota
  std::string cgroup;   // RunResult, cpu-quota: the group the process ran in (removed when the run ended)
};

struct RunResult {
  std::string experiment_id;
  std::string status;  // "finished", "failed", "aborted"
  std::string reason;
  std::string backend;   // the link emulation used: none, userspace, kernel
  std::string security;  // the federation's transport: "mtls" or "insecure" (plaintext)
  std::string pki_dir;   // with mtls: the certificates' directory (the run's throwaway CA, or security.pki_dir)
  // Each started fl-client process's device emulation (also logged at start). Not in the records database: the
  // manifest record has no column for it (a schema change), and the recorded manifest gives emulation.devices.
  std::vector<DeviceEmulation> devices;
};

// The backend `manifest` gets here: "auto" resolves to kernel when root and `ip`/`tc` work, else userspace;
// "none" when no client group has a link profile. An error when "kernel" is asked for without root.
absl::StatusOr<std::string> ResolveBackend(const Manifest& manifest);

// The cpu quota of one client process of group `g` (its own process, slowdown s = SlowdownFor > 1):
// min(training threads, this machine's cores) / s, training.threads 0 counting as every core. Why: the device
// factor s is a throughput ratio measured with the same manifest, so the same threads, on both machines
// (host_relative_speed's calibration); those threads keep at most min(threads, cores) of this machine's cores
// busy, and a quota of 1/s of that lets every CPU-bound thing the process does, training and the transfer's
// TLS, checksums and serialisation alike, run at 1/s of this machine's speed. A Pi 4's 4 cores are in the
// factor, not in the quota: with threads <= 4 the Pi also runs one thread per core, each 1/s as fast as here
// (with threads > 4 a Pi would oversubscribe its cores and the emulation is optimistic for it).
double DeviceQuotaCores(const Manifest& manifest, const ClientGroup& g);

// How each client group's devices are emulated on this machine with link backend `backend` (ResolveBackend's),
// one per group in manifest order, from emulation.devices: duty-cycle; cpu-quota for groups whose clients run as
// their own processes (virtual clients keep the duty cycle: a quota would slow the process's clients together);
// auto = cpu-quota where fl::sys::CpuQuotaSupport() passes and the quota is enforceable, else duty-cycle. An
// error, before anything starts, where cpu-quota is asked for and a group would need a quota that this machine
// cannot give (CpuQuotaSupport's message, or a quota under the kernel's minimum, naming the value).
absl::StatusOr<std::vector<DeviceEmulation>> ResolveDevices(const Manifest& manifest, const std::string& backend);

absl::StatusOr<RunResult> RunExperiment(const Manifest& manifest, const RunOptions& options);

// One fl-client process of a run as the runner plans it: one client, or a group's clients as virtual clients
// (fl-client --instances). Shared with the launchers that start the same processes elsewhere (the Kubernetes
// renderer, k8s_render.h), so that names, shards and flags are the local run's.
struct ClientProcess {
  std::string name;  // the client's name, or for virtual clients the process's: <group>-instances
  const ClientGroup* group = nullptr;
  uint32_t index = 0;         // global, 0..N-1: its data shard (virtual clients: the first one's)
  uint32_t group_offset = 0;  // its first client's i in <group>-<i>
  uint32_t instances = 0;     // 0: one client; > 0: fl-client --instances <instances>, named <group>-0..
  bool secagg_drop = false;   // one client (instances == 0) of the group's first ceil(F x count): it drops
  DeviceEmulation device;     // its group's (ResolveDevices): fl-client --slowdown, and a cpu quota or not
};

// Every fl-client process of `manifest` in start order, for link backend `backend` (ResolveBackend's) and each
// group's device emulation `devices` (ResolveDevices', one per group).
std::vector<ClientProcess> PlanClientProcesses(const Manifest& manifest, const std::string& backend,
                                               const std::vector<DeviceEmulation>& devices);

// fl-client's command line for process `c` (argv[0] = `client_bin`): `server_addr` is what it dials (virtual
// clients: one address per instance, comma-separated); `pki_dir` the run's certificates in fl-provision's
// layout ("" = plaintext, --insecure); `via_forwarder`: it dials a forwarder, not the server's own address, and
// checks the server's certificate as `server_name`; it exits with an error after `give_up_after_s` without reaching
// the server (60 s on this machine, where the server is up before any client starts).
std::vector<std::string> ClientProcessArgs(const Manifest& manifest, const ClientProcess& c,
                                           const std::string& client_bin, const std::string& server_addr,
                                           const std::string& pki_dir, bool via_forwarder,
                                           const std::string& server_name = "127.0.0.1", uint32_t give_up_after_s = 60);

// A throwaway CA in `dir` (an earlier one there is removed first) named `ca_name`, with fl-server's certificate
// for `server_dns` and `server_ips` and a certificate per client of `manifest`, in fl-provision's layout. Its key
// stays in `dir`: nothing outside the run trusts it. A local run's (<out>/pki) and the Kubernetes renderer's.
absl::Status MakeThrowawayPki(const Manifest& manifest, const std::filesystem::path& dir, const std::string& ca_name,
                              const std::vector<std::string>& server_dns, const std::vector<std::string>& server_ips);

// fl-server's arguments for the manifest's settings (every setting a manifest can give, declared in
// fl/server/settings.h, in fl-server's units): the part of fl-server's command line that a manifest decides.
std::vector<std::string> ServerSettingArgs(const Manifest& manifest);

// The manifest recorded with `experiment_id` (the latest experiment with a manifest when empty).
struct RecordedManifest {
  std::string experiment_id;
  std::string manifest_path;
  std::string manifest_yaml;
  std::string resolved_json;
  uint64_t seed = 0;
  std::string backend;
  std::string software_version;
};
absl::StatusOr<RecordedManifest> ReadRecordedManifest(const std::string& db_path, const std::string& experiment_id);

// The experiment `fl-experiment run --resume` continues: the newest one named `name` in the records at `db_path`.
// NotFound naming the database and the name when there is none; FailedPrecondition when it finished (nothing to
// resume), naming it.
absl::StatusOr<std::string> ExperimentToResume(const std::string& db_path, const std::string& name);

// How a replay's outcomes compare with the original's: per-round accuracy and loss side by side, and the
// distributions (median, p90, max) of round, train, uplink and downlink time. Text for the terminal.
absl::StatusOr<std::string> CompareExperiments(const std::string& db_path, const std::string& original,
                                               const std::string& replay);

}  // namespace fl::experiment
