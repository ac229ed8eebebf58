#include "loadgen/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

namespace ft::loadgen {

namespace {

const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
const char* colour(size_t i) { return kColours[i % (sizeof kColours / sizeof *kColours)]; }

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

std::string tick_label(double v) {
  char b[64];
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e5 || a < 1e-2)) std::snprintf(b, sizeof b, "%.0e", v);
  else std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// One axis: data range -> pixel range, linear or log10.
struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double p0 = 0, p1 = 1;  // pixels of lo and hi
  double t(double v) const { return log ? std::log10(v) : v; }
  double px(double v) const {
    const double a = t(lo), b = t(hi);
    return p0 + (t(v) - a) / (b - a) * (p1 - p0);
  }
  std::vector<double> ticks() const {
    std::vector<double> out;
    if (log) {
      // Decades; also 2 and 5 times them when the axis spans at most two decades.
      const bool fine = std::log10(hi / lo) <= 2.01;
      for (double e = std::floor(std::log10(lo)); e <= std::ceil(std::log10(hi)); e += 1)
        for (double m : {1.0, 2.0, 5.0}) {
          const double v = m * std::pow(10.0, e);
          if ((m == 1.0 || fine) && v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push_back(v);
        }
      return out;
    }
    const double span = hi - lo;
    const double raw = span / 5;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0})
      if (raw <= m * mag) {
        step = m * mag;
        break;
      }
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
    return out;
  }
};

Axis make_axis(std::vector<double> vals, bool log, double p0, double p1, bool from_zero) {
  Axis a;
  a.log = log;
  a.p0 = p0;
  a.p1 = p1;
  if (log) vals.erase(std::remove_if(vals.begin(), vals.end(), [](double v) { return !(v > 0); }), vals.end());
  if (vals.empty()) {
    a.lo = log ? 1 : 0;
    a.hi = log ? 10 : 1;
    return a;
  }
  a.lo = *std::min_element(vals.begin(), vals.end());
  a.hi = *std::max_element(vals.begin(), vals.end());
  if (log) {
    a.lo = std::pow(10.0, std::floor(std::log10(a.lo)));
    a.hi = std::pow(10.0, std::ceil(std::log10(a.hi)));
    if (a.hi <= a.lo) a.hi = a.lo * 10;
  } else {
    if (from_zero) a.lo = std::min(a.lo, 0.0);
    if (a.hi <= a.lo) a.hi = a.lo + 1;
    a.hi += (a.hi - a.lo) * 0.05;
  }
  return a;
}

constexpr double kPanelW = 520, kPanelH = 360, kTitleH = 36;
constexpr double kLeft = 70, kRight = 20, kTop = 30, kBottom = 50;

std::string header(double w, double h, const std::string& title) {
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(w) + "\" height=\"" + num(h) +
                  "\" viewBox=\"0 0 " + num(w) + " " + num(h) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + num(w / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"16\">" + xml_escape(title) +
       "</text>\n";
  return s;
}

// Frame, ticks, grid and labels of a plot area at (x0, y0) of size w x h.
std::string axes(const std::optional<Axis>& ax, const Axis& ay, double x0, double y0, double w, double h, const std::string& title,
                 const std::string& x_label, const std::string& y_label) {
  std::string s;
  s += "<text x=\"" + num(x0 + w / 2) + "\" y=\"" + num(y0 - 10) + "\" text-anchor=\"middle\" font-size=\"13\">" +
       xml_escape(title) + "</text>\n";
  s += "<rect x=\"" + num(x0) + "\" y=\"" + num(y0) + "\" width=\"" + num(w) + "\" height=\"" + num(h) +
       "\" fill=\"none\" stroke=\"#333\"/>\n";
  for (double v : ax ? ax->ticks() : std::vector<double>{}) {
    const double x = ax->px(v);
    s += "<line x1=\"" + num(x) + "\" y1=\"" + num(y0) + "\" x2=\"" + num(x) + "\" y2=\"" + num(y0 + h) +
         "\" stroke=\"#ddd\"/>\n";
    s += "<text x=\"" + num(x) + "\" y=\"" + num(y0 + h + 16) + "\" text-anchor=\"middle\">" + tick_label(v) +
         "</text>\n";
  }
  for (double v : ay.ticks()) {
    const double y = ay.px(v);
    s += "<line x1=\"" + num(x0) + "\" y1=\"" + num(y) + "\" x2=\"" + num(x0 + w) + "\" y2=\"" + num(y) +
         "\" stroke=\"#ddd\"/>\n";
    s += "<text x=\"" + num(x0 - 6) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\">" + tick_label(v) +
         "</text>\n";
  }
  s += "<text x=\"" + num(x0 + w / 2) + "\" y=\"" + num(y0 + h + 36) + "\" text-anchor=\"middle\">" +
       xml_escape(x_label) + "</text>\n";
  s += "<text transform=\"translate(" + num(x0 - 50) + "," + num(y0 + h / 2) +
       ") rotate(-90)\" text-anchor=\"middle\">" + xml_escape(y_label) + "</text>\n";
  return s;
}

std::string legend(const std::vector<std::string>& names, double x, double y) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    const double yy = y + double(i) * 16;
    s += "<rect x=\"" + num(x) + "\" y=\"" + num(yy - 9) + "\" width=\"10\" height=\"10\" fill=\"" + colour(i) +
         "\"/>\n";
    s += "<text x=\"" + num(x + 14) + "\" y=\"" + num(yy) + "\">" + xml_escape(names[i]) + "</text>\n";
  }
  return s;
}

}  // namespace

