#include "fl/report/plots.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/report/compare.h"
#include "fl/report/svg.h"
#include "fl/report/tables.h"

namespace fl::report {
namespace {

constexpr std::string_view kAggregationColor = "#9c755f";
constexpr std::string_view kRoundColor = "#e8e8e8";
constexpr std::string_view kWaitingColor = "#dddddd";
constexpr std::string_view kAxisColor = "#444444";

std::string Ms(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f ms", ms);
  return buf;
}

std::string Percent(double share) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", share * 100);
  return buf;
}

int LinkOrder(const std::string& kind) {
  static const char* const kKnown[] = {"ethernet", "wifi", "5g", "other"};
  for (int i = 0; i < 4; ++i) {
    if (kind == kKnown[i]) return i;
  }
  return 4;
}

void Legend(SvgWriter& svg, double x, double y, bool with_waiting, bool with_aggregation) {
  std::vector<std::pair<std::string, std::string>> items;
  for (Phase p : kAllPhases) items.emplace_back(std::string(PhaseName(p)), std::string(PhaseColor(p)));
  if (with_aggregation) items.emplace_back("aggregation", std::string(kAggregationColor));
  if (with_waiting) items.emplace_back("waiting", std::string(kWaitingColor));
  svg.BeginGroup("legend");
  for (const auto& [name, color] : items) {
    svg.Rect(x, y - 10, 12, 12, color);
    svg.Text(x + 16, y, name, 12);
    x += 26 + 7.0 * static_cast<double>(name.size());
  }
  svg.EndGroup();
}

}  // namespace

std::string_view PhaseColor(Phase phase) {
  switch (phase) {
    case Phase::kDownlink: return "#4e79a7";
    case Phase::kTrain: return "#59a14f";
    case Phase::kEval: return "#edc948";
    case Phase::kIdle: return "#bab0ac";
    case Phase::kUplink: return "#e15759";
  }
  return "#000000";
}

