// fl-report: tables and plots of an experiment out of a records database (docs/report.md).
//
//   fl-report DB [--experiment ID] [--format text|csv|json|html|svg] [--out PATH|DIR]
//                [--table rounds|links|groups|stragglers|client_events|security_events|secagg] [--top N]
//                [--plot timeline|phase_shares|round_time] [--rounds A:B]
//   fl-report --compare DB [DB...] [--target-accuracy 0.85] [--format text|csv|json|html|svg] [--out PATH|DIR]
//
// Exit codes: 0 done; 1 the database could not be read or holds nothing to report; 2 bad usage.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "fl/core/str_cat.h"
#include "fl/report/analysis.h"
#include "fl/report/compare.h"
#include "fl/report/experiment_data.h"
#include "fl/report/html_report.h"
#include "fl/report/plots.h"
#include "fl/report/tables.h"

namespace {

int Fail(int code, std::string_view message) {
  std::cerr << "fl-report: " << message << "\n";
  return code;
}

bool WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) {
    std::cerr << "fl-report: could not write " << path.string() << ": check the directory exists and is writable\n";
    return false;
  }
  return true;
}

// Writes `text` to --out (a file) or to stdout.
bool Emit(const std::string& out_path, const std::string& text) {
  if (out_path.empty()) {
    std::cout << text;
    std::cout.flush();
    return static_cast<bool>(std::cout);
  }
  return WriteFile(out_path, text);
}

// --out as a directory for several files; created if missing.
bool PrepareDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    std::cerr << "fl-report: --out " << dir
              << " must be a directory (or a path where one can be made): " << ec.message() << "\n";
    return false;
  }
  return true;
}

// "A:B", "A:", ":B" or "A" (one round) -> the timeline's window.
bool ParseRounds(const std::string& text, fl::report::TimelineOptions* options) {
  if (text.empty()) return true;
  const size_t colon = text.find(':');
  auto parse = [](const std::string& s, std::optional<int64_t>* v) {
    if (s.empty()) return true;
    try {
      size_t used = 0;
      *v = std::stoll(s, &used);
      return used == s.size();
    } catch (...) {
      return false;
    }
  };
  if (colon == std::string::npos) {
    if (!parse(text, &options->first_round)) return false;
    options->last_round = options->first_round;
    return true;
  }
  return parse(text.substr(0, colon), &options->first_round) && parse(text.substr(colon + 1), &options->last_round);
}

