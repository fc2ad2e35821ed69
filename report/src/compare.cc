// fl-report --compare: accuracy against wall time for several experiments, and time to a target accuracy
// (compare.h has the definitions).
#include "fl/report/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>

#include <nlohmann/json.hpp>

#include "fl/core/str_cat.h"
#include "fl/report/svg.h"

namespace fl::report {
namespace {

// Tableau 10: distinguishable lines for up to ten experiments (then the colours repeat).
constexpr std::string_view kLineColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                            "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};

std::string Fixed(double v, int decimals) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

}  // namespace

double FirstDispatchUnixMs(const ExperimentData& data) {
  double t0 = std::numeric_limits<double>::infinity();
  for (const RoundAttempt& r : data.rounds) {
    t0 = std::min(t0, static_cast<double>(r.started_unix_ms));
    for (const ClientRoundRow& c : r.clients) {
      if (c.dispatched_unix_ms.has_value()) t0 = std::min(t0, static_cast<double>(*c.dispatched_unix_ms));
    }
  }
  return t0;
}

ComparedExperiment Summarize(const ExperimentData& data, double target_accuracy) {
  ComparedExperiment out;
  out.label = data.experiment.name.empty() ? data.experiment.id : data.experiment.name;
  out.id = data.experiment.id;
  out.db_path = data.db_path;
  out.aggregation = data.experiment.aggregation;
  const double t0 = FirstDispatchUnixMs(data);
  for (const RoundAttempt& r : data.rounds) {
    for (const ClientRoundRow& c : r.clients) {
      out.uplink_bytes += c.uplink_bytes.value_or(0);
      out.downlink_bytes += c.downlink_bytes.value_or(0);
    }
  }
  std::vector<const RoundAttempt*> committed;
  for (const RoundAttempt& r : data.rounds) {
    if (r.committed()) committed.push_back(&r);
  }
  std::stable_sort(committed.begin(), committed.end(),
                   [](const RoundAttempt* a, const RoundAttempt* b) { return a->ended_unix_ms < b->ended_unix_ms; });
  out.committed = static_cast<int64_t>(committed.size());
  for (const RoundAttempt* r : committed) {
    const double at_s = (static_cast<double>(r->ended_unix_ms) - t0) / 1000.0;
    out.wall_s = at_s;
    if (!r->eval_accuracy.has_value()) continue;
    out.accuracy.emplace_back(at_s, *r->eval_accuracy);
    out.final_accuracy = *r->eval_accuracy;
    if (!out.time_to_target_s.has_value() && *r->eval_accuracy >= target_accuracy) out.time_to_target_s = at_s;
  }
  return out;
}

void DisambiguateLabels(std::vector<ComparedExperiment>& experiments) {
  std::map<std::string, int> count;
  for (const ComparedExperiment& e : experiments) ++count[e.label];
  for (ComparedExperiment& e : experiments) {
    if (count[e.label] > 1) e.label += fl::StrCat(" (", std::filesystem::path(e.db_path).filename().string(), ")");
  }
  std::map<std::string, int> seen;
  for (ComparedExperiment& e : experiments) {
    if (const int n = ++seen[e.label]; n > 1) e.label += fl::StrCat(" #", n);
  }
}

Table CompareTable(const std::vector<ComparedExperiment>& experiments, double target_accuracy) {
  Table t;
  t.name = "compare";
  t.title = fl::StrCat("Time to ", Fixed(target_accuracy, 3), " test accuracy and bytes moved");
  t.columns = {Column("experiment"),          Column("aggregation"),        Column("final_accuracy", 4),
               Column("time_to_target_s", 1), Column("bytes_moved", 0),     Column("uplink_bytes", 0),
               Column("downlink_bytes", 0),   Column("rounds_or_steps", 0), Column("wall_s", 1)};
  for (const ComparedExperiment& e : experiments) {
    std::vector<Cell> row;
    row.emplace_back(e.label);
    row.emplace_back(e.aggregation);
    row.push_back(e.final_accuracy.has_value() ? Cell(*e.final_accuracy) : Cell());
    row.push_back(e.time_to_target_s.has_value() ? Cell(*e.time_to_target_s) : Cell("not reached"));
    row.emplace_back(e.uplink_bytes + e.downlink_bytes);
    row.emplace_back(e.uplink_bytes);
    row.emplace_back(e.downlink_bytes);
    row.emplace_back(e.committed);
    row.push_back(e.wall_s.has_value() ? Cell(*e.wall_s) : Cell());
    t.rows.push_back(std::move(row));
  }
  return t;
}

std::string RenderMarkdown(const Table& table) {
  auto escape = [](std::string s) {
    for (size_t i = 0; (i = s.find('|', i)) != std::string::npos; i += 2) s.replace(i, 1, "\\|");
    return s;
  };
  std::string out = "|";
  std::string rule = "|";
  for (const Column& c : table.columns) {
    out += fl::StrCat(" ", c.name, " |");
    rule += "---|";
  }
  out += "\n" + rule + "\n";
  for (const auto& row : table.rows) {
    out += "|";
    for (size_t i = 0; i < table.columns.size(); ++i)
      out += fl::StrCat(" ", escape(FormatCell(table.columns[i], row[i])), " |");
    out += "\n";
  }
  return out;
}

std::string CompareJson(const std::vector<ComparedExperiment>& experiments, double target_accuracy) {
  const Table table = CompareTable(experiments, target_accuracy);
  nlohmann::ordered_json doc;
  doc["target_accuracy"] = target_accuracy;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (size_t r = 0; r < table.rows.size(); ++r) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    for (size_t c = 0; c < table.columns.size(); ++c) {
      const Cell& cell = table.rows[r][c];
      switch (cell.kind) {
        case Cell::Kind::kEmpty: e[table.columns[c].name] = nullptr; break;
        case Cell::Kind::kInt: e[table.columns[c].name] = cell.int_value; break;
        case Cell::Kind::kReal: e[table.columns[c].name] = cell.real_value; break;
        case Cell::Kind::kText: e[table.columns[c].name] = cell.text; break;
      }
    }
    e["id"] = experiments[r].id;
    e["records"] = experiments[r].db_path;
    e["accuracy"] = experiments[r].accuracy;
    list.push_back(std::move(e));
  }
  doc["experiments"] = std::move(list);
  return doc.dump(2) + "\n";
}