std::string TimelineSvg(const ExperimentData& data, const Analysis& analysis, const TimelineOptions& options) {
  auto in_window = [&](int64_t round) {
    return (!options.first_round.has_value() || round >= *options.first_round) &&
           (!options.last_round.has_value() || round <= *options.last_round);
  };
  struct Bar {
    size_t row;
    Span span;
    std::string color;
    std::string title;
    double opacity;
  };
  std::vector<Bar> bars;
  struct Marker {
    double at_unix_ms;
    size_t row;
    std::string title;
  };
  std::vector<Marker> markers;           // straggler arrivals
  std::map<std::string, size_t> row_of;  // client id -> row (0 = server)
  std::vector<std::string> row_labels;   // of rows 1..
  // Rows: clients by link kind, then label; only those that appear in the window.
  std::vector<const ClientInfo*> clients;
  for (const ClientInfo& c : data.clients) clients.push_back(&c);
  std::sort(clients.begin(), clients.end(), [](const ClientInfo* a, const ClientInfo* b) {
    const int oa = LinkOrder(a->link_kind), ob = LinkOrder(b->link_kind);
    if (oa != ob) return oa < ob;
    if (a->link_kind != b->link_kind) return a->link_kind < b->link_kind;
    return a->label < b->label;
  });
  std::map<std::string, bool> seen;
  for (const RoundAttempt& r : data.rounds) {
    if (!in_window(r.round)) continue;
    for (const ClientRoundRow& c : r.clients) seen[c.client_id] = true;
  }
  size_t shown = 0;
  for (const ClientInfo* c : clients) shown += seen[c->client_id] ? 1 : 0;
  // A fleet: one row per link kind x device class, its clients' bars drawn translucent on top of each other, so
  // that the density shows where a group's clients spend their time.
  const bool by_group = shown > kTimelineMaxClientRows;
  std::map<std::string, size_t> group_row;  // "link / device" -> row
  std::map<size_t, size_t> clients_in_row;
  for (const ClientInfo* c : clients) {
    if (!seen[c->client_id]) continue;
    const std::string label =
        by_group ? fl::StrCat(c->link_kind, " / ", c->device_class.empty() ? "unknown" : c->device_class)
                 : fl::StrCat(c->label, " [", c->link_kind, "]");
    auto [it, added] = group_row.try_emplace(label, row_labels.size() + 1);
    if (added || !by_group) {
      it->second = row_labels.size() + 1;
      row_labels.push_back(label);
    }
    row_of[c->client_id] = it->second;
    ++clients_in_row[it->second];
  }
  if (by_group) {
    for (size_t i = 0; i < row_labels.size(); ++i) row_labels[i] += fl::StrCat(" (", clients_in_row[i + 1], ")");
  }
  const double client_opacity = by_group ? 0.25 : 1.0;

  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  auto extend = [&](const Span& s) {
    lo = std::min(lo, s.start_unix_ms);
    hi = std::max(hi, s.end_unix_ms);
  };
  std::vector<std::pair<double, int64_t>> round_starts;
  for (const RoundSummary& s : analysis.rounds) {
    const RoundAttempt& r = *s.attempt;
    if (!in_window(r.round)) continue;
    const Span round_span{static_cast<double>(r.started_unix_ms), static_cast<double>(r.ended_unix_ms)};
    extend(round_span);
    round_starts.emplace_back(round_span.start_unix_ms, r.round);
    bars.push_back({0, round_span, std::string(kRoundColor),
                    fl::StrCat("round ", r.round, " attempt ", r.attempt, " (", r.status, "): ", Ms(r.duration_ms)),
                    1.0});
    if (r.aggregation_ms.has_value()) {
      const Span agg{round_span.end_unix_ms - *r.aggregation_ms, round_span.end_unix_ms};
      bars.push_back({0, agg, std::string(kAggregationColor),
                      fl::StrCat("round ", r.round, " aggregation: ", Ms(*r.aggregation_ms)), 1.0});
    }
    for (const ClientRoundRow& c : r.clients) {
      auto row = row_of.find(c.client_id);
      if (row == row_of.end()) continue;
      const PlacedPhases placed = PlaceOnServerTimeline(c);
      const ClientInfo* info = data.FindClient(c.client_id);
      const std::string label = info != nullptr ? info->label : c.client_id;
      for (Phase p : kAllPhases) {
        const auto& span = placed.spans[static_cast<size_t>(p)];
        if (!span.has_value()) continue;
        extend(*span);
        bars.push_back(
            {row->second, *span, std::string(PhaseColor(p)),
             fl::StrCat(label, " round ", r.round, " ", PhaseName(p), ": ", Ms(span->end_unix_ms - span->start_unix_ms),
                        c.accepted() ? "" : fl::StrCat(" (update ", c.outcome, ")")),
             c.accepted() ? client_opacity : 0.45 * client_opacity});
      }
    }
    if (s.straggler.has_value() && s.straggler->arrival_unix_ms.has_value()) {
      const ClientInfo* c = data.FindClient(s.straggler->client_id);
      auto row = row_of.find(s.straggler->client_id);
      markers.push_back({*s.straggler->arrival_unix_ms, row == row_of.end() ? 0 : row->second,
                         fl::StrCat("round ", r.round, " straggler: ", c != nullptr ? c->label : s.straggler->client_id,
                                    ", dominant phase ", PhaseName(s.straggler->dominant_phase))});
    }
  }

  const double left = 170, right = 20, top = 44, row_h = 20, axis_h = 56;
  const double plot_w = 1000;
  const size_t rows = row_labels.size() + 1;
  SvgWriter svg(left + plot_w + right, top + row_h * static_cast<double>(rows) + axis_h);
  svg.Text(left, 16,
           fl::StrCat("Phases of every client on the server's timeline",
                      by_group ? fl::StrCat(" (", shown, " clients: a row per link kind / device class)") : "",
                      data.has_phase_starts ? "" : " (phases laid end to end from dispatch)"),
           14, "start", "font-weight=\"bold\"");
  if (!(hi > lo)) {
    svg.Text(left, top + 14, "no timed rounds in this window", 12);
    return svg.Finish("plot-timeline", "timeline");
  }
  const double scale = plot_w / (hi - lo);
  auto X = [&](double unix_ms) { return left + (unix_ms - lo) * scale; };
  // Row labels and guides.
  svg.BeginGroup("rows");
  for (size_t i = 0; i < rows; ++i) {
    const double y = top + row_h * static_cast<double>(i);
    if (i % 2 == 1) svg.Rect(left, y, plot_w, row_h, "#f7f7f7");
    const std::string label = i == 0 ? "server (round, aggregation)" : row_labels[i - 1];
    svg.Text(left - 6, y + row_h * 0.7, label, 11, "end");
  }
  svg.EndGroup();
  svg.BeginGroup("phases");
  for (const Bar& b : bars) {
    const double y = top + row_h * static_cast<double>(b.row) + 3;
    const double w = std::max((b.span.end_unix_ms - b.span.start_unix_ms) * scale, 0.8);
    svg.Rect(X(b.span.start_unix_ms), y, w, row_h - 6, b.color, b.title,
             b.opacity < 1 ? fl::StrCat("fill-opacity=\"", b.opacity, "\"") : "");
  }
  svg.EndGroup();
  // Round starts: a dashed line and the round number (every k-th label when crowded).
  const size_t label_every = std::max<size_t>(1, round_starts.size() / 25 + 1);
  svg.BeginGroup("rounds");
  for (size_t i = 0; i < round_starts.size(); ++i) {
    const double x = X(round_starts[i].first);
    svg.Line(x, top - 4, x, top + row_h * static_cast<double>(rows), "#888888", 0.7, "stroke-dasharray=\"3,3\"");
    if (i % label_every == 0) svg.Text(x + 2, top - 8, fl::StrCat("r", round_starts[i].second), 10);
  }
  svg.EndGroup();
  svg.BeginGroup("stragglers");
  for (const Marker& m : markers) {
    svg.Rect(X(m.at_unix_ms) - 1, top + row_h * static_cast<double>(m.row), 2, row_h, "#000000", m.title);
  }
  svg.EndGroup();
  // x axis: seconds since the first dispatch shown.
  const double axis_y = top + row_h * static_cast<double>(rows);
  svg.Line(left, axis_y, left + plot_w, axis_y, kAxisColor);
  for (double t : NiceTicks(0, (hi - lo) / 1000.0, 8)) {
    const double x = left + t * 1000.0 * scale;
    svg.Line(x, axis_y, x, axis_y + 4, kAxisColor);
    svg.Text(x, axis_y + 16, AxisLabel(t), 10, "middle");
  }
  svg.Text(left + plot_w / 2, axis_y + 30, "server time since the first dispatch shown (s)", 11, "middle");
  Legend(svg, left, axis_y + 48, false, true);
  return svg.Finish("plot-timeline", "timeline of every client's phases");
}

