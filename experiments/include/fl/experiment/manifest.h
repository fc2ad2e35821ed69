// Experiment manifests: one YAML file says everything an experiment needs (docs/manifests.md has every
// field). Loaded and validated once: an unknown key, a wrong type, a missing profile or a negative rate is an
// error naming the file, the line, the field path and what is allowed, and nothing starts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fl/emulation/link_profile.h"
#include "fl/server/engine_config.h"
#include "fl/client/settings.h"
#include "fl/server/settings.h"

namespace fl::experiment {

// The most clients one experiment may have, over all its groups (each group's count too). Every client is a
// session on one fl-server, and on this machine an fl-client process or a virtual client with its own link; the
// largest fleet measured on one fl-server is 10,000 sessions (docs/performance.md, "Fleets"): 100,000 is ten times
// that. Counts are read as 64-bit integers and summed with this bound, so no count can wrap.
inline constexpr uint32_t kMaxManifestClients = 100'000;
inline constexpr char kMaxManifestClientsWhy[] =
    "ten times the largest fleet measured on one fl-server, docs/performance.md \"Fleets\"";
// The largest availability trace (clients[i].availability.trace) a manifest may name: a few lines per client,
// so 16 MiB holds windows for every client of the largest experiment many times over.
inline constexpr uint64_t kMaxAvailabilityTraceBytes = uint64_t{16} << 20;

// A device profile (experiments/profiles/devices/<name>.yaml): how fast it trains relative to a Raspberry
// Pi 4, so that a client emulating it on a faster host is slowed to that speed.
struct DeviceProfile {
  std::string name;
  std::string description;
  std::string device_class;   // recorded with every figure (clients.device_class)
  double relative_speed = 1;  // training throughput relative to a Raspberry Pi 4 (= 1)
  uint32_t cores = 0;         // informative (0 = unknown)
  uint64_t memory_mb = 0;     // informative (0 = unknown)
  std::string reference;      // where relative_speed comes from
  std::string source;         // the file (or "inline in <manifest>")
  bool is_host = false;       // "host": the machine itself, never slowed down

  bool operator==(const DeviceProfile&) const = default;
};

struct ClientGroup {
  std::string name;  // clients are named <name>-<i>
  uint32_t count = 1;
  DeviceProfile device;
  std::string link_name;  // "" = no emulation for this group
  std::optional<emulation::LinkProfile> link;
  std::string link_kind;     // recorded (ethernet, wifi, 5g, other); default from the link profile's name
  double data_share = 1.0;   // fraction of its shard each client of the group trains on, (0, 1]
  double start_delay_s = 0;  // availability: joins this long after the server started
  double leave_after_s = 0;  // availability: stopped (SIGTERM) this long after it started; 0 = stays
  // Availability over time, seeded diurnal model (fl-client --availability; virtual clients only): each client
  // online `online_fraction` of every `period_s`, from a phase drawn from (manifest seed, shard). 0 = always.
  double period_s = 0;
  double online_fraction = 1;
  // Or a trace file (fl-client --availability trace:FILE, docs/testbed.md "Availability"), absolute; "" = none.
  std::string availability_trace;
  // SecAgg+ dropouts on purpose (fl-client --secagg-drop-after-shares): the group's first ceil(F x count) clients
  // leave every secure round after sending their key shares, so that recovery can be measured. In [0, 1).
  double secagg_drop_after_shares = 0;
  // On a cluster (launcher.kind slurm): at most this many of the group's fl-client processes on one node (srun
  // --ntasks-per-node); 0 = as the scheduler packs them. A group of virtual clients is one process.
  uint32_t processes_per_node = 0;
  // Virtual clients: at most this many of the group's clients in one fl-client --instances process, so that a
  // large group becomes several processes (spread over a cluster's nodes, processes_per_node); 0 = one process.
  uint32_t instances_per_process = 0;
  // Whether the group's clients come and go on a schedule (diurnal or trace), which needs virtual clients.
  bool HasSchedule() const { return period_s > 0 || !availability_trace.empty(); }

