#include "fl/experiment/runner.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"

#include "fl/core/clock.h"
#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/emulation/kernel_link.h"
#include "fl/emulation/packet_network.h"
#include "fl/emulation/tun_device.h"
#include "fl/emulation/shaping_relay.h"
#include "fl/instrumentation/experiment_manifests.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/pki/pki.h"
#include "fl/sys/cpu_quota.h"
#include "fl/sys/process_group.h"

namespace fl::experiment {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using fl::sys::ChildExit;
using fl::sys::ProcessGroup;

std::string Fmt(double v) {
  std::ostringstream os;
  os.precision(10);
  os << v;
  return os.str();
}

std::string GenerateId(const std::string& name) {
  std::random_device rd;
  return fl::StrCat(name, "-", UnixMs(), "-", std::to_string(rd() % 0x10000));
}

std::string Tail(const fs::path& log, size_t lines) {
  std::ifstream in(log);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "\n    " + all[i];
  return out;
}

absl::Status WriteManifestRecord(const std::string& db_path, const Manifest& m, const std::string& experiment_id,
                                 const std::string& backend, const RunOptions& o) {
  instrumentation::ExperimentManifestRecord r;
  r.experiment_id = experiment_id;
  r.manifest_path = m.path;
  r.manifest_yaml = m.source_yaml;
  r.resolved_json = ResolvedManifestJson(m);
  r.seed = static_cast<int64_t>(m.settings.seed);
  r.backend = backend;
  r.software_version = o.software_version;
  r.replay_of = o.replay_of;
  r.created_unix_ms = UnixMs();
  return instrumentation::WriteExperimentManifest(db_path, r);
}

// One fl-client process of this run and what the wait loop knows of it.
struct ClientPlan : ClientProcess {
  double start_at_s = 0;
  double leave_at_s = 0;  // 0 = never
  bool started = false;
  bool leaving = false;  // it was told to leave: its exit is expected
};

// Whether group `g` runs as one fl-client --instances process (virtual clients) rather than a process per client.
// Virtual clients need one process to reach every instance's link: the userspace relays (a port each) can, the
// kernel backend's namespaces cannot (a process is in one).
// The packet backend can: a namespace per process with a link per instance, each instance dialling its own.
bool RunsAsVirtualClients(const Manifest& m, const ClientGroup& g, const std::string& backend) {
  return m.emulation.virtual_clients && backend != "kernel" && (g.count > 1 || g.HasSchedule());
}

// How many of a group's `count` clients drop after the shares: ceil(F x count), as fl-client --instances counts
// its dropping instances (client/src/instances.cc), so that both ways of running a group drop the same clients.
uint32_t SecAggDroppingClients(double fraction, uint32_t count) {
  if (!(fraction > 0)) return 0;
  return static_cast<uint32_t>(std::clamp<double>(std::ceil(fraction * count - 1e-9), 0, count));
}

// Where the run's certificates are: empty `dir` = plaintext (security.mode insecure).
struct RunPki {
  pki::Paths paths;
  bool enabled() const { return !paths.dir.empty(); }
};

// The run's PKI: security.pki_dir as it is (checked: a replay may find it gone), or a throwaway CA made for this
// run in <out>/pki with a server certificate for where the server listens and one certificate per client. Its CA
// key stays in the run's folder; nothing outside the run trusts it.
absl::StatusOr<RunPki> PreparePki(const Manifest& m, const RunOptions& o) {
  RunPki r;
  if (m.security.mode == "insecure") return r;
  if (!m.security.pki_dir.empty()) {
    if (absl::Status s = CheckPkiDir(m.security.pki_dir, m.client_names()); !s.ok()) return s;
    r.paths.dir = m.security.pki_dir;
    return r;
  }
  std::error_code ec;
  // Absolute: the clients are started through `ip netns exec` too, and the paths are in their logs.
  const fs::path dir = fs::absolute(o.out_dir / "pki", ec).lexically_normal();
  // The CA exists already: a server or clients step's (the prepare step made it for the whole run, on the folder
  // every node sees), or a resumed run's (its clients keep the certificates the first run gave them).
  const bool step = o.part == RunOptions::Part::kServer || o.part == RunOptions::Part::kClients;
  if (step || o.resume) {
    if (absl::Status s = CheckPkiDir(dir.string(), m.client_names()); !s.ok()) {
      return absl::FailedPreconditionError(fl::StrCat(
          o.resume && !step ? "--resume: " : "", fl::ToStd(s.message()),
          o.resume && !step
              ? " (a resumed run uses the CA its first run made in its output folder: resume with the same --out)"
              : " (the run's CA is made by its prepare step, fl-experiment step prepare, in the output folder that "
                "every node must see)"));
    }
    r.paths.dir = dir.string();
    return r;
  }
  // fl-server listens on 127.0.0.1 (clients on namespace links reach it through a forwarder and check its
  // certificate as 127.0.0.1 too, fl-client --tls-server-name).
  if (absl::Status s = MakeThrowawayPki(m, dir, fl::StrCat("fl-experiment throwaway CA (", m.name, ")"), {"localhost"},
                                        {"127.0.0.1"});
      !s.ok()) {
    return s;
  }
  r.paths.dir = dir.string();
  return r;
}

std::vector<std::string> ServerArgs(const Manifest& m, const RunOptions& o, const std::string& id,
                                    const std::string& listen, const fs::path& port_file, const RunPki& tls) {
  std::vector<std::string> a = {
      o.server_bin.string(), "--listen", listen,        "--port-file", port_file.string(), "--experiment-id", id,
      "--experiment-name",   m.name,     "--log-level", "warn"};
  for (std::string& arg : ServerSettingArgs(m)) a.push_back(std::move(arg));
  if (!o.no_records) a.insert(a.end(), {"--db", o.db_path, "--checkpoint-dir", (o.out_dir / "checkpoints").string()});
  if (o.resume) a.push_back("--resume");
  if (!m.server.metrics_addr.empty()) a.insert(a.end(), {"--metrics-addr", m.server.metrics_addr});
  if (tls.enabled()) {
    a.insert(a.end(), {"--tls-cert", tls.paths.Cert(pki::Kind::kServer, "server"), "--tls-key",
                       tls.paths.Key(pki::Kind::kServer, "server"), "--tls-client-ca", tls.paths.CaCert(),
                       // Revoking a client of a running experiment: fl-provision revoke NAME --dir <out>/pki.
                       "--tls-crl", tls.paths.Crl()});
  } else {
    a.push_back("--insecure");
  }
  return a;
}

absl::StatusOr<int> WaitForPort(const fs::path& port_file, ProcessGroup& procs, const fs::path& log) {
  const auto end = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < end) {
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) return port;
    if (!procs.Running("server")) {
      return absl::FailedPreconditionError(
          fl::StrCat("fl-server exited before it listened; its log (", log.string(), ") ends:", Tail(log, 15)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(
      fl::StrCat("fl-server did not write its port within 30 s; its log (", log.string(), ") ends:", Tail(log, 15)));
}

absl::StatusOr<std::pair<std::string, std::string>> ExperimentStatus(const std::string& db_path,
                                                                     const std::string& id) {
  absl::StatusOr<std::unique_ptr<instrumentation::RecordReader>> reader = instrumentation::RecordReader::Open(db_path);
  if (!reader.ok()) return reader.status();
  absl::StatusOr<instrumentation::ExperimentRecord> e = (*reader)->GetExperiment(id);
  if (absl::IsNotFound(e.status())) {
    return absl::NotFoundError(fl::StrCat("experiment ", id, " was never recorded by fl-server"));
  }
  if (!e.ok()) return e.status();
  return std::make_pair(std::string(instrumentation::ExperimentStatusName(e->status)), e->status_reason);
}

}  // namespace

absl::Status MakeThrowawayPki(const Manifest& m, const fs::path& dir, const std::string& ca_name,
                              const std::vector<std::string>& server_dns, const std::vector<std::string>& server_ips) {
  std::error_code ec;
  fs::remove_all(dir, ec);  // an earlier run's, into the same folder: a fresh CA each time
  if (ec) {
    return absl::FailedPreconditionError(fl::StrCat("cannot remove the earlier ", dir.string(), ": ", ec.message()));
  }
  pki::CaOptions ca;
  ca.common_name = pki::FitCommonName(ca_name);  // the name carries the manifest's, of any length
  if (absl::Status s = pki::CreateCa(dir.string(), ca); !s.ok()) return s;
  pki::IssueOptions server;
  server.dns_names = server_dns;
  server.ip_addresses = server_ips;
  if (absl::StatusOr<pki::Issued> s = pki::Issue(dir.string(), pki::Kind::kServer, "server", server); !s.ok()) {
    return s.status();
  }
  for (const std::string& name : m.client_names()) {
    absl::StatusOr<pki::Issued> c = pki::Issue(dir.string(), pki::Kind::kClient, name, {});
    if (!c.ok()) return absl::Status(c.status().code(), fl::StrCat("client ", name, ": ", c.status().message()));
  }
  return absl::OkStatus();
}

std::vector<std::string> ServerSettingArgs(const Manifest& m) {
  // Every setting a manifest can give, from the one table (fl/server/settings.h), in fl-server's units: fl-server
  // runs with exactly the manifest's settings (their defaults included), whatever its own defaults.
  return server::SettingArgs(m.settings, [](const server::Setting& s) { return !s.manifest.empty(); });
}

std::vector<std::string> ClientProcessArgs(const Manifest& m, const ClientProcess& c, const std::string& client_bin,
                                           const std::string& server_addr, const std::string& pki_dir,
                                           bool via_forwarder, const std::string& server_name,
                                           uint32_t give_up_after_s) {
  const ClientGroup& g = *c.group;
  const pki::Paths paths{.dir = pki_dir};
  // Under a cpu quota the kernel slows the whole process: no duty cycle on top.
  const double slowdown = c.device.mode == "duty-cycle" ? c.device.slowdown : 1.0;
  std::vector<std::string> a = {client_bin,
                                "--server",
                                server_addr,
                                "--name",
                                c.instances > 0 ? g.name : c.name,
                                "--client-index",
                                std::to_string(c.index),
                                "--num-clients",
                                std::to_string(m.num_clients()),
                                "--partition-seed",
                                std::to_string(m.settings.seed),
                                "--init-seed",
                                std::to_string(m.settings.seed),
                                "--device",
                                "cpu",
                                "--slowdown",
                                Fmt(slowdown),
                                "--give-up-after-s",
                                std::to_string(give_up_after_s),
                                "--log-level",
                                "warn"};
  // Every setting of fl-client's table (fl/client/settings.h) as the manifest gives it, its defaults included.
  for (std::string& arg : client::ClientSettingArgs(ClientSettingsFor(m, g))) a.push_back(std::move(arg));
  if (!g.link_name.empty()) a.insert(a.end(), {"--link-profile", g.link_name});
  if (!g.device.device_class.empty()) a.insert(a.end(), {"--device-class", g.device.device_class});
  if (c.instances > 0) a.insert(a.end(), {"--instances", std::to_string(c.instances)});
  if (c.instances > 0 && c.group_offset > 0) a.insert(a.end(), {"--instance-offset", std::to_string(c.group_offset)});
  if (c.instances > 0 && g.secagg_drop_after_shares > 0) {
    a.insert(a.end(), {"--secagg-drop-after-shares", Fmt(g.secagg_drop_after_shares)});
  } else if (c.secagg_drop) {
    a.insert(a.end(), {"--secagg-drop-after-shares", "1"});  // one client: any fraction above 0 drops it
  }
  if (c.instances > 0 && g.period_s > 0) {
    a.insert(a.end(), {"--availability", fl::StrCat("diurnal:period_s=", Fmt(g.period_s),
                                                    ",online=", Fmt(g.online_fraction), ",seed=", m.settings.seed)});
  }
  if (c.instances > 0 && !g.availability_trace.empty()) {
    a.insert(a.end(), {"--availability", fl::StrCat("trace:", g.availability_trace)});
  }
  if (!pki_dir.empty() && c.instances > 0) {
    // Each instance presents its own certificate, <group>-<i>.crt from the run's clients/ folder.
    a.insert(a.end(), {"--tls-ca", paths.CaCert(), "--tls-cert-dir",
                       fs::path(paths.Cert(pki::Kind::kClient, g.name)).parent_path().string()});
    if (via_forwarder) a.insert(a.end(), {"--tls-server-name", server_name});
  } else if (!pki_dir.empty()) {
    a.insert(a.end(), {"--tls-ca", paths.CaCert(), "--tls-cert", paths.Cert(pki::Kind::kClient, c.name), "--tls-key",
                       paths.Key(pki::Kind::kClient, c.name)});
    // The server's certificate names 127.0.0.1, where it listens, not the forwarder's 10.213.x.1.
    if (via_forwarder) a.insert(a.end(), {"--tls-server-name", server_name});
  } else {
    a.push_back("--insecure");
  }
  return a;
}

std::vector<ClientProcess> PlanClientProcesses(const Manifest& m, const std::string& backend,
                                               const std::vector<DeviceEmulation>& devices) {
  std::vector<ClientProcess> out;
  uint32_t index = 0;
  for (const ClientGroup& g : m.clients) {
    const DeviceEmulation& device = devices[&g - m.clients.data()];
    if (RunsAsVirtualClients(m, g, backend)) {
      // instances_per_process splits the group: process k runs clients k*n .. k*n+n-1 (fl-client
      // --instance-offset), shards from their own global index; one process keeps the name <group>-instances.
      const uint32_t per = g.instances_per_process == 0 ? g.count : std::min(g.instances_per_process, g.count);
      const bool split = per < g.count;
      for (uint32_t first = 0; first < g.count; first += per) {
        out.push_back(
            {.name = split ? fl::StrCat(g.name, "-instances-", first / per) : fl::StrCat(g.name, "-instances"),
             .group = &g,
             .index = index + first,
             .group_offset = first,
             .instances = std::min(per, g.count - first),
             .secagg_drop = false,
             .device = device});
      }
      index += g.count;
      continue;
    }
    for (uint32_t i = 0; i < g.count; ++i) {
      out.push_back({.name = fl::StrCat(g.name, "-", i),
                     .group = &g,
                     .index = index++,
                     .group_offset = i,
                     .instances = 0,
                     .secagg_drop = i < SecAggDroppingClients(g.secagg_drop_after_shares, g.count),
                     .device = device});
    }
  }
  return out;
}

absl::StatusOr<std::string> ResolveBackend(const Manifest& m) {
  bool any_link = false;
  for (const auto& g : m.clients) any_link |= g.link.has_value();
  if (!any_link || m.emulation.backend == "none") return std::string("none");
  const bool root = geteuid() == 0;
  if (m.emulation.backend == "kernel") {
    if (!root) {
      return absl::PermissionDeniedError(
          fl::StrCat(m.path,
                     ": emulation.backend is kernel, which needs root (network namespaces, tc); run as root or use "
                     "backend: userspace"));
    }
    return std::string("kernel");
  }
  if (m.emulation.backend == "userspace") return std::string("userspace");
  if (m.emulation.backend == "packet") {
    if (absl::Status s = emulation::PacketBackendSupport(); !s.ok()) {
      return absl::Status(s.code(), fl::StrCat(m.path, ": emulation.backend is packet, which this machine cannot run: ",
                                               fl::ToStd(s.message()), "; or use backend: userspace"));
    }
    if (m.emulation.tcp_congestion != "default") {
      if (absl::Status s = emulation::CheckNamespaceCongestionControl(m.emulation.tcp_congestion); !s.ok()) {
        return absl::Status(s.code(), fl::StrCat(m.path, ": emulation.tcp_congestion: ", fl::ToStd(s.message())));
      }
    }
    return std::string("packet");
  }
  // auto: the kernel backend where it can work, which we find out by asking `ip` for the namespaces.
  if (root && fl::sys::RunCommand({"ip", "netns", "list"}).ok() && fl::sys::RunCommand({"tc", "-V"}).ok()) {
    return std::string("kernel");
  }
  return std::string("userspace");
}

namespace {

// Cpu quota groups that an earlier fl-experiment left behind when it was killed (SIGKILL, a crash):
// <root>/fl-testbed/<name>-<pid>-<n> whose creator <pid> is gone and which hold no process any more (an orphaned
// client gives up after --give-up-after-s; its group goes on a later run). Returns how many were removed.
int RemoveStaleCpuQuotas() {
  absl::StatusOr<fl::sys::CpuController> c = fl::sys::FindCpuController();
  if (!c.ok()) return 0;
  std::error_code ec;
  int removed = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(fs::path(c->root) / "fl-testbed", ec)) {
    const std::string name = e.path().filename().string();
    const size_t last = name.rfind('-');
    const size_t before = last == std::string::npos || last == 0 ? std::string::npos : name.rfind('-', last - 1);
    if (before == std::string::npos) continue;
    const std::string pid = name.substr(before + 1, last - before - 1);
    if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno == EPERM) continue;  // its owner lives
    std::ifstream procs(e.path() / "cgroup.procs");
    std::string any;
    if (!procs || procs >> any) continue;  // unreadable, or a process still in it
    if (::rmdir(e.path().c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace

double DeviceQuotaCores(const Manifest& m, const ClientGroup& g) {
  const double machine = std::max(1u, std::thread::hardware_concurrency());
  const uint32_t threads = ClientSettingsFor(m, g).threads;
  const double busy = threads == 0 ? machine : std::min<double>(threads, machine);
  return busy / SlowdownFor(m, g.device);
}

absl::StatusOr<std::vector<DeviceEmulation>> ResolveDevices(const Manifest& m, const std::string& backend) {
  const std::string& asked = m.emulation.devices;
  std::optional<absl::Status> support;  // CpuQuotaSupport(), asked once and only where a quota is wanted
  std::vector<DeviceEmulation> out;
  for (const ClientGroup& g : m.clients) {
    DeviceEmulation d;
    d.slowdown = SlowdownFor(m, g.device);
    d.mode = d.slowdown > 1 ? "duty-cycle" : "host";
    if (d.slowdown > 1 && asked != "duty-cycle") {
      if (RunsAsVirtualClients(m, g, backend)) {
        d.why = "virtual clients (fl-client --instances): a quota would slow the process's clients together";
      } else {
        if (!support.has_value()) support = fl::sys::CpuQuotaSupport().status();
        const double cores = DeviceQuotaCores(m, g);
        absl::Status s = *support;
        if (s.ok()) s = fl::sys::ValidateCores(cores);
        if (s.ok()) {
          d.mode = "cpu-quota";
          d.cores = cores;
        } else if (asked == "cpu-quota") {
          return absl::Status(
              s.code(), fl::StrCat(m.path, ": emulation.devices is cpu-quota, but clients group ", g.name, " (device ",
                                   g.device.name, ", slowdown ", Fmt(d.slowdown), ") cannot have its quota of ",
                                   Fmt(cores), " cores: ", fl::ToStd(s.message()), "; or use devices: duty-cycle"));
        } else {
          d.why = fl::ToStd(s.message());
        }
      }
    }
    out.push_back(std::move(d));
  }
  return out;
}

absl::StatusOr<RunResult> RunExperiment(const Manifest& m, const RunOptions& o) {
  absl::StatusOr<std::string> backend = ResolveBackend(m);
  if (!backend.ok()) return backend.status();
  // Before anything starts: how each group's devices are slowed (a refusal names what the machine lacks).
  absl::StatusOr<std::vector<DeviceEmulation>> devices = ResolveDevices(m, *backend);
  if (!devices.ok()) return devices.status();
  // Before anything starts: a diurnal schedule is fl-client --instances's, so it needs virtual clients.
  for (const ClientGroup& g : m.clients) {
    const std::string field = g.period_s > 0 ? "period_s" : "trace";
    if (g.HasSchedule() && !(m.emulation.virtual_clients && *backend != "kernel")) {
      return absl::FailedPreconditionError(
          fl::StrCat(m.path, ": clients group ", g.name, ": availability.", field,
                     " needs virtual clients (fl-client --instances), which this run does not use (",
                     *backend == "kernel" ? "emulation backend kernel" : "emulation.virtual_clients: false",
                     "); use backend userspace or none, or drop availability.", field));
    }
  }
  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return absl::FailedPreconditionError(fl::StrCat("cannot create ", o.out_dir.string(), ": ", ec.message()));
  if (!o.db_path.empty() && fs::path(o.db_path).has_parent_path())
    fs::create_directories(fs::path(o.db_path).parent_path(), ec);

  if (std::any_of(devices->begin(), devices->end(), [](const DeviceEmulation& d) { return d.mode == "cpu-quota"; })) {
    if (const int removed = RemoveStaleCpuQuotas(); removed > 0) {
      spdlog::info("removed {} stale cpu quota groups of earlier runs", removed);
    }
  }
  if (*backend == "kernel" || *backend == "packet") {
    // Namespaces and links that a crashed earlier run left behind (their owner's pid is gone).
    if (absl::StatusOr<int> removed = emulation::CleanupStaleKernelLinks(); removed.ok() && *removed > 0) {
      spdlog::info("removed {} stale link emulations of earlier runs", *removed);
    }
  }
  using Part = RunOptions::Part;
  absl::StatusOr<RunPki> tls = PreparePki(m, o);
  if (!tls.ok()) return tls.status();
  RunResult result;
  result.experiment_id = o.experiment_id.empty() ? GenerateId(m.name) : o.experiment_id;
  result.backend = *backend;
  result.security = tls->enabled() ? "mtls" : "insecure";
  result.pki_dir = tls->paths.dir;
  if (o.resume && (o.no_records || o.experiment_id.empty())) {
    return absl::InvalidArgumentError("--resume needs the records and the experiment's id (ExperimentToResume)");
  }
  if (o.resume && (o.part == Part::kAll || o.part == Part::kPrepare)) {
    // Refused before anything starts: an experiment fl-server never recorded, or one that finished.
    absl::StatusOr<std::pair<std::string, std::string>> st = ExperimentStatus(o.db_path, result.experiment_id);
    if (!st.ok()) return absl::NotFoundError(fl::StrCat("--resume: ", fl::ToStd(st.status().message())));
    if (st->first == "finished") {
      return absl::FailedPreconditionError(
          fl::StrCat("--resume: experiment ", result.experiment_id, " in ", o.db_path, " finished; nothing to resume"));
    }
  }
  // A resumed experiment keeps the manifest record of its first run.
  if (!o.no_records && !o.resume && (o.part == Part::kAll || o.part == Part::kPrepare)) {
    if (absl::Status s = WriteManifestRecord(o.db_path, m, result.experiment_id, *backend, o); !s.ok()) return s;
  }

  ProcessGroup procs;
  const fs::path server_log = o.out_dir / "server.log";
  const fs::path port_file = o.out_dir / "server.port";
  if (o.part != Part::kClients) fs::remove(port_file, ec);
  if (o.part == Part::kPrepare) {
    result.status = "prepared";
    return result;
  }
  // Clients in the kernel backend's namespaces reach the server through a relay on the host, so loopback is
  // enough there. The packet backend's clients reach it over their own TCP at their link's host address
  // (10.214.x.1, a TUN device that exists only once the client's link is made): the server listens on every
  // address, and the clients check its certificate as 127.0.0.1 (fl-client --tls-server-name).
  // A server step (Part::kServer) is dialled from other nodes: every address.
  const std::string listen = *backend == "packet" || o.part == Part::kServer ? "0.0.0.0:0" : "127.0.0.1:0";
  int server_port = 0;
  std::string target;
  if (o.part == Part::kClients) {
    // The server runs elsewhere (its own step): the clients and their links dial its address.
    const size_t colon = o.server_addr.rfind(':');
    if (colon == std::string::npos || !absl::SimpleAtoi(o.server_addr.substr(colon + 1), &server_port)) {
      return absl::InvalidArgumentError(fl::StrCat("server address \"", o.server_addr, "\" is not host:port"));
    }
    target = o.server_addr;
  } else {
    absl::StatusOr<pid_t> server =
        procs.Start("server", ServerArgs(m, o, result.experiment_id, listen, port_file, *tls), server_log.string());
    if (!server.ok()) return server.status();
    absl::StatusOr<int> port = WaitForPort(port_file, procs, server_log);
    if (!port.ok()) return port.status();
    server_port = *port;
    target = fl::StrCat("127.0.0.1:", server_port);
  }
  if (!o.quiet) {
    spdlog::info("experiment {} ({} clients, link emulation: {}); fl-server on {} ({})", result.experiment_id,
                 m.num_clients(), *backend, target,
                 tls->enabled() ? fl::StrCat("mutual TLS, certificates in ", tls->paths.dir)
                                : std::string("plaintext: security.mode insecure"));
  }

  // Plan every client; links are set up as each client starts.
  std::vector<ClientPlan> plans;
  for (const ClientGroup& g : m.clients) {
    const DeviceEmulation& device = (*devices)[&g - m.clients.data()];
    if (!o.quiet && device.mode == "cpu-quota") {
      spdlog::info(
          "clients {}: device {} (slowdown {}): the whole process in a cpu quota of {} cores, fl-client "
          "--slowdown 1",
          g.name, g.device.name, Fmt(device.slowdown), Fmt(device.cores));
    } else if (!o.quiet && device.mode == "duty-cycle") {
      spdlog::info("clients {}: device {} (slowdown {}): duty cycle, training only (fl-client --slowdown {}){}", g.name,
                   g.device.name, Fmt(device.slowdown), Fmt(device.slowdown),
                   device.why.empty() ? std::string() : fl::StrCat("; no cpu quota: ", device.why));
    }
  }
  std::vector<ClientProcess> processes = PlanClientProcesses(m, *backend, *devices);
  if (o.part == Part::kServer) processes.clear();
  if (o.part == Part::kClients) {
    std::vector<ClientProcess> mine;
    for (uint32_t i : o.processes) {
      if (i >= processes.size()) {
        return absl::InvalidArgumentError(
            fl::StrCat("client process ", i, " does not exist: the run has ", processes.size(), " client processes"));
      }
      mine.push_back(processes[i]);
    }
    processes = std::move(mine);
  }
  for (ClientProcess& c : processes) {
    ClientPlan p;
    static_cast<ClientProcess&>(p) = std::move(c);
    p.start_at_s = p.group->start_delay_s;
    p.leave_at_s = p.group->leave_after_s > 0 ? p.group->start_delay_s + p.group->leave_after_s : 0;
    plans.push_back(std::move(p));
  }
  std::vector<std::unique_ptr<emulation::ShapingRelay>> relays;
  std::vector<std::unique_ptr<emulation::KernelLink>> kernel_links;
  struct PacketClient {
    std::string process;
    std::vector<std::string> clients;  // one per link
    std::unique_ptr<emulation::PacketNamespace> ns;
  };
  std::vector<PacketClient> packet_namespaces;
  // One cpu quota per slowed client process; each removes its cgroup when destroyed (the run's end, any path).
  std::vector<std::unique_ptr<fl::sys::CpuQuota>> quotas;

  auto start_client = [&](ClientPlan& p) -> absl::Status {
    std::string addr = target;
    const emulation::KernelLink* netns = nullptr;  // the client runs inside this link's namespace
    const uint64_t seed = m.settings.seed * 100'003 + p.index;
    const emulation::PacketNamespace* packet_ns = nullptr;  // or inside this one
    if (p.group->link.has_value() && *backend == "packet") {
      // A namespace for the process, a link per client in it (one, or one per instance), seeded as the client's.
      absl::StatusOr<std::unique_ptr<emulation::PacketNamespace>> ns = emulation::PacketNamespace::Create(
          {.label = p.name,
           .tcp_congestion = m.emulation.tcp_congestion == "default" ? "" : m.emulation.tcp_congestion,
           .seed = seed});
      if (!ns.ok()) return ns.status();
      PacketClient pc{.process = p.name, .clients = {}, .ns = std::move(*ns)};
      addr.clear();
      for (uint32_t i = 0; i < std::max<uint32_t>(p.instances, 1); ++i) {
        absl::StatusOr<int> link = pc.ns->AddLink(*p.group->link);
        if (!link.ok()) {
          return absl::Status(link.status().code(), fl::StrCat("link ", p.group->link_name, " of client ", p.name, ": ",
                                                               fl::ToStd(link.status().message())));
        }
        addr = fl::StrCat(addr, addr.empty() ? "" : ",", pc.ns->host_ip(*link), ":", server_port);
        pc.clients.push_back(p.instances > 0 ? fl::StrCat(p.group->name, "-", p.group_offset + i) : p.name);
      }
      if (absl::Status s = pc.ns->Start(); !s.ok()) return s;
      packet_ns = pc.ns.get();
      packet_namespaces.push_back(std::move(pc));
    } else if (p.instances > 0 && p.group->link.has_value() && *backend == "userspace") {
      // Virtual clients (userspace backend): a relay per instance, seeded and named as that client's own
      // would be, so that every instance keeps its own link and the same draws as one process per client.
      addr.clear();
      for (uint32_t i = 0; i < p.instances; ++i) {
        absl::StatusOr<std::unique_ptr<emulation::ShapingRelay>> relay =
            emulation::ShapingRelay::Start({.listen_addr = "127.0.0.1:0",
                                            .target_addr = target,
                                            .uplink = p.group->link->uplink,
                                            .downlink = p.group->link->downlink,
                                            .seed = seed + i,
                                            .name = fl::StrCat(p.group->name, "-", p.group_offset + i)});
        if (!relay.ok()) return relay.status();
        addr = fl::StrCat(addr, addr.empty() ? "" : ",", (*relay)->address());
        relays.push_back(std::move(*relay));
      }
    } else if (p.group->link.has_value() && *backend == "userspace") {
      absl::StatusOr<std::unique_ptr<emulation::ShapingRelay>> relay =
          emulation::ShapingRelay::Start({.listen_addr = "127.0.0.1:0",
                                          .target_addr = target,
                                          .uplink = p.group->link->uplink,
                                          .downlink = p.group->link->downlink,
                                          .seed = seed,
                                          .name = p.name});
      if (!relay.ok()) return relay.status();
      addr = (*relay)->address();
      relays.push_back(std::move(*relay));
    } else if (p.group->link.has_value() && *backend == "kernel") {
      absl::StatusOr<std::unique_ptr<emulation::KernelLink>> link =
          emulation::KernelLink::Create({.profile = *p.group->link, .target_addr = target, .seed = seed});
      if (!link.ok()) return link.status();
      addr = (*link)->client_target();
      netns = link->get();
      kernel_links.push_back(std::move(*link));
    }
    // A client step dials the server's node, not the 127.0.0.1 its certificate names: checked as 127.0.0.1.
    std::vector<std::string> argv =
        ClientProcessArgs(m, p, o.client_bin.string(), addr, tls->paths.dir,
                          netns != nullptr || packet_ns != nullptr || o.part == Part::kClients);
    if (netns != nullptr) argv = netns->WrapCommand(argv);
    if (packet_ns != nullptr) argv = packet_ns->WrapCommand(argv);
    absl::StatusOr<pid_t> pid = procs.Start(p.name, argv, (o.out_dir / fl::StrCat(p.name, ".log")).string());
    if (!pid.ok()) return pid.status();
    p.started = true;
    DeviceEmulation applied = p.device;
    applied.process = p.name;
    if (p.device.mode == "cpu-quota") {
      // `ip netns exec` execs the client: the pid is fl-client's. It ran unthrottled until here (its start-up).
      absl::StatusOr<std::unique_ptr<fl::sys::CpuQuota>> q = fl::sys::CpuQuota::Create(p.name, p.device.cores);
      if (!q.ok()) return q.status();
      if (absl::Status s = (*q)->AddProcess(*pid); !s.ok()) return s;
      applied.cgroup = (*q)->path();
      quotas.push_back(std::move(*q));
    }
    result.devices.push_back(std::move(applied));
    return absl::OkStatus();
  };

  const auto t0 = Clock::now();
  auto elapsed_s = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  std::string failure;
  bool aborted = false;
  bool server_exited = false;
  int server_code = 0;
  while (!server_exited) {
    if (o.interrupted != nullptr && o.interrupted->load()) {
      aborted = true;
      break;
    }
    for (ClientPlan& p : plans) {
      if (!p.started && elapsed_s() >= p.start_at_s) {
        if (absl::Status s = start_client(p); !s.ok()) {
          failure = fl::StrCat("cannot start client ", p.name, ": ", fl::ToStd(s.message()));
          break;
        }
      }
      if (p.started && !p.leaving && p.leave_at_s > 0 && elapsed_s() >= p.leave_at_s) {
        p.leaving = true;
        procs.Signal(p.name, SIGTERM);
        if (!o.quiet) spdlog::info("client {} leaves (availability)", p.name);
      }
    }
    if (!failure.empty()) break;
    if (o.on_tick) o.on_tick(result.experiment_id);
    std::optional<ChildExit> e = procs.WaitAny(std::chrono::milliseconds(100));
    if (!e.has_value()) {
      // A client step ends when its clients have all exited (each exit was reported above, failures first).
      if (o.part == Part::kClients && procs.num_running() == 0 &&
          std::all_of(plans.begin(), plans.end(), [](const ClientPlan& p) { return p.started; })) {
        server_exited = true;
        break;
      }
      continue;
    }
    if (e->name == "server") {
      server_exited = true;
      server_code = e->code;
      break;
    }
    const auto plan = std::find_if(plans.begin(), plans.end(), [&](const ClientPlan& p) { return p.name == e->name; });
    if (e->code != 0 && plan != plans.end() && !plan->leaving) {
      const fs::path log = o.out_dir / fl::StrCat(e->name, ".log");
      const std::string who = plan->instances > 0
                                  ? fl::StrCat("clients ", plan->group->name, "-", plan->group_offset, "..",
                                               plan->group_offset + plan->instances - 1, " (fl-client --instances ",
                                               plan->instances, ", ", e->name, ")")
                                  : fl::StrCat("client ", e->name);
      // Virtual clients: the log's end names the instances that failed.
      failure = fl::StrCat(who, " failed (exit ", e->code, "); its log (", log.string(), ") ends:", Tail(log, 10));
      break;
    }
  }
  if (!server_exited) {
    // Interrupted or a part failed: the server first, so that it records the experiment as aborted.
    for (const ChildExit& e : procs.StopAll("server", std::chrono::seconds(10))) {
      if (e.name == "server") server_code = e.code;
    }
  } else {
    // The server finished and told the clients; give them a moment to exit on their own.
    const auto end = Clock::now() + std::chrono::seconds(10);
    while (procs.num_running() > 0 && Clock::now() < end) (void)procs.WaitAny(std::chrono::milliseconds(200));
    procs.StopAll("", std::chrono::seconds(2));
  }
  relays.clear();
  quotas.clear();
  for (auto& link : kernel_links) {
    if (absl::Status s = link->Destroy(); !s.ok()) spdlog::warn("link emulation cleanup: {}", s.message());
  }
  kernel_links.clear();
  if (!packet_namespaces.empty()) {
    // What each client's packet link did, beside the run's logs (the records hold the phases, not the packets).
    std::ofstream tsv(o.out_dir / "packet-links.tsv");
    tsv << "client\tprocess\tdirection\toffered\tdelivered\tdelivered_bytes\tlost\tlost_burst\tdropped_queue\t"
           "max_queue_bytes\tmax_late_us\tlate_over_1ms\n";
    for (PacketClient& pc : packet_namespaces) {
      for (size_t i = 0; i < pc.clients.size(); ++i) {
        for (const bool up : {true, false}) {
          const emulation::PacketLinkStats st = pc.ns->stats(static_cast<int>(i), up);
          tsv << pc.clients[i] << "\t" << pc.process << "\t" << (up ? "uplink" : "downlink") << "\t" << st.offered
              << "\t" << st.delivered << "\t" << st.delivered_bytes << "\t" << st.lost << "\t" << st.lost_burst << "\t"
              << st.dropped_queue << "\t" << st.max_queue_bytes << "\t" << st.max_late_ns / 1000 << "\t"
              << st.late_over_1ms << "\n";
        }
      }
      if (absl::Status s = pc.ns->Destroy(); !s.ok()) spdlog::warn("link emulation cleanup: {}", s.message());
    }
    packet_namespaces.clear();
  }

  if (o.part == Part::kClients) {
    // The server's step records the experiment's outcome; this step says only whether its clients did their part.
    result.status = !failure.empty() ? "failed" : aborted ? "aborted" : "finished";
    result.reason = !failure.empty() ? failure : aborted ? "interrupted (SIGTERM: the job step was cancelled)" : "";
    return result;
  }
  absl::StatusOr<std::pair<std::string, std::string>> status =
      o.no_records
          ? absl::StatusOr<std::pair<std::string, std::string>>(std::make_pair(
                std::string(server_code == 0 ? "finished" : "failed"), fl::StrCat("fl-server exit ", server_code)))
          : ExperimentStatus(o.db_path, result.experiment_id);
  if (status.ok()) {
    result.status = status->first;
    result.reason = status->second;
  } else {
    result.status = "failed";
    result.reason = fl::StrCat("fl-server exited with ", server_code, " and left no experiment record; its log (",
                               server_log.string(), ") ends:", Tail(server_log, 15));
  }
  if (!failure.empty()) {
    result.status = "failed";
    result.reason = failure;
  } else if (aborted) {
    result.status = "aborted";
    result.reason = "interrupted (Ctrl-C or SIGTERM)";
  } else if (server_code != 0 && result.status == "finished") {
    result.status = "failed";
    result.reason = fl::StrCat("fl-server exited with ", server_code);
  }
  return result;
}

absl::StatusOr<std::string> ExperimentToResume(const std::string& db_path, const std::string& name) {
  std::error_code ec;
  if (!fs::exists(db_path, ec)) {
    return absl::NotFoundError(
        fl::StrCat("--resume: no records database at ", db_path, " (resume with the first run's --out, or its --db)"));
  }
  absl::StatusOr<std::unique_ptr<instrumentation::RecordReader>> reader = instrumentation::RecordReader::Open(db_path);
  if (!reader.ok()) return reader.status();
  absl::StatusOr<std::vector<instrumentation::ExperimentRecord>> all = (*reader)->ListExperiments();
  if (!all.ok()) return all.status();
  for (auto it = all->rbegin(); it != all->rend(); ++it) {
    if (it->name != name) continue;
    if (it->status == instrumentation::ExperimentStatus::kFinished) {
      return absl::FailedPreconditionError(fl::StrCat("--resume: the newest experiment named ", name, " in ", db_path,
                                                      ", ", it->id, ", finished; nothing to resume"));
    }
    return it->id;
  }
  return absl::NotFoundError(fl::StrCat("--resume: no experiment named ", name, " in ", db_path));
}

absl::StatusOr<RecordedManifest> ReadRecordedManifest(const std::string& db_path, const std::string& experiment_id) {
  absl::StatusOr<instrumentation::ExperimentManifestRecord> m =
      instrumentation::ReadExperimentManifest(db_path, experiment_id);
  if (!m.ok()) return m.status();
  RecordedManifest r;
  r.experiment_id = m->experiment_id;
  r.manifest_path = m->manifest_path;
  r.manifest_yaml = m->manifest_yaml;
  r.resolved_json = m->resolved_json;
  r.seed = static_cast<uint64_t>(m->seed);
  r.backend = m->backend;
  r.software_version = m->software_version;
  return r;
}

}  // namespace fl::experiment
