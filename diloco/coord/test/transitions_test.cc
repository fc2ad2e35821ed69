// The coordinator's transition tables: docs/diloco-coordinator.md shows them row for row (this test parses the
// page's tables and compares), every state is reachable from the initial one, terminal states have no way out,
// and a pair that is not in a table is refused.
#include <array>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/diloco/coord/coordinator_states.h"

namespace fl::diloco {
namespace {

using Row = std::vector<std::string>;  // from, trigger, to, effect

std::string Trim(std::string s) {
  const auto keep = [](char c) { return c != ' ' && c != '`' && c != '\t'; };
  while (!s.empty() && !keep(s.front())) s.erase(s.begin());
  while (!s.empty() && !keep(s.back())) s.pop_back();
  return s;
}

// Every markdown table of the page whose header is `| from | trigger | to | effect |`, in page order.
std::vector<std::vector<Row>> TransitionTablesOf(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::vector<std::vector<Row>> tables;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind('|', 0) != 0) {
      inside = false;
      continue;
    }
    Row cells;
    std::stringstream ss(line.substr(1));
    for (std::string cell; std::getline(ss, cell, '|');) cells.push_back(Trim(cell));
    if (!cells.empty() && cells.back().empty()) cells.pop_back();
    if (cells == Row{"from", "trigger", "to", "effect"}) {
      tables.emplace_back();
      inside = true;
    } else if (inside && !cells.empty() && cells[0].find("---") == std::string::npos) {
      tables.back().push_back(cells);
    }
  }
  return tables;
}

template <class Table>
std::vector<Row> RowsOf(const Table& table) {
  std::vector<Row> rows;
  for (const auto& t : table) {
    rows.push_back({std::string(Name(t.from)), std::string(Name(t.trigger)), std::string(Name(t.to)),
                    std::string(Name(t.effect))});
  }
  return rows;
}

std::string Show(const std::vector<Row>& rows) {
  std::string out;
  for (const Row& r : rows) {
    out += "| ";
    for (const std::string& c : r) out += "`" + c + "` | ";
    out += "\n";
  }
  return out;
}

TEST(TransitionsTest, TheDocsTablesAreTheCodesTablesRowForRow) {
  const auto tables = TransitionTablesOf(std::string(FL_SOURCE_DIR) + "/docs/diloco-coordinator.md");
  ASSERT_EQ(tables.size(), 3u) << "docs/diloco-coordinator.md should have three '| from | trigger | to | effect |' "
                                  "tables: the experiment, one island, one sync";
  const std::array<std::pair<const char*, std::vector<Row>>, 3> code = {{
      {"RunState (kRunTransitions)", RowsOf(kRunTransitions)},
      {"IslandState (kIslandTransitions)", RowsOf(kIslandTransitions)},
      {"SyncState (kSyncTransitions)", RowsOf(kSyncTransitions)},
  }};
  for (size_t i = 0; i < code.size(); ++i) {
    EXPECT_EQ(tables[i], code[i].second) << "the docs' table " << i + 1 << " differs from " << code[i].first
                                         << "; the code's rows, to paste into docs/diloco-coordinator.md:\n"
                                         << Show(code[i].second);
  }
}

// From `initial`, every state of `all` is reachable, and exactly the `terminal` ones have no outgoing row.
template <class Table, class State>
void ExpectShape(const Table& table, State initial, const std::vector<State>& all, const std::set<State>& terminal) {
  std::set<State> reached = {initial};
  for (bool grew = true; grew;) {
    grew = false;
    for (const auto& row : table) {
      if (reached.contains(row.from) && reached.insert(row.to).second) grew = true;
    }
  }
  for (State s : all) {
    EXPECT_TRUE(reached.contains(s)) << Name(s) << " cannot be reached from " << Name(initial);
    bool has_exit = false;
    for (const auto& row : table) has_exit = has_exit || row.from == s;
    EXPECT_EQ(has_exit, !terminal.contains(s)) << Name(s);
  }
}

TEST(TransitionsTest, EveryStateIsReachableAndOnlyTerminalStatesHaveNoExit) {
  ExpectShape(
      kRunTransitions, RunState::kGatheringCohort,
      {RunState::kGatheringCohort, RunState::kRunning, RunState::kFinished, RunState::kFailed, RunState::kShutDown},
      {RunState::kShutDown});
  ExpectShape(
      kIslandTransitions, IslandState::kWaiting,
      {IslandState::kWaiting, IslandState::kLoading, IslandState::kActive, IslandState::kRepairing, IslandState::kGone},
      {IslandState::kGone});
  ExpectShape(kSyncTransitions, SyncState::kIdle,
              {SyncState::kIdle, SyncState::kGathering, SyncState::kExchanging, SyncState::kCommitted,
               SyncState::kFailed, SyncState::kAbandoned},
              {SyncState::kCommitted, SyncState::kFailed, SyncState::kAbandoned});
}

TEST(TransitionsTest, APairNotInTheTableIsRefused) {
  EXPECT_FALSE(FindTransition(kIslandTransitions, IslandState::kGone, IslandTrigger::kLeft).has_value())
      << "an island that is gone cannot leave again";
  EXPECT_FALSE(FindTransition(kIslandTransitions, IslandState::kLoading, IslandTrigger::kMissedReport).has_value())
      << "a loading island is in no epoch";
  EXPECT_FALSE(FindTransition(kSyncTransitions, SyncState::kCommitted, SyncTrigger::kFirstArrival).has_value());
  EXPECT_FALSE(FindTransition(kRunTransitions, RunState::kShutDown, RunTrigger::kCohortComplete).has_value());
  const auto row = FindTransition(kIslandTransitions, IslandState::kActive, IslandTrigger::kHeartbeatLost);
  ASSERT_TRUE(row.has_value());
  EXPECT_EQ(row->to, IslandState::kGone);
  EXPECT_EQ(row->effect, IslandEffect::kEvict);
}

TEST(TransitionsTest, DeparturesCountAsEvictionsWithTheirMetricLabel) {
  EXPECT_EQ(DepartureLabel(IslandTrigger::kHeartbeatLost), "heartbeat");
  EXPECT_EQ(DepartureLabel(IslandTrigger::kLeft), "left");
  EXPECT_TRUE(IsEviction(IslandTrigger::kMissedReport));
  EXPECT_FALSE(IsEviction(IslandTrigger::kShutdown));
  EXPECT_FALSE(IsEviction(IslandTrigger::kNoStateSource));
  EXPECT_FALSE(IsEviction(IslandTrigger::kRepairOrdered));
}

}  // namespace
}  // namespace fl::diloco
