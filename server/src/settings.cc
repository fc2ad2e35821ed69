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

using settings_internal::kU64;
using settings_internal::NumberText;
using settings_internal::ToDouble;
using settings_internal::ToU64;

std::string Bounds(const Setting& s, double scale) {
  auto num = [&](double v) {
    if (v >= kU64) return std::string("18446744073709551615");
    const double scaled = v / scale;
    // Whole bounds as whole numbers (1000000, not 1e+06).
    if (scaled == std::floor(scaled) && std::fabs(scaled) < 1e15) return std::to_string(static_cast<int64_t>(scaled));
    return NumberText(scaled);
  };
  std::string b = fl::StrCat(s.min_open ? "(" : "[", num(s.min), ", ", num(s.max), "]");
  if (s.zero_off) b = fl::StrCat(b, " or 0 (off)");
  return b;
}

std::string WithUnit(std::string_view value, std::string_view unit) {
  return unit.empty() ? std::string(value) : fl::StrCat(value, " ", unit);
}

}  // namespace

std::string Setting::Describe() const {
  std::string d = fl::StrCat("setting ", name, " (", flag);
  if (!manifest.empty()) d = fl::StrCat(d, ", manifest ", manifest);
  d += ")";
  if (type == SettingType::kString) {
    if (!choices.empty()) return fl::StrCat(d, ", one of ", config::JoinList(choices));
    return allowed.empty() ? d : fl::StrCat(d, ", ", allowed);
  }
  if (!unit.empty()) d = fl::StrCat(d, " in ", unit);
  d = fl::StrCat(d, ", within ", Bounds(*this, 1));
  if (type == SettingType::kUnsigned) d += " (whole numbers)";
  if (manifest_scale != 1) {
    d = fl::StrCat(d, " (a manifest gives ", manifest_unit, ": ", Bounds(*this, manifest_scale), ")");
  }
  return d;
}

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

absl::StatusOr<std::string> CheckSettingValue(const Setting& s, std::string_view text, std::string_view source,
                                              std::string_view given) {
  const std::string as_given = given.empty() ? WithUnit(text, s.unit) : std::string(given);
  auto refuse = [&](std::string_view why) {
    return absl::InvalidArgumentError(fl::StrCat(source, ": ", as_given, " ", why, " for ", s.Describe()));
  };
  switch (s.type) {
    case SettingType::kString: {
      if (!s.choices.empty()) {
        for (const std::string& c : s.choices) {
          if (c == text) return std::string(text);
        }
        return refuse("is not allowed");
      }
      if (s.check) {
        if (absl::Status st = s.check(text); !st.ok()) {
          return refuse(fl::StrCat("is not allowed (", fl::ToStd(st.message()), ")"));
        }
      }
      return std::string(text);
    }
    case SettingType::kUnsigned: {
      uint64_t v = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
        return refuse("is not a whole number");
      }
      const uint64_t max = s.max >= kU64 ? UINT64_MAX : static_cast<uint64_t>(s.max);
      const bool off = s.zero_off && v == 0;
      if (!off && (static_cast<double>(v) < s.min || v > max)) return refuse("is out of bounds");
      return std::to_string(v);
    }
    case SettingType::kNumber: {
      double v = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) {
        return refuse("is not a finite number");
      }
      const bool off = s.zero_off && v == 0;
      if (!off && (v < s.min || (s.min_open && v == s.min) || v > s.max)) return refuse("is out of bounds");
      return NumberText(v);
    }
  }
  return std::string(text);
}