std::string PhaseSharesSvg(const ExperimentData&, const Analysis& analysis) {
  const double left = 110, right = 20, top = 44, bar_h = 26, gap = 12, plot_w = 700;
  const double height = top + (bar_h + gap) * static_cast<double>(std::max<size_t>(analysis.links.size(), 1)) + 60;
  SvgWriter svg(left + plot_w + right, height);
  svg.Text(left, 16, "Phase shares of the round time, by link kind", 14, "start", "font-weight=\"bold\"");
  if (analysis.links.empty()) {
    svg.Text(left, top + 14, "no accepted updates in committed rounds", 12);
    return svg.Finish("plot-phase-shares", "phase shares by link kind");
  }
  svg.BeginGroup("bars");
  double y = top;
  for (const LinkSummary& l : analysis.links) {
    svg.Text(left - 8, y + bar_h * 0.65, fl::StrCat(l.link_kind, " (", l.num_clients, ")"), 12, "end");
    const double round_ms = l.mean_round_ms.value_or(0);
    double used = 0;
    std::vector<std::pair<double, std::string>> parts;  // share, phase name
    for (Phase p : kAllPhases) {
      const double share = round_ms > 0 ? l.mean_phase_ms[static_cast<size_t>(p)].value_or(0) / round_ms : 0;
      used += share;
    }
    // A client's phases cannot outlast the rounds it was in; if rounding of the clocks says so, scale to 100%.
    const double norm = used > 1 ? 1 / used : 1;
    double x = left;
    for (Phase p : kAllPhases) {
      const double ms = l.mean_phase_ms[static_cast<size_t>(p)].value_or(0);
      const double share = round_ms > 0 ? ms / round_ms * norm : 0;
      if (share <= 0) continue;
      const double w = share * plot_w;
      svg.Rect(x, y, w, bar_h, PhaseColor(p),
               fl::StrCat(l.link_kind, " ", PhaseName(p), ": ", Ms(ms), " mean, ", Percent(share), " of the round"));
      if (w > 38) svg.Text(x + w / 2, y + bar_h * 0.65, Percent(share), 10, "middle", "fill=\"#ffffff\"");
      x += w;
    }
    const double waiting = std::max(0.0, 1 - used * norm);
    if (waiting > 0) {
      svg.Rect(x, y, waiting * plot_w, bar_h, kWaitingColor,
               fl::StrCat(l.link_kind, " waiting for the round to end: ", Percent(waiting), " of the round"));
    }
    y += bar_h + gap;
  }
  svg.EndGroup();
  svg.Line(left, y, left + plot_w, y, kAxisColor);
  for (double t : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    svg.Line(left + t * plot_w, y, left + t * plot_w, y + 4, kAxisColor);
    svg.Text(left + t * plot_w, y + 16, fl::StrCat(static_cast<int>(t * 100), "%"), 10, "middle");
  }
  Legend(svg, left, y + 44, true, false);
  return svg.Finish("plot-phase-shares", "phase shares by link kind");
}

