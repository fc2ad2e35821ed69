// Strict, typed access to a YAML map with errors that say where and what is allowed.
//
// Every accessor names the file, the line (yaml-cpp marks are 0-based; we print 1-based), the field path
// ("clients[1].link.uplink.rate") and what the field accepts, so that a bad manifest is fixed in one go:
//   experiments/x.yaml:12: server.rounds: expected a positive integer, got "three"
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::experiment {

class YamlMap {
 public:
  // `node` must be a map; otherwise Check() reports it. `path` is the field path of `node` ("" at the root).
  YamlMap(YAML::Node node, std::string file, std::string path);

  // InvalidArgument "<file>:<line>: <path>: <what>" at `node`'s line (or this map's line if `node` is null).
  absl::Status Error(const YAML::Node& node, std::string_view field, std::string_view what) const;
  // The node is a map, and every key is one of `allowed` (the error lists them).
  absl::Status Check(std::initializer_list<std::string_view> allowed) const;

  bool Has(std::string_view key) const;
  YAML::Node Node(std::string_view key) const;
  std::string Path(std::string_view key) const;  // "server.rounds"
  const std::string& file() const { return file_; }
  const std::string& path() const { return path_; }
  int Line() const;

  // Typed getters: nullopt when the key is absent; an error naming the field when the value is not the type.
  absl::StatusOr<std::optional<std::string>> String(std::string_view key) const;
  absl::StatusOr<std::optional<double>> Number(std::string_view key, double min, double max) const;
  absl::StatusOr<std::optional<int64_t>> Integer(std::string_view key, int64_t min, int64_t max) const;
  absl::StatusOr<std::optional<bool>> Bool(std::string_view key) const;
  // One of `choices` (the error lists them).
  absl::StatusOr<std::optional<std::string>> Choice(std::string_view key,
                                                    std::initializer_list<std::string_view> choices) const;
  // A nested map (nullopt when absent).
  absl::StatusOr<std::optional<YamlMap>> Map(std::string_view key) const;
  absl::Status Required(std::string_view key) const;

 private:
  YAML::Node node_;
  std::string file_;
  std::string path_;
};

// "a string", "a map", ...: how a node looks, for "got ..." in errors.
std::string DescribeYaml(const YAML::Node& node);

}  // namespace fl::experiment