std::string CompareSvg(const std::vector<ComparedExperiment>& experiments, double target_accuracy) {
  constexpr double kWidth = 900, kLeft = 70, kRight = 20, kTop = 40, kPlotHeight = 380;
  const double legend_rows = static_cast<double>(experiments.size());
  const double height = kTop + kPlotHeight + 50 + 18 * legend_rows + 10;
  SvgWriter svg(kWidth, height);
  svg.Text(kLeft, 22, fl::StrCat("Test accuracy against wall time (target ", Fixed(target_accuracy, 3), ")"), 15);

  double x_hi = 1, y_lo = target_accuracy, y_hi = target_accuracy;
  for (const ComparedExperiment& e : experiments) {
    for (const auto& [s, acc] : e.accuracy) {
      x_hi = std::max(x_hi, s);
      y_lo = std::min(y_lo, acc);
      y_hi = std::max(y_hi, acc);
    }
  }
  y_lo = std::max(0.0, std::floor(y_lo * 10 - 0.5) / 10);
  y_hi = std::min(1.0, std::ceil(y_hi * 10 + 0.5) / 10);
  const std::vector<double> xt = NiceTicks(0, x_hi, 8);
  const std::vector<double> yt = NiceTicks(y_lo, y_hi, 6);
  x_hi = std::max(x_hi, xt.empty() ? x_hi : xt.back());
  const PlotFrame frame{kLeft, kTop, kWidth - kLeft - kRight, kPlotHeight, 0, x_hi, y_lo, y_hi};
  const double plot_w = frame.width;
  auto X = [&](double s) { return frame.X(s); };
  auto Y = [&](double a) { return frame.Y(a); };
  DrawAxes(svg, frame, xt, yt, "seconds since the experiment's first dispatch", "test accuracy");
  svg.Line(kLeft, Y(target_accuracy), kLeft + plot_w, Y(target_accuracy), "#888888", 1,
           "stroke-dasharray=\"6 4\" class=\"target\"");

  for (size_t i = 0; i < experiments.size(); ++i) {
    const ComparedExperiment& e = experiments[i];
    const std::string_view color = kLineColors[i % std::size(kLineColors)];
    svg.BeginGroup("series");
    std::vector<std::pair<double, double>> points;
    for (const auto& [s, acc] : e.accuracy) points.emplace_back(X(s), Y(acc));
    if (points.size() > 1) svg.Polyline(points, color, 2);
    for (size_t p = 0; p < points.size(); ++p) {
      svg.Circle(
          points[p].first, points[p].second, 3, color,
          fl::StrCat(e.label, ": ", Fixed(e.accuracy[p].second, 4), " at ", Fixed(e.accuracy[p].first, 1), " s"));
    }
    const double ly = kTop + kPlotHeight + 56 + 18 * static_cast<double>(i);
    svg.Rect(kLeft, ly - 10, 24, 4, color);
    svg.Text(kLeft + 32, ly - 4,
             fl::StrCat(e.label, " (", e.aggregation, "): ",
                        e.time_to_target_s.has_value() ? fl::StrCat(Fixed(*e.time_to_target_s, 1), " s to target")
                                                       : std::string("target not reached")),
             12);
    svg.EndGroup();
  }
  return svg.Finish("compare", "test accuracy against wall time");
}