// fl-report --compare: the latest experiment of each database, side by side (compare.h). text prints a Markdown
// table; --out DIR writes compare.md, compare.csv, compare.svg and compare.html there.
int Compare(const std::vector<std::string>& dbs, double target, const std::string& format, const std::string& out) {
  std::vector<fl::report::ComparedExperiment> experiments;
  for (const std::string& db : dbs) {
    // A file that is no records database (missing, a FIFO, /dev/zero, not SQLite) is bad input: exit 2.
    if (absl::Status s = fl::report::CheckRecordsDatabase(db); !s.ok()) return Fail(2, fl::ToStd(s.message()));
    absl::StatusOr<fl::report::ExperimentData> data = fl::report::LoadExperiment(db);
    if (!data.ok()) return Fail(1, fl::ToStd(data.status().message()));
    experiments.push_back(fl::report::Summarize(*data, target));
  }
  fl::report::DisambiguateLabels(experiments);
  const fl::report::Table table = fl::report::CompareTable(experiments, target);
  const std::string markdown = fl::StrCat("### ", table.title, "\n\n", fl::report::RenderMarkdown(table));
  if (!out.empty() && std::filesystem::is_directory(out)) {
    const std::filesystem::path dir(out);
    const bool ok = WriteFile(dir / "compare.md", markdown) &&
                    WriteFile(dir / "compare.csv", fl::report::RenderCsv(table)) &&
                    WriteFile(dir / "compare.svg", fl::report::CompareSvg(experiments, target)) &&
                    WriteFile(dir / "compare.html", fl::report::CompareHtml(experiments, target));
    return ok ? 0 : 1;
  }
  if (format == "text") return Emit(out, markdown) ? 0 : 1;
  if (format == "csv") return Emit(out, fl::report::RenderCsv(table)) ? 0 : 1;
  if (format == "svg") return Emit(out, fl::report::CompareSvg(experiments, target)) ? 0 : 1;
  if (format == "html") return Emit(out, fl::report::CompareHtml(experiments, target)) ? 0 : 1;
  return Emit(out, fl::report::CompareJson(experiments, target)) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "fl-report: per-round, per-link-kind and straggler tables, SVG plots and an HTML report from an "
      "fl-server records database"};
  app.set_version_flag("--version", std::string("fl-report ") + FL_VERSION);
  std::string db_path, experiment_id, format = "text", out_path, table, plot, rounds;
  bool list = false;
  app.add_option("db", db_path, "Records database (the file fl-server --db wrote)");
  std::vector<std::string> compare;
  double target_accuracy = fl::report::kDefaultTargetAccuracy;
  app.add_option("--compare", compare,
                 "Compare the latest experiment of each database: accuracy against wall time (svg) and time to "
                 "--target-accuracy, bytes moved (docs/report.md); --out DIR writes compare.md/.csv/.svg/.html")
      ->expected(1, -1);
  app.add_option("--target-accuracy", target_accuracy, "Target test accuracy of --compare")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--experiment", experiment_id, "Experiment id (default: the latest one started)");
  app.add_option("--format", format, "Output format")
      ->check(CLI::IsMember({"text", "csv", "json", "html", "svg"}))
      ->capture_default_str();
  app.add_option("--out", out_path,
                 "Output file; a directory for several files (csv without --table, svg without --plot). "
                 "Default: standard output");
  app.add_option("--table", table, "Only this table (text, csv, json)")
      ->check(CLI::IsMember(
          std::vector<std::string>(std::begin(fl::report::kTableNames), std::end(fl::report::kTableNames))));
  app.add_option("--plot", plot, "Only this plot (svg)")
      ->check(CLI::IsMember(
          std::vector<std::string>(std::begin(fl::report::kPlotNames), std::end(fl::report::kPlotNames))));
  app.add_option("--rounds", rounds, "Timeline window: A:B, A:, :B or one round A (svg, html)");
  size_t top = fl::report::kDefaultTopStragglers;
  app.add_option("--top", top, "Rows of the stragglers table: the clients most often the straggler; 0 = all")
      ->capture_default_str();
  app.add_flag("--list", list, "List the experiments in the database and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error exits 2 (CLI11's own codes vary by error kind).
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (!compare.empty()) {
    if (!db_path.empty()) compare.insert(compare.begin(), db_path);
    if (!table.empty() || !plot.empty() || !rounds.empty() || list || !experiment_id.empty()) {
      return Fail(2,
                  "--compare takes databases, --target-accuracy, --format and --out only (the latest experiment "
                  "of each database is compared)");
    }
    return Compare(compare, target_accuracy, format, out_path);
  }
  if (db_path.empty()) return Fail(2, "give a records database (DB), or --compare DB [DB...]");
  // A file that is no records database (missing, a FIFO, /dev/zero, not SQLite) is bad input: exit 2, naming it.
  if (absl::Status s = fl::report::CheckRecordsDatabase(db_path); !s.ok()) return Fail(2, fl::ToStd(s.message()));

  fl::report::TimelineOptions timeline;
  if (!ParseRounds(rounds, &timeline)) {
    return Fail(2, fl::StrCat("--rounds '", rounds, "' is not A:B, A:, :B or A (round numbers)"));
  }
  if (!plot.empty() && format != "svg") return Fail(2, "--plot goes with --format svg");
  if (!table.empty() && (format == "html" || format == "svg")) {
    return Fail(2, fl::StrCat("--table goes with --format text, csv or json (the ", format, " output is not a table)"));
  }

  if (list) {
    absl::StatusOr<std::vector<fl::report::ExperimentInfo>> all = fl::report::ListExperiments(db_path);
    if (!all.ok()) return Fail(1, fl::ToStd(all.status().message()));
    for (const fl::report::ExperimentInfo& e : *all) {
      std::cout << e.id << "\t" << e.name << "\t" << e.status << "\t" << e.num_rounds << " round rows\n";
    }
    return 0;
  }

  absl::StatusOr<fl::report::ExperimentData> data = fl::report::LoadExperiment(db_path, experiment_id);
  if (!data.ok()) return Fail(1, fl::ToStd(data.status().message()));
  const fl::report::Analysis analysis = fl::report::Analyze(*data);

  std::vector<fl::report::Table> tables;
  if (table.empty()) {
    tables = fl::report::AllTables(*data, analysis, top);
  } else {
    absl::StatusOr<fl::report::Table> t = fl::report::TableByName(*data, analysis, table, top);
    if (!t.ok()) return Fail(2, fl::ToStd(t.status().message()));
    tables.push_back(*std::move(t));
  }

  if (format == "text") {
    std::string text = fl::report::ExperimentHeaderText(*data, analysis);
    for (const fl::report::Table& t : tables) text += "\n" + fl::report::RenderText(t);
    return Emit(out_path, text) ? 0 : 1;
  }
  if (format == "json") return Emit(out_path, fl::report::RenderJson(*data, analysis, tables)) ? 0 : 1;
  if (format == "html") return Emit(out_path, fl::report::HtmlReport(*data, analysis, timeline)) ? 0 : 1;
  if (format == "csv") {
    if (!table.empty()) return Emit(out_path, fl::report::RenderCsv(tables.front())) ? 0 : 1;
    if (out_path.empty()) {
      return Fail(2, "--format csv writes one file per table: give --out DIR, or --table NAME to print one table");
    }
    if (!PrepareDir(out_path)) return 1;
    for (const fl::report::Table& t : tables) {
      if (!WriteFile(std::filesystem::path(out_path) / (t.name + ".csv"), fl::report::RenderCsv(t))) return 1;
    }
    return 0;
  }
  // svg
  if (!plot.empty()) return Emit(out_path, fl::report::PlotByName(plot, *data, analysis, timeline)) ? 0 : 1;
  if (out_path.empty()) {
    return Fail(2, "--format svg writes one file per plot: give --out DIR, or --plot NAME to print one plot");
  }
  if (!PrepareDir(out_path)) return 1;
  for (std::string_view name : fl::report::kPlotNames) {
    if (!WriteFile(std::filesystem::path(out_path) / fl::StrCat(name, ".svg"),
                   fl::report::PlotByName(name, *data, analysis, timeline))) {
      return 1;
    }
  }
  return 0;
}
