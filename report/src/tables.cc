#include "fl/report/tables.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "fl/core/str_cat.h"
#include "fl/core/task.h"

namespace fl::report {
namespace {

Cell Opt(const std::optional<double>& v) { return v.has_value() ? Cell(*v) : Cell(); }
Cell OptInt(const std::optional<int64_t>& v) { return v.has_value() ? Cell(*v) : Cell(); }
Cell StatMean(const Stat& s) { return s.n > 0 ? Cell(s.mean) : Cell(); }
Cell StatMax(const Stat& s) { return s.n > 0 ? Cell(s.max) : Cell(); }
Cell Text(std::string s) { return s.empty() ? Cell() : Cell(std::move(s)); }

std::string Label(const ExperimentData& data, const std::string& client_id) {
  const ClientInfo* c = data.FindClient(client_id);
  return c != nullptr ? c->label : client_id;
}

std::string LinkOf(const ExperimentData& data, const std::string& client_id) {
  const ClientInfo* c = data.FindClient(client_id);
  return c != nullptr ? c->link_kind : "unknown";
}

// Shortest text that reads back to the same double.
std::string FullPrecision(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"') out += '"';
    out += ch;
  }
  return out + "\"";
}

nlohmann::ordered_json CellJson(const Cell& c) {
  switch (c.kind) {
    case Cell::Kind::kInt: return c.int_value;
    case Cell::Kind::kReal: return c.real_value;
    case Cell::Kind::kText: return c.text;
    case Cell::Kind::kEmpty: break;
  }
  return nullptr;
}

}  // namespace

int Table::ColumnIndex(std::string_view column) const {
  for (size_t i = 0; i < columns.size(); ++i) {
    if (columns[i].name == column) return static_cast<int>(i);
  }
  return -1;
}

std::vector<EvalColumn> EvalColumns(std::string_view task) {
  // The task's metric first, then the loss it is derived from (docs/report.md).
  const core::Task t = core::ParseTask(task).value_or(core::Task::kClassification);
  if (t == core::Task::kRegression) {
    return {{"eval_mae", [](const RoundAttempt& r) { return r.eval_mae; }},
            {"eval_loss", [](const RoundAttempt& r) { return r.eval_loss; }}};
  }
  if (t == core::Task::kNextToken) {
    return {{"eval_perplexity", [](const RoundAttempt& r) { return r.eval_perplexity; }},
            {"eval_token_accuracy", [](const RoundAttempt& r) { return r.eval_accuracy; }},
            {"eval_loss", [](const RoundAttempt& r) { return r.eval_loss; }}};
  }
  return {{"eval_accuracy", [](const RoundAttempt& r) { return r.eval_accuracy; }},
          {"eval_loss", [](const RoundAttempt& r) { return r.eval_loss; }}};
}