absl::StatusOr<std::string> CheckManifestNumber(const Setting& s, double value, std::string_view source) {
  const std::string given = s.manifest_scale == 1
                                ? WithUnit(NumberText(value), s.unit)
                                : fl::StrCat(NumberText(value), " ", s.manifest_unit, " (",
                                             WithUnit(NumberText(value * s.manifest_scale), s.unit), ")");
  double v = value * s.manifest_scale;
  // 0.1 s is 100.00000000000001 ms in binary: a product within a millionth of a whole number is that number.
  if (s.manifest_scale != 1 && std::fabs(v - std::round(v)) < 1e-6 * std::max(1.0, std::fabs(v))) v = std::round(v);
  if (s.type == SettingType::kUnsigned) {
    if (!(v >= 0) || v != std::floor(v) || v > kU64) {
      return absl::InvalidArgumentError(fl::StrCat(source, ": ", given, " is not a whole number of ",
                                                   s.unit.empty() ? "units" : s.unit, " for ", s.Describe()));
    }
    // Exact for the integers a double holds (up to 2^53); seeds beyond that are read from their text instead.
    char buf[32];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), static_cast<uint64_t>(v));
    return CheckSettingValue(s, std::string_view(buf, ec == std::errc() ? end - buf : 0), source, given);
  }
  return CheckSettingValue(s, NumberText(v), source, given);
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
  return absl::InvalidArgumentError(fl::StrCat(it->second.source, " gives ", it->second.given, " but ", source,
                                               " gives ", given, " for ", s.Describe(),
                                               ": give the setting once, or the same value in both"));
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
    std::string help = s.help;
    if (s.type != SettingType::kString) {
      help =
          fl::StrCat(help, " (", s.unit.empty() ? "" : fl::StrCat("in ", s.unit, ", "), "within ", Bounds(s, 1), ")");
    } else if (!s.choices.empty()) {
      help = fl::StrCat(help, " (one of ", config::JoinList(s.choices), ")");
    } else if (!s.allowed.empty()) {
      help = fl::StrCat(help, " (", s.allowed, ")");
    }
    if (!s.manifest.empty()) {
      help = fl::StrCat(help, " [manifest: ", s.manifest,
                        s.manifest_scale != 1 ? fl::StrCat(", in ", s.manifest_unit) : "", "]");
    }
    const Setting* setting = &s;
    CLI::Option* o = group->add_option_function<std::string>(
        s.flag, [&flags, setting](const std::string& v) { flags.given.emplace_back(setting, v); }, help);
    o->default_str(s.get(defaults));
    o->type_name(s.type == SettingType::kString ? "TEXT" : s.type == SettingType::kUnsigned ? "UINT" : "NUMBER");
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
  if (!map.Has(key)) return std::optional<std::string>();
  const YAML::Node n = map.Node(key);
  const std::string source = fl::StrCat(map.file().empty() ? "<inline>" : map.file(), ":",
                                        n.Mark().line >= 0 ? n.Mark().line + 1 : 0, ": ", map.Path(key));
  std::string text;
  if (s.name == "strategy" && n.IsMap()) {
    absl::StatusOr<std::optional<config::YamlMap>> m =
        map.Map(key, fl::StrCat("a strategy in fl-server --strategy syntax, or ", StrategyFields().Describe()));
    if (!m.ok()) return m.status();
    StrategySpec spec;
    if (absl::Status st = StrategyFields().Read(**m, spec); !st.ok()) return st;
    text = spec.options.empty() ? spec.name : fl::StrCat(spec.name, ":", spec.options);
  } else if (s.type == SettingType::kString) {
    absl::StatusOr<std::optional<std::string>> v = map.String(key, s.allowed);
    if (!v.ok()) return v.status();
    text = **v;
  } else {
    if (!n.IsScalar()) {
      return map.Error(n, key, fl::StrCat("expected a number, got ", config::DescribeYaml(n)), s.Describe());
    }
    // A whole number in the manifest's own unit is read from its text (a seed can exceed what a double holds).
    if (s.type == SettingType::kUnsigned && s.manifest_scale == 1) {
      absl::StatusOr<std::string> v = CheckSettingValue(s, n.Scalar(), source, WithUnit(n.Scalar(), s.unit));
      if (!v.ok()) return v.status();
      return std::optional<std::string>(*v);
    }
    absl::StatusOr<std::optional<double>> v = map.Number(key, {-1e300, 1e300});
    if (!v.ok()) return v.status();
    absl::StatusOr<std::string> checked = CheckManifestNumber(s, **v, source);
    if (!checked.ok()) return checked.status();
    return std::optional<std::string>(*checked);
  }
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
