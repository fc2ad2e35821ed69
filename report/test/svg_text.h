// Reading the report's SVG output in tests: occurrences of a string, and one <g class="..."> group's text.
#pragma once

#include <string>

namespace fl::report::testing {

inline size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The <g class="name"> ... </g> part of an SVG ("" when there is none).
inline std::string Group(const std::string& svg, const std::string& name) {
  const size_t begin = svg.find("<g class=\"" + name + "\">");
  if (begin == std::string::npos) return "";
  return svg.substr(begin, svg.find("</g>", begin) - begin);
}

}  // namespace fl::report::testing
