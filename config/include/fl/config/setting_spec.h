// What every declared setting says of itself, whichever program's configuration it belongs to (docs/architecture.md,
// "Settings"): fl-server's settings (fl/server/settings.h) and fl-client's (fl/client/settings.h) are tables of
// this, each entry adding how to read and write its own program's configuration. The checks and the refusals are
// here once, so that a value out of bounds, or given differently by a manifest and a flag, is refused in the same
// words by fl-server, fl-client and fl-experiment.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::config {

enum class SettingType {
  kUnsigned,  // a whole number, in [min, max]
  kNumber,    // a real number, in [min, max] (or (min, max] when min_open)
  kString,    // text, one of `choices` when there are any, checked by `check` when there is one
};

struct SettingSpec {
  std::string name;   // snake_case: its name in the recorded configuration ("round_deadline_ms")
  std::string flag;   // the program's flag ("--round-deadline-ms")
  std::string group;  // --help's option group ("Rounds and selection")
  SettingType type = SettingType::kUnsigned;
  std::string unit;  // the unit of the flag's value ("ms", "clients", "bytes/s"); "" for a count or a name
  double min = 0;    // bounds of numbers, inclusive (kUnsigned: whole numbers that fit the member)
  double max = 0;
  bool min_open = false;             // (min, max]: a learning rate must be > 0
  bool zero_off = false;             // 0 is allowed too, and turns the setting off ("0: off")
  std::vector<std::string> choices;  // kString: the values allowed; empty: `check` decides
  // kString: a parser of the value (codec specs, strategies), whose error says what is wrong with it.
  std::function<absl::Status(std::string_view)> check;
  std::string allowed;  // what a value may be, when bounds and choices do not say it all (help and errors)
  std::string help;
  // The manifest's path of the setting ("server.selection.fraction_fit"), "" when a manifest cannot set it; its
  // key in the resolved manifest JSON stored with an experiment ("fraction_fit", in the path's section); the unit a
  // manifest gives it in and how many of the setting's units one of the manifest's makes (seconds for a setting
  // in ms: 1000; a manifest value is converted on reading, and the bounds are said in both units).
  std::string manifest;
  std::string manifest_record;
  std::string manifest_unit;
  double manifest_scale = 1;
  bool manifest_required = false;  // a manifest must give it (server.rounds)

  // "setting round_deadline_ms (--round-deadline-ms, manifest server.round_deadline_s) in ms, within [100,
  // 4294967295] (a manifest gives seconds: [0.1, 4294967.295])": what every error about the setting says of it.
  std::string Describe() const;
  // The value in the manifest's unit, for the resolved manifest JSON and for errors ("120" for 120000 ms).
  double ToManifestUnit(double value) const { return value / manifest_scale; }
  // The option's help: `help`, then its unit and bounds (or choices, or what is allowed) and its manifest path.
  std::string OptionHelp() const;
  // CLI11's type name of the option's value (UINT, NUMBER, TEXT).
  const char* TypeName() const;
};

// The shortest text that reads back as `v` ("0.5", "120000").
std::string SettingNumberText(double v);
// "120000 ms", or the value alone for a setting without a unit.
std::string WithUnit(std::string_view value, std::string_view unit);

// `text` in the setting's unit, checked against its type, bounds, choices and parser: the canonical text, or an
// InvalidArgument "<source>: <given> is out of bounds for <Describe()>" (or "... is not <type>"). `given` is how
// the source spelled the value ("0.05 s"); "" = `text`.
absl::StatusOr<std::string> CheckSettingValue(const SettingSpec& s, std::string_view text, std::string_view source,
                                              std::string_view given = {});
// A manifest's number in the manifest's unit, converted to the setting's unit and checked: the canonical text.
absl::StatusOr<std::string> CheckManifestNumber(const SettingSpec& s, double value, std::string_view source);

// The refusal of a setting given differently by two sources ("<first> gives 5 s but --flag gives 7000 ms for
// <Describe()>: give the setting once, or the same value in both").
absl::Status SettingDisagreement(const SettingSpec& s, std::string_view first_source, std::string_view first_given,
                                 std::string_view second_source, std::string_view second_given);

class YamlMap;

// The value a manifest map gives for `s` under `key` (the last part of its manifest path), converted to the
// setting's unit and checked (CheckSettingValue, CheckManifestNumber): its canonical text, or nullopt when absent.
// The source named in a refusal is "<file>:<line>: <path>".
absl::StatusOr<std::optional<std::string>> ReadSettingYaml(const YamlMap& map, const std::string& key,
                                                           const SettingSpec& s);

}  // namespace fl::config
