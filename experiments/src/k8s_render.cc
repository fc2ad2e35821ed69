#include "fl/experiment/k8s_render.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fl/core/str_cat.h"
#include "fl/emulation/link_profile.h"
#include "fl/experiment/runner.h"
#include "fl/pki/pki.h"

namespace fl::experiment {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Where things are inside the pods. The image is deploy/Dockerfile's `client` target (fl-server, fl-client and
// fl-link in /usr/local/bin, user fl = uid 999).
constexpr char kBinDir[] = "/usr/local/bin";
constexpr char kPkiDir[] = "/etc/fl/pki";            // fl-provision's layout: ca/, server/, clients/
constexpr char kManifestDir[] = "/etc/fl/manifest";  // the ConfigMap: manifest.yaml, link-<name>.yaml
constexpr char kRecordsDir[] = "/var/lib/fl-testbed/records";
constexpr int kGrpcPort = 50051;
constexpr int kMetricsPort = 9464;
constexpr int kRelayFirstPort = 20000;  // a client pod's relays listen on 127.0.0.1:20000, 20001, ...
constexpr int64_t kUid = 999;
// Kubernetes refuses a Secret or ConfigMap whose data exceeds 1 MiB (etcd's object limit).
constexpr size_t kMaxObjectData = size_t{1} << 20;
constexpr size_t kMaxNameLength = 63;  // a DNS-1123 label; Job names become label values (job-name)

std::string Fmt(double v) {
  std::ostringstream os;
  os.precision(10);
  os << v;
  return os.str();
}

bool IsDnsLabel(const std::string& s) {
  if (s.empty() || s.size() > kMaxNameLength) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return s.front() != '-' && s.back() != '-';
}

// A Kubernetes quantity as resources and storage take it: a decimal number and an optional suffix.
bool IsQuantity(const std::string& s) {
  static const std::set<std::string> kSuffixes = {"",  "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
                                                  "m", "k",  "M",  "G",  "T",  "P",  "E"};
  size_t i = 0;
  while (i < s.size() && ((s[i] >= '0' && s[i] <= '9') || s[i] == '.')) ++i;
  return i > 0 && s[0] != '.' && kSuffixes.count(s.substr(i)) > 0;
}

// Whole cores as "2", the rest in millicores ("500m").
std::string MilliCpu(double cores) {
  const int64_t milli = std::llround(cores * 1000);
  return milli % 1000 == 0 ? std::to_string(milli / 1000) : fl::StrCat(milli, "m");
}

// One word for /bin/sh: bare where it holds only safe characters, else single-quoted. `expand`: the word holds
// the script's own variables (${K}, ${I}, ...) and is double-quoted so that they expand.
std::string ShellWord(const std::string& w, bool expand = false) {
  static const std::string kSafe = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=,@+-%";
  if (expand) return fl::StrCat("\"", w, "\"");
  if (!w.empty() && w.find_first_not_of(kSafe) == std::string::npos) return w;
  std::string out = "'";
  for (char c : w) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Argument i of a command in a script: a flag and its value on one line ("--rounds 3"), each flag on a new one.
std::string ArgLine(const std::vector<std::string>& args, size_t i, bool expand) {
  const bool value = i > 0 && args[i - 1].starts_with("--") && !args[i].starts_with("--");
  return fl::StrCat(value ? " " : " \\\n  ", ShellWord(args[i], expand));
}

json Labels(const std::string& exp, const std::string& component) {
  return {{"app.kubernetes.io/name", "fl-testbed"},
          {"app.kubernetes.io/instance", exp},
          {"app.kubernetes.io/component", component}};
}

json Meta(const std::string& name, const std::string& ns, const json& labels) {
  return {{"name", name}, {"namespace", ns}, {"labels", labels}};
}

json PodSecurity() {
  // The image's user; fsGroup makes the volume and the Secrets' files (mode 0440) readable and writable by it.
  return {{"runAsUser", kUid}, {"runAsGroup", kUid}, {"fsGroup", kUid}, {"runAsNonRoot", true}};
}

json SecretVolume(const std::string& volume, const std::string& secret) {
  return {{"name", volume}, {"secret", {{"secretName", secret}, {"defaultMode", 0440}}}};
}

struct Names {
  std::string exp;       // the manifest's name: every object's prefix
  std::string ns;        // namespace
  std::string service;   // <exp>-server: the Service, the StatefulSet, and the host clients dial
  std::string manifest;  // <exp>-manifest: the ConfigMap
  std::string records;   // <exp>-records: the PVC
  std::string ca;        // <exp>-ca: the CA certificate and its revocation list
  std::string server_tls;
  std::string ClientTls(const std::string& group) const { return fl::StrCat(exp, "-", group, "-tls"); }
  std::string Job(const std::string& group) const { return fl::StrCat(exp, "-", group); }
};

// How a group's devices are emulated in its pods: the local rule (ResolveDevices) with the pod's cpu limit as the
// quota: a process per client in cpu-quota or auto gets limits.cpu = training threads / slowdown (the kernel's
// CFS quota, the same mechanism as the runner's cgroup), virtual clients keep the duty cycle. The quota counts
// threads, not this machine's cores: a pod's node is not this machine.
absl::StatusOr<DeviceEmulation> PodDevice(const Manifest& m, const ClientGroup& g, bool virtual_clients) {
  DeviceEmulation d;
  d.slowdown = SlowdownFor(m, g.device);
  d.mode = d.slowdown > 1 ? "duty-cycle" : "host";
  if (d.slowdown <= 1 || m.emulation.devices == "duty-cycle") return d;
  if (virtual_clients) {
    d.why = "virtual clients (fl-client --instances): a quota would slow the process's clients together";
    return d;
  }
  const uint32_t threads = ClientSettingsFor(m, g).threads;
  if (threads == 0) {
    if (m.emulation.devices == "cpu-quota") {
      return absl::InvalidArgumentError(
          fl::StrCat(m.path,
                     ": emulation.devices is cpu-quota, but training.threads is 0 (every core): a pod's cpu limit of "
                     "threads / slowdown needs a thread count, and a pod's node has no core count known here; give "
                     "training.threads, or use devices: duty-cycle"));
    }
    d.why = "training.threads is 0 (every core): no thread count to divide into a pod's cpu limit";
    return d;
  }
  d.mode = "cpu-quota";
  d.cores = threads / d.slowdown;
  if (d.cores < 0.001) {
    return absl::InvalidArgumentError(fl::StrCat(m.path, ": clients group ", g.name, ": a cpu limit of ", Fmt(d.cores),
                                                 " cores is under Kubernetes' 1m; use devices: duty-cycle"));
  }
  return d;
}

// What the renderer cannot express, before anything is made.
absl::Status CheckExpressible(const Manifest& m, const Names& n) {
  if (m.emulation.backend == "kernel" || m.emulation.backend == "packet") {
    return absl::InvalidArgumentError(fl::StrCat(
        m.path, ": emulation.backend is ", m.emulation.backend,
        ", which needs network namespaces and root (CAP_NET_ADMIN, CAP_SYS_ADMIN) that a pod gets only privileged; "
        "the rendered pods run the userspace relay instead: use backend: userspace or auto"));
  }
  if (!IsDnsLabel(n.exp) || n.exp.size() > kMaxNameLength - 10) {
    return absl::InvalidArgumentError(fl::StrCat(
        m.path, ": name '", n.exp, "' cannot name Kubernetes objects: it must be lower-case letters, digits and '-' ",
        "(a DNS-1123 label), at most ", kMaxNameLength - 10, " characters to leave room for '-manifest'"));
  }
  if (!IsDnsLabel(n.ns)) {
    return absl::InvalidArgumentError(
        fl::StrCat("launcher.namespace '", n.ns, "' is not a Kubernetes namespace name (a DNS-1123 label)"));
  }
  const Manifest::Training& t = m.training;
  // The default data_dir is the dataset-fashion-mnist package's, which the image installs (deploy/Dockerfile).
  const std::string packaged = Manifest::Training{}.data_dir;
  for (const auto& [field, value] :
       {std::pair<std::string, std::string>{"training.data_dir", t.data_dir}, {"training.data", t.data}}) {
    if (!value.empty() && value != packaged) {
      return absl::InvalidArgumentError(fl::StrCat(
          m.path, ": ", field, " is ", value,
          ", a file on this machine that the pods cannot read; build it into the image and leave it out, or run "
          "locally"));
    }
  }
  if (t.model.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(fl::StrCat(m.path, ": training.model is ", t.model,
                                                 ", a file on this machine that the pods cannot read; use a built-in "
                                                 "model or run locally"));
  }
  for (const ClientGroup& g : m.clients) {
    const std::string job = n.Job(g.name);
    if (!IsDnsLabel(g.name) || job.size() > kMaxNameLength || n.ClientTls(g.name).size() > kMaxNameLength) {
      return absl::InvalidArgumentError(
          fl::StrCat(m.path, ": clients group '", g.name, "': its Job '", job,
                     "' and Secret must be DNS-1123 labels (lower-case letters, digits, '-') of at most ",
                     kMaxNameLength, " characters; rename the group or the experiment"));
    }
    if (!g.availability_trace.empty()) {
      return absl::InvalidArgumentError(fl::StrCat(m.path, ": clients group ", g.name, ": availability.trace is ",
                                                   g.availability_trace,
                                                   ", a file on this machine that the pods cannot read; not rendered "
                                                   "yet (use availability.period_s, or run locally)"));
    }
    if (g.link.has_value()) {
      for (const emulation::LinkDirection* d : {&g.link->uplink, &g.link->downlink}) {
        if (d->has_trace && !d->has_rate_process) {
          return absl::InvalidArgumentError(fl::StrCat(
              m.path, ": clients group ", g.name, ": link ", g.link_name, " replays the trace ", d->trace.path,
              ", a file on this machine that the pods cannot read; fit it into a rate_process (fl-link fit-trace) "
              "or run locally"));
        }
      }
    }
  }
  return absl::OkStatus();
}

// The certificates: where they come from, and the throwaway CA made where none is given.
absl::StatusOr<std::pair<std::string, std::string>> PreparePki(const Manifest& m, const K8sRenderOptions& o,
                                                               const Names& n) {
  if (m.security.mode == "insecure") return std::make_pair(std::string(), std::string());
  const std::string given = !o.pki_dir.empty() ? o.pki_dir : m.security.pki_dir;
  if (!given.empty()) {
    if (absl::Status s = CheckPkiDir(given, m.client_names()); !s.ok()) return s;
    return std::make_pair(given, fl::StrCat("the CA in ", given, " (its server certificate must name ",
                                            K8sServerDnsNames(m, n.ns).front(), ", the Service)"));
  }
  std::error_code ec;
  const fs::path dir = fs::absolute(o.out_dir / "pki", ec).lexically_normal();
  std::vector<std::string> dns = K8sServerDnsNames(m, n.ns);
  dns.push_back("localhost");
  if (absl::Status s =
          MakeThrowawayPki(m, dir, fl::StrCat("fl-experiment render throwaway CA (", m.name, ")"), dns, {"127.0.0.1"});
      !s.ok()) {
    return s;
  }
  return std::make_pair(
      dir.string(), fl::StrCat("a throwaway CA made in ", dir.string(), " (its key stays there, not in the cluster)"));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(fl::StrCat("cannot read ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A Secret from files; `what` names it in the size error.
absl::StatusOr<json> Secret(const Names& n, const std::string& name, const std::string& component,
                            const std::vector<std::pair<std::string, std::string>>& key_paths, const std::string& what,
                            const std::string& source) {
  json data = json::object();
  size_t bytes = 0;
  for (const auto& [key, path] : key_paths) {
    absl::StatusOr<std::string> text = ReadFile(path);
    if (!text.ok()) return text.status();
    bytes += key.size() + text->size();
    data[key] = *text;
  }
  if (bytes > kMaxObjectData) {
    return absl::InvalidArgumentError(fl::StrCat(what, ": the Secret ", name, " would hold ", bytes,
                                                 " bytes of certificates and keys, over Kubernetes' 1 MiB per Secret; "
                                                 "split the group into smaller groups"));
  }
  return json{{"apiVersion", "v1"},
              {"kind", "Secret"},
              {"metadata",
               {{"name", name},
                {"namespace", n.ns},
                {"labels", Labels(n.exp, component)},
                {"annotations", {{"fl-testbed/certificates", source}}}}},
              {"type", "Opaque"},
              {"stringData", data}};
}

// The script that starts a client process in its pod: the group's relays (one per client of the process), then
// fl-client with exactly the local run's arguments, the completion index K giving the process's offset.
// Positions where two processes' arguments differ become the script's variables: the client's name (${N}) and
// shard (${I}); checked against every process of the group, so that the pod's expansion is the local argv.
absl::StatusOr<std::string> RenderClientScript(const Manifest& m, const std::vector<ClientProcess>& procs,
                                               const std::string& pki_dir, const Names& n) {
  const ClientProcess& first = procs.front();
  const ClientGroup& g = *first.group;
  const bool relays = g.link.has_value();
  const uint32_t links = std::max<uint32_t>(first.instances, 1);
  const std::string service_addr = fl::StrCat(n.service, ":", kGrpcPort);
  const std::string server_addr = relays ? "${A}" : service_addr;
  const std::string client_bin = fl::StrCat(kBinDir, "/fl-client");
  const std::string server_name = K8sServerDnsNames(m, n.ns).front();
  auto args_of = [&](const ClientProcess& c, bool secagg) {
    ClientProcess p = c;
    p.secagg_drop = secagg && c.secagg_drop;
    return ClientProcessArgs(m, p, client_bin, server_addr, pki_dir, relays, server_name, kK8sClientGiveUpS);
  };
  // The template: process 0's arguments without its SecAgg drop, with what differs in process 1 made variable.
  std::vector<std::string> tmpl = args_of(first, false);
  std::vector<bool> variable(tmpl.size(), false);
  if (procs.size() > 1) {
    const std::vector<std::string> second = args_of(procs[1], false);
    if (second.size() != tmpl.size()) return absl::InternalError("a group's processes differ in argument count");
    for (size_t i = 0; i < tmpl.size(); ++i) {
      if (tmpl[i] == second[i]) continue;
      variable[i] = true;
      if (tmpl[i] == std::to_string(first.index)) {
        tmpl[i] = "${I}";
        continue;
      }
      const size_t at = tmpl[i].find(first.name);
      if (at == std::string::npos) {
        return absl::InternalError(fl::StrCat("argument ", tmpl[i], " of ", first.name, " varies but is not its name"));
      }
      tmpl[i].replace(at, first.name.size(), "${N}");
    }
  }
  // Where a dropping client's --secagg-drop-after-shares goes (the group's first D processes drop).
  uint32_t dropping = 0;
  size_t drop_at = tmpl.size();
  std::vector<std::string> drop_args;
  for (const ClientProcess& c : procs) dropping += c.secagg_drop ? 1 : 0;
  if (dropping > 0) {
    const std::vector<std::string> with = args_of(first, true), without = args_of(first, false);
    size_t i = 0;
    while (i < without.size() && with[i] == without[i]) ++i;
    drop_at = i;
    drop_args.assign(with.begin() + static_cast<long>(i),
                     with.begin() + static_cast<long>(i + (with.size() - without.size())));
  }
  // Every process of the group: the template expanded with its K is its local argv.
  for (size_t k = 0; k < procs.size(); ++k) {
    std::vector<std::string> expanded;
    for (size_t i = 0; i < tmpl.size(); ++i) {
      if (i == drop_at && k < dropping) expanded.insert(expanded.end(), drop_args.begin(), drop_args.end());
      std::string a = tmpl[i];
      if (a == "${I}") a = std::to_string(procs[k].index);
      if (const size_t at = a.find("${N}"); at != std::string::npos) a.replace(at, 4, procs[k].name);
      expanded.push_back(a);
    }
    if (drop_at == tmpl.size() && k < dropping) expanded.insert(expanded.end(), drop_args.begin(), drop_args.end());
    if (expanded != args_of(procs[k], true) || procs[k].secagg_drop != (k < dropping)) {
      return absl::InternalError(fl::StrCat("process ", procs[k].name, "'s arguments do not follow its group's"));
    }
  }

  // Seeds as the local run's: the manifest seed x 100003 + the client's index (+ the instance).
  const uint64_t seed_base = m.settings.seed * 100'003 + first.index;
  if (seed_base > (uint64_t{1} << 62)) {
    return absl::InvalidArgumentError(fl::StrCat(m.path, ": seed ", m.settings.seed,
                                                 " is too large for the pods' shell arithmetic (links' seeds are "
                                                 "seed x 100003 + index); use a seed under 4e13"));
  }
  std::string s;
  s += fl::StrCat("# clients ", g.name, ": process K = $JOB_COMPLETION_INDEX of ", procs.size(),
                  ", as fl-experiment run ", "starts it\n");
  s += "K=${JOB_COMPLETION_INDEX:?set by the Indexed Job}\n";
  s += fl::StrCat("I=$((", first.index, " + K))  # its client index (shard)\n");
  if (std::any_of(tmpl.begin(), tmpl.end(), [](const std::string& a) { return a.find("${N}") != std::string::npos; })) {
    s += fl::StrCat("N=", g.name, "-$K  # its name\n");
  }
  if (g.start_delay_s > 0) s += fl::StrCat("sleep ", Fmt(g.start_delay_s), "  # availability.start_delay_s\n");
  if (relays) {
    // The link: fl-link relay per client of the process, on the pod's loopback, seeded as the local relay.
    s += "A=\n";
    s += fl::StrCat("i=0\nwhile [ $i -lt ", links, " ]; do\n");
    s += fl::StrCat("  ", kBinDir, "/fl-link --log-level warn relay ", kManifestDir, "/link-", g.name,
                    ".yaml --listen 127.0.0.1:$((", kRelayFirstPort, " + i)) --target ", service_addr, " --seed $((",
                    seed_base - first.index, " + I + i)) &\n");
    s += fl::StrCat("  A=\"${A:+$A,}127.0.0.1:$((", kRelayFirstPort, " + i))\"\n  i=$((i + 1))\ndone\n");
  }
  auto emit = [&](size_t from, size_t to, bool append) {
    std::string out = append ? "set -- \"$@\"" : "set --";
    for (size_t i = from; i < to; ++i) out += ArgLine(tmpl, i, variable[i] || tmpl[i].find("${") != std::string::npos);
    return out + "\n";
  };
  s += emit(0, drop_at, false);
  if (dropping > 0) {
    s += fl::StrCat("if [ \"$K\" -lt ", dropping, " ]; then set -- \"$@\"");
    for (const std::string& a : drop_args) s += fl::StrCat(" ", ShellWord(a));
    s += "; fi  # secagg_drop_after_shares\n";
    if (drop_at < tmpl.size()) s += emit(drop_at, tmpl.size(), true);
  }
  if (g.leave_after_s > 0) {
    // availability.leave_after_s: stopped with SIGTERM, as the local run stops it; that exit is expected.
    s += fl::StrCat("timeout -s TERM ", Fmt(g.leave_after_s), " \"$@\" || [ $? -eq 124 ]\n");
  } else {
    s += "exec \"$@\"\n";
  }
  return s;
}

json Resources(const DeviceEmulation& d, const ClientGroup& g, const ClientProcess& p, uint32_t threads) {
  json r = json::object();
  if (d.mode == "cpu-quota") {
    // The device's speed as the kernel's CFS quota on the container, the runner's own mechanism.
    r["limits"]["cpu"] = MilliCpu(d.cores);
    r["requests"]["cpu"] = MilliCpu(d.cores);
  } else {
    r["requests"]["cpu"] = MilliCpu(std::max<uint32_t>(threads, 1));
  }
  // One client per process: the device's memory is the process's.
  if (p.instances == 0 && g.device.memory_mb > 0) r["limits"]["memory"] = fl::StrCat(g.device.memory_mb, "Mi");
  return r;
}

}  // namespace

std::vector<std::string> K8sServerDnsNames(const Manifest& m, const std::string& ns) {
  const std::string svc = fl::StrCat(m.name, "-server");
  return {svc, fl::StrCat(svc, ".", ns), fl::StrCat(svc, ".", ns, ".svc"),
          fl::StrCat(svc, ".", ns, ".svc.cluster.local")};
}

absl::StatusOr<K8sRendering> RenderKubernetes(const Manifest& m, const K8sRenderOptions& o) {
  Names n;
  n.exp = m.name;
  n.ns = !o.k8s_namespace.empty() ? o.k8s_namespace : m.launcher.k8s_namespace;
  n.service = fl::StrCat(m.name, "-server");
  n.manifest = fl::StrCat(m.name, "-manifest");
  n.records = fl::StrCat(m.name, "-records");
  n.ca = fl::StrCat(m.name, "-ca");
  n.server_tls = fl::StrCat(m.name, "-server-tls");
  const std::string image = !o.image.empty()            ? o.image
                            : !m.launcher.image.empty() ? m.launcher.image
                                                        : fl::StrCat("fl-testbed:", o.software_version);
  const std::string storage = !o.storage.empty() ? o.storage : m.launcher.storage;
  if (!IsQuantity(storage)) {
    return absl::InvalidArgumentError(fl::StrCat("launcher.storage '", storage,
                                                 "' is not a Kubernetes quantity (a number and an optional suffix "
                                                 "Ki, Mi, Gi, Ti, k, M, G, T; e.g. 1Gi)"));
  }
  if (absl::Status s = CheckExpressible(m, n); !s.ok()) return s;

  // The link backend in a pod: the userspace relay where a group has a link, else none.
  bool any_link = false;
  for (const ClientGroup& g : m.clients) any_link |= g.link.has_value();
  const std::string backend = any_link && m.emulation.backend != "none" ? "userspace" : "none";
  std::vector<DeviceEmulation> devices;
  for (const ClientGroup& g : m.clients) {
    const bool virtual_clients = m.emulation.virtual_clients && (g.count > 1 || g.HasSchedule());
    absl::StatusOr<DeviceEmulation> d = PodDevice(m, g, virtual_clients);
    if (!d.ok()) return d.status();
    devices.push_back(*d);
  }
  for (const ClientGroup& g : m.clients) {
    // An Indexed Job's pods share one template: a split group's last process may hold fewer instances, and its
    // offset would need a second variable in the pod script.
    if (m.emulation.virtual_clients && g.instances_per_process > 0 && g.instances_per_process < g.count) {
      return absl::InvalidArgumentError(fl::StrCat(
          m.path, ": clients group ", g.name, ": instances_per_process ", g.instances_per_process, " of ", g.count,
          " clients is not rendered for Kubernetes yet (one Indexed Job pod per process of equal shape); drop it "
          "(one pod for the group) or use emulation.virtual_clients: false (a pod per client)"));
    }
    if (g.HasSchedule() && !m.emulation.virtual_clients) {
      return absl::InvalidArgumentError(
          fl::StrCat(m.path, ": clients group ", g.name,
                     ": availability.period_s needs virtual clients (fl-client --instances), which "
                     "emulation.virtual_clients: false turns off"));
    }
  }
  const std::vector<ClientProcess> procs = PlanClientProcesses(m, backend, devices);

  absl::StatusOr<std::pair<std::string, std::string>> pki = PreparePki(m, o, n);
  if (!pki.ok()) return pki.status();
  const bool tls = !pki->first.empty();
  K8sRendering out;
  out.pki_source = pki->second;
  std::map<std::string, std::vector<json>> docs;  // file name -> documents

  // The manifest and the link profiles its groups use, as the pods read them.
  json cm_data = {{"manifest.yaml", m.source_yaml}};
  for (const ClientGroup& g : m.clients) {
    // Keyed by group (a DNS label, checked), not by profile name, which need not be a valid ConfigMap key.
    if (g.link.has_value()) cm_data[fl::StrCat("link-", g.name, ".yaml")] = emulation::LinkProfileToYaml(*g.link);
  }
  if (cm_data.dump().size() > kMaxObjectData) {
    return absl::InvalidArgumentError(fl::StrCat(m.path,
                                                 ": the manifest and its link profiles are over Kubernetes' "
                                                 "1 MiB per ConfigMap"));
  }
  docs["configmap.yaml"].push_back({{"apiVersion", "v1"},
                                    {"kind", "ConfigMap"},
                                    {"metadata", Meta(n.manifest, n.ns, Labels(n.exp, "manifest"))},
                                    {"data", cm_data}});

  // Certificates: the CA's certificate and revocation list, the server's, each group's clients' (one Secret per
  // group, since an Indexed Job's pods share one template; each pod reads its own <group>-<k>.crt).
  const pki::Paths paths{.dir = pki->first};
  if (tls) {
    const std::string src = pki->second.starts_with("a throwaway") ? "throwaway CA made by fl-experiment render"
                                                                   : "a CA given to fl-experiment render";
    absl::StatusOr<json> ca =
        Secret(n, n.ca, "pki", {{"ca.crt", paths.CaCert()}, {"crl.pem", paths.Crl()}}, "the CA", src);
    if (!ca.ok()) return ca.status();
    docs["secret.yaml"].push_back(*ca);
    absl::StatusOr<json> server = Secret(n, n.server_tls, "server",
                                         {{"server.crt", paths.Cert(pki::Kind::kServer, "server")},
                                          {"server.key", paths.Key(pki::Kind::kServer, "server")}},
                                         "the server", src);
    if (!server.ok()) return server.status();
    docs["secret.yaml"].push_back(*server);
    for (const ClientGroup& g : m.clients) {
      std::vector<std::pair<std::string, std::string>> files;
      for (uint32_t i = 0; i < g.count; ++i) {
        const std::string name = fl::StrCat(g.name, "-", i);
        files.push_back({fl::StrCat(name, ".crt"), paths.Cert(pki::Kind::kClient, name)});
        files.push_back({fl::StrCat(name, ".key"), paths.Key(pki::Kind::kClient, name)});
      }
      absl::StatusOr<json> s =
          Secret(n, n.ClientTls(g.name), "clients", files, fl::StrCat(m.path, ": clients group ", g.name), src);
      if (!s.ok()) return s.status();
      docs["secret.yaml"].push_back(*s);
    }
  }

  // The server: its records and checkpoints on a volume that outlives the pod.
  docs["persistentvolumeclaim.yaml"].push_back(
      {{"apiVersion", "v1"},
       {"kind", "PersistentVolumeClaim"},
       {"metadata", Meta(n.records, n.ns, Labels(n.exp, "server"))},
       {"spec",
        {{"accessModes", json::array({"ReadWriteOnce"})}, {"resources", {{"requests", {{"storage", storage}}}}}}}});
  const json server_labels = Labels(n.exp, "server");
  docs["service.yaml"].push_back(
      {{"apiVersion", "v1"},
       {"kind", "Service"},
       {"metadata", Meta(n.service, n.ns, server_labels)},
       {"spec",
        {{"selector", server_labels},
         {"ports",
          {{{"name", "grpc"}, {"port", kGrpcPort}, {"targetPort", "grpc"}, {"protocol", "TCP"}},
           {{"name", "metrics"}, {"port", kMetricsPort}, {"targetPort", "metrics"}, {"protocol", "TCP"}}}}}}});
  std::vector<std::string> server_args = {fl::StrCat(kBinDir, "/fl-server"),
                                          "--listen",
                                          fl::StrCat("0.0.0.0:", kGrpcPort),
                                          "--experiment-id",
                                          fl::StrCat(m.name, "-k8s"),
                                          "--experiment-name",
                                          m.name,
                                          "--log-level",
                                          "warn"};
  for (std::string& a : ServerSettingArgs(m)) server_args.push_back(std::move(a));
  server_args.insert(server_args.end(), {"--db", fl::StrCat(kRecordsDir, "/records.db"), "--checkpoint-dir",
                                         fl::StrCat(kRecordsDir, "/checkpoints"), "--metrics-addr",
                                         fl::StrCat("0.0.0.0:", kMetricsPort), "--metrics-linger-s", "60"});
  const pki::Paths pod_pki{.dir = kPkiDir};
  if (tls) {
    server_args.insert(server_args.end(), {"--tls-cert", pod_pki.Cert(pki::Kind::kServer, "server"), "--tls-key",
                                           pod_pki.Key(pki::Kind::kServer, "server"), "--tls-client-ca",
                                           pod_pki.CaCert(), "--tls-crl", pod_pki.Crl()});
  } else {
    server_args.push_back("--insecure");
  }
  // After the experiment the pod stays up (the records stay readable with kubectl cp) and a restarted pod does
  // not start the experiment again; a pod restarted mid-run resumes from the last committed round.
  std::string server_script = fl::StrCat("# fl-server as fl-experiment run starts it; its exit status in ", kRecordsDir,
                                         "/server.exit\n", "R=", kRecordsDir, "\n",
                                         "if [ -e $R/server.exit ]; then echo \"finished earlier (exit $(cat "
                                         "$R/server.exit))\"; exec sleep infinity; fi\n",
                                         "set --");
  for (size_t i = 0; i < server_args.size(); ++i) server_script += ArgLine(server_args, i, false);
  server_script +=
      "\nif [ -n \"$(ls -A $R/checkpoints 2>/dev/null)\" ]; then set -- \"$@\" --resume; fi\n"
      "\"$@\"\necho $? > $R/server.exit\nexec sleep infinity\n";
  json server_mounts = {{{"name", "records"}, {"mountPath", kRecordsDir}},
                        {{"name", "manifest"}, {"mountPath", kManifestDir}, {"readOnly", true}}};
  json server_volumes = {{{"name", "records"}, {"persistentVolumeClaim", {{"claimName", n.records}}}},
                         {{"name", "manifest"}, {"configMap", {{"name", n.manifest}}}}};
  if (tls) {
    server_mounts.push_back({{"name", "ca"}, {"mountPath", fl::StrCat(kPkiDir, "/ca")}, {"readOnly", true}});
    server_mounts.push_back(
        {{"name", "server-tls"}, {"mountPath", fl::StrCat(kPkiDir, "/server")}, {"readOnly", true}});
    server_volumes.push_back(SecretVolume("ca", n.ca));
    server_volumes.push_back(SecretVolume("server-tls", n.server_tls));
  }
  docs["statefulset.yaml"].push_back(
      {{"apiVersion", "apps/v1"},
       {"kind", "StatefulSet"},
       {"metadata", Meta(n.service, n.ns, server_labels)},
       {"spec",
        {{"replicas", 1},
         {"serviceName", n.service},
         {"selector", {{"matchLabels", server_labels}}},
         {"template",
          {{"metadata",
            {{"labels", server_labels},
             {"annotations",
              {{"prometheus.io/scrape", "true"},
               {"prometheus.io/port", std::to_string(kMetricsPort)},
               {"prometheus.io/path", "/metrics"}}}}},
           {"spec",
            {{"securityContext", PodSecurity()},
             {"containers",
              {{{"name", "fl-server"},
                {"image", image},
                {"command", {"/bin/sh", "-c", server_script}},
                {"ports",
                 {{{"name", "grpc"}, {"containerPort", kGrpcPort}, {"protocol", "TCP"}},
                  {{"name", "metrics"}, {"containerPort", kMetricsPort}, {"protocol", "TCP"}}}},
                {"readinessProbe", {{"tcpSocket", {{"port", "grpc"}}}, {"periodSeconds", 5}}},
                {"resources", {{"requests", {{"cpu", "1"}}}}},
                {"volumeMounts", server_mounts}}}},
             {"volumes", server_volumes}}}}}}}});

  // Each group: an Indexed Job of its processes, all running at once (a round needs them together).
  for (const ClientGroup& g : m.clients) {
    std::vector<ClientProcess> mine;
    for (const ClientProcess& p : procs) {
      if (p.group == &g) mine.push_back(p);
    }
    absl::StatusOr<std::string> script = RenderClientScript(m, mine, tls ? kPkiDir : "", n);
    if (!script.ok()) return script.status();
    const DeviceEmulation& d = devices[&g - m.clients.data()];
    json labels = Labels(n.exp, "clients");
    labels["fl-testbed/group"] = g.name;
    json mounts = {{{"name", "manifest"}, {"mountPath", kManifestDir}, {"readOnly", true}}};
    json volumes = {{{"name", "manifest"}, {"configMap", {{"name", n.manifest}}}}};
    if (tls) {
      mounts.push_back({{"name", "ca"}, {"mountPath", fl::StrCat(kPkiDir, "/ca")}, {"readOnly", true}});
      mounts.push_back({{"name", "clients-tls"}, {"mountPath", fl::StrCat(kPkiDir, "/clients")}, {"readOnly", true}});
      volumes.push_back(SecretVolume("ca", n.ca));
      volumes.push_back(SecretVolume("clients-tls", n.ClientTls(g.name)));
    }
    json annotations = {
        {"fl-testbed/device", g.device.name},
        {"fl-testbed/device-emulation", d.mode == "cpu-quota" ? fl::StrCat("cpu-quota: limits.cpu ", MilliCpu(d.cores))
                                        : d.mode == "duty-cycle"
                                            ? fl::StrCat("duty-cycle: fl-client --slowdown ", Fmt(d.slowdown),
                                                         d.why.empty() ? "" : fl::StrCat(" (", d.why, ")"))
                                            : std::string("host")},
        {"fl-testbed/link",
         g.link_name.empty() ? std::string("none") : fl::StrCat(g.link_name, " (fl-link relay in the pod)")}};
    const auto completions = static_cast<int64_t>(mine.size());
    docs["job.yaml"].push_back(
        {{"apiVersion", "batch/v1"},
         {"kind", "Job"},
         {"metadata", Meta(n.Job(g.name), n.ns, labels)},
         {"spec",
          {{"completionMode", "Indexed"},
           {"completions", completions},
           {"parallelism", completions},
           // A client that gave up before the server was reachable, or crashed, starts again under its name.
           {"backoffLimit", 6 * completions},
           {"template",
            {{"metadata", {{"labels", labels}, {"annotations", annotations}}},
             {"spec",
              {{"restartPolicy", "OnFailure"},
               {"securityContext", PodSecurity()},
               {"containers",
                {{{"name", "fl-client"},
                  {"image", image},
                  {"command", {"/bin/sh", "-c", *script}},
                  {"resources", Resources(d, g, mine.front(), ClientSettingsFor(m, g).threads)},
                  {"volumeMounts", mounts}}}},
               {"volumes", volumes}}}}}}}});
  }

  for (const auto& [file, documents] : docs) {
    std::string text = fl::StrCat("# ", file, ": rendered by fl-experiment render --launcher kubernetes from ",
                                  fs::path(m.path).filename().string(), " (docs/cluster.md)\n");
    for (const json& d : documents) text += fl::StrCat("---\n", JsonToYaml(d.dump()));
    out.files.push_back({file, text});
  }
  return out;
}

absl::Status WriteKubernetes(const K8sRendering& r, const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(fl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  for (const auto& [file, text] : r.files) {
    std::ofstream out(dir / file, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) return absl::FailedPreconditionError(fl::StrCat("cannot write ", (dir / file).string()));
  }
  return absl::OkStatus();
}

namespace {

bool PlainScalar(const std::string& s) {
  static const std::set<std::string> kSpecial = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"};
  if (s.empty() || !((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') || s[0] == '/')) return false;
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (kSpecial.count(lower) > 0) return false;
  return s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./-") == std::string::npos;
}

std::string Scalar(const json& v, const std::string& indent) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s.find('\n') != std::string::npos && s.find_first_of("\t\r") == std::string::npos && s[0] != ' ') {
      // A literal block: '|' keeps one final newline, '|-' none; a text ending in blank lines is quoted instead.
      if (s.ends_with("\n\n")) return json(s).dump();
      std::string out = s.ends_with('\n') ? "|" : "|-";
      std::istringstream lines(s);
      for (std::string line; std::getline(lines, line);) out += line.empty() ? "\n" : fl::StrCat("\n", indent, line);
      return out;
    }
    return PlainScalar(s) ? s : json(s).dump();  // JSON's escapes are YAML's double-quoted ones
  }
  return v.dump();
}

void Emit(const json& v, const std::string& indent, std::string& out);

// A value after "key:" or "- ": scalars and empty collections on the same line, the rest below.
void EmitValue(const json& v, const std::string& indent, std::string& out) {
  if (v.is_object() && v.empty()) {
    out += " {}\n";
  } else if (v.is_array() && v.empty()) {
    out += " []\n";
  } else if (v.is_object()) {
    out += "\n";
    Emit(v, indent + "  ", out);
  } else if (v.is_array()) {
    out += "\n";
    Emit(v, indent, out);  // a sequence under a key at the key's indentation, as kubectl writes it
  } else {
    out += fl::StrCat(" ", Scalar(v, indent + "  "), "\n");
  }
}

void Emit(const json& v, const std::string& indent, std::string& out) {
  if (v.is_object()) {
    for (const auto& [key, value] : v.items()) {
      out += fl::StrCat(indent, PlainScalar(key) ? key : json(key).dump(), ":");
      EmitValue(value, indent, out);
    }
  } else if (v.is_array()) {
    for (const json& item : v) {
      if (item.is_object() && !item.empty()) {
        // "- " then the item's keys, the first on the dash's line.
        std::string inner;
        Emit(item, indent + "  ", inner);
        out += fl::StrCat(indent, "- ", inner.substr(indent.size() + 2));
      } else {
        out += fl::StrCat(indent, "-");
        EmitValue(item, indent + "  ", out);
      }
    }
  } else {
    out += fl::StrCat(indent, Scalar(v, indent), "\n");
  }
}

}  // namespace

std::string JsonToYaml(const std::string& text) {
  std::string out;
  Emit(json::parse(text), "", out);
  return out;
}

}  // namespace fl::experiment