std::string CompareHtml(const std::vector<ComparedExperiment>& experiments, double target_accuracy) {
  const Table table = CompareTable(experiments, target_accuracy);
  std::string rows;
  for (const auto& row : table.rows) {
    rows += "<tr>";
    for (size_t i = 0; i < table.columns.size(); ++i) {
      rows += fl::StrCat("<td data-col=\"", table.columns[i].name, "\"", row[i].numeric() ? " class=\"num\"" : "", ">",
                         XmlEscape(FormatCell(table.columns[i], row[i])), "</td>");
    }
    rows += "</tr>\n";
  }
  std::string head;
  for (const Column& c : table.columns) head += fl::StrCat("<th>", XmlEscape(c.name), "</th>");
  return fl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>fl-report --compare</title>\n"
      "<style>body{font-family:sans-serif;margin:24px;color:#222;max-width:1400px}"
      "table{border-collapse:collapse;font-size:12px}th,td{border:1px solid #ddd;padding:3px 6px}"
      "th{background:#f0f0f0;text-align:left}td.num{text-align:right}figure svg{max-width:100%;height:auto}"
      "</style></head><body>\n<h1>Comparison of ",
      experiments.size(), " experiments</h1>\n<h2 id=\"compare-plot\">Accuracy against wall time</h2>\n<figure>\n",
      CompareSvg(experiments, target_accuracy), "</figure>\n<h2 id=\"compare-table\">", XmlEscape(table.title),
      "</h2>\n<table id=\"table-compare\"><thead><tr>", head, "</tr></thead>\n<tbody>\n", rows,
      "</tbody></table>\n<h2 id=\"definitions\">Definitions</h2>\n<dl>\n"
      "<dt>wall time</dt><dd>seconds since the experiment's first dispatch</dd>\n"
      "<dt>time_to_target_s</dt><dd>wall time of the first committed round (or aggregation step) whose evaluated "
      "test accuracy reached the target, at its commit</dd>\n"
      "<dt>bytes_moved</dt><dd>uplink + downlink bytes of every client row, whatever its outcome</dd>\n"
      "<dt>rounds_or_steps</dt><dd>committed rounds (synchronous) or aggregation steps (buffered)</dd>\n"
      "</dl>\n</body></html>\n");
}

}  // namespace fl::report
