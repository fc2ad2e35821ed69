#include "fl/experiment/yaml_fields.h"

#include <cmath>
#include <utility>

#include "fl/core/str_cat.h"

namespace fl::experiment {

std::string DescribeYaml(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "nothing (null)";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Scalar: return fl::StrCat("\"", node.Scalar(), "\"");
    default: return "an undefined value";
  }
}

YamlMap::YamlMap(YAML::Node node, std::string file, std::string path)
    : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)) {}

int YamlMap::Line() const { return node_.IsDefined() ? node_.Mark().line + 1 : 0; }

std::string YamlMap::Path(std::string_view key) const {
  return path_.empty() ? std::string(key) : fl::StrCat(path_, ".", key);
}

absl::Status YamlMap::Error(const YAML::Node& node, std::string_view field, std::string_view what) const {
  const int line = node.IsDefined() && node.Mark().line >= 0 ? node.Mark().line + 1 : Line();
  const std::string where = field.empty() ? (path_.empty() ? std::string("(top level)") : path_) : Path(field);
  return absl::InvalidArgumentError(fl::StrCat(file_, ":", line, ": ", where, ": ", what));
}

absl::Status YamlMap::Check(std::initializer_list<std::string_view> allowed) const {
  if (!node_.IsMap()) return Error(node_, "", fl::StrCat("expected a map, got ", DescribeYaml(node_)));
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const std::string key = it->first.Scalar();
    bool ok = false;
    for (std::string_view a : allowed) ok |= a == key;
    if (!ok) {
      std::string list;
      for (std::string_view a : allowed) list = list.empty() ? std::string(a) : fl::StrCat(list, ", ", a);
      return Error(it->first, key, fl::StrCat("unknown key; allowed here: ", list));
    }
  }
  return absl::OkStatus();
}

bool YamlMap::Has(std::string_view key) const { return node_.IsMap() && node_[std::string(key)]; }

YAML::Node YamlMap::Node(std::string_view key) const { return node_[std::string(key)]; }

absl::Status YamlMap::Required(std::string_view key) const {
  if (Has(key)) return absl::OkStatus();
  return Error(node_, key, "is required");
}

absl::StatusOr<std::optional<std::string>> YamlMap::String(std::string_view key) const {
  if (!Has(key)) return std::optional<std::string>();
  const YAML::Node n = Node(key);
  if (!n.IsScalar()) return Error(n, key, fl::StrCat("expected a string, got ", DescribeYaml(n)));
  return std::optional<std::string>(n.Scalar());
}

absl::StatusOr<std::optional<double>> YamlMap::Number(std::string_view key, double min, double max) const {
  if (!Has(key)) return std::optional<double>();
  const YAML::Node n = Node(key);
  double v = 0;
  if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !std::isfinite(v)) {
    return Error(n, key, fl::StrCat("expected a number, got ", DescribeYaml(n)));
  }
  if (v < min || v > max) {
    return Error(n, key, fl::StrCat("must be in [", min, ", ", max, "], got ", n.Scalar()));
  }
  return std::optional<double>(v);
}

absl::StatusOr<std::optional<int64_t>> YamlMap::Integer(std::string_view key, int64_t min, int64_t max) const {
  if (!Has(key)) return std::optional<int64_t>();
  const YAML::Node n = Node(key);
  int64_t v = 0;
  if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v)) {
    return Error(n, key, fl::StrCat("expected an integer, got ", DescribeYaml(n)));
  }
  if (v < min || v > max) {
    return Error(n, key, fl::StrCat("must be an integer in [", min, ", ", max, "], got ", n.Scalar()));
  }
  return std::optional<int64_t>(v);
}

absl::StatusOr<std::optional<bool>> YamlMap::Bool(std::string_view key) const {
  if (!Has(key)) return std::optional<bool>();
  const YAML::Node n = Node(key);
  bool v = false;
  if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) {
    return Error(n, key, fl::StrCat("expected true or false, got ", DescribeYaml(n)));
  }
  return std::optional<bool>(v);
}

absl::StatusOr<std::optional<std::string>> YamlMap::Choice(std::string_view key,
                                                           std::initializer_list<std::string_view> choices) const {
  absl::StatusOr<std::optional<std::string>> s = String(key);
  if (!s.ok() || !s->has_value()) return s;
  for (std::string_view c : choices) {
    if (c == **s) return s;
  }
  std::string list;
  for (std::string_view c : choices) list = list.empty() ? std::string(c) : fl::StrCat(list, ", ", c);
  return Error(Node(key), key, fl::StrCat("unknown value \"", **s, "\"; allowed: ", list));
}

absl::StatusOr<std::optional<YamlMap>> YamlMap::Map(std::string_view key) const {
  if (!Has(key)) return std::optional<YamlMap>();
  const YAML::Node n = Node(key);
  if (!n.IsMap()) return Error(n, key, fl::StrCat("expected a map, got ", DescribeYaml(n)));
  return std::optional<YamlMap>(YamlMap(n, file_, Path(key)));
}

}  // namespace fl::experiment