std::string RoundTimeSvg(const ExperimentData& data, const Analysis& analysis) {
  const double left = 70, right = 20, top = 44, plot_w = 760, plot_h = 260;
  SvgWriter svg(left + plot_w + right, top + plot_h + 70);
  const bool steps = data.experiment.aggregation == "buffered";  // FedBuff: rows are aggregation steps
  svg.Text(left, 16,
           steps ? "Step time over aggregation steps (committed steps; colour = the slowest update's dominant phase)"
                 : "Round time over rounds (committed rounds; colour = the straggler's dominant phase)",
           14, "start", "font-weight=\"bold\"");
  std::vector<const RoundSummary*> points;
  for (const RoundSummary& s : analysis.rounds) {
    if (s.attempt->committed()) points.push_back(&s);
  }
  if (points.empty()) {
    svg.Text(left, top + 14, "no committed rounds", 12);
    return svg.Finish("plot-round-time", "round time over rounds");
  }
  double x_lo = static_cast<double>(points.front()->attempt->round);
  double x_hi = static_cast<double>(points.back()->attempt->round);
  if (x_hi <= x_lo) x_hi = x_lo + 1;
  double y_hi = 0;
  for (const RoundSummary* s : points) y_hi = std::max(y_hi, s->attempt->duration_ms);
  std::vector<double> y_ticks = NiceTicks(0, y_hi * 1.05 + 1e-9, 5);
  y_hi = std::max(y_hi, y_ticks.back());
  if (y_hi <= 0) y_hi = 1;
  auto X = [&](double round) { return left + (round - x_lo) / (x_hi - x_lo) * plot_w; };
  auto Y = [&](double ms) { return top + plot_h - ms / y_hi * plot_h; };
  svg.BeginGroup("axes");
  svg.Line(left, top + plot_h, left + plot_w, top + plot_h, kAxisColor);
  svg.Line(left, top, left, top + plot_h, kAxisColor);
  for (double t : y_ticks) {
    svg.Line(left - 4, Y(t), left + plot_w, Y(t), "#e0e0e0", 0.7);
    svg.Text(left - 6, Y(t) + 4, AxisLabel(t), 10, "end");
  }
  for (double t : NiceTicks(x_lo, x_hi, 10)) {
    if (t != std::floor(t)) continue;
    svg.Line(X(t), top + plot_h, X(t), top + plot_h + 4, kAxisColor);
    svg.Text(X(t), top + plot_h + 16, AxisLabel(t), 10, "middle");
  }
  svg.Text(left + plot_w / 2, top + plot_h + 32, steps ? "aggregation step" : "round", 11, "middle");
  svg.Text(16, top + plot_h / 2, "round time (ms)", 11, "middle",
           fl::StrCat("transform=\"rotate(-90 16 ", top + plot_h / 2, ")\""));
  svg.EndGroup();
  std::vector<std::pair<double, double>> line;
  for (const RoundSummary* s : points)
    line.emplace_back(X(static_cast<double>(s->attempt->round)), Y(s->attempt->duration_ms));
  svg.Polyline(line, "#4e79a7", 1.5);
  svg.BeginGroup("points");
  for (const RoundSummary* s : points) {
    std::string title = fl::StrCat("round ", s->attempt->round, ": ", Ms(s->attempt->duration_ms));
    std::string_view color = "#4e79a7";
    if (s->straggler.has_value()) {
      const ClientInfo* c = data.FindClient(s->straggler->client_id);
      title += fl::StrCat(", straggler ", c != nullptr ? c->label : s->straggler->client_id, " (",
                          PhaseName(s->straggler->dominant_phase), ")");
      color = PhaseColor(s->straggler->dominant_phase);
    }
    svg.Circle(X(static_cast<double>(s->attempt->round)), Y(s->attempt->duration_ms), 3.5, color, title);
  }
  svg.EndGroup();
  Legend(svg, left, top + plot_h + 58, false, false);
  return svg.Finish("plot-round-time", "round time over rounds");
}