Table RoundsTable(const ExperimentData& data, const Analysis& analysis) {
  Table t;
  t.name = "rounds";
  // Buffered aggregation (FedBuff): each rounds row is an aggregation step (docs/round-engine.md).
  const bool steps = data.experiment.aggregation == "buffered";
  t.title = fl::StrCat(steps ? "Aggregation steps (buffered, " : "Rounds (", data.experiment.task, ")");
  t.columns = {{"round", 0},           {"attempt", 0},       {"status", 0},         {"selected", 0},
               {"accepted", 0},        {"late", 0},          {"dropped", 0},        {"rejected", 0},
               {"cancelled", 0},       {"folded", 0},        {"aggregation_ms", 2}, {"downlink_mean_ms", 1},
               {"downlink_max_ms", 1}, {"train_mean_ms", 1}, {"train_max_ms", 1},   {"uplink_mean_ms", 1},
               {"uplink_max_ms", 1},   {"round_ms", 1}};
  if (steps) t.columns[0].name = "step";
  const std::vector<EvalColumn> eval = EvalColumns(data.experiment.task);
  for (const EvalColumn& c : eval) t.columns.emplace_back(c.name, 4);
  // Central differential privacy (schema v10): only for a run that had it.
  const bool private_run = std::any_of(analysis.rounds.begin(), analysis.rounds.end(),
                                       [](const RoundSummary& s) { return s.attempt->dp_epsilon.has_value(); });
  if (private_run) {
    t.columns.emplace_back("dp_epsilon", 4);
    t.columns.emplace_back("dp_clip_norm", 4);
  }
  // Secure aggregation (schema v11): likewise only for a run that had it.
  const bool secure_run = std::any_of(analysis.rounds.begin(), analysis.rounds.end(), [](const RoundSummary& s) {
    return s.attempt->secagg_survivors.has_value() || s.attempt->secagg_dropped.has_value();
  });
  if (secure_run) {
    t.columns.emplace_back("secagg_survivors", 0);
    t.columns.emplace_back("secagg_dropped", 0);
  }
  for (const char* name : {"straggler", "straggler_link", "straggler_phase"}) t.columns.emplace_back(name, 0);
  for (const RoundSummary& s : analysis.rounds) {
    const RoundAttempt& r = *s.attempt;
    // Over-commitment's cancelled tasks and deadline folding's late updates (schema v9) have no rounds column:
    // counted from the round's client rows (a folded row stays in the round its client was selected in).
    int64_t cancelled = 0, folded = 0;
    for (const ClientRoundRow& c : r.clients) {
      cancelled += c.outcome == "cancelled" ? 1 : 0;
      folded += c.outcome == "folded" ? 1 : 0;
    }
    std::vector<Cell> row = {r.round,
                             r.attempt,
                             r.status,
                             r.num_selected,
                             r.num_accepted,
                             r.num_late,
                             r.num_dropped,
                             r.num_rejected,
                             cancelled,
                             folded,
                             Opt(r.aggregation_ms),
                             StatMean(s.downlink_ms),
                             StatMax(s.downlink_ms),
                             StatMean(s.train_ms),
                             StatMax(s.train_ms),
                             StatMean(s.uplink_ms),
                             StatMax(s.uplink_ms),
                             r.duration_ms};
    for (const EvalColumn& c : eval) row.push_back(Opt(c.value(r)));
    if (private_run) {
      row.push_back(Opt(r.dp_epsilon));
      row.push_back(Opt(r.dp_clip_norm));
    }
    if (secure_run) {
      row.push_back(OptInt(r.secagg_survivors));
      row.push_back(OptInt(r.secagg_dropped));
    }
    if (s.straggler.has_value()) {
      row.push_back(Label(data, s.straggler->client_id));
      row.push_back(LinkOf(data, s.straggler->client_id));
      row.push_back(std::string(PhaseName(s.straggler->dominant_phase)));
    } else {
      row.insert(row.end(), 3, Cell());
    }
    t.rows.push_back(std::move(row));
  }
  return t;
}

Table LinksTable(const ExperimentData&, const Analysis& analysis) {
  Table t;
  t.name = "links";
  t.title = "Link kinds (accepted updates of committed rounds)";
  t.columns = {{"link_kind", 0},
               {"clients", 0},
               {"client_rounds", 0},
               {"downlink_mean_ms", 1},
               {"train_mean_ms", 1},
               {"eval_mean_ms", 1},
               {"uplink_mean_ms", 1},
               {"fed_eval_mean_ms", 1},
               {"round_mean_ms", 1},
               {"uplink_share", 1, "%", 100},
               {"downlink_bytes_mean", 0},
               {"uplink_bytes_mean", 0},
               {"uplink_vs_ethernet", 2, "x"},
               {"uplink_vs_wifi", 2, "x"},
               {"downlink_vs_ethernet", 2, "x"}};
  auto ph = [](const LinkSummary& l, Phase p) { return Opt(l.mean_phase_ms[static_cast<size_t>(p)]); };
  for (const LinkSummary& l : analysis.links) {
    t.rows.push_back({l.link_kind, l.num_clients, l.num_client_rounds, ph(l, Phase::kDownlink), ph(l, Phase::kTrain),
                      ph(l, Phase::kEval), ph(l, Phase::kUplink), Opt(l.mean_federated_eval_ms), Opt(l.mean_round_ms),
                      Opt(l.uplink_share), Opt(l.mean_downlink_bytes), Opt(l.mean_uplink_bytes),
                      Opt(l.uplink_vs_ethernet), Opt(l.uplink_vs_wifi), Opt(l.downlink_vs_ethernet)});
  }
  return t;
}

