// Every setting of a federated run declared once (docs/architecture.md, "Settings").
//
// A Setting says everything about one knob of EngineConfig: its fl-server flag, its manifest path, its type, its
// unit, its default (EngineConfig's own, or the declared one for the clients' training settings, which live in a
// proto), its bounds, its help text, its option group, and whether it is recorded with the experiment. From the
// one table come
//   - fl-server's CLI11 options, in option groups by concern (AddSettingOptions);
//   - the range checks of EngineConfig::Validate (CheckSettingBounds; checks across settings stay hand-written);
//   - the recorded configuration (RecordedConfigJson) and its reader (ConfigFromRecordedJson);
//   - fl-experiment's fl-server arguments (SettingArgs);
//   - the manifest reader's fields (experiments/src/manifest.cc generates its server:, training: and codecs: keys
//     from the table, and fl-server --manifest reads the same keys with ReadManifestSettings).
// A value given by two sources (a manifest and a flag) is refused when they differ, and a value out of its bounds
// is refused, by one function each, so that fl-server and fl-experiment say the same thing, naming the sources,
// the setting, its unit and its bounds.
//
// Adding a setting is one entry in settings.cc (and its member in EngineConfig, and its use).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/config/setting_spec.h"
#include "fl/server/engine_config.h"

namespace CLI {
class App;
}
namespace fl::config {
class YamlMap;
}

namespace fl::server {

// The checks and refusals every declared setting shares with fl-client's (fl/config/setting_spec.h).
using config::CheckManifestNumber;
using config::CheckSettingValue;
using config::SettingType;

// A setting of fl-server: what every setting says of itself (its flag, manifest path, type, unit, bounds, help and
// group: config::SettingSpec), and how fl-server records, reads and writes it.
struct Setting : config::SettingSpec {
  // Written in the resolved manifest JSON of experiments recorded before this build; a replay of a record that
  // lacks it keeps the default.
  bool in_old_manifest_records = false;
  // Old resolved manifests wrote 0 (or "") for "fl-server's default" (server.upload_slots, server.buffered.*).
  bool old_zero_is_default = false;
  // In the experiment's recorded configuration (experiments.config_json): every setting that can change what a
  // run does. false only for names and places (the experiment's id, the checkpoint folder).
  bool recorded = true;
  // Read and write the member, as canonical text in the setting's unit ("120000", "0.5", "fedavg").
  std::function<std::string(const EngineConfig&)> get;
  std::function<void(EngineConfig&, const std::string&)> set;
  // The declared default where EngineConfig{} has none of its own (the clients' training settings, which live in
  // a proto message); "" = EngineConfig{}'s value.
  std::string default_text;
  // When the bounds apply to a configuration (the buffered settings under --aggregation=buffered only); empty:
  // always. A value given by a flag or a manifest is checked whatever this says.
  std::function<bool(const EngineConfig&)> applies;
};

// Every setting, in the order of fl-server --help.
const std::vector<Setting>& Settings();
// The setting with this name, flag ("--rounds") or manifest path; nullptr when there is none.
const Setting* FindSetting(std::string_view name_flag_or_path);

// EngineConfig{} with every declared default applied (the clients' training settings): what fl-server starts from.
EngineConfig DefaultEngineConfig();

// The values of settings from several sources (fl-server's flags, a manifest), each with where it came from.
// Adding a value that another source gave differently is refused naming both sources; a value out of bounds is
// refused naming its source. Both fl-server and fl-experiment resolve their settings through this.
class SettingSources {
 public:
  // `text` is in the setting's unit; `source` says where it came from ("--round-deadline-ms",
  // "exp.yaml:6: server.round_deadline_s") and `given` how it was written there ("0.05 s").
  absl::Status Add(const Setting& s, std::string_view text, std::string source, std::string given = {});
  // Sets every value given on `config`.
  void ApplyTo(EngineConfig& config) const;
  bool Has(const Setting& s) const { return values_.contains(s.name); }
  size_t size() const { return values_.size(); }

 private:
  struct Value {
    std::string text;  // canonical, in the setting's unit
    std::string source;
    std::string given;
  };
  std::map<std::string, Value> values_;
};

// The values of fl-server's setting flags as given, before they are checked (AddTo checks them).
struct SettingFlags {
  std::vector<std::pair<const Setting*, std::string>> given;
  // Every flag given, into `sources` named by its flag ("--round-deadline-ms"); the first refusal.
  absl::Status AddTo(SettingSources& sources) const;
};

// Declares every setting as an fl-server option in its option group, with its default, unit, bounds and manifest
// path in the help. Values are kept as text in `flags` and checked by SettingFlags::AddTo, so that a bad value is
// refused in the same words as a manifest's (CLI11's conversions would say it differently).
void AddSettingOptions(CLI::App& app, SettingFlags& flags);

// The value a manifest map gives for `s` under `key` (the last part of its manifest path), converted to the
// setting's unit and checked: its canonical text, or nullopt when absent. Errors name the file, line and path.
absl::StatusOr<std::optional<std::string>> ReadSettingYaml(const config::YamlMap& map, const std::string& key,
                                                           const Setting& s);

// The settings a manifest gives (its server:, training:, codecs: and seed keys in the table), into `sources`,
// each named "<file>:<line>: <path>". The manifest's other keys are fl-experiment's (fl-experiment validate checks
// them all); this reads only the table's. Used by fl-server --manifest.
absl::Status ReadManifestSettings(const config::YamlMap& root, SettingSources& sources);

// What fl-server does with its settings: the manifest's at `manifest_path` ("" = none, ReadManifestSettings), then
// the flags given (SettingFlags::AddTo; a flag that repeats a manifest's setting with another value is refused
// naming both), on DefaultEngineConfig(). Not yet Validate()d, and the strategy not yet resolved.
absl::StatusOr<EngineConfig> ResolveSettings(const SettingFlags& flags, const std::string& manifest_path);

// Every range check of the table on `config` (settings that apply only; see Setting::applies): the first setting
// out of its bounds, in the words of CheckSettingValue with the flag as the source. Part of EngineConfig::Validate.
absl::Status CheckSettingBounds(const EngineConfig& config);

// fl-server's arguments that reproduce `config`'s settings: "--flag value" for every setting `include` selects (all
// by default), in the table's order; settings whose value is empty text (their default) are left out.
std::vector<std::string> SettingArgs(const EngineConfig& config,
                                     const std::function<bool(const Setting&)>& include = nullptr);

// The inverse of RecordedConfigJson: the recorded settings of an experiment on DefaultEngineConfig(); a setting
// missing from the JSON (recorded before it was) keeps its default. An InvalidArgument for a value that is not of
// its setting's type.
absl::StatusOr<EngineConfig> ConfigFromRecordedJson(const std::string& json);

}  // namespace fl::server
