// The module graph, checked against the code: every `#include "fl/..."` of a module's library sources (its
// include/ and src/ folders) must be a dependency that docs/architecture.md declares for it, every declared
// dependency must be used, the declared graph must have no cycle, and no file includes another module's src/.
// So the page stays the module graph "as it now is", and a change that points a module the wrong way fails
// here instead of in a reviewer's head.
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

namespace fs = std::filesystem;

const fs::path kRoot = FL_SOURCE_DIR;

// A module: its name in the docs' table and its folder (the deepest folder that contains a file decides).
struct Module {
  std::string name;
  std::string folder;
};

// Every folder with an include/ or src/ of its own is a module; a few folders nest (training/data in client).
std::vector<Module> FindModules() {
  std::vector<Module> out;
  for (const auto& entry : fs::recursive_directory_iterator(kRoot)) {
    const fs::path rel = fs::relative(entry.path(), kRoot);
    const std::string first = rel.begin()->string();
    if (first == "build" || first == "examples" || first.starts_with(".")) continue;
    if (!entry.is_directory()) continue;
    if (!fs::exists(entry.path() / "CMakeLists.txt")) continue;
    if (!fs::exists(entry.path() / "src") && !fs::exists(entry.path() / "include")) continue;
    out.push_back({rel.string(), rel.string()});
  }
  return out;
}

const Module* ModuleOf(const std::vector<Module>& modules, const std::string& rel_path) {
  const Module* best = nullptr;
  for (const Module& m : modules) {
    if (rel_path.starts_with(m.folder + "/") && (best == nullptr || m.folder.size() > best->folder.size())) best = &m;
  }
  return best;
}

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool IsSource(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".h" || ext == ".cc" || ext == ".cpp";
}

struct Graph {
  std::map<std::string, std::set<std::string>> edges;                  // module -> modules it includes
  std::map<std::pair<std::string, std::string>, std::string> example;  // an include that makes the edge
  std::vector<std::string> src_includes;                               // includes of another module's src/
  std::vector<std::string> unknown;                                    // fl/ headers found nowhere
};

