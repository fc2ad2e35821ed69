#include "fl/report/html_report.h"

#include <algorithm>
#include <cstdio>

#include "fl/core/str_cat.h"
#include "fl/report/svg.h"
#include "fl/report/tables.h"

namespace fl::report {
namespace {

constexpr std::string_view kCss = R"css(
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ccc; padding-bottom: 4px; }
p.meta { color: #555; margin-top: 0; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 3px 6px; }
th { background: #f0f0f0; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafafa; }
.scroll { overflow-x: auto; }
figure { margin: 12px 0; }
figure svg { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 12px; color: #555; }
ul.headline li { margin: 4px 0; }
dl dt { font-weight: bold; margin-top: 8px; }
dl dd { margin-left: 16px; }
)css";

std::string Esc(std::string_view s) { return XmlEscape(s); }

std::string TableHtml(const Table& t) {
  std::string out = fl::StrCat("<div class=\"scroll\"><table id=\"table-", Esc(t.name), "\">\n<thead><tr>");
  for (const Column& c : t.columns) out += fl::StrCat("<th>", Esc(c.name), "</th>");
  out += "</tr></thead>\n<tbody>\n";
  for (const auto& row : t.rows) {
    out += "<tr>";
    for (size_t i = 0; i < t.columns.size(); ++i) {
      const bool numeric = row[i].numeric();
      out += fl::StrCat("<td data-col=\"", Esc(t.columns[i].name), "\"", numeric ? " class=\"num\"" : "", ">",
                        Esc(FormatCell(t.columns[i], row[i])), "</td>");
    }
    out += "</tr>\n";
  }
  if (t.rows.empty()) out += fl::StrCat("<tr><td colspan=\"", t.columns.size(), "\">no rows</td></tr>\n");
  return out + "</tbody></table></div>\n";
}

std::string Fixed(double v, int decimals) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

// The study's headline figures, in words, for every link kind they can be computed for.
std::string Headline(const Analysis& a) {
  std::string items;
  for (const LinkSummary& l : a.links) {
    std::string parts;
    if (l.uplink_share.has_value())
      parts += fl::StrCat("uplink = ", Fixed(*l.uplink_share * 100, 1), "% of round time");
    if (l.uplink_vs_ethernet.has_value() && l.link_kind != "ethernet") {
      parts += fl::StrCat("; uplink ", Fixed(*l.uplink_vs_ethernet, 2), "x Ethernet's");
    }
    if (l.uplink_vs_wifi.has_value() && l.link_kind != "wifi") {
      parts += fl::StrCat("; uplink ", Fixed(*l.uplink_vs_wifi, 2), "x WiFi's");
    }
    if (parts.empty()) continue;
    items += fl::StrCat("<li data-link=\"", Esc(l.link_kind), "\"><b>", Esc(l.link_kind), "</b>: ", parts, "</li>\n");
  }
  if (items.empty()) return "";
  return fl::StrCat("<h2 id=\"headline\">Headline figures</h2>\n<ul class=\"headline\">\n", items,
                    "</ul>\n<p class=\"meta\">The study measured 5G uplink at 33.3x Ethernet's and 17.8x WiFi's, "
                    "and about 23% of an average round (Hayek et al., arXiv 2504.04678).</p>\n");
}

}  // namespace

std::string HtmlReport(const ExperimentData& data, const Analysis& analysis, const TimelineOptions& timeline) {
  const ExperimentInfo& e = data.experiment;
  std::string out =
      fl::StrCat("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>fl-report: ", Esc(e.id),
                 "</title>\n<style>", kCss, "</style>\n</head>\n<body>\n");
  out +=
      fl::StrCat("<h1>Experiment ", Esc(e.id), "</h1>\n<p class=\"meta\" id=\"summary\">name <b>", Esc(e.name),
                 "</b>, task <b id=\"task\">", Esc(e.task), "</b>, status <b>", Esc(e.status), "</b>",
                 e.status_reason.empty() ? "" : ": " + Esc(e.status_reason), "; <span id=\"committed-rounds\">",
                 analysis.committed_rounds, "</span> committed rounds of ", data.rounds.size(), " round attempts; ",
                 data.clients.size(), " clients; records ", Esc(data.db_path), " (schema v", data.schema_version, ", ",
                 data.has_phase_starts ? "phase starts recorded on the server's timeline"
                                       : "phases laid end to end from each dispatch",
                 "); fl-server ", Esc(e.software_version), "</p>\n");
  out += Headline(analysis);
  const std::vector<Table> tables = AllTables(data, analysis);
  auto table = [&](std::string_view name) -> const Table& {
    return *std::find_if(tables.begin(), tables.end(), [&](const Table& t) { return t.name == name; });
  };
  auto section = [&](std::string_view id, const Table& t) {
    return fl::StrCat("<h2 id=\"", id, "\">", Esc(t.title), "</h2>\n", TableHtml(t));
  };
  out += section("links", table("links"));
  out += "<figure>\n" + PhaseSharesSvg(data, analysis) +
         "<figcaption>Mean phase times as shares of the mean round time of the rounds each link kind's clients "
         "were in; grey: done, waiting for the round to end.</figcaption>\n</figure>\n";
  out += section("groups", table("groups"));
  out += section("stragglers", table("stragglers"));
  // Only when there are any: most runs have none, and records before v7 cannot have them.
  if (!table("client_events").rows.empty()) out += section("client-events", table("client_events"));
  // Likewise for security events (none before v8): what a peer was refused, beside what clients were.
  if (!table("security_events").rows.empty()) out += section("security-events", table("security_events"));
  // Secure aggregation's stages (v11): only for a run that had it (AllTables leaves the table out otherwise).
  if (!data.secagg_stages.empty()) out += section("secagg", table("secagg"));
  out += "<h2 id=\"learning-curve\">Learning curve</h2>\n<figure>\n" + MetricSvg(data) +
         "<figcaption>The task's metric of the global model after each evaluated round (rounds without an "
         "evaluation are no points), against the round and against seconds since the first dispatch at the "
         "round's commit; hover for figures.</figcaption>\n</figure>\n";
  out += fl::StrCat("<h2 id=\"rounds\">", Esc(table("rounds").title), "</h2>\n");
  out += "<figure>\n" + RoundTimeSvg(data, analysis) + "</figure>\n";
  out += TableHtml(table("rounds"));
  out += "<h2 id=\"timeline\">Timeline</h2>\n<figure>\n" + TimelineSvg(data, analysis, timeline) +
         "<figcaption>One row per client; bars are phases on the server's clock (hover for figures); black ticks: "
         "the straggler's update arriving; top row: the round (light) and its aggregation.</figcaption>\n</figure>\n";
  out += R"html(<h2 id="definitions">Definitions</h2>
<dl>
<dt>Accepted update</dt><dd>a client round with outcome <i>ok</i>. Means, maxima, link figures and the straggler
ranking use the accepted updates of committed rounds.</dd>
<dt>Uplink time</dt><dd>the client's view, first byte of the update sent to the server's acknowledgement, when the
client reported it; otherwise the server's view of the same transfer.</dd>
<dt>Straggler of a round</dt><dd>the accepted client whose update arrived last at the server: it set the round's
time.</dd>
<dt>Dominant phase</dt><dd>of the straggler: the phase (downlink, train, eval, uplink) where it exceeded the round's
median for that phase by the most; when it exceeded none, its longest phase.</dd>
<dt>Uplink share</dt><dd>the sum of a link kind's uplink times over the sum of the durations of the rounds those
updates were in.</dd>
<dt>eval_mean_ms, fed_eval_mean_ms</dt><dd>local evaluation inside the training task (client_rounds.eval_ms),
and the clients' evaluation of the global model after a commit (the evaluations table).</dd>
<dt>Ratios</dt><dd>mean uplink (downlink) time of the link kind over the mean of the Ethernet (WiFi) clients.</dd>
<dt>eval_* of the rounds table</dt><dd>the global model after the commit, on the clients' test data, their results
weighted by examples; the columns follow the experiment's task: classification <i>eval_accuracy</i> and
<i>eval_loss</i> (cross-entropy); regression <i>eval_mae</i> (mean absolute error) and <i>eval_loss</i> (mean squared
error); next-token <i>eval_perplexity</i> (exp of <i>eval_loss</i>), <i>eval_token_accuracy</i> and
<i>eval_loss</i> (mean token cross-entropy).</dd>
</dl>
</body>
</html>
)html";
  return out;
}

}  // namespace fl::report
