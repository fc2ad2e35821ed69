// Test support: renders an HTML file in headless Chromium (Debian's `chromium`) and reads back the DOM it
// built, the way a person's browser would show the report; and small helpers to find tables and plots in it.
#pragma once

#include <map>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/testing/scratch_dir.h"
#include "run_tool.h"

namespace fl::report::testing {

inline constexpr char kChromium[] = "/usr/bin/chromium";

// The rendered DOM (what --dump-dom prints), "" on failure (with a test failure saying why).
inline std::string RenderDom(const std::string& html_path, const fl::testing::ScratchDir& dir) {
  if (access(kChromium, X_OK) != 0) {
    ADD_FAILURE() << kChromium << " is missing: install Debian's chromium (deploy/install-deps.sh does)";
    return "";
  }
  // A profile of our own in the scratch directory: nothing read from or written to the user's.
  const ToolResult r = RunTool({kChromium, "--headless", "--disable-gpu", "--no-sandbox", "--log-level=3",
                                "--user-data-dir=" + dir.File("chromium-profile"), "--dump-dom", "file://" + html_path},
                               dir, std::chrono::seconds(90));
  EXPECT_EQ(r.code, 0) << "chromium failed or timed out:\n" << r.output.substr(0, 4000);
  // stdout and stderr share the log: the DOM is the <html> ... </html> part.
  const size_t begin = r.output.find("<html");
  const size_t end = r.output.rfind("</html>");
  if (begin == std::string::npos || end == std::string::npos) {
    ADD_FAILURE() << "no DOM in chromium's output:\n" << r.output.substr(0, 4000);
    return "";
  }
  return r.output.substr(begin, end + 7 - begin);
}

// The first <tag ...id="id"...> ... </tag> element (tables and svgs are not nested in the report).
inline std::string ElementById(const std::string& dom, const std::string& tag, const std::string& id) {
  const std::regex open("<" + tag + "\\b[^>]*\\bid=\"" + id + "\"[^>]*>");
  std::smatch m;
  if (!std::regex_search(dom, m, open)) return "";
  const size_t begin = static_cast<size_t>(m.position(0));
  const size_t end = dom.find("</" + tag + ">", begin);
  return end == std::string::npos ? "" : dom.substr(begin, end + tag.size() + 3 - begin);
}

inline size_t CountOf(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The body rows of a report table as column -> shown text (from the cells' data-col attributes).
inline std::vector<std::map<std::string, std::string>> TableRows(const std::string& table) {
  std::vector<std::map<std::string, std::string>> rows;
  const std::regex cell("<td data-col=\"([^\"]+)\"[^>]*>([^<]*)</td>");
  size_t at = table.find("<tbody>");
  while ((at = table.find("<tr>", at)) != std::string::npos) {
    const size_t end = table.find("</tr>", at);
    const std::string row = table.substr(at, end - at);
    std::map<std::string, std::string> cells;
    for (std::sregex_iterator it(row.begin(), row.end(), cell), stop; it != stop; ++it) {
      cells[(*it)[1].str()] = (*it)[2].str();
    }
    if (!cells.empty()) rows.push_back(std::move(cells));
    at = end;
  }
  return rows;
}

// The row whose `key_column` shows `key`; empty if none.
inline std::map<std::string, std::string> RowWhere(const std::vector<std::map<std::string, std::string>>& rows,
                                                   const std::string& key_column, const std::string& key) {
  for (const auto& row : rows) {
    auto it = row.find(key_column);
    if (it != row.end() && it->second == key) return row;
  }
  return {};
}

// `value` formatted as the report shows it: fixed `decimals` digits, then `suffix`.
inline std::string Shown(double value, int decimals, const std::string& suffix = "") {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, value);
  return buf + suffix;
}

}  // namespace fl::report::testing