MetricCurve LearningCurve(const ExperimentData& data) {
  const EvalColumn metric = EvalColumns(data.experiment.task).front();
  MetricCurve out{metric.name, metric.name == "eval_accuracy", {}};
  const double t0 = FirstDispatchUnixMs(data);
  for (const RoundAttempt& r : data.rounds) {
    const std::optional<double> v = metric.value(r);
    if (!r.committed() || !v.has_value()) continue;
    out.points.push_back({r.round, (static_cast<double>(r.ended_unix_ms) - t0) / 1000.0, *v});
  }
  std::stable_sort(out.points.begin(), out.points.end(),
                   [](const MetricPoint& a, const MetricPoint& b) { return a.round < b.round; });
  return out;
}

std::string MetricSvg(const ExperimentData& data) {
  const MetricCurve curve = LearningCurve(data);
  const bool steps = data.experiment.aggregation == "buffered";
  const double left = 70, right = 20, top = 44, plot_w = 760, plot_h = 220, gap = 80;
  // A run without evaluations gets a one-line drawing, not a page of empty space.
  SvgWriter svg(left + plot_w + right, curve.points.empty() ? top + 30 : top + 2 * plot_h + gap + 50);
  const std::string direction = curve.higher_is_better ? "higher is better" : "lower is better";
  svg.Text(left, 16,
           fl::StrCat("Learning curve: ", curve.metric, " of the global model after each evaluated ",
                      steps ? "step" : "round", " (", direction, ")"),
           14, "start", "font-weight=\"bold\"");
  if (curve.points.empty()) {
    svg.Text(left, top + 14,
             fl::StrCat("no evaluated ", steps ? "steps" : "rounds",
                        ": this run recorded no evaluation of the global model, so there is no curve"),
             12, "start", "class=\"no-evaluation\"");
    return svg.Finish("plot-metric", "learning curve");
  }
  double y_lo = curve.points.front().value, y_hi = y_lo, r_lo = static_cast<double>(curve.points.front().round);
  double r_hi = static_cast<double>(curve.points.back().round), s_hi = 1;
  for (const MetricPoint& p : curve.points) {
    y_lo = std::min(y_lo, p.value);
    y_hi = std::max(y_hi, p.value);
    s_hi = std::max(s_hi, p.seconds);
  }
  if (r_hi <= r_lo) r_hi = r_lo + 1;
  const double pad = y_hi > y_lo ? (y_hi - y_lo) * 0.05 : std::max(std::abs(y_hi) * 0.05, 1e-3);
  y_lo -= pad;
  y_hi += pad;
  const std::vector<double> y_ticks = NiceTicks(y_lo, y_hi, 6);
  const std::vector<double> s_ticks = NiceTicks(0, s_hi, 8);
  if (!s_ticks.empty()) s_hi = std::max(s_hi, s_ticks.back());
  // Top: against the round; bottom: against wall time. Each point's title carries its figures.
  const PlotFrame by_round{left, top, plot_w, plot_h, r_lo, r_hi, y_lo, y_hi};
  const PlotFrame by_time{left, top + plot_h + gap, plot_w, plot_h, 0, s_hi, y_lo, y_hi};
  std::vector<double> r_ticks;
  for (double t : NiceTicks(r_lo, r_hi, std::min(10, static_cast<int>(r_hi - r_lo) + 1))) {
    // Whole rounds only; NiceTicks' sums of steps may land a hair off an integer.
    if (std::abs(t - std::round(t)) < 1e-6) r_ticks.push_back(std::round(t));
  }
  const std::string y_title = fl::StrCat(curve.metric, " (", direction, ")");
  DrawAxes(svg, by_round, r_ticks, y_ticks, steps ? "aggregation step" : "round", y_title);
  DrawAxes(svg, by_time, s_ticks, y_ticks, "seconds since the experiment's first dispatch", y_title);
  const struct {
    const PlotFrame& frame;
    std::string_view group;
    bool by_round;
  } panels[] = {{by_round, "points-by-round", true}, {by_time, "points-by-time", false}};
  for (const auto& panel : panels) {
    std::vector<std::pair<double, double>> line;
    for (const MetricPoint& p : curve.points)
      line.emplace_back(panel.frame.X(panel.by_round ? static_cast<double>(p.round) : p.seconds),
                        panel.frame.Y(p.value));
    if (line.size() > 1) svg.Polyline(line, "#4e79a7", 1.5);
    svg.BeginGroup(panel.group);
    for (size_t i = 0; i < line.size(); ++i) {
      char value[40], at[40];
      std::snprintf(value, sizeof(value), "%.10g", curve.points[i].value);
      std::snprintf(at, sizeof(at), "%.1f", curve.points[i].seconds);
      svg.Circle(line[i].first, line[i].second, 3.5, "#4e79a7",
                 fl::StrCat(steps ? "step " : "round ", curve.points[i].round, ": ", curve.metric, " ", value, " at ",
                            at, " s"));
    }
    svg.EndGroup();
  }
  return svg.Finish("plot-metric", "learning curve");
}

std::string PlotByName(std::string_view name, const ExperimentData& data, const Analysis& analysis,
                       const TimelineOptions& options) {
  if (name == "timeline") return TimelineSvg(data, analysis, options);
  if (name == "phase_shares") return PhaseSharesSvg(data, analysis);
  if (name == "round_time") return RoundTimeSvg(data, analysis);
  if (name == "metric") return MetricSvg(data);
  return "";
}

}  // namespace fl::report
