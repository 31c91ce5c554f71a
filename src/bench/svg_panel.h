#pragma once
// A panel of an SVG chart: a title, linear axes with "nice" ticks and their names, a frame,
// and the marks a chart draws in it (bars, dots, lines, markers, notes). Shared by the run
// chart (chart.h) and the request-rate sweep chart (sweep_report.h). Appends SVG 1.1 text to a
// string the caller owns.

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace crescent::bench::svg {

inline constexpr double kPanelWidth = 500;
inline constexpr double kPanelHeight = 280;
// Inside a panel: room for the title, tick labels and axis names.
inline constexpr double kLeft = 62, kRight = 18, kPanelTop = 34, kBottom = 44;

// Text made safe for SVG character data and attribute values.
std::string escape(const std::string& s);
// A coordinate with one decimal.
std::string num(double v);
// A tick label: as few digits as the step needs.
std::string tick_label(double v, double step);
// Ticks at 1, 2 or 5 times a power of ten, covering [lo, hi] with about `count` steps.
std::vector<double> nice_ticks(double lo, double hi, int count, double* step_out);
// The XML declaration, the <svg> element of that size on a white ground, and the title line
// centred on top (the caller appends the panels and "</svg>\n").
std::string document_start(double width, double height, const std::string& title);

// One panel's plotting area with linear axes over [x_lo, x_hi] x [y_lo, y_hi].
class Panel {
 public:
  Panel(std::string* svg, double x0, double y0, std::string title, std::string x_name,
        std::string y_name, double x_lo, double x_hi, double y_lo, double y_hi)
      : svg_(svg),
        left_(x0 + kLeft),
        top_(y0 + kPanelTop),
        width_(kPanelWidth - kLeft - kRight),
        height_(kPanelHeight - kPanelTop - kBottom) {
    if (!(x_hi > x_lo)) {
      x_lo -= 0.5;
      x_hi += 0.5;
    }
    if (!(y_hi > y_lo)) {
      y_hi = y_lo + 1;
    }
    double x_step = 1, y_step = 1;
    x_ticks_ = nice_ticks(x_lo, x_hi, 6, &x_step);
    y_ticks_ = nice_ticks(y_lo, y_hi, 5, &y_step);
    // Extend the axes to whole ticks.
    x_lo_ = std::min(x_lo, std::floor(x_lo / x_step) * x_step);
    x_hi_ = std::max(x_hi, std::ceil(x_hi / x_step) * x_step);
    y_lo_ = std::min(y_lo, std::floor(y_lo / y_step) * y_step);
    y_hi_ = std::max(y_hi, std::ceil(y_hi / y_step) * y_step);
    x_ticks_ = nice_ticks(x_lo_, x_hi_, 6, &x_step);
    y_ticks_ = nice_ticks(y_lo_, y_hi_, 5, &y_step);

    *svg_ += "<text x=\"" + num(x0 + kPanelWidth / 2) + "\" y=\"" + num(y0 + 20) +
             "\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">" + escape(title) +
             "</text>\n";
    for (double t : y_ticks_) {
      double y = py(t);
      *svg_ += "<line x1=\"" + num(left_) + "\" y1=\"" + num(y) + "\" x2=\"" + num(left_ + width_) +
               "\" y2=\"" + num(y) + "\" stroke=\"#e4e4e4\"/>\n";
      *svg_ += "<text x=\"" + num(left_ - 5) + "\" y=\"" + num(y + 4) +
               "\" text-anchor=\"end\" font-size=\"11\">" + tick_label(t, y_step) + "</text>\n";
    }
    for (double t : x_ticks_) {
      double x = px(t);
      *svg_ += "<line x1=\"" + num(x) + "\" y1=\"" + num(top_ + height_) + "\" x2=\"" + num(x) +
               "\" y2=\"" + num(top_ + height_ + 4) + "\" stroke=\"#333\"/>\n";
      *svg_ += "<text x=\"" + num(x) + "\" y=\"" + num(top_ + height_ + 16) +
               "\" text-anchor=\"middle\" font-size=\"11\">" + tick_label(t, x_step) + "</text>\n";
    }
    *svg_ += "<rect x=\"" + num(left_) + "\" y=\"" + num(top_) + "\" width=\"" + num(width_) +
             "\" height=\"" + num(height_) + "\" fill=\"none\" stroke=\"#333\"/>\n";
    *svg_ += "<text x=\"" + num(left_ + width_ / 2) + "\" y=\"" + num(top_ + height_ + 34) +
             "\" text-anchor=\"middle\" font-size=\"12\">" + escape(x_name) + "</text>\n";
    double yc = top_ + height_ / 2;
    *svg_ += "<text x=\"" + num(x0 + 14) + "\" y=\"" + num(yc) +
             "\" text-anchor=\"middle\" font-size=\"12\" transform=\"rotate(-90 " + num(x0 + 14) +
             " " + num(yc) + ")\">" + escape(y_name) + "</text>\n";
  }

  double px(double x) const { return left_ + (x - x_lo_) / (x_hi_ - x_lo_) * width_; }
  double py(double y) const { return top_ + height_ - (y - y_lo_) / (y_hi_ - y_lo_) * height_; }
  double bottom() const { return top_ + height_; }
  double top() const { return top_; }

  void bar(double x_from, double x_to, double count) {
    *svg_ += "<rect x=\"" + num(px(x_from)) + "\" y=\"" + num(py(count)) + "\" width=\"" +
             num(std::max(0.5, px(x_to) - px(x_from) - 1)) + "\" height=\"" +
             num(bottom() - py(count)) + "\" fill=\"#4e79a7\"/>\n";
  }
  void vertical_marker(double x, const std::string& color) {
    double X = px(x);
    *svg_ += "<line x1=\"" + num(X) + "\" y1=\"" + num(top_) + "\" x2=\"" + num(X) + "\" y2=\"" +
             num(bottom()) + "\" stroke=\"" + color + "\" stroke-width=\"1.5\" " +
             "stroke-dasharray=\"5,3\"/>\n";
  }
  // Drawn after every marker line, with a white halo, so lines never cross the text.
  void marker_label(const std::string& color, const std::string& label, int slot) {
    *svg_ += "<text x=\"" + num(left_ + width_ - 4) + "\" y=\"" + num(top_ + 14 + 14 * slot) +
             "\" text-anchor=\"end\" font-size=\"11\" fill=\"" + color +
             "\" stroke=\"white\" stroke-width=\"3\" paint-order=\"stroke\">" + escape(label) +
             "</text>\n";
  }
  // A series: a line through the points with a dot on each, in `color`.
  void line(const std::vector<std::pair<double, double>>& points, const std::string& color) {
    std::string path;
    for (const auto& [x, y] : points) {
      path += (path.empty() ? "" : " ") + num(px(x)) + "," + num(py(y));
    }
    *svg_ += "<polyline points=\"" + path + "\" fill=\"none\" stroke=\"" + color +
             "\" stroke-width=\"2\"/>\n";
    for (const auto& [x, y] : points) {
      *svg_ += "<circle cx=\"" + num(px(x)) + "\" cy=\"" + num(py(y)) + "\" r=\"3.5\" fill=\"" +
               color + "\"/>\n";
    }
  }
  void dot(double x, double y) {
    *svg_ += "<circle cx=\"" + num(px(x)) + "\" cy=\"" + num(py(y)) +
             "\" r=\"2.5\" fill=\"#4e79a7\" fill-opacity=\"0.7\"/>\n";
  }
  void failure_mark(double x) {
    double X = px(x);
    *svg_ += "<line x1=\"" + num(X) + "\" y1=\"" + num(bottom() - 8) + "\" x2=\"" + num(X) +
             "\" y2=\"" + num(bottom()) + "\" stroke=\"#e15759\" stroke-width=\"2\"/>\n";
  }
  void note(const std::string& text) {
    *svg_ += "<text x=\"" + num(left_ + width_ / 2) + "\" y=\"" + num(top_ + height_ / 2) +
             "\" text-anchor=\"middle\" font-size=\"12\" fill=\"#888\">" + escape(text) +
             "</text>\n";
  }

 private:
  std::string* svg_;
  double left_, top_, width_, height_;
  double x_lo_ = 0, x_hi_ = 1, y_lo_ = 0, y_hi_ = 1;
  std::vector<double> x_ticks_, y_ticks_;
};

}  // namespace crescent::bench::svg
