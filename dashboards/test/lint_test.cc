// Lints the Grafana dashboards and their provisioning: what Grafana would silently get wrong (a panel drawn
// over another, a panel bound to a data source that does not exist, a uid that changed and broke every link
// to the dashboard) fails here instead.
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "dashboards.h"

namespace fl::dashboards {
namespace {

using nlohmann::json;

// Dashboard uids are part of the dashboards' URLs (/d/<uid>): links and bookmarks depend on them. Changing one
// is a breaking change; this list changes with it, on purpose.
const std::map<std::string, std::string>& StableUids() {
  static const std::map<std::string, std::string> kUids = {
      {"links.json", "fl-links"},
      {"round-overview.json", "fl-round-overview"},
      {"straggler-analysis.json", "fl-stragglers"},
  };
  return kUids;
}

void ExpectFixedDataSource(const json& ds, const std::string& where) {
  ASSERT_TRUE(ds.is_object()) << where << ": no data source object (a panel must name the fixed one, not the default)";
  EXPECT_EQ(ds.value("type", ""), "prometheus") << where;
  EXPECT_EQ(ds.value("uid", ""), kDataSourceUid) << where;
}

TEST(DashboardLintTest, EveryDashboardIsValidJsonWithItsStableUid) {
  const auto dashboards = LoadDashboards();
  std::set<std::string> files;
  for (const auto& d : dashboards) {
    files.insert(d.file);
    ASSERT_FALSE(d.json.is_discarded()) << d.file << " is not valid JSON";
    ASSERT_TRUE(StableUids().count(d.file)) << d.file << " is new: add its uid to StableUids()";
    EXPECT_EQ(d.json.value("uid", ""), StableUids().at(d.file)) << d.file;
    EXPECT_TRUE(d.json.contains("id") && d.json["id"].is_null())
        << d.file << ": \"id\" must be null (Grafana assigns it; a fixed id clashes on import)";
    EXPECT_FALSE(d.json.value("title", "").empty()) << d.file;
    EXPECT_GE(d.json.value("schemaVersion", 0), 30) << d.file << ": not a current classic dashboard schema";
    EXPECT_FALSE(d.json.value("panels", json::array()).empty()) << d.file;
  }
  for (const auto& [file, uid] : StableUids())
    EXPECT_TRUE(files.count(file)) << file << " (uid " << uid << ") is missing";
}

TEST(DashboardLintTest, PanelIdsAreUniqueAndTheGridHasNoOverlaps) {
  for (const auto& d : LoadDashboards()) {
    std::set<int> ids;
    struct Box {
      int x, y, w, h;
      std::string title;
    };
    std::vector<Box> boxes;
    for (const auto& p : d.json["panels"]) {
      const std::string title = p.value("title", "");
      ASSERT_TRUE(p.contains("id") && p["id"].is_number_integer()) << d.file << " '" << title << "': no integer id";
      EXPECT_TRUE(ids.insert(p["id"].get<int>()).second) << d.file << ": panel id " << p["id"] << " repeats";
      const json& g = p.value("gridPos", json::object());
      const Box b{g.value("x", -1), g.value("y", -1), g.value("w", 0), g.value("h", 0), title};
      EXPECT_GE(b.x, 0) << d.file << " '" << title << "'";
      EXPECT_GE(b.y, 0) << d.file << " '" << title << "'";
      EXPECT_GE(b.w, 1) << d.file << " '" << title << "'";
      EXPECT_GE(b.h, 1) << d.file << " '" << title << "'";
      EXPECT_LE(b.x + b.w, 24) << d.file << " '" << title << "' runs past Grafana's 24 columns";
      for (const Box& o : boxes) {
        const bool overlap = b.x < o.x + o.w && o.x < b.x + b.w && b.y < o.y + o.h && o.y < b.y + b.h;
        EXPECT_FALSE(overlap) << d.file << ": '" << title << "' overlaps '" << o.title << "'";
      }
      boxes.push_back(b);
    }
  }
}

TEST(DashboardLintTest, EveryPanelTargetAndVariableUsesTheFixedPrometheusDataSource) {
  for (const auto& d : LoadDashboards()) {
    for (const auto& p : d.json["panels"]) {
      const std::string where = d.file + " '" + p.value("title", "") + "'";
      ExpectFixedDataSource(p.value("datasource", json()), where);
      const json& targets = p.value("targets", json::array());
      EXPECT_FALSE(targets.empty()) << where << " has no query";
      std::set<std::string> refs;
      for (const auto& t : targets) {
        ExpectFixedDataSource(t.value("datasource", json()), where + " target " + t.value("refId", "?"));
        EXPECT_TRUE(refs.insert(t.value("refId", "")).second) << where << ": refId repeats";
        EXPECT_FALSE(t.value("expr", "").empty()) << where << ": empty expr";
      }
    }
    for (const auto& v : d.json["templating"]["list"]) {
      if (v.value("type", "") == "query")
        ExpectFixedDataSource(v.value("datasource", json()), d.file + " $" + v.value("name", ""));
    }
  }
}

TEST(DashboardLintTest, EveryDashboardHasTheTemplateVariablesAndItsQueriesUseOnlyKnownOnes) {
  for (const auto& d : LoadDashboards()) {
    std::map<std::string, std::string> values;
    for (const auto& v : d.json["templating"]["list"]) {
      const std::string name = v.value("name", "");
      values[name] = std::string(1, 'x');
      LabelValuesQuery q;
      EXPECT_TRUE(ParseLabelValues(v.value("definition", ""), &q))
          << d.file << " $" << v.value("name", "") << ": expected label_values(<selector>, <label>)";
    }
    for (const char* name : {"experiment", "link_kind", "device_class", "client"}) {
      EXPECT_TRUE(values.count(name)) << d.file << " lacks the $" << name << " variable";
    }
    for (const PanelQuery& q : PanelQueries(d)) {
      EXPECT_EQ(Substitute(q.expr, values).find('$'), std::string::npos)
          << q.where << " uses a variable the dashboard does not define: " << q.expr;
      EXPECT_NE(q.expr.find("experiment=~\"$experiment\""), std::string::npos)
          << q.where << " does not select the experiment: " << q.expr;
    }
  }
}

// The provisioning files name the same data source uid as the panels and point Grafana at the folder the
// compose file mounts the dashboards into.
TEST(DashboardLintTest, ProvisioningMatchesTheDashboardsAndTheComposeFile) {
  const std::string dir = FL_DASHBOARDS_DIR;
  YAML::Node ds = YAML::LoadFile(dir + "/provisioning/datasources/prometheus.yaml");
  ASSERT_EQ(ds["apiVersion"].as<int>(), 1);
  ASSERT_EQ(ds["datasources"].size(), 1u);
  EXPECT_EQ(ds["datasources"][0]["uid"].as<std::string>(), kDataSourceUid);
  EXPECT_EQ(ds["datasources"][0]["type"].as<std::string>(), "prometheus");
  EXPECT_FALSE(ds["datasources"][0]["url"].as<std::string>().empty());

  YAML::Node dash = YAML::LoadFile(dir + "/provisioning/dashboards/fl-testbed.yaml");
  ASSERT_EQ(dash["providers"].size(), 1u);
  const std::string path = dash["providers"][0]["options"]["path"].as<std::string>();

  YAML::Node compose = YAML::LoadFile(std::string(FL_SOURCE_DIR) + "/deploy/compose.yaml");
  std::set<std::string> grafana_mounts;
  for (const auto& v : compose["services"]["grafana"]["volumes"]) grafana_mounts.insert(v.as<std::string>());
  EXPECT_TRUE(grafana_mounts.count("../dashboards:" + path + ":ro"))
      << "compose.yaml must mount ../dashboards at the provider's path " << path;
  EXPECT_TRUE(grafana_mounts.count("../dashboards/provisioning:/etc/grafana/provisioning:ro"));
  // The data source URL names the compose service and port Prometheus listens on.
  EXPECT_EQ(ds["datasources"][0]["url"].as<std::string>(), "http://prometheus:9090");
  EXPECT_TRUE(compose["services"]["prometheus"]) << "compose.yaml has no prometheus service";
}

}  // namespace
}  // namespace fl::dashboards
