// A small SVG writer: just what the report's plots draw (rectangles, lines, polylines, circles, text, groups,
// hover titles), with every attribute and text escaped. No third-party plotting.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fl::report {

// Escapes &, <, >, " and ' for XML text and attribute values.
std::string XmlEscape(std::string_view text);

class SvgWriter {
 public:
  // A drawing of `width` x `height` user units; the viewBox is "0 0 width height" so it scales in HTML.
  SvgWriter(double width, double height);

  double width() const { return width_; }
  double height() const { return height_; }

  // `title` (optional) becomes a <title> child: the tooltip a browser shows on hover.
  void Rect(double x, double y, double w, double h, std::string_view fill, std::string_view title = "",
            std::string_view extra_attributes = "");
  void Line(double x1, double y1, double x2, double y2, std::string_view stroke, double stroke_width = 1,
            std::string_view extra_attributes = "");
  void Polyline(const std::vector<std::pair<double, double>>& points, std::string_view stroke, double stroke_width);
  void Circle(double cx, double cy, double r, std::string_view fill, std::string_view title = "");
  // anchor: start, middle, end.
  void Text(double x, double y, std::string_view text, double font_size = 12, std::string_view anchor = "start",
            std::string_view extra_attributes = "");
  void BeginGroup(std::string_view css_class);
  void EndGroup();

  // The document: <svg xmlns=... viewBox=...> ... </svg>. `id` and `label` (aria-label) may be empty.
  std::string Finish(std::string_view id = "", std::string_view label = "") const;

 private:
  double width_;
  double height_;
  std::string body_;
  int open_groups_ = 0;
};

// Round, human-friendly tick values covering [lo, hi] (about `count` of them, steps of 1, 2 or 5 x 10^k).
std::vector<double> NiceTicks(double lo, double hi, int count = 5);

// A number formatted compactly for axis labels ("0", "2.5", "1200").
std::string AxisLabel(double v);

// A plot area at (left, top) of width x height user units showing [x_lo, x_hi] x [y_lo, y_hi], and the mapping
// of data to user units (shared by the compare plot and the learning curve).
struct PlotFrame {
  double left = 0, top = 0, width = 0, height = 0;
  double x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
  double X(double x) const { return left + width * (x - x_lo) / (x_hi - x_lo); }
  double Y(double y) const { return top + height * (1 - (y - y_lo) / (y_hi - y_lo)); }
};

// The frame's axes in a <g class="axes">: x and y lines, the ticks inside the ranges with their labels (y ticks
// as light grid lines), and the two axis titles (the y title rotated).
void DrawAxes(SvgWriter& svg, const PlotFrame& frame, const std::vector<double>& x_ticks,
              const std::vector<double>& y_ticks, std::string_view x_title, std::string_view y_title);

}  // namespace fl::report
