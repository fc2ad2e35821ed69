#include "fl/report/svg.h"

#include <cmath>
#include <cstdio>

#include "fl/core/str_cat.h"

namespace fl::report {
namespace {

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  std::string s(buf);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

std::string TitleElement(std::string_view title) {
  return title.empty() ? "" : fl::StrCat("<title>", XmlEscape(title), "</title>");
}

}  // namespace

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

SvgWriter::SvgWriter(double width, double height) : width_(width), height_(height) {}

void SvgWriter::Rect(double x, double y, double w, double h, std::string_view fill, std::string_view title,
                     std::string_view extra_attributes) {
  body_ += fl::StrCat("<rect x=\"", Num(x), "\" y=\"", Num(y), "\" width=\"", Num(std::max(w, 0.0)), "\" height=\"",
                      Num(std::max(h, 0.0)), "\" fill=\"", XmlEscape(fill), "\"", extra_attributes.empty() ? "" : " ",
                      extra_attributes);
  body_ += title.empty() ? "/>\n" : fl::StrCat(">", TitleElement(title), "</rect>\n");
}

void SvgWriter::Line(double x1, double y1, double x2, double y2, std::string_view stroke, double stroke_width,
                     std::string_view extra_attributes) {
  body_ += fl::StrCat("<line x1=\"", Num(x1), "\" y1=\"", Num(y1), "\" x2=\"", Num(x2), "\" y2=\"", Num(y2),
                      "\" stroke=\"", XmlEscape(stroke), "\" stroke-width=\"", Num(stroke_width), "\"",
                      extra_attributes.empty() ? "" : " ", extra_attributes, "/>\n");
}

void SvgWriter::Polyline(const std::vector<std::pair<double, double>>& points, std::string_view stroke,
                         double stroke_width) {
  if (points.empty()) return;
  std::string d;
  for (size_t i = 0; i < points.size(); ++i) {
    d += fl::StrCat(i == 0 ? "M" : " L", Num(points[i].first), " ", Num(points[i].second));
  }
  body_ += fl::StrCat("<path d=\"", d, "\" fill=\"none\" stroke=\"", XmlEscape(stroke), "\" stroke-width=\"",
                      Num(stroke_width), "\"/>\n");
}

void SvgWriter::Circle(double cx, double cy, double r, std::string_view fill, std::string_view title) {
  body_ +=
      fl::StrCat("<circle cx=\"", Num(cx), "\" cy=\"", Num(cy), "\" r=\"", Num(r), "\" fill=\"", XmlEscape(fill), "\"");
  body_ += title.empty() ? "/>\n" : fl::StrCat(">", TitleElement(title), "</circle>\n");
}

void SvgWriter::Text(double x, double y, std::string_view text, double font_size, std::string_view anchor,
                     std::string_view extra_attributes) {
  body_ += fl::StrCat("<text x=\"", Num(x), "\" y=\"", Num(y), "\" font-size=\"", Num(font_size), "\" text-anchor=\"",
                      XmlEscape(anchor), "\"", extra_attributes.empty() ? "" : " ", extra_attributes, ">",
                      XmlEscape(text), "</text>\n");
}

void SvgWriter::BeginGroup(std::string_view css_class) {
  body_ += fl::StrCat("<g class=\"", XmlEscape(css_class), "\">\n");
  ++open_groups_;
}

void SvgWriter::EndGroup() {
  if (open_groups_ == 0) return;
  body_ += "</g>\n";
  --open_groups_;
}

std::string SvgWriter::Finish(std::string_view id, std::string_view label) const {
  std::string out = fl::StrCat("<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 ", Num(width_), " ",
                               Num(height_), "\" width=\"", Num(width_), "\" height=\"", Num(height_), "\"");
  if (!id.empty()) out += fl::StrCat(" id=\"", XmlEscape(id), "\"");
  if (!label.empty()) out += fl::StrCat(" role=\"img\" aria-label=\"", XmlEscape(label), "\"");
  out += " font-family=\"sans-serif\">\n";
  out += body_;
  for (int i = 0; i < open_groups_; ++i) out += "</g>\n";
  return out + "</svg>\n";
}

std::vector<double> NiceTicks(double lo, double hi, int count) {
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return {lo};
  const double raw = (hi - lo) / std::max(count, 1);
  const int exponent = static_cast<int>(std::floor(std::log10(raw)));
  const double mag = std::pow(10.0, exponent);
  double multiple = 1;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    multiple = m;
    if (m * mag >= raw) break;
  }
  const double step = multiple * mag;
  // Each tick is k x multiple x 10^exponent computed from its integer k: adding the step up (0.2 + 0.2 + ...)
  // drifts, so that a tick meant to be 2 came out 2.0000000000000004 and the round-time plot, which labels
  // whole rounds only, lost it. Dividing by an exact power of ten rounds correctly (3 / 10 is the double 0.3).
  auto tick = [&](double k) {
    const double units = k * multiple;
    return exponent < 0 ? units / std::pow(10.0, -exponent) : units * mag;
  };
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step - 1e-9);; k += 1) {
    const double t = tick(k);
    if (t > hi + step * 1e-9) break;
    ticks.push_back(t == 0 ? 0.0 : t);
  }
  return ticks;
}

std::string AxisLabel(double v) {
  char buf[32];
  if (std::abs(v) >= 100 || v == std::floor(v)) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%.3g", v);
  }
  return buf;
}

void DrawAxes(SvgWriter& svg, const PlotFrame& f, const std::vector<double>& x_ticks,
              const std::vector<double>& y_ticks, std::string_view x_title, std::string_view y_title) {
  constexpr std::string_view kAxisColor = "#444444";
  const double bottom = f.top + f.height;
  svg.BeginGroup("axes");
  svg.Line(f.left, bottom, f.left + f.width, bottom, kAxisColor);
  svg.Line(f.left, f.top, f.left, bottom, kAxisColor);
  for (double v : x_ticks) {
    if (v < f.x_lo || v > f.x_hi) continue;
    svg.Line(f.X(v), bottom, f.X(v), bottom + 4, kAxisColor);
    svg.Text(f.X(v), bottom + 16, AxisLabel(v), 11, "middle");
  }
  for (double v : y_ticks) {
    if (v < f.y_lo || v > f.y_hi) continue;
    svg.Line(f.left - 4, f.Y(v), f.left + f.width, f.Y(v), "#e8e8e8");
    svg.Text(f.left - 6, f.Y(v) + 4, AxisLabel(v), 11, "end");
  }
  svg.Text(f.left + f.width / 2, bottom + 34, x_title, 12, "middle");
  const double mid = f.top + f.height / 2;
  svg.Text(16, mid, y_title, 12, "middle", fl::StrCat("transform=\"rotate(-90 16 ", mid, ")\""));
  svg.EndGroup();
}

}  // namespace fl::report