Table GroupsTable(const ExperimentData& data, const Analysis& analysis) {
  Table t;
  t.name = "groups";
  t.title = fl::StrCat("Link kinds x device classes (accepted updates of committed rounds; stragglers of ",
                       analysis.rounds_with_straggler, " rounds)");
  t.columns = {{"link_kind", 0},        {"device_class", 0},       {"clients", 0},         {"client_rounds", 0},
               {"downlink_mean_ms", 1}, {"train_mean_ms", 1},      {"train_max_ms", 1},    {"uplink_mean_ms", 1},
               {"uplink_max_ms", 1},    {"times_straggler", 0},    {"share", 1, "%", 100}, {"top_phase", 0},
               {"top_straggler", 0},    {"top_straggler_times", 0}};
  for (const GroupSummary& g : analysis.groups) {
    auto ph = [&](Phase p) { return g.phase_ms[static_cast<size_t>(p)]; };
    t.rows.push_back({g.link_kind, g.device_class, g.num_clients, g.num_client_rounds, StatMean(ph(Phase::kDownlink)),
                      StatMean(ph(Phase::kTrain)), StatMax(ph(Phase::kTrain)), StatMean(ph(Phase::kUplink)),
                      StatMax(ph(Phase::kUplink)), g.times_straggler, g.straggler_share,
                      g.top_phase.has_value() ? Cell(std::string(PhaseName(*g.top_phase))) : Cell(),
                      g.top_straggler.empty() ? Cell() : Cell(Label(data, g.top_straggler)),
                      g.top_straggler.empty() ? Cell() : Cell(g.top_straggler_times)});
  }
  return t;
}

Table StragglersTable(const ExperimentData& data, const Analysis& analysis, size_t top) {
  Table t;
  t.name = "stragglers";
  const size_t shown = top == 0 ? analysis.stragglers.size() : std::min(top, analysis.stragglers.size());
  t.title = fl::StrCat("Stragglers (", analysis.rounds_with_straggler, " committed rounds with a straggler",
                       shown < analysis.stragglers.size()
                           ? fl::StrCat("; the ", shown, " clients most often the straggler, of ",
                                        analysis.stragglers.size(), ": fl-report --top 0 lists all")
                           : std::string(),
                       ")");
  t.columns = {{"client", 0},          {"link_kind", 0},       {"device_class", 0}, {"rounds_accepted", 0},
               {"times_straggler", 0}, {"share", 1, "%", 100}, {"by_downlink", 0},  {"by_train", 0},
               {"by_eval", 0},         {"by_uplink", 0},       {"top_phase", 0}};
  for (size_t i = 0; i < shown; ++i) {
    const StragglerRank& r = analysis.stragglers[i];
    const ClientInfo* c = data.FindClient(r.client_id);
    auto by = [&](Phase p) { return Cell(r.by_phase[static_cast<size_t>(p)]); };
    t.rows.push_back({Label(data, r.client_id), LinkOf(data, r.client_id), Text(c != nullptr ? c->device_class : ""),
                      r.rounds_accepted, r.times_straggler, r.share, by(Phase::kDownlink), by(Phase::kTrain),
                      by(Phase::kEval), by(Phase::kUplink),
                      r.top_phase.has_value() ? Cell(std::string(PhaseName(*r.top_phase))) : Cell()});
  }
  return t;
}

Table ClientEventsTable(const ExperimentData& data) {
  Table t;
  t.name = "client_events";
  t.title = fl::StrCat("Client events (", data.client_events.size(),
                       ": what fl-server refused from or did to a client outside its round rows)");
  t.columns = {{"at_unix_ms", 0}, {"client", 0},  {"link_kind", 0}, {"kind", 0},
               {"round", 0},      {"task_id", 0}, {"reason", 0}};
  for (const ClientEventRow& e : data.client_events) {
    t.rows.push_back({e.at_unix_ms, Label(data, e.client_id), LinkOf(data, e.client_id), e.kind,
                      e.round.has_value() ? Cell(*e.round) : Cell(), Text(e.task_id), Text(e.reason)});
  }
  return t;
}

