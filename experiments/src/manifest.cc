#include "fl/experiment/manifest.h"

#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fl/core/model_file.h"
#include "fl/core/str_cat.h"
#include "fl/experiment/yaml_fields.h"

namespace fl::experiment {
namespace {

namespace fs = std::filesystem;

// Assigns an optional parsed value, passing errors up: ASSIGN_OR_RETURN without the macro.
template <typename T, typename U>
absl::Status Set(absl::StatusOr<std::optional<T>> v, U* out) {
  if (!v.ok()) return v.status();
  if (v->has_value()) *out = static_cast<U>(**v);
  return absl::OkStatus();
}

#define FL_RETURN_IF_ERROR(expr)              \
  do {                                        \
    if (absl::Status s_ = (expr); !s_.ok()) { \
      return s_;                              \
    }                                         \
  } while (0)

absl::StatusOr<YAML::Node> ParseYaml(const std::string& text, const std::string& file) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        fl::StrCat(file, ":", e.mark.line + 1, ": not valid YAML: ", e.msg, "; fix the syntax and run again"));
  }
}

absl::StatusOr<std::string> ReadFile(const fs::path& path, std::string_view what) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(fl::StrCat(what, " ", path.string(), " cannot be read (missing or not readable)"));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

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
  std::string out;
  for (const auto& n : names) out = out.empty() ? n : fl::StrCat(out, ", ", n);
  return out.empty() ? "(none)" : out;
}

