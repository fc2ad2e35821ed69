// The checks and refusals of every declared setting (setting_spec.h), moved here from fl-server's settings.cc so
// that fl-client's settings say the same things in the same words.
#include "fl/config/setting_spec.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>

#include "fl/config/yaml_fields.h"
#include "fl/core/str_cat.h"

namespace fl::config {
namespace {

constexpr double kU64 = 18446744073709551615.0;  // the largest uint64_t (a double rounds it to 2^64)

std::string Bounds(const SettingSpec& s, double scale) {
  auto num = [&](double v) {
    if (v >= kU64) return std::string("18446744073709551615");
    const double scaled = v / scale;
    // Whole bounds as whole numbers (1000000, not 1e+06).
    if (scaled == std::floor(scaled) && std::fabs(scaled) < 1e15) return std::to_string(static_cast<int64_t>(scaled));
    return SettingNumberText(scaled);
  };
  std::string b = fl::StrCat(s.min_open ? "(" : "[", num(s.min), ", ", num(s.max), "]");
  if (s.zero_off) b = fl::StrCat(b, " or 0 (off)");
  return b;
}

}  // namespace

std::string SettingNumberText(double v) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string WithUnit(std::string_view value, std::string_view unit) {
  return unit.empty() ? std::string(value) : fl::StrCat(value, " ", unit);
}

std::string SettingSpec::Describe() const {
  std::string d = fl::StrCat("setting ", name, " (", flag);
  if (!manifest.empty()) d = fl::StrCat(d, ", manifest ", manifest);
  d += ")";
  if (type == SettingType::kString) {
    if (!choices.empty()) return fl::StrCat(d, ", one of ", JoinList(choices));
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

std::string SettingSpec::OptionHelp() const {
  std::string h = help;
  if (type != SettingType::kString) {
    h = fl::StrCat(h, " (", unit.empty() ? "" : fl::StrCat("in ", unit, ", "), "within ", Bounds(*this, 1), ")");
  } else if (!choices.empty()) {
    h = fl::StrCat(h, " (one of ", JoinList(choices), ")");
  } else if (!allowed.empty()) {
    h = fl::StrCat(h, " (", allowed, ")");
  }
  if (!manifest.empty()) {
    h = fl::StrCat(h, " [manifest: ", manifest, manifest_scale != 1 ? fl::StrCat(", in ", manifest_unit) : "", "]");
  }
  return h;
}

const char* SettingSpec::TypeName() const {
  return type == SettingType::kString ? "TEXT" : type == SettingType::kUnsigned ? "UINT" : "NUMBER";
}

absl::StatusOr<std::string> CheckSettingValue(const SettingSpec& s, std::string_view text, std::string_view source,
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
      return SettingNumberText(v);
    }
  }
  return std::string(text);
}

absl::StatusOr<std::string> CheckManifestNumber(const SettingSpec& s, double value, std::string_view source) {
  const std::string given = s.manifest_scale == 1
                                ? WithUnit(SettingNumberText(value), s.unit)
                                : fl::StrCat(SettingNumberText(value), " ", s.manifest_unit, " (",
                                             WithUnit(SettingNumberText(value * s.manifest_scale), s.unit), ")");
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
  return CheckSettingValue(s, SettingNumberText(v), source, given);
}

absl::Status SettingDisagreement(const SettingSpec& s, std::string_view first_source, std::string_view first_given,
                                 std::string_view second_source, std::string_view second_given) {
  return absl::InvalidArgumentError(fl::StrCat(first_source, " gives ", first_given, " but ", second_source, " gives ",
                                               second_given, " for ", s.Describe(),
                                               ": give the setting once, or the same value in both"));
}

absl::StatusOr<std::optional<std::string>> ReadSettingYaml(const YamlMap& map, const std::string& key,
                                                           const SettingSpec& s) {
  if (!map.Has(key)) return std::optional<std::string>();
  const YAML::Node n = map.Node(key);
  const std::string source = fl::StrCat(map.file().empty() ? "<inline>" : map.file(), ":",
                                        n.Mark().line >= 0 ? n.Mark().line + 1 : 0, ": ", map.Path(key));
  if (s.type == SettingType::kString) {
    absl::StatusOr<std::optional<std::string>> v = map.String(key, s.allowed);
    if (!v.ok()) return v.status();
    absl::StatusOr<std::string> checked = CheckSettingValue(s, **v, source);
    if (!checked.ok()) return checked.status();
    return std::optional<std::string>(*checked);
  }
  if (!n.IsScalar()) return map.Error(n, key, fl::StrCat("expected a number, got ", DescribeYaml(n)), s.Describe());
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

}  // namespace fl::config