Table SecurityEventsTable(const ExperimentData& data) {
  Table t;
  t.name = "security_events";
  t.title = fl::StrCat("Security events (", data.security_events.size(),
                       ": calls fl-server refused on the secure channel, and why)");
  t.columns = {{"at_unix_ms", 0}, {"reason", 0}, {"peer", 0}, {"identity", 0}, {"claimed", 0}, {"detail", 0}};
  for (const SecurityEventRow& e : data.security_events) {
    t.rows.push_back({e.at_unix_ms, e.reason, Text(e.peer), Text(e.identity), Text(e.claimed), Text(e.detail)});
  }
  return t;
}

Table SecAggTable(const ExperimentData& data) {
  Table t;
  t.name = "secagg";
  t.title = fl::StrCat("Secure aggregation (", data.secagg_stages.size(),
                       " client stages: per round attempt and stage, the clients' outcomes, time and bytes)");
  t.columns = {{"round", 0},
               {"attempt", 0},
               {"stage", 0},
               {"clients", 0},
               {"ok", 0},
               {"dropped", 0},
               {"refused", 0},
               {"duration_median_ms", 1},
               {"duration_max_ms", 1},
               {"bytes_down", 0},
               {"bytes_up", 0}};
  // The rows come by (round, attempt, client, stage order): one group per (round, attempt, stage), stages in the
  // order they run.
  struct Group {
    int64_t clients = 0, ok = 0, dropped = 0, refused = 0, bytes_down = 0, bytes_up = 0;
    std::vector<double> durations;
  };
  auto stage_order = [](const std::string& stage) {
    static constexpr std::string_view kOrder[] = {"advertise_keys", "share_keys", "masked_upload", "unmask"};
    return static_cast<int>(std::find(std::begin(kOrder), std::end(kOrder), stage) - std::begin(kOrder));
  };
  std::map<std::tuple<int64_t, int64_t, int, std::string>, Group> groups;
  for (const SecAggStageRow& r : data.secagg_stages) {
    Group& g = groups[{r.round, r.attempt, stage_order(r.stage), r.stage}];
    ++g.clients;
    g.ok += r.outcome == "ok" ? 1 : 0;
    g.dropped += r.outcome == "dropped" ? 1 : 0;
    g.refused += r.outcome == "refused" ? 1 : 0;
    g.bytes_down += r.bytes_down;
    g.bytes_up += r.bytes_up;
    if (r.duration_ms.has_value()) g.durations.push_back(*r.duration_ms);
  }
  for (auto& [key, g] : groups) {
    Cell median, max;
    if (!g.durations.empty()) {
      std::sort(g.durations.begin(), g.durations.end());
      const size_t n = g.durations.size();
      median = n % 2 == 1 ? g.durations[n / 2] : (g.durations[n / 2 - 1] + g.durations[n / 2]) / 2;
      max = g.durations.back();
    }
    t.rows.push_back({std::get<0>(key), std::get<1>(key), std::get<3>(key), g.clients, g.ok, g.dropped, g.refused,
                      median, max, g.bytes_down, g.bytes_up});
  }
  return t;
}

std::vector<Table> AllTables(const ExperimentData& data, const Analysis& analysis, size_t top_stragglers) {
  std::vector<Table> tables = {RoundsTable(data, analysis), LinksTable(data, analysis),
                               GroupsTable(data, analysis), StragglersTable(data, analysis, top_stragglers),
                               ClientEventsTable(data),     SecurityEventsTable(data)};
  // Most runs have no secure aggregation: no empty table for them.
  if (!data.secagg_stages.empty()) tables.push_back(SecAggTable(data));
  return tables;
}

absl::StatusOr<Table> TableByName(const ExperimentData& data, const Analysis& analysis, std::string_view name,
                                  size_t top_stragglers) {
  if (name == "rounds") return RoundsTable(data, analysis);
  if (name == "links") return LinksTable(data, analysis);
  if (name == "groups") return GroupsTable(data, analysis);
  if (name == "stragglers") return StragglersTable(data, analysis, top_stragglers);
  if (name == "client_events") return ClientEventsTable(data);
  if (name == "security_events") return SecurityEventsTable(data);
  if (name == "secagg") return SecAggTable(data);
  std::string names;
  for (std::string_view n : kTableNames) names += fl::StrCat(names.empty() ? "" : ", ", n);
  return absl::InvalidArgumentError(fl::StrCat("unknown table '", name, "'; the tables are ", names));
}