Graph ScanCode(const std::vector<Module>& modules) {
  // Public headers: "fl/<x>/<y>.h" -> the module whose include/ holds it.
  std::map<std::string, std::string> header_module;
  for (const Module& m : modules) {
    const fs::path inc = kRoot / m.folder / "include";
    if (!fs::exists(inc)) continue;
    for (const auto& e : fs::recursive_directory_iterator(inc)) {
      if (e.is_regular_file()) header_module[fs::relative(e.path(), inc).string()] = m.name;
    }
  }
  Graph g;
  const std::regex include(R"re(^\s*#\s*include\s*"([^"]+)")re");
  for (const Module& m : modules) {
    for (const auto& e : fs::recursive_directory_iterator(kRoot / m.folder)) {
      if (!e.is_regular_file() || !IsSource(e.path())) continue;
      const std::string rel = fs::relative(e.path(), kRoot).string();
      const Module* owner = ModuleOf(modules, rel);
      if (owner != &m) continue;  // a nested module's file
      // A binary's main file sits above every module it uses (fl-client's main links the LibTorch trainer):
      // it is not part of its folder's library.
      const std::string file = e.path().filename().string();
      const bool binary = file == "main.cc" || file.ends_with("_main.cc");
      const bool library =
          !binary && (rel.find("/include/") != std::string::npos || rel.find("/src/") != std::string::npos);
      std::istringstream lines(Read(e.path()));
      for (std::string line; std::getline(lines, line);) {
        std::smatch match;
        if (!std::regex_search(line, match, include)) continue;
        const std::string target = match[1].str();
        if (target.find("src/") != std::string::npos || target.starts_with("../")) {
          // Allowed only within the file's own module (a test of its private header).
          const std::string resolved =
              fs::relative(fs::weakly_canonical(e.path().parent_path() / target), kRoot).string();
          if (ModuleOf(modules, resolved) != &m) g.src_includes.push_back(rel + ": " + target);
          continue;
        }
        if (!target.starts_with("fl/") || target.starts_with("fl/v1/")) continue;  // generated protos: proto
        auto it = header_module.find(target);
        if (it == header_module.end()) {
          g.unknown.push_back(rel + ": " + target);
          continue;
        }
        if (!library || it->second == m.name) continue;  // tests may use any module, `testing` too
        if (g.edges[m.name].insert(it->second).second) g.example[{m.name, it->second}] = rel + " includes " + target;
      }
    }
  }
  return g;
}

// The table between the markers of docs/architecture.md: | `module` | `dep`, `dep` |
std::map<std::string, std::set<std::string>> DocumentedGraph() {
  const std::string doc = Read(kRoot / "docs/architecture.md");
  const size_t begin = doc.find("<!-- module-graph: begin -->");
  const size_t end = doc.find("<!-- module-graph: end -->");
  EXPECT_NE(begin, std::string::npos);
  EXPECT_NE(end, std::string::npos);
  std::map<std::string, std::set<std::string>> out;
  if (begin == std::string::npos || end == std::string::npos) return out;
  const std::regex row(R"(^\|\s*`([\w/]+)`\s*\|(.*)\|\s*$)");
  const std::regex dep("`([\\w/]+)`");
  std::istringstream lines(doc.substr(begin, end - begin));
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    auto& deps = out[m[1].str()];
    const std::string cell = m[2].str();
    for (auto it = std::sregex_iterator(cell.begin(), cell.end(), dep); it != std::sregex_iterator(); ++it) {
      deps.insert((*it)[1].str());
    }
  }
  return out;
}

TEST(ModuleGraphTest, EveryIncludeIsADocumentedDependencyAndEveryDocumentedOneIsUsed) {
  const std::vector<Module> modules = FindModules();
  ASSERT_GT(modules.size(), 10u);
  const Graph code = ScanCode(modules);
  const auto documented = DocumentedGraph();
  for (const Module& m : modules) {
    EXPECT_TRUE(documented.contains(m.name)) << "docs/architecture.md has no row for module " << m.name;
  }
  for (const auto& [module, deps] : code.edges) {
    const auto doc = documented.find(module);
    for (const std::string& d : deps) {
      EXPECT_TRUE(doc != documented.end() && doc->second.contains(d))
          << module << " depends on " << d << " (" << code.example.at({module, d})
          << ") but docs/architecture.md does not say so: a wrong-way dependency, or a missing row entry";
    }
  }
  for (const auto& [module, deps] : documented) {
    for (const std::string& d : deps) {
      const auto it = code.edges.find(module);
      EXPECT_TRUE(it != code.edges.end() && it->second.contains(d))
          << "docs/architecture.md says " << module << " depends on " << d << " but no include does";
    }
  }
}

TEST(ModuleGraphTest, NoFileIncludesAnotherModulesSourcesOrAnUnknownHeader) {
  const Graph code = ScanCode(FindModules());
  for (const std::string& s : code.src_includes) {
    // A module's own private headers sit next to its sources and are included by bare name; a path with
    // src/ or ../ reaches into another folder.
    ADD_FAILURE() << s;
  }
  for (const std::string& s : code.unknown) ADD_FAILURE() << "no module's include/ holds " << s;
}

TEST(ModuleGraphTest, TheDocumentedGraphHasNoCycle) {
  const auto graph = DocumentedGraph();
  std::map<std::string, int> state;  // 0 new, 1 on the path, 2 done
  std::vector<std::string> path;
  std::function<bool(const std::string&)> visit = [&](const std::string& n) {
    if (state[n] == 1) {
      path.push_back(n);
      return true;
    }
    if (state[n] == 2) return false;
    state[n] = 1;
    path.push_back(n);
    if (auto it = graph.find(n); it != graph.end()) {
      for (const std::string& d : it->second) {
        if (visit(d)) return true;
      }
    }
    path.pop_back();
    state[n] = 2;
    return false;
  };
  for (const auto& [n, deps] : graph) {
    if (visit(n)) {
      std::string cycle;
      for (const std::string& p : path) cycle += p + " -> ";
      FAIL() << "cycle: " << cycle;
    }
  }
}

}  // namespace
