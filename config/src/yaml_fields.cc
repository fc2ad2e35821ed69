#include "fl/config/yaml_fields.h"

#include <cmath>
#include <sstream>
#include <unordered_map>
#include <vector>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include "fl/core/str_cat.h"
#include "fl/sys/user_file.h"

namespace fl::config {
namespace {

// A number as the reader of the error wrote it in the file would: 1e-06, 60000, 0.5.
std::string FormatNumber(double v) { return fl::StrCat(v); }

}  // namespace

absl::StatusOr<std::string> ReadTextFile(const std::filesystem::path& path, std::string_view what) {
  return sys::ReadUserFile(path.string(), what, kMaxYamlFileBytes,
                           "manifests and profiles are a few KB: check that this is the right file");
}

namespace {

// A limit of ParseYaml's first pass, thrown out of yaml-cpp's parser (which stops there: its recursion is bounded
// by the depth at which this is thrown) and caught in ParseYaml.
struct StrictYamlError {
  YAML::Mark mark;
  std::string path;  // the field path, "" when the problem is the document's
  std::string problem;
};

// The first pass over a document's events (no tree is built): keys given twice, depth, node count. Keys are
// compared by their text, as yaml-cpp's lookups compare them.
class StrictYamlChecker : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Leaf(mark, "~"); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override { Leaf(mark, fl::StrCat("*", anchor)); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string& value) override {
    Leaf(mark, value);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    Open(mark, /*is_map=*/false);
  }
  void OnSequenceEnd() override { Close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    Open(mark, /*is_map=*/true);
  }
  void OnMapEnd() override { Close(); }

 private:
  struct Frame {
    bool is_map = false;
    bool next_is_key = true;  // maps: whether the next node is a key or a value
    std::string path;
    std::string key;                            // maps: the key of the value being read
    size_t index = 0;                           // lists: the entry being read
    std::unordered_map<std::string, int> keys;  // maps: key -> its 1-based line
  };

  std::string ChildPath() const {
    if (stack_.empty()) return {};
    const Frame& f = stack_.back();
    if (!f.is_map) return fl::StrCat(f.path, "[", f.index, "]");
    return f.path.empty() ? f.key : fl::StrCat(f.path, ".", f.key);
  }

  // A node starts under the top frame; `scalar` is its text when it is a leaf. Returns whether it is a key.
  bool Begin(const YAML::Mark& mark, const std::string* scalar) {
    if (++nodes_ > kMaxYamlNodes) {
      throw StrictYamlError{mark, ChildPath(),
                            fl::StrCat("more than ", kMaxYamlNodes,
                                       " YAML nodes (maps, lists and values); the loaders' files have a few hundred: "
                                       "check that this is the right file")};
    }
    if (stack_.empty() || !stack_.back().is_map || !stack_.back().next_is_key) return false;
    Frame& f = stack_.back();
    if (scalar == nullptr) {
      f.key = "<non-scalar key>";
      return true;
    }
    const int line = mark.line + 1;
    auto [it, inserted] = f.keys.emplace(*scalar, line);
    if (!inserted) {
      throw StrictYamlError{mark, f.path.empty() ? *scalar : fl::StrCat(f.path, ".", *scalar),
                            fl::StrCat("key given twice (first at line ", it->second, ", again at line ", line,
                                       "); a key may appear once in a map: keep one of the two")};
    }
    f.key = *scalar;
    return true;
  }

  // A node under the top frame is complete.
  void End() {
    if (stack_.empty()) return;
    Frame& f = stack_.back();
    if (f.is_map) {
      f.next_is_key = !f.next_is_key;
    } else {
      ++f.index;
    }
  }

  void Leaf(const YAML::Mark& mark, const std::string& text) {
    Begin(mark, &text);
    End();
  }

  void Open(const YAML::Mark& mark, bool is_map) {
    const bool is_key = Begin(mark, nullptr);
    Frame f;
    f.is_map = is_map;
    f.path = is_key ? fl::StrCat(ChildPath(), "<key>") : ChildPath();
    if (stack_.size() >= static_cast<size_t>(kMaxYamlDepth)) {
      throw StrictYamlError{mark, f.path,
                            fl::StrCat("maps and lists nested deeper than ", kMaxYamlDepth,
                                       " levels; the loaders' files nest a few: look for an unclosed [ or {")};
    }
    stack_.push_back(std::move(f));
  }

  void Close() {
    if (!stack_.empty()) stack_.pop_back();
    End();
  }

  std::vector<Frame> stack_;
  size_t nodes_ = 0;
};

}  // namespace