std::string xml_escape(const std::string& in) {
  std::string s;
  for (char c : in) {
    switch (c) {
      case '<': s += "&lt;"; break;
      case '>': s += "&gt;"; break;
      case '&': s += "&amp;"; break;
      case '"': s += "&quot;"; break;
      case '\'': s += "&apos;"; break;
      default: s += c;
    }
  }
  return s;
}

std::string svg_panels(const std::string& title, const std::vector<Panel>& panels) {
  const double W = kPanelW * double(std::max<size_t>(1, panels.size())), H = kPanelH + kTitleH;
  std::string s = header(W, H, title);
  for (size_t pi = 0; pi < panels.size(); ++pi) {
    const Panel& p = panels[pi];
    const double x0 = double(pi) * kPanelW + kLeft, y0 = kTitleH + kTop;
    const double w = kPanelW - kLeft - kRight, h = kPanelH - kTop - kBottom;
    std::vector<double> xs, ys;
    for (const auto& se : p.series)
      for (const auto& [x, y] : se.xy) {
        xs.push_back(x);
        ys.push_back(y);
      }
    const Axis ax = make_axis(xs, p.log_x, x0, x0 + w, true);
    const Axis ay = make_axis(ys, p.log_y, y0 + h, y0, true);
    s += axes(ax, ay, x0, y0, w, h, p.title, p.x_label, p.y_label);
    std::vector<std::string> names;
    for (size_t si = 0; si < p.series.size(); ++si) {
      const PlotSeries& se = p.series[si];
      names.push_back(se.name);
      std::string pts;
      for (const auto& [x, y] : se.xy) {
        if ((p.log_x && !(x > 0)) || (p.log_y && !(y > 0))) continue;
        if (p.style == Panel::Style::Points)
          s += "<circle cx=\"" + num(ax.px(x)) + "\" cy=\"" + num(ay.px(y)) + "\" r=\"2.5\" fill=\"" + colour(si) +
               "\" fill-opacity=\"0.7\"/>\n";
        else
          pts += num(ax.px(x)) + "," + num(ay.px(y)) + " ";
      }
      if (!pts.empty())
        s += "<polyline points=\"" + pts + "\" fill=\"none\" stroke=\"" + colour(si) + "\" stroke-width=\"1.5\"/>\n";
    }
    s += legend(names, x0 + 8, y0 + 16);
  }
  s += "</svg>\n";
  return s;
}

std::string svg_bar_chart(const std::string& title, const std::string& y_label,
                          const std::vector<std::string>& groups, const std::vector<std::string>& series,
                          const std::vector<std::vector<double>>& values, bool log_y) {
  const double group_w = std::max(60.0, 18.0 * double(series.size()) + 20);
  const double w = std::max(400.0, group_w * double(groups.size()));
  const double h = 320;
  const double x0 = kLeft, y0 = kTitleH + kTop;
  const double W = x0 + w + 160, H = y0 + h + kBottom + 20;
  std::string s = header(W, H, title);
  std::vector<double> all;
  for (const auto& g : values) all.insert(all.end(), g.begin(), g.end());
  const Axis ay = make_axis(all, log_y, y0 + h, y0, true);
  s += axes(std::nullopt, ay, x0, y0, w, h, "", "", y_label);  // group names label the x axis
  const double base = log_y ? y0 + h : ay.px(std::max(ay.lo, 0.0));
  for (size_t g = 0; g < groups.size(); ++g) {
    const double gx = x0 + double(g) * (w / double(groups.size()));
    const double bw = (w / double(groups.size()) - 16) / double(std::max<size_t>(1, series.size()));
    for (size_t si = 0; si < series.size() && g < values.size() && si < values[g].size(); ++si) {
      const double v = values[g][si];
      if (log_y && !(v > 0)) continue;
      const double y = ay.px(v);
      s += "<rect x=\"" + num(gx + 8 + double(si) * bw) + "\" y=\"" + num(std::min(y, base)) + "\" width=\"" +
           num(bw - 1) + "\" height=\"" + num(std::fabs(base - y)) + "\" fill=\"" + colour(si) + "\"><title>" +
           xml_escape(groups[g] + " " + series[si] + ": " + tick_label(v)) + "</title></rect>\n";
    }
    s += "<text x=\"" + num(gx + w / double(groups.size()) / 2) + "\" y=\"" + num(y0 + h + 16) +
         "\" text-anchor=\"middle\">" + xml_escape(groups[g]) + "</text>\n";
  }
  s += legend(series, x0 + w + 10, y0 + 10);
  s += "</svg>\n";
  return s;
}

std::string svg_ttft_figure(const std::string& title, const std::vector<RequestRecord>& records,
                            const std::vector<std::string>& class_names) {
  Panel cdf{"TTFT distribution (CDF)", "TTFT (ms, log)", "fraction of requests", Panel::Style::Lines, true, false, {}};
  Panel time{"TTFT over time", "request start (s)", "TTFT (ms, log)", Panel::Style::Points, false, true, {}};
  for (size_t ci = 0; ci < class_names.size(); ++ci) {
    std::vector<double> v;
    PlotSeries pts{class_names[ci], {}};
    for (const auto& r : records)
      if (r.class_index == int32_t(ci) && r.ok() && r.ttft_s >= 0) {
        v.push_back(r.ttft_s * 1e3);
        pts.xy.emplace_back(r.start_s, r.ttft_s * 1e3);
      }
    std::sort(v.begin(), v.end());
    PlotSeries line{class_names[ci], {}};
    for (size_t i = 0; i < v.size(); ++i) {  // a step function
      line.xy.emplace_back(v[i], double(i) / double(v.size()));
      line.xy.emplace_back(v[i], double(i + 1) / double(v.size()));
    }
    cdf.series.push_back(std::move(line));
    time.series.push_back(std::move(pts));
  }
  return svg_panels(title, {cdf, time});
}

}  // namespace ft::loadgen
