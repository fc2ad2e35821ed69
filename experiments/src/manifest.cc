#include "fl/experiment/manifest.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <string_view>
#include <type_traits>
#include <variant>

#include <nlohmann/json.hpp>

#include "fl/config/field_table.h"
#include "fl/config/safe_name.h"
#include "fl/config/yaml_fields.h"
#include "fl/core/codec_policy.h"
#include "fl/core/model_file.h"
#include "fl/core/str_cat.h"
#include "fl/sys/user_file.h"

namespace fl::experiment {
namespace {

namespace fs = std::filesystem;
using config::YamlMap;
using Server = Manifest::Server;
using Training = Manifest::Training;
using Emulation = Manifest::Emulation;
using Security = Manifest::Security;
using Launcher = Manifest::Launcher;

#define FL_RETURN_IF_ERROR(expr)              \
  do {                                        \
    if (absl::Status s_ = (expr); !s_.ok()) { \
      return s_;                              \
    }                                         \
  } while (0)

fs::path DefaultProfilesDir(const fs::path& base_dir) {
  fs::path dir = fs::absolute(base_dir);
  for (int i = 0; i < 5 && !dir.empty(); ++i) {
    if (fs::is_directory(dir / "profiles")) return dir / "profiles";
    if (dir == dir.parent_path()) break;
    dir = dir.parent_path();
  }
  return fs::absolute(base_dir) / "profiles";
}

std::vector<std::string> ProfileNames(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".yaml" && e.path().string().find(".calibration.") == std::string::npos) {
      names.push_back(e.path().stem().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string JoinNames(const std::vector<std::string>& names) {
  return names.empty() ? "(none)" : config::JoinList(names);
}

DeviceProfile HostDevice() {
  DeviceProfile d;
  d.name = "host";
  d.description = "this machine, at its own speed";
  d.device_class = "";  // fl-client detects it
  d.is_host = true;
  d.source = "built in";
  return d;
}

std::string LinkKindFromName(const std::string& name) {
  if (name.rfind("ethernet", 0) == 0) return "ethernet";
  if (name.rfind("wifi", 0) == 0) return "wifi";
  if (name.rfind("5g", 0) == 0) return "5g";
  return "other";
}

// Where a manifest's profile names and relative paths resolve.
struct Where {
  fs::path links;     // <profiles>/links
  fs::path devices;   // <profiles>/devices
  fs::path base_dir;  // the manifest's folder (inline link profiles' trace paths)
};

// ---------------------------------------------------------------------------------------------------------
// The fields of a manifest, each declared once: its YAML path, member, type and bounds, and its name in the
// resolved manifest JSON (the last part of the YAML path unless Recorded() says otherwise). The YAML reader,
// ResolvedManifestJson and ManifestFromResolvedJson all come from these tables. A field added after
// experiments were recorded is NewInRecords(): replaying an older record keeps its default.
// ---------------------------------------------------------------------------------------------------------

const config::FieldTable<DeviceProfile>& DeviceFields() {
  using D = DeviceProfile;
  static const auto& table = *new config::FieldTable<D>{
      config::StringField("name", &D::name),
      config::StringField("description", &D::description).NewInRecords(),
      config::StringField("device_class", &D::device_class).Then([](const YamlMap&, D& d) {
        if (d.device_class.empty()) d.device_class = d.name;
        return absl::OkStatus();
      }),
      config::NumberField("relative_speed", &D::relative_speed, {1e-3, 1e6}).Required(),
      config::IntField("cores", &D::cores, 0, 4096),
      config::IntField("memory_mb", &D::memory_mb, 0, int64_t{1} << 40),
      config::StringField("reference", &D::reference),
      config::RecordField("source", &D::source),
      config::RecordField("is_host", &D::is_host),
  };
  return table;
}

absl::StatusOr<DeviceProfile> ParseDeviceProfile(const YamlMap& m, const std::string& default_name,
                                                 const std::string& source) {
  DeviceProfile d;
  d.name = default_name;
  d.source = source;
  FL_RETURN_IF_ERROR(DeviceFields().Read(m, d));
  return d;
}

// The fl-server settings of a section ("server", "training", "codecs"; "" = the manifest's own keys), generated from
// their declarations (fl/server/settings.h): each reads its key into `sink` (nullptr: tables used for their keys
// only), converted to fl-server's unit and checked against its bounds, in the same words as fl-server's.
template <typename T>
std::vector<config::Field<T>> SettingFields(std::string_view section, server::EngineConfig* sink) {
  std::vector<config::Field<T>> fields;
  for (const server::Setting& s : server::Settings()) {
    if (s.manifest.empty()) continue;
    std::string_view path = s.manifest;
    if (section.empty()) {
      if (path.find('.') != std::string_view::npos) continue;
    } else {
      if (!(path.size() > section.size() && path.starts_with(section) && path[section.size()] == '.')) continue;
      path.remove_prefix(section.size() + 1);
    }
    const server::Setting* setting = &s;
    config::Field<T> f = config::CustomField<T>(
        std::string(path), [setting, sink](const YamlMap& m, const std::string& key, T&) -> absl::Status {
          absl::StatusOr<std::optional<std::string>> v = server::ReadSettingYaml(m, key, *setting);
          if (!v.ok()) return v.status();
          if (v->has_value() && sink != nullptr) setting->set(*sink, **v);
          return absl::OkStatus();
        });
    f.allowed = setting->Describe();
    if (s.manifest_required) f.Required();
    fields.push_back(std::move(f));
  }
  return fields;
}

config::FieldTable<Server> ServerFields(server::EngineConfig* sink) {
  std::vector<config::Field<Server>> fields = SettingFields<Server>("server", sink);
  fields.push_back(config::StringField("metrics_addr", &Server::metrics_addr).NewInRecords());
  return config::FieldTable<Server>(std::move(fields));
}

absl::Status CheckModel(const YamlMap& m, Training& t) {
  if (core::IsTorchScriptModelPath(t.model)) {
    std::error_code ec;
    if (!fs::is_regular_file(t.model, ec)) {
      return m.Error(m.Node("model"), "model",
                     fl::StrCat("TorchScript model file \"", t.model, "\" not found (relative paths resolve against ",
                                fs::current_path(ec).string(), "); export it first (examples/bring-your-own-model)"));
    }
    // Absolute, so that a replay from another directory finds the same file.
    t.model = fs::absolute(t.model, ec).lexically_normal().string();
  } else if (t.model != "cnn" && t.model != "squeezenet" && t.model.rfind("synthetic:", 0) != 0) {
    return m.Error(m.Node("model"), "model", fl::StrCat("unknown model \"", t.model, "\""),
                   "cnn, squeezenet, synthetic:<P>[:<train_ms>], or the path of a TorchScript .pt file");
  }
  return absl::OkStatus();
}

absl::Status CheckData(const YamlMap& m, Training& t) {
  if (t.data.empty()) return absl::OkStatus();
  std::error_code ec;
  if (!fs::exists(t.data, ec)) {
    return m.Error(m.Node("data"), "data",
                   fl::StrCat("data \"", t.data, "\" not found (relative paths resolve against ",
                              fs::current_path(ec).string(), "); give a .npz, an IDX directory or a text corpus"));
  }
  if (!core::IsTorchScriptModelPath(t.model)) {
    return m.Error(m.Node("data"), "data",
                   fl::StrCat("data is for TorchScript models; the built-in model \"", t.model,
                              "\" trains on Fashion-MNIST (data_dir)"));
  }
  t.data = fs::absolute(t.data, ec).lexically_normal().string();
  return absl::OkStatus();
}

// A manifest key of one of fl-client's settings (fl/client/settings.h), read into `member` of T through the shared
// reader (config::ReadSettingYaml), so that a value is refused in fl-client's words; recorded under `key`.
template <typename T, typename M>
config::Field<T> ClientSettingField(std::string key, const client::ClientSetting& s, M T::*member) {
  const client::ClientSetting* setting = &s;
  config::Field<T> f = config::CustomField<T>(
      std::move(key),
      [setting, member](const YamlMap& m, const std::string& k, T& out) -> absl::Status {
        absl::StatusOr<std::optional<std::string>> v = config::ReadSettingYaml(m, k, *setting);
        if (!v.ok()) return v.status();
        if (!v->has_value()) return absl::OkStatus();
        client::ClientSettings value;
        setting->Set(value, **v);
        std::visit(
            [&](auto from) {
              if constexpr (std::is_convertible_v<decltype(from), M client::ClientSettings::*>) {
                out.*member = value.*from;
              }
            },
            setting->member);
        return absl::OkStatus();
      },
      member);
  f.allowed = s.Describe();
  if (!s.in_old_manifest_records) f.NewInRecords();
  return f;
}

// The checks a loaded manifest adds to fl-client's own, by setting: files that must exist, made absolute.
config::Field<Training>& ThenCheck(config::Field<Training>& f, const std::string& name) {
  using T = Training;
  if (name == "model") f.Then(CheckModel);
  if (name == "data") f.Then(CheckData);
  if (name == "task") {
    f.Then([](const YamlMap& m, T& t) -> absl::Status {
      if (core::IsTorchScriptModelPath(t.model) || t.task == "classification") return absl::OkStatus();
      return m.Error(m.Node("task"), "task",
                     fl::StrCat("the built-in model \"", t.model, "\" is a classifier; task ", t.task,
                                " needs a TorchScript model (model: path.pt)"));
    });
  }
  return f;
}

config::FieldTable<Training> TrainingFields(server::EngineConfig* sink) {
  using T = Training;
  std::vector<config::Field<T>> fields;
  // fl-client's settings under training: (their keys, bounds, defaults and units from fl/client/settings.h).
  for (const client::ClientSetting& s : client::ClientSettingsTable()) {
    if (!s.manifest.starts_with("training.")) continue;
    const std::string key = s.manifest.substr(std::string_view("training.").size());
    std::visit(
        [&](auto member) {
          if constexpr (!std::is_same_v<decltype(member), std::monostate>) {
            config::Field<T> f = ClientSettingField<T>(key, s, member);
            fields.push_back(std::move(ThenCheck(f, s.name)));
          }
        },
        s.member);
    // The only dataset, accepted for clarity.
    if (s.name == "model") fields.push_back(config::ChoiceField<T>("dataset", nullptr, {"fashion-mnist"}));
  }
  for (config::Field<T>& f : SettingFields<T>("training", sink)) fields.push_back(std::move(f));
  return config::FieldTable<T>(std::move(fields));
}

const config::FieldTable<Emulation>& EmulationFields() {
  static const auto& table = *new config::FieldTable<Emulation>{
      config::ChoiceField("backend", &Emulation::backend, {"auto", "none", "userspace", "kernel", "packet"}),
      config::ChoiceField("tcp_congestion", &Emulation::tcp_congestion, {"default", "cubic", "bbr", "reno"})
          .NewInRecords(),
      config::NumberField("host_relative_speed", &Emulation::host_relative_speed, {1e-3, 1e6}),
      config::BoolField("virtual_clients", &Emulation::virtual_clients).NewInRecords(),
      config::ChoiceField("devices", &Emulation::devices, {"auto", "duty-cycle", "cpu-quota"}).NewInRecords(),
  };
  return table;
}

const config::FieldTable<Security>& SecurityFields() {
  static const auto& table = *new config::FieldTable<Security>{
      config::ChoiceField("mode", &Security::mode, {"mtls", "insecure"}).NewInRecords(),
      config::StringField("pki_dir", &Security::pki_dir)
          .NewInRecords()
          .Then([](const YamlMap& m, Security& s) -> absl::Status {
            if (s.pki_dir.empty()) return absl::OkStatus();
            if (s.mode == "insecure") {
              return m.Error(m.Node("pki_dir"), "pki_dir",
                             "a pki_dir is for mode mtls; with mode insecure nothing would use it: drop one of the "
                             "two");
            }
            std::error_code ec;
            if (!fs::is_directory(s.pki_dir, ec)) {
              return m.Error(m.Node("pki_dir"), "pki_dir",
                             fl::StrCat("directory \"", s.pki_dir, "\" not found (relative paths resolve against ",
                                        fs::current_path(ec).string(),
                                        "); make it with fl-provision init, or leave pki_dir out for a throwaway CA "
                                        "per run"));
            }
            // Absolute, so that a replay from another directory finds the same certificates.
            s.pki_dir = fs::absolute(s.pki_dir, ec).lexically_normal().string();
            return absl::OkStatus();
          }),
  };
  return table;
}

// Characters that may go into an #SBATCH line or a Kubernetes name unquoted: letters, digits and `allowed_extra`.
bool OnlyChars(const std::string& v, std::string_view allowed_extra) {
  return std::all_of(v.begin(), v.end(), [&](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           allowed_extra.find(c) != std::string_view::npos;
  });
}

// Slurm's time limit forms (sbatch --time): minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
bool IsSlurmTime(const std::string& t) {
  auto digits = [](std::string_view s) {
    return !s.empty() && s.size() <= 6 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  auto parts = [&](std::string_view s, size_t min, size_t max) {
    size_t n = 0;
    while (true) {
      const size_t colon = s.find(':');
      if (!digits(s.substr(0, colon))) return false;
      ++n;
      if (colon == std::string_view::npos) break;
      s.remove_prefix(colon + 1);
    }
    return n >= min && n <= max;
  };
  const size_t dash = t.find('-');
  if (dash == std::string::npos) return parts(t, 1, 3);
  return digits(std::string_view(t).substr(0, dash)) && parts(std::string_view(t).substr(dash + 1), 1, 3);
}

// A Kubernetes resource quantity for a volume: digits, an optional fraction, an optional binary or decimal suffix.
bool IsStorageQuantity(const std::string& q) {
  size_t i = 0;
  while (i < q.size() && q[i] >= '0' && q[i] <= '9') ++i;
  if (i == 0) return false;
  if (i < q.size() && q[i] == '.') {
    const size_t start = ++i;
    while (i < q.size() && q[i] >= '0' && q[i] <= '9') ++i;
    if (i == start) return false;
  }
  const std::string suffix = q.substr(i);
  for (const char* s : {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E"}) {
    if (suffix == s) return true;
  }
  return false;
}

// A DNS-1123 label (a Kubernetes namespace): lower-case letters, digits and '-', starting and ending with a
// letter or digit, at most 63 characters.
bool IsDnsLabel(const std::string& v) {
  return !v.empty() && v.size() <= 63 && OnlyChars(v, "-") && v.front() != '-' && v.back() != '-' &&
         std::none_of(v.begin(), v.end(), [](char c) { return c >= 'A' && c <= 'Z'; });
}

// launcher.sbatch_args: a list of sbatch options, each written as its own #SBATCH line.
absl::Status ReadSbatchArgs(const YamlMap& m, const std::string& key, Launcher& l) {
  const YAML::Node n = m.Node(key);
  const std::string allowed = "a list of sbatch options, each one string starting with '-' (\"--account=proj\")";
  if (!n.IsSequence()) return m.Error(n, key, fl::StrCat("expected a list, got ", config::DescribeYaml(n)), allowed);
  l.sbatch_args.clear();
  for (const YAML::Node& item : n) {
    if (!item.IsScalar()) {
      return m.Error(item, key, fl::StrCat("expected a string, got ", config::DescribeYaml(item)), allowed);
    }
    const std::string& a = item.Scalar();
    if (a.empty() || a[0] != '-' || a.find_first_of("\n\r") != std::string::npos) {
      return m.Error(item, key, fl::StrCat("\"", a, "\" is not one sbatch option"), allowed);
    }
    // The launcher writes these itself from the manifest and the groups: a second value would contradict them.
    for (const char* own : {"--nodes", "-N", "--partition", "-p", "--time", "-t", "--output", "-o", "--job-name", "-J",
                            "--ntasks", "-n", "--wait", "-W"}) {
      const std::string_view o(own);
      if (a == o || (a.starts_with(o) && (a[o.size()] == '=' || (o.size() == 2 && o[1] != '-')))) {
        return m.Error(item, key,
                       fl::StrCat("\"", a, "\": fl-experiment writes ", own,
                                  " itself (launcher.nodes/partition/time, the output folder, the experiment's "
                                  "name, the groups' processes)"),
                       "other sbatch options; give nodes, partition and time as launcher keys");
      }
    }
    l.sbatch_args.push_back(a);
  }
  return absl::OkStatus();
}

std::string DefaultImage() { return fl::StrCat("fl-testbed:", FL_LIB_VERSION); }

const config::FieldTable<Launcher>& LauncherFields() {
  using L = Launcher;
  static const auto& table = *new config::FieldTable<L>{
      config::ChoiceField("kind", &L::kind, {"local", "slurm", "kubernetes"}),
      config::StringField("partition", &L::partition).Then([](const YamlMap& m, L& l) -> absl::Status {
        if (OnlyChars(l.partition, "_.-")) return absl::OkStatus();
        return m.Error(m.Node("partition"), "partition", fl::StrCat("partition name \"", l.partition, "\""),
                       "a Slurm partition name: letters, digits, '_', '.', '-' (sinfo lists them)");
      }),
      config::StringField("time", &L::time).Then([](const YamlMap& m, L& l) -> absl::Status {
        if (l.time.empty() || IsSlurmTime(l.time)) return absl::OkStatus();
        return m.Error(m.Node("time"), "time", fl::StrCat("\"", l.time, "\" is not a Slurm time limit"),
                       "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (sbatch --time)");
      }),
      config::IntField("nodes", &L::nodes, 0, kMaxManifestClients),
      config::CustomField<L>("sbatch_args", ReadSbatchArgs).Allowed("a list of sbatch options"),
      config::StringField("image", &L::image).Then([](const YamlMap& m, L& l) -> absl::Status {
        if (l.image.empty()) l.image = DefaultImage();
        if (OnlyChars(l.image, "_.-/:@")) return absl::OkStatus();
        return m.Error(m.Node("image"), "image", fl::StrCat("container image \"", l.image, "\""),
                       "an image reference: letters, digits, '_', '.', '-', '/', ':', '@' (fl-testbed:0.1.0)");
      }),
      config::StringField("namespace", &L::k8s_namespace).Then([](const YamlMap& m, L& l) -> absl::Status {
        if (IsDnsLabel(l.k8s_namespace)) return absl::OkStatus();
        return m.Error(m.Node("namespace"), "namespace", fl::StrCat("namespace \"", l.k8s_namespace, "\""),
                       "a Kubernetes namespace: lower-case letters, digits and '-', at most 63, starting and "
                       "ending with a letter or digit");
      }),
      config::StringField("storage", &L::storage).Then([](const YamlMap& m, L& l) -> absl::Status {
        if (IsStorageQuantity(l.storage)) return absl::OkStatus();
        return m.Error(m.Node("storage"), "storage", fl::StrCat("\"", l.storage, "\" is not a volume size"),
                       "a Kubernetes quantity: 1Gi, 500Mi, 10G");
      }),
  };
  return table;
}

// clients[i].device: a profile name, "host", or an inline map.
absl::Status ReadDevice(const Where& where, const YamlMap& m, const std::string& key, ClientGroup& g) {
  const YAML::Node n = m.Node(key);
  if (n.IsScalar()) {
    if (n.Scalar() == "host") return absl::OkStatus();  // the default
    // A name, not a path: "../../x" must not read files outside the profiles folder.
    if (std::optional<std::string> why = config::WhyNotASafeName(n.Scalar()); why.has_value()) {
      return m.Error(n, key, fl::StrCat("device profile name \"", n.Scalar(), "\" ", *why),
                     fl::StrCat("host, ", JoinNames(ProfileNames(where.devices)), ", or an inline map"));
    }
    const fs::path file = where.devices / fl::StrCat(n.Scalar(), ".yaml");
    if (!fs::exists(file)) {
      return m.Error(n, key, fl::StrCat("no device profile \"", n.Scalar(), "\" (looked for ", file.string(), ")"),
                     fl::StrCat("host, ", JoinNames(ProfileNames(where.devices)), ", or an inline map"));
    }
    absl::StatusOr<DeviceProfile> d = LoadDeviceProfile(file);
    // The profile's own error names the profile file; the manifest's line says which group asked for it.
    if (!d.ok()) return m.Error(n, key, fl::ToStd(d.status().message()));
    g.device = *d;
    return absl::OkStatus();
  }
  if (!n.IsMap()) {
    return m.Error(n, key, fl::StrCat("expected a profile name or a map, got ", config::DescribeYaml(n)),
                   fl::StrCat("host, a device profile name, or ", DeviceFields().Describe()));
  }
  absl::StatusOr<DeviceProfile> d =
      ParseDeviceProfile(YamlMap(n, m.file(), m.Path(key)), "inline", fl::StrCat("inline in ", m.file()));
  if (!d.ok()) return d.status();
  g.device = *d;
  return absl::OkStatus();
}

// clients[i].link: a profile name, "none", or an inline map. Sets the group's default link_kind.
absl::Status ReadLink(const Where& where, const YamlMap& m, const std::string& key, ClientGroup& g) {
  const YAML::Node n = m.Node(key);
  if (n.IsScalar()) {
    if (n.Scalar() == "none") return absl::OkStatus();  // the default: no emulation
    if (std::optional<std::string> why = config::WhyNotASafeName(n.Scalar()); why.has_value()) {
      return m.Error(n, key, fl::StrCat("link profile name \"", n.Scalar(), "\" ", *why),
                     fl::StrCat("none, ", JoinNames(ProfileNames(where.links)), ", or an inline map"));
    }
    const fs::path file = where.links / fl::StrCat(n.Scalar(), ".yaml");
    if (!fs::exists(file)) {
      return m.Error(n, key, fl::StrCat("no link profile \"", n.Scalar(), "\" (looked for ", file.string(), ")"),
                     fl::StrCat("none, ", JoinNames(ProfileNames(where.links)), ", or an inline map"));
    }
    absl::StatusOr<emulation::LinkProfile> l = emulation::LoadLinkProfile(file);
    // The profile's error names the profile (and its trace file); the manifest's line says who asked for it.
    if (!l.ok()) return m.Error(n, key, fl::ToStd(l.status().message()));
    g.link = *l;
    g.link_name = l->name;
  } else if (n.IsMap()) {
    absl::StatusOr<emulation::LinkProfile> l =
        emulation::ParseLinkProfile(n, emulation::YamlContext{m.file(), m.Path(key), where.base_dir});
    if (!l.ok()) return l.status();
    g.link = *l;
    g.link_name = l->name.empty() ? "inline" : l->name;
  } else {
    return m.Error(n, key, fl::StrCat("expected a profile name, none, or a map, got ", config::DescribeYaml(n)),
                   "none, a link profile name, or an inline link profile (docs/testbed.md)");
  }
  g.link_kind = LinkKindFromName(g.link_name);  // link_kind: below overrides it
  return absl::OkStatus();
}

config::FieldTable<ClientGroup> GroupFields(const Where& where) {
  using G = ClientGroup;
  return {
      config::StringField("name", &G::name).Then([](const YamlMap& m, G& g) -> absl::Status {
        // Clients are <name>-<i>: their log files and certificates are named so.
        const std::optional<std::string> why = config::WhyNotASafeName(g.name);
        if (!why.has_value()) return absl::OkStatus();
        return m.Error(m.Node("name"), "name", fl::StrCat("group name \"", g.name, "\" ", *why),
                       config::kSafeNameAllowed);
      }),
      config::IntField("count", &G::count, 1, kMaxManifestClients),
      config::CustomField<G>(
          "device", [where](const YamlMap& m, const std::string& key, G& g) { return ReadDevice(where, m, key, g); }),
      config::CustomField<G>(
          "link", [where](const YamlMap& m, const std::string& key, G& g) { return ReadLink(where, m, key, g); }),
      ClientSettingField<G>("link_kind", *client::FindClientSetting("link_kind"), &G::link_kind),
      ClientSettingField<G>("data_share", *client::FindClientSetting("data_fraction"), &G::data_share),
      config::NumberField("availability.start_delay_s", &G::start_delay_s, {0, 1e7}),
      config::NumberField("availability.leave_after_s", &G::leave_after_s, {0, 1e7}),
      config::NumberField("availability.period_s", &G::period_s, {0, 1e7}).NewInRecords(),
      config::NumberField("availability.online", &G::online_fraction, {1e-6, 1.0}).NewInRecords(),
      config::StringField("availability.trace", &G::availability_trace)
          .NewInRecords()
          .Then([where](const YamlMap& m, G& g) -> absl::Status {
            if (g.availability_trace.empty()) return absl::OkStatus();
            if (g.period_s > 0) {
              return m.Error(m.Node("trace"), "trace",
                             "a group has either a diurnal model (period_s) or a trace, not both; drop one");
            }
            // Relative to the manifest's folder; absolute, so that a replay from elsewhere finds the same file.
            std::error_code ec;
            fs::path path = where.base_dir / g.availability_trace;
            // Opened as fl-client will read it (a regular file, bounded), so that a FIFO or /dev/zero is refused
            // here, naming the manifest's line and the trace, rather than hanging a client mid-run.
            absl::StatusOr<sys::UserFile> file = sys::OpenUserFile(
                path.string(), "availability trace", kMaxAvailabilityTraceBytes,
                "an availability trace holds a few lines per client: check that this is the right file");
            if (!file.ok()) {
              return m.Error(m.Node("trace"), "trace",
                             fl::StrCat(fl::ToStd(file.status().message()),
                                        " (relative paths resolve against the manifest's folder; the format is in "
                                        "docs/testbed.md \"Availability\")"));
            }
            g.availability_trace = fs::absolute(path, ec).lexically_normal().string();
            return absl::OkStatus();
          }),
      config::NumberField("secagg_drop_after_shares", &G::secagg_drop_after_shares,
                          {.min = 0, .max = 1, .max_exclusive = true})
          .NewInRecords(),
      config::IntField("processes_per_node", &G::processes_per_node, 0, kMaxManifestClients).NewInRecords(),
      config::IntField("instances_per_process", &G::instances_per_process, 0, kMaxManifestClients).NewInRecords(),
      config::RecordField("link_name", &G::link_name),
  };
}

absl::Status ReadClients(const Where& where, const YamlMap& m, const std::string& key, Manifest& out) {
  absl::StatusOr<std::optional<std::vector<YamlMap>>> list = m.MapList(key, 1, "a non-empty list of client groups");
  if (!list.ok()) return list.status();
  const config::FieldTable<ClientGroup> fields = GroupFields(where);
  std::set<std::string> names;
  uint64_t total = 0;  // 64-bit and checked: the groups' counts must not wrap into a small number
  for (size_t i = 0; i < (*list)->size(); ++i) {
    const YamlMap& entry = (**list)[i];
    ClientGroup g;
    g.name = fl::StrCat("client", i == 0 ? "" : fl::StrCat("-g", i));
    g.device = HostDevice();
    g.link_kind = "ethernet";  // without a link
    FL_RETURN_IF_ERROR(fields.Read(entry, g));
    // A split group's processes would each count their own first ceil(F x n) instances as the dropping ones, not
    // the group's first ceil(F x count) clients.
    if (g.instances_per_process > 0 && g.instances_per_process < g.count && g.secagg_drop_after_shares > 0) {
      return entry.Error(
          entry.Node("instances_per_process"), "instances_per_process",
          fl::StrCat("group ", g.name, " splits its ", g.count, " clients over processes of ", g.instances_per_process,
                     " while secagg_drop_after_shares picks the group's first clients to drop"),
          "drop instances_per_process (one process for the group), or secagg_drop_after_shares");
    }
    if (!names.insert(g.name).second) {
      return entry.Error(entry.Node("name"), "name", fl::StrCat("group name \"", g.name, "\" is used twice"));
    }
    total += g.count;  // each count is at most kMaxManifestClients, and total never exceeds it below: no overflow
    if (total > kMaxManifestClients) {
      return entry.Error(
          entry.Node("count"), "count",
          fl::StrCat("the client groups up to this one add up to ", total, " clients, over the limit of ",
                     kMaxManifestClients, " clients in one experiment (", kMaxManifestClientsWhy, ")"),
          "fewer clients (lower count), or split the experiment");
    }
    out.clients.push_back(std::move(g));
  }
  return absl::OkStatus();
}

// `sink`: where the manifest's fl-server settings go (nullptr: the table is used for its keys and records only).
config::FieldTable<Manifest> ManifestFields(const Where& where, server::EngineConfig* sink) {
  std::vector<config::Field<Manifest>> fields = {
      // The run's output folder is out/<name>: a name, never a path (`name: ../../..`).
      config::StringField("name", &Manifest::name).Required().Then([](const YamlMap& m, Manifest& out) -> absl::Status {
        const std::optional<std::string> why = config::WhyNotASafeName(out.name);
        if (!why.has_value()) return absl::OkStatus();
        return m.Error(m.Node("name"), "name", fl::StrCat("experiment name \"", out.name, "\" ", *why),
                       config::kSafeNameAllowed);
      }),
      config::StringField("description", &Manifest::description).NewInRecords(),
      config::RecordField("path", &Manifest::path).NewInRecords(),
      config::SectionField("server", &Manifest::server, ServerFields(sink)).Required(),
      config::SectionField("training", &Manifest::training, TrainingFields(sink)),
      // codecs: holds fl-server settings only.
      config::CustomField<Manifest>("codecs",
                                    [sink](const YamlMap& m, const std::string& key, Manifest& out) -> absl::Status {
                                      const config::FieldTable<Manifest> codecs(
                                          SettingFields<Manifest>("codecs", sink));
                                      absl::StatusOr<std::optional<YamlMap>> map = m.Map(key, codecs.Describe());
                                      if (!map.ok()) return map.status();
                                      return codecs.Read(**map, out);
                                    }),
      config::SectionField("emulation", &Manifest::emulation, EmulationFields()),
      config::SectionField("security", &Manifest::security, SecurityFields()),
      // Recorded by hand (sbatch_args is a list): ResolvedManifestJson, ManifestFromResolvedJson.
      config::SectionField("launcher", &Manifest::launcher, LauncherFields()).NotRecorded(),
      config::CustomField<Manifest>("clients", [where](const YamlMap& m, const std::string& key,
                                                       Manifest& out) { return ReadClients(where, m, key, out); })
          .Required()
          .Allowed("a non-empty list of client groups"),
  };
  // The manifest's own settings (seed), after its description.
  std::vector<config::Field<Manifest>> own = SettingFields<Manifest>("", sink);
  fields.insert(fields.begin() + 2, own.begin(), own.end());
  return config::FieldTable<Manifest>(std::move(fields));
}

// JSON of a setting's value in the manifest's unit (the resolved manifest's form: seconds for round_deadline_s).
nlohmann::json ManifestJsonValue(const server::Setting& s, const server::EngineConfig& c) {
  const std::string text = s.get(c);
  if (s.type == server::SettingType::kString) return text;
  if (s.type == server::SettingType::kUnsigned && s.manifest_scale == 1) return std::stoull(text);
  return s.ToManifestUnit(std::stod(text));
}

// The settings' part of a resolved manifest: "server.selection.fraction_fit" is j["server"]["fraction_fit"] (its
// record name in its section), "seed" is j["seed"].
nlohmann::json* SettingJsonSection(nlohmann::json& j, const server::Setting& s) {
  const size_t dot = s.manifest.find('.');
  if (dot == std::string::npos) return &j;
  nlohmann::json& section = j[s.manifest.substr(0, dot)];
  if (section.is_null()) section = nlohmann::json::object();
  return &section;
}

// The recorded fields of `v` as a JSON object.
template <typename T>
nlohmann::json ToRecord(const config::FieldTable<T>& table, const T& v) {
  nlohmann::json j = nlohmann::json::object();
  table.VisitRecorded(v, [&](const config::Field<T>& f, const auto& value) { j[f.name] = value; });
  return j;
}

// The inverse of ToRecord; throws nlohmann::json::exception for a missing or mistyped field.
template <typename T>
void FromRecord(const nlohmann::json& j, const config::FieldTable<T>& table, T& v) {
  table.VisitRecorded(v, [&](const config::Field<T>& f, auto& value) {
    if (!f.in_old_records && !j.contains(f.name)) return;  // recorded before the field existed: its default
    value = j.at(f.name).template get<std::decay_t<decltype(value)>>();
  });
}

// The inverse of the settings' part of ResolvedManifestJson. A setting a record lacks (recorded before it was in
// manifests) keeps its default, as does the 0 or "" older records wrote for "fl-server's default".
absl::Status SettingsFromRecord(const nlohmann::json& j, server::EngineConfig& settings) {
  for (const server::Setting& s : server::Settings()) {
    if (s.manifest.empty()) continue;
    const size_t dot = s.manifest.find('.');
    const nlohmann::json* section = &j;
    if (dot != std::string::npos) {
      const std::string name = s.manifest.substr(0, dot);
      if (!j.contains(name)) continue;
      section = &j.at(name);
    }
    if (!section->contains(s.manifest_record)) {
      if (s.in_old_manifest_records && s.manifest_required) {
        return absl::DataLossError(fl::StrCat("the recorded manifest lacks ", s.manifest));
      }
      continue;
    }
    const nlohmann::json& v = section->at(s.manifest_record);
    std::string text;
    if (s.type == server::SettingType::kString) {
      text = v.get<std::string>();
      if (s.old_zero_is_default && text.empty()) continue;
    } else if (s.type == server::SettingType::kUnsigned && s.manifest_scale == 1) {
      text = std::to_string(v.get<uint64_t>());
      if (s.old_zero_is_default && text == "0") continue;
    } else {
      const double value = v.get<double>();
      if (s.old_zero_is_default && value == 0) continue;
      absl::StatusOr<std::string> checked = server::CheckManifestNumber(s, value, "the recorded manifest");
      if (!checked.ok()) return checked.status();
      text = *checked;
    }
    absl::StatusOr<std::string> checked = server::CheckSettingValue(s, text, "the recorded manifest");
    if (!checked.ok()) return checked.status();
    s.set(settings, *checked);
  }
  return absl::OkStatus();
}

}  // namespace

bool RunSettings::operator==(const RunSettings& other) const {
  for (const server::Setting& s : server::Settings()) {
    if (s.get(*this) != s.get(other)) return false;
  }
  return true;
}

client::ClientSettings ClientSettingsFor(const Manifest& m, const ClientGroup& g) {
  client::ClientSettings s = m.training;
  s.link_kind = g.link_kind;
  s.data_fraction = g.data_share;
  return s;
}

uint64_t Manifest::num_clients() const {
  // At most kMaxManifestClients after a load; 64-bit and saturating for a Manifest built in code.
  uint64_t n = 0;
  for (const auto& g : clients) n = n > UINT64_MAX - g.count ? UINT64_MAX : n + g.count;
  return n;
}

std::vector<std::string> Manifest::client_names() const {
  std::vector<std::string> names;
  for (const ClientGroup& g : clients) {
    for (uint32_t i = 0; i < g.count; ++i) names.push_back(fl::StrCat(g.name, "-", i));
  }
  return names;
}

absl::Status CheckPkiDir(const std::string& pki_dir, const std::vector<std::string>& client_names) {
  auto missing = [&](const fs::path& file, const std::string& how) -> absl::Status {
    std::error_code ec;
    if (fs::is_regular_file(file, ec)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        fl::StrCat("security.pki_dir ", pki_dir, ": ", file.string(), " is missing; ", how));
  };
  const fs::path dir(pki_dir);
  const std::string init = fl::StrCat("make the directory with fl-provision init --dir ", pki_dir,
                                      " --server-ip 127.0.0.1 --server-name localhost");
  FL_RETURN_IF_ERROR(missing(dir / "ca" / "ca.crt", init));
  // fl-server checks every call against the CA's revocation list (--tls-crl), so that fl-provision revoke cuts
  // a client off mid-run.
  FL_RETURN_IF_ERROR(missing(dir / "ca" / "crl.pem", init));
  for (const char* ext : {".crt", ".key"}) {
    FL_RETURN_IF_ERROR(missing(dir / "server" / fl::StrCat("server", ext),
                               fl::StrCat("fl-experiment serves with the certificate named 'server' (", init,
                                          ", or fl-provision add-server server --dir ", pki_dir, " --ip 127.0.0.1)")));
  }
  for (const std::string& name : client_names) {
    for (const char* ext : {".crt", ".key"}) {
      FL_RETURN_IF_ERROR(missing(dir / "clients" / fl::StrCat(name, ext),
                                 fl::StrCat("every client needs a certificate under its name: fl-provision "
                                            "add-client ",
                                            name, " --dir ", pki_dir)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceProfile> LoadDeviceProfile(const fs::path& path) {
  absl::StatusOr<YAML::Node> root = config::LoadYamlFile(path, "device profile");
  if (!root.ok()) return root.status();
  return ParseDeviceProfile(YamlMap(*root, path.string(), ""), path.stem().string(), path.string());
}

absl::StatusOr<fs::path> ExperimentOutputDir(const fs::path& out_root, const std::string& name,
                                             const std::string& suffix) {
  if (std::optional<std::string> why = config::WhyNotASafeName(name); why.has_value()) {
    return absl::InvalidArgumentError(fl::StrCat("experiment name \"", name, "\" ", *why,
                                                 "; it names the output folder under ", out_root.string(),
                                                 ". Allowed: ", config::kSafeNameAllowed));
  }
  std::error_code ec;
  const fs::path root = fs::absolute(out_root, ec).lexically_normal();
  const fs::path dir = (root / fl::StrCat(name, suffix)).lexically_normal();
  // Belt and braces over the name check: the folder is one level below the root, never elsewhere.
  if (ec || dir.parent_path() != root.lexically_normal() || dir.filename().string() != fl::StrCat(name, suffix)) {
    return absl::InvalidArgumentError(fl::StrCat("experiment name \"", name, "\": the output folder ", dir.string(),
                                                 " is not inside ", root.string()));
  }
  return out_root / fl::StrCat(name, suffix);
}

absl::StatusOr<Manifest> LoadManifest(const fs::path& path, const ManifestOptions& options) {
  absl::StatusOr<std::string> text = config::ReadTextFile(path, "manifest");
  if (!text.ok()) return text.status();
  // "x.yaml" has no parent path: its folder is the current one (fs::absolute("") throws).
  const fs::path base_dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  absl::StatusOr<Manifest> m = ParseManifest(*text, path.string(), base_dir, options);
  if (m.ok()) m->path = fs::absolute(path).string();
  return m;
}

absl::StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& file, const fs::path& base_dir,
                                       const ManifestOptions& options) {
  absl::StatusOr<YAML::Node> root_node = config::ParseYaml(text, file);
  if (!root_node.ok()) return root_node.status();
  const YamlMap root(*root_node, file, "");
  const fs::path profiles = options.profiles_dir.empty() ? DefaultProfilesDir(base_dir) : options.profiles_dir;
  Manifest m;
  m.path = file;
  m.source_yaml = text;
  FL_RETURN_IF_ERROR(
      ManifestFields(Where{profiles / "links", profiles / "devices", base_dir}, &m.settings).Read(root, m));
  const server::SelectionPolicy& fit = m.settings.fit;
  if (fit.min_available > m.num_clients() || fit.min_clients > m.num_clients()) {
    return root.Error(
        root.Node("server"), "server.selection",
        fl::StrCat("asks for min_available_clients ", fit.min_available, " / min_fit_clients ", fit.min_clients,
                   " but the manifest has only ", m.num_clients(), " clients; lower them or add clients"));
  }
  if (m.settings.train.local_epochs() == 0 && m.settings.train.local_steps() == 0) {
    return root.Error(root.Node("training"), "training.local_epochs", "local_epochs and local_steps cannot both be 0");
  }
  if (m.launcher.image.empty()) m.launcher.image = DefaultImage();
  if (!m.security.pki_dir.empty()) {
    // Checked now, with the manifest's line, rather than as a client failing its handshake mid-run.
    if (absl::Status s = CheckPkiDir(m.security.pki_dir, m.client_names()); !s.ok()) {
      const YamlMap security(root.Node("security"), file, "security");
      return security.Error(security.Node("pki_dir"), "pki_dir", std::string(s.message()));
    }
  }
  return m;
}

std::string ResolvedManifestJson(const Manifest& m) {
  nlohmann::json j = ToRecord(ManifestFields({}, nullptr), m);
  j["server"] = ToRecord(ServerFields(nullptr), m.server);
  j["training"] = ToRecord(TrainingFields(nullptr), m.training);
  j["codecs"] = nlohmann::json::object();
  for (const server::Setting& s : server::Settings()) {
    if (!s.manifest.empty()) (*SettingJsonSection(j, s))[s.manifest_record] = ManifestJsonValue(s, m.settings);
  }
  j["emulation"] = ToRecord(EmulationFields(), m.emulation);
  j["security"] = ToRecord(SecurityFields(), m.security);
  j["launcher"] = ToRecord(LauncherFields(), m.launcher);
  j["launcher"]["sbatch_args"] = m.launcher.sbatch_args;
  j["clients"] = nlohmann::json::array();
  const config::FieldTable<ClientGroup> group_fields = GroupFields({});
  for (const ClientGroup& g : m.clients) {
    nlohmann::json c = ToRecord(group_fields, g);
    c["slowdown"] = SlowdownFor(m, g.device);  // derived; for readers of the record, not read back
    c["device"] = ToRecord(DeviceFields(), g.device);
    c["link"] = g.link.has_value() ? nlohmann::json(emulation::LinkProfileToYaml(*g.link)) : nlohmann::json(nullptr);
    j["clients"].push_back(std::move(c));
  }
  // A manifest's strings are whatever bytes the YAML held: bytes that are not UTF-8 are written as U+FFFD rather
  // than throwing out of fl-experiment (found by experiments_manifest_fuzz_test).
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<Manifest> ManifestFromResolvedJson(const std::string& json, const std::string& source_yaml) {
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    Manifest m;
    m.source_yaml = source_yaml;
    FromRecord(j, ManifestFields({}, nullptr), m);
    FromRecord(j.at("server"), ServerFields(nullptr), m.server);
    FromRecord(j.at("training"), TrainingFields(nullptr), m.training);
    if (absl::Status s = SettingsFromRecord(j, m.settings); !s.ok()) return s;
    FromRecord(j.at("emulation"), EmulationFields(), m.emulation);
    // Recorded before emulation.devices existed: those runs slowed devices by the duty cycle only.
    if (!j.at("emulation").contains("devices")) m.emulation.devices = "duty-cycle";
    // Recorded before the security section existed: the default, mutual TLS with a throwaway CA. Those runs
    // were plaintext, but a replay is no reason to serve a model in the clear; the outcomes do not depend on it.
    if (j.contains("security")) FromRecord(j.at("security"), SecurityFields(), m.security);
    // Recorded before the launcher block existed: those ran here, on the defaults.
    if (j.contains("launcher")) {
      FromRecord(j.at("launcher"), LauncherFields(), m.launcher);
      m.launcher.sbatch_args = j.at("launcher").at("sbatch_args").get<std::vector<std::string>>();
    }
    const config::FieldTable<ClientGroup> group_fields = GroupFields({});
    for (const auto& c : j.at("clients")) {
      ClientGroup g;
      FromRecord(c, group_fields, g);
      FromRecord(c.at("device"), DeviceFields(), g.device);
      if (!c.at("link").is_null()) {
        absl::StatusOr<YAML::Node> node = config::ParseYaml(c.at("link").get<std::string>(), "recorded link profile");
        if (!node.ok()) return node.status();
        absl::StatusOr<emulation::LinkProfile> l =
            emulation::ParseLinkProfile(*node, emulation::YamlContext{"recorded manifest", g.name + ".link", "/"});
        if (!l.ok()) return l.status();
        g.link = *l;
      }
      m.clients.push_back(std::move(g));
    }
    return m;
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(fl::StrCat("the recorded manifest (resolved_json) cannot be read: ", e.what(),
                                          "; it was written by an incompatible build"));
  }
}

double SlowdownFor(const Manifest& manifest, const DeviceProfile& device) {
  if (device.is_host) return 1.0;
  return std::max(1.0, manifest.emulation.host_relative_speed / device.relative_speed);
}

}  // namespace fl::experiment