absl::StatusOr<YAML::Node> ParseYaml(std::string_view text, std::string_view file) {
  const std::string input(text);
  try {
    // The first pass: refuses what yaml-cpp would keep silently (a key given twice) or could not survive (depth),
    // before it builds a tree. Only the first document is checked: it is the only one YAML::Load reads.
    std::istringstream in(input);
    YAML::Parser parser(in);
    StrictYamlChecker checker;
    parser.HandleNextDocument(checker);
  } catch (const StrictYamlError& e) {
    std::string where(file.empty() ? std::string_view("<inline>") : file);
    if (e.mark.line >= 0) where = fl::StrCat(where, ":", e.mark.line + 1);
    return absl::InvalidArgumentError(
        fl::StrCat(where, ": ", e.path.empty() ? std::string("(top level)") : e.path, ": ", e.problem));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        fl::StrCat(file, ":", e.mark.line + 1, ": not valid YAML: ", e.msg, "; fix the syntax and run again"));
  }
  try {
    return YAML::Load(input);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        fl::StrCat(file, ":", e.mark.line + 1, ": not valid YAML: ", e.msg, "; fix the syntax and run again"));
  }
}

absl::StatusOr<YAML::Node> LoadYamlFile(const std::filesystem::path& path, std::string_view what) {
  absl::StatusOr<std::string> text = ReadTextFile(path, what);
  if (!text.ok()) return text.status();
  return ParseYaml(*text, path.string());
}

std::string DescribeYaml(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "nothing (null)";
    case YAML::NodeType::Sequence: return node.size() == 0 ? "an empty list" : "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Scalar: return fl::StrCat("\"", node.Scalar(), "\"");
    default: return "an undefined value";
  }
}

std::string JoinList(std::span<const std::string> items) {
  std::string out;
  for (const std::string& s : items) out = out.empty() ? s : fl::StrCat(out, ", ", s);
  return out;
}

YamlMap::YamlMap(YAML::Node node, std::string file, std::string path)
    : node_(std::move(node)), file_(std::move(file)), path_(std::move(path)) {}

int YamlMap::Line() const { return node_.IsDefined() && node_.Mark().line >= 0 ? node_.Mark().line + 1 : 0; }

std::string YamlMap::Path(std::string_view key) const {
  return path_.empty() ? std::string(key) : fl::StrCat(path_, ".", key);
}

absl::Status YamlMap::Error(const YAML::Node& node, std::string_view field, std::string_view problem,
                            std::string_view allowed) const {
  const int line = node.IsDefined() && node.Mark().line >= 0 ? node.Mark().line + 1 : Line();
  std::string where = file_.empty() ? std::string("<inline>") : file_;
  // Nodes built in code rather than parsed have no line: then the file alone.
  if (line > 0) where = fl::StrCat(where, ":", line);
  const std::string path = field.empty() ? (path_.empty() ? std::string("(top level)") : path_) : Path(field);
  std::string message = fl::StrCat(where, ": ", path, ": ", problem);
  if (!allowed.empty()) message = fl::StrCat(message, "; allowed: ", allowed);
  return absl::InvalidArgumentError(message);
}

absl::Status YamlMap::TypeError(const YAML::Node& n, std::string_view key, std::string_view noun,
                                std::string_view allowed) const {
  return Error(n, key, fl::StrCat("expected ", noun, ", got ", DescribeYaml(n)), allowed);
}

absl::Status YamlMap::Check(std::span<const std::string> allowed) const {
  if (!node_.IsMap()) {
    return Error(node_, "", fl::StrCat("expected a map, got ", DescribeYaml(node_)),
                 fl::StrCat("a map with keys ", JoinList(allowed)));
  }
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : std::string("<non-scalar key>");
    bool ok = false;
    for (const std::string& a : allowed) ok = ok || a == key;
    if (!ok) return Error(it->first, key, "unknown key", JoinList(allowed));
  }
  return absl::OkStatus();
}

absl::Status YamlMap::Check(std::initializer_list<std::string_view> allowed) const {
  std::vector<std::string> keys(allowed.begin(), allowed.end());
  return Check(std::span<const std::string>(keys));
}

bool YamlMap::Has(std::string_view key) const { return node_.IsMap() && node_[std::string(key)]; }

