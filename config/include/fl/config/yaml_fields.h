// Strict, typed access to a YAML map with errors that say where and what is allowed.
//
// Every loader of the project (link profiles, experiment manifests, device profiles, islands manifests)
// reads its YAML through YamlMap, so that every mistake reads the same way: the file, the line (yaml-cpp
// marks are 0-based; we print 1-based), the field path and what the field accepts,
//   experiments/x.yaml:12: server.rounds: expected an integer, got "three"; allowed: an integer in [1, 1000000]
// and a bad file is fixed in one go. Tables of fields (field_table.h) are built on it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::config {

// Limits on a YAML file (a manifest, a link or device profile), checked before yaml-cpp builds anything:
// The largest file the loaders read. The repository's manifests and profiles are under 10 KB; 4 MiB leaves room
// for generated ones while keeping what yaml-cpp builds from the file small (below).
inline constexpr uint64_t kMaxYamlFileBytes = uint64_t{4} << 20;
// The most nodes (scalars, maps, lists) of one YAML document. yaml-cpp keeps about 460 bytes a node (measured:
// a list of 10^6 zeros, 3 MB of text, takes 464 MB), so 4 MiB of `[0,0,...]` would cost about 1 GB; 250,000
// nodes are at most about 115 MB, and hold a manifest of 50,000 client groups. The repository's largest manifest
// has under 500.
inline constexpr size_t kMaxYamlNodes = 250'000;
// The deepest nesting of maps and lists. yaml-cpp's parser recurses once a level (a file of 100,000 `[` would
// overflow the stack); the loaders' files nest at most 6 levels.
inline constexpr int kMaxYamlDepth = 64;

// The text of a user's file, through fl::sys::OpenUserFile: a regular file (a FIFO, /dev/zero or a directory is
// refused before anything is read) of at most kMaxYamlFileBytes. Errors name `what` and the path:
// NotFound "<what> <path>: no such file", InvalidArgument for a special file or one over the limit.
absl::StatusOr<std::string> ReadTextFile(const std::filesystem::path& path, std::string_view what);
// YAML text -> node; InvalidArgument "<file>:<line>: not valid YAML: <why>; fix the syntax and run again".
// Before yaml-cpp builds the tree, one streaming pass over the document's events refuses
//   - a key given twice in one map (yaml-cpp would keep both and every lookup would see the first):
//     "<file>:<line>: server.rounds: key given twice (first at line 3); a key may appear once in a map";
//   - nesting deeper than kMaxYamlDepth, and more than kMaxYamlNodes nodes;
// in every map of every document the loaders read (they all parse through here).
absl::StatusOr<YAML::Node> ParseYaml(std::string_view text, std::string_view file);
// ReadTextFile + ParseYaml, with the path as the file name in errors.
absl::StatusOr<YAML::Node> LoadYamlFile(const std::filesystem::path& path, std::string_view what);

// "a string", "a map", "\"fast\"": how a node looks, for "got ..." in errors.
std::string DescribeYaml(const YAML::Node& node);
// "a, b, c".
std::string JoinList(std::span<const std::string> items);

// Bounds of a number; `max_exclusive` for fractions such as a loss in [0, 1).
struct NumberRange {
  double min = 0;
  double max = 0;
  bool max_exclusive = false;
};

class YamlMap {
 public:
  // `node` should be a map; Check() reports it when it is not. `file` is the name shown in errors ("" shows
  // "<inline>"), `path` the field path of `node` ("" at the root, "clients[1].link").
  YamlMap(YAML::Node node, std::string file, std::string path);

  // InvalidArgument "<file>:<line>: <path>: <problem>[; allowed: <allowed>]" at `node`'s line (this map's
  // line when `node` is undefined). `field` is the key below this map ("" = the map itself).
  absl::Status Error(const YAML::Node& node, std::string_view field, std::string_view problem,
                     std::string_view allowed = {}) const;
  // The node is a map and every key is one of `allowed` (the error lists them).
  absl::Status Check(std::span<const std::string> allowed) const;
  absl::Status Check(std::initializer_list<std::string_view> allowed) const;
  // The key is present; otherwise "<path>.<key>: missing (it is required)[; allowed: ...]".
  absl::Status Required(std::string_view key, std::string_view allowed = {}) const;

  bool Has(std::string_view key) const;
  YAML::Node Node(std::string_view key) const;
  const YAML::Node& node() const { return node_; }
  std::string Path(std::string_view key) const;  // "server.rounds"
  const std::string& file() const { return file_; }
  const std::string& path() const { return path_; }
  int Line() const;  // 1-based; 0 when unknown

  // Typed getters: nullopt when the key is absent; an error naming the field when the value is not of the
  // type or out of range. `allowed` replaces the default description of what the field accepts.
  absl::StatusOr<std::optional<std::string>> String(std::string_view key, std::string_view allowed = {}) const;
  absl::StatusOr<std::optional<double>> Number(std::string_view key, NumberRange range,
                                               std::string_view allowed = {}) const;
  absl::StatusOr<std::optional<double>> Number(std::string_view key, double min, double max) const {
    return Number(key, NumberRange{min, max});
  }
  absl::StatusOr<std::optional<int64_t>> Integer(std::string_view key, int64_t min, int64_t max,
                                                 std::string_view allowed = {}) const;
  absl::StatusOr<std::optional<bool>> Bool(std::string_view key) const;
  // One of `choices` (the error lists them).
  absl::StatusOr<std::optional<std::string>> Choice(std::string_view key, std::span<const std::string> choices) const;
  absl::StatusOr<std::optional<std::string>> Choice(std::string_view key,
                                                    std::initializer_list<std::string_view> choices) const;
  // A nested map (nullopt when absent); its field paths continue this one's.
  absl::StatusOr<std::optional<YamlMap>> Map(std::string_view key, std::string_view allowed = {}) const;
  // A list of maps, "<key>[i]" each (their own Check() says when one is not a map); fewer than `min_size`
  // entries is an error "expected <noun>, got ..." (`noun` defaults to "a list of at least <min_size> maps").
  absl::StatusOr<std::optional<std::vector<YamlMap>>> MapList(std::string_view key, size_t min_size,
                                                              std::string_view noun = {}) const;
  // A scalar in a notation of its own (rates, sizes): `parse` turns its text into a value, and its error's
  // message becomes the problem. `noun` says what was expected ("a rate": "expected a rate, got a list").
  template <typename T>
  absl::StatusOr<std::optional<T>> Parsed(std::string_view key, std::string_view noun,
                                          const std::function<absl::StatusOr<T>(std::string_view)>& parse,
                                          std::string_view allowed) const {
    if (!Has(key)) return std::optional<T>();
    const YAML::Node n = Node(key);
    if (!n.IsScalar()) return TypeError(n, key, noun, allowed);
    absl::StatusOr<T> v = parse(n.Scalar());
    if (!v.ok())
      return Error(n, key, std::string_view(v.status().message().data(), v.status().message().size()), allowed);
    return std::optional<T>(*std::move(v));
  }

 private:
  absl::Status TypeError(const YAML::Node& n, std::string_view key, std::string_view noun,
                         std::string_view allowed) const;

  YAML::Node node_;
  std::string file_;
  std::string path_;
};

}  // namespace fl::config
