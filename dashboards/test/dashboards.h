// Test support for dashboards/: loading the Grafana dashboards, listing every panel query, and substituting
// template variables the way Grafana does before it sends a query to Prometheus.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fl::dashboards {

// The Prometheus data source every panel uses (provisioning/datasources/prometheus.yaml).
inline constexpr const char* kDataSourceUid = "fl-prometheus";

struct Dashboard {
  std::string file;  // file name in dashboards/
  nlohmann::json json;
};

// Every dashboards/*.json, sorted by file name.
inline std::vector<Dashboard> LoadDashboards(const std::string& dir = FL_DASHBOARDS_DIR) {
  std::vector<Dashboard> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    std::ifstream in(entry.path());
    out.push_back({entry.path().filename().string(), nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false)});
  }
  std::sort(out.begin(), out.end(), [](const Dashboard& a, const Dashboard& b) { return a.file < b.file; });
  return out;
}

struct PanelQuery {
  std::string where;  // "links.json panel 3 'Throughput' target A", for messages
  std::string expr;
};

inline std::vector<PanelQuery> PanelQueries(const Dashboard& d) {
  std::vector<PanelQuery> out;
  for (const auto& panel : d.json.value("panels", nlohmann::json::array())) {
    for (const auto& target : panel.value("targets", nlohmann::json::array())) {
      out.push_back({d.file + " panel " + std::to_string(panel.value("id", -1)) + " '" + panel.value("title", "") +
                         "' target " + target.value("refId", "?"),
                     target.value("expr", "")});
    }
  }
  return out;
}

// A template variable of type query: `label_values(<selector>, <label>)`.
struct LabelValuesQuery {
  std::string selector;
  std::string label;
};

inline bool ParseLabelValues(const std::string& definition, LabelValuesQuery* out) {
  static const std::regex re(R"(^\s*label_values\(\s*(.+)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$)");
  std::smatch m;
  if (!std::regex_match(definition, m, re)) return false;
  out->selector = m[1];
  out->label = m[2];
  return true;
}

// Grafana's built-in interval variables, fixed for the tests to windows that cover a short live run.
inline const std::map<std::string, std::string>& BuiltinIntervals() {
  static const std::map<std::string, std::string> kBuiltins = {{"__rate_interval", "1m"},  {"__interval", "15s"},
                                                               {"__range", "10m"},         {"__range_s", "600"},
                                                               {"__interval_ms", "15000"}, {"__range_ms", "600000"}};
  return kBuiltins;
}

// Replaces $name and ${name} for every variable in `values` and the built-in intervals; longer names first, so
// that $__range_s is not read as $__range followed by "_s".
inline std::string Substitute(std::string expr, const std::map<std::string, std::string>& values) {
  std::map<std::string, std::string> all = BuiltinIntervals();
  for (const auto& [k, v] : values) all[k] = v;
  std::vector<std::pair<std::string, std::string>> ordered(all.begin(), all.end());
  std::sort(ordered.begin(), ordered.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (const auto& [name, value] : ordered) {
    for (const std::string& token : {"${" + name + "}", "$" + name}) {
      for (size_t pos; (pos = expr.find(token)) != std::string::npos;) expr.replace(pos, token.size(), value);
    }
  }
  return expr;
}

// The value Grafana puts into a regex matcher for a multi-value selection: (a|b|c), each regex-escaped.
inline std::string MultiValueRegex(const std::vector<std::string>& values) {
  std::string out = "(";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += "|";
    for (char c : values[i]) {
      if (std::string_view(R"(\.+*?()|[]{}^$)").find(c) != std::string_view::npos) out += "\\\\";
      out += c;
    }
  }
  return out + ")";
}

}  // namespace fl::dashboards