YAML::Node YamlMap::Node(std::string_view key) const {
  if (!node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  return node_[std::string(key)];
}

absl::Status YamlMap::Required(std::string_view key, std::string_view allowed) const {
  if (Has(key)) return absl::OkStatus();
  return Error(node_, key, "missing (it is required)", allowed);
}

absl::StatusOr<std::optional<std::string>> YamlMap::String(std::string_view key, std::string_view allowed) const {
  if (!Has(key)) return std::optional<std::string>();
  const YAML::Node n = Node(key);
  if (!n.IsScalar()) return TypeError(n, key, "a string", allowed.empty() ? "a string" : allowed);
  return std::optional<std::string>(n.Scalar());
}

absl::StatusOr<std::optional<double>> YamlMap::Number(std::string_view key, NumberRange range,
                                                      std::string_view allowed) const {
  if (!Has(key)) return std::optional<double>();
  const YAML::Node n = Node(key);
  const std::string default_allowed = fl::StrCat("a number in [", FormatNumber(range.min), ", ",
                                                 FormatNumber(range.max), range.max_exclusive ? ")" : "]");
  if (allowed.empty()) allowed = default_allowed;
  double v = 0;
  if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !std::isfinite(v)) {
    return TypeError(n, key, "a number", allowed);
  }
  if (v < range.min || v > range.max || (range.max_exclusive && v == range.max)) {
    return Error(n, key, fl::StrCat("value ", n.Scalar(), " is out of range"), allowed);
  }
  return std::optional<double>(v);
}

absl::StatusOr<std::optional<int64_t>> YamlMap::Integer(std::string_view key, int64_t min, int64_t max,
                                                        std::string_view allowed) const {
  if (!Has(key)) return std::optional<int64_t>();
  const YAML::Node n = Node(key);
  const std::string default_allowed = fl::StrCat("an integer in [", min, ", ", max, "]");
  if (allowed.empty()) allowed = default_allowed;
  int64_t v = 0;
  if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v)) return TypeError(n, key, "an integer", allowed);
  if (v < min || v > max) return Error(n, key, fl::StrCat("value ", n.Scalar(), " is out of range"), allowed);
  return std::optional<int64_t>(v);
}

absl::StatusOr<std::optional<bool>> YamlMap::Bool(std::string_view key) const {
  if (!Has(key)) return std::optional<bool>();
  const YAML::Node n = Node(key);
  bool v = false;
  if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) return TypeError(n, key, "true or false", "true, false");
  return std::optional<bool>(v);
}

absl::StatusOr<std::optional<std::string>> YamlMap::Choice(std::string_view key,
                                                           std::span<const std::string> choices) const {
  const std::string list = JoinList(choices);
  if (!Has(key)) return std::optional<std::string>();
  const YAML::Node n = Node(key);
  if (!n.IsScalar()) return TypeError(n, key, "one of the allowed values", list);
  for (const std::string& c : choices) {
    if (c == n.Scalar()) return std::optional<std::string>(c);
  }
  return Error(n, key, fl::StrCat("unknown value \"", n.Scalar(), "\""), list);
}

absl::StatusOr<std::optional<std::string>> YamlMap::Choice(std::string_view key,
                                                           std::initializer_list<std::string_view> choices) const {
  std::vector<std::string> list(choices.begin(), choices.end());
  return Choice(key, std::span<const std::string>(list));
}

absl::StatusOr<std::optional<YamlMap>> YamlMap::Map(std::string_view key, std::string_view allowed) const {
  if (!Has(key)) return std::optional<YamlMap>();
  const YAML::Node n = Node(key);
  if (!n.IsMap()) return TypeError(n, key, "a map", allowed.empty() ? "a map" : allowed);
  return std::optional<YamlMap>(YamlMap(n, file_, Path(key)));
}

absl::StatusOr<std::optional<std::vector<YamlMap>>> YamlMap::MapList(std::string_view key, size_t min_size,
                                                                     std::string_view noun) const {
  if (!Has(key)) return std::optional<std::vector<YamlMap>>();
  const YAML::Node n = Node(key);
  if (!n.IsSequence() || n.size() < min_size) {
    const std::string default_noun =
        min_size == 0 ? "a list of maps"
                      : fl::StrCat("a list of at least ", min_size, min_size == 1 ? " map" : " maps");
    return TypeError(n, key, noun.empty() ? std::string_view(default_noun) : noun, {});
  }
  std::vector<YamlMap> out;
  out.reserve(n.size());
  for (size_t i = 0; i < n.size(); ++i) out.emplace_back(n[i], file_, fl::StrCat(Path(key), "[", i, "]"));
  return std::optional<std::vector<YamlMap>>(std::move(out));
}

}  // namespace fl::config
