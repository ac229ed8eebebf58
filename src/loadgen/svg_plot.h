// Self-contained SVG charts (no dependencies): line/step and scatter panels with linear or log
// axes, grouped bar charts, and the load generator's TTFT figure.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "loadgen/report.h"

namespace ft::loadgen {

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> xy;
};

struct Panel {
  enum class Style { Lines, Points };
  std::string title, x_label, y_label;
  Style style = Style::Lines;
  bool log_x = false, log_y = false;  // log axes drop points <= 0
  std::vector<PlotSeries> series;     // colours by index
};

// Panels side by side under one title; a legend per panel.
std::string svg_panels(const std::string& title, const std::vector<Panel>& panels);

// Bars: for each group (x), one bar per series (colours by index). values[g][s].
std::string svg_bar_chart(const std::string& title, const std::string& y_label,
                          const std::vector<std::string>& groups, const std::vector<std::string>& series,
                          const std::vector<std::vector<double>>& values, bool log_y);

// The `bench serve` figure: TTFT CDF per class (log x) and TTFT over time (per-class colours).
std::string svg_ttft_figure(const std::string& title, const std::vector<RequestRecord>& records,
                            const std::vector<std::string>& class_names);

std::string xml_escape(const std::string& s);

}  // namespace ft::loadgen