  bool operator==(const ClientGroup&) const = default;
};

// The fl-server settings of a manifest (its server:, training: and codecs: keys and its seed, each declared once
// in fl/server/settings.h with its manifest path, unit, default and bounds), in fl-server's units: what
// fl-experiment passes to fl-server, setting by setting (runner.cc). Compared setting by setting.
struct RunSettings : server::EngineConfig {
  RunSettings() : server::EngineConfig(server::DefaultEngineConfig()) {}
  bool operator==(const RunSettings& other) const;
};

struct Manifest {
  std::string path;         // the file it was loaded from
  std::string source_yaml;  // its text, stored with the experiment
  std::string name;
  std::string description;

  // Every fl-server setting the manifest gives, on the declared defaults; settings.seed is the experiment's seed
  // (client selection, the clients' data partition, link emulation, availability).
  RunSettings settings;

  // What fl-experiment does with the server beside its settings.
  struct Server {
    std::string metrics_addr;  // fl-server --metrics-addr (Prometheus /metrics); "" = none
    bool operator==(const Server&) const = default;
  } server;

  // fl-client's settings that the manifest's training: keys give, each declared once with its flag, bounds, unit
  // and default (fl/client/settings.h): model, data_dir, data, task, buffers, seq_len, partition, threads. Paths
  // (a .pt model, data) are made absolute at load, so that a replay finds the same files. Its link_kind and
  // data_fraction are unused here: each group gives them (clients[].link_kind, .data_share; ClientSettingsFor).
  // (The clients' training settings that fl-server sends with every task are in `settings`.)
  using Training = client::ClientSettings;
  Training training;

  struct Emulation {
    std::string backend = "auto";  // none, userspace, kernel, packet, auto (kernel when root and available)
    // Packet backend: the clients' TCP congestion control inside their namespaces ("default": the kernel's).
    std::string tcp_congestion = "default";
    double host_relative_speed = 4.0;  // this machine's training speed relative to a Raspberry Pi 4
    // A group with count > 1 runs as one fl-client --instances <count> (virtual clients: one process, each client
    // its own session and link); false: one fl-client process per client. The kernel backend always runs one
    // process per client (a process lives in one network namespace).
    bool virtual_clients = true;
    // How a slowed device (SlowdownFor > 1) is emulated (docs/manifests.md "Device emulation"): duty-cycle
    // (fl-client --slowdown: training idles between batches), cpu-quota (the whole client process in a cgroup
    // cpu quota, fl/sys/cpu_quota.h: training and the transfer's CPU work alike; process-per-client clients
    // only, virtual clients keep the duty cycle), auto (cpu-quota where the machine supports it, else
    // duty-cycle). Recorded before this setting existed: duty-cycle, what those runs did.
    std::string devices = "auto";
    bool operator==(const Emulation&) const = default;
  } emulation;

  // The federation's transport security (docs/manifests.md "security"): mutual TLS unless asked otherwise.
  struct Security {
    std::string mode = "mtls";  // mtls | insecure (fl-server/fl-client --insecure: plaintext gRPC)
    // An existing fl-provision directory to take the certificates from (its server/server.crt must name
    // 127.0.0.1, where fl-experiment's server listens, and clients/<name>.crt must exist for every client);
    // "" = a throwaway CA made for each run in <out>/pki. Made absolute at load.
    std::string pki_dir;
    bool operator==(const Security&) const = default;
  } security;