std::string FormatCell(const Column& column, const Cell& cell) {
  if (cell.empty()) return "-";
  if (cell.kind == Cell::Kind::kText) return cell.text;
  if (cell.kind == Cell::Kind::kInt && column.scale == 1) return fl::StrCat(cell.int_value, column.suffix);
  const double v = cell.AsDouble() * column.scale;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", column.decimals, v);
  return fl::StrCat(buf, column.suffix);
}

std::string ExperimentHeaderText(const ExperimentData& data, const Analysis& analysis) {
  const ExperimentInfo& e = data.experiment;
  std::string out = fl::StrCat("experiment ", e.id, " (", e.name, "), task ", e.task, ", ", e.status);
  if (!e.status_reason.empty()) out += fl::StrCat(": ", e.status_reason);
  out += fl::StrCat(
      "\n", analysis.committed_rounds, " committed rounds of ", data.rounds.size(), " round attempts, ",
      data.clients.size(), " clients; records ", data.db_path, " (schema v", data.schema_version,
      data.has_phase_starts ? ", phase starts on the server's timeline" : ", phases laid end to end from dispatch",
      ")\n");
  return out;
}

std::string RenderText(const Table& table) {
  const size_t n = table.columns.size();
  std::vector<size_t> width(n);
  // Right-align a column unless it holds text (an all-empty numeric column stays right-aligned).
  std::vector<bool> right(n, true);
  std::vector<std::vector<std::string>> cells;
  for (size_t i = 0; i < n; ++i) width[i] = table.columns[i].name.size();
  for (const auto& row : table.rows) {
    std::vector<std::string> texts;
    for (size_t i = 0; i < n; ++i) {
      texts.push_back(FormatCell(table.columns[i], row[i]));
      width[i] = std::max(width[i], texts.back().size());
      if (row[i].kind == Cell::Kind::kText) right[i] = false;
    }
    cells.push_back(std::move(texts));
  }
  auto line = [&](const std::vector<std::string>& texts) {
    std::string out;
    for (size_t i = 0; i < n; ++i) {
      const std::string pad(width[i] - texts[i].size(), ' ');
      out += i == 0 ? "" : "  ";
      out += right[i] ? pad + texts[i] : texts[i] + (i + 1 == n ? "" : pad);
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::vector<std::string> header;
  for (const Column& c : table.columns) header.push_back(c.name);
  std::string out = fl::StrCat(table.title, "\n", line(header));
  size_t total = 0;
  for (size_t w : width) total += w;
  out += std::string(total + 2 * (n - 1), '-') + "\n";
  for (const auto& texts : cells) out += line(texts);
  if (table.rows.empty()) out += "(no rows)\n";
  return out;
}

std::string RenderCsv(const Table& table) {
  std::string out;
  for (size_t i = 0; i < table.columns.size(); ++i) out += fl::StrCat(i == 0 ? "" : ",", table.columns[i].name);
  out += "\r\n";
  for (const auto& row : table.rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      if (i > 0) out += ",";
      const Cell& c = row[i];
      if (c.kind == Cell::Kind::kInt) out += std::to_string(c.int_value);
      if (c.kind == Cell::Kind::kReal) out += FullPrecision(c.real_value);
      if (c.kind == Cell::Kind::kText) out += CsvField(c.text);
    }
    out += "\r\n";
  }
  return out;
}

std::string RenderJson(const ExperimentData& data, const Analysis& analysis, const std::vector<Table>& tables) {
  const ExperimentInfo& e = data.experiment;
  nlohmann::ordered_json doc;
  doc["experiment"] = {{"id", e.id},
                       {"name", e.name},
                       {"task", e.task},
                       {"status", e.status},
                       {"started_unix_ms", e.started_unix_ms},
                       {"finished_unix_ms", e.finished_unix_ms.has_value() ? nlohmann::ordered_json(*e.finished_unix_ms)
                                                                           : nlohmann::ordered_json(nullptr)},
                       {"software_version", e.software_version},
                       {"round_attempts", data.rounds.size()},
                       {"committed_rounds", analysis.committed_rounds},
                       {"clients", data.clients.size()},
                       {"records", data.db_path},
                       {"schema_version", data.schema_version},
                       {"phase_starts_recorded", data.has_phase_starts}};
  doc["definitions"] = {
      {"uplink_ms", "client view (first byte sent -> server ack) when reported, else the server's view"},
      {"straggler", "the accepted client whose update arrived last at the server: it set the round's time"},
      {"straggler_phase",
       "the straggler's phase (downlink, train, eval, uplink) most above the round's median for that phase; if "
       "none is above, its longest phase"},
      {"uplink_share", "sum of the link kind's uplink times / sum of the durations of the rounds they were in"},
      {"fed_eval_mean_ms",
       "mean time of the link kind's clients to evaluate the global model after a commit "
       "(evaluations table)"},
      {"uplink_vs_ethernet", "mean uplink time of the link kind / mean uplink time of ethernet clients"},
      {"eval_loss",
       "global model after the commit, clients' results weighted by examples: cross-entropy "
       "(classification), mean squared error (regression), mean token cross-entropy (next-token)"},
      {"eval_accuracy", "classification: fraction of test examples right, weighted by examples"},
      {"eval_mae", "regression: mean absolute error, clients' results weighted by examples"},
      {"eval_perplexity", "next-token: exp(eval_loss)"},
      {"eval_token_accuracy", "next-token: fraction of test tokens predicted right, weighted by sequences"},
      {"dp_epsilon",
       "central differential privacy: epsilon spent by the run up to and including the round, at the run's "
       "--dp-delta (RDP accountant; records schema v10, only in runs with --dp-noise-multiplier)"},
      {"dp_clip_norm", "central differential privacy: the L2 norm C the round's updates were clipped to"},
      {"client_events",
       "what fl-server refused from a client (report_refused: a reported figure failed "
       "validation) or did to it (upload_revoked, initial_model_reasked, session_closed) outside "
       "its round rows, with why (records schema v7; none in older records)"},
      {"security_events",
       "what fl-server refused on the secure federation channel, by reason: name_mismatch (a Join claiming "
       "another name than its certificate's), wrong_identity (a call for another client than the certificate's), "
       "revoked_certificate, bad_token (an unknown client id or a wrong session token), join_rate, session_limit, "
       "upload_limit (beyond a per-peer or per-identity limit), stream_deadline (a stream cut off for a deadline), "
       "secagg (a secure-aggregation message refused, records schema v11); with the peer, its certificate's name "
       "(identity), the name it claimed and what it was told (records schema v8; none in older records)"},
      {"secagg_survivors", "secure aggregation: the clients whose masked updates the round's unmasked sum holds"},
      {"secagg_dropped", "secure aggregation: the clients that took part but dropped out of the round's sum"},
      {"secagg",
       "secure aggregation (SecAgg+), per round attempt and stage (advertise_keys, share_keys, masked_upload, "
       "unmask): clients with a row, how many answered (ok), gave no answer by the stage's deadline or left "
       "(dropped) or had their message refused (refused; a security_events row with reason secagg says why); the "
       "median and maximum time from the server sending the stage's message to the client's answer (server "
       "clock, answered clients only); the serialized bytes sent to and accepted from the clients (records schema "
       "v11; only in runs with secure aggregation)"}};
  nlohmann::ordered_json out_tables = nlohmann::ordered_json::object();
  for (const Table& t : tables) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const auto& row : t.rows) {
      nlohmann::ordered_json r = nlohmann::ordered_json::object();
      for (size_t i = 0; i < t.columns.size(); ++i) r[t.columns[i].name] = CellJson(row[i]);
      rows.push_back(std::move(r));
    }
    out_tables[t.name] = std::move(rows);
  }
  doc["tables"] = std::move(out_tables);
  return doc.dump(2) + "\n";
}

}  // namespace fl::report
