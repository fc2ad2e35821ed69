// What comes from the table of settings (settings_table.cc): the options, the checks, the records, the arguments.
#include "fl/server/settings.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "fl/config/field_table.h"
#include "fl/config/yaml_fields.h"
#include "fl/core/aggregator.h"
#include "fl/core/codec.h"
#include "fl/core/codec_policy.h"
#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/core/tensor_spec.h"
#include "fl/proto/convert.h"
#include "fl/server/staleness.h"
#include "settings_internal.h"

namespace fl::server {
namespace {

using settings_internal::NumberText;
using settings_internal::ToDouble;
using settings_internal::ToU64;

using config::WithUnit;

}  // namespace

const std::vector<Setting>& Settings() {
  static const auto& table = *new std::vector<Setting>(settings_internal::MakeSettingsTable());
  return table;
}

const Setting* FindSetting(std::string_view key) {
  for (const Setting& s : Settings()) {
    if (s.name == key || s.flag == key || (!s.manifest.empty() && s.manifest == key)) return &s;
  }
  return nullptr;
}

EngineConfig DefaultEngineConfig() {
  EngineConfig c;
  for (const Setting& s : Settings()) {
    if (!s.default_text.empty()) s.set(c, s.default_text);
  }
  return c;
}

absl::Status SettingSources::Add(const Setting& s, std::string_view text, std::string source, std::string given) {
  absl::StatusOr<std::string> value = CheckSettingValue(s, text, source, given);
  if (!value.ok()) return value.status();
  if (given.empty()) given = WithUnit(*value, s.unit);
  auto it = values_.find(s.name);
  if (it == values_.end()) {
    values_.emplace(s.name, Value{*value, std::move(source), std::move(given)});
    return absl::OkStatus();
  }
  if (it->second.text == *value) return absl::OkStatus();  // the same value twice: no disagreement
  return config::SettingDisagreement(s, it->second.source, it->second.given, source, given);
}

void SettingSources::ApplyTo(EngineConfig& config) const {
  for (const Setting& s : Settings()) {
    if (auto it = values_.find(s.name); it != values_.end()) s.set(config, it->second.text);
  }
}

absl::Status SettingFlags::AddTo(SettingSources& sources) const {
  for (const auto& [s, v] : given) {
    if (absl::Status st = sources.Add(*s, v, s->flag); !st.ok()) return st;
  }
  return absl::OkStatus();
}

void AddSettingOptions(CLI::App& app, SettingFlags& flags) {
  const EngineConfig defaults = DefaultEngineConfig();
  std::map<std::string, CLI::Option_group*> groups;
  for (const Setting& s : Settings()) {
    CLI::Option_group*& group = groups[s.group];
    if (group == nullptr) group = app.add_option_group(s.group);
    const std::string help = s.OptionHelp();
    const Setting* setting = &s;
    CLI::Option* o = group->add_option_function<std::string>(
        s.flag, [&flags, setting](const std::string& v) { flags.given.emplace_back(setting, v); }, help);
    o->default_str(s.get(defaults));
    o->type_name(s.TypeName());
  }
}

namespace {

// server.strategy as a map: {name: fedadam, options: {lr: 0.03, tau: 0.001}} -> "fedadam:lr=0.03,tau=0.001".
struct StrategySpec {
  std::string name;
  std::string options;  // "lr=0.03,tau=0.001"
};

const config::FieldTable<StrategySpec>& StrategyFields() {
  static const auto& table = *new config::FieldTable<StrategySpec>{
      config::StringField("name", &StrategySpec::name).Required(),
      config::CustomField<StrategySpec>(
          "options",
          [](const config::YamlMap& m, const std::string& key, StrategySpec& spec) -> absl::Status {
            absl::StatusOr<std::optional<config::YamlMap>> options =
                m.Map(key, "a map of option names to numbers, such as {lr: 0.03, tau: 0.001}");
            if (!options.ok()) return options.status();
            const YAML::Node n = (*options)->node();
            for (auto it = n.begin(); it != n.end(); ++it) {
              absl::StatusOr<std::optional<double>> v = (*options)->Number(it->first.Scalar(), -1e12, 1e12);
              if (!v.ok()) return v.status();
              spec.options = fl::StrCat(spec.options, spec.options.empty() ? "" : ",", it->first.Scalar(), "=",
                                        it->second.Scalar());
            }
            return absl::OkStatus();
          }),
  };
  return table;
}

}  // namespace

absl::StatusOr<std::optional<std::string>> ReadSettingYaml(const config::YamlMap& map, const std::string& key,
                                                           const Setting& s) {
  // server.strategy may be a map; every other setting is a scalar, read as fl-client's are (config/setting_spec.h).
  if (s.name != "strategy" || !map.Has(key) || !map.Node(key).IsMap()) return config::ReadSettingYaml(map, key, s);
  const YAML::Node n = map.Node(key);
  const std::string source = fl::StrCat(map.file().empty() ? "<inline>" : map.file(), ":",
                                        n.Mark().line >= 0 ? n.Mark().line + 1 : 0, ": ", map.Path(key));
  absl::StatusOr<std::optional<config::YamlMap>> m =
      map.Map(key, fl::StrCat("a strategy in fl-server --strategy syntax, or ", StrategyFields().Describe()));
  if (!m.ok()) return m.status();
  StrategySpec spec;
  if (absl::Status st = StrategyFields().Read(**m, spec); !st.ok()) return st;
  const std::string text = spec.options.empty() ? spec.name : fl::StrCat(spec.name, ":", spec.options);
  absl::StatusOr<std::string> checked = CheckSettingValue(s, text, source);
  if (!checked.ok()) return checked.status();
  return std::optional<std::string>(*checked);
}

absl::Status ReadManifestSettings(const config::YamlMap& root, SettingSources& sources) {
  for (const Setting& s : Settings()) {
    if (s.manifest.empty()) continue;
    // Down the dotted path; an absent section leaves its settings to the other sources.
    std::optional<config::YamlMap> map = root;
    std::string_view rest = s.manifest;
    for (size_t dot = rest.find('.'); dot != std::string_view::npos && map.has_value(); dot = rest.find('.')) {
      absl::StatusOr<std::optional<config::YamlMap>> next = map->Map(rest.substr(0, dot));
      if (!next.ok()) return next.status();
      // Never assign a YamlMap: YAML::Node's assignment writes into the node it refers to (the manifest's root).
      map.reset();
      if (next->has_value()) map.emplace(**next);
      rest.remove_prefix(dot + 1);
    }
    if (!map.has_value()) continue;
    const std::string key(rest);
    absl::StatusOr<std::optional<std::string>> v = ReadSettingYaml(*map, key, s);
    if (!v.ok()) return v.status();
    if (!v->has_value()) continue;
    const YAML::Node n = map->Node(key);
    const std::string source =
        fl::StrCat(map->file(), ":", n.Mark().line >= 0 ? n.Mark().line + 1 : 0, ": ", map->Path(key));
    std::string given = n.IsScalar() ? n.Scalar() : **v;
    given = s.manifest_scale != 1 ? fl::StrCat(given, " ", s.manifest_unit, " (", WithUnit(**v, s.unit), ")")
                                  : WithUnit(given, s.unit);
    if (absl::Status st = sources.Add(s, **v, source, given); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<EngineConfig> ResolveSettings(const SettingFlags& flags, const std::string& manifest_path) {
  SettingSources sources;
  if (!manifest_path.empty()) {
    absl::StatusOr<YAML::Node> root = config::LoadYamlFile(manifest_path, "manifest");
    if (!root.ok()) return root.status();
    if (absl::Status s = ReadManifestSettings(config::YamlMap(*root, manifest_path, ""), sources); !s.ok()) return s;
  }
  if (absl::Status s = flags.AddTo(sources); !s.ok()) return s;
  EngineConfig config = DefaultEngineConfig();
  sources.ApplyTo(config);
  return config;
}

absl::Status CheckSettingBounds(const EngineConfig& config) {
  for (const Setting& s : Settings()) {
    if (s.applies && !s.applies(config)) continue;
    if (s.type == SettingType::kString && s.choices.empty()) continue;  // parsers: Validate runs them in context
    absl::StatusOr<std::string> v = CheckSettingValue(s, s.get(config), fl::StrCat(s.flag, "=", s.get(config)));
    if (!v.ok()) return v.status();
  }
  return absl::OkStatus();
}

std::vector<std::string> SettingArgs(const EngineConfig& config, const std::function<bool(const Setting&)>& include) {
  std::vector<std::string> args;
  for (const Setting& s : Settings()) {
    if (include && !include(s)) continue;
    const std::string value = s.get(config);
    if (value.empty()) continue;  // an empty text is the default of every setting that takes one
    args.push_back(s.flag);
    args.push_back(value);
  }
  return args;
}

std::string RecordedConfigJson(const EngineConfig& config) {
  nlohmann::json cfg = nlohmann::json::object();
  for (const Setting& s : Settings()) {
    if (!s.recorded) continue;
    const std::string v = s.get(config);
    switch (s.type) {
      case SettingType::kUnsigned: cfg[s.name] = ToU64(v); break;
      case SettingType::kNumber: cfg[s.name] = ToDouble(v); break;
      case SettingType::kString: cfg[s.name] = v; break;
    }
  }
  // Derived from the strategy (ResolveStrategy), for readers of the record: what the engine ran.
  cfg["aggregator"] = config.aggregator;
  cfg["optimizer"] = config.optimizer;
  return cfg.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<EngineConfig> ConfigFromRecordedJson(const std::string& json) {
  EngineConfig config = DefaultEngineConfig();
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    for (const Setting& s : Settings()) {
      if (!s.recorded || !j.contains(s.name)) continue;
      const nlohmann::json& v = j.at(s.name);
      std::string text;
      switch (s.type) {
        case SettingType::kUnsigned: text = std::to_string(v.get<uint64_t>()); break;
        case SettingType::kNumber: text = NumberText(v.get<double>()); break;
        case SettingType::kString: text = v.get<std::string>(); break;
      }
      s.set(config, text);
    }
    if (j.contains("aggregator")) config.aggregator = j.at("aggregator").get<std::string>();
    if (j.contains("optimizer")) config.optimizer = j.at("optimizer").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(fl::StrCat("the recorded configuration cannot be read: ", e.what()));
  }
  return config;
}

}  // namespace fl::server