absl::StatusOr<DeviceProfile> ParseDeviceProfile(const YamlMap& m, const std::string& default_name,
                                                 const std::string& source) {
  FL_RETURN_IF_ERROR(m.Check({"name", "description", "device_class", "relative_speed", "cores", "memory_mb",
                              "reference"}));
  DeviceProfile d;
  d.name = default_name;
  d.source = source;
  FL_RETURN_IF_ERROR(Set(m.String("name"), &d.name));
  FL_RETURN_IF_ERROR(Set(m.String("description"), &d.description));
  FL_RETURN_IF_ERROR(Set(m.String("device_class"), &d.device_class));
  FL_RETURN_IF_ERROR(m.Required("relative_speed"));
  FL_RETURN_IF_ERROR(Set(m.Number("relative_speed", 1e-3, 1e6), &d.relative_speed));
  FL_RETURN_IF_ERROR(Set(m.Integer("cores", 0, 4096), &d.cores));
  FL_RETURN_IF_ERROR(Set(m.Integer("memory_mb", 0, int64_t{1} << 40), &d.memory_mb));
  FL_RETURN_IF_ERROR(Set(m.String("reference"), &d.reference));
  if (d.device_class.empty()) d.device_class = d.name;
  return d;
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

absl::Status ParseServer(const YamlMap& m, Manifest::Server* s) {
  FL_RETURN_IF_ERROR(m.Check({"strategy", "rounds", "round_deadline_s", "selection", "evaluation",
                              "max_round_attempts", "metrics_addr", "upload_slots"}));
  FL_RETURN_IF_ERROR(Set(m.Integer("upload_slots", 1, 100'000), &s->upload_slots));
  FL_RETURN_IF_ERROR(Set(m.String("metrics_addr"), &s->metrics_addr));
  if (m.Has("strategy")) {
    const YAML::Node n = m.Node("strategy");
    if (n.IsScalar()) {
      s->strategy = n.Scalar();
    } else {
      absl::StatusOr<std::optional<YamlMap>> sm = m.Map("strategy");
      if (!sm.ok()) return sm.status();
      const YamlMap& st = **sm;
      FL_RETURN_IF_ERROR(st.Check({"name", "options"}));
      FL_RETURN_IF_ERROR(st.Required("name"));
      FL_RETURN_IF_ERROR(Set(st.String("name"), &s->strategy));
      if (st.Has("options")) {
        absl::StatusOr<std::optional<YamlMap>> om = st.Map("options");
        if (!om.ok()) return om.status();
        std::string opts;
        const YAML::Node on = st.Node("options");
        for (auto it = on.begin(); it != on.end(); ++it) {
          absl::StatusOr<std::optional<double>> v = (*om)->Number(it->first.Scalar(), -1e12, 1e12);
          if (!v.ok()) return v.status();
          opts = fl::StrCat(opts, opts.empty() ? "" : ",", it->first.Scalar(), "=", it->second.Scalar());
        }
        if (!opts.empty()) s->strategy = fl::StrCat(s->strategy, ":", opts);
      }
    }
  }
  FL_RETURN_IF_ERROR(m.Required("rounds"));
  FL_RETURN_IF_ERROR(Set(m.Integer("rounds", 1, 1'000'000), &s->rounds));
  FL_RETURN_IF_ERROR(Set(m.Number("round_deadline_s", 0.001, 1e7), &s->round_deadline_s));
  FL_RETURN_IF_ERROR(Set(m.Integer("max_round_attempts", 1, 1000), &s->max_round_attempts));
  absl::StatusOr<std::optional<YamlMap>> sel = m.Map("selection");
  if (!sel.ok()) return sel.status();
  if (sel->has_value()) {
    const YamlMap& x = **sel;
    FL_RETURN_IF_ERROR(x.Check({"fraction_fit", "min_fit_clients", "min_available_clients"}));
    FL_RETURN_IF_ERROR(Set(x.Number("fraction_fit", 0.0, 1.0), &s->fraction_fit));
    FL_RETURN_IF_ERROR(Set(x.Integer("min_fit_clients", 1, 1'000'000), &s->min_fit_clients));
    FL_RETURN_IF_ERROR(Set(x.Integer("min_available_clients", 1, 1'000'000), &s->min_available_clients));
  }
  absl::StatusOr<std::optional<YamlMap>> ev = m.Map("evaluation");
  if (!ev.ok()) return ev.status();
  if (ev->has_value()) {
    const YamlMap& x = **ev;
    FL_RETURN_IF_ERROR(x.Check({"every", "fraction"}));
    FL_RETURN_IF_ERROR(Set(x.Integer("every", 0, 1'000'000), &s->evaluate_every));
    FL_RETURN_IF_ERROR(Set(x.Number("fraction", 0.0, 1.0), &s->fraction_evaluate));
  }
  return absl::OkStatus();
}

absl::Status ParseTraining(const YamlMap& m, Manifest::Training* t) {
  FL_RETURN_IF_ERROR(m.Check({"model", "dataset", "data_dir", "data", "task", "buffers", "seq_len", "partition",
                              "local_epochs", "local_steps", "batch_size", "optimizer", "lr", "momentum",
                              "weight_decay", "proximal_mu", "threads"}));
  FL_RETURN_IF_ERROR(Set(m.String("model"), &t->model));
  const bool script_model = core::IsTorchScriptModelPath(t->model);
  if (script_model) {
    std::error_code ec;
    if (!fs::is_regular_file(t->model, ec)) {
      return m.Error(m.Node("model"), "model",
                     fl::StrCat("TorchScript model file \"", t->model, "\" not found (relative paths resolve against ",
                                fs::current_path(ec).string(), "); export it first (examples/bring-your-own-model)"));
    }
    t->model = fs::absolute(t->model, ec).lexically_normal().string();
  } else if (t->model != "cnn" && t->model != "squeezenet" && t->model.rfind("synthetic:", 0) != 0) {
    return m.Error(m.Node("model"), "model",
                   fl::StrCat("unknown model \"", t->model,
                              "\"; allowed: cnn, squeezenet, synthetic:<P>[:<train_ms>], or the path of a TorchScript "
                              ".pt file"));
  }
  std::string dataset = "fashion-mnist";
  FL_RETURN_IF_ERROR(Set(m.Choice("dataset", {"fashion-mnist"}), &dataset));
  FL_RETURN_IF_ERROR(Set(m.String("data_dir"), &t->data_dir));
  FL_RETURN_IF_ERROR(Set(m.String("data"), &t->data));
  if (!t->data.empty()) {
    std::error_code ec;
    if (!fs::exists(t->data, ec)) {
      return m.Error(m.Node("data"), "data",
                     fl::StrCat("data \"", t->data, "\" not found (relative paths resolve against ",
                                fs::current_path(ec).string(), "); give a .npz, an IDX directory or a text corpus"));
    }
    if (!script_model) {
      return m.Error(m.Node("data"), "data",
                     fl::StrCat("data is for TorchScript models; the built-in model \"", t->model,
                                "\" trains on Fashion-MNIST (data_dir)"));
    }
    t->data = fs::absolute(t->data, ec).lexically_normal().string();
  }
  FL_RETURN_IF_ERROR(Set(m.Choice("task", {"classification", "regression", "next-token"}), &t->task));
  if (!script_model && t->task != "classification") {
    return m.Error(m.Node("task"), "task",
                   fl::StrCat("the built-in model \"", t->model, "\" is a classifier; task ", t->task,
                              " needs a TorchScript model (model: path.pt)"));
  }
  FL_RETURN_IF_ERROR(Set(m.Choice("buffers", {"average", "local"}), &t->buffers));
  FL_RETURN_IF_ERROR(Set(m.Integer("seq_len", 1, 1'000'000), &t->seq_len));
  FL_RETURN_IF_ERROR(Set(m.String("partition"), &t->partition));
  const std::string& p = t->partition;
  if (p != "iid" && p != "natural" && p.rfind("dirichlet:", 0) != 0 && p.rfind("shards:", 0) != 0) {
    return m.Error(m.Node("partition"), "partition",
                   fl::StrCat("unknown partition \"", p, "\"; allowed: iid, dirichlet:<alpha>, shards:<n>, natural"));
  }
  FL_RETURN_IF_ERROR(Set(m.Integer("local_epochs", 0, 10'000), &t->local_epochs));
  FL_RETURN_IF_ERROR(Set(m.Integer("local_steps", 0, 100'000'000), &t->local_steps));
  if (t->local_epochs == 0 && t->local_steps == 0) {
    return m.Error(m.Node("local_epochs"), "local_epochs", "local_epochs and local_steps cannot both be 0");
  }
  FL_RETURN_IF_ERROR(Set(m.Integer("batch_size", 1, 1'000'000), &t->batch_size));
  FL_RETURN_IF_ERROR(Set(m.Choice("optimizer", {"sgd", "adamw"}), &t->optimizer));
  FL_RETURN_IF_ERROR(Set(m.Number("lr", 1e-12, 100), &t->lr));
  FL_RETURN_IF_ERROR(Set(m.Number("momentum", 0, 0.999999), &t->momentum));
  FL_RETURN_IF_ERROR(Set(m.Number("weight_decay", 0, 100), &t->weight_decay));
  FL_RETURN_IF_ERROR(Set(m.Number("proximal_mu", 0, 1e6), &t->proximal_mu));
  FL_RETURN_IF_ERROR(Set(m.Integer("threads", 0, 1024), &t->threads));
  return absl::OkStatus();
}

struct ProfileDirs {
  fs::path links;
  fs::path devices;
};

absl::StatusOr<ClientGroup> ParseGroup(const YamlMap& m, size_t index,
                                       const ProfileDirs& dirs, const fs::path& base_dir) {
  FL_RETURN_IF_ERROR(m.Check({"name", "count", "device", "link", "link_kind", "data_share", "availability"}));
  ClientGroup g;
  g.name = fl::StrCat("client", index == 0 ? "" : fl::StrCat("-g", index));
  FL_RETURN_IF_ERROR(Set(m.String("name"), &g.name));
  if (g.name.empty() || g.name.find_first_of(" /\t") != std::string::npos) {
    return m.Error(m.Node("name"), "name", "must be non-empty without spaces or slashes (clients are <name>-<i>)");
  }
  FL_RETURN_IF_ERROR(Set(m.Integer("count", 1, 100'000), &g.count));
  // Device: a profile name, "host", or an inline map.
  g.device = HostDevice();
  if (m.Has("device")) {
    const YAML::Node n = m.Node("device");
    if (n.IsScalar() && n.Scalar() != "host") {
      const fs::path file = dirs.devices / fl::StrCat(n.Scalar(), ".yaml");
      if (!fs::exists(file)) {
        return m.Error(n, "device",
                       fl::StrCat("no device profile \"", n.Scalar(), "\" (looked for ", file.string(),
                                  "); known: host, ", JoinNames(ProfileNames(dirs.devices))));
      }
      absl::StatusOr<DeviceProfile> d = LoadDeviceProfile(file);
      if (!d.ok()) return d.status();
      g.device = *d;
    } else if (n.IsMap()) {
      absl::StatusOr<DeviceProfile> d =
          ParseDeviceProfile(YamlMap(n, m.file(), m.Path("device")), "inline", fl::StrCat("inline in ", m.file()));
      if (!d.ok()) return d.status();
      g.device = *d;
    } else if (!n.IsScalar()) {
      return m.Error(n, "device", fl::StrCat("expected a profile name or a map, got ", DescribeYaml(n)));
    }
  }
  // Link: a profile name, "none", or an inline map.
  if (m.Has("link")) {
    const YAML::Node n = m.Node("link");
    if (n.IsScalar() && n.Scalar() != "none") {
      const fs::path file = dirs.links / fl::StrCat(n.Scalar(), ".yaml");
      if (!fs::exists(file)) {
        return m.Error(n, "link",
                       fl::StrCat("no link profile \"", n.Scalar(), "\" (looked for ", file.string(),
                                  "); known: none, ", JoinNames(ProfileNames(dirs.links))));
      }
      absl::StatusOr<emulation::LinkProfile> l = emulation::LoadLinkProfile(file);
      if (!l.ok()) return l.status();
      g.link = *l;
      g.link_name = l->name;
    } else if (n.IsMap()) {
      absl::StatusOr<emulation::LinkProfile> l =
          emulation::ParseLinkProfile(n, emulation::YamlContext{m.file(), m.Path("link"), base_dir});
      if (!l.ok()) return l.status();
      g.link = *l;
      g.link_name = l->name.empty() ? "inline" : l->name;
    } else if (!n.IsScalar()) {
      return m.Error(n, "link", fl::StrCat("expected a profile name, none, or a map, got ", DescribeYaml(n)));
    }
  }
  g.link_kind = g.link_name.empty() ? "ethernet" : LinkKindFromName(g.link_name);
  FL_RETURN_IF_ERROR(Set(m.Choice("link_kind", {"ethernet", "wifi", "5g", "other"}), &g.link_kind));
  FL_RETURN_IF_ERROR(Set(m.Number("data_share", 1e-6, 1.0), &g.data_share));
  absl::StatusOr<std::optional<YamlMap>> av = m.Map("availability");
  if (!av.ok()) return av.status();
  if (av->has_value()) {
    const YamlMap& a = **av;
    FL_RETURN_IF_ERROR(a.Check({"start_delay_s", "leave_after_s"}));
    FL_RETURN_IF_ERROR(Set(a.Number("start_delay_s", 0, 1e7), &g.start_delay_s));
    FL_RETURN_IF_ERROR(Set(a.Number("leave_after_s", 0, 1e7), &g.leave_after_s));
  }
  return g;
}

}  // namespace

uint32_t Manifest::num_clients() const {
  uint32_t n = 0;
  for (const auto& g : clients) n += g.count;
  return n;
}

absl::StatusOr<DeviceProfile> LoadDeviceProfile(const fs::path& path) {
  absl::StatusOr<std::string> text = ReadFile(path, "device profile");
  if (!text.ok()) return text.status();
  absl::StatusOr<YAML::Node> root = ParseYaml(*text, path.string());
  if (!root.ok()) return root.status();
  return ParseDeviceProfile(YamlMap(*root, path.string(), ""), path.stem().string(), path.string());
}

absl::StatusOr<Manifest> LoadManifest(const fs::path& path, const ManifestOptions& options) {
  absl::StatusOr<std::string> text = ReadFile(path, "manifest");
  if (!text.ok()) return text.status();
  absl::StatusOr<Manifest> m = ParseManifest(*text, path.string(), path.parent_path(), options);
  if (m.ok()) m->path = fs::absolute(path).string();
  return m;
}

absl::StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& file, const fs::path& base_dir,
                                       const ManifestOptions& options) {
  absl::StatusOr<YAML::Node> root_node = ParseYaml(text, file);
  if (!root_node.ok()) return root_node.status();
  const YamlMap root(*root_node, file, "");
  FL_RETURN_IF_ERROR(root.Check({"name", "description", "seed", "server", "training", "codecs", "emulation",
                                 "clients"}));
  Manifest m;
  m.path = file;
  m.source_yaml = text;
  FL_RETURN_IF_ERROR(root.Required("name"));
  FL_RETURN_IF_ERROR(Set(root.String("name"), &m.name));
  FL_RETURN_IF_ERROR(Set(root.String("description"), &m.description));
  FL_RETURN_IF_ERROR(Set(root.Integer("seed", 0, INT64_MAX), &m.seed));

  FL_RETURN_IF_ERROR(root.Required("server"));
  absl::StatusOr<std::optional<YamlMap>> server = root.Map("server");
  if (!server.ok()) return server.status();
  FL_RETURN_IF_ERROR(ParseServer(**server, &m.server));

  absl::StatusOr<std::optional<YamlMap>> training = root.Map("training");
  if (!training.ok()) return training.status();
  if (training->has_value()) FL_RETURN_IF_ERROR(ParseTraining(**training, &m.training));

  absl::StatusOr<std::optional<YamlMap>> codecs = root.Map("codecs");
  if (!codecs.ok()) return codecs.status();
  if (codecs->has_value()) {
    const YamlMap& c = **codecs;
    FL_RETURN_IF_ERROR(c.Check({"uplink", "downlink"}));
    FL_RETURN_IF_ERROR(Set(c.Choice("uplink", {"fp32", "fp16", "bf16", "int8", "int4", "fp4", "sign1"}),
                           &m.codecs.uplink));
    FL_RETURN_IF_ERROR(Set(c.Choice("downlink", {"fp32", "fp16", "bf16", "int8", "int4", "fp4"}),
                           &m.codecs.downlink));
  }

  absl::StatusOr<std::optional<YamlMap>> emu = root.Map("emulation");
  if (!emu.ok()) return emu.status();
  if (emu->has_value()) {
    const YamlMap& e = **emu;
    FL_RETURN_IF_ERROR(e.Check({"backend", "host_relative_speed"}));
    FL_RETURN_IF_ERROR(Set(e.Choice("backend", {"auto", "none", "userspace", "kernel"}), &m.emulation.backend));
    FL_RETURN_IF_ERROR(Set(e.Number("host_relative_speed", 1e-3, 1e6), &m.emulation.host_relative_speed));
  }

  const fs::path profiles = options.profiles_dir.empty() ? DefaultProfilesDir(base_dir) : options.profiles_dir;
  const ProfileDirs dirs{profiles / "links", profiles / "devices"};
  FL_RETURN_IF_ERROR(root.Required("clients"));
  const YAML::Node clients = root.Node("clients");
  if (!clients.IsSequence() || clients.size() == 0) {
    return root.Error(clients, "clients", fl::StrCat("expected a non-empty list of client groups, got ",
                                                     DescribeYaml(clients)));
  }
  std::set<std::string> names;
  for (size_t i = 0; i < clients.size(); ++i) {
    const YamlMap g(clients[i], file, fl::StrCat("clients[", i, "]"));
    absl::StatusOr<ClientGroup> group = ParseGroup(g, i, dirs, base_dir);
    if (!group.ok()) return group.status();
    if (!names.insert(group->name).second) {
      return g.Error(g.Node("name"), "name", fl::StrCat("group name \"", group->name, "\" is used twice"));
    }
    m.clients.push_back(std::move(*group));
  }
  if (m.server.min_available_clients > m.num_clients() || m.server.min_fit_clients > m.num_clients()) {
    return root.Error(root.Node("server"), "server.selection",
                      fl::StrCat("asks for min_available_clients ", m.server.min_available_clients,
                                 " / min_fit_clients ", m.server.min_fit_clients, " but the manifest has only ",
                                 m.num_clients(), " clients; lower them or add clients"));
  }
  return m;
}

std::string ResolvedManifestJson(const Manifest& m) {
  nlohmann::json j;
  j["name"] = m.name;
  j["description"] = m.description;
  j["seed"] = m.seed;
  j["path"] = m.path;
  j["server"] = {{"strategy", m.server.strategy},
                 {"rounds", m.server.rounds},
                 {"round_deadline_s", m.server.round_deadline_s},
                 {"fraction_fit", m.server.fraction_fit},
                 {"min_fit_clients", m.server.min_fit_clients},
                 {"min_available_clients", m.server.min_available_clients},
                 {"evaluate_every", m.server.evaluate_every},
                 {"fraction_evaluate", m.server.fraction_evaluate},
                 {"max_round_attempts", m.server.max_round_attempts},
                 {"metrics_addr", m.server.metrics_addr},
                 {"upload_slots", m.server.upload_slots}};
  j["training"] = {{"model", m.training.model},         {"data_dir", m.training.data_dir},
                   {"data", m.training.data},           {"task", m.training.task},
                   {"buffers", m.training.buffers},     {"seq_len", m.training.seq_len},
                   {"partition", m.training.partition}, {"local_epochs", m.training.local_epochs},
                   {"local_steps", m.training.local_steps}, {"batch_size", m.training.batch_size},
                   {"optimizer", m.training.optimizer}, {"lr", m.training.lr},
                   {"momentum", m.training.momentum},   {"weight_decay", m.training.weight_decay},
                   {"proximal_mu", m.training.proximal_mu}, {"threads", m.training.threads}};
  j["codecs"] = {{"uplink", m.codecs.uplink}, {"downlink", m.codecs.downlink}};
  j["emulation"] = {{"backend", m.emulation.backend}, {"host_relative_speed", m.emulation.host_relative_speed}};
  j["clients"] = nlohmann::json::array();
  for (const auto& g : m.clients) {
    nlohmann::json c = {{"name", g.name},
                        {"count", g.count},
                        {"link_kind", g.link_kind},
                        {"data_share", g.data_share},
                        {"start_delay_s", g.start_delay_s},
                        {"leave_after_s", g.leave_after_s},
                        {"slowdown", SlowdownFor(m, g.device)}};
    c["device"] = {{"name", g.device.name},
                   {"device_class", g.device.device_class},
                   {"relative_speed", g.device.relative_speed},
                   {"cores", g.device.cores},
                   {"memory_mb", g.device.memory_mb},
                   {"reference", g.device.reference},
                   {"source", g.device.source},
                   {"is_host", g.device.is_host}};
    c["link"] = g.link.has_value() ? nlohmann::json(emulation::LinkProfileToYaml(*g.link)) : nlohmann::json(nullptr);
    c["link_name"] = g.link_name;
    j["clients"].push_back(std::move(c));
  }
  return j.dump(2);
}

absl::StatusOr<Manifest> ManifestFromResolvedJson(const std::string& json, const std::string& source_yaml) {
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    Manifest m;
    m.source_yaml = source_yaml;
    m.name = j.at("name").get<std::string>();
    m.description = j.value("description", "");
    m.seed = j.at("seed").get<uint64_t>();
    m.path = j.value("path", "");
    const auto& s = j.at("server");
    m.server.strategy = s.at("strategy").get<std::string>();
    m.server.rounds = s.at("rounds").get<uint32_t>();
    m.server.round_deadline_s = s.at("round_deadline_s").get<double>();
    m.server.fraction_fit = s.at("fraction_fit").get<double>();
    m.server.min_fit_clients = s.at("min_fit_clients").get<uint32_t>();
    m.server.min_available_clients = s.at("min_available_clients").get<uint32_t>();
    m.server.evaluate_every = s.at("evaluate_every").get<uint32_t>();
    m.server.fraction_evaluate = s.at("fraction_evaluate").get<double>();
    m.server.max_round_attempts = s.at("max_round_attempts").get<uint32_t>();
    m.server.metrics_addr = s.value("metrics_addr", "");
    m.server.upload_slots = s.value("upload_slots", 0u);
    const auto& t = j.at("training");
    m.training.model = t.at("model").get<std::string>();
    m.training.data_dir = t.at("data_dir").get<std::string>();
    // Absent in manifests recorded before bring-your-own-model: the defaults are what those runs did.
    m.training.data = t.value("data", "");
    m.training.task = t.value("task", "classification");
    m.training.buffers = t.value("buffers", "average");
    m.training.seq_len = t.value("seq_len", 64u);
    m.training.partition = t.at("partition").get<std::string>();
    m.training.local_epochs = t.at("local_epochs").get<uint32_t>();
    m.training.local_steps = t.at("local_steps").get<uint32_t>();
    m.training.batch_size = t.at("batch_size").get<uint32_t>();
    m.training.optimizer = t.at("optimizer").get<std::string>();
    m.training.lr = t.at("lr").get<double>();
    m.training.momentum = t.at("momentum").get<double>();
    m.training.weight_decay = t.at("weight_decay").get<double>();
    m.training.proximal_mu = t.at("proximal_mu").get<double>();
    m.training.threads = t.at("threads").get<uint32_t>();
    m.codecs.uplink = j.at("codecs").at("uplink").get<std::string>();
    m.codecs.downlink = j.at("codecs").at("downlink").get<std::string>();
    m.emulation.backend = j.at("emulation").at("backend").get<std::string>();
    m.emulation.host_relative_speed = j.at("emulation").at("host_relative_speed").get<double>();
    for (const auto& c : j.at("clients")) {
      ClientGroup g;
      g.name = c.at("name").get<std::string>();
      g.count = c.at("count").get<uint32_t>();
      g.link_kind = c.at("link_kind").get<std::string>();
      g.data_share = c.at("data_share").get<double>();
      g.start_delay_s = c.at("start_delay_s").get<double>();
      g.leave_after_s = c.at("leave_after_s").get<double>();
      const auto& d = c.at("device");
      g.device.name = d.at("name").get<std::string>();
      g.device.device_class = d.at("device_class").get<std::string>();
      g.device.relative_speed = d.at("relative_speed").get<double>();
      g.device.cores = d.at("cores").get<uint32_t>();
      g.device.memory_mb = d.at("memory_mb").get<uint64_t>();
      g.device.reference = d.at("reference").get<std::string>();
      g.device.source = d.at("source").get<std::string>();
      g.device.is_host = d.at("is_host").get<bool>();
      g.link_name = c.at("link_name").get<std::string>();
      if (!c.at("link").is_null()) {
        absl::StatusOr<YAML::Node> node = ParseYaml(c.at("link").get<std::string>(), "recorded link profile");
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