  // Where the experiment runs (docs/manifests.md "launcher", docs/cluster.md): this machine (local), a Slurm
  // allocation (fl-experiment run/render --launcher slurm), or Kubernetes objects (render --launcher kubernetes).
  // fl-experiment's --launcher overrides kind. How it runs, not what: a replay runs locally whatever it says.
  struct Launcher {
    std::string kind = "local";  // local | slurm | kubernetes
    // Slurm (sbatch): the partition ("" = the cluster's default), the time limit in one of Slurm's forms
    // (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; "" = the partition's default), how many nodes (0 =
    // as many as the processes need at their groups' processes_per_node, at least 1), and further sbatch options
    // written as #SBATCH lines (each one option starting with '-', e.g. "--account=proj", "--qos=short").
    std::string partition;
    std::string time;
    uint32_t nodes = 0;
    std::vector<std::string> sbatch_args;
    // Kubernetes (rendered objects): the container image, the namespace, the server's volume size.
    std::string image;  // default fl-testbed:<version>
    std::string k8s_namespace = "default";
    std::string storage = "1Gi";
    bool operator==(const Launcher&) const = default;
  } launcher;

  std::vector<ClientGroup> clients;

  // The clients of every group (at most kMaxManifestClients in a loaded manifest).
  uint64_t num_clients() const;
  // Every client's name, <group name>-<i>, in the order clients are indexed.
  std::vector<std::string> client_names() const;
  // Field by field (the resolved-JSON round trip is tested with it).
  bool operator==(const Manifest&) const = default;
};

// The fl-client settings of a client of group `g`: the manifest's training: keys, with the group's link_kind and
// data_share. fl-experiment starts that client with exactly these (client::ClientSettingArgs, runner.cc).
client::ClientSettings ClientSettingsFor(const Manifest& m, const ClientGroup& g);

struct ManifestOptions {
  // Where named profiles live: <profiles_dir>/links/<name>.yaml, <profiles_dir>/devices/<name>.yaml.
  // Default: the "profiles" folder beside the manifest's folder chain (experiments/profiles).
  std::filesystem::path profiles_dir;
};

absl::StatusOr<Manifest> LoadManifest(const std::filesystem::path& path, const ManifestOptions& options = {});
// Parses manifest text; `file` is the name shown in errors, `base_dir` where relative paths resolve.
absl::StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& file,
                                       const std::filesystem::path& base_dir, const ManifestOptions& options = {});

absl::StatusOr<DeviceProfile> LoadDeviceProfile(const std::filesystem::path& path);

// A run's output folder: <out_root>/<name><suffix> (out/<name>, out/<name>-replay). `name` must be a safe name
// (fl/config/safe_name.h) and the folder, made absolute and normal, must lie inside out_root: a name from a
// manifest or from a recorded experiment cannot send logs, checkpoints or a throwaway CA elsewhere. An
// InvalidArgument names the name and what a name may hold.
absl::StatusOr<std::filesystem::path> ExperimentOutputDir(const std::filesystem::path& out_root,
                                                          const std::string& name, const std::string& suffix = "");

// The manifest with every profile resolved, as JSON (stored with the experiment; replay reads it back).
std::string ResolvedManifestJson(const Manifest& manifest);

// The inverse of ResolvedManifestJson: a recorded experiment's manifest, with the profiles it ran with (not
// whatever the profile files say today). `source_yaml` is the recorded manifest text. Both come from the
// manifest's field tables (manifest.cc), so every field written is read back; fields added after a record was
// written keep their defaults when it is read.
absl::StatusOr<Manifest> ManifestFromResolvedJson(const std::string& json, const std::string& source_yaml);

// What a run with `security.pki_dir` needs from that directory (fl-provision's layout): the CA certificate and its
// revocation list (ca/crl.pem, fl-server --tls-crl), the server's certificate and key (server/server.crt, .key)
// and every client's (clients/<name>.crt, .key). OK when they are all there; otherwise a FailedPrecondition
// naming the first missing file and how to make it.
absl::Status CheckPkiDir(const std::string& pki_dir, const std::vector<std::string>& client_names);

// How much slower than the host a client of `device` trains: host_relative_speed / relative_speed, at least 1
// (a device faster than the host cannot be emulated; the caller warns).
double SlowdownFor(const Manifest& manifest, const DeviceProfile& device);

}  // namespace fl::experiment
